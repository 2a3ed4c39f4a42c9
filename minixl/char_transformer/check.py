"""Checkers for Chapter 1's exercises (a character-level transformer): causal_mask,
attention and sinusoid_positions, each compared with its reference in
minixl.char_transformer. Hand-written (not generated).
"""

from __future__ import annotations

import math
from typing import Callable

import torch

from .. import char_transformer
from ..check.verdicts import call, verdict


def causal_mask(fn: Callable[..., torch.Tensor]) -> bool:
    """Check fn(qlen, klen) -> bool [qlen, klen], True where query i may attend key j."""
    cases = [(1, 1), (4, 4), (3, 7), (5, 6), (2, 2), (6, 6)]
    for qlen, klen in cases:
        got, err = call(fn, qlen, klen)
        if err:
            return verdict("causal_mask", err, len(cases))
        want = char_transformer.causal_mask(qlen, klen)
        if not isinstance(got, torch.Tensor):
            return verdict("causal_mask", f"expected a torch.Tensor, got {type(got).__name__}", len(cases))
        if tuple(got.shape) != (qlen, klen):
            return verdict("causal_mask", f"for qlen={qlen}, klen={klen} the shape is "
                            f"{tuple(got.shape)}, expected ({qlen}, {klen}): rows are queries, "
                            "columns are keys", len(cases))
        if got.dtype != torch.bool:
            return verdict("causal_mask", f"dtype is {got.dtype}, expected torch.bool "
                            "(True = may attend)", len(cases))
        if torch.equal(got, ~want):
            return verdict("causal_mask", "the mask is inverted: use True where a query MAY "
                            "attend, as torch's scaled_dot_product_attention does", len(cases))
        bad = (got != want).nonzero()
        if len(bad):
            i, j = (int(t) for t in bad[0])
            mem = klen - qlen
            what = "may not" if want[i, j] else "may"
            return verdict("causal_mask", f"for qlen={qlen}, klen={klen}, your mask says query "
                            f"{i} {what} attend key {j}. Query {i} sits at position {mem + i} "
                            f"(the first {mem} keys are memory), so it sees keys 0..{mem + i}.",
                            len(cases))
    return verdict("causal_mask", None, len(cases))


def attention(fn: Callable[..., torch.Tensor]) -> bool:
    """Check fn(q, k, v, mask=None) against scaled dot-product attention."""
    ref = char_transformer.attention
    g = torch.Generator().manual_seed(0)
    shapes = [(2, 3, 5, 5, 8), (1, 2, 3, 7, 4), (2, 1, 6, 6, 16)]
    n_checks = 2 * len(shapes)
    for B, H, Tq, Tk, D in shapes:
        q, k, v = (torch.randn(B, H, t, D, generator=g) for t in (Tq, Tk, Tk))
        for mask in (None, char_transformer.causal_mask(Tq, Tk)):
            got, err = call(fn, q, k, v, mask)
            if err:
                return verdict("attention", err, n_checks)
            want = ref(q, k, v, mask)
            if not isinstance(got, torch.Tensor) or got.shape != want.shape:
                shape = tuple(got.shape) if isinstance(got, torch.Tensor) else type(got).__name__
                return verdict("attention", f"for q {tuple(q.shape)} and k, v {tuple(k.shape)} "
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
            return verdict("attention", f"{masked} a mask, for q {tuple(q.shape)}: {hint}", n_checks)
    return verdict("attention", None, n_checks)


def sinusoid_positions(fn: Callable[..., torch.Tensor]) -> bool:
    """Check fn(length, d_model) -> [length, d_model], [sin | cos] halves."""
    cases = [(1, 4), (10, 8), (50, 32)]
    for length, d in cases:
        got, err = call(fn, length, d)
        if err:
            return verdict("sinusoid_positions", err, len(cases))
        want = char_transformer.sinusoid_positions(length, d)
        if not isinstance(got, torch.Tensor) or got.shape != want.shape:
            return verdict("sinusoid_positions", f"for length={length}, d_model={d} expected a "
                            f"tensor of shape {tuple(want.shape)}", len(cases))
        if not torch.allclose(got.float(), want, atol=1e-5):
            inter = torch.stack([want[:, : d // 2], want[:, d // 2:]], -1).reshape(length, d)
            hint = ("you interleaved sin and cos; this book puts all sines first, then all "
                    "cosines" if torch.allclose(got.float(), inter, atol=1e-5)
                    else "the values differ; position p, pair k uses angle p / 10000^(2k/d)")
            return verdict("sinusoid_positions", f"for length={length}, d_model={d}: {hint}",
                            len(cases))
    return verdict("sinusoid_positions", None, len(cases))
