"""The training loop: one short loop over the model protocol, for every model in minixl.

Hand-written shared machinery (not generated). Chapter 1 writes this loop out by hand;
Chapters 2 to 4 and `minixl train` call `train`. What it needs of a model is the protocol
every minixl model meets, ``logits, state = model.step(tokens, state)`` (Chapter 1), and of
the data a batch source whose ``batch(step)`` returns the same batch for the same step
(`minixl.data.RandomWindows`, `OrderedStreams`). An objective turns a batch into losses;
the default is the next-byte loss at every position.

With an output folder, a run keeps atomic checkpoints, a metrics CSV and a loss plot, and
copes with being stopped:

- SIGINT (Ctrl-C) or SIGTERM prints a notice at once, lets the current optimiser step finish,
  saves a checkpoint of exactly that step and raises `TrainingInterrupted`; a second Ctrl-C
  before that checkpoint is on disk aborts at once (KeyboardInterrupt) and leaves the previous
  checkpoint as it was; one after it is ignored (the run is already stopping).
- a loss or gradient norm that is not finite raises `TrainingDiverged`, naming the step;
  nothing is saved after it, so the last good checkpoint stays.
- ``resume=True`` continues exactly where the checkpoint stopped (same batches, dropout masks
  and memory as a run that was never stopped) and refuses settings that differ from the saved
  ones, unless they are named in ``allow_change``.

Scale: ``cfg.grad_accum`` splits each step's batch into micro-batches whose gradients add up
(a stateful model's memory is split and rejoined by rows); ``cfg.weight_decay_on="matrices"``
decays only the weight matrices (`decay_groups`); on CUDA the optimiser is the fused AdamW.
Launched by torchrun (WORLD_SIZE > 1), every process runs this same loop on its own
contiguous rows of each step's batch under DistributedDataParallel (gloo on the CPU, NCCL on
CUDA, one GPU per process); rank 0 alone writes the run folder and the progress bar, the
logged losses are means over the processes, a checkpoint holds the whole batch's memory (so
any number of processes can resume it), and a signal stops every process after the same step
(there a second signal does not abort: see `_Stopper`).
"""

from __future__ import annotations

import contextlib
import csv
import datetime
import inspect
import math
import os
import signal
import sys
import threading
import time
from dataclasses import MISSING, asdict, dataclass, field, fields, replace
from pathlib import Path
from typing import Callable

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F

from .char_transformer import lr_at
from .checkpoint import FORMAT, CheckpointError, check_resume, load_checkpoint, save_checkpoint
from .data import step_seed
from .device import autocast, distributed_env, training_device

__all__ = ["TrainConfig", "TrainResult", "TrainingInterrupted", "TrainingDiverged", "train",
           "train_step", "next_byte_objective", "NO_DECAY", "decays", "decay_groups"]

CHECKPOINT, METRICS, PLOT = "checkpoint.pt", "metrics.csv", "loss.png"
# Settings a resumed run may change freely: they do not change what is learned (grad_accum
# splits the same batch into micro-batches; like the number of processes, it changes only
# the order of float additions and which dropout mask falls on which row).
FREE = ("log_every", "eval_every", "eval_bytes", "ckpt_every", "device", "grad_accum")
# Settings added after checkpoints of this format were first written: a checkpoint without
# one was trained with the value here.
BEFORE = {"weight_decay_on": "all", "grad_accum": 1}
DECAY_ON = ("all", "matrices")


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
    weight_decay_on: str = "all"  # "all" (Chapter 1's loop) or "matrices" (see decay_groups)
    grad_clip: float = 1.0  # 0 = no clipping
    seed: int = 0
    log_every: int = 10
    eval_every: int = 100
    eval_bytes: int | None = 65536  # held-out bytes scored during training (None = all)
    ckpt_every: int = 200
    device: str = "auto"
    compile: bool = False

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
        if self.weight_decay_on not in DECAY_ON:
            raise ValueError(f"weight_decay_on must be one of {', '.join(DECAY_ON)}, got "
                             f"{self.weight_decay_on!r}")

    def lr_at(self, step: int) -> float:
        """The learning rate of optimiser step `step` (Chapter 1's schedule)."""
        return lr_at(step, self.steps, lr=self.lr, warmup=self.warmup,
                     min_lr_frac=self.min_lr_frac)


