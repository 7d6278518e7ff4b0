"""The host's plan cache: a layout is planned once per host, not once per process.

Why: every rank plans for itself (the packed plan is a pure function of the geometry
and the planner's work limits, so ranks agree without talking), and planning a layout
costs from about a second (the published layouts) to a minute (tens of thousands of
chunks). A 16-GPU host that starts 16 rank processes would spend that 16 times at
every start-up. Here the first process plans and writes the plan to a file; the
others wait for it on a lock and read it, and later start-ups read it at once.

The file (the cache *entry*, ``<key>.json``) is the ``kvgrant plan --json`` plan
document (so ``kvgrant alloc --plan FILE`` takes it too) plus what makes it valid: the
key (geometry hash, planner work limits, kvgrant and HiGHS versions, a digest of the
planner's source) and the cache format. Its ``label`` is ``packed``: the cache holds
the packed planner's plans and serves them as such. An entry that does not parse, has
another key, another format or another label (a foreign or edited file: a ``naive``
label on the naive rule's plan would otherwise have been served as the packed plan),
or breaks the layout contract is not used: the process holding the lock says why on
stderr, plans, and replaces it. An entry that is not a regular file (a FIFO, a
socket, a device, a folder) is never opened (opening a FIFO blocks until a writer
comes) and never replaced (kvgrant did not make it, and removing someone's FIFO or
device node is not the cache's call): the process says so once and plans for itself
until it is removed. A cache folder that cannot be written is not used.
``KVGRANT_PLAN_CACHE`` names the folder (default ``$XDG_CACHE_HOME/kvgrant/plans``,
else ``~/.cache/kvgrant/plans``); ``off`` turns the cache off. A ``KVGRANT_PLAN_CACHE``
that names a file (not a folder) is an error, not a folder that cannot be written: it
is the user's mistake, and ignoring it hid that every start-up planned anew.

The lock (``<key>.lock``, ``flock``) records its holder while it is held (pid, host,
geometry, since when), so a process that waits for it more than :data:`NOTICE_S`
says once on stderr who it waits for and how long it will wait; the wait is bounded
by ``wait_s`` (default :data:`PLAN_CACHE_WAIT_S`; a caller with a deadline of its
own, such as a group's ``timeout_s``, passes it), and a wait that runs out raises
:class:`PlanCacheTimeout` naming the entry, the holder and the wait.
"""

from __future__ import annotations

import errno
import fcntl
import hashlib
import json
import math
import os
import socket
import stat
import sys
import tempfile
import time
from importlib import metadata
from pathlib import Path
from typing import Any, Callable, Mapping

from kvgrant.errors import ArgumentError, PlanCacheTimeout, PlanError
from kvgrant.layout.geometry import MAX_FILE_BYTES, Geometry
from kvgrant.layout.plan import PhysicalPlan
from kvgrant.layout.planfile import geometry_hash, plan_document, plan_from_document
from kvgrant.runtime.arguments import is_switch_word
from kvgrant.runtime.hostlock import clock_text, current_process, file_kind, locked
from kvgrant.strict_json import strict_json_loads

__all__ = ["NOTICE_S", "PLAN_CACHE_ENV", "PLAN_CACHE_WAIT_S", "PlanCacheTimeout", "cache_dir",
           "cached_packed_plan", "packed_plan", "planner_digest"]

PLAN_CACHE_ENV = "KVGRANT_PLAN_CACHE"
PLAN_CACHE_WAIT_S = 900.0
"""How long a process waits at most, by default, for another one that is planning the
same layout (the planner's own safety net is as long); ``wait_s`` bounds it."""
MAX_WAIT_S = 10.0**7
"""The largest ``wait_s`` accepted (finite, and more than any caller's deadline)."""
NOTICE_S = 1.0
"""A wait on the lock longer than this is said once on stderr (or to ``progress``),
naming the holder and how long the wait may last; shorter waits stay quiet."""
_OFF = frozenset({"off", "0", "no", "n", "false", "none"})
_FORMAT = "kvgrant-plan-cache/1"
_LABEL = "packed"  # the label of every entry: the cache holds the packed planner's plans
_RECORD_BYTES = 4096  # at most this much of the lock file is read as its holder record


