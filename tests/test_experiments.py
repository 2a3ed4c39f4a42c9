"""The registry of runs that write a CSV: both command lines are built from it, and every entry
runs on a tiny setting here, through the real command line, and writes the columns the
chapters read. (The numbers themselves are the runs' to report, not the tests'.)"""

import csv
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import near_uniform
from minixl.cli import build_parser, main
from minixl.experiments import EXPERIMENTS, build_parser as registry_parser, markdown_table, write_csv

ROOT = Path(__file__).resolve().parent.parent

# A tiny setting of every entry: the options, and the columns the CSV must hold first.
TINY = {
    "models": (["--preset", "tiny", "--models", "char,xl", "--batch-size", "2", "--steps", "1",
                "--warmup", "0", "--device", "cpu"],
               ["model", "preset", "device", "torch", "dtype", "compile", "params"]),
    "profile": (["--presets", "char/tiny", "--batch-size", "1", "--steps", "1", "--warmup",
                 "0", "--top", "3", "--device", "cpu"],
                ["preset", "model", "device", "compile", "batch_size", "seq_len"]),
    "positions": (["--depths", "1", "--seeds", "0,1", "--steps", "2"],
                  ["n_layer", "seed", "pos", "steps", "valid_bpc", "seconds"]),
    "nanogpt_race": (["--nanogpt", "{stub}", "--text", "{text}", "--rounds", "2", "--steps",
                      "3", "--dtypes", "auto,fp32"],
                     ["program", "round", "steps", "seconds", "held_out_bpc"]),
    "depth": (["--depths", "1,2", "--seeds", "0", "--steps", "2", "--d-model", "8",
               "--seq-len", "8", "--batch-size", "2", "--eval-bytes", "64"],
              ["depth", "norm", "losses", "seed", "steps", "d_model", "seq_len", "train_bpc",
               "valid_bpc", "seconds"]),
    "aux_ablation": (["--seeds", "0", "--steps", "2", "--arms", "plain;+ layers, no warm-up",
                      "--eval-bytes", "256", "--sliding-bytes", "128"],
                     ["arm", "seed", "steps", "warmup", "valid_bpc", "all_positions_bpc",
                      "sliding_bpc", "layers_half_way", "layers_end"]),
    "shaw_cost": (["--lengths", "4,24", "--repeats", "1", "--device", "cpu"],
             ["T", "max_relative", "device", "torch", "bucket_ms", "gathered_ms", "fastest",
              "chosen"]),
    "shaw_positions": (["--seeds", "0", "--steps", "2", "--eval-bytes", "300", "--lengths",
                        "64,128", "--arms", "per_layer,shaw_scaled"],
                       ["arm", "seed", "steps", "max_relative", "bpc_64", "bpc_128",
                        "seconds"]),
    "xl_eval_speed": (["--lengths", "8,16", "--tgt-len", "4", "--n-layer", "1", "--d-model",
                       "8", "--n-head", "2", "--d-head", "4", "--d-inner", "8", "--passes", "1",
                       "--streams", "2"],
                      ["A", "tgt_len", "streams", "sliding_us", "states_us", "kv_us",
                       "measured_states", "measured_kv", "predicted_states", "predicted_kv"]),
    "xl_order": (["--seeds", "0", "--steps", "64", "--eval-bytes", "256"],
                 ["arm", "seed", "steps", "bpc_at_64", "bpc_at_32", "last_train_bpc"]),
    "hf-xl": (["--preset", "tiny", "--batch-size", "2", "--steps", "1", "--warmup", "0",
               "--rounds", "1", "--device", "cpu"],
              ["preset", "device", "torch", "transformers", "dtype"]),
    "xlnet_memory": (["--seeds", "0", "--steps", "2", "--mem-len", "16", "--eval-bytes",
                      "1024"],
                     ["arm", "seed", "steps", "batches", "mem_len", "reuse_len", "bi_data",
                      "bpc_windows", "bpc_memory", "bpc_infill", "bpc_windows_one_segment",
                      "bpc_memory_one_segment", "bpc_infill_one_segment", "bpc_layout",
                      "bpc_layout_no_segments", "last_train_bpc"]),
    "xlnet_k_cost": (["--ks", "1,4", "--rounds", "2", "--steps", "1", "--batch-size", "2"],
                     ["K", "n_predict", "batch_size", "seq_len", "device", "threads", "rounds",
                      "steps", "fastest_ms", "median_ms", "fastest_ratio", "median_ratio",
                      "gflops", "content_gflops", "query_gflops", "flops_ratio"]),
    "xlnet_objectives": (["--seeds", "0", "--steps", "2", "--eval-bytes", "1024"],
                         ["arm", "objective", "targets", "seed", "steps", "bpc_infill",
                          "bpc_infill_independent", "bpc_infill_causal", "bpc_left_to_right",
                          "last_train_bpc"]),
    "xlnet_control": (["--seeds", "0", "--steps", "3", "--eval-windows", "4"],
                      ["arm", "seed", "steps", "bits_joint", "bits_independent", "bits_causal"]),
    "segtree_cost": (["--min-n", "64", "--max-n", "128", "--rounds", "1", "--device", "cpu"],
                ["method", "n", "seconds", "median_seconds", "rounds", "peak_mb"]),
    "segtree_quality": (["--windows", "16", "--seeds", "0", "--steps", "2", "--post-windows",
                         "16", "--shaw-windows", "16", "--eval-bytes", "256"],
                        ["arm", "window", "seed", "steps", "batch_size", "params", "valid_bpc"]),
    "segtree_reach": (["--window", "64", "--filler", "20", "--dense-window", "16", "--steps",
                       "2", "--question-steps", "2", "--batch-size", "2", "--question-seeds",
                       "0"],
                      ["task", "arm", "window", "seed", "steps", "distance", "accuracy",
                       "accuracy_near", "accuracy_far", "bits", "cases"]),
    "bench_all": (["--budgets", "1e9", "--params", "20000", "--seeds", "0", "--models",
                   "char,segtree", "--lengths", "32", "--distances", "16,64", "--batch-size",
                   "4", "--eval-bytes", "1024", "--reach-eval", "10"],
                  ["arm", "kind", "length", "budget", "seed", "params", "steps",
                   "train_flops", "own_protocol", "own_bpc", "common_bpc"]),
    "bench_cost": (["--lengths", "32", "--shape-length", "32", "--params", "20000",
                    "--models", "char", "--rounds", "1", "--gen-bytes", "1"],
                   ["arm", "kind", "length", "shape", "params", "train_segment", "segment",
                    "memory", "kernel", "fits", "train_peak_mb", "train_ms_per_byte"]),
    "bench_recall": (["--budget", "1e9", "--params", "20000", "--seeds", "0", "--models",
                      "char,shaw", "--lengths", "32", "--distances", "8,16,64", "--batch-size",
                      "4", "--train-bytes", "4096", "--eval-items", "50"],
                     ["arm", "kind", "length", "budget", "seed", "params", "steps", "band",
                      "low", "high", "cases", "accuracy", "bits", "reach", "reachable"]),
    "bench_context": (["--budget", "1e9", "--params", "20000", "--seeds", "0", "--models",
                       "char", "--lengths", "32", "--shape-length", "32", "--contexts", "4,16",
                       "--block", "4", "--targets", "16", "--batch-bytes", "128"],
                      ["arm", "kind", "length", "budget", "seed", "params", "steps", "context",
                       "low", "high", "bytes", "bpc", "reach", "reachable"]),
}


