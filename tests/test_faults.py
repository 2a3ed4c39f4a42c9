"""Faults a user meets while a run writes its folder, met as the user meets them: real
processes of `minixl train`, a real SIGKILL, a real file-size limit (writes fail with EFBIG)
and, where the test may mount one, a real tiny filesystem (ENOSPC)."""

import csv
import hashlib
import os
import resource
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from conftest import train_args

ROOT = Path(__file__).resolve().parent.parent
ENV = {**os.environ, "OMP_NUM_THREADS": "1"}
LONG = 100_000  # steps: the run is always stopped long before its end


def _cli(out: Path, corpus: Path, steps: int, *extra: str) -> list[str]:
    return [sys.executable, "-m", "minixl",
            *train_args("char", out, steps, "--corpus", str(corpus), "--log-every", "1",
                        "--eval-every", "1000", "--ckpt-every", "1000", *extra)]


def _started(out: Path, corpus: Path) -> subprocess.Popen:
    """A long run into `out`, returned once it has logged a step: by then it holds the
    folder's lock (taken before anything is written)."""
    proc = subprocess.Popen(_cli(out, corpus, LONG), stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE, text=True, cwd=ROOT, env=ENV)
    deadline = time.monotonic() + 120
    while not ((out / "metrics.csv").exists() and (out / "metrics.csv").read_text().count("\n") > 1):
        assert proc.poll() is None, proc.communicate()[1]
        assert time.monotonic() < deadline, "the first run never logged a step"
        time.sleep(0.01)
    return proc


@pytest.mark.slow
def test_a_second_run_into_a_folder_in_use_stops_at_once_naming_the_first(tmp_path,
                                                                          small_corpus):
    out = tmp_path / "run"
    first = _started(out, small_corpus)
    try:
        for extra in ((), ("--overwrite",), ("--resume",)):
            second = subprocess.run(_cli(out, small_corpus, 8, *extra), capture_output=True,
                                    text=True, cwd=ROOT, env=ENV, timeout=120)
            assert second.returncode == 2, second.stderr
            lines = second.stderr.strip().splitlines()
            assert len(lines) == 1 and "Traceback" not in second.stderr, second.stderr
            assert f"{out} is in use by another run, process {first.pid}" in lines[0], lines
            assert "minixl" in lines[0] and "choose another --out" in lines[0]
        assert first.poll() is None  # the first run goes on, its files untouched
        before, deadline = (out / "metrics.csv").read_text().count("\n"), time.monotonic() + 120
        while (out / "metrics.csv").read_text().count("\n") <= before:  # however slow a step
            assert first.poll() is None and time.monotonic() < deadline, "the first run stalled"
            time.sleep(0.01)
        # eval and sample may read a folder in use; here there is no checkpoint yet to read
        first.send_signal(signal.SIGINT)  # it stops after its step, with a checkpoint
        _, err = first.communicate(timeout=120)
        assert first.returncode == 130, err
    finally:
        if first.poll() is None:
            first.kill()
            first.wait()
    from minixl.checkpoint import load_checkpoint

    stopped = load_checkpoint(out / "checkpoint.pt")["step"]
    resumed = subprocess.run(_cli(out, small_corpus, stopped + 2, "--resume", "--allow-change",
                                  "steps"), capture_output=True, text=True, cwd=ROOT, env=ENV,
                             timeout=120)
    assert resumed.returncode == 0, resumed.stderr  # the lock went with the first run
    assert load_checkpoint(out / "checkpoint.pt")["step"] == stopped + 2


@pytest.mark.slow
def test_a_run_killed_hard_leaves_no_stale_lock(tmp_path, small_corpus):
    out = tmp_path / "run"
    first = _started(out, small_corpus)
    first.kill()  # SIGKILL: no handler runs, nothing is cleaned up
    first.wait()
    assert first.returncode == -signal.SIGKILL
    again = subprocess.run(_cli(out, small_corpus, 3, "--overwrite"), capture_output=True,
                           text=True, cwd=ROOT, env=ENV, timeout=120)
    assert again.returncode == 0, again.stderr
    assert "in use" not in again.stderr


def test_a_refused_run_leaves_no_folder_behind(tmp_path, small_corpus):
    from minixl.cli import main

    out = tmp_path / "never"
    assert main(train_args("char", out, 2, "--corpus", str(small_corpus), "--resume")) == 2
    assert not out.exists()


def test_an_out_that_is_a_file_is_one_clear_line(tmp_path, small_corpus, capsys):
    from minixl.cli import main

    out = tmp_path / "a-file"
    out.write_bytes(b"keep me")
    assert main(train_args("char", out, 2, "--corpus", str(small_corpus))) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1] == f"minixl train: error: --out {out} is a file: name a folder for the run"
    assert out.read_bytes() == b"keep me"


# ---------------------------------------------------------------- failed saves

def _file_limit(size: int):
    """For preexec_fn: files of this process may not grow past `size` bytes; a write past it
    fails with EFBIG (SIGXFSZ ignored, as Python itself does), as a full disk would."""
    def limit():
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        resource.setrlimit(resource.RLIMIT_FSIZE, (size, resource.getrlimit(resource.RLIMIT_FSIZE)[1]))
    return limit


def _run(out: Path, corpus: Path, steps: int, *extra: str, limit: int | None = None):
    return subprocess.run(_cli(out, corpus, steps, "--ckpt-every", "2", *extra),
                          capture_output=True, text=True, cwd=ROOT, env=ENV, timeout=300,
                          preexec_fn=_file_limit(limit) if limit else None)


