"""The host ledger: reservations, refusal naming the holders, reaping, bad files, the lock,
and its wiring into ``allocate`` (one process; several processes: test_host_pool.py)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Iterator

import pytest
from _small import chunk_plan, small_geometry

from kvgrant.errors import (AllocationError, HandleBudgetError, LedgerError, LedgerLockTimeout,
                            NotALedger)
from kvgrant.layout.preflight import DEFAULT_HANDLE_RESERVE, handle_demand
from kvgrant.runtime import hostlock
from kvgrant.runtime import ledger as ledger_mod
from kvgrant.runtime.allocator import allocate
from kvgrant.runtime.faults import Fault
from kvgrant.runtime.hostlock import current_process
from kvgrant.runtime.ledger import LEDGER_ENV, HostLedger, default_ledger_path
from kvgrant.runtime.sim import SimDriver

GIB = 1 << 30


@pytest.fixture
def book(tmp_path: Path) -> HostLedger:
    return HostLedger(tmp_path / "ledger.json", lock_timeout_s=2.0)


def _take(book: HostLedger, n: int, budget: int = 1000, reserve: int = 0, name: str = "g"):
    return book.reserve(n, geometry=name, label="packed", budget=budget, reserve=reserve)


def _doc(book: HostLedger) -> dict:
    return json.loads(book.path.read_text().split("\n", 1)[0])


def test_all_is_sorted() -> None:
    assert ledger_mod.__all__ == sorted(ledger_mod.__all__)


def test_default_path_is_under_dev_shm_and_the_environment_overrides_it(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.delenv(LEDGER_ENV, raising=False)
    if os.path.isdir("/dev/shm"):
        assert default_ledger_path() == Path("/dev/shm/kvgrant-ledger.json")
    monkeypatch.setenv(LEDGER_ENV, str(tmp_path / "x.json"))
    assert default_ledger_path() == tmp_path / "x.json"
    assert HostLedger().path == tmp_path / "x.json"


def test_reserve_records_and_release_removes(book: HostLedger) -> None:
    lease = book.reserve(300, geometry="dcp8", label="packed", budget=1000, reserve=10,
                         devices=[0, 1])
    (h,) = book.holders()
    me = current_process()
    assert (h.pid, h.start, h.geometry, h.label, h.handles, h.devices, h.checked) == (
        me.pid, me.start, "dcp8", "packed", 300, (0, 1), True)
    assert (h.budget, h.reserve) == (1000, 10)
    assert os.stat(book.path).st_mode & 0o777 == 0o666  # every user of the host shares it
    lease.release()
    lease.release()  # idempotent
    assert book.holders() == []


def test_lease_is_a_context_manager(book: HostLedger) -> None:
    with _take(book, 5) as lease:
        assert [h.id for h in book.holders()] == [lease.holder.id]
    assert book.holders() == [] and lease.released


def test_refusal_names_every_holder_the_budget_reserve_and_overdraw(book: HostLedger) -> None:
    a = _take(book, 400, name="first")
    b = _take(book, 300, name="second")
    with pytest.raises(HandleBudgetError) as info:
        _take(book, 250, reserve=100, name="third")
    err = info.value
    assert (err.demand, err.budget, err.reserve, err.held, err.overdraw) == (
        250, 1000, 100, 700, 50)
    assert sorted((h["geometry"], h["handles"]) for h in err.holders) == [
        ("first", 400), ("second", 300)]
    text = str(err)
    for part in (f"pid {os.getpid()} 'first'", "400 handles", "'second'", "300 handles",
                 "1,000", "reserve of 100", "over by 50", str(book.path)):
        assert part in text, part
    assert len(book.holders()) == 2  # nothing recorded for the refused one
    # exactly at the budget fits
    _take(book, 200, reserve=100).release()
    a.release(), b.release()


def test_a_holder_admitted_with_a_smaller_budget_binds_a_later_larger_one(
        book: HostLedger) -> None:
    """Audit: each caller's check used its own budget, so a process started with a larger
    budget pushed the host past what an earlier holder was admitted with."""
    first = _take(book, 600, budget=1000, name="first")
    with pytest.raises(HandleBudgetError) as info:
        _take(book, 500, budget=5000, name="later")       # 1,100 > the first's 1,000
    err = info.value
    assert (err.budget, err.reserve, err.overdraw) == (1000, 0, 100)
    assert f"the budget and reserve pid {os.getpid()} was admitted with" in str(err)
    _take(book, 400, budget=5000).release()               # within 1,000: fits
    first.release()
    _take(book, 1100, budget=5000).release()              # the first is gone: its own


def test_a_holder_admitted_with_a_larger_reserve_binds_a_later_smaller_one(
        book: HostLedger) -> None:
    first = _take(book, 100, budget=1000, reserve=500)
    with pytest.raises(HandleBudgetError) as info:
        _take(book, 401, budget=1000, reserve=0)          # 501 > 1,000 - 500
    assert (info.value.budget, info.value.reserve) == (1000, 500)
    _take(book, 400, budget=1000, reserve=0).release()
    first.release()


def test_each_holder_binds_with_its_own_pair_not_a_mix_of_two(book: HostLedger) -> None:
    """Review: the smallest budget of one holder and the largest reserve of another
    refused shares that kept every holder's own check true."""
    a = _take(book, 10, budget=100, reserve=0)
    _take(book, 10, budget=1000, reserve=900).release()   # a: 20 <= 100; b: 920 <= 1,000
    with pytest.raises(HandleBudgetError) as info:
        _take(book, 91, budget=1000, reserve=0)           # a: 101 > 100
    assert (info.value.budget, info.value.reserve) == (100, 0)
    a.release()


