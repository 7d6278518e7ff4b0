"""Trace mutants for the conformance self-test, and valid reference traces to mutate.

Each mutant is a valid trace with one ordering bug injected (drop a grant, grant to a
rank that is not an importer, publish before the last rank is ready, unmap the backing
before its alias, skip a release, duplicate an event, swap two steps illegally),
together with the index at which any correct engine must reject it. The expected
index is derived from where the bug was put, never from an engine's answer.

:func:`reference_trace` writes a valid trace in the runtime's order (per rank:
Reserve, then per allocation Create, Map, MapAlias, Grant plane, Grant alias; then
RankReady; Publish; shutdown or abort in reverse). Its recorded states come from the
model, so it is valid by construction; it serves tests and benchmarks that must not
wait for a GPU.
"""

from __future__ import annotations

import copy
import dataclasses
import json
from dataclasses import dataclass
from typing import Any, Callable, Iterable, Mapping, Sequence

from kvgrant.conformance.model import Action, Constants, apply, initial_state
from kvgrant.conformance.trace_io import MAX_TRACE_ALLOCS, MAX_TRACE_RANKS, RANK_ACTIONS, \
    Header, Trace, header_to_json, parse_trace_lines, require_trace
from kvgrant.conformance.trace_plan import Layout, PlanAlloc, derive_importers
from kvgrant.errors import ArgumentError

__all__ = [
    "G",
    "MUTATIONS",
    "Mutant",
    "MutationScore",
    "OBJECT_MUTATIONS",
    "handle_id",
    "make_header",
    "mutants",
    "mutation_score",
    "reference_trace",
    "synthetic_layout",
    "trace_from_actions",
    "trace_from_events",
]

FAIL_RESULT = "CUDA_ERROR_OUT_OF_MEMORY"


@dataclass(frozen=True)
class Mutant:
    """A mutated trace and the 0-based event index where it must be rejected."""

    name: str
    trace: Trace
    expected_index: int
    description: str


#: Granularity of the synthetic plans of :func:`make_header` (as on H200).
G = 2 << 20
_BASE0 = 1 << 40          # rank r reserves at _BASE0 + r * _BASE_STRIDE
_BASE_STRIDE = 1 << 36


def _groups_of(ranks: int, imp: tuple[frozenset[int], ...]) -> list[list[int]] | None:
    """Import groups that yield exactly ``imp`` (None when it is not a partition, e.g.
    asymmetric importers, which no geometry can declare)."""
    groups: list[list[int]] = []
    done: set[int] = set()
    for r in range(ranks):
        g = imp[r] | {r}
        if any(imp[x] | {x} != g for x in g):
            return None
        if r not in done and len(g) > 1:
            groups.append(sorted(g))
        done |= g
    return groups


def synthetic_layout(allocs: int, aliased: frozenset[int], owner_only: frozenset[int],
                     ranks: int, groups: list[list[int]],
                     declared: dict[int, tuple[int, ...]] | None) -> Layout:
    """A plan for model constants: allocation a is (a % 3 + 1) granules of plane "kv";
    aliased ones back region "shared" (importers) or "owned" (owner-only), in order."""
    lengths = [(a % 3 + 1) * G for a in range(allocs)]
    plane_bytes = sum(lengths)
    regions: dict[str, list[int]] = {"shared": [], "owned": []}
    for a in sorted(aliased):
        regions["owned" if a in owner_only else "shared"].append(a)
    off = plane_bytes
    region_table: dict[str, tuple[int, int, str]] = {}
    for name, members in regions.items():
        if members:
            size = sum(lengths[a] for a in members)
            region_table[name] = (off, size, "owner" if name == "owned" else "importers")
            off += size
    plan: list[PlanAlloc] = []
    pos = 0
    roff = {name: 0 for name in regions}
    for a in range(allocs):
        region = next((n for n, m in regions.items() if a in m), None)
        ro = None
        if region is not None:
            ro = roff[region]
            roff[region] += lengths[a]
        plan.append(PlanAlloc("kv", pos, lengths[a], region, ro))
        pos += lengths[a]
    map_off = tuple(p.plane_offset for p in plan)
    alias_off = tuple(-1 if p.region is None else region_table[p.region][0] + p.region_offset
                      for p in plan)  # type: ignore[operator]
    return Layout(G, None, {"kv": (0, plane_bytes)}, region_table, tuple(plan),
                  {r: (_BASE0 + r * _BASE_STRIDE, off) for r in range(ranks)},
                  tuple(tuple(g) for g in groups), declared, map_off, alias_off)


