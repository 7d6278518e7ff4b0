"""Mutation self-test: every trace mutant is rejected exactly where its bug is, by the
Python engine and (tlc mark) by TLC, at the same index."""

from __future__ import annotations

import pytest

from kvgrant.conformance.mutants import (MUTATIONS, make_header, mutants, mutation_score,
                                         reference_trace)
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
        expected = set(MUTATIONS)
        if "two-ranks" in label:  # everyone imports everyone: no non-importer to grant
            expected.discard("grant_non_importer")
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
        "skip_release", "duplicate_event", "reorder_steps"])


@pytest.mark.tlc
def test_tlc_rejects_the_same_mutants_at_the_same_index(java) -> None:
    h = small_header()
    trace = reference_trace(h, source="small/shutdown")
    cases = mutants(trace) + mutants(reference_trace(h, fail_at=9, source="small/abort"),
                                     ["reorder_steps", "unmap_backing_first", "skip_release"])
    py = [replay(m.trace) for m in cases]
    tlc = check_traces_tlc([m.trace for m in cases], jobs=2)
    assert mutation_score(cases, tlc).killed == len(cases), mutation_score(cases, tlc).misses
    for m, a, b in zip(cases, py, tlc):
        assert (a.accepted, a.index) == (b.accepted, b.index), m.name
        assert a.state_before == b.state_before, m.name
        assert a.enabled == b.enabled, m.name
