"""The benchmark suites of `minixl bench --suite NAME` at tiny settings: each writes a CSV with
its columns and values that hang together, and bad settings give one clear line. (The numbers
themselves are the benchmarks' to report, not the tests'.)"""

import csv
import math
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from minixl import bench
from minixl.bench import (SUITES, hf_xl_suite, markdown_table, models_suite, peak_tflops,
                          sliding_nll, write_csv)
from minixl.cli import build_parser, main
from minixl.models import KINDS

ROOT = Path(__file__).resolve().parent.parent

pytestmark = pytest.mark.usefixtures("one_thread")  # see tests/conftest.py


def _hf_ready() -> bool:
    try:
        import transformers
    except ImportError:
        return False
    return transformers.__version__.startswith(bench.HF_VERSION + ".")


def _read(path: Path) -> list[dict]:
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


def test_the_registry_is_what_the_command_line_offers():
    assert {"models", "hf-xl", "xl-eval", "segtree"} <= set(SUITES)
    choices = next(a for a in build_parser()._subparsers._group_actions[0].choices["bench"]
                   ._actions if a.dest == "suite").choices
    assert list(choices) == list(SUITES)
    for suite in SUITES.values():
        assert suite.csv.startswith("book/") and suite.csv.endswith(".csv") and suite.columns


def test_peaks_by_device_name():
    assert peak_tflops("NVIDIA H100 80GB HBM3") == 989.0  # the SXM part's dense bf16 peak
    assert peak_tflops("NVIDIA H100 PCIe") == 756.0
    assert peak_tflops("NVIDIA H200") == 989.0
    assert peak_tflops("Some GPU") is None


def test_write_csv_is_atomic_and_the_table_has_every_row(tmp_path):
    rows = [{"a": 1, "b": 2.5, "c": None}, {"a": 12345, "b": 0.001, "c": "x"}]
    path = write_csv(rows, tmp_path / "sub" / "t.csv")
    assert [r["a"] for r in _read(path)] == ["1", "12345"]
    assert not list(path.parent.glob("*.part"))
    table = markdown_table(rows).splitlines()
    assert table[0] == "| a | b | c |" and len(table) == 4 and "12,345" in table[3]
    with pytest.raises(ValueError, match="no rows"):
        write_csv([], tmp_path / "u.csv")


# ---------------------------------------------------------------- models

def test_models_suite_measures_each_model_in_its_own_process():
    rows = models_suite(preset="tiny", batch_size=2, steps=1, warmup=0, device="cpu",
                        models=["char", "xl"])
    assert [r["model"] for r in rows] == ["char", "xl"]
    for r in rows:
        kind = KINDS[r["model"]]
        model = kind.build(kind.preset("tiny")[0])
        assert r["params"] == sum(p.numel() for p in model.parameters())
        assert r["tokens_per_s"] > 0 and r["seq_len"] == getattr(model.config, kind.length)
        # TFLOP/s is the model's FLOPs per token times tokens/s
        assert math.isclose(r["tflops"], kind.flops(model) * r["tokens_per_s"] / 1e12,
                            rel_tol=1e-9)
        assert r["mfu"] is None and r["device"] == "cpu"  # no peak for a CPU
        assert r["peak_mb"] > 50 and r["memory"] == "peak RSS of the process"
        assert r["torch"] == torch.__version__ and r["batch_size"] == 2


def test_models_suite_default_is_the_paper_scale_presets():
    assert bench.PAPER_SCALE == {"char": "t12", "xl": "xl-base", "xlnet": "xlnet-base",
                                 "segtree": "segtree-base", "shaw": "base"}
    assert set(bench.PAPER_SCALE) == set(KINDS)


def test_models_suite_from_the_command_line(tmp_path, capsys):
    """One paper-scale preset names one model: the suite measures only that one (here at a
    batch of 1 and 1 step: t12 on the CPU is slow but small)."""
    out = tmp_path / "m.csv"
    assert main(["bench", "--suite", "models", "--preset", "t12", "--batch-size", "1",
                 "--steps", "1", "--warmup", "0", "--device", "cpu", "--csv", str(out)]) == 0
    rows = _read(out)
    assert [(r["model"], r["preset"]) for r in rows] == [("char", "t12")]
    assert set(SUITES["models"].columns) <= set(rows[0])
    assert float(rows[0]["tokens_per_s"]) > 0 and rows[0]["mfu"] == ""
    printed = capsys.readouterr().out
    assert printed.startswith("| model | preset |") and "| char | t12 | cpu |" in printed


