"""Host-wide coordination without a server: process identity and a timed file lock.

Why: the driver-handle pool is one per host, so kvgrant processes (and simulated
drivers standing in for them) keep their shares in files that every process on the
host opens. Three things make that safe:

* a process is identified by pid *and* start time (``/proc/<pid>/stat`` field 22), so
  an entry whose pid was reused by another process is seen as dead (and so is a
  zombie: it holds no driver handles), and by its pid namespace (``pid:[N]``, the
  inode of ``/proc/self/ns/pid``), so an entry written from another namespace (a
  process started under ``unshare --pid``, a container sharing ``/dev/shm``) is never
  judged by a pid that means something else here: :func:`judge` looks for it in
  ``/proc`` by namespace and by the innermost pid of ``NSpid`` (``/proc/<pid>/status``),
  and says "cannot tell" when this process cannot see that namespace;
* the lock is ``flock`` (one lock per open file, unlike ``lockf``/POSIX locks, which
  belong to the process and are dropped by closing *any* descriptor of the file), taken
  with a timeout; when it times out, ``/proc/locks`` names the process holding it;
* a file is rewritten with :func:`write_fully`, which loops on short writes and raises
  :class:`ShortWrite` (bytes written, bytes expected, cause) instead of leaving a
  partly written record.
"""

from __future__ import annotations

import errno
import fcntl
import math
import os
import stat
import time
from dataclasses import dataclass

__all__ = ["INIT_PIDNS", "PID_MAX_LIMIT", "ProcessId", "ShortWrite", "Verdict", "clock_text",
           "current_process", "file_kind", "judge", "lock_holder_pid", "locked",
           "process_state", "write_fully"]

_BOOT_ID = "/proc/sys/kernel/random/boot_id"
#: The host's (initial) pid namespace: its inode is fixed by the kernel
#: (``PROC_PID_INIT_INO`` = 0xEFFFFFFC), so ``/proc`` of that namespace lists every
#: process of the host.
INIT_PIDNS = "pid:[4026531836]"


@dataclass(frozen=True)
class ProcessId:
    """Who holds a share: pid, start time in clock ticks since boot (0 when unknown),
    pid namespace (``pid:[N]``, "" when unknown) and boot id ("" when unknown)."""

    pid: int
    start: int
    pidns: str
    boot_id: str


def _stat(where: str) -> tuple[str, int] | None:
    """(state, start time) from ``/proc/<where>/stat`` (fields 3 and 22), or None when it
    cannot be read."""
    try:
        with open(f"/proc/{where}/stat", "rb") as f:
            raw = f.read()
    except OSError:
        return None
    # the command name (field 2) may hold spaces and parentheses: split after the last ')'
    rest = raw[raw.rfind(b")") + 2:].split()
    try:
        return rest[0].decode(errors="replace"), int(rest[19])
    except (IndexError, ValueError):
        return None


def _start_time(pid: int) -> int | None:
    """Field 22 of /proc/<pid>/stat, or None when it cannot be read."""
    st = _stat(str(pid))
    return None if st is None else st[1]


def _read(path: str) -> str:
    try:
        with open(path) as f:
            return f.read().strip()
    except OSError:
        return ""


def _readlink(path: str) -> str | None:
    try:
        return os.readlink(path)
    except OSError:
        return None


def current_process() -> ProcessId:
    """This process's identity (read fresh: a forked child is another process).

    The start time is read from ``/proc/self``: under ``unshare --pid`` without a
    ``/proc`` of the new namespace, ``/proc/<getpid()>`` is another process."""
    st = _stat("self")
    return ProcessId(os.getpid(), st[1] if st else 0, _readlink("/proc/self/ns/pid") or "",
                     _read(_BOOT_ID))


@dataclass(frozen=True)
class Verdict:
    """What :func:`judge` found: ``state`` is ``"alive"``, ``"dead"`` or ``"unknown"``;
    ``why`` says how, for a holder outside this pid namespace or a dead one ("" for a
    live process of this namespace)."""

    state: str
    why: str = ""


@dataclass(frozen=True)
class _Proc:
    hpid: int                    # the pid as this /proc names it
    ns: str | None               # its pid namespace; None: not readable (another user)


