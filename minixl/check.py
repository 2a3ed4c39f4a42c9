"""Checkers for the exercises: call them on your own implementation.

Hand-written (not generated). Each checker runs property tests against the
reference in minixl, prints a short verdict that says what is wrong when
something is, and returns True when every test passes.

    >>> from minixl import check
    >>> check.causal_mask(my_causal_mask)
"""

from __future__ import annotations

import importlib
import math
from typing import Callable

import torch


__all__ = ["causal_mask", "attention", "sinusoid_positions", "intermediate_weight",
           "sliding_windows", "shaw_attention", "relative_index", "distance_weights",
           "rel_shift", "permutation_masks",
           "query_stream_mask", "rel_shift_bi", "leaf_context", "causal_tree_graph",
           "gathered_attention", "ahead_pairs", "four_term_score", "memory_update",
           "stream_batches", "xl_two_segments"]


def _ref(module: str, name: str) -> Callable:
    """The reference `name` from minixl.<module>, imported when a checker runs: a chapter's
    checkers work before later chapters' modules exist."""
    return getattr(importlib.import_module(f".{module}", __package__), name)


def _verdict(name: str, problem: str | None, n_checks: int) -> bool:
    if problem is None:
        print(f"PASS {name}: all {n_checks} checks agree with the reference.")
        return True
    print(f"FAIL {name}: {problem}")
    return False


def _call(fn: Callable, *args, **kwargs):
    try:
        return fn(*args, **kwargs), None
    except Exception as err:  # a student's code may raise anything; report it
        return None, f"calling it with {args} raised {type(err).__name__}: {err}"


def causal_mask(fn: Callable[..., torch.Tensor]) -> bool:
    """Check fn(qlen, klen) -> bool [qlen, klen], True where query i may attend key j."""
    cases = [(1, 1), (4, 4), (3, 7), (5, 6), (2, 2), (6, 6)]
    for qlen, klen in cases:
        got, err = _call(fn, qlen, klen)
        if err:
            return _verdict("causal_mask", err, len(cases))
        want = _ref("char_transformer", "causal_mask")(qlen, klen)
        if not isinstance(got, torch.Tensor):
            return _verdict("causal_mask", f"expected a torch.Tensor, got {type(got).__name__}", len(cases))
        if tuple(got.shape) != (qlen, klen):
            return _verdict("causal_mask", f"for qlen={qlen}, klen={klen} the shape is "
                            f"{tuple(got.shape)}, expected ({qlen}, {klen}): rows are queries, "
                            "columns are keys", len(cases))
        if got.dtype != torch.bool:
            return _verdict("causal_mask", f"dtype is {got.dtype}, expected torch.bool "
                            "(True = may attend)", len(cases))
        if torch.equal(got, ~want):
            return _verdict("causal_mask", "the mask is inverted: use True where a query MAY "
                            "attend, as torch's scaled_dot_product_attention does", len(cases))
        bad = (got != want).nonzero()
        if len(bad):
            i, j = (int(t) for t in bad[0])
            mem = klen - qlen
            what = "may not" if want[i, j] else "may"
            return _verdict("causal_mask", f"for qlen={qlen}, klen={klen}, your mask says query "
                            f"{i} {what} attend key {j}. Query {i} sits at position {mem + i} "
                            f"(the first {mem} keys are memory), so it sees keys 0..{mem + i}.",
                            len(cases))
    return _verdict("causal_mask", None, len(cases))


def attention(fn: Callable[..., torch.Tensor]) -> bool:
    """Check fn(q, k, v, mask=None) against scaled dot-product attention."""
    ref = _ref("char_transformer", "attention")
    g = torch.Generator().manual_seed(0)
    shapes = [(2, 3, 5, 5, 8), (1, 2, 3, 7, 4), (2, 1, 6, 6, 16)]
    n_checks = 2 * len(shapes)
    for B, H, Tq, Tk, D in shapes:
        q, k, v = (torch.randn(B, H, t, D, generator=g) for t in (Tq, Tk, Tk))
        for mask in (None, _ref("char_transformer", "causal_mask")(Tq, Tk)):
            got, err = _call(fn, q, k, v, mask)
            if err:
                return _verdict("attention", err, n_checks)
            want = ref(q, k, v, mask)
            if not isinstance(got, torch.Tensor) or got.shape != want.shape:
                shape = tuple(got.shape) if isinstance(got, torch.Tensor) else type(got).__name__
                return _verdict("attention", f"for q {tuple(q.shape)} and k, v {tuple(k.shape)} "
                                f"the output is {shape}, expected {tuple(want.shape)} [B, H, Tq, D]",
                                n_checks)
            if torch.allclose(got, want, atol=1e-5):
                continue
            hint = "the values differ from the reference."
            unscaled = ref(q * math.sqrt(D), k, v, mask)
            if torch.allclose(got, unscaled, atol=1e-4):
                hint = "the scores are not divided by sqrt(D), the width of a head."
            elif torch.allclose(got, ref(q / math.sqrt(D), k, v, mask), atol=1e-5):
                hint = "the scores are divided by D; divide them by sqrt(D) instead."
            elif mask is not None and torch.allclose(got, ref(q, k, v), atol=1e-5):
                hint = "the mask is ignored: queries see keys they should not."
            elif mask is not None and torch.isnan(got).any():
                hint = ("the output has NaNs: fill the masked scores with -inf before the "
                        "softmax and check that True means 'may attend'.")
            else:
                w = (q @ k.transpose(-2, -1) / math.sqrt(D))
                if mask is not None:
                    w = w.masked_fill(~mask, float("-inf"))
                if torch.allclose(got, torch.nan_to_num(w.softmax(-2)) @ v, atol=1e-5):
                    hint = "the softmax runs over queries; it should run over keys (dim=-1)."
            masked = "with" if mask is not None else "without"
            return _verdict("attention", f"{masked} a mask, for q {tuple(q.shape)}: {hint}", n_checks)
    return _verdict("attention", None, n_checks)


