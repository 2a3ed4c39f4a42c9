"""The reader's path, in a real browser: the website, and the chapters in JupyterLab.

Hand-written. These tests run only under `pytest --browser` (`make test-browser`), which
needs a Chromium or Chrome: `MINIXL_CHROMIUM` names it, else /usr/bin/chromium, else the
first `chromium` or `google-chrome` on the PATH. Playwright drives it; it never downloads
a browser of its own. The site tests read the built site in _build/html (`make html`).

JupyterLab is started by the README's own `make lab`, run in a temporary copy of the
repository (book/, nbs/, minixl/, the Makefile and pyproject.toml, with their modification
times) with the repository's .venv, so that nothing here touches the working tree. Only
LAB_ARGS is added (no browser, a port, a token); the browser loads the page that
`make lab` would send a reader's browser to. The tests check that it serves the
repository root and opens the preface first; that every chapter opens, as its notebook and
as its text file, without a dialog; that a line typed into a code cell and saved
(File > Save) reaches the other side of the pair, from the notebook and from the text
file, so that `tools.book check` passes and both files reopen without a dialog; and that
Run All and save of the preface and of Chapter 1 leave no error, every code cell executed
and the pair in step. Checks that must fail are shown to fail: a pair whose notebook
was edited behind its text file's back (jupytext refuses it), a chapter that raises, and
`make lab` with its lab rule as it once was (it served nbs/ alone, so a save reached the
notebook but not its text file).
"""

from __future__ import annotations

import contextlib
import functools
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import tempfile
import threading
import time
import urllib.error
import urllib.request
import uuid
from dataclasses import dataclass
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

VENV = ROOT / ".venv"  # the repository's environment: `make lab` in a copy runs this one
LAB_FILES = ("book", "nbs", "minixl", "tools", "docs", "README.md", "Makefile",
             "pyproject.toml")
EDITED = "01_char_transformer"  # the chapter whose cells the sync tests edit
LOAD_SECONDS = 120  # for the server to answer, a page or a document to load
SERVING = re.compile(r"Serving notebooks from local directory: (.+)$", re.M)
# The lab rule as it was, with LAB_ARGS: given only a file, Jupyter served the file's folder
# (nbs/), so jupytext could not reach book/ and a save wrote the notebook alone.
OLD_LAB_RECIPE = "\t$(VENV)/bin/jupyter lab $(ROOT_FLAG) $(LAB_ARGS) nbs/00_preface.ipynb"


@dataclass
class Lab:
    """A running `make lab` and a browser page with it loaded."""

    page: object  # the Playwright page
    root: Path  # the copy of the repository that `make lab` runs in
    served: Path | None  # the folder the server says it serves (None: its log does not say)
    first: dict  # the document the browser opened first: {"path", "problem"}
    check_before: subprocess.CompletedProcess  # `tools.book check` in the copy, before any test


def copy_repository(dest: Path) -> Path:
    """What `make lab` needs, copied with its modification times: jupytext compares those of
    a pair's two files. (The copied Makefile and pyproject.toml can be newer than the
    environment's stamp all the same: make_lab tells make not to remake it.)"""
    def ignore(folder: str, names: list[str]) -> list[str]:
        skip = {"__pycache__", ".ipynb_checkpoints"}
        if Path(folder) == ROOT / "book":
            skip.add("site")  # the website's sources
        return [n for n in names if n in skip]

    dest.mkdir(parents=True)
    for name in LAB_FILES:
        if (ROOT / name).is_dir():
            shutil.copytree(ROOT / name, dest / name, ignore=ignore)
        else:
            shutil.copy2(ROOT / name, dest / name)
    return dest


def book_check(root: Path) -> subprocess.CompletedProcess:
    """`make check` in a copy: `python -m tools.book check` with the repository's .venv."""
    return subprocess.run([str(VENV / "bin" / "python"), "-m", "tools.book", "check"],
                          cwd=root, capture_output=True, text=True, timeout=300)


def stop(server: subprocess.Popen) -> None:
    """End `make lab` and everything it started (its own process group)."""
    try:
        os.killpg(server.pid, signal.SIGTERM)
    except ProcessLookupError:
        return
    deadline = time.monotonic() + 30  # jupyter shuts its kernels down on SIGTERM
    while time.monotonic() < deadline:
        server.poll()  # reap make, so that only live processes keep the group
        try:
            os.killpg(server.pid, 0)
        except ProcessLookupError:
            break
        time.sleep(0.2)
    else:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(server.pid, signal.SIGKILL)
    server.wait(timeout=30)


