"""The trainer: the same weights as the book's loop, exact resumption after a real signal,
divergence, checkpoints and the resume check."""

import os
import random
import re
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import replace
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from conftest import train_args
from minixl import CharTransformer, CharTransformerConfig, lr_at
from minixl.bench import bench, peak_tflops
from minixl.checkpoint import (FORMAT, CheckpointError, check_resume, load_checkpoint,
                               save_checkpoint)
from minixl.cli import main
from minixl.data import RandomWindows, step_seed
from minixl.device import resolve_device
from minixl.models import KINDS
from minixl.trainer import TrainConfig, train

ROOT = Path(__file__).resolve().parent.parent
TINY = CharTransformerConfig(n_layer=2, d_model=32, n_head=4, d_inner=64, block_size=32)


@pytest.mark.parametrize("dropout", [0.0, 0.1])
def test_train_gives_the_weights_of_the_books_loop(dropout):
    """Chapter 1's loop, written out: the trainer must reproduce it bit for bit (with
    dropout, the trainer seeds each step's masks from the run's seed and the step)."""
    config = replace(TINY, dropout=dropout)
    data = torch.randint(0, 256, (5000,), generator=torch.Generator().manual_seed(0)).byte()
    steps, lr, warmup = 12, 3e-3, 4
    torch.manual_seed(0)
    model = CharTransformer(config)
    train(model, TrainConfig(steps=steps, batch_size=4, lr=lr, warmup=warmup, device="cpu"),
          batches=RandomWindows(data, 4, 32, seed=0), progress=False)

    torch.manual_seed(0)
    ref = CharTransformer(config)
    opt = torch.optim.AdamW(ref.parameters(), lr=lr, weight_decay=0.01)
    batches = RandomWindows(data, 4, 32, seed=0)
    for step in range(steps):
        x, y, _ = batches(step)
        for group in opt.param_groups:
            group["lr"] = lr_at(step, steps, lr=lr, warmup=warmup)
        if dropout:
            torch.manual_seed(step_seed(0, step, stream=1))  # this step's dropout masks
        logits, _ = ref.step(x)
        loss = F.cross_entropy(logits.flatten(0, 1), y.flatten())
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(ref.parameters(), 1.0)
        opt.step()
    for (name, a), b in zip(model.state_dict().items(), ref.state_dict().values()):
        assert torch.equal(a, b), name


def test_the_run_folder(char_run):
    assert {p.name for p in char_run.iterdir()} == {"checkpoint.pt", "metrics.csv", "loss.png"}
    rows = (char_run / "metrics.csv").read_text().splitlines()
    header, rows = rows[0].split(","), [r.split(",") for r in rows[1:]]
    assert [int(r[0]) for r in rows] == [2, 4, 6, 8]  # --log-every 2 --steps 8
    valid = header.index("valid_bpc")
    assert [bool(r[valid]) for r in rows] == [False, True, False, True]  # --eval-every 4
    ckpt = load_checkpoint(char_run / "checkpoint.pt", for_resume=True)
    assert ckpt["format"] == FORMAT and ckpt["step"] == 8 and ckpt["meta"]["kind"] == "char"
    assert len(ckpt["meta"]["corpus"]["sha256"]) == 64


# ---------------------------------------------------------------- real signals, real processes

def _cli(kind, out, corpus, steps, *extra):
    return [sys.executable, "-m", "minixl",
            *train_args(kind, out, steps, "--corpus", str(corpus), "--log-every", "1",
                        "--eval-every", "50", "--eval-bytes", "512", "--ckpt-every", "1000",
                        *extra)]


def _run(cmd):
    r = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT)
    assert r.returncode == 0, r.stderr
    return r