# ---------------------------------------------------------------- hf-xl

HF_TINY = dict(n_layer=1, d_model=32, n_head=2, d_head=16, d_inner=64, tgt_len=16, mem_len=16)


@pytest.mark.skipif(not _hf_ready(), reason="needs transformers 4.37.x (the hf-transfoxl "
                    "extra); the clear error without it is tested below")
def test_hf_xl_suite_times_both_at_the_same_config():
    from minixl.bench import hf_transfoxl

    (r,) = hf_xl_suite(preset="tiny", batch_size=2, steps=2, warmup=1, rounds=2, device="cpu",
                       **HF_TINY)
    assert r["minixl_tokens_per_s"] > 0 and r["hf_tokens_per_s"] > 0
    assert math.isclose(r["ratio"], r["minixl_tokens_per_s"] / r["hf_tokens_per_s"])
    # the same model on both sides: the same parameters, and on the same weights-free input
    # both give a next-byte distribution over 256 bytes
    assert r["minixl_params"] == r["hf_params"]
    cfg = KINDS["xl"].config(**HF_TINY)
    hf = hf_transfoxl(cfg)
    out = hf(input_ids=torch.randint(0, 256, (2, 16)))
    assert out.prediction_scores.shape == (2, 16, 256)


def test_hf_xl_without_transformers_4_37_is_one_clear_line(tmp_path):
    """With transformers 4.37.x the suite runs (a CSV); without it, exit 2 and one line that
    says how to install it. Run as a user does, in a fresh process."""
    out = tmp_path / "hf.csv"
    argv = ["--suite", "hf-xl", "--preset", "tiny", "--batch-size", "2", "--steps", "1",
            "--warmup", "0", "--device", "cpu", "--csv", str(out)]
    argv += [f"--{k.replace('_', '-')}={v}" for k, v in HF_TINY.items()]
    r = subprocess.run([sys.executable, "-m", "minixl", "bench", *argv], capture_output=True,
                       text=True, cwd=ROOT, timeout=300)
    if _hf_ready():
        assert r.returncode == 0, r.stderr
        assert float(_read(out)[0]["ratio"]) > 0
    else:
        assert r.returncode == 2, r.stderr
        lines = r.stderr.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("minixl bench: error: --suite hf-xl "
                                                       "needs transformers 4.37.x"), r.stderr
        assert "pip install 'minixl[hf-transfoxl]'" in lines[0] and not out.exists()


def test_the_extra_pins_the_last_transfoxl_release():
    text = (ROOT / "pyproject.toml").read_text()
    assert 'hf-transfoxl = ["transformers==4.37.2"]' in text


# ---------------------------------------------------------------- xl-eval

def test_sliding_nll_is_one_window_at_a_time():
    """The batched sliding window scores each byte as a window of its own would."""
    torch.manual_seed(0)
    kind = KINDS["xl"]
    model = kind.build(kind.config(**HF_TINY)).eval()
    data = torch.randint(0, 256, (40,), dtype=torch.uint8)
    got = sliding_nll(model, data, seq_len=24, batch_size=5)
    assert got.shape == (16,)
    with torch.no_grad():
        for i in (0, 7, 15):
            seq = data[i:i + 25].long()[None]
            logits, _ = model.step(seq[:, :-1])
            want = F.cross_entropy(logits[0, -1:], seq[0, -1:])
            assert torch.allclose(got[i], want, atol=1e-5), i
    with pytest.raises(ValueError, match="need more than seq_len = 40 bytes"):
        sliding_nll(model, data, seq_len=40)


