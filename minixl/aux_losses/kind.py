"""Chapter 2's home for the `char` kind: Chapter 1's model trained with Chapter 2's losses.

Hand-written glue (not generated). `AUX_OBJECTIVE` is Chapter 2's auxiliary losses (stacked) as an objective (its command-line options
`--aux-losses`, `--aux-targets`), which the windowed models of Chapters 1 and 3 train with;
`CHAR` is the kind `minixl train --model char` builds, every fact about it in one place. Declaring registers nothing: the registry
(`minixl.kinds`) names this module in its table and imports it when the kind is first used.
"""

from __future__ import annotations

import torch.nn as nn

from ..char_transformer import CharTransformer, CharTransformerConfig
from ..model_kind import (BenchArm, ModelKind, Objective, Preset, SMALL_TRAIN, TINY_TRAIN,
                          count_weights, window_kernel, window_reach)
from ..options import Option
from . import AuxLossConfig, AuxObjective, StackedAuxLosses

__all__ = ["parse_aux_losses", "AUX_OBJECTIVE", "CHAR"]


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
    # the stacked losses: the loop's values and gradients, in two compiled graphs a run
    return AuxObjective(StackedAuxLosses(config, n_layer=model_cfg.n_layer,
                                         d_model=model_cfg.d_model,
                                         vocab_size=model_cfg.vocab_size))


def _aux_flops(model: nn.Module, objective: nn.Module) -> float:
    """Training FLOPs per token that Chapter 2's losses add, averaged over the run: layer l's
    readout (the tied head) while its loss is on, which is the first l / 2L of training, so
    (L - 1) / 4 intermediate layers on average; and each extra classifier on the last layer
    and on every intermediate layer whose loss is on; 6 per weight (2 forward, 4 backward)."""
    aux = objective.aux
    on = (aux.n_layer - 1) / 4 if aux.config.layers else 0.0
    heads = sum(p.numel() for p in aux.target_heads.parameters())
    return 6 * (model.head.weight.numel() * on + heads * (1 + on))


# Chapter 2's auxiliary losses, the objective of the windowed models of Chapters 1 and 3.
AUX_OBJECTIVE = Objective(
    _aux_objective,
    (Option("aux_losses", str, "positions", "Chapter 2's losses: comma-separated positions, "
            "layers[=W], targets[=W], or none"),
     Option("aux_targets", int, 1, "extra bytes ahead predicted by 'targets'")),
    tag=lambda o: f"{o['aux_losses']} targets={o['aux_targets']}", flops=_aux_flops)


def char_flops(model: nn.Module) -> float:
    """Training FLOPs per token: 6N for the weights (forward and backward; position tables
    are additions, not products) plus 12 L T C for the attention scores, counted in full (the
    PaLM convention) although a causal kernel skips half."""
    c = model.config
    n_matmul = count_weights(model)
    n_matmul -= model.pos.numel() if getattr(model, "pos", None) is not None else 0
    return 6 * n_matmul + 12 * c.n_layer * c.block_size * c.d_model


def char_causal_flops(model: nn.Module) -> float:
    """Training FLOPs per token, causal policy: char_flops with each query charged only the
    keys it may read, (T + 1) / 2 of the window's T on average, so 6 L (T + 1) C for the
    attention scores and weighted sums."""
    c = model.config
    return char_flops(model) - 12 * c.n_layer * c.block_size * c.d_model + (
        6 * c.n_layer * (c.block_size + 1) * c.d_model)


CHAR_PRESETS = {
    "tiny": Preset(dict(n_layer=4, d_model=128, n_head=4, d_inner=512, block_size=128), TINY_TRAIN),
    "small": Preset(dict(n_layer=8, d_model=256, n_head=8, d_inner=1024, block_size=256), SMALL_TRAIN),
    # Al-Rfou et al.'s T12 shape (the paper trains far longer, with all auxiliary losses).
    "base": Preset(dict(n_layer=12, d_model=512, n_head=8, d_inner=2048, block_size=512,
                        dropout=0.1),
                   dict(steps=20000, batch_size=32, lr=6e-4, warmup=500, eval_every=1000,
                        ckpt_every=1000, eval_bytes=1 << 20)),
}
# t12: the 12-layer model of "Character-Level Language Modeling with Deeper Self-Attention"
# (Al-Rfou, Choe, Constant, Guo, Jones, 2018): 12 layers, d 512, 8 heads, d_inner 2048,
# context 512, a position table per layer, trained with all three auxiliary losses (Chapter 2:
# every position, every layer, one extra byte ahead at weight 0.5). Ours: 20k steps of 32
# windows and dropout 0.1; the paper trains far longer with heavier dropout.
CHAR_PRESETS["t12"] = Preset(
    dict(CHAR_PRESETS["base"].model, pos="per_layer"), CHAR_PRESETS["base"].train,
    dict(aux_losses="positions,layers,targets", aux_targets=1), paper=True,
    help="Al-Rfou et al. (2018), 12 layers, d 512, context 512, with Chapter 2's auxiliary "
         "losses")
CHAR_FIELD_HELP = {"block_size": "the window length", "pos": "absolute positions: per_layer, "
              "sinusoid or none", "norm": "layer norm before (pre) or after (post) each sublayer"}

CHAR = ModelKind(
    "char", "Chapter 1's CharTransformer, trained on random windows",
    CharTransformerConfig, CharTransformer, "block_size", CHAR_PRESETS,
    objective=AUX_OBJECTIVE, no_decay=("pos",),  # learned absolute positions [L, T, C]
    flops=char_flops, causal_flops=char_causal_flops, field_help=CHAR_FIELD_HELP, reach=window_reach, cpu_bf16=True,
    kernel=window_kernel("PyTorch's fused causal attention (scaled_dot_product_attention: "
                         "the n x n weights never written out)"),
    bench={"char": BenchArm(objective=dict(aux_losses="positions"),
                            help="Chapter 1's dense model, the next-byte loss at every position"),
           "char+aux": BenchArm(objective=dict(aux_losses="positions,layers,targets",
                                               aux_targets=1),
                                help="the same with Chapter 2's auxiliary losses")})
