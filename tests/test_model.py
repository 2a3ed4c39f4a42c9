import math

import pytest
import torch

from minixl import CharTransformer, CharTransformerConfig, MultiHeadAttention, attention, causal_mask
from minixl import evaluate_bpc, generate, leakage_matrix, sample_next

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
    # 99 predictions: six whole windows of 16, then a last window of the 3 bytes left
    x, y = data[:96].long().view(6, 16), data[1:97].long().view(6, 16)
    nll = torch.nn.functional.cross_entropy(m(x).flatten(0, 1), y.flatten(), reduction="sum")
    nll += torch.nn.functional.cross_entropy(m(data[96:99].long()[None])[0], data[97:].long(),
                                             reduction="sum")
    want = nll.item() / 99 / math.log(2)
    assert evaluate_bpc(m, data, seq_len=16, batch_size=4) == pytest.approx(want, rel=1e-5)
    # fewer bytes than a window: one short window
    short = torch.nn.functional.cross_entropy(m(data[:9].long()[None])[0], data[1:10].long())
    assert evaluate_bpc(m, data[:10], seq_len=16) == pytest.approx(
        short.item() / math.log(2), rel=1e-5)
    for bad in (dict(data=data[:1]), dict(seq_len=0), dict(batch_size=0)):
        with pytest.raises(ValueError, match="at least 2 bytes"):
            evaluate_bpc(m, **{"data": data, "seq_len": 16, **bad})


@pytest.mark.parametrize("pos", ["per_layer", "sinusoid"])
@pytest.mark.parametrize("pieces", [[16], [3, 1, 5, 7], [1] * 16, [10, 6]])
def test_step_in_pieces_equals_one_pass_when_the_text_fits_the_block(pos, pieces):
    m = model(pos=pos).eval()
    text = torch.randint(0, 256, (2, 16), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        whole = m(text)
        outs, state = [], None
        for chunk in text.split(pieces, dim=1):
            logits, state = m.step(chunk, state)
            assert logits.shape == (2, chunk.size(1), 256)
            outs.append(logits)
    torch.testing.assert_close(torch.cat(outs, 1), whole, atol=1e-5, rtol=1e-5)
    assert torch.equal(state, text[:, -15:])  # the state: the last block_size - 1 bytes


def test_step_past_the_block_reads_the_last_block_size_bytes():
    m = model().eval()
    text = torch.randint(0, 256, (1, 40), generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        state = None
        for chunk in text[:, :30].split(10, dim=1):  # each piece must fit the block on its own
            _, state = m.step(chunk, state)
        logits, state = m.step(text[:, 30:33], state)
        want = m(text[:, 33 - 16:33])[:, -3:]  # 13 bytes of context + the 3 new ones
    torch.testing.assert_close(logits, want, atol=1e-5, rtol=1e-5)
    assert torch.equal(state, text[:, 33 - 15:33])


def test_generate_extends_prompt_and_crops_context():
    m = model()
    out = generate(m, torch.arange(5), 20, generator=torch.Generator().manual_seed(0))
    assert out.shape == (25,) and torch.equal(out[:5], torch.arange(5))
    again = generate(m, torch.arange(5), 20, generator=torch.Generator().manual_seed(0))
    assert torch.equal(out, again)
    assert m.training, "generate must restore the training mode"
    # the same draws as re-reading the last block_size bytes for every new byte
    g, tokens = torch.Generator().manual_seed(0), torch.arange(5)[None]
    with torch.no_grad():
        m.eval()
        for _ in range(20):
            nxt = sample_next(m(tokens[:, -16:])[:, -1], generator=g)
            tokens = torch.cat([tokens, nxt], 1)
    assert torch.equal(out, tokens[0])


@pytest.mark.parametrize("kw,msg", [(dict(top_k=0), "top_k"), (dict(temperature=0), "temperature")])
def test_generate_rejects_bad_settings(kw, msg):
    with pytest.raises(ValueError, match=msg):
        generate(model(), torch.arange(3), 2, **kw)
    with pytest.raises(ValueError, match="prompt is empty"):
        generate(model(), torch.arange(0), 2)
    with pytest.raises(ValueError, match="n_new"):
        generate(model(), torch.arange(3), -1)


def test_generate_top_k_one_is_greedy():
    m = model()
    out = generate(m, torch.arange(3), 1, top_k=1)
    assert out[-1] == m(torch.arange(3)[None])[0, -1].argmax()


def test_post_norm_block_normalises_after_each_residual_sum_and_pre_is_the_default():
    from minixl.char_transformer import Block
    torch.manual_seed(0)
    attn = MultiHeadAttention(32, 4)
    post = Block(32, 64, attn, norm="post")
    with torch.no_grad():
        for ln in (post.ln1, post.ln2):  # non-trivial affine parameters
            ln.weight.uniform_(0.5, 1.5), ln.bias.normal_()
    x = torch.randn(2, 7, 32)
    mid = post.ln1(x + attn(x))
    torch.testing.assert_close(post(x), post.ln2(mid + post.ff(mid)))
    pre = Block(32, 64, attn)
    pre.load_state_dict(post.state_dict())
    y = x + attn(pre.ln1(x))
    torch.testing.assert_close(pre(x), y + pre.ff(pre.ln2(y)))
    assert not torch.allclose(pre(x), post(x), atol=1e-3)
    assert CharTransformerConfig().norm == "pre"
    assert all(b.norm == "post" for b in model(norm="post").blocks)
    with pytest.raises(ValueError, match="norm='mid' is unknown; expected 'pre' or 'post'"):
        CharTransformerConfig(norm="mid")
    with pytest.raises(ValueError, match="expected 'pre' or 'post'"):
        Block(32, 64, attn, norm="Post")
