"""Helpers shared by the conformance tests (a unique module name, so it never clashes
with another test folder's conftest when the whole suite runs)."""

from __future__ import annotations

import shutil

import pytest

from kvgrant.conformance.mutants import make_header
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
