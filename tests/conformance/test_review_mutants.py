"""Trace mutants an independent review found accepted or crashing (2026-12-01): each is
now refused with a message naming the line and the field, by every reader and engine."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import pytest

from kvgrant.cli import main
from kvgrant.conformance.group_io import load_group
from kvgrant.conformance.replay import replay
from kvgrant.conformance.tla_trace import check_traces_tlc
from kvgrant.conformance.trace_io import load_trace, parse_trace, parse_trace_lines
from kvgrant.errors import TraceError

from _conform_support import needs_java, record_small_trace

ROOT = Path(__file__).resolve().parents[2]
GROUP = ROOT / "tests" / "fixtures" / "group" / "2proc-published-shutdown"
HUGE = "9" * 5000  # past Python's 4,300-digit limit on int()




def _first(lines: list[str], action: str) -> int:
    return next(i for i, line in enumerate(lines) if f'"action": "{action}"' in line)


def _both_readers_refuse(lines: list[str], field: str) -> str:
    text = "\n".join(lines) + "\n"
    with pytest.raises(TraceError) as fast:
        parse_trace(text)
    with pytest.raises(TraceError) as slow:
        parse_trace_lines(lines)
    assert field in str(fast.value) and str(fast.value) == str(slow.value)
    return str(fast.value)


def test_a_grant_to_a_negative_ordinal_is_refused(tmp_path, capsys) -> None:
    lines = record_small_trace(tmp_path)
    i = _first(lines, "Grant")
    ev = json.loads(lines[i])
    ev["args"]["devices"] = [-1, -2]  # read as ranks 0 and 1 by the old fallback
    lines[i] = json.dumps(ev)
    msg = _both_readers_refuse(lines, "args.devices = [-1, -2]")
    assert f":{i + 1}:" in msg and "integers >= 0" in msg


@pytest.mark.parametrize("field", ["alloc", "handle", "va", "size", "device"])
def test_an_integer_past_the_digit_limit_is_refused_not_a_traceback(tmp_path, capsys,
                                                                    field) -> None:
    lines = record_small_trace(tmp_path)
    i = _first(lines, "Create" if field in ("alloc", "handle", "size") else "Map")
    lines[i], n = re.subn(rf'"{field}": \d+', f'"{field}": {HUGE}', lines[i], count=1)
    assert n == 1
    msg = _both_readers_refuse(lines, "an integer of more than 4,300 digits")
    path = tmp_path / "huge.ndjson"
    path.write_text("\n".join(lines) + "\n")
    capsys.readouterr()
    assert main(["conform", str(path), "--engine", "python", "--json"]) == 2
    doc = json.loads(capsys.readouterr().out)
    assert doc["error"] == "malformed" and doc["line"] == i + 1
    assert msg.split(": ", 1)[1] in doc["message"]


def test_a_group_trace_with_a_huge_integer_is_refused(tmp_path) -> None:
    folder = tmp_path / "g"
    shutil.copytree(GROUP, folder)
    path = folder / "rank1.ndjson"
    lines = path.read_text().splitlines()
    i = next(k for k, line in enumerate(lines) if k and re.search(r'"va": \d+', line))
    lines[i] = re.sub(r'"va": \d+', f'"va": {HUGE}', lines[i], count=1)
    path.write_text("\n".join(lines) + "\n")
    with pytest.raises(TraceError, match="more than 4,300 digits") as err:
        load_group([folder])
    assert err.value.line == i + 1


@pytest.mark.parametrize("action", ["Create", "Grant", "Release"])
def test_a_driver_step_without_its_call_and_result_is_refused(tmp_path, action) -> None:
    lines = record_small_trace(tmp_path)
    i = _first(lines, action)
    ev = json.loads(lines[i])
    ev["call"] = ev["result"] = None
    lines[i] = json.dumps(ev)
    assert "is a driver step" in _both_readers_refuse(lines, "call = null, result = null")


@pytest.mark.parametrize("t", ["-1.0", "NaN", "1e400", "Infinity"])
def test_a_time_that_is_negative_or_not_finite_is_refused(tmp_path, t) -> None:
    lines = record_small_trace(tmp_path)
    i = _first(lines, "Create")
    lines[i] = re.sub(r'"t": [0-9.]+', f'"t": {t}', lines[i], count=1)
    assert "finite number of seconds >= 0" in _both_readers_refuse(lines, "t = ")


def _aborted(tmp_path: Path) -> list[str]:
    lines = record_small_trace(tmp_path, "--fail-at", "40")
    assert '"failed_rank": 0' in lines[_first(lines, "Abort")]
    return lines


@pytest.mark.parametrize("named", ["2", "null"])
def test_an_abort_must_name_the_rank_that_failed(tmp_path, named) -> None:
    lines = _aborted(tmp_path)
    i = _first(lines, "Abort")
    lines[i] = lines[i].replace('"failed_rank": 0', f'"failed_rank": {named}')
    v = replay(parse_trace("\n".join(lines) + "\n"))
    assert not v.accepted and v.index == i - 1
    assert f"Abort names failed_rank {named}" in v.reason and "failed is 0" in v.reason


@pytest.mark.tlc
def test_tlc_agrees_on_the_abort_mutants(tmp_path) -> None:
    needs_java()
    lines = _aborted(tmp_path)
    i = _first(lines, "Abort")
    paths = []
    for named in ("0", "2", "null"):
        p = tmp_path / f"abort-{named}.ndjson"
        p.write_text("\n".join(lines).replace('"failed_rank": 0', f'"failed_rank": {named}')
                     + "\n")
        paths.append(p)
    verdicts = check_traces_tlc([load_trace(p) for p in paths], jobs=2)
    assert [v.accepted for v in verdicts] == [True, False, False]
    assert [v.index for v in verdicts[1:]] == [i - 1, i - 1]
