"""Model kinds: what `minixl train --model NAME` builds, its presets, and how it trains.

Hand-written glue (not generated). Each kind is one entry of `KINDS`: the model's config
class and builder (from the chapters), how its batches come (random windows, or ordered
streams whose state the trainer carries), its objective, and its presets. Every model here
meets the model protocol, ``logits, state = model.step(tokens, state)``, so the trainer,
evaluation, sampling and the benchmark never ask which kind they hold: adding a model to the
command line is one entry below.
"""

from __future__ import annotations

from dataclasses import dataclass, fields, replace
from pathlib import Path
from typing import Callable

import torch
import torch.nn as nn

from .aux_losses import AuxLossConfig, AuxLosses, AuxObjective
from .char_transformer import CharTransformer, CharTransformerConfig
from .checkpoint import CheckpointError, load_checkpoint
from .data import OrderedStreams, RandomWindows
from .relative_attention import shaw_factory
from .segtree import SegTreeConfig, SegTreeTransformer, segtree_graph
from .transformer_xl import TransformerXL, TransformerXLConfig
from .xlnet import XLNet, XLNetConfig

__all__ = ["ShawConfig", "ModelKind", "KINDS", "PAPER_PRESETS", "kind_of", "resolve_preset",
           "parse_aux_losses", "model_from_checkpoint", "with_overrides"]


@dataclass
class ShawConfig(CharTransformerConfig):
    """Chapter 1's model with Chapter 3's relative attention (clipping distance max_relative)
    in every layer, and no absolute positions unless pos says otherwise."""

    pos: str = "none"
    max_relative: int = 16

    def __post_init__(self):
        super().__post_init__()
        if self.max_relative < 0:
            raise ValueError(f"max_relative must be >= 0, got {self.max_relative}")


AUX_NAMES = ("positions", "layers", "targets")


def parse_aux_losses(spec: str, targets: int = 1) -> AuxLossConfig:
    """'positions,layers=0.5,targets' -> AuxLossConfig; 'none' = the last position only.

    layers=W scales the intermediate layer losses (default 1), targets=W weighs each of the
    `targets` extra classifiers (default 0.5); positions takes no weight.
    """
    if targets < 1:
        raise ValueError(f"--aux-targets must be at least 1, got {targets}")
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
        kw.update({"layers": w} if name == "layers" else {"targets": targets, "target_weight": w})
    return AuxLossConfig(**kw)


def _aux_objective(model_cfg, aux_losses: str, aux_targets: int) -> nn.Module:
    config = parse_aux_losses(aux_losses, aux_targets)
    return AuxObjective(AuxLosses(config, n_layer=model_cfg.n_layer, d_model=model_cfg.d_model,
                                  vocab_size=model_cfg.vocab_size))


def _no_aux(aux_losses: str, aux_targets: int, trains_on: str) -> None:
    if (aux_losses, aux_targets) != ("positions", 1):
        raise ValueError("--aux-losses and --aux-targets apply to the windowed models (char, "
                         f"shaw); this model trains on {trains_on}")


def _plain_objective(model_cfg, aux_losses: str, aux_targets: int) -> None:
    _no_aux(aux_losses, aux_targets, "the next byte at every position")
    return None  # the trainer's default: the next-byte loss at every position, via step


def _permutation_objective(model_cfg, aux_losses: str, aux_targets: int) -> nn.Module:
    _no_aux(aux_losses, aux_targets, "the bytes of a random factorisation order (--n-predict "
            "of each window)")
    from .xlnet import PermutationObjective

    return PermutationObjective("permutation")


def _char_flops(model: nn.Module) -> float:
    """Training FLOPs per token: 6N for the weights (forward and backward; position tables
    are additions, not products) plus 12 L T C for the attention scores, counted in full (the
    PaLM convention) although a causal kernel skips half."""
    c = model.config
    n_matmul = sum(p.numel() for p in model.parameters())
    n_matmul -= model.pos.numel() if getattr(model, "pos", None) is not None else 0
    return 6 * n_matmul + 12 * c.n_layer * c.block_size * c.d_model