@contextlib.contextmanager
def make_lab(browser, root: Path):
    """Run `make lab` in `root`, as the README tells a reader to, and load in the browser the
    page it would open; yield a Lab. Only LAB_ARGS is added: no browser of its own, a port
    and a token. The Jupyter runtime, settings and workspace folders are fresh ones beside
    `root`, so that the tester's own JupyterLab settings play no part."""
    if not (VENV / "bin" / "jupyter").exists():
        pytest.fail(f"no {VENV / 'bin' / 'jupyter'}: run `make setup` first")
    check_before = book_check(root)
    port, token = free_port(), "minixl-browser-test"
    here = root.parent
    env = dict(os.environ, JUPYTER_RUNTIME_DIR=str(here / "runtime"),
               JUPYTERLAB_SETTINGS_DIR=str(here / "settings"),
               JUPYTERLAB_WORKSPACES_DIR=str(here / "workspaces"))
    lab_args = (f"--no-browser --port={port} --ip=127.0.0.1 --ServerApp.token={token} "
                "--LabApp.expose_app_in_browser=True")
    # -o: never remake the environment's stamp (it depends on the Makefile and pyproject.toml,
    # which may be newer than it in a working tree), so make runs `jupyter lab` and nothing else.
    command = ["make", "--no-print-directory", "-C", str(root), "-o", str(VENV / ".installed"),
               "lab", f"VENV={VENV}", f"LAB_ARGS={lab_args}"]
    log = here / "make-lab.log"
    with open(log, "w") as out:
        server = subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT,
                                  stdin=subprocess.DEVNULL, env=env, start_new_session=True)
    page = None
    try:
        base, deadline = f"http://127.0.0.1:{port}", time.monotonic() + LOAD_SECONDS
        while True:
            try:
                urllib.request.urlopen(f"{base}/api/status?token={token}", timeout=10)
                break
            except OSError:  # not answering yet (urllib's URLError is an OSError)
                if server.poll() is not None:
                    pytest.fail(f"`make lab` exited ({server.returncode}) before JupyterLab "
                                f"answered:\n{log.read_text()}")
                text = log.read_text()
                ports = re.findall(r"http://[^/\s]+:(\d+)/", text.partition("is running at")[2])
                if ports and str(port) not in ports:  # it will never answer on ours
                    pytest.fail(f"`make lab` started JupyterLab on port {ports[0]}, not on "
                                f"{port} as LAB_ARGS asked (was that port taken, or does the "
                                f"lab rule not pass $(LAB_ARGS) on?):\n{text}")
                if time.monotonic() > deadline:
                    pytest.fail(f"JupyterLab did not answer within {LOAD_SECONDS} s of "
                                f"`make lab`:\n{log.read_text()}")
                time.sleep(0.3)
        serving = SERVING.search(log.read_text())
        served = Path(serving.group(1).strip()).resolve() if serving else None
        # With a file argument, jupyter writes the page it would open for it in the runtime
        # folder (jpserver-file-to-run-PID-open.html): the reader's first page.
        opener = sorted((here / "runtime").glob("jpserver-file-to-run-*-open.html"))
        found = re.search(r'url=([^"]+)"', opener[0].read_text()) if opener else None
        page = browser.new_page()
        page.set_default_timeout(LOAD_SECONDS * 1000)  # every Playwright wait has a deadline
        page.goto(found.group(1) if found else f"{base}/lab?token={token}")
        page.wait_for_function("() => window.jupyterapp !== undefined")
        first = page.evaluate(FIRST_DOCUMENT, LOAD_SECONDS)
        if not found:
            first["problem"] = "`make lab` gave the browser no file to open"
        yield Lab(page, root, served, first, check_before)
    finally:
        if page is not None:
            page.close()
        stop(server)


@contextlib.contextmanager
def repository_copy():
    """A fresh copy of what `make lab` needs, removed afterwards."""
    here = Path(tempfile.mkdtemp(prefix="minixl-lab-"))
    try:
        yield copy_repository(here / "minixl")
    finally:
        shutil.rmtree(here, ignore_errors=True)


