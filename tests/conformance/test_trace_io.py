"""Trace reading: valid traces parse, every malformed one names its line."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from kvgrant.conformance.mutants import reference_trace
from kvgrant.conformance.trace_io import load_trace, parse_trace, parse_trace_lines
from kvgrant.traceformat import format_event
from kvgrant.errors import TraceError


def _lines(header) -> list[dict]:
    return [json.loads(x) for x in reference_trace(header).to_lines()]


def _text(objs: list[dict]) -> str:
    return "\n".join(json.dumps(o) for o in objs) + "\n"


def test_round_trip(header, tmp_path: Path) -> None:
    t = reference_trace(header)
    p = tmp_path / "t.ndjson"
    p.write_text("\n".join(t.to_lines()) + "\n")
    back = load_trace(p)
    assert back.header == t.header
    assert [e.raw for e in back.events] == [e.raw for e in t.events]
    assert [e.line for e in back.events] == list(range(2, len(t.events) + 2))
    first = next(i for i, e in enumerate(back.events) if e.action != "Reserve")
    assert first == header.ranks  # every rank reserves before any rank creates
    assert back.events[first].action == "Create" and back.events[first].alloc == 0


def test_header_defaults(header) -> None:
    objs = _lines(header)
    objs[0]["topology"]["declared_readers"] = None
    del objs[0]["devices"]
    t = parse_trace(_text(objs))
    assert t.header.declared_readers[2] == frozenset({2})
    assert t.header.declared_readers[0] == frozenset({0, 1})
    assert dict(t.header.devices) == {0: 0, 1: 1, 2: 2}


def test_header_constants_are_derived_from_the_plan_and_groups(header) -> None:
    """Version 2 lists no importers, aliased or owner-only allocations: they come from
    the import groups and the plan, so a forged list changes nothing."""
    objs = _lines(header)
    assert "importers" not in objs[0] and "aliased" not in objs[0]
    objs[0]["importers"] = {"0": [1, 2], "1": [0], "2": []}
    objs[0]["aliased"] = [0, 1, 2, 3]
    t = parse_trace(_text(objs))
    assert t.header.importers == (frozenset({1}), frozenset({0}), frozenset())
    assert t.header.aliased == frozenset({1, 3}) and t.header.owner_only == frozenset({3})


def test_old_version_is_named(header) -> None:
    objs = _lines(header)
    objs[0]["version"] = 1
    with pytest.raises(TraceError, match="version = 1: a lifecycle trace must be version 2 "
                                         r"\(an old trace: re-record it"):
        parse_trace(_text(objs))


def _mutate(header, line: int, fn) -> str:
    objs = _lines(header)
    fn(objs[line - 1])
    return _text(objs)


@pytest.mark.parametrize("line, change, words", [
    (1, lambda o: o.update(kind="event"), "header"),
    (1, lambda o: o.update(version=3), "version"),
    (1, lambda o: o.update(ranks=0), "ranks"),
    (1, lambda o: o.update(allocs=0), "allocs"),
    (1, lambda o: o.update(allocs=3), "header.allocations"),
    (1, lambda o: o.update(granularity=0), "header.granularity"),
    (1, lambda o: o["allocations"][1].__setitem__(0, "kv9"), "allocations[1].plane"),
    (1, lambda o: o["allocations"][1].__setitem__(1, 4096), "multiple of the granularity"),
    (1, lambda o: o["allocations"][1].__setitem__(1, 0), "overlap allocation 0"),
    (1, lambda o: o["allocations"][2].__setitem__(2, 1 << 40), "pass the end of plane"),
    (1, lambda o: o["allocations"][1].__setitem__(4, 1 << 40), "pass the end of region"),
    (1, lambda o: o["allocations"][0].__setitem__(4, 0), "must be null"),
    (1, lambda o: o["regions"][0].__setitem__(3, "everyone"), "access"),
    (1, lambda o: o["regions"][0].__setitem__(1, 0), "overlaps"),
    (1, lambda o: o["reservations"].pop("2"), "reservations[2]"),
    (1, lambda o: o["reservations"]["1"].__setitem__(1, 2 << 20), "bytes of planes and "
     "regions (a reservation holds them and nothing else), smaller"),
    (1, lambda o: o["reservations"]["1"].__setitem__(1, o["reservations"]["1"][1] + (2 << 20)),
     "bytes of planes and regions (a reservation holds them and nothing else), larger"),
    (1, lambda o: o["reservations"]["1"].__setitem__(0, o["reservations"]["0"][0]),
     "overlaps rank 0"),
    (1, lambda o: o["topology"]["import_groups"].append([1, 2]), "two groups"),
    (1, lambda o: o["topology"]["declared_readers"].update({"0": [0]}), "declared reader"),
    (1, lambda o: o["devices"].update({"1": 0}), "share a device"),
    (3, lambda o: o.update(handle=-1), "handle"),
    (3, lambda o: o.update(va="0x0"), "va ="),
    (3, lambda o: o.update(seq=5), "seq"),
    (3, lambda o: o.update(kind="header"), "kind"),
    (3, lambda o: o.update(action="Destroy"), "action"),
    (3, lambda o: o.update(rank=None), "rank"),
    (3, lambda o: o.update(rank=3), "rank"),
    (3, lambda o: o["args"].update(alloc=4), "args.alloc"),
    (3, lambda o: o["args"].update(alloc="0"), "args.alloc"),
    (3, lambda o: o.update(call="cuMemMap"), "call"),
    (3, lambda o: o.update(state=None), "state"),
    (3, lambda o: o["state"].update(phase="Running"), "state.phase"),
    (3, lambda o: o["state"].pop("grants"), "state.grants"),
    (3, lambda o: o["state"].update(va=1), "state.va"),
    (3, lambda o: o.update(t="soon"), "t ="),
    (5, lambda o: o["args"].update(mapping="both"), "args.mapping"),
    (5, lambda o: o["args"].update(devices="0,1"), "args.devices"),
])
def test_malformed_names_line_and_field(header, line, change, words) -> None:
    text = _mutate(header, line, change)
    with pytest.raises(TraceError) as exc:
        parse_trace(text, source="x.ndjson")
    assert exc.value.line == line
    assert f"x.ndjson:{line}:" in str(exc.value)
    assert words in str(exc.value)


def test_group_action_with_rank_is_malformed(header) -> None:
    objs = _lines(header)
    i = next(k for k, o in enumerate(objs) if o.get("action") == "Publish")
    objs[i]["rank"] = 0
    with pytest.raises(TraceError, match="must be null for group action Publish") as exc:
        parse_trace(_text(objs))
    assert exc.value.line == i + 1


@pytest.mark.parametrize("text, line, words", [
    ("", 1, "empty trace"),
    ('{"kind": "header"\n', 1, "not valid JSON"),
    ("[1, 2]\n", 1, "JSON object"),
])
def test_malformed_text(text, line, words) -> None:
    with pytest.raises(TraceError, match=words) as exc:
        parse_trace(text)
    assert exc.value.line == line


def test_blank_line_and_bad_json_in_the_middle(header) -> None:
    lines = reference_trace(header).to_lines()
    with pytest.raises(TraceError, match="blank line") as exc:
        parse_trace("\n".join(lines[:3] + [""] + lines[3:]))
    assert exc.value.line == 4
    with pytest.raises(TraceError, match="not valid JSON") as exc:
        parse_trace("\n".join(lines[:4] + [lines[4][:-3]] + lines[5:]))
    assert exc.value.line == 5


def test_missing_file(tmp_path: Path) -> None:
    with pytest.raises(TraceError, match="cannot read trace"):
        load_trace(tmp_path / "nope.ndjson")


# --- the fast reader (writer-format lines) --------------------------------------------------

def writer_line(o: dict) -> str:
    """One event dict in the exact shape kvgrant.runtime.trace writes (the format's
    one owner, kvgrant.traceformat), so parse_trace takes its fast path."""
    return format_event(o)


def writer_text(trace) -> str:
    lines = trace.to_lines()
    return "\n".join(lines[:1] + [writer_line(json.loads(x)) for x in lines[1:]]) + "\n"


def _both(text: str):
    """(fast reader result or error, detailed reader result or error)."""
    out = []
    for fn in (lambda: parse_trace(text, source="x.ndjson"),
               lambda: parse_trace_lines(text.split("\n")[:-1] if text.endswith("\n")
                                         else text.split("\n"), source="x.ndjson")):
        try:
            out.append(fn())
        except TraceError as err:
            out.append(err)
    return out


def test_writer_format_takes_the_fast_path_and_matches_the_detailed_reader(header) -> None:
    for t in (reference_trace(header), reference_trace(header, fail_at=7),
              reference_trace(header, fail_at=0)):
        fast, slow = _both(writer_text(t))
        assert fast.rows is not None and slow.rows is None
        assert fast.header == slow.header and len(fast.events) == len(slow.events)
        key = [(e.index, e.line, e.seq, e.rank, e.action, e.alloc, e.mapping, e.devices,
                e.call, e.result, dict(e.state), dict(e.raw)) for e in slow.events]
        assert [(e.index, e.line, e.seq, e.rank, e.action, e.alloc, e.mapping, e.devices,
                 e.call, e.result, dict(e.state), dict(e.raw)) for e in fast.events] == key
        assert [e.describe() for e in fast.events[-3:]] == [e.describe()
                                                            for e in slow.events[-3:]]


def _edit(header, fail_at: int | None, pick, change) -> tuple[str, int]:
    """Writer-format text with ``change`` applied to the first event ``pick`` selects;
    returns the text and that event's line."""
    objs = [json.loads(x) for x in reference_trace(header, fail_at=fail_at).to_lines()]
    i = next(k for k, o in enumerate(objs) if k and pick(o))
    change(objs[i])
    lines = [json.dumps(objs[0])] + [writer_line(o) for o in objs[1:]]
    return "\n".join(lines) + "\n", i + 1


