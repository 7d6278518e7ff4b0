"""Valid group traces from the Python group model, in the runtime's format.

Until the group runtime records real traces, tests, fixtures and benchmarks need
group traces that follow docs/group-trace.md exactly. :func:`simulate_group` runs
every process's program (the order of that document) through
:mod:`kvgrant.conformance.group_model`, interleaving processes where the model makes
them wait, and writes one NDJSON text per rank whose recorded states come from the
model. Failures (a forward step of one process returns an error) and crashes (a
process's file stops after k events) can be injected; an importer whose owner will
never send gives up with a failed Import (result ``TIMEOUT``), as the runtime's
deadline does.

Version 2: the header carries a plan made from the constants (:func:`sim_plan`: one
plane of one granule per allocation; aliased allocations back an ``importers`` or an
``owner`` region) and each process's reservation; events name their objects (VAs in
that plan, handle ids counted per process), as the runtime writes them. Importers come
from the plan's import groups, so the constants' importers must be symmetric groups (as
every geometry's are).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Iterator, Mapping

from kvgrant.conformance.group_model import (WAIT, Args, GroupConstants, GroupState, crash,
                                             initial_group, step)
from kvgrant.traceformat import GROUP_SHAPES, GROUP_VERSION, format_group_event

__all__ = ["CALLS", "GRANULE", "group_header", "sim_plan", "simulate_group", "write_group"]

#: The call each action records (kvgrant.traceformat.GROUP_SHAPES); None: model-only.
CALLS: Mapping[str, str | None] = {a: s.call for a, s in GROUP_SHAPES.items()}
_SOCKET_OR_GROUP = frozenset({"Send", "Vote"})  # result SUCCESS, not a CUresult
FAIL_RESULT = "CUDA_ERROR_OUT_OF_MEMORY"
TIMEOUT_RESULT = "TIMEOUT"
#: The granularity of :func:`sim_plan` (2 MiB, as on the GPUs).
GRANULE = 1 << 21


def _import_groups(c: GroupConstants) -> list[list[int]]:
    groups: list[list[int]] = []
    for r in range(c.ranks):
        g = sorted(c.importers[r] | {r})
        if any(sorted(c.importers[q] | {q}) != g for q in g):
            raise ValueError(f"importers of rank {r} = {sorted(c.importers[r])}: not an import "
                             "group (a version-2 trace derives importers from import groups, "
                             "so every member imports from every other)")
        if len(g) > 1 and g not in groups:
            groups.append(g)
    return groups


def sim_plan(c: GroupConstants) -> dict[str, Any]:
    """The plan fields of a header for constants ``c`` (no reservations): plane ``kv``
    with allocation a at granule a; aliased allocations at the next granule of region
    ``shared`` (access importers) or ``own`` (owner-only)."""
    G, n = GRANULE, c.allocs
    shared = [a for a in sorted(c.aliased) if a not in c.owner_only]
    own = sorted(c.owner_only)
    regions: list[list[Any]] = []
    off = n * G
    where: dict[int, tuple[str, int]] = {}
    for name, items, access in (("shared", shared, "importers"), ("own", own, "owner")):
        if items:
            regions.append([name, off, len(items) * G, access])
            off += len(items) * G
            where.update({a: (name, k * G) for k, a in enumerate(items)})
    return {"granularity": G, "pages": None, "planes": [["kv", 0, n * G]], "regions": regions,
            "allocations": [["kv", a * G, G, *(where.get(a, (None, None)))] for a in range(n)],
            "topology": {"import_groups": _import_groups(c),
                         "declared_readers": {str(r): sorted(s) for r, s
                                              in enumerate(c.declared_readers)}},
            "slot": off}


def _base(p: int) -> int:
    return (1 << 44) + p * (1 << 36)


def group_header(c: GroupConstants, rank: int, devices: Mapping[int, int] | None = None,
                 base: int | None = None, *, reserved: bool = True,
                 **extra: Any) -> dict[str, Any]:
    """The header line of ``rank``'s file (``base``: its reservation's, default the
    generator's; null when not ``reserved``: its Reserve failed)."""
    devs = dict(devices) if devices is not None else {r: r for r in range(c.ranks)}
    plan = sim_plan(c)
    slot = plan.pop("slot")
    obj: dict[str, Any] = {"kind": "header", "version": GROUP_VERSION, "mode": "group",
                           "rank": rank, "procs": c.ranks, "ranks": c.ranks,
                           "allocs": c.allocs,
                           "devices": {str(r): d for r, d in sorted(devs.items())},
                           "host": "sim", "pid": 1000 + rank}
    obj.update(plan)
    obj["reservations"] = {str(r): [(_base(r) if base is None else base)
                                    if r == rank and reserved else None,
                                    slot * (1 + len(c.sources[r]))]
                           for r in range(c.ranks)}
    obj.update(extra)
    return obj


