"""Several processes, as torchrun starts them: `python -m torch.distributed.run --nproc_per_node 2
-m minixl train ... --device cpu` (gloo) trains as one process does on the same global batch,
only rank 0 writes, and a SIGTERM to torchrun stops every process after the same step with a
checkpoint that resumes on any number of processes. A run that every process refuses is
refused in one line, by rank 0, before any process leaves: once one has, torchrun ends the
others, so which exit code each process reports is not the user's to see (and not
asserted); what the user sees is."""

import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from conftest import SIGNAL_AT, TINY
from minixl.checkpoint import load_checkpoint

ROOT = Path(__file__).resolve().parent.parent

pytestmark = pytest.mark.slow  # every test here starts processes under torchrun
# A frame of minixl's own code in a traceback (torchrun prints its own when a worker fails).
MINIXL_FRAME = re.compile(r'File "' + re.escape(str(ROOT / "minixl")) + "/")
# One thread per process: two processes share this machine's cores.
ENV = {**os.environ, "OMP_NUM_THREADS": "1"}
TORCHRUN = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2",
            "--standalone"]


def _args(kind: str, out: Path, corpus: Path, steps: int, *extra: str) -> list[str]:
    """A tiny run that logs every step and checkpoints only at the end (or when stopped);
    two layers, so that the memory of xl is carried through more than one; fp32, so that
    the runs compared differ in how the batch is split, at fp32's rounding."""
    return ["-m", "minixl", "train", *TINY[kind], "--n-layer", "2", "--dtype", "fp32",
            "--batch-size", "4", "--steps", str(steps), "--log-every", "1", "--eval-every",
            "1000", "--eval-bytes", "512", "--ckpt-every", "1000", "--device", "cpu",
            "--no-progress", "--sample-len", "0", "--corpus", str(corpus), "--out", str(out),
            *extra]


def _start(cmd, processes: int = 1) -> subprocess.Popen:
    """Start `python -m minixl ...` in one process, or under torchrun in 2."""
    return subprocess.Popen((TORCHRUN if processes == 2 else [sys.executable]) + cmd,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            cwd=ROOT, env=ENV)


def _finish(proc: subprocess.Popen) -> subprocess.CompletedProcess:
    try:
        out, err = proc.communicate(timeout=300)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode == 0, out + err
    return subprocess.CompletedProcess(proc.args, proc.returncode, out, err)


def _run(cmd, processes: int = 1) -> subprocess.CompletedProcess:
    return _finish(_start(cmd, processes))


def _losses(run: Path) -> dict[int, float]:
    lines = (run / "metrics.csv").read_text().splitlines()
    header = lines[0].split(",")
    rows = [dict(zip(header, line.split(","))) for line in lines[1:]]
    return {int(r["step"]): float(r["loss"]) for r in rows}


def _assert_close_checkpoints(a: Path, b: Path, atol: float = 2e-5) -> None:
    ca, cb = load_checkpoint(a, for_resume=True), load_checkpoint(b, for_resume=True)
    assert ca["step"] == cb["step"]
    for name, t in ca["model"].items():
        torch.testing.assert_close(t, cb["model"][name], rtol=0, atol=atol, msg=name)
    if cb["state"] is None:
        assert ca["state"] is None
    else:  # the whole batch's memory, every process's rows in place
        assert [m.shape for m in ca["state"]] == [m.shape for m in cb["state"]]
        for x, y in zip(ca["state"], cb["state"]):
            torch.testing.assert_close(x, y, rtol=0, atol=atol)


