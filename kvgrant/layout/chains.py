"""The chain plan: each region backed by a few long runs, each at one plane shift.

Why: the contiguous plan (:mod:`kvgrant.layout.contiguous`) needs a whole region at one
shift, and the reference rule gives one allocation per declared chunk and gap. Between
them lie layouts whose rows drift against their declared pages (chunks dealt with
gaps): a region of 112 rows on one plane of 500 pages (odd-4) takes 234 allocations by
the reference rule, where a handful of runs, each holding dozens of rows at one shift,
keep the contract. The exact model finds such plans slowly or not at all (its LP is
symmetric over the shifts), so as a warm start this plan saves the solver that search,
and when it meets the combinatorial bound (E) (the same chains, :mod:`kvgrant.layout.bound`)
it is optimal without a solve. A pure function of the geometry.

Method: a run puts region granule ``j`` on plane granule ``o + j`` (shift ``o``). The
shifts a run may take are the intersection, over its granules, of the shifts that put
each on a granule its label may take (:func:`kvgrant.layout.granules.label_units`),
and, over the rows it holds whole, of the shifts at which the row touches exactly its
declared pages (the intervals of bound (E)), so every row held whole keeps the
contract by construction. Each region is cut greedily: from its first granule, the
plane and run that reach furthest with a free place in the plane, then the next run
from there. Rows split between two runs are not guaranteed to touch every page of
their set, so the finished plan goes through :func:`check_contract` and is returned
only when it keeps the contract.
"""

from __future__ import annotations

import bisect
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from kvgrant.layout.conflicts import declared_conflict_ranges
from kvgrant.layout.contiguous import Ranges, _first_free, _intersect
from kvgrant.layout.contract import check_contract
from kvgrant.layout.geometry import Geometry
from kvgrant.layout.granules import label_units, labels
from kvgrant.layout.plan import Allocation, PhysicalPlan
from kvgrant.layout.rules import finish_plan

__all__ = ["MAX_CHAIN_PLAN_WORK", "chain_plan"]

MAX_CHAIN_PLAN_WORK = 500_000
"""Most steps (ranges intersected over granules, rows held whole and plane shapes
tried, places looked for range by range, split rows' page ranges) before the search
gives up (None): a count of the geometry, never a clock, about a second of Python on
the 2-core machine at most. Every loop of the search is charged, so the steps bound
its work (a place costs a bisection per allowed range and a step per run in the way).
Measured (2026-12-04, with no cap): the plans found on odd seeds 0-149 and the 35
benchmark layouts took at most 116,352 steps (odd-49), small.json at 131,072 rows
262,210; published-dcp8 at 2^20 rows, which has none, gives up after 2,332,627 steps
(3.2 s) with no cap and after 0.9 s with this one."""


class _OverWork(Exception):
    pass


@dataclass(frozen=True)
class Rows:
    """The declared pages of one region's rows, looked up when a run reaches them (a
    list of 2^20 rows cost half a second to build for runs that end long before)."""

    conflicts: Mapping[tuple[str, int], tuple[tuple[int, int], ...]]
    region: str
    count: int

    def pages(self, k: int) -> tuple[tuple[int, int], ...]:
        return self.conflicts[(self.region, k)]


