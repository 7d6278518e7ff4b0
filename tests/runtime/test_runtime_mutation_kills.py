"""Tests that kill hand-written runtime mutants the rest of the suite let through.

docs/mutation-score.md ("Hand-written runtime mutants") lists each mutant, where it was
made and which test here kills it. Most are group-runtime bugs (runtime/group.py): the
group tests of tests/runtime/test_group_sim.py start real processes, and a group of
*threads* in this process reaches the same code in a fraction of a second: one thread
per rank, each with its own simulated driver, on an in-memory store (``store=``); fds
still go over the ranks' Unix sockets. Every group here is a real group: it publishes
or aborts together, and its trace files are checked by the group model's checker.
"""

from __future__ import annotations

import json
import threading
from pathlib import Path
from typing import Any

import pytest

from kvgrant.conformance.group_check import check_group
from kvgrant.errors import GroupError, HandleBudgetError
from kvgrant.layout.geometry import Geometry, parse_geometry
from kvgrant.layout.plans import make_plan
from kvgrant.runtime.faults import Fault
from kvgrant.runtime.group import GroupPublished, rank_demand
from kvgrant.runtime.ledger import HostLedger
from kvgrant.runtime.options import HandleBudget
from kvgrant.runtime.sim import SimDriver

from tests.runtime._dict_store import release_all, run_threads

MIB = 1 << 20
G = 2 * MIB
EMPTY = {"handles": 0, "mappings": 0, "grants": 0, "reserved_bytes": 0, "reservations": 0}

# One plane of 4 G, its first G aliased into an importers' region: ranks 0 and 1
# import each other (as tests/runtime/test_group_sim.py's TINY, two more pages).
TINY = {"name": "tiny", "granularity": G, "pages": 8, "page_tokens": 16,
        "planes": [{"name": "a", "bytes_per_page": MIB}],
        "regions": [{"name": "snapshot", "rows": 1, "row_bytes": G}],
        "aliases": [{"region": "snapshot", "offset": 0, "plane": "a", "plane_offset": 0,
                     "length": G}],
        "topology": {"ranks": 2, "import_groups": [[0, 1]]}}


def traces(tmp_path: Path, n: int) -> list[str]:
    return [str(tmp_path / f"rank{r}.ndjson") for r in range(n)]


def conforms(tmp_path: Path, n: int) -> str:
    verdict = check_group(traces(tmp_path, n))[0]
    assert verdict.accepted, verdict.summary()
    return verdict.summary()


def nothing_left(drv: SimDriver) -> None:
    assert drv.live().as_dict() == EMPTY
    assert drv.open_shareables() == 0 and not drv._shared and not any(drv._used)


def tiny() -> Geometry:
    return parse_geometry(TINY)


# ------------------------------------------------------------------ fds (group.py)
def test_an_exported_fd_is_closed_when_its_send_fails(tmp_path: Path, monkeypatch) -> None:
    """Rank 0's first sendmsg fails (the importer's socket was reset): the failed Send
    is traced, the group aborts, and the fd rank 0 exported for it is closed like every
    other (mutant: the fd was closed only after a successful send, so it leaked)."""
    import errno

    from kvgrant.runtime import fdpass

    real = fdpass.FdClient.send

    def send(self: Any, alloc: int, fd: int, size: int, device: int, deadline: float) -> None:
        if self.owner == 0 and alloc == 0:
            raise ConnectionResetError(errno.ECONNRESET, "connection reset by peer")
        real(self, alloc, fd, size, device, deadline)

    monkeypatch.setattr(fdpass.FdClient, "send", send)
    drivers = [SimDriver(devices=2), SimDriver(devices=2)]
    outs = run_threads(tiny(), drivers, tmp_path)
    release_all(outs)
    assert all(isinstance(o, GroupError) for o in outs), outs
    assert "sendmsg failed with ECONNRESET on rank 0" in outs[0].failed[0]
    for drv in drivers:
        nothing_left(drv)
    conforms(tmp_path, 2)


# --------------------------------------------------------- the ledger lease (group.py)
class _LeaseWatch(SimDriver):
    """A sim driver that, at every cuMemRelease and cuMemAddressFree, records whether this
    rank's ledger lease (the holder naming its device) is still in the ledger."""

    def __init__(self, ledger: HostLedger, device: int, **kw: Any) -> None:
        super().__init__(**kw)
        self.ledger, self.device, self.seen = ledger, device, []

    def _held(self) -> bool:
        return any(h.devices == (self.device,) for h in self.ledger.holders())

    def release(self, handle: int) -> None:
        self.seen.append(("release", self._held()))
        super().release(handle)

    def free_address(self, va: int, size: int) -> None:
        self.seen.append(("free", self._held()))
        super().free_address(va, size)


