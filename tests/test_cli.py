import subprocess
import sys

import pytest

from minixl.cli import main

FLAGS = ["--n-layer", "1", "--d-model", "32", "--n-head", "2", "--d-inner", "64",
         "--block-size", "32", "--device", "cpu"]


def test_train_then_sample_then_eval(tmp_path, capsys):
    out = tmp_path / "run"
    assert main(["train", *FLAGS, "--steps", "6", "--batch-size", "4", "--eval-every", "3",
                 "--out", str(out), "--no-progress", "--sample-len", "20"]) == 0
    printed = capsys.readouterr().out
    assert "held-out bpc" in printed and "sample:" in printed
    ckpt = str(out / "checkpoint.pt")
    assert main(["sample", "--checkpoint", ckpt, "--prompt", "ab", "--n", "10"]) == 0
    assert capsys.readouterr().out.startswith("ab")
    assert main(["eval", "--checkpoint", ckpt, "--split", "test", "--device", "cpu"]) == 0
    assert "pydoc test:" in capsys.readouterr().out


@pytest.mark.parametrize("argv,msg", [
    (["train", "--preset", "huge"], "unknown preset 'huge'"),
    (["train", "--corpus", "nope", "--steps", "1"], "unknown corpus 'nope'"),
    (["train", "--d-model", "30", "--n-head", "4"], "not divisible"),
    (["sample", "--checkpoint", "missing.pt"], "no checkpoint at missing.pt"),
])
def test_bad_input_gives_one_clear_line_and_exit_2(argv, msg, capsys, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert msg in err and "Traceback" not in err


def test_bench_prints_tokens_per_second(capsys):
    assert main(["bench", *FLAGS, "--batch-size", "2", "--steps", "2"]) == 0
    out = capsys.readouterr().out
    assert "train tokens/s:" in out and "MFU: not reported on the CPU" in out


def test_python_dash_m_and_help():
    r = subprocess.run([sys.executable, "-m", "minixl", "--help"], capture_output=True, text=True)
    assert r.returncode == 0
    for cmd in ("train", "sample", "eval", "bench"):
        assert cmd in r.stdout