def _row_shifts(g: Geometry, bpp: int, size: int, row_bytes: int, k: int,
                pages: tuple[tuple[int, int], ...]) -> Ranges | None:
    """Shifts ``o`` (in granules) at which row ``k``, held whole by one run of a plane of
    ``bpp`` bytes per page and ``size`` bytes, touches exactly ``pages``: None when the
    row has no declared page (left unconstrained), [] when no shift does."""
    if not pages:
        return None
    if len(pages) > 1:
        return []
    G, n = g.granularity, g.pages
    (a, b), = pages
    start, end = k * row_bytes, (k + 1) * row_bytes
    lo = max(a * bpp - start, (b - 1) * bpp - end + 1)
    hi = min((a + 1) * bpp - start - 1, (size if b >= n else b * bpp) - end)
    first, last = -(-lo // G), hi // G
    return [(first, last + 1)] if first <= last else []


def _rest_shifts(g: Geometry, bpp: int, start: int, end: int, missing: tuple[int, int]
                 ) -> Ranges:
    """Shifts (in granules) at which region bytes ``[start, end)`` touch pages
    ``missing[0] .. missing[1]`` (and all between): the rest of a split row, whose
    first part (in the run before) left those pages untouched."""
    G = g.granularity
    m1, m2 = missing
    lo = m2 * bpp - end + 1  # the last byte on page m2 or later
    hi = (m1 + 1) * bpp - 1 - start  # the first byte on page m1 or earlier
    first, last = -(-lo // G), hi // G
    return [(first, last + 1)] if first <= last else []


def _reach(g: Geometry, j0: int, n: int, label_of: list[int], table: list[Ranges],
           units: int, rows: "Rows",
           bpp: int, size: int, row_bytes: int, budget: list[int],
           split: tuple[int, tuple[int, int]] | None = None
           ) -> list[tuple[int, Ranges]]:
    """How far one run from region granule ``j0`` can reach: (end granule, allowed
    shifts) each time the allowed shifts narrow, the furthest last (empty when not one
    granule fits); ``rows`` gives each row's declared pages. ``split`` is (row, pages)
    for a row that the run before ended inside, with the pages its part there did not
    touch: the rest of that row, in this run, must touch them."""
    G = g.granularity
    allowed: Ranges = [(-j0, units - j0)]
    j = j0
    r = -(-j0 * G // row_bytes)  # rows starting before the run: never held whole by it
    if split is not None:
        k, missing = split
        allowed = _intersect(allowed, _rest_shifts(g, bpp, j0 * G, (k + 1) * row_bytes,
                                                   missing))
        if not allowed:
            return []
    history: list[tuple[int, Ranges]] = []
    while j < n:
        rng = table[label_of[j]]
        budget[0] -= len(rng) + len(allowed)
        if budget[0] < 0:
            raise _OverWork
        here = _intersect(allowed, [(s - j, e - j) for s, e in rng])
        # rows whose last byte lies in granule j are now held whole
        while here and r < rows.count and ((r + 1) * row_bytes - 1) // G <= j:
            k, pages = r, rows.pages(r)
            budget[0] -= 1 + len(here)
            shifts = _row_shifts(g, bpp, size, row_bytes, k, pages)
            if shifts is not None:
                here = _intersect(here, shifts)
            r += 1
        if not here:
            break
        if here != allowed and j > j0:
            history.append((j, allowed))  # the run j0 .. j-1 may take these shifts
        allowed = here
        j += 1
    if j > j0:
        history.append((j, allowed))
    return history


def _longest_free(history: list[tuple[int, Ranges]],
                  place: Callable[[Ranges, int], int | None], floor: int, j0: int
                  ) -> tuple[int, int] | None:
    """The furthest end past ``floor`` of a run from ``j0`` with a free place, and that
    place: (end, first plane granule), or None. A shorter run allows at least the
    shifts of a longer one, and needs less room, so a place for a run means a place
    for every shorter one: bisect the entries of ``history``, then the ends between
    the last entry that fits and the next (which allow that next entry's shifts)."""
    ends = [e for e, _ in history]
    lo = bisect.bisect_right(ends, floor)
    if lo == len(history):
        return None
    at = place(history[-1][1], ends[-1])
    if at is not None:  # the furthest, as a rule free
        return ends[-1], at
    best: tuple[int, int] | None = None
    fit, top = lo - 1, len(history) - 2
    while lo <= top:
        mid = (lo + top) // 2
        at = place(history[mid][1], ends[mid])
        if at is None:
            top = mid - 1
        else:
            best, fit, lo = (ends[mid], at), mid, mid + 1
    a = max(ends[fit] if fit >= 0 else j0, floor) + 1
    b, shifts = ends[fit + 1] - 1, history[fit + 1][1]
    while a <= b:
        mid = (a + b) // 2
        at = place(shifts, mid)
        if at is None:
            b = mid - 1
        else:
            best, a = (mid, at), mid + 1
    return best


def _best_run(g: Geometry, j0: int, n: int, label_of: list[int],
              tables: dict[str, tuple[int, list[Ranges]]],
              rows: "Rows", R: int,
              budget: list[int], split: tuple[int, tuple[int, int]] | None,
              used: dict[str, Ranges]) -> tuple[int, str, int] | None:
    """The run from region granule ``j0`` that reaches furthest, over the planes, with
    a free place: (end granule, plane, first plane granule), or None. A shorter run
    allows more shifts, so the longest run with a free place is found by bisection."""
    best: tuple[int, str, int] | None = None
    reached: dict[tuple[int, int], list[tuple[int, Ranges]]] = {}
    for plane in g.planes:
        units, table = tables[plane.name]
        shape = (plane.bytes_per_page, g.plane_bytes(plane.name))
        history = reached.get(shape)  # planes of one shape allow the same shifts
        if history is None:
            history = reached[shape] = _reach(g, j0, n, label_of, table, units, rows,
                                              plane.bytes_per_page, shape[1], R, budget,
                                              split)

        def place(allowed: Ranges, j1: int) -> int | None:
            budget[0] -= len(allowed)
            # plane granules o + j0 .. o + j1 - 1 must be free
            return _first_free([(lo + j0, hi + j0) for lo, hi in allowed],
                               used[plane.name], j1 - j0, budget)

        found = _longest_free(history, place, best[0] if best is not None else j0, j0)
        if found is not None:
            best = (found[0], plane.name, found[1])
    if budget[0] < 0:
        raise _OverWork
    return best


def _split_rest(g: Geometry, plane: str, shift: int, j0: int, j1: int, R: int,
                rows: int, conflicts: Mapping[tuple[str, int], tuple[tuple[int, int], ...]],
                region: str,
                before: tuple[int, tuple[int, int]] | None, budget: list[int]
                ) -> tuple[int, tuple[int, int]] | None:
    """When the run just placed (region granules ``j0 .. j1-1`` at ``shift``) ends
    inside a row, that row and the pages the next run must still touch (a span of
    them); None when it ends on a row boundary or touched them all. Pages a run before
    it touched in the same row (``before``) count as touched. Worked on page ranges,
    never page sets: a row's set may hold thousands of pages, and this runs per run."""
    G = g.granularity
    cut = j1 * G
    k = cut // R
    if k >= rows or k * R == cut:
        return None
    sets = conflicts[(region, k)]
    budget[0] -= 1 + len(sets)
    bpp = g.plane_by_name[plane].bytes_per_page
    lo = max(k * R, j0 * G) + shift * G
    hi = cut + shift * G
    got = (lo // bpp, min((hi - 1) // bpp + 1, g.pages))  # pages this run touched
    # the pages still to touch: the declared ones, within what the runs before left
    # untouched when they lie in this row
    keep = (before[1][0], before[1][1] + 1) if before is not None and before[0] == k \
        else (0, g.pages)
    first = last = None
    for a, b in sets:
        a, b = max(a, keep[0]), min(b, keep[1])
        for s0, s1 in ((a, min(b, got[0])), (max(a, got[1]), b)):  # [a, b) less got
            if s0 < s1:
                first = s0 if first is None else min(first, s0)
                last = s1 - 1 if last is None else max(last, s1 - 1)
    if first is None or last is None:
        return None
    return k, (first, last)


def chain_plan(g: Geometry, label: str = "chains") -> PhysicalPlan | None:
    """The chain plan of ``g`` (module docstring), or None when some run finds no free
    place, the work cap is reached, or the plan breaks the contract."""
    G = g.granularity
    lab = labels(g)
    conflicts = declared_conflict_ranges(g)
    used: dict[str, Ranges] = {p.name: [] for p in g.planes}
    pieces: list[Allocation] = []
    budget = [MAX_CHAIN_PLAN_WORK]
    tables = {}
    for plane in g.planes:
        units = g.plane_bytes(plane.name) // G
        tables[plane.name] = (units, label_units(g, plane.bytes_per_page, units))
    try:
        for region in g.regions:
            n = g.region_bytes(region.name) // G
            label_of = [-1] * n
            for l_, r in enumerate(lab.region):
                if r == region.name:
                    for j in range(lab.first[l_], lab.first[l_] + lab.need[l_]):
                        label_of[j] = l_
            if -1 in label_of:
                return None
            rows = Rows(conflicts, region.name, region.rows)
            R = region.row_bytes
            j0 = 0
            split: tuple[int, tuple[int, int]] | None = None
            while j0 < n:
                best = _best_run(g, j0, n, label_of, tables, rows, R, budget, split, used)
                if best is None and split is not None:
                    # the rest of the split row fits nowhere: go on without it, and
                    # let the contract check judge the row
                    best = _best_run(g, j0, n, label_of, tables, rows, R, budget, None, used)
                if best is None:
                    return None
                j1, name, at = best
                bisect.insort(used[name], (at, at + j1 - j0))
                pieces.append(Allocation(name, at * G, (j1 - j0) * G, region.name, j0 * G))
                split = _split_rest(g, name, at - j0, j0, j1, R, region.rows, conflicts,
                                    region.name, split, budget)
                if budget[0] < 0:
                    raise _OverWork
                j0 = j1
    except _OverWork:
        return None
    plan = finish_plan(g, label, pieces,
                       notes=("each region in a few runs, each at one plane shift",))
    return None if check_contract(g, plan) else plan
