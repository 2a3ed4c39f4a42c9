"""Shared fixtures: one table of tiny configurations for every model kind, and small trained
runs made once per test session through the command line.

Tests that only read a run (eval, sample, checkpoint errors) use these instead of training
their own; tests that change a run copy it first (`copy_run`). Tests marked `slow` (real
subprocesses, several processes, signals, suites and experiments) are left out by
`make test-fast`; `make test` runs them all.
"""

import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from minixl.cli import main

# Every model kind at its tiniest: one layer, width 32, two heads (the sizes each test scales).
SIZES = {"n_layer": 1, "d_model": 32, "n_head": 2, "d_inner": 64}


class _Tiny(dict):
    """The book's kinds by name; a kind registered later, at its own tiny preset's sizes
    (so that a new kind runs in every test that goes over KINDS without an entry here)."""

    def __missing__(self, name: str) -> dict:
        from minixl.kinds import KINDS

        return dict(KINDS[name].presets["tiny"].model)


TINY_CONFIGS = _Tiny({
    "char": dict(SIZES, block_size=32),
    "shaw": dict(SIZES, block_size=32, max_relative=4),
    "xl": dict(SIZES, d_head=16, tgt_len=16, mem_len=16),
    "xlnet": dict(SIZES, seq_len=32, n_predict=6, mem_len=32),
    "segtree": dict(SIZES, block_size=32),
})
TINY = {kind: ["--model", kind] + [a for name, value in config.items()
                                   for a in (f"--{name.replace('_', '-')}", str(value))]
        for kind, config in TINY_CONFIGS.items()}
TRAIN = ["--batch-size", "4", "--eval-every", "4", "--eval-bytes", "2048", "--ckpt-every", "4",
         "--log-every", "2", "--device", "cpu", "--no-progress", "--sample-len", "0"]


# `python -c SIGNAL_AT STEP SIGNALS ARGV...`: minixl's command line, in a process that sends
# itself SIGNALS (comma-separated names) as the batch of step STEP (0-based) is read: a real
# signal at a step known in advance, so that a test never depends on how fast a run goes.
SIGNAL_AT = """
import os, signal, sys
from minixl import data, xlnet
from minixl.cli import main
step, signals = int(sys.argv[1]), [getattr(signal, s) for s in sys.argv[2].split(",")]
for cls in (data.RandomWindows, data.OrderedStreams, xlnet.PretrainStreams):
    def call(self, i, real=cls.__call__):
        if i == step:
            for s in signals:
                os.kill(os.getpid(), s)
        return real(self, i)
    cls.__call__ = call
sys.exit(main(sys.argv[3:]))
"""


def near_uniform(bpc: float, *, within: float = 0.5) -> bool:
    """Is `bpc` what a byte model scores a few steps from a fresh start: about log2(256) = 8
    bits per byte, the uniform guess (the fixtures' runs train 8 steps at a small rate)?
    A score in nats (8 ln 2 = 5.5) or one a trained model would give fails it, where a
    range such as 0 < bpc < 9 would pass both."""
    return abs(bpc - 8.0) < within


def first_quick(values: list, ids: list[str] | None = None) -> list:
    """Parameters for pytest.mark.parametrize: the first runs in the quick loop (make
    test-fast), the others in the slow tier only (make test runs them all)."""
    ids = ids or [None] * len(values)
    return [pytest.param(*(v if isinstance(v, tuple) else (v,)), id=i,
                         marks=() if n == 0 else pytest.mark.slow)
            for n, (v, i) in enumerate(zip(values, ids))]


def signalled_at(step: int, signals: str, argv: list[str]) -> list[str]:
    """The command that runs `minixl ARGV` and signals itself at step `step` (see SIGNAL_AT)."""
    import sys

    return [sys.executable, "-c", SIGNAL_AT, str(step), signals, *argv]


def tiny_model(kind: str, **changes):
    """A tiny model of `kind` (TINY_CONFIGS with changes), built from a fixed seed."""
    from minixl.kinds import KINDS

    torch.manual_seed(0)
    return KINDS[kind].build(KINDS[kind].config(**{**TINY_CONFIGS[kind], **changes}))


def train_args(kind: str, out: Path, steps: int = 8, *extra: str) -> list[str]:
    """`minixl train` arguments for a tiny run of `kind` in `out`."""
    return ["train", *TINY[kind], *TRAIN, "--steps", str(steps), "--out", str(out), *extra]


@pytest.fixture(scope="session")
def small_corpus(tmp_path_factory) -> Path:
    """A 60 KB text file (the start of the pydoc corpus): 3 KB valid and test splits, so
    the runs below end with a quick full held-out evaluation."""
    from minixl.data import pydoc_text

    path = tmp_path_factory.mktemp("corpus") / "small.txt"
    path.write_bytes(pydoc_text()[:60_000])
    return path


def _trained(kind: str, tmp_path_factory, corpus: Path) -> Path:
    out = tmp_path_factory.mktemp(f"{kind}-run") / "run"
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        assert main(train_args(kind, out, 8, "--corpus", str(corpus))) == 0
    finally:
        torch.set_num_threads(threads)
    return out


def _run_fixture(kind: str, what: str):
    """A session fixture: the folder of an 8-step tiny run of `kind` on small_corpus."""
    def run(tmp_path_factory, small_corpus) -> Path:
        return _trained(kind, tmp_path_factory, small_corpus)

    run.__doc__ = f"The folder of an 8-step tiny {what} run on small_corpus."
    return pytest.fixture(scope="session", name=f"{kind}_run")(run)


char_run = _run_fixture("char", "char (checkpoint, metrics, plot)")
xl_run = _run_fixture("xl", "Transformer-XL")
xlnet_run = _run_fixture("xlnet", "XLNet (held-out infill at 4 and 8)")
segtree_run = _run_fixture("segtree", "SegTree")


@pytest.fixture
def copy_run(tmp_path):
    """copy_run(run) -> a private copy of a run folder that a test may change."""
    def copy(run: Path) -> Path:
        return Path(shutil.copytree(run, tmp_path / "copy" / run.name))
    return copy


@pytest.fixture(scope="module")
def one_thread():
    """Torch on one thread for a module of tiny runs: they run no faster on two, and far
    slower when the two wait for each other on a busy machine; put back afterwards."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def pytest_addoption(parser):
    parser.addoption("--browser", action="store_true",
                     help="also run the browser tests (tests/test_browser.py; make test-browser)")


def pytest_collection_modifyitems(config, items):
    if config.getoption("--browser"):
        return
    skip = pytest.mark.skip(reason="browser test: run with --browser (make test-browser)")
    for item in items:
        if "browser" in item.keywords:
            item.add_marker(skip)


def loaded_after(code: str) -> tuple[set[str], str]:
    """The minixl modules (and torch._dynamo, if it is) a fresh interpreter has loaded after
    running code; its stdout."""
    r = subprocess.run([sys.executable, "-c", code + "\nimport sys\nprint(sorted(m for m in "
                        "sys.modules if m.startswith(('minixl', 'torch._dynamo'))))"],
                       capture_output=True, text=True, cwd=Path(__file__).resolve().parent.parent)
    assert r.returncode == 0, r.stderr
    *printed, modules = r.stdout.strip().splitlines()
    return set(eval(modules)), "\n".join(printed)
