"""Fixtures for the conformance tests: small model constants and a TLC (Java) gate."""

from __future__ import annotations

import pytest

from _conform_support import needs_java, small_header
from kvgrant.conformance.trace_io import Header


@pytest.fixture
def header() -> Header:
    return small_header()


@pytest.fixture
def java() -> None:
    needs_java()
