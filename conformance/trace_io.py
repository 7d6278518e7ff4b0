"""Read and validate NDJSON lifecycle traces (docs/INTERFACES.md "Trace format").

A trace is a header line (the model's constants) and one event per transition.
This module checks only the *shape* of a trace: anything malformed raises
:class:`kvgrant.errors.TraceError` with the 1-based line number, so the CLI never
shows a traceback. Whether the events are *allowed* is the model's job
(:mod:`kvgrant.conformance.replay`), never decided here.
"""

from __future__ import annotations

import json
import math
import os
import re
from dataclasses import dataclass, field
from operator import itemgetter
from pathlib import Path
from typing import Any, Iterable, Iterator, Mapping, Sequence, overload

from kvgrant.conformance.group_model import UNDO_STEPS  # a leaf module: no import cycle
from kvgrant.conformance.trace_plan import (Layout, derive_importers, parse_layout,
                                             rank_key_error)
from kvgrant.errors import ArgumentError, TraceError
from kvgrant.gc_pause import gc_paused
from kvgrant.strict_json import (DuplicateKeyError, is_json_document, json_error_text,
                                 show_value, unique_keys_loads)
from kvgrant.traceformat import (ACTIONS, DRIVER_STEPS, EVENT_FIELDS, FAST_EVENT,
                                 GROUP_ACTIONS, GROUP_SHAPES, LIFECYCLE_VERSION, PHASES,
                                 RANK_ACTIONS, RANK_COUNTERS, ROW, ROW_FIELDS, SETUP_CALLS,
                                 TRACE_BACKENDS)

__all__ = [
    "DRIVER_STEPS",
    "EVENT_ACTIONS",
    "Event",
    "GROUP_ACTIONS",
    "Header",
    "MAX_NESTING",
    "MAX_TRACE_ALLOCS",
    "MAX_TRACE_BYTES",
    "MAX_TRACE_RANKS",
    "PHASES",
    "RANK_COUNTERS",
    "ROW_FIELDS",
    "Trace",
    "load_trace",
    "parse_trace",
    "parse_trace_lines",
    "unknown_event_key",
    "unnamed_undo_field",
    "unreserved_base",
]

# The format's tables live in kvgrant.traceformat (one owner); re-exported here.
EVENT_ACTIONS = frozenset(RANK_ACTIONS) | GROUP_ACTIONS
#: Largest trace file read: four times a published-scale trace (178,611 events, 66 MB,
#: whose `kvgrant conform` peaked at 307 MB resident); far more is not one start-up.
MAX_TRACE_BYTES = 256 << 20
#: Largest header ``ranks``: the model keeps a state per rank (a header claiming 10^9
#: ranks made conform take 14.9 GB).
MAX_TRACE_RANKS = 4096
#: Largest header ``allocs`` (4 Mi: one allocation per granule of the largest rank).
MAX_TRACE_ALLOCS = 1 << 22
#: Deepest JSON nesting read in a line (the format nests 3 levels; Python's decoder
#: raises RecursionError at about 1,000).
MAX_NESTING = 32
#: Largest CUDA ordinal a header may name.
_MAX_ORDINAL = (1 << 31) - 1
#: Longest geometry name (kvgrant.layout.geometry.MAX_NAME_CHARS; not imported: the
#: readers stay free of the layout package and its pydantic import).
_MAX_NAME_CHARS = 256
_NEEDS_ALLOC = frozenset(a for a, sh in ACTIONS.items() if "alloc" in sh.args)
_NEEDS_MAPPING = frozenset(a for a, sh in ACTIONS.items() if "mapping" in sh.args)
#: The args keys the format gives some action, and per action those it does not take:
#: such a key is refused, never read (a RankReady naming an alloc past the plan made the
#: object check index the plan with it, and a Map naming devices broke the TLC module).
_ARG_KEYS = frozenset(k for sh in ACTIONS.values() for k in sh.args)
_NOT_ARGS = {a: _ARG_KEYS - frozenset(sh.args) for a, sh in ACTIONS.items()}
MAPPINGS = ("plane", "alias")
SUCCESS = "CUDA_SUCCESS"


@dataclass(frozen=True)
class Header:
    """The model constants a trace was recorded under."""

    ranks: int
    allocs: int
    aliased: frozenset[int]
    owner_only: frozenset[int]
    importers: tuple[frozenset[int], ...]
    declared_readers: tuple[frozenset[int], ...]
    devices: Mapping[int, int]
    version: int = 1
    extra: Mapping[str, Any] = field(default_factory=dict)
    #: The plan, reservations and topology of a version-2 header (None: version 1).
    layout: Layout | None = None

    def device_to_rank(self) -> dict[int, int]:
        """CUDA ordinal -> rank, so a Grant's ``devices`` can be read as model ranks."""
        return {dev: rank for rank, dev in self.devices.items()}


