"""Conflict sets: which KV pages back each alias-region row, byte-precise.

Why: while a snapshot occupies a row, the pages whose bytes (in any plane) back any
byte of that row cannot hold KV. The scheduler relies on these exact sets, so they
are part of the layout contract and a plan must not change them.

Everything here is interval arithmetic over (row, page) ranges, never per-byte sets,
so the published-scale layout (about 2,000 chunks) takes milliseconds.
Bytes of a plane beyond ``pages * bytes_per_page`` belong to no page; bytes of a
region beyond ``rows * row_bytes`` belong to no row.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING, Any

from kvgrant.errors import ArgumentError

if TYPE_CHECKING:
    from kvgrant.layout.geometry import Geometry

__all__ = [
    "PageRanges",
    "RowKey",
    "chunk_region_offset",
    "conflict_ranges",
    "conflict_sets",
    "declared_conflict_ranges",
    "declared_conflict_sets",
    "largest_conflict_set",
    "ranges_to_set",
]

_MISSING = object()

RowKey = tuple[str, int]
"""(region name, row index)."""

PageRanges = tuple[tuple[int, int], ...]
"""Sorted, merged, half-open page ranges ``((start, stop), ...)``."""


def chunk_region_offset(chunk: Any) -> int:
    """Region offset of a declared ``Alias`` (``offset``) or an aliased ``Allocation``
    (``region_offset``)."""
    off = getattr(chunk, "region_offset", None)
    if off is None:
        off = getattr(chunk, "offset")
    return int(off)


def _merge(ranges: list[tuple[int, int]]) -> PageRanges:
    """Sort and merge half-open ranges (touching ranges merge too)."""
    if not ranges:
        return ()
    ranges.sort()
    out: list[list[int]] = [list(ranges[0])]
    for s, e in ranges[1:]:
        last = out[-1]
        if s <= last[1]:
            if e > last[1]:
                last[1] = e
        else:
            out.append([s, e])
    return tuple((s, e) for s, e in out)


def conflict_ranges(g: "Geometry", chunks: Iterable[Any]) -> dict[RowKey, PageRanges]:
    """Like :func:`conflict_sets`, but each set as merged page ranges (the fast form).

    Every row of every region of ``g`` is a key, with ``()`` when nothing backs it.
    Chunks whose ``region`` is ``None`` (unaliased allocations) are skipped, so a
    plan's whole allocation list can be passed.
    """
    if isinstance(chunks, (str, bytes)) or not isinstance(chunks, Iterable):
        raise ArgumentError(f"chunks = {type(chunks).__name__}: must be an iterable of "
                            "aliases or allocations (each with region, plane, "
                            "plane_offset and length)", argument="chunks", value=chunks)
    regions = g.region_by_name
    planes = g.plane_by_name
    pages = g.pages
    acc: dict[RowKey, list[tuple[int, int]]] = {
        (r.name, i): [] for r in g.regions for i in range(r.rows)}
    for i, c in enumerate(chunks):
        region = getattr(c, "region", _MISSING)
        if region is None:
            continue
        if region is _MISSING:
            raise ArgumentError(f"chunks[{i}] = {c!r:.80}: not an alias or allocation (it "
                                "has no region)", argument="chunks", value=c)
        reg = regions[region]
        bpp = planes[c.plane].bytes_per_page
        start = chunk_region_offset(c)
        length = int(c.length)
        if length <= 0:
            continue
        end = min(start + length, reg.rows * reg.row_bytes)  # bytes past the rows: no row
        delta = int(c.plane_offset) - start  # plane byte = region byte + delta
        rb = reg.row_bytes
        row = start // rb
        while row * rb < end:
            s = max(start, row * rb)
            e = min(end, (row + 1) * rb)
            ps, pe = s + delta, e + delta  # plane byte range [ps, pe)
            p0 = ps // bpp
            p1 = min((pe - 1) // bpp + 1, pages)  # bytes past pages*bpp: no page
            if p0 < p1:
                acc[(region, row)].append((p0, p1))
            row += 1
    return {k: _merge(v) for k, v in acc.items()}


def ranges_to_set(ranges: PageRanges) -> frozenset[int]:
    """Expand merged page ranges to the set of page indices."""
    return frozenset(p for s, e in ranges for p in range(s, e))


def conflict_sets(g: "Geometry", chunks: Iterable[Any]) -> dict[RowKey, frozenset[int]]:
    """Map (region, row) to the exact set of KV pages backing any byte of that row.

    ``chunks`` is any iterable of objects with ``region``, ``offset`` or
    ``region_offset``, ``plane``, ``plane_offset`` and ``length`` (declared
    ``Alias`` entries or aliased ``Allocation`` entries). Every row of ``g`` is a key.
    """
    return {k: ranges_to_set(v) for k, v in conflict_ranges(g, chunks).items()}


def declared_conflict_ranges(g: "Geometry") -> Mapping[RowKey, PageRanges]:
    """``conflict_ranges(g, g.aliases)``, computed once per geometry object and
    read-only: the planners, both bounds, the contract check and the report each ask
    for it, and a region of 2^20 rows took seconds per asking."""
    return g._declared_ranges  # type: ignore[no-any-return]


def declared_conflict_sets(g: "Geometry") -> dict[RowKey, frozenset[int]]:
    """Conflict sets of the declared layout (the ones every plan must keep)."""
    return {k: ranges_to_set(v) for k, v in declared_conflict_ranges(g).items()}


def largest_conflict_set(g: "Geometry", chunks: Iterable[Any] | None = None
                         ) -> tuple[RowKey | None, int]:
    """(row, size) of the largest conflict set (declared layout by default);
    ``(None, 0)`` when the geometry has no region rows. Ties go to the first row in
    geometry order."""
    ranges = declared_conflict_ranges(g) if chunks is None else conflict_ranges(g, chunks)
    best: RowKey | None = None
    size = 0
    for key, rs in ranges.items():
        n = sum(e - s for s, e in rs)
        if best is None or n > size:
            best, size = key, n
    return best, size
