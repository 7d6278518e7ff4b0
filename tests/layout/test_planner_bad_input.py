"""Planner and plan-file entry points with bad arguments (a probe of the public API,
2026-12-02): each was an AttributeError / TypeError / ValueError from inside the solver
or pydantic, or was taken silently (``node_limit=-1``, ``max_checks=nan``); each is now
an ArgumentError (or PlanError for a plan label) naming the argument and the rule."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Callable

import pytest

from kvgrant.errors import ArgumentError, PlanError
from kvgrant.layout import planfile
from kvgrant.layout.geometry import load_geometry
from kvgrant.layout.planner import plan_packed
from kvgrant.layout.plans import make_plan

SMALL = Path(__file__).resolve().parents[2] / "examples" / "small.json"
G = load_geometry(SMALL)


@pytest.mark.parametrize("kw, argument, rule", [
    ({"node_limit": "x"}, "node_limit", "must be None (no limit) or an integer >= 0"),
    ({"node_limit": -1}, "node_limit", "must be None (no limit) or an integer >= 0"),
    ({"max_checks": float("nan")}, "max_checks", "or an integer >= 0"),
    ({"max_nonzeros": True}, "max_nonzeros", "or an integer >= 0"),
    ({"max_windowed_nonzeros": 1.5}, "max_windowed_nonzeros", "or an integer >= 0"),
    ({"max_solves": 0}, "max_solves", "must be an integer >= 1"),
    ({"max_solves": None}, "max_solves", "must be an integer >= 1"),
    ({"progress": 1}, "progress", "must be None or a callable"),
    ({"max_gap": 1}, "max_gap", "must be a fraction >= 0 and < 1"),
    ({"max_gap": -0.01}, "max_gap", "must be a fraction >= 0 and < 1"),
    ({"max_gap": float("nan")}, "max_gap", "must be a fraction >= 0 and < 1"),
    ({"max_gap": True}, "max_gap", "must be a fraction >= 0 and < 1"),
    ({"max_gap": "0.01"}, "max_gap", "must be a fraction >= 0 and < 1"),
])
def test_plan_packed_names_a_bad_limit(kw: dict[str, Any], argument: str, rule: str) -> None:
    with pytest.raises(ArgumentError) as err:
        plan_packed(G, **kw)
    assert err.value.argument == argument and rule in str(err.value), err.value


def test_plan_packed_takes_a_geometry_not_its_path() -> None:
    with pytest.raises(ArgumentError, match=r"plan_packed: g = .*small\.json.*: must be a "
                                            r"Geometry \(read a geometry file with"):
        plan_packed(str(SMALL))  # type: ignore[arg-type]
    assert plan_packed(G, node_limit=0, max_nonzeros=0).plan.label == "packed"


def test_make_plan_names_a_label_that_is_not_a_string() -> None:
    # an ArgumentError (bad input, exit 2), as allocate(plan=...) says it; was PlanError
    for label in (["packed"], "optimal"):
        with pytest.raises(ArgumentError, match=r"plan = .*: unknown plan label") as info:
            make_plan(G, label)  # type: ignore[arg-type]
        assert info.value.argument == "plan" and info.value.value == label


@pytest.mark.parametrize("call, needle", [
    (lambda: planfile.read_plan_file("p.json", str(SMALL)), "read_plan_file: g = "),
    (lambda: planfile.read_plan_file(3, G), "read_plan_file: path = 3: must be a file path"),
    (lambda: planfile.read_plan_file(b"p.json", G), "read_plan_file: path = bytes"),
    (lambda: planfile.geometry_hash("x"), "geometry_hash: g = \"x\": must be a Geometry"),
    (lambda: planfile.plan_document(None), "plan_document: plan = null: must be a "
                                           "PhysicalPlan"),
])
def test_plan_file_functions_name_a_bad_argument(call: Callable[[], Any], needle: str) -> None:
    with pytest.raises(ArgumentError) as err:
        call()
    assert needle in str(err.value), err.value
