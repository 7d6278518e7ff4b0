"""The start-up benchmark runs end to end on the sim backend and reports tracing's cost
from back-to-back pairs (figures are for the GPU host; here only their shape)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def bench(load_benchmark) -> dict:
    return load_benchmark("bench_startup.py")


def test_pairs_and_plans_are_reported(bench: dict, tmp_path: Path, capsys) -> None:
    out = tmp_path / "b.json"
    rc = bench["main"]([str(ROOT / "examples" / "small.json"), "--backend", "sim",
                        "--trace-pairs", "3", "--json-out", str(out)])
    assert rc == 0
    text = capsys.readouterr().out
    assert "3 pairs back to back" in text and "95% CI" in text
    data = json.loads(out.read_text())
    assert [r["plan"] for r in data["rows"]] == ["naive", "reference", "packed", "floor",
                                                  "packed"]
    assert data["rows"][-1]["traced"] and not data["rows"][2]["traced"]
    cost = data["meta"]["trace_cost"]
    assert cost["pairs"] == len(data["meta"]["trace_pairs"]) == 3
    lo, hi = cost["relative_ci95"]
    assert lo <= cost["relative_mean"] <= hi
    # every start-up event of a traced run was counted: one per driver call, one
    # RankReady per rank, and Publish
    traced = data["rows"][-1]
    assert cost["events"] == traced["driver_calls"] + traced["ranks"] + 1


def test_trace_cost_is_the_mean_of_paired_differences(bench: dict) -> None:
    def run(s: float, d: float, events: int = 0) -> dict:
        return {"startup_s": s, "startup_driver_s": d, "startup_events": events}

    pairs = [(run(1.0, 0.9), run(1.1, 0.95, 1000)), (run(2.0, 1.9), run(2.0, 1.85, 1000))]
    cost = bench["trace_cost"](pairs)
    assert cost["relative_mean"] == pytest.approx((0.1 + 0.0) / 2)
    # own time: +0.05 s and +0.05 s over a median untraced start-up of 1.5 s
    assert cost["own_share_mean"] == pytest.approx(0.05 / 1.5)
    assert cost["own_us_per_event"] == pytest.approx(50.0)
    assert cost["driver_share_mean"] == pytest.approx((0.05 - 0.05) / 2 / 1.5)


def test_time_limit_stops_the_pairs_and_reports_those_done(bench: dict, tmp_path: Path,
                                                           capsys) -> None:
    out = tmp_path / "b.json"
    rc = bench["main"]([str(ROOT / "examples" / "small.json"), "--backend", "sim",
                        "--plans", "packed", "--trace-pairs", "500", "--time-limit", "0",
                        "--trace-chunk", "2", "--json-out", str(out)])
    assert rc == 0
    captured = capsys.readouterr()
    assert "stopped after 1 of 500 pairs: --time-limit" in captured.out
    meta = json.loads(out.read_text())["meta"]
    assert meta["trace_cost"]["pairs"] == len(meta["trace_pairs"]) == 1
    assert meta["trace_chunk"] == 2


def test_progress_lines_go_to_stderr_every_20_pairs(bench: dict, capsys) -> None:
    rc = bench["main"]([str(ROOT / "examples" / "small.json"), "--backend", "sim",
                        "--plans", "packed", "--trace-pairs", "40"])
    assert rc == 0
    err = capsys.readouterr().err
    assert [line.split(":")[0].strip() for line in err.splitlines()] == ["pairs 20/40",
                                                                         "pairs 40/40"]


def test_a_bad_trace_chunk_is_refused_before_any_run(bench: dict, capsys) -> None:
    with pytest.raises(SystemExit) as exc:
        bench["main"]([str(ROOT / "examples" / "small.json"), "--backend", "sim",
                       "--trace-chunk", "0"])
    assert exc.value.code == 2
    assert "--trace-chunk = 0: must be at least 1" in capsys.readouterr().err


def test_pool_reports_one_figure_over_the_pairs_of_several_files(bench: dict, tmp_path: Path,
                                                                  capsys) -> None:
    def saved(name: str, pairs: list) -> str:
        path = tmp_path / name
        path.write_text(json.dumps({"meta": {
            "trace_cost": {"events": 1000},
            "trace_pairs": [{"untraced": list(u), "traced": list(t)} for u, t in pairs]}}))
        return str(path)

    a = saved("a.json", [((1.0, 0.9), (1.1, 0.95))])
    b = saved("b.json", [((2.0, 1.9), (2.0, 1.85))])
    assert bench["main"](["--pool", a, b]) == 0
    out = capsys.readouterr().out
    # the same figure trace_cost gives for both pairs together
    assert "2 pairs back to back" in out
    assert "start-up: mean +5.00%" in out
    assert "+3.33% of start-up" in out and "50.00 us per event" in out


def test_pool_refuses_files_without_pairs(bench: dict, tmp_path: Path, capsys) -> None:
    empty = tmp_path / "e.json"
    empty.write_text(json.dumps({"meta": {"trace_cost": None, "trace_pairs": []}}))
    with pytest.raises(SystemExit) as exc:
        bench["main"](["--pool", str(empty)])
    assert exc.value.code == 2
    assert "hold no trace pairs" in capsys.readouterr().err