class TrainingInterrupted(Exception):
    """SIGINT or SIGTERM stopped the run after a step; its checkpoint was saved."""

    def __init__(self, signum: int, step: int, checkpoint: Path):
        self.signum, self.step, self.checkpoint = signum, step, checkpoint
        name = signal.Signals(signum).name
        super().__init__(f"{name}: stopped after step {step}; checkpoint saved to {checkpoint} "
                         "(continue with --resume)")


class TrainingDiverged(Exception):
    """The loss or the gradient norm stopped being finite."""

    def __init__(self, step: int, lr: float, last_good: str):
        self.step = step
        super().__init__(f"training diverged: the loss or gradient norm was not finite at step "
                         f"{step}; nothing was saved after it, and the last good checkpoint is "
                         f"{last_good}. Try a smaller --lr (this run: {lr:g})")


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


def train_step(model: nn.Module, objective: Callable, opt: torch.optim.Optimizer, params: list,
               x: torch.Tensor, y: torch.Tensor, state=None, *, progress: float = 0.0,
               grad_clip: float = 0.0, device: torch.device = torch.device("cpu")):
    """One optimiser step on x, y [B, T]: returns (detached losses, new state, gradient norm)."""
    with autocast(device):
        parts, state = objective(model, x, y, state, progress)
    opt.zero_grad(set_to_none=True)
    parts["loss"].backward()
    norm = torch.nn.utils.clip_grad_norm_(params, grad_clip if grad_clip > 0 else math.inf)
    opt.step()
    return {k: v.detach() for k, v in parts.items()}, state, norm


# ---------------------------------------------------------------- weight decay

# Weight decay pulls every decayed weight towards zero at each step. That suits the matrices
# that multiply activations (the linear layers and the token embeddings): the layer norms
# undo their scale, and decay keeps it from growing. It does not suit what is added to the
# activations, or what encodes where a byte is: biases and norm gains (the only tensors with
# fewer than 2 dimensions), and the tables named here, each row a learned offset or a
# position code that decay would wash out (a distance or a tree edge that is rarely seen
# would drift to zero). The names are the last part of the name named_parameters gives.
NO_DECAY = {
    "pos": "char: learned absolute positions, one table per layer [L, T, C]",
    "w_k": "shaw: relative positions a^K, one row per clipped distance [2k+1, D]",
    "w_v": "shaw: relative positions a^V [2k+1, D]",
    "r_w_bias": "xl, xlnet: the global content bias u [H, D]",
    "r_r_bias": "xl, xlnet: the global position bias v [H, D]",
    "r_s_bias": "xlnet: the global segment bias [H, D]",
    "seg_embed": "xlnet: the two segment encodings s+, s- [2, H, D]",
    "rel_k": "segtree: a key offset per edge type, the tree's relative positions [types, D]",
}


def decays(name: str, param: torch.Tensor) -> bool:
    """Whether weight_decay_on="matrices" decays the parameter `name` (as named_parameters
    names it): a matrix (2 or more dimensions) that is not a bias or position table of
    NO_DECAY. Tied weights (the token embedding and the output layer) are one matrix."""
    return param.dim() >= 2 and name.rsplit(".", 1)[-1] not in NO_DECAY


def decay_groups(modules: list[nn.Module], weight_decay: float, on: str = "matrices"
                 ) -> list[dict]:
    """AdamW parameter groups of the trainable parameters of `modules` (the model, and the
    objective's own weights), in the order of their parameters() either way.

    on="all": one group, every tensor decayed (Chapter 1's loop, TrainConfig's default).
    on="matrices": [the tensors `decays` picks, at weight_decay; the rest, at 0] (the
    grouping of nanoGPT's configure_optimizers, with u, v and the position tables added).
    """
    if on not in DECAY_ON:
        raise ValueError(f"on must be one of {', '.join(DECAY_ON)}, got {on!r}")
    named = [(n, p) for m in modules for n, p in m.named_parameters() if p.requires_grad]
    if on == "all":
        return [{"params": [p for _, p in named], "weight_decay": weight_decay}]
    return [{"params": [p for n, p in named if decays(n, p)], "weight_decay": weight_decay},
            {"params": [p for n, p in named if not decays(n, p)], "weight_decay": 0.0}]


def _optimizer(model: nn.Module, own: nn.Module, cfg: TrainConfig, device: torch.device,
               on: str | None = None) -> torch.optim.Optimizer:
    """AdamW over decay_groups: the fused kernel on CUDA, PyTorch's default on the CPU (whose
    updates Chapter 1's loop reproduces bit for bit)."""
    groups = decay_groups([model, own], cfg.weight_decay, on or cfg.weight_decay_on)
    fused = {"fused": True} if device.type == "cuda" else {}
    return torch.optim.AdamW(groups, lr=cfg.lr, weight_decay=cfg.weight_decay, **fused)