class _Objects:
    """The objects one process's events name: its VAs in :func:`sim_plan` and handle
    ids (counted from 1000 per process)."""

    def __init__(self, c: GroupConstants, p: int) -> None:
        plan = sim_plan(c)
        self.slot = plan["slot"]
        planes = {x[0]: x[1] for x in plan["planes"]}
        regions = {x[0]: x[1] for x in plan["regions"]}
        self.length = [x[2] for x in plan["allocations"]]
        self.off = {(a, "plane"): planes[x[0]] + x[1] for a, x in enumerate(plan["allocations"])}
        self.off.update({(a, "alias"): regions[x[3]] + x[4]
                         for a, x in enumerate(plan["allocations"]) if x[3] is not None})
        self.base = _base(p)
        self.res = self.slot * (1 + len(c.sources[p]))
        self.slot_of = {o: k + 1 for k, o in enumerate(c.sources[p])}
        self.next = 1000
        self.own: dict[int, int] = {}
        self.imp: dict[tuple[int, int], int] = {}

    def va(self, e: Args, m: str) -> int:
        k = 0 if e.owner is None else self.slot_of[e.owner]
        return self.base + k * self.slot + self.off[(e.alloc, m)]  # type: ignore[index]

    def of(self, action: str, e: Args, ok: bool) -> tuple[Any, Any, Any]:
        """(va, size, handle) of the event; applies its effect when ``ok``."""
        if action in ("Reserve", "Free"):   # (a failed Reserve got no VA, as the runtime's)
            return (self.base if ok or action == "Free" else None), self.res, None
        if e.alloc is None or action == "Send":
            return None, None, None
        n = self.length[e.alloc]
        key = (e.owner, e.alloc)
        if action in ("Create", "Import"):
            h = None
            if ok:
                h, self.next = self.next, self.next + 1
                if action == "Create":
                    self.own[e.alloc] = h
                else:
                    self.imp[key] = h  # type: ignore[index]
            return None, n, h
        if action == "Export":
            return None, n, self.own[e.alloc]
        if action in ("Release", "ImportRelease"):
            h = (self.own if action == "Release" else self.imp).pop(  # type: ignore[call-overload]
                e.alloc if action == "Release" else key)
            return None, None, h
        m = {"Map": "plane", "MapAlias": "alias"}.get(action, e.mapping or "plane")
        h = None
        if ok and action in ("Map", "MapAlias"):
            h = self.own[e.alloc]
        elif ok and action == "ImportMap":
            h = self.imp[key]  # type: ignore[index]
        return self.va(e, m), n, h