def _hf_ready() -> bool:
    from minixl.transformer_xl.experiments import HF_VERSION
    try:
        import transformers
    except ImportError:
        return False
    return transformers.__version__.startswith(HF_VERSION + ".")


def _read(path: Path) -> list[dict]:
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


def test_both_command_lines_offer_every_entry_and_every_entry_a_tiny_setting_here():
    entries = registry_parser()._subparsers._group_actions[0].choices
    untried = [name for name in EXPERIMENTS if name not in TINY]
    assert not untried, f"give {', '.join(untried)} a tiny setting in TINY above"
    assert list(entries) == list(EXPERIMENTS) == list(TINY)
    bench = build_parser()._subparsers._group_actions[0].choices["bench"]
    suite = next(a for a in bench._actions if a.dest == "suite")
    assert all(f"{name}: " in suite.help for name in EXPERIMENTS)  # bench --suite lists them
    for entry in EXPERIMENTS.values():
        assert entry.csv.startswith("book/") and entry.csv.endswith(".csv"), entry.name
        flags = {a.option_strings[0] for a in entries[entry.name]._actions if a.option_strings}
        assert {o.flag for o in entry.options} | {"--csv", "--all-columns"} <= flags


def test_pins_threads_runs_on_the_threads_asked_for_and_gives_the_count_back():
    import torch

    from minixl.experiments import pins_threads

    @pins_threads
    def experiment(steps: int, threads: int = 1, fail: bool = False):
        seen.append(torch.get_num_threads())
        if fail:
            raise ValueError("bad steps")
        return steps

    before, seen = torch.get_num_threads(), []
    torch.set_num_threads(3)
    try:
        assert experiment(5) == 5 and experiment(5, threads=2) == 5
        with pytest.raises(ValueError, match="bad steps"):
            experiment(5, 1, True)
        assert seen == [1, 2, 1] and torch.get_num_threads() == 3
    finally:
        torch.set_num_threads(before)
    with pytest.raises(TypeError, match="takes no threads argument"):
        pins_threads(lambda steps: steps)


def test_write_csv_is_atomic_and_the_table_has_every_row(tmp_path):
    rows = [{"a": 1, "b": 2.5, "c": None}, {"a": 12345, "b": 0.001, "c": "x"}]
    path = write_csv(rows, tmp_path / "sub" / "t.csv")
    assert [r["a"] for r in _read(path)] == ["1", "12345"]
    assert not list(path.parent.glob("*.part"))
    table = markdown_table(rows).splitlines()
    assert table[0] == "| a | b | c |" and len(table) == 4 and "12,345" in table[3]
    with pytest.raises(ValueError, match="no rows"):
        write_csv([], tmp_path / "u.csv")
    assert not (tmp_path / "u.csv").exists()


