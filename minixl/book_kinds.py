"""The book's five model kinds: what `minixl train --model NAME` builds for each chapter's model.

Hand-written glue (not generated). Each chapter's model is one `minixl.model_kind.ModelKind`,
declared below with every fact about it in one place: its config and builder, how it trains,
its presets (the papers' shapes among them), its evaluation protocols, the weights that
weight decay leaves alone and its FLOP count. Declaring registers nothing: the registry
(`minixl.kinds`) imports this module and lists BOOK_KINDS. The trainer, the evaluation
protocols, the benchmark and the command line read only these entries.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import torch.nn as nn

from .aux_losses import AuxLossConfig, AuxLosses, AuxObjective
from .char_transformer import CharTransformer, CharTransformerConfig
from .model_kind import BenchArm, ModelKind, Objective, Preset
from .options import Option
from .relative_attention import shaw_factory
from .segtree import SegTreeConfig, SegTreeTransformer, segtree_graph, tree_sizes
from .transformer_xl import TransformerXL, TransformerXLConfig
from .xlnet import PermutationObjective, XLNet, XLNetConfig, xlnet_batches

__all__ = ["ShawConfig", "parse_aux_losses", "AUX_OBJECTIVE", "BOOK_KINDS"]

# ==================================================================== the built-in kinds

# tiny: a few CPU minutes; small: a long CPU run or a short GPU one; base: the papers' shapes.
_TINY = dict(steps=600, batch_size=32, lr=2e-3, eval_every=100, ckpt_every=200)
_SMALL = dict(steps=3000, batch_size=32, lr=1e-3, eval_every=250, ckpt_every=500)


def _count_weights(model: nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())


# ---------------------------------------------------------------- Chapters 1-3: char, shaw

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


def _window_reach(config) -> tuple[int, str]:
    """A byte is predicted from at most the window's worth of bytes before it."""
    return config.block_size, f"a window of {config.block_size} bytes"


def _memory_reach(T: int, M: int, L: int, unit: str = "segment") -> tuple[int, str]:
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


def _char_flops(model: nn.Module) -> float:
    """Training FLOPs per token: 6N for the weights (forward and backward; position tables
    are additions, not products) plus 12 L T C for the attention scores, counted in full (the
    PaLM convention) although a causal kernel skips half."""
    c = model.config
    n_matmul = _count_weights(model)
    n_matmul -= model.pos.numel() if getattr(model, "pos", None) is not None else 0
    return 6 * n_matmul + 12 * c.n_layer * c.block_size * c.d_model


def _shaw_flops(model: nn.Module) -> float:
    """Training FLOPs per token: Chapter 1's count, but Shaw's relative terms as minixl
    computes them, per distance and not per pair (Chapter 3.5): each query against the 2K + 1
    key offsets a^K, and the weights summed per distance against the value offsets a^V, 12 L
    (2K + 1) C (not 6 per weight of a^K and a^V, which serve every head)."""
    c = model.config
    tables = sum(p.numel() for n, p in model.named_parameters() if n.endswith(("w_k", "w_v")))
    return (_char_flops(model) - 6 * tables
            + 12 * c.n_layer * (2 * c.max_relative + 1) * c.d_model)


