"""Checkers for Chapter 5's exercises (XLNet): permutation_masks, query_stream_mask,
query_stream_update, rel_shift_bi, span_targets and targets_for_k, compared with the references in
minixl.xlnet; the helpers before them build the factorisation orders and name the typical
slip of a wrong mask.
Hand-written (not generated).
"""

from __future__ import annotations

from typing import Callable

import torch

from .. import xlnet
from ..check.verdicts import call, verdict


def _bool_masks(got, where: str, shape: tuple, what: str) -> str | None:
    """Why `got` is not a bool tensor of `shape` (rows are queries, columns keys), or None."""
    if not isinstance(got, torch.Tensor):
        return f"{where}: expected the {what} as a torch.Tensor, got {type(got).__name__}"
    if tuple(got.shape) != shape:
        return (f"{where}: the {what} is {tuple(got.shape)}, expected {shape}: one row per query "
                "position i, one column per key position j (and a leading batch dimension when "
                "the order has one)")
    if got.dtype != torch.bool:
        return f"{where}: the {what} has dtype {got.dtype}, expected torch.bool (True = may attend)"
    return None


def _orders() -> list[tuple[torch.Tensor, int | None]]:
    """Factorisation orders (none its own inverse, so ranks and positions differ) and n_predict."""
    g = torch.Generator().manual_seed(0)
    return [(torch.tensor([2, 0, 1, 3]), None), (torch.tensor([3, 1, 4, 2, 0]), None),
            (torch.randperm(8, generator=g), None), (torch.tensor([3, 1, 4, 2, 0]), 2),
            (torch.randperm(8, generator=g), 3), (torch.tensor([1, 2, 0]), 3),
            (torch.stack([torch.randperm(6, generator=g) for _ in range(2)]), None),
            (torch.stack([torch.randperm(7, generator=g) for _ in range(3)]), 2)]


def _ranks(order: torch.Tensor, n_predict: int | None) -> torch.Tensor:
    """The rank of each position: 0 for the context, 1, 2, ... for the predicted ones."""
    n = order.size(-1) if n_predict is None else n_predict
    return (order.argsort(-1) - (order.size(-1) - n) + 1).clamp(min=0)


def _order_text(order: torch.Tensor, n_predict: int | None) -> str:
    return f"for order {order.tolist()}" + ("" if n_predict is None else f", n_predict={n_predict}")


def _mask_slip(got: torch.Tensor, want: torch.Tensor, rows: torch.Tensor, order: torch.Tensor,
               n_predict: int | None, stream: str) -> str | None:
    """The typical slip that turns want into got on the checked rows [..., T], or None."""
    eye = torch.eye(want.size(-1), dtype=torch.bool)
    ref = xlnet.permutation_masks
    k = 0 if stream == "content" else 1

    def same(other: torch.Tensor) -> bool:
        return bool(((got == other) | ~rows[..., None]).all())

    # ranks and positions confused: order[i] read as the step of position i
    if same(ref(order.argsort(-1), n_predict=n_predict)[k]):
        return ("ranks and positions are confused: order[t] is the position predicted t-th, "
                "not the step of position t. Invert the order first (rank_of[order[t]] = t, "
                "e.g. with argsort), then compare rank_of[j] with rank_of[i].")
    if same(want.transpose(-2, -1)):
        return ("the mask is transposed: rows are queries and columns keys, mask[i, j] True "
                "when position i may attend position j.")
    if stream == "query" and same(want | eye):
        return ("the query stream sees its own position: that is the byte it predicts. It may "
                "attend only positions strictly earlier in the order (rank_j < rank_i, not <=).")
    if stream == "content" and same(want & ~eye):
        return ("the content stream does not see its own position: it encodes its own byte "
                "too, so it attends rank_j <= rank_i (itself included).")
    if n_predict is not None and n_predict < want.size(-1):
        if same(ref(order)[k]):
            return (f"n_predict is ignored: only the last {n_predict} positions of the order are "
                    "predicted; the others are context, share rank 0 and see one another.")
        for n in (n_predict - 1, n_predict + 1):
            if 0 <= n <= want.size(-1) and same(ref(order, n_predict=n)[k]):
                return (f"off by one: you predict the last {n} position{'s' * (n != 1)} of the "
                        f"order, not the last {n_predict} (the first T - n_predict are context).")
        context = order[..., :want.size(-1) - n_predict]  # its positions

        def block(m: torch.Tensor) -> torch.Tensor:  # m [..., T, T] -> context rows and columns
            rows = m.gather(-2, context[..., :, None].expand(*context.shape, m.size(-1)))
            return rows.gather(-1, context[..., None, :].expand(*context.shape, context.size(-1)))

        if stream == "content" and not torch.equal(block(got), block(want)):
            return ("the context is not tied: the first T - n_predict positions of the order "
                    "are context, share rank 0, and each of them sees all of the context "
                    "(whatever its place in the order).")
    return None


