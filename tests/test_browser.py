"""The reader's path, in a real browser: the website, and the chapters in JupyterLab.

Hand-written. These tests run only under `pytest --browser` (`make test-browser`), which
needs a Chromium or Chrome: `MINIXL_CHROMIUM` names it, else /usr/bin/chromium, else the
first `chromium` or `google-chrome` on the PATH. Playwright drives it; it never downloads
a browser of its own. The site tests read the built site in _build/html (`make html`).

JupyterLab is started the way `make lab` starts it (the same `jupyter lab`, the same
jupytext pairing from pyproject.toml) in a temporary copy of book/ and nbs/, so that
running the chapters never touches the working tree. Two deliberately broken pairs in that
copy show that the checks fail when they should: one whose notebook was edited without its
text file (jupytext refuses to open it), and one with a cell that raises.
"""

from __future__ import annotations

import functools
import json
import os
import re
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import urldefrag, urlparse

import pytest

ROOT = Path(__file__).resolve().parent.parent
SITE = ROOT / "_build" / "html"
CHAPTERS = sorted(p.stem for p in (ROOT / "book").glob("[0-9][0-9]_*.md"))
RUN_ALL = ["00_preface", "01_char_transformer"]  # the preface and one training chapter
# Flags for a headless Chromium on a machine with no network and no display.
CHROMIUM_ARGS = ["--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                 "--disable-background-networking", "--disable-component-update",
                 "--disable-sync"]
OUT_OF_SYNC, RAISES = "97_out_of_sync", "98_raises"

pytestmark = pytest.mark.browser


def chromium_path() -> str:
    """The browser to drive, or a failure that says how to provide one."""
    named = os.environ.get("MINIXL_CHROMIUM")
    candidates = [named] if named else [
        "/usr/bin/chromium", shutil.which("chromium"), shutil.which("chromium-browser"),
        shutil.which("google-chrome")]
    for path in candidates:
        if path and os.access(path, os.X_OK):
            return path
    pytest.fail("no Chromium found: set MINIXL_CHROMIUM=/path/to/chromium-or-chrome, or on "
                "Debian/Ubuntu run `make test-browser`, which installs the chromium package")


@pytest.fixture(scope="module")
def browser():
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        b = p.chromium.launch(executable_path=chromium_path(), args=CHROMIUM_ARGS)
        yield b
        b.close()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# ------------------------------------------------------------------------------ the website


@pytest.fixture(scope="module")
def site():
    """The built site, served on localhost; yields its base URL."""
    if not (SITE / "index.html").exists():
        pytest.fail(f"no site in {SITE}: run `make html` first")
    handler = functools.partial(_QuietHandler, directory=str(SITE))
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}/"
    server.shutdown()


class _QuietHandler(SimpleHTTPRequestHandler):
    def log_message(self, *args):
        pass


@functools.lru_cache(maxsize=None)
def _fetch(url: str) -> tuple[int, str]:
    """Status and (for HTML) text of a page on the local server."""
    try:
        with urllib.request.urlopen(url) as r:
            body = r.read()
            kind = r.headers.get("Content-Type", "")
            return r.status, body.decode("utf-8", "replace") if "html" in kind else ""
    except urllib.error.HTTPError as err:
        return err.code, ""


def broken_links(page_url: str, links: list[str], base: str) -> list[str]:
    """Local links whose file is missing or whose #anchor names no element of its page."""
    problems = []
    for link in sorted(set(links)):
        if not link.startswith(base):
            if urlparse(link).scheme not in ("http", "https", "mailto", "javascript"):
                problems.append(f"{page_url}: odd link {link}")
            continue
        target, anchor = urldefrag(link)
        status, text = _fetch(target)
        if status != 200:
            problems.append(f"{page_url}: broken link {link} (HTTP {status})")
        elif anchor and text and not re.search(rf'id="{re.escape(anchor)}"', text):
            problems.append(f"{page_url}: link {link} names no element #{anchor}")
    return problems


