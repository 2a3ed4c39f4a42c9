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
"""

from __future__ import annotations

import contextlib
import csv
import math
import os
import signal
import sys
import threading
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Callable

import torch
import torch.nn as nn
import torch.nn.functional as F

from .char_transformer import lr_at
from .checkpoint import FORMAT, CheckpointError, check_resume, load_checkpoint, save_checkpoint
from .data import step_seed
from .device import autocast, resolve_device

__all__ = ["TrainConfig", "TrainResult", "TrainingInterrupted", "TrainingDiverged", "train",
           "train_step", "next_byte_objective"]

CHECKPOINT, METRICS, PLOT = "checkpoint.pt", "metrics.csv", "loss.png"
# Settings a resumed run may change freely: they do not change what is learned.
FREE = ("log_every", "eval_every", "eval_bytes", "ckpt_every", "device")


@dataclass
class TrainConfig:
    """How to train. `steps` is the run's total (it sets the learning-rate schedule)."""

    steps: int = 600
    batch_size: int = 32
    lr: float = 2e-3
    warmup: int = 30
    min_lr_frac: float = 0.1
    weight_decay: float = 0.01
    grad_clip: float = 1.0  # 0 = no clipping
    seed: int = 0
    log_every: int = 10
    eval_every: int = 100
    eval_bytes: int | None = 65536  # held-out bytes scored during training (None = all)
    ckpt_every: int = 200
    device: str = "auto"
    compile: bool = False

    def __post_init__(self):
        for name in ("steps", "batch_size", "log_every", "eval_every", "ckpt_every"):
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


