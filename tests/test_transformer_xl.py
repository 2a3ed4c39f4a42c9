"""Chapter 4: rel_shift, the four-term score, recurrence, stop-gradient, causality, trainer."""

import math

import pytest
import torch
import torch.nn.functional as F
from conftest import first_quick, train_args

import minixl
from minixl.char_transformer import causal_mask, generate, leakage_matrix, sample_next
from minixl.checkpoint import load_checkpoint
from minixl.cli import main
from minixl.data import OrderedStreams, encode
from minixl.evaluation import memory_streams
from minixl.training import TrainConfig, train
from minixl.transformer_xl import (NoMemory, TransformerXL, TransformerXLConfig, evaluate_bpc_xl,
                                   rel_scores, rel_scores_naive, rel_shift, relative_distances,
                                   relative_positions, sharpened, stream_nll)

SHAPES = [(1, 1), (3, 3), (3, 5), (1, 7), (4, 9), (6, 6), (2, 12)]


def tiny(**kw) -> TransformerXLConfig:
    base = dict(n_layer=2, d_model=32, n_head=2, d_head=16, d_inner=64, tgt_len=8, mem_len=8)
    return TransformerXLConfig(**{**base, **kw})


def naive_shift(x: torch.Tensor) -> torch.Tensor:
    """The definition by indexing: y[..., i, j] = x[..., i, Tk - 1 - (M + i - j)] where allowed."""
    qlen, klen = x.shape[-2:]
    y = torch.zeros_like(x)
    for i in range(qlen):
        for j in range(klen - qlen + i + 1):
            y[..., i, j] = x[..., i, klen - 1 - (klen - qlen + i - j)]
    return y


@pytest.mark.parametrize("qlen,klen", SHAPES)
@pytest.mark.parametrize("lead", [(), (2,), (2, 3)])
def test_rel_shift_matches_the_definition_on_allowed_entries(qlen, klen, lead):
    x = torch.randn(*lead, qlen, klen, generator=torch.Generator().manual_seed(qlen * klen))
    keep = causal_mask(qlen, klen)
    assert torch.equal(rel_shift(x)[..., keep], naive_shift(x)[..., keep])


def test_rel_shift_junk_is_wrapped_not_zero():
    # The entries above the shifted diagonal are not part of the contract; the reference's
    # pad-and-view leaves wrapped numbers there, and so do we: the mask must hide them.
    x = torch.arange(1, 16, dtype=torch.float).view(3, 5)
    y = rel_shift(x)
    assert y[0, 4] == x[1, 0] != 0  # a number from the next row, not a zero


def test_rel_shift_rejects_bad_shapes():
    with pytest.raises(ValueError, match="qlen <= klen"):
        rel_shift(torch.zeros(5, 3))
    with pytest.raises(ValueError, match=r"\[..., qlen, klen\]"):
        rel_shift(torch.zeros(4))


@pytest.mark.parametrize("qlen,klen", [(4, 4), (4, 10), (1, 6), (5, 7)])
def test_efficient_scores_equal_naive_four_terms(qlen, klen):
    g = torch.Generator().manual_seed(klen)
    B, H, D, C = 2, 3, 4, 16
    q = torch.randn(B, H, qlen, D, generator=g, dtype=torch.float64)
    k = torch.randn(B, H, klen, D, generator=g, dtype=torch.float64)
    w = torch.randn(H, D, C, generator=g, dtype=torch.float64)
    u, v = torch.randn(2, H, D, generator=g, dtype=torch.float64)
    dist = relative_distances(qlen, klen)
    r_desc = relative_positions(torch.arange(klen - 1, -1, -1), C).double()  # (Tk, C)
    r_pair = torch.einsum("ijc,hdc->hijd", relative_positions(dist.clamp(min=0), C).double(), w)
    fast = rel_scores(q, k, r_desc @ w.transpose(1, 2), u, v)
    naive = rel_scores_naive(q, k, r_pair, u, v)
    keep = causal_mask(qlen, klen)
    torch.testing.assert_close(fast[..., keep], naive[..., keep])


