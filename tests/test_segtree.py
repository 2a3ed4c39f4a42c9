"""Chapter 6: the SegTree graph (loop and vectorised), gathered against dense attention, the
causal model's leakage, the edge types, and the model's heads and protocol."""

import math

import pytest
import torch

from minixl.char_transformer import causal_mask, leakage_matrix
from minixl.segtree import (GRAPH_CACHE, SegTreeAttention, SegTreeConfig, SegTreeTransformer, edge_type,
                            graph_mask, leaf_context_loop, node_span, segtree_attention_dense,
                            segtree_graph, tree_sizes)

SIZES = list(range(1, 71)) + [100, 127, 128, 129, 257]


def offsets(n):
    sizes = tree_sizes(n)
    return [sum(sizes[:j]) for j in range(len(sizes))]


@pytest.mark.parametrize("k", [1, 2, 3, 5])
@pytest.mark.parametrize("causal", [False, True], ids=["both", "causal"])
def test_every_leaf_reads_disjoint_spans_that_cover_its_context(k, causal):
    """For every leaf of many lengths (powers of two and not): the loop's spans are disjoint,
    cover 0..n-1 (0..i when causal), are within (2k + 2) per level + 1, and the vectorised
    graph holds exactly the loop's nodes with the same edge types."""
    for n in SIZES:
        leaves = segtree_graph(n, k, causal).groups[0]
        off, levels = offsets(n), len(tree_sizes(n))
        for i in range(n):
            loop = leaf_context_loop(n, i, k=k, causal=causal)
            covered = [b for lv, p, _ in loop
                       for b in range(node_span(n, lv, p)[0], node_span(n, lv, p)[1] + 1)]
            assert sorted(covered) == list(range(i + 1 if causal else n)), (n, i)
            assert len(loop) <= (2 * k + 2) * levels + 1, (n, i, len(loop))
            want = sorted((off[lv] + p, edge_type(kind, lv)) for lv, p, kind in loop)
            row = leaves.valid[i]
            assert sorted(zip(leaves.index[i][row].tolist(), leaves.etype[i][row].tolist())) == want


def test_the_papers_example():
    """n = 16, k = 1: leaf 7 reads {0-3, 4-5, 6, 7, 8, 9, 10-11, 12-15}."""
    spans = sorted(node_span(16, lv, p) for lv, p, _ in leaf_context_loop(16, 7, k=1))
    assert spans == [(0, 3), (4, 5), (6, 6), (7, 7), (8, 8), (9, 9), (10, 11), (12, 15)]
    causal = sorted(node_span(16, lv, p) for lv, p, _ in leaf_context_loop(16, 7, causal=True))
    assert causal == [(0, 3), (4, 5), (6, 6), (7, 7)]


@pytest.mark.parametrize("causal", [False, True], ids=["both", "causal"])
def test_internal_nodes_read_themselves_and_their_leaves_only(causal):
    for n in (1, 5, 16, 37):
        graph = segtree_graph(n, 2, causal)
        mask, _ = graph_mask(graph)
        spans = [node_span(n, lv, p) for lv, size in enumerate(graph.sizes) for p in range(size)]
        assert spans[-1] == (0, n - 1)  # the root, stored last, spans everything
        for node in range(n, graph.n_nodes):
            first, last = spans[node]
            want = {node} | set(range(first, last + 1))
            assert set(mask[node].nonzero().flatten().tolist()) == want, (n, node)
        if causal:  # no leaf reads a node that covers a later byte
            for leaf in range(n):
                assert all(spans[j][1] <= leaf for j in mask[leaf].nonzero().flatten().tolist())


def test_edges_grow_like_n_log_n():
    edges = {n: sum(int(g.valid.sum()) for g in segtree_graph(n, 1, True).groups)
             for n in (1024, 4096)}
    assert edges[4096] / edges[1024] < 6  # n log n: 4.8; n^1.5: 8; dense: 16


@pytest.mark.parametrize("n,k,causal", [(1, 1, True), (2, 1, False), (7, 2, True),
                                        (16, 1, False), (33, 3, True)])
def test_gathered_attention_equals_the_dense_masked_reference(n, k, causal):
    torch.manual_seed(n)
    graph = segtree_graph(n, k, causal)
    attn = SegTreeAttention(32, 4, graph.n_types)
    x = torch.randn(2, graph.n_nodes, 32, requires_grad=True)
    fast, slow = attn(x, graph), segtree_attention_dense(attn, x, graph)
    torch.testing.assert_close(fast, slow, atol=1e-5, rtol=1e-5)
    params = [x, *attn.parameters()]
    g_fast = torch.autograd.grad(fast.square().sum(), params)
    g_slow = torch.autograd.grad(slow.square().sum(), params)
    for a, b in zip(g_fast, g_slow):
        torch.testing.assert_close(a, b, atol=1e-4, rtol=1e-4)


