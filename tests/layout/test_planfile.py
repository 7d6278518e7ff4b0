"""Plan files and the plan cache: plan once, reuse the plan (issue #17, point 3)."""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

import pytest

from kvgrant.commands import alloc as alloc_command
from kvgrant.commands import plan as plan_command
from kvgrant.errors import PlanError
from kvgrant.layout import planner
from kvgrant.layout.contract import check_contract
from kvgrant.layout.geometry import load_geometry, parse_geometry
from kvgrant.layout.planfile import geometry_hash, plan_document, read_plan_file
from kvgrant.layout.plans import packed_plan
from layout_builders import geometry_dict

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


def _run(module: Any, name: str, argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="kvgrant")
    module.add_parser(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args([name, *argv])
    return int(args.run(args))


def test_plan_json_is_a_plan_file_that_alloc_reuses(tmp_path: Path, capsys: Any,
                                                   monkeypatch: Any) -> None:
    geo = EXAMPLES / "small.json"  # G = 2 MiB, as the simulated driver needs
    assert _run(plan_command, "plan", [str(geo), "--json", "--no-bound"]) == 0
    out = tmp_path / "plan.json"
    out.write_text(capsys.readouterr().out)
    g = load_geometry(geo)
    plan = read_plan_file(out, g)
    assert check_contract(g, plan) == []
    assert plan.allocations == packed_plan(g).allocations

    def no_planning(*a: Any, **k: Any) -> Any:
        raise AssertionError("alloc --plan FILE must not plan again")

    monkeypatch.setattr(planner, "_solve", no_planning)
    monkeypatch.setattr(planner, "_cached", no_planning)
    assert _run(alloc_command, "alloc", [str(geo), "--backend", "sim", "--plan", str(out),
                                         "--json"]) == 0
    rep = json.loads(capsys.readouterr().out)
    assert rep["ok"] is True and rep["plan"] == "packed"


def test_a_plan_file_of_another_layout_is_refused(tmp_path: Path) -> None:
    g = parse_geometry(geometry_dict())
    other = parse_geometry(geometry_dict(pages=12))
    path = tmp_path / "plan.json"
    path.write_text(json.dumps(plan_document(packed_plan(other))))
    with pytest.raises(PlanError, match="geometry_hash = .*another layout"):
        read_plan_file(path, g)


@pytest.mark.parametrize("mutate, field", [
    (lambda d: d.update(version=7), "version = 7"),
    (lambda d: d["allocations"][0].update(length=-1), r"allocations\[0\]\.length = -1"),
    (lambda d: d["allocations"][0].pop("plane"), r"allocations\[0\] = dict"),
    (lambda d: d.update(allocations="x"), 'allocations = "x"'),
])
def test_bad_plan_files_name_the_field(tmp_path: Path, mutate: Any, field: str) -> None:
    g = parse_geometry(geometry_dict())
    doc = plan_document(packed_plan(g))
    mutate(doc)
    path = tmp_path / "plan.json"
    path.write_text(json.dumps(doc))
    with pytest.raises(PlanError, match=field):
        read_plan_file(path, g)


def test_the_hash_ignores_name_and_topology_but_not_the_layout() -> None:
    g = parse_geometry(geometry_dict())
    assert geometry_hash(g) == geometry_hash(parse_geometry(
        geometry_dict(name="other", topology={"ranks": 1})))
    assert geometry_hash(g) != geometry_hash(parse_geometry(geometry_dict(pages=12)))


def test_the_same_layout_is_solved_once(monkeypatch: Any) -> None:
    calls = []
    real = planner._solve

    def counting(*a: Any, **k: Any) -> Any:
        calls.append(1)
        return real(*a, **k)

    monkeypatch.setattr(planner, "_solve", counting)
    planner._cached.cache_clear()
    g = parse_geometry(geometry_dict(name="cache-test"))
    first = planner.plan_packed(g)
    again = planner.plan_packed(parse_geometry(geometry_dict(name="renamed",
                                                             topology={"ranks": 1})))
    assert len(calls) == 1
    assert first.plan.allocations == again.plan.allocations
    assert again.plan.geometry.name == "renamed"
