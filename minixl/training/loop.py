"""The training loop: Chapter 1's loop, with what a long run needs around it.

Hand-written shared machinery (not generated). Chapter 1 writes this loop out by hand;
Chapters 2 to 6 and `minixl train` call `train`. What it needs of a model is the protocol
every minixl model meets, ``logits, state = model.step(tokens, state)``, and of the data a
batch source whose ``batches(step)`` returns the same batch for the same step
(`minixl.data.RandomWindows`, `OrderedStreams`). An objective turns a batch into losses; the
default is the next-byte loss at every position.

Each feature of a long run is a few lines here and lives in a file of its own that a reader
can skip: the optimiser's weight-decay groups (`optim.py`), the run folder with its
checkpoints (`run_folder.py`), the loss meter, metrics.csv and its plot (`metrics.py`),
stopping on Ctrl-C or SIGTERM (`signals.py`), several processes under torchrun (`distributed.py`) and a model state of any
shape (`state.py`). With an output folder a run copes with being stopped: SIGINT or SIGTERM
ends it after a whole step with a checkpoint of that step, `resume=True` continues exactly
(the same batches, dropout masks and memory as a run never stopped), and a loss or gradient
norm that is not finite raises `TrainingDiverged` with the last good checkpoint kept.
"""

from __future__ import annotations

import contextlib
import math
import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Callable, Collection

import torch
import torch.nn as nn
import torch.nn.functional as F

from ..char_transformer import lr_at
from ..checkpoint import CheckpointError
from ..data import step_seed
from ..device import DTYPES, autocast, distributed_env, peak_tflops, resolve_dtype
from . import state as states
from .distributed import ProcessGroup, process_group, wrap_ddp
from .optim import DECAY_ON, make_optimizer
from .metrics import LossMeter, TrainingDiverged
from .run_folder import CHECKPOINT, RunFolder, SaveFailed, restore
from .signals import StopNow, Stopper, TrainingInterrupted

__all__ = ["TrainConfig", "TrainResult", "next_byte_objective", "ModelWithLoss", "compile_run",
           "train_step", "train"]


@dataclass
class TrainConfig:
    """How to train. `steps` is the run's total (it sets the learning-rate schedule)."""

    steps: int = 600
    batch_size: int = 32  # sequences per optimiser step, over all processes and micro-batches
    grad_accum: int = 1  # micro-batches per step, each batch_size / grad_accum rows
    lr: float = 2e-3
    warmup: int = 30
    min_lr_frac: float = 0.1
    weight_decay: float = 0.01
    weight_decay_on: str = "all"  # "all" (Chapter 1's loop) or "matrices" (see optim.py)
    grad_clip: float = 1.0  # 0 = no clipping
    seed: int = 0
    log_every: int = 10
    eval_every: int = 100
    eval_bytes: int | None = 32768  # held-out bytes scored every eval_every steps (None = all;
    # after the last step, always all)
    ckpt_every: int = 200
    device: str = "auto"
    compile: bool = False
    fused: bool = False  # AdamW's fused kernel on the CPU too (on CUDA always): faster, but it
    # rounds otherwise than Chapter 1's loop, which False reproduces bit for bit
    dtype: str = "auto"  # fp32; bf16 (autocast: matmuls in bf16; weights, optimiser state and
    # checkpoints fp32); auto: bf16 on a GPU that has it, fp32 on a CPU (`minixl train`
    # picks bf16 on a CPU with fast bf16 for a model kind measured to gain from it)

    def __post_init__(self):
        for name in ("steps", "batch_size", "grad_accum", "log_every", "eval_every",
                     "ckpt_every"):
            value = getattr(self, name)
            if not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be a positive integer, got {value!r}")
        for name in ("lr", "min_lr_frac", "weight_decay", "grad_clip"):
            if not math.isfinite(getattr(self, name)):
                raise ValueError(f"{name} must be a finite number, got {getattr(self, name)}")
        if self.lr <= 0 or self.weight_decay < 0 or self.grad_clip < 0:
            raise ValueError(f"need lr > 0, weight_decay >= 0 and grad_clip >= 0, got "
                             f"{self.lr}, {self.weight_decay} and {self.grad_clip}")
        if self.warmup < 0 or not 0.0 <= self.min_lr_frac <= 1.0:
            raise ValueError(f"need warmup >= 0 and 0 <= min_lr_frac <= 1, got {self.warmup} "
                             f"and {self.min_lr_frac}")
        if self.eval_bytes is not None and self.eval_bytes < 2:
            raise ValueError(f"eval_bytes must be at least 2 (or None for all), got "
                             f"{self.eval_bytes}")
        if self.batch_size % self.grad_accum:
            raise ValueError(f"batch_size {self.batch_size} does not split into grad_accum "
                             f"{self.grad_accum} equal micro-batches: use a batch size that is "
                             f"a multiple of {self.grad_accum}")
        if self.dtype not in DTYPES:
            raise ValueError(f"dtype must be one of {', '.join(DTYPES)}, got {self.dtype!r}")
        if self.weight_decay_on not in DECAY_ON:
            raise ValueError(f"weight_decay_on must be one of {', '.join(DECAY_ON)}, got "
                             f"{self.weight_decay_on!r}")

    def lr_at(self, step: int) -> float:
        """The learning rate of optimiser step `step` (Chapter 1's schedule)."""
        return lr_at(step, self.steps, lr=self.lr, warmup=self.warmup,
                     min_lr_frac=self.min_lr_frac)


