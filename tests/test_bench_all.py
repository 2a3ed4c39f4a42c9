"""The bench of every mechanism (`python -m minixl.experiments bench_all`): every contestant
through the planner, both readings and the reach task at a tiny setting, as a user runs it;
a run stopped by Ctrl-C goes on from the points it wrote and ends where an unstopped one
does; a folder of another run is refused."""

import csv
import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from minixl.one_bench.bench_all import (QUALITY_COLUMNS, REACH_COLUMNS, bench_all,
                                          contestants, read_left_to_right)
from minixl.kinds import KINDS
from minixl.planner import FLOPS_TOLERANCE, PARAMS_TOLERANCE

ROOT = Path(__file__).resolve().parent.parent
HERE = Path(__file__).resolve().parent
TINY = ["--budgets", "1e9", "--params", "20000", "--lengths", "32", "--distances", "16,64",
        "--batch-size", "4", "--eval-bytes", "1024", "--reach-eval", "10"]
ENV = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": os.pathsep.join(
    [str(HERE)] + os.environ.get("PYTHONPATH", "").split(os.pathsep))}


def _read(path: Path) -> list[dict]:
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


def _bench(out: Path, *extra: str, code: int = 0) -> subprocess.CompletedProcess:
    r = subprocess.run([sys.executable, "-m", "minixl.experiments", "bench_all", *TINY,
                        "--csv", str(out / "quality.csv"), *extra],
                       capture_output=True, text=True, cwd=ROOT, env=ENV, timeout=600)
    assert r.returncode == code, r.stdout + r.stderr
    return r