def permutation_masks(fn: Callable[..., tuple]) -> bool:
    """Check fn(order, n_predict=None) -> (content_mask, query_mask), bool [..., T, T].

    order [..., T] is a factorisation order (order[t] = the position predicted t-th); True
    where position i may attend position j. With n_predict, the first T - n_predict positions
    of the order are context. The query mask is checked on the predicted rows only (the
    others predict nothing)."""
    ref = xlnet.permutation_masks
    cases = _orders()
    for order, n_predict in cases:
        where = _order_text(order, n_predict)
        got, err = call(fn, order) if n_predict is None else call(fn, order, n_predict=n_predict)
        if err:
            return verdict("permutation_masks", f"{where}: {err}", len(cases))
        if not isinstance(got, (tuple, list)) or len(got) != 2:
            return verdict("permutation_masks", f"{where}: expected a pair (content_mask, "
                            f"query_mask), got {type(got).__name__}", len(cases))
        want = ref(order, n_predict=n_predict)
        shape = (*order.shape, order.size(-1))
        for mask, what in zip(got, ("content mask", "query mask")):
            problem = _bool_masks(mask, where, shape, what)
            if problem:
                return verdict("permutation_masks", problem, len(cases))
        content, query = got
        rank = _ranks(order, n_predict)
        predicted, every = rank > 0, torch.ones_like(rank, dtype=torch.bool)
        ok_c = torch.equal(content, want[0])
        ok_q = bool(((query == want[1]) | ~predicted[..., None]).all())
        if ok_c and ok_q:
            continue
        if (~content.diagonal(dim1=-2, dim2=-1)).all() and query.diagonal(dim1=-2, dim2=-1)[
                predicted].all():
            hint = ("the content and query masks are swapped: the content stream sees its own "
                    "position (rank_j <= rank_i), the query stream does not (rank_j < rank_i); "
                    "return (content, query).")
        else:
            stream, mine, right, rows = (("content", content, want[0], every) if not ok_c
                                         else ("query", query, want[1], predicted))
            hint = f"in the {stream} mask: " + (
                _mask_slip(mine, right, rows, order, n_predict, stream)
                or _first_wrong(mine, right, rows, rank, stream))
        return verdict("permutation_masks", f"{where}: {hint}", len(cases))
    return verdict("permutation_masks", None, len(cases))


def _first_wrong(got: torch.Tensor, want: torch.Tensor, rows: torch.Tensor,
                 rank: torch.Tensor, stream: str) -> str:
    """The first entry on the checked rows where got and want differ, explained by ranks."""
    *b, i, j = ((got != want) & rows[..., None]).nonzero()[0].tolist()
    r = rank[b[0]] if b else rank
    rule = "rank_j <= rank_i" if stream == "content" else "rank_j < rank_i"
    return (f"your mask says position {i}{f' (batch row {b[0]})' if b else ''} "
            f"{'may' if got[(*b, i, j)] else 'may not'} attend position {j}, but their ranks "
            f"are {int(r[i])} and {int(r[j])} and it attends where {rule} (the context has "
            "rank 0, the predicted positions 1, 2, ... in the order).")