# A stand-in for a nanoGPT checkout (the real one is not part of minixl): its train.py
# reads the flags nanoGPT's does and prints an evaluation line as nanoGPT's does.
STUB_TRAIN = """
import sys
flags = dict(a[2:].split("=", 1) for a in sys.argv[2:])
assert sys.argv[1] == "config/train_shakespeare_char.py" and flags["device"] == "cpu"
print(f"step {flags['max_iters']}: train loss 2.1000, val loss 1.3863")
"""


def _stub(tmp_path: Path, small_corpus: Path) -> dict:
    stub = tmp_path / "nanoGPT"
    (stub / "config").mkdir(parents=True)
    (stub / "config" / "train_shakespeare_char.py").write_text("")
    (stub / "train.py").write_text(STUB_TRAIN)
    return {"stub": stub, "text": small_corpus}


def _tables(folder: Path) -> dict[str, list[dict]]:
    return {path.name: _read(path) for path in sorted(folder.glob("*.csv"))}


@pytest.mark.slow
@pytest.mark.parametrize("name", list(TINY))
def test_every_entry_writes_its_csv_from_the_command_line_and_the_same_numbers_twice(
        name, tmp_path, small_corpus):
    """`python -m minixl.experiments NAME` on a tiny setting, as a user runs it; then again, in
    a fresh folder (an entry that resumes must not pick up the first run). Every CSV of the
    two runs (the entry's, and any it writes beside it) has the same rows and the same
    values, but for the columns the entry declares `measured` (times, memory)."""
    options, columns = TINY[name]
    paths = _stub(tmp_path, small_corpus) if name == "nanogpt_race" else {}
    options = [o.format(**paths) for o in options]
    tables = []
    for run in ("first", "again"):
        path = tmp_path / run / f"{name}.csv"
        r = subprocess.run([sys.executable, "-m", "minixl.experiments", name, *options,
                            "--csv", str(path)], capture_output=True, text=True, cwd=ROOT,
                           timeout=600)
        if name == "hf-xl" and not _hf_ready():  # its clear error is tested below
            assert r.returncode == 2 and not path.exists(), r.stderr
            return
        assert r.returncode == 0, r.stderr
        rows = _read(path)
        assert rows and list(rows[0])[:len(columns)] == columns, list(rows[0])
        assert r.stdout.splitlines()[-1] == f"{len(rows)} rows written to {path}"
        assert not list(path.parent.glob("*.part"))
        tables.append(_tables(path.parent))
    first, again = tables
    measured = set(EXPERIMENTS[name].measured)
    written = {column for table in first.values() for column in table[0]}
    assert measured <= written, f"{name} declares measured columns it does not write: " \
                                f"{sorted(measured - written)}"
    assert list(first) == list(again)
    for table in first:
        assert len(first[table]) == len(again[table]), table
        for n, (a, b) in enumerate(zip(first[table], again[table])):
            moved = {k: (a[k], b.get(k)) for k in a if k not in measured and a[k] != b.get(k)}
            assert not moved, f"{name}: {table} row {n} differs on a re-run: {moved}"


@pytest.mark.slow
def test_the_entries_measure_what_they_say(tmp_path, capsys, small_corpus):
    """Values that hang together, through `minixl bench --suite NAME` (the same registry);
    and each run, on the threads it pins, gives the caller's thread count back."""
    import torch

    paths = _stub(tmp_path, small_corpus)
    before = torch.get_num_threads()
    torch.set_num_threads(3)  # not what any entry asks for

    def run(name, *extra):
        path = tmp_path / f"{name}.csv"
        options = [o.format(**paths) for o in TINY[name][0]]
        try:
            assert main(["bench", "--suite", name, *options, *extra, "--csv", str(path)]) == 0
            assert torch.get_num_threads() == 3, f"{name} left the process on " \
                                                 f"{torch.get_num_threads()} threads"
        finally:
            torch.set_num_threads(3)
        return _read(path)

    try:
        _hang_together(run, capsys)
    finally:
        torch.set_num_threads(before)


