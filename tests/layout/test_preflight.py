"""Pre-flight: driver-handle demand of all ranks, plus a reserve, against the host's budget."""

from __future__ import annotations

import pytest
from layout_builders import geometries, geometry_dict, published_like_dict, simple_plan
from hypothesis import given, settings

from kvgrant.errors import HandleBudgetError, PlanError
from kvgrant.layout import preflight
from kvgrant.layout.geometry import Geometry, parse_geometry
from kvgrant.layout.plan import Allocation, PhysicalPlan
from kvgrant.layout.preflight import (
    DEFAULT_HANDLE_BUDGET,
    DEFAULT_HANDLE_RESERVE,
    check_handle_budget,
    handle_demand,
    handle_demand_breakdown,
)


def brute_force_demand(g: Geometry, plan: PhysicalPlan, declared: bool) -> int:
    """Count every (rank, mapping, device) triple straight from DESIGN.md's rules."""
    t = g.topology
    total = 0
    for r in range(t.ranks):
        group = next((set(gr) for gr in t.import_groups if r in gr), {r})
        readers = group | {r}
        if declared and t.declared_readers is not None and r in t.declared_readers:
            readers = set(t.declared_readers[r]) | {r}
        for a in plan.allocations:
            total += len(readers)  # plane mapping
            if a.region is not None:
                owner_only = g.region_by_name[a.region].access == "owner"
                total += 1 if owner_only else len(readers)
    return total


def test_all_is_sorted() -> None:
    assert preflight.__all__ == sorted(preflight.__all__)
    assert DEFAULT_HANDLE_BUDGET == 523_880


def test_small_geometry_by_hand() -> None:
    g = parse_geometry(geometry_dict())
    plan = simple_plan(g)
    # 8 allocations (4 aliased: 3 snap, 1 owner-only exec) on each of 2 ranks:
    # planes 8 x 2 devices + snap 3 x 2 + exec 1 x 1 = 23 per rank.
    assert len(plan.allocations) == 8
    assert handle_demand(g, plan) == 46
    d = handle_demand_breakdown(g, plan)
    assert d.per_rank == {0: 23, 1: 23}
    assert d.per_target == {"plane:a": 16, "plane:b": 16, "region:snap": 12, "region:exec": 2}
    assert d.mappings == 24


def test_overdeclared_readers_cost_only_when_declared() -> None:
    doc = geometry_dict(topology={"ranks": 3, "import_groups": [[0, 1]],
                                  "declared_readers": {"2": [0, 1, 2]}})
    g = parse_geometry(doc)
    plan = simple_plan(g)
    # rank 2 imports nothing: 8 + 3 + 1 = 12 owner-only; declared: 8x3 + 3x3 + 1 = 34.
    assert handle_demand_breakdown(g, plan).per_rank[2] == 12
    assert handle_demand_breakdown(g, plan, declared=True).per_rank[2] == 34
    assert handle_demand(g, plan, declared=True) - handle_demand(g, plan) == 34 - 12


def test_unaliased_allocations_cost_one_mapping_each() -> None:
    g = parse_geometry(geometry_dict())
    base = simple_plan(g)
    a = next(x for x in base.allocations if not x.aliased and x.length >= 8)
    split = [x for x in base.allocations if x is not a]
    split += [Allocation(a.plane, a.plane_offset, 4), Allocation(a.plane, a.plane_offset + 4,
                                                                 a.length - 4)]
    more = PhysicalPlan("split", g, tuple(split))
    # one more plane mapping per rank, granted to 2 devices, on 2 ranks
    assert handle_demand(g, more) - handle_demand(g, base) == 4


def test_budget_boundary_and_error_fields() -> None:
    g = parse_geometry(geometry_dict())
    plan = simple_plan(g)
    assert check_handle_budget(g, plan, 46) == 46  # exactly at the budget fits
    with pytest.raises(HandleBudgetError) as info:
        check_handle_budget(g, plan, 45)
    err = info.value
    assert isinstance(err, PlanError)
    assert (err.demand, err.budget) == (46, 45)
    assert err.contributors[0] in {("plane:a", 16), ("plane:b", 16)}
    assert ("rank 0", 23) in err.contributors
    text = str(err)
    assert "46" in text and "45" in text and "over by 1" in text and "plane:a 16" in text


def test_bad_budget_is_a_clear_value_error() -> None:
    g = parse_geometry(geometry_dict())
    for bad in (-1, 1.5, True):
        with pytest.raises(ValueError, match="budget"):
            check_handle_budget(g, simple_plan(g), bad)  # type: ignore[arg-type]
        with pytest.raises(ValueError, match="reserve = "):
            check_handle_budget(g, simple_plan(g), 100, reserve=bad)  # type: ignore[arg-type]


def test_the_reserve_counts_against_the_host_budget() -> None:
    g = parse_geometry(geometry_dict())
    plan = simple_plan(g)
    assert check_handle_budget(g, plan, 50, reserve=4) == 46  # 46 + 4 = 50 fits
    with pytest.raises(HandleBudgetError) as info:
        check_handle_budget(g, plan, 50, reserve=5)
    err = info.value
    assert (err.demand, err.budget, err.reserve, err.overdraw) == (46, 50, 5, 1)
    text = str(err)
    assert "reserve of 5" in text and "over by 1" in text
    assert "one pool for every process and GPU" in text and "per-process" not in text


def test_default_budget_and_reserve_are_the_documented_figures() -> None:
    assert (DEFAULT_HANDLE_BUDGET, DEFAULT_HANDLE_RESERVE) == (523_880, 4_096)


def test_published_scale_overdeclared_readers_exceed_the_budget() -> None:
    """Every rank declared a reader (16 devices) vs DCP8 importers (8 devices):
    the declared grants double the demand."""
    g = parse_geometry(published_like_dict())
    plan = simple_plan(g)
    own = handle_demand(g, plan)
    dec = handle_demand(g, plan, declared=True)
    assert own == brute_force_demand(g, plan, False)
    assert dec == brute_force_demand(g, plan, True)
    assert dec > DEFAULT_HANDLE_BUDGET
    with pytest.raises(HandleBudgetError):
        check_handle_budget(g, plan, declared=True)


@settings(max_examples=300, deadline=None)
@given(geometries())
def test_matches_brute_force(g: Geometry) -> None:
    plan = simple_plan(g)
    for declared in (False, True):
        d = handle_demand_breakdown(g, plan, declared=declared)
        assert d.total == brute_force_demand(g, plan, declared)
        assert sum(d.per_rank.values()) == d.total == sum(d.per_target.values())
    assert handle_demand(g, plan, declared=True) >= handle_demand(g, plan)
