"""Bad input found by a throw-away fuzzer (2026-12-03), on the CLI and the library:
each is refused with an error of kvgrant's tree (exit 2 on the command line, an
ArgumentError from the library) that names the argument, its value and the rule,
before any work starts -- never a Python AttributeError or TypeError from deep
inside, and never a long TLC run that ends in "timeout" (exit 1)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from kvgrant.cli import main
from kvgrant.conformance import check_trace, load_trace, mutants, replay
from kvgrant.conformance import tlc
from kvgrant.conformance.tlc import run_tlc
from kvgrant.commands.verify import verify_specs
from kvgrant.errors import ArgumentError, ContractError, KVGrantError
from kvgrant.layout import (check_contract, conflict_sets, declared_conflict_sets,
                            load_geometry, require_contract)
from kvgrant.layout.geometry import on_ranks
from kvgrant.layout.plan import Allocation
from kvgrant.layout.rules import naive_plan
from kvgrant.runtime import fit_pages, open_trace

ROOT = Path(__file__).resolve().parents[1]
SMALL = ROOT / "examples" / "small.json"


@pytest.fixture(scope="module")
def small() -> Any:
    return load_geometry(SMALL)


# --- kvgrant verify --workers ----------------------------------------------------------

@pytest.mark.parametrize("value", ["1000000000", "1025", "1,000,000,000"])
def test_verify_refuses_more_workers_than_tlc_can_start(value: str, capsys,
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    """Was: accepted; TLC then spent the whole --timeout starting threads and the run
    ended in "timeout: TLC did not finish", exit 1 (60.5 s with --timeout 60, where
    --workers 1 checks MCKVLifecycle.cfg in 6 s)."""
    import kvgrant.commands.verify as verify

    def no_tlc(*args: Any, **kwargs: Any) -> Any:
        raise AssertionError("the refused command started TLC")

    monkeypatch.setattr(verify, "verify_specs", no_tlc)
    with pytest.raises(SystemExit) as ex:
        main(["verify", "--json", f"--workers={value}"])
    assert ex.value.code == 2
    captured = capsys.readouterr()
    assert "--workers" in captured.err and f"at most {tlc.MAX_WORKERS:,}" in captured.err
    assert "TLC starts one thread per worker" in captured.err
    doc = json.loads(captured.out)
    assert doc["ok"] is False and doc["exit_status"] == 2 and doc["kind"] == "ArgumentError"


def test_verify_still_takes_the_largest_worker_count() -> None:
    from kvgrant.cli import build_parser

    most = tlc.MAX_WORKERS
    assert build_parser().parse_args(["verify", f"--workers={most}"]).workers == most
    assert 1 <= build_parser().parse_args(["verify"]).workers <= most


@pytest.mark.parametrize("workers", [10**9, 0, -1, True, 2.0, "4", None])
def test_the_library_refuses_a_bad_worker_count_before_tlc(workers: Any, tmp_path: Path) -> None:
    """verify_specs and run_tlc check ``workers`` first (was: an empty folder said "no
    configs" and a missing spec "does not exist", and a huge count reached TLC)."""
    with pytest.raises(ArgumentError) as info:
        verify_specs(tmp_path, workers=workers)
    assert info.value.argument == "workers" and "1..1,024" in str(info.value)
    with pytest.raises(ArgumentError) as info:
        run_tlc(tmp_path / "missing.tla", workers=workers)
    assert info.value.argument == "workers" and repr(workers) in str(info.value)


def test_verify_names_a_spec_folder_that_exists_but_is_no_folder(capsys) -> None:
    """Was: "spec folder '/dev/null' does not exist" (it does: a character device)."""
    assert main(["verify", "/dev/null"]) == 2
    err = capsys.readouterr().err
    assert "'/dev/null' is not a folder" in err and "does not exist" not in err


# --- layout functions given something that is not a Geometry -----------------------

@pytest.mark.parametrize("call", [
    lambda: on_ranks("examples/small.json", 2),
    lambda: on_ranks(None, 2),
    lambda: declared_conflict_sets("examples/small.json"),
    lambda: conflict_sets({"name": "small"}, []),
], ids=["on_ranks-str", "on_ranks-None", "declared_conflict_sets", "conflict_sets"])
def test_layout_functions_refuse_a_non_geometry(call: Any) -> None:
    """Was: AttributeError ('str' object has no attribute 'model_dump' /
    '_declared_ranges' / 'region_by_name')."""
    with pytest.raises(ArgumentError) as info:
        call()
    assert info.value.argument == "g" and "must be a Geometry" in str(info.value)


@pytest.mark.parametrize("item, field", [
    ("kv0", "plane"), (None, "plane"), ({"plane": "kv0"}, "plane"),
    (("kv0", 0, 2097152), "plane"),
])
def test_check_contract_reports_an_item_that_is_no_allocation(small: Any, item: Any,
                                                              field: str) -> None:
    """check_contract "never raises on a malformed plan"; an item of a bare allocation
    list without an Allocation's fields raised AttributeError."""
    allocs = [*naive_plan(small).allocations, item]
    found = check_contract(small, allocs)
    assert found, "a plan with a foreign item must break the contract"
    bad = [v for v in found if v.detail.get("alloc") == len(allocs) - 1]
    assert bad and f"is not an Allocation (it has no {field})" in bad[0].message
    assert bad[0].detail["field"] == field
    with pytest.raises(ContractError):
        require_contract(small, allocs)


@pytest.mark.parametrize("alloc", [
    Allocation(["kv0"], 0, 2097152),  # type: ignore[arg-type]
    Allocation("kv0", 0, 2097152, {"r": 1}, 0),  # type: ignore[arg-type]
])
def test_check_contract_reports_an_unhashable_plane_or_region_name(small: Any,
                                                                   alloc: Allocation) -> None:
    """Was: TypeError: unhashable type (the name was looked up in a dict)."""
    found = check_contract(small, [alloc])
    assert any("is not a plane of the geometry" in v.message
               or "is not a region of the geometry" in v.message for v in found)


# --- fit_pages ------------------------------------------------------------------------

@pytest.mark.parametrize("g, free, argument, needle", [
    (None, {0: 1 << 40}, "g", "must be a Geometry"),
    ("G", [1 << 40], "free", "must be a mapping of CUDA ordinal to free bytes"),
    ("G", {0: "1T"}, "free[0]", "must be a byte count"),
    ("G", {0: True}, "free[0]", "must be a byte count"),
    ("G", {0: -1}, "free[0]", "must be a byte count"),
    ("G", {"0": 1 << 40}, "free", "keys must be CUDA ordinals"),
])
def test_fit_pages_refuses_bad_arguments(small: Any, g: Any, free: Any, argument: str,
                                         needle: str) -> None:
    """Was: AttributeError ('list' object has no attribute 'items', 'NoneType' ...
    'pages') or TypeError (str - int) in MemoryLimit.budget."""
    with pytest.raises(ArgumentError) as info:
        fit_pages(small if g == "G" else g, free)
    assert info.value.argument == argument and needle in str(info.value)


def test_fit_pages_still_fits(small: Any) -> None:
    assert fit_pages(small, {0: 1 << 40, 1: 1 << 40}).pages == small.pages


# --- conformance entry points -----------------------------------------------------------

@pytest.fixture(scope="module")
def trace_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("trace") / "t.ndjson"
    assert main(["alloc", str(SMALL), "--backend", "sim", "--trace", str(path)]) == 0
    return path


@pytest.mark.parametrize("function", [replay, mutants], ids=["replay", "mutants"])
@pytest.mark.parametrize("value", ["t.ndjson", None, b"{}", []])
def test_replay_and_mutants_refuse_a_non_trace(function: Any, value: Any) -> None:
    """Was: AttributeError: 'str' object has no attribute 'header'."""
    with pytest.raises(ArgumentError) as info:
        function(value)
    assert info.value.argument == "trace" and "must be a Trace" in str(info.value)
    assert function.__name__ in str(info.value)


def test_replay_still_takes_a_trace(trace_file: Path) -> None:
    assert replay(load_trace(trace_file)).accepted


@pytest.mark.parametrize("engine", ["TLC", "", None, ["python"]])
def test_check_trace_refuses_an_unknown_engine_with_an_argument_error(trace_file: Path,
                                                                      engine: Any) -> None:
    """Was: a bare ValueError, outside kvgrant's error tree (``except KVGrantError``
    missed it); an ArgumentError is still a ValueError."""
    with pytest.raises(ArgumentError) as info:
        check_trace(str(trace_file), engine=engine)
    assert isinstance(info.value, ValueError) and isinstance(info.value, KVGrantError)
    assert info.value.argument == "engine" and "'python', 'tlc' or 'both'" in str(info.value)


def test_open_trace_refuses_a_path_with_a_nul_byte(tmp_path: Path) -> None:
    """Was: ValueError: embedded null byte (allocate(trace=...) refused it already)."""
    with pytest.raises(ArgumentError) as info:
        open_trace(str(tmp_path / "a\0b.ndjson"))
    assert info.value.argument == "trace" and "NUL" in str(info.value)
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("lb", [None, 3, {"total": 3}])
def test_handle_lower_bound_names_a_missing_lower_bound(lb: Any) -> None:
    from kvgrant.layout.bound import handle_lower_bound

    with pytest.raises(ArgumentError, match=r"handle_lower_bound: lb = .*LowerBound"):
        handle_lower_bound(load_geometry(SMALL), lb)


@pytest.mark.parametrize("target", ["README.md", "no-such-folder"])
def test_verify_names_kvgrant_specs_when_the_folder_came_from_it(
        capsys, monkeypatch, target: str) -> None:
    """A bad KVGRANT_SPECS is named as KVGRANT_SPECS (was: "SPECDIR = ...", an argument
    the user never gave); a bad argument is still SPECDIR, whatever the environment."""
    monkeypatch.setenv("KVGRANT_SPECS", target)
    assert main(["verify"]) == 2
    err = capsys.readouterr().err
    assert f"KVGRANT_SPECS = {target!r}" in err and "SPECDIR" not in err
    assert main(["verify", target]) == 2
    err = capsys.readouterr().err
    assert f"SPECDIR = {target!r}" in err and "KVGRANT_SPECS" not in err