def test_each_naive_term_is_what_its_name_says():
    g = torch.Generator().manual_seed(0)
    q, k = torch.randn(1, 1, 2, 3, generator=g), torch.randn(1, 1, 4, 3, generator=g)
    r = torch.randn(1, 2, 4, 3, generator=g)
    zero = torch.zeros(1, 3)
    u = torch.randn(1, 3, generator=g)
    # with q = 0 only (c) and (d) remain: u . k_j and v . r_ij
    got = rel_scores_naive(torch.zeros_like(q), k, r, u, zero)
    torch.testing.assert_close(got[0, 0], (u @ k[0, 0].T).expand(2, 4))
    got = rel_scores_naive(torch.zeros_like(q), torch.zeros_like(k), r, zero, u)
    torch.testing.assert_close(got[0, 0], (r[0] @ u[0]))


def test_relative_positions_clamp():
    d = torch.arange(10)
    R = relative_positions(d, 8, clamp_len=4)
    assert torch.equal(R[4:], R[4].expand(6, 8)) and not torch.equal(R[3], R[4])
    assert torch.equal(relative_positions(d, 8), minixl.sinusoid_positions(10, 8))


@pytest.mark.parametrize("split,mem_len", [(5, 5), (13, 13), (13, 30), (1, 1)])
def test_two_segments_with_memory_equal_one_causal_pass(split, mem_len):
    torch.manual_seed(0)
    model = sharpened(TransformerXL(tiny()).eval())
    tokens = torch.randint(0, 256, (3, 21))
    with torch.no_grad():
        whole, _ = model(tokens, mem_len=0)
        first, mems = model(tokens[:, :split], mem_len=mem_len)
        second, _ = model(tokens[:, split:], mems)
    torch.testing.assert_close(torch.cat([first, second], 1), whole, atol=1e-4, rtol=1e-4)


def test_the_equality_sees_what_the_memory_holds_and_its_order():
    """With sharpened weights (at initialisation a time-reversed memory moves the logits by
    about 1e-5, the old tolerance), the test above would catch a recurrence that keeps the right states in the wrong
    order, or the wrong states: each moves the logits far beyond its tolerance."""
    torch.manual_seed(0)
    model = sharpened(TransformerXL(tiny()).eval())
    tokens = torch.randint(0, 256, (3, 21))
    with torch.no_grad():
        whole, _ = model(tokens, mem_len=0)
        _, mems = model(tokens[:, :13], mem_len=13)
        for wrong in ([m.flip(1) for m in mems],  # time reversed
                      [m.roll(1, dims=0) for m in mems],  # another stream's memory
                      [mems[0], mems[0]]):  # every layer given the embeddings
            second, _ = model(tokens[:, 13:], wrong)
            assert (second - whole[:, 13:]).abs().max() > 1e-2
    torch.manual_seed(0)
    fresh = TransformerXL(tiny()).eval()  # as initialised, the same wrong memory hides
    with torch.no_grad():
        whole, _ = fresh(tokens, mem_len=0)
        _, mems = fresh(tokens[:, :13], mem_len=13)
        second, _ = fresh(tokens[:, 13:], [m.flip(1) for m in mems])
    assert (second - whole[:, 13:]).abs().max() < 1e-4


def test_three_segments_and_pre_lnorm_also_match():
    torch.manual_seed(1)
    model = TransformerXL(tiny(pre_lnorm=True, n_layer=3)).eval()
    tokens = torch.randint(0, 256, (2, 24))
    with torch.no_grad():
        whole, _ = model(tokens, mem_len=0)
        outs, mems = [], None
        for chunk in tokens.split([7, 9, 8], dim=1):
            out, mems = model(chunk, mems, mem_len=24)
            outs.append(out)
    torch.testing.assert_close(torch.cat(outs, 1), whole, atol=1e-5, rtol=1e-5)


def test_short_memory_differs_from_one_pass():
    # the memory keeps only the last 4 states, so the second segment sees less: not equal
    torch.manual_seed(0)
    model = TransformerXL(tiny()).eval()
    tokens = torch.randint(0, 256, (1, 16))
    with torch.no_grad():
        whole, _ = model(tokens, mem_len=0)
        _, mems = model(tokens[:, :8], mem_len=4)
        second, _ = model(tokens[:, 8:], mems)
    assert mems[0].shape == (1, 4, 32)
    assert (second - whole[:, 8:]).abs().max() > 1e-3


