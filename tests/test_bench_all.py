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


def _untrained_bpc(arms: list[str], *, seed: int) -> dict[str, float]:
    """Each arm's model as the tiny bench plans and seeds it, untrained, read left to right
    on the tiny bench's held-out bytes."""
    from minixl.data import load_corpus
    from minixl.one_bench.bench_all import reading_segment
    from minixl.planner import bench_arms, plan_bench

    every = bench_arms()
    held = load_corpus("pydoc").valid[:1024]
    out = {}
    for plan in plan_bench(budget=1e9, params=20_000, length=32, batch_size=4,
                           arms={a: every[a] for a in arms}):
        kind = every[plan.arm][0]
        torch.manual_seed(seed)
        model = kind.build(plan.config).eval()
        out[plan.arm], _ = read_left_to_right(model, held,
                                              segment=reading_segment(kind, plan.config, 32))
    return out


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
    # every arm learned: it reads the held-out bytes better than the same model untrained
    # (an absolute bound would not do: 1e9 FLOPs leave some arms far from any fixed bar)
    untrained = _untrained_bpc(arms[:-1], seed=0)  # the bigram plug-in is not a book arm
    for q in quality:
        assert 0 < float(q["own_bpc"]) and 0 < float(q["common_bpc"]) < 12, q
        if q["arm"] in untrained:
            assert float(q["common_bpc"]) < untrained[q["arm"]] - 0.5, (q, untrained)
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
    assert [r["need"] for r in table][:4] == ["best bpc at fixed compute",
                                              "best bpc at fixed training time",
                                              "long context on a small budget", "infilling"]
    assert table[1]["reason"] == "no arm has training times at two budgets"  # one budget
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
                         reach_eval=200, lr=2e-3, distances=[16], flop_policy="causal")
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
    assert list(table)[:4] == [NEEDS[0], NEEDS[6], NEEDS[1], NEEDS[2]]  # time beside compute
    assert table[NEEDS[6]]["choice"] == "not measured"  # these rows hold no training times
    best = table["best bpc at fixed compute"]  # budget 1e9: a 2.01 against b 2.12
    assert best["choice"] == "a" and best["margin"] == pytest.approx(0.11)
    assert best["spread"] == pytest.approx(0.01 + 0.02) and best["runner_up"] == "b (2.120)"
    assert "budget 1e+09 FLOPs, length 32, 2 seeds" in best["setting"]
    small = table["long context on a small budget"]  # one length: nothing to say
    assert small["choice"] == "not measured" and "one length only (32)" in small["reason"]
    longer = [dict(r, length="64") for r in quality if r["budget"] == "100000000.0"]
    small = {r["need"]: r for r in decisions(quality + longer, reach)}[NEEDS[1]]  # at 1e8,
    # length 64: the ranges meet
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
    assert table["best bpc at fixed compute"]["setting"].endswith("read left to right, FLOPs counted as kernel")
    short = [r for r in quality if not (r["arm"] == "b")]
    best = decisions(short, reach)[0]
    assert best["setting"].endswith(", 2 of 3 contestants (no b)"), best


def test_the_fixed_compute_row_names_the_size_batch_and_each_arms_steps():
    """The conditions a verdict holds under: the parameter count and batch of the run's
    settings, the steps each arm's FLOPs bought (a range where its seeds differ) and the
    corpus passes they make (steps x batch x length bytes over the training split's size)."""
    from minixl.data import load_corpus
    from minixl.one_bench.bench_all import decisions

    settings = json.dumps({"params": 200000, "batch_size": 8, "lr": 0.002})
    quality = [dict(_q(arm, seed, 2.0 + 0.5 * (arm == "b") + 0.01 * seed), settings=settings,
                    steps=str(steps), length="100")
               for arm, seed, steps in (("a", 0, 3000), ("a", 1, 3000), ("b", 0, 1200),
                                        ("b", 1, 2500))]
    size = load_corpus("pydoc").train.numel()
    a, b0, b1 = (steps * 8 * 100 / size for steps in (3000, 1200, 2500))
    (best,) = [r for r in decisions(quality, []) if r["need"] == "best bpc at fixed compute"]
    assert best["setting"] == ("budget 1e+09 FLOPs, length 100, 2 seeds, 200,000 parameters, "
                               f"batch 8, steps (corpus passes) a 3000 ({a:.1f}), b 1200-2500 "
                               f"({b0:.1f}-{b1:.1f}), read left to right, FLOPs counted as "
                               "kernel, learning rate 0.002 for every arm"), best["setting"]
    assert best["choice"] == "a"


