"""Checkers for Chapter 6's exercises (the SegTree Transformer): leaf_context (the SegTree
paper's minimal rule), bpt_context (BP-Transformer's k nodes per side and level),
causal_tree_graph, gathered_attention and sibling_scores (one level of the fast path),
compared with the tree of minixl.segtree or with dense attention over the gathered nodes.
Hand-written (not generated).
"""

from __future__ import annotations

import math
from typing import Callable

import torch

from .. import segtree
from ..check.verdicts import call, verdict


_TREE_CASES = [(16, 7, 1), (16, 3, 1), (16, 0, 1), (16, 15, 2), (11, 5, 1), (13, 12, 1),
               (100, 37, 2), (1, 0, 1), (2, 1, 1), (33, 20, 3)]


def _spans(n: int, i: int, causal: bool, **rule) -> list[tuple[int, int]]:
    return sorted(segtree.node_span(n, c.level, c.p)
                  for c in segtree.leaf_context_loop(n, i, causal=causal, **rule))


def _alignment_on_top(n: int, i: int, k: int, causal: bool) -> list[tuple[int, int]]:
    """The typical slip in BPT's rule (this book's first two editions made it): the alignment
    node of the level below taken in a slot of its own, before k more nodes of the level."""
    spans, lo, hi, level = [(i, i)], i, i + 1, 0
    while lo > 0 or (not causal and hi < n):
        half = (1 << level) >> 1
        if level and lo % (1 << level):
            spans.append((lo - half, lo - 1))
            lo -= half
        if level and not causal and hi < n and hi % (1 << level):
            spans.append((hi, min(hi + half, n) - 1))
            hi = min(hi + half, n)
        for _ in range(k):
            if lo > 0:
                spans.append((lo - (1 << level), lo - 1))
                lo -= 1 << level
            if not causal and hi < n:
                spans.append((hi, min(hi + (1 << level), n) - 1))
                hi = min(hi + (1 << level), n)
        level += 1
    return sorted(spans)


def _answer(fn: Callable, *args, **kwargs) -> tuple[list | None, str | None]:
    """fn's spans, sorted as (first, last) pairs, or None and what was wrong."""
    got, err = call(fn, *args, **kwargs)
    if err:
        return None, err
    try:
        return sorted((int(a), int(b)) for a, b in got), None
    except (TypeError, ValueError):
        return None, f"expected a list of (first, last) pairs, got {got!r}"


def _cover_hint(spans, n: int, i: int, causal: bool) -> str | None:
    """What is wrong with spans as a cover of the leaf's context, or None if it is one."""
    covered = [b for a, z in spans for b in range(a, z + 1)]
    if any(z > n - 1 for _, z in spans):
        return (f"a span ends past the last byte {n - 1}: when n is not a power of two, a "
                "node's span is cut at n - 1.")
    if causal and any(z > i for _, z in spans):
        return ("a span reaches past the leaf: in the causal variant a leaf reads no right "
                "neighbours and no node that covers a later byte.")
    if len(covered) != len(set(covered)):
        return ("spans overlap: a leaf reads each byte through exactly one node. An ancestor of "
                "the leaf (or a node taken twice) covers bytes already covered.")
    if sorted(covered) != list(range(i + 1 if causal else n)):
        missing = sorted(set(range(i + 1 if causal else n)) - set(covered))
        return (f"bytes {missing[:6]} are not covered: the spans together must cover "
                + ("every byte up to the leaf." if causal else "the whole sequence."))
    return None


def _check_spans(name: str, cases: list[tuple], fn: Callable, want: Callable,
                 hint: Callable) -> bool:
    """Call fn(n, i, [k,] causal=...) for each case (n, i, [k,] causal); the first answer that
    is not want(case) fails with hint(case, spans, wanted)."""
    for case in cases:
        *args, causal = case
        where = f"for n={args[0]}, leaf {args[1]}" + (f", k={args[2]}" if len(args) > 2 else "") \
            + (", causal" if causal else "")
        spans, err = _answer(fn, *args[:2], **({"k": args[2]} if len(args) > 2 else {}),
                             causal=causal)
        if err:
            return verdict(name, f"{where}: {err}", len(cases))
        wanted = want(case)
        if spans != wanted:
            return verdict(name, f"{where}: {hint(case, spans, wanted)}", len(cases))
    return verdict(name, None, len(cases))