def test_absolute_positions_break_the_equality():
    torch.manual_seed(0)
    model = TransformerXL(tiny(pos="absolute")).eval()
    tokens = torch.randint(0, 256, (1, 16))
    with torch.no_grad():
        whole, _ = model(tokens, mem_len=0)
        _, mems = model(tokens[:, :8], mem_len=8)
        second, _ = model(tokens[:, 8:], mems)
    assert (second - whole[:, 8:]).abs().max() > 1e-2


def test_no_gradient_flows_into_memory():
    torch.manual_seed(0)
    model = TransformerXL(tiny())
    leaves = []

    def as_leaf(module, args, out):
        leaves.append(out.detach().requires_grad_(True))
        return leaves[-1]

    hook = model.word_emb.register_forward_hook(as_leaf)
    _, mems = model(torch.randint(0, 256, (2, 8)))
    logits, new_mems = model(torch.randint(0, 256, (2, 8)), mems)
    hook.remove()
    logits.logsumexp(-1).sum().backward()
    assert leaves[0].grad is None  # the first segment reaches the loss only through memory
    assert leaves[1].grad is not None and leaves[1].grad.abs().sum() > 0
    assert not any(m.requires_grad for m in mems + new_mems)


def test_memory_update_keeps_the_last_mem_len_inputs():
    torch.manual_seed(0)
    model = TransformerXL(tiny(mem_len=6)).eval()
    inputs = []
    hook = model.layers[1].register_forward_pre_hook(lambda mod, args: inputs.append(args[0]))
    _, mems = model(torch.randint(0, 256, (2, 4)))
    assert [m.shape for m in mems] == [(2, 4, 32)] * 2
    _, mems2 = model(torch.randint(0, 256, (2, 5)), mems)
    hook.remove()
    assert mems2[1].shape == (2, 6, 32)
    want = torch.cat([inputs[0], inputs[1]], 1)[:, -6:]  # layer 1's inputs, last 6
    torch.testing.assert_close(mems2[1], want)
    _, none = model(torch.randint(0, 256, (2, 5)), mems, mem_len=0)
    assert none[0].shape == (2, 0, 32)


@pytest.mark.parametrize("pos", ["relative", "absolute"])
def test_causal_within_a_segment(pos):
    torch.manual_seed(0)
    model = TransformerXL(tiny(pos=pos))
    dep = leakage_matrix(NoMemory(model), encode("causal check!"))
    assert torch.all(dep.triu(diagonal=1) == 0) and torch.all(dep.diagonal() > 0)


def test_causal_with_memory_future_tokens_do_not_change_earlier_logits():
    torch.manual_seed(0)
    model = TransformerXL(tiny()).eval()
    _, mems = model(torch.randint(0, 256, (1, 8)))
    seg = torch.randint(0, 256, (1, 8))
    changed = seg.clone()
    changed[0, 5:] = (changed[0, 5:] + 1) % 256
    with torch.no_grad():
        a, _ = model(seg, mems)
        b, _ = model(changed, mems)
    torch.testing.assert_close(a[:, :5], b[:, :5])
    assert (a[:, 5:] - b[:, 5:]).abs().max() > 1e-4


def test_memory_changes_the_output():
    torch.manual_seed(0)
    model = TransformerXL(tiny()).eval()
    seg = torch.randint(0, 256, (1, 8))
    with torch.no_grad():
        _, m1 = model(torch.randint(0, 256, (1, 8)))
        _, m2 = model(torch.randint(0, 256, (1, 8)))
        assert (model(seg, m1)[0] - model(seg, m2)[0]).abs().max() > 1e-4


def test_bad_inputs_give_clear_errors():
    model = TransformerXL(tiny())
    with pytest.raises(ValueError, match="LongTensor"):
        model(torch.zeros(2, 3))
    with pytest.raises(ValueError, match="mems must be 2 tensors"):
        model(torch.zeros(2, 3, dtype=torch.long), [torch.zeros(2, 4, 32)])
    with pytest.raises(ValueError, match="one length"):
        model(torch.zeros(2, 3, dtype=torch.long), [torch.zeros(2, 4, 32), torch.zeros(2, 5, 32)])
    for bad in (dict(mem_len=-1), dict(d_model=33), dict(pos="rope"), dict(dropout=1.0),
                dict(tgt_len=0)):
        with pytest.raises(ValueError):
            tiny(**bad)