@pytest.mark.parametrize("fault", [None, Fault(nth=3, call="cuMemMap")], ids=["shutdown", "abort"])
def test_each_rank_holds_its_ledger_share_until_its_last_handle_is_gone(
        tmp_path: Path, fault: Fault | None) -> None:
    """A group in this process with a ledger: while published every rank holds its share
    (its rank_demand); on shutdown and on abort the share is released last, after the last
    cuMemRelease and the cuMemAddressFree, and the ledger is empty afterwards (a process
    that serves on after an abort must not keep it; mutants: the lease never released,
    or released first)."""
    ledger = HostLedger(tmp_path / "ledger.json")
    g = tiny()
    drivers = [_LeaseWatch(ledger, r, devices=2, faults=fault if r == 1 else None)
               for r in range(2)]
    outs = run_threads(g, drivers, tmp_path, budget=HandleBudget(ledger=ledger))
    if fault is None:
        assert all(isinstance(o, GroupPublished) for o in outs), outs
        held = sorted((h.devices, h.handles) for h in ledger.holders())
        plan = outs[0].plan
        assert held == [((r,), rank_demand(g, plan, r)) for r in range(2)]
        release_all(outs)
    else:
        assert all(isinstance(o, GroupError) for o in outs), outs
    assert ledger.holders() == []
    for drv in drivers:
        assert drv.seen and all(held for _, held in drv.seen), drv.seen
        nothing_left(drv)
    conforms(tmp_path, 2)


def test_the_one_process_allocator_holds_its_ledger_share_until_its_last_handle_is_gone(
        tmp_path: Path) -> None:
    """The same for allocate: the lease is the last undo of shutdown and of abort."""
    from kvgrant.errors import AllocationError
    from kvgrant.runtime import allocate

    ledger = HostLedger(tmp_path / "ledger.json")

    class Watch(SimDriver):
        seen: list[bool] = []

        def release(self, handle: int) -> None:
            self.seen.append(bool(ledger.holders()))
            super().release(handle)

    pub = allocate(tiny(), driver=Watch(devices=2), ledger=ledger)
    assert len(ledger.holders()) == 1
    pub.release()
    with pytest.raises(AllocationError):
        allocate(tiny(), driver=Watch(devices=2, faults=Fault(nth=5, call="cuMemMap")),
                 ledger=ledger)
    assert Watch.seen and all(Watch.seen) and ledger.holders() == []


# ------------------------------------------------------ failure messages (group.py)
def test_a_failed_step_names_its_own_byte_range(tmp_path: Path) -> None:
    """A failed cuMemCreate / cuMemImportFromShareableHandle of an allocation that does
    not start at plane offset 0 names [offset, offset + length) of the plane (mutant:
    the end was the length)."""
    g = tiny()
    plan = make_plan(g, "packed")
    k, a = next((k, a) for k, a in enumerate(plan.allocations) if a.plane_offset > 0)
    want = f"plane 'a' bytes [{a.plane_offset:#x}, {a.plane_offset + a.length:#x})"
    drivers = [SimDriver(devices=2, faults=Fault(nth=k + 1, call="cuMemCreate")),
               SimDriver(devices=2)]
    outs = run_threads(g, drivers, tmp_path, plan=plan)
    assert all(isinstance(o, GroupError) for o in outs), outs
    for o in outs:
        assert f"cuMemCreate failed with CUDA_ERROR_OUT_OF_MEMORY on rank 0 (device 0): " \
               f"{want}; cause:" in o.failed[0], o.failed[0]
    conforms(tmp_path, 2)
    # the importer's side: rank 1 fails importing rank 0's allocation k
    drivers = [SimDriver(devices=2), SimDriver(devices=2, faults=Fault(
        nth=k + 1, call="cuMemImportFromShareableHandle"))]
    outs = run_threads(g, drivers, tmp_path, plan=plan)
    assert all(isinstance(o, GroupError) for o in outs), outs
    assert f"cuMemImportFromShareableHandle failed with CUDA_ERROR_OUT_OF_MEMORY on rank 1 " \
           f"(device 1): imported from rank 0, {want}; cause:" in outs[0].failed[1]
    for drv in drivers:
        nothing_left(drv)
    conforms(tmp_path, 2)