class _Scan:
    """``/proc`` as one :class:`judge` call group sees it: the namespace it shows, then
    (on first need) its processes and their namespaces, and (per process, on need) its
    ``NSpid``. Why lazy: the scan runs under the ledger's lock, and a host may run
    thousands of processes; only the candidates' status files are read."""

    def __init__(self) -> None:
        me = current_process()
        self.my_ns = me.pidns
        # /proc is this namespace's when /proc/self names our pid
        proc_is_mine = _readlink("/proc/self") == str(os.getpid())
        one = _readlink("/proc/1/ns/pid")
        #: the pid namespace /proc shows (None: unknown)
        self.proc_ns: str | None = self.my_ns if proc_is_mine and self.my_ns else one
        #: /proc lists every process of the host (it is the initial namespace's, and not
        #: mounted with hidepid=2, which hides /proc/1 from other users)
        self.complete = self.proc_ns == INIT_PIDNS and os.path.isdir("/proc/1")
        self._procs: list[_Proc] | None = None
        self._nspid: dict[int, tuple[int, ...] | None] = {}

    @property
    def procs(self) -> list[_Proc]:
        """Every process /proc lists, with its pid namespace (read once)."""
        if self._procs is None:
            self._procs = []
            try:
                names = os.listdir("/proc")
            except OSError:
                names = []
                self.complete = False
            for name in names:
                if not name.isdigit():
                    continue
                try:
                    ns: str | None = os.readlink(f"/proc/{name}/ns/pid")
                except FileNotFoundError:
                    continue  # exited meanwhile
                except OSError as e:
                    if e.errno == errno.ENOENT:
                        continue
                    ns = None
                self._procs.append(_Proc(int(name), ns))
        return self._procs

    def nspid(self, p: _Proc) -> tuple[int, ...] | None:
        """Its pid in each namespace (``NSpid``), innermost last; ``()`` when not
        readable, None when it has exited."""
        if p.ns is not None and p.ns == self.proc_ns:
            return (p.hpid,)  # in the namespace /proc shows: its pid is its /proc name
        if p.hpid not in self._nspid:
            got: tuple[int, ...] | None = ()
            try:
                with open(f"/proc/{p.hpid}/status") as f:
                    for line in f:
                        if line.startswith("NSpid:"):
                            got = tuple(int(x) for x in line.split()[1:])
                            break
            except FileNotFoundError:
                got = None
            except (OSError, ValueError):
                pass
            self._nspid[p.hpid] = got
        return self._nspid[p.hpid]


def _start_comparable(hpid: int) -> bool:
    """Whether /proc/<hpid>/stat's start time is on our clock (the same time namespace,
    or one we cannot read: time namespaces are rare)."""
    theirs, mine = _readlink(f"/proc/{hpid}/ns/time"), _readlink("/proc/self/ns/time")
    return theirs is None or mine is None or theirs == mine


#: The largest pid Linux can hand out (PID_MAX_LIMIT, the ceiling of kernel.pid_max).
PID_MAX_LIMIT = 1 << 22


def clock_text(since: object, fmt: str, *, utc: bool = False) -> str | None:
    """``since`` (seconds since the epoch, as a record says) in ``fmt``; None when it is
    no time a clock can show (NaN, infinite, out of range, not a number). Why: a record
    in a shared file may be damaged, and showing it must not crash the command that
    shows or repairs it."""
    if type(since) not in (int, float) or not math.isfinite(since):  # type: ignore[arg-type]
        return None
    try:
        return time.strftime(fmt, (time.gmtime if utc else time.localtime)(since))  # type: ignore[arg-type]
    except (OverflowError, OSError, ValueError):
        return None


