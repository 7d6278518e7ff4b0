"""Traces of the real allocator (sim backend, and committed H200 recordings) conform;
traces of the allocator with one ordering bug injected are rejected."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from kvgrant.conformance.replay import replay
from kvgrant.conformance.tla_trace import check_traces_tlc
from kvgrant.conformance.trace_io import load_trace
from kvgrant.errors import AllocationError

from _conform_support import needs_java

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = sorted((ROOT / "examples").glob("*.json"))
SMALL_EXAMPLES = [p for p in EXAMPLES if p.name.startswith("small")]
H200_TRACES = sorted((ROOT / "tests" / "fixtures" / "h200").glob("*.ndjson"))
REGENERATE = "tools/record_h200_fixtures.sh on a 2-GPU host (tests/fixtures/h200/README.md)"


def _version(path: Path) -> object:
    with path.open(encoding="utf-8") as f:
        return json.loads(f.readline()).get("version")


def _current_h200(path: Path) -> Path:
    """The fixture, or a skip when it predates the current trace format: a recording of
    real GPUs cannot be rewritten here, only re-recorded."""
    from kvgrant.traceformat import LIFECYCLE_VERSION

    v = _version(path)
    if v != LIFECYCLE_VERSION:
        pytest.skip(f"{path.name} is a version-{v} trace (the format is version "
                    f"{LIFECYCLE_VERSION}, naming handles and VAs): re-record it with "
                    f"{REGENERATE}")
    return path

from kvgrant.errors import HandleBudgetError  # noqa: E402
from kvgrant.runtime.allocator import allocate  # noqa: E402
from kvgrant.runtime.mutant_engines import MUTANT_ENGINES, allocate_mutant  # noqa: E402
from kvgrant.runtime.faults import Fault  # noqa: E402
from kvgrant.runtime.sim import SimDriver  # noqa: E402

# Forward driver calls that can fail during allocation, and the spec action of each.
FAILABLE = {"cuMemAddressReserve": {"Reserve"}, "cuMemCreate": {"Create"},
            "cuMemMap": {"Map", "MapAlias"}, "cuMemSetAccess": {"Grant"}}


def _ranks(geometry: Path) -> int:
    return int(json.loads(geometry.read_text())["topology"]["ranks"])


def _record(geometry: Path, path: Path, *, plan: str = "packed",
            faults: list[Fault] | None = None, inject_bug: str | None = None,
            preflight: bool = True) -> SimDriver:
    drv = SimDriver(devices=_ranks(geometry), faults=faults)
    try:
        if inject_bug is None:
            pub = allocate(geometry, plan=plan, driver=drv, trace=path, preflight=preflight)
        else:
            pub = allocate_mutant(inject_bug, geometry, plan=plan, driver=drv, trace=path,
                                  preflight=preflight)
    except AllocationError:
        return drv
    pub.release()
    return drv


def test_examples_exist() -> None:
    assert SMALL_EXAMPLES, "examples/small*.json missing"


@pytest.mark.parametrize("geometry", EXAMPLES, ids=[p.stem for p in EXAMPLES])
@pytest.mark.parametrize("plan", ["naive", "packed"])
def test_sim_trace_of_every_example_conforms(geometry, plan, tmp_path) -> None:
    path = tmp_path / "trace.ndjson"
    try:
        drv = _record(geometry, path, plan=plan)
        refused = False
    except HandleBudgetError:
        # Pre-flight refuses it before any driver call (nothing traced); without the
        # pre-flight the simulated driver fails the way the field did, and that
        # trace, aborted and unwound, must conform too.
        refused = True
        drv = _record(geometry, path, plan=plan, preflight=False)
    assert drv.live().is_empty()
    t = load_trace(path)
    v = replay(t)
    assert v.accepted, v.summary()
    if refused:
        failed = [e for e in t.events if e.result not in (None, "CUDA_SUCCESS")]
        assert [(e.action, e.result) for e in failed] == [("Grant", "CUDA_ERROR_OUT_OF_MEMORY")]
        assert v.final_phase == "Aborted" and v.ranks == _ranks(geometry)
    else:
        assert v.final_phase == "Shutdown" and v.ranks == _ranks(geometry)
        assert sum(e.action == "Create" for e in t.events) == t.header.ranks * t.header.allocs


def _fault_positions(geometry: Path, tmp_path: Path) -> list[Fault]:
    drv = _record(geometry, tmp_path / "clean.ndjson")
    t = load_trace(tmp_path / "clean.ndjson")
    forward = {call: sum(1 for e in t.events if e.call == call and e.state["phase"]
                         == "Allocating") for call in FAILABLE}
    assert all(forward.values()), (forward, dict(drv.calls))
    return [Fault(call=call, nth=k) for call, n in forward.items() for k in range(1, n + 1)]


@pytest.mark.parametrize("geometry", SMALL_EXAMPLES[:2], ids=[p.stem for p in SMALL_EXAMPLES[:2]])
def test_every_fault_injection_trace_conforms(geometry, tmp_path) -> None:
    faults = _fault_positions(geometry, tmp_path)
    seen = set()
    for f in faults:
        path = tmp_path / "fault.ndjson"
        drv = _record(geometry, path, faults=[f])
        assert drv.live().is_empty()
        t = load_trace(path)
        v = replay(t)
        assert v.accepted and v.final_phase == "Aborted", (f.describe(), v.summary())
        (failed,) = [e for e in t.events if not e.ok]
        assert failed.call == f.call and failed.action in FAILABLE[f.call]
        seen.add(failed.action)
    assert seen == {"Reserve", "Create", "Map", "MapAlias", "Grant"}
    assert len(faults) > 20


@pytest.mark.parametrize("bug", sorted(MUTANT_ENGINES))
def test_runtime_mutants_are_rejected(bug, tmp_path) -> None:
    geometry = ROOT / "examples" / "small.json"
    path = tmp_path / f"{bug}.ndjson"
    _record(geometry, path, inject_bug=bug)
    v = replay(load_trace(path))
    assert not v.accepted, f"{bug}: {v.summary()}"
    assert v.event is not None
    first_bad = {"grant_declared_readers": "Grant", "publish_early": "Publish",
                 "unmap_backing_first": "Unmap", "skip_release": None,
                 "map_before_create": "Map"}[bug]
    if first_bad is not None:
        assert v.event.action == first_bad, v.summary()


@pytest.mark.tlc
def test_tlc_agrees_on_runtime_traces_and_mutants(tmp_path) -> None:
    needs_java()
    geometry = ROOT / "examples" / "small.json"
    paths = [tmp_path / "clean.ndjson", tmp_path / "fault.ndjson"]
    _record(geometry, paths[0])
    _record(geometry, paths[1], faults=[Fault(call="cuMemMap", nth=4)])
    for bug in sorted(MUTANT_ENGINES):
        paths.append(tmp_path / f"{bug}.ndjson")
        _record(geometry, paths[-1], inject_bug=bug)
    traces = [load_trace(p) for p in paths]
    py = [replay(t) for t in traces]
    tlc = check_traces_tlc(traces, jobs=2)
    assert [v.accepted for v in py] == [True, True] + [False] * len(MUTANT_ENGINES)
    for p, a, b in zip(paths, py, tlc):
        assert (a.accepted, a.index) == (b.accepted, b.index), p.name
    score = sum(not v.accepted for v in tlc[2:])
    assert score == len(MUTANT_ENGINES)


@pytest.mark.skipif(not H200_TRACES, reason="no H200 trace fixtures under tests/fixtures/h200")
@pytest.mark.parametrize("path", H200_TRACES, ids=[p.stem for p in H200_TRACES])
def test_h200_recorded_traces_conform(path) -> None:
    t = load_trace(_current_h200(path))
    assert t.header.extra.get("backend") == "cuda"
    v = replay(t)
    assert v.accepted, v.summary()


@pytest.mark.tlc
def test_tlc_agrees_on_small_examples_and_h200_traces(tmp_path) -> None:
    """Includes small-inward (16 allocations, 24 mappings per rank): with ``Granted``
    written as an existential TLC enumerated 2^24 duplicate successors at RankReady."""
    needs_java()
    traces = []
    for geometry in SMALL_EXAMPLES:
        path = tmp_path / f"{geometry.stem}.ndjson"
        _record(geometry, path)
        traces.append(load_trace(path))
    traces += [load_trace(p) for p in H200_TRACES if _version(p) == 2]
    tlc = check_traces_tlc(traces, jobs=2, timeout=120)
    for t, v in zip(traces, tlc):
        p = replay(t)
        assert p.accepted and (v.accepted, v.final_phase) == (True, p.final_phase), t.source


@pytest.mark.tlc
@pytest.mark.skipif(not H200_TRACES, reason="no H200 trace fixtures under tests/fixtures/h200")
@pytest.mark.parametrize("path", H200_TRACES, ids=[p.stem for p in H200_TRACES])
def test_conform_engine_both_on_committed_real_traces(path) -> None:
    """CI: ``kvgrant conform --engine both`` on every committed real-GPU trace (issue #14
    item 4): both engines accept it and agree."""
    needs_java()
    _current_h200(path)
    out = subprocess.run([sys.executable, "-m", "kvgrant", "conform", str(path), "--engine",
                          "both", "--json"], capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-2000:]
    verdict = json.loads(out.stdout)
    assert verdict["agree"] and verdict["accepted"]
    assert [v["engine"] for v in verdict["verdicts"]] == ["python", "tlc"]


def test_object_mutants_of_a_sim_trace_are_rejected_where_put(tmp_path) -> None:
    """The trace mutants (order and object identity) applied to a real allocator trace
    (sim backend, examples/small.json): each rejected exactly at its event."""
    from kvgrant.conformance.mutants import MUTATIONS, OBJECT_MUTATIONS, mutants

    path = tmp_path / "small.ndjson"
    _record(ROOT / "examples" / "small.json", path)
    cases = mutants(load_trace(path))
    assert {m.name for m in cases} >= set(OBJECT_MUTATIONS)
    assert len(cases) >= 20 and len(cases) <= len(MUTATIONS) + len(OBJECT_MUTATIONS)
    for m in cases:
        v = replay(m.trace)
        assert not v.accepted and v.index == m.expected_index, (m.name, v.summary())


def _conform(*argv: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "kvgrant", "conform", *argv],
                          capture_output=True, text=True, timeout=300)


def test_conform_geometry_checks_the_header_plan(tmp_path) -> None:
    """``kvgrant conform TRACE --geometry FILE``: the plan derived from the geometry must
    be the header's; a mismatch is a rejection naming the field."""
    geometry = ROOT / "examples" / "small.json"
    path = tmp_path / "small.ndjson"
    _record(geometry, path, plan="naive")
    ok = _conform(str(path), "--geometry", str(geometry))
    assert ok.returncode == 0, ok.stdout + ok.stderr
    assert "header matches" in ok.stdout
    other = _conform(str(path), "--geometry", str(ROOT / "examples" / "small-inward.json"))
    assert other.returncode == 1 and "header.planes[1][0] = 'kv1'" in other.stderr
    lines = path.read_text().splitlines()
    head = json.loads(lines[0])
    head["topology"]["declared_readers"]["2"] = [0, 2]  # still a valid header
    (tmp_path / "forged.ndjson").write_text("\n".join([json.dumps(head)] + lines[1:]) + "\n")
    forged = _conform(str(tmp_path / "forged.ndjson"), "--geometry", str(geometry), "--json")
    assert forged.returncode == 1
    assert json.loads(forged.stdout)["mismatches"] == [
        "header.topology.declared_readers.2 = [0, 2] but the geometry says [2]"]


