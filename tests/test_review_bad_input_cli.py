"""Bad input found by a review (2026-12-02), on the CLI and the library: each is
refused as bad input (exit 2, ArgumentError) naming the option, its value and the rule,
before any driver object, and no file the command reads is overwritten."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest

from kvgrant.cli import main
from kvgrant.errors import ArgumentError
from kvgrant.runtime.allocator import allocate
from kvgrant.runtime.sim import SimDriver

ROOT = Path(__file__).resolve().parents[1]
SMALL = ROOT / "examples" / "small.json"


def _geometry(tmp_path: Path) -> Path:
    g = tmp_path / "g.json"
    shutil.copy(SMALL, g)
    return g


@pytest.mark.parametrize("argv", [
    ["conform", ""], ["verify", ""], ["plan", ""], ["budget", "--ledger", ""],
    ["alloc", "G", "--ledger", ""], ["alloc", "G", "--sim-pool", ""],
    ["alloc", "G", "--plan", ""], ["alloc", "G", "--trace", " "],
    ["conform", "T", "--geometry", ""],
])
def test_an_empty_path_is_refused(argv: list[str], tmp_path: Path, capsys) -> None:
    """An empty path became "." (the working folder)."""
    argv = [str(_geometry(tmp_path)) if a in ("G", "T") else a for a in argv]
    with pytest.raises(SystemExit) as ex:
        main(argv)
    assert ex.value.code == 2
    assert "must be a path (not empty)" in capsys.readouterr().err


@pytest.mark.parametrize("option", ["--ledger", "--sim-pool"])
def test_an_output_file_that_is_the_geometry_is_refused(option: str, tmp_path: Path,
                                                         capsys) -> None:
    g = _geometry(tmp_path)
    before = g.read_bytes()
    assert main(["alloc", str(g), "--backend", "sim", option, str(g)]) == 2
    err = capsys.readouterr().err
    assert f"{option} = '{g}': is the geometry file" in err
    assert g.read_bytes() == before


def test_a_trace_over_the_plan_file_is_refused_even_with_force(tmp_path: Path,
                                                                capsys) -> None:
    g = _geometry(tmp_path)
    plan = tmp_path / "plan.json"
    assert main(["plan", str(g), "--json"]) == 0
    plan.write_text(capsys.readouterr().out)
    before = plan.read_bytes()
    rc = main(["alloc", str(g), "--backend", "sim", "--plan", str(plan), "--trace",
               str(plan), "--force"])
    assert rc == 2
    assert "is the plan file" in capsys.readouterr().err
    assert plan.read_bytes() == before


@pytest.mark.parametrize("value, rule", [("1", "not a switch"), (" ", "blank")])
def test_a_sim_pool_variable_that_is_no_path_is_refused(value: str, rule: str,
                                                        tmp_path: Path, monkeypatch,
                                                        capsys) -> None:
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("KVGRANT_SIM_POOL", value)
    assert main(["alloc", str(SMALL), "--backend", "sim", "--ranks", "1"]) == 2
    assert f"KVGRANT_SIM_POOL = {value!r}" in capsys.readouterr().err
    assert os.listdir(tmp_path) == []   # no pool file named "1" or " "
    with pytest.raises(ArgumentError, match=rule):
        SimDriver(devices=1)


def test_a_sim_pool_in_a_missing_folder_is_refused_and_not_made(tmp_path: Path,
                                                                 capsys) -> None:
    pool = tmp_path / "missing" / "pool"
    assert main(["alloc", str(SMALL), "--backend", "sim", "--sim-pool", str(pool)]) == 2
    assert "--sim-pool" in capsys.readouterr().err
    assert not pool.parent.exists()
    with pytest.raises(ArgumentError, match="does not exist"):
        SimDriver(devices=1, host_pool=pool)


@pytest.mark.parametrize("devices", ["2,0", "0,1,2,3"])
def test_procs_needs_one_device_per_rank(devices: str, capsys) -> None:
    """A short list left ranks on their rank numbers (two on one device), a long one was
    cut; both were accepted."""
    rc = main(["alloc", str(SMALL), "--backend", "sim", "--procs", "3", "--devices", devices])
    assert rc == 2
    assert f"--devices = {devices}: with --procs 3, one distinct CUDA ordinal per rank" \
        in capsys.readouterr().err


@pytest.mark.parametrize("argv, flag", [
    (["alloc", str(SMALL), "--backend", "sim", "--timeout", "5"], "--timeout = 5"),
    (["conform", "TRACE", "--tlc-max-events", "1"], "--tlc-max-events = 1"),
    (["conform", "TRACE", "--tlc-timeout", "5"], "--tlc-timeout = 5"),
])
def test_an_option_the_run_would_ignore_is_refused(argv: list[str], flag: str,
                                                   tmp_path: Path, capsys) -> None:
    trace = tmp_path / "t.ndjson"
    assert main(["alloc", str(SMALL), "--backend", "sim", "--ranks", "1", "--trace",
                 str(trace)]) == 0
    capsys.readouterr()
    argv = [str(trace) if a == "TRACE" else a for a in argv]
    assert main(argv) == 2
    assert flag in capsys.readouterr().err


@pytest.mark.parametrize("devices, rule", [
    ([0, 0, 1], r"two ranks on one device: devices\[1\] = 0 as devices\[0\]"),
    ([0, 1], "need 3 distinct CUDA ordinals"),
])
def test_allocate_refuses_bad_devices_as_an_argument(devices: list[int], rule: str) -> None:
    """Was a PlanError (exit 1, as if the plan had been refused)."""
    drv = SimDriver(devices=4)
    with pytest.raises(ArgumentError, match=rule):
        allocate(SMALL, backend=drv, devices=devices)
    assert drv.live().as_dict()["handles"] == 0 and sum(drv.calls.values()) == 0


def test_a_plan_that_is_no_label_and_no_file_names_the_labels(capsys) -> None:
    assert main(["alloc", str(SMALL), "--backend", "sim", "--plan", "Packed"]) == 2
    assert "--plan = 'Packed': not a plan label (naive, reference, packed)" \
        in capsys.readouterr().err


@pytest.mark.parametrize("option, value", [("--sim-pool", "POOL"),
                                           ("--sim-handle-budget", "10")])
def test_sim_only_options_with_the_cuda_backend_are_refused(option: str, value: str,
                                                            tmp_path: Path, capsys) -> None:
    """They were dropped without a word (before any CUDA call, so no GPU is needed)."""
    value = str(tmp_path / "pool") if value == "POOL" else value
    assert main(["alloc", str(SMALL), "--backend", "cuda", option, value]) == 2
    err = capsys.readouterr().err
    assert f"{option} = " in err and "sim backend only" in err, err


def test_a_granularity_that_is_no_power_of_two_is_refused_before_the_driver(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Planning takes any granularity; allocating one of 3 x 2 MiB reached
    cuMemAddressReserve, which refused the alignment (an allocation failure), then was
    a PlanError naming no field: the geometry's field breaks the rule (exit 2)."""
    from kvgrant.errors import GeometryError

    G = 3 << 21
    g = {"name": "g6m", "granularity": G, "pages": 2, "page_tokens": 16,
         "planes": [{"name": "p", "bytes_per_page": G}],
         "regions": [{"name": "r", "rows": 1, "row_bytes": G}],
         "aliases": [{"region": "r", "offset": 0, "plane": "p", "plane_offset": 0,
                      "length": G}],
         "topology": {"ranks": 2, "import_groups": [[0, 1]]}}
    path = tmp_path / "g6m.json"
    path.write_text(json.dumps(g))
    drv = SimDriver(devices=2)
    with pytest.raises(GeometryError, match="granularity = 6291456: must be a power of two") \
            as err:
        allocate(path, backend=drv)
    assert (err.value.field, err.value.value) == ("granularity", G)
    assert sum(drv.calls.values()) == 0
    capsys.readouterr()
    assert main(["alloc", str(path), "--backend", "sim", "--json"]) == 2
    doc = json.loads(capsys.readouterr().out)
    assert (doc["kind"], doc["field"], doc["value"]) == ("GeometryError", "granularity", G)


