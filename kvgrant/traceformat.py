"""The one owner of the trace text format (docs/INTERFACES.md "Trace format").

Why one module: the writer (kvgrant.runtime.trace, the engine's templates), the fast
reader (kvgrant.conformance.trace_io's regex), the replay (which compares recorded
state as text) and the fault injector (driver call names) all depend on the exact
bytes of a line. Each of them derives what it needs from the tables here, so a change
of format is a change in this file (tests/runtime/test_trace_writer.py and
tests/conformance/test_trace_io.py prove writer and reader agree field for field for
every action).

Standard library only, importable by both ``kvgrant.runtime`` and
``kvgrant.conformance`` without either importing the other.
"""

from __future__ import annotations

import json
import re
from typing import Any, Mapping, NamedTuple, Sequence

__all__ = [
    "ACTIONS",
    "DRIVER_CALLS",
    "DRIVER_STEPS",
    "EVENT_FIELDS",
    "EVENT_LINE",
    "FAST_EVENT",
    "GROUP_ACTIONS",
    "GROUP_ARG_ORDER",
    "GROUP_EVENT_LINE",
    "GROUP_FAST_ARGS",
    "GROUP_FAST_EVENT",
    "GROUP_ROW",
    "GROUP_ROW_FIELDS",
    "GROUP_SHAPES",
    "GROUP_STATE",
    "GROUP_STATE_KEYS",
    "GROUP_STRIP",
    "GROUP_STRIPPED_LINE",
    "GROUP_VERSION",
    "GroupShape",
    "LIFECYCLE_VERSION",
    "MAX_HEADER_BYTES",
    "PHASES",
    "RANK_ACTIONS",
    "RANK_COUNTERS",
    "ROW",
    "ROW_FIELDS",
    "SETUP_CALLS",
    "Shape",
    "TRACE_BACKENDS",
    "args_alloc",
    "args_grant",
    "args_unmap",
    "encode_json",
    "event_line",
    "event_template",
    "format_event",
    "format_group_event",
    "group_args_text",
    "group_plan_header",
    "group_state_json",
    "group_state_text",
    "plan_header",
    "state_template",
    "state_text",
]

#: Version of a one-process (lifecycle) trace: 2 names its objects (plan, reservations,
#: handles). Group traces (docs/group-trace.md) are version 2 too (the same event line).
LIFECYCLE_VERSION = 2
#: The longest header line read (a published-scale plan is about 90 KB; 64 MiB is far
#: more than any plan, and bounds a file with no newline): the group reader's bound, and
#: how far ``--trace``'s overwrite check reads a first line to see a trace header.
MAX_HEADER_BYTES = 64 << 20
GROUP_VERSION = 2

#: The model's phases, in the order the lifecycle visits them.
PHASES = ("Allocating", "Published", "Aborting", "Aborted", "ShuttingDown", "Shutdown")


class Shape(NamedTuple):
    """What one action's event line carries: the driver ``call`` (None: model-only
    step), the ``args`` keys, and whether ``va``, ``size`` and ``handle`` are set."""

    call: str | None
    args: tuple[str, ...]
    va: bool
    size: bool
    handle: bool


#: The action table: every event action and the shape of its line.
ACTIONS: Mapping[str, Shape] = {
    "Reserve": Shape("cuMemAddressReserve", (), True, True, False),
    "Create": Shape("cuMemCreate", ("alloc",), False, True, True),
    "Map": Shape("cuMemMap", ("alloc",), True, True, True),
    "MapAlias": Shape("cuMemMap", ("alloc",), True, True, True),
    "Grant": Shape("cuMemSetAccess", ("alloc", "mapping", "devices"), True, True, False),
    "RankReady": Shape(None, (), False, False, False),
    "Unmap": Shape("cuMemUnmap", ("alloc", "mapping"), True, True, False),
    "Release": Shape("cuMemRelease", ("alloc",), False, False, True),
    "Free": Shape("cuMemAddressFree", (), True, True, False),
    "Publish": Shape(None, (), False, False, False),
    "Abort": Shape(None, ("failed_rank",), False, False, False),
    "Unpublish": Shape(None, (), False, False, False),
    "AbortComplete": Shape(None, (), False, False, False),
    "ShutdownComplete": Shape(None, (), False, False, False),
}
#: Actions without an actor rank (``rank`` is null).
GROUP_ACTIONS = frozenset({"Publish", "Abort", "Unpublish", "AbortComplete", "ShutdownComplete"})
#: Rank actions -> driver entry point (None: model-only step).
RANK_ACTIONS: Mapping[str, str | None] = {a: s.call for a, s in ACTIONS.items()
                                          if a not in GROUP_ACTIONS}