def test_xl_eval_suite_columns_and_consistency(tmp_path, capsys):
    out = tmp_path / "xe.csv"
    assert main(["bench", "--suite", "xl-eval", "--lengths", "32,64", "--sliding-bytes", "8",
                 "--segments", "3", "--batch-size", "2", "--device", "cpu", "--csv",
                 str(out)]) == 0
    rows = _read(out)
    assert [int(r["attention_len"]) for r in rows] == [32, 64]
    assert set(SUITES["xl-eval"].columns) <= set(rows[0])
    for r in rows:
        A, T, M = int(r["attention_len"]), int(r["tgt_len"]), int(r["mem_len"])
        assert T + M == A and T == min(128, A // 2)  # tiny's tgt_len is 128
        assert int(r["sliding_bytes"]) == 8 and int(r["memory_bytes"]) == 2 * 3 * T
        slide = float(r["sliding_s_per_byte"])
        for name in ("cached", "uncached"):
            assert float(r[f"memory_{name}_s_per_byte"]) > 0
        assert math.isclose(float(r["speedup"]), slide / float(r["memory_cached_s_per_byte"]),
                            rel_tol=1e-6)
        assert math.isclose(float(r["speedup_uncached"]),
                            slide / float(r["memory_uncached_s_per_byte"]), rel_tol=1e-6)
        # the cache changes the cost, never the scores
        assert abs(float(r["memory_cached_bpc"]) - float(r["memory_uncached_bpc"])) < 1e-4
        for name in ("sliding_bpc", "memory_cached_bpc"):  # untrained, random bytes: ~8 bits
            assert 7 < float(r[name]) < 9, (name, r[name])
        assert r["model"] == "untrained xl tiny on random bytes"
    assert "| attention_len |" in capsys.readouterr().out


@pytest.mark.parametrize("argv,message", [
    (["--suite", "xl-eval", "--lengths", "32,x"], "--lengths takes comma-separated integers"),
    (["--suite", "xl-eval", "--lengths", "32", "--tgt-len", "32"],
     "--tgt-len must be between 1 and the attention length - 1, got 32 for attention length 32"),
    (["--suite", "xl-eval", "--lengths", "32", "--corpus", "pydoc", "--checkpoint", "nope.pt"],
     "nope.pt"),
    (["--suite", "models", "--n-layer", "2"], "--n-layer does not apply to --suite models"),
    (["--suite", "models", "--model", "xl"], "--suite models picks its own models; drop --model"),
    (["--suite", "xl-eval", "--compile"], "--compile applies to --suite models"),
])
def test_bad_suite_settings_are_one_clear_line(argv, message, tmp_path, capsys):
    out = tmp_path / "x.csv"
    assert main(["bench", *argv, "--device", "cpu", "--csv", str(out)]) == 2
    err = capsys.readouterr().err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("minixl bench: error: "), err
    assert message in err and "Traceback" not in err, err
    assert not out.exists()


def test_segtree_suite_still_runs_from_the_registry(tmp_path, capsys):
    out = tmp_path / "s.csv"
    assert main(["bench", "--suite", "segtree", "--max-n", "256", "--repeats", "1",
                 "--device", "cpu", "--csv", str(out)]) == 0
    rows = _read(out)
    assert {r["method"] for r in rows} >= {"segtree"} and all(r["n"] == "256" for r in rows)
    assert all(float(r["seconds"]) > 0 for r in rows)
    assert "written to" in capsys.readouterr().out


def test_shaw_suite_times_both_forms_and_names_the_choice(tmp_path, capsys):
    path = tmp_path / "shaw.csv"
    assert main(["bench", "--suite", "shaw", "--lengths", "4,24", "--repeats", "1",
                 "--device", "cpu", "--csv", str(path)]) == 0
    rows = list(csv.DictReader(open(path)))
    assert [(int(r["T"]), int(r["max_relative"])) for r in rows] == [(4, 4), (4, 16), (24, 4),
                                                                       (24, 16)]
    for r in rows:
        times = {"bucket": float(r["bucket_ms"]), "gathered": float(r["gathered_ms"])}
        assert min(times.values()) > 0 and r["fastest"] == min(times, key=times.get)
    # the chooser: gathered for 4 x 4 = 16 pairs, buckets for 24 x 24 = 576 (> 16 x 16)
    assert [r["chosen"] for r in rows] == ["gathered", "gathered", "bucket", "bucket"]
    assert "| T | max_relative |" in capsys.readouterr().out