def test_stream_nll_with_one_stream_equals_one_pass():
    torch.manual_seed(0)
    model = TransformerXL(tiny()).eval()
    data = torch.randint(0, 256, (41,), dtype=torch.uint8)
    nll = stream_nll(model, data, tgt_len=8, mem_len=40)  # memory covers everything
    with torch.no_grad():
        logits, _ = model(data[:-1].long()[None], mem_len=0)
    want = F.cross_entropy(logits[0], data[1:].long(), reduction="none")
    torch.testing.assert_close(nll[0], want, atol=1e-5, rtol=1e-5)
    assert evaluate_bpc_xl(model, data, tgt_len=8, mem_len=40) == pytest.approx(
        want.mean().item() / math.log(2), rel=1e-5)


def test_stream_nll_reads_each_stream_as_one_text():
    torch.manual_seed(0)
    model = TransformerXL(tiny()).eval()
    data = torch.randint(0, 256, (51,), dtype=torch.uint8)
    nll = stream_nll(model, data, tgt_len=4, batch_size=2, mem_len=30)  # 2 streams of 25
    assert nll.shape == (2, 25)
    for b in range(2):
        stream = data[25 * b: 25 * b + 26].long()
        with torch.no_grad():
            logits, _ = model(stream[:-1][None], mem_len=0)
        torch.testing.assert_close(nll[b], F.cross_entropy(logits[0], stream[1:],
                                                           reduction="none"),
                                   atol=1e-5, rtol=1e-5)


def test_step_is_forward_with_the_memory_as_state():
    torch.manual_seed(0)
    model = TransformerXL(tiny()).eval()
    tokens = torch.randint(0, 256, (2, 12))
    with torch.no_grad():
        a, state = model.step(tokens[:, :5], kv_cache=False)
        b, state = model.step(tokens[:, 5:], state, mem_len=3, kv_cache=False)
        want_a, mems = model(tokens[:, :5])
        want_b, want_mems = model(tokens[:, 5:], mems, mem_len=3)
        ca, cache = model.step(tokens[:, :5])  # inference: keys and values (section 4.7)
        cb, cache = model.step(tokens[:, 5:], cache, mem_len=3)
    torch.testing.assert_close(torch.cat([a, b], 1), torch.cat([want_a, want_b], 1))
    torch.testing.assert_close(torch.cat([ca, cb], 1), torch.cat([want_a, want_b], 1))
    assert [m.shape for m in state] == [(2, 3, 32)] * 2
    assert [k.shape for k in cache.keys] == [(2, 2, 3, 16)] * 2
    for m, w in zip(state, want_mems):
        torch.testing.assert_close(m, w)


def test_generate_with_memory_samples_what_full_rereads_would():
    torch.manual_seed(0)
    model = TransformerXL(tiny(mem_len=64)).eval()
    prompt = encode("abcdefghijk")  # longer than one segment of 8
    out = generate(model, prompt, 12, generator=torch.Generator().manual_seed(3))
    assert out.shape == (23,) and torch.equal(out[:11], prompt)
    # with a memory longer than the text, the same draws come from one pass over everything
    g = torch.Generator().manual_seed(3)
    tokens = prompt[None]
    with torch.no_grad():
        for _ in range(12):
            logits, _ = model(tokens, mem_len=0)
            nxt = minixl.sample_next(logits[:, -1], generator=g)
            tokens = torch.cat([tokens, nxt], 1)
    assert torch.equal(out, tokens[0])
    with pytest.raises(ValueError, match="temperature"):
        generate(model, prompt, 2, temperature=0)


def test_generate_with_short_memory_matches_its_own_recurrence():
    # mem_len 4 < the text: generate must carry exactly the memory the model keeps
    torch.manual_seed(0)
    model = TransformerXL(tiny(mem_len=4)).eval()
    prompt = encode("abcdef")
    out = generate(model, prompt, 6, top_k=5, generator=torch.Generator().manual_seed(1))
    g = torch.Generator().manual_seed(1)
    with torch.no_grad():
        logits, mems = model(prompt[None])
        tokens = prompt[None]
        for _ in range(6):
            nxt = sample_next(logits[:, -1], top_k=5, generator=g)
            tokens = torch.cat([tokens, nxt], 1)
            logits, mems = model(nxt, mems)
    assert torch.equal(out, tokens[0])


