"""The lifecycle transition relation in Python, mirroring ``specs/KVLifecycle.tla``.

Same variables, same action names, same guards as the spec (docs/INTERFACES.md
"The lifecycle model"); :mod:`kvgrant.conformance.drift` checks that this module
and TLC produce the same successor states on small configs, so the two cannot drift.

Why mutable: the fast engine replays published-scale traces (10^5 events) in well
under a second, so :class:`ModelState` is updated in place and each guard is O(1)
(counters kept next to the sets). :meth:`ModelState.copy` and :meth:`freeze` give
the value semantics the drift guard and the enabled-action report need.

Kept as in the spec: ``created[r]`` is always a prefix ``0..n-1`` of the plan order
(Create needs every earlier allocation created, Release needs every later one gone),
and every allocation but the newest is complete (mapped, alias-mapped, granted) while
a rank allocates: Create(r, a) needs allocation a-1 complete, as the runtime builds it.

The spec's history variable ``undo`` (the runtime's undo stack: objects made and not
yet unwound, oldest first) is :attr:`RankState.undo`. Unwinding steps drop the object
they name wherever it is, like the spec's ``Drop``; the guards keep it the top.

A failed undo (``UndoFail``: a failed cuMemUnmap, cuMemRelease or cuMemAddressFree)
leaks its object (:attr:`RankState.leaked`): it stays live, leaves the undo stack and is
never undone again; the guards read it as gone for the order, so the rank goes on
unwinding as the runtime does, and the attempt then never completes
(:func:`unwind_ended_leaking` is where such a trace may end). Without a leak on a rank
its guards take the same O(1) paths as before (``created`` stays a prefix there).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Iterator, NamedTuple

from kvgrant.conformance.trace_io import DRIVER_STEPS, Header

__all__ = [
    "ALL_ACTIONS",
    "Action",
    "Constants",
    "ModelState",
    "RANK_STEPS",
    "RankState",
    "TERMINAL_PHASES",
    "UNDO_STEPS",
    "apply",
    "enabled",
    "guard",
    "initial_state",
    "step_enabled",
    "step_guard",
    "undo_failures",
    "undo_object",
    "unwind_ended_leaking",
]

TERMINAL_PHASES = frozenset({"Published", "Aborted", "Shutdown"})
_UNWINDING = frozenset({"Aborting", "ShuttingDown"})
ALL_ACTIONS = ("Reserve", "Create", "Map", "MapAlias", "Grant", "RankReady", "Publish",
               "Fail", "Abort", "Unpublish", "Unmap", "Release", "Free", "UndoFail",
               "AbortComplete", "ShutdownComplete")
#: The unwinding steps that may fail (the spec's UndoSteps; the step of UndoFail).
UNDO_STEPS = frozenset({"Unmap", "Release", "Free"})


@dataclass(frozen=True)
class Constants:
    """The spec's CONSTANTS (NumRanks, NumAllocs, Aliased, OwnerOnly, Importers, ...)."""

    ranks: int
    allocs: int
    aliased: frozenset[int]
    owner_only: frozenset[int]
    importers: tuple[frozenset[int], ...]
    declared_readers: tuple[frozenset[int], ...]
    #: the spec's MaxUndoFailures: 0 (the spec's default) no undo fails; None any number
    #: (trace replay, as KVLifecycleTrace's TraceMaxUndoFailures)
    max_undo_failures: int | None = 0

    @classmethod
    def from_header(cls, h: Header, max_undo_failures: int | None = 0) -> "Constants":
        """The header's constants; ``max_undo_failures=None`` for replaying a trace
        (any number of failed undos, as trace validation allows)."""
        return cls(h.ranks, h.allocs, h.aliased, h.owner_only, h.importers, h.declared_readers,
                   max_undo_failures)

    def __post_init__(self) -> None:
        # GrantSet is evaluated once per Grant event: precompute both shapes per rank
        object.__setattr__(self, "_wide", tuple(imp | {r} for r, imp in
                                                enumerate(self.importers)))
        object.__setattr__(self, "_owner", tuple(frozenset({r}) for r in range(self.ranks)))

    def grant_set(self, r: int, a: int, m: str) -> frozenset[int]:
        """GrantSet(r, a, m): owner only for owner-only aliases, else owner + importers."""
        if m == "alias" and a in self.owner_only:
            return self._owner[r]  # type: ignore[attr-defined,no-any-return]
        return self._wide[r]  # type: ignore[attr-defined,no-any-return]


