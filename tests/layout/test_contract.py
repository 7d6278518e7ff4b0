"""The layout contract checker: passes kept contracts, names the point of broken ones."""

from __future__ import annotations

import dataclasses

import pytest
from layout_builders import (CHEAP, geometries, geometry_dict, published_like_dict,
                             simple_plan)
from hypothesis import given, settings
from hypothesis import strategies as st
from test_conflicts import brute_force

from kvgrant.errors import ContractError
from kvgrant.layout import contract
from kvgrant.layout.contract import POINTS, Violation, check_contract, require_contract
from kvgrant.layout.geometry import Geometry, parse_geometry
from kvgrant.layout.plan import Allocation, PhysicalPlan


@pytest.fixture
def g() -> Geometry:
    return parse_geometry(geometry_dict())


def replaced(plan: PhysicalPlan, allocs: list[Allocation]) -> PhysicalPlan:
    return PhysicalPlan("broken", plan.geometry, tuple(allocs))


def points(found: list[Violation]) -> set[int]:
    return {v.point for v in found}


def test_all_is_sorted_and_public() -> None:
    assert contract.__all__ == sorted(contract.__all__)
    assert set(POINTS) == {1, 2, 3, 4, 5}
    import kvgrant.layout as layout

    assert layout.__all__ == sorted(layout.__all__)
    assert all(hasattr(layout, name) for name in layout.__all__)


def test_declared_realisation_keeps_the_contract(g: Geometry) -> None:
    plan = simple_plan(g)
    assert check_contract(g, plan) == []
    require_contract(g, plan)  # does not raise
    assert check_contract(g, plan.allocations) == []  # a bare list is accepted too


def test_moved_chunk_that_changes_a_conflict_set_is_point_4(g: Geometry) -> None:
    # Swap the region offsets of two equal-length snapshot chunks backed by
    # different pages: coverage is intact, conflict sets are not.
    plan = simple_plan(g)
    allocs = list(plan.allocations)
    a0, a1 = allocs[0], allocs[1]
    allocs[0] = dataclasses.replace(a0, region_offset=a1.region_offset)
    allocs[1] = dataclasses.replace(a1, region_offset=a0.region_offset)
    found = check_contract(g, replaced(plan, allocs))
    assert points(found) == {4}
    rows = {(v.detail["region"], v.detail["row"]) for v in found}
    # chunk 1 (snap [8, 16)) also backs row 2's bytes [14, 16).
    assert rows == {("snap", 0), ("snap", 1), ("snap", 2)}
    row0 = next(v for v in found if v.detail["row"] == 0)
    # row 0 was pages {0, 1} of plane a, now bytes [12, 19) of plane b: pages {2, 3}.
    assert row0.detail["missing"] == [0, 1] and row0.detail["extra"] == [2, 3]


def test_gap_in_a_plane_is_point_1(g: Geometry) -> None:
    plan = simple_plan(g)
    filler = next(i for i, a in enumerate(plan.allocations) if not a.aliased)
    gone = plan.allocations[filler]
    allocs = [a for i, a in enumerate(plan.allocations) if i != filler]
    found = check_contract(g, replaced(plan, allocs))
    assert points(found) == {1}
    gap = next(v for v in found if v.detail.get("kind") == "gap")
    assert gap.detail["plane"] == gone.plane
    assert gap.detail["range"] == [gone.plane_offset, gone.plane_offset + gone.length]
    assert any("physical bytes" in v.message for v in found)


def test_missing_aliased_chunk_breaks_planes_regions_and_conflicts(g: Geometry) -> None:
    plan = simple_plan(g)
    allocs = list(plan.allocations[1:])  # drop snap bytes [0, 8) = plane a [0, 8)
    found = check_contract(g, replaced(plan, allocs))
    assert points(found) == {1, 2, 4}
    region_gap = next(v for v in found if v.point == 2)
    assert region_gap.detail == {"region": "snap", "range": [0, 8], "kind": "gap"}


def test_overlap_in_a_plane_is_point_1(g: Geometry) -> None:
    plan = simple_plan(g)
    allocs = list(plan.allocations)
    i = next(k for k, a in enumerate(allocs) if not a.aliased and a.plane == "a")
    allocs[i] = dataclasses.replace(allocs[i], plane_offset=allocs[i].plane_offset - 4)
    found = check_contract(g, replaced(plan, allocs))
    assert 1 in points(found) and points(found) <= {1}
    assert any(v.detail.get("kind") == "overlap" for v in found)


