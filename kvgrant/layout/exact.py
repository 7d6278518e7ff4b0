"""The exact planner: the packing problem as an integer programme, solved by HiGHS.

Why: the heuristic packer cannot say how far it is from the best plan, and the
combinatorial bound is loose on chained layouts. An exact model answers both: HiGHS
(``highspy``) returns a plan and a dual bound, and when the plan's allocation count
equals the dual bound the plan is proven optimal. The model is in docs/layout.md
("Exact planner"); in short:

* A plan gives every plane granule a *label* (:mod:`kvgrant.layout.granules`): the
  interior of one row, one straddling region granule, or none (non-aliased). Interior
  granules of a row are interchangeable, so the order inside a row is free.
* Planes with the same bytes per page and size are interchangeable too, so the model
  is aggregated per plane *class* (the decomposition that removes the symmetry of the
  15 identical planes of the published layout): ``X[c,u,l]`` counts the planes of
  class c whose granule u has label l; ``Z[c,u]`` those left non-aliased.
* ``F[c,u,(a,b)]`` counts *joins*: planes whose granules u and u+1 lie in one
  allocation (same label; label b right after a in region order; both non-aliased).
  Allocations = plane granules - joins, so the model maximises joins. A join into the
  first granule of a row interior (or out of its last) happens at most once.
* Coverage: each row touches every page of its declared conflict set; eligibility
  (a granule may take a label only if its bytes touch only that row's pages) keeps
  the set from growing. So the contract's points 1-5 hold for every extracted plan.
  A coverage row implied by another (the same columns, or more) is left out.

Every contract-keeping plan is a feasible point of the model with at most its
allocation count, so HiGHS's dual bound is a lower bound on every plan. The plan
extracted from the solver's solution is checked with the contract checker and its
allocations counted by :func:`kvgrant.layout.plans.finish_plan`; it is reported
"optimal" only when that count equals the (rounded-up) dual bound.
"""

from __future__ import annotations

import os
import sys
import time
from dataclasses import dataclass, field
from typing import Callable, Iterable, Iterator, Mapping, Sequence

from kvgrant.errors import PlanError
from kvgrant.gc_pause import gc_paused
from kvgrant.layout.conflicts import (_INT64_SAFE, declared_conflict_arrays,
                                      declared_conflict_ranges)
from kvgrant.layout.contract import check_contract
from kvgrant.layout.geometry import Geometry
from kvgrant.layout.granules import (Labels, eligible_pairs, labels, labels_per_granule,
                                     plane_classes, straddling_part_arrays)
from kvgrant.layout.plan import Allocation, PhysicalPlan
from kvgrant.layout.rules import finish_plan

__all__ = ["DEFAULT_MAX_CHECKS", "DEFAULT_MAX_GAP", "DEFAULT_MAX_NONZEROS",
           "DEFAULT_MAX_SOLVES", "DEFAULT_MAX_WINDOWED_NONZEROS", "DEFAULT_NODE_LIMIT",
           "ExactResult", "SAFETY_SECONDS", "exact_plan", "within_gap"]

DEFAULT_NODE_LIMIT = 300
"""Branch-and-bound nodes per solve: a deterministic work limit (a count, not a clock,
so every rank of a group computes the same plan on any host and under any load)."""
DEFAULT_MAX_NONZEROS = 200_000
"""Largest model (matrix nonzeros) the solver is given; a larger one is not solved
(the plan is then the start's or the heuristic's). The size is a function of the
geometry only. Until the check limit below existed this was 100,000, because HiGHS
has no deterministic limit of its own on the work at the root node (its
``simplex_iteration_limit`` does not apply to a MIP); exporter-8 (170,181 nonzeros)
and random-0 (126,533) were then not solved at all."""
DEFAULT_MAX_CHECKS = 50
"""HiGHS limit checks per solve: a deterministic work limit on the whole solve, the
root node included. HiGHS checks its limits (``HighsMipSolverData::checkLimits``)
at fixed points of its search: after presolve, after each round of root cut
separation, around the root heuristics and at nodes; a callback on those checks
(``kCallbackMipInterrupt``) counts them and stops the solve past this many, keeping
its best plan and its dual bound. The count depends on the model and the options
only (one thread, fixed seed), never on the clock, so it bounds the root work that
``mip_max_nodes`` does not. Measured: every solved layout of the benchmark's tuning
sets (examples, exporter-0..9, random-0..9) proves optimality within 34 checks, except
exporter-8 (371 checks to the proof, about 43 s CPU; stopped at 50, after about
39 s, its plan is 411 against a bound of 410) and random-0 (about 1 s of root cut
separation per check, its gap above 25%)."""

DEFAULT_MAX_GAP = 0.01
"""The relative gap at which a solve of the whole model stops: at the first limit check
where the kept plan is within it of the solver's dual bound (rounded up), see
:func:`within_gap`; 0 solves on to the proof (or a work limit). Why 1%: the issue's
promise is "optimal, or a gap under 1%", and an allocation costs about 57 us of
start-up, so the last 1% of a plan of 600 allocations is worth about 0.3 ms, while
proving it took 2-9 s of CPU on the layouts where the difference showed (exporter-5
613 proven in 5.2 s against 615 within the gap in 3.0 s; exporter-1002 496 / 495 in
14.2 s against 496 / 492 in 5.2 s; docs/layout.md, "The gap target"). A fraction of
a count, so the stop is a function of the solve's path (deterministic)."""


def within_gap(cost: float, bound: float, max_gap: float) -> bool:
    """Whether a plan of ``cost`` is proven optimal by ``bound`` or less than
    ``max_gap`` (a fraction of ``cost``) above it: the planner's stop test."""
    return cost <= bound or cost - bound < max_gap * cost


DEFAULT_MAX_WINDOWED_NONZEROS = 2_000_000
"""Largest model solved window by window when it is over :data:`DEFAULT_MAX_NONZEROS`
(about 230,000 declared chunks of the published kind). The model is built in memory
whole: measured about 160 bytes per nonzero (the published layout at 20 times its
scale, 346,048 nonzeros, grew the process by 53 MB), so about 320 MB at this limit.
A larger model is not solved."""
SAFETY_SECONDS = 900.0
"""Wall-clock net for one solve. It never decides the plan: when it fires, planning
fails with :class:`~kvgrant.errors.PlanError` instead of returning a plan that depends
on the host's speed (ranks that plan for themselves must agree, and a group whose
ranks fail aborts as a whole). Within the size and node limits no solve measured
here came near it."""


class OutOfTime(Exception):
    """A solve reached the caller's ``time_limit`` (never raised without one)."""


def arm_clock(h: "highspy.Highs", deadline: float | None) -> None:
    """Set ``h``'s wall-clock limit for its next run: the time left to ``deadline``
    (a :func:`time.perf_counter` reading), or the :data:`SAFETY_SECONDS` net when the
    caller set no time limit. HiGHS measures ``time_limit`` per run."""
    left = SAFETY_SECONDS if deadline is None else deadline - time.perf_counter()
    h.setOptionValue("time_limit", max(1e-3, min(SAFETY_SECONDS, left)))


def out_of_time(h: "highspy.Highs", deadline: float | None, what: str) -> bool:
    """Whether ``h``'s last run stopped at its wall-clock limit: True under the
    caller's ``time_limit``; without one it is the safety net, and that is a
    :class:`PlanError` (a plan that depends on the host's speed is refused)."""
    import highspy

    if h.getModelStatus() != highspy.HighsModelStatus.kTimeLimit:
        return False
    if deadline is not None:
        return True
    raise PlanError(f"{what} ran past the {SAFETY_SECONDS:g} s safety net; planning refuses "
                    "a plan that depends on the host's speed. Plan once with "
                    "`kvgrant plan --json --time-limit SECONDS > plan.json` (the best plan "
                    "found in that time, with its gap) and pass the file to every rank "
                    "(`kvgrant alloc --plan plan.json`, or allocate(plan=...))")


_FREE = -1
DEFAULT_MAX_SOLVES = 6
"""Solves of the whole model per plan: the first, then up to 5 more with lost joins
cut off (each after a repair of the lost join's neighbourhood, which is not counted)."""

@dataclass(frozen=True)
class ExactResult:
    """What the exact planner found.

    ``plan`` is the best contract-keeping plan (the solver's, or ``start`` when the
    solver found nothing better); ``bound`` the solver's proven lower bound on
    allocations (or on the weighted cost); ``optimal`` is True when the plan's cost
    equals the bound. ``gap`` = cost - bound.
    """

    plan: PhysicalPlan
    cost: int
    bound: int
    optimal: bool
    seconds: float
    status: str
    source: str
    model: dict[str, int] = field(default_factory=dict)

    @property
    def gap(self) -> int:
        return self.cost - self.bound

    def to_json(self) -> dict[str, object]:
        return {"cost": self.cost, "bound": self.bound, "optimal": self.optimal,
                "gap": self.gap, "seconds": round(self.seconds, 3), "status": self.status,
                "source": self.source, "model": dict(self.model)}


