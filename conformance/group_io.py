"""Read and validate the trace files of one process group (docs/group-trace.md).

Each process writes its own NDJSON file: a header with ``mode: "group"`` and its
``rank``, then its events. This module checks only the *shape* (a malformed file
raises :class:`~kvgrant.errors.TraceError` naming the file and line; headers that
disagree about the group's constants are a TraceError too); whether the events are
allowed is :mod:`kvgrant.conformance.group_replay`'s job.

Why a fast path: a published-scale group is 16 files of 10^4-10^5 lines. Lines in the
writer's shape (kvgrant.traceformat owns it: GROUP_FAST_EVENT is derived from the same
field list as the writer's line) are matched by one regex per file, and each distinct
``args`` text is decoded once (the same texts recur across files); any other line shape
sends the file to the detailed reader (one ``json.loads`` per line), which names the
first bad line.

Version 2 (the only one read): the header carries the plan and each process's
reservation (kvgrant.traceformat.group_plan_header); the model's constants are derived
from the plan (as for a one-process trace); each row has its objects (device, va, size,
handle) for :mod:`kvgrant.conformance.group_objects`.
"""

from __future__ import annotations

import json
import os
import re
import stat
from dataclasses import dataclass, field
from operator import itemgetter
from pathlib import Path
from typing import Any, Iterable, Mapping

from kvgrant.conformance.group_model import GROUP_ACTIONS, UNDO_STEPS, Args, GroupConstants
from kvgrant.conformance.trace_io import (PHASES, _parse_lifecycle_header, null_field_rule,
                                          null_fields, unknown_event_key, unnamed_undo_field,
                                          unreadable_json, unreserved_base)
from kvgrant.conformance.trace_plan import Layout, rank_key_error
from kvgrant.errors import TraceError
from kvgrant.gc_pause import gc_paused
from kvgrant.strict_json import json_error_text, show_value, unique_keys_loads
from kvgrant.traceformat import (EVENT_FIELDS, GROUP_FAST_ARGS, GROUP_FAST_EVENT,
                                 GROUP_SHAPES, GROUP_STATE_KEYS, GROUP_VERSION,
                                 MAX_HEADER_BYTES)

__all__ = [
    "GroupHeader",
    "GroupTrace",
    "ProcTrace",
    "STATE_KEYS",
    "is_group_trace",
    "load_group",
    "parse_proc_trace",
    "read_group_headers",
]

#: Keys of an event's ``state`` in the writer's order, with their types.
STATE_KEYS: tuple[tuple[str, type], ...] = GROUP_STATE_KEYS
_STATE_KEY_NAMES = tuple(k for k, _ in STATE_KEYS)
#: A group run's id (header ``run``): rank 0's random token, shared at the hello.
_RUN_ID = re.compile(r"[0-9a-f]{16}")
_EVENT_KEYS = frozenset(EVENT_FIELDS)
_SUCCESS = frozenset({"CUDA_SUCCESS", "SUCCESS"})
#: Arguments each action needs (kvgrant.traceformat.GROUP_SHAPES; a Vote's ``error`` is
#: optional).
_ARGS: Mapping[str, tuple[str, ...]] = {
    a: tuple(k for k in s.args if k != "error") for a, s in GROUP_SHAPES.items()}
_GROUP_ACTIONS = frozenset(GROUP_ACTIONS)
assert _GROUP_ACTIONS == frozenset(GROUP_SHAPES), "the format and the model list the same actions"
#: Actions that are a call (a driver call, sendmsg, all_gather), as the format's table
#: says: they record a ``result``; the model-only steps record null.
_CALLED = frozenset(a for a, s in GROUP_SHAPES.items() if s.call is not None)
#: Per action, the object fields its line leaves null (GROUP_SHAPES).
_NULL_FIELDS = null_fields(GROUP_SHAPES)


def _check_call(source: str, ln: int, action: str, call: "str | None",
                result: "str | None") -> None:
    """The call an event names is its action's (docs/group-trace.md's tables): a model
    step names none. Only a failure may name another: a failed Reserve whatever set-up
    step stopped the rank (a driver query, or all_gather), a failed Import recvmsg (no
    fd came)."""
    want = GROUP_SHAPES[action].call
    if call == want:
        return
    if result is not None and result not in _SUCCESS and call is not None and (
            action == "Reserve" or (action == "Import" and call == "recvmsg")):
        return
    raise _fail(source, ln, f"call = {json.dumps(call)}: {action} "
                + (f"calls {want}" if want is not None else "is a model step: it names no "
                   "call"))