class Action(NamedTuple):
    """One instance of a spec action; ``step`` is Fail's driver step (x in Fail(r, x)),
    or UndoFail's unwinding step (Unmap, Release, Free; the object is its rank, alloc,
    mapping)."""

    name: str
    rank: int | None = None
    alloc: int | None = None
    mapping: str | None = None
    step: str | None = None

    def __str__(self) -> str:
        if self.name == "UndoFail":
            inner = Action(self.step or "?", self.rank, self.alloc, self.mapping)
            return f"UndoFail({inner})"
        if self.name == "Fail":
            if self.alloc is None:
                return f'Fail(r{self.rank}, "{self.step}")'
            inner = Action(self.step or "?", self.rank, self.alloc, self.mapping)
            return f'Fail(r{self.rank}, "{self.step}") at {inner}'
        parts = [] if self.rank is None else [f"r{self.rank}"]
        if self.alloc is not None:
            parts.append(f"a{self.alloc}")
        if self.mapping is not None:
            parts.append(self.mapping)
        return self.name if not parts else f"{self.name}({', '.join(parts)})"


@dataclass
class RankState:
    """One rank's variables; ``grants`` counts the (alloc, mapping, device) triples."""

    va: bool = False
    created: set[int] = field(default_factory=set)
    mapped: set[int] = field(default_factory=set)
    alias_mapped: set[int] = field(default_factory=set)
    access: dict[tuple[int, str], frozenset[int]] = field(default_factory=dict)
    grants: int = 0
    ready: bool = False
    failed: bool = False
    #: undo[r] of the spec: ("va", 0), ("handle", a), ("plane", a), ("alias", a), oldest
    #: first. Last, with a default, so positional construction stays compatible.
    undo: list[tuple[str, int]] = field(default_factory=list)
    #: leaked[r] of the spec: the objects whose undo failed (still live, never undone
    #: again), named as on the undo stack.
    leaked: set[tuple[str, int]] = field(default_factory=set)

    def copy(self) -> "RankState":
        return RankState(self.va, set(self.created), set(self.mapped), set(self.alias_mapped),
                         dict(self.access), self.grants, self.ready, self.failed,
                         list(self.undo), set(self.leaked))

    def live_objects(self) -> set[tuple[str, int]]:
        """LiveObjects(r): what the rank holds, named as on the undo stack."""
        out = {("handle", a) for a in self.created}
        out |= {("plane", a) for a in self.mapped}
        out |= {("alias", a) for a in self.alias_mapped}
        if self.va:
            out.add(("va", 0))
        return out

    def drop(self, obj: tuple[str, int]) -> None:
        """The spec's Drop(r, o): remove ``obj`` wherever it is (O(1) when on top,
        which is every step the guards allow)."""
        if self.undo and self.undo[-1] == obj:
            self.undo.pop()
        else:
            self.undo = [o for o in self.undo if o != obj]

    def empty(self) -> bool:
        """Nothing left: no VA, handle, mapping or grant."""
        return not (self.va or self.created or self.mapped or self.alias_mapped or self.access)

    def counters(self) -> dict[str, object]:
        """The trace's per-rank abstract state (docs/INTERFACES.md)."""
        return {"va": self.va, "created": len(self.created), "mapped": len(self.mapped),
                "alias_mapped": len(self.alias_mapped), "grants": self.grants,
                "ready": self.ready, "failed": self.failed}

    def access_triples(self) -> frozenset[tuple[int, str, int]]:
        return frozenset((a, m, d) for (a, m), ds in self.access.items() for d in ds)


@dataclass
class ModelState:
    """The spec's variables: phase, per-rank state, published."""

    phase: str
    ranks: list[RankState]
    published: set[int] = field(default_factory=set)

    def copy(self) -> "ModelState":
        return ModelState(self.phase, [r.copy() for r in self.ranks], set(self.published))

    def freeze(self) -> tuple:
        """A hashable value of every variable (for comparing with TLC states)."""
        return (self.phase,
                tuple((r.va, frozenset(r.created), frozenset(r.mapped),
                       frozenset(r.alias_mapped), r.access_triples(), r.ready, r.failed,
                       tuple(r.undo), frozenset(r.leaked))
                      for r in self.ranks),
                frozenset(self.published))

    def to_json(self) -> dict[str, object]:
        """Readable form for reports: sets become sorted lists."""
        return {
            "phase": self.phase,
            "published": sorted(self.published),
            "ranks": {str(i): {"va": r.va, "created": sorted(r.created),
                               "mapped": sorted(r.mapped),
                               "alias_mapped": sorted(r.alias_mapped),
                               "access": [list(t) for t in sorted(r.access_triples())],
                               "ready": r.ready, "failed": r.failed,
                               "undo": [list(o) for o in r.undo],
                               "leaked": [list(o) for o in sorted(r.leaked)]}
                      for i, r in enumerate(self.ranks)},
        }


