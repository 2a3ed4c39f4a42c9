"""Faults a user meets while a run writes its folder, met as the user meets them: real
processes of `minixl train`; a second run into a folder in use; a real SIGKILL at random
moments and inside a save; a real file-size limit (writes fail with EFBIG) and, where the
test may mount one, a real tiny filesystem (ENOSPC); a folder made read-only mid-run (as an
unprivileged user: root writes through any permission); a damaged metrics.csv. Each asserts
what the user sees (the exit code, one line) and that nothing was lost (the kept
checkpoint's bytes, and a resume that ends bit-exactly as an unbroken run)."""

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

from conftest import first_quick, train_args

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


# ---------------------------------------------------------------- killed hard, at any moment

# `python -c KILL_IN_SAVE N WHERE ARGV...`: minixl's command line, in a process that sends
# itself SIGKILL inside its Nth checkpoint save: half-way through writing the file ("write")
# or with the whole file written, just before it replaces the last checkpoint ("rename").
KILL_IN_SAVE = """
import os, signal, sys
from minixl import checkpoint
from minixl.training import run_folder
from minixl.cli import main
target, where = int(sys.argv[1]), sys.argv[2]
seen = {"saves": 0, "writes": 0}
def save_checkpoint(path, payload, real=checkpoint.save_checkpoint):
    seen["saves"], seen["writes"] = seen["saves"] + 1, 0
    return real(path, payload)
def write(self, data, real=checkpoint._Writer.write):
    seen["writes"] += 1
    if where == "write" and seen["saves"] == target and seen["writes"] == 50:
        self.f.flush()
        os.kill(os.getpid(), signal.SIGKILL)
    return real(self, data)
def replace(src, dst, real=os.replace):  # (os.replace of this process: a checkpoint's only)
    if (where == "rename" and seen["saves"] == target and str(dst).endswith("checkpoint.pt")):
        os.kill(os.getpid(), signal.SIGKILL)
    return real(src, dst)
run_folder.save_checkpoint, checkpoint._Writer.write = save_checkpoint, write
checkpoint.os.replace = replace
sys.exit(main(sys.argv[3:]))
"""
STEPS = 40


def _resumed_exactly(out: Path, whole: Path, corpus: Path, steps: int = STEPS) -> None:
    """--resume continues `out` to the end, ending as the unbroken run `whole` did."""
    from minixl.checkpoint import load_checkpoint

    kept = load_checkpoint(out / "checkpoint.pt", for_resume=True)["step"]  # a whole file
    if kept < steps:  # (killed after its last save, the run is whole: nothing to resume)
        again = _run(out, corpus, steps, "--resume")
        assert again.returncode == 0, again.stderr
    assert _losses(out) == _losses(whole), f"resumed from step {kept}"
    mine, theirs = _weights(out), _weights(whole)
    assert all(torch.equal(mine[k], theirs[k]) for k in theirs)
    if kept < steps:  # (a run killed while drawing its last plot may leave loss.png.part)
        assert not list(out.glob("*.part"))


LONG_STEPS = 400  # a few seconds: a kill within 1.5 s of the first save lands mid-run


@pytest.fixture(scope="module")
def unbroken(tmp_path_factory, small_corpus):
    whole = tmp_path_factory.mktemp("unbroken") / "run"
    assert _run(whole, small_corpus, STEPS).returncode == 0
    return whole


@pytest.fixture(scope="module")
def unbroken_long(tmp_path_factory, small_corpus):
    whole = tmp_path_factory.mktemp("unbroken") / "run"
    assert _run(whole, small_corpus, LONG_STEPS).returncode == 0
    return whole


