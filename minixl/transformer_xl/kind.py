"""Chapter 4's kind: `xl`, Transformer-XL on ordered streams with its memory carried.

Hand-written glue (not generated). `XL` is the kind `minixl train --model xl` builds; `memory_reach` counts how far back a
model with a memory reads (Chapter 5's XLNet uses it too). Declaring registers nothing: the registry
(`minixl.kinds`) names this module in its table and imports it when the kind is first used.
"""

from __future__ import annotations

from dataclasses import replace

import torch.nn as nn

from ..model_kind import BenchArm, ModelKind, Preset, SMALL_TRAIN, TINY_TRAIN, count_weights
from . import TransformerXL, TransformerXLConfig

__all__ = ["memory_reach", "XL"]


def memory_reach(T: int, M: int, L: int, unit: str = "segment") -> tuple[int, str]:
    """How far back from the byte predicted its prediction can read when each of L layers also
    reads a memory of the M states before its segment of T (Dai et al.'s O(N L) dependency,
    counted exactly): the last position of a segment, which predicts the next byte, reads
    back to M before its segment's start, a state there back to M before the start of its own
    segment, and so on down the layers."""
    if M == 0:
        return T, f"{unit}s of {T} bytes and no memory"
    p = e = (L * (M // T + 2) + 1) * T - 1  # the last position of a segment far enough in
    for _ in range(L):
        e = (e // T) * T - M
    return p + 1 - e, f"{L} layers, each reading a memory of {M} before its {unit} of {T}"


def _xl_flops(model: nn.Module) -> float:
    """Training FLOPs per token: 6N for the weights, and again for W_q, W_kE and W_v over the
    memory's M rows, which every segment projects afresh (M / T of them per token); W_kR is
    left out (it projects the Tk = T + M distances once per step, shared by the batch); the
    content and position scores and the weighted sum over Tk keys are three [T, Tk] products
    per layer, 18 L Tk (H D), counted in full."""
    c = model.config
    T, M, Tk = c.tgt_len, c.mem_len, c.tgt_len + c.mem_len
    r_params = sum(m.r_net.weight.numel() for m in model.modules() if hasattr(m, "r_net"))
    qkv_params = sum(m.qkv_net.weight.numel() for m in model.modules()
                     if hasattr(m, "qkv_net"))
    return (6 * (count_weights(model) - r_params) + 6 * qkv_params * M / T
            + 18 * c.n_layer * Tk * c.n_head * c.d_head)


def _xl_causal_flops(model: nn.Module) -> float:
    """Training FLOPs per token, causal policy: _xl_flops with each query charged only the keys
    it may read, the memory's M and (T + 1) / 2 of the segment's T on average, so
    18 L (M + (T + 1) / 2) (H D) for the three score and sum products."""
    c = model.config
    return _xl_flops(model) - 18 * c.n_layer * (c.tgt_len - 1) / 2 * c.n_head * c.d_head


_XL_BASE = Preset(
    dict(n_layer=12, d_model=512, n_head=8, d_head=64, d_inner=2048, tgt_len=512, mem_len=512,
         dropout=0.1),
    dict(steps=20000, batch_size=22, lr=2.5e-4, warmup=0, grad_clip=0.25, eval_every=1000,
         ckpt_every=1000, eval_bytes=1 << 20))
_XL_PRESETS = {
    "tiny": Preset(dict(n_layer=4, d_model=128, n_head=4, d_head=32, d_inner=512, tgt_len=128,
                        mem_len=128, pre_lnorm=True), TINY_TRAIN),
    "small": Preset(dict(n_layer=8, d_model=256, n_head=8, d_head=32, d_inner=1024, tgt_len=256,
                         mem_len=256, pre_lnorm=True), SMALL_TRAIN),
    # Dai et al.'s 12-layer enwik8 model and optimiser settings (the paper trains 400k steps).
    "base": _XL_BASE,
    # xl-base: the 12-layer enwik8 model of "Transformer-XL: Attentive Language Models Beyond
    # a Fixed-Length Context" (Dai et al., 2019): 12 layers, d 512, 8 heads of 64, d_inner
    # 2048, tgt_len and mem_len 512, dropout 0.1, batch 22, lr 2.5e-4 (cosine), gradient clip
    # 0.25, post-norm. Ours: 20k steps instead of the paper's 400k.
    "xl-base": replace(_XL_BASE, paper=True, help="Dai et al. (2019), 12 layers, d 512, tgt "
                       "and mem 512 (20k steps, not 400k)"),
}

def _xl_kernel(config) -> str:
    what = {"eager": "eager: scores and weights written out, the relative shift",
            "sdpa": "PyTorch's fused attention (sdpa), the relative terms folded into longer "
                    "query and key vectors (section 4.11)",
            "flex": "flex_attention, the relative terms computed in its score function"
            }.get(config.attention_impl, config.attention_impl)
    if not config.mem_len:
        return (f"{what}; segments of {config.tgt_len}, no memory: a one-byte call reads "
                f"the last {config.tgt_len - 1} bytes again")
    return (f"{what}; segments of {config.tgt_len} and a memory of {config.mem_len} states "
            "per layer: a one-byte call in inference reads the memory's cached keys and "
            "values (section 4.11)")


XL = ModelKind(
    "xl", "Chapter 4's Transformer-XL, on ordered streams with its memory carried",
    TransformerXLConfig, TransformerXL, "tgt_len", _XL_PRESETS, streams=True,
    protocols=("memory", "all-positions", "sliding"),
    no_decay=("r_w_bias", "r_r_bias"),  # the global content and position biases u, v [H, D]
    flops=_xl_flops, causal_flops=_xl_causal_flops, eval_overrides=("tgt_len", "mem_len", "clamp_len"),
    reach=lambda c: memory_reach(c.tgt_len, c.mem_len, c.n_layer), kernel=_xl_kernel,
    bench={"xl": BenchArm(per_length=("mem_len",),
                          help="Chapter 4's Transformer-XL on ordered streams, a memory as long "
                               "as its segment"),
           # the memory alone: the same model, data order, positions and reading, no memory
           "xl-nomem": BenchArm(model=dict(mem_len=0), control=True,
                                help="the same Transformer-XL with its memory switched off "
                                     "(mem_len 0): segments still read in order")},
    field_help={
        "tgt_len": "the segment length", "mem_len": "memory length per layer (0 = none)",
        "clamp_len": "cap on relative distances (0 = none)", "d_head": "width of one head",
        "pre_lnorm": "layer norm before each sublayer (tiny, small) or after it (base, as "
                     "the paper)",
        "pos": "relative (the paper's) or absolute (the ablation's sinusoid, restarted every "
               "segment)",
        "attention_impl": "eager (the chapter's code), sdpa or flex (fused kernels; Chapter "
                          "4.11)"})
