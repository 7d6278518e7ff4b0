"""The group model specs/KVGroup.tla in Python: one process per rank.

Same variables, action names and guards as the spec (docs/group-trace.md lists the
events). Each step function takes the group state, the acting process and the event's
arguments and returns ``""`` when the step is allowed (and has then been applied), or
why not. A step that only waits for another process (an Import whose Send has not
happened yet, a Decide while some rank can still vote) returns :data:`WAIT` instead,
so the replay (:mod:`kvgrant.conformance.group_replay`) can run another process first.

Why mutable and counter-based: a published-scale group is 16 processes of 10^4-10^5
events; every guard here is O(1) (or O(log ranks)), and the plan-order guards rely on
the spec's sequencing (each allocation complete before the next Create, each import
complete before the next Import), so "every earlier one is complete" is "the previous
one is complete".

A failed undo (a failed Unmap, Release, Free, ImportUnmap or ImportRelease) is the
spec's ``UndoFail``: its object is leaked (:attr:`ProcState.leaked`, named as in the
spec: ``("plane", p, a)``, ``("ihandle", o, a)``, ...), stays live and is never undone
again; the unwinding guards read it as gone for the order, so the process goes on as
the runtime does and never reaches AbortComplete / ShutdownComplete
(:func:`unwind_ended_leaking` is where its file may end).
"""

from __future__ import annotations

from bisect import bisect_left
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping, NamedTuple, Sequence

__all__ = [
    "Args",
    "FAIL_STEPS",
    "FAST_STEPS",
    "FORWARD_GUARDS",
    "GROUP_ACTIONS",
    "GroupConstants",
    "GroupState",
    "ProcState",
    "STEPS",
    "TERMINAL_PHASES",
    "UNDO_STEPS",
    "WAIT",
    "constants_from",
    "crash",
    "enabled_actions",
    "initial_group",
    "step",
    "unwind_ended_leaking",
]

TERMINAL_PHASES = frozenset({"Published", "Aborted", "Shutdown"})
#: Forward steps that may fail (a failed one is Fail(p, x)).
FAIL_STEPS = ("Reserve", "Create", "Map", "MapAlias", "Grant", "Export", "Send", "Import",
              "ImportMap", "ImportGrant")
#: Every event action of a group trace (docs/group-trace.md).
GROUP_ACTIONS = FAIL_STEPS + ("RankReady", "Vote", "Decide", "Publish", "Abort",
                              "AbortComplete", "Unpublish", "ShutdownComplete",
                              "ImportUnmap", "ImportRelease", "Unmap", "Release", "Free")
#: The unwinding steps that may fail (a failed one is UndoFail(p, x)).
UNDO_STEPS = frozenset({"ImportUnmap", "ImportRelease", "Unmap", "Release", "Free"})
#: Returned by a step that may become allowed once another process acts.
WAIT = "\x00wait"
_MAPPINGS = ("plane", "alias")


@dataclass(frozen=True)
class GroupConstants:
    """KVGroup's CONSTANTS, plus derived tables (Sources, mapping kinds)."""

    ranks: int
    allocs: int
    aliased: frozenset[int]
    owner_only: frozenset[int]
    importers: tuple[frozenset[int], ...]
    declared_readers: tuple[frozenset[int], ...]
    #: the spec's MaxUndoFailures (None: any number, as trace validation allows)
    max_undo_failures: int | None = None
    sources: tuple[tuple[int, ...], ...] = field(init=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "sources", tuple(
            tuple(o for o in range(self.ranks) if p in self.importers[o])
            for p in range(self.ranks)))

    def own_kinds(self, a: int) -> tuple[str, ...]:
        return _MAPPINGS if a in self.aliased else ("plane",)

    def import_kinds(self, a: int) -> tuple[str, ...]:
        return _MAPPINGS if a in self.aliased and a not in self.owner_only else ("plane",)

    def prev_import(self, p: int, o: int, a: int) -> tuple[int, int] | None:
        """The source pair of p just before <<o, a>> in import order (None: first)."""
        src = self.sources[p]
        if a > 0 and o in src:
            return (o, a - 1)
        k = bisect_left(src, o)
        return (src[k - 1], self.allocs - 1) if k > 0 else None

    def last_import(self, p: int) -> tuple[int, int] | None:
        src = self.sources[p]
        return (src[-1], self.allocs - 1) if src else None