def _is(action):
    return lambda o: o["action"] == action


@pytest.mark.parametrize("fail_at, pick, change, words", [
    (None, _is("Map"), lambda o: o.update(seq=9), "seq"),
    (None, _is("Map"), lambda o: o.update(rank=3), "rank"),
    (None, _is("Map"), lambda o: o.update(rank=None), "rank"),
    (None, _is("Publish"), lambda o: o.update(rank=0), "group action Publish"),
    (None, _is("Create"), lambda o: o.update(args={}), "args.alloc"),
    (None, _is("Release"), lambda o: o["args"].update(alloc=4), "args.alloc"),
    (None, _is("Grant"), lambda o: o["args"].pop("mapping"), "args.mapping"),
    (None, _is("Unmap"), lambda o: o["args"].pop("mapping"), "args.mapping"),
    (None, _is("Grant"), lambda o: o["args"].pop("devices"), "args.devices"),
    (None, _is("Grant"), lambda o: o["args"].update(devices=[1, 1]), "duplicate device"),
    (None, _is("MapAlias"), lambda o: o.update(call="cuMemCreate"), "call"),
    (None, _is("Free"), lambda o: o.update(state={"phase": "ShuttingDown"}), "state.va"),
    (3, _is("Abort"), lambda o: o["args"].update(failed_rank=3), "args.failed_rank"),
])
def test_writer_format_errors_match_the_detailed_reader(header, fail_at, pick, change,
                                                        words) -> None:
    text, line = _edit(header, fail_at, pick, change)
    fast, slow = _both(text)
    assert isinstance(slow, TraceError) and isinstance(fast, TraceError)
    assert fast.line == slow.line == line
    assert str(fast) == str(slow) and words in str(fast)


