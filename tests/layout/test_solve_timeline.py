"""benchmarks/solve_timeline.py: it watches the planner's own solve without changing it.

Why: its figures (docs/layout.md, "Speed: which side is late") say whether the bound or
the plan is what keeps a layout over 2 s, so the solve it watches must be the
planner's (same checks, same interrupt, same plan) and its times must be read at the
right checks; nothing here is timed.
"""

from __future__ import annotations

import math
import runpy
from pathlib import Path

from layout_builders import gen_layout

from kvgrant.layout import exact
from kvgrant.layout.geometry import parse_geometry
from kvgrant.layout.planner import warm_start

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "solve_timeline.py"


def _plain(g, **limits):
    return exact.exact_plan(g, start=warm_start(g)[0], **limits)


def test_the_watched_solve_is_the_planners_and_its_records_are_ordered():
    mod = runpy.run_path(str(SCRIPT))
    g = parse_geometry(gen_layout().random_layout(1))  # 14 checks to its proof
    records, result = mod["watch"](g)
    plain = _plain(g)
    assert (result.cost, result.bound, result.optimal) == (plain.cost, plain.bound, plain.optimal)
    assert result.plan.allocations == plain.plan.allocations
    checks = records[:-1]
    assert len(checks) == result.model["checks"] + result.model.get("repair_checks", 0) > 0
    assert [r["cpu_s"] for r in records] == sorted(r["cpu_s"] for r in records)
    assert (records[-1]["plan"], records[-1]["bound"]) == (result.cost, result.bound)
    for r in records:  # the solver's plan is never below its bound
        assert r["plan"] == math.inf or r["bound"] == -math.inf or r["plan"] >= r["bound"] - 1e-6
    row = mod["summary"]("random-1", records, result)
    assert row["checks"] == row["result_checks"] == len(checks)
    assert row["first_check_s"] <= row["root_lp_s"] <= row["end_s"]
    for key in ("bound_final_s", "plan_final_s", "within_1pct_s"):
        assert row[key] is not None and row[key] <= row["end_s"]
    assert row["root_lp_bound"] <= result.bound


def test_the_check_limit_stops_the_watched_solve_where_it_stops_the_planners():
    mod = runpy.run_path(str(SCRIPT))
    g = parse_geometry(gen_layout().exporter_layout(1))  # 26 checks to its proof
    records, result = mod["watch"](g, max_checks=3)
    plain = _plain(g, max_checks=3)
    assert (result.cost, result.bound) == (plain.cost, plain.bound)
    assert not result.optimal
    # checks 1-3 and the one that interrupts (plus those of a repair, counted alike)
    assert len(records) - 1 == result.model["checks"] + result.model.get("repair_checks", 0)
    assert result.model["checks"] == 4
    assert exact._count_checks.__name__ == "_count_checks"  # unwrapped again
    assert exact._count_checks.__module__ == "kvgrant.layout.exact"


def test_a_repairs_bound_is_not_read_as_a_bound_on_every_plan():
    # a repair solves a neighbourhood: its dual bound (here 99) bounds only that
    # neighbourhood's plans, so 95 against the solve's 90 is 5.6% off, never "within 1%"
    mod = runpy.run_path(str(SCRIPT))

    class Result:
        cost, bound, optimal, model = 95, 90, False, {"checks": 2, "repair_checks": 1}

    records = [{"check": 1, "cpu_s": 1.0, "plan": 120.0, "bound": -math.inf, "repair": 0},
               {"check": 2, "cpu_s": 2.0, "plan": 100.0, "bound": 89.5, "repair": 0},
               {"check": 1, "cpu_s": 3.0, "plan": 95.0, "bound": 99.0, "repair": 1},
               {"check": 0, "cpu_s": 3.5, "plan": 95.0, "bound": 90.0, "repair": 0}]
    row = mod["summary"]("fake", records, Result())
    assert row["checks"] == row["result_checks"] == 3 and row["repair_checks"] == 1
    assert row["first_check_s"] == 1.0 and row["root_lp_s"] == 2.0
    assert row["root_lp_bound"] == 89.5
    assert row["bound_final_s"] == 2.0  # ceil(89.5) = 90, the result's bound
    assert row["plan_final_s"] == 3.0  # the repair's plan is a plan of the whole model
    assert row["within_1pct_s"] is None
    assert row["end_s"] == 3.5
