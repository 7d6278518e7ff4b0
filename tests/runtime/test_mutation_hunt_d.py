"""Tests that kill hand-written mutants of mutation hunt D that the rest of the suite let
through: the simulated driver (runtime/sim.py), fault injection (runtime/faults.py),
CUresult names (runtime/cuda_errors.py), device buffers (runtime/views.py), memory limits
deferred Ctrl-C (runtime/interrupts.py), the simulated host's handle pool
(runtime/hostpool.py) and LiveCounts (runtime/driver.py). (Four more of its survivors,
an exact fit of free memory, a unitless 1 MiB limit, the pool after a reap and an
unchecked ledger resize, were already caught by test_runtime_mutation_kills.py, which
the hunt did not run.)

Each test's docstring names the behaviour it checks and the mutant it kills.
"""

from __future__ import annotations

import os
import signal
import threading
from pathlib import Path

import pytest

from kvgrant.errors import DriverError, ReleasedError
from kvgrant.runtime.driver import LiveCounts
from kvgrant.runtime.faults import Fault
from kvgrant.runtime.hostpool import HostPool
from kvgrant.runtime.interrupts import DeferredInterrupt
from kvgrant.runtime.sim import SimDriver
from kvgrant.runtime.views import DeviceBuffer

MIB = 1 << 20
G = 2 * MIB
PAGE = 1 << 16


def mapped(drv: SimDriver, size: int = G, device: int = 0,
           access: tuple[int, ...] = (0,)) -> tuple[int, int]:
    """(va, handle) of one mapping of ``size`` on ``device``, granted to ``access``."""
    va = drv.reserve(size, device=device)
    h = drv.create(size, device)
    drv.map(va, size, h)
    drv.set_access(va, size, list(access))
    return va, h


# ------------------------------------------------------------------------ sim.py


def test_unmap_gives_every_device_grant_back_to_the_host_pool(tmp_path: Path) -> None:
    """An unmapped mapping granted to three devices gives all three grants back to the
    host pool, so the pool's total returns to zero (mutant S3: unmap gave back one
    grant per mapping, leaking the rest of the host's budget until the process died)."""
    drv = SimDriver(devices=3, memory_per_device=8 * G, granularity=G, handle_budget=10,
                    host_pool=tmp_path / "pool")
    try:
        va, h = mapped(drv, access=(0, 1, 2))
        assert drv.host_pool is not None and drv.host_pool.total() == 3
        drv.unmap(va, G)
        assert drv.host_pool.total() == 0
        assert drv.handles_spent == 0
        drv.release(h)
        drv.free_address(va, G)
    finally:
        drv.close()


def test_closing_a_driver_leaves_a_pool_it_was_given_open(tmp_path: Path) -> None:
    """Two drivers given one HostPool object: closing the first leaves the pool usable by
    the second (mutant S6: close() closed a pool the driver did not open, so the other
    driver's next cuMemSetAccess failed on a closed file)."""
    pool = HostPool(tmp_path / "pool", 10)
    a = SimDriver(devices=1, memory_per_device=8 * G, granularity=G, handle_budget=10,
                  host_pool=pool)
    b = SimDriver(devices=1, memory_per_device=8 * G, granularity=G, handle_budget=10,
                  host_pool=pool)
    a.close()
    va, h = mapped(b)
    assert pool.total() == 1
    b.unmap(va, G)
    b.release(h)
    b.free_address(va, G)
    b.close()
    assert pool.total() == 0
    pool.close()


def test_a_release_fault_on_a_device_fires_on_that_devices_release() -> None:
    """Fault(call="cuMemRelease", device=1) fails the release of a device-1 handle and
    leaves it live, while device 0's release is untouched (mutant S7: cuMemRelease was
    attributed to no device, so a per-device release fault never fired)."""
    drv = SimDriver(devices=2, memory_per_device=8 * G, granularity=G,
                    faults=[Fault(call="cuMemRelease", device=1)])
    h0 = drv.create(G, 0)
    h1 = drv.create(G, 1)
    drv.release(h0)
    with pytest.raises(DriverError) as err:
        drv.release(h1)
    assert err.value.call == "cuMemRelease" and err.value.device == 1
    assert drv.live().handles == 1
    drv.release(h1)
    assert drv.live().handles == 0


def test_closing_an_exported_fd_closes_it() -> None:
    """close_shareable of an exported fd closes the fd itself, not only the driver's
    reference (mutant S11: the fd stayed open, one leaked fd per shared allocation)."""
    drv = SimDriver(devices=1, memory_per_device=8 * G, granularity=G)
    h = drv.create(G, 0)
    fd = drv.export_handle(h)
    os.fstat(fd)
    drv.close_shareable(fd)
    with pytest.raises(OSError):
        os.fstat(fd)
    drv.release(h)
    assert drv.free_memory(0)[0] == 8 * G