@pytest.fixture(scope="module")
def lab(browser):
    """`make lab` in a copy of the repository, and a browser page with it loaded."""
    with repository_copy() as root, make_lab(browser, root) as running:
        yield running


def served_path(lab: Lab, path: str) -> str | None:
    """The path JupyterLab knows a repository file by (None: outside what it serves)."""
    if lab.served is None:
        return path
    try:
        return (lab.root / path).resolve().relative_to(lab.served).as_posix()
    except ValueError:
        return None


def outside(lab: Lab, path: str) -> str:
    return (f"{path}: outside the folder that `make lab` serves ({lab.served}), so a reader "
            "cannot open it, and jupytext cannot update it when its pair is saved")


# Shared by the scripts below. Every wait in them has a deadline (`within`), so that a
# document that never loads fails the test with a message instead of hanging it.
JS_HELPERS = r"""
  const app = window.jupyterapp;
  const pause = ms => new Promise(resolve => setTimeout(resolve, ms));
  const message = err => String((err && err.message) || err);
  const within = (promise, seconds, what) => new Promise((resolve, reject) => {
    const timer = setTimeout(
      () => reject(new Error(`${what} (no answer within ${seconds} s)`)), seconds * 1000);
    Promise.resolve(promise).then(value => { clearTimeout(timer); resolve(value); },
                                  err => { clearTimeout(timer); reject(err); });
  });
  const open = (path, factory) => within(
    app.commands.execute('docmanager:open', {path, factory}), 60,
    `JupyterLab did not open ${path}`);
  // Wait until the document is loaded, or a dialog shows (a document that cannot load shows
  // one and may never be ready): 'ready' or what went wrong.
  const loaded = async (widget, seconds = 120) => {
    if (!widget || !widget.context) return 'JupyterLab gave no document';
    let looking = true;
    const dialog = (async () => {
      while (looking && !document.querySelector('.jp-Dialog')) await pause(250);
      return 'a dialog appeared before it loaded';
    })();
    try {
      return await within(Promise.race([widget.context.ready.then(() => 'ready'), dialog]),
                          seconds, 'it did not load');
    } catch (err) {
      return message(err);
    } finally {
      looking = false;
    }
  };
  // Record every dialog and dismiss it (Discard rather than Save, Cancel rather than Ok);
  // dismissing one can raise the next, so look until none is left.
  const dismissDialogs = async () => {
    const seen = [];
    for (let round = 0; round < 6; round++) {
      await pause(round === 0 ? 1500 : 800);  // a late dialog shows by now
      const shown = Array.from(document.querySelectorAll('.jp-Dialog'));
      if (!shown.length && round > 0) break;
      for (const dialog of shown) {
        seen.push(dialog.innerText);
        const button = dialog.querySelector('.jp-mod-warn')
          || dialog.querySelector('.jp-mod-reject') || dialog.querySelector('.jp-mod-accept');
        if (button) button.click();
      }
    }
    return seen;
  };
  // Close the document and shut every kernel down; what went wrong, or null.
  const close = async widget => {
    if (widget && !widget.isDisposed) widget.dispose();
    try {
      await within(app.serviceManager.sessions.shutdownAll(), 60, 'the kernels did not shut down');
      return null;
    } catch (err) {
      return message(err);
    }
  };
  const findDocument = path => Array.from(app.shell.widgets('main'))
    .find(w => w.context && w.context.path === path) || null;
"""


def script(params: str, body: str) -> str:
    return f"async ({params}) => {{{JS_HELPERS}{body}}}"


# The document the reader's first page opened (the file given to `jupyter lab`); then close
# everything, so that each test starts from an empty JupyterLab.
FIRST_DOCUMENT = script("seconds", """
  let path = null, problem = null;
  try {
    await within(app.restored, seconds, 'JupyterLab did not start');
    const start = Date.now();
    let widget = null;
    while (!widget && Date.now() - start < seconds * 1000) {
      widget = Array.from(app.shell.widgets('main')).find(w => w.context) || null;
      if (!widget) await pause(250);
    }
    if (!widget) throw new Error(`no document opened within ${seconds} s`);
    path = widget.context.path;
    const state = await loaded(widget, seconds);
    if (state !== 'ready') problem = state;
  } catch (err) {
    problem = message(err);
  }
  const dialogs = await dismissDialogs();
  if (dialogs.length) {
    problem = (problem ? problem + '; ' : '') + 'a dialog: ' + dialogs.join(' | ');
  }
  for (const widget of Array.from(app.shell.widgets('main'))) widget.dispose();
  const closing = await close(null);
  return {path, problem: problem || closing};
""")

