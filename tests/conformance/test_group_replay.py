"""Group traces (docs/group-trace.md) and the Python group engine: the reader, the
interleaving, valid groups accepted, every group mutant rejected at its event, and
``kvgrant conform`` on several files or a directory."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from hypothesis import given, settings, strategies as st

from kvgrant.conformance.group_gen import simulate_group, write_group
from kvgrant.conformance.group_io import load_group
from kvgrant.conformance.group_model import constants_from
from kvgrant.conformance.group_mutants import (GROUP_MUTATIONS, OBJECT_MUTATIONS, OBJECT_WORDS,
                                              group_mutants, parse_texts)
from kvgrant.conformance.group_replay import CRASH, replay_group, replay_group_files
from kvgrant.errors import TraceError

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "group"
# Version-2 traces derive importers from the plan's import groups (symmetric, as in every
# geometry). C3: ranks 0 and 1 import each other; rank 2 is a declared reader of all
# and imports nothing (the group's non-importer).
C2 = constants_from(2, 2, [0, 1], [1], {0: [1], 1: [0]})
C3 = constants_from(3, 2, [0, 1], [1], {0: [1], 1: [0], 2: []},
                    {r: [0, 1, 2] for r in range(3)})


def _write(tmp_path: Path, texts: list[str], name: str = "g") -> Path:
    d = tmp_path / name
    write_group(texts, d)
    return d


@pytest.mark.parametrize("case", sorted(p.name for p in FIXTURES.iterdir() if p.is_dir()))
def test_fixtures_are_accepted(case: str) -> None:
    v = replay_group_files([FIXTURES / case])
    assert v.accepted, v.summary()
    assert all(ph in ("Published", "Aborted", "Shutdown") or ph.startswith("crashed")
               for ph in v.final.values())


def test_owner_crash_fixture_names_the_dead_rank_missing() -> None:
    v = replay_group_files([FIXTURES / "2proc-owner-crashes"])
    assert v.final == {0: "crashed in Allocating", 1: "Aborted"}
    assert (0, CRASH) in v.order
    crash_at = v.order.index((0, CRASH))
    t = load_group([FIXTURES / "2proc-owner-crashes"])
    decide = next(k for k, row in enumerate(t.procs[1].rows) if row[0] == "Decide")
    assert crash_at < v.order.index((1, decide))  # the crash comes before the Decide


@pytest.mark.parametrize("kw", [
    {}, {"shutdown": False}, {"fail_at": {0: 0}}, {"fail_at": {1: 3}}, {"fail_at": {1: 20}},
    {"fail_at": {2: 8}}, {"crash_after": {0: 4}}, {"crash_after": {1: 20}},
    {"crash_after": {2: 0}}, {"fail_at": {1: 16}, "crash_after": {0: 30}}], ids=str)
def test_generated_groups_are_accepted(tmp_path: Path, kw: dict) -> None:
    v = replay_group_files([_write(tmp_path, simulate_group(C3, **kw))])
    assert v.accepted, v.summary()
    # the interleaving holds every event once, in each file's order
    seen: dict[int, list[int]] = {}
    for p, k in v.order:
        if k != CRASH:
            seen.setdefault(p, []).append(k)
    assert sum(map(len, seen.values())) == v.events
    assert all(ks == sorted(ks) for ks in seen.values())


def test_interleaving_puts_every_send_before_its_import(tmp_path: Path) -> None:
    t = load_group([_write(tmp_path, simulate_group(C3))])
    v = replay_group(t)
    where = {pk: i for i, pk in enumerate(v.order)}
    for i, pt in enumerate(t.procs):
        for k, (action, e, _, _) in enumerate(pt.rows):
            if action == "Import":
                send = next(j for j, row in enumerate(t.procs[e.owner].rows)
                            if row[0] == "Send" and row[1].alloc == e.alloc and row[1].to == i)
                assert where[(e.owner, send)] < where[(i, k)]


BASES = {"published": {}, "owner-fails": {"fail_at": {0: 3}},
         "importer-aborts": {"fail_at": {1: 17}}}


def _cases():
    for base, kw in BASES.items():
        for m in group_mutants(simulate_group(C3, **kw)):
            yield f"{base}/{m.name}", m


@pytest.mark.parametrize("label, m", list(_cases()), ids=[x for x, _ in _cases()])
def test_every_group_mutant_is_rejected_at_its_event(tmp_path: Path, label: str, m) -> None:
    v = replay_group_files([_write(tmp_path, m.texts)])
    assert not v.accepted, m.description
    assert (v.rank, v.index) == (m.rank, m.seq), (m.description, v.summary())
    assert v.event is not None and v.event["seq"] == m.seq
    assert v.state_before is not None and v.state_before["process"] is not None
    assert v.order[-1] == (m.rank, m.seq)


def test_every_mutation_applies_to_some_base() -> None:
    applied = {m.name for _, m in _cases()}
    assert applied == set(GROUP_MUTATIONS)
    assert len(OBJECT_MUTATIONS) >= 6 and set(OBJECT_MUTATIONS) <= applied


@pytest.mark.parametrize("label, m", [(x, m) for x, m in _cases() if m.name in OBJECT_WORDS],
                         ids=[x for x, m in _cases() if m.name in OBJECT_WORDS])
def test_object_mutants_are_rejected_naming_the_object(tmp_path: Path, label: str, m) -> None:
    """Object-identity mutants keep the order of steps: without the object checks the
    model would take them. The rejection is at the mutated event and names the object."""
    v = replay_group_files([_write(tmp_path, m.texts)])
    assert (v.rank, v.index) == (m.rank, m.seq), (m.description, v.summary())
    for word in OBJECT_WORDS[m.name]:
        assert word in v.reason, (word, v.reason)
    assert f"rank {m.rank}" in v.reason


def test_key_order_does_not_matter(tmp_path: Path) -> None:
    """Lines in another key order take the detailed reader and give the same verdicts."""
    texts = simulate_group(C3, fail_at={1: 16})
    heads, evs = parse_texts(texts)
    other = [json.dumps(heads[r], sort_keys=True) + "\n" + "".join(
        json.dumps(e, sort_keys=True) + "\n" for e in evs[r]) for r in range(3)]
    a = replay_group_files([_write(tmp_path, texts, "a")])
    b = replay_group_files([_write(tmp_path, other, "b")])
    assert a.accepted and b.accepted and a.order == b.order
    bad = group_mutants(other, ["grant_other_device"])[0]
    v = replay_group_files([_write(tmp_path, bad.texts, "c")])
    assert (v.rank, v.index) == (bad.rank, bad.seq)


def test_a_wrong_recorded_state_is_rejected_at_that_event(tmp_path: Path) -> None:
    heads, evs = parse_texts(simulate_group(C3))
    evs[1][5]["state"]["grants"] += 1
    d = tmp_path / "g"
    d.mkdir()
    for r in range(3):
        (d / f"rank{r}.ndjson").write_text("\n".join(
            [json.dumps(heads[r])] + [json.dumps(e) for e in evs[r]]) + "\n")
    v = replay_group_files([d])
    assert (v.rank, v.index) == (1, 5)
    assert "grants" in v.reason


def _files(tmp_path: Path, texts: list[str]) -> list[Path]:
    return write_group(texts, tmp_path / "m")


def test_reader_names_what_is_malformed(tmp_path: Path) -> None:
    files = _files(tmp_path, simulate_group(C2))
    with pytest.raises(TraceError, match="ranks \\[1\\] have no trace file"):
        load_group([files[0]])
    with pytest.raises(TraceError, match="has the same rank"):
        load_group([files[0], files[0]])
    head, *rest = files[1].read_text().splitlines()
    h = json.loads(head)
    h["regions"][1][3] = "importers"   # the owner-only region of file 0 made shared
    files[1].write_text("\n".join([json.dumps(h)] + rest) + "\n")
    with pytest.raises(TraceError, match="header.owner_only differs"):
        load_group(files)
    h["regions"][1][3] = "owner"
    h["reservations"]["0"][1] *= 2
    files[1].write_text("\n".join([json.dumps(h)] + rest) + "\n")
    with pytest.raises(TraceError, match=r"header.reservations\[0\].size = 0x2000000: must be "
                                         r"0x1000000 \(one slot"):
        load_group(files)
    h["reservations"]["0"][1] //= 2
    h["version"] = 1
    files[1].write_text("\n".join([json.dumps(h)] + rest) + "\n")
    with pytest.raises(TraceError, match="header.version = 1: a group trace must be version "
                                         "2 .*re-record"):
        load_group(files)
    h["version"], h["mode"] = 2, "process"
    files[1].write_text("\n".join([json.dumps(h)] + rest) + "\n")
    with pytest.raises(TraceError, match="mode"):
        load_group(files)
    h["mode"] = "group"
    ev = json.loads(rest[3])
    ev["args"] = {"alloc": 7}
    files[1].write_text("\n".join([json.dumps(h)] + rest[:3] + [json.dumps(ev)] + rest[4:])
                        + "\n")
    with pytest.raises(TraceError, match="args.alloc = 7") as err:
        load_group(files)
    assert err.value.line == 5
    ev["args"], ev["rank"] = {"alloc": 1}, 0
    files[1].write_text("\n".join([json.dumps(h)] + rest[:3] + [json.dumps(ev)] + rest[4:])
                        + "\n")
    with pytest.raises(TraceError, match="rank = 0"):
        load_group(files)
    ev["rank"], ev["va"] = 1, -5
    files[1].write_text("\n".join([json.dumps(h)] + rest[:3] + [json.dumps(ev)] + rest[4:])
                        + "\n")
    with pytest.raises(TraceError, match="va = -5: must be an integer >= 0 or null") as err:
        load_group(files)
    assert err.value.line == 5


def test_cli_accepts_a_directory_and_files(tmp_path: Path, capsys) -> None:
    from kvgrant.cli import main

    d = _write(tmp_path, simulate_group(C3, crash_after={1: 9}))
    assert main(["conform", str(d)]) == 0
    assert "accepted by python: 3 processes" in capsys.readouterr().out
    files = sorted(str(p) for p in d.iterdir())
    assert main(["conform", *files, "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["mode"] == "group" and out["accepted"] and out["verdicts"][0]["final"]["1"] \
        == "crashed in Allocating"
    assert (out["ok"], out["exit_status"]) == (True, 0)
    bad = group_mutants(simulate_group(C3), ["publish_while_abort", "send_to_non_importer"])[0]
    d2 = _write(tmp_path, bad.texts, "bad")
    assert main(["conform", str(d2)]) == 1
    out_text = capsys.readouterr().out
    assert f"seq {bad.seq}" in out_text and f"rank {bad.rank}" in out_text
    # with --json: the fields every kvgrant failure document has (review 2026-12-07)
    assert main(["conform", str(d2), "--json"]) == 1
    out = json.loads(capsys.readouterr().out)
    assert (out["ok"], out["kind"], out["exit_status"], out["accepted"]) == (
        False, "Rejected", 1, False)
    assert f"seq {bad.seq}" in out["message"] and f"rank {bad.rank}" in out["message"]
    assert main(["conform", files[0]]) == 2  # one file of a group of three
    assert "have no trace file" in capsys.readouterr().err


@pytest.mark.parametrize("mod", ["group_model", "group_io", "group_objects", "group_replay",
                                 "group_gen", "group_mutants", "group_check", "group_fast"])
def test_group_modules_pin_their_public_names(mod: str) -> None:
    import importlib

    m = importlib.import_module(f"kvgrant.conformance.{mod}")
    assert m.__all__ == sorted(m.__all__)
    assert all(hasattr(m, name) for name in m.__all__)


def test_generator_fails_and_crashes_where_asked() -> None:
    heads, evs = parse_texts(simulate_group(C3, fail_at={1: 2}, crash_after={2: 5}))
    fails = [e for e in evs[1] if e["result"] not in (None, "CUDA_SUCCESS", "SUCCESS")]
    assert [e["action"] for e in fails] == ["Map"] and fails[0]["seq"] == 2
    assert fails[0]["va"] == heads[1]["reservations"]["1"][0] and fails[0]["handle"] is None
    assert len(evs[2]) == 5
    decide = next(e for e in evs[0] if e["action"] == "Decide")
    # rank 0 imports from rank 1, which failed before sending: rank 0's Import gives up
    assert decide["args"] == {"decision": "abort", "failed": [0, 1], "missing": [2]}


def test_fast_steps_give_the_same_verdicts(tmp_path: Path) -> None:
    """FAST_STEPS (the hot path) and step() agree on valid groups and every mutant."""
    groups = [simulate_group(C3, **kw) for kw in BASES.values()]
    groups += [simulate_group(C3, crash_after={1: 20}), simulate_group(C2)]
    groups += [m.texts for _, m in _cases()]
    for i, texts in enumerate(groups):
        t = load_group([_write(tmp_path, texts, f"g{i}")])
        a, b = replay_group(t), replay_group(t, fast=False)
        assert (a.accepted, a.rank, a.index, a.reason, a.order, a.state_before, a.enabled) \
            == (b.accepted, b.rank, b.index, b.reason, b.order, b.state_before, b.enabled)


# --- the fast path (conformance/group_fast.py) ----------------------------------------------

C4 = constants_from(4, 5, [0, 2, 3], [2], {0: [1, 3], 1: [0, 3], 2: [], 3: [0, 1]})
C4_NO_ALIAS = constants_from(4, 3, [], [], {0: [1], 1: [0], 2: [3], 3: [2]})
CLEAN = [(C2, {}), (C2, {"shutdown": False}), (C3, {}), (C3, {"shutdown": False}),
         (C4, {}), (C4, {"shutdown": False}), (C4, {"devices": {0: 0, 1: 0, 2: 0, 3: 0}}),
         (C4_NO_ALIAS, {"devices": {0: 3, 1: 2, 2: 1, 3: 0}})]


@pytest.mark.parametrize("c, kw", CLEAN, ids=[f"{c.ranks}r-{kw}" for c, kw in CLEAN])
def test_fast_path_accepts_clean_groups_as_the_replay_does(tmp_path: Path, c, kw) -> None:
    """A group the fast path accepts is accepted by the full replay, with the same
    interleaving (TLC replays it), events and final phases."""
    from kvgrant.conformance.group_fast import fast_accept

    d = _write(tmp_path, simulate_group(c, **kw))
    fast = fast_accept([d])
    full = replay_group(load_group([d]))
    assert fast is not None and full.accepted
    assert (fast.order, fast.events, fast.final) == (full.order, full.events, full.final)


def test_fast_path_in_worker_processes_gives_the_same_verdict(tmp_path: Path) -> None:
    from kvgrant.conformance.group_fast import fast_accept

    d = _write(tmp_path, simulate_group(C4))
    one, two = fast_accept([d]), fast_accept([d], jobs=2)
    assert one is not None and two is not None
    assert (one.order, one.events, one.final) == (two.order, two.events, two.final)
    bad = _write(tmp_path, simulate_group(C4, fail_at={1: 3}), "bad")
    assert fast_accept([bad], jobs=2) is None


def test_fast_path_accepts_the_h200_group_trace(tmp_path: Path) -> None:
    from kvgrant.conformance.group_fast import fast_accept
    from tests.conformance.test_h200_group_trace import h200_group_dir

    d = h200_group_dir(tmp_path)   # skips while the fixture is an old version
    fast = fast_accept([d])
    assert fast is not None and fast.events > 40_000
    assert fast.order == replay_group(load_group([d])).order


def test_fast_path_leaves_everything_else_to_the_replay(tmp_path: Path) -> None:
    """Failures, crashes, other key orders and every mutant get None: the replay judges
    them, so each rejection names the event it named without the fast path."""
    from kvgrant.conformance.group_fast import fast_accept

    texts = simulate_group(C3)
    heads, evs = parse_texts(texts)
    sorted_keys = [json.dumps(heads[r], sort_keys=True) + "\n" + "".join(
        json.dumps(e, sort_keys=True) + "\n" for e in evs[r]) for r in range(3)]
    others = [simulate_group(C3, fail_at={1: 3}), simulate_group(C3, crash_after={2: 9}),
              sorted_keys, [t.replace('"t": 0.000000', '"t": 00.000000', 1) for t in texts]]
    others += [m.texts for _, m in _cases()]
    for i, group in enumerate(others):
        assert fast_accept([_write(tmp_path, group, f"o{i}")]) is None, i
    assert fast_accept([tmp_path / "missing"]) is None


# --- the format has one owner (kvgrant.traceformat) -----------------------------------------

def _group_cases():
    """One event of every group action, as runtime/group.py's _GroupRun.ev gets them."""
    from kvgrant.conformance.group_model import UNDO_STEPS
    from kvgrant.traceformat import GROUP_SHAPES

    vals = {"owner": 0, "alloc": 1, "mapping": "alias", "devices": [5], "to": 0,
            "ready": False, "error": "boom", "decision": "abort", "failed": [1],
            "missing": [2]}
    for action, shape in GROUP_SHAPES.items():
        args = {k: vals[k] for k in shape.args}
        ok = "SUCCESS" if action in ("Send", "Vote") else "CUDA_SUCCESS"
        objs = ((1 << 44) + (6 << 21) if shape.va else None,
                (2 << 21) if shape.size else None, 4242 if shape.handle else None)
        yield (action, args, shape.call, None if shape.call is None else ok, *objs)
        if shape.call is not None and action not in ("Send", "Vote"):  # a failed call
            # (a failed forward step may name nothing; a failed undo names its object)
            yield (action, args, shape.call, "CUDA_ERROR_OUT_OF_MEMORY",
                   *(objs if action in UNDO_STEPS else (None, None, None)))