@dataclass(slots=True, eq=False)
class Event:
    """One transition of the trace; ``index`` is its position among the events (0-based).

    Not frozen (slots only) because published-scale traces hold 10^5 events and a
    frozen dataclass doubles the load time; treat it as read-only.
    """

    index: int
    line: int
    seq: int
    rank: int | None
    action: str
    args: Mapping[str, Any]
    call: str | None
    result: str | None
    state: Mapping[str, Any]
    raw: Mapping[str, Any]
    alloc: int | None = None
    mapping: str | None = None
    device: int | None = None
    va: int | None = None
    size: int | None = None
    handle: int | None = None

    @property
    def ok(self) -> bool:
        """A model-only step (result null) or a driver call that returned CUDA_SUCCESS."""
        return self.result is None or self.result == SUCCESS

    @property
    def devices(self) -> tuple[int, ...] | None:
        devs = self.args.get("devices")
        return None if devs is None else tuple(devs)

    def describe(self) -> str:
        """Short human form, e.g. ``Grant(r1, a2, alias) -> CUDA_SUCCESS``."""
        parts = [] if self.rank is None else [f"r{self.rank}"]
        if self.alloc is not None:
            parts.append(f"a{self.alloc}")
        if self.mapping is not None:
            parts.append(self.mapping)
        if self.devices is not None:
            parts.append("devices=" + ",".join(map(str, self.devices)))
        if self.handle is not None:
            parts.append(f"handle {self.handle}")
        if self.va is not None:
            parts.append(f"va [{self.va:#x}, {self.va + (self.size or 0):#x})")
        text = f"{self.action}({', '.join(parts)})" if parts else self.action
        return text if self.result is None else f"{text} -> {self.result}"


@dataclass(frozen=True)
class Trace:
    """A parsed trace: constants plus events in order.

    ``rows`` is set only by the fast reader (:func:`parse_trace` on writer-format
    lines): one tuple of the regex's string fields per event, already validated, which
    :func:`kvgrant.conformance.replay.replay` steps through without building events.
    ``events`` is then a lazy sequence that builds each :class:`Event` on access.
    """

    header: Header
    events: Sequence[Event]
    source: str = "<trace>"
    rows: tuple[tuple[str, ...], ...] | None = field(default=None, compare=False, repr=False)

    def to_lines(self) -> list[str]:
        """The trace back as NDJSON lines (events renumbered), for mutants and fixtures."""
        head = header_to_json(self.header)
        out = [json.dumps(head, sort_keys=True)]
        for i, ev in enumerate(self.events):
            obj = dict(ev.raw)
            obj["seq"] = i
            out.append(json.dumps(obj, sort_keys=True))
        return out


def require_trace(value: Any, function: str, argument: str = "trace") -> Trace:
    """``value`` when it is a :class:`Trace`, else an :class:`~kvgrant.errors.ArgumentError`
    naming the function, the argument and the value (``replay("t.ndjson")`` raised
    ``AttributeError: 'str' object has no attribute 'header'``)."""
    if not isinstance(value, Trace):
        raise ArgumentError(f"{function}: {argument} = {repr(value)[:80]} "
                            f"({type(value).__name__}): must be a Trace (read a trace file "
                            "with kvgrant.conformance.load_trace(path))", argument=argument,
                            value=value)
    return value


def header_to_json(h: Header) -> dict[str, Any]:
    """Inverse of the header parser (used when writing mutants)."""
    obj: dict[str, Any] = dict(h.extra)
    if h.layout is not None:  # version 2: the constants are derived from the plan
        obj.update({"kind": "header", "version": h.version, "ranks": h.ranks,
                    "allocs": h.allocs,
                    "devices": {str(r): d for r, d in sorted(h.devices.items())}})
        obj.update(h.layout.to_json())
        return obj
    obj.update({
        "kind": "header", "version": h.version, "ranks": h.ranks, "allocs": h.allocs,
        "aliased": sorted(h.aliased), "owner_only": sorted(h.owner_only),
        "importers": {str(r): sorted(s) for r, s in enumerate(h.importers)},
        "declared_readers": {str(r): sorted(s) for r, s in enumerate(h.declared_readers)},
        "devices": {str(r): d for r, d in sorted(h.devices.items())},
    })
    return obj


def load_trace(path: str | Path) -> Trace:
    """Read an NDJSON trace file; raises TraceError (with line) if malformed."""
    if not isinstance(path, (str, os.PathLike)) or isinstance(path, bytes):
        raise TraceError(f"path = {type(path).__name__}: load_trace takes a file path "
                         "(str or os.PathLike)", line=None)
    p = Path(path)
    try:
        with p.open("rb") as fh:
            raw = fh.read(MAX_TRACE_BYTES + 1)
    except (OSError, ValueError) as err:  # ValueError: a NUL byte in the path
        reason = getattr(err, "strerror", None) or str(err)
        raise TraceError(f"{str(p)!r}: cannot read trace: {reason}", line=None) from None
    if len(raw) > MAX_TRACE_BYTES:
        raise TraceError(f"{p}: trace is larger than {MAX_TRACE_BYTES:,} bytes (the limit of "
                         "kvgrant.conformance.trace_io.MAX_TRACE_BYTES); is it a trace?",
                         line=None)
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as err:
        line = raw.count(b"\n", 0, err.start) + 1
        column = err.start - (raw.rfind(b"\n", 0, err.start) + 1) + 1
        raise TraceError(f"{p}:{line}: not UTF-8 text: byte {raw[err.start]:#04x} at column "
                         f"{column} (file offset {err.start}): {err.reason}",
                         line=line) from None
    try:
        return parse_trace(text, source=str(p))
    except TraceError as err:
        if err.line == 1 and "not valid JSON" in str(err) and is_json_document(text):
            raise TraceError(f"{err}; the file is one JSON document over several lines, "
                             "not a trace (NDJSON: one JSON object per line, the first its "
                             "header): a geometry or a plan file?", line=1) from None
        raise