def test_a_holder_recorded_with_the_pre_flight_off_does_not_bind(book: HostLedger) -> None:
    book.reserve(10, geometry="g", label="naive", budget=20, reserve=0, check=False)
    _take(book, 900, budget=1000).release()               # 10 + 900 <= 1,000


def test_unchecked_reservation_is_recorded_even_when_it_overdraws(book: HostLedger) -> None:
    _take(book, 900)
    lease = book.reserve(500, geometry="g", label="naive", budget=1000, reserve=0, check=False)
    assert sorted(h.handles for h in book.holders()) == [500, 900]
    assert not lease.holder.checked


def test_resize_grows_only_within_the_budget(book: HostLedger) -> None:
    other = _take(book, 600)
    lease = _take(book, 300)
    lease.resize(100)
    assert sorted(h.handles for h in book.holders()) == [100, 600]
    with pytest.raises(HandleBudgetError):
        lease.resize(401)
    assert lease.handles == 100
    lease.resize(400)
    assert sum(h.handles for h in book.holders()) == 1000
    other.release(), lease.release()


@pytest.mark.parametrize("field, value", [("handles", -1), ("budget", 1.5), ("reserve", True)])
def test_bad_counts_name_the_argument(book: HostLedger, field: str, value: object) -> None:
    args = {"handles": 1, "budget": 10, "reserve": 0}
    args[field] = value
    with pytest.raises(ValueError, match=f"{field} = "):
        book.reserve(args["handles"], geometry="g", label="p", budget=args["budget"],  # type: ignore[arg-type]
                     reserve=args["reserve"])  # type: ignore[arg-type]


# ---------------------------------------------------------------------- reaping
def test_reaps_a_holder_whose_process_exited_without_releasing(book: HostLedger) -> None:
    code = ("import os, sys; from kvgrant.runtime.ledger import HostLedger; "
            "HostLedger(sys.argv[1]).reserve(700, geometry='gone', label='packed', "
            "budget=1000, reserve=0); os._exit(0)")
    subprocess.run([sys.executable, "-c", code, str(book.path)], check=True, timeout=60)
    assert [h.geometry for h in book.holders(reap=False)] == ["gone"]
    lease = _take(book, 700)  # fits only once the dead holder is reaped
    assert [h.geometry for h in book.reaped] == ["gone"]
    assert [h.id for h in book.holders()] == [lease.holder.id]


