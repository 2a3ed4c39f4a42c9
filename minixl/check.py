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
           "sliding_windows", "shaw_attention", "rel_shift"]


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