OPEN = script("[path, factory]", """
  let widget = null, outcome;
  try {
    widget = await open(path, factory);
    outcome = await loaded(widget);
  } catch (err) {
    outcome = message(err);
  }
  const cells = widget && !widget.isDisposed && widget.content && widget.content.widgets
    ? widget.content.widgets.length : 0;
  const dialogs = await dismissDialogs();
  const closing = await close(widget);
  return {outcome, dialogs, cells, closing};
""")


def open_problems(lab: Lab, path: str) -> list[str]:
    """Open one file of a pair as a notebook; what a reader would meet instead of it."""
    where = served_path(lab, path)
    if where is None:
        return [outside(lab, path)]
    factory = "Notebook" if path.endswith(".ipynb") else "Jupytext Notebook"
    seen = lab.page.evaluate(OPEN, [where, factory])
    problems = [f"{path}: a dialog appeared: {' '.join(d.split())}" for d in seen["dialogs"]]
    if seen["outcome"] != "ready":
        problems.append(f"{path}: the notebook did not load ({seen['outcome']})")
    elif seen["cells"] == 0:
        problems.append(f"{path}: opened with no cells")
    if seen["closing"]:
        problems.append(f"{path}: {seen['closing']}")
    return problems


RUN_ALL_MINUTES = 10  # a chapter takes at most 3 minutes on the slowest machine supported
RUN_ALL_AND_SAVE = script("[path, minutes]", """
  let widget = null, outcome = 'done';
  try {
    widget = await open(path, 'Notebook');
    const state = await loaded(widget);
    if (state !== 'ready') throw new Error(state);
    await within(widget.sessionContext.ready, 120, 'its kernel did not start');
    app.shell.activateById(widget.id);
    await within(app.commands.execute('notebook:run-all-cells'),  // Run > Run All Cells
                 minutes * 60, `Run All did not finish within ${minutes} minutes`);
    await within(app.commands.execute('docmanager:save'), 60,     // File > Save Notebook
                 'saving it did not finish');
  } catch (err) {
    outcome = message(err);
  }
  const dialogs = await dismissDialogs();
  const closing = await close(widget);
  return {outcome, dialogs, closing};
""")


def run_all_problems(lab: Lab, name: str) -> list[str]:
    """Run All and save in JupyterLab, then read the saved notebook back from disk."""
    path = f"nbs/{name}.ipynb"
    where = served_path(lab, path)
    if where is None:
        return [outside(lab, path)]
    seen = lab.page.evaluate(RUN_ALL_AND_SAVE, [where, RUN_ALL_MINUTES])
    problems = [f"{path}: a dialog appeared: {' '.join(d.split())}" for d in seen["dialogs"]]
    if seen["outcome"] != "done":
        problems.append(f"{path}: {seen['outcome']}")
    if seen["closing"]:
        problems.append(f"{path}: {seen['closing']}")
    nb = json.loads((lab.root / path).read_text())
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


# Open a file as a notebook and put the cursor at the end of its first code cell that is not
# an export cell (no `#|` directive: the edit must not change what minixl exports).
PREPARE_EDIT = script("[path, factory]", """
  try {
    const widget = await open(path, factory);
    const state = await loaded(widget);
    if (state !== 'ready') return {problem: state};
    app.shell.activateById(widget.id);
    const notebook = widget.content;
    const index = notebook.widgets.findIndex(cell => {
      const source = cell.model.sharedModel.getSource();
      return cell.model.type === 'code' && source.trim() && !/^#\\s*\\|/.test(source);
    });
    if (index < 0) return {problem: 'no code cell other than export cells'};
    notebook.activeCellIndex = index;
    await within(notebook.scrollToItem(index, 'center'), 30, `cell ${index} did not show`);
    const cell = notebook.widgets[index];
    await within(cell.ready, 30, `cell ${index} did not render`);
    notebook.mode = 'edit';
    const editor = cell.editor;
    editor.setCursorPosition(editor.getPositionAt(editor.model.sharedModel.getSource().length));
    editor.focus();
    return {index};
  } catch (err) {
    return {problem: message(err)};
  }
""")

