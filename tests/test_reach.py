"""The reach task of the bench of every mechanism (minixl.reach): records whose answers sit a
known distance after their source, a scorer by band of distance, and each kind's reach from
its config, checked on a real model where it is not a window."""

import math
from dataclasses import replace

import pytest
import torch

from minixl.kinds import KINDS
from minixl.reach import CHANCE_BITS, distance_bands, reach_records, score_reach, unreachable
from minixl.transformer_xl import TransformerXL, TransformerXLConfig

pytestmark = pytest.mark.usefixtures("one_thread")  # see tests/conftest.py

DISTANCES = (16, 64, 256, 1024, 4096)


@pytest.fixture(scope="module")
def records():
    return reach_records(60, DISTANCES, seed=3)


def test_every_answer_is_the_letter_its_distance_back(records):
    data, answers, distance = records.data.long(), records.answers, records.distance
    assert len(answers) == 60 * 6 and set(distance.tolist()) <= set(DISTANCES)
    assert len(set(distance.tolist())) == len(DISTANCES)  # 60 draws reach every distance
    source = answers - distance
    assert torch.equal(data[answers], data[source])
    assert ((data[answers] >= ord("a")) & (data[answers] <= ord("z"))).all()
    # the source is the first copy: the record's '#' is 1 to 6 bytes before it, no newline
    # between; the byte before each answer's copy is a newline or a letter of the copy
    for s in source[::6].tolist():
        assert data[s - 1] == ord("#")
    assert (data[answers[::6] - 1] == 10).all()
    # nothing between a source and its answer is a letter but the copies themselves
    d0, a0 = int(distance[0]), int(answers[0])
    between = data[a0 - d0 + 6:a0]
    assert set(between.tolist()) <= {10, ord(".")}
    again = reach_records(60, DISTANCES, seed=3)
    assert torch.equal(again.data, records.data)  # seeded
    assert not torch.equal(reach_records(60, DISTANCES, seed=4).data[:200], records.data[:200])


def test_a_perfect_copier_scores_one_and_a_uniform_guess_scores_chance(records):
    data, answers, distance = records.data.long(), records.answers, records.distance
    bands = distance_bands(DISTANCES)
    copier = torch.full((len(answers), 256), -30.0)
    copier[torch.arange(len(answers)), data[answers - distance]] = 0.0
    copier = copier.log_softmax(-1)
    for row in score_reach(copier, data[answers], distance, bands):
        assert row["accuracy"] == 1.0 and row["bits"] < 1e-9, row
    guess = torch.full((len(answers), 256), -math.inf)
    guess[:, ord("a"):ord("z") + 1] = -math.log(26)
    rows = score_reach(guess, data[answers], distance, bands)
    for row in rows:
        assert row["bits"] == pytest.approx(CHANCE_BITS)
    # argmax takes 'a': right exactly where the answer is 'a'
    right = sum(r["accuracy"] * r["cases"] for r in rows) / len(answers)
    assert right == pytest.approx((data[answers] == ord("a")).float().mean().item())


def test_the_bands_split_the_cases(records):
    bands = distance_bands([4096, 16, 64, 16, 256, 1024])
    assert bands == [(16, 63), (64, 255), (256, 1023), (1024, 4095), (4096, 4096)]
    logp = torch.zeros(len(records.answers), 256).log_softmax(-1)
    rows = score_reach(logp, records.data[records.answers].long(), records.distance, bands)
    assert sum(r["cases"] for r in rows) == len(records.answers)
    for r in rows:
        assert r["cases"] == int(((records.distance >= r["low"]) &
                                  (records.distance <= r["high"])).sum())
    empty = score_reach(logp, records.data[records.answers].long(), records.distance,
                        [(5000, 6000)])
    assert empty == [{"band": "5000-6000", "low": 5000, "high": 6000, "cases": 0,
                      "accuracy": None, "bits": None}]


def test_bad_input_says_what_was_expected():
    with pytest.raises(ValueError, match=r"each distance must be at least word \+ 2 = 8"):
        reach_records(3, [7, 16])
    with pytest.raises(ValueError, match=r"expected log_probs \[A, V\], targets \[A\]"):
        score_reach(torch.zeros(3, 256), torch.zeros(2, dtype=torch.long),
                    torch.zeros(3), [(1, 2)])


def test_what_each_kind_cannot_reach_is_said_from_its_config():
    char = KINDS["char"]
    config = char.preset("tiny")[0]  # windows of 128
    marked = unreachable(char, config, [16, 128, 129, 4096])
    assert sorted(marked) == [129, 4096]  # the last byte of a window predicts one 128 past 0
    assert marked[129] == "a prediction reads at most 128 bytes back (a window of 128 bytes)"
    xl = KINDS["xl"]
    xl_config = xl.preset("tiny")[0]  # 4 layers, segments and memory of 128
    assert xl.reach(xl_config) == (640, "4 layers, each reading a memory of 128 before its "
                                   "segment of 128")
    assert sorted(unreachable(xl, xl_config, [640, 641])) == [641]
    assert xl.reach(replace(xl_config, mem_len=0))[0] == 128
    assert unreachable(replace(char, reach=None), config, [4096]) == {}


@pytest.mark.parametrize("mem_len,reach", [(4, 12), (3, 11), (0, 4)])
def test_xl_reaches_exactly_as_far_as_its_config_says(mem_len, reach):
    """A Transformer-XL reading a stream segment by segment, its memory carried: the
    prediction of the byte after the last one changes when any byte up to `reach` before
    that byte changes, and never when an earlier one does."""
    torch.manual_seed(0)
    config = TransformerXLConfig(n_layer=2, d_model=16, n_head=2, d_head=8, d_inner=32,
                                 tgt_len=4, mem_len=mem_len, pre_lnorm=True)
    assert KINDS["xl"].reach(config)[0] == reach
    model = TransformerXL(config).double().eval()
    x = torch.randint(256, (1, 24))

    @torch.no_grad()
    def last(tokens):
        state = None
        for s in range(0, 24, 4):
            logits, state = model.step(tokens[:, s:s + 4], state)
        return logits[0, -1]

    base = last(x)
    for d in range(24):
        y = x.clone()
        y[0, 23 - d] = (y[0, 23 - d] + 1) % 256
        assert (not torch.equal(last(y), base)) == (d + 1 <= reach), d  # d + 1 from byte 24