@dataclass
class ProcState:
    """One process's variables (phase[p], va[p], ..., crashed[p]); sets as in the spec."""

    phase: str = "Allocating"
    va: bool = False
    created: set[int] = field(default_factory=set)
    mapped: set[int] = field(default_factory=set)
    alias_mapped: set[int] = field(default_factory=set)
    access: dict[tuple[int, str], frozenset[int]] = field(default_factory=dict)
    grants: int = 0
    ready: bool = False
    failed: bool = False
    exported: set[int] = field(default_factory=set)
    sent: set[tuple[int, int]] = field(default_factory=set)   # (alloc, to): <<p, a, i>>
    sent_per_alloc: dict[int, int] = field(default_factory=dict)
    imported: list[tuple[int, int]] = field(default_factory=list)  # in import order
    imported_set: set[tuple[int, int]] = field(default_factory=set)
    import_mapped: set[tuple[int, int, str]] = field(default_factory=set)
    import_access: dict[tuple[int, int, str], frozenset[int]] = field(default_factory=dict)
    import_grants: int = 0
    import_monotone: bool = True   # imports were appended in increasing order
    vote: str = "none"
    decision: str = "none"
    crashed: bool = False
    #: leaked[p]: objects whose undo failed, as the spec names them: own
    #: ("va" | "handle" | "plane" | "alias", p, a), imported ("ihandle" | "iplane" |
    #: "ialias", owner, a); still live, never undone again
    leaked: set[tuple[str, int, int]] = field(default_factory=set)

    def live_objects(self, p: int) -> set[tuple[str, int, int]]:
        """LiveObjects(p), as leaked[p] names them."""
        out = {("handle", p, a) for a in self.created}
        out |= {("plane", p, a) for a in self.mapped}
        out |= {("alias", p, a) for a in self.alias_mapped}
        out |= {("ihandle", o, a) for (o, a) in self.imported_set}
        out |= {("i" + m, o, a) for (o, a, m) in self.import_mapped}
        if self.va:
            out.add(("va", p, 0))
        return out

    def mapping_live(self) -> bool:
        """MappingLive(p): the driver refuses cuMemAddressFree."""
        return bool(self.mapped or self.alias_mapped or self.import_mapped)

    def counters(self) -> dict[str, Any]:
        """The trace's ``state`` of this process (docs/group-trace.md)."""
        return {"phase": self.phase, "va": self.va, "created": len(self.created),
                "mapped": len(self.mapped), "alias_mapped": len(self.alias_mapped),
                "grants": self.grants, "ready": self.ready, "failed": self.failed,
                "exported": len(self.exported), "sent": len(self.sent),
                "imported": len(self.imported_set),
                "import_mapped": len(self.import_mapped),
                "import_grants": self.import_grants}

    def state_text(self) -> str:
        """:meth:`counters` as the trace writer writes it (canonical key order)."""
        t = _TF
        return (f'"phase": "{self.phase}", "va": {t[self.va]}, "created": '
                f'{len(self.created)}, "mapped": {len(self.mapped)}, "alias_mapped": '
                f'{len(self.alias_mapped)}, "grants": {self.grants}, "ready": '
                f'{t[self.ready]}, "failed": {t[self.failed]}, "exported": '
                f'{len(self.exported)}, "sent": {len(self.sent)}, "imported": '
                f'{len(self.imported_set)}, "import_mapped": {len(self.import_mapped)}, '
                f'"import_grants": {self.import_grants}')

    def empty(self) -> bool:
        """NothingLeftOn(p): no VA, handle, mapping or grant, imported ones included."""
        return not (self.va or self.created or self.mapped or self.alias_mapped
                    or self.access or self.imported_set or self.import_mapped
                    or self.import_access)

    def to_json(self) -> dict[str, Any]:
        return {"phase": self.phase, "va": self.va, "created": sorted(self.created),
                "mapped": sorted(self.mapped), "alias_mapped": sorted(self.alias_mapped),
                "access": sorted([a, m, sorted(d)] for (a, m), d in self.access.items()),
                "ready": self.ready, "failed": self.failed,
                "exported": sorted(self.exported), "sent": sorted(map(list, self.sent)),
                "imported": sorted(map(list, self.imported_set)),
                "import_mapped": sorted(map(list, self.import_mapped)),
                "import_access": sorted([o, a, m, sorted(d)] for (o, a, m), d
                                        in self.import_access.items()),
                "vote": self.vote, "decision": self.decision, "crashed": self.crashed,
                "leaked": sorted(map(list, self.leaked))}


_TF = {True: "true", False: "false"}


@dataclass
class GroupState:
    """Every process's state (the spec's functions over Ranks; ``sent`` lives per owner)."""

    procs: list[ProcState]

    def to_json(self) -> dict[str, Any]:
        return {str(p): s.to_json() for p, s in enumerate(self.procs)}


def initial_group(c: GroupConstants) -> GroupState:
    """Init: every process Allocating with nothing made."""
    return GroupState([ProcState() for _ in range(c.ranks)])


# --- derived predicates (the spec's helpers) ----------------------------------------------

def _complete(c: GroupConstants, s: ProcState, a: int) -> bool:
    """Complete(p, a): created, mapped (twice if aliased) and granted."""
    if a not in s.created or a not in s.mapped or (a, "plane") not in s.access:
        return False
    return a not in c.aliased or (a in s.alias_mapped and (a, "alias") in s.access)


def _own_done(c: GroupConstants, s: ProcState) -> bool:
    return s.va and len(s.created) == c.allocs and _complete(c, s, c.allocs - 1)


def _sent_all(c: GroupConstants, s: ProcState, p: int, a: int) -> bool:
    """SentAll(p, a): exported and sent to every importer (vacuous without importers:
    a rank nobody imports from exports nothing)."""
    if not c.importers[p]:
        return True
    return a in s.exported and s.sent_per_alloc.get(a, 0) == len(c.importers[p])


def _shared(c: GroupConstants, s: ProcState, p: int) -> bool:
    if not c.importers[p]:
        return True
    return len(s.exported) == c.allocs and _sent_all(c, s, p, c.allocs - 1)


def _import_complete(c: GroupConstants, s: ProcState, o: int, a: int) -> bool:
    if (o, a) not in s.imported_set:
        return False
    return all((o, a, m) in s.import_access for m in c.import_kinds(a))


def _imports_done(c: GroupConstants, s: ProcState, p: int) -> bool:
    last = c.last_import(p)
    return last is None or _import_complete(c, s, *last)


# --- forward steps: each (c, g, p, ev) -> '' (applied) | reason | WAIT -------------------
# ``ev`` is an :class:`Args` record of the event's arguments.

class Args(NamedTuple):
    """An event's arguments as the model reads them (None when absent). A NamedTuple
    because the reader builds one per event (10^5-10^6 of them)."""

    owner: int | None = None
    alloc: int | None = None
    mapping: str | None = None
    devices: frozenset[int] | None = None   # as ranks (own device -> own rank)
    to: int | None = None
    ready: bool | None = None
    decision: str | None = None
    failed: frozenset[int] | None = None
    missing: frozenset[int] | None = None