def initial_state(c: Constants) -> ModelState:
    """Init: Allocating, nothing reserved, created, mapped or granted."""
    return ModelState("Allocating", [RankState() for _ in range(c.ranks)], set())


# --- guards ------------------------------------------------------------------------------

# Why per-action functions of (c, s, r, a, m): the replay of a published-scale trace calls
# a guard and an effect per event; looking them up once per action name (RANK_STEPS)
# spares the Action tuple and the if-chains. guard() and apply() call the same functions,
# so the drift guard checks exactly the code the replay runs.

def _can_drive(s: ModelState, r: int | None) -> RankState | None:
    """The rank's state when a driver step of r may run at all (Allocating, not failed)."""
    if s.phase != "Allocating" or r is None:
        return None
    rs = s.ranks[r]
    return None if rs.failed else rs


def _g_reserve(c: Constants, s: ModelState, r: int | None, a: int | None,
               m: str | None) -> bool:
    rs = _can_drive(s, r)
    return rs is not None and not rs.va


def _g_create(c: Constants, s: ModelState, r: int | None, a: int | None,
              m: str | None) -> bool:
    rs = _can_drive(s, r)
    # a not created, all b < a created (prefix invariant: exactly a are created)
    if not (rs is not None and a is not None and rs.va and a not in rs.created
            and len(rs.created) == a):
        return False
    if not all(other.va for other in s.ranks):  # every rank reserves before any creates
        return False
    return a == 0 or _complete(c, rs, a - 1)


def _complete(c: Constants, rs: RankState, b: int) -> bool:
    """Complete(r, b): mapped, alias-mapped if aliased, every mapping granted. Only
    b = a-1 is checked: earlier allocations stay complete while a rank allocates (the
    spec checks every b < a; the two agree on every reachable state)."""
    if b not in rs.mapped or (b, "plane") not in rs.access:
        return False
    return b not in c.aliased or (b in rs.alias_mapped and (b, "alias") in rs.access)


def _g_map(c: Constants, s: ModelState, r: int | None, a: int | None,
           m: str | None) -> bool:
    rs = _can_drive(s, r)
    return rs is not None and a is not None and a in rs.created and a not in rs.mapped


def _g_map_alias(c: Constants, s: ModelState, r: int | None, a: int | None,
                 m: str | None) -> bool:
    rs = _can_drive(s, r)
    return (rs is not None and a is not None and a in c.aliased and a in rs.mapped
            and a in rs.created and a not in rs.alias_mapped)


def _g_grant(c: Constants, s: ModelState, r: int | None, a: int | None,
             m: str | None) -> bool:
    rs = _can_drive(s, r)
    if rs is None or a is None:
        return False
    if m == "plane":
        exists = a in rs.mapped
    elif m == "alias":
        exists = a in rs.alias_mapped
    else:
        return False
    return exists and (a, m) not in rs.access


_DRIVER_GUARDS = {"Reserve": _g_reserve, "Create": _g_create, "Map": _g_map,
                  "MapAlias": _g_map_alias, "Grant": _g_grant}


def _driver_guard(c: Constants, s: ModelState, act: Action, name: str) -> bool:
    """CanReserve / CanCreate / CanMap / CanMapAlias / CanGrant of the spec."""
    g = _DRIVER_GUARDS.get(name)
    return g is not None and bool(g(c, s, act.rank, act.alloc, act.mapping))


def _unwinding(s: ModelState, r: int | None) -> RankState | None:
    if s.phase not in _UNWINDING or r is None:
        return None
    return s.ranks[r]


def _newer_handle(rs: RankState, a: int) -> bool:
    """Some handle b > a is live and not leaked (the reverse-order guards). Without a
    leak on the rank ``created`` is a prefix 0..n-1, so a length test does."""
    if not rs.leaked:
        return len(rs.created) > a + 1
    return any(b > a and ("handle", b) not in rs.leaked for b in rs.created)