# ------------------------------------------------------ host pre-flight (group.py)
def test_the_group_pre_flight_counts_the_reserve(tmp_path: Path) -> None:
    """The host's demand (both ranks) fits the budget exactly, so a reserve of one more
    handle for users kvgrant cannot see must refuse it, before any driver call, naming
    the reserve (mutant: the reserve was ignored and the group published)."""
    g = tiny()
    plan = make_plan(g, "packed")
    demand = sum(rank_demand(g, plan, r) for r in range(2))
    drivers = [SimDriver(devices=2), SimDriver(devices=2)]
    outs = run_threads(g, drivers, plan=plan,
                       budget=HandleBudget(handles=demand, reserve=1, ledger=False))
    release_all(outs)
    for o in outs:
        assert isinstance(o, HandleBudgetError), o
        assert f"+ a reserve of 1 but the host budget is {demand:,} (over by 1)" in str(o)
    assert all(sum(d.calls.values()) == 0 for d in drivers)
    ok = run_threads(g, [SimDriver(devices=2), SimDriver(devices=2)], plan=plan,
                     budget=HandleBudget(handles=demand, reserve=0, ledger=False))
    assert all(isinstance(o, GroupPublished) for o in ok), ok
    release_all(ok)


def test_an_importer_on_another_host_than_its_owner_is_refused_in_the_hello(
        monkeypatch) -> None:
    """Ranks 0 and 1 import each other but say they run on different hosts: POSIX fds
    do not cross hosts, so every rank refuses in the hello, naming both, before any
    driver call (mutant: the check was skipped and the fds' import failed late)."""
    import socket

    monkeypatch.setattr(socket, "gethostname",
                        lambda: f"node-{threading.current_thread().name}")
    drivers = [SimDriver(devices=2), SimDriver(devices=2)]
    outs = run_threads(tiny(), drivers, budget=HandleBudget(ledger=False))
    release_all(outs)
    for o in outs:
        assert isinstance(o, GroupError), o
        assert "rank 1 (host 'node-rank1') imports from rank 0 (host 'node-rank0')" in str(o)
        assert "POSIX fds do not cross hosts" in str(o)
    assert all(sum(d.calls.values()) == 0 for d in drivers)


# ------------------------------------------------------- a failed undo (group.py)
def test_a_rank_whose_undo_failed_does_not_trace_abort_complete(tmp_path: Path) -> None:
    """Rank 1's third cuMemMap fails, then its first cuMemUnmap of the unwinding fails
    too: that mapping is still there, so rank 1's trace must not claim AbortComplete
    (the model's "nothing left after abort"); its GroupError names the failed undo in
    cleanup_errors and in the message. Rank 0 unwinds fully (mutant: AbortComplete was
    traced whatever the undos did)."""
    drivers = [SimDriver(devices=2), SimDriver(devices=2, faults=[
        Fault(nth=3, call="cuMemMap"), Fault(nth=1, call="cuMemUnmap")])]
    outs = run_threads(tiny(), drivers, tmp_path)
    assert all(isinstance(o, GroupError) for o in outs), outs
    err = outs[1]
    assert err.cleanup_errors and "undo(s) failed, first: " in str(err)
    assert not drivers[1].live().is_empty()
    events = [json.loads(x) for x in
              (tmp_path / "rank1.ndjson").read_text().splitlines()[1:]]
    assert "Abort" in [e["action"] for e in events]
    assert "AbortComplete" not in [e["action"] for e in events]
    assert events[-1]["state"]["phase"] == "Aborting"
    assert [e["action"] for e in events if e["result"] not in ("CUDA_SUCCESS", "SUCCESS", None)
            ][:2] == ["Map", "Unmap"]
    nothing_left(drivers[0])
    r0 = [json.loads(x) for x in
          (tmp_path / "rank0.ndjson").read_text().splitlines()[1:]]
    assert r0[-1]["action"] == "AbortComplete"


# ---------------------------------------------------- fitting pages (group.py set-up)
def test_ranks_that_share_an_ordinal_fit_the_pages_of_the_smallest_free_memory(
        tmp_path: Path) -> None:
    """Each process sees its GPU as ordinal 0 (CUDA_VISIBLE_DEVICES): the set-up's
    all-gathered free bytes of one ordinal must be read as the least of them, so every
    rank fits the pages that the tightest GPU holds and the group publishes (mutant: the
    most free memory was taken, rank 1 ran out of memory at its cuMemCreate and the
    group aborted)."""
    small = 5 * MIB   # rank 1's GPU: room for 4 of the 8 pages (a G is 2 pages)
    drivers = [SimDriver(devices=1), SimDriver(devices=1, memory_per_device=small)]
    outs = run_threads(tiny(), drivers, tmp_path, per_rank={0: {"device": 0}, 1: {"device": 0}})
    try:
        assert all(isinstance(o, GroupPublished) for o in outs), outs
        pages = {o.capacity.pages for o in outs}
        assert len(pages) == 1 and pages.pop() * MIB <= small
        assert {o.capacity.requested_pages for o in outs} == {8}
        assert [o.device for o in outs] == [0, 0]
    finally:
        release_all(outs)
    for drv in drivers:
        nothing_left(drv)
    conforms(tmp_path, 2)