def test_every_group_action_written_is_read_back_field_for_field() -> None:
    """For every action of kvgrant.traceformat.GROUP_SHAPES, the line runtime/group.py's
    writing path (_GroupRun.ev -> TraceWriter) writes is format_group_event's line, and
    both group readers (group_io's regex fast path, the one group_fast uses too, and the
    detailed reader) give back every field. A change of format is one change there."""
    import io
    import re
    from types import SimpleNamespace

    from kvgrant.conformance.group_gen import group_header
    from kvgrant.conformance.group_io import parse_proc_trace
    from kvgrant.runtime.group import _GroupRun, _State
    from kvgrant.runtime.trace import TraceWriter
    from kvgrant.traceformat import GROUP_FAST_EVENT, GROUP_ROW, GROUP_VERSION, format_group_event

    head = group_header(C3, 1, devices={0: 4, 1: 5, 2: 6})
    buf = io.StringIO()
    tw = TraceWriter(buf)
    tw.header(version=GROUP_VERSION, **{k: v for k, v in head.items()
                                        if k not in ("kind", "version")})
    run = SimpleNamespace(trace=tw, rank=1, device=5, _head=None, phase="Aborting",
                          st=_State(va=True, created=2, mapped=1, alias_mapped=1, grants=3,
                                    ready=False, failed=True, exported=2, sent=1, imported=1,
                                    import_mapped=2, import_grants=1))
    run.state = lambda: _GroupRun.state(run)  # type: ignore[attr-defined]
    cases = list(_group_cases())
    for action, args, call, result, va, size, handle in cases:
        _GroupRun.ev(run, action, args, call, result, va, size, handle)  # type: ignore[arg-type]
    tw.close()
    text = buf.getvalue()
    lines = text.splitlines()
    state = _GroupRun.state(run)  # type: ignore[arg-type]
    no_t = re.compile(r'"t": [^,]*, ')
    for k, (action, args, call, result, va, size, handle) in enumerate(cases):
        ev = {"seq": k, "rank": 1, "action": action, "args": args, "call": call,
              "result": result, "device": 5, "va": va, "size": size, "handle": handle,
              "state": state}
        assert no_t.sub("", lines[k + 1]) == no_t.sub("", format_group_event(ev)), action
    assert len(GROUP_FAST_EVENT.findall(text)) == len(cases), "the fast reader takes every line"
    fast = parse_proc_trace(text, "w")
    heads, evs = parse_texts([text])
    slow_text = json.dumps(heads[0], sort_keys=True) + "\n" + "".join(
        json.dumps(e, sort_keys=True) + "\n" for e in evs[0])
    assert not GROUP_FAST_EVENT.findall(slow_text)   # other key order: the detailed reader
    slow = parse_proc_trace(slow_text, "s")
    dev_rank = {4: 0, 5: 1, 6: 2}
    for k, (action, args, call, result, va, size, handle) in enumerate(cases):
        m = GROUP_FAST_EVENT.match(lines[k + 1])
        assert m is not None and m.group(GROUP_ROW["action"] + 1) == action
        for pt in (fast, slow):
            r_action, e, r_result, r_state = pt.rows[k]
            if isinstance(r_state, str):
                r_state = json.loads("{" + r_state + "}")
            got = {f: getattr(e, f) for f in e._fields if getattr(e, f) is not None}
            want = {f: v for f, v in args.items() if f != "error"}
            if "devices" in want:
                want["devices"] = frozenset(dev_rank[d] for d in want["devices"])
            for f in ("failed", "missing"):
                if f in want:
                    want[f] = frozenset(want[f])
            assert (r_action, got, r_result, r_state, pt.objs[k]) == \
                (action, want, result, state, (5, va, size, handle)), (pt.source, action)
            assert pt.raw_event(k)["args"] == args and pt.raw_event(k)["call"] == call