def test_the_context_recall_and_reach_rows_name_their_size_steps_passes_and_kernels():
    """Every trained row states its conditions: the context row its parameters, its batch
    (batch_bytes // length windows of its length) and each arm's steps with their passes over
    the bench's corpus; the recall rows theirs over the task's stream (`train_bytes` of it);
    the reach rows, whose CSV stores no steps, each arm's steps from the run's plan.csv and
    their passes over the reach task's training stream (none named without a plan); each
    with its arms' kernels at its length."""
    from minixl.data import load_corpus
    from minixl.one_bench.bench_all import decisions, reach_training

    eager = ", kernels: shaw, xl eager"
    quality = [dict(_q("shaw", 0, 2.0), length="128")]
    size = load_corpus("pydoc").train.numel()
    settings = json.dumps({"params": 200000, "batch_bytes": 1024, "lr": 0.002})
    context = [{"arm": arm, "length": "512", "seed": str(seed), "context": "1024",
                "bpc": str(bpc + 0.01 * seed), "budget": "1e12", "reachable": "yes",
                "steps": str(steps), "settings": settings}
               for arm, bpc, steps in (("shaw", 2.7, 180), ("xl", 2.5, 84)) for seed in (0, 1)]
    need = {r["need"]: r for r in decisions(quality, [], None, context)}[
        "long context on a small budget"]
    a, b = (steps * 2 * 512 / size for steps in (180, 84))
    assert need["setting"] == ("budget 1e+12 FLOPs, trained at 512, read with 1024 bytes of "
                               "context, 2 seeds, 200,000 parameters, batch 2, steps (corpus "
                               f"passes) shaw 180 ({a:.1f}), xl 84 ({b:.1f}){eager}, FLOPs "
                               "counted as kernel, learning rate 0.002 for every arm")
    settings = json.dumps({"params": 100000, "batch_size": 16, "train_bytes": 1 << 20,
                           "lr": 0.003})
    recall = [{"arm": arm, "kind": arm, "length": "64", "budget": "1e12", "seed": "0",
               "band": "6-30", "low": "6", "high": "30", "cases": "100",
               "accuracy": str(accuracy), "reachable": "yes", "steps": str(steps),
               "settings": settings}
              for arm, accuracy, steps in (("shaw", 0.97, 20000), ("xl", 0.5, 14000))]
    rows = [r for r in decisions(quality, [], recall=recall) if "recall" in r["need"]]
    assert rows[0]["setting"] == rows[1]["setting"] == (
        "recall task, budget 1e+12, length 64, 1 seed, 100,000 parameters, batch 16, steps "
        "(passes over its stream) shaw 20000 (19.5), xl 14000 (13.7)" + eager
        + ", FLOPs counted as kernel, learning rate 0.003 for every arm")
    settings = json.dumps({"params": 200000, "batch_size": 8, "distances": [16, 64]})
    reach = [dict(_r(arm, 0, 0.5), length="128", settings=settings) for arm in ("shaw", "xl")]
    plan = [{"arm": arm, "length": "128", "budget": "1000000000.0", "steps": str(steps)}
            for arm, steps in (("shaw", 300), ("xl", 150))]
    stream = reach_training([16, 64]).data.numel()
    a, b = (steps * 8 * 128 / stream for steps in (300, 150))
    (row,) = [r for r in decisions(quality, reach, plan=plan) if "recall" in r["need"]]
    assert row["setting"] == ("reach task, budget 1e+09, length 128, 200,000 parameters, "
                              f"batch 8, steps (passes over its stream) shaw 300 ({a:.1f}), xl "
                              f"150 ({b:.1f}){eager}, FLOPs counted as kernel")
    (row,) = [r for r in decisions(quality, reach) if "recall" in r["need"]]
    assert "steps" not in row["setting"] and eager in row["setting"]