# ------------------------------------------------------ what the error names (group.py)
def test_the_group_error_names_the_root_cause_first(tmp_path: Path) -> None:
    """Rank 1's first export fails; rank 0, waiting for rank 1's fds, stops because of
    it. Every rank's GroupError lists rank 1 (its own step failed) before rank 0 (which
    stopped because of rank 1), in ``failed`` and in the message, as docs/group.md says
    (mutant: ranks in rank order, so rank 0's "stopped importing" came first)."""
    drivers = [SimDriver(devices=2), SimDriver(devices=2, faults=Fault(
        call="cuMemExportToShareableHandle"))]
    outs = run_threads(tiny(), drivers, tmp_path)
    assert all(isinstance(o, GroupError) for o in outs), outs
    for o in outs:
        assert list(o.failed) == [1, 0], o.failed
        assert "cuMemExportToShareableHandle failed" in o.failed[1]
        assert "rank 0 stopped importing from rank 1" in o.failed[0]
        text = str(o)
        assert text.index("rank 1 failed:") < text.index("rank 0 failed:")
    for drv in drivers:
        nothing_left(drv)
    conforms(tmp_path, 2)


# ------------------------------------------------------------- counts (group.py)
def test_each_ranks_counts_are_its_driver_handle_demand(tmp_path: Path) -> None:
    """A published rank's ``counts.grants`` (the (mapping, device) pairs it holds: its
    driver-handle demand) equals rank_demand, own and imported mappings together, and
    the group's sum is the one-process demand (mutant: the imported grants were left
    out)."""
    from kvgrant.layout.preflight import handle_demand

    g = tiny()
    drivers = [SimDriver(devices=2), SimDriver(devices=2)]
    outs = run_threads(g, drivers, tmp_path)
    try:
        assert all(isinstance(o, GroupPublished) for o in outs), outs
        plan = outs[0].plan
        for r, o in enumerate(outs):
            assert o.counts.grants == rank_demand(g, plan, r) == drivers[r].live().grants
            assert o.summary()["counts"]["grants"] == o.counts.grants
        assert sum(o.counts.grants for o in outs) == handle_demand(g, plan)
    finally:
        release_all(outs)


# ================================================= the one-process allocator
def _one_process_events(path: Path) -> list[dict[str, Any]]:
    return [json.loads(x) for x in path.read_text().splitlines()[1:]]


def test_an_allocation_failure_names_its_own_byte_range() -> None:
    """allocate: a failed cuMemCreate of an allocation that does not start at plane
    offset 0 names [offset, offset + length) in byte_range and in the message (mutant
    (engine.py): the end was the length)."""
    from kvgrant.errors import AllocationError
    from kvgrant.runtime import allocate

    g = tiny()
    plan = make_plan(g, "packed")
    k, a = next((k, a) for k, a in enumerate(plan.allocations) if a.plane_offset > 0)
    lo, hi = a.plane_offset, a.plane_offset + a.length
    drv = SimDriver(devices=2, faults=Fault(nth=k + 1, call="cuMemCreate"))
    with pytest.raises(AllocationError) as info:
        allocate(g, plan=plan, driver=drv)
    assert info.value.byte_range == (lo, hi)
    assert f"plane 'a' bytes [{lo:#x}, {hi:#x})" in str(info.value)
    assert drv.live().as_dict() == EMPTY


def test_an_abort_whose_undo_failed_does_not_trace_abort_complete(tmp_path: Path) -> None:
    """allocate: the third cuMemMap fails, then the first cuMemUnmap of the unwinding
    fails: a mapping is left, so the trace ends in Aborting, not AbortComplete, and the
    AllocationError names the failed undo (mutant (engine.py): AbortComplete always)."""
    from kvgrant.errors import AllocationError
    from kvgrant.runtime import allocate

    drv = SimDriver(devices=2, faults=[Fault(nth=3, call="cuMemMap"),
                                       Fault(nth=1, call="cuMemUnmap")])
    trace = tmp_path / "t.ndjson"
    with pytest.raises(AllocationError) as info:
        allocate(tiny(), driver=drv, trace=trace)
    assert info.value.cleanup_errors and "undo(s) failed, first: " in str(info.value)
    assert not drv.live().is_empty()
    events = _one_process_events(trace)
    actions = [e["action"] for e in events]
    assert "Abort" in actions and "AbortComplete" not in actions
    assert events[-1]["state"]["phase"] == "Aborting"