def _digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _one_line(result) -> str:
    """What the user sees on stderr: exactly one line, no traceback."""
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in result.stderr, result.stderr
    return lines[0]


def _losses(out: Path) -> list[tuple[str, str]]:
    with open(out / "metrics.csv") as f:
        return [(r["step"], r["train_bpc"]) for r in csv.DictReader(f)]


def _weights(out: Path) -> dict:
    from minixl.checkpoint import load_checkpoint

    return load_checkpoint(out / "checkpoint.pt")["model"]


@pytest.mark.slow
def test_a_save_that_cannot_be_written_keeps_the_last_checkpoint_and_resumes_exactly(
        tmp_path, small_corpus):
    whole, out = tmp_path / "whole", tmp_path / "run"
    assert _run(whole, small_corpus, 6).returncode == 0  # never interrupted
    assert _run(out, small_corpus, 2).returncode == 0
    kept, rows = _digest(out / "checkpoint.pt"), (out / "metrics.csv").read_text()
    size = (out / "checkpoint.pt").stat().st_size

    # the next save (step 4) cannot be written: files may not grow past half a checkpoint
    failed = _run(out, small_corpus, 6, "--resume", "--allow-change", "steps", limit=size // 2)
    assert failed.returncode == 4, failed.stderr
    line = _one_line(failed)
    assert line.startswith(f"minixl train: could not write the checkpoint of step 4 to "
                           f"{out / 'checkpoint.pt'}: ") and "(EFBIG)" in line, line
    assert (f"the checkpoint of step 2 in {out / 'checkpoint.pt'} is kept, and metrics.csv "
            "ends at that step" in line and "ulimit -f" in line and "--resume" in line), line
    assert _digest(out / "checkpoint.pt") == kept  # nothing lost
    assert (out / "metrics.csv").read_text() == rows  # steps 3 and 4 are not in it
    assert not list(out.glob("*.part"))

    again = _run(out, small_corpus, 6, "--resume", "--allow-change", "steps")
    assert again.returncode == 0, again.stderr
    assert _losses(out) == _losses(whole)
    mine, theirs = _weights(out), _weights(whole)
    assert all(torch.equal(mine[k], theirs[k]) for k in theirs)  # bit-exact


@pytest.mark.slow
def test_a_first_save_that_cannot_be_written_leaves_nothing_behind(tmp_path, small_corpus):
    out = tmp_path / "run"
    failed = _run(out, small_corpus, 4, limit=50_000)  # a checkpoint is about 230 KB
    assert failed.returncode == 4, failed.stderr
    line = _one_line(failed)
    assert "could not write the checkpoint of step 2" in line, line
    assert "no checkpoint had been saved, so nothing of this run is kept" in line, line
    assert "start it again" in line, line
    assert not out.exists()  # the folder it made, empty, is gone: a plain re-run works
    assert _run(out, small_corpus, 4).returncode == 0


@pytest.fixture
def tiny_disk(tmp_path):
    """A 1 MB tmpfs, where this process may mount one (root on Linux); else a skip that
    says why."""
    disk = tmp_path / "disk"
    disk.mkdir()
    if shutil.which("mount") is None or os.geteuid() != 0:
        pytest.skip("mounting a tmpfs needs root and mount(8); the file-size-limit tests "
                    "cover failed saves")
    made = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(disk)],
                          capture_output=True, text=True)
    if made.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {made.stderr.strip()}")
    yield disk
    subprocess.run(["umount", "-l", str(disk)], check=False)


def _fill(disk: Path) -> None:
    """Take every free byte of `disk`."""
    st = os.statvfs(disk)
    with open(disk / "filler", "wb") as f:
        f.write(b"x" * (st.f_bavail * st.f_frsize))
    assert os.statvfs(disk).f_bavail == 0


@pytest.mark.slow
def test_a_full_disk_in_a_save_or_a_metrics_row_keeps_the_last_checkpoint(tiny_disk,
                                                                          small_corpus):
    out = tiny_disk / "run"
    assert _run(out, small_corpus, 2).returncode == 0
    kept, rows = _digest(out / "checkpoint.pt"), (out / "metrics.csv").read_text()
    _fill(tiny_disk)
    # a checkpoint at step 4 finds no room
    failed = _run(out, small_corpus, 6, "--resume", "--allow-change", "steps")
    assert failed.returncode == 4, failed.stderr
    line = _one_line(failed)
    assert "could not write the checkpoint of step 4" in line and "(ENOSPC)" in line, line
    assert "the checkpoint of step 2" in line and "free space" in line, line
    assert _digest(out / "checkpoint.pt") == kept and (out / "metrics.csv").read_text() == rows
    # no checkpoint for a long while: metrics.csv outgrows its last page of the disk
    failed = _run(out, small_corpus, 400, "--resume", "--allow-change", "steps",
                  "--ckpt-every", "1000")
    assert failed.returncode == 4, failed.stderr
    line = _one_line(failed)
    assert "could not write the metrics of step " in line and "metrics.csv: " in line, line
    assert "(ENOSPC)" in line and "the checkpoint of step 2" in line, line
    assert _digest(out / "checkpoint.pt") == kept and (out / "metrics.csv").read_text() == rows
    (tiny_disk / "filler").unlink()  # space again: the run goes on from step 2
    again = _run(out, small_corpus, 6, "--resume", "--allow-change", "steps")
    assert again.returncode == 0, again.stderr
    assert [step for step, _ in _losses(out)] == [str(i) for i in range(1, 7)]