_CHAR_PRESETS = {
    "tiny": Preset(dict(n_layer=4, d_model=128, n_head=4, d_inner=512, block_size=128), _TINY),
    "small": Preset(dict(n_layer=8, d_model=256, n_head=8, d_inner=1024, block_size=256), _SMALL),
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
_CHAR_PRESETS["t12"] = Preset(
    dict(_CHAR_PRESETS["base"].model, pos="per_layer"), _CHAR_PRESETS["base"].train,
    dict(aux_losses="positions,layers,targets", aux_targets=1), paper=True,
    help="Al-Rfou et al. (2018), 12 layers, d 512, context 512, with Chapter 2's auxiliary "
         "losses")
_CHAR_HELP = {"block_size": "the window length", "pos": "absolute positions: per_layer, "
              "sinusoid or none", "norm": "layer norm before (pre) or after (post) each sublayer"}

CHAR = ModelKind(
    "char", "Chapter 1's CharTransformer, trained on random windows",
    CharTransformerConfig, CharTransformer, "block_size", _CHAR_PRESETS,
    objective=AUX_OBJECTIVE, no_decay=("pos",),  # learned absolute positions [L, T, C]
    flops=_char_flops, field_help=_CHAR_HELP, reach=_window_reach, cpu_bf16=True,
    bench={"char": BenchArm(objective=dict(aux_losses="positions"),
                            help="Chapter 1's dense model, the next-byte loss at every position"),
           "char+aux": BenchArm(objective=dict(aux_losses="positions,layers,targets",
                                               aux_targets=1),
                                help="the same with Chapter 2's auxiliary losses")})

SHAW = ModelKind(
    "shaw", "Chapter 1's model with Chapter 3's relative attention (--max-relative)",
    ShawConfig, lambda c: CharTransformer(c, attention=shaw_factory(c.max_relative)),
    "block_size", {n: p for n, p in _CHAR_PRESETS.items() if not p.paper},
    objective=AUX_OBJECTIVE,
    no_decay=("w_k", "w_v"),  # relative positions a^K, a^V, one row per clipped distance
    flops=_shaw_flops, reach=_window_reach,
    field_help=_CHAR_HELP | {"max_relative": "the clipping distance K of relative attention"},
    bench={"shaw": BenchArm(objective=dict(aux_losses="positions"),
                            help="Chapter 3's relative attention, no absolute positions")})


# ---------------------------------------------------------------- Chapter 4: Transformer-XL

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
    return (6 * (_count_weights(model) - r_params) + 6 * qkv_params * M / T
            + 18 * c.n_layer * Tk * c.n_head * c.d_head)


_XL_BASE = Preset(
    dict(n_layer=12, d_model=512, n_head=8, d_head=64, d_inner=2048, tgt_len=512, mem_len=512,
         dropout=0.1),
    dict(steps=20000, batch_size=22, lr=2.5e-4, warmup=0, grad_clip=0.25, eval_every=1000,
         ckpt_every=1000, eval_bytes=1 << 20))
_XL_PRESETS = {
    "tiny": Preset(dict(n_layer=4, d_model=128, n_head=4, d_head=32, d_inner=512, tgt_len=128,
                        mem_len=128, pre_lnorm=True), _TINY),
    "small": Preset(dict(n_layer=8, d_model=256, n_head=8, d_head=32, d_inner=1024, tgt_len=256,
                         mem_len=256, pre_lnorm=True), _SMALL),
    # Dai et al.'s 12-layer enwik8 model and optimiser settings (the paper trains 400k steps).
    "base": _XL_BASE,
    # xl-base: the 12-layer enwik8 model of "Transformer-XL: Attentive Language Models Beyond
    # a Fixed-Length Context" (Dai et al., 2019): 12 layers, d 512, 8 heads of 64, d_inner
    # 2048, tgt_len and mem_len 512, dropout 0.1, batch 22, lr 2.5e-4 (cosine), gradient clip
    # 0.25, post-norm. Ours: 20k steps instead of the paper's 400k.
    "xl-base": replace(_XL_BASE, paper=True, help="Dai et al. (2019), 12 layers, d 512, tgt "
                       "and mem 512 (20k steps, not 400k)"),
}

XL = ModelKind(
    "xl", "Chapter 4's Transformer-XL, on ordered streams with its memory carried",
    TransformerXLConfig, TransformerXL, "tgt_len", _XL_PRESETS, streams=True,
    protocols=("memory", "all-positions", "sliding"),
    no_decay=("r_w_bias", "r_r_bias"),  # the global content and position biases u, v [H, D]
    flops=_xl_flops, eval_overrides=("tgt_len", "mem_len", "clamp_len"),
    reach=lambda c: _memory_reach(c.tgt_len, c.mem_len, c.n_layer),
    bench={"xl": BenchArm(per_length=("mem_len",),
                          help="Chapter 4's Transformer-XL on ordered streams, a memory as long "
                               "as its segment")},
    field_help={
        "tgt_len": "the segment length", "mem_len": "memory length per layer (0 = none)",
        "clamp_len": "cap on relative distances (0 = none)", "d_head": "width of one head",
        "pre_lnorm": "layer norm before each sublayer (tiny, small) or after it (base, as "
                     "the paper)",
        "pos": "relative (the paper's) or absolute (the ablation's sinusoid, restarted every "
               "segment)",
        "attention_impl": "eager (the chapter's code), sdpa or flex (fused kernels; Chapter "
                          "4.11)"})


# ---------------------------------------------------------------- Chapter 5: XLNet

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
    weights = _count_weights(model) - L * C * C + V * C * (P / T - 1) + L * row * P / T
    return 6 * weights + 6 * L * attention * (T + P) / T - 4 * (row + attention)


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
                        n_predict=21), _TINY),
    "small": Preset(dict(n_layer=8, d_model=256, n_head=8, d_inner=1024, seq_len=256,
                         n_predict=43), _SMALL),
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


