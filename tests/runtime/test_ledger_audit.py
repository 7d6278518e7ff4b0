"""Audit findings on the host ledger and the sim host pool (B2: short writes on a full
disk; B1: holders of another pid namespace; B8: zombies, earlier boots, bad versions,
files that are not regular files, symbolic links).

The write failures are made by replacing ``os.pwrite`` (short counts, ENOSPC, a write of
0 bytes); the pid namespace tests run a real process under ``unshare --pid`` (skipped
where that is not allowed). Every process started here is ended by its test.
"""

from __future__ import annotations

import errno
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Callable, Iterator

import pytest

from kvgrant.cli import main as cli_main
from kvgrant.errors import LedgerError
from kvgrant.runtime import hostlock
from kvgrant.runtime.hostlock import current_process, process_state
from kvgrant.runtime.hostpool import HostPool
from kvgrant.runtime.ledger import HostLedger

WORKER = str(Path(__file__).with_name("_ledger_worker.py"))
TIMEOUT_S = 120
_real_pwrite = os.pwrite


@pytest.fixture
def book(tmp_path: Path) -> HostLedger:
    return HostLedger(tmp_path / "ledger.json", lock_timeout_s=2.0)


def _take(book: HostLedger, n: int, name: str = "g"):
    return book.reserve(n, geometry=name, label="packed", budget=10**6, reserve=0)


def _doc(path: Path) -> dict:
    return json.loads(path.read_bytes().split(b"\n", 1)[0])


def _inject(book: HostLedger, **fields: object) -> None:
    """Add a holder entry as another process would have written it."""
    _take(book, 1).release()  # make sure the file exists
    doc = _doc(book.path)
    me = current_process()
    entry: dict[str, object] = {
        "id": "x" * 32, "pid": me.pid, "start": me.start, "pidns": me.pidns, "host": "h",
        "geometry": "injected", "label": "packed", "handles": 500, "budget": 1000,
        "reserve": 0, "checked": True, "devices": [0], "since": 0.0}
    entry.update(fields)
    for k in [k for k, v in entry.items() if v is None]:
        del entry[k]  # None: the field is absent (an older kvgrant's entry)
    doc["holders"].append(entry)
    book.path.write_text(json.dumps(doc) + "\n")


def _patch_pwrite(monkeypatch: pytest.MonkeyPatch,
                  fake: Callable[[int, Any, int, int], int]) -> list[tuple[int, int]]:
    """Replace os.pwrite by ``fake(fd, data, offset, call_number)``; returns the calls'
    (offset, length)."""
    calls: list[tuple[int, int]] = []

    def pwrite(fd: int, data: Any, offset: int) -> int:
        calls.append((offset, len(data)))
        return fake(fd, data, offset, len(calls))

    monkeypatch.setattr(os, "pwrite", pwrite)
    return calls


def _enospc() -> OSError:
    return OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))


