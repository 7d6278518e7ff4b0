"""The TLC engine: the generated trace module, TLC value parsing, and verdicts that
match the Python engine (tlc mark: needs Java)."""

from __future__ import annotations

import json

import pytest

from kvgrant.conformance import check_trace
from kvgrant.conformance import tlc
from kvgrant.conformance.mutants import _bases_of, reference_trace, trace_from_events
from kvgrant.conformance.replay import replay
from kvgrant.conformance.tla_trace import (check_trace_tlc, check_traces_tlc,
                                           parse_tla_value, parse_tlc_state,
                                           trace_module_text)
from kvgrant.errors import ToolError

from _conform_support import small_header


def test_trace_module_holds_constants_and_every_event(header) -> None:
    t = reference_trace(header)
    text = trace_module_text(t)
    assert text.startswith("---- MODULE KVTraceData ----")
    assert "TraceNumRanks == 3" in text and "TraceNumAllocs == 4" in text
    assert "TraceAliased == {1, 3}" in text and "TraceOwnerOnly == {3}" in text
    assert "TraceImporters == [r \\in 0..2 |-> <<{1}, {0}, {}>>[r + 1]]" in text
    assert text.count("[action |-> ") == len(t.events)
    assert '[action |-> "Grant", rank |-> 0, alloc |-> 0, mapping |-> "plane", ' \
           'devices |-> {0, 1}, ok |-> TRUE, hasResult |-> TRUE' in text


def test_trace_module_holds_objects_in_tlc_sized_integers(header) -> None:
    """VAs (above 2^31) go to TLC as granules from the rank's base, sizes as granules,
    handles by order of appearance: every integer fits TLC's 32 bits."""
    import re

    from kvgrant.conformance.mutants import G, make_header

    t = reference_trace(header)
    text = trace_module_text(t)
    assert "TraceChecksObjects == TRUE" in text
    assert "TraceBase == [x \\in 0..2 |-> <<0, 0, 0>>[x + 1]]" in text
    assert max(abs(int(x)) for x in re.findall(r"-?\d+", text)) < 2 ** 31
    lay = t.header.layout
    assert f"TraceMapOff == [x \\in 0..3 |-> <<{', '.join(str(o // G) for o in lay.map_off)}>>" \
        in text
    maps = [line for line in text.splitlines() if '[action |-> "Map", rank |-> 0' in line]
    assert "evVa |-> 0, size |-> 1, handle |-> 0, failedRank |-> -1]" in maps[0]  # alloc 0
    model_only = trace_module_text(reference_trace(make_header(2, 1, importers={0: [1]})))
    assert "TraceChecksObjects == FALSE" in model_only


def test_parse_tla_values() -> None:
    assert parse_tla_value('(0 :> {<<1, "alias", 2>>} @@ 1 :> {})') == \
        {0: frozenset({(1, "alias", 2)}), 1: frozenset()}
    assert parse_tla_value('[a |-> TRUE, b |-> -3, c |-> "x\\"y"]') == \
        {"a": True, "b": -3, "c": 'x"y'}
    assert parse_tla_value("<<>>") == ()
    with pytest.raises(ToolError):
        parse_tla_value("{1, ")
    st = parse_tlc_state('3: <TraceNext line 1>\n/\\ l = 3\n/\\ phase = "Allocating"\n'
                         '/\\ va = <<TRUE, FALSE>>\n')
    assert st == {"l": 3, "phase": "Allocating", "va": (True, False)}


def test_missing_java_is_a_tool_error(monkeypatch, header) -> None:
    monkeypatch.delenv("JAVA_HOME", raising=False)
    monkeypatch.setattr(tlc.shutil, "which", lambda name: None)
    with pytest.raises(ToolError, match="java not found"):
        check_trace_tlc(reference_trace(header))


def test_missing_spec_is_a_tool_error(monkeypatch, tmp_path, header, java) -> None:
    monkeypatch.setenv("KVGRANT_SPECS", str(tmp_path))
    with pytest.raises(ToolError, match="KVLifecycle.tla is missing"):
        check_trace_tlc(reference_trace(header))


@pytest.mark.tlc
def test_tlc_accepts_and_rejects_like_python(java) -> None:
    h = small_header()
    good = [reference_trace(h), reference_trace(h, shutdown=False),
            reference_trace(h, fail_at=0), reference_trace(h, fail_at=13)]
    raw = [json.loads(json.dumps(dict(e.raw))) for e in good[0].events]
    cut = trace_from_events(h, raw[:20])                       # ends while allocating
    bad_state = [dict(e) for e in raw]
    assert raw[8]["action"] == "MapAlias"  # after the 3 Reserves and 5 steps of rank 0
    bad_state[8] = {**raw[8], "state": {**raw[8]["state"], "alias_mapped": 0}}
    # a well-formed Create line (no va: its shape leaves it null) before any Reserve; rank
    # 0 then never reserves, so its header base is null (the reader refuses one)
    no_base = _bases_of(h, set(range(1, h.ranks)))
    first = trace_from_events(no_base, [{**raw[0], "action": "Create", "args": {"alloc": 0},
                                         "call": "cuMemCreate", "va": None}] + raw[1:])
    traces = good + [cut, trace_from_events(h, bad_state), first]
    tlc = check_traces_tlc(traces, jobs=2)
    for t, v in zip(traces, tlc):
        p = replay(t)
        assert (v.accepted, v.index) == (p.accepted, p.index), (t.source, v.summary())
        assert v.state_before == p.state_before and v.enabled == p.enabled
    assert [v.accepted for v in tlc] == [True] * 4 + [False] * 3
    assert [v.final_phase for v in tlc[:4]] == ["Shutdown", "Published", "Aborted", "Aborted"]
    assert [v.index for v in tlc[4:]] == [20, 8, 0]


@pytest.mark.tlc
def test_tlc_small_three_rank_trace(java) -> None:
    (v,) = check_trace(reference_trace(small_header()), engine="tlc")
    assert v.accepted and v.engine == "tlc"


@pytest.mark.tlc
def test_cli_both_engines(tmp_path, capsys, java) -> None:
    from kvgrant.cli import main

    h = small_header()
    raw = [json.loads(json.dumps(dict(e.raw))) for e in reference_trace(h).events]
    raw.insert(20, dict(raw[19]))  # a duplicated event
    p = tmp_path / "dup.ndjson"
    p.write_text("\n".join(trace_from_events(h, raw).to_lines()) + "\n")
    assert main(["conform", str(p), "--engine", "both", "--json"]) == 1
    doc = json.loads(capsys.readouterr().out)
    assert doc["agree"] is True and [v["engine"] for v in doc["verdicts"]] == ["python", "tlc"]
    assert {v["index"] for v in doc["verdicts"]} == {20}


@pytest.mark.tlc
def test_tlc_rejects_a_reserve_after_another_ranks_create_where_python_does(java) -> None:
    """ReservedBeforeAnyCreate: the TLC engine agrees with the Python model on a trace
    whose rank 1 reserves only after rank 0 created (the guard is in both models)."""
    from test_replay import _late_reserve

    h = small_header()
    t = trace_from_events(h, _late_reserve(h))
    (v,) = check_trace(t, engine="tlc")
    p = replay(t)
    assert (v.accepted, v.index) == (p.accepted, p.index) == (False, 2), v.summary()
    assert v.enabled == p.enabled
