"""The book's guards must fail when what they guard is broken."""

import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import nbformat
import pytest
import yaml
from packaging.requirements import Requirement

try:
    import tomllib
except ImportError:  # Python 3.10
    import tomli as tomllib

ROOT = Path(__file__).resolve().parent.parent


def book_check(root: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(root / "minixl" / "_book.py"), "check"],
                          capture_output=True, text=True)


@pytest.fixture
def repo_copy(tmp_path):
    for name in ("book", "nbs", "minixl"):
        shutil.copytree(ROOT / name, tmp_path / name,
                        ignore=shutil.ignore_patterns("__pycache__", ".ipynb_checkpoints"))
    return tmp_path


def test_book_check_passes_on_the_repo():
    r = book_check(ROOT)
    assert r.returncode == 0, r.stderr


def test_book_check_fails_on_a_hand_edited_module(repo_copy):
    mod = repo_copy / "minixl" / "char_transformer.py"
    mod.write_text(mod.read_text() + "\nHAND_EDIT = 1\n")
    r = book_check(repo_copy)
    assert r.returncode == 1 and "char_transformer.py is out of date" in r.stderr


def test_book_check_fails_when_a_pair_is_out_of_sync(repo_copy):
    md = repo_copy / "book" / "01_char_transformer.md"
    md.write_text(md.read_text().replace("attention is blind to order", "changed", 1)
                  .replace("Attention is blind to order", "Changed"))
    r = book_check(repo_copy)
    assert r.returncode == 1 and "differ" in r.stderr


def test_book_check_fails_when_a_side_is_missing(repo_copy):
    (repo_copy / "nbs" / "00_preface.ipynb").unlink()
    r = book_check(repo_copy)
    assert r.returncode == 1 and "missing nbs/00_preface.ipynb" in r.stderr


def tiny_notebook(path: Path, stored: str) -> None:
    nb = nbformat.v4.new_notebook()
    cell = nbformat.v4.new_code_cell("print(1 + 1)")
    cell.outputs = [nbformat.v4.new_output("stream", name="stdout", text=stored)]
    cell.execution_count = 1
    nb.cells = [cell]
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    nbformat.write(nb, path)


def nbval(folder: Path, budget: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "--nbval",
         "--nbval-current-env", "--rootdir", str(folder), str(folder)],
        capture_output=True, text=True, env={**__import__("os").environ,
                                             "MINIXL_CHAPTER_BUDGET_S": budget})


def test_nbval_and_budget_guards(tmp_path):
    shutil.copy(ROOT / "nbs" / "conftest.py", tmp_path / "conftest.py")
    tiny_notebook(tmp_path / "good.ipynb", "2\n")
    assert nbval(tmp_path, "600").returncode == 0
    over = nbval(tmp_path, "0")
    assert over.returncode == 1 and "OVER BUDGET" in over.stdout
    tiny_notebook(tmp_path / "good.ipynb", "3\n")  # stored output no longer matches a run
    assert nbval(tmp_path, "600").returncode == 1


@pytest.mark.parametrize("nb", sorted((ROOT / "nbs").glob("*.ipynb")), ids=lambda p: p.name)
def test_notebooks_are_stored_executed_and_small(nb):
    cells = json.loads(nb.read_text())["cells"]
    code = [c for c in cells if c["cell_type"] == "code"]
    missing = [i for i, c in enumerate(code) if c["execution_count"] is None and c["source"]]
    assert not missing, f"{nb.name}: code cells {missing} have no stored run (make run)"
    assert nb.stat().st_size < 1_000_000


def test_environment_yml_matches_pyproject_and_makefile():
    env = yaml.safe_load((ROOT / "environment.yml").read_text())
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    makefile = (ROOT / "Makefile").read_text()
    pip = next(d for d in env["dependencies"] if isinstance(d, dict))["pip"]
    torch_pin = re.search(r"^TORCH_VERSION \?= (\S+)$", makefile, re.M).group(1)
    assert f"torch=={torch_pin}" in pip
    torch_req = next(Requirement(r) for r in project["dependencies"] if r.startswith("torch"))
    assert torch_req.specifier.contains(torch_pin)
    extras = re.search(r'pip install --quiet -e "\.\[([a-z,]+)\]"', makefile).group(1)
    assert f"-e .[{extras}]" in pip
    assert set(extras.split(",")) == set(project["optional-dependencies"])
    python = next(d for d in env["dependencies"] if isinstance(d, str) and d.startswith("python="))
    assert Requirement("python" + project["requires-python"]).specifier.contains(python[7:] + ".0")


@pytest.mark.parametrize("side", ["book/{}.md", "nbs/{}.ipynb"])
def test_jupyterlab_opens_either_side_of_each_pair(side):
    """JupyterLab's jupytext contents manager refuses pairs that are out of step."""
    try:
        from jupytext.sync_contentsmanager import TextFileContentsManager
    except ImportError:  # jupytext before 1.17
        from jupytext.contentsmanager import TextFileContentsManager

    cm = TextFileContentsManager(root_dir=str(ROOT))
    for md in sorted((ROOT / "book").glob("[0-9][0-9]_*.md")):
        model = cm.get(side.format(md.stem), content=True)
        assert model["type"] == "notebook" and model["content"]["cells"]


def test_book_check_fails_on_a_stray_generated_module(repo_copy):
    src = (repo_copy / "minixl" / "char_transformer.py").read_text()
    (repo_copy / "minixl" / "old_chapter.py").write_text(src)
    r = book_check(repo_copy)
    assert r.returncode == 1 and "old_chapter.py is generated but no chapter exports it" in r.stderr
