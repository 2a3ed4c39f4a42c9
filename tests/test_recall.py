"""The multi-query recall task (minixl.one_bench.recall): every query answered by the value
written with its key exactly d bytes back, a copier scores 1, a uniform guess chance, and the
bands split the cases as the stream lays them out."""

import math

import pytest
import torch

from minixl.one_bench.recall import ASK, VALUES, WRITE, answer_mask, recall_records
from minixl.reach import distance_bands, score_reach

DISTANCES = [16, 64, 256, 1024]


@pytest.mark.parametrize("key,seed", [(2, 0), (2, 1), (3, 2)])
def test_every_query_is_answered_by_the_one_write_of_its_key_d_bytes_back(key, seed):
    size = key + 2
    r = recall_records(3000, [d // 4 * size for d in DISTANCES], key=key, seed=seed)
    data = r.data.long()
    assert len(data) == 3000 * size and len(r.answers) > 1000  # dense: most items are cases
    assert sorted(set(r.distance.tolist())) == sorted(d // 4 * size for d in DISTANCES)
    assert bool((r.answers[1:] > r.answers[:-1]).all())
    items = data.reshape(-1, size)
    assert set(items[:, key].tolist()) == {WRITE, ASK}
    assert bool(((items[:, :key] >= ord("a")) & (items[:, :key] <= ord("z"))).all())
    assert bool(((items[:, -1] >= ord("A")) & (items[:, -1] < ord("A") + VALUES)).all())
    asked = set((r.answers // size).tolist())
    assert asked == set(torch.nonzero(items[:, key] == ASK)[:, 0].tolist())
    for pos, d in zip(r.answers.tolist(), r.distance.tolist()):
        source = pos - d
        assert data[pos] == data[source] and data[pos - 1] == ASK and data[source - 1] == WRITE
        assert torch.equal(data[pos - 1 - key:pos - 1], data[source - 1 - key:source - 1])
        # no other write of the same key between the source and the query: one answer only
        between = items[source // size + 1:pos // size]
        same = (between[:, :key] == data[pos - 1 - key:pos - 1]).all(1)
        assert not bool((same & (between[:, key] == WRITE)).any())
    mask = answer_mask(r)
    assert int(mask.sum()) == len(r.answers) and bool(mask[r.answers].all())


def test_a_copier_scores_one_and_a_uniform_guess_scores_chance_in_every_band():
    r = recall_records(3000, DISTANCES, seed=3)
    bands = distance_bands(DISTANCES)
    targets = r.data[r.answers].long()
    copied = torch.full((len(r.answers), 256), -30.0)
    copied[torch.arange(len(r.answers)), r.data[r.answers - r.distance].long()] = 0.0
    uniform = torch.full((len(r.answers), 256), -math.inf)
    uniform[:, ord("A"):ord("A") + VALUES] = -math.log(VALUES)
    for rows, accuracy, bits in [(score_reach(copied.log_softmax(-1), targets, r.distance,
                                              bands), 1.0, 0.0),
                                 (score_reach(uniform, targets, r.distance, bands), None,
                                  math.log2(VALUES))]:
        assert [row["low"] for row in rows] == DISTANCES
        for row in rows:
            assert row["cases"] == int((r.distance == row["low"]).sum()) > 100
            assert row["bits"] == pytest.approx(bits, abs=1e-4)
            if accuracy is not None:
                assert row["accuracy"] == accuracy
    # a guesser that reads nothing (always the same value) is right about 1 time in 26
    constant = torch.full((len(r.answers), 256), -30.0)
    constant[:, ord("Q")] = 0.0
    rows = score_reach(constant.log_softmax(-1), targets, r.distance, bands)
    assert all(abs(row["accuracy"] - 1 / VALUES) < 0.04 for row in rows)


def test_the_stream_is_the_seeds_and_bad_settings_are_refused():
    a, b = recall_records(500, [8, 32], seed=4), recall_records(500, [8, 32], seed=4)
    assert torch.equal(a.data, b.data) and torch.equal(a.answers, b.answers)
    assert not torch.equal(a.data, recall_records(500, [8, 32], seed=5).data)
    with pytest.raises(ValueError, match="multiple of the item size, key \\+ 2 = 4 bytes"):
        recall_records(100, [16, 30])
    with pytest.raises(ValueError, match="too few"):
        recall_records(100, [3 * 1000], key=1)
    with pytest.raises(ValueError, match="n_items >= 2"):
        recall_records(1, [16])


def test_recall_windows_leave_every_target_but_the_answers_to_the_loss_to_ignore():
    from minixl.one_bench.recall import RecallWindows

    r = recall_records(400, [8, 32], seed=6)
    source = RecallWindows(r, 8, 48, seed=1)
    x, y, reset = source(3)
    assert x.shape == y.shape == (8, 48) and reset
    starts = [int(torch.nonzero((r.data.long().unfold(0, 48, 1) == row).all(1))[0])
              for row in x]  # each row is a window of the stream
    mask = answer_mask(r)
    for row, start in zip(y, starts):
        answered = mask[start + 1:start + 49]
        assert torch.equal(row[answered], r.data[start + 1:start + 49][answered].long())
        assert bool((row[~answered] == -100).all()) and bool(answered.any())
    assert torch.equal(source(3).x, x) and not torch.equal(source(4).x, x)
    # the next-byte loss then counts the answers only
    logits = torch.randn(8, 48, 256)
    kept = y != -100
    assert torch.nn.functional.cross_entropy(logits.flatten(0, 1), y.flatten()).item() == (
        pytest.approx(torch.nn.functional.cross_entropy(logits[kept], y[kept]).item()))