#: Driver steps that may fail (a failing one is the model's ``Fail(r, x)``).
DRIVER_STEPS = frozenset({"Reserve", "Create", "Map", "MapAlias", "Grant"})
#: Driver entry points that lifecycle events name.
DRIVER_CALLS = frozenset(s.call for s in ACTIONS.values() if s.call is not None)
#: The driver queries a one-process start-up makes before its first ``Reserve`` (the
#: device count, then each device's granularity and free memory). One that fails is
#: traced as that rank's failed ``Reserve`` naming the query (the model's
#: ``Fail(r, "Reserve")``: nothing was made), then ``Abort`` and ``AbortComplete``, as a
#: group rank traces its failed set-up (docs/group-trace.md); a failed Reserve may name
#: one of these instead of cuMemAddressReserve, no other event may.
SETUP_CALLS = frozenset({"cuDeviceGetCount", "cuMemGetAllocationGranularity",
                         "cuMemGetInfo"})
#: The header's ``backend``: the name of the driver that ran (``Driver.name``).
TRACE_BACKENDS = ("sim", "cuda")
#: Rank counters of an event's ``state``, in line order, with their Python types.
RANK_COUNTERS: Mapping[str, type] = {
    "va": bool, "created": int, "mapped": int, "alias_mapped": int, "grants": int,
    "ready": bool, "failed": bool,
}

# --- the line --------------------------------------------------------------------------------
# Field order of an event line and each field's %-placeholder in the writer's template.
# ``t`` follows ``seq`` so every template starts with the two per-event values.
_LINE: tuple[tuple[str, str], ...] = (
    ("kind", '"event"'), ("seq", "%d"), ("t", "%.6f"), ("rank", "%s"), ("action", '"%s"'),
    ("args", "%s"), ("call", "%s"), ("result", "%s"), ("device", "%s"), ("va", "%s"),
    ("size", "%s"), ("handle", "%s"), ("state", "%s"),
)
EVENT_FIELDS = tuple(k for k, _ in _LINE)
#: The generic event line: (seq, t, rank, action, args, call, result, device, va, size,
#: handle, state), every value already JSON text.
EVENT_LINE = "{" + ", ".join(f'"{k}": {v}' for k, v in _LINE) + "}\n"
#: A group trace's event line (version 2): the lifecycle line, field for field.
GROUP_EVENT_LINE = EVENT_LINE
#: The version-1 line (no ``handle``): only to name what an old trace lacks.
_V1_EVENT_LINE = "{" + ", ".join(f'"{k}": {v}' for k, v in _LINE if k != "handle") + "}\n"


def event_line(version: int) -> str:
    """The generic event line of a trace of this header version."""
    return _V1_EVENT_LINE if version == 1 else EVENT_LINE


def _q(v: str | None) -> str:
    return "null" if v is None else '"' + v + '"'


def _tf(b: bool) -> str:
    return "true" if b else "false"


def state_template(phase: str, va: bool, ready: bool, failed: bool) -> str:
    """A rank state with ``%d`` for created, mapped, alias_mapped, grants (in order)."""
    return ('{"phase": "' + phase + '", "va": ' + _tf(va) + ', "created": %d, "mapped": %d, '
            '"alias_mapped": %d, "grants": %d, "ready": ' + _tf(ready) + ', "failed": '
            + _tf(failed) + "}")


