"""Rules only the simulator can be driven to cheaply: the handle budget at full scale,
exact memory accounting, fault plans, the lazy byte store and argument errors."""

from __future__ import annotations


import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kvgrant.errors import BackendUnavailable, DriverError
from kvgrant.runtime import cuda_errors
from kvgrant.runtime.driver import LiveCounts, open_driver
from kvgrant.runtime.faults import CALL_NAMES, Fault, FaultPlan
from kvgrant.runtime.sim import (
    DEFAULT_HANDLE_BUDGET,
    H200_MEMORY_BYTES,
    SimDriver,
)

MiB = 1 << 20
G = 2 * MiB


def _mapped(drv: SimDriver, n: int, device: int = 0) -> tuple[int, int]:
    """One handle mapped ``n`` times side by side (nothing granted); returns (va, handle)."""
    h = drv.create(G, device)
    va = drv.reserve(n * G, device=device)
    for i in range(n):
        drv.map(va + i * G, G, h)
    return va, h


# ------------------------------------------------------------------ the handle budget
@pytest.mark.slow
@pytest.mark.parametrize("devices, last_ok", [(1, 523_880), (2, 261_940)])
def test_default_budget_fails_where_the_h200_failed(devices: int, last_ok: int) -> None:
    """H200, driver 580: the 523,881st grant to one device failed, and the 261,941st
    mapping when each was granted to two devices, with memory still free."""
    drv = SimDriver(devices=devices)
    assert drv.handle_budget == DEFAULT_HANDLE_BUDGET == 523_880
    va, h = _mapped(drv, last_ok + 1)
    grant = list(range(devices))
    for i in range(last_ok):
        drv.set_access(va + i * G, G, grant)
    with pytest.raises(DriverError) as info:
        drv.set_access(va + last_ok * G, G, grant)
    err = info.value
    assert (err.call, err.result_name, err.result) == ("cuMemSetAccess",
                                                       "CUDA_ERROR_OUT_OF_MEMORY", 2)
    assert err.va == va + last_ok * G and err.device == 0
    free, total = drv.free_memory(0)
    assert free == total - G                      # memory is plainly still free
    assert drv.live().grants == last_ok * devices


def test_only_grants_spend_the_budget() -> None:
    drv = SimDriver(devices=2, handle_budget=10)
    extra = [drv.create(G, 0) for _ in range(50)]          # allocations: free
    va, h = _mapped(drv, 100 + 10)                          # ungranted mappings: free
    for i in range(10):
        drv.set_access(va + i * G, G, [0])
    with pytest.raises(DriverError, match="handle budget"):
        drv.set_access(va + 10 * G, G, [0])
    assert drv.handles_spent == 10 and len(extra) == 50


def test_budget_failure_is_atomic_and_unmap_gives_handles_back() -> None:
    drv = SimDriver(devices=4, handle_budget=5)
    va, h = _mapped(drv, 2)
    drv.set_access(va, G, [0, 1, 2])
    with pytest.raises(DriverError):
        drv.set_access(va + G, G, [0, 1, 2])               # 3 + 3 > 5
    assert drv.live().grants == 3
    assert drv.get_access(va + G, 0) is False               # nothing half-granted
    drv.set_access(va, G, [0, 1])                           # re-granting spends nothing
    assert drv.live().grants == 3
    drv.unmap(va, G)
    assert drv.live().grants == 0
    drv.set_access(va + G, G, [0, 1, 2, 3])
    assert drv.live().grants == 4


