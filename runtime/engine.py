"""The allocation engine: every rank's driver steps, their undos, and their trace events.

Why apart from :mod:`kvgrant.runtime.allocator`: preparing an attempt (plan, pre-flight,
ledger, capacity) is decided before any driver object exists; this module is what runs
between the first ``Reserve`` and ``Publish`` (or the last undo of ``Abort``), and on
shutdown. Its loop is tracing's hot path: one packed entry per allocation, which the
renderer expands with line templates made once per (rank, action, phase, flags)
(docs/allocator.md "Traces").
"""

from __future__ import annotations

from typing import Any, Mapping, NoReturn, Sequence

from kvgrant.errors import AllocationError, DriverError
from kvgrant.layout.geometry import Geometry
from kvgrant.layout.plan import Allocation, PhysicalPlan
from kvgrant.runtime.driver import Driver
from kvgrant.runtime.interrupts import DeferredInterrupt
from kvgrant.runtime.published import Counts
from kvgrant.runtime.trace import ALLOC_ENTRY, TraceWriter, alloc_spec, clock
from kvgrant.runtime.transaction import Teardown, Transaction, attach_cleanup_errors
from kvgrant.traceformat import (ACTIONS, LIFECYCLE_VERSION, args_alloc, args_grant, encode_json,
                                 args_unmap, event_template, plan_header, state_template,
                                 state_text)

__all__ = ["Engine", "StepFailed", "traced_shutdown", "va_layout"]


def traced_shutdown(run: Any, teardown: Teardown) -> list[BaseException]:
    """Shutdown of a published attempt (one process's engine or a group rank's run):
    ``Unpublish``, the committed undos, ``ShutdownComplete`` when none failed; the trace
    is closed on every path. Returns the undos that failed (the rest still ran)."""
    try:
        run.phase = "ShuttingDown"
        run._group("Unpublish")
        errors: list[BaseException] = teardown.run()
        if not errors:
            run.phase = "Shutdown"
            run._group("ShutdownComplete")
    finally:
        run.trace.close()
    return errors


def allocation_target(a: Allocation, mapping: str) -> tuple[str, tuple[int, int]]:
    """What one mapping of ``a`` covers: ``("plane 'kv'", (lo, hi))`` for its plane
    mapping, its region and region bytes for its ``"alias"`` mapping. Failure messages
    and trace events of both runtimes (one process, one process per rank) name it."""
    if mapping == "alias":
        assert a.region is not None and a.region_offset is not None
        return (f"region {a.region!r}", (a.region_offset, a.region_offset + a.length))
    return (f"plane {a.plane!r}", (a.plane_offset, a.plane_offset + a.length))


def allocation_target_text(a: Allocation, mapping: str) -> str:
    """``plane 'kv' bytes [0x0, 0x200000)``: what a failed step acted on."""
    what, (lo, hi) = allocation_target(a, mapping)
    return f"{what} bytes [{lo:#x}, {hi:#x})"


def va_layout(g: Geometry) -> tuple[dict[str, int], dict[str, int], int]:
    """A rank's VA layout (docs/INTERFACES.md): planes then regions, in geometry order,
    at G-aligned offsets; returns (plane offsets, region offsets, bytes to reserve).
    The group runtime reserves one such slot per rank it maps."""
    off = 0
    plane_off: dict[str, int] = {}
    for p in g.planes:
        plane_off[p.name] = off
        off += g.plane_bytes(p.name)
    region_off: dict[str, int] = {}
    for reg in g.regions:
        region_off[reg.name] = off
        off += g.region_bytes(reg.name)
    return plane_off, region_off, off

_OK = "CUDA_SUCCESS"
_ALLOC = args_alloc()
_GIB = float(1 << 30)


