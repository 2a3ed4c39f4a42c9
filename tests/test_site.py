"""`make html`: the website is built from the stored notebooks, and a warning fails it."""

import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
SITE = [sys.executable, "-m", "tools.book.site"]  # run from ROOT (cwd=ROOT)

needs_jupyter_book = pytest.mark.skipif(
    shutil.which("jupyter-book", path=str(Path(sys.executable).parent)) is None,
    reason="the site extra is not installed: pip install -e '.[site]'")


def test_the_api_page_documents_every_module():
    api = (ROOT / "book" / "site" / "api.md").read_text()
    package = ROOT / "minixl"
    modules = sorted(p.stem for p in package.glob("[a-z]*.py") if p.stem != "__main__")
    modules += sorted(p.parent.name for p in package.glob("*/__init__.py"))  # the packages,
    modules += sorted(f"{p.parent.name}.{p.stem}" for p in package.glob("*/[a-z]*.py")
                      if p.stem != "__main__")  # and what they are made of
    missing = [m for m in modules if f".. automodule:: minixl.{m}\n" not in api]
    assert not missing, f"book/site/api.md does not document {missing}"


def test_the_table_of_contents_lists_every_chapter():
    toc = (ROOT / "book" / "site" / "_toc.yml").read_text()
    for md in sorted((ROOT / "book").glob("[0-9][0-9]_*.md")):
        assert f"nbs/{md.stem}\n" in toc, md.stem


def test_the_readme_figure_exists_and_is_small():
    readme = (ROOT / "README.md").read_text()
    first_screen = readme[:readme.index("## What is in it")]
    figures = re.findall(r"!\[[^]]*\]\(([^)]+\.png)\)", first_screen)
    assert figures, "the README's first screen shows no figure"
    for figure in figures:
        assert (ROOT / figure).stat().st_size < 200_000, figure
    assert "make lab" in first_screen and "make test" in first_screen


def test_the_readme_figure_is_chapter_fours_stored_output():
    """book/figures/xl_reach.png is a copy of Chapter 4's receptive-field figure: after a
    re-run changes that figure, copy it again (this test names the cell)."""
    import base64

    nb = json.loads((ROOT / "nbs" / "04_transformer_xl.ipynb").read_text())
    cell = next(c for c in nb["cells"] if c["cell_type"] == "code"
                and "vanilla: no memory" in "".join(c["source"]))
    png = next(o["data"]["image/png"] for o in cell["outputs"] if "image/png" in o.get("data", {}))
    assert base64.b64decode(png) == (ROOT / "book" / "figures" / "xl_reach.png").read_bytes(), (
        "the README's figure differs from Chapter 4's stored output of the cell that plots "
        "'vanilla: no memory': copy that PNG to book/figures/xl_reach.png")


def _build(tmp_path: Path, extra_markdown: str | None) -> subprocess.CompletedProcess:
    """Build the site from a copy of nbs/ whose preface ends with `extra_markdown`."""
    nbs = tmp_path / "nbs"
    shutil.copytree(ROOT / "nbs", nbs, ignore=shutil.ignore_patterns(".ipynb_checkpoints"))
    if extra_markdown:
        preface = nbs / "00_preface.ipynb"
        nb = json.loads(preface.read_text())
        nb["cells"].append({"cell_type": "markdown", "id": "added-by-test", "metadata": {},
                            "source": [extra_markdown]})
        preface.write_text(json.dumps(nb))
    return subprocess.run(SITE + ["--nbs", str(nbs), "--work", str(tmp_path / "work"),
                                  "--out", str(tmp_path / "html")],
                          capture_output=True, text=True, cwd=ROOT)