def cache_dir(env: Mapping[str, str] | None = None) -> Path | None:
    """The cache folder ``KVGRANT_PLAN_CACHE`` names (None: the cache is off).

    Raises
    ------
    ArgumentError
        ``KVGRANT_PLAN_CACHE`` is blank or names an existing file: it must be a folder
        or ``off``. (A path below a file is a folder that cannot be made: not used.)
    """
    env = os.environ if env is None else env
    raw = env.get(PLAN_CACHE_ENV)
    if raw is not None:
        if raw.strip().lower() in _OFF:
            return None
        if is_switch_word(raw) and raw.strip():
            # was: KVGRANT_PLAN_CACHE=1 made a cache folder named "1" here
            raise ArgumentError(f"{PLAN_CACHE_ENV} = {raw!r}: must be a folder path, or "
                                "'off' to turn the plan cache off (it is on by default: "
                                "unset the variable to use the default folder)",
                                argument=PLAN_CACHE_ENV, value=raw)
        if not raw.strip() or "\0" in raw:
            raise ArgumentError(f"{PLAN_CACHE_ENV} = {raw!r}: must be a folder path, or "
                                "'off' to turn the plan cache off", argument=PLAN_CACHE_ENV,
                                value=raw)
        folder = Path(raw).expanduser()
        if _is_file(folder):
            raise ArgumentError(f"{PLAN_CACHE_ENV} = {raw!r}: must be a folder or 'off' (to "
                                "turn the plan cache off); it is a file",
                                argument=PLAN_CACHE_ENV, value=raw)
        return folder
    base = env.get("XDG_CACHE_HOME") or str(Path(env.get("HOME") or "~", ".cache"))
    return Path(base).expanduser() / "kvgrant" / "plans"


def _is_file(folder: Path) -> bool:
    """Is ``folder`` an existing non-folder (a user's mistake, unlike a folder that
    cannot be written, which is just not used)?"""
    try:
        return folder.exists() and not folder.is_dir()
    except OSError:  # no search permission above it: a folder we cannot use, not a file
        return False


def _key(g: Geometry, limits: Mapping[str, Any]) -> str:
    """What a cached plan is valid for; a change of any part is a miss."""
    parts = {"format": _FORMAT, "geometry_hash": geometry_hash(g),
             "limits": dict(sorted(limits.items())), "kvgrant": _version("kvgrant"),
             "highspy": _version("highspy"), "planner": planner_digest()}
    return hashlib.sha256(json.dumps(parts, sort_keys=True).encode()).hexdigest()


_DIGEST: list[str] = []  # computed once per process (the sources do not change under it)


def planner_digest() -> str:
    """SHA-256 of the planner's source (every module of :mod:`kvgrant.layout`, by name;
    their compiled files in an install without sources; "" when there is neither, and
    the cache is then not used).

    Why: the packed plan is a function of the geometry *and* of the planner's code, and
    the version string does not move with every change (8afb9e6 changed the packed
    allocations of published-dcp8 at version 0.1.0). A host that keeps a cached plan
    across an upgrade would otherwise serve the old planner's plan while a host
    without the file plans anew, and ranks that disagree on sizes abort the group."""
    if not _DIGEST:
        import kvgrant.layout as layout

        h = hashlib.sha256()
        folder = Path(layout.__file__).resolve().parent
        sources = sorted(folder.glob("*.py")) or sorted(folder.glob("__pycache__/*.pyc"))
        for path in sources:
            h.update(path.name.encode() + b"\0" + path.read_bytes() + b"\0")
        _DIGEST.append(h.hexdigest() if sources else "")
    return _DIGEST[0]


def _version(dist: str) -> str:
    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        return "unknown"


def _special(path: Path) -> str | None:
    """What ``path`` is when it exists and is not a regular file (symbolic links
    followed), else None (missing, a file, or not stat-able: then reading it fails
    and says why). Nothing is opened."""
    try:
        st = os.stat(path)
    except (OSError, ValueError):
        return None
    return None if stat.S_ISREG(st.st_mode) else file_kind(st.st_mode)