def _index_set(argument: str, value: Any, size: int, what: str) -> frozenset[int]:
    """``value`` (a collection of ints in 0..size-1, e.g. alloc indices) as a set, else an
    ArgumentError naming ``argument`` (a string was iterated as its characters)."""
    if isinstance(value, (str, bytes, Mapping)) or not isinstance(value, Iterable):
        raise ArgumentError(f"make_header: {argument} = {repr(value)[:80]} "
                            f"({type(value).__name__}): must be a list of {what} indices",
                            argument=argument, value=value)
    items = list(value)
    bad = [x for x in items if type(x) is not int or not 0 <= x < size]
    if bad:
        raise ArgumentError(f"make_header: {argument} = {repr(items)[:80]}: {bad[0]!r} is not "
                            f"a valid {what} (an integer in 0..{size - 1})", argument=argument,
                            value=value)
    return frozenset(items)


def _rank_sets(argument: str, value: Any, ranks: int) -> dict[int, frozenset[int]] | None:
    """``value`` (None, or a mapping rank -> ranks) with every rank checked."""
    if value is None:
        return None
    if not isinstance(value, Mapping):
        raise ArgumentError(f"make_header: {argument} = {repr(value)[:80]} "
                            f"({type(value).__name__}): must be None or a dict rank -> list "
                            "of ranks", argument=argument, value=value)
    out: dict[int, frozenset[int]] = {}
    for r, members in value.items():
        if type(r) is not int or not 0 <= r < ranks:
            raise ArgumentError(f"make_header: {argument} has key {r!r}: not a rank (an "
                                f"integer in 0..{ranks - 1})", argument=argument, value=value)
        out[r] = _index_set(f"{argument}[{r}]", members, ranks, "rank")
    return out


def make_header(ranks: int, allocs: int, aliased: Iterable[int] = (),
                owner_only: Iterable[int] = (), importers: dict[int, Iterable[int]] | None = None,
                declared_readers: dict[int, Iterable[int]] | None = None,
                **extra: Any) -> Header:
    """A header from Python values; importers default to every other rank.

    When the importers are import groups (a partition, as every geometry declares),
    the header is version 2 with a synthetic plan (:func:`synthetic_layout`) and its
    importers are derived from the groups; otherwise it is a model-only version-1
    header (no objects), which only the in-memory engines accept. Bad values are an
    :class:`~kvgrant.errors.ArgumentError` under the rules a trace's header keeps
    (``make_header(2, 3, aliased=[7])`` raised IndexError, ``make_header(-1, 3)`` made
    a header of -1 ranks).
    """
    for name, value, most in (("ranks", ranks, MAX_TRACE_RANKS),
                              ("allocs", allocs, MAX_TRACE_ALLOCS)):
        if type(value) is not int or not 1 <= value <= most:
            raise ArgumentError(f"make_header: {name} = {value!r} ({type(value).__name__}): "
                                f"must be an integer in 1..{most:,}", argument=name,
                                value=value)
    al = _index_set("aliased", aliased, allocs, "alloc")
    oo = _index_set("owner_only", owner_only, allocs, "alloc")
    if not oo <= al:
        raise ArgumentError(f"make_header: owner_only = {sorted(oo)}: alloc {min(oo - al)} is "
                            "not aliased (owner_only must be a subset of aliased)",
                            argument="owner_only", value=owner_only)
    imp_given = _rank_sets("importers", importers, ranks)
    dec_given = _rank_sets("declared_readers", declared_readers, ranks)
    imp = tuple(imp_given.get(r, frozenset()) if imp_given is not None
                else frozenset(range(ranks)) - {r} for r in range(ranks))
    dec = tuple(dec_given[r] if dec_given and r in dec_given else imp[r] | {r}
                for r in range(ranks))
    for r in range(ranks):
        if r in imp[r]:
            raise ArgumentError(f"make_header: importers[{r}] = {sorted(imp[r])}: a rank does "
                                "not import its own memory", argument="importers",
                                value=importers)
        if not imp[r] <= dec[r]:
            raise ArgumentError(f"make_header: declared_readers[{r}] = {sorted(dec[r])}: "
                                f"importer {min(imp[r] - dec[r])} is not a declared reader "
                                "(a rank's declared readers include its importers)",
                                argument="declared_readers", value=declared_readers)
    groups = _groups_of(ranks, imp)
    layout = None
    if groups is not None:
        layout = synthetic_layout(allocs, al, oo, ranks, groups,
                                  {r: tuple(sorted(dec[r])) for r in range(ranks)})
        imp = derive_importers(ranks, layout.import_groups)
    return Header(ranks=ranks, allocs=allocs, aliased=al, owner_only=oo, importers=imp,
                  declared_readers=dec, devices={r: r for r in range(ranks)},
                  version=1 if layout is None else 2, extra=dict(extra), layout=layout)