def test_a_folder_with_a_one_process_trace_says_to_pass_the_file(tmp_path: Path) -> None:
    """A folder is read as a process group; a one-process trace in it used to get only
    "header.mode = None: a group trace has mode 'group'"."""
    root = Path(__file__).resolve().parents[1]
    one = tmp_path / "one.ndjson"
    one.write_text((root / "fixtures" / "h200" / "small-packed-2rank.ndjson").read_text())
    with pytest.raises(TraceError, match="give a one-process trace as a file"):
        load_group([tmp_path])


_GROUP_EDITS = {"va": (None, 1 << 21, -(1 << 21)), "size": (None, 1 << 21, -(1 << 21)),
                "handle": (None, 1, 99), "device": (None, 1, 7)}
_EDITED_GROUPS = {"C3": (C3, {}), "C3-published": (C3, {"shutdown": False}), "C4": (C4, {}),
                  "C3-fails-early": (C3, {"fail_at": {1: 3}}),
                  "C3-fails-late": (C3, {"fail_at": {1: 20}}),
                  "C3-crash": (C3, {"fail_at": {1: 16}, "crash_after": {0: 30}})}


@settings(max_examples=300, deadline=None)
@given(group=st.sampled_from(sorted(_EDITED_GROUPS)), pick=st.integers(0, 10 ** 6),
       edits=st.dictionaries(st.sampled_from(sorted(_GROUP_EDITS)), st.integers(0, 2),
                             min_size=1, max_size=3))
