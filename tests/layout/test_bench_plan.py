"""benchmarks/bench_plan.py: the planner's view it derives from the measured parts.

Why: the figures in docs/layout.md are rendered by ``--from-json`` from those parts,
so the rule "exact when proven, else the better plan against the larger bound" must
be the planner's rule; these rows are made up, nothing is measured or timed.
"""

from __future__ import annotations

import json
import runpy
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

BENCH = Path(__file__).resolve().parents[2] / "benchmarks" / "bench_plan.py"


def _bench() -> dict[str, Any]:
    return runpy.run_path(str(BENCH))


def _row(**kw: Any) -> dict[str, Any]:
    row = {"name": "x", "chunks": 10, "naive": 20, "reference": 15, "heuristic": 12,
           "exact": 11, "solver_bound": 11, "verdict": "optimal", "exact_contract": 0,
           "bound": 9, "bound_s": 0.5, "heuristic_s": 0.25, "exact_cpu_s": 1.0,
           "exact_only_cpu_s": 1.0}
    row.update(kw)
    return row


def test_a_proven_exact_plan_is_the_packed_plan():
    r = _bench()["planner_view"](_row())
    assert (r["packed"], r["packed_bound"], r["packed_verdict"]) == (11, 11, "optimal")
    assert r["packed_cpu_s"] == 1.0  # no heuristic, no bound


def test_without_proof_the_better_plan_meets_the_larger_bound():
    view = _bench()["planner_view"]
    r = view(_row(exact=15, solver_bound=4, verdict="gap 11 (73.33%)", exact_cpu_s=1.25))
    assert (r["packed"], r["packed_bound"]) == (12, 9)
    assert r["packed_verdict"] == "gap 3 (25.00%)"
    assert r["packed_cpu_s"] == 1.75  # + the combinatorial bound
    # the combinatorial bound may prove what the solver's did not
    r = view(_row(exact=10, heuristic=12, solver_bound=8, bound=10,
                  verdict="gap 2 (20.00%)"))
    assert (r["packed"], r["packed_bound"], r["packed_verdict"]) == (10, 10, "optimal")


def test_a_windowed_plan_is_kept_as_plan_packed_keeps_it():
    # plan_packed runs no heuristic after windows, so the view keeps the windowed plan
    r = _bench()["planner_view"](_row(exact=15, heuristic=12, solver_bound=4, bound=9,
                                      verdict="gap 11 (73.33%)", exact_source="windows"))
    assert (r["packed"], r["packed_bound"]) == (15, 9)
    assert r["packed_verdict"] == "gap 6 (40.00%)"


def test_a_heuristic_plan_packed_did_not_run_is_not_counted():
    # past MAX_HEURISTIC_PAIRS, or with the plan at the combinatorial bound, plan_packed
    # runs no packer: its plan and CPU are the benchmark's column only (odd-11: 2,732
    # in 80 s against plan_packed's 3,248 in 8 s)
    view = _bench()["planner_view"]
    r = view(_row(exact=15, solver_bound=4, verdict="gap 11 (73.33%)", exact_cpu_s=1.25,
                  heuristic_run=False))
    assert (r["packed"], r["packed_bound"], r["packed_verdict"]) == (15, 9, "gap 6 (40.00%)")
    r = view(_row(exact=15, solver_bound=4, verdict="gap 11 (73.33%)", heuristic_run=True))
    assert r["packed"] == 12


def test_the_neighbourhood_search_counts_only_where_plan_packed_runs_it():
    view = _bench()["planner_view"]
    r = view(_row(exact=15, solver_bound=4, verdict="gap 11 (73.33%)", neighbourhood=10,
                  neighbourhood_s=2.0))
    assert (r["packed"], r["packed_bound"], r["packed_verdict"]) == (10, 9, "gap 1 (10.00%)")
    # a proven plan is kept as it is (rows never hold a search there; the view ignores it)
    r = view(_row(neighbourhood=10))
    assert (r["packed"], r["packed_verdict"]) == (11, "optimal")


