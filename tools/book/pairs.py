"""The pairs: each chapter's markdown and notebook sides hold the same cells."""

from __future__ import annotations

from pathlib import Path

from .paths import BOOK, NBS, chapters


def _cells(path: Path) -> list[tuple[str, str, tuple]]:
    import jupytext

    nb = jupytext.read(path)
    return [(c.cell_type, c.source.strip(), tuple(c.metadata.get("tags", ()))) for c in nb.cells]


def check_pairs() -> list[str]:
    """Every chapter has both sides, and their cells (type, source, tags) agree."""
    problems = []
    mds = {p.stem for p in chapters()}
    nbs = {p.stem for p in NBS.glob("[0-9][0-9]_*.ipynb")}
    for stem in sorted(mds ^ nbs):
        side = "nbs/" + stem + ".ipynb" if stem in mds else "book/" + stem + ".md"
        problems.append(f"{stem}: missing {side} (run `make sync`)")
    for stem in sorted(mds & nbs):
        a, b = _cells(BOOK / f"{stem}.md"), _cells(NBS / f"{stem}.ipynb")
        if a != b:
            at = next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))
            problems.append(
                f"{stem}: book/{stem}.md and nbs/{stem}.ipynb differ from cell {at} on "
                "(run `make sync`, then `make run` if code changed)"
            )
    return problems