def test_generate_without_memory_samples_through_the_window_it_trained_on():
    """mem_len 0: each sampled byte is read with the tgt_len - 1 bytes before it (one pass
    over the last tgt_len), not alone; a whole segment still reads only itself."""
    torch.manual_seed(0)
    model = sharpened(TransformerXL(tiny(mem_len=0))).eval()  # tgt_len 8
    prompt = encode("abcdefghijk")
    out = generate(model, prompt, 12, generator=torch.Generator().manual_seed(3))
    g, tokens = torch.Generator().manual_seed(3), prompt[None]
    with torch.no_grad():
        for _ in range(12):
            logits, _ = model(tokens[:, -8:], mem_len=0)
            tokens = torch.cat([tokens, sample_next(logits[:, -1], generator=g)], 1)
        assert torch.equal(out, tokens[0])
        window, _ = model(tokens[:, -8:], mem_len=0)
        alone, _ = model(tokens[:, -1:], mem_len=0)  # what an empty state gave the last byte
        assert not torch.allclose(alone[:, -1], window[:, -1], atol=1e-3)
        x = tokens[:, :16]  # training's segments: the second reads nothing of the first
        first, state = model.step(x[:, :8])
        second, state = model.step(x[:, 8:], state)
        assert torch.equal(state, x[:, 9:])  # the last tgt_len - 1 bytes
        torch.testing.assert_close(second, model(x[:, 8:], mem_len=0)[0])


def test_xl_run_from_the_cli_evaluates_with_longer_memory_and_samples(xl_run, small_corpus,
                                                                     capsys):
    ckpt = load_checkpoint(xl_run / "checkpoint.pt")
    assert ckpt["meta"]["kind"] == "xl" and ckpt["step"] == 8
    assert [tuple(m.shape) for m in ckpt["state"]] == [(4, 16, 32)]  # the memory, per layer
    path = str(xl_run / "checkpoint.pt")
    capsys.readouterr()
    assert main(["eval", "--checkpoint", path, "--model", "xl", "--mem-len", "64",
                 "--max-bytes", "801", "--device", "cpu"]) == 0
    assert "memory of 64" in capsys.readouterr().out
    assert main(["eval", "--checkpoint", path, "--protocol", "sliding", "--stride", "8",
                 "--max-bytes", "401", "--device", "cpu"]) == 0
    assert "sliding windows of 16" in capsys.readouterr().out
    assert main(["sample", "--checkpoint", path, "--n", "10", "--prompt", "ab",
                 "--device", "cpu"]) == 0
    assert capsys.readouterr().out.startswith("ab")
    # wrong kind, wrong flags: one clear line, exit 2
    for argv, msg in [
        (["eval", "--checkpoint", path, "--protocol", "sliding", "--mem-len", "8"],
         "apply to --protocol memory"),
        (["eval", "--checkpoint", path, "--seq-len", "8"], "--seq-len applies to the window"),
        (["eval", "--checkpoint", path, "--model", "char"], "holds a --model xl checkpoint"),
        (["eval", "--checkpoint", path, "--mem-len", "-1"], "mem_len"),
        (train_args("xl", xl_run, 8, "--block-size", "8", "--resume"),
         "--block-size applies to --model char"),
        (train_args("xl", xl_run, 12, "--resume", "--aux-losses", "layers"), "--aux-losses"),
        (train_args("xl", xl_run, 12, "--resume", "--corpus", str(small_corpus)),
         "pass --allow-change steps"),  # a longer run
    ]:
        assert main([*argv, "--device", "cpu"]) == 2, argv
        err = capsys.readouterr().err
        assert msg in err and "Traceback" not in err, (argv, err)


class Stop(Exception):
    pass


