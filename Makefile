# minixl: every target sets up its own virtual environment (.venv) from this
# repo's files and reuses it when present. `make help` lists the targets.

PYTHON ?= python3
VENV ?= .venv
TORCH_VERSION ?= 2.13.0
# Where pip finds torch (empty: pip's default, which on Linux is the CUDA build, about 5 GB
# more). A machine without an NVIDIA GPU: make lab TORCH_INDEX=https://download.pytorch.org/whl/cpu
TORCH_INDEX ?=
PY := $(VENV)/bin/python
# Two installs into one .venv: reading (torch, the library, JupyterLab with jupytext: what
# `make lab` and `make train` need) and, on top of it, testing (pytest, nbval, transformers
# for Chapter 5's comparison, Jupyter Book and Playwright for the site).
STAMP := $(VENV)/.installed
DEV_STAMP := $(VENV)/.installed-dev
ROOT_FLAG := $(shell [ "$$(id -u)" = 0 ] && echo --allow-root)
NBVAL := --nbval --nbval-current-env --nbval-sanitize-with .ci/nbval_sanitize.cfg
# `make run` stores outputs with the CPU's vectorised kernels and all its threads; `make
# test` compares them on one thread with the portable kernels, so that a stored output
# that depends on floating-point rounding fails here, not on a reader's machine.
PORTABLE := ATEN_CPU_CAPABILITY=default OMP_NUM_THREADS=1 MKL_NUM_THREADS=1

# The browser that `make test-browser` drives (any Chromium or Chrome). When it is missing
# on a Debian or Ubuntu machine, the target installs Debian's chromium package.
CHROMIUM ?= /usr/bin/chromium
SUDO := $(shell [ "$$(id -u)" = 0 ] || echo sudo -n)

.PHONY: help setup setup-dev lab test test-fast check html test-browser train run export sync clean mutate

help: ## list the targets
	@awk 'BEGIN { FS = ":.*## " } /^[a-z-]+:.*## / { printf "  make %-15s %s\n", $$1, $$2 }' $(MAKEFILE_LIST)

setup: $(STAMP) ## create .venv for reading: torch, minixl, JupyterLab (lab, train, sync do it first)

setup-dev: $(DEV_STAMP) ## add the test and site tools to .venv (test, check, run, html do it first)

$(STAMP): pyproject.toml Makefile
	@$(PYTHON) -c 'import sys; sys.exit(0 if sys.version_info >= (3, 10) else "minixl needs Python 3.10 or newer; found " + sys.version.split()[0] + ". Set PYTHON=/path/to/python3.x")'
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet "torch==$(TORCH_VERSION)" $(if $(TORCH_INDEX),--index-url $(TORCH_INDEX))
	$(PY) -m pip install --quiet -e ".[book]"
	touch $@

$(DEV_STAMP): $(STAMP)
	$(PY) -m pip install --quiet -e ".[book,dev,site]"
	touch $@

# Served from the repository root, so that jupytext reaches both sides of each pair and
# saving either one updates the other. (Given only a file, Jupyter would serve the file's
# folder, nbs/, and save notebooks without their text files.) LAB_ARGS: more jupyter lab
# options, e.g. make lab LAB_ARGS="--no-browser --port=8890".
LAB_ARGS ?=
lab: $(STAMP) ## open the book in JupyterLab
	$(VENV)/bin/jupyter lab $(ROOT_FLAG) --ServerApp.root_dir=. $(LAB_ARGS) nbs/00_preface.ipynb

check: $(DEV_STAMP) ## pairs in sync, minixl up to date with the chapters, quoted numbers as stored
	$(PY) -m tools.book check

# The tests run in TEST_WORKERS processes (pytest-xdist; most slow tests wait on
# subprocesses, so two share two cores well: 20 -> 14 minutes here); the notebooks run
# alone, one after another, as their time budget assumes.
TEST_WORKERS ?= 2
test: check ## every check: pytest, and notebooks match their stored outputs in budget
	$(PY) -m pytest -q -n $(TEST_WORKERS) tests
	$(PORTABLE) $(PY) -m pytest -q $(NBVAL) nbs

test-fast: $(DEV_STAMP) ## the quick loop: pytest without the slow tier (about 90 s on two cores)
	$(PY) -m pytest -q -m "not slow" --durations=5 tests

html: check ## the book as a website in _build/html (stored outputs, offline)
	$(PY) -m tools.book.site --out _build/html

test-browser: html ## JupyterLab and the website in headless Chromium (Playwright)
	@if [ ! -x "$(CHROMIUM)" ]; then \
	  if command -v apt-get >/dev/null; then \
	    echo "test-browser: no browser at $(CHROMIUM); installing Debian's chromium package with apt-get (set CHROMIUM=/path/to/chrome to use another)"; \
	    $(SUDO) apt-get update -qq && $(SUDO) env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null; \
	  fi; \
	  if [ ! -x "$(CHROMIUM)" ]; then \
	    echo "test-browser: no browser at $(CHROMIUM); install Chromium or Chrome and run make test-browser CHROMIUM=/path/to/it" >&2; exit 1; \
	  fi; \
	fi
	MINIXL_CHROMIUM="$(CHROMIUM)" $(PY) -m pytest -q --browser tests/test_browser.py

train: $(STAMP) ## train a small model on the default corpus on the CPU
	$(PY) -m minixl train --preset tiny --corpus pydoc --out runs/tiny --overwrite

run: $(DEV_STAMP) ## execute every chapter in place (refresh stored outputs)
	$(PY) -m tools.book run

export: $(STAMP) ## write the minixl modules from the chapters' export cells
	$(PY) -m tools.book export

sync: $(STAMP) ## bring each book/*.md and nbs/*.ipynb pair in step
	$(VENV)/bin/jupytext --sync book/*.md

clean: ## remove .venv, runs/ and the built site
	rm -rf $(VENV) runs .pytest_cache _build

# Not part of `make test`: about ten minutes here, one mutant at a time in a copy of the repo.
mutate: $(DEV_STAMP) ## the mutation run over minixl's core: score and survivors in tests/MUTATION.md
	$(PY) -m tools.mutate
