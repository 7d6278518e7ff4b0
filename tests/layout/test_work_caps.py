"""Work caps found by fuzzing odd layouts (2026-12-02): parts of the planner whose
work grows with the (granule, label) pairs or the rows sharing granules are skipped
past a count of the geometry, never a clock; what they return stays sound.

Each cap is lowered here (monkeypatch) so that tiny layouts cross it."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from kvgrant.layout import bound, exact, planner
from kvgrant.layout.bound import allocation_lower_bound
from kvgrant.layout.geometry import load_geometry
from kvgrant.layout.granules import eligible_pairs, label_units
from kvgrant.layout.rules import reference_plan

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
LAYOUTS = ["small.json", "small-inward.json", "small-fine-rows.json", "published-dcp8.json"]


def _fail(*_a: Any, **_k: Any) -> Any:
    raise AssertionError("this part must be skipped past its cap")


def test_eligible_pairs_counts_the_label_columns_of_the_exact_model() -> None:
    g = load_geometry(EXAMPLES / "published-dcp8.json")
    m, _lab = exact._build(g, 1.0, {}, cover=False)
    assert eligible_pairs(g) == len(m.x) > 0
    # planes of one class count once (the model is aggregated per class)
    per_plane = sum(sum(hi - lo for rng in label_units(
        g, p.bytes_per_page, g.plane_bytes(p.name) // g.granularity) for lo, hi in rng)
        for p in g.planes)
    assert per_plane > eligible_pairs(g)


def test_a_model_over_every_limit_is_refused_before_it_is_built(monkeypatch: Any) -> None:
    g = load_geometry(EXAMPLES / "small.json")
    ref = reference_plan(g)
    monkeypatch.setattr(exact, "_build", _fail)
    res = exact.exact_plan(g, start=ref, max_nonzeros=1, max_windowed_nonzeros=2)
    assert res.source == "start" and res.plan.allocations == ref.allocations
    assert res.status.startswith("Not solved (model of at least")
    assert res.model["nonzeros"] == 2 * eligible_pairs(g)


@pytest.mark.parametrize("name", LAYOUTS)
def test_a_model_that_grows_past_every_limit_while_built_stops_there(name: str) -> None:
    """The label columns are under the limit, the rest of the rows are not (odd-4:
    103 million nonzeros of pass-through cuts): building stops at the limit."""
    g = load_geometry(EXAMPLES / name)
    ref = reference_plan(g)
    whole, _lab = exact._build(g, 1.0, {}, cover=False)
    least = 2 * eligible_pairs(g)
    assert least < whole.nonzeros == sum(len(r) for r in whole.rows)
    limit = (least + whole.nonzeros) // 2
    res = exact.exact_plan(g, start=ref, max_nonzeros=1, max_windowed_nonzeros=limit)
    assert res.source == "start" and res.plan.allocations == ref.allocations
    assert res.status == (f"Not solved (model of at least {res.model['nonzeros']:,} "
                          f"nonzeros, over {limit:,})")
    assert limit < res.model["nonzeros"] < whole.nonzeros
    # a budget the model stays within changes nothing in it
    same, _ = exact._build(g, 1.0, {}, cover=False, budget=whole.nonzeros)
    assert (same.rows, same.cost, same.lower, same.upper) == \
        (whole.rows, whole.cost, whole.lower, whole.upper)


@pytest.mark.parametrize("name", LAYOUTS)
@pytest.mark.parametrize("cap", ["MAX_COMPETITION_PAIRS", "MAX_DEAD_UNIT_WORK",
                                 "MAX_LAGRANGIAN_PAIRS"])
def test_a_capped_bound_part_is_skipped_and_the_bound_stays_below_the_full_one(
        monkeypatch: Any, name: str, cap: str) -> None:
    g = load_geometry(EXAMPLES / name)
    full = allocation_lower_bound(g).total
    g = load_geometry(EXAMPLES / name)  # a fresh object: nothing memoised
    monkeypatch.setattr(bound, cap, -1)
    skipped = {"MAX_COMPETITION_PAIRS": "_sharing_rows", "MAX_DEAD_UNIT_WORK": "_inside",
               "MAX_LAGRANGIAN_PAIRS": "_plane_pass"}[cap]
    monkeypatch.setattr(bound, skipped, _fail)
    capped = allocation_lower_bound(g).total
    assert 0 < capped <= full
    assert capped <= len(reference_plan(g).allocations)


def test_the_heuristic_packer_is_not_run_past_its_cap(monkeypatch: Any) -> None:
    g = load_geometry(EXAMPLES / "small.json")
    monkeypatch.setattr(planner, "MAX_HEURISTIC_PAIRS", 0)
    monkeypatch.setattr(planner, "pack", _fail)
    ref = reference_plan(g)
    assert planner._better_heuristic(g, ref, None) is None


@pytest.mark.parametrize("name", LAYOUTS)
def test_the_packer_keeps_the_contract_when_no_pair_of_rows_is_re_split(
        monkeypatch: Any, name: str) -> None:
    from kvgrant.layout import packer
    from kvgrant.layout.contract import check_contract

    monkeypatch.setattr(packer, "MAX_RESPLIT_STATES", 0)
    g = load_geometry(EXAMPLES / name)
    plan = packer.pack(g)
    assert check_contract(g, plan) == []
    assert len(plan.allocations) <= len(reference_plan(g).allocations)