#: An object field of a row: (device, va, size, handle), None for null.
Objs = tuple["int | None", "int | None", "int | None", "int | None"]
#: The same, as positions in :class:`Args` (for the fast reader).
_NEED_IDX: Mapping[str, tuple[int, ...]] = {
    k: tuple(Args._fields.index(f) for f in v) for k, v in _ARGS.items()}
#: Per action, the fast reader's args positions (owner, alloc, mapping, devices, to) it
#: does not take: one set there sends the line to the checked path, which refuses it.
_NOT_TAKEN_IDX: Mapping[str, tuple[int, ...]] = {
    k: tuple(i for i, f in enumerate(("owner", "alloc", "mapping", "devices", "to"))
             if f not in s.args) for k, s in GROUP_SHAPES.items()}


@dataclass(frozen=True)
class GroupHeader:
    """One file's header: the group's constants, this file's rank, device ordinals."""

    constants: GroupConstants
    rank: int
    devices: Mapping[int, int]
    extra: Mapping[str, Any] = field(default_factory=dict)
    #: The plan and the reservations (every rank's size, this process's base).
    layout: Layout | None = None

    @property
    def own_device(self) -> int:
        return self.devices.get(self.rank, self.rank)

    def plan_key(self) -> tuple[Any, ...]:
        """What the files of one group share: the constants and the plan (every field
        but this process's reservation base)."""
        lay = self.layout
        if lay is None:
            return (self.constants,)
        res = tuple(s for _, (_b, s) in sorted(lay.reservations.items()))
        return (self.constants, lay.granularity, lay.pages, tuple(lay.planes.items()),
                tuple(lay.regions.items()), lay.allocations, res, lay.import_groups,
                None if lay.declared_readers is None else
                tuple(sorted(lay.declared_readers.items())))


@dataclass(frozen=True)
class ProcTrace:
    """One process's file: header and events as rows.

    A row is ``(action, args, result, state)``: :class:`Args` with devices read as
    ranks, the driver result (None for model-only steps), and the recorded state as
    the text inside its braces (fast reader) or a dict (detailed reader). Row k is
    event seq k, on line k + 2.
    """

    source: str
    header: GroupHeader
    rows: tuple[tuple[str, Args, str | None, Any], ...]
    text: str = field(repr=False, default="")
    #: Row k's objects: (device, va, size, handle).
    objs: tuple[Objs, ...] = field(repr=False, default=())

    def raw_event(self, k: int) -> dict[str, Any]:
        """Event k as written (for reports)."""
        lines = self.text.split("\n")
        try:
            obj = unique_keys_loads(lines[k + 1])
        except (IndexError, ValueError, RecursionError):
            return {"seq": k}
        return obj if isinstance(obj, dict) else {"seq": k}


@dataclass(frozen=True)
class GroupTrace:
    """The files of one group, indexed by rank."""

    constants: GroupConstants
    procs: tuple[ProcTrace, ...]

    @property
    def events(self) -> int:
        return sum(len(p.rows) for p in self.procs)


def _fail(source: str, line: int, msg: str) -> TraceError:
    return TraceError(f"{source}:{line}: {msg}", line=line)


def is_group_trace(path: str | Path) -> bool:
    """True when the file's first line is a header with ``mode: "group"``. A pipe (or
    any file that is not a regular one) is not peeked at: it can be read only once, and
    the trace reader needs its first line (``conform <(cat t.ndjson)`` was refused as
    "not valid JSON" after this read had taken the header)."""
    try:
        if not stat.S_ISREG(os.stat(path).st_mode):
            return False
        with open(path, encoding="utf-8") as f:
            first = f.readline(1 << 16)  # bounded: /dev/zero has no newline
        obj = unique_keys_loads(first)
    except (OSError, ValueError, RecursionError):  # JSON and UTF-8 errors are ValueErrors
        return False
    return isinstance(obj, dict) and obj.get("mode") == "group"