# ---------------------------------------------------------------- the loop

def _rows(state, rows: slice):
    """Rows `rows` (dim 0) of a model's state: None, a tensor [B, ...], or lists of them."""
    if isinstance(state, torch.Tensor):
        return state[rows]
    if isinstance(state, (list, tuple)):
        return type(state)(_rows(s, rows) for s in state)
    return state


def _cat_rows(states: list):
    """The states of consecutive rows, put back together along dim 0 (inverse of _rows)."""
    if len(states) == 1:
        return states[0]
    first = states[0]
    if isinstance(first, torch.Tensor):
        return torch.cat(states, dim=0)
    if isinstance(first, (list, tuple)):
        return type(first)(_cat_rows(list(parts)) for parts in zip(*states))
    return first


class _Net(nn.Module):
    """The model and the objective's own weights as one module whose forward is the loss.

    DistributedDataParallel wraps this: its forward builds the whole graph, so the backward
    all-reduces the gradients of both (in buckets, while the backward still runs).
    """

    def __init__(self, model: nn.Module, own: nn.Module, objective: Callable):
        super().__init__()
        self.model, self.own = model, own
        self.__dict__["objective"] = objective  # may be `own` itself: not registered twice

    def forward(self, x, y, state, progress: float):
        return self.objective(self.model, x, y, state, progress)


def _unused(net: nn.Module, x: torch.Tensor, y: torch.Tensor, state, device) -> bool:
    """Whether some trainable weight gets no gradient from the loss of one micro-batch: then
    DistributedDataParallel must look for such weights in every step (find_unused_parameters,
    a walk over the graph); else it need not. The probe leaves the random state as it was."""
    params = [p for p in net.parameters() if p.requires_grad]
    with torch.random.fork_rng(devices=[device] if device.type == "cuda" else []):
        with autocast(device):
            parts, _ = net(x, y, state, 0.0)
        grads = torch.autograd.grad(parts["loss"], params, allow_unused=True)
    return any(g is None for g in grads)


def _step(net: nn.Module, opt: torch.optim.Optimizer, params: list, x: torch.Tensor,
          y: torch.Tensor, state, *, micro: int, seeds: list[int], progress: float,
          grad_clip: float, device: torch.device):
    """One optimiser step on this process's rows x, y [b, T], in micro-batches of `micro`
    rows (seeds[i]: micro-batch i's dropout). Each micro-batch's loss is scaled by 1/n so
    that the gradients add up to those of the mean loss over the b rows; a state is split
    into its rows and put back together. Returns (mean losses, new state, gradient norm)."""
    n = x.size(0) // micro
    opt.zero_grad(set_to_none=True)
    totals, states = {}, []
    for i in range(n):
        rows = slice(i * micro, (i + 1) * micro)
        torch.manual_seed(seeds[i])
        last = i == n - 1  # DDP all-reduces in the last micro-batch's backward only
        with net.no_sync() if hasattr(net, "no_sync") and not last else contextlib.nullcontext():
            with autocast(device):
                parts, new = net(x[rows], y[rows], _rows(state, rows) if n > 1 else state,
                                 progress)
            (parts["loss"] / n).backward()
        for k, v in parts.items():
            totals[k] = totals.get(k, 0.0) + v.detach() / n
        states.append(new)
    norm = torch.nn.utils.clip_grad_norm_(params, grad_clip if grad_clip > 0 else math.inf)
    opt.step()
    return totals, _cat_rows(states), norm


def train(model: nn.Module, cfg: TrainConfig, *, batches: Callable, objective: Callable | None = None,
          held_out: Callable | None = None, out: str | Path | None = None, resume: bool = False,
          overwrite: bool = False, allow_change: tuple[str, ...] = (), meta: dict | None = None,
          progress: bool = True) -> TrainResult:
    """Train `model` for cfg.steps optimiser steps on batches(step); see the module docstring.

    objective(model, x, y, state, progress) -> (losses dict with "loss", new state); an
    nn.Module objective trains (and checkpoints) its own weights too. held_out(model, n_bytes)
    -> bpc is run every cfg.eval_every steps and at the end (n_bytes None: all of it); in a
    distributed run every process runs it (on the same weights) and rank 0 reports it.
    """
    world = distributed_env()[2]
    if cfg.batch_size % (world * cfg.grad_accum):
        raise ValueError(f"batch_size {cfg.batch_size} does not split into {world} processes x "
                         f"{cfg.grad_accum} micro-batches (grad_accum): use a batch size that is "
                         f"a multiple of {world * cfg.grad_accum}")
    ranks = _Ranks(cfg.device)
    try:
        return _train(ranks, model, cfg, batches=batches, objective=objective,
                      held_out=held_out, out=out, resume=resume, overwrite=overwrite,
                      allow_change=allow_change, meta=meta, progress=progress)
    finally:
        ranks.close()


