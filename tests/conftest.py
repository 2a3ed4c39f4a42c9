"""Shared fixtures: small trained runs, made once per test session through the command line.

Tests that only read a run (eval, sample, checkpoint errors) use these instead of training
their own; tests that change a run copy it first (`copy_run`).
"""

import shutil
from pathlib import Path

import pytest
import torch

from minixl.cli import main

TINY = {
    "char": ["--model", "char", "--n-layer", "1", "--d-model", "32", "--n-head", "2",
             "--d-inner", "64", "--block-size", "32"],
    "shaw": ["--model", "shaw", "--n-layer", "1", "--d-model", "32", "--n-head", "2",
             "--d-inner", "64", "--block-size", "32", "--max-relative", "4"],
    "xl": ["--model", "xl", "--n-layer", "1", "--d-model", "32", "--n-head", "2", "--d-head",
           "16", "--d-inner", "64", "--tgt-len", "16", "--mem-len", "16"],
}
TRAIN = ["--batch-size", "4", "--eval-every", "4", "--eval-bytes", "2048", "--ckpt-every", "4",
         "--log-every", "2", "--device", "cpu", "--no-progress", "--sample-len", "0"]


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
    assert main(train_args(kind, out, 8, "--corpus", str(corpus))) == 0
    return out


@pytest.fixture(scope="session")
def char_run(tmp_path_factory, small_corpus) -> Path:
    """The folder of an 8-step tiny char run on small_corpus (checkpoint, metrics, plot)."""
    return _trained("char", tmp_path_factory, small_corpus)


@pytest.fixture(scope="session")
def xl_run(tmp_path_factory, small_corpus) -> Path:
    """The folder of an 8-step tiny Transformer-XL run on small_corpus."""
    return _trained("xl", tmp_path_factory, small_corpus)


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