def _record_plan(geometry: Path, path: Path, allocations, *, check: bool = True) -> None:
    """A sim trace of ``geometry`` allocated with ``allocations`` under the label
    ``packed`` (as an earlier kvgrant, whose planner chose other allocations, wrote it)."""
    from kvgrant.layout.geometry import load_geometry
    from kvgrant.layout.plan import PhysicalPlan

    g = load_geometry(geometry)
    plan = PhysicalPlan("packed", g, tuple(allocations))
    pub = allocate(g, plan=plan, driver=SimDriver(devices=_ranks(geometry)), trace=path,
                   check_contract=check)
    pub.release()


def test_conform_geometry_takes_another_versions_packed_plan_that_keeps_the_contract(
        tmp_path) -> None:
    """A packed plan is the planner's optimum for one planner version: a trace written
    by another version carries other allocations of the same geometry. They are taken
    when they keep the layout contract (with a note), never when they break it."""
    from kvgrant.layout.geometry import load_geometry
    from kvgrant.layout.plan import Allocation
    from kvgrant.layout.plans import packed_plan, reference_plan

    geometry = ROOT / "examples" / "small.json"
    g = load_geometry(geometry)
    other = reference_plan(g).allocations
    assert other != packed_plan(g).allocations  # (the test needs two different plans)
    path = tmp_path / "older.ndjson"
    _record_plan(geometry, path, other)
    ok = _conform(str(path), "--geometry", str(geometry))
    assert ok.returncode == 0, ok.stdout + ok.stderr
    assert "header keeps the layout contract of" in ok.stdout
    assert "header matches" not in ok.stdout
    assert f"packed plan ({len(other):,} allocations) is not the one this kvgrant " \
        "computes" in ok.stdout and "keeps the layout contract of the geometry" in ok.stdout
    as_json = _conform(str(path), "--geometry", str(geometry), "--json")
    assert as_json.returncode == 0 and json.loads(as_json.stdout)
    assert "note: the header's packed plan" in as_json.stderr
    # the same allocations, with two aliased ones of one length trading region bytes
    # when that moves a page into another row's conflict set: the contract is broken
    aliased = [i for i, a in enumerate(other) if a.aliased]
    broken = None
    for i in aliased:
        for j in aliased:
            a, b = other[i], other[j]
            if i < j and a.length == b.length and a.plane != b.plane:
                swapped = list(other)
                swapped[i] = Allocation(a.plane, a.plane_offset, a.length, b.region,
                                        b.region_offset)
                swapped[j] = Allocation(b.plane, b.plane_offset, b.length, a.region,
                                        a.region_offset)
                from kvgrant.layout.contract import check_contract
                if check_contract(g, swapped):
                    broken = swapped
                    break
        if broken:
            break
    assert broken is not None
    bad = tmp_path / "broken.ndjson"
    _record_plan(geometry, bad, broken, check=False)
    no = _conform(str(bad), "--geometry", str(geometry), "--json")
    assert no.returncode == 1, no.stdout + no.stderr
    assert all(d.startswith("header.allocations")
               for d in json.loads(no.stdout)["mismatches"])
    # a rule plan has one answer: this kvgrant's packed allocations (a plan that keeps
    # the contract) labelled "reference" stand rejected
    mine = tmp_path / "mine.ndjson"
    _record(geometry, mine)
    head, *rest = mine.read_text().splitlines()
    doc = json.loads(head)
    assert doc["plan"] == "packed"
    doc["plan"] = "reference"
    (tmp_path / "relabelled.ndjson").write_text("\n".join([json.dumps(doc)] + rest) + "\n")
    relabelled = _conform(str(tmp_path / "relabelled.ndjson"), "--geometry", str(geometry))
    assert relabelled.returncode == 1 and "header.allocations" in relabelled.stderr
