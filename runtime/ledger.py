"""The host ledger: every kvgrant process on a host records its driver-handle share.

Why: the driver's handle budget (granted (mapping, device) pairs, about 524k on an H200
with driver 580) is one pool per host, not per process: two processes on two GPUs
together failed at the same total as one process alone (docs/drivers.md). A process can
only predict its failure if it knows what the others hold. So each kvgrant process
reserves its share here *before its first driver call* and releases it after shutdown
or abort; a reservation that would not fit, with what the others hold and a reserve for
users kvgrant cannot see (NCCL, PyTorch, other engines), is refused, naming the holders.

The ledger is one JSON file (default ``/dev/shm/kvgrant-ledger.json``; ``KVGRANT_LEDGER``
or ``HostLedger(path)`` override it) guarded by ``flock``; no server runs. Entries of
processes that died (zombies too), or whose pid now belongs to another process, are
reaped under the lock; so are those recorded from another pid namespace that is gone
(:class:`~kvgrant.runtime.hostlock.judge`). One recorded from a namespace this process
cannot see (a container sharing /dev/shm) is kept, marked "cannot tell"
(:attr:`HostLedger.notes`), until :meth:`HostLedger.drop` (``kvgrant budget --drop``)
removes it. A file that is not a ledger (garbage, truncated, written by a newer kvgrant,
another host's) is never guessed at: it raises :class:`~kvgrant.errors.LedgerError`
saying what is wrong and how to repair it (:meth:`HostLedger.repair`, ``kvgrant budget
--repair``); a path that is not a regular file or is a symbolic link is refused as such.
A lock held past the timeout raises :class:`~kvgrant.errors.LedgerLockTimeout` naming
the process that holds it. A write that fails (a full disk) raises LedgerError and
leaves the previous content readable (:meth:`_File.write`).

Format (version 1), one JSON line (anything after the first newline is ignored, so a
writer that died between writing and truncating leaves a readable file; an entry
without ``pidns``, from an older kvgrant, is judged as this pid namespace's)::

    {"format": "kvgrant-host-ledger", "version": 1, "host": "node7", "boot_id": "...",
     "holders": [{"id": "...", "pid": 4242, "start": 123456, "pidns": "pid:[4026531836]",
                  "host": "node7", "geometry": "published-dcp8", "label": "packed",
                  "handles": 349328, "budget": 523880, "reserve": 4096, "checked": true,
                  "devices": [0, 1], "since": 1764520000.0}]}
"""

from __future__ import annotations

import errno
import json
import math
import os
import socket
import stat
import tempfile
import time
import uuid
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any, Sequence

from kvgrant.errors import (ArgumentError, HandleBudgetError, LedgerError, LedgerLockTimeout,
                            NotALedger)
from kvgrant.runtime.arguments import is_switch_word
from kvgrant.runtime.hostlock import (ShortWrite, Verdict, current_process, file_kind, judge,
                                      locked, write_fully)
from kvgrant.strict_json import is_json_document

__all__ = [
    "DEFAULT_LEDGER_PATH",
    "Holder",
    "HostLedger",
    "LEDGER_ENV",
    "LEDGER_FORMAT",
    "LEDGER_VERSION",
    "Lease",
    "binding_limits",
    "default_ledger_path",
    "env_ledger_path",
]

LEDGER_ENV = "KVGRANT_LEDGER"
LEDGER_FORMAT = "kvgrant-host-ledger"
LEDGER_VERSION = 1
DEFAULT_LEDGER_PATH = "/dev/shm/kvgrant-ledger.json"
_DEFAULT_TIMEOUT_S = 10.0
#: Largest ledger file read (one short line per holder; ``--ledger /dev/zero`` is not).
MAX_LEDGER_BYTES = 16 << 20
_FIELDS: dict[str, type | tuple[type, ...]] = {
    "id": str, "pid": int, "start": int, "pidns": str, "host": str, "geometry": str,
    "label": str, "handles": int, "budget": int, "reserve": int, "checked": bool,
    "devices": list, "since": (int, float)}
#: fields an older kvgrant did not write, and what such an entry means by them ("" pid
#: namespace: judged as this process's namespace, as that kvgrant did)
_OPTIONAL: dict[str, object] = {"pidns": ""}



