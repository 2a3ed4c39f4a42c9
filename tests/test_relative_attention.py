"""Chapter 3: Shaw et al.'s relative attention, its three forms, and the model built on it."""

import pytest
import torch

from conftest import train_args

from minixl import (CharTransformer, CharTransformerConfig, ShawRelativeAttention, attention,
                    causal_mask, leakage_matrix, relative_index, shaw_attention,
                    shaw_attention_gathered, shaw_attention_loop, shaw_factory)
from minixl.checkpoint import load_checkpoint
from minixl.relative_attention import SHAW_FORMS, SHAW_GATHER_PAIRS, shaw_attention_cost, shaw_form
from minixl.cli import main
from minixl.data import pydoc_text
from minixl.relative_attention.kind import ShawConfig
from minixl.kinds import KINDS, kind_of, model_from_checkpoint

FAST = [shaw_attention, shaw_attention_gathered]


def tensors(B, H, Tq, Tk, D, K, seed=0):
    g = torch.Generator().manual_seed(seed)
    q, k, v = (torch.randn(B, H, t, D, generator=g, dtype=torch.float64) for t in (Tq, Tk, Tk))
    w_k, w_v = torch.randn(2, 2 * K + 1, D, generator=g, dtype=torch.float64)
    return q, k, v, w_k, w_v


@pytest.mark.parametrize("fast", FAST)
@pytest.mark.parametrize("B,H,Tq,Tk,D,K", [(2, 3, 6, 6, 4, 2), (1, 2, 3, 8, 8, 1),
                                           (2, 1, 5, 5, 4, 0), (1, 2, 4, 4, 4, 12),
                                           (1, 1, 1, 9, 4, 3)])
@pytest.mark.parametrize("masked", [True, False])
def test_efficient_forms_equal_the_loop(fast, B, H, Tq, Tk, D, K, masked):
    q, k, v, w_k, w_v = tensors(B, H, Tq, Tk, D, K)
    mask = causal_mask(Tq, Tk) if masked else None
    torch.testing.assert_close(fast(q, k, v, w_k, w_v, mask),
                               shaw_attention_loop(q, k, v, w_k, w_v, mask))


def test_gradients_agree_with_the_loop():
    grads = []
    for f in (shaw_attention_loop, shaw_attention, shaw_attention_gathered):
        args = [t.requires_grad_() for t in tensors(1, 2, 4, 6, 4, 2)]
        f(*args, causal_mask(4, 6)).sum().backward()
        grads.append([a.grad for a in args])
    for other in grads[1:]:
        for a, b in zip(grads[0], other):
            torch.testing.assert_close(a, b)


def test_both_forms_apply_the_same_dropout():
    q, k, v, w_k, w_v = tensors(2, 2, 6, 6, 4, 2)
    out = []
    for f in SHAW_FORMS.values():
        torch.manual_seed(3)
        out.append(f(q, k, v, w_k, w_v, causal_mask(6), dropout=0.5))
    torch.testing.assert_close(out[0], out[1])
    assert not torch.allclose(out[0], shaw_attention(q, k, v, w_k, w_v, causal_mask(6)))


def test_the_chooser_picks_each_form_by_size():
    side = int(SHAW_GATHER_PAIRS ** 0.5)
    assert shaw_form(side, side, 4) == "gathered"
    assert shaw_form(side + 1, side + 1, 4) == "bucket"
    assert shaw_form(1, SHAW_GATHER_PAIRS, 0) == "gathered"
    assert shaw_form(2, SHAW_GATHER_PAIRS, 0) == "bucket"
    with pytest.raises(ValueError, match="qlen <= klen"):
        shaw_form(5, 4, 2)


@pytest.mark.parametrize("T", [8, 24])  # one length each side of the threshold
def test_layer_forms_agree_in_values_and_gradients(T):
    """The layer's automatic choice, and each form forced, give the same outputs and
    gradients (the choice is a speed matter only)."""
    results = []
    for form in ("auto", *SHAW_FORMS):
        torch.manual_seed(0)
        layer = ShawRelativeAttention(16, 2, 3, form=form).double()
        x = torch.randn(2, T, 16, dtype=torch.float64, requires_grad=True)
        y = layer(x)
        y.square().sum().backward()
        results.append((y, x.grad, layer.w_k.grad, layer.w_v.grad))
    for other in results[1:]:
        for a, b in zip(results[0], other):
            torch.testing.assert_close(a, b)
    with pytest.raises(ValueError, match="form='fast' is unknown"):
        ShawRelativeAttention(16, 2, 3, form="fast")


def test_cost_function_times_each_form_and_rejects_unknown_ones():
    for method in SHAW_FORMS:
        row = shaw_attention_cost(method, 8, max_relative=2, batch=1, n_head=1, d_head=4,
                                  repeats=1)
        assert row["method"] == method and row["T"] == 8 and row["seconds"] > 0
    with pytest.raises(ValueError, match="unknown method 'loop'"):
        shaw_attention_cost("loop", 8)