def _read(path: Path, g: Geometry, key: str) -> tuple[PhysicalPlan | None, str | None]:
    """``(plan, None)``: the cached plan at ``path`` when the entry is a regular file
    holding a plan document of this version with the key ``key`` (geometry hash, work
    limits, kvgrant and HiGHS versions, planner digest), this cache format and the
    label ``packed``, keeping the layout contract. Else ``(None, reason)``, the reason
    None when there is no entry. The file is parsed once, and opened only when
    ``os.stat`` says it is a regular file, then without blocking (``O_NONBLOCK``) and
    checked again on the open descriptor (a FIFO swapped in between is not read)."""
    kind = _special(path)
    if kind is not None:
        return None, f"it is {kind}, not a plan file"
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC)
    except FileNotFoundError:
        return None, None
    except (OSError, ValueError) as err:
        return None, f"cannot read it: {getattr(err, 'strerror', None) or err}"
    with os.fdopen(fd, "rb") as fh:
        try:
            mode = os.fstat(fh.fileno()).st_mode
            if not stat.S_ISREG(mode):
                return None, f"it is {file_kind(mode)}, not a plan file"
            raw = fh.read(MAX_FILE_BYTES + 1)
        except OSError as err:
            return None, f"cannot read it: {err.strerror or err}"
    if len(raw) > MAX_FILE_BYTES:
        return None, f"larger than {MAX_FILE_BYTES:,} bytes"
    try:
        doc = strict_json_loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, ValueError, RecursionError) as err:
        return None, f"not JSON ({str(err)[:100]})" if raw.strip() else "empty"
    if not isinstance(doc, dict):
        return None, "not a plan document (not a JSON object)"
    for field, want, what in (
            ("cache_key", key, "the key its name says (another layout, limits, kvgrant "
                               "or planner)"),
            ("cache_format", _FORMAT, repr(_FORMAT)),
            ("label", _LABEL, f"{_LABEL!r}: the cache holds the packed planner's plans, "
                              "so this entry was written by something else or edited")):
        if doc.get(field) != want:
            shown = json.dumps(doc.get(field))[:80]
            return None, f"{field} = {shown}, not {what}"
    try:
        plan = plan_from_document(doc, g, path)  # version, hash, allocations, contract
    except PlanError as err:
        return None, str(err)
    return PhysicalPlan(plan.label, g, plan.allocations,
                        (f"read from the plan cache ({path})",)), None


def _write(path: Path, plan: PhysicalPlan, key: str) -> None:
    """Write atomically (a reader sees the old file or the new one, never a part), with
    the label ``packed`` (what the entry is read back as). An entry that is not a
    regular file (a FIFO, a folder, ...) is left as it is."""
    if _special(path) is not None:
        return
    doc = dict(plan_document(plan), label=_LABEL, cache_key=key, cache_format=_FORMAT)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=path.name, suffix=".tmp")
    try:
        os.fchmod(fd, 0o644 & ~_umask())  # mkstemp's 0600 would hide it from other users
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            json.dump(doc, f, separators=(",", ":"))
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def _umask() -> int:
    """The process's umask, read without setting it (os.umask would change it for a
    moment under every other thread)."""
    try:
        with open("/proc/self/status", encoding="ascii") as f:
            for line in f:
                if line.startswith("Umask:"):
                    return int(line.split()[1], 8)
    except (OSError, ValueError):
        pass
    return 0o022


def _wait_limit(wait_s: Any) -> float:
    """``wait_s`` checked: None is :data:`PLAN_CACHE_WAIT_S`; else seconds, 0 to
    :data:`MAX_WAIT_S` (0: take the lock only if it is free)."""
    if wait_s is None:
        return PLAN_CACHE_WAIT_S
    if isinstance(wait_s, bool) or not isinstance(wait_s, (int, float)) \
            or not math.isfinite(wait_s) or not 0 <= wait_s <= MAX_WAIT_S:
        raise ArgumentError(f"cached_packed_plan: wait_s = {wait_s!r}: must be None or a "
                            f"number of seconds from 0 to {MAX_WAIT_S:,.0f}",
                            argument="wait_s", value=wait_s)
    return float(wait_s)


def _sayer(progress: Any) -> Callable[[str], None]:
    """Where the cache's messages go: ``progress`` (a callable taking one line), else
    stderr as ``kvgrant: plan cache: ...``."""
    if progress is not None:
        if not callable(progress):
            raise ArgumentError(f"cached_packed_plan: progress = {progress!r}: must be None "
                                "or a callable taking one message", argument="progress",
                                value=progress)
        return lambda message: progress(f"plan cache: {message}")

    def say(message: str) -> None:
        try:
            print(f"kvgrant: plan cache: {message}", file=sys.stderr, flush=True)
        except (OSError, ValueError, AttributeError):  # a closed or missing stderr
            pass
    return say


def _claim(fd: int, g: Geometry) -> None:
    """Record in the lock file who holds it and for what (read by those who wait)."""
    me = current_process()
    record = {"pid": me.pid, "start": me.start, "pidns": me.pidns,
              "host": socket.gethostname(), "geometry": g.name,
              "geometry_hash": geometry_hash(g), "since": time.time()}
    try:
        os.ftruncate(fd, 0)
        os.pwrite(fd, json.dumps(record).encode()[:_RECORD_BYTES], 0)
    except OSError:
        pass  # the record only helps those who wait; the lock itself is the flock


def _unclaim(fd: int) -> None:
    try:
        os.ftruncate(fd, 0)
    except OSError:
        pass