@pytest.mark.parametrize("edit, line", [
    (lambda ls: ls[:-1] + [ls[-1][:-2]], -1),          # truncated last line
    (lambda ls: ls[:5] + ["# note"] + ls[5:], 6),        # junk line in the middle
    (lambda ls: ls[:5] + [""] + ls[5:], 6),              # blank line
    (lambda ls: ls[:4] + [ls[4].replace('"kind": "event"', '"kind": "evnt"')] + ls[5:], 5),
])
def test_writer_format_text_errors_name_their_line(header, edit, line) -> None:
    lines = writer_text(reference_trace(header)).split("\n")[:-1]
    new = edit(lines)
    fast, slow = _both("\n".join(new) + "\n")
    want = len(new) if line == -1 else line
    assert isinstance(fast, TraceError) and fast.line == slow.line == want
    assert str(fast) == str(slow)


def test_other_json_spellings_still_parse(header) -> None:
    """CRLF line ends and no final newline leave the fast path but stay valid."""
    text = writer_text(reference_trace(header))
    for variant in (text.replace("\n", "\r\n"), text.rstrip("\n")):
        t = parse_trace(variant)
        assert len(t.events) == len(reference_trace(header).events)
    assert parse_trace(text.rstrip("\n")).rows is not None
    assert parse_trace(text.replace("\n", "\r\n")).rows is None


