"""The trainer: the same weights as the book's loop, exact resumption after real signals (in
this process and in a real `minixl train` subprocess), divergence, checkpoints, the resume
check, compile, the benchmark and devices."""

import os
import pickle
import random
import re
import shutil
import signal
import subprocess
import sys
import threading
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
from minixl.evaluation import evaluate
from minixl.models import KINDS, ShawConfig
from minixl.trainer import TrainConfig, TrainingInterrupted, train

ROOT = Path(__file__).resolve().parent.parent
TINY = CharTransformerConfig(n_layer=2, d_model=32, n_head=4, d_inner=64, block_size=32)


pytestmark = pytest.mark.usefixtures("one_thread")  # see tests/conftest.py


# ---------------------------------------------------------------- the book's loop

@pytest.mark.parametrize("dropout", [0.0, 0.1])
def test_train_gives_the_weights_of_the_books_loop(dropout):
    """Chapter 1's loop, written out: the trainer must reproduce it bit for bit. Settings
    other than the defaults, so that each must reach the loop; the trainer seeds each step's
    dropout masks from the run's seed and the step."""
    config = replace(TINY, dropout=dropout)
    data = torch.randint(0, 256, (5000,), generator=torch.Generator().manual_seed(0)).byte()
    steps, B, seed = 12, 4, 7
    hp = dict(lr=3e-3, warmup=4, min_lr_frac=0.3)
    weight_decay, clip = 0.05, 0.5
    torch.manual_seed(0)
    model = CharTransformer(config)
    train(model, TrainConfig(steps=steps, batch_size=B, weight_decay=weight_decay,
                             grad_clip=clip, seed=seed, device="cpu", **hp),
          batches=RandomWindows(data, B, 32, seed=seed), progress=False)

    torch.manual_seed(0)
    ref = CharTransformer(config)
    opt = torch.optim.AdamW(ref.parameters(), lr=hp["lr"], weight_decay=weight_decay)
    batches, clipped = RandomWindows(data, B, 32, seed=seed), 0
    for step in range(steps):
        x, y, _ = batches(step)
        for group in opt.param_groups:
            group["lr"] = lr_at(step, steps, **hp)
        torch.manual_seed(step_seed(seed, step, stream=1))  # this step's dropout masks
        logits, _ = ref.step(x, None)
        loss = F.cross_entropy(logits.flatten(0, 1), y.flatten())
        opt.zero_grad(set_to_none=True)
        loss.backward()
        clipped += float(torch.nn.utils.clip_grad_norm_(ref.parameters(), clip)) > clip
        opt.step()
    assert clipped, "the clip never acted: this test would not notice a trainer without it"
    for (name, a), b in zip(model.state_dict().items(), ref.state_dict().values()):
        assert torch.equal(a, b), name