def train(model: nn.Module, cfg: TrainConfig, *, batches: Callable, objective: Callable | None = None,
          held_out: Callable | None = None, out: str | Path | None = None, resume: bool = False,
          overwrite: bool = False, allow_change: tuple[str, ...] = (), meta: dict | None = None,
          progress: bool = True) -> TrainResult:
    """Train `model` for cfg.steps optimiser steps on batches(step); see the module docstring.

    objective(model, x, y, state, progress) -> (losses dict with "loss", new state); an
    nn.Module objective trains (and checkpoints) its own weights too. held_out(model, n_bytes)
    -> bpc is run every cfg.eval_every steps and at the end (n_bytes None: all of it).
    """
    if progress:
        from tqdm.auto import tqdm  # a widget in notebooks, text in a terminal
    else:
        from tqdm import tqdm  # disabled below; tqdm.auto would warn in a bare notebook

    device = resolve_device(cfg.device)
    objective = next_byte_objective if objective is None else objective
    own = objective if isinstance(objective, nn.Module) else nn.Module()  # the objective's weights
    model.to(device)
    own.to(device)
    params = [p for m in (model, own) for p in m.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=cfg.lr, weight_decay=cfg.weight_decay)
    run = _Run(Path(out), model, own, opt, cfg, meta or {}) if out is not None else None
    start, state = run.begin(resume, overwrite, set(allow_change), device) if run else (0, None)
    if cfg.compile:
        model.compile()  # compiles the module in place: its state_dict keys stay plain
    log, history, t0 = _Window(cfg.lr), [], time.perf_counter()
    bar = tqdm(range(start, cfg.steps), initial=start, total=cfg.steps, disable=not progress,
               desc=f"train {run.out.name if run else ''}".strip(), dynamic_ncols=True)
    with _Stopper(enabled=run is not None) as stopper:
        try:
            for step in bar:
                x, y, fresh = batches(step)
                for group in opt.param_groups:
                    group["lr"] = cfg.lr_at(step)
                torch.manual_seed(step_seed(cfg.seed, step, stream=1))  # this step's dropout
                parts, state, norm = train_step(
                    model, objective, opt, params, x.to(device), y.to(device),
                    None if fresh else state, progress=step / cfg.steps, grad_clip=cfg.grad_clip,
                    device=device)
                done = step + 1
                log.add(step, parts, norm, x.numel())
                valid = None
                if done % cfg.eval_every == 0 and held_out is not None:
                    with stopper.interruptible():
                        valid = held_out(model, cfg.eval_bytes)
                if done % cfg.log_every == 0 or valid is not None or done == cfg.steps or (
                        stopper.signum):  # a stopped run logs its last, shorter window
                    row = log.row(done, valid, lr=cfg.lr_at(step), t0=t0, run=run)
                    history.append(row)
                    if run:
                        run.write(row)
                    bar.set_postfix({k: f"{row[k]:.3f}" for k in ("train_bpc", "valid_bpc")
                                     if row[k] is not None})
                if run and (done % cfg.ckpt_every == 0 or done == cfg.steps or stopper.signum):
                    log.check_finite(run)
                    run.save(done, state)
                if stopper.signum:
                    stopper.saved = True
                    raise TrainingInterrupted(stopper.signum, done, run.ckpt)
            log.check_finite(run)
            with stopper.interruptible():
                valid = held_out(model, None) if held_out is not None else None
        except _StopNow:  # a signal during held-out evaluation: the saved step is consistent
            if log.n:  # the step's metrics row, without the abandoned evaluation
                row = log.row(done, None, lr=cfg.lr_at(done - 1), t0=t0, run=run)
                history.append(row)
                run.write(row)
            if run.saved != done:
                run.save(done, state)
            stopper.saved = True
            raise TrainingInterrupted(stopper.signum, done, run.ckpt) from None
        finally:
            bar.close()
            if run:
                run.close()
    if run:
        run.plot()
    return TrainResult(model, cfg.steps, valid, history, time.perf_counter() - t0, str(device),
                       run.out if run else None)


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
    traceback."""

    def __init__(self, enabled: bool):
        self.enabled = enabled and threading.current_thread() is threading.main_thread()
        self.signum, self._abandon, self._old, self.saved = None, False, {}, False

    def __enter__(self):
        if self.enabled:
            self._old = {s: signal.signal(s, self._handle) for s in (signal.SIGINT, signal.SIGTERM)}
        return self

    def __exit__(self, *exc):
        for s, handler in self._old.items():
            signal.signal(s, handler)

    def _handle(self, signum, frame):
        if self.signum is not None:
            if signum == signal.SIGINT and not self.saved:
                raise KeyboardInterrupt  # the second Ctrl-C: stop now, save nothing
            return
        self.signum = signum
        _notice(f"minixl: {signal.Signals(signum).name} received; "
                + ("stopping evaluation and saving" if self._abandon else
                   "finishing the current step, then saving")
                + " a checkpoint (Ctrl-C again aborts without saving)\n")
        if self._abandon:
            raise _StopNow

    @contextlib.contextmanager
    def interruptible(self):
        """Work that changes nothing the checkpoint holds: a signal may stop it at once."""
        if self.signum:
            raise _StopNow
        self._abandon = True
        try:
            yield
        finally:
            self._abandon = False


class _Window:
    """Sums of the logged losses since the last row, kept on the device (no sync per step)."""

    def __init__(self, lr: float):
        self.sums, self.n, self.tokens, self.t, self.lr = {}, 0, 0, time.perf_counter(), lr
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
        if self.bad_step is not None and int(self.bad_step) > 0:
            last = (f"{run.ckpt} (step {run.saved})" if run and run.saved else
                    "none (no checkpoint was written)" if run else "none (no output folder)")
            raise TrainingDiverged(int(self.bad_step), self.lr, last)

    def row(self, done: int, valid: float | None, *, lr: float, t0: float, run) -> dict:
        """The metrics row of step `done` (losses in bits per byte); resets the sums."""
        self.check_finite(run)
        now, ln2 = time.perf_counter(), math.log(2)
        mean = {k: v.item() / self.n for k, v in self.sums.items()}
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

    def __init__(self, out: Path, model, own, opt, cfg: TrainConfig, meta: dict):
        self.out, self.ckpt = out, out / CHECKPOINT
        self.model, self.own, self.opt, self.cfg, self.meta = model, own, opt, cfg, meta
        self.saved, self._log, self._writer = 0, None, None

    def identity(self, model_config: dict, train_config: dict, meta: dict) -> dict:
        """The settings that define what a run learns, flat, for the resume check."""
        ident = {f"model.{k}": v for k, v in model_config.items()}
        ident |= {k: v for k, v in train_config.items() if k not in FREE}
        return ident | {k: v for k, v in meta.items()}

    def begin(self, resume: bool, overwrite: bool, allow: set, device) -> tuple[int, object]:
        """Check the folder against --resume/--overwrite; restore a checkpoint; (start, state)."""
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
            return 0, None
        ckpt = load_checkpoint(self.ckpt, for_resume=True)
        model_config = asdict(self.model.config)
        fixed = {f"model.{k}" for k in set(model_config) | set(ckpt["model_config"])} | {"kind", "objective"}
        changed = check_resume(self.identity(ckpt["model_config"], ckpt["train_config"], ckpt["meta"]),
                               self.identity(model_config, asdict(self.cfg), self.meta),
                               fixed=fixed, allow=allow)
        for name, (old, new) in changed.items():
            print(f"resuming with {name} changed: {old!r} -> {new!r}")
        if ckpt["step"] >= self.cfg.steps:
            raise ValueError(f"{self.ckpt} has already trained {ckpt['step']} steps, the whole "
                             f"run; to train further pass a larger --steps (the total) with "
                             "--allow-change steps, which stretches the learning-rate schedule to "
                             "the new total")
        try:
            self.model.load_state_dict(ckpt["model"])
            self.own.load_state_dict(ckpt["objective"])
            self.opt.load_state_dict(ckpt["optimizer"])
            for group in self.opt.param_groups:  # an allowed change of weight decay holds
                group["weight_decay"] = self.cfg.weight_decay
        except (RuntimeError, ValueError, KeyError, TypeError, AttributeError) as err:
            raise CheckpointError(f"{self.ckpt} does not fit this run: "
                                  f"{str(err).splitlines()[0] if str(err) else type(err).__name__}"
                                  ) from None
        self.saved = ckpt["step"]
        self._trim(ckpt["step"])
        state = ckpt["state"]
        if state is not None and changed.keys() & {"batch_size", "corpus"}:
            print("resuming with an empty state (memory): it belonged to other streams")
            state = None
        return ckpt["step"], _to(state, device)

    def save(self, step: int, state) -> None:
        """Save a checkpoint of `step` (atomically), unless the weights are not finite."""
        if not all(torch.isfinite(p).all() for p in self.model.parameters()):
            raise TrainingDiverged(step, self.cfg.lr,
                                   f"{self.ckpt} (step {self.saved})" if self.saved else "none")
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

    def _trim(self, step: int) -> None:
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
