"""One behavioural suite for every Driver backend (sim always; cuda on a GPU).

Each test states a driver rule and checks it through the public interface only, so
the simulator is held to what the real driver does on the same calls.
"""

from __future__ import annotations

from typing import Callable

import pytest

from kvgrant.errors import DriverError
from kvgrant.runtime.driver import Driver, LiveCounts
from kvgrant.runtime.faults import Fault, FaultPlan


def _setup(drv: Driver, n_alloc: int = 1, device: int = 0, slots: int = 4
           ) -> tuple[int, int, int, list[int]]:
    """Reserve ``slots`` granules and create ``n_alloc`` G-sized handles on ``device``."""
    g = drv.granularity(device)
    va = drv.reserve(slots * g, device=device)
    handles = [drv.create(g, device) for _ in range(n_alloc)]
    return g, va, slots * g, handles


def test_protocol_and_granularity(driver: Driver) -> None:
    assert isinstance(driver, Driver)
    assert driver.device_count() >= 1
    g = driver.granularity(0)
    assert g > 0 and g & (g - 1) == 0
    free, total = driver.free_memory(0)
    assert 0 < free <= total
    assert driver.live() == LiveCounts()


def test_lifecycle_counts_up_and_back_to_zero(driver: Driver) -> None:
    g, va, size, (h,) = _setup(driver)
    assert driver.live() == LiveCounts(handles=1, reserved_bytes=size, reservations=1)
    driver.map(va, g, h)
    assert driver.live().mappings == 1
    driver.set_access(va, g, [0])
    assert driver.live().grants == 1
    assert driver.get_access(va, 0) is True
    driver.unmap(va, g)
    assert driver.live().mappings == 0 and driver.live().grants == 0
    driver.release(h)
    driver.free_address(va, size)
    assert driver.live().is_empty()


def test_calls_are_counted_by_entry_point(driver: Driver) -> None:
    g, va, size, (h,) = _setup(driver)
    driver.map(va, g, h)
    driver.set_access(va, g, [0])
    driver.set_access(va, g, [0])
    assert driver.calls["cuMemCreate"] == 1
    assert driver.calls["cuMemMap"] == 1
    assert driver.calls["cuMemSetAccess"] == 2
    assert driver.calls["cuMemAddressReserve"] == 1
    driver.unmap(va, g)
    driver.release(h)
    driver.free_address(va, size)
    assert driver.calls["cuMemUnmap"] == driver.calls["cuMemRelease"] == 1


def test_alias_bytes_written_through_plane_read_through_alias(driver: Driver) -> None:
    """One handle mapped twice (plane VA + alias VA) is one memory: bytes agree."""
    g, va, size, (h,) = _setup(driver, slots=4)
    plane, alias = va, va + 2 * g
    driver.map(plane, g, h)
    driver.map(alias, g, h)
    driver.set_access(plane, g, [0])
    driver.set_access(alias, g, [0])
    assert driver.live().mappings == 2 and driver.live().handles == 1
    payload = bytes(range(256)) * 64                      # 16 KiB pattern
    driver.write(plane + 12345, payload, 0)
    assert driver.read(alias + 12345, len(payload), 0) == payload
    driver.write(alias + g - 4, b"\xde\xad\xbe\xef", 0)
    assert driver.read(plane + g - 4, 4, 0) == b"\xde\xad\xbe\xef"
    driver.unmap(alias, g)                                  # alias before its backing
    assert driver.read(plane + 12345, 16, 0) == payload[:16]
    driver.unmap(plane, g)
    driver.release(h)
    driver.free_address(va, size)
    assert driver.live().is_empty()


def test_read_write_span_adjacent_mappings(driver: Driver) -> None:
    g, va, size, hs = _setup(driver, n_alloc=2, slots=2)
    driver.map(va, g, hs[0])
    driver.map(va + g, g, hs[1])
    driver.set_access(va, g, [0])
    driver.set_access(va + g, g, [0])
    data = b"0123456789abcdef" * 8
    driver.write(va + g - 64, data, 0)
    assert driver.read(va + g - 64, len(data), 0) == data
    for i, h in enumerate(hs):
        driver.unmap(va + i * g, g)
        driver.release(h)
    driver.free_address(va, size)


