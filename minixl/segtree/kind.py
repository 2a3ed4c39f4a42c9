"""Chapter 6's kind: `segtree`, the SegTree Transformer as a causal language model.

Hand-written glue (not generated). `SEGTREE` is the kind `minixl train --model segtree` builds (its bench arms: the SegTree
rule and BP-Transformer's); `segtree_memory` estimates what one training step allocates. Declaring registers nothing: the registry
(`minixl.kinds`) names this module in its table and imports it when the kind is first used.
"""

from __future__ import annotations

from dataclasses import replace

import torch.nn as nn

from ..model_kind import BenchArm, ModelKind, Preset, SMALL_TRAIN, TINY_TRAIN, count_weights, window_kernel, window_reach
from . import SegTreeConfig, SegTreeTransformer, segtree_graph, tree_sizes

__all__ = ["segtree_memory", "SEGTREE"]


def _segtree_flops(model: nn.Module) -> float:
    """Training FLOPs per token: 6N for the weights (applied to every node, leaves and internal,
    about 2 per byte) plus, per layer, the scores and weighted sums over the graph's edges,
    12 C x edges per byte, counted in full. The byte embedding is a lookup, not a product;
    the head multiplies at the leaves only, tied to the embedding or not (a tied table is
    one parameter, counted once by count_weights)."""
    c = model.config
    graph = segtree_graph(c.block_size, rule=c.rule, k=c.k, causal=c.causal)
    edges = sum(int(g.valid.sum()) for g in graph.groups)
    tied = model.head.weight is model.tok.weight
    node_params = (count_weights(model) - model.tok.weight.numel()
                   - (0 if tied else model.head.weight.numel()))
    per_byte = graph.n_nodes / c.block_size
    return 6 * (node_params * per_byte + model.head.weight.numel()) + (
        12 * c.n_layer * c.d_model * edges / c.block_size)


def segtree_memory(c: SegTreeConfig, batch_size: int) -> float:
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
# step at batch 4: about 32 GiB by segtree_memory); segtree-base: BPT's own rule, k = 64, at
# a context that fits. The optimiser settings are ours.
_SEGTREE_BASE = Preset(
    dict(n_layer=12, d_model=512, n_head=8, d_inner=2048, block_size=8192, dropout=0.1),
    dict(steps=20000, batch_size=4, lr=4e-4, warmup=1000, eval_every=1000, ckpt_every=1000,
         eval_bytes=1 << 20))
_SEGTREE_PRESETS = {
    "tiny": Preset(dict(n_layer=4, d_model=128, n_head=4, d_inner=512, block_size=128), TINY_TRAIN),
    "small": Preset(dict(n_layer=8, d_model=256, n_head=8, d_inner=1024, block_size=512),
                    dict(SMALL_TRAIN, batch_size=16)),
    "base": _SEGTREE_BASE,
    # segtree-base: the enwik8 model of "BP-Transformer: Modelling Long-Range Context via
    # Binary Partitioning" (Ye et al., 2019): 12 layers, d 512, 8 heads, d_inner 2048, BPT's
    # rule with k 64, but a context of 1,024 where the paper's is 8,192. BPT's rule runs on
    # the gathered path, which keeps every neighbour's key and value: at 8,192 one step at
    # batch 4 would need about 790 GiB (segtree_memory), at 1,024 and batch 2 about 30 GiB,
    # well inside one 80 GB GPU. Ours: 20k steps of 2 windows and our optimiser settings;
    # relative positions on the tree as Chapter 6 builds them.
    "segtree-base": replace(_SEGTREE_BASE,
                            model=dict(_SEGTREE_BASE.model, rule="bpt", k=64, block_size=1024),
                            train=dict(_SEGTREE_BASE.train, batch_size=2),
                            paper=True, help="Ye et al. (2019), BP-Transformer: 12 layers, "
                            "d 512, BPT's rule with k 64; context 1024, not the paper's 8192 "
                            "(about 790 GiB at batch 4 on the gathered path)"),
}

def _segtree_kernel(config) -> str:
    what = ("Chapter 6's tree kernel (each leaf's causal cover, level by level, padded slots)"
            if config.rule == "segtree" else
            f"gathered attention over BPT's edges (k = {config.k}, padded to the most a node "
            "has)")
    return window_kernel(what)(config)


SEGTREE = ModelKind(
    "segtree", "Chapter 6's SegTree Transformer (causal, tree attention, --rule, --k)",
    SegTreeConfig, _segtree_lm, "block_size", _SEGTREE_PRESETS,
    no_decay=("rel_k",),  # a key offset per edge type: the tree's relative positions
    flops=_segtree_flops, memory=segtree_memory, reach=window_reach, kernel=_segtree_kernel,
    # every other arm's model ties its head to its embedding, so the bench ties this one too:
    # the arms then differ in their attention, not in 15k untied output weights
    bench={"segtree": BenchArm(model=dict(tie_head=True),
                               help="Chapter 6's SegTree Transformer, the seed's rule, its "
                                    "head tied to the byte embedding as the other arms' are"),
           "bpt": BenchArm(model=dict(rule="bpt", k=4, tie_head=True),
                           help="the same model with BP-Transformer's rule, k = 4")},
    field_help={"block_size": "the window length",
                "rule": "which nodes a leaf reads: segtree (the SegTree paper's minimal cover) "
                        "or bpt (BP-Transformer's k nodes per side and level)",
                "k": "nodes per side and level (--rule bpt only)",
                "norm": "layer norm before (pre) or after (post) each sublayer",
                "causal": "no right context (a language model must be causal)",
                "tie_head": "read the logits through the byte embedding (one table in and "
                            "out, as the other chapters' models; the bench's arms tie it)",
                "n_classes": "classes read from the root (0 = none; a language model has "
                             "none)"})