def _holder(fd: int, holder_pid: int | None) -> dict[str, Any] | None:
    """The holder record in the lock file (fields of :func:`_claim` with the right
    types), or None: none, unreadable, or left by an earlier holder (a record whose pid
    is not the one ``/proc/locks`` names, in this pid namespace)."""
    try:
        raw = os.pread(fd, _RECORD_BYTES, 0)
        obj = json.loads(raw.decode("utf-8")) if raw.strip() else None
    except (OSError, ValueError, RecursionError):
        return None
    if not isinstance(obj, dict) or type(obj.get("pid")) is not int:
        return None
    types = {"pid": int, "start": int, "pidns": str, "host": str, "geometry": str,
             "geometry_hash": str, "since": (int, float)}
    record = {k: obj[k] for k, t in types.items()
              if k in obj and isinstance(obj[k], t) and not isinstance(obj[k], bool)}
    here = current_process()
    if holder_pid is not None and record["pid"] != holder_pid \
            and record.get("pidns", here.pidns) == here.pidns:
        return None
    return record


def _who(holder_pid: int | None, holder: dict[str, Any] | None) -> str:
    """The lock's holder in words: pid, host when not this one, what it plans, since."""
    if holder is None:
        if holder_pid is not None:
            return f"pid {holder_pid}"
        return ("a process this host cannot name (not in /proc/locks: it may run in "
                "another container, or on another host sharing this folder)")
    text = f"pid {holder['pid']}"
    host = holder.get("host")
    if host and host != socket.gethostname():
        text += f" on host {host!r}"
    elif holder.get("pidns") and holder["pidns"] != current_process().pidns:
        text += f" of pid namespace {holder['pidns']} (a container: its pid there)"
    if "geometry" in holder:
        text += f", planning {holder['geometry']!r}"
    since = holder.get("since")
    shown = clock_text(since, "%H:%M:%S UTC", utc=True)
    if shown is not None:  # (a damaged record's time is left out, not a traceback)
        ago = max(0.0, time.time() - since)  # type: ignore[operator]
        text += f" since {shown} ({_secs(ago)} ago)"
    return text


def _secs(s: float) -> str:
    return f"{s:,.0f} s" if s >= 10 else f"{s:.1f} s"


def _lock(fd: int, path: Path, lock_path: Path, wait: float,
          say: Callable[[str], None]) -> None:
    """Take the entry's lock (``flock`` on ``fd``), waiting at most ``wait`` seconds; a
    wait past :data:`NOTICE_S` is said once, naming the holder and the limit.

    Raises
    ------
    PlanCacheTimeout
        The lock is still held after ``wait`` seconds.
    """
    t0 = time.monotonic()
    try:
        locked(fd, min(wait, NOTICE_S)).__enter__()
        return
    except TimeoutError as err:
        pid = getattr(err, "holder_pid", None)
    holder = _holder(fd, pid)
    waited = time.monotonic() - t0
    if waited < wait:
        say(f"{_who(pid, holder)} holds the lock of {path} (planning this layout); "
            f"waiting for its plan, at most {_secs(wait - waited)} more "
            f"(wait limit {_secs(wait)})")
        try:
            locked(fd, wait - waited).__enter__()
            return
        except TimeoutError as err:
            pid = getattr(err, "holder_pid", None)
        holder = _holder(fd, pid)
    waited = time.monotonic() - t0
    who = _who(pid, holder)
    named = pid if pid is not None else None if holder is None else holder["pid"]
    fix = (f"if pid {named} is still planning, allow a longer wait (wait_s; a group's "
           "timeout) or plan once and give every rank the file (kvgrant plan GEOMETRY "
           "--json > p.json; kvgrant alloc --plan p.json); if it is hung, stop it (its "
           "lock goes with it)" if named is not None else
           f"if its holder is gone (a network file system can keep a dead host's lock), "
           f"remove {lock_path}; or plan once and give every rank the file (kvgrant plan "
           "GEOMETRY --json > p.json; kvgrant alloc --plan p.json)")
    raise PlanCacheTimeout(
        f"plan cache: gave up after waiting {_secs(waited)} (wait limit {_secs(wait)}) "
        f"for the lock of the entry {path}: {who} holds it, planning this layout. "
        f"{fix[0].upper()}{fix[1:]}; or plan without the cache ({PLAN_CACHE_ENV}=off)",
        path=str(path), lock_path=str(lock_path),
        holder_pid=named, holder=holder, waited_s=waited, wait_s=wait)