@pytest.mark.slow
@needs_jupyter_book
def test_the_site_builds_with_every_chapter_its_notebook_and_the_api(tmp_path):
    done = _build(tmp_path, None)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    html = tmp_path / "html"
    for md in sorted((ROOT / "book").glob("[0-9][0-9]_*.md")):
        page = (html / "nbs" / f"{md.stem}.html").read_text()
        assert f"{md.stem}.ipynb" in page  # the download button offers the notebook
        assert (html / "_sources" / "nbs" / f"{md.stem}.ipynb").exists()
    front = re.search(r'http-equiv="refresh" content="0; url=([^"]+)"', (html / "index.html").read_text())
    assert front and (html / front.group(1)).exists()  # the front door leads to the preface
    api = (html / "api.html").read_text()
    assert 'id="minixl.transformer_xl.rel_shift"' in api
    assert (html / "_static" / "mathjax" / "tex-svg.js").exists()  # equations offline
    assert "unpkg.com" not in (html / "nbs" / "00_preface.html").read_text().replace(
        'THEBE_JS_URL = "https://unpkg.com', "")  # nothing else is fetched from a CDN


@pytest.mark.slow
@needs_jupyter_book
def test_a_broken_link_or_a_missing_figure_fails_the_build(tmp_path):
    done = _build(tmp_path, "See [chapter 9](../nbs/09_missing.ipynb) and "
                            "![a figure](no_such_figure.png).")
    out = done.stdout + done.stderr
    assert done.returncode == 1, out[-3000:]
    assert "09_missing" in out and "no_such_figure.png" in out
    assert "each is an error here" in out
    assert not (tmp_path / "html").exists()  # no half-built site is left to be mistaken


def test_the_readme_shows_the_bench_and_links_its_decision_table():
    """The README's first screen shows the bench's figure and links its decision table; the
    table is the one bench_all (and bench_cost, bench_context, bench_recall) write from the stored CSVs
    (text, byte for byte), and the
    figure is a PNG of the size plot_bench draws."""
    import csv

    from minixl.one_bench.bench_all import decisions, decisions_markdown

    readme = (ROOT / "README.md").read_text()
    first_screen = readme[:readme.index("## What is in it")]
    assert "](book/bench/bench.png)" in first_screen
    assert "(book/bench/decisions.md)" in first_screen
    bench = ROOT / "book" / "bench"

    def read(name):
        with open(bench / name, newline="") as f:
            return list(csv.DictReader(f))

    table = decisions_markdown(decisions(read("quality.csv"), read("reach.csv"),
                                         read("cost.csv"), read("context/context.csv"),
                                         read("recall/recall.csv"), read("runs.csv"))) + "\n"
    assert (bench / "decisions.md").read_text() == table
    png = (bench / "bench.png").read_bytes()
    assert png[:8] == b"\x89PNG\r\n\x1a\n"
    width, height = int.from_bytes(png[16:20], "big"), int.from_bytes(png[20:24], "big")
    assert (width, height) == (720, 259)  # 10 x 3.6 inches at 72 dpi


def test_the_readme_starts_with_the_quick_paths_and_links_the_rest():
    """A newcomer's first screen: the set-up and the three commands used most, with their
    times, before any figure; how to run `minixl`; the CPU-only install; and a link to every
    page of the reference in docs/, each of whose own links resolves."""
    readme = (ROOT / "README.md").read_text()
    start = readme[readme.index("## Start here"):readme.index("![")]
    assert readme.index("## Start here") < 600 and len(start.splitlines()) < 45
    for needed in ("make lab ", "make train ", "make test-fast ", "--no-browser",
                   "source .venv/bin/activate", ".venv/bin/minixl", "make test` (about",
                   "--index-url https://download.pytorch.org/whl/cpu"):
        assert needed in start, needed
    pages = sorted((ROOT / "docs").glob("*.md"))
    assert pages and all(f"](docs/{p.name})" in readme for p in pages)
    for page in [ROOT / "README.md", *pages]:
        text = re.sub(r"```.*?```", "", page.read_text(), flags=re.S)
        for target in re.findall(r"\]\(([^)#\s]+)[^)]*\)", text):
            if not re.match(r"[a-z]+:", target):  # a file of the repository, not a URL
                assert (page.parent / target).exists(), f"{page.name} links {target}"
