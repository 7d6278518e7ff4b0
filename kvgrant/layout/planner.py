"""The packed plan: the exact planner first, the heuristic packer as the fallback.

Why: the exact model (:mod:`kvgrant.layout.exact`) proves its plan optimal on the
published layouts in about a second of CPU, but the solver may stop at its work
limits on some layout; then the heuristic packer (:mod:`kvgrant.layout.packer`)
runs too and the better plan is kept, with the solver's dual bound saying how far
from optimal it may be; when the packer's plan is the better one, the model is solved
once more from it (the solver's search had started from a worse plan); a plan still 1%
or more above the bound after that goes to the neighbourhood search
(:mod:`kvgrant.layout.neighbourhood`: windows of a few labels solved exactly around
it, the rest of the plan fixed). A model over
the size limit of one solve is solved window by window (:mod:`kvgrant.layout.windows`),
and the heuristic only runs when that finds no plan. The solver's warm start is the reference rule's plan, or the
contiguous plan (:mod:`kvgrant.layout.contiguous`: each region in one run of one plane)
or the chain plan (:mod:`kvgrant.layout.chains`: each region in a few runs, one shift
each) when that needs fewer allocations, so the packed plan never needs more
allocations than the reference rule.

Planning is a pure function of the geometry: every limit on the way (solver nodes,
solves, model size, the packer's exchange tries) is a count, never a clock, because
the ranks of a group plan independently, in separate processes, and must compute the
same plan whatever the host's load (an allocation size mismatch would abort the
group). The one clock is ``time_limit``, for planning once into a plan file that every
rank then reads (``kvgrant plan --time-limit``). Results are cached per process by
:func:`geometry_hash`, so ``allocate()``
(which plans before and, when pages are fitted, after fitting) never solves the same
layout twice.
"""

from __future__ import annotations

import functools
import time
from dataclasses import dataclass
from typing import Any, Callable

from kvgrant.errors import ArgumentError
from kvgrant.gc_pause import gc_paused
from kvgrant.layout import neighbourhood
from kvgrant.layout.bound import LowerBound, allocation_lower_bound
from kvgrant.layout.chains import chain_plan
from kvgrant.layout.contiguous import contiguous_plan
from kvgrant.layout.contract import check_contract
from kvgrant.layout.exact import (DEFAULT_MAX_CHECKS, DEFAULT_MAX_GAP, DEFAULT_MAX_NONZEROS,
                                  DEFAULT_MAX_SOLVES, DEFAULT_MAX_WINDOWED_NONZEROS,
                                  DEFAULT_NODE_LIMIT, ExactResult, exact_plan, within_gap)
from kvgrant.layout.geometry import Geometry, require_geometry, show_value
from kvgrant.layout.granules import eligible_pairs
from kvgrant.layout.packer import pack
from kvgrant.layout.plan import PhysicalPlan
from kvgrant.layout.planfile import geometry_hash
from kvgrant.layout.rules import reference_plan

__all__ = ["BOUND_FIRST_STARTS", "PackedResult", "geometry_hash", "plan_packed", "warm_start"]

Progress = Callable[[str], None]

MAX_HEURISTIC_PAIRS = 3_000_000
"""Most (granule, label) pairs (:func:`kvgrant.layout.granules.eligible_pairs`) of a
layout the heuristic packer is run on; past it the plan stays the solver's or the
reference rule's. A count of the geometry, never a clock. Why: the packer walks each
row's eligible granules; a layout of 2 pages and 121,000 rows at G = 64 bytes (229
million pairs) took 39 s there and planned no better than the reference rule."""