def _parse_group_header(obj: Any, source: str) -> GroupHeader:
    if not isinstance(obj, dict):
        raise _fail(source, 1, "line 1 must be the header object")
    if obj.get("mode") != "group":
        one = (" (this is a one-process trace: a folder, or several files, are read as "
               "the traces of one process group, so give a one-process trace as a file, "
               "one at a time)"
               if obj.get("kind") == "header" and "mode" not in obj else "")
        raise _fail(source, 1, f"header.mode = {obj.get('mode')!r}: a group trace has "
                               f"mode 'group'{one}")
    version = obj.get("version")
    if type(version) is not int or version != GROUP_VERSION:
        old = (" (an old trace without objects: re-record it with this kvgrant)"
               if version == 1 else "")
        raise _fail(source, 1, f"header.version = {version!r}: a group trace must be version "
                               f"{GROUP_VERSION}{old}")
    body = {k: v for k, v in obj.items() if k != "devices"}
    h = _parse_lifecycle_header(body, 1, source, group=True)  # the plan; constants from it
    rank, procs = obj.get("rank"), obj.get("procs")
    if type(rank) is not int or not 0 <= rank < h.ranks:
        raise _fail(source, 1, f"header.rank = {rank!r}: must be a rank in 0..{h.ranks - 1}")
    if procs != h.ranks:
        raise _fail(source, 1, f"header.procs = {procs!r}: must equal header.ranks "
                               f"({h.ranks}; one process per rank)")
    devs_raw = obj.get("devices", {})
    if not isinstance(devs_raw, dict):
        raise _fail(source, 1, f"header.devices = {devs_raw!r}: must be an object")
    devices: dict[int, int] = {}
    for k, v in devs_raw.items():
        why = rank_key_error(k, h.ranks, "header.devices")
        if why is not None:
            raise _fail(source, 1, why)
        if type(v) is not int or v < 0:
            raise _fail(source, 1, f"header.devices[{k!r}] = {v!r}: must map a rank to a "
                                   "CUDA ordinal >= 0")
        devices[int(k)] = v  # one spelling per rank: no two keys give the same int
    c = GroupConstants(h.ranks, h.allocs, h.aliased, h.owner_only, h.importers,
                       h.declared_readers)
    lay = h.layout
    assert lay is not None
    slot = max([o + b for o, b in lay.planes.values()]
               + [v[0] + v[1] for v in lay.regions.values()], default=0)
    for r in range(h.ranks):
        base, size = lay.reservations[r]
        want = slot * (1 + len(c.sources[r]))
        if size != want:
            raise _fail(source, 1, f"header.reservations[{r}].size = {size:#x}: must be "
                                   f"{want:#x} (one slot of {slot:#x} bytes for rank {r}'s "
                                   f"memory and one per owner it imports from, "
                                   f"{list(c.sources[r])})")
        if r != rank and base is not None:
            raise _fail(source, 1, f"header.reservations[{r}].base = {base:#x}: must be "
                                   f"null (a file names only its own process's base, rank "
                                   f"{rank})")
    run = obj.get("run")
    if run is not None and (type(run) is not str or not _RUN_ID.fullmatch(run)):
        raise _fail(source, 1, f"header.run = {show_value(run)}: must be the run id, 16 "
                               "lowercase hex digits")
    extra = {k: v for k, v in h.extra.items() if k not in ("mode", "rank", "procs")}
    return GroupHeader(c, rank, devices, extra, lay)


