"""Chapter 5: XLNet: permutation masks, the two-directional shift, two-stream attention, the
query stream's blindness to its own token, memory under permutation, equivalence with the
Hugging Face reference, training masks and the infilling readings."""

import dataclasses
import math

import pytest
import torch
import torch.nn.functional as F

from conftest import TINY_CONFIGS
from minixl.char_transformer import causal_mask
from minixl.xlnet import (CLS, FACTORISATIONS, INFILL_READINGS, SEP, FeedForward,
                          PermutationObjective, TwoStreamAttention, XLNet, XLNetConfig,
                          XLNetOutput, bidirectional_distances, evaluate_infill, masked_softmax,
                          masks_from_hf, masks_from_ranks, masks_to_hf, order_ranks,
                          permutation_masks, rel_gather, rel_shift_bi, sinusoid, span_bits,
                          target_positions, training_masks, two_stream_loop)


def tiny(**kw) -> XLNetConfig:
    base = dict(n_layer=2, d_model=32, n_head=2, d_inner=64, seq_len=16, n_predict=4)
    return XLNetConfig(**{**base, **kw})


def tiny_model(seed: int = 0, **kw) -> XLNet:
    torch.manual_seed(seed)
    return XLNet(tiny(**kw)).eval()


def ref_ranks(order: list[int], n_predict: int | None = None) -> list[int]:
    """The definition, one position at a time: the t-th position of the order has rank
    t - (T - n) + 1 if it is predicted, 0 if it is among the first T - n (the context)."""
    T = len(order)
    n = T if n_predict is None else n_predict
    rank = [0] * T
    for t, pos in enumerate(order):
        rank[pos] = 0 if t < T - n else t - (T - n) + 1
    return rank


def ref_masks(rank: list[int]) -> tuple[torch.Tensor, torch.Tensor]:
    T = len(rank)
    content = torch.tensor([[rank[j] <= rank[i] for j in range(T)] for i in range(T)])
    query = torch.tensor([[rank[j] < rank[i] for j in range(T)] for i in range(T)])
    return content.view(T, T), query.view(T, T)


def random_orders(B: int, T: int, g: torch.Generator) -> torch.Tensor:
    return torch.stack([torch.randperm(T, generator=g) for _ in range(B)])


def embedding_leaf(model: XLNet):
    """Hook the word embedding's output into a leaf that requires grad: (handle, box), the
    leaf is box['x'] [B, T, C] after a forward pass."""
    box = {}

    def make_leaf(module, args, out):
        box["x"] = out.detach().requires_grad_(True)
        return box["x"]

    return model.word_embedding.register_forward_hook(make_leaf), box


def grad_rows(out: torch.Tensor, leaf: torch.Tensor, probe: torch.Tensor) -> torch.Tensor:
    """[T]: the largest |gradient| of the projection out . probe (out [C] or [V]) with respect to
    each position's embedding (batch row 0)."""
    (grad,) = torch.autograd.grad((out * probe).sum(), leaf, retain_graph=True)
    return grad[0].abs().amax(-1)


# ---- 1. masks against ranks

def test_masks_equal_the_rank_definition_for_many_orders():
    """If order_ranks numbered the order the wrong way (rank of step instead of step of
    position), gave context positions distinct ranks, or the masks used < and <= the other way
    round, some of these 200 orders would disagree with the loop definition."""
    g = torch.Generator().manual_seed(0)
    for trial in range(200):
        T = 1 + trial % 9
        order = torch.randperm(T, generator=g)
        n_predict = None if trial % 2 == 0 else int(torch.randint(0, T + 1, (1,), generator=g))
        rank = ref_ranks(order.tolist(), n_predict)
        assert order_ranks(order, n_predict).tolist() == rank, (order, n_predict)
        content, query = permutation_masks(order, n_predict=n_predict)
        want_c, want_q = ref_masks(rank)
        assert torch.equal(content, want_c), (order, n_predict)
        assert torch.equal(query, want_q), (order, n_predict)
        assert content.diagonal().all() and not query.diagonal().any()
        assert content.dtype == query.dtype == torch.bool


def test_identity_order_gives_the_causal_mask():
    """Left to right is one of the orders: its content mask must be the causal mask and its
    query mask the causal mask without the diagonal (predict token i from tokens < i)."""
    for T in range(1, 10):
        content, query = permutation_masks(torch.arange(T))
        assert torch.equal(content, causal_mask(T, T))
        assert torch.equal(query, causal_mask(T, T) & ~torch.eye(T, dtype=torch.bool))


@pytest.mark.parametrize("n_predict", [None, 0, 3, 7])
def test_batched_orders_equal_each_row(n_predict):
    """Orders [B, T] must be ranked row by row (a scatter along the wrong dim would mix rows)."""
    g = torch.Generator().manual_seed(1)
    orders = random_orders(5, 7, g)
    content, query = permutation_masks(orders, n_predict=n_predict)
    ranks = order_ranks(orders, n_predict)
    assert content.shape == query.shape == (5, 7, 7)
    for b in range(5):
        assert ranks[b].tolist() == ref_ranks(orders[b].tolist(), n_predict)
        c, q = permutation_masks(orders[b], n_predict=n_predict)
        assert torch.equal(content[b], c) and torch.equal(query[b], q)
    # one order broadcast over a batch: masks_from_ranks on [1, T] keeps the leading dim
    c1, q1 = masks_from_ranks(ranks[:1])
    assert torch.equal(c1[0], content[0]) and torch.equal(q1[0], query[0])


def test_int32_orders_are_ranked_like_int64():
    """order_ranks accepts int32 orders (its type check lets them through), so they must be
    ranked like int64 ones instead of failing inside the scatter."""
    order = torch.tensor([[2, 0, 3, 1], [1, 3, 0, 2]])
    try:
        got = order_ranks(order.int(), 2)
    except RuntimeError as err:
        pytest.fail(f"BUG in minixl/xlnet.py order_ranks: a valid int32 order "
                    f"{order.int().tolist()} raises {err!r} (torch.empty_like(order) is int32, "
                    f"the arange scattered into it is int64)")
    assert torch.equal(got.long(), order_ranks(order, 2))


def test_bad_orders_give_clear_errors():
    """A repeated or out-of-range position, a float order, or n_predict outside 0..T must be
    refused with a message that names the problem, not give silently wrong masks."""
    for bad in ([0, 0, 2], [1, 2, 3], [[0, 1, 2], [0, 2, 2]]):
        with pytest.raises(ValueError, match="permutation"):
            permutation_masks(torch.tensor(bad))
    with pytest.raises(TypeError, match="integer"):
        permutation_masks(torch.tensor([0.0, 1.0, 2.0]))
    with pytest.raises(TypeError, match="integer"):
        order_ranks(torch.tensor([True, False]))
    for n in (-1, 4):
        with pytest.raises(ValueError, match="n_predict"):
            permutation_masks(torch.tensor([2, 0, 1]), n_predict=n)


# ---- 2. the two-directional shift

def naive_shift_bi(x: torch.Tensor, klen: int) -> torch.Tensor:
    """The definition by indexing: out[..., i, j] = x[..., i, klen - 1 - d] for the distance
    d = (klen - Tq + i) - j of query i to key j."""
    qlen = x.size(-2)
    out = torch.empty(*x.shape[:-1], klen, dtype=x.dtype)
    for i in range(qlen):
        for j in range(klen):
            d = (klen - qlen + i) - j
            out[..., i, j] = x[..., i, klen - 1 - d]
    return out


SHIFT_SHAPES = [(1, 1), (3, 3), (6, 6), (1, 5), (2, 5), (3, 9), (5, 6), (4, 12)]


@pytest.mark.parametrize("qlen,klen", SHIFT_SHAPES)
def test_rel_shift_bi_matches_the_definition_everywhere(qlen, klen):
    """Every entry of the bidirectional shift is a real score (no junk triangle): an off-by-one
    in the pad-and-view, or keeping the wrong klen columns, changes some entry."""
    x = torch.randn(2, 3, qlen, klen + qlen - 1, generator=torch.Generator().manual_seed(klen))
    assert torch.equal(rel_shift_bi(x, klen), naive_shift_bi(x, klen))


def test_rel_shift_bi_rejects_a_wrong_width():
    with pytest.raises(ValueError, match="klen \\+ qlen - 1"):
        rel_shift_bi(torch.zeros(2, 3, 4, 8), 4)  # needs width 7
    with pytest.raises(ValueError, match="klen \\+ qlen - 1"):
        rel_shift_bi(torch.zeros(3, 5), 4)  # needs width 6