@pytest.mark.slow  # over 1.5 s: the quick loop stays well under a minute
def test_the_tiny_bench_runs_every_contestant_through_both_readings_and_the_reach_task(
        tmp_path):
    out = tmp_path / "bench"
    r = _bench(out, "--seeds", "0", "--models", "char,char+aux,shaw,xl,xlnet,segtree,bpt,"
               "test_plugin:BIGRAM")
    arms = ["char", "char+aux", "shaw", "xl", "xlnet", "segtree", "bpt", "bigram"]
    plan, quality, reach = (_read(out / f) for f in ("plan.csv", "quality.csv", "reach.csv"))
    assert tuple(quality[0]) == QUALITY_COLUMNS and tuple(reach[0]) == REACH_COLUMNS
    assert [p["arm"] for p in plan] == [q["arm"] for q in quality] == arms
    assert r.stdout.count("bench_all [") == 2 * len(arms)  # a progress line per point
    for p in plan:
        if p["arm"] == "bigram":  # no width to size: said, and not claimed matched
            assert "no d_model and n_head fields" in p["why"]
            continue
        assert p["matched"] == "True", p
        assert abs(float(p["params_off"])) <= PARAMS_TOLERANCE
        assert abs(float(p["flops_off"])) <= FLOPS_TOLERANCE
    for q in quality:
        assert 0 < float(q["own_bpc"]) < 9 and 0 < float(q["common_bpc"]) < 9, q
    assert {q["arm"]: q["own_protocol"] for q in quality}["xl"] == "memory"
    assert {q["arm"]: q["own_protocol"] for q in quality}["xlnet"] == "infill"
    for arm in arms:
        rows = [x for x in reach if x["arm"] == arm]
        assert [x["band"] for x in rows] == ["16-63", "64"]
        assert sum(int(x["cases"]) for x in rows) == 10 * 6
        segment = 32 if arm == "xl" else 8  # its memory's segment, or a quarter window
        for x in rows:  # marked from the config, before training: by the kind's reach
            assert 0 <= float(x["accuracy"]) <= 1 and float(x["bits"]) > 0
            if arm == "bigram":
                assert x["reachable"] == "not stated by its kind" and x["reach"] == ""
                continue
            most, d = int(x["reach"]), int(x["low"])
            if d <= most - segment + 1:
                assert x["reachable"] == "yes", x
            elif d <= most:
                assert x["reachable"].startswith("partly: read in segments of "), x
            else:
                assert x["reachable"].startswith("a prediction reads at most "), x
    marks = {x["arm"]: x["reachable"] for x in reach if x["band"] == "64"}
    assert marks["xl"] == "yes"  # 4 layers of memory reach 64 bytes back; a window of 32 not
    assert marks["char"] == "a prediction reads at most 32 bytes back (a window of 32 bytes)"
    table = _read(out / "decisions.csv")  # written from the CSVs at the end of the run
    assert [r["need"] for r in table][:3] == ["best bpc at fixed compute",
                                              "long context on a small budget", "infilling"]
    assert table[0]["choice"].startswith("no winner at this scale (one seed, no spread")
    assert "| need | measured on | use |" in (out / "decisions.md").read_text()
    [run] = _read(out / "runs.csv")  # what ran, how long, on what
    assert int(run["points_run"]) == 2 * len(arms) and run["torch"] == torch.__version__
    assert float(run["seconds"]) > 0 and run["threads"] == "1"
    assert (out / "bench.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


@pytest.mark.slow
def test_a_stopped_bench_goes_on_from_the_points_it_wrote(tmp_path):
    """Ctrl-C in the middle of the fourth point's training (a real SIGINT, sent by the
    process to itself at a fixed batch): it says where it stopped and exits 130; the same
    command then runs only the points that are not written, and every row equals an
    unstopped run's."""
    whole, part = tmp_path / "whole", tmp_path / "part"
    models = ["--models", "char,xl", "--seeds", "0,1"]
    _bench(whole, *models)
    stop = """if True:
        import os, signal, sys
        # Ctrl-C as at a terminal: a test runner started in the background (&, nohup) hands
        # its children SIGINT ignored, and the interpreter then installs no KeyboardInterrupt
        signal.signal(signal.SIGINT, signal.default_int_handler)
        from minixl import data
        calls = [0]
        for cls in (data.RandomWindows, data.OrderedStreams):
            def call(self, i, real=cls.__call__):
                calls[0] += 1
                if calls[0] == int(sys.argv[1]):
                    os.kill(os.getpid(), signal.SIGINT)
                return real(self, i)
            cls.__call__ = call
        from minixl.experiments import main
        sys.exit(main(sys.argv[2:]))
    """
    steps = [int(p["steps"]) for p in _read(whole / "plan.csv")]  # char, xl
    at = steps[0] + steps[1] + steps[0] + steps[1] // 2  # inside the fourth point
    r = subprocess.run([sys.executable, "-c", stop, str(at), "bench_all", *TINY, *models,
                        "--csv", str(part / "quality.csv")],
                       capture_output=True, text=True, cwd=ROOT, env=ENV, timeout=600)
    assert r.returncode == 130, r.stdout + r.stderr
    assert f"bench_all: stopped; 3 of 8 points are written in {part}" in r.stderr
    assert "Traceback" not in r.stderr
    assert len(_read(part / "quality.csv")) == 3
    r = _bench(part, *models)
    assert [line.split("]")[0] for line in r.stdout.splitlines()
            if line.startswith("bench_all [")] == [f"bench_all [{i}/8" for i in range(4, 9)]
    assert [int(x["points_run"]) for x in _read(part / "runs.csv")] == [5]
    for name in ("quality.csv", "reach.csv"):
        drop = {"train_seconds"}  # the only column that is not a function of the settings
        a = [{k: v for k, v in row.items() if k not in drop} for row in _read(whole / name)]
        b = [{k: v for k, v in row.items() if k not in drop} for row in _read(part / name)]
        assert a == b, name


@pytest.mark.slow
def test_runs_made_apart_and_merged_equal_one_run(tmp_path):
    """One process per arm and seed (as on a GPU with room for many), merged by merge_runs:
    the same plan, quality and reach rows as one process running them all (train_seconds
    aside), the same decision table, a runs.csv row per process; the same folder given twice
    and a folder of other settings are refused."""
    from minixl.one_bench.bench_all import merge_runs

    whole = tmp_path / "whole"
    _bench(whole, "--models", "char,xl", "--seeds", "0,1")
    parts = []
    for arm in ("xl", "char"):  # not in the bench's order: the merge puts them back in it
        for seed in ("1", "0"):
            parts.append(tmp_path / f"{arm}_{seed}")
            _bench(parts[-1], "--models", arm, "--seeds", seed)
    merged = tmp_path / "merged"
    merge_runs(parts, merged)
    drop = {"train_seconds"}
    for name in ("plan.csv", "quality.csv", "reach.csv", "decisions.csv"):
        a = [{k: v for k, v in row.items() if k not in drop} for row in _read(whole / name)]
        b = [{k: v for k, v in row.items() if k not in drop} for row in _read(merged / name)]
        assert a == b, name
    assert (whole / "decisions.md").read_text() == (merged / "decisions.md").read_text()
    assert sorted(r["folder"] for r in _read(merged / "runs.csv")) == sorted(map(str, parts))
    assert (merged / "bench.png").exists()
    with pytest.raises(ValueError, match=r"is in two folders .*its own arms or seeds"):
        merge_runs([parts[0], parts[0]], tmp_path / "twice")
    other = tmp_path / "other"
    _bench(other, "--models", "shaw", "--seeds", "0", "--lr", "0.001")
    with pytest.raises(ValueError, match="run with different settings"):
        merge_runs([parts[0], other], tmp_path / "mixed")
    budget = tmp_path / "budget"
    _bench(budget, "--models", "shaw", "--seeds", "0", "--budgets", "2e9")
    with pytest.raises(ValueError, match="run at different lengths or budgets"):
        merge_runs([parts[0], budget], tmp_path / "budgets")
    with pytest.raises(ValueError, match="holds no quality.csv rows"):
        merge_runs([parts[0], tmp_path / "nothing"], tmp_path / "empty")


@pytest.mark.slow
def test_the_reach_task_alone(tmp_path):
    """--reach-only trains and scores the reach task only: reach.csv (named by --csv) with a
    row per contestant, seed and band, no held-out text read, the table and figure beside; a
    --csv not called reach.csv is refused before anything runs."""
    out = tmp_path / "control"
    r = subprocess.run([sys.executable, "-m", "minixl.experiments", "bench_all", *TINY,
                        "--models", "char,xl", "--seeds", "0", "--reach-only",
                        "--csv", str(out / "reach.csv")],
                       capture_output=True, text=True, cwd=ROOT, env=ENV, timeout=600)
    assert r.returncode == 0, r.stdout + r.stderr
    rows = _read(out / "reach.csv")
    assert [(x["arm"], x["band"]) for x in rows] == [(a, b) for a in ("char", "xl")
                                                     for b in ("16-63", "64")]
    assert r.stdout.splitlines()[-1] == f"4 rows written to {out / 'reach.csv'}"
    assert not (out / "quality.csv").exists()
    assert (out / "decisions.md").exists() and (out / "bench.png").exists()
    assert "| best bpc at fixed compute |  | not measured | no quality rows |" in \
        (out / "decisions.md").read_text()
    r = subprocess.run([sys.executable, "-m", "minixl.experiments", "bench_all", *TINY,
                        "--reach-only", "--csv", str(tmp_path / "quality.csv")],
                       capture_output=True, text=True, cwd=ROOT, env=ENV, timeout=600)
    assert r.returncode == 2 and "with --reach-only, --csv names the reach task's CSV" in \
        r.stderr, r.stderr


def test_a_folder_of_another_run_is_refused(tmp_path):
    out = tmp_path / "bench"
    out.mkdir()
    (out / "quality.csv").write_text("arm,length,seed,settings\nchar,32,0,\"{\"\"lr\"\": 1}\"\n")
    with pytest.raises(ValueError, match=r"holds a run with other settings .*give another "
                                         r"--csv, or delete its folder's plan.csv"):
        bench_all(budgets="1e9", params=20000, seeds="0", models="char", lengths="32",
                  distances="16", csv=str(out / "quality.csv"))
    (out / "quality.csv").write_text("arm,length,seed\nchar,32,0\n")
    with pytest.raises(ValueError, match="is not a file bench_all wrote"):
        bench_all(budgets="1e9", params=20000, seeds="0", models="char", lengths="32",
                  distances="16", csv=str(out / "quality.csv"))


def test_the_contestants_are_named_by_arm_kind_or_module():
    assert list(contestants("xl,bpt")) == ["xl", "bpt"]
    assert list(contestants("char")) == ["char"]  # an arm's name first
    assert list(contestants()) == [a for k in KINDS.values() for a in k.bench_arms]
    with pytest.raises(ValueError, match="--models: 'gpt' is neither a bench arm"):
        contestants("char,gpt")


def test_reading_left_to_right_is_each_byte_from_what_came_before():
    """The common protocol on a window model read in segments of s: the byte after position
    t - 1 is predicted from the window that ends with t - 1's segment, which keeps n - s
    earlier bytes (all of them near the start; more before a shorter last segment): checked
    against the model run by hand on exactly those bytes, for every byte (the bits) and at
    the asked positions (the log-probabilities)."""
    from conftest import tiny_model

    model = tiny_model("char").eval()
    n = model.config.block_size
    s = n // 4
    data = torch.randint(256, (3 * n + 3,), generator=torch.Generator().manual_seed(0))
    answers = torch.tensor([1, n, 2 * n + 5, 3 * n + 2])
    bits, logp = read_left_to_right(model, data, segment=s, answers=answers)
    with torch.no_grad():
        by_hand = []
        for t in range(1, len(data)):
            start = (t - 1) // s * s  # the segment that holds byte t - 1
            keep = min(start, n - min(s, len(data) - start))  # the last may be shorter
            by_hand.append(model(data[start - keep:t].long()[None])[0, -1].log_softmax(-1))
    by_hand = torch.stack(by_hand)
    nll = -by_hand.gather(1, data[1:].long()[:, None]).mean().item() / math.log(2)
    assert bits == pytest.approx(nll, rel=1e-5)
    torch.testing.assert_close(logp, by_hand[answers - 1], atol=1e-5, rtol=1e-5)
    with pytest.raises(ValueError, match="need segment >= 1 and at least 2 bytes"):
        read_left_to_right(model, data[:1], segment=s)
    with pytest.raises(ValueError, match="answers must be increasing positions in 1.."):
        read_left_to_right(model, data, segment=s, answers=torch.tensor([5, 3]))


def test_a_plan_that_changed_since_the_rows_were_written_is_refused(tmp_path):
    """The same settings but another plan (a kind's definition changed): the old rows are
    not mixed with new ones."""
    from minixl.one_bench.bench_all import _settings

    settings = _settings(params=20000, batch_size=8, eval_bytes=32768,
                         reach_eval=200, lr=2e-3, distances=[16])
    quoted = settings.replace('"', '""')
    (tmp_path / "plan.csv").write_text(
        f'arm,length,budget,params,steps,settings\nchar,32,1e9,1,1,"{quoted}"\n')
    with pytest.raises(ValueError, match="the plan of char at length 32 and budget 1e.09 has "
                                         "changed since"):
        bench_all(budgets="1e9", params=20000, seeds="0", models="char", lengths="32",
                  distances="16", csv=str(tmp_path / "quality.csv"))


def test_reach_under_the_common_protocol_is_yes_partly_or_no():
    from minixl.one_bench.bench_all import _reachable

    far = {300: "a prediction reads at most 256 bytes back (a window of 256 bytes)"}
    assert _reachable(16, 256, 64, far) == "yes"
    assert _reachable(193, 256, 64, far) == "yes"  # the first byte of a segment reads 193
    assert _reachable(194, 256, 64, far).startswith("partly: read in segments of 64, a "
                                                    "prediction early in its segment reads "
                                                    "as few as 193 bytes back")
    assert _reachable(256, 256, 64, far).startswith("partly")
    assert _reachable(300, 256, 64, far) == far[300]
    assert _reachable(300, None, 64, {}) == "not stated by its kind"


def _q(arm, seed, bpc, budget=1e9, protocol="all-positions"):
    return {"arm": arm, "length": "32", "budget": str(budget), "seed": str(seed),
            "own_protocol": protocol, "own_bpc": str(bpc), "common_bpc": str(bpc)}


def _r(arm, seed, accuracy, low=16, reachable="yes", budget="1e9"):
    return {"arm": arm, "length": "32", "budget": budget, "seed": str(seed), "band": str(low),
            "low": str(low), "cases": "60", "accuracy": str(accuracy), "reachable": reachable}


def test_the_decision_table_names_a_winner_only_outside_the_seeds_spread():
    from minixl.one_bench.bench_all import NEEDS, decisions, decisions_markdown

    quality = [_q("a", 0, 2.00), _q("a", 1, 2.02), _q("b", 0, 2.10), _q("b", 1, 2.14),
               _q("x", 0, 3.0, protocol="infill"), _q("x", 1, 3.1, protocol="infill"),
               # at the small budget the two ranges meet: 2.50-2.60 and 2.55-2.65
               _q("a", 0, 2.50, 1e8), _q("a", 1, 2.60, 1e8), _q("b", 0, 2.55, 1e8),
               _q("b", 1, 2.65, 1e8)]
    reach = [_r("a", 0, 0.9), _r("a", 1, 0.8), _r("b", 0, 0.1), _r("b", 1, 0.2),
             _r("a", 0, 0.5, 64, "a prediction reads at most 32 bytes back"),
             _r("b", 0, 0.6, 64, "a prediction reads at most 32 bytes back")]
    table = {r["need"]: r for r in decisions(quality, reach)}
    assert list(table)[:3] == list(NEEDS[:3])
    best = table["best bpc at fixed compute"]  # budget 1e9: a 2.01 against b 2.12
    assert best["choice"] == "a" and best["margin"] == pytest.approx(0.11)
    assert best["spread"] == pytest.approx(0.01 + 0.02) and best["runner_up"] == "b (2.120)"
    assert "budget 1e+09 FLOPs, length 32, 2 seeds" in best["setting"]
    small = table["long context on a small budget"]  # one length: nothing to say
    assert small["choice"] == "not measured" and "one length only (32)" in small["reason"]
    longer = [dict(r, length="64") for r in quality if r["budget"] == "100000000.0"]
    small = decisions(quality + longer, reach)[1]  # at 1e8, length 64: the ranges meet
    assert small["choice"].startswith("no winner at this scale (best a"), small
    assert table["infilling"]["choice"] == "only x measured"
    assert table["exact recall at a distance: 16 bytes"]["choice"] == "a"  # 0.85 against 0.15
    assert table["exact recall at a distance: 64 bytes"]["choice"] == "none can reach it"
    at_chance = decisions(quality, [_r("a", 0, 0.03), _r("a", 1, 0.05), _r("b", 0, 0.0),
                                    _r("b", 1, 0.0)])
    recall = next(r for r in at_chance if r["need"].startswith("exact recall"))
    assert recall["choice"] == ("none learned it (the best, a, is no better than chance, "
                                "0.038)")  # a's worst seed, 0.03, does not clear 1/26
    # a rerun at a larger budget keeps the old rows: only the largest budget's are read
    rerun = reach + [_r("a", 0, 0.0, budget="2e9"), _r("a", 1, 0.0, budget="2e9"),
                     _r("b", 0, 0.5, budget="2e9"), _r("b", 1, 0.6, budget="2e9")]
    recall = next(r for r in decisions(quality, rerun) if r["need"].startswith("exact"))
    assert recall["choice"] == "b" and recall["setting"].startswith("reach task, budget 2e+09")
    assert table["streaming generation"]["choice"] == "not measured"
    one_seed = decisions([_q("a", 0, 2.0), _q("b", 0, 2.5)], [])
    assert one_seed[0]["choice"] == "no winner at this scale (one seed, no spread; best a)"
    text = decisions_markdown(decisions(quality, reach))
    assert text.splitlines()[0].startswith("| need | measured on | use | why |")
    assert "| a | held-out 2.010 bpc | b (2.120) | 0.110 | 0.030 |" in text


def test_the_decision_table_says_which_contestants_its_rows_leave_out():
    """A process stopped before an arm's reach runs (or its largest budget): the rows that
    compare the others say so, instead of naming a winner as if every contestant ran."""
    from minixl.one_bench.bench_all import decisions

    quality = [_q(a, s, 2.0 + 0.1 * i + 0.001 * s) for i, a in enumerate("abc")
               for s in (0, 1)]
    reach = [_r(a, s, 0.9 - 0.3 * i) for i, a in enumerate("ab") for s in (0, 1)]
    table = {r["need"]: r for r in decisions(quality, reach)}
    recall = table["exact recall at a distance: 16 bytes"]
    assert recall["setting"].endswith(", 2 of 3 contestants (no c)"), recall
    assert table["best bpc at fixed compute"]["setting"].endswith("read left to right")
    short = [r for r in quality if not (r["arm"] == "b")]
    best = decisions(short, reach)[0]
    assert best["setting"].endswith(", 2 of 3 contestants (no b)"), best


# ---------------------------------------------------------------- Chapter 7's readers

def test_arm_summary_means_and_half_ranges_over_the_rows_asked_for():
    from minixl.one_bench import arm_summary

    rows = [{"arm": "b", "budget": "800000000000.0", "seed": "0", "bpc": "2.0"},
            {"arm": "a", "budget": "8e11", "seed": "0", "bpc": "3.0"},
            {"arm": "b", "budget": "8e11", "seed": "1", "bpc": "2.5"},
            {"arm": "b", "budget": "2e11", "seed": "0", "bpc": "9.0"},
            {"arm": "a", "budget": "8e11", "seed": "1", "bpc": ""}]
    got = arm_summary(rows, "bpc", budget=8e11)
    assert list(got) == ["b", "a"]  # first seen first
    assert got["b"] == (2.25, 0.25, 2) and got["a"] == (3.0, 0.0, 1)
    assert arm_summary(rows, "bpc", budget=8e11, seed=1) == {"b": (2.5, 0.0, 1)}
    assert arm_summary(rows, "bpc", arm="zzz") == {}


def test_bench_rows_reads_a_stored_run_and_refuses_another_folder(tmp_path):
    from minixl.one_bench import bench_rows

    stored = bench_rows(Path(__file__).resolve().parent.parent / "book" / "bench")
    assert {"plan", "quality", "reach", "decisions", "cost"} <= set(stored)
    assert {r["arm"] for r in stored["quality"]} == set(contestants())
    with pytest.raises(ValueError, match="neither quality.csv nor reach.csv"):
        bench_rows(tmp_path)


def test_a_decision_table_of_runs_counted_under_two_flop_policies_is_refused(tmp_path):
    from minixl.experiments import write_csv
    from minixl.one_bench.bench_all import write_decisions

    kernel = {"arm": "char", "settings": json.dumps({"lr": 0.002})}  # the default: not named
    causal = {"arm": "char", "settings": json.dumps({"lr": 0.003, "flop_policy": "causal"})}
    (tmp_path / "recall").mkdir()
    write_csv([causal], tmp_path / "recall" / "recall.csv")
    with pytest.raises(ValueError, match=r"counted training FLOPs under different policies "
                                         r"\(causal, kernel\)"):
        write_decisions(tmp_path, [kernel], [])
    assert not (tmp_path / "decisions.md").exists()
