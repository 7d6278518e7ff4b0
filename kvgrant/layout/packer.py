"""kvgrant's packer: re-assign plane granules to region granules to need fewer allocations.

Why: the declared layout fixes only what the scheduler sees (each row's exact
conflict set) and what the driver needs (full coverage, G-aligned whole-handle
mappings). Which plane granule backs which region granule inside a row is free, so
the packer re-chooses it to make runs that are contiguous in both plane and region,
and merges each run into one allocation.

Method, in granules of G bytes (``unit`` below):

* A region unit that straddles a row boundary (or reaches past the last row) is
  *fixed*: it keeps its declared plane unit, so the byte-precise page footprint of
  both rows it touches is untouched.
* Every other region unit lies inside one row ``k``; row ``k``'s interior units are
  one contiguous span. They may be backed by any plane unit whose pages all lie in
  the row's declared conflict set ``C_k`` (so no page is added), as long as the union
  of pages touched still equals ``C_k`` (so no page is lost).
* The starting arrangement is the declared layout or the reference rule's
  arrangement (so the reference rule's swaps are available too).
* Rows are packed in order. Each row holds a *reservation* (at first its starting
  granules), which is always a valid choice. A row may use its reservation, any
  granule nobody holds, and (in "stealing" mode) granules reserved by later rows, as
  long as each such row's reservation can be repaired from free eligible granules.
* Per row a few candidate choices are tried (longest eligible runs first, the run
  that continues the previous unit in plane order first, the run that leads into
  the next fixed unit last; the reservation as fallback); the valid candidate with
  the fewest pieces (counting the change in unaliased gaps) wins.
* A final pass re-splits, plane by plane, the granules of each pair of consecutive
  rows: the first row takes a prefix of the plane's stretch and the second a suffix,
  with the lengths chosen by a small dynamic programme over planes to give each row
  its granule count with the fewest runs; a re-split is kept only when both rows
  still touch exactly their conflict sets.
* Three modes run (declared start with stealing, reference start with and without);
  the result with the fewest allocations is kept.
* Last, :func:`_exchange` swaps equal numbers of granules between two rows (or a
  row and the non-aliased pool) where that joins runs: each row keeps its granule
  count, so an exchange is always feasible; it is kept only when both rows still
  touch exactly their conflict sets. It is seeded and bounded by a count of tries,
  so the plan is the same on every machine.

The result is checked with :func:`kvgrant.layout.contract.check_contract`; if it is
not valid, or needs more allocations than the reference rule, the reference plan's
allocations are returned under the ``packed`` label with a note. So by construction
the packed plan never needs more allocations than the reference rule.
"""

from __future__ import annotations

import random
import time
from dataclasses import dataclass

from kvgrant.gc_pause import gc_paused
from kvgrant.layout.conflicts import conflict_ranges, declared_conflict_ranges
from kvgrant.layout.contract import check_contract
from kvgrant.layout.geometry import Geometry, Region, round_up
from kvgrant.layout.granules import granule_row
from kvgrant.layout.plan import Allocation, PhysicalPlan
from kvgrant.layout.rules import finish_plan, reference_plan

__all__ = ["pack"]

_FREE = -1
_TAKEN = -2

Run = tuple[int, int, int]
"""(plane index, first unit, unit count)."""


