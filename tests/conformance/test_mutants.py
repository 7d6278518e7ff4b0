"""Mutation self-test: every trace mutant is rejected exactly where its bug is, by the
Python engine and (tlc mark) by TLC, at the same index."""

from __future__ import annotations

import re

import pytest

from kvgrant.conformance.mutants import (MUTATIONS, OBJECT_MUTATIONS, make_header, mutants,
                                         mutation_score, reference_trace)
from kvgrant.conformance.replay import replay
from kvgrant.conformance.tla_trace import check_traces_tlc

from _conform_support import small_header

HEADERS = {
    "small": small_header(),
    "two-ranks-all-import": make_header(2, 3, aliased=[0, 2], importers={0: [1], 1: [0]}),
    "dcp-like": make_header(4, 2, aliased=[1], owner_only=[],
                            importers={0: [1], 1: [0], 2: [3], 3: [2]},
                            declared_readers={r: [0, 1, 2, 3] for r in range(4)}),
}


def _traces():
    for name, h in HEADERS.items():
        yield f"{name}/shutdown", reference_trace(h, source=f"{name}/shutdown")
        yield f"{name}/abort", reference_trace(h, fail_at=4, source=f"{name}/abort")


@pytest.mark.parametrize("label, trace", list(_traces()), ids=[x for x, _ in _traces()])
def test_every_mutant_is_rejected_at_its_index(label, trace) -> None:
    assert replay(trace).accepted
    cases = mutants(trace)
    names = {m.name for m in cases}
    if label.endswith("shutdown"):
        expected = set(MUTATIONS) | set(OBJECT_MUTATIONS)
        if "two-ranks" in label:  # everyone imports everyone: no non-importer to grant
            expected -= {"grant_non_importer", "header_forged_importer"}
        assert names == expected
    verdicts = [replay(m.trace) for m in cases]
    score = mutation_score(cases, verdicts)
    assert score.killed == score.total, score.misses
    for m, v in zip(cases, verdicts):
        assert v.event is not None and v.event.index == m.expected_index


def test_score_counts_misses() -> None:
    t = reference_trace(small_header())
    cases = mutants(t)
    accepted = [replay(t)] * len(cases)  # pretend an engine accepts everything
    s = mutation_score(cases, accepted)
    assert s.killed == 0 and s.total == len(cases) and len(s.misses) == len(cases)
    assert s.score == 0.0


def test_mutation_catalogue_is_complete() -> None:
    assert sorted(MUTATIONS) == sorted([
        "drop_grant", "grant_non_importer", "publish_early", "unmap_backing_first",
        "skip_release", "duplicate_event", "reorder_steps", "complete_after_failed_undo"])
    # issue #14: at least 20 trace mutants, at least half of them object-identity ones
    assert len(MUTATIONS) + len(OBJECT_MUTATIONS) >= 20
    assert len(OBJECT_MUTATIONS) >= len(MUTATIONS)


_NAMES_RANK = re.compile(r"\b(rank \d+|r\d+)\b")
_NAMES_OBJECT = re.compile(r"(alloc \d+|\ba\d+\b|handle \d+|va \[0x|reservation)")


def names_object(v) -> bool:
    """The verdict names the rank and the object (alloc, handle, VA range)."""
    text = v.summary()
    return bool(_NAMES_RANK.search(text) and _NAMES_OBJECT.search(text))


def test_object_mutants_are_rejected_naming_the_object() -> None:
    t = reference_trace(small_header(), source="small/shutdown")
    cases = mutants(t, list(OBJECT_MUTATIONS))
    assert {m.name for m in cases} == set(OBJECT_MUTATIONS)
    for m in cases:
        v = replay(m.trace)
        assert not v.accepted and v.index == m.expected_index, m.name
        assert names_object(v), (m.name, v.summary())


def test_model_only_header_needs_import_groups() -> None:
    """Asymmetric importers cannot come from a geometry: such constants give a
    model-only (version 1) header, without a plan, and no object mutants."""
    h = make_header(2, 1, importers={0: [1], 1: []})
    assert h.layout is None and h.version == 1
    t = reference_trace(h)
    assert replay(t).accepted
    assert {m.name for m in mutants(t)} <= set(MUTATIONS)


@pytest.mark.tlc
def test_tlc_rejects_the_same_mutants_at_the_same_index(java) -> None:
    h = small_header()
    trace = reference_trace(h, source="small/shutdown")
    cases = mutants(trace) + mutants(reference_trace(h, fail_at=9, source="small/abort"),
                                     ["reorder_steps", "unmap_backing_first", "skip_release"])
    py = [replay(m.trace) for m in cases]
    tlc = check_traces_tlc([m.trace for m in cases], jobs=2)
    assert mutation_score(cases, tlc).killed == len(cases), mutation_score(cases, tlc).misses
    assert {m.name for m in cases} >= set(OBJECT_MUTATIONS)
    for m, a, b in zip(cases, py, tlc):
        assert (a.accepted, a.index) == (b.accepted, b.index), m.name
        assert a.state_before == b.state_before, m.name
        assert a.enabled == b.enabled, m.name
        if m.name in OBJECT_MUTATIONS:
            assert names_object(b), (m.name, b.summary())
