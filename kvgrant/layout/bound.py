"""A lower bound on allocations per rank that holds for ANY plan keeping the contract.

Why: "the packer saves N allocations" means little without knowing how many are
unavoidable. This bound is computed from the geometry and the declared conflict sets
only (never from a plan or the packer), so packed / bound measures the packer.
The proofs are in ``docs/layout.md`` ("Lower bound"); in short:

* (A) Each row k needs at least ``m_k`` incidences (aliased allocations with bytes in
  the row). This is the largest of: byte capacity per (component, plane); granule
  capacity for the granules wholly inside the row; whether 1 or 2 runs can touch
  exactly the row's pages with exactly ``row_bytes`` bytes; the granules that
  page-sharing neighbour rows must take; and the byte budget of used pages that back
  no row byte, which only lets a few planes skip a row's exclusive pages.
* (B) An allocation touching j rows crosses j - 1 boundaries, and each boundary is
  crossed by at most one allocation, so a region needs at least
  ``sum_k m_k - crossable boundaries`` allocations. A boundary is crossable only with
  page continuity across it, or through a plane's tail.
* (C) Non-aliased allocations: one per plane holding pages in no conflict set; enough
  planes to hold the non-aliased bytes; and one per run of *dead* granules (granules
  no plan can alias), less the separations the spare non-aliased granules can fill.
* (E) Chains: the rows one piece holds whole lie at one plane shift, which each row's
  pages confine to an interval; rows whose pages drift against their bytes break the
  chain, and every row held whole by no piece has a piece boundary inside it.
* (D) A Lagrangian relaxation of the granule assignment: along each plane, count the
  starts of label runs (a row's interior, or one straddling granule) that cannot be
  one allocation, and of non-aliased stretches; price the "each label gets exactly its
  granules" constraints (and, with the price LP, "each page of a row's set is touched"
  and "each label is entered from the one before at most once"), so the planes
  separate into shortest paths. Any prices give a bound on all allocations together
  (or on a weighted sum, such as driver handles); the best ones come from an LP over
  those paths (:mod:`kvgrant.layout.price_lp`), and the bound is a pass at them.
"""

from __future__ import annotations

import bisect
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field

from kvgrant.errors import ArgumentError
from kvgrant.gc_pause import gc_paused
from kvgrant.layout import price_lp
from kvgrant.layout.conflicts import declared_conflict_ranges
from kvgrant.layout.geometry import Geometry, Region, require_geometry, round_up
from kvgrant.layout.granules import (eligible_pairs, granule_row, labels, labels_per_granule,
                                     plane_classes, same_set_spans)

__all__ = ["LowerBound", "RegionBound", "allocation_lower_bound", "handle_lower_bound",
           "lagrangian_bound"]


@dataclass(frozen=True)
class RegionBound:
    """Bound on the aliased allocations of one region.

    ``incidences`` is ``sum_k m_k``; ``crossable`` the number of row boundaries some
    allocation could cross; ``pieces = max(1, incidences - crossable, chains)``, with
    ``chains`` the bound (E) of the module docstring.
    """

    region: str
    incidences: int
    crossable: int
    pieces: int
    per_row: tuple[int, ...] = field(repr=False, default=())


@dataclass(frozen=True)
class LowerBound:
    """Allocations per rank that any contract-keeping plan needs at least.

    ``total = max(aliased + unaliased, planes, relaxation)``: ``aliased`` and
    ``unaliased`` are the combinatorial bounds (A)-(C) and (E), ``relaxation`` the
    Lagrangian bound (D) on all allocations together.
    """

    total: int
    aliased: int
    unaliased: int
    planes: int
    free_pages: int
    regions: tuple[RegionBound, ...]
    relaxation: int = 0

    def to_json(self) -> dict[str, object]:
        return {"total": self.total, "aliased": self.aliased, "unaliased": self.unaliased,
                "planes": self.planes, "free_pages": self.free_pages,
                "relaxation": self.relaxation,
                "regions": {r.region: {"pieces": r.pieces, "incidences": r.incidences,
                                       "crossable": r.crossable} for r in self.regions}}


def _row_incidences(g: Geometry, comps: list[tuple[int, int]], row_bytes: int) -> int:
    """Fewest (component, plane) pieces able to hold ``row_bytes`` with one per component."""
    tails = [g.plane_bytes(p.name) - g.pages * p.bytes_per_page for p in g.planes]
    base = 0
    extra: list[int] = []
    for a, b in comps:
        caps = sorted(((b - a) * p.bytes_per_page + (t if b >= g.pages else 0)
                       for p, t in zip(g.planes, tails)), reverse=True)
        base += caps[0]
        extra.extend(caps[1:])
    extra.extend(t for t in tails if t > 0)  # pieces of tail bytes only (no page)
    count = len(comps)
    if base >= row_bytes:
        return max(count, 1)
    for cap in sorted(extra, reverse=True):
        base += cap
        count += 1
        if base >= row_bytes:
            break
    return max(count, 1)