@dataclass
class _Model:
    """The aggregated model's index maps and matrix (rows in COO form)."""

    classes: list[tuple[int, int, list[int]]]  # (bpp, units, plane indices)
    x: dict[tuple[int, int, int], int] = field(default_factory=dict)  # (c, u, label) -> col
    z: dict[tuple[int, int], int] = field(default_factory=dict)  # (c, u) -> col
    f: dict[tuple[int, int, int, int], int] = field(default_factory=dict)  # (c,u,a,b) -> col
    at: dict[tuple[int, int], list[int]] = field(default_factory=dict)  # (c, u) -> labels
    lower: list[float] = field(default_factory=list)
    upper: list[float] = field(default_factory=list)
    cost: list[float] = field(default_factory=list)
    rows_lo: list[float] = field(default_factory=list)
    rows_hi: list[float] = field(default_factory=list)
    rows: list[list[tuple[int, float]]] = field(default_factory=list)
    kinds: list[str] = field(default_factory=list)  # per row, see _Model.row
    offset: float = 0.0
    nonzeros: int = 0  # entries of all rows (row() and _CoverCount.add_rows count them)
    budget: int | None = None  # past this many nonzeros, row() raises _OverBudget
    cut_rows: tuple[int, int] = (0, 0)  # the pass-through cuts: rows [a, b), one block
    cut_nonzeros: int = 0  # their entries
    cuts_left_out: bool = False  # the pass-through cuts are not in the rows
    budget_passed_at: int = 0  # nonzeros when the cuts passed the budget (0: never)

    def col(self, lo: float, hi: float, cost: float = 0.0) -> int:
        self.lower.append(lo)
        self.upper.append(hi)
        self.cost.append(cost)
        return len(self.lower) - 1

    def row(self, entries: list[tuple[int, float]], lo: float, hi: float,
            kind: str = "cut") -> None:
        """Add a row; ``kind`` is "assign" (one granule's labels), "join" (a join
        against its granule), "need", "in" (joins into a label), "cover" or "cut"."""
        self.kinds.append(kind)
        self.rows.append(entries)
        self.rows_lo.append(lo)
        self.rows_hi.append(hi)
        self.nonzeros += len(entries)
        if self.budget is not None and self.nonzeros > self.budget:
            raise _OverBudget(self.nonzeros)

    def extend(self, other: "_Model") -> None:
        """Append ``other``'s rows (over this model's columns)."""
        self.rows.extend(other.rows)
        self.kinds.extend(other.kinds)
        self.rows_lo.extend(other.rows_lo)
        self.rows_hi.extend(other.rows_hi)
        self.nonzeros += other.nonzeros

    def drop_rows(self, a: int, b: int) -> None:
        """Remove rows ``[a, b)`` and their entries from the count."""
        self.nonzeros -= sum(map(len, self.rows[a:b]))
        for column in (self.rows, self.kinds, self.rows_lo, self.rows_hi):
            del column[a:b]


class _OverBudget(Exception):
    """A model being built passed its nonzero budget: it would be refused anyway, so
    building stops (odd-4's pass-through cuts alone have 103 million nonzeros and
    took over a minute to build before the size limit refused them)."""

    def __init__(self, nonzeros: int) -> None:
        super().__init__(nonzeros)
        self.nonzeros = nonzeros


def _least_nonzeros(g: Geometry) -> int:
    """A lower bound on the model's nonzeros, without building it: every label column
    ``X[c,u,l]`` sits in its granule's assign row and its label's need row (the
    columns are counted by :func:`kvgrant.layout.granules.eligible_pairs`). Why:
    :func:`_build` makes one column at a time, and a model far over every limit
    (229 million label columns) ran for minutes before the size limit refused it."""
    return 2 * eligible_pairs(g)


def _build(g: Geometry, free_cost: float, region_cost: dict[str, float], *,
           cover: bool = True, budget: int | None = None,
           pass_through: bool = True) -> tuple[_Model, Labels]:
    """The whole model; with ``cover`` False, every row but the coverage rows (which
    come last: :func:`_add_cover_rows` appends them, the same rows in the same order);
    with ``pass_through`` False, without the pass-through cuts (valid rows that only
    tighten the relaxation: the neighbourhood search, which solves small windows,
    builds no more than it needs).

    Why the split: a tall region's coverage rows are one per (row, page of its
    conflict set), a million at 2^20 rows, and a model that large is refused; their
    count (:func:`_cover_count`) decides that without building them. With a
    ``budget``, building raises :class:`_OverBudget` once the rows hold more nonzeros
    than that (a model no limit would let be solved)."""
    lab = labels(g)
    nl = len(lab.need)
    m = _Model(plane_classes(g), budget=budget)
    succ = lab.succ
    lcost = [free_cost + region_cost.get(lab.region[l_], 0.0) for l_ in range(nl)]
    by_label: list[list[int]] = [[] for _ in range(nl)]
    joins_in: list[list[int]] = [[] for _ in range(nl)]
    for c, (bpp, units, idx) in enumerate(m.classes):
        mult = len(idx)
        per_unit = labels_per_granule(g, bpp, units)
        for u in range(units):
            m.at[(c, u)] = per_unit[u]
            zc = m.col(0, mult, free_cost)
            m.z[(c, u)] = zc
            entries = [(zc, 1.0)]
            for l_ in per_unit[u]:
                xc = m.col(0, min(mult, lab.need[l_]), lcost[l_])
                m.x[(c, u, l_)] = xc
                entries.append((xc, 1.0))
                by_label[l_].append(xc)
            m.row(entries, mult, mult, "assign")
        # joins between granules u and u+1 of the same planes
        for u in range(units - 1):
            here = [_FREE] + per_unit[u]
            there = set(per_unit[u + 1])
            out_of: dict[int, list[tuple[int, float]]] = {}
            into: dict[int, list[tuple[int, float]]] = {}
            for a in here:
                for b in ((_FREE,) if a == _FREE else (a, succ[a])):
                    if b != _FREE and b not in there:
                        continue
                    if a != _FREE and b == _FREE:
                        continue
                    gain = free_cost if b == _FREE else lcost[b]
                    fc = m.col(0, mult, -gain)
                    m.f[(c, u, a, b)] = fc
                    out_of.setdefault(a, []).append((fc, 1.0))
                    into.setdefault(b, []).append((fc, 1.0))
                    if a != _FREE and b != a:
                        joins_in[b].append(fc)
            for a, ents in out_of.items():
                src = m.z[(c, u)] if a == _FREE else m.x[(c, u, a)]
                m.row(ents + [(src, -1.0)], -float("inf"), 0, "join")
            for b, ents in into.items():
                dst = m.z[(c, u + 1)] if b == _FREE else m.x[(c, u + 1, b)]
                m.row(ents + [(dst, -1.0)], -float("inf"), 0, "join")
    if pass_through:
        _add_pass_through_cuts(m, lab)
    for l_ in range(nl):
        if not by_label[l_]:
            raise PlanError(f"label {l_} of region {lab.region[l_]!r}: no plane granule may "
                            "back it (the declared layout breaks its own conflict sets)")
        m.row([(xc, 1.0) for xc in by_label[l_]], lab.need[l_], lab.need[l_], "need")
        if len(joins_in[l_]) > 1:
            m.row([(fc, 1.0) for fc in joins_in[l_]], 0, 1, "in")
        elif joins_in[l_]:
            # one join column into the label: the row would be that column <= 1, so its
            # bound says it (it was the class's multiplicity: exporter-2246, 12
            # interchangeable planes and G-aligned rows, let 11 planes join from one
            # row into the next, and the model's optimum was 725 where plans need 765)
            m.upper[joins_in[l_][0]] = 1.0
    if cover:
        _add_cover_rows(g, m, lab)
    return m, lab


