"""CudaDriver: the VMM calls through ``cuda.bindings.driver`` on real GPUs.

``cuda.bindings`` is imported only when a :class:`CudaDriver` is made or
:func:`cuda_available` is asked, so ``import kvgrant`` works without a driver.
One primary context per device is retained on first use and made current before
every call that runs in a device context; all are released in :meth:`CudaDriver.close`.
Every result is checked on the line after the call and raised as a
:class:`kvgrant.errors.DriverError` carrying the call, CUresult name, device, VA and size.

Access descriptors are built fresh per device: ``[desc] * n`` would put one shared
object in every slot, so the last device written would be granted n times and the
others not at all.
"""

from __future__ import annotations

import ctypes
import os
from collections import Counter
from typing import Any, Mapping, Sequence

from kvgrant.errors import BackendUnavailable, DriverError
from kvgrant.runtime.cuda_errors import driver_error, result_name
from kvgrant.runtime.driver import LiveCounts
from kvgrant.runtime.faults import Fault, FaultPlan, FaultState

__all__ = ["CudaDriver", "cuda_available", "driver_version", "usable_device_count"]


def _bindings() -> Any:
    """Import cuda.bindings.driver, or raise BackendUnavailable saying what to install."""
    try:
        from cuda.bindings import driver
    except Exception as exc:  # noqa: BLE001 - any import failure: backend unavailable
        raise BackendUnavailable(
            f"CUDA_ERROR_NOT_INITIALIZED: cuda-python is not importable ({exc}); "
            "install cuda-bindings, or use the 'sim' backend",
            call="import cuda.bindings", result=3,
            result_name="CUDA_ERROR_NOT_INITIALIZED") from exc
    return driver


def _init(drv: Any) -> int:
    """cuInit(0) and cuDeviceGetCount; BackendUnavailable when no driver/device."""
    try:
        (res,) = drv.cuInit(0)
    except Exception as exc:  # noqa: BLE001 - libcuda.so missing raises, not returns
        raise BackendUnavailable(
            f"CUDA_ERROR_NO_DEVICE: the NVIDIA driver library cannot be loaded ({exc}); "
            "use the 'sim' backend on machines without a GPU",
            call="cuInit", result=100, result_name="CUDA_ERROR_NO_DEVICE") from exc
    if int(res) != 0:
        raise driver_error(int(res), "cuInit failed: no usable NVIDIA driver/GPU; use the "
                           "'sim' backend", call="cuInit", cls=BackendUnavailable)
    res, count = drv.cuDeviceGetCount()
    if int(res) != 0 or count < 1:
        raise driver_error(int(res) or 100, "no CUDA device found", call="cuDeviceGetCount",
                           cls=BackendUnavailable)
    return int(count)


def _vmm_supported(drv: Any, ordinal: int) -> bool:
    res, dev = drv.cuDeviceGet(ordinal)
    if int(res) != 0:
        return False
    attr = drv.CUdevice_attribute.CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED
    res, value = drv.cuDeviceGetAttribute(attr, dev)
    return int(res) == 0 and bool(value)


def usable_device_count() -> int:
    """How many devices support VMM (0 when cuda.bindings or the driver is missing).

    Never raises: any failure means "none". Creates no context, so ``auto`` can ask
    before it opens a backend.
    """
    try:
        drv = _bindings()
        count = _init(drv)
        return sum(1 for i in range(count) if _vmm_supported(drv, i))
    except Exception:  # noqa: BLE001 - documented: never raises
        return 0


def cuda_available() -> bool:
    """True only if cuda.bindings imports, cuInit succeeds and some device supports VMM."""
    return usable_device_count() > 0


def driver_version() -> int | None:
    """cuDriverGetVersion (e.g. 13000 for CUDA 13.0), or None when unavailable."""
    try:
        drv = _bindings()
        _init(drv)
        res, version = drv.cuDriverGetVersion()
        return int(version) if int(res) == 0 else None
    except Exception:  # noqa: BLE001 - informational only
        return None