def test_the_pre_flight_counts_the_reserve() -> None:
    """allocate: a plan whose demand fits the budget exactly is refused with a reserve
    of one handle, before any driver call (mutant (prepare.py): the reserve was ignored)."""
    from kvgrant.layout.preflight import handle_demand
    from kvgrant.runtime import allocate

    g = tiny()
    plan = make_plan(g, "packed")
    demand = handle_demand(g, plan)
    drv = SimDriver(devices=2)
    with pytest.raises(HandleBudgetError, match="reserve"):
        allocate(g, plan=plan, driver=drv, budget=HandleBudget(handles=demand, reserve=1,
                                                               ledger=False))
    assert sum(drv.calls.values()) == 0
    allocate(g, plan=plan, driver=drv,
             budget=HandleBudget(handles=demand, reserve=0, ledger=False)).release()


def test_a_driver_query_that_fails_before_any_object_gives_the_ledger_share_back(
        tmp_path: Path) -> None:
    """allocate: the ledger share is taken before the driver is asked for free memory;
    when that query fails, the AllocationError says nothing was created and the share is
    gone from the ledger (mutant (prepare.py): the lease was kept until the process
    exited, refusing other allocations on the host)."""
    from kvgrant.errors import AllocationError
    from kvgrant.runtime import allocate

    ledger = HostLedger(tmp_path / "ledger.json")
    drv = SimDriver(devices=2, faults=Fault(call="cuMemGetInfo"))
    with pytest.raises(AllocationError, match="before anything was created"):
        allocate(tiny(), driver=drv, ledger=ledger)
    assert ledger.holders() == []
    assert drv.live().as_dict() == EMPTY


def test_release_closes_a_driver_kvgrant_opened(tmp_path: Path) -> None:
    """allocate / allocate_rank with a backend name open their own driver; release
    closes it (a CUDA driver gives its primary contexts back): later calls fail with
    CUDA_ERROR_DEINITIALIZED. A driver the caller passed stays open (mutant
    (published.py): an owned driver was never closed)."""
    from kvgrant.errors import DriverError
    from kvgrant.runtime import allocate

    pub = allocate(tiny(), backend="sim")
    pub.release()
    with pytest.raises(DriverError) as info:
        pub.driver.free_memory(0)
    assert info.value.result_name == "CUDA_ERROR_DEINITIALIZED"
    outs = run_threads(tiny(), [None, None], backend="sim")
    assert all(isinstance(o, GroupPublished) for o in outs), outs
    release_all(outs)
    for o in outs:
        with pytest.raises(DriverError, match="CUDA_ERROR_DEINITIALIZED"):
            o.driver.free_memory(0)
    given = SimDriver(devices=2)
    allocate(tiny(), driver=given).release()
    assert given.free_memory(0)[0] > 0


# ------------------------------------------- set-up that cannot open its driver (group.py)
def test_a_rank_whose_driver_cannot_be_opened_votes_failed_and_says_why(
        tmp_path: Path) -> None:
    """Every rank opens the sim against a host pool made with another budget: opening
    the driver fails in the set-up. Each rank traces the failed Reserve, the group
    aborts, and the error names the pool and the budgets (was: ``assert driver is not
    None`` in the worker, an AssertionError with an empty message on every rank)."""
    from kvgrant.runtime.options import Backend

    pool = tmp_path / "pool"
    SimDriver(devices=2, host_pool=pool).close()          # made with the default budget
    backend = Backend("sim", {"host_pool": str(pool), "handle_budget": 100_000})
    outs = run_threads(tiny(), [None, None], tmp_path, backend=backend)
    for r, e in enumerate(outs):
        assert isinstance(e, GroupError), (r, e)
        assert "was made with budget 523,880, not 100,000" in str(e), e
        assert f"rank {r} failed before start-up: LedgerError" in str(e), e
    summary = conforms(tmp_path, 2)
    assert "r0 Aborted" in summary and "r1 Aborted" in summary, summary
    header = json.loads((tmp_path / "rank0.ndjson").read_text().splitlines()[0])
    assert header["backend"] == "sim", header


# ------------------------------------------- counts and time stamps (engine.py, group.py)
def _alias_mappings(drv: SimDriver) -> int:
    """Live mappings that map memory already mapped once in this driver: every
    allocation has one plane mapping and at most one alias mapping of the same memory."""
    maps = [m for r in drv._res.values() for m in r.maps.values()]
    return len(maps) - len({id(m.phys) for m in maps})