def _free_due(rs: RankState) -> bool:
    """CanFree(r) (phase aside): the VA is live, not leaked, and every handle and
    mapping is gone or leaked."""
    if not rs.va:
        return False
    lk = rs.leaked
    if not lk:
        return not rs.created  # (mappings have live handles while nothing leaked)
    return (("va", 0) not in lk and all(("handle", b) in lk for b in rs.created)
            and all(("plane", b) in lk for b in rs.mapped)
            and all(("alias", b) in lk for b in rs.alias_mapped))


def _g_free(c: Constants, s: ModelState, r: int | None, a: int | None,
            m: str | None) -> bool:
    rs = _unwinding(s, r)
    # the driver refuses to free a VA range with a (leaked) mapping in it
    return rs is not None and _free_due(rs) and not rs.mapped and not rs.alias_mapped


def _release_due(rs: RankState, a: int) -> bool:
    lk = rs.leaked
    if not lk:
        return (len(rs.created) <= a + 1 and a in rs.created and a not in rs.mapped
                and a not in rs.alias_mapped)
    return (a in rs.created and ("handle", a) not in lk
            and (a not in rs.mapped or ("plane", a) in lk)
            and (a not in rs.alias_mapped or ("alias", a) in lk)
            and not _newer_handle(rs, a))


def _g_release(c: Constants, s: ModelState, r: int | None, a: int | None,
               m: str | None) -> bool:
    rs = _unwinding(s, r)
    return rs is not None and a is not None and _release_due(rs, a)


def _unmap_due(rs: RankState, a: int, m: str | None) -> bool:
    if _newer_handle(rs, a):
        return False  # LIFO: no b > a still created (but leaked)
    lk = rs.leaked
    if m == "alias":
        return a in rs.alias_mapped and ("alias", a) not in lk
    if m == "plane":
        return (a in rs.mapped and ("plane", a) not in lk
                and (a not in rs.alias_mapped or ("alias", a) in lk))
    return False


def _g_unmap(c: Constants, s: ModelState, r: int | None, a: int | None,
             m: str | None) -> bool:
    rs = _unwinding(s, r)
    return rs is not None and a is not None and _unmap_due(rs, a, m)


_UNWIND_GUARDS = {"Unmap": _g_unmap, "Release": _g_release, "Free": _g_free}


def undo_failures(s: ModelState) -> int:
    """UndoFailures: leaked objects, less the VAs the driver had to refuse."""
    return sum(1 for rs in s.ranks for o in rs.leaked
               if o[0] != "va" or not (rs.mapped or rs.alias_mapped))


def _g_undo_fail(c: Constants, s: ModelState, act: Action) -> bool:
    """UndoFail(r, o): o's undo is due (its step's guard, the driver's refusal of
    Free aside), within MaxUndoFailures or a Free the driver must refuse."""
    rs = _unwinding(s, act.rank)
    if rs is None:
        return False
    x, a = act.step, act.alloc
    if x == "Free":
        due = _free_due(rs)
        refused = bool(rs.mapped or rs.alias_mapped)
    elif a is None or not 0 <= a < c.allocs:
        return False
    elif x == "Release":
        due, refused = _release_due(rs, a), False
    elif x == "Unmap" and act.mapping in ("plane", "alias"):
        due, refused = _unmap_due(rs, a, act.mapping), False
    else:
        return False
    if not due:
        return False
    return refused or c.max_undo_failures is None or undo_failures(s) < c.max_undo_failures


def undo_object(act: Action) -> tuple[str, int]:
    """The object an unwinding step (or its UndoFail) names, as on the undo stack."""
    x = act.step if act.name == "UndoFail" else act.name
    if x == "Free":
        return ("va", 0)
    if x == "Release":
        return ("handle", act.alloc)  # type: ignore[return-value]
    return (act.mapping, act.alloc)  # type: ignore[return-value]


def unwind_ended_leaking(s: ModelState) -> bool:
    """UnwindEndedLeaking: unwinding, an undo failed, and every rank ran every undo
    (all it still holds is leaked). A trace may end here: the runtime traces no
    AbortComplete / ShutdownComplete after a failed undo."""
    return (s.phase in _UNWINDING and any(rs.leaked for rs in s.ranks)
            and all(rs.live_objects() <= rs.leaked for rs in s.ranks))