def state_text(phase: str, va: bool, created: int, mapped: int, alias_mapped: int,
               grants: int, ready: bool, failed: bool) -> str:
    """A rank state exactly as the writer writes it (the replay compares this text)."""
    return state_template(phase, va, ready, failed) % (created, mapped, alias_mapped, grants)


def group_state_text(phase: str) -> str:
    return '{"phase": "' + phase + '"}'


_ARGS_ALLOC = '{"alloc": %d}'


def args_alloc(alloc: int | str = "%d") -> str:
    """``{"alloc": A}``; the default leaves ``%d`` for the alloc."""
    return '{"alloc": ' + str(alloc) + "}"


def args_unmap(mapping: str, alloc: int | str = "%d") -> str:
    return '{"alloc": ' + str(alloc) + ', "mapping": "' + mapping + '"}'


def args_grant(mapping: str, devices: list[int], alloc: int | str = "%d") -> str:
    return ('{"alloc": ' + str(alloc) + ', "mapping": "' + mapping + '", "devices": '
            + "[" + ", ".join(map(str, devices)) + "]}")


def event_template(rank: int | None, action: str, args: str, call: str | None,
                   result: str | None, device: int | None, va: str, size: str, handle: str,
                   state: str) -> str:
    """A %-template for one kind of event, for ``TraceWriter.recorder``.

    ``args``, ``va``, ``size``, ``handle`` and ``state`` are JSON fragments that may hold
    ``%d`` placeholders (in that order); the template adds ``seq`` and ``t`` in front.
    Why: tracing 10^5 driver calls must cost a few percent of them, so everything fixed
    for a (rank, action, phase, flags) is formatted once.
    """
    fill = {"rank": "null" if rank is None else str(rank), "action": '"' + action + '"',
            "args": args, "call": _q(call), "result": _q(result),
            "device": "null" if device is None else str(device), "va": va, "size": size,
            "handle": handle, "state": state}
    return "{" + ", ".join(f'"{k}": {fill.get(k, v)}' for k, v in _LINE) + "}\n"


#: The JSON encoding of every header and of args / state objects in a trace line.
encode_json = json.JSONEncoder(separators=(", ", ": "), ensure_ascii=True).encode
_json = encode_json


def format_event(ev: Mapping[str, Any], version: int = LIFECYCLE_VERSION) -> str:
    """One event dict as the writer writes it (no newline): the fields of
    :data:`EVENT_LINE` in order, args and state keys in table order. For tools and
    tests that write traces (mutants, fixtures); the runtime formats the same line
    from its templates."""
    args = ev.get("args") or {}
    shape = ACTIONS.get(ev["action"])
    keys = shape.args if shape is not None else tuple(args)
    state = ev["state"]
    values: list[Any] = [
        ev["seq"], ev.get("t", 0.0), _json(ev["rank"]), ev["action"],
        "{" + ", ".join(f'"{k}": {_json(args[k])}' for k in keys if k in args) + "}",
        _json(ev.get("call")), _json(ev.get("result")), _json(ev.get("device")),
        _json(ev.get("va")), _json(ev.get("size"))]
    if version != 1:
        values.append(_json(ev.get("handle")))
    values.append("{" + ", ".join(f'"{k}": {_json(state[k])}' for k in ("phase", *RANK_COUNTERS)
                                  if k in state) + "}")
    return event_line(version)[:-1] % tuple(values)