def parse_trace(text: str, source: str = "<trace>") -> Trace:
    """Parse NDJSON text (a trailing newline is fine; blank lines are not).

    Fast path first (:func:`_parse_fast`); any line it cannot vouch for sends the
    whole text to the detailed reader, which names the first bad line.
    """
    if not isinstance(text, str):
        raise TraceError(f"text = {type(text).__name__}: parse_trace takes the trace as str",
                         line=None)
    if len(text) > MAX_TRACE_BYTES:
        raise TraceError(f"{source}: trace is longer than {MAX_TRACE_BYTES:,} characters",
                         line=None)
    fast = _parse_fast(text, source)
    if fast is not None:
        return fast
    lines = text.split("\n")
    if lines and lines[-1] == "":
        lines.pop()
    return parse_trace_lines(lines, source=source)


def _decode_all(lines: list[str]) -> list[Any] | None:
    """All lines in one C-level decode (several times faster than one call per line);
    None when any line is bad, and the slow path then finds and names it."""
    if any(not ln.strip() or "\n" in ln or _too_deep(ln) for ln in lines):
        return None
    try:
        objs = unique_keys_loads("[" + ",".join(lines) + "]")
    except (ValueError, RecursionError):  # JSONDecodeError, digit limit, deep nesting
        return None
    return objs if len(objs) == len(lines) else None


def parse_trace_lines(lines: Iterable[str], source: str = "<trace>", *,
                      model_only: bool = False) -> Trace:
    """Parse one JSON object per line: the header first, then events.

    ``model_only`` also takes a version-1 header (the model's constants as lists, no
    plan): for behaviours made from the model in memory (the drift guard's, whose
    importers need not come from import groups). Such a trace has no objects to check;
    files are always read as version 2.
    """
    header: Header | None = None
    events: list[Event] = []
    lines = list(lines)
    fast = _decode_all(lines)
    for lineno, line in enumerate(lines, start=1):
        obj = fast[lineno - 1] if fast is not None else _json_object(line, lineno, source)
        if not isinstance(obj, dict):
            raise _fail(source, lineno, f"expected a JSON object, got {type(obj).__name__}")
        if header is None:
            header = _parse_header(obj, lineno, source) if model_only and \
                obj.get("version") == 1 else _parse_lifecycle_header(obj, lineno, source)
        else:
            events.append(_parse_event(obj, lineno, len(events), header, source))
    if header is None:
        raise TraceError(f"{source}: empty trace: line 1 must be the header", line=1)
    reserved = {e.rank for e in events if e.action == "Reserve" and e.ok}
    why = unreserved_base(header, reserved, {e.rank: e.line for e in reversed(events)
                                             if e.action == "Reserve" and not e.ok},
                          any(e.action in _ENDS for e in events))
    if why:
        raise _fail(source, 1, why)
    return Trace(header=header, events=tuple(events), source=source)


#: Events after which every rank that will ever reserve has (the trace is not cut short
#: among the Reserve events the runtime writes right after the header).
_ENDS = frozenset({"Publish", "AbortComplete", "ShutdownComplete"})


def unreserved_base(h: Header, reserved: set[int | None],
                    failed_at: Mapping[int | None, int], ended: bool) -> str:
    """Why the header gives a base to a rank whose Reserve never succeeded ('' when it
    gives none). docs/INTERFACES.md: the base is null when the rank never reserved (its
    reserve failed or an earlier one did); a failed Reserve naming no VA was never
    compared with it, and a rank with no Reserve at all had nothing to compare. A rank
    with no Reserve counts only in a trace that ``ended`` (a cut one is judged as such)."""
    if h.layout is None:
        return ""
    for r, (base, _) in sorted(h.layout.reservations.items()):
        if base is not None and r not in reserved and (ended or r in failed_at):
            how = (f"its Reserve failed at line {failed_at[r]}" if r in failed_at
                   else "the trace has no successful Reserve of it")
            return (f"header.reservations[{r}].base = {base:#x}: must be null: rank {r} "
                    f"never reserved ({how})")
    return ""


# --- helpers -----------------------------------------------------------------------------

_MSG_LIMIT = 400


def _fail(source: str, lineno: int, msg: str) -> TraceError:
    """The error for line ``lineno``; a message quoting a huge value is cut short."""
    if len(msg) > _MSG_LIMIT:
        msg = msg[:_MSG_LIMIT] + " ... (cut)"
    return TraceError(f"{source}:{lineno}: {msg}", line=lineno)


def _show(value: Any) -> str:
    """``repr`` cut to 80 characters (repr escapes control and bidi characters)."""
    text = repr(value)
    return text if len(text) <= 80 else text[:76] + " ..."


def _too_deep(line: str) -> bool:
    """True when the line nests JSON deeper than MAX_NESTING (brackets inside strings
    are skipped). Cheap: only lines with that many brackets are scanned."""
    if line.count("[") + line.count("{") <= MAX_NESTING:
        return False
    depth, in_string, escaped = 0, False, False
    for ch in line:
        if in_string:
            if escaped:
                escaped = False
            elif ch == "\\":
                escaped = True
            elif ch == '"':
                in_string = False
        elif ch == '"':
            in_string = True
        elif ch in "[{":
            depth += 1
            if depth > MAX_NESTING:
                return True
        elif ch in "]}":
            depth -= 1
    return False


def unreadable_json(err: BaseException) -> str:
    """The message for a line json.loads refused with a ValueError other than a syntax
    error: in practice an integer longer than Python converts (4,300 digits)."""
    if "digits" in str(err):
        return ("unreadable JSON value: an integer of more than 4,300 digits (no value a "
                "trace names has more than 20)")
    return f"unreadable JSON value: {str(err)[:200]}"


