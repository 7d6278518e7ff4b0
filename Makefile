# kvgrant developer entry points. Everything runs from a local virtualenv that the
# first target creates, so a fresh machine needs only python3 (with venv) and Java.
PY      ?= python3
VENV    ?= .venv
BIN     := $(VENV)/bin
STAMP   := $(VENV)/.installed
GEOMETRY ?= examples/published-dcp8.json
OUTDIR  ?= out

.PHONY: demo test verify bench clean

$(STAMP): pyproject.toml constraints.txt
	$(PY) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q -c constraints.txt -e '.[test]'
	touch $(STAMP)

## The main job: plan the published-scale cache, allocate it (CUDA when a GPU is
## usable, else the simulated driver), trace it and check the trace against the model.
demo: $(STAMP)
	mkdir -p $(OUTDIR)
	$(BIN)/kvgrant plan $(GEOMETRY)
	$(BIN)/kvgrant alloc $(GEOMETRY) --trace $(OUTDIR)/alloc-trace.ndjson
	$(BIN)/kvgrant conform $(OUTDIR)/alloc-trace.ndjson --engine python

## The test suite (GPU tests skip themselves without a GPU; TLC tests need Java).
test: $(STAMP)
	$(BIN)/python -m pytest -q

## Model-check every spec config with TLC and print a table. It runs the specs as a user
## gets them: kvgrant built as a wheel, installed (not editable) into its own venv, and
## `kvgrant verify` started from an empty directory.
WHEELVENV ?= .venv-wheel
verify: $(STAMP)
	rm -rf build/wheel $(WHEELVENV)
	$(BIN)/python -m pip wheel -q --no-deps -w build/wheel .
	$(PY) -m venv $(WHEELVENV)
	$(WHEELVENV)/bin/python -m pip install -q -c constraints.txt build/wheel/kvgrant-*.whl
	d="$$(mktemp -d)" && cd "$$d" && "$(CURDIR)/$(WHEELVENV)/bin/kvgrant" verify; \
	    rc=$$?; rm -rf "$$d"; exit $$rc

bench: $(STAMP)
	$(BIN)/python benchmarks/bench_plan.py

clean:
	rm -rf $(VENV) $(WHEELVENV) build $(OUTDIR) .pytest_cache .hypothesis
