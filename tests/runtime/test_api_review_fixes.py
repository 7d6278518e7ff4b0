"""Findings of a review of the library's bad-input handling (2026-12-08), each checked
on the simulated driver: integer scalars of numpy are integers, a non-buffer given to
``as_tensor``, switch words in ``KVGRANT_PLAN_CACHE``, options a backend's driver does
not take, a FIFO as the trace file, a used or closed ``TraceWriter``, and plans that
are not plans given to ``check_contract``."""

from __future__ import annotations

import io
import os
from pathlib import Path

import numpy as np
import pytest

from kvgrant.errors import ArgumentError
from kvgrant.layout import check_contract, load_geometry
from kvgrant.layout.contract import require_contract
from kvgrant.layout.plan import Allocation, PhysicalPlan
from kvgrant.runtime import HandleBudget, allocate
from kvgrant.runtime.driver import open_driver
from kvgrant.runtime.plancache import cache_dir
from kvgrant.runtime.sim import SimDriver
from kvgrant.runtime.trace import TraceWriter
from kvgrant.runtime.views import as_tensor

SMALL = Path(__file__).resolve().parents[2] / "examples" / "small.json"


# ------------------------------------------------------------ numpy integer scalars
def test_numpy_integers_are_ranks_rows_devices_and_byte_counts() -> None:
    """Engines index block tables kept in numpy arrays: ``np.int64(3)`` was refused as
    "must be an integer" everywhere. Now it is taken, and the results are Python ints."""
    cache = allocate(SMALL, backend="sim", devices=[np.int64(0), np.int32(1), np.uint8(2)],
                     memory_limit=np.int64(-(1 << 30)),
                     budget=HandleBudget(handles=np.int64(100_000), reserve=np.int16(0)))
    with cache:
        va = cache.row_va(np.int64(0), "snapshot", np.int32(1))
        assert va == cache.row_va(0, "snapshot", 1) and type(va) is int
        page = cache.page(np.uint16(1), "kv0", np.int64(2))
        assert page.ptr == cache.page(1, "kv0", 2).ptr and type(page.ptr) is int
        part = cache.row(0, "snapshot", 0).slice(np.int64(8), np.int64(16))
        assert (part.nbytes, type(part.nbytes)) == (16, int)
        for bad in (np.True_, True, np.float64(1.0), "1", None):
            with pytest.raises(ArgumentError, match="row = .*must be an integer row"):
                cache.row_va(0, "snapshot", bad)
    assert HandleBudget(handles=np.int64(7)).handles == 7
    assert type(HandleBudget(handles=np.int64(7)).handles) is int


def test_a_numpy_offset_in_an_allocation_is_named_as_not_a_python_int() -> None:
    """check_contract said 6291456 "must be a positive multiple of the granularity"."""
    g = load_geometry(SMALL)
    found = [v.message for v in check_contract(
        g, [Allocation("kv0", np.int64(0), np.int64(3 * g.granularity))]) if v.point == 3]
    assert any("length = np.int64(6291456) (int64) must be a Python int" in m for m in found)
    assert not any("must be a positive multiple" in m and "Python int" not in m for m in found)


# ------------------------------------------------------------ wrong kinds of values
def test_as_tensor_of_an_address_is_an_argument_error() -> None:
    with allocate(SMALL, backend="sim") as cache:
        for value in (cache.row_va(0, "snapshot", 0), None):
            with pytest.raises(ArgumentError, match="buf = .*must be a DeviceBuffer"):
                as_tensor(value)


@pytest.mark.parametrize("plan, words", [
    ("naive", "plan = \"naive\" (str): must be a PhysicalPlan"),
    (PhysicalPlan("x", None, None), "plan.allocations = null"),  # type: ignore[arg-type]
    (PhysicalPlan("x", {"name": "g"}, ()), "plan.geometry = "),  # type: ignore[arg-type]
    ({"allocations": []}, "plan = "),
])
def test_check_contract_refuses_what_is_not_a_plan(plan: object, words: str) -> None:
    g = load_geometry(SMALL)
    for check in (check_contract, require_contract):
        with pytest.raises(ArgumentError) as info:
            check(g, plan)  # type: ignore[arg-type]
        assert words in str(info.value), str(info.value)


@pytest.mark.parametrize("word", ["1", "on", "yes", "true", "y"])
def test_a_switch_word_in_kvgrant_plan_cache_is_refused(word: str) -> None:
    """``KVGRANT_PLAN_CACHE=1`` made a cache folder named "1" in the working folder."""
    with pytest.raises(ArgumentError, match=f"KVGRANT_PLAN_CACHE = '{word}': must be a "
                                            "folder path, or 'off'"):
        cache_dir({"KVGRANT_PLAN_CACHE": word})


@pytest.mark.parametrize("word", ["off", "0", "no", "n", "false", "none", "OFF "])
def test_the_off_words_turn_the_plan_cache_off(word: str) -> None:
    assert cache_dir({"KVGRANT_PLAN_CACHE": word}) is None


@pytest.mark.parametrize("backend, options, known", [
    ("sim", {"device": 2}, "devices, faults"),
    ("cuda", {"devices": 2}, "faults, handle_budget, host_pool"),
])
def test_open_driver_names_the_options_a_backend_takes(backend: str, options: dict,
                                                       known: str) -> None:
    with pytest.raises(ArgumentError, match=f"options key = .*must be one of {known}"):
        open_driver(backend, **options)
    assert isinstance(open_driver("sim", devices=2), SimDriver)


