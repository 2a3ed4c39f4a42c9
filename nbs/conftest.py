"""pytest plugin for nbval runs over the chapters: each chapter's time budget.

Hand-written. Sums the wall-clock time nbval spends on every cell of a notebook
(kernel start included) and fails the session when a chapter runs over its
budget, 180 s by default (set MINIXL_CHAPTER_BUDGET_S to change it). On the
2-core CPU the book targets, wall time is the budget that matters to a reader.
"""

import os
from collections import defaultdict

BUDGET_S = float(os.environ.get("MINIXL_CHAPTER_BUDGET_S", "180"))
_spent: dict[str, float] = defaultdict(float)


def pytest_runtest_logreport(report):
    path = report.nodeid.split("::")[0]
    if path.endswith(".ipynb"):
        _spent[path] += report.duration


def pytest_terminal_summary(terminalreporter):
    if not _spent:
        return
    terminalreporter.section("chapter time budget (wall clock)")
    for path, secs in sorted(_spent.items()):
        verdict = "ok" if secs <= BUDGET_S else "OVER BUDGET"
        terminalreporter.write_line(f"{path}: {secs:.1f} s of {BUDGET_S:.0f} s  {verdict}")


def pytest_sessionfinish(session, exitstatus):
    over = {p: s for p, s in _spent.items() if s > BUDGET_S}
    if over and session.exitstatus == 0:
        session.exitstatus = 1