def _hang_together(run, capsys):
    rows = run("shaw_cost")
    assert [(int(r["T"]), int(r["max_relative"])) for r in rows] == [(4, 4), (4, 16), (24, 4),
                                                                       (24, 16)]
    for r in rows:
        times = {"bucket": float(r["bucket_ms"]), "gathered": float(r["gathered_ms"])}
        assert min(times.values()) > 0 and r["fastest"] == min(times, key=times.get)
    # the chooser: gathered for 4 x 4 = 16 pairs, buckets for 24 x 24 = 576 (> 16 x 16)
    assert [r["chosen"] for r in rows] == ["gathered", "gathered", "bucket", "bucket"]
    assert "| T | max_relative |" in capsys.readouterr().out

    rows = run("segtree_cost")
    methods = ["segtree", "segtree-gathered", "dense-fused", "dense-written", "segtree-projections"]
    assert [(r["method"], int(r["n"])) for r in rows] == [(m, n) for n in (64, 128) for m in methods]
    assert all(0 < float(r["seconds"]) <= float(r["median_seconds"]) for r in rows)
    assert all(float(r["peak_mb"]) >= 0 for r in rows) and {r["device"] for r in rows} == {"cpu"}
    text = capsys.readouterr().out
    assert "n=128: dense fused / segtree time" in text and "slope per step of n: 64->128 " in text
    assert "fitted over" not in text  # nothing from 8,192 up: no fit over the top of the range
    rows = run("segtree_cost", "--methods", "segtree,dense-fused", "--min-n", "1024", "--max-n", "2048")
    assert {r["method"] for r in rows} == {"segtree", "dense-fused"}
    assert "slope per step of n: 1024->2048 " in capsys.readouterr().out

    rows = run("segtree_quality")
    assert [r["arm"] for r in rows] == ["dense", "shaw", "segtree", "segtree-post"]
    assert all(near_uniform(float(r["valid_bpc"]), within=1.0) for r in rows)  # 2 steps: bits
    params = {r["arm"]: int(r["params"]) for r in rows}
    assert params["segtree"] - params["segtree-post"] == 2 * 64  # post-norm has no final norm
    rows = run("segtree_quality", "--windows", "16,32", "--arms", "segtree-post")
    assert [int(r["window"]) for r in rows] == [16]  # post-norm only at --post-windows
    # the controls, each changing one thing (6.8): they run from the command line too
    rows = run("segtree_quality", "--windows", "16", "--arms",
               "segtree-norel,segtree-bpt1,segtree-bpt4,shaw-local")
    assert [r["arm"] for r in rows] == ["segtree-norel", "segtree-bpt1", "segtree-bpt4",
                                        "shaw-local"]
    assert all(near_uniform(float(r["valid_bpc"]), within=1.0) for r in rows)

    rows = run("segtree_reach")
    bands = ["1-2", "3-4", "5-8", "9-16", "17-32", "33-63"]
    question = [(a, d) for a in ("segtree", "segtree, 1 layer", "dense, window 16",
                                 "dense, window 64") for d in ["1-63", *bands]]
    assert [(r["arm"], r["distance"]) for r in rows[:28]] == question
    assert [r["task"] for r in rows[:28]] == (["flag question"] + ["flag question by "
                                                                   "distance"] * 6) * 4
    assert [(r["task"], r["arm"]) for r in rows[28:]] == [
        ("recall", "segtree"), ("recall", "dense, window 16"), ("recall", "dense, window 64")]
    assert all(0 <= float(r["accuracy"]) <= 1 and int(r["cases"]) > 0 for r in rows)
    assert all(float(r["bits"]) > 0 for r in rows)
    assert all(r["distance"] == "28" for r in rows[28:])
    assert all(0 <= float(r["accuracy_far"]) <= 1 for r in rows[:28:7])
    for whole in range(0, 28, 7):  # the bands split the 2,048 questions: their cases add up,
        parts = rows[whole + 1:whole + 7]  # and so do the right answers
        assert sum(int(r["cases"]) for r in parts) == int(rows[whole]["cases"]) == 2048
        right = sum(float(r["accuracy"]) * int(r["cases"]) for r in parts)
        assert abs(right - float(rows[whole]["accuracy"]) * 2048) < 1e-3

    rows = run("nanogpt_race")
    assert [(r["program"], r["round"]) for r in rows] == [
        ("nanoGPT", "1"), ("minixl", "1"), ("minixl --dtype fp32", "1"),
        ("nanoGPT", "2"), ("minixl", "2"), ("minixl --dtype fp32", "2")]
    nanogpt = {r["held_out_bpc"] for r in rows if r["program"] == "nanoGPT"}
    assert nanogpt == {"2.0"}  # the stand-in's 1.3863 nats
    assert all(near_uniform(float(r["held_out_bpc"]), within=1.5)  # 3 steps, in bits
               for r in rows if r["program"] != "nanoGPT")
    out = capsys.readouterr().out
    assert "minixl's time / nanoGPT's: median " in out
    assert "minixl --dtype fp32's time / nanoGPT's: median " in out

    rows = run("xlnet_memory")
    assert [(r["arm"], r["mem_len"], r["reuse_len"], r["bi_data"]) for r in rows] == [
        ("random windows", "0", "0", "False"),
        ("ordered streams", "0", "0", "False"),
        ("ordered streams + memory", "16", "0", "False"),
        ("pretraining input + memory", "16", "32", "True")]
    assert all(near_uniform(float(r[k]), within=1.0) for r in rows  # 2 steps, in bits
               for k in ("bpc_windows", "bpc_memory", "bpc_infill"))
    from minixl.xlnet.experiments import LAYOUT_COLUMNS
    for r in rows:  # the readings with segment ids: the pretraining input's arm only
        assert all((r[k] != "") == (r["reuse_len"] != "0") for k in LAYOUT_COLUMNS)
    pre = rows[-1]  # one segment: the same scores as no ids (softmax ignores a row's constant)
    for k in ("windows", "memory", "infill"):
        assert abs(float(pre[f"bpc_{k}_one_segment"]) - float(pre[f"bpc_{k}"])) < 1e-3
    assert near_uniform(float(pre["bpc_layout"]), within=1.0)
    assert near_uniform(float(pre["bpc_layout_no_segments"]), within=1.0)
    # --arms runs just those
    rows = run("xlnet_memory", "--arms", "ordered streams + memory", "--steps", "1")
    assert [r["arm"] for r in rows] == ["ordered streams + memory"]

    rows = run("xlnet_k_cost")
    assert [(r["K"], r["n_predict"]) for r in rows] == [("1", "64"), ("4", "16")]
    for r in rows:  # the two streams add up; the content stream is the same for every K
        assert abs(float(r["content_gflops"]) + float(r["query_gflops"]) - float(r["gflops"])) \
            < 2e-4
        assert 0 < float(r["fastest_ms"]) <= float(r["median_ms"])
    assert rows[0]["content_gflops"] == rows[1]["content_gflops"]
    assert float(rows[1]["query_gflops"]) * 4 == pytest.approx(float(rows[0]["query_gflops"]),
                                                               rel=1e-3)
    assert float(rows[0]["fastest_ratio"]) == float(rows[0]["flops_ratio"]) == 1.0
    assert float(rows[1]["flops_ratio"]) < 1.0

    rows = run("xlnet_objectives", "--arms", "XLNet spans, 11 targets; causal, 64 targets")
    assert [(r["arm"], r["objective"], r["targets"]) for r in rows] == [
        ("XLNet spans, 11 targets", "spans", "11"), ("causal, 64 targets", "causal", "64")]
    assert all(near_uniform(float(r[k]), within=1.0) for r in rows
               for k in ("bpc_infill", "bpc_left_to_right"))
    # exercise 5's arms run by name only; the default is section 5.8's five
    rows = run("xlnet_objectives", "--arms", "XLNet, 16 targets")
    assert [(r["arm"], r["objective"], r["targets"]) for r in rows] == [
        ("XLNet, 16 targets", "permutation", "16")]
    from minixl.xlnet.experiments import OBJECTIVE_ARMS
    assert "XLNet, 16 targets" not in OBJECTIVE_ARMS and len(OBJECTIVE_ARMS) == 5

    rows = run("xl_eval_speed")
    assert [r["A"] for r in rows] == ["8", "16"]
    assert all(float(r["predicted_kv"]) > float(r["predicted_states"]) > 1 for r in rows)
    rows = run("xl_eval_speed", "--preset", "tiny", "--lengths", "256")  # tiny's sizes
    assert [r["A"] for r in rows] == ["256"] and float(rows[0]["sliding_us"]) > 0