# --- the fast reader, derived from the same line ------------------------------------------
# Integers of at most 39 digits (2^128 has 39; every value a trace names fits in 64 bits)
# and times as the writer prints them (%.6f: no sign, no exponent). Anything longer or
# other goes to the detailed reader, which names the line and the field (and never meets
# Python's limit on int() of more than 4,300 digits in the fast path).
_INT = r"(?:0|[1-9][0-9]{0,38})"
_NUM = r"(?:0|[1-9][0-9]{0,15})(?:\.[0-9]+)?"
_BOOL = r"(?:true|false)"
_ALT_ACTIONS = "|".join(sorted(ACTIONS, key=lambda a: (-len(a), a)))
_ALT_PHASES = "|".join(sorted(PHASES, key=lambda a: (-len(a), a)))
#: Each field's value pattern; groups are captured in ROW_FIELDS order.
_VALUE = {
    "kind": '"event"',
    "seq": "(" + _INT + ")",
    "t": _NUM,
    "rank": "(null|" + _INT + ")",
    "action": '"(' + _ALT_ACTIONS + ')"',
    "args": (r'\{(?:(")alloc": (' + _INT + r')(?:, "mapping": "(plane|alias)"(?:, "devices": ('
             r"\[(?:" + _INT + r"(?:, " + _INT + r')*)?\]))?)?|"failed_rank": (null|' + _INT
             + r"))?\}"),
    "call": '(null|"[A-Za-z]+")',
    "result": '(null|"[A-Za-z0-9_]+")',
    "device": "(null|" + _INT + ")",
    "va": "(null|" + _INT + ")",
    "size": "(null|" + _INT + ")",
    "handle": "(null|" + _INT + ")",
    "state": (r'\{("phase": "(?:' + _ALT_PHASES + r')"(?:(,) '
              + ", ".join(f'"{k}": ' + (_BOOL if t is bool else _INT)
                          for k, t in RANK_COUNTERS.items()) + r")?)\}"),
}
#: Captured row fields, in order. ``has_alloc`` is '"' when args has an alloc and
#: ``has_counters`` is "," when the state has the rank counters; ``state`` is the text
#: inside the state's braces (compare with :func:`state_text` minus its braces).
ROW_FIELDS = ("seq", "rank", "action", "has_alloc", "alloc", "mapping", "devices",
              "failed_rank", "call", "result", "device", "va", "size", "handle", "state",
              "has_counters")
ROW = {name: i for i, name in enumerate(ROW_FIELDS)}
FAST_EVENT = re.compile(
    r"^\{" + ", ".join(f'"{k}": ' + _VALUE[k] for k, _ in _LINE)
    + r"\}$", re.M)
assert FAST_EVENT.groups == len(ROW_FIELDS), "ROW_FIELDS must name every group"


# --- the version-2 header's plan ---------------------------------------------------------------
def plan_header(g: Any, allocs: Sequence[Any], plane_off: Mapping[str, int],
                region_off: Mapping[str, int], reserve_bytes: int,
                bases: Mapping[int, int | None]) -> dict[str, Any]:
    """The plan fields of a version-2 header, from a geometry, its plan's allocations,
    the VA layout (``kvgrant.runtime.engine.va_layout``) and each rank's reservation
    base (None: not reserved). ``kvgrant conform --geometry`` derives the same from
    the geometry and compares. Importers are not listed: checkers derive them from
    ``topology.import_groups``."""
    topo = g.topology
    declared = topo.declared_readers
    return {
        "granularity": g.granularity, "pages": g.pages,
        "planes": [[p.name, plane_off[p.name], g.plane_bytes(p.name)] for p in g.planes],
        "regions": [[r.name, region_off[r.name], g.region_bytes(r.name), r.access]
                    for r in g.regions],
        "allocations": [[a.plane, a.plane_offset, a.length, a.region, a.region_offset]
                        for a in allocs],
        "reservations": {str(r): [b, reserve_bytes] for r, b in sorted(bases.items())},
        "topology": {"import_groups": [list(x) for x in (topo.import_groups or [])],
                     "declared_readers": None if declared is None else
                     {str(k): sorted(v) for k, v in sorted(declared.items())}},
    }


# --- group traces (docs/group-trace.md): one file per process, same event line -----------
class GroupShape(NamedTuple):
    """A group action's line: the driver (or socket / collective) ``call`` it records
    when it succeeds (None: model-only step), its ``args`` keys in line order, and
    whether ``va``, ``size`` and ``handle`` are set when it succeeds."""

    call: str | None
    args: tuple[str, ...]
    va: bool
    size: bool
    handle: bool