@dataclass(frozen=True)
class PackedResult:
    """The packed plan and how good it is.

    ``bound`` is a proven lower bound on allocations: the solver's dual bound, or,
    when the solver gave no proof, the larger of it and the combinatorial bound
    (:func:`kvgrant.layout.bound.allocation_lower_bound`); ``optimal`` is True when
    the plan needs exactly that many.
    """

    plan: PhysicalPlan
    bound: int
    optimal: bool
    source: str
    seconds: float
    exact: ExactResult | None
    bound_source: str = "solver"
    lower_bound: LowerBound | None = None
    """The combinatorial bound when it was computed (no proof): ``kvgrant plan``
    reports it without computing it again (12 s at 40,000 chunks)."""
    timed_out: bool = False
    """The caller's ``time_limit`` ran out before the work limits did: the plan is the
    best found in that time (it depends on the host's speed)."""
    gap_target: float | None = None
    """The ``max_gap`` whose target the plan met short of a proof, so that nothing else
    was tried (None otherwise): the verdict says so, and how to ask for the proof."""

    @property
    def gap(self) -> int:
        return len(self.plan.allocations) - self.bound

    def verdict(self) -> str:
        """"optimal" or "within N of optimal" (allocations), as ``kvgrant plan`` prints."""
        if self.optimal:
            return "optimal"
        late = " (time limit reached)" if self.timed_out else ""
        if self.bound <= 0:
            return f"optimality unknown (no solver bound){late}"
        if self.gap_target is not None:
            late += (f" (under the {self.gap_target:.2%} gap target; --max-gap 0 "
                     "solves on to the proof)")
        return f"within {self.gap:,} of optimal{late}"

    def to_json(self) -> dict[str, object]:
        return {"allocations": len(self.plan.allocations), "bound": self.bound,
                "optimal": self.optimal, "gap": self.gap, "verdict": self.verdict(),
                "source": self.source, "bound_source": self.bound_source,
                "seconds": round(self.seconds, 3), "timed_out": self.timed_out,
                "gap_target": self.gap_target,
                "solver": None if self.exact is None else self.exact.to_json()}


def plan_packed(g: Geometry, *, progress: Progress | None = None,
                node_limit: int | None = DEFAULT_NODE_LIMIT,
                max_nonzeros: int | None = DEFAULT_MAX_NONZEROS,
                max_solves: int = DEFAULT_MAX_SOLVES,
                max_checks: int | None = DEFAULT_MAX_CHECKS,
                max_windowed_nonzeros: int | None = DEFAULT_MAX_WINDOWED_NONZEROS,
                max_gap: float = DEFAULT_MAX_GAP,
                time_limit: float | None = None) -> PackedResult:
    """The packed plan of ``g`` with its optimality verdict (cached per layout).

    The plan depends on the geometry and the five work limits and ``max_gap`` only (see
    the module docstring and :func:`kvgrant.layout.exact.exact_plan`); ``progress``
    only receives messages. Every rank must use the same limits: the defaults, unless
    a test wants a cheaper (and equally deterministic) plan.

    ``max_gap`` (a fraction in [0, 1), default 1%): the solver stops once its plan is
    proven within that of optimal, and such a plan is taken as it is (no heuristic
    packer, no second solve); 0 asks for the proof.

    ``time_limit`` (wall seconds, None: none) is for planning once into a plan file
    (``kvgrant plan --time-limit S --json``): when it runs out first, the result is
    the best plan found so far with its gap (``timed_out``), which depends on the
    host's speed, so ranks that plan for themselves (``allocate()``) never pass one.
    The reference rule, the combinatorial bound (for the gap) and the report are not
    limited by it; the solver, the heuristic packer and the neighbourhood search stop
    at it.
    """
    _check_plan_args(g, progress, node_limit=node_limit, max_nonzeros=max_nonzeros,
                     max_solves=max_solves, max_checks=max_checks,
                     max_windowed_nonzeros=max_windowed_nonzeros)
    _check_max_gap(max_gap)
    _check_time_limit(time_limit)
    res = _cached(_Keyed(geometry_hash(g), g, progress), node_limit, max_nonzeros,
                  max_solves, max_checks, max_windowed_nonzeros, float(max_gap), time_limit)
    if res.plan.geometry is g:
        return res
    plan = PhysicalPlan(res.plan.label, g, res.plan.allocations, res.plan.notes)
    return PackedResult(plan, res.bound, res.optimal, res.source, res.seconds, res.exact,
                        res.bound_source, res.lower_bound, res.timed_out, res.gap_target)


MAX_TIME_LIMIT = 86_400.0
"""The largest ``time_limit`` (a day): past it the limit is no limit in practice, and a
typo (``3600000``) is caught."""