def _train(ranks, model, cfg, *, batches, objective, held_out, out, resume, overwrite,
           allow_change, meta, progress) -> TrainResult:
    if progress and ranks.rank == 0:
        from tqdm.auto import tqdm  # a widget in notebooks, text in a terminal
    else:
        from tqdm import tqdm  # disabled below; tqdm.auto would warn in a bare notebook

    device = ranks.device
    objective = next_byte_objective if objective is None else objective
    own = objective if isinstance(objective, nn.Module) else nn.Module()  # the objective's weights
    model.to(device)
    own.to(device)
    saving = out is not None
    ckpt_path = Path(out) / CHECKPOINT if saving else None
    run = _Run(Path(out), model, own, cfg, meta or {}) if saving and ranks.rank == 0 else None
    plan = None
    if run:
        try:
            plan = run.begin(resume, overwrite, set(allow_change))
        except (ValueError, CheckpointError) as err:
            plan = err
    if saving and ranks.on:  # rank 0 decides; every process learns the outcome
        plan = ranks.broadcast(plan)
    if isinstance(plan, Exception):
        raise plan
    if plan is not None and ranks.rank:  # rank 0's settings (the resume check saw them)
        cfg = replace(TrainConfig(**plan["cfg"]), device=cfg.device)
    params = [p for m in (model, own) for p in m.parameters() if p.requires_grad]
    opt = _optimizer(model, own, cfg, device)
    start, state = 0, None
    if plan is not None and plan["ckpt"] is not None:
        start, state = _restore(plan["ckpt"], plan["changed"], model, own, opt, cfg, device,
                                ckpt_path, say=ranks.rank == 0)
        b = cfg.batch_size // ranks.world  # this process's rows of the saved (whole) memory
        state = _to(_rows(state, slice(ranks.rank * b, (ranks.rank + 1) * b)), device)
    if run:
        run.opt, run.saved = opt, start
        if start:
            run.trim(start)
    if cfg.compile:
        model.compile()  # compiles the module in place: its state_dict keys stay plain
    net = _Net(model, own, objective)
    b = cfg.batch_size // ranks.world
    mine, micro = slice(ranks.rank * b, (ranks.rank + 1) * b), b // cfg.grad_accum
    if ranks.on and start < cfg.steps:
        x, y, fresh = batches(start)
        unused = _unused(net, x[mine][:micro].to(device), y[mine][:micro].to(device),
                         None if fresh else _rows(state, slice(0, micro)), device)
        net = nn.parallel.DistributedDataParallel(
            net, device_ids=[device.index] if device.type == "cuda" else None,
            find_unused_parameters=unused,  # XLNet's segment weights, with one segment
            **_NO_BUFFER_SYNC)  # buffers are constants here (masks, sinusoids)
    log, history, t0 = _Window(cfg.lr, ranks), [], time.perf_counter()
    bar = tqdm(range(start, cfg.steps), initial=start, total=cfg.steps,
               disable=not progress or ranks.rank != 0,
               desc=f"train {run.out.name if run else ''}".strip(), dynamic_ncols=True)

    def save(done: int, state) -> None:  # every process: the checks and the gather agree
        log.check_finite(run)
        whole = ranks.gather_rows(state)
        if not all(torch.isfinite(p).all() for p in model.parameters()):
            raise TrainingDiverged(done, cfg.lr, f"{ckpt_path} (step {run.saved})"
                                   if run and run.saved else "none")
        if run:
            run.save(done, whole)

    with _Stopper(enabled=saving, distributed=ranks.on, quiet=ranks.rank != 0) as stopper:
        try:
            for step in bar:
                x, y, fresh = batches(step)  # the whole batch; this process takes its rows
                for group in opt.param_groups:
                    group["lr"] = cfg.lr_at(step)
                # micro-batch k of the step's batch (k = 0 in a one-process run without
                # accumulation, Chapter 1's loop) draws its dropout masks from its own seed
                first = ranks.rank * cfg.grad_accum
                seeds = [step_seed(cfg.seed, step, stream=1 + 256 * k)
                         for k in range(first, first + cfg.grad_accum)]
                parts, state, norm = _step(
                    net, opt, params, x[mine].to(device), y[mine].to(device),
                    None if fresh else state, micro=micro, seeds=seeds, progress=step / cfg.steps,
                    grad_clip=cfg.grad_clip, device=device)
                done = step + 1
                stopper.settle(ranks)  # distributed: every process stops after the same step
                log.add(step, parts, norm, x.numel())
                valid = None
                if done % cfg.eval_every == 0 and held_out is not None:
                    with stopper.interruptible():
                        valid = held_out(model, cfg.eval_bytes)
                if done % cfg.log_every == 0 or valid is not None or done == cfg.steps or (
                        stopper.stop):  # a stopped run logs its last, shorter window
                    row = log.row(done, valid, lr=cfg.lr_at(step), t0=t0, run=run)
                    history.append(row)
                    if run:
                        run.write(row)
                    bar.set_postfix({k: f"{row[k]:.3f}" for k in ("train_bpc", "valid_bpc")
                                     if row[k] is not None})
                if saving and (done % cfg.ckpt_every == 0 or done == cfg.steps or stopper.stop):
                    save(done, state)
                if stopper.stop:
                    stopper.saved = True
                    ranks.barrier()  # no process ends before rank 0 has saved
                    raise TrainingInterrupted(stopper.stop, done, ckpt_path)
            log.check_finite(run)
            with stopper.interruptible():
                valid = held_out(model, None) if held_out is not None else None
        except _StopNow:  # a signal during held-out evaluation (one process only): the saved
            if log.n:  # step is consistent; the step's metrics row, without the evaluation
                row = log.row(done, None, lr=cfg.lr_at(done - 1), t0=t0, run=run)
                history.append(row)
                run.write(row)
            if run.saved != done:
                save(done, state)
            stopper.saved = True
            raise TrainingInterrupted(stopper.signum, done, ckpt_path) from None
        finally:
            bar.close()
            if run:
                run.close()
    if run:
        run.plot()
    ranks.barrier()
    return TrainResult(model, cfg.steps, valid, history, time.perf_counter() - t0, str(device),
                       run.out if run else Path(out) if saving else None)