def test_bytes_written_before_the_first_export_are_the_importers_bytes() -> None:
    """Bytes written before the memory is first exported are read by another driver that
    imports the fd (mutant S12: the first export did not move the lazily stored pages
    into the memfd, so the importer read zeros)."""
    own = SimDriver(devices=1, memory_per_device=8 * G, granularity=G)
    other = SimDriver(devices=1, memory_per_device=8 * G, granularity=G)
    va, h = mapped(own)
    own.write(va + 3 * PAGE + 5, b"written-before-export", 0)
    fd = own.export_handle(h)
    h2 = other.import_handle(fd)
    other.close_shareable(fd)
    vb = other.reserve(G, device=0)
    other.map(vb, G, h2)
    other.set_access(vb, G, [0])
    assert other.read(vb + 3 * PAGE + 5, 21, 0) == b"written-before-export"
    for drv, v, hh in ((other, vb, h2), (own, va, h)):
        drv.unmap(v, G)
        drv.release(hh)
        drv.free_address(v, G)


def test_a_write_across_a_page_boundary_reads_back() -> None:
    """A write that starts inside one 64 KiB store page and ends in the next reads back
    byte for byte (mutant S13: the piece written to the first page was not cut at the
    page end, so the bytes past it were lost)."""
    drv = SimDriver(devices=1, memory_per_device=8 * G, granularity=G)
    va, h = mapped(drv)
    data = bytes(range(256)) * 4
    drv.write(va + PAGE - 100, data, 0)
    assert drv.read(va + PAGE - 100, len(data), 0) == data
    assert drv.read(va + PAGE, 8, 0) == data[100:108]
    drv.unmap(va, G)
    drv.release(h)
    drv.free_address(va, G)


def test_imported_memory_counts_against_the_owner_not_the_importer() -> None:
    """A second driver (another process's, here in one process) that imports and then
    releases an fd keeps its free memory unchanged throughout, and the owner's device
    use is freed once everything is gone (mutant S14: imported memory was counted as
    the importer's, so releasing it drove the importer's use negative)."""
    own = SimDriver(devices=1, memory_per_device=8 * G, granularity=G)
    other = SimDriver(devices=1, memory_per_device=8 * G, granularity=G)
    h = own.create(2 * G, 0)
    fd = own.export_handle(h)
    h2 = other.import_handle(fd)
    assert other.free_memory(0) == (8 * G, 8 * G)
    other.release(h2)
    assert other.free_memory(0) == (8 * G, 8 * G)
    own.close_shareable(fd)
    own.release(h)
    assert own.free_memory(0) == (8 * G, 8 * G)


# --------------------------------------------------------------------- faults.py


def test_a_device_fault_does_not_fire_on_a_call_of_no_device() -> None:
    """Fault(call="cuMemAddressReserve", device=0) leaves a reserve without ``device=``
    alone and fails the first reserve on device 0 (mutant F3: calls attributed to no
    device matched every device's fault)."""
    drv = SimDriver(devices=1, memory_per_device=8 * G, granularity=G,
                    faults=[Fault(call="cuMemAddressReserve", device=0)])
    va = drv.reserve(G)
    with pytest.raises(DriverError) as err:
        drv.reserve(G, device=0)
    assert err.value.device == 0
    drv.free_address(va, G)


def test_the_first_of_two_faults_that_fire_decides_the_result() -> None:
    """Two faults firing on the same call: the first listed decides the CUresult
    (mutant F4: the last one that fired won)."""
    drv = SimDriver(devices=1, memory_per_device=8 * G, granularity=G,
                    faults=[Fault(call="cuMemCreate", result="CUDA_ERROR_INVALID_VALUE"),
                            Fault(call="cuMemCreate", result="CUDA_ERROR_UNKNOWN")])
    with pytest.raises(DriverError) as err:
        drv.create(G, 0)
    assert err.value.result_name == "CUDA_ERROR_INVALID_VALUE"


def test_a_call_that_fails_still_counts_towards_every_other_fault() -> None:
    """Every matching call counts towards every fault, the one that fails included:
    with Fault(nth=1) and Fault(nth=2) on creates, the second create fails by the
    second fault and the third succeeds (mutant F5: counting stopped at the fault that
    fired, so the second fault fired one call late)."""
    drv = SimDriver(devices=1, memory_per_device=8 * G, granularity=G,
                    faults=[Fault(call="cuMemCreate", nth=1, result="CUDA_ERROR_UNKNOWN"),
                            Fault(call="cuMemCreate", nth=2,
                                  result="CUDA_ERROR_INVALID_VALUE")])
    with pytest.raises(DriverError) as first:
        drv.create(G, 0)
    assert first.value.result_name == "CUDA_ERROR_UNKNOWN"
    with pytest.raises(DriverError) as second:
        drv.create(G, 0)
    assert second.value.result_name == "CUDA_ERROR_INVALID_VALUE"
    drv.release(drv.create(G, 0))


