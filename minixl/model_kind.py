"""What a model kind declares: `ModelKind`, `Preset` and `Objective`.

Hand-written glue (not generated). A `ModelKind` holds all that the trainer, the evaluation
protocols, the benchmark and the command line need to know about a model, so that none of
them ever asks which model it holds:

- its config class and builder, and the config field of its length;
- how its batches come: random windows, or ordered streams whose state the trainer carries
  (for every config, or for those a function of the config picks);
- its objective (the trainer's next-byte loss unless it says otherwise) and that
  objective's command-line options;
- its presets (`Preset`: model sizes, training settings, objective options and a line of
  help; a paper-scale preset picks its model);
- its evaluation protocols (the default first) and the config fields `minixl eval` may
  change for the memory protocol;
- the parameters that weight decay leaves alone (position tables and learned offsets), its
  training FLOPs per token for the benchmark, and a line of help for each config field;
- how it enters the bench of every mechanism (`BenchArm`s: `minixl.planner`).

The layers point one way: `minixl.evaluation` (protocols) <- this module <- each chapter's
kind, declared in its home (`minixl.xlnet.kind`), not registered; `minixl.kinds` (the
registry: KINDS, register, kind_of, presets; the public names students import) names them
and imports one on first use <- `minixl.plugins` (``--model MODULE:NAME``). Nothing here knows which kinds exist. Every model
meets the model protocol, ``logits, state = model.step(tokens, state)``, and keeps its config
as ``model.config`` (a dataclass).
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields, replace
from typing import Callable

import torch
import torch.nn as nn

from .data import OrderedStreams, RandomWindows
from .evaluation import PROTOCOLS
from .options import Option, flag

__all__ = ["Preset", "Objective", "BenchArm", "ModelKind", "FLOP_POLICIES", "check_flop_policy",
           "with_overrides", "not_for", "TINY_TRAIN", "SMALL_TRAIN", "count_weights",
           "window_reach", "window_kernel"]


# How a kind's FLOPs are counted. 'kernel': what an eager attention kernel computes, the
# masked half of a causal window included (the PaLM convention; the throughput benchmark's
# count, and the bench's until it planned causally; a fused causal kernel skips most masked
# blocks, so for it this count is high). 'causal': what a causal model needs, the bench's
# default (minixl.planner.BENCH_FLOP_POLICY), each query charged only the keys it may read:
# on average (T + 1) / 2 of a window of T, M + (T + 1) / 2 with a memory of M (Shaw's
# relative terms: the K + 1 offsets 0 to K back, each computed for every query). The tree's
# count already charges only its causal edges, and XLNet's masks follow factorisation orders,
# not a causal half (its count has no causal variant yet): one count for both.
FLOP_POLICIES = ("kernel", "causal")


def check_flop_policy(policy: str) -> None:
    """A ValueError naming the policies unless `policy` is one of FLOP_POLICIES."""
    if policy not in FLOP_POLICIES:
        raise ValueError(f"unknown FLOP policy {policy!r}: expected one of "
                         f"{', '.join(FLOP_POLICIES)}")


@dataclass(frozen=True)
class Preset:
    """A named setting of a model kind: config fields of the model, TrainConfig fields, the
    objective's options, and a line of help. A paper-scale preset (paper=True) names its
    model: `--preset NAME` alone picks it."""

    model: dict
    train: dict
    objective: dict = field(default_factory=dict)
    help: str = ""
    paper: bool = False


@dataclass(frozen=True)
class Objective:
    """How a kind trains, if not on the trainer's next-byte loss: build(model_config,
    **options) returns the objective (a function, or an nn.Module with weights of its own),
    `options` are its command-line options, and tag(options) is the line a checkpoint keeps
    so that a resumed run is refused another objective."""

    build: Callable
    options: tuple[Option, ...] = ()
    tag: Callable[[dict], str] | None = None
    # training FLOPs per token that the objective adds to the model's own count, from (model,
    # the built objective); None: nothing
    flops: Callable[[nn.Module, object], float] | None = None


@dataclass(frozen=True)
class BenchArm:
    """One way a kind enters the bench of every mechanism (`minixl.planner`): config fields
    and objective options on top of its bench preset (`preset`, default 'tiny' where the kind
    has one, else its first), the config fields that keep their ratio to the bench's length
    (a memory as long as the segment, the bytes predicted per window: the ratio of the arm's
    value where `model` sets one, else the preset's), a line of help, and whether it is a
    control (see the field)."""

    model: dict = field(default_factory=dict)
    objective: dict = field(default_factory=dict)
    per_length: tuple[str, ...] = ()
    preset: str | None = None
    help: str = ""
    # a control: it isolates one change against another arm for the quality bench (XL with no
    # memory); the cost-against-length sweep leaves it out unless named, its context not
    # being a mechanism's answer to a long text
    control: bool = False


# Training settings that most kinds' presets share. tiny: a few CPU minutes; small: a long
# CPU run or a short GPU one (the papers' shapes have presets of their own).
TINY_TRAIN = dict(steps=600, batch_size=32, lr=2e-3, eval_every=100, ckpt_every=200)
SMALL_TRAIN = dict(steps=3000, batch_size=32, lr=1e-3, eval_every=250, ckpt_every=500)

# Help for config fields that most models share; a kind's field_help adds or overrides.
COMMON_FIELD_HELP = {
    "n_layer": "layers", "d_model": "the model width", "n_head": "attention heads",
    "d_inner": "the feed-forward width", "dropout": "dropout", "dropatt": "dropout on "
    "attention weights", "layer_norm_eps": "the layer norms' epsilon",
}


@dataclass(frozen=True)
class ModelKind:
    """Everything minixl needs to know about one model (see the module docstring)."""

    name: str
    summary: str
    config: type  # a dataclass; every field with a default is a command-line flag
    build: Callable[[object], nn.Module]
    length: str  # the config field that holds the training length
    presets: dict[str, Preset]
    # False: random windows, no state; True: ordered streams, state carried; or a function of
    # the model's config that says which (XLNet reads streams only when it has a memory)
    streams: bool | Callable[[object], bool] = False
    # evaluation protocols, the default first: names of the book's (minixl.evaluation.PROTOCOLS)
    # or Protocol objects of the kind's own
    protocols: tuple = ("all-positions", "sliding")
    objective: Objective | None = None  # None: the trainer's next-byte loss at every position
    no_decay: tuple[str, ...] = ()  # parameter names (the last part) weight decay leaves alone
    flops: Callable[[nn.Module], float] | None = None  # training FLOPs per token (None: 6N)
    # the same count under the causal policy (FLOP_POLICIES): what a causal model needs, not
    # what the kernel computes; None: the same as `flops` (a kind with no masked work to skip)
    causal_flops: Callable[[nn.Module], float] | None = None
    # bytes one forward and backward pass needs, from (model config, rows in the pass), known
    # before anything is built: a run that would need more than its device has is refused
    # with the estimate (minixl.launch.check_memory). None: not estimated (nothing refused)
    memory: Callable[[object, int], float] | None = None
    eval_overrides: tuple[str, ...] = ()  # config fields `minixl eval` may change for memory
    field_help: dict[str, str] = field(default_factory=dict)
    source: str | None = None  # "MODULE:NAME" for a kind loaded from outside minixl
    causal: bool = True  # no position reads a later byte (checked by minixl.check.kind)
    # a batch source of its own, (data, batch_size, length, *, seed, config) -> (step -> (x,
    # y, reset_state)), in place of the one `streams` picks; config is the model's config, and a
    # source that returns None for a config leaves the choice to `streams`
    batch_source: Callable | None = None
    # how it enters the bench of every mechanism, {arm name: BenchArm}; empty: one arm named
    # after the kind, with its defaults
    bench: dict[str, BenchArm] = field(default_factory=dict)
    # (how far back from a byte its prediction can read, at most, and why), from a config: a
    # window, a memory, a tree; the bench marks the distances past it before training
    # (minixl.reach). None: not stated
    reach: Callable[[object], tuple[int, str]] | None = None
    # measured to train faster under bf16 autocast on a CPU with fast bf16 (AMX, AVX512-BF16),
    # at no worse bpc: `minixl train --dtype auto` (the default) picks bf16 there
    cpu_bf16: bool = False
    # what runs its attention and what a call of one byte reuses, in a line, from a config
    # (an eager kernel that writes its weights out or a fused one; a memory or cache carried,
    # or the window read again): named in the cost sweep's rows. None: not stated
    kernel: Callable[[object], str] | None = None

    def __post_init__(self):
        names = {f.name for f in fields(self.config)}
        wrong = [self.length] if self.length not in names else []
        wrong += [k for p in self.presets.values() for k in p.model if k not in names]
        wrong += [k for k in self.eval_overrides if k not in names]
        if wrong:
            raise ValueError(f"model kind {self.name!r}: {', '.join(sorted(set(wrong)))} "
                             f"{'is not a field' if len(wrong) == 1 else 'are not fields'} of "
                             f"{self.config.__name__}")
        options = {o.name for o in self.objective.options} if self.objective else set()
        extra = [k for p in self.presets.values() for k in p.objective if k not in options]
        if extra:
            raise ValueError(f"model kind {self.name!r}: a preset sets objective options "
                             f"{', '.join(sorted(set(extra)))}, which its objective does not take")
        if not isinstance(self.streams, bool) and not callable(self.streams):
            raise ValueError(f"model kind {self.name!r}: streams must be True, False or a "
                             f"function of the model's config, got {self.streams!r}")
        if not self.protocols or not self.presets:
            raise ValueError(f"model kind {self.name!r} needs at least one evaluation protocol "
                             "and one preset")
        unknown = [p for p in self.protocols if isinstance(p, str) and p not in PROTOCOLS]
        if unknown:
            raise ValueError(f"model kind {self.name!r}: unknown evaluation protocol "
                             f"{', '.join(map(repr, unknown))}: name one of "
                             f"{', '.join(PROTOCOLS)}, or give a minixl.evaluation.Protocol")
        if len(set(self.protocol_names)) < len(self.protocols):
            raise ValueError(f"model kind {self.name!r} names a protocol twice")
        for arm_name, arm in self.bench.items():
            wrong = [k for k in (*arm.model, *arm.per_length) if k not in names]
            wrong += [k for k in arm.objective if k not in options]
            if arm.preset is not None and arm.preset not in self.presets:
                wrong.append(f"preset {arm.preset!r}")
            if wrong:
                raise ValueError(f"model kind {self.name!r}, bench arm {arm_name!r}: "
                                 f"{', '.join(sorted(set(wrong)))} is not a field, objective "
                                 f"option or preset of this kind")

    # ---- evaluation
    @property
    def protocol_names(self) -> tuple[str, ...]:
        return tuple(p if isinstance(p, str) else p.name for p in self.protocols)

    def protocol_objects(self) -> tuple:
        """Its protocols as minixl.evaluation.Protocol objects, the default first."""
        return tuple(PROTOCOLS[p] if isinstance(p, str) else p for p in self.protocols)

    def protocol(self, name: str | None = None):
        """The Protocol called `name` (default: its first), or a clear error."""
        found = {p.name: p for p in self.protocol_objects()}
        if name is None:
            return next(iter(found.values()))
        if name not in found:
            raise ValueError(f"--protocol {name} does not apply to a --model {self.name} "
                             f"checkpoint; use {' or '.join(found)}")
        return found[name]

    # ---- presets
    def preset(self, name: str) -> tuple[object, dict]:
        """(model config, TrainConfig settings) of a named preset."""
        if name not in self.presets:
            raise ValueError(f"unknown preset {name!r} for --model {self.name}: expected one of "
                             f"{', '.join(self.presets)}")
        p = self.presets[name]
        return self.config(**p.model), dict(p.train)

    @property
    def scale_preset(self) -> str:
        """The preset the benchmark reads by default: the paper-scale one, else base, else
        the last."""
        papers = [n for n, p in self.presets.items() if p.paper]
        return papers[0] if papers else "base" if "base" in self.presets else list(self.presets)[-1]

    # ---- the objective
    def objective_options(self, preset: str, given: dict | None = None) -> dict:
        """The objective's options: its defaults, then the preset's, then those given (a flag
        this kind's objective does not take is an error; `minixl.kinds.refuse_foreign`
        also names the registered kinds that take it)."""
        given = {k: v for k, v in (given or {}).items() if v is not None}
        own = self.objective.options if self.objective else ()
        foreign = [k for k in given if k not in {o.name for o in own}]
        if foreign:
            takes = ", ".join(flag(o.name) for o in own) or "no options"
            raise ValueError(f"{', '.join(map(flag, foreign))}: not an option of --model "
                             f"{self.name}'s objective, which takes {takes}")
        preset_options = self.presets[preset].objective if preset in self.presets else {}
        return {o.name: o.default for o in own} | preset_options | given

    def build_objective(self, model_cfg, options: dict):
        """The objective to train with (None: the trainer's next-byte loss)."""
        return self.objective.build(model_cfg, **options) if self.objective else None

    def objective_tag(self, options: dict) -> str | None:
        """What a checkpoint records of the objective (None: nothing to record)."""
        return self.objective.tag(options) if self.objective and self.objective.tag else None

    # ---- data and cost
    def reads_streams(self, model_cfg) -> bool:
        """Whether a model of this config trains on ordered streams, its state carried."""
        return bool(self.streams(model_cfg) if callable(self.streams) else self.streams)

    def batches(self, data: torch.Tensor, batch_size: int, model_cfg, *, seed: int):
        """The batch source of this kind: step -> (x, y, reset_state)."""
        length = getattr(model_cfg, self.length)
        if self.batch_source is not None:
            own = self.batch_source(data, batch_size, length, seed=seed, config=model_cfg)
            if own is not None:
                return own
        source = _streams if self.reads_streams(model_cfg) else RandomWindows
        return source(data, batch_size, length, seed=seed)

    def flops_per_token(self, model: nn.Module, policy: str = "kernel") -> float:
        """Training FLOPs per token under `policy` (FLOP_POLICIES; 'kernel' by default, what
        the implementation computes, as the throughput benchmark counts): the kind's own count
        (`flops`, or `causal_flops` under 'causal' where the kind has one), else 6 per weight
        (2 forward, 4 backward), the usual estimate that leaves attention out."""
        check_flop_policy(policy)
        if policy == "causal" and self.causal_flops is not None:
            return self.causal_flops(model)
        if self.flops is not None:
            return self.flops(model)
        return 6.0 * sum(p.numel() for p in model.parameters())

    def training_flops_per_token(self, model: nn.Module, objective=None,
                                 policy: str = "kernel") -> float:
        """flops_per_token plus what the objective it trains with adds (its Objective.flops,
        the same under either policy: it masks nothing)."""
        extra = 0.0
        if objective is not None and self.objective and self.objective.flops:
            extra = self.objective.flops(model, objective)
        return self.flops_per_token(model, policy) + extra

    def flops_note(self, policy: str = "kernel") -> str:
        """What the FLOP count under `policy` counts, in a line: the first sentence of its
        docstring (`causal_flops`'s under 'causal', where the kind has one)."""
        count = self.causal_flops if policy == "causal" and self.causal_flops else self.flops
        doc = (count.__doc__ or "").strip() if count else ""
        if not doc:
            return "6 per weight, attention left out" if count is None else "its own count"
        first = " ".join(doc.split()).split(". ")[0].rstrip(".")
        return first.removeprefix("Training FLOPs per token: ")

    # ---- the bench of every mechanism
    @property
    def bench_arms(self) -> dict[str, BenchArm]:
        """Its arms in the bench: those it declares, else one named after it."""
        return dict(self.bench) or {self.name: BenchArm(help=self.summary)}

    def bench_preset(self, arm: BenchArm) -> str:
        """The preset an arm starts from: its own, else 'tiny', else the first."""
        return arm.preset or ("tiny" if "tiny" in self.presets else next(iter(self.presets)))

    def kernel_note(self, model_cfg) -> str:
        """What runs a model of this config (`kernel`), or 'not stated by its kind'."""
        return self.kernel(model_cfg) if self.kernel is not None else "not stated by its kind"

    def help_for(self, field_name: str) -> str:
        return self.field_help.get(field_name, COMMON_FIELD_HELP.get(field_name, ""))


def count_weights(model: nn.Module) -> int:
    """The number of weights of a model (every parameter's elements)."""
    return sum(p.numel() for p in model.parameters())


def window_reach(config) -> tuple[int, str]:
    """The reach of a model that reads a window (config.block_size): a byte is predicted from
    at most the window's worth of bytes before it."""
    return config.block_size, f"a window of {config.block_size} bytes"


def window_kernel(what: str):
    """A `ModelKind.kernel` for a model that reads a window: `what` runs its attention, and a
    call of one byte reads the window's earlier bytes again (no key/value cache)."""
    def kernel(config) -> str:
        return f"{what}; a one-byte call reads its window again (no key/value cache)"
    return kernel


def _streams(data, batch_size: int, length: int, *, seed: int):
    """Ordered streams (their order is the text's: the seed has nothing to choose)."""
    return OrderedStreams(data, batch_size, length)


def not_for(names: list[str], takers, kind: str) -> str:
    """The message for settings that a kind does not have: which kinds take them."""
    return (f"{', '.join(map(flag, names))} appl{'ies' if len(names) == 1 else 'y'} to --model "
            f"{' or '.join(sorted(set(takers))) or '(none)'}, not --model {kind}")


def with_overrides(cfg, **overrides):
    """A copy of a dataclass config with the non-None overrides applied (validated again)."""
    names = {f.name for f in fields(cfg)}
    return replace(cfg, **{k: v for k, v in overrides.items() if v is not None and k in names})
