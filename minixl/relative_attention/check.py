"""Checkers for Chapter 3's exercises (relative position representations): shaw_attention,
relative_index, distance_weights and per_head_shaw (a table per head), compared with the
references in minixl.relative_attention. Hand-written (not generated).
"""

from __future__ import annotations

import math
from typing import Callable

import torch

from .. import char_transformer, relative_attention
from ..check.verdicts import call, verdict


def shaw_attention(fn: Callable[..., torch.Tensor]) -> bool:
    """Check fn(q, k, v, w_k, w_v, mask=None) against Chapter 3's relative attention loop."""
    ref = relative_attention.shaw_attention_loop
    g = torch.Generator().manual_seed(0)
    shapes = [(2, 2, 5, 5, 4, 2), (1, 3, 3, 6, 8, 1), (2, 1, 4, 4, 4, 7), (1, 2, 6, 6, 4, 0)]
    n_checks = 2 * len(shapes)
    for B, H, Tq, Tk, D, K in shapes:
        q, k, v = (torch.randn(B, H, t, D, generator=g) for t in (Tq, Tk, Tk))
        w_k, w_v = torch.randn(2, 2 * K + 1, D, generator=g)
        for mask in (char_transformer.causal_mask(Tq, Tk), None):
            where = (f"for q {tuple(q.shape)}, k {tuple(k.shape)}, K={K}, "
                     f"{'with' if mask is not None else 'without'} a mask")
            got, err = call(fn, q, k, v, w_k, w_v, mask)
            if err:
                return verdict("shaw_attention", f"{where}: {err}", n_checks)
            want = ref(q, k, v, w_k, w_v, mask)
            if not isinstance(got, torch.Tensor) or got.shape != want.shape:
                shape = tuple(got.shape) if isinstance(got, torch.Tensor) else type(got).__name__
                return verdict("shaw_attention", f"{where}: the output is {shape}, expected "
                                f"{tuple(want.shape)} [B, H, Tq, D]", n_checks)
            if torch.allclose(got, want, atol=1e-5):
                continue
            zero = torch.zeros_like(w_v)
            near = lambda other: torch.allclose(got, other, atol=1e-4)
            if near(ref(q, k, v, w_k, zero, mask)):
                hint = "the value term is missing: add sum_j p_ij a^V_ij to the output."
            elif near(ref(q, k, v, w_k.flip(0), w_v.flip(0), mask)):
                hint = ("the distances run the wrong way: row clip(j - i, -K, K) + K of the table "
                        "belongs to query i and key j, so keys to the left use rows below K.")
            elif near(ref(q, k, v, w_k * math.sqrt(D), w_v, mask)):
                hint = "the position term q . a^K is not divided by sqrt(D) like the content term."
            elif near(ref(q, k, v, zero, w_v, mask)):
                hint = "the key-side position term q . a^K is missing from the logits."
            elif mask is not None and near(ref(q, k, v, w_k, w_v, None)):
                hint = "the mask is ignored."
            else:
                hint = "the values differ from the reference loop."
            return verdict("shaw_attention", f"{where}: {hint}", n_checks)
    return verdict("shaw_attention", None, n_checks)