def trace_from_events(header: Header, events: Sequence[dict[str, Any]],
                      source: str = "<mutant>") -> Trace:
    """Renumber ``seq`` and parse header + raw event dicts into a validated Trace."""
    lines = [json.dumps(header_to_json(header))]
    for i, ev in enumerate(events):
        obj = dict(ev)
        obj["seq"] = i
        lines.append(json.dumps(obj))
    return parse_trace_lines(lines, source=source, model_only=header.layout is None)


def _plan_actions(c: Constants) -> list[Action]:
    out: list[Action] = [Action("Reserve", r) for r in range(c.ranks)]
    for r in range(c.ranks):
        for a in range(c.allocs):
            out += [Action("Create", r, a), Action("Map", r, a)]
            if a in c.aliased:
                out.append(Action("MapAlias", r, a))
            out.append(Action("Grant", r, a, "plane"))
            if a in c.aliased:
                out.append(Action("Grant", r, a, "alias"))
        out.append(Action("RankReady", r))
    out.append(Action("Publish"))
    return out


def _unwind_actions(c: Constants, made: dict[int, set[tuple[str, int, str | None]]],
                    reserved: set[int]) -> list[Action]:
    out: list[Action] = []
    for r in reversed(range(c.ranks)):
        for a in reversed(range(c.allocs)):
            if ("alias", a, None) in made[r]:
                out.append(Action("Unmap", r, a, "alias"))
            if ("plane", a, None) in made[r]:
                out.append(Action("Unmap", r, a, "plane"))
            if ("create", a, None) in made[r]:
                out.append(Action("Release", r, a))
        if r in reserved:
            out.append(Action("Free", r))
    return out


