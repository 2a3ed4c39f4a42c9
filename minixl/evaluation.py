"""Evaluation protocols: all positions, sliding window, memory, and infilling.

Hand-written shared machinery (not generated). The protocols themselves are taught and
exported by the chapters; here each is a `Protocol`, an object that says how it scores held-out
text and what it reads, and `evaluate` scores any model that meets the model protocol with
one of them, as the trainer (held-out bpc) and `minixl eval` do. The book's four:

- ``all-positions``: Chapter 1's `evaluate_bpc`, the text cut into windows of seq_len and
  every position scored (the first bytes of a window see little context);
- ``sliding``: Chapter 2's `evaluate_bpc_sliding`, each byte predicted from a full window,
  `stride` predictions per window (stride 1 is Al-Rfou et al.'s protocol);
- ``memory``: Chapter 4's `stream_nll`, the text read as parallel streams in segments of
  seq_len with the model's state (Transformer-XL's memory) carried from one to the next;
- ``infill``: Chapter 5's `evaluate_infill`, a span of `INFILL_SPAN` bytes in the middle of
  each window of seq_len, read left to right within the span with both sides seen: it needs
  a model whose query stream reads a span from both sides (Chapter 5), so it has no
  left-to-right counterpart.

Which protocols suit a model is a fact of its kind (`minixl.kinds.ModelKind.protocols`,
names of these or Protocol objects of its own): `evaluate` takes a Protocol, which callers
ask the kind for (`kind.protocol(name)`), and the kind, which must declare it.
Nothing here knows the kinds or guesses one from a model, and nothing in the trainer and the
command line asks which protocol it holds. The book's protocols import their chapter's code
when they run (no chapter imports this module), so that importing it loads no chapter.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch
import torch.nn as nn

from .device import autocast

__all__ = ["Protocol", "PROTOCOLS", "INFILL_SPAN", "Evaluation", "evaluate", "check_protocol",
           "memory_streams"]

INFILL_SPAN = 8  # bytes scored per window by the infill protocol


@dataclass(frozen=True)
class Protocol:
    """How to score held-out text with a model.

    score(model, data, *, seq_len, batch_size, stride) -> (bits per byte, a line saying
    how), called by `evaluate` with the model in eval mode, under the device's autocast;
    `streams`: the text is read as parallel streams of segments with the model's state
    carried, so the batch is the number of streams (the score depends on it: the trainer
    passes its own batch size), the segment is the model's training length (`minixl eval`
    takes no --seq-len) and the kind's `eval_overrides` may change; `stride`: it takes a
    stride; `check(seq_len, what)` raises ValueError for a length it cannot score, naming
    the setting `what`; `help`: a line for `minixl eval --help`."""

    name: str
    score: Callable
    help: str = ""
    streams: bool = False
    stride: bool = False
    check: Callable[[int, str], None] | None = None


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


# ---------------------------------------------------------------- the book's protocols
# Each protocol imports the chapter function that scores it when it runs: the protocols sit
# below the model kinds (minixl.model_kind reads PROTOCOLS), and importing this module loads
# no chapter.

def _all_positions(model, data, *, seq_len, batch_size, stride):
    from .char_transformer import evaluate_bpc

    return (evaluate_bpc(model, data, seq_len=seq_len, batch_size=batch_size),
            f"windows of {seq_len}, every position scored")


def _sliding(model, data, *, seq_len, batch_size, stride):
    from .aux_losses import evaluate_bpc_sliding

    stride = 1 if stride is None else stride
    bpc = evaluate_bpc_sliding(model, data, seq_len=seq_len, stride=stride,
                               batch_size=batch_size)
    return bpc, (f"sliding windows of {seq_len}, the last {stride} position"
                 f"{'s' * (stride > 1)} of each scored")


def _memory(model, data, *, seq_len, batch_size, stride):
    from .transformer_xl import evaluate_bpc_xl

    streams = memory_streams(len(data), seq_len, batch_size)
    bpc = evaluate_bpc_xl(model, data, tgt_len=seq_len, batch_size=streams)
    memory = getattr(model.config, "mem_len", None)  # Transformer-XL's and XLNet's
    return bpc, (f"{streams} stream{'s' * (streams > 1)}, segments of {seq_len}"
                 + ("" if memory is None else f", memory of {memory}"))


def _infill(model, data, *, seq_len, batch_size, stride):
    from .xlnet import evaluate_infill

    if len(data) < seq_len:
        raise ValueError(f"the infill protocol needs at least one window of {seq_len} "
                         f"bytes, got {len(data)}")
    bpc = evaluate_infill(model, data, seq_len=seq_len, span=INFILL_SPAN,
                          reading="sequential", batch_size=batch_size)
    n = len(data) // seq_len
    return bpc, (f"{n} span{'s' * (n > 1)} of {INFILL_SPAN} bytes in the middle of windows "
                 f"of {seq_len}, read left to right within the span, both sides seen")


def _infill_check(seq_len: int, what: str) -> None:
    if seq_len <= INFILL_SPAN:
        raise ValueError(f"{what} {seq_len} is too short for the infill protocol, a span of "
                         f"{INFILL_SPAN} bytes inside each window: use {what} "
                         f"{INFILL_SPAN + 1} or more")


PROTOCOLS: dict[str, Protocol] = {p.name: p for p in (
    Protocol("all-positions", _all_positions, "every position of windows"),
    Protocol("sliding", _sliding, "the paper's one prediction per window (seq-len times "
             "slower)", stride=True),
    Protocol("memory", _memory, "segments with the model's state carried", streams=True),
    Protocol("infill", _infill, f"a span of {INFILL_SPAN} bytes in the middle of each "
             "window, read with both sides seen", check=_infill_check),
)}


def check_protocol(protocol: Protocol, seq_len: int, *, kind, what: str = "seq_len") -> Protocol:
    """The protocol, after a clear error when it cannot score windows (or segments) of
    seq_len, or when the model's kind (a ModelKind) does not declare it; `what` names the
    setting that gave seq_len."""
    if not isinstance(protocol, Protocol):
        raise TypeError(f"expected a minixl.evaluation.Protocol, got {protocol!r}: ask the "
                        "model's kind for one by name, kind.protocol('all-positions'), or "
                        "take one of the book's from minixl.evaluation.PROTOCOLS")
    if not isinstance(seq_len, int) or seq_len < 1:
        raise ValueError(f"seq_len must be a positive integer, got {seq_len!r}")
    if protocol.check is not None:
        protocol.check(seq_len, what)
    if protocol.name not in kind.protocol_names:
        raise ValueError(f"a --model {kind.name} model cannot be scored by the {protocol.name} "
                         f"protocol ({protocol.help}): its kind declares "
                         f"{', '.join(kind.protocol_names)}")
    return protocol


def evaluate(model: nn.Module, data: torch.Tensor, protocol: Protocol, *, kind, seq_len: int,
             stride: int | None = None, batch_size: int = 64,
             dtype: str | None = None) -> Evaluation:
    """Bits per byte of data [N] under a protocol (kind.protocol(name), or one of PROTOCOLS)
    that the model's kind (a ModelKind) declares.

    seq_len is the window, or the segment length for a protocol that reads streams;
    batch_size is windows per forward pass, or at most that many streams. dtype: 'fp32' or
    'bf16' (autocast); None: bf16 on CUDA, fp32 on the CPU.
    """
    p = check_protocol(protocol, seq_len, kind=kind)
    if not isinstance(batch_size, int) or batch_size < 1:
        raise ValueError(f"batch_size must be a positive integer, got {batch_size!r}")
    if stride is not None and not p.stride:
        takers = [q.name for q in PROTOCOLS.values() if q.stride]
        raise ValueError(f"a stride applies to the {' or '.join(takers)} protocol only, not "
                         f"{p.name}")
    if len(data) < 2:
        raise ValueError(f"need at least 2 bytes to score one prediction, got {len(data)}")
    was_training = model.training  # a protocol scores the model without dropout
    model.eval()
    try:
        # no graph: a state carried from segment to segment holds none, whoever wrote it
        with torch.no_grad(), autocast(next(model.parameters()).device, dtype):
            bpc, how = p.score(model, data, seq_len=seq_len, batch_size=batch_size,
                               stride=stride)
    finally:
        model.train(was_training)
    return Evaluation(bpc, len(data), p.name, how)