def test_each_rows_kernels_are_named_grouped_by_kernel_and_at_the_rows_length():
    """An arm of a registered kind names the first clause of its kernel line, arms that share
    one grouped; the time-matched row names no steps (they vary with the time)."""
    from minixl.one_bench.bench_all import decisions, kernel_label

    assert kernel_label("char") == "PyTorch's fused causal attention"
    assert kernel_label("shaw") == kernel_label("xl") == "eager"
    assert kernel_label("segtree") != kernel_label("bpt")  # one kind, two configs
    assert kernel_label("no such arm") is None
    settings = json.dumps({"params": 200000, "batch_size": 8, "lr": 0.002})
    quality = [dict(_q(arm, seed, 2.0 + 0.3 * i + 0.01 * seed, budget=budget),
                    settings=settings, steps="100", train_seconds=str(budget / 1e8 * (1 + i)))
               for i, arm in enumerate(("shaw", "xl", "segtree")) for seed in (0, 1)
               for budget in (1e8, 1e9)]
    table = {r["need"]: r["setting"] for r in decisions(quality, [])}
    want = (f", kernels: shaw, xl eager; segtree {kernel_label('segtree')}")
    assert want in table["best bpc at fixed compute"], table["best bpc at fixed compute"]
    assert want in table["best bpc at fixed training time"]
    assert "steps" not in table["best bpc at fixed training time"]


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
    # the stored run's arms are today's contestants; an arm added since (xl-nomem, with the
    # run that tunes each arm's rate) is the only kind of gap allowed
    assert {r["arm"] for r in stored["quality"]} == set(contestants()) - {"xl-nomem"}
    with pytest.raises(ValueError, match="neither quality.csv nor reach.csv"):
        bench_rows(tmp_path)