def _inject(book: HostLedger, **fields: object) -> None:
    """Add a holder entry as another process would have written it."""
    _take(book, 1).release()  # make sure the file exists
    doc = _doc(book)
    me = current_process()
    entry = {"id": "x" * 32, "pid": me.pid, "start": me.start, "pidns": me.pidns,
             "host": "h", "geometry": "injected", "label": "packed", "handles": 500,
             "budget": 1000, "reserve": 0, "checked": True, "devices": [0], "since": 0.0}
    entry.update(fields)
    doc["holders"].append(entry)
    book.path.write_text(json.dumps(doc) + "\n")


def test_a_reused_pid_with_another_start_time_is_reaped(book: HostLedger) -> None:
    _inject(book, start=current_process().start + 12345)
    assert book.holders() == [] and [h.geometry for h in book.reaped] == ["injected"]


def test_a_holder_in_a_pid_namespace_that_is_gone_is_reaped(book: HostLedger) -> None:
    if not hostlock._Scan().complete:
        pytest.skip("this /proc does not list the whole host (a container?)")
    _inject(book, pid=999_999_999, pidns="pid:[1]")  # no namespace has inode 1
    assert book.holders() == [] and [h.geometry for h in book.reaped] == ["injected"]
    assert "no process on this host is in that namespace" in book.notes[book.reaped[0].id]


