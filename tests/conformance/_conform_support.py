"""Helpers shared by the conformance tests (a unique module name, so it never clashes
with another test folder's conftest when the whole suite runs)."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from kvgrant.conformance.mutants import make_header
from kvgrant.conformance.replay import replay
from kvgrant.conformance.trace_io import load_trace
from kvgrant.conformance.trace_io import Header


def small_header() -> Header:
    """3 ranks: 0 and 1 import each other, 2 imports nothing but is declared a reader;
    4 allocations, 1 and 3 aliased, 3 owner-only (like tests/runtime/_small.py)."""
    return make_header(3, 4, aliased=[1, 3], owner_only=[3],
                       importers={0: [1], 1: [0], 2: []},
                       declared_readers={0: [0, 1, 2], 1: [0, 1, 2], 2: [2]})


def needs_java() -> None:
    if shutil.which("java") is None:
        pytest.skip("TLC needs Java (java is not on PATH)")


def record_small_trace(tmp_path: Path, *extra: str) -> list[str]:
    """A fresh sim trace of examples/small.json (3 ranks: 0 and 1 import each other, 2 is
    a declared reader of rank 0 that imports nothing), as lines in the writer's format;
    ``extra`` are more ``kvgrant alloc`` arguments (``--fail-at K``)."""
    from kvgrant.cli import main

    path = tmp_path / "t.ndjson"
    small = Path(__file__).resolve().parents[2] / "examples" / "small.json"
    assert main(["alloc", str(small), "--backend", "sim", "--trace", str(path),
                 *extra]) in (0, 1)
    lines = path.read_text().splitlines()
    assert replay(load_trace(path)).accepted
    return lines