def _can_drive(s: ProcState) -> str:
    if s.crashed:
        return "the process has crashed"
    if s.phase != "Allocating":
        return f"phase is {s.phase}, not Allocating"
    if s.failed:
        return "a step of this process already failed (next is its Vote)"
    if s.vote != "none":
        return "the process already voted"
    return ""


def _g_reserve(c: GroupConstants, g: GroupState, p: int, e: Args) -> str:
    s = g.procs[p]
    return _can_drive(s) or ("the VA is already reserved" if s.va else "")


def _g_create(c: GroupConstants, g: GroupState, p: int, e: Args) -> str:
    s = g.procs[p]
    a = e.alloc
    why = _can_drive(s)
    if why:
        return why
    if not s.va:
        return "no VA reservation yet"
    if a in s.created:
        return f"allocation {a} is already created"
    if len(s.created) != a:
        return f"creation in plan order: {len(s.created)} allocations created, not {a}"
    if a > 0 and not _complete(c, s, a - 1):
        return f"allocation {a - 1} is not complete (mapped and granted) yet"
    return ""


def _g_map(c: GroupConstants, g: GroupState, p: int, e: Args) -> str:
    s = g.procs[p]
    why = _can_drive(s)
    if why:
        return why
    if e.alloc not in s.created:
        return f"allocation {e.alloc} is not created"
    return f"allocation {e.alloc} is already mapped" if e.alloc in s.mapped else ""


def _g_map_alias(c: GroupConstants, g: GroupState, p: int, e: Args) -> str:
    s = g.procs[p]
    a = e.alloc
    why = _can_drive(s)
    if why:
        return why
    if a not in c.aliased:
        return f"allocation {a} is not aliased"
    if a not in s.mapped:
        return f"allocation {a}: alias before its plane mapping"
    return f"allocation {a} is already alias-mapped" if a in s.alias_mapped else ""


def _own_grant_devices(p: int, e: Args) -> str:
    if e.devices != frozenset({p}):
        return (f"grants to ranks {sorted(e.devices or ())}: a process grants its own "
                f"device only (rank {p})")
    return ""


def _g_grant(c: GroupConstants, g: GroupState, p: int, e: Args) -> str:
    s = g.procs[p]
    why = _can_drive(s)
    if why:
        return why
    a, m = e.alloc, e.mapping
    if a not in (s.mapped if m == "plane" else s.alias_mapped):
        return f"mapping {m} of allocation {a} does not exist"
    if (a, m) in s.access:
        return f"mapping {m} of allocation {a} is already granted"
    return ""


def _g_export(c: GroupConstants, g: GroupState, p: int, e: Args) -> str:
    s = g.procs[p]
    a = e.alloc
    why = _can_drive(s)
    if why:
        return why
    if not c.importers[p]:
        return f"rank {p} has no importers: nothing is exported"
    if not _own_done(c, s):
        return "own allocations are not all created, mapped and granted yet"
    if a in s.exported:
        return f"allocation {a} is already exported"
    if len(s.exported) != a or (a > 0 and not _sent_all(c, s, p, a - 1)):
        return f"export in plan order: allocation {a - 1} not exported and sent to " \
               "every importer yet"
    return ""


def _g_send(c: GroupConstants, g: GroupState, p: int, e: Args) -> str:
    s = g.procs[p]
    a, i = e.alloc, e.to
    why = _can_drive(s)
    if why:
        return why
    if i == p:
        return "a process does not send to itself"
    if a not in s.exported:
        return f"allocation {a} is not exported"
    if (a, i) in s.sent:
        return f"allocation {a} was already sent to rank {i}"
    return ""


def _send_target(c: GroupConstants, p: int, e: Args) -> str:
    if e.to not in c.importers[p]:
        return (f"rank {e.to} is not a validated importer of rank {p} "
                f"(importers: {sorted(c.importers[p])})")
    return ""


def _g_import(c: GroupConstants, g: GroupState, p: int, e: Args) -> str:
    s = g.procs[p]
    o, a = e.owner, e.alloc
    why = _can_drive(s)
    if why:
        return why
    if o == p:
        return "a process does not import its own memory"
    if not _own_done(c, s):
        return "own allocations are not all complete yet (imports come after)"
    if not _shared(c, s, p):
        return "own fds are not all exported and sent yet (imports come after)"
    if (o, a) in s.imported_set:
        return f"allocation {a} of rank {o} is already imported"
    prev = c.prev_import(p, o, a)
    if prev is not None and not _import_complete(c, s, *prev):
        return (f"import order: allocation {prev[1]} of rank {prev[0]} is not imported, "
                "mapped and granted yet")
    return ""


def _g_import_map(c: GroupConstants, g: GroupState, p: int, e: Args) -> str:
    s = g.procs[p]
    o, a, m = e.owner, e.alloc, e.mapping
    why = _can_drive(s)
    if why:
        return why
    if (o, a) not in s.imported_set:
        return f"allocation {a} of rank {o} is not imported (no handle to map)"
    if (o, a, m) in s.import_mapped:
        return f"mapping {m} of rank {o}'s allocation {a} is already mapped"
    if m == "alias":
        if a not in c.aliased or a in c.owner_only:
            return (f"allocation {a} has no alias an importer may map (not aliased, or "
                    "its region is owner-only)")
        if (o, a, "plane") not in s.import_mapped:
            return f"rank {o}'s allocation {a}: alias before its plane mapping"
    return ""


