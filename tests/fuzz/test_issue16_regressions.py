"""Every case of issue #16 as a regression test (the TLC signal cases live in
tests/conformance/test_tlc_cleanup.py). Each runs the CLI in-process under a memory
cap and a hang limit (``_fuzz_support``), so an unbounded read fails here instead of
taking the machine down."""

from __future__ import annotations

import io
import json
from pathlib import Path
from typing import Any

import pytest

from _fuzz_support import SMALL, assert_clean, run_cli
from kvgrant.errors import ArgumentError, GeometryError, ReleasedError, TraceError


def _doc() -> dict[str, Any]:
    return json.loads(SMALL.read_text())


@pytest.fixture(scope="module")
def small_trace(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("t") / "small.ndjson"
    res = run_cli(["alloc", str(SMALL), "--backend", "sim", "--trace", str(path)])
    assert res.rc == 0, res.err
    return path


def _write(tmp_path: Path, name: str, data: str | bytes) -> Path:
    p = tmp_path / name
    if isinstance(data, bytes):
        p.write_bytes(data)
    else:
        p.write_text(data)
    return p


# ---------------------------------------------------------------- 2. TLC up front

def test_a_trace_longer_than_tlc_can_check_is_refused_up_front_after_the_python_verdict(
        small_trace: Path) -> None:
    res = run_cli(["conform", str(small_trace), "--engine", "both", "--tlc-max-events", "10"])
    assert_clean(res, invalid=True)
    assert res.rc == 2
    assert res.out.startswith("accepted by python")  # printed before the TLC refusal
    assert "TLC cannot check this trace" in res.err and "--engine python" in res.err


def test_both_engines_print_the_python_verdict_before_tlc_starts(
        small_trace: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import sys

    import kvgrant.conformance as conf

    seen: list[str] = []

    def fake_tlc(trace: Any, timeout: float) -> Any:
        seen.append(sys.stdout.getvalue())  # what the user saw when TLC started
        return conf.replay(trace)

    monkeypatch.setattr(conf, "check_trace_tlc", fake_tlc)
    res = run_cli(["conform", str(small_trace), "--engine", "both"])
    assert res.rc == 0, res.err
    assert seen and seen[0].startswith("accepted by python")


# ---------------------------------------------------------------- 3. bounded reads

def test_plan_of_dev_zero_is_refused_by_size() -> None:
    res = run_cli(["plan", "/dev/zero"])
    assert_clean(res, invalid=True)
    assert "larger than" in res.err


def test_conform_of_dev_zero_is_refused_by_size() -> None:
    res = run_cli(["conform", "/dev/zero"])
    assert_clean(res, invalid=True)
    assert "larger than" in res.err


@pytest.mark.parametrize("ranks", [1_000_000_000, 100_000, 4097])
def test_a_header_with_too_many_ranks_is_refused(small_trace: Path, tmp_path: Path,
                                                 ranks: int) -> None:
    lines = small_trace.read_text().splitlines()
    head = json.loads(lines[0])
    head["ranks"] = ranks
    p = _write(tmp_path, "t.ndjson", "\n".join([json.dumps(head), *lines[1:]]) + "\n")
    res = run_cli(["conform", str(p)])
    assert_clean(res, invalid=True)
    assert "header.ranks" in res.err and res.rc == 2


def test_a_rejected_state_of_many_ranks_is_summarised(small_trace: Path,
                                                      tmp_path: Path) -> None:
    lines = small_trace.read_text().splitlines()
    head = json.loads(lines[0])
    n = 4096
    head.update(ranks=n, importers={}, declared_readers=None,
                devices={str(r): r for r in range(n)})
    head.pop("declared_readers")
    size = head["reservations"]["0"][1]  # version 2: every rank's reservation (never made)
    head["reservations"].update({str(r): [None, size] for r in range(3, n)})
    # all events kept: rank 0..2 act, the other ranks never reserve -> rejected
    p = _write(tmp_path, "t.ndjson", "\n".join([json.dumps(head), *lines[1:]]) + "\n")
    res = run_cli(["conform", str(p)])
    assert_clean(res, invalid=True)
    assert res.rc == 1
    assert len(res.out) < 20_000
    assert "more ranks (all of them with --json)" in res.out


def test_deeply_nested_trace_line_names_its_line(small_trace: Path, tmp_path: Path) -> None:
    lines = small_trace.read_text().splitlines()
    ev = json.loads(lines[1])
    deep = "[" * 1500 + "]" * 1500
    bad = json.dumps(ev)[:-1] + ', "x": ' + deep + "}"
    p = _write(tmp_path, "t.ndjson", "\n".join([lines[0], bad, *lines[2:]]) + "\n")
    res = run_cli(["conform", str(p)])
    assert_clean(res, invalid=True)
    assert ":2:" in res.err and "nested deeper" in res.err


@pytest.mark.parametrize("devices", ["0,1,100000000", "0,1,99999", "0,1,1024"])
def test_huge_device_ordinals_are_refused(devices: str) -> None:
    res = run_cli(["alloc", str(SMALL), "--backend", "sim", f"--devices={devices}"])
    assert_clean(res, invalid=True)
    assert "CUDA ordinal" in res.err


# ---------------------------------------------------------------- 5. data safety

def test_trace_onto_the_geometry_file_is_refused(tmp_path: Path) -> None:
    g = _write(tmp_path, "g.json", SMALL.read_text())
    before = g.read_bytes()
    res = run_cli(["alloc", str(g), "--backend", "sim", "--trace", str(g)])
    assert_clean(res, invalid=True)
    assert g.read_bytes() == before
    link = tmp_path / "link.json"
    link.symlink_to(g)  # the same inode under another name
    res = run_cli(["alloc", str(g), "--backend", "sim", "--trace", str(link)])
    assert_clean(res, invalid=True)
    assert g.read_bytes() == before and "geometry file" in res.err


def test_an_existing_non_trace_file_is_kept_without_force(tmp_path: Path) -> None:
    notes = _write(tmp_path, "notes.txt", "precious\n")
    res = run_cli(["alloc", str(SMALL), "--backend", "sim", "--trace", str(notes)])
    assert_clean(res, invalid=True)
    assert notes.read_text() == "precious\n" and "--force" in res.err
    res = run_cli(["alloc", str(SMALL), "--backend", "sim", "--trace", str(notes), "--force"])
    assert res.rc == 0, res.err
    assert json.loads(notes.read_text().splitlines()[0])["kind"] == "header"


def test_an_existing_trace_is_overwritten(small_trace: Path, tmp_path: Path) -> None:
    t = _write(tmp_path, "t.ndjson", small_trace.read_text())
    res = run_cli(["alloc", str(SMALL), "--backend", "sim", "--trace", str(t)])
    assert res.rc == 0, res.err


# ---------------------------------------------------------------- 6. released caches

def test_views_of_a_released_cache_raise() -> None:
    from kvgrant.runtime import allocate

    pub = allocate(str(SMALL), backend="sim")
    region = pub.geometry.regions[0].name
    plane = pub.geometry.planes[0].name
    assert pub.row_va(0, region, 0) > 0
    pub.release()
    for call in (lambda: pub.row_va(0, region, 0), lambda: pub.row(0, region, 0),
                 lambda: pub.page(0, plane, 0), lambda: pub.plane(0, plane)):
        with pytest.raises(ReleasedError, match="released"):
            call()
    with pytest.raises(ReleasedError):
        with pub:
            pass


def test_a_buffer_taken_before_the_release_is_refused_after_it() -> None:
    """Was: a DeviceBuffer (a plane, a row, a page, a slice) taken before release() was
    still sliced, and on CUDA viewed, after it: a view on unmapped memory."""
    from kvgrant.runtime import allocate
    from kvgrant.runtime.views import DeviceBuffer

    pub = allocate(str(SMALL), backend="sim")
    region, plane = pub.geometry.regions[0].name, pub.geometry.planes[0].name
    bufs = [pub.plane(0, plane), pub.row(0, region, 0), pub.page(0, plane, 0),
            pub.plane(0, plane).slice(0, 16)]
    assert [b.slice(0, 1).nbytes for b in bufs] == [1, 1, 1, 1]  # live: fine
    pub.release()
    for buf in bufs:
        for call in (lambda: buf.slice(0, 1), buf.as_tensor,
                     lambda: buf.__cuda_array_interface__):
            with pytest.raises(ReleasedError, match=r"DeviceBuffer\..*: the cache was released"):
                call()
    # a buffer made by hand has no cache to ask: sliced as before
    assert DeviceBuffer(0x1000, 64, 0).slice(8, 8) == DeviceBuffer(0x1008, 8, 0)


def test_leaving_the_with_block_releases_the_views() -> None:
    from kvgrant.runtime import allocate

    with allocate(str(SMALL), backend="sim") as pub:
        region = pub.geometry.regions[0].name
        pub.row_va(0, region, 0)
    with pytest.raises(ReleasedError):
        pub.row_va(0, region, 0)


# ---------------------------------------------------------------- 7. silently accepted

def test_fail_at_past_the_last_call_says_the_fault_never_fired() -> None:
    # was: the run went ahead, published and released, then said the fault never fired
    # (exit 1); now refused up front, before anything is allocated
    res = run_cli(["alloc", str(SMALL), "--backend", "sim", "--fail-at", "1000"])
    assert_clean(res, invalid=True)
    assert res.rc == 2 and "--fail-at = 1000: must be at most" in res.err, res.err
    assert "published" not in res.out, res.out


@pytest.mark.parametrize("flag", [
    "--fail-at=1,0", "--fail-at=1_0", "--fail-at=\uff11", "--fail-at=0",
    "--devices=", "--devices=0,,1", "--devices=0,0,1", "--devices=\uff10,1,2",
    "--memory-limit=-1", "--memory-limit=9999999999999T", "--memory-limit=\uff14\uff10G",
    "--ranks=0", "--ranks=\uff12", "--handle-budget=1,0",
])
def test_bad_flag_values_are_refused(flag: str) -> None:
    res = run_cli(["alloc", str(SMALL), "--backend", "sim", flag])
    assert_clean(res, invalid=True)
    assert res.rc == 2


def test_thousands_separators_still_read() -> None:
    res = run_cli(["alloc", str(SMALL), "--backend", "sim", "--handle-budget=523,880"])
    assert res.rc == 0, res.err


@pytest.mark.parametrize("name", ["a\0b", "a\nb", "a\x1b[31mred", "a\u202eb", " padded"])
def test_geometry_names_that_would_garble_a_terminal_are_refused(tmp_path: Path,
                                                                 name: str) -> None:
    for where in ("name", "plane"):
        doc = _doc()
        if where == "name":
            doc["name"] = name
        else:
            old = doc["planes"][0]["name"]
            doc["planes"][0]["name"] = name
            for a in doc["aliases"]:
                if a["plane"] == old:
                    a["plane"] = name
        p = _write(tmp_path, "g.json", json.dumps(doc))
        res = run_cli(["alloc", str(p), "--backend", "sim"])
        assert_clean(res, invalid=True)
        assert "\x1b" not in res.out + res.err and "\u202e" not in res.out + res.err
        assert "\0" not in res.out + res.err


def test_a_non_utf8_byte_in_a_trace_names_line_and_column(small_trace: Path,
                                                          tmp_path: Path) -> None:
    raw = small_trace.read_bytes().split(b"\n")
    raw[3] = raw[3][:10] + b"\xff" + raw[3][10:]
    p = _write(tmp_path, "t.ndjson", b"\n".join(raw))
    res = run_cli(["conform", str(p)])
    assert_clean(res, invalid=True)
    assert ":4:" in res.err and "column 11" in res.err and "0xff" in res.err


def test_verify_of_a_file_says_it_wants_a_folder(small_trace: Path) -> None:
    res = run_cli(["verify", str(small_trace)])
    assert_clean(res, invalid=True)
    assert "is a file" in res.err and "kvgrant conform" in res.err


# ---------------------------------------------------------------- 8. library API

def _sim() -> Any:
    from kvgrant.runtime.sim import SimDriver

    return SimDriver(devices=3)


@pytest.mark.parametrize("kwargs, argument", [
    ({"geometry": None}, "geometry"),
    ({"geometry": 3.5}, "geometry"),
    ({"plan": lambda g: None}, "plan"),
    ({"plan": "nope"}, "plan"),
    ({"devices": "012"}, "devices"),
    ({"devices": [0, 1, 2.0]}, "devices[2]"),
    ({"devices": [0, 1, True]}, "devices[2]"),
    ({"preflight": "no"}, "preflight"),
    ({"check_contract": 1}, "check_contract"),
    ({"trace": 123}, "trace"),
    ({"trace": io.BytesIO()}, "trace"),
    ({"backend": "gpu"}, "backend"),
    ({"handle_budget": -1}, "handle_budget"),
    ({"handle_budget": 1.5}, "handle_budget"),
    ({"memory_limit": 1.5}, "memory_limit"),
    ({"driver_options": [1]}, "driver_options"),
    ({"handle_reserve": -1}, "handle_reserve"),
    ({"ledger": 42}, "ledger"),
    ({"trace_errors": "ignore"}, "trace_errors"),
    ({"driver": object()}, "driver"),
])
def test_allocate_names_the_bad_argument(kwargs: dict[str, Any], argument: str) -> None:
    from kvgrant.runtime import allocate

    geometry = kwargs.pop("geometry", str(SMALL))
    drv = kwargs.pop("driver", None) or _sim()
    with pytest.raises(ArgumentError) as info:
        allocate(geometry, driver=drv, **kwargs)
    assert info.value.argument == argument
    assert argument.split("[")[0] in str(info.value)
    if hasattr(drv, "live"):
        assert drv.live().is_empty()


def test_allocate_refuses_a_full_width_memory_limit() -> None:
    from kvgrant.runtime import allocate

    drv = _sim()
    with pytest.raises(ArgumentError, match="memory_limit"):   # bad input (was PlanError)
        allocate(str(SMALL), driver=drv, memory_limit="\uff14\uff10G")
    assert drv.live().is_empty()


def test_allocate_refuses_the_geometry_file_as_trace(tmp_path: Path) -> None:
    from kvgrant.runtime import allocate

    g = _write(tmp_path, "g.json", SMALL.read_text())
    with pytest.raises(ArgumentError, match="geometry file"):
        allocate(str(g), driver=_sim(), trace=str(g))
    assert g.read_text() == SMALL.read_text()


def test_a_trace_that_cannot_be_written_is_an_error_unless_asked_to_continue() -> None:
    from kvgrant.runtime import allocate

    class Broken(io.StringIO):
        def write(self, s: str) -> int:
            raise OSError(5, "I/O error")

    drv = _sim()
    with pytest.raises(TraceError, match="I/O error"):
        allocate(str(SMALL), driver=drv, trace=Broken())
    assert drv.live().is_empty()
    pub = allocate(str(SMALL), driver=drv, trace=Broken(), trace_errors="continue")
    assert pub.trace_error is not None
    pub.release()
    assert drv.live().is_empty()


@pytest.mark.parametrize("call, argument", [
    (lambda p: p.row_va(0, "nope", 0), "region"),
    (lambda p: p.row_va(5, "snapshot", 0), "rank"),
    (lambda p: p.row_va(0, "snapshot", 10**6), "row"),
    (lambda p: p.row_va("0", "snapshot", 0), "rank"),
    (lambda p: p.page(0, "nope", 0), "plane"),
    (lambda p: p.page(0, None, 0), "plane"),
    (lambda p: p.page(0, "kv0", -1), "page"),
    (lambda p: p.plane(-1, "kv0"), "rank"),
    (lambda p: p.row(0, "snapshot", 2.0), "row"),
])
def test_views_name_the_bad_argument(call: Any, argument: str) -> None:
    from kvgrant.runtime import allocate

    with allocate(str(SMALL), backend="sim") as pub:
        assert "snapshot" in pub.geometry.region_by_name
        with pytest.raises(ArgumentError) as info:
            call(pub)
        assert info.value.argument == argument


def test_load_geometry_refuses_a_non_path() -> None:
    from kvgrant.layout.geometry import load_geometry

    with pytest.raises(GeometryError, match="file path"):
        load_geometry(None)  # type: ignore[arg-type]


def test_sim_refuses_a_huge_device_count() -> None:
    from kvgrant.runtime.sim import SimDriver

    with pytest.raises(ArgumentError, match="devices"):
        SimDriver(devices=100_000_000)