# ---------------------------------------------------------------- cuda_errors.py


def test_a_driver_error_names_the_va_range_once() -> None:
    """A failed call with a VA names it as ``va START+SIZE`` and gives no separate size
    (mutant C2: the size was appended a second time, ``..., va 0x..+0x200000, size
    0x200000``)."""
    drv = SimDriver(devices=1, memory_per_device=8 * G, granularity=G)
    va = drv.reserve(G, device=0)
    with pytest.raises(DriverError) as err:
        drv.unmap(va, G)
    assert str(err.value).endswith(f"(in cuMemUnmap, va {va:#x}+{G:#x})")
    assert "size" not in str(err.value).split("(in ", 1)[1]
    drv.free_address(va, G)


# ---------------------------------------------------------------------- views.py
class _Cache:
    released = False


def test_a_slice_to_the_end_of_a_buffer_is_allowed() -> None:
    """A slice ending exactly at the buffer's end is inside it (mutant V1: ``>=``
    refused the last byte, so the last page of a plane could not be sliced)."""
    buf = DeviceBuffer(0x1000, 64, 0, "sim")
    part = buf.slice(48, 16)
    assert (part.ptr, part.nbytes, part.device) == (0x1000 + 48, 16, 0)
    assert buf.slice(0, 64).nbytes == 64
    with pytest.raises(ValueError):
        buf.slice(48, 17)


def test_a_slice_of_a_released_cache_is_refused_too() -> None:
    """A slice taken before the cache was released is refused after it, like the buffer
    it came from (mutant V2: the slice lost its owner, so it viewed unmapped memory)."""
    cache = _Cache()
    buf = DeviceBuffer(0x2000, 64, 1, "cuda", owner=cache)
    part = buf.slice(16, 16)
    cache.released = True
    with pytest.raises(ReleasedError):
        part.slice(0, 8)
    with pytest.raises(ReleasedError):
        part.__cuda_array_interface__


def test_the_cuda_array_interface_is_writable() -> None:
    """The CUDA array interface of a buffer is a writable 1-D uint8 array at ``ptr``
    (mutant V3: marked read-only, so consumers refused to write the KV cache)."""
    cai = DeviceBuffer(0x3000, 32, 0, "cuda").__cuda_array_interface__
    assert cai["data"] == (0x3000, False)
    assert cai["shape"] == (32,) and cai["typestr"] == "|u1"


# ----------------------------------------------------------------- interrupts.py


def test_a_programs_own_sigint_handler_is_left_alone() -> None:
    """A SIGINT handler the program installed stays installed inside DeferredInterrupt
    and after it (mutant I2: it was replaced, and restored to Python's default on exit,
    so the program's handler was lost)."""
    if threading.current_thread() is not threading.main_thread():
        pytest.skip("signal handlers are installed from the main thread only")

    def mine(signum: int, frame: object) -> None:
        pass

    before = signal.signal(signal.SIGINT, mine)
    try:
        with DeferredInterrupt() as d:
            assert signal.getsignal(signal.SIGINT) is mine
            assert not d._armed
        assert signal.getsignal(signal.SIGINT) is mine
    finally:
        signal.signal(signal.SIGINT, before)


# -------------------------------------------------------------------- hostpool.py


def test_closing_a_pool_that_still_holds_grants_keeps_them_counted(tmp_path: Path) -> None:
    """A pool object closed while its process still holds grants keeps them on the host
    (mutant H4: close() zeroed its slot anyway, so the host's total under-counted grants
    that were still live)."""
    a = HostPool(tmp_path / "pool", 4)
    a.take(3)
    a.close()
    b = HostPool(tmp_path / "pool", 4)
    assert b.total() == 3
    assert b.take(2) == (False, 3)
    b.close()


# ---------------------------------------------------------------------- driver.py
def test_live_counts_with_only_a_reservation_are_not_empty() -> None:
    """LiveCounts with one reservation left is not empty (mutant R1: reservations were
    not looked at, so a leaked reservation passed the 'everything released' check)."""
    assert not LiveCounts(reservations=1).is_empty()
    assert not LiveCounts(reserved_bytes=G).is_empty()
    assert LiveCounts().is_empty()