@dataclass
class TrainResult:
    model: nn.Module
    steps: int
    valid_bpc: float | None
    history: list[dict] = field(repr=False)  # one row per logged step, as in metrics.csv
    seconds: float
    device: str
    out: Path | None


def next_byte_objective(model: nn.Module, x: torch.Tensor, y: torch.Tensor, state=None,
                        progress: float = 0.0):
    """The default objective: next-byte cross-entropy (nats) at every position, via step."""
    logits, state = model.step(x, state)  # (B, T, V)
    return {"loss": F.cross_entropy(logits.float().flatten(0, 1), y.flatten())}, state


class ModelWithLoss(nn.Module):
    """The model and the objective's own weights as one module whose forward is the loss.

    DistributedDataParallel wraps this: its forward builds the whole graph, so the backward
    all-reduces the gradients of both (in buckets, while the backward still runs).
    """

    def __init__(self, model: nn.Module, objective: Callable | None = None):
        super().__init__()
        objective = next_byte_objective if objective is None else objective
        # the objective's own weights (an empty module for a plain function)
        weights = objective if isinstance(objective, nn.Module) else nn.Module()
        self.model, self.objective_weights = model, weights
        self.__dict__["objective"] = objective  # may be the weights' module: not registered twice

    def forward(self, x, y, state, progress: float):
        return self.objective(self.model, x, y, state, progress)


def compile_run(model: nn.Module, objective: Callable | None = None) -> None:
    """torch.compile the model in place (its state_dict keys stay plain) and every part of an
    nn.Module objective that offers `compile_losses()` (Chapter 2's stacked losses do)."""
    model.compile()
    if isinstance(objective, nn.Module):
        for part in objective.modules():
            if callable(getattr(part, "compile_losses", None)):
                part.compile_losses()


def seed_rng(seed: int, device: torch.device) -> None:
    """Seed the generator that draws dropout masks (and an objective's random choices) on
    `device`: the CPU's alone on the CPU (torch.manual_seed would also seed every other
    backend, 100 times slower), with CUDA's on CUDA."""
    torch.default_generator.manual_seed(seed)
    if device.type == "cuda":
        torch.cuda.manual_seed(seed)