def env_ledger_path() -> Path | None:
    """The ledger file ``$KVGRANT_LEDGER`` names; None when it is unset or empty.

    Why a rule: the variable is a path (the docs say the sim backend uses a ledger "when
    ``KVGRANT_LEDGER`` is set"), and ``KVGRANT_LEDGER=1`` made a ledger file named ``1``
    in the working folder, one no other process on the host shares. A switch word is
    refused rather than guessed.

    Raises
    ------
    ArgumentError
        The value is a switch word or blank (``argument`` is ``KVGRANT_LEDGER``).
    """
    raw = os.environ.get(LEDGER_ENV)
    if not raw:
        return None
    if is_switch_word(raw):
        raise ArgumentError(
            f"{LEDGER_ENV} = {raw!r}: must be the path of the host's ledger file (such as "
            f"{DEFAULT_LEDGER_PATH}), not a switch; unset it for the default (that file "
            "for the cuda backend, no ledger for sim)",
            argument=LEDGER_ENV, value=raw)
    return Path(raw)


def default_ledger_path() -> Path:
    """``$KVGRANT_LEDGER`` (see :func:`env_ledger_path`), else
    ``/dev/shm/kvgrant-ledger.json`` (the temp dir where there is no /dev/shm)."""
    env = env_ledger_path()
    if env is not None:
        return env
    if os.path.isdir("/dev/shm"):
        return Path(DEFAULT_LEDGER_PATH)
    return Path(tempfile.gettempdir()) / "kvgrant-ledger.json"


@dataclass(frozen=True)
class Holder:
    """One reservation in the ledger (one kvgrant allocation, or one rank's share)."""

    id: str
    pid: int
    start: int
    pidns: str
    host: str
    geometry: str
    label: str
    handles: int
    budget: int
    reserve: int
    checked: bool              # False: recorded with pre-flight off (no refusal)
    devices: tuple[int, ...] = field(default=())
    since: float = 0.0

    def as_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["devices"] = list(self.devices)
        return d

    def describe(self) -> str:
        """``pid 4242 'published-dcp8' (packed, devices [0, 1]) 349,328 handles``."""
        devs = f", devices {list(self.devices)}" if self.devices else ""
        unchecked = ", pre-flight off" if not self.checked else ""
        return (f"pid {self.pid} {self.geometry!r} ({self.label}{devs}{unchecked}) "
                f"{self.handles:,} handles")


def _holder(obj: object, i: int) -> Holder:
    if not isinstance(obj, dict):
        raise ValueError(f"holders[{i}] is not an object")
    obj = {**_OPTIONAL, **obj}
    for name, typ in _FIELDS.items():
        v = obj.get(name)
        if not isinstance(v, typ) or (typ is int and isinstance(v, bool)):
            raise ValueError(f"holders[{i}].{name} = {v!r}: missing or not "
                             f"{getattr(typ, '__name__', typ)}")
    if obj["handles"] < 0 or not all(isinstance(d, int) for d in obj["devices"]):
        raise ValueError(f"holders[{i}]: handles < 0 or devices not integers")
    if not math.isfinite(obj["since"]):  # (json reads NaN; budget --json wrote it back)
        raise ValueError(f"holders[{i}].since = {obj['since']!r}: not a finite time")
    return Holder(**{k: obj[k] for k in _FIELDS if k != "devices"},
                  devices=tuple(obj["devices"]))


