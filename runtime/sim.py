"""SimDriver: a pure-Python VMM driver that enforces what the CUDA driver enforces.

It is the default backend without a GPU and the one the published-scale run uses
(16 ranks in one process, thousands of allocations, grants to 8 or 16 devices), so
every call is O(log n) dict/bisect bookkeeping and no call does per-byte work; bytes
written through :meth:`SimDriver.write` are stored lazily in 64 KiB pages, so a
simulated 140 GiB device costs nothing until it is written.

Rules enforced (each failure is a :class:`kvgrant.errors.DriverError` with the CUresult
the real driver returns):

* sizes, VAs and alignments are multiples of the granularity G (CUDA_ERROR_INVALID_VALUE);
* ``map`` maps a whole live handle (handle offset 0; a partial handle is
  CUDA_ERROR_NOT_SUPPORTED) inside one reservation and never overlaps another mapping
  (CUDA_ERROR_INVALID_VALUE);
* ``set_access`` and ``unmap`` cover one or more whole mappings (a part of a mapping or
  an unmapped range is CUDA_ERROR_INVALID_VALUE); ``free_address`` takes a whole
  reservation with no mapping left in it;
* ``get_access`` needs a mapped address; ``read``/``write`` need mapped ranges granted
  to the reading device (CUDA_ERROR_ILLEGAL_ADDRESS otherwise, where the real driver
  would fault the context);
* physical memory returns to its device only when the last handle *and* the last
  mapping (and any exported fd) are gone; ``create`` beyond free memory fails with
  CUDA_ERROR_OUT_OF_MEMORY;
* exported handles are real fds: the first export moves the allocation's bytes into a
  memfd (named after its device), each export returns a new fd of it, and another
  process's SimDriver imports that fd by mapping the same memfd, so bytes one process
  writes are the bytes the other reads (the group runtime passes these fds over a Unix
  socket). Imported memory counts against the owner's device use, not the importer's;
  lazily, because a memfd per allocation would spend an fd per allocation that is
  never shared (a published-scale one-process run has tens of thousands);
* the driver-handle budget: every (mapping, granted device) pair spends one handle; a
  ``set_access`` that would exceed ``handle_budget`` fails with CUDA_ERROR_OUT_OF_MEMORY
  while memory is still free, as measured on an H200 with driver 580 (523,880 grants
  succeed; the 523,881st fails). Allocations and ungranted mappings spend nothing. On a
  real host that budget is one pool for every process and GPU; a driver given a
  ``host_pool`` (or ``KVGRANT_SIM_POOL``) draws from a pool shared with the SimDrivers of
  other processes (:mod:`kvgrant.runtime.hostpool`); without one it counts alone, as if
  it were the only process on its host.

Each of these results was checked against the real driver on an H200 (driver 580,
see ``docs/drivers.md``), except the budget (measured separately, not re-run), a map
outside a reservation (not probed) and ``get_access`` on an unmapped address, where
only "an error" was confirmed.
"""

from __future__ import annotations

import bisect
import mmap
import os
from collections import Counter
from typing import Mapping, Sequence

from kvgrant.errors import ArgumentError, DriverError
from kvgrant.runtime.cuda_errors import driver_error
from kvgrant.runtime.driver import LiveCounts
from kvgrant.runtime.faults import Fault, FaultPlan, FaultState
from kvgrant.runtime.hostpool import POOL_ENV, HostPool

__all__ = [
    "DEFAULT_DEVICES",
    "DEFAULT_GRANULARITY",
    "DEFAULT_HANDLE_BUDGET",
    "H200_MEMORY_BYTES",
    "SimDriver",
]

DEFAULT_DEVICES = 8
DEFAULT_GRANULARITY = 2 * 1024 * 1024
H200_MEMORY_BYTES = 150_109_880_320         # cuMemGetInfo total of one H200, driver 580
DEFAULT_HANDLE_BUDGET = 523_880             # (mapping, device) grants a host can hold