def test_a_holder_in_a_pid_namespace_this_process_cannot_see_is_kept_and_marked(
        book: HostLedger, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(hostlock, "INIT_PIDNS", "pid:[0]")  # as in a container
    _inject(book, pid=999_999_999, pidns="pid:[1]")
    (h,) = book.holders()
    assert h.geometry == "injected" and book.verdicts[h.id].state == "unknown"
    assert "other pid namespace pid:[1], cannot tell" in book.notes[h.id]


def test_a_ledger_from_an_earlier_boot_of_this_host_is_emptied(book: HostLedger) -> None:
    _inject(book)
    doc = _doc(book)
    doc["boot_id"] = "another-boot"
    book.path.write_text(json.dumps(doc) + "\n")
    assert book.holders() == []


# ---------------------------------------------------------------------- bad files
def _write(book: HostLedger, data: bytes) -> None:
    book.path.write_bytes(data)


GOOD = b'{"format":"kvgrant-host-ledger","version":1,"host":"h","boot_id":"","holders":[]}'


@pytest.mark.parametrize("data, words", [
    (b"", "is empty"),
    (b"\x00\xff garbage", "garbage or truncated"),
    (GOOD[:40], "garbage or truncated"),
    (b'{"format":"kvgrant-host-ledger","version":"1","holders":[]}', "version = '1'"),
    (b'{"format":"kvgrant-host-ledger","version":1,"holders":{}}', "\"holders\" is not a list"),
    (b'{"format":"kvgrant-host-ledger","version":1,"holders":[{"pid":"1"}]}',
     "holders[0].id"),
])
def test_an_unreadable_ledger_is_a_clear_error_and_is_left_alone(
        book: HostLedger, data: bytes, words: str) -> None:
    _write(book, data)
    for op in (book.holders, lambda: _take(book, 1)):
        with pytest.raises(LedgerError) as info:
            op()
        assert words in str(info.value) and "kvgrant budget --repair" in str(info.value)
        assert info.value.path == str(book.path)
    assert book.path.read_bytes() == data  # never overwritten by a guess


@pytest.mark.parametrize("data", [
    b'{"format": "something-else", "version": 1}',
    b'{\n  "name": "small",\n  "granularity": 2097152\n}\n',   # an indented geometry
    b'{"kind": "header", "version": 2}\n{"kind": "event"}\n',    # a trace's first line
    b'[1, 2, 3]',
])
def test_another_programs_json_file_is_named_as_such_and_never_repaired_over(
        book: HostLedger, data: bytes) -> None:
    """A JSON document that is not a ledger is someone's file at the wrong path (a
    geometry given as --ledger): the error says so and offers no --repair, and repair()
    refuses too, leaving the file as it was (it used to move it aside and put an empty
    ledger in its place)."""
    _write(book, data)
    for op in (book.holders, lambda: _take(book, 1), book.repair):
        with pytest.raises(NotALedger) as info:
            op()
        msg = str(info.value)
        assert "is not a kvgrant ledger: it is a JSON document" in msg, msg
        assert "--repair" not in msg and "give --ledger the ledger's own path" in msg, msg
        assert info.value.path == str(book.path)
    assert book.path.read_bytes() == data
    assert list(book.path.parent.glob(book.path.name + ".bad-*")) == []


def test_a_ledger_of_a_newer_version_is_refused_not_overwritten(book: HostLedger) -> None:
    data = GOOD.replace(b'"version":1', b'"version":2')
    _write(book, data)
    with pytest.raises(LedgerError, match="newer kvgrant .*version 2.* reads version 1"):
        _take(book, 1)
    assert book.path.read_bytes() == data


def test_a_ledger_of_another_host_is_refused(book: HostLedger) -> None:
    _write(book, GOOD.replace(b'"host":"h","boot_id":""',
                              b'"host":"elsewhere","boot_id":"other-boot"'))
    if not current_process().boot_id:
        pytest.skip("no boot id here")
    with pytest.raises(LedgerError, match="belongs to host 'elsewhere'"):
        book.holders()


def test_text_after_the_first_line_is_ignored(book: HostLedger) -> None:
    _write(book, GOOD + b"\n}garbage left by a writer that died before truncating")
    assert book.holders() == []


def test_repair_keeps_the_bad_content_and_starts_empty(book: HostLedger) -> None:
    _write(book, b"garbage")
    aside = book.repair()
    assert aside is not None and aside.read_bytes() == b"garbage"
    assert book.holders() == []
    lease = _take(book, 3)
    assert book.repair() is None  # a readable ledger keeps its live holders
    assert [h.id for h in book.holders()] == [lease.holder.id]


@pytest.mark.skipif(os.geteuid() == 0, reason="root can write a read-only file")
def test_a_ledger_this_user_cannot_write_is_a_clear_error(book: HostLedger) -> None:
    _take(book, 1).release()
    book.path.chmod(0o444)
    with pytest.raises(LedgerError, match="cannot open it for reading and writing"):
        _take(book, 1)


def test_a_symbolic_link_is_not_followed(book: HostLedger, tmp_path: Path) -> None:
    victim = tmp_path / "victim"
    victim.write_bytes(b"precious")
    book.path.symlink_to(victim)
    with pytest.raises(LedgerError, match="is a symbolic link .*refused for safety") as info:
        _take(book, 1)
    assert "fix its mode" not in str(info.value)
    assert victim.read_bytes() == b"precious"


def test_a_missing_directory_is_a_clear_error(tmp_path: Path) -> None:
    with pytest.raises(LedgerError, match="cannot create it"):
        HostLedger(tmp_path / "no" / "such" / "ledger.json").holders()


def test_a_lock_held_by_a_stuck_process_times_out_naming_it(book: HostLedger) -> None:
    _take(book, 1).release()
    code = ("import fcntl, os, sys, time; fd = os.open(sys.argv[1], os.O_RDWR); "
            "fcntl.flock(fd, fcntl.LOCK_EX); print('locked', flush=True); time.sleep(120)")
    stuck = subprocess.Popen([sys.executable, "-c", code, str(book.path)],
                             stdout=subprocess.PIPE, text=True)
    try:
        assert stuck.stdout is not None and stuck.stdout.readline().strip() == "locked"
        quick = HostLedger(book.path, lock_timeout_s=0.3)
        with pytest.raises(LedgerLockTimeout) as info:
            _take(quick, 1)
        assert info.value.holder_pid == stuck.pid
        assert f"process {stuck.pid} holds it" in str(info.value)
        assert "stuck" in str(info.value)
    finally:
        stuck.kill()
        stuck.wait(timeout=30)
        if stuck.stdout is not None:
            stuck.stdout.close()
    assert book.holders() == []  # nothing was recorded, and the lock is free again


# ---------------------------------------------------------------------- allocate
@pytest.fixture
def sim3() -> Iterator[SimDriver]:
    drv = SimDriver(devices=3)
    yield drv
    drv.close()


def test_allocate_holds_a_lease_for_the_life_of_the_cache(book: HostLedger,
                                                          sim3: SimDriver) -> None:
    g = small_geometry()
    with allocate(g, plan=chunk_plan, driver=sim3, ledger=book) as pub:
        (h,) = book.holders()
        assert h.handles == pub.counts.grants == handle_demand(g, chunk_plan(g))
        assert (h.geometry, h.label, h.devices, h.reserve) == (
            g.name, "chunks", (0, 1, 2), DEFAULT_HANDLE_RESERVE)
    assert book.holders() == []
    assert sim3.live().is_empty()


def test_allocate_is_refused_by_the_ledger_before_any_driver_call(book: HostLedger,
                                                                  sim3: SimDriver) -> None:
    g = small_geometry()
    demand = handle_demand(g, chunk_plan(g))
    other = book.reserve(100, geometry="other", label="packed", budget=10**6, reserve=0)
    with pytest.raises(HandleBudgetError) as info:
        allocate(g, plan=chunk_plan, driver=sim3, ledger=book, handle_budget=demand + 99,
                 handle_reserve=0)
    assert [h["geometry"] for h in info.value.holders] == ["other"]
    assert info.value.held == 100 and info.value.overdraw == 1
    assert sum(sim3.calls.values()) == 0
    assert [h.geometry for h in book.holders()] == ["other"]
    other.release()


def test_without_preflight_the_lease_is_recorded_unchecked(book: HostLedger,
                                                           sim3: SimDriver) -> None:
    g = small_geometry()
    with allocate(g, plan=chunk_plan, driver=sim3, ledger=book, handle_budget=1,
                  preflight=False):
        (h,) = book.holders()
        assert not h.checked
    assert book.holders() == []


def test_an_aborted_allocation_releases_its_lease(book: HostLedger) -> None:
    g = small_geometry()
    drv = SimDriver(devices=3, faults=Fault(call="cuMemSetAccess", nth=5))
    with pytest.raises(AllocationError):
        allocate(g, plan=chunk_plan, driver=drv, ledger=book)
    assert book.holders() == [] and drv.live().is_empty()


def test_a_failure_before_the_transaction_releases_its_lease(book: HostLedger) -> None:
    g = small_geometry()
    with pytest.raises(Exception):
        allocate(g, plan=chunk_plan, driver=SimDriver(devices=2), ledger=book)  # 3 ranks
    assert book.holders() == []


def test_fitted_pages_resize_the_lease(book: HostLedger) -> None:
    g = small_geometry(pages=1000)
    drv = SimDriver(devices=3, memory_per_device=2 * GIB)
    with allocate(g, plan=chunk_plan, driver=drv, memory_limit="-1G", ledger=book) as pub:
        assert pub.capacity.pages < 1000
        (h,) = book.holders()
        assert h.handles == pub.counts.grants
    assert book.holders() == []


def test_sim_uses_no_ledger_unless_asked(monkeypatch: pytest.MonkeyPatch, tmp_path: Path,
                                         sim3: SimDriver) -> None:
    monkeypatch.delenv(LEDGER_ENV, raising=False)
    monkeypatch.chdir(tmp_path)
    g = small_geometry()
    allocate(g, plan=chunk_plan, driver=sim3).release()
    path = tmp_path / "env-ledger.json"
    monkeypatch.setenv(LEDGER_ENV, str(path))
    with allocate(g, plan=chunk_plan, driver=sim3):
        assert len(HostLedger(path).holders()) == 1
