"""benchmarks/root_cuts.py: the LP it solves is the planner's model, and its check
that the cuts keep every plan can fail.

Why: its figures (docs/layout.md, "Speed: a few root cuts carry the bound") say how
much of the root gap HiGHS's cuts close; they mean something only if the LP without
the cuts is the model's own relaxation and the cuts are over the model's columns.
Nothing here is timed.
"""

from __future__ import annotations

import runpy
from pathlib import Path

import numpy as np
import pytest
from layout_builders import gen_layout

from kvgrant.layout import exact
from kvgrant.layout.geometry import load_geometry, parse_geometry

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "root_cuts.py"


@pytest.fixture(scope="module")
def captured():
    mod = runpy.run_path(str(SCRIPT))
    g = parse_geometry(gen_layout().exporter_layout(1))  # 72 root cuts, proven at 626
    result, cap = mod["solve_captured"](g)
    return mod, g, result, cap


def _model_lp(g) -> float:
    """The LP relaxation of exact._build's model, built here on its own."""
    import highspy

    m, _ = exact._build(g, 1.0, {})
    h = exact._mip(m.cost, m.lower, m.upper, m.rows_lo, m.rows_hi, *exact._csr(m.rows), None)
    n = len(m.cost)
    h.changeColsIntegrality(n, np.arange(n, dtype=np.int32),
                            np.full(n, highspy.HighsVarType.kContinuous))
    h.run()
    return h.getInfo().objective_function_value + m.offset


def test_the_lp_is_the_models_and_the_cuts_lift_it_without_passing_the_plan(captured):
    mod, g, result, cap = captured
    assert exact._count_checks.__module__ == "kvgrant.layout.exact"  # unwrapped again
    assert cap.cuts is not None and cap.cut_columns == len(cap.cost)
    row = mod["summary"]("exporter-1", result, cap)
    assert row["lp"] == pytest.approx(_model_lp(g), abs=0.01)
    assert row["cuts"] == len(cap.cuts.lower) > 0
    assert 0 < row["binding"] <= row["cuts"]
    assert row["lp"] < row["lp_cuts"] <= result.cost + 1e-6
    assert 0 < row["closed"] <= 1
    assert row["bad"] == []


def test_a_cut_above_the_plan_is_reported(captured):
    mod, _, result, cap = captured
    # one more "cut": the objective itself at least the plan + 5, which no plan meets
    n = len(cap.cost)
    cols = np.flatnonzero(cap.cost)
    rows = mod["Rows"](np.array([result.cost + 5.0]), np.array([np.inf]),
                       np.array([0, len(cols)]), cols, cap.cost[cols])
    bad = mod["Capture"](cap.cost, cap.col_lower, cap.col_upper, cap.rows, rows, n)
    row = mod["summary"]("bad", result, bad)
    assert row["lp_cuts"] == pytest.approx(result.cost + 5.0, abs=1e-6)
    assert row["binding"] == 1
    assert row["bad"] and "above the plan" in row["bad"][0]


def test_cuts_over_other_columns_are_refused(captured):
    mod, _, _, cap = captured
    other = mod["Capture"](cap.cost, cap.col_lower, cap.col_upper, cap.rows, cap.cuts,
                           len(cap.cost) - 1)  # as with presolve on: its own columns
    with pytest.raises(RuntimeError, match="columns"):
        mod["lp_bound"](other, with_cuts=True)


@pytest.mark.parametrize("example", ["small-inward", "published-dcp8"])
def test_a_model_not_solved_at_once_is_refused(example):
    # over the size limit: small-inward is then not solved, published-dcp8 solved in
    # windows; neither gives one model's root to measure
    mod = runpy.run_path(str(SCRIPT))
    g = load_geometry(Path(__file__).resolve().parents[2] / "examples" / f"{example}.json")
    with pytest.raises(RuntimeError, match="not solved at once"):
        mod["solve_captured"](g, max_nonzeros=1)
    assert exact._count_checks.__module__ == "kvgrant.layout.exact"


def test_it_needs_a_layout():
    mod = runpy.run_path(str(SCRIPT))
    with pytest.raises(SystemExit) as err:
        mod["main"]([])
    assert err.value.code == 2
