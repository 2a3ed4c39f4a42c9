"""Checkers for Chapter 6's exercises (the SegTree Transformer): leaf_context,
causal_tree_graph and gathered_attention, compared with the tree of minixl.segtree or
with dense attention over the gathered nodes. Hand-written (not generated).
"""

from __future__ import annotations

import math
from typing import Callable

import torch

from ._common import _call, _verdict


_TREE_CASES = [(16, 7, 1), (16, 0, 1), (16, 15, 2), (11, 5, 1), (13, 12, 1), (100, 37, 2),
               (1, 0, 1), (33, 20, 3)]


def _reference_spans(n: int, i: int, k: int, causal: bool) -> list[tuple[int, int]]:
    from .. import segtree
    return sorted(segtree.node_span(n, level, p)
                  for level, p, _ in segtree.leaf_context_loop(n, i, k=k, causal=causal))


def leaf_context(fn: Callable[..., list]) -> bool:
    """Check fn(n, i, k=1, causal=False) -> the spans (first, last) of the nodes leaf i reads:
    disjoint, covering 0..n-1 (0..i when causal), and exactly the tree's nodes."""
    cases = [(n, i, k, causal) for n, i, k in _TREE_CASES for causal in (False, True)]
    for n, i, k, causal in cases:
        where = f"for n={n}, leaf {i}, k={k}{', causal' if causal else ''}"
        got, err = _call(fn, n, i, k=k, causal=causal)
        if err:
            return _verdict("leaf_context", f"{where}: {err}", len(cases))
        try:
            spans = sorted((int(a), int(b)) for a, b in got)
        except (TypeError, ValueError):
            return _verdict("leaf_context", f"{where}: expected a list of (first, last) pairs, "
                            f"got {got!r}", len(cases))
        want = _reference_spans(n, i, k, causal)
        if spans == want:
            continue
        covered = [b for a, z in spans for b in range(a, z + 1)]
        if any(z > n - 1 for _, z in spans):
            hint = (f"a span ends past the last byte {n - 1}: when n is not a power of two, "
                    "a node's span is cut at n - 1.")
        elif causal and any(z > i for _, z in spans):
            hint = ("a span reaches past the leaf: in the causal variant a leaf reads no right "
                    "neighbours and no node that covers a later byte.")
        elif len(covered) != len(set(covered)):
            hint = ("spans overlap: a leaf reads each byte through exactly one node. An ancestor "
                    "of the leaf (or a node taken twice) covers bytes already covered.")
        elif sorted(covered) != list(range(i + 1 if causal else n)):
            missing = sorted(set(range(i + 1 if causal else n)) - set(covered))
            hint = (f"bytes {missing[:6]} are not covered: when the covered block's edge does not "
                    "line up with the next level's nodes, one node of the level below must fill "
                    "the gap before moving up.")
        else:
            hint = (f"the spans cover the sequence but are not the tree's nodes: expected "
                    f"{want}, got {spans}. Node p of level j covers [p 2^j, (p+1) 2^j - 1]; "
                    "align to the level before taking its k nodes.")
        return _verdict("leaf_context", f"{where}: {hint}", len(cases))
    return _verdict("leaf_context", None, len(cases))


