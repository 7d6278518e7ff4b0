"""Implied coverage rows are left out of the exact model (exact.needed_cover_rows):
a repeated set and a set that holds another are implied by the row kept, so the model
keeps its points; a tall region's million coverage rows come down to a few thousand,
and its model is solved at once, with a proof, instead of in windows."""

from __future__ import annotations

import runpy
from pathlib import Path

from hypothesis import given, settings, strategies as st

from kvgrant.layout.contract import check_contract
from kvgrant.layout.exact import _build, _conflict_pages, exact_plan, needed_cover_rows
from kvgrant.layout.geometry import parse_geometry
from kvgrant.layout.rules import reference_plan

BENCH = Path(__file__).resolve().parents[2] / "benchmarks" / "bench_tall.py"

column_sets = st.lists(st.lists(st.integers(0, 7), min_size=1, max_size=4, unique=True)
                       .map(sorted), max_size=12)


@settings(max_examples=200, deadline=None)
@given(column_sets)
def test_kept_rows_are_distinct_minimal_and_imply_every_dropped_row(sets) -> None:
    keep = needed_cover_rows(sets)
    kept = [frozenset(s) for s, k in zip(sets, keep) if k]
    assert len(kept) == len(set(kept))  # no repeats
    assert not any(a < b for a in kept for b in kept)  # none holds another
    for s, k in zip(sets, keep):
        if not k:  # implied: it holds a kept set
            assert any(a <= frozenset(s) for a in kept)
    # a set's first occurrence is the one kept
    for i, (s, k) in enumerate(zip(sets, keep)):
        if k:
            assert sets.index(s) == i


@settings(max_examples=100, deadline=None)
@given(column_sets, st.lists(st.integers(0, 3), min_size=8, max_size=8))
def test_a_point_meets_the_kept_rows_exactly_when_it_meets_them_all(sets, x) -> None:
    def meets(rows) -> bool:
        return all(sum(x[c] for c in s) >= 1 for s in rows)

    kept = [s for s, k in zip(sets, needed_cover_rows(sets)) if k]
    assert meets(kept) == meets(sets)


def test_a_tall_region_is_solved_at_once_and_proven() -> None:
    doc = runpy.run_path(str(BENCH))["_dcp8"](4096)
    g = parse_geometry(doc)
    m, _ = _build(g, 1.0, {})
    cover = sum(k == "cover" for k in m.kinds)
    assert cover < _conflict_pages(g) // 3  # (17,399 conflict pages; 3,197 rows kept)
    res = exact_plan(g, start=reference_plan(g), max_gap=0)
    assert res.source == "solver" and res.optimal
    assert check_contract(g, res.plan) == []


def test_a_tall_label_with_rows_of_several_ranges_takes_the_bulk_walk_exactly() -> None:
    """granules._tall_spans finds set changes in bulk, comparing whole sets next to a
    row of several conflict ranges: the same spans as the row-by-row walk."""
    from kvgrant.layout import granules
    from kvgrant.layout.conflicts import declared_conflict_ranges

    g = parse_geometry(runpy.run_path(str(BENCH))["_dcp8"](262_144))  # 82 rows a granule
    lab, conflicts = granules.labels(g), declared_conflict_ranges(g)
    single = granules._single_range_rows(g)
    checked = 0
    for parts in lab.parts:
        if len(parts) <= 64 or not any(len(conflicts[p[:2]]) > 1 for p in parts):
            continue
        got = granules._tall_spans(g, parts, conflicts, single)
        assert got is not None and got == granules._same_set_spans(parts, conflicts)
        checked += 1
    assert checked > 100


_SETS = [(), ((0, 1),), ((0, 2),), ((0, 1), (3, 4)), ((0, 1), (5, 6)), ((2, 3), (5, 6))]


@settings(max_examples=200, deadline=None)
@given(st.lists(st.sampled_from(range(len(_SETS))), min_size=1, max_size=40))
def test_bulk_set_changes_match_the_row_by_row_walk(choice) -> None:
    """The same spans for any sequence of row sets, rows of several ranges whose
    first ranges agree included (their whole sets are compared)."""
    import numpy as np

    from kvgrant.layout import granules

    n = len(choice)
    parts = [("r", k, 16 * k, 16 * k + 16) for k in range(n)]
    conflicts = {("r", k): _SETS[c] for k, c in enumerate(choice)}
    cnt = np.array([len(_SETS[c]) for c in choice], dtype=np.int64)
    lo1 = np.array([_SETS[c][0][0] if _SETS[c] else -1 for c in choice], dtype=np.int64)
    hi1 = np.array([_SETS[c][0][1] if _SETS[c] else -1 for c in choice], dtype=np.int64)
    got = granules._tall_spans(None, parts, conflicts, ({"r": 0}, cnt, lo1, hi1))
    assert got == granules._same_set_spans(parts, conflicts)