class _ArgsReader:
    """Decode and check one file's ``args`` objects into :class:`Args` (cached by text)."""

    def __init__(self, h: GroupHeader, source: str) -> None:
        self.h, self.source = h, source
        c = h.constants
        self.n, self.allocs = c.ranks, c.allocs
        others = {d: r for r, d in h.devices.items() if r != h.rank}
        self.dev_rank = {**others, h.own_device: h.rank}
        self.cache: dict[tuple[str, str], Args] = {}
        self.shared: dict[tuple[str, str], Args] = {}  # args without devices

    def from_text(self, action: str, text: str, line: int) -> Args:
        key = (action, text)
        a = self.cache.get(key)
        if a is None:
            try:
                obj = unique_keys_loads("{" + text + "}")
            except (ValueError, RecursionError):  # (also an integer past the digit limit)
                raise _fail(self.source, line, "args is not a readable JSON object") from None
            a = self.check(action, obj, line)
            self.cache[key] = a
        return a

    def _rank(self, v: Any, name: str, line: int) -> int:
        if type(v) is not int or not 0 <= v < self.n:
            raise _fail(self.source, line, f"args.{name} = {v!r}: must be a rank in "
                                           f"0..{self.n - 1}")
        return v

    def _ranks(self, v: Any, name: str, line: int) -> frozenset[int]:
        if type(v) is not list:
            raise _fail(self.source, line, f"args.{name} = {v!r}: must be a list of ranks")
        return frozenset(self._rank(x, name, line) for x in v)

    def check(self, action: str, obj: Any, line: int) -> Args:
        if type(obj) is not dict:
            raise _fail(self.source, line, f"args = {obj!r}: must be an object")
        takes = GROUP_SHAPES[action].args
        extra = sorted((k for k in obj if k not in takes), key=str)
        if extra:  # (was: ignored; the one-process reader refuses them too)
            raise _fail(self.source, line, f"args.{extra[0]} = {show_value(obj[extra[0]])}: "
                                           f"{action} takes no {extra[0]} (its args: "
                                           f"{', '.join(takes) or 'none'})")
        if action == "Vote" and obj.get("ready") is True and obj.get("error") is not None:
            raise _fail(self.source, line, f"args.error = {show_value(obj['error'])}: a ready "
                                           "vote carries no error (docs/group-trace.md)")
        for k in _ARGS[action]:
            if k not in obj:
                raise _fail(self.source, line, f"args.{k} is missing: {action} needs "
                                               f"{', '.join(_ARGS[action])}")
        kw: dict[str, Any] = {}
        if "alloc" in _ARGS[action]:
            a = obj["alloc"]
            if type(a) is not int or not 0 <= a < self.allocs:
                raise _fail(self.source, line, f"args.alloc = {a!r}: must be in "
                                               f"0..{self.allocs - 1}")
            kw["alloc"] = a
        if "owner" in _ARGS[action]:
            kw["owner"] = self._rank(obj["owner"], "owner", line)
        if "to" in _ARGS[action]:
            kw["to"] = self._rank(obj["to"], "to", line)
        if "mapping" in _ARGS[action]:
            if obj["mapping"] not in ("plane", "alias"):
                raise _fail(self.source, line, f"args.mapping = {obj['mapping']!r}: must be "
                                               "'plane' or 'alias'")
            kw["mapping"] = obj["mapping"]
        if "devices" in _ARGS[action]:
            devs = obj["devices"]
            if type(devs) is not list or not all(type(d) is int and d >= 0 for d in devs) \
                    or len(set(devs)) != len(devs):
                raise _fail(self.source, line, f"args.devices = {devs!r}: must be a list of "
                                               "distinct CUDA ordinals")
            kw["devices"] = frozenset(self.dev_rank.get(d, -1 - d) for d in devs)
        if action == "Vote":
            if type(obj["ready"]) is not bool:
                raise _fail(self.source, line, f"args.ready = {obj['ready']!r}: must be "
                                               "true/false")
            kw["ready"] = obj["ready"]
        if action == "Decide":
            if obj["decision"] not in ("publish", "abort"):
                raise _fail(self.source, line, f"args.decision = {obj['decision']!r}: must be "
                                               "'publish' or 'abort'")
            kw["decision"] = obj["decision"]
            kw["failed"] = self._ranks(obj["failed"], "failed", line)
            kw["missing"] = self._ranks(obj["missing"], "missing", line)
        return Args(**kw)


_FAST = GROUP_FAST_EVENT