def causal_tree_graph(fn: Callable[[int, int], torch.Tensor]) -> bool:
    """Check fn(n, k) -> bool [N, N] over all nodes (leaves 0..n-1, then each level in turn):
    leaves read themselves and their causal context, internal nodes themselves and the
    leaves under them."""
    from .. import segtree
    cases = [(16, 1), (11, 1), (33, 2), (1, 1), (7, 3)]
    for n, k in cases:
        where = f"for n={n}, k={k}"
        got, err = _call(fn, n, k)
        if err:
            return _verdict("causal_tree_graph", f"{where}: {err}", len(cases))
        graph = segtree.segtree_graph(n, k, causal=True)
        want = segtree.graph_mask(graph)[0]
        if not isinstance(got, torch.Tensor) or got.dtype != torch.bool or got.shape != want.shape:
            return _verdict("causal_tree_graph", f"{where}: expected a bool tensor of shape "
                            f"{tuple(want.shape)} (N = {graph.n_nodes} nodes), got "
                            f"{getattr(got, 'dtype', type(got).__name__)} "
                            f"{tuple(getattr(got, 'shape', ()))}", len(cases))
        if torch.equal(got, want):
            continue
        spans = torch.tensor([segtree.node_span(n, level, p) for level, size in
                              enumerate(graph.sizes) for p in range(size)])
        extra, missing = got & ~want, want & ~got
        if not got.diagonal().all():
            hint = "a node does not read itself: every node has a self edge."
        elif extra[:n].any():
            i, j = extra[:n].nonzero()[0].tolist()
            hint = (f"leaf {i} reads node {j} (bytes {spans[j].tolist()}), which it must not: "
                    + ("that node covers a later byte." if spans[j][1] > i else
                       "its span overlaps another node the leaf reads."))
        elif extra[n:].any():
            i, j = extra[n:].nonzero()[0].tolist()
            hint = (f"internal node {n + i} (bytes {spans[n + i].tolist()}) reads node {j}: an "
                    "internal node reads only itself and the leaves under it.")
        else:
            i, j = missing.nonzero()[0].tolist()
            hint = (f"node {i} should read node {j} (bytes {spans[j].tolist()}) but does not: "
                    + ("a leaf's context must cover every earlier byte." if i < n else
                       "an internal node reads every leaf under it."))
        return _verdict("causal_tree_graph", f"{where}: {hint}", len(cases))
    return _verdict("causal_tree_graph", None, len(cases))


def gathered_attention(fn: Callable[..., torch.Tensor]) -> bool:
    """Check fn(q, k, v, index, valid) -> [B, G, H, D]: query g (q [B, G, H, D]) attends to the
    nodes index[g] (k, v [B, N, H, D]) where valid[g] is True, scaled by 1/sqrt(D)."""
    g = torch.Generator().manual_seed(0)
    cases = [(2, 5, 7, 3, 2, 4), (1, 9, 12, 6, 4, 8), (3, 1, 4, 4, 1, 2)]
    for B, G, N, Dn, H, D in cases:
        q, k, v = (torch.randn(B, n, H, D, generator=g) for n in (G, N, N))
        index = torch.randint(N, (G, Dn), generator=g)
        valid = torch.rand(G, Dn, generator=g) < 0.6
        valid[:, 0] = True
        index = torch.where(valid, index, 0)  # padding points at node 0
        where = f"for q {tuple(q.shape)}, k {tuple(k.shape)}, index {tuple(index.shape)}"
        got, err = _call(fn, q, k, v, index, valid)
        if err:
            return _verdict("gathered_attention", f"{where}: {err}", len(cases))

        def dense(scale=True, mask=True):
            scores = torch.einsum("bghd,bgnhd->bghn", q, k[:, index])
            scores = scores / math.sqrt(D) if scale else scores
            if mask:
                scores = scores.masked_fill(~valid[:, None, :], float("-inf"))
            return torch.einsum("bghn,bgnhd->bghd", torch.softmax(scores, -1), v[:, index])

        want = dense()
        if not isinstance(got, torch.Tensor) or got.shape != want.shape:
            return _verdict("gathered_attention", f"{where}: expected shape {tuple(want.shape)}, "
                            f"got {tuple(getattr(got, 'shape', ()))}", len(cases))
        if torch.allclose(got, want, atol=1e-5):
            continue
        if torch.allclose(got, dense(mask=False), atol=1e-5):
            hint = ("padding is attended to: mask the scores where valid is False (to -inf) "
                    "before the softmax; padded slots point at node 0.")
        elif torch.allclose(got, dense(scale=False), atol=1e-5):
            hint = "the scores are not scaled: divide q . k by sqrt(D) before the softmax."
        else:
            hint = ("the values differ from attention over the gathered neighbours: softmax over "
                    "each query's neighbours (the last dimension), then the weighted sum of v.")
        return _verdict("gathered_attention", f"{where}: {hint}", len(cases))
    return _verdict("gathered_attention", None, len(cases))