def test_memory_returns_only_when_last_mapping_and_handle_gone(driver: Driver) -> None:
    g = driver.granularity(0)
    n = 8                                                   # 16 MiB on H200: visible
    va = driver.reserve(n * g, device=0)
    free0, _ = driver.free_memory(0)
    h = driver.create(n * g, 0)
    free1, _ = driver.free_memory(0)
    assert free0 - free1 >= n * g
    driver.map(va, n * g, h)
    driver.set_access(va, n * g, [0])
    driver.write(va, b"kept", 0)
    driver.release(h)                       # handle gone, mapping still holds the memory
    assert driver.live().handles == 0
    free2, _ = driver.free_memory(0)
    assert free2 < free1 + n * g            # not returned yet
    assert driver.read(va, 4, 0) == b"kept"
    driver.unmap(va, n * g)                 # last reference: memory comes back
    free3, _ = driver.free_memory(0)
    assert free3 - free2 >= n * g
    driver.free_address(va, n * g)
    assert driver.live().is_empty()


def test_map_must_cover_whole_handle(driver: Driver) -> None:
    g, va, size, _ = _setup(driver, n_alloc=0)
    h = driver.create(2 * g, 0)
    with pytest.raises(DriverError) as info:
        driver.map(va, g, h)                # half of the handle
    assert info.value.call == "cuMemMap"
    assert info.value.result_name == "CUDA_ERROR_NOT_SUPPORTED"   # as on H200, driver 580
    assert info.value.result == 801
    assert driver.live().mappings == 0
    driver.release(h)
    driver.free_address(va, size)


def test_overlapping_map_is_refused(driver: Driver) -> None:
    g, va, size, hs = _setup(driver, n_alloc=2)
    driver.map(va, g, hs[0])
    with pytest.raises(DriverError) as info:
        driver.map(va, g, hs[1])
    assert info.value.call == "cuMemMap"
    assert info.value.result_name == "CUDA_ERROR_INVALID_VALUE"
    assert info.value.va == va and info.value.size == g
    assert driver.live().mappings == 1
    driver.unmap(va, g)
    for h in hs:
        driver.release(h)
    driver.free_address(va, size)


def test_unaligned_create_is_refused_with_context(driver: Driver) -> None:
    g = driver.granularity(0)
    with pytest.raises(DriverError) as info:
        driver.create(g + 4096, 0)
    err = info.value
    assert err.call == "cuMemCreate"
    assert err.result_name == "CUDA_ERROR_INVALID_VALUE"
    assert str(err).startswith("CUDA_ERROR_INVALID_VALUE: ")
    assert err.device == 0 and err.size == g + 4096
    assert driver.live().handles == 0


def test_get_access_on_unmapped_address_fails(driver: Driver) -> None:
    g, va, size, _ = _setup(driver, n_alloc=0)
    with pytest.raises(DriverError) as info:
        driver.get_access(va, 0)
    assert info.value.call == "cuMemGetAccess"
    driver.free_address(va, size)


def test_export_import_shares_memory_and_counts_handles(driver: Driver) -> None:
    g, va, size, (h,) = _setup(driver)
    fd = driver.export_handle(h)
    h2 = driver.import_handle(fd)
    driver.close_shareable(fd)
    assert driver.live().handles == 2
    driver.map(va, g, h)
    driver.map(va + g, g, h2)
    driver.set_access(va, g, [0])
    driver.set_access(va + g, g, [0])
    driver.write(va + 100, b"imported", 0)
    assert driver.read(va + g + 100, 8, 0) == b"imported"
    driver.unmap(va + g, g)
    driver.unmap(va, g)
    driver.release(h2)
    driver.release(h)
    driver.free_address(va, size)
    assert driver.live().is_empty()


def test_injected_fault_fails_the_chosen_call_and_changes_nothing(make_driver: Callable[..., Driver]
                                                                  ) -> None:
    # Fail the 2nd cuMemMap on device 0 with the budget failure's result.
    driver = make_driver(faults=FaultPlan([Fault(call="cuMemMap", device=0, nth=2)]))
    g, va, size, hs = _setup(driver, n_alloc=2)
    driver.map(va, g, hs[0])
    before = driver.live()
    with pytest.raises(DriverError) as info:
        driver.map(va + g, g, hs[1])
    assert info.value.result_name == "CUDA_ERROR_OUT_OF_MEMORY"
    assert info.value.call == "cuMemMap" and info.value.device == 0
    assert driver.live() == before
    driver.map(va + g, g, hs[1])            # nth=2 only: the third call succeeds
    assert driver.calls["cuMemMap"] == 3
    driver.unmap(va + g, g)
    driver.unmap(va, g)
    for h in hs:
        driver.release(h)
    driver.free_address(va, size)
    assert driver.live().is_empty()



