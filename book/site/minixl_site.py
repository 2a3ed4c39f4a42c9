"""Sphinx extension of the minixl website (hand-written; loaded by _config.yml).

- Equations work offline: MathJax 3 (SVG output, which needs no font files) is copied from
  the `sphinx-mathjax-offline` package into the site, instead of being fetched from a CDN
  as Sphinx does by default.
- The API page shows each docstring verbatim, as a reader sees it with `help()`: the
  docstrings are plain text, not reStructuredText, so they are never parsed as markup
  (which would turn `*args` or a stray backquote into a warning).
- Two slips of the theme stack that a browser reports as console errors are mended: the
  thebe and toggle-button settings scripts are added to every page twice (a `const`
  declared twice), and the colour mode is left empty ("Got invalid theme mode").
"""

from __future__ import annotations

import shutil
from importlib import metadata
from pathlib import Path

MATHJAX = "mathjax/tex-svg.js"


def _mathjax_files() -> Path:
    try:
        dist = metadata.distribution("sphinx-mathjax-offline")
    except metadata.PackageNotFoundError as err:
        raise RuntimeError("the site needs MathJax from the sphinx-mathjax-offline package: "
                           "pip install -e '.[site]' (make html does it)") from err
    folder = Path(dist.locate_file("sphinx-mathjax-offline/static/mathjax"))
    if not (folder / "tex-svg.js").exists():
        raise RuntimeError(f"no MathJax in {folder}: reinstall sphinx-mathjax-offline")
    return folder


def _copy_mathjax(app, exception) -> None:
    if exception is None and app.builder.format == "html":
        shutil.copytree(_mathjax_files(), Path(app.outdir) / "_static" / "mathjax",
                        dirs_exist_ok=True)


def _verbatim(app, what, name, obj, options, lines: list[str]) -> None:
    if any(line.strip() for line in lines):
        lines[:] = [".. code-block:: text", ""] + ["    " + line for line in lines] + [""]


def _mend_page(app, pagename, templatename, context, doctree) -> None:
    if not context.get("default_mode"):
        context["default_mode"] = "auto"
    seen, scripts = set(), []
    for script in context.get("script_files", []):
        key = (str(getattr(script, "filename", script) or ""),  # None and "" both mean inline
               tuple(sorted(getattr(script, "attributes", {}).items())))
        if key not in seen:
            seen.add(key)
            scripts.append(script)
    context["script_files"] = scripts


def setup(app):
    _mathjax_files()  # fail at once, with the fix, when MathJax is missing
    app.config.mathjax_path = MATHJAX
    app.connect("build-finished", _copy_mathjax)
    app.connect("autodoc-process-docstring", _verbatim)
    app.connect("html-page-context", _mend_page, priority=900)  # after the themes' own
    app.add_css_file("minixl.css")
    return {"parallel_read_safe": True, "parallel_write_safe": True}