@pytest.mark.parametrize("qlen,klen", [(3, 3), (4, 9), (6, 6), (5, 7)])
def test_rel_gather_equals_the_shift_at_any_positions(qlen, klen):
    """The query stream's gather for targets at positions q_pos must pick the same scores as
    the shift gives those rows; with all positions in order it is the shift itself."""
    g = torch.Generator().manual_seed(qlen * klen)
    B, H = 3, 2
    x = torch.randn(B, H, qlen, klen + qlen - 1, generator=g)
    shifted = rel_shift_bi(x, klen)
    assert torch.equal(rel_gather(x, klen, torch.arange(qlen).expand(B, qlen)), shifted)
    P = max(1, qlen - 2)
    q_pos = torch.stack([torch.randperm(qlen, generator=g)[:P] for _ in range(B)])  # [B, P]
    rows = torch.stack([x[b][:, q_pos[b]] for b in range(B)])  # [B, H, P, klen + qlen - 1]
    want = torch.stack([shifted[b][:, q_pos[b]] for b in range(B)])
    assert torch.equal(rel_gather(rows, klen, q_pos), want)


def test_distances_and_sinusoid_cover_both_directions():
    """Keys after the query have negative distances; their encoding is sin odd / cos even, so
    a sinusoid that took |distance| would confuse before with after."""
    assert bidirectional_distances(3, 5).tolist() == [4, 3, 2, 1, 0, -1, -2]
    d = torch.arange(1, 6)
    pos, neg = sinusoid(d, 8), sinusoid(-d, 8)
    assert pos.shape == (5, 8)
    torch.testing.assert_close(neg[:, :4], -pos[:, :4])
    torch.testing.assert_close(neg[:, 4:], pos[:, 4:])
    assert (neg - pos).abs().max() > 0.1


# ---- 3. two-stream attention against the plain loop

def random_attention(C: int = 16, H: int = 2, seed: int = 0) -> TwoStreamAttention:
    torch.manual_seed(seed)
    attn = TwoStreamAttention(C, H).eval()
    with torch.no_grad():  # biases and norm well away from their initial values
        for p in (attn.r_w_bias, attn.r_r_bias, attn.layer_norm.weight, attn.layer_norm.bias):
            p.add_(0.5 * torch.randn_like(p))
    return attn


