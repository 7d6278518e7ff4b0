"""The Python engine: valid traces are accepted, each kind of bad step is rejected at
its own index with the state before it and the actions enabled there."""

from __future__ import annotations

import argparse
import functools
import json
import random
from pathlib import Path

import pytest
from hypothesis import assume, given, settings, strategies as st

from kvgrant.commands import conform
from kvgrant.conformance.model import Action, Constants, apply, enabled, initial_state
from kvgrant.conformance.mutants import (make_header, reference_trace, trace_from_actions,
                                         trace_from_events)
from kvgrant.conformance.replay import replay
from kvgrant.errors import TraceError
from kvgrant.conformance.trace_io import DRIVER_STEPS, parse_trace, parse_trace_lines

from _conform_support import record_small_trace, small_header
from test_trace_io import writer_text


def _raw(trace) -> list[dict]:
    return [json.loads(json.dumps(dict(e.raw))) for e in trace.events]


def test_published_and_shutdown_accepted(header) -> None:
    full = replay(reference_trace(header))
    assert full.accepted and full.final_phase == "Shutdown"
    # per rank: Reserve, 4 x (Create, Map, Grant plane), 2 x (MapAlias, Grant alias),
    # RankReady = 18; Publish; Unpublish; per rank 4 + 2 Unmap, 4 Release, Free = 11;
    # ShutdownComplete
    assert full.events == 3 * 18 + 1 + 1 + 3 * 11 + 1
    assert full.ranks == 3 and full.index is None and full.line is None
    pub = replay(reference_trace(header, shutdown=False))
    assert pub.accepted and pub.final_phase == "Published"


def test_failure_at_every_driver_step_is_accepted_and_aborts(header) -> None:
    steps = sum(1 for e in reference_trace(header, shutdown=False).events
                if e.action in DRIVER_STEPS)
    for k in range(steps):
        t = reference_trace(header, fail_at=k)
        v = replay(t)
        assert v.accepted, (k, v.summary())
        assert v.final_phase == "Aborted"
        assert sum(not e.ok for e in t.events) == 1


def test_non_terminal_end_is_rejected_past_the_last_event(header) -> None:
    t = reference_trace(header)
    cut = trace_from_events(t.header, _raw(t)[:12])  # 3 Reserves, rank 0 to Create a2
    v = replay(cut)
    assert not v.accepted and v.index == 12 and v.event is None and v.line == 14
    assert "not terminal" in v.reason and v.final_phase == "Allocating"
    # allocation 2 is created but not mapped: the next Create waits until it is complete;
    # every rank holds its VA, so the other ranks may create
    assert set(v.enabled) == {"Map(r0, a2)", "Create(r1, a0)", "Create(r2, a0)",
                              'Fail(r0, "Map")', 'Fail(r1, "Create")', 'Fail(r2, "Create")'}


def test_state_disagreement_is_rejected_with_state_and_enabled(header) -> None:
    raw = _raw(reference_trace(header))
    assert raw[4]["action"] == "Map"
    raw[4]["state"]["mapped"] = 2  # Map(r0, a0) claims two plane mappings
    v = replay(trace_from_events(header, raw))
    assert not v.accepted and v.index == 4 and v.line == 6
    assert "mapped 2 != model 1" in v.reason
    assert v.state_before["ranks"]["0"]["created"] == [0]
    assert v.state_before["ranks"]["0"]["mapped"] == []
    assert "Map(r0, a0)" in v.enabled and 'Fail(r0, "Map")' in v.enabled


def test_grant_to_declared_reader_is_rejected(header) -> None:
    raw = _raw(reference_trace(header))
    i = next(k for k, e in enumerate(raw) if e["action"] == "Grant")
    raw[i]["args"]["devices"] = [0, 1, 2]
    v = replay(trace_from_events(header, raw))
    assert v.index == i and "not owner or importer: [2]" in v.reason


def test_owner_only_alias_granted_to_importer_is_rejected(header) -> None:
    raw = _raw(reference_trace(header))
    i = next(k for k, e in enumerate(raw) if e["action"] == "Grant"
             and e["args"] == {"alloc": 3, "mapping": "alias", "devices": [0]})
    raw[i]["args"]["devices"] = [0, 1]
    raw[i]["state"]["grants"] += 1
    v = replay(trace_from_events(header, raw))
    assert v.index == i and "GrantSet is [0]" in v.reason


