"""What `minixl eval` does, from Python: score a model of a kind by one of its protocols,
with the same rules for which settings go together.

Hand-written glue (not generated). `score` sits above the registry (it names the kinds that
take a setting this kind does not) and below nothing: the command line calls it, and so can
a notebook::

    result = minixl.score(model, held_out, KINDS["xl"], protocol="memory", mem_len=1600)
"""

from __future__ import annotations

from dataclasses import fields

import torch
import torch.nn as nn

from .evaluation import Evaluation, evaluate
from .kinds import KINDS, ModelKind, with_overrides
from .options import flag

__all__ = ["score", "check_score"]


def score(model: nn.Module, data: torch.Tensor, kind: ModelKind, *, protocol: str | None = None,
          seq_len: int | None = None, stride: int | None = None, batch_size: int = 64,
          dtype: str | None = None, **overrides) -> Evaluation:
    """Bits per byte of data [N] by the kind's protocol called `protocol` (default: its
    first). A window protocol reads windows of seq_len (default: the training length) and
    a stride where it takes one; a protocol that reads streams takes the model's own length,
    with the config fields the kind's eval_overrides name changed by `overrides` (for this
    call only: the model's config is put back). dtype: as `evaluate` takes it."""
    p = check_score(model, kind, protocol=protocol, seq_len=seq_len, stride=stride,
                    **overrides)
    overrides = {k: v for k, v in overrides.items() if v is not None}
    trained = model.config
    model.config = with_overrides(trained, **overrides)  # validated by the config itself
    try:
        length = getattr(model.config, kind.length) if seq_len is None else seq_len
        return evaluate(model, data, p, seq_len=length, stride=stride, batch_size=batch_size,
                        kind=kind, dtype=dtype)
    finally:
        model.config = trained


def check_score(model: nn.Module, kind: ModelKind, *, protocol: str | None = None,
                seq_len: int | None = None, stride: int | None = None, **overrides):
    """score's rules, checked before any text is read: the Protocol, or a clear error."""
    p = kind.protocol(protocol)
    overrides = {k: v for k, v in overrides.items() if v is not None}
    foreign = [n for n in overrides if n not in kind.eval_overrides]
    if foreign:
        takers = " or ".join(k.name for k in KINDS.values()
                             if set(foreign) <= set(k.eval_overrides)) or "(none)"
        verb = "applies" if len(foreign) == 1 else "apply"
        raise ValueError(f"{', '.join(map(flag, foreign))} {verb} to --model {takers} "
                         f"checkpoints, not to a --model {kind.name} checkpoint")
    ways = kind.protocol_objects()
    if overrides and not p.streams:
        raise ValueError(f"{', '.join(map(flag, overrides))} apply to --protocol "
                         f"{' or '.join(q.name for q in ways if q.streams)}; the window "
                         "protocols take --seq-len")
    if stride is not None and not p.stride:
        raise ValueError(f"--stride applies to --protocol "
                         f"{' or '.join(q.name for q in ways if q.stride) or '(none of this kind)'}"
                         f", not --protocol {p.name}")
    if seq_len is not None and p.streams:
        raise ValueError(f"--seq-len applies to the window protocols; with {p.name}, the "
                         "model's own settings (" + ", ".join(map(flag, kind.eval_overrides))
                         + ")")
    if not any(f.name == kind.length for f in fields(model.config)):
        raise ValueError(f"the model's config ({type(model.config).__name__}) has no "
                         f"{kind.length}: it is not a --model {kind.name} model")
    with_overrides(model.config, **overrides)  # the config's own checks of the values
    return p
