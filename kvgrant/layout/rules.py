"""The plans every planner builds on: the naive plan, the reference rule, finish_plan.

Why a module of its own: the heuristic packer and the exact planner both start from
these and finish their aliased pieces with :func:`finish_plan`, and
:mod:`kvgrant.layout.plans` picks among all of them; keeping the base here lets every
import run one way (rules <- packer, exact <- planner <- plans), with no cycle.
The naive plan is what the declared layout costs as-is (one allocation per declared
chunk); the reference rule is the published fix, kept as a labelled comparison.

Every plan covers each plane exactly once: aliased allocations, plus one non-aliased
allocation per maximal gap between them. Allocation order is creation order; all plans
sort by (plane in geometry order, plane offset), so the order is deterministic.
"""

from __future__ import annotations

from typing import Iterable

from kvgrant.layout.geometry import Alias, Geometry, require_geometry
from kvgrant.layout.plan import Allocation, PhysicalPlan

__all__ = ["finish_plan", "naive_plan", "reference_plan"]


def _merge_aliased(pieces: Iterable[Allocation]) -> list[Allocation]:
    """Merge aliased pieces that are contiguous in both region and plane (same plane)."""
    out: list[Allocation] = []
    for a in sorted(pieces, key=lambda a: (a.region, a.region_offset)):
        if out:
            b = out[-1]
            if (b.region == a.region and b.plane == a.plane
                    and b.region_offset + b.length == a.region_offset
                    and b.plane_offset + b.length == a.plane_offset):
                out[-1] = Allocation(b.plane, b.plane_offset, b.length + a.length,
                                     b.region, b.region_offset)
                continue
        out.append(a)
    return out


def finish_plan(g: Geometry, label: str, aliased: Iterable[Allocation], *,
                merge: bool = True, notes: tuple[str, ...] = ()) -> PhysicalPlan:
    """Turn aliased pieces into a whole plan.

    Merges pieces contiguous in plane and region (when ``merge``), adds one
    non-aliased allocation per maximal uncovered gap of each plane, and sorts by
    (plane in geometry order, plane offset) so creation order is deterministic.
    """
    pieces = _merge_aliased(aliased) if merge else list(aliased)
    order = {p.name: i for i, p in enumerate(g.planes)}
    by_plane: dict[str, list[Allocation]] = {p.name: [] for p in g.planes}
    for a in pieces:
        by_plane[a.plane].append(a)
    allocs: list[Allocation] = []
    for p in g.planes:
        cursor = 0
        size = g.plane_bytes(p.name)
        for a in sorted(by_plane[p.name], key=lambda a: a.plane_offset):
            if a.plane_offset > cursor:
                allocs.append(Allocation(p.name, cursor, a.plane_offset - cursor))
            allocs.append(a)
            cursor = max(cursor, a.plane_offset + a.length)
        if cursor < size:
            allocs.append(Allocation(p.name, cursor, size - cursor))
    allocs.sort(key=lambda a: (order[a.plane], a.plane_offset))
    return PhysicalPlan(label, g, tuple(allocs), notes)


def _as_alloc(a: Alias) -> Allocation:
    return Allocation(a.plane, a.plane_offset, a.length, a.region, a.offset)


def naive_plan(g: Geometry) -> PhysicalPlan:
    """One allocation per declared chunk, plus one per maximal non-aliased plane gap."""
    require_geometry(g, "naive_plan")
    return finish_plan(g, "naive", (_as_alloc(a) for a in g.aliases), merge=False)


def _row_span(g: Geometry, a: Alias) -> tuple[int, int] | None:
    """(region, row) position of a chunk that lies wholly inside one row, else None."""
    r = g.region_by_name[a.region]
    end = a.offset + a.length
    if end > r.rows * r.row_bytes:
        return None
    row = a.offset // r.row_bytes
    if (end - 1) // r.row_bytes != row:
        return None
    return row, a.offset


def reference_plan(g: Geometry) -> PhysicalPlan:
    """The published fix's rule, kept as a labelled comparison.

    1. A chunk is *movable* when it lies wholly inside one row; chunks crossing a row
       boundary or reaching past the last row stay where they are.
    2. Movable chunks with identical bytes per page, plane offset and length (so an
       identical page footprint) may swap planes; a swap is made when it gives a chunk
       a same-plane, plane-contiguous neighbour inside its row.
    3. Inside one row the movable chunks are reordered by (plane, plane offset) over
       the row's movable span.
    4. Chunks contiguous in both region and plane are merged.
    """
    require_geometry(g, "reference_plan")
    bpp = {p.name: p.bytes_per_page for p in g.planes}
    order = {p.name: i for i, p in enumerate(g.planes)}
    fixed: list[Allocation] = []
    rows: dict[tuple[str, int], list[Allocation]] = {}
    for a in g.aliases:
        pos = _row_span(g, a)
        if pos is None:
            fixed.append(_as_alloc(a))
        else:
            rows.setdefault((a.region, pos[0]), []).append(_as_alloc(a))

    _reference_swaps(rows, bpp)

    placed: list[Allocation] = list(fixed)
    for chunks in rows.values():
        start = min(c.region_offset for c in chunks)
        for c in sorted(chunks, key=lambda c: (order[c.plane], c.plane_offset)):
            placed.append(Allocation(c.plane, c.plane_offset, c.length, c.region, start))
            start += c.length
    return finish_plan(g, "reference", placed)


def _reference_swaps(rows: dict[tuple[str, int], list[Allocation]],
                     bpp: dict[str, int]) -> None:
    """Rule 2 in place: swap planes among chunks of one footprint class when the swap
    gives a chunk a plane-contiguous partner in its own row (greedy, deterministic)."""
    classes: dict[tuple[int, int, int], list[tuple[tuple[str, int], int]]] = {}
    for key, chunks in rows.items():
        for i, c in enumerate(chunks):
            classes.setdefault((bpp[c.plane], c.plane_offset, c.length), []).append((key, i))
    for members in classes.values():
        planes = sorted({rows[k][i].plane for k, i in members})
        if len(members) < 2 or len(planes) < 2:
            continue
        pool = sorted(rows[k][i].plane for k, i in members)
        wanted: list[tuple[tuple[str, int], int, str | None]] = []
        for k, i in sorted(members):
            c = rows[k][i]
            ends = {(o.plane, o.plane_offset + o.length) for j, o in enumerate(rows[k]) if j != i}
            starts = {(o.plane, o.plane_offset) for j, o in enumerate(rows[k]) if j != i}
            pref = next((p for p in planes if (p, c.plane_offset) in ends
                         or (p, c.plane_offset + c.length) in starts), None)
            wanted.append((k, i, pref))
        assigned: dict[tuple[tuple[str, int], int], str] = {}
        for k, i, pref in wanted:
            if pref is not None and pref in pool:
                pool.remove(pref)
                assigned[(k, i)] = pref
        for k, i, _ in wanted:
            if (k, i) not in assigned:
                cur = rows[k][i].plane
                assigned[(k, i)] = cur if cur in pool else pool[0]
                pool.remove(assigned[(k, i)])
        for (k, i), p in assigned.items():
            c = rows[k][i]
            rows[k][i] = Allocation(p, c.plane_offset, c.length, c.region, c.region_offset)