def parse_proc_trace(text: str, source: str = "<trace>", *,
                     group: "ProcTrace | None" = None,
                     shared: dict[tuple[str, str], Args] | None = None) -> ProcTrace:
    """One process's file (TraceError naming the line when malformed).

    ``group``: a file of the same group already read; this header must agree with its
    constants (checked before the events). ``shared``: a cache of decoded args without
    devices (those read the same in every file of one group)."""
    nl = text.find("\n")
    first = text if nl < 0 else text[:nl]
    try:
        head_obj = unique_keys_loads(first)
    except json.JSONDecodeError as err:
        raise _fail(source, 1, f"not valid JSON ({json_error_text(err)})") from None
    except (ValueError, RecursionError) as err:  # e.g. an integer past the digit limit
        raise _fail(source, 1, unreadable_json(err)) from None
    h = _parse_group_header(head_obj, source)
    if group is not None:
        bad = _same_constants(group.header.constants, h.constants) or \
            ("" if group.header.plan_key() == h.plan_key() else "plan (allocations, "
             "planes, regions, reservation sizes or topology)")
        if bad:
            raise TraceError(f"{source}:1: header.{bad} differs from {group.source} (the "
                             "files of one group share its constants)", line=1)
        run, first_run = h.extra.get("run"), group.header.extra.get("run")
        if run != first_run:   # (was: files of two runs of one geometry read as one group)
            raise TraceError(f"{source}:1: header.run = {show_value(run)} but {group.source} "
                             f"has run {show_value(first_run)}: the files come from "
                             "different runs (every process of one run writes rank 0's "
                             "run id)", line=1)
    reader = _ArgsReader(h, source)
    if shared is not None:
        reader.shared = shared
    body = "" if nl < 0 else text[nl + 1:]
    n = body.count("\n") + (0 if body.endswith("\n") or not body else 1)
    got = None
    if body:
        with gc_paused():
            m = _FAST.findall(body)
            if len(m) == n:
                got = _fast_rows(m, h, reader, source)
    rows, objs = got if got is not None else _slow_rows(body, h, reader, source)
    reserves = [(k + 2, row[2] in _SUCCESS) for k, row in enumerate(rows) if row[0] == "Reserve"]
    # (a file cut before its first event is a crash: its base may stand alone)
    why = unreserved_base(h, {h.rank} if any(ok for _, ok in reserves) else set(),  # type: ignore[arg-type]
                          {h.rank: ln for ln, ok in reserves[:1] if not ok}, bool(rows))
    if why:
        raise _fail(source, 1, why)
    return ProcTrace(source, h, rows, text, objs)


_ARGS_FAST = GROUP_FAST_ARGS
_SEQ, _RANK, _ACTION = itemgetter(0), itemgetter(1), itemgetter(2)


def _fast_rows(m: list[tuple[str, ...]], h: GroupHeader, reader: _ArgsReader,
               source: str) -> tuple[tuple[tuple[str, Args, str | None, Any], ...],
                                     tuple[Objs, ...]] | None:
    rank = str(h.rank)
    out = []
    from_text = reader.from_text
    cache = reader.cache
    fast_args = _ARGS_FAST.fullmatch
    n, allocs, dev_rank = reader.n, reader.allocs, reader.dev_rank
    need, not_taken = _NEED_IDX, _NOT_TAKEN_IDX
    # whole-file checks in C; any failure: the detailed reader names the line
    if list(map(_SEQ, m)) != list(map(str, range(len(m)))) or \
            set(map(_RANK, m)) != {rank} or not set(map(_ACTION, m)) <= _GROUP_ACTIONS:
        return None
    shared = reader.shared
    nul = "null"   # (inline: four function calls per row cost more than the row's check)
    objs = [(None if dv == nul else int(dv), None if va == nul else int(va),
             None if sz == nul else int(sz), None if hd == nul else int(hd))
            for (_s, _r, _a, _g, _c, _res, dv, va, sz, hd, _st) in m]
    calls_seen: set[tuple[str, str, str]] = set()   # each (action, call, result) once
    for k, (seq, r, action, args, call, result, _dv, _va, _sz, _hd, state) in enumerate(m):
        if (result == nul) is (action in _CALLED):  # the detailed reader names the line
            return None
        if action in UNDO_STEPS and result[1:-1] not in _SUCCESS and unnamed_undo_field(
                action, {"va": _va != nul or None, "size": _sz != nul or None,
                         "handle": _hd != nul or None}.get):
            return None   # a failed undo naming no object: the detailed reader names it
        nulls = _NULL_FIELDS[action]
        if nulls and ((_va != nul and "va" in nulls) or (_sz != nul and "size" in nulls)
                      or (_hd != nul and "handle" in nulls)):
            return None
        if (action, call, result) not in calls_seen:
            try:
                _check_call(source, k + 2, action, None if call == nul else call[1:-1],
                            None if result == nul else result[1:-1])
            except TraceError:
                return None
            calls_seen.add((action, call, result))
        a = cache.get((action, args)) or shared.get((action, args))
        if a is None:
            # the forward and unwinding steps' args (owner, alloc, mapping, devices, to)
            # without json.loads; anything else, or a bad value, takes the checked path
            f = fast_args(args)
            if f is not None:
                o, al, mp, dv, to = f.groups()
                if dv is None:
                    devs = None
                elif "," not in dv:
                    d = int(dv)
                    devs = frozenset((dev_rank.get(d, -1 - d),))
                else:
                    ds = [int(x) for x in dv.split(", ")]
                    devs = frozenset(dev_rank.get(d, -1 - d) for d in ds) \
                        if len(set(ds)) == len(ds) else None
                a = Args(None if o is None else int(o), None if al is None else int(al), mp,
                         devs, None if to is None else int(to))
                if (a[1] is not None and a[1] >= allocs) or (a[0] is not None and a[0] >= n) \
                        or (a[4] is not None and a[4] >= n) or (dv is not None and devs is None) \
                        or any(a[i] is not None for i in not_taken[action]):
                    a = None   # (a key the action does not take: from_text names it)
                else:
                    for i in need[action]:
                        if a[i] is None:
                            a = None
                            break
            if a is None:
                a = from_text(action, args, k + 2)
            elif dv is None:
                shared[(action, args)] = a
            else:
                cache[(action, args)] = a
        out.append((action, a, None if result == "null" else result[1:-1], state))
    return tuple(out), tuple(objs)


