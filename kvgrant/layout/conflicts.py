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

import itertools
from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING, Any

from kvgrant.errors import ArgumentError
from kvgrant.gc_pause import gc_paused

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
    field = _OFFSET_FIELD.get(type(chunk))
    if field is None:
        field = _OFFSET_FIELD[type(chunk)] = (
            "region_offset" if hasattr(chunk, "region_offset") else "offset")
    off = getattr(chunk, field)
    if off is None:
        off = getattr(chunk, "offset")
    return int(off)


_OFFSET_FIELD: dict[type, str] = {}
"""Per chunk type, the field :func:`chunk_region_offset` reads. Why: asking a pydantic
``Alias`` for the ``region_offset`` it lacks goes through pydantic's ``__getattr__``
and an exception, about 3 us a chunk under a profiler (0.3 s of a 100,000-chunk
layout's planning there)."""


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


@gc_paused()
def conflict_ranges(g: "Geometry", chunks: Iterable[Any]) -> dict[RowKey, PageRanges]:
    """Like :func:`conflict_sets`, but each set as merged page ranges (the fast form).

    Every row of every region of ``g`` is a key, with ``()`` when nothing backs it.
    Chunks whose ``region`` is ``None`` (unaliased allocations) are skipped, so a
    plan's whole allocation list can be passed.
    """
    from kvgrant.layout.geometry import require_geometry

    require_geometry(g, "conflict_ranges")  # was: AttributeError (no region_by_name)
    if isinstance(chunks, (str, bytes)) or not isinstance(chunks, Iterable):
        raise ArgumentError(f"chunks = {type(chunks).__name__}: must be an iterable of "
                            "aliases or allocations (each with region, plane, "
                            "plane_offset and length)", argument="chunks", value=chunks)
    spans = _spans_of(g, chunks)
    if _row_pieces(g, spans) > _BULK_PIECES and _fits_int64(g, spans):
        return _ranges_numpy(g, spans)
    return _ranges_python(g, spans)


_Span = tuple[str, int, int, int, int]
"""(region, first region byte, end region byte, plane byte - region byte, bytes per page)."""


def _spans_of(g: "Geometry", chunks: Iterable[Any]) -> list[_Span]:
    """:func:`_chunk_spans`, computed once per geometry object for its declared aliases
    (read-only). Why: the declared sets are asked for as ranges and as arrays, and the
    pass over the chunks is most of either (about 0.17 s a pass at 100,000 chunks,
    under a profiler)."""
    if chunks is not g.aliases:
        return _chunk_spans(g, chunks)
    if "declared_spans" not in g._memo:
        g._memo["declared_spans"] = _chunk_spans(g, chunks)
    return g._memo["declared_spans"]  # type: ignore[no-any-return]


def _chunk_spans(g: "Geometry", chunks: Iterable[Any]) -> list[_Span]:
    """The region byte range of each aliased chunk with its plane shift, in chunk order
    (the one Python pass over the chunks; the rows are then walked in bulk)."""
    regions = g.region_by_name
    planes = g.plane_by_name
    out: list[_Span] = []
    for i, c in enumerate(chunks):
        region = getattr(c, "region", _MISSING)
        if region is None:
            continue
        if region is _MISSING:
            raise ArgumentError(f"chunks[{i}] = {c!r:.80}: not an alias or allocation (it "
                                "has no region)", argument="chunks", value=c)
        reg = regions.get(region)
        plane = planes.get(getattr(c, "plane", None))
        if reg is None or plane is None:
            which = "region" if reg is None else "plane"
            raise ArgumentError(f"chunks[{i}].{which} = {getattr(c, which)!r}: not a "
                                f"{which} of geometry {g.name!r}", argument="chunks", value=c)
        bpp = plane.bytes_per_page
        start = chunk_region_offset(c)
        if start < 0 or int(c.plane_offset) < 0:
            raise ArgumentError(f"chunks[{i}] = {c!r:.80}: region and plane offsets must be "
                                ">= 0", argument="chunks", value=c)
        length = int(c.length)
        if length <= 0:
            continue
        end = min(start + length, reg.rows * reg.row_bytes)  # bytes past the rows: no row
        if start < end:
            out.append((region, start, end, int(c.plane_offset) - start, bpp))
    return out


_INT64_SAFE = 1 << 61
_BULK_PIECES = 4096
"""(chunk, row) pieces from which the bulk walk beats the Python one (numpy's fixed
costs dominate below)."""


