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
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Iterator, Mapping

from kvgrant.conformance.group_model import (WAIT, Args, GroupConstants, GroupState, crash,
                                             initial_group, step)

__all__ = ["CALLS", "group_header", "simulate_group", "write_group"]

#: The call each action records (docs/group-trace.md); None for model-only steps.
CALLS: Mapping[str, str | None] = {
    "Reserve": "cuMemAddressReserve", "Create": "cuMemCreate", "Map": "cuMemMap",
    "MapAlias": "cuMemMap", "Grant": "cuMemSetAccess",
    "Export": "cuMemExportToShareableHandle", "Send": "sendmsg",
    "Import": "cuMemImportFromShareableHandle", "ImportMap": "cuMemMap",
    "ImportGrant": "cuMemSetAccess", "ImportUnmap": "cuMemUnmap",
    "ImportRelease": "cuMemRelease", "Unmap": "cuMemUnmap", "Release": "cuMemRelease",
    "Free": "cuMemAddressFree", "Vote": "all_gather",
}
_SOCKET_OR_GROUP = frozenset({"Send", "Vote"})  # result SUCCESS, not a CUresult
FAIL_RESULT = "CUDA_ERROR_OUT_OF_MEMORY"
TIMEOUT_RESULT = "TIMEOUT"


def group_header(c: GroupConstants, rank: int, devices: Mapping[int, int] | None = None,
                 **extra: Any) -> dict[str, Any]:
    """The header line of ``rank``'s file."""
    devs = dict(devices) if devices is not None else {r: r for r in range(c.ranks)}
    obj: dict[str, Any] = {"kind": "header", "version": 1, "mode": "group", "rank": rank,
                           "procs": c.ranks, "ranks": c.ranks, "allocs": c.allocs,
                           "aliased": sorted(c.aliased), "owner_only": sorted(c.owner_only),
                           "importers": {str(r): sorted(s) for r, s in enumerate(c.importers)},
                           "declared_readers": {str(r): sorted(s) for r, s
                                                in enumerate(c.declared_readers)},
                           "devices": {str(r): d for r, d in sorted(devs.items())},
                           "host": "sim", "pid": 1000 + rank}
    obj.update(extra)
    return obj


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
           result: str | None, device: int) -> str:
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
    return ('{"kind": "event", "seq": %d, "t": %s, "rank": %d, "action": "%s", "args": %s, '
            '"call": %s, "result": %s, "device": %d, "va": null, "size": null, '
            '"state": {%s}}' % (seq, round(seq * 1e-5, 6), p, action, json.dumps(args),
                                json.dumps(CALLS.get(action)), json.dumps(result), device,
                                g.procs[p].state_text()))


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
    lines: list[list[str]] = [[json.dumps(group_header(c, p, devs))] for p in range(c.ranks)]
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
                if action in CALLS and action not in ("RankReady",):
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
                lines[p].append(_event(c, g, p, pr.emitted, action, e, result, devs[p]))
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
