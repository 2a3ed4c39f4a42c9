"""The bench's cost against length (`python -m minixl.experiments bench_cost`), as a user runs
it: every point's row, the memory of a training step growing as its model's attention says
it should, a point over the memory cap written as not fitting (the run goes on), and the
decision table's generation and memory rows from these rows."""

import csv
import os
import subprocess
import sys
from pathlib import Path

import pytest

from minixl.one_bench.bench_cost import COST_COLUMNS

ROOT = Path(__file__).resolve().parent.parent
ENV = {**os.environ, "OMP_NUM_THREADS": "1"}


def _read(path: Path) -> list[dict]:
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


def _cost(out: Path, *args: str) -> subprocess.CompletedProcess:
    r = subprocess.run([sys.executable, "-m", "minixl.experiments", "bench_cost", *args,
                        "--csv", str(out)], capture_output=True, text=True, cwd=ROOT,
                       env=ENV, timeout=900)
    assert r.returncode == 0, r.stdout + r.stderr
    return r


@pytest.mark.slow
def test_cost_rows_and_memory_that_grows_with_the_attention(tmp_path):
    """Shaw's training step keeps an n x n x d table of relative vectors per layer, the
    SegTree model's edges grow like n log n: at four times the length Shaw's step adds more
    than four times the memory, and at 1,024 bytes the SegTree step adds less than a third of
    Shaw's. Every point fits, has its segment (a quarter of a window; XL reads in segments
    of the shape length, 128 here, with a memory as long as the text) and its kernel, and
    times."""
    out = tmp_path / "cost.csv"
    _cost(out, "--lengths", "256,1024", "--models", "shaw,xl,segtree", "--rounds", "2",
          "--gen-bytes", "2", "--shape-length", "128")
    rows = _read(out)
    assert tuple(rows[0]) == COST_COLUMNS
    assert [(r["arm"], r["length"]) for r in rows] == [
        (a, n) for n in ("256", "1024") for a in ("shaw", "xl", "segtree")]
    got = {(r["arm"], int(r["length"])): r for r in rows}
    for (arm, n), r in got.items():
        assert r["fits"] == "True" and r["note"] == "" and r["rounds"] == "2", r
        assert int(r["segment"]) == (128 if arm == "xl" else n // 4)
        assert int(r["train_segment"]) == (128 if arm == "xl" else n)
        assert int(r["memory"]) == (n if arm == "xl" else 0)
        for what in ("train", "read", "generate"):
            assert float(r[f"{what}_ms_per_byte"]) > 0, r
    assert got["shaw", 256]["kernel"].startswith("eager: the n x n scores")
    assert "no key/value cache" in got["segtree", 1024]["kernel"]
    assert "a memory of 1024 states" in got["xl", 1024]["kernel"]
    assert "cached keys and values" in got["xl", 1024]["kernel"]
    mb = {k: float(r["train_peak_mb"]) for k, r in got.items()}
    assert mb["shaw", 1024] > 4 * mb["shaw", 256], mb
    assert mb["segtree", 1024] < mb["shaw", 1024] / 3, mb
    # XL's step is a segment of 128 over its memory: at four times the text its scores grow
    # from 128 x 384 to 128 x 1,152 keys, not from 256 x 512 to 1,024 x 2,048
    assert mb["xl", 1024] < 4 * mb["xl", 256], mb


@pytest.mark.slow
def test_xl_reads_a_text_too_long_for_one_window_in_segments(tmp_path):
    """Under a cap that one window of the text does not fit in (Shaw's step at 2,048 bytes
    writes 2,048 x 2,048 weights and more per head and layer), XL, reading the same text in
    segments of 64 with its memory filled to 2,048 states, fits; the control arm (XL with no
    memory) comes only when named."""
    out = tmp_path / "cost.csv"
    r = _cost(out, "--lengths", "2048", "--models", "shaw,xl", "--rounds", "1",
              "--gen-bytes", "1", "--shape-length", "64", "--params", "20000",
              "--memory-limit-gb", "0.4")
    got = {row["arm"]: row for row in _read(out)}
    assert got["shaw"]["fits"] == "False" and got["shaw"]["note"].startswith("does not fit"), got
    assert got["xl"]["fits"] == "True", got
    assert (int(got["xl"]["segment"]), int(got["xl"]["memory"])) == (64, 2048)
    assert "bench_cost memory: xl at 2048:" in r.stdout


def test_the_cost_sweep_leaves_the_control_arms_out_unless_named():
    from minixl.one_bench.bench_all import contestants
    from minixl.one_bench.bench_cost import cost_arms

    every = list(contestants(None))
    assert "xl-nomem" in every and "xl" in every
    assert cost_arms() == [a for a in every if a != "xl-nomem"]
    assert cost_arms("xl-nomem,char") == ["xl-nomem", "char"]
    assert "xl-nomem" in cost_arms("xl,xl-nomem")


def test_a_length_that_is_not_whole_segments_is_refused_before_anything_runs(tmp_path):
    """XL reads a long text in segments of --shape-length; a length that ends in part of one
    is refused up front, naming the arm, the length and what to give (a window model, which
    reads one window, is not)."""
    from minixl.one_bench.bench_cost import bench_cost

    out = tmp_path / "cost.csv"
    with pytest.raises(ValueError, match=r"xl at 1000 would end in part of one: give lengths "
                                         r"that are multiples of 256"):
        bench_cost(lengths="256,1000", shape_length=256, models="shaw,xl", csv=str(out))
    assert not out.exists()


def test_a_default_sweep_writes_the_table_again_over_a_bench_with_its_control_arm():
    """A bench run has xl-nomem's rows; the default sweep leaves that control out, and must
    not count it missing (else it never writes the table again), while a contestant it does
    not run is still missing."""
    from minixl.one_bench.bench_cost import cost_arms, left_out

    quality = [{"arm": a} for a in ("char", "shaw", "xl", "xl-nomem", "segtree")]
    swept = cost_arms()
    assert "xl-nomem" not in swept
    assert left_out(quality, swept) == []
    assert left_out(quality, [a for a in swept if a != "shaw"]) == ["shaw"]


@pytest.mark.slow
def test_a_point_over_the_memory_cap_is_written_as_not_fitting(tmp_path):
    """A cap too small for the step (a real allocation failing in a fresh process): the
    point says it does not fit and what failed, it gets no times, the run exits 0."""
    out = tmp_path / "cost.csv"
    r = _cost(out, "--lengths", "512", "--models", "shaw", "--rounds", "1",
              "--memory-limit-gb", "0.01")
    (row,) = _read(out)
    assert row["fits"] == "False" and row["note"].startswith("does not fit in 0.01 GiB: "), row
    assert row["train_peak_mb"] == row["train_ms_per_byte"] == row["segment"] == ""
    assert "bench_cost memory: shaw at 512: does not fit" in r.stdout


def _c(arm, length, mb=None, gen=None, slow=None, fits=True, rounds=2):
    return {"arm": arm, "length": str(length), "fits": str(fits),
            "train_peak_mb": "" if mb is None else str(mb),
            "generate_ms_per_byte": "" if gen is None else str(gen),
            "generate_ms_slowest": "" if slow is None else str(slow), "rounds": str(rounds)}


def test_the_decision_table_reads_generation_and_memory_from_the_cost_rows():
    from minixl.one_bench.bench_all import NEEDS, decisions

    quality = [{"arm": "a", "length": "32", "budget": "1e9", "seed": "0",
                "own_protocol": "all-positions", "own_bpc": "2", "common_bpc": "2"}]
    cost = [_c("a", 16384, mb=100, gen=5.0, slow=5.5), _c("b", 16384, mb=300, gen=1.0, slow=1.2),
            _c("c", 16384, fits=False), _c("d", 16384, mb=105, gen=9, slow=9.9),
            _c("a", 4096, mb=50, gen=2.0, slow=2.1)]
    table = {r["need"]: r for r in decisions(quality, [], cost)}
    memory, generation = table[NEEDS[5]], table[NEEDS[4]]
    # a adds 100 MB, d 105: within 10 %, no winner; c does not fit and is named
    assert memory["choice"].startswith("no winner at this scale (best a, within 10%")
    assert memory["runner_up"] == "d (105 MB)" and memory["margin"] == 5
    assert "does not fit: c" in memory["reason"]
    memory = {r["need"]: r for r in decisions(quality, [], cost[:3])}[NEEDS[5]]
    assert memory["choice"] == "a" and memory["runner_up"] == "b (300 MB)"
    # generation where the most arms were timed (3 at 16384): b's slowest round (1.2) beats
    # a's fastest
    assert generation["choice"] == "b" and generation["setting"].startswith("after 16384")
    # an arm too big to train at 16384 is not timed there: the comparison moves to 4096
    more = [_c(a, 4096, mb=1, gen=g, slow=g) for a, g in (("b", 3.0), ("c", 0.5), ("d", 4))]
    generation = {r["need"]: r for r in decisions(quality, [], cost + more)}[NEEDS[4]]
    assert generation["choice"] == "c" and generation["setting"].startswith("after 4096")
    close = [_c("a", 16384, gen=1.0, slow=1.5), _c("b", 16384, gen=1.2, slow=1.3)]
    generation = {r["need"]: r for r in decisions(quality, [], close)}[NEEDS[4]]
    assert generation["choice"].startswith("no winner at this scale (best a")
    one = [_c("a", 16384, gen=1.0, slow=1.0, rounds=1), _c("b", 16384, gen=2.0, slow=2.0,
                                                            rounds=1)]
    generation = {r["need"]: r for r in decisions(quality, [], one)}[NEEDS[4]]
    assert generation["choice"] == "no winner at this scale (one round, no spread; best a)"
    short = {r["need"]: r for r in decisions(quality, [], cost[-1:])}
    assert short[NEEDS[5]]["choice"] == "not measured"
    assert "did not measure 16384 bytes" in short[NEEDS[5]]["reason"]
    # measured at 16384 and beyond: the row is read at 16384, not at the longest length
    longer = cost + [_c("a", 32768, fits=False), _c("b", 32768, mb=900)]
    memory = {r["need"]: r for r in decisions(quality, [], longer)}[NEEDS[5]]
    assert memory["setting"].startswith("training steps, one row of 16384 bytes")
    assert memory["runner_up"] == "d (105 MB)"
    # the generation row: each arm's fastest round, the margin between them
    assert generation["reason"] == "1.000 ms per generated byte (fastest round)"
    # a memory model read in segments is named in the setting, a window model is not
    cost[1].update(segment="256", memory="16384")
    memory = {r["need"]: r for r in decisions(quality, [], cost)}[NEEDS[5]]
    assert memory["setting"] == ("training steps, one row of 16384 bytes, a fresh process "
                                 "each (b in segments of 256 with a memory of 16384), "
                                 "untrained weights on random bytes (no corpus; the learning "
                                 "rate does not change a cost)")
    # rows with the training segment: every arm trained in segments shorter than the text
    # is named, with its memory or none (not only those with a memory); a window arm is not
    for r in cost:
        r["train_segment"] = str(r["length"])
    cost[1].update(train_segment="256", segment="64", memory="16384")
    cost[3].update(train_segment="256", segment="256", memory="0")
    memory = {r["need"]: r for r in decisions(quality, [], cost)}[NEEDS[5]]
    assert memory["setting"].startswith(
        "training steps, one row of 16384 bytes, a fresh process each (b in segments of 256 "
        "with a memory of 16384; d in segments of 256, no memory), "), memory["setting"]


def test_the_cost_rows_name_their_conditions_sizes_machine_and_kernels():
    """The generation and memory rows state what they ran: each arm's depth x width and
    parameters at that length, the threads, machine and torch, each arm's kernel (its first
    clause), and for generation which arms' one-byte calls read cached keys and values."""
    from minixl.one_bench.bench_all import NEEDS, decisions

    quality = [{"arm": "a", "length": "32", "budget": "1e9", "seed": "0",
                "own_protocol": "all-positions", "own_bpc": "2", "common_bpc": "2"}]
    ran = {"threads": "1", "cpus": "2", "machine": "x86_64", "torch": "2.13.0+cpu"}
    cost = [{**_c("a", 16384, mb=100, gen=5.0, slow=5.5), **ran, "shape": "4 x 52",
             "params": "3553784", "kernel": "fused causal (sdpa); a one-byte call reads its "
                                            "window again (no key/value cache)"},
            {**_c("b", 16384, mb=300, gen=1.0, slow=1.2), **ran, "shape": "4 x 60",
             "params": "205456", "kernel": "eager: scores written out; a one-byte call reads "
                                           "the memory's cached keys and values"},
            {**_c("c", 16384, mb=200, gen=9.0, slow=9.5), **ran, "shape": "4 x 60",
             "params": "194160", "kernel": "eager: the n x n scores; reads its window again"}]
    table = {r["need"]: r["setting"] for r in decisions(quality, [], cost)}
    conditions = (", untrained weights on random bytes (no corpus; the learning rate does not "
                  "change a cost), depth x width (parameters at this length) a 4 x 52 "
                  "(3,553,784), b 4 x 60 (205,456), c 4 x 60 (194,160), 1 thread of 2 cores, "
                  "an x86_64 CPU, torch 2.13.0+cpu, kernels: a fused causal; b, c eager")
    assert table[NEEDS[5]] == ("training steps, one row of 16384 bytes, a fresh process each"
                               + conditions)
    assert table[NEEDS[4]] == ("after 16384 bytes, one byte a call, 2 rounds" + conditions
                               + ", a one-byte call: b reads cached keys and values; a, c "
                                 "read their windows again")
    for r in cost:
        r["threads"] = "2"
    assert ", 2 threads of 2 cores, an x86_64 CPU," in decisions(quality, [], cost)[-1][
        "setting"]
    cost[0]["threads"] = "1"  # points run at other thread counts: each is named
    assert ", 1/2 threads of 2 cores," in decisions(quality, [], cost)[-1]["setting"]