def test_overlap_in_a_region_is_point_2(g: Geometry) -> None:
    plan = simple_plan(g)
    allocs = list(plan.allocations)
    # chunk 2 (snap [16, 24)) moved onto snap [8, 16): overlap there, gap at [16, 21).
    allocs[2] = dataclasses.replace(allocs[2], region_offset=8)
    found = check_contract(g, replaced(plan, allocs))
    assert {1, 3, 5}.isdisjoint(points(found)) and {2, 4} <= points(found)
    kinds = {v.detail.get("kind") for v in found if v.point == 2}
    assert kinds == {"gap", "overlap"}


def test_half_aliased_allocation_is_point_5(g: Geometry) -> None:
    plan = simple_plan(g)
    allocs = list(plan.allocations)
    allocs[0] = dataclasses.replace(allocs[0], region_offset=None)
    found = check_contract(g, replaced(plan, allocs))
    assert 5 in points(found)
    assert any(v.point == 5 and v.detail["alloc"] == 0 for v in found)

    allocs = list(plan.allocations)
    filler = next(i for i, a in enumerate(allocs) if not a.aliased)
    allocs[filler] = dataclasses.replace(allocs[filler], region_offset=0)
    assert any(v.point == 5 and v.detail["alloc"] == filler
               for v in check_contract(g, replaced(plan, allocs)))


def test_allocation_aliased_past_the_region_end_is_point_5(g: Geometry) -> None:
    # Merge snap chunk 2 (plane a [40, 48), snap [16, 24)) with the following plane
    # bytes [48, 56): the merged allocation would alias snap [16, 32), but snap has
    # only 24 reserved bytes, so it could only be half aliased.
    plan = simple_plan(g)
    allocs = [a for a in plan.allocations if not (a.plane == "a" and a.plane_offset == 48)]
    allocs[2] = dataclasses.replace(allocs[2], length=16)
    allocs.append(Allocation("a", 56, 4))
    found = check_contract(g, replaced(plan, allocs))
    assert points(found) >= {5}
    five = [v for v in found if v.point == 5]
    assert five[0].detail["range"] == [16, 32] and five[0].detail["reserved"] == 24


def test_misaligned_and_unknown_allocations_are_point_3(g: Geometry) -> None:
    plan = simple_plan(g)
    allocs = list(plan.allocations)
    allocs[0] = dataclasses.replace(allocs[0], length=6)
    found = check_contract(g, replaced(plan, allocs))
    assert any(v.point == 3 and v.detail == {"alloc": 0, "field": "length", "value": 6}
               for v in found)
    allocs = list(plan.allocations) + [Allocation("nope", 0, 4),
                                       Allocation("a", 0, 4, "nowhere", 0)]
    found = check_contract(g, replaced(plan, allocs))
    three = [v.detail for v in found if v.point == 3]
    assert {"alloc": len(allocs) - 2, "plane": "nope"} in three
    assert {"alloc": len(allocs) - 1, "region": "nowhere"} in three


def test_plan_for_another_geometry_is_point_3(g: Geometry) -> None:
    doc = geometry_dict()
    doc["regions"][0] = {"name": "snap", "rows": 3, "row_bytes": 8}
    other = parse_geometry(doc)
    found = check_contract(g, simple_plan(other))
    assert [v.detail["field"] for v in found if v.point == 3] == ["regions"]


def test_plane_range_past_reserved_size_is_point_1(g: Geometry) -> None:
    plan = simple_plan(g)
    allocs = list(plan.allocations) + [Allocation("a", 60, 4)]
    found = check_contract(g, replaced(plan, allocs))
    assert any(v.point == 1 and v.detail.get("reserved") == 60 for v in found)


def test_require_contract_raises_with_every_violation(g: Geometry) -> None:
    plan = simple_plan(g)
    broken = replaced(plan, list(plan.allocations[1:]))
    with pytest.raises(ContractError) as info:
        require_contract(g, broken)
    assert info.value.violations == check_contract(g, broken)
    assert "point 2" in str(info.value) and "broken plan" in str(info.value)


@settings(max_examples=400, deadline=None)
@given(geometries())
def test_declared_realisation_passes_for_random_geometries(g: Geometry) -> None:
    assert check_contract(g, simple_plan(g)) == []