class _Rank:
    """Per-rank abstract state (the model's counters) plus what unwinding needs."""

    __slots__ = ("rank", "device", "va", "created", "mapped", "alias_mapped", "grants",
                 "ready", "failed", "plane_grants", "alias_grants", "base", "size")

    def __init__(self, rank: int, device: int, allocs: int) -> None:
        self.rank = rank
        self.device = device
        self.va = False
        self.created = 0
        self.mapped = 0
        self.alias_mapped = 0
        self.grants = 0
        self.ready = False
        self.failed = False
        self.plane_grants = [0] * allocs   # devices granted on each plane mapping
        self.alias_grants = [0] * allocs
        self.base = 0
        self.size = 0

    def state(self, phase: str) -> str:
        """The model's counters after an event, JSON-encoded."""
        return state_text(phase, self.va, self.created, self.mapped, self.alias_mapped,
                          self.grants, self.ready, self.failed)


class StepFailed(Exception):
    """A driver step failed; carries where, for the AllocationError."""

    def __init__(self, cause: DriverError, rank: int, device: int, call: str, target: str,
                 byte_range: tuple[int, int] | None, va: int | None, size: int | None) -> None:
        super().__init__(str(cause))
        self.cause = cause
        self.rank = rank
        self.device = device
        self.call = call
        self.target = target
        self.byte_range = byte_range
        self.va = va
        self.size = size



def _fmt_free(free: Mapping[int, int]) -> str:
    return "{" + ", ".join(f"{d}: {n / _GIB:.2f} GiB" for d, n in sorted(free.items())) + "}"