@pytest.mark.parametrize("call", ["cuMemSetAccess", "cuMemUnmap"])
def test_a_mapping_step_is_the_owning_devices_call(make_driver: Callable[..., Driver],
                                                   call: str) -> None:
    # set_access and unmap name no device; they act on a mapping of device 0's memory,
    # so a fault aimed at device 0 fires there and the error names device 0 (a driver
    # that forgot the mapping's device let the fault pass and named no device)
    driver = make_driver(faults=FaultPlan([Fault(call=call, device=0, nth=1)]))
    g, va, size, (h,) = _setup(driver)
    driver.map(va, g, h)
    with pytest.raises(DriverError) as info:
        if call == "cuMemSetAccess":
            driver.set_access(va, g, [0])
        else:
            driver.unmap(va, g)
    assert info.value.call == call and info.value.device == 0
    assert info.value.va == va and info.value.size == g
    driver.set_access(va, g, [0])
    driver.unmap(va, g)
    driver.release(h)
    driver.free_address(va, size)
    assert driver.live().is_empty()


def test_one_call_over_adjacent_mappings_grants_and_unmaps_each(driver: Driver) -> None:
    # one cuMemSetAccess / cuMemUnmap may span several whole mappings (the engine grants
    # a plane's run of mappings in one call): each mapping gets its grant and each is
    # gone after the unmap (a driver that tracked only a range's first mapping, or
    # none, counted grants that were not there)
    g, va, size, hs = _setup(driver, n_alloc=2)
    driver.map(va, g, hs[0])
    driver.map(va + g, g, hs[1])
    driver.set_access(va, 2 * g, [0])
    assert driver.live().grants == 2
    assert driver.get_access(va, 0) and driver.get_access(va + g, 0)
    driver.unmap(va, 2 * g)
    assert driver.live().mappings == 0 and driver.live().grants == 0
    for h in hs:
        driver.release(h)
    driver.free_address(va, size)
    assert driver.live().is_empty()


def test_a_mapping_has_no_access_until_it_is_granted(driver: Driver) -> None:
    g, va, size, (h,) = _setup(driver)
    driver.map(va, g, h)
    assert driver.get_access(va, 0) is False
    driver.set_access(va, g, [0])
    assert driver.get_access(va, 0) is True
    driver.unmap(va, g)
    driver.release(h)
    driver.free_address(va, size)


def test_a_set_access_the_driver_refuses_grants_nothing(driver: Driver) -> None:
    # the range's second granule is not mapped: the driver refuses the call, and no
    # grant is counted for the first (only successful calls change the record)
    g, va, size, (h,) = _setup(driver)
    driver.map(va, g, h)
    with pytest.raises(DriverError) as info:
        driver.set_access(va, 2 * g, [0])
    assert info.value.call == "cuMemSetAccess"
    assert info.value.result_name == "CUDA_ERROR_INVALID_VALUE"
    assert driver.live().grants == 0 and driver.get_access(va, 0) is False
    driver.unmap(va, g)
    driver.release(h)
    driver.free_address(va, size)
    assert driver.live().is_empty()

# ------------------------------------------------------------------ two devices
def test_access_is_exactly_the_granted_devices(driver2: Driver) -> None:
    g, va, size, hs = _setup(driver2, n_alloc=2)
    driver2.map(va, g, hs[0])
    driver2.map(va + g, g, hs[1])
    driver2.set_access(va, g, [0, 1])       # owner + one importer, one call
    driver2.set_access(va + g, g, [0])      # owner only
    assert driver2.get_access(va, 0) and driver2.get_access(va, 1)
    assert driver2.get_access(va + g, 0)
    assert driver2.get_access(va + g, 1) is False
    assert driver2.live().grants == 3
    driver2.write(va, b"peer", 0)
    assert driver2.read(va, 4, 1) == b"peer"   # read in device 1's context
    driver2.unmap(va + g, g)
    driver2.unmap(va, g)
    for h in hs:
        driver2.release(h)
    driver2.free_address(va, size)
    assert driver2.live().is_empty()


def test_grant_list_order_does_not_matter(driver2: Driver) -> None:
    """Guards the ``[desc] * n`` bug: every listed device gets its own descriptor."""
    g, va, size, (h,) = _setup(driver2)
    driver2.map(va, g, h)
    driver2.set_access(va, g, [1, 0])
    assert driver2.get_access(va, 0) and driver2.get_access(va, 1)
    driver2.unmap(va, g)
    driver2.release(h)
    driver2.free_address(va, size)


def test_peer_owned_memory_granted_to_owner_only_is_not_visible_to_peer(driver2: Driver
                                                                        ) -> None:
    g, va, size, (h,) = _setup(driver2, device=1)
    driver2.map(va, g, h)
    driver2.set_access(va, g, [1])
    assert driver2.get_access(va, 1) and not driver2.get_access(va, 0)
    driver2.unmap(va, g)
    driver2.release(h)
    driver2.free_address(va, size)