@pytest.mark.parametrize("argv,message", [
    (["depth", "--depths", "1", "--norms", "mid"], "--norms takes 'pre', 'post' or 'pre,post'"),
    (["positions", "--depths", "0"], "--depths needs at least one integer"),
    (["xl_eval_speed", "--lengths", "2"], "every length >= tgt_len"),
    (["xlnet_objectives", "--arms", "XLNet"], "unknown arm(s) XLNet: expected some of"),
    (["xlnet_k_cost", "--ks", "1,100"], "another K up to seq_len 64"),
    (["xlnet_k_cost", "--ks", "2,4"], "--ks needs K = 1 (the ratios are to it)"),
    (["xl_eval_speed", "--lengths", "32,x"], "--lengths takes comma-separated integers"),
    (["segtree_cost", "--max-n", "128"], "need 2 <= min_n <= max_n"),
    (["segtree_cost", "--methods", "segtree,tree"], "unknown method(s) tree"),
    (["models", "--models", "nope"], "unknown model 'nope'"),
    (["nanogpt_race", "--nanogpt", ".", "--text", "x"], "--nanogpt .: expected a checkout"),
    (["xlnet_memory", "--arms", "ordered streams;memory"], "unknown arm(s) memory: expected "
                                                          "some of random windows; ordered"),
    (["shaw_positions", "--arms", "shaw,rope"], "unknown arm(s) rope: expected some of "
                                                 "per_layer, per_layer_scaled"),
    (["aux_ablation", "--arms", "plain;bogus"], "unknown arm(s) bogus: expected some of plain; "
                                                "+ positions; + layers"),
])
def test_bad_options_are_one_clear_line_and_write_nothing(argv, message, tmp_path, capsys):
    path = tmp_path / "x.csv"
    from minixl.experiments import main as run_entry

    assert run_entry([*argv, "--csv", str(path)]) == 2
    err = capsys.readouterr().err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(
        "python -m minixl.experiments: error: "), err
    assert message in err and "Traceback" not in err, err
    assert not path.exists()


def test_hf_xl_without_transformers_4_37_is_one_clear_line(tmp_path, capsys):
    """With transformers 4.37.x the entry runs (a CSV); without it, exit 2 and one line that
    says how to install it."""
    if _hf_ready():
        pytest.skip("transformers 4.37 is installed: the entry runs (tested above)")
    out = tmp_path / "hf.csv"
    assert main(["bench", "--suite", "hf-xl", *TINY["hf-xl"][0], "--csv", str(out)]) == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("minixl bench: error: hf-xl needs "
                                                   "transformers 4.37.x"), lines
    assert "pip install 'minixl[hf-transfoxl]'" in lines[0] and not out.exists()


