"""The command line as a user meets it: a round trip, and one clear line for every bad input."""

import math
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from minixl.checkpoint import load_checkpoint
from minixl.cli import build_parser, main


def test_sample_and_eval_read_trained_runs(char_run, xl_run, capsys):
    for run in (char_run, xl_run):
        ckpt = str(run / "checkpoint.pt")
        assert main(["sample", "--checkpoint", ckpt, "--prompt", "ab", "--n", "10",
                     "--device", "cpu"]) == 0
        text = capsys.readouterr().out
        assert text.startswith("ab") and len(text.rstrip("\n").encode()) >= 10
        assert main(["eval", "--checkpoint", ckpt, "--split", "test", "--device", "cpu"]) == 0
        line = capsys.readouterr().out
        bpc = float(line.split(": ")[1].split()[0])
        assert 0 < bpc < 9, line
    assert "memory of 16" in line  # xl's default protocol carries the memory


def test_a_tiny_temperature_samples_greedily(char_run, capsys):
    ckpt = str(char_run / "checkpoint.pt")
    outs = []
    for seed in ("0", "1"):
        assert main(["sample", "--checkpoint", ckpt, "--n", "20", "--temperature", "1e-40",
                     "--seed", seed, "--device", "cpu"]) == 0
        outs.append(capsys.readouterr().out)
    assert outs[0] == outs[1]  # no randomness left: the likeliest byte every time


def test_help_lists_the_commands_and_says_steps_is_the_total():
    r = subprocess.run([sys.executable, "-m", "minixl", "--help"], capture_output=True, text=True)
    assert r.returncode == 0
    assert all(cmd in r.stdout for cmd in ("train", "sample", "eval", "bench"))
    assert "130/143" in r.stdout and "3 training diverged" in r.stdout
    train_help = " ".join(build_parser()._subparsers._group_actions[0].choices["train"]
                          .format_help().split())
    assert "total optimiser steps of the run (not steps to add)" in train_help


def _nan_checkpoint(run: Path, tmp: Path) -> Path:
    ckpt = load_checkpoint(run / "checkpoint.pt")
    name = next(iter(ckpt["model"]))
    ckpt["model"][name] = torch.full_like(ckpt["model"][name], math.nan)
    torch.save(ckpt, tmp / "nan.pt")
    return tmp / "nan.pt"


def _without(key):
    def make(run, tmp):
        ckpt = load_checkpoint(run / "checkpoint.pt")
        del ckpt[key]
        torch.save(ckpt, tmp / "c.pt")
        return tmp / "c.pt"
    return make


def _file(content: bytes):
    def make(run, tmp):
        (tmp / "c.pt").write_bytes(content)
        return tmp / "c.pt"
    return make


def _ckpt(run, tmp):
    return run / "checkpoint.pt"


TINY = ["--n-layer", "1", "--d-model", "32", "--n-head", "2", "--d-inner", "64",
        "--block-size", "32", "--steps", "1", "--no-progress", "--sample-len", "0"]

# (arguments, how to make the checkpoint they read (or None), what the one line must say)
BAD = [
    (["train", "--preset", "huge"], None, "unknown preset 'huge'"),
    (["train", "--corpus", "nope", "--steps", "1"], None, "unknown corpus 'nope'"),
    (["train", "--d-model", "30", "--n-head", "4"], None, "not divisible"),
    (["train", *TINY, "--lr", "inf"], None, "lr must be a finite number"),
    (["train", *TINY, "--lr", "nan"], None, "lr must be a finite number"),
    (["train", "--model", "xl", "--batch-size", "0"], None, "batch_size must be a positive"),
    (["train", *TINY, "--max-relative", "4"], None, "--max-relative applies to --model shaw"),
    (["sample", "--checkpoint", "{ckpt}", "--temperature", "nan"], _ckpt,
     "temperature must be a finite number > 0"),
    (["sample", "--checkpoint", "{ckpt}", "--temperature", "0"], _ckpt,
     "temperature must be a finite number > 0"),
    (["sample", "--checkpoint", "{ckpt}", "--n", "-1"], _ckpt, "--n is how many bytes"),
    (["sample", "--checkpoint", "missing.pt"], None, "no checkpoint at missing.pt"),
    (["sample", "--checkpoint", "{ckpt}"], _file(b""), "is empty (0 bytes)"),
    (["sample", "--checkpoint", "{ckpt}"], _file(b"\x80garbage"), "cannot be read as a minixl"),
    (["sample", "--checkpoint", "{ckpt}"], _without("model"), "has no 'model' entry"),
    (["sample", "--checkpoint", "{ckpt}"], _nan_checkpoint, "weights that are not finite"),
    (["eval", "--checkpoint", "{ckpt}", "--batch-size", "-1"], _ckpt,
     "batch_size must be a positive integer"),
    (["eval", "--checkpoint", "{ckpt}", "--batch-size", "0"], _ckpt,
     "batch_size must be a positive integer"),
    (["eval", "--checkpoint", "{ckpt}", "--seq-len", "0"], _ckpt,
     "seq_len must be a positive integer"),
    (["eval", "--checkpoint", "{ckpt}", "--protocol", "sliding", "--stride", "0"], _ckpt,
     "stride"),
    (["eval", "--checkpoint", "{ckpt}", "--protocol", "memory"], _ckpt,
     "--protocol memory does not apply to a --model char checkpoint"),
    (["eval", "--checkpoint", "{ckpt}", "--mem-len", "8"], _ckpt,
     "--mem-len applies to --model xl checkpoints"),
    (["train", *TINY, "--resume", "--out", "{run}", "--corpus", "{corpus}"],
     _without("train_config"), "has no 'train_config' entry"),
]