def _forward_program(c: GroupConstants, p: int) -> Iterator[tuple[str, Args]]:
    own = frozenset({p})
    yield "Reserve", Args()
    for a in range(c.allocs):
        yield "Create", Args(alloc=a)
        yield "Map", Args(alloc=a)
        if a in c.aliased:
            yield "MapAlias", Args(alloc=a)
        yield "Grant", Args(alloc=a, mapping="plane", devices=own)
        if a in c.aliased:
            yield "Grant", Args(alloc=a, mapping="alias", devices=own)
    for a in range(c.allocs if c.importers[p] else 0):  # nobody imports: no export
        yield "Export", Args(alloc=a)
        for i in sorted(c.importers[p]):
            yield "Send", Args(alloc=a, to=i)
    for o in c.sources[p]:
        for a in range(c.allocs):
            kinds = c.import_kinds(a)
            yield "Import", Args(owner=o, alloc=a)
            for m in kinds:
                yield "ImportMap", Args(owner=o, alloc=a, mapping=m)
            for m in kinds:
                yield "ImportGrant", Args(owner=o, alloc=a, mapping=m, devices=own)
    yield "RankReady", Args()


def _unwind_program(c: GroupConstants, g: GroupState, p: int) -> Iterator[tuple[str, Args]]:
    s = g.procs[p]
    for (o, a) in list(reversed(s.imported)):
        for m in ("alias", "plane"):
            if (o, a, m) in s.import_mapped:
                yield "ImportUnmap", Args(owner=o, alloc=a, mapping=m)
        yield "ImportRelease", Args(owner=o, alloc=a)
    for a in sorted(s.created, reverse=True):
        if a in s.alias_mapped:
            yield "Unmap", Args(alloc=a, mapping="alias")
        if a in s.mapped:
            yield "Unmap", Args(alloc=a, mapping="plane")
        yield "Release", Args(alloc=a)
    if s.va:
        yield "Free", Args()


class _Proc:
    """One process's program: forward steps, then vote, decide, and the end."""

    def __init__(self, c: GroupConstants, p: int, fail_at: int | None, crash_after: int | None,
                 shutdown: bool) -> None:
        self.c, self.p = c, p
        self.fwd = _forward_program(c, p)
        self.pending: tuple[str, Args] | None = None
        self.forward_steps = 0
        self.fail_at, self.crash_after, self.shutdown = fail_at, crash_after, shutdown
        self.unwind: Iterator[tuple[str, Args]] | None = None
        self.emitted = 0
        self.done = False

    def next(self, g: GroupState) -> tuple[str, Args, bool] | None:
        """The next intended (action, args, ok), or None when the process is finished."""
        c, p, s = self.c, self.p, g.procs[self.p]
        if s.phase == "Allocating":
            if s.decision != "none":
                return ("Publish" if s.decision == "publish" else "Abort"), Args(), True
            if s.vote != "none":
                missing = frozenset(q for q, t in enumerate(g.procs) if t.vote == "none")
                failed = frozenset(q for q, t in enumerate(g.procs) if t.vote == "failed")
                d = "publish" if not missing and not failed else "abort"
                return "Decide", Args(decision=d, failed=failed, missing=missing), True
            if s.failed or s.ready:
                return "Vote", Args(ready=s.ready and not s.failed), True
            if self.pending is None:
                self.pending = next(self.fwd)
            name, e = self.pending
            if name == "RankReady":
                return name, e, True
            ok = self.fail_at is None or self.forward_steps != self.fail_at
            if ok and name == "Import":
                owner = g.procs[e.owner]  # type: ignore[index]
                if (e.alloc, p) not in owner.sent and (owner.crashed or owner.failed):
                    return name, e, False  # the deadline: the owner will never send
            return name, e, ok
        if s.phase in ("Aborting", "ShuttingDown"):
            if self.unwind is None:
                self.unwind = _unwind_program(c, g, p)
            nxt = next(self.unwind, None)
            if nxt is not None:
                return nxt[0], nxt[1], True
            return ("AbortComplete" if s.phase == "Aborting" else "ShutdownComplete"), \
                Args(), True
        if s.phase == "Published" and self.shutdown:
            return "Unpublish", Args(), True
        return None