def _g_import_grant(c: GroupConstants, g: GroupState, p: int, e: Args) -> str:
    s = g.procs[p]
    key = (e.owner, e.alloc, e.mapping)
    why = _can_drive(s)
    if why:
        return why
    if key not in s.import_mapped:
        return f"mapping {e.mapping} of rank {e.owner}'s allocation {e.alloc} is not mapped"
    return "it is already granted" if key in s.import_access else ""


#: The guards of the forward steps (CanReserve, ..., CanImportGrant of the spec).
FORWARD_GUARDS: dict[str, Callable[[GroupConstants, GroupState, int, Args], str]] = {
    "Reserve": _g_reserve, "Create": _g_create, "Map": _g_map, "MapAlias": _g_map_alias,
    "Grant": _g_grant, "Export": _g_export, "Send": _g_send, "Import": _g_import,
    "ImportMap": _g_import_map, "ImportGrant": _g_import_grant,
}


def _fail_extra(c: GroupConstants, g: GroupState, p: int, x: str, e: Args) -> str:
    """A failed Import must name one of p's owners (StepEnabled quantifies over Sources);
    a failed Send, Grant or ImportGrant was given its target too: an importer, the own
    device (a cuMemSetAccess to another device is the wrong call even when it fails)."""
    if x == "Import" and e.owner not in c.sources[p]:
        return f"rank {e.owner} is not an owner rank {p} imports from"
    if x == "Send" and e.to not in c.importers[p]:
        return _send_target(c, p, e)
    if (x == "Grant" or x == "ImportGrant") and e.devices != frozenset({p}):
        return (f"a failed {x} was asked to grant ranks {sorted(e.devices or ())}: a "
                f"process grants its own device only (rank {p})")
    return ""


def _apply_forward(c: GroupConstants, g: GroupState, p: int, x: str, e: Args) -> None:
    s = g.procs[p]
    if x == "Reserve":
        s.va = True
    elif x == "Create":
        s.created.add(e.alloc)  # type: ignore[arg-type]
    elif x == "Map":
        s.mapped.add(e.alloc)  # type: ignore[arg-type]
    elif x == "MapAlias":
        s.alias_mapped.add(e.alloc)  # type: ignore[arg-type]
    elif x == "Grant":
        s.access[(e.alloc, e.mapping)] = e.devices  # type: ignore[index,assignment]
        s.grants += len(e.devices)  # type: ignore[arg-type]
    elif x == "Export":
        s.exported.add(e.alloc)  # type: ignore[arg-type]
    elif x == "Send":
        s.sent.add((e.alloc, e.to))  # type: ignore[arg-type]
        s.sent_per_alloc[e.alloc] = s.sent_per_alloc.get(e.alloc, 0) + 1  # type: ignore
    elif x == "Import":
        if s.imported and s.imported[-1] > (e.owner, e.alloc):  # type: ignore[operator]
            s.import_monotone = False
        s.imported.append((e.owner, e.alloc))  # type: ignore[arg-type]
        s.imported_set.add((e.owner, e.alloc))  # type: ignore[arg-type]
    elif x == "ImportMap":
        s.import_mapped.add((e.owner, e.alloc, e.mapping))  # type: ignore[arg-type]
    elif x == "ImportGrant":
        s.import_access[(e.owner, e.alloc, e.mapping)] = e.devices  # type: ignore
        s.import_grants += len(e.devices)  # type: ignore[arg-type]


def forward(c: GroupConstants, g: GroupState, p: int, x: str, e: Args, ok: bool) -> str:
    """Forward step x of p (or its failure Fail(p, x) when not ``ok``)."""
    why = FORWARD_GUARDS[x](c, g, p, e)
    if why:
        return why
    if not ok:
        why = _fail_extra(c, g, p, x, e)
        if why:
            return why
        g.procs[p].failed = True
        return ""
    if x == "Grant" or x == "ImportGrant":
        why = _own_grant_devices(p, e)
    elif x == "Send":
        why = _send_target(c, p, e)
    elif x == "Import":
        o, a = e.owner, e.alloc
        if (a, p) not in g.procs[o].sent:  # type: ignore[index]
            # the Send may still come (WAIT); a crashed or failed owner never sends it
            return WAIT
    if why:
        return why
    _apply_forward(c, g, p, x, e)
    return ""


# --- group steps -------------------------------------------------------------------------

def _rank_ready(c: GroupConstants, g: GroupState, p: int, e: Args) -> str:
    s = g.procs[p]
    why = _can_drive(s)
    if why:
        return why
    if s.ready:
        return "already ready"
    if not _own_done(c, s):
        return "own allocations are not all created, mapped and granted"
    if not _shared(c, s, p):
        return "own fds are not all exported and sent to the importers"
    if not _imports_done(c, s, p):
        return "imports are not all imported, mapped and granted"
    s.ready = True
    return ""


def _vote(c: GroupConstants, g: GroupState, p: int, e: Args) -> str:
    s = g.procs[p]
    if s.crashed or s.phase != "Allocating" or s.vote != "none":
        return "the process cannot vote now (crashed, not Allocating, or voted already)"
    if e.ready:
        if not s.ready or s.failed:
            return "votes ready but RankReady has not happened (or a step failed)"
    elif not s.failed:
        return "votes failed but no step of this process failed"
    s.vote = "ready" if e.ready else "failed"
    return ""


def _decide(c: GroupConstants, g: GroupState, p: int, e: Args) -> str:
    s = g.procs[p]
    if s.crashed or s.phase != "Allocating" or s.vote == "none" or s.decision != "none":
        return "the process cannot decide now (crashed, not Allocating, not voted, or " \
               "decided already)"
    missing = frozenset(q for q, t in enumerate(g.procs) if t.vote == "none")
    if any(not g.procs[q].crashed for q in missing):
        return WAIT  # a rank that has neither voted nor died yet
    failed = frozenset(q for q, t in enumerate(g.procs) if t.vote == "failed")
    if e.missing != missing or e.failed != failed:
        return (f"names missing {sorted(e.missing or ())} and failed "
                f"{sorted(e.failed or ())}; the votes give missing {sorted(missing)} and "
                f"failed {sorted(failed)}")
    want = "publish" if not missing and not failed else "abort"
    if e.decision != want:
        return f"decides {e.decision} but the votes say {want}"
    s.decision = want
    return ""