def _json_object(line: str, lineno: int, source: str) -> dict[str, Any]:
    if not isinstance(line, str):
        raise _fail(source, lineno, f"expected a line of text, got {type(line).__name__}")
    if not line.strip():
        raise _fail(source, lineno, "blank line: every line must be one JSON object")
    if _too_deep(line):
        raise _fail(source, lineno, f"JSON nested deeper than {MAX_NESTING} levels (a trace "
                                    "line nests 3)")
    try:
        obj = unique_keys_loads(line)
    except DuplicateKeyError as err:  # json.loads would keep the last value silently
        raise _fail(source, lineno, f"not a trace line: {err}") from None
    except json.JSONDecodeError as err:
        raise _fail(source, lineno, f"not valid JSON ({json_error_text(err)})") from None
    except (ValueError, RecursionError) as err:  # e.g. an integer past the digit limit
        raise _fail(source, lineno, unreadable_json(err)) from None
    if not isinstance(obj, dict):
        raise _fail(source, lineno, f"expected a JSON object, got {type(obj).__name__}")
    return obj


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _int_field(obj: Mapping[str, Any], key: str, lineno: int, source: str, *,
               lo: int = 0, hi: int | None = None, where: str = "") -> int:
    v = obj.get(key)
    name = f"{where}{key}"
    if not _is_int(v):
        raise _fail(source, lineno, f"{name} = {v!r}: must be an integer")
    if v < lo or (hi is not None and v >= hi):
        bound = f"in {lo}..{hi - 1}" if hi is not None else f">= {lo}"
        raise _fail(source, lineno, f"{name} = {v!r}: must be {bound}")
    return v


def _int_set(v: Any, name: str, lineno: int, source: str, hi: int, what: str) -> frozenset[int]:
    if not isinstance(v, list) or not all(_is_int(x) for x in v):
        raise _fail(source, lineno, f"{name} = {v!r}: must be a list of integers")
    bad = [x for x in v if not 0 <= x < hi]
    if bad:
        raise _fail(source, lineno, f"{name} = {v!r}: {bad[0]} is not a valid {what} (0..{hi - 1})")
    if len(set(v)) != len(v):
        raise _fail(source, lineno, f"{name} = {v!r}: duplicate entries")
    return frozenset(v)


def _rank_table(obj: Mapping[str, Any], key: str, ranks: int, lineno: int,
                source: str) -> dict[int, Any] | None:
    table = obj.get(key)
    if table is None:
        return None
    if not isinstance(table, dict):
        raise _fail(source, lineno, f"header.{key} = {table!r}: must be an object keyed by rank")
    out: dict[int, Any] = {}
    for k, v in table.items():
        why = rank_key_error(k, ranks, f"header.{key}")
        if why is not None:
            raise _fail(source, lineno, why)
        out[int(k)] = v  # one spelling per rank: no two keys give the same int
    return out


def _is_geometry_name(v: Any) -> bool:
    """A name the geometry model accepts (kvgrant.layout.geometry's ``Name``): 1..256
    printable characters, no white space around them."""
    return (type(v) is str and 0 < len(v) <= _MAX_NAME_CHARS and v.isprintable()
            and v == v.strip())


def _check_run_fields(obj: Mapping[str, Any], lineno: int, source: str) -> None:
    """The header's account of the run: ``geometry`` (the geometry's name), ``plan``
    (the plan's label) and ``backend`` (the driver's name), as the writers put them
    (runtime/engine.py, runtime/group.py). Each may be absent (the headers tools and
    tests build carry none); one that is present must be a value a writer can write.

    Why: they were read as any JSON value (``"plan": 5``, ``"backend": {}``,
    ``"geometry": null``) and printed or compared later (``kvgrant conform
    --geometry`` makes the plan its label names)."""
    if "geometry" in obj and not _is_geometry_name(obj["geometry"]):
        raise _fail(source, lineno, f"header.geometry = {_show(obj['geometry'])}: must be "
                                    "the geometry's name (a string of 1.."
                                    f"{_MAX_NAME_CHARS} printable characters, no white "
                                    "space around them)")
    if "plan" in obj and (type(obj["plan"]) is not str or not obj["plan"]):
        raise _fail(source, lineno, f"header.plan = {_show(obj['plan'])}: must be the plan's "
                                    "label, a non-empty string (naive, reference, packed "
                                    "or a planner's own name)")
    if "backend" in obj and (type(obj["backend"]) is not str
                             or obj["backend"] not in TRACE_BACKENDS):
        raise _fail(source, lineno, f"header.backend = {_show(obj['backend'])}: must be "
                                    + " or ".join(repr(b) for b in TRACE_BACKENDS)
                                    + " (the driver backend that ran)")


