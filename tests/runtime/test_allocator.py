"""The transactional allocator on the sim backend: publish, grants, unwinding, traces."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from kvgrant.conformance.replay import replay_file
from kvgrant.errors import AllocationError, ContractError, HandleBudgetError, PlanError
from kvgrant.layout.geometry import load_geometry
from kvgrant.layout.plan import PhysicalPlan
from kvgrant.runtime.allocator import Published, allocate
from kvgrant.runtime.mutant_engines import MUTANT_ENGINES, REJECTED_AT, allocate_mutant
from kvgrant.runtime.faults import Fault
from kvgrant.runtime.sim import SimDriver
from kvgrant.runtime.trace import TRACE_ENV

from tests.runtime._small import G, chunk_plan, small_geometry

GIB = 1 << 30


class RecordingSim(SimDriver):
    """SimDriver that also remembers the order of driver calls (for the fault sweep)."""

    def __init__(self, **kw: object) -> None:
        super().__init__(**kw)  # type: ignore[arg-type]
        self.order: list[str] = []

    def _enter(self, call, device, va=None, size=None):  # type: ignore[no-untyped-def]
        self.order.append(call)
        super()._enter(call, device, va, size)


def events(path: Path) -> list[dict]:
    return [json.loads(x) for x in path.read_text().splitlines()[1:]]


def test_publish_capacities_vas_and_release(tmp_path: Path) -> None:
    g = small_geometry()
    plan = chunk_plan(g)
    drv = SimDriver(devices=3)
    trace = tmp_path / "ok.ndjson"
    pub = allocate(g, plan=plan, driver=drv, trace=trace)
    assert isinstance(pub, Published)
    cap = pub.capacity
    assert (cap.pages, cap.kv_tokens, cap.snapshot_slots) == (8, 8 * 16, 2)
    assert cap.rows == {"snapshot": 2, "exec": 1}
    # VA layout: one reservation per rank, planes then regions at G-aligned offsets
    for r in range(3):
        base = pub.plane_va[r]["a"]
        assert pub.plane_va[r]["b"] == base + g.plane_bytes("a")
        assert pub.region_va[r]["snapshot"] == base + g.plane_bytes("a") + g.plane_bytes("b")
        assert pub.region_va[r]["exec"] == pub.region_va[r]["snapshot"] + g.region_bytes("snapshot")
        assert pub.row_va(r, "snapshot", 1) == pub.region_va[r]["snapshot"] + 2 * G
    A = len(plan.allocations)
    aliased = sum(a.aliased for a in plan.allocations)
    c = pub.counts
    assert (c.reservations, c.allocations, c.mappings) == (3, 3 * A, 3 * (A + aliased))
    live = drv.live()
    assert (live.handles, live.mappings, live.reservations) == (3 * A, 3 * (A + aliased), 3)
    assert live.grants == c.grants
    with pub:
        pass  # context exit releases
    assert drv.live().is_empty() and pub.released
    pub.release()  # second release does nothing
    v = replay_file(trace)
    assert v.accepted, v.summary()
    assert v.final_phase == "Shutdown"
    acts = [e["action"] for e in events(trace)]
    assert acts.count("Publish") == 1 and acts[-1] == "ShutdownComplete"
    assert acts.index("Publish") > max(i for i, a in enumerate(acts) if a == "RankReady")


def test_access_only_for_owner_and_importers() -> None:
    g = small_geometry()
    drv = SimDriver(devices=3)
    with allocate(g, plan=chunk_plan(g), driver=drv) as pub:
        a_va = pub.plane_va[0]["a"]
        assert drv.get_access(a_va, 0) and drv.get_access(a_va, 1)
        assert not drv.get_access(a_va, 2)      # overdeclared reader gets nothing
        snap = pub.region_va[0]["snapshot"]
        assert drv.get_access(snap, 1) and not drv.get_access(snap, 2)
        ex = pub.region_va[0]["exec"]
        assert drv.get_access(ex, 0) and not drv.get_access(ex, 1)  # owner-only region
        r2 = pub.plane_va[2]["a"]
        assert drv.get_access(r2, 2) and not drv.get_access(r2, 0)  # rank 2 imports from nobody
        # grants: ranks 0,1 grant 2 devices on every mapping except exec; rank 2 grants 1
        A = len(pub.plan.allocations)
        maps = A + sum(a.aliased for a in pub.plan.allocations)
        assert pub.counts.grants == 2 * (2 * maps - 1) + maps


def test_devices_map_ranks_to_other_ordinals(tmp_path: Path) -> None:
    g = small_geometry()
    drv = SimDriver(devices=5)
    trace = tmp_path / "dev.ndjson"
    with allocate(g, plan=chunk_plan(g), driver=drv, devices=[4, 2, 0], trace=trace) as pub:
        assert drv.get_access(pub.plane_va[0]["a"], 2)       # rank 1 lives on device 2
        assert not drv.get_access(pub.plane_va[0]["a"], 0)   # device 0 is rank 2
    assert replay_file(trace).accepted


def _sweep_positions(g, plan) -> tuple[int, list[str]]:  # type: ignore[no-untyped-def]
    drv = RecordingSim(devices=3)
    pub = allocate(g, plan=plan, driver=drv)
    startup = list(drv.order)
    pub.release()
    return len(startup), startup


def test_failure_at_every_driver_call_unwinds_everything(tmp_path: Path) -> None:
    g = small_geometry()
    plan = chunk_plan(g)
    n, order = _sweep_positions(g, plan)
    assert n > 40
    for k in range(1, n + 1):
        drv = RecordingSim(devices=3, faults=Fault(nth=k))
        trace = tmp_path / f"fail{k}.ndjson"
        with pytest.raises(AllocationError) as info:
            allocate(g, plan=plan, driver=drv, trace=trace)
        err = info.value
        assert drv.live().is_empty(), (k, drv.live())
        assert err.call == order[k - 1]
        assert err.result_name == "CUDA_ERROR_OUT_OF_MEMORY"
        assert err.call in str(err) and "CUDA_ERROR_OUT_OF_MEMORY" in str(err)
        assert err.cleanup_errors == []
        evs = events(trace)   # a failed device query too: its rank's failed Reserve
        if order[k - 1] in ("cuMemGetAllocationGranularity", "cuMemGetInfo"):
            assert [(e["action"], e["call"]) for e in evs] == [
                ("Reserve", order[k - 1]), ("Abort", None), ("AbortComplete", None)], evs
        assert "Publish" not in [e["action"] for e in evs]
        assert evs[-1]["action"] == "AbortComplete"
        v = replay_file(trace)
        assert v.accepted and v.final_phase == "Aborted", (k, v.summary())
        assert err.free_after == err.free_before  # every byte went back


def test_error_names_call_rank_device_target_range_result_live_and_free() -> None:
    g = small_geometry()
    plan = chunk_plan(g)
    # the first alias grant on device 1 (rank 1): fail it
    drv = SimDriver(devices=3, faults=Fault(call="cuMemSetAccess", device=1, nth=2))
    with pytest.raises(AllocationError) as info:
        allocate(g, plan=plan, driver=drv)
    err = info.value
    i0 = plan.allocations[0]
    assert (err.rank, err.device, err.call) == (1, 1, "cuMemSetAccess")
    assert err.target == "region 'snapshot'"
    assert err.byte_range == (i0.region_offset, i0.region_offset + i0.length)
    assert err.live["handles"] >= 1 and err.live["mappings"] >= 2
    assert set(err.free_before) == {0, 1, 2} and err.free_after == err.free_before
    msg = str(err)
    for part in ("cuMemSetAccess", "rank 1", "device 1", "region 'snapshot'",
                 "[0x0, 0x200000)", "CUDA_ERROR_OUT_OF_MEMORY", "live at failure: handles=",
                 "after unwinding: nothing left", "free per device before: {0: ",
                 "nothing was published"):
        assert part in msg, part
    assert drv.live().is_empty()


def test_handle_budget_preflight_refuses_before_any_driver_call() -> None:
    g = small_geometry()
    plan = chunk_plan(g)
    drv = SimDriver(devices=3)
    with pytest.raises(HandleBudgetError) as info:
        allocate(g, plan=plan, driver=drv, handle_budget=10)
    assert info.value.budget == 10 and info.value.demand > 10
    assert sum(drv.calls.values()) == 0


def test_contract_is_checked_before_any_driver_call() -> None:
    g = small_geometry()
    good = chunk_plan(g)
    broken = PhysicalPlan("broken", g, good.allocations[1:])  # plane a bytes [0, G) uncovered
    drv = SimDriver(devices=3)
    with pytest.raises(ContractError):
        allocate(g, plan=broken, driver=drv)
    assert sum(drv.calls.values()) == 0


def test_memory_limit_fits_pages_before_any_create() -> None:
    g = small_geometry(pages=1000)
    free = 2 * GIB
    drv = SimDriver(devices=3, memory_per_device=free)
    with allocate(g, plan=chunk_plan, driver=drv, memory_limit="-1G") as pub:
        assert pub.capacity.requested_pages == 1000
        assert pub.capacity.bytes_per_rank <= GIB
        assert pub.capacity.pages < 1000
        assert pub.capacity.kv_tokens == pub.capacity.pages * 16
        for d in range(3):
            assert drv.free_memory(d)[0] >= GIB  # 1 GiB kept free on every GPU
    assert drv.live().is_empty()


def test_given_plan_that_does_not_fit_is_refused_not_shrunk() -> None:
    g = small_geometry(pages=1000)
    drv = SimDriver(devices=3, memory_per_device=GIB)
    with pytest.raises(PlanError, match="memory_limit"):
        allocate(g, plan=chunk_plan(g), driver=drv)
    assert drv.live().is_empty() and drv.calls["cuMemCreate"] == 0


def test_too_few_devices_is_a_plan_error() -> None:
    g = small_geometry()
    with pytest.raises(PlanError, match="topology.ranks = 3"):
        allocate(g, plan=chunk_plan(g), driver=SimDriver(devices=2))


def test_create_failure_from_real_oom_is_not_retried_smaller() -> None:
    g = small_geometry()
    plan = chunk_plan(g)
    # someone else grabs memory between measuring and creating: simulate with a fault
    drv = SimDriver(devices=3, faults=Fault(call="cuMemCreate", device=2, nth=3))
    with pytest.raises(AllocationError, match="cuMemCreate"):
        allocate(g, plan=plan, driver=drv)
    assert drv.calls["cuMemAddressReserve"] == 3  # one attempt: each rank reserved once
    assert drv.live().is_empty()


def test_trace_switched_on_by_environment(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "env.ndjson"
    monkeypatch.setenv(TRACE_ENV, str(path))
    g = small_geometry()
    allocate(g, plan=chunk_plan(g), driver=SimDriver(devices=3)).release()
    assert replay_file(path).accepted


def test_trace_events_carry_call_result_and_state(tmp_path: Path) -> None:
    g = small_geometry()
    trace = tmp_path / "t.ndjson"
    allocate(g, plan=chunk_plan(g), driver=SimDriver(devices=3), trace=trace).release()
    lines = trace.read_text().splitlines()
    head = json.loads(lines[0])
    assert head["kind"] == "header" and head["ranks"] == 3 and head["plan"] == "chunks"
    # version 2: the topology, from which checkers derive importers (no importers list)
    assert head["version"] == 2 and "importers" not in head
    assert head["topology"]["import_groups"] == [[0, 1]]
    assert head["topology"]["declared_readers"]["0"] == [0, 1, 2]
    assert len(head["allocations"]) == head["allocs"]
    assert all(base is not None for base, _ in head["reservations"].values())
    evs = [json.loads(x) for x in lines[1:]]
    creates = [e for e in evs if e["action"] == "Create"]
    assert len({(e["rank"], e["handle"]) for e in creates}) == len(creates)
    assert [e["seq"] for e in evs] == list(range(len(evs)))
    grants = [e for e in evs if e["action"] == "Grant" and e["rank"] == 0]
    assert all(e["args"]["devices"] in ([0, 1], [0]) for e in grants)
    assert all(e["call"] == "cuMemSetAccess" and e["result"] == "CUDA_SUCCESS" for e in grants)
    assert all(e["state"]["phase"] == "Allocating" for e in grants)


def test_every_mutant_engine_has_an_expected_rejection() -> None:
    assert set(REJECTED_AT) == set(MUTANT_ENGINES)


@pytest.mark.parametrize("bug", sorted(MUTANT_ENGINES))
def test_mutant_engines_produce_rejected_traces(tmp_path: Path, bug: str) -> None:
    g = small_geometry()
    trace = tmp_path / f"{bug}.ndjson"
    drv = SimDriver(devices=3)
    allocate_mutant(bug, g, plan=chunk_plan(g), driver=drv, trace=trace,
                    preflight=False).release()
    v = replay_file(trace)
    assert not v.accepted, bug
    assert v.event is not None and v.event.action == REJECTED_AT[bug], v.summary()


def test_the_same_run_without_a_mutant_is_accepted(tmp_path: Path) -> None:
    g = small_geometry()
    trace = tmp_path / "clean.ndjson"
    allocate(g, plan=chunk_plan(g), driver=SimDriver(devices=3), trace=trace,
             preflight=False).release()
    assert replay_file(trace).accepted


def test_unknown_mutant_is_refused() -> None:
    with pytest.raises(ValueError, match="bug = 'nope'"):
        allocate_mutant("nope", small_geometry(), plan="packed", driver=SimDriver(devices=3))


def test_allocate_has_no_test_switch() -> None:
    import inspect

    assert "inject_bug" not in inspect.signature(allocate).parameters


# ------------------------------------------------------------------ plans and budget
def test_naive_fails_like_the_field_and_packed_fits_the_same_budget(tmp_path: Path) -> None:
    from kvgrant.layout.plans import make_plan
    from kvgrant.layout.preflight import handle_demand

    g = small_geometry()
    naive, packed = make_plan(g, "naive"), make_plan(g, "packed")
    budget = (handle_demand(g, naive) + handle_demand(g, packed)) // 2
    assert handle_demand(g, packed) <= budget < handle_demand(g, naive)
    # without pre-flight the naive plan reaches the driver and dies in cuMemSetAccess
    # with CUDA_ERROR_OUT_OF_MEMORY while memory is free: the field failure
    drv = SimDriver(devices=3, handle_budget=budget)
    trace = tmp_path / "naive.ndjson"
    with pytest.raises(AllocationError) as info:
        allocate(g, plan="naive", driver=drv, preflight=False, trace=trace)
    err = info.value
    assert (err.call, err.result_name) == ("cuMemSetAccess", "CUDA_ERROR_OUT_OF_MEMORY")
    assert all(f > GIB for f in err.free_before.values())
    assert drv.live().is_empty()
    assert replay_file(trace).final_phase == "Aborted"
    # with pre-flight it is refused before any driver call
    drv2 = SimDriver(devices=3, handle_budget=budget)
    with pytest.raises(HandleBudgetError):
        allocate(g, plan="naive", driver=drv2, handle_budget=budget)
    assert sum(drv2.calls.values()) == 0
    # the packed plan: same bytes, same budget, published
    drv3 = SimDriver(devices=3, handle_budget=budget)
    with allocate(g, plan="packed", driver=drv3, handle_budget=budget,
                  handle_reserve=0) as pub:
        assert pub.counts.grants == handle_demand(g, packed)
        assert pub.capacity.kv_tokens == g.pages * g.page_tokens
    assert drv3.live().is_empty()


# --------------------------------------------------------------------------- CLI
def _cli(argv: list[str]) -> int:
    import argparse

    from kvgrant.commands import alloc

    parser = argparse.ArgumentParser(prog="kvgrant")
    alloc.add_parser(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(argv)
    return int(args.run(args))


@pytest.fixture
def small_file(tmp_path: Path) -> Path:
    from tests.runtime._small import SMALL

    path = tmp_path / "small.json"
    path.write_text(json.dumps(SMALL))
    return path


def test_cli_alloc_prints_capacities_and_counts(small_file: Path, tmp_path: Path,
                                                capsys: pytest.CaptureFixture[str]) -> None:
    trace = tmp_path / "cli.ndjson"
    rc = _cli(["alloc", str(small_file), "--backend", "sim", "--plan", "naive",
               "--memory-limit=-1G", "--trace", str(trace), "--json"])
    assert rc == 0
    out = json.loads(capsys.readouterr().out)
    assert out["ok"] and out["capacity"]["kv_tokens"] == 8 * 16
    assert out["capacity"]["snapshot_slots"] == 2 and out["capacity"]["memory_limit"] == "-1G"
    assert out["counts"]["allocations"] == 3 * 6
    assert not any(out["live_after_release"].values())
    assert replay_file(trace).accepted
    rc = _cli(["alloc", str(small_file), "--backend", "sim"])
    text = capsys.readouterr().out
    assert rc == 0 and "KV tokens" in text and "driver objects" in text


def test_cli_alloc_fail_at_exits_nonzero_with_the_error(small_file: Path,
                                                        capsys: pytest.CaptureFixture[str]) -> None:
    rc = _cli(["alloc", str(small_file), "--backend", "sim", "--fail-at", "12"])
    err = capsys.readouterr().err
    assert rc != 0
    assert "failed with CUDA_ERROR_OUT_OF_MEMORY" in err and "nothing was published" in err


def test_cli_handle_budget_refusal(small_file: Path,
                                   capsys: pytest.CaptureFixture[str]) -> None:
    rc = _cli(["alloc", str(small_file), "--backend", "sim", "--handle-budget", "5", "--json"])
    out = json.loads(capsys.readouterr().out)
    assert rc == 1
    assert out["ok"] is False and out["kind"] == "HandleBudgetError"
    assert "budget is 5" in out["error"]


def test_cli_trace_write_failure_still_releases_everything(
        small_file: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A trace that cannot be written never aborts the lifecycle it records; it is an
    error (cache released) unless the caller asked to continue without it."""
    import io

    from kvgrant.errors import TraceError

    class Full(io.StringIO):
        def write(self, s: str) -> int:
            raise OSError(28, "No space left on device")

    from kvgrant.runtime.sim import SimDriver

    drv = SimDriver(devices=3)
    pub = allocate(load_geometry(small_file), driver=drv, trace=Full(),
                   trace_errors="continue")
    assert pub.trace_error is not None
    pub.release()
    assert drv.live().is_empty()
    drv = SimDriver(devices=3)
    with pytest.raises(TraceError, match="No space left"):
        allocate(load_geometry(small_file), driver=drv, trace=Full())
    assert drv.live().is_empty()
    # and on the abort path the AllocationError (not the OSError) reaches the caller
    from kvgrant.runtime.faults import Fault

    drv = SimDriver(devices=3, faults=[Fault(nth=20)])
    with pytest.raises(AllocationError, match="trace is incomplete"):
        allocate(load_geometry(small_file), driver=drv, trace=Full())
    assert drv.live().is_empty()