# ------------------------------------------------------------ trace targets
def test_a_fifo_as_the_trace_is_refused_before_any_driver_call(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """allocate() hung opening a FIFO with no reader, every rank's reservation held."""
    fifo = tmp_path / "trace.fifo"
    os.mkfifo(fifo)
    # a reader, so that code which opened the FIFO would go on (and fail this test)
    # rather than hang the suite
    reader = os.open(fifo, os.O_RDONLY | os.O_NONBLOCK)
    try:
        driver = SimDriver(devices=3)
        with pytest.raises(ArgumentError, match="trace = .*: is a FIFO"):
            allocate(SMALL, backend=driver, trace=fifo)
        monkeypatch.setenv("KVGRANT_TRACE", str(fifo))
        with pytest.raises(ArgumentError, match="KVGRANT_TRACE = .*: is a FIFO"):
            allocate(SMALL, backend=driver)
        assert driver.live().is_empty()
    finally:
        os.close(reader)


def test_a_used_or_closed_trace_writer_is_refused() -> None:
    """A second allocation on one writer wrote nothing and said nothing."""
    out = io.StringIO()
    writer = TraceWriter(out)
    allocate(SMALL, backend="sim", trace=writer).release()
    assert out.getvalue().count("\n") > 1
    with pytest.raises(ArgumentError, match="trace = .*TraceWriter"):
        allocate(SMALL, backend="sim", trace=writer)
    closed = TraceWriter(io.StringIO())
    closed.close()
    assert closed.closed and not closed.used
    with pytest.raises(ArgumentError, match="is a closed TraceWriter"):
        allocate(SMALL, backend="sim", trace=closed)
    used = TraceWriter(io.StringIO())
    used.header(ranks=1)
    assert used.used and not used.closed
    with pytest.raises(ArgumentError, match="already holds a trace"):
        allocate(SMALL, backend="sim", trace=used)
    fresh = TraceWriter(None)
    assert not fresh.used and not fresh.closed


def test_a_failed_query_after_the_unwinding_is_not_an_undo_failure() -> None:
    """The free-memory query after an abort failed (a bad device, allocate_rank's
    ``device=99``): it was reported as "1 undo(s) failed" and kept in cleanup_errors."""
    from kvgrant.errors import AllocationError
    from kvgrant.runtime.faults import Fault

    # cuMemGetInfo on device 0: the pre-flight's (1st), then the one after unwinding (2nd)
    driver = SimDriver(devices=3, faults=[Fault(call="cuMemCreate", nth=2),
                                          Fault(call="cuMemGetInfo", nth=2, device=0)])
    with pytest.raises(AllocationError) as info:
        allocate(SMALL, backend=driver)
    msg = str(info.value)
    assert "the free-memory query after the unwinding failed" in msg, msg
    assert "undo(s) failed" not in msg and info.value.cleanup_errors == [], msg
    assert driver.live().is_empty()


def test_the_va_tables_are_refused_after_release_as_the_views_are() -> None:
    from kvgrant.errors import ReleasedError

    cache = allocate(SMALL, backend="sim")
    vas = cache.plane_va[0]["kv0"], cache.region_va[0]["snapshot"]
    assert vas[1] == cache.row_va(0, "snapshot", 0)
    cache.release()
    for read in (lambda: cache.plane_va, lambda: cache.region_va,
                 lambda: cache.row_va(0, "snapshot", 0)):
        with pytest.raises(ReleasedError, match="the cache was released"):
            read()


def test_the_geometry_classes_raise_geometry_errors_however_they_are_built() -> None:
    """``Geometry(**doc)`` and ``Plane(...)`` raised pydantic's ValidationError."""
    import json

    from kvgrant.errors import GeometryError
    from kvgrant.layout import Geometry, Plane

    doc = json.loads(SMALL.read_text())
    for build in (lambda: Geometry(**{**doc, "pages": -1}),
                  lambda: Geometry.model_validate({**doc, "pages": -1}),
                  lambda: Geometry.model_validate_json(json.dumps({**doc, "pages": -1}))):
        with pytest.raises(GeometryError, match="pages = -1: Input should be greater") as info:
            build()
        assert info.value.field == "pages" and info.value.value == -1
    with pytest.raises(GeometryError, match="bytes_per_page = 0"):
        Plane(name="x", bytes_per_page=0)
    assert Geometry(**doc) == Geometry.model_validate(doc)


def test_an_empty_geometry_path_and_a_ledger_path_of_no_path_type_are_named() -> None:
    from kvgrant.errors import GeometryError
    from kvgrant.runtime.ledger import HostLedger

    with pytest.raises(GeometryError, match='path = "": .* not an empty string'):
        load_geometry("")   # was: cannot read geometry file ".": Is a directory
    for bad in (5, "", b"/tmp/l.json"):
        with pytest.raises(ArgumentError, match="HostLedger: path = .*must be None"):
            HostLedger(bad)  # type: ignore[arg-type]


@pytest.mark.parametrize("declared", ["yes", "", 1, None])
def test_handle_demand_takes_declared_as_a_bool_only(declared: object) -> None:
    from kvgrant.layout.plans import naive_plan
    from kvgrant.layout.preflight import handle_demand

    g = load_geometry(SMALL)
    with pytest.raises(ArgumentError, match="declared = .*must be True or False"):
        handle_demand(g, naive_plan(g), declared=declared)  # type: ignore[arg-type]
    assert handle_demand(g, naive_plan(g), declared=True) >= handle_demand(g, naive_plan(g))