def _parse_lifecycle_header(obj: dict[str, Any], lineno: int, source: str, *,
                            group: bool = False) -> Header:
    """A one-process trace's header: version 2 (the plan, reservations and topology;
    the model's constants are derived from them). ``group``: the plan part of a group
    file's header (conformance.group_io), which has ``mode: "group"``."""
    if not group and obj.get("mode") == "group":  # (was: refused at line 2, state.exported)
        raise _fail(source, lineno, "header.mode = 'group': this is one process's file of a "
                                    "group trace: give the group's folder (or all its "
                                    "files, as paths: a pipe is read as a one-process trace)")
    if obj.get("kind") != "header":
        raise _fail(source, lineno, f"kind = {obj.get('kind')!r}: line 1 must be the header "
                                    "(kind = 'header')")
    version = obj.get("version")
    if not _is_int(version) or version != LIFECYCLE_VERSION:
        old = " (an old trace: re-record it with this kvgrant)" if version == 1 else ""
        raise _fail(source, lineno, f"header.version = {version!r}: a lifecycle trace must be "
                                    f"version {LIFECYCLE_VERSION}{old}")
    ranks = _int_field(obj, "ranks", lineno, source, lo=1, hi=MAX_TRACE_RANKS + 1,
                       where="header.")
    allocs = _int_field(obj, "allocs", lineno, source, lo=1, hi=MAX_TRACE_ALLOCS + 1,
                        where="header.")
    lay = parse_layout(obj, ranks, allocs, lineno, source, one_slot=not group)
    aliased = frozenset(a for a, p in enumerate(lay.allocations) if p.region is not None)
    owner_only = frozenset(a for a in aliased
                           if lay.regions[lay.allocations[a].region][2] == "owner")  # type: ignore[index]
    importers = derive_importers(ranks, lay.import_groups)
    readers = []
    for r in range(ranks):
        dec = lay.declared_readers
        s = frozenset(dec[r]) if dec is not None and r in dec else importers[r] | {r}
        if not importers[r] <= s:
            miss = sorted(importers[r] - s)
            raise _fail(source, lineno, f"header.topology.declared_readers[{r}] = {sorted(s)}: "
                                        f"importer {miss[0]} (from import_groups) is not a "
                                        "declared reader")
        readers.append(s)
    devices = _parse_devices(obj, ranks, lineno, source)
    _check_run_fields(obj, lineno, source)
    known = {"kind", "version", "ranks", "allocs", "devices", "granularity", "pages", "planes",
             "regions", "allocations", "reservations", "topology"}
    extra = {k: v for k, v in obj.items() if k not in known}
    return Header(ranks=ranks, allocs=allocs, aliased=aliased, owner_only=owner_only,
                  importers=importers, declared_readers=tuple(readers), devices=devices,
                  version=LIFECYCLE_VERSION, extra=extra, layout=lay)


def _parse_devices(obj: dict[str, Any], ranks: int, lineno: int, source: str) -> dict[int, int]:
    dev_raw = _rank_table(obj, "devices", ranks, lineno, source)
    devices = {r: r for r in range(ranks)}
    if dev_raw is not None:
        for r, d in dev_raw.items():
            if not _is_int(d) or not 0 <= d <= _MAX_ORDINAL:
                raise _fail(source, lineno, f"header.devices[{r}] = {_show(d)}: must be a "
                                            f"CUDA ordinal in 0..{_MAX_ORDINAL}")
            devices[r] = d
        if len(set(devices.values())) != ranks:
            raise _fail(source, lineno, f"header.devices = {dev_raw!r}: two ranks share a device")
    return devices


def _parse_header(obj: dict[str, Any], lineno: int, source: str) -> Header:
    """A version-1 header (the constants as lists, no plan): the model-only traces that
    tests, mutants and the drift guard build (``parse_trace_lines(model_only=True)``)."""
    if obj.get("kind") != "header":
        raise _fail(source, lineno, f"kind = {obj.get('kind')!r}: line 1 must be the header "
                                    "(kind = 'header')")
    version = obj.get("version")
    if not _is_int(version) or version != 1:  # True and 1.0 compare equal to 1
        raise _fail(source, lineno, f"header.version = {version!r}: only version 1 is supported")
    ranks = _int_field(obj, "ranks", lineno, source, lo=1, hi=MAX_TRACE_RANKS + 1,
                       where="header.")
    allocs = _int_field(obj, "allocs", lineno, source, lo=1, hi=MAX_TRACE_ALLOCS + 1,
                        where="header.")
    aliased = _int_set(obj.get("aliased", []), "header.aliased", lineno, source, allocs, "alloc")
    owner_only = _int_set(obj.get("owner_only", []), "header.owner_only", lineno, source,
                          allocs, "alloc")
    if not owner_only <= aliased:
        extra = sorted(owner_only - aliased)
        raise _fail(source, lineno, f"header.owner_only = {sorted(owner_only)}: alloc {extra[0]} "
                                    "is not aliased (owner_only must be a subset of aliased)")
    imp_raw = _rank_table(obj, "importers", ranks, lineno, source)
    if imp_raw is None:
        raise _fail(source, lineno, "header.importers is missing (object rank -> list of ranks)")
    importers = []
    for r in range(ranks):
        s = _int_set(imp_raw.get(r, []), f"header.importers[{r}]", lineno, source, ranks, "rank")
        if r in s:
            raise _fail(source, lineno, f"header.importers[{r}] = {sorted(s)}: a rank does not "
                                        "import its own memory")
        importers.append(s)
    dec_raw = _rank_table(obj, "declared_readers", ranks, lineno, source)
    readers = []
    for r in range(ranks):
        if dec_raw is None:
            s = importers[r] | {r}
        else:
            s = _int_set(dec_raw.get(r, []), f"header.declared_readers[{r}]", lineno, source,
                         ranks, "rank")
        if not importers[r] <= s:
            miss = sorted(importers[r] - s)
            raise _fail(source, lineno, f"header.declared_readers[{r}] = {sorted(s)}: importer "
                                        f"{miss[0]} is not a declared reader")
        readers.append(s)
    devices = _parse_devices(obj, ranks, lineno, source)
    _check_run_fields(obj, lineno, source)
    known = {"kind", "version", "ranks", "allocs", "aliased", "owner_only", "importers",
             "declared_readers", "devices"}
    extra = {k: v for k, v in obj.items() if k not in known}
    return Header(ranks=ranks, allocs=allocs, aliased=aliased, owner_only=owner_only,
                  importers=tuple(importers), declared_readers=tuple(readers),
                  devices=devices, version=1, extra=extra)