def _interrupt(cmd, metrics: Path, signum: int, delay: float, times: int = 1, gap: float = 0.0):
    """Start cmd, wait until it has logged its first step, sleep `delay`, send the signal."""
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            cwd=ROOT)
    deadline = time.monotonic() + 120
    while not (metrics.exists() and metrics.stat().st_size > 0):
        assert proc.poll() is None, proc.communicate()
        assert time.monotonic() < deadline, "the run never logged a step"
        time.sleep(0.01)
    time.sleep(delay)
    for i in range(times):
        proc.send_signal(signum)
        time.sleep(gap)
    out, err = proc.communicate(timeout=120)
    return proc.returncode, err


def _assert_same_checkpoint(a: Path, b: Path):
    ca, cb = load_checkpoint(a, for_resume=True), load_checkpoint(b, for_resume=True)
    assert ca["step"] == cb["step"]
    for name, t in ca["model"].items():
        assert torch.equal(t, cb["model"][name]), name
    sa, sb = ca["optimizer"]["state"], cb["optimizer"]["state"]
    assert sa.keys() == sb.keys()
    for k in sa:
        for field in ("step", "exp_avg", "exp_avg_sq"):
            assert torch.equal(sa[k][field], sb[k][field]), (k, field)
    if ca["state"] is None:
        assert cb["state"] is None
    else:  # Transformer-XL's memory
        assert all(torch.equal(x, y) for x, y in zip(ca["state"], cb["state"]))


@pytest.mark.parametrize("kind,signum", [("char", signal.SIGINT), ("shaw", signal.SIGTERM),
                                         ("xl", signal.SIGINT), ("xl", signal.SIGTERM)])
def test_a_signal_mid_run_then_resume_is_bit_exact(kind, signum, tmp_path, small_corpus):
    steps = 300
    whole = tmp_path / "whole"
    _run(_cli(kind, whole, small_corpus, steps))

    rng = random.Random(f"{kind}-{signum}")
    part = tmp_path / "part"
    code, err = _interrupt(_cli(kind, part, small_corpus, steps), part / "metrics.csv", signum,
                           delay=rng.uniform(0.0, 0.3))
    assert code == 128 + signum, err
    lines = err.strip().splitlines()
    assert "Traceback" not in err and lines[-1].startswith("minixl train: SIG")
    stopped = load_checkpoint(part / "checkpoint.pt")["step"]
    assert 0 < stopped < steps, "the signal arrived after the run had finished"
    assert f"stopped after step {stopped}" in lines[-1]

    _run(_cli(kind, part, small_corpus, steps, "--resume"))
    _assert_same_checkpoint(part / "checkpoint.pt", whole / "checkpoint.pt")
    assert not list(part.glob("*.part"))


def test_a_second_ctrl_c_aborts_at_once_and_saves_nothing(tmp_path, small_corpus):
    out = tmp_path / "run"
    # Steps of a few hundred ms, so that both signals land inside the same step.
    big = ["--d-model", "256", "--n-head", "4", "--d-inner", "1024", "--n-layer", "4",
           "--block-size", "128", "--batch-size", "16"]
    code, err = _interrupt(_cli("char", out, small_corpus, 500, *big), out / "metrics.csv",
                           signal.SIGINT, delay=0.05, times=2, gap=0.02)
    assert code == 130
    assert "interrupted; nothing was saved" in err and "Traceback" not in err
    assert not (out / "checkpoint.pt").exists()


def test_divergence_stops_the_run_and_keeps_the_last_good_checkpoint(tmp_path, char_run,
                                                                     small_corpus):
    run = Path(shutil.copytree(char_run, tmp_path / "run"))
    good = (run / "checkpoint.pt").read_bytes()
    cmd = train_args("char", run, 16, "--corpus", str(small_corpus), "--resume", "--lr", "1e30",
                     "--allow-change", "lr,steps")
    r = subprocess.run([sys.executable, "-m", "minixl", *cmd], capture_output=True, text=True,
                       cwd=ROOT)
    assert r.returncode == 3, r.stderr
    assert "training diverged" in r.stderr and "Traceback" not in r.stderr
    assert f"{run / 'checkpoint.pt'} (step 8)" in r.stderr
    assert (run / "checkpoint.pt").read_bytes() == good