def test_the_run_folder(char_run):
    assert {p.name for p in char_run.iterdir()} == {"checkpoint.pt", "metrics.csv", "loss.png"}
    rows = (char_run / "metrics.csv").read_text().splitlines()
    header, rows = rows[0].split(","), [r.split(",") for r in rows[1:]]
    assert header[:4] == ["step", "train_bpc", "valid_bpc", "loss"]
    assert [int(r[0]) for r in rows] == [2, 4, 6, 8]  # --log-every 2 --steps 8
    valid = header.index("valid_bpc")
    assert [bool(r[valid]) for r in rows] == [False, True, False, True]  # --eval-every 4
    assert all(0 < float(r[1]) < 9 for r in rows)
    assert (char_run / "loss.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    ckpt = load_checkpoint(char_run / "checkpoint.pt", for_resume=True)
    assert ckpt["format"] == FORMAT and ckpt["step"] == 8 and ckpt["meta"]["kind"] == "char"
    assert ckpt["train_config"]["steps"] == 8 and ckpt["state"] is None
    assert len(ckpt["meta"]["corpus"]["sha256"]) == 64


# ---------------------------------------------------------------- real signals, in this process

STREAM = torch.randint(0, 256, (4 * 8 * 5 + 1,), generator=torch.Generator().manual_seed(1)).byte()


@pytest.fixture
def signal_guard():
    """SIGINT/SIGTERM handlers that record a signal the trainer failed to catch, instead of
    ending the test session; the test asserts the trainer put them back."""
    leaked = []

    def handler(signum, frame):
        leaked.append(signum)

    old = {s: signal.signal(s, handler) for s in (signal.SIGINT, signal.SIGTERM)}
    yield handler, leaked
    for s, h in old.items():
        signal.signal(s, h)


def _library_run(kind, out, steps=12, *, resume=False, on_batch=None, on_eval=None,
                 ckpt_every=100):
    """A tiny run of `kind` through minixl.train, with dropout (and, for shaw, an objective
    with weights of its own); xl reads 5 segments per pass, so its memory restarts."""
    torch.manual_seed(0)
    common = dict(n_layer=1, d_model=32, n_head=2, d_inner=64, dropout=0.1)
    model_cfg = {
        "char": lambda: CharTransformerConfig(block_size=8, **common),
        "shaw": lambda: ShawConfig(block_size=8, max_relative=4, **common),
        "xl": lambda: KINDS["xl"].config(d_head=16, tgt_len=8, mem_len=8, **common),
    }[kind]()
    k = KINDS[kind]
    model = k.build(model_cfg)
    objective = k.objective(model_cfg, "positions,targets", 2) if kind == "shaw" else None
    source = k.batches(STREAM, 4, model_cfg, seed=3)

    def batches(step):
        if on_batch:
            on_batch(step)
        return source(step)

    def held_out(m, n_bytes):
        if on_eval:
            on_eval()
        return evaluate(m, STREAM, k.protocols[0], seq_len=8, batch_size=4).bpc

    cfg = TrainConfig(steps=steps, batch_size=4, lr=3e-3, warmup=2, seed=3, log_every=1,
                      eval_every=3, ckpt_every=ckpt_every, device="cpu")
    return train(model, cfg, batches=batches, objective=objective, held_out=held_out, out=out,
                 resume=resume, meta={"kind": kind}, progress=False)


def _assert_same_checkpoint(a: Path, b: Path):
    ca, cb = load_checkpoint(a, for_resume=True), load_checkpoint(b, for_resume=True)
    assert ca["step"] == cb["step"]
    for part in ("model", "objective"):
        assert ca[part].keys() == cb[part].keys()
        for name, t in ca[part].items():
            assert torch.equal(t, cb[part][name]), (part, name)
    sa, sb = ca["optimizer"]["state"], cb["optimizer"]["state"]
    assert sa.keys() == sb.keys() and sa
    for k in sa:
        for field in ("step", "exp_avg", "exp_avg_sq"):
            assert torch.equal(sa[k][field], sb[k][field]), (k, field)
    if ca["state"] is None:
        assert cb["state"] is None
    else:  # Transformer-XL's memory
        assert len(ca["state"]) == len(cb["state"])
        assert all(torch.equal(x, y) for x, y in zip(ca["state"], cb["state"]))


def _steps_logged(run: Path) -> list[int]:
    return [int(line.split(",")[0]) for line in (run / "metrics.csv").read_text().splitlines()[1:]]


@pytest.mark.parametrize("kind,signum,where", [
    ("char", signal.SIGINT, "step"), ("shaw", signal.SIGTERM, "step"),
    ("xl", signal.SIGINT, "step"), ("xl", signal.SIGTERM, "eval"), ("shaw", signal.SIGINT, "eval"),
], ids=["char-SIGINT-step", "shaw-SIGTERM-step", "xl-SIGINT-step", "xl-SIGTERM-eval",
        "shaw-SIGINT-eval"])
def test_a_signal_to_this_process_stops_after_the_step_and_resumes_exactly(
        kind, signum, where, tmp_path, signal_guard):
    """os.kill to ourselves during step 6 (0-based 5): the step finishes, its checkpoint is
    saved. During the held-out evaluation after step 6: the evaluation is abandoned at once
    and step 6 is saved. Either way the resumed run ends bit-exactly as an unbroken one."""
    handler, leaked = signal_guard
    _library_run(kind, tmp_path / "whole")

    def send(step=None):
        if step is None or step == 5:
            os.kill(os.getpid(), signum)

    evals = []
    hooks = ({"on_batch": send} if where == "step" else
             {"on_eval": lambda: (evals.append(1), send() if len(evals) == 2 else None)})
    with pytest.raises(TrainingInterrupted) as stop:
        _library_run(kind, tmp_path / "part", **hooks)
    assert (stop.value.signum, stop.value.step) == (signum, 6)
    assert load_checkpoint(tmp_path / "part" / "checkpoint.pt")["step"] == 6
    assert _steps_logged(tmp_path / "part") == list(range(1, 7))
    assert signal.getsignal(signal.SIGINT) is handler is signal.getsignal(signal.SIGTERM)
    assert not leaked

    part, whole = tmp_path / "part", tmp_path / "whole"
    _library_run(kind, part, resume=True)
    _assert_same_checkpoint(part / "checkpoint.pt", whole / "checkpoint.pt")
    assert _steps_logged(part) == _steps_logged(whole) == list(range(1, 13))


def test_a_second_sigint_in_this_process_aborts_and_keeps_the_checkpoint(tmp_path, signal_guard):
    """Two SIGINTs during one step: the second raises KeyboardInterrupt at once; nothing is
    saved, so the checkpoint of step 4 stays as it was, and still resumes exactly."""
    handler, leaked = signal_guard
    run, seen = tmp_path / "run", {}

    def twice(step):  # as step 6 begins: 5 rows logged, the last checkpoint is of step 4
        if step == 5:
            seen["bytes"] = (run / "checkpoint.pt").read_bytes()
            os.kill(os.getpid(), signal.SIGINT)  # held until the step has finished ...
            os.kill(os.getpid(), signal.SIGINT)  # ... but a second one aborts now

    with pytest.raises(KeyboardInterrupt):
        _library_run("char", run, on_batch=twice, ckpt_every=2)
    assert (run / "checkpoint.pt").read_bytes() == seen["bytes"]
    assert load_checkpoint(run / "checkpoint.pt", for_resume=True)["step"] == 4
    assert not list(run.glob("*.part"))
    assert signal.getsignal(signal.SIGINT) is handler is signal.getsignal(signal.SIGTERM)
    assert not leaked

    _library_run("char", tmp_path / "whole")
    assert _steps_logged(run) == [1, 2, 3, 4, 5]
    _library_run("char", run, resume=True)  # redoes step 5, and replaces its metrics row
    _assert_same_checkpoint(run / "checkpoint.pt", tmp_path / "whole" / "checkpoint.pt")
    assert _steps_logged(run) == list(range(1, 13))


# ---------------------------------------------------------------- real signals, real processes

def _cli(kind, out, corpus, steps, *extra):
    """`python -m minixl train` of a tiny model: a metrics row every step, no checkpoint
    before the end unless a signal asks for one."""
    return [sys.executable, "-m", "minixl",
            *train_args(kind, out, steps, "--corpus", str(corpus), "--log-every", "1",
                        "--eval-every", "50", "--eval-bytes", "512", "--ckpt-every", "1000",
                        *extra)]


# One thread per subprocess: on a small machine shared with other work, two OpenMP threads
# that wait for each other make tiny runs many times slower.
ENV = {**os.environ, "OMP_NUM_THREADS": "1"}


def _run(cmd):
    r = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT, env=ENV, timeout=300)
    assert r.returncode == 0, r.stderr
    return r


