"""Chapter 3's kind: `shaw`, Chapter 1's model with Shaw et al.'s relative attention.

Hand-written glue (not generated). `ShawConfig` is its config, `SHAW` the kind `minixl train --model shaw` builds. Declaring registers nothing: the registry
(`minixl.kinds`) names this module in its table and imports it when the kind is first used.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch.nn as nn

from ..aux_losses.kind import (AUX_OBJECTIVE, CHAR_FIELD_HELP, CHAR_PRESETS, char_causal_flops,
                               char_flops)
from ..char_transformer import CharTransformer, CharTransformerConfig
from ..model_kind import BenchArm, ModelKind, window_kernel, window_reach
from . import shaw_factory

__all__ = ["ShawConfig", "SHAW"]


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


def _shaw_flops(model: nn.Module) -> float:
    """Training FLOPs per token: Chapter 1's count, but Shaw's relative terms as minixl
    computes them, per distance and not per pair (Chapter 3.5): each query against the 2K + 1
    key offsets a^K, and the weights summed per distance against the value offsets a^V, 12 L
    (2K + 1) C (not 6 per weight of a^K and a^V, which serve every head)."""
    c = model.config
    tables = sum(p.numel() for n, p in model.named_parameters() if n.endswith(("w_k", "w_v")))
    return (char_flops(model) - 6 * tables
            + 12 * c.n_layer * (2 * c.max_relative + 1) * c.d_model)


def _shaw_causal_flops(model: nn.Module) -> float:
    """Training FLOPs per token, causal policy: Chapter 1's causal count, and Shaw's relative
    terms against the K + 1 offsets a causal query can meet (distances 0 to K back; the K
    forward ones are masked), 12 L (K + 1) C: per distance, as minixl computes them, each of
    the K + 1 for every query, though a query fewer than K bytes into its window meets fewer
    of them."""
    c = model.config
    return (_shaw_flops(model) - char_flops(model) + char_causal_flops(model)
            - 12 * c.n_layer * c.max_relative * c.d_model)


SHAW = ModelKind(
    "shaw", "Chapter 1's model with Chapter 3's relative attention (--max-relative)",
    ShawConfig, lambda c: CharTransformer(c, attention=shaw_factory(c.max_relative)),
    "block_size", {n: p for n, p in CHAR_PRESETS.items() if not p.paper},
    objective=AUX_OBJECTIVE,
    no_decay=("w_k", "w_v"),  # relative positions a^K, a^V, one row per clipped distance
    flops=_shaw_flops, causal_flops=_shaw_causal_flops, reach=window_reach,
    kernel=window_kernel("eager: the n x n scores and weights written out, Shaw's terms per "
                         "clipped distance (Chapter 3's bucket form; the gathered one up to "
                         "16 x 16 pairs)"),
    field_help=CHAR_FIELD_HELP | {"max_relative": "the clipping distance K of relative attention"},
    bench={"shaw": BenchArm(objective=dict(aux_losses="positions"),
                            help="Chapter 3's relative attention, no absolute positions")})