#: Every action of a group trace and the shape of its line (the writer,
#: runtime/group.py, follows it; conformance.group_io reads by it).
GROUP_SHAPES: Mapping[str, GroupShape] = {
    "Reserve": GroupShape("cuMemAddressReserve", (), True, True, False),
    "Create": GroupShape("cuMemCreate", ("alloc",), False, True, True),
    "Map": GroupShape("cuMemMap", ("alloc",), True, True, True),
    "MapAlias": GroupShape("cuMemMap", ("alloc",), True, True, True),
    "Grant": GroupShape("cuMemSetAccess", ("alloc", "mapping", "devices"), True, True, False),
    "Export": GroupShape("cuMemExportToShareableHandle", ("alloc",), False, True, True),
    "Send": GroupShape("sendmsg", ("alloc", "to"), False, False, False),
    "Import": GroupShape("cuMemImportFromShareableHandle", ("owner", "alloc"), False, True,
                         True),
    "ImportMap": GroupShape("cuMemMap", ("owner", "alloc", "mapping"), True, True, True),
    "ImportGrant": GroupShape("cuMemSetAccess", ("owner", "alloc", "mapping", "devices"),
                              True, True, False),
    "RankReady": GroupShape(None, (), False, False, False),
    "Vote": GroupShape("all_gather", ("ready", "error"), False, False, False),
    "Decide": GroupShape(None, ("decision", "failed", "missing"), False, False, False),
    "Publish": GroupShape(None, (), False, False, False),
    "Abort": GroupShape(None, (), False, False, False),
    "Unpublish": GroupShape(None, (), False, False, False),
    "ImportUnmap": GroupShape("cuMemUnmap", ("owner", "alloc", "mapping"), True, True, False),
    "ImportRelease": GroupShape("cuMemRelease", ("owner", "alloc"), False, False, True),
    "Unmap": GroupShape("cuMemUnmap", ("alloc", "mapping"), True, True, False),
    "Release": GroupShape("cuMemRelease", ("alloc",), False, False, True),
    "Free": GroupShape("cuMemAddressFree", (), True, True, False),
    "AbortComplete": GroupShape(None, (), False, False, False),
    "ShutdownComplete": GroupShape(None, (), False, False, False),
}
#: Order of every ``args`` key of a group line (the writer sorts by it).
GROUP_ARG_ORDER = ("owner", "alloc", "mapping", "devices", "to", "ready", "error", "decision",
                   "failed", "missing")
#: A group event's ``state`` keys, in line order, with their Python types.
GROUP_STATE_KEYS: tuple[tuple[str, type], ...] = (
    ("phase", str), *RANK_COUNTERS.items(), ("exported", int), ("sent", int),
    ("imported", int), ("import_mapped", int), ("import_grants", int))
#: The state text inside its braces: ``%s`` phase, then each counter (bools as text).
GROUP_STATE = ", ".join(f'"{k}": ' + ('"%s"' if t is str else "%s" if t is bool else "%d")
                        for k, t in GROUP_STATE_KEYS)


def group_args_text(args: Mapping[str, Any]) -> str:
    """The ``args`` object of a group line (keys in :data:`GROUP_ARG_ORDER`)."""
    keys = [k for k in GROUP_ARG_ORDER if k in args] + sorted(set(args) - set(GROUP_ARG_ORDER))
    return "{" + ", ".join(f'"{k}": {_json(args[k])}' for k in keys) + "}"


def group_state_json(state: Mapping[str, Any]) -> str:
    """A group event's ``state`` object (keys in :data:`GROUP_STATE_KEYS` order)."""
    return "{" + ", ".join(f'"{k}": {_json(state[k])}' for k, _ in GROUP_STATE_KEYS
                           if k in state) + "}"


def format_group_event(ev: Mapping[str, Any]) -> str:
    """One group event dict as the writer writes it (no newline)."""
    return GROUP_EVENT_LINE[:-1] % (
        ev["seq"], ev.get("t", 0.0), _json(ev["rank"]), ev["action"],
        group_args_text(ev.get("args") or {}), _json(ev.get("call")),
        _json(ev.get("result")), _json(ev.get("device")), _json(ev.get("va")),
        _json(ev.get("size")), _json(ev.get("handle")), group_state_json(ev["state"]))