def _phase_step(frm: str, to: str, need: str | None = None
                ) -> Callable[[GroupConstants, GroupState, int, Args], str]:
    def f(c: GroupConstants, g: GroupState, p: int, e: Args) -> str:
        s = g.procs[p]
        if s.crashed or s.phase != frm:
            return f"phase is {s.phase}, not {frm}"
        if need is not None and s.decision != need:
            return f"the process decided {s.decision}, not {need}"
        if to in ("Aborted", "Shutdown") and not s.empty():
            if s.leaked:
                return ("an undo of this process failed: it still holds the objects left "
                        "live (" + _held(s) + "), so it never completes "
                        "(UndoFailureNeverCompletes)")
            return "the process still holds driver objects (" + _held(s) + ")"
        s.phase = to
        return ""
    return f


def _held(s: ProcState) -> str:
    parts = [f"{k} {v}" for k, v in (("va", int(s.va)), ("handles", len(s.created)),
                                     ("mappings", len(s.mapped) + len(s.alias_mapped)),
                                     ("imported handles", len(s.imported_set)),
                                     ("imported mappings", len(s.import_mapped)),
                                     ("import grants", len(s.import_access))) if v]
    return ", ".join(parts)


def _unwinding(s: ProcState) -> str:
    if s.crashed or s.phase not in ("Aborting", "ShuttingDown"):
        return f"phase is {s.phase}: unwinding happens only in Aborting or ShuttingDown"
    return ""


def _last_import(s: ProcState, o: int, a: int) -> bool:
    """LastImport(p, o, a): no import later than <<o, a>> is still held, but a leaked
    one (imports are appended in import order, so the last one is the latest unless a
    trace broke it)."""
    if not s.imported:
        return True
    if s.leaked:
        return all(x <= (o, a) or ("ihandle",) + x in s.leaked for x in s.imported)
    last = s.imported[-1] if s.import_monotone else max(s.imported)
    return last <= (o, a)


def _imports_gone(s: ProcState) -> bool:
    """ImportsGone(p): every import is unwound, or its handle leaked."""
    return not s.imported_set or (bool(s.leaked) and all(
        ("ihandle",) + x in s.leaked for x in s.imported_set))


def _newer_handle(s: ProcState, p: int, a: int) -> bool:
    """A handle b > a is live and not leaked (the reverse-order guards); without a
    leak ``created`` is a prefix 0..n-1."""
    if not s.leaked:
        return len(s.created) > a + 1
    return any(b > a and ("handle", p, b) not in s.leaked for b in s.created)


def _why_import_unmap(s: ProcState, p: int, e: Args) -> str:
    key = (e.owner, e.alloc, e.mapping)
    why = _unwinding(s)
    if why:
        return why
    if key not in s.import_mapped:
        return f"mapping {e.mapping} of rank {e.owner}'s allocation {e.alloc} is not mapped"
    if ("i" + str(e.mapping), e.owner, e.alloc) in s.leaked:
        return "its cuMemUnmap failed already: a leaked mapping is never undone again"
    if e.mapping == "plane" and (e.owner, e.alloc, "alias") in s.import_mapped \
            and ("ialias", e.owner, e.alloc) not in s.leaked:
        return "the plane mapping is unmapped before its alias"
    if not _last_import(s, e.owner, e.alloc):  # type: ignore[arg-type]
        return "LIFO: a later import is still held"
    return ""


def _import_unmap(c: GroupConstants, g: GroupState, p: int, e: Args) -> str:
    s = g.procs[p]
    why = _why_import_unmap(s, p, e)
    if why:
        return why
    key = (e.owner, e.alloc, e.mapping)
    s.import_mapped.discard(key)  # type: ignore[arg-type]
    d = s.import_access.pop(key, None)  # type: ignore[arg-type]
    if d:
        s.import_grants -= len(d)
    return ""


def _why_import_release(s: ProcState, p: int, e: Args) -> str:
    o, a = e.owner, e.alloc
    why = _unwinding(s)
    if why:
        return why
    if (o, a) not in s.imported_set:
        return f"allocation {a} of rank {o} is not imported"
    if ("ihandle", o, a) in s.leaked:
        return "its cuMemRelease failed already: a leaked handle is never undone again"
    if any((o, a, m) in s.import_mapped and ("i" + m, o, a) not in s.leaked
           for m in _MAPPINGS):
        return "the imported handle is still mapped"
    if not _last_import(s, o, a):  # type: ignore[arg-type]
        return "LIFO: a later import is still held"
    return ""


def _import_release(c: GroupConstants, g: GroupState, p: int, e: Args) -> str:
    s = g.procs[p]
    why = _why_import_release(s, p, e)
    if why:
        return why
    o, a = e.owner, e.alloc
    s.imported_set.discard((o, a))  # type: ignore[arg-type]
    if s.imported[-1] == (o, a):
        s.imported.pop()
    else:
        s.imported.remove((o, a))  # type: ignore[arg-type]
    return ""