def _counts_are_the_driver_calls(counts: Any, drv: SimDriver) -> None:
    assert counts.reservations == drv.calls["cuMemAddressReserve"]
    assert counts.mappings == drv.calls["cuMemMap"] == drv.live().mappings
    assert counts.set_access_calls == drv.calls["cuMemSetAccess"]
    assert counts.alias_mappings == _alias_mappings(drv) > 0
    assert counts.grants == drv.live().grants


def test_one_process_counts_are_the_calls_the_driver_saw() -> None:
    """allocate: every figure of ``counts`` is what the driver was asked to do, counted
    by the simulated driver itself (mutants (engine.py): ``set_access_calls`` and
    ``alias_mappings`` were asserted nowhere; a wrong formula passed)."""
    from kvgrant.runtime import allocate

    from tests.runtime._small import chunk_plan, small_geometry

    g = small_geometry()
    drv = SimDriver(devices=3)
    with allocate(g, plan=chunk_plan(g), driver=drv) as pub:
        assert pub.counts.allocations == drv.calls["cuMemCreate"] == drv.live().handles
        _counts_are_the_driver_calls(pub.counts, drv)
        assert pub.summary()["counts"] == pub.counts.as_dict()


@pytest.mark.parametrize("layout", ["tiny", "small"])
def test_each_group_ranks_counts_are_the_calls_its_driver_saw(tmp_path: Path,
                                                              layout: str) -> None:
    """A published group rank's ``counts``, own and imported objects together, are the
    calls its own driver saw (mutants (group.py): ``set_access_calls`` and
    ``alias_mappings`` were asserted nowhere; "small" has an owner-only region, whose
    aliases an importer does not map: a count of every alias passed on "tiny")."""
    from tests.runtime._small import small_geometry

    g = tiny() if layout == "tiny" else small_geometry()
    n = g.topology.ranks
    drivers = [SimDriver(devices=n) for _ in range(n)]
    outs = run_threads(g, drivers, tmp_path)
    try:
        assert all(isinstance(o, GroupPublished) for o in outs), outs
        for o, drv in zip(outs, drivers):
            # own allocations are created, imported ones come from shareable handles
            assert o.counts.allocations == (drv.calls["cuMemCreate"]
                                            + drv.calls["cuMemImportFromShareableHandle"])
            _counts_are_the_driver_calls(o.counts, drv)
    finally:
        release_all(outs)


def _ticking_clock(monkeypatch: Any) -> None:
    """Every clock reading one second after the last, so that two events stamped with
    one reading show up as equal times."""
    import itertools

    from kvgrant.runtime import engine, trace

    tick = itertools.count(1000)
    monkeypatch.setattr(trace, "clock", lambda: float(next(tick)))
    monkeypatch.setattr(engine, "clock", lambda: float(next(tick)))


@pytest.mark.parametrize("fault", [None, "cuMemSetAccess"])
def test_each_event_of_a_one_process_trace_has_its_own_time(
        tmp_path: Path, monkeypatch: Any, fault: str | None) -> None:
    """allocate: the events of one allocation (Create, Map, MapAlias, the grants) are
    written from packed entries; each keeps the clock reading taken when it happened,
    so times rise strictly along the trace, also for the events of an allocation that
    failed half-way (mutant (trace_render.py): every event of an entry got its Create's
    time)."""
    from kvgrant.errors import AllocationError
    from kvgrant.runtime import allocate

    from tests.runtime._small import chunk_plan, small_geometry

    _ticking_clock(monkeypatch)
    g = small_geometry()
    path = tmp_path / "t.ndjson"
    plan = chunk_plan(g)
    if fault is None:
        with allocate(g, plan=plan, driver=SimDriver(devices=3), trace=path):
            pass
    else:  # the 4th cuMemSetAccess fails: its allocation's earlier events are packed
        with pytest.raises(AllocationError):
            allocate(g, plan=plan, driver=SimDriver(devices=3, faults=Fault(nth=4, call=fault)),
                     trace=path)
    events = _one_process_events(path)
    alloc_events = [e for e in events if e["action"] in ("Create", "Map", "MapAlias", "Grant")]
    assert len(alloc_events) >= 4
    times = [e["t"] for e in events]
    assert all(a < b for a, b in zip(times, times[1:])), times


# ====================================== a third batch (2026-12-07): boundaries and fields
def test_release_failure_text_says_more_only_past_five() -> None:
    """transaction.release_failure_text lists at most 5 failures and says how many more:
    exactly 5 say no "more", 6 say "and 1 more" (mutant: ``>= 5`` wrote "and 0 more")."""
    from kvgrant.runtime.transaction import release_failure_text

    for n, tail in ((5, None), (6, "; and 1 more;")):
        errs = [RuntimeError(f"e{i}") for i in range(n)]
        errs[0].cleanup_errors = errs[1:]  # type: ignore[attr-defined]
        text = release_failure_text(errs[0], {"handles": 1})
        assert f"{n} undo step(s) failed" in text and "RuntimeError: e4" in text
        assert "RuntimeError: e5" not in text
        assert (tail in text) if tail else ("more" not in text), text