def test_runtime_writer_lines_take_the_fast_path(tmp_path: Path) -> None:
    """The regex follows kvgrant.runtime.trace's line format: a recorded sim trace (with
    a failed step, Abort and unwinding) is read by the fast path, same as in detail."""
    from kvgrant.errors import AllocationError
    from kvgrant.runtime.allocator import allocate
    from kvgrant.runtime.faults import Fault
    from kvgrant.runtime.sim import SimDriver

    small = Path(__file__).resolve().parents[2] / "examples/small.json"
    ranks = int(json.loads(small.read_text())["topology"]["ranks"])
    for i, faults in enumerate(([], [Fault(call="cuMemMap", nth=3)])):
        p = tmp_path / f"t{i}.ndjson"
        try:
            allocate(small, driver=SimDriver(devices=ranks, faults=faults), trace=p).release()
        except AllocationError:
            pass
        fast = load_trace(p)
        slow = parse_trace_lines(p.read_text().split("\n")[:-1])
        assert fast.rows is not None, "writer format changed: update trace_io._FAST_EVENT"
        assert [e.raw for e in fast.events] == [e.raw for e in slow.events]
        assert any(not e.ok for e in fast.events) == bool(faults)


# --- the format's one owner: any values the writer can write, both readers read back ----

from hypothesis import given, strategies as st  # noqa: E402

from kvgrant.traceformat import ACTIONS, GROUP_ACTIONS, PHASES  # noqa: E402

_U64 = st.integers(0, (1 << 64) - 1)
_NULL_OR_U64 = st.none() | _U64


@st.composite
def _event(draw, seq: int = 0) -> dict:
    action = draw(st.sampled_from(sorted(ACTIONS)))
    shape = ACTIONS[action]
    group = action in GROUP_ACTIONS
    args: dict = {}
    if "alloc" in shape.args:
        args["alloc"] = draw(st.integers(0, 3))
    if "mapping" in shape.args:
        args["mapping"] = draw(st.sampled_from(["plane", "alias"]))
    if "devices" in shape.args:
        args["devices"] = sorted(draw(st.sets(st.integers(0, 2), max_size=3)))
    if "failed_rank" in shape.args:
        args["failed_rank"] = draw(st.none() | st.integers(0, 2))
    state: dict = {"phase": draw(st.sampled_from(PHASES))}
    if not group:
        state.update(va=draw(st.booleans()), created=draw(st.integers(0, 9)),
                     mapped=draw(st.integers(0, 9)), alias_mapped=draw(st.integers(0, 9)),
                     grants=draw(_U64), ready=draw(st.booleans()), failed=draw(st.booleans()))
    return {"kind": "event", "seq": seq, "t": draw(st.floats(0, 1e6).map(lambda x: round(x, 6))),
            "rank": None if group else draw(st.integers(0, 2)), "action": action, "args": args,
            "call": shape.call, "result": None if shape.call is None else draw(
                st.sampled_from(["CUDA_SUCCESS", "CUDA_ERROR_OUT_OF_MEMORY"])),
            "device": None if group else draw(st.integers(0, 2)),
            # a field the action's shape leaves null stays null (the readers refuse it)
            **{k: draw(_NULL_OR_U64) if getattr(ACTIONS[action], k) else None
               for k in ("va", "size", "handle")},
            "_undo": action in ("Unmap", "Release", "Free"),
            "state": state}


@given(events=st.lists(_event(), min_size=1, max_size=8))
def test_any_written_line_is_read_back_by_both_readers(events) -> None:
    """format_event (the writer's line) -> the regex reader and the detailed reader give
    back every field: reader and writer come from one table and cannot drift."""
    for k, ev in enumerate(events):
        ev["seq"] = k
        if ev.pop("_undo") and ev["result"] != "CUDA_SUCCESS":
            for key in ("va", "size", "handle"):  # a failed undo names its object
                if getattr(ACTIONS[ev["action"]], key) and ev[key] is None:
                    ev[key] = 1 << 21
    from _conform_support import small_header

    head = json.loads(reference_trace(small_header()).to_lines()[0])
    for res in head["reservations"].values():
        res[0] = None  # (any events: a base needs its rank's successful Reserve)
    text = json.dumps(head) + "\n" + "\n".join(format_event(e) for e in events) + "\n"
    fast, slow = parse_trace(text), parse_trace_lines(text.splitlines())
    assert fast.rows is not None
    for ev, a, b in zip(events, fast.events, slow.events):
        for got in (a, b):
            assert (got.rank, got.action, dict(got.args), got.call, got.result, got.device,
                    got.va, got.size, got.handle, dict(got.state)) == (
                ev["rank"], ev["action"], ev["args"], ev["call"], ev["result"], ev["device"],
                ev["va"], ev["size"], ev["handle"], ev["state"])
