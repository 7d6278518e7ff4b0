"""Trace reading: valid traces parse, every malformed one names its line."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from kvgrant.conformance.mutants import reference_trace
from kvgrant.conformance.trace_io import load_trace, parse_trace
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
    assert back.events[1].action == "Create" and back.events[1].alloc == 0


def test_header_defaults(header) -> None:
    objs = _lines(header)
    del objs[0]["declared_readers"], objs[0]["devices"]
    t = parse_trace(_text(objs))
    assert t.header.declared_readers[2] == frozenset({2})
    assert t.header.declared_readers[0] == frozenset({0, 1})
    assert dict(t.header.devices) == {0: 0, 1: 1, 2: 2}


def _mutate(header, line: int, fn) -> str:
    objs = _lines(header)
    fn(objs[line - 1])
    return _text(objs)


@pytest.mark.parametrize("line, change, words", [
    (1, lambda o: o.update(kind="event"), "header"),
    (1, lambda o: o.update(version=2), "version"),
    (1, lambda o: o.update(ranks=0), "ranks"),
    (1, lambda o: o.update(allocs=0), "allocs"),
    (1, lambda o: o.update(aliased=[9]), "aliased"),
    (1, lambda o: o.update(owner_only=[0]), "owner_only"),
    (1, lambda o: o["importers"].update({"0": [0]}), "own memory"),
    (1, lambda o: o["importers"].update({"7": [0]}), "importers key"),
    (1, lambda o: o["declared_readers"].update({"0": [0]}), "declared reader"),
    (1, lambda o: o["devices"].update({"1": 0}), "share a device"),
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