def reference_trace(header: Header, *, fail_at: int | None = None,
                    shutdown: bool = True, source: str = "<reference>") -> Trace:
    """A valid trace for ``header``'s constants.

    ``fail_at`` makes the forward driver step with that ordinal fail (then Abort and
    unwind, ending Aborted); otherwise the trace publishes and, with ``shutdown``,
    shuts down again. A ``fail_at`` past the last forward step is an ArgumentError
    naming the range (it was ignored: the trace published as if nothing failed).
    """
    if not isinstance(header, Header):
        raise ArgumentError(f"reference_trace: header = {repr(header)[:80]} "
                            f"({type(header).__name__}): must be a Header (make one with "
                            "make_header(ranks, allocs, ...); a Trace's is trace.header)",
                            argument="header", value=header)
    c = Constants.from_header(header)
    plan = _plan_actions(c)
    steps = sum(1 for act in plan if act.name not in ("RankReady", "Publish"))
    if fail_at is not None and (type(fail_at) is not int or not 0 <= fail_at < steps):
        raise ArgumentError(f"reference_trace: fail_at = {fail_at!r} "
                            f"({type(fail_at).__name__}): must be None or an integer in "
                            f"0..{steps - 1} (the ordinal of one of the header's {steps:,} "
                            "forward driver calls)", argument="fail_at", value=fail_at)
    if not isinstance(shutdown, bool):
        raise ArgumentError(f"reference_trace: shutdown = {shutdown!r}: must be True or False",
                            argument="shutdown", value=shutdown)
    acts: list[tuple[Action, str | None]] = []
    made: dict[int, set[tuple[str, int, str | None]]] = {r: set() for r in range(c.ranks)}
    reserved: set[int] = set()

    def emit(act: Action, result: str | None) -> None:
        acts.append((act, result))

    driver_steps = 0
    for act in plan:
        if act.name in ("RankReady", "Publish"):
            emit(act, None)
            continue
        if fail_at is not None and driver_steps == fail_at:
            emit(Action("Fail", act.rank, act.alloc, act.mapping, step=act.name), FAIL_RESULT)
            emit(Action("Abort"), None)
            for u in _unwind_actions(c, made, reserved):
                emit(u, "CUDA_SUCCESS")
            emit(Action("AbortComplete"), None)
            return trace_from_actions(header, acts, source)
        driver_steps += 1
        emit(act, "CUDA_SUCCESS")
        key = {"Create": ("create", act.alloc, None), "Map": ("plane", act.alloc, None),
               "MapAlias": ("alias", act.alloc, None)}.get(act.name)
        if key:
            made[act.rank].add(key)
        if act.name == "Reserve":
            reserved.add(act.rank)
    if shutdown:
        emit(Action("Unpublish"), None)
        for u in _unwind_actions(c, made, reserved):
            emit(u, "CUDA_SUCCESS")
        emit(Action("ShutdownComplete"), None)
    return trace_from_actions(header, acts, source)


def _bases_of(header: Header, reserved: set[int | None]) -> Header:
    """``header`` with the bases of ranks that never reserved made null, as the runtime
    writes them (a base names a reservation the trace made)."""
    lay = header.layout
    if lay is None or all(r in reserved for r in lay.reservations):
        return header
    res = {r: (b if r in reserved else None, n) for r, (b, n) in lay.reservations.items()}
    return dataclasses.replace(header, layout=dataclasses.replace(lay, reservations=res))


def trace_from_actions(header: Header, actions: Iterable[tuple[Action, str | None]],
                       source: str = "<actions>") -> Trace:
    """Run model actions from Init and record each as a trace event (runtime format).

    ``actions`` pairs each action with its driver result (None for model-only steps);
    a ``Fail`` action needs ``step`` and the failed call's arguments. The recorded
    states come from the model, so the actions must be enabled in turn. A rank with no
    successful Reserve among them gets a null base, as the runtime writes its header.
    """
    actions = list(actions)
    header = _bases_of(header, {a.rank for a, result in actions  # type: ignore[misc]
                                if a.name == "Reserve" and result == "CUDA_SUCCESS"})
    c = Constants.from_header(header)
    s = initial_state(c)
    rank_dev = dict(header.devices)
    lay = header.layout
    events: list[dict[str, Any]] = []
    for act, result in actions:
        ev_action = act.step if act.name in ("Fail", "UndoFail") else act.name
        objs = _objects(lay, act, ev_action) if lay is not None and act.rank is not None \
            else {}
        apply(c, s, act)
        args: dict[str, Any] = {}
        if act.alloc is not None:
            args["alloc"] = act.alloc
        if act.mapping is not None:
            args["mapping"] = act.mapping
        if ev_action == "Grant":
            args["devices"] = sorted(rank_dev[d] for d in c.grant_set(act.rank, act.alloc,
                                                                      act.mapping))
        if ev_action == "Abort":
            args["failed_rank"] = next(i for i, r in enumerate(s.ranks) if r.failed)
        state: dict[str, Any] = {"phase": s.phase}
        if act.rank is not None:
            state.update(s.ranks[act.rank].counters())
        ev = {"kind": "event", "seq": len(events), "rank": act.rank,
              "action": ev_action, "args": args,
              "call": RANK_ACTIONS.get(ev_action), "result": result,
              "device": None if act.rank is None else rank_dev[act.rank],
              "t": round(len(events) * 1e-5, 6), "state": state}
        ev.update(objs)
        events.append(ev)
    return trace_from_events(header, events, source)


