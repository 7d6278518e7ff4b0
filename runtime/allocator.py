"""The transactional multi-rank allocator: all ranks of one host, one process.

:func:`allocate` turns a geometry and a physical plan into a published KV cache, or
into nothing at all:

1. :func:`~kvgrant.runtime.prepare.prepare`, before any driver call: the plan is checked
   against the layout contract and its driver-handle demand, plus a reserve for users
   kvgrant cannot see, against the host's budget (pre-flight); the demand is reserved in
   the host ledger, which refuses it when what other processes on the host hold leaves
   too little (the budget is one pool per host); free memory is measured and KV pages
   chosen to fit (``memory_limit``). A failure is never retried smaller.
2. :func:`run_transaction`: one :class:`~kvgrant.runtime.transaction.Transaction` for the
   whole group, run by the :class:`~kvgrant.runtime.engine.Engine`: ``Reserve`` on every
   rank first (the trace header, written then, carries every reservation base), then rank
   by rank, per allocation in plan order ``Create``, ``Map``, ``MapAlias``, ``Grant``
   (one ``cuMemSetAccess`` per mapping, owner + validated importers only); ``RankReady``.
   Each undo is pushed after its step's result is checked; the ledger lease is the first
   undo, so it is released last, and kept (until this process exits) when a newer undo
   failed and left driver objects live.
3. ``Publish`` only when every rank is ready. On any failure: the failed event, then
   ``Abort``, then every rank unwinds LIFO (aliases before their backing), then
   ``AbortComplete``, and :class:`~kvgrant.errors.AllocationError` names the call,
   rank, device, plane or region, byte range, CUresult, live counts and free memory.

Every transition is traced (docs/INTERFACES.md "Trace format") when tracing is on.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import IO, Callable, Sequence, Unpack

from kvgrant.errors import DriverError, TraceError
from kvgrant.gc_pause import gc_paused
from kvgrant.layout.geometry import Geometry
from kvgrant.layout.plan import PhysicalPlan
from kvgrant.runtime.capacity import MemoryLimit
from kvgrant.runtime.driver import Driver
from kvgrant.runtime.engine import Engine, StepFailed
from kvgrant.runtime.options import Backend, HandleBudget, Shorthands, TraceOptions, group_options
from kvgrant.runtime.prepare import Prepared, prepare
from kvgrant.runtime.published import Capacity, Counts, Published
from kvgrant.runtime.trace import TraceWriter
from kvgrant.runtime.transaction import Transaction

__all__ = ["Capacity", "Counts", "Published", "allocate", "run_transaction"]  # re-exported


def allocate(geometry: "Geometry | str | Path", *,
             plan: "PhysicalPlan | str | Callable[[Geometry], PhysicalPlan]" = "packed",
             backend: "str | Backend | Driver" = "auto",
             devices: Sequence[int] | None = None,
             memory_limit: "str | int | MemoryLimit | None" = None,
             check_contract: bool = True,
             budget: HandleBudget | None = None,
             trace: "str | Path | IO[str] | TraceWriter | TraceOptions | None" = None,
             **shorthands: Unpack[Shorthands]) -> Published:
    """Allocate every rank's KV cache in one transaction and publish it, or nothing.

    Parameters
    ----------
    geometry
        A :class:`Geometry` or the path of a geometry JSON file.
    plan
        A :class:`PhysicalPlan` for this geometry, a label for
        :func:`kvgrant.layout.plans.make_plan`
        (``naive``, ``reference``, ``packed``: the default) or a planner callable
        ``geometry -> PhysicalPlan``. A label or planner is applied after pages are
        fitted; a given plan must fit as it is.
    backend
        A backend name for :func:`open_driver` (``auto``, ``sim``, ``cuda``), a
        :class:`Backend` (a name and its driver's options), or an open driver; a driver
        kvgrant opened is closed on release, one given is left open. A ``sim`` driver
        gets ``devices=ranks`` unless the options say.
    devices
        CUDA ordinal of each rank (default ``0..ranks-1``).
    memory_limit
        ``None``/``"-0G"``: use what is free; ``"-1G"``: keep 1 GiB free per GPU;
        ``"40G"``: use at most 40 GiB per GPU. Pages are fitted before any create.
    check_contract
        Refuse a plan that breaks the layout contract before any driver call
        (``False`` only for benchmark floors that deliberately map no regions; a plan
        that cannot be built at all, naming a plane or region the geometry lacks or
        bytes past one, is refused either way: ``ContractError``).
    budget
        The host's driver-handle pool (:class:`HandleBudget`; None: the defaults).
        Pre-flight refuses, before any driver call, a plan whose driver-handle demand
        plus ``reserve`` (for users kvgrant cannot see) exceeds ``handles``; the demand
        is then reserved in the host ledger (``ledger``), which refuses it when other
        holders leave too little, and released after shutdown or abort.
        ``preflight=False`` skips both refusals (to reproduce the field failure), but
        the lease is still recorded so others see it.
    trace
        A path, text stream or :class:`TraceWriter` (``None`` reads ``KVGRANT_TRACE``),
        or :class:`TraceOptions` to say also what a trace that could not be written
        does: ``errors="raise"`` (the default) releases the cache and raises
        :class:`~kvgrant.errors.TraceError`, since a lost trace was noticed only in
        ``trace_error``; ``"continue"`` keeps the cache and records the error in
        :attr:`Published.trace_error`. A path that names an existing file that is not
        a kvgrant trace is refused (ArgumentError) unless ``TraceOptions(path,
        overwrite=True)``: writing the trace would destroy it.
    **shorthands
        The flat keywords of earlier versions, still accepted without a warning:
        ``handle_budget``, ``handle_reserve``, ``preflight`` and ``ledger`` stand for
        ``budget=HandleBudget(handles=, reserve=, preflight=, ledger=)``;
        ``trace_errors`` for ``trace=TraceOptions(trace, errors=)``; ``driver`` for
        ``backend=<the driver>`` (a backend name beside it is ignored, as before);
        ``driver_options`` for ``backend=Backend(backend, options)``. A shorthand
        given together with the object that holds it is an ArgumentError.

    Returns
    -------
    Published
        Capacities, VAs and views; release it (or use it as a context manager).

    Raises
    ------
    ArgumentError
        An argument is not accepted (names the argument, value and accepted forms), an
        unknown keyword (the accepted ones listed), or a shorthand given together with
        its grouped object (both named).
    ContractError, HandleBudgetError, PlanError
        Before any driver object exists (HandleBudgetError from the ledger names the
        other holders).
    GeometryError
        The geometry breaks a rule, or one that only allocation has (a granularity
        that is not a power of two), before any driver call.
    LedgerError
        The ledger file cannot be used (garbage, newer version, stuck lock).
    TraceError
        The trace could not be written (``errors="raise"``); nothing is left.
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

    opts = group_options(allocate, shorthands, budget=budget, trace=trace, backend=backend)
    devices, plan = check_allocate_args(
        geometry, plan=plan, devices=devices, memory_limit=memory_limit,
        check_contract=check_contract, trace=opts.trace.target,
        overwrite_trace=opts.trace.overwrite)
    pub = run_transaction(prepare(
        geometry, plan=plan, backend=opts.backend, devices=devices,
        memory_limit=memory_limit, budget=opts.budget, check_contract=check_contract,
        trace=opts.trace.target))
    if pub.trace_error is not None and opts.trace.errors != "continue":
        _release_for_trace_error(pub)
    return pub


def run_transaction(prep: Prepared, engine_type: type[Engine] = Engine) -> Published:
    """Run a prepared attempt: build every rank, publish, or unwind everything.

    ``engine_type`` is for tests (mutant engines whose traces the conformance checker
    must reject); production code always runs :class:`Engine`.
    """
    engine = engine_type(prep.geometry, prep.plan, prep.driver, prep.devices, prep.trace,
                         declared=prep.declared)
    with gc_paused(), engine.interrupt:  # a Ctrl-C waits for an allocation boundary
        t0 = time.perf_counter()
        txn = Transaction()
        if prep.lease is not None:
            txn.push_unless_undo_failed(prep.lease.release)  # last; kept if objects are left live
        try:
            engine.build(txn)  # writes the trace header once every rank reserved
        except StepFailed as f:
            engine.abort(txn, f, prep.free_before, prep.owns_driver)
        except BaseException as e:
            engine.interrupted(txn, e)
            if prep.owns_driver:
                prep.driver.close()
            raise
        engine.publish()
        teardown = txn.commit()
        startup = time.perf_counter() - t0
    pub = Published(engine, teardown, prep.capacity, prep.fit, startup, prep.owns_driver,
                    engine.counts(), prep.backend_reason)
    if engine.interrupt.pending:  # Ctrl-C after the last allocation began: shut down
        pub.release()
        raise KeyboardInterrupt
    return pub


def _release_for_trace_error(pub: Published) -> None:
    """The trace was lost: release the cache (nothing left) and raise TraceError."""
    cause = pub.trace_error
    where = pub.trace_path if pub.trace_path is not None else "the trace stream"
    why = str(cause).removeprefix("writing the trace failed: ")  # said once, below
    try:
        pub.release()
    except DriverError as err:
        raise TraceError(f"writing the trace to {where} failed ({why}); releasing the cache "
                         f"then failed too: {err}", line=None) from err
    raise TraceError(f"writing the trace to {where} failed: {why}; the cache was released "
                     "and nothing is left (pass trace=TraceOptions(..., errors='continue') to "
                     "keep a cache without its trace)", line=None) from cause
