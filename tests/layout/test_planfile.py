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
from kvgrant.layout.rules import naive_plan, reference_plan
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
    # the entry itself, short enough to show (was: "allocations[0] = dict")
    (lambda d: d["allocations"][0].pop("plane"),
     r"allocations\[0\] = \{\"plane_offset\": 0, .*: must have plane"),
    # a name that is not the geometry's, cut (was: 100,000 characters echoed in full)
    (lambda d: d["allocations"][0].update(plane="x" * 100_000),
     r"allocations\[0\]\.plane = \"x{75}\.\.\.\": must name a plane of geometry "),
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


# ------------------------------------------- kvgrant alloc --plan FILE: bad input, exit 2

def _alloc_plan_file(tmp_path: Path, capsys: Any, doc: Any) -> tuple[int, str]:
    """``kvgrant alloc small.json --backend sim --plan FILE`` through the dispatcher."""
    from kvgrant.cli import main

    path = tmp_path / "plan.json"
    path.write_text(doc if isinstance(doc, str) else json.dumps(doc))
    rc = main(["alloc", str(EXAMPLES / "small.json"), "--backend", "sim", "--plan",
               str(path)])
    return rc, capsys.readouterr().err


def _small_plan_doc() -> dict[str, Any]:
    return plan_document(packed_plan(load_geometry(EXAMPLES / "small.json")))


@pytest.mark.parametrize("mutate, names", [
    (lambda d: d.update(version=7), ["version = 7", "must be 1"]),
    (lambda d: d.update(geometry_hash="sha256:0"),
     ['geometry_hash = "sha256:0"', "another layout"]),
    (lambda d: d["allocations"][0].update(length=-1),
     ["allocations[0].length = -1", "integer >= 0"]),
    (lambda d: d.update(allocations="x"), ['allocations = "x"', "must be a list"]),
    (lambda d: d.update(label="fastest"), ['label = "fastest"', "naive, reference, packed"]),
])
def test_a_malformed_plan_file_exits_2_naming_file_field_value_and_rule(
        tmp_path: Path, capsys: Any, mutate: Any, names: list[str]) -> None:
    # was: exit 1 (a PlanError, as for a refused request), unlike a malformed geometry
    doc = _small_plan_doc()
    mutate(doc)
    rc, err = _alloc_plan_file(tmp_path, capsys, doc)
    assert rc == 2, err
    assert f"plan file {json.dumps(str(tmp_path / 'plan.json'))}" in err, err
    for name in names:
        assert name in err, err


@pytest.mark.parametrize("text, rule", [("{", "not JSON"), ("[1]", "must be a JSON object")])
def test_a_plan_file_that_is_not_a_plan_document_exits_2(tmp_path: Path, capsys: Any,
                                                         text: str, rule: str) -> None:
    rc, err = _alloc_plan_file(tmp_path, capsys, text)
    assert rc == 2 and rule in err and "plan.json" in err, err


def test_a_missing_plan_file_exits_2(tmp_path: Path, capsys: Any) -> None:
    from kvgrant.cli import main

    rc = main(["alloc", str(EXAMPLES / "small.json"), "--backend", "sim", "--plan",
               str(tmp_path / "none.json")])
    err = capsys.readouterr().err
    assert rc == 2 and "none.json" in err, err
    assert "not a plan label (naive, reference, packed) and no such file" in err, err


def test_a_plan_file_that_breaks_the_contract_exits_2(tmp_path: Path, capsys: Any) -> None:
    """The layout's hash, but allocations that do not fit it: bad input, not a refused
    request (was: the allocator's ContractError, exit 1)."""
    doc = _small_plan_doc()
    doc["allocations"] = doc["allocations"][1:]  # bytes of a plane left uncovered
    rc, err = _alloc_plan_file(tmp_path, capsys, doc)
    assert rc == 2, err
    assert "plan.json" in err and "allocations = " in err and "layout contract" in err, err


def test_plan_file_errors_are_plan_errors_with_the_field(tmp_path: Path) -> None:
    """PlanFileError is a PlanError (callers catching that still do) and a ValueError,
    and holds the path, field and value."""
    from kvgrant.errors import PlanFileError

    g = load_geometry(EXAMPLES / "small.json")
    doc = dict(_small_plan_doc(), version=7)
    path = tmp_path / "plan.json"
    path.write_text(json.dumps(doc))
    with pytest.raises(PlanFileError) as info:
        read_plan_file(path, g)
    err = info.value
    assert isinstance(err, PlanError) and isinstance(err, ValueError)
    assert (err.path, err.field, err.value) == (str(path), "version", 7)


def test_a_malformed_plan_file_with_json_names_the_field(tmp_path: Path, capsys: Any) -> None:
    from kvgrant.cli import main

    path = tmp_path / "plan.json"
    path.write_text(json.dumps(dict(_small_plan_doc(), version=7)))
    rc = main(["alloc", str(EXAMPLES / "small.json"), "--backend", "sim", "--plan",
               str(path), "--json"])
    out = json.loads(capsys.readouterr().out)
    assert rc == 2
    assert (out["ok"], out["kind"], out["field"], out["value"]) == (
        False, "PlanFileError", "version", 7)


def test_a_packed_plan_relabelled_as_a_rule_is_refused(tmp_path: Path, capsys: Any) -> None:
    """A rule label promises the rule's plan: conform --geometry re-derives it, so a
    packed plan called 'naive' would be allocated and its trace rejected later."""
    doc = _small_plan_doc()
    assert len(doc["allocations"]) != len(plan_document(
        naive_plan(load_geometry(EXAMPLES / "small.json")))["allocations"])
    doc["label"] = "naive"
    rc, err = _alloc_plan_file(tmp_path, capsys, doc)
    assert rc == 2, err
    assert "allocations[" in err and "labelled 'naive' must be the naive rule's plan" in err, err


@pytest.mark.parametrize("rule", [naive_plan, reference_plan])
def test_a_rule_plan_under_its_own_label_is_read_back(tmp_path: Path, rule: Any) -> None:
    g = load_geometry(EXAMPLES / "small.json")
    want = rule(g)
    path = tmp_path / "plan.json"
    path.write_text(json.dumps(plan_document(want)))
    got = read_plan_file(path, g)
    assert got.label == want.label and got.allocations == want.allocations


@pytest.mark.parametrize("plan_of, label", [(naive_plan, "reference"),
                                            (reference_plan, "naive")])
def test_one_rules_plan_under_the_other_rules_label_is_refused(
        tmp_path: Path, plan_of: Any, label: str) -> None:
    """published-dcp8, where the two rules differ (2,037 against 1,747 allocations): the
    naive plan labelled 'reference', or the reference plan labelled 'naive', is refused
    (a mutant that checked only the 'naive' label accepted the first; small.json's two
    rule plans are the same, so it cannot show this)."""
    from kvgrant.errors import PlanFileError

    g = load_geometry(EXAMPLES / "published-dcp8.json")
    assert len(naive_plan(g).allocations) != len(reference_plan(g).allocations)
    doc = plan_document(plan_of(g))
    doc["label"] = label
    path = tmp_path / "plan.json"
    path.write_text(json.dumps(doc))
    with pytest.raises(PlanFileError) as info:
        read_plan_file(path, g)
    assert f"labelled {label!r} must be the {label} rule's plan" in str(info.value)