# Buffers are not synchronised before each forward (newer PyTorch names the switch anew).
_NO_BUFFER_SYNC = ({"forward_sync_buffers": False} if "forward_sync_buffers" in
                   inspect.signature(nn.parallel.DistributedDataParallel).parameters
                   else {"broadcast_buffers": False})


def _settle_steps(opt: torch.optim.Optimizer) -> None:
    """After load_state_dict: each step counter where this optimiser's kernel wants it (on
    the parameter's device for the fused kernel, on the CPU otherwise)."""
    for group in opt.param_groups:
        on_device = group.get("fused") or group.get("capturable")
        for p in group["params"]:
            s = opt.state.get(p, {})
            if isinstance(s.get("step"), torch.Tensor):
                s["step"] = s["step"].to(p.device if on_device else "cpu", torch.float32)


def _restore(ckpt: dict, changed: dict, model, own, opt, cfg: TrainConfig, device, path,
             *, say: bool):
    """Load a checkpoint's weights and optimiser state; (its step, its whole state)."""
    try:
        model.load_state_dict(ckpt["model"])
        own.load_state_dict(ckpt["objective"])
        kernel = [{k: g[k] for k in ("fused", "foreach", "capturable") if k in g}
                  for g in opt.param_groups]  # this device's AdamW, not the saved one's
        saved_on = {**BEFORE, **ckpt["train_config"]}["weight_decay_on"]
        if saved_on == cfg.weight_decay_on:
            opt.load_state_dict(ckpt["optimizer"])
        else:  # an allowed change of grouping: each tensor's moments carry over
            old = _optimizer(model, own, cfg, device, on=saved_on)
            old.load_state_dict(ckpt["optimizer"])
            for p, s in old.state.items():
                opt.state[p] = s
        for group, kept, wd in zip(opt.param_groups, kernel, _group_decays(cfg)):
            group.update(kept)
            group["weight_decay"] = wd  # an allowed change of weight decay holds
        _settle_steps(opt)
    except (RuntimeError, ValueError, KeyError, TypeError, AttributeError) as err:
        raise CheckpointError(f"{path} does not fit this run: "
                              f"{str(err).splitlines()[0] if str(err) else type(err).__name__}"
                              ) from None
    state = ckpt["state"]
    if state is not None and changed.keys() & {"batch_size", "corpus"}:
        if say:
            print("resuming with an empty state (memory): it belonged to other streams")
        state = None
    return ckpt["step"], state


