"""Review findings on the runtime: the trace file is made at its first line (a refused
run leaves the user's file alone), environment variables are checked and named in
their errors (KVGRANT_TRACE, KVGRANT_PLAN_CACHE, KVGRANT_LEDGER), and a failed device
query before any reservation names the rank as well as the device."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from kvgrant.errors import AllocationError, ArgumentError, LedgerError, PlanError, TraceError
from kvgrant.runtime.allocator import allocate
from kvgrant.runtime.faults import Fault
from kvgrant.runtime.ledger import LEDGER_ENV, HostLedger
from kvgrant.runtime.options import Backend, HandleBudget
from kvgrant.runtime.plancache import PLAN_CACHE_ENV, cache_dir, packed_plan
from kvgrant.runtime.sim import SimDriver
from kvgrant.runtime.trace import ALLOC_ENTRY, TRACE_ENV, TraceWriter, clock, open_trace
from tests.runtime._small import G, chunk_plan, small_geometry

KEEP = "not a trace, keep me\n"
EARLIER = '{"kind": "header", "note": "an earlier trace"}\nkeep me\n'
RENDERERS = ["process", "thread"]


@pytest.fixture(autouse=True)
def _no_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in (TRACE_ENV, LEDGER_ENV):
        monkeypatch.delenv(name, raising=False)


# --- 1. the trace file is created or truncated at its first line, not before -----------

@pytest.mark.parametrize("renderer", RENDERERS)
def test_a_writer_closed_before_its_first_line_leaves_the_file_as_it_was(
        tmp_path: Path, renderer: str) -> None:
    old, new = tmp_path / "old.ndjson", tmp_path / "sub" / "new.ndjson"
    old.write_text(KEEP)
    for path in (old, new):
        tw = TraceWriter(path, renderer=renderer)
        assert tw.enabled and tw.renderer == renderer
        assert tw.events == 0  # a flush with nothing recorded: still no file
        tw.close()
    assert old.read_text() == KEEP
    assert not new.exists() and not new.parent.exists()
    # the first line creates (or truncates) it
    with TraceWriter(old, renderer=renderer) as tw:
        tw.header(ranks=1)
    assert [json.loads(x)["kind"] for x in old.read_text().splitlines()] == ["header"]


def test_a_refused_allocation_leaves_the_named_trace_file_as_it_was(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Refusals after the trace target was read but before the first event (too few
    devices, an unusable ledger) used to truncate the file to nothing. The file is an
    earlier trace (a file that is not one is refused before anything: see
    test_trace_overwrite.py)."""
    g = small_geometry()
    trace = tmp_path / "t.ndjson"
    trace.write_text(EARLIER)
    with pytest.raises(PlanError, match="needs devices"):
        allocate(g, plan=chunk_plan(g), backend=Backend("sim", {"devices": 1}), trace=trace)
    assert trace.read_text() == EARLIER
    garbage = tmp_path / "ledger.json"
    garbage.write_text("garbage")
    with pytest.raises(LedgerError):
        allocate(g, plan=chunk_plan(g), backend="sim",
                 budget=HandleBudget(ledger=str(garbage)), trace=trace)
    assert trace.read_text() == EARLIER
    # the same through KVGRANT_TRACE, and a new path is not created at all
    new = tmp_path / "new" / "t.ndjson"
    for path in (trace, new):
        monkeypatch.setenv(TRACE_ENV, str(path))
        with pytest.raises(PlanError, match="needs devices"):
            allocate(g, plan=chunk_plan(g), backend=Backend("sim", {"devices": 1}))
    assert trace.read_text() == EARLIER
    assert not new.parent.exists()
    # a run that reaches its first event writes the trace
    allocate(g, plan=chunk_plan(g), backend=SimDriver(devices=3)).release()
    assert json.loads(new.read_text().splitlines()[0])["kind"] == "header"