def leaf_context(fn: Callable[..., list]) -> bool:
    """Check fn(n, i, causal=False) -> the spans (first, last) of the nodes leaf i reads under
    the SegTree rule: the smallest set that holds the leaf and its neighbours as nodes of their
    own and whose spans are disjoint and cover the rest (0..n-1, or 0..i when causal)."""

    def hint(case, spans, want):
        n, i, causal = case
        found = _cover_hint(spans, n, i, causal)
        if found is not None:
            return found
        neighbours = [(j, j) for j in (i - 1, i, i + 1) if 0 <= j < n and not (causal and j > i)]
        if spans == _spans(n, i, causal, rule="bpt", k=1):
            return (f"that is BP-Transformer's rule at k = 1 ({len(spans)} nodes), not the "
                    f"SegTree rule's minimal cover ({len(want)} nodes, {want}): where the block "
                    "beside a leaf lines up with a bigger node, take that one node.")
        if not set(neighbours) <= set(spans):
            return (f"the leaf and its neighbouring leaves {neighbours} must be nodes of their "
                    "own (the rule's condition 1), not parts of bigger spans.")
        if len(spans) > len(want):
            return (f"a valid cover, but not the smallest: {len(spans)} nodes where {len(want)} "
                    f"do ({want}). Walk up from the covered block's edges and take a sibling only "
                    "where the edge is not aligned to the level.")
        return (f"the spans cover the sequence but are not the tree's nodes: expected {want}, "
                f"got {spans}. Node p of level j covers [p 2^j, (p+1) 2^j - 1].")

    cases = [(n, i, causal) for n, i, _ in _TREE_CASES for causal in (False, True)]
    return _check_spans("leaf_context", cases, fn, lambda c: _spans(*c), hint)


def bpt_context(fn: Callable[..., list]) -> bool:
    """Check fn(n, i, k=1, causal=False) -> the spans (first, last) of the nodes leaf i reads
    under BP-Transformer's rule as its authors' graph builder walks it: k slots per side and
    level, the first of which holds the level below's node where the edge is off the grid."""

    def hint(case, spans, want):
        n, i, k, causal = case
        found = _cover_hint(spans, n, i, causal)
        if found is not None and "not covered" in found:
            return found + (" When the covered block's edge does not line up with the next "
                            "level's nodes, one node of the level below must fill the gap "
                            "before moving up.")
        if found is not None:
            return found
        if spans == _alignment_on_top(n, i, k, causal):
            return (f"the alignment node took a slot of its own: in BPT's graph builder it is "
                    f"the first of the level's k nodes on that side, not one more ({len(spans)} "
                    f"nodes where BPT reads {len(want)}: {want}).")
        return (f"the spans cover the sequence but are not BPT's nodes: expected {want}, got "
                f"{spans}. Align to the level before taking its k nodes on each side.")

    cases = [(n, i, k, causal) for n, i, k in _TREE_CASES for causal in (False, True)]
    return _check_spans("bpt_context", cases, fn,
                        lambda c: _spans(c[0], c[1], c[3], rule="bpt", k=c[2]), hint)


