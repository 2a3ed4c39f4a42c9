"""Lints of the chapters' exported code: names a generated module uses but never defines,
and a chapter that imports what only a later chapter exports."""

from __future__ import annotations

import ast
from pathlib import Path

from .paths import ROOT
from .source import hand_written, imported_modules


def undefined_names(name: str, code: str) -> list[str]:
    """Names a generated module uses but never defines or imports: a chapter can run (its
    notebook imports them in a cell that is not exported) while the module it exports
    fails. Needs pyflakes (a dev dependency); without it the check is skipped."""
    try:
        from pyflakes.checker import Checker
        from pyflakes.messages import UndefinedName
    except ImportError:
        return []
    found = Checker(ast.parse(code), filename=name).messages
    return [f"{name}, line {m.lineno}: {m.message % m.message_args}; import it in an export "
            "cell of its chapter" for m in found if isinstance(m, UndefinedName)]


def import_order(parsed: list[dict], owner: dict[str, Path]) -> list[str]:
    """A chapter may use only what earlier chapters export: no minixl module it imports may
    need (itself, or through the hand-written modules it imports) its own or a later chapter."""
    chapter_of = {m: path.stem[:2] for m, path in owner.items()}
    hand = {name: set().union(*(imported_modules(p.read_text(), top_level_only=True,
                                                  in_package=p.name != f"{name}.py")
                                for p in paths)) - {name}
            for name, paths in hand_written().items() if name not in chapter_of}

    def needs(module: str, seen: tuple = ()) -> tuple[str, str] | None:
        """(chapter, generated module) of the latest chapter a module needs, or None."""
        if module in chapter_of:
            return chapter_of[module], module
        if module in seen or module not in hand:
            return None
        found = [n for d in hand[module] if (n := needs(d, seen + (module,)))]
        return max(found) if found else None

    problems = []
    for chapter in parsed:
        number, where = chapter["path"].stem[:2], chapter["path"].relative_to(ROOT)
        used = set().union(set(), *(imported_modules(c) for c in chapter["code"]))
        for module in sorted(used):
            need = needs(module)
            if need and need[0] >= number:
                via = "" if need[1] == module else f" (through minixl.{need[1]})"
                problems.append(f"{where} imports minixl.{module}, which needs chapter "
                                f"{need[0]}'s module{via}: a chapter may use only what "
                                "earlier chapters export")
    return problems