def test_the_time_matched_reading_interpolates_in_log_time_and_names_who_it_leaves_out():
    """Best bpc at fixed training time: each arm and seed read at the shortest time any arm
    took at the largest budget, between its two budgets that bracket it, straight in log
    time; an arm too slow to finish its smallest budget by then is left out and named; the
    reason says whether fixed compute names the same arm."""
    from minixl.one_bench.bench_all import NEEDS, _at_time, decisions

    assert _at_time([(10, 3.0), (40, 2.0)], 20) == pytest.approx(2.5)  # halfway in log time
    assert _at_time([(40, 2.0), (10, 3.0), (20, 2.8)], 10) == pytest.approx(3.0)
    with pytest.raises(ValueError, match="outside"):
        _at_time([(10, 3.0), (40, 2.0)], 50)

    def q(arm, seed, budget, bpc, seconds):
        return dict(_q(arm, seed, bpc, budget), train_seconds=str(seconds))

    # fast: 10 s and 40 s for budgets 1e9 and 4e9; slow: 20 s and 80 s. Read at 40 s (the
    # shortest at the largest budget): fast at its 4e9 point, slow halfway in log time
    quality = []
    for seed, d in ((0, 0.0), (1, 0.02)):
        quality += [q("fast", seed, 1e9, 3.0 + d, 10), q("fast", seed, 4e9, 2.6 + d, 40),
                    q("slow", seed, 1e9, 2.9 + d, 20), q("slow", seed, 4e9, 2.1 + d, 80),
                    q("crawl", seed, 1e9, 3.5 + d, 50), q("crawl", seed, 4e9, 1.0 + d, 200)]
    table = {r["need"]: r for r in decisions(quality, [])}
    time = table[NEEDS[6]]
    assert time["setting"].startswith("40.0 s of training each, as the run timed them, "
                                      "length 32, 2 seeds")
    assert time["choice"] == "slow" and time["runner_up"] == "fast (2.610)"
    assert time["reason"].startswith("held-out 2.510 bpc; a run of that time would spend about "
                                     "2.0e+09 FLOPs for slow, 4.0e+09 FLOPs for fast")
    assert ("crawl left out: its smallest budget took 50.0 s and reads 3.510 bpc, worse in "
            "every seed than every seed of the pick") in time["reason"]
    assert table[NEEDS[0]]["choice"] == "crawl"  # 1.01 at 4e9 FLOPs: the most per FLOP
    assert time["reason"].endswith("at fixed compute (4e+09 FLOPs) the best is crawl, left "
                                   "out here")
    # without crawl: slow is best at 4e9 FLOPs and at 40 s, the same
    two = [r for r in quality if r["arm"] != "crawl"]
    time = {r["need"]: r for r in decisions(two, [])}[NEEDS[6]]
    assert time["choice"] == "slow" and time["reason"].endswith(
        "at fixed compute (4e+09 FLOPs) the best is slow, the same")
    # slow learns little from its smallest budget (3.3): at 40 s it reads 2.7, fast 2.6
    late = [dict(r, common_bpc=str(float(r["common_bpc"]) + 0.4)) if r["arm"] == "slow"
            and r["budget"] == "1000000000.0" else r for r in two]
    time = {r["need"]: r for r in decisions(late, [])}[NEEDS[6]]
    assert time["choice"] == "fast" and time["reason"].endswith(
        "the best is slow: the readings disagree")
    # a slow arm whose seeds meet the pick's at its smallest budget is not ruled out
    better = [dict(r, common_bpc="2.0") if r["arm"] == "crawl" and r["budget"] == "1000000000.0"
              else r for r in quality]
    time = {r["need"]: r for r in decisions(better, [])}[NEEDS[6]]
    assert time["choice"] == "slow (crawl not ruled out)"
    assert "crawl left out: its smallest budget took 50.0 s and reads 2.000 bpc, not ruled " \
           "out" in time["reason"]
    # an arm timed at one budget only is named in the setting, and its seeds are not counted
    once = [r for r in quality if not (r["arm"] == "fast" and r["budget"] == "1000000000.0")]
    time = {r["need"]: r for r in decisions(once, [])}[NEEDS[6]]
    assert time["setting"].endswith(", timed at one budget only (left out): fast")
    assert "fast" not in time["runner_up"]


def _run(ended, seconds, points):
    return {"ended": ended, "seconds": str(seconds), "points_run": str(points)}


def test_the_time_row_needs_runs_csv_to_show_every_arm_trained_alone():
    """runs.csv (one row a process) must account for every training and show no two
    processes at once, else no time is an arm's own and the row is not measured: a merged
    run of processes side by side, a run stopped and resumed (the stopped process wrote no
    row), a process with no time. Back-to-back processes, kept to the second, are alone."""
    from minixl.one_bench.bench_all import NEEDS, _untimed, decisions

    alone = [_run("2026-01-01 10:00:00", 60.0, 3), _run("2026-01-01 10:01:01", 61.0, 3)]
    assert _untimed(alone, 6) == ""  # back to back: the second starts as the first ends
    assert _untimed(alone, 7) == ("runs.csv records 6 of the 7 trainings, so whether each arm "
                                  "trained alone is not on record")
    side = [_run("2026-01-01 10:00:00", 60.0, 3), _run("2026-01-01 10:00:30", 60.0, 3),
            _run("2026-01-01 10:05:00", 10.0, 2)]
    assert _untimed(side, 7) == ("2 of the run's 3 processes trained while another did "
                                 "(runs.csv), so no training time is an arm's own")
    assert _untimed([_run("2026-01-01 10:00:00", "", 3)], 3) == (
        "a process in runs.csv has no time on record")

    def q(arm, seed, budget, bpc, seconds):
        return dict(_q(arm, seed, bpc, budget), train_seconds=str(seconds))

    quality = [q(a, s, b, 3.0 - i - b / 1e10, 10 * b / 1e9 * (i + 1)) for i, a in enumerate("ab")
               for s in (0, 1) for b in (1e9, 2e9)]
    got = {r["need"]: r for r in decisions(quality, [], runs=side)}[NEEDS[6]]
    assert got["choice"] == "not measured" and got["reason"].startswith("2 of the run's 3")
    got = {r["need"]: r for r in decisions(quality, [], runs=alone[:1])}[NEEDS[6]]
    assert got["reason"] == ("runs.csv records 3 of the 8 trainings, so whether each arm "
                             "trained alone is not on record")
    every = [_run("2026-01-01 10:00:00", 600.0, 8)]
    assert {r["need"]: r for r in decisions(quality, [], runs=every)}[NEEDS[6]]["choice"] == "b"


