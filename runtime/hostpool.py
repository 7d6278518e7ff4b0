"""The simulated host's driver-handle pool, shared by the SimDrivers of many processes.

Why: on a real host the handle budget is one pool for every process and GPU (two
processes on two H200s failed at 265,147 + 258,740 = 523,887 grants together; one
process alone at 524,007). A :class:`~kvgrant.runtime.sim.SimDriver` given a pool
(``host_pool=PATH`` or ``KVGRANT_SIM_POOL``) draws its grants from this file instead of
from its own counter, so tests with several real processes fail in ``cuMemSetAccess``
at the same total the real driver does, and the process that dies gives its handles
back the way the real driver frees them (its slot is reaped).

The file is binary: a 32-byte header (magic ``KVGSPOOL``, version, budget) and one
32-byte slot per process (pid, start time, pid namespace inode, live grants). Every
change is one ``flock`` + one read of the (small) file + one ``pwrite`` of the slot;
dead slots are reaped only when a grant would not fit, so the common path touches no
``/proc`` file. A write that stops short (a full disk) never leaves a partial slot: the
old slot is put back (or an appended one cut off) and
:class:`~kvgrant.errors.LedgerError` names the file, the bytes written and the cause.
"""

from __future__ import annotations

import os
import re
import stat
import struct
import tempfile
from pathlib import Path

from kvgrant.errors import LedgerError, LedgerLockTimeout
from kvgrant.runtime.hostlock import (ShortWrite, current_process, file_kind, judge, locked,
                                      write_fully)

__all__ = ["HostPool", "POOL_ENV"]

POOL_ENV = "KVGRANT_SIM_POOL"
_MAGIC = b"KVGSPOOL"
_VERSION = 1
_HEADER = struct.Struct("<8sIIq8x")      # magic, version, pad, budget, pad: 32 bytes
_SLOT = struct.Struct("<qqqq")           # pid, start, pidns inode, grants: 32 bytes


def _ns_ino(pidns: str) -> int:
    m = re.search(r"\[(\d+)\]", pidns)
    return int(m.group(1)) if m else 0