def visit(browser, url: str, base: str, *, lands_on: str | None = None):
    """Load a page (and, with lands_on, wait until its redirect arrives there); return the
    list of what goes wrong (console errors, failed requests, math that did not render,
    broken links), which keeps filling until the page is closed, and the page, still open."""
    page = browser.new_page()
    problems: list[str] = []
    page.on("console", lambda m: problems.append(f"{url}: console {m.type}: {m.text}")
            if m.type == "error" else None)
    page.on("pageerror", lambda e: problems.append(f"{url}: script error: {e}"))
    # A request cancelled because the page moved on (net::ERR_ABORTED) is not a fault; a
    # missing file shows as its HTTP status below.
    page.on("requestfailed", lambda r: problems.append(
        f"{url}: request failed: {r.url} ({r.failure})") if "ABORTED" not in str(r.failure)
        else None)
    page.on("response", lambda r: problems.append(f"{url}: HTTP {r.status} for {r.url}")
            if r.status >= 400 else None)
    page.goto(url, wait_until="networkidle")
    if lands_on:
        page.wait_for_url(lands_on)
        page.wait_for_load_state("networkidle")
    if page.locator(".math").count():
        page.wait_for_function("window.MathJax && MathJax.startup && MathJax.startup.promise")
        page.evaluate("MathJax.startup.promise")  # typesetting done
        if page.locator("mjx-merror, [data-mjx-error]").count():
            problems.append(f"{url}: MathJax could not typeset an equation")
        if not page.locator("mjx-container").count():
            problems.append(f"{url}: equations were not typeset")
    links = page.eval_on_selector_all(
        "a[href], img[src], link[href], script[src]",
        "els => els.map(e => e.href || e.src).filter(Boolean)")
    problems += broken_links(url, links, base)
    return problems, page


def site_pages() -> list[str]:
    """Every page of the built site, as a path relative to its root."""
    skip = ("_static", "_sources", "_images")
    return sorted(str(p.relative_to(SITE)) for p in SITE.rglob("*.html")
                  if p.relative_to(SITE).parts[0] not in skip)


FRONT = "index.html"  # redirects to the preface


def test_every_site_page_loads_without_errors_or_broken_links(browser, site):
    pages = site_pages()
    assert {f"nbs/{c}.html" for c in CHAPTERS} | {FRONT, "api.html"} <= set(pages), pages
    problems = []
    for name in pages:
        lands_on = site + "nbs/00_preface.html" if name == FRONT else None
        found, page = visit(browser, site + name, site, lands_on=lands_on)
        stem = Path(name).stem
        if stem[:2].isdigit():  # every chapter offers its notebook
            hrefs = page.eval_on_selector_all("a[href]", "els => els.map(e => e.href)")
            if not any(h.endswith(f"/{stem}.ipynb") for h in hrefs):
                found.append(f"{name}: no link to {stem}.ipynb")
        page.close()
        problems += found  # read after closing: late errors count too
    assert not problems, "\n".join(problems)


def test_the_site_renders_equations_figures_links_and_the_api(browser, site):
    found, page = visit(browser, site, site, lands_on=site + "nbs/00_preface.html")
    assert page.locator('mjx-container[display="true"] svg').count() >= 1  # the bpc formula
    chapters = page.eval_on_selector_all("a.reference.internal[href]", "els => els.map(e => e.href)")
    for name in CHAPTERS[1:]:  # "The chapters" links every chapter, as a working link
        assert site + f"nbs/{name}.html" in chapters, name
    page.close()
    found, page = visit(browser, site + "nbs/04_transformer_xl.html", site)
    sizes = page.eval_on_selector_all("img", "els => els.map(e => e.naturalWidth)")
    assert len(sizes) >= 3 and all(w > 0 for w in sizes), sizes  # figures load
    page.close()
    found, page = visit(browser, site + "api.html", site)
    for name in ("minixl.char_transformer.causal_mask", "minixl.transformer_xl.rel_shift",
                 "minixl.check.attention"):
        assert page.locator(f'[id="{name}"]').count() == 1, name
    page.close()


BAD_PAGE = r"""<!DOCTYPE html><html><head><meta charset="utf-8"><title>bad</title>
<link rel="icon" href="_static/favicon.svg">
<script defer src="_static/mathjax/tex-svg.js"></script></head><body>
<p><span class="math notranslate nohighlight">\(\frac{1}\)</span></p>
<img src="no_such_figure.png"><a href="no_such_page.html">a broken link</a>
<script>console.error("a script that reports an error");</script>
</body></html>"""


def test_the_page_checks_catch_console_errors_missing_files_and_bad_math(browser, site):
    """A page with one of each fault, served beside the site's own _static."""
    bad = SITE / "_broken_by_test.html"
    bad.write_text(BAD_PAGE)
    try:
        found, page = visit(browser, site + bad.name, site)
        page.close()
    finally:
        bad.unlink()
    report = "\n".join(found)
    assert "a script that reports an error" in report, report
    assert "HTTP 404" in report and "no_such_figure.png" in report, report
    assert "broken link" in report and "no_such_page.html" in report, report
    assert "MathJax could not typeset" in report, report


