"""A fake ``cuda.bindings.driver`` (see ../../README.md): VMM calls on a counter."""

from __future__ import annotations

import enum
import itertools
import os
from types import SimpleNamespace
from typing import Any

from kvgrant.runtime.hostpool import HostPool

G = 2 << 20
TOTAL = 150_109_880_320
DEVICES = int(os.environ.get("FAKECUDA_DEVICES", "2"))


class CUresult(enum.IntEnum):
    CUDA_SUCCESS = 0
    CUDA_ERROR_INVALID_VALUE = 1
    CUDA_ERROR_OUT_OF_MEMORY = 2
    CUDA_ERROR_NOT_INITIALIZED = 3
    CUDA_ERROR_NO_DEVICE = 100
    CUDA_ERROR_INVALID_DEVICE = 101
    CUDA_ERROR_NOT_SUPPORTED = 801


class CUmemAllocationType(enum.IntEnum):
    CU_MEM_ALLOCATION_TYPE_PINNED = 1


class CUmemLocationType(enum.IntEnum):
    CU_MEM_LOCATION_TYPE_INVALID = 0
    CU_MEM_LOCATION_TYPE_DEVICE = 1


class CUmemAccess_flags(enum.IntEnum):
    CU_MEM_ACCESS_FLAGS_PROT_NONE = 0
    CU_MEM_ACCESS_FLAGS_PROT_READWRITE = 3


class CUmemAllocationGranularity_flags(enum.IntEnum):
    CU_MEM_ALLOC_GRANULARITY_MINIMUM = 0


class CUmemAllocationHandleType(enum.IntEnum):
    CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR = 1


class CUdevice_attribute(enum.IntEnum):
    CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED = 102


class CUmemLocation:
    def __init__(self) -> None:
        self.type = CUmemLocationType.CU_MEM_LOCATION_TYPE_INVALID
        self.id = 0


class CUmemAllocationProp:
    def __init__(self) -> None:
        self.type = 0
        self.location = CUmemLocation()
        self.requestedHandleTypes = 0


class CUmemAccessDesc:
    def __init__(self) -> None:
        self.location = CUmemLocation()
        self.flags = CUmemAccess_flags.CU_MEM_ACCESS_FLAGS_PROT_NONE


_S = CUresult.CUDA_SUCCESS
_state = SimpleNamespace(init=False, current=None, used=[0] * DEVICES, handles={}, maps={},
                         res={}, next_va=itertools.count(1), pool=None)


def _pool() -> HostPool:
    if _state.pool is None:
        _state.pool = HostPool(os.environ["FAKECUDA_POOL"], int(os.environ["FAKECUDA_BUDGET"]))
    return _state.pool


def cuInit(flags: int) -> tuple[Any]:
    _state.init = True
    return (_S,)


def cuDriverGetVersion() -> tuple[Any, int]:
    return _S, 13000


def cuGetErrorString(res: Any) -> tuple[Any, bytes]:
    return _S, CUresult(int(res)).name.encode()


def cuDeviceGetCount() -> tuple[Any, int]:
    return _S, DEVICES


def cuDeviceGet(i: int) -> tuple[Any, Any]:
    return (_S, i) if 0 <= i < DEVICES else (CUresult.CUDA_ERROR_INVALID_DEVICE, None)


def cuDeviceGetAttribute(attr: Any, dev: int) -> tuple[Any, int]:
    return _S, 1


def cuDevicePrimaryCtxRetain(dev: int) -> tuple[Any, Any]:
    return _S, ("ctx", dev)


def cuDevicePrimaryCtxRelease(dev: int) -> tuple[Any]:
    return (_S,)


def cuCtxSetCurrent(ctx: Any) -> tuple[Any]:
    _state.current = ctx[1]
    return (_S,)


def cuMemGetAllocationGranularity(prop: Any, flag: Any) -> tuple[Any, int]:
    return _S, G


def cuMemGetInfo() -> tuple[Any, int, int]:
    d = _state.current or 0
    return _S, TOTAL - _state.used[d], TOTAL


def cuMemCreate(size: int, prop: Any, flags: int) -> tuple[Any, Any]:
    d = prop.location.id
    if size % G or TOTAL - _state.used[d] < size:
        return CUresult.CUDA_ERROR_OUT_OF_MEMORY, None
    h = len(_state.handles) + 1 + max(_state.handles, default=0)
    _state.handles[h] = (size, d)
    _state.used[d] += size
    return _S, h


def cuMemRelease(h: Any) -> tuple[Any]:
    size, d = _state.handles.pop(int(h))
    _state.used[d] -= size
    return (_S,)


def cuMemAddressReserve(size: int, align: int, addr: int, flags: int) -> tuple[Any, int]:
    va = next(_state.next_va) << 42  # far apart: every reservation has room
    _state.res[va] = size
    return _S, va


def cuMemAddressFree(va: int, size: int) -> tuple[Any]:
    return (_S,) if _state.res.pop(int(va), None) == size else (CUresult.CUDA_ERROR_INVALID_VALUE,)


def cuMemMap(va: int, size: int, off: int, h: Any, flags: int) -> tuple[Any]:
    if int(va) in _state.maps or int(h) not in _state.handles:
        return (CUresult.CUDA_ERROR_INVALID_VALUE,)
    _state.maps[int(va)] = [size, set()]
    return (_S,)


def _whole(va: int, size: int) -> list[int] | None:
    out, pos = [], int(va)
    while pos < va + size:
        m = _state.maps.get(pos)
        if m is None:
            return None
        out.append(pos)
        pos += m[0]
    return out if pos == va + size else None


def cuMemUnmap(va: int, size: int) -> tuple[Any]:
    starts = _whole(int(va), size)
    if starts is None:
        return (CUresult.CUDA_ERROR_INVALID_VALUE,)
    freed = sum(len(_state.maps.pop(s)[1]) for s in starts)
    if freed:
        _pool().give(freed)
    return (_S,)


def cuMemSetAccess(va: int, size: int, descs: list[Any], count: int) -> tuple[Any]:
    starts = _whole(int(va), size)
    if starts is None or count < 1:
        return (CUresult.CUDA_ERROR_INVALID_VALUE,)
    want = {int(d.location.id) for d in descs[:count]}
    new = sum(len(want - _state.maps[s][1]) for s in starts)
    if new and not _pool().take(new)[0]:
        return (CUresult.CUDA_ERROR_OUT_OF_MEMORY,)
    for s in starts:
        _state.maps[s][1] |= want
    return (_S,)


def cuMemGetAccess(loc: Any, va: int) -> tuple[Any, int]:
    m = _state.maps.get(int(va))
    if m is None:
        return CUresult.CUDA_ERROR_INVALID_VALUE, 0
    return _S, 3 if int(loc.id) in m[1] else 0
