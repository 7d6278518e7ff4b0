"""``plan_packed(time_limit=...)`` and ``kvgrant plan --time-limit``: the best plan
found in a wall-clock budget, with its gap, for a plan file every rank then reads.

Why: without a limit a solve that runs past the safety net fails (a plan must not
depend on the host's speed when ranks plan for themselves), and the remedy the error
names is planning once into a file; that only works if planning into a file can stop
in time. The limits used here are 1 ms on solves that take about a second, and a
deadline already passed: what is asserted is what any stop must keep (the contract,
the reference rule as a ceiling, a bound below the plan), not how long anything took.
"""

from __future__ import annotations

import json
import math
import time
from pathlib import Path
from typing import Any

import pytest
from layout_builders import gen_layout

from kvgrant.cli import main as cli_main
from kvgrant.errors import ArgumentError, PlanError
from kvgrant.layout import exact
from kvgrant.layout.contract import check_contract
from kvgrant.layout.geometry import load_geometry, parse_geometry
from kvgrant.layout.packer import pack
from kvgrant.layout.planner import MAX_TIME_LIMIT, plan_packed
from kvgrant.layout.rules import reference_plan
from kvgrant.layout.windows import solve_windows

ROOT = Path(__file__).resolve().parents[2]
DCP8 = ROOT / "examples" / "published-dcp8.json"


@pytest.mark.parametrize("bad", [0, -1, 0.0, math.nan, math.inf, True, "5", [1],
                                 MAX_TIME_LIMIT * 2])
def test_a_bad_time_limit_is_an_argument_error_naming_it(bad: Any) -> None:
    g = load_geometry(DCP8)
    with pytest.raises(ArgumentError) as info:
        plan_packed(g, time_limit=bad)
    assert info.value.argument == "time_limit"
    assert "time_limit = " in str(info.value) and "wall seconds > 0" in str(info.value)


def _check_stopped(g: Any, res: Any) -> None:
    n = len(res.plan.allocations)
    assert check_contract(g, res.plan) == []
    assert n <= len(reference_plan(g).allocations)
    assert 0 <= res.bound <= n


def test_a_solve_stopped_by_the_clock_keeps_its_best_plan_and_says_so() -> None:
    g = parse_geometry(gen_layout().exporter_layout(5))  # about 10 s of solving
    res = plan_packed(g, time_limit=1e-3, node_limit=299)  # (a cache key of its own)
    _check_stopped(g, res)
    assert res.timed_out and not res.optimal
    assert res.verdict().endswith("(time limit reached)")
    assert res.exact is not None and res.exact.model.get("timed_out") == 1
    assert res.to_json()["timed_out"] is True


def test_without_a_time_limit_the_safety_net_fails_and_names_the_remedy(monkeypatch) -> None:
    g = load_geometry(DCP8)
    monkeypatch.setattr(exact, "SAFETY_SECONDS", 1e-3)
    with pytest.raises(PlanError) as info:
        exact.exact_plan(g, start=reference_plan(g))
    text = str(info.value)
    assert "safety net" in text and "--time-limit" in text and "--plan" in text
    # the same solve under a caller's limit returns a plan instead
    res = exact.exact_plan(g, start=reference_plan(g), time_limit=1e-3)
    assert res.model.get("timed_out") == 1
    assert check_contract(g, res.plan) == []


def test_windows_past_their_deadline_give_no_plan() -> None:
    g = load_geometry(DCP8)
    m, lab = exact._build(g, 1.0, {})
    res = solve_windows(m, lab.need, g.granularity, deadline=time.perf_counter() - 1)
    assert res.values is None and "time limit" in res.status
    done = solve_windows(m, lab.need, g.granularity, deadline=None)
    assert done.values is not None


def test_the_packer_past_its_deadline_still_keeps_the_contract() -> None:
    g = load_geometry(DCP8)
    plan = pack(g, deadline=time.perf_counter() - 1)
    assert check_contract(g, plan) == []
    assert len(plan.allocations) <= len(reference_plan(g).allocations)


@pytest.mark.parametrize("bad", ["0", "-2", "nan", "soon", str(int(MAX_TIME_LIMIT) + 1)])
def test_cli_refuses_a_bad_time_limit(bad: str, capsys: Any) -> None:
    with pytest.raises(SystemExit) as info:
        cli_main(["plan", str(DCP8), "--time-limit", bad])
    assert info.value.code == 2
    assert "--time-limit" in capsys.readouterr().err


def test_cli_plan_under_a_time_limit_writes_a_plan_file_alloc_reads(tmp_path: Path,
                                                                     capsys: Any) -> None:
    doc = gen_layout().exporter_layout(5)
    geo = tmp_path / "g.json"
    geo.write_text(json.dumps(doc))
    assert cli_main(["plan", str(geo), "--json", "--no-bound", "--time-limit", "0.001"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["packed_solver"]["timed_out"] is True
    assert out["packed_solver"]["verdict"].endswith("(time limit reached)")
    plan_file = tmp_path / "p.json"
    plan_file.write_text(json.dumps(out))
    from kvgrant.layout.planfile import read_plan_file

    plan = read_plan_file(plan_file, parse_geometry(doc))
    assert check_contract(parse_geometry(doc), plan) == []


def _wait_for(messages: list[str], count: int) -> None:
    """Until ``count`` heartbeat lines arrived (a condition, not a duration: bounded
    only so a broken heartbeat fails instead of hanging)."""
    for _ in range(5000):
        if len(messages) >= count:
            return
        time.sleep(0.001)
    raise AssertionError(f"heartbeat lines: {messages}")


def test_the_heartbeat_says_planning_goes_on_and_how_to_stop_it() -> None:
    from kvgrant.commands.plan import _heartbeat

    without: list[str] = []
    with _heartbeat(without.append, None, every=0.001):
        _wait_for(without, 2)
    assert without[0].startswith("still planning (") and "--time-limit S" in without[0]
    limited: list[str] = []
    with _heartbeat(limited.append, 12.5, every=0.001):
        _wait_for(limited, 1)
    assert "of at most 12.5 s" in limited[0] and "--time-limit" not in limited[0]
    import threading

    assert not [t for t in threading.enumerate() if t.name == "kvgrant-plan-heartbeat"]


@pytest.mark.parametrize("watched", [True, False])
def test_the_heartbeat_runs_only_for_a_terminal(watched: bool, monkeypatch, capsys) -> None:
    import contextlib

    from kvgrant.commands import plan as plan_cmd

    calls: list[Any] = []

    @contextlib.contextmanager
    def fake(progress: Any, limit: Any, every: float = 30.0):
        calls.append(limit)
        yield

    monkeypatch.setattr(plan_cmd, "_heartbeat", fake)
    monkeypatch.setattr(plan_cmd, "_watched", lambda: watched)
    assert cli_main(["plan", str(ROOT / "examples" / "small.json"), "--no-bound",
                     "--time-limit", "30"]) == 0
    assert calls == ([30.0] if watched else [])
