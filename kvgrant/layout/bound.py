"""A lower bound on allocations per rank that holds for ANY plan keeping the contract.

Why: "the packer saves N allocations" means little without knowing how many are
unavoidable. This bound is computed from the geometry and the declared conflict sets
only (never from a plan or the packer), so packed / bound measures the packer.
The proof is in ``docs/layout.md`` ("Lower bound"); in short:

* An aliased allocation is one plane-contiguous and region-contiguous run, so its
  bytes inside one row touch one interval of pages, lying in one connected component
  of that row's conflict set. Inside a row, the bytes a plane can give from a
  component X are at most ``|X| * bytes_per_page`` (plus the plane's tail past its
  last page, when X holds the last page). So row k needs at least ``m_k``
  allocation-in-row incidences: one per component, and enough of the largest
  (component, plane) capacities to hold ``row_bytes``.
* An allocation touching ``j`` rows crosses ``j - 1`` row boundaries and each boundary
  is crossed by at most one allocation, so allocations of a region are at least
  ``sum_k m_k - (boundaries that some allocation could cross)``. A boundary can be
  crossed only where the last page before it (row k) and the first after it
  (row k+1) can be the same page or neighbours, or through a plane's tail.
* Pages in no conflict set back no region byte in any plane, so when such pages exist
  every plane keeps at least one non-aliased allocation; otherwise the non-aliased
  bytes need at least as many planes as the fewest largest planes holding them.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from kvgrant.layout.conflicts import conflict_ranges
from kvgrant.layout.geometry import Geometry, round_up

__all__ = ["LowerBound", "RegionBound", "allocation_lower_bound"]


@dataclass(frozen=True)
class RegionBound:
    """Bound on the aliased allocations of one region.

    ``incidences`` is ``sum_k m_k``; ``crossable`` the number of row boundaries some
    allocation could cross; ``pieces = max(1, incidences - crossable)``.
    """

    region: str
    incidences: int
    crossable: int
    pieces: int
    per_row: tuple[int, ...] = field(repr=False, default=())


@dataclass(frozen=True)
class LowerBound:
    """Allocations per rank that any contract-keeping plan needs at least.

    ``total = max(aliased + unaliased, planes)``.
    """

    total: int
    aliased: int
    unaliased: int
    planes: int
    free_pages: int
    regions: tuple[RegionBound, ...]

    def to_json(self) -> dict[str, object]:
        return {"total": self.total, "aliased": self.aliased, "unaliased": self.unaliased,
                "planes": self.planes, "free_pages": self.free_pages,
                "regions": {r.region: {"pieces": r.pieces, "incidences": r.incidences,
                                       "crossable": r.crossable} for r in self.regions}}


def _components(ranges: tuple[tuple[int, int], ...]) -> list[tuple[int, int]]:
    """Connected page intervals of a conflict set (its merged ranges)."""
    return list(ranges)


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


def _exclusive_pages(rows: list[tuple[tuple[int, int], ...]], counts: dict[int, int]) -> list[int]:
    """Per row, how many of its pages are in no other row's conflict set."""
    return [sum(1 for a, b in rs for p in range(a, b) if counts[p] == 1) for rs in rows]


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


def allocation_lower_bound(g: Geometry) -> LowerBound:
    """Lower bound on allocations per rank for any plan keeping the layout contract.

    Computed from the geometry and declared conflict sets only (independent of the
    packer). See the module docstring and ``docs/layout.md`` for the argument.
    """
    G = g.granularity
    conflicts = conflict_ranges(g, g.aliases)
    tails = [g.plane_bytes(p.name) - g.pages * p.bytes_per_page for p in g.planes]
    counts: dict[int, int] = {}
    for ranges in conflicts.values():
        for a, b in ranges:
            for p in range(a, b):
                counts[p] = counts.get(p, 0) + 1
    row_bytes_total = sum(r.rows * r.row_bytes for r in g.regions)
    budget = (len(counts) * sum(p.bytes_per_page for p in g.planes) + sum(tails)
              - row_bytes_total)
    all_rows = [conflicts[(r.name, k)] for r in g.regions for k in range(r.rows)]
    base = [_row_incidences(g, list(rs), r.row_bytes)
            for r in g.regions for rs in (conflicts[(r.name, k)] for k in range(r.rows))]
    per_row_all = _drop_budget_bound(g, base, _exclusive_pages(all_rows, counts), budget)
    regions: list[RegionBound] = []
    at = 0
    for r in g.regions:
        rows = all_rows[at:at + r.rows]
        per_row = per_row_all[at:at + r.rows]
        at += r.rows
        page_cross = sum(_crossable(g, rows[k], rows[k + 1]) for k in range(r.rows - 1))
        others = r.rows - 1 - page_cross
        # crossings through a plane's tail: the tail lies in the plane's last unit,
        # which backs one region unit, which holds at most G // row_bytes + 1 boundaries
        tail_cross = sum(G // r.row_bytes + 1 for t in tails if t > 0)
        crossable = page_cross + min(others, tail_cross)
        incid = sum(per_row)
        regions.append(RegionBound(r.name, incid, crossable, max(1, incid - crossable),
                                   tuple(per_row)))
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
    unaliased = max(forced, by_bytes)
    total = max(aliased + unaliased, len(g.planes))
    return LowerBound(total, aliased, unaliased, len(g.planes), free_pages, tuple(regions))
