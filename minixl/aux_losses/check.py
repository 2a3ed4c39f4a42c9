"""Checkers for Chapter 2's exercises (auxiliary losses): intermediate_weight,
sliding_windows, ahead_pairs (the extra targets), step_weight (a step schedule) and
every_start_table (both protocols' losses in one table), compared with the references in
minixl.aux_losses or with what the chapter asks of them. Hand-written (not generated).
"""

from __future__ import annotations

from typing import Callable

import torch

from .. import aux_losses, char_transformer
from ..check.verdicts import call, verdict


def intermediate_weight(fn: Callable[[int, int, float], float]) -> bool:
    """Check fn(layer, n_layer, progress) against Chapter 2's intermediate layer schedule."""
    cases = [(l, n, p) for n in (2, 4, 16) for l in range(1, n)
             for p in (0.0, 0.5 * l / (2 * n), l / (2 * n), 0.5, 1.0)]
    for layer, n, p in cases:
        got, err = call(fn, layer, n, p)
        if err:
            return verdict("intermediate_weight", err, len(cases))
        want = aux_losses.intermediate_weight(layer, n, p)
        try:
            ok = abs(float(got) - want) < 1e-6
        except (TypeError, ValueError):
            return verdict("intermediate_weight", f"expected a number, got {got!r}", len(cases))
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
        return verdict("intermediate_weight", f"for layer={layer}, n_layer={n}, progress={p:g} "
                        f"you return {got!r}: {hint}.", len(cases))
    return verdict("intermediate_weight", None, len(cases))


def sliding_windows(fn: Callable[[int, int, int], list]) -> bool:
    """Check fn(n, seq_len, stride) -> [(start, n_scored), ...] scores bytes 1..n-1 once each."""
    cases = [(2, 4, 1), (11, 4, 1), (11, 4, 3), (11, 4, 4), (50, 8, 5), (9, 16, 2)]
    for n, L, stride in cases:
        got, err = call(fn, n, L, stride)
        if err:
            return verdict("sliding_windows", err, len(cases))
        where = f"for n={n}, seq_len={L}, stride={stride}"
        try:
            windows = [(int(s), int(k)) for s, k in got]
        except (TypeError, ValueError):
            return verdict("sliding_windows", f"{where}: expected a list of (start, n_scored) "
                            f"pairs, got {got!r}", len(cases))
        width = min(L, n - 1)
        scored = []
        for start, k in windows:
            if start < 0 or start + width > n - 1 or not 1 <= k <= width:
                return verdict("sliding_windows", f"{where}: window ({start}, {k}) does not fit: "
                                f"a window reads data[start:start + {width}] and needs its "
                                "targets inside the data", len(cases))
            scored += range(start + width - k + 1, start + width + 1)
        missing = sorted(set(range(1, n)) - set(scored))
        twice = sorted({t for t in scored if scored.count(t) > 1})
        if missing or twice:
            problem = (f"bytes {missing[:5]} are never scored" if missing
                       else f"bytes {twice[:5]} are scored more than once")
            return verdict("sliding_windows", f"{where}: {problem}; every byte 1..n-1 must be "
                            "scored exactly once", len(cases))
        want = aux_losses.sliding_windows(n, L, stride)
        if windows != want:
            return verdict("sliding_windows", f"{where}: every byte is scored once, but not with "
                            f"the book's windows {want}: the first window "
                            "scores all its positions, each later one starts `stride` bytes on",
                            len(cases))
    return verdict("sliding_windows", None, len(cases))