def _rows(metrics: Path) -> int:
    try:
        return max(0, metrics.read_text().count("\n") - 1)
    except FileNotFoundError:
        return 0


NOTICE = "minixl: {} received; "  # then what it finishes before it saves


def _interrupt(cmd, metrics: Path, rows: int, signals):
    """Start cmd; once metrics.csv has more than `rows` rows, send `signals`, each one after
    the run has printed its notice for the one before (so none is sent before the previous
    one was handled, and a second lands while the first one's step or save is under way)."""
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                            cwd=ROOT, env=ENV)
    lines = []
    reader = threading.Thread(target=lambda: lines.extend(proc.stderr), daemon=True)
    reader.start()
    try:
        deadline = time.monotonic() + 120
        while _rows(metrics) <= rows and proc.poll() is None:
            assert time.monotonic() < deadline, "the run never logged its steps"
            time.sleep(0.002)
        for i, signum in enumerate(signals):
            if i:
                while not any(line.startswith("minixl: ") for line in lines):
                    assert proc.poll() is None and time.monotonic() < deadline, "no notice"
                    time.sleep(0.001)
            proc.send_signal(signum)
        proc.wait(timeout=120)
        reader.join(timeout=10)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    return proc.returncode, "".join(lines)


@pytest.mark.parametrize("kind,signum", [("char", signal.SIGINT), ("shaw", signal.SIGTERM),
                                         ("xl", signal.SIGINT), ("xl", signal.SIGTERM)],
                         ids=["char-SIGINT", "shaw-SIGTERM", "xl-SIGINT", "xl-SIGTERM"])
