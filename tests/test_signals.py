"""Stopping on a signal: SIGINT (Ctrl-C) and SIGTERM end a run after a whole step with a
checkpoint of that step, a resumed run ends bit-exactly as one never stopped, a second
Ctrl-C aborts and keeps the checkpoint on disk, and a run that diverges keeps its last good
checkpoint. First in this process (os.kill to ourselves), then through `minixl train` in a
real subprocess (slow)."""

import os
import random
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from conftest import first_quick, signalled_at, train_args
from minixl import CharTransformerConfig
from minixl.checkpoint import load_checkpoint
from minixl.evaluation import evaluate
from minixl.relative_attention.kind import ShawConfig
from minixl.kinds import KINDS
from minixl.training import TrainConfig, TrainingInterrupted, train

ROOT = Path(__file__).resolve().parent.parent

pytestmark = pytest.mark.usefixtures("one_thread")  # see tests/conftest.py


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
    objective = k.build_objective(model_cfg, {"aux_losses": "positions,targets",
                                              "aux_targets": 2}) if kind == "shaw" else None
    source = k.batches(STREAM, 4, model_cfg, seed=3)

    def batches(step):
        if on_batch:
            on_batch(step)
        return source(step)

    def held_out(m, n_bytes):
        if on_eval:
            on_eval(n_bytes)
        return evaluate(m, STREAM, k.protocol(), seq_len=8, batch_size=4, kind=k).bpc

    cfg = TrainConfig(steps=steps, batch_size=4, lr=3e-3, warmup=2, seed=3, log_every=1,
                      eval_every=3, ckpt_every=ckpt_every, device="cpu")
    return train(model, cfg, batches=batches, objective=objective, held_out=held_out, out=out,
                 resume=resume, meta={"kind": kind}, progress=False, no_decay=k.no_decay)


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


@pytest.mark.parametrize("kind,signum,where", first_quick([
    ("char", signal.SIGINT, "step"), ("shaw", signal.SIGTERM, "step"),
    ("xl", signal.SIGINT, "step"), ("xl", signal.SIGTERM, "eval"), ("shaw", signal.SIGINT, "eval"),
], ["char-SIGINT-step", "shaw-SIGTERM-step", "xl-SIGINT-step", "xl-SIGTERM-eval",
    "shaw-SIGINT-eval"]))
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
             {"on_eval": lambda n: (evals.append(1), send() if len(evals) == 2 else None)})
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


def test_a_signal_in_the_final_evaluation_saves_the_last_step_and_draws_the_plot(
        tmp_path, signal_guard):
    """The held-out evaluation of the whole split after the last step is abandoned at once:
    the last step is saved and the folder has its plot, as a finished run's has."""
    def stop_final(n_bytes):
        if n_bytes is None:  # the final evaluation reads the whole split
            os.kill(os.getpid(), signal.SIGTERM)

    with pytest.raises(TrainingInterrupted) as stop:
        _library_run("char", tmp_path / "run", on_eval=stop_final)
    assert (stop.value.signum, stop.value.step) == (signal.SIGTERM, 12)
    assert load_checkpoint(tmp_path / "run" / "checkpoint.pt")["step"] == 12
    assert (tmp_path / "run" / "loss.png").read_bytes()[:4] == b"\x89PNG"
    assert _steps_logged(tmp_path / "run") == list(range(1, 13))


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

LONG = 100_000  # steps of a run that a signal stops long before its end, however fast it goes


def _cli(kind, out, corpus, steps, *extra):
    """`minixl train` arguments of a tiny model: a metrics row every step, no checkpoint
    before the end unless a signal asks for one."""
    return train_args(kind, out, steps, "--corpus", str(corpus), "--log-every", "1",
                      "--eval-every", "50", "--eval-bytes", "512", "--ckpt-every", "1000",
                      *extra)


# One thread per subprocess: on a small machine shared with other work, two OpenMP threads
# that wait for each other make tiny runs many times slower.
ENV = {**os.environ, "OMP_NUM_THREADS": "1"}


def _run(cmd, code: int = 0):
    r = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT, env=ENV, timeout=300)
    assert r.returncode == code, r.stderr
    return r


def _rows(metrics: Path) -> int:
    try:
        return max(0, metrics.read_text().count("\n") - 1)
    except FileNotFoundError:
        return 0


NOTICE = "minixl: {} received; "  # then what it finishes before it saves


def _interrupt(argv, metrics: Path, rows: int, signum) -> tuple[int, str]:
    """Run `python -m minixl ARGV` (a run of LONG steps, which a signal always stops first);
    once metrics.csv has more than `rows` rows, send `signum` at whatever moment that is: in
    a step, an evaluation or a save. Returns the exit code and stderr."""
    proc = subprocess.Popen([sys.executable, "-m", "minixl", *argv], stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE, text=True, cwd=ROOT, env=ENV)
    try:
        deadline = time.monotonic() + 120
        while _rows(metrics) <= rows and proc.poll() is None:
            assert time.monotonic() < deadline, "the run never logged its steps"
            time.sleep(0.002)
        proc.send_signal(signum)
        _, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    return proc.returncode, err


