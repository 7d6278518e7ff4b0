"""Drift guard (tlc mark): TLC's full state graph of a small config equals the Python
model's, every enumerated behaviour replays as an accepted trace, and both engines
reject the same mutants of those behaviours at the same index."""

from __future__ import annotations

import pytest

from kvgrant.conformance import model
from kvgrant.conformance.drift import (behaviours, check_drift, compare_graph,
                                       dump_state_graph, trace_of_path)
from kvgrant.conformance.mutants import make_header, mutants, mutation_score
from kvgrant.conformance.replay import replay
from kvgrant.conformance.tla_trace import check_traces_tlc

from _conform_support import needs_java

pytestmark = pytest.mark.tlc

# 2 ranks, 2 allocations: 0 plain, 1 aliased into an owner-only region; rank 0 is
# imported by rank 1, rank 1 by nobody; both declare both ranks as readers.
HEADER = make_header(2, 2, aliased=[1], owner_only=[1], importers={0: [1], 1: []},
                     declared_readers={0: [0, 1], 1: [0, 1]})


@pytest.fixture(scope="module")
def graph():
    needs_java()
    return dump_state_graph(HEADER)


def test_python_model_equals_tlc_state_graph(graph) -> None:
    report = check_drift(HEADER, graph=graph, paths=150, seed=7)
    assert report.problems == []
    assert report.states == report.python_states == len(graph.states)
    assert report.states > 1000 and report.edges > report.states
    phases = {s.phase for s in graph.states.values()}
    assert phases == {"Allocating", "Published", "Aborting", "Aborted", "ShuttingDown",
                      "Shutdown"}
    assert report.traces >= 150 and report.rejected == []


def test_drift_guard_catches_a_changed_guard(graph, monkeypatch) -> None:
    real = model._driver_guard

    def sloppy(c, s, act, name):  # MapAlias without its backing: a drifted model
        if name == "MapAlias" and act.rank is not None and act.alloc is not None:
            rs = s.ranks[act.rank]
            return (s.phase == "Allocating" and not rs.failed and act.alloc in c.aliased
                    and act.alloc in rs.created and act.alloc not in rs.alias_mapped)
        return real(c, s, act, name)

    monkeypatch.setattr(model, "_driver_guard", sloppy)
    problems = compare_graph(graph)
    assert problems and "only Python allows ['MapAlias']" in problems[0]


def test_both_engines_reject_behaviour_mutants_at_the_same_index(graph) -> None:
    paths = behaviours(graph, 0)  # the shortest behaviour to each terminal phase
    traces = [trace_of_path(HEADER, graph, p, f"<shortest {i}>") for i, p in enumerate(paths)]
    assert {t.events[-1].state["phase"] for t in traces} == {"Published", "Aborted",
                                                              "Shutdown"}
    cases = [m for t in traces for m in mutants(t)]
    assert len(cases) >= 8
    py = [replay(m.trace) for m in cases]
    tlc = check_traces_tlc([m.trace for m in cases], jobs=2)
    assert mutation_score(cases, py).killed == len(cases), mutation_score(cases, py).misses
    for m, a, b in zip(cases, py, tlc):
        assert (a.accepted, a.index) == (b.accepted, b.index), m.name


def test_simulated_behaviours_of_a_three_rank_config() -> None:
    needs_java()
    from kvgrant.conformance.drift import check_simulated

    h = make_header(3, 2, aliased=[0, 1], owner_only=[1], importers={0: [1], 1: [0], 2: []},
                    declared_readers={r: [0, 1, 2] for r in range(3)})
    report = check_simulated(h, num=100, depth=100, seed=3)
    assert report.problems == [] and report.rejected == []
    assert report.traces == 100 and report.edges > 100