def test_clipping_index_and_far_keys_share_a_vector():
    idx = relative_index(3, 5, 1)
    # queries at positions 2, 3, 4; keys 0..4; distances j - i clipped to [-1, 1], +1
    assert idx.tolist() == [[0, 0, 1, 2, 2], [0, 0, 0, 1, 2], [0, 0, 0, 0, 1]]
    # With K = 2, keys 2 or more to the left all read row 0: the same position bias.
    q, k, v, w_k, w_v = tensors(1, 1, 6, 6, 4, 2)
    base = shaw_attention(q, k, v, w_k, w_v, causal_mask(6))
    k_far = k.clone()
    k_far[..., :4, :] = k[..., :4, :].flip(2)  # swap the content of far keys among themselves
    v_far = v.clone()
    v_far[..., :4, :] = v[..., :4, :].flip(2)
    moved = shaw_attention(q, k_far, v_far, w_k, w_v, causal_mask(6))
    # The last query (position 5) sees keys 0..3 at distances <= -2: all clipped to row 0,
    # so permuting them leaves its output unchanged.
    torch.testing.assert_close(moved[..., 5, :], base[..., 5, :])
    assert not torch.allclose(moved[..., 4, :], base[..., 4, :])  # query 4 sees key 3 at -1, row 1


def test_zero_tables_give_plain_attention():
    q, k, v, w_k, w_v = tensors(2, 2, 5, 7, 4, 3)
    zero = torch.zeros_like(w_k)
    torch.testing.assert_close(shaw_attention(q, k, v, zero, zero, causal_mask(5, 7)),
                               attention(q, k, v, causal_mask(5, 7)))


@pytest.mark.parametrize("bad,msg", [
    (dict(w_k=torch.zeros(4, 4)), "odd number"),
    (dict(w_k=torch.zeros(5, 8), w_v=torch.zeros(5, 8)), "width 8"),
    (dict(q=torch.zeros(1, 1, 9, 4)), "Tq <= Tk"),
])
def test_bad_shapes_are_explained(bad, msg):
    args = dict(q=torch.zeros(1, 1, 3, 4), k=torch.zeros(1, 1, 5, 4), v=torch.zeros(1, 1, 5, 4),
                w_k=torch.zeros(5, 4), w_v=torch.zeros(5, 4))
    args.update(bad)
    with pytest.raises(ValueError, match=msg):
        shaw_attention(**args)


def test_relative_model_is_causal_and_runs_past_its_training_length():
    torch.manual_seed(0)
    cfg = CharTransformerConfig(n_layer=2, d_model=32, n_head=2, d_inner=64, block_size=8,
                                pos="none")
    model = CharTransformer(cfg, attention=shaw_factory(3))
    dep = leakage_matrix(model, torch.randint(0, 256, (12,)))
    assert torch.all(dep.triu(diagonal=1) == 0) and torch.all(dep.diagonal() > 0)
    assert model(torch.zeros(1, 32, dtype=torch.long)).shape == (1, 32, 256)


def test_causal_model_never_trains_right_hand_distances():
    torch.manual_seed(0)
    layer = ShawRelativeAttention(16, 2, max_relative=3)
    layer(torch.randn(2, 6, 16)).pow(2).sum().backward()
    assert torch.all(layer.w_k.grad[4:] == 0) and torch.all(layer.w_v.grad[4:] == 0)
    assert layer.w_k.grad[:4].abs().sum() > 0
    both = ShawRelativeAttention(16, 2, max_relative=3, causal=False)
    both(torch.randn(2, 6, 16)).pow(2).sum().backward()
    assert both.w_k.grad[4:].abs().sum() > 0


def test_train_eval_and_resume_with_shaw(tmp_path, capsys):
    corpus = tmp_path / "text.txt"
    corpus.write_bytes(pydoc_text()[:20_000])  # a held-out split of 1 kB: a quick final eval
    out = tmp_path / "shaw"
    assert main(train_args("shaw", out, 4, "--corpus", str(corpus))) == 0
    ckpt = load_checkpoint(out / "checkpoint.pt")
    assert ckpt["meta"]["kind"] == "shaw"
    assert ckpt["model_config"]["pos"] == "none" and ckpt["model_config"]["max_relative"] == 4
    model = model_from_checkpoint(ckpt)
    assert isinstance(model.blocks[0].attn, ShawRelativeAttention)
    assert model.blocks[0].attn.w_k.shape == (9, 16)  # 2K + 1 distances, d_head = 32 / 2
    capsys.readouterr()
    assert main(["eval", "--checkpoint", str(out / "checkpoint.pt"), "--seq-len", "128",
                 "--max-bytes", "300", "--device", "cpu"]) == 0  # 4x the training window
    assert "windows of 128" in capsys.readouterr().out
    before = (out / "checkpoint.pt").read_bytes()
    assert main(train_args("shaw", out, 4, "--corpus", str(corpus), "--max-relative", "2",
                           "--resume")) == 2
    err = capsys.readouterr().err
    assert "model.max_relative: 4 -> 2" in err and "model.max_relative cannot change on resume" in err
    assert (out / "checkpoint.pt").read_bytes() == before


def test_unknown_model_and_bad_settings_are_rejected(capsys):
    with pytest.raises(ValueError, match="unknown model 'rotary'"):
        kind_of("rotary")
    with pytest.raises(ValueError, match="max_relative must be >= 0"):
        ShawConfig(max_relative=-1)
    assert ShawConfig().pos == "none" and KINDS["shaw"].config is ShawConfig
    assert main(["train", "--model", "rotary"]) == 2  # one line, naming the models there are
    assert "unknown model 'rotary': expected one of char, shaw," in capsys.readouterr().err
    assert main(["train", "--model", "char", "--max-relative", "4", "--out", "unused"]) == 2
    assert "--max-relative applies to --model shaw, not --model char" in capsys.readouterr().err
