"""A malformed ``memory_limit`` is bad input: an ArgumentError naming ``memory_limit``,
the value and the rule (was a PlanError, exit 1 as if a plan had been refused), from
``allocate()``, ``parse_memory_limit``/``fit_pages`` and ``kvgrant alloc
--memory-limit`` (exit 2, one error line, no traceback), before any driver call. A
well-formed limit that leaves too little for the layout stays a PlanError (exit 1): the
request was refused on these GPUs, and the same limit fits a larger one."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import pytest

from kvgrant.cli import main
from kvgrant.errors import ArgumentError, PlanError
from kvgrant.runtime.allocator import allocate
from kvgrant.runtime.capacity import MemoryLimit, fit_pages, parse_memory_limit
from kvgrant.runtime.sim import SimDriver
from tests.runtime._small import chunk_plan, small_geometry

SMALL = Path(__file__).resolve().parents[2] / "examples" / "small.json"

# (value, what the message must hold after "memory_limit = VALUE: ")
MALFORMED: list[tuple[Any, str]] = [
    ("lots", "must be a size such as -1G"),
    ("", "must be a size such as -1G"),
    ("1e3G", "must be a size such as -1G"),
    ("nan", "must be a size such as -1G"),
    ("\uff14\uff10G", "ASCII digits"),
    ("--1G", "must be a size such as -1G"),
    ("0", "a positive limit of 0 bytes"),
    ("0G", "a positive limit of 0 bytes"),
    (0, "a positive limit of 0 bytes"),
    ("-5", "a size without a unit is bytes"),
    ("2048", "a size without a unit is bytes"),
    ("9999999999999T", "more than 1 PiB"),
    ("2000T", "more than 1 PiB"),
    (1 << 60, "at most 1,125,899,906,842,624 bytes"),
    (-(1 << 60), "at most 1,125,899,906,842,624 bytes"),
    (True, "True and False are not sizes"),
    (False, "True and False are not sizes"),
    (float("nan"), "a byte count (int) or a MemoryLimit"),
    (1.5, "a byte count (int) or a MemoryLimit"),
    ([40], "a byte count (int) or a MemoryLimit"),
    (b"40G", "a byte count (int) or a MemoryLimit"),
]


@pytest.mark.parametrize("value, rule", MALFORMED, ids=lambda v: repr(v)[:20])
def test_parse_memory_limit_refuses_it_as_an_argument(value: Any, rule: str) -> None:
    with pytest.raises(ArgumentError) as err:
        parse_memory_limit(value)
    e = err.value
    assert not isinstance(e, PlanError)
    assert e.argument == "memory_limit"
    assert e.value is value or (isinstance(value, float) and math.isnan(e.value))
    assert str(e).startswith(f"memory_limit = {value!r}"), str(e)
    assert rule in str(e), str(e)
    # fit_pages reads its limit the same way
    with pytest.raises(ArgumentError, match="^memory_limit = "):
        fit_pages(small_geometry(), {0: 1 << 40}, value)


@pytest.mark.parametrize("value, rule", MALFORMED, ids=lambda v: repr(v)[:20])
def test_allocate_refuses_it_before_any_driver_call(value: Any, rule: str) -> None:
    g = small_geometry()
    drv = SimDriver(devices=3)
    with pytest.raises(ArgumentError) as err:
        allocate(g, plan=chunk_plan(g), driver=drv, memory_limit=value)
    assert err.value.argument == "memory_limit" and "memory_limit = " in str(err.value)
    assert not isinstance(err.value, PlanError)
    assert sum(drv.calls.values()) == 0 and drv.live().is_empty()


def test_a_long_value_is_cut_in_the_message() -> None:
    with pytest.raises(ArgumentError) as err:
        parse_memory_limit("9" * 100_000 + "G")
    assert len(str(err.value)) < 400, len(str(err.value))
    with pytest.raises(ArgumentError) as err:
        parse_memory_limit(10 ** 1000)
    assert "integer of 3322 bits" in str(err.value) and len(str(err.value)) < 300


@pytest.mark.parametrize("kw, field", [
    ({"text": "x", "keep": -1}, "memory_limit.keep"),
    ({"text": "x", "keep": 1 << 60}, "memory_limit.keep"),
    ({"text": "x", "cap": True}, "memory_limit.cap"),
    ({"text": None}, "memory_limit.text"),
])
def test_a_hand_made_memory_limit_names_its_field(kw: dict[str, Any], field: str) -> None:
    with pytest.raises(ArgumentError) as err:
        parse_memory_limit(MemoryLimit(**kw))
    assert err.value.argument == field and str(err.value).startswith(f"{field} = ")


@pytest.mark.parametrize("value", ["-0G", "-0", "-1G", "40G", "-512M", "2097152", -5, 40 << 30,
                                   MemoryLimit(text="8G", cap=8 << 30)])
def test_well_formed_limits_still_parse(value: Any) -> None:
    lim = parse_memory_limit(value)
    assert lim.keep >= 0 and (lim.cap is None or lim.cap > 0)


@pytest.mark.parametrize("value", ["1M", "-150G", 5])
def test_a_limit_that_leaves_too_little_is_still_a_plan_error(value: Any) -> None:
    """Well-formed, but the tightest device then has less than the layout's smallest
    valid size: a planning outcome (exit 1), not bad input; nothing was created."""
    g = small_geometry()
    drv = SimDriver(devices=3)
    with pytest.raises(PlanError) as err:
        allocate(g, plan="packed", driver=drv, memory_limit=value)
    assert not isinstance(err.value, ArgumentError)
    assert "memory_limit = " in str(err.value) and "needs" in str(err.value)
    assert drv.live().is_empty() and drv.calls["cuMemAddressReserve"] == 0


def _alloc(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    capsys.readouterr()
    try:
        rc = main(["alloc", str(SMALL), "--backend", "sim", *argv])
    except SystemExit as ex:  # argparse's usage error
        rc = int(ex.code or 0)
    got = capsys.readouterr()
    return rc, got.out, got.err


@pytest.mark.parametrize("text, rule", [
    ("lots", "must be a size such as -1G"), ("0", "a positive limit of 0 bytes"),
    ("-5", "a size without a unit is bytes"), ("9999999999999T", "more than 1 PiB"),
    ("nan", "must be a size"), ("\uff14\uff10G", "ASCII digits"), ("", "must be a size")])
def test_the_cli_refuses_it_with_exit_2_naming_option_value_and_rule(
        text: str, rule: str, capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    trace = tmp_path / "t.ndjson"
    rc, out, err = _alloc(capsys, f"--memory-limit={text}", "--trace", str(trace))
    assert rc == 2, err
    assert "Traceback" not in err
    last = err.strip().splitlines()[-1]
    assert last.startswith("kvgrant alloc: error: argument --memory-limit: "
                           f"memory_limit = {text!r}: "), last
    assert rule in last, last
    assert not trace.exists()   # refused before anything: no trace
    rc, out, err = _alloc(capsys, f"--memory-limit={text}", "--json")
    doc = json.loads(out)
    assert rc == 2 and doc["ok"] is False and doc["kind"] == "ArgumentError", doc
    assert doc["exit_status"] == 2 and f"memory_limit = {text!r}" in doc["message"], doc


def test_the_cli_keeps_a_too_small_limit_an_exit_1_refusal(
        capsys: pytest.CaptureFixture[str]) -> None:
    rc, out, err = _alloc(capsys, "--memory-limit=1M", "--json")
    doc = json.loads(out)
    assert rc == 1 and doc["kind"] == "PlanError" and doc["exit_status"] == 1, doc
    assert "memory_limit = '1M'" in doc["message"], doc