class CudaDriver:
    """The Driver interface on real GPUs through cuda-python.

    Parameters
    ----------
    faults : FaultPlan, Fault, list, or None
        Calls to fail before they reach the driver (for unwinding tests on a GPU).

    Raises
    ------
    BackendUnavailable
        cuda-python is missing, the driver cannot be initialised, or no device
        supports virtual memory management.

    Notes
    -----
    The driver tracks what it created (handles, mappings with their grants,
    reservations) so :meth:`live` can prove nothing leaked; only successful calls
    change that record.
    """

    name = "cuda"

    def __init__(self, faults: FaultPlan | Fault | Sequence[Fault | Mapping[str, object]]
                 | None = None) -> None:
        self._drv = _bindings()
        count = _init(self._drv)
        self._count = count
        self._vmm = [_vmm_supported(self._drv, i) for i in range(count)]
        if not any(self._vmm):
            raise BackendUnavailable(
                "CUDA_ERROR_NOT_SUPPORTED: no device supports virtual memory management "
                "(CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED = 0)",
                call="cuDeviceGetAttribute", result=801, result_name="CUDA_ERROR_NOT_SUPPORTED")
        self.faults = FaultPlan.coerce(faults)
        self._fault_state = FaultState(self.faults)
        self.calls: Counter[str] = Counter()
        self._devs: dict[int, Any] = {}
        self._ctx: dict[int, Any] = {}
        self._gran: dict[int, int] = {}
        self._handles: dict[int, tuple[Any, int | None, int | None]] = {}  # -> (obj, dev, size)
        self._maps: dict[int, tuple[int, int | None]] = {}      # va -> (size, device)
        self._access: dict[int, set[int]] = {}                   # mapping va -> devices
        self._res: dict[int, tuple[int, int | None]] = {}        # va -> (size, device)
        self._refs: dict[int, int] = {}                          # handle -> handouts
        self._exports: dict[int, tuple[int | None, int | None]] = {}  # fd -> (device, size)
        self._closed = False
        d = self._drv
        self._POSIX_FD = d.CUmemAllocationHandleType.CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR
        self._LOC_DEVICE = d.CUmemLocationType.CU_MEM_LOCATION_TYPE_DEVICE
        self._RW = d.CUmemAccess_flags.CU_MEM_ACCESS_FLAGS_PROT_READWRITE

    # ----------------------------------------------------------------- plumbing
    def _enter(self, call: str, device: int | None, va: int | None = None,
               size: int | None = None) -> None:
        self.calls[call] += 1
        if self._closed:
            raise driver_error("CUDA_ERROR_DEINITIALIZED", "the driver was closed", call=call,
                               device=device, va=va, size=size)
        if self._fault_state:
            fault = self._fault_state.check(call, device)
            if fault is not None:
                raise driver_error(fault.result, fault.describe(), call=call, device=device,
                                   va=va, size=size)

    def _check(self, res: Any, call: str, device: int | None = None, va: int | None = None,
               size: int | None = None) -> None:
        """Raise DriverError for a non-success CUresult, with the driver's own text."""
        code = int(res)
        if code == 0:
            return
        err, text = self._drv.cuGetErrorString(res)
        why = text.decode() if int(err) == 0 and isinstance(text, bytes) else result_name(res)
        raise driver_error(code, why, call=call, device=device, va=va, size=size)

    def _device_ok(self, device: object, call: str) -> int:
        if isinstance(device, bool) or not isinstance(device, int) or not (
                0 <= device < self._count):
            raise driver_error("CUDA_ERROR_INVALID_DEVICE", f"device = {device!r}: not a "
                               f"device ordinal (0..{self._count - 1})", call=call)
        return device

    def _current(self, device: int) -> None:
        """Make ``device``'s primary context current, retaining it on first use."""
        ctx = self._ctx.get(device)
        if ctx is None:
            res, dev = self._drv.cuDeviceGet(device)
            self._check(res, "cuDeviceGet", device)
            res, ctx = self._drv.cuDevicePrimaryCtxRetain(dev)
            self._check(res, "cuDevicePrimaryCtxRetain", device)
            self._devs[device] = dev
            self._ctx[device] = ctx
        (res,) = self._drv.cuCtxSetCurrent(ctx)
        self._check(res, "cuCtxSetCurrent", device)

    def _prop(self, device: int) -> Any:
        prop = self._drv.CUmemAllocationProp()
        prop.type = self._drv.CUmemAllocationType.CU_MEM_ALLOCATION_TYPE_PINNED
        prop.location.type = self._LOC_DEVICE
        prop.location.id = device
        prop.requestedHandleTypes = self._POSIX_FD
        return prop

    def _maps_in(self, va: int, size: int) -> list[int]:
        """Starts of tracked mappings inside [va, va+size) (for grant bookkeeping)."""
        if self._maps.get(va, (None,))[0] == size:      # the common case: one mapping
            return [va]
        end = va + size
        return [m for m, (s, _) in self._maps.items() if va <= m and m + s <= end]

    # -------------------------------------------------------------------- queries
    def device_count(self) -> int:
        return self._count

    def granularity(self, device: int) -> int:
        call = "cuMemGetAllocationGranularity"
        self._enter(call, device)
        self._device_ok(device, call)
        if device not in self._gran:
            flag = self._drv.CUmemAllocationGranularity_flags.CU_MEM_ALLOC_GRANULARITY_MINIMUM
            res, gran = self._drv.cuMemGetAllocationGranularity(self._prop(device), flag)
            self._check(res, call, device)
            self._gran[device] = int(gran)
        return self._gran[device]

    def free_memory(self, device: int) -> tuple[int, int]:
        call = "cuMemGetInfo"
        self._enter(call, device)
        self._current(self._device_ok(device, call))
        res, free, total = self._drv.cuMemGetInfo()
        self._check(res, call, device)
        return int(free), int(total)

    def live(self) -> LiveCounts:
        return LiveCounts(handles=sum(self._refs.values()), mappings=len(self._maps),
                          grants=sum(len(v) for v in self._access.values()),
                          reserved_bytes=sum(s for s, _ in self._res.values()),
                          reservations=len(self._res))

    def describe(self) -> dict[str, object]:
        """Driver version and device names, for logs and docs."""
        names = []
        for i in range(self._count):
            res, dev = self._drv.cuDeviceGet(i)
            self._check(res, "cuDeviceGet", i)
            res, raw = self._drv.cuDeviceGetName(128, dev)
            self._check(res, "cuDeviceGetName", i)
            names.append(raw.split(b"\0", 1)[0].decode())
        res, version = self._drv.cuDriverGetVersion()
        self._check(res, "cuDriverGetVersion")
        return {"driver_version": int(version), "devices": names, "vmm": list(self._vmm)}

    # ----------------------------------------------------------- address space
    def reserve(self, size: int, alignment: int = 0, device: int | None = None) -> int:
        call = "cuMemAddressReserve"
        self._enter(call, device, size=size)
        self._current(self._device_ok(device if device is not None else 0, call))
        res, ptr = self._drv.cuMemAddressReserve(size, alignment, 0, 0)
        self._check(res, call, device, size=size)
        va = int(ptr)
        self._res[va] = (size, device)
        return va

    def free_address(self, va: int, size: int) -> None:
        call = "cuMemAddressFree"
        device = self._res.get(va, (0, None))[1]
        self._enter(call, device, va, size)
        self._current(device if device is not None else 0)
        (res,) = self._drv.cuMemAddressFree(va, size)
        self._check(res, call, device, va, size)
        self._res.pop(va, None)

    # ------------------------------------------------------------------ handles
    def create(self, size: int, device: int) -> int:
        call = "cuMemCreate"
        self._enter(call, device, size=size)
        self._current(self._device_ok(device, call))
        res, handle = self._drv.cuMemCreate(size, self._prop(device), 0)
        self._check(res, call, device, size=size)
        key = int(handle)
        self._track_handle(key, handle, device, size)
        return key

    def release(self, handle: int) -> None:
        call = "cuMemRelease"
        obj, device, size = self._handles.get(handle, (handle, None, None))
        self._enter(call, device, size=size)
        (res,) = self._drv.cuMemRelease(obj)
        self._check(res, call, device, size=size)
        left = self._refs.get(handle, 1) - 1
        if left > 0:
            self._refs[handle] = left
        else:
            self._refs.pop(handle, None)
            self._handles.pop(handle, None)

    def export_handle(self, handle: int) -> int:
        call = "cuMemExportToShareableHandle"
        obj, device, size = self._handles.get(handle, (handle, None, None))
        self._enter(call, device, size=size)
        res, fd = self._drv.cuMemExportToShareableHandle(obj, self._POSIX_FD, 0)
        self._check(res, call, device, size=size)
        self._exports[int(fd)] = (device, size)
        return int(fd)

    def import_handle(self, fd: int) -> int:
        call = "cuMemImportFromShareableHandle"
        device, size = self._exports.get(fd, (None, None))
        self._enter(call, device, size=size)
        res, handle = self._drv.cuMemImportFromShareableHandle(fd, self._POSIX_FD)
        self._check(res, call, device, size=size)
        key = int(handle)
        if device is None:               # exported by another process: ask the driver
            res, prop = self._drv.cuMemGetAllocationPropertiesFromHandle(handle)
            device = int(prop.location.id) if int(res) == 0 else None
        self._track_handle(key, handle, device, size)
        return key

    def _track_handle(self, key: int, obj: Any, device: int | None, size: int | None) -> None:
        """Count a live handle; the driver may hand back a value that is already live
        (an import of our own export), which then needs one release per handout."""
        if key in self._handles:
            obj, device, size = self._handles[key]
        self._handles[key] = (obj, device, size)
        self._refs[key] = self._refs.get(key, 0) + 1

    def close_shareable(self, fd: int) -> None:
        self._exports.pop(fd, None)
        os.close(fd)

    # ----------------------------------------------------------------- mappings
    def map(self, va: int, size: int, handle: int) -> None:
        call = "cuMemMap"
        obj, device, _ = self._handles.get(handle, (handle, None, None))
        self._enter(call, device, va, size)
        (res,) = self._drv.cuMemMap(va, size, 0, obj, 0)
        self._check(res, call, device, va, size)
        self._maps[va] = (size, device)
        self._access[va] = set()

    def unmap(self, va: int, size: int) -> None:
        call = "cuMemUnmap"
        device = self._maps.get(va, (0, None))[1]
        self._enter(call, device, va, size)
        (res,) = self._drv.cuMemUnmap(va, size)
        self._check(res, call, device, va, size)
        for m in self._maps_in(va, size):
            del self._maps[m]
            self._access.pop(m, None)

    def set_access(self, va: int, size: int, devices: Sequence[int]) -> None:
        call = "cuMemSetAccess"
        device = self._maps.get(va, (0, None))[1]
        self._enter(call, device, va, size)
        descs = []
        for d in devices:                       # one fresh descriptor per device
            desc = self._drv.CUmemAccessDesc()
            desc.location.type = self._LOC_DEVICE
            desc.location.id = self._device_ok(d, call)
            desc.flags = self._RW
            descs.append(desc)
        (res,) = self._drv.cuMemSetAccess(va, size, descs, len(descs))
        self._check(res, call, device, va, size)
        for m in self._maps_in(va, size):
            self._access.setdefault(m, set()).update(int(d) for d in devices)

    def get_access(self, va: int, device: int) -> bool:
        call = "cuMemGetAccess"
        self._enter(call, device, va)
        loc = self._drv.CUmemLocation()
        loc.type = self._LOC_DEVICE
        loc.id = self._device_ok(device, call)
        res, flags = self._drv.cuMemGetAccess(loc, va)
        self._check(res, call, device, va)
        return int(flags) == int(self._RW)

    # -------------------------------------------------------------------- bytes
    def write(self, va: int, data: bytes, device: int) -> None:
        call = "cuMemcpyHtoD"
        buf = ctypes.create_string_buffer(bytes(data), len(data))
        self._enter(call, device, va, len(data))
        self._current(self._device_ok(device, call))
        (res,) = self._drv.cuMemcpyHtoD(va, ctypes.addressof(buf), len(data))
        self._check(res, call, device, va, len(data))
        (res,) = self._drv.cuCtxSynchronize()     # order against reads in other contexts
        self._check(res, "cuCtxSynchronize", device, va, len(data))

    def read(self, va: int, size: int, device: int) -> bytes:
        call = "cuMemcpyDtoH"
        self._enter(call, device, va, size)
        self._current(self._device_ok(device, call))
        buf = ctypes.create_string_buffer(size)
        (res,) = self._drv.cuMemcpyDtoH(ctypes.addressof(buf), va, size)
        self._check(res, call, device, va, size)
        return buf.raw[:size]

    def close(self) -> None:
        """Release every retained primary context; later calls fail DEINITIALIZED."""
        if self._closed:
            return
        self._closed = True
        errors: list[DriverError] = []
        for device, dev in list(self._devs.items()):
            (res,) = self._drv.cuDevicePrimaryCtxRelease(dev)
            if int(res) != 0:
                errors.append(driver_error(int(res), "releasing the primary context",
                                           call="cuDevicePrimaryCtxRelease", device=device))
        self._devs.clear()
        self._ctx.clear()
        if errors:
            raise errors[0]