_PHASE_SET = frozenset(PHASES)
_GROUP_STATE_KEYS = frozenset({"phase"})
_RANK_STATE_KEYS = frozenset({"phase", *RANK_COUNTERS})
_BOOL_COUNTERS = tuple(k for k, t in RANK_COUNTERS.items() if t is bool)
_INT_COUNTERS = tuple(k for k, t in RANK_COUNTERS.items() if t is int)


def _parse_event(obj: dict[str, Any], lineno: int, index: int, h: Header,
                 source: str) -> Event:
    # Hot path (10^5 events): exact type() checks, messages built only on failure.
    get = obj.get
    if get("kind") != "event":
        raise _fail(source, lineno, f"kind = {get('kind')!r}: every line after the header "
                                    "must be an event (kind = 'event')")
    seq = get("seq")
    if type(seq) is not int or seq != index:
        # the value as written (was: "seq = '2': expected 2", a Python repr of a string)
        kind = "" if type(seq) is int else "the integer "
        raise _fail(source, lineno, f"seq = {show_value(seq)}: expected {kind}{index} (seq "
                                    "counts from 0 without gaps)")
    action = get("action")
    if type(action) is not str or action not in EVENT_ACTIONS:
        raise _fail(source, lineno, f"action = {action!r}: not a lifecycle action "
                                    f"(one of {', '.join(sorted(EVENT_ACTIONS))})")
    rank = get("rank")
    if action in GROUP_ACTIONS:
        if rank is not None:
            raise _fail(source, lineno, f"rank = {rank!r}: must be null for group action {action}")
    elif type(rank) is not int or not 0 <= rank < h.ranks:
        raise _fail(source, lineno, f"rank = {show_value(rank)}: {action} needs an integer "
                                    f"rank in 0..{h.ranks - 1}")
    args = get("args")
    if args is None:
        args = {}
    elif type(args) is not dict:
        raise _fail(source, lineno, f"args = {args!r}: must be an object")
    elif args and not _NOT_ARGS[action].isdisjoint(args):
        key = min(_NOT_ARGS[action].intersection(args))
        takes = ", ".join(ACTIONS[action].args) or "none"
        raise _fail(source, lineno, f"args.{key} = {_show(args[key])}: {action} takes no "
                                    f"{key} (its args: {takes})")
    alloc = args.get("alloc")
    mapping = args.get("mapping")
    if action in _NEEDS_ALLOC and (type(alloc) is not int or not 0 <= alloc < h.allocs):
        _int_field(args, "alloc", lineno, source, hi=h.allocs, where="args.")
    if action in _NEEDS_MAPPING and mapping not in MAPPINGS:
        raise _fail(source, lineno, f"args.mapping = {mapping!r}: {action} needs "
                                    "'plane' or 'alias'")
    if action == "Grant":
        devs = args.get("devices")
        if type(devs) is not list or not all(type(d) is int and d >= 0 for d in devs):
            raise _fail(source, lineno, f"args.devices = {_show(devs)}: Grant needs a list "
                                        "of CUDA ordinals (integers >= 0)")
        if len(set(devs)) != len(devs):
            raise _fail(source, lineno, f"args.devices = {devs!r}: duplicate device")
    elif action == "Abort" and args.get("failed_rank") is not None:
        _int_field(args, "failed_rank", lineno, source, hi=h.ranks, where="args.")
    call, result = get("call"), get("result")
    if call is not None and call != RANK_ACTIONS.get(action):
        if not isinstance(call, str):
            raise _fail(source, lineno, f"call = {call!r}: must be a string or null")
        if action != "Reserve":
            raise _fail(source, lineno, f"call = {call!r}: {action} calls "
                                        f"{RANK_ACTIONS.get(action)!r}")
        if call not in SETUP_CALLS or type(result) is not str or result == SUCCESS:
            raise _fail(source, lineno, f"call = {_show(call)}: Reserve calls "
                                        f"{RANK_ACTIONS['Reserve']!r} (only a failed Reserve "
                                        "may name the set-up query that stopped the start-up "
                                        f"before it: {', '.join(sorted(SETUP_CALLS))})")
        reserved = _reserved_rank(h)
        if reserved is not None:  # (was: accepted after the other ranks had reserved)
            raise _fail(source, lineno, f"call = {_show(call)}: a set-up query fails only "
                                        "before any rank reserved, but the header gives rank "
                                        f"{reserved} a reservation base")
    if result is not None and type(result) is not str:
        raise _fail(source, lineno, f"result = {result!r}: must be a string or null")
    if RANK_ACTIONS.get(action) is not None and (call is None or result is None):
        raise _fail(source, lineno, f"call = {json.dumps(call)}, result = "
                                    f"{json.dumps(result)}: {action} is a "
                                    f"driver step: it names its call "
                                    f"({RANK_ACTIONS[action]!r}) and the CUresult it returned")
    state = get("state")
    if type(state) is not dict:
        raise _fail(source, lineno, f"state = {state!r}: must be an object (abstract state "
                                    "after the event)")
    if type(state.get("phase")) is not str or state.get("phase") not in _PHASE_SET:
        raise _fail(source, lineno, f"state.phase = {state.get('phase')!r}: must be one of "
                                    f"{', '.join(PHASES)}")
    extra = sorted(set(state) - (_GROUP_STATE_KEYS if rank is None else _RANK_STATE_KEYS),
                   key=str)
    if extra:  # (was: ignored, so a state could claim what the model never compared)
        what = ("a group event's state is its phase alone" if rank is None else
                f"a rank event's state is phase, {', '.join(RANK_COUNTERS)}")
        raise _fail(source, lineno, f"state.{extra[0]} = {_show(state[extra[0]])}: unknown "
                                    f"key ({what})")
    if rank is not None:
        sget = state.get
        for key in _BOOL_COUNTERS:
            if type(sget(key)) is not bool:
                raise _fail(source, lineno, f"state.{key} = {sget(key)!r}: must be true/false")
        for key in _INT_COUNTERS:
            v = sget(key)
            if type(v) is not int or v < 0:
                raise _fail(source, lineno, f"state.{key} = {v!r}: must be an integer >= 0")
    t = get("t")
    if t is not None and (type(t) is not float and type(t) is not int
                          or not math.isfinite(t) or t < 0):
        raise _fail(source, lineno, f"t = {_show(t)}: must be a finite number of seconds "
                                    ">= 0")
    objs = []
    for key in _OBJECT_FIELDS:
        v = get(key)
        if v is not None and (type(v) is not int or v < 0):
            raise _fail(source, lineno, f"{key} = {_show(v)}: must be an integer >= 0 or null")
        objs.append(v)
    for key in _NULL_FIELDS[action]:
        if get(key) is not None:
            raise _fail(source, lineno, null_field_rule(key, get(key), action))
    if not obj.keys() <= _EVENT_KEYS:  # (was: ignored, read by nothing)
        raise _fail(source, lineno, unknown_event_key(obj))
    if action in _UNDO_NAMES and result != SUCCESS and h.layout is not None:
        why = unnamed_undo_field(action, get)  # (a model-only trace names no objects)
        if why:
            raise _fail(source, lineno, why)
    return Event(index, lineno, seq, rank, action, args, call, result, state, obj,
                 alloc, mapping, *objs)