class judge:
    """``judge()(pid, start, pidns, boot_id) -> Verdict``: is that process alive?

    One instance scans ``/proc`` at most once, however many holders it judges (a
    ledger operation judges them all with one).

    * another boot, no such pid, a zombie, or a pid now held by a process that started
      at another time (pid reuse): dead. A pid we may not signal (another user) is alive
      unless its start time, when readable, differs.
    * ``pidns`` is another pid namespace (written under ``unshare --pid`` or in a
      container sharing the file): found in ``/proc`` by that namespace and the pid's
      innermost ``NSpid``, then judged as above; dead when that namespace holds no such
      process (or, when this ``/proc`` lists the whole host, when no process is in that
      namespace any more: it is gone); ``"unknown"`` ("cannot tell") when this process
      cannot see that namespace (we are in a container) or may not read the namespace of
      a process that could be it.
    * an empty ``pidns`` (an entry of an older kvgrant) is judged as this namespace's.
    """

    def __init__(self) -> None:
        self._me = current_process()
        self._scan: _Scan | None = None

    def scan(self) -> _Scan:
        if self._scan is None:
            self._scan = _Scan()
        return self._scan

    def __call__(self, pid: int, start: int, pidns: str, boot_id: str) -> Verdict:
        me = self._me
        if boot_id and me.boot_id and boot_id != me.boot_id:
            return Verdict("dead", "recorded in an earlier boot")
        if pid <= 0:
            return Verdict("dead", f"pid {pid} is not a process")
        if not pidns or not me.pidns or pidns == me.pidns:
            if _readlink("/proc/self") == str(os.getpid()) or not os.path.isdir("/proc"):
                return self._own(pid, start)
        return self._other(pid, start, pidns or me.pidns)

    def _own(self, pid: int, start: int) -> Verdict:
        if pid > PID_MAX_LIMIT:  # (os.kill raised OverflowError past a C int)
            return Verdict("dead", f"pid {pid} is not a process (Linux pids are "
                                   f"1..{PID_MAX_LIMIT})")
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return Verdict("dead", "no such process")
        except PermissionError:
            pass
        st = _stat(str(pid))
        if st is not None and st[0] in ("Z", "X"):
            return Verdict("dead", "a zombie (it has exited)")
        if start and st is not None and st[1] != start:
            return Verdict("dead", "its pid now belongs to another process")
        return Verdict("alive")

    def _other(self, pid: int, start: int, pidns: str) -> Verdict:
        # ("this": our own namespace, looked up here because /proc is not ours)
        where = ("other" if pidns != self._me.pidns else "this") + f" pid namespace {pidns}"
        s = self.scan()
        if pidns == s.proc_ns:
            # /proc is that namespace's (we are in a child of it without our own /proc):
            # its pid N is /proc/N
            return self._found(pid, start, where, pid, f"no process {pid} in it any more")
        members = [(p, ids) for p in s.procs if p.ns == pidns
                   for ids in [s.nspid(p)] if ids is not None]
        match = [p for p, ids in members if ids and ids[-1] == pid]
        if match:
            return self._found(match[0].hpid, start, where, pid, "")
        if any(not ids for _, ids in members):
            return Verdict("unknown", f"{where}, cannot tell: the pids of its "
                                      "processes there (NSpid) are not readable")
        # a process whose namespace this user may not read could be it
        maybe = [p for p in s.procs if p.ns is None
                 for ids in [s.nspid(p)] if ids is not None and (
                     not ids or (ids[-1] == pid and (len(ids) > 1 or s.proc_ns is None)))]
        if maybe:
            return Verdict("unknown", f"{where}, cannot tell: {len(maybe)} process(es) "
                                      "that could be it do not let this user read their "
                                      "namespace")
        if members:
            return Verdict("dead", f"{where}: it has no process {pid} any more")
        if s.complete:
            return Verdict("dead", f"{where}: no process on this host is in that "
                                   "namespace any more (it is gone)")
        return Verdict("unknown", f"{where}, cannot tell: that namespace is not "
                                  f"visible from this process's ({self._me.pidns or '?'}; "
                                  "a container?)")

    @staticmethod
    def _found(hpid: int, start: int, where: str, pid: int, gone: str) -> Verdict:
        """Judge the process that is pid ``pid`` of that namespace and ``hpid`` here."""
        st = _stat(str(hpid))
        if st is None:
            return Verdict("dead", f"{where}: " + (gone or f"its process {pid} has "
                                                                 "exited"))
        if st[0] in ("Z", "X"):
            return Verdict("dead", f"{where}: a zombie (pid {hpid} here)")
        if start and st[1] != start and _start_comparable(hpid):
            return Verdict("dead", f"{where}: its pid {pid} now belongs to another "
                                   "process")
        return Verdict("alive", f"{where}, alive (pid {hpid} here)")


def process_state(pid: int, start: int, pidns: str, boot_id: str) -> str:
    """``"alive"``, ``"dead"`` or ``"unknown"`` (cannot tell): :class:`judge`'s state."""
    return judge()(pid, start, pidns, boot_id).state


class ShortWrite(OSError):
    """:func:`write_fully` stopped: ``written`` of ``expected`` bytes went to the file;
    ``cause`` is the OSError (None: a write returned 0 bytes)."""

    def __init__(self, written: int, expected: int, offset: int,
                 cause: OSError | None) -> None:
        self.written, self.expected, self.offset, self.cause = written, expected, offset, cause
        super().__init__(cause.errno if cause is not None else errno.ENOSPC, self.describe())

    def describe(self) -> str:
        """``wrote 10 of 212 bytes at offset 0: [Errno 28] No space left on device (ENOSPC)``."""
        if self.cause is None:
            why = "a write returned 0 bytes (a full disk?)"
        else:
            code = errno.errorcode.get(self.cause.errno or 0, "")
            why = str(self.cause) + (f" ({code})" if code else "")
        return (f"wrote {self.written:,} of {self.expected:,} bytes at offset "
                f"{self.offset:,}: {why}")


def file_kind(mode: int) -> str:
    """What a file that is not a regular file is, in words ("a FIFO", "a character
    device", ...): the ledger and the plan cache refuse such paths by name."""
    for test, word in ((stat.S_ISFIFO, "a FIFO"), (stat.S_ISSOCK, "a socket"),
                       (stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device"),
                       (stat.S_ISDIR, "a folder"), (stat.S_ISLNK, "a symbolic link")):
        if test(mode):
            return word
    return f"not a regular file (mode {stat.filemode(mode)})"


def write_fully(fd: int, data: bytes, offset: int) -> None:
    """``pwrite`` all of ``data`` at ``offset``, looping on short writes.

    Raises
    ------
    ShortWrite
        A write failed (ENOSPC, EIO, ...) or wrote nothing; ``written`` bytes of
        ``data`` are in the file.
    """
    view = memoryview(data)
    done = 0
    while done < len(data):
        try:
            n = os.pwrite(fd, view[done:], offset + done)
        except OSError as e:
            raise ShortWrite(done, len(data), offset, e) from None
        if n <= 0:
            raise ShortWrite(done, len(data), offset, None)
        done += n


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