@pytest.mark.parametrize("kind", ["char", "xl"])
def test_two_processes_train_as_one_on_the_same_global_batch(kind, tmp_path, small_corpus):
    """Each process takes 2 of the 4 sequences of a step (xl: its own 2 streams and their
    memory); DistributedDataParallel averages the gradients, so the steps are one process's
    steps on all 4, up to the order of float additions. Rank 0 alone writes and prints."""
    steps = 6
    two, one = tmp_path / "two", tmp_path / "one"
    peak = ("--peak-tflops", "0.001")  # 1e9 FLOP/s a device: every row gets its MFU
    single = _start(_args(kind, one, small_corpus, steps, *peak))  # meanwhile
    r = _run(_args(kind, two, small_corpus, steps, *peak), processes=2)
    _finish(single)
    a, b = _losses(two), _losses(one)
    assert list(a) == list(b) == list(range(1, steps + 1))  # each row once: one writer
    for step in a:
        assert a[step] == pytest.approx(b[step], rel=1e-4), step
    assert len(set(b.values())) > 1  # the steps did change the weights
    _assert_close_checkpoints(two / "checkpoint.pt", one / "checkpoint.pt")
    assert sorted(p.name for p in two.iterdir()) == ["checkpoint.pt", "loss.png", "metrics.csv"]
    assert r.stdout.count("minixl train: world size 2 (torchrun: 2 processes, each 2 of the 4 "
                          "sequences of a step)") == 1, r.stdout
    assert r.stdout.count("run folder: ") == 1 and r.stdout.count("held-out bpc") == 1
    assert "Traceback" not in r.stderr and "Warning" not in r.stderr, r.stderr
    # a row's tokens/s is the whole batch's; its MFU is per device, over 2 devices' peak
    from minixl.kinds import KINDS, model_from_checkpoint
    model = model_from_checkpoint(load_checkpoint(one / "checkpoint.pt"))
    k = KINDS[kind]
    flops = k.training_flops_per_token(model, k.build_objective(model.config,
                                                                k.objective_options("tiny")))
    for run, devices in ((one, 1), (two, 2)):
        lines = (run / "metrics.csv").read_text().splitlines()
        for row in (dict(zip(lines[0].split(","), line.split(","))) for line in lines[1:]):
            assert float(row["mfu"]) == pytest.approx(
                float(row["tokens_per_s"]) * flops / (1e9 * devices), rel=2e-3)


def test_two_processes_with_gradient_accumulation(tmp_path, small_corpus):
    """8 sequences a step, over 2 processes x 2 micro-batches of 2 (each micro-batch with its
    own rows of the memory): the steps of one process on all 8 at once."""
    two, one = tmp_path / "two", tmp_path / "one"
    single = _start(_args("xl", one, small_corpus, 4, "--batch-size", "8"))
    _run(_args("xl", two, small_corpus, 4, "--batch-size", "8", "--grad-accum", "2"),
         processes=2)
    _finish(single)
    a, b = _losses(two), _losses(one)
    assert list(a) == list(b) == [1, 2, 3, 4]
    assert all(a[s] == pytest.approx(b[s], rel=1e-4) for s in a), (a, b)
    _assert_close_checkpoints(two / "checkpoint.pt", one / "checkpoint.pt")


def test_a_batch_that_does_not_split_over_the_processes_is_refused(tmp_path, small_corpus):
    r = subprocess.run([*TORCHRUN, "--monitor-interval", "2"] + _args(
        "char", tmp_path / "run", small_corpus, 2, "--batch-size", "6", "--grad-accum", "2"),
        capture_output=True, text=True, cwd=ROOT, env=ENV, timeout=300)
    assert r.returncode != 0, r.stderr
    message = ("minixl train: error: batch_size 6 does not split into 2 processes x 2 "
               "micro-batches (grad_accum): use a batch size that is a multiple of 4")
    assert r.stderr.count(message) == 1, r.stderr  # said once, by rank 0
    assert not MINIXL_FRAME.search(r.stderr), r.stderr  # torchrun's own traceback only
    assert not (tmp_path / "run").exists()