@pytest.mark.slow
@pytest.mark.parametrize("where", ["write", "rename"])
def test_a_run_killed_inside_a_save_resumes_exactly_from_its_last_checkpoint(
        tmp_path, small_corpus, unbroken, where):
    from minixl.checkpoint import load_checkpoint

    out = tmp_path / "run"
    killed = subprocess.run([sys.executable, "-c", KILL_IN_SAVE, "3", where,
                             *_cli(out, small_corpus, STEPS, "--ckpt-every", "2")[3:]],
                            capture_output=True, text=True, cwd=ROOT, env=ENV, timeout=300)
    assert killed.returncode == -signal.SIGKILL, killed.stderr
    assert load_checkpoint(out / "checkpoint.pt")["step"] == 4  # the save of step 6 died
    assert len(list(out.glob("checkpoint.pt.*.part"))) == 1  # its half (or whole) file
    _resumed_exactly(out, unbroken, small_corpus)


@pytest.mark.slow
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_a_run_killed_at_a_random_moment_resumes_exactly(tmp_path, small_corpus,
                                                         unbroken_long, seed):
    import random

    out = tmp_path / "run"
    proc = subprocess.Popen(_cli(out, small_corpus, LONG_STEPS, "--ckpt-every", "2"),
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                            cwd=ROOT, env=ENV)
    deadline = time.monotonic() + 120
    while not (out / "checkpoint.pt").exists() and proc.poll() is None:
        assert time.monotonic() < deadline, "no first checkpoint"
        time.sleep(0.005)
    time.sleep(random.Random(seed).uniform(0, 1.5))  # in a step, a save or a metrics row
    proc.kill()
    _, err = proc.communicate(timeout=120)
    if proc.returncode == 0:  # it finished first (a fast machine): then it must be whole
        assert _losses(out) == _losses(unbroken_long)
        return
    assert proc.returncode == -signal.SIGKILL, err
    _resumed_exactly(out, unbroken_long, small_corpus, LONG_STEPS)


# `python -c KILL_AT STEP WRITE ARGV...`: minixl's command line, in a process that kills
# itself (SIGKILL) at the WRITE-th write to its run folder after the batch of step STEP
# (0-based) is read, WRITE 0 being the batch itself. A write is a chunk of a checkpoint, a
# rename, a metrics row or a plot, so a (STEP, WRITE) drawn from a seed lands the kill in a
# step, a save, a row or a plot, and in the same place every time: a failure is repeatable.
KILL_AT = """
import os, signal, sys
from minixl import checkpoint, data
from minixl.training import run_folder
from minixl.cli import main
step, write = int(sys.argv[1]), int(sys.argv[2])
seen = {"armed": False, "writes": 0}
def event():
    if seen["armed"]:
        if seen["writes"] == write:
            os.kill(os.getpid(), signal.SIGKILL)
        seen["writes"] += 1
def counted(real):
    def call(*args, **kwargs):
        event()
        return real(*args, **kwargs)
    return call
for cls in (data.RandomWindows, data.OrderedStreams):
    def batch(self, i, real=cls.__call__):
        if i == step and not seen["armed"]:
            seen["armed"] = True
            event()
        return real(self, i)
    cls.__call__ = batch
checkpoint._Writer.write = counted(checkpoint._Writer.write)
os.replace = counted(os.replace)
run_folder.RunFolder.write = counted(run_folder.RunFolder.write)
run_folder.RunFolder.plot = counted(run_folder.RunFolder.plot)
sys.exit(main(sys.argv[3:]))
"""


def _started_afresh(out: Path, whole: Path, corpus: Path, stopped: str) -> None:
    """A plain re-run into `out`, which holds only what a run killed before its first
    checkpoint left: it says so in one line, starts afresh and ends as `whole` did."""
    again = _run(out, corpus, STEPS)
    assert again.returncode == 0, again.stderr
    line = (f"{out} held only what a run stopped before its first checkpoint left ({stopped}, "
            "no checkpoint): starting afresh")
    assert again.stdout.count(line) == 1, again.stdout
    assert _losses(out) == _losses(whole)
    mine, theirs = _weights(out), _weights(whole)
    assert all(torch.equal(mine[k], theirs[k]) for k in theirs)
    assert not list(out.glob("*.part"))


