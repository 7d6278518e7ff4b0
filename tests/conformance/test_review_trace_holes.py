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
from kvgrant.traceformat import format_event

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


def _failed_call_naming_no_va(tmp_path: Path, action: str, size: int | None,
                              fast: bool = False) -> Path:
    """A sim trace whose start-up fails at the first ``action`` (found by --fail-at),
    that failed event made to name no VA and ``size`` (None: the size it named); its
    events in the writer's format (``fast``: the fast reader and row replay take it) or
    with sorted keys (the detailed reader and event replay)."""
    for k in range(1, 200):
        lines = record_small_trace(tmp_path, "--fail-at", str(k))
        evs = [json.loads(x) for x in lines]
        failed = [i for i, e in enumerate(evs) if e.get("result") not in (None, "CUDA_SUCCESS")
                  and e.get("kind") == "event"]
        if failed and evs[failed[0]]["action"] == action:
            i = failed[0]
            evs[i]["va"] = None
            if size is not None:
                evs[i]["size"] = size
            path = tmp_path / f"{action}-{size}-{fast}.ndjson"
            path.write_text("\n".join([lines[0]] + [
                format_event(e) if fast else json.dumps(e, sort_keys=True)
                for e in evs[1:]]) + "\n")
            assert (load_trace(path).rows is not None) is fast
            return path
    raise AssertionError(f"no --fail-at K fails a {action}")


@pytest.mark.parametrize("fast", [True, False], ids=["writer-lines", "sorted-keys"])
@pytest.mark.parametrize("action", ["MapAlias", "Map", "Grant"])
def test_a_failed_call_naming_no_va_is_checked_for_the_size_it_names(
        tmp_path: Path, action: str, fast: bool) -> None:
    # review 2026-12-07: the size was checked only with the VA, so a failed MapAlias or
    # Grant naming no VA passed with any size (TLC's trace spec likewise); the row
    # replay of writer-format lines kept that hole until CI's slower clock wrote every
    # time stamp in the fast reader's format (CI of bff8f93)
    as_named = replay(load_trace(_failed_call_naming_no_va(tmp_path, action, None, fast)))
    assert as_named.accepted, as_named.reason  # naming no VA is allowed
    v = replay(load_trace(_failed_call_naming_no_va(tmp_path, action, 123 << 21, fast)))
    assert not v.accepted and v.event.action == action
    assert f"no VA, {123 << 21:#x} bytes" in v.reason, v.reason


@pytest.mark.tlc
def test_tlc_checks_the_size_a_failed_call_names_too(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = _failed_call_naming_no_va(tmp_path, "MapAlias", 123 << 21)
    rc, text = _conform(capsys, str(path), "--engine", "both", "--json")
    doc = json.loads(text[text.index("{"):])
    assert rc == 1 and doc["agree"] and not doc["accepted"], text


def _publish_and_map(evs: list[dict]) -> tuple[int, int]:
    return (next(i for i, e in enumerate(evs) if e.get("action") == "Publish"),
            next(i for i, e in enumerate(evs) if e.get("action") == "Map"))


@pytest.mark.parametrize("edit, says", [
    ("group_state_counters", "unknown key (a group event's state is its phase alone)"),
    ("rank_state_extra", "state.imported = 3: unknown key (a rank event's state is phase"),
    ("group_device", "device = 5: must be null: a Publish event carries no device"),
])
def test_what_an_event_may_not_carry_is_refused_not_ignored(tmp_path: Path, edit: str,
                                                            says: str) -> None:
    # review 2026-12-07: a Publish whose state claimed rank counters, a rank event's
    # state with a key of no model, and a Publish naming a device were all accepted
    from kvgrant.errors import TraceError

    evs = [json.loads(x) for x in record_small_trace(tmp_path)]
    publish, first_map = _publish_and_map(evs)
    if edit == "group_state_counters":  # the rank counters, in the writer's order
        evs[publish]["state"] = {**evs[publish - 1]["state"], "phase": "Published"}
    elif edit == "rank_state_extra":
        evs[first_map]["state"]["imported"] = 3
    else:
        evs[publish]["device"] = 5
    path = tmp_path / f"{edit}.ndjson"
    path.write_text("\n".join(json.dumps(e) for e in evs) + "\n")
    with pytest.raises(TraceError) as info:
        load_trace(path)
    assert says in str(info.value), info.value