def test_set_access_and_unmap_take_several_whole_mappings_never_part_of_one() -> None:
    """As on the H200: one call may span adjacent mappings; part of one is refused."""
    drv = SimDriver(devices=2)
    va, h = _mapped(drv, 3)
    drv.set_access(va, 3 * G, [0, 1])
    assert drv.live().grants == 6
    assert all(drv.get_access(va + i * G, 1) for i in range(3))
    for bad_va, bad_size in [(va, 2 * G - 4096), (va + G // 2, G)]:
        with pytest.raises(DriverError) as info:
            drv.set_access(bad_va, bad_size, [0])
        assert info.value.result_name == "CUDA_ERROR_INVALID_VALUE"
        with pytest.raises(DriverError):
            drv.unmap(bad_va, bad_size)
    assert drv.live().mappings == 3
    drv.unmap(va, 2 * G)
    assert drv.live().mappings == 1 and drv.live().grants == 2


# ------------------------------------------------------------------ memory accounting
def test_memory_accounting_is_exact_per_device() -> None:
    drv = SimDriver(devices=2, memory_per_device=10 * G, used_by_others={1: 3 * G})
    assert drv.free_memory(0) == (10 * G, 10 * G)
    assert drv.free_memory(1) == (7 * G, 10 * G)
    h = drv.create(4 * G, 1)
    assert drv.free_memory(1) == (3 * G, 10 * G)
    assert drv.free_memory(0) == (10 * G, 10 * G)           # other devices untouched
    with pytest.raises(DriverError) as info:
        drv.create(4 * G, 1)
    assert info.value.result_name == "CUDA_ERROR_OUT_OF_MEMORY"
    assert info.value.call == "cuMemCreate" and info.value.device == 1
    fd = drv.export_handle(h)
    h2 = drv.import_handle(fd)
    drv.release(h)
    drv.release(h2)
    assert drv.free_memory(1)[0] == 3 * G                   # the open fd still holds it
    drv.close_shareable(fd)
    assert drv.free_memory(1)[0] == 7 * G
    assert drv.open_shareables() == 0


def test_a_simulated_h200_costs_nothing_until_written() -> None:
    drv = SimDriver(devices=1)
    size = (H200_MEMORY_BYTES // G) * G
    h = drv.create(size, 0)
    va = drv.reserve(size, device=0)
    drv.map(va, size, h)
    drv.set_access(va, size, [0])
    drv.write(va + size - 3, b"end", 0)
    assert drv.read(va + size - 3, 3, 0) == b"end"
    assert drv.read(va + size // 2, 8, 0) == bytes(8)       # never written: zeros
    assert drv.free_memory(0)[0] == H200_MEMORY_BYTES - size


# ------------------------------------------------------------------ driver rules
def test_access_rules_for_bytes() -> None:
    drv = SimDriver(devices=2)
    va, h = _mapped(drv, 1)
    with pytest.raises(DriverError) as info:
        drv.read(va, 4, 0)                                  # mapped, not granted
    assert info.value.result_name == "CUDA_ERROR_ILLEGAL_ADDRESS"
    assert info.value.result == 700 and info.value.call == "cuMemcpyDtoH"
    drv.set_access(va, G, [0])
    drv.write(va, b"ok", 0)
    with pytest.raises(DriverError, match="device 1 has no access"):
        drv.read(va, 2, 1)
    with pytest.raises(DriverError, match="not mapped"):
        drv.write(va + G - 1, b"xy", 0)                     # runs off the mapping


def test_mapping_rules() -> None:
    drv = SimDriver(devices=1)
    h = drv.create(G, 0)
    va = drv.reserve(2 * G, device=0)
    other = drv.reserve(2 * G, device=0)
    big = drv.create(2 * G, 0)
    for bad_va, handle, why in [(va + 4096, h, "granularity"),
                                (other + 2 * G, h, "reservation"),   # past every reservation
                                (va + G, big, "reservation"),        # runs into the next one
                                (G, h, "reservation")]:
        with pytest.raises(DriverError, match=why):
            drv.map(bad_va, G if handle == h else 2 * G, handle)
    assert drv.live().mappings == 0
    drv.map(va + G, G, h)
    with pytest.raises(DriverError, match="overlaps"):
        drv.map(va, 2 * G, big)
    with pytest.raises(DriverError, match="still has 1 mapping"):
        drv.free_address(va, 2 * G)
    with pytest.raises(DriverError, match="differs from the reserved size"):
        drv.free_address(other, G)
    with pytest.raises(DriverError, match="no mapping starts"):
        drv.unmap(va, G)
    drv.release(h)
    with pytest.raises(DriverError, match="not a live handle"):
        drv.map(other, G, h)                                # released: gone
    with pytest.raises(DriverError, match="not a live handle") as info:
        drv.release(h)                                      # double release
    assert info.value.result_name == "CUDA_ERROR_INVALID_VALUE"
    drv.unmap(va + G, G)
    drv.release(big)
    drv.free_address(va, 2 * G)
    drv.free_address(other, 2 * G)
    assert drv.live().is_empty()


def test_bad_device_and_size_arguments_name_the_value() -> None:
    drv = SimDriver(devices=2)
    with pytest.raises(DriverError) as info:
        drv.create(G, 2)
    assert info.value.result_name == "CUDA_ERROR_INVALID_DEVICE"
    assert "device = 2" in str(info.value)
    with pytest.raises(DriverError, match="size = 0"):
        drv.reserve(0)
    with pytest.raises(DriverError, match="alignment = 3"):
        drv.reserve(G, alignment=3)
    va, h = _mapped(drv, 1)
    with pytest.raises(DriverError, match="count 0"):
        drv.set_access(va, G, [])


def test_reservations_honour_alignment_and_never_overlap() -> None:
    drv = SimDriver(devices=1)
    a = drv.reserve(3 * G, device=0)
    b = drv.reserve(G, alignment=64 * G, device=0)
    assert b % (64 * G) == 0 and b >= a + 3 * G
    assert drv.live() == LiveCounts(reserved_bytes=4 * G, reservations=2)


def test_closed_driver_refuses_calls() -> None:
    drv = SimDriver(devices=1)
    drv.close()
    with pytest.raises(DriverError) as info:
        drv.create(G, 0)
    assert info.value.result_name == "CUDA_ERROR_DEINITIALIZED"


@pytest.mark.parametrize("kwargs, field", [
    ({"devices": 0}, "devices = 0"), ({"granularity": 3 * MiB}, "power of two"),
    ({"handle_budget": -1}, "handle_budget = -1"),
    ({"used_by_others": {9: 1}}, "used_by_others key = 9"),
])
def test_bad_constructor_options_are_clear(kwargs: dict[str, object], field: str) -> None:
    with pytest.raises(ValueError, match=field):
        SimDriver(**kwargs)  # type: ignore[arg-type]


# ------------------------------------------------------------------ fault plans
def test_nth_call_fault_is_one_based_over_all_calls() -> None:
    clean = SimDriver(devices=1)
    clean.reserve(G, device=0)
    clean.create(G, 0)
    assert sum(clean.calls.values()) == 2
    drv = SimDriver(devices=1, faults=[Fault(nth=2, result="CUDA_ERROR_NOT_SUPPORTED")])
    drv.reserve(G, device=0)
    with pytest.raises(DriverError) as info:
        drv.create(G, 0)
    assert info.value.result_name == "CUDA_ERROR_NOT_SUPPORTED"
    assert info.value.result == 801 and "injected fault" in str(info.value)
    assert drv.live().handles == 0 and drv.calls["cuMemCreate"] == 1
    drv.create(G, 0)                                         # fired once only


def test_fault_on_a_kind_of_call_on_one_device() -> None:
    drv = SimDriver(devices=3, faults=FaultPlan([
        Fault(call="cuMemSetAccess", device=2, result="CUDA_ERROR_OUT_OF_MEMORY")]))
    vas = {}
    for d in range(3):
        va, h = _mapped(drv, 2, device=d)
        vas[d] = va
    drv.set_access(vas[0], G, [0, 2])                       # owner 0: not the target
    with pytest.raises(DriverError) as info:
        drv.set_access(vas[2], G, [2])
    assert info.value.device == 2 and info.value.call == "cuMemSetAccess"
    drv.set_access(vas[2] + G, G, [2])                       # only the first one failed


def test_repeat_fault_keeps_failing() -> None:
    drv = SimDriver(devices=1, faults=[{"call": "cuMemCreate", "nth": 2, "repeat": True}])
    drv.create(G, 0)
    for _ in range(3):
        with pytest.raises(DriverError):
            drv.create(G, 0)
    assert drv.live().handles == 1 and drv.calls["cuMemCreate"] == 4


@pytest.mark.parametrize("kwargs, message", [
    ({"nth": 0}, "Fault.nth = 0"), ({"call": "cuMemAlloc"}, 'Fault.call = "cuMemAlloc"'),
    ({"device": -1}, "Fault.device = -1"),
    ({"result": "CUDA_ERROR_BOGUS"}, 'Fault.result = "CUDA_ERROR_BOGUS": must be a CUresult'),
    ({"result": "CUDA_SUCCESS"}, "must be an error"),
])
def test_bad_fault_specs_name_field_and_value(kwargs: dict[str, object], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        Fault(**kwargs)  # type: ignore[arg-type]


def test_every_counted_call_is_a_known_fault_target() -> None:
    drv = SimDriver(devices=2)
    va, h = _mapped(drv, 2)
    drv.set_access(va, 2 * G, [0, 1])
    drv.get_access(va, 1)
    drv.write(va, b"x", 0)
    drv.read(va, 1, 0)
    fd = drv.export_handle(h)
    drv.release(drv.import_handle(fd))
    drv.close_shareable(fd)
    drv.granularity(0)
    drv.free_memory(0)
    drv.unmap(va, 2 * G)
    drv.release(h)
    drv.free_address(va, 2 * G)
    assert set(drv.calls) <= CALL_NAMES
    assert len(set(drv.calls)) == len(CALL_NAMES)


# ------------------------------------------------------------------ randomised lifecycle
@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.integers(1, 3), st.sets(st.integers(0, 3), min_size=1),
                          st.booleans()), min_size=1, max_size=12), st.randoms())
def test_any_build_and_any_teardown_order_leaves_nothing(
        specs: list[tuple[int, set[int], bool]], rnd: object) -> None:
    """Build allocations (some aliased), tear down in a random legal order: memory and
    every live count come back exactly, whatever the order."""
    drv = SimDriver(devices=4, memory_per_device=64 * G)
    free0 = [drv.free_memory(d)[0] for d in range(4)]
    total = sum(n for n, _, _ in specs) * 2
    va = drv.reserve(total * G, device=0)
    pos, steps = va, []
    for i, (n, grant, aliased) in enumerate(specs):
        h = drv.create(n * G, i % 4)
        maps = [pos] + ([pos + n * G] if aliased else [])
        pos += 2 * n * G
        for m in maps:
            drv.map(m, n * G, h)
            drv.set_access(m, n * G, sorted(grant))
        steps.append(("release", h, 0))
        steps.extend(("unmap", m, n * G) for m in maps)
    assert drv.live().grants == sum(len(g) * (2 if a else 1) for _, g, a in specs)
    rnd.shuffle(steps)  # type: ignore[attr-defined]
    for kind, key, size in steps:
        if kind == "release":
            drv.release(key)
        else:
            drv.unmap(key, size)
    drv.free_address(va, total * G)
    assert drv.live().is_empty()
    assert [drv.free_memory(d)[0] for d in range(4)] == free0


# ------------------------------------------------------------------ names and opening
def test_result_table_agrees_with_cuda_bindings() -> None:
    enum = pytest.importorskip("cuda.bindings.driver").CUresult
    for name, value in cuda_errors.KNOWN_RESULTS.items():
        assert int(getattr(enum, name)) == value, name
    assert cuda_errors.result_name(enum.CUDA_ERROR_OUT_OF_MEMORY) == "CUDA_ERROR_OUT_OF_MEMORY"
    # names outside the small table come from the bindings
    assert cuda_errors.result_value("CUDA_ERROR_ECC_UNCORRECTABLE") == int(
        enum.CUDA_ERROR_ECC_UNCORRECTABLE)


def test_result_names_and_values_round_trip() -> None:
    assert cuda_errors.result_value("CUDA_ERROR_ILLEGAL_ADDRESS") == 700
    assert cuda_errors.result_name(2) == "CUDA_ERROR_OUT_OF_MEMORY"
    with pytest.raises(ValueError, match="'NOPE'"):
        cuda_errors.result_value("NOPE")


def test_open_driver_names_and_errors() -> None:
    from kvgrant.runtime.cuda import cuda_available

    sim = open_driver("sim", devices=3)
    assert sim.name == "sim" and sim.device_count() == 3
    with pytest.raises(BackendUnavailable, match="backend = 'gpu'"):
        open_driver("gpu")
    if not cuda_available():
        assert open_driver("auto").name == "sim"
        with pytest.raises(BackendUnavailable) as info:
            open_driver("cuda")
        assert info.value.result_name.startswith("CUDA_ERROR_")