@pytest.mark.slow
@pytest.mark.parametrize("seed", [*range(6), 31])  # (31: step 1, before the first save)
def test_a_run_killed_at_a_seeded_step_and_write_resumes_exactly(tmp_path, small_corpus,
                                                                 unbroken, seed):
    """The random kill above, placed by a seed instead of the clock."""
    import random

    rng = random.Random(seed)
    step, write = rng.randrange(STEPS), rng.randrange(60)
    out = tmp_path / "run"
    killed = subprocess.run([sys.executable, "-c", KILL_AT, str(step), str(write),
                             *_cli(out, small_corpus, STEPS, "--ckpt-every", "2")[3:]],
                            capture_output=True, text=True, cwd=ROOT, env=ENV, timeout=300)
    where = f"killed at write {write} after the batch of step {step}"
    if killed.returncode == 0:  # the run wrote fewer than `write` times after that step
        assert _losses(out) == _losses(unbroken), where
        return
    assert killed.returncode == -signal.SIGKILL, (where, killed.stderr)
    if (out / "checkpoint.pt").exists():
        _resumed_exactly(out, unbroken, small_corpus)
    else:
        _started_afresh(out, unbroken, small_corpus, _stopped(out))


def _stopped(out: Path) -> str:
    """What the folder's line names: the last whole row of metrics.csv (the kill may have
    cut the one after it short)."""
    header, *lines = (out / "metrics.csv").read_text().splitlines()
    rows = [line for line in lines if line.count(",") == header.count(",")]
    return f"metrics.csv to step {rows[-1].split(',')[0]}" if rows else "metrics.csv without a row"


@pytest.mark.slow
def test_a_folder_left_by_a_run_killed_before_its_first_checkpoint_starts_afresh(
        tmp_path, small_corpus, unbroken):
    """SIGKILL as the batch of step 2 is read, before the first save (at step 2): the folder
    holds metrics.csv and nothing else. --resume says there is nothing to resume and how to
    start afresh; a file of the user's beside it still stops a plain run; without it the
    run starts afresh, saying so. The same after a first save killed half-way (its .part)."""
    from conftest import signalled_at

    out = tmp_path / "run"
    killed = subprocess.run(signalled_at(1, "SIGKILL", _cli(out, small_corpus, STEPS,
                                                            "--ckpt-every", "2")[3:]),
                            capture_output=True, text=True, cwd=ROOT, env=ENV, timeout=300)
    assert killed.returncode == -signal.SIGKILL, killed.stderr
    assert sorted(p.name for p in out.iterdir()) == ["metrics.csv"]
    resumed = _run(out, small_corpus, STEPS, "--resume")
    assert resumed.returncode == 2
    assert _one_line(resumed) == (
        f"minixl train: error: --resume: there is no checkpoint at {out / 'checkpoint.pt'} to "
        "resume from: the run in it stopped before its first checkpoint (metrics.csv to step "
        "1); run again without --resume to start afresh")
    (out / "notes.txt").write_text("mine")
    refused = _run(out, small_corpus, STEPS)
    assert refused.returncode == 2 and "already holds a run (metrics.csv)" in _one_line(refused)
    assert (out / "notes.txt").read_text() == "mine"
    (out / "notes.txt").unlink()
    _started_afresh(out, unbroken, small_corpus, "metrics.csv to step 1")

    done = tmp_path / "done"  # a whole run whose checkpoint was removed: its history stays
    shutil.copytree(unbroken, done)
    (done / "checkpoint.pt").unlink()
    kept = (done / "metrics.csv").read_bytes()
    refused = _run(done, small_corpus, STEPS)
    assert refused.returncode == 2 and "already holds a run (metrics.csv" in _one_line(refused)
    assert (done / "metrics.csv").read_bytes() == kept

    part = tmp_path / "part"
    killed = subprocess.run([sys.executable, "-c", KILL_IN_SAVE, "1", "write",
                             *_cli(part, small_corpus, STEPS, "--ckpt-every", "2")[3:]],
                            capture_output=True, text=True, cwd=ROOT, env=ENV, timeout=300)
    assert killed.returncode == -signal.SIGKILL, killed.stderr
    assert len(list(part.glob("checkpoint.pt.*.part"))) == 1
    assert not (part / "checkpoint.pt").exists()
    _started_afresh(part, unbroken, small_corpus, "metrics.csv to step 2")