def test_the_extra_pins_the_last_transfoxl_release():
    text = (ROOT / "pyproject.toml").read_text()
    assert 'hf-transfoxl = ["transformers==4.37.2"]' in text


@pytest.mark.skipif(not _hf_ready(), reason="needs transformers 4.37.x (the hf-transfoxl "
                    "extra); the clear error without it is tested above")
def test_hf_xl_times_both_at_the_same_config():
    import math

    import torch

    from minixl.transformer_xl.experiments import hf_transfoxl, hf_xl
    from minixl.kinds import KINDS

    sizes = dict(n_layer=1, d_model=32, n_head=2, d_head=16, d_inner=64, tgt_len=16, mem_len=16)
    (r,) = hf_xl(preset="tiny", batch_size=2, steps=2, warmup=1, rounds=2, device="cpu", **sizes)
    assert r["minixl_tokens_per_s"] > 0 and r["hf_tokens_per_s"] > 0
    assert math.isclose(r["ratio"], r["minixl_tokens_per_s"] / r["hf_tokens_per_s"])
    assert r["minixl_params"] == r["hf_params"]
    out = hf_transfoxl(KINDS["xl"].config(**sizes))(input_ids=torch.randint(0, 256, (2, 16)))
    assert out.prediction_scores.shape == (2, 16, 256)


def test_eval_flops_count_what_each_protocol_redoes():
    from minixl.transformer_xl.experiments import eval_flops_per_byte

    sizes = dict(n_layer=2, d_model=16, n_head=2, d_head=8, d_inner=32, vocab_size=10)
    # A segment as long as the window predicts A bytes with the work of one window.
    assert eval_flops_per_byte("sliding", 64, **sizes, tgt_len=64) == 64 * eval_flops_per_byte(
        "states", 64, **sizes, tgt_len=64)
    # The hidden-state memory re-projects A - T states into keys and values, and A distances.
    C, HD, A, T = 16, 16, 96, 32
    extra = 2 * ((A - T) * 3 * C * HD + A * C * HD) / T
    assert abs(eval_flops_per_byte("states", A, **sizes, tgt_len=T)
               - eval_flops_per_byte("kv", A, **sizes, tgt_len=T) - extra) < 1e-6
    ratio = [eval_flops_per_byte("sliding", a, **sizes) / eval_flops_per_byte("kv", a, **sizes)
             for a in (256, 512, 1024)]
    assert ratio[0] < ratio[1] < ratio[2]
    for bad, message in [(("window", 64), "protocol"), (("kv", 16), "tgt_len")]:
        with pytest.raises(ValueError, match=message):
            eval_flops_per_byte(*bad, **sizes)


def test_the_readme_lists_every_entry_with_its_csv():
    readme = (Path(__file__).parent.parent / "docs" / "experiments.md").read_text()
    block = readme[readme.index("default is small enough for a laptop CPU"):]
    block = block[block.index("```\n") + 4:]
    listed = [(line.split()[0], line.split()[-1]) for line in block[:block.index("```")]
              .splitlines()]
    unlisted = [e.name for e in EXPERIMENTS.values() if (e.name, e.csv) not in listed]
    assert not unlisted, f"add {', '.join(unlisted)} (name, what it measures, CSV) to the " \
                         "table of entries in docs/experiments.md"
    assert listed == [(e.name, e.csv) for e in EXPERIMENTS.values()]


