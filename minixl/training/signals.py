"""Stopping on a signal: SIGINT (Ctrl-C) and SIGTERM end a run after a whole step, with a
checkpoint of exactly that step.

Hand-written shared machinery (not generated); a reader of the loop can skip it.

- The first signal prints a notice at once, lets the current optimiser step finish, and the
  loop saves a checkpoint of exactly that step and raises `TrainingInterrupted`.
- A second Ctrl-C before that checkpoint is on disk aborts at once (KeyboardInterrupt) and
  leaves the previous checkpoint as it was; one after it is ignored (the run is stopping).
- Work that changes nothing the checkpoint holds (held-out evaluation) may be abandoned at
  once: inside `Stopper.interruptible()` the handler raises `StopNow`.
- Distributed, the processes stop after the same step: `settle` (after every step) agrees
  on the largest signal any process has received. There a repeated signal does not abort:
  torchrun passes a Ctrl-C on to its workers, which the terminal has already sent them, so
  every worker sees two.
"""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import threading
from pathlib import Path

__all__ = ["TrainingInterrupted", "StopNow", "Stopper"]


class TrainingInterrupted(Exception):
    """SIGINT or SIGTERM stopped the run after a step; its checkpoint was saved."""

    def __init__(self, signum: int, step: int, checkpoint: Path):
        self.signum, self.step, self.checkpoint = signum, step, checkpoint
        self.exit_code = 128 + signum  # the shell's convention: 130 for SIGINT, 143 SIGTERM
        name = signal.Signals(signum).name
        super().__init__(f"{name}: stopped after step {step}; checkpoint saved to {checkpoint} "
                         "(continue with --resume)")


class StopNow(Exception):
    """Raised by the signal handler while the run does work it may abandon (evaluation)."""


def _notice(text: str) -> None:
    """Write from a signal handler: straight to the file descriptor when there is one, so a
    write the handler interrupted is never re-entered."""
    try:
        os.write(sys.stderr.fileno(), text.encode())
    except (AttributeError, OSError, ValueError):  # a notebook's stream has no real descriptor
        sys.stderr.write(text)


class Stopper:
    """Holds SIGINT and SIGTERM until the current step has finished (see the module docstring).

    `saved` is set once the stopping checkpoint is on disk. Only rank 0 prints the notice
    (`quiet` elsewhere). Handlers are installed only in the main thread, and put back at exit.
    """

    def __init__(self, enabled: bool, *, distributed: bool = False, quiet: bool = False):
        self.enabled = enabled and threading.current_thread() is threading.main_thread()
        self.signum, self._abandon, self._old, self.saved = None, False, {}, False
        self.distributed, self.quiet, self._agreed = distributed, quiet, None

    @property
    def stop(self) -> int | None:
        """The signal to stop after this step for (None: go on)."""
        return self._agreed if self.distributed else self.signum

    def settle(self, ranks) -> None:
        """Distributed: agree with the other processes whether to stop after this step."""
        if self.distributed and self.enabled:
            self._agreed = ranks.max_int(self.signum or 0) or None
            if self._agreed and self.signum is None:
                self.signum = self._agreed  # a signal from now on is a repeat

    def __enter__(self):
        if self.enabled:
            self._old = {s: signal.signal(s, self._handle) for s in (signal.SIGINT, signal.SIGTERM)}
        return self

    def __exit__(self, *exc):
        for s, handler in self._old.items():
            signal.signal(s, handler)

    def _handle(self, signum, frame):
        if self.signum is not None:
            if signum == signal.SIGINT and not self.saved and not self.distributed:
                raise KeyboardInterrupt  # the second Ctrl-C: stop now, save nothing
            return
        self.signum = signum
        if self.quiet:
            return
        _notice(f"minixl: {signal.Signals(signum).name} received; "
                + ("stopping evaluation and saving" if self._abandon else
                   "finishing the current step, then saving")
                + " a checkpoint (Ctrl-C again aborts without saving)\n")
        if self._abandon:
            raise StopNow

    @contextlib.contextmanager
    def interruptible(self):
        """Work that changes nothing the checkpoint holds: a signal may stop it at once (in a
        one-process run)."""
        if self.distributed:
            yield
            return
        if self.signum:
            raise StopNow
        self._abandon = True
        try:
            yield
        finally:
            self._abandon = False