def sinusoid_positions(fn: Callable[..., torch.Tensor]) -> bool:
    """Check fn(length, d_model) -> [length, d_model], [sin | cos] halves."""
    cases = [(1, 4), (10, 8), (50, 32)]
    for length, d in cases:
        got, err = _call(fn, length, d)
        if err:
            return _verdict("sinusoid_positions", err, len(cases))
        want = _ref("char_transformer", "sinusoid_positions")(length, d)
        if not isinstance(got, torch.Tensor) or got.shape != want.shape:
            return _verdict("sinusoid_positions", f"for length={length}, d_model={d} expected a "
                            f"tensor of shape {tuple(want.shape)}", len(cases))
        if not torch.allclose(got.float(), want, atol=1e-5):
            inter = torch.stack([want[:, : d // 2], want[:, d // 2:]], -1).reshape(length, d)
            hint = ("you interleaved sin and cos; this book puts all sines first, then all "
                    "cosines" if torch.allclose(got.float(), inter, atol=1e-5)
                    else "the values differ; position p, pair k uses angle p / 10000^(2k/d)")
            return _verdict("sinusoid_positions", f"for length={length}, d_model={d}: {hint}",
                            len(cases))
    return _verdict("sinusoid_positions", None, len(cases))


def intermediate_weight(fn: Callable[[int, int, float], float]) -> bool:
    """Check fn(layer, n_layer, progress) against Chapter 2's intermediate layer schedule."""
    cases = [(l, n, p) for n in (2, 4, 16) for l in range(1, n)
             for p in (0.0, 0.5 * l / (2 * n), l / (2 * n), 0.5, 1.0)]
    for layer, n, p in cases:
        got, err = _call(fn, layer, n, p)
        if err:
            return _verdict("intermediate_weight", err, len(cases))
        want = _ref("aux_losses", "intermediate_weight")(layer, n, p)
        try:
            ok = abs(float(got) - want) < 1e-6
        except (TypeError, ValueError):
            return _verdict("intermediate_weight", f"expected a number, got {got!r}", len(cases))
        if ok:
            continue
        stop = layer / (2 * n)
        if float(got) == 0.0 and want > 0:
            hint = (f"the loss is switched off too early (expected {want:.4f}); with integer "
                    "division l // (2n) is 0 for every layer: use real division")
        elif p == 0.0:
            hint = f"at the start of training the weight of layer {layer} of {n} is {layer}/{n}"
        elif p < stop:
            hint = f"before its stop at {stop:g} the weight fades linearly; expected {want:.4f}"
        else:
            hint = f"from progress l/(2n) = {stop:g} on the weight is 0"
        return _verdict("intermediate_weight", f"for layer={layer}, n_layer={n}, progress={p:g} "
                        f"you return {got!r}: {hint}.", len(cases))
    return _verdict("intermediate_weight", None, len(cases))


def sliding_windows(fn: Callable[[int, int, int], list]) -> bool:
    """Check fn(n, seq_len, stride) -> [(start, n_scored), ...] scores bytes 1..n-1 once each."""
    cases = [(2, 4, 1), (11, 4, 1), (11, 4, 3), (11, 4, 4), (50, 8, 5), (9, 16, 2)]
    for n, L, stride in cases:
        got, err = _call(fn, n, L, stride)
        if err:
            return _verdict("sliding_windows", err, len(cases))
        where = f"for n={n}, seq_len={L}, stride={stride}"
        try:
            windows = [(int(s), int(k)) for s, k in got]
        except (TypeError, ValueError):
            return _verdict("sliding_windows", f"{where}: expected a list of (start, n_scored) "
                            f"pairs, got {got!r}", len(cases))
        width = min(L, n - 1)
        scored = []
        for start, k in windows:
            if start < 0 or start + width > n - 1 or not 1 <= k <= width:
                return _verdict("sliding_windows", f"{where}: window ({start}, {k}) does not fit: "
                                f"a window reads data[start:start + {width}] and needs its "
                                "targets inside the data", len(cases))
            scored += range(start + width - k + 1, start + width + 1)
        missing = sorted(set(range(1, n)) - set(scored))
        twice = sorted({t for t in scored if scored.count(t) > 1})
        if missing or twice:
            problem = (f"bytes {missing[:5]} are never scored" if missing
                       else f"bytes {twice[:5]} are scored more than once")
            return _verdict("sliding_windows", f"{where}: {problem}; every byte 1..n-1 must be "
                            "scored exactly once", len(cases))
        want = _ref("aux_losses", "sliding_windows")(n, L, stride)
        if windows != want:
            return _verdict("sliding_windows", f"{where}: every byte is scored once, but not with "
                            f"the book's windows {want}: the first window "
                            "scores all its positions, each later one starts `stride` bytes on",
                            len(cases))
    return _verdict("sliding_windows", None, len(cases))


def shaw_attention(fn: Callable[..., torch.Tensor]) -> bool:
    """Check fn(q, k, v, w_k, w_v, mask=None) against Chapter 3's relative attention loop."""
    ref = _ref("relative_attention", "shaw_attention_loop")
    g = torch.Generator().manual_seed(0)
    shapes = [(2, 2, 5, 5, 4, 2), (1, 3, 3, 6, 8, 1), (2, 1, 4, 4, 4, 7), (1, 2, 6, 6, 4, 0)]
    n_checks = 2 * len(shapes)
    for B, H, Tq, Tk, D, K in shapes:
        q, k, v = (torch.randn(B, H, t, D, generator=g) for t in (Tq, Tk, Tk))
        w_k, w_v = torch.randn(2, 2 * K + 1, D, generator=g)
        for mask in (_ref("char_transformer", "causal_mask")(Tq, Tk), None):
            where = (f"for q {tuple(q.shape)}, k {tuple(k.shape)}, K={K}, "
                     f"{'with' if mask is not None else 'without'} a mask")
            got, err = _call(fn, q, k, v, w_k, w_v, mask)
            if err:
                return _verdict("shaw_attention", f"{where}: {err}", n_checks)
            want = ref(q, k, v, w_k, w_v, mask)
            if not isinstance(got, torch.Tensor) or got.shape != want.shape:
                shape = tuple(got.shape) if isinstance(got, torch.Tensor) else type(got).__name__
                return _verdict("shaw_attention", f"{where}: the output is {shape}, expected "
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
            return _verdict("shaw_attention", f"{where}: {hint}", n_checks)
    return _verdict("shaw_attention", None, n_checks)


def rel_shift(fn: Callable[[torch.Tensor], torch.Tensor]) -> bool:
    """Check fn(x) [..., Tq, Tk] -> [..., Tq, Tk], Transformer-XL's shift, on the unmasked entries.

    x[..., i, m] scores distance Tk - 1 - m; the result at [..., i, j] must be the score for
    distance (Tk - Tq + i) - j wherever j <= Tk - Tq + i. Other entries are not checked.
    """
    g = torch.Generator().manual_seed(0)
    shapes = [(3, 3), (3, 5), (1, 4), (4, 9), (2, 3, 4, 6), (5, 2, 2)]
    for shape in shapes:
        x = torch.randn(*shape, generator=g)
        qlen, klen = shape[-2:]
        dist = _ref("transformer_xl", "relative_distances")(qlen, klen)
        keep = dist >= 0
        where = f"for x of shape {shape} ({qlen} queries, memory {klen - qlen})"
        got, err = _call(fn, x)
        if err:
            return _verdict("rel_shift", f"{where}: {err}", len(shapes))
        if not isinstance(got, torch.Tensor) or got.shape != x.shape:
            found = tuple(got.shape) if isinstance(got, torch.Tensor) else type(got).__name__
            return _verdict("rel_shift", f"{where}: the output is {found}, expected the input's "
                            f"shape {shape}", len(shapes))

        def column(col: torch.Tensor) -> torch.Tensor:  # x[..., i, col[i, j]] on kept entries
            return x.gather(-1, col.clamp(0, klen - 1).expand(x.shape))[..., keep]

        if torch.allclose(got[..., keep], column(klen - 1 - dist)):
            continue
        wrong_side = torch.nn.functional.pad(x, (0, 1)).reshape(*shape[:-2], klen + 1, qlen)
        if torch.allclose(got[..., keep], wrong_side[..., 1:, :].reshape(shape)[..., keep]):
            hint = ("the zero column is padded on the right; it goes on the left (F.pad(x, (1, 0))), "
                    "so that row i slides left by Tq - 1 - i.")
        elif torch.allclose(got[..., keep], column(dist)):
            hint = ("the columns are read as ascending distances; column m of x holds distance "
                    "Tk - 1 - m (descending), so distance d is column Tk - 1 - d.")
        else:
            hint = ("some entries the causal mask keeps (j <= Tk - Tq + i) differ from "
                    "x[..., i, j + Tq - 1 - i].")
        return _verdict("rel_shift", f"{where}: {hint}", len(shapes))
    return _verdict("rel_shift", None, len(shapes))


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
    ref = _ref("xlnet", "permutation_masks")
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
    ref = _ref("xlnet", "permutation_masks")
    cases = _orders()
    for order, n_predict in cases:
        where = _order_text(order, n_predict)
        got, err = _call(fn, order) if n_predict is None else _call(fn, order, n_predict=n_predict)
        if err:
            return _verdict("permutation_masks", f"{where}: {err}", len(cases))
        if not isinstance(got, (tuple, list)) or len(got) != 2:
            return _verdict("permutation_masks", f"{where}: expected a pair (content_mask, "
                            f"query_mask), got {type(got).__name__}", len(cases))
        want = ref(order, n_predict=n_predict)
        shape = (*order.shape, order.size(-1))
        for mask, what in zip(got, ("content mask", "query mask")):
            problem = _bool_masks(mask, where, shape, what)
            if problem:
                return _verdict("permutation_masks", problem, len(cases))
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
        return _verdict("permutation_masks", f"{where}: {hint}", len(cases))
    return _verdict("permutation_masks", None, len(cases))


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
    ref = _ref("xlnet", "permutation_masks")
    cases = [(order, None) for order, n in _orders() if n is None]
    for order, _ in cases:
        where = _order_text(order, None)
        got, err = _call(fn, order)
        if err:
            return _verdict("query_stream_mask", f"{where}: {err}", len(cases))
        want = ref(order)[1]
        problem = _bool_masks(got, where, tuple(want.shape), "query mask")
        if problem:
            return _verdict("query_stream_mask", problem, len(cases))
        if torch.equal(got, want):
            continue
        every = torch.ones(order.shape, dtype=torch.bool)
        rank = _ranks(order, None)
        if torch.equal(got, ~want):
            hint = "the mask is inverted: True where a position MAY attend."
        else:
            hint = (_mask_slip(got, want, every, order, None, "query")
                    or _first_wrong(got, want, every, rank, "query"))
        return _verdict("query_stream_mask", f"{where}: {hint}", len(cases))
    return _verdict("query_stream_mask", None, len(cases))


def rel_shift_bi(fn: Callable[[torch.Tensor, int], torch.Tensor]) -> bool:
    """Check fn(x, klen): x [..., Tq, klen + Tq - 1] scored against the descending distances
    klen - 1, ..., -(Tq - 1) -> [..., Tq, klen], the score of query i and key j, whose
    distance is (klen - Tq + i) - j. Every entry is checked: keys lie on both sides."""
    import torch.nn.functional as F

    ref = _ref("xlnet", "rel_shift_bi")
    g = torch.Generator().manual_seed(0)
    shapes = [((), 3, 3), ((), 3, 5), ((), 1, 4), ((), 4, 9), ((2, 3), 4, 6), ((5,), 2, 2)]
    for lead, qlen, klen in shapes:
        x = torch.randn(*lead, qlen, klen + qlen - 1, generator=g)
        where = (f"for x of shape {tuple(x.shape)} ({qlen} queries, klen={klen}: memory "
                 f"{klen - qlen})")
        got, err = _call(fn, x, klen)
        if err:
            return _verdict("rel_shift_bi", f"{where}: {err}", len(shapes))
        want = ref(x, klen)
        if not isinstance(got, torch.Tensor):
            return _verdict("rel_shift_bi", f"{where}: expected a torch.Tensor, got "
                            f"{type(got).__name__}", len(shapes))
        if got.shape != want.shape:
            cut = got.shape[:-1] == want.shape[:-1] and got.size(-1) > klen and torch.allclose(
                got[..., :klen], want)
            hint = (" Right up to column klen: cut the result to its first klen columns, one "
                    "per key." if cut else "")
            return _verdict("rel_shift_bi", f"{where}: the output is {tuple(got.shape)}, "
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
        return _verdict("rel_shift_bi", f"{where}: {hint}", len(shapes))
    return _verdict("rel_shift_bi", None, len(shapes))


# ---------------------------------------------------------------- Chapter 6: SegTree

_TREE_CASES = [(16, 7, 1), (16, 0, 1), (16, 15, 2), (11, 5, 1), (13, 12, 1), (100, 37, 2),
               (1, 0, 1), (33, 20, 3)]


def _reference_spans(n: int, i: int, k: int, causal: bool) -> list[tuple[int, int]]:
    segtree = importlib.import_module(".segtree", __package__)
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
    segtree = importlib.import_module(".segtree", __package__)
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


# ---------------------------------------------------------------- Chapter 2: extra targets


def ahead_pairs(fn: Callable[..., tuple]) -> bool:
    """Check fn(h [B, T, C], targets [B, T], j) -> (h kept, targets kept): Chapter 2's extra
    targets, where position t's state predicts the byte j steps after the next one."""
    cases = [(1, 8, 1), (2, 8, 2), (1, 5, 4), (3, 6, 0)]
    for B, T, j in cases:
        # Position t of the window holds t in every channel; targets[t] is byte t + 1 (the
        # next byte), so a correct pair reads (t, t + 1 + j).
        h = torch.arange(T, dtype=torch.float).repeat(B, 3, 1).transpose(1, 2)  # (B, T, 3)
        targets = torch.arange(1, T + 1).repeat(B, 1)  # (B, T)
        got, err = _call(fn, h.clone(), targets.clone(), j)
        if err:
            return _verdict("ahead_pairs", err, len(cases))
        where = f"for T={T}, j={j}"
        try:
            kept_h, kept_t = got
            shapes = (tuple(kept_h.shape), tuple(kept_t.shape))
        except (TypeError, ValueError, AttributeError):
            return _verdict("ahead_pairs", f"{where}: expected a pair (h kept [B, T - j, C], "
                            f"targets kept [B, T - j]), got {got!r}", len(cases))
        want = ((B, T - j, 3), (B, T - j))
        if shapes != want:
            hint = ("one position too few: the byte j after the next exists for the first T - j "
                    "positions" if shapes[1][-1:] == (T - j - 1,) else
                    "the byte j after the next exists for the first T - j positions")
            return _verdict("ahead_pairs", f"{where}: shapes {shapes}, expected {want}: {hint}.",
                            len(cases))
        pos, byte = kept_h[0, :, 0].long(), kept_t[0].long()  # which position predicts which byte
        if torch.equal(byte - pos, torch.full_like(pos, 1 + j)):
            continue
        gap = (byte - pos)[0].item()
        if gap == 1 and j:
            hint = "each position predicts its next byte: that is the main loss, not j ahead"
        elif gap < 0 or (j and gap == 1 - j):
            hint = ("positions predict bytes before them: keep the first T - j states and drop "
                    "the first j targets, not the other way round")
        elif gap == 2 + j:
            hint = ("one step too far: targets[t] is already the next byte, so the byte j after "
                    "it is targets[t + j]")
        else:
            hint = f"position t must predict byte t + 1 + j = t + {1 + j}; it predicts t + {gap}"
        return _verdict("ahead_pairs", f"{where}: position 0 predicts byte {byte[0].item()}: "
                        f"{hint}.", len(cases))
    return _verdict("ahead_pairs", None, len(cases))


# ---------------------------------------------------------------- Chapter 4: Transformer-XL


def four_term_score(fn: Callable[..., torch.Tensor]) -> bool:
    """Check fn(q [B, H, Tq, D], k [B, H, Tk, D], r_pair [H, Tq, Tk, D], u, v [H, D]) ->
    [B, H, Tq, Tk]: Transformer-XL's unscaled score, terms (a) + (b) + (c) + (d)."""
    g = torch.Generator().manual_seed(0)
    cases = [(1, 1, 3, 3, 4), (2, 3, 4, 7, 5), (1, 2, 1, 6, 8)]
    for B, H, Tq, Tk, D in cases:
        q, k = torch.randn(B, H, Tq, D, generator=g), torch.randn(B, H, Tk, D, generator=g)
        r = torch.randn(H, Tq, Tk, D, generator=g)
        u, v = torch.randn(H, D, generator=g), torch.randn(H, D, generator=g)
        where = f"for B, H, Tq, Tk, D = {B, H, Tq, Tk, D}"
        got, err = _call(fn, q.clone(), k.clone(), r.clone(), u.clone(), v.clone())
        if err:
            return _verdict("four_term_score", f"{where}: {err}", len(cases))
        if not isinstance(got, torch.Tensor) or got.shape != (B, H, Tq, Tk):
            found = tuple(got.shape) if isinstance(got, torch.Tensor) else type(got).__name__
            return _verdict("four_term_score", f"{where}: the output is {found}, expected "
                            f"{(B, H, Tq, Tk)}", len(cases))
        terms = {"a": q @ k.transpose(-2, -1), "b": torch.einsum("bhid,hijd->bhij", q, r),
                 "c": (u[:, None, :] @ k.transpose(-2, -1)).expand(B, H, Tq, Tk),
                 "d": (r @ v[:, None, :, None]).squeeze(-1).expand(B, H, Tq, Tk)}
        want = sum(terms.values())
        if torch.allclose(got, want, atol=1e-4):
            continue
        swapped = terms["a"] + terms["b"] + u[:, None, None, :].mul(r).sum(-1) + (
            v[:, None, :] @ k.transpose(-2, -1))
        if torch.allclose(got, want / math.sqrt(D), atol=1e-4):
            hint = ("it is divided by sqrt(D): the checker wants the unscaled score (the "
                    "layer scales it once, after the four terms)")
        elif torch.allclose(got, swapped, atol=1e-4):
            hint = ("u and v are swapped: u goes with the content keys (term c), v with the "
                    "distances (term d)")
        else:
            missing = [t for t in terms if torch.allclose(got, want - terms[t], atol=1e-4)]
            hint = (f"term ({missing[0]}) is missing" if missing else
                    "it differs from (a) + (b) + (c) + (d) = q.k_j + q.r_ij + u.k_j + v.r_ij")
        return _verdict("four_term_score", f"{where}: {hint}.", len(cases))
    return _verdict("four_term_score", None, len(cases))


def memory_update(fn: Callable[..., list]) -> bool:
    """Check fn(inputs, mems, mem_len) -> new mems: per layer the last mem_len rows of
    [mem; input] ([B, <= mem_len, C]), detached from the graph."""
    g = torch.Generator().manual_seed(0)
    cases = [(2, 3, 4, 5), (1, 0, 4, 3), (2, 6, 3, 4), (1, 2, 3, 0)]  # B, M, T, mem_len
    for B, M, T, mem_len in cases:
        inputs = [torch.randn(B, T, 3, generator=g).requires_grad_() for _ in range(2)]
        mems = [torch.randn(B, M, 3, generator=g) for _ in range(2)]
        where = f"for a memory of {M}, a segment of {T} and mem_len={mem_len}"
        got, err = _call(fn, [h * 1 for h in inputs], [m.clone() for m in mems], mem_len)
        if err:
            return _verdict("memory_update", f"{where}: {err}", len(cases))
        if not isinstance(got, (list, tuple)) or len(got) != 2:
            return _verdict("memory_update", f"{where}: expected a list of one tensor per "
                            f"layer (2), got {type(got).__name__}", len(cases))
        for h, m, new in zip(inputs, mems, got):
            cat = torch.cat([m, h.detach()], dim=1)
            want = cat[:, max(0, cat.size(1) - mem_len):]
            if not isinstance(new, torch.Tensor) or new.shape != want.shape:
                found = tuple(new.shape) if isinstance(new, torch.Tensor) else type(new).__name__
                return _verdict("memory_update", f"{where}: a layer's memory is {found}, "
                                f"expected {tuple(want.shape)}: keep min(mem_len, M + T) rows",
                                len(cases))
            if not torch.equal(new.detach(), want):
                if torch.equal(new.detach(), cat[:, :want.size(1)]):
                    hint = "it keeps the oldest rows; the memory keeps the most recent ones"
                elif torch.equal(new.detach(), torch.cat([h.detach(), m], 1)[:, -want.size(1):]):
                    hint = "the segment is put before the memory; the order is [mem; input]"
                else:
                    hint = "the rows differ from the last mem_len rows of [mem; input]"
                return _verdict("memory_update", f"{where}: {hint}.", len(cases))
            if new.requires_grad:
                return _verdict("memory_update", f"{where}: the new memory is still attached "
                                "to the graph; detach it (stop-gradient), or every step "
                                "backpropagates into all earlier segments.", len(cases))
    return _verdict("memory_update", None, len(cases))


def stream_batches(fn: Callable[..., object]) -> bool:
    """Check fn(data [N], batch_size, seg_len) -> iterable of (x, y) [B, <= seg_len]: B
    contiguous streams, read in consecutive segments, y the byte after each x."""
    ref = _ref("data", "stream_batches")
    cases = [(101, 4, 8), (64, 2, 5), (37, 3, 12), (20, 1, 4)]
    for N, B, L in cases:
        data = torch.arange(N) % 251
        where = f"for {N} bytes, batch_size={B}, seg_len={L}"
        got, err = _call(lambda: [tuple(p) for p in fn(data.clone(), B, L)])
        if err:
            return _verdict("stream_batches", f"{where}: {err}", len(cases))
        want = list(ref(data, B, L))
        if len(got) != len(want):
            return _verdict("stream_batches", f"{where}: {len(got)} batches, expected "
                            f"{len(want)} (each stream holds (N - 1) // B = {(N - 1) // B} "
                            "inputs, cut into segments; the last may be shorter)", len(cases))
        for n, ((x, y), (wx, wy)) in enumerate(zip(got, want)):
            if not (isinstance(x, torch.Tensor) and isinstance(y, torch.Tensor)
                    and x.shape == wx.shape and y.shape == wy.shape):
                return _verdict("stream_batches", f"{where}: batch {n} is not x, y of shape "
                                f"{tuple(wx.shape)}", len(cases))
            if torch.equal(x.long(), wx) and torch.equal(y.long(), wy):
                continue
            if torch.equal(x.long(), wx) and torch.equal(y.long(), wx):
                hint = "y equals x; y is the next byte of each x (shifted by one)"
            elif B > 1 and x[1, 0].item() == data[1].item():
                hint = ("the streams interleave the bytes (row b = data[b::B]); each row must "
                        "be one contiguous stretch of text, so that it reads on from the "
                        "previous batch's row")
            else:
                hint = (f"batch {n} differs: row b must hold bytes b * n + {n * L} onwards of "
                        f"the text, n = (N - 1) // B, continuing row b of the batch before")
            return _verdict("stream_batches", f"{where}: {hint}.", len(cases))
    return _verdict("stream_batches", None, len(cases))


def _xl_runner(model, calls: list) -> Callable:
    """run(tokens, mems) -> (logits, hidden) over one segment of a TransformerXL: hidden are
    the layers' inputs for this segment, still attached to the graph. Each call appends
    (tokens, its embeddings as a leaf tensor) to calls, so that a gradient can be traced."""

    def run(tokens, mems=None):
        hidden = []

        def as_leaf(module, args, out):
            calls.append((tokens, out.detach().requires_grad_(True)))
            return calls[-1][1]

        hooks = [layer.register_forward_pre_hook(lambda mod, args: hidden.append(args[0]))
                 for layer in model.layers]
        hooks.append(model.word_emb.register_forward_hook(as_leaf))
        try:
            logits, _ = model(tokens, mems, mem_len=0)  # the memory is the caller's to build
        finally:
            for hook in hooks:
                hook.remove()
        return logits, hidden

    return run


def _xl_two(run, tokens, split, mems, keep, *, new_first=False, carry=True):
    """The reference two-segment pass, or a slip of it: second-segment logits only."""
    _, hidden = run(tokens[:, :split], mems)
    if carry:
        cat = [torch.cat([h, m] if new_first else [m, h], dim=1) for m, h in zip(mems, hidden)]
        mems = [c[:, c.size(1) - min(keep, c.size(1)):].detach() for c in cat]
    return run(tokens[:, split:], mems if carry else None)[0]


def xl_two_segments(fn: Callable[..., torch.Tensor]) -> bool:
    """Check fn(run, tokens, split, mems, mem_len) -> logits [B, T, V]: tokens [B, T] read as
    two segments, tokens[:, :split] from the memory mems, then the rest from the memory that
    the first left. run(tokens, mems) -> (logits, hidden) is one segment of Chapter 4's
    TransformerXL; hidden are its layers' inputs [B, T, C], what memories are made of.
    With mem_len = M + split the result must equal one pass over all of tokens."""
    XL, Config = _ref("transformer_xl", "TransformerXL"), _ref("transformer_xl",
                                                               "TransformerXLConfig")
    encode = _ref("data", "encode")
    with torch.random.fork_rng():  # leave the caller's random state as it was
        torch.manual_seed(0)
        model = XL(Config(n_layer=2, d_model=32, n_head=2, d_head=16, d_inner=64, tgt_len=8,
                          mem_len=8)).eval()  # section 4.6's tiny model and seed
    # weights 10 times their initial size: at init, attention is so flat that some slips
    # move the logits by only about 1e-5 (section 4.6)
    _ref("transformer_xl", "sharpened")(model)
    text = encode("segment one, then segment two!")[None]  # (1, 30), section 4.6's text
    pair = torch.stack([encode("memory carries the first part "), text[0]])  # (2, 30)
    with torch.no_grad():
        prefixes = torch.stack([encode("before"), encode("prefix")])  # (2, 6)
        start = model(prefixes, mem_len=6)[1]  # per layer [2, 6, C]
    # (tokens, split, starting memory): section 4.6's own test first, then two streams
    # that start from a memory of 6, where the order of [memory; segment] shows
    cases = [(text, 13, model.init_mems(1)), (pair, 11, start)]
    for tokens, split, mems in cases:
        M = mems[0].size(1)
        mem_len = M + split  # the shortest memory that holds all the first segment sees
        where = (f"for tokens {tuple(tokens.shape)}, split={split}, a starting memory of {M} "
                 f"and mem_len={mem_len}")
        calls: list = []
        run = _xl_runner(model, calls)
        got, err = _call(fn, run, tokens, split, [m.clone() for m in mems], mem_len)
        if err:
            return _verdict("xl_two_segments", f"{where}: {err}", len(cases))
        with torch.no_grad():
            want = model(tokens, mems, mem_len=0)[0]  # one pass over the whole sequence
        if not isinstance(got, torch.Tensor) or got.shape != want.shape:
            found = tuple(got.shape) if isinstance(got, torch.Tensor) else type(got).__name__
            return _verdict("xl_two_segments", f"{where}: the output is {found}, expected "
                            f"{tuple(want.shape)}: the logits of both segments, in order",
                            len(cases))
        if not torch.allclose(got, want, atol=1e-4):
            with torch.no_grad():
                refs = {"no memory": _xl_two(run, tokens, split, mems, mem_len, carry=False),
                        "old memory": run(tokens[:, split:], mems)[0],
                        "new first": _xl_two(run, tokens, split, mems, mem_len, new_first=True)}
                short = [k for k in range(mem_len)
                         if torch.allclose(got[:, split:],
                                           _xl_two(run, tokens, split, mems, k), atol=1e-4)]
            second = got[:, split:]
            if not torch.allclose(got[:, :split], want[:, :split], atol=1e-4):
                swapped = torch.cat([want[:, split:], want[:, :split]], dim=1)
                hint = ("the logits are in the wrong order; return [first segment; second "
                        "segment]" if torch.allclose(got, swapped, atol=1e-4) else
                        "the first segment's logits differ from one pass: run it from the "
                        "memory you are given (mems)")
            elif torch.allclose(second, refs["no memory"], atol=1e-4):
                hint = ("the second segment ran without memory; carry the memory that the "
                        "first segment left")
            elif M and torch.allclose(second, refs["old memory"], atol=1e-4):
                hint = ("the second segment ran from the old memory; add the first segment's "
                        "hidden states to it")
            elif M and torch.allclose(second, refs["new first"], atol=1e-4):
                hint = ("the memory is concatenated as [segment; memory]; it must be [memory; "
                        "segment], oldest first, as the positions count back from the query")
            elif short:
                hint = (f"the memory is too short: the second segment saw only the last "
                        f"{short[-1]} states of each layer; keep the last mem_len = M + split = "
                        f"{mem_len}")
            else:
                err_max = (second - want[:, split:]).abs().max().item()
                hint = (f"the second segment's logits differ from one pass by up to "
                        f"{err_max:.3g}")
            return _verdict("xl_two_segments", f"{where}: {hint}.", len(cases))
        firsts = [leaf for t, leaf in calls if torch.equal(t, tokens[:, :split])]
        if firsts and got.requires_grad:
            (grad,) = torch.autograd.grad(got[:, split:].sum(), firsts[0], allow_unused=True)
            if grad is not None and grad.abs().max() > 0:
                return _verdict("xl_two_segments", f"{where}: the values are right, but the "
                                "memory is still attached to the graph: the second segment's "
                                "loss backpropagates into the first. Detach it "
                                "(stop-gradient).", len(cases))
    return _verdict("xl_two_segments", None, len(cases))


# ---------------------------------------------------------------- Chapter 3: relative positions


def relative_index(fn: Callable[..., torch.Tensor]) -> bool:
    """Check fn(qlen, klen, max_relative) -> long [qlen, klen]: row clip(j - i, -K, K) + K of
    the distance table for query i (the last qlen of klen positions) and key j."""
    ref = _ref("relative_attention", "relative_index")
    cases = [(4, 4, 2), (2, 5, 2), (3, 7, 1), (6, 6, 9), (5, 5, 0), (1, 4, 3)]
    for qlen, klen, K in cases:
        where = f"for qlen={qlen}, klen={klen}, max_relative={K}"
        got, err = _call(fn, qlen, klen, K)
        if err:
            return _verdict("relative_index", f"{where}: {err}", len(cases))
        if not isinstance(got, torch.Tensor):
            return _verdict("relative_index", f"expected a torch.Tensor, got "
                            f"{type(got).__name__}", len(cases))
        if tuple(got.shape) != (qlen, klen):
            return _verdict("relative_index", f"{where}: the shape is {tuple(got.shape)}, "
                            f"expected ({qlen}, {klen}): rows are queries, columns keys",
                            len(cases))
        if got.dtype.is_floating_point or got.dtype == torch.bool:
            return _verdict("relative_index", f"{where}: the dtype is {got.dtype}; rows of "
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
        return _verdict("relative_index", f"{where}: {hint}.", len(cases))
    return _verdict("relative_index", None, len(cases))


def distance_weights(fn: Callable[..., torch.Tensor]) -> bool:
    """Check fn(p [B, H, Tq, Tk], index [Tq, Tk], n_distances) -> [B, H, Tq, n_distances]: the
    attention weight each query pays to each distance, summed over the keys at that distance
    (the value side of Chapter 3's bucket form)."""
    ref = _ref("relative_attention", "distance_weights")
    rel_index = _ref("relative_attention", "relative_index")
    mask_of = _ref("char_transformer", "causal_mask")
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
        got, err = _call(fn, p.clone(), index.clone(), n)
        if err:
            return _verdict("distance_weights", f"{where}: {err}", len(cases))
        want = ref(p, index, n)
        if not isinstance(got, torch.Tensor) or got.shape != want.shape:
            shape = tuple(got.shape) if isinstance(got, torch.Tensor) else type(got).__name__
            hint = (" (one column per key: gather reads a column for each key, but here each "
                    "key's weight must be added into the column its index names: scatter_add)"
                    if isinstance(got, torch.Tensor) and got.shape[-1:] == (Tk,) else "")
            return _verdict("distance_weights", f"{where}: the output is {shape}, expected "
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
        return _verdict("distance_weights", f"{where}: {hint}.", len(cases))
    return _verdict("distance_weights", None, len(cases))