@pytest.mark.parametrize("M", [0, 3])
@pytest.mark.parametrize("n_predict", [None, 3])
def test_two_stream_attention_equals_the_plain_loop(M, n_predict):
    """The batched layer (shifted position scores, masked softmax, memory in front) must give
    what the loop gives scoring each query against each visible key by its distance; a wrong
    shift, a mask off by the memory, or the query stream using its own keys would differ."""
    B, T, C = 2, 6, 16
    attn = random_attention(C)
    g = torch.Generator().manual_seed(M)
    h, q = torch.randn(2, B, T, C, generator=g)
    mems = torch.randn(B, M, C, generator=g) if M else None
    content, query = permutation_masks(random_orders(B, T, g), n_predict=n_predict)
    seen = torch.ones(B, T, M, dtype=torch.bool)
    pos_emb = sinusoid(bidirectional_distances(T, M + T), C)
    with torch.no_grad():
        want_h, want_g = two_stream_loop(attn, h, q, content, query, mems=mems)
        got_h, got_g = attn(h, q, pos_emb, torch.cat([seen, content], -1),
                            torch.cat([seen, query], -1), g_pos=torch.arange(T).expand(B, T),
                            mems=mems)
    torch.testing.assert_close(got_h, want_h, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(got_g, want_g, atol=1e-5, rtol=1e-5)
    # the two streams really are different computations here
    assert (got_h - got_g).abs().max() > 1e-2


def test_query_stream_on_a_subset_of_targets_equals_those_rows():
    """g for P targets at positions g_pos must equal the rows g_pos of the all-targets run
    (distances and masks looked up at the target's position, not at its index in g)."""
    B, T, C, M = 2, 7, 16, 2
    attn = random_attention(C, seed=1)
    gen = torch.Generator().manual_seed(2)
    h, q = torch.randn(2, B, T, C, generator=gen)
    mems = torch.randn(B, M, C, generator=gen)
    content, query = permutation_masks(random_orders(B, T, gen), n_predict=4)
    seen = torch.ones(B, T, M, dtype=torch.bool)
    cm, qm = torch.cat([seen, content], -1), torch.cat([seen, query], -1)
    pos_emb = sinusoid(bidirectional_distances(T, M + T), C)
    g_pos = torch.tensor([[5, 0, 3], [2, 6, 1]])
    with torch.no_grad():
        _, all_g = attn(h, q, pos_emb, cm, qm, g_pos=torch.arange(T).expand(B, T), mems=mems)
        sub_q = q.gather(1, g_pos[..., None].expand(-1, -1, C))
        sub_qm = qm.gather(1, g_pos[..., None].expand(-1, -1, M + T))
        _, sub_g = attn(h, sub_q, pos_emb, cm, sub_qm, g_pos=g_pos, mems=mems)
    torch.testing.assert_close(sub_g, all_g.gather(1, g_pos[..., None].expand(-1, -1, C)))


# ---- 4. the query stream never sees its own token

@pytest.mark.parametrize("n_predict", [None, 3])
def test_query_stream_sees_only_earlier_ranks(n_predict):
    """The heart of the two streams: the logits for a target must have exactly zero gradient
    with respect to its own token and every token of equal or later rank, and a nonzero one
    for every earlier-ranked token. A query stream that read h instead of g, a content mask
    used for the query stream, or a content stream that saw later ranks (leaking them into the
    next layer) would give a nonzero gradient where it must be zero."""
    T = 7
    model = tiny_model(n_layer=3)
    gen = torch.Generator().manual_seed(3)
    tokens = torch.randint(0, 256, (1, T), generator=gen)
    probe_v = torch.randn(model.config.vocab_size, generator=gen)
    probe_c = torch.randn(model.config.d_model, generator=gen)
    for _ in range(3):
        order = torch.randperm(T, generator=gen)
        rank = order_ranks(order, n_predict)
        targets = order[T - (T if n_predict is None else n_predict):]
        handle, box = embedding_leaf(model)
        try:
            out = model(tokens, masks=permutation_masks(order, n_predict=n_predict),
                        target_mapping=targets[None])
        finally:
            handle.remove()
        for p, i in enumerate(targets.tolist()):
            dep = grad_rows(out.logits[0, p], box["x"], probe_v)
            later = rank >= rank[i]
            assert dep[i] == 0, f"target {i} (order {order.tolist()}) sees its own token"
            assert torch.all(dep[later] == 0), (order.tolist(), i, dep)
            assert torch.all(dep[~later] > 0), (order.tolist(), i, dep)
        for i in range(T):  # the content stream sees its own token and no later rank
            dep = grad_rows(out.content[0, i], box["x"], probe_c)
            assert dep[i] > 0
            assert torch.all(dep[rank > rank[i]] == 0) and torch.all(dep[rank <= rank[i]] > 0)


def test_masked_softmax_row_with_nothing_to_see_is_zero():
    """A query with no visible key (the first of a full permutation, no memory) must get all-zero
    weights: not NaN (softmax over -inf) and not uniform weights over keys it must not see;
    the backward pass through it must stay finite too."""
    g = torch.Generator().manual_seed(4)
    scores = torch.randn(2, 3, 5, generator=g, requires_grad=True)
    mask = torch.rand(2, 3, 5, generator=g) > 0.4
    mask[0, 1] = False
    mask[1, 2] = False
    mask[1, 0] = True
    w = masked_softmax(scores, mask)
    assert torch.equal(w[0, 1], torch.zeros(5)) and torch.equal(w[1, 2], torch.zeros(5))
    assert torch.all(w[~mask] == 0)
    want = torch.softmax(scores.detach()[1, 0], -1)
    torch.testing.assert_close(w[1, 0], want)
    visible = mask.any(-1)
    torch.testing.assert_close(w.sum(-1)[visible], torch.ones(int(visible.sum())))
    (w * torch.randn(2, 3, 5, generator=g)).sum().backward()
    assert torch.isfinite(scores.grad).all()
    assert torch.equal(scores.grad[0, 1], torch.zeros(5))


# ---- 5. the identity order is a causal model

@pytest.mark.slow
def test_identity_order_content_stream_is_causal():
    """With the default (identity) order the content stream at i depends on tokens <= i only,
    and on token i itself; the query stream at i on tokens < i only."""
    model = tiny_model()
    T = 9
    gen = torch.Generator().manual_seed(5)
    x = torch.randint(0, 256, (2, T), generator=gen)
    with torch.no_grad():
        base = model(x)
        for i in range(T):
            after = x.clone()
            after[:, i + 1:] = torch.randint(0, 256, (2, T - i - 1), generator=gen)
            out = model(after)
            torch.testing.assert_close(out.content[:, :i + 1], base.content[:, :i + 1],
                                       atol=1e-6, rtol=0)
            torch.testing.assert_close(out.logits[:, :i + 1], base.logits[:, :i + 1],
                                       atol=1e-6, rtol=0)
            own = x.clone()
            own[:, i] = (own[:, i] + 1) % 256
            out = model(own)
            assert (out.content[:, i] - base.content[:, i]).abs().max() > 1e-3
            torch.testing.assert_close(out.logits[:, i], base.logits[:, i], atol=1e-6, rtol=0)
            if i + 1 < T:
                assert (out.logits[:, i + 1] - base.logits[:, i + 1]).abs().max() > 1e-4


@pytest.mark.slow
def test_step_is_left_to_right_without_leakage():
    """step's logits[:, i] predict byte i + 1: they may read bytes 0..i (and do read byte i),
    never a later one; the extra slot after the last byte must not be seen either."""
    model = tiny_model()
    T = 8
    gen = torch.Generator().manual_seed(6)
    x = torch.randint(0, 256, (2, T), generator=gen)
    with torch.no_grad():
        logits, state = model.step(x)
        assert logits.shape == (2, T, 256)  # over the bytes: SEP and CLS are never next
        assert torch.equal(state, x[:, -(model.config.seq_len - 1):])  # the bytes read
        for i in range(T):
            after = x.clone()
            after[:, i + 1:] = torch.randint(0, 256, (2, T - i - 1), generator=gen)
            torch.testing.assert_close(model.step(after)[0][:, :i + 1], logits[:, :i + 1],
                                       atol=1e-6, rtol=0)
            own = x.clone()
            own[:, i] = (own[:, i] + 1) % 256
            assert (model.step(own)[0][:, i] - logits[:, i]).abs().max() > 1e-4


def test_step_without_memory_carries_the_bytes_read():
    """With mem_len=0 the state is the last seq_len - 1 bytes: stepping a prompt and then one
    byte at a time gives what one pass over the whole text gives (while it fits in seq_len),
    so sampling from a model without memory does not forget its prompt."""
    model = tiny_model()
    x = torch.randint(0, 256, (2, 10), generator=torch.Generator().manual_seed(8))
    with torch.no_grad():
        whole = model.step(x)[0]
        logits, state = model.step(x[:, :6])
        pieces = [logits]
        for i in range(6, 10):
            logits, state = model.step(x[:, i:i + 1], state)
            pieces.append(logits)
    torch.testing.assert_close(torch.cat(pieces, dim=1), whole, atol=1e-5, rtol=0)


def test_step_with_memory_equals_one_pass():
    """With mem_len >= the chunk length, stepping two chunks with the state equals stepping
    their concatenation: the cache must hold the real bytes (not the extra slot) of each layer."""
    T = 6
    model = tiny_model(mem_len=T)
    x = torch.randint(0, 256, (2, 2 * T), generator=torch.Generator().manual_seed(7))
    with torch.no_grad():
        first, state = model.step(x[:, :T])
        assert len(state) == 2 and state[0].shape == (2, T, 32)
        second, _ = model.step(x[:, T:], state)
        whole = tiny_model(mem_len=2 * T).step(x)[0]
    torch.testing.assert_close(torch.cat([first, second], 1), whole, atol=1e-5, rtol=1e-5)


# ---- 6. memory under permutation

@pytest.mark.parametrize("n_predict_b", [None, 3])
def test_two_segments_with_memory_equal_one_pass_under_permutation(n_predict_b):
    """Segment 2 with order B and the cached content of segment 1 (read with order A) must equal
    one pass over both segments whose masks let segment 2 see all of segment 1 and follow B
    among itself, while segment 1 follows A and never sees segment 2. This holds for two
    different A: segment 2 needs only the cache, not A. A cache taken at the wrong layer,
    memory positions at the wrong distances, or memory hidden from the query stream break it."""
    T, B = 6, 2
    model = tiny_model(mem_len=T, seq_len=T, n_predict=3)
    gen = torch.Generator().manual_seed(8)
    x = torch.randint(0, 256, (B, 2 * T), generator=gen)
    order_b = random_orders(B, T, gen)
    rank_b = order_ranks(order_b, n_predict_b)
    targets = order_b[:, T - (T if n_predict_b is None else n_predict_b):]
    seconds = []
    for _ in range(2):
        rank_a = order_ranks(random_orders(B, T, gen))
        rank = torch.cat([rank_a, rank_b + T + 1], -1)  # segment 2 after all of segment 1
        with torch.no_grad():
            one = model(x[:, :T], masks=masks_from_ranks(rank_a))
            assert [m.shape for m in one.mems] == [(B, T, 32)] * 2
            two = model(x[:, T:], masks=masks_from_ranks(rank_b), mems=one.mems,
                        target_mapping=targets)
            full = model(x, masks=masks_from_ranks(rank), target_mapping=targets + T)
        torch.testing.assert_close(two.logits, full.logits, atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(two.content, full.content[:, T:], atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(one.content, full.content[:, :T], atol=1e-5, rtol=1e-5)
        seconds.append(two.logits)
    # segment 1's order changes its content stream, hence the cache, hence segment 2
    assert (seconds[0] - seconds[1]).abs().max() > 1e-4


def test_short_memory_differs_from_one_pass():
    """The test above must be able to fail: with mem_len < T part of segment 1 is dropped from
    the cache and segment 2 no longer equals the one pass."""
    T = 6
    model = tiny_model(mem_len=T - 2, seq_len=T, n_predict=3)
    x = torch.randint(0, 256, (1, 2 * T), generator=torch.Generator().manual_seed(9))
    with torch.no_grad():
        one = model(x[:, :T])
        assert one.mems[0].shape == (1, T - 2, 32)
        two = model(x[:, T:], mems=one.mems)
        full = model(x)
    assert (two.logits - full.logits[:, T:]).abs().max() > 1e-4


@pytest.mark.parametrize("wrong", ["reversed", "another text"])
def test_a_wrong_memory_differs_from_one_pass(wrong):
    """Chapter 5.6's negative control: the right cache in the wrong order, or the cache of
    another text, must not pass the memory check against one pass over both segments."""
    T = 6
    model = tiny_model(mem_len=T, seq_len=T, n_predict=3)
    gen = torch.Generator().manual_seed(9)
    x, other = torch.randint(0, 256, (1, 2 * T), generator=gen), torch.randint(0, 256, (1, T),
                                                                            generator=gen)
    with torch.no_grad():
        mems = model(x[:, :T]).mems if wrong == "reversed" else model(other).mems
        if wrong == "reversed":
            mems = [m.flip(1) for m in mems]
        two = model(x[:, T:], mems=mems)
        full = model(x)
    assert (two.logits - full.logits[:, T:]).abs().max() > 1e-3


def test_reuse_len_caches_only_the_first_positions():
    """The new memory holds [old memory; h[:, :reuse_len]] cut to the last mem_len, detached:
    the cached states are the inputs of each layer (the embeddings for layer 0)."""
    model = tiny_model(mem_len=5)
    x = torch.randint(0, 256, (2, 6), generator=torch.Generator().manual_seed(10))
    out = model(x, reuse_len=4)
    emb = model.word_embedding(x)
    assert len(out.mems) == 2 and not out.mems[0].requires_grad
    torch.testing.assert_close(out.mems[0], emb[:, :4])
    out2 = model(x, mems=out.mems, reuse_len=3)
    torch.testing.assert_close(out2.mems[0], torch.cat([emb[:, 2:4], emb[:, :3]], 1))
    assert torch.equal(out2.mems[1][:, :2], out.mems[1][:, 2:])


# ---- 7. equivalence with the Hugging Face reference

HF_CONFIGS = {
    "small": dict(vocab_size=40, d_model=16, n_layer=2, n_head=2, d_inner=32, mem_len=6,
                  clamp_len=-1),
    "clamped": dict(vocab_size=300, d_model=32, n_layer=3, n_head=4, d_inner=48, mem_len=8,
                    clamp_len=3),
    "eps": dict(vocab_size=64, d_model=24, n_layer=2, n_head=3, d_inner=40, mem_len=5,
                clamp_len=-1, layer_norm_eps=1e-2),
}


def hf_xlnet(kw: dict, seed: int = 0):
    """A random XLNetLMHeadModel, built offline, its weights moved well away from their init."""
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(seed)
    cfg = transformers.XLNetConfig(**kw, d_head=kw["d_model"] // kw["n_head"], dropout=0.0)
    model = transformers.XLNetLMHeadModel(cfg).eval()
    with torch.no_grad():
        for p in model.parameters():  # the tied embedding / output once
            p.add_(0.3 * torch.randn_like(p))
    return model


def one_hot_targets(targets: torch.Tensor, T: int) -> torch.Tensor:
    return F.one_hot(targets, T).float()  # [B, P, T]


def hf_and_ours(hf, ours, tokens, masks, targets, segments, hf_mems, our_mems):
    T = tokens.size(1)
    tm = one_hot_targets(targets, T)
    with torch.no_grad():
        h = hf(input_ids=tokens, perm_mask=masks_to_hf(masks[0]), target_mapping=tm,
               token_type_ids=segments, mems=hf_mems, use_mems=True)
        o = ours(tokens, masks=masks, target_mapping=tm, segments=segments, mems=our_mems)
    return h, o


@pytest.mark.slow
@pytest.mark.parametrize("name", list(HF_CONFIGS))
def test_logits_and_mems_equal_hugging_face(name):
    """Same weights, same inputs -> same logits and memory as transformers' XLNetLMHeadModel:
    partial prediction with segments and no memory, then a full permutation with the memory
    of the first call and other segment ids. Loaded from the model and from its state_dict
    (sizes read from the weights, other settings given). Any misplaced weight (q/k/v/r/o
    reshapes, the three biases, seg_embed's same/different order, the two norms), a wrong
    distance direction or clamp, or a wrong cache breaks the equality."""
    kw = HF_CONFIGS[name]
    hf = hf_xlnet(kw)
    extra = dict(mem_len=kw["mem_len"], clamp_len=max(0, kw["clamp_len"]),
                 layer_norm_eps=kw.get("layer_norm_eps", 1e-12))
    models = [XLNet.from_hf(hf), XLNet.from_hf(hf.state_dict(), **extra)]
    assert models[0].config == models[1].config
    assert models[0].config.layer_norm_eps == extra["layer_norm_eps"]
    B, T, V = 2, 8, kw["vocab_size"]
    gen = torch.Generator().manual_seed(11)
    x1, x2 = torch.randint(0, min(V, 256), (2, B, T), generator=gen)
    seg1 = torch.tensor([0, 0, 0, 0, 1, 1, 1, 2]).expand(B, T)  # [A, SEP, B, SEP, CLS]
    seg2 = torch.tensor([[0, 0, 1, 1, 1, 1, 1, 1], [1, 1, 1, 0, 0, 0, 0, 2]])
    if V > CLS:
        x1[:, 3] = x1[:, 6] = SEP
        x1[:, 7] = CLS
    order1, order2 = random_orders(B, T, gen), random_orders(B, T, gen)
    masks1 = permutation_masks(order1, n_predict=5)  # every target sees the 3 context tokens
    masks2 = permutation_masks(order2)  # every target sees the memory at least
    targets1 = order1[:, T - 5:]
    targets2 = torch.stack([torch.randperm(T, generator=gen)[:6] for _ in range(B)])
    for ours in models:
        h1, o1 = hf_and_ours(hf, ours, x1, masks1, targets1, seg1, None, None)
        torch.testing.assert_close(o1.logits, h1.logits, atol=1e-5, rtol=1e-5)
        assert len(o1.mems) == len(h1.mems) == kw["n_layer"]
        for ours_m, hf_m in zip(o1.mems, h1.mems):
            assert ours_m.shape == (B, min(T, kw["mem_len"]), kw["d_model"])
            torch.testing.assert_close(ours_m, hf_m.transpose(0, 1), atol=1e-5, rtol=1e-5)
        h2, o2 = hf_and_ours(hf, ours, x2, masks2, targets2, seg2, h1.mems, o1.mems)
        torch.testing.assert_close(o2.logits, h2.logits, atol=1e-5, rtol=1e-5)
        for ours_m, hf_m in zip(o2.mems, h2.mems):
            torch.testing.assert_close(ours_m, hf_m.transpose(0, 1), atol=1e-5, rtol=1e-5)
    # the settings that are not in the weights matter: without them the state_dict load differs
    if kw["clamp_len"] > 0 or "layer_norm_eps" in kw:
        plain = XLNet.from_hf(hf.state_dict(), mem_len=kw["mem_len"])
        _, o1 = hf_and_ours(hf, plain, x1, masks1, targets1, seg1, None, None)
        _, o2 = hf_and_ours(hf, plain, x2, masks2, targets2, seg2, h1.mems, o1.mems)
        assert (o2.logits - h2.logits).abs().max() > 1e-4


def test_query_with_nothing_to_see_differs_from_hugging_face():
    """A documented difference: with n_predict == T and no memory the first position of the
    order has nothing to attend to. Our prediction there reads no token at all (zero weights),
    while the reference's -1e30 mask gives it uniform weights over every key, its own token
    included. Everywhere else the two agree."""
    kw = HF_CONFIGS["small"]
    hf = hf_xlnet(kw)
    ours = XLNet.from_hf(hf)
    B, T = 1, 6
    gen = torch.Generator().manual_seed(12)
    x = torch.randint(0, kw["vocab_size"], (B, T), generator=gen)
    y = (x + 1 + torch.randint(0, kw["vocab_size"] - 1, (B, T), generator=gen)) % kw["vocab_size"]
    order = random_orders(B, T, gen)
    masks = permutation_masks(order)
    first = order[:, :1]
    rest = order[:, 1:]
    h_x, o_x = hf_and_ours(hf, ours, x, masks, first, None, None, None)
    h_y, o_y = hf_and_ours(hf, ours, y, masks, first, None, None, None)
    assert torch.equal(o_x.logits, o_y.logits)  # ours: a constant
    assert (h_x.logits - h_y.logits).abs().max() > 1e-3  # the reference reads the tokens
    handle, box = embedding_leaf(ours)
    try:
        out = ours(x, masks=masks, target_mapping=first)
    finally:
        handle.remove()
    (grad,) = torch.autograd.grad(out.logits.sum(), box["x"])
    assert torch.equal(grad, torch.zeros_like(grad))
    h_r, o_r = hf_and_ours(hf, ours, x, masks, rest, None, None, None)
    torch.testing.assert_close(o_r.logits, h_r.logits, atol=1e-5, rtol=1e-5)


def test_masks_round_trip_through_the_reference_form():
    """masks_to_hf / masks_from_hf must be inverse (1 = may NOT attend there, True = may attend
    here): exactly for full permutations, and on the predicted rows with partial prediction
    (context rows of the query stream are never used)."""
    gen = torch.Generator().manual_seed(13)
    for T in (1, 2, 5, 9):
        orders = random_orders(3, T, gen)
        content, query = permutation_masks(orders)
        perm = masks_to_hf(content)
        assert perm.dtype.is_floating_point and set(perm.unique().tolist()) <= {0.0, 1.0}
        assert torch.equal(perm, (~query).float())
        c, q = masks_from_hf(perm)
        assert torch.equal(c, content) and torch.equal(q, query)
        n = max(1, T // 2)
        content, query = permutation_masks(orders, n_predict=n)
        c, q = masks_from_hf(masks_to_hf(content))
        assert torch.equal(c, content)
        predicted = order_ranks(orders, n) > 0
        assert torch.equal(q[predicted], query[predicted])


@pytest.mark.parametrize("key", ["transformer.word_embedding.weight",
                                 "transformer.layer.0.rel_attn.q", "lm_loss.bias",
                                 "transformer.mask_emb",
                                 "transformer.layer.1.ff.layer_norm.bias",
                                 "transformer.layer.0.rel_attn.r_s_bias"])
def test_from_hf_with_a_missing_key_is_a_value_error(key):
    """A state_dict that lacks any weight XLNet needs must be refused with a ValueError naming
    the key, not a bare KeyError from deep inside the renaming."""
    state = dict(hf_xlnet(HF_CONFIGS["small"]).state_dict())
    del state[key]
    try:
        XLNet.from_hf(state)
    except ValueError as err:
        assert "missing" in str(err) and key in str(err)
    except KeyError as err:
        pytest.fail(f"BUG in minixl/xlnet.py from_hf: a state_dict without {key!r} raises a "
                    f"bare KeyError {err} (only the keys read inside _from_hf's try block are "
                    f"turned into ValueError; hf_state_dict's look-ups are not)")
    else:
        pytest.fail(f"from_hf accepted a state_dict without {key!r}")


def test_from_hf_refuses_an_untied_output_layer():
    """XLNet ties the output layer to the embedding; a different lm_loss.weight would be
    silently dropped, so it must be refused."""
    state = dict(hf_xlnet(HF_CONFIGS["small"]).state_dict())
    state["lm_loss.weight"] = state["lm_loss.weight"] + 0.01
    with pytest.raises(ValueError, match="tied"):
        XLNet.from_hf(state)


# ---- 8. training masks and the objective

def test_training_masks_independent_targets_see_the_context_only():
    """BERT's reading: each target's query sees every context position and no target (itself
    and the other targets included): a target seeing another would make it a joint model."""
    B, T, n = 4, 12, 5
    torch.manual_seed(14)
    (content, query), targets = training_masks(B, T, n, factorisation="independent")
    assert targets.shape == (B, n) and query.shape == content.shape == (B, T, T)
    for b in range(B):
        is_target = torch.zeros(T, dtype=torch.bool)
        is_target[targets[b]] = True
        assert int(is_target.sum()) == n
        for i in targets[b].tolist():
            assert torch.equal(query[b, i], ~is_target), (b, i)
        for i in (~is_target).nonzero().flatten().tolist():  # context reads the context only
            assert torch.equal(content[b, i], ~is_target)


def test_training_masks_permutation_predicts_the_last_of_an_order():
    """XLNet's reading: the masks come from one order per row whose last n_predict positions are
    the targets, returned in their order (ranks 1..n); rows get different orders."""
    B, T, n = 6, 12, 4
    torch.manual_seed(15)
    (content, query), targets = training_masks(B, T, n, factorisation="permutation")
    assert targets.shape == (B, n)
    rank = content.sum(-1) - (T - n)  # context rows see the T - n context positions: rank 0
    assert torch.all(rank >= 0)
    c, q = masks_from_ranks(rank)
    assert torch.equal(c, content) and torch.equal(q, query)
    assert torch.equal(rank.gather(1, targets), torch.arange(1, n + 1).expand(B, n))
    assert int((rank == 0).sum()) == B * (T - n)
    assert len({tuple(r) for r in rank.tolist()}) > 1


def test_training_masks_causal_is_left_to_right():
    (content, query), targets = training_masks(3, 7, 2, factorisation="causal")
    assert torch.equal(content, causal_mask(7, 7).expand(3, 7, 7))
    assert torch.equal(query, (causal_mask(7, 7) & ~torch.eye(7, dtype=torch.bool)).expand(3, 7, 7))
    assert torch.equal(targets, torch.arange(7).expand(3, 7))
    with pytest.raises(ValueError, match="unknown factorisation 'bert'"):
        training_masks(3, 7, 2, factorisation="bert")
    with pytest.raises(ValueError, match="unknown factorisation 'bert'"):
        PermutationObjective("bert")


@pytest.mark.slow
@pytest.mark.parametrize("factorisation", FACTORISATIONS)
def test_permutation_objective_loss_is_the_targets_cross_entropy(factorisation):
    """The objective's loss is the cross-entropy of the query stream at the targets against the
    bytes there, a finite scalar that backpropagates; the same seed gives the same loss."""
    model = tiny_model()
    x = torch.randint(0, 256, (3, 16), generator=torch.Generator().manual_seed(16))
    objective = PermutationObjective(factorisation)
    torch.manual_seed(17)
    out, state = objective(model, x, x)
    loss = out["loss"]
    assert state is None and loss.dim() == 0 and torch.isfinite(loss)
    loss.backward()
    grad = model.word_embedding.weight.grad
    assert torch.isfinite(grad).all() and grad.abs().max() > 0
    torch.manual_seed(17)
    masks, targets = training_masks(3, 16, model.config.n_predict, factorisation=factorisation)
    with torch.no_grad():
        logits = model(x, masks=masks, target_mapping=targets).logits
        want = F.cross_entropy(logits.flatten(0, 1), x.gather(1, targets).flatten())
        torch.manual_seed(17)
        again = objective(model, x, x)[0]["loss"]
    torch.testing.assert_close(loss.detach(), want)
    assert again.item() == loss.item()


# ---- 9. infilling readings

def infill_setup():
    model = tiny_model()
    x = torch.randint(0, 256, (2, 16), generator=torch.Generator().manual_seed(18))
    return model, x, 6, 4  # span x[:, 6:10]


def changed(x: torch.Tensor, positions) -> torch.Tensor:
    y = x.clone()
    y[:, positions] = (y[:, positions] + 1 + torch.arange(len(list(positions)))) % 256
    return y


@pytest.mark.parametrize("reading", ["left", "causal"])
def test_left_readings_ignore_the_right_side(reading):
    """'left' and 'causal' see the left side only: no byte after the span's end may change
    their bits, but bytes before the span and earlier span bytes do (a changed span byte
    changes its own bits only as a target, so those are not compared)."""
    model, x, start, L = infill_setup()
    with torch.no_grad():
        bits = span_bits(model, x, start, L, reading=reading)
        assert bits.shape == (2, L) and torch.all(bits > 0)
        assert torch.equal(span_bits(model, changed(x, range(start + L, 16)), start, L,
                                     reading=reading), bits)
        assert (span_bits(model, changed(x, [start - 1]), start, L, reading=reading)
                - bits).abs().min() > 0
        later = span_bits(model, changed(x, [start + 1]), start, L, reading=reading)
        assert torch.equal(later[:, 0], bits[:, 0]) and (later[:, 2:] - bits[:, 2:]).abs().min() > 0


def test_left_reading_reads_its_context_both_ways_and_causal_does_not():
    """The two left-side readings differ in the context's content stream: 'left' ties the
    context at rank 0 (as XLNet's training does), 'causal' reads it left to right. So with
    the same span and bytes, the first span byte's bits differ between them, and under
    'causal' they equal Chapter 1's protocol: the model's step at the byte before the span."""
    model, x, start, L = infill_setup()
    with torch.no_grad():
        left = span_bits(model, x, start, L, reading="left")
        causal = span_bits(model, x, start, L, reading="causal")
        assert (left[:, 0] - causal[:, 0]).abs().min() > 1e-6
        logits, _ = model.step(x[:, :start + L - 1])
        want = F.cross_entropy(logits[:, start - 1:].transpose(1, 2), x[:, start:start + L],
                               reduction="none") / math.log(2)
    torch.testing.assert_close(causal, want, atol=1e-5, rtol=0)


def test_independent_reading_ignores_the_other_span_bytes():
    """'independent' is BERT's: byte k's bits depend on the window outside the span (both sides)
    but on no other span byte."""
    model, x, start, L = infill_setup()
    with torch.no_grad():
        bits = span_bits(model, x, start, L, reading="independent")
        for k in range(L):
            for k2 in range(L):
                if k2 != k:
                    other = span_bits(model, changed(x, [start + k2]), start, L,
                                      reading="independent")
                    assert torch.equal(other[:, k], bits[:, k]), (k, k2)
        right = span_bits(model, changed(x, [start + L]), start, L, reading="independent")
        assert (right - bits).abs().min() > 0


def test_sequential_reading_uses_earlier_span_bytes_only():
    """'sequential' is XLNet's joint reading: byte k's bits depend on span bytes before k and on
    both sides of the span, never on span bytes after k."""
    model, x, start, L = infill_setup()
    with torch.no_grad():
        bits = span_bits(model, x, start, L, reading="sequential")
        for k2 in range(L):
            other = span_bits(model, changed(x, [start + k2]), start, L, reading="sequential")
            assert torch.equal(other[:, :k2], bits[:, :k2]), k2  # (k2's own bits: its target)
            if k2 + 1 < L:
                assert (other[:, k2 + 1:] - bits[:, k2 + 1:]).abs().min() > 0, k2
        right = span_bits(model, changed(x, [15]), start, L, reading="sequential")
        assert (right - bits).abs().min() > 0
        # the first span byte is read the same way in both two-sided readings
        torch.testing.assert_close(bits[:, 0],
                                   span_bits(model, x, start, L, reading="independent")[:, 0])


def test_span_bits_bad_inputs():
    model, x, _, _ = infill_setup()
    with pytest.raises(ValueError, match="unknown reading"):
        span_bits(model, x, 2, 3, reading="bidirectional")
    for start, length in ((14, 3), (-1, 2), (3, 0), (0, 17)):
        with pytest.raises(ValueError, match="inside windows of 16"):
            span_bits(model, x, start, length)
    assert set(INFILL_READINGS) == {"sequential", "independent", "left", "causal"}


@pytest.mark.parametrize("reading", INFILL_READINGS)
def test_evaluate_infill_averages_the_middle_spans(reading):
    """Bits per byte over the middle span of every whole window (the tail is dropped), in any
    batch size, in eval mode, leaving the model's mode as it was."""
    torch.manual_seed(0)
    model = XLNet(tiny(dropout=0.1))
    data = torch.randint(0, 256, (3 * 16 + 5,), dtype=torch.uint8,
                         generator=torch.Generator().manual_seed(19))
    windows = data[:48].view(3, 16).long()
    with torch.no_grad():
        model.eval()
        want = span_bits(model, windows, 6, 4, reading=reading).mean().item()
        model.train()
    for batch_size in (1, 2, 64):
        got = evaluate_infill(model, data, seq_len=16, span=4, reading=reading,
                              batch_size=batch_size)
        assert got == pytest.approx(want, rel=1e-5)
        assert model.training
    with pytest.raises(ValueError, match="window"):
        evaluate_infill(model, data[:10], seq_len=16)
    with pytest.raises(ValueError, match="span"):
        evaluate_infill(model, data, seq_len=16, span=16)


# ---- odds and ends of the public surface

def test_target_positions_forms_and_errors():
    """Positions may come as None (all), positions [B, P], or the reference's one-hot; a
    malformed one-hot or an out-of-range position is refused."""
    assert torch.equal(target_positions(None, 2, 4, "cpu"), torch.arange(4).expand(2, 4))
    pos = torch.tensor([[3, 1], [0, 2]])
    assert torch.equal(target_positions(pos, 2, 4, "cpu"), pos)
    assert torch.equal(target_positions(F.one_hot(pos, 4).float(), 2, 4, "cpu"), pos)
    with pytest.raises(ValueError, match="one-hot"):
        target_positions(F.one_hot(pos, 4).float() * 0.5, 2, 4, "cpu")
    with pytest.raises(ValueError, match="one-hot"):
        target_positions(F.one_hot(pos, 5).float(), 2, 4, "cpu")
    with pytest.raises(ValueError, match="0..3"):
        target_positions(torch.tensor([[4, 0], [0, 0]]), 2, 4, "cpu")


def test_forward_output_shapes_and_argument_errors():
    model = tiny_model(mem_len=4)
    x = torch.randint(0, 256, (2, 5), generator=torch.Generator().manual_seed(20))
    out = model(x, perm_order=torch.tensor([[4, 2, 0, 1, 3], [0, 1, 2, 3, 4]]),
                target_mapping=torch.tensor([[1, 2], [4, 0]]))
    assert isinstance(out, XLNetOutput)
    assert out.logits.shape == (2, 2, 258) and out.content.shape == (2, 5, 32)
    assert [m.shape for m in out.mems] == [(2, 4, 32)] * 2
    # perm_order is the same as the masks of that order
    masks = permutation_masks(torch.tensor([[4, 2, 0, 1, 3], [0, 1, 2, 3, 4]]))
    again = model(x, masks=masks, target_mapping=torch.tensor([[1, 2], [4, 0]]))
    assert torch.equal(out.logits, again.logits)
    with pytest.raises(ValueError, match="not both"):
        model(x, perm_order=torch.arange(5).expand(2, 5), masks=masks)
    for bad in (dict(n_predict=17), dict(d_model=30, n_head=4), dict(mem_len=-1),
                dict(dropout=1.0), dict(n_layer=0)):
        with pytest.raises(ValueError):
            tiny(**bad)
    assert tiny().d_head == 16
    ff = FeedForward(8, 16)
    assert ff(torch.randn(3, 8)).shape == (3, 8)


# ---------------------------------------------------------------- memory in training

def test_the_objective_carries_the_memory_from_segment_to_segment():
    """With mem_len > 0 the trainer's state is XLNet's memory: segment 2's loss reads segment
    1's cached content (it differs from a fresh start), equals the model called by hand with
    that memory, and the new memory is returned detached, [B, mem_len, C] per layer."""
    from conftest import tiny_model
    from minixl.xlnet import PermutationObjective, training_masks

    model = tiny_model("xlnet", mem_len=16, dropout=0.0)
    objective = PermutationObjective()
    x1, x2 = (torch.randint(0, 256, (3, 32), generator=torch.Generator().manual_seed(s))
              for s in (1, 2))
    _, memory = objective(model, x1, x1)
    assert [tuple(m.shape) for m in memory] == [(3, 16, 32)] and not memory[0].requires_grad
    torch.manual_seed(5)
    with_memory, new = objective(model, x2, x2, memory)
    torch.manual_seed(5)
    fresh, _ = objective(model, x2, x2, None)
    torch.manual_seed(5)
    masks, targets = training_masks(3, 32, model.config.n_predict)
    by_hand = model(x2, masks=masks, target_mapping=targets, mems=memory)
    expected = F.cross_entropy(by_hand.logits.flatten(0, 1), x2.gather(1, targets).flatten())
    assert torch.allclose(with_memory["loss"], expected)
    # (an untrained model's loss moves little with its context, but it moves: ignoring the
    # memory would give the very same number, the same masks drawn)
    assert with_memory["loss"].item() != fresh["loss"].item()
    assert torch.equal(new[0], by_hand.mems[0]) and not new[0].requires_grad
    assert objective(tiny_model("xlnet", mem_len=0), x1, x1)[1] is None  # no memory, no state


def test_xlnet_reads_ordered_streams_only_with_a_memory():
    """Random windows without a memory, ordered streams with one, and the paper's
    pretraining streams (PretrainStreams) with reuse_len or bi_data."""
    from minixl.data import OrderedStreams, RandomWindows
    from minixl.xlnet import PretrainStreams
    from minixl.kinds import KINDS

    data = torch.randint(0, 256, (4000,), generator=torch.Generator().manual_seed(0)).byte()
    kind = KINDS["xlnet"]
    for mem_len, source in ((0, RandomWindows), (16, OrderedStreams)):
        config = kind.config(**{**TINY_CONFIGS["xlnet"], "mem_len": mem_len})
        assert kind.reads_streams(config) == (mem_len > 0)
        assert isinstance(kind.batches(data, 4, config, seed=0), source)
    for changes in (dict(reuse_len=12), dict(bi_data=True), dict(mem_len=0, bi_data=True)):
        config = kind.config(**{**TINY_CONFIGS["xlnet"], **changes})
        assert isinstance(kind.batches(data, 4, config, seed=0), PretrainStreams), changes
    with pytest.raises(ValueError, match="streams must be True, False or a function of the "
                                         "model's config, got 'yes'"):
        dataclasses.replace(kind, name="odd", streams="yes")


# ---------------------------------------------------------------- the paper's pretraining input

def _pretraining_batch(steps=1, *, batch_size=4, seq_len=32, reuse_len=12, bi_data=False,
                       seed=0, n=5000):
    from minixl.xlnet import PretrainStreams

    data = torch.randint(0, 256, (n,), generator=torch.Generator().manual_seed(3)).byte()
    source = PretrainStreams(data, batch_size, seq_len, seed=seed, reuse_len=reuse_len,
                             bi_data=bi_data)
    return data, source, [source(s) for s in range(steps)]


def _occurs_in(piece: torch.Tensor, data: torch.Tensor) -> bool:
    """Whether the bytes of piece [n] occur one after another somewhere in data."""
    return bool((data.long().unfold(0, len(piece), 1) == piece).all(-1).any())


def test_pretraining_masks_follow_the_references_two_parts():
    """[reuse block; A, SEP, B, SEP, CLS]: the reuse block is permuted on its own and reads
    nothing of A and B (so its content can be cached); A and B read all of the reuse block;
    n0 targets in the reuse block, n1 in A and B, never SEP or CLS; segment ids 0 (reuse
    block, A, first SEP), 1 (B, second SEP), 2 (CLS); the query stream never sees its own
    position. A layout that is not this one is refused."""
    from minixl.xlnet import pretraining_masks

    R, T = 12, 32
    _, _, [batch] = _pretraining_batch(reuse_len=R, seq_len=T)
    x = batch.x
    n0, n1 = XLNetConfig(seq_len=T, n_predict=8, reuse_len=R).predict_split
    assert (n0, n1) == (3, 5)  # in proportion to 12 and 20 of 32
    torch.manual_seed(0)
    (content, query), targets, segments = pretraining_masks(x, R, (n0, n1))
    assert targets.shape == (4, n0 + n1)
    assert (targets[:, :n0] < R).all() and (targets[:, n0:] >= R).all()
    assert all(len(set(row)) == n0 + n1 for row in targets.tolist())
    assert (x.gather(1, targets) < SEP).all()  # SEP and CLS are context, never predicted
    assert not content[:, :R, R:].any() and not query[:, :R, R:].any()
    assert content[:, R:, :R].all()
    for b in range(4):  # the reuse block's context sees no target; every target sees it
        context = [p for p in range(R) if p not in targets[b, :n0].tolist()]
        assert not content[b, context][:, targets[b, :n0]].any()
        assert query[b, targets[b, :n0]][:, context].all()
    assert not query.diagonal(dim1=1, dim2=2).any() and content.diagonal(dim1=1, dim2=2).all()
    # every target of A and B reads the SEPs and the CLS
    specials = x >= SEP
    for b in range(4):
        for t in targets[b, n0:].tolist():
            assert query[b, t, specials[b]].all()
    for b in range(4):
        tail = x[b, R:].tolist()
        first, second = [R + i for i, v in enumerate(tail) if v == SEP]
        expected = [0] * (first + 1) + [1] * (second - first) + [2]
        assert segments[b].tolist() == expected
    with pytest.raises(ValueError, match=r"\[reuse block of 12 bytes; A, SEP, B, SEP, CLS\]"):
        pretraining_masks(torch.randint(0, 256, (4, T)), R, (n0, n1))


def test_pretrain_streams_continue_the_reuse_block_and_draw_b_by_a_coin():
    """Each row's reuse block continues the previous step's (the memory is the text just
    before it); A continues the reuse block; B continues A or is a piece of the text from
    elsewhere, about half of each; the same (seed, step) gives the same batch; fresh only at
    the first segment of the streams."""
    R, T = 12, 32
    data, source, batches = _pretraining_batch(110, reuse_len=R, seq_len=T)
    streams = source.streams
    n_segments = (5000 // 4 - T) // R + 1  # 102: the last one ends at most at a row's end
    assert [s for s, b in enumerate(batches) if b.reset_state] == [0, n_segments]  # wraps around
    continues = 0
    for step, batch in enumerate(batches):
        seg = step % n_segments
        assert torch.equal(batch.x[:, :R], streams[:, seg * R:(seg + 1) * R].long())
        assert (batch.x[:, -1] == CLS).all() and (batch.y == 1).all()
        for b in range(4):
            row, at = batch.x[b], streams[b, (seg + 1) * R:].long()
            first, second = (row[R:] == SEP).nonzero().flatten().tolist()
            a, rest = row[R:R + first], row[R + first + 1:R + second]
            assert len(a) >= 1 and len(rest) >= 1 and len(a) + len(rest) == T - R - 3
            assert torch.equal(a, at[:len(a)])
            if torch.equal(rest, at[len(a):len(a) + len(rest)]):
                continues += 1
            else:  # from elsewhere in the row's own stream
                assert _occurs_in(rest, streams[b]), "B: not A's continuation, not its stream's"
    assert 0.35 < continues / (4 * len(batches)) < 0.65
    again = _pretraining_batch(110, reuse_len=R, seq_len=T)[2]
    assert all(torch.equal(p.x, q.x) for p, q in zip(batches, again))
    other = _pretraining_batch(110, reuse_len=R, seq_len=T, seed=1)[2]
    assert not all(torch.equal(p.x, q.x) for p, q in zip(batches, other))


def test_bi_data_reads_the_same_streams_backwards():
    """bi_data: the second half of the batch holds the first half's streams reversed, with
    y = -1 (the direction the objective reads); an odd batch is refused; without reuse_len
    a row is the next seq_len bytes of its stream."""
    from minixl.xlnet import PretrainStreams

    data, source, [batch] = _pretraining_batch(batch_size=4, reuse_len=0, seq_len=16,
                                               bi_data=True)
    assert (batch.y[:2] == 1).all() and (batch.y[2:] == -1).all()
    assert torch.equal(source.streams[2:], source.streams[:2].flip(-1))
    n = len(data) // 2
    assert torch.equal(batch.x[0], data[:16].long()) and torch.equal(batch.x[1], data[n:n + 16])
    assert torch.equal(batch.x[2], data[:n].flip(0)[:16].long())
    _, paired, batches = _pretraining_batch(8, reuse_len=12, seq_len=32, bi_data=True)
    far = 0
    for step, batch in enumerate(batches):  # a backward row's B, drawn from elsewhere, is
        for b in (2, 3):  # a piece of the reversed stream: the text read backwards
            first, second = (batch.x[b, 12:] == SEP).nonzero().flatten().tolist()
            rest = batch.x[b, 12 + first + 1:12 + second]
            after_a = paired.streams[b, 12 * (step + 1) + first:].long()
            if len(rest) > 3 and not torch.equal(rest, after_a[:len(rest)]):
                far += 1
                assert _occurs_in(rest.flip(0), data) and _occurs_in(rest, paired.streams[b])
    assert far >= 2  # (the coin gave some: the check above ran)
    with pytest.raises(ValueError, match="the batch size must be even, got 3"):
        PretrainStreams(data, 3, 16, bi_data=True)


def test_a_backward_row_computes_the_mirror_of_the_forward_one():
    """With its distances negated (reverse=True), the text read backwards under the mirrored
    factorisation order gives the forward reading's predictions exactly; without negating
    them it does not (the check can fail)."""
    model = tiny_model(seed=4)
    T = 16
    x = torch.randint(0, 256, (2, T), generator=torch.Generator().manual_seed(8))
    order = torch.stack([torch.randperm(T, generator=torch.Generator().manual_seed(s))
                         for s in (1, 2)])
    content, query = permutation_masks(order, n_predict=5)
    targets = order[:, -5:]
    forward = model(x, masks=(content, query), target_mapping=targets).logits
    flip = lambda m: m.flip(-1).flip(-2)  # noqa: E731 (position i <-> T - 1 - i)
    args = dict(masks=(flip(content), flip(query)), target_mapping=T - 1 - targets)
    backward = model(x.flip(-1), **args, reverse=torch.tensor([True, True])).logits
    assert torch.allclose(forward, backward, atol=1e-5)
    unreversed = model(x.flip(-1), **args).logits
    assert not torch.allclose(forward, unreversed, atol=1e-3)
    # one row forwards, one backwards in one batch: each row reads its own distance table
    mixed = model(torch.stack([x[0], x[1].flip(-1)]),
                  masks=(torch.stack([content[0], flip(content[1])]),
                         torch.stack([query[0], flip(query[1])])),
                  target_mapping=torch.stack([targets[0], T - 1 - targets[1]]),
                  reverse=torch.tensor([False, True])).logits
    assert torch.allclose(mixed, forward, atol=1e-5)  # one table per row


def test_the_reuse_block_alone_is_cached_and_reads_nothing_after_it():
    """The memory of a pretraining input is the reuse block's content, which equals the
    content of the reuse block fed alone: changing A and B changes the predictions in A and
    B, never the memory."""
    from minixl.xlnet import pretraining_masks

    R, T = 12, 32
    model = tiny_model(seed=2, seq_len=T, n_predict=8, mem_len=R, reuse_len=R)
    _, _, [batch] = _pretraining_batch(reuse_len=R, seq_len=T)
    x = batch.x
    torch.manual_seed(0)
    masks, targets, segments = pretraining_masks(x, R, model.config.predict_split)
    whole = model(x, masks=masks, target_mapping=targets, segments=segments, reuse_len=R)
    alone = model(x[:, :R], masks=(masks[0][:, :R, :R], masks[1][:, :R, :R]),
                  target_mapping=targets[:, :3], segments=segments[:, :R])
    assert [tuple(m.shape) for m in whole.mems] == [(4, R, 32)] * 2
    for m, a in zip(whole.mems, alone.mems):
        assert torch.allclose(m, a, atol=1e-5)
    y = x.clone()
    y[:, R:][y[:, R:] < SEP] = (y[:, R:][y[:, R:] < SEP] + 1) % 256  # other A and B bytes
    changed = model(y, masks=masks, target_mapping=targets, segments=segments, reuse_len=R)
    assert all(torch.equal(m, c) for m, c in zip(whole.mems, changed.mems))
    assert not torch.allclose(whole.logits[:, 3:], changed.logits[:, 3:])


def test_the_objective_trains_on_the_pretraining_input_with_its_memory():
    """PermutationObjective with reuse_len > 0: the loss is the model's on
    pretraining_masks' targets (same draw), the state is the memory of the reuse block, and
    bi_data rows (y = -1) are read with negated distances."""
    from minixl.xlnet import pretraining_masks

    R, T = 12, 32
    model = tiny_model(seed=1, seq_len=T, n_predict=8, mem_len=16, reuse_len=R, bi_data=True)
    _, _, batches = _pretraining_batch(2, reuse_len=R, seq_len=T, bi_data=True)
    objective = PermutationObjective()
    _, memory = objective(model, batches[0].x, batches[0].y)
    assert [tuple(m.shape) for m in memory] == [(4, R, 32)] * 2
    torch.manual_seed(7)
    loss, new = objective(model, batches[1].x, batches[1].y, memory)
    torch.manual_seed(7)
    masks, targets, segments = pretraining_masks(batches[1].x, R, model.config.predict_split)
    out = model(batches[1].x, masks=masks, target_mapping=targets, segments=segments,
                mems=memory, reuse_len=R, reverse=torch.tensor([False, False, True, True]))
    expected = F.cross_entropy(out.logits.flatten(0, 1),
                               batches[1].x.gather(1, targets).flatten())
    assert torch.allclose(loss["loss"], expected)
    assert [tuple(m.shape) for m in new] == [(4, 16, 32)] * 2 and not new[0].requires_grad
    with pytest.raises(ValueError, match="reuse_len > 0 trains the permutation objective only"):
        PermutationObjective("causal")(model, batches[0].x, batches[0].y)


def test_pretraining_settings_that_cannot_work_are_refused():
    with pytest.raises(ValueError, match="at most reuse_len=27"):
        tiny(seq_len=32, reuse_len=28)
    with pytest.raises(ValueError, match="needs SEP and CLS"):
        tiny(seq_len=32, reuse_len=8, vocab_size=256)
    with pytest.raises(ValueError, match="predict fewer"):
        tiny(seq_len=32, reuse_len=24, n_predict=24)


# ---------------------------------------------------------------- span-based targets

def test_span_targets_are_spans_of_1_to_5_predicted_after_all_the_context():
    """factorisation='spans': n_predict distinct positions in runs of 1 to MAX_SPAN with context
    between runs; every target's query sees all the context and never itself; the targets
    are ranked after the context in a random order (so some target sees another); many
    draws reach every span length and both ends of the sequence."""
    from minixl.xlnet import MAX_SPAN

    torch.manual_seed(0)
    T, n, B = 32, 11, 200
    (content, query), targets = training_masks(B, T, n, factorisation="spans")
    assert targets.shape == (B, n)
    lengths, ends = set(), set()
    for b in range(B):
        pos = sorted(targets[b].tolist())
        assert len(set(pos)) == n and 0 <= pos[0] and pos[-1] < T
        runs, start = [], pos[0]
        for p, q in zip(pos, pos[1:] + [None]):
            if q != p + 1:
                runs.append(p - start + 1)
                start = q
        assert all(1 <= r <= MAX_SPAN for r in runs), runs
        lengths |= set(runs)
        ends |= {pos[0] == 0, pos[-1] == T - 1}
        is_target = torch.zeros(T, dtype=torch.bool)
        is_target[targets[b]] = True
        assert query[b][is_target][:, ~is_target].all()  # all the context
        assert not query[b].diagonal().any()
        assert not content[b][~is_target][:, is_target].any()  # context never sees a target
        assert query[b][is_target][:, is_target].any()  # an order among the targets
    assert lengths == set(range(1, MAX_SPAN + 1)) and ends == {True, False}
    with pytest.raises(ValueError, match="do not fit"):
        training_masks(1, 8, 8, factorisation="spans")


def test_the_pair_records_have_the_entropies_the_control_claims():
    """Counted on the records themselves: the pair given its cue holds 1 bit, each byte given
    the cue 1 bit, the first byte with no cue 3 bits and the second given the first none."""
    from collections import Counter

    from minixl.xlnet.experiments import PAIR_BOUNDS, pair_records

    rec = pair_records(20000, seed=0).view(-1, 4).tolist()
    assert all(r[0] == ord("|") for r in rec)

    def entropy(key, given=lambda r: 0):
        joint, cond = Counter(map(lambda r: (given(r), key(r)), rec)), Counter(map(given, rec))
        return -sum(c / len(rec) * math.log2(c / cond[g]) for (g, _), c in joint.items())

    cue = lambda r: r[3]  # noqa: E731
    assert abs(entropy(lambda r: (r[1], r[2]), cue) - PAIR_BOUNDS["joint"]) < 0.01
    assert abs(entropy(lambda r: r[1], cue) + entropy(lambda r: r[2], cue)
               - PAIR_BOUNDS["independent"]) < 0.01
    assert abs(entropy(lambda r: r[1]) + entropy(lambda r: r[2], lambda r: r[1])
               - PAIR_BOUNDS["causal"]) < 0.01


@pytest.mark.slow  # over 1.5 s: the quick loop stays well under a minute
def test_the_positive_control_orders_the_three_objectives():
    """Chapter 5's positive control, one seed: each arm read its own way lands near its bound,
    permutation (joint) below independent below causal."""
    from minixl.xlnet.experiments import CONTROL_ARMS, PAIR_BOUNDS, pair_control

    rows = pair_control(seeds="0")
    assert [r["arm"] for r in rows] == list(CONTROL_ARMS)
    own = {r["arm"]: r[f"bits_{CONTROL_ARMS[r['arm']]}"] for r in rows}
    assert own["permutation"] < own["independent"] < own["causal"], own
    for arm, bits in own.items():
        assert abs(bits - PAIR_BOUNDS[CONTROL_ARMS[arm]]) < 0.4, (arm, bits)


def test_the_segment_term_adds_s_plus_within_a_segment_and_s_minus_across():
    """Term (e) at its source, in the quick loop (the comparison with the reference
    implementation, which also pins it, needs transformers). With a large bias along s+
    and s- zeroed, a query reads only the keys of its own segment, as if the others were
    masked; with s+ zeroed and the bias along s-, only the keys of the other segment.
    Swapping s+ and s- fails both. (A term shared by every key of a row would move nothing:
    the softmax ignores it, so each row mixes both kinds of key.)"""
    torch.manual_seed(0)
    attn = TwoStreamAttention(8, 2).eval()
    B, T = 2, 5
    q, k, v = (torch.randn(B, 2, T, 4) for _ in range(3))
    r_k = torch.randn(2, 2 * T - 1, 4)
    mask = torch.ones(B, T, T, dtype=torch.bool)
    same = (torch.arange(T) < 2).expand(B, T, T)  # keys 0 and 1 share each query's segment
    u = torch.randn(2, 4)
    with torch.no_grad():
        attn.r_s_bias.copy_(100 * u)  # (q + b) . u / |u| is about 100 |u| for every query
        for along, reads in ((0, same), (1, ~same)):  # along s+, then along s-
            attn.seg_embed.zero_()
            attn.seg_embed[along] = u / u.norm(dim=-1, keepdim=True)
            torch.testing.assert_close(attn.attend(q, k, v, r_k, mask, seg_same=same),
                                       attn.attend(q, k, v, r_k, mask & reads))