# ---------------------------------------------------------------- permission lost mid-run

# `python -c CHMOD_AT STEP MODE DIR ARGV...`: minixl's command line, in a process that takes
# its own write permission on DIR away (chmod MODE) as the batch of step STEP is read.
CHMOD_AT = """
import os, sys
from minixl import data
from minixl.cli import main
step, mode, folder = int(sys.argv[1]), int(sys.argv[2], 8), sys.argv[3]
for cls in (data.RandomWindows, data.OrderedStreams):
    def call(self, i, real=cls.__call__):
        if i == step:
            os.chmod(folder, mode)
        return real(self, i)
    cls.__call__ = call
sys.exit(main(sys.argv[4:]))
"""


@pytest.fixture
def unprivileged(small_corpus):
    """(a folder and a corpus that an unprivileged user can use, the command prefix that
    runs as that user): root writes through any permission, so as root the run goes as
    user 65534 (setpriv); a skip that says why where that cannot be done."""
    import tempfile

    base = Path(tempfile.mkdtemp(prefix="minixl-faults-"))
    try:
        base.chmod(0o777)
        corpus = base / "corpus.txt"
        shutil.copy(small_corpus, corpus)
        corpus.chmod(0o644)
        prefix = []
        if os.geteuid() == 0:
            if shutil.which("setpriv") is None:
                pytest.skip("running as root, where chmod does not stop a write, and "
                            "setpriv(1) is not here to run as another user")
            prefix = ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups"]
            probe = subprocess.run([*prefix, sys.executable, "-c", "import minixl"],
                                   capture_output=True, text=True, cwd=ROOT, env=ENV)
            if probe.returncode != 0:
                pytest.skip("user 65534 cannot run minixl from this checkout (its folders "
                            f"are not readable to others): {probe.stderr.strip()[-200:]}")
        yield base, corpus, prefix
    finally:
        shutil.rmtree(base, ignore_errors=True)


@pytest.mark.slow
def test_a_folder_made_read_only_mid_run_keeps_the_last_checkpoint(unprivileged, tmp_path,
                                                                  small_corpus):
    base, corpus, prefix = unprivileged
    out = base / "run"
    env = {**ENV, "HOME": str(base), "MPLCONFIGDIR": str(base / "mpl")}

    def run(*argv: str):
        return subprocess.run([*prefix, *argv], capture_output=True, text=True, cwd=ROOT,
                              env=env, timeout=300)

    # step 3 (0-based) takes the write permission away: the save of step 4 cannot be made
    failed = run(sys.executable, "-c", CHMOD_AT, "3", "555", str(out),
                 *_cli(out, corpus, 8, "--ckpt-every", "2")[3:])
    assert failed.returncode == 4, failed.stderr
    line = _one_line(failed)
    assert (f"could not write the checkpoint of step 4 to {out / 'checkpoint.pt'}: no "
            "permission to write there (EACCES)" in line), line
    assert "the checkpoint of step 2" in line and "make the folder writable" in line, line
    assert [step for step, _ in _losses(out)] == ["1", "2"]
    out.chmod(0o755)
    again = run(*_cli(out, corpus, 8, "--ckpt-every", "2", "--resume"))
    assert again.returncode == 0, again.stderr
    whole = tmp_path / "whole"
    assert _run(whole, corpus, 8).returncode == 0
    assert _losses(out) == _losses(whole)
    mine, theirs = _weights(out), _weights(whole)
    assert all(torch.equal(mine[k], theirs[k]) for k in theirs)

    # read-only before the first save: nothing to keep, and metrics.csv cannot be removed
    first = base / "first"
    failed = run(sys.executable, "-c", CHMOD_AT, "1", "555", str(first),
                 *_cli(first, corpus, 8, "--ckpt-every", "2")[3:])
    assert failed.returncode == 4, failed.stderr
    line = _one_line(failed)
    assert "no checkpoint had been saved, so nothing of this run is kept (metrics.csv could " \
           "not be removed, Permission denied)" in line and "with --overwrite" in line, line
    first.chmod(0o755)
    assert run(*_cli(first, corpus, 4, "--overwrite")).returncode == 0