# Check that the typed line reached the cell, save with File > Save, close.
SAVE_EDIT = script("[path, note, index]", """
  const widget = findDocument(path);
  const problems = [];
  if (!widget) {
    problems.push('the document is no longer open');
  } else if (index >= 0) {
    const source = widget.content.widgets[index].model.sharedModel.getSource();
    if (!source.includes(note)) {
      problems.push(`the line typed into cell ${index} is not in it: ` +
                    `it ends ${JSON.stringify(source.slice(-120))}`);
    } else {
      try {
        app.shell.activateById(widget.id);
        await within(app.commands.execute('docmanager:save'), 60, 'saving did not finish');
        if (widget.context.model.dirty) problems.push('unsaved changes are left after the save');
      } catch (err) {
        problems.push(message(err));
      }
    }
  }
  const dialogs = await dismissDialogs();
  const closing = await close(widget);
  if (closing) problems.push(closing);
  return {problems, dialogs};
""")


def edit_and_save_problems(lab: Lab, path: str, note: str) -> list[str]:
    """As a reader: open `path` as a notebook, type `note` as a new last line of a code cell
    that is not an export cell, and save (File > Save)."""
    where = served_path(lab, path)
    if where is None:
        return [outside(lab, path)]
    factory = "Notebook" if path.endswith(".ipynb") else "Jupytext Notebook"
    ready = lab.page.evaluate(PREPARE_EDIT, [where, factory])
    if "problem" not in ready:
        lab.page.keyboard.press("Enter")
        lab.page.keyboard.type(note)
    seen = lab.page.evaluate(SAVE_EDIT, [where, note, ready.get("index", -1)])
    problems = [f"{path}: {ready['problem']}"] if "problem" in ready else []
    problems += [f"{path}: {p}" for p in seen["problems"]]
    return problems + [f"{path}: a dialog appeared: {' '.join(d.split())}"
                       for d in seen["dialogs"]]


def refused_at_the_root(root: Path, paths: list[str]) -> list[str]:
    """What a JupyterLab serving the repository root says of these files, asked of its
    jupytext contents manager directly, whichever folder the server under test serves."""
    try:
        from jupytext.sync_contentsmanager import TextFileContentsManager
    except ImportError:  # jupytext before 1.17
        from jupytext.contentsmanager import TextFileContentsManager

    manager, problems = TextFileContentsManager(root_dir=str(root)), []
    for path in paths:
        try:
            manager.get(path, content=True)
        except Exception as err:  # tornado's HTTPError, with jupytext's reason
            problems.append(f"{path}: a JupyterLab serving the repository root refuses it: "
                            f"{' '.join(str(err).split())[:400]}")
    return problems


def pair_problems(lab: Lab, name: str, note: str | None = None) -> list[str]:
    """After a save in JupyterLab: both sides have `note` (if given), `tools.book check` passes
    in the copy, and both sides open, at the repository root and in the browser."""
    sides = [f"book/{name}.md", f"nbs/{name}.ipynb"]
    problems = []
    if note:
        problems += [f"{side} does not have the line saved from JupyterLab ({note!r}): "
                     "saving one side of the pair did not update the other"
                     for side in sides if note not in (lab.root / side).read_text()]
    checked = book_check(lab.root)
    if checked.returncode:
        before = ("It passed before the tests changed anything." if lab.check_before.returncode
                  == 0 else "It failed already before the tests changed anything: run `make "
                  "check` in the repository first.")
        problems.append(f"`python -m tools.book check` fails in the copy after the save:\n"
                        f"{checked.stderr.strip()}\n{before}")
    problems += refused_at_the_root(lab.root, sides)
    for side in sides:
        problems += open_problems(lab, side)
    return problems