def cached_packed_plan(g: Geometry, plan: Callable[[Geometry], PhysicalPlan],
                       limits: Mapping[str, Any], *,
                       env: Mapping[str, str] | None = None, wait_s: float | None = None,
                       progress: Callable[[str], None] | None = None) -> PhysicalPlan:
    """``plan(g)`` (the packed planner under ``limits``), through the host's cache.

    Without a usable cache folder this is just ``plan(g)``. Otherwise: the cached
    plan when there is a valid one; else, holding the layout's lock (so one process
    plans while the others wait), plan, write, and return.

    ``wait_s`` bounds the wait for another process that holds the lock (default
    :data:`PLAN_CACHE_WAIT_S`; 0 takes it only if free): a caller with a deadline of
    its own passes what is left of it. ``progress`` takes the cache's messages (a
    wait past :data:`NOTICE_S`, an entry not used and why), one line each; default
    stderr.

    Raises
    ------
    PlanCacheTimeout
        The lock stayed held for ``wait_s``: names the entry, its holder (pid, what it
        plans, since when) and the wait, and what to do.
    ArgumentError
        ``wait_s`` or ``progress`` is not accepted, or ``KVGRANT_PLAN_CACHE`` is bad.
    """
    wait = _wait_limit(wait_s)
    say = _sayer(progress)
    folder = cache_dir(env)
    if folder is None or not planner_digest():  # (no code to tell planners apart)
        return plan(g)
    key = _key(g, limits)
    path = folder / f"{key}.json"
    kind = _special(path)
    if kind is not None:  # never opened (a FIFO blocks the open), never replaced
        say(f"{path} is {kind}, not a plan file: not read and not replaced; planning in "
            "this process (remove it to use the cache for this layout)")
        return plan(g)
    hit, _ = _read(path, g, key)
    if hit is not None:
        return hit
    lock_path = folder / f"{key}.lock"
    try:
        folder.mkdir(parents=True, exist_ok=True)
        # O_NOFOLLOW: the holder record is written into the lock file, so a link there
        # (a shared cache folder) must not make kvgrant empty the file it points to
        lock_fd = os.open(lock_path, os.O_RDWR | os.O_CREAT | os.O_NONBLOCK | os.O_NOCTTY
                          | os.O_CLOEXEC | os.O_NOFOLLOW, 0o644)
    except OSError as e:
        if e.errno == errno.ELOOP:
            say(f"{lock_path} is a symbolic link, not a lock file: the cache is not used "
                "for this layout; planning in this process (remove it to use the cache)")
        return plan(g)  # a folder we cannot write: plan here, cache nothing
    try:
        st = os.fstat(lock_fd)
        if not stat.S_ISREG(st.st_mode):
            say(f"{lock_path} is {file_kind(st.st_mode)}, not a lock file: the cache is not "
                "used for this layout; planning in this process (remove it to use the cache)")
            return plan(g)
        # a hard link, or another user's file: locked, but its content is not ours to write
        ours = st.st_nlink == 1 and st.st_uid == os.geteuid()
        _lock(lock_fd, path, lock_path, wait, say)
        try:
            if ours:
                _claim(lock_fd, g)
            hit, reason = _read(path, g, key)  # another process planned while we waited
            if hit is not None:
                return hit
            if reason is not None:
                say(f"{path} not used: {reason}; planning anew and replacing it")
            out = plan(g)
            try:
                _write(path, out, key)
            except OSError:
                pass  # a full or read-only disk: the plan is still good
            return out
        finally:
            if ours:
                _unclaim(lock_fd)
            fcntl.flock(lock_fd, fcntl.LOCK_UN)
    finally:
        os.close(lock_fd)


def packed_plan(g: Geometry, *, env: Mapping[str, str] | None = None,
                wait_s: float | None = None,
                progress: Callable[[str], None] | None = None) -> PhysicalPlan:
    """The packed plan at the planner's default limits (what every rank uses), through
    the host's cache; ``wait_s`` and ``progress`` as :func:`cached_packed_plan` takes
    them (a group passes its ``timeout_s`` as ``wait_s``)."""
    from kvgrant.layout import exact
    from kvgrant.layout.plans import packed_plan as plan

    limits = {"node_limit": exact.DEFAULT_NODE_LIMIT, "max_nonzeros": exact.DEFAULT_MAX_NONZEROS,
              "max_solves": exact.DEFAULT_MAX_SOLVES, "max_checks": exact.DEFAULT_MAX_CHECKS,
              "max_windowed_nonzeros": exact.DEFAULT_MAX_WINDOWED_NONZEROS,
              "max_gap": exact.DEFAULT_MAX_GAP}
    # only what is given (a caller's stand-in for cached_packed_plan may take env alone)
    extra = {k: v for k, v in (("wait_s", wait_s), ("progress", progress)) if v is not None}
    return cached_packed_plan(g, plan, limits, env=env, **extra)