def test_the_fast_path_accepts_an_edited_group_only_where_the_replay_does(
        group: str, pick: int, edits: dict[str, int]) -> None:
    """Both hot paths judge an edit of one event's objects as the plain replay does:
    group_fast.fast_accept (which compares text with the clean run it renders) accepts
    only what the replay accepts, and FAST_STEPS gives the replay's verdict (the
    one-process row replay once kept a hole its event replay had closed)."""
    import tempfile

    from kvgrant.conformance.group_fast import fast_accept_texts
    from kvgrant.conformance.group_mutants import to_texts

    c, kw = _EDITED_GROUPS[group]
    heads, evs = parse_texts(simulate_group(c, **kw))
    rank_events = [(r, k) for r in range(len(evs)) for k in range(len(evs[r]))]
    r, k = rank_events[pick % len(rank_events)]
    ev = evs[r][k]
    for field, choice in edits.items():
        edit = _GROUP_EDITS[field][choice]
        ev[field] = None if edit is None else (
            edit if field in ("handle", "device") else (ev[field] or 0) + edit)
    texts = to_texts(heads, evs)
    fast = fast_accept_texts((f"rank{p}.ndjson", t) for p, t in enumerate(texts))
    with tempfile.TemporaryDirectory() as d:
        write_group(texts, Path(d) / "g")
        try:
            t = load_group([Path(d) / "g"])
        except TraceError:  # malformed: the reader refuses it, the fast path must too
            assert fast is None
            return
    full, stepped = replay_group(t, fast=False), replay_group(t)
    assert (stepped.accepted, stepped.rank, stepped.index, stepped.reason, stepped.order,
            stepped.state_before, stepped.enabled) == \
        (full.accepted, full.rank, full.index, full.reason, full.order, full.state_before,
         full.enabled)
    if fast is not None:
        assert full.accepted and fast.order == full.order, full.summary()
