"""The pass-through cuts are left out when they alone put the exact model over a limit.

Why: the cuts are valid for every plan but not needed for one (the extraction reports
the pattern they forbid as a lost join, which is cut off and repaired), and on some
layouts they are most of the model: random-80's 209,818 nonzeros over 2,078 label
columns are 179,266 cuts, so the model went unsolved (the heuristic's 115 against a
bound of 72) where without them it is solved at once. The plan must still keep the
contract and the bound stay a bound.
"""

from __future__ import annotations

from pathlib import Path

from hypothesis import HealthCheck, assume, given, settings

from kvgrant.layout import exact
from kvgrant.layout.contract import check_contract
from kvgrant.layout.exact import exact_plan
from kvgrant.layout.geometry import load_geometry
from kvgrant.layout.rules import reference_plan
from layout_builders import geometries
from test_bound import brute_min
from test_exact import BRUTE

ROOT = Path(__file__).resolve().parents[2]


def _sizes(g):
    m, _ = exact._build(g, 1.0, {})
    cut = sum(len(e) for e, k in zip(m.rows, m.kinds) if k == "cut")
    a, b = m.cut_rows  # the cuts are one block of rows
    assert m.kinds[a:b] == ["cut"] * (b - a) and "cut" not in m.kinds[:a] + m.kinds[b:]
    assert cut == m.cut_nonzeros and not m.cuts_left_out
    return m.nonzeros, cut


def test_published_solved_whole_without_its_cuts_is_still_proven_optimal():
    g = load_geometry(ROOT / "examples" / "published-dcp8.json")
    nnz, cut = _sizes(g)
    assert cut > 0
    res = exact_plan(g, start=reference_plan(g), max_nonzeros=nnz - 1, max_gap=0)
    assert res.model["pass_through_cuts_left_out"] == 1
    assert res.model["nonzeros"] == nnz - cut and res.source != "windows"
    assert check_contract(g, res.plan) == []
    assert res.optimal and res.cost == len(res.plan.allocations) == 1311
    full = exact_plan(g, start=reference_plan(g), max_gap=0)  # with the cuts: the same
    assert "pass_through_cuts_left_out" not in full.model and full.cost == 1311


def test_cuts_past_the_build_budget_are_left_out_and_the_rest_is_built():
    g = load_geometry(ROOT / "examples" / "published-dcp8.json")
    nnz, cut = _sizes(g)
    m, _ = exact._build(g, 1.0, {}, budget=nnz - cut)
    assert m.cuts_left_out and "cut" not in m.kinds and m.cut_nonzeros == 0
    assert m.cut_rows[0] == m.cut_rows[1]
    assert m.nonzeros == nnz - cut == sum(len(e) for e in m.rows)
    res = exact_plan(g, start=reference_plan(g), max_nonzeros=nnz - cut,
                     max_windowed_nonzeros=nnz - cut, max_gap=0)
    assert res.model["pass_through_cuts_left_out"] == 1 and res.source != "windows"
    assert check_contract(g, res.plan) == [] and res.cost == 1311


@settings(max_examples=60, deadline=None, suppress_health_check=list(HealthCheck))
@given(geometries(max_planes=2, max_regions=2, max_ranks=1))
def test_without_the_cuts_the_optimum_and_bound_still_match_brute_force(g):
    nnz, cut = _sizes(g)
    assume(cut > 0)
    ref = reference_plan(g)
    assume(len(ref.allocations) > exact._floor(g))  # else nothing is built or solved
    best = brute_min(g)
    res = exact_plan(g, start=ref, max_nonzeros=nnz - 1, **BRUTE)
    assert res.model["pass_through_cuts_left_out"] == 1 and res.source != "windows"
    assert check_contract(g, res.plan) == []
    assert res.cost == len(res.plan.allocations) <= len(ref.allocations)
    assert res.bound <= res.cost and res.optimal == (res.bound == res.cost)
    if best is not None:
        assert res.bound <= best <= res.cost
        if res.optimal:
            assert res.cost == best


def test_a_cut_free_model_whose_lp_runs_long_is_left_as_it_was(monkeypatch):
    """The LP relaxation's iteration count decides (deterministic): past it, the model
    keeps its cuts and goes to its windows, or is refused when the cuts passed the
    budget it was built under, as before the cuts could be left out."""
    g = load_geometry(ROOT / "examples" / "published-dcp8.json")
    nnz, cut = _sizes(g)
    monkeypatch.setattr(exact, "MAX_CUT_FREE_LP_ITERATIONS", 1)
    res = exact_plan(g, start=reference_plan(g), max_nonzeros=nnz - 1)
    assert "pass_through_cuts_left_out" not in res.model and res.source == "windows"
    assert check_contract(g, res.plan) == []
    ref = reference_plan(g)
    refused = exact_plan(g, start=ref, max_nonzeros=nnz - cut,
                         max_windowed_nonzeros=nnz - cut)
    assert refused.source == "start" and refused.status.startswith("Not solved")
    assert refused.plan.allocations == ref.allocations