def test_each_row_of_the_decision_table_names_its_flop_policy_and_mixed_rows_are_refused(
        tmp_path):
    """A folder's runs may count FLOPs under different policies (a causal rerun of the text
    bench beside a recall run counted by the kernel): each row's setting names its own, and
    a row whose rows mix them is refused, for it compares their budgets."""
    from minixl.one_bench.bench_all import decisions, read_rows, write_decisions

    causal = json.dumps({"lr": 0.002, "flop_policy": "causal"})
    kernel = json.dumps({"lr": 0.002})  # the default policy: not named in the settings
    quality = [dict(_q(arm, seed, bpc), settings=causal)
               for arm, seed, bpc in (("a", 0, 2.0), ("a", 1, 2.02), ("b", 0, 2.1), ("b", 1, 2.14))]
    reach = [dict(_r(arm, seed, acc), settings=kernel)
             for arm, seed, acc in (("a", 0, 0.9), ("a", 1, 0.8), ("b", 0, 0.1), ("b", 1, 0.2))]
    write_decisions(tmp_path, quality, reach)
    table = {r["need"]: r for r in read_rows(tmp_path / "decisions.csv")}
    assert table["best bpc at fixed compute"]["setting"].endswith(
        ", read left to right, FLOPs counted as causal, learning rate 0.002 for every arm")
    assert table["exact recall at a distance: 16 bytes"]["setting"].endswith(
        ", FLOPs counted as kernel, learning rate 0.002 for every arm")
    assert "FLOPs counted as causal" in (tmp_path / "decisions.md").read_text()
    mixed = quality[:3] + [dict(quality[3], settings=kernel)]  # b's seed 1 counted otherwise
    with pytest.raises(ValueError, match=r"counted training FLOPs under different policies "
                                         r"\(causal, kernel\)"):
        decisions(mixed, reach)
    (tmp_path / "decisions.csv").unlink()
    with pytest.raises(ValueError, match="different policies"):
        write_decisions(tmp_path, mixed, reach)
    assert not (tmp_path / "decisions.csv").exists()


@pytest.mark.slow
def test_a_tuned_run_picks_each_arms_rate_on_bytes_it_never_trained_on_and_uses_it(tmp_path):
    """--lrs: every arm trained at each rate (smallest budget, first seed), scored on the
    training split's held-back tail; the best rate (never the absurd 1e-9) is the arm's for
    every point, named in lr.csv, plan.csv, the rows and the decision table; a rerun trains
    nothing; fewer than three rates are refused."""
    out = tmp_path / "bench"
    _bench(out, "--seeds", "0", "--models", "char,xl-nomem", "--lrs", "1e-9,1e-2,3e-2")
    tuned = _read(out / "lr.csv")
    assert sorted((t["arm"], float(t["lr"])) for t in tuned) == sorted(
        (a, r) for a in ("char", "xl-nomem") for r in (1e-9, 1e-2, 3e-2))
    chosen = {}
    for arm in ("char", "xl-nomem"):
        rows = [t for t in tuned if t["arm"] == arm]
        best = min(rows, key=lambda t: float(t["tune_bpc"]))
        assert [t["chosen"] for t in rows].count("True") == 1 and best["chosen"] == "True"
        assert float(best["lr"]) != 1e-9  # a rate that cannot learn is never the best
        assert float(max(rows, key=lambda t: float(t["tune_bpc"]))["lr"]) == 1e-9
        chosen[arm] = float(best["lr"])
    for name in ("plan.csv", "quality.csv", "reach.csv"):
        assert {(r["arm"], float(r["lr"])) for r in _read(out / name)} == set(chosen.items())
    setting = {r["need"]: r["setting"] for r in _read(out / "decisions.csv")}
    assert setting["best bpc at fixed compute"].endswith(
        "learning rate chosen per arm from 1e-09, 0.01, 0.03 (" + ", ".join(
            f"{a} {chosen[a]:g}" for a in ("char", "xl-nomem")) + ")")
    before = {f: (out / f).read_bytes() for f in ("lr.csv", "quality.csv", "plan.csv")}
    again = _bench(out, "--seeds", "0", "--models", "char,xl-nomem", "--lrs",
                   "1e-9,1e-2,3e-2")
    assert "bench_all [" not in again.stdout  # nothing left to train
    assert {f: (out / f).read_bytes() for f in before} == before
    refused = _bench(tmp_path / "two", "--lrs", "1e-3,2e-3", code=2)
    assert "at least three different learning rates" in refused.stderr