def query_stream_mask(fn: Callable[[torch.Tensor], torch.Tensor]) -> bool:
    """Check fn(order) -> the query stream's mask, bool [..., T, T]: True where position i may
    attend position j, i.e. j comes strictly earlier than i in the order [..., T]."""
    ref = xlnet.permutation_masks
    cases = [(order, None) for order, n in _orders() if n is None]
    for order, _ in cases:
        where = _order_text(order, None)
        got, err = call(fn, order)
        if err:
            return verdict("query_stream_mask", f"{where}: {err}", len(cases))
        want = ref(order)[1]
        problem = _bool_masks(got, where, tuple(want.shape), "query mask")
        if problem:
            return verdict("query_stream_mask", problem, len(cases))
        if torch.equal(got, want):
            continue
        every = torch.ones(order.shape, dtype=torch.bool)
        rank = _ranks(order, None)
        if torch.equal(got, ~want):
            hint = "the mask is inverted: True where a position MAY attend."
        else:
            hint = (_mask_slip(got, want, every, order, None, "query")
                    or _first_wrong(got, want, every, rank, "query"))
        return verdict("query_stream_mask", f"{where}: {hint}", len(cases))
    return verdict("query_stream_mask", None, len(cases))


def _query_update(attn, q_from, kv, mask, resid, *, norm: bool = True):
    """One query-stream update written with attn's own pieces: queries from q_from [B, T, C],
    keys and values from kv [B, M + T, C], mask [B, T, M + T], residual resid (None: none)."""
    sinusoid, distances = xlnet.sinusoid, xlnet.bidirectional_distances
    T, klen = q_from.size(1), kv.size(1)
    pos_emb = sinusoid(distances(T, klen), q_from.size(-1))
    r_k = attn.heads(pos_emb, attn.r)  # [H, L, D]
    out = attn.o(attn.attend(attn.heads(q_from, attn.q), attn.heads(kv, attn.k),
                             attn.heads(kv, attn.v), r_k, mask))
    out = out if resid is None else resid + out
    return attn.layer_norm(out) if norm else out


def _update_cases():
    """(attn, h, g, content_mask, query_mask, mems, where): random orders, full and partial
    prediction, with and without a memory; the biases made as large as trained ones."""
    attention, masks = xlnet.TwoStreamAttention, xlnet.permutation_masks
    g = torch.Generator().manual_seed(0)
    cases = []
    for B, T, M, n_predict in ((1, 4, 0, None), (2, 6, 3, 4), (1, 5, 2, None), (3, 7, 0, 3)):
        torch.manual_seed(len(cases))
        attn = attention(16, 2).eval()
        with torch.no_grad():
            for p in (attn.r_w_bias, attn.r_r_bias):
                p.normal_(generator=g)
        order = torch.stack([torch.randperm(T, generator=g) for _ in range(B)])
        content, query = masks(order, n_predict=n_predict)
        h, x = torch.randn(B, T, 16, generator=g), torch.randn(B, T, 16, generator=g)
        mems = torch.randn(B, M, 16, generator=g) if M else None
        where = (f"for B={B}, T={T}, order {order.tolist()}"
                 + (f", n_predict={n_predict}" if n_predict else "")
                 + (f", a memory of {M}" if M else ", no memory"))
        cases.append((attn, h, x, content, query, mems, where))
    return cases


