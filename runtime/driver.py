"""The small driver interface kvgrant needs from the CUDA VMM API.

Two backends implement it: ``sim`` (:mod:`kvgrant.runtime.sim`, pure Python, the
default without a GPU) and ``cuda`` (:mod:`kvgrant.runtime.cuda`, cuda-python,
loaded lazily so ``import kvgrant`` works without a driver). Devices are CUDA
ordinals; the allocator runs rank r on device ``devices[r]``.

Every method raises :class:`kvgrant.errors.DriverError` carrying the call name,
the CUresult (value and name), the device and the VA range when a call fails.
Both backends count every call they make in ``calls`` (a ``Counter`` keyed by the
driver entry point, e.g. ``"cuMemSetAccess"``) and accept ``faults=`` (a
:class:`kvgrant.runtime.faults.FaultPlan`) that makes chosen calls fail.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from typing import Protocol, Sequence, runtime_checkable

from kvgrant.errors import BackendUnavailable

__all__ = ["BACKENDS", "Driver", "LiveCounts", "open_driver"]

BACKENDS: tuple[str, ...] = ("auto", "sim", "cuda")


@dataclass(frozen=True)
class LiveCounts:
    """Live driver objects; all zero once everything was released."""

    handles: int = 0          # cuMemCreate / import handles not yet released
    mappings: int = 0         # cuMemMap ranges not yet unmapped
    grants: int = 0           # (mapping, device) access pairs currently set
    reserved_bytes: int = 0   # cuMemAddressReserve bytes not yet freed
    reservations: int = 0     # cuMemAddressReserve ranges not yet freed

    def is_empty(self) -> bool:
        return not (self.handles or self.mappings or self.grants or self.reserved_bytes
                    or self.reservations)

    def as_dict(self) -> dict[str, int]:
        return {"handles": self.handles, "mappings": self.mappings, "grants": self.grants,
                "reserved_bytes": self.reserved_bytes, "reservations": self.reservations}


@runtime_checkable
class Driver(Protocol):
    """VMM calls, one method per driver entry point kvgrant uses."""

    name: str  # "sim" or "cuda"
    calls: Counter[str]  # calls made so far, by driver entry point (failed ones included)

    def device_count(self) -> int: ...
    def granularity(self, device: int) -> int:
        """cuMemGetAllocationGranularity (minimum) for pinned device memory."""
    def free_memory(self, device: int) -> tuple[int, int]:
        """(free, total) bytes of ``device`` (cuMemGetInfo in its context)."""
    def reserve(self, size: int, alignment: int = 0, device: int | None = None) -> int:
        """cuMemAddressReserve; returns the VA. ``device`` picks the context the call runs
        in and the device errors and faults are attributed to (the rank's device)."""
    def free_address(self, va: int, size: int) -> None:
        """cuMemAddressFree of a whole reservation."""
    def create(self, size: int, device: int) -> int:
        """cuMemCreate of pinned device memory on ``device``; returns a handle."""
    def release(self, handle: int) -> None:
        """cuMemRelease."""
    def map(self, va: int, size: int, handle: int) -> None:
        """cuMemMap of the whole handle (handle offset 0) at ``va``."""
    def unmap(self, va: int, size: int) -> None:
        """cuMemUnmap; also drops the access set on that range."""
    def set_access(self, va: int, size: int, devices: Sequence[int]) -> None:
        """One cuMemSetAccess with one read-write descriptor per device."""
    def get_access(self, va: int, device: int) -> bool:
        """cuMemGetAccess: does ``device`` have read-write access at ``va``?"""
    def export_handle(self, handle: int) -> int:
        """cuMemExportToShareableHandle (POSIX fd); returns the fd."""
    def import_handle(self, fd: int) -> int:
        """cuMemImportFromShareableHandle; returns a new handle (counts as live)."""
    def close_shareable(self, fd: int) -> None:
        """Close an exported fd (os.close on cuda); the import keeps its own reference."""
    def write(self, va: int, data: bytes, device: int) -> None:
        """Copy host bytes to ``va`` as seen by ``device`` (cuMemcpyHtoD in its context)."""
    def read(self, va: int, size: int, device: int) -> bytes:
        """Copy ``size`` bytes at ``va`` as seen by ``device`` to the host (cuMemcpyDtoH)."""
    def live(self) -> LiveCounts:
        """Objects this driver instance created and has not yet destroyed."""
    def close(self) -> None:
        """Drop contexts/state; live objects must already be gone."""


def open_driver(backend: str = "auto", **options: object) -> Driver:
    """Open a backend by name: ``sim``, ``cuda``, or ``auto`` (cuda when a GPU is
    usable, else sim). Options go to the backend's constructor.

    Raises
    ------
    BackendUnavailable
        ``backend`` is not one of :data:`BACKENDS`, or ``cuda`` was asked for and no
        VMM-capable GPU is usable here.
    ArgumentError
        An option the backend's driver does not take (the message lists those it does).
    """
    if backend not in BACKENDS:
        raise BackendUnavailable(
            f"CUDA_ERROR_INVALID_VALUE: backend = {backend!r}: must be one of "
            f"{', '.join(repr(b) for b in BACKENDS)}",
            call="open_driver", result=1, result_name="CUDA_ERROR_INVALID_VALUE")
    from kvgrant.runtime.arguments import check_driver_options

    if backend in ("auto", "cuda"):
        from kvgrant.runtime import cuda as cuda_backend

        if backend == "cuda" or cuda_backend.cuda_available():
            # an option the driver does not take was a TypeError from its constructor
            check_driver_options("options", options, "cuda")
            return cuda_backend.CudaDriver(**options)  # type: ignore[arg-type]
    from kvgrant.runtime.sim import SimDriver

    check_driver_options("options", options, "sim")
    return SimDriver(**options)  # type: ignore[arg-type]