def small(**kw):
    torch.manual_seed(0)
    return SegTreeTransformer(SegTreeConfig(n_layer=2, d_model=32, n_head=4, d_inner=64,
                                            block_size=32, **kw)).eval()


@pytest.mark.slow
def test_the_causal_model_does_not_leak_and_the_bidirectional_one_reads_ahead():
    text = torch.randint(0, 256, (21,), generator=torch.Generator().manual_seed(1))
    leak = leakage_matrix(small(), text)
    assert torch.equal(leak != 0, causal_mask(21, 21))
    assert (leakage_matrix(small(causal=False), text).triu(1) != 0).any()


def test_edge_types_are_the_same_for_every_length_and_matter():
    """A type index means one relation at any n (a model trained at one length reads
    another), and the learned vectors change the output."""
    for n in (16, 64):
        leaves = segtree_graph(n, 1).groups[0]
        row = dict(zip(leaves.index[7].tolist(), leaves.etype[7].tolist()))
        assert row[7] == edge_type("self") == 0
        assert row[6] == edge_type("left", 0) and row[8] == edge_type("right", 0)
    with pytest.raises(ValueError, match="unknown edge type"):
        edge_type("up", 1)
    model = small()
    x = torch.randint(0, 256, (1, 20))
    with torch.no_grad():
        before = model(x)
        model.blocks[0].attn.rel_k.add_(1.0)
        assert not torch.allclose(model(x), before)


def test_step_in_pieces_equals_one_pass_and_classify_reads_the_root():
    model = small()
    x = torch.randint(0, 256, (2, 20))
    with torch.no_grad():
        whole, _ = model.step(x)
        first, state = model.step(x[:, :12])
        second, _ = model.step(x[:, 12:], state)
    torch.testing.assert_close(torch.cat([first, second], 1), whole, atol=1e-5, rtol=0)
    with pytest.raises(ValueError, match="no classifier"):
        model.classify(x)
    clf = small(causal=False, n_classes=3)
    assert clf.classify(x).shape == (2, 3)
    with pytest.raises(ValueError, match="exceeds block_size"):
        model(torch.randint(0, 256, (1, 33)))


@pytest.mark.parametrize("bad,match", [(dict(k=0), "k must be"), (dict(n_head=3), "multiple"),
                                       (dict(n_classes=-1), "n_classes"),
                                       (dict(dropout=1.0), "dropout")])
def test_bad_settings_are_refused(bad, match):
    with pytest.raises(ValueError, match=match):
        SegTreeConfig(**{"d_model": 32, **bad})
    with pytest.raises(ValueError, match="at least one leaf"):
        tree_sizes(0)
    with pytest.raises(ValueError, match="k"):
        segtree_graph(8, 0)


def test_context_size_follows_2k_log_n():
    """The most nodes a leaf reads, against 2k log2(n/k): close for larger k."""
    for k in (4, 16):
        most = int(segtree_graph(4096, k).groups[0].valid.sum(1).max())
        assert 0.8 < most / (2 * k * math.log2(4096 / k)) < 1.2


def test_sampling_keeps_only_a_few_graphs():
    """Stepping one byte at a time meets every length up to block_size; the model keeps only
    the last GRAPH_CACHE graphs (at block_size 8,192 and k = 64 all of them would not fit in
    memory), and a dropped length is rebuilt when it comes back."""
    model = small()
    x = torch.randint(0, 256, (1, 30))
    with torch.no_grad():
        _, state = model.step(x[:, :1])
        for i in range(1, 30):
            _, state = model.step(x[:, i:i + 1], state)
        assert len(model._graphs) <= GRAPH_CACHE + 1  # and block_size's, kept for training
        assert (32, "cpu") in model._graphs
        torch.testing.assert_close(model(x[:, :3]), model(x[:, :3]))


def test_training_length_graph_is_built_with_the_model_and_moves_with_it():
    """The block_size graph exists before the first forward (a compiled forward then reads
    only constant tensors), and Module.to carries the cached graphs along."""
    model = small()
    graph = model._graphs[(32, "cpu")]
    want = segtree_graph(32, 1, True)
    for a, b in zip(graph.groups, want.groups):
        assert all(torch.equal(x, y) for x, y in
                   zip((a.nodes, a.index, a.valid, a.etype), (b.nodes, b.index, b.valid, b.etype)))
    x = torch.randint(0, 256, (2, 32))
    before = model(x)
    model.to(torch.float64)
    assert set(model._graphs) == {(32, "cpu")}
    assert model._graphs[(32, "cpu")].groups[0].index.dtype == torch.long  # only floats convert
    torch.testing.assert_close(model(x), before.double(), atol=1e-5, rtol=1e-5)