# --- review 2026-12-05 (a bad-input sweep): each message states the rule broken ------
@pytest.mark.parametrize("argv, says", [
    # the option's own limit (was "must be > 0 and below 10,000,000 s", 1e309 as "inf")
    (["plan", str(SMALL), "--time-limit", "1e309"], "'1e309': must be at most 86,400 s"),
    (["plan", str(SMALL), "--time-limit", "10000000"], "'10000000': must be at most 86,400 s"),
    (["plan", str(SMALL), "--time-limit", "-1"], "'-1': must be > 0 seconds"),
    # a decimal only (float() also read "inf", "nan" and "1_0")
    (["plan", str(SMALL), "--time-limit", "inf"], "'inf': not a number of seconds"),
    (["plan", str(SMALL), "--time-limit", "1_0"], "'1_0': not a number of seconds"),
    (["alloc", str(SMALL), "--backend", "sim", "--procs", "2", "--timeout", "1_0"],
     "'1_0': not a number of seconds"),
    # a negative count breaks ">= 0" (was "'-1': not an integer")
    (["alloc", str(SMALL), "--backend", "sim", "--handle-budget", "-1"], "'-1': must be >= 0"),
    # ... and a negative count of an option that needs >= 1 breaks that rule (was ">= 0"
    # for -1 and ">= 1" for 0: review 2026-12-07)
    (["alloc", str(SMALL), "--backend", "sim", "--fail-at", "-3"], "'-3': must be >= 1"),
    (["alloc", str(SMALL), "--backend", "sim", "--ranks", "-1"], "'-1': must be >= 1"),
    (["alloc", str(SMALL), "--backend", "sim", "--procs", "-2"], "'-2': must be >= 1"),
    (["verify", "--workers", "-1"], "'-1': must be >= 1"),
    # an ordinal of 8 digits is out of range like one of 7 (was the generic message)
    (["alloc", str(SMALL), "--backend", "sim", "--devices", "99999999,0,1"],
     "99999999: a CUDA ordinal must be in 0..1023"),
])
def test_a_bad_option_value_is_told_the_rule_it_breaks(argv: list[str], says: str,
                                                       capsys) -> None:
    with pytest.raises(SystemExit) as info:
        main(argv)
    assert info.value.code == 2
    assert says in capsys.readouterr().err


@pytest.mark.parametrize("text, seconds", [("30", 30.0), ("2.5", 2.5), (".5", 0.5),
                                           ("1e3", 1000.0), (" 30 ", 30.0), ("86400", 86400.0)])
def test_a_decimal_number_of_seconds_is_read(text: str, seconds: float) -> None:
    from kvgrant.commands.plan import _time_limit

    assert _time_limit(text) == seconds


@pytest.mark.parametrize("ledger, says", [("", "not an empty string"),
                                          ("a\0b", "must not contain a NUL")])
def test_an_empty_ledger_path_is_refused_when_the_budget_is_made(ledger: str,
                                                                 says: str) -> None:
    """Was accepted, then allocate() failed with "ledger .: ... Is a directory" (the
    message the CLI's own empty-path check had removed)."""
    from kvgrant.runtime.options import HandleBudget

    with pytest.raises(ArgumentError, match=f"HandleBudget.ledger = .*: .*{says}") as err:
        HandleBudget(ledger=ledger)
    assert err.value.argument == "HandleBudget.ledger"
