"""Checkers for Chapter 4's exercises (Transformer-XL): rel_shift, four_term_score,
memory_update, stream_batches, same_length_mask and xl_two_segments, compared with the
references in minixl.transformer_xl and minixl.data (xl_two_segments runs the chapter's
TransformerXL through its own two-segment helpers). Hand-written (not generated).
"""

from __future__ import annotations

import math
from typing import Callable

import torch

from .. import data, transformer_xl
from ..check.verdicts import call, verdict


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
        dist = transformer_xl.relative_distances(qlen, klen)
        keep = dist >= 0
        where = f"for x of shape {shape} ({qlen} queries, memory {klen - qlen})"
        got, err = call(fn, x)
        if err:
            return verdict("rel_shift", f"{where}: {err}", len(shapes))
        if not isinstance(got, torch.Tensor) or got.shape != x.shape:
            found = tuple(got.shape) if isinstance(got, torch.Tensor) else type(got).__name__
            return verdict("rel_shift", f"{where}: the output is {found}, expected the input's "
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
        return verdict("rel_shift", f"{where}: {hint}", len(shapes))
    return verdict("rel_shift", None, len(shapes))


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
        got, err = call(fn, q.clone(), k.clone(), r.clone(), u.clone(), v.clone())
        if err:
            return verdict("four_term_score", f"{where}: {err}", len(cases))
        if not isinstance(got, torch.Tensor) or got.shape != (B, H, Tq, Tk):
            found = tuple(got.shape) if isinstance(got, torch.Tensor) else type(got).__name__
            return verdict("four_term_score", f"{where}: the output is {found}, expected "
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
        return verdict("four_term_score", f"{where}: {hint}.", len(cases))
    return verdict("four_term_score", None, len(cases))


def memory_update(fn: Callable[..., list]) -> bool:
    """Check fn(inputs, mems, mem_len) -> new mems: per layer the last mem_len rows of
    [mem; input] ([B, <= mem_len, C]), detached from the graph."""
    g = torch.Generator().manual_seed(0)
    cases = [(2, 3, 4, 5), (1, 0, 4, 3), (2, 6, 3, 4), (1, 2, 3, 0)]  # B, M, T, mem_len
    for B, M, T, mem_len in cases:
        inputs = [torch.randn(B, T, 3, generator=g).requires_grad_() for _ in range(2)]
        mems = [torch.randn(B, M, 3, generator=g) for _ in range(2)]
        where = f"for a memory of {M}, a segment of {T} and mem_len={mem_len}"
        got, err = call(fn, [h * 1 for h in inputs], [m.clone() for m in mems], mem_len)
        if err:
            return verdict("memory_update", f"{where}: {err}", len(cases))
        if not isinstance(got, (list, tuple)) or len(got) != 2:
            return verdict("memory_update", f"{where}: expected a list of one tensor per "
                            f"layer (2), got {type(got).__name__}", len(cases))
        for h, m, new in zip(inputs, mems, got):
            cat = torch.cat([m, h.detach()], dim=1)
            want = cat[:, max(0, cat.size(1) - mem_len):]
            if not isinstance(new, torch.Tensor) or new.shape != want.shape:
                found = tuple(new.shape) if isinstance(new, torch.Tensor) else type(new).__name__
                return verdict("memory_update", f"{where}: a layer's memory is {found}, "
                                f"expected {tuple(want.shape)}: keep min(mem_len, M + T) rows",
                                len(cases))
            if not torch.equal(new.detach(), want):
                if torch.equal(new.detach(), cat[:, :want.size(1)]):
                    hint = "it keeps the oldest rows; the memory keeps the most recent ones"
                elif torch.equal(new.detach(), torch.cat([h.detach(), m], 1)[:, -want.size(1):]):
                    hint = "the segment is put before the memory; the order is [mem; input]"
                else:
                    hint = "the rows differ from the last mem_len rows of [mem; input]"
                return verdict("memory_update", f"{where}: {hint}.", len(cases))
            if new.requires_grad:
                return verdict("memory_update", f"{where}: the new memory is still attached "
                                "to the graph; detach it (stop-gradient), or every step "
                                "backpropagates into all earlier segments.", len(cases))
    return verdict("memory_update", None, len(cases))


def stream_batches(fn: Callable[..., object]) -> bool:
    """Check fn(data [N], batch_size, seg_len) -> iterable of (x, y) [B, <= seg_len]: B
    contiguous streams, read in consecutive segments, y the byte after each x."""
    ref = data.stream_batches
    cases = [(101, 4, 8), (64, 2, 5), (37, 3, 12), (20, 1, 4)]
    for N, B, L in cases:
        stream = torch.arange(N) % 251
        where = f"for {N} bytes, batch_size={B}, seg_len={L}"
        got, err = call(lambda: [tuple(p) for p in fn(stream.clone(), B, L)])
        if err:
            return verdict("stream_batches", f"{where}: {err}", len(cases))
        want = list(ref(stream, B, L))
        if len(got) != len(want):
            return verdict("stream_batches", f"{where}: {len(got)} batches, expected "
                            f"{len(want)} (each stream holds (N - 1) // B = {(N - 1) // B} "
                            "inputs, cut into segments; the last may be shorter)", len(cases))
        for n, ((x, y), (wx, wy)) in enumerate(zip(got, want)):
            if not (isinstance(x, torch.Tensor) and isinstance(y, torch.Tensor)
                    and x.shape == wx.shape and y.shape == wy.shape):
                return verdict("stream_batches", f"{where}: batch {n} is not x, y of shape "
                                f"{tuple(wx.shape)}", len(cases))
            if torch.equal(x.long(), wx) and torch.equal(y.long(), wy):
                continue
            if torch.equal(x.long(), wx) and torch.equal(y.long(), wx):
                hint = "y equals x; y is the next byte of each x (shifted by one)"
            elif B > 1 and x[1, 0].item() == stream[1].item():
                hint = ("the streams interleave the bytes (row b = data[b::B]); each row must "
                        "be one contiguous stretch of text, so that it reads on from the "
                        "previous batch's row")
            else:
                hint = (f"batch {n} differs: row b must hold bytes b * n + {n * L} onwards of "
                        f"the text, n = (N - 1) // B, continuing row b of the batch before")
            return verdict("stream_batches", f"{where}: {hint}.", len(cases))
    return verdict("stream_batches", None, len(cases))


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
    XL, Config = transformer_xl.TransformerXL, transformer_xl.TransformerXLConfig
    encode = data.encode
    with torch.random.fork_rng():  # leave the caller's random state as it was
        torch.manual_seed(0)
        model = XL(Config(n_layer=2, d_model=32, n_head=2, d_head=16, d_inner=64, tgt_len=8,
                          mem_len=8)).eval()  # section 4.6's tiny model and seed
    # weights 10 times their initial size: at init, attention is so flat that some slips
    # move the logits by only about 1e-5 (section 4.6)
    transformer_xl.sharpened(model)
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
        got, err = call(fn, run, tokens, split, [m.clone() for m in mems], mem_len)
        if err:
            return verdict("xl_two_segments", f"{where}: {err}", len(cases))
        with torch.no_grad():
            want = model(tokens, mems, mem_len=0)[0]  # one pass over the whole sequence
        if not isinstance(got, torch.Tensor) or got.shape != want.shape:
            found = tuple(got.shape) if isinstance(got, torch.Tensor) else type(got).__name__
            return verdict("xl_two_segments", f"{where}: the output is {found}, expected "
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
            return verdict("xl_two_segments", f"{where}: {hint}.", len(cases))
        firsts = [leaf for t, leaf in calls if torch.equal(t, tokens[:, :split])]
        if firsts and got.requires_grad:
            (grad,) = torch.autograd.grad(got[:, split:].sum(), firsts[0], allow_unused=True)
            if grad is not None and grad.abs().max() > 0:
                return verdict("xl_two_segments", f"{where}: the values are right, but the "
                                "memory is still attached to the graph: the second segment's "
                                "loss backpropagates into the first. Detach it "
                                "(stop-gradient).", len(cases))
    return verdict("xl_two_segments", None, len(cases))


def same_length_mask(fn: Callable[..., torch.Tensor]) -> bool:
    """Check fn(impl, qlen, klen) -> bool [qlen, klen], exercise 5's same-length mask: with
    M = klen - qlen, query i (at position M + i) may attend key j iff 0 <= (M + i) - j <= M,
    so every query sees M + 1 keys, the later queries losing the earliest memory keys. (The
    reference implementation's same_length keeps mem_len keys, counted from the configured
    memory; the book's version keeps M + 1, counted from the keys present.)"""
    cases = [(4, 4), (3, 7), (5, 6), (2, 8), (4, 12), (1, 1)]
    for qlen, klen in cases:
        got, err = call(fn, "eager", qlen, klen)
        where = f"for qlen={qlen}, klen={klen} (memory M = {klen - qlen})"
        if err:
            return verdict("same_length_mask", f"{where}: {err}", len(cases))
        if not isinstance(got, torch.Tensor):
            return verdict("same_length_mask", f"expected a torch.Tensor, got "
                            f"{type(got).__name__}", len(cases))
        if tuple(got.shape) != (qlen, klen):
            return verdict("same_length_mask", f"{where} the shape is {tuple(got.shape)}, "
                            f"expected ({qlen}, {klen}): rows are queries, columns keys",
                            len(cases))
        if got.dtype != torch.bool:
            return verdict("same_length_mask", f"dtype is {got.dtype}, expected torch.bool "
                            "(True = may attend)", len(cases))
        mem = klen - qlen
        dist = transformer_xl.relative_distances(qlen, klen)  # (M + i) - j
        want = (dist >= 0) & (dist <= mem)
        if torch.equal(got, want):
            continue
        if torch.equal(got, (dist >= 0) & (dist < mem)):
            hint = (f"each query sees M keys (distances 0 to M - 1, the reference code's rule "
                    f"when its memory is full); this exercise asks for M + 1 = {mem + 1}, "
                    "distances 0 to M: use <= M. At M = 0 these rows are empty and the "
                    "softmax gives NaN")
        elif torch.equal(got, dist <= mem):
            hint = ("queries see keys after them (negative distances): keep distance >= 0, "
                    "the causal part")
        elif torch.equal(got, ~want):
            hint = "the mask is inverted: True where a query MAY attend"
        elif torch.equal(got, dist >= 0):
            hint = ("that is the plain causal mask: the later queries of the segment must lose "
                    "the earliest memory keys, so that every query sees M + 1")
        else:
            i, j = (int(t) for t in (got != want).nonzero()[0])
            what = "may not" if want[i, j] else "may"
            hint = (f"your mask says query {i} {what} attend key {j}. Query {i} sits at position "
                    f"{mem + i} and sees keys {i}..{mem + i}, M + 1 = {mem + 1} of them")
        return verdict("same_length_mask", f"{where}: {hint}.", len(cases))
    return verdict("same_length_mask", None, len(cases))
