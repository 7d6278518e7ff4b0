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

The result is checked with :func:`kvgrant.layout.contract.check_contract`; if it is
not valid, or needs more allocations than the reference rule, the reference plan's
allocations are returned under the ``packed`` label with a note. So by construction
the packed plan never needs more allocations than the reference rule.
"""

from __future__ import annotations

from dataclasses import dataclass

from kvgrant.layout.conflicts import conflict_ranges
from kvgrant.layout.geometry import Geometry, round_up
from kvgrant.layout.plan import Allocation, PhysicalPlan

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


def pack(g: Geometry) -> PhysicalPlan:
    """kvgrant's packed plan for ``g`` (see the module docstring for the method)."""
    from kvgrant.layout.contract import check_contract
    from kvgrant.layout.plans import finish_plan, reference_plan

    reference = reference_plan(g)
    starts = {"declared": list(g.aliases),
              "reference": [a for a in reference.allocations if a.aliased]}
    plan = None
    # the declared start without stealing is the weakest mode; it is left out to keep
    # published-scale planning well under a second
    modes = [("declared", True), ("reference", False), ("reference", True)]
    for name, steal in modes:
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
    if check_contract(g, plan):  # pragma: no cover - defensive
        return PhysicalPlan("packed", g, reference.allocations,
                            ("packer result broke the contract; reference arrangement used",))
    if len(plan.allocations) > len(reference.allocations):
        return PhysicalPlan("packed", g, reference.allocations,
                            ("reference arrangement needed fewer allocations",))
    return plan