def query_stream_update(fn: Callable[..., torch.Tensor]) -> bool:
    """Check fn(attn, h, g, content_mask, query_mask, mems=None) -> the new query stream g
    [B, T, C] of one TwoStreamAttention layer (no segments, no dropout; every position a
    query), against the layer itself. Masks are [B, T, T] over the segment; a memory
    mems [B, M, C], when given, is seen by every query. Names the usual slips: keys and values
    from g, the content mask, queries from h, the memory left out, the residual or the norm
    missing, and any query that sees its own content or a byte ranked after it."""
    cases = _update_cases()
    for attn, h, g, content, query, mems, where in cases:
        B, T, _ = h.shape
        h, g = h.clone().requires_grad_(), g.clone().requires_grad_()
        got, err = call(fn, attn, h, g, content, query, mems=mems)
        if err:
            return verdict("query_stream_update", f"{where}: {err}", len(cases))
        if not isinstance(got, torch.Tensor) or got.shape != g.shape:
            what = tuple(got.shape) if isinstance(got, torch.Tensor) else type(got).__name__
            return verdict("query_stream_update", f"{where}: expected the new g, a tensor "
                            f"of shape {tuple(g.shape)} [B, T, C], got {what}", len(cases))
        cat = h if mems is None else torch.cat([mems, h], 1)
        seen = torch.ones(B, T, cat.size(1) - T, dtype=torch.bool)
        full_q, full_c = torch.cat([seen, query], -1), torch.cat([seen, content], -1)
        want = _query_update(attn, g, cat, full_q, g)
        if torch.allclose(got, want, atol=1e-5):
            continue
        g_cat = g if mems is None else torch.cat([mems, g], 1)
        slips = [
            (_query_update(attn, g, g_cat, full_q, g), "keys and values come from g: they come "
             "from the content stream [memory; h]. The query stream only asks; what it reads is "
             "content, never another position's query stream."),
            (_query_update(attn, g, cat, full_c, g), "the content mask is used: it lets a "
             "query see its own position (rank_j <= rank_i), the byte it predicts. The query "
             "stream attends rank_j < rank_i."),
            (_query_update(attn, h, cat, full_q, g), "the queries come from h: a position's "
             "content holds its own byte. The query stream's queries come from g."),
            (_query_update(attn, g, cat, full_q, h), "the residual adds h: that puts the "
             "position's own byte into g. The residual of the query stream is g itself."),
            (_query_update(attn, g, cat, full_q, None), "the residual is missing: the new g is "
             "layer_norm(g + attention output)."),
            (_query_update(attn, g, cat, full_q, g, norm=False), "the layer norm is missing: "
             "the new g is layer_norm(g + attention output), post-norm as in the content "
             "stream."),
        ]
        if mems is not None:
            slips.append((_query_update(attn, g, h, query, g), "the memory is left out: keys "
                          "and values are [memory; h], and every query sees all of the memory."))
        for other, hint in slips:
            if torch.allclose(got, other, atol=1e-5):
                return verdict("query_stream_update", f"{where}: {hint}", len(cases))
        # the gradient probe: what each query reads of h, against what its mask allows (a
        # random direction: the sum of a layer norm's output does not move)
        proj = torch.randn(got.size(-1), generator=torch.Generator().manual_seed(1))
        for b in range(B):
            for i in range(T):
                (grad,) = torch.autograd.grad(got[b, i] @ proj, h, retain_graph=True,
                                              allow_unused=True)
                if grad is None:
                    continue
                reads = grad[b].abs().sum(-1) > 0
                wrong = (reads & ~query[b, i]).nonzero().flatten().tolist()
                if wrong:
                    j = wrong[0]
                    what = "its own content" if j == i else f"the content of position {j}"
                    return verdict("query_stream_update", f"{where}: the query at position {i} "
                                    f"reads {what}, which its mask hides (the query stream "
                                    "must never see the byte it predicts, nor one ranked "
                                    "after it)", len(cases))
        worst = (got - want).abs().max().item()
        return verdict("query_stream_update", f"{where}: the new g differs from the layer's "
                        f"by up to {worst:.3g}; scores are (q + u) . k + (q + v) . W_r R_(i-j), "
                        "over sqrt(d_head), a masked softmax, the output projection, then "
                        "layer_norm(g + out)", len(cases))
    return verdict("query_stream_update", None, len(cases))