def ahead_pairs(fn: Callable[..., tuple]) -> bool:
    """Check fn(h [B, T, C], targets [B, T], j) -> (h kept, targets kept): Chapter 2's extra
    targets, where position t's state predicts the byte j steps after the next one."""
    cases = [(1, 8, 1), (2, 8, 2), (1, 5, 4), (3, 6, 0)]
    for B, T, j in cases:
        # Position t of the window holds t in every channel; targets[t] is byte t + 1 (the
        # next byte), so a correct pair reads (t, t + 1 + j).
        h = torch.arange(T, dtype=torch.float).repeat(B, 3, 1).transpose(1, 2)  # (B, T, 3)
        targets = torch.arange(1, T + 1).repeat(B, 1)  # (B, T)
        got, err = call(fn, h.clone(), targets.clone(), j)
        if err:
            return verdict("ahead_pairs", err, len(cases))
        where = f"for T={T}, j={j}"
        try:
            kept_h, kept_t = got
            shapes = (tuple(kept_h.shape), tuple(kept_t.shape))
        except (TypeError, ValueError, AttributeError):
            return verdict("ahead_pairs", f"{where}: expected a pair (h kept [B, T - j, C], "
                            f"targets kept [B, T - j]), got {got!r}", len(cases))
        want = ((B, T - j, 3), (B, T - j))
        if shapes != want:
            hint = ("one position too few: the byte j after the next exists for the first T - j "
                    "positions" if shapes[1][-1:] == (T - j - 1,) else
                    "the byte j after the next exists for the first T - j positions")
            return verdict("ahead_pairs", f"{where}: shapes {shapes}, expected {want}: {hint}.",
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
        return verdict("ahead_pairs", f"{where}: position 0 predicts byte {byte[0].item()}: "
                        f"{hint}.", len(cases))
    return verdict("ahead_pairs", None, len(cases))


def _is(value, want: float) -> bool:
    try:
        return abs(float(value) - want) < 1e-6
    except (TypeError, ValueError):
        return False


def step_weight(fn: Callable[[int, int, float], float]) -> bool:
    """Check fn(layer, n_layer, progress) -> the step schedule of exercise 6: layer l of n
    keeps its full weight l/n while progress < l/(2n), then 0."""
    cases = [(l, n, p) for n in (2, 4, 16) for l in range(1, n)
             for p in (0.0, 0.5 * l / (2 * n), l / (2 * n), 0.75 * l / n, l / n, 0.5, 1.0)]
    fade = aux_losses.intermediate_weight
    for layer, n, p in cases:
        got, err = call(fn, layer, n, p)
        if err:
            return verdict("step_weight", err, len(cases))
        stop = layer / (2 * n)
        want = layer / n if p < stop else 0.0
        try:
            value = float(got)
        except (TypeError, ValueError):
            return verdict("step_weight", f"expected a number, got {got!r}", len(cases))
        if abs(value - want) < 1e-6:
            continue
        if value == 0.0 and want > 0 and p == 0.0:
            after, _ = call(fn, layer, n, 1.0)
            if _is(after, layer / n):
                hint = ("the comparison is the wrong way round: the loss is off at the start "
                        "and on at the end; keep it while progress < l/(2n)")
            else:
                hint = ("the weight is 0 from the start; with integer division l // (2n) and "
                        "l // n are 0 for every layer: use real division")
        elif abs(value - fade(layer, n, p)) < 1e-6:
            hint = (f"that is the chapter's linear fade; the step holds the full {layer}/{n} "
                    f"until progress {stop:g}")
        elif p >= stop and abs(value - layer / n) < 1e-6:  # still on: probe past the stop
            later, _ = call(fn, layer, n, 1.5 * stop)
            at_l_n, _ = call(fn, layer, n, layer / n)
            if _is(later, 0.0):
                hint = (f"at progress exactly l/(2n) = {stop:g} the loss is already off: "
                        "compare progress < l/(2n), not <=")
            elif _is(at_l_n, 0.0):
                hint = f"the switch-off is at l/(2n) = {stop:g}, not at l/n = {layer / n:g}"
            else:
                hint = f"the loss must switch off at progress l/(2n) = {stop:g}"
        elif want > 0:
            hint = (f"before the switch-off the weight is the full l/n = {want:g} (the weight "
                    "layer l starts with)")
        else:
            hint = f"from progress l/(2n) = {stop:g} on the weight is 0"
        return verdict("step_weight", f"for layer={layer}, n_layer={n}, progress={p:g} you "
                        f"return {got!r}: {hint}.", len(cases))
    return verdict("step_weight", None, len(cases))


def every_start_table(fn: Callable[..., torch.Tensor]) -> bool:
    """Check fn(model, data, L) -> [len(data) - L, L]: row s holds the bits (not nats) of the
    byte after each position of the window data[s : s + L], for every start s whose window
    and next byte fit, as section 2.7 builds it. data is a uint8 tensor of bytes."""
    import math

    import torch.nn.functional as F

    config = char_transformer.CharTransformerConfig(
        n_layer=1, d_model=16, n_head=2, d_inner=32, block_size=8)
    with torch.random.fork_rng():  # the reader's own random state is left alone
        torch.manual_seed(0)
        model = char_transformer.CharTransformer(config).eval()
    g = torch.Generator().manual_seed(0)
    cases = [(torch.randint(0, 256, (n,), generator=g, dtype=torch.uint8), L)
             for n, L in ((21, 4), (30, 8), (9, 8))]
    for data, L in cases:
        where = f"for {len(data)} bytes and L={L}"
        got, err = call(fn, model, data.clone(), L)
        if err:
            return verdict("every_start_table", f"{where}: {err}", len(cases))
        with torch.no_grad():
            seq = torch.stack([data[s:s + L + 1].long() for s in range(len(data) - L)])
            logits = model(seq[:, :-1]).transpose(1, 2)  # (W, V, L)
            nll = F.cross_entropy(logits, seq[:, 1:], reduction="none")
            unshifted = F.cross_entropy(logits, seq[:, :-1], reduction="none")
        want = nll / math.log(2)
        if not isinstance(got, torch.Tensor):
            return verdict("every_start_table", f"expected a torch.Tensor, got "
                            f"{type(got).__name__}", len(cases))
        if tuple(got.shape) != tuple(want.shape):
            W = len(data) - L
            if tuple(got.shape) == (L, W):
                hint = "the table is transposed: one row per start, one column per position"
            elif got.dim() == 2 and got.size(0) == W - 1:
                hint = (f"one start too few: a window of L + 1 bytes fits at starts 0 to "
                        f"len(data) - L - 1, so there are len(data) - L = {W} rows")
            else:
                hint = "rows are starts, columns the L positions of the window"
            return verdict("every_start_table", f"{where}: the shape is "
                            f"{tuple(got.shape)}, expected {tuple(want.shape)}: {hint}.",
                            len(cases))
        got = got.detach().float()
        if torch.allclose(got, want, atol=1e-4):
            continue
        if torch.allclose(got, nll, atol=1e-4):
            hint = "these are nats: divide the cross-entropy by log 2 for bits"
        elif torch.allclose(got, unshifted / math.log(2), atol=1e-4):
            hint = ("the targets are not shifted: position t predicts byte t + 1 of the "
                    "window, the inputs are bytes 0 to L - 1 and the targets bytes 1 to L")
        else:
            hint = "the values differ from the loss of each window's next bytes, in bits"
        return verdict("every_start_table", f"{where}: {hint}.", len(cases))
    return verdict("every_start_table", None, len(cases))
