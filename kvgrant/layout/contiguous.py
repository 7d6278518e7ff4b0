"""The contiguous plan: each region backed whole by one run of one plane, if it can be.

Why: a layout of a few chunks over large planes (a region of 84 granules on a plane of
256 granules and 2 pages) has an obvious optimum, the whole region in one allocation
next to one non-aliased rest, which the reference rule (one allocation per declared
chunk and gap) misses and which the exact model finds only after a long search: every
plane granule of a page may back every label of that page, so its LP is highly
symmetric (such a layout took 76 s of solving to reach the trivial bound of 2). As the
solver's warm start, a plan that meets the trivial bound ends planning at once, and a
better start helps the solver everywhere else. A pure function of the geometry.

Method: a region's labels (:func:`kvgrant.layout.granules.labels`) cover its granules
in order, label ``l`` granules ``first[l] .. first[l] + need[l] - 1``. Mapping the
region at plane granule ``o`` puts region granule ``j`` on plane granule ``o + j``,
which keeps the layout contract's eligibility when every label's granules land on
granules that may back it (:func:`kvgrant.layout.granules.label_units`): for label l
and an eligible range ``[s, e)`` of the plane, the offsets ``s - first[l] ..
e - first[l] - need[l]``. The offsets allowed for the whole region are the
intersection over its labels; regions are placed in declared order, each at the
lowest allowed offset of the first plane where it fits beside the regions placed
before. Coverage (every row touches every page of its conflict set) is not implied
by eligibility, so the finished plan goes through :func:`check_contract` and is
returned only when it keeps the contract.
"""

from __future__ import annotations

import bisect
from operator import itemgetter

from kvgrant.layout.contract import check_contract
from kvgrant.layout.geometry import Geometry
from kvgrant.layout.granules import label_units, labels
from kvgrant.layout.plan import Allocation, PhysicalPlan
from kvgrant.layout.rules import finish_plan

__all__ = ["MAX_INTERVAL_WORK", "contiguous_plan"]

MAX_INTERVAL_WORK = 2_000_000
"""Most interval steps (ranges of :func:`label_units` walked and places looked for, over
every region and plane tried) before the search gives up (None): a count of the
geometry, never a clock."""

Ranges = list[tuple[int, int]]


def _intersect(a: Ranges, b: Ranges) -> Ranges:
    """The intersection of two sorted lists of disjoint half-open ranges."""
    out: Ranges = []
    i = j = 0
    while i < len(a) and j < len(b):
        lo, hi = max(a[i][0], b[j][0]), min(a[i][1], b[j][1])
        if lo < hi:
            out.append((lo, hi))
        if a[i][1] < b[j][1]:
            i += 1
        else:
            j += 1
    return out


def _first_free(allowed: Ranges, used: Ranges, length: int,
                work: list[int] | None = None) -> int | None:
    """The lowest offset ``o`` in ``allowed`` with ``[o, o + length)`` clear of every
    range in ``used`` (sorted, disjoint), or None. ``work[0]``, when given, is lowered
    by the steps taken: a bisection per allowed range and one step per range in the
    way, so a call costs at most ``len(allowed) * (1 + log2 len(used)) + len(used)``.

    Why bisect: a plane holding thousands of runs, each clash rescanning them from
    the first, made one call quadratic in the runs placed."""
    steps = 0
    at = None
    i = 0
    o = 0
    for lo, hi in allowed:
        # every offset below o is blocked (each jump below skips only offsets that
        # clash with the range jumped over), and so are those the ranges before i block
        o = max(lo, o)
        i = bisect.bisect_right(used, o, lo=i, key=itemgetter(1))  # the first range ending past o
        steps += 1 + len(used).bit_length()
        while i < len(used) and used[i][0] < o + length:
            o = used[i][1]  # past the range in the way
            i += 1
            steps += 1
        if o < hi:
            at = o
            break
    if work is not None:
        work[0] -= steps
    return at


def contiguous_plan(g: Geometry, label: str = "contiguous") -> PhysicalPlan | None:
    """The contiguous plan of ``g`` (module docstring), or None when some region fits
    on no plane in one run, the work cap is reached, or the plan breaks the contract."""
    G = g.granularity
    lab = labels(g)
    by_region: dict[str, list[int]] = {}
    for l_, r in enumerate(lab.region):
        by_region.setdefault(r, []).append(l_)
    used: dict[str, Ranges] = {p.name: [] for p in g.planes}
    pieces: list[Allocation] = []
    budget = [MAX_INTERVAL_WORK]
    for region in g.regions:
        n = g.region_bytes(region.name) // G
        own = by_region.get(region.name, [])
        if not own:
            return None
        placed = False
        for plane in g.planes:
            units = g.plane_bytes(plane.name) // G
            if units < n:
                continue
            table = label_units(g, plane.bytes_per_page, units)
            allowed: Ranges = [(0, units - n + 1)]
            for l_ in own:
                a, k = lab.first[l_], lab.need[l_]
                rng = table[l_]
                budget[0] -= len(rng) + len(allowed)
                if budget[0] < 0:
                    return None
                shifted = [(s - a, e - a - k + 1) for s, e in rng if e - s >= k]
                allowed = _intersect(allowed, shifted)
                if not allowed:
                    break
            if not allowed:
                continue
            o = _first_free(allowed, used[plane.name], n, budget)
            if budget[0] < 0:
                return None
            if o is None:
                continue
            bisect.insort(used[plane.name], (o, o + n))
            pieces.append(Allocation(plane.name, o * G, n * G, region.name, 0))
            placed = True
            break
        if not placed:
            return None
    plan = finish_plan(g, label, pieces,
                       notes=("each region backed whole by one run of one plane",))
    return None if check_contract(g, plan) else plan
