"""Regression tests of the bad-input sweep after issue #16: plan files (``kvgrant alloc
--plan FILE``), the host ledger and the sim pool given odd paths or contents, and the
layout functions given something that is not a geometry. Each runs the CLI in-process
under a memory cap and a hang limit (``_fuzz_support``), so an unbounded read or a
hang fails here instead of taking the machine down."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from _fuzz_support import SMALL, assert_clean, run_cli

SIM = ["--backend", "sim"]


@pytest.fixture(scope="module")
def plan_doc(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """The plan document ``kvgrant plan --json`` writes for examples/small.json."""
    res = run_cli(["plan", str(SMALL), "--json", "--no-bound"])
    assert res.rc == 0, res.err
    return json.loads(res.out)["packed_plan"]


def _alloc_with_plan(tmp_path: Path, data: str | bytes) -> Any:
    path = tmp_path / "plan.json"
    if isinstance(data, bytes):
        path.write_bytes(data)
    else:
        path.write_text(data)
    argv = ["alloc", str(SMALL), *SIM, "--plan", str(path)]
    res = run_cli(argv)
    assert_clean(res, invalid=True, argv=argv)
    return res


# ------------------------------------------------------------------ plan files

def test_a_deeply_nested_plan_file_is_an_error_not_a_traceback(tmp_path: Path) -> None:
    # was: RecursionError from json.loads, a traceback
    res = _alloc_with_plan(tmp_path, "[" * 100_000 + "]" * 100_000)
    assert "nested too deeply" in res.err, res.err


def test_a_plan_path_with_a_nul_byte_is_an_error_not_a_traceback() -> None:
    argv = ["alloc", str(SMALL), *SIM, "--plan", "x\x00y"]
    res = run_cli(argv)
    assert_clean(res, invalid=True, argv=argv)
    assert "a path cannot hold a NUL byte" in res.err, res.err   # argparse refuses it


def test_an_endless_plan_file_is_refused_by_size() -> None:
    # was: read_text() of /dev/zero read without bound (killed by the memory cap)
    argv = ["alloc", str(SMALL), *SIM, "--plan", "/dev/zero"]
    res = run_cli(argv)
    assert_clean(res, invalid=True, argv=argv)
    assert "larger than" in res.err, res.err


def test_a_plan_with_more_allocations_than_granules_is_refused_up_front(
        tmp_path: Path, plan_doc: dict[str, Any]) -> None:
    # was: 1.4 million allocations ran the contract check for minutes (a hang)
    doc = dict(plan_doc, allocations=plan_doc["allocations"] * 20_000)
    res = _alloc_with_plan(tmp_path, json.dumps(doc))
    assert "allocations" in res.err and "at most 23" in res.err, res.err


@pytest.mark.parametrize("label", ["\x1b[31mred\u202e", "x" * 100, 5, None, "fastest"])
def test_a_plan_label_that_is_not_a_plan_name_is_refused(
        tmp_path: Path, plan_doc: dict[str, Any], label: Any) -> None:
    # was: printed as it is ("small (\x1b[31m... plan)") and written into the trace
    # header, whose `kvgrant conform --geometry` then failed on the unknown label
    res = _alloc_with_plan(tmp_path, json.dumps(dict(plan_doc, label=label)))
    assert "label" in res.err and "naive, reference, packed" in res.err, res.err
    assert "\x1b" not in res.err and "\u202e" not in res.err


@pytest.mark.parametrize("version", [True, 1.0])
def test_a_plan_version_that_only_compares_equal_to_1_is_refused(
        tmp_path: Path, plan_doc: dict[str, Any], version: Any) -> None:
    # was: accepted (True == 1 == 1.0 in Python)
    res = _alloc_with_plan(tmp_path, json.dumps(dict(plan_doc, version=version)))
    assert "version" in res.err and "must be 1" in res.err, res.err


def test_a_plan_label_from_the_file_is_kept(tmp_path: Path,
                                            plan_doc: dict[str, Any]) -> None:
    """The check does not refuse the labels kvgrant writes."""
    path = tmp_path / "plan.json"
    path.write_text(json.dumps(dict(plan_doc, label="packed")))
    res = run_cli(["alloc", str(SMALL), *SIM, "--plan", str(path), "--json"])
    assert res.rc == 0, res.err
    assert json.loads(res.out)["plan"] == "packed"


# ------------------------------------------------------- host ledger and sim pool

@pytest.mark.parametrize("command", [["budget"], ["budget", "--json"],
                                     ["alloc", str(SMALL), *SIM]])
def test_a_deeply_nested_ledger_is_an_unreadable_ledger(tmp_path: Path,
                                                        command: list[str]) -> None:
    # was: RecursionError from json.loads, a traceback
    ledger = tmp_path / "ledger.json"
    ledger.write_text("[" * 100_000 + "]" * 100_000)
    argv = [*command, "--ledger", str(ledger)]
    res = run_cli(argv)
    assert_clean(res, invalid=True, argv=argv)
    assert "not a kvgrant ledger" in res.err and "nested too deeply" in res.err, res.err


@pytest.mark.parametrize("command", [["budget"], ["alloc", str(SMALL), *SIM]])
def test_an_endless_ledger_is_refused_as_not_a_regular_file(command: list[str]) -> None:
    # was: /dev/zero read without bound (killed by the memory cap, or by the OS), then
    # refused by size with advice to --repair it
    argv = [*command, "--ledger", "/dev/zero"]
    res = run_cli(argv)
    assert_clean(res, invalid=True, argv=argv)
    assert "is not a regular file (a character device)" in res.err, res.err
    assert "--repair cannot make it one" in res.err, res.err


def test_repair_keeps_a_deeply_nested_ledger_aside(tmp_path: Path) -> None:
    ledger = tmp_path / "ledger.json"
    bad = "[" * 100_000 + "]" * 100_000
    ledger.write_text(bad)
    res = run_cli(["budget", "--repair", "--ledger", str(ledger)])
    assert res.rc == 0, res.err
    kept = [p for p in tmp_path.iterdir() if p.name.startswith("ledger.json.bad-")]
    assert len(kept) == 1 and kept[0].read_text() == bad
    assert run_cli(["budget", "--ledger", str(ledger)]).rc == 0


def test_a_sim_pool_in_a_missing_folder_is_an_error_not_a_traceback(tmp_path: Path) -> None:
    # was: FileNotFoundError from tempfile.mkstemp, a traceback
    pool = tmp_path / "no" / "such" / "pool"
    argv = ["alloc", str(SMALL), *SIM, "--sim-pool", str(pool)]
    res = run_cli(argv)
    assert_clean(res, invalid=True, argv=argv)
    assert f"--sim-pool = '{pool}': its folder '{pool.parent}' does not exist" in res.err, \
        res.err
    assert not pool.parent.exists()


# ------------------------------------------------- layout functions, wrong types

def _layout_calls() -> list[tuple[str, Any]]:
    from kvgrant.layout.bound import allocation_lower_bound
    from kvgrant.layout.contract import check_contract
    from kvgrant.layout.geometry import load_geometry
    from kvgrant.layout.plans import make_plan, naive_plan, packed_plan, reference_plan
    from kvgrant.layout.preflight import check_handle_budget, handle_demand

    g = load_geometry(SMALL)
    plan = naive_plan(g)
    calls: list[tuple[str, Any]] = []
    for bad in (None, str(SMALL), 5, {}):
        calls += [("g", lambda b=bad: naive_plan(b)), ("g", lambda b=bad: reference_plan(b)),
                  ("g", lambda b=bad: packed_plan(b)),
                  ("g", lambda b=bad: make_plan(b, "packed")),
                  ("g", lambda b=bad: allocation_lower_bound(b)),
                  ("g", lambda b=bad: check_contract(b, plan)),
                  ("g", lambda b=bad: handle_demand(b, plan))]
    calls += [("plan", lambda: check_contract(g, None)),
              ("plan", lambda: handle_demand(g, None)),
              ("plan", lambda: handle_demand(g, [1, 2])),
              ("budget", lambda: check_handle_budget(g, plan, budget="5")),
              ("reserve", lambda: check_handle_budget(g, plan, reserve=-1))]
    return calls


@pytest.mark.parametrize("index", range(len(_layout_calls())))
def test_layout_functions_name_an_argument_that_is_not_a_geometry_or_plan(index: int) -> None:
    # was: AttributeError ('str' object has no attribute 'model_dump'), TypeError, or a
    # bare ValueError from check_handle_budget
    from kvgrant.errors import ArgumentError

    argument, call = _layout_calls()[index]
    with pytest.raises(ArgumentError) as info:
        call()
    assert info.value.argument == argument
    assert f"{argument} = " in str(info.value) and "must be" in str(info.value)


# ------------------------------------------------ kvgrant alloc --procs options

@pytest.mark.parametrize("argv, message", [
    # was: the fault went to no process; the group published and exit 0
    (["--procs", "3", "--fail-at", "1", "--fail-rank", "3"],
     "--fail-rank = 3: must be a rank of the group, 0..2"),
    # was: read by int(): a negative rank (no process) and non-ASCII digits accepted
    (["--procs", "3", "--fail-at", "1", "--fail-rank=-1"], "argument --fail-rank"),
    (["--procs", "3", "--fail-at", "1", "--fail-rank", "\u0661"], "argument --fail-rank"),
    # was: silently ignored without --procs
    (["--fail-at", "1", "--fail-rank", "1"], "--fail-rank = 1: only with --procs"),
])
def test_bad_fail_rank_is_refused_before_any_process_starts(argv: list[str],
                                                            message: str) -> None:
    full = ["alloc", str(SMALL), *SIM, *argv]
    res = run_cli(full)
    assert_clean(res, invalid=True, argv=full)
    assert res.rc == 2 and message in res.err, res.err


def test_procs_trace_onto_an_existing_file_names_the_option(tmp_path: Path) -> None:
    # was: "rank 0: [Errno 17] File exists: '...'" from each worker's mkdir
    existing = tmp_path / "not-a-folder"
    existing.write_text("keep me")
    argv = ["alloc", str(SMALL), *SIM, "--procs", "3", "--trace", str(existing)]
    res = run_cli(argv)
    assert_clean(res, invalid=True, argv=argv)
    assert res.rc == 2 and "--trace = " in res.err and "names a folder" in res.err, res.err
    assert existing.read_text() == "keep me"


def test_procs_trace_env_onto_an_existing_file_is_refused(tmp_path: Path,
                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    # was: exit 0, every worker took KVGRANT_TRACE as its own trace file, so the file was
    # overwritten and held rank 0's trace alone (review 2026-12-07)
    existing = tmp_path / "v.json"
    existing.write_text("keep me")
    monkeypatch.setenv("KVGRANT_TRACE", str(existing))
    argv = ["alloc", str(SMALL), *SIM, "--procs", "3"]
    res = run_cli(argv)
    assert_clean(res, invalid=True, argv=argv)
    assert res.rc == 2 and "KVGRANT_TRACE = " in res.err and "names a folder" in res.err, \
        res.err
    assert existing.read_text() == "keep me"


def test_procs_trace_env_names_the_folder_of_every_rank_trace(tmp_path: Path) -> None:
    # KVGRANT_TRACE with --procs is what --trace is there: a folder, one trace per rank,
    # which kvgrant conform reads as one group
    import os

    from _fuzz_support import run_cli_process

    folder = tmp_path / "traces"
    env = {**os.environ, "KVGRANT_TRACE": str(folder)}
    res = run_cli_process(["alloc", str(SMALL), *SIM, "--procs", "3", "--json"],
                          memory=-1, seconds=180, env=env)
    assert res.rc == 0, res.err
    assert sorted(p.name for p in folder.iterdir()) == [f"rank{r}.ndjson" for r in range(3)]
    checked = run_cli(["conform", str(folder), "--engine", "python"])
    assert checked.rc == 0, checked.out + checked.err


def test_procs_reads_a_plan_file_once_for_every_worker(tmp_path: Path,
                                                       plan_doc: dict[str, Any]) -> None:
    # was: every worker refused the path as "unknown plan label" (the help says FILE)
    from _fuzz_support import run_cli_process

    path = tmp_path / "plan.json"
    path.write_text(json.dumps(plan_doc))
    res = run_cli_process(["alloc", str(SMALL), *SIM, "--procs", "3", "--plan", str(path),
                           "--json"], memory=-1, seconds=180)
    assert res.rc == 0, res.err
    out = json.loads(res.out)
    assert out["ok"] and [r["plan"] for r in out["ranks"]] == ["packed"] * 3


def test_procs_fail_at_past_the_last_call_is_refused_before_any_process_starts() -> None:
    # was: exit 0 with every rank published, as if the fault had been watched; then
    # exit 1 after the run ("the fault never fired"); now refused up front, as without
    # --procs, naming the largest K of rank 0's process (tests/test_cli_review_fixes3.py)
    from _fuzz_support import run_cli_process

    res = run_cli_process(["alloc", str(SMALL), *SIM, "--procs", "3", "--fail-at", "100000",
                           "--json"], memory=-1, seconds=180)
    assert_clean(res, invalid=True)
    assert res.rc == 2 and "--fail-at = 100000: must be at most " in res.err, res.err
    assert "never fired" not in res.err, res.err
    out = json.loads(res.out)
    assert out["ok"] is False and out["argument"] == "fail-at" and out["value"] == 100000


# --------------------------------------------------- a driver call of release fails

def test_a_failed_release_names_call_rank_device_range_result_and_what_is_left() -> None:
    import re

    probe = run_cli(["alloc", str(SMALL), *SIM, "--fail-at", "1000000"])
    assert probe.rc == 2, probe.err
    calls = int(re.search(r"must be at most (\d+)", probe.err).group(1))  # type: ignore[union-attr]
    # the last call of the shutdown frees a rank's VA reservation
    for json_out in (False, True):
        argv = ["alloc", str(SMALL), *SIM, "--fail-at", str(calls)] + (
            ["--json"] if json_out else [])
        res = run_cli(argv)
        assert_clean(res, invalid=True, argv=argv)
        # was: "kvgrant alloc: error: CUDA_ERROR_OUT_OF_MEMORY: injected fault: ..." with no
        # rank and no word of the reservation left behind (and no JSON with --json)
        assert res.rc == 1
        assert "release failed: 1 undo step(s) failed" in res.err, res.err
        assert re.search(r"cuMemAddressFree failed with CUDA_ERROR_OUT_OF_MEMORY on rank "
                         r"(\d) \(device \1, va 0x[0-9a-f]+\+0x[0-9a-f]+\)", res.err), res.err
        assert "left live after release: reserved_bytes=" in res.err, res.err
        if json_out:
            out = json.loads(res.out)
            assert out["ok"] is False and out["live_after_release"]["reservations"] == 1


def test_a_failed_release_of_a_handle_names_the_plane_bytes_it_backed() -> None:
    # a handle has no VA: the message named call, device and CUresult but no byte range,
    # and the JSON had no rank (review 2026-12-07)
    import re

    probe = run_cli(["alloc", str(SMALL), *SIM, "--fail-at", "1000000"])
    calls = int(re.search(r"must be at most (\d+)", probe.err).group(1))  # type: ignore[union-attr]
    for k in range(calls, 0, -1):  # the release's last cuMemRelease
        res = run_cli(["alloc", str(SMALL), *SIM, "--fail-at", str(k), "--json"])
        if "cuMemRelease failed" in res.err:
            break
    assert_clean(res, invalid=True)
    said = re.search(r"cuMemRelease failed with CUDA_ERROR_OUT_OF_MEMORY on rank (\d) "
                     r"\(device \1, (plane '[^']+' bytes \[0x[0-9a-f]+, 0x[0-9a-f]+\))\)",
                     res.err)
    assert said, res.err
    out = json.loads(res.out)
    assert (out["call"], out["rank"], out["device"], out["target"]) == (
        "cuMemRelease", int(said.group(1)), int(said.group(1)), said.group(2))
    assert out["live_after_release"]["handles"] == 1


def test_a_failed_release_in_a_procs_run_names_the_call_and_the_bytes() -> None:
    # was: "rank 0: CUDA_ERROR_OUT_OF_MEMORY: injected fault ..." (no call, no bytes, no
    # word of what was left)
    import re

    probe = run_cli(["alloc", str(SMALL), *SIM, "--procs", "3", "--fail-at", "1000000"])
    before, during = map(int, re.search(r"(\d+) before the start-up, (\d+) in it",
                                        probe.err).groups())  # type: ignore[union-attr]
    from _fuzz_support import run_cli_process

    res = run_cli_process(["alloc", str(SMALL), *SIM, "--procs", "3", "--fail-at",
                           str(before + during + 1), "--json"], memory=-1, seconds=180)
    assert res.rc == 1, res.err
    assert re.search(r"rank 0: release failed: \d+ undo step\(s\) failed, the others ran: "
                     r"cuMem\w+ failed with CUDA_ERROR_OUT_OF_MEMORY on rank 0 \(device \d, "
                     r"va 0x[0-9a-f]+\+0x[0-9a-f]+, (imported from rank \d+, )?"
                     r"(plane|region) '[^']+' bytes \[", res.err), res.err
    assert "left live after release: " in res.err, res.err
    rank0 = json.loads(res.out)["ranks"][0]
    assert rank0["ok"] is False and rank0["live_after_release"]["reservations"] == 1


# ------------------------------------------------------ one very large import group

def test_plan_of_one_import_group_of_16384_ranks_is_bounded_in_time_and_memory(
        tmp_path: Path) -> None:
    # was: a tuple of the whole group per member (16,384^2 ints) and per-rank tuples
    # rebuilt by the pre-flight and the bounds: 61 s at 4,096 ranks, and at 65,536 ranks
    # the kernel killed it at 24 GB -- from a 400 KB geometry file
    doc = json.loads(SMALL.read_text())
    n = 16_384
    doc["topology"] = {"ranks": n, "import_groups": [list(range(n))]}
    path = tmp_path / "g.json"
    path.write_text(json.dumps(doc))
    res = run_cli(["plan", str(path), "--json"], memory=1 << 30, seconds=60)
    assert res.rc == 0, res.err[-2000:]
    small = json.loads(run_cli(["plan", str(SMALL), "--json", "--no-bound"]).out)
    alone = small["plans"]["packed"]["per_rank"][2]      # rank 2 imports nothing: 1 device
    paired = small["plans"]["packed"]["per_rank"][0]     # rank 0's group has 2 ranks
    wide = paired["handles"] - alone["handles"]          # mappings granted to the group
    owner_only = alone["handles"] - wide                 # aliases of `access: owner` rows
    rep = json.loads(res.out)
    assert rep["plans"]["packed"]["preflight"]["importers"]["demand"] == \
        n * (wide * n + owner_only)


def test_granted_count_is_the_number_of_granted_devices() -> None:
    from kvgrant.layout.geometry import load_geometry, parse_geometry

    doc = json.loads(SMALL.read_text())
    doc["topology"] = {"ranks": 6, "import_groups": [[0, 1], [3, 5, 4]],
                       "declared_readers": {"0": [1, 2, 3], "1": [0, 1], "4": [3, 5]}}
    examples = sorted(SMALL.parent.glob("*.json"))
    for g in [parse_geometry(doc), *(load_geometry(p) for p in examples)]:
        for r in range(g.topology.ranks):
            for region in [None, *(x.name for x in g.regions)]:
                for declared in (False, True):
                    assert g.granted_count(r, region, declared=declared) == \
                        len(g.granted_devices(r, region, declared=declared)), (g.name, r)


def test_the_text_report_checks_each_plans_contract_once(monkeypatch: Any) -> None:
    # was: twice (build_report and format_report each computed every plan's figures);
    # the check is linear in the region rows, so a region of 1,048,576 rows spent 150 s
    # of its 266 s `kvgrant plan` in the report
    from kvgrant.layout import report
    from kvgrant.layout.geometry import load_geometry
    from kvgrant.layout.plans import naive_plan, reference_plan

    g = load_geometry(SMALL)
    plans = [naive_plan(g), reference_plan(g)]
    checked: list[str] = []
    real = report.check_contract

    def counting(geometry: Any, plan: Any) -> Any:
        checked.append(plan.label)
        return real(geometry, plan)

    monkeypatch.setattr(report, "check_contract", counting)
    text = report.format_report(g, plans, 523_880)
    assert "layout contract, naive plan: kept" in text
    assert sorted(checked) == ["naive", "reference"]