def relative_index(fn: Callable[..., torch.Tensor]) -> bool:
    """Check fn(qlen, klen, max_relative) -> long [qlen, klen]: row clip(j - i, -K, K) + K of
    the distance table for query i (the last qlen of klen positions) and key j."""
    ref = relative_attention.relative_index
    cases = [(4, 4, 2), (2, 5, 2), (3, 7, 1), (6, 6, 9), (5, 5, 0), (1, 4, 3)]
    for qlen, klen, K in cases:
        where = f"for qlen={qlen}, klen={klen}, max_relative={K}"
        got, err = call(fn, qlen, klen, K)
        if err:
            return verdict("relative_index", f"{where}: {err}", len(cases))
        if not isinstance(got, torch.Tensor):
            return verdict("relative_index", f"expected a torch.Tensor, got "
                            f"{type(got).__name__}", len(cases))
        if tuple(got.shape) != (qlen, klen):
            return verdict("relative_index", f"{where}: the shape is {tuple(got.shape)}, "
                            f"expected ({qlen}, {klen}): rows are queries, columns keys",
                            len(cases))
        if got.dtype.is_floating_point or got.dtype == torch.bool:
            return verdict("relative_index", f"{where}: the dtype is {got.dtype}; rows of "
                            "a table are picked with an integer tensor (torch.long)", len(cases))
        want = ref(qlen, klen, K)
        got = got.long()
        if torch.equal(got, want):
            continue
        d = torch.arange(klen)[None, :] - torch.arange(klen - qlen, klen)[:, None]  # j - i
        from_zero = torch.arange(klen)[None, :] - torch.arange(qlen)[:, None]
        offset = (got - want).unique()
        if torch.equal(got, 2 * K - want):
            hint = ("the distances run the wrong way (i - j instead of j - i): a key to the "
                    "left of its query (j < i) must take a row below K")
        elif torch.equal(got, d + K):
            hint = ("the distances are not clipped: clamp j - i to [-K, K] before adding K; "
                    f"the table has 2K + 1 = {2 * K + 1} rows")
        elif torch.equal(got, (d.clamp(-K + 1, K - 1) + K)):
            hint = ("clipped to [-(K - 1), K - 1]: the table's 2K + 1 rows hold distances -K "
                    "to K")
        elif torch.equal(got, from_zero.clamp(-K, K) + K):
            hint = ("the queries are taken as the first qlen positions; they are the last "
                    f"qlen of klen (the first keys may be memory): query i sits at position "
                    f"klen - qlen + i = {klen - qlen} + i")
        elif offset.numel() == 1 and offset.item() == -K:
            hint = "the offset is missing: add K after clipping, so that distance -K is row 0"
        elif offset.numel() == 1:
            hint = (f"every entry is off by {offset.item():+d}: after clipping add exactly K, "
                    "so that distance 0 (a query and its own key) is row K")
        else:
            i, j = (got != want).nonzero()[0].tolist()
            hint = (f"entry ({i}, {j}) is {got[i, j].item()}, expected clip({d[i, j].item()}, "
                    f"-{K}, {K}) + {K} = {want[i, j].item()}")
        return verdict("relative_index", f"{where}: {hint}.", len(cases))
    return verdict("relative_index", None, len(cases))


def distance_weights(fn: Callable[..., torch.Tensor]) -> bool:
    """Check fn(p [B, H, Tq, Tk], index [Tq, Tk], n_distances) -> [B, H, Tq, n_distances]: the
    attention weight each query pays to each distance, summed over the keys at that distance
    (the value side of Chapter 3's bucket form)."""
    ref = relative_attention.distance_weights
    rel_index = relative_attention.relative_index
    mask_of = char_transformer.causal_mask
    g = torch.Generator().manual_seed(0)
    cases = [(1, 1, 4, 4, 1, True), (2, 3, 5, 5, 2, True), (1, 2, 3, 7, 2, True),
             (2, 1, 4, 6, 9, False), (1, 1, 6, 6, 0, False)]
    for B, H, Tq, Tk, K, masked in cases:
        where = (f"for p of shape {(B, H, Tq, Tk)}, K={K}, "
                 f"{'causal' if masked else 'no mask'}")
        scores = torch.randn(B, H, Tq, Tk, generator=g)
        if masked:
            scores = scores.masked_fill(~mask_of(Tq, Tk), float("-inf"))
        p, index, n = scores.softmax(-1), rel_index(Tq, Tk, K), 2 * K + 1
        got, err = call(fn, p.clone(), index.clone(), n)
        if err:
            return verdict("distance_weights", f"{where}: {err}", len(cases))
        want = ref(p, index, n)
        if not isinstance(got, torch.Tensor) or got.shape != want.shape:
            shape = tuple(got.shape) if isinstance(got, torch.Tensor) else type(got).__name__
            hint = (" (one column per key: gather reads a column for each key, but here each "
                    "key's weight must be added into the column its index names: scatter_add)"
                    if isinstance(got, torch.Tensor) and got.shape[-1:] == (Tk,) else "")
            return verdict("distance_weights", f"{where}: the output is {shape}, expected "
                            f"{tuple(want.shape)} [B, H, Tq, 2K+1]{hint}", len(cases))
        if torch.allclose(got, want, atol=1e-6):
            continue
        count = ref(torch.ones_like(p), index, n)  # keys per (query, distance)
        keys = ref((p > 0).float(), index, n)  # keys the query may attend
        single = count == 1
        if torch.allclose(got, keys) or torch.allclose(got, count):
            hint = ("it counts the keys at each distance; add up their attention weights p "
                    "instead")
        elif torch.allclose(got, want / count.clamp(min=1), atol=1e-6):
            hint = ("it averages the weights of the keys at a distance; the value term needs "
                    "their sum")
        elif torch.allclose(got[single], want[single], atol=1e-6):
            hint = ("the distances that several keys share (the clipped ones) hold only one "
                    "key's weight: scatter overwrites, scatter_add adds the weights up")
        elif torch.allclose(got, want.flip(-1), atol=1e-6):
            hint = ("the columns run the wrong way: column r is distance r - K, which is the "
                    "row the index already names")
        else:
            hint = ("each query's weights, summed over its keys, must land in the columns "
                    "the index names, every key's weight in exactly one column (the rows of "
                    "the result then add up to 1, like the rows of p)")
        return verdict("distance_weights", f"{where}: {hint}.", len(cases))
    return verdict("distance_weights", None, len(cases))