def train_step(net: nn.Module, opt: torch.optim.Optimizer, x: torch.Tensor, y: torch.Tensor,
               state=None, *, micro: int | None = None, seeds: list[int] | None = None,
               progress: float = 0.0, grad_clip: float = 0.0,
               device: torch.device = torch.device("cpu"), params: list | None = None,
               dtype: str | None = None):
    """One optimiser step on this process's rows x, y [b, T], in micro-batches of `micro`
    rows (default: all; seeds[i] seeds micro-batch i's dropout). Each micro-batch's loss is
    scaled by 1/n so that the gradients add up to those of the mean loss over the b rows; a
    state is split into its rows and put back together. The gradient norm is clipped over
    `params` (default: net's trainable parameters); dtype 'bf16' runs the forward under bf16
    autocast, 'fp32' without (None: bf16 on CUDA, fp32 on a CPU). The new state is detached: the next
    step's backward stops at it (truncated backpropagation through time), so a model need
    not detach its own. Returns (mean losses, new state, gradient norm), all on the device:
    nothing here waits for it."""
    micro = x.size(0) if micro is None else micro
    n = x.size(0) // micro
    opt.zero_grad(set_to_none=True)
    totals, new_states = {}, []
    for i in range(n):
        rows = slice(i * micro, (i + 1) * micro)
        if seeds is not None:
            seed_rng(seeds[i], device)
        last = i == n - 1  # DDP all-reduces in the last micro-batch's backward only
        with net.no_sync() if hasattr(net, "no_sync") and not last else contextlib.nullcontext():
            with autocast(device, dtype):
                parts, new = net(x[rows], y[rows],
                                 states.rows(state, rows) if n > 1 else state, progress)
            (parts["loss"] / n).backward()
        for k, v in parts.items():
            totals[k] = totals.get(k, 0.0) + v.detach() / n
        if new is not None:  # carried to the next step, whose backward stops at it
            new = states.carried(new, x[rows].size(0), where="the model's step()")
        new_states.append(new)
    params = [p for p in net.parameters() if p.requires_grad] if params is None else params
    norm = torch.nn.utils.clip_grad_norm_(params, grad_clip if grad_clip > 0 else math.inf)
    opt.step()
    return totals, states.cat_rows(new_states), norm


def train(model: nn.Module, cfg: TrainConfig, *, batches: Callable,
          objective: Callable | None = None, held_out: Callable | None = None,
          out: str | Path | None = None, resume: bool = False, overwrite: bool = False,
          allow_change: tuple[str, ...] = (), meta: dict | None = None, progress: bool = True,
          no_decay: Collection[str] = (), ranks: ProcessGroup | None = None,
          flops_per_token: float | None = None, peak_tflops: float | None = None) -> TrainResult:
    """Train `model` for cfg.steps optimiser steps on batches(step); see the module docstring.

    objective(model, x, y, state, progress) -> (losses dict with "loss", new state); an
    nn.Module objective trains (and checkpoints) its own weights too. held_out(model, n_bytes)
    -> bpc is run every cfg.eval_every steps on cfg.eval_bytes bytes and after the last step
    on all of them (n_bytes None), logged with that step and returned as valid_bpc; in a
    distributed run every process runs it (on the same weights) and rank 0 reports it.
    no_decay: parameter names that weight_decay_on="matrices" leaves alone (a model kind's).
    ranks: the process group, when the caller holds one open (`minixl train` does, for the
    whole command); else the run opens and closes its own. flops_per_token (the model's
    training FLOPs, as `minixl bench` counts them) adds an mfu column to metrics.csv, of
    peak_tflops (default: the GPU's bf16 peak, where minixl knows it; none on a CPU).
    """
    world = distributed_env()[2]
    if cfg.batch_size % (world * cfg.grad_accum):
        raise ValueError(f"batch_size {cfg.batch_size} does not split into {world} processes x "
                         f"{cfg.grad_accum} micro-batches (grad_accum): use a batch size that "
                         f"is a multiple of {world * cfg.grad_accum}")
    # one process, or one of torchrun's; `cleanup` drops the run folder's lock however
    # _train ends
    with contextlib.ExitStack() as cleanup:
        if ranks is None:
            ranks = cleanup.enter_context(process_group(cfg.device))
        return _train(ranks, model, cfg, batches=batches, objective=objective,
                      held_out=held_out, out=out, resume=resume, overwrite=overwrite,
                      allow_change=allow_change, meta=meta or {}, progress=progress,
                      no_decay=no_decay, cleanup=cleanup, flops=flops_per_token,
                      peak=peak_tflops)


