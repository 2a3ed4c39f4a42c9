"""Trainer glue for `minixl train`, `eval`, `sample` and `bench`.

Hand-written (not generated). The models come from the chapters; this module
adds what a long run needs: presets, a cosine schedule with warm-up, bf16
autocast and optional torch.compile on CUDA, Chapter 2's auxiliary losses,
Chapter 4's Transformer-XL on ordered streams with memory carried across steps,
periodic held-out bpc, a metrics CSV and loss-curve PNG, atomic checkpoints
and resume.
"""

from __future__ import annotations

import contextlib
import csv
import math
import os
import re
import tempfile
import time
from dataclasses import asdict, dataclass, fields, replace
from pathlib import Path

import torch

from .aux_losses import AuxLossConfig, AuxLosses, next_byte_loss
from .char_transformer import CharTransformer, CharTransformerConfig, evaluate_bpc
from .data import load_corpus, random_windows, stream_tensors
from .relative_attention import shaw_factory
from .transformer_xl import TransformerXL, TransformerXLConfig, evaluate_bpc_xl

__all__ = [
    "TrainConfig", "PRESETS", "CheckpointError", "preset", "resolve_device", "train", "train_step",
    "parse_aux_losses", "make_objective", "make_xl_objective", "build_model", "ATTENTIONS",
    "MODELS", "new_model", "is_xl", "xl_eval_streams", "checkpoint_model_kind", "save_checkpoint",
    "load_checkpoint", "model_from_checkpoint", "bench", "peak_tflops",
]

CHECKPOINT = "checkpoint.pt"
METRICS = "metrics.csv"
FORMAT = "minixl-checkpoint-1"