class _File:
    """The open ledger file, its lock held, parsed and writable (one operation)."""

    def __init__(self, ledger: "HostLedger", fd: int) -> None:
        self.ledger = ledger
        self.fd = fd
        #: holders of an earlier boot of this host that read() dropped
        self.earlier_boot: list[Holder] = []

    def read(self) -> tuple[dict[str, Any], list[Holder]]:
        """Parse and check the file; raise LedgerError on anything not a v1 ledger."""
        path = self.ledger.path
        name = self.ledger.name
        raw = self.raw()
        fix = (f"kvgrant will not guess who holds driver handles on this host. If no "
               f"kvgrant process is running here, repair it with `kvgrant budget --repair "
               f"--ledger {path}` (the old content is kept next to it)")
        if not raw.strip():
            raise LedgerError(f"{name} is empty (truncated?): {fix}", path=str(path))
        if len(raw) > MAX_LEDGER_BYTES:
            raise LedgerError(f"{name} is not a kvgrant ledger (larger than "
                              f"{MAX_LEDGER_BYTES:,} bytes): {fix}", path=str(path))
        line = raw.split(b"\n", 1)[0]
        try:
            doc = json.loads(line)
        except (UnicodeDecodeError, ValueError) as e:
            if is_json_document(raw):
                raise self._foreign() from None
            raise LedgerError(f"{name} is not a kvgrant ledger (garbage or truncated: "
                              f"{str(e)[:120]}): {fix}", path=str(path)) from None
        except RecursionError:
            raise LedgerError(f"{name} is not a kvgrant ledger (JSON nested too "
                              f"deeply): {fix}", path=str(path)) from None
        if not isinstance(doc, dict) or doc.get("format") != LEDGER_FORMAT:
            raise self._foreign()
        version = doc.get("version")
        if not isinstance(version, int) or isinstance(version, bool):
            raise LedgerError(f"{name}: version = {version!r} is not an integer: "
                              f"{fix}", path=str(path))
        if version < 1:
            raise LedgerError(f"{name}: version = {version}: must be an integer >= 1 (ledger "
                              f"versions start at 1; this kvgrant writes version "
                              f"{LEDGER_VERSION}): {fix}", path=str(path))
        if version > LEDGER_VERSION:
            raise LedgerError(
                f"{name} was written by a newer kvgrant (ledger version {version}; "
                f"this kvgrant reads version {LEDGER_VERSION}): use the same kvgrant version "
                f"on the whole host, or give this one its own ledger with {LEDGER_ENV}= "
                f"(then neither sees the other's handles)", path=str(path))
        holders_raw = doc.get("holders")
        if not isinstance(holders_raw, list):
            raise LedgerError(f"{name}: \"holders\" is not a list: {fix}",
                              path=str(path))
        try:
            holders = [_holder(h, i) for i, h in enumerate(holders_raw)]
        except ValueError as e:
            raise LedgerError(f"{name}: {e}: {fix}", path=str(path)) from None
        me = current_process()
        host, boot = doc.get("host"), doc.get("boot_id")
        if boot and me.boot_id and boot != me.boot_id:
            if host != socket.gethostname():
                raise LedgerError(
                    f"{name} belongs to host {host!r} (boot {boot}), not this host "
                    f"{socket.gethostname()!r}: the handle budget is per host; give each host "
                    f"its own ledger (a path not shared between hosts)", path=str(path))
            # same host, another boot: every holder is gone (the operation that rewrites
            # the file lists them in HostLedger.reaped and .earlier_boot)
            self.earlier_boot = holders
            holders = []
        return doc, holders

    def _foreign(self) -> NotALedger:
        """Another program's JSON file where the ledger should be (a geometry, a trace,
        a config): named as such, and not offered to ``--repair``."""
        where = (f"point {LEDGER_ENV} at" if self.ledger.source else "give --ledger")
        return NotALedger(
            f"{self.ledger.name} is not a kvgrant ledger: it is a JSON document without "
            f"\"format\": {LEDGER_FORMAT!r} (another program's file: a geometry, a trace?), "
            f"so kvgrant neither uses it nor repairs it over; {where} the ledger's own "
            f"path (a file kvgrant creates), or move this file away yourself",
            path=str(self.ledger.path))

    def raw(self) -> bytes:
        """The file's bytes, at most MAX_LEDGER_BYTES + 1 of them (a character device
        such as /dev/zero never ends)."""
        chunks = []
        off = 0
        while off <= MAX_LEDGER_BYTES:
            b = os.pread(self.fd, min(1 << 16, MAX_LEDGER_BYTES + 1 - off), off)
            if not b:
                break
            chunks.append(b)
            off += len(b)
        return b"".join(chunks)

    def write(self, holders: Sequence[Holder]) -> None:
        """Replace the ledger by ``holders``; on failure the previous content stays.

        The file is rewritten in place (the lock is on this open file, and every user of
        the host must be able to rewrite it, so a temp file renamed over it is not an
        option: in a sticky folder such as /dev/shm only the file's owner may replace
        it). So that a full disk cannot leave a half-written first line:

        1. the new content is first written *after* the old one (behind a newline, so
           readers, who read the first line only, still see the old ledger); this
           allocates the room the new content needs. On failure the file is cut back to
           its old length: nothing changed.
        2. the new content is written at offset 0, into room now allocated. Should that
           fail anyway, the old bytes are put back.
        3. only then is the file cut to the new length.

        Writes loop on short counts (:func:`~kvgrant.runtime.hostlock.write_fully`).

        Raises
        ------
        LedgerError
            Naming the file, the bytes written of those expected and the cause (ENOSPC,
            a write of 0 bytes, ...), and whether the old content was kept.
        """
        me = current_process()
        doc = {"format": LEDGER_FORMAT, "version": LEDGER_VERSION,
               "host": socket.gethostname(), "boot_id": me.boot_id,
               "holders": [h.as_dict() for h in holders]}
        data = (json.dumps(doc, separators=(",", ":")) + "\n").encode()
        fd = self.fd
        try:
            old_len = os.fstat(fd).st_size
            old = self._head(min(old_len, len(data)))
        except OSError as e:
            raise self._error(f"cannot read it before writing: {e}") from None
        if old_len == 0:  # a new file: nothing to keep
            try:
                write_fully(fd, data, 0)
            except ShortWrite as e:
                kept = self._cut(0, "it is left empty, as it was")
                raise self._error(f"cannot write it: {e.describe()}; {kept}") from None
        else:
            try:
                write_fully(fd, b"\n" + data, old_len)  # 1: make room behind the old content
            except ShortWrite as e:
                kept = self._cut(old_len, "its previous content is kept (nothing changed)")
                raise self._error(f"cannot write it: {e.describe()} (after its "
                                  f"{old_len:,} bytes); {kept}") from None
            try:
                write_fully(fd, data, 0)  # 2: in place, into allocated room
            except ShortWrite as e:
                try:
                    write_fully(fd, old, 0)
                    os.ftruncate(fd, old_len)
                    kept = "its previous content was put back (nothing changed)"
                except OSError as e2:
                    kept = (f"its previous content could not be put back ({e2}): it may be "
                            f"damaged; `kvgrant budget --repair --ledger {self.ledger.path}` "
                            "makes it usable when no kvgrant process runs")
                raise self._error(f"cannot write it: {e.describe()}; {kept}") from None
        try:
            os.ftruncate(fd, len(data))  # 3
        except OSError:
            pass  # the new first line is in place; what follows it is ignored

    def _head(self, n: int) -> bytes:
        chunks, off = [], 0
        while off < n:
            b = os.pread(self.fd, n - off, off)
            if not b:
                break
            chunks.append(b)
            off += len(b)
        return b"".join(chunks)

    def _cut(self, length: int, kept: str) -> str:
        try:
            os.ftruncate(self.fd, length)
        except OSError as e:
            return (f"cutting it back to its previous {length:,} bytes failed too ({e}); "
                    "its first line is still the previous content")
        return kept

    def _error(self, what: str) -> LedgerError:
        return LedgerError(f"{self.ledger.name}: {what}", path=str(self.ledger.path))


