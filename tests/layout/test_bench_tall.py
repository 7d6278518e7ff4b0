"""benchmarks/bench_tall.py: its tall layouts are the ones the docs describe, valid
under the geometry rules, and its phases are those of ``kvgrant plan`` (nothing here
is timed: the figures are printed, never checked)."""

from __future__ import annotations

import runpy
from pathlib import Path
from typing import Any

from kvgrant.layout.geometry import parse_geometry

BENCH = Path(__file__).resolve().parents[2] / "benchmarks" / "bench_tall.py"


def _bench() -> dict[str, Any]:
    return runpy.run_path(str(BENCH))


def test_the_layouts_are_valid_and_as_tall_as_named() -> None:
    b = _bench()
    for name, make in b["LAYOUTS"].items():
        g = parse_geometry(make())  # raises GeometryError when a rule is broken
        snap = g.regions[0]
        assert g.name == name
        assert snap.rows == int(name.split("-")[1].split("x")[0])
        if "x" in name:
            assert snap.row_bytes == int(name.split("x")[1])


def test_the_phases_plan_the_layout(tmp_path: Path) -> None:
    b = _bench()
    got = b["phases"](b["LAYOUTS"]["small-131072x16"]())
    assert set(got) >= {"conflict sets", "plan_packed", "combinatorial bound",
                        "handle bounds", "report", "total", "allocations", "bound"}
    assert got["bound"] <= got["allocations"]
    assert b["main"](["--write", str(tmp_path), "--only", "small-131072x128"]) == 0
    assert (tmp_path / "small-131072x128.json").is_file()