@dataclass
class TrainConfig:
    """How to train: data, schedule, logging and where the run folder goes."""

    corpus: str = "pydoc"
    out: str = "runs/minixl"
    steps: int = 600
    batch_size: int = 32
    lr: float = 2e-3
    min_lr_frac: float = 0.1
    warmup: int = 30
    weight_decay: float = 0.01
    grad_clip: float = 1.0
    log_every: int = 10
    eval_every: int = 100
    eval_batches: int | None = 20
    ckpt_every: int = 200
    seed: int = 0
    device: str = "auto"
    compile: bool = False
    aux_losses: str = "positions"
    aux_targets: int = 1
    attention: str = "default"
    max_relative: int = 16
    model: str = "char"

    def __post_init__(self):
        for name in ("steps", "batch_size", "log_every", "eval_every", "ckpt_every"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be a positive integer, got {getattr(self, name)}")
        if self.lr <= 0:
            raise ValueError(f"lr must be > 0, got {self.lr}")
        if self.warmup < 0 or not 0.0 <= self.min_lr_frac <= 1.0:
            raise ValueError(f"need warmup >= 0 and 0 <= min_lr_frac <= 1, got {self.warmup} "
                             f"and {self.min_lr_frac}")
        if self.eval_batches is not None and self.eval_batches < 1:
            raise ValueError(f"eval_batches must be positive or None, got {self.eval_batches}")
        parse_aux_losses(self.aux_losses, self.aux_targets)  # fail early on a bad spec
        if self.attention not in ATTENTIONS:
            raise ValueError(f"unknown attention {self.attention!r}: expected one of "
                             f"{', '.join(ATTENTIONS)}")
        if self.max_relative < 0:
            raise ValueError(f"--max-relative must be >= 0, got {self.max_relative}")
        if self.model not in MODELS:
            raise ValueError(f"unknown model {self.model!r}: expected one of {', '.join(MODELS)}")
        if self.model == "xl" and (self.attention != "default" or self.aux_losses != "positions"
                                   or self.aux_targets != 1):
            raise ValueError("--attention, --aux-losses and --aux-targets apply to --model char; "
                             "Transformer-XL has its own relative attention and trains on every "
                             "position")


# default: Chapter 1's multi-head attention; shaw: Chapter 3's relative attention.
ATTENTIONS = ("default", "shaw")
# char: Chapter 1's CharTransformer (windows); xl: Chapter 4's TransformerXL (streams + memory).
MODELS = ("char", "xl")


def build_model(model_cfg: CharTransformerConfig, attention: str = "default",
                max_relative: int = 16) -> CharTransformer:
    """A CharTransformer with the named attention in every layer."""
    if attention not in ATTENTIONS:
        raise ValueError(f"unknown attention {attention!r}: expected one of {', '.join(ATTENTIONS)}")
    if attention == "shaw":
        return CharTransformer(model_cfg, attention=shaw_factory(max_relative))
    return CharTransformer(model_cfg)


def is_xl(model: torch.nn.Module) -> bool:
    """True for a Transformer-XL (called with memories), False for a windowed model."""
    return isinstance(model, TransformerXL)


def xl_eval_streams(n_bytes: int, tgt_len: int, max_streams: int) -> int:
    """How many parallel streams to evaluate n_bytes with memory: at most max_streams, and few
    enough that each stream is at least 32 segments long (its first segment has no memory)."""
    return max(1, min(max_streams, (n_bytes - 1) // (32 * tgt_len)))


def new_model(model_cfg, cfg: TrainConfig) -> torch.nn.Module:
    """The model a TrainConfig asks for: a TransformerXL for model='xl', else build_model's."""
    if cfg.model == "xl":
        return TransformerXL(model_cfg)
    return build_model(model_cfg, cfg.attention, cfg.max_relative)


AUX_NAMES = ("positions", "layers", "targets")


def parse_aux_losses(spec: str, targets: int = 1) -> AuxLossConfig:
    """'positions,layers=0.5,targets' -> AuxLossConfig; 'none' = the last position only.

    layers=W scales the intermediate layer losses (default 1), targets=W weighs each of the
    `targets` extra classifiers (default 0.5); positions takes no weight.
    """
    items = [s.strip() for s in spec.split(",") if s.strip()]
    if items == ["none"]:
        items = []
    kw: dict = {"positions": False}
    for item in items:
        name, _, weight = item.partition("=")
        if name not in AUX_NAMES:
            raise ValueError(f"unknown auxiliary loss {name!r} in {spec!r}: expected a comma-"
                             f"separated list of {', '.join(AUX_NAMES)} (or 'none')")
        if name == "positions":
            if weight:
                raise ValueError("'positions' takes no weight: it is the main loss at every position")
            kw["positions"] = True
            continue
        try:
            w = float(weight) if weight else (1.0 if name == "layers" else 0.5)
        except ValueError:
            raise ValueError(f"the weight of {name!r} in {spec!r} is not a number: "
                             f"{weight!r}") from None
        if name == "layers":
            kw["layers"] = w
        else:
            kw.update(targets=targets, target_weight=w)
    if targets < 1:
        raise ValueError(f"--aux-targets must be at least 1, got {targets}")
    return AuxLossConfig(**kw)


# name -> (model sizes, training settings). tiny: a few CPU minutes; small: a
# long CPU run or a short GPU one; base: Al-Rfou et al.'s T12 shape, for a GPU.
PRESETS: dict[str, tuple[dict, dict]] = {
    "tiny": (dict(n_layer=4, d_model=128, n_head=4, d_inner=512, block_size=128),
             dict(steps=600, batch_size=32, lr=2e-3, eval_every=100, ckpt_every=200)),
    "small": (dict(n_layer=8, d_model=256, n_head=8, d_inner=1024, block_size=256),
              dict(steps=3000, batch_size=32, lr=1e-3, eval_every=250, ckpt_every=500)),
    "base": (dict(n_layer=12, d_model=512, n_head=8, d_inner=2048, block_size=512, dropout=0.1),
             dict(steps=20000, batch_size=32, lr=6e-4, warmup=500, eval_every=1000,
                  ckpt_every=1000, eval_batches=50)),
}


# The same names for --model xl. base: the paper's 12-layer enwik8 model and its optimiser
# settings (lr 2.5e-4, batch 22, clip 0.25; the paper trains 400k steps, not 20k).
PRESETS_XL: dict[str, tuple[dict, dict]] = {
    "tiny": (dict(n_layer=4, d_model=128, n_head=4, d_head=32, d_inner=512, tgt_len=128,
                  mem_len=128, pre_lnorm=True),
             dict(steps=600, batch_size=32, lr=2e-3, eval_every=100, ckpt_every=200)),
    "small": (dict(n_layer=8, d_model=256, n_head=8, d_head=32, d_inner=1024, tgt_len=256,
                   mem_len=256, pre_lnorm=True),
              dict(steps=3000, batch_size=32, lr=1e-3, eval_every=250, ckpt_every=500)),
    "base": (dict(n_layer=12, d_model=512, n_head=8, d_head=64, d_inner=2048, tgt_len=512,
                  mem_len=512, dropout=0.1),
             dict(steps=20000, batch_size=22, lr=2.5e-4, warmup=0, grad_clip=0.25,
                  eval_every=1000, ckpt_every=1000, eval_batches=50)),
}


def preset(name: str, model: str = "char"):
    """The model and training configs of a named preset, for model 'char' or 'xl'."""
    table = PRESETS_XL if model == "xl" else PRESETS
    if model not in MODELS:
        raise ValueError(f"unknown model {model!r}: expected one of {', '.join(MODELS)}")
    if name not in table:
        raise ValueError(f"unknown preset {name!r}: expected one of {', '.join(table)}")
    model_kw, train_kw = table[name]
    config = TransformerXLConfig if model == "xl" else CharTransformerConfig
    out = f"runs/{name}" + ("-xl" if model == "xl" else "")
    return config(**model_kw), TrainConfig(out=out, model=model, **train_kw)


class CheckpointError(RuntimeError):
    """A checkpoint is missing, corrupt, or does not fit the model it claims to hold."""


def resolve_device(name: str = "auto") -> torch.device:
    """'auto' picks CUDA when present, else the CPU; 'cuda' without a GPU is an error."""
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if name.startswith("cuda") and not torch.cuda.is_available():
        raise ValueError("--device cuda was asked for, but PyTorch sees no CUDA GPU here; "
                         "use --device auto or --device cpu")
    try:
        return torch.device(name)
    except RuntimeError as err:
        raise ValueError(f"unknown device {name!r}: expected auto, cpu or cuda[:N]") from err


def autocast(device: torch.device):
    """bf16 autocast on CUDA; nothing on the CPU."""
    if device.type == "cuda":
        return torch.autocast("cuda", dtype=torch.bfloat16)
    return contextlib.nullcontext()


def lr_at(step: int, cfg: TrainConfig) -> float:
    """Linear warm-up to cfg.lr, then cosine decay to cfg.lr * cfg.min_lr_frac."""
    if step < cfg.warmup:
        return cfg.lr * (step + 1) / cfg.warmup
    progress = (step - cfg.warmup) / max(1, cfg.steps - cfg.warmup)
    floor = cfg.lr * cfg.min_lr_frac
    return floor + 0.5 * (cfg.lr - floor) * (1 + math.cos(math.pi * min(1.0, progress)))


def make_objective(fwd, model: torch.nn.Module, aux: AuxLosses):
    """objective(x, y, progress) -> dict of losses (nats): aux's parts plus 'next_byte'.

    fwd is the model or its compiled twin; 'next_byte' is the last layer's loss at every
    position, logged whatever the objective trains on.
    """
    def objective(x: torch.Tensor, y: torch.Tensor, progress: float) -> dict:
        logits, hidden = fwd(x, return_hidden=True)  # (B, T, V), n_layer x (B, T, C)
        parts = aux(logits, hidden, y, progress=progress, readout=model.readout)
        # With every position trained, the main loss is already this number: don't recompute it.
        parts["next_byte"] = (parts["final"].detach() if aux.config.positions
                              else next_byte_loss(logits.detach(), y))
        return parts

    return objective


def train_step(objective, params: list, opt: torch.optim.Optimizer, x: torch.Tensor,
               y: torch.Tensor, device: torch.device, grad_clip: float | None = None,
               progress: float = 0.0) -> dict:
    """One optimiser step on next-byte targets y [B, T]; returns the detached losses (nats)."""
    with autocast(device):
        parts = objective(x, y, progress)
    opt.zero_grad(set_to_none=True)
    parts["loss"].backward()
    if grad_clip is not None:
        torch.nn.utils.clip_grad_norm_(params, grad_clip)
    opt.step()
    return {k: v.detach() for k, v in parts.items()}


def make_xl_objective(fwd, state: dict):
    """objective(x, y, progress) for a TransformerXL: reads and replaces state['mems'].

    Returns the same keys as make_objective (no auxiliary parts: they are zero).
    """
    def objective(x: torch.Tensor, y: torch.Tensor, progress: float) -> dict:
        logits, state["mems"] = fwd(x, state["mems"])  # (B, T, V); memories for the next step
        loss = torch.nn.functional.cross_entropy(logits.float().flatten(0, 1), y.flatten())
        zero = loss.detach().new_zeros(())
        return {"loss": loss, "final": loss, "next_byte": loss.detach(), "layers": zero,
                "targets": zero}

    return objective


def save_checkpoint(path: Path, payload: dict) -> None:
    """torch.save to a temporary file beside path, then rename: a crash never leaves half a file."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=path.name + ".", suffix=".part", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as f:
            torch.save(payload, f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    finally:
        Path(tmp).unlink(missing_ok=True)


def load_checkpoint(path: Path) -> dict:
    """Load a minixl checkpoint with weights_only=True; clear errors when it is not one."""
    path = Path(path)
    if not path.is_file():
        raise CheckpointError(f"no checkpoint at {path}")
    try:
        ckpt = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as err:  # torch raises many kinds for a damaged file
        raise CheckpointError(f"{path} is corrupt or not a PyTorch checkpoint "
                              f"({type(err).__name__}: {str(err).splitlines()[0]})") from err
    if not isinstance(ckpt, dict) or ckpt.get("format") != FORMAT:
        raise CheckpointError(f"{path} is not a minixl checkpoint (expected format {FORMAT!r})")
    return ckpt


def checkpoint_model_kind(ckpt: dict) -> str:
    """'char' or 'xl': which model a checkpoint holds."""
    return ckpt.get("train_config", {}).get("model", "char")


def model_from_checkpoint(ckpt: dict | Path) -> torch.nn.Module:
    """Rebuild the model a checkpoint describes (CharTransformer or TransformerXL), with weights."""
    ckpt = ckpt if isinstance(ckpt, dict) else load_checkpoint(ckpt)
    try:
        tc = ckpt.get("train_config", {})
        if checkpoint_model_kind(ckpt) == "xl":
            model = TransformerXL(TransformerXLConfig(**ckpt["model_config"]))
        else:
            model = build_model(CharTransformerConfig(**ckpt["model_config"]),
                                tc.get("attention", "default"), tc.get("max_relative", 16))
    except (TypeError, ValueError, KeyError) as err:
        raise CheckpointError(f"checkpoint's model_config is unusable: {err}") from err
    try:
        model.load_state_dict(ckpt["model"])
    except RuntimeError as err:
        raise CheckpointError("checkpoint weights do not match its model_config: "
                              + str(err).splitlines()[0] + " ...") from err
    return model


def _write_plot(out: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    with open(out / METRICS) as f:
        rows = list(csv.DictReader(f))
    fig, ax = plt.subplots(figsize=(6, 3.5), dpi=100)
    ax.plot([int(r["step"]) for r in rows], [float(r["train_bpc"]) for r in rows], label="train")
    held = [r for r in rows if r["valid_bpc"]]
    ax.plot([int(r["step"]) for r in held], [float(r["valid_bpc"]) for r in held], "o-",
            label="held-out")
    ax.set(xlabel="step", ylabel="bits per byte", title=out.name)
    ax.legend()
    fig.tight_layout()
    fig.savefig(out / "loss.png")
    plt.close(fig)


def _trim_metrics(path: Path, step: int) -> None:
    """On resume, drop rows logged after the checkpoint's step (they will be redone)."""
    if not path.exists():
        return
    with open(path) as f:
        rows = list(csv.DictReader(f))
    with open(path, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=_COLUMNS)
        w.writeheader()
        w.writerows(r for r in rows if int(r["step"]) <= step)


# train_bpc: the last layer's next-byte loss at every position; loss: what was optimised;
# aux_layers, aux_targets: its weighted auxiliary parts. All in bits per byte.
_COLUMNS = ["step", "train_bpc", "valid_bpc", "loss", "aux_layers", "aux_targets", "lr",
            "tokens_per_s", "elapsed_s"]
_LOGGED = {"train_bpc": "next_byte", "loss": "loss", "aux_layers": "layers",
           "aux_targets": "targets"}


def train(model_cfg: CharTransformerConfig | TransformerXLConfig, cfg: TrainConfig, *,
          resume: bool = False, overwrite: bool = False, progress: bool = True) -> dict:
    """Train a CharTransformer (random windows) or, with cfg.model='xl', a TransformerXL on
    ordered streams with memory carried across steps; returns a summary dict."""
    from tqdm.auto import tqdm

    out = Path(cfg.out)
    ckpt_path = out / CHECKPOINT
    if ckpt_path.exists() and not (resume or overwrite):
        raise ValueError(f"{out} already holds a checkpoint; pass --resume to continue it, "
                         "--overwrite to start again, or choose another --out")
    if resume and not ckpt_path.exists():
        raise ValueError(f"--resume: there is no checkpoint at {ckpt_path} to resume from")
    device = resolve_device(cfg.device)
    if device.type == "cuda":
        torch.set_float32_matmul_precision("high")
    xl = cfg.model == "xl"
    if xl != isinstance(model_cfg, TransformerXLConfig):
        raise ValueError(f"model={cfg.model!r} needs a "
                         f"{'TransformerXLConfig' if xl else 'CharTransformerConfig'}, got "
                         f"{type(model_cfg).__name__}")
    seq_len = model_cfg.tgt_len if xl else model_cfg.block_size
    corpus = load_corpus(cfg.corpus)
    for split in ("train", "valid"):
        n_split = len(getattr(corpus, split))
        need = cfg.batch_size * seq_len + 1 if (xl and split == "train") else seq_len + 1
        if n_split < need:
            what = (f"{cfg.batch_size} streams of at least one segment of tgt_len={seq_len}"
                    if xl and split == "train" else f"windows of {seq_len} bytes")
            raise ValueError(f"the {split} split of {corpus.name!r} has {n_split} bytes, too few "
                             f"for {what}; use more text, a smaller batch or shorter segments")
    torch.manual_seed(cfg.seed)
    gen = torch.Generator().manual_seed(cfg.seed)
    model = new_model(model_cfg, cfg).to(device)
    aux = AuxLosses(parse_aux_losses(cfg.aux_losses, cfg.aux_targets), n_layer=model_cfg.n_layer,
                    d_model=model_cfg.d_model, vocab_size=model_cfg.vocab_size).to(device)
    params = list(model.parameters()) + ([] if xl else list(aux.parameters()))
    if xl:  # B ordered streams, read one segment per step; memory carried in xl_state
        x_stream, y_stream = stream_tensors(corpus.train, cfg.batch_size)
        n_segments = x_stream.size(1) // seq_len  # full segments per pass
    xl_state: dict = {"mems": None}
    opt = torch.optim.AdamW(params, lr=cfg.lr, weight_decay=cfg.weight_decay, betas=(0.9, 0.95))
    start = 0
    if resume:
        ckpt = load_checkpoint(ckpt_path)
        if ckpt["model_config"] != asdict(model_cfg):
            raise CheckpointError(f"{ckpt_path} holds a model of config {ckpt['model_config']}, "
                                  f"not the {asdict(model_cfg)} asked for; resume with the "
                                  "same preset and flags")
        old_kind = checkpoint_model_kind(ckpt)
        if old_kind != cfg.model:
            raise CheckpointError(f"{ckpt_path} holds a --model {old_kind} run; resume it with "
                                  f"--model {old_kind}")
        old_attn = (ckpt["train_config"].get("attention", "default"),
                    ckpt["train_config"].get("max_relative", 16))
        if old_attn != (cfg.attention, cfg.max_relative):
            raise CheckpointError(f"{ckpt_path} holds a model with --attention {old_attn[0]} "
                                  f"--max-relative {old_attn[1]}; resume with the same attention")
        old_aux = (ckpt["train_config"].get("aux_losses"), ckpt["train_config"].get("aux_targets"))
        if old_aux != (cfg.aux_losses, cfg.aux_targets):
            raise CheckpointError(f"{ckpt_path} was trained with --aux-losses {old_aux[0]} "
                                  f"--aux-targets {old_aux[1]}; resume with the same losses")
        model.load_state_dict(ckpt["model"])
        aux.load_state_dict(ckpt["aux"])
        if ckpt.get("mems") is not None:
            xl_state["mems"] = [m.to(device) for m in ckpt["mems"]]
        opt.load_state_dict(ckpt["optimizer"])
        gen.set_state(ckpt["sampler_rng"])
        torch.set_rng_state(ckpt["torch_rng"])
        if device.type == "cuda" and ckpt.get("cuda_rng"):
            torch.cuda.set_rng_state_all(ckpt["cuda_rng"])
        start = ckpt["step"]
        if start >= cfg.steps:
            raise ValueError(f"{ckpt_path} has already trained {start} steps; pass a --steps "
                             f"larger than {start} to train further")
        _trim_metrics(out / METRICS, start)
    out.mkdir(parents=True, exist_ok=True)
    fwd = torch.compile(model) if cfg.compile else model  # save `model`: no _orig_mod. prefix
    objective = make_xl_objective(fwd, xl_state) if xl else make_objective(fwd, model, aux)

    def checkpoint(step: int) -> None:
        save_checkpoint(ckpt_path, {
            "format": FORMAT, "step": step, "model": model.state_dict(),
            "aux": aux.state_dict(),  # training-only heads: never needed to evaluate
            "optimizer": opt.state_dict(), "model_config": asdict(model_cfg),
            "train_config": asdict(cfg), "sampler_rng": gen.get_state(),
            "torch_rng": torch.get_rng_state(),
            "cuda_rng": torch.cuda.get_rng_state_all() if device.type == "cuda" else [],
            "mems": None if xl_state["mems"] is None else [m.cpu() for m in xl_state["mems"]],
        })

    def held_out(max_batches: int | None) -> float:
        with autocast(device):
            if xl:  # up to max_batches segments of every stream, with memory
                streams = xl_eval_streams(len(corpus.valid), seq_len, cfg.batch_size)
                limit = None if max_batches is None else max_batches * streams * seq_len + 1
                return evaluate_bpc_xl(model, corpus.valid[:limit], batch_size=streams)
            return evaluate_bpc(model, corpus.valid, seq_len=seq_len,
                                batch_size=cfg.batch_size, max_batches=max_batches)

    new_file = not (out / METRICS).exists() or not resume
    log = open(out / METRICS, "w" if new_file else "a", newline="")
    writer = csv.DictWriter(log, fieldnames=_COLUMNS)
    if new_file:
        writer.writeheader()
    tokens_per_step = cfg.batch_size * seq_len
    t0, t_log, running, n_run = time.perf_counter(), time.perf_counter(), {}, 0
    completed = start  # optimiser steps whose update is in the weights
    bar = tqdm(range(start, cfg.steps), initial=start, total=cfg.steps, disable=not progress,
               desc=f"train {out.name}", dynamic_ncols=True)
    try:
        for step in bar:
            for group in opt.param_groups:
                group["lr"] = lr_at(step, cfg)
            if xl:
                segment = step % n_segments
                if segment == 0:
                    xl_state["mems"] = None  # a new pass over the streams: no memory yet
                cols = slice(segment * seq_len, (segment + 1) * seq_len)
                x, y = x_stream[:, cols], y_stream[:, cols]
            else:
                x, y = random_windows(corpus.train, cfg.batch_size, seq_len, generator=gen)
            x, y = x.to(device, non_blocking=True), y.to(device, non_blocking=True)
            parts = train_step(objective, params, opt, x, y, device, cfg.grad_clip,
                               progress=step / cfg.steps)
            completed = done = step + 1
            for key, value in parts.items():  # tensors: no GPU sync per step
                running[key] = running.get(key, 0.0) + value
            n_run += 1
            valid = held_out(cfg.eval_batches) if done % cfg.eval_every == 0 else None
            if done % cfg.log_every == 0 or valid is not None or done == cfg.steps:
                now = time.perf_counter()
                bits = {col: running[key].item() / n_run / math.log(2)
                        for col, key in _LOGGED.items()}
                train_bpc = bits["train_bpc"]
                writer.writerow({
                    "step": done, **{col: f"{b:.4f}" for col, b in bits.items()},
                    "valid_bpc": "" if valid is None else f"{valid:.4f}",
                    "lr": f"{lr_at(step, cfg):.3e}",
                    "tokens_per_s": f"{n_run * tokens_per_step / (now - t_log):.0f}",
                    "elapsed_s": f"{now - t0:.1f}",
                })
                log.flush()
                bar.set_postfix(train_bpc=f"{train_bpc:.3f}",
                                **({} if valid is None else {"valid_bpc": f"{valid:.3f}"}))
                running, n_run, t_log = {}, 0, now
            if done % cfg.ckpt_every == 0:
                checkpoint(done)
    except BaseException:
        # Keep what was learned: the last finished step goes to disk before we stop.
        if completed > start:
            checkpoint(completed)
        raise
    finally:
        log.close()
        bar.close()
    checkpoint(cfg.steps)
    final = held_out(None)
    _write_plot(out)
    return {"out": str(out), "steps": cfg.steps, "valid_bpc": final, "model": model,
            "corpus": corpus, "seconds": time.perf_counter() - t0, "device": str(device)}


# bf16 dense tensor-core peaks (TFLOP/s) from the vendors' data sheets.
_PEAKS = [("H200", 989.0), ("H100 PCIe", 756.0), ("H100 NVL", 835.0), ("H100", 989.0),
          ("A100", 312.0), ("L40S", 362.0), ("L4", 121.0), ("RTX 4090", 165.0)]


def peak_tflops(device_name: str) -> float | None:
    """The bf16 dense peak of a GPU by its name, or None when we do not know it."""
    for key, tflops in _PEAKS:
        if re.search(r"(^|\W)" + re.escape(key) + r"($|\W)", device_name, re.IGNORECASE):
            return tflops
    return None


def bench(model_cfg, *, batch_size: int = 32, steps: int = 20, warmup: int = 5,
          device: str = "auto", compile: bool = False, peak: float | None = None,
          attention: str = "default", max_relative: int = 16, model: str = "char") -> dict:
    """Training throughput (forward, backward, AdamW step) in tokens/s, and MFU on CUDA.

    model='xl' carries the memory from step to step, as training does.
    """
    dev = resolve_device(device)
    torch.manual_seed(0)
    cfg = TrainConfig(attention=attention, max_relative=max_relative, model=model)
    net = new_model(model_cfg, cfg).to(dev)
    fwd = torch.compile(net) if compile else net
    if model == "xl":
        objective = make_xl_objective(fwd, {"mems": None})
        T = model_cfg.tgt_len
    else:
        objective = make_objective(fwd, net, AuxLosses(AuxLossConfig(), n_layer=model_cfg.n_layer,
                                                       d_model=model_cfg.d_model))
        T = model_cfg.block_size
    opt = torch.optim.AdamW(net.parameters(), lr=1e-4)
    x = torch.randint(0, model_cfg.vocab_size, (batch_size, T), device=dev)

    def step():
        train_step(objective, list(net.parameters()), opt, x, x, dev)

    for _ in range(warmup):
        step()
    if dev.type == "cuda":
        torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(steps):
        step()
    if dev.type == "cuda":
        torch.cuda.synchronize()
    secs = time.perf_counter() - t0
    tokens_per_s = steps * batch_size * T / secs
    n_params = sum(p.numel() for p in net.parameters())
    c = model_cfg
    if model == "xl":
        # 6N per token for the weights; W_kR projects Tk = T + M distances per segment, not T;
        # the content (a, c) and position (b, d) scores and the weighted sum over Tk keys are
        # three [T, Tk] products per layer: 18 L Tk (H D), counted in full.
        Tk = T + c.mem_len
        r_params = sum(layer.dec_attn.r_net.weight.numel() for layer in net.layers
                       if c.pos == "relative")
        flops_per_token = (6 * n_params + 6 * r_params * (Tk / T - 1)
                           + 18 * c.n_layer * Tk * c.n_head * c.d_head)
    else:
        n_matmul = n_params - (net.pos.numel() if net.pos is not None else 0)  # tables are adds
        # 6N per token for the weights (forward + backward) plus 12 L T C for the attention
        # scores, counted in full (the PaLM convention) although a causal kernel skips half.
        flops_per_token = 6 * n_matmul + 12 * c.n_layer * T * c.d_model
    name = torch.cuda.get_device_name(dev) if dev.type == "cuda" else "cpu"
    peak = peak if peak is not None else (peak_tflops(name) if dev.type == "cuda" else None)
    mfu = flops_per_token * tokens_per_s / (peak * 1e12) if peak else None
    return {"device": name, "params": n_params, "tokens_per_s": tokens_per_s,
            "tflops": flops_per_token * tokens_per_s / 1e12, "peak_tflops": peak, "mfu": mfu,
            "batch_size": batch_size, "block_size": T, "steps": steps, "compile": compile,
            "attention": attention, "model": model}


def with_overrides(cfg, **overrides):
    """A copy of a dataclass config with the non-None overrides applied (validated again)."""
    names = {f.name for f in fields(cfg)}
    return replace(cfg, **{k: v for k, v in overrides.items() if v is not None and k in names})