@pytest.mark.slow
def test_a_wider_grid_tunes_only_the_new_rates_and_retrains_only_the_arms_that_moved(
        tmp_path):
    """A finished tuned run given a wider grid (every old rate and more): the old tuning
    rows are kept, each arm is trained at the new rates only; an arm whose best rate does
    not move keeps its points (nothing trained again), one whose rate moves is trained again
    at every point; and what the widened folder holds is what a fresh run with the wide grid
    computes. A grid that drops a rate is refused, as any other change of settings."""
    arms = ["--seeds", "0", "--models", "char,xl-nomem"]
    out = tmp_path / "bench"
    _bench(out, *arms, "--lrs", "1e-9,1e-8,1e-7")  # rates that cannot learn: one is chosen
    r = _bench(out, *arms, "--lrs", "1e-9,1e-8,1e-7,1e-2")  # one that learns: both move
    assert "widening the stored grid of rates" in r.stdout
    assert "bench_all [rate 2/2] " in r.stdout and "bench_all [rate 3/" not in r.stdout
    assert "were trained at a rate no longer chosen (char now 0.01, xl-nomem now 0.01)" \
        in r.stdout
    assert {float(x["lr"]) for x in _read(out / "quality.csv")} == {1e-2}
    before = {f: _read(out / f) for f in ("quality.csv", "reach.csv")}
    wide = "1e-12,1e-9,1e-8,1e-7,1e-2"
    r = _bench(out, *arms, "--lrs", wide)  # one that cannot beat 1e-2: no arm moves
    assert "bench_all [rate 2/2] " in r.stdout
    assert "bench_all [" not in r.stdout.replace("bench_all [rate", "")  # no point again
    for f, rows in before.items():  # kept as they were, under the wider grid's settings
        assert [{**x, "settings": ""} for x in _read(out / f)] == [
            {**x, "settings": ""} for x in rows]
    fresh = tmp_path / "fresh"
    _bench(fresh, *arms, "--lrs", wide)
    for f, keys in (("lr.csv", ("arm", "lr", "steps", "tune_bpc", "chosen", "settings")),
                    ("quality.csv", ("arm", "budget", "seed", "steps", "common_bpc", "own_bpc",
                                     "lr", "settings")),
                    ("reach.csv", ("arm", "band", "cases", "accuracy", "bits", "lr",
                                   "settings")),
                    ("plan.csv", ("arm", "steps", "lr", "settings"))):
        def cut(rows):
            return sorted(tuple(x[k] for k in keys) for x in rows)
        assert cut(_read(out / f)) == cut(_read(fresh / f)), f
    assert len(_read(out / "lr.csv")) == 2 * 5
    refused = _bench(out, *arms, "--lrs", "1e-9,1e-8,1e-2", code=2)  # 1e-12, 1e-7 dropped
    assert "holds a run with other settings" in refused.stderr
    # a widening that would leave an arm's rows claiming rates it was never tuned at
    before = {f: (out / f).read_bytes() for f in ("lr.csv", "quality.csv", "plan.csv")}
    refused = _bench(out, "--seeds", "0", "--models", "char", "--lrs", wide + ",3e-2", code=2)
    assert "--models to name every one (xl-nomem left out)" in refused.stderr
    refused = _bench(out, *arms, "--lrs", wide + ",3e-2", "--reach-only", "--csv",
                     str(out / "reach.csv"), code=2)
    assert "a full run, not --reach-only" in refused.stderr
    assert {f: (out / f).read_bytes() for f in before} == before  # and nothing rewritten


