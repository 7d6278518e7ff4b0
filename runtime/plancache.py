"""The host's plan cache: a layout is planned once per host, not once per process.

Why: every rank plans for itself (the packed plan is a pure function of the geometry
and the planner's work limits, so ranks agree without talking), and planning a layout
costs from about a second (the published layouts) to a minute (tens of thousands of
chunks). A 16-GPU host that starts 16 rank processes would spend that 16 times at
every start-up. Here the first process plans and writes the plan to a file; the
others wait for it on a lock and read it, and later start-ups read it at once.

The file is the ``kvgrant plan --json`` plan document (so ``kvgrant alloc --plan
FILE`` takes it too) plus what makes it valid: the key (geometry hash, planner work
limits, kvgrant and HiGHS versions, a digest of the planner's source). A file that
does not parse, has another key or breaks the layout contract is ignored and replaced;
a cache folder that cannot be written is not used. ``KVGRANT_PLAN_CACHE`` names the folder (default
``$XDG_CACHE_HOME/kvgrant/plans``, else ``~/.cache/kvgrant/plans``); ``off`` turns the
cache off. A ``KVGRANT_PLAN_CACHE`` that names a file (not a folder) is an error, not a
folder that cannot be written: it is the user's mistake, and ignoring it hid that every
start-up planned anew.
"""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
from importlib import metadata
from pathlib import Path
from typing import Any, Callable, Mapping

from kvgrant.errors import ArgumentError, PlanError
from kvgrant.layout.geometry import Geometry
from kvgrant.layout.plan import PhysicalPlan
from kvgrant.layout.planfile import (geometry_hash, load_plan_document, plan_document,
                                     plan_from_document)
from kvgrant.runtime.hostlock import locked

__all__ = ["PLAN_CACHE_ENV", "PLAN_CACHE_WAIT_S", "cache_dir", "cached_packed_plan",
           "packed_plan", "planner_digest"]

PLAN_CACHE_ENV = "KVGRANT_PLAN_CACHE"
PLAN_CACHE_WAIT_S = 900.0
"""How long a process waits for another one that is planning the same layout before
it plans for itself (the planner's own safety net is as long)."""
_OFF = frozenset({"off", "0", "no", "false", "none"})
_FORMAT = "kvgrant-plan-cache/1"


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


def _read(path: Path, g: Geometry, key: str) -> PhysicalPlan | None:
    """The cached plan at ``path`` when it is valid for ``key`` (geometry hash, work
    limits, kvgrant and HiGHS versions, planner digest), is a plan document of this
    version and keeps the layout contract; None otherwise. The file is parsed once."""
    try:
        doc = load_plan_document(path)
    except PlanError:
        return None
    if not isinstance(doc, dict) or doc.get("cache_key") != key:
        return None
    try:
        plan = plan_from_document(doc, g, path)  # version, hash, allocations, contract
    except PlanError:
        return None
    return PhysicalPlan("packed", g, plan.allocations,
                        (f"read from the plan cache ({path})",))


def _write(path: Path, plan: PhysicalPlan, key: str) -> None:
    """Write atomically (a reader sees the old file or the new one, never a part)."""
    doc = dict(plan_document(plan), cache_key=key, cache_format=_FORMAT)
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


def cached_packed_plan(g: Geometry, plan: Callable[[Geometry], PhysicalPlan],
                       limits: Mapping[str, Any], *,
                       env: Mapping[str, str] | None = None) -> PhysicalPlan:
    """``plan(g)`` (the packed planner under ``limits``), through the host's cache.

    Without a usable cache folder this is just ``plan(g)``. Otherwise: the cached
    plan when there is a valid one; else, holding the layout's lock (so one process
    plans while the others wait), plan, write, and return.
    """
    folder = cache_dir(env)
    if folder is None or not planner_digest():  # (no code to tell planners apart)
        return plan(g)
    key = _key(g, limits)
    path = folder / f"{key}.json"
    hit = _read(path, g, key)
    if hit is not None:
        return hit
    try:
        folder.mkdir(parents=True, exist_ok=True)
        lock_fd = os.open(folder / f"{key}.lock", os.O_RDWR | os.O_CREAT, 0o644)
    except OSError:
        return plan(g)  # a folder we cannot write: plan here, cache nothing
    try:
        try:
            with locked(lock_fd, PLAN_CACHE_WAIT_S):
                hit = _read(path, g, key)  # another process planned while we waited
                if hit is not None:
                    return hit
                out = plan(g)
                try:
                    _write(path, out, key)
                except OSError:
                    pass  # a full or read-only disk: the plan is still good
                return out
        except TimeoutError:
            return plan(g)
    finally:
        os.close(lock_fd)


def packed_plan(g: Geometry, *, env: Mapping[str, str] | None = None) -> PhysicalPlan:
    """The packed plan at the planner's default limits (what every rank uses), through
    the host's cache."""
    from kvgrant.layout import exact
    from kvgrant.layout.plans import packed_plan as plan

    limits = {"node_limit": exact.DEFAULT_NODE_LIMIT, "max_nonzeros": exact.DEFAULT_MAX_NONZEROS,
              "max_solves": exact.DEFAULT_MAX_SOLVES, "max_checks": exact.DEFAULT_MAX_CHECKS,
              "max_windowed_nonzeros": exact.DEFAULT_MAX_WINDOWED_NONZEROS,
              "max_gap": exact.DEFAULT_MAX_GAP}
    return cached_packed_plan(g, plan, limits, env=env)