def _slow_rows(body: str, h: GroupHeader, reader: _ArgsReader,
               source: str) -> tuple[tuple[tuple[str, Args, str | None, Any], ...],
                                     tuple[Objs, ...]]:
    lines = body.split("\n")
    if lines and lines[-1] == "":
        lines.pop()
    out = []
    objs: list[Objs] = []
    for k, line in enumerate(lines):
        ln = k + 2
        if not line.strip():
            raise _fail(source, ln, "blank line: every line must be one JSON object")
        try:
            obj = unique_keys_loads(line)
        except json.JSONDecodeError as err:
            raise _fail(source, ln, f"not valid JSON ({json_error_text(err)})") \
                from None
        except (ValueError, RecursionError) as err:  # e.g. an integer past the digit limit
            raise _fail(source, ln, unreadable_json(err)) from None
        if type(obj) is not dict or obj.get("kind") != "event":
            raise _fail(source, ln, "every line after the header must be an event object "
                                    "(kind = 'event')")
        if not obj.keys() <= _EVENT_KEYS:
            raise _fail(source, ln, unknown_event_key(obj))
        if obj.get("seq") != k or type(obj.get("seq")) is not int:
            kind = "" if type(obj.get("seq")) is int else "the integer "
            raise _fail(source, ln, f"seq = {show_value(obj.get('seq'))}: expected {kind}{k} "
                                    "(seq counts from 0 without gaps)")
        if obj.get("rank") != h.rank:
            raise _fail(source, ln, f"rank = {obj.get('rank')!r}: every event of this file "
                                    f"has the header's rank {h.rank}")
        action = obj.get("action")
        if action not in _GROUP_ACTIONS:
            raise _fail(source, ln, f"action = {action!r}: not a group action (one of "
                                    f"{', '.join(sorted(_GROUP_ACTIONS))})")
        args = reader.check(action, obj.get("args") or {}, ln)
        result = obj.get("result")
        if result is not None and type(result) is not str:
            raise _fail(source, ln, f"result = {result!r}: must be a string or null")
        call = obj.get("call")
        if call is not None and type(call) is not str:
            raise _fail(source, ln, f"call = {call!r}: must be a string or null")
        if (result is None) is (action in _CALLED):
            raise _fail(source, ln, (
                f"result = null: {action} is a call ({GROUP_SHAPES[action].call}): it "
                "records what it returned (a CUresult name, SUCCESS, or the error)")
                if result is None else (
                f"result = {result!r}: {action} is a model-only step: its result is null"))
        _check_call(source, ln, action, call, result)
        state = obj.get("state")
        if type(state) is not dict:
            raise _fail(source, ln, f"state = {state!r}: must be an object")
        for key, typ in STATE_KEYS:
            v = state.get(key)
            if type(v) is not typ or (typ is int and v < 0):
                raise _fail(source, ln, f"state.{key} = {v!r}: must be "
                                        + ("true/false" if typ is bool else "an integer >= 0"
                                           if typ is int else "a phase"))
        if state["phase"] not in PHASES:
            raise _fail(source, ln, f"state.phase = {state['phase']!r}: must be one of "
                                    f"{', '.join(PHASES)}")
        if len(state) != len(STATE_KEYS):
            key = min((k for k in state if k not in _STATE_KEY_NAMES), key=str)
            raise _fail(source, ln, f"state.{key} = {show_value(state[key])}: unknown key (a "
                                    f"group event's state is {', '.join(_STATE_KEY_NAMES)})")
        ob = []
        for key in ("device", "va", "size", "handle"):
            if key not in obj:
                raise _fail(source, ln, f"{key} is missing: every event of a version-"
                                        f"{GROUP_VERSION} group trace has it (null when unset)")
            v = obj[key]
            if v is not None and (type(v) is not int or v < 0):
                raise _fail(source, ln, f"{key} = {v!r}: must be an integer >= 0 or null")
            if v is not None and key in _NULL_FIELDS[action]:
                raise _fail(source, ln, null_field_rule(key, v, action))
            ob.append(v)
        if action in UNDO_STEPS and result not in _SUCCESS:
            why = unnamed_undo_field(action, obj.get)
            if why:
                raise _fail(source, ln, why)
        out.append((action, args, result, state))
        objs.append(tuple(ob))  # type: ignore[arg-type]
    return tuple(out), tuple(objs)