_VA_BASE = 0x7F00_0000_0000                  # where simulated reservations start
_MEMFD_PREFIX = "kvgrant-sim-dev"            # memfd name: the owner's device follows
_PAGE = 1 << 16                              # lazy byte-store page size

_INVALID = "CUDA_ERROR_INVALID_VALUE"
_OOM = "CUDA_ERROR_OUT_OF_MEMORY"
_BAD_DEVICE = "CUDA_ERROR_INVALID_DEVICE"
_ILLEGAL = "CUDA_ERROR_ILLEGAL_ADDRESS"
_DEINIT = "CUDA_ERROR_DEINITIALIZED"
_NOT_SUPPORTED = "CUDA_ERROR_NOT_SUPPORTED"


class _Phys:
    """Physical memory of one cuMemCreate; freed when ``refs`` drops to zero.

    Bytes live in lazy 64 KiB ``pages`` until the memory is first exported; then they
    move into a memfd (``memfd``, mapped as ``mm``) so that another process that imports
    an fd of it maps the very same bytes. ``foreign`` memory was imported from another
    process: its bytes are the owner's and are not counted in this driver's device use.
    """

    __slots__ = ("size", "device", "refs", "pages", "memfd", "mm", "key", "foreign")

    def __init__(self, size: int, device: int) -> None:
        self.size = size
        self.device = device
        self.refs = 0                      # live handles + mappings + open fds
        self.pages: dict[int, bytearray] = {}
        self.memfd: int | None = None      # owner side: kept open to export more fds
        self.mm: mmap.mmap | None = None   # the shared bytes once exported or imported
        self.key: tuple[int, int] | None = None  # (st_dev, st_ino) of the memfd
        self.foreign = False


class _Mapping:
    __slots__ = ("va", "size", "phys", "access")

    def __init__(self, va: int, size: int, phys: _Phys) -> None:
        self.va = va
        self.size = size
        self.phys = phys
        self.access: set[int] = set()


class _Reservation:
    __slots__ = ("va", "size", "device", "starts", "maps")

    def __init__(self, va: int, size: int, device: int | None) -> None:
        self.va = va
        self.size = size
        self.device = device
        self.starts: list[int] = []            # sorted mapping starts
        self.maps: dict[int, _Mapping] = {}    # start -> mapping


def _check_pool_path(field: str, path: object) -> None:
    """A pool file path: a non-empty str or path-like without NUL whose folder exists
    (was: ``--sim-pool ""`` read the working folder, ``/missing/p`` made the folder)."""
    from kvgrant.runtime.arguments import is_switch_word

    if not isinstance(path, (str, os.PathLike)) or isinstance(path, bytes):
        raise ArgumentError(f"{field} = {path!r}: must be the path of a pool file, or a "
                            "HostPool", argument=field, value=path)
    raw = os.fspath(path)
    if not raw.strip() or "\0" in raw:
        raise ArgumentError(f"{field} = {raw!r}: must be a file path (not blank, no NUL)",
                            argument=field, value=raw)
    folder = os.path.dirname(raw) or "."
    if os.path.isdir(raw) or not os.path.isdir(folder):
        rule = ("is a folder; name the pool file itself" if os.path.isdir(raw)
                else f"its folder {folder!r} does not exist (the pool file is made there)")
        raise ArgumentError(f"{field} = {raw!r}: {rule}", argument=field, value=raw)
    if field == POOL_ENV and is_switch_word(raw):
        raise ArgumentError(f"{POOL_ENV} = {raw!r}: must be the path of a pool file shared "
                            "by the simulated drivers of one host, not a switch; unset it "
                            "for no pool", argument=POOL_ENV, value=raw)


def _env_pool_path() -> str | None:
    """The pool file ``$KVGRANT_SIM_POOL`` names (unset or empty: None), checked as a
    path: ``KVGRANT_SIM_POOL=1`` made a pool file named ``1`` (the ledger's and the
    trace's variables refuse switch words)."""
    raw = os.environ.get(POOL_ENV)
    if not raw:
        return None
    _check_pool_path(POOL_ENV, raw)   # a blank value too
    return raw


