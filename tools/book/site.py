"""Build the book as a static website (`make html`).

Usage: ``python -m tools.book.site [--out DIR]``, from the repository root.

The site is made from the notebooks in ``nbs/`` exactly as stored, outputs included;
nothing is executed. The pairs must be in sync (``make check``), so the text is the text
of ``book/*.md``. The configuration lives in ``book/site/`` (Jupyter Book 1.x: ``_config.yml``,
``_toc.yml``, the API page and a small Sphinx extension). Both are copied into a staging
folder, ``_build/site-src``, and Jupyter Book builds it with every warning an error, so a
broken cross-reference, a missing page or a docstring it cannot read fails the build.
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent.parent
# The site's front door sends the reader to the preface. Jupyter Book writes a bare redirect;
# this one also names the site's icon, so that a browser does not ask for a missing
# /favicon.ico (a console error) before it follows the redirect.
INDEX = """<!DOCTYPE html>
<html lang="en">
<head>
<meta charset="utf-8">
<title>minixl</title>
<link rel="icon" href="_static/favicon.svg">
<meta http-equiv="refresh" content="0; url=nbs/00_preface.html">
</head>
<body><p><a href="nbs/00_preface.html">minixl: start with the preface</a></p></body>
</html>
"""
SITE_CONFIG = ROOT / "book" / "site"
NBS = ROOT / "nbs"


def stage(src: Path, nbs: Path = NBS) -> None:
    """Fill `src` with the site's configuration and the notebooks stored in `nbs`."""
    if src.exists():
        shutil.rmtree(src)
    shutil.copytree(SITE_CONFIG, src, ignore=shutil.ignore_patterns("__pycache__"))
    notebooks = sorted(nbs.glob("[0-9][0-9]_*.ipynb"))
    if not notebooks:
        raise SystemExit(f"no chapters found in {nbs}: expected nbs/NN_name.ipynb")
    (src / "nbs").mkdir()
    for nb in notebooks:  # kept in nbs/, so that the chapters' links to ../nbs/X.ipynb work
        shutil.copy2(nb, src / "nbs" / nb.name)


def build(out: Path, *, nbs: Path = NBS, work: Path = ROOT / "_build") -> int:
    """Stage the notebooks of `nbs` in `work` and build the site into `out` (its index.html is
    the preface); return the exit code."""
    jupyter_book = Path(sys.executable).parent / "jupyter-book"
    if not jupyter_book.exists():
        print("error: jupyter-book is not installed in this environment; "
              "pip install -e '.[site]' (make html does it)", file=sys.stderr)
        return 1
    src = work / "site-src"
    stage(src, nbs)
    built = work / "site-work"  # Jupyter Book writes <path-output>/_build/html
    cmd = [str(jupyter_book), "build", str(src), "--path-output", str(built), "--builder", "html",
           "--warningiserror", "--nitpick", "--keep-going", "--all", "--quiet"]
    if subprocess.run(cmd, cwd=ROOT).returncode != 0:
        print("error: the site has warnings (listed above); each is an error here",
              file=sys.stderr)
        return 1
    if out.exists():
        shutil.rmtree(out)
    shutil.copytree(built / "_build" / "html", out)
    (out / "index.html").write_text(INDEX)
    print(f"site built: open {out / 'index.html'}")
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=ROOT / "_build" / "html",
                        help="folder for the built site (default: _build/html)")
    parser.add_argument("--nbs", type=Path, default=NBS,
                        help="folder of the chapters' notebooks (default: nbs/)")
    parser.add_argument("--work", type=Path, default=ROOT / "_build",
                        help="folder for the staged sources (default: _build)")
    args = parser.parse_args(argv)
    return build(args.out.resolve(), nbs=args.nbs.resolve(), work=args.work.resolve())


if __name__ == "__main__":
    sys.exit(main())