def _group_decays(cfg: TrainConfig) -> list[float]:
    """The weight decay of each group decay_groups makes."""
    return [cfg.weight_decay] if cfg.weight_decay_on == "all" else [cfg.weight_decay, 0.0]


CLOSE_WAIT_S = datetime.timedelta(seconds=30)  # how long the end waits for a missing process


class _Ranks:
    """This process's place in a run: the only process (world 1), or one of the `world`
    processes torchrun started (WORLD_SIZE, RANK, LOCAL_RANK in the environment).

    A distributed run starts the process group itself when nobody has (gloo on the CPU,
    NCCL on CUDA with device cuda:LOCAL_RANK) and ends it at the end. Control messages (the
    stop flag, rank 0's decisions) go over gloo, on the CPU, so they never wait for the GPU;
    the window sums and the memory go over the device's own group. With world 1 every
    method is the identity and no collective is ever called.
    """

    def __init__(self, device_name: str):
        self.rank, self.local, self.world = distributed_env()
        self.device = training_device(device_name)
        self.on, self.created, self.control = self.world > 1, False, None
        if not self.on:
            return
        if not dist.is_available():
            raise ValueError("WORLD_SIZE > 1 (a torchrun launch), but this PyTorch has no "
                             "torch.distributed")
        if not dist.is_initialized():
            cuda = self.device.type == "cuda"
            if cuda:
                torch.cuda.set_device(self.device)
            dist.init_process_group("nccl" if cuda else "gloo",
                                    **({"device_id": self.device} if cuda else {}))
            self.created = True
        self.control = (dist.new_group(backend="gloo") if dist.get_backend() != "gloo"
                        else dist.group.WORLD)

    def close(self) -> None:
        """End the process group, all processes together: one that tore its group down while
        another was still tearing down aborted that other (gloo's SIGABRT, seen when every
        process ended on the same refusal). A process that never arrives (it crashed) costs
        the others CLOSE_WAIT_S, then they end alone."""
        if self.created and dist.is_initialized():
            with contextlib.suppress(RuntimeError):
                dist.monitored_barrier(group=self.control, timeout=CLOSE_WAIT_S,
                                       wait_all_ranks=True)
            dist.destroy_process_group()

    def broadcast(self, obj):
        """Rank 0's obj, on every process."""
        box = [obj]
        dist.broadcast_object_list(box, src=0, group=self.control)
        return box[0]

    def barrier(self) -> None:
        if self.on:
            dist.barrier(group=self.control)

    def max_int(self, value: int) -> int:
        t = torch.tensor([value], dtype=torch.int64)
        dist.all_reduce(t, op=dist.ReduceOp.MAX, group=self.control)
        return int(t)

    def mean(self, t: torch.Tensor) -> torch.Tensor:
        """The mean of t over the processes (t itself in a one-process run)."""
        if not self.on:
            return t
        t = t.clone()
        dist.all_reduce(t)
        return t / self.world

    def first_bad(self, bad: torch.Tensor) -> int:
        """The earliest positive value of bad (a step) over the processes; 0 if none is."""
        if not self.on:
            return int(bad)
        never = torch.iinfo(torch.int64).max
        t = torch.where(bad > 0, bad, never).to(torch.int64).reshape(1)
        dist.all_reduce(t, op=dist.ReduceOp.MIN)
        return 0 if int(t) == never else int(t)

    def gather_rows(self, state):
        """Every process's rows of a state, put together along dim 0 (rank 0's rows first)."""
        if not self.on or state is None:
            return state
        if isinstance(state, torch.Tensor):
            t = state.contiguous()
            parts = [torch.empty_like(t) for _ in range(self.world)]
            dist.all_gather(parts, t)
            return torch.cat(parts, dim=0)
        if isinstance(state, (list, tuple)):
            return type(state)(self.gather_rows(s) for s in state)
        return state


class _StopNow(Exception):
    """Raised by the signal handler while the run does work it may abandon (evaluation)."""


def _notice(text: str) -> None:
    """Write from a signal handler: straight to the file descriptor when there is one, so a
    write the handler interrupted is never re-entered."""
    try:
        os.write(sys.stderr.fileno(), text.encode())
    except (AttributeError, OSError, ValueError):  # a notebook's stream has no real descriptor
        sys.stderr.write(text)