def test_training_config_refuses_non_finite_and_out_of_range_values():
    for bad in (dict(lr=float("inf")), dict(lr=float("nan")), dict(lr=0.0), dict(steps=0),
                dict(batch_size=0), dict(grad_clip=-1.0), dict(min_lr_frac=2.0)):
        with pytest.raises(ValueError):
            TrainConfig(**bad)


# ---------------------------------------------------------------- checkpoints

def test_save_is_atomic_and_removes_stale_parts(tmp_path):
    path = tmp_path / "checkpoint.pt"
    save_checkpoint(path, {"format": FORMAT, "x": torch.ones(2)})
    stale = tmp_path / "checkpoint.pt.abc123.part"  # what SIGKILL during a save leaves
    stale.write_bytes(b"half a file")
    with pytest.raises(Exception):
        save_checkpoint(path, {"format": FORMAT, "x": lambda: 0})  # cannot be pickled
    assert torch.equal(torch.load(path, weights_only=True)["x"], torch.ones(2))
    assert [p.name for p in tmp_path.iterdir()] == ["checkpoint.pt"]


@pytest.mark.parametrize("content,message", [
    (b"", "is empty (0 bytes)"),
    (b"not a checkpoint at all", "cannot be read as a minixl checkpoint"),
    ({"weights": 1}, "is not a minixl-checkpoint-2 file"),
    ({"format": FORMAT, "step": 1, "model_config": {}, "meta": {}}, "has no 'model' entry"),
])
def test_unreadable_checkpoints_fail_clearly(tmp_path, content, message):
    path = tmp_path / "c.pt"
    if isinstance(content, bytes):
        path.write_bytes(content)
    else:
        torch.save(content, path)
    with pytest.raises(CheckpointError, match=re.escape(message)) as err:
        load_checkpoint(path)
    assert "weights_only" not in str(err.value)  # no advice to load untrusted pickles


def test_a_checkpoint_without_training_state_cannot_be_resumed(tmp_path, char_run):
    ckpt = load_checkpoint(char_run / "checkpoint.pt")
    del ckpt["train_config"]
    torch.save(ckpt, tmp_path / "c.pt")
    load_checkpoint(tmp_path / "c.pt")  # enough to evaluate and sample
    with pytest.raises(CheckpointError, match="has no 'train_config' entry.*for --resume"):
        load_checkpoint(tmp_path / "c.pt", for_resume=True)


def test_check_resume_lists_every_change_and_honours_allow():
    saved = {"model.d_model": 32, "lr": 1e-3, "seed": 0}
    with pytest.raises(CheckpointError) as err:
        check_resume(saved, {"model.d_model": 64, "lr": 2e-3, "seed": 0},
                     fixed={"model.d_model"}, allow=set())
    assert "model.d_model: 32 -> 64" in str(err.value) and "lr: 0.001 -> 0.002" in str(err.value)
    changes = check_resume(saved, {**saved, "lr": 2e-3}, fixed={"model.d_model"}, allow={"lr"})
    assert changes == {"lr": (1e-3, 2e-3)}
    assert "model.d_model cannot change on resume" in str(err.value)
    assert "--allow-change lr" in str(err.value)
    for name in ("colour", "model.d_model"):  # unknown, or part of the model
        with pytest.raises(ValueError, match="not a setting a resumed run can change"):
            check_resume(saved, saved, fixed={"model.d_model"}, allow={name})


# ---------------------------------------------------------------- the run's identity on resume

def _resume(run, corpus, *extra, steps=8):
    return main(train_args("char", run, steps, "--corpus", str(corpus), "--resume", *extra))


