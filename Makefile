# kvgrant developer entry points. Everything runs from a local virtualenv that the
# first target creates, so a fresh machine needs only python3 (with venv) and Java.
PY      ?= python3
VENV    ?= .venv
BIN     := $(VENV)/bin
STAMP   := $(VENV)/.installed
GEOMETRY ?= examples/published-dcp8.json
OUTDIR  ?= out

.PHONY: demo test test-tlc fuzz verify bench clean

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

## The test suite without the TLC-heavy tests: the CPU tests in worker processes (one per
## CPU, at most 8; pytest-xdist), then the GPU tests one at a time (they skip themselves
## without a GPU; run at once they would see each other's memory).
test: $(STAMP)
	$(BIN)/python -m pytest -q -m "not tlc and not gpu and not gpu2" -n auto --maxprocesses 8
	$(BIN)/python -m pytest -q -m "(gpu or gpu2) and not tlc"

## The issue #16 fuzz at full volume: KVGRANT_FUZZ_SCALE=8 runs 8x the default examples
## (over 10,000 generated bad inputs: geometries, traces, flags, argument types), in
## process under a memory cap and a hang limit, plus a sample as real processes.
## The counts of cases that really ran go to $(OUTDIR)/fuzz-counts.json.
FUZZ_SCALE ?= 8
fuzz: $(STAMP)
	mkdir -p $(OUTDIR)
	rm -f $(OUTDIR)/fuzz-counts.json
	KVGRANT_FUZZ_SCALE=$(FUZZ_SCALE) KVGRANT_FUZZ_REPORT=$(abspath $(OUTDIR))/fuzz-counts.json \
		$(BIN)/python -m pytest -q tests/fuzz tests/conformance/test_tlc_cleanup.py
	@$(BIN)/python -c "import json,sys; c=json.load(open('$(OUTDIR)/fuzz-counts.json')); \
		[print(f'{v:>7,}  {k}') for k,v in sorted(c.items())]; print(f'{sum(c.values()):>7,}  in all')"

## The tests that run TLC: spec and trace mutants, the TLC trace engine on real traces,
## the drift guard, TLC's clean-up on signals. CI runs them after `make test`.
test-tlc: $(STAMP)
	$(BIN)/python -m pytest -q -m tlc

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