# ====================================================================== B2: short writes
def test_ledger_short_writes_are_continued_not_padded(book: HostLedger,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    first = _take(book, 11, "first")
    _patch_pwrite(monkeypatch, lambda fd, data, off, n: _real_pwrite(fd, bytes(data[:7]), off))
    second = _take(book, 22, "second")
    monkeypatch.undo()
    raw = book.path.read_bytes()
    assert b"\0" not in raw and raw.endswith(b"\n") and raw.count(b"\n") == 1
    assert sorted((h.geometry, h.handles) for h in book.holders()) == [
        ("first", 11), ("second", 22)]
    first.release(), second.release()


@pytest.mark.parametrize("failure", ["enospc", "zero"])
def test_ledger_full_disk_raises_naming_the_bytes_and_keeps_the_old_content(
        book: HostLedger, monkeypatch: pytest.MonkeyPatch, failure: str) -> None:
    lease = _take(book, 11, "kept")
    before = book.path.read_bytes()

    def fake(fd: int, data: Any, off: int, n: int) -> int:
        if n == 1:  # the first write goes 10 bytes, then the disk is full
            return _real_pwrite(fd, bytes(data[:10]), off)
        if failure == "zero":
            return 0
        raise _enospc()

    _patch_pwrite(monkeypatch, fake)
    with pytest.raises(LedgerError) as info:
        _take(book, 22, "lost")
    monkeypatch.undo()
    text = str(info.value)
    assert str(book.path) in text and info.value.path == str(book.path)
    assert "wrote 10 of " in text and "previous content is kept" in text
    assert ("ENOSPC" in text) if failure == "enospc" else ("returned 0 bytes" in text)
    assert book.path.read_bytes() == before  # byte for byte
    assert [(h.geometry, h.handles) for h in book.holders()] == [("kept", 11)]
    lease.release()


def test_ledger_write_failing_in_place_puts_the_old_content_back(
        book: HostLedger, monkeypatch: pytest.MonkeyPatch) -> None:
    lease = _take(book, 11, "kept")
    before = book.path.read_bytes()

    def fake(fd: int, data: Any, off: int, n: int) -> int:
        if n == 2:  # the in-place write (the first one went behind the old content)
            return _real_pwrite(fd, bytes(data[:5]), off)
        if n == 3:
            raise _enospc()
        return _real_pwrite(fd, data, off)

    calls = _patch_pwrite(monkeypatch, fake)
    with pytest.raises(LedgerError, match="wrote 5 of .*ENOSPC.*put back"):
        _take(book, 22, "lost")
    monkeypatch.undo()
    assert calls[0][0] == len(before) and calls[1][0] == 0  # behind, then in place
    assert book.path.read_bytes() == before
    assert [h.geometry for h in book.holders()] == ["kept"]
    lease.release()


def test_ledger_new_file_is_never_left_half_written(tmp_path: Path,
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "ledger.json"
    _patch_pwrite(monkeypatch, lambda fd, data, off, n: _real_pwrite(fd, bytes(data[:3]), off)
                  if n == 1 else (_ for _ in ()).throw(_enospc()))
    with pytest.raises(LedgerError, match="wrote 3 of .*ENOSPC"):
        HostLedger(path).holders()
    monkeypatch.undo()
    assert not path.exists()  # the half-made temp file was never linked
    assert [p.name for p in tmp_path.iterdir()] == []


def test_pool_short_writes_are_continued(tmp_path: Path,
                                         monkeypatch: pytest.MonkeyPatch) -> None:
    _patch_pwrite(monkeypatch, lambda fd, data, off, n: _real_pwrite(fd, bytes(data[:5]), off))
    pool = HostPool(tmp_path / "pool", 100)
    assert pool.take(7) == (True, 0)
    assert pool.take(3) == (True, 7)
    monkeypatch.undo()
    assert HostPool(tmp_path / "pool", 100).holders() == {os.getpid(): 10}
    pool.give(10)
    pool.close()


def test_pool_full_disk_on_a_new_slot_leaves_no_partial_slot(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    HostPool(tmp_path / "pool", 100).close()
    size = (tmp_path / "pool").stat().st_size
    pool = HostPool(tmp_path / "pool", 100)
    _patch_pwrite(monkeypatch, lambda fd, data, off, n: _real_pwrite(fd, bytes(data[:12]), off)
                  if n == 1 else (_ for _ in ()).throw(_enospc()))
    with pytest.raises(LedgerError) as info:
        pool.take(7)
    monkeypatch.undo()
    text = str(info.value)
    assert str(tmp_path / "pool") in text and "wrote 12 of 32 bytes" in text
    assert "ENOSPC" in text and "nothing changed" in text
    assert (tmp_path / "pool").stat().st_size == size
    assert pool.total() == 0
    assert pool.take(7) == (True, 0)  # and it works once there is room
    pool.give(7)
    pool.close()


def test_pool_full_disk_rewriting_a_slot_puts_the_old_slot_back(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    pool = HostPool(tmp_path / "pool", 100)
    assert pool.take(7)[0]
    before = (tmp_path / "pool").read_bytes()

    def fake(fd: int, data: Any, off: int, n: int) -> int:
        if n == 1:
            return _real_pwrite(fd, bytes(data[:20]), off)
        if n == 2:
            raise _enospc()
        return _real_pwrite(fd, data, off)

    _patch_pwrite(monkeypatch, fake)
    with pytest.raises(LedgerError, match="wrote 20 of 32 bytes.*ENOSPC.*as it was"):
        pool.take(3)
    monkeypatch.undo()
    assert (tmp_path / "pool").read_bytes() == before
    assert pool.holders() == {os.getpid(): 7}
    pool.give(7)
    pool.close()


def test_pool_file_is_not_made_with_a_partial_header(tmp_path: Path,
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    _patch_pwrite(monkeypatch, lambda fd, data, off, n: 0)
    with pytest.raises(LedgerError, match="cannot create it: wrote 0 of 32 bytes"):
        HostPool(tmp_path / "pool", 100)
    monkeypatch.undo()
    assert list(tmp_path.iterdir()) == []


# ============================================================= B1: other pid namespaces
def _can_unshare() -> bool:
    if not shutil.which("unshare"):
        return False
    try:
        return subprocess.run(["unshare", "--pid", "--fork", "--mount-proc", "true"],
                              capture_output=True, timeout=60).returncode == 0
    except (OSError, subprocess.SubprocessError):
        return False


@pytest.fixture
def inner(tmp_path: Path) -> Iterator[Callable[..., tuple[subprocess.Popen[str], dict]]]:
    """Start ``_ledger_worker.py hold`` in a new pid namespace (with its own /proc)."""
    if not _can_unshare():
        pytest.skip("unshare --pid --fork --mount-proc is not allowed here")
    started: list[subprocess.Popen[str]] = []

    def start(ledger: Path, handles: int, geometry: str) -> tuple[subprocess.Popen[str], dict]:
        p = subprocess.Popen(
            ["unshare", "--pid", "--fork", "--kill-child", "--mount-proc", sys.executable,
             WORKER, "hold", str(ledger), str(handles), geometry],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        started.append(p)
        assert p.stdout is not None
        line = p.stdout.readline()
        if not line:
            p.wait(timeout=TIMEOUT_S)
            assert p.stderr is not None
            raise AssertionError(f"worker said nothing: {p.stderr.read()[-2000:]}")
        return p, json.loads(line)

    yield start
    for p in started:
        if p.poll() is None:
            p.kill()
        p.wait(timeout=TIMEOUT_S)
        for f in (p.stdin, p.stdout, p.stderr):
            if f is not None:
                f.close()


def _die(p: subprocess.Popen[str]) -> None:
    """Make the worker exit without releasing its lease; return once unshare (which
    waits for it) has exited, so that its namespace has no process left."""
    assert p.stdin is not None
    p.stdin.write("die\n")
    p.stdin.flush()
    assert p.wait(timeout=TIMEOUT_S) == 3


def test_a_holder_of_another_namespace_is_judged_and_reaped_once_gone(
        book: HostLedger, inner: Any, capsys: Any) -> None:
    mine = _take(book, 5, "outer")
    p, out = inner(book.path, 7, "inner")
    me = current_process()
    assert out["pidns"] != me.pidns
    # the inner process cannot see our namespace: it keeps our holder, marked
    seen = {h["geometry"]: h for h in out["holders"]}
    assert seen["inner"]["state"] == "alive" and seen["inner"]["note"] is None
    assert seen["outer"]["state"] == "unknown" and "cannot tell" in seen["outer"]["note"]
    # we can see its namespace: alive, marked as another namespace's
    hs = {h.geometry: h for h in book.holders()}
    inner_h = hs["inner"]
    assert inner_h.pidns == out["pidns"] and book.verdicts[inner_h.id].state == "alive"
    assert f"other pid namespace {out['pidns']}, alive" in book.notes[inner_h.id]
    assert cli_main(["budget", "--ledger", str(book.path)]) == 0
    text = capsys.readouterr().out
    assert f"[other pid namespace {out['pidns']}, alive" in text
    assert cli_main(["budget", "--ledger", str(book.path), "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert {h["geometry"]: h["state"] for h in doc["holders"]} == {"outer": "alive",
                                                                    "inner": "alive"}
    # an operator may not drop a holder found alive
    assert cli_main(["budget", "--ledger", str(book.path), "--drop",
                     str(inner_h.pid)]) == 1
    assert "is alive" in capsys.readouterr().err
    # gone without releasing (its namespace dies with it): reaped
    _die(p)
    assert [h.geometry for h in book.holders()] == ["outer"]
    assert [h.geometry for h in book.reaped] == ["inner"]
    assert "namespace any more" in book.notes[inner_h.id]
    mine.release()


def test_a_holder_whose_pid_left_its_live_namespace_is_reaped(book: HostLedger,
                                                              inner: Any) -> None:
    p, out = inner(book.path, 7, "inner")
    # an entry for a pid that the (live) inner namespace does not have
    _inject(book, pid=4242, pidns=out["pidns"], geometry="stale")
    assert sorted(h.geometry for h in book.holders()) == ["inner"]
    assert [h.geometry for h in book.reaped] == ["stale"]
    assert "has no process 4242" in book.notes[book.reaped[0].id]
    _die(p)


def test_a_holder_that_cannot_be_judged_is_listed_and_can_be_dropped(
        book: HostLedger, monkeypatch: pytest.MonkeyPatch, capsys: Any) -> None:
    # /proc is not the whole host, as in a container
    monkeypatch.setattr(hostlock, "INIT_PIDNS", "pid:[0]", raising=False)
    mine = _take(book, 5, "mine")
    _inject(book, pid=77, pidns="pid:[1]", geometry="foreign", id="f" * 32)
    assert cli_main(["budget", "--ledger", str(book.path)]) == 0
    text = capsys.readouterr().out
    assert "[other pid namespace pid:[1], cannot tell" in text
    assert "kvgrant budget --drop PID" in text and "pids 77" in text
    assert cli_main(["budget", "--ledger", str(book.path), "--repair", "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["unknown"] == 1 and len(doc["holders"]) == 2  # repair keeps it
    # a pid nobody holds, or our own live process: refused, nothing removed
    assert cli_main(["budget", "--ledger", str(book.path), "--drop", "78"]) == 1
    assert "pid 78: no holder has it" in capsys.readouterr().err
    assert cli_main(["budget", "--ledger", str(book.path), "--drop", str(os.getpid()),
                     "--drop", "77"]) == 1
    assert "is alive" in capsys.readouterr().err
    assert len(book.holders()) == 2
    assert cli_main(["budget", "--ledger", str(book.path), "--drop", "77"]) == 0
    text = capsys.readouterr().out
    assert "dropped (--drop): pid 77 'foreign'" in text and "cannot tell" in text
    assert [h.geometry for h in book.holders()] == ["mine"]
    _inject(book, pid=78, pidns="pid:[1]", geometry="foreign2", id="e" * 32)
    assert cli_main(["budget", "--ledger", str(book.path), "--drop-unknown", "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert [h["geometry"] for h in doc["dropped"]] == ["foreign2"]
    assert [h["geometry"] for h in doc["holders"]] == ["mine"]
    mine.release()


def test_an_entry_without_a_pid_namespace_still_loads(book: HostLedger) -> None:
    _inject(book, pidns=None, geometry="old-live")
    _inject(book, pidns=None, geometry="old-dead", id="d" * 32,
            start=current_process().start + 1)
    assert [(h.geometry, h.pidns) for h in book.holders()] == [("old-live", "")]
    assert [h.geometry for h in book.reaped] == ["old-dead"]


def test_own_start_time_is_read_from_proc_self_under_unshare_without_its_own_proc() -> None:
    """Under ``unshare --pid --fork`` without --mount-proc, getpid() is 1 but /proc/1 is
    the host's init: the start time must come from /proc/self."""
    if not _can_unshare():
        pytest.skip("unshare --pid is not allowed here")
    code = ("import os; from kvgrant.runtime.hostlock import current_process; "
            "raw = open('/proc/self/stat', 'rb').read(); "
            "print(os.getpid(), current_process().start == "
            "int(raw[raw.rfind(b')') + 2:].split()[19]))")
    out = subprocess.run(["unshare", "--pid", "--fork", "--kill-child", sys.executable, "-c",
                          code], capture_output=True, text=True, timeout=TIMEOUT_S)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["1", "True"]


# ================================================================= B8: smaller findings
def test_a_zombie_holder_is_dead(book: HostLedger) -> None:
    code = ("import sys; from kvgrant.runtime.ledger import HostLedger; "
            "HostLedger(sys.argv[1]).reserve(9, geometry='zombie', label='packed', "
            "budget=100, reserve=0); print('ok', flush=True)")
    p = subprocess.Popen([sys.executable, "-c", code, str(book.path)], stdout=subprocess.PIPE,
                         text=True)
    try:
        assert p.stdout is not None and p.stdout.readline().strip() == "ok"
        # not waited for: it stays a zombie until p.wait() below
        for _ in range(6000):
            with open(f"/proc/{p.pid}/stat") as f:
                if f.read().rsplit(")", 1)[1].split()[0] == "Z":
                    break
            time.sleep(0.01)
        else:
            pytest.fail(f"process {p.pid} never became a zombie")
        (h,) = book.holders(reap=False)
        assert process_state(h.pid, h.start, h.pidns, "") == "dead"
        assert book.holders() == [] and [h.geometry for h in book.reaped] == ["zombie"]
        assert "zombie" in book.notes[h.id]
    finally:
        if p.poll() is None:
            p.kill()
        p.wait(timeout=TIMEOUT_S)
        if p.stdout is not None:
            p.stdout.close()


def test_holders_of_an_earlier_boot_are_dropped_and_said_so(book: HostLedger,
                                                            capsys: Any) -> None:
    if not current_process().boot_id:
        pytest.skip("no boot id here")
    _inject(book, geometry="before-reboot")
    doc = _doc(book.path)
    doc["boot_id"] = "another-boot"
    book.path.write_text(json.dumps(doc) + "\n")
    assert cli_main(["budget", "--ledger", str(book.path)]) == 0
    text = capsys.readouterr().out
    assert "dropped 1 holder(s) recorded in an earlier boot of this host" in text
    assert _doc(book.path)["boot_id"] == current_process().boot_id  # rewritten once
    book.path.write_text(json.dumps(doc) + "\n")
    assert book.holders() == [] and [h.geometry for h in book.earlier_boot] == [
        "before-reboot"]
    book.path.write_text(json.dumps(doc) + "\n")
    assert cli_main(["budget", "--ledger", str(book.path), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["earlier_boot"] == 1


@pytest.mark.parametrize("version", [0, -1])
def test_a_version_below_1_is_refused_naming_field_value_and_rule(book: HostLedger,
                                                                  version: int) -> None:
    data = ('{"format":"kvgrant-host-ledger","version":%d,"host":"h","boot_id":"",'
            '"holders":[]}\n' % version).encode()
    book.path.write_bytes(data)
    with pytest.raises(LedgerError, match=f"version = {version}: must be an integer >= 1"):
        _take(book, 1)
    assert book.path.read_bytes() == data


def test_a_device_or_fifo_is_not_a_regular_file(tmp_path: Path, capsys: Any) -> None:
    assert cli_main(["budget", "--ledger", "/dev/zero"]) == 1
    err = capsys.readouterr().err
    assert "/dev/zero is not a regular file (a character device)" in err
    assert "repair it with" not in err  # --repair cannot help
    assert cli_main(["budget", "--ledger", "/dev/zero", "--repair"]) == 1
    assert "is not a regular file" in capsys.readouterr().err
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    with pytest.raises(LedgerError, match="is not a regular file \\(a FIFO\\)"):
        HostLedger(fifo).holders()


def test_a_symbolic_link_is_refused_for_safety_and_named_as_such(tmp_path: Path,
                                                                 capsys: Any) -> None:
    victim = tmp_path / "victim"
    victim.write_bytes(b"precious")
    link = tmp_path / "ledger.json"
    link.symlink_to(victim)
    assert cli_main(["budget", "--ledger", str(link), "--repair"]) == 1
    err = capsys.readouterr().err
    assert "is a symbolic link (to " in err and "refused for safety" in err
    assert "fix its mode" not in err
    assert victim.read_bytes() == b"precious"