def test_spec_definitions_before_the_first_line_are_kept(tmp_path: Path) -> None:
    """What was recorded before the file existed (an allocation spec) is not lost."""
    from kvgrant.runtime.trace import alloc_spec
    from kvgrant.traceformat import args_grant, event_template, state_template

    state = state_template("Allocating", True, False, False)
    spec = alloc_spec(
        event_template(0, "Create", '{"alloc": %d}', "cuMemCreate", "CUDA_SUCCESS", 0,
                       "null", "%d", "%d", state),
        event_template(0, "Map", '{"alloc": %d}', "cuMemMap", "CUDA_SUCCESS", 0, "%d", "%d",
                       "%d", state), "",
        event_template(0, "Grant", args_grant("plane", [0]), "cuMemSetAccess", "CUDA_SUCCESS",
                       0, "%d", "%d", "null", state), 1, [])
    path = tmp_path / "t.ndjson"
    tw = TraceWriter(path)
    tw.define_allocs(0, spec)
    tw.alloc_entries(0)  # an empty entry block: no line either
    assert tw.events == 0 and not path.exists()
    tw.header(ranks=1)
    t = clock()
    tw.alloc_entries(0).extend(ALLOC_ENTRY.pack(0, 3, 0, 11, 4096, 0, G, 1, 1, 0, 1,
                                                t, t, t, 0.0, 0.0))
    tw.close()
    assert tw.error is None
    assert [json.loads(x).get("action") for x in path.read_text().splitlines()] == [
        None, "Create", "Map", "Grant"]


@pytest.mark.parametrize("renderer", RENDERERS)
def test_a_path_that_cannot_be_written_is_still_refused_up_front(
        tmp_path: Path, renderer: str) -> None:
    blocker = tmp_path / "file"
    blocker.write_text(KEEP)
    for path in (tmp_path, blocker / "t.ndjson"):
        with pytest.raises(TraceError, match=r"^trace = .*: cannot open for writing"):
            TraceWriter(path, renderer=renderer)
    assert blocker.read_text() == KEEP


@pytest.mark.parametrize("renderer", RENDERERS)
def test_a_file_that_cannot_be_made_at_the_first_line_is_a_trace_error(
        tmp_path: Path, renderer: str) -> None:
    """The first line is inside the lifecycle: the failure switches the writer off and
    is kept in ``error`` (as a write error is), never raised."""
    path = tmp_path / "sub" / "t.ndjson"
    tw = TraceWriter(path, renderer=renderer)
    (tmp_path / "sub").write_text(KEEP)  # the folder cannot be made any more
    tw.header(ranks=1)
    assert not tw.enabled
    assert isinstance(tw.error, TraceError) and "cannot open for writing" in str(tw.error)
    tw.close()
    assert (tmp_path / "sub").read_text() == KEEP


# --- 2. KVGRANT_TRACE is a path; errors about it name the variable -------------------------

@pytest.mark.parametrize("value", ["1", "true", "yes", "on", "TRUE", " on ", "0", "off", " "])
def test_kvgrant_trace_set_to_a_switch_word_is_refused(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, value: str) -> None:
    monkeypatch.chdir(tmp_path)
    with pytest.raises(ArgumentError, match=r"^KVGRANT_TRACE = .*: must be a file path") \
            as err:
        open_trace(None, env={TRACE_ENV: value})
    assert err.value.argument == TRACE_ENV and err.value.value == value
    monkeypatch.setenv(TRACE_ENV, value)
    g = small_geometry()
    drv = SimDriver(devices=3)
    with pytest.raises(ArgumentError, match="KVGRANT_TRACE"):
        allocate(g, plan=chunk_plan(g), backend=drv)
    assert list(tmp_path.iterdir()) == []  # no file named "1" (or "true") was written
    assert drv.calls["cuMemAddressReserve"] == 0