def causal_tree_graph(fn: Callable[[int], torch.Tensor]) -> bool:
    """Check fn(n) -> bool [N, N] over all nodes (leaves 0..n-1, then each level in turn) for
    the SegTree rule: leaves read themselves and their causal context, internal nodes the
    leaves under them (not themselves)."""
    cases = [16, 11, 33, 1, 7, 2]
    for n in cases:
        where = f"for n={n}"
        got, err = call(fn, n)
        if err:
            return verdict("causal_tree_graph", f"{where}: {err}", len(cases))
        graph = segtree.segtree_graph(n, causal=True)
        want = segtree.graph_mask(graph)[0]
        if not isinstance(got, torch.Tensor) or got.dtype != torch.bool or got.shape != want.shape:
            return verdict("causal_tree_graph", f"{where}: expected a bool tensor of shape "
                            f"{tuple(want.shape)} (N = {graph.n_nodes} nodes), got "
                            f"{getattr(got, 'dtype', type(got).__name__)} "
                            f"{tuple(getattr(got, 'shape', ()))}", len(cases))
        if torch.equal(got, want):
            continue
        spans = torch.tensor([segtree.node_span(n, level, p) for level, size in
                              enumerate(graph.sizes) for p in range(size)])
        extra, missing = got & ~want, want & ~got
        if not got.diagonal()[:n].all():
            hint = "a leaf does not read itself: every leaf has a self edge."
        elif got.diagonal()[n:].any():
            hint = ("an internal node reads itself: in the SegTree paper an internal node's only "
                    "predecessors are the leaves under it.")
        elif extra[:n].any():
            i, j = extra[:n].nonzero()[0].tolist()
            hint = (f"leaf {i} reads node {j} (bytes {spans[j].tolist()}), which it must not: "
                    + ("that node covers a later byte." if spans[j][1] > i else
                       "its span overlaps another node the leaf reads."))
        elif extra[n:].any():
            i, j = extra[n:].nonzero()[0].tolist()
            hint = (f"internal node {n + i} (bytes {spans[n + i].tolist()}) reads node {j}: an "
                    "internal node reads only the leaves under it.")
        else:
            i, j = missing.nonzero()[0].tolist()
            hint = (f"node {i} should read node {j} (bytes {spans[j].tolist()}) but does not: "
                    + ("a leaf's context must cover every earlier byte." if i < n else
                       "an internal node reads every leaf under it."))
        return verdict("causal_tree_graph", f"{where}: {hint}", len(cases))
    return verdict("causal_tree_graph", None, len(cases))


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
        got, err = call(fn, q, k, v, index, valid)
        if err:
            return verdict("gathered_attention", f"{where}: {err}", len(cases))

        def dense(scale=True, mask=True):
            scores = torch.einsum("bghd,bgnhd->bghn", q, k[:, index])
            scores = scores / math.sqrt(D) if scale else scores
            if mask:
                scores = scores.masked_fill(~valid[:, None, :], float("-inf"))
            return torch.einsum("bghn,bgnhd->bghd", torch.softmax(scores, -1), v[:, index])

        want = dense()
        if not isinstance(got, torch.Tensor) or got.shape != want.shape:
            return verdict("gathered_attention", f"{where}: expected shape {tuple(want.shape)}, "
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
        return verdict("gathered_attention", f"{where}: {hint}", len(cases))
    return verdict("gathered_attention", None, len(cases))


def _graph_level_scores(q, k_level, level: int, side: str) -> torch.Tensor:
    """The scores sibling_scores must give, read off the graph: for each leaf i, its edge of
    type (side, level + 1) under the SegTree rule, q_i . k of that node; -inf where none."""
    n = q.size(2)
    graph = segtree.segtree_graph(n)
    leaves = graph.groups[0]
    first = sum(graph.sizes[:level])  # node id of the level's first node
    out = torch.full(q.shape[:3], float("-inf"), dtype=q.dtype)
    for i in range(n):
        hit = leaves.valid[i] & (leaves.etype[i] == segtree.edge_type(side, level + 1))
        for node in leaves.index[i][hit].tolist():
            out[:, :, i] = (q[:, :, i] * k_level[:, :, node - first]).sum(-1)
    return out


def _level_variant(q, k_level, level: int, side: str, *, key_by: int | None = None,
                   own: bool = False) -> torch.Tensor:
    """A slip's version of the level scores: the keys shifted by key_by rows (the right
    shift is by = 1 on the left side, -1 on the right), or the sibling of the leaf's own
    ancestor instead of its neighbour's (own)."""
    n, by = q.size(2), 1 if side == "left" else -1
    kn = segtree.shift_rows(k_level, by if key_by is None else key_by)
    j = torch.arange(n) - (0 if own else by)  # whose ancestor's sibling leaf i reads
    valid = (j >= 0) & (j < n)
    g = j.clamp(0, n - 1) >> level
    s = (q * kn[:, :, g]).sum(-1)
    parity = (g % 2 == (1 if side == "left" else 0)) & valid & (torch.arange(n) - by >= 0) & (
        torch.arange(n) - by < n)
    return s.masked_fill(~parity, float("-inf"))


def sibling_scores(fn: Callable[..., torch.Tensor]) -> bool:
    """Check fn(q, k_level, level, side) -> [B, H, n]: the score of each leaf's query (q
    [B, H, n, D], n a power of two) with the key of the node of `level` (k_level [B, H,
    n >> level, D]) it reads on `side` ('left' or 'right') under the SegTree rule, -inf where
    it reads none. Names a shift of the wrong sign, the wrong sibling (that of the leaf's own
    ancestor, not its neighbour's), the ancestor itself, and a missing mask."""
    g = torch.Generator().manual_seed(0)
    cases = [(n, level, side) for n in (8, 16, 32) for level in range(n.bit_length() - 1)
             for side in ("left", "right")]  # every level with siblings, the top one too
    for n, level, side in cases:
        q = torch.randn(2, 2, n, 4, generator=g, dtype=torch.float64)
        k_level = torch.randn(2, 2, n >> level, 4, generator=g, dtype=torch.float64)
        where = f"for n={n}, level={level}, side={side!r}"
        got, err = call(fn, q, k_level, level, side)
        if err:
            return verdict("sibling_scores", f"{where}: {err}", len(cases))
        want = _graph_level_scores(q, k_level, level, side)
        if not isinstance(got, torch.Tensor) or tuple(got.shape) != tuple(want.shape):
            return verdict("sibling_scores", f"{where}: expected a tensor of shape "
                            f"{tuple(want.shape)} [B, H, n], got "
                            f"{tuple(getattr(got, 'shape', ())) or type(got).__name__}",
                            len(cases))
        got = got.to(want.dtype)
        none = torch.isinf(want)
        if torch.equal(torch.isinf(got) & (got < 0), none) and torch.allclose(
                got[~none], want[~none], atol=1e-6):
            continue

        def same(other: torch.Tensor) -> bool:
            reads = ~torch.isinf(other)
            return bool(reads.any()) and torch.equal(torch.isinf(got), ~reads) and \
                torch.allclose(got[reads], other[reads], atol=1e-6)

        by = 1 if side == "left" else -1
        if same(_level_variant(q, k_level, level, side, key_by=-by)):
            hint = ("the keys are shifted the wrong way: on the left the node read is g - 1 "
                    "(the left sibling of node g), so row g of the shifted keys holds node "
                    "g - 1: shift by +1 on the left, by -1 on the right.")
        elif same(_level_variant(q, k_level, level, side, own=True)):
            hint = ("the wrong sibling: leaf i reads the sibling of its neighbour's ancestor "
                    "(the neighbour is i - 1 on the left, i + 1 on the right), not of its own. "
                    "Index the queries by the neighbour: shift them by one row first.")
        elif same(_level_variant(q, k_level, level, side, key_by=0)):
            hint = ("each leaf is scored against its neighbour's ancestor itself; it reads "
                    "that ancestor's sibling on the side (node g - 1 on the left, g + 1 on "
                    "the right).")
        elif bool((~torch.isinf(got) & none).any()):
            i = int((~torch.isinf(got) & none).nonzero()[0, -1])
            hint = (f"leaf {i} reads no node of level {level} on the {side} (its neighbour's "
                    "ancestor there is not a "
                    f"{'right' if side == 'left' else 'left'} child, or it has no neighbour "
                    "on that side), but gets a finite score: set it to -inf.")
        else:
            bad = ((got - want).abs() > 1e-6) | (torch.isinf(got) != none)
            i = int(bad.nonzero()[0, -1])
            hint = (f"leaf {i}'s score differs from q_{i} . k of the node it reads "
                    f"({'none: -inf' if none[0, 0, i] else 'see leaf_context'}).")
        return verdict("sibling_scores", f"{where}: {hint}", len(cases))
    return verdict("sibling_scores", None, len(cases))
