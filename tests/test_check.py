"""Every checker passes the reference and names the typical mistake it was written to catch."""

import math

import pytest
import torch
import torch.nn.functional as F

import minixl
from minixl import check


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
])
def test_checkers_pass_the_reference(name, reference, capsys):
    assert getattr(check, name)(reference) is True
    assert capsys.readouterr().out.startswith(f"PASS {name}: all ")


def test_every_checker_is_tested():
    assert set(check.__all__) == {"causal_mask", "attention", "sinusoid_positions",
                                  "intermediate_weight", "sliding_windows", "shaw_attention",
                                  "rel_shift"}


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

    for fn, words in [(unscaled, "not divided by sqrt(D)"), (maskless, "mask is ignored"),
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