XLNET = ModelKind(
    "xlnet", "Chapter 5's XLNet with the permutation objective (random windows; ordered "
    "streams with the memory carried across segments when --mem-len > 0)",
    XLNetConfig, XLNet, "seq_len", _XLNET_PRESETS, streams=_has_memory,
    batch_source=xlnet_batches,
    protocols=("infill", "all-positions", "memory"), eval_overrides=("mem_len", "clamp_len"),
    objective=Objective(_permutation_objective),
    # u, v and the segment bias [H, D]; the two segment encodings s+, s- [2, H, D]
    no_decay=("r_w_bias", "r_r_bias", "r_s_bias", "seg_embed"),
    flops=_xlnet_flops,
    reach=lambda c: _memory_reach(c.seq_len, c.mem_len, c.n_layer, "window"),
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


# ---------------------------------------------------------------- Chapter 6: SegTree

def _segtree_flops(model: nn.Module) -> float:
    """Training FLOPs per token: 6N for the weights (applied to every node, leaves and internal,
    about 2 per byte) plus, per layer, the scores and weighted sums over the graph's edges,
    12 C x edges per byte, counted in full."""
    c = model.config
    graph = segtree_graph(c.block_size, rule=c.rule, k=c.k, causal=c.causal)
    edges = sum(int(g.valid.sum()) for g in graph.groups)
    node_params = _count_weights(model) - model.tok.weight.numel() - model.head.weight.numel()
    per_byte = graph.n_nodes / c.block_size
    return 6 * (node_params * per_byte + model.head.weight.numel()) + (
        12 * c.n_layer * c.d_model * edges / c.block_size)


def _segtree_memory(c: SegTreeConfig, batch_size: int) -> float:
    """Bytes of one forward and backward pass over batch_size windows, roughly (float32): the
    weights, their gradients and AdamW's two moments; what autograd keeps of every layer; and
    what the backward pass of one layer adds while it runs. On the gathered path (BPT's rule)
    the layer's share is dominated by every padded neighbour slot's gathered key and value
    and the slot's score per head; on the fast path (the SegTree rule) by one weight per slot
    and head; on both by the projections and the feed-forward layer over all nodes."""
    n, d, B = c.block_size, c.d_model, batch_size
    sizes = tree_sizes(n)
    nodes = sum(sizes)
    params = c.n_layer * (4 * d * d + 2 * d * c.d_inner) + 2 * c.vocab_size * d
    if c.rule == "segtree":
        slots = n * (1 + 2 * len(sizes)) * c.n_head  # one weight per slot and head
        kept, grads = nodes * 3 * d + slots, nodes * 3 * d + 2 * slots
    else:
        graph = segtree_graph(n, rule=c.rule, k=c.k, causal=c.causal)
        slots = sum(g.index.numel() for g in graph.groups)  # padded neighbour slots
        kept, grads = slots * (2 * d + 2 * c.n_head), slots * (2 * d + 2 * c.n_head)
    kept += nodes * (8 * d + 2 * c.d_inner)  # norms, projections, the feed-forward layer
    grads += nodes * (6 * d + 2 * c.d_inner)
    return 4 * (4 * params + B * (c.n_layer * kept + grads))


def _segtree_lm(config: SegTreeConfig) -> nn.Module:
    """Chapter 6's SegTree as a language model: causal, read from the leaves."""
    if not config.causal or config.n_classes:
        raise ValueError("--model segtree trains a language model: it must be causal (no "
                         "right neighbours) and have no classifier (n_classes 0)")
    return SegTreeTransformer(config)


# The SegTree rule (the minimal cover) unless a preset says otherwise. base: BP-Transformer's
# enwik8 shape (Ye et al. 2019: 12 layers, context 8,192) with the SegTree rule (one training
# step at batch 4: about 32 GiB by _segtree_memory); segtree-base: BPT's own rule, k = 64, at
# a context that fits. The optimiser settings are ours.
_SEGTREE_BASE = Preset(
    dict(n_layer=12, d_model=512, n_head=8, d_inner=2048, block_size=8192, dropout=0.1),
    dict(steps=20000, batch_size=4, lr=4e-4, warmup=1000, eval_every=1000, ckpt_every=1000,
         eval_bytes=1 << 20))
_SEGTREE_PRESETS = {
    "tiny": Preset(dict(n_layer=4, d_model=128, n_head=4, d_inner=512, block_size=128), _TINY),
    "small": Preset(dict(n_layer=8, d_model=256, n_head=8, d_inner=1024, block_size=512),
                    dict(_SMALL, batch_size=16)),
    "base": _SEGTREE_BASE,
    # segtree-base: the enwik8 model of "BP-Transformer: Modelling Long-Range Context via
    # Binary Partitioning" (Ye et al., 2019): 12 layers, d 512, 8 heads, d_inner 2048, BPT's
    # rule with k 64, but a context of 1,024 where the paper's is 8,192. BPT's rule runs on
    # the gathered path, which keeps every neighbour's key and value: at 8,192 one step at
    # batch 4 would need about 790 GiB (_segtree_memory), at 1,024 and batch 2 about 30 GiB,
    # well inside one 80 GB GPU. Ours: 20k steps of 2 windows and our optimiser settings;
    # relative positions on the tree as Chapter 6 builds them.
    "segtree-base": replace(_SEGTREE_BASE,
                            model=dict(_SEGTREE_BASE.model, rule="bpt", k=64, block_size=1024),
                            train=dict(_SEGTREE_BASE.train, batch_size=2),
                            paper=True, help="Ye et al. (2019), BP-Transformer: 12 layers, "
                            "d 512, BPT's rule with k 64; context 1024, not the paper's 8192 "
                            "(about 790 GiB at batch 4 on the gathered path)"),
}

SEGTREE = ModelKind(
    "segtree", "Chapter 6's SegTree Transformer (causal, tree attention, --rule, --k)",
    SegTreeConfig, _segtree_lm, "block_size", _SEGTREE_PRESETS,
    no_decay=("rel_k",),  # a key offset per edge type: the tree's relative positions
    flops=_segtree_flops, memory=_segtree_memory, reach=_window_reach,
    bench={"segtree": BenchArm(help="Chapter 6's SegTree Transformer, the seed's rule"),
           "bpt": BenchArm(model=dict(rule="bpt", k=4),
                           help="the same model with BP-Transformer's rule, k = 4")},
    field_help={"block_size": "the window length",
                "rule": "which nodes a leaf reads: segtree (the SegTree paper's minimal cover) "
                        "or bpt (BP-Transformer's k nodes per side and level)",
                "k": "nodes per side and level (--rule bpt only)",
                "norm": "layer norm before (pre) or after (post) each sublayer",
                "causal": "no right context (a language model must be causal)",
                "n_classes": "classes read from the root (0 = none; a language model has "
                             "none)"})

BOOK_KINDS = (CHAR, SHAW, XL, XLNET, SEGTREE)  # the registry's first entries, in this order