def test_devices_are_read_through_the_header_map() -> None:
    h = make_header(2, 1, importers={0: [1], 1: [0]})
    h = type(h)(**{**h.__dict__, "devices": {0: 4, 1: 6}})
    t = reference_trace(h)
    grant = next(e for e in t.events if e.action == "Grant")
    assert grant.devices == (4, 6)
    assert replay(t).accepted
    raw = _raw(t)
    raw[grant.index]["args"]["devices"] = [0, 1]  # ranks instead of ordinals
    assert replay(trace_from_events(h, raw)).index == grant.index


def test_failed_undo_that_records_its_object_gone_is_rejected(header) -> None:
    """A failed undo leaks its object (UndoFail, 2026-12-07): a failed Release whose
    recorded state says the handle is gone disagrees with the model there. (Until
    2026-12-07 any failed undo was refused: "failures only at the driver steps".)"""
    raw = _raw(reference_trace(header))
    i = next(k for k, e in enumerate(raw) if e["action"] == "Release")
    raw[i]["result"] = "CUDA_ERROR_INVALID_VALUE"
    v = replay(trace_from_events(header, raw))
    assert v.index == i and "recorded state disagrees" in v.reason and "created" in v.reason


def test_model_only_step_with_a_result_is_rejected(header) -> None:
    raw = _raw(reference_trace(header))
    i = next(k for k, e in enumerate(raw) if e["action"] == "RankReady")
    raw[i]["result"] = "CUDA_SUCCESS"
    assert replay(trace_from_events(header, raw)).index == i


def test_failed_call_must_be_able_to_run(header) -> None:
    # Fail(r0, "Create") is enabled, but the trace claims Create(r0, a2) failed first
    t = reference_trace(header, fail_at=3)  # after the 3 Reserves
    raw = _raw(t)
    assert raw[3]["action"] == "Create" and raw[3]["result"] != "CUDA_SUCCESS"
    raw[3]["args"]["alloc"] = 2
    v = replay(trace_from_events(t.header, raw))
    assert v.index == 3 and "could not run here" in v.reason


def test_abort_without_failure_and_publish_after_failure_rejected(header) -> None:
    c = Constants.from_header(header)
    s = initial_state(c)
    assert Action("Abort") not in enabled(c, s)
    t = reference_trace(header, fail_at=3)
    raw = _raw(t)
    i = next(k for k, e in enumerate(raw) if e["action"] == "Abort")
    raw[i] = {**raw[i], "action": "Publish", "args": {}, "state": {"phase": "Published"}}
    assert replay(trace_from_events(t.header, raw)).index == i


def _random_walk(c: Constants, rng: random.Random, stop_published: bool) -> list:
    s = initial_state(c)
    acts = []
    while s.phase not in ("Aborted", "Shutdown"):
        if s.phase == "Published" and stop_published:
            break
        options = enabled(c, s)
        act = rng.choice(options)
        if act.name == "Fail":  # give the failed call its own arguments
            act = next(Action("Fail", a.rank, a.alloc, a.mapping, step=act.step)
                       for a in enabled(c, s, with_fail=False)
                       if a.name == act.step and a.rank == act.rank)
        apply(c, s, act)
        result = ("CUDA_ERROR_OUT_OF_MEMORY" if act.name == "Fail" else "CUDA_SUCCESS"
                  if act.name in DRIVER_STEPS | {"Unmap", "Release", "Free"} else None)
        acts.append((act, result))
    return acts


@settings(max_examples=60, deadline=None)
@given(ranks=st.integers(1, 3), allocs=st.integers(1, 3), seed=st.integers(0, 10**6),
       data=st.data())