def _check_time_limit(value: Any) -> None:
    """An ArgumentError naming ``time_limit`` unless it is None or a finite number of
    seconds in (0, :data:`MAX_TIME_LIMIT`]."""
    if value is None:
        return
    ok = isinstance(value, (int, float)) and not isinstance(value, bool) \
        and value == value and 0 < value <= MAX_TIME_LIMIT
    if not ok:
        raise ArgumentError(f"plan_packed: time_limit = {show_value(value)}: must be None "
                            f"(no limit) or wall seconds > 0 and <= {MAX_TIME_LIMIT:,.0f}",
                            argument="time_limit", value=value)


def _check_max_gap(value: Any) -> None:
    """An ArgumentError naming ``max_gap`` unless it is a number in [0, 1)."""
    ok = isinstance(value, (int, float)) and not isinstance(value, bool) \
        and 0 <= value < 1
    if not ok:
        raise ArgumentError(f"plan_packed: max_gap = {show_value(value)}: must be a fraction "
                            ">= 0 and < 1 of the plan (0: prove optimality; 0.01: stop "
                            "within 1%)", argument="max_gap", value=value)


def _check_plan_args(g: Any, progress: Any, **limits: Any) -> None:
    """An ArgumentError naming the argument for what the solver would choke on deep
    inside (a path for ``g``, ``node_limit="x"``, ``progress=1``) or silently take
    (``node_limit=-1``, ``max_checks=nan``, ``max_solves=1.5``)."""
    require_geometry(g, "plan_packed")
    if progress is not None and not callable(progress):
        raise ArgumentError(f"plan_packed: progress = {show_value(progress)}: must be None "
                            "or a callable taking one message", argument="progress",
                            value=progress)
    for name, value in limits.items():
        least = 1 if name == "max_solves" else 0
        if (value is None and name != "max_solves") or (
                isinstance(value, int) and not isinstance(value, bool) and value >= least):
            continue
        none = "" if name == "max_solves" else "None (no limit) or "
        raise ArgumentError(f"plan_packed: {name} = {show_value(value)}: must be {none}an "
                            f"integer >= {least}", argument=name, value=value)


class _Keyed:
    """A geometry that compares and hashes by its :func:`geometry_hash` only (the
    progress callback rides along for a cache miss and is no part of the key)."""

    __slots__ = ("key", "g", "progress")

    def __init__(self, key: str, g: Geometry, progress: Progress | None = None) -> None:
        self.key, self.g, self.progress = key, g, progress

    def __hash__(self) -> int:
        return hash(self.key)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, _Keyed) and other.key == self.key


@functools.lru_cache(maxsize=8)
def _cached(k: _Keyed, node_limit: int | None, max_nonzeros: int | None,
            max_solves: int, max_checks: int | None,
            max_windowed_nonzeros: int | None, max_gap: float,
            time_limit: float | None) -> PackedResult:
    """Memo of :func:`_solve` by geometry hash and limits."""
    return _solve(k.g, k.progress, node_limit, max_nonzeros, max_solves, max_checks,
                  max_windowed_nonzeros, time_limit, max_gap)


def _better_heuristic(g: Geometry, best: PhysicalPlan, progress: Progress | None,
                      deadline: float | None = None) -> PhysicalPlan | None:
    """The heuristic packer's plan when it keeps the contract with fewer allocations
    than ``best``, else None."""
    pairs = eligible_pairs(g)
    if pairs > MAX_HEURISTIC_PAIRS:
        if progress:
            progress(f"solver gave no proof; the layout has {pairs:,} (granule, label) "
                     f"pairs, over the heuristic packer's {MAX_HEURISTIC_PAIRS:,}")
        return None
    if deadline is not None and time.perf_counter() >= deadline:
        if progress:
            progress("solver gave no proof; the time limit ran out before the heuristic "
                     "packer")
        return None
    if progress:
        progress("solver gave no proof within its work limits; running the heuristic "
                 "packer too")
    heur = pack(g, deadline)
    if not check_contract(g, heur) and len(heur.allocations) < len(best.allocations):
        return heur
    return None


