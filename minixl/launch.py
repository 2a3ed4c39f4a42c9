"""The set-up of a run: a model kind, a preset and a corpus in, everything `train` needs out.

Hand-written shared machinery (not generated). `minixl train` is this plus printing; a
notebook calls it the same way::

    run = minixl.setup_run(preset="xl-base", train_settings=dict(steps=50), out="runs/try")
    result = run.train()

`plan_run` resolves a kind, a preset and overrides into configs, and `build_model`
builds the model and its objective from them, seeded once (the benchmark uses both).
`setup_run` adds the corpus, the device, the batch source and the held-out measure. This
module imports the registry, and with it every chapter's module: the chapters import only
`minixl.training.loop` (Chapter 2 trains before later chapters exist).
"""

from __future__ import annotations

from dataclasses import dataclass, fields, replace
from pathlib import Path
from typing import Callable

import torch
import torch.nn as nn

from .checkpoint import CheckpointError, load_checkpoint
from .data import Corpus, load_corpus
from .device import distributed_env, memory_capacity, resolve_dtype, training_device
from .evaluation import check_protocol, evaluate
from .kinds import ModelKind, refuse_foreign, registered, resolve_preset, with_overrides
from .options import flag
from .plugins import kind_named
from .training.loop import TrainConfig, TrainResult, train
from .training.run_folder import CHECKPOINT, UNRECORDED_DEFAULTS, RunFolder

__all__ = ["RunPlan", "plan_run", "BuiltModel", "build_model", "PreparedRun", "setup_run",
           "kept_on_resume"]


@dataclass
class BuiltModel:
    """A model ready to train: its kind and preset, the model, its objective (None: the
    next-byte loss), the objective's options, and the TrainConfig."""

    kind: ModelKind
    preset: str
    model: nn.Module
    objective: Callable | nn.Module | None
    objective_options: dict
    config: TrainConfig

    @property
    def length(self) -> int:
        """The training length (window or segment) of the model."""
        return getattr(self.model.config, self.kind.length)


@dataclass
class RunPlan:
    """What a run will be, before anything is built: the kind and preset, the model's config,
    the TrainConfig and the objective's options."""

    kind: ModelKind
    preset: str
    model_config: object
    config: TrainConfig
    objective_options: dict


def _resolved(model: str | ModelKind | None, preset: str | None) -> tuple[ModelKind, str]:
    """(kind, preset): a kind given with one of its own presets is what a caller (the command
    line) resolved already, taken as it is; a name (registered, or MODULE:NAME) or None goes
    through the registry's rules, once."""
    if isinstance(model, ModelKind) and preset in model.presets:
        return registered(model), preset
    return resolve_preset(kind_named(model) if isinstance(model, str) else model, preset)


def plan_run(model: str | ModelKind | None = None, preset: str | None = None, *,
             model_settings: dict | None = None, train_settings: dict | None = None,
             objective_options: dict | None = None) -> RunPlan:
    """The settings of `model` (a kind or its name; None: the default) at `preset` (None:
    tiny, or the one a paper-scale preset names), with config fields and TrainConfig fields
    overridden where given (None values are ignored). A run set up here decays only weight
    matrices (weight_decay_on="matrices") and uses AdamW's fused kernel (fused=True) unless
    told otherwise."""
    kind, preset = _resolved(model, preset)
    model_cfg, train_kw = kind.preset(preset)
    given = {k: v for k, v in (model_settings or {}).items() if v is not None}
    refuse_foreign(kind, given, {k: v for k, v in (objective_options or {}).items()
                                 if v is not None})
    unknown = sorted(set(train_settings or {}) - {f.name for f in fields(TrainConfig)})
    if unknown:
        raise ValueError(f"unknown training settings {', '.join(unknown)}: TrainConfig has "
                         f"{', '.join(f.name for f in fields(TrainConfig))}")
    cfg = with_overrides(TrainConfig(**{"weight_decay_on": "matrices", "fused": True,
                                        **train_kw}), **(train_settings or {}))
    return RunPlan(kind, preset, with_overrides(model_cfg, **given), cfg,
                   kind.objective_options(preset, objective_options))