def test_random_behaviours_are_accepted(ranks, allocs, seed, data) -> None:
    aliased = data.draw(st.sets(st.integers(0, allocs - 1)))
    owner_only = data.draw(st.sets(st.sampled_from(sorted(aliased)))) if aliased else set()
    importers = {r: data.draw(st.sets(st.sampled_from([x for x in range(ranks) if x != r])))
                 if ranks > 1 else set() for r in range(ranks)}
    h = make_header(ranks, allocs, aliased, owner_only, importers)
    rng = random.Random(seed)
    acts = _random_walk(Constants.from_header(h), rng, stop_published=rng.random() < 0.3)
    t = trace_from_actions(h, acts)
    v = replay(t)
    assert v.accepted, v.summary()
    # every proper prefix that stops outside a terminal phase is rejected at its end
    k = rng.randrange(len(acts))
    prefix = trace_from_actions(h, acts[:k])
    pv = replay(prefix)
    phase = prefix.events[-1].state["phase"] if k else "Allocating"
    assert pv.accepted == (phase in ("Published", "Aborted", "Shutdown"))
    if not pv.accepted:
        assert pv.index == k


# --- the CLI ---------------------------------------------------------------------------

def _cli(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="kvgrant")
    conform.add_parser(parser.add_subparsers(dest="command"))
    args = parser.parse_args(["conform", *argv])
    return args.run(args)


def _write(tmp_path: Path, trace, name: str = "t.ndjson") -> str:
    p = tmp_path / name
    p.write_text("\n".join(trace.to_lines()) + "\n")
    return str(p)


def test_cli_accepts(tmp_path, capsys) -> None:
    assert _cli([_write(tmp_path, reference_trace(small_header()))]) == 0
    out = capsys.readouterr().out
    assert out.startswith("accepted by python: 90 events, 3 ranks")


def test_cli_rejects_with_state_and_enabled(tmp_path, capsys) -> None:
    h = small_header()
    raw = _raw(reference_trace(h))
    assert raw[5]["action"] == "Grant"
    del raw[5]  # drop Grant(r0, a0, plane): Create(r0, a1) comes before a0 is complete
    assert _cli([_write(tmp_path, trace_from_events(h, raw))]) == 1
    out = capsys.readouterr().out
    assert "rejected by python at event 5 (line 7)" in out
    assert "Create(r0, a1) is not enabled" in out
    assert "rank 0: va=True created=[0] mapped=[0] alias_mapped=[] grants=0" in out
    assert "enabled there: " in out and "Grant(r0, a0, plane)" in out