def test_rank_0s_refusal_reaches_every_process(tmp_path, small_corpus):
    """Rank 0 alone checks the run folder; its refusal is sent to the other process, which
    ends with it instead of waiting for a rank 0 that has gone."""
    run = tmp_path / "run"
    run.mkdir()
    (run / "metrics.csv").write_text("someone else's\n")
    r = subprocess.run([*TORCHRUN, "--monitor-interval", "2"] + _args(
        "char", run, small_corpus, 2), capture_output=True, text=True, cwd=ROOT, env=ENV,
        timeout=300)
    assert r.returncode != 0, r.stderr
    assert r.stderr.count(f"minixl train: error: {run} already holds a run (metrics.csv)") == 1
    assert not MINIXL_FRAME.search(r.stderr), r.stderr
    assert (run / "metrics.csv").read_text() == "someone else's\n"


def _rows(metrics: Path) -> int:
    try:
        return max(0, metrics.read_text().count("\n") - 1)
    except FileNotFoundError:
        return 0


LONG = 100_000  # steps of a run that a signal stops long before its end, however fast it goes


def _signalled_at(tmp_path: Path, step: int, cmd: list[str], processes: int):
    """Run `minixl ...` (cmd as _args makes it) in `processes` processes, each sending itself a
    SIGINT as it reads the batch of step `step`: every process stops after step + 1."""
    script = tmp_path / "signal_at.py"
    script.write_text(SIGNAL_AT)
    argv = [str(script), str(step), "SIGINT", *cmd[2:]]  # without "-m minixl"
    proc = subprocess.Popen((TORCHRUN if processes == 2 else [sys.executable]) + argv,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            cwd=ROOT, env=ENV)
    out, err = proc.communicate(timeout=300)
    assert proc.returncode != 0 and f"stopped after step {step + 1}" in err, out + err


@pytest.mark.parametrize("resume_on", [2, 1], ids=["resumed-on-2", "resumed-on-1"])
def test_sigterm_to_torchrun_stops_every_process_and_resumes_on_any_number(
        resume_on, tmp_path, small_corpus):
    """torchrun passes a SIGTERM, sent at any moment, on to both processes; they stop after
    the same step, rank 0 saves the whole batch's memory. Resumed on 2 processes (each taking
    its rows back) and stopped 5 steps later, the run holds bit-exactly what a 2-process run
    never stopped holds after as many steps; resumed on 1, the same up to the order of float
    additions."""
    part, whole, after = tmp_path / "part", tmp_path / "whole", 10
    proc = subprocess.Popen(TORCHRUN + _args("xl", part, small_corpus, LONG),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            cwd=ROOT, env=ENV)
    try:
        deadline = time.monotonic() + 120
        while _rows(part / "metrics.csv") <= after and proc.poll() is None:
            assert time.monotonic() < deadline, "the run never logged its steps"
            time.sleep(0.005)
        proc.send_signal(signal.SIGTERM)
        out, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    stopped = load_checkpoint(part / "checkpoint.pt")["step"]
    assert proc.returncode == 1, out + err  # torchrun's code after a signal (the README's)
    assert err.count("minixl: SIGTERM received; finishing the current step") == 1, err
    assert err.count(f"minixl train: SIGTERM: stopped after step {stopped}; checkpoint saved "
                     f"to {part / 'checkpoint.pt'}") == 1, err
    assert after < stopped < LONG
    assert list(_losses(part)) == list(range(1, stopped + 1))
    assert len(load_checkpoint(part / "checkpoint.pt", for_resume=True)["state"][0]) == 4

    end = stopped + 5
    _signalled_at(tmp_path, end - 1, _args("xl", whole, small_corpus, LONG), processes=2)
    _signalled_at(tmp_path, end - 1, _args("xl", part, small_corpus, LONG, "--resume"),
                  processes=resume_on)
    a, b = _losses(part), _losses(whole)
    assert list(a) == list(b) == list(range(1, end + 1))
    if resume_on == 2:
        assert a == b
        _assert_close_checkpoints(part / "checkpoint.pt", whole / "checkpoint.pt", atol=0)
    else:  # the steps right after the resume read the memory each stream left
        assert all(a[s] == pytest.approx(b[s], rel=1e-4) for s in range(1, end + 1))
        _assert_close_checkpoints(part / "checkpoint.pt", whole / "checkpoint.pt", atol=1e-4)