def step_enabled(c: Constants, s: ModelState, r: int, x: str) -> bool:
    """StepEnabled(r, x): driver step x of rank r could run now, for some arguments."""
    if x == "Reserve":
        return _driver_guard(c, s, Action(x, r), x)
    if s.phase != "Allocating" or s.ranks[r].failed:
        return False
    if x == "Create":
        n = len(s.ranks[r].created)
        return n < c.allocs and _driver_guard(c, s, Action(x, r, n), x)
    if x == "Grant":
        return any(_driver_guard(c, s, Action(x, r, a, m), x)
                   for a in range(c.allocs) for m in ("plane", "alias"))
    if x in ("Map", "MapAlias"):
        return any(_driver_guard(c, s, Action(x, r, a), x) for a in range(c.allocs))
    return False


def _all_granted(c: Constants, rs: RankState) -> bool:
    return len(rs.access) == len(rs.mapped) + len(rs.alias_mapped)


def step_guard(c: Constants, s: ModelState, act: Action) -> bool:
    """The failed call's own guard (CanCreate(r, a), ...): a Fail event must name a
    step that could run with exactly its arguments."""
    return act.step in DRIVER_STEPS and _driver_guard(c, s, act, act.step)


def guard(c: Constants, s: ModelState, act: Action) -> bool:
    """Is ``act`` enabled in ``s``? (The spec's guard, evaluated without changing s.)"""
    n = act.name
    if n in DRIVER_STEPS:
        return _driver_guard(c, s, act, n)
    if n in _UNWIND_GUARDS:
        return bool(_UNWIND_GUARDS[n](c, s, act.rank, act.alloc, act.mapping))
    if n == "UndoFail":
        return act.step in UNDO_STEPS and _g_undo_fail(c, s, act)
    if n == "Fail":
        # Fail(r, x) == x \in FailSteps /\ StepEnabled(r, x); the trace engines also
        # check the failed call's own arguments (step_guard).
        return act.step in DRIVER_STEPS and act.rank is not None \
            and step_enabled(c, s, act.rank, act.step)
    if n == "RankReady":
        if s.phase != "Allocating" or act.rank is None:
            return False
        rs = s.ranks[act.rank]
        return (not rs.failed and not rs.ready and rs.va and len(rs.created) == c.allocs
                and len(rs.mapped) == c.allocs and rs.alias_mapped == c.aliased
                and _all_granted(c, rs))
    if n == "Publish":
        return (s.phase == "Allocating" and all(r.ready for r in s.ranks)
                and not any(r.failed for r in s.ranks))
    if n == "Abort":
        return s.phase == "Allocating" and any(r.failed for r in s.ranks)
    if n == "Unpublish":
        return s.phase == "Published"
    if n == "AbortComplete":
        return s.phase == "Aborting" and all(r.empty() for r in s.ranks)
    if n == "ShutdownComplete":
        return s.phase == "ShuttingDown" and all(r.empty() for r in s.ranks)
    return False


def _a_reserve(c: Constants, s: ModelState, r: int, a: int | None, m: str | None) -> None:
    rs = s.ranks[r]
    rs.va = True
    rs.undo.append(("va", 0))


def _a_create(c: Constants, s: ModelState, r: int, a: int | None, m: str | None) -> None:
    rs = s.ranks[r]
    rs.created.add(a)  # type: ignore[arg-type]
    rs.undo.append(("handle", a))  # type: ignore[arg-type]


def _a_map(c: Constants, s: ModelState, r: int, a: int | None, m: str | None) -> None:
    rs = s.ranks[r]
    rs.mapped.add(a)  # type: ignore[arg-type]
    rs.undo.append(("plane", a))  # type: ignore[arg-type]


def _a_map_alias(c: Constants, s: ModelState, r: int, a: int | None, m: str | None) -> None:
    rs = s.ranks[r]
    rs.alias_mapped.add(a)  # type: ignore[arg-type]
    rs.undo.append(("alias", a))  # type: ignore[arg-type]


def _a_grant(c: Constants, s: ModelState, r: int, a: int | None, m: str | None) -> None:
    rs = s.ranks[r]
    devs = c.grant_set(r, a, m)  # type: ignore[arg-type]
    rs.access[(a, m)] = devs  # type: ignore[index]
    rs.grants += len(devs)