def _add_cover_rows(g: Geometry, m: _Model, lab: Labels) -> None:
    """Append the coverage rows: per (region, row, page of its declared conflict set),
    the label columns whose granule touches that page (columns in creation order)."""
    G = g.granularity
    conflicts = declared_conflict_ranges(g)
    cover: dict[tuple[str, int, int], list[int]] = {}
    for (c, u, l_), xc in m.x.items():
        bpp = m.classes[c][0]
        for region, row, o1, o2 in lab.parts[l_]:
            p0 = (u * G + o1) // bpp
            p1 = min((u * G + o2 - 1) // bpp + 1, g.pages)
            for q in range(p0, p1):
                cover.setdefault((region, row, q), []).append(xc)
    sets: list[list[int]] = []
    for (region, row), ranges in conflicts.items():
        for a, b in ranges:
            for q in range(a, b):
                ents = cover.get((region, row, q))
                if not ents:
                    raise PlanError(f"region {region!r} row {row}: page {q} can be touched by "
                                    "no eligible granule")
                sets.append(ents)
    for ents, keep in zip(sets, needed_cover_rows(sets)):
        if keep:
            m.row([(xc, 1.0) for xc in ents], 1, float("inf"), "cover")


def needed_cover_rows(sets: Sequence[Sequence[int]]) -> list[bool]:
    """Which coverage rows (each a set of columns, ascending, every row "sum >= 1" over
    0/1-or-more integer columns) the model keeps: False for a repeat of an earlier
    row's set and for a row that holds another row's set and more.

    Why: both are implied by the row kept (a sum over a superset of non-negative
    columns is at least the sum over the subset), so the model's points, its LP
    relaxation and every bound stay the same; and a tall region repeats one set over
    thousands of rows (published-dcp8 with 2^20 snapshot rows: 1,062,084 coverage
    rows, 4,443 distinct sets, 3,197 kept), which made its model too large for one
    solve. The result is a function of the sets alone (so both ways of building the
    rows agree)."""
    first: dict[tuple[int, ...], int] = {}
    for i, ents in enumerate(sets):
        first.setdefault(tuple(ents), i)
    distinct = list(first)
    keep = [False] * len(sets)
    for j in _minimal_sets(distinct):
        keep[first[distinct[j]]] = True
    return keep


_SUBSET_WORK = 20_000_000
"""Row visits :func:`_minimal_sets` makes at most; past it every remaining set is kept
(keeping an implied row is always sound). A count, so the model stays a function of
the geometry."""


def _minimal_sets(sets: Sequence[tuple[int, ...]]) -> list[int]:
    """Indices of the (distinct) sets that hold no other set of ``sets``, in order."""
    rows_of: dict[int, list[int]] = {}
    for j, cols in enumerate(sets):
        for c in cols:
            rows_of.setdefault(c, []).append(j)
    out: list[int] = []
    work = 0
    for j, cols in enumerate(sets):
        n = len(cols)
        hits: dict[int, int] = {}
        if work <= _SUBSET_WORK:
            for c in cols:
                ks = rows_of[c]
                work += len(ks)
                for k in ks:
                    if len(sets[k]) < n:
                        hits[k] = hits.get(k, 0) + 1
        if not any(h == len(sets[k]) for k, h in hits.items()):
            out.append(j)
    return out


@dataclass
class _CoverCount:
    """What :func:`_add_cover_rows` would add, counted without adding it.

    ``nonzeros`` and ``rows`` are exact: every page a label column touches is a page
    of its row's conflict set (eligibility, :func:`kvgrant.layout.granules.unit_ranges`:
    the touched bytes lie inside one range of the set, or past the last page), so each
    touched (row, page) is a coverage row and each column touching it one of its
    nonzeros, before :func:`needed_cover_rows` drops the implied ones (the same rows
    here); ``complete`` says every conflict page is touched by some column (else
    building raises :class:`PlanError`, so the caller builds). ``key``, ``label`` and
    ``col`` are per nonzero of the kept rows, sorted by ``key`` (ties in column creation
    order): its (row, page) as one integer (rows in geometry order, so ``key`` order is
    the coverage rows' order), the column's label and the column; ``starts`` where each
    key's run begins, then the length."""

    nonzeros: int
    rows: int
    complete: bool
    key: object
    label: object
    col: object
    starts: object

    def kept_by(self, rank: Sequence[int], e: int) -> int:
        """Nonzeros of the coverage rows whose labels all rank below ``e`` (the rows a
        first window solving ranks [0, e) keeps whole; it drops the others)."""
        import numpy as np

        r = np.asarray(rank, dtype=np.int64)[self.label]  # type: ignore[index]
        if not len(r) or int(r.max()) < e:
            return self.nonzeros
        starts = self.starts
        latest = np.maximum.reduceat(r, starts[:-1])  # type: ignore[index]
        return int(np.diff(starts)[latest < e].sum())  # type: ignore[call-overload]

    def add_rows(self, m: _Model) -> None:
        """Append the coverage rows to ``m``: the rows :func:`_add_cover_rows` appends
        when coverage is ``complete``, from the arrays (about 4 times faster)."""
        cols = self.col.tolist()  # type: ignore[attr-defined]
        at = self.starts.tolist()  # type: ignore[attr-defined]
        n = len(at) - 1
        m.rows.extend([(x, 1.0) for x in cols[at[i]:at[i + 1]]] for i in range(n))
        m.kinds.extend(["cover"] * n)
        m.rows_lo.extend([1] * n)
        m.rows_hi.extend([float("inf")] * n)
        m.nonzeros += at[-1] - at[0]


def _cover_count(g: Geometry, m: _Model, lab: Labels) -> _CoverCount | None:
    """The coverage rows of ``m`` counted in bulk (numpy); None when a number might
    not fit int64 (the caller then builds them)."""
    import numpy as np

    G, pages = g.granularity, g.pages
    base = g.first_row
    total_rows = sum(r.rows for r in g.regions)
    span = max((r.rows * r.row_bytes + r.row_bytes for r in g.regions), default=0)
    far = max((units * G for _, units, _ in m.classes), default=0) + span
    if max((total_rows + 1) * (pages + 1), far) >= _INT64_SAFE:
        return None
    # per label: its parts as (global row, o1, o2) arrays, concatenated
    rows_l: list[object] = []
    o1_l: list[object] = []
    o2_l: list[object] = []
    flat: tuple[list[int], list[int], list[int]] = ([], [], [])  # small labels, pending

    def flush() -> None:
        if flat[0]:
            for out, vals in zip((rows_l, o1_l, o2_l), flat):
                out.append(np.array(vals, dtype=np.int64))
                vals.clear()

    for l_, parts in enumerate(lab.parts):
        got = straddling_part_arrays(g, lab, l_) if len(parts) > 64 else None
        if got is None:
            for region, row, o1, o2 in parts:
                flat[0].append(base[region] + row)
                flat[1].append(o1)
                flat[2].append(o2)
        else:
            flush()
            rows_l.append(got[0])
            o1_l.append(got[1])
            o2_l.append(got[2])
    flush()
    count = np.fromiter(map(len, lab.parts), dtype=np.int64, count=len(lab.parts))
    if not m.x:
        none = np.zeros(0, np.int64)
        return _CoverCount(0, _conflict_pages(g), _conflict_pages(g) == 0, none, none,
                           none, np.zeros(1, np.int64))
    prow = np.concatenate(rows_l)
    po1 = np.concatenate(o1_l)
    po2 = np.concatenate(o2_l)
    first = np.cumsum(count) - count
    keys = list(m.x)  # creation order
    xl = np.fromiter((k[2] for k in keys), dtype=np.int64, count=len(keys))
    xu = np.fromiter((k[1] for k in keys), dtype=np.int64, count=len(keys))
    xb = np.fromiter((m.classes[k[0]][0] for k in keys), dtype=np.int64, count=len(keys))
    n = count[xl]
    which = np.repeat(np.arange(len(keys)), n)
    part = np.repeat(first[xl], n) + (np.arange(int(n.sum())) - np.repeat(np.cumsum(n) - n, n))
    ub = xu[which] * G
    bpp = xb[which]
    p0 = (ub + po1[part]) // bpp
    p1 = np.minimum((ub + po2[part] - 1) // bpp + 1, pages)
    cnt = np.maximum(p1 - p0, 0)
    nnz = int(cnt.sum())
    at = np.repeat(prow[part] * (pages + 1) + p0, cnt) + (
        np.arange(nnz) - np.repeat(np.cumsum(cnt) - cnt, cnt))
    col = np.repeat(np.fromiter(m.x.values(), dtype=np.int64, count=len(keys))[which], cnt)
    lab_of = np.repeat(xl[which], cnt)
    order = np.argsort(at, kind="stable")
    at, lab_of, col = at[order], lab_of[order], col[order]
    new = np.ones(len(at), dtype=bool)
    new[1:] = at[1:] != at[:-1]
    starts = np.append(np.flatnonzero(new), len(at))
    complete = len(starts) - 1 == _conflict_pages(g)
    kept = _first_of_each_set(col, starts)
    firsts = np.flatnonzero(kept)
    cols_py, at_py = col.tolist(), starts.tolist()
    distinct = [tuple(cols_py[at_py[i]:at_py[i + 1]]) for i in firsts.tolist()]
    kept[:] = False
    kept[firsts[_minimal_sets(distinct)]] = True  # as needed_cover_rows keeps them
    if not kept.all():
        length = np.diff(starts)
        mask = np.repeat(kept, length)
        at, lab_of, col = at[mask], lab_of[mask], col[mask]
        starts = np.append(0, np.cumsum(length[kept]))
    return _CoverCount(len(col), len(starts) - 1, complete, at, lab_of, col, starts)


def _first_of_each_set(col: object, starts: object) -> object:
    """Per coverage row (``col[starts[i]:starts[i + 1]]``, columns ascending): True
    for the first row with its column set, False for a repeat (the same constraint)."""
    import numpy as np

    length = np.diff(starts)  # type: ignore[call-overload]
    kept = np.zeros(len(length), dtype=bool)
    for n in np.unique(length).tolist():
        rows = np.flatnonzero(length == n)
        sets = col[starts[rows][:, None] + np.arange(n)]  # type: ignore[index]
        first = np.unique(sets, axis=0, return_index=True)[1]  # first occurrences
        kept[rows[first]] = True
    return kept


def _conflict_pages(g: Geometry) -> int:
    """Pages in all declared conflict sets together (the coverage rows)."""
    arr = declared_conflict_arrays(g)
    if arr is not None:
        return int((arr[2] - arr[1]).sum())
    return sum(b - a for rs in declared_conflict_ranges(g).values() for a, b in rs)


def _add_pass_through_cuts(m: _Model, lab: Labels) -> None:
    """:func:`_pass_through_cuts`, or none of them when they pass the model's budget.

    Why: the cuts are valid for every plan but not needed for one (a lost join is cut
    off and repaired after the solve), and on some layouts they are most of the model
    (random-80: 179,266 of 209,818 nonzeros over 2,078 label columns; odd-212: 2.3
    million over a model of 20,866), so they alone may put a small model over the
    size limits."""
    rows, nonzeros = len(m.rows), m.nonzeros
    try:
        _pass_through_cuts(m, lab)
    except _OverBudget as over:
        m.drop_rows(rows, len(m.rows))
        m.cuts_left_out, m.budget_passed_at = True, over.nonzeros
    m.cut_rows, m.cut_nonzeros = (rows, len(m.rows)), m.nonzeros - nonzeros


MAX_CUT_FREE_LP_ITERATIONS = 25_000
"""Most simplex iterations the LP relaxation of a model without its pass-through cuts
may take for that model to be solved whole (a count, so the choice is deterministic).
Why: HiGHS checks no limit inside a MIP's root LP, and some such models keep it busy
for minutes (odd-174: 57,150 iterations, 23 s for the LP alone; odd-338: 30,487),
where the model with its cuts was refused in seconds. Measured (2026-12-04): the
cut-free models solved whole on unseen seeds took 5,989-19,209 iterations (random-80
8,193; random-56 19,209; exporter-2029 15,860)."""


def _lp_ends_within(m: _Model, cover: _Model | None, iterations: int) -> bool:
    """Whether the LP relaxation of ``m`` without its pass-through cuts (and with the
    coverage rows of ``cover``, when they are not in ``m`` yet) reaches its optimum
    within ``iterations``."""
    a, b = m.cut_rows
    rows, lo, hi = m.rows[:a] + m.rows[b:], m.rows_lo[:a] + m.rows_lo[b:], \
        m.rows_hi[:a] + m.rows_hi[b:]
    if cover is not None:
        rows, lo, hi = rows + cover.rows, lo + cover.rows_lo, hi + cover.rows_hi
    return _relaxation(m, rows, lo, hi, iterations) is not None


def _relaxation(m: _Model, rows: Sequence[Sequence[tuple[int, float]]],
                rows_lo: Sequence[float], rows_hi: Sequence[float], iterations: int,
                deadline: float | None = None) -> float | None:
    """The optimum of the LP relaxation of ``m``'s columns under ``rows``, or None when
    the simplex does not reach it within ``iterations`` (a count) or the deadline."""
    import highspy
    import numpy as np

    h = _mip(m.cost, m.lower, m.upper, rows_lo, rows_hi, *_csr(rows), None)
    n = len(m.cost)
    h.changeColsIntegrality(n, np.arange(n, dtype=np.int32),
                            np.full(n, highspy.HighsVarType.kContinuous))
    h.setOptionValue("simplex_iteration_limit", int(iterations))
    arm_clock(h, deadline)
    h.run()
    if h.getModelStatus() != highspy.HighsModelStatus.kOptimal:
        return None
    return float(h.getInfo().objective_function_value)


WINDOWS_LP_ITERATIONS = 100_000
"""Most simplex iterations of the whole model's LP relaxation after a windowed plan (a
count: the bound is a function of the geometry). Why: a windowed plan has no proof of
its own, and the combinatorial bound is loose there; the LP relaxation of the (exact)
model is a bound on every plan. At 20 times the published scale (264,043 nonzeros) it
took 46,044 iterations and 1.8 s, and gave 25,647 against the combinatorial 24,841,
for a plan of 25,989 (a gap of 1.3% instead of 4.4%). Past the limit the bound is the
combinatorial one, as before."""
WINDOWS_LP_MAX_NONZEROS = 400_000
"""Largest windowed model whose LP relaxation is solved for a bound. Why: the time per
simplex iteration grows with the model, so the iteration limit alone does not bound
the time: on two odd layouts (fuzz-like, whose windows are refused) 100,000
iterations took 9.1 s at 410,498 nonzeros and 244 s at 1,426,187, without reaching
the optimum either time."""


def _lp_bound(m: _Model, iterations: int, deadline: float | None = None) -> int | None:
    """The LP relaxation of ``m`` (every row of it) rounded up: a lower bound on every
    plan, since the model's optimum is the fewest allocations of any plan; None when
    the simplex does not reach the optimum within ``iterations`` (or the caller's
    deadline), whose intermediate values bound nothing."""
    value = _relaxation(m, m.rows, m.rows_lo, m.rows_hi, iterations, deadline)
    return None if value is None else _ceil(value)


def _drop_pass_through_cuts(m: _Model) -> None:
    """Leave out the pass-through cuts: the model then allows the pass-through
    pattern, which the extraction reports as a lost join (cut off and repaired as
    after any solve), and its bound stays a bound (a relaxation of a valid model)."""
    a, b = m.cut_rows
    m.drop_rows(a, b)
    m.cut_rows, m.cut_nonzeros, m.cuts_left_out = (a, a), 0, True


def _pass_through_cuts(m: _Model, lab: Labels) -> None:
    """Rows that forbid joining one run of a row interior at both ends while the
    interior has more granules (the extracted plan could not realise both joins).

    For an in-join (pred -> l) into granule u and an out-join (l -> succ) out of
    granule v, v - u + 1 < need_l, every plan has, besides the pass-through, another
    l-run near the window: one ending unjoined in [u, v-1] (``E_t``), one starting
    unjoined in [u, v] (``S_t``), or one holding granule u - 1. So
    ``F_in + F_out <= 1 + X[u-1] + sum E_t + sum S_t`` holds for every plan, and
    cuts off the pass-through (proof in docs/layout.md, "Exact planner").
    """
    for c, l_, p, s_, u, v in _short_windows(m, lab):
        m.row(_row([(m.f[(c, u - 1, p, l_)], 1.0), (m.f[(c, v, l_, s_)], 1.0),
                    (m.x.get((c, u - 1, l_)), -1.0),
                    *_unjoined_ends(m, c, l_, s_, range(u, v)),
                    *_unjoined_starts(m, c, l_, p, range(u, v + 1))]),
              -float("inf"), 1.0)


def _short_windows(m: _Model, lab: Labels) -> Iterator[tuple[int, int, int, int, int, int]]:
    """(class, label, pred, succ, u, v) of every in-join (pred -> label) into granule u
    and out-join (label -> succ) out of granule v of one class, v - u + 1 < the label's
    need, whose granules all have a column: the windows the run cuts are about."""
    ins: dict[tuple[int, int], list[int]] = {}  # (class, label) -> u of in-joins
    outs: dict[tuple[int, int], list[int]] = {}
    for (c, u, a, b) in m.f:
        if a == _FREE or a == b:
            continue
        ins.setdefault((c, b), []).append(u + 1)
        outs.setdefault((c, a), []).append(u)
    for (c, l_), us in ins.items():
        n = lab.need[l_]
        p, s_ = lab.pred[l_], lab.succ[l_]
        if n < 2 or s_ < 0 or lab.parts[l_][0][2] != 0:
            continue
        for u in us:
            for v in outs.get((c, l_), ()):
                if u <= v < u + n - 1 and all((c, t, l_) in m.x for t in range(u, v + 1)):
                    yield c, l_, p, s_, u, v


def _unjoined_ends(m: _Model, c: int, l_: int, s_: int,
                   ts: range) -> Iterator[tuple[int | None, float]]:
    """Terms of ``sum E_t``: a run of label l_ ends at t, joined to neither l_ nor s_."""
    for t in ts:
        yield m.x[(c, t, l_)], -1.0
        yield m.f.get((c, t, l_, l_)), 1.0
        yield m.f.get((c, t, l_, s_)), 1.0


def _unjoined_starts(m: _Model, c: int, l_: int, p: int,
                     ts: range) -> Iterator[tuple[int | None, float]]:
    """Terms of ``sum S_t``: a run of label l_ starts at t, joined from neither l_ nor p."""
    for t in ts:
        yield m.x[(c, t, l_)], -1.0
        yield m.f.get((c, t - 1, l_, l_)), 1.0
        yield m.f.get((c, t - 1, p, l_)), 1.0


def _row(terms: Iterable[tuple[int | None, float]]) -> list[tuple[int, float]]:
    """(column, coefficient) pairs of a row: terms of one column summed (in first-seen
    order), absent columns (None) and zero sums left out."""
    coef: dict[int, float] = {}
    for col, k in terms:
        if col is not None:
            coef[col] = coef.get(col, 0.0) + k
    return [(col, k) for col, k in coef.items() if k]


class _Checks(list):
    """The check counter of one HiGHS instance (``[checks of this solve, 1 to report
    progress / 0 in a repair]``, a list for its callers) and the handlers of the other
    callback kinds: HiGHS keeps one callback per instance, so every kind goes through
    the one function :func:`_count_checks` installs (``handlers``: kind -> function of
    the callback's ``out`` and ``into``), and ``enough``: a test of a check's ``out``
    that stops the solve when True (its plan is proven, or within the gap target;
    None: no such test)."""

    handlers: dict[int, Callable[[object, object], None]]
    enough: Callable[[object], bool] | None


def _count_checks(h: "highspy.Highs", limit: int | None,
                  progress: Callable[[str], None] | None = None) -> _Checks:
    """Count HiGHS's limit checks (see :data:`DEFAULT_MAX_CHECKS`) and interrupt the
    solve after ``limit`` of them; returns the counter (a list: the checks, which the
    caller resets before each solve, then 1 to report progress, 0 not to). Every 10th
    check reports the solver's best plan and bound to ``progress`` (a message only: it
    never changes the solve). Other callback kinds go to the counter's ``handlers``."""
    import highspy

    count = _Checks([0, 1])  # checks of this solve; whether to report progress (0 in a repair)
    count.handlers, count.enough = {}, None
    interrupt = int(highspy.cb.HighsCallbackType.kCallbackMipInterrupt)

    def on_check(kind: int, message: str, out: object, into: object, user: object) -> None:
        if int(kind) != interrupt:
            handler = count.handlers.get(int(kind))
            if handler is not None:
                handler(out, into)
            return
        count[0] += 1
        # set both ways: HiGHS keeps the flag from the last run of ``h``, so a solve
        # after an interrupted one (its repair) stopped at its first check
        stop = (limit is not None and count[0] > limit) or (
            count.enough is not None and count.enough(out))
        into.user_interrupt = stop  # type: ignore[attr-defined]
        if not stop and progress is not None and count[1] and count[0] % 10 == 0:
            best = getattr(out, "mip_primal_bound", float("inf"))
            try:  # an exception here would abort the solve (HiGHS sees a failed callback)
                progress(f"solver: {count[0]}{'' if limit is None else f' of {limit:,}'} "
                         f"checks, best plan "
                         f"{'-' if best == float('inf') else f'{best:,.0f}'}, "
                         f"bound {_ceil(getattr(out, 'mip_dual_bound', 0.0)):,}")
            except Exception:  # noqa: BLE001 - a message only; the solve goes on
                pass

    h.setCallback(on_check, None)
    h.startCallback(highspy.cb.HighsCallbackType.kCallbackMipInterrupt)
    return count


MAX_POLISHED = 64
"""Improving solutions of one solver instance that :class:`_Polisher` extracts into
plans; past it they are left to HiGHS. A count (determinism), and a cap on the
extraction and contract check per solution on a huge model (both walk every granule)."""


class _Polisher:
    """Every improving solution HiGHS finds is extracted into a plan at once and the
    cheapest kept; the solve stops at the first limit check where the dual bound
    (rounded up) proves the kept plan optimal or within the gap target
    (:data:`DEFAULT_MAX_GAP`).

    Why: the model counts only the joins its F columns say, and HiGHS leaves many at 0
    where the extraction realises them. On random-5 the extraction of HiGHS's first
    solution (objective 160) is a plan of 133, the optimum; HiGHS found only 134 by its
    check limit (13 s), so the plan stayed unproven, though its bound reached 133 at
    about 3 s. On exporter-2081 HiGHS's incumbent stayed at 615 for all 50 checks while
    its extraction was a plan of 465.

    Nothing is handed back to HiGHS: its search is the same as without the polisher up
    to the stop, so the plan is never worse than before and the bound is the solver's
    own. (Handing the plan back as HiGHS's incumbent, through its user-solution
    callback, was measured on 120 layouts: it proved random-5 too, but it moves HiGHS's
    path, and of three other plans that changed, two got worse.) Everything here is a
    function of the solve's path (one thread, fixed seed), so planning stays
    deterministic."""

    def __init__(self, g: Geometry, m: "_Model", lab: Labels, label: str, plane_cost: float,
                 region_cost: dict[str, float], checks: _Checks, best_cost: float | None,
                 h: "highspy.Highs | None" = None, max_gap: float = 0.0) -> None:
        """Registers itself with ``checks`` (the counter of ``h``) and asks ``h``, when
        given, for its improving solutions."""
        import highspy

        self.g, self.m, self.lab, self.label = g, m, lab, label
        self.plane_cost, self.region_cost, self.checks = plane_cost, region_cost, checks
        self.max_gap = max_gap
        self.best: PhysicalPlan | None = None
        self.best_cost = float("inf") if best_cost is None else float(best_cost)
        self.seen = 0
        self.bound_valid = True  # False once a lost pattern is forbidden outright
        checks.handlers[int(highspy.cb.HighsCallbackType.kCallbackMipImprovingSolution)] = \
            self._improving
        checks.enough = self._enough
        if h is not None:
            h.startCallback(highspy.cb.HighsCallbackType.kCallbackMipImprovingSolution)

    def better(self, best: PhysicalPlan | None, best_cost: float | None, source: str
               ) -> tuple[PhysicalPlan | None, float | None, str]:
        """The caller's best plan, or the best extracted here when that is cheaper;
        from then on only plans cheaper than the result are kept here."""
        if self.best is not None and (best_cost is None or self.best_cost < best_cost):
            best, best_cost, source = self.best, self.best_cost, "solver"
        if best_cost is not None:
            self.best_cost = min(self.best_cost, float(best_cost))
        return best, best_cost, source

    def _enough(self, out: object) -> bool:
        # ``best_cost`` is the best plan held here or by the caller (the start, or the
        # loop's best): a start already within the gap target stops the solve too.
        # Only in a solve of the whole model: a repair's bound (its columns fixed
        # around one point) bounds only that neighbourhood
        return (bool(self.checks[1]) and self.bound_valid
                and within_gap(self.best_cost, _ceil(float(getattr(
                    out, "mip_dual_bound", -float("inf")))), self.max_gap))

    def _improving(self, out: object, into: object) -> None:
        if self.seen >= MAX_POLISHED:
            return
        vals = getattr(out, "mip_solution", None)
        if vals is None or len(vals) != len(self.m.lower):
            return
        self.seen += 1
        try:  # an exception here would abort the solve (HiGHS sees a failed callback)
            plan, _lost = _extract(self.g, self.m, self.lab, vals, self.label)
            cost = _cost(plan, self.plane_cost, self.region_cost)
            if cost < self.best_cost and not check_contract(self.g, plan):
                self.best, self.best_cost = plan, cost
        except Exception:  # noqa: BLE001 - a plan missed; the solve goes on
            return


def _one_run_cuts(m: _Model, lab: Labels,
                  only: set[tuple[int, int, int, int]] | None = None) -> list[list[tuple[int, float]]]:
    """Rows that say: a run joined in at u and out at v (v - u + 1 < need) is not one
    plane's run, so either a run of the label ends (or starts) unjoined inside the
    window, or a second plane holds the label where the other join is.

    With ``F_in`` = F[c,u-1,(pred,l)], ``F_out`` = F[c,v,(l,succ)] (each at most 1),
    every plan has ``F_in + 2 F_out <= 1 + sum_{t=u}^{v-1} E_t + X[c,v,l]`` and, the
    mirror image, ``2 F_in + F_out <= 1 + sum_{t=u+1}^{v} S_t + X[c,u,l]`` (proof in
    docs/layout.md, "Exact planner"). Returns the rows as (column, coefficient) lists,
    each with upper bound 1; ``only`` restricts them to the given (class, label, u, v).
    """
    rows: list[list[tuple[int, float]]] = []
    for c, l_, p, s_, u, v in _short_windows(m, lab):
        if only is not None and (c, l_, u, v) not in only:
            continue
        f_in, f_out = m.f[(c, u - 1, p, l_)], m.f[(c, v, l_, s_)]
        rows.append(_row([(f_in, 1.0), (f_out, 2.0), (m.x[(c, v, l_)], -1.0),
                          *_unjoined_ends(m, c, l_, s_, range(u, v))]))
        rows.append(_row([(f_in, 2.0), (f_out, 1.0), (m.x[(c, u, l_)], -1.0),
                          *_unjoined_starts(m, c, l_, p, range(u + 1, v + 1))]))
    return rows


def _highs():
    """A silent HiGHS instance (its first construction prints a banner on fd 1)."""
    import highspy

    sys.stdout.flush()
    saved = os.dup(1)
    try:
        with open(os.devnull, "w") as null:
            os.dup2(null.fileno(), 1)
            h = highspy.Highs()
    finally:
        os.dup2(saved, 1)
        os.close(saved)
    h.setOptionValue("output_flag", False)
    return h


def _csr(rows: Sequence[Sequence[tuple[int, float]]]
         ) -> tuple[list[int], list[int], list[float]]:
    """``rows`` (one list of (column, coefficient) per row) as CSR: row starts, column
    indices and values, the form :func:`_mip` takes."""
    starts: list[int] = []
    index: list[int] = []
    value: list[float] = []
    for ents in rows:
        starts.append(len(index))
        for col, v in ents:
            index.append(col)
            value.append(v)
    return starts, index, value


def _mip(cost: Sequence[float], lower: Sequence[float], upper: Sequence[float],
         rows_lo: Sequence[float], rows_hi: Sequence[float], starts: Sequence[int],
         index: Sequence[int], values: Sequence[float], node_limit: int | None,
         options: Mapping[str, object] | None = None) -> "highspy.Highs":
    """A silent HiGHS instance holding an all-integer model (rows in CSR form) with the
    planner's deterministic settings (see :func:`exact_plan`, "Determinism")."""
    import highspy
    import numpy as np

    inf = highspy.kHighsInf
    h = _highs()
    n = len(cost)
    h.addCols(n, np.array(cost, dtype=np.float64), np.array(lower, dtype=np.float64),
              np.array(upper, dtype=np.float64), 0, np.zeros(n, dtype=np.int32),
              np.array([], dtype=np.int32), np.array([], dtype=np.float64))
    h.changeColsIntegrality(n, np.arange(n, dtype=np.int32),
                            np.full(n, highspy.HighsVarType.kInteger))
    h.addRows(len(rows_lo), np.array([-inf if x == -float("inf") else x for x in rows_lo]),
              np.array([inf if x == float("inf") else x for x in rows_hi]), len(index),
              np.array(starts, dtype=np.int32), np.array(index, dtype=np.int32),
              np.array(values, dtype=np.float64))
    for key, v in (("time_limit", SAFETY_SECONDS), ("mip_rel_gap", 0.0),
                   ("mip_abs_gap", 0.999), ("threads", 1), ("random_seed", 0),
                   *(options or {}).items()):
        h.setOptionValue(key, v)
    if node_limit is not None:
        h.setOptionValue("mip_max_nodes", int(node_limit))
    return h


def _start_values(g: Geometry, m: _Model, lab, plan: PhysicalPlan) -> list[float] | None:
    """Column values of ``plan`` (a warm start), or None when it does not fit the model."""
    G = g.granularity
    pidx = {p.name: i for i, p in enumerate(g.planes)}
    label_of: dict[tuple[str, int], int] = {}
    for l_ in range(len(lab.need)):
        for d in range(lab.need[l_] if len(lab.parts[l_]) == 1 and lab.parts[l_][0][2] == 0
                       and lab.parts[l_][0][3] == G else 1):
            label_of[(lab.region[l_], lab.first[l_] + d)] = l_
    # per plane granule: (label, region granule) or free
    at: list[list[tuple[int, str | None, int]]] = [
        [(_FREE, None, -1)] * (g.plane_bytes(p.name) // G) for p in g.planes]
    alloc_of: list[list[int]] = [[-1] * (g.plane_bytes(p.name) // G) for p in g.planes]
    for i, a in enumerate(plan.allocations):
        pi = pidx[a.plane]
        for d in range(a.length // G):
            u = a.plane_offset // G + d
            alloc_of[pi][u] = i
            if a.region is not None:
                j = a.region_offset // G + d
                at[pi][u] = (label_of[(a.region, j)], a.region, j)
    vals = [0.0] * len(m.lower)
    for c, (_, units, idx) in enumerate(m.classes):
        for pi in idx:
            for u in range(units):
                l_ = at[pi][u][0]
                key = (c, u) if l_ == _FREE else (c, u, l_)
                col = m.z.get(key) if l_ == _FREE else m.x.get(key)  # type: ignore[arg-type]
                if col is None:
                    return None
                vals[col] += 1
                if u + 1 < units and alloc_of[pi][u] == alloc_of[pi][u + 1]:
                    fc = m.f.get((c, u, l_, at[pi][u + 1][0]))
                    if fc is None:
                        return None
                    vals[fc] += 1
    return vals


def _extract(g: Geometry, m: _Model, lab: Labels, vals: Sequence[float], label: str
             ) -> tuple[PhysicalPlan, list[tuple[int, int, int, int]]]:
    """A plan from column values, and the joins it could not realise.

    Each plane of a class gets its labels granule by granule, following the joins; a
    join out of a row interior goes, where there is a choice, to a plane whose run
    was not joined in (one run cannot be both first and last of a row that has more
    runs). Then each label's granules are laid out in region order: the run joined to
    the previous label first, the run joined to the next label last, chosen, where
    several runs are followed by the next label, apart from the first (else the join
    is lost and the model solved again: exporter-3 took 6 solves before this choice
    and ended 2.6% above its bound). Returns the plan
    and, per run that was joined at both ends but could not be, (class, label, first
    granule, granules).
    """
    G = g.granularity
    nl = len(lab.need)
    val = [int(round(v)) for v in vals]
    succ = lab.succ
    owned: list[list[tuple[int, int]]] = [[] for _ in range(nl)]  # label -> (plane, unit)
    lab_at: dict[tuple[int, int], int] = {}
    class_of: dict[int, int] = {}
    for c, (_, units, idx) in enumerate(m.classes):
        class_of.update({p: c for p in idx})
        cur: list[int] = []
        joined_in: list[bool] = [False] * len(idx)
        run_len: list[int] = [0] * len(idx)
        for u in range(units):
            want = {_FREE: val[m.z[(c, u)]]}
            for l_ in m.at[(c, u)]:
                if val[m.x[(c, u, l_)]]:
                    want[l_] = val[m.x[(c, u, l_)]]
            nxt: list[int | None] = [None] * len(idx)
            if u > 0:
                by_label: dict[int, list[int]] = {}
                for i, a in enumerate(cur):
                    by_label.setdefault(a, []).append(i)
                for a, planes in by_label.items():
                    moves = [_FREE] if a == _FREE else [succ[a], a]
                    # planes whose run may end here first: not joined in, or whole
                    planes.sort(key=lambda i: joined_in[i] and run_len[i] < lab.need[a])
                    for b in moves:
                        fc = m.f.get((c, u - 1, a, b))
                        if fc is None:
                            continue
                        for i in planes:
                            if nxt[i] is None and val[fc] > 0 and want.get(b, 0) > 0:
                                val[fc] -= 1
                                want[b] -= 1
                                nxt[i] = b
            rest = [l_ for l_, n in sorted(want.items()) for _ in range(n)]
            for i in range(len(idx)):
                if nxt[i] is None:
                    nxt[i] = rest.pop()
            for i in range(len(idx)):
                b = int(nxt[i])  # type: ignore[arg-type]
                if u > 0 and b == cur[i] and b != _FREE:
                    run_len[i] += 1
                else:
                    joined_in[i] = u > 0 and b != _FREE and cur[i] != _FREE \
                        and b == succ[cur[i]]
                    run_len[i] = 1
            cur = [int(x) for x in nxt]  # type: ignore[arg-type]
            for i, l_ in enumerate(cur):
                if l_ != _FREE:
                    owned[l_].append((idx[i], u))
                    lab_at[(idx[i], u)] = l_
    names = [p.name for p in g.planes]
    placed: dict[tuple[int, int], tuple[str, int]] = {}  # plane granule -> region granule
    out: list[Allocation] = []
    lost: list[tuple[int, int, int, int]] = []
    for l_ in range(nl):
        runs = _runs(owned[l_])
        region, start = lab.region[l_], lab.first[l_]
        first = next((r for r in runs if placed.get((r[0], r[1] - 1)) == (region, start - 1)),
                     None)
        # the run joined to the next label: where several may be, one that is not also
        # the first (a run cannot be both while the label has more runs), and then one
        # whose next run is not itself joined onward (so the next label keeps a choice)
        cands = [r for r in runs if _leads_on(lab, lab_at, r[0], r[1] + r[2], l_)]
        last = min(cands, key=lambda r: (r == first and len(runs) > 1,
                                         _chains_on(lab, lab_at, r[0], r[1] + r[2])),
                   default=None)
        if first is not None and first == last and len(runs) > 1:
            lost.append((class_of[first[0]], l_, first[1], first[2]))
            last = None
        order = ([first] if first else []) + [r for r in runs if r not in (first, last)] \
            + ([last] if last and last != first else [])
        j = start
        for p, u, n in order:
            for d in range(n):
                placed[(p, u + d)] = (region, j)
                out.append(Allocation(names[p], (u + d) * G, G, region, j * G))
                j += 1
    return finish_plan(g, label, out, notes=("exact model (HiGHS)",)), lost


def _leads_on(lab: Labels, lab_at: dict[tuple[int, int], int], p: int, u: int,
              l_: int) -> bool:
    """Whether plane granule (p, u) holds the label just after ``l_``."""
    nxt = lab_at.get((p, u))
    return nxt is not None and nxt != l_ and lab.pred[nxt] == l_


def _chains_on(lab: Labels, lab_at: dict[tuple[int, int], int], p: int, u: int) -> bool:
    """Whether the run of plane ``p`` starting at granule ``u`` is followed, in the
    same plane, by the next label's granule (a candidate to join onward)."""
    l_ = lab_at.get((p, u))
    if l_ is None:
        return False
    while lab_at.get((p, u)) == l_:
        u += 1
    return _leads_on(lab, lab_at, p, u, l_)


def _runs(units: list[tuple[int, int]]) -> list[tuple[int, int, int]]:
    out: list[list[int]] = []
    for p, u in sorted(units):
        if out and out[-1][0] == p and out[-1][1] + out[-1][2] == u:
            out[-1][2] += 1
        else:
            out.append([p, u, 1])
    return [(p, u, n) for p, u, n in out]


def _cut_lost(h: "highspy.Highs", m: _Model, lab: Labels,
              lost: Iterable[tuple[int, int, int, int]]) -> bool:
    """Add to ``h`` the rows that cut off each lost join's pattern (class, label, first
    granule, granules); False when one of them is a restriction (no valid cut for its
    window), after which the solver's dual bounds no longer hold for every plan.

    The one-run cuts of a class of several planes hold for every plan. The cut of a
    single-plane class holds for some optimal plan, not for every plan: a plan whose one
    plane holds the label on the whole window as two plane-adjacent runs, the first of
    the row's layout joined in and the last joined out, breaks it. Merging those two runs
    and dropping the out-join gives a plan of the same count that keeps it (and adds no
    pattern elsewhere: only a join out is dropped), so the model's optimum, and so every
    later dual bound, is still a bound on the optimum."""
    import highspy
    import numpy as np

    inf = highspy.kHighsInf
    valid = True
    for c, l_, u, k in lost:
        mult = len(m.classes[c][2])
        f_in = m.f[(c, u - 1, lab.pred[l_], l_)]
        f_out = m.f[(c, u + k - 1, l_, lab.succ[l_])]
        cuts = [] if mult == 1 else _one_run_cuts(m, lab, {(c, l_, u, u + k - 1)})
        if mult == 1:  # holds for an optimal plan (docstring): one plane, whole pattern
            ents = [(f_in, 1.0), (f_out, 1.0)] + [(m.x[(c, t, l_)], 1.0)
                                                  for t in range(u, u + k)]
            h.addRow(-inf, float(k + 1), len(ents), np.array([e[0] for e in ents],
                     dtype=np.int32), np.array([e[1] for e in ents]))
        elif cuts:  # valid for every plan (the one-run cuts of this window)
            for ents in cuts:
                h.addRow(-inf, 1.0, len(ents), np.array([e[0] for e in ents],
                         dtype=np.int32), np.array([e[1] for e in ents]))
        else:  # a restriction: later bounds no longer hold for every plan
            valid = False
            h.addRow(-inf, 1.0, 2, np.array([f_in, f_out], dtype=np.int32),
                     np.array([1.0, 1.0]))
    return valid


_REPAIR_REACH = 2
"""Labels on either side of a lost join that its repair may change (see :func:`_repair`)."""
_REPAIR_NODES = 50
"""Branch-and-bound nodes of one repair solve (a count: the plan stays a function of
the geometry)."""
REPAIR_ROUNDS = 4
"""Repairs after one solve at most. A repaired plan may lose joins of its own (a model
without its pass-through cuts allows the pattern anywhere): they are cut off and
repaired in turn, while each repair lowers the best plan."""


def _repair(h: "highspy.Highs", m: _Model, lab: Labels, vals: Sequence[float],
            lost: Iterable[tuple[int, int, int, int]], checks: list[int],
            node_limit: int | None = None, deadline: float | None = None
            ) -> list[float] | None:
    """Column values of a solution that keeps ``vals`` everywhere but near the lost
    joins (the granules that labels within :data:`_REPAIR_REACH` of a lost join's label
    may take, and the joins touching them), solved with the cuts just added; None when
    that neighbourhood has no solution within the limits (:data:`_REPAIR_NODES`, or
    ``node_limit`` when smaller, and the solve's check limit). The bounds and node limit
    of ``h`` are restored; ``checks`` holds the repair's checks afterwards.

    Why: a solve whose extracted plan lost a join has usually proven a bound the plan
    misses by that one join (both published examples: 1,312 against 1,311; exporter-9:
    1,059 against 1,058), and the join is found by a local change (the pass-through moved
    to another plane). Solving that neighbourhood takes about 0.03 s where solving the
    whole model again took 1.1 s. A restricted solve proves nothing: its dual bound is
    neither read nor reported as progress.

    Raises
    ------
    PlanError
        When the repair ran past :data:`SAFETY_SECONDS` (as a whole solve does: a plan
        never depends on the host's speed); under a ``deadline`` the repair that
        reaches it finds nothing (None)."""
    import numpy as np

    near: set[int] = set()
    for _, l_, _, _ in lost:
        a = b = l_
        for _ in range(_REPAIR_REACH):
            a = lab.pred[a] if lab.pred[a] >= 0 else a
            b = lab.succ[b] if lab.succ[b] >= 0 else b
        while True:
            near.add(a)
            if a == b:
                break
            a = lab.succ[a]
    grans = {k for k, ls in m.at.items() if not near.isdisjoint(ls)}
    free: set[int] = set()
    for c, u in grans:
        free.add(m.z[(c, u)])
        free.update(m.x[(c, u, l_)] for l_ in m.at[(c, u)])
    free.update(col for (c, u, _, _), col in m.f.items()
                if (c, u) in grans or (c, u + 1) in grans)
    n = len(m.lower)
    every = np.arange(n, dtype=np.int32)
    lower, upper = np.array(m.lower, dtype=np.float64), np.array(m.upper, dtype=np.float64)
    lo = np.clip(np.round(np.asarray(vals, dtype=np.float64)), lower, upper)
    hi = lo.copy()
    idx = np.fromiter(sorted(free), dtype=np.int64, count=len(free))
    lo[idx], hi[idx] = lower[idx], upper[idx]
    nodes = h.getOptionValue("mip_max_nodes")
    nodes = nodes[1] if isinstance(nodes, tuple) else nodes
    h.changeColsBounds(n, every, lo, hi)
    h.setOptionValue("mip_max_nodes", _REPAIR_NODES if node_limit is None
                     else min(int(node_limit), _REPAIR_NODES))
    checks[0], checks[1] = 0, 0
    try:
        arm_clock(h, deadline)
        h.run()
        if out_of_time(h, deadline, "one exact repair solve"):
            return None
        found = h.getInfo().primal_solution_status == 2
        return list(h.getSolution().col_value) if found else None
    finally:
        h.changeColsBounds(n, every, lower, upper)
        h.setOptionValue("mip_max_nodes", nodes)
        checks[1] = 1


def _set_start(h: "highspy.Highs", g: Geometry, m: _Model, lab, plan: PhysicalPlan
               ) -> bool:
    """Give the solver ``plan`` as its incumbent; False when the plan has no values in
    this model (it is then not a start)."""
    import highspy

    vals = _start_values(g, m, lab, plan)
    if vals is None:
        return False
    sol = highspy.HighsSolution()
    sol.col_value = vals
    sol.value_valid = True
    h.setSolution(sol)
    return True


def _cost(plan: PhysicalPlan, plane_cost: float, region_cost: dict[str, float]) -> float:
    return sum(plane_cost + (region_cost.get(a.region, 0.0) if a.region else 0.0)
               for a in plan.allocations)


@gc_paused()
def exact_plan(g: Geometry, *, start: PhysicalPlan | None = None, plane_cost: int = 1,
               region_cost: dict[str, int] | None = None, label: str = "exact",
               node_limit: int | None = DEFAULT_NODE_LIMIT,
               max_nonzeros: int | None = DEFAULT_MAX_NONZEROS,
               max_solves: int = DEFAULT_MAX_SOLVES,
               max_checks: int | None = DEFAULT_MAX_CHECKS,
               max_windowed_nonzeros: int | None = DEFAULT_MAX_WINDOWED_NONZEROS,
               max_gap: float = DEFAULT_MAX_GAP,
               options: Mapping[str, object] | None = None,
               progress: Callable[[str], None] | None = None,
               lower_bound: Callable[[], int] | None = None,
               time_limit: float | None = None) -> ExactResult:
    """The best plan HiGHS finds within deterministic work limits, with its proof.

    The result is a pure function of ``g`` and the arguments: every limit is a count
    (nodes per solve, solves, model size), never a clock, unless ``time_limit`` is
    given.

    Parameters
    ----------
    start
        A contract-keeping plan (the reference rule's or the heuristic packer's): the
        solver's warm start, and the plan returned when the solver finds nothing
        better within its limits.
    plane_cost, region_cost
        Cost of an allocation (``plane_cost``), plus ``region_cost[R]`` when it is
        aliased into region R. The default counts allocations; driver handles are
        ``plane_cost`` = plane grants and ``region_cost[R]`` = alias grants.
    node_limit
        Branch-and-bound nodes HiGHS may explore per solve (None: no limit).
    max_solves
        Solves of the whole model in all: after a solve whose plan lost a join, the
        pattern is cut off (by valid cuts where there are any, else forbidden), the
        neighbourhood of the lost join is re-solved (a *repair*: at most 50 nodes,
        or ``node_limit`` when smaller, and ``max_checks``; again for the repaired
        plan's own lost joins while each repair lowers the plan, up to
        :data:`REPAIR_ROUNDS`; counted in the result's ``model["repairs"]``, not
        here) and, when the plan still misses the bound,
        the model is solved again, up to this many times.
    max_checks
        HiGHS limit checks per solve (None: no limit), see :data:`DEFAULT_MAX_CHECKS`:
        the solve stops there with its best plan and its dual bound so far.
    max_gap
        A solve of the whole model stops at the first limit check where its kept plan
        is proven optimal or within this fraction of the dual bound (rounded up), see
        :data:`DEFAULT_MAX_GAP` and :func:`within_gap`; no repair or further solve is
        made for such a plan. 0: solve on to the proof or a work limit.
    options
        Extra HiGHS options (name -> value), set after the defaults. For measuring
        (``bench_plan.py --highs``): the planner passes none, and options that make
        the plan depend on the host (a ``time_limit``) break determinism.
    lower_bound
        A lower bound on the allocations of every plan (the planner passes the
        combinatorial bound), asked for only before a model is solved in windows:
        when ``start`` meets it, ``start`` is returned as optimal (``source``
        "start", ``status`` says so) without solving. Why: the windows of a large
        model can take minutes where the bound takes a second and proves the start
        (a 2-chunk layout at G = 96 bytes: the reference rule is optimal at 6, and
        the windows ran for over 5 minutes).
    max_nonzeros
        Models with more matrix nonzeros are not solved at once: they are solved in
        windows (:mod:`kvgrant.layout.windows`; ``source`` "windows", no proof) up to
        ``max_windowed_nonzeros`` (None: any size), else not at all (``source``
        "start", ``status`` says why): see :data:`DEFAULT_MAX_NONZEROS`.
    time_limit
        Wall seconds for the whole call (None: none, and the :data:`SAFETY_SECONDS`
        net per solve raises). When they run out, the best plan so far (at worst
        ``start``) is returned with the best dual bound so far and ``model["timed_out"]``
        = 1; windows that run out give no windowed plan. Such a plan depends on the
        host's speed: for ``kvgrant plan --time-limit``, whose plan file every rank
        then reads, never for ranks that plan for themselves.

    Returns
    -------
    ExactResult
        ``optimal`` when the plan's cost equals the solver's dual bound (the proof);
        otherwise ``gap`` says how far from optimal the plan may be.

    Raises
    ------
    PlanError
        When no plan exists (no start and no solver solution), or a solve ran past
        :data:`SAFETY_SECONDS` without a ``time_limit`` (a broken host, never a plan
        that depends on it).
    """
    t0 = time.perf_counter()
    deadline = None if time_limit is None else t0 + time_limit
    rc = {k: float(v) for k, v in (region_cost or {}).items()}
    if start is not None and plane_cost == 1 and not any(rc.values()):
        floor = _floor(g)
        if len(start.allocations) <= floor:  # nothing to solve: the start is optimal
            plan = PhysicalPlan(label, g, start.allocations, start.notes)
            return ExactResult(plan, floor, floor, True, time.perf_counter() - t0,
                               "Optimal (start meets the trivial bound)", "start")
    # a model too large for any solve is refused before it is built (its label
    # columns are counted from the eligible granule ranges, in well under a second)
    least = _least_nonzeros(g)
    if max_nonzeros is not None and max_windowed_nonzeros is not None \
            and least > max_windowed_nonzeros:
        return _too_large(g, start, label, plane_cost, rc, t0, least,
                          max_windowed_nonzeros, progress, "not built")
    # the coverage rows are counted first and built only when the model is solved
    # (at once or in windows): a refused model is never built whole
    try:
        m, lab = _build(g, float(plane_cost), rc, cover=False, budget=(
            max_windowed_nonzeros if max_nonzeros is not None else None))
    except _OverBudget as over:
        return _too_large(g, start, label, plane_cost, rc, t0, over.nonzeros,
                          max_windowed_nonzeros, progress, "built in part")
    m.budget = None
    pending = _cover_count(g, m, lab)
    if pending is None or not pending.complete:
        _add_cover_rows(g, m, lab)  # (raises PlanError when coverage is incomplete)
        pending = None
    n = len(m.lower)
    nnz = m.nonzeros + (pending.nonzeros if pending else 0)
    if m.cuts_left_out or (max_nonzeros is not None and nnz > max_nonzeros
                           and m.cut_nonzeros and nnz - m.cut_nonzeros <= max_nonzeros):
        # the pass-through cuts put the model over a limit (the budget it was built
        # under, or one solve's): solved whole without them (a lost join is
        # repaired) when that fits one solve and its LP relaxation is quick, else
        # left as it was (refused when the cuts passed the budget; else its windows)
        free = nnz - m.cut_nonzeros
        if progress:
            progress("exact model: over a size limit with its pass-through cuts, "
                     f"{free:,} nonzeros without them")
        cover = None
        if pending is not None and (max_nonzeros is None or free <= max_nonzeros):
            cover = _Model(m.classes)  # built once: for the LP, then for the solve
            pending.add_rows(cover)
        quick = (max_nonzeros is None or free <= max_nonzeros) and \
            _lp_ends_within(m, cover, MAX_CUT_FREE_LP_ITERATIONS)
        if quick:
            if progress:
                progress("exact model: solved whole without its pass-through cuts")
            nnz = free
            _drop_pass_through_cuts(m)
            if cover is not None:
                m.extend(cover)
                pending = None
        elif m.cuts_left_out:
            return _too_large(g, start, label, plane_cost, rc, t0, m.budget_passed_at,
                              max_windowed_nonzeros, progress, "built in part")
        elif progress:
            progress(f"exact model: without its cuts, its LP relaxation needs over "
                     f"{MAX_CUT_FREE_LP_ITERATIONS:,} simplex iterations; kept whole")
    size = {"columns": n, "rows": len(m.rows) + (pending.rows if pending else 0),
            "nonzeros": nnz, "classes": len(m.classes),
            "labels": len(lab.need), "rounds": 0}
    if m.cuts_left_out:
        size["pass_through_cuts_left_out"] = 1
    if max_nonzeros is not None and nnz > max_nonzeros:
        if max_windowed_nonzeros is None or nnz <= max_windowed_nonzeros:
            if (lower_bound is not None and start is not None and plane_cost == 1
                    and not any(rc.values())):
                if progress:
                    progress(f"exact model: {nnz:,} nonzeros, over the {max_nonzeros:,} "
                             "limit for one solve; the combinatorial lower bound first")
                floor = lower_bound()
                if len(start.allocations) <= floor:
                    plan = PhysicalPlan(label, g, start.allocations, start.notes)
                    return ExactResult(plan, floor, floor, True, time.perf_counter() - t0,
                                       "Optimal (start meets the combinatorial bound; "
                                       "not solved)", "start", size)
            if progress:
                progress(f"exact model: {nnz:,} nonzeros, over the {max_nonzeros:,} limit "
                         "for one solve; solving it in windows")
            refused = None
            if pending is not None:
                from kvgrant.layout.windows import first_window_refusal

                refused = first_window_refusal(m, len(lab.need), g.granularity,
                                               pending.kept_by, DEFAULT_MAX_NONZEROS)
                if refused is None:
                    pending.add_rows(m)
                    pending = None
            if refused is not None:
                won = None
                if progress:
                    progress(f"windows: {refused}")
            else:
                won = _windowed(g, m, lab, label, start, plane_cost, rc, node_limit,
                                progress, deadline)
                if won is None and deadline is not None and time.perf_counter() >= deadline:
                    size["timed_out"] = 1
            if won is not None:
                plan, cost, note = won
                floor = _floor(g) if plane_cost == 1 and not any(rc.values()) else 0
                size.update(note)
                if progress and nnz <= WINDOWS_LP_MAX_NONZEROS:
                    progress("windows: the whole model's LP relaxation, for a bound")
                relaxed = _lp_bound(m, WINDOWS_LP_ITERATIONS, deadline) \
                    if nnz <= WINDOWS_LP_MAX_NONZEROS else None
                if relaxed is not None:
                    size["lp_bound"] = relaxed
                    floor = max(floor, relaxed)
                return ExactResult(plan, int(cost), min(floor, int(cost)), cost <= floor,
                                   time.perf_counter() - t0,
                                   f"Solved in windows (model over {max_nonzeros:,} "
                                   "nonzeros); bound from the LP relaxation"
                                   if relaxed is not None else
                                   f"Solved in windows (model over {max_nonzeros:,} "
                                   "nonzeros); no proof", "windows", size)
        if start is None:
            raise PlanError(f"geometry {g.name!r}: the exact model has {nnz:,} nonzeros "
                            f"(limit {max_nonzeros:,}) and no start plan was given")
        if progress:
            progress(f"exact model: {nnz:,} nonzeros, over the {max_nonzeros:,} limit; "
                     "not solved")
        why = ("the time limit ran out in its windows" if size.get("timed_out")
               else f"model over {max_nonzeros:,} nonzeros")
        return _unsolved(g, start, label, plane_cost, rc, t0, f"Not solved ({why})", size)
    if pending is not None:
        pending.add_rows(m)
    h = _mip(m.cost, m.lower, m.upper, m.rows_lo, m.rows_hi, *_csr(m.rows),
             node_limit, options)
    checks = _count_checks(h, max_checks, progress)
    start_cost = None
    if start is not None and _set_start(h, g, m, lab, start):
        start_cost = _cost(start, plane_cost, rc)
    polish = _Polisher(g, m, lab, label, float(plane_cost), rc, checks, start_cost, h,
                       max_gap)
    if progress:
        progress(f"exact model: {n:,} columns, {len(m.rows):,} rows, "
                 f"{len(m.classes)} plane classes; solving with HiGHS")
    bound_valid = True
    dual = -float("inf")
    best, best_cost, source = start, start_cost, "start"
    rounds = 0
    while True:
        rounds += 1
        checks[0] = 0
        arm_clock(h, deadline)
        h.run()
        size["checks"] = size.get("checks", 0) + checks[0]
        timed_out = out_of_time(h, deadline, f"geometry {g.name!r}: one exact solve "
                                f"({nnz:,} nonzeros)")
        if timed_out:
            size["timed_out"] = 1
        status = h.modelStatusToString(h.getModelStatus())
        info = h.getInfo()
        if bound_valid and info.mip_dual_bound == info.mip_dual_bound:
            dual = max(dual, info.mip_dual_bound)
        if info.primal_solution_status != 2:  # no feasible solution
            break
        vals = h.getSolution().col_value
        cand, lost = _extract(g, m, lab, vals, label)
        if not check_contract(g, cand):
            c = _cost(cand, plane_cost, rc)
            if best_cost is None or c < best_cost:
                best, best_cost, source = cand, c, "solver"
        best, best_cost, source = polish.better(best, best_cost, source)
        interrupted = timed_out or (max_checks is not None and checks[0] > max_checks)
        if not lost or best_cost is None or within_gap(best_cost, _ceil(dual), max_gap):
            break
        # a run joined at both ends of a row that has more runs: cut that pattern off,
        # then look for the lost join near it (a small solve of its own limits, also
        # after the last or an interrupted solve) before solving the whole model again
        for _ in range(REPAIR_ROUNDS):
            bound_valid = _cut_lost(h, m, lab, lost) and bound_valid
            polish.bound_valid = bound_valid
            repaired = _repair(h, m, lab, vals, lost, checks, node_limit, deadline)
            size["repairs"] = size.get("repairs", 0) + 1
            size["repair_checks"] = size.get("repair_checks", 0) + checks[0]
            if repaired is None:
                break
            cand, lost = _extract(g, m, lab, repaired, label)
            c = _cost(cand, plane_cost, rc)
            if c >= best_cost or check_contract(g, cand):
                break
            best, best_cost, source = cand, c, "solver"
            if not lost or within_gap(best_cost, _ceil(dual), max_gap):
                break
            vals = repaired  # its own lost joins: cut off and repaired in turn
        best, best_cost, source = polish.better(best, best_cost, source)
        if within_gap(best_cost, _ceil(dual), max_gap) or rounds >= max_solves \
                or interrupted:
            break  # (an interrupted solve is not repeated: its check limit is spent)
        if best is not None:
            _set_start(h, g, m, lab, best)
    if best is None:
        raise PlanError(f"geometry {g.name!r}: the exact model found no plan within its "
                        f"work limits and no start plan was given ({status})")
    if best.label != label:
        best = PhysicalPlan(label, g, best.allocations, best.notes)
    bound = min(_ceil(dual), int(best_cost))
    size["rounds"] = rounds
    size["polished"] = polish.seen
    return ExactResult(best, int(best_cost), bound, int(best_cost) <= bound,
                       time.perf_counter() - t0, status, source, size)


def _windowed(g: Geometry, m: _Model, lab: Labels, label: str, start: PhysicalPlan | None,
              plane_cost: int, rc: dict[str, float], node_limit: int | None,
              progress: Callable[[str], None] | None, deadline: float | None = None
              ) -> tuple[PhysicalPlan, float, dict[str, int]] | None:
    """The model solved window by window: (plan, cost, window counts) when that gives
    a contract-keeping plan cheaper than ``start``, else None (also when ``deadline``
    passes before the last window)."""
    from kvgrant.layout.windows import solve_windows

    res = solve_windows(m, lab.need, g.granularity, node_limit=node_limit,
                        max_window_nonzeros=DEFAULT_MAX_NONZEROS, progress=progress,
                        deadline=deadline)
    if res.values is None:
        if progress:
            progress(f"windows: {res.status}")
        return None
    plan, _lost = _extract(g, m, lab, res.values, label)
    if check_contract(g, plan):  # pragma: no cover - the extraction of any point of the
        return None              # model keeps the contract (checked all the same)
    cost = _cost(plan, plane_cost, rc)
    if start is not None and _cost(start, plane_cost, rc) <= cost:
        return None
    return plan, cost, {"windows": res.windows, "window_merges": res.merges,
                        "largest_window_nonzeros": max(res.sizes, default=0)}


def _too_large(g: Geometry, start: PhysicalPlan | None, label: str, plane_cost: int,
               rc: dict[str, float], t0: float, least: int, limit: int | None,
               progress: Callable[[str], None] | None, what: str) -> ExactResult:
    """``start`` for a model of at least ``least`` nonzeros, over ``limit`` even in
    windows (counted before it was built, or while building it)."""
    if start is None:
        raise PlanError(f"geometry {g.name!r}: the exact model has at least {least:,} "
                        f"nonzeros (limit {limit:,}) and no start plan was given")
    if progress:
        progress(f"exact model: at least {least:,} nonzeros, over the {limit:,} limit "
                 f"even in windows; {what}")
    return _unsolved(g, start, label, plane_cost, rc, t0, f"Not solved (model of at "
                     f"least {least:,} nonzeros, over {limit:,})", {"nonzeros": least})


def _unsolved(g: Geometry, start: PhysicalPlan, label: str, plane_cost: int,
              rc: dict[str, float], t0: float, status: str,
              size: dict[str, int]) -> ExactResult:
    """``start`` as the result of a model that was not solved (too large): its cost,
    and the trivial floor as the bound when the cost counts allocations."""
    floor = _floor(g) if plane_cost == 1 and not any(rc.values()) else 0
    cost = _cost(start, plane_cost, rc)
    plan = PhysicalPlan(label, g, start.allocations, start.notes)
    return ExactResult(plan, int(cost), min(floor, int(cost)), cost <= floor,
                       time.perf_counter() - t0, status, "start", size)


def _floor(g: Geometry) -> int:
    """Allocations every plan needs: one per plane, and one aliased per region plus
    one non-aliased when the planes hold more granules than the regions."""
    spare = sum(g.plane_bytes(p.name) for p in g.planes) > \
        sum(g.region_bytes(r.name) for r in g.regions)
    return max(len(g.planes), len(g.regions) + spare)


def _ceil(x: float) -> int:
    """A solver's dual bound rounded up to whole cost (0 when there is none)."""
    if x != x or abs(x) == float("inf"):
        return 0
    return int(-(-(x - 1e-6) // 1))