def test_errors_about_the_kvgrant_trace_path_name_the_variable(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(TraceError, match=r"^KVGRANT_TRACE = .*: cannot open for writing"):
        open_trace(None, env={TRACE_ENV: str(tmp_path)})
    # KVGRANT_TRACE naming the geometry file: refused (it was overwritten by the trace)
    geometry = tmp_path / "g.json"
    geometry.write_text(json.dumps(small_geometry().model_dump()))
    before = geometry.read_text()
    monkeypatch.setenv(TRACE_ENV, str(geometry))
    with pytest.raises(ArgumentError, match=r"^KVGRANT_TRACE = .*is the geometry file") as err:
        allocate(str(geometry), plan="naive", backend=SimDriver(devices=3))
    assert err.value.argument == TRACE_ENV
    assert geometry.read_text() == before


# --- 3. KVGRANT_PLAN_CACHE naming a file is the user's mistake --------------------------------

def test_kvgrant_plan_cache_naming_a_file_is_an_error(tmp_path: Path) -> None:
    file = tmp_path / "plans"
    file.write_text(KEEP)
    with pytest.raises(ArgumentError, match=r"^KVGRANT_PLAN_CACHE = .*: must be a folder "
                                            r"or 'off'.*it is a file") as err:
        cache_dir({PLAN_CACHE_ENV: str(file)})
    assert err.value.argument == PLAN_CACHE_ENV and err.value.value == str(file)
    with pytest.raises(ArgumentError, match="KVGRANT_PLAN_CACHE"):
        packed_plan(small_geometry(), env={PLAN_CACHE_ENV: str(file)})
    assert file.read_text() == KEEP
    # folders (existing or not yet made) are still fine; a folder below a file is one
    # that cannot be made (tests/runtime/test_plancache.py: not used, no error)
    assert cache_dir({PLAN_CACHE_ENV: str(tmp_path)}) == tmp_path
    assert cache_dir({PLAN_CACHE_ENV: str(file / "plans")}) == file / "plans"
    assert cache_dir({PLAN_CACHE_ENV: str(tmp_path / "a" / "b")}) == tmp_path / "a" / "b"


@pytest.mark.skipif(os.geteuid() == 0, reason="root can write a read-only folder")
def test_a_plan_cache_folder_that_cannot_be_written_is_still_just_not_used(
        tmp_path: Path) -> None:
    folder = tmp_path / "ro"
    folder.mkdir()
    folder.chmod(0o555)
    try:
        plan = packed_plan(small_geometry(), env={PLAN_CACHE_ENV: str(folder / "plans")})
        assert plan.label == "packed" and not list(folder.iterdir())
    finally:
        folder.chmod(0o755)


# --- KVGRANT_LEDGER: a path; errors about it name the variable -------------------------------

def test_kvgrant_ledger_set_to_a_switch_word_is_refused(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """KVGRANT_LEDGER=1 made a ledger file named "1" in the working folder."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv(LEDGER_ENV, "1")
    g = small_geometry()
    drv = SimDriver(devices=3)
    with pytest.raises(ArgumentError, match=r"^KVGRANT_LEDGER = '1': must be the path") as err:
        allocate(g, plan=chunk_plan(g), backend=drv)
    assert err.value.argument == LEDGER_ENV
    assert list(tmp_path.iterdir()) == [] and drv.calls["cuMemAddressReserve"] == 0


def test_errors_about_the_kvgrant_ledger_path_name_the_variable(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(LEDGER_ENV, str(tmp_path))  # a folder, not a ledger file
    with pytest.raises(LedgerError, match=r"^KVGRANT_LEDGER = .*: cannot open it") as err:
        HostLedger().holders()
    assert f"set {LEDGER_ENV})" not in str(err.value)  # it is set: not "set KVGRANT_LEDGER"
    bad = tmp_path / "bad.json"
    bad.write_text("garbage")
    monkeypatch.setenv(LEDGER_ENV, str(bad))
    with pytest.raises(LedgerError, match=r"named by KVGRANT_LEDGER\) is not a kvgrant ledger"):
        HostLedger().holders()
    # a path given as an argument reads as before
    with pytest.raises(LedgerError, match=r"^ledger .*bad.json is not a kvgrant ledger"):
        HostLedger(bad).holders()


# --- 4. a failed query before any reservation names rank and device ------------------------

@pytest.mark.parametrize("call", ["cuMemGetAllocationGranularity", "cuMemGetInfo"])
def test_a_failed_device_query_names_the_rank_and_the_device(call: str) -> None:
    g = small_geometry()
    drv = SimDriver(devices=3, faults=Fault(call=call, device=2))
    with pytest.raises(AllocationError) as err:
        allocate(g, plan=chunk_plan(g), backend=drv, devices=[2, 1, 0])
    assert err.value.rank == 0 and err.value.device == 2 and err.value.call == call
    text = str(err.value)
    assert f"{call} failed with CUDA_ERROR_OUT_OF_MEMORY on rank 0 (device 2)" in text
    assert "no byte range" in text
    assert drv.live().is_empty() and drv.calls["cuMemAddressReserve"] == 0


def test_a_granularity_refusal_names_the_rank_and_the_device() -> None:
    g = small_geometry()
    with pytest.raises(PlanError, match=r"of device 0 \(rank 2\)"):
        allocate(g, plan=chunk_plan(g), backend=SimDriver(devices=3, granularity=2 * G),
                 devices=[2, 1, 0])
