"""Granule facts shared by the packer, the lower bound and the exact planner.

Why one module: every planner works in granules of G bytes, and they must agree on
which region granules lie wholly inside one row (*interior*: any eligible plane
granule may back them) and which hold a row boundary or bytes past the last row
(*straddling*: each of their row parts is checked on its own). Before this module the
"wholly inside one row" test was written four times.

A *label* (as in docs/layout.md, "(D)") is what a plane granule may be assigned to:
the interior granules of one row together (``need`` = their number), or one
straddling granule (``need`` 1). Labels are numbered in region order; ``pred[l]`` is
the label just before ``l`` in the same region (-1 for the first).
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property
from typing import Any

from kvgrant.layout.geometry import Geometry, Region, round_up

__all__ = ["Labels", "Part", "eligible_pairs", "granule_row", "intersect", "label_units",
           "labels", "same_set_spans", "straddling_part_arrays", "unit_ranges"]

Part = tuple[str, int, int, int]
"""(region, row, first byte in the granule, end byte in the granule)."""


def granule_row(r: Region, j: int, G: int) -> int | None:
    """The row region granule ``j`` of ``r`` lies wholly inside, or None when it holds
    a row boundary or bytes past the last row."""
    R, end = r.row_bytes, r.rows * r.row_bytes
    lo, hi = j * G, (j + 1) * G
    if hi <= end and lo // R == (hi - 1) // R:
        return lo // R
    return None


@dataclass(frozen=True)
class Labels:
    """Labels of a geometry: per label its need, predecessor, byte parts and the
    region granules it covers (``first`` granule index, ``count`` granules)."""

    need: list[int]
    pred: list[int]
    parts: list[list[Part]]
    region: list[str]
    first: list[int]

    @cached_property
    def succ(self) -> list[int]:
        """The label just after each label in the same region (-1 for the last);
        computed once (the windows ask for it per window and label), not to be changed."""
        out = [-1] * len(self.need)
        for l_, p in enumerate(self.pred):
            if p >= 0:
                out[p] = l_
        return out


def labels(g: Geometry) -> Labels:
    """Every label of ``g`` in region order (see the module docstring); computed once
    per geometry object and shared, so callers must not change it."""
    got = g._memo.get("labels")
    if got is None:
        got = g._memo["labels"] = _labels(g)
    return got  # type: ignore[no-any-return]


def label_units(g: Geometry, bpp: int, units: int) -> list[list[tuple[int, int]]]:
    """Per label, the granules of a plane of ``bpp`` bytes per page and ``units``
    granules that may back it (every row part touches only pages of that row's
    conflict set, or no page), as sorted half-open ranges.

    Why cached per geometry: the exact model and each Lagrangian bound (allocations,
    handles) need the same table, and a tall region's labels have one part per row."""
    key = ("label_units", bpp, units)
    got = g._memo.get(key)
    if got is not None:
        return got  # type: ignore[no-any-return]
    G = g.granularity
    out: list[list[tuple[int, int]]] = []
    for label_spans in same_set_spans(g):
        rng = [(0, units)]
        for o1, o2, comps in label_spans:
            rng = intersect(rng, unit_ranges(units, G, bpp, g.pages, o1, o2, comps))
            if not rng:
                break
        out.append(rng)
    g._memo[key] = out
    return out