def test_cli_json(tmp_path, capsys) -> None:
    h = small_header()
    raw = _raw(reference_trace(h))
    raw[3]["state"]["created"] = 5
    assert _cli([_write(tmp_path, trace_from_events(h, raw)), "--json"]) == 1
    doc = json.loads(capsys.readouterr().out)
    assert doc["accepted"] is False and doc["agree"] is True
    (v,) = doc["verdicts"]
    assert v["index"] == 3 and v["line"] == 5 and v["event"]["action"] == "Create"
    assert v["state_before"]["ranks"]["0"]["va"] is True and "Create(r0, a0)" in v["enabled"]
    # the fields of every kvgrant --json failure document (review 2026-12-07: a
    # rejection's document had none of them)
    assert (doc["ok"], doc["kind"], doc["exit_status"]) == (False, "Rejected", 1)
    assert doc["message"].startswith("rejected by python at event 3 (line 5)"), doc["message"]
    assert _cli([_write(tmp_path, reference_trace(h)), "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert (doc["ok"], doc["accepted"], doc["exit_status"]) == (True, True, 0)
    assert "kind" not in doc


def test_cli_malformed_exits_2_without_traceback(tmp_path, capsys) -> None:
    p = tmp_path / "bad.ndjson"
    lines = reference_trace(small_header()).to_lines()
    lines[3] = lines[3].replace('"seq": 2', '"seq": 7')
    p.write_text("\n".join(lines) + "\n")
    assert _cli([str(p)]) == 2
    err = capsys.readouterr().err
    assert f"{p}:4: seq = 7" in err and "Traceback" not in err
    assert _cli([str(tmp_path / "missing.ndjson"), "--json"]) == 2
    doc = json.loads(capsys.readouterr().out)
    assert doc["error"] == "malformed"


@pytest.mark.parametrize("line, old, new, says", [
    # the type is what is wrong (was: "seq = '2': expected 2", "rank = True: ... a rank")
    (3, '"seq": 2', '"seq": "2"', 'seq = "2": expected the integer 2'),
    (5, '"rank": 0', '"rank": true', "rank = true: Map needs an integer rank in 0.."),
])
def test_cli_malformed_names_the_json_value_and_the_type_it_needs(
        tmp_path, capsys, line: int, old: str, new: str, says: str) -> None:
    p = tmp_path / "bad.ndjson"
    lines = reference_trace(small_header()).to_lines()
    assert old in lines[line], lines[line]
    lines[line] = lines[line].replace(old, new, 1)
    p.write_text("\n".join(lines) + "\n")
    assert _cli([str(p)]) == 2
    assert f"{p}:{line + 1}: {says}" in capsys.readouterr().err


def test_cli_engines_disagreeing_exits_2(tmp_path, capsys, monkeypatch) -> None:
    import kvgrant.conformance as conf

    t = reference_trace(small_header())
    good = replay(t)
    bad = replay(trace_from_events(t.header, _raw(t)[:3]))
    assert good.accepted
    # conform runs the Python replay itself (its verdict is printed first), then TLC
    monkeypatch.setattr(conf, "check_trace_tlc", lambda trace, timeout: bad)
    assert _cli([_write(tmp_path, t), "--engine", "both"]) == 2
    assert "engines DISAGREE" in capsys.readouterr().err


def test_public_names_are_pinned() -> None:
    import importlib

    import kvgrant.conformance as conf

    mods = [importlib.import_module(f"kvgrant.conformance.{m}") for m in
            ("drift", "model", "mutants", "objects", "replay", "tla_trace", "trace_io",
             "trace_plan")]
    mods.append(importlib.import_module("kvgrant.traceformat"))

    assert conf.__all__ == sorted(conf.__all__)
    assert conf.__all__ == [
        "Action", "Constants", "Event", "Header", "ModelState", "Mutant", "Trace", "Verdict",
        "check_trace", "check_trace_tlc", "load_trace", "make_header", "mutants",
        "parse_trace", "reference_trace", "replay", "replay_file"]
    for mod in [conf, *mods]:
        assert mod.__all__ == sorted(mod.__all__), mod.__name__
        for name in mod.__all__:
            assert hasattr(mod, name), (mod.__name__, name)
    with pytest.raises(ValueError, match="engine = 'fast'"):
        conf.check_trace(reference_trace(small_header()), engine="fast")


def _verdict_key(v) -> tuple:
    return (v.accepted, v.index, v.line, v.reason, v.state_before, v.enabled, v.final_phase,
            None if v.event is None else dict(v.event.raw))


def test_fast_rows_give_the_same_verdict_as_events(header) -> None:
    """The replay of writer-format rows (trace_io fast path) and of parsed events agree on
    every verdict field, for valid traces, failures and every trace mutant."""
    from kvgrant.conformance.mutants import mutants

    base = reference_trace(header)
    traces = [base, reference_trace(header, shutdown=False)]
    traces += [reference_trace(header, fail_at=k) for k in (0, 3, 11)]
    traces += [m.trace for m in mutants(base)]
    t = reference_trace(header)
    traces.append(trace_from_events(t.header, _raw(t)[:10]))  # ends non-terminal
    bad = _raw(t)
    bad[7]["state"]["grants"] += 1                            # recorded state disagrees
    traces.append(trace_from_events(t.header, bad))
    rejected = 0
    for tr in traces:
        text = writer_text(tr)
        fast, slow = parse_trace(text), parse_trace_lines(text.split("\n")[:-1])
        assert fast.rows is not None and slow.rows is None
        slow_v, fast_v = replay(slow), replay(fast)
        assert _verdict_key(fast_v) == _verdict_key(slow_v), (tr.source, fast_v.summary())
        rejected += not fast_v.accepted
    assert rejected >= len(mutants(base)) + 2


_EDITS = {"va": (None, 1 << 21, -(1 << 21)), "size": (None, 1 << 21, -(1 << 21)),
          "handle": (None, 1, 99), "device": (None, 1, 7)}


@functools.lru_cache(maxsize=None)
def _sim_trace(fail_at: int):
    """A sim trace of examples/small.json failing at driver call ``fail_at`` (from 103
    on, an undo step: the trace has UndoFail and leaked objects)."""
    import tempfile

    with tempfile.TemporaryDirectory() as d:
        return parse_trace_lines(record_small_trace(Path(d), "--fail-at", str(fail_at)))


# (small_header makes 51 forward driver calls: fail_at 0..50; a larger one is refused,
# where it used to be ignored -- the trace published, as with None)
_SOURCES = st.one_of(st.none(), st.integers(0, 50),
                     st.sampled_from([("sim", k) for k in (11, 40, 104, 120, 140, 160)]))


@settings(max_examples=400, deadline=None)
@given(fail_at=_SOURCES, pick=st.integers(0, 10 ** 6),
       failed_one=st.booleans(),
       edits=st.dictionaries(st.sampled_from(sorted(_EDITS)), st.integers(0, 2),
                             min_size=1, max_size=3))
def test_the_row_replay_and_the_event_replay_agree_on_any_object_edit(
        fail_at: int | tuple[str, int] | None, pick: int, failed_one: bool,
        edits: dict[str, int]) -> None:
    """The row replay (writer-format lines) has its own object checker (RowObjects) for
    speed; edited fields of one event, failed events included, must get the same
    verdict from both (a failed Map naming no VA and a wrong size passed the rows alone,
    CI of bff8f93). The traces: the model's reference ones, and the sim's, failed undo
    steps included."""
    t = _sim_trace(fail_at[1]) if isinstance(fail_at, tuple) else \
        reference_trace(small_header(), fail_at=fail_at)
    evs = _raw(t)
    rank_events = [i for i, e in enumerate(evs) if e["rank"] is not None]
    failed = [i for i in rank_events if evs[i]["result"] != "CUDA_SUCCESS"]
    pool = failed if failed_one and failed else rank_events  # (failed calls: rare, looser)
    i = pool[pick % len(pool)]
    for field, choice in edits.items():
        old, edit = evs[i][field], _EDITS[field][choice]
        evs[i][field] = None if edit is None else (
            edit if field in ("handle", "device") else (old or 0) + edit)
    try:
        text = writer_text(trace_from_events(t.header, evs))
    except TraceError:  # a field the action never carries: malformed, not a verdict
        assume(False)
    fast, slow = parse_trace(text), parse_trace_lines(text.split("\n")[:-1])
    slow_v = replay(slow)
    if fast.rows is None:  # the fast reader sent the text to the detailed one
        return
    fast_v = replay(fast)
    assert _verdict_key(fast_v) == _verdict_key(slow_v), (i, edits, evs[i], fast_v.summary())


def _late_reserve(h) -> list[dict]:
    """A reference trace of ``h`` whose rank 1 reserves only after rank 0's first
    Create (each event's own state is unchanged by the move)."""
    raw = _raw(reference_trace(h))
    assert [e["action"] for e in raw[:4]] == ["Reserve", "Reserve", "Reserve", "Create"]
    late = raw.pop(1)
    raw.insert(3, late)
    return raw


def test_a_rank_that_reserves_after_another_rank_created_is_rejected() -> None:
    """Every rank reserves before any rank creates (docs/INTERFACES.md; the specs'
    ReservedBeforeAnyCreate). A runtime that reserved each rank's VA only when it
    built that rank conformed before the guard existed. Both readers (the fast row
    replay of a writer-format file, and the event replay) reject it at the Create."""
    h = small_header()
    raw = _late_reserve(h)
    v = replay(trace_from_events(h, raw))
    assert not v.accepted and v.index == 2 and v.event.action == "Create", v.summary()
    assert "Create(r0, a0) is not enabled" in v.reason
    assert "Reserve(r1)" in v.enabled and not any(e.startswith("Create") for e in v.enabled)
    fast = parse_trace(writer_text(trace_from_events(h, raw)))
    assert fast.rows is not None  # the writer's format: the row replay runs first
    assert (replay(fast).accepted, replay(fast).index) == (False, 2)