class Engine:
    """One allocation attempt: the driver steps, their undos and their trace events.

    :func:`kvgrant.runtime.allocator.allocate` prepares (plan, pre-flight, capacity),
    then runs :meth:`build` inside a :class:`Transaction` and :meth:`publish`, or
    :meth:`abort`; the published cache calls :meth:`shutdown`. Tests derive mutants from
    this class (tests/runtime/mutant_engines.py) to show the conformance checker rejects
    their traces; the production loop has no test switches. ``declared`` grants every
    declared reader instead of owner + importers: the field behaviour, kept to show that
    the checker rejects it.
    """

    def __init__(self, g: Geometry, plan: PhysicalPlan, driver: Driver, devices: Sequence[int],
                 trace: TraceWriter, *, declared: bool = False) -> None:
        self.g = g
        self.plan = plan
        self.allocs: tuple[Allocation, ...] = plan.allocations
        self.driver = driver
        self.devices = list(devices)
        self.trace = trace
        # the trace's hot path: one tuple per event (see TraceWriter.recorder)
        self._record = trace.recorder() if trace.enabled else None
        # Reserve events wait here for the header, which needs every rank's base
        self._pending: list[tuple[Any, ...]] = []
        self._t0: float | None = None
        self.ranks = [_Rank(r, d, len(self.allocs)) for r, d in enumerate(self.devices)]
        self.phase = "Allocating"
        # trace-line templates by (rank, key, phase, va, ready, failed): see _tpl
        self._tpls: dict[tuple[Any, ...], str] = {}
        # the rank whose driver step an interruption stopped (traced as its Fail)
        self._interrupted_rank: int | None = None
        # a Ctrl-C held back until the next allocation boundary (run_transaction arms it)
        self.interrupt = DeferredInterrupt()
        # trace-template keys of alias grants, one per region
        self.alias_key = {reg.name: "Grant alias:" + reg.name for reg in g.regions}
        self.plane_off, self.region_off, self.reserve_bytes = va_layout(g)
        # the header's fields, built before the timed start-up (the plan part is large);
        # only the reservations' bases are filled in once every rank has reserved
        self._header: dict[str, Any] | None = None
        self._header_rest = ""
        if trace.enabled:
            fields = self._header_fields()
            late = ("ranks", "allocs", "reservations")  # written as dict fields
            self._header = {k: fields[k] for k in late}
            self._header_rest = encode_json({k: v for k, v in fields.items() if k not in late})
        self.G = g.granularity
        # CUDA ordinals each mapping is granted to: [rank][region or None]
        self.grant_plane: list[list[int]] = []
        self.grant_region: list[dict[str, list[int]]] = []
        for r in range(len(self.devices)):
            self.grant_plane.append(sorted(self.devices[x] for x in
                                           g.granted_devices(r, declared=declared)))
            self.grant_region.append({
                reg.name: sorted(self.devices[x] for x in
                                 g.granted_devices(r, reg.name, declared=declared))
                for reg in g.regions})

    # ------------------------------------------------------------------ tracing
    def _header_fields(self) -> dict[str, Any]:
        """The version-2 header: the plan, each rank's reservation and the topology,
        from which the checkers derive importers (kvgrant.traceformat)."""
        g = self.g
        return dict(
            ranks=len(self.devices), allocs=len(self.allocs),
            **plan_header(g, self.allocs, self.plane_off, self.region_off, self.reserve_bytes,
                          {st.rank: None for st in self.ranks}),
            geometry=g.name, plan=self.plan.label, backend=getattr(self.driver, "name", "?"),
            devices={str(r): d for r, d in enumerate(self.devices)})

    def header(self) -> None:
        """Write the header once every rank reserved (see :meth:`reserve_all`), with the
        reservations' bases filled in, then the Reserve events recorded before it. The
        header is shipped, not waited for: formatting stays off the start-up's path."""
        if not self.trace.enabled or self.trace.header_written or self._header is None:
            return
        fields = self._header
        fields["reservations"] = {str(st.rank): [st.base if st.va else None,
                                                 self.reserve_bytes] for st in self.ranks}
        self.trace.header(version=LIFECYCLE_VERSION, t0=self._t0, wait=False,
                          encoded=self._header_rest, **fields)
        for rec in self._pending:  # the Reserve events recorded before the header
            self._record(rec)  # type: ignore[misc]
        self._pending.clear()

    def setup_failed(self, rank: int, call: str, result: str) -> None:
        """A driver query of the preparation (:data:`kvgrant.traceformat.SETUP_CALLS`:
        the device count, a device's granularity or free memory) failed before any rank
        reserved: trace it as rank ``rank``'s failed ``Reserve`` naming that query, the
        model's ``Fail(r, "Reserve")`` (nothing was made, as a group rank traces its
        failed set-up), then ``Abort`` naming the rank and ``AbortComplete``; close the
        trace. Why: the trace the user asked for was never written, so the failure
        was in no trace at all."""
        if self.trace.enabled:
            st = self.ranks[rank]
            st.failed = True
            self._t0 = clock()
            self.header()
            self._ev(st, "Reserve", "{}", call, result)
            self.phase = "Aborting"
            self._group("Abort", {"failed_rank": rank})
            self.phase = "Aborted"
            self._group("AbortComplete")
        self.trace.close()

    def _ev(self, st: _Rank, action: str, args: str, call: str | None,
            result: str | None, va: int | None = None, size: int | None = None,
            handle: int | None = None) -> None:
        """One rank event; ``args`` is already JSON (kvgrant.traceformat's args_*)."""
        self.trace.event_json(st.rank, action, args, call, result, st.state(self.phase),
                              device=st.device, va=va, size=size, handle=handle)

    def _tpl(self, st: _Rank, key: str) -> str:
        """The line template of a successful rank event (see event_template), for the
        rank's flags and the phase as they are now (cached under them).

        ``key`` is ``"Action"`` or ``"Action sub"`` (``Grant plane``, ``Grant
        alias:REGION``, ``Unmap plane``, ``Unmap alias``).
        """
        ck = (st.rank, key, self.phase, st.va, st.ready, st.failed)
        tpl = self._tpls.get(ck)
        if tpl is not None:
            return tpl
        action, _, sub = key.partition(" ")
        shape = ACTIONS[action]
        if action == "Grant":
            mapping, _, region = sub.partition(":")
            devs = self.grant_plane[st.rank] if mapping == "plane" else \
                self.grant_region[st.rank][region]
            args = args_grant(mapping, devs)
        elif action == "Unmap":
            args = args_unmap(sub)
        else:
            args = _ALLOC if "alloc" in shape.args else "{}"
        tpl = event_template(st.rank, action, args, shape.call,
                             None if shape.call is None else _OK, st.device,
                             "%d" if shape.va else "null", "%d" if shape.size else "null",
                             "%d" if shape.handle else "null",
                             state_template(self.phase, st.va, st.ready, st.failed))
        self._tpls[ck] = tpl
        return tpl

    def _rec(self, st: _Rank, key: str, *values: int) -> tuple[Any, ...]:
        """The record of a successful rank event: ``values`` are its alloc, va, size,
        handle (as shaped by kvgrant.traceformat.ACTIONS)."""
        return (self._tpl(st, key), clock(), *values, st.created, st.mapped,
                st.alias_mapped, st.grants)

    def _ok(self, st: _Rank, key: str, *values: int) -> None:
        """Trace a successful rank event (see :meth:`_rec`)."""
        self._record(self._rec(st, key, *values))  # type: ignore[misc]
        self.trace.ship_if_full()

    def _group(self, action: str, args: dict[str, Any] | None = None) -> None:
        if self.trace.enabled:
            self.header()  # an interruption before every rank reserved
            self.trace.event(None, action, args or {}, None, None, {"phase": self.phase})

    # ------------------------------------------------------------ failed steps
    def _fail(self, st: _Rank, err: BaseException, action: str, args: str, call: str,
              target: str, byte_range: tuple[int, int] | None, va: int | None,
              size: int | None, handle: int | None = None) -> StepFailed | None:
        """Trace step ``action`` of rank ``st`` as failed (the model's ``Fail``) and mark
        the rank failed. A driver error gives the StepFailed to raise; an interruption
        (KeyboardInterrupt, a bug) inside the step is traced the same way, with its
        exception's name as the result, since the step did not happen (the caller then
        re-raises it and :meth:`interrupted` aborts naming this rank)."""
        st.failed = True
        driver_err = isinstance(err, DriverError)
        if self.trace.enabled:
            self.header()
            self._ev(st, action, args, call,
                     err.result_name if driver_err else type(err).__name__,  # type: ignore[attr-defined]
                     va, size, handle)
        if not driver_err:
            self._interrupted_rank = st.rank
            return None
        return StepFailed(err, st.rank, st.device, call, target,  # type: ignore[arg-type]
                          byte_range, va, size)

    # --------------------------------------------------------------- forward
    def build(self, txn: Transaction) -> None:
        """Reserve every rank's VA, then every rank's allocations in order; raises
        StepFailed on the first failed driver step."""
        self.reserve_all(txn)
        for st in self.ranks:
            self._build_rank(st, txn)
            st.ready = True
            if self.trace.enabled:
                self._ok(st, "RankReady")

    def reserve_all(self, txn: Transaction) -> None:
        """``Reserve`` on every rank, then the header (it carries each rank's base),
        then the Reserve events (their times count from before the first reserve)."""
        d = self.driver
        size = self.reserve_bytes
        self._t0 = clock()
        for st in self.ranks:
            try:
                base = d.reserve(size, self.G, device=st.device)
            except BaseException as e:
                failed = self._fail(st, e, "Reserve", "{}", "cuMemAddressReserve",
                                    "reservation", (0, size), None, size)
                if failed is None:
                    raise
                raise failed from e
            st.va = True
            st.base = base
            st.size = size
            if self.trace.enabled:
                self._pending.append(self._rec(st, "Reserve", base, size))
            txn.push(self._undo_free, st, base, size)
        if self.trace.enabled:
            self.header()
            self.trace.ship_if_full()

    def _alloc_spec(self, st: _Rank) -> tuple[Any, ...]:
        """The trace's allocation spec of this rank as it is now (trace_render.alloc_spec):
        templates bake in the flags and the phase, which stay fixed through a rank's loop."""
        def tpl(key: str) -> str:
            return self._tpl(st, key)

        return alloc_spec(
            tpl("Create"), tpl("Map"), tpl("MapAlias"), tpl("Grant plane"),
            len(self.grant_plane[st.rank]),
            [(tpl(self.alias_key[reg.name]), len(self.grant_region[st.rank][reg.name]))
             for reg in self.g.regions])

    def _open_entries(self, st: _Rank, key: Any) -> bytearray:
        """Define rank ``st``'s allocation spec under ``key`` and open its entries."""
        self.trace.define_allocs(key, self._alloc_spec(st))
        return self.trace.alloc_entries(key)

    def _build_rank(self, st: _Rank, txn: Transaction) -> None:
        """Every allocation of one rank, in plan order: Create, Map, MapAlias, Grant
        (plane), Grant (alias); each undo pushed once its step succeeded.

        Tracing's hot path: one ``ALLOC_ENTRY`` packed per allocation (its handle, VAs,
        counters and the time of each event) into a bytearray of the record stream; the
        renderer expands it into the allocation's event lines (docs/allocator.md
        "Traces"). A step that fails, or an interruption, packs the events that
        happened first."""
        d = self.driver
        tr = self.trace.enabled
        r = st.rank
        dev = st.device
        base = st.base
        plane_va = {n: base + o for n, o in self.plane_off.items()}
        region_va = {n: base + o for n, o in self.region_off.items()}
        region_code = {reg.name: k + 1 for k, reg in enumerate(self.g.regions)}
        grant_plane = self.grant_plane[r]
        grant_region = self.grant_region[r]
        kp = len(grant_plane)
        key = r
        entries = bytearray()
        limit = 0
        pack = ALLOC_ENTRY.pack
        if tr:
            entries = self._open_entries(st, key)
            limit = self.trace.entries_limit
        push = txn.push
        undo_unmap = self._undo_unmap
        interrupt = self.interrupt
        for i, a in enumerate(self.allocs):
            n = a.length
            region = a.region
            pva = plane_va[a.plane] + a.plane_offset
            ava = 0 if region is None else \
                region_va[region] + a.region_offset  # type: ignore[operator]
            done = h = 0
            t1 = t2 = t3 = t4 = t5 = 0.0
            try:
                if interrupt.pending:  # a held-back Ctrl-C: this Create does not happen
                    raise KeyboardInterrupt
                h = d.create(n, dev)
                st.created += 1
                push(self._undo_release, st, i, h)
                done = 1
                if tr:
                    t1 = clock()
                d.map(pva, n, h)
                st.mapped += 1
                push(undo_unmap, st, i, "plane", pva, n)
                done = 2
                if tr:
                    t2 = clock()
                if region is not None:
                    d.map(ava, n, h)
                    st.alias_mapped += 1
                    push(undo_unmap, st, i, "alias", ava, n)
                    done = 3
                    if tr:
                        t3 = clock()
                d.set_access(pva, n, grant_plane)
                st.grants += kp
                st.plane_grants[i] = kp
                done += 1
                if region is not None:
                    if tr:
                        t4 = clock()
                    devs = grant_region[region]
                    d.set_access(ava, n, devs)
                    st.grants += len(devs)
                    st.alias_grants[i] = len(devs)
                    done = 5
                    if tr:
                        t5 = clock()
                elif tr:
                    t3 = clock()
            except BaseException as e:
                if tr:  # the events that happened, then the failed one
                    entries += pack(0 if region is None else region_code[region], done, i, h,
                                    pva, ava, n, st.created, st.mapped, st.alias_mapped,
                                    st.grants, t1, t2, t3, t4, t5)
                failed = self._step_failed(st, e, i, a, done, h, pva, ava)
                if failed is None:
                    raise
                raise failed from e
            if tr:
                entries += pack(0 if region is None else region_code[region], done, i, h,
                                pva, ava, n, st.created, st.mapped, st.alias_mapped, st.grants,
                                t1, t2, t3, t4, t5)
                if len(entries) >= limit:
                    entries = self.trace.ship_entries(key)

    def _step_failed(self, st: _Rank, e: BaseException, i: int, a: Allocation, done: int,
                     h: int, pva: int, ava: int) -> StepFailed | None:
        """:meth:`_fail` for allocation ``i``'s step after the ``done`` that succeeded."""
        steps = ("Create", "Map", "MapAlias", "Grant plane", "Grant alias") \
            if a.region is not None else ("Create", "Map", "Grant plane")
        step = steps[done]
        n = a.length
        if step == "Create":
            return self._fail(st, e, "Create", _ALLOC % i, "cuMemCreate",
                              *allocation_target(a, "plane"), None, n)
        if step in ("Map", "MapAlias"):
            mapping, va = ("plane", pva) if step == "Map" else ("alias", ava)
            return self._fail(st, e, step, _ALLOC % i, "cuMemMap",
                              *allocation_target(a, mapping), va, n, h)
        mapping, va = ("plane", pva) if step == "Grant plane" else ("alias", ava)
        devs = self.grant_plane[st.rank] if mapping == "plane" else \
            self.grant_region[st.rank][a.region]  # type: ignore[index]
        return self._fail(st, e, "Grant", args_grant(mapping, devs, i), "cuMemSetAccess",
                          *allocation_target(a, mapping), va, n)

    # --------------------------------------------------------------- undos
    def _undo_free(self, st: _Rank, va: int, size: int) -> None:
        try:
            self.driver.free_address(va, size)
        except DriverError as e:
            e.locate(st.rank)  # (its byte range is the VA range it names)
            if self.trace.enabled:
                self._ev(st, "Free", "{}", "cuMemAddressFree", e.result_name, va, size)
            raise
        st.va = False
        st.ready = False
        if self.trace.enabled:
            self._ok(st, "Free", va, size)

    def _undo_release(self, st: _Rank, i: int, handle: int) -> None:
        try:
            self.driver.release(handle)
        except DriverError as e:
            e.locate(st.rank, allocation_target_text(self.allocs[i], "plane"))
            if self.trace.enabled:
                self._ev(st, "Release", _ALLOC % i, "cuMemRelease", e.result_name,
                         handle=handle)
            raise
        st.created -= 1
        if self.trace.enabled:
            self._ok(st, "Release", i, handle)

    def _undo_unmap(self, st: _Rank, i: int, mapping: str, va: int, n: int) -> None:
        try:
            self.driver.unmap(va, n)
        except DriverError as e:
            e.locate(st.rank, allocation_target_text(self.allocs[i], mapping))
            if self.trace.enabled:
                self._ev(st, "Unmap", args_unmap(mapping, i), "cuMemUnmap", e.result_name, va, n)
            raise
        if mapping == "plane":
            st.mapped -= 1
            st.grants -= st.plane_grants[i]
            st.plane_grants[i] = 0
        else:
            st.alias_mapped -= 1
            st.grants -= st.alias_grants[i]
            st.alias_grants[i] = 0
        if self.trace.enabled:
            self._ok(st, "Unmap plane" if mapping == "plane" else "Unmap alias", i, va, n)

    # --------------------------------------------------------------- results
    def counts(self) -> Counts:
        n = len(self.ranks)
        A = len(self.allocs)
        aliased = sum(1 for a in self.allocs if a.region is not None)
        grants = sum(st.grants for st in self.ranks)
        return Counts(ranks=n, reservations=n, allocations=n * A, mappings=n * (A + aliased),
                      alias_mappings=n * aliased, set_access_calls=n * (A + aliased),
                      grants=grants)

    # -------------------------------------------------------------- group steps
    def publish(self) -> None:
        """Every rank is ready: publish (the trace's ``Publish``)."""
        self.phase = "Published"
        self._group("Publish")

    def interrupted(self, txn: Transaction, err: BaseException) -> None:
        """Something other than a driver error stopped the build (``KeyboardInterrupt``,
        a bug): unwind the same way and let it go on. Inside a driver step it was traced
        as that step's ``Fail`` and ``Abort`` names the rank; elsewhere (between steps,
        outside any rank's loop) ``Abort`` names no rank."""
        self.phase = "Aborting"
        self._group("Abort", {"failed_rank": self._interrupted_rank})
        errors = txn.rollback()
        if not errors:
            self.phase = "Aborted"
            self._group("AbortComplete")
        self.trace.close()
        attach_cleanup_errors(err, errors)

    def shutdown(self, teardown: Teardown) -> list[BaseException]:
        """``Unpublish``, the committed undo stack (LIFO), ``ShutdownComplete``;
        returns the undos that failed (the rest still ran)."""
        return traced_shutdown(self, teardown)

    def plane_vas(self) -> list[dict[str, int]]:
        """[rank][plane] -> VA of the plane."""
        return [{p: st.base + o for p, o in self.plane_off.items()} for st in self.ranks]

    def region_vas(self) -> list[dict[str, int]]:
        """[rank][region] -> VA of its row 0."""
        return [{r: st.base + o for r, o in self.region_off.items()} for st in self.ranks]

    def abort(self, txn: Transaction, f: StepFailed, free_before: dict[int, int],
              owns: bool) -> NoReturn:
        """Unwind every rank after a failed step and raise the AllocationError."""
        driver = self.driver
        live_at_failure = driver.live().as_dict()
        self.phase = "Aborting"
        self._group("Abort", {"failed_rank": f.rank})
        errors = txn.rollback()
        if not errors:
            self.phase = "Aborted"
            self._group("AbortComplete")
        self.trace.close()
        query_error: DriverError | None = None
        try:
            free_after: dict[int, int] = {d: driver.free_memory(d)[0] for d in self.devices}
        except DriverError as e:
            query_error = e  # a query, not an undo: said apart, not in cleanup_errors
            free_after = {}
        live_after = driver.live()
        if owns:
            driver.close()
        e = f.cause
        lo, hi = f.byte_range if f.byte_range else (0, 0)
        where = f"va {f.va:#x}+{f.size:#x}" if f.va is not None else f"size {f.size:#x}" \
            if f.size is not None else "no va"
        live_txt = ", ".join(f"{k}={v}" for k, v in live_at_failure.items())
        after_txt = "nothing left" if live_after.is_empty() else ", ".join(
            f"{k}={v}" for k, v in live_after.as_dict().items())
        msg = (f"{f.call} failed with {e.result_name} on rank {f.rank} (device {f.device}): "
               f"{f.target} bytes [{lo:#x}, {hi:#x}) ({where}); live at failure: {live_txt}; "
               f"after unwinding: {after_txt}; free per device before: {_fmt_free(free_before)}, "
               f"after: {_fmt_free(free_after) if free_after else 'unknown'}; nothing was "
               f"published. Cause: {e}")
        if errors:
            msg += f"; {len(errors)} undo(s) failed, first: {errors[0]}"
        if query_error is not None:
            msg += f"; the free-memory query after the unwinding failed: {query_error}"
        if self.trace.error is not None:
            msg += f"; the trace is incomplete: writing it failed: {self.trace.error}"
        raise AllocationError(msg, cause=e, rank=f.rank, device=f.device, call=f.call,
                              result_name=e.result_name, target=f.target, byte_range=f.byte_range,
                              live=live_at_failure, free_before=free_before, free_after=free_after,
                              cleanup_errors=errors) from e
