# minixl: every target sets up its own virtual environment (.venv) from this
# repo's files and reuses it when present.
#   make lab     open the book in JupyterLab
#   make test    every check: pairs in sync, library up to date, pytest, and
#                notebooks match their stored outputs within their time budget
#   make train   train a small model on the default corpus on the CPU
#   make run     execute every chapter in place (refresh stored outputs)
#   make export  write the minixl modules from the chapters' export cells
#   make sync    bring each book/*.md and nbs/*.ipynb pair in step

PYTHON ?= python3
VENV ?= .venv
TORCH_VERSION ?= 2.13.0
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
ROOT_FLAG := $(shell [ "$$(id -u)" = 0 ] && echo --allow-root)
NBVAL := --nbval --nbval-current-env --nbval-sanitize-with .ci/nbval_sanitize.cfg
# `make run` stores outputs with the CPU's vectorised kernels and all its threads; `make
# test` compares them on one thread with the portable kernels, so that a stored output
# that depends on floating-point rounding fails here, not on a reader's machine.
PORTABLE := ATEN_CPU_CAPABILITY=default OMP_NUM_THREADS=1 MKL_NUM_THREADS=1

.PHONY: setup lab test check train run export sync clean

setup: $(STAMP)

$(STAMP): pyproject.toml Makefile
	@$(PYTHON) -c 'import sys; sys.exit(0 if sys.version_info >= (3, 10) else "minixl needs Python 3.10 or newer; found " + sys.version.split()[0] + ". Set PYTHON=/path/to/python3.x")'
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet "torch==$(TORCH_VERSION)"
	$(PY) -m pip install --quiet -e ".[book,dev]"
	touch $@

lab: $(STAMP)
	$(VENV)/bin/jupyter lab $(ROOT_FLAG) nbs/00_preface.ipynb

check: $(STAMP)
	$(PY) minixl/_book.py check

test: check
	$(PY) -m pytest -q tests
	$(PORTABLE) $(PY) -m pytest -q $(NBVAL) nbs

train: $(STAMP)
	$(PY) -m minixl train --preset tiny --corpus pydoc --out runs/tiny --overwrite

run: $(STAMP)
	$(PY) minixl/_book.py run

export: $(STAMP)
	$(PY) minixl/_book.py export

sync: $(STAMP)
	$(VENV)/bin/jupytext --sync book/*.md

clean:
	rm -rf $(VENV) runs .pytest_cache