@pytest.mark.skipif(not Path("/dev/full").exists(), reason="needs /dev/full (Linux)")
def test_a_trace_file_that_cannot_be_written_is_known_before_allocate_returns(
        small_file: Path) -> None:
    """A trace file is written by a renderer process behind the allocation, which
    reports a failed write only when asked: allocate(errors="raise") returned the
    cache, and trace_error said nothing until release (the full-disk case)."""
    from kvgrant.errors import TraceError
    from kvgrant.runtime.options import TraceOptions
    from kvgrant.runtime.sim import SimDriver

    drv = SimDriver(devices=3)
    with pytest.raises(TraceError, match="/dev/full failed: .*No space left") as err:
        allocate(load_geometry(small_file), driver=drv, trace=TraceOptions("/dev/full"))
    assert "the cache was released and nothing is left" in str(err.value)
    assert drv.live().is_empty()
    drv = SimDriver(devices=3)
    pub = allocate(load_geometry(small_file), driver=drv,
                   trace=TraceOptions("/dev/full", errors="continue"))
    try:
        assert not drv.live().is_empty()
        assert "No space left" in str(pub.trace_error)  # before release
    finally:
        pub.release()
    assert drv.live().is_empty()


def test_cli_rejects_a_bad_memory_limit(small_file: Path,
                                        capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        _cli(["alloc", str(small_file), "--memory-limit=lots"])
    assert "memory_limit = 'lots'" in capsys.readouterr().err


# --------------------------------------------------------- the shipped examples
EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


def test_small_example_failure_sweep_with_packed_plan(tmp_path: Path) -> None:
    """examples/small.json, packed plan: fail each start-up driver call in turn."""
    from kvgrant.layout.geometry import load_geometry
    from kvgrant.layout.plans import make_plan

    g = load_geometry(EXAMPLES / "small.json")
    plan = make_plan(g, "packed")
    n, order = _sweep_positions(g, plan)
    for k in range(1, n + 1):
        drv = RecordingSim(devices=g.topology.ranks, faults=Fault(nth=k))
        trace = tmp_path / "sweep.ndjson"
        with pytest.raises(AllocationError) as info:
            allocate(g, plan=plan, driver=drv, trace=trace)
        assert info.value.call == order[k - 1] and info.value.call in str(info.value)
        assert drv.live().is_empty()
        if trace.exists() and trace.read_text():
            v = replay_file(trace)
            assert v.accepted and v.final_phase == "Aborted", v.summary()


def test_published_scale_sim_run(tmp_path: Path) -> None:
    """16 ranks x ~1,600 allocations on the simulator, traced, replayed, released."""
    trace = tmp_path / "dcp8.ndjson"
    drv = SimDriver(devices=16)
    pub = allocate(EXAMPLES / "published-dcp8.json", plan="packed", driver=drv, trace=trace)
    assert pub.capacity.kv_tokens == pub.geometry.pages * pub.geometry.page_tokens
    assert pub.capacity.snapshot_slots == 112
    assert pub.counts.grants == drv.live().grants
    pub.release()
    assert drv.live().is_empty()
    v = replay_file(trace)
    assert v.accepted and v.final_phase == "Shutdown", v.summary()


def test_published_dcp16_packed_is_refused_before_start_up() -> None:
    """DCP16 in one process overdraws the handle budget even packed: refused up front."""
    drv = SimDriver(devices=16)
    with pytest.raises(HandleBudgetError) as info:
        allocate(EXAMPLES / "published-dcp16.json", plan="packed", driver=drv)
    assert info.value.demand > info.value.budget
    assert sum(drv.calls.values()) == 0


class GcWatchingSim(SimDriver):
    """Records whether the cyclic GC was on at each driver call."""

    def __init__(self, **kw: object) -> None:
        super().__init__(**kw)  # type: ignore[arg-type]
        self.seen: list[tuple[str, bool]] = []

    def _enter(self, call, device, va=None, size=None):  # type: ignore[no-untyped-def]
        import gc

        self.seen.append((call, gc.isenabled()))
        super()._enter(call, device, va, size)


@pytest.mark.parametrize("fail", [False, True])
def test_driver_bursts_run_without_gc_and_restore_it(fail: bool) -> None:
    import gc

    g = small_geometry()
    drv = GcWatchingSim(devices=3, faults=Fault(nth=12) if fail else None)
    assert gc.isenabled()
    if fail:
        with pytest.raises(AllocationError):
            allocate(g, plan=chunk_plan(g), driver=drv)
    else:
        pub = allocate(g, plan=chunk_plan(g), driver=drv)
        assert gc.isenabled()  # between start-up and release, as the caller had it
        pub.release()
    assert gc.isenabled()
    # every reserve/create/map/grant and every undo ran with the collector paused
    burst = [on for call, on in drv.seen
             if call.startswith(("cuMemAddress", "cuMemCreate", "cuMemMap", "cuMemSet",
                                 "cuMemUnmap", "cuMemRelease"))]
    assert burst and not any(burst)


def test_a_caller_that_disabled_gc_keeps_it_disabled() -> None:
    import gc

    g = small_geometry()
    gc.disable()
    try:
        allocate(g, plan=chunk_plan(g), driver=SimDriver(devices=3)).release()
        assert not gc.isenabled()
    finally:
        gc.enable()


class InterruptingSim(SimDriver):
    """SimDriver that raises KeyboardInterrupt (a Ctrl-C) at its ``at``-th driver call,
    before the call takes effect."""

    def __init__(self, at: int, **kw: object) -> None:
        super().__init__(**kw)  # type: ignore[arg-type]
        self.at = at
        self.seen = 0

    def _enter(self, call, device, va=None, size=None):  # type: ignore[no-untyped-def]
        self.seen += 1
        if self.seen == self.at:
            raise KeyboardInterrupt
        super()._enter(call, device, va, size)


def test_ctrl_c_at_every_driver_call_unwinds_and_traces_every_event(tmp_path: Path) -> None:
    """An interruption inside an allocation's steps (not a driver error): the events of
    the steps that happened are traced before Abort, the unwinding undoes exactly them,
    and the trace conforms."""
    g = small_geometry()
    plan = chunk_plan(g)
    n, order = _sweep_positions(g, plan)
    for k in range(1, n + 1):
        drv = InterruptingSim(k, devices=3)
        trace = tmp_path / f"int{k}.ndjson"
        with pytest.raises(KeyboardInterrupt):
            allocate(g, plan=plan, driver=drv, trace=trace)
        assert drv.live().is_empty(), (k, drv.live())
        if not trace.exists() or not trace.read_text():
            assert order[k - 1] in ("cuMemGetAllocationGranularity", "cuMemGetInfo")
            continue
        actions = [e["action"] for e in events(trace)]
        assert "Publish" not in actions and actions[-1] == "AbortComplete", (k, actions[-3:])
        v = replay_file(trace)
        assert v.accepted and v.final_phase == "Aborted", (k, v.summary())


class SigintSim(SimDriver):
    """SimDriver that sends this process a SIGINT (a Ctrl-C) once its ``at``-th
    reserve, create, map or set_access call has taken effect, as a terminal does while
    the driver works (Python raises the KeyboardInterrupt at its next safe point)."""

    def __init__(self, at: int, **kw: object) -> None:
        super().__init__(**kw)  # type: ignore[arg-type]
        self.at = at
        self.seen = 0

    def _after(self, result: object) -> object:
        self.seen += 1
        if self.seen == self.at:
            import os
            import signal

            os.kill(os.getpid(), signal.SIGINT)
        return result

    def reserve(self, *a, **kw):  # type: ignore[no-untyped-def]
        return self._after(super().reserve(*a, **kw))

    def create(self, *a, **kw):  # type: ignore[no-untyped-def]
        return self._after(super().create(*a, **kw))

    def map(self, *a, **kw):  # type: ignore[no-untyped-def]
        return self._after(super().map(*a, **kw))

    def set_access(self, *a, **kw):  # type: ignore[no-untyped-def]
        return self._after(super().set_access(*a, **kw))


def test_a_real_ctrl_c_after_any_driver_call_leaves_nothing_and_a_conforming_trace(
        tmp_path: Path) -> None:
    """Python raises KeyboardInterrupt where it next can, often just after a driver call
    returned and before its undo was pushed; allocate holds the first Ctrl-C back to the
    next allocation boundary, so nothing leaks and the trace shows every object."""
    g = small_geometry()
    plan = chunk_plan(g)
    calls = SigintSim(0, devices=3)
    allocate(g, plan=plan, driver=calls).release()
    for k in range(1, calls.seen + 1):
        drv = SigintSim(k, devices=3)
        trace = tmp_path / f"sigint{k}.ndjson"
        with pytest.raises(KeyboardInterrupt):
            allocate(g, plan=plan, driver=drv, trace=trace)
        assert drv.live().is_empty(), (k, drv.live())
        if trace.exists() and trace.read_text():
            v = replay_file(trace)
            # interrupted before the last allocation began: aborted; later: published,
            # then shut down before allocate raised
            assert v.accepted and v.final_phase in ("Aborted", "Shutdown"), (k, v.summary())