#: The fields naming an event's objects (CUDA ordinal, VA, bytes, handle id).
_OBJECT_FIELDS = ("device", "va", "size", "handle")
#: The undo steps (the group model's, which hold the one-process ones) and the object
#: fields their line sets.
_UNDO_NAMES = {a: tuple(k for k in ("va", "size", "handle") if getattr(sh, k))
               for a, sh in {**ACTIONS, **GROUP_SHAPES}.items() if a in UNDO_STEPS}


def unnamed_undo_field(action: str, get: Any) -> str:
    """Why a failed undo step's line leaves out the object it was undoing ('' when it
    names it). A forward step that failed may name no VA (none was made), but an undo
    acts on a live object the runtime knows: a failed Release without its handle, or
    a failed Unmap or Free without its range, hid what was leaked (review 2026-12-07,
    a runtime mutant that traced failed undos with null fields conformed)."""
    for key in _UNDO_NAMES[action]:
        if get(key) is None:
            return (f"{key} = null: a failed {action} names its {key} (the object it was "
                    "undoing, which stays live)")
    return ""
#: Every key an event line has (kvgrant.traceformat; group events have the same).
_EVENT_KEYS = frozenset(EVENT_FIELDS)


def unknown_event_key(obj: Mapping[str, Any]) -> str:
    """The message for an event object with a key the format does not have."""
    key = min((k for k in obj if k not in _EVENT_KEYS), key=str)
    return (f"{key} = {show_value(obj[key])}: unknown key (an event has "
            f"{', '.join(EVENT_FIELDS)})")


def null_fields(shapes: Mapping[str, Any]) -> dict[str, tuple[str, ...]]:
    """Per action, the object fields its line leaves null (``va``, ``size`` or
    ``handle`` its shape does not set; docs/INTERFACES.md): e.g. a handle on Reserve."""
    return {a: tuple(k for k in ("va", "size", "handle") if not getattr(s, k))
            for a, s in shapes.items()}


def null_field_rule(key: str, value: Any, action: str) -> str:
    """The message for a ``key`` that ``action``'s line leaves null."""
    return f"{key} = {_show(value)}: must be null: a {action} event carries no {key}"


#: (a group event is no rank's, so it names no device either: a Publish naming one was
#: read without a word)
_NULL_FIELDS = {a: (("device",) if a in GROUP_ACTIONS else ()) + ks
                for a, ks in null_fields(ACTIONS).items()}
#: Row indices of those fields, for the fast path.
_NULL_IDX = {a: tuple(ROW[k] for k in ks) for a, ks in _NULL_FIELDS.items()}


# --- fast path -----------------------------------------------------------------------------
# Why: a published-scale trace is ~2*10^5 lines / ~70 MB; json.loads builds ~3 dicts and a
# dozen objects per line (>1 s). Lines written by kvgrant.runtime.trace have one fixed
# shape, so one regex (a strict subset of valid JSON with the right types) checks every
# line in C and captures only what the checks and the replay need. The remaining rules
# are checked per distinct combination of fields, not per line. Anything the fast path
# cannot vouch for -- other key order, spacing, a bad value -- sends the whole text to
# the detailed reader (parse_trace_lines), which raises the exact error with its line.

_FAST_EVENT = FAST_EVENT
_SEQ = itemgetter(ROW["seq"])
_ALLOC = itemgetter(ROW["alloc"])
_COMBO = itemgetter(*(ROW[k] for k in ("rank", "action", "has_alloc", "mapping", "devices",
                                       "failed_rank", "call", "result", "has_counters")))


