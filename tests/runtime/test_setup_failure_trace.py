"""A driver query that fails before any driver object exists (a device's granularity or
free memory, the device count) is in the trace the user asked for: the header (every
reservation base null), that rank's failed ``Reserve`` naming the query, ``Abort``
naming the rank, ``AbortComplete`` -- the model's ``Fail(r, "Reserve")``, as a group
rank traces its failed set-up (docs/group-trace.md). Was: no trace file at all.
``kvgrant conform`` accepts it (both engines); a failed Reserve may name only those
queries, and only when it failed. A refusal before the first event (too few devices)
still leaves the file as it was."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest

from kvgrant.cli import main
from kvgrant.conformance.replay import replay, replay_file
from kvgrant.conformance.trace_io import load_trace, parse_trace, parse_trace_lines
from kvgrant.errors import AllocationError, DriverError, TraceError
from kvgrant.runtime.allocator import allocate
from kvgrant.runtime.cuda_errors import driver_error
from kvgrant.runtime.faults import Fault
from kvgrant.runtime.sim import SimDriver
from kvgrant.traceformat import SETUP_CALLS
from tests.runtime._small import chunk_plan, small_geometry

SMALL = Path(__file__).resolve().parents[2] / "examples" / "small.json"
QUERIES = ["cuMemGetAllocationGranularity", "cuMemGetInfo"]


def _lines(path: Path) -> list[dict[str, Any]]:
    return [json.loads(x) for x in path.read_text().splitlines()]


def _assert_setup_trace(path: Path, rank: int, device: int, call: str, result: str,
                        ranks: int = 3) -> None:
    head, *evs = _lines(path)
    assert head["kind"] == "header" and head["backend"] == "sim"
    assert [b for b, _size in head["reservations"].values()] == [None] * ranks
    assert [(e["action"], e["rank"], e["call"], e["result"]) for e in evs] == [
        ("Reserve", rank, call, result), ("Abort", None, None, None),
        ("AbortComplete", None, None, None)], evs
    fail = evs[0]
    assert fail["device"] == device and fail["va"] is None and fail["size"] is None
    assert fail["state"]["failed"] is True and fail["state"]["va"] is False
    assert evs[1]["args"] == {"failed_rank": rank}
    v = replay_file(path)
    assert v.accepted and v.final_phase == "Aborted", v.summary()


@pytest.mark.parametrize("renderer_env", [None, "thread"])
@pytest.mark.parametrize("call", QUERIES)
def test_a_failed_device_query_is_traced_as_its_ranks_failed_reserve(
        call: str, renderer_env: str | None, tmp_path: Path) -> None:
    g = small_geometry()
    drv = SimDriver(devices=3, faults=Fault(call=call, device=2,
                                            result="CUDA_ERROR_INVALID_DEVICE"))
    trace = tmp_path / "t.ndjson"
    target: Any = trace
    if renderer_env == "thread":
        from kvgrant.runtime.trace import TraceWriter

        target = TraceWriter(trace, renderer="thread")
    with pytest.raises(AllocationError) as err:
        allocate(g, plan=chunk_plan(g), backend=drv, devices=[2, 1, 0], trace=target)
    e = err.value
    assert (e.rank, e.device, e.call, e.result_name) == (0, 2, call,
                                                         "CUDA_ERROR_INVALID_DEVICE")
    assert "before anything was created" in str(e) and "trace is incomplete" not in str(e)
    assert drv.live().is_empty() and drv.calls["cuMemAddressReserve"] == 0
    _assert_setup_trace(trace, 0, 2, call, "CUDA_ERROR_INVALID_DEVICE")


class _NoCount(SimDriver):
    """A driver whose device count query fails (no device attributed)."""

    def device_count(self) -> int:
        raise driver_error("CUDA_ERROR_NOT_INITIALIZED", "device count failed",
                           call="cuDeviceGetCount")


def test_a_failed_query_of_the_whole_driver_is_rank_0s(tmp_path: Path) -> None:
    """No device, so no rank in the error; the start-up stopped before rank 0's first
    step, and the trace says so."""
    g = small_geometry()
    drv = _NoCount(devices=3)
    trace = tmp_path / "t.ndjson"
    with pytest.raises(AllocationError) as err:
        allocate(g, plan=chunk_plan(g), backend=drv, trace=trace)
    assert err.value.rank is None and err.value.call == "cuDeviceGetCount"
    assert "no device (a query of the whole driver)" in str(err.value)
    assert drv.live().is_empty()
    _assert_setup_trace(trace, 0, 0, "cuDeviceGetCount", "CUDA_ERROR_NOT_INITIALIZED")


def test_untraced_it_is_the_same_error_and_no_file(tmp_path: Path,
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("KVGRANT_TRACE", raising=False)
    monkeypatch.chdir(tmp_path)
    g = small_geometry()
    drv = SimDriver(devices=3, faults=Fault(call="cuMemGetInfo"))
    with pytest.raises(AllocationError, match="cuMemGetInfo failed"):
        allocate(g, plan=chunk_plan(g), backend=drv)
    assert list(tmp_path.iterdir()) == [] and drv.live().is_empty()


def _cli(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    capsys.readouterr()
    rc = main(list(argv))
    got = capsys.readouterr()
    return rc, got.out, got.err


@pytest.mark.parametrize("k, call, device", [
    (1, "cuMemGetAllocationGranularity", 0), (3, "cuMemGetAllocationGranularity", 2),
    (4, "cuMemGetInfo", 0), (6, "cuMemGetInfo", 2)])
def test_kvgrant_alloc_fail_at_a_query_writes_a_trace_conform_accepts(
        k: int, call: str, device: int, tmp_path: Path,
        capsys: pytest.CaptureFixture[str]) -> None:
    trace = tmp_path / "t.ndjson"
    rc, out, err = _cli(capsys, "alloc", str(SMALL), "--backend", "sim", "--fail-at", str(k),
                        "--trace", str(trace))
    assert rc == 1, err
    assert "Traceback" not in err and len(err.strip().splitlines()) == 1, err
    assert err.startswith(f"kvgrant alloc: error: {call} failed with "
                          f"CUDA_ERROR_OUT_OF_MEMORY on rank {device} (device {device}) "
                          "before anything was created"), err
    _assert_setup_trace(trace, device, device, call, "CUDA_ERROR_OUT_OF_MEMORY")
    rc, out, err = _cli(capsys, "conform", str(trace), "--geometry", str(SMALL))
    assert rc == 0 and "accepted by python: 3 events" in out, (out, err)


def test_conform_with_both_engines_accepts_it(tmp_path: Path,
                                              capsys: pytest.CaptureFixture[str]) -> None:
    if shutil.which("java") is None:
        pytest.skip("TLC needs Java (java is not on PATH)")
    trace = tmp_path / "t.ndjson"
    _cli(capsys, "alloc", str(SMALL), "--backend", "sim", "--fail-at", "5", "--trace",
         str(trace))
    rc, out, err = _cli(capsys, "conform", str(trace), "--engine", "both", "--json")
    docs = json.loads(out)
    assert rc == 0, (out, err)
    text = json.dumps(docs)
    assert "tlc" in text and '"accepted": false' not in text, text


# --- the reader's rule: only a failed Reserve names a set-up query ----------------------

@pytest.fixture(scope="module")
def setup_trace(tmp_path_factory: pytest.TempPathFactory) -> list[str]:
    g = small_geometry()
    path = tmp_path_factory.mktemp("setup") / "t.ndjson"
    with pytest.raises(AllocationError):
        allocate(g, plan=chunk_plan(g), backend=SimDriver(devices=3, faults=Fault(
            call="cuMemGetInfo", device=1)), trace=path)
    return path.read_text().splitlines()


def test_the_fast_reader_takes_the_writers_lines(setup_trace: list[str]) -> None:
    trace = parse_trace("\n".join(setup_trace) + "\n")
    assert trace.rows is not None   # not sent to the detailed reader
    assert replay(trace).accepted
    slow = parse_trace_lines(setup_trace)
    assert [e.call for e in slow.events] == ["cuMemGetInfo", None, None]
    assert replay(slow).accepted


def _edited(lines: list[str], **fields: Any) -> list[str]:
    ev = json.loads(lines[1])
    ev.update(fields)
    return [lines[0], json.dumps(ev), *lines[2:]]


@pytest.mark.parametrize("fields, words", [
    ({"call": "cuMemCreate"}, "call = 'cuMemCreate': Reserve calls 'cuMemAddressReserve' "
                              "(only a failed Reserve may name the set-up query"),
    ({"call": "cuMemGetInfo", "result": "CUDA_SUCCESS"}, "call = 'cuMemGetInfo': Reserve "
                                                         "calls 'cuMemAddressReserve'"),
    ({"call": "cuMemGetInfo", "result": None}, "call = 'cuMemGetInfo': Reserve calls"),
    ({"call": "cuMemGetInfo", "result": 5}, "call = 'cuMemGetInfo': Reserve calls"),
    ({"call": "cuInit"}, "call = 'cuInit': Reserve calls"),
    ({"action": "Create", "args": {"alloc": 0}, "call": "cuMemGetInfo"},
     "call = 'cuMemGetInfo': Create calls 'cuMemCreate'"),
])
def test_any_other_use_of_a_set_up_call_is_malformed(setup_trace: list[str],
                                                     fields: dict[str, Any],
                                                     words: str, tmp_path: Path,
                                                     capsys: pytest.CaptureFixture[str]
                                                     ) -> None:
    lines = _edited(setup_trace, **fields)
    for read in (lambda: parse_trace_lines(lines),
                 lambda: parse_trace("\n".join(lines) + "\n")):
        with pytest.raises(TraceError) as err:
            read()
        assert err.value.line == 2 and words in str(err.value), str(err.value)
    path = tmp_path / "bad.ndjson"
    path.write_text("\n".join(lines) + "\n")
    rc, out, err = _cli(capsys, "conform", str(path))
    assert rc == 2 and words in err and "Traceback" not in err, (out, err)


def test_a_set_up_query_after_a_rank_reserved_is_malformed(setup_trace: list[str]) -> None:
    # review 2026-12-07: accepted with a header that gave the ranks their bases (the
    # query fails before any rank reserves, so every base is null)
    head = json.loads(setup_trace[0])
    rank = sorted(head["reservations"], key=int)[0]
    head["reservations"][rank][0] = 1 << 40
    lines = [json.dumps(head), *setup_trace[1:]]
    for read in (lambda: parse_trace_lines(lines),
                 lambda: parse_trace("\n".join(lines) + "\n")):
        with pytest.raises(TraceError) as err:
            read()
        assert err.value.line == 2, str(err.value)
        assert (f"call = 'cuMemGetInfo': a set-up query fails only before any rank "
                f"reserved, but the header gives rank {rank} a reservation base"
                ) in str(err.value), str(err.value)


def test_the_set_up_calls_are_the_queries_prepare_makes() -> None:
    """Each query the preparation makes on an open driver is one a failed Reserve may
    name (and nothing else: the lifecycle's own calls are not)."""
    from kvgrant.traceformat import DRIVER_CALLS

    assert SETUP_CALLS == {"cuDeviceGetCount", "cuMemGetAllocationGranularity", "cuMemGetInfo"}
    assert not SETUP_CALLS & DRIVER_CALLS
    drv = SimDriver(devices=3)
    allocate(small_geometry(), plan=chunk_plan(small_geometry()), backend=drv).release()
    assert {c for c in drv.calls if c not in DRIVER_CALLS} <= SETUP_CALLS


def test_a_trace_that_cannot_be_written_is_named_in_the_error(tmp_path: Path) -> None:
    """Tracing never hides the first error: a write failure is appended to it."""
    import io

    class Full(io.StringIO):
        def write(self, s: str) -> int:
            raise OSError(28, "No space left on device")

    g = small_geometry()
    drv = SimDriver(devices=3, faults=Fault(call="cuMemGetInfo"))
    with pytest.raises(AllocationError) as err:
        allocate(g, plan=chunk_plan(g), backend=drv, trace=Full())
    assert str(err.value).startswith("cuMemGetInfo failed with CUDA_ERROR_OUT_OF_MEMORY")
    assert "the trace is incomplete: writing it failed" in str(err.value), str(err.value)
    assert isinstance(err.value.cause, DriverError) and drv.live().is_empty()
