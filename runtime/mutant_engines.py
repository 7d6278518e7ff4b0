"""Runtime mutants: engines that commit exactly one ordering bug, for the conformance
self-test (their traces must be rejected at the named action).

Why subclasses here, not switches in the engine: the production loop stays free of test
branches, and a mutant is a few overridden lines next to the one it breaks. Never used
by :func:`~kvgrant.runtime.allocator.allocate`; tests and benchmarks reach them through
:func:`allocate_mutant`.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Callable, Sequence, Unpack

from kvgrant.layout.geometry import Geometry
from kvgrant.layout.plan import PhysicalPlan
from kvgrant.runtime.allocator import run_transaction
from kvgrant.runtime.engine import Engine, _Rank
from kvgrant.runtime.options import HandleBudget, RankShorthands, group_options
from kvgrant.runtime.prepare import prepare
from kvgrant.runtime.published import Published
from kvgrant.runtime.trace_render import alloc_records
from kvgrant.runtime.transaction import Transaction

__all__ = ["MUTANT_ENGINES", "REJECTED_AT", "allocate_mutant"]


class GrantDeclaredReaders(Engine):
    """Grants every declared reader (the field failure), not owner + importers."""

    def __init__(self, *args: Any, declared: bool = False, **kw: Any) -> None:
        super().__init__(*args, declared=True, **kw)


class PublishEarly(Engine):
    """Publishes before the last rank's RankReady."""

    def build(self, txn: Transaction) -> None:
        last = len(self.ranks) - 1
        self.reserve_all(txn)
        for st in self.ranks:
            self._build_rank(st, txn)
            if st.rank == last:
                Engine.publish(self)
            st.ready = True
            if self.trace.enabled:
                self._ok(st, "RankReady")

    def publish(self) -> None:
        """Already published inside :meth:`build`."""


class _PlaneUnmapAfterAlias:
    """A transaction front that pushes each aliased allocation's plane unmap after its
    alias unmap, so unwinding (LIFO) unmaps the backing before its alias."""

    def __init__(self, txn: Transaction) -> None:
        self.txn = txn
        self.held: tuple[Callable[..., Any], tuple[Any, ...]] | None = None

    def push(self, fn: Callable[..., Any], *args: Any) -> None:
        is_unmap = getattr(fn, "__name__", "") == "_undo_unmap"
        if is_unmap and args[2] == "plane":
            self.flush()
            self.held = (fn, args)
            return
        if is_unmap and args[2] == "alias":
            self.txn.push(fn, *args)
            self.flush()
            return
        self.flush()
        self.txn.push(fn, *args)

    def flush(self) -> None:
        if self.held is not None:
            fn, args = self.held
            self.held = None
            self.txn.push(fn, *args)


class UnmapBackingFirst(Engine):
    """Unwinds the plane mapping before the alias mapping of the same allocation."""

    def build(self, txn: Transaction) -> None:
        front = _PlaneUnmapAfterAlias(txn)
        try:
            super().build(front)  # type: ignore[arg-type]
        finally:
            front.flush()


class SkipRelease(Engine):
    """Never releases rank 0's first handle on shutdown (and no event says so)."""

    def _undo_release(self, st: _Rank, i: int, handle: int) -> None:
        if self.phase == "ShuttingDown" and i == 0 and st.rank == 0:
            return
        super()._undo_release(st, i, handle)


class _MapFirst:
    """Entries of rank 0 whose first allocation is traced Map first, then Create (the
    Map with one handle fewer created); later entries go on as usual."""

    def __init__(self, engine: Engine, st: _Rank, key: Any) -> None:
        self.engine, self.st, self.key = engine, st, key
        self.spec = engine._alloc_spec(st)
        self.target: bytearray | None = None

    def __len__(self) -> int:
        return 0 if self.target is None else len(self.target)

    def __iadd__(self, entry: bytes) -> "_MapFirst":
        if self.target is not None:
            self.target += entry
            return self
        create, map_, *rest = alloc_records(self.spec, entry)
        record = self.engine._record
        assert record is not None
        record(map_[:-4] + (map_[-4] - 1,) + map_[-3:])
        for rec in (create, *rest):
            record(rec)
        self.target = self.engine.trace.alloc_entries(self.key)
        return self


class MapBeforeCreate(Engine):
    """Traces rank 0's first Map before the Create it depends on."""

    def _open_entries(self, st: _Rank, key: Any) -> bytearray:
        entries = super()._open_entries(st, key)
        if st.rank != 0:
            return entries
        return _MapFirst(self, st, key)  # type: ignore[return-value]


MUTANT_ENGINES: dict[str, type[Engine]] = {
    "grant_declared_readers": GrantDeclaredReaders,
    "map_before_create": MapBeforeCreate,
    "publish_early": PublishEarly,
    "skip_release": SkipRelease,
    "unmap_backing_first": UnmapBackingFirst,
}

#: the action at which the conformance checker must reject each mutant's trace
REJECTED_AT = {"grant_declared_readers": "Grant", "map_before_create": "Map",
               "publish_early": "Publish", "skip_release": "Free",
               "unmap_backing_first": "Unmap"}


def allocate_mutant(bug: str, geometry: "Geometry | str | Path", *,
                    plan: "PhysicalPlan | str | Callable[[Geometry], PhysicalPlan]" = "packed",
                    backend: Any = "auto", devices: Sequence[int] | None = None,
                    memory_limit: Any = None, check_contract: bool = True,
                    budget: HandleBudget | None = None, trace: Any = None,
                    **shorthands: Unpack[RankShorthands]) -> Published:
    """:func:`allocate` with the engine of mutant ``bug`` (one of :data:`MUTANT_ENGINES`);
    a trace that could not be written stays in ``trace_error`` (no ``trace_errors``)."""
    try:
        engine = MUTANT_ENGINES[bug]
    except KeyError:
        raise ValueError(f"bug = {bug!r}: must be one of {sorted(MUTANT_ENGINES)}") from None
    opts = group_options(allocate_mutant, shorthands, budget=budget, trace=trace,
                         backend=backend, accepted=frozenset(RankShorthands.__annotations__))
    prep = prepare(geometry, plan=plan, backend=opts.backend, devices=devices,
                   memory_limit=memory_limit, budget=opts.budget,
                   check_contract=check_contract, trace=opts.trace.target,
                   declared=engine is GrantDeclaredReaders)
    return run_transaction(prep, engine)