def _train(ranks, model, cfg, *, batches, objective, held_out, out, resume, overwrite,
           allow_change, meta, progress, no_decay, cleanup, flops, peak) -> TrainResult:
    device = ranks.device
    net = ModelWithLoss(model, objective).to(device)
    weights = net.objective_weights
    run, plan, cfg = _open_run(ranks, out, model, weights, cfg, meta, resume, overwrite,
                               allow_change, cleanup)
    cfg = _run_dtype(cfg, plan, device, say=ranks.rank == 0)
    if run is not None:
        run.cfg = cfg  # its checkpoints record the dtype the run trains in
    dtype = cfg.dtype
    opt = make_optimizer([model, weights], cfg, device, no_decay=no_decay)
    start, state = 0, None
    if plan is not None and plan["ckpt"] is not None:
        start, state = restore(plan["ckpt"], plan["changed"], model, weights, opt, cfg, device,
                               Path(out) / CHECKPOINT, say=ranks.rank == 0, no_decay=no_decay)
    b = cfg.batch_size // ranks.world  # this process's rows of each batch (and of the state)
    mine, micro = slice(ranks.rank * b, (ranks.rank + 1) * b), b // cfg.grad_accum
    state = states.to_device(states.rows(state, mine), device) if state is not None else None
    rec = _AgreedRecords(run, out is not None, ranks, model, cfg, opt, start)
    if out is not None and start:
        rec.agreed(lambda: run.trim(start))  # metrics rows after the checkpoint are redone
    if cfg.compile:
        compile_run(model, objective)
    if ranks.on and start < cfg.steps:
        x, y, reset_state = batches(start)
        net = wrap_ddp(net, x[mine][:micro].to(device), y[mine][:micro].to(device),
                       None if reset_state or state is None
                       else states.rows(state, slice(0, micro)),
                       device)
    params = [p for p in net.parameters() if p.requires_grad]
    if peak is None and device.type == "cuda":
        peak = peak_tflops(torch.cuda.get_device_name(device))
    # the rows' tokens/s is the whole batch's, over every process: MFU is per device
    log, bar = rec.begin(progress, flops, peak * ranks.world if peak else None)

    done, valid = start, None
    with Stopper(enabled=out is not None, distributed=ranks.on, quiet=ranks.rank != 0) as stopper:
        try:
            for step in bar:
                x, y, reset_state = batches(step)  # the whole batch; this process: its rows
                for group in opt.param_groups:
                    group["lr"] = cfg.lr_at(step)
                # micro-batch k of the step's batch (k = 0 in a one-process run without
                # accumulation, Chapter 1's loop) draws its dropout masks from its own seed
                first = ranks.rank * cfg.grad_accum
                seeds = [step_seed(cfg.seed, step, stream=1 + 256 * k)
                         for k in range(first, first + cfg.grad_accum)]
                parts, state, norm = train_step(
                    net, opt, x[mine].to(device), y[mine].to(device),
                    None if reset_state else state,
                    micro=micro, seeds=seeds, progress=step / cfg.steps,
                    grad_clip=cfg.grad_clip, device=device, params=params, dtype=dtype)
                done = step + 1
                stopper.settle(ranks)  # distributed: every process stops after the same step
                log.add(step, parts, norm, x.numel())
                valid, last = None, done == cfg.steps
                if held_out is not None and (done % cfg.eval_every == 0 or last):
                    with stopper.interruptible(), log.paused(device):  # last: the whole split
                        valid = held_out(model, None if last else cfg.eval_bytes)
                if (done % cfg.log_every == 0 or valid is not None or done == cfg.steps
                        or stopper.stop):  # a stopped run logs its last, shorter window
                    rec.row(done, valid, cfg.lr_at(step))
                if out is not None and (done % cfg.ckpt_every == 0 or done == cfg.steps
                                        or stopper.stop):
                    with log.paused(device):
                        rec.save(done, state)
                if stopper.stop:
                    stopper.saved = True
                    ranks.barrier()  # no process ends before rank 0 has saved
                    raise TrainingInterrupted(stopper.stop, done, Path(out) / CHECKPOINT)
        except StopNow:  # a signal during held-out evaluation (one process only): the saved
            if log.n:  # step is consistent; the step's metrics row, without the evaluation
                rec.row(done, None, cfg.lr_at(done - 1))
            if run.saved != done:
                rec.save(done, state)
            stopper.saved = True
            raise TrainingInterrupted(stopper.signum, done, Path(out) / CHECKPOINT) from None
        finally:
            bar.close()
            if run:
                run.close()
                if stopper.saved:  # stopped: the plot shows the run up to its checkpoint
                    run.plot()
    if run:
        run.plot()
    ranks.barrier()
    return TrainResult(model, cfg.steps, valid, rec.history, time.perf_counter() - rec.t0,
                       str(device), run.out if run else Path(out) if out is not None else None)


