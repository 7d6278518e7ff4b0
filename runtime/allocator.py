"""The transactional multi-rank allocator: all ranks of one host, one process.

:func:`allocate` turns a geometry and a physical plan into a published KV cache, or
into nothing at all:

1. Before any driver call: the plan is checked against the layout contract and its
   driver-handle demand against the per-process budget (pre-flight).
2. Capacity: free memory is measured and KV pages chosen to fit (``memory_limit``)
   before anything is created; a failure is never retried smaller.
3. One :class:`~kvgrant.runtime.transaction.Transaction` for the whole group: rank by
   rank ``Reserve``; per allocation in plan order ``Create``, ``Map``, ``MapAlias``,
   ``Grant`` (one ``cuMemSetAccess`` per mapping, owner + validated importers only);
   ``RankReady``. Each undo is pushed after its step's result is checked.
4. ``Publish`` only when every rank is ready. On any failure: the failed event, then
   ``Abort``, then every rank unwinds LIFO (aliases before their backing), then
   ``AbortComplete``, and :class:`~kvgrant.errors.AllocationError` names the call,
   rank, device, plane or region, byte range, CUresult, live counts and free memory.

Every transition is traced (docs/INTERFACES.md "Trace format") when tracing is on.
``inject_bug`` (tests only) makes the allocator commit one ordering bug, so the
conformance checker can be shown to reject it.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import IO, Any, Callable, Mapping, Sequence

from kvgrant.errors import AllocationError, DriverError, PlanError
from kvgrant.gc_pause import gc_paused
from kvgrant.layout.geometry import Geometry, load_geometry
from kvgrant.layout.plan import Allocation, PhysicalPlan
from kvgrant.runtime.capacity import MemoryLimit, fit_pages, parse_memory_limit
from kvgrant.runtime.driver import Driver, open_driver
from kvgrant.runtime.trace import TraceWriter, clock, event_template, open_trace
from kvgrant.runtime.transaction import Transaction, attach_cleanup_errors
from kvgrant.runtime.published import Capacity, Counts, Published

__all__ = ["Capacity", "Counts", "INJECT_BUGS", "Published", "allocate"]  # re-exported

#: Test-only ordering bugs (docs/INTERFACES.md "Test-only runtime mutants").
INJECT_BUGS = frozenset({"grant_declared_readers", "publish_early", "unmap_backing_first",
                         "skip_release", "map_before_create"})

_OK = "CUDA_SUCCESS"
_STATE = ('{"phase": "%s", "va": %s, "created": %d, "mapped": %d, "alias_mapped": %d, '
          '"grants": %d, "ready": %s, "failed": %s}')
_ALLOC = '{"alloc": %d}'
# action -> (driver call, has alloc, has va, has size): the shape of its trace line
_SHAPES: dict[str, tuple[str | None, bool, bool, bool]] = {
    "Reserve": ("cuMemAddressReserve", False, True, True),
    "Create": ("cuMemCreate", True, False, True),
    "Map": ("cuMemMap", True, True, True),
    "MapAlias": ("cuMemMap", True, True, True),
    "Grant": ("cuMemSetAccess", True, True, True),
    "RankReady": (None, False, False, False),
    "Free": ("cuMemAddressFree", False, True, True),
    "Release": ("cuMemRelease", True, False, False),
    "Unmap": ("cuMemUnmap", True, True, True),
}
_UNMAP = '{"alloc": %d, "mapping": "%s"}'
_GRANT = '{"alloc": %d, "mapping": "%s", "devices": %s}'
_GIB = float(1 << 30)


class _Rank:
    """Per-rank abstract state (the model's counters) plus what unwinding needs.

    ``tpls`` caches trace-line templates; they bake in the flags and the phase, so
    changing a flag (or the phase, see ``_Run.phase``) empties the cache.
    """

    __slots__ = ("rank", "device", "_va", "created", "mapped", "alias_mapped", "grants",
                 "_ready", "_failed", "plane_grants", "alias_grants", "base", "size", "tpls")

    def __init__(self, rank: int, device: int, allocs: int) -> None:
        self.rank = rank
        self.device = device
        self._va = False
        self.created = 0
        self.mapped = 0
        self.alias_mapped = 0
        self.grants = 0
        self._ready = False
        self._failed = False
        self.plane_grants = [0] * allocs   # devices granted on each plane mapping
        self.alias_grants = [0] * allocs
        self.base = 0
        self.size = 0
        self.tpls: dict[str, str] = {}

    @property
    def va(self) -> bool:
        return self._va

    @va.setter
    def va(self, value: bool) -> None:
        self._va = value
        self.tpls.clear()

    @property
    def ready(self) -> bool:
        return self._ready

    @ready.setter
    def ready(self, value: bool) -> None:
        self._ready = value
        self.tpls.clear()

    @property
    def failed(self) -> bool:
        return self._failed

    @failed.setter
    def failed(self, value: bool) -> None:
        self._failed = value
        self.tpls.clear()

    def state(self, phase: str) -> str:
        """The model's counters after an event, JSON-encoded (hot path of tracing)."""
        return _STATE % (phase, "true" if self.va else "false", self.created, self.mapped,
                         self.alias_mapped, self.grants, "true" if self.ready else "false",
                         "true" if self.failed else "false")


class _StepFailed(Exception):
    """Internal: a driver step failed; carries where, for the AllocationError."""

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


class _Run:
    """One allocation attempt: the engine behind :func:`allocate` and shutdown."""

    def __init__(self, g: Geometry, plan: PhysicalPlan, driver: Driver, devices: Sequence[int],
                 trace: TraceWriter, inject_bug: str | None) -> None:
        self.g = g
        self.plan = plan
        self.allocs: tuple[Allocation, ...] = plan.allocations
        self.driver = driver
        self.devices = list(devices)
        self.trace = trace
        # the trace's hot path: one tuple per event (see TraceWriter.recorder)
        self._record = trace.recorder() if trace.enabled else None
        self.bug = inject_bug
        self.ranks = [_Rank(r, d, len(self.allocs)) for r, d in enumerate(self.devices)]
        self._phase = "Allocating"
        # trace-template keys of alias grants, one per region
        self.alias_key = {reg.name: "Grant alias:" + reg.name for reg in g.regions}
        G = g.granularity
        # VA layout of a rank: planes then regions, geometry order, G-aligned offsets.
        off = 0
        self.plane_off: dict[str, int] = {}
        for p in g.planes:
            self.plane_off[p.name] = off
            off += g.plane_bytes(p.name)
        self.region_off: dict[str, int] = {}
        for reg in g.regions:
            self.region_off[reg.name] = off
            off += g.region_bytes(reg.name)
        self.reserve_bytes = off
        self.G = G
        declared = inject_bug == "grant_declared_readers"
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
    def header(self) -> None:
        if not self.trace.enabled:
            return
        g = self.g
        aliased = [i for i, a in enumerate(self.allocs) if a.region is not None]
        owner_only = [i for i in aliased
                      if g.region_by_name[self.allocs[i].region].access == "owner"]  # type: ignore[index]
        n = len(self.devices)
        self.trace.header(
            ranks=n, allocs=len(self.allocs), aliased=aliased, owner_only=owner_only,
            importers={str(r): list(g.importers(r)) for r in range(n)},
            declared_readers={str(r): list(g.declared_readers(r)) for r in range(n)},
            geometry=g.name, plan=self.plan.label, backend=getattr(self.driver, "name", "?"),
            devices={str(r): d for r, d in enumerate(self.devices)})

    def _ev(self, st: _Rank, action: str, args: str, call: str | None,
            result: str | None, va: int | None = None, size: int | None = None) -> None:
        """One rank event; ``args`` is already JSON (see the ``_ALLOC`` formats)."""
        self.trace.event_json(st.rank, action, args, call, result, st.state(self.phase),
                              device=st.device, va=va, size=size)

    @property
    def phase(self) -> str:
        return self._phase

    @phase.setter
    def phase(self, value: str) -> None:
        self._phase = value
        for st in self.ranks:  # templates bake the phase in
            st.tpls.clear()

    def _tpl(self, st: _Rank, key: str) -> str:
        """Build the line template of a successful rank event (see event_template).

        ``key`` is ``"Action"`` or ``"Action sub"`` (``Grant plane``, ``Grant
        alias:REGION``, ``Unmap plane``, ``Unmap alias``).
        """
        action, _, sub = key.partition(" ")
        call, has_alloc, has_va, has_size = _SHAPES[action]
        if action == "Grant":
            mapping, _, region = sub.partition(":")
            devs = self.grant_plane[st.rank] if mapping == "plane" else \
                self.grant_region[st.rank][region]
            args = '{"alloc": %d, "mapping": "' + mapping + '", "devices": ' + str(devs) + "}"
        elif action == "Unmap":
            args = '{"alloc": %d, "mapping": "' + sub + '"}'
        else:
            args = _ALLOC if has_alloc else "{}"

        def t(b: bool) -> str:
            return "true" if b else "false"

        state = ('{"phase": "' + self._phase + '", "va": ' + t(st.va) + ', "created": %d, '
                 '"mapped": %d, "alias_mapped": %d, "grants": %d, "ready": ' + t(st.ready)
                 + ', "failed": ' + t(st.failed) + "}")
        tpl = event_template(st.rank, action, args, call, None if call is None else _OK,
                             st.device, "%d" if has_va else "null",
                             "%d" if has_size else "null", state)
        st.tpls[key] = tpl
        return tpl

    def _tpl_of(self, st: _Rank) -> Callable[[str], str | None]:
        """``key -> template`` for this rank as it is now; None for every key when
        tracing is off (the templates bake in flags and phase: look up again after
        either changes)."""
        if not self.trace.enabled:
            return lambda key: None
        return lambda key: st.tpls.get(key) or self._tpl(st, key)

    def _ok(self, st: _Rank, key: str, *values: int) -> None:
        """Trace a successful rank event: ``values`` are its alloc, va, size (as shaped)."""
        tpl = st.tpls.get(key) or self._tpl(st, key)
        self._record((tpl, clock(), *values, st.created, st.mapped,  # type: ignore[misc]
                      st.alias_mapped, st.grants))
        self.trace.pump()

    def _group(self, action: str, args: dict[str, Any] | None = None) -> None:
        if self.trace.enabled:
            self.trace.event(None, action, args or {}, None, None, {"phase": self.phase})

    # ------------------------------------------------------------ failed steps
    def _fail(self, st: _Rank, err: DriverError, action: str, args: str, call: str,
              target: str, byte_range: tuple[int, int] | None, va: int | None,
              size: int | None) -> _StepFailed:
        st.failed = True
        if self.trace.enabled:
            self._ev(st, action, args, call, err.result_name, va, size)
        return _StepFailed(err, st.rank, st.device, call, target, byte_range, va, size)

    def _alloc_target(self, a: Allocation, mapping: str) -> tuple[str, tuple[int, int]]:
        if mapping == "alias":
            assert a.region is not None and a.region_offset is not None
            return (f"region {a.region!r}", (a.region_offset, a.region_offset + a.length))
        return (f"plane {a.plane!r}", (a.plane_offset, a.plane_offset + a.length))

    # --------------------------------------------------------------- forward
    def build(self, txn: Transaction) -> None:
        """Every rank, in order; raises _StepFailed on the first failed driver step."""
        last = len(self.ranks) - 1
        for st in self.ranks:
            self._build_rank(st, txn)
            if self.bug == "publish_early" and st.rank == last:
                self.phase = "Published"
                self._group("Publish")
            st.ready = True
            if self.trace.enabled:
                self._ok(st, "RankReady")

    def _build_rank(self, st: _Rank, txn: Transaction) -> None:
        d = self.driver
        tr = self.trace.enabled
        r = st.rank
        dev = st.device
        size = self.reserve_bytes
        try:
            base = d.reserve(size, self.G, device=dev)
        except DriverError as e:
            raise self._fail(st, e, "Reserve", "{}", "cuMemAddressReserve", "reservation",
                             (0, size), None, size) from e
        st.va = True
        st.base = base
        st.size = size
        if tr:
            self._ok(st, "Reserve", base, size)
        txn.push(self._undo_free, st, base, size)

        plane_va = {n: base + o for n, o in self.plane_off.items()}
        region_va = {n: base + o for n, o in self.region_off.items()}
        grant_plane = self.grant_plane[r]
        grant_region = self.grant_region[r]
        unmap_backing_first = self.bug == "unmap_backing_first"
        # Tracing's hot path, inlined: the rank's flags and the phase stay fixed for the
        # whole loop, so its line templates are looked up once (each record is then one
        # tuple; docs/allocator.md has what a traced event costs).
        rec = self._record
        pump = self.trace.pump  # ships the records, between driver calls (see pump)
        tpl = self._tpl_of(st)
        t_create, t_map, t_alias = tpl("Create"), tpl("Map"), tpl("MapAlias")
        t_grant = tpl("Grant plane")
        t_grant_alias = {reg: tpl(key) for reg, key in self.alias_key.items()}
        for i, a in enumerate(self.allocs):
            n = a.length
            # Create
            try:
                h = d.create(n, dev)
            except DriverError as e:
                tgt, rng = self._alloc_target(a, "plane")
                raise self._fail(st, e, "Create", _ALLOC % i, "cuMemCreate", tgt, rng,
                                 None, n) from e
            st.created += 1
            swap = self.bug == "map_before_create" and r == 0 and i == 0
            if tr and not swap:
                rec((t_create, clock(), i, n,  # type: ignore[misc]
                     st.created, st.mapped, st.alias_mapped, st.grants))
            txn.push(self._undo_release, st, i, h)
            # Map (plane)
            pva = plane_va[a.plane] + a.plane_offset
            try:
                d.map(pva, n, h)
            except DriverError as e:
                tgt, rng = self._alloc_target(a, "plane")
                raise self._fail(st, e, "Map", _ALLOC % i, "cuMemMap", tgt, rng, pva, n) from e
            st.mapped += 1
            if tr:
                if swap:  # mutant: Map is emitted before the Create it depends on
                    st.created -= 1
                    self._ok(st, "Map", i, pva, n)
                    st.created += 1
                    self._ok(st, "Create", i, n)
                else:
                    rec((t_map, clock(), i, pva, n,  # type: ignore[misc]
                         st.created, st.mapped, st.alias_mapped, st.grants))
            if not (unmap_backing_first and a.region is not None):
                txn.push(self._undo_unmap, st, i, "plane", pva, n)
            # MapAlias
            ava = 0
            if a.region is not None:
                ava = region_va[a.region] + a.region_offset  # type: ignore[operator]
                try:
                    d.map(ava, n, h)
                except DriverError as e:
                    tgt, rng = self._alloc_target(a, "alias")
                    raise self._fail(st, e, "MapAlias", _ALLOC % i, "cuMemMap", tgt, rng,
                                     ava, n) from e
                st.alias_mapped += 1
                if tr:
                    rec((t_alias, clock(), i, ava, n,  # type: ignore[misc]
                         st.created, st.mapped, st.alias_mapped, st.grants))
                txn.push(self._undo_unmap, st, i, "alias", ava, n)
                if unmap_backing_first:  # mutant: plane unmapped before its alias
                    txn.push(self._undo_unmap, st, i, "plane", pva, n)
            # Grant (plane)
            self._grant(st, i, a, "plane", pva, n, grant_plane, t_grant)
            if a.region is not None:
                self._grant(st, i, a, "alias", ava, n, grant_region[a.region],
                            t_grant_alias[a.region])
            if tr:
                pump()

    def _grant(self, st: _Rank, i: int, a: Allocation, mapping: str, va: int, n: int,
               devs: list[int], template: str | None) -> None:
        """One cuMemSetAccess; ``template`` is the trace line's (None when untraced)."""
        try:
            self.driver.set_access(va, n, devs)
        except DriverError as e:
            tgt, rng = self._alloc_target(a, mapping)
            raise self._fail(st, e, "Grant", _GRANT % (i, mapping, devs),
                             "cuMemSetAccess", tgt, rng, va, n) from e
        k = len(devs)
        st.grants += k
        if mapping == "plane":
            st.plane_grants[i] = k
        else:
            st.alias_grants[i] = k
        if template is not None:
            self._record((template, clock(), i, va, n,  # type: ignore[misc]
                          st.created, st.mapped, st.alias_mapped, st.grants))

    # --------------------------------------------------------------- undos
    def _undo_free(self, st: _Rank, va: int, size: int) -> None:
        try:
            self.driver.free_address(va, size)
        except DriverError as e:
            if self.trace.enabled:
                self._ev(st, "Free", "{}", "cuMemAddressFree", e.result_name, va, size)
            raise
        st.va = False
        st.ready = False
        if self.trace.enabled:
            self._ok(st, "Free", va, size)

    def _undo_release(self, st: _Rank, i: int, handle: int) -> None:
        if self.bug == "skip_release" and self.phase == "ShuttingDown" and i == 0 \
                and st.rank == 0:
            return  # mutant: this handle is never released (and no event says so)
        try:
            self.driver.release(handle)
        except DriverError as e:
            if self.trace.enabled:
                self._ev(st, "Release", _ALLOC % i, "cuMemRelease", e.result_name)
            raise
        st.created -= 1
        if self.trace.enabled:
            self._ok(st, "Release", i)

    def _undo_unmap(self, st: _Rank, i: int, mapping: str, va: int, n: int) -> None:
        try:
            self.driver.unmap(va, n)
        except DriverError as e:
            if self.trace.enabled:
                self._ev(st, "Unmap", _UNMAP % (i, mapping), "cuMemUnmap", e.result_name, va, n)
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


def _resolve_plan(g: Geometry, plan: "PhysicalPlan | str | Callable[[Geometry], PhysicalPlan]"
                  ) -> PhysicalPlan:
    if isinstance(plan, PhysicalPlan):
        return plan
    if callable(plan):
        return plan(g)
    from kvgrant.layout.plans import make_plan

    return make_plan(g, plan)


def _free_map(driver: Driver, devices: Sequence[int]) -> dict[int, int]:
    return {d: driver.free_memory(d)[0] for d in devices}


def allocate(geometry: "Geometry | str | Path", *,
             plan: "PhysicalPlan | str | Callable[[Geometry], PhysicalPlan]" = "packed",
             driver: Driver | None = None, backend: str = "auto",
             devices: Sequence[int] | None = None,
             memory_limit: "str | int | MemoryLimit | None" = None,
             handle_budget: int | None = None, preflight: bool = True,
             check_contract: bool = True,
             trace: "str | Path | IO[str] | TraceWriter | None" = None,
             driver_options: Mapping[str, Any] | None = None,
             inject_bug: str | None = None, trace_errors: str = "raise") -> Published:
    """Allocate every rank's KV cache in one transaction and publish it, or nothing.

    Parameters
    ----------
    geometry
        A :class:`Geometry` or the path of a geometry JSON file.
    plan
        A :class:`PhysicalPlan` for this geometry, a label for ``make_plan``
        (``naive``, ``reference``, ``packed``: the default) or a planner callable
        ``geometry -> PhysicalPlan``. A label or planner is applied after pages are
        fitted; a given plan must fit as it is.
    driver, backend, driver_options
        An open driver (left open on release), or a backend name for
        :func:`open_driver` (``auto``, ``sim``, ``cuda``; the driver is then closed on
        release). A ``sim`` driver gets ``devices=ranks`` unless the options say.
    devices
        CUDA ordinal of each rank (default ``0..ranks-1``).
    memory_limit
        ``None``/``"-0G"``: use what is free; ``"-1G"``: keep 1 GiB free per GPU;
        ``"40G"``: use at most 40 GiB per GPU. Pages are fitted before any create.
    handle_budget, preflight
        Pre-flight refuses a plan whose driver-handle demand exceeds ``handle_budget``
        (default ``DEFAULT_HANDLE_BUDGET``) before any driver call; ``preflight=False``
        skips it (to reproduce the field failure).
    check_contract
        Refuse a plan that breaks the layout contract before any driver call
        (``False`` only for benchmark floors that deliberately map no regions).
    trace
        A path, text stream or :class:`TraceWriter`; ``None`` reads ``KVGRANT_TRACE``.
    trace_errors
        ``"raise"`` (default): a trace that could not be written is an error (the cache
        is released and :class:`~kvgrant.errors.TraceError` raised, since a lost trace
        was noticed only in ``trace_error``); ``"continue"``: keep the cache and record
        the error in :attr:`Published.trace_error`.
    inject_bug
        Test only: one of :data:`INJECT_BUGS`.

    Returns
    -------
    Published
        Capacities, VAs and views; release it (or use it as a context manager).

    Raises
    ------
    ArgumentError
        An argument is not accepted (names the argument, value and accepted forms).
    ContractError, HandleBudgetError, PlanError
        Before any driver object exists.
    TraceError
        The trace could not be written (``trace_errors="raise"``); nothing is left.
    AllocationError
        A driver step failed; every rank was unwound (LIFO), nothing was published.
        The error names call, rank, device, plane/region, byte range, CUresult, live
        counts and per-device free memory before and after; undo failures are in
        ``cleanup_errors``.

    Notes
    -----
    One attempt: a failure is never retried with fewer pages.
    """
    from kvgrant.runtime.arguments import check_allocate_args

    devices, plan = check_allocate_args(
        geometry, plan=plan, driver=driver, backend=backend, devices=devices,
        memory_limit=memory_limit, handle_budget=handle_budget, preflight=preflight,
        check_contract=check_contract, trace=trace, driver_options=driver_options,
        inject_bug=inject_bug, trace_errors=trace_errors)
    g = geometry if isinstance(geometry, Geometry) else load_geometry(geometry)
    limit = parse_memory_limit(memory_limit)
    nranks = g.topology.ranks
    devs = list(range(nranks)) if devices is None else [int(d) for d in devices]
    if len(devs) != nranks or len(set(devs)) != nranks:
        raise PlanError(f"devices = {devs}: need {nranks} distinct CUDA ordinals, one per rank "
                        f"of topology.ranks = {nranks}")
    fixed_plan = plan if isinstance(plan, PhysicalPlan) else None
    if fixed_plan is not None:
        if fixed_plan.geometry is not g and fixed_plan.geometry != g:
            raise PlanError(f"plan {fixed_plan.label!r} was made for geometry "
                            f"{fixed_plan.geometry.name!r}, not for {g.name!r} as given")
        g = fixed_plan.geometry

    # -- pre-flight, before any driver call ------------------------------------
    declared = inject_bug == "grant_declared_readers"

    def checked(gg: Geometry) -> PhysicalPlan:
        p = fixed_plan if fixed_plan is not None else _resolve_plan(gg, plan)  # type: ignore[arg-type]
        if check_contract:
            from kvgrant.layout.contract import require_contract

            require_contract(gg, p)
        if preflight:
            from kvgrant.layout.preflight import DEFAULT_HANDLE_BUDGET, check_handle_budget

            budget = DEFAULT_HANDLE_BUDGET if handle_budget is None else handle_budget
            check_handle_budget(gg, p, budget, declared=declared)
        return p

    the_plan = checked(g)
    for d in devs:
        if d < 0:
            raise PlanError(f"devices = {devs}: CUDA ordinals must be >= 0")
    tw = open_trace(trace)  # a bad trace path fails here, before any driver exists

    # -- driver and capacity ------------------------------------------------------
    owns = driver is None
    backend_reason = "given" if driver is not None else f"asked for {backend!r}"
    if driver is None:
        opts = dict(driver_options or {})
        if backend == "auto":
            backend, backend_reason = _auto_backend(max(devs) + 1)
        if backend == "sim":
            opts.setdefault("devices", max(devs) + 1)
        else:
            opts.pop("handle_budget", None)  # a real driver's budget is the driver's own
        driver = open_driver(backend, **opts)
    try:
        if driver.device_count() <= max(devs):
            raise PlanError(f"topology.ranks = {nranks} needs devices {devs} (one GPU per rank); "
                            f"the {getattr(driver, 'name', '?')} backend has "
                            f"{driver.device_count()} device(s)")
        for d in sorted(set(devs)):
            gran = driver.granularity(d)
            if g.granularity % gran:
                raise PlanError(f"granularity = {g.granularity}: not a multiple of device {d}'s "
                                f"allocation granularity {gran}")
        free_before = _free_map(driver, devs)
        fit = fit_pages(g, free_before, limit)
        if fit.reduced:
            if fixed_plan is not None:
                from kvgrant.runtime.capacity import rank_bytes

                tight = min(fit.budget.values())
                raise PlanError(
                    f"memory_limit = {limit.text!r}: plan {fixed_plan.label!r} needs "
                    f"{g.pages} pages = {rank_bytes(g)} bytes per rank, but the tightest "
                    f"device leaves {tight} bytes usable ({fit.pages} pages); pass a plan "
                    "label or planner instead of a fixed plan to fit pages")
            g = g.model_copy(update={"pages": fit.pages})
            from kvgrant.layout.geometry import parse_geometry

            g = parse_geometry(g.model_dump())
            the_plan = checked(g)
    except DriverError as e:
        tw.close()
        if owns:
            driver.close()
        raise AllocationError(
            f"{e.call} failed with {e.result_name} on device {e.device} before anything was "
            f"created; nothing was published. Cause: {e}", cause=e, device=e.device,
            call=e.call, result_name=e.result_name, live=driver.live().as_dict()) from e
    except BaseException:
        tw.close()
        if owns:
            driver.close()
        raise

    capacity = Capacity(pages=g.pages, page_tokens=g.page_tokens,
                        rows={reg.name: reg.rows for reg in g.regions},
                        bytes_per_rank=fit.bytes_per_rank, requested_pages=fit.requested,
                        memory_limit=limit.text)

    # -- the transaction --------------------------------------------------------------
    run = _Run(g, the_plan, driver, devs, tw, inject_bug)
    with gc_paused():
        t0 = time.perf_counter()
        txn = Transaction()
        try:
            run.header()
            run.build(txn)
        except _StepFailed as f:
            _abort(run, txn, f, free_before, owns)
        except BaseException as e:
            run.phase = "Aborting"
            run._group("Abort", {"failed_rank": None})
            errors = txn.rollback()
            tw.close()
            if owns:
                driver.close()
            attach_cleanup_errors(e, errors)
            raise
        if inject_bug != "publish_early":
            run.phase = "Published"
            run._group("Publish")
        teardown = txn.commit()
        startup = time.perf_counter() - t0
    pub = Published(run, teardown, capacity, fit, startup, owns, run.counts(), backend_reason)
    if tw.error is not None and trace_errors == "raise":
        _release_for_trace_error(pub, tw)
    return pub


def _release_for_trace_error(pub: Published, tw: TraceWriter) -> None:
    """The trace was lost: release the cache (nothing left) and raise TraceError."""
    from kvgrant.errors import TraceError

    cause = tw.error
    where = tw.path if tw.path is not None else "the trace stream"
    try:
        pub.release()
    except DriverError as err:
        raise TraceError(f"writing the trace to {where} failed ({cause}); releasing the cache "
                         f"then failed too: {err}", line=None) from err
    raise TraceError(f"writing the trace to {where} failed: {cause}; the cache was released "
                     "and nothing is left (pass trace_errors='continue' to keep a cache "
                     "without its trace)", line=None) from cause


def _auto_backend(needed: int) -> tuple[str, str]:
    """``auto``: cuda when a usable GPU exists for every rank, else sim (and why)."""
    from kvgrant.runtime.cuda import usable_device_count

    have = usable_device_count()
    if have == 0:
        return "sim", "auto: no usable CUDA GPU"
    if have < needed:
        return "sim", (f"auto: {needed} ranks need {needed} GPUs, this host has {have} "
                       f"(run the layout on fewer ranks with --ranks {have})")
    return "cuda", f"auto: {have} CUDA GPU(s)"


def _abort(run: _Run, txn: Transaction, f: _StepFailed, free_before: dict[int, int],
           owns: bool) -> None:
    """Unwind every rank after a failed step and raise the AllocationError."""
    driver = run.driver
    live_at_failure = driver.live().as_dict()
    run.phase = "Aborting"
    run._group("Abort", {"failed_rank": f.rank})
    errors = txn.rollback()
    if not errors:
        run.phase = "Aborted"
        run._group("AbortComplete")
    run.trace.close()
    try:
        free_after: dict[int, int] = _free_map(driver, run.devices)
    except DriverError as e:
        errors.append(e)
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
    if run.trace.error is not None:
        msg += f"; the trace is incomplete: writing it failed: {run.trace.error}"
    raise AllocationError(msg, cause=e, rank=f.rank, device=f.device, call=f.call,
                          result_name=e.result_name, target=f.target, byte_range=f.byte_range,
                          live=live_at_failure, free_before=free_before, free_after=free_after,
                          cleanup_errors=errors) from e
