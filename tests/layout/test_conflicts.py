"""Conflict sets: exact, byte-precise, for declared aliases and aliased allocations."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from layout_builders import geometries, geometry_dict, published_like_dict
from hypothesis import given, settings

from kvgrant.layout import conflicts
from kvgrant.layout.conflicts import (
    conflict_ranges,
    conflict_sets,
    declared_conflict_sets,
    largest_conflict_set,
    ranges_to_set,
)
from kvgrant.layout.geometry import Geometry, parse_geometry
from kvgrant.layout.plan import Allocation


def brute_force(g: Geometry, chunks) -> dict[tuple[str, int], frozenset[int]]:
    """Per-byte reference: walk every region byte of every chunk."""
    out: dict[tuple[str, int], set[int]] = {
        (r.name, i): set() for r in g.regions for i in range(r.rows)}
    for c in chunks:
        if getattr(c, "region", None) is None:
            continue
        reg = g.region_by_name[c.region]
        bpp = g.plane_by_name[c.plane].bytes_per_page
        off = c.region_offset if hasattr(c, "region_offset") else c.offset
        for k in range(c.length):
            rb, pb = off + k, c.plane_offset + k
            if rb < reg.rows * reg.row_bytes and pb < g.pages * bpp:
                out[(c.region, rb // reg.row_bytes)].add(pb // bpp)
    return {k: frozenset(v) for k, v in out.items()}


def test_all_is_sorted_and_public() -> None:
    assert conflicts.__all__ == sorted(conflicts.__all__)
    for name in conflicts.__all__:
        assert hasattr(conflicts, name)


def test_small_geometry_by_hand() -> None:
    g = parse_geometry(geometry_dict())
    # snap row 1 = region bytes [7, 14): [7, 8) is plane a byte 7 (page 1),
    # [8, 14) is plane b bytes [12, 18) (pages 2, 3).
    assert declared_conflict_sets(g) == {
        ("snap", 0): frozenset({0, 1}),
        ("snap", 1): frozenset({1, 2, 3}),
        ("snap", 2): frozenset({3, 6, 7}),
        ("exec", 0): frozenset({0}),
    }


def test_plane_bytes_past_the_last_page_belong_to_no_page() -> None:
    doc = geometry_dict()
    # plane b: 10 pages x 5 B = 50 B, reserved 52; bytes 50, 51 are no page.
    doc["aliases"][3] = {"region": "exec", "offset": 0, "plane": "b",
                         "plane_offset": 48, "length": 4}
    g = parse_geometry(doc)
    assert declared_conflict_sets(g)[("exec", 0)] == frozenset({9})


def test_region_bytes_past_the_last_row_belong_to_no_row() -> None:
    g = parse_geometry(geometry_dict())
    # snap holds 21 B in 3 rows; region bytes [21, 24) exist (G rounding) but are no row.
    tail = Allocation("a", 56, 4, region="snap", region_offset=20)
    got = conflict_sets(g, [tail])
    assert got[("snap", 2)] == frozenset({9})  # byte 20 -> plane a byte 56 -> page 9
    assert all(not v for k, v in got.items() if k != ("snap", 2))


def test_unaliased_allocations_are_skipped_and_every_row_is_a_key() -> None:
    g = parse_geometry(geometry_dict())
    got = conflict_sets(g, [Allocation("a", 0, 8)])
    assert set(got) == {("snap", 0), ("snap", 1), ("snap", 2), ("exec", 0)}
    assert all(v == frozenset() for v in got.values())


def test_allocations_and_aliases_agree() -> None:
    g = parse_geometry(geometry_dict())
    allocs = [Allocation(a.plane, a.plane_offset, a.length, a.region, a.offset)
              for a in g.aliases]
    assert conflict_sets(g, allocs) == declared_conflict_sets(g)


def test_region_offset_is_read_by_chunk_type_whatever_comes_first() -> None:
    # chunk_region_offset remembers per type which field holds the offset (from
    # whether the type has ``region_offset``, never from a value): an Alias read
    # first must not pin ``offset`` on the Allocations after it, nor the reverse
    conflicts._OFFSET_FIELD.clear()
    g = parse_geometry(geometry_dict())
    allocs = [Allocation(a.plane, a.plane_offset, a.length, a.region, a.offset)
              for a in g.aliases]
    assert [conflicts.chunk_region_offset(a) for a in g.aliases] == \
        [a.offset for a in g.aliases]
    mixed = [Allocation("a", 0, 8)] + allocs
    assert conflict_sets(g, mixed) == brute_force(g, g.aliases)
    assert [conflicts.chunk_region_offset(a) for a in allocs] == \
        [a.region_offset for a in allocs]
    conflicts._OFFSET_FIELD.clear()
    assert conflicts.chunk_region_offset(allocs[0]) == allocs[0].region_offset
    assert conflicts.chunk_region_offset(g.aliases[0]) == g.aliases[0].offset


def test_declared_spans_are_shared_and_the_same_as_a_copy_of_the_aliases() -> None:
    # the declared aliases' spans are computed once per geometry; a plan's chunks
    # (another list) are walked on their own, and both walks agree
    g = parse_geometry(geometry_dict())
    assert conflict_ranges(g, g.aliases) == conflict_ranges(g, list(g.aliases))
    assert "declared_spans" in g._memo
    other = [Allocation("a", 0, 4, "snap", 0)]
    assert conflict_sets(g, other) == brute_force(g, other)


def test_ranges_are_merged_and_sorted() -> None:
    g = parse_geometry(geometry_dict())
    r = conflict_ranges(g, g.aliases)
    assert r[("snap", 2)] == ((3, 4), (6, 8))
    assert r[("snap", 1)] == ((1, 4),)
    assert ranges_to_set(r[("snap", 2)]) == frozenset({3, 6, 7})


def test_largest_conflict_set() -> None:
    g = parse_geometry(geometry_dict())
    assert largest_conflict_set(g) == (("snap", 1), 3)  # first of the two 3-page rows
    nore = parse_geometry(geometry_dict(regions=[], aliases=[]))
    assert largest_conflict_set(nore) == (None, 0)


@settings(max_examples=300, deadline=None)
@given(geometries())
def test_matches_per_byte_reference(g: Geometry) -> None:
    assert declared_conflict_sets(g) == brute_force(g, g.aliases)


def test_published_scale_conflict_sets() -> None:
    g = parse_geometry(published_like_dict())
    sets = declared_conflict_sets(g)
    assert len(sets) == 117
    assert all(sets.values())  # every row is backed by some page


@pytest.mark.parametrize("chunks, names", [
    (None, "chunks = NoneType: must be an iterable of aliases or allocations"),
    ("snapshot", "chunks = str: must be an iterable"),
    ([1], "chunks[0] = 1: not an alias or allocation"),
])
def test_chunks_that_are_not_aliases_are_an_argument_error(chunks, names) -> None:
    """Was a TypeError traceback (None) or silently empty conflict sets ([1])."""
    from kvgrant.errors import ArgumentError
    from kvgrant.layout.conflicts import conflict_sets
    from kvgrant.layout.geometry import load_geometry

    g = load_geometry(Path(__file__).resolve().parents[2] / "examples" / "small.json")
    with pytest.raises(ArgumentError, match=re.escape(names)) as err:
        conflict_sets(g, chunks)
    assert err.value.argument == "chunks"


@settings(max_examples=200, deadline=None)
@given(geometries())
def test_bulk_walk_matches_per_byte_reference(g: Geometry) -> None:
    """The numpy walk (taken from _BULK_PIECES pieces on) gives the per-byte sets."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(conflicts, "_BULK_PIECES", -1)
        got = conflict_ranges(g, g.aliases)
    assert {k: ranges_to_set(v) for k, v in got.items()} == brute_force(g, g.aliases)
    assert got == conflicts._ranges_python(g, conflicts._chunk_spans(g, g.aliases))


