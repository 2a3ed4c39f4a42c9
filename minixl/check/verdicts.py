"""Verdict helpers shared by every chapter's checkers.

Hand-written (not generated). `verdict` prints PASS or FAIL with what is wrong, and
`call` calls the student's function, turning any exception into a reason to fail. (Each
chapter's checkers import their references at their top: a chapter's checkers are loaded
only when one of them is used, through the table in minixl/check/__init__.py.)
"""

from __future__ import annotations

from typing import Callable


def verdict(name: str, problem: str | None, n_checks: int) -> bool:
    if problem is None:
        print(f"PASS {name}: all {n_checks} checks agree with the reference.")
        return True
    print(f"FAIL {name}: {problem}")
    return False


def call(fn: Callable, *args, **kwargs):
    try:
        return fn(*args, **kwargs), None
    except Exception as err:  # a student's code may raise anything; report it
        return None, f"calling it with {args} raised {type(err).__name__}: {err}"