def _combo_ok(h: Header, rank: str, action: str, has_alloc: str, mapping: str,
              devices: str, failed_rank: str, call: str, result: str,
              has_counters: str) -> bool:
    """The per-event rules of :func:`_parse_event` for one distinct field combination
    (the regex already fixed every type); False sends the text to the detailed reader."""
    if action in GROUP_ACTIONS:
        if rank != "null" or has_counters:  # (its state is the phase alone)
            return False
    elif rank == "null" or int(rank) >= h.ranks or not has_counters:
        return False
    if action in _NEEDS_ALLOC and not has_alloc:
        return False
    if action in _NEEDS_MAPPING and not mapping:
        return False
    not_args = _NOT_ARGS[action]  # a key the action does not take: the detailed reader names it
    if (has_alloc and "alloc" in not_args) or (mapping and "mapping" in not_args) \
            or (devices and "devices" in not_args) or (failed_rank and "failed_rank" in not_args):
        return False
    if action == "Grant":
        if not devices:
            return False
        devs = json.loads(devices)
        if len(set(devs)) != len(devs):
            return False
    if action == "Abort" and failed_rank and failed_rank != "null" \
            and int(failed_rank) >= h.ranks:
        return False
    want = RANK_ACTIONS.get(action)
    if want is None:
        return call == "null"
    if result == "null":   # a driver step names both
        return False
    return call[1:-1] == want or (action == "Reserve" and call[1:-1] in SETUP_CALLS
                                  and result != '"' + SUCCESS + '"'
                                  and _reserved_rank(h) is None)


def _reserved_rank(h: Header) -> int | None:
    """The first rank the header gives a reservation base (None: none has one, as when
    a set-up query stopped the start-up before any reserve; docs/INTERFACES.md)."""
    if h.layout is None:
        return None
    return next((r for r, (base, _) in sorted(h.layout.reservations.items())
                 if base is not None), None)


def _parse_fast(text: str, source: str) -> Trace | None:
    """The whole trace through the fast path, or None when any line needs the detailed
    reader (never raises for an event line; a bad header raises as usual)."""
    nl = text.find("\n")
    if nl < 0 or nl + 1 == len(text):
        return None
    n = text.count("\n", nl + 1) + (0 if text.endswith("\n") else 1)
    with gc_paused():  # ~10^6 new tuples and strings, no cycles: a collection only rescans
        rows = _FAST_EVENT.findall(text, nl + 1)
        # each match is one whole line (anchored, no newline inside): n matches = every line
        if len(rows) != n:
            return None
        header = _parse_lifecycle_header(_json_object(text[:nl], 1, source), 1, source)
        if list(map(_SEQ, rows)) != list(map(str, range(n))):
            return None
        if any(a and int(a) >= header.allocs for a in set(map(_ALLOC, rows))):
            return None
        if not all(_combo_ok(header, *key) for key in set(map(_COMBO, rows))):
            return None
        action_at = ROW["action"]
        if any(row[i] != "null" for row in rows for i in _NULL_IDX[row[action_at]]):
            return None   # the detailed reader names the field
        rank_at, result_at = ROW["rank"], ROW["result"]
        ok = '"' + SUCCESS + '"'
        if header.layout is not None and any(
                row[action_at] in _UNDO_NAMES and row[result_at] != ok
                and unnamed_undo_field(row[action_at],
                                       lambda k, row=row: None if row[ROW[k]] == "null" else 1)
                for row in rows):
            return None   # a failed undo naming no object: the detailed reader names it
        reserves = [(int(row[rank_at]), row[result_at] == ok) for row in rows
                    if row[action_at] == "Reserve"]
        if unreserved_base(header, {r for r, good in reserves if good},
                           {r: 0 for r, good in reserves if not good},
                           any(row[action_at] in _ENDS for row in rows)):
            return None   # the detailed reader names the line of the failed Reserve
        return Trace(header=header, events=_LazyEvents(text, nl + 1, n, header, source),
                     source=source, rows=tuple(rows))


class _LazyEvents(Sequence[Event]):
    """The events of a fast-parsed trace, each built (and cached) on first access:
    the replay reads rows, so an accepted trace never pays for 10^5 Event objects."""

    __slots__ = ("_text", "_start", "_n", "_header", "_source", "_lines", "_cache")

    def __init__(self, text: str, start: int, n: int, header: Header, source: str) -> None:
        self._text, self._start, self._n = text, start, n
        self._header, self._source = header, source
        self._lines: list[str] | None = None
        self._cache: dict[int, Event] = {}

    def __len__(self) -> int:
        return self._n

    def _get(self, i: int) -> Event:
        ev = self._cache.get(i)
        if ev is None:
            if self._lines is None:
                self._lines = self._text[self._start:].split("\n")
            line = self._lines[i]
            obj = _json_object(line, i + 2, self._source)
            ev = _parse_event(obj, i + 2, i, self._header, self._source)
            self._cache[i] = ev
        return ev

    @overload
    def __getitem__(self, i: int) -> Event: ...
    @overload
    def __getitem__(self, i: slice) -> tuple[Event, ...]: ...

    def __getitem__(self, i: int | slice) -> Event | tuple[Event, ...]:
        if isinstance(i, slice):
            return tuple(self._get(k) for k in range(*i.indices(self._n)))
        if i < 0:
            i += self._n
        if not 0 <= i < self._n:
            raise IndexError(f"event index {i} out of range (0..{self._n - 1})")
        return self._get(i)

    def __iter__(self) -> Iterator[Event]:
        return (self._get(k) for k in range(self._n))