def handle_id(rank: int, alloc: int) -> int:
    """The handle id a synthetic trace gives allocation ``alloc`` of ``rank``."""
    return 1000 * rank + alloc + 1


def _objects(lay: Layout, act: Action, action: str) -> dict[str, Any]:
    """The va, size and handle of a synthetic event, as the plan says (a failed call
    names the same objects as the call would have)."""
    r, a = act.rank, act.alloc
    base, res = lay.reservations[r]  # type: ignore[index]
    if action in ("Reserve", "Free"):
        return {"va": base, "size": res, "handle": None}
    if a is None:
        return {"va": None, "size": None, "handle": None}
    n = lay.allocations[a].length
    ok = act.name not in ("Fail", "UndoFail")
    h = handle_id(r, a)  # type: ignore[arg-type]
    if action == "Create":
        return {"va": None, "size": n, "handle": h if ok else None}
    if action in ("Map", "MapAlias"):
        return {"va": lay.va(r, a, "plane" if action == "Map" else "alias"), "size": n,  # type: ignore[arg-type]
                "handle": h}
    if action in ("Grant", "Unmap"):
        return {"va": lay.va(r, a, act.mapping or "plane"), "size": n, "handle": None}  # type: ignore[arg-type]
    if action == "Release":
        return {"va": None, "size": None, "handle": h}
    return {}


# --- mutations ---------------------------------------------------------------------------
# Each takes the raw event dicts (a deep copy) and the header; returns (events, index,
# description) or None when the trace offers no place for this bug.

Raw = list[dict[str, Any]]


def _first(evs: Raw, pred: Callable[[int, dict[str, Any]], bool]) -> int | None:
    return next((i for i, e in enumerate(evs) if pred(i, e)), None)


def _ok(e: dict[str, Any]) -> bool:
    return e.get("result") in (None, "CUDA_SUCCESS")


def _drop_grant(evs: Raw, h: Header):
    # a grant followed by an event of the same rank: that event's recorded grants
    # counter (or RankReady's guard) exposes the drop at the same index
    i = _first(evs, lambda i, e: e["action"] == "Grant" and _ok(e) and i + 1 < len(evs)
               and evs[i + 1]["rank"] == e["rank"])
    if i is None:
        return None
    del evs[i]
    return evs, i, f"dropped the Grant at event {i}"


def _grant_non_importer(evs: Raw, h: Header):
    for i, e in enumerate(evs):
        if e["action"] != "Grant" or not _ok(e):
            continue
        r = e["rank"]
        outsiders = [d for d in range(h.ranks) if d != r and d not in h.importers[r]
                     and h.devices[d] not in e["args"]["devices"]]
        if outsiders:
            d = outsiders[0]
            e["args"]["devices"] = sorted(e["args"]["devices"] + [h.devices[d]])
            e["state"]["grants"] += 1
            return evs, i, f"Grant at event {i} also grants rank {d} (not an importer)"
    return None


def _publish_early(evs: Raw, h: Header):
    p = _first(evs, lambda i, e: e["action"] == "Publish")
    if p is None:
        return None
    last_ready = max((i for i, e in enumerate(evs[:p]) if e["action"] == "RankReady"),
                     default=None)
    if last_ready is None:
        return None
    pub = evs.pop(p)
    evs.insert(last_ready, pub)
    return evs, last_ready, f"Publish moved before the last RankReady (event {last_ready})"


def _unmap_backing_first(evs: Raw, h: Header):
    i = _first(evs, lambda i, e: e["action"] == "Unmap" and e["args"]["mapping"] == "alias"
               and i + 1 < len(evs) and evs[i + 1]["action"] == "Unmap"
               and evs[i + 1]["args"]["mapping"] == "plane"
               and evs[i + 1]["args"]["alloc"] == e["args"]["alloc"])
    if i is None:
        return None
    evs[i], evs[i + 1] = evs[i + 1], evs[i]
    return evs, i, f"plane Unmap moved before its alias Unmap (event {i})"


def _skip_release(evs: Raw, h: Header):
    i = _first(evs, lambda i, e: e["action"] == "Release")
    if i is None:
        return None
    del evs[i]
    return evs, i, f"dropped the Release at event {i}"


