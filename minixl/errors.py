"""The one map from an error to the exit code of a minixl command (hand-written).

`minixl` (minixl.cli) and the registry of runs (`python -m minixl.experiments`, `minixl
bench --suite`) both end a run that failed through `exit_code`: 2 for bad input (one line
says what was wrong and what is expected), 130 for a Ctrl-C that stopped it, and a training
error's own code (`exit_code` on the error: 3 diverged, 4 the run folder could not be written,
130/143 stopped by SIGINT/SIGTERM after a checkpoint). None: an error minixl does not know, a
bug, whose traceback is shown.
"""

from __future__ import annotations

from .checkpoint import CheckpointError
from .data import DownloadError

__all__ = ["ERRORS", "exit_code"]

ERRORS = (ValueError, CheckpointError, DownloadError, OSError)  # bad input: exit code 2


def exit_code(err: BaseException) -> int | None:
    """The exit code of an error that minixl reports in one line, or None for one it does not
    know (a bug: its traceback is shown)."""
    if isinstance(err, ERRORS):
        return 2
    if isinstance(err, KeyboardInterrupt):
        return 130
    return getattr(err, "exit_code", None)  # the trainer's: diverged, save failed, a signal
