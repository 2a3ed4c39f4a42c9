"""Chapter 5's kind: `xlnet`, XLNet with the permutation objective.

Hand-written glue (not generated). `XLNET` is the kind `minixl train --model xlnet` builds. Declaring registers nothing: the registry
(`minixl.kinds`) names this module in its table and imports it when the kind is first used.
"""

from __future__ import annotations

from dataclasses import replace

import torch.nn as nn

from ..model_kind import BenchArm, ModelKind, Objective, Preset, SMALL_TRAIN, TINY_TRAIN, count_weights, window_kernel
from ..transformer_xl.kind import memory_reach
from . import PermutationObjective, XLNet, XLNetConfig, xlnet_batches

__all__ = ["XLNET"]


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
    row = 2 * C * C + 2 * C * c.d_inner  # W_q, W_o and the feed-forward, per row
    attention = C * (4 * T - 1)  # per row
    weights = count_weights(model) - L * C * C + V * C * (P / T - 1) + L * row * P / T
    return 6 * weights + 6 * L * attention * (T + P) / T - 4 * (row + attention)


def _xlnet_causal_flops(model: nn.Module) -> float:
    """Training FLOPs per token, causal policy: _xlnet_flops with each row charged only the
    keys its factorisation masks keep, its content score, position score and weighted sum, 3 C
    a key. The T - P context bytes share rank 0 and read one another both ways (T - P keys
    each); the predicted byte of rank r reads T - P + r keys in the content stream and
    T - P + r - 1 in the query stream: T^2 pairs a window in all, 6 L 3 C T a token."""
    c = model.config
    T, P, C, L = c.seq_len, c.n_predict, c.d_model, c.n_layer
    row = 2 * C * C + 2 * C * c.d_inner
    kernel = C * (4 * T - 1)  # _xlnet_flops' attention per row
    content = 3 * C * ((T - P) * T + P * (P + 1) / 2) / T  # per content row, on average
    return (_xlnet_flops(model) - 6 * L * kernel * (T + P) / T + 4 * kernel
            + 6 * L * 3 * C * T - 4 * content)


def _permutation_objective(model_cfg) -> nn.Module:
    return PermutationObjective("permutation")


# n_predict = seq_len / K with K about 6: Yang et al. (2019) predict the last 1/K of each
# order, K = 6 for XLNet-Large (their ablation of the base model also tries 7). The presets
# train on random windows without memory (mem_len 0; sampling then re-reads the last
# seq_len - 1 bytes at each step, XLNet.step); --mem-len M > 0 trains on ordered streams with
# a memory of M carried across segments, as the paper does (its memory is 384).
_XLNET_BASE = Preset(
    dict(n_layer=12, d_model=768, n_head=12, d_inner=3072, seq_len=512, n_predict=85,
         dropout=0.1, dropatt=0.1),
    dict(steps=20000, batch_size=32, lr=4e-4, warmup=1000, eval_every=1000, ckpt_every=1000,
         eval_bytes=1 << 20))
_XLNET_PRESETS = {
    "tiny": Preset(dict(n_layer=4, d_model=128, n_head=4, d_inner=512, seq_len=128,
                        n_predict=21), TINY_TRAIN),
    "small": Preset(dict(n_layer=8, d_model=256, n_head=8, d_inner=1024, seq_len=256,
                         n_predict=43), SMALL_TRAIN),
    # The XLNet-Base shape (Yang et al. 2019); the optimiser settings are ours (the paper
    # trains far longer, on far larger batches).
    "base": _XLNET_BASE,
    # xlnet-base: the XLNet-Base shape of "XLNet: Generalized Autoregressive Pretraining for
    # Language Understanding" (Yang et al., 2019): 12 layers, d 768, 12 heads, d_inner 3072,
    # windows of 512, K about 6. Ours: bytes, not word pieces; 20k steps of 32 windows (the
    # paper trains 500k steps of 8,192 sequences); no memory across windows unless --mem-len
    # is given (the paper's is 384).
    "xlnet-base": replace(_XLNET_BASE, paper=True, help="Yang et al. (2019), XLNet-Base: 12 "
                          "layers, d 768, windows of 512"),
}

def _has_memory(config) -> bool:
    """XLNet trains on ordered streams, its memory carried, when it has one (--mem-len)."""
    return config.mem_len > 0


def _xlnet_kernel(config) -> str:
    what = ("eager two-stream attention: scores and weights written out for both streams, "
            "the relative shift")
    if config.mem_len:
        return f"{what}; a memory of {config.mem_len} states per layer carried"
    return window_kernel(what)(config)


XLNET = ModelKind(
    "xlnet", "Chapter 5's XLNet with the permutation objective (random windows; ordered "
    "streams with the memory carried across segments when --mem-len > 0)",
    XLNetConfig, XLNet, "seq_len", _XLNET_PRESETS, streams=_has_memory,
    batch_source=xlnet_batches,
    protocols=("infill", "all-positions", "memory"), eval_overrides=("mem_len", "clamp_len"),
    objective=Objective(_permutation_objective),
    # u, v and the segment bias [H, D]; the two segment encodings s+, s- [2, H, D]
    no_decay=("r_w_bias", "r_r_bias", "r_s_bias", "seg_embed"),
    flops=_xlnet_flops, causal_flops=_xlnet_causal_flops,
    reach=lambda c: memory_reach(c.seq_len, c.mem_len, c.n_layer, "window"),
    kernel=_xlnet_kernel,
    bench={"xlnet": BenchArm(per_length=("n_predict",),
                             help="Chapter 5's XLNet, the permutation objective on random "
                                  "windows, about a sixth of each window predicted")},
    field_help={
        "seq_len": "the window length", "mem_len": "memory length per layer (0 = none: "
        "training reads random windows; > 0: ordered streams, the memory carried from segment "
        "to segment, as the paper pretrains)", "clamp_len": "cap on relative distances "
        "(0 = none)",
        "reuse_len": "0 = segments of the stream, all cached as memory; > 0: the paper's "
        "pretraining input [reuse block of this many bytes; A, SEP, B, SEP, CLS], B by a coin "
        "flip from elsewhere, only the reuse block cached (the paper: 256 of 512)",
        "bi_data": "half of each batch reads the streams backwards, its distances negated "
        "(the paper's bi_data)",
        "n_predict": "bytes predicted per window, the last of a random factorisation order "
                     "(partial prediction, K = seq-len / n-predict)"})
