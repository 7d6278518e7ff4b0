"""The odd (fuzz-like) layout family and the benchmark's wall limit for it.

Why: ``tools/gen_layout.py odd`` is where the planner's work caps and fallbacks are
judged (``bench_plan.py --odd N``), so every seed must name one valid geometry, and
on the members small enough for the test suite the packed plan must keep the
contract, stay within the reference rule and never fall below its own bound. Members
are chosen by model size (a count of the geometry), never by how they plan.
"""

from __future__ import annotations

import functools
import multiprocessing
import runpy
import time
from pathlib import Path
from typing import Any

import pytest

from kvgrant.layout.bound import allocation_lower_bound
from kvgrant.layout.contract import check_contract
from kvgrant.layout.geometry import parse_geometry
from kvgrant.layout.granules import eligible_pairs
from kvgrant.layout.planner import plan_packed
from kvgrant.layout.rules import reference_plan

from layout_builders import gen_layout

BENCH = Path(__file__).resolve().parents[2] / "benchmarks" / "bench_plan.py"
SMALL_PAIRS = 600  # (granule, label) pairs: the members cheap enough to plan here


def test_every_seed_names_one_valid_geometry():
    gen = gen_layout()
    for seed in range(150):
        doc = gen.odd_layout(seed)
        assert doc == gen.odd_layout(seed)  # a seed always names the same layout
        g = parse_geometry(doc)  # raises GeometryError on a broken rule
        assert g.name == f"odd-{seed}"


@functools.lru_cache(maxsize=1)
def _small_members(count: int) -> list[Any]:
    gen = gen_layout()
    out = []
    for seed in range(400):
        g = parse_geometry(gen.odd_layout(seed))
        if eligible_pairs(g) <= SMALL_PAIRS:
            out.append(g)
        if len(out) == count:
            break
    return out


@pytest.mark.parametrize("index", range(8))
def test_small_members_plan_within_the_contract_and_their_bounds(index):
    g = _small_members(8)[index]
    ref = reference_plan(g)
    packed = plan_packed(g, node_limit=50, max_checks=20)
    n = len(packed.plan.allocations)
    assert check_contract(g, packed.plan) == []
    assert n <= len(ref.allocations)
    assert packed.bound <= n
    assert allocation_lower_bound(g).total <= n
    if packed.optimal:
        assert packed.bound == n


def _bench() -> dict[str, Any]:
    return runpy.run_path(str(BENCH))


def _never_answers(g: Any, **kwargs: Any) -> dict[str, Any]:
    time.sleep(3600)
    raise AssertionError("unreachable")


def _raises(g: Any, **kwargs: Any) -> dict[str, Any]:
    raise RuntimeError("boom in the solver")


def _with_measure(fake: Any) -> Any:
    limited = _bench()["measure_limited"]
    limited.__globals__["measure"] = fake  # the child runs _measure_into -> measure
    return limited


def test_a_layout_over_the_wall_limit_is_reported_and_its_process_reaped():
    g = parse_geometry(gen_layout().odd_layout(5))
    row = _with_measure(_never_answers)(g, 0.5)
    assert row == {"name": g.name, "chunks": len(g.aliases), "over_s": 0.5}
    assert multiprocessing.active_children() == []


def test_a_failing_layout_is_a_failure_row_not_a_crash():
    bench = _bench()
    g = parse_geometry(gen_layout().odd_layout(5))
    row = _with_measure(_raises)(g, 60)
    assert row["error"] == "RuntimeError: boom in the solver"
    assert bench["_failures"](row) == ["RuntimeError: boom in the solver"]
    assert multiprocessing.active_children() == []
    summary = bench["_summary"]([row, {"name": "y", "chunks": 1, "over_s": 9.0}])
    assert summary == {"layouts": 2, "measured": 0, "over_wall_limit": 1, "errors": 1}
