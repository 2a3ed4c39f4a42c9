"""The package a user installs: a wheel built from the repository holds the library and
nothing of the book's tooling, and, installed into a fresh virtual environment, imports and
trains a tiny run from an empty folder."""

import re
import shlex
import shutil
import subprocess
import sys
import sysconfig
import venv
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


def _run(argv, **kw) -> subprocess.CompletedProcess:
    r = subprocess.run([str(a) for a in argv], capture_output=True, text=True, timeout=900, **kw)
    assert r.returncode == 0, f"{' '.join(map(str, argv))}\n{r.stdout[-2000:]}\n{r.stderr[-3000:]}"
    return r


# The installed minixl's own requirements (not its extras), each met by what the environment
# imports from: prints those that are not.
REQUIREMENTS_MET = """
from importlib.metadata import PackageNotFoundError, requires, version
from packaging.requirements import Requirement
unmet = []
for r in map(Requirement, requires("minixl")):
    if r.marker is None or r.marker.evaluate({"extra": ""}):
        try:
            if version(r.name) not in r.specifier:
                unmet.append(f"{r}: {version(r.name)}")
        except PackageNotFoundError:
            unmet.append(f"{r}: missing")
print(unmet)
"""


@pytest.mark.slow
def test_the_wheel_holds_the_library_alone_and_trains_from_an_empty_folder(tmp_path):
    # built from a copy of what the build reads, so that the build leaves the repository as is
    source = tmp_path / "source"
    source.mkdir()
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(ROOT / name, source)
    for name in ("minixl", "tools"):
        shutil.copytree(ROOT / name, source / name,
                        ignore=shutil.ignore_patterns("__pycache__", "*.egg-info"))
    dist = tmp_path / "dist"
    _run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q",
          "-w", dist, source])
    (wheel,) = dist.glob("minixl-*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    assert {n.split("/")[0] for n in names} == {"minixl", wheel.name.split("-py")[0] +
                                                ".dist-info"}, sorted(names)
    package = {str(p.relative_to(ROOT)) for p in (ROOT / "minixl").rglob("*.py")}
    assert package == {n for n in names if n.endswith(".py")}  # all of it, and nothing else
    assert not any("tools" in n or "_book" in n or "_site" in n for n in names)

    env = tmp_path / "env"
    venv.create(env, with_pip=True)
    python = env / "bin" / "python"
    # Its dependencies are this environment's (torch, numpy, matplotlib, tqdm), seen through a
    # path file after the new environment's own packages: no download (torch alone is
    # gigabytes); each requirement the wheel declares is then checked against them.
    site = Path(_run([python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"]
                     ).stdout.strip())
    (site / "zz_dependencies.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    _the_readmes_cpu_only_install_resolves(python, wheel)
    _run([python, "-m", "pip", "install", "-q", "--no-deps", "--no-index", wheel])
    unmet = _run([python, "-c", REQUIREMENTS_MET]).stdout.strip()
    assert unmet == "[]", unmet
    empty = tmp_path / "empty"
    empty.mkdir()
    corpus = empty / "text.txt"
    corpus.write_text("A small text to train on, read a few times over. " * 400)
    _run([python, "-c", "import sys, minixl; minixl.CharTransformer; minixl.setup_run; "
          "assert not [m for m in sys.modules if m.startswith('tools')]; print(minixl.__file__)"],
         cwd=empty)
    r = _run([env / "bin" / "minixl", "train", "--corpus", corpus.name, "--steps", "3",
              "--device", "cpu", "--no-progress", "--sample-len", "0", "--out", "run",
              "--n-layer", "1", "--d-model", "32", "--n-head", "2", "--d-inner", "64",
              "--block-size", "32", "--batch-size", "4", "--eval-bytes", "256"], cwd=empty)
    assert "trained 3 steps" in r.stdout, r.stdout
    assert (empty / "run" / "checkpoint.pt").exists()
    assert str(env) in _run([python, "-c", "import minixl; print(minixl.__file__)"],
                            cwd=empty).stdout  # the installed copy, not the repository's


def test_building_a_wheel_leaves_nothing_git_would_add():
    """`pip wheel .` writes build/ (and `python -m build`, dist/) into the checkout: both are
    ignored, so a reader who built the wheel sees a clean `git status`."""
    if not (ROOT / ".git").exists():
        pytest.skip("not a git checkout: nothing to keep clean")
    for path in ("build/lib/minixl/__init__.py", "dist/minixl-0.1.0-py3-none-any.whl"):
        r = subprocess.run(["git", "check-ignore", "-q", path], cwd=ROOT)
        assert r.returncode == 0, f"{path} is not ignored"


def _the_readmes_cpu_only_install_resolves(python, wheel):
    """The README's note for a machine without an NVIDIA GPU: torch (the Makefile's pin) from
    PyTorch's CPU index, then minixl. Each line is run as pip --dry-run in the fresh
    environment, whose torch is this CPU build: pip must accept the options and find the pin
    met, and minixl's requirements are met there (REQUIREMENTS_MET, above). (The index itself
    cannot be reached from a test: --no-index stands in, and --no-deps spares torch's own
    requirements, which the fresh environment's older setuptools would fail; so what this
    proves is the commands and the pin, not the download.)"""
    readme = (ROOT / "README.md").read_text()
    note = readme[readme.index("pip pulls its CUDA build"):]
    block = note[note.index("```\n") + 4:]
    first, second = block[:block.index("```")].strip().splitlines()
    pin = re.search(r"^TORCH_VERSION \?= (\S+)$", (ROOT / "Makefile").read_text(), re.M).group(1)
    assert shlex.split(first) == ["pip", "install", f"torch=={pin}", "--index-url",
                                  "https://download.pytorch.org/whl/cpu"], first
    assert shlex.split(second) == ["pip", "install", "-e", "."], second
    dry = [python, "-m", "pip", "install", "--dry-run", "--no-index", "--no-deps"]
    said = _run(dry + shlex.split(first)[2:]).stdout
    assert f"Requirement already satisfied: torch=={pin}" in said, said
    said = _run(dry + [wheel]).stdout  # `-e .`, as the wheel built from it
    assert "Would install minixl" in said, said