def _tall_dict(rows: int, row_bytes: int) -> dict:
    """geometry_dict with region snap made ``rows`` rows of ``row_bytes`` bytes."""
    doc = geometry_dict()
    doc["regions"][0] = {"name": "snap", "rows": rows, "row_bytes": row_bytes}
    return doc


@pytest.mark.parametrize("rows, row_bytes", [(24, 1), (12, 2), (7, 3), (3, 7)])
def test_tall_region_bulk_and_python_walks_agree(rows: int, row_bytes: int) -> None:
    """Rows of a few bytes: each chunk crosses many rows (the tall-region case)."""
    g = parse_geometry(_tall_dict(rows, row_bytes))
    spans = conflicts._chunk_spans(g, g.aliases)
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(conflicts, "_BULK_PIECES", -1)
        bulk = conflict_ranges(g, g.aliases)
    assert list(bulk.items()) == list(conflicts._ranges_python(g, spans).items())
    assert {k: ranges_to_set(v) for k, v in bulk.items()} == brute_force(g, g.aliases)
    assert all(type(x) is int for rs in bulk.values() for r in rs for x in r)


def test_bulk_walk_takes_the_python_path_past_int64() -> None:
    """A plan file may hold offsets past int64: the walk falls back to Python ints."""
    g = parse_geometry(_tall_dict(24, 1))
    huge = Allocation("a", 1 << 70, 4, region="snap", region_offset=0)
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(conflicts, "_BULK_PIECES", -1)
        got = conflict_ranges(g, [huge])
    assert all(v == () for v in got.values())  # plane bytes past the pages: no page
