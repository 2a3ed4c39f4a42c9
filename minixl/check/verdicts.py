"""Verdict helpers shared by every chapter's checkers.

Hand-written (not generated). `verdict` prints PASS or FAIL with what is wrong, and
`call` calls the student's function, turning any exception into a reason to fail (naming
the arguments by shape and dtype). (Each
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


def describe(value) -> str:
    """A short account of one argument: a tensor's shape and dtype, never its values (a
    failing call on q, k and v would otherwise print hundreds of lines of numbers before the
    reason); containers item by item; anything else by its repr, cut to 60 characters."""
    shape, dtype = getattr(value, "shape", None), getattr(value, "dtype", None)
    if shape is not None and dtype is not None:
        try:
            dims = tuple(shape)
        except TypeError:  # a class (torch.Tensor itself), whose shape is a descriptor
            return getattr(value, "__name__", type(value).__name__)
        kind = type(value).__name__
        return f"{kind}(shape={dims}, dtype={str(dtype).replace('torch.', '')})"
    if isinstance(value, (list, tuple)):
        inner = ", ".join(describe(v) for v in value[:6]) + (", ..." if len(value) > 6 else "")
        return f"[{inner}]" if isinstance(value, list) else f"({inner}{',' if len(value) == 1 else ''})"
    if isinstance(value, dict):
        return "{" + ", ".join(f"{k!r}: {describe(v)}" for k, v in list(value.items())[:6]) + "}"
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def call(fn: Callable, *args, **kwargs):
    try:
        return fn(*args, **kwargs), None
    except Exception as err:  # a student's code may raise anything; report it
        given = [describe(a) for a in args] + [f"{k}={describe(v)}" for k, v in kwargs.items()]
        return None, (f"calling it with ({', '.join(given)}) raised "
                      f"{type(err).__name__}: {err}")