def _a_unmap(c: Constants, s: ModelState, r: int, a: int | None, m: str | None) -> None:
    rs = s.ranks[r]
    (rs.alias_mapped if m == "alias" else rs.mapped).discard(a)  # type: ignore[arg-type]
    devs = rs.access.pop((a, m), None)  # type: ignore[arg-type]
    if devs:
        rs.grants -= len(devs)
    rs.drop((m, a))  # type: ignore[arg-type]


def _a_release(c: Constants, s: ModelState, r: int, a: int | None, m: str | None) -> None:
    rs = s.ranks[r]
    rs.created.discard(a)  # type: ignore[arg-type]
    rs.drop(("handle", a))  # type: ignore[arg-type]


def _a_free(c: Constants, s: ModelState, r: int, a: int | None, m: str | None) -> None:
    rs = s.ranks[r]
    rs.va = False
    rs.ready = False
    rs.drop(("va", 0))


_RANK_APPLY = {"Reserve": _a_reserve, "Create": _a_create, "Map": _a_map,
               "MapAlias": _a_map_alias, "Grant": _a_grant, "Unmap": _a_unmap,
               "Release": _a_release, "Free": _a_free}

#: name -> (guard, effect) of the rank steps that call the driver, each taking
#: (c, s, rank, alloc, mapping): what guard() and apply() run for these actions.
RANK_STEPS: dict[str, tuple[Callable[..., Any], Callable[..., None]]] = {
    n: ({**_DRIVER_GUARDS, **_UNWIND_GUARDS}[n], f) for n, f in _RANK_APPLY.items()}


def apply(c: Constants, s: ModelState, act: Action) -> None:
    """The action's effect, in place. Call only when :func:`guard` holds."""
    n = act.name
    f = _RANK_APPLY.get(n)
    if f is not None:
        f(c, s, act.rank, act.alloc, act.mapping)  # type: ignore[arg-type]
        return
    rs = s.ranks[act.rank] if act.rank is not None else None
    if n == "RankReady":
        rs.ready = True  # type: ignore[union-attr]
    elif n == "Fail":
        rs.failed = True  # type: ignore[union-attr]
    elif n == "UndoFail":
        o = undo_object(act)
        rs.leaked.add(o)  # type: ignore[union-attr]
        rs.drop(o)  # type: ignore[union-attr]
    elif n == "Publish":
        s.published = set(range(c.ranks))
        s.phase = "Published"
    elif n == "Abort":
        s.phase = "Aborting"
    elif n == "Unpublish":
        s.published = set()
        s.phase = "ShuttingDown"
    elif n == "AbortComplete":
        s.phase = "Aborted"
    elif n == "ShutdownComplete":
        s.phase = "Shutdown"
    else:  # pragma: no cover - guard() rejects unknown names first
        raise ValueError(f"action = {n!r}: not a lifecycle action")


def _candidates(c: Constants, s: ModelState) -> Iterator[Action]:
    for r in range(c.ranks):
        yield Action("Reserve", r)
        for a in range(c.allocs):
            for n in ("Create", "Map", "MapAlias", "Release"):
                yield Action(n, r, a)
            for m in ("plane", "alias"):
                yield Action("Grant", r, a, m)
                yield Action("Unmap", r, a, m)
        yield Action("RankReady", r)
        yield Action("Free", r)
    for n in ("Publish", "Abort", "Unpublish", "AbortComplete", "ShutdownComplete"):
        yield Action(n)


def enabled(c: Constants, s: ModelState, *, with_fail: bool = True) -> list[Action]:
    """Every enabled action instance in ``s`` (Fail(r, x) once per enabled step x)."""
    out = [act for act in _candidates(c, s) if guard(c, s, act)]
    if with_fail:
        out += [Action("Fail", r, step=x) for r in range(c.ranks)
                for x in ("Reserve", "Create", "Map", "MapAlias", "Grant")
                if step_enabled(c, s, r, x)]
        undo = [Action("UndoFail", r, step="Free") for r in range(c.ranks)]
        undo += [Action("UndoFail", r, a, step="Release") for r in range(c.ranks)
                 for a in range(c.allocs)]
        undo += [Action("UndoFail", r, a, m, step="Unmap") for r in range(c.ranks)
                 for a in range(c.allocs) for m in ("plane", "alias")]
        out += [act for act in undo if guard(c, s, act)]
    return out