def test_the_link_check_catches_a_broken_link(site):
    preface = site + "nbs/00_preface.html"
    assert broken_links("x", [preface, preface + "#notation"], site) == []
    assert "HTTP 404" in broken_links("x", [site + "nbs/no_such_page.html"], site)[0]
    assert "names no element" in broken_links("x", [preface + "#nowhere"], site)[0]


# ------------------------------------------------------------------------------ JupyterLab


def make_broken_pairs(root: Path) -> None:
    """Two pairs a reader must never meet: a notebook edited behind its text file's back, and
    a chapter that raises."""
    jupytext = [str(Path(sys.executable).parent / "jupytext")]
    for name, cell in ((OUT_OF_SYNC, "print('only in the notebook')"),
                       (RAISES, "raise RuntimeError('a chapter that raises')")):
        md = root / "book" / f"{name}.md"
        md.write_text((root / "book" / "00_preface.md").read_text().split("## Who it is for")[0]
                      + ("```{code-cell} ipython3\n" + cell + "\n```\n"
                         if name == RAISES else ""))
        subprocess.run(jupytext + ["--quiet", "--sync", str(md)], check=True)
    nb_path = root / "nbs" / f"{OUT_OF_SYNC}.ipynb"
    nb = json.loads(nb_path.read_text())
    nb["cells"].append({"cell_type": "code", "execution_count": None, "id": "behind-its-back",
                        "metadata": {}, "outputs": [], "source": ["print('edited')"]})
    nb_path.write_text(json.dumps(nb, indent=1))
    later = time.time() + 60
    os.utime(nb_path, (later, later))  # the notebook is newer than its text file


@pytest.fixture(scope="module")
def lab(browser):
    """JupyterLab over a copy of book/ and nbs/, and a browser page with it loaded."""
    root = Path(tempfile.mkdtemp(prefix="minixl-lab-"))
    for part in ("book", "nbs"):
        shutil.copytree(ROOT / part, root / part, ignore=shutil.ignore_patterns(
            ".ipynb_checkpoints", "__pycache__", "site"))
    shutil.copy2(ROOT / "pyproject.toml", root / "pyproject.toml")  # jupytext's pairing
    make_broken_pairs(root)
    port, token = free_port(), "minixl-browser-test"
    cmd = [str(Path(sys.executable).parent / "jupyter"), "lab", "--no-browser",
           f"--port={port}", "--ip=127.0.0.1", f"--ServerApp.token={token}",
           f"--ServerApp.root_dir={root}", "--LabApp.expose_app_in_browser=True"]
    if os.getuid() == 0:
        cmd.append("--allow-root")  # as `make lab` does for root
    log = open(root / "lab.log", "w")
    server = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT)
    base = f"http://127.0.0.1:{port}"
    try:
        for _ in range(200):
            try:
                urllib.request.urlopen(f"{base}/api/status?token={token}", timeout=10)
                break
            except (urllib.error.URLError, ConnectionError, TimeoutError):
                if server.poll() is not None:
                    pytest.fail("JupyterLab did not start:\n" + (root / "lab.log").read_text())
                time.sleep(0.3)
        else:
            pytest.fail("JupyterLab did not answer within a minute:\n"
                        + (root / "lab.log").read_text())
        page = browser.new_page()
        page.set_default_timeout(120_000)
        page.goto(f"{base}/lab?token={token}")
        page.wait_for_function("window.jupyterapp && window.jupyterapp.started")
        page.evaluate("async () => { await window.jupyterapp.restored; }")
        yield page, root
        page.close()
    finally:
        server.terminate()
        server.wait(timeout=30)
        log.close()
        shutil.rmtree(root, ignore_errors=True)


OPEN = """async ([path, factory]) => {
  const app = window.jupyterapp;
  const pause = ms => new Promise(resolve => setTimeout(resolve, ms));
  const timeout = pause(30000).then(() => 'timeout');
  let widget = null, outcome;
  try {
    widget = await app.commands.execute('docmanager:open', {path, factory});
    outcome = await Promise.race([widget.context.ready.then(() => 'ready'), timeout]);
  } catch (err) {
    outcome = 'error: ' + err;
  }
  const cells = widget && !widget.isDisposed && widget.content && widget.content.widgets
    ? widget.content.widgets.length : 0;
  // Record every dialog and dismiss it (Discard rather than Save, Cancel rather than Ok);
  // dismissing one can raise the next, so look until none is left.
  const dialogs = [];
  for (let round = 0; round < 6; round++) {
    await pause(round === 0 ? 1500 : 800);  // a late dialog shows by now
    const open = Array.from(document.querySelectorAll('.jp-Dialog'));
    if (!open.length && round > 0) break;
    for (const dialog of open) {
      dialogs.push(dialog.innerText);
      const button = dialog.querySelector('.jp-mod-warn') || dialog.querySelector('.jp-mod-reject')
        || dialog.querySelector('.jp-mod-accept');
      if (button) button.click();
    }
  }
  if (widget && !widget.isDisposed) { widget.dispose(); }
  await app.serviceManager.sessions.shutdownAll();
  return {outcome, dialogs, cells};
}"""


