"""Faults a user meets while a run writes its folder, met as the user meets them: real
processes of `minixl train`, a real SIGKILL. (A full disk and a read-only folder are still
to come.)"""

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

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
