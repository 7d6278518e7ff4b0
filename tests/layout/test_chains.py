"""The chain plan (kvgrant.layout.chains): each region in a few runs at one shift each,
a warm start that keeps the contract whenever it is returned, and that ends planning
when it meets the combinatorial bound."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from kvgrant.layout import chains, planner
from kvgrant.layout.bound import allocation_lower_bound
from kvgrant.layout.chains import chain_plan
from kvgrant.layout.conflicts import declared_conflict_ranges
from kvgrant.layout.contract import check_contract
from kvgrant.layout.geometry import load_geometry, parse_geometry
from kvgrant.layout.rules import reference_plan
from layout_builders import gen_layout, geometries
from test_bound import _DRIFTING_ROWS

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


def _fail(*_a: Any, **_k: Any) -> Any:
    raise AssertionError("the model must not be solved")


def test_drifting_rows_take_one_run_per_shift() -> None:
    g = parse_geometry(_DRIFTING_ROWS)
    plan = chain_plan(g)
    assert plan is not None and check_contract(g, plan) == []
    aliased = [a for a in plan.allocations if a.region is not None]
    # rows 0-2 at plane shift 0 in one run, row 3 at its own shift
    assert [(a.region_offset, a.length) for a in aliased] == [(0, 3), (3, 1)]
    assert aliased[0].plane_offset == 0 and aliased[1].plane_offset != 3
    assert len(plan.allocations) < len(reference_plan(g).allocations)


def test_a_chain_plan_that_meets_the_bound_is_returned_without_a_solve(monkeypatch) -> None:
    g = load_geometry(EXAMPLES / "small.json")
    plan = chain_plan(g)
    assert plan is not None and len(plan.allocations) < len(reference_plan(g).allocations)
    assert len(plan.allocations) == allocation_lower_bound(g).total
    monkeypatch.setattr(planner, "exact_plan", _fail)
    packed = planner.plan_packed(load_geometry(EXAMPLES / "small.json"))
    assert packed.optimal and packed.source == "chains"
    assert packed.plan.allocations == plan.allocations


def test_the_published_rows_mix_planes_so_there_is_no_chain_plan() -> None:
    """Every published row takes bytes of several planes: no run holds one whole, and
    the rest of a split row finds no plane that touches its pages."""
    assert chain_plan(load_geometry(EXAMPLES / "published-dcp8.json")) is None


def test_odd_4_plans_far_below_the_reference_rule() -> None:
    """112 drifting rows on one plane of 500 pages: the reference rule's 234
    allocations, the solver's 65 in over a minute; the chains need 14 at most."""
    g = parse_geometry(gen_layout().odd_layout(4))
    plan = chain_plan(g)
    assert plan is not None and check_contract(g, plan) == []
    assert len(plan.allocations) <= 14 < len(reference_plan(g).allocations)
    start, name = planner.warm_start(g)
    assert name == "chains" and start.allocations == plan.allocations


def test_past_the_work_cap_there_is_no_chain_plan(monkeypatch) -> None:
    monkeypatch.setattr(chains, "MAX_CHAIN_PLAN_WORK", 3)
    assert chain_plan(parse_geometry(_DRIFTING_ROWS)) is None


@settings(max_examples=150, deadline=None, suppress_health_check=list(HealthCheck))
@given(geometries(max_planes=3, max_regions=3, max_ranks=1))
def test_a_chain_plan_keeps_the_contract_and_every_granule(g) -> None:
    plan = chain_plan(g)
    if plan is None:
        return
    assert check_contract(g, plan) == []
    G = g.granularity
    assert all(a.length % G == 0 and a.plane_offset % G == 0 for a in plan.allocations)
    # every region byte is backed once, every plane byte is allocated once
    for r in g.regions:
        got = sorted((a.region_offset, a.region_offset + a.length)
                     for a in plan.allocations if a.region == r.name)
        assert got[0][0] == 0 and got[-1][1] == g.region_bytes(r.name)
        assert all(x[1] == y[0] for x, y in zip(got, got[1:]))
    for p in g.planes:
        got = sorted((a.plane_offset, a.plane_offset + a.length)
                     for a in plan.allocations if a.plane == p.name)
        assert got[0][0] == 0 and got[-1][1] == g.plane_bytes(p.name)
        assert all(x[1] == y[0] for x, y in zip(got, got[1:]))
    assert len(plan.allocations) >= allocation_lower_bound(g).total


def _pages_still_to_touch(g, plane, shift, j0, j1, region, before):
    """_split_rest by its definition, on page sets."""
    G, R = g.granularity, g.region_by_name[region].row_bytes
    cut = j1 * G
    k = cut // R
    if k >= g.region_by_name[region].rows or k * R == cut:
        return None
    want = {p for a, b in declared_conflict_ranges(g)[(region, k)] for p in range(a, b)}
    bpp = g.plane_by_name[plane].bytes_per_page
    lo, hi = max(k * R, j0 * G) + shift * G, cut + shift * G
    got = set(range(lo // bpp, min((hi - 1) // bpp + 1, g.pages)))
    if before is not None and before[0] == k:
        got |= want - set(range(before[1][0], before[1][1] + 1))
    missing = want - got
    return (k, (min(missing), max(missing))) if missing else None


@settings(max_examples=300, deadline=None, suppress_health_check=list(HealthCheck))
@given(geometries(max_planes=3, max_regions=2, max_ranks=1), st.data())
def test_the_rest_of_a_split_row_is_the_span_of_its_untouched_pages(g, data) -> None:
    """The page-range walk of _split_rest against page sets, for any run and any
    pages a run before it left untouched."""
    G = g.granularity
    assume(g.regions)
    region = data.draw(st.sampled_from(g.regions))
    plane = data.draw(st.sampled_from(g.planes))
    n, units = g.region_bytes(region.name) // G, g.plane_bytes(plane.name) // G
    j0 = data.draw(st.integers(0, n - 1))
    j1 = data.draw(st.integers(j0 + 1, n))
    if units < j1 - j0:
        return
    shift = data.draw(st.integers(-j0, units - j1))
    row = j1 * G // region.row_bytes  # the row the run ends in, mostly the one before
    before = data.draw(st.none() | st.tuples(
        st.just(row) | st.integers(0, region.rows), st.tuples(st.integers(0, g.pages - 1),
                                               st.integers(0, g.pages - 1)).map(sorted)))
    budget = [10**9]
    got = chains._split_rest(g, plane.name, shift, j0, j1, region.row_bytes, region.rows,
                             declared_conflict_ranges(g), region.name, before, budget)
    assert got == _pages_still_to_touch(g, plane.name, shift, j0, j1, region.name, before)
    assert budget[0] < 10**9 or got is None