def _piece_bytes(n: int, bpp: int, tail: int, last: bool) -> tuple[int, int]:
    """Bytes a plane-contiguous run needs and can hold to touch exactly ``n`` pages:
    at least (n - 2) * bpp + 2 (one byte of each end page), at most n * bpp (plus the
    plane's tail when the run ends at the last page)."""
    lo = 1 if n == 1 else (n - 2) * bpp + 2
    return lo, n * bpp + (tail if last else 0)


def _few_pieces(g: Geometry, comps: list[tuple[int, int]], row_bytes: int) -> int:
    """1, 2 or 3: the fewest pieces (up to 3) that can touch exactly the row's pages
    with exactly ``row_bytes`` bytes; 3 means "1 and 2 are impossible".

    A piece may also lie wholly in a plane's tail (bytes past the last page): it
    touches no page and holds 1..t_P bytes, so "two pieces" includes one piece that
    touches every page plus one tail-only piece (issue #15's counterexample)."""
    tails = [g.plane_bytes(p.name) - g.pages * p.bytes_per_page for p in g.planes]
    planes = sorted({(p.bytes_per_page, t) for p, t in zip(g.planes, tails)})
    # a piece of tail bytes only touches no page and holds 1..t_P bytes
    tail_max = max((t for _, t in planes), default=0)
    if len(comps) == 1:
        a, b = comps[0]
        n = b - a
        last = b >= g.pages
        spans = [_piece_bytes(n, bpp, t, last) for bpp, t in planes]
        if any(lo <= row_bytes <= hi for lo, hi in spans):
            return 1
        # one piece touching every page plus one tail-only piece
        if tail_max and any(lo + 1 <= row_bytes <= hi + tail_max for lo, hi in spans):
            return 2
        # two runs covering one interval: n1 + n2 >= n; for each n1 the byte totals
        # over every n2 lie inside [lo1 + lo2(min n2), hi1 + hi2(max n2)]
        for b1, t1 in planes:
            for b2, t2 in planes:
                for n1 in range(1, n + 1):
                    lo1, hi1 = _piece_bytes(n1, b1, t1, last)
                    lo2, _ = _piece_bytes(max(1, n - n1), b2, t2, last)
                    _, hi2 = _piece_bytes(n, b2, t2, last)
                    if lo1 + lo2 <= row_bytes <= hi1 + hi2:
                        return 2
        return 3
    if len(comps) == 2:
        (a1, e1), (a2, e2) = comps
        for b1, t1 in planes:
            for b2, t2 in planes:
                lo1, hi1 = _piece_bytes(e1 - a1, b1, t1, e1 >= g.pages)
                lo2, hi2 = _piece_bytes(e2 - a2, b2, t2, e2 >= g.pages)
                if lo1 + lo2 <= row_bytes <= hi1 + hi2:
                    return 2
        return 3
    return len(comps)