@dataclass
class _Planes:
    """Per-plane unit facts, indexed by plane position in the geometry."""

    names: list[str]
    bpp: list[int]
    units: list[int]
    pages: int
    G: int

    def run_pages(self, pi: int, u: int, n: int) -> tuple[int, int] | None:
        """Half-open page range touched by plane units [u, u+n) of plane ``pi``."""
        b = self.bpp[pi]
        p0 = u * self.G // b
        p1 = min(((u + n) * self.G - 1) // b + 1, self.pages)
        return (p0, p1) if p0 < p1 else None

    def eligible(self, pi: int, a: int, b: int) -> tuple[int, int]:
        """Unit range [u0, u1) of plane ``pi`` whose bytes touch only pages in [a, b)."""
        bpp, G = self.bpp[pi], self.G
        lo = a * bpp
        hi = self.units[pi] * G if b >= self.pages else b * bpp
        return -(-lo // G), hi // G


def _granule_rows(r: Region, n: int, G: int) -> list[int | None]:
    """Per region granule: the row it lies wholly inside, or None when it holds a row
    boundary or bytes past the last row (such granules keep their declared backing)."""
    return [granule_row(r, j, G) for j in range(n)]


@dataclass
class _Layout:
    """The declared arrangement at granule level, split the way both searches need it."""

    decl: dict[str, list[tuple[int, int]]]  # region granule -> (plane index, plane granule)
    rows: list[tuple[str, int, int, int]]  # (region, row, first interior granule, end)
    assign: dict[str, list[tuple[int, int]]]  # straddling granules placed, others (-1, -1)
    fixed: list[tuple[int, int]]  # (plane index, plane granule) behind straddling granules
    fixed_js: set[tuple[str, int]]  # region granules holding row boundaries
    fixed_allocs: list[Allocation]  # the straddling granules as one-granule allocations


def _layout(g: Geometry, pl: "_Planes", chunks: list) -> _Layout:
    """Map every region granule to the plane granule ``chunks`` put behind it (declared
    aliases, or aliased allocations), keep straddling granules where they are, and list
    each row's interior span."""
    G = g.granularity
    pidx = {n: i for i, n in enumerate(pl.names)}
    decl = {r.name: [(-1, -1)] * (round_up(r.rows * r.row_bytes, G) // G) for r in g.regions}
    for a in chunks:
        off = a.region_offset if isinstance(a, Allocation) else a.offset
        pi, j0, u0 = pidx[a.plane], off // G, a.plane_offset // G
        for d in range(a.length // G):
            if j0 + d < len(decl[a.region]):
                decl[a.region][j0 + d] = (pi, u0 + d)
    out = _Layout(decl, [], {}, [], set(), [])
    for r in g.regions:
        units = decl[r.name]
        out.assign[r.name] = [(-1, -1)] * len(units)
        inner: dict[int, list[int]] = {}
        for j, row in enumerate(_granule_rows(r, len(units), G)):
            pi, u = units[j]
            if row is not None:
                inner.setdefault(row, []).append(j)
            else:
                out.assign[r.name][j] = (pi, u)
                out.fixed.append((pi, u))
                out.fixed_js.add((r.name, j))
                out.fixed_allocs.append(Allocation(pl.names[pi], u * G, G, r.name, j * G))
        for k in sorted(inner):
            out.rows.append((r.name, k, inner[k][0], inner[k][-1] + 1))
    return out


def _runs(units: list[tuple[int, int]]) -> list[Run]:
    """Group (plane, unit) pairs into maximal runs of consecutive units."""
    out: list[list[int]] = []
    for pi, u in sorted(units):
        if out and out[-1][0] == pi and out[-1][1] + out[-1][2] == u:
            out[-1][2] += 1
        else:
            out.append([pi, u, 1])
    return [(pi, u, n) for pi, u, n in out]


def _arrange(runs: list[Run], link_start: tuple[int, int] | None,
             link_end: tuple[int, int] | None) -> tuple[list[Run], int]:
    """Order runs over a row's interior span; return (order, pieces it costs).

    ``link_start`` is the plane unit just before the span (a run starting right after
    it merges with it); ``link_end`` the plane unit just after (a run ending right
    before it merges with it).
    """
    rest = sorted(runs)
    first = last = None
    if link_start is not None:
        first = next((r for r in rest if (r[0], r[1]) == (link_start[0], link_start[1] + 1)), None)
        if first is not None:
            rest.remove(first)
    if link_end is not None and rest:
        last = next((r for r in rest if (r[0], r[1] + r[2]) == link_end), None)
        if last is not None:
            rest.remove(last)
    order = ([first] if first else []) + rest + ([last] if last else [])
    pieces = len(order) - (first is not None) - (last is not None)
    if first is not None and last is None and link_end is not None and not rest:
        # a single run that both continues the previous unit and leads into the next
        if (first[0], first[1] + first[2]) == link_end:
            pieces -= 1
    return order, pieces


def _pages_of(pl: _Planes, runs: list[Run]) -> list[tuple[int, int]]:
    out = []
    for pi, u, n in runs:
        r = pl.run_pages(pi, u, n)
        if r is not None:
            out.append(r)
    return out


def _covered(ranges: list[tuple[int, int]]) -> int:
    """Number of distinct pages in a list of half-open ranges."""
    total, cursor = 0, -1
    for s, e in sorted(ranges):
        s = max(s, cursor)
        if e > s:
            total += e - s
            cursor = e
    return total


def _take(avail: list[Run], need: int, first: Run | None, last: Run | None,
          suffix: bool) -> list[Run] | None:
    """Greedy choice of ``need`` units from available runs: ``first`` and ``last``
    first, then the longest; the final partial run taken as prefix or suffix."""
    picked: list[Run] = []
    left = need
    queue = [r for r in (first, last) if r is not None]
    queue += sorted((r for r in avail if r not in queue), key=lambda r: (-r[2], r[0], r[1]))
    for pi, u, n in queue:
        if left == 0:
            break
        k = min(n, left)
        if _is(last, (pi, u, n)) and k < n:
            picked.append((pi, u + n - k, k))  # keep the end that leads into the next unit
        elif _is(first, (pi, u, n)) or not suffix:
            picked.append((pi, u, k))
        else:
            picked.append((pi, u + n - k, k))
        left -= k
    return picked if left == 0 else None


def _is(a: Run | None, b: Run) -> bool:
    return a is not None and a == b


def _gap_delta(owner: list[list[int]], chosen: set[tuple[int, int]],
               mine: set[tuple[int, int]]) -> int:
    """Change in the number of non-aliased gaps if a row takes ``chosen`` and gives
    back the rest of its declared units ``mine`` (units still reserved for later rows
    count as aliased). Counted as the change in free-run starts near the changed units."""
    def free_before(pi: int, u: int) -> bool:
        return 0 <= u < len(owner[pi]) and owner[pi][u] == _FREE

    def free_after(pi: int, u: int) -> bool:
        if (pi, u) in chosen:
            return False
        return free_before(pi, u) or (pi, u) in mine

    touched = {(pi, u + d) for pi, u in chosen ^ mine for d in (0, 1)}
    delta = 0
    for pi, u in touched:
        if u >= len(owner[pi]):
            continue
        before = free_before(pi, u) and not free_before(pi, u - 1)
        after = free_after(pi, u) and not free_after(pi, u - 1)
        delta += after - before
    return delta


@gc_paused()
def pack(g: Geometry, deadline: float | None = None) -> PhysicalPlan:
    """kvgrant's packed plan for ``g`` (see the module docstring for the method).

    ``deadline`` (a :func:`time.perf_counter` reading, for ``kvgrant plan
    --time-limit`` only) stops the packer at its next step past it with the best
    arrangement so far; without it every limit is a count."""
    reference = reference_plan(g)
    starts = {"declared": list(g.aliases),
              "reference": [a for a in reference.allocations if a.aliased]}
    plan = None
    # the declared start without stealing is the weakest mode; it is left out to keep
    # published-scale planning well under a second
    modes = [("declared", True), ("reference", False), ("reference", True)]
    for name, steal in modes:
        if plan is not None and _past(deadline):
            break
        start = starts[name]
        try:
            how = "taking later rows' granules" if steal else "keeping reservations"
            cand = finish_plan(g, "packed", _pack_units(g, start, steal),
                               notes=(f"packed from the {name} arrangement, {how}",))
        except _Infeasible:  # pragma: no cover - defensive: declared units always fit
            continue
        if plan is None or len(cand.allocations) < len(plan.allocations):
            plan = cand
    if plan is None:  # pragma: no cover - defensive
        return PhysicalPlan("packed", g, reference.allocations,
                            ("packer gave up; reference arrangement used",))
    if not _past(deadline):
        swapped = finish_plan(g, "packed", _exchange(g, [a for a in plan.allocations
                                                         if a.aliased], deadline=deadline),
                              notes=plan.notes + ("then granules exchanged between rows",))
        if len(swapped.allocations) < len(plan.allocations) and not check_contract(g, swapped):
            plan = swapped
    if check_contract(g, plan):  # pragma: no cover - defensive
        return PhysicalPlan("packed", g, reference.allocations,
                            ("packer result broke the contract; reference arrangement used",))
    if len(plan.allocations) > len(reference.allocations):
        return PhysicalPlan("packed", g, reference.allocations,
                            ("reference arrangement needed fewer allocations",))
    return plan


class _Infeasible(Exception):
    pass


def _past(deadline: float | None) -> bool:
    return deadline is not None and time.perf_counter() >= deadline


def _pack_units(g: Geometry, start: list, steal: bool = False) -> list[Allocation]:
    """Packed aliased units, starting from ``start`` (chunks with the declared
    conflict sets: the declared aliases or the reference rule's aliased allocations).

    Each unpacked row holds a *reservation*: granules that back its interior validly
    (at first its starting granules). With ``steal``, a row may also take granules
    reserved by a later row, provided that row's reservation can be repaired from
    free eligible granules (checked before the choice is made), so every row keeps a
    valid fallback and packing never gets stuck.
    """
    G = g.granularity
    pl = _Planes([p.name for p in g.planes], [p.bytes_per_page for p in g.planes],
                 [g.plane_bytes(p.name) // G for p in g.planes], g.pages, G)
    owner = [[_FREE] * n for n in pl.units]
    want = declared_conflict_ranges(g)

    # starting map, interior spans of rows, straddling granules; then reservations
    lay = _layout(g, pl, start)
    rows, assign, fixed_js = lay.rows, lay.assign, lay.fixed_js
    fixed_allocs = lay.fixed_allocs
    for pi, u in lay.fixed:
        owner[pi][u] = _TAKEN
    res: list[set[tuple[int, int]]] = []
    for rid, (region, _, js, je) in enumerate(rows):
        units = lay.decl[region]
        res.append({units[j] for j in range(js, je)})
        for j in range(js, je):
            pi, u = units[j]
            owner[pi][u] = rid
    fixed_pages = conflict_ranges(g, fixed_allocs)

    def eligible_runs(rid: int, usable) -> list[Run]:
        region, k, _, _ = rows[rid]
        out: list[Run] = []
        for pi in range(len(pl.names)):
            for a, b in want[(region, k)]:
                u0, u1 = pl.eligible(pi, a, b)
                u1 = min(u1, pl.units[pi])
                run_start = None
                for u in range(u0, u1):
                    ok = usable(owner[pi][u])
                    if ok and run_start is None:
                        run_start = u
                    elif not ok and run_start is not None:
                        out.append((pi, run_start, u - run_start))
                        run_start = None
                if run_start is not None:
                    out.append((pi, run_start, u1 - run_start))
        return out

    def covers(rid: int, units) -> bool:
        region, k, _, _ = rows[rid]
        total = sum(b - a for a, b in want[(region, k)])
        runs = _runs(list(units))
        return _covered(list(fixed_pages[(region, k)]) + _pages_of(pl, runs)) == total

    def repair(j: int, lost: set, gone: set, freed: set) -> set | None:
        """New reservation for row j after losing ``lost``; may use free units and
        ``freed`` (not in ``gone``). None when no valid one is found."""
        keep = res[j] - lost
        region, k, s, e = rows[j]
        short = (e - s) - len(keep)
        spare = [(pi, u + d) for pi, u, n in eligible_runs(j, lambda o: o == _FREE)
                 for d in range(n)]
        spare += sorted(x for x in freed if x not in keep and _is_eligible(pl, want[(region, k)], x))
        spare = [x for x in dict.fromkeys(spare) if x not in gone]
        for order in (sorted(spare), sorted(spare, reverse=True)):
            pick = keep | set(order[:short])
            if len(order) >= short and covers(j, pick):
                return pick
        return None

    for rid, (region, k, s, e) in enumerate(rows):
        need = e - s
        mine = set(res[rid])
        link_start = assign[region][s - 1] if s > 0 else None
        link_end = None
        if e < len(assign[region]) and assign[region][e][0] >= 0:
            link_end = assign[region][e]

        usable = (lambda o, rid=rid: o == _FREE or o == rid or o > rid) if steal else \
                 (lambda o, rid=rid: o == _FREE or o == rid)
        avail = eligible_runs(rid, usable)

        first = last = None
        if link_start is not None:
            tgt = (link_start[0], link_start[1] + 1)
            for pi, u, n in avail:
                if pi == tgt[0] and u <= tgt[1] < u + n:
                    first = (pi, tgt[1], u + n - tgt[1])
                    avail = [x for x in avail if x != (pi, u, n)]
                    if tgt[1] > u:
                        avail.append((pi, u, tgt[1] - u))
                    break
        if link_end is not None:
            tgt_end = link_end[1]  # a run ending right before this unit
            for pi, u, n in avail:
                if pi == link_end[0] and u < tgt_end <= u + n:
                    last = (pi, u, tgt_end - u)
                    avail = [x for x in avail if x != (pi, u, n)]
                    if tgt_end < u + n:
                        avail.append((pi, tgt_end, u + n - tgt_end))
                    break

        candidates: list[list[Run]] = []
        for f, l in ((first, last), (first, None), (None, last), (None, None)):
            for suffix in (False, True):
                pool = avail + [x for x in (first, last) if x is not None and x not in (f, l)]
                c = _take(pool, need, f, l, suffix)
                if c is not None:
                    candidates.append(c)
        candidates.append(_runs(list(mine)))

        best = None
        for c in candidates:
            units = {(pi, u + d) for pi, u, n in c for d in range(n)}
            if not covers(rid, units):
                continue
            repairs: dict[int, set] = {}
            stolen = [x for x in units if owner[x[0]][x[1]] >= 0 and owner[x[0]][x[1]] != rid]
            if stolen:
                by_row: dict[int, set] = {}
                for x in stolen:
                    by_row.setdefault(owner[x[0]][x[1]], set()).add(x)
                gone = set(units)
                freed = mine - units
                for j in sorted(by_row):
                    fixed = repair(j, by_row[j], gone, freed)
                    if fixed is None:
                        break
                    repairs[j] = fixed
                    gone |= fixed
                if len(repairs) != len(by_row):
                    continue
            order, pieces = _arrange(_runs(list(units)), link_start, link_end)
            score = (pieces + _gap_delta(owner, units, mine), len(order))
            if best is None or score < best[0]:
                best = (score, order, repairs)
        if best is None:  # pragma: no cover - the reservation always qualifies
            raise _Infeasible(f"row {k} of region {region!r}")
        _, order, repairs = best
        for pi, u in mine:
            owner[pi][u] = _FREE
        for j, units in repairs.items():
            for pi, u in res[j]:
                if owner[pi][u] == j:
                    owner[pi][u] = _FREE
            res[j] = units
            for pi, u in units:
                owner[pi][u] = j
        j = s
        for pi, u, n in order:
            for d in range(n):
                assign[region][j] = (pi, u + d)
                owner[pi][u + d] = _TAKEN
                j += 1

    row_units = [{assign[region][j] for j in range(s, e)} for region, _, s, e in rows]
    if _improve_pairs(pl, rows, row_units, owner, covers,
                      lambda rid: [pl.eligible(pi, a, b) for pi in range(len(pl.names))
                                   for a, b in want[rows[rid][:2]]]):
        for rid, (region, k, s, e) in enumerate(rows):  # arrange again, in row order
            link_start = assign[region][s - 1] if s > 0 else None
            link_end = assign[region][e] if (region, e) in fixed_js else None
            order, _ = _arrange(_runs(list(row_units[rid])), link_start, link_end)
            j = s
            for pi, u, n in order:
                for d in range(n):
                    assign[region][j] = (pi, u + d)
                    j += 1

    out = []
    for r in g.regions:
        for j, (pi, u) in enumerate(assign[r.name]):
            out.append(Allocation(pl.names[pi], u * G, G, r.name, j * G))
    return out


MAX_RESPLIT_STATES = 400_000
"""Largest ``(granules of row a + 1) * (granules of row b + 1) * planes`` of a pair of
rows that :func:`_improve_pairs` re-splits; larger pairs keep their granules (the
re-split only improves a valid plan). A count of the geometry, never a clock. Why:
the dynamic programme's work grows with it times the stretch lengths; two rows of a
40-plane layout at G = 64 bytes (2,766,760) ran for minutes. The examples and the
benchmark family stay under about 31,000."""


def _improve_pairs(pl: _Planes, rows, row_units: list[set], owner, covers, eligible,
                   sweeps: int = 2) -> bool:
    """Re-split the granules of each pair of consecutive rows, plane by plane.

    In each plane the two rows' granules plus free granules eligible for either form
    one stretch; the first row takes a prefix and the second a suffix. A small dynamic
    programme over planes picks the prefix and suffix lengths that give each row its
    granule count with the fewest non-empty parts; the result is kept only when both
    rows still touch exactly their conflict sets and the number of runs drops.
    """
    changed = False
    nplanes = len(pl.names)
    sets: dict[int, list[set[int]]] = {}

    def elig_sets(rid: int) -> list[set[int]]:
        if rid not in sets:
            ranges = eligible(rid)
            sets[rid] = [_plane_set(ranges, pi, nplanes) for pi in range(nplanes)]
        return sets[rid]

    for _ in range(sweeps):
        for a in range(len(rows) - 1):
            b = a + 1
            if rows[a][0] != rows[b][0]:
                continue
            ea, eb = elig_sets(a), elig_sets(b)
            na, nb = len(row_units[a]), len(row_units[b])
            if (na + 1) * (nb + 1) * nplanes > MAX_RESPLIT_STATES:
                continue  # the programme's states (and loops) would be too many
            stretches = []
            ok = True
            for pi in range(nplanes):
                mine = sorted(u for p2, u in row_units[a] | row_units[b] if p2 == pi)
                elig_a, elig_b = ea[pi], eb[pi]
                lo = min(mine) if mine else None
                hi = max(mine) + 1 if mine else None
                for u in sorted(elig_a | elig_b):
                    if owner[pi][u] == _FREE:
                        lo = u if lo is None else min(lo, u)
                        hi = u + 1 if hi is None else max(hi, u + 1)
                if lo is None:
                    stretches.append(None)
                    continue
                units = list(range(lo, hi))
                if any(not ((pi, u) in row_units[a] or (pi, u) in row_units[b]
                            or owner[pi][u] == _FREE) for u in units):
                    ok = False
                    break
                max_x = 0
                while max_x < len(units) and units[max_x] in elig_a:
                    max_x += 1
                max_y = 0
                while max_y < len(units) and units[-1 - max_y] in elig_b:
                    max_y += 1
                free = sum(owner[pi][u] == _FREE for u in units)
                stretches.append((lo, len(units), max_x, max_y, free))
            if not ok:
                continue
            # dp over planes: state (taken by a, taken by b) -> cost; layers keep the
            # back-pointers (previous state, (x, y)) for the reconstruction
            dp: dict[tuple[int, int], int] = {(0, 0): 0}
            layers: list[dict[tuple[int, int], tuple[tuple[int, int], tuple[int, int]]]] = []
            for st in stretches:
                back: dict[tuple[int, int], tuple[tuple[int, int], tuple[int, int]]] = {}
                if st is None:
                    layers.append({k: (k, (0, 0)) for k in dp})
                    continue
                lo, length, max_x, max_y, free = st
                new: dict[tuple[int, int], int] = {}
                for (sa, sb), cost in dp.items():
                    for x in range(0, min(max_x, na - sa) + 1):
                        top = min(max_y, nb - sb, length - x)
                        cx = cost + (x > 0)
                        for y in range(max(0, length - x - free), top + 1):
                            key = (sa + x, sb + y)
                            c = cx + (y > 0)
                            if c < new.get(key, 1 << 30):
                                new[key] = c
                                back[key] = ((sa, sb), (x, y))
                dp = new
                layers.append(back)
            if (na, nb) not in dp:
                continue
            cost = dp[(na, nb)]
            choice = []
            key = (na, nb)
            for back in reversed(layers):
                key, xy = back[key]
                choice.append(xy)
            choice.reverse()
            old = len(_runs(list(row_units[a]))) + len(_runs(list(row_units[b])))
            if cost >= old:
                continue
            new_a, new_b = set(), set()
            for pi, (st, (x, y)) in enumerate(zip(stretches, choice)):
                if st is None:
                    continue
                lo, length = st[0], st[1]
                new_a.update((pi, lo + d) for d in range(x))
                new_b.update((pi, lo + length - 1 - d) for d in range(y))
            if not (covers(a, new_a) and covers(b, new_b)):
                continue
            for pi, u in row_units[a] | row_units[b]:
                owner[pi][u] = _FREE
            for pi, u in new_a | new_b:
                owner[pi][u] = _TAKEN
            row_units[a], row_units[b] = new_a, new_b
            changed = True
    return changed


def _plane_set(ranges: list[tuple[int, int]], pi: int, nplanes: int) -> set[int]:
    """Granules of plane ``pi`` from the per-(plane, component) ranges list."""
    per = len(ranges) // nplanes
    out: set[int] = set()
    for u0, u1 in ranges[pi * per:(pi + 1) * per]:
        out.update(range(u0, u1))
    return out


def _is_eligible(pl: _Planes, comps, x: tuple[int, int]) -> bool:
    pi, u = x
    for a, b in comps:
        u0, u1 = pl.eligible(pi, a, b)
        if u0 <= u < u1:
            return True
    return False



@dataclass
class _Facts:
    """Facts :func:`_exchange` needs, fixed for one geometry."""

    pl: _Planes
    rows: list[tuple[str, int, int, int]]  # (region, row, first interior unit, end)
    elig: list[list[list[tuple[int, int]]]]  # row -> plane -> eligible unit ranges
    fixed: list[set[int]]  # plane -> units held by straddling region units
    fixed_pages: dict[tuple[str, int], tuple[tuple[int, int], ...]]
    assign: dict[str, list[tuple[int, int]]]  # straddling units already placed
    fixed_js: set[tuple[str, int]]


def _facts(g: Geometry) -> _Facts:
    """Rows' interior spans, eligible granules and the straddling units (kept as
    declared, as in :func:`_pack_units`)."""
    G = g.granularity
    pl = _Planes([p.name for p in g.planes], [p.bytes_per_page for p in g.planes],
                 [g.plane_bytes(p.name) // G for p in g.planes], g.pages, G)
    want = declared_conflict_ranges(g)
    lay = _layout(g, pl, list(g.aliases))
    rows, assign, fixed_js, fixed_allocs = lay.rows, lay.assign, lay.fixed_js, lay.fixed_allocs
    fixed: list[set[int]] = [set() for _ in pl.names]
    for pi, u in lay.fixed:
        fixed[pi].add(u)
    elig: list[list[list[tuple[int, int]]]] = []
    for rid, (region, k, _, _) in enumerate(rows):
        per = []
        for pi in range(len(pl.names)):
            rs = []
            for a, b in want[(region, k)]:
                u0, u1 = pl.eligible(pi, a, b)
                u1 = min(u1, pl.units[pi])
                if u0 < u1:
                    rs.append((u0, u1))
            per.append(rs)
        elig.append(per)
    return _Facts(pl, rows, elig, fixed, conflict_ranges(g, fixed_allocs), assign, fixed_js)


def _exchange(g: Geometry, allocs: list[Allocation], max_tries: int = 80000,
              deadline: float | None = None) -> list[Allocation]:
    """Improve a packed arrangement by exchanging granules between rows.

    Why: the row-by-row packer decides each row with only its neighbours in view, so
    two rows often each hold a stray granule that would extend the other's run. An
    exchange gives granule y (which extends one of row a's runs) to row a, and one of
    row a's granules x to y's owner b (a row, or the non-aliased pool). Both rows keep
    their granule counts, so the exchange is always feasible; it is made only when x
    and y are eligible for their new rows, both rows still touch every page of their
    conflict sets, and the number of runs (pieces plus non-aliased gaps, counted along
    each plane) does not grow; exchanges that keep it are taken at random (seeded), to
    walk across plateaus, and the best arrangement seen is kept. Rounds repeat until one
    finds no improvement (after the fourth) or ``max_tries`` exchanges were tried: a
    count, not a clock, so every rank computes the same plan. The input comes back
    unchanged when the finished plan would not be smaller or equal.
    """
    sw = _facts(g)
    pl = sw.pl
    G = g.granularity
    nplanes = len(pl.names)
    pidx = {n: i for i, n in enumerate(pl.names)}
    owner = [[_FREE] * n for n in pl.units]
    for p in range(nplanes):
        for u in sw.fixed[p]:
            owner[p][u] = _TAKEN
    where: dict[str, list[tuple[int, int]]] = {r.name: [] for r in g.regions}
    for r in g.regions:
        where[r.name] = [(-1, -1)] * (round_up(r.rows * r.row_bytes, G) // G)
    for a in allocs:
        if a.region is None:
            continue
        for d in range(a.length // G):
            where[a.region][a.region_offset // G + d] = (pidx[a.plane], a.plane_offset // G + d)
    for rid, (region, k, s, e) in enumerate(sw.rows):
        for j in range(s, e):
            p, u = where[region][j]
            if p < 0 or owner[p][u] != _FREE:  # pragma: no cover - not a valid plan
                return list(allocs)
            owner[p][u] = rid
    elig_sets = [[set() for _ in range(nplanes)] for _ in sw.rows]
    for rid in range(len(sw.rows)):
        for p in range(nplanes):
            for u0, u1 in sw.elig[rid][p]:
                elig_sets[rid][p].update(range(u0, u1))
    pages_of = [[pl.run_pages(p, u, 1) for u in range(pl.units[p])] for p in range(nplanes)]
    touch: list[dict[int, int]] = []
    for rid, (region, k, _, _) in enumerate(sw.rows):
        cnt: dict[int, int] = {}
        for a, b in sw.fixed_pages[(region, k)]:
            for q in range(a, b):
                cnt[q] = cnt.get(q, 0) + (1 << 20)  # straddling pages never go away
        touch.append(cnt)
    for p in range(nplanes):
        for u, o in enumerate(owner[p]):
            if o >= 0 and pages_of[p][u] is not None:
                for q in range(*pages_of[p][u]):
                    touch[o][q] = touch[o].get(q, 0) + 1

    def delta(p: int, u: int, old: int, new: int) -> int:
        """Change in runs when unit (p, u) passes from ``old`` to ``new``."""
        row = owner[p]
        lo = row[u - 1] if u > 0 else None
        hi = row[u + 1] if u + 1 < len(row) else None
        d = 0
        # old loses u
        d += (lo == old and hi == old) - (lo != old and hi != old)
        # new gains u
        d += (lo != new and hi != new) - (lo == new and hi == new)
        return d

    def can_lose(o: int, p: int, u: int) -> bool:
        if o < 0 or pages_of[p][u] is None:
            return True
        t = touch[o]
        return all(t.get(q, 0) > 1 for q in range(*pages_of[p][u]))

    def move(p: int, u: int, new: int) -> None:
        old = owner[p][u]
        rng = pages_of[p][u]
        if rng is not None:
            for q in range(*rng):
                if old >= 0:
                    touch[old][q] -= 1
                if new >= 0:
                    touch[new][q] = touch[new].get(q, 0) + 1
        owner[p][u] = new

    def eligible(o: int, p: int, u: int) -> bool:
        return o < 0 or u in elig_sets[o][p]

    def apply(moves: list[tuple[int, int, int]]) -> int | None:
        """Make the moves (plane, unit, new owner) in turn; return the change in runs,
        or undo them all and return None when one is not allowed."""
        done: list[tuple[int, int, int]] = []
        total = 0
        for p, u, new in moves:
            old = owner[p][u] if 0 <= u < len(owner[p]) else _TAKEN
            if old == _TAKEN or old == new or not eligible(new, p, u) or not can_lose(old, p, u):
                for q, v, o in reversed(done):
                    move(q, v, o)
                return None
            total += delta(p, u, old, new)
            move(p, u, new)
            done.append((p, u, old))
        return total

    def undo(moves: list[tuple[int, int, int]], olds: list[int]) -> None:
        for (p, u, _), o in zip(reversed(moves), reversed(olds)):
            move(p, u, o)

    def exchanges() -> list[list[tuple[int, int, int]]]:
        """Candidate exchanges from the current arrangement: owner a hands the end
        of one run to b where it joins b's run, and takes as many units from the end
        of a b run that touches an a run (plane by plane, runs in plane order)."""
        gives: dict[tuple[int, int], list[tuple[int, int, int, int]]] = {}
        for p in range(nplanes):
            runs_p: list[list[int]] = []
            for u, o in enumerate(owner[p]):
                if runs_p and runs_p[-1][0] == o:
                    runs_p[-1][2] += 1
                else:
                    runs_p.append([o, u, 1])
            for (o1, _, n1), (o2, s2, n2) in zip(runs_p, runs_p[1:]):
                if _TAKEN in (o1, o2):
                    continue
                gives.setdefault((o1, o2), []).append((p, s2 - 1, -1, n1))
                gives.setdefault((o2, o1), []).append((p, s2, 1, n2))
        out = []
        for (a, b), mine in gives.items():
            if a < 0:
                continue
            for p, u, step, n in mine:
                for q, v, step2, m in gives.get((b, a), []):
                    if (q, v) == (p, u):
                        continue
                    for size in sorted({min(n, m), n, m}):
                        if size <= n and size <= m:
                            out.append([(p, u + step * d, b) for d in range(size)]
                                       + [(q, v + step2 * d, a) for d in range(size)])
        return out

    rng = random.Random(0)
    best_owner = [list(r) for r in owner]
    score = best = 0
    rounds = tries = 0
    while tries < max_tries:
        rounds += 1
        cands = exchanges()
        rng.shuffle(cands)
        changed = False
        for moves in cands:
            tries += 1
            if tries > max_tries or (tries % 256 == 0 and _past(deadline)):
                tries = max_tries  # (a deadline ends the rounds too)
                break
            if not all(0 <= y < len(owner[x]) for x, y, _ in moves):
                continue
            olds = [owner[x][y] for x, y, _ in moves]
            half = len(moves) // 2
            # stale candidates (an earlier exchange moved one of its units) are skipped
            a, b = moves[half][2], moves[0][2]
            if any(o != a for o in olds[:half]) or any(o != b for o in olds[half:]):
                continue
            d = apply(moves)
            if d is None:
                continue
            if d < 0 or (d == 0 and rng.random() < 0.5):
                score += d
                changed = changed or d < 0
                if score < best:
                    best = score
                    best_owner = [list(r) for r in owner]
            else:
                undo(moves, olds)
        if not changed and rounds > 3:
            break
    for p in range(nplanes):
        for u, o in enumerate(best_owner[p]):
            if owner[p][u] != o:
                move(p, u, o)

    # lay each row's granules out again, in region order, linking to straddling units
    chosen: dict[int, list[tuple[int, int]]] = {rid: [] for rid in range(len(sw.rows))}
    for p in range(nplanes):
        for u, o in enumerate(owner[p]):
            if o >= 0:
                chosen[o].append((p, u))
    assign = {name: list(v) for name, v in sw.assign.items()}
    rank = {r.name: i for i, r in enumerate(g.regions)}
    for rid in sorted(range(len(sw.rows)), key=lambda i: (rank[sw.rows[i][0]], sw.rows[i][2])):
        region, k, s, e = sw.rows[rid]
        link_start = assign[region][s - 1] if s > 0 else None
        link_end = assign[region][e] if (region, e) in sw.fixed_js else None
        order, _ = _arrange(_runs(chosen[rid]), link_start, link_end)
        j = s
        for p, u, n in order:
            for d in range(n):
                assign[region][j] = (p, u + d)
                j += 1
    out = [Allocation(pl.names[p], u * G, G, r.name, j * G)
           for r in g.regions for j, (p, u) in enumerate(assign[r.name])]
    # Runs along the planes are the search's proxy; the plan's allocations also depend
    # on how the rows are laid out again and merged across row boundaries, so the
    # result is kept only when the finished plan is no larger than the input's.
    if len(finish_plan(g, "after", out).allocations) > \
            len(finish_plan(g, "before", allocs).allocations):
        return list(allocs)
    return out