class _Infeasible(Exception):
    pass


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
    pidx = {n: i for i, n in enumerate(pl.names)}
    owner = [[_FREE] * n for n in pl.units]
    want = conflict_ranges(g, g.aliases)

    # starting map: region unit -> plane unit
    decl: dict[str, list[tuple[int, int]]] = {}
    for r in g.regions:
        decl[r.name] = [(-1, -1)] * (round_up(r.rows * r.row_bytes, G) // G)
    for a in start:
        off = a.region_offset if isinstance(a, Allocation) else a.offset
        pi, j0, u0 = pidx[a.plane], off // G, a.plane_offset // G
        for d in range(a.length // G):
            if j0 + d < len(decl[a.region]):
                decl[a.region][j0 + d] = (pi, u0 + d)

    # rows: interior spans; fixed units; reservations
    rows: list[tuple[str, int, int, int]] = []  # (region, row, first interior unit, end)
    fixed_allocs: list[Allocation] = []
    assign: dict[str, list[tuple[int, int]]] = {}
    res: list[set[tuple[int, int]]] = []
    fixed_js: set[tuple[str, int]] = set()  # region granules holding row boundaries
    for r in g.regions:
        R, end = r.row_bytes, r.rows * r.row_bytes
        units = decl[r.name]
        assign[r.name] = [(-1, -1)] * len(units)
        inner: dict[int, list[int]] = {}
        for j, (pi, u) in enumerate(units):
            lo, hi = j * G, (j + 1) * G
            if hi <= end and lo // R == (hi - 1) // R:
                inner.setdefault(lo // R, []).append(j)
            else:
                assign[r.name][j] = (pi, u)
                owner[pi][u] = _TAKEN
                fixed_js.add((r.name, j))
                fixed_allocs.append(Allocation(pl.names[pi], u * G, G, r.name, j * G))
        for k in sorted(inner):
            js = inner[k]
            rid = len(rows)
            rows.append((r.name, k, js[0], js[-1] + 1))
            res.append({units[j] for j in js})
            for j in js:
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
class _Sweep:
    """Facts the frontier search needs, fixed for one geometry."""

    pl: _Planes
    rows: list[tuple[str, int, int, int]]  # (region, row, first interior unit, end)
    elig: list[list[list[tuple[int, int]]]]  # row -> plane -> eligible unit ranges
    last_use: list[list[int]]  # plane -> unit -> last row (search order) eligible
    fixed: list[set[int]]  # plane -> units held by straddling region units
    fixed_pages: dict[tuple[str, int], tuple[tuple[int, int], ...]]
    want: dict[tuple[str, int], tuple[tuple[int, int], ...]]
    assign: dict[str, list[tuple[int, int]]]  # straddling units already placed
    fixed_js: set[tuple[str, int]]


def _sweep_facts(g: Geometry) -> _Sweep:
    G = g.granularity
    pl = _Planes([p.name for p in g.planes], [p.bytes_per_page for p in g.planes],
                 [g.plane_bytes(p.name) // G for p in g.planes], g.pages, G)
    pidx = {n: i for i, n in enumerate(pl.names)}
    want = conflict_ranges(g, g.aliases)
    decl: dict[str, list[tuple[int, int]]] = {
        r.name: [(-1, -1)] * (round_up(r.rows * r.row_bytes, G) // G) for r in g.regions}
    for a in g.aliases:
        pi, j0, u0 = pidx[a.plane], a.offset // G, a.plane_offset // G
        for d in range(a.length // G):
            if j0 + d < len(decl[a.region]):
                decl[a.region][j0 + d] = (pi, u0 + d)
    rows: list[tuple[str, int, int, int]] = []
    assign: dict[str, list[tuple[int, int]]] = {}
    fixed: list[set[int]] = [set() for _ in pl.names]
    fixed_allocs: list[Allocation] = []
    fixed_js: set[tuple[str, int]] = set()
    for r in g.regions:
        R, end = r.row_bytes, r.rows * r.row_bytes
        units = decl[r.name]
        assign[r.name] = [(-1, -1)] * len(units)
        inner: dict[int, list[int]] = {}
        for j, (pi, u) in enumerate(units):
            lo, hi = j * G, (j + 1) * G
            if hi <= end and lo // R == (hi - 1) // R:
                inner.setdefault(lo // R, []).append(j)
            else:
                assign[r.name][j] = (pi, u)
                fixed[pi].add(u)
                fixed_js.add((r.name, j))
                fixed_allocs.append(Allocation(pl.names[pi], u * G, G, r.name, j * G))
        for k in sorted(inner):
            rows.append((r.name, k, inner[k][0], inner[k][-1] + 1))
    # search order: by the first page of the row's conflict set (planes are consumed
    # front to back), then geometry order
    rank = {r.name: i for i, r in enumerate(g.regions)}
    rows.sort(key=lambda t: ((want[t[:2]] or ((0, 0),))[0][0], rank[t[0]], t[1]))
    elig: list[list[list[tuple[int, int]]]] = []
    last_use = [[-1] * n for n in pl.units]
    for rid, (region, k, _, _) in enumerate(rows):
        per = []
        for pi in range(len(pl.names)):
            rs = []
            for a, b in want[(region, k)]:
                u0, u1 = pl.eligible(pi, a, b)
                u1 = min(u1, pl.units[pi])
                if u0 < u1:
                    rs.append((u0, u1))
                    for u in range(u0, u1):
                        last_use[pi][u] = rid
            per.append(rs)
        elig.append(per)
    return _Sweep(pl, rows, elig, last_use, fixed, conflict_ranges(g, fixed_allocs), want,
                  assign, fixed_js)


def _window(sw: _Sweep, rid: int, pi: int, f: int) -> tuple[int, int, int]:
    """(start, length, expiring) of the run plane ``pi`` offers row ``rid`` when its
    units below ``f`` are used up: the first eligible non-straddling unit at or after
    ``f`` and the eligible non-straddling units that follow it without a break;
    ``expiring`` counts those no later row can use."""
    fx = sw.fixed[pi]
    for u0, u1 in sw.elig[rid][pi]:
        u = max(u0, f)
        while u < u1 and u in fx:
            u += 1
        if u >= u1:
            continue
        n = 0
        while u + n < u1 and (u + n) not in fx:
            n += 1
        lu = sw.last_use[pi]
        return u, n, sum(1 for d in range(n) if lu[u + d] == rid)
    return f, 0, 0


def _sweep_candidates(sw: _Sweep, rid: int, front: tuple[int, ...]
                      ) -> list[tuple[tuple[int, ...], int, int]]:
    """Candidate choices of one row from one frontier: (units per plane, pieces,
    wasted gaps). Each fills the row's need with whole windows in some plane order and
    cuts the last one; choices that do not touch exactly the row's pages are dropped."""
    region, k, s, e = sw.rows[rid]
    need = e - s
    pl = sw.pl
    wins = [_window(sw, rid, pi, f) for pi, f in enumerate(front)]
    planes = [pi for pi, (_, n, _) in enumerate(wins) if n > 0]
    if sum(wins[pi][1] for pi in planes) < need:
        return []
    total = sum(b - a for a, b in sw.want[(region, k)])
    base = list(sw.fixed_pages[(region, k)])
    orders = [
        sorted(planes, key=lambda p: (-wins[p][1], p)),
        sorted(planes, key=lambda p: (-wins[p][2], -wins[p][1], p)),
        sorted(planes, key=lambda p: (wins[p][0] * pl.G // pl.bpp[p], -wins[p][1], p)),
        sorted(planes, key=lambda p: (-(wins[p][2] > 0), -wins[p][1], p)),
        sorted(planes, key=lambda p: (-wins[p][2], -wins[p][0] * pl.G // pl.bpp[p],
                                      -wins[p][1], p)),
    ]
    expiring = [0] * len(front)
    for p in planes:
        expiring[p] = wins[p][2]
    out: dict[tuple[int, ...], tuple[int, int]] = {}
    combos = [(o, fit, False) for o in orders for fit in (False, True)]
    if 0 < sum(expiring) <= need:
        combos += [(o, fit, True) for o in orders for fit in (False, True)]
    top = max((wins[p][1] for p in planes), default=0)
    combos += [(orders[2], c, None) for c in range(1, top)]
    for order, fit, keep in combos:
        take = [0] * len(front)
        left = need
        queue = list(order)
        if keep is None:
            # balanced: at most ``fit`` units per plane, most lagging planes first
            for p in order:
                x = min(wins[p][1], fit, left)
                take[p] = x
                left -= x
            fit, queue = False, list(order)
        elif keep:
            # the expiring units are taken first; runs already started are then
            # extended (free), and only then new planes are opened
            for p in planes:
                take[p] = expiring[p]
            left -= sum(expiring)
            queue = [p for p in order if take[p]] + [p for p in order if not take[p]]
        if True:
            while left > 0 and queue:
                if fit:
                    # a window that finishes the row exactly, if one exists
                    exact = next((p for p in queue if wins[p][1] - take[p] == left), None)
                    p = exact if exact is not None else queue[0]
                else:
                    p = queue[0]
                queue.remove(p)
                x = min(wins[p][1] - take[p], left)
                take[p] += x
                left -= x
            if left:
                continue
            key = tuple(take)
            if key in out:
                continue
            runs = [(p, wins[p][0], x) for p, x in enumerate(take) if x]
            if _covered(base + _pages_of(pl, runs)) != total:
                continue
            after = tuple(wins[p][0] + x if x else front[p] for p, x in enumerate(take))
            if not _sweep_ahead(sw, rid, after):
                continue
            waste = sum(1 for p, x in enumerate(take) if x and wins[p][0] > front[p]
                        and any(u not in sw.fixed[p] for u in range(front[p], wins[p][0])))
            out[key] = (len(runs), waste)
    return [(k2, c, w) for k2, (c, w) in out.items()]


def _sweep_ahead(sw: _Sweep, rid: int, front: tuple[int, ...], depth: int = 6) -> bool:
    """Can the next ``depth`` rows still be served from the frontier ``front``?
    Necessary checks only, so the search does not walk into a dead end: together
    they find enough free eligible units, and each can still touch every page of its
    conflict set that no straddling unit touches."""
    pl = sw.pl
    stop = min(rid + 1 + depth, len(sw.rows))
    for first in range(rid + 1, stop):
        pool: set[tuple[int, int]] = set()
        needed = 0
        for nxt in range(first, stop):
            region, k, s, e = sw.rows[nxt]
            needed += e - s
            for p, f in enumerate(front):
                fx = sw.fixed[p]
                for u0, u1 in sw.elig[nxt][p]:
                    pool.update((p, u) for u in range(max(u0, f), u1) if u not in fx)
            if len(pool) < needed:
                return False
    for nxt in range(rid + 1, stop):
        region, k, _, _ = sw.rows[nxt]
        missing = _minus(sw.want[(region, k)], sw.fixed_pages[(region, k)])
        if not missing:
            continue
        reach: list[tuple[int, int]] = []
        for p, f in enumerate(front):
            fx = sw.fixed[p]
            for u0, u1 in sw.elig[nxt][p]:
                lo = max(u0, f)
                while lo < u1 and lo in fx:
                    lo += 1
                if lo < u1:
                    r = pl.run_pages(p, lo, u1 - lo)
                    if r is not None:
                        reach.append(r)
        if _covered(reach + list(missing)) != _covered(reach):
            return False
    return True


def _minus(a: tuple[tuple[int, int], ...], b: tuple[tuple[int, int], ...]) -> list[tuple[int, int]]:
    """Page ranges of ``a`` not in ``b`` (both sorted, merged)."""
    out: list[tuple[int, int]] = []
    for s, e in a:
        cur = s
        for bs, be in b:
            if be <= cur or bs >= e:
                continue
            if bs > cur:
                out.append((cur, bs))
            cur = max(cur, be)
        if cur < e:
            out.append((cur, e))
    return out


def _sweep_units(g: Geometry, width: int = 24) -> list[Allocation] | None:
    """Aliased units from a beam search over rows that consumes planes front to back.

    Why: when neighbour rows share half their pages (the published layouts), a row's
    cheapest choice depends on what earlier rows left in each plane; choosing rows one
    at a time locks every plane into the same pace, so each row needs a piece from
    nearly every plane. Here the state is a *frontier* per plane (units below it are
    used up); a row takes from a plane the run that starts at the first eligible unit
    at or after the frontier. Per row a few fill orders are tried (longest windows,
    expiring units, most lagging plane); the ``width`` cheapest states survive, so
    some planes can lag a row and later give a row a long run. Returns None when
    every state gets stuck (the other modes still stand).
    """
    sw = _sweep_facts(g)
    start = tuple(0 for _ in sw.pl.names)
    beam: dict[tuple[int, ...], tuple[int, int, tuple]] = {start: (0, 0, ())}
    for rid in range(len(sw.rows)):
        nxt: dict[tuple[int, ...], tuple[int, int, tuple]] = {}
        for front, (cost, waste, hist) in beam.items():
            for take, pieces, gaps in _sweep_candidates(sw, rid, front):
                new = tuple(_window(sw, rid, p, f)[0] + take[p] if take[p] else f
                            for p, f in enumerate(front))
                val = (cost + pieces + gaps, waste + gaps, (hist, take))
                old = nxt.get(new)
                if old is None or val[:2] < old[:2]:
                    nxt[new] = val
        if not nxt:
            return None
        beam = dict(sorted(nxt.items(), key=lambda kv: (kv[1][0], kv[1][1], kv[0]))[:width])
    _, (_, _, hist) = min(beam.items(), key=lambda kv: (kv[1][0], kv[1][1], kv[0]))
    takes: list[tuple[int, ...]] = []
    while hist:
        hist, take = hist
        takes.append(take)
    takes.reverse()
    return _sweep_build(g, sw, takes)


def _sweep_build(g: Geometry, sw: _Sweep, takes: list[tuple[int, ...]]) -> list[Allocation]:
    """Replay the chosen takes and lay each row's runs out over its interior span."""
    G = g.granularity
    front = [0] * len(sw.pl.names)
    chosen: dict[int, list[Run]] = {}
    for rid, take in enumerate(takes):
        runs = []
        for p, x in enumerate(take):
            if x:
                u, _, _ = _window(sw, rid, p, front[p])
                runs.append((p, u, x))
                front[p] = u + x
        chosen[rid] = runs
    assign = {name: list(v) for name, v in sw.assign.items()}
    by_pos = sorted(range(len(sw.rows)), key=lambda rid: (sw.rows[rid][0], sw.rows[rid][2]))
    region_rank = {r.name: i for i, r in enumerate(g.regions)}
    by_pos.sort(key=lambda rid: (region_rank[sw.rows[rid][0]], sw.rows[rid][2]))
    for rid in by_pos:
        region, k, s, e = sw.rows[rid]
        link_start = assign[region][s - 1] if s > 0 else None
        link_end = assign[region][e] if (region, e) in sw.fixed_js else None
        order, _ = _arrange(chosen[rid], link_start, link_end)
        j = s
        for pi, u, n in order:
            for d in range(n):
                assign[region][j] = (pi, u + d)
                j += 1
    return [Allocation(sw.pl.names[pi], u * G, G, r.name, j * G)
            for r in g.regions for j, (pi, u) in enumerate(assign[r.name])]