def _duplicate_event(evs: Raw, h: Header):
    i = _first(evs, lambda i, e: e["action"] in ("Create", "Map") and _ok(e))
    if i is None:
        return None
    evs.insert(i + 1, copy.deepcopy(evs[i]))
    return evs, i + 1, f"event {i} ({evs[i]['action']}) repeated at {i + 1}"


def _reorder_steps(evs: Raw, h: Header):
    i = _first(evs, lambda i, e: e["action"] == "Create" and _ok(e) and i + 1 < len(evs)
               and evs[i + 1]["action"] == "Map" and evs[i + 1]["rank"] == e["rank"])
    if i is None:
        return None
    evs[i], evs[i + 1] = evs[i + 1], evs[i]
    return evs, i, f"Map swapped before its Create (event {i})"


# --- object-identity mutations (version-2 traces): the right step on the wrong object ---

def _nth(evs: Raw, action: str, k: int = 0, **match: Any) -> int | None:
    """Index of the k-th successful ``action`` event whose args include ``match``."""
    hits = [i for i, e in enumerate(evs) if e["action"] == action and _ok(e)
            and all(e["args"].get(key) == v for key, v in match.items())]
    return hits[k] if len(hits) > k else None


def _set(evs: Raw, i: int | None, desc: str, **fields: Any):
    if i is None:
        return None
    evs[i].update(fields)
    return evs, i, desc.format(i=i, e=evs[i])


def _map_overlapping_va(evs: Raw, h: Header):
    first = _nth(evs, "Map")
    i = _nth(evs, "Map", 1)
    if first is None or i is None or evs[first]["rank"] != evs[i]["rank"]:
        return None
    return _set(evs, i, "Map at event {i} placed at the VA of the rank's first plane mapping "
                "(overlapping it)", va=evs[first]["va"])


def _map_outside_reservation(evs: Raw, h: Header):
    i = _nth(evs, "Map")
    if i is None or h.layout is None:
        return None
    base, size = h.layout.reservations[evs[i]["rank"]]
    return _set(evs, i, "Map at event {i} placed just past the end of the reservation",
                va=base + size)  # type: ignore[operator]


def _alias_wrong_va(evs: Raw, h: Header):
    i = _nth(evs, "MapAlias")
    return None if i is None else _set(evs, i, "MapAlias at event {i} one granule off",
                                       va=evs[i]["va"] + G)


def _alias_wrong_size(evs: Raw, h: Header):
    i = _nth(evs, "MapAlias")
    return None if i is None else _set(evs, i, "MapAlias at event {i} one granule longer",
                                       size=evs[i]["size"] + G)


def _wrong_device(evs: Raw, h: Header):
    i = _nth(evs, "Create")
    if i is None or h.ranks < 2:
        return None
    other = h.devices[(evs[i]["rank"] + 1) % h.ranks]
    return _set(evs, i, "Create at event {i} on another rank's device", device=other)


def _unmap_wrong_va(evs: Raw, h: Header):
    i = _nth(evs, "Unmap")
    return None if i is None else _set(evs, i, "Unmap at event {i} one granule off",
                                       va=evs[i]["va"] + G)


def _grant_other_range(evs: Raw, h: Header):
    i = _nth(evs, "Grant", mapping="alias")
    if i is None:
        return None
    plane = next(e for e in evs[:i] if e["action"] == "Map" and e["rank"] == evs[i]["rank"]
                 and e["args"]["alloc"] == evs[i]["args"]["alloc"])
    return _set(evs, i, "alias Grant at event {i} applied to the plane mapping's range",
                va=plane["va"])


def _grant_wrong_size(evs: Raw, h: Header):
    i = _nth(evs, "Grant")
    return None if i is None else _set(evs, i, "Grant at event {i} over one granule more",
                                       size=evs[i]["size"] + G)


def _map_wrong_handle(evs: Raw, h: Header):
    first = _nth(evs, "Create")
    i = _nth(evs, "Map", 1)
    if first is None or i is None or evs[first]["rank"] != evs[i]["rank"]:
        return None
    return _set(evs, i, "Map at event {i} maps the rank's first handle, not its own",
                handle=evs[first]["handle"])