def _same_constants(a: GroupConstants, b: GroupConstants) -> str:
    for f in ("ranks", "allocs", "aliased", "owner_only", "importers", "declared_readers"):
        if getattr(a, f) != getattr(b, f):
            return f
    return ""


def _expand(paths: Iterable[str | Path]) -> list[Path]:
    out: list[Path] = []
    for p in map(Path, paths):
        if "\0" in str(p):   # open() would raise a bare ValueError
            raise TraceError(f"{str(p)!r}: cannot read trace: a path cannot hold a NUL byte",
                             line=None)
        if p.is_dir():
            files = sorted(q for q in p.iterdir() if q.suffix in (".ndjson", ".jsonl")
                           and q.is_file())
            if not files:
                raise TraceError(f"{p}: no *.ndjson trace files in this directory", line=None)
            out += files
        else:
            out.append(p)
    return out


def read_group_headers(paths: Iterable[str | Path]) -> list[tuple[str, GroupHeader]]:
    """Each file's header alone (``kvgrant conform --geometry``), without its events."""
    out: list[tuple[str, GroupHeader]] = []
    for f in _expand(paths):
        try:
            with open(f, encoding="utf-8") as fh:
                first = fh.readline(MAX_HEADER_BYTES)
            obj = unique_keys_loads(first)
        except OSError as err:
            raise TraceError(f"{f}: cannot read: {err.strerror or err}", line=None) from None
        except (ValueError, RecursionError):
            raise _fail(str(f), 1, "line 1 is not a JSON header object") from None
        out.append((str(f), _parse_group_header(obj, str(f))))
    return out


def load_group(paths: Iterable[str | Path]) -> GroupTrace:
    """Read the trace files (or directories of ``*.ndjson``) of one group.

    Raises TraceError when a file is unreadable or malformed, two files claim one rank,
    a rank has no file, or the headers disagree about the group's constants.
    """
    files = _expand(paths)
    with gc_paused():  # 10^5-10^6 rows, no cycles: a collection would only rescan them
        return _load(files)


def _load(files: list[Path]) -> GroupTrace:
    procs: dict[int, ProcTrace] = {}
    first: ProcTrace | None = None
    shared: dict[tuple[str, str], Args] = {}
    for f in files:
        try:
            text = f.read_text(encoding="utf-8")
        except OSError as err:
            raise TraceError(f"{f}: cannot read trace: {err.strerror or err}",
                             line=None) from err
        except UnicodeDecodeError as err:
            raise TraceError(f"{f}: trace is not UTF-8 text: {err.reason}", line=None) \
                from err
        pt = parse_proc_trace(text, str(f), group=first, shared=shared)
        if first is None:
            first = pt
        if pt.header.rank in procs:
            raise TraceError(f"{f}:1: header.rank = {pt.header.rank}: "
                             f"{procs[pt.header.rank].source} has the same rank", line=1)
        procs[pt.header.rank] = pt
    if first is None:
        raise TraceError("no trace files given", line=None)
    n = first.header.constants.ranks
    missing = [r for r in range(n) if r not in procs]
    if missing:
        raise TraceError(f"ranks {missing} have no trace file (a group of {n} processes "
                         "writes one file per rank)", line=None)
    return GroupTrace(first.header.constants, tuple(procs[r] for r in range(n)))
