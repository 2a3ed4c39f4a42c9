"""Every checker passes the reference and names the typical mistake it was written to catch."""

import importlib
import math
import re

import pytest
import torch
import torch.nn.functional as F

import minixl
from minixl import check
from minixl import segtree, xlnet  # not through minixl's names: the package's __init__ is generated


def fails_with(capsys, checker, fn, *hints):
    """checker(fn) fails, and its verdict holds every hint."""
    assert checker(fn) is False
    out = capsys.readouterr().out
    assert out.startswith(f"FAIL {checker.__name__}:"), out
    for hint in hints:
        assert hint in out, out


@pytest.mark.parametrize("name,reference", [
    ("causal_mask", minixl.causal_mask), ("attention", minixl.attention),
    ("sinusoid_positions", minixl.sinusoid_positions),
    ("intermediate_weight", minixl.intermediate_weight),
    ("sliding_windows", minixl.sliding_windows), ("shaw_attention", minixl.shaw_attention),
    ("shaw_attention", minixl.shaw_attention_gathered), ("rel_shift", minixl.rel_shift),
    ("relative_index", minixl.relative_index), ("distance_weights", minixl.distance_weights),
])
def test_checkers_pass_the_reference(name, reference, capsys):
    assert getattr(check, name)(reference) is True
    assert capsys.readouterr().out.startswith(f"PASS {name}: all ")


# check.kind checks a model kind, yours or the book's (tests/test_conformance.py); the
# others are the chapters' exercise checkers
EXERCISES = [name for name in check.__all__ if name != "kind"]


def test_every_checker_is_tested():
    assert "kind" in check.__all__
    assert set(EXERCISES) == {"causal_mask", "attention", "sinusoid_positions",
                                  "intermediate_weight", "sliding_windows", "shaw_attention",
                                  "relative_index", "distance_weights",
                                  "rel_shift", "permutation_masks", "query_stream_mask",
                                  "query_stream_update", "targets_for_k",
                                  "rel_shift_bi", "leaf_context", "bpt_context", "causal_tree_graph",
                                  "gathered_attention", "ahead_pairs", "four_term_score",
                                  "memory_update", "stream_batches", "xl_two_segments",
                                  "span_targets", "sibling_scores", "matched_compute",
                                  "reach", "contestant", "step_weight", "same_length_mask",
                                  "per_head_shaw", "every_start_table", "winner"}


def test_each_checker_lives_in_the_module_of_the_chapter_that_calls_it():
    """check.NAME is defined in minixl/MODULE/check.py, MODULE being the `#| default_exp` of the
    first chapter whose text calls check.NAME(...)."""
    from tools.book.paths import chapters
    from tools.book.source import read_chapter

    home = {}  # checker -> the module of the first chapter that calls it
    for md in chapters():
        module = read_chapter(md)["module"]
        for name in re.findall(r"\bcheck\.(\w+)\(", md.read_text()):
            home.setdefault(name, module)
    assert set(home) == set(EXERCISES), "every checker is called by a chapter, and only those"
    for name in EXERCISES:
        checker = getattr(check, name)
        module = f"minixl.{home[name]}.check"
        assert checker.__module__ == module, f"check.{name} is defined in {checker.__module__}"
        assert getattr(importlib.import_module(module), name) is checker, name


def test_causal_mask_checker_explains_memory_and_inversion(capsys):
    fails_with(capsys, check.causal_mask, lambda q, k: torch.ones(q, k).tril().bool(),
               "the first 4 keys are memory")
    fails_with(capsys, check.causal_mask, lambda q, k: ~minixl.causal_mask(q, k), "inverted")
    fails_with(capsys, check.causal_mask, lambda q, k: minixl.causal_mask(q, k).float(),
               "torch.bool")
    fails_with(capsys, check.causal_mask, lambda q, k: torch.ones(k, k).tril().bool(),
               "for qlen=3, klen=7 the shape is (7, 7)", "rows are queries, columns are keys")
    fails_with(capsys, check.causal_mask, lambda q, k: minixl.causal_mask(q, k).tolist(),
               "expected a torch.Tensor, got list")
    fails_with(capsys, check.causal_mask, lambda q, k: 1 / 0, "ZeroDivisionError")


def _masked_scores(q, k, mask):
    s = q @ k.transpose(-2, -1) / q.size(-1) ** 0.5
    return s if mask is None else s.masked_fill(~mask, -torch.inf)


def test_attention_checker_names_the_bug(capsys):
    def unscaled(q, k, v, mask=None):
        s = q @ k.transpose(-2, -1)
        return (s if mask is None else s.masked_fill(~mask, -torch.inf)).softmax(-1) @ v

    def maskless(q, k, v, mask=None):
        return minixl.attention(q, k, v)

    def over_queries(q, k, v, mask=None):
        return _masked_scores(q, k, mask).softmax(-2).nan_to_num() @ v

    def true_means_hide(q, k, v, mask=None):  # fills where the mask is True: rows all -inf
        s = q @ k.transpose(-2, -1) / q.size(-1) ** 0.5
        return (s if mask is None else s.masked_fill(mask, -torch.inf)).softmax(-1) @ v

    def heads_merged(q, k, v, mask=None):
        out = minixl.attention(q, k, v, mask)
        return out.transpose(1, 2).flatten(2)

    def off_by_a_bit(q, k, v, mask=None):
        return minixl.attention(q, k, v, mask) * 1.01

    def over_d(q, k, v, mask=None):
        return minixl.attention(q / q.size(-1) ** 0.5, k, v, mask)  # scores / D

    for fn, words in [(unscaled, "not divided by sqrt(D)"), (maskless, "mask is ignored"),
                      (over_d, "divided by D; divide them by sqrt(D)"),
                      (over_queries, "softmax runs over queries"),
                      (true_means_hide, "the output has NaNs"),
                      (heads_merged, "expected (2, 3, 5, 8) [B, H, Tq, D]"),
                      (off_by_a_bit, "the values differ from the reference")]:
        fails_with(capsys, check.attention, fn, words)


