import math

import pytest
import torch

from minixl import CharTransformer, CharTransformerConfig, MultiHeadAttention, attention, causal_mask
from minixl import evaluate_bpc, generate, leakage_matrix

SMALL = dict(n_layer=2, d_model=32, n_head=4, d_inner=64, block_size=16)


def model(**kw):
    torch.manual_seed(0)
    return CharTransformer(CharTransformerConfig(**{**SMALL, **kw}))


@pytest.mark.parametrize("pos", ["per_layer", "sinusoid", "none"])
def test_logits_shape_and_hidden_states(pos):
    m = model(pos=pos)
    logits, hidden = m(torch.randint(0, 256, (3, 10)), return_hidden=True)
    assert logits.shape == (3, 10, 256)
    assert len(hidden) == 2 and all(h.shape == (3, 10, 32) for h in hidden)


@pytest.mark.parametrize("pos", ["per_layer", "sinusoid"])
def test_no_leakage_gradient_of_output_i_wrt_later_inputs_is_exactly_zero(pos):
    m = model(pos=pos, dropout=0.1)
    dep = leakage_matrix(m, torch.randint(0, 256, (12,)))
    assert torch.all(dep.triu(diagonal=1) == 0)
    assert torch.all(dep[causal_mask(12)] > 0)
    assert m.training, "leakage_matrix must restore the training mode"


def test_plain_attention_path_is_causal_too():
    m = CharTransformer(CharTransformerConfig(**SMALL), attention=lambda c: MultiHeadAttention(
        c.d_model, c.n_head, fused=False))
    assert torch.all(leakage_matrix(m, torch.arange(9)).triu(diagonal=1) == 0)


class Unmasked(MultiHeadAttention):
    def forward(self, x):
        B, T, C = x.shape
        q, k, v = self.heads(x)
        return self.out(attention(q, k, v).transpose(1, 2).reshape(B, T, C))


def test_leakage_matrix_catches_a_model_without_mask():
    torch.manual_seed(0)
    m = CharTransformer(CharTransformerConfig(**SMALL),
                        attention=lambda c: Unmasked(c.d_model, c.n_head))
    assert (leakage_matrix(m, torch.arange(8)).triu(diagonal=1) > 0).any()


def test_attention_argument_builds_one_module_per_layer():
    made = []

    def factory(c):
        made.append(MultiHeadAttention(c.d_model, c.n_head))
        return made[-1]

    m = CharTransformer(CharTransformerConfig(**SMALL), attention=factory)
    assert len(made) == 2 and [b.attn for b in m.blocks] == made


def test_per_layer_positions_differ_by_layer_and_matter():
    m = model()
    assert m.pos.shape == (2, 16, 32)
    x = torch.randint(0, 256, (1, 8))
    before = m(x)
    with torch.no_grad():
        m.pos[1].add_(torch.randn(16, 32))
    assert not torch.allclose(before, m(x))


def test_sequence_longer_than_positional_table_is_refused():
    with pytest.raises(ValueError, match="exceeds the positional table"):
        model()(torch.zeros(1, 17, dtype=torch.long))
    assert model(pos="sinusoid")(torch.zeros(1, 40, dtype=torch.long)).shape == (1, 40, 256)


@pytest.mark.parametrize("bad,msg", [
    (dict(d_model=30, n_head=4), "not divisible"),
    (dict(pos="rope"), "pos='rope' is unknown"),
    (dict(n_layer=0), "n_layer must be a positive"),
    (dict(dropout=1.0), "dropout"),
    (dict(d_model=33, n_head=3, pos="sinusoid"), "even d_model"),
])
def test_config_errors(bad, msg):
    with pytest.raises(ValueError, match=msg):
        CharTransformerConfig(**{**SMALL, **bad})


def test_wrong_token_dtype_is_refused():
    with pytest.raises(ValueError, match="LongTensor"):
        model()(torch.zeros(1, 4))


def test_evaluate_bpc_of_a_uniform_model_is_eight_bits():
    m = model()
    with torch.no_grad():
        m.tok.weight.zero_()  # tied head: every logit is 0, a uniform guess
    data = torch.randint(0, 256, (200,), dtype=torch.uint8)
    assert evaluate_bpc(m, data, seq_len=16) == pytest.approx(8.0, abs=1e-6)


def test_evaluate_bpc_matches_a_direct_computation():
    m = model().eval()
    data = torch.randint(0, 256, (100,), dtype=torch.uint8)
    x, y = data[:96].long().view(6, 16), data[1:97].long().view(6, 16)
    want = torch.nn.functional.cross_entropy(m(x).flatten(0, 1), y.flatten()) / math.log(2)
    assert evaluate_bpc(m, data, seq_len=16, batch_size=4) == pytest.approx(want.item(), rel=1e-5)
    with pytest.raises(ValueError, match="fewer than one window"):
        evaluate_bpc(m, data[:10], seq_len=16)


def test_generate_extends_prompt_and_crops_context():
    m = model()
    out = generate(m, torch.arange(5), 30, generator=torch.Generator().manual_seed(0))
    assert out.shape == (35,) and torch.equal(out[:5], torch.arange(5))
    again = generate(m, torch.arange(5), 30, generator=torch.Generator().manual_seed(0))
    assert torch.equal(out, again)


@pytest.mark.parametrize("kw,msg", [(dict(top_k=0), "top_k"), (dict(temperature=0), "temperature")])
def test_generate_rejects_bad_settings(kw, msg):
    with pytest.raises(ValueError, match=msg):
        generate(model(), torch.arange(3), 2, **kw)
    with pytest.raises(ValueError, match="prompt is empty"):
        generate(model(), torch.arange(0), 2)


def test_generate_top_k_one_is_greedy():
    m = model()
    out = generate(m, torch.arange(3), 1, top_k=1)
    assert out[-1] == m(torch.arange(3)[None])[0, -1].argmax()