class SimDriver:
    """Simulated CUDA VMM driver (see the module docstring for the rules it enforces).

    Parameters
    ----------
    devices : int
        Number of simulated GPUs (ordinals ``0..devices-1``).
    memory_per_device : int
        Total bytes per device, as ``cuMemGetInfo`` reports (default: one H200).
    granularity : int
        Allocation granularity G, a power of two (default 2 MiB, as on H200).
    handle_budget : int
        (mapping, granted device) pairs the simulated host holds before ``set_access``
        fails with CUDA_ERROR_OUT_OF_MEMORY: this driver's alone, or the shared pool's.
    host_pool : path, HostPool, or None
        A pool file shared with the SimDrivers of other processes on one simulated host
        (:class:`~kvgrant.runtime.hostpool.HostPool`, made with ``handle_budget``);
        None reads ``KVGRANT_SIM_POOL`` (unset or empty: no pool, this driver alone).
    faults : FaultPlan, Fault, list of Fault/dict, or None
        Calls to fail on purpose (see :mod:`kvgrant.runtime.faults`).
    used_by_others : int or mapping device -> int
        Bytes already in use on each device by someone else (contexts, other
        processes), so ``free_memory`` starts below ``memory_per_device``.
    """

    name = "sim"

    def __init__(self, devices: int = DEFAULT_DEVICES,
                 memory_per_device: int = H200_MEMORY_BYTES,
                 granularity: int = DEFAULT_GRANULARITY,
                 handle_budget: int = DEFAULT_HANDLE_BUDGET,
                 faults: FaultPlan | Fault | Sequence[Fault | Mapping[str, object]] | None = None,
                 used_by_others: int | Mapping[int, int] = 0,
                 host_pool: "str | os.PathLike[str] | HostPool | None" = None) -> None:
        from kvgrant.runtime.arguments import MAX_DEVICE_ORDINAL

        # bounded: the sim keeps a table per device (10^8 devices were killed at 21.7 GB)
        _require_int("devices", devices, minimum=1, maximum=MAX_DEVICE_ORDINAL + 1)
        _require_int("memory_per_device", memory_per_device, minimum=0, maximum=1 << 62)
        _require_int("granularity", granularity, minimum=1, maximum=1 << 40)
        if granularity & (granularity - 1):
            raise ArgumentError(f"granularity = {granularity}: must be a power of two",
                                argument="granularity", value=granularity)
        _require_int("handle_budget", handle_budget, minimum=0, maximum=1 << 62)
        self.devices = devices
        self.memory_per_device = memory_per_device
        self.G = granularity
        self.handle_budget = handle_budget
        self.faults = FaultPlan.coerce(faults)
        self._fault_state = FaultState(self.faults)
        others = (dict(used_by_others) if isinstance(used_by_others, Mapping)
                  else {d: used_by_others for d in range(devices)})
        for d, n in others.items():
            _require_int(f"used_by_others[{d!r}]", n, minimum=0)
            if isinstance(d, bool) or not isinstance(d, int) or not 0 <= d < devices:
                raise ArgumentError(f"used_by_others key = {d!r}: not a device "
                                    f"(0..{devices - 1})", argument="used_by_others", value=d)
            if n > memory_per_device:
                raise ArgumentError(f"used_by_others[{d}] = {n}: exceeds memory_per_device "
                                    f"= {memory_per_device}", argument="used_by_others",
                                    value=n)
        self._others = [others.get(d, 0) for d in range(devices)]
        self.calls: Counter[str] = Counter()
        self._used = [0] * devices
        self._next_va = _VA_BASE
        self._res_starts: list[int] = []
        self._res: dict[int, _Reservation] = {}
        self._handles: dict[int, _Phys] = {}
        self._next_handle = 1
        self._fds: dict[int, _Phys] = {}        # fds this driver exported, still open
        self._shared: dict[tuple[int, int], _Phys] = {}  # memfd (dev, inode) -> memory
        self._mappings = 0
        self._grants = 0
        self._reserved = 0
        self._closed = False
        if host_pool is None:
            host_pool = _env_pool_path()
        elif not isinstance(host_pool, HostPool):
            _check_pool_path("host_pool", host_pool)
        self._owns_pool = host_pool is not None and not isinstance(host_pool, HostPool)
        self.host_pool: HostPool | None = (
            HostPool(host_pool, handle_budget) if self._owns_pool  # type: ignore[arg-type]
            else host_pool)  # type: ignore[assignment]

    # ----------------------------------------------------------------- bookkeeping
    def _enter(self, call: str, device: int | None, va: int | None = None,
               size: int | None = None) -> None:
        """Count the call, refuse it after close, and fire any injected fault."""
        self.calls[call] += 1
        if self._closed:
            raise driver_error(_DEINIT, "the driver was closed", call=call, device=device,
                               va=va, size=size)
        if self._fault_state:
            fault = self._fault_state.check(call, device)
            if fault is not None:
                raise driver_error(fault.result, fault.describe(), call=call, device=device,
                                   va=va, size=size)

    def _err(self, result: str, why: str, call: str, device: int | None = None,
             va: int | None = None, size: int | None = None) -> DriverError:
        return driver_error(result, why, call=call, device=device, va=va, size=size)

    def _check_device(self, device: object, call: str) -> int:
        if isinstance(device, bool) or not isinstance(device, int) or not (
                0 <= device < self.devices):
            raise self._err(_BAD_DEVICE, f"device = {device!r}: not a device ordinal "
                            f"(0..{self.devices - 1})", call)
        return device

    def _check_size(self, size: object, call: str, device: int | None = None,
                    va: int | None = None, what: str = "size") -> int:
        if isinstance(size, bool) or not isinstance(size, int) or size <= 0:
            raise self._err(_INVALID, f"{what} = {size!r}: must be a positive integer", call,
                            device, va)
        if size % self.G:
            raise self._err(_INVALID, f"{what} = {size:#x}: not a multiple of the "
                            f"granularity {self.G:#x}", call, device, va, size)
        return size

    def _reservation_at(self, va: int) -> _Reservation | None:
        i = bisect.bisect_right(self._res_starts, va) - 1
        if i < 0:
            return None
        r = self._res[self._res_starts[i]]
        return r if va < r.va + r.size else None

    def _mapping_at(self, va: int) -> _Mapping | None:
        r = self._reservation_at(va)
        if r is None:
            return None
        i = bisect.bisect_right(r.starts, va) - 1
        if i < 0:
            return None
        m = r.maps[r.starts[i]]
        return m if va < m.va + m.size else None

    def _whole_mappings(self, va: int, size: int, call: str, device: int | None
                        ) -> list[_Mapping]:
        """The mappings that exactly tile [va, va+size), or CUDA_ERROR_INVALID_VALUE."""
        r = self._reservation_at(va)
        m = r.maps.get(va) if r is not None else None
        if m is None:
            raise self._err(_INVALID, "no mapping starts at this address", call, device,
                            va, size)
        assert r is not None
        out: list[_Mapping] = []
        i = bisect.bisect_left(r.starts, va)
        end, pos = va + size, va
        while pos < end:
            if i >= len(r.starts) or r.starts[i] != pos:
                raise self._err(_INVALID, f"range is not fully mapped (gap at {pos:#x})",
                                call, device, va, size)
            m = r.maps[pos]
            out.append(m)
            pos += m.size
            i += 1
        if pos != end:
            raise self._err(_INVALID, "range ends inside a mapping (whole mappings "
                            "only)", call, device, va, size)
        return out

    def _drop_ref(self, phys: _Phys) -> None:
        phys.refs -= 1
        if phys.refs == 0:
            if not phys.foreign:
                self._used[phys.device] -= phys.size
            phys.pages.clear()
            if phys.key is not None:
                self._shared.pop(phys.key, None)
            if phys.mm is not None:
                phys.mm.close()
                phys.mm = None
            if phys.memfd is not None:
                os.close(phys.memfd)
                phys.memfd = None

    # -------------------------------------------------------------------- queries
    def device_count(self) -> int:
        return self.devices

    def granularity(self, device: int) -> int:
        call = "cuMemGetAllocationGranularity"
        self._enter(call, device)
        self._check_device(device, call)
        return self.G

    def free_memory(self, device: int) -> tuple[int, int]:
        call = "cuMemGetInfo"
        self._enter(call, device)
        self._check_device(device, call)
        total = self.memory_per_device
        return total - self._others[device] - self._used[device], total

    def live(self) -> LiveCounts:
        return LiveCounts(handles=len(self._handles), mappings=self._mappings,
                          grants=self._grants, reserved_bytes=self._reserved,
                          reservations=len(self._res))

    @property
    def handles_spent(self) -> int:
        """Driver handles currently spent against ``handle_budget`` (live grants)."""
        return self._grants

    def open_shareables(self) -> int:
        """Exported fds not yet closed (each keeps its memory alive, as a real fd does)."""
        return len(self._fds)

    # ----------------------------------------------------------- address space
    def reserve(self, size: int, alignment: int = 0, device: int | None = None) -> int:
        call = "cuMemAddressReserve"
        self._enter(call, device, size=size if isinstance(size, int) else None)
        if device is not None:
            self._check_device(device, call)
        self._check_size(size, call, device)
        if (isinstance(alignment, bool) or not isinstance(alignment, int) or alignment < 0
                or (alignment & (alignment - 1))):
            raise self._err(_INVALID, f"alignment = {alignment!r}: must be 0 or a power of "
                            "two", call, device, None, size)
        align = max(alignment, self.G)
        if not self._res:
            self._next_va = _VA_BASE   # nothing reserved: reuse the address space
        va = -(-self._next_va // align) * align
        self._next_va = va + size
        self._res[va] = _Reservation(va, size, device)
        bisect.insort(self._res_starts, va)
        self._reserved += size
        return va

    def free_address(self, va: int, size: int) -> None:
        call = "cuMemAddressFree"
        r = self._res.get(va)
        self._enter(call, r.device if r else None, va, size)
        if r is None:
            raise self._err(_INVALID, "not the start of a reservation", call, None, va, size)
        if size != r.size:
            raise self._err(_INVALID, f"size {size:#x} differs from the reserved size "
                            f"{r.size:#x}", call, r.device, va, size)
        if r.maps:
            raise self._err(_INVALID, f"reservation still has {len(r.maps)} mapping(s); "
                            "unmap them first", call, r.device, va, size)
        del self._res[va]
        self._res_starts.pop(bisect.bisect_left(self._res_starts, va))
        self._reserved -= size

    # ------------------------------------------------------------------ handles
    def create(self, size: int, device: int) -> int:
        call = "cuMemCreate"
        self._enter(call, device, size=size if isinstance(size, int) else None)
        self._check_device(device, call)
        self._check_size(size, call, device)
        free = self.memory_per_device - self._others[device] - self._used[device]
        if size > free:
            raise self._err(_OOM, f"{size} bytes requested, {free} bytes free on the device",
                            call, device, None, size)
        phys = _Phys(size, device)
        phys.refs = 1
        self._used[device] += size
        handle = self._next_handle
        self._next_handle += 1
        self._handles[handle] = phys
        return handle

    def release(self, handle: int) -> None:
        call = "cuMemRelease"
        phys = self._handles.get(handle)
        self._enter(call, phys.device if phys else None)
        if phys is None:
            raise self._err(_INVALID, f"handle = {handle!r}: not a live handle", call)
        del self._handles[handle]
        self._drop_ref(phys)

    def export_handle(self, handle: int) -> int:
        """cuMemExportToShareableHandle: a real fd (a dup of the memory's memfd).

        The first export moves the bytes into a memfd, so a process that imports the fd
        maps the same bytes (writes on one side are reads on the other). Each export is
        a new fd that keeps the memory alive until :meth:`close_shareable`.
        """
        call = "cuMemExportToShareableHandle"
        phys = self._handles.get(handle)
        self._enter(call, phys.device if phys else None)
        if phys is None:
            raise self._err(_INVALID, f"handle = {handle!r}: not a live handle", call)
        if phys.mm is None:
            self._share(phys)
        if phys.memfd is None:  # imported memory: re-export what we were given
            raise self._err(_NOT_SUPPORTED, f"handle = {handle!r}: imported memory is not "
                            "re-exported by the simulator", call, phys.device)
        fd = os.dup(phys.memfd)
        os.set_inheritable(fd, False)
        self._fds[fd] = phys
        phys.refs += 1
        return fd

    def _share(self, phys: _Phys) -> None:
        """Back ``phys`` by a memfd (named after its device) and move its bytes there."""
        fd = os.memfd_create(f"{_MEMFD_PREFIX}{phys.device}", os.MFD_CLOEXEC)
        try:
            os.ftruncate(fd, phys.size)      # sparse: costs nothing until written
            mm = mmap.mmap(fd, phys.size)
        except BaseException:
            os.close(fd)
            raise
        for p, page in phys.pages.items():
            mm[p * _PAGE:p * _PAGE + _PAGE] = page
        phys.pages.clear()
        st = os.fstat(fd)
        phys.memfd, phys.mm, phys.key = fd, mm, (st.st_dev, st.st_ino)
        self._shared[phys.key] = phys

    def import_handle(self, fd: int) -> int:
        """cuMemImportFromShareableHandle of an fd exported by a SimDriver (this one or
        one in another process). The fd stays open; the caller closes it
        (:meth:`close_shareable`), as with the real driver."""
        call = "cuMemImportFromShareableHandle"
        phys = self._fds.get(fd)
        key: tuple[int, int] | None = None
        device: int | None = phys.device if phys else None
        if phys is None and isinstance(fd, int) and not isinstance(fd, bool):
            try:
                st = os.fstat(fd)
                key = (st.st_dev, st.st_ino)
                phys = self._shared.get(key)
                device = phys.device if phys else _memfd_device(fd)
            except OSError:
                device = None
        self._enter(call, device)
        if phys is None:
            if key is None or device is None:
                raise self._err(_INVALID, f"fd = {fd!r}: not an open fd of memory exported by "
                                "a simulated driver", call)
            self._check_device(device, call)
            size = os.fstat(fd).st_size
            phys = _Phys(size, device)
            phys.mm = mmap.mmap(fd, size)    # keeps the memory (and its own dup of the fd)
            phys.key = key
            phys.foreign = True
            self._shared[key] = phys
        handle = self._next_handle
        self._next_handle += 1
        self._handles[handle] = phys
        phys.refs += 1
        return handle

    def close_shareable(self, fd: int) -> None:
        """Close an fd: one this driver exported (it stops holding the memory) or one
        received from another process after importing it."""
        phys = self._fds.pop(fd, None)
        if phys is None:
            if isinstance(fd, bool) or not isinstance(fd, int) or fd < 0:
                raise ValueError(f"fd = {fd!r}: not an open fd")
            try:
                os.close(fd)
            except OSError as err:
                raise ValueError(f"fd = {fd!r}: not an open fd ({err.strerror})") from None
            return
        os.close(fd)
        self._drop_ref(phys)

    # ----------------------------------------------------------------- mappings
    def map(self, va: int, size: int, handle: int) -> None:
        call = "cuMemMap"
        phys = self._handles.get(handle)
        dev = phys.device if phys else None
        self._enter(call, dev, va, size)
        if phys is None:
            raise self._err(_INVALID, f"handle = {handle!r}: not a live handle", call, None,
                            va, size)
        self._check_size(size, call, dev, va)
        if isinstance(va, bool) or not isinstance(va, int) or va % self.G:
            raise self._err(_INVALID, f"va = {va!r}: not a multiple of the granularity "
                            f"{self.G:#x}", call, dev, None, size)
        if size != phys.size:                 # the real driver answers NOT_SUPPORTED here
            raise self._err(_NOT_SUPPORTED, f"size {size:#x} differs from the handle size "
                            f"{phys.size:#x}: a mapping covers a whole handle from offset 0",
                            call, dev, va, size)
        r = self._reservation_at(va)
        if r is None or va + size > r.va + r.size:
            raise self._err(_INVALID, "range is not inside one reservation", call, dev, va,
                            size)
        i = bisect.bisect_left(r.starts, va)
        if i > 0:
            prev = r.maps[r.starts[i - 1]]
            if prev.va + prev.size > va:
                raise self._err(_INVALID, f"overlaps the mapping at {prev.va:#x}", call, dev,
                                va, size)
        if i < len(r.starts) and r.starts[i] < va + size:
            raise self._err(_INVALID, f"overlaps the mapping at {r.starts[i]:#x}", call,
                            dev, va, size)
        r.starts.insert(i, va)
        r.maps[va] = _Mapping(va, size, phys)
        phys.refs += 1
        self._mappings += 1

    def unmap(self, va: int, size: int) -> None:
        call = "cuMemUnmap"
        first = self._mapping_at(va) if isinstance(va, int) else None
        dev = first.phys.device if first else None
        self._enter(call, dev, va, size)
        maps = self._whole_mappings(va, size, call, dev)
        r = self._reservation_at(va)
        assert r is not None
        i = bisect.bisect_left(r.starts, va)
        del r.starts[i:i + len(maps)]
        dropped = 0
        for m in maps:
            del r.maps[m.va]
            dropped += len(m.access)
            self._mappings -= 1
            self._drop_ref(m.phys)
        self._grants -= dropped
        if self.host_pool is not None and dropped:
            self.host_pool.give(dropped)

    def set_access(self, va: int, size: int, devices: Sequence[int]) -> None:
        call = "cuMemSetAccess"
        first = self._mapping_at(va) if isinstance(va, int) else None
        dev = first.phys.device if first else None
        self._enter(call, dev, va, size)
        if isinstance(devices, (str, bytes)) or not isinstance(devices, Sequence) or (
                len(devices) == 0):
            raise self._err(_INVALID, f"devices = {devices!r}: need one or more device "
                            "ordinals (count 0 is invalid)", call, dev, va, size)
        wanted = {self._check_device(d, call) for d in devices}
        maps = self._whole_mappings(va, size, call, dev)
        new = sum(len(wanted - m.access) for m in maps)
        if self.host_pool is not None:
            if new:
                ok, held = self.host_pool.take(new)
                if not ok:
                    free = self.memory_per_device - self._others[dev or 0] - self._used[
                        dev or 0]
                    raise self._err(
                        _OOM, f"driver handle budget of the host exhausted: {held:,} (mapping, "
                        f"device) grants live on the host ({self._grants:,} of them this "
                        f"driver's) + {new:,} new > budget {self.handle_budget:,} (pool "
                        f"{self.host_pool.path}), while {free:,} bytes are still free on "
                        f"device {dev}", call, dev, va, size)
        elif self._grants + new > self.handle_budget:
            free = self.memory_per_device - self._others[dev or 0] - self._used[dev or 0]
            raise self._err(
                _OOM, f"driver handle budget exhausted: {self._grants:,} (mapping, device) "
                f"grants live + {new:,} new > budget {self.handle_budget:,}, while "
                f"{free:,} bytes are still free on device {dev}", call, dev, va, size)
        for m in maps:
            m.access |= wanted
        self._grants += new

    def get_access(self, va: int, device: int) -> bool:
        call = "cuMemGetAccess"
        self._enter(call, device, va)
        self._check_device(device, call)
        m = self._mapping_at(va) if isinstance(va, int) else None
        if m is None:
            raise self._err(_INVALID, "address is not mapped", call, device, va)
        return device in m.access

    # -------------------------------------------------------------------- bytes
    def _segments(self, va: int, size: int, device: int, call: str
                  ) -> list[tuple[_Mapping, int, int]]:
        """(mapping, offset in it, length) pieces of [va, va+size), all readable by device."""
        if isinstance(size, bool) or not isinstance(size, int) or size < 0:
            raise self._err(_INVALID, f"size = {size!r}: must be an integer >= 0", call,
                            device, va)
        out: list[tuple[_Mapping, int, int]] = []
        pos, end = va, va + size
        while pos < end:
            m = self._mapping_at(pos)
            if m is None:
                raise self._err(_ILLEGAL, f"{pos:#x} is not mapped", call, device, va, size)
            if device not in m.access:
                raise self._err(_ILLEGAL, f"device {device} has no access to the mapping at "
                                f"{m.va:#x}", call, device, va, size)
            n = min(end, m.va + m.size) - pos
            out.append((m, pos - m.va, n))
            pos += n
        return out

    def write(self, va: int, data: bytes, device: int) -> None:
        call = "cuMemcpyHtoD"
        view = memoryview(bytes(data))
        self._enter(call, device, va, len(view))
        self._check_device(device, call)
        done = 0
        for m, off, n in self._segments(va, len(view), device, call):
            mm = m.phys.mm
            if mm is not None:               # shared memory: the memfd's bytes
                mm[off:off + n] = view[done:done + n]
                done += n
                continue
            pages = m.phys.pages
            while n:
                p, o = divmod(off, _PAGE)
                k = min(n, _PAGE - o)
                page = pages.get(p)
                if page is None:
                    page = pages[p] = bytearray(_PAGE)
                page[o:o + k] = view[done:done + k]
                off += k
                done += k
                n -= k

    def read(self, va: int, size: int, device: int) -> bytes:
        call = "cuMemcpyDtoH"
        self._enter(call, device, va, size if isinstance(size, int) else None)
        self._check_device(device, call)
        out = bytearray()
        for m, off, n in self._segments(va, size, device, call):
            mm = m.phys.mm
            if mm is not None:
                out += mm[off:off + n]
                continue
            pages = m.phys.pages
            while n:
                p, o = divmod(off, _PAGE)
                k = min(n, _PAGE - o)
                page = pages.get(p)
                out += page[o:o + k] if page is not None else bytes(k)
                off += k
                n -= k
        return bytes(out)

    def close(self) -> None:
        """Refuse further calls (CUDA_ERROR_DEINITIALIZED); live counts stay readable.
        A host pool gets back the grants still live (a destroyed context frees them)."""
        if not self._closed and self.host_pool is not None:
            if self._grants:
                self.host_pool.give(self._grants)
            if self._owns_pool:
                self.host_pool.close()
        self._closed = True


def _memfd_device(fd: int) -> int | None:
    """The device in a simulated export's memfd name, or None for any other fd."""
    try:
        target = os.readlink(f"/proc/self/fd/{fd}")
    except OSError:
        return None
    head = "/memfd:" + _MEMFD_PREFIX
    if not target.startswith(head):
        return None
    digits = target[len(head):].split(" ", 1)[0]
    return int(digits) if digits.isdigit() else None


def _require_int(field: str, value: object, *, minimum: int,
                 maximum: int | None = None) -> None:
    """ArgumentError (a ValueError) unless ``value`` is an int in minimum..maximum."""
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum \
            or (maximum is not None and value > maximum):
        accepted = f">= {minimum}" if maximum is None else f"in {minimum}..{maximum}"
        shown = repr(value) if not isinstance(value, int) or value.bit_length() < 100 \
            else "<huge integer>"
        raise ArgumentError(f"{field} = {shown}: must be an integer {accepted}",
                            argument=field, value=value)