def _why_unmap(s: ProcState, p: int, e: Args) -> str:
    a, m = e.alloc, e.mapping
    why = _unwinding(s)
    if why:
        return why
    if not _imports_gone(s):
        return "imported handles are unwound first"
    if a not in (s.mapped if m == "plane" else s.alias_mapped):
        return f"mapping {m} of allocation {a} does not exist"
    if (m, p, a) in s.leaked:
        return "its cuMemUnmap failed already: a leaked mapping is never undone again"
    if m == "plane" and a in s.alias_mapped and ("alias", p, a) not in s.leaked:
        return "the plane mapping is unmapped before its alias"
    if _newer_handle(s, p, a):  # type: ignore[arg-type]
        return "reverse order: a later allocation is still created"
    return ""


def _unmap(c: GroupConstants, g: GroupState, p: int, e: Args) -> str:
    s = g.procs[p]
    why = _why_unmap(s, p, e)
    if why:
        return why
    a, m = e.alloc, e.mapping
    (s.mapped if m == "plane" else s.alias_mapped).discard(a)  # type: ignore[arg-type]
    d = s.access.pop((a, m), None)  # type: ignore[arg-type]
    if d:
        s.grants -= len(d)
    return ""


def _why_release(s: ProcState, p: int, e: Args) -> str:
    a = e.alloc
    why = _unwinding(s)
    if why:
        return why
    if not _imports_gone(s):
        return "imported handles are unwound first"
    lk = s.leaked
    if a not in s.created or (a in s.mapped and ("plane", p, a) not in lk) \
            or (a in s.alias_mapped and ("alias", p, a) not in lk):
        return f"allocation {a} is not created, or still mapped"
    if ("handle", p, a) in lk:
        return "its cuMemRelease failed already: a leaked handle is never undone again"
    if _newer_handle(s, p, a):  # type: ignore[arg-type]
        return "reverse order: a later allocation is still created"
    return ""


def _release(c: GroupConstants, g: GroupState, p: int, e: Args) -> str:
    s = g.procs[p]
    why = _why_release(s, p, e)
    if why:
        return why
    s.created.discard(e.alloc)  # type: ignore[arg-type]
    return ""


def _why_free_due(s: ProcState, p: int) -> str:
    """CanFree(p): every import, handle and mapping is gone or leaked."""
    why = _unwinding(s)
    if why:
        return why
    lk = s.leaked
    if not s.va:
        return "imports or handles remain, or no VA is reserved"
    if ("va", p, 0) in lk:
        return "its cuMemAddressFree failed already: a leaked VA is never freed again"
    if not lk:
        if s.imported_set or s.created:
            return "imports or handles remain, or no VA is reserved"
        return ""
    if not _imports_gone(s) or any(("handle", p, b) not in lk for b in s.created) \
            or any(("plane", p, b) not in lk for b in s.mapped) \
            or any(("alias", p, b) not in lk for b in s.alias_mapped) \
            or any(("i" + m, o, b) not in lk for (o, b, m) in s.import_mapped):
        return "imports or handles remain, or no VA is reserved"
    return ""


def _free(c: GroupConstants, g: GroupState, p: int, e: Args) -> str:
    s = g.procs[p]
    why = _why_free_due(s, p)
    if why:
        return why
    if s.mapping_live():
        return ("a mapping whose cuMemUnmap failed is still in the VA range: the driver "
                "refuses cuMemAddressFree (it can only fail)")
    s.va = False
    s.ready = False
    return ""


def undo_failures(g: GroupState) -> int:
    """UndoFailures: leaked objects, less the VAs the driver had to refuse."""
    return sum(1 for s in g.procs for x in s.leaked
               if x[0] != "va" or not s.mapping_live())


def undo_object(p: int, action: str, e: Args) -> tuple[str, int, int]:
    """The object a (failed) unwinding step names, as leaked[p] names it."""
    if action == "Free":
        return ("va", p, 0)
    if action == "Release":
        return ("handle", p, e.alloc)  # type: ignore[return-value]
    if action == "Unmap":
        return (str(e.mapping), p, e.alloc)  # type: ignore[return-value]
    if action == "ImportRelease":
        return ("ihandle", e.owner, e.alloc)  # type: ignore[return-value]
    return ("i" + str(e.mapping), e.owner, e.alloc)  # type: ignore[return-value]


def undo_fail(c: GroupConstants, g: GroupState, p: int, action: str, e: Args) -> str:
    """UndoFail(p, x): the undo of x was due (its step's guard; for Free, but the
    driver's refusal) within MaxUndoFailures or a Free the driver must refuse; x is
    leaked (stays live, never undone again)."""
    s = g.procs[p]
    if action == "Free":
        why = _why_free_due(s, p)
        refused = s.mapping_live()
    else:
        if e.alloc is None or not 0 <= e.alloc < c.allocs:
            return f"{action} names no allocation of the plan"
        if action in ("Unmap", "ImportUnmap") and e.mapping not in _MAPPINGS:
            return f"{action} names mapping {e.mapping!r}"
        why = {"Release": _why_release, "Unmap": _why_unmap,
               "ImportRelease": _why_import_release,
               "ImportUnmap": _why_import_unmap}[action](s, p, e)
        refused = False
    if why:
        return f"a failed {action} whose undo was not due: {why}"
    if not refused and c.max_undo_failures is not None \
            and undo_failures(g) >= c.max_undo_failures:
        return f"more than MaxUndoFailures = {c.max_undo_failures} failed undos"
    s.leaked.add(undo_object(p, action, e))
    return ""


def unwind_ended_leaking(s: ProcState, p: int) -> bool:
    """UnwindEndedLeaking(p): an undo of p failed and p ran every undo (all it still
    holds is leaked); its file ends there, with no AbortComplete / ShutdownComplete."""
    return (not s.crashed and s.phase in ("Aborting", "ShuttingDown") and bool(s.leaked)
            and s.live_objects(p) <= s.leaked)


