"""``kvgrant plan``: figures per plan, pre-flight verdicts, and a checkable --json plan."""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

import pytest
from layout_builders import geometry_dict, published_like_dict, simple_plan

from kvgrant.commands import plan as plan_command
from kvgrant.errors import GeometryError
from kvgrant.layout.contract import check_contract
from kvgrant.layout.geometry import parse_geometry
from kvgrant.layout.plan import Allocation, PhysicalPlan
from kvgrant.layout.preflight import handle_demand
from kvgrant.layout.report import build_report, format_report, plan_figures


def run_plan(argv: list[str]) -> int:
    """Run the subcommand through its own parser (as ``kvgrant.cli`` wires it)."""
    parser = argparse.ArgumentParser(prog="kvgrant")
    plan_command.add_parser(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(["plan", *argv])
    return int(args.run(args))


@pytest.fixture
def small_file(tmp_path: Path) -> Path:
    path = tmp_path / "small.json"
    path.write_text(json.dumps(geometry_dict()))
    return path


def test_text_output_names_every_figure(small_file: Path, capsys: Any) -> None:
    assert run_plan([str(small_file)]) == 0
    out = capsys.readouterr().out
    for label in ("naive", "reference", "packed"):
        assert label in out
    for words in ("allocations", "mappings", "grants", "handles", "largest conflict set",
                  "allocation lower bound", "budget 523,880", "owner+importers",
                  "declared readers", "layout contract, packed plan: kept"):
        assert words in out
    assert "region 'snap' row 1: 3 pages" in out


def test_handle_budget_option_sets_the_verdict(small_file: Path, capsys: Any) -> None:
    g = parse_geometry(geometry_dict())
    from kvgrant.layout.plans import make_plan

    demand = handle_demand(g, make_plan(g, "packed"))
    # the budget less the reserve (default 4,096, as kvgrant alloc counts it) is the margin
    run_plan([str(small_file), "--handle-budget", str(demand + 4_096)])
    fits = capsys.readouterr().out
    run_plan([str(small_file), "--handle-budget", str(demand + 4_095)])
    over = capsys.readouterr().out
    packed_line = lambda text: next(  # noqa: E731
        ln for ln in text.splitlines() if ln.startswith("packed") and "owner+importers" in ln)
    assert "fits" in packed_line(fits) and "+0" in packed_line(fits)
    assert "EXCEEDS BUDGET" in packed_line(over) and "-1" in packed_line(over)


def test_bad_handle_budget_is_rejected_by_the_parser(small_file: Path, capsys: Any) -> None:
    for bad in ("-3", "lots"):
        with pytest.raises(SystemExit) as info:
            run_plan([str(small_file), "--handle-budget", bad])
        assert info.value.code == 2
        assert "--handle-budget" in capsys.readouterr().err


def test_bad_geometry_is_reported_not_raised(tmp_path: Path, capsys: Any) -> None:
    path = tmp_path / "bad.json"
    doc = geometry_dict()
    doc["aliases"][0]["length"] = 6
    path.write_text(json.dumps(doc))
    assert run_plan([str(path)]) == 2
    err = capsys.readouterr()
    assert err.out == "" and "aliases[0].length = 6" in err.err
    # --json writes JSON on an error too, naming the field and the value
    assert run_plan([str(path), "--json"]) == 2
    rep = json.loads(capsys.readouterr().out)
    assert rep["ok"] is False and rep["kind"] == GeometryError.__name__
    assert rep["field"] == "aliases[0].length" and rep["value"] == 6


def test_missing_file_with_json_is_json(tmp_path: Path, capsys: Any) -> None:
    assert run_plan([str(tmp_path / "none.json"), "--json"]) == 2
    rep = json.loads(capsys.readouterr().out)
    assert rep["ok"] is False and "cannot read" in rep["error"]


def test_packed_verdict_and_handle_bound_are_printed(small_file: Path, capsys: Any) -> None:
    assert run_plan([str(small_file)]) == 0
    out = capsys.readouterr().out
    assert "packed plan:" in out and "optimal" in out
    assert "any plan that keeps the layout contract needs at least" in out
    assert run_plan([str(small_file), "--json"]) == 0
    rep = json.loads(capsys.readouterr().out)
    solver = rep["packed_solver"]
    assert solver["optimal"] is True and solver["bound"] == rep["plans"]["packed"]["allocations"]
    assert rep["plans"]["packed"]["verdict"] == "optimal"
    hb = rep["handle_lower_bound"]
    assert hb["importers"] <= rep["plans"]["packed"]["preflight"]["importers"]["demand"]
    assert hb["declared"] <= rep["plans"]["packed"]["preflight"]["declared"]["demand"]


def test_no_bound_skips_the_bounds(small_file: Path, capsys: Any) -> None:
    assert run_plan([str(small_file), "--no-bound", "--json"]) == 0
    rep = json.loads(capsys.readouterr().out)
    assert rep["lower_bound"] is None and rep["handle_lower_bound"] is None
    assert rep["packed_solver"]["optimal"] is True


def test_a_granularity_memory_cannot_have_is_planned_with_a_note(
        small_file: Path, tmp_path: Path, capsys: Any) -> None:
    """Planning takes any granularity, allocating refuses one that is not a power of
    two: the report said "fits" and "kept" and nothing of that (the plan file it wrote
    could never be allocated)."""
    G3 = {"name": "G3", "granularity": 3, "pages": 4, "page_tokens": 16,
          "planes": [{"name": "p", "bytes_per_page": 3}],
          "regions": [{"name": "r", "rows": 1, "row_bytes": 6}],
          "aliases": [{"region": "r", "offset": 0, "plane": "p", "plane_offset": 0,
                       "length": 6}],
          "topology": {"ranks": 2, "import_groups": [[0, 1]]}}
    path = tmp_path / "g3.json"
    path.write_text(json.dumps(G3))
    assert run_plan([str(path)]) == 0
    assert "note: granularity = 3 is not a power of two" in capsys.readouterr().out
    assert run_plan([str(path), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["geometry"]["allocatable"] is False
    assert run_plan([str(small_file), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["geometry"]["allocatable"] is True
    assert run_plan([str(small_file)]) == 0
    assert "note: granularity" not in capsys.readouterr().out


def test_json_plan_can_be_checked_independently(small_file: Path, capsys: Any) -> None:
    assert run_plan([str(small_file), "--json"]) == 0
    rep = json.loads(capsys.readouterr().out)
    g = parse_geometry(geometry_dict())
    assert set(rep["plans"]) == {"naive", "reference", "packed"}
    allocs = []
    for a in rep["packed_plan"]["allocations"]:
        assert set(a) in ({"plane", "plane_offset", "length"},
                          {"plane", "plane_offset", "length", "region", "region_offset"})
        allocs.append(Allocation(**a))
    assert check_contract(g, allocs) == []
    packed = rep["plans"]["packed"]
    assert packed["allocations"] == len(allocs)
    assert packed["mappings"] == sum(2 if a.aliased else 1 for a in allocs)
    pre = packed["preflight"]["importers"]
    assert pre["demand"] == sum(r["handles"] for r in packed["per_rank"])
    assert pre["demand"] == handle_demand(g, PhysicalPlan("x", g, tuple(allocs)))
    assert pre["margin"] == 523_880 - 4_096 - pre["demand"] and pre["fits"] is True
    assert rep["largest_conflict_set"] == {"region": "snap", "row": 1, "pages": 3}
    assert rep["lower_bound"] is None or rep["lower_bound"]["total"] <= packed["allocations"]


def test_report_groups_equal_ranks_and_lists_contract_breaks() -> None:
    doc = geometry_dict(topology={"ranks": 3, "import_groups": [[0, 1]]})
    g = parse_geometry(doc)
    good = simple_plan(g, "good")
    broken = PhysicalPlan("broken", g, good.allocations[1:])
    text = format_report(g, [good, broken], 100)
    assert "ranks 0-1" in text and "rank 2 " in text
    assert "layout contract, broken plan: BROKEN" in text
    figs = plan_figures(g, broken, 100)
    assert figs.contract and figs.contract[0].startswith("point ")
    rep = build_report(g, [good], 100, include_plan="good")
    assert len(rep["good_plan"]["allocations"]) == len(good.allocations)


def test_published_scale_plan_command(tmp_path: Path, capsys: Any) -> None:
    path = tmp_path / "published.json"
    path.write_text(json.dumps(published_like_dict()))
    assert run_plan([str(path), "--json"]) == 0
    rep = json.loads(capsys.readouterr().out)
    assert all(not p["contract_violations"] for p in rep["plans"].values())
    assert rep["plans"]["packed"]["preflight"]["declared"]["fits"] is False


EXAMPLES = sorted((Path(__file__).resolve().parents[2] / "examples").glob("*.json"))


@pytest.mark.parametrize("path", EXAMPLES, ids=[p.stem for p in EXAMPLES])
def test_every_example_plans_and_keeps_the_contract(path: Path, capsys: Any) -> None:
    assert run_plan([str(path), "--json"]) == 0
    rep = json.loads(capsys.readouterr().out)
    g = parse_geometry(json.loads(path.read_text()))
    allocs = [Allocation(**a) for a in rep["packed_plan"]["allocations"]]
    assert check_contract(g, allocs) == []
    for label, figs in rep["plans"].items():
        assert figs["contract_violations"] == [], label
    if rep["lower_bound"] is not None:
        assert rep["lower_bound"]["total"] <= rep["plans"]["packed"]["allocations"]


def test_held_progress_lines_keep_the_time_they_were_reported_at(monkeypatch: Any,
                                                                 capsys: Any) -> None:
    from kvgrant.commands import plan as plan_cmd

    import types

    clock = iter([0.0, 0.2, 0.2, 0.7, 0.7, 1.6, 1.6])  # only the command's clock
    monkeypatch.setattr(plan_cmd, "time", types.SimpleNamespace(perf_counter=lambda: next(clock)))
    progress = plan_cmd._Progress(delay=1.0)
    progress("first")   # at 0.2 s: held
    progress("second")  # at 0.7 s: held
    progress("third")   # at 1.6 s: all three shown, each with its own time
    err = capsys.readouterr().err.splitlines()
    assert err == ["kvgrant plan: [  0.2 s] first", "kvgrant plan: [  0.7 s] second",
                   "kvgrant plan: [  1.6 s] third"]


def test_the_bound_for_the_gap_is_not_computed_twice(tmp_path: Path, capsys: Any,
                                                     monkeypatch: Any) -> None:
    """Without a proof plan_packed computes the combinatorial bound for the gap;
    ``kvgrant plan`` reports that one (it took 12 s twice at 40,000 chunks)."""
    from kvgrant.layout import bound, planner

    calls: list[str] = []
    real = bound.allocation_lower_bound

    def counted(g):
        calls.append(g.name)
        return real(g)

    monkeypatch.setattr(bound, "allocation_lower_bound", counted)
    monkeypatch.setattr(planner, "allocation_lower_bound", counted)
    # no solve at all (max_nonzeros 0, no windows): the gap needs the combinatorial bound
    real_plan = planner.plan_packed
    monkeypatch.setattr(planner, "plan_packed", lambda g, progress=None, time_limit=None:
                        real_plan(g, progress=progress, max_nonzeros=0,
                                  max_windowed_nonzeros=0, time_limit=time_limit))
    path = tmp_path / "pub.json"
    path.write_text(json.dumps(published_like_dict(ranks=2)))
    assert run_plan([str(path)]) == 0
    out = capsys.readouterr().out
    assert len(calls) == 1
    assert "allocation lower bound per rank (combinatorial)" in out
