# fixed-embed: every command of the README. `make help` lists them.
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed

GPUS      ?= 2
NODES     ?= 1
STRATEGY  ?= ddp
ARGS      ?=

.PHONY: help install test lint bench bench-core

help:
	@grep -E '^[a-z0-9-]+:.*## ' $(MAKEFILE_LIST) | sed 's/:.*## /\t/'

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	# torch first, pinned: the CPU wheel cached on the dev machines (a newer one pulls CUDA builds).
	$(BIN)/pip install --quiet torch==2.13.0
	$(BIN)/pip install --quiet -e '.[dev]'
	touch $(STAMP)

install: $(STAMP) ## create .venv with the project and its dev extras (idempotent)

test: install ## run the test suite (CPU, offline)
	$(BIN)/python -m pytest -q -ra

lint: install ## byte-compile and check every module imports
	$(BIN)/python -m compileall -q fixed_embed callbacks tests benchmarks

bench-core: install ## input-layer forward+backward time and training-state bytes per interface
	$(BIN)/python benchmarks/input_layer.py

bench: bench-core ## every CPU benchmark