@pytest.mark.slow  # over 1.5 s: the quick loop stays well under a minute
def test_the_flag_task_gives_one_answer_run_to_run(monkeypatch):
    """Chapter 6.9's flag task, tiny, twice: here, and in a fresh process whose torch uses two
    threads. The task pins its own thread count (every batch is drawn on one thread, whatever
    the caller set) and restores the caller's, so the two runs give the same accuracies to the
    last digit."""
    import torch

    from minixl.segtree import experiments

    settings = dict(window_steps=30, tree_steps=15, eval_size=256, n_layer=1, d_model=32,
                    n_head=2, d_inner=64)
    seen, draw = [], experiments.flag_batch

    def watched(*args, **kwargs):
        seen.append(torch.get_num_threads())
        return draw(*args, **kwargs)

    monkeypatch.setattr(experiments, "flag_batch", watched)
    before = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        here = experiments.flag_reach(**settings)
        assert torch.get_num_threads() == 2  # the caller's count is back
    finally:
        torch.set_num_threads(before)
    assert len(seen) == 1 + 30 + 15 + 15 and set(seen) == {1}
    code = ("import json, torch; torch.set_num_threads(2); "
            "from minixl.segtree.experiments import flag_reach; "
            f"print(json.dumps(flag_reach(**{settings!r})))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True, env={**os.environ, "OMP_NUM_THREADS": "2"})
    there = {name: tuple(v) for name, v in json.loads(out.stdout.splitlines()[-1]).items()}
    assert there == here
    assert set(here) == {"dense, last 16 bytes", "dense, all 64 bytes", "SegTree, root"}
    assert all(0 <= a <= 1 for accs in here.values() for a in accs)
    with pytest.raises(ValueError, match=r"unknown arm\(s\) \['all'\]: expected any of "
                                         r"\['dense', 'root', 'window'\]"):
        experiments.flag_reach(arms=("all",), **settings)


def test_the_layout_reading_is_the_pretraining_input_read_left_to_right():
    """layout_input cuts text as PretrainStreams does (B A's continuation), gives training's
    segment ids, and lets each target see the context and the bytes before it, nothing else."""
    import torch

    from minixl.xlnet.experiments import layout_input
    from minixl.xlnet import CLS, SEP, pretraining_masks

    T, R, a_len = 16, 6, 3
    text = torch.randint(0, 256, (2, T - 3))
    x, (content, query), targets, seg = layout_input(text, seq_len=T, reuse_len=R, a_len=a_len)
    assert x[0].tolist() == (text[0, :R + a_len].tolist() + [SEP] + text[0, R + a_len:].tolist()
                             + [SEP, CLS])
    assert torch.equal(seg, pretraining_masks(x, R, (1, 1))[2])  # the ids training gave
    assert targets[0].tolist() == [p for p in range(T) if p >= R and x[0, p] < SEP]
    assert not content[:R, R:].any() and content[R:, :R].all()  # as pretraining_masks
    assert torch.equal(content[:R, R:], pretraining_masks(x, R, (1, 1))[0][0][0, :R, R:])
    context = [p for p in range(T) if p < R or x[0, p] >= SEP]
    for n, p in enumerate(targets[0].tolist()):  # the n-th byte predicted sees: context, the
        assert query[p].nonzero().flatten().tolist() == sorted(context + targets[0, :n].tolist())
        assert not query[p, p] and content[p, p]  # bytes before it; never itself
    with pytest.raises(ValueError, match="a_len must leave A and B"):
        layout_input(text, seq_len=T, reuse_len=R, a_len=T - R - 3)


def test_segment_ids_matter_only_where_they_differ():
    """XLNet's segment term compares ids: one id for every position changes no score."""
    import torch

    from minixl.xlnet.experiments import _OneSegment
    from minixl.xlnet import XLNet, XLNetConfig

    torch.manual_seed(0)
    model = XLNet(XLNetConfig(n_layer=1, d_model=16, n_head=2, d_inner=32, seq_len=8,
                              n_predict=2, mem_len=4)).eval()
    with torch.no_grad():  # a trained model's size of segment term, not the initial one's
        for name, p in model.named_parameters():
            if "seg" in name or "r_s" in name:
                p.normal_()
    x = torch.randint(0, 256, (2, 8))
    plain = model(x).logits
    assert torch.allclose(_OneSegment(model)(x).logits, plain, atol=1e-5)
    two = torch.tensor([0] * 4 + [1] * 4).expand(2, 8)
    assert not torch.allclose(model(x, segments=two).logits, plain, atol=1e-3)
    logits, _ = _OneSegment(model).step(x)  # the model protocol goes through it too
    assert torch.allclose(logits, model.step(x)[0], atol=1e-5)


def test_the_segtree_controls_change_one_thing_each():
    """segtree-norel has its tree position vectors at zero and frozen through training;
    shaw-local's byte i reads exactly bytes i - width + 1 .. i; BPT's arms use BPT's rule."""
    import torch

    from minixl.data import RandomWindows
    from minixl.segtree.experiments import _arm, leaf_keys
    from minixl.training import TrainConfig, train

    torch.manual_seed(0)
    model = _arm("segtree-norel", 32, 8)
    train(model, TrainConfig(steps=3, batch_size=2, lr=1e-2, warmup=0, seed=0),
          batches=RandomWindows(torch.randint(0, 256, (4096,)), 2, 32, seed=0), progress=False)
    rels = [m.rel_k for m in model.modules() if hasattr(m, "rel_k")]
    assert rels and all(not r.requires_grad and not r.any() for r in rels)
    assert _arm("segtree-bpt4", 32, 8).config.rule == "bpt" and _arm(
        "segtree-bpt4", 32, 8).config.k == 4

    width = leaf_keys(64)
    assert 2 < width < 64
    shaw = _arm("shaw-local", 64, 8).eval()
    x = torch.randint(0, 256, (1, 64))
    y = shaw(x)
    changed = x.clone()
    changed[0, 10] = (x[0, 10] + 1) % 256  # byte 10 reaches bytes 10 .. 10 + 2 (width - 1)
    moved = (shaw(changed) - y).abs().amax(-1)[0] > 1e-6
    reach = 2 * (width - 1)  # two layers of a band of `width` keys
    assert moved[10:10 + reach + 1].all() and not moved[:10].any()
    assert not moved[10 + reach + 1:].any()


@pytest.mark.parametrize("recipe", ["cpu", "shakespeare", "gpt2-small"])
def test_the_race_gives_both_programs_one_recipe(recipe, tmp_path):
    """nanoGPT's flags and minixl's name the same shape, dropout, learning rate and warm-up,
    and the same device and compile setting; the CPU recipe is the one the stored race ran."""
    from minixl.char_transformer.experiments import RACE_RECIPES, race_commands

    commands = race_commands(tmp_path, tmp_path / "input.txt", str(tmp_path), steps=7,
                             dtypes=["auto"], recipe=recipe, device="cuda", compile=True)
    nano = dict(a[2:].split("=", 1) for a in commands["nanoGPT"][0][3:])
    argv = commands["minixl"][0]
    mine = {argv[i][2:]: argv[i + 1] for i in range(argv.index("train") + 1, len(argv) - 1)
            if argv[i].startswith("--") and not argv[i + 1].startswith("--")}
    pairs = {"n_layer": "n-layer", "n_head": "n-head", "n_embd": "d-model",
             "block_size": "block-size", "batch_size": "batch-size", "max_iters": "steps",
             "warmup_iters": "warmup"}
    assert {k: int(nano[k]) for k in pairs} == {k: int(mine[m]) for k, m in pairs.items()}
    assert float(nano["dropout"]) == float(mine["dropout"])
    assert float(nano["learning_rate"]) == float(mine["lr"])
    assert int(mine["d-inner"]) == 4 * int(nano["n_embd"])  # nanoGPT's MLP is 4 wide
    assert nano["device"] == mine["device"] == "cuda"
    assert nano["compile"] == "True" and "--compile" in argv
    layers, heads, width, window, batch, dropout, lr = RACE_RECIPES[recipe]
    assert (int(nano["n_layer"]), int(nano["n_embd"]), int(nano["block_size"])) == (
        layers, width, window)
    if recipe == "cpu":
        assert (layers, heads, width, window, batch, dropout, lr) == (4, 4, 128, 64, 12, 0.0,
                                                                      1e-3)


def test_without_csv_an_entry_writes_under_runs_not_a_book_folder_in_the_current_one(tmp_path):
    """Run from any folder but the book's checkout, an entry with no --csv writes under runs/
    (named in its --help), never making book/ where the user stands; from the checkout's root
    it writes its place in the book, as the stored results were made."""
    from minixl.experiments import default_csv

    r = subprocess.run([sys.executable, "-m", "minixl.experiments", "shaw_cost",
                        *TINY["shaw_cost"][0]], cwd=tmp_path, capture_output=True, text=True,
                       timeout=300)
    assert r.returncode == 0, r.stderr
    assert r.stdout.rstrip().endswith("rows written to runs/bench_shaw.csv"), r.stdout
    assert (tmp_path / "runs" / "bench_shaw.csv").is_file()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["runs"]  # no book/ made here
    helped = subprocess.run([sys.executable, "-m", "minixl.experiments", "bench_all", "--help"],
                            cwd=tmp_path, capture_output=True, text=True, timeout=120).stdout
    assert "else runs/bench/quality.csv" in " ".join(helped.split())
    assert default_csv("book/bench/quality.csv", tmp_path) == "runs/bench/quality.csv"
    assert default_csv("book/bench/quality.csv", ROOT) == "book/bench/quality.csv"


@pytest.mark.slow
def test_bench_all_trains_and_scores_on_the_corpus_it_is_given(tmp_path):
    """--corpus takes any corpus `minixl train` takes: the arms train and are scored on it (a
    text of one repeated phrase is learned to far fewer bits than varied prose, at the same
    settings), its name, digest and training bytes join the settings (so a folder of one
    corpus refuses to resume with another), and the decision table counts passes over it."""
    from minixl.data import load_corpus

    prose = tmp_path / "prose.txt"
    prose.write_text((ROOT / "README.md").read_text() * 4)
    repeated = tmp_path / "repeated.txt"
    repeated.write_text("the same short phrase, again; " * 4000)
    tiny = ["--budgets", "1e9", "--params", "20000", "--seeds", "0", "--models", "char",
            "--lengths", "32", "--distances", "16,64", "--batch-size", "4", "--eval-bytes",
            "1024", "--reach-eval", "10"]
    bpc = {}
    for text in (prose, repeated):
        out = tmp_path / text.stem / "quality.csv"
        r = subprocess.run([sys.executable, "-m", "minixl.experiments", "bench_all", *tiny,
                            "--corpus", str(text), "--csv", str(out)], capture_output=True,
                           text=True, cwd=tmp_path, timeout=600)
        assert r.returncode == 0, r.stderr
        (row,) = _read(out)
        settings = json.loads(row["settings"])
        train_bytes = int(load_corpus(str(text)).train.numel())
        assert settings["corpus"] == text.name and settings["corpus_train_bytes"] == train_bytes
        passes = int(row["steps"]) * 4 * 32 / train_bytes
        assert f"steps (corpus passes) char {row['steps']} ({passes:.1f})" in \
            (out.parent / "decisions.md").read_text()
        bpc[text.stem] = float(row["own_bpc"])
    assert bpc["repeated"] < bpc["prose"] - 0.5, bpc  # the same run on pydoc for both: equal
    r = subprocess.run([sys.executable, "-m", "minixl.experiments", "bench_all", *tiny,
                        "--corpus", str(prose), "--csv", str(tmp_path / "repeated" /
                                                             "quality.csv")],
                       capture_output=True, text=True, cwd=tmp_path, timeout=600)
    assert r.returncode == 2 and "holds a run with other settings" in r.stderr, r.stderr