def test_a_signal_mid_run_then_resume_is_bit_exact(kind, signum, tmp_path, small_corpus):
    """A user's Ctrl-C (or a scheduler's SIGTERM) at a random step of `minixl train`; then
    --resume. The end is bit-exactly the run that was never stopped."""
    steps = 300
    whole = tmp_path / "whole"  # the run that is never stopped, meanwhile in the background
    unbroken = subprocess.Popen(_cli(kind, whole, small_corpus, steps), stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True, cwd=ROOT, env=ENV)

    try:
        after = random.Random(f"{kind}-{signum.name}").randint(1, steps // 3)
        for attempt in range(3):  # should the run outpace us and finish first, signal sooner
            part = tmp_path / f"part{attempt}"
            code, err = _interrupt(_cli(kind, part, small_corpus, steps), part / "metrics.csv",
                                   after, [signum])
            assert (part / "checkpoint.pt").exists(), err
            stopped = load_checkpoint(part / "checkpoint.pt")["step"]
            if code == 0 or stopped == steps:
                after //= 4
                continue
            break
        else:
            pytest.fail("the run finished before the signal, three times")
        assert code == 128 + signum, err
        assert "Traceback" not in err, err
        notice, last = err.strip().splitlines()  # at once, then when the checkpoint is saved
        assert notice.startswith(NOTICE.format(signum.name)), err
        assert last.startswith(f"minixl train: {signum.name}: stopped after step {stopped}; "
                               f"checkpoint saved to {part / 'checkpoint.pt'}")
        assert after < stopped < steps
        assert _steps_logged(part) == list(range(1, stopped + 1))

        _run(_cli(kind, part, small_corpus, steps, "--resume"))
        out, err = unbroken.communicate(timeout=300)
        assert unbroken.returncode == 0, err
        _assert_same_checkpoint(part / "checkpoint.pt", whole / "checkpoint.pt")
        assert _steps_logged(part) == _steps_logged(whole) == list(range(1, steps + 1))
    finally:
        if unbroken.poll() is None:  # the test failed before it ended
            unbroken.kill()
            unbroken.communicate()
    assert not list(part.glob("*.part"))


def test_a_second_ctrl_c_aborts_at_once_and_saves_nothing(tmp_path, small_corpus):
    """The second SIGINT is sent as soon as the run has printed its notice for the first, so it
    lands in the step the first one lets finish or in the save that follows (a save alone takes
    ~0.1 s for this model): the run aborts and the checkpoint on disk stays as it was."""
    out = tmp_path / "run"
    big = ["--d-model", "256", "--n-head", "4", "--d-inner", "1024", "--n-layer", "4",
           "--block-size", "128", "--batch-size", "16"]
    cmd = _cli("char", out, small_corpus, 500, *big)
    code, err = _interrupt(cmd, out / "metrics.csv", 0, [signal.SIGTERM])
    assert code == 143, err
    saved = (out / "checkpoint.pt").read_bytes()
    step = load_checkpoint(out / "checkpoint.pt")["step"]

    code, err = _interrupt([*cmd, "--resume"], out / "metrics.csv", step, [signal.SIGINT] * 2)
    assert code == 130, err
    notice, last = err.strip().splitlines()
    assert notice.startswith(NOTICE.format("SIGINT")), err
    assert last == ("minixl train: interrupted; nothing was saved (a checkpoint already "
                    "on disk is unchanged)"), err
    assert (out / "checkpoint.pt").read_bytes() == saved
    assert load_checkpoint(out / "checkpoint.pt", for_resume=True)["step"] == step
    assert not list(out.glob("*.part"))


def test_a_ctrl_c_after_the_stopping_save_is_ignored(tmp_path, signal_guard, monkeypatch):
    """A second Ctrl-C that comes once the stopping checkpoint is on disk has nothing left to
    abort: the run still raises TrainingInterrupted with the checkpoint it saved."""
    from minixl import trainer
    handler, leaked = signal_guard
    real_close = trainer._Run.close

    def ctrl_c_then_close(self):  # the run closes its files after the stopping save
        os.kill(os.getpid(), signal.SIGINT)
        real_close(self)

    monkeypatch.setattr(trainer._Run, "close", ctrl_c_then_close)
    send = lambda step: os.kill(os.getpid(), signal.SIGINT) if step == 5 else None  # noqa: E731
    with pytest.raises(TrainingInterrupted) as stop:
        _library_run("char", tmp_path / "run", on_batch=send)
    assert (stop.value.signum, stop.value.step) == (signal.SIGINT, 6)
    assert load_checkpoint(tmp_path / "run" / "checkpoint.pt")["step"] == 6
    assert signal.getsignal(signal.SIGINT) is handler is signal.getsignal(signal.SIGTERM)
    assert not leaked


# ---------------------------------------------------------------- divergence

def test_divergence_stops_the_run_and_keeps_the_last_good_checkpoint(tmp_path, char_run,
                                                                     small_corpus):
    run = Path(shutil.copytree(char_run, tmp_path / "run"))
    good = (run / "checkpoint.pt").read_bytes()
    cmd = train_args("char", run, 16, "--corpus", str(small_corpus), "--resume", "--lr", "1e30",
                     "--allow-change", "lr,steps")
    r = subprocess.run([sys.executable, "-m", "minixl", *cmd], capture_output=True, text=True,
                       cwd=ROOT, env=ENV, timeout=300)
    assert r.returncode == 3, r.stderr
    assert "Traceback" not in r.stderr and len(r.stderr.strip().splitlines()) == 1, r.stderr
    found = re.match(r"minixl train: training diverged: .* at step (\d+);", r.stderr)
    assert found and 8 < int(found[1]) <= 16, r.stderr
    assert f"the last good checkpoint is {run / 'checkpoint.pt'} (step 8)" in r.stderr
    assert "--lr" in r.stderr
    assert (run / "checkpoint.pt").read_bytes() == good
    ckpt = load_checkpoint(run / "checkpoint.pt", for_resume=True)
    assert ckpt["step"] == 8 and all(torch.isfinite(t).all() for t in ckpt["model"].values())


def test_divergence_of_a_new_run_writes_no_checkpoint(tmp_path, small_corpus, capsys):
    out = tmp_path / "run"
    assert main(train_args("char", out, 8, "--corpus", str(small_corpus), "--lr", "1e30")) == 3
    err = capsys.readouterr().err
    assert "training diverged" in err and "none (no checkpoint was written)" in err
    assert not (out / "checkpoint.pt").exists()


def test_training_config_refuses_non_finite_and_out_of_range_values():
    for bad in (dict(lr=float("inf")), dict(lr=float("nan")), dict(lr=0.0), dict(steps=0),
                dict(batch_size=0), dict(grad_clip=-1.0), dict(min_lr_frac=2.0),
                dict(weight_decay=float("nan")), dict(eval_bytes=1), dict(warmup=-1)):
        with pytest.raises(ValueError):
            TrainConfig(**bad)
    TrainConfig(lr=1e-3, grad_clip=0.0, eval_bytes=None)  # 0 = no clipping, None = all


# ---------------------------------------------------------------- checkpoints

def test_save_is_atomic_and_removes_stale_parts(tmp_path):
    path = tmp_path / "checkpoint.pt"
    save_checkpoint(path, {"format": FORMAT, "x": torch.ones(2)})
    stale = tmp_path / "checkpoint.pt.abc123.part"  # what SIGKILL during a save leaves
    stale.write_bytes(b"half a file")
    with pytest.raises((pickle.PicklingError, AttributeError, TypeError)):
        save_checkpoint(path, {"format": FORMAT, "x": lambda: 0})  # cannot be pickled
    assert torch.equal(torch.load(path, weights_only=True)["x"], torch.ones(2))
    assert [p.name for p in tmp_path.iterdir()] == ["checkpoint.pt"]
    save_checkpoint(path, {"format": FORMAT, "x": torch.zeros(3)})
    assert torch.equal(torch.load(path, weights_only=True)["x"], torch.zeros(3))
    assert [p.name for p in tmp_path.iterdir()] == ["checkpoint.pt"]


@pytest.mark.parametrize("content,message", [
    (None, "no checkpoint at"),
    (b"", "is empty (0 bytes)"),
    (b"not a checkpoint at all", "cannot be read as a minixl checkpoint"),
    ({"weights": 1}, "is not a minixl-checkpoint-2 file"),
    ({"format": "minixl-checkpoint-1"}, "written by an older minixl"),
    ({"format": FORMAT, "step": 1, "model_config": {}, "meta": {}}, "has no 'model' entry"),
])
def test_unreadable_checkpoints_fail_clearly(tmp_path, content, message):
    path = tmp_path / "c.pt"
    if isinstance(content, bytes):
        path.write_bytes(content)
    elif content is not None:
        torch.save(content, path)
    with pytest.raises(CheckpointError, match=re.escape(message)) as err:
        load_checkpoint(path)
    assert str(path) in str(err.value)
    assert "weights_only" not in str(err.value)  # no advice to load untrusted pickles


def test_a_pickle_that_would_run_code_is_refused(tmp_path):
    path = tmp_path / "evil.pt"
    torch.save({"format": FORMAT, "x": Path("/")}, path)  # any object that is not plain data
    with pytest.raises(CheckpointError, match="cannot be read as a minixl checkpoint"):
        load_checkpoint(path)


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
    assert "seed" not in str(err.value)  # unchanged settings are not listed
    assert "model.d_model cannot change on resume" in str(err.value)
    assert "--allow-change lr" in str(err.value)
    changes = check_resume(saved, {**saved, "lr": 2e-3}, fixed={"model.d_model"}, allow={"lr"})
    assert changes == {"lr": (1e-3, 2e-3)}
    assert check_resume(saved, saved, fixed={"model.d_model"}, allow=set()) == {}
    with pytest.raises(CheckpointError, match="model.d_model cannot change"):  # allow or not
        check_resume(saved, {**saved, "model.d_model": 64}, fixed={"model.d_model"},
                     allow={"lr"})
    for name in ("colour", "model.d_model"):  # unknown, or part of the model
        with pytest.raises(ValueError, match="not a setting a resumed run can change"):
            check_resume(saved, saved, fixed={"model.d_model"}, allow={name})


# ---------------------------------------------------------------- the run's identity on resume

def _resume(run, corpus, *extra, steps=8):
    return main(train_args("char", run, steps, "--corpus", str(corpus), "--resume", *extra))


def test_resume_refuses_changed_settings_with_a_diff(tmp_path, char_run, small_corpus, capsys):
    run = Path(shutil.copytree(char_run, tmp_path / "run"))
    before = {p.name: p.read_bytes() for p in run.iterdir()}
    other = tmp_path / "other.txt"
    other.write_bytes(small_corpus.read_bytes()[::-1])  # same size, other text
    sha = load_checkpoint(run / "checkpoint.pt")["meta"]["corpus"]["sha256"]
    from minixl.data import load_corpus
    other_sha = load_corpus(str(other)).sha256
    cases = [(("--lr", "0.01"), ["lr: 0.002 -> 0.01"]), (("--seed", "1"), ["seed: 0 -> 1"]),
             (("--d-model", "64"), ["model.d_model: 32 -> 64"]),
             (("--aux-losses", "none"), ["objective: 'positions targets=1' -> 'none targets=1'"])]
    for extra, diff in cases:
        assert _resume(run, small_corpus, *extra, steps=10) == 2
        err = capsys.readouterr().err
        assert all(d in err for d in diff) and "Traceback" not in err, err
    assert _resume(run, other, steps=10) == 2
    err = capsys.readouterr().err
    assert "corpus: " in err and sha in err and other_sha in err and "--allow-change" in err, err
    assert {p.name: p.read_bytes() for p in run.iterdir()} == before  # refusals change nothing

    assert _resume(run, small_corpus) == 2  # the run is finished
    assert "--allow-change steps" in capsys.readouterr().err
    assert _resume(run, small_corpus, "--lr", "0.001", "--allow-change", "lr", steps=10) == 2
    assert "steps: 8 -> 10" in capsys.readouterr().err  # steps is part of the identity too
    assert _resume(run, small_corpus, "--lr", "0.001", "--allow-change", "lr,steps",
                   steps=10) == 0
    assert "resuming with lr changed: 0.002 -> 0.001" in capsys.readouterr().out
    ckpt = load_checkpoint(run / "checkpoint.pt", for_resume=True)
    assert ckpt["step"] == 10 and ckpt["train_config"]["lr"] == 0.001
    assert _steps_logged(run) == [2, 4, 6, 8, 10]


def test_the_folder_rules(tmp_path, small_corpus, capsys):
    out = tmp_path / "run"
    base = train_args("char", out, 2, "--corpus", str(small_corpus))
    assert main([*base, "--allow-change", "lr"]) == 2
    assert "--allow-change applies to --resume only" in capsys.readouterr().err
    assert main([*base, "--resume"]) == 2
    assert "no checkpoint" in capsys.readouterr().err
    assert not out.exists()  # the refusals made no folder
    assert main(base) == 0
    first = (out / "checkpoint.pt").read_bytes()
    assert main(base) == 2  # a run is there
    assert "pass --resume to continue it, --overwrite" in capsys.readouterr().err
    assert main([*base, "--resume", "--overwrite"]) == 2
    assert "not both" in capsys.readouterr().err
    assert (out / "checkpoint.pt").read_bytes() == first


# ---------------------------------------------------------------- compile, bench, devices

def test_compiled_training_saves_plain_keys(tmp_path, monkeypatch, small_corpus):
    real, calls = torch.compile, []

    def eager(fn, **kw):
        calls.append(fn)
        return real(fn, backend="eager")

    monkeypatch.setattr(torch, "compile", eager)
    out = tmp_path / "run"
    assert main(train_args("char", out, 2, "--corpus", str(small_corpus), "--compile")) == 0
    assert calls, "--compile did not compile the model"
    keys = load_checkpoint(out / "checkpoint.pt")["model"]
    plain = CharTransformer(CharTransformerConfig(n_layer=1, d_model=32, n_head=2, d_inner=64,
                                                  block_size=32)).state_dict()
    assert list(keys) == list(plain)


@pytest.mark.parametrize("kind", ["char", "xl"])
def test_bench_on_the_cpu_reports_throughput_without_mfu(kind):
    cfg = {"char": TINY, "xl": KINDS["xl"].config(n_layer=1, d_model=32, n_head=2, d_head=16,
                                                   d_inner=64, tgt_len=16, mem_len=16)}[kind]
    r = bench(KINDS[kind], cfg, batch_size=2, steps=2, warmup=1, device="cpu")
    assert r["tokens_per_s"] > 0 and r["tflops"] > 0 and r["device"] == "cpu"
    assert r["mfu"] is None and r["peak_tflops"] is None
    assert r["seq_len"] == 32 if kind == "char" else 16


def test_peak_table_matches_names_exactly():
    assert peak_tflops("NVIDIA H100 80GB HBM3") == 989.0  # SXM
    assert peak_tflops("NVIDIA H100 PCIe") == 756.0
    assert peak_tflops("NVIDIA H100 NVL") == 835.0
    assert peak_tflops("NVIDIA H200") == 989.0
    assert peak_tflops("NVIDIA A100-SXM4-80GB") == 312.0
    assert peak_tflops("NVIDIA L4") == 121.0
    assert peak_tflops("NVIDIA L40S") == 362.0
    assert peak_tflops("NVIDIA L40") is None  # neither the L4 nor the L40S
    assert peak_tflops("Some Future GPU") is None


def test_devices():
    assert resolve_device("cpu").type == "cpu"
    assert resolve_device("auto").type == ("cuda" if torch.cuda.is_available() else "cpu")
    with pytest.raises(ValueError, match="unknown device 'tpu'"):
        resolve_device("tpu")
    if not torch.cuda.is_available():
        for name in ("cuda", "cuda:0"):
            with pytest.raises(ValueError, match="sees no CUDA GPU"):
                resolve_device(name)


# ---------------------------------------------------------------- weight decay groups

def _tiny(kind, **extra):
    """A tiny model of `kind` (one layer), and its objective with every weight it can have."""
    common = dict(n_layer=1, d_model=32, n_head=2, d_inner=64)
    sizes = {"char": dict(block_size=8, pos="per_layer"),
             "shaw": dict(block_size=8, max_relative=4),
             "xl": dict(d_head=16, tgt_len=8, mem_len=8), "xlnet": dict(seq_len=16, n_predict=4),
             "segtree": dict(block_size=16, k=2)}[kind]
    k = KINDS[kind]
    cfg = k.config(**common, **{**sizes, **extra})
    torch.manual_seed(0)
    model = k.build(cfg)
    aux = ("positions,layers,targets", 2) if kind in ("char", "shaw") else ("positions", 1)
    return model, k.objective(cfg, *aux)


LAYER_NORMS = ["ln1.weight", "ln1.bias", "ln2.weight", "ln2.bias"]
NOT_DECAYED = {  # every tensor that weight_decay_on="matrices" leaves alone, per kind
    "char": ["pos", *(f"blocks.0.{n}" for n in LAYER_NORMS + [
        "attn.qkv.bias", "attn.out.bias", "ff.0.bias", "ff.2.bias"]), "ln_f.weight", "ln_f.bias"],
    "shaw": [*(f"blocks.0.{n}" for n in LAYER_NORMS + [
        "attn.w_k", "attn.w_v", "attn.qkv.bias", "attn.out.bias", "ff.0.bias", "ff.2.bias"]),
        "ln_f.weight", "ln_f.bias"],
    "xl": ["out_bias", "layers.0.dec_attn.r_w_bias", "layers.0.dec_attn.r_r_bias",
           "layers.0.dec_attn.layer_norm.weight", "layers.0.dec_attn.layer_norm.bias",
           "layers.0.pos_ff.CoreNet.0.bias", "layers.0.pos_ff.CoreNet.3.bias",
           "layers.0.pos_ff.layer_norm.weight", "layers.0.pos_ff.layer_norm.bias"],
    "xlnet": ["mask_emb", "lm_bias", "attn.0.r_w_bias", "attn.0.r_r_bias", "attn.0.r_s_bias",
              "attn.0.seg_embed", "attn.0.layer_norm.weight", "attn.0.layer_norm.bias",
              "ff.0.layer_1.bias", "ff.0.layer_2.bias", "ff.0.layer_norm.weight",
              "ff.0.layer_norm.bias"],
    "segtree": [*(f"blocks.0.{n}" for n in LAYER_NORMS + [
        "attn.rel_k", "attn.qkv.bias", "attn.proj.bias", "ff.0.bias", "ff.2.bias"]),
        "ln_f.weight", "ln_f.bias"],
}
AUX_NOT_DECAYED = [f"aux.target_heads.{i}.{n}" for i in (0, 1)
                   for n in ("0.weight", "0.bias", "1.bias")]  # a layer norm and a bias each


@pytest.mark.parametrize("kind", list(KINDS))
def test_decay_groups_leave_biases_norms_u_v_and_position_tables_alone(kind):
    from minixl.trainer import decay_groups, decays

    model, objective = _tiny(kind)
    own = objective if objective is not None else torch.nn.Module()
    named = dict(model.named_parameters())
    assert sorted(n for n, p in named.items() if not decays(n, p)) == sorted(NOT_DECAYED[kind])
    own_named = dict(own.named_parameters())
    assert sorted(n for n, p in own_named.items() if not decays(n, p)) == (
        sorted(AUX_NOT_DECAYED) if kind in ("char", "shaw") else [])

    params = [p for m in (model, own) for p in m.parameters()]
    [every] = decay_groups([model, own], 0.1, on="all")  # Chapter 1's loop: one group
    assert every["weight_decay"] == 0.1
    assert [id(p) for p in every["params"]] == [id(p) for p in params]
    decayed, kept = decay_groups([model, own], 0.1, on="matrices")
    assert (decayed["weight_decay"], kept["weight_decay"]) == (0.1, 0.0)
    assert sorted(map(id, decayed["params"] + kept["params"])) == sorted(map(id, params))
    assert all(p.dim() >= 2 for p in decayed["params"])  # and the tables of NOT_DECAYED are 2-D+
    assert {id(named[n]) for n in NOT_DECAYED[kind]} <= set(map(id, kept["params"]))
    with pytest.raises(ValueError, match="on must be one of all, matrices"):
        decay_groups([model], 0.1, on="biases")


def test_weight_decay_on_matrices_decays_only_the_matrices(tmp_path):
    """One step of two runs that differ only in weight decay (0 and 10; the same gradients):
    with weight_decay_on="matrices" the tensors of the second group end as in the run without
    decay, every matrix does not."""
    data = torch.randint(0, 256, (2000,), generator=torch.Generator().manual_seed(0)).byte()
    ends = []
    for wd in (0.0, 10.0):
        torch.manual_seed(0)
        model = CharTransformer(replace(TINY, pos="per_layer"))
        cfg = TrainConfig(steps=1, batch_size=4, warmup=0, weight_decay=wd,
                          weight_decay_on="matrices", device="cpu")
        train(model, cfg, batches=RandomWindows(data, 4, 32), progress=False)
        ends.append(dict(model.named_parameters()))
    from minixl.trainer import decays
    for name, p in ends[0].items():
        same = torch.equal(p, ends[1][name])
        assert same == (not decays(name, p)), name
    assert not decays("pos", ends[0]["pos"]) and decays("tok.weight", ends[0]["tok.weight"])


def _old_checkpoint(run: Path) -> None:
    """Make run's checkpoint one written before weight_decay_on and grad_accum existed."""
    ckpt = load_checkpoint(run / "checkpoint.pt", for_resume=True)
    for name in ("weight_decay_on", "grad_accum"):
        del ckpt["train_config"][name]
    save_checkpoint(run / "checkpoint.pt", ckpt)


def test_a_checkpoint_from_before_decay_groups_resumes_decaying_everything(tmp_path,
                                                                          small_corpus, capsys):
    run = tmp_path / "run"
    args = train_args("char", run, 4, "--corpus", str(small_corpus))
    assert main([*args, "--weight-decay-on", "all"]) == 0
    _old_checkpoint(run)
    assert main(train_args("char", run, 8, "--corpus", str(small_corpus), "--resume",
                           "--allow-change", "steps")) == 0
    ckpt = load_checkpoint(run / "checkpoint.pt", for_resume=True)
    assert ckpt["step"] == 8 and ckpt["train_config"]["weight_decay_on"] == "all"
    assert len(ckpt["optimizer"]["param_groups"]) == 1
    assert "weight_decay_on" not in capsys.readouterr().out  # no change was reported

    _old_checkpoint(run)  # asking for the groups is a change of what is learned ...
    assert main(train_args("char", run, 10, "--corpus", str(small_corpus), "--resume",
                           "--allow-change", "steps", "--weight-decay-on", "matrices")) == 2
    assert "weight_decay_on: 'all' -> 'matrices'" in capsys.readouterr().err
    before = load_checkpoint(run / "checkpoint.pt", for_resume=True)["optimizer"]["state"]
    assert main(train_args("char", run, 10, "--corpus", str(small_corpus), "--resume",
                           "--allow-change", "steps,weight_decay_on", "--weight-decay-on",
                           "matrices")) == 0  # ... made on purpose: the moments carry over
    ckpt = load_checkpoint(run / "checkpoint.pt", for_resume=True)
    groups = ckpt["optimizer"]["param_groups"]
    assert [g["weight_decay"] for g in groups] == [0.01, 0.0]
    assert all(int(s["step"]) == 10 for s in ckpt["optimizer"]["state"].values())
    assert len(ckpt["optimizer"]["state"]) == len(before)


def test_a_checkpoint_from_before_attention_impl_resumes(tmp_path, small_corpus, capsys):
    """A model setting added since a checkpoint was written takes its default there: an XL
    run saved before attention_impl existed resumes as eager, and asking for another is a
    change of the model, refused."""
    run = tmp_path / "run"
    assert main(train_args("xl", run, 4, "--corpus", str(small_corpus))) == 0
    ckpt = load_checkpoint(run / "checkpoint.pt", for_resume=True)
    del ckpt["model_config"]["attention_impl"]
    save_checkpoint(run / "checkpoint.pt", ckpt)
    assert main(train_args("xl", run, 6, "--corpus", str(small_corpus), "--resume",
                           "--allow-change", "steps")) == 0
    assert "attention_impl" not in capsys.readouterr().out
    assert main(train_args("xl", run, 8, "--corpus", str(small_corpus), "--resume",
                           "--allow-change", "steps", "--attention-impl", "sdpa")) == 2
    assert "model.attention_impl: 'eager' -> 'sdpa'" in capsys.readouterr().err


def test_a_new_command_line_run_decays_only_the_matrices(char_run):
    ckpt = load_checkpoint(char_run / "checkpoint.pt", for_resume=True)
    assert ckpt["train_config"]["weight_decay_on"] == "matrices"
    assert [g["weight_decay"] for g in ckpt["optimizer"]["param_groups"]] == [0.01, 0.0]
    assert TrainConfig().weight_decay_on == "all"  # the library's default: Chapter 1's loop


# ---------------------------------------------------------------- gradient accumulation

def _accumulated(kind, grad_accum, steps=3):
    """Weights and memory after `steps` steps of batch 4 in grad_accum micro-batches."""
    torch.manual_seed(0)
    common = dict(n_layer=2, d_model=32, n_head=2, d_inner=64)
    model_cfg = (CharTransformerConfig(block_size=8, **common) if kind == "char" else
                 KINDS["xl"].config(d_head=16, tgt_len=8, mem_len=8, **common))
    model = KINDS[kind].build(model_cfg)
    states = []
    source = KINDS[kind].batches(STREAM, 4, model_cfg, seed=3)

    def batches(step):  # xl: 5 segments per pass, so the memory is carried in every step here
        return source(step)

    def objective(m, x, y, state, progress):
        parts, state = trainer.next_byte_objective(m, x, y, state, progress)
        states.append(state)
        return parts, state

    from minixl import trainer
    # A small lr: a few weights (the keys' biases) have a gradient that is 0 but for float
    # noise, which Adam scales up to steps of about lr whatever the order of additions.
    cfg = TrainConfig(steps=steps, batch_size=4, grad_accum=grad_accum, lr=3e-4, warmup=1,
                      device="cpu")
    train(model, cfg, batches=batches, objective=objective, progress=False)
    memory = torch.cat([s[0] for s in states[-grad_accum:]]) if kind == "xl" else None
    grads = {n: p.grad.clone() for n, p in model.named_parameters()}  # of the last step
    return model.state_dict(), grads, memory


@pytest.mark.parametrize("kind", ["char", "xl"])
def test_gradient_accumulation_gives_the_weights_of_one_batch(kind):
    """A batch of 4 in 2 micro-batches of 2 (xl: each with its own rows of the memory) has
    the gradients of the whole batch at once (the mean loss, not the sum) and ends with its
    weights and memory, up to the order of float additions."""
    one, grad_one, mem_one = _accumulated(kind, 1)
    two, grad_two, mem_two = _accumulated(kind, 2)
    for name in grad_one:
        torch.testing.assert_close(grad_two[name], grad_one[name], rtol=1e-4, atol=1e-6,
                                   msg=name)
    for name in one:
        torch.testing.assert_close(two[name], one[name], rtol=0, atol=1e-6, msg=name)
    if kind == "xl":
        assert mem_one.shape == mem_two.shape == (4, 8, 32)
        torch.testing.assert_close(mem_two, mem_one, rtol=0, atol=1e-6)


def test_gradient_accumulation_must_divide_the_batch(monkeypatch):
    with pytest.raises(ValueError, match="batch_size 6 does not split into grad_accum 4 equal "
                       "micro-batches: use a batch size that is a multiple of 4"):
        TrainConfig(batch_size=6, grad_accum=4)
    monkeypatch.setenv("WORLD_SIZE", "2")  # as torchrun would, for 2 processes
    monkeypatch.setenv("RANK", "0")
    with pytest.raises(ValueError, match=r"batch_size 4 does not split into 2 processes x 4 "
                       r"micro-batches \(grad_accum\): use a batch size that is a multiple of 8"):
        train(CharTransformer(TINY), TrainConfig(batch_size=4, grad_accum=4, device="cpu"),
              batches=None, progress=False)


def test_which_weights_get_no_gradient():
    """Every weight gets a gradient in every step, but XLNet's segment bias and encodings
    (a language model's window is one segment): this is why DistributedDataParallel runs
    with find_unused_parameters (without it, XLNet's second step would fail)."""
    from minixl.trainer import next_byte_objective
    for kind in KINDS:
        model, objective = _tiny(kind)
        objective = objective or next_byte_objective
        length = getattr(model.config, KINDS[kind].length)
        x = torch.randint(0, 256, (2, length))
        parts, _ = objective(model, x, x.roll(-1, 1), None, 0.5)
        parts["loss"].backward()
        own = objective.parameters() if isinstance(objective, torch.nn.Module) else []
        missing = [n for n, p in model.named_parameters() if p.grad is None]
        missing += [n for n, p in (objective.named_parameters() if own else []) if p.grad is None]
        assert missing == (["attn.0.r_s_bias", "attn.0.seg_embed"] if kind == "xlnet" else []), (
            kind, missing)


# ---------------------------------------------------------------- batches where the data is

def test_batch_sources_give_the_same_batches_and_keep_them_on_the_datas_device():
    """RandomWindows and OrderedStreams cut a step's batch where the data lives (on a GPU
    when `minixl train` put the corpus there): the same batches as gathering on the host
    (reference below), and on the meta device the batch stays on it, never read back."""
    data = torch.randint(0, 256, (3001,), generator=torch.Generator().manual_seed(2)).byte()
    windows, streams = RandomWindows(data, 4, 16, seed=5), KINDS["xl"].batches(
        data, 4, KINDS["xl"].config(n_layer=1, tgt_len=16, mem_len=16), seed=5)
    n = (len(data) - 1) // 4
    xs, ys = data[:n * 4].long().view(4, n), data[1:n * 4 + 1].long().view(4, n)
    for step in (0, 1, 7, 46, 47):
        gen = torch.Generator().manual_seed(step_seed(5, step))
        starts = torch.randint(len(data) - 16, (4,), generator=gen)
        ref = torch.stack([data[s:s + 17] for s in starts.tolist()]).long()
        x, y, fresh = windows(step)
        assert torch.equal(x, ref[:, :-1]) and torch.equal(y, ref[:, 1:]) and fresh
        assert x.dtype == torch.long
        seg = step % (n // 16)
        x, y, fresh = streams(step)
        assert torch.equal(x, xs[:, seg * 16:(seg + 1) * 16]) and fresh == (seg == 0)
        assert torch.equal(y, ys[:, seg * 16:(seg + 1) * 16]) and x.dtype == torch.long
    meta = data.to("meta")
    for source in (RandomWindows(meta, 4, 16, seed=5), KINDS["xl"].batches(
            meta, 4, KINDS["xl"].config(n_layer=1, tgt_len=16, mem_len=16), seed=5)):
        x, y, _ = source(3)
        assert x.device.type == y.device.type == "meta" and x.shape == y.shape == (4, 16)


def test_the_place_of_a_process_comes_from_torchruns_environment(monkeypatch):
    from minixl.device import distributed_env, training_device
    for name in ("WORLD_SIZE", "RANK", "LOCAL_RANK"):
        monkeypatch.delenv(name, raising=False)
    assert distributed_env() == (0, 0, 1) and training_device("cpu").type == "cpu"
    monkeypatch.setenv("WORLD_SIZE", "4")
    monkeypatch.setenv("RANK", "3")
    monkeypatch.setenv("LOCAL_RANK", "1")
    assert distributed_env() == (3, 1, 4)
    assert training_device("cpu") == torch.device("cpu")  # gloo: every process on the CPU
    monkeypatch.setenv("RANK", "4")
    with pytest.raises(ValueError, match="need 0 <= RANK < WORLD_SIZE"):
        distributed_env()
    monkeypatch.setenv("WORLD_SIZE", "two")
    with pytest.raises(ValueError, match="WORLD_SIZE, RANK and LOCAL_RANK must be integers"):
        distributed_env()