def plane_classes(g: Geometry) -> list[tuple[int, int, list[int]]]:
    """Planes grouped by (bytes per page, granules), in first-seen order, each with its
    plane indices in geometry order.

    Why: planes of one class are interchangeable in every plan, so the exact model and
    the Lagrangian bound count per class; both must group (and order) them alike."""
    G = g.granularity
    out: dict[tuple[int, int], list[int]] = {}
    for i, p in enumerate(g.planes):
        out.setdefault((p.bytes_per_page, g.plane_bytes(p.name) // G), []).append(i)
    return [(bpp, units, idx) for (bpp, units), idx in out.items()]


def labels_per_granule(g: Geometry, bpp: int, units: int) -> list[list[int]]:
    """Per granule of a plane of ``bpp`` bytes per page and ``units`` granules, the
    labels it may take, in label order: :func:`label_units` turned inside out.

    Why: the exact model's columns and the Lagrangian bound's states are both laid out
    granule by granule over these lists."""
    per_unit: list[list[int]] = [[] for _ in range(units)]
    for l_, rng in enumerate(label_units(g, bpp, units)):
        for lo, hi in rng:
            for u in range(lo, hi):
                per_unit[u].append(l_)
    return per_unit


def eligible_pairs(g: Geometry) -> int:
    """(granule, label) pairs a plane of each class may use, summed over the plane
    classes (planes of one bytes per page and size count once): the size of the exact
    model's label columns and of each Lagrangian pass, counted from the eligible
    ranges without listing them.

    Why: both walk these pairs in Python, one at a time; a layout of 2 pages and
    22,923 labels (tall regions at G = 64 bytes) has 229 million, which ran for
    minutes. The planners check this count against their limits first."""
    got = g._memo.get("eligible_pairs")
    if got is None:
        got = g._memo["eligible_pairs"] = sum(
            hi - lo
            for bpp, units, _ in plane_classes(g)
            for rng in label_units(g, bpp, units) for lo, hi in rng)
    return got  # type: ignore[no-any-return]


def same_set_spans(g: Geometry) -> list[list[tuple[int, int, tuple[tuple[int, int], ...]]]]:
    """Per label, :func:`_same_set_spans` of its parts: computed once per geometry
    (the exact model's eligible granules and the bound's dead granules both walk
    them, one part per row of a tall region), read-only."""
    from kvgrant.layout.conflicts import declared_conflict_ranges

    spans = g._memo.get("label_spans")
    if spans is None:
        conflicts = declared_conflict_ranges(g)
        single = _single_range_rows(g)
        spans = g._memo["label_spans"] = [
            (_tall_spans(g, parts, conflicts, single) if len(parts) > 64 and single
             else None) or _same_set_spans(parts, conflicts) for parts in labels(g).parts]
    return spans  # type: ignore[no-any-return]


def _single_range_rows(g: Geometry) -> Any:
    """(row base per region, ranges per row, first range start, first range stop) as
    int64 arrays over the rows in geometry order, from the declared range arrays
    (None where those do not apply)."""
    import numpy as np

    from kvgrant.layout.conflicts import declared_conflict_arrays

    arr = declared_conflict_arrays(g)
    if arr is None:
        return None
    row, lo, hi = arr
    base = g.first_row
    total = sum(r.rows for r in g.regions)
    cnt = np.bincount(row, minlength=total) if len(row) else np.zeros(total, np.int64)
    lo1 = np.full(total, -1, dtype=np.int64)
    hi1 = np.full(total, -1, dtype=np.int64)
    if len(row):  # the arrays are sorted by row, then start: each row's first range
        first = np.flatnonzero(np.concatenate(([True], row[1:] != row[:-1])))
        lo1[row[first]] = lo[first]
        hi1[row[first]] = hi[first]
    return base, cnt, lo1, hi1


def _tall_spans(g: Geometry, parts: list[Part], conflicts: Any, single: Any
                ) -> list[tuple[int, int, tuple[tuple[int, int], ...]]] | None:
    """:func:`_same_set_spans` of a label whose parts are consecutive rows of one
    region (a straddling granule of a tall region): the set changes found with numpy
    from each row's range count and first range, and the whole sets compared only
    next to a row of several ranges; None when that does not apply."""
    import numpy as np

    region, k0 = parts[0][0], parts[0][1]
    n = len(parts)
    if parts[-1][0] != region or parts[-1][1] != k0 + n - 1:
        return None
    base, cnt, lo1, hi1 = single
    at = slice(base[region] + k0, base[region] + k0 + n)
    c, a, b = cnt[at], lo1[at], hi1[at]
    if len(c) != n:
        return None
    same = (c[1:] == c[:-1]) & (a[1:] == a[:-1]) & (b[1:] == b[:-1])
    for i in np.flatnonzero(same & (c[1:] > 1)).tolist():  # first ranges alike
        same[i] = conflicts[(region, k0 + i)] == conflicts[(region, k0 + i + 1)]
    starts = [0] + (np.flatnonzero(~same) + 1).tolist()
    ends = starts[1:] + [n]
    return [(parts[i][2], parts[j - 1][3], conflicts[(region, parts[i][1])])
            for i, j in zip(starts, ends)]


def _same_set_spans(parts: list[Part], conflicts: Any
                    ) -> list[tuple[int, int, tuple[tuple[int, int], ...]]]:
    """``(o1, o2, conflict set)`` of a label's row parts, adjacent parts whose rows
    have the same conflict set joined into one span.

    Why this is exact: a plane granule u may back a part iff the plane bytes
    [u G + o1, u G + o2) lie inside one range of the set's pages (for the range that
    reaches the last page: start inside it), or start past the last page (see
    :func:`unit_ranges`). Two adjacent parts cannot lie in two different ranges
    (ranges are merged, so a gap separates them), and "starts past the last page"
    before the range reaching the last page is impossible; so the joined span is
    allowed exactly when each part is. A straddling granule of a tall region has one
    part per row (2^14 of them), and rows share a few sets."""
    out: list[tuple[int, int, tuple[tuple[int, int], ...]]] = []
    last_region = None
    for region, row, o1, o2 in parts:
        comps = conflicts[(region, row)]
        if out and region == last_region and out[-1][1] == o1 and out[-1][2] == comps:
            out[-1] = (out[-1][0], o2, comps)
        else:
            out.append((o1, o2, comps))
        last_region = region
    return out


def _labels(g: Geometry) -> Labels:
    G = g.granularity
    need: list[int] = []
    pred: list[int] = []
    parts: list[list[Part]] = []
    region: list[str] = []
    first: list[int] = []
    for r in g.regions:
        R, end = r.row_bytes, r.rows * r.row_bytes
        prev = -1
        interior = None  # label of the row whose interior is being collected
        for j in range(round_up(end, G) // G):
            k = granule_row(r, j, G)
            if k is not None:
                if interior is not None and parts[interior][0][1] == k:
                    need[interior] += 1
                    continue
                interior = len(need)
                need.append(1)
                parts.append([(r.name, k, 0, G)])
            else:
                interior = None
                lo, hi = j * G, (j + 1) * G
                ps = []
                b = lo
                while b < min(hi, end):
                    k = b // R
                    e = min(hi, end, (k + 1) * R)
                    ps.append((r.name, k, b - lo, e - lo))
                    b = e
                need.append(1)
                parts.append(ps)
            region.append(r.name)
            first.append(j)
            pred.append(prev)
            prev = len(need) - 1
    return Labels(need, pred, parts, region, first)


def straddling_part_arrays(g: Geometry, lab: Labels, l_: int
                           ) -> tuple[Any, Any, Any] | None:
    """(row, o1, o2) of the parts of label ``l_`` (a straddling granule of a tall
    region: one part per row) as int64 arrays, rows numbered as in
    :attr:`Geometry.first_row`: the parts :func:`_labels` lays out, computed from the
    label's granule; None (read the parts one by one) unless that agrees with its
    first and last part."""
    import numpy as np

    parts = lab.parts[l_]
    r = g.region_by_name[lab.region[l_]]
    G, R = g.granularity, r.row_bytes
    lo = lab.first[l_] * G
    top = min(lo + G, r.rows * R)
    k = lo // R + np.arange(len(parts), dtype=np.int64)
    o1 = np.maximum(k * R, lo) - lo
    o2 = np.minimum((k + 1) * R, top) - lo
    want = [(r.name, int(k[i]), int(o1[i]), int(o2[i])) for i in (0, -1)]
    if want != [tuple(parts[0]), tuple(parts[-1])]:
        return None
    return k + g.first_row[r.name], o1, o2


def unit_ranges(units: int, G: int, bpp: int, pages: int, o1: int, o2: int,
                comps: tuple[tuple[int, int], ...]) -> list[tuple[int, int]]:
    """Plane granules u of one plane whose bytes [u G + o1, u G + o2) touch only pages
    inside one component of ``comps`` (or no page at all: bytes past the last page),
    as sorted, merged half-open ranges of u."""
    end = pages * bpp
    out = [(max(0, -(-(end - o1) // G)), units)]  # bytes past the pages: no page
    for a, b in comps:
        lo = max(0, -(-(a * bpp - o1) // G))
        hi = units if b >= pages else min(units, (b * bpp - o2) // G + 1)
        out.append((lo, hi))
    out = sorted((lo, hi) for lo, hi in out if lo < hi)
    merged: list[tuple[int, int]] = []
    for lo, hi in out:
        if merged and lo <= merged[-1][1]:
            merged[-1] = (merged[-1][0], max(merged[-1][1], hi))
        else:
            merged.append((lo, hi))
    return merged


def intersect(a: list[tuple[int, int]], b: list[tuple[int, int]]) -> list[tuple[int, int]]:
    """Intersection of two lists of half-open ranges."""
    out = []
    for lo1, hi1 in a:
        for lo2, hi2 in b:
            lo, hi = max(lo1, lo2), min(hi1, hi2)
            if lo < hi:
                out.append((lo, hi))
    return sorted(out)