def _interior_units(g: Geometry, r: Region) -> list[int]:
    """Per row, the region granules lying wholly inside it (the same in every plan)."""
    G = g.granularity
    out = [0] * r.rows
    for j in range(round_up(r.rows * r.row_bytes, G) // G):
        k = granule_row(r, j, G)
        if k is not None:
            out[k] += 1
    return out


def _unit_incidences(g: Geometry, comps: list[tuple[int, int]], interior: int) -> int:
    """Fewest (component, plane) runs able to back ``interior`` whole granules.

    A granule wholly inside row k backs only row-k bytes, so every page it touches is
    in the row's conflict set: it lies inside one component's bytes of its plane. A
    plane offers at most that many granules per component.
    """
    if interior == 0:
        return 0
    G = g.granularity
    caps = []
    for a, b in comps:
        for p in g.planes:
            hi = g.plane_bytes(p.name) if b >= g.pages else b * p.bytes_per_page
            caps.append(max(0, hi // G - (-(-a * p.bytes_per_page // G))))
    count = 0
    for cap in sorted(caps, reverse=True):
        if interior <= 0 or cap == 0:
            break
        interior -= cap
        count += 1
    return count


def _eligible_units(g: Geometry, comps: tuple[tuple[int, int], ...]) -> list[frozenset[int]]:
    """Per plane, the granules whose pages all lie in the conflict set ``comps``
    (the only granules that may back a granule wholly inside that row)."""
    G = g.granularity
    out = []
    for p in g.planes:
        units: set[int] = set()
        for a, b in comps:
            hi = g.plane_bytes(p.name) if b >= g.pages else b * p.bytes_per_page
            units.update(range(-(-a * p.bytes_per_page // G), hi // G))
        out.append(frozenset(units))
    return out


def _competition_incidences(need: int, mine: list[frozenset[int]],
                            others: list[list[frozenset[int]]], others_need: int) -> int:
    """Fewest planes row k can draw ``need`` interior granules from, when the rows
    ``others`` must draw ``others_need`` interior granules from granules some of which
    row k could use too (proof in docs/layout.md, "Competing rows").

    With e1 = |E_k(P)|, e2 = |union of E_j(P)|, t = |E_k(P) | union E_j(P)|, any set J of
    planes row k draws from satisfies need <= min(sum_J e1, sum_J (t - e2) + sum e2 -
    others_need); so |J| is at least the first j where the top-j sums reach ``need``.
    """
    if need <= 0:
        return 0
    e1, room, e2_total = [], [], 0
    for pi, own in enumerate(mine):
        theirs: set[int] = set()
        for o in others:
            theirs |= o[pi]
        e1.append(len(own))
        room.append(len(own | theirs) - len(theirs))
        e2_total += len(theirs)
    e1.sort(reverse=True)
    room.sort(reverse=True)
    spare = e2_total - others_need
    s1 = s2 = 0
    for j in range(len(e1)):
        s1 += e1[j]
        s2 += room[j]
        if min(s1, s2 + spare) >= need:
            return j + 1
    return len(e1)


def _inside(ranges: tuple[tuple[int, int], ...], starts: list[int], p0: int, p1: int) -> bool:
    """Is the page range [p0, p1) empty or inside one of the merged ``ranges``
    (``starts`` = their sorted start pages)?"""
    if p0 >= p1:
        return True
    i = bisect.bisect_right(starts, p0) - 1
    return i >= 0 and p1 <= ranges[i][1]


MAX_DEAD_UNIT_WORK = 20_000_000
"""Most (straddling granule, candidate plane granule) tests :func:`_dead_units` makes;
past it no granule is counted dead (a weaker, still sound bound: dead granules only
add unaliased allocations). A count of the geometry, never a clock. Why: a layout of
121,000 rows of 4 bytes at G = 64 bytes has a straddling label at nearly every region
granule and thousands of candidates each (658 million tests)."""


def _straddling_work(g: Geometry, spans: Any, lab: Any) -> int:
    """The candidate tests :func:`_dead_units` would make for straddling labels: per
    straddling label and plane, the granules its first part's pages (or the plane's
    tail) allow, counted from the ranges without listing them."""
    G = g.granularity
    planes = [(p.bytes_per_page, g.plane_bytes(p.name) // G) for p in g.planes]
    work = 0
    for l_, name in enumerate(lab.region):
        if granule_row(g.region_by_name[name], lab.first[l_], G) is not None:
            continue  # a row interior, not a straddling label
        a0, _b0, ranges0 = spans[l_][0]
        for bpp, n in planes:
            work += n - max(0, (g.pages * bpp - a0) // G)
            work += sum(max(0, min(n, (pb * bpp - a0) // G + 1)
                            - max(0, (pa * bpp - a0) // G)) for pa, pb in ranges0)
    return work


def _dead_units(g: Geometry) -> list[list[bool]]:
    """Per plane, granules that no contract-keeping plan can alias.

    A granule can back a region granule wholly inside row k only if its pages lie in
    C_k (the declared conflict set); it can back a region granule that holds row
    boundaries only if, for each row part, the plane bytes under that part touch pages
    of that row's set only.
    """
    G = g.granularity
    conflicts = declared_conflict_ranges(g)
    live = [[False] * (g.plane_bytes(p.name) // G) for p in g.planes]
    spans = same_set_spans(g)  # the labels' joined row parts, once per geometry
    lab = labels(g)
    for r in g.regions:
        interior = _interior_units(g, r)
        # once per distinct conflict set: the rows of a tall region share a few
        for rs in {conflicts[(r.name, k)] for k in range(r.rows) if interior[k]}:
            for pi, units in enumerate(_eligible_units(g, rs)):
                for u in units:
                    live[pi][u] = True
    if _straddling_work(g, spans, lab) > MAX_DEAD_UNIT_WORK:
        return [[False] * len(plane) for plane in live]  # none dead: weaker, still sound
    for r in g.regions:
        end = r.rows * r.row_bytes
        straddling = {lab.first[l_]: l_ for l_ in range(len(lab.need))
                      if lab.region[l_] == r.name
                      and granule_row(r, lab.first[l_], G) is None}
        for j in range(round_up(end, G) // G):
            if granule_row(r, j, G) is not None:
                continue
            # (row pages, their starts, offset in unit, end in unit) per row part,
            # adjacent rows of one set joined: the joined bytes touch pages inside one
            # range exactly when each row's do (granules._same_set_spans)
            parts = [(rs, [a for a, _ in rs], a, b) for a, b, rs in spans[straddling[j]]]
            ranges0, _, a0, _ = parts[0]
            for pi, p in enumerate(g.planes):
                bpp, n = p.bytes_per_page, len(live[pi])
                # the first part's first byte lies in that row's pages or past the last page
                cands = set(range(max(0, (g.pages * bpp - a0) // G), n))
                for pa, pb in ranges0:
                    cands.update(range(max(0, (pa * bpp - a0) // G),
                                       min(n, (pb * bpp - a0) // G + 1)))
                for u in cands:
                    if live[pi][u]:
                        continue
                    if all(_inside(ranges, starts, (u * G + a) // bpp,
                                   min((u * G + b - 1) // bpp + 1, g.pages))
                           for ranges, starts, a, b in parts):
                        live[pi][u] = True
    return [[not x for x in plane] for plane in live]


def _gap_bound(g: Geometry, dead: list[list[bool]]) -> int:
    """Fewest unaliased allocations given the dead granules: one per run of dead
    granules, less the separations between runs that the spare unaliased granules
    (unaliased granules beyond the dead ones) could fill, cheapest first."""
    G = g.granularity
    spare = (sum(len(d) for d in dead)
             - sum(round_up(r.rows * r.row_bytes, G) // G for r in g.regions)
             - sum(sum(d) for d in dead))
    runs = 0
    seps: list[int] = []
    for plane in dead:
        last_end = None
        u = 0
        while u < len(plane):
            if plane[u]:
                v = u
                while v < len(plane) and plane[v]:
                    v += 1
                runs += 1
                if last_end is not None:
                    seps.append(u - last_end)
                last_end = v
                u = v
            else:
                u += 1
    for sep in sorted(seps):
        if sep > spare:
            break
        spare -= sep
        runs -= 1
    return runs


def _crossable(g: Geometry, before: tuple[tuple[int, int], ...],
               after: tuple[tuple[int, int], ...]) -> bool:
    """Can one plane-contiguous run end in row k (pages ``before``) and go on into
    row k+1 (pages ``after``)? Needs a page e of row k with e or e+1 in row k+1."""
    if not before or not after:
        return False
    for a, b in before:  # e in [a, b): e or e+1 in some [c, d) of after
        for c, d in after:
            if c <= b and d > a:  # [a, b+1) meets [c, d)
                return True
    return False


def _crossings(g: Geometry, rows: list[tuple[tuple[int, int], ...]]) -> int:
    """How many adjacent row pairs (k, k+1) are :func:`_crossable`; each distinct pair
    of sets is tested once (the rows of a tall region share a few sets, and 2^20
    calls took over a second)."""
    memo: dict[tuple[object, object], bool] = {}
    n = 0
    for k in range(len(rows) - 1):
        key = (rows[k], rows[k + 1])
        x = memo.get(key)
        if x is None:
            x = memo[key] = _crossable(g, rows[k], rows[k + 1])
        n += x
    return n


MAX_CHAIN_WORK = 4_000_000
"""Most (row, plane shape) steps the chain bound (E) walks; past it (E) is left out (1
per region, its trivial value). A count of the geometry, not a clock: about a second of
Python on the 2-core machine. The published example at 20 times its scale takes about
80,000 steps; a region of 2^20 rows over 4 plane shapes would take 4.2 million."""


def _chain_pieces(g: Geometry, r: Region, rows: list[tuple[tuple[int, int], ...]],
                  per_row: list[int]) -> int:
    """(E) Fewest aliased allocations of region ``r`` by the drift of its rows' pages.

    Rows held whole by one allocation lie at one plane shift d (a multiple of G) in one
    plane, and each such row k must touch exactly its pages at that shift: d lies in an
    interval per row and plane. Consecutive rows that one allocation holds whole need a
    common d; a row held by no allocation whole has a run boundary inside it (at least
    ``per_row[k] - 1`` of them; ``per_row`` must bound each row in every plan, as steps
    (A).1-4 do and (A).5 does not). The greedy walk below counts the fewest such
    boundaries (docs/layout.md, "Lower bound", (E)); allocations = boundaries + 1.
    Why: rows whose declared pages advance faster or slower than their bytes (chunks
    with gaps) cannot share an allocation for long, which (B) does not see (it asks
    only whether two neighbours can share one)."""
    G, R, n = g.granularity, r.row_bytes, g.pages
    shapes = sorted({(p.bytes_per_page, g.plane_bytes(p.name)) for p in g.planes})
    if r.rows * len(shapes) > MAX_CHAIN_WORK:
        return 1
    cuts = 0
    live: list[tuple[int, int]] | None = None  # per shape, the shifts the block allows
    for k in range(r.rows):
        sets = rows[k]
        if per_row[k] >= 2 or len(sets) > 1:
            cuts += max(1, per_row[k] - 1)  # never held whole: boundaries inside it
            live = None
            continue
        if not sets:
            continue  # no declared page: left unconstrained (it only weakens the bound)
        a, b = sets[0]
        o, e = k * R, (k + 1) * R
        # first byte on page a; last byte on page b - 1 (or in the tail past the last page)
        here = [(max(a * P - o, (b - 1) * P - e + 1),
                 min((a + 1) * P - o - 1, (PB if b >= n else b * P) - e))
                for P, PB in shapes]
        if live is not None:
            here = [(max(lo, lo2), min(hi, hi2)) for (lo, hi), (lo2, hi2) in zip(live, here)]
        if any(-(-lo // G) * G <= hi for lo, hi in here):
            live = here
            continue
        cuts += 1  # row k joins no block with the rows before it: a boundary inside it
        live = None
    return cuts + 1


def _exclusive_pages(rows: list[tuple[tuple[int, int], ...]], counts: dict[int, int]) -> list[int]:
    """Per row, how many of its pages are in no other row's conflict set."""
    memo: dict[tuple[tuple[int, int], ...], int] = {}
    out = []
    for rs in rows:  # rows of a tall region share a few sets: count each set once
        x = memo.get(rs)
        if x is None:
            x = memo[rs] = sum(1 for a, b in rs for p in range(a, b) if counts[p] == 1)
        out.append(x)
    return out


def _drop_budget_bound(g: Geometry, m: list[int], exclusive: list[int], budget: int) -> list[int]:
    """Raise each row's incidence bound using the byte budget of used pages.

    A row with exclusive pages (pages in no other conflict set) that takes no byte
    from plane P leaves all of P's bytes of those pages backing no row byte. Those
    bytes come out of ``budget`` (bytes of used pages that back no row byte), so only
    the cheapest such "drops" fit; every other plane has an incidence in that row.
    """
    n = len(g.planes)
    costs = sorted(p.bytes_per_page for p in g.planes)
    items: list[tuple[int, int]] = []  # (cost, row)
    out = list(m)
    for k, x in enumerate(exclusive):
        if x == 0 or m[k] >= n:
            continue
        out[k] = n
        items.extend((x * costs[i], k) for i in range(n - m[k]))
    for cost, k in sorted(items):
        if cost > budget:
            break
        budget -= cost
        out[k] -= 1
    return out


def _sharing_rows(elig: list[list[frozenset[int]] | None], needs: list[int]
                  ) -> list[list[int]]:
    """Per row, the other rows with interior granules (``needs`` > 0) that may use one
    of its eligible plane granules, in row order.

    Why an index: comparing every pair of rows made the bound quadratic in rows
    (25 s of a 5,000-alias plan); a granule is eligible for few rows (those whose
    conflict sets hold its pages), so indexing rows by granule is linear in the
    eligible granules.
    """
    near: dict[int, set[int]] = {}  # rows without interior granules share no granule
    planes = max((len(e) for e in elig if e is not None), default=0)
    active = [(j, e) for j, e in enumerate(elig) if needs[j] > 0]  # once, not per plane
    for pi in range(planes):
        owners: dict[int, list[int]] = {}
        for j, e in active:
            for u in e[pi]:  # type: ignore[index]
                owners.setdefault(u, []).append(j)
        for js in owners.values():
            if len(js) > 1:
                for j in js:
                    near.setdefault(j, set()).update(js)
    none: list[int] = []
    return [sorted(j for j in near[k] if j != k) if k in near else none
            for k in range(len(elig))]


MAX_COMPETITION_PAIRS = 5_000_000
"""Most (row, row) pairs sharing an eligible granule that the competition step (C)
examines; past it the step is left out and each row keeps its bound (A), a weaker but
still sound bound (the step only raises rows). A count, not a clock: the bound stays a
function of the geometry. Why: the pairs grow with the square of the rows that share
granules; a layout of 2 pages and 121,000 rows (G = 64 bytes) has 2.2 * 10^10 of them
and the step ran for minutes (still running when stopped after 10). Every example and benchmark layout has at most
about 15,000 (published-dcp8: 14,325)."""


def _competition_pairs(g: Geometry, rows: list[tuple[tuple[int, int], ...]],
                       needs: list[int]) -> int:
    """The pairs :func:`_sharing_rows` would walk (sum over granules of the square of
    the rows that may use it), counted per distinct conflict set: rows with the same
    set have the same eligible granules, so this is cheap where the walk is not."""
    times = Counter(rs for rs, need in zip(rows, needs) if need > 0)
    per_unit: Counter[tuple[int, int]] = Counter()
    for rs, n in times.items():
        for pi, units in enumerate(_eligible_units(g, rs)):
            for u in units:
                per_unit[(pi, u)] += n
    return sum(c * c for c in per_unit.values() if c > 1)


def _with_competition(g: Geometry, rows: list[tuple[tuple[int, int], ...]],
                      needs: list[int], base: list[int]) -> list[int]:
    """Raise each row's bound by the granules its page-sharing neighbours must take
    (left out past :data:`MAX_COMPETITION_PAIRS`)."""
    if _competition_pairs(g, rows, needs) > MAX_COMPETITION_PAIRS:
        return list(base)
    memo: dict[tuple[tuple[int, int], ...], list[frozenset[int]]] = {}
    elig: list[list[frozenset[int]] | None] = []
    for rs, need in zip(rows, needs):  # one (read-only) list per distinct conflict set
        e = None
        if need > 0:  # only rows with interior granules compete
            e = memo.get(rs)
            if e is None:
                e = memo[rs] = _eligible_units(g, rs)
        elig.append(e)
    out = list(base)
    near_of = _sharing_rows(elig, needs)
    for k, rs in enumerate(rows):
        if needs[k] == 0:
            continue
        near = near_of[k]
        before = [j for j in near if j < k]
        after = [j for j in near if j > k]
        choices = [[j] for j in before[-2:] + after[:2]]
        if before and after:
            choices.append([before[-1], after[0]])
        if len(near) > 1:
            choices.append(near)
        for group in choices:
            bound = _competition_incidences(needs[k], elig[k], [elig[j] for j in group],
                                            sum(needs[j] for j in group))
            out[k] = max(out[k], bound)
    return out


def _page_counts(rows: Iterable[tuple[tuple[int, int], ...]]) -> dict[int, int]:
    """Per page, how many rows' conflict sets hold it (pages in none are absent).

    Why count distinct sets first: the rows of a tall region share a few sets, and
    walking every row's pages took seconds at 2^20 rows."""
    counts: dict[int, int] = {}
    for ranges, times in Counter(rows).items():
        for a, b in ranges:
            for p in range(a, b):
                counts[p] = counts.get(p, 0) + times
    return counts


def _row_base(g: Geometry, comps: list[tuple[int, int]], row_bytes: int,
              interior: int) -> int:
    """(A) for one row from its conflict set alone: byte and granule capacity, and
    whether one or two pieces can touch exactly its pages (the same for every row
    with the same set and interior granules, so it is computed once per such row)."""
    m = max(_row_incidences(g, comps, row_bytes), _unit_incidences(g, comps, interior))
    if m < 3 and comps:
        m = max(m, _few_pieces(g, comps, row_bytes))
    return m


@gc_paused()
def allocation_lower_bound(g: Geometry) -> LowerBound:
    """Lower bound on allocations per rank for any plan keeping the layout contract.

    Computed from the geometry and declared conflict sets only (independent of the
    packer). See the module docstring and ``docs/layout.md`` for the argument.
    """
    require_geometry(g, "allocation_lower_bound")
    G = g.granularity
    conflicts = declared_conflict_ranges(g)
    tails = [g.plane_bytes(p.name) - g.pages * p.bytes_per_page for p in g.planes]
    counts = _page_counts(conflicts.values())
    row_bytes_total = sum(r.rows * r.row_bytes for r in g.regions)
    budget = (len(counts) * sum(p.bytes_per_page for p in g.planes) + sum(tails)
              - row_bytes_total)
    all_rows = [conflicts[(r.name, k)] for r in g.regions for k in range(r.rows)]
    base: list[int] = []
    needs: list[int] = []
    for r in g.regions:
        interior = _interior_units(g, r)
        needs.extend(interior)
        memo: dict[tuple[tuple[tuple[int, int], ...], int], int] = {}
        for k in range(r.rows):
            key = (conflicts[(r.name, k)], interior[k])
            m = memo.get(key)
            if m is None:
                m = memo[key] = _row_base(g, list(key[0]), r.row_bytes, key[1])
            base.append(m)
    base = _with_competition(g, all_rows, needs, base)
    per_row_all = _drop_budget_bound(g, base, _exclusive_pages(all_rows, counts), budget)
    # (E) needs a bound that holds for each row in every plan: step (A).5 bounds only
    # the sum (which row keeps its incidence depends on the greedy order), so (E) takes
    # the per-row values from before it
    regions: list[RegionBound] = []
    at = 0
    for r in g.regions:
        rows = all_rows[at:at + r.rows]
        per_row = per_row_all[at:at + r.rows]
        own_rows = base[at:at + r.rows]
        at += r.rows
        page_cross = _crossings(g, rows)
        others = r.rows - 1 - page_cross
        # crossings through a plane's tail: the tail lies in the plane's last unit,
        # which backs one region unit, which holds at most G // row_bytes + 1 boundaries
        tail_cross = sum(G // r.row_bytes + 1 for t in tails if t > 0)
        crossable = page_cross + min(others, tail_cross)
        incid = sum(per_row)
        pieces = max(1, incid - crossable, _chain_pieces(g, r, rows, own_rows))
        regions.append(RegionBound(r.name, incid, crossable, pieces, tuple(per_row)))
    aliased = sum(rb.pieces for rb in regions)
    free_pages = g.pages - len(counts)
    # region bytes past the last row belong to no row, so free pages may back them
    row_tails = sum(round_up(r.rows * r.row_bytes, G) - r.rows * r.row_bytes
                    for r in g.regions)
    forced = sum(free_pages * p.bytes_per_page > row_tails for p in g.planes)
    left = (sum(g.plane_bytes(p.name) for p in g.planes)
            - sum(round_up(r.rows * r.row_bytes, G) for r in g.regions))
    by_bytes = 0
    for size in sorted((g.plane_bytes(p.name) for p in g.planes), reverse=True):
        if left <= 0:
            break
        left -= size
        by_bytes += 1
    unaliased = max(forced, by_bytes, _gap_bound(g, _dead_units(g)))
    relaxation = lagrangian_bound(g)
    total = max(aliased + unaliased, len(g.planes), relaxation)
    return LowerBound(total, aliased, unaliased, len(g.planes), free_pages, tuple(regions),
                      relaxation)


# --- (D) Lagrangian relaxation of the granule assignment -------------------------------


MAX_LAGRANGIAN_PAIRS = 20_000
"""Most (granule, label) pairs (:func:`kvgrant.layout.granules.eligible_pairs`) the
Lagrangian bound walks (300 times, or once after the price LP); past it the bound (D)
is 0, its trivial value (the other parts still count). A count of the geometry, not a
clock. Measured (2-core machine): the published example at 20 times its scale has
16,663 pairs and its bound
(D) takes 3.2 s (24,841, the bound it reports); one plane with 100,000 two-page chunks
has 116,427 and took 40 s for a bound of 2; two chunks at G = 64 bytes over 5,000
pages have 305,720, and the whole combinatorial bound took 95 s there. Every example and exporter or random layout of the
benchmark has at most 2,797."""


@gc_paused()
def lagrangian_bound(g: Geometry, iterations: int = 300, *, free_cost: int = 1,
                     region_cost: dict[str, int] | None = None, patience: int = 12,
                     cover: bool = True) -> int:
    """A lower bound on allocations from a Lagrangian relaxation (proof in
    docs/layout.md, "(D) Lagrangian relaxation").

    Every plan assigns each aliased plane granule to the region granule it backs.
    Group region granules into *labels* (a row's interior granules; each straddling
    granule alone). A granule may take a label only if its pages lie in the rows'
    conflict sets. Along each plane, count one allocation at the start of each run
    of one label, of each label that continues the previous one in region order
    (only then can they be one allocation), and of each non-aliased stretch: this
    never exceeds the plan's allocations. Relaxing "label l gets exactly need_l
    granules" with prices lambda_l makes the planes independent; a shortest-path pass
    per plane solves each exactly, and any prices give a bound. The prices are the
    duals of the price LP (:func:`kvgrant.layout.price_lp.lp_prices`, the Lagrangian
    dual's optimum, with the coverage and entry rows priced too when ``cover``) when
    it is small enough and ends; else they are improved by subgradient steps on the
    needs and the best bound is kept.

    With ``free_cost`` and ``region_cost`` (default 1 each) the bound is on the
    weighted sum: ``free_cost`` per non-aliased allocation and ``region_cost[R]`` per
    allocation aliased into region R (e.g. driver handles: mappings x devices).
    ``iterations`` and ``patience`` (steps without progress before the step halves,
    for the subgradient) and ``cover`` (the price LP prices the coverage and one-join
    rows too: tighter, and about twice the LP's time) trade time for tightness only;
    every value gives a valid bound.
    """
    lab = labels(g)
    need, parts = lab.need, lab.parts
    if not need or eligible_pairs(g) > MAX_LAGRANGIAN_PAIRS:
        return 0  # no labels, or too many pairs to walk: the trivial (sound) bound
    nl = len(need)
    classes = _plane_class_states(g)
    elig_by_class = [(mult, st) for mult, _, _, st in classes]

    costs = region_cost or {}
    start = [float(costs.get(parts[i][0][0], 1)) for i in range(nl)]
    if price_lp.lp_columns(elig_by_class) <= price_lp.MAX_PRICE_LP_COLUMNS:
        touched = price_lp.touches(g, lab, [(bpp, kept, st.labels)
                                            for _, (bpp, _), kept, st in classes]) \
            if cover else None
        prices = price_lp.lp_prices(elig_by_class, need, start, float(free_cost), touched)
        if prices is not None:
            # the LP's duals are the best prices (LP duality); the pass evaluates the
            # relaxation at them, so the bound rests on the pass, not on the LP
            value = price_lp.priced_value(elig_by_class, need, prices, start,
                                          float(free_cost), touched)
            return max(0, int(-(-(value - 1e-6) // 1)))
    scale = max(start + [float(free_cost)])
    lam = [0.5 * c for c in start]
    best = 0.0
    theta = 1.0
    stall = 0
    upper = float(len(g.aliases) + len(g.planes)) * scale
    for _ in range(iterations):
        total = sum(lam[i] * need[i] for i in range(nl))
        count = [0] * nl
        for mult, states in elig_by_class:
            val, used = _plane_pass(states, lam, start, float(free_cost))
            total += mult * val
            for lab, n in used.items():
                count[lab] += mult * n
        if total > best + 1e-9:
            best, stall = total, 0
        else:
            stall += 1
            if stall >= patience:
                theta, stall = theta / 2, 0
        grad = [need[i] - count[i] for i in range(nl)]
        norm = sum(x * x for x in grad)
        if norm == 0:
            break
        step = theta * max(upper - total, scale) / norm
        lam = [lam[i] + step * grad[i] for i in range(nl)]
    return max(0, int(-(-(best - 1e-6) // 1)))


def _plane_class_states(g: Geometry) -> list[tuple[int, tuple[int, int], list[int],
                                                   "_PlaneStates"]]:
    """Per plane class (:func:`~kvgrant.layout.granules.plane_classes`): its number of
    planes, its key (bytes per page, granules), the granules the passes walk
    (:func:`_kept_positions`) and their states. Shared by (D) and its tests."""
    pred = labels(g).pred
    out = []
    for bpp, units, idx in plane_classes(g):
        per_unit = labels_per_granule(g, bpp, units)
        kept = _kept_positions(per_unit)
        out.append((len(idx), (bpp, units), kept,
                    _PlaneStates.of([per_unit[u] for u in kept], pred)))
    return out


def _kept_positions(per_unit: list[list[int]]) -> list[int]:
    """The granules of ``per_unit`` the passes walk: each run of granules that may
    take no label cut to its first.

    Why: such granules are non-aliased in every labelling, and a non-aliased granule
    after a non-aliased one costs nothing in :func:`_plane_pass`, so the pass over
    the shorter list has the same value and the same label counts. Planes that are
    mostly free space (random layouts, tiny test layouts) get passes many times
    shorter; each of the 300 subgradient steps makes one pass per plane class. The
    granules themselves are kept for the price LP's coverage rows (which pages a
    state touches depends on its granule).
    """
    out: list[int] = []
    for u, labs in enumerate(per_unit):
        if labs or not out or per_unit[out[-1]]:
            out.append(u)
    return out


@dataclass(frozen=True)
class _PlaneStates:
    """One plane class's granules as the states of :func:`_plane_pass`, by position.

    In granule u, state 0 is non-aliased and state i >= 1 its (i-1)-th eligible label
    (``labels[u][i - 1]``); ``same[u][i - 1]`` and ``pred[u][i - 1]`` are where that
    label and its predecessor sit in granule u - 1 (-1: absent). Why positions: the
    pass runs 300 times per bound and three bounds per ``kvgrant plan``; positions
    instead of a dict per granule make it about 1.7 times as fast, with the same
    arithmetic in the same order (so the same bound)."""

    labels: list[list[int]]
    same: list[list[int]]
    pred: list[list[int]]

    @classmethod
    def of(cls, per_unit: list[list[int]], pred: list[int]) -> "_PlaneStates":
        same_at: list[list[int]] = []
        pred_at: list[list[int]] = []
        where: dict[int, int] = {}  # label -> its state in the previous granule
        for labs in per_unit:
            same_at.append([where.get(s, -1) for s in labs])
            pred_at.append([where.get(pred[s], -1) if pred[s] >= 0 else -1 for s in labs])
            where = {s: i + 1 for i, s in enumerate(labs)}
        return cls(per_unit, same_at, pred_at)


def _plane_pass(states: _PlaneStates, lam: list[float], start: list[float],
                free_cost: float) -> tuple[float, dict[int, int]]:
    """Cheapest labelling of one plane's granules under prices ``lam``: a new run of
    label s costs ``start[s]`` (a non-aliased stretch ``free_cost``) unless it
    continues the same label or the label's predecessor; each labelled granule earns
    its price. Returns (cost, granules per label)."""
    prev: list[float] = []
    gmin, gpos = 0.0, -1
    back: list[list[int]] = []
    for labs, same, pred in zip(states.labels, states.same, states.pred):
        v = gmin + free_cost
        b = gpos
        if prev and prev[0] <= v:  # non-aliased after non-aliased
            v, b = prev[0], 0
        cur = [v]
        bk = [b]
        for s, sp, pp in zip(labs, same, pred):
            v = gmin + start[s]
            b = gpos
            if sp >= 0 and prev[sp] <= v:
                v, b = prev[sp], sp
            if pp >= 0 and prev[pp] < v:
                v, b = prev[pp], pp
            cur.append(v - lam[s])
            bk.append(b)
        back.append(bk)
        prev = cur
        gmin = min(cur)
        gpos = cur.index(gmin)
    used: dict[int, int] = {}
    pos = gpos
    for labs, bk in zip(reversed(states.labels), reversed(back)):
        if pos > 0:
            s = labs[pos - 1]
            used[s] = used.get(s, 0) + 1
        pos = bk[pos]
        if pos < 0:
            break
    return gmin, used


def handle_lower_bound(g: Geometry, lb: LowerBound, *, declared: bool = False) -> int:
    """Driver handles (sum over ranks of mappings x granted devices) that any
    contract-keeping plan needs at least.

    The larger of two bounds: every allocation has a plane mapping and each region
    at least ``pieces`` alias mappings (from ``lb``); and the Lagrangian relaxation
    (D) weighted by handles (each allocation costs its plane mapping's devices summed
    over ranks, plus its alias mapping's when aliased).
    """
    require_geometry(g, "handle_lower_bound")
    if not isinstance(lb, LowerBound):  # was: AttributeError (no regions)
        raise ArgumentError(f"handle_lower_bound: lb = {repr(lb)[:80]}: must be the "
                            "LowerBound of allocation_lower_bound(g)", argument="lb",
                            value=lb)
    total = 0
    devices = 0
    per_region = {rb.region: 0 for rb in lb.regions}
    for r in range(g.topology.ranks):
        n_plane = g.granted_count(r, declared=declared)
        total += lb.total * n_plane
        devices += n_plane
        for rb in lb.regions:
            n = g.granted_count(r, rb.region, declared=declared)
            total += rb.pieces * n
            per_region[rb.region] += n
    # the needs alone are priced here: ``kvgrant plan`` asks for two handle bounds and
    # one allocation bound, and coverage rows double the price LP's time (at 5 times
    # the published scale, 3.8 s against 1.7 s a bound; docs/layout.md, "(D)")
    weighted = lagrangian_bound(g, free_cost=devices,
                                region_cost={k: devices + v for k, v in per_region.items()},
                                cover=False)
    return max(total, weighted)
