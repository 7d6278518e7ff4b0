"""The Python engine for group traces: find an interleaving of the processes' files
that is a behaviour of specs/KVGroup.tla (:mod:`kvgrant.conformance.group_model`).

Each file's events run in their own order. Processes synchronise only where the model
makes one wait for another: an Import needs the owner's Send of that fd, a Decide needs
every rank's Vote (or its death). The scheduler runs process 0 as far as it can, then
process 1, ..., and again, until every file is used up; a file that ends before a
terminal phase (Published, Aborted, Shutdown) is a crash, taken right after its last
event -- unless the process's unwinding ended leaking (an undo failed, every undo ran:
the spec's ``UnwindEndedLeaking``), where the runtime ends the file without
AbortComplete / ShutdownComplete. Why this finds an interleaving whenever one exists:
apart from those two waits every guard reads only the process's own variables, sends only accumulate, and a rank
named missing must have died without voting, so running a process early never
disables another's step.

Each event is first checked against the objects it names
(:mod:`kvgrant.conformance.group_objects`: device, VA, size, handle against the header's
plan and the live handles and mappings), then stepped in the model.

The first event the model does not allow is reported as (file, seq): a step whose own
guard fails (or that acts on the wrong object) is rejected at once; when no process can move, the lowest rank's waiting
event is rejected. The verdict carries the interleaving up to that event, which the TLC
engine (:func:`kvgrant.conformance.tla_trace.check_group_tlc`) replays as one
behaviour, so both engines judge the same event.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable

from kvgrant.conformance.group_io import STATE_KEYS, GroupTrace, load_group
from kvgrant.conformance.group_objects import GroupObjects
from kvgrant.conformance.group_model import (FAST_STEPS, TERMINAL_PHASES, UNDO_STEPS, WAIT,
                                             GroupConstants, GroupState, crash,
                                             enabled_actions, initial_group, step,
                                             unwind_ended_leaking)
from kvgrant.gc_pause import gc_paused

__all__ = ["CRASH", "GroupVerdict", "group_state_json", "replay_group", "replay_group_files"]

#: The seq used in an interleaving for a process's crash (after its last event).
CRASH = -1
_SUCCESS = ("CUDA_SUCCESS", "SUCCESS")


@dataclass
class GroupVerdict:
    """What an engine concluded about a group's traces.

    ``rank``/``index`` name the first event the model does not allow (its file and its
    seq; the line is seq + 2); ``order`` is the interleaving (rank, seq) the engine
    followed, ending with that event when rejected (seq -1: that process's crash).
    """

    accepted: bool
    engine: str
    events: int
    procs: int
    seconds: float
    rank: int | None = None
    index: int | None = None
    source: str | None = None
    event: dict[str, Any] | None = None
    reason: str = ""
    state_before: dict[str, Any] | None = None
    enabled: list[str] = field(default_factory=list)
    final: dict[int, str] = field(default_factory=dict)
    order: list[tuple[int, int]] = field(default_factory=list, repr=False)

    @property
    def line(self) -> int | None:
        return None if self.index is None else self.index + 2

    @property
    def where(self) -> tuple[int, int] | None:
        """(rank, seq) of the rejected event."""
        return None if self.accepted or self.rank is None else (self.rank, self.index or 0)

    def summary(self) -> str:
        if self.accepted:
            ends = ", ".join(f"r{r} {ph}" for r, ph in sorted(self.final.items()))
            return (f"accepted by {self.engine}: {self.procs} processes, {self.events:,} "
                    f"events ({ends}), {self.seconds:.3f} s")
        ev = self.event or {}
        what = f"{ev.get('action')} {json.dumps(ev.get('args', {}), sort_keys=True)}"
        return (f"rejected by {self.engine} at {self.source} seq {self.index} (line "
                f"{self.line}, rank {self.rank}): {what}: {self.reason}")

    def to_json(self) -> dict[str, Any]:
        return {"accepted": self.accepted, "engine": self.engine, "events": self.events,
                "procs": self.procs, "seconds": round(self.seconds, 6), "rank": self.rank,
                "index": self.index, "line": self.line, "source": self.source,
                "reason": self.reason, "event": self.event, "state_before": self.state_before,
                "enabled": list(self.enabled),
                "final": {str(r): p for r, p in sorted(self.final.items())}}


def group_state_json(g: GroupState, p: int | None) -> dict[str, Any]:
    """The acting process's variables in full, and every process's phase, vote,
    decision and liveness (the group-wide part a step can depend on)."""
    return {"process": None if p is None else g.procs[p].to_json(),
            "group": {str(q): {"phase": s.phase, "vote": s.vote, "decision": s.decision,
                               "crashed": s.crashed} for q, s in enumerate(g.procs)}}


def _state_diff(s: Any, recorded: Any) -> str:
    want = s.counters()
    if isinstance(recorded, str):
        try:
            recorded = json.loads("{" + recorded + "}")
        except json.JSONDecodeError:
            return "recorded state is not a JSON object"
    if not isinstance(recorded, dict):
        return "recorded state is not an object"
    diffs = [f"{k} {recorded.get(k)!r} != model {want[k]!r}" for k, _ in STATE_KEYS
             if recorded.get(k) != want[k]
             or type(recorded.get(k)) is not type(want[k])]
    return "" if not diffs else "recorded state disagrees with the model: " + "; ".join(diffs)


def _redo(c: GroupConstants, t: GroupTrace, order: list[tuple[int, int]]) -> GroupState:
    """The group state after the events of ``order`` (each assumed allowed)."""
    g = initial_group(c)
    for p, k in order:
        if k == CRASH:
            crash(g, p)
            continue
        action, e, result, _ = t.procs[p].rows[k]
        step(c, g, p, action, e, result is None or result in _SUCCESS)
    return g


def _wait_reason(c: GroupConstants, g: GroupState, t: GroupTrace, p: int, k: int) -> str:
    action, e, _, _ = t.procs[p].rows[k]
    if action == "Import":
        return (f"rank {e.owner} never sends allocation {e.alloc} to rank {p} (no Send "
                f"{{alloc: {e.alloc}, to: {p}}} in rank {e.owner}'s trace that can come "
                "before this Import)")
    waiting = [q for q, s in enumerate(g.procs) if s.vote == "none" and not s.crashed]
    return (f"Decide before every rank voted: ranks {waiting} neither voted nor ended "
            "(their traces cannot reach a Vote)")


def replay_group(t: GroupTrace, *, engine: str = "python", fast: bool = True) -> GroupVerdict:
    """Check the group's files against the model; never raises on a rejected group.
    ``fast=False`` skips :data:`FAST_STEPS` (every event through :func:`step`)."""
    t0 = time.perf_counter()
    fast_steps = FAST_STEPS if fast else {}
    c = t.constants
    g = initial_group(c)
    n = c.ranks
    pos = [0] * n
    ended = [False] * n
    order: list[tuple[int, int]] = []
    total = t.events
    objects = [GroupObjects(pt.header) for pt in t.procs]

    def reject(p: int, k: int, why: str, g_before: GroupState) -> GroupVerdict:
        pt = t.procs[p]
        return GroupVerdict(False, engine, total, n, time.perf_counter() - t0, rank=p,
                            index=k, source=pt.source, event=pt.raw_event(k), reason=why,
                            state_before=group_state_json(g_before, p),
                            enabled=enabled_actions(c, g_before, p), order=order + [(p, k)])

    with gc_paused():
        moved = True
        while moved:
            moved = False
            for p in range(n):
                if ended[p]:
                    continue
                rows = t.procs[p].rows
                objs = t.procs[p].objs
                ob = objects[p]
                s = g.procs[p]
                k = pos[p]
                start = k
                while k < len(rows):
                    action, e, result, state = rows[k]
                    ok = result is None or result in _SUCCESS
                    dv, va, size, hd = objs[k]
                    why = ob.check(action, ok, e, dv, va, size, hd)
                    if why:
                        order.extend((p, j) for j in range(start, k))
                        return reject(p, k, why, g)
                    fast = fast_steps.get(action) if result in _SUCCESS else None
                    why = "" if fast is not None and fast(c, g, p, e) else \
                        step(c, g, p, action, e, ok)
                    if why:
                        if why is WAIT:
                            break
                        order.extend((p, j) for j in range(start, k))
                        return reject(p, k, why, g)
                    if ok:
                        ob.apply(action, e, va, size, hd)
                    elif action in UNDO_STEPS:
                        ob.leak(action, e)
                    if state.__class__ is not str or state != s.state_text():
                        why = _state_diff(s, state)
                        if why:
                            order.extend((p, j) for j in range(start, k))
                            return reject(p, k, why, _redo(c, t, order))
                    k += 1
                order.extend((p, j) for j in range(start, k))
                if k > start:
                    moved = True
                pos[p] = k
                if k == len(rows):
                    ended[p] = True
                    moved = True
                    if s.phase not in TERMINAL_PHASES and not unwind_ended_leaking(s, p):
                        crash(g, p)
                        order.append((p, CRASH))
        stuck = [p for p in range(n) if not ended[p]]
        if stuck:
            # an Import that waits for a Send is a cause; a Decide that waits for a vote is
            # usually its consequence: report the lowest-ranked Import first
            imports = [p for p in stuck if t.procs[p].rows[pos[p]][0] == "Import"]
            p = (imports or stuck)[0]
            return reject(p, pos[p], _wait_reason(c, g, t, p, pos[p]), g)
    final = {p: ("crashed in " + s.phase) if s.crashed else
             (s.phase + " (an undo failed: objects left live)") if s.leaked else s.phase
             for p, s in enumerate(g.procs)}
    return GroupVerdict(True, engine, total, n, time.perf_counter() - t0, final=final,
                        order=order)


def replay_group_files(paths: Iterable[str | Path], *, fast: bool = True) -> GroupVerdict:
    """Load (TraceError if malformed) and check the trace files of one group.

    ``fast``: first try :func:`kvgrant.conformance.group_fast.fast_accept`, which
    accepts a group of clean runs without stepping the model per event; anything else
    is replayed here, so a rejection is the same with or without it."""
    paths = list(paths)
    if fast:
        from kvgrant.conformance.group_fast import fast_accept

        v = fast_accept(paths)
        if v is not None:
            return v
    return replay_group(load_group(paths))
