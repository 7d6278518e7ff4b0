"""What a successful allocation returns: capacities, VAs, views, and release.

Kept apart from the allocator engine (:mod:`kvgrant.runtime.allocator`) because this is
the object users hold for the life of the cache; the engine is only its start-up.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import TYPE_CHECKING, Any

from kvgrant.errors import ReleasedError
from kvgrant.gc_pause import gc_paused
from kvgrant.layout.geometry import Geometry
from kvgrant.layout.plan import PhysicalPlan
from kvgrant.runtime.capacity import PageFit
from kvgrant.runtime.driver import Driver, LiveCounts
from kvgrant.runtime.interrupts import DeferredInterrupt
from kvgrant.runtime.transaction import Teardown, attach_cleanup_errors
from kvgrant.runtime.views import DeviceBuffer

if TYPE_CHECKING:
    from kvgrant.runtime.engine import Engine

__all__ = ["Capacity", "Counts", "Published"]


@dataclass(frozen=True)
class Capacity:
    """What the published cache holds (the same on every rank)."""

    pages: int                  # KV pages created (all planes share the page index)
    page_tokens: int
    rows: dict[str, int]        # region name -> rows (snapshot slots, execution rows)
    bytes_per_rank: int         # physical bytes created per rank
    requested_pages: int        # the geometry's pages before fitting
    memory_limit: str

    @property
    def kv_tokens(self) -> int:
        """KV tokens = pages x page_tokens."""
        return self.pages * self.page_tokens

    @property
    def snapshot_slots(self) -> int:
        """Rows of the region named ``snapshot`` (else of the first region, else 0)."""
        if "snapshot" in self.rows:
            return self.rows["snapshot"]
        return next(iter(self.rows.values()), 0)

    def as_dict(self) -> dict[str, Any]:
        return {"pages": self.pages, "page_tokens": self.page_tokens,
                "kv_tokens": self.kv_tokens, "snapshot_slots": self.snapshot_slots,
                "rows": dict(self.rows), "bytes_per_rank": self.bytes_per_rank,
                "requested_pages": self.requested_pages, "memory_limit": self.memory_limit}


@dataclass(frozen=True)
class Counts:
    """Driver objects and calls of one start-up, summed over ranks."""

    ranks: int
    reservations: int
    allocations: int
    mappings: int               # plane + alias mappings
    alias_mappings: int
    set_access_calls: int       # one per mapping
    grants: int                 # (mapping, device) pairs: the driver-handle demand

    @property
    def objects(self) -> int:
        """Driver objects: reservations + allocations + mappings."""
        return self.reservations + self.allocations + self.mappings

    @property
    def driver_calls(self) -> int:
        """Start-up driver calls: reserve + create + map + set-access."""
        return self.reservations + self.allocations + self.mappings + self.set_access_calls

    def as_dict(self) -> dict[str, int]:
        return {"ranks": self.ranks, "reservations": self.reservations,
                "allocations": self.allocations, "mappings": self.mappings,
                "alias_mappings": self.alias_mappings,
                "set_access_calls": self.set_access_calls, "grants": self.grants,
                "objects": self.objects, "driver_calls": self.driver_calls}


class Published:
    """A published KV cache: capacities, VAs of every plane and row, and its release.

    Release is explicit (:meth:`release`) and also happens on context exit; it emits
    ``Unpublish``, unwinds every rank LIFO (aliases before backing) and ends with
    ``ShutdownComplete``.
    """

    def __init__(self, engine: "Engine", teardown: Teardown, capacity: Capacity,
                 fit: PageFit, startup_s: float, owns_driver: bool, counts: Counts,
                 backend_reason: str = "") -> None:
        self._engine = engine
        self._teardown = teardown
        self._owns_driver = owns_driver
        self.geometry: Geometry = engine.g
        self.plan: PhysicalPlan = engine.plan
        self.driver: Driver = engine.driver
        self.devices: tuple[int, ...] = tuple(engine.devices)
        self.capacity = capacity
        self.fit = fit
        self.counts = counts
        self.startup_s = startup_s
        self.release_s: float | None = None
        self.released = False
        #: why this backend was used (``auto`` falls back to sim when GPUs are missing)
        self.backend_reason = backend_reason
        self._plane_va: Any = engine.plane_vas()
        self._region_va: Any = engine.region_vas()

    @property
    def plane_va(self) -> Any:
        """[rank][plane name] -> VA of the plane. ReleasedError after :meth:`release`
        (the addresses are unmapped; they stayed readable while ``row_va()`` refused)."""
        self._live("plane_va")
        return self._plane_va

    @plane_va.setter
    def plane_va(self, value: Any) -> None:
        self._plane_va = value

    @property
    def region_va(self) -> Any:
        """[rank][region name] -> VA of row 0 (row i is at + i * row_bytes);
        ReleasedError after :meth:`release`."""
        self._live("region_va")
        return self._region_va

    @region_va.setter
    def region_va(self, value: Any) -> None:
        self._region_va = value

    @property
    def ranks(self) -> int:
        return len(self.devices)

    @property
    def trace_path(self) -> Path | None:
        return self._engine.trace.path

    @property
    def trace_error(self) -> BaseException | None:
        """Why the trace is incomplete (a write failed), or None. Tracing never
        aborts the allocation it records; the caller decides what to do.

        Waits first until every line traced so far is on file: a trace file is written
        by a renderer process behind the allocation, which reports a failed write (a
        full disk) only when asked, so without the wait a lost trace showed up here
        only after release (and ``allocate(errors="raise")`` returned the cache)."""
        self._engine.trace.flush()  # (a no-op once the writer is closed or off)
        return self._engine.trace.error

    def _live(self, what: str) -> None:
        """Views of a released cache would be dangling device pointers: refuse them."""
        if self.released:
            raise ReleasedError(f"{what}: the cache was released; its addresses are "
                                "unmapped (allocate a new cache)")

    def _rank(self, rank: object) -> int:
        from kvgrant.runtime.arguments import check_index

        return check_index("rank", rank, self.ranks, "rank")

    def _region(self, region: object) -> str:
        from kvgrant.runtime.arguments import check_name

        return check_name("region", region, [r.name for r in self.geometry.regions])

    def _plane(self, plane: object) -> str:
        from kvgrant.runtime.arguments import check_name

        return check_name("plane", plane, [p.name for p in self.geometry.planes])

    def row_va(self, rank: int, region: str, row: int) -> int:
        """VA of ``row`` of ``region`` on ``rank``.

        Raises
        ------
        ReleasedError
            After :meth:`release`. ArgumentError: an unknown rank, region or row.
        """
        from kvgrant.runtime.arguments import check_index

        self._live("row_va")
        rank, region = self._rank(rank), self._region(region)
        reg = self.geometry.region_by_name[region]
        row = check_index("row", row, reg.rows, f"row of region {region!r}")
        return self.region_va[rank][region] + row * reg.row_bytes

    def plane(self, rank: int, plane: str) -> DeviceBuffer:
        """The whole plane (``pages * bytes_per_page`` bytes) of ``rank``."""
        self._live("plane")
        rank, plane = self._rank(rank), self._plane(plane)
        nbytes = self.capacity.pages * self.geometry.plane_by_name[plane].bytes_per_page
        return DeviceBuffer(self.plane_va[rank][plane], nbytes, self._view_device(rank),
                            getattr(self.driver, "name", "cuda"), owner=self)

    def page(self, rank: int, plane: str, page: int) -> DeviceBuffer:
        """KV page ``page`` of ``plane`` on ``rank``."""
        from kvgrant.runtime.arguments import check_index

        self._live("page")
        rank, plane = self._rank(rank), self._plane(plane)
        page = check_index("page", page, self.capacity.pages, "KV page")
        bpp = self.geometry.plane_by_name[plane].bytes_per_page
        return self.plane(rank, plane).slice(page * bpp, bpp)

    def row(self, rank: int, region: str, row: int) -> DeviceBuffer:
        """Row ``row`` of ``region`` on ``rank`` (``row_bytes`` bytes)."""
        self._live("row")
        reg = self.geometry.region_by_name[self._region(region)]
        return DeviceBuffer(self.row_va(rank, region, row), reg.row_bytes,
                            self._view_device(rank), getattr(self.driver, "name", "cuda"),
                            owner=self)

    def _view_device(self, rank: int) -> int:
        """The CUDA ordinal through which ``rank``'s memory is viewed: its own device
        here; a group process views an imported peer through its own device."""
        return self.devices[rank]

    def live(self) -> LiveCounts:
        return self.driver.live()

    def flush_trace(self) -> None:
        """Wait until every trace line so far is on file. Publish only hands the lines
        to the trace renderer (start-up does not wait for formatting); call this before
        reading the trace of a live cache."""
        self._engine.trace.flush()

    def summary(self) -> dict[str, Any]:
        """Capacities and object counts, JSON-ready (what ``kvgrant alloc`` prints)."""
        return {"geometry": self.geometry.name, "plan": self.plan.label,
                "backend": getattr(self.driver, "name", "?"), "ranks": self.ranks,
                "devices": list(self.devices), "capacity": self.capacity.as_dict(),
                "backend_reason": self.backend_reason,
                "counts": self.counts.as_dict(), "startup_s": round(self.startup_s, 6),
                "live": self.driver.live().as_dict()}

    def release(self) -> None:
        """Unpublish and tear everything down, LIFO; a second call does nothing.

        Raises
        ------
        DriverError
            An undo failed; the remaining undos still ran and every further failure
            is attached (``cleanup_errors``).
        KeyboardInterrupt
            A Ctrl-C came during the teardown (raised once it ran; failed undos are
            attached as ``cleanup_errors``).
        """
        if self.released:
            return
        self.released = True
        t0 = time.perf_counter()
        # A Ctrl-C waits until the teardown ran (a second one raises at once): raised
        # between two undos it would leave the rest of the cache live and unreachable.
        with DeferredInterrupt() as interrupt:
            try:
                with gc_paused():
                    errors = self._engine.shutdown(self._teardown)
            finally:
                self.release_s = time.perf_counter() - t0
            if self._owns_driver:
                self.driver.close()
        if interrupt.pending:  # the Ctrl-C goes on, carrying any undo that failed
            stop = KeyboardInterrupt()
            attach_cleanup_errors(stop, errors)
            raise stop
        if errors:
            first = errors[0]
            attach_cleanup_errors(first, errors[1:])
            raise first

    def __enter__(self) -> "Published":
        self._live("with")
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        """Release; an error of the with-block stays the one raised, and a failed
        release is attached to it (``cleanup_errors``) instead of replacing it."""
        try:
            self.release()
        except Exception as e:
            if exc is None:
                raise
            attach_cleanup_errors(exc, [e, *(getattr(e, "cleanup_errors", None) or [])])