def test_a_transaction_left_without_commit_raises_the_first_undo_that_failed() -> None:
    """Transaction.__exit__ with no exception and two failing undos raises the first
    that ran (the newest); mutant: the last one, which hid the first failure."""
    from kvgrant.runtime.transaction import Transaction

    def bad(name: str) -> None:
        raise RuntimeError(name)

    txn = Transaction()
    with pytest.raises(RuntimeError) as info:
        with txn:
            txn.push(bad, "older")
            txn.push(bad, "newer")
    assert str(info.value) == "newer"


def test_a_failed_allocation_reports_free_bytes_not_the_total() -> None:
    """allocate: AllocationError.free_before / free_after are cuMemGetInfo's *free*
    bytes; with another process's memory on device 0 they are below the total (mutant:
    the total was read, which equals free only on an empty device)."""
    from kvgrant.errors import AllocationError
    from kvgrant.runtime import allocate

    from tests.runtime._small import chunk_plan, small_geometry

    g = small_geometry()
    other = 1 << 30
    drv = SimDriver(devices=3, used_by_others={0: other}, faults=[Fault(call="cuMemMap", nth=5)])
    free0, total0 = drv.free_memory(0)
    assert free0 == total0 - other
    with pytest.raises(AllocationError) as info:
        allocate(g, plan=chunk_plan(g), driver=drv)
    assert info.value.free_before[0] == info.value.free_after[0] == free0


def test_row_va_refuses_the_row_past_the_last() -> None:
    """Published.row_va / row: rows are 0..rows-1; the row just past the last is an
    ArgumentError, not an address outside the region (mutant: ``rows + 1`` as bound)."""
    from kvgrant.errors import ArgumentError
    from kvgrant.runtime import allocate

    from tests.runtime._small import chunk_plan, small_geometry

    g = small_geometry()
    with allocate(g, plan=chunk_plan(g), driver=SimDriver(devices=3)) as pub:
        for reg in g.regions:
            last = pub.row_va(0, reg.name, reg.rows - 1)
            assert last + reg.row_bytes <= pub.region_va[0][reg.name] + g.region_bytes(reg.name)
            for call in (pub.row_va, pub.row):
                with pytest.raises(ArgumentError) as info:
                    call(0, reg.name, reg.rows)
                assert info.value.argument == "row"


def test_fit_pages_names_the_lowest_device_of_a_tie() -> None:
    """capacity.fit_pages: among devices with the same budget the lowest ordinal is the
    one named (mutant: the highest), so the message does not depend on dict order."""
    from kvgrant.errors import PlanError
    from kvgrant.runtime.capacity import fit_pages

    from tests.runtime._small import small_geometry

    for free in ({0: 1 << 20, 1: 1 << 20}, {1: 1 << 20, 0: 1 << 20}):
        with pytest.raises(PlanError) as info:
            fit_pages(small_geometry(), free)
        assert "device 0" in str(info.value) and "device 1" not in str(info.value)


def test_a_unitless_memory_limit_of_exactly_one_mib_is_a_size() -> None:
    """parse_memory_limit: a unitless count must be 0 or at least 1 MiB (1,048,576);
    exactly 1 MiB is a size, one byte less is refused (mutant: ``<=`` refused 1 MiB)."""
    from kvgrant.errors import ArgumentError
    from kvgrant.runtime.capacity import MIN_UNITLESS_BYTES, parse_memory_limit

    assert MIN_UNITLESS_BYTES == 1 << 20
    assert parse_memory_limit("1048576").cap == parse_memory_limit("1MiB").cap == 1 << 20
    with pytest.raises(ArgumentError):
        parse_memory_limit("1048575")


def test_the_sim_creates_exactly_the_free_bytes() -> None:
    """SimDriver.create: an allocation of exactly the free bytes fits (free is then 0);
    one granule more is CUDA_ERROR_OUT_OF_MEMORY (mutant: ``>=`` refused the exact
    fit)."""
    from kvgrant.errors import DriverError

    drv = SimDriver(devices=1, memory_per_device=4 * G)
    h = drv.create(4 * G, 0)
    assert drv.free_memory(0)[0] == 0
    drv.release(h)
    with pytest.raises(DriverError) as info:
        drv.create(5 * G, 0)
    assert info.value.result_name == "CUDA_ERROR_OUT_OF_MEMORY"