def _reap(holders: list[Holder]) -> tuple[list[Holder], list[Holder], dict[str, Verdict]]:
    """(live or cannot-tell holders, dead ones, each holder's verdict by id)."""
    keep, dead, verdicts = [], [], {}
    j = judge()
    for h in holders:
        v = verdicts[h.id] = j(h.pid, h.start, h.pidns, "")
        (dead if v.state == "dead" else keep).append(h)
    return keep, dead, verdicts


def _check_count(name: str, value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ValueError(f"{name} = {value!r}: must be an integer >= 0")
    return value


def binding_limits(budget: int, reserve: int, holders: Sequence[Holder]
                   ) -> tuple[int, int, str]:
    """The budget and reserve a new share is checked against: of the caller's pair and
    every checked holder's, the one that leaves kvgrant the fewest handles (least
    ``budget - reserve``), and a clause naming that holder ("" when the caller's own
    pair binds).

    Why: each holder was admitted by the check ``held + handles + reserve <= budget``
    with its own figures, and that stays true for it only while every later share
    passes its check too; so a process started with a larger budget (or a smaller
    reserve) must not push the host past what an earlier holder was admitted with.
    Holders recorded with the pre-flight off promised nothing and do not bind."""
    tightest = min((o for o in holders if o.checked),
                   key=lambda o: o.budget - o.reserve, default=None)
    if tightest is None or tightest.budget - tightest.reserve >= budget - reserve:
        return budget, reserve, ""
    return (tightest.budget, tightest.reserve,
            f" (the budget and reserve pid {tightest.pid} was admitted with: each "
            "holder's own check must stay true)")


class HostLedger:
    """The ledger file of one host (see the module docstring).

    Parameters
    ----------
    path
        The ledger file (default :func:`default_ledger_path`). It is created on first
        use, readable and writable by every user (mode 0666): the pool is the host's.
    lock_timeout_s
        How long an operation waits for the lock before
        :class:`~kvgrant.errors.LedgerLockTimeout` (an operation takes well under a
        second: a read, a write, and a ``/proc`` scan when a holder is of another pid
        namespace; a lock held for seconds belongs to a stuck process).
    """

    def __init__(self, path: "str | os.PathLike[str] | None" = None, *,
                 lock_timeout_s: float = _DEFAULT_TIMEOUT_S) -> None:
        if path is not None and (isinstance(path, bytes) or not isinstance(
                path, (str, os.PathLike)) or not os.fspath(path)):
            raise ArgumentError(f"HostLedger: path = {path!r}: must be None (the default "
                                "ledger) or a file path", argument="path", value=path)
        self.path = Path(path) if path is not None else default_ledger_path()
        #: what named the path: ``KVGRANT_LEDGER`` when it came from the environment
        #: (its errors then name the variable, not ``--ledger``), else None
        self.source: str | None = LEDGER_ENV if path is None and env_ledger_path() else None
        if not (isinstance(lock_timeout_s, (int, float)) and lock_timeout_s > 0):
            raise ValueError(f"lock_timeout_s = {lock_timeout_s!r}: must be a number > 0")
        self.lock_timeout_s = float(lock_timeout_s)
        #: holders the last operation found dead and removed (those of an earlier boot
        #: of this host too)
        self.reaped: list[Holder] = []
        #: of :attr:`reaped`, those recorded in an earlier boot of this host (dropped
        #: whatever their pid: every process of that boot is gone)
        self.earlier_boot: list[Holder] = []
        #: holder id -> what the last operation's liveness check said, for each holder
        #: that is not a live process of this pid namespace: "other pid namespace
        #: pid:[N], alive (...)", "..., cannot tell: ..." (kept; ``kvgrant budget --drop``
        #: removes it), or why a reaped one is dead
        self.notes: dict[str, str] = {}
        #: holder id -> the last operation's :class:`~kvgrant.runtime.hostlock.Verdict`
        #: (``state`` "alive", "dead" or "unknown": cannot tell)
        self.verdicts: dict[str, Verdict] = {}

    def __repr__(self) -> str:
        return f"HostLedger({str(self.path)!r})"

    @property
    def name(self) -> str:
        """The ledger as error messages name it: ``ledger PATH``, and the variable that
        named the path when it came from the environment."""
        return f"ledger {self.path}" + (f" (named by {self.source})" if self.source else "")

    @property
    def _named(self) -> str:
        """``KVGRANT_LEDGER = 'PATH'`` when the variable named the path (an error about
        the path is then about the variable's value), else ``ledger PATH``."""
        return f"{self.source} = {str(self.path)!r}" if self.source else f"ledger {self.path}"

    # ------------------------------------------------------------------ plumbing
    def _create(self) -> None:
        """Create the file with an empty ledger, atomically (link of a full temp
        file), so the ledger file is never seen empty."""
        d = self.path.parent
        try:
            fd, tmp = tempfile.mkstemp(prefix=".kvgrant-ledger-", dir=d)
        except OSError as e:
            raise LedgerError(f"{self._named}: cannot create it in {d}: {e}",
                              path=str(self.path)) from None
        try:
            os.fchmod(fd, 0o666)
            _File(self, fd).write([])
            try:
                os.link(tmp, self.path)
            except FileExistsError:
                pass  # someone else created it first: use theirs
            except OSError as e:
                raise LedgerError(f"{self._named}: cannot create it: {e}",
                                  path=str(self.path)) from None
        finally:
            os.close(fd)
            os.unlink(tmp)

    def _refuse_kind(self, st: os.stat_result) -> None:
        """Refuse a symbolic link or a file that is not a regular file (a folder is left
        to os.open)."""
        if stat.S_ISLNK(st.st_mode):
            try:
                to = f" (to {os.readlink(self.path)})"
            except OSError:
                to = ""
            raise LedgerError(
                f"{self._named} is a symbolic link{to}: refused for safety (the ledger's "
                f"folder is often writable by every user, so a link could make kvgrant "
                f"rewrite another file); name the real file instead, or remove the link",
                path=str(self.path))
        if not stat.S_ISREG(st.st_mode) and not stat.S_ISDIR(st.st_mode):
            # (a folder: os.open says "Is a directory", with the usual advice)
            raise LedgerError(
                f"{self._named} is not a regular file ({file_kind(st.st_mode)}), so it is not read (a "
                f"device or FIFO may never end, or block) and --repair cannot make it one: "
                f"the ledger must be a regular file "
                f"that every kvgrant process on the host can lock and rewrite; name another "
                f"path", path=str(self.path))

    def _open(self) -> int:
        for _ in range(2):
            try:
                st = os.lstat(self.path)
            except FileNotFoundError:
                pass
            except OSError:
                pass  # os.open below says why
            else:
                self._refuse_kind(st)  # never open a device or follow a link
            try:
                # never through a symbolic link: the default folder is world-writable
                fd = os.open(self.path, os.O_RDWR | os.O_CLOEXEC | os.O_NOFOLLOW |
                             os.O_NOCTTY | os.O_NONBLOCK)
            except FileNotFoundError:
                self._create()
                continue
            except OSError as e:
                if e.errno == errno.ELOOP and os.path.islink(self.path):
                    self._refuse_kind(os.lstat(self.path))
                where = (f"point {LEDGER_ENV} at another file" if self.source else
                         f"set {LEDGER_ENV}")
                raise LedgerError(
                    f"{self._named}: cannot open it for reading and writing: {e} (every "
                    f"kvgrant process on the host must be able to write it; fix its mode, or "
                    f"{where})", path=str(self.path)) from None
            try:
                self._refuse_kind(os.fstat(fd))  # replaced between lstat and open
            except BaseException:
                os.close(fd)
                raise
            return fd
        raise LedgerError(f"{self.name}: it disappeared while being created",
                          path=str(self.path))

    def _session(self) -> "_Session":
        return _Session(self)

    def _reap_read(self, f: _File, holders: list[Holder]) -> tuple[list[Holder], bool]:
        """Reap ``holders`` (as read by ``f``): (the kept ones, whether the file must be
        rewritten); sets :attr:`reaped`, :attr:`earlier_boot`, :attr:`notes`."""
        keep, dead, self.verdicts = _reap(holders)
        self.notes = {i: v.why for i, v in self.verdicts.items() if v.why}
        self.earlier_boot = list(f.earlier_boot)
        for h in self.earlier_boot:
            self.notes[h.id] = "recorded in an earlier boot of this host"
        self.reaped = self.earlier_boot + dead
        return keep, bool(self.reaped)

    # ------------------------------------------------------------------ API
    def holders(self, *, reap: bool = True) -> list[Holder]:
        """Every holder recorded now; with ``reap``, dead ones are removed first (and
        listed in :attr:`reaped`)."""
        with self._session() as f:
            _, holders = f.read()
            if reap:
                keep, changed = self._reap_read(f, holders)
                if changed:
                    f.write(keep)
                return keep
            return holders

    def reserve(self, handles: int, *, geometry: str, label: str, budget: int,
                reserve: int, check: bool = True, devices: Sequence[int] = ()) -> "Lease":
        """Record ``handles`` for this process, atomically with the check.

        Under the lock: reap dead holders; when ``check``, refuse unless
        ``sum(holders) + handles + reserve <= budget``; record the entry.
        ``check=False`` (pre-flight off) records without refusing, so others still
        see it.

        Raises
        ------
        HandleBudgetError
            Naming every holder (pid, geometry, handles), the budget, the reserve and
            the overdraw; nothing was recorded.
        LedgerError, LedgerLockTimeout
            The ledger file cannot be used (nothing was recorded).
        ValueError
            A count is not an integer >= 0.
        """
        for name, v in (("handles", handles), ("budget", budget), ("reserve", reserve)):
            _check_count(name, v)
        me = current_process()
        h = Holder(id=uuid.uuid4().hex, pid=me.pid, start=me.start, pidns=me.pidns,
                   host=socket.gethostname(), geometry=str(geometry), label=str(label),
                   handles=handles, budget=budget, reserve=reserve, checked=bool(check),
                   devices=tuple(int(d) for d in devices), since=round(time.time(), 3))
        with self._session() as f:
            _, holders = f.read()
            keep, _ = self._reap_read(f, holders)
            if check:
                self._refuse_unless_fits(keep, h)
            f.write([*keep, h])
        return Lease(self, h)

    def _refuse_unless_fits(self, others: list[Holder], h: Holder) -> None:
        held = sum(o.handles for o in others)
        budget, reserve, why = binding_limits(h.budget, h.reserve, others)
        total = held + h.handles + reserve
        if total <= budget:
            return
        who = "; ".join(o.describe() for o in others) or "none"
        raise HandleBudgetError(
            f"{h.geometry!r} ({h.label}) needs {h.handles:,} driver handles, but this host's "
            f"budget is {budget:,}{why} and {held:,} are already reserved in its ledger by "
            f"[{who}], with a reserve of {reserve:,} for users kvgrant cannot see: "
            f"{held:,} + {h.handles:,} + {reserve:,} = {total:,}, over by "
            f"{total - budget:,}. The budget is one pool for every process and GPU of the "
            f"host ({self.name}; `kvgrant budget` lists it)",
            demand=h.handles, budget=budget, reserve=reserve, held=held,
            holders=[o.as_dict() for o in others])

    def _update(self, lease: "Lease", handles: int | None, check: bool) -> Holder | None:
        """Resize (``handles``) or remove (None) the lease's entry; returns the new one."""
        with self._session() as f:
            _, holders = f.read()
            keep, changed = self._reap_read(f, holders)
            others = [o for o in keep if o.id != lease.holder.id]
            if handles is None:
                if changed or len(others) != len(keep):
                    f.write(others)
                return None
            new = replace(lease.holder, handles=handles, checked=lease.holder.checked and check)
            if check and handles > lease.holder.handles:
                self._refuse_unless_fits(others, new)
            f.write([*others, new])
            return new

    def repair(self) -> Path | None:
        """Make the file a usable ledger again, keeping what can be kept.

        A readable ledger only loses its dead holders (returns None). An unreadable
        one (garbage, truncated, newer version, another host's) is copied to
        ``<path>.bad-<time>`` (returned) and replaced by an empty ledger: the holders
        it recorded are forgotten, so run this only when they are gone.
        """
        with self._session() as f:
            try:
                _, holders = f.read()
            except NotALedger:
                raise  # another program's file: not ours to move aside
            except LedgerError:
                pass
            else:
                keep, _ = self._reap_read(f, holders)
                f.write(keep)
                return None
            raw = f.raw()
            aside = self.path.with_name(f"{self.path.name}.bad-{int(time.time())}-{os.getpid()}")
            try:
                aside.write_bytes(raw)
            except OSError as e:
                raise LedgerError(f"{self.name}: cannot keep the bad content at "
                                  f"{aside}: {e}", path=str(self.path)) from None
            f.write([])
            return aside

    def drop(self, pids: Sequence[int] = (), *, unknown: bool = False) -> list[Holder]:
        """Remove holders an operator knows are gone; returns the removed ones.

        For holders kvgrant cannot judge: recorded from another pid namespace that this
        process cannot see (a container sharing the ledger's folder, ``unshare --pid``),
        which reaping keeps ("cannot tell"; :attr:`notes`). ``pids``: every holder
        recorded with one of these pids; ``unknown``: every "cannot tell" holder. Dead
        holders are reaped first, as by every operation.

        Raises
        ------
        LedgerError
            A pid names no holder, or only holders found alive (this namespace's, or
            another's found in ``/proc``): they hold driver handles now, and their
            process releases them. Nothing was removed then.
        """
        want = {int(p) for p in pids}
        with self._session() as f:
            _, holders = f.read()
            keep, changed = self._reap_read(f, holders)
            alive = {h.id for h in keep if self.verdicts[h.id].state == "alive"}
            bad = []
            for pid in sorted(want):
                mine = [h for h in keep if h.pid == pid]
                if not mine:
                    bad.append(f"pid {pid}: no holder has it (holders: "
                               f"{', '.join(str(h.pid) for h in keep) or 'none'})")
                elif all(h.id in alive for h in mine):
                    bad.append("; ".join(
                        f"{h.describe()} is alive ("
                        f"{self.notes.get(h.id) or 'a process of this pid namespace'}): its "
                        "process releases it when it ends" for h in mine))
            if bad:
                raise LedgerError(f"{self.name}: nothing dropped: " + "; ".join(bad),
                                  path=str(self.path))
            gone = [h for h in keep if h.id not in alive and (
                h.pid in want or (unknown and self.verdicts[h.id].state == "unknown"))]
            rest = [h for h in keep if h not in gone]
            if gone or changed:
                f.write(rest)
            return gone


class _Session:
    """Open + lock the ledger for one operation (closed on exit)."""

    def __init__(self, ledger: HostLedger) -> None:
        self.ledger = ledger
        self.fd = -1
        self._lock: locked | None = None

    def __enter__(self) -> _File:
        self.fd = self.ledger._open()
        self._lock = locked(self.fd, self.ledger.lock_timeout_s)
        try:
            self._lock.__enter__()
        except TimeoutError as e:
            os.close(self.fd)
            pid = getattr(e, "holder_pid", None)
            who = (f"process {pid} holds it" + _cmdline(pid)) if pid else \
                "the holder could not be found in /proc/locks"
            raise LedgerLockTimeout(
                f"{self.ledger.name}: its lock is still held after "
                f"{self.ledger.lock_timeout_s:g} s ({who}); a kvgrant process holds it for "
                f"well under a second, so that process is stuck: end it, then retry",
                path=str(self.ledger.path), holder_pid=pid,
                waited_s=getattr(e, "waited_s", 0.0)) from None
        return _File(self.ledger, self.fd)

    def __exit__(self, *exc: object) -> None:
        try:
            if self._lock is not None:
                self._lock.__exit__()
        finally:
            os.close(self.fd)


def _cmdline(pid: int | None) -> str:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            cmd = f.read().replace(b"\0", b" ").decode(errors="replace").strip()
    except OSError:
        return ""
    return f" ({cmd[:120]})" if cmd else ""


class Lease:
    """This process's reservation in a :class:`HostLedger`; release it after the last
    driver handle it covers is gone. ``release()`` is idempotent; as a context manager
    it releases on exit. A process that dies without releasing is reaped by the next
    ledger operation on the host."""

    def __init__(self, ledger: HostLedger, holder: Holder) -> None:
        self.ledger = ledger
        self.holder = holder
        self.released = False

    @property
    def handles(self) -> int:
        return self.holder.handles

    def resize(self, handles: int, *, check: bool = True) -> None:
        """Change the reserved count (e.g. after pages were fitted to free memory);
        growing is checked like :meth:`HostLedger.reserve` (HandleBudgetError, and the
        lease keeps its old size)."""
        _check_count("handles", handles)
        if self.released:
            raise ValueError("resize() of a released lease")
        new = self.ledger._update(self, handles, check)
        assert new is not None
        self.holder = new

    def release(self) -> None:
        """Remove the entry (a second call does nothing)."""
        if self.released:
            return
        self.ledger._update(self, None, False)
        self.released = True

    def __enter__(self) -> "Lease":
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()

    def __repr__(self) -> str:
        return f"Lease({self.holder.describe()}, ledger={str(self.ledger.path)!r})"