def per_head_shaw(fn: Callable[..., torch.Tensor]) -> bool:
    """Check fn(q, k, v, w_k, w_v, mask=None) -> [B, H, Tq, D], exercise 5's relative
    attention with a table per head: w_k, w_v are [H, 2K+1, D], and head h uses w_k[h],
    w_v[h] exactly as shaw_attention uses its one table."""
    ref = relative_attention.shaw_attention
    g = torch.Generator().manual_seed(0)
    # B != H first: a table indexed by the batch row instead of the head fails at once
    shapes = [(2, 3, 5, 5, 4, 2), (1, 2, 3, 6, 8, 1), (3, 3, 4, 4, 4, 3), (2, 1, 4, 7, 4, 0)]
    n_checks = 2 * len(shapes)

    def by_head(q, k, v, w_k, w_v, mask):  # head h of every batch row with table h
        return torch.cat([ref(q[:, h:h + 1], k[:, h:h + 1], v[:, h:h + 1], w_k[h], w_v[h], mask)
                          for h in range(q.size(1))], dim=1)

    for B, H, Tq, Tk, D, K in shapes:
        q, k, v = (torch.randn(B, H, t, D, generator=g) for t in (Tq, Tk, Tk))
        w_k, w_v = torch.randn(2, H, 2 * K + 1, D, generator=g)
        for mask in (char_transformer.causal_mask(Tq, Tk), None):
            where = (f"for q {tuple(q.shape)}, tables {tuple(w_k.shape)}, K={K}, "
                     f"{'with' if mask is not None else 'without'} a mask")
            got, err = call(fn, q, k, v, w_k.clone(), w_v.clone(), mask)
            if err:
                return verdict("per_head_shaw", f"{where}: {err}", n_checks)
            want = by_head(q, k, v, w_k, w_v, mask)
            if not isinstance(got, torch.Tensor) or got.shape != want.shape:
                shape = tuple(got.shape) if isinstance(got, torch.Tensor) else type(got).__name__
                return verdict("per_head_shaw", f"{where}: the output is {shape}, expected "
                                f"{tuple(want.shape)} [B, H, Tq, D]", n_checks)
            if torch.allclose(got, want, atol=1e-5):
                continue
            near = lambda other: torch.allclose(got, other, atol=1e-4)
            every = lambda w: w.expand(H, -1, -1)  # one table, given to every head
            if H > 1 and near(by_head(q, k, v, every(w_k[:1]), every(w_v[:1]), mask)):
                hint = "every head uses head 0's tables: head h must read w_k[h] and w_v[h]."
            elif H > 1 and near(by_head(q, k, v, every(w_k.mean(0, keepdim=True)),
                                        every(w_v.mean(0, keepdim=True)), mask)):
                hint = ("the tables are averaged over the heads: keep the head dimension "
                        "(einsum 'bhqd,hrd->bhqr', not a sum over h).")
            elif H > 1 and near(by_head(q, k, v, w_k, every(w_v[:1]), mask)):
                hint = ("the key side uses each head's table but the value side uses head 0's "
                        "for all: the value term needs w_v[h] too.")
            elif near(by_head(q, k, v, w_k * math.sqrt(D), w_v, mask)):
                hint = "the position term q . a^K is not divided by sqrt(D) like the content term."
            elif mask is not None and near(by_head(q, k, v, w_k, w_v, None)):
                hint = "the mask is ignored."
            else:
                hint = "the values differ from shaw_attention run head by head with table h."
            return verdict("per_head_shaw", f"{where}: {hint}", n_checks)
    return verdict("per_head_shaw", None, n_checks)