def _xl_flops(model: nn.Module) -> float:
    """Training FLOPs per token: 6N for the weights; W_kR projects Tk = T + M distances per
    segment, not T; the content and position scores and the weighted sum over Tk keys are
    three [T, Tk] products per layer, 18 L Tk (H D), counted in full."""
    c = model.config
    T, Tk = c.tgt_len, c.tgt_len + c.mem_len
    n_params = sum(p.numel() for p in model.parameters())
    r_params = sum(m.r_net.weight.numel() for m in model.modules() if hasattr(m, "r_net"))
    return 6 * n_params + 6 * r_params * (Tk / T - 1) + 18 * c.n_layer * Tk * c.n_head * c.d_head


def _xlnet_flops(model: nn.Module) -> float:
    """Training FLOPs per token, for windows of T = seq_len with P = n_predict predicted and
    no memory: 6N for the weights, but the tied output layer scores only the P query rows,
    which also go through W_q, W_o and the feed-forward, and W_r (its 2T - 1 distances are
    shared by the batch) is left out; attention per row, counted in full, is the content and
    position scores (the latter over all 2T - 1 distances, before the shift) and the weighted
    sum, 6 C (4T - 1), for T content and P query rows. The last layer's content stream never
    reaches the loss: forward only (2x, not 6x)."""
    c = model.config
    T, P, C, L, V = c.seq_len, c.n_predict, c.d_model, c.n_layer, c.vocab_size
    n_params = sum(p.numel() for p in model.parameters())
    row = 2 * C * C + 2 * C * c.d_inner  # W_q, W_o and the feed-forward, per row
    attention = C * (4 * T - 1)  # per row
    weights = n_params - L * C * C + V * C * (P / T - 1) + L * row * P / T
    return 6 * weights + 6 * L * attention * (T + P) / T - 4 * (row + attention)


def _segtree_flops(model: nn.Module) -> float:
    """Training FLOPs per token: 6N for the weights (applied to every node, leaves and internal,
    about 2 per byte) plus, per layer, the scores and weighted sums over the graph's edges,
    12 C x edges per byte, counted in full."""
    c = model.config
    graph = segtree_graph(c.block_size, c.k, c.causal)
    edges = sum(int(g.valid.sum()) for g in graph.groups)
    n_params = sum(p.numel() for p in model.parameters())
    node_params = n_params - model.tok.weight.numel() - model.head.weight.numel()
    per_byte = graph.n_nodes / c.block_size
    return 6 * (node_params * per_byte + model.head.weight.numel()) + (
        12 * c.n_layer * c.d_model * edges / c.block_size)


def _segtree_lm(config: SegTreeConfig) -> nn.Module:
    """Chapter 6's SegTree as a language model: causal, read from the leaves."""
    if not config.causal or config.n_classes:
        raise ValueError("--model segtree trains a language model: it must be causal (no "
                         "right neighbours) and have no classifier (n_classes 0)")
    return SegTreeTransformer(config)


@dataclass(frozen=True)
class ModelKind:
    """One model the command line can train: see the module docstring."""

    name: str
    summary: str
    config: type
    build: Callable[[object], nn.Module]
    length: str  # the config field that holds the training length
    streams: bool  # False: random windows, no state; True: ordered streams, state carried
    protocols: tuple[str, ...]  # evaluation protocols, the default first
    # name -> (model settings, training settings[, objective defaults: aux_losses, aux_targets])
    presets: dict[str, tuple[dict, ...]]
    flops: Callable[[nn.Module], float]  # training FLOPs per token, for the benchmark's MFU
    # (model config, aux_losses, aux_targets) -> objective, or None for the trainer's default
    objective: Callable = _aux_objective
    eval_overrides: tuple[str, ...] = ()  # config fields `minixl eval` may change

    def batches(self, data: torch.Tensor, batch_size: int, model_cfg, *, seed: int):
        """The batch source of this kind: step -> (x, y, fresh)."""
        length = getattr(model_cfg, self.length)
        if self.streams:
            return OrderedStreams(data, batch_size, length)
        return RandomWindows(data, batch_size, length, seed=seed)

    def preset(self, name: str) -> tuple[object, dict]:
        """(model config, training settings for minixl.TrainConfig) of a named preset."""
        if name not in self.presets:
            raise ValueError(f"unknown preset {name!r} for --model {self.name}: expected one of "
                             f"{', '.join(self.presets)}")
        model_kw, train_kw = self.presets[name][:2]
        return self.config(**model_kw), dict(train_kw)

    def aux_defaults(self, name: str) -> tuple[str, int]:
        """(aux_losses, aux_targets) a preset trains with unless --aux-* say otherwise."""
        extra = self.presets[name][2] if len(self.presets.get(name, ())) > 2 else {}
        return extra.get("aux_losses", "positions"), extra.get("aux_targets", 1)