class HostPool:
    """One simulated host's handle pool (see the module docstring).

    Parameters
    ----------
    path
        The pool file; created on first use with ``budget``.
    budget
        (mapping, device) grants the host holds at most. A pool file made with another
        budget is refused (:class:`~kvgrant.errors.LedgerError` naming both).
    lock_timeout_s
        Wait for the lock at most this long (then
        :class:`~kvgrant.errors.LedgerLockTimeout`).
    """

    def __init__(self, path: "str | os.PathLike[str]", budget: int, *,
                 lock_timeout_s: float = 10.0) -> None:
        if isinstance(budget, bool) or not isinstance(budget, int) or budget < 0:
            raise ValueError(f"budget = {budget!r}: must be an integer >= 0")
        self.path = Path(path)
        self.budget = budget
        self.lock_timeout_s = lock_timeout_s
        self._pid = -1
        self._fd = -1
        self._slot = -1          # byte offset of this process's slot, once it has one
        self._open()

    # ------------------------------------------------------------------ plumbing
    def _open(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)
        self._pid = os.getpid()
        self._slot = -1
        me = current_process()
        self._me = (me.pid, me.start, _ns_ino(me.pidns))
        for _ in range(2):
            try:
                self._fd = os.open(self.path, os.O_RDWR | os.O_CLOEXEC)
                break
            except FileNotFoundError:
                self._create()
            except OSError as e:
                raise LedgerError(f"sim host pool {self.path}: cannot open it: {e}",
                                  path=str(self.path)) from None
        mode = os.fstat(self._fd).st_mode
        if not stat.S_ISREG(mode):  # (a FIFO made pread raise ESPIPE, a traceback)
            os.close(self._fd)
            self._fd = -1
            raise LedgerError(f"sim host pool {self.path} is not a regular file "
                              f"({file_kind(mode)}): give the path of a pool file (made "
                              "when missing)", path=str(self.path))
        head = os.pread(self._fd, _HEADER.size, 0)
        if len(head) < _HEADER.size:
            raise LedgerError(f"sim host pool {self.path}: truncated header "
                              f"({len(head)} bytes); remove the file when no simulated "
                              "process uses it", path=str(self.path))
        magic, version, _, budget = _HEADER.unpack(head)
        if magic != _MAGIC:
            raise LedgerError(f"sim host pool {self.path}: not a pool file (magic {magic!r}); "
                              "remove it when no simulated process uses it",
                              path=str(self.path))
        if version != _VERSION:
            raise LedgerError(f"sim host pool {self.path}: version {version}, this kvgrant "
                              f"reads version {_VERSION}", path=str(self.path))
        if budget != self.budget:
            raise LedgerError(f"sim host pool {self.path} was made with budget {budget:,}, "
                              f"not {self.budget:,} as asked: every process of one simulated "
                              "host must use the same budget", path=str(self.path))

    def _create(self) -> None:
        d = self.path.parent
        try:
            fd, tmp = tempfile.mkstemp(prefix=".kvgrant-pool-", dir=d)
        except OSError as e:
            raise LedgerError(f"sim host pool {self.path}: cannot create it in {d}: {e}",
                              path=str(self.path)) from None
        try:
            os.fchmod(fd, 0o666)
            try:
                write_fully(fd, _HEADER.pack(_MAGIC, _VERSION, 0, self.budget), 0)
            except ShortWrite as e:  # never link a file with a partial header
                raise LedgerError(f"sim host pool {self.path}: cannot create it: "
                                  f"{e.describe()}", path=str(self.path)) from None
            try:
                os.link(tmp, self.path)
            except FileExistsError:
                pass
            except OSError as e:
                raise LedgerError(f"sim host pool {self.path}: cannot create it: {e}",
                                  path=str(self.path)) from None
        finally:
            os.close(fd)
            os.unlink(tmp)

    def _lock(self) -> locked:
        if os.getpid() != self._pid:  # forked: this is another process with its own slot
            self._open()
        return locked(self._fd, self.lock_timeout_s)

    def _slots(self) -> list[tuple[int, int, int, int, int]]:
        """(offset, pid, start, ns, grants) of every slot, read under the lock."""
        raw = b""
        off = _HEADER.size
        while chunk := os.pread(self._fd, 1 << 16, off):
            raw += chunk
            off += len(chunk)
        n = len(raw) // _SLOT.size
        return [(_HEADER.size + i * _SLOT.size, *t)
                for i, t in enumerate(_SLOT.iter_unpack(raw[:n * _SLOT.size]))]

    def _reap(self, slots: list[tuple[int, int, int, int, int]]) -> int:
        """Zero the slots of dead processes; return the grants they held."""
        freed = 0
        alive = judge()  # one /proc scan for every slot, when one is needed at all
        for off, pid, start, ns, grants in slots:
            if pid == 0 or pid == self._pid:
                continue
            if alive(pid, start, f"pid:[{ns}]" if ns else "", "").state == "dead":
                self._put(off, _SLOT.pack(0, 0, 0, 0), _SLOT.pack(pid, start, ns, grants))
                freed += grants
        return freed

    def _put(self, off: int, data: bytes, old: bytes | None) -> None:
        """Write one slot at ``off`` (``old``: its bytes now; None: ``off`` is the end of
        the file). A short write puts ``old`` back (or cuts the file back to ``off``) and
        raises LedgerError."""
        try:
            write_fully(self._fd, data, off)
            return
        except ShortWrite as e:
            err = e
        try:
            if old is None:
                os.ftruncate(self._fd, off)
            else:
                write_fully(self._fd, old, off)
            kept = "the slot is as it was (nothing changed)"
        except OSError as e2:
            kept = (f"putting the slot back failed too ({e2}): remove the file when no "
                    "simulated process uses it")
        raise LedgerError(f"sim host pool {self.path}: cannot write the slot at offset "
                          f"{off}: {err.describe()}; {kept}", path=str(self.path))

    def _write_mine(self, slots: list[tuple[int, int, int, int, int]], grants: int) -> None:
        slot = self._slot
        if slot < 0:
            free = next((s[0] for s in slots if s[1] == 0), None)
            slot = free if free is not None else _HEADER.size + len(slots) * _SLOT.size
        # None: a new slot at the end of the file (a failed write cuts it back off)
        old = next((_SLOT.pack(*s[1:]) for s in slots if s[0] == slot), None)
        self._put(slot, _SLOT.pack(*self._me, grants), old)
        self._slot = slot  # only once written: a failed first write leaves no slot

    def _mine_now(self, slots: list[tuple[int, int, int, int, int]]) -> int:
        return next((s[4] for s in slots if s[0] == self._slot), 0) if self._slot >= 0 else 0

    def _locked(self) -> locked:
        try:
            return self._lock()
        except OSError as e:  # pragma: no cover - reopen failed
            raise LedgerError(f"sim host pool {self.path}: {e}", path=str(self.path)) from None

    def _enter(self, lk: locked) -> None:
        try:
            lk.__enter__()
        except TimeoutError as e:
            raise LedgerLockTimeout(
                f"sim host pool {self.path}: lock still held after {self.lock_timeout_s:g} s "
                f"(process {getattr(e, 'holder_pid', None)})", path=str(self.path),
                holder_pid=getattr(e, "holder_pid", None)) from None

    # ------------------------------------------------------------------ API
    def take(self, n: int) -> tuple[bool, int]:
        """Add ``n`` grants for this process if the host total stays within the budget.

        Returns ``(True, total before)`` when taken, ``(False, total)`` when the pool
        cannot hold them (nothing changes then).
        """
        lk = self._locked()
        self._enter(lk)
        try:
            slots = self._slots()
            total = sum(s[4] for s in slots)
            if total + n > self.budget:
                freed = self._reap(slots)
                if freed:
                    slots = self._slots()
                    total = sum(s[4] for s in slots)
                if total + n > self.budget:
                    return False, total
            self._write_mine(slots, self._mine_now(slots) + n)
            return True, total
        finally:
            lk.__exit__()

    def give(self, n: int) -> None:
        """Give back ``n`` grants of this process (unmap)."""
        if n <= 0:
            return
        lk = self._locked()
        self._enter(lk)
        try:
            slots = self._slots()
            self._write_mine(slots, max(0, self._mine_now(slots) - n))
        finally:
            lk.__exit__()

    def total(self) -> int:
        """Grants live on the simulated host now (dead processes reaped first)."""
        lk = self._locked()
        self._enter(lk)
        try:
            slots = self._slots()
            self._reap(slots)
            return sum(s[4] for s in self._slots())
        finally:
            lk.__exit__()

    def holders(self) -> dict[int, int]:
        """pid -> live grants, dead processes reaped first."""
        lk = self._locked()
        self._enter(lk)
        try:
            self._reap(self._slots())
            out: dict[int, int] = {}
            for s in self._slots():
                if s[1]:
                    out[s[1]] = out.get(s[1], 0) + s[4]
            return out
        finally:
            lk.__exit__()

    def close(self) -> None:
        """Free this object's slot when it holds nothing, and close the file (what it
        still holds stays counted until this process exits: :class:`SimDriver` gives
        its grants back before closing)."""
        if self._fd < 0:
            return
        try:
            if self._slot >= 0 and os.getpid() == self._pid:
                lk = self._locked()
                self._enter(lk)
                try:
                    if self._mine_now(self._slots()) == 0:
                        self._put(self._slot, _SLOT.pack(0, 0, 0, 0),
                                  _SLOT.pack(*self._me, 0))
                finally:
                    lk.__exit__()
        finally:
            os.close(self._fd)
            self._fd = -1