@pytest.mark.slow
def test_resume_continues_exactly_with_the_memory(tmp_path):
    data = torch.tensor([(i * 7) % 26 + 97 for i in range(3000)], dtype=torch.uint8)
    cfg = TrainConfig(steps=6, batch_size=4, lr=1e-3, warmup=0, eval_every=100, ckpt_every=3,
                      log_every=1, device="cpu")
    config = tiny(n_layer=1, d_model=16, d_head=8, d_inner=32, mem_len=8, dropout=0.1)
    batches = OrderedStreams(data, 4, 8)  # 93 segments: the memory is carried at every step

    def run(out, source=batches, resume=False):
        torch.manual_seed(0)
        return train(TransformerXL(config), cfg, batches=source, out=out, resume=resume,
                     progress=False)

    whole = run(tmp_path / "a")

    def stop_at_3(step):
        if step == 3:
            raise Stop  # killed after the checkpoint of step 3
        return batches(step)

    with pytest.raises(Stop):
        run(tmp_path / "b", stop_at_3)
    assert load_checkpoint(tmp_path / "b" / "checkpoint.pt")["step"] == 3
    resumed = run(tmp_path / "b", resume=True)
    for key, value in whole.model.state_dict().items():
        torch.testing.assert_close(resumed.model.state_dict()[key], value)
    a = load_checkpoint(tmp_path / "a" / "checkpoint.pt")["state"]
    b = load_checkpoint(tmp_path / "b" / "checkpoint.pt")["state"]
    for ma, mb in zip(a, b, strict=True):
        torch.testing.assert_close(ma, mb)


def test_eval_streams_stay_long_enough_for_memory():
    assert memory_streams(10**5, 128, 64) == 24  # (10^5 - 1) // (32 * 128)
    assert memory_streams(10**8, 128, 64) == 64  # capped by the batch size
    assert memory_streams(8193, 128, 64) == 2 and memory_streams(100, 128, 64) == 1


def test_negative_memory_overrides_are_rejected():
    model = TransformerXL(tiny())
    with pytest.raises(ValueError, match="mem_len and clamp_len must be >= 0"):
        model(torch.zeros(1, 3, dtype=torch.long), mem_len=-1)


# --- Section 4.7's key/value cache and section 4.11's fused attention -----------------------

from minixl.transformer_xl import KVCache, attention_mask, fused_rel_attention  # noqa: E402


def _trained_like(cfg: TransformerXLConfig, seed: int = 0) -> TransformerXL:
    """A model whose weights are large enough that a wrong position or key shows in the logits
    (the N(0, 0.02) init makes every logit nearly the same)."""
    torch.manual_seed(seed)
    model = TransformerXL(cfg)
    with torch.no_grad():
        for p in model.parameters():
            p.normal_(0, 0.3)
    return model.eval()


@pytest.mark.slow
@pytest.mark.parametrize("pre_lnorm", [False, True])
@pytest.mark.parametrize("pos", ["relative", "absolute"])
@pytest.mark.parametrize("mem_len", [5, 8, 20])  # (mem_len 0 carries bytes, not a memory)
def test_kv_cache_equals_hidden_state_memory(pre_lnorm, pos, mem_len):
    model = _trained_like(tiny(pre_lnorm=pre_lnorm, pos=pos, mem_len=mem_len))
    data = torch.randint(0, 256, (2 * 8 * 7 + 1,))
    plain = stream_nll(model, data, batch_size=2, kv_cache=False)
    cached = stream_nll(model, data, batch_size=2, kv_cache=True)
    assert plain.shape == cached.shape == (2, 56)
    torch.testing.assert_close(cached, plain, rtol=1e-5, atol=1e-5)
    assert stream_nll(model, data, batch_size=2).equal(cached)  # inference caches by default


def test_kv_cache_state_holds_keys_and_grows_its_position_table():
    model = _trained_like(tiny(mem_len=12))
    x = torch.randint(0, 256, (3, 8))
    with torch.no_grad():
        _, mems = model(x)  # hidden states of one segment
        _, cache = model.step(x)  # eval + no grad: a KVCache
        assert isinstance(cache, KVCache) and cache.keys[0].shape == (3, 2, 8, 16)
        logits_h, mems = model(x, mems)
        logits_c, cache = model.step(x, cache)
        assert cache.keys[0].shape == (3, 2, 12, 16)  # the last mem_len keys
        assert cache.r_k[0].shape[1] == 16  # distances 15..0 for 8 + 8 keys
        torch.testing.assert_close(logits_c, logits_h, rtol=1e-5, atol=1e-5)
        # a longer memory at evaluation: the position table is rebuilt, and still agrees
        logits_h2, _ = model(x, mems, mem_len=40)
        logits_c2, cache2 = model.step(x, cache, mem_len=40)
        torch.testing.assert_close(logits_c2, logits_h2, rtol=1e-5, atol=1e-5)
        assert cache2.keys[0].shape[2] == 20 and cache2.r_k[0].shape[1] == 20
        # clamping changes the table: the cache must notice
        logits_h3, _ = model(x, mems, clamp_len=3)
        logits_c3, _ = model.step(x, cache, clamp_len=3)
        torch.testing.assert_close(logits_c3, logits_h3, rtol=1e-5, atol=1e-5)
        assert not torch.allclose(logits_c3, logits_c, atol=1e-3)
        # hidden-state memories from training are projected into keys on the way in
        logits_p, _ = model.step(x, mems, kv_cache=True)
        torch.testing.assert_close(logits_p, model(x, mems)[0], rtol=1e-5, atol=1e-5)