# tiny: a few CPU minutes; small: a long CPU run or a short GPU one; base: the papers' shapes.
_CHAR_PRESETS = {
    "tiny": (dict(n_layer=4, d_model=128, n_head=4, d_inner=512, block_size=128),
             dict(steps=600, batch_size=32, lr=2e-3, eval_every=100, ckpt_every=200)),
    "small": (dict(n_layer=8, d_model=256, n_head=8, d_inner=1024, block_size=256),
              dict(steps=3000, batch_size=32, lr=1e-3, eval_every=250, ckpt_every=500)),
    # Al-Rfou et al.'s T12 shape (the paper trains far longer, with all auxiliary losses).
    "base": (dict(n_layer=12, d_model=512, n_head=8, d_inner=2048, block_size=512, dropout=0.1),
             dict(steps=20000, batch_size=32, lr=6e-4, warmup=500, eval_every=1000,
                  ckpt_every=1000, eval_bytes=1 << 20)),
}
# t12: the 12-layer model of "Character-Level Language Modeling with Deeper Self-Attention"
# (Al-Rfou, Choe, Constant, Guo, Jones, 2018): 12 layers, d 512, 8 heads, d_inner 2048,
# context 512, a position table per layer, trained with all three auxiliary losses (Chapter 2:
# every position, every layer, one extra byte ahead at weight 0.5). Ours: 20k steps of 32
# windows and dropout 0.1; the paper trains far longer with heavier dropout.
_CHAR_PRESETS["t12"] = (dict(_CHAR_PRESETS["base"][0], pos="per_layer"), _CHAR_PRESETS["base"][1],
                        dict(aux_losses="positions,layers,targets", aux_targets=1))
_XL_PRESETS = {
    "tiny": (dict(n_layer=4, d_model=128, n_head=4, d_head=32, d_inner=512, tgt_len=128,
                  mem_len=128, pre_lnorm=True),
             dict(steps=600, batch_size=32, lr=2e-3, eval_every=100, ckpt_every=200)),
    "small": (dict(n_layer=8, d_model=256, n_head=8, d_head=32, d_inner=1024, tgt_len=256,
                   mem_len=256, pre_lnorm=True),
              dict(steps=3000, batch_size=32, lr=1e-3, eval_every=250, ckpt_every=500)),
    # Dai et al.'s 12-layer enwik8 model and optimiser settings (the paper trains 400k steps).
    "base": (dict(n_layer=12, d_model=512, n_head=8, d_head=64, d_inner=2048, tgt_len=512,
                  mem_len=512, dropout=0.1),
             dict(steps=20000, batch_size=22, lr=2.5e-4, warmup=0, grad_clip=0.25,
                  eval_every=1000, ckpt_every=1000, eval_bytes=1 << 20)),
}
# xl-base: the 12-layer enwik8 model of "Transformer-XL: Attentive Language Models Beyond a
# Fixed-Length Context" (Dai et al., 2019): 12 layers, d 512, 8 heads of 64, d_inner 2048,
# tgt_len and mem_len 512, dropout 0.1, batch 22, lr 2.5e-4 (cosine), gradient clip 0.25,
# post-norm. Ours: 20k steps instead of the paper's 400k.
_XL_PRESETS["xl-base"] = _XL_PRESETS["base"]