def _run_dtype(cfg: TrainConfig, plan, device: torch.device, *, say: bool) -> TrainConfig:
    """cfg with its dtype resolved to fp32 or bf16: 'auto' on resume keeps the checkpoint's
    (one written before the setting existed trained by the old rule, auto's: bf16 on CUDA,
    fp32 on a CPU), else resolves as `resolve_dtype` does without a model kind; an explicit
    dtype that differs from the checkpoint's is taken, and said."""
    ckpt = plan["ckpt"] if plan is not None else None
    saved = ckpt["train_config"].get("dtype") if ckpt is not None else None
    if cfg.dtype == "auto" and saved in ("fp32", "bf16"):
        return replace(cfg, dtype=saved)
    dtype, _ = resolve_dtype(cfg.dtype, device)
    if say and saved in ("fp32", "bf16") and saved != dtype:
        print(f"resuming with dtype changed: {saved!r} -> {dtype!r} (the run no longer "
              "continues bit for bit)")
    return replace(cfg, dtype=dtype)


def _open_run(ranks, out, model, own, cfg, meta, resume, overwrite, allow_change, cleanup):
    """(the run folder (rank 0's; None elsewhere or without `out`), the plan every process
    restores from, the settings): rank 0 checks the folder and a checkpoint to resume, and
    every process learns the plan (and takes rank 0's settings, which the check saw)."""
    lead = ranks.rank == 0
    run = RunFolder(Path(out), model, own, cfg, meta) if out is not None and lead else None
    plan = None
    if run:
        cleanup.callback(run.unlock)
        try:
            plan = run.begin(resume, overwrite, set(allow_change))
        except (ValueError, CheckpointError) as err:
            plan = err
    if out is not None:
        plan = ranks.broadcast(plan)
    if isinstance(plan, Exception):
        raise plan
    if plan is not None and not lead:
        cfg = replace(TrainConfig(**plan["cfg"]), device=cfg.device)
    return run, plan, cfg


class _AgreedRecords:
    """What a run writes, agreed by every process: rank 0 writes the metrics rows and the
    checkpoints, and every process stops if a write failed (or the run diverged)."""

    def __init__(self, run, writes: bool, ranks, model, cfg, opt, start: int):
        self.run, self.writes, self.ranks, self.model, self.cfg = run, writes, ranks, model, cfg
        self.start, self.history = start, []
        if run:
            run.opt, run.saved = opt, start

    def begin(self, show: bool, flops: float | None = None, peak: float | None = None):
        """Start the clock: (the window of losses to log, the steps to run as a progress bar,
        rank 0's if `show`); with flops per token and a peak, the rows carry MFU."""
        self.log = LossMeter(self.cfg.lr, self.ranks, flops_per_token=flops, peak_tflops=peak)
        self.t0 = time.perf_counter()
        self._bar = _progress_bar(show and self.ranks.rank == 0, self.start, self.cfg.steps,
                                  self.run)
        return self.log, self._bar

    def agreed(self, write: Callable) -> None:
        """Rank 0 writes the run folder; every process stops if that failed."""
        failed = None
        if self.run:
            try:
                write()
            except SaveFailed as err:
                failed = err
        failed = self.ranks.broadcast(failed)
        if failed is not None:
            raise failed

    def save(self, done: int, state) -> None:  # every process: the checks and the gather agree
        run = self.run
        self.log.check_finite(run)
        whole = self.ranks.gather_rows(state)
        if not all(torch.isfinite(p).all() for p in self.model.parameters()):
            raise TrainingDiverged(done, self.cfg.lr, f"{run.ckpt} (step {run.saved})"
                                   if run and run.saved else "none")
        self.agreed(lambda: run.save(done, whole))

    def row(self, done: int, valid, lr: float) -> None:
        row = self.log.row(done, valid, lr=lr, t0=self.t0, run=self.run)
        self.history.append(row)
        if self.writes:
            self.agreed(lambda: self.run.write(row))
        self._bar.set_postfix({k: f"{row[k]:.3f}" for k in ("train_bpc", "valid_bpc")
                               if row[k] is not None})


def _progress_bar(show: bool, start: int, steps: int, run: RunFolder | None):
    """The steps to run, as a progress bar (a widget in a notebook, text in a terminal)."""
    if show:
        from tqdm.auto import tqdm
    else:
        from tqdm import tqdm  # disabled; tqdm.auto would warn in a bare notebook
    return tqdm(range(start, steps), initial=start, total=steps, disable=not show,
                desc=f"train {run.out.name if run else ''}".strip(), dynamic_ncols=True)