def _row_pieces(g: "Geometry", spans: list[_Span]) -> int:
    """How many (chunk, row) pieces the walk visits."""
    rb = {r.name: r.row_bytes for r in g.regions}
    return sum((e - 1) // rb[n] - s // rb[n] + 1 for n, s, e, _, _ in spans)


def _fits_int64(g: "Geometry", spans: list[_Span]) -> bool:
    """Whether every byte, page and row number of the bulk walk fits numpy's int64
    with room to spare (a plan file may hold any integer; then the Python walk runs)."""
    if not spans:
        return False
    rows = sum(r.rows for r in g.regions)
    row_ends = max(r.rows * r.row_bytes + r.row_bytes for r in g.regions)
    far = max(max(abs(d) + e, e) for _, _, e, d, _ in spans)
    return max(row_ends, far, (rows + 1) * (g.pages + 2)) < _INT64_SAFE


def _ranges_python(g: "Geometry", spans: list[_Span]) -> dict[RowKey, PageRanges]:
    """The row-by-row walk (any integer size)."""
    regions = g.region_by_name
    pages = g.pages
    acc: dict[RowKey, list[tuple[int, int]]] = {
        (r.name, i): [] for r in g.regions for i in range(r.rows)}
    for region, start, end, delta, bpp in spans:
        rb = regions[region].row_bytes
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


def _ranges_numpy(g: "Geometry", spans: list[_Span]) -> dict[RowKey, PageRanges]:
    """The same walk as :func:`_ranges_python`, every (chunk, row) piece at once.

    Why: a region of 2^20 rows of 16 bytes has chunks that each cross 10^5 rows, and
    the per-row Python loop took seconds per call (the contract check calls this for
    every candidate plan)."""
    keys: list[RowKey] = []
    for r in g.regions:
        keys.extend(zip(itertools.repeat(r.name), range(r.rows)))
    got = _pieces_numpy(g, spans)
    if got is None:
        return _ranges_python(g, spans)
    return _merged_rows(keys, *got, g.pages)


def conflict_range_arrays(g: "Geometry", chunks: Iterable[Any]) -> Any:
    """:func:`conflict_ranges` as three int64 arrays ``(row, start, stop)``: the merged
    ranges of every row, rows numbered in geometry order (region by region), sorted by
    row and start; rows with no range are absent. Equal arrays mean equal conflict
    sets on every row. None when the bulk walk does not apply (few pieces, or numbers
    that might not fit int64): then use :func:`conflict_ranges`.

    Why: comparing a plan's conflict sets with the declared ones row by row through
    a dict of 2^20 keys took over a second per plan (three plans per report)."""
    spans = _spans_of(g, chunks)
    if not (_row_pieces(g, spans) > _BULK_PIECES and _fits_int64(g, spans)):
        return None
    got = _pieces_numpy(g, spans)
    if got is None:
        return None
    return _merge_arrays(*got, g.pages)


def declared_conflict_arrays(g: "Geometry") -> Any:
    """:func:`conflict_range_arrays` of the declared chunks, once per geometry object
    (read-only)."""
    if "declared_arrays" not in g._memo:
        g._memo["declared_arrays"] = conflict_range_arrays(g, g.aliases)
    return g._memo["declared_arrays"]


def _pieces_numpy(g: "Geometry", spans: list[_Span]) -> Any:
    """(global row, p0, p1) of every (chunk, row) piece that touches a page, as int64
    arrays; None when a chunk starts before its region or a piece before its plane (a
    malformed chunk: the row-by-row walk then treats it as before)."""
    import numpy as np

    if any(sp[1] < 0 for sp in spans):  # a negative row would index another region's
        return None

    base = g.first_row
    rb = np.array([g.region_by_name[s[0]].row_bytes for s in spans], dtype=np.int64)
    first = np.array([base[s[0]] for s in spans], dtype=np.int64)
    start = np.array([s[1] for s in spans], dtype=np.int64)
    end = np.array([s[2] for s in spans], dtype=np.int64)
    delta = np.array([s[3] for s in spans], dtype=np.int64)
    bpp = np.array([s[4] for s in spans], dtype=np.int64)
    row0 = start // rb
    count = -(-end // rb) - row0  # rows k with k * rb < end
    which = np.repeat(np.arange(len(spans)), count)
    row = row0[which] + (np.arange(int(count.sum())) - np.repeat(np.cumsum(count) - count,
                                                                  count))
    rbw = rb[which]
    s = np.maximum(start[which], row * rbw)
    e = np.minimum(end[which], (row + 1) * rbw)
    p0 = (s + delta[which]) // bpp[which]
    p1 = np.minimum((e + delta[which] - 1) // bpp[which] + 1, g.pages)
    keep = p0 < p1
    if (p0[keep] < 0).any():  # a plane byte before the plane: only a malformed chunk
        return None
    return row[keep] + first[which][keep], p0[keep], p1[keep]


def _merge_arrays(row: Any, p0: Any, p1: Any, pages: int) -> tuple[Any, Any, Any]:
    """Per row, the union of its page ranges [p0, p1) merged as :func:`_merge` does
    (touching ranges merge): (row, start, stop) sorted by row and start."""
    import numpy as np

    if not len(row):
        return row, p0, p1
    order = np.lexsort((p0, row))
    row, p0, p1 = row[order], p0[order], p1[order]
    shift = row * (pages + 2)  # rows apart: a row's ranges never reach the next's
    reach = np.maximum.accumulate(p1 + shift)
    new = np.empty(len(row), dtype=bool)
    new[0] = True
    new[1:] = p0[1:] + shift[1:] > reach[:-1]
    at = np.flatnonzero(new)
    last = np.append(at[1:], len(row)) - 1
    return row[at], p0[at], reach[last] - shift[at]


def _merged_rows(keys: list[RowKey], row: Any, p0: Any, p1: Any,
                 pages: int) -> dict[RowKey, PageRanges]:
    """Per row, the union of its page ranges [p0, p1) merged as :func:`_merge` does
    (touching ranges merge), in the order of ``keys``."""
    import numpy as np

    out: dict[RowKey, PageRanges] = dict.fromkeys(keys, ())
    if not len(row):
        return out
    rows, lo, hi = _merge_arrays(row, p0, p1, pages)
    alone = np.ones(len(rows), dtype=bool)  # the row's only range
    alone[1:] = rows[1:] != rows[:-1]
    alone[:-1] &= rows[:-1] != rows[1:]
    # zip(zip(lo, hi)) yields ((lo, hi),): the one-range rows without a Python loop
    out.update(zip(map(keys.__getitem__, rows[alone].tolist()),
                   zip(zip(lo[alone].tolist(), hi[alone].tolist()))))
    grouped: dict[int, list[tuple[int, int]]] = {}
    for k, a, b in zip(rows[~alone].tolist(), lo[~alone].tolist(), hi[~alone].tolist()):
        grouped.setdefault(k, []).append((a, b))
    for k, rs in grouped.items():
        out[keys[k]] = tuple(rs)
    return out


def ranges_to_set(ranges: PageRanges) -> frozenset[int]:
    """Expand merged page ranges to the set of page indices."""
    return frozenset(p for s, e in ranges for p in range(s, e))


def conflict_sets(g: "Geometry", chunks: Iterable[Any]) -> dict[RowKey, frozenset[int]]:
    """Map (region, row) to the exact set of KV pages backing any byte of that row.

    ``chunks`` is any iterable of objects with ``region``, ``offset`` or
    ``region_offset``, ``plane``, ``plane_offset`` and ``length`` (declared
    ``Alias`` entries or aliased ``Allocation`` entries). Every row of ``g`` is a key.
    """
    from kvgrant.layout.geometry import require_geometry

    require_geometry(g, "conflict_sets")
    return {k: ranges_to_set(v) for k, v in conflict_ranges(g, chunks).items()}


def declared_conflict_ranges(g: "Geometry") -> Mapping[RowKey, PageRanges]:
    """``conflict_ranges(g, g.aliases)``, computed once per geometry object and
    read-only: the planners, both bounds, the contract check and the report each ask
    for it, and a region of 2^20 rows took seconds per asking."""
    return g._declared_ranges  # type: ignore[no-any-return]


def declared_conflict_sets(g: "Geometry") -> dict[RowKey, frozenset[int]]:
    """Conflict sets of the declared layout (the ones every plan must keep)."""
    from kvgrant.layout.geometry import require_geometry

    require_geometry(g, "declared_conflict_sets")  # was: AttributeError (_declared_ranges)
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