def test_kv_cache_refuses_training_and_a_mixed_state():
    model = _trained_like(tiny())
    x = torch.randint(0, 256, (2, 8))
    with torch.no_grad():
        _, cache = model.step(x)
    with pytest.raises(ValueError, match="cannot be turned back into hidden states"):
        model.step(x, cache, kv_cache=False)
    model.train()
    with pytest.raises(ValueError, match="call model.eval"):
        model.step(x, None, kv_cache=True)
    _, state = model.step(x)  # training with gradients: hidden states, as the paper
    assert isinstance(state, list)
    model.eval()
    bad = KVCache([k[:, :, :, :4] for k in cache.keys], cache.values)
    with torch.no_grad(), pytest.raises(ValueError, match="KVCache must hold"):
        model.step(x, bad)


def test_generation_with_the_cache_equals_rereading_through_hidden_states():
    model = _trained_like(tiny(mem_len=64))
    prompt = encode("The memory ")
    fast = generate(model, prompt, 30, temperature=1e-40)  # greedy, through the cache
    slow = prompt.clone()
    with torch.no_grad():
        for _ in range(30):  # the whole text again each time, hidden-state memory
            logits, _ = model(slow[None])  # no memory: the whole text is the segment
            slow = torch.cat([slow, logits[0, -1].argmax()[None]])
    assert fast.equal(slow)


def _impl_run(impl: str, tokens, mems, *, grad: bool, **kw):
    torch.manual_seed(0)
    model = TransformerXL(tiny(tgt_len=tokens.size(1), mem_len=mems[0].size(1),
                               attention_impl=impl, **kw))
    with torch.no_grad():
        for p in model.parameters():
            p.normal_(0, 0.3)
    with torch.set_grad_enabled(grad):
        logits, _ = model(tokens, mems)
    grads = None
    if grad:
        logits.square().mean().backward()
        grads = {n: p.grad for n, p in model.named_parameters()}
    return logits, grads


@pytest.mark.parametrize("pre_lnorm", [False, True])
@pytest.mark.parametrize("pos", ["relative", "absolute"])
@pytest.mark.parametrize("M", [0, 3, 13])
def test_sdpa_attention_equals_eager_values_and_gradients(pre_lnorm, pos, M):
    tokens = torch.randint(0, 256, (2, 7))
    mems = [torch.randn(2, M, 32) for _ in range(2)]
    eager, g_eager = _impl_run("eager", tokens, mems, grad=True, pre_lnorm=pre_lnorm, pos=pos)
    fused, g_fused = _impl_run("sdpa", tokens, mems, grad=True, pre_lnorm=pre_lnorm, pos=pos)
    torch.testing.assert_close(fused, eager, rtol=1e-4, atol=1e-4)
    assert g_eager.keys() == g_fused.keys()
    for name in g_eager:
        torch.testing.assert_close(g_fused[name], g_eager[name], rtol=1e-4, atol=1e-5,
                                   msg=lambda m: f"{name}: {m}")


@pytest.mark.filterwarnings("ignore::UserWarning")
@pytest.mark.parametrize("pos", ["relative", "absolute"])
@pytest.mark.parametrize("M", first_quick([13, 0]))
def test_flex_attention_equals_eager_values(pos, M):
    """FlexAttention has no backward on the CPU; its inputs are sdpa's, whose gradients are
    tested above."""
    tokens = torch.randint(0, 256, (2, 7))
    mems = [torch.randn(2, M, 32) for _ in range(2)]
    eager, _ = _impl_run("eager", tokens, mems, grad=False, pos=pos)
    flex, _ = _impl_run("flex", tokens, mems, grad=False, pos=pos)
    torch.testing.assert_close(flex, eager, rtol=1e-4, atol=1e-4)


