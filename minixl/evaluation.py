"""Evaluation protocols in one place: all positions, sliding window, memory, and infilling.

Hand-written shared machinery (not generated). The protocols themselves are taught and
exported by the chapters; `evaluate` picks one by name for any model that meets the model
protocol, as the trainer (held-out bpc) and `minixl eval` do:

- ``all-positions``: Chapter 1's `evaluate_bpc`, the text cut into windows of seq_len and
  every position scored (the first bytes of a window see little context);
- ``sliding``: Chapter 2's `evaluate_bpc_sliding`, each byte predicted from a full window,
  `stride` predictions per window (stride 1 is Al-Rfou et al.'s protocol);
- ``memory``: Chapter 4's `stream_nll`, the text read as parallel streams in segments of
  seq_len with the model's state (Transformer-XL's memory) carried from one to the next;
- ``infill``: Chapter 5's `evaluate_infill`, a span of `INFILL_SPAN` bytes in the middle of
  each window of seq_len, read left to right within the span with both sides seen: it needs
  a model whose query stream reads a span from both sides (forward(..., masks=...,
  target_mapping=...), Chapter 5), so it has no left-to-right counterpart.

Which protocols suit a model is a fact of its kind (`minixl.kinds.ModelKind.protocols`);
this module only checks that a model can be read the way a protocol reads it.
"""

from __future__ import annotations

from dataclasses import dataclass

import inspect

import torch
import torch.nn as nn

from .aux_losses import evaluate_bpc_sliding
from .char_transformer import evaluate_bpc
from .device import autocast
from .transformer_xl import evaluate_bpc_xl

__all__ = ["PROTOCOLS", "INFILL_SPAN", "Evaluation", "evaluate", "check_protocol",
           "memory_streams"]

PROTOCOLS = ("all-positions", "sliding", "memory", "infill")
INFILL_SPAN = 8  # bytes scored per window by the infill protocol


@dataclass
class Evaluation:
    """What `evaluate` measured: bits per byte, of how many bytes, and how."""

    bpc: float
    n_bytes: int
    protocol: str
    how: str

    def __str__(self) -> str:
        return f"{self.bpc:.4f} bpc ({self.n_bytes:,} bytes, {self.how})"


def memory_streams(n_bytes: int, seg_len: int, max_streams: int) -> int:
    """How many parallel streams to read n_bytes with memory: at most max_streams, and few
    enough that each stream is at least 32 segments long (its first segment has no memory)."""
    return max(1, min(max_streams, (n_bytes - 1) // (32 * seg_len)))


def check_protocol(protocol: str, seq_len: int, *, model: nn.Module | None = None,
                   what: str = "seq_len") -> None:
    """A clear error when a protocol cannot score windows (or segments) of seq_len, or
    cannot read `model`; `what` names the setting that gave seq_len."""
    if protocol not in PROTOCOLS:
        raise ValueError(f"unknown protocol {protocol!r}: expected one of {', '.join(PROTOCOLS)}")
    if not isinstance(seq_len, int) or seq_len < 1:
        raise ValueError(f"seq_len must be a positive integer, got {seq_len!r}")
    if protocol != "infill":
        return
    if seq_len <= INFILL_SPAN:
        raise ValueError(f"{what} {seq_len} is too short for the infill protocol, a span of "
                         f"{INFILL_SPAN} bytes inside each window: use {what} "
                         f"{INFILL_SPAN + 1} or more")
    if model is not None and "target_mapping" not in inspect.signature(model.forward).parameters:
        raise ValueError(f"the infill protocol needs a model that sees both sides of a span (a "
                         f"query stream: forward(..., masks=..., target_mapping=...), as in "
                         f"Chapter 5); a {type(model).__name__} reads left to right only: use "
                         "all-positions, sliding or memory")


def evaluate(model: nn.Module, data: torch.Tensor, protocol: str, *, seq_len: int,
             stride: int | None = None, batch_size: int = 64) -> Evaluation:
    """Bits per byte of data [N] under a named protocol (see the module docstring).

    seq_len is the window (all-positions, sliding, infill) or the segment length (memory);
    batch_size is windows per forward pass, or at most that many streams with memory.
    """
    check_protocol(protocol, seq_len, model=model)
    if not isinstance(batch_size, int) or batch_size < 1:
        raise ValueError(f"batch_size must be a positive integer, got {batch_size!r}")
    if stride is not None and protocol != "sliding":
        raise ValueError("a stride applies to the sliding protocol only")
    if len(data) < 2:
        raise ValueError(f"need at least 2 bytes to score one prediction, got {len(data)}")
    if protocol == "infill" and len(data) < seq_len:
        raise ValueError(f"the infill protocol needs at least one window of {seq_len} "
                         f"bytes, got {len(data)}")
    with autocast(next(model.parameters()).device):
        if protocol == "all-positions":
            bpc = evaluate_bpc(model, data, seq_len=seq_len, batch_size=batch_size)
            how = f"windows of {seq_len}, every position scored"
        elif protocol == "sliding":
            stride = 1 if stride is None else stride
            bpc = evaluate_bpc_sliding(model, data, seq_len=seq_len, stride=stride,
                                       batch_size=batch_size)
            how = (f"sliding windows of {seq_len}, the last {stride} position"
                   f"{'s' * (stride > 1)} of each scored")
        elif protocol == "infill":
            from .xlnet import evaluate_infill

            bpc = evaluate_infill(model, data, seq_len=seq_len, span=INFILL_SPAN,
                                  reading="sequential", batch_size=batch_size)
            n = len(data) // seq_len
            how = (f"{n} span{'s' * (n > 1)} of {INFILL_SPAN} bytes in the middle of windows of "
                   f"{seq_len}, read left to right within the span, both sides seen")
        else:
            streams = memory_streams(len(data), seq_len, batch_size)
            bpc = evaluate_bpc_xl(model, data, tgt_len=seq_len, batch_size=streams)
            memory = getattr(model.config, "mem_len", None)
            how = (f"{streams} stream{'s' * (streams > 1)}, segments of {seq_len}"
                   + ("" if memory is None else f", memory of {memory}"))
    return Evaluation(bpc, len(data), protocol, how)
