"""Checkpoints: atomic saves, safe loads with clear errors, and the resume check.

Hand-written shared machinery (not generated). A checkpoint is one dict, written with
torch.save and read with weights_only=True, so a file from elsewhere can hold tensors and
plain values but cannot run code:

    format        "minixl-checkpoint-2"
    step          optimiser steps whose update is in the weights
    model         the model's state_dict (plain keys, also for a compiled model)
    model_config  the model's config, as a dict
    meta          what the run was, beside its settings (part of the resume check):
                  "kind" (the model kind's name), "kind_source" (MODULE:NAME, for a kind
                  from outside minixl), "objective" (the objective's options, for kinds
                  that have some: "positions targets=1"), "corpus" ({"source": the name
                  or path given, "sha256": the digest of its bytes})
    train_config  the TrainConfig, as a dict (one written before a field existed lacks it:
                  the trainer reads it as the value it had then, in
                  run_folder.UNRECORDED_DEFAULTS)
    objective     the objective's own weights (Chapter 2's extra heads; often empty)
    optimizer     the optimiser's state_dict
    state         what the model carries from batch to batch (Transformer-XL's memory) or None;
                  always the whole batch's rows, also when several processes trained it;
                  tensors in lists, tuples and dicts as they are, a named tuple or dataclass
                  as a dict that names its class (minixl.training.state)
"""

from __future__ import annotations

import os
import tempfile
import warnings
from pathlib import Path

import torch

__all__ = ["FORMAT", "FILE", "CheckpointError", "save_checkpoint", "load_checkpoint",
           "check_resume", "saved_config"]

FORMAT = "minixl-checkpoint-2"
FILE = "checkpoint.pt"  # its name in a run folder
NEEDED = ("step", "model", "model_config", "meta")  # what evaluation and sampling read
FOR_RESUME = ("train_config", "objective", "optimizer", "state")


class CheckpointError(RuntimeError):
    """A checkpoint is missing, corrupt, or does not fit the run that reads it."""


def save_checkpoint(path: Path, payload: dict) -> None:
    """torch.save to a temporary file beside path, then rename: a crash never leaves half a file.

    Temporary files that an earlier, killed save left behind are removed first (a run holds
    its folder's lock, so no other save is writing them). A write that fails (no space, file
    too large, no permission, an I/O error) raises that OSError, naming `path`, with the
    temporary file removed and whatever was at `path` untouched.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    for stale in path.parent.glob(f"{path.name}.*.part"):
        stale.unlink(missing_ok=True)
    tmp = None
    try:
        fd, tmp = tempfile.mkstemp(prefix=path.name + ".", suffix=".part", dir=path.parent)
        with os.fdopen(fd, "wb") as f:
            os.fchmod(fd, 0o666 & ~_umask())  # as open() would make it (mkstemp: private)
            writer = _Writer(f)
            try:
                torch.save(payload, writer)
            except RuntimeError:  # torch reports a failed write as its own error, without
                if writer.error is None:  # the reason: raise the OSError it met instead
                    raise
                raise writer.error from None
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except OSError as err:
        raise OSError(err.errno, err.strerror or str(err), str(path)) from None
    finally:
        if tmp is not None:
            Path(tmp).unlink(missing_ok=True)


def _umask() -> int:
    """This process's umask, read without changing it where Linux says it (threads may be
    making files meanwhile)."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("Umask:"):
                return int(line.split()[1], 8)
    except (OSError, ValueError):
        pass
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


class _Writer:
    """A file that remembers the first OSError a write met (torch.save hides it)."""

    def __init__(self, f):
        self.f, self.error = f, None

    def write(self, data) -> int:
        try:
            return self.f.write(data)
        except OSError as err:
            self.error = self.error or err
            raise

    def flush(self) -> None:
        self.f.flush()


