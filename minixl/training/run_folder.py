"""A run's folder: checkpoint.pt, metrics.csv and loss.png, and reading a checkpoint back.

Hand-written shared machinery (not generated); a reader of the loop can skip it.

- `RunFolder.begin` applies the folder rules (a folder that holds a run needs --resume or
  --overwrite) and, on --resume, the resume check: the saved settings must be this run's,
  but for the ones named in allow_change.
- `RunFolder.save` writes a checkpoint atomically (`minixl.checkpoint`); `restore` loads
  one into the model, the objective and the optimiser.
- `RunFolder.write` appends each metrics row to metrics.csv, `RunFolder.trim` cuts it back
  to a checkpoint on resume and `RunFolder.plot` draws loss.png; what a row holds, how a
  damaged file is read and how the plot looks are `minixl.training.metrics`.
"""

from __future__ import annotations

import contextlib
import csv
import errno
import os
import sys
import time
from dataclasses import asdict
from pathlib import Path

from ..checkpoint import (FILE, FORMAT, CheckpointError, check_resume, load_checkpoint,
                          save_checkpoint, saved_config)
from . import state as states
from .metrics import draw_loss, format_row, metrics_up_to
from .optim import load_optimizer_state

__all__ = ["CHECKPOINT", "METRICS", "PLOT", "CHANGEABLE_ON_RESUME", "UNRECORDED_DEFAULTS",
           "RunFolder", "restore",
           "SaveFailed"]

CHECKPOINT, METRICS, PLOT = FILE, "metrics.csv", "loss.png"
# Settings a resumed run may change freely: they do not change what is learned (grad_accum
# splits the same batch into micro-batches; like the number of processes and the optimiser's
# kernel, it changes only the order of float additions and which dropout mask falls on
# which row).
CHANGEABLE_ON_RESUME = ("log_every", "eval_every", "eval_bytes", "ckpt_every", "device", "dtype",
                        "grad_accum", "fused")
# Settings added after checkpoints of this format were first written: a checkpoint without
# one was trained with the value here.
UNRECORDED_DEFAULTS = {"weight_decay_on": "all", "grad_accum": 1, "fused": False, "dtype": "auto"}
# Before model kinds declared their objectives, every checkpoint recorded Chapter 2's
# default as its objective; a kind without objective options now records none.
LEGACY_OBJECTIVE = "positions targets=1"


class SaveFailed(Exception):
    """The run folder could not be written (no space, file too large, no permission, an I/O
    error); the folder was put back to its last checkpoint (see RunFolder.failed)."""

    exit_code = 4  # `minixl train`'s exit code


# what a failed write's errno means, and what to do about it
WRITE_ERRORS = {
    errno.ENOSPC: ("the disk is full", "free space on it"),
    errno.EDQUOT: ("the disk quota is used up", "free space or raise the quota"),
    errno.EFBIG: ("the file would exceed this process's file-size limit",
                  "raise the limit (ulimit -f)"),
    errno.EACCES: ("no permission to write there", "make the folder writable"),
    errno.EPERM: ("no permission to write there", "make the folder writable"),
    errno.EROFS: ("the filesystem is read-only", "remount it writable or copy the folder"),
    errno.EIO: ("an input/output error (a failing disk or network filesystem)",
                "check the disk")}


def _why(err: OSError) -> tuple[str, str]:
    """(what a failed write's error means, with its errno's name; what to do about it)."""
    why, fix = WRITE_ERRORS.get(err.errno, (err.strerror or str(err), "check the disk"))
    return f"{why} ({errno.errorcode.get(err.errno, str(err.errno))})", fix