#: The group readers' line (conformance.group_io and group_fast), derived from the same
#: field list: captures seq, rank, action, the text inside ``args``' braces, result,
#: device, va, size, handle and the text inside ``state``'s braces.
# Possessive repeats and atomic groups: each token's class excludes the delimiter after
# it, so nothing is ever given back (the same language, less work for the engine).
_PINT = r"(?>0|[1-9][0-9]{0,38}+)"  # as _INT: at most 39 digits
_PNUM = r"(?>0|[1-9][0-9]{0,15}+)(?:\.[0-9]++)?+"
_GROUP_VALUE = {
    "kind": '"event"',
    "seq": "(" + _PINT + ")",
    "t": _PNUM,
    "rank": "(" + _PINT + ")",
    "action": '"([A-Za-z]++)"',
    "args": r"\{([^{}\n]*+)\}",
    "call": '((?>null|"[A-Za-z_]++"))',
    "result": '((?>null|"[A-Za-z0-9_]++"))',
    "device": "((?>null|" + _PINT + "))",
    "va": "((?>null|" + _PINT + "))",
    "size": "((?>null|" + _PINT + "))",
    "handle": "((?>null|" + _PINT + "))",
    "state": r'\{("phase": "[A-Za-z]++"[^{}\n]*+)\}',
}
GROUP_ROW_FIELDS = ("seq", "rank", "action", "args", "call", "result", "device", "va",
                    "size", "handle", "state")
GROUP_ROW = {name: i for i, name in enumerate(GROUP_ROW_FIELDS)}
GROUP_FAST_EVENT = re.compile(
    r"^\{" + ", ".join(f'"{k}": ' + _GROUP_VALUE[k] for k, _ in _LINE) + r"\}$", re.M)
assert GROUP_FAST_EVENT.groups == len(GROUP_ROW_FIELDS), "GROUP_ROW_FIELDS names every group"
#: A group line as :data:`GROUP_STRIP` leaves it (no ``t``, no ``handle``): the template
#: of conformance.group_fast's expected text (seq, rank, action, args, call, result,
#: device, va, size, state; every value already JSON text but seq and action).
GROUP_STRIPPED_LINE = "{" + ", ".join(f'"{k}": {v}' for k, v in _LINE
                                      if k not in ("t", "handle")) + "}"
#: The two fields of a clean run's line that no program fixes, ``t`` and ``handle``
#: (each with its ", " and only where the field order puts it): conformance.group_fast
#: splits a file on them (capturing the handle) and compares what is left, whole, with
#: the text the program fixes.
_NEXT = {k: _LINE[i + 1][0] for i, (k, _) in enumerate(_LINE[:-1])}
GROUP_STRIP = re.compile(
    f'"t": {_GROUP_VALUE["t"]}, (?="{_NEXT["t"]}": )'
    f'|"handle": {_GROUP_VALUE["handle"]}, (?="{_NEXT["handle"]}": )')
assert GROUP_STRIP.groups == 1
#: The group readers' ``args`` text of the forward and unwinding steps (owner, alloc,
#: mapping, devices, to), matched without json.loads.
GROUP_FAST_ARGS = re.compile(
    r'(?:"owner": (' + _INT + r')(?:, |$))?(?:"alloc": (' + _INT + r'))?(?:, "mapping": "'
    r'(plane|alias)")?(?:, "devices": \[(' + _INT + r'(?:, ' + _INT + r')*)\])?(?:, "to": ('
    + _INT + r'))?')


def group_plan_header(g: Any, allocs: Sequence[Any], plane_off: Mapping[str, int],
                      region_off: Mapping[str, int], slot_bytes: int, rank: int,
                      base: int | None) -> dict[str, Any]:
    """The plan fields of a version-2 group header: :func:`plan_header`, with each
    rank's reservation size (one slot for its own memory plus one per owner it imports
    from) and only this process's base (the others are other processes' choice)."""
    out = plan_header(g, allocs, plane_off, region_off, slot_bytes, {rank: base})
    n = g.topology.ranks
    out["reservations"] = {
        str(r): [base if r == rank else None,
                 slot_bytes * (1 + sum(1 for o in range(n) if o != r and r in g.importers(o)))]
        for r in range(n)}
    return out