def open_problems(page, path: str) -> list[str]:
    """Open one file of a pair as a notebook; what a reader would meet instead of it."""
    factory = "Notebook" if path.endswith(".ipynb") else "Jupytext Notebook"
    seen = page.evaluate(OPEN, [path, factory])
    problems = [f"{path}: a dialog appeared: {' '.join(d.split())}" for d in seen["dialogs"]]
    if seen["outcome"] != "ready":
        problems.append(f"{path}: the notebook did not load ({seen['outcome']})")
    elif seen["cells"] == 0:
        problems.append(f"{path}: opened with no cells")
    return problems


RUN_ALL_MINUTES = 10  # a chapter takes at most 3 minutes on the slowest machine supported
RUN_ALL_AND_SAVE = """async ([path, minutes]) => {
  const app = window.jupyterapp;
  const widget = await app.commands.execute('docmanager:open', {path, factory: 'Notebook'});
  await widget.context.ready;
  await widget.sessionContext.ready;
  app.shell.activateById(widget.id);
  const run = app.commands.execute('notebook:run-all-cells')  // Run > Run All Cells
    .then(() => 'done');
  const late = new Promise(resolve => setTimeout(() => resolve('timeout'), minutes * 60000));
  const outcome = await Promise.race([run, late]);
  const dialogs = Array.from(document.querySelectorAll('.jp-Dialog')).map(d => d.innerText);
  if (outcome === 'done') {
    await app.commands.execute('docmanager:save');         // File > Save Notebook
  }
  widget.dispose();
  await app.serviceManager.sessions.shutdownAll();
  return {outcome, dialogs};
}"""


def run_all_problems(page, root: Path, name: str) -> list[str]:
    """Run All and save in JupyterLab, then read the saved notebook back from disk."""
    path = f"nbs/{name}.ipynb"
    seen = page.evaluate(RUN_ALL_AND_SAVE, [path, RUN_ALL_MINUTES])
    problems = [f"{path}: a dialog appeared: {' '.join(d.split())}" for d in seen["dialogs"]]
    if seen["outcome"] != "done":
        problems.append(f"{path}: Run All did not finish within {RUN_ALL_MINUTES} minutes")
    nb = json.loads((root / path).read_text())
    code = [c for c in nb["cells"] if c["cell_type"] == "code"]
    for n, cell in enumerate(code):
        errors = [o for o in cell["outputs"] if o["output_type"] == "error"]
        if errors:
            problems.append(f"{path}: code cell {n} raised {errors[0]['ename']}: "
                            f"{errors[0]['evalue']}")
        if cell["execution_count"] is None:
            problems.append(f"{path}: code cell {n} was not executed")
    if not code:
        problems.append(f"{path}: no code cells")
    return problems


def test_every_chapter_opens_in_jupyterlab_as_notebook_and_as_text(lab):
    page, _ = lab
    problems = []
    for name in CHAPTERS:
        for path in (f"nbs/{name}.ipynb", f"book/{name}.md"):
            problems += open_problems(page, path)
    assert not problems, "\n".join(problems)


@pytest.mark.parametrize("name", RUN_ALL)
def test_run_all_in_jupyterlab_then_save(lab, name):
    page, root = lab
    problems = run_all_problems(page, root, name)
    assert not problems, "\n".join(problems)


def test_the_lab_checks_catch_an_out_of_sync_pair_and_a_chapter_that_raises(lab):
    page, root = lab
    problems = open_problems(page, f"nbs/{OUT_OF_SYNC}.ipynb")
    assert any("dialog" in p and "more recent" in p for p in problems), problems
    assert open_problems(page, f"nbs/{RAISES}.ipynb") == []  # it opens fine ...
    problems = run_all_problems(page, root, RAISES)  # ... and fails when run
    assert any("raised RuntimeError: a chapter that raises" in p for p in problems), problems