def build_model(model: str | ModelKind | None = None, preset: str | None = None, *,
                model_settings: dict | None = None, train_settings: dict | None = None,
                objective_options: dict | None = None) -> BuiltModel:
    """The model and objective of plan_run(...), seeded once with the run's seed."""
    return _build(plan_run(model, preset, model_settings=model_settings,
                           train_settings=train_settings, objective_options=objective_options))


def check_memory(s: RunPlan, device: torch.device) -> None:
    """Refuse, in one line with the estimate, a run whose kind estimates that one training
    step needs more memory than `device` has (nothing is allocated yet)."""
    if s.kind.memory is None:
        return
    cfg = s.config
    world = distributed_env()[2]
    micro = max(cfg.batch_size // (world * cfg.grad_accum), 1)  # rows of one pass per process
    need = s.kind.memory(s.model_config, micro)
    have, what = memory_capacity(device)
    if have is not None and need > have:
        split = "" if micro == cfg.batch_size else (
            f" (of {cfg.batch_size} per step: {world} process(es) x {cfg.grad_accum} "
            "micro-batches)")
        raise ValueError(f"--model {s.kind.name} --preset {s.preset} at these settings needs "
                         f"about {need / 2**30:,.1f} GiB for one pass of {micro} rows{split}, "
                         f"more than {what} ({have / 2**30:,.1f} GiB on {device}); raise "
                         f"--grad-accum, lower --batch-size or {flag(s.kind.length)}, or use a "
                         "machine with more memory")


def _build(s: RunPlan) -> BuiltModel:
    """The model and objective of settings, seeded once with the run's seed."""
    torch.manual_seed(s.config.seed)  # the model's weights, then the objective's own
    net = s.kind.build(s.model_config)
    objective = s.kind.build_objective(s.model_config, s.objective_options)
    return BuiltModel(s.kind, s.preset, net, objective, s.objective_options, s.config)


def kept_on_resume(out: str | Path | None, resume: bool) -> dict:
    """The settings a resumed run keeps from its checkpoint unless told otherwise: the
    grouping of weight decay, the optimiser's kernel and the precision (a checkpoint written
    before a setting existed was trained with the value in run_folder.UNRECORDED_DEFAULTS:
    decay on everything, the unfused kernel, auto's old rule for the precision). Empty when
    there is nothing to read (the caller's defaults hold)."""
    if not resume or out is None:
        return {}
    try:
        saved = load_checkpoint(Path(out) / CHECKPOINT, for_resume=True)["train_config"]
    except CheckpointError:
        return {}  # the trainer says what is wrong with it
    return {k: {**UNRECORDED_DEFAULTS, **saved}[k] for k in ("weight_decay_on", "fused",
                                                            "dtype")}


@dataclass
class PreparedRun:
    """A run ready to start: `train()` runs it (see setup_run)."""

    built: BuiltModel
    corpus: Corpus
    source: str
    device: torch.device
    batches: Callable
    held_out: Callable[[nn.Module, int | None], float]
    meta: dict
    out: Path | None
    resume: bool = False
    overwrite: bool = False
    allow_change: tuple[str, ...] = ()
    dtype_why: str = ""  # why the run trains in its dtype (what --dtype auto picked)

    def train(self, *, progress: bool = True, ranks=None,
              peak_tflops: float | None = None) -> TrainResult:
        """Run it; ranks: the process group a caller holds open (the command line's), else
        the trainer opens one for the run. metrics.csv's mfu uses `minixl bench`'s FLOP
        count and peak_tflops (default: a GPU's known bf16 peak)."""
        b = self.built
        flops = None  # MFU's numerator, where there is a peak to divide by
        if peak_tflops is not None or self.device.type == "cuda":
            try:
                flops = b.kind.training_flops_per_token(b.model, b.objective)
            except Exception as err:  # a kind of one's own whose count fails: train anyway
                print(f"minixl train: warning: metrics.csv's mfu is left empty: counting the "
                      f"{b.kind.name} model's FLOPs failed ({type(err).__name__}: {err})")
        return train(b.model, b.config, batches=self.batches, objective=b.objective,
                     held_out=self.held_out, out=self.out, resume=self.resume,
                     overwrite=self.overwrite, allow_change=self.allow_change, meta=self.meta,
                     progress=progress, no_decay=b.kind.no_decay, ranks=ranks,
                     flops_per_token=flops, peak_tflops=peak_tflops)


def setup_run(model: str | ModelKind | None = None, preset: str | None = None, *,
              corpus: str = "pydoc", device: str = "auto", out: str | Path | None = None,
              model_settings: dict | None = None, train_settings: dict | None = None,
              objective_options: dict | None = None, resume: bool = False,
              overwrite: bool = False, allow_change: tuple[str, ...] = ()) -> PreparedRun:
    """Everything a run needs: the model and objective (build_model), the corpus (loaded
    once), the device (cuda:LOCAL_RANK under torchrun), the kind's batch source over the
    train split (on the device: batches are cut there), the held-out measure (the kind's
    first evaluation protocol on the valid split, at the training length) and the metadata a
    checkpoint keeps. Bad settings fail here, before any training."""
    train_settings = dict(train_settings or {}, device=device)
    dtype_kept = resume and train_settings.get("dtype") is None
    for k, v in kept_on_resume(out, resume).items():
        if train_settings.get(k) is None:
            train_settings[k] = v
    plan = plan_run(model, preset, model_settings=model_settings,
                    train_settings=train_settings, objective_options=objective_options)
    # A folder that refuses this start does so before a line is printed (one process; under
    # torchrun rank 0 alone checks it, in train, and tells the others)
    if out is not None and distributed_env()[2] == 1:
        RunFolder(Path(out), None, None, plan.config, {}).preflight(
            resume, overwrite, set(allow_change))
    where = training_device(plan.config.device)
    if dtype_kept:  # a checkpoint written before the setting existed: auto's old rule
        dtype, _ = resolve_dtype(plan.config.dtype, where)
        dtype_why = "kept from the checkpoint"
    else:
        dtype, dtype_why = resolve_dtype(plan.config.dtype, where, kind=plan.kind)
    plan = replace(plan, config=replace(plan.config, dtype=dtype))  # as the checkpoint keeps it
    check_memory(plan, where)  # before the model or any batch is allocated
    built = _build(plan)
    kind, cfg, length = built.kind, built.config, built.length
    protocol = check_protocol(kind.protocol(), length, what=flag(kind.length), kind=kind)
    # (found now, not after training)
    data = load_corpus(corpus)
    if len(data.valid) < length + 1:
        raise ValueError(f"the valid split of {data.name!r} has {len(data.valid):,} bytes, too "
                         f"few for one window of {length}; use more text or a smaller "
                         f"{flag(kind.length)}")
    # the train split (at most ~100 MB of bytes) goes to the device once: batches are cut there
    batches = kind.batches(data.train.to(where), cfg.batch_size, built.model.config,
                           seed=cfg.seed)

    # Windows per forward pass: the training batch, or more, up to about 4,096 bytes, which
    # a CPU reads faster in a few large passes than in many small ones (the score is the
    # same, up to float rounding). A protocol that reads streams takes the batch as the
    # number of streams, which the score depends on.
    batch = cfg.batch_size if protocol.streams else max(cfg.batch_size, 4096 // length)

    def held_out(net: nn.Module, n_bytes: int | None) -> float:
        text = data.valid if n_bytes is None else data.valid[:n_bytes]
        return evaluate(net, text, protocol, seq_len=length, batch_size=batch, kind=kind,
                        dtype=cfg.dtype).bpc

    meta = {"kind": kind.name}
    if kind.source:
        meta["kind_source"] = kind.source
    tag = kind.objective_tag(built.objective_options)
    if tag is not None:
        meta["objective"] = tag
    meta["corpus"] = {"source": corpus, "sha256": data.sha256}
    return PreparedRun(built, data, corpus, where, batches, held_out, meta,
                       None if out is None else Path(out), resume, overwrite, tuple(allow_change),
                       dtype_why)
