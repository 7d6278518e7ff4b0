"""Drift guard: TLC's full state graph of the rich config equals the Python model's in
both directions (every Python-enabled action is TLC-enabled and vice versa), every
enumerated behaviour replays as an accepted trace, both engines reject the same
mutants of those behaviours at the same index, and deliberately drifted Python
models are caught. The Python model's history (the undo stack) and one-attempt rules
are checked here without TLC too."""

from __future__ import annotations

import pytest

import random

from kvgrant.conformance import model
from kvgrant.conformance.drift import (behaviours, check_drift, compare_graph,
                                       dump_state_graph, trace_of_path)
from kvgrant.conformance.mutants import make_header, mutants, mutation_score
from kvgrant.conformance.replay import replay
from kvgrant.conformance.tla_trace import check_traces_tlc

from _conform_support import needs_java

tlc = pytest.mark.tlc

# The rich config of issue 14 on 2 ranks: 3 allocations, 0 aliased into an owner-only
# region, 1 into an importer-granted one, 2 plain (neither aliased one is the last);
# asymmetric importers (rank 1 imports rank 0, rank 0 imports nobody) and both ranks
# declare both as readers, so rank 0 is an overdeclared reader of rank 1.
HEADER = make_header(2, 3, aliased=[0, 1], owner_only=[0], importers={0: [1], 1: []},
                     declared_readers={0: [0, 1], 1: [0, 1]})


@pytest.fixture(scope="module")
def graph():
    needs_java()
    return dump_state_graph(HEADER)


@tlc
def test_python_model_equals_tlc_state_graph(graph) -> None:
    report = check_drift(HEADER, graph=graph, paths=150, seed=7)
    assert report.problems == []
    assert report.states == report.python_states == len(graph.states)
    assert report.states > 1000 and report.edges > report.states
    phases = {s.phase for s in graph.states.values()}
    assert phases == {"Allocating", "Published", "Aborting", "Aborted", "ShuttingDown",
                      "Shutdown"}
    assert report.traces >= 150 and report.rejected == []
    # the history is part of the compared state: TLC's undo stacks are read back
    stacks = {len(r.undo) for s in graph.states.values() for r in s.ranks}
    assert max(stacks) == 1 + 3 + 3 + 2  # VA, 3 handles, 3 planes, 2 aliases


@tlc
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


@tlc
def test_drift_guard_catches_alias_unmap_skipping_reverse_order(graph, monkeypatch) -> None:
    """Issue 14's blind spot: an alias Unmap without the reverse-order check passed
    every drift test while only the last allocation was aliased."""
    real = model._UNWIND_GUARDS["Unmap"]

    def sloppy(c, s, r, a, m):
        if m == "alias" and r is not None and a is not None and s.phase in model._UNWINDING:
            return a in s.ranks[r].alias_mapped
        return real(c, s, r, a, m)

    monkeypatch.setitem(model._UNWIND_GUARDS, "Unmap", sloppy)
    problems = compare_graph(graph)
    assert problems and "only Python allows ['Unmap']" in problems[0]


@tlc
def test_drift_guard_catches_a_python_model_stricter_than_tlc(graph, monkeypatch) -> None:
    """The other direction: an action TLC takes that the Python model refuses."""
    real = model._UNWIND_GUARDS["Release"]
    monkeypatch.setitem(model._UNWIND_GUARDS, "Release",
                        lambda c, s, r, a, m: a != 0 and real(c, s, r, a, m))
    problems = compare_graph(graph)
    assert problems and "only TLC allows ['Release']" in problems[0]


def _walk(c: model.Constants, seed: int) -> list[tuple[model.ModelState, model.Action,
                                                       model.ModelState]]:
    """One random behaviour of the Python model as (before, action, after) steps."""
    rng = random.Random(seed)
    s = model.initial_state(c)
    steps = []
    while s.phase not in ("Aborted", "Shutdown"):
        acts = model.enabled(c, s)
        calm = [a for a in acts if a.name != "Fail"]
        if calm and rng.random() < 0.97:  # a failure now and then, not at every step
            acts = calm
        act = acts[rng.randrange(len(acts))]
        t = s.copy()
        model.apply(c, t, act)
        steps.append((s, act, t))
        s = t
    return steps


def test_python_model_keeps_the_spec_history_and_one_attempt() -> None:
    """The Python mirror of UnwindInReverseOrder, NoRetryAfterFailure, OneAttempt,
    ReservedBeforeAnyCreate and FailureNeverPublishes on random behaviours of the rich config (seeded, so
    deterministic)."""
    c = model.Constants.from_header(HEADER)
    forward = {("Allocating", "Published"), ("Allocating", "Aborting"),
               ("Aborting", "Aborted"), ("Published", "ShuttingDown"),
               ("ShuttingDown", "Shutdown")}
    ends = set()
    for seed in range(300):
        steps = _walk(c, seed)
        ends.add(steps[-1][2].phase)
        for before, act, after in steps:
            assert before.phase == after.phase or (before.phase, after.phase) in forward
            for rb, ra in zip(before.ranks, after.ranks):
                # unchanged, one push, or the top popped (UnwindInReverseOrder)
                assert ra.undo in (rb.undo, rb.undo[:-1]) or ra.undo[:-1] == rb.undo, act
                if rb.failed:
                    assert len(ra.undo) <= len(rb.undo) and not (ra.ready and not rb.ready)
                    assert ra.access_triples() <= rb.access_triples() and ra.failed
            if any(r.failed for r in after.ranks):
                assert after.phase not in ("Published", "ShuttingDown", "Shutdown")
            if any(len(ra.created) > len(rb.created)
                   for rb, ra in zip(before.ranks, after.ranks)):
                assert all(r.va for r in before.ranks), act  # ReservedBeforeAnyCreate
        assert all(r.undo == [] for r in steps[-1][2].ranks)
    assert ends == {"Aborted", "Shutdown"}


def test_python_model_undo_stack_is_plan_order() -> None:
    c = model.Constants.from_header(HEADER)
    s = model.initial_state(c)
    for r in range(1, c.ranks):  # every rank reserves before any rank creates
        model.apply(c, s, model.Action("Reserve", r))
    for name, a, m in [("Reserve", None, None), ("Create", 0, None), ("Map", 0, None),
                       ("MapAlias", 0, None), ("Grant", 0, "plane"), ("Grant", 0, "alias")]:
        act = model.Action(name, 0, a, m)
        assert model.guard(c, s, act), act
        model.apply(c, s, act)
    assert s.ranks[0].undo == [("va", 0), ("handle", 0), ("plane", 0), ("alias", 0)]
    # each allocation is complete before the next Create
    assert model.guard(c, s, model.Action("Create", 0, 1))
    t = s.copy()
    model.apply(c, t, model.Action("Create", 0, 1))
    assert not model.guard(c, t, model.Action("Create", 0, 2))


@tlc
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


@tlc
def test_simulated_behaviours_of_a_three_rank_config() -> None:
    needs_java()
    from kvgrant.conformance.drift import check_simulated

    h = make_header(3, 2, aliased=[0, 1], owner_only=[1], importers={0: [1], 1: [0], 2: []},
                    declared_readers={r: [0, 1, 2] for r in range(3)})
    report = check_simulated(h, num=100, depth=100, seed=3)
    assert report.problems == [] and report.rejected == []
    assert report.traces == 100 and report.edges > 100
