"""Bad input an independent hunt found handled with a traceback, a false reason or not
at all (review 2026-12-07): damaged records in the host ledger, the sim pool and the
plan cache's lock; a trace through a pipe; a FIFO as the sim pool; the TLC limits of a
group check; zero-padded owner keys; --fail-rank alone; granted_count of no rank."""

from __future__ import annotations

import json
import os
import socket
import struct
import subprocess
import sys
from pathlib import Path

import pytest

from kvgrant.cli import main
from kvgrant.runtime.hostlock import PID_MAX_LIMIT, current_process

ROOT = Path(__file__).resolve().parents[1]
SMALL = ROOT / "examples" / "small.json"


def _ledger(path: Path, **holder: object) -> Path:
    me = current_process()
    entry = {"id": "x", "pid": os.getpid(), "start": me.start, "pidns": me.pidns,
             "host": socket.gethostname(), "geometry": "g", "label": "packed",
             "handles": 10, "budget": 523880, "reserve": 4096, "checked": True,
             "devices": [0], "since": 1764520000.0, **holder}
    doc = {"format": "kvgrant-host-ledger", "version": 1, "host": socket.gethostname(),
           "boot_id": me.boot_id, "holders": [entry]}
    path.write_text(json.dumps(doc) + "\n")
    return path


@pytest.mark.parametrize("pid", [2 ** 31, 2 ** 70, PID_MAX_LIMIT + 1])
def test_a_holder_with_a_pid_no_process_can_have_is_reaped_not_a_traceback(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], pid: int) -> None:
    # was: os.kill raised OverflowError in every command that read the ledger, and in
    # `budget --repair` that should fix it
    book = _ledger(tmp_path / "ledger.json", pid=pid)
    assert main(["budget", "--ledger", str(book)]) == 0
    out = capsys.readouterr().out
    assert f"reaped (process gone): pid {pid}" in out
    assert f"pid {pid} is not a process (Linux pids are 1..{PID_MAX_LIMIT})" in out
    _ledger(book, pid=pid)
    assert main(["alloc", str(SMALL), "--backend", "sim", "--ledger", str(book)]) == 0


def test_a_holder_time_that_is_not_finite_is_a_ledger_error(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    book = tmp_path / "ledger.json"
    _ledger(book)
    book.write_text(book.read_text().replace("1764520000.0", "NaN"))
    assert main(["budget", "--ledger", str(book)]) == 1
    err = capsys.readouterr().err
    assert "holders[0].since = nan: not a finite time" in err and "--repair" in err
    assert main(["budget", "--ledger", str(book), "--repair"]) == 0


def test_a_holder_time_no_clock_can_show_is_shown_as_unknown(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    book = _ledger(tmp_path / "ledger.json", since=1e300)
    assert main(["budget", "--ledger", str(book)]) == 0
    row = next(x for x in capsys.readouterr().out.splitlines() if " g " in x)
    assert row.rstrip().endswith("?"), row
    assert main(["budget", "--ledger", str(book), "--json"]) == 0
    json.loads(capsys.readouterr().out, parse_constant=lambda c: pytest.fail(c))


def test_a_plan_cache_lock_record_with_a_damaged_time_is_named_without_it() -> None:
    from kvgrant.runtime.plancache import _who

    for since in (1e300, float("nan"), "soon"):
        text = _who(123, {"pid": 123, "since": since})
        assert text.startswith("pid 123") and "since" not in text


def test_a_sim_pool_slot_with_a_pid_past_any_process_is_reaped(tmp_path: Path) -> None:
    # was: OverflowError out of cuMemSetAccess (a traceback, no AllocationError)
    pool = tmp_path / "pool"
    pool.write_bytes(struct.pack("<8sIIq8x", b"KVGSPOOL", 1, 0, 100)
                     + struct.pack("<qqqq", 2 ** 40, 5, 0, 100))
    assert main(["alloc", str(SMALL), "--backend", "sim", "--sim-pool", str(pool),
                 "--sim-handle-budget", "100"]) == 0


def test_a_fifo_as_the_sim_pool_is_refused_by_name(tmp_path: Path,
                                                   capsys: pytest.CaptureFixture[str]) -> None:
    fifo = tmp_path / "pool"
    os.mkfifo(fifo)
    assert main(["alloc", str(SMALL), "--backend", "sim", "--sim-pool", str(fifo)]) == 1
    assert f"sim host pool {fifo} is not a regular file (a FIFO)" in capsys.readouterr().err


def test_a_trace_through_a_pipe_is_read_once(tmp_path: Path) -> None:
    # was: the group sniff read the header line, then the reader found "not valid JSON"
    trace = tmp_path / "t.ndjson"
    assert main(["alloc", str(SMALL), "--backend", "sim", "--trace", str(trace)]) == 0
    run = subprocess.run([sys.executable, "-m", "kvgrant", "conform", "/dev/stdin"],
                         input=trace.read_text(), capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr
    assert "accepted by python" in run.stdout


def test_a_group_file_through_a_pipe_says_what_it_is(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "g"
    assert main(["alloc", str(SMALL), "--backend", "sim", "--procs", "3", "--trace",
                 str(out)]) == 0
    run = subprocess.run([sys.executable, "-m", "kvgrant", "conform", "/dev/stdin"],
                         input=(out / "rank0.ndjson").read_text(), capture_output=True,
                         text=True, timeout=120)
    assert run.returncode == 2
    assert "header.mode = 'group': this is one process's file of a group trace" in run.stderr
    # and the group's TLC limit holds (was: --tlc-max-events ignored for groups)
    capsys.readouterr()
    assert main(["conform", str(out), "--engine", "tlc", "--tlc-max-events", "10"]) == 2
    assert "the group has 290 events, more than the 10 TLC checks" in capsys.readouterr().err


def test_a_zero_padded_owner_key_is_its_rank(tmp_path: Path) -> None:
    from kvgrant.errors import GeometryError
    from kvgrant.layout.geometry import parse_geometry

    doc = json.loads(SMALL.read_text())
    readers = doc["topology"]["declared_readers"]
    doc["topology"]["declared_readers"] = {k.zfill(7): v for k, v in readers.items()}
    g = parse_geometry(doc)
    assert g.topology.declared_readers == {int(k): v for k, v in readers.items()}
    with pytest.raises(GeometryError, match="listed twice"):
        parse_geometry({**doc, "topology": {**doc["topology"], "declared_readers": {
            "0000001": [1], "1": [1]}}})
    with pytest.raises(GeometryError, match=r"rank = 99: must be a rank of this geometry"):
        g.granted_count(99)


def test_fail_rank_without_fail_at_is_refused(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["alloc", str(SMALL), "--backend", "sim", "--procs", "3",
                 "--fail-rank", "2"]) == 2
    assert "--fail-rank = 2: only with --fail-at K" in capsys.readouterr().err
