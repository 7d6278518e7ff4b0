"""Preparing an allocation attempt: everything decided before the first driver step.

Why apart from the engine (:mod:`kvgrant.runtime.engine`): a refusal here (bad plan,
broken contract, pre-flight, the host ledger, too little memory) happens before any
driver object exists, so nothing needs unwinding but the trace, the driver this module
opened and the ledger lease; :meth:`Prepared.discard` does exactly that.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import IO, TYPE_CHECKING, Callable, Sequence

from kvgrant.errors import (AllocationError, ArgumentError, DriverError, GeometryError,
                            PlanError)
from kvgrant.layout.geometry import Geometry, load_geometry
from kvgrant.layout.plan import PhysicalPlan
from kvgrant.runtime.arguments import MAX_DEVICE_ORDINAL, check_plan_object
from kvgrant.runtime.capacity import MemoryLimit, PageFit, fit_pages, parse_memory_limit
from kvgrant.runtime.driver import Driver, open_driver
from kvgrant.runtime.options import Backend, HandleBudget
from kvgrant.runtime.published import Capacity
from kvgrant.runtime.trace import TraceWriter, open_trace
from kvgrant.runtime.transaction import attach_cleanup_errors

if TYPE_CHECKING:
    from kvgrant.runtime.ledger import HostLedger, Lease

__all__ = ["Prepared", "host_ledger", "prepare", "resolve_plan"]


@dataclass
class Prepared:
    """An attempt ready to run: fitted geometry, checked plan, open driver, capacity,
    the host-ledger lease and the trace writer (both released by the transaction)."""

    geometry: Geometry
    plan: PhysicalPlan
    devices: list[int]
    driver: Driver
    owns_driver: bool
    backend_reason: str
    capacity: Capacity
    fit: PageFit
    free_before: dict[int, int]
    lease: "Lease | None"
    trace: TraceWriter
    declared: bool = False

    def discard(self, err: BaseException) -> None:
        """Give back what was prepared without running it (``err`` gets any failure)."""
        self.trace.close()
        if self.owns_driver:
            self.driver.close()
        _drop_lease(self.lease, err)


def prepare(geometry: "Geometry | str | Path", *,
            plan: "PhysicalPlan | str | Callable[[Geometry], PhysicalPlan]" = "packed",
            backend: "Backend | Driver" = Backend(),
            devices: Sequence[int] | None = None,
            memory_limit: "str | int | MemoryLimit | None" = None,
            budget: HandleBudget = HandleBudget(),
            check_contract: bool = True,
            trace: "str | Path | IO[str] | TraceWriter | None" = None,
            declared: bool = False) -> Prepared:
    """Plan, check and size an attempt (the arguments are :func:`allocate`'s, grouped:
    ``backend`` a Backend to open or an open driver, ``trace`` the target).

    ``declared`` sizes the pre-flight demand for grants to every declared reader (the
    field behaviour the conformance self-test reproduces).
    """
    g = geometry if isinstance(geometry, Geometry) else load_geometry(geometry)
    limit = parse_memory_limit(memory_limit)
    nranks = g.topology.ranks
    if devices is None and nranks > MAX_DEVICE_ORDINAL + 1:
        # was "devices = 1025: ...", naming an argument the caller never passed
        raise PlanError(f"topology.ranks = {nranks}: allocate() gives every rank its own "
                        f"CUDA ordinal, and there are at most {MAX_DEVICE_ORDINAL + 1} "
                        f"(0..{MAX_DEVICE_ORDINAL}); run one process per rank "
                        "(allocate_rank) or fold the layout onto fewer ranks "
                        "(kvgrant.layout.geometry.on_ranks)")
    devs = list(range(nranks)) if devices is None else [int(d) for d in devices]
    if len(devs) != nranks or len(set(devs)) != nranks:
        # a bad argument (exit 2), not a refused plan (was PlanError)
        raise ArgumentError(f"devices = {devs}: need {nranks} distinct CUDA ordinals, one per "
                            f"rank of topology.ranks = {nranks}", argument="devices",
                            value=devs)
    require_allocatable_granularity(g)
    fixed_plan = plan if isinstance(plan, PhysicalPlan) else None
    if fixed_plan is not None:
        require_plan_for(fixed_plan, g)
        g = fixed_plan.geometry

    # -- pre-flight, before any driver call ------------------------------------
    from kvgrant.layout.preflight import check_handle_budget, handle_demand

    handles, reserve = budget.limits()
    preflight = budget.preflight
    demand = 0  # of the plan last checked: what the ledger reserves

    def checked(gg: Geometry) -> PhysicalPlan:
        nonlocal demand
        p = fixed_plan if fixed_plan is not None else resolve_plan(gg, plan)  # type: ignore[arg-type]
        from kvgrant.layout.contract import require_buildable, require_contract

        if check_contract:
            require_contract(gg, p)
        else:  # the contract is not asked for, but the engine needs what it names
            require_buildable(gg, p)
        if preflight:
            demand = check_handle_budget(gg, p, handles, declared=declared, reserve=reserve)
        else:
            demand = handle_demand(gg, p, declared=declared)
        return p

    the_plan = checked(g)
    for d in devs:
        if d < 0:
            raise PlanError(f"devices = {devs}: CUDA ordinals must be >= 0")
    tw = open_trace(trace)  # a bad trace path fails here, before any driver exists

    # -- driver and capacity ------------------------------------------------------
    driver: Driver | None = None
    if isinstance(backend, Backend):
        name = backend.name
    else:
        driver, name = backend, getattr(backend, "name", "?")
    owns = driver is None
    backend_reason = "given" if driver is not None else f"asked for {name!r}"
    lease: Lease | None = None
    try:
        if driver is None and name == "auto":
            name, backend_reason = _auto_backend(max(devs) + 1)
        book = host_ledger(budget.ledger, name)
        if book is not None:  # this process's share of the host's pool, before any driver call
            lease = book.reserve(demand, geometry=g.name, label=the_plan.label,
                                 budget=handles, reserve=reserve, check=preflight, devices=devs)
        if driver is None:
            assert isinstance(backend, Backend)
            opts = dict(backend.options)
            if name == "sim":
                opts.setdefault("devices", max(devs) + 1)
            else:
                opts.pop("handle_budget", None)  # a real driver's budget is the driver's own
                opts.pop("host_pool", None)      # and its pool is the real host's
            driver = open_driver(name, **opts)
    except BaseException as e:
        tw.close()
        _drop_lease(lease, e)
        raise
    query = "cuDeviceGetCount"   # the driver query under way (a failed one is traced)
    try:
        if driver.device_count() <= max(devs):
            raise PlanError(f"topology.ranks = {nranks} needs devices {devs} (one GPU per rank); "
                            f"the {getattr(driver, 'name', '?')} backend has "
                            f"{driver.device_count()} device(s)")
        for d in sorted(set(devs)):
            query = "cuMemGetAllocationGranularity"
            gran = driver.granularity(d)
            if g.granularity % gran:
                raise PlanError(f"granularity = {g.granularity}: not a multiple of the "
                                f"allocation granularity {gran} of device {d} (rank "
                                f"{devs.index(d)})")
        query = "cuMemGetInfo"
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
            if lease is not None:
                lease.resize(demand, check=preflight)
    except DriverError as e:
        rank = devs.index(e.device) if e.device in devs else None
        # the trace records it (its rank's failed Reserve, Abort, AbortComplete); a
        # query of the whole driver (no device) stopped rank 0 before its first step
        _trace_setup_failure(g, the_plan, driver, devs, tw, 0 if rank is None else rank,
                             query, e)
        if owns:
            driver.close()
        trace_note = "" if tw.error is None else \
            f"; the trace is incomplete: writing it failed: {tw.error}"
        err = AllocationError(
            f"{e.call} failed with {e.result_name} on {_where(rank, e.device)} before "
            f"anything was created (no address reserved, so no byte range); nothing was "
            f"published. Cause: {e}{trace_note}", cause=e, rank=rank, device=e.device,
            call=e.call, result_name=e.result_name, live=driver.live().as_dict())
        _drop_lease(lease, err)
        raise err from e
    except BaseException as e:
        tw.close()
        if owns:
            driver.close()
        _drop_lease(lease, e)
        raise

    capacity = Capacity(pages=g.pages, page_tokens=g.page_tokens,
                        rows={reg.name: reg.rows for reg in g.regions},
                        bytes_per_rank=fit.bytes_per_rank, requested_pages=fit.requested,
                        memory_limit=limit.text)

    return Prepared(g, the_plan, devs, driver, owns, backend_reason, capacity, fit,
                    free_before, lease, tw, declared)


def _trace_setup_failure(g: Geometry, plan: PhysicalPlan, driver: Driver, devs: list[int],
                         tw: TraceWriter, rank: int, query: str, err: DriverError) -> None:
    """Trace a failed query of the preparation (before any rank reserved) and close the
    trace: :meth:`kvgrant.runtime.engine.Engine.setup_failed`. A trace that cannot be
    written does not raise: its error is in ``tw.error``, as in the start-up."""
    if not tw.enabled:
        tw.close()
        return
    from kvgrant.runtime.engine import Engine

    try:
        Engine(g, plan, driver, devs, tw).setup_failed(rank, query, err.result_name)
    finally:
        tw.close()


def _where(rank: int | None, device: int | None) -> str:
    """``rank R (device D)`` for a failed query before any reservation: the project's
    failure messages name the rank as well as the device (was: the device only)."""
    if device is None:
        return "no device (a query of the whole driver)"
    if rank is None:
        return f"device {device} (no rank of this allocation)"
    return f"rank {rank} (device {device})"


def require_allocatable_granularity(g: Geometry) -> None:
    """Refuse, before any driver call, a granularity memory cannot have.

    Why: a planning-only layout may have any granularity (``kvgrant plan`` takes one of
    3 bytes), but the VA reservation is aligned to it and the driver's granularities
    are powers of two; allocating one reached cuMemAddressReserve (an allocation
    failure, exit 1), then was a PlanError naming no field. It is the geometry's field
    that breaks the rule (exit 2), for ``allocate()`` and every rank of a group alike.

    Raises
    ------
    GeometryError
        ``granularity`` is not a power of two (``field`` and ``value`` say so).
    """
    if g.granularity & (g.granularity - 1):
        raise GeometryError(f"granularity = {g.granularity}: must be a power of two to "
                            "allocate (the VA reservation's alignment; the driver's "
                            "granularities are powers of two)", field="granularity",
                            value=g.granularity)


def require_plan_for(plan: PhysicalPlan, g: Geometry) -> None:
    """A given plan must be well formed and made for ``g``; the error names the fields of
    the geometry that differ (two layouts of one name once read "made for geometry
    'small', not for 'small' as given")."""
    check_plan_object(plan)
    if plan.geometry is g or plan.geometry == g:
        return
    mine, theirs = plan.geometry.model_dump(), g.model_dump()
    differ = [k for k in mine if mine[k] != theirs.get(k)]
    raise PlanError(f"plan {plan.label!r} was made for geometry {plan.geometry.name!r}, not "
                    f"for {g.name!r} as given: they differ in {', '.join(differ)}")


def resolve_plan(g: Geometry, plan: "PhysicalPlan | str | Callable[[Geometry], PhysicalPlan]",
                 *, cache_wait_s: float | None = None) -> PhysicalPlan:
    """A label (``make_plan``), a planner callable, or a plan as given.

    ``cache_wait_s`` bounds the wait for another process planning ``packed`` into the
    host's plan cache (None: its default); a group passes its timeout."""
    if isinstance(plan, PhysicalPlan):
        return plan
    if callable(plan):
        return plan(g)
    if plan == "packed":  # planned once per host (runtime/plancache.py)
        from kvgrant.runtime.plancache import packed_plan

        return packed_plan(g, wait_s=cache_wait_s)
    from kvgrant.layout.plans import make_plan

    return make_plan(g, plan)


def _free_map(driver: Driver, devices: Sequence[int]) -> dict[int, int]:
    return {d: driver.free_memory(d)[0] for d in devices}


def host_ledger(ledger: "HostLedger | str | Path | bool | None", backend: str
                ) -> "HostLedger | None":
    """The ledger to reserve in (see ``allocate``'s ``ledger``), or None."""
    from kvgrant.runtime.ledger import HostLedger, env_ledger_path

    if ledger is False:
        return None
    if isinstance(ledger, HostLedger):
        return ledger
    if ledger is None or ledger is True:
        # env_ledger_path: KVGRANT_LEDGER=1 is refused, not taken as a file named "1"
        if backend == "cuda" or ledger is True or env_ledger_path() is not None:
            return HostLedger()
        return None
    return HostLedger(ledger)


def _drop_lease(lease: "Lease | None", err: BaseException) -> None:
    """Release ``lease`` after a failure; a failed release is attached to ``err``."""
    if lease is None:
        return
    try:
        lease.release()
    except Exception as e:  # noqa: BLE001 - never hide the first error
        attach_cleanup_errors(err, [e])


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