@settings(max_examples=300, deadline=None)
@given(geometries(), st.data())
def test_point_4_exactly_when_conflict_sets_change(g: Geometry, data: st.DataObject) -> None:
    """Permute region offsets among equal-length aliased chunks: coverage stays exact,
    and the checker reports point 4 exactly when the per-byte sets differ."""
    plan = simple_plan(g)
    allocs = list(plan.allocations)
    by_len: dict[tuple[str, int], list[int]] = {}
    for i, a in enumerate(allocs):
        if a.aliased:
            by_len.setdefault((a.region, a.length), []).append(i)
    for idx in by_len.values():
        offsets = data.draw(st.permutations([allocs[i].region_offset for i in idx]))
        for i, off in zip(idx, offsets):
            allocs[i] = dataclasses.replace(allocs[i], region_offset=off)
    found = check_contract(g, allocs)
    assert points(found) <= {4}
    changed = brute_force(g, allocs) != brute_force(g, g.aliases)
    assert bool(found) == changed


@settings(max_examples=200, deadline=None)
@given(geometries(), st.data())
def test_dropping_any_allocation_is_caught(g: Geometry, data: st.DataObject) -> None:
    plan = simple_plan(g)
    if not plan.allocations:
        return
    k = data.draw(st.integers(0, len(plan.allocations) - 1))
    gone = plan.allocations[k]
    found = check_contract(g, [a for i, a in enumerate(plan.allocations) if i != k])
    assert 1 in points(found)
    if gone.aliased and gone.region_offset < g.region_by_name[gone.region].rows * \
            g.region_by_name[gone.region].row_bytes:
        assert 2 in points(found)


def test_published_scale_plans_keep_the_contract() -> None:
    g = parse_geometry(published_like_dict())
    plan = simple_plan(g)
    found = check_contract(g, plan)
    assert found == []
    assert len(plan.allocations) > 1900


@settings(max_examples=100, deadline=None)
@given(geometries())
def test_every_planner_keeps_the_contract(g: Geometry) -> None:
    from kvgrant.layout import plans
    from kvgrant.layout.planner import plan_packed

    for label in plans.PLAN_LABELS:
        # packed with small work limits: the contract holds for any plan it returns
        plan = plan_packed(g, **CHEAP).plan if label == "packed" else \
            plans.make_plan(g, label)
        found = check_contract(g, plan)
        assert found == [], f"{label}: {[str(v) for v in found]}"


def test_a_plan_for_another_page_count_with_the_same_plane_bytes_is_point_3() -> None:
    """G = 4, one plane of 1 byte per page: 9 and 12 pages both make 12 plane bytes,
    so every allocation fits either geometry, and only the page count tells them apart
    (a contract mutant that compared the granularity alone passed
    test_plan_for_another_geometry_is_point_3, which changes a region)."""
    from kvgrant.layout.rules import naive_plan

    doc = {"name": "t", "granularity": 4, "pages": 9, "page_tokens": 1,
           "planes": [{"name": "p0", "bytes_per_page": 1}],
           "regions": [{"name": "r", "rows": 1, "row_bytes": 4}],
           "aliases": [{"region": "r", "offset": 0, "plane": "p0", "plane_offset": 0,
                        "length": 4}],
           "topology": {"ranks": 1}}
    g9, g12 = parse_geometry(doc), parse_geometry({**doc, "pages": 12})
    assert g9.plane_bytes("p0") == g12.plane_bytes("p0") == 12
    assert check_contract(g9, naive_plan(g9)) == []
    found = check_contract(g9, naive_plan(g12))
    assert [v.detail["field"] for v in found if v.point == 3] == ["pages"], found


def test_a_tall_region_whose_last_row_gains_a_page_at_its_end_is_point_4() -> None:
    """5,000 rows of 2 bytes at G = 1 (past the size where conflict sets are compared
    in bulk): the last row's second byte is backed from page 5000, in no row's set, so
    that row's range grows only at its stop ((4999, 5001) against (4999, 5000)). The
    bulk comparison must see a stop-only change (a mutant that compared each range's
    row and start passed)."""
    from kvgrant.layout.plan import Allocation, PhysicalPlan

    rows = 5000
    g = parse_geometry({"name": "tall", "granularity": 1, "pages": rows + 1, "page_tokens": 1,
                        "planes": [{"name": "p", "bytes_per_page": 2}],
                        "regions": [{"name": "r", "rows": rows, "row_bytes": 2}],
                        "aliases": [{"region": "r", "offset": 0, "plane": "p",
                                     "plane_offset": 0, "length": 2 * rows}],
                        "topology": {"ranks": 1}})
    plan = PhysicalPlan("packed", g, (
        Allocation("p", 0, 2 * rows - 1, "r", 0), Allocation("p", 2 * rows - 1, 1),
        Allocation("p", 2 * rows, 1, "r", 2 * rows - 1), Allocation("p", 2 * rows + 1, 1)))
    found = [v for v in check_contract(g, plan) if v.point == 4]
    assert len(found) == 1 and "row 4999" in str(found[0]) and "5000" in str(found[0]), found