def _event(c: GroupConstants, g: GroupState, p: int, seq: int, action: str, e: Args,
           result: str | None, device: int, objs: tuple[Any, Any, Any]) -> str:
    args: dict[str, Any] = {}
    if e.owner is not None:
        args["owner"] = e.owner
    if e.alloc is not None:
        args["alloc"] = e.alloc
    if e.mapping is not None:
        args["mapping"] = e.mapping
    if e.devices is not None:
        args["devices"] = [device]
    if e.to is not None:
        args["to"] = e.to
    if e.ready is not None:
        args["ready"] = e.ready
        if not e.ready:
            args["error"] = "a step of this rank failed"
    if e.decision is not None:
        args.update(decision=e.decision, failed=sorted(e.failed or ()),
                    missing=sorted(e.missing or ()))
    va, size, handle = objs
    return format_group_event({
        "seq": seq, "t": round(seq * 1e-5, 6), "rank": p, "action": action, "args": args,
        "call": CALLS.get(action), "result": result, "device": device, "va": va,
        "size": size, "handle": handle, "state": g.procs[p].counters()})


def simulate_group(c: GroupConstants, *, fail_at: Mapping[int, int] | None = None,
                   crash_after: Mapping[int, int] | None = None, shutdown: bool = True,
                   devices: Mapping[int, int] | None = None) -> list[str]:
    """One NDJSON text per rank for a run of the group model.

    ``fail_at[p] = k``: the k-th forward step (0-based) of process p fails.
    ``crash_after[p] = k``: process p's file stops after k events (a crash).
    ``shutdown``: published processes shut down again. ``devices``: rank -> ordinal.
    """
    devs = dict(devices) if devices is not None else {r: r for r in range(c.ranks)}
    g = initial_group(c)
    procs = [_Proc(c, p, (fail_at or {}).get(p), (crash_after or {}).get(p), shutdown)
             for p in range(c.ranks)]
    objects = [_Objects(c, p) for p in range(c.ranks)]
    lines: list[list[str]] = [[json.dumps(group_header(
        c, p, devs, reserved=(fail_at or {}).get(p) != 0))] for p in range(c.ranks)]
    moved = True
    while moved:
        moved = False
        for pr in procs:
            p = pr.p
            while not pr.done:
                if pr.crash_after is not None and pr.emitted >= pr.crash_after:
                    crash(g, p)
                    pr.done = True
                    break
                nxt = pr.next(g)
                if nxt is None:
                    pr.done = True
                    break
                action, e, ok = nxt
                why = step(c, g, p, action, e, ok)
                if why is WAIT:
                    break
                if why:
                    raise AssertionError(f"generator bug: r{p} {action} {e}: {why}")
                if CALLS.get(action) is not None:
                    if ok:
                        result = "SUCCESS" if action in _SOCKET_OR_GROUP else "CUDA_SUCCESS"
                    else:
                        result = TIMEOUT_RESULT if action == "Import" and \
                            pr.forward_steps != pr.fail_at else FAIL_RESULT
                else:
                    result = None
                if pr.pending is not None and pr.pending[0] == action and \
                        g.procs[p].vote == "none":
                    pr.pending = None
                    pr.forward_steps += 1
                objs = objects[p].of(action, e, result is None or result in (
                    "SUCCESS", "CUDA_SUCCESS"))
                lines[p].append(_event(c, g, p, pr.emitted, action, e, result, devs[p], objs))
                pr.emitted += 1
                moved = True
    stuck = [pr.p for pr in procs if not pr.done]
    if stuck:
        raise AssertionError(f"generator bug: processes {stuck} never finished")
    return ["\n".join(ls) + "\n" for ls in lines]


def write_group(texts: list[str], directory: str | Path, stem: str = "rank") -> list[Path]:
    """Write the per-rank texts as ``<stem><r>.ndjson`` files in ``directory``."""
    d = Path(directory)
    d.mkdir(parents=True, exist_ok=True)
    out = []
    for r, text in enumerate(texts):
        path = d / f"{stem}{r}.ndjson"
        path.write_text(text, encoding="utf-8")
        out.append(path)
    return out