@pytest.mark.slow
@pytest.mark.parametrize("kind,signum,extra", [
    ("char", signal.SIGINT, ()), ("shaw", signal.SIGTERM, ()), ("xl", signal.SIGINT, ()),
    ("xl", signal.SIGTERM, ()), ("xlnet", signal.SIGTERM, ()),
    ("xlnet", signal.SIGINT, ("--reuse-len", "16", "--bi-data")),
    ("char", signal.SIGTERM, ("--dtype", "bf16")), ("xl", signal.SIGINT, ("--dtype", "bf16"))],
    ids=["char-SIGINT", "shaw-SIGTERM", "xl-SIGINT", "xl-SIGTERM", "xlnet-with-memory-SIGTERM",
         "xlnet-pretraining-input-bi-data-SIGINT", "char-bf16-SIGTERM", "xl-bf16-SIGINT"])
def test_a_signal_mid_run_then_resume_is_bit_exact(kind, signum, extra, tmp_path,
                                                    small_corpus):
    """A user's Ctrl-C (or a scheduler's SIGTERM) at a random moment of `minixl train`: the
    run stops after the step it was in, with a checkpoint of that step. Resumed and stopped
    five steps later, it holds bit-exactly what a run never stopped holds after as many steps
    (that one stopped by a signal it sends itself at the step, known in advance)."""
    part = tmp_path / "part"
    after = random.Random(f"{kind}-{signum.name}").randint(1, 30)
    code, err = _interrupt(_cli(kind, part, small_corpus, LONG, *extra), part / "metrics.csv",
                           after, signum)
    assert code == 128 + signum, err
    assert "Traceback" not in err, err
    stopped = load_checkpoint(part / "checkpoint.pt")["step"]
    notice, last = err.strip().splitlines()  # at once, then when the checkpoint is saved
    assert notice.startswith(NOTICE.format(signum.name)), err
    assert last.startswith(f"minixl train: {signum.name}: stopped after step {stopped}; "
                           f"checkpoint saved to {part / 'checkpoint.pt'}")
    assert after < stopped < LONG
    assert _steps_logged(part) == list(range(1, stopped + 1))

    end, whole = stopped + 5, tmp_path / "whole"
    _run(signalled_at(end - 1, "SIGINT", _cli(kind, part, small_corpus, LONG, *extra,
                                              "--resume")), 130)
    _run(signalled_at(end - 1, "SIGINT", _cli(kind, whole, small_corpus, LONG, *extra)), 130)
    _assert_same_checkpoint(part / "checkpoint.pt", whole / "checkpoint.pt")
    assert _steps_logged(part) == _steps_logged(whole) == list(range(1, end + 1))
    assert not list(part.glob("*.part"))
    if kind in ("xl", "xlnet"):  # (tiny: --mem-len 16 and 32) the memory was carried and kept
        saved = load_checkpoint(part / "checkpoint.pt", for_resume=True)["state"]
        assert saved is not None and all(m.size(1) > 0 for m in saved), kind
    ckpt = load_checkpoint(part / "checkpoint.pt", for_resume=True)
    if "bf16" in extra:  # trained under bf16 autocast: the weights are kept in fp32
        assert ckpt["train_config"]["dtype"] == "bf16"
    assert {t.dtype for t in ckpt["model"].values()} == {torch.float32}


@pytest.mark.slow
def test_a_second_ctrl_c_aborts_at_once_and_saves_nothing(tmp_path, small_corpus):
    """A SIGTERM at a random moment leaves a checkpoint. Resumed, the run gets two Ctrl-Cs in
    one step: the second aborts at once, and the checkpoint on disk stays as it was."""
    out = tmp_path / "run"
    cmd = _cli("char", out, small_corpus, LONG)
    code, err = _interrupt(cmd, out / "metrics.csv", 0, signal.SIGTERM)
    assert code == 143, err
    saved = (out / "checkpoint.pt").read_bytes()
    step = load_checkpoint(out / "checkpoint.pt")["step"]

    r = _run(signalled_at(step + 2, "SIGINT,SIGINT", [*cmd, "--resume"]), 130)
    notice, last = r.stderr.strip().splitlines()
    assert notice.startswith(NOTICE.format("SIGINT")), r.stderr
    assert last == ("minixl train: interrupted; nothing was saved (a checkpoint already "
                    "on disk is unchanged)"), r.stderr
    assert (out / "checkpoint.pt").read_bytes() == saved
    assert load_checkpoint(out / "checkpoint.pt", for_resume=True)["step"] == step
    assert not list(out.glob("*.part"))


def test_a_ctrl_c_after_the_stopping_save_is_ignored(tmp_path, signal_guard, monkeypatch):
    """A second Ctrl-C that comes once the stopping checkpoint is on disk has nothing left to
    abort: the run still raises TrainingInterrupted with the checkpoint it saved."""
    from minixl.training.run_folder import RunFolder
    handler, leaked = signal_guard
    real_close = RunFolder.close

    def ctrl_c_then_close(self):  # the run closes its files after the stopping save
        os.kill(os.getpid(), signal.SIGINT)
        real_close(self)

    monkeypatch.setattr(RunFolder, "close", ctrl_c_then_close)
    send = lambda step: os.kill(os.getpid(), signal.SIGINT) if step == 5 else None  # noqa: E731
    with pytest.raises(TrainingInterrupted) as stop:
        _library_run("char", tmp_path / "run", on_batch=send)
    assert (stop.value.signum, stop.value.step) == (signal.SIGINT, 6)
    assert load_checkpoint(tmp_path / "run" / "checkpoint.pt")["step"] == 6
    assert signal.getsignal(signal.SIGINT) is handler is signal.getsignal(signal.SIGTERM)
    assert not leaked


# ---------------------------------------------------------------- divergence

@pytest.mark.slow
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