def test_fused_attention_needs_the_position_terms_it_claims():
    """A wrong sign in the rotation, or the queries read from the wrong positions, must show."""
    torch.manual_seed(0)
    model = _trained_like(tiny(attention_impl="sdpa"))
    attn = model.layers[0].dec_attn
    B, H, Tq, Tk, D = 2, 2, 5, 9, 16
    q, k, v = torch.randn(B, H, Tq, D), torch.randn(B, H, Tk, D), torch.randn(B, H, Tk, D)
    R = relative_positions(torch.arange(Tk - 1, -1, -1), 32)
    mask = attention_mask("sdpa", Tq, Tk)
    fused = fused_rel_attention(q, k, v, R, attn, mask)
    r_k = attn.r_net(R).view(Tk, H, D).transpose(0, 1)
    scores = rel_scores(q, k, r_k, attn.r_w_bias, attn.r_r_bias) / math.sqrt(D)
    plain = scores.masked_fill(~causal_mask(Tq, Tk), float("-inf")).softmax(-1) @ v
    torch.testing.assert_close(fused, plain, rtol=1e-4, atol=1e-5)
    content_only = (q @ k.transpose(-2, -1) / math.sqrt(D)).masked_fill(
        ~causal_mask(Tq, Tk), float("-inf")).softmax(-1) @ v
    assert (fused - content_only).abs().max() > 1e-2


def test_fused_attention_refuses_what_it_cannot_do():
    with pytest.raises(ValueError, match="cannot cap distances"):
        tiny(attention_impl="sdpa", clamp_len=16)
    with pytest.raises(ValueError, match="no attention dropout"):
        tiny(attention_impl="flex", dropatt=0.1)
    with pytest.raises(ValueError, match="attention_impl='fast' is unknown"):
        tiny(attention_impl="fast")
    model = TransformerXL(tiny(attention_impl="sdpa"))
    with pytest.raises(ValueError, match="cannot cap distances"):
        model(torch.zeros(1, 4, dtype=torch.long), clamp_len=8)
    tiny(attention_impl="sdpa", dropatt=0.1)  # sdpa has attention dropout


@pytest.mark.slow
@pytest.mark.parametrize("impl", ["eager", "sdpa", "flex"])
def test_xl_compiles_to_one_graph_without_steady_state_recompiles(impl):
    import torch._dynamo as dynamo
    from torch._dynamo.utils import counters

    torch.manual_seed(0)
    model = TransformerXL(tiny(attention_impl=impl))
    x = torch.randint(0, 256, (2, 8))
    with torch.set_grad_enabled(impl != "flex"):  # flex: no CPU backward
        _, state = model.step(x, None)
        dynamo.reset()
        explained = dynamo.explain(lambda x, s: model.step(x, s))(x, state)
        assert (explained.graph_count, explained.graph_break_count) == (1, 0), [
            str(b.reason) for b in explained.break_reasons]
        dynamo.reset()
        counters.clear()
        step = torch.compile(lambda x, s: model.step(x, s), backend="eager")
        state = None
        for _ in range(3):  # memory 0, then full: the compiles happen here
            _, state = step(x, state)
        warm = counters["stats"]["unique_graphs"]
        for _ in range(4):
            _, state = step(x, state)
        assert counters["stats"]["unique_graphs"] == warm
        dynamo.reset()


def test_xl_training_compiles_once_after_its_first_segment():
    """As `minixl train --compile` runs it (model.compile(), step after step with a backward):
    the first segment has no memory and compiles once; every later segment, the memory full,
    shares one graph. A memory whose strides changed from step 2 to step 3 (a slice of
    [mem; h]) would compile a third time, a full recompile of a large model on a GPU."""
    import torch._dynamo as dynamo
    from torch._dynamo.testing import CompileCounter

    dynamo.reset()
    try:
        torch.manual_seed(0)
        model = TransformerXL(tiny(tgt_len=8, mem_len=8))
        counter = CompileCounter()
        model.compile(backend=counter)
        state, frames = None, []
        for seed in range(6):
            x = torch.randint(0, 256, (2, 8), generator=torch.Generator().manual_seed(seed))
            logits, state = model.step(x, state)
            logits.float().logsumexp(-1).mean().backward()
            frames.append(counter.frame_count)
            assert all(m.is_contiguous() and m.shape == (2, 8, 32) for m in state)
        assert frames == [1, 2, 2, 2, 2, 2], frames
    finally:
        dynamo.reset()