# n_predict = seq_len / K with K about 6: Yang et al. (2019) predict the last 1/K of each
# order, K = 6 for XLNet-Large (their ablation of the base model also tries 7). Training reads
# random windows without memory (the paper also carries a memory of 384 across segments,
# which minixl's XLNet training does not do), so mem_len is 0: sampling then re-reads the
# last seq_len - 1 bytes at each step (XLNet.step).
_XLNET_PRESETS = {
    "tiny": (dict(n_layer=4, d_model=128, n_head=4, d_inner=512, seq_len=128, n_predict=21),
             dict(steps=600, batch_size=32, lr=2e-3, eval_every=100, ckpt_every=200)),
    "small": (dict(n_layer=8, d_model=256, n_head=8, d_inner=1024, seq_len=256, n_predict=43),
              dict(steps=3000, batch_size=32, lr=1e-3, eval_every=250, ckpt_every=500)),
    # The XLNet-Base shape (Yang et al. 2019); the optimiser settings are ours (the paper
    # trains far longer, on far larger batches).
    "base": (dict(n_layer=12, d_model=768, n_head=12, d_inner=3072, seq_len=512, n_predict=85,
                  dropout=0.1, dropatt=0.1),
             dict(steps=20000, batch_size=32, lr=4e-4, warmup=1000, eval_every=1000,
                  ckpt_every=1000, eval_bytes=1 << 20)),
}
# xlnet-base: the XLNet-Base shape of "XLNet: Generalized Autoregressive Pretraining for
# Language Understanding" (Yang et al., 2019): 12 layers, d 768, 12 heads, d_inner 3072,
# windows of 512, K about 6. Ours: bytes, not word pieces; 20k steps of 32 windows (the paper
# trains 500k steps of 8,192 sequences); no memory across windows (the paper's is 384).
_XLNET_PRESETS["xlnet-base"] = _XLNET_PRESETS["base"]

# k neighbours per side and level. base: BP-Transformer's enwik8 shape (Ye et al. 2019:
# 12 layers, context 8,192, k = 64); the optimiser settings are ours.
_SEGTREE_PRESETS = {
    "tiny": (dict(n_layer=4, d_model=128, n_head=4, d_inner=512, block_size=128, k=2),
             dict(steps=600, batch_size=32, lr=2e-3, eval_every=100, ckpt_every=200)),
    "small": (dict(n_layer=8, d_model=256, n_head=8, d_inner=1024, block_size=512, k=4),
              dict(steps=3000, batch_size=16, lr=1e-3, eval_every=250, ckpt_every=500)),
    "base": (dict(n_layer=12, d_model=512, n_head=8, d_inner=2048, block_size=8192, k=64,
                  dropout=0.1),
             dict(steps=20000, batch_size=4, lr=4e-4, warmup=1000, eval_every=1000,
                  ckpt_every=1000, eval_bytes=1 << 20)),
}
# segtree-base: the enwik8 model of "BP-Transformer: Modelling Long-Range Context via Binary
# Partitioning" (Ye et al., 2019): 12 layers, d 512, 8 heads, d_inner 2048, context 8,192,
# k 64. Ours: 20k steps of 4 windows and our optimiser settings; relative positions on the
# tree as Chapter 6 builds them.
_SEGTREE_PRESETS["segtree-base"] = _SEGTREE_PRESETS["base"]

# The paper-scale presets name their model: `--preset xl-base` alone trains --model xl.
PAPER_PRESETS = {"t12": "char", "xl-base": "xl", "xlnet-base": "xlnet",
                 "segtree-base": "segtree"}