def test_resume_refuses_changed_settings_with_a_diff(tmp_path, char_run, small_corpus, capsys):
    run = Path(shutil.copytree(char_run, tmp_path / "run"))
    other = tmp_path / "other.txt"
    other.write_bytes(small_corpus.read_bytes()[::-1])  # same size, other text
    cases = [(("--lr", "0.01"), "lr: 0.002 -> 0.01"), (("--seed", "1"), "seed: 0 -> 1"),
             (("--d-model", "64"), "model.d_model: 32 -> 64"),
             (("--aux-losses", "none"), "objective: ")]
    for extra, diff in cases:
        assert _resume(run, small_corpus, *extra, steps=10) == 2
        err = capsys.readouterr().err
        assert diff in err and "Traceback" not in err, err
    assert _resume(run, other, steps=10) == 2
    assert "corpus: " in capsys.readouterr().err

    assert _resume(run, small_corpus) == 2  # the run is finished
    assert "--allow-change steps" in capsys.readouterr().err
    assert _resume(run, small_corpus, "--lr", "0.001", "--allow-change", "lr,steps",
                   steps=10) == 0
    assert "resuming with lr changed: 0.002 -> 0.001" in capsys.readouterr().out
    assert load_checkpoint(run / "checkpoint.pt")["step"] == 10


def test_the_folder_rules(tmp_path, small_corpus, capsys):
    out = tmp_path / "run"
    base = train_args("char", out, 2, "--corpus", str(small_corpus))
    assert main([*base, "--allow-change", "lr"]) == 2
    assert "--allow-change applies to --resume only" in capsys.readouterr().err
    assert main([*base, "--resume"]) == 2
    assert "no checkpoint" in capsys.readouterr().err
    assert main(base) == 0
    assert main(base) == 2  # a run is there
    assert "pass --resume to continue it, --overwrite" in capsys.readouterr().err
    assert main([*base, "--resume", "--overwrite"]) == 2
    assert "not both" in capsys.readouterr().err
    (out / "metrics.csv").write_text("step,train_bpc\n99,1.0\n")
    assert main([*base, "--overwrite"]) == 0
    assert "99," not in (out / "metrics.csv").read_text()


# ---------------------------------------------------------------- compile, bench, devices

def test_compiled_training_saves_plain_keys(tmp_path, monkeypatch, small_corpus):
    real = torch.compile
    monkeypatch.setattr(torch, "compile", lambda fn, **kw: real(fn, backend="eager"))
    out = tmp_path / "run"
    assert main(train_args("char", out, 2, "--corpus", str(small_corpus), "--compile")) == 0
    keys = load_checkpoint(out / "checkpoint.pt")["model"]
    assert keys and not any("_orig_mod" in k for k in keys)


@pytest.mark.parametrize("kind", ["char", "xl"])
def test_bench_on_the_cpu_reports_throughput_without_mfu(kind):
    cfg = {"char": TINY, "xl": KINDS["xl"].config(n_layer=1, d_model=32, n_head=2, d_head=16,
                                                   d_inner=64, tgt_len=16, mem_len=16)}[kind]
    r = bench(KINDS[kind], cfg, batch_size=2, steps=2, warmup=1, device="cpu")
    assert r["tokens_per_s"] > 0 and r["mfu"] is None and r["device"] == "cpu"


def test_peak_table_matches_names_exactly():
    assert peak_tflops("NVIDIA H100 80GB HBM3") == 989.0
    assert peak_tflops("NVIDIA H100 PCIe") == 756.0
    assert peak_tflops("NVIDIA H200") == 989.0
    assert peak_tflops("NVIDIA L4") == 121.0
    assert peak_tflops("NVIDIA L40") is None  # neither the L4 nor the L40S
    assert peak_tflops("Some Future GPU") is None


def test_devices():
    assert resolve_device("cpu").type == "cpu"
    with pytest.raises(ValueError, match="unknown device"):
        resolve_device("tpu")
    if not torch.cuda.is_available():
        with pytest.raises(ValueError, match="sees no CUDA GPU"):
            resolve_device("cuda")