class _Stopper:
    """Holds SIGINT and SIGTERM until the current step has finished; a second SIGINT aborts.

    `saved` is set once the stopping checkpoint is on disk: from then on a further SIGINT has
    nothing left to abort and is ignored, so a double Ctrl-C never turns a clean stop into a
    traceback.

    Distributed, the processes must stop after the same step: `settle` (after every step)
    agrees on `stop`, the largest signal any of them has received. Evaluation is not
    abandoned (the processes would part ways) and a repeated signal does not abort: torchrun
    passes a Ctrl-C on to its workers, which the terminal has already sent them, so every
    worker sees two. Only rank 0 prints the notice (`quiet` elsewhere)."""

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
            raise _StopNow

    @contextlib.contextmanager
    def interruptible(self):
        """Work that changes nothing the checkpoint holds: a signal may stop it at once (in a
        one-process run)."""
        if self.distributed:
            yield
            return
        if self.signum:
            raise _StopNow
        self._abandon = True
        try:
            yield
        finally:
            self._abandon = False


class _Window:
    """Sums of the logged losses since the last row, kept on the device (no sync per step).

    Distributed, a row's losses are the means over the processes and a non-finite loss or
    gradient norm of any process stops all of them at the same step: both are settled when a
    row is made or a checkpoint saved, never per step. `tokens` counts the whole batch."""

    def __init__(self, lr: float, ranks: _Ranks):
        self.sums, self.n, self.tokens, self.t, self.lr = {}, 0, 0, time.perf_counter(), lr
        self.ranks = ranks
        self.bad_step = None  # first step (1-based) whose loss or gradient norm was not finite

    def add(self, step: int, parts: dict, norm: torch.Tensor, tokens: int) -> None:
        for key, value in {**parts, "grad_norm": norm}.items():
            self.sums[key] = self.sums.get(key, 0.0) + value.detach().float()
        bad = ~torch.isfinite(parts["loss"].detach().float() + norm.float())
        first = torch.where(bad, step + 1, 0)
        self.bad_step = first if self.bad_step is None else torch.where(
            self.bad_step > 0, self.bad_step, first)
        self.n, self.tokens = self.n + 1, self.tokens + tokens

    def check_finite(self, run) -> None:
        """Raise TrainingDiverged if any step so far had a non-finite loss or gradient norm."""
        if self.bad_step is None:
            return
        bad = self.ranks.first_bad(self.bad_step)
        if bad > 0:
            last = (f"{run.ckpt} (step {run.saved})" if run and run.saved else
                    "none (no checkpoint was written)" if run else "none (no output folder)")
            raise TrainingDiverged(bad, self.lr, last)

    def row(self, done: int, valid: float | None, *, lr: float, t0: float, run) -> dict:
        """The metrics row of step `done` (losses in bits per byte); resets the sums."""
        self.check_finite(run)
        now, ln2 = time.perf_counter(), math.log(2)
        keys = list(self.sums)
        sums = self.ranks.mean(torch.stack([self.sums[k] for k in keys])).tolist()
        mean = {k: v / self.n for k, v in zip(keys, sums)}
        row = {"step": done, "train_bpc": mean.get("next_byte", mean["loss"]) / ln2,
               "valid_bpc": valid, "loss": mean["loss"] / ln2}
        row |= {k: v / ln2 for k, v in mean.items()
                if k not in ("loss", "next_byte", "final", "grad_norm")}
        row |= {"grad_norm": mean["grad_norm"], "lr": lr,
                "tokens_per_s": self.tokens / (now - self.t), "elapsed_s": now - t0}
        self.sums, self.n, self.tokens, self.t = {}, 0, 0, now
        return row


def _to(state, device):
    """A model's state (None, a tensor, or lists of them) on another device."""
    if isinstance(state, torch.Tensor):
        return state.to(device)
    if isinstance(state, (list, tuple)):
        return type(state)(_to(s, device) for s in state)
    return state