KINDS: dict[str, ModelKind] = {
    "char": ModelKind(
        "char", "Chapter 1's CharTransformer, trained on random windows",
        CharTransformerConfig, CharTransformer, "block_size", False,
        ("all-positions", "sliding"), _CHAR_PRESETS, _char_flops),
    "shaw": ModelKind(
        "shaw", "Chapter 1's model with Chapter 3's relative attention (--max-relative)",
        ShawConfig, lambda c: CharTransformer(c, attention=shaw_factory(c.max_relative)),
        "block_size", False, ("all-positions", "sliding"), _CHAR_PRESETS, _char_flops),
    "xl": ModelKind(
        "xl", "Chapter 4's Transformer-XL, on ordered streams with its memory carried",
        TransformerXLConfig, TransformerXL, "tgt_len", True,
        ("memory", "all-positions", "sliding"), _XL_PRESETS, _xl_flops, objective=_plain_objective,
        eval_overrides=("tgt_len", "mem_len", "clamp_len")),
    "xlnet": ModelKind(
        "xlnet", "Chapter 5's XLNet, trained on random windows with the permutation objective",
        XLNetConfig, XLNet, "seq_len", False, ("infill", "all-positions"), _XLNET_PRESETS,
        _xlnet_flops, objective=_permutation_objective),
    "segtree": ModelKind(
        "segtree", "Chapter 6's SegTree Transformer (causal, tree attention, --k)",
        SegTreeConfig, _segtree_lm, "block_size", False, ("all-positions", "sliding"),
        _SEGTREE_PRESETS, _segtree_flops, objective=_plain_objective),
}


def with_overrides(cfg, **overrides):
    """A copy of a dataclass config with the non-None overrides applied (validated again)."""
    names = {f.name for f in fields(cfg)}
    return replace(cfg, **{k: v for k, v in overrides.items() if v is not None and k in names})


def kind_of(name: str) -> ModelKind:
    """The ModelKind called `name`, or a clear error."""
    if name not in KINDS:
        raise ValueError(f"unknown model {name!r}: expected one of {', '.join(KINDS)}")
    return KINDS[name]


def resolve_preset(model: str | None, preset: str | None) -> tuple[ModelKind, str]:
    """(kind, preset) from --model and --preset: a paper-scale preset (PAPER_PRESETS) picks its
    model; otherwise the model defaults to char and the preset to tiny."""
    preset = "tiny" if preset is None else preset
    if preset in PAPER_PRESETS:
        own = PAPER_PRESETS[preset]
        if model is not None and model != own:
            raise ValueError(f"--preset {preset} is a --model {own} preset, not a --model "
                             f"{model} one: drop --model or use --model {own}")
        model = own
    kind = kind_of("char" if model is None else model)
    if preset not in kind.presets or preset in PAPER_PRESETS and PAPER_PRESETS[preset] != kind.name:
        names = [n for n in kind.presets if PAPER_PRESETS.get(n, kind.name) == kind.name]
        raise ValueError(f"unknown preset {preset!r} for --model {kind.name}: expected one of "
                         f"{', '.join(names)}")
    return kind, preset


def model_from_checkpoint(ckpt: dict | str | Path) -> nn.Module:
    """Rebuild the model a checkpoint holds, with its weights (on the CPU, in eval mode)."""
    ckpt = ckpt if isinstance(ckpt, dict) else load_checkpoint(ckpt)
    name = ckpt["meta"].get("kind") if isinstance(ckpt["meta"], dict) else None
    if name not in KINDS:
        raise CheckpointError(f"the checkpoint does not say which model it holds (kind {name!r}; "
                              f"expected one of {', '.join(KINDS)})")
    kind = KINDS[name]
    try:
        model = kind.build(kind.config(**ckpt["model_config"]))
        model.load_state_dict(ckpt["model"])
    except (TypeError, ValueError, RuntimeError) as err:
        raise CheckpointError(f"the checkpoint's weights do not fit its --model {name} config: "
                              + (str(err).splitlines() or [type(err).__name__])[0]) from None
    if not all(torch.isfinite(t).all() for t in model.state_dict().values()):
        raise CheckpointError("the checkpoint holds weights that are not finite (NaN or inf): "
                              "the run that wrote it diverged; use an earlier checkpoint")
    return model.eval()
