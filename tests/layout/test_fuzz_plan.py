"""benchmarks/fuzz_plan.py: plan_packed on seeds nobody looked at, checked per layout.

Why: its figures (docs/layout.md, "Unseen seeds") are the evidence that the planner's
promises hold past the benchmark's 35 layouts, so its checks must catch a broken
plan and its children must end with it; nothing here is timed.
"""

from __future__ import annotations

import dataclasses
import json
import runpy
from pathlib import Path
from typing import Any

import pytest

from kvgrant.layout.geometry import load_geometry
from kvgrant.layout.planner import plan_packed
from kvgrant.layout.rules import naive_plan

ROOT = Path(__file__).resolve().parents[2]
FUZZ = ROOT / "benchmarks" / "fuzz_plan.py"


def _fuzz() -> dict[str, Any]:
    return runpy.run_path(str(FUZZ))


def test_seed_lists_name_family_and_span():
    parse = _fuzz()["parse_seeds"]
    assert parse("exporter:3-5,odd:7") == [("exporter", 3), ("exporter", 4),
                                           ("exporter", 5), ("odd", 7)]
    for bad, says in (("exporters:1-2", "FAMILY"), ("random:x", "integers"),
                      ("random:5-2", "A <= B"), ("random", "FAMILY")):
        with pytest.raises(SystemExit, match=says):
            parse(bad)


def test_a_good_plan_has_no_finding_and_each_broken_promise_is_one():
    findings = _fuzz()["findings"]
    g = load_geometry(ROOT / "examples" / "published-dcp8.json")
    good = plan_packed(g, max_gap=0)
    row = findings(g, good)
    assert row["bad"] == [] and row["optimal"] and row["packed"] == row["bound"]
    naive = dataclasses.replace(good, plan=naive_plan(g))  # above the reference rule
    assert any("reference rule" in b for b in findings(g, naive)["bad"])
    over = dataclasses.replace(good, bound=row["packed"] + 1, optimal=False)
    assert any("bound exceeds" in b for b in findings(g, over)["bad"])
    flag = dataclasses.replace(good, bound=row["packed"] - 1)  # "optimal" with a gap
    assert any("optimal=True" in b for b in findings(g, flag)["bad"])


def test_layouts_plan_in_children_and_those_past_the_limit_are_stopped(tmp_path, capsys):
    main = _fuzz()["main"]
    out = tmp_path / "rows.jsonl"
    assert main(["--seeds", "random:2,random:4", "--jobs", "2", "--limit", "300",
                 "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    assert '"finished": 2' in printed and '"findings": 0' in printed
    assert len(out.read_text().splitlines()) == 2
    # a child cannot start in a millisecond: it is stopped, reaped, and counted
    assert main(["--seeds", "random:2", "--jobs", "1", "--limit", "0.001"]) == 0
    assert '"over_limit": 1' in capsys.readouterr().out


def test_planner_limits_parse_and_refuse_what_plan_packed_would_not_take():
    parse = _fuzz()["parse_limits"]
    assert parse([]) == {}
    assert parse(["max_checks=100", "node_limit=none", "max_solves=2", "max_gap=0"]) == {
        "max_checks": 100, "node_limit": None, "max_solves": 2, "max_gap": 0.0}
    for bad, says in (("checks=3", "NAME=VALUE"), ("max_checks", "NAME=VALUE"),
                      ("max_checks=x", "integer or none"), ("max_solves=none", "integer"),
                      ("node_limit=0", "at least 1"), ("max_gap=1", "fraction"),
                      ("max_gap=-0.1", "fraction"), ("max_gap=nan", "fraction")):
        with pytest.raises(SystemExit, match=says):
            parse([bad])


def test_planner_limits_reach_the_child_and_its_row(tmp_path):
    main = _fuzz()["main"]
    rows = {}
    for name, extra in (("default", []), ("cut", ["--planner", "max_checks=2"])):
        out = tmp_path / f"{name}.jsonl"
        assert main(["--seeds", "random:1", "--jobs", "1", "--limit", "300",
                     "--out", str(out), *extra]) == 0
        rows[name] = json.loads(out.read_text())
    # random-1 proves its optimum after more than 2 checks; stopped after 2 it may not
    assert "limits" not in rows["default"] and rows["default"]["checks"] > 3
    assert rows["cut"]["limits"] == {"max_checks": 2} and rows["cut"]["checks"] <= 3
    assert rows["cut"]["nonzeros"] == rows["default"]["nonzeros"]