def _create_live_handle(evs: Raw, h: Header):
    first = _nth(evs, "Create")
    i = _nth(evs, "Create", 1)
    if first is None or i is None or evs[first]["rank"] != evs[i]["rank"]:
        return None
    return _set(evs, i, "Create at event {i} returns a handle that is still live",
                handle=evs[first]["handle"])


def _release_wrong_handle(evs: Raw, h: Header):
    i = _nth(evs, "Release")
    return None if i is None else _set(evs, i, "Release at event {i} names another handle",
                                       handle=evs[i]["handle"] + 7919)


def _release_live_mapping(evs: Raw, h: Header):
    i = _first(evs, lambda i, e: e["action"] == "Unmap" and e["args"]["mapping"] == "plane"
               and i + 1 < len(evs) and evs[i + 1]["action"] == "Release"
               and evs[i + 1]["args"]["alloc"] == e["args"]["alloc"])
    if i is None:
        return None
    evs[i], evs[i + 1] = evs[i + 1], evs[i]
    return evs, i, f"Release at event {i} while its plane mapping is live"


def _reserve_wrong_base(evs: Raw, h: Header):
    i = _nth(evs, "Reserve")
    return None if i is None else _set(evs, i, "Reserve at event {i} elsewhere than the "
                                       "header's base", va=evs[i]["va"] + 1024 * G)