#: Non-forward steps: name -> (c, g, p, args) -> '' | reason | WAIT (applied when '').
STEPS: dict[str, Callable[[GroupConstants, GroupState, int, Args], str]] = {
    "RankReady": _rank_ready, "Vote": _vote, "Decide": _decide,
    "Publish": _phase_step("Allocating", "Published", "publish"),
    "Abort": _phase_step("Allocating", "Aborting", "abort"),
    "Unpublish": _phase_step("Published", "ShuttingDown"),
    "AbortComplete": _phase_step("Aborting", "Aborted"),
    "ShutdownComplete": _phase_step("ShuttingDown", "Shutdown"),
    "ImportUnmap": _import_unmap, "ImportRelease": _import_release, "Unmap": _unmap,
    "Release": _release, "Free": _free,
}


def step(c: GroupConstants, g: GroupState, p: int, action: str, e: Args, ok: bool) -> str:
    """Take event ``action`` of process p: '' (applied), a reason, or :data:`WAIT`."""
    if action in FORWARD_GUARDS:
        return forward(c, g, p, action, e, ok)
    if not ok:
        if action in UNDO_STEPS:
            return undo_fail(c, g, p, action, e)
        return (f"{action} failed: the model allows failures only at forward steps and "
                "at the undo steps")
    f = STEPS.get(action)
    if f is None:
        return f"{action} is not an action of the group model"
    return f(c, g, p, e)


def crash(g: GroupState, p: int) -> str:
    """Crash(p): the process's trace ended before a terminal phase."""
    s = g.procs[p]
    if s.crashed or s.phase in ("Aborted", "Shutdown"):
        return "cannot crash"
    s.crashed = True
    return ""


def enabled_actions(c: GroupConstants, g: GroupState, p: int) -> list[str]:
    """The actions of process p enabled in ``g`` (for reports), without changing ``g``."""
    import copy

    out: list[str] = []
    s = g.procs[p]
    cands: list[tuple[str, Args]] = [("Reserve", Args()), ("RankReady", Args())]
    n = len(s.created)
    for a in {max(n - 1, 0), min(n, c.allocs - 1)}:
        cands += [("Create", Args(alloc=a)), ("Map", Args(alloc=a)),
                  ("MapAlias", Args(alloc=a)), ("Release", Args(alloc=a))]
        for m in _MAPPINGS:
            cands += [("Grant", Args(alloc=a, mapping=m, devices=frozenset({p}))),
                      ("Unmap", Args(alloc=a, mapping=m))]
    ne = len(s.exported)
    for a in {max(ne - 1, 0), min(ne, c.allocs - 1)}:
        cands.append(("Export", Args(alloc=a)))
        cands += [("Send", Args(alloc=a, to=i)) for i in sorted(c.importers[p])]
    nxt = [x for x in [s.imported[-1] if s.imported else None] if x]
    for o in c.sources[p]:
        nxt += [(o, a) for a in range(c.allocs)]
    for (o, a) in nxt[:4] + ([max(s.imported)] if s.imported else []):
        cands += [("Import", Args(owner=o, alloc=a)), ("ImportRelease", Args(owner=o, alloc=a))]
        for m in _MAPPINGS:
            cands += [("ImportMap", Args(owner=o, alloc=a, mapping=m)),
                      ("ImportGrant", Args(owner=o, alloc=a, mapping=m,
                                           devices=frozenset({p}))),
                      ("ImportUnmap", Args(owner=o, alloc=a, mapping=m))]
    cands += [("Vote", Args(ready=True)), ("Vote", Args(ready=False))]
    missing = frozenset(q for q, t in enumerate(g.procs) if t.vote == "none")
    failed = frozenset(q for q, t in enumerate(g.procs) if t.vote == "failed")
    for d in ("publish", "abort"):
        cands.append(("Decide", Args(decision=d, failed=failed, missing=missing)))
    cands += [(x, Args()) for x in ("Publish", "Abort", "Unpublish", "AbortComplete",
                                    "ShutdownComplete", "Free")]
    seen: set[str] = set()
    for name, e in cands:
        # a step of p changes only p's variables: copy p, share the others
        trial = GroupState([copy.deepcopy(t) if q == p else t for q, t in enumerate(g.procs)])
        if step(c, trial, p, name, e, True) == "":
            txt = _act_text(name, p, e)
            if txt not in seen:
                seen.add(txt)
                out.append(txt)
    return out


def _act_text(name: str, p: int, e: Args) -> str:
    parts = [f"r{p}"]
    if e.owner is not None:
        parts.append(f"owner {e.owner}")
    if e.alloc is not None:
        parts.append(f"a{e.alloc}")
    if e.mapping is not None:
        parts.append(e.mapping)
    if e.to is not None:
        parts.append(f"to {e.to}")
    if e.ready is not None:
        parts.append("ready" if e.ready else "failed")
    if e.decision is not None:
        parts.append(e.decision)
    return f"{name}({', '.join(parts)})"


def constants_from(ranks: int, allocs: int, aliased: Sequence[int] | frozenset[int],
                   owner_only: Sequence[int] | frozenset[int],
                   importers: Sequence[frozenset[int]] | Mapping[int, Any],
                   declared_readers: Sequence[frozenset[int]] | Mapping[int, Any] | None = None
                   ) -> GroupConstants:
    """GroupConstants from plain values (importers as a sequence or rank -> ranks)."""
    imp = tuple(frozenset(importers[r] if not isinstance(importers, Mapping)
                          else importers.get(r, ())) for r in range(ranks))
    if declared_readers is None:
        dec = tuple(imp[r] | {r} for r in range(ranks))
    else:
        dec = tuple(frozenset(declared_readers[r] if not isinstance(declared_readers, Mapping)
                              else declared_readers.get(r, imp[r] | {r}))
                    for r in range(ranks))
    return GroupConstants(ranks, allocs, frozenset(aliased), frozenset(owner_only), imp, dec)