#: Warm starts whose plan is checked against the combinatorial bound before any solve:
#: they are built from the same facts as its parts (one shift per region, or the
#: chains of bound (E)), so they meet it often, and a solve of their layouts is slow.
BOUND_FIRST_STARTS = frozenset({"contiguous", "chains"})


def warm_start(g: Geometry) -> tuple[PhysicalPlan, str]:
    """The solver's start and its name: the reference rule's plan, or the contiguous
    plan (each region in one run of one plane; better on a few chunks over large
    planes), or the chain plan (each region in a few runs at one shift each; better
    where rows drift against their declared pages), whichever needs the fewest
    allocations (the earlier on a tie). ``bench_plan.py`` starts from the same."""
    best, name = reference_plan(g), "reference"
    for other, other_name in ((contiguous_plan(g), "contiguous"), (chain_plan(g), "chains")):
        if other is not None and len(other.allocations) < len(best.allocations):
            best, name = other, other_name
    return best, name


@gc_paused()
def _solve(g: Geometry, progress: Progress | None, node_limit: int | None,
           max_nonzeros: int | None, max_solves: int = DEFAULT_MAX_SOLVES,
           max_checks: int | None = DEFAULT_MAX_CHECKS,
           max_windowed_nonzeros: int | None = DEFAULT_MAX_WINDOWED_NONZEROS,
           time_limit: float | None = None, max_gap: float = DEFAULT_MAX_GAP) -> PackedResult:
    t0 = time.perf_counter()
    deadline = None if time_limit is None else t0 + time_limit
    start, start_name = warm_start(g)
    exact: ExactResult | None = None
    memo: list[LowerBound] = []

    def lower_bound() -> LowerBound:
        """The combinatorial bound, computed once (before windows, or for the gap)."""
        if not memo:
            memo.append(allocation_lower_bound(g))
        return memo[0]

    def solve_from(plan: PhysicalPlan) -> ExactResult:
        """The exact planner from ``plan``, with this call's limits and time left."""
        return exact_plan(g, start=plan, label="packed", progress=progress,
                          node_limit=node_limit, max_nonzeros=max_nonzeros,
                          max_solves=max_solves, max_checks=max_checks,
                          max_windowed_nonzeros=max_windowed_nonzeros, max_gap=max_gap,
                          lower_bound=lambda: lower_bound().total,
                          time_limit=None if deadline is None
                          else max(1e-3, deadline - time.perf_counter()))

    if start_name in BOUND_FIRST_STARTS and len(start.allocations) <= lower_bound().total:
        # a few regions that each fit one run, or a few chains: the bound is cheap here
        # and often proves the start (odd-36: 42 allocations, which the solver proved
        # in 24 s)
        plan = PhysicalPlan("packed", g, start.allocations,
                            (f"{start_name} plan: optimal "
                             f"({len(start.allocations):,} allocations, the combinatorial "
                             "lower bound; the model was not solved)",))
        return PackedResult(plan, len(start.allocations), True, start_name,
                            time.perf_counter() - t0, None, "combinatorial", memo[0])
    try:
        exact = solve_from(start)
    except ImportError:  # pragma: no cover - highspy is a dependency
        exact = None
    if exact is not None and exact.optimal and memo and exact.source == "start" \
            and exact.bound == memo[0].total:  # the start met the combinatorial bound
        plan = PhysicalPlan("packed", g, start.allocations,
                            (f"{start_name} plan: optimal ({exact.bound:,} allocations, the "
                             "combinatorial lower bound; the model was not solved)",))
        return PackedResult(plan, exact.bound, True, start_name, time.perf_counter() - t0,
                            exact, "combinatorial", memo[0])
    if exact is not None and exact.optimal and exact.source == "start":
        plan = PhysicalPlan("packed", g, exact.plan.allocations,
                            (f"{start_name} plan: optimal ({exact.bound:,} allocations; "
                             f"{exact.status})",))
        return PackedResult(plan, exact.bound, True, start_name, time.perf_counter() - t0,
                            exact)
    if exact is not None and exact.optimal:
        plan = PhysicalPlan("packed", g, exact.plan.allocations,
                            (f"exact: optimal ({exact.bound:,} allocations proven by "
                             "the solver's dual bound)",))
        return PackedResult(plan, exact.bound, True, "exact", time.perf_counter() - t0, exact)
    if exact is not None and exact.source in ("solver", "start") \
            and within_gap(exact.cost, exact.bound, max_gap):
        # proven within the gap target: neither the packer nor a second solve could
        # gain more than that (docs/layout.md, "The gap target")
        what = "exact" if exact.source == "solver" else start_name
        plan = PhysicalPlan("packed", g, exact.plan.allocations,
                            (f"{what}: within {exact.gap:,} of optimal ({exact.cost:,} "
                             f"allocations, the solver's dual bound {exact.bound:,}; the "
                             f"solve stops under a gap of {max_gap:.2%})",))
        return PackedResult(plan, exact.bound, False, what, time.perf_counter() - t0, exact,
                            timed_out=bool(exact.model.get("timed_out")), gap_target=max_gap)
    best = exact.plan if exact is not None else start
    if progress and not memo:
        progress("combinatorial lower bound, for the gap")
    # the combinatorial bound is sound for every plan (docs/layout.md), and the
    # solver's may be the trivial floor when the model was not solved
    lower = lower_bound()
    comb = lower.total
    timed_out = bool(exact is not None and exact.model.get("timed_out"))
    heur: PhysicalPlan | None = None
    if exact is not None and exact.source == "windows":
        # the windows beat the reference rule already; the heuristic packer would
        # cost about as much again on a model this large and planned 7.7% more at
        # 20 x the published scale (docs/layout.md, "Windows")
        source = "windows"
    else:
        # when ``best`` meets the combinatorial bound no plan has fewer allocations,
        # so the packer's plan could not be taken: it is not run (35 s at 2^20 rows)
        if len(best.allocations) > comb:
            heur = _better_heuristic(g, best, progress, deadline)
            # the packer stops at its next step past the deadline, or is not run
            timed_out = timed_out or (deadline is not None
                                      and time.perf_counter() >= deadline)
        if heur is not None:
            best, source = heur, "heuristic"
        else:
            source = "exact" if exact is not None and exact.source == "solver" else start_name
    bound = exact.bound if exact is not None else 0
    if heur is not None and exact is not None and "checks" in exact.model and not timed_out:
        # the packer beat the solver, whose search started from a worse plan: one more
        # solve of the same model from the packer's plan (exporter-2081: 416 -> 407,
        # random-153: 397 -> 347); its dual bound is a bound too
        if progress:
            progress("the heuristic packer's plan is better than the solver's; solving "
                     "again from it")
        again = solve_from(heur)
        timed_out = timed_out or bool(again.model.get("timed_out"))
        bound = max(bound, again.bound)
        if again.cost < len(best.allocations):
            best, source, exact = again.plan, "exact", again
    if exact is not None and "checks" in exact.model and not timed_out \
            and not within_gap(len(best.allocations), max(bound, comb), max_gap):
        # the whole model was solved and its plan is still 1% or more above the bound:
        # windows of a few labels, solved exactly around the plan, often lower it
        # (exporter-2081: 407 -> 376; docs/layout.md, "Neighbourhood search")
        if progress:
            progress("neighbourhood search: solving windows of labels around the plan")
        found = neighbourhood.search(g, best, bound=max(bound, comb), max_gap=max_gap,
                                     node_limit=node_limit, max_checks=max_checks,
                                     deadline=deadline, progress=progress)
        timed_out = timed_out or (deadline is not None and time.perf_counter() >= deadline)
        if found is not None and found.cost < len(best.allocations):
            best, source = found.plan, "neighbourhood"
    bound_source = "combinatorial" if comb > bound else "solver"
    bound = min(max(bound, comb), len(best.allocations))
    plan = PhysicalPlan("packed", g, best.allocations, best.notes)
    return PackedResult(plan, bound, len(plan.allocations) <= bound, source,
                        time.perf_counter() - t0, exact, bound_source, lower, timed_out)