def load_checkpoint(path: Path, *, for_resume: bool = False) -> dict:
    """Read a minixl checkpoint (tensors and plain values only); clear errors when it is not
    one. `path` is the file, or a run folder (what `minixl train --out` names), read as the
    checkpoint.pt in it."""
    path = Path(path)
    if path.is_dir():
        if not (path / FILE).is_file():
            raise CheckpointError(f"{path} is a folder with no {FILE} in it: name a run "
                                  "folder (minixl train's --out) or a checkpoint file")
        path = path / FILE
    if not path.is_file():
        raise CheckpointError(f"no checkpoint at {path}")
    if path.stat().st_size == 0:
        raise CheckpointError(f"{path} is empty (0 bytes): its save was cut short or the file "
                              "was truncated; use an earlier copy or train again")
    try:
        with warnings.catch_warnings():  # torch warns about odd pickles before failing on them
            warnings.simplefilter("ignore")
            ckpt = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as err:  # torch raises many kinds for a damaged or foreign file
        raise CheckpointError(f"{path} cannot be read as a minixl checkpoint ({type(err).__name__}): "
                              "it is truncated or corrupt, not a PyTorch file, or holds objects "
                              "other than tensors and plain values") from None
    if not isinstance(ckpt, dict) or ckpt.get("format") != FORMAT:
        found = ckpt.get("format") if isinstance(ckpt, dict) else None
        hint = f" (it says {found!r}: written by an older minixl; train again)" if found else ""
        raise CheckpointError(f"{path} is not a {FORMAT} file{hint}")
    missing = [k for k in NEEDED + (FOR_RESUME if for_resume else ()) if k not in ckpt]
    if missing:
        raise CheckpointError(f"{path} has no {', '.join(repr(k) for k in missing)} entry: it is "
                              f"incomplete{' for --resume' if for_resume else ''}")
    kinds = {"step": int, "model": dict, "model_config": dict, "meta": dict,
             "train_config": dict, "objective": dict, "optimizer": dict}
    wrong = [k for k, t in kinds.items() if k in ckpt and not isinstance(ckpt[k], t)]
    if wrong:
        raise CheckpointError(f"{path} is damaged: its {', '.join(repr(k) for k in wrong)} "
                              f"entr{'y is' if len(wrong) == 1 else 'ies are'} of the wrong type")
    return ckpt


def check_resume(saved: dict, wanted: dict, *, fixed: set[str], allow: set[str]) -> dict:
    """Compare a run's identity as saved with what the resumed run asks for.

    saved, wanted: flat {setting: value}. A difference in a `fixed` setting (the model) is
    always an error; any other difference is an error unless its name is in `allow`.
    Returns the allowed changes as {setting: (old, new)}; raises CheckpointError with the
    whole diff otherwise.
    """
    unknown = sorted(allow - (set(wanted) - fixed))
    if unknown:
        raise ValueError(f"--allow-change names {', '.join(unknown)}, which "
                         f"{'is' if len(unknown) == 1 else 'are'} not a setting a resumed run can "
                         f"change; those are: {', '.join(sorted(set(wanted) - fixed))}")
    diff = {k: (saved.get(k), wanted.get(k)) for k in sorted(set(saved) | set(wanted))
            if saved.get(k) != wanted.get(k)}
    never = {k: v for k, v in diff.items() if k in fixed}
    refused = {k: v for k, v in diff.items() if k not in fixed and k not in allow}
    if never or refused:
        lines = [f"  {k}: {old!r} -> {new!r}" for k, (old, new) in {**never, **refused}.items()]
        how = (f"{', '.join(never)} cannot change on resume (the model, its kind and its "
               "objective stay as trained): resume with the same --model, preset, sizes and "
               "--aux-losses, or train a new run" if never else "")
        if refused:
            names = ",".join(refused)
            how += ("; " if how else "") + (f"resume with the settings it was trained with, or "
                                             f"pass --allow-change {names} to change them on purpose")
        raise CheckpointError("the checkpoint was trained with other settings:\n"
                              + "\n".join(lines) + "\n" + how)
    return diff


def saved_config(config_type: type, saved: dict) -> dict:
    """A checkpoint's model config, whole: a field the checkpoint predates has the value it
    meant (the config class's LEGACY, e.g. SegTreeConfig's rule 'bpt'), else its default."""
    from dataclasses import MISSING, fields

    defaults = {f.name: f.default for f in fields(config_type) if f.default is not MISSING}
    return defaults | getattr(config_type, "LEGACY", {}) | saved