def targets_for_k(fn: Callable[[int, int], int]) -> bool:
    """Check fn(seq_len, K) -> n_predict: how many of seq_len positions are predicted for the
    paper's K = |z| / (|z| - c), the sequence length over the number of targets (about
    seq_len / K, to the nearest whole number; K = 1 predicts every position)."""
    cases = [(64, 1), (64, 2), (64, 4), (64, 6), (512, 6), (512, 7), (100, 6), (10, 3)]
    for T, K in cases:
        where = f"for seq_len={T}, K={K}"
        got, err = call(fn, T, K)
        if err:
            return verdict("targets_for_k", f"{where}: {err}", len(cases))
        want = round(T / K)
        if isinstance(got, torch.Tensor) and got.numel() == 1:
            got = got.item()
        if not isinstance(got, int) or isinstance(got, bool):
            if isinstance(got, float) and abs(got - T / K) < 1e-9 and got != want:
                return verdict("targets_for_k", f"{where}: got {got}, a fraction: the number "
                                f"of targets is a whole number, here {want} (round T / K)",
                                len(cases))
            if not (isinstance(got, float) and got == want):
                return verdict("targets_for_k", f"{where}: expected a whole number of "
                                f"targets, got {got!r}", len(cases))
            got = int(got)
        if got == want:
            continue
        if got == K:
            hint = ("you return K itself: K is the ratio of the length to the number of targets "
                    f"(K = |z| / (|z| - c)), so n_predict is about seq_len / K = {want}.")
        elif got == T - want:
            hint = (f"{got} is c, the context (the first c positions of the order); the targets "
                    f"are the other |z| - c = {want}.")
        elif got in (T // K, -(-T // K)):
            hint = (f"{T} / {K} = {T / K:.2f}: round to the nearest whole number, {want} (the "
                    "chapter's K about 6 of 64 positions is 11 targets).")
        else:
            hint = f"expected {want} targets (about seq_len / K), got {got}."
        return verdict("targets_for_k", f"{where}: {hint}", len(cases))
    return verdict("targets_for_k", None, len(cases))


def rel_shift_bi(fn: Callable[[torch.Tensor, int], torch.Tensor]) -> bool:
    """Check fn(x, klen): x [..., Tq, klen + Tq - 1] scored against the descending distances
    klen - 1, ..., -(Tq - 1) -> [..., Tq, klen], the score of query i and key j, whose
    distance is (klen - Tq + i) - j. Every entry is checked: keys lie on both sides."""
    import torch.nn.functional as F

    ref = xlnet.rel_shift_bi
    g = torch.Generator().manual_seed(0)
    shapes = [((), 3, 3), ((), 3, 5), ((), 1, 4), ((), 4, 9), ((2, 3), 4, 6), ((5,), 2, 2)]
    for lead, qlen, klen in shapes:
        x = torch.randn(*lead, qlen, klen + qlen - 1, generator=g)
        where = (f"for x of shape {tuple(x.shape)} ({qlen} queries, klen={klen}: memory "
                 f"{klen - qlen})")
        got, err = call(fn, x, klen)
        if err:
            return verdict("rel_shift_bi", f"{where}: {err}", len(shapes))
        want = ref(x, klen)
        if not isinstance(got, torch.Tensor):
            return verdict("rel_shift_bi", f"{where}: expected a torch.Tensor, got "
                            f"{type(got).__name__}", len(shapes))
        if got.shape != want.shape:
            cut = got.shape[:-1] == want.shape[:-1] and got.size(-1) > klen and torch.allclose(
                got[..., :klen], want)
            hint = (" Right up to column klen: cut the result to its first klen columns, one "
                    "per key." if cut else "")
            return verdict("rel_shift_bi", f"{where}: the output is {tuple(got.shape)}, "
                            f"expected {tuple(want.shape)} [..., Tq, klen].{hint}", len(shapes))
        if torch.allclose(got, want):
            continue
        i = torch.arange(qlen)[:, None]
        j = torch.arange(klen)

        def columns(col: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
            """x[..., i, col[i, j]] and where col is inside x."""
            inside = (col >= 0) & (col < x.size(-1))
            picked = x.gather(-1, col.clamp(0, x.size(-1) - 1).expand(*lead, qlen, klen))
            return picked, inside.expand_as(picked)

        def near(other: torch.Tensor, keep: torch.Tensor | None = None) -> bool:
            keep = torch.ones_like(got, dtype=torch.bool) if keep is None else keep
            return bool(keep.any()) and torch.allclose(got[keep], other[keep])

        def shifted(pad: tuple, rows: slice) -> torch.Tensor:
            out = F.pad(x, pad).reshape(*lead, klen + qlen, qlen)[..., rows, :]
            return out.reshape(*lead, qlen, klen + qlen - 1)[..., :klen]

        causal = (j <= klen - qlen + i).expand_as(got)
        ascending = columns(klen - 1 + i - j)
        if near(shifted((0, 1), slice(1, None))):
            hint = ("the zero column is padded on the right; it goes on the left "
                    "(F.pad(x, (1, 0))), so that row i slides left by Tq - 1 - i.")
        elif near(shifted((1, 0), slice(None, -1))):
            hint = ("after padding and reshaping to [klen + Tq, Tq], drop the first row (Tq "
                    "numbers: the padding), not the last one.")
        elif near(*columns(qlen - i + j)) or near(*columns(qlen - 2 - i + j)):
            hint = ("off by one: every score sits one column from its key. Query i and key j "
                    "have distance (klen - Tq + i) - j, in column Tq - 1 - i + j of x.")
        elif near(*ascending) and ascending[1].all():
            hint = ("the columns are read as ascending distances; column m of x holds distance "
                    "klen - 1 - m (descending).")
        elif near(want, causal):
            hint = ("only the entries a causal mask keeps (j <= klen - Tq + i) are right: "
                    "Chapter 4's one-directional shift leaves junk above the diagonal. XLNet's "
                    "keys lie on both sides of the query: shift all klen + Tq - 1 columns, then "
                    "cut to klen.")
        else:
            hint = ("the values differ from the reference: the result at [..., i, j] is "
                    "x[..., i, Tq - 1 - i + j].")
        return verdict("rel_shift_bi", f"{where}: {hint}", len(shapes))
    return verdict("rel_shift_bi", None, len(shapes))


def _runs(positions: list[int]) -> list[tuple[int, int]]:
    """(start, length) of the runs of consecutive positions in a sorted list."""
    runs: list[tuple[int, int]] = []
    for p in positions:
        if runs and p == runs[-1][0] + runs[-1][1]:
            runs[-1] = (runs[-1][0], runs[-1][1] + 1)
        else:
            runs.append((p, 1))
    return runs


def span_targets(fn: Callable[[int, int], torch.Tensor]) -> bool:
    """Check fn(T, n_predict) -> the target positions of one sequence of T for XLNet's
    span-based prediction: n_predict distinct positions in [0, T), in spans of 1 to 5
    consecutive positions with context between two spans, drawn at random (over many draws
    every span length occurs, spans start anywhere and lie at varying distances, the targets
    move)."""
    max_span = xlnet.MAX_SPAN
    cases = [(32, 11), (64, 11), (16, 8), (12, 1), (40, 20)]
    draws = 200
    for T, n in cases:
        where = f"for T={T}, n_predict={n}"
        seen_lengths, firsts, sets, gaps = set(), set(), set(), set()
        for d in range(draws):
            torch.manual_seed(d)
            got, err = call(fn, T, n)
            if err:
                return verdict("span_targets", f"{where}: {err}", len(cases))
            if not isinstance(got, torch.Tensor) or got.dim() != 1 or got.dtype.is_floating_point:
                return verdict("span_targets", f"{where}: expected a 1-D integer tensor of "
                                f"positions, got {got!r:.80}", len(cases))
            pos = sorted(got.tolist())
            if len(pos) != n:
                hint = (" The last span must be cut so that the lengths add up to n_predict."
                        if len(pos) > n else "")
                return verdict("span_targets", f"{where}: {len(pos)} positions, expected "
                                f"{n}.{hint}", len(cases))
            if len(set(pos)) != n:
                return verdict("span_targets", f"{where}: a position appears twice ({pos}): "
                                "spans overlap", len(cases))
            if pos[0] < 0 or pos[-1] >= T:
                return verdict("span_targets", f"{where}: positions {pos} leave [0, {T})",
                                len(cases))
            runs = _runs(pos)
            long = [r for r in runs if r[1] > max_span]
            if long:
                return verdict("span_targets", f"{where}: a run of {long[0][1]} targets from "
                                f"position {long[0][0]} ({pos}): spans are 1 to {max_span} "
                                "long, and two spans need context between them (a span that "
                                "touches the next one makes a longer span)", len(cases))
            seen_lengths |= {r[1] for r in runs}
            gaps |= {b[0] - (a[0] + a[1]) for a, b in zip(runs, runs[1:])}
            firsts.add(pos[0])
            sets.add(tuple(pos))
        if len(sets) == 1:
            return verdict("span_targets", f"{where}: every draw gave the same targets "
                            f"{list(sets)[0]}: draw them at random (torch's generator)",
                            len(cases))
        if firsts == {0}:
            return verdict("span_targets", f"{where}: the first span always starts at 0: place "
                            "the spans at random among the context", len(cases))
        if gaps and max(gaps) == 1 and T - n > 2 * n:
            return verdict("span_targets", f"{where}: two spans are always 1 byte apart: the "
                            "context between spans must be placed at random too, not all at "
                            "the ends", len(cases))
        possible = set(range(1, min(max_span, n) + 1))
        if n >= 2 * max_span and not possible <= seen_lengths:
            return verdict("span_targets", f"{where}: in {draws} draws the spans had lengths "
                            f"{sorted(seen_lengths)} only, expected every length from 1 to "
                            f"{max_span}", len(cases))
    return verdict("span_targets", None, len(cases))