@pytest.mark.parametrize("cap", [None, 0])
def test_measure_counts_the_heuristic_as_plan_packed_runs_it(monkeypatch, cap):
    from functools import partial

    from kvgrant.layout import planner
    from kvgrant.layout.geometry import load_geometry

    g = load_geometry(BENCH.parents[1] / "examples" / "published-dcp8.json")
    measure = _bench()["measure"]
    env = measure.__globals__  # the benchmark's module namespace
    # one limit check per solve: no proof, so the packer's turn comes (and the
    # neighbourhood search's, with the same limit, as plan_packed passes it)
    monkeypatch.setitem(env, "exact_plan", partial(env["exact_plan"], max_checks=1))
    monkeypatch.setitem(env, "neighbourhood", SimpleNamespace(
        search=partial(env["neighbourhood"].search, max_checks=1)))
    if cap is not None:
        monkeypatch.setitem(env, "MAX_HEURISTIC_PAIRS", cap)
        monkeypatch.setattr(planner, "MAX_HEURISTIC_PAIRS", cap)
    row = measure(g)
    assert row["verdict"] != "optimal" and row["heuristic"] < row["exact"]
    assert row["heuristic_run"] is (cap is None)
    res = planner._solve(g, None, planner.DEFAULT_NODE_LIMIT, planner.DEFAULT_MAX_NONZEROS,
                         max_checks=1)
    assert (row["packed"], row["packed_bound"]) == (len(res.plan.allocations), res.bound)


def test_from_json_renders_an_earlier_run(tmp_path, capsys):
    doc = {"results": {"examples": [_row(), _row(name="y", exact=14, solver_bound=3,
                                                   verdict="gap 11 (78.57%)")]}}
    path = tmp_path / "run.json"
    path.write_text(json.dumps(doc))
    assert _bench()["main"](["--from-json", str(path)]) == 0
    out = capsys.readouterr().out
    assert "| x | 10 | 20 | 15 | 12 | 11 | optimal | 9 | 11 | optimal |" in out
    assert "| y |" in out and "gap 3 (25.00%)" in out
    assert "- packed_optimal: 1" in out


def test_highs_options_parse_as_json_or_text():
    opt = _bench()["_option"]
    assert opt("presolve=off") == ("presolve", "off")
    assert opt("mip_heuristic_effort=0.0") == ("mip_heuristic_effort", 0.0)
    assert opt("mip_detect_symmetry=false") == ("mip_detect_symmetry", False)


def test_only_measures_the_named_layouts_with_the_given_options(capsys):
    argv = ["--family", "0", "--unseen", "0", "--random", "0", "--only", "small",
            "--highs", "presolve=off", "--json"]
    assert _bench()["main"](argv) == 0
    doc = json.loads(capsys.readouterr().out)
    rows = [r for v in doc["results"].values() for r in v]
    assert [r["name"] for r in rows] == ["small"]
    assert rows[0]["verdict"] == "optimal" and rows[0]["exact_contract"] == 0


def test_a_solve_again_from_the_heuristic_plan_counts_when_it_is_better():
    # plan_packed solves again from the packer's plan when it beat the solver's; the
    # view takes the best of the three plans and the largest of the bounds
    view = _bench()["planner_view"]
    r = view(_row(exact=15, solver_bound=4, verdict="gap 11 (73.33%)", heuristic=12,
                  heuristic_run=True, resolve=10, resolve_bound=9, bound=5))
    assert (r["packed"], r["packed_bound"], r["packed_verdict"]) == (10, 9, "gap 1 (10.00%)")
    r = view(_row(exact=15, solver_bound=4, verdict="gap 11 (73.33%)", heuristic=12,
                  heuristic_run=True, resolve=12, resolve_bound=12, bound=5))
    assert (r["packed"], r["packed_bound"], r["packed_verdict"]) == (12, 12, "optimal")
