"""Trace edits an independent mutation search (2026-12-02) found accepted or crashing:
a header with more pages than the geometry, a one-process trace whose Create returns
a handle another rank holds live, a group MapAlias of an allocation the plan does not
alias (a TypeError traceback), and group events that name another action's call."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from kvgrant.cli import main
from kvgrant.conformance import load_trace, replay

from tests.conformance._conform_support import record_small_trace

ROOT = Path(__file__).resolve().parents[2]
SMALL = ROOT / "examples" / "small.json"


def _group(tmp_path: Path, geometry: Path = SMALL) -> Path:
    out = tmp_path / "group"
    assert main(["alloc", str(geometry), "--backend", "sim", "--procs", "3",
                 "--trace", str(out)]) == 0
    return out


def _edit(path: Path, index: int, **fields: object) -> None:
    """Set ``fields`` on the event of line ``index`` (0: the header) of ``path``."""
    lines = path.read_text().splitlines()
    ev = json.loads(lines[index])
    ev.update(fields)
    lines[index] = json.dumps(ev)
    path.write_text("\n".join(lines) + "\n")


def _conform(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str]:
    capsys.readouterr()
    rc = main(["conform", *args])
    got = capsys.readouterr()
    return rc, got.out + got.err


@pytest.mark.parametrize("group", [False, True])
def test_a_header_with_more_pages_than_the_geometry_does_not_match_it(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], group: bool) -> None:
    """Fitting to free memory only takes pages away; 48 pages of a 24-page geometry
    (twice its planes and capacity) was said to match it."""
    doc = json.loads(SMALL.read_text())
    doc["pages"] = 48
    big = tmp_path / "small-48.json"
    big.write_text(json.dumps(doc))
    if group:
        trace = _group(tmp_path, big)
    else:
        trace = tmp_path / "t.ndjson"
        assert main(["alloc", str(big), "--backend", "sim", "--trace", str(trace)]) == 0
    rc, text = _conform(capsys, str(trace), "--geometry", str(SMALL))
    assert rc == 1, text
    assert "header.pages = 48: more than the geometry's pages = 24" in text


def test_a_create_returning_a_handle_live_on_another_rank_is_rejected(
        tmp_path: Path) -> None:
    """The ranks of a one-process trace share one process, whose handles are unique:
    rank 1 getting rank 0's live handle reads as mapping rank 0's memory."""
    lines = record_small_trace(tmp_path)
    evs = [json.loads(x) for x in lines]
    h0 = next(e["handle"] for e in evs if e.get("action") == "Create" and e["rank"] == 0)
    first = None
    for i, e in enumerate(evs):
        if e.get("rank") == 1 and (e.get("args") or {}).get("alloc") == 0 \
                and e.get("handle") is not None:
            e["handle"] = h0
            first = i if first is None else first
    path = tmp_path / "collide.ndjson"
    path.write_text("\n".join(json.dumps(e) for e in evs) + "\n")
    v = replay(load_trace(path))
    assert not v.accepted
    assert v.index == first - 1   # events count from the line after the header
    assert "still live (rank 0's alloc 0)" in v.reason


@pytest.mark.tlc
def test_tlc_rejects_the_cross_rank_handle_at_the_same_event(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    lines = record_small_trace(tmp_path)
    evs = [json.loads(x) for x in lines]
    h0 = next(e["handle"] for e in evs if e.get("action") == "Create" and e["rank"] == 0)
    for e in evs:
        if e.get("rank") == 1 and (e.get("args") or {}).get("alloc") == 0 \
                and e.get("handle") is not None:
            e["handle"] = h0
    path = tmp_path / "collide.ndjson"
    path.write_text("\n".join(json.dumps(e) for e in evs) + "\n")
    rc, text = _conform(capsys, str(path), "--engine", "both", "--json")
    doc = json.loads(text[text.index("{"):])
    assert rc == 1 and doc["agree"], text
    assert not doc["accepted"]


def test_a_group_map_alias_of_an_unaliased_allocation_is_a_verdict_not_a_traceback(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    d = _group(tmp_path)
    f = d / "rank0.ndjson"
    evs = [json.loads(x) for x in f.read_text().splitlines()]
    aliased = {e["args"]["alloc"] for e in evs if e.get("action") == "MapAlias"}
    k = next(i for i, e in enumerate(evs) if e.get("action") == "Map"
             and e["args"]["alloc"] not in aliased)
    _edit(f, k, action="MapAlias")
    rc, text = _conform(capsys, str(d))
    assert rc == 1, text
    assert "MapAlias of an allocation the plan does not alias" in text
    assert "Traceback" not in text


@pytest.mark.parametrize("action, call", [
    ("Send", "cuMemAddressFree"), ("Import", "cuMemCreate"), ("ImportGrant", "cuMemMap"),
    ("Create", "cuMemMap"), ("RankReady", "cuMemCreate"),
])
def test_a_group_event_naming_another_actions_call_is_malformed(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], action: str, call: str) -> None:
    """docs/group-trace.md fixes each action's call (recvmsg against
    cuMemImportFromShareableHandle tells a cancelled receive from a driver failure);
    group traces took any call."""
    d = _group(tmp_path)
    for f in sorted(d.glob("*.ndjson")):
        evs = [json.loads(x) for x in f.read_text().splitlines()]
        k = next((i for i, e in enumerate(evs) if e.get("action") == action), None)
        if k is not None:
            _edit(f, k, call=call)
            break
    else:
        pytest.fail(f"no {action} in the group's traces")
    rc, text = _conform(capsys, str(d))
    assert rc == 2, text
    assert f'call = "{call}": {action} ' in text


def test_a_clean_group_still_conforms_with_every_call_checked(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    rc, text = _conform(capsys, str(_group(tmp_path)), "--geometry", str(SMALL))
    assert rc == 0, text