# ---------------------------------------------------------------- a damaged metrics.csv

def _damage(text: bytes, how: str) -> bytes:
    lines = text.splitlines(keepends=True)
    if how == "junk line":
        lines.insert(3, b"\x00\xff\xfejunk\n")
    elif how == "a word for a number":
        fields = lines[2].split(b",")  # step 2's row
        lines[2] = b",".join([fields[0], b"abc", *fields[2:]])
    elif how == "half a row":
        lines.append(b"5,7.9")
    elif how == "header":
        lines[0] = b"\x00\x00garbage\n"
    return b"".join(lines)


@pytest.mark.parametrize("how, steps, warned", first_quick([
    ("junk line", ["1", "2", "3", "4", "5", "6"], "line (4)"),
    ("a word for a number", ["1", "3", "4", "5", "6"], "line (3)"),
    ("half a row", ["1", "2", "3", "4", "5", "6"], None),
    ("header", ["5", "6"], "header"),
], ["junk line", "a word for a number", "half a row", "header"]))
def test_a_damaged_metrics_csv_on_resume_loses_only_the_damaged_lines(tmp_path, small_corpus,
                                                                      capsys, how, steps,
                                                                      warned):
    from minixl.cli import main

    out = tmp_path / "run"
    args = ("--corpus", str(small_corpus), "--log-every", "1", "--ckpt-every", "2")
    assert main(train_args("char", out, 4, *args)) == 0
    metrics = out / "metrics.csv"
    metrics.write_bytes(_damage(metrics.read_bytes(), how))
    capsys.readouterr()
    assert main(train_args("char", out, 6, *args, "--resume", "--allow-change", "steps")) == 0
    err = capsys.readouterr().err
    assert [step for step, _ in _losses(out)] == steps
    if warned == "header":
        assert f"warning: {metrics} had a damaged header, so none of its rows could be read; " \
               "it starts again with this run's rows" in err, err
    elif warned:
        assert f"warning: {metrics} had 1 damaged {warned}, dropped" in err, err
    else:
        assert "warning" not in err, err


def test_a_folder_locked_for_an_instant_is_waited_for_not_refused(tmp_path):
    """Another start's preflight takes the folder's lock for an instant: a run that meets
    it waits (up to half a second) instead of being told the folder is in use, so two
    starts a moment apart do not turn each other away. A real holder: another process."""
    from minixl.training.run_folder import RunFolder

    out = tmp_path / "run"
    out.mkdir()
    holder = subprocess.Popen(
        [sys.executable, "-c", "import fcntl, os, sys, time\nfd = os.open(sys.argv[1], os.O_RDONLY)"
         "\nfcntl.flock(fd, fcntl.LOCK_EX)\nprint('held', flush=True)\ntime.sleep(0.2)", str(out)],
        stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        folder = RunFolder(out, None, None, None, {})
        folder.lock()  # the holder lets go after 0.2 s: taken, not refused
        folder.unlock()
    finally:
        holder.kill()
        holder.wait()
