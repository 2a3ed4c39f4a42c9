"""The book's command line: ``python -m tools.book export|check|run [NN_name ...]``.

Run from the repository root (the Makefile's `make export`, `make check`, `make run` do). It
never imports minixl, so that it works even when a generated module is missing or broken.
``check`` fails when the two sides of a pair differ, when a generated file is out of date,
when a chapter imports a module that only a later chapter exports, or when a quoted number
is not what the stored outputs say.
"""

from __future__ import annotations

import sys

from .export import export
from .numbers import check_numbers, pages_problems
from .pairs import check_pairs
from .paths import chapters
from .run import run_chapters


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    cmd, rest = (argv[0], argv[1:]) if argv else ("", [])
    if cmd == "export":
        problems = export()
        for p in problems:
            print("error:", p, file=sys.stderr)
        return 1 if problems else 0
    if cmd == "check":
        problems = check_pairs() + export(check=True)
        problems += check_numbers() + pages_problems() if not problems else []
        for p in problems:
            print("FAIL:", p, file=sys.stderr)
        if not problems:
            print(f"book check: {len(chapters())} chapters paired, minixl up to date, quoted "
                  "numbers match the stored outputs (and the README's and docs/', their CSVs)")
        return 1 if problems else 0
    if cmd == "run":
        run_chapters(rest)
        return 0
    print("usage: python -m tools.book export|check|run [NN_name ...]", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main())
