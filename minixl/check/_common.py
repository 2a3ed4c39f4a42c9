"""Verdict helpers shared by every chapter's checkers.

Hand-written (not generated). `_ref` loads a reference implementation from minixl when a
checker runs (never when minixl.check is imported), `_verdict` prints PASS or FAIL with
what is wrong, and `_call` calls the student's function, turning any exception into a
reason to fail.
"""

from __future__ import annotations

import importlib
from typing import Callable


def _ref(module: str, name: str) -> Callable:
    """The reference `name` from minixl.<module>, imported when a checker runs: a chapter's
    checkers work before later chapters' modules exist."""
    return getattr(importlib.import_module(f"..{module}", __package__), name)


def _verdict(name: str, problem: str | None, n_checks: int) -> bool:
    if problem is None:
        print(f"PASS {name}: all {n_checks} checks agree with the reference.")
        return True
    print(f"FAIL {name}: {problem}")
    return False


def _call(fn: Callable, *args, **kwargs):
    try:
        return fn(*args, **kwargs), None
    except Exception as err:  # a student's code may raise anything; report it
        return None, f"calling it with {args} raised {type(err).__name__}: {err}"