def test_unmapping_a_one_device_mapping_gives_its_grant_back_to_the_pool(tmp_path: Path) -> None:
    """A pooled SimDriver: unmapping a mapping granted to one device gives that grant
    back to the host pool at once (mutant: only mappings of 2+ grants did, so a group
    rank's pool share leaked until its process ended)."""
    from kvgrant.runtime.hostpool import HostPool

    pool = HostPool(tmp_path / "pool", 10)
    drv = SimDriver(devices=2, host_pool=pool, handle_budget=10)
    va = drv.reserve(2 * G, G)
    h = drv.create(2 * G, 0)
    drv.map(va, 2 * G, h)
    drv.set_access(va, 2 * G, [0])
    assert pool.total() == 1
    drv.unmap(va, 2 * G)
    assert pool.total() == 0
    drv.release(h)
    drv.free_address(va, 2 * G)
    drv.close()
    assert pool.total() == 0


def test_the_pool_admits_the_whole_budget_once_a_dead_holder_is_reaped(tmp_path: Path) -> None:
    """HostPool.take: a process that died holding grants is reaped, and then exactly
    the whole budget fits (mutant: ``>=`` after the reap refused an exact fit)."""
    import subprocess
    import sys

    from kvgrant.runtime.hostpool import HostPool

    path = tmp_path / "pool"
    pool = HostPool(path, 10)
    # a holder in another process that ends without giving its 4 back
    subprocess.run([sys.executable, "-c", "import sys; from kvgrant.runtime.hostpool import "
                    "HostPool; assert HostPool(sys.argv[1], 10).take(4)[0]", str(path)],
                   check=True, timeout=120)
    assert pool.take(10)[0] is True
    assert pool.total() == 10


def test_an_unchecked_resize_stops_a_holder_from_binding_others(tmp_path: Path) -> None:
    """HostLedger: a holder resized with the pre-flight off is recorded unchecked, so
    its small budget no longer binds later holders (mutant: it kept ``checked``, and a
    later reserve under a larger budget was refused naming it)."""
    book = HostLedger(tmp_path / "ledger.json", lock_timeout_s=5.0)
    lease = book.reserve(10, geometry="g", label="packed", budget=20, reserve=0)
    try:
        lease.resize(15, check=False)
        assert lease.holder.checked is False
        assert [h.checked for h in book.holders()] == [False]
        book.reserve(900, geometry="g", label="packed", budget=1000, reserve=0).release()
    finally:
        lease.release()


def test_a_group_abort_keeps_every_failed_undo_and_the_live_counts_at_the_failure(
        tmp_path: Path) -> None:
    """Rank 1's third cuMemMap fails and both cuMemUnmaps of its unwinding fail:
    GroupError.cleanup_errors holds both, the first Unmap first (then the
    cuMemAddressFree that the leaked mappings make fail), as many as the message
    counts, and GroupError.live is what was live when the step failed (mutants
    (group.py ``_abort``): the first undo failure dropped; ``live`` read after the
    unwinding)."""
    drivers = [SimDriver(devices=2), SimDriver(devices=2, faults=[
        Fault(nth=3, call="cuMemMap"), Fault(nth=1, call="cuMemUnmap"),
        Fault(nth=2, call="cuMemUnmap")])]
    outs = run_threads(tiny(), drivers, tmp_path)
    assert all(isinstance(o, GroupError) for o in outs), outs
    err = outs[1]
    n = len(err.cleanup_errors)
    assert f"; {n} undo(s) failed, first: {err.cleanup_errors[0]}" in str(err)
    assert [e.call for e in err.cleanup_errors] == ["cuMemUnmap", "cuMemUnmap",
                                                    "cuMemAddressFree"]
    live = err.live if isinstance(err.live, dict) else err.live.as_dict()
    assert (live["handles"], live["mappings"], live["reservations"]) == (2, 2, 1), live


def test_a_reason_every_rank_shares_is_said_once_with_its_ranks() -> None:
    """A limit every rank hits (RLIMIT_NOFILE) made each rank's GroupError list the same
    reason once per rank; now one part names the ranks, root causes keep their order."""
    from kvgrant.runtime.group import _failed_parts

    failed = {2: "root cause", **{r: "same limit" for r in (0, 1, 3, 4, 5)}, 7: "other"}
    assert _failed_parts(failed) == ["rank 2 failed: root cause",
                                     "ranks 0, 1, 3, 4, 5 failed: same limit",
                                     "rank 7 failed: other"]
    assert _failed_parts({r: "x" for r in range(16)}) == ["ranks 0..15 failed: x"]
    assert _failed_parts({}) == []