# --- fast successful steps (the replay's hot path) ------------------------------------------
# Why: a published-scale group is 10^5-10^6 events, nearly all successful forward steps.
# Each function below is the conjunction of the same conditions as the guard above (in
# the success case) and applies the effect only when all hold; it returns False and
# changes nothing otherwise, and the caller then takes :func:`step`, which finds the
# reason (or WAIT). tests/conformance/test_group_replay.py checks both give the same
# verdicts.

def _f_create(c: GroupConstants, g: GroupState, p: int, e: Args) -> bool:
    s = g.procs[p]
    a = e.alloc
    if s.phase != "Allocating" or s.failed or s.crashed or s.vote != "none" or not s.va \
            or a != len(s.created) or a in s.created or (a > 0 and not _complete(c, s, a - 1)):
        return False
    s.created.add(a)
    return True


def _f_map(c: GroupConstants, g: GroupState, p: int, e: Args) -> bool:
    s = g.procs[p]
    a = e.alloc
    if s.phase != "Allocating" or s.failed or s.crashed or s.vote != "none" \
            or a not in s.created or a in s.mapped:
        return False
    s.mapped.add(a)
    return True


def _f_map_alias(c: GroupConstants, g: GroupState, p: int, e: Args) -> bool:
    s = g.procs[p]
    a = e.alloc
    if s.phase != "Allocating" or s.failed or s.crashed or s.vote != "none" \
            or a not in c.aliased or a not in s.mapped or a in s.alias_mapped:
        return False
    s.alias_mapped.add(a)
    return True


def _f_grant(c: GroupConstants, g: GroupState, p: int, e: Args) -> bool:
    s = g.procs[p]
    a, m, d = e.alloc, e.mapping, e.devices
    if s.phase != "Allocating" or s.failed or s.crashed or s.vote != "none" \
            or d is None or len(d) != 1 or p not in d or (a, m) in s.access \
            or a not in (s.mapped if m == "plane" else s.alias_mapped):
        return False
    s.access[(a, m)] = d  # type: ignore[index]
    s.grants += 1
    return True


def _f_export(c: GroupConstants, g: GroupState, p: int, e: Args) -> bool:
    s = g.procs[p]
    a = e.alloc
    if s.phase != "Allocating" or s.failed or s.crashed or s.vote != "none" \
            or not c.importers[p] \
            or a != len(s.exported) or a in s.exported or not _own_done(c, s) \
            or (a > 0 and not _sent_all(c, s, p, a - 1)):  # type: ignore[operator]
        return False
    s.exported.add(a)  # type: ignore[arg-type]
    return True


def _f_send(c: GroupConstants, g: GroupState, p: int, e: Args) -> bool:
    s = g.procs[p]
    a, i = e.alloc, e.to
    if s.phase != "Allocating" or s.failed or s.crashed or s.vote != "none" \
            or i not in c.importers[p] or a not in s.exported or (a, i) in s.sent:
        return False
    s.sent.add((a, i))  # type: ignore[arg-type]
    s.sent_per_alloc[a] = s.sent_per_alloc.get(a, 0) + 1  # type: ignore[index]
    return True


def _f_import(c: GroupConstants, g: GroupState, p: int, e: Args) -> bool:
    s = g.procs[p]
    o, a = e.owner, e.alloc
    if s.phase != "Allocating" or s.failed or s.crashed or s.vote != "none" or o == p \
            or (o, a) in s.imported_set or (a, p) not in g.procs[o].sent \
            or not _shared(c, s, p):  # type: ignore[index]
        return False
    prev = c.prev_import(p, o, a)  # type: ignore[arg-type]
    if prev is not None and not _import_complete(c, s, *prev):
        return False
    if s.imported and s.imported[-1] > (o, a):  # type: ignore[operator]
        s.import_monotone = False
    s.imported.append((o, a))  # type: ignore[arg-type]
    s.imported_set.add((o, a))  # type: ignore[arg-type]
    return True


def _f_import_map(c: GroupConstants, g: GroupState, p: int, e: Args) -> bool:
    s = g.procs[p]
    o, a, m = e.owner, e.alloc, e.mapping
    if s.phase != "Allocating" or s.failed or s.crashed or s.vote != "none" \
            or (o, a) not in s.imported_set or (o, a, m) in s.import_mapped:
        return False
    if m == "alias" and (a not in c.aliased or a in c.owner_only
                         or (o, a, "plane") not in s.import_mapped):
        return False
    s.import_mapped.add((o, a, m))  # type: ignore[arg-type]
    return True


def _f_import_grant(c: GroupConstants, g: GroupState, p: int, e: Args) -> bool:
    s = g.procs[p]
    key, d = (e.owner, e.alloc, e.mapping), e.devices
    if s.phase != "Allocating" or s.failed or s.crashed or s.vote != "none" \
            or d is None or len(d) != 1 or p not in d or key not in s.import_mapped \
            or key in s.import_access:
        return False
    s.import_access[key] = d  # type: ignore[index]
    s.import_grants += 1
    return True


#: Successful forward steps the replay tries first: name -> (c, g, p, args) -> applied?
FAST_STEPS: dict[str, Callable[[GroupConstants, GroupState, int, Args], bool]] = {
    "Create": _f_create, "Map": _f_map, "MapAlias": _f_map_alias, "Grant": _f_grant,
    "Export": _f_export, "Send": _f_send, "Import": _f_import, "ImportMap": _f_import_map,
    "ImportGrant": _f_import_grant,
}