def test_sinusoid_checker_spots_interleaving_and_other_slips(capsys):
    def interleaved(length, d):
        t = minixl.sinusoid_positions(length, d)
        return torch.stack([t[:, : d // 2], t[:, d // 2:]], -1).reshape(length, d)

    def wrong_base(length, d):
        inv = 1.0 / 1000 ** (torch.arange(0, d, 2).float() / d)
        a = torch.arange(length).float()[:, None] * inv
        return torch.cat([a.sin(), a.cos()], -1)

    fails_with(capsys, check.sinusoid_positions, interleaved, "interleaved sin and cos")
    fails_with(capsys, check.sinusoid_positions, wrong_base, "angle p / 10000^(2k/d)")
    fails_with(capsys, check.sinusoid_positions,
               lambda length, d: minixl.sinusoid_positions(length, d)[:, : d // 2],
               "expected a tensor of shape (1, 4)")


def test_intermediate_weight_checker_names_the_schedule_slip(capsys):
    def integer_division(layer, n, p):
        stop = layer // (2 * n)  # 0 for every layer
        return 0.0 if p >= stop else layer / n * (1 - p / stop)

    def starts_at_one(layer, n, p):
        return max(0.0, 1 - p / (layer / (2 * n)))

    def switched_off_at_once(layer, n, p):
        return layer / n if p < layer / (2 * n) else 0.0

    def never_off(layer, n, p):
        return layer / n * abs(1 - p / (layer / (2 * n)))

    fails_with(capsys, check.intermediate_weight, integer_division, "integer division",
               "use real division")
    fails_with(capsys, check.intermediate_weight, starts_at_one,
               "at the start of training the weight of layer 1 of 2 is 1/2")
    fails_with(capsys, check.intermediate_weight, switched_off_at_once, "fades linearly")
    fails_with(capsys, check.intermediate_weight, never_off, "from progress l/(2n) = 0.25 on",
               "the weight is 0")
    fails_with(capsys, check.intermediate_weight, lambda l, n, p: "half", "expected a number")


def _per_head(q, k, v, w_k, w_v, mask=None, *, scale=True, key_heads="bhqd,hrd->bhqr",
              value_table=None):
    """Exercise 5's solution (a table per head, one einsum per side), with switches that
    make its typical slips."""
    B, H, Tq, D = q.shape
    Tk, K = k.size(2), (w_k.size(1) - 1) // 2
    idx = minixl.relative_index(Tq, Tk, K).expand(B, H, Tq, Tk)
    per_row = torch.einsum(key_heads, q, w_k)  # (B, H, Tq, 2K+1)
    position = per_row.expand(B, H, Tq, 2 * K + 1).gather(-1, idx)
    scores = q @ k.transpose(-2, -1) + position
    scores = scores / math.sqrt(D) if scale else (q @ k.transpose(-2, -1)) / math.sqrt(D) + position
    if mask is not None:
        scores = scores.masked_fill(~mask, float("-inf"))
    p = scores.softmax(-1)
    per_distance = minixl.distance_weights(p, idx[0, 0], 2 * K + 1)
    w_v = w_v if value_table is None else value_table(w_v)
    return p @ v + torch.einsum("bhqr,hrd->bhqd", per_distance, w_v)


def test_per_head_shaw_checker_passes_the_solution_and_names_each_slip(capsys):
    assert check.per_head_shaw(_per_head) is True
    assert capsys.readouterr().out.startswith("PASS per_head_shaw: all ")
    first = lambda w: w[:1].expand_as(w)
    fails_with(capsys, check.per_head_shaw,
               lambda q, k, v, w_k, w_v, m=None: _per_head(q, k, v, first(w_k), first(w_v), m),
               "every head uses head 0's tables")
    mean = lambda w: w.mean(0, keepdim=True).expand_as(w)
    fails_with(capsys, check.per_head_shaw,
               lambda q, k, v, w_k, w_v, m=None: _per_head(q, k, v, mean(w_k), mean(w_v), m),
               "averaged over the heads")
    fails_with(capsys, check.per_head_shaw,
               lambda q, k, v, w_k, w_v, m=None: _per_head(q, k, v, w_k, w_v, m, value_table=first),
               "the value side uses head 0's")
    fails_with(capsys, check.per_head_shaw,
               lambda q, k, v, w_k, w_v, m=None: _per_head(q, k, v, w_k, w_v, m, scale=False),
               "not divided by sqrt(D)")
    fails_with(capsys, check.per_head_shaw,
               lambda q, k, v, w_k, w_v, m=None: _per_head(q, k, v, w_k, w_v, None),
               "the mask is ignored")
    fails_with(capsys, check.per_head_shaw,
               lambda q, k, v, w_k, w_v, m=None: _per_head(q, k, v, w_k, w_v, m)[:, :, :, :-1],
               "expected (2, 3, 5, 4) [B, H, Tq, D]")
    fails_with(capsys, check.per_head_shaw, lambda *args: minixl.shaw_attention(*args),
               "calling it with")


def _every_start(model, data, L, *, bits=True, starts=0, shift=1):
    """Section 2.7's table (exercise 7's solution), with switches that make its slips."""
    idx = torch.arange(len(data) - L - starts)[:, None] + torch.arange(L + 1)
    seq = data[idx].long()
    with torch.no_grad():
        nll = F.cross_entropy(model(seq[:, :-1]).transpose(1, 2), seq[:, shift:shift + L],
                              reduction="none")
    return nll / math.log(2) if bits else nll


def test_every_start_table_checker_passes_the_solution_and_names_each_slip(capsys):
    assert check.every_start_table(_every_start) is True
    assert capsys.readouterr().out.startswith("PASS every_start_table: all ")
    fails_with(capsys, check.every_start_table,
               lambda m, d, L: _every_start(m, d, L, bits=False), "these are nats")
    fails_with(capsys, check.every_start_table,
               lambda m, d, L: _every_start(m, d, L, shift=0), "the targets are not shifted")
    fails_with(capsys, check.every_start_table,
               lambda m, d, L: _every_start(m, d, L, starts=1), "one start too few",
               "there are len(data) - L = 17 rows")
    fails_with(capsys, check.every_start_table, lambda m, d, L: _every_start(m, d, L).T,
               "transposed")
    fails_with(capsys, check.every_start_table, lambda m, d, L: m(d[None]),
               "calling it with")


def test_step_weight_checker_passes_the_step_and_names_each_slip(capsys):
    def step(layer, n, p):
        return layer / n if p < layer / (2 * n) else 0.0

    assert check.step_weight(step) is True
    assert capsys.readouterr().out.startswith("PASS step_weight: all ")
    fails_with(capsys, check.step_weight,
               lambda l, n, p: l // n if p < l // (2 * n) else 0.0, "integer division")
    fails_with(capsys, check.step_weight, minixl.intermediate_weight, "the chapter's linear fade")
    fails_with(capsys, check.step_weight, lambda l, n, p: l / n if p > l / (2 * n) else 0.0,
               "the wrong way round")
    fails_with(capsys, check.step_weight, lambda l, n, p: l / n if p <= l / (2 * n) else 0.0,
               "at progress exactly l/(2n) = 0.25", "not <=")
    fails_with(capsys, check.step_weight, lambda l, n, p: l / n if p < l / n else 0.0,
               "the switch-off is at l/(2n) = 0.25, not at l/n = 0.5")
    fails_with(capsys, check.step_weight, lambda l, n, p: 1.0 if p < l / (2 * n) else 0.0,
               "before the switch-off the weight is the full l/n = 0.5")
    fails_with(capsys, check.step_weight, lambda l, n, p: None, "expected a number")


def test_same_length_mask_checker_passes_the_solution_and_names_each_slip(capsys):
    dist = minixl.relative_distances

    def same_length(impl, qlen, klen, device=None):
        d = dist(qlen, klen, device=device)
        return (d >= 0) & (d <= klen - qlen)

    assert check.same_length_mask(same_length) is True
    assert capsys.readouterr().out.startswith("PASS same_length_mask: all ")
    fails_with(capsys, check.same_length_mask, lambda i, q, k: ~same_length(i, q, k), "inverted")
    fails_with(capsys, check.same_length_mask,
               lambda i, q, k: (dist(q, k) >= 0) & (dist(q, k) < k - q), "use <= M", "NaN",
               "the reference code's rule")
    fails_with(capsys, check.same_length_mask, lambda i, q, k: dist(q, k) <= k - q,
               "negative distances")
    fails_with(capsys, check.same_length_mask, lambda i, q, k: minixl.causal_mask(q, k),
               "the plain causal mask")
    def one_wrong(impl, qlen, klen):
        mask = same_length(impl, qlen, klen)
        mask[-1, 0] = ~mask[-1, 0]  # the last query sees the first key too
        return mask

    fails_with(capsys, check.same_length_mask, one_wrong, "query 3 may attend key 0",
               "Query 3 sits at position 3 and sees keys 3..3")
    fails_with(capsys, check.same_length_mask, lambda i, q, k: same_length(i, q, k).int(),
               "expected torch.bool")
    fails_with(capsys, check.same_length_mask, lambda i, q, k: same_length(i, q, k).T,
               "rows are queries")
    fails_with(capsys, check.same_length_mask, lambda i, q, k: 1 / 0, "ZeroDivisionError")


def test_sliding_windows_checker_names_the_coverage_slip(capsys):
    ref = minixl.sliding_windows

    def score_one(n, L, s):  # the first window scores only its last position
        return [(start, 1) for start, _ in ref(n, L, s)]

    def score_all(n, L, s):  # every window scores all its positions
        return [(start, min(L, n - 1)) for start, _ in ref(n, L, s)]

    def one_too_far(n, L, s):
        return ref(n, L, s) + [(n - 1, 1)]

    def always_stride_one(n, L, s):  # correct coverage, but not the book's windows
        return ref(n, L, 1)

    fails_with(capsys, check.sliding_windows, score_one, "bytes [1, 2, 3] are never scored",
               "exactly once")
    fails_with(capsys, check.sliding_windows, score_all, "scored more than once")
    fails_with(capsys, check.sliding_windows, one_too_far, "window (1, 1) does not fit")
    fails_with(capsys, check.sliding_windows, always_stride_one, "n=11, seq_len=4, stride=3",
               "not with the book's windows")
    fails_with(capsys, check.sliding_windows, lambda n, L, s: None,
               "expected a list of (start, n_scored) pairs")


def test_shaw_attention_checker_names_the_missing_or_misplaced_term(capsys):
    shaw = minixl.shaw_attention
    for fn, words in [
        (lambda q, k, v, w_k, w_v, mask=None: shaw(q, k, v, w_k, torch.zeros_like(w_v), mask),
         "the value term is missing"),
        (lambda q, k, v, w_k, w_v, mask=None: shaw(q, k, v, w_k.flip(0), w_v.flip(0), mask),
         "the distances run the wrong way"),
        (lambda q, k, v, w_k, w_v, mask=None: shaw(q, k, v, w_k * q.size(-1) ** 0.5, w_v, mask),
         "not divided by sqrt(D)"),
        (lambda q, k, v, w_k, w_v, mask=None: shaw(q, k, v, torch.zeros_like(w_k), w_v, mask),
         "the key-side position term q . a^K is missing"),
        (lambda q, k, v, w_k, w_v, mask=None: shaw(q, k, v, w_k, w_v), "the mask is ignored"),
        (lambda q, k, v, w_k, w_v, mask=None: minixl.attention(q, k, v, mask),
         "the values differ from the reference loop"),
        (lambda q, k, v, w_k, w_v, mask=None: shaw(q, k, v, w_k, w_v, mask)[..., :1],
         "expected (2, 2, 5, 4) [B, H, Tq, D]"),
    ]:
        fails_with(capsys, check.shaw_attention, fn, "with a mask", words)


def test_rel_shift_checker_names_the_slip(capsys):
    def right_pad(x):
        q, k = x.shape[-2:]
        return F.pad(x, (0, 1)).reshape(*x.shape[:-2], k + 1, q)[..., 1:, :].reshape(x.shape)

    def ascending(x):
        q, k = x.shape[-2:]
        dist = minixl.relative_distances(q, k)
        return x.gather(-1, dist.clamp(0, k - 1).expand(x.shape))

    def no_shift(x):
        return x

    fails_with(capsys, check.rel_shift, right_pad, "padded on the right")
    fails_with(capsys, check.rel_shift, ascending, "ascending distances")
    fails_with(capsys, check.rel_shift, no_shift, "some entries the causal mask keeps")
    fails_with(capsys, check.rel_shift, lambda x: x[..., :1], "the output is (3, 1)",
               "expected the input's shape (3, 3)")
    fails_with(capsys, check.rel_shift, lambda x: math.nan + "x", "raised TypeError")


# ---------------------------------------------------------------- Chapter 5: XLNet

def _ranks(order, n_predict=None):
    """What a student writes: the step of each position, context tied at rank 0."""
    T = order.size(-1)
    n = T if n_predict is None else n_predict
    step = order.argsort(-1)
    return (step - (T - n) + 1).clamp(min=0)


def student_permutation_masks(order, n_predict=None):
    rank = _ranks(order, n_predict)
    return rank[..., None, :] <= rank[..., :, None], rank[..., None, :] < rank[..., :, None]


def student_rel_shift_bi(x, klen):  # a gather instead of the reference's pad and reshape
    qlen = x.size(-2)
    col = qlen - 1 - torch.arange(qlen)[:, None] + torch.arange(klen)
    return x.gather(-1, col.expand(*x.shape[:-1], klen))


def student_span_positions(T, n_predict):  # rejection sampling: spans anywhere, kept if apart
    while True:
        lengths = []
        while sum(lengths) < n_predict:
            lengths.append(int(torch.randint(1, 6, ())))
        lengths[-1] -= sum(lengths) - n_predict
        taken = torch.zeros(T + 1, dtype=torch.bool)
        ok = True
        for n in lengths:
            start = int(torch.randint(0, T - n + 1, ()))
            ok &= not bool(taken[max(start - 1, 0):start + n + 1].any())
            taken[start:start + n] = True
        if ok:
            return taken[:T].nonzero().flatten()


def student_query_stream_update(attn, h, g, content_mask, query_mask, mems=None, *,
                                keys_from_g=False, use_content_mask=False, queries_from_h=False,
                                residual_h=False, no_memory=False, no_norm=False, leak=0.0,
                                no_residual=False):
    """One layer's query-stream update from attn's pieces, batched; each flag makes one slip."""
    B, T, C = h.shape
    mems = None if no_memory else mems
    cat = (g if keys_from_g else h) if mems is None else torch.cat(
        [mems, g if keys_from_g else h], 1)
    seen = torch.ones(B, T, cat.size(1) - T, dtype=torch.bool)
    mask = torch.cat([seen, content_mask if use_content_mask else query_mask], -1)
    r_k = attn.heads(xlnet.sinusoid(xlnet.bidirectional_distances(T, cat.size(1)), C), attn.r)
    out = attn.attend(attn.heads(h if queries_from_h else g, attn.q), attn.heads(cat, attn.k),
                      attn.heads(cat, attn.v), r_k, mask)
    y = (0 if no_residual else h if residual_h else g) + attn.o(out) + leak * h
    return y if no_norm else attn.layer_norm(y)


@pytest.mark.parametrize("name,reference", [
    ("permutation_masks", xlnet.permutation_masks),
    ("permutation_masks", student_permutation_masks),
    ("query_stream_mask", lambda order: xlnet.permutation_masks(order)[1]),
    ("query_stream_mask", lambda order: student_permutation_masks(order)[1]),
    ("query_stream_update", lambda attn, h, g, c, q, mems=None:
        xlnet.two_stream_loop(attn, h, g, c, q, mems=mems)[1]),
    ("query_stream_update", lambda *args, **kw: student_query_stream_update(*args, **kw)),
    ("rel_shift_bi", xlnet.rel_shift_bi), ("rel_shift_bi", student_rel_shift_bi),
    ("span_targets", xlnet.span_positions),
    pytest.param("span_targets", student_span_positions, marks=pytest.mark.slow),  # 2 s
    ("targets_for_k", lambda T, K: round(T / K)),
    ("targets_for_k", lambda T, K: int(T / K + 0.5)),
])
def test_chapter_five_checkers_pass_a_correct_implementation(name, reference, capsys):
    assert getattr(check, name)(reference) is True
    assert capsys.readouterr().out.startswith(f"PASS {name}: all ")


def test_permutation_masks_checker_names_the_slip(capsys):
    def masks(rank):
        return rank[..., None, :] <= rank[..., :, None], rank[..., None, :] < rank[..., :, None]

    def positions_as_ranks(order, n_predict=None):  # order[i] read as the step of position i
        T = order.size(-1)
        n = T if n_predict is None else n_predict
        return masks((order - (T - n) + 1).clamp(min=0))

    def query_sees_itself(order, n_predict=None):
        content, _ = student_permutation_masks(order, n_predict)
        return content, content.clone()

    def swapped(order, n_predict=None):
        content, query = student_permutation_masks(order, n_predict)
        return query, content

    def transposed(order, n_predict=None):
        return tuple(m.transpose(-2, -1) for m in student_permutation_masks(order, n_predict))

    def no_partial_prediction(order, n_predict=None):  # every position ranked on its own
        return student_permutation_masks(order)

    def targets_from_zero(order, n_predict=None):  # the first target shares rank 0 with context
        T = order.size(-1)
        n = T if n_predict is None else n_predict
        return masks((order.argsort(-1) - (T - n)).clamp(min=0))

    def context_in_order(order, n_predict=None):  # the context keeps its order among itself
        content, query = student_permutation_masks(order, n_predict)
        full = student_permutation_masks(order)[0]
        return full, query

    def context_sees_itself_only(order, n_predict=None):  # content = query + the diagonal
        _, query = student_permutation_masks(order, n_predict)
        return query | torch.eye(order.size(-1), dtype=torch.bool), query

    def floats(order, n_predict=None):
        return tuple(m.float() for m in student_permutation_masks(order, n_predict))

    def one_dimensional(order, n_predict=None):  # T taken from the first axis: no batches
        T = order.size(0)
        rank = _ranks(order.reshape(-1)[:T], n_predict)
        return masks(rank)

    check_ = check.permutation_masks
    fails_with(capsys, check_, positions_as_ranks, "for order [2, 0, 1, 3]",
               "ranks and positions are confused", "argsort")
    fails_with(capsys, check_, query_sees_itself, "in the query mask: the query stream sees "
               "its own position", "rank_j < rank_i, not <=")
    fails_with(capsys, check_, swapped, "the content and query masks are swapped")
    fails_with(capsys, check_, transposed, "in the content mask: the mask is transposed")
    fails_with(capsys, check_, no_partial_prediction, "for order [3, 1, 4, 2, 0], n_predict=2",
               "n_predict is ignored", "share rank 0 and see one another")
    fails_with(capsys, check_, targets_from_zero, "n_predict=2", "off by one",
               "the last 1 position of the order, not the last 2")
    fails_with(capsys, check_, context_in_order, "n_predict is ignored")
    fails_with(capsys, check_, context_sees_itself_only, "n_predict=2",
               "the context is not tied", "sees all of the context")
    fails_with(capsys, check_, floats, "dtype torch.float32, expected torch.bool")
    fails_with(capsys, check_, one_dimensional, "the content mask is (2, 2), expected (2, 6, 6)",
               "leading batch dimension")
    fails_with(capsys, check_, lambda order, n_predict=None: student_permutation_masks(order)[0],
               "expected a pair (content_mask, query_mask), got Tensor")
    fails_with(capsys, check_, lambda order: student_permutation_masks(order),
               "n_predict=2", "raised TypeError")


def test_permutation_masks_checker_explains_a_stray_entry(capsys):
    def one_wrong(order, n_predict=None):
        content, query = student_permutation_masks(order, n_predict)
        content = content.clone()
        content[..., 0, -1] = ~content[..., 0, -1]
        return content, query

    fails_with(capsys, check.permutation_masks, one_wrong, "in the content mask: your mask says "
               "position 0 may attend position 3, but their ranks are 2 and 4",
               "it attends where rank_j <= rank_i")


def test_query_stream_mask_checker_names_the_slip(capsys):
    def content_instead(order):  # <=: the query sees its own byte
        return student_permutation_masks(order)[0]

    def transposed(order):
        return student_permutation_masks(order)[1].transpose(-2, -1)

    def positions_as_ranks(order):
        return order[..., None, :] < order[..., :, None]

    fails_with(capsys, check.query_stream_mask, content_instead,
               "the query stream sees its own position", "strictly earlier")
    fails_with(capsys, check.query_stream_mask, transposed, "transposed",
               "rows are queries and columns keys")
    fails_with(capsys, check.query_stream_mask, positions_as_ranks,
               "ranks and positions are confused")
    fails_with(capsys, check.query_stream_mask,
               lambda order: ~student_permutation_masks(order)[1], "inverted")
    fails_with(capsys, check.query_stream_mask,
               lambda order: student_permutation_masks(order)[1][..., :-1],
               "the query mask is (4, 3), expected (4, 4)")


def test_query_stream_update_checker_names_the_slip(capsys):
    def slip(**flag):
        return lambda *args, **kw: student_query_stream_update(*args, **kw, **flag)

    fails_with(capsys, check.query_stream_update, slip(keys_from_g=True),
               "keys and values come from g")
    fails_with(capsys, check.query_stream_update, slip(use_content_mask=True),
               "the content mask is used", "rank_j < rank_i")
    fails_with(capsys, check.query_stream_update, slip(queries_from_h=True),
               "the queries come from h")
    fails_with(capsys, check.query_stream_update, slip(residual_h=True), "the residual adds h")
    fails_with(capsys, check.query_stream_update, slip(no_norm=True), "the layer norm is missing")
    fails_with(capsys, check.query_stream_update, slip(no_residual=True),
               "the residual is missing")
    fails_with(capsys, check.query_stream_update, slip(no_memory=True),
               "the memory is left out", "a memory of 3")
    # a leak no named slip explains: the gradient probe finds the query reading its own byte
    fails_with(capsys, check.query_stream_update, slip(leak=1e-3),
               "the query at position 0 reads its own content")
    fails_with(capsys, check.query_stream_update, lambda attn, h, g, c, q, mems=None: g[:, :-1],
               "expected the new g, a tensor of shape (1, 4, 16)")
    fails_with(capsys, check.query_stream_update, lambda attn, h, g, c, q: g,
               "raised TypeError")


def test_targets_for_k_checker_names_the_slip(capsys):
    fails_with(capsys, check.targets_for_k, lambda T, K: K, "you return K itself")
    fails_with(capsys, check.targets_for_k, lambda T, K: T - round(T / K), "is c, the context")
    fails_with(capsys, check.targets_for_k, lambda T, K: T // K, "round to the nearest")
    fails_with(capsys, check.targets_for_k, lambda T, K: T / K, "a fraction")
    fails_with(capsys, check.targets_for_k, lambda T, K: "all", "expected a whole number")


def test_rel_shift_bi_checker_names_the_slip(capsys):
    def shift(x, klen, pad=(1, 0), rows=slice(1, None), cut=True):
        *lead, q, w = x.shape
        out = F.pad(x, pad).reshape(*lead, klen + q, q)[..., rows, :].reshape(*lead, q, w)
        return out[..., :klen] if cut else out

    def one_off(x, klen):  # reads column Tq - i + j: every score one key to the left
        qlen = x.size(-2)
        col = (qlen - torch.arange(qlen)[:, None] + torch.arange(klen)).clamp(max=x.size(-1) - 1)
        return x.gather(-1, col.expand(*x.shape[:-1], klen))

    def chapter_four(x, klen):  # Transformer-XL's shift on the non-negative distances only
        return minixl.rel_shift(x[..., :klen])

    def ascending(x, klen):
        qlen = x.size(-2)
        col = klen - 1 + torch.arange(qlen)[:, None] - torch.arange(klen)
        return x.gather(-1, col.expand(*x.shape[:-1], klen))

    fails_with(capsys, check.rel_shift_bi, lambda x, k: shift(x, k, pad=(0, 1)),
               "padded on the right")
    fails_with(capsys, check.rel_shift_bi, lambda x, k: shift(x, k, rows=slice(None, -1)),
               "drop the first row")
    fails_with(capsys, check.rel_shift_bi, one_off, "off by one", "column Tq - 1 - i + j")
    fails_with(capsys, check.rel_shift_bi, chapter_four, "Chapter 4's one-directional shift",
               "junk above the diagonal")
    fails_with(capsys, check.rel_shift_bi, ascending, "ascending distances")
    fails_with(capsys, check.rel_shift_bi, lambda x, k: shift(x, k, cut=False),
               "the output is (3, 5), expected (3, 3)", "cut the result to its first klen")
    fails_with(capsys, check.rel_shift_bi, lambda x, k: x[..., :k], "differ from the reference")


# ---------------------------------------------------------------- Chapter 6

def leaf_spans(n, i, causal=False):
    return [segtree.node_span(n, c.level, c.p)
            for c in segtree.leaf_context_loop(n, i, causal=causal)]


def bpt_spans(n, i, k=1, causal=False):
    return [segtree.node_span(n, c.level, c.p)
            for c in segtree.leaf_context_loop(n, i, rule="bpt", k=k, causal=causal)]


def causal_graph(n):
    return segtree.graph_mask(segtree.segtree_graph(n, causal=True))[0]


def gathered(q, k, v, index, valid, *, scale=True, mask=True):
    scores = torch.einsum("bghd,bgnhd->bghn", q, k[:, index])
    scores = scores / math.sqrt(q.size(-1)) if scale else scores
    if mask:
        scores = scores.masked_fill(~valid[:, None, :], float("-inf"))
    return torch.einsum("bghn,bgnhd->bghd", torch.softmax(scores, -1), v[:, index])


def level_scores(q, k_level, level, side, *, key_by=None, own=False, ancestor=False,
                 mask=True):
    """One level of the fast path, leaf by leaf; each keyword makes one slip."""
    n, by = q.size(2), 1 if side == "left" else -1
    out = torch.full(q.shape[:3], float("-inf") if mask else 0.0, dtype=q.dtype)
    for i in range(n):
        j = i if own else i - by  # whose ancestor's sibling leaf i reads
        if not (0 <= j < n and 0 <= i - by < n):
            continue
        g = j >> level
        if g % 2 == (1 if side == "left" else 0):
            p = g if ancestor else g - (by if key_by is None else key_by)
            if 0 <= p < k_level.size(2):
                out[:, :, i] = (q[:, :, i] * k_level[:, :, p]).sum(-1)
    return out


@pytest.mark.parametrize("name,reference", [("leaf_context", leaf_spans),
                                            ("bpt_context", bpt_spans),
                                            ("causal_tree_graph", causal_graph),
                                            ("gathered_attention", gathered),
                                            ("sibling_scores", segtree.sibling_scores),
                                            ("sibling_scores", level_scores)])
def test_chapter_six_checkers_pass_a_correct_implementation(name, reference, capsys):
    assert getattr(check, name)(reference) is True
    assert capsys.readouterr().out.startswith(f"PASS {name}: all ")


def test_sibling_scores_checker_names_the_slip(capsys):
    def slip(**flag):
        return lambda *args: level_scores(*args, **flag)

    fails_with(capsys, check.sibling_scores, slip(own=True),
               "the wrong sibling", "not of its own")
    fails_with(capsys, check.sibling_scores,
               lambda q, k, level, side: level_scores(q, k, level, side,
                                                      key_by=-1 if side == "left" else 1),
               "the keys are shifted the wrong way")
    fails_with(capsys, check.sibling_scores, slip(ancestor=True),
               "its neighbour's ancestor itself")
    fails_with(capsys, check.sibling_scores, slip(mask=False),
               "leaf 0 reads no node of level 0 on the left", "set it to -inf")
    fails_with(capsys, check.sibling_scores, lambda q, k, level, side: q.sum(-1)[..., :-1],
               "expected a tensor of shape (2, 2, 8) [B, H, n]")


def test_leaf_context_checker_names_the_slip(capsys):
    """The SegTree rule's checker: BPT's rule taken for it, a valid but larger cover, a
    neighbour folded into a bigger span, and the cover slips."""
    def larger(n, i, causal=False):  # splits the biggest node into its two children
        spans = leaf_spans(n, i, causal)
        a, b = max(spans, key=lambda s: s[1] - s[0])
        if b == a:
            return spans
        mid = a + (1 << ((b - a).bit_length() - 1))
        return [s for s in spans if s != (a, b)] + [(a, mid - 1), (mid, b)]

    def folded(n, i, causal=False):  # the left neighbour inside a pair with the leaf before it
        spans = leaf_spans(n, i, causal)
        if i >= 2 and (i - 2, i - 2) in spans:
            return [s for s in spans if s not in ((i - 2, i - 2), (i - 1, i - 1))] + [(i - 2, i - 1)]
        return spans

    fails_with(capsys, check.leaf_context, lambda n, i, causal=False: bpt_spans(n, i, 1, causal),
               "BP-Transformer's rule at k = 1", "not the SegTree rule's minimal cover")
    fails_with(capsys, check.leaf_context, larger, "not the smallest")
    fails_with(capsys, check.leaf_context, folded, "neighbouring leaves", "nodes of their own")
    fails_with(capsys, check.leaf_context, lambda n, i, causal=False: leaf_spans(n, i),
               "reaches past the leaf")
    fails_with(capsys, check.leaf_context,
               lambda n, i, causal=False: leaf_spans(n, i, causal) + [(i, i)], "overlap")
    fails_with(capsys, check.leaf_context,
               lambda n, i, causal=False: [(a, b if b < n - 1 else b + 1) for a, b in
                                           leaf_spans(n, i, causal)], "past the last byte")


def test_bpt_context_checker_names_the_slip(capsys):
    def no_alignment(n, i, k=1, causal=False):  # takes k blocks per level, never aligns
        spans, lo, hi, level = [(i, i)], i, i + 1, 0
        while lo > 0 or (not causal and hi < n):
            for _ in range(k):
                if lo > 0:
                    spans.append((max(0, lo - (1 << level)), lo - 1))
                    lo = max(0, lo - (1 << level))
                if not causal and hi < n:
                    spans.append((hi, min(hi + (1 << level), n) - 1))
                    hi = min(hi + (1 << level), n)
            level += 1
        return spans

    def alignment_on_top(n, i, k=1, causal=False):  # the alignment node in an extra slot
        spans, lo, hi, level = [(i, i)], i, i + 1, 0
        while lo > 0 or (not causal and hi < n):
            if level:
                half = 1 << (level - 1)
                if lo % (2 * half):
                    spans, lo = spans + [(lo - half, lo - 1)], lo - half
                if not causal and hi < n and hi % (2 * half):
                    spans, hi = spans + [(hi, min(hi + half, n) - 1)], min(hi + half, n)
            for _ in range(k):
                if lo > 0:
                    spans, lo = spans + [(lo - (1 << level), lo - 1)], lo - (1 << level)
                if not causal and hi < n:
                    spans.append((hi, min(hi + (1 << level), n) - 1))
                    hi = min(hi + (1 << level), n)
            level += 1
        return spans

    fails_with(capsys, check.bpt_context, no_alignment, "not BPT's nodes")
    fails_with(capsys, check.bpt_context, alignment_on_top, "took a slot of its own",
               "first of the level's k nodes")
    fails_with(capsys, check.bpt_context,
               lambda n, i, k=1, causal=False: [s for s in bpt_spans(n, i, k, causal)
                                                if s[1] - s[0] != 1], "not covered",
               "one node of the level below")
    fails_with(capsys, check.bpt_context,
               lambda n, i, k=1, causal=False: bpt_spans(n, i, k), "reaches past the leaf")


def test_causal_tree_graph_checker_names_the_slip(capsys):
    def leaky(n):
        m = causal_graph(n).clone()
        m[n - 2, n - 1] = True  # the second-last leaf reads the last one
        return m

    def no_self(n):
        return causal_graph(n) & ~torch.eye(len(causal_graph(n)), dtype=torch.bool)

    def internal_self(n):
        return causal_graph(n) | torch.eye(len(causal_graph(n)), dtype=torch.bool)

    def wide(n):
        m = causal_graph(n).clone()
        m[n, :] = m[n, :] | (torch.arange(len(m)) < n)  # the first pair node reads every leaf
        return m

    fails_with(capsys, check.causal_tree_graph, leaky, "covers a later byte")
    fails_with(capsys, check.causal_tree_graph, no_self, "does not read itself")
    fails_with(capsys, check.causal_tree_graph, internal_self, "an internal node reads itself")
    fails_with(capsys, check.causal_tree_graph, wide, "internal node", "only the leaves")
    fails_with(capsys, check.causal_tree_graph, lambda n: causal_graph(n).float(),
               "expected a bool tensor")


def test_gathered_attention_checker_names_the_slip(capsys):
    fails_with(capsys, check.gathered_attention,
               lambda *a: gathered(*a, mask=False), "padding is attended to")
    fails_with(capsys, check.gathered_attention,
               lambda *a: gathered(*a, scale=False), "not scaled")
    fails_with(capsys, check.gathered_attention,
               lambda q, k, v, index, valid: gathered(q, k, v, index, valid).transpose(1, 2),
               "expected shape")


def test_ahead_pairs_checker_passes_the_reference_and_names_the_slips(capsys):
    assert check.ahead_pairs(minixl.ahead_pairs) is True
    assert capsys.readouterr().out.startswith("PASS ahead_pairs: all ")
    T = lambda y: y.size(1)  # noqa: E731
    fails_with(capsys, check.ahead_pairs, lambda h, y, j: (h[:, :T(y) - j], y[:, :T(y) - j]),
               "for T=8, j=1", "predicts its next byte")
    fails_with(capsys, check.ahead_pairs, lambda h, y, j: (h[:, j:], y[:, :T(y) - j]),
               "predict bytes before them")
    fails_with(capsys, check.ahead_pairs,
               lambda h, y, j: (h[:, :T(y) - j - 1], y[:, j + 1:]), "one position too few")
    fails_with(capsys, check.ahead_pairs, lambda h, y, j: h, "expected a pair")
    fails_with(capsys, check.ahead_pairs, lambda h, y, j: 1 / 0, "ZeroDivisionError")


def test_transformer_xl_checkers_pass_the_reference_and_name_each_slip(capsys):
    from minixl.data import stream_batches
    from minixl.transformer_xl import TransformerXL, TransformerXLConfig, rel_scores_naive

    model = TransformerXL(TransformerXLConfig(n_layer=1, d_model=8, n_head=1, d_head=8,
                                              d_inner=8))
    for name, reference in [("four_term_score", rel_scores_naive), ("stream_batches",
                            stream_batches), ("memory_update", model.update_mems)]:
        assert getattr(check, name)(reference) is True
        assert capsys.readouterr().out.startswith(f"PASS {name}: all ")

    def without(term):
        def fn(q, k, r, u, v):
            s = rel_scores_naive(q, k, r, u, v)
            if term == "c":
                return s - u[:, None, :] @ k.transpose(-2, -1)
            return s - (r @ v[:, None, :, None]).squeeze(-1)
        return fn

    fails_with(capsys, check.four_term_score, without("c"), "term (c) is missing")
    fails_with(capsys, check.four_term_score, without("d"), "term (d) is missing")
    fails_with(capsys, check.four_term_score, lambda q, k, r, u, v: rel_scores_naive(
        q, k, r, v, u), "u and v are swapped")
    fails_with(capsys, check.four_term_score, lambda q, k, r, u, v: rel_scores_naive(
        q, k, r, u, v) / q.size(-1) ** 0.5, "divided by sqrt(D)")

    def oldest(inputs, mems, mem_len):
        return [torch.cat([m, h], 1)[:, :min(mem_len, m.size(1) + h.size(1))].detach()
                for h, m in zip(inputs, mems)]

    def attached(inputs, mems, mem_len):
        return [torch.cat([m, h], 1)[:, max(0, m.size(1) + h.size(1) - mem_len):]
                for h, m in zip(inputs, mems)]

    def reversed_order(inputs, mems, mem_len):
        return [torch.cat([h, m], 1)[:, max(0, m.size(1) + h.size(1) - mem_len):].detach()
                for h, m in zip(inputs, mems)]

    fails_with(capsys, check.memory_update, oldest, "keeps the oldest rows")
    fails_with(capsys, check.memory_update, attached, "still attached", "detach")
    fails_with(capsys, check.memory_update, reversed_order, "[mem; input]")

    def interleaved(data, B, L):
        n = (len(data) - 1) // B
        x_all = data[:n * B].long().view(n, B).T
        y_all = data[1:n * B + 1].long().view(n, B).T
        return [(x_all[:, s:s + L], y_all[:, s:s + L]) for s in range(0, n, L)]

    def unshifted(data, B, L):
        return [(x, x) for x, _ in stream_batches(data, B, L)]

    fails_with(capsys, check.stream_batches, interleaved, "interleave")
    fails_with(capsys, check.stream_batches, unshifted, "y equals x")
    fails_with(capsys, check.stream_batches, lambda d, B, L: list(stream_batches(d, B, L))[:-1],
               "batches, expected")


@pytest.mark.slow
def test_xl_two_segments_checker_passes_the_reference_and_names_each_slip(capsys):
    from minixl.transformer_xl import TransformerXL, TransformerXLConfig

    update_mems = TransformerXL(TransformerXLConfig(n_layer=1, d_model=8, n_head=1, d_head=8,
                                                    d_inner=8)).update_mems

    def segments(keep=lambda mems, hidden, mem_len: update_mems(hidden, mems, mem_len)):
        def fn(run, tokens, split, mems, mem_len):
            first, hidden = run(tokens[:, :split], mems)
            second, _ = run(tokens[:, split:], keep(mems, hidden, mem_len))
            return torch.cat([first, second], dim=1)
        return fn

    state = torch.get_rng_state()
    assert check.xl_two_segments(segments()) is True
    assert capsys.readouterr().out.startswith("PASS xl_two_segments: all ")
    assert torch.equal(torch.get_rng_state(), state)  # the checker's model leaves no trace

    for keep, *words in [
        (lambda mems, hidden, mem_len: None, "ran without memory"),
        (lambda mems, hidden, mem_len: [torch.cat([m, h], 1) for m, h in zip(mems, hidden)],
         "still attached to the graph", "Detach"),
        (lambda mems, hidden, mem_len: [torch.cat([h, m], 1).detach()
                                        for m, h in zip(mems, hidden)], "[segment; memory]"),
        (lambda mems, hidden, mem_len: update_mems(hidden, mems, 8),
         "too short", "only the last 8 states", "mem_len = M + split = 13"),
        (lambda mems, hidden, mem_len: [h.detach() for h in hidden],
         "too short", "only the last 11 states", "= 17"),
    ]:
        fails_with(capsys, check.xl_two_segments, segments(keep), *words)
    reference = segments()
    fails_with(capsys, check.xl_two_segments, lambda run, t, split, mems, mem_len: reference(
        run, t, split, mems, mem_len).flip(1), "the first segment's logits differ")
    fails_with(capsys, check.xl_two_segments, lambda run, t, split, mems, mem_len: reference(
        run, t, split, mems, mem_len).roll(t.size(1) - split, 1), "wrong order")
    fails_with(capsys, check.xl_two_segments, lambda *args: reference(*args)[:, 1:],
               "expected (1, 30, 256)")


# ---------------------------------------------------------------- Chapter 3: relative positions

def test_relative_index_checker_names_each_slip(capsys):
    ref = minixl.relative_index

    def positions(qlen, klen):
        return torch.arange(klen - qlen, klen)[:, None], torch.arange(klen)[None, :]

    def i_minus_j(qlen, klen, K):
        i, j = positions(qlen, klen)
        return (i - j).clamp(-K, K) + K

    def unclipped(qlen, klen, K):
        i, j = positions(qlen, klen)
        return j - i + K

    def queries_first(qlen, klen, K):
        i, j = torch.arange(qlen)[:, None], torch.arange(klen)[None, :]
        return (j - i).clamp(-K, K) + K

    def clipped_short(qlen, klen, K):
        i, j = positions(qlen, klen)
        return (j - i).clamp(-K + 1, K - 1) + K

    for fn, words in [
        (i_minus_j, "i - j instead of j - i"), (unclipped, "not clipped"),
        (lambda q, k, K: ref(q, k, K) + 1, "off by +1"),
        (lambda q, k, K: ref(q, k, K) - 1, "off by -1"),
        (lambda q, k, K: ref(q, k, K) - K, "the offset is missing"),
        (queries_first, "the last qlen of klen"), (clipped_short, "[-(K - 1), K - 1]"),
        (lambda q, k, K: ref(q, k, K).float(), "torch.long"),
        (lambda q, k, K: ref(q, k, K)[:, :-1], "rows are queries, columns keys"),
        (lambda q, k, K: ref(q, k, K).tolist(), "expected a torch.Tensor"),
    ]:
        fails_with(capsys, check.relative_index, fn, words)
    # an int32 answer is as good as a long one
    assert check.relative_index(lambda q, k, K: ref(q, k, K).int())


def test_distance_weights_checker_names_each_slip(capsys):
    ref = minixl.distance_weights

    def overwrite(p, index, n):
        return p.new_zeros(*p.shape[:-1], n).scatter(-1, index.expand(p.shape), p)

    def counts(p, index, n):
        return ref((p > 0).float(), index, n)

    def mean(p, index, n):
        return ref(p, index, n) / ref(torch.ones_like(p), index, n).clamp(min=1)

    def gathered(p, index, n):
        return p.gather(-1, index.expand(p.shape))

    for fn, words in [
        (overwrite, "scatter overwrites, scatter_add adds"), (counts, "counts the keys"),
        (mean, "averages"), (gathered, "one column per key"),
        (lambda p, index, n: ref(p, index, n).flip(-1), "the columns run the wrong way"),
        (lambda p, index, n: ref(p, index, n) * 2, "rows of the result then add up to 1"),
        (lambda p, index, n: 1 / 0, "ZeroDivisionError"),
    ]:
        fails_with(capsys, check.distance_weights, fn, words)
    # the bucket form built on a correct answer equals the loop
    g = torch.Generator().manual_seed(1)
    q, k, v = (torch.randn(2, 2, 6, 4, generator=g) for _ in range(3))
    w_k, w_v = torch.randn(2, 5, 4, generator=g)
    torch.testing.assert_close(minixl.shaw_attention(q, k, v, w_k, w_v, minixl.causal_mask(6)),
                               minixl.shaw_attention_loop(q, k, v, w_k, w_v,
                                                          minixl.causal_mask(6)))


def test_span_targets_checker_names_the_slip(capsys):
    def one_block(T, n):  # every target in one run from 0
        return torch.arange(n)

    def touching(T, n):  # spans of 1 to 5 but laid end to end: they merge into one long run
        start = int(torch.randint(0, T - n + 1, ()))
        return torch.arange(start, start + n)

    def uncut(T, n):  # the last span is not cut to fit
        lengths = []
        while sum(lengths) < n:
            lengths.append(5)
        pos, at = [], int(torch.randint(0, 2, ()))
        for k in lengths:
            pos += list(range(at, at + k))
            at += k + 1
        return torch.tensor(pos)

    def fixed(T, n):
        return torch.arange(0, 2 * n, 2)[:n] + 1

    def from_zero(T, n):  # random spans, but the first always at 0
        pos = xlnet.span_positions(T, n)
        return pos - pos[0]

    fails_with(capsys, check.span_targets, one_block, "a run of 11 targets from position 0")
    fails_with(capsys, check.span_targets, touching, "a run of 11 targets",
               "context between them")
    fails_with(capsys, check.span_targets, uncut, "positions, expected 11",
               "The last span must be cut")
    fails_with(capsys, check.span_targets, fixed, "every draw gave the same targets")
    def packed(T, n):  # random spans one byte apart from a random offset: context at the ends
        pos = xlnet.span_positions(n + n, n)  # spans separated by single bytes, mostly
        runs, at, out = [], int(torch.randint(0, 3, ())), []
        for p in pos.tolist():
            if runs and p == runs[-1] + 1:
                out.append(out[-1] + 1)
            else:
                out.append(at if not out else out[-1] + 2)
            runs.append(p)
        return torch.tensor(out)

    fails_with(capsys, check.span_targets, from_zero, "the first span always starts at 0")
    fails_with(capsys, check.span_targets, packed, "always 1 byte apart")


# ---------------------------------------------------------------- Chapter 7

def _dense_flops(c, *, forward_only=False, tables=False, keys="causal"):
    """Chapter 1's model's training FLOPs per byte, each query charged `keys` keys: the
    causal mean (T + 1) / 2, the whole window T, or a number of T's."""
    with torch.device("meta"):
        model = minixl.CharTransformer(c)
    weights = sum(p.numel() for n, p in model.named_parameters() if tables or n != "pos")
    read = {"causal": (c.block_size + 1) / 2, "window": c.block_size}.get(keys)
    read = c.block_size * keys if read is None else read
    attention = 12 * c.n_layer * read * c.d_model
    return 2 * weights + attention / 3 if forward_only else 6 * weights + attention


def _steps(budget, flops, batch_size, length):
    return max(1, round(budget / (flops * batch_size * length)))


def test_matched_compute_checker_passes_the_planner_and_names_each_slip(capsys):
    from minixl.planner import matched_steps

    def planner(b, f, B, T):
        return matched_steps(b, f, batch_size=B, length=T)

    assert check.matched_compute(_dense_flops, planner) is True
    assert capsys.readouterr().out.startswith("PASS matched_compute: all ")
    for flops, hint in ((lambda c: _dense_flops(c, forward_only=True), "forward pass only"),
                        (lambda c: _dense_flops(c, tables=True), "counts the position tables"),
                        (lambda c: _dense_flops(c, keys="window"), "charges every key of the "
                                                                   "window"),
                        (lambda c: _dense_flops(c, keys=0.5), "charges T / 2 keys a query"),
                        (lambda c: _dense_flops(c, keys=0), "leaves out the attention scores"),
                        (lambda c: _dense_flops(c, keys=0.7), "expected")):
        assert check.matched_compute(flops, _steps) is False
        out = capsys.readouterr().out
        assert out.startswith("FAIL matched_compute:") and hint in out, out
    # the other policy: every key of the window charged, as an eager kernel computes
    window = lambda c: _dense_flops(c, keys="window")  # noqa: E731
    assert check.matched_compute(window, planner, policy="kernel") is True
    capsys.readouterr()
    for flops, hint in ((lambda c: _dense_flops(c, keys=0.5), "halves the attention scores"),
                        (_dense_flops, "charges the causal mean"),
                        (lambda c: _dense_flops(c, keys=0.7), "kernel count)")):
        assert check.matched_compute(flops, planner, policy="kernel") is False
        out = capsys.readouterr().out
        assert out.startswith("FAIL matched_compute:") and hint in out, out
    with pytest.raises(ValueError, match="unknown FLOP policy 'half'"):
        check.matched_compute(_dense_flops, planner, policy="half")
    for steps, hint in ((lambda b, f, B, T: round(b / (f * T)), "forgets the batch"),
                        (lambda b, f, B, T: round(b / (f * B)), "forgets the window"),
                        (lambda b, f, B, T: max(1, int(b / (f * B * T))), "floors 578.70"),
                        (lambda b, f, B, T: round(b / (f * B * T)), "returns 0")):
        assert check.matched_compute(_dense_flops, steps) is False
        out = capsys.readouterr().out
        assert out.startswith("FAIL matched_compute:") and hint in out, out


def _reach(name, c, slip=None):
    if name != "xl":
        return c.block_size - (slip == "window")
    T, M, N = c.tgt_len, c.mem_len, c.n_layer
    if slip == "one layer":
        return T + M
    if slip == "N memories":
        return T + N * M
    if slip == "N x L":
        return N * T
    earliest = last = (N * (M // T + 2) + 1) * T - 1
    for _ in range(N):
        earliest = (earliest // T) * T - M
    return last + 1 - earliest


def test_reach_checker_passes_the_kinds_reach_and_names_each_slip(capsys):
    import numpy as np

    assert check.reach(_reach) is True
    assert capsys.readouterr().out.startswith("PASS reach: all ")
    assert check.reach(lambda n, c: np.int64(_reach(n, c))) is True  # any one number will do
    capsys.readouterr()
    fails_with(capsys, check.reach, lambda n, c: [_reach(n, c)], "returned [32], expected 32")
    for slip, hint in (("window", "reads T bytes back from the byte after it"),
                       ("one layer", "in one layer only"), ("N memories", "own segment's start"),
                       ("N x L", "literally")):
        fails_with(capsys, check.reach, lambda n, c, slip=slip: _reach(n, c, slip), hint)


@pytest.mark.slow  # over 1.5 s: the quick loop stays well under a minute
def test_contestant_checker_passes_a_new_arm_and_names_each_slip(capsys):
    from dataclasses import replace

    from minixl.kinds import kind_of
    from minixl.model_kind import BenchArm

    xl = kind_of("xl")
    arm = {"xl, no memory": BenchArm(model=dict(mem_len=0))}
    good = replace(xl, name="xl-nomem-test", bench=arm)
    assert check.contestant(good, steps=20) is True
    out = capsys.readouterr().out
    assert "PASS xl-nomem-test, training xl, no memory" in out and "FAIL" not in out, out
    for kind, hint in ((replace(good, bench={"xl": BenchArm(model=dict(mem_len=0))}),
                        "arm names: taken by another kind's arm: 'xl' (--model xl)"),
                       (replace(good, flops=None), "FLOP count: none given"),
                       (replace(good, flops=lambda m: 6 * sum(p.numel() for p in m.parameters())),
                        "FLOP count: xl, no memory counts no more than 6 per weight"),
                       (replace(good, name="xl"), "kind name: 'xl' is the name of a registered"),
                       (replace(good, reach=None), "reach: not stated")):
        assert check.contestant(kind, steps=20) is False
        out = capsys.readouterr().out
        assert f"FAIL {kind.name}, {hint}" in out, out
    assert check.contestant(good, budget=1e6, steps=20) is False
    assert "FAIL xl-nomem-test, plan: not matched" in capsys.readouterr().out
    assert check.contestant("xl") is False
    assert "expected a minixl.model_kind.ModelKind" in capsys.readouterr().out


def _winner(values, slip=None):
    """Chapter 7's exercise 4: the arm that wins on bits per byte by seed, or None."""
    means = {a: sum(v) / len(v) for a, v in values.items()}
    order = sorted(means, key=means.get, reverse=slip == "higher")
    if slip == "means":
        return order[0]
    if slip == "one seed" and len(values) > 1 and min(len(v) for v in values.values()) < 2:
        return order[0]
    if len(values) < 2 or min(len(v) for v in values.values()) < 2:
        return None
    if slip == "best seed":
        return min(values, key=lambda a: min(values[a]))
    best, second = order[:2]
    if slip == "higher":
        return best if min(values[best]) > max(values[second]) else None
    if slip == "worst":
        return best if max(values[best]) < max(values[second]) else None
    if slip == "tie":
        return best if max(values[best]) <= min(values[second]) else None
    return best if max(values[best]) < min(values[second]) else None


def test_winner_checker_passes_the_tables_rule_and_names_each_slip(capsys):
    assert check.winner(_winner) is True
    assert capsys.readouterr().out.startswith("PASS winner: all ")
    for slip, hint in (("means", "names the best mean whatever its seeds"),
                       ("best seed", "best single seed"), ("higher", "fewer bits per byte"),
                       ("worst", "with the runner-up's worst")):
        fails_with(capsys, check.winner, lambda v, slip=slip: _winner(v, slip), hint)
    fails_with(capsys, check.winner, lambda v: None, "names no winner where tree's worst seed")
    fails_with(capsys, check.winner, lambda v: _winner(v, "tie"), "counts a tie as a win")
    fails_with(capsys, check.winner, lambda v: _winner(v, "one seed"), "from one seed")


def test_a_raising_solution_is_reported_by_shapes_and_dtypes_not_values(capsys):
    """A student's function that raises gets one short line: each argument by its shape and
    dtype (a list or a dict item by item, anything else by a short repr), then the error;
    never the tensors' values, which once printed some 200 lines before the reason."""
    def broken(q, k, v, w_k, w_v, mask=None):
        raise RuntimeError("mat1 and mat2 shapes cannot be multiplied")

    assert check.per_head_shaw(broken) is False
    out = capsys.readouterr().out
    assert out.count("\n") == 1, out
    assert "raised RuntimeError: mat1 and mat2 shapes cannot be multiplied" in out
    assert "Tensor(shape=(2, 3, 5, 4), dtype=float32)" in out
    assert "tensor(" not in out and "[[" not in out, "no tensor values in the message"
    from minixl.check.verdicts import describe
    assert describe([torch.zeros(2, dtype=torch.long), 3, "x" * 100]) == \
        "[Tensor(shape=(2,), dtype=int64), 3, '" + "x" * 56 + "...]"
    assert describe((torch.ones(1, 2),)) == "(Tensor(shape=(1, 2), dtype=float32),)"
    assert describe({"m": None}) == "{'m': None}"


def test_describe_never_breaks_the_checker_on_an_odd_argument():
    from minixl.check.verdicts import describe
    assert describe(torch.Tensor) == "Tensor"  # a class: its shape is a descriptor