def test_divergence_stops_every_process_at_the_same_step(tmp_path, small_corpus):
    """A learning rate of 1e30: the first non-finite loss or gradient norm, on any process,
    stops both at the same step (no process is left waiting for the other), rank 0 says so
    once, and no checkpoint is written."""
    # torchrun ends the other processes once one has failed, after its monitor interval:
    # a longer one gives a process that would wait forever the time to be seen waiting.
    slow = [*TORCHRUN, "--monitor-interval", "2"]
    r = subprocess.run(slow + _args("char", tmp_path / "run", small_corpus, 8, "--lr", "1e30",
                                    "--ckpt-every", "4"),
                       capture_output=True, text=True, cwd=ROOT, env=ENV, timeout=300)
    assert r.returncode != 0
    said = [line for line in r.stderr.splitlines() if "training diverged" in line]
    assert len(said) == 1 and said[0].startswith("minixl train: training diverged"), r.stderr
    assert "none (no checkpoint was written)" in said[0] and not MINIXL_FRAME.search(r.stderr)
    # minixl's exit code for divergence, from the process torchrun saw end first (the
    # other, if still tearing down, it ends itself)
    assert "exitcode  : 3 " in r.stderr, r.stderr
    assert not (tmp_path / "run" / "checkpoint.pt").exists()


def _file_limit(size: int):
    """For preexec_fn: files of torchrun and of the processes it starts may not grow past
    `size` bytes; a write past it fails with EFBIG (SIGXFSZ ignored), as a full disk would."""
    import resource

    def limit():
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        resource.setrlimit(resource.RLIMIT_FSIZE, (size, resource.getrlimit(
            resource.RLIMIT_FSIZE)[1]))
    return limit


def test_a_failed_save_under_torchrun_stops_every_process_and_resumes_exactly(
        tmp_path, small_corpus):
    """Rank 0 alone writes; when the checkpoint of step 4 cannot be written (a file-size
    limit), it tells the other process, both stop, the user reads the one line a single
    process gives, the checkpoint of step 2 is kept, and `--resume` continues to the weights
    a run never stopped holds, bit for bit."""
    whole, out = tmp_path / "whole", tmp_path / "run"
    every = ("--ckpt-every", "2")
    _run(_args("char", whole, small_corpus, 6, *every), processes=2)
    _run(_args("char", out, small_corpus, 2, *every), processes=2)
    kept, rows = (out / "checkpoint.pt").read_bytes(), (out / "metrics.csv").read_text()
    size = len(kept)

    r = subprocess.run([*TORCHRUN, "--monitor-interval", "2"] + _args(
        "char", out, small_corpus, 6, *every, "--resume", "--allow-change", "steps"),
        capture_output=True, text=True, cwd=ROOT, env=ENV, timeout=300,
        preexec_fn=_file_limit(size // 2))
    said = [line for line in r.stderr.splitlines() if line.startswith("minixl train:")]
    assert len(said) == 1, r.stderr  # rank 0's line, once
    assert said[0].startswith(f"minixl train: could not write the checkpoint of step 4 to "
                              f"{out / 'checkpoint.pt'}: ") and "(EFBIG)" in said[0], said
    assert f"the checkpoint of step 2 in {out / 'checkpoint.pt'} is kept" in said[0], said
    assert not MINIXL_FRAME.search(r.stderr), r.stderr
    # torchrun's own exit code is 1 for any failed worker; the worker's, minixl's 4 for a
    # failed save, is in the report it prints
    assert r.returncode == 1 and "exitcode  : 4 " in r.stderr, (r.returncode, r.stderr)
    assert (out / "checkpoint.pt").read_bytes() == kept  # nothing lost
    assert (out / "metrics.csv").read_text() == rows  # steps 3 and 4 are not in it
    assert not list(out.glob("*.part"))

    _run(_args("char", out, small_corpus, 6, *every, "--resume", "--allow-change", "steps"),
         processes=2)
    assert _losses(out) == _losses(whole)
    _assert_close_checkpoints(out / "checkpoint.pt", whole / "checkpoint.pt", atol=0)
