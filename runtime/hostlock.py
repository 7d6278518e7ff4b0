"""Host-wide coordination without a server: process identity and a timed file lock.

Why: the driver-handle pool is one per host, so kvgrant processes (and simulated
drivers standing in for them) keep their shares in files that every process on the
host opens. Two things make that safe:

* a process is identified by pid *and* start time (``/proc/<pid>/stat`` field 22), so
  an entry whose pid was reused by another process is seen as dead, and by its pid
  namespace, so an entry written from another namespace is never judged by a pid that
  means something else here;
* the lock is ``flock`` (one lock per open file, unlike ``lockf``/POSIX locks, which
  belong to the process and are dropped by closing *any* descriptor of the file), taken
  with a timeout; when it times out, ``/proc/locks`` names the process holding it.
"""

from __future__ import annotations

import fcntl
import os
import time
from dataclasses import dataclass

__all__ = ["ProcessId", "current_process", "lock_holder_pid", "locked", "process_state"]

_BOOT_ID = "/proc/sys/kernel/random/boot_id"


@dataclass(frozen=True)
class ProcessId:
    """Who holds a share: pid, start time in clock ticks since boot (0 when unknown),
    pid namespace (``pid:[N]``, "" when unknown) and boot id ("" when unknown)."""

    pid: int
    start: int
    pidns: str
    boot_id: str


def _start_time(pid: int) -> int | None:
    """Field 22 of /proc/<pid>/stat, or None when it cannot be read."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            raw = f.read()
    except OSError:
        return None
    # the command name (field 2) may hold spaces and parentheses: split after the last ')'
    rest = raw[raw.rfind(b")") + 2:].split()
    try:
        return int(rest[19])
    except (IndexError, ValueError):
        return None


def _read(path: str) -> str:
    try:
        with open(path) as f:
            return f.read().strip()
    except OSError:
        return ""


def current_process() -> ProcessId:
    """This process's identity (read fresh: a forked child is another process)."""
    pid = os.getpid()
    try:
        ns = os.readlink("/proc/self/ns/pid")
    except OSError:
        ns = ""
    return ProcessId(pid, _start_time(pid) or 0, ns, _read(_BOOT_ID))


def process_state(pid: int, start: int, pidns: str, boot_id: str) -> str:
    """``"alive"``, ``"dead"`` or ``"unknown"`` (another pid namespace: not judged).

    Dead means: another boot, no such pid, or the pid now belongs to a process that
    started at another time (pid reuse). A pid we may not signal (another user) is
    alive unless its start time, when readable, differs.
    """
    me = current_process()
    if boot_id and me.boot_id and boot_id != me.boot_id:
        return "dead"
    if pidns and me.pidns and pidns != me.pidns:
        return "unknown"
    if pid <= 0:
        return "dead"
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return "dead"
    except PermissionError:
        pass
    now = _start_time(pid)
    if start and now is not None and now != start:
        return "dead"
    return "alive"


def lock_holder_pid(fd: int) -> int | None:
    """The pid holding a lock on the file open at ``fd``, from /proc/locks (None when
    none is listed or /proc/locks is unreadable)."""
    st = os.fstat(fd)
    want = (os.major(st.st_dev), os.minor(st.st_dev), st.st_ino)
    try:
        with open("/proc/locks") as f:
            lines = f.read().splitlines()
    except OSError:
        return None
    for line in lines:
        parts = line.split()
        if "->" in parts:  # a waiter, not a holder
            continue
        for i, p in enumerate(parts):
            if p.count(":") == 2 and i > 0:
                try:
                    maj, mnr, ino = p.split(":")
                    key = (int(maj, 16), int(mnr, 16), int(ino))
                    pid = int(parts[i - 1])
                except ValueError:
                    break
                if key == want and pid != os.getpid():
                    return pid
                break
    return None


class locked:
    """``with locked(fd, timeout_s, exclusive=True): ...`` holds ``flock`` on ``fd``.

    Raises :class:`TimeoutError` (with ``holder_pid``) when the lock is still held by
    someone else after ``timeout_s``; callers turn that into their own error.
    """

    __slots__ = ("fd", "timeout_s", "op")

    def __init__(self, fd: int, timeout_s: float, exclusive: bool = True) -> None:
        self.fd = fd
        self.timeout_s = timeout_s
        self.op = fcntl.LOCK_EX if exclusive else fcntl.LOCK_SH

    def __enter__(self) -> "locked":
        try:
            fcntl.flock(self.fd, self.op | fcntl.LOCK_NB)
            return self
        except BlockingIOError:
            pass
        t0 = time.monotonic()
        pause = 0.0005
        while True:
            time.sleep(pause)
            try:
                fcntl.flock(self.fd, self.op | fcntl.LOCK_NB)
                return self
            except BlockingIOError:
                waited = time.monotonic() - t0
                if waited >= self.timeout_s:
                    err = TimeoutError(f"lock still held after {waited:.1f} s")
                    err.holder_pid = lock_holder_pid(self.fd)  # type: ignore[attr-defined]
                    err.waited_s = waited  # type: ignore[attr-defined]
                    raise err from None
                pause = min(pause * 2, 0.05)

    def __exit__(self, *exc: object) -> None:
        fcntl.flock(self.fd, fcntl.LOCK_UN)