@pytest.mark.parametrize("argv,make,message", BAD, ids=[" ".join(a[:1] + [m]) for a, _, m in BAD])
def test_bad_input_gives_one_clear_line_and_exit_2(argv, make, message, char_run, small_corpus,
                                                   tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    ckpt, run = "", tmp_path / "run"
    if make is not None:
        ckpt = make(char_run, tmp_path)
        if "--resume" in argv:  # a run folder whose checkpoint is the damaged one
            run.mkdir()
            ckpt.rename(run / "checkpoint.pt")
    argv = [a.format(ckpt=ckpt, run=run, corpus=small_corpus) for a in argv]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert message in err, err
    lines = err.strip().splitlines()
    assert lines[0].startswith(f"minixl {argv[0]}: error:") and "Traceback" not in err
    assert "weights_only=False" not in err


@pytest.mark.parametrize("name", ["metrics.csv", "loss.png"])
def test_someone_elses_files_are_not_clobbered(name, tmp_path, small_corpus, capsys):
    out = tmp_path / "run"
    out.mkdir()
    (out / name).write_bytes(b"keep me")
    argv = ["train", *TINY, "--corpus", str(small_corpus), "--out", str(out)]
    assert main(argv) == 2
    assert "already holds a run" in capsys.readouterr().err
    assert (out / name).read_bytes() == b"keep me"


def _cache_folder_error(monkeypatch, cache, capsys):
    monkeypatch.setenv("MINIXL_DATA", str(cache))
    assert main(["train", "--corpus", "text8", "--steps", "1"]) == 2  # fails before any download
    err = capsys.readouterr().err
    assert f"cannot write to the corpus cache folder {cache}" in err and "MINIXL_DATA" in err
    assert "Traceback" not in err


def test_a_cache_folder_that_cannot_be_made_is_named_in_the_error(tmp_path, monkeypatch, capsys):
    (tmp_path / "a-file").write_text("")
    _cache_folder_error(monkeypatch, tmp_path / "a-file" / "cache", capsys)


@pytest.mark.skipif(hasattr(os, "geteuid") and os.geteuid() == 0,
                    reason="root may write into a read-only folder")
def test_a_read_only_cache_folder_is_named_in_the_error(tmp_path, monkeypatch, capsys):
    cache = tmp_path / "cache"
    cache.mkdir()
    cache.chmod(0o500)
    try:
        _cache_folder_error(monkeypatch, cache, capsys)
    finally:
        cache.chmod(0o700)


@pytest.mark.parametrize("model", ["char", "xl"])
def test_bench_prints_tokens_per_second(model, capsys):
    size = ["--n-layer", "1", "--d-model", "32", "--n-head", "2", "--d-inner", "64"]
    length = ["--block-size", "32"] if model == "char" else ["--tgt-len", "16", "--mem-len", "16"]
    assert main(["bench", "--model", model, *size, *length, "--batch-size", "2", "--steps", "2",
                 "--device", "cpu"]) == 0
    out = capsys.readouterr().out
    assert f"model: {model}" in out and "train tokens/s:" in out
    assert "MFU: not reported on the CPU" in out