def make_broken_pairs(root: Path) -> list[Path]:
    """Two pairs a reader must never meet: a notebook edited behind its text file's back, and
    a chapter that raises. Returns their files."""
    jupytext = [str(VENV / "bin" / "jupytext")]
    for name, cell in ((OUT_OF_SYNC, "print('only in the notebook')"),
                       (RAISES, "raise RuntimeError('a chapter that raises')")):
        md = root / "book" / f"{name}.md"
        md.write_text((root / "book" / "00_preface.md").read_text().split("## Who it is for")[0]
                      + ("```{code-cell} ipython3\n" + cell + "\n```\n"
                         if name == RAISES else ""))
        subprocess.run(jupytext + ["--quiet", "--sync", str(md)], check=True, timeout=120)
    nb_path = root / "nbs" / f"{OUT_OF_SYNC}.ipynb"
    nb = json.loads(nb_path.read_text())
    nb["cells"].append({"cell_type": "code", "execution_count": None, "id": "behind-its-back",
                        "metadata": {}, "outputs": [], "source": ["print('edited')"]})
    nb_path.write_text(json.dumps(nb, indent=1))
    later = time.time() + 60
    os.utime(nb_path, (later, later))  # the notebook is newer than its text file
    return [root / side / f"{name}{ext}" for name in (OUT_OF_SYNC, RAISES)
            for side, ext in (("book", ".md"), ("nbs", ".ipynb"))]


def a_note() -> str:
    """A line a reader adds to a code cell, unique to one test."""
    return f"# a note from the reader, minixl-{uuid.uuid4().hex[:12]}"


def test_make_lab_serves_the_repository_root_and_opens_the_preface(lab):
    assert lab.served == lab.root.resolve(), (
        f"`make lab` serves {lab.served}, not the repository root {lab.root}: jupytext cannot "
        "reach both sides of each pair, so a save updates one side only")
    assert lab.first == {"path": "nbs/00_preface.ipynb", "problem": None}, lab.first


def test_every_chapter_opens_in_jupyterlab_as_notebook_and_as_text(lab):
    problems = []
    for name in CHAPTERS:
        for path in (f"nbs/{name}.ipynb", f"book/{name}.md"):
            problems += open_problems(lab, path)
    assert not problems, "\n".join(problems)


@pytest.mark.parametrize("path", [f"nbs/{EDITED}.ipynb", f"book/{EDITED}.md"],
                         ids=["from_the_notebook", "from_the_text"])
def test_a_cell_edited_and_saved_in_jupyterlab_updates_both_sides(lab, path):
    note = a_note()
    problems = edit_and_save_problems(lab, path, note)
    problems += pair_problems(lab, EDITED, note)
    assert not problems, "\n".join(problems)


@pytest.mark.parametrize("name", RUN_ALL)
def test_run_all_in_jupyterlab_then_save(lab, name):
    problems = run_all_problems(lab, name)
    problems += pair_problems(lab, name)  # still in step, and both sides open
    assert not problems, "\n".join(problems)


def test_the_lab_checks_catch_an_out_of_sync_pair_and_a_chapter_that_raises(lab):
    made = make_broken_pairs(lab.root)
    try:
        problems = open_problems(lab, f"nbs/{OUT_OF_SYNC}.ipynb")
        assert any("dialog" in p and "more recent" in p for p in problems), problems
        assert open_problems(lab, f"nbs/{RAISES}.ipynb") == []  # it opens fine ...
        problems = run_all_problems(lab, RAISES)  # ... and fails when run
        assert any("raised RuntimeError: a chapter that raises" in p for p in problems), problems
    finally:
        for path in made:  # `tools.book check` in the copy is for the real chapters
            path.unlink(missing_ok=True)


def test_the_sync_checks_catch_make_lab_serving_nbs_alone(browser):
    """The negative control: `make lab` with the lab rule as it was (the preface as its only
    argument, so Jupyter served nbs/). A save in JupyterLab writes the notebook alone, and
    the checks above say so."""
    with repository_copy() as root:
        makefile = root / "Makefile"
        rule = makefile.read_text()
        old = re.sub(r"^(lab:.*\n).*$", lambda m: m.group(1) + OLD_LAB_RECIPE, rule, count=1,
                     flags=re.M)
        assert old != rule, "no lab rule found in the Makefile"
        makefile.write_text(old)
        with make_lab(browser, root) as old_lab:
            assert old_lab.served == (root / "nbs").resolve(), old_lab.served
            note = a_note()
            problems = edit_and_save_problems(old_lab, f"nbs/{EDITED}.ipynb", note)
            assert not problems, problems  # the save itself works ...
            report = "\n".join(pair_problems(old_lab, EDITED, note))  # ... for one side only
    assert f"book/{EDITED}.md does not have the line saved" in report, report
    assert f"book/{EDITED}.md and nbs/{EDITED}.ipynb differ" in report, report
    assert "refuses it" in report and "more recent than" in report, report
    assert f"book/{EDITED}.md: outside the folder that `make lab` serves" in report, report