def test_the_tuning_bytes_are_the_training_splits_tail_and_never_trained_on():
    from minixl.one_bench.bench_all import chosen_rates, tuning_split

    train = torch.arange(1000)
    part, held = tuning_split(train, 32768)
    assert len(held) == 100 and torch.equal(torch.cat([part, held]), train)  # a tenth at most
    part, held = tuning_split(train, 40)
    assert len(held) == 40 and int(part[-1]) + 1 == int(held[0])
    rows = [{"arm": "a", "lr": "0.001", "tune_bpc": "3.0"}, {"arm": "a", "lr": "0.004",
            "tune_bpc": "2.5"}, {"arm": "a", "lr": "0.002", "tune_bpc": "2.5"},
            {"arm": "b", "lr": "0.001", "tune_bpc": "1.0"}]
    assert chosen_rates(rows) == {"a": 0.002, "b": 0.001}  # a tie goes to the smaller rate


def test_merging_refuses_an_arm_tuned_in_two_folders(tmp_path):
    """Two processes that each tuned the same arm (at their own seeds) would give it two
    rates: merge_runs says so instead of keeping either."""
    from minixl.experiments import write_csv
    from minixl.one_bench.bench_all import merge_runs

    for seed in (0, 1):
        f = tmp_path / f"seed{seed}"
        write_csv([{"arm": "char", "length": 32, "budget": 1e9, "seed": seed, "settings": "s"}],
                  f / "quality.csv")
        write_csv([{"arm": "char", "length": 32, "budget": 1e9, "settings": "s"}], f / "plan.csv")
        write_csv([{"arm": "char", "lr": 0.01, "seed": seed, "tune_bpc": 3.0 + seed}],
                  f / "lr.csv")
    with pytest.raises(ValueError, match="char was tuned at lr 0.01 in two folders"):
        merge_runs([tmp_path / "seed0", tmp_path / "seed1"], tmp_path / "out")
    assert not (tmp_path / "out").exists()


def test_drawing_the_benchs_figures_leaves_a_notebooks_backend_alone(tmp_path):
    """Chapter 7 runs the bench inside a notebook. The figures the bench writes must not switch
    the notebook's matplotlib backend (matplotlib.use("Agg") did, and every figure of the
    chapter after the live bench was silently never shown), nor leave pyplot figures open."""
    import matplotlib
    import matplotlib.pyplot as plt

    from minixl.one_bench.bench_all import plot_bench, read_rows
    from minixl.one_bench.bench_cost import plot_cost
    from minixl.one_bench.context import plot_context
    from minixl.one_bench.recall import plot_recall

    book = ROOT / "book" / "bench"
    before, figures = matplotlib.get_backend(), plt.get_fignums()
    plt.switch_backend("svg")  # a backend the bench would not pick
    try:
        plot_bench(tmp_path, read_rows(book / "quality.csv"), read_rows(book / "reach.csv"))
        plot_cost(read_rows(book / "cost.csv"), tmp_path / "cost.png")
        plot_recall(read_rows(book / "recall" / "recall.csv"), tmp_path / "recall.png")
        plot_context(read_rows(book / "context" / "context.csv"), tmp_path / "context.png")
        assert matplotlib.get_backend() == "svg"
        assert plt.get_fignums() == figures
    finally:
        plt.switch_backend(before)
    for name in ("bench.png", "cost.png", "recall.png", "context.png"):
        assert (tmp_path / name).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
