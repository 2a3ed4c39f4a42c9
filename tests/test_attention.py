import math

import pytest
import torch
import torch.nn.functional as F

from minixl import (MultiHeadAttention, attention, attention_weights, causal_mask,
                    sinusoid_positions)


@pytest.mark.parametrize("qlen,klen", [(1, 1), (4, 4), (3, 7), (5, 6)])
def test_causal_mask_matches_definition(qlen, klen):
    m = causal_mask(qlen, klen)
    assert m.dtype == torch.bool and m.shape == (qlen, klen)
    for i in range(qlen):
        for j in range(klen):
            assert bool(m[i, j]) == (j <= (klen - qlen) + i)


def test_causal_mask_default_is_square_lower_triangle():
    assert torch.equal(causal_mask(5), torch.ones(5, 5, dtype=torch.bool).tril())


def test_causal_mask_rejects_fewer_keys_than_queries():
    with pytest.raises(ValueError, match="qlen <= klen"):
        causal_mask(4, 3)


@pytest.mark.parametrize("tq,tk", [(6, 6), (3, 8)])
@pytest.mark.parametrize("masked", [False, True])
def test_attention_matches_torch_sdpa(tq, tk, masked):
    g = torch.Generator().manual_seed(0)
    q = torch.randn(2, 3, tq, 8, generator=g)
    k, v = torch.randn(2, 3, tk, 8, generator=g), torch.randn(2, 3, tk, 8, generator=g)
    mask = causal_mask(tq, tk) if masked else None
    want = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
    assert torch.allclose(attention(q, k, v, mask), want, atol=1e-5)


def test_attention_weights_are_a_distribution_with_zeros_where_masked():
    q, k = torch.randn(1, 2, 4, 8), torch.randn(1, 2, 6, 8)
    w = attention_weights(q, k, causal_mask(4, 6))
    assert torch.allclose(w.sum(-1), torch.ones(1, 2, 4))
    assert torch.all(w[..., ~causal_mask(4, 6)] == 0)


def test_attention_shape_errors_are_clear():
    with pytest.raises(ValueError, match="last dim"):
        attention_weights(torch.randn(1, 1, 2, 4), torch.randn(1, 1, 2, 5))
    with pytest.raises(ValueError, match="same number of keys"):
        attention(torch.randn(1, 1, 2, 4), torch.randn(1, 1, 3, 4), torch.randn(1, 1, 2, 4))


def test_fused_and_plain_multi_head_agree():
    torch.manual_seed(0)
    mha = MultiHeadAttention(48, 6)
    x = torch.randn(3, 11, 48)
    fused = mha(x)
    mha.fused = False
    assert torch.allclose(fused, mha(x), atol=1e-5)


def test_multi_head_rejects_indivisible_width():
    with pytest.raises(ValueError, match="not divisible by n_head=5"):
        MultiHeadAttention(32, 5)


def test_the_sinusoid_table_is_the_formula_sin_half_first():
    """Row p, column f of the table: sin(p / 10000^(2f/C)) in the first half, cos of the same
    angle in the second (Chapter 1's layout, which the checkers and every stored checkpoint of
    a sinusoid model assume), written out here entry by entry."""
    T, C = 7, 6
    table = sinusoid_positions(T, C)
    for p in range(T):
        for f in range(C // 2):
            angle = p / 10000 ** (2 * f / C)
            assert abs(table[p, f] - math.sin(angle)) < 1e-6
            assert abs(table[p, C // 2 + f] - math.cos(angle)) < 1e-6
