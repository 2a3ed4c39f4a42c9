"""The multi-query recall task (minixl.one_bench.recall): every query answered by the value
written with its key exactly d bytes back, a copier scores 1, a uniform guess chance, the
bands split the cases as the stream lays them out, and with bands of distance no fixed count
back answers a band."""

import math

import pytest
import torch

from minixl.one_bench.recall import (ASK, KEY_BYTES, VALUES, WRITE, answer_mask, band_reach,
                                     recall_bands, recall_records)
from minixl.reach import distance_bands, score_reach

DISTANCES = [16, 64, 256, 1024]


def assert_one_answer(r, key: int, limit: int | None = None):
    """Every query's key does not occur, written or asked, between its source and itself:
    the source is the latest occurrence of the key, so the query has one answer."""
    items = r.data.long().reshape(-1, key + 2)
    for pos, d in list(zip(r.answers.tolist(), r.distance.tolist()))[:limit]:
        source, query = (pos - d) // (key + 2), pos // (key + 2)
        between = items[source + 1:query, :key]
        assert not bool((between == items[query, :key]).all(1).any()), (pos, d)


@pytest.mark.parametrize("key,seed", [(1, 3), (2, 0), (2, 1), (3, 2)])
def test_every_query_is_answered_by_the_one_write_of_its_key_d_bytes_back(key, seed):
    size = key + 2
    r = recall_records(3000, [d // 4 * size for d in DISTANCES], key=key, seed=seed)
    data = r.data.long()
    assert len(data) == 3000 * size and len(r.answers) > 1000  # dense: most items are cases
    assert sorted(set(r.distance.tolist())) == sorted(d // 4 * size for d in DISTANCES)
    assert bool((r.answers[1:] > r.answers[:-1]).all())
    items = data.reshape(-1, size)
    assert set(items[:, key].tolist()) == {WRITE, ASK}
    assert set(items[:, :key].unique().tolist()) <= set(KEY_BYTES.tolist())  # no value, no marker
    assert len(KEY_BYTES) == 228 and not set(KEY_BYTES.tolist()) & {WRITE, ASK, ord("A"), ord("Z")}
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


@pytest.mark.parametrize("key,seed", [(3, 0), (1, 1)])
def test_bands_of_distance_leave_no_fixed_count_back_that_answers_a_band(key, seed):
    edges = [16, 64, 256, 1024, 4096]
    r = recall_records(6000, edges, key=key, seed=seed, edges=True)
    data, size = r.data.long(), key + 2
    bands = recall_bands(edges, size)
    assert bands == {5: [(20, 60), (65, 255), (260, 1020), (1025, 4095)],  # the distances drawn
                     3: [(18, 63), (66, 255), (258, 1023), (1026, 4095)]}[size]
    # every answer in exactly one band, a whole number of items back, its key's one write
    inside = torch.stack([(r.distance >= lo) & (r.distance <= hi) for lo, hi in bands])
    assert bool((inside.sum(0) == 1).all()) and bool((r.distance % size == 0).all())
    for pos, d in zip(r.answers.tolist(), r.distance.tolist()):
        assert data[pos] == data[pos - d] and data[pos - 1] == ASK and data[pos - d - 1] == WRITE
        assert torch.equal(data[pos - 1 - key:pos - 1], data[pos - d - 1 - key:pos - d - 1])
    assert_one_answer(r, key)  # with one-byte keys, 228 of them, keys come back often
    targets = data[r.answers]
    for row, (lo, hi) in zip(inside, bands):
        assert int(row.sum()) > 400  # the bands drawn about equally often
        ds = r.distance[row]
        assert len(set(ds.tolist())) >= min(9, (hi - lo) // size)  # many distances a band
        # the best single count back answers a band no better than 1 in 5 (with exact
        # distances, the same trick answers every query of a band)
        best = max(float((data[r.answers[row] - k] == targets[row]).float().mean())
                   for k in range(lo, hi + 1))
        assert best < 0.2, (lo, best)
    exact = recall_records(6000, [20, 60, 255], key=3, seed=seed)
    for d in (20, 60, 255):
        row = exact.distance == d
        assert bool((exact.data[exact.answers[row] - d] == exact.data[exact.answers[row]]).all())


@pytest.mark.parametrize("near", [0.5, 0.8])
def test_near_sets_the_nearest_bands_share_and_leaves_the_others_equal(near):
    edges = [16, 64, 256, 1024]
    r = recall_records(20_000, edges, key=1, seed=7, edges=True, near=near)
    bands = recall_bands(edges, 3)
    counts = [int(((r.distance >= lo) & (r.distance <= hi)).sum()) for lo, hi in bands]
    total = sum(counts)
    assert total == len(r.answers) > 5000
    # near is the share of the draws: a query whose slot is taken is dropped, and near slots
    # are taken more often, so the share asked is a little lower; not 1/3, as uniform gives
    assert near - 0.1 < counts[0] / total <= near, counts
    assert abs(counts[1] - counts[2]) / total < 0.05, counts  # the others share the rest
    for pos, d in zip(r.answers.tolist()[:2000], r.distance.tolist()[:2000]):  # still recall
        assert r.data[pos - 1] == ASK and r.data[pos - d - 1] == WRITE
        assert r.data[pos] == r.data[pos - d] and r.data[pos - 2] == r.data[pos - d - 2]
    assert_one_answer(r, 1, limit=2000)
    uniform = recall_records(20_000, edges, key=1, seed=7, edges=True)
    share = float(((uniform.distance <= bands[0][1]).float().mean()))
    assert share < counts[0] / total - 0.1  # near raised the nearest band's share
    for bad in ({"near": 0.5}, {"near": 1.0, "edges": True}, {"near": 0.0, "edges": True}):
        # edges 18, 66, 258 are two bands: only near's value is wrong in the last two
        with pytest.raises(ValueError, match="needs band edges, at least two bands and 0 < near"):
            recall_records(100, [18, 66, 258], key=1, **bad)


def test_a_band_is_marked_in_partly_in_or_out_of_reach_from_the_config():
    from minixl.kinds import KINDS
    from minixl.reach import unreachable

    # edges 256 and 1024 with items of 5 bytes: every query 260 to 1020 bytes back, so a
    # window of 256 reaches none of them (on the edges, it would look partly in reach)
    kind = KINDS["char"]
    config = kind.config(**{kind.length: 256})
    (low, high), = recall_bands([256, 1024], 5)
    far = unreachable(kind, config, [low])
    assert band_reach(low, high, 256, 64, far) == far[260] == (
        "a prediction reads at most 256 bytes back (a window of 256 bytes)")
    why = {256: "a prediction reads at most 128 bytes back (a window of 128 bytes)"}
    assert band_reach(256, 1023, 128, 32, why) == why[256]
    assert band_reach(64, 255, 128, 32, {}) == ("partly: the band runs to 255 bytes back, and "
                                                "a prediction reads at most 128")
    assert band_reach(16, 63, 128, 32, {}) == "yes"  # 63 <= 128 - 32 + 1
    assert band_reach(16, 120, 128, 32, {}).startswith("partly: read in segments of 32")
    assert band_reach(16, 63, None, 32, {}) == "not stated by its kind"


def test_the_stream_is_the_seeds_and_bad_settings_are_refused():
    a, b = recall_records(500, [8, 32], seed=4), recall_records(500, [8, 32], seed=4)
    assert torch.equal(a.data, b.data) and torch.equal(a.answers, b.answers)
    assert not torch.equal(a.data, recall_records(500, [8, 32], seed=5).data)
    with pytest.raises(ValueError, match="multiple of the item size, key \\+ 2 = 4 bytes"):
        recall_records(100, [16, 30])
    with pytest.raises(ValueError, match="keys of 1 byte\\(s\\) give 228 keys, too few for "
                       "the 228 pairs waiting for their query at item 228"):
        recall_records(3000, [3 * 600], key=1)  # about 300 writes wait 600 items each
    assert len(recall_records(3000, [3 * 600], key=2).answers) > 1000  # 51,984 keys suffice
    with pytest.raises(ValueError, match="n_items >= 2"):
        recall_records(1, [16])
    with pytest.raises(ValueError, match="at least two whole numbers of items"):
        recall_records(100, [16, 64, 68], key=3, edges=True)  # 64-67 holds one: 65
    with pytest.raises(ValueError, match="at least two positive distances"):
        recall_records(100, [16], key=3, edges=True)


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


def _starts(data: torch.Tensor, rows: torch.Tensor) -> list[int]:
    """Where each row of rows [B, T] lies in the stream data [N] (the first match)."""
    T = rows.shape[1]
    windows = data.long().unfold(0, T, 1)
    return [int(torch.nonzero((windows == row).all(1))[0]) for row in rows]


@pytest.mark.parametrize("kind_name", ["char", "xl"])
def test_answers_only_leaves_each_kinds_own_source_the_answers_alone(kind_name):
    """Random windows (char) and ordered streams with a memory (xl): the wrapped source gives
    the same inputs, and targets only where the target byte is an answer."""
    from minixl.kinds import KINDS
    from minixl.one_bench.recall import answers_only

    kind = KINDS[kind_name]
    r = recall_records(600, [8, 32], seed=4)
    config = kind.config(**{kind.length: 24})
    plain = kind.batches(r.data, 4, config, seed=2)
    wrapped = answers_only(kind.batches(r.data, 4, config, seed=2))
    mask = answer_mask(r)
    for step in (0, 1, 5):
        a, b = plain(step), wrapped(step)
        assert torch.equal(a.x, b.x) and a.reset_state == b.reset_state
        for row, y, start in zip(b.x, b.y, _starts(r.data, b.x)):
            answered = mask[start + 1:start + 1 + len(row)]
            assert bool(answered.any())
            assert torch.equal(y[answered], r.data[start + 1:start + 1 + len(row)][answered].long())
            assert bool((y[~answered] == -100).all())


def test_answers_only_passes_a_source_whose_targets_are_not_next_bytes():
    from minixl.data import Batch
    from minixl.one_bench.recall import answers_only

    r = recall_records(100, [8], seed=0)
    x = r.data[:64].long().view(2, 32)  # rows of the stream, each with answers in it
    direction = torch.tensor([1, -1])[:, None].expand(2, 32)  # XLNet's pretraining streams
    b = answers_only(lambda step: Batch(x, direction, True))(0)
    assert b.y is direction  # kept whole: its objective reads each row's direction there
    nxt = r.data[1:65].long().view(2, 32)
    assert bool((answers_only(lambda step: Batch(x, nxt, True))(0).y == -100).any())


def test_the_control_verdict_reads_the_control_arm_at_the_shortest_distance_at_each_length():
    from minixl.one_bench.recall import control_verdict

    def rows(by_length, arm="shaw"):
        out = []
        for length, accuracies in by_length.items():
            for seed, acc in enumerate(accuracies):
                for low, band, a in ((16, "16-63", acc), (64, "64-255", 0.04)):  # far: never
                    out.append({"arm": arm, "length": length, "seed": seed, "low": low,
                                "band": band, "accuracy": a})
        return out

    passed, said = control_verdict(rows({256: [0.97, 0.99, 0.96], 1024: [1.0, 0.95, 0.99]}))
    assert passed and said == ("positive control, shaw recalling 16-63 bytes back, accuracy 0.95 "
                               "in every seed: length 256: passed (0.960, 0.970, 0.990); "
                               "length 1024: passed (0.950, 0.990, 1.000)")
    passed, said = control_verdict(rows({256: [0.97, 0.99, 0.96], 1024: [0.04, 0.03, 0.99]}))
    assert not passed and "length 256: passed" in said
    assert ("length 1024: FAILED (0.030, 0.040, 0.990), so the run concludes nothing about "
            "reach at this length") in said
    passed, said = control_verdict(rows({256: [0.97, 0.90, 0.99]}))
    assert not passed and "length 256: FAILED (0.900, 0.970, 0.990)" in said
    passed, said = control_verdict(rows({256: [0.99]}, arm="char"))
    assert not passed and said.startswith("no positive control: the arm 'shaw' did not run")
    assert control_verdict(rows({256: [0.99]}, arm="char"), "char")[0]
    assert not control_verdict(rows({256: [0.99]}), control_accuracy=0.995)[0]


def _recall_row(arm, length, seed, low, high, accuracy, reachable="yes", cases=100):
    return {"arm": arm, "kind": arm, "length": length, "budget": 1e12, "seed": seed,
            "band": f"{low}-{high}", "low": low, "high": high, "cases": cases,
            "accuracy": accuracy, "reachable": reachable}


def test_the_decision_table_answers_exact_recall_from_the_recall_rows_its_control_first():
    from minixl.one_bench.bench_all import decisions
    from minixl.one_bench.recall import recall_need

    far = "a prediction reads at most 64 bytes back (a window of 64 bytes)"
    rows = []
    for seed, (a, b) in enumerate([(0.97, 0.50), (0.99, 0.60), (0.96, 0.55)]):
        rows += [_recall_row("shaw", 64, seed, 6, 30, a), _recall_row("xl", 64, seed, 6, 30, b),
                 _recall_row("shaw", 64, seed, 33, 63, 0.30),
                 _recall_row("xl", 64, seed, 33, 63, 0.80 + 0.01 * seed),
                 _recall_row("shaw", 64, seed, 66, 126, 0.04, far),
                 _recall_row("xl", 64, seed, 66, 126, 0.03 + 0.01 * seed),
                 _recall_row("shaw", 64, seed, 129, 255, 0.04, far),
                 _recall_row("xl", 64, seed, 129, 255, 0.05, "a prediction reads at most 128 "
                             "bytes back")]
    table = recall_need(rows)
    assert [r["need"] for r in table] == [
        "exact recall at a distance: positive control", *(
            f"exact recall at a distance: {b} bytes" for b in ("6-30", "33-63", "66-126",
                                                              "129-255"))]
    control, near, middle, beyond, none = table
    assert control["choice"] == "passed" and control["setting"] == (
        "recall task, budget 1e+12, length 64, 3 seeds, kernels: shaw, xl eager, FLOPs "
        "counted as kernel")
    assert control["reason"].endswith("length 64: passed (0.960, 0.970, 0.990)")
    assert near["choice"] == "shaw" and near["runner_up"] == "xl (0.550)"
    assert middle["choice"] == "xl" and middle["reason"] == "accuracy 0.810"
    assert middle["margin"] == pytest.approx(0.51)
    # reachable by xl alone, and xl at chance there: not learned, which is not "cannot"
    assert beyond["choice"].startswith("none learned it (the best, xl, is no better than "
                                       "chance")
    assert none["choice"] == "none can reach it" and none["reason"].endswith("at length 64")
    # one arm can reach a band: above chance by less than a guess's noise is not learned
    noisy = [dict(r, accuracy=0.06, cases=245) if r["arm"] == "xl" and r["low"] == 66 else r
             for r in rows]
    assert recall_need(noisy)[3]["choice"] == (
        "none learned it (the best, xl, is no better than chance, 0.038; the bar 0.063 adds "
        "two standard deviations of a guess over 245 answers)")
    learned = [dict(r, accuracy=0.2) if r["arm"] == "xl" and r["low"] == 66 else r
               for r in rows]
    assert recall_need(learned)[3]["choice"] == "only xl can reach it"
    # the control fails at the longer length: the rows are those of the length it passed at
    longer = [dict(r, length=256, accuracy=0.2 if r["arm"] == "shaw" else 0.9) for r in rows]
    table = recall_need(rows + longer)
    assert table[0]["choice"] == "passed at length 64 only"
    assert "length 256: FAILED" in table[0]["reason"]
    assert all(r["setting"].startswith("recall task, budget 1e+12, length 64,")
               for r in table)
    # failed everywhere: the control's row alone, for nothing else can be concluded
    table = recall_need(longer)
    assert len(table) == 1 and table[0]["choice"] == ("FAILED: the recall rows conclude "
                                                      "nothing")
    # a contestant that did not run is named; one seed names no winner
    one = recall_need([r for r in rows if r["seed"] == 0 and not (r["arm"] == "xl"
                                                                  and r["low"] == 6)])
    assert one[1]["choice"] == "only shaw measured"
    assert one[2]["choice"] == "no winner at this scale (one seed, no spread; best xl)"
    # in the decision table, the recall rows take the reach task's place
    quality = [{"arm": "xl", "length": 128, "budget": 1e12, "seed": 0, "common_bpc": 3.0,
                "own_protocol": "window", "own_bpc": 3.0}]
    reach = [{"arm": "xl", "length": 128, "budget": 1e12, "seed": 0, "band": "16-63",
              "low": 16, "cases": 10, "accuracy": 0.5, "reachable": "yes"}]
    with_reach = [r["need"] for r in decisions(quality, reach)]
    assert "exact recall at a distance: 16-63 bytes" in with_reach
    needs = [r["need"] for r in decisions(quality, reach, None, None, rows)]
    assert "exact recall at a distance: 16-63 bytes" not in needs
    start = needs.index("exact recall at a distance: positive control")
    assert needs[start:start + 5] == [r["need"] for r in recall_need(rows)]


def test_a_guess_s_noise_bar_lies_on_the_side_of_chance_that_counts_as_better():
    from minixl.one_bench.bench_all import _pick

    def pick(values, lower, cases):
        return _pick(values, lower=lower, what="x", unit="", chance=0.6, cases=cases)["choice"]

    # lower is better: 0.5 lies 2.04 sd below a chance of 0.6 over 100 answers (sd 0.049),
    # and 1.02 sd below it over 25 (sd 0.098): learned in the first case only
    assert pick({"a": [0.5, 0.5], "b": [0.9, 0.9]}, True, 100) == "a"
    assert pick({"a": [0.5, 0.5], "b": [0.9, 0.9]}, True, 25).startswith(
        "none learned it (the best, a, is no better than chance, 0.600; the bar 0.404 takes "
        "two standard deviations of a guess over 25 answers)")
    # higher is better: the mirror image
    assert pick({"a": [0.7, 0.7], "b": [0.1, 0.1]}, False, 100) == "a"
    assert pick({"a": [0.7, 0.7], "b": [0.1, 0.1]}, False, 25).startswith(
        "none learned it (the best, a, is no better than chance, 0.600; the bar 0.796 adds "
        "two standard deviations of a guess over 25 answers)")


def test_the_recall_rows_name_what_they_lack_and_the_control_the_run_stored():
    import json

    from minixl.one_bench.bench_all import decisions
    from minixl.one_bench.recall import recall_need

    assert recall_need([]) == [{
        "need": "exact recall at a distance: positive control", "setting": "",
        "choice": "FAILED: the recall rows conclude nothing",
        "reason": "no recall rows: bench_recall wrote none", "runner_up": "", "margin": None,
        "spread": None}]
    from minixl.one_bench.context import plot_context
    from minixl.one_bench.recall import plot_recall

    for plot, what in ((plot_recall, "bench_recall"), (plot_context, "bench_context")):
        with pytest.raises(ValueError, match=f"no rows to draw: {what} wrote none"):
            plot([], "unused.png")
    rows = []
    for seed in (0, 1):
        rows += [_recall_row("shaw", 64, seed, 6, 30, 0.97 + 0.01 * seed),
                 _recall_row("xl", 64, seed, 6, 30, 0.50),
                 _recall_row("shaw", 64, seed, 33, 63, 0.60 + 0.01 * seed),
                 _recall_row("xl", 64, seed, 33, 63, 0.30, cases=0),  # in reach, no answer
                 _recall_row("char", 128, seed, 6, 30, 0.3)]  # char ran at 128 only
    table = recall_need(rows)
    # xl can reach 33-63: shaw is the only one measured there, not the only one that can reach
    assert table[2]["choice"] == "only shaw measured"
    # a contestant absent from the whole length the rows are read at is named
    assert all(r["setting"].endswith(", 2 of 3 contestants (no char)") for r in table[1:])
    no_answers = [dict(r, cases=0) if r["low"] == 33 else r for r in rows]
    assert recall_need(no_answers)[2]["choice"] == "not measured"
    # the decision table judges the control that the run stored in its settings
    stored = [dict(r, settings=json.dumps({"control": "xl", "control_accuracy": 0.5}))
              for r in rows]
    quality = [{"arm": "xl", "length": 128, "budget": 1e12, "seed": 0, "common_bpc": 3.0,
                "own_protocol": "window", "own_bpc": 3.0}]
    control = next(r for r in decisions(quality, [], None, None, stored)
                   if r["need"].endswith("positive control"))
    assert control["choice"] == "passed" and control["reason"].startswith(
        "xl recalling 6-30 bytes back, accuracy 0.5 in every seed")
    control = next(r for r in decisions(quality, [], None, None, rows)  # none stored: shaw
                   if r["need"].endswith("positive control"))
    assert control["reason"].startswith("shaw recalling 6-30 bytes back, accuracy 0.95")


@pytest.mark.slow
def test_the_tiny_recall_bench_marks_reach_before_training_resumes_and_states_its_control(
        tmp_path):
    import csv
    import json
    import os
    import subprocess
    import sys
    from pathlib import Path

    from minixl.kinds import KINDS
    from minixl.one_bench.bench_all import contestants
    from minixl.one_bench.recall import RECALL_COLUMNS, plan_lengths, recall_need

    root = Path(__file__).resolve().parent.parent
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    out = tmp_path / "recall" / "recall.csv"
    tiny = ["bench_recall", "--budget", "1e9", "--params", "20000", "--seeds", "0",
            "--models", "char,shaw,xl", "--lengths", "32,64", "--shape-length", "32",
            "--distances", "8,16,64,128", "--batch-size", "4", "--train-bytes", "8192",
            "--eval-items", "100", "--csv", str(out)]

    def run(*extra):
        return subprocess.run([sys.executable, "-m", "minixl.experiments", *tiny, *extra],
                              capture_output=True, text=True, cwd=root, env=env, timeout=600)

    from minixl.experiments import write_csv

    write_csv([{"arm": "char", "length": 32, "budget": 1e9, "seed": 0, "common_bpc": 3.0,
                "own_protocol": "window", "own_bpc": 3.0}], tmp_path / "quality.csv")
    r = run()
    assert r.returncode == 0, r.stdout + r.stderr
    with open(out, newline="") as f:
        rows = list(csv.DictReader(f))
    assert tuple(rows[0]) == RECALL_COLUMNS
    assert {(json.loads(x["settings"])["control"], json.loads(x["settings"])["control_accuracy"])
            for x in rows} == {("shaw", 0.95)}  # stored: the decision table judges by it
    # beside a bench's quality.csv, the run rewrites its decision table with the recall rows
    table = (tmp_path / "decisions.md").read_text()
    assert "| exact recall at a distance: positive control | recall task, budget 1e+09" in table
    for need in recall_need(rows):  # the control's row; the bands' rows where it passed
        assert f"| {need['need']} | {need['setting']} | {need['choice']} |" in table
    assert (out.with_suffix(".png")).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert [(x["arm"], x["length"]) for x in rows[::3]] == [
        (a, n) for n in ("32", "64") for a in ("char", "shaw", "xl")]
    assert [x["band"] for x in rows[:3]] == ["9-15", "18-63", "66-126"]  # items of 3 bytes
    test = recall_records(100, [8, 16, 64, 128], key=1, seed=10_000, edges=True)
    for i in range(0, len(rows), 3):  # every answer of the held-out stream, in one band
        assert [int(x["cases"]) for x in rows[i:i + 3]] == [
            int(((test.distance >= lo) & (test.distance <= hi)).sum())
            for lo, hi in recall_bands([8, 16, 64, 128], 3)]
        assert sum(int(x["cases"]) for x in rows[i:i + 3]) == len(test.answers)
    plans = plan_lengths(contestants("char,shaw,xl"), [32, 64], budget=1e9, params=20000,
                         batch_size=4, shape_length=32)
    for x in rows:  # marked from the config, before training: by the kind's reach
        kind = KINDS[x["kind"]]
        most = kind.reach(plans[x["arm"], int(x["length"])].config)[0]
        assert int(x["reach"]) == most and int(x["steps"]) == plans[x["arm"], int(x["length"])].steps
        if int(x["low"]) > most:
            assert x["reachable"].startswith(f"a prediction reads at most {most} bytes back"), x
        else:
            assert x["reachable"] == "yes" or x["reachable"].startswith("partly"), x
    mark = {(x["arm"], x["length"], x["band"]): x["reachable"] for x in rows}
    assert mark["char", "32", "66-126"] == ("a prediction reads at most 32 bytes back (a window "
                                            "of 32 bytes)")
    assert mark["shaw", "64", "9-15"] == "yes"
    assert mark["shaw", "64", "18-63"].startswith("partly: read in segments of 16")
    assert mark["char", "32", "18-63"] == ("partly: the band runs to 63 bytes back, and a "
                                           "prediction reads at most 32")
    assert r.stdout.count("bench_recall [") == 6
    verdict = [line for line in r.stdout.splitlines() if line.startswith("bench_recall: positive")]
    assert len(verdict) == 1 and verdict[0].startswith(
        "bench_recall: positive control, shaw recalling 9-15 bytes back, accuracy 0.95 in every "
        "seed: length 32: ")
    assert "; length 64: " in verdict[0]
    again = run()  # every point written: nothing trains again, the same rows come back
    assert again.returncode == 0 and "bench_recall [" not in again.stdout
    with open(out, newline="") as f:
        assert list(csv.DictReader(f)) == rows
    bad = run("--control", "segtree")
    assert bad.returncode == 2 and "--control 'segtree' is not among the contestants" in bad.stderr
    short = run("--lengths", "16,32")
    assert short.returncode == 2 and "each length must be at least 32 bytes, got 16" in short.stderr
    other = run("--lr", "1e-3")  # the folder holds a run of other settings: refused, named
    assert other.returncode == 2 and "delete its folder's recall.csv to start over" in other.stderr
    kernel = run("--flop-policy", "kernel")  # a causal run (the default) never goes on under
    assert kernel.returncode == 2 and '"flop_policy": "causal"' in kernel.stderr  # another count
    assert "--flop-policy: invalid choice: 'half'" in run("--flop-policy", "half").stderr


@pytest.mark.slow
def test_a_run_under_the_causal_flop_policy_says_so_and_buys_a_dense_arm_more_steps(tmp_path):
    import csv
    import json
    import os
    import subprocess
    import sys
    from pathlib import Path

    from minixl.one_bench.bench_all import contestants
    from minixl.one_bench.recall import plan_lengths

    out = tmp_path / "recall.csv"
    r = subprocess.run([sys.executable, "-m", "minixl.experiments", "bench_recall", "--budget",
                        "3e8", "--params", "20000", "--seeds", "0", "--models", "shaw",
                        "--lengths", "32", "--shape-length", "32", "--distances", "8,16,64",
                        "--batch-size", "4", "--train-bytes", "8192", "--eval-items", "50",
                        "--flop-policy", "causal", "--csv", str(out)],
                       capture_output=True, text=True, cwd=Path(__file__).resolve().parent.parent,
                       env={**os.environ, "OMP_NUM_THREADS": "1"}, timeout=600)
    assert r.returncode == 0, r.stdout + r.stderr
    with open(out, newline="") as f:
        rows = list(csv.DictReader(f))
    assert {json.loads(x["settings"])["flop_policy"] for x in rows} == {"causal"}
    plan = {policy: plan_lengths(contestants("shaw"), [32], budget=3e8, params=20000,
                                 batch_size=4, shape_length=32, flop_policy=policy)
            for policy in ("kernel", "causal")}
    steps = {policy: plan[policy]["shaw", 32].steps for policy in plan}
    assert {int(x["steps"]) for x in rows} == {steps["causal"]}
    assert steps["causal"] > steps["kernel"]  # the masked half of each window not charged


@pytest.mark.slow  # the planner's width search: over 1.5 s
def test_each_contestant_is_one_model_at_every_length_with_the_steps_its_budget_buys():
    from minixl.one_bench.bench_all import contestants
    from minixl.one_bench.recall import plan_lengths
    from minixl.planner import FLOPS_TOLERANCE, plan_bench

    arms = contestants("char,shaw")
    plans = plan_lengths(arms, [64, 256], budget=1e11, params=30_000, batch_size=4,
                         shape_length=64)
    sized = {r.arm: r for r in plan_bench(budget=1e11, params=30_000, length=64,
                                          batch_size=4, arms=arms)}
    for arm in arms:
        short, long = plans[arm, 64], plans[arm, 256]
        assert short.config == sized[arm].config and short.steps == sized[arm].steps
        assert (long.config.d_model, long.config.n_layer) == (short.config.d_model,
                                                               short.config.n_layer)
        assert long.config.block_size == 256 and long.length == 256
        assert abs(long.flops_off) <= FLOPS_TOLERANCE and long.steps < short.steps
        assert long.train_flops == long.steps * long.flops_per_byte * 4 * 256
    # Shaw's relative tables do not grow with the window; Chapter 1's position tables do
    assert plans["shaw", 256].params == plans["shaw", 64].params
    assert plans["char", 256].params > plans["char", 64].params