def lock_holder(folder: Path) -> str:
    """Who holds the lock on `folder`, as 'process PID (its command line)', read from
    /proc/locks (Linux); 'another process' where that cannot be read."""
    try:
        inode = os.stat(folder).st_ino
        for line in Path("/proc/locks").read_text().splitlines():
            parts = line.split()  # "1: FLOCK  ADVISORY  WRITE 1234 00:2a:5678 0 EOF"
            if len(parts) >= 6 and parts[1] == "FLOCK" and parts[5].split(":")[-1] == str(inode):
                command = Path(f"/proc/{parts[4]}/cmdline").read_bytes()
                command = command.replace(b"\0", b" ").decode(errors="replace").strip()
                return f"process {parts[4]}" + (f" ({command})" if command else "")
    except (OSError, ValueError):
        pass
    return "another process"


class RunFolder:
    """An output folder: checkpoint.pt, metrics.csv and loss.png (rank 0 alone writes it).
    A run holds an advisory lock on the folder from `begin` until `unlock` (or its end, by
    any means: the operating system drops the lock with the process), so that a second run
    into the same folder stops at once instead of overwriting the first one's files. `eval`
    and `sample` take no lock: they may read a folder in use."""

    def __init__(self, out: Path, model, own, cfg, meta: dict):
        self.out, self.ckpt = out, out / CHECKPOINT
        self.model, self.objective_weights, self.opt = model, own, None
        self.cfg, self.meta = cfg, meta
        self.saved, self._log, self._writer = 0, None, None
        self._lock, self._made = None, False
        # metrics.csv's size when the last checkpoint was saved (None: it did not exist then)
        self._good = None

    def lock(self) -> None:
        """Take the folder's lock (creating the folder), or stop with one line that names
        the process that holds it."""
        self._refuse_a_file()
        self.out.parent.mkdir(parents=True, exist_ok=True)
        try:  # exactly one of two runs starting at once makes the folder
            self.out.mkdir()
            self._made = True
        except FileExistsError:
            self._made = False
        self._lock = self._flock()

    def _refuse_a_file(self) -> None:
        if self.out.exists() and not self.out.is_dir():
            raise ValueError(f"--out {self.out} is a file: name a folder for the run")

    def _flock(self) -> int | None:
        """The folder's lock taken (its descriptor; None without flock, on Windows: the
        folder, but no lock), or the one line that names its holder. A lock held for less
        than half a second is waited for: another start's preflight holds it for an instant
        only, and must not turn this run away (a run holds it for its whole length)."""
        try:
            import fcntl
        except ImportError:
            return None
        fd = os.open(self.out, os.O_RDONLY)
        deadline = time.monotonic() + 0.5
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                return fd
            except BlockingIOError:
                if time.monotonic() < deadline:
                    time.sleep(0.01)
                    continue
                os.close(fd)
                raise ValueError(f"{self.out} is in use by another run, "
                                 f"{lock_holder(self.out)}: wait for it to end, or choose "
                                 "another --out") from None

    def preflight(self, resume: bool, overwrite: bool, allow: set) -> None:
        """What `begin` would refuse, asked before anything is printed or made: the folder
        in use by another run (its lock, taken and dropped at once), then check_start. A
        start it passes is checked again under the lock by `begin`, which decides."""
        self._refuse_a_file()
        if self.out.is_dir() and (fd := self._flock()) is not None:
            os.close(fd)
        self.check_start(resume, overwrite, allow)

    def unlock(self) -> None:
        """Drop the folder's lock."""
        if self._lock is not None:
            os.close(self._lock)
            self._lock = None

    @staticmethod
    def identity(model_config: dict, train_config: dict, meta: dict) -> dict:
        """The settings that define what a run learns, flat, for the resume check."""
        ident = {f"model.{k}": v for k, v in model_config.items()}
        ident |= {k: v for k, v in {**UNRECORDED_DEFAULTS, **train_config}.items()
                  if k not in CHANGEABLE_ON_RESUME}
        return ident | dict(meta)

    def begin(self, resume: bool, overwrite: bool, allow: set) -> dict:
        """Check the folder against --resume/--overwrite and a checkpoint against this run:
        {"ckpt": the checkpoint (None for a new run), "changed": the allowed changes, "cfg":
        this run's settings as a dict}, which every process then restores."""
        self.lock()  # refused: the folder is someone else's, left as it is
        try:
            return self._begin(resume, overwrite, allow)
        except BaseException:
            # a refusal leaves nothing behind: the folder this run made goes, while it still
            # holds the lock (no other run can be using it)
            if self._made and not any(self.out.iterdir()):
                self.out.rmdir()
            self.unlock()
            raise

    def check_start(self, resume: bool, overwrite: bool, allow: set) -> tuple[list, str | None]:
        """Refuse a start the folder does not allow (a ValueError that says why), changing
        nothing: `minixl train` asks before it prints its first line (preflight), and the run
        asks again under the folder's lock. Returns our files in it and what a run stopped before its
        first checkpoint left (None if not that)."""
        ours = [p for p in (self.ckpt, self.out / METRICS, self.out / PLOT) if p.exists()]
        if resume and overwrite:
            raise ValueError("--resume continues the run in the folder and --overwrite deletes "
                             "it: pass one of them, not both")
        unsaved = self._stopped_before_first_save() if ours else None
        if not resume and ours and not overwrite and unsaved is None:
            raise ValueError(f"{self.out} already holds a run ({', '.join(p.name for p in ours)}); "
                             "pass --resume to continue it, --overwrite to start again, or "
                             "choose another --out")
        if resume and not self.ckpt.exists():
            raise ValueError(f"--resume: there is no checkpoint at {self.ckpt} to resume from"
                             + (f": the run in it stopped before its first checkpoint "
                                f"({unsaved}); run again without --resume to start afresh"
                                if unsaved else ""))
        if allow and not resume:
            raise ValueError("--allow-change applies to --resume only")
        return ours, unsaved

    def _begin(self, resume: bool, overwrite: bool, allow: set) -> dict:
        for name in (METRICS, PLOT):  # left by a run killed while it rewrote them
            with contextlib.suppress(OSError):
                (self.out / (name + ".part")).unlink(missing_ok=True)
        ours, unsaved = self.check_start(resume, overwrite, allow)
        if not resume:
            if not overwrite and unsaved is not None:
                for path in self.out.glob(f"{CHECKPOINT}.*.part"):
                    path.unlink()
                print(f"{self.out} held only what a run stopped before its first checkpoint "
                      f"left ({unsaved}, no checkpoint): starting afresh", flush=True)
            for path in ours:
                path.unlink()
            return {"ckpt": None, "changed": {}, "cfg": asdict(self.cfg)}
        ckpt = load_checkpoint(self.ckpt, for_resume=True)
        model_config = asdict(self.model.config)
        saved_model = saved_config(type(self.model.config), ckpt["model_config"])
        saved_meta = dict(ckpt["meta"])
        if "objective" not in self.meta and saved_meta.get("objective") == LEGACY_OBJECTIVE:
            del saved_meta["objective"]
        fixed = ({f"model.{k}" for k in set(model_config) | set(saved_model)}
                 | {"kind", "kind_source", "objective"})
        changed = check_resume(self.identity(saved_model, ckpt["train_config"], saved_meta),
                               self.identity(model_config, asdict(self.cfg), self.meta),
                               fixed=fixed, allow=allow)
        for name, (old, new) in changed.items():
            print(f"resuming with {name} changed: {old!r} -> {new!r}")
        if ckpt["step"] >= self.cfg.steps:
            raise ValueError(f"{self.ckpt} has already trained {ckpt['step']} steps, the whole "
                             f"run; to train further pass a larger --steps (the total) with "
                             "--allow-change steps, which stretches the learning-rate schedule to "
                             "the new total")
        return {"ckpt": ckpt, "changed": changed, "cfg": asdict(self.cfg)}

    def _stopped_before_first_save(self) -> str | None:
        """What a minixl run stopped before its first checkpoint leaves, if the folder holds
        nothing else ("metrics.csv to step 3"): no checkpoint; a metrics.csv whose header and
        rows are minixl's (a last row cut short by the kill aside), its last step no further
        than this run's first save and short of its end (a run that went further saved a
        checkpoint, which someone has since removed: its history is kept); maybe loss.png and the .part of a first
        save killed half-way. None for anything else: it is not ours to delete. (begin's
        caller holds the folder's lock: no run is writing it; preflight reads without it,
        and begin asks again under it.)"""
        if self.ckpt.exists() or not (self.out / METRICS).is_file():
            return None
        try:
            names = [p.name for p in self.out.iterdir()]
            data = (self.out / METRICS).read_bytes()
        except OSError:
            return None
        if any(n not in (METRICS, PLOT, METRICS + ".part", PLOT + ".part")
               and not (n.startswith(CHECKPOINT + ".") and n.endswith(".part")) for n in names):
            return None
        kept, damaged, header_damaged = metrics_up_to(data, sys.maxsize)
        if data and (header_damaged or damaged or not kept):
            return None
        rows = kept.splitlines()[1:]
        if not rows:
            return f"{METRICS} without a row"
        last = int(rows[-1].split(b",")[0])
        if last > self.cfg.ckpt_every or last >= self.cfg.steps:  # it saved, or may have ended
            return None
        return f"{METRICS} to step {last}"

    def save(self, step: int, state) -> None:
        """Save a checkpoint of `step` (atomically); the caller has checked the weights.
        A failed write raises SaveFailed, with the folder as it was at the last checkpoint."""
        try:
            save_checkpoint(self.ckpt, {
                "format": FORMAT, "step": step, "model": self.model.state_dict(),
                "model_config": asdict(self.model.config), "meta": self.meta,
                "train_config": asdict(self.cfg),
                "objective": self.objective_weights.state_dict(),
                "optimizer": self.opt.state_dict(),
                "state": states.encode(states.to_device(state, "cpu")),
            })
        except OSError as err:
            raise self.failed(self.ckpt, err, f"the checkpoint of step {step}") from None
        self.saved, self._good = step, self._size(self.out / METRICS)

    def write(self, row: dict) -> None:
        """Append a metrics row to metrics.csv (losses to 4 decimals)."""
        row = format_row(row)
        path = self.out / METRICS
        try:
            if self._log is None:
                old = path.exists() and path.stat().st_size > 0
                fieldnames = next(csv.reader(open(path))) if old else list(row)
                self._log = open(path, "a" if old else "w", newline="")
                self._writer = csv.DictWriter(self._log, fieldnames=fieldnames,
                                              extrasaction="ignore")
                if not old:
                    self._writer.writeheader()
            self._writer.writerow(row)
            self._log.flush()
        except OSError as err:
            raise self.failed(path, err, f"the metrics of step {row['step']}") from None

    def close(self) -> None:
        if self._log is not None:
            log, self._log = self._log, None
            try:
                log.close()
            except OSError:  # what it could not write is past the last checkpoint (failed)
                pass

    def trim(self, step: int) -> None:
        """On resume, drop metrics rows logged after the checkpoint's step: they are redone.

        A row a killed run left half-written (the file's last line, cut short) goes silently.
        Lines that are not rows of this file (damaged) go too, with one line on stderr saying
        which; the good rows around them stay. Where nothing is damaged the file is cut in
        place, which needs no space; else it is rewritten beside and renamed. A failure
        changes nothing and raises SaveFailed."""
        path, tmp = self.out / METRICS, self.out / (METRICS + ".part")
        try:
            if path.exists():
                data = path.read_bytes()
                body, bad, header_bad = metrics_up_to(data, step)
                if not bad and data.startswith(body):
                    os.truncate(path, len(body))
                else:
                    tmp.write_bytes(body)
                    os.replace(tmp, path)
                if header_bad:
                    print(f"minixl train: warning: {path} had a damaged header, so none of its "
                          "rows could be read; it starts again with this run's rows",
                          file=sys.stderr)
                elif bad:
                    shown = ", ".join(map(str, bad[:5])) + (", ..." if len(bad) > 5 else "")
                    print(f"minixl train: warning: {path} had {len(bad)} damaged "
                          f"line{'s' if len(bad) > 1 else ''} ({shown}), dropped; it keeps "
                          f"its rows up to step {step}", file=sys.stderr)
        except OSError as err:
            tmp.unlink(missing_ok=True)
            why, fix = _why(err)
            raise SaveFailed(f"could not cut {path} back to step {step}, the step of "
                             f"{self.ckpt}: {why}; nothing in the folder was changed; "
                             f"{fix}, then --resume again") from None
        self.saved, self._good = step, self._size(path)

    @staticmethod
    def _size(path: Path) -> int | None:
        return path.stat().st_size if path.exists() else None

    def failed(self, path: Path, err: OSError, what: str) -> SaveFailed:
        """A write to `path` failed: put metrics.csv back as it was at the last checkpoint
        (truncated in place, which needs no space) and say in one line what failed, why,
        what is kept and what to do."""
        why, fix = _why(err)
        self.close()
        metrics = self.out / METRICS
        try:
            if self._good is None:
                metrics.unlink(missing_ok=True)
            else:
                os.truncate(metrics, self._good)
            undo = None
        except OSError as e:
            undo = e.strerror or str(e)
        if self.saved:
            kept = (f"the checkpoint of step {self.saved} in {self.ckpt} is kept, and "
                    "metrics.csv ends at that step")
            then = ("then continue with --resume" if self.saved < self.cfg.steps else
                    "(the run itself is complete)")
        else:
            kept = "no checkpoint had been saved, so nothing of this run is kept"
            then = "then start it again" + (" with --overwrite" if undo else "")
            try:
                if self._made and not undo and not any(self.out.iterdir()):
                    self.out.rmdir()  # the folder this run made, empty (we hold its lock)
            except OSError:
                pass
        if undo and self.saved:
            kept += (f" (metrics.csv could not be cut back, {undo}: --resume drops its rows "
                     f"after step {self.saved})")
        elif undo:
            kept += f" (metrics.csv could not be removed, {undo})"
        return SaveFailed(f"could not write {what} to {path}: {why}; {kept}; {fix}, {then}")

    def plot(self) -> None:
        """loss.png, drawn from metrics.csv (metrics.draw_loss); a plot that cannot be written
        is a warning, not a failed run."""
        path = self.out / PLOT
        tmp = path.with_name(path.name + ".part")
        try:
            draw_loss(self.out / METRICS, tmp, title=self.out.name)
            os.replace(tmp, path)  # renamed: a failed write keeps the last plot
        except OSError as err:
            tmp.unlink(missing_ok=True)
            why = WRITE_ERRORS.get(err.errno, (err.strerror or str(err),))[0]
            print(f"minixl train: warning: could not draw {path}: {why}; the checkpoint and "
                  "metrics.csv are as they should be, and the next run into the folder draws "
                  "it again", file=sys.stderr)


def restore(ckpt: dict, changed: dict, model, own, opt, cfg, device, path, *, say: bool,
            no_decay=()):
    """Load a checkpoint's weights and optimiser state; (its step, its whole state)."""
    try:
        model.load_state_dict(ckpt["model"])
        own.load_state_dict(ckpt["objective"])
        saved_on = {**UNRECORDED_DEFAULTS, **ckpt["train_config"]}["weight_decay_on"]
        load_optimizer_state(opt, ckpt["optimizer"], saved_on, [model, own], cfg, device,
                             no_decay=no_decay)
        state = states.decode(ckpt["state"])
    except (RuntimeError, ValueError, KeyError, TypeError, AttributeError) as err:
        raise CheckpointError(f"{path} does not fit this run: "
                              f"{str(err).splitlines()[0] if str(err) else type(err).__name__}"
                              ) from None
    if state is not None and changed.keys() & {"batch_size", "corpus"}:
        if say:
            print("resuming with an empty state (memory): it belonged to other streams")
        state = None
    return ckpt["step"], state