class _Run:
    """An output folder: checkpoint.pt, metrics.csv and loss.png."""

    def __init__(self, out: Path, model, own, cfg: TrainConfig, meta: dict):
        self.out, self.ckpt = out, out / CHECKPOINT
        self.model, self.own, self.opt, self.cfg, self.meta = model, own, None, cfg, meta
        self.saved, self._log, self._writer = 0, None, None

    def identity(self, model_config: dict, train_config: dict, meta: dict) -> dict:
        """The settings that define what a run learns, flat, for the resume check."""
        ident = {f"model.{k}": v for k, v in model_config.items()}
        ident |= {k: v for k, v in {**BEFORE, **train_config}.items() if k not in FREE}
        return ident | {k: v for k, v in meta.items()}

    def begin(self, resume: bool, overwrite: bool, allow: set) -> dict | None:
        """Check the folder against --resume/--overwrite and a checkpoint against this run:
        {"ckpt": the checkpoint (None for a new run), "changed": the allowed changes, "cfg":
        this run's settings as a dict}, which every process then restores (_restore)."""
        ours = [p for p in (self.ckpt, self.out / METRICS, self.out / PLOT) if p.exists()]
        if resume and overwrite:
            raise ValueError("--resume continues the run in the folder and --overwrite deletes "
                             "it: pass one of them, not both")
        if not resume and ours and not overwrite:
            raise ValueError(f"{self.out} already holds a run ({', '.join(p.name for p in ours)}); "
                             "pass --resume to continue it, --overwrite to start again, or "
                             "choose another --out")
        if resume and not self.ckpt.exists():
            raise ValueError(f"--resume: there is no checkpoint at {self.ckpt} to resume from")
        if allow and not resume:
            raise ValueError("--allow-change applies to --resume only")
        self.out.mkdir(parents=True, exist_ok=True)
        if not resume:
            for path in ours:
                path.unlink()
            return {"ckpt": None, "changed": {}, "cfg": asdict(self.cfg)}
        ckpt = load_checkpoint(self.ckpt, for_resume=True)
        model_config = asdict(self.model.config)
        # a setting added to the model since the checkpoint was written has its default there
        saved_model = {f.name: f.default for f in fields(self.model.config)
                       if f.default is not MISSING} | ckpt["model_config"]
        fixed = {f"model.{k}" for k in set(model_config) | set(saved_model)} | {"kind", "objective"}
        changed = check_resume(self.identity(saved_model, ckpt["train_config"], ckpt["meta"]),
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

    def save(self, step: int, state) -> None:
        """Save a checkpoint of `step` (atomically); the caller has checked the weights."""
        save_checkpoint(self.ckpt, {
            "format": FORMAT, "step": step, "model": self.model.state_dict(),
            "model_config": asdict(self.model.config), "meta": self.meta,
            "train_config": asdict(self.cfg), "objective": self.own.state_dict(),
            "optimizer": self.opt.state_dict(), "state": _to(state, "cpu"),
        })
        self.saved = step

    def write(self, row: dict) -> None:
        """Append a metrics row to metrics.csv (losses to 4 decimals)."""
        row = {k: "" if v is None else v if isinstance(v, int) else f"{v:.4g}" if k in (
            "grad_norm", "lr", "tokens_per_s") else f"{v:.1f}" if k == "elapsed_s" else f"{v:.4f}"
            for k, v in row.items()}
        if self._log is None:
            path = self.out / METRICS
            old = path.exists() and path.stat().st_size > 0
            fieldnames = next(csv.reader(open(path))) if old else list(row)
            self._log = open(path, "a" if old else "w", newline="")
            self._writer = csv.DictWriter(self._log, fieldnames=fieldnames, extrasaction="ignore")
            if not old:
                self._writer.writeheader()
        self._writer.writerow(row)
        self._log.flush()

    def close(self) -> None:
        if self._log is not None:
            self._log.close()

    def trim(self, step: int) -> None:
        """On resume, drop metrics rows logged after the checkpoint's step: they are redone."""
        path = self.out / METRICS
        if not path.exists():
            return
        with open(path) as f:
            rows = list(csv.DictReader(f))
            names = rows and list(rows[0])
        tmp = path.with_name(path.name + ".part")
        with open(tmp, "w", newline="") as f:  # then renamed: a crash keeps the old file
            if names:
                w = csv.DictWriter(f, fieldnames=names)
                w.writeheader()
                w.writerows(r for r in rows if int(r["step"]) <= step)
        os.replace(tmp, path)

    def plot(self) -> None:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        with open(self.out / METRICS) as f:
            rows = list(csv.DictReader(f))
        fig, ax = plt.subplots(figsize=(6, 3.5), dpi=100)
        ax.plot([int(r["step"]) for r in rows], [float(r["train_bpc"]) for r in rows],
                label="train")
        held = [r for r in rows if r["valid_bpc"]]
        ax.plot([int(r["step"]) for r in held], [float(r["valid_bpc"]) for r in held], "o-",
                label="held-out")
        ax.set(xlabel="step", ylabel="bits per byte", title=self.out.name)
        ax.legend()
        fig.tight_layout()
        fig.savefig(self.out / PLOT)
        plt.close(fig)