def _free_wrong_size(evs: Raw, h: Header):
    i = _nth(evs, "Free")
    return None if i is None else _set(evs, i, "Free at event {i} of half the reservation",
                                       size=evs[i]["size"] // 2)


def _header_forged_importer(evs: Raw, h: Header):
    """The header lists an overdeclared reader as an importer (a forged ``importers``
    list) and the grants follow it: grants are judged by the import groups."""
    for i, e in enumerate(evs):
        if e["action"] != "Grant" or not _ok(e):
            continue
        r = e["rank"]
        extra = sorted(h.declared_readers[r] - h.importers[r] - {r})
        if not extra or (e["args"]["alloc"] in h.owner_only and e["args"]["mapping"] == "alias"):
            continue
        forged = {str(x): sorted(h.importers[x] | ({extra[0]} if x == r else set()))
                  for x in range(h.ranks)}
        e["args"]["devices"] = sorted(e["args"]["devices"] + [h.devices[extra[0]]])
        e["state"]["grants"] += 1
        return evs, i, (f"header lists declared reader {extra[0]} as rank {r}'s importer; the "
                        f"Grant at event {i} follows it"), {"importers": forged}
    return None


def _complete_after_failed_undo(evs: Raw, h: Header):
    """The runtime mutant "AbortComplete traced although an undo failed" (engine.py):
    the last cuMemAddressFree before AbortComplete / ShutdownComplete fails (its rank
    keeps the VA, as the runtime records it), and the attempt is still declared
    complete. The model refuses the complete event (UndoFailureNeverCompletes)."""
    j = _first(evs, lambda i, e: e["action"] in ("AbortComplete", "ShutdownComplete"))
    if j is None:
        return None
    i = next((k for k in range(j - 1, -1, -1) if evs[k]["action"] == "Free"
              and _ok(evs[k])), None)
    if i is None:
        return None
    r = evs[i]["rank"]
    before = next((e for e in reversed(evs[:i]) if e["rank"] == r), None)
    evs[i]["result"] = "CUDA_ERROR_OUT_OF_MEMORY"
    evs[i]["state"]["va"] = True
    evs[i]["state"]["ready"] = bool(before and before["state"].get("ready"))
    return evs, j, (f"cuMemAddressFree of rank {r} at event {i} failed, yet "
                    f"{evs[j]['action']} is traced at event {j}")


MUTATIONS: dict[str, Callable[[Raw, Header], Any]] = {
    "drop_grant": _drop_grant,
    "grant_non_importer": _grant_non_importer,
    "publish_early": _publish_early,
    "unmap_backing_first": _unmap_backing_first,
    "skip_release": _skip_release,
    "duplicate_event": _duplicate_event,
    "reorder_steps": _reorder_steps,
    "complete_after_failed_undo": _complete_after_failed_undo,
}
#: Mutations of the objects an event names (version-2 traces only).
OBJECT_MUTATIONS: dict[str, Callable[[Raw, Header], Any]] = {
    "map_overlapping_va": _map_overlapping_va,
    "map_outside_reservation": _map_outside_reservation,
    "alias_wrong_va": _alias_wrong_va,
    "alias_wrong_size": _alias_wrong_size,
    "wrong_device": _wrong_device,
    "unmap_wrong_va": _unmap_wrong_va,
    "grant_other_range": _grant_other_range,
    "grant_wrong_size": _grant_wrong_size,
    "header_forged_importer": _header_forged_importer,
    "release_live_mapping": _release_live_mapping,
    "map_wrong_handle": _map_wrong_handle,
    "create_live_handle": _create_live_handle,
    "release_wrong_handle": _release_wrong_handle,
    "reserve_wrong_base": _reserve_wrong_base,
    "free_wrong_size": _free_wrong_size,
}


def mutants(trace: Trace, names: Iterable[str] | None = None) -> list[Mutant]:
    """Every applicable mutant of ``trace`` (a mutation with no place is skipped);
    object mutations apply to version-2 traces only. ``names`` (a list of keys of
    :data:`MUTATIONS` and :data:`OBJECT_MUTATIONS`) are checked first: an unknown one
    raised KeyError, and a string was iterated as names of one character."""
    require_trace(trace, "mutants")
    every = {**MUTATIONS, **OBJECT_MUTATIONS}
    if names is None:
        names = list(MUTATIONS) + (list(OBJECT_MUTATIONS) if trace.header.layout else [])
    elif isinstance(names, (str, bytes)) or not isinstance(names, Iterable):
        raise ArgumentError(f"mutants: names = {repr(names)[:80]} ({type(names).__name__}): "
                            "must be None (every mutation) or a list of mutation names, "
                            "e.g. ['drop_grant']", argument="names", value=names)
    names = list(names)
    for i, name in enumerate(names):
        if not isinstance(name, str) or name not in every:
            raise ArgumentError(f"mutants: names[{i}] = {repr(name)[:80]}: must be one of "
                                f"{', '.join(every)}", argument="names", value=name)
        if name in OBJECT_MUTATIONS and trace.header.layout is None:
            raise ArgumentError(f"mutants: names[{i}] = {name!r}: an object mutation, for "
                                "version-2 traces only (this trace is version 1: it has no "
                                "plan naming objects)", argument="names", value=name)
    out: list[Mutant] = []
    for name in names:
        raw = [copy.deepcopy(dict(e.raw)) for e in trace.events]
        res = every[name](raw, trace.header)
        if res is None:
            continue
        evs, index, desc = res[:3]
        src = f"{trace.source}#{name}"
        if len(res) > 3:  # a header mutation: extra header fields
            head = header_to_json(trace.header)
            head.update(res[3])
            lines = [json.dumps(head)] + [json.dumps({**e, "seq": k}) for k, e in
                                          enumerate(evs)]
            t = parse_trace_lines(lines, source=src)
        else:
            t = trace_from_events(trace.header, evs, src)
        out.append(Mutant(name, t, index, desc))
    return out


@dataclass(frozen=True)
class MutationScore:
    """Mutants rejected at their expected index (``killed``) out of ``total``."""

    killed: int
    total: int
    misses: tuple[str, ...]

    @property
    def score(self) -> float:
        return self.killed / self.total if self.total else 1.0


def mutation_score(cases: Iterable[Mutant], verdicts: Iterable[Any]) -> MutationScore:
    """Score engine verdicts (same order as ``cases``): a mutant counts as killed only
    when it is rejected exactly at its expected index."""
    killed, total, misses = 0, 0, []
    for m, v in zip(cases, verdicts, strict=True):
        total += 1
        if not v.accepted and v.index == m.expected_index:
            killed += 1
        else:
            misses.append(f"{m.trace.source}: expected rejection at {m.expected_index}, "
                          f"got {'acceptance' if v.accepted else v.index}")
    return MutationScore(killed, total, tuple(misses))
