"""The Python engine: replay a trace through :mod:`kvgrant.conformance.model`.

Each event must act on the object the header's plan names
(:mod:`kvgrant.conformance.objects`: device, VA, size, handle), be an enabled action of
the model (a failed driver call is ``Fail(r, x)``, a failed undo -- cuMemUnmap,
cuMemRelease, cuMemAddressFree -- is ``UndoFail``), a Grant -- a failed one too: it
names the devices it was given -- must name exactly ``GrantSet(r, a, m)`` (importers
derived from the header's import groups), and the
event's recorded abstract state must equal the model's state after it. The trace is
accepted when every event matches and the last state is terminal (Published,
Aborted or Shutdown), or an unwinding that ended leaking (an undo failed, every rank
ran every undo, and no AbortComplete / ShutdownComplete was traced: the spec's
``UnwindEndedLeaking``). A rejection names the first unmatched event with the model
state before it and the actions enabled there; the TLC engine
(:mod:`kvgrant.conformance.tla_trace`) reports the same index.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kvgrant.conformance.model import (RANK_STEPS, TERMINAL_PHASES, UNDO_STEPS, Action,
                                       Constants, ModelState, apply, enabled, guard,
                                       initial_state, step_guard, unwind_ended_leaking)
from kvgrant.conformance.objects import ObjectChecker, RowObjects, objects_before
from kvgrant.conformance.trace_io import DRIVER_STEPS, Event, Trace, load_trace, require_trace
from kvgrant.errors import ArgumentError
from kvgrant.gc_pause import gc_paused
from kvgrant.traceformat import ROW, state_template

__all__ = ["Verdict", "event_action", "replay", "replay_file"]


@dataclass
class Verdict:
    """What an engine concluded about one trace.

    ``index`` is the 0-based position of the first event the model does not allow,
    or ``events`` (one past the last) when every event matched but the trace stops
    in a non-terminal phase; None when accepted.
    """

    accepted: bool
    engine: str
    events: int
    ranks: int
    seconds: float
    index: int | None = None
    event: Event | None = None
    reason: str = ""
    state_before: dict[str, Any] | None = None
    enabled: list[str] = field(default_factory=list)
    final_phase: str | None = None

    @property
    def line(self) -> int | None:
        """1-based line of the rejected event in the trace file (header is line 1)."""
        if self.accepted or self.index is None:
            return None
        return self.event.line if self.event is not None else self.events + 2

    def summary(self) -> str:
        """One line for humans."""
        if self.accepted:
            leak = "" if self.final_phase in TERMINAL_PHASES or self.final_phase is None \
                else " (an undo failed: the unwinding ended with objects left live)"
            return (f"accepted by {self.engine}: {self.events:,} events, {self.ranks} ranks, "
                    f"final phase {self.final_phase}{leak}, {self.seconds:.3f} s")
        what = self.event.describe() if self.event is not None else "end of trace"
        return (f"rejected by {self.engine} at event {self.index} (line {self.line}): "
                f"{what}: {self.reason}")

    def to_json(self) -> dict[str, Any]:
        return {
            "accepted": self.accepted, "engine": self.engine, "events": self.events,
            "ranks": self.ranks, "seconds": round(self.seconds, 6), "index": self.index,
            "line": self.line, "final_phase": self.final_phase, "reason": self.reason,
            "event": None if self.event is None else dict(self.event.raw),
            "state_before": self.state_before, "enabled": list(self.enabled),
        }


def event_action(ev: Event) -> Action:
    """The model action an event claims: a failed driver call is Fail(r, action), a
    failed undo (Unmap, Release, Free) UndoFail."""
    if ev.ok:
        return Action(ev.action, ev.rank, ev.alloc, ev.mapping)
    if ev.action in UNDO_STEPS:
        return Action("UndoFail", ev.rank, ev.alloc, ev.mapping, step=ev.action)
    return Action("Fail", ev.rank, ev.alloc, ev.mapping, step=ev.action)


_MODEL_ONLY = frozenset({"RankReady", "Publish", "Abort", "Unpublish", "AbortComplete",
                         "ShutdownComplete"})


def _mismatch(c: Constants, s: ModelState, ev: Event, act: Action,
              dev_to_rank: dict[int, int]) -> str:
    """Why ``ev`` is not an allowed step from ``s`` ('' when it is); ``s`` is unchanged."""
    if act.name == "Fail" and ev.action not in DRIVER_STEPS:
        return (f"{ev.action} returned {ev.result}: the model allows failures only at the "
                "driver steps Reserve, Create, Map, MapAlias, Grant and the undo steps "
                "Unmap, Release, Free")
    if ev.result is not None and ev.action in _MODEL_ONLY:
        return f"{ev.action} is a model-only step but carries result {ev.result}"
    if not guard(c, s, act):
        if act.name in ("AbortComplete", "ShutdownComplete") and any(
                rs.leaked for rs in s.ranks):
            lk = [r for r, rs in enumerate(s.ranks) if rs.leaked]
            return (f"{act} after a failed undo: rank(s) {', '.join(map(str, lk))} "
                    "still hold the objects whose undo failed, so the attempt never "
                    "completes (UndoFailureNeverCompletes)")
        return f"{act} is not enabled in phase {s.phase}"
    if act.name == "Abort":  # (KVLifecycleTrace's IsAbort checks the same)
        named = ev.args.get("failed_rank")
        failed = [r for r, rs in enumerate(s.ranks) if rs.failed]
        if named not in failed:
            return (f"Abort names failed_rank {'null' if named is None else named}, but "
                    f"the rank whose driver step failed is {', '.join(map(str, failed))}")
    if act.name == "Fail" and not step_guard(c, s, act):
        return (f"{act}: StepEnabled holds but the failed call itself "
                f"({ev.action} with these arguments) could not run here")
    if ev.action == "Grant":  # a failed Grant too: it names the devices it was given
        want = c.grant_set(act.rank, act.alloc, act.mapping)
        key = tuple(ev.args.get("devices") or ())
        got = dev_to_rank.get(key)  # type: ignore[call-overload]
        if got is None:  # translate ordinals to ranks once per distinct device list
            got = frozenset(dev_to_rank.get(d, -1 - d) for d in key)
            dev_to_rank[key] = got  # type: ignore[index]
        if got != want:
            extra = sorted(d for d in got if d not in want)
            missing = sorted(want - got)
            what = "grants to" if ev.ok else f"was asked (and failed, {ev.result}) to grant"
            return (f"{what} ranks {sorted(got)} but GrantSet is {sorted(want)}"
                    + (f" (not owner or importer: {extra})" if extra else "")
                    + (f" (missing: {missing})" if missing else ""))
    return ""


def _state_mismatch(s: ModelState, ev: Event) -> str:
    """'' when the event's recorded abstract state equals the model's (after the step)."""
    st = ev.state
    phase_ok = st["phase"] == s.phase
    if ev.rank is None:
        if phase_ok:
            return ""
    else:
        rs = s.ranks[ev.rank]
        if (phase_ok and st["created"] == len(rs.created) and st["mapped"] == len(rs.mapped)
                and st["grants"] == rs.grants and st["alias_mapped"] == len(rs.alias_mapped)
                and st["va"] == rs.va and st["ready"] == rs.ready
                and st["failed"] == rs.failed):
            return ""
    diffs = [] if phase_ok else [f"phase {st['phase']!r} != model {s.phase!r}"]
    if ev.rank is not None:
        for key, want in s.ranks[ev.rank].counters().items():
            if st.get(key) != want:
                diffs.append(f"{key} {st.get(key)!r} != model {want!r}")
    return "recorded state disagrees with the model: " + "; ".join(diffs)


_SUCCESS_JSON = '"CUDA_SUCCESS"'
# positions of the fast reader's row fields (kvgrant.traceformat.ROW_FIELDS)
(_R_RANK, _R_ACTION, _R_ALLOC, _R_MAPPING, _R_DEVICES, _R_RESULT, _R_STATE, _R_DEVICE,
 _R_VA, _R_SIZE, _R_HANDLE, _R_FAILED) = (ROW[k] for k in (
     "rank", "action", "alloc", "mapping", "devices", "result", "state", "device", "va",
     "size", "handle", "failed_rank"))


def _int_or_none(text: str) -> int | None:
    return None if text == "null" else int(text)



class _RowEvent:
    """The fields of :class:`Event` that the checks read, from a fast-reader row
    (for the few rows that are not successful driver steps)."""

    __slots__ = ("rank", "action", "alloc", "mapping", "result", "args", "state", "device",
                 "va", "size", "handle")

    def __init__(self, row: tuple[str, ...]) -> None:
        self.rank = _int_or_none(row[_R_RANK])
        self.action = row[_R_ACTION]
        self.alloc = int(row[_R_ALLOC]) if row[_R_ALLOC] else None
        self.mapping = row[_R_MAPPING] or None
        self.result = None if row[_R_RESULT] == "null" else row[_R_RESULT][1:-1]
        self.args = {"devices": json.loads(row[_R_DEVICES])} if row[_R_DEVICES] else {}
        if row[_R_FAILED]:
            self.args["failed_rank"] = _int_or_none(row[_R_FAILED])
        self.state: dict[str, object] = json.loads("{" + row[_R_STATE] + "}")
        self.device = _int_or_none(row[_R_DEVICE])
        self.va = _int_or_none(row[_R_VA])
        self.size = _int_or_none(row[_R_SIZE])
        self.handle = _int_or_none(row[_R_HANDLE])

    @property
    def ok(self) -> bool:
        return self.result is None or self.result == "CUDA_SUCCESS"


def _replay_rows(c: Constants, s: ModelState, rows: tuple[tuple[str, ...], ...],
                 dev_to_rank: dict[int, int], objs: RowObjects) -> int:
    """Step the fast reader's rows (trace_io.ROW_FIELDS) through the model; returns the
    index of the first row it leaves to the detailed loop (len(rows) when none).

    Why: the detailed loop costs an Event per row. Here only successful driver steps
    are handled, with the same checks in the same order as :func:`_mismatch` and
    :func:`_state_mismatch` (guard, GrantSet, apply, recorded state); any other row,
    or any disagreement, stops the loop *before* the row's effect is applied (a state
    disagreement after apply is reported by the caller from a recomputed state).
    """
    ranks = s.ranks
    grant_cache: dict[str, frozenset[int]] = {}
    # the reader checked rank < NumRanks and alloc < NumAllocs: decimal text -> int by lookup
    rank_of = {str(r): r for r in range(c.ranks)}
    alloc_of = {str(a): a for a in range(c.allocs)}
    alloc_of[""] = None  # type: ignore[assignment]
    steps = RANK_STEPS  # the successful driver steps: guard and effect, as guard()/apply()
    check = objs.step
    templates: dict[tuple[str, bool, bool, bool], str] = {}
    for i, row in enumerate(rows):
        rank, action, alloc, mapping = row[_R_RANK], row[_R_ACTION], row[_R_ALLOC], \
            row[_R_MAPPING]
        devs, result, state = row[_R_DEVICES], row[_R_RESULT], row[_R_STATE]
        step = steps.get(action)
        if result != _SUCCESS_JSON or step is None:  # rare: group, model-only, failed
            ev = _RowEvent(row)
            act = event_action(ev)  # type: ignore[arg-type]
            if _mismatch(c, s, ev, act, dev_to_rank):  # type: ignore[arg-type]
                return i
            if ev.rank is not None and not check(ev.rank, action, ev.ok, ev.alloc, ev.mapping,
                                                 row[_R_DEVICE], row[_R_VA], row[_R_SIZE],
                                                 row[_R_HANDLE]):
                return i
            apply(c, s, act)
            if _state_mismatch(s, ev):  # type: ignore[arg-type]
                return -1 - i
            continue
        r = rank_of[rank]
        a = alloc_of[alloc]
        m = mapping or None
        if not step[0](c, s, r, a, m):  # = guard(c, s, Action(action, r, a, m))
            return i
        if action == "Grant":
            got = grant_cache.get(devs)
            if got is None:
                got = frozenset(dev_to_rank.get(d, -1 - d) for d in json.loads(devs))
                grant_cache[devs] = got
            if got != c.grant_set(r, a, m):  # type: ignore[arg-type]
                return i
        if not check(r, action, True, a, m, row[_R_DEVICE], row[_R_VA], row[_R_SIZE],
                     row[_R_HANDLE]):
            return i
        step[1](c, s, r, a, m)  # = apply(c, s, Action(action, r, a, m))
        rs = ranks[r]
        # the recorded state, written the way the trace writer does (ints and JSON
        # booleans have one spelling, so equal text is equal values)
        key = (s.phase, rs.va, rs.ready, rs.failed)
        tpl = templates.get(key)
        if tpl is None:  # the writer's state line (kvgrant.traceformat), braces off
            tpl = templates[key] = state_template(*key)[1:-1]
        if state != tpl % (len(rs.created), len(rs.mapped), len(rs.alias_mapped), rs.grants):
            return -1 - i  # applied: the caller recomputes the state before it
    return len(rows)



def replay(trace: Trace, *, engine: str = "python") -> Verdict:
    """Replay ``trace`` through the Python model; never raises on a rejected trace
    (an :class:`~kvgrant.errors.ArgumentError` when ``trace`` is not a Trace, or for an
    ``engine`` other than ``"python"``: only the Python model runs here, and
    ``engine="tlc"`` returned a Verdict claiming TLC had judged the trace)."""
    require_trace(trace, "replay")
    if not isinstance(engine, str) or engine != "python":
        raise ArgumentError(f"replay: engine = {engine!r}: must be 'python' (replay runs the "
                            "Python model only; check_trace_tlc runs TLC, check_trace(t, "
                            "engine='both') both)", argument="engine", value=engine)
    t0 = time.perf_counter()
    c = Constants.from_header(trace.header, None)
    s = initial_state(c)
    dev_to_rank: dict = trace.header.device_to_rank()  # also caches device lists
    objs = ObjectChecker(trace.header)
    events = trace.events
    start = 0
    if trace.rows is not None:
        with gc_paused():  # no cycles are made here; a collection would rescan 10^5 rows
            start = _replay_rows(c, s, trace.rows, dict(dev_to_rank),
                                 RowObjects(trace.header))
        if start < 0:
            start = -1 - start
            s = state_before(trace, start)
        if start < len(events):
            objs = objects_before(trace, start)
    for k in range(start, len(events)):
        ev = events[k]
        act = event_action(ev)
        why = _mismatch(c, s, ev, act, dev_to_rank)
        if not why:
            why = objs.step(ev)
        if not why:
            apply(c, s, act)
            why = _state_mismatch(s, ev)
            if why:
                s = state_before(trace, ev.index)
        if why:
            return Verdict(False, engine, len(events), c.ranks, time.perf_counter() - t0,
                           index=ev.index, event=ev, reason=why, state_before=s.to_json(),
                           enabled=[str(a) for a in enabled(c, s)], final_phase=None)
    seconds = time.perf_counter() - t0
    if s.phase not in TERMINAL_PHASES and not unwind_ended_leaking(s):
        return Verdict(False, engine, len(events), c.ranks, seconds, index=len(events),
                       event=None, reason=f"trace ends in phase {s.phase}, which is not "
                       "terminal (Published, Aborted or Shutdown, or an unwinding that "
                       "ran every undo after one failed)", state_before=s.to_json(),
                       enabled=[str(a) for a in enabled(c, s)], final_phase=s.phase)
    return Verdict(True, engine, len(events), c.ranks, seconds, final_phase=s.phase)


def state_before(trace: Trace, index: int) -> ModelState:
    """The model state after the first ``index`` events (assumed allowed)."""
    c = Constants.from_header(trace.header, None)
    s = initial_state(c)
    if trace.rows is not None:
        for row in trace.rows[:index]:
            apply(c, s, _row_action(row))
        return s
    for ev in trace.events[:index]:
        apply(c, s, event_action(ev))
    return s


def _row_action(row: tuple[str, ...]) -> Action:
    """:func:`event_action` of a fast-reader row (traceformat.ROW_FIELDS)."""
    rank, action, alloc, mapping, result = (row[_R_RANK], row[_R_ACTION], row[_R_ALLOC],
                                            row[_R_MAPPING], row[_R_RESULT])
    r = None if rank == "null" else int(rank)
    a = int(alloc) if alloc else None
    if result in ("null", _SUCCESS_JSON):
        return Action(action, r, a, mapping or None)
    if action in UNDO_STEPS:
        return Action("UndoFail", r, a, mapping or None, step=action)
    return Action("Fail", r, a, mapping or None, step=action)


def replay_file(path: str | Path) -> Verdict:
    """Load (TraceError if malformed) and replay one trace file."""
    return replay(load_trace(path))
