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
* The starting arrangement is the declared layout and, separately, the reference
  rule's arrangement (so the reference rule's swaps are available too); the better
  result is kept.
* Rows are packed in order. Each row may use its own declared units and any plane
  unit the declared layout leaves unaliased; units declared for a later row stay
  reserved for it, so every row can always fall back to its declared units.
* Per row a few candidate choices are tried (longest eligible runs first, the run
  that continues the previous unit in plane order first, the run that leads into
  the next fixed unit last; the declared units as fallback); the valid candidate with
  the fewest pieces wins.

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
        if r_is(last, (pi, u, n)) and k < n:
            picked.append((pi, u + n - k, k))  # keep the end that leads into the next unit
        elif r_is(first, (pi, u, n)) or not suffix:
            picked.append((pi, u, k))
        else:
            picked.append((pi, u + n - k, k))
        left -= k
    return picked if left == 0 else None


def r_is(a: Run | None, b: Run) -> bool:
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
    for name, start in starts.items():
        try:
            cand = finish_plan(g, "packed", _pack_units(g, start),
                               notes=(f"packed from the {name} arrangement",))
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


def _pack_units(g: Geometry, start: list, reserve: bool = True) -> list[Allocation]:
    """Packed aliased units, starting from ``start`` (chunks with the declared
    conflict sets: the declared aliases or the reference rule's aliased allocations)."""
    G = g.granularity
    pl = _Planes([p.name for p in g.planes], [p.bytes_per_page for p in g.planes],
                 [g.plane_bytes(p.name) // G for p in g.planes], g.pages, G)
    pidx = {n: i for i, n in enumerate(pl.names)}
    owner = [[_FREE] * n for n in pl.units]
    want = conflict_ranges(g, g.aliases)

    # declared map: region unit -> plane unit
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
    rid = 0
    row_ids: dict[tuple[str, int], int] = {}
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
                fixed_allocs.append(Allocation(pl.names[pi], u * G, G, r.name, j * G))
        for k in sorted(inner):
            js = inner[k]
            row_ids[(r.name, k)] = rid
            rows.append((r.name, k, js[0], js[-1] + 1))
            for j in js:
                pi, u = units[j]
                owner[pi][u] = rid if reserve else _FREE
            rid += 1
    fixed_pages = conflict_ranges(g, fixed_allocs)

    for rid, (region, k, s, e) in enumerate(rows):
        C = want[(region, k)]
        total = sum(b - a for a, b in C)
        need = e - s
        declared_units = [decl[region][j] for j in range(s, e)]
        link_start = assign[region][s - 1] if s > 0 else None
        link_end = None
        if e < len(assign[region]) and assign[region][e][0] >= 0:
            link_end = assign[region][e]

        # available eligible runs
        avail: list[Run] = []
        for pi in range(len(pl.names)):
            for a, b in C:
                u0, u1 = pl.eligible(pi, a, b)
                run_start = None
                for u in range(u0, min(u1, pl.units[pi])):
                    ok = owner[pi][u] == _FREE or owner[pi][u] == rid
                    if ok and run_start is None:
                        run_start = u
                    elif not ok and run_start is not None:
                        avail.append((pi, run_start, u - run_start))
                        run_start = None
                if run_start is not None:
                    avail.append((pi, run_start, min(u1, pl.units[pi]) - run_start))

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

        fixed_here = list(fixed_pages[(region, k)])
        candidates: list[list[Run]] = []
        for f, l in ((first, last), (first, None), (None, last), (None, None)):
            for suffix in (False, True):
                pool = avail + [x for x in (first, last) if x is not None and x not in (f, l)]
                c = _take(pool, need, f, l, suffix)
                if c is not None:
                    candidates.append(c)
        if all(owner[pi][u] in (rid, _FREE) for pi, u in declared_units):
            candidates.append(_runs(declared_units))

        best: tuple[tuple[int, int], list[Run]] | None = None
        mine = set(declared_units)
        for c in candidates:
            if _covered(fixed_here + _pages_of(pl, c)) != total:
                continue
            units = {(pi, u + d) for pi, u, n in c for d in range(n)}
            c = _runs(list(units))
            order, pieces = _arrange(c, link_start, link_end)
            score = (pieces + _gap_delta(owner, units, mine), len(order))
            if best is None or score < best[0]:
                best = (score, order)
        if best is None:  # pragma: no cover - the declared units always qualify
            raise _Infeasible(f"row {k} of region {region!r}")
        j = s
        for pi, u, n in best[1]:
            for d in range(n):
                assign[region][j] = (pi, u + d)
                owner[pi][u + d] = _TAKEN
                j += 1
        for pi, u in declared_units:
            if owner[pi][u] == rid:
                owner[pi][u] = _FREE

    out = []
    for r in g.regions:
        for j, (pi, u) in enumerate(assign[r.name]):
            out.append(Allocation(pl.names[pi], u * G, G, r.name, j * G))
    return out
