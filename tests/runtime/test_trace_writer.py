"""TraceWriter: NDJSON header + events, seq without gaps, off by default, env switch."""

from __future__ import annotations

import io
import json
import time
from pathlib import Path

import pytest

from kvgrant.errors import ArgumentError
from kvgrant.runtime.trace import (TRACE_ENV, TRACE_VERSION, TraceWriter, clock, event_template,
                                   open_trace)

STATE = {"phase": "Allocating", "va": True, "created": 1, "mapped": 0, "alias_mapped": 0,
         "grants": 0, "ready": False, "failed": False}


def test_header_then_events_as_ndjson(tmp_path: Path) -> None:
    path = tmp_path / "sub" / "t.ndjson"
    with TraceWriter(path) as tw:
        assert tw.enabled
        tw.header(ranks=2, allocs=3, aliased=[1])
        tw.event(0, "Reserve", {}, "cuMemAddressReserve", "CUDA_SUCCESS", STATE,
                 device=0, va=4096, size=8192)
        tw.event(None, "Publish", {}, None, None, {"phase": "Published"})
        assert tw.events == 2
    lines = path.read_text().splitlines()
    objs = [json.loads(x) for x in lines]
    assert objs[0] == {"kind": "header", "version": TRACE_VERSION, "ranks": 2, "allocs": 3,
                       "aliased": [1]}
    assert [o["seq"] for o in objs[1:]] == [0, 1]
    ev = objs[1]
    assert ev["kind"] == "event" and ev["rank"] == 0 and ev["action"] == "Reserve"
    assert ev["call"] == "cuMemAddressReserve" and ev["result"] == "CUDA_SUCCESS"
    assert (ev["device"], ev["va"], ev["size"]) == (0, 4096, 8192)
    assert ev["state"] == STATE and isinstance(ev["t"], float) and ev["t"] >= 0
    assert objs[2]["rank"] is None and objs[2]["call"] is None


def test_group_events_are_flushed_immediately() -> None:
    buf = io.StringIO()
    tw = TraceWriter(buf)
    tw.header(ranks=1)
    tw.event(None, "Abort", {"failed_rank": 0}, None, None, {"phase": "Aborting"})
    assert buf.getvalue().count("\n") == 2
    tw.close()
    assert not buf.closed  # a stream we did not open stays open


def test_disabled_writer_writes_nothing() -> None:
    tw = TraceWriter(None)
    assert not tw.enabled
    tw.header(ranks=1)
    tw.event(0, "Reserve", {}, None, None, STATE)
    assert tw.events == 0
    tw.close()
    tw.close()


def test_header_must_come_first_and_once() -> None:
    tw = TraceWriter(io.StringIO())
    tw.header(ranks=1)
    with pytest.raises(RuntimeError, match="header"):
        tw.header(ranks=1)


def test_open_trace_env_switch(tmp_path: Path) -> None:
    p = tmp_path / "env.ndjson"
    assert not open_trace(None, env={}).enabled
    tw = open_trace(None, env={TRACE_ENV: str(p)})
    assert tw.enabled and tw.path == p
    tw.close()
    explicit = tmp_path / "explicit.ndjson"
    tw2 = open_trace(explicit, env={TRACE_ENV: str(p)})
    assert tw2.path == explicit
    tw2.close()
    assert open_trace(tw2) is tw2


def test_event_template_lines_are_the_same_json_as_event() -> None:
    from kvgrant.runtime.trace import event_template

    a, b = io.StringIO(), io.StringIO()
    slow, fast = TraceWriter(a), TraceWriter(b)
    for tw in (slow, fast):
        tw.header(ranks=1)
    state = ('{"phase": "Allocating", "va": true, "created": %d, "mapped": %d, '
             '"alias_mapped": %d, "grants": %d, "ready": false, "failed": false}')
    tpl = event_template(0, "Grant", '{"alloc": %d, "mapping": "plane", "devices": [0, 1]}',
                         "cuMemSetAccess", "CUDA_SUCCESS", 0, "%d", "%d", "null", state)
    for k in range(3):
        slow.event(0, "Grant", {"alloc": k, "mapping": "plane", "devices": [0, 1]},
                   "cuMemSetAccess", "CUDA_SUCCESS",
                   {"phase": "Allocating", "va": True, "created": k + 1, "mapped": k + 1,
                    "alias_mapped": 0, "grants": 2 * k, "ready": False, "failed": False},
                   device=0, va=4096 * k, size=4096)
        fast.recorder()((tpl, clock(), k, 4096 * k, 4096, k + 1, k + 1, 0, 2 * k))
    slow.close()
    fast.close()

    def strip_t(text: str) -> list[dict]:
        out = [json.loads(x) for x in text.splitlines()]
        for o in out:
            o.pop("t", None)
        return out

    assert strip_t(a.getvalue()) == strip_t(b.getvalue())
    assert [o.get("seq") for o in strip_t(b.getvalue())] == [None, 0, 1, 2]


def test_rank_events_are_batched_until_a_group_event_or_close() -> None:
    buf = io.StringIO()
    tw = TraceWriter(buf)
    tw.header(ranks=1)
    tw.event(0, "Reserve", {}, "cuMemAddressReserve", "CUDA_SUCCESS", STATE, device=0)
    before = buf.getvalue().count("\n")
    tw.event(None, "Publish", {}, None, None, {"phase": "Published"})
    assert before <= 2 and buf.getvalue().count("\n") == 3  # group event drained both
    tw.event(0, "Free", {}, "cuMemAddressFree", "CUDA_SUCCESS", STATE, device=0)
    tw.close()
    assert buf.getvalue().count("\n") == 4


TPL = event_template(0, "Map", '{"alloc": %d}', "cuMemMap", "CUDA_SUCCESS", 0, "%d", "%d", "null",
                     '{"phase": "Allocating", "va": true, "created": %d, "mapped": %d, '
                     '"alias_mapped": %d, "grants": %d, "ready": false, "failed": false}')


def test_full_chunks_reach_the_file_without_a_flush(tmp_path: Path) -> None:
    """Between driver calls the producer ships every full chunk; the renderer writes
    it without anyone waiting, so a watcher sees it on file while the start-up goes on."""
    path = tmp_path / "live.ndjson"
    tw = TraceWriter(path, chunk=8)
    tw.header(ranks=1)
    record = tw.recorder()
    for k in range(20):
        record((TPL, clock(), k, 4096 * k, 4096, k + 1, k + 1, 0, 0))
        tw.ship_if_full()
    deadline = time.monotonic() + 10  # a hang limit, not a speed claim
    while path.read_text().count("\n") < 17 and time.monotonic() < deadline:
        time.sleep(0.005)
    lines = [json.loads(x) for x in path.read_text().splitlines()]
    assert [o.get("seq") for o in lines] == [None, *range(16)]  # two chunks of 8
    tw.close()
    assert path.read_text().count("\n") == 21


def test_seq_follows_call_order_across_recorded_and_group_events() -> None:
    buf = io.StringIO()
    tw = TraceWriter(buf)
    tw.header(ranks=1)
    record = tw.recorder()
    for k in range(100):
        record((TPL, clock(), k, 0, 4096, k + 1, k + 1, 0, 0))
        if k % 30 == 29:
            tw.event(None, "Abort", {"failed_rank": 0}, None, None, {"phase": "Aborting"})
    tw.close()
    objs = [json.loads(x) for x in buf.getvalue().splitlines()[1:]]
    assert [o["seq"] for o in objs] == list(range(103))
    assert [o["args"].get("alloc") for o in objs if o["rank"] is not None] == list(range(100))
    assert [i for i, o in enumerate(objs) if o["rank"] is None] == [30, 61, 92]
    ts = [o["t"] for o in objs]
    assert ts == sorted(ts) and ts[0] >= 0


def test_a_failing_stream_switches_the_writer_off_without_raising() -> None:
    class Broken(io.StringIO):
        def write(self, s: str) -> int:
            if '"kind": "event"' in s:
                raise OSError(28, "No space left on device")
            return super().write(s)

    buf = Broken()
    tw = TraceWriter(buf)
    tw.header(ranks=1)
    tw.recorder()((TPL, clock(), 0, 0, 4096, 1, 1, 0, 0))
    tw.event(None, "Publish", {}, None, None, {"phase": "Published"})  # waits, sees the error
    assert not tw.enabled
    assert isinstance(tw.error, OSError) and "No space" in str(tw.error)
    tw.close()
    tw.close()
    assert buf.getvalue().count("\n") == 1  # the header only


def test_an_unclosed_writer_finishes_its_file_when_collected(tmp_path) -> None:
    import gc

    tws = [TraceWriter(tmp_path / f"t{i}.ndjson") for i in range(3)]
    for tw in tws:
        tw.header(ranks=1)
        tw.recorder()((TPL, clock(), 0, 0, 4096, 1, 1, 0, 0))
    procs = [tw._sink.proc for tw in tws]  # type: ignore[union-attr]
    del tw, tws
    gc.collect()
    assert all(p.poll() is not None for p in procs)  # the renderer processes ended
    # each collected writer still wrote what it recorded and closed its file
    for i in range(3):
        objs = [json.loads(x) for x in (tmp_path / f"t{i}.ndjson").read_text().splitlines()]
        assert [o.get("seq") for o in objs] == [None, 0]


@pytest.mark.parametrize("renderer", ["process", "thread"])
def test_both_renderers_write_the_same_file(tmp_path: Path, renderer: str) -> None:
    path = tmp_path / f"{renderer}.ndjson"
    tw = TraceWriter(path, renderer=renderer)
    assert tw.renderer == renderer
    tw.header(ranks=1)
    record = tw.recorder()
    for k in range(50):
        record((TPL, clock(), k, 4096 * k, 4096, k + 1, k + 1, 0, 0))
    tw.event(None, "Publish", {}, None, None, {"phase": "Published"})
    assert tw.events == 51
    tw.close()
    objs = [json.loads(x) for x in path.read_text().splitlines()]
    assert objs[0]["kind"] == "header" and [o["seq"] for o in objs[1:]] == list(range(51))
    assert [o["va"] for o in objs[1:51]] == [4096 * k for k in range(50)]
    assert objs[-1]["action"] == "Publish"


def test_bad_renderer_is_refused() -> None:
    with pytest.raises(ArgumentError, match='renderer = "fork": must be'):
        TraceWriter(None, renderer="fork")


@pytest.mark.parametrize("chunk, shown", [(0, "0"), (-1, "-1"), (2.0, "2.0"), (True, "true")])
def test_bad_chunk_is_refused(chunk: object, shown: str) -> None:
    # an ArgumentError (a ValueError too), naming the argument as every other one does
    with pytest.raises(ArgumentError, match=f"chunk = {shown}.*: must be an integer >= 1"):
        TraceWriter(None, chunk=chunk)  # type: ignore[arg-type]


@pytest.mark.parametrize("target", [5, b"/tmp/t.ndjson", 2.5])
def test_a_target_that_is_no_path_or_stream_is_refused(target: object) -> None:
    with pytest.raises(ArgumentError, match="target = .*must be None, a file path, a text"):
        TraceWriter(target)  # type: ignore[arg-type]


def test_publish_ships_without_waiting_and_abort_waits(tmp_path: Path) -> None:
    """Publish only hands the records to the renderer (start-up must not wait for the
    formatting); Abort waits until every line is on file, since the unwinding after it
    may hang or crash."""
    shipped: list = []
    tw = TraceWriter(tmp_path / "t.ndjson")
    feed = tw._sink.feed  # type: ignore[union-attr]
    tw._sink.feed = lambda items: shipped.append(items) or feed(items)  # type: ignore
    tw.header(ranks=1)
    shipped.clear()
    tw.recorder()((TPL, clock(), 0, 0, 4096, 1, 1, 0, 0))
    tw.event(None, "Publish", {}, None, None, {"phase": "Published"})
    assert len(shipped) == 1 and all(x.__class__ is tuple for x in shipped[0])
    tw.event(None, "Abort", {"failed_rank": None}, None, None, {"phase": "Aborting"})
    assert shipped[-1][-1] == ["F"]  # a flush: acknowledged once on file
    assert (tmp_path / "t.ndjson").read_text().count("\n") == 4
    tw.close()


def test_a_dead_renderer_process_is_reported_not_waited_for(tmp_path: Path) -> None:
    tw = TraceWriter(tmp_path / "t.ndjson")
    tw.header(ranks=1)
    proc = tw._sink.proc  # type: ignore[union-attr]
    proc.kill()
    proc.wait()
    tw.recorder()((TPL, clock(), 0, 0, 4096, 1, 1, 0, 0))
    tw.event(None, "Publish", {}, None, None, {"phase": "Published"})  # must return
    assert not tw.enabled
    assert "renderer process exited" in str(tw.error)
    tw.close()


def test_a_full_disk_is_reported_by_the_renderer_process() -> None:
    if not Path("/dev/full").exists():
        pytest.skip("no /dev/full here")
    tw = TraceWriter("/dev/full")
    assert tw.renderer == "process"
    tw.header(ranks=1)
    assert not tw.enabled
    assert "No space left on device" in str(tw.error)
    tw.close()


def _lines_after_a_kill(code: str, path: Path, lines: int) -> list[dict]:
    """Run ``code`` (which writes a trace to ``path``) in a process, then end it with
    ``os._exit(9)``, like a segfault in the driver: no close, no atexit. Returns the
    trace's lines once the renderer process has written ``lines`` of them (or given
    up waiting)."""
    import subprocess
    import sys

    root = Path(__file__).resolve().parents[2]
    r = subprocess.run([sys.executable, "-c", code + "os._exit(9)\n"], cwd=root, timeout=60)
    assert r.returncode == 9
    deadline = time.monotonic() + 10
    while path.read_text().count("\n") < lines and time.monotonic() < deadline:
        time.sleep(0.01)
    return [json.loads(x) for x in path.read_text().splitlines()]


def test_lines_shipped_before_the_process_dies_are_kept(tmp_path: Path) -> None:
    """A process killed mid-allocation (no close, no flush) still leaves its trace up
    to the last shipped chunk: the renderer process writes what it got and exits. What
    the kill loses is what was not shipped yet (here 8 of 40 records)."""
    path = tmp_path / "killed.ndjson"
    code = f"""
import os, time
from kvgrant.runtime.trace import TraceWriter, clock, event_template
TPL = event_template(0, "Map", '{{"alloc": %d}}', "cuMemMap", "CUDA_SUCCESS", 0, "%d", "%d", "null",
                     '{{"created": %d, "mapped": %d, "alias_mapped": %d, "grants": %d}}')
tw = TraceWriter({str(path)!r}, chunk=16)
tw.header(ranks=1)
rec = tw.recorder()
for k in range(40):
    rec((TPL, clock(), k, 0, 4096, k + 1, k + 1, 0, 0))
    tw.ship_if_full()
"""
    objs = _lines_after_a_kill(code, path, 33)
    assert [o.get("seq") for o in objs] == [None, *range(32)]
    assert [o["state"]["created"] for o in objs[1:]] == list(range(1, 33))


def test_the_renderer_process_survives_a_ctrl_c_aimed_at_the_allocation(tmp_path: Path) -> None:
    """Ctrl-C sends SIGINT to the whole foreground process group; the renderer runs in
    its own session, so the unwinding after the KeyboardInterrupt is still traced."""
    import subprocess
    import sys

    path = tmp_path / "int.ndjson"
    code = f"""
import os, signal, sys, time
from kvgrant.runtime.trace import TraceWriter
tw = TraceWriter({str(path)!r})
tw.header(ranks=1)
try:
    os.killpg(os.getpgrp(), signal.SIGINT)  # what the terminal does on Ctrl-C
    # short sleeps, not signal.pause(): the SIGINT may be caught by another thread
    # before pause() starts, and pause() would then wait for a signal that never comes
    for _ in range(1200):
        time.sleep(0.05)
    sys.exit(4)
except KeyboardInterrupt:
    tw.event(None, "Abort", {{"failed_rank": None}}, None, None, {{"phase": "Aborting"}})
    tw.close()
    sys.exit(0 if tw.error is None else 3)
"""
    root = Path(__file__).resolve().parents[2]
    # a session of its own, so the SIGINT reaches only that child's group
    r = subprocess.run([sys.executable, "-c", code], cwd=root, timeout=60,
                       start_new_session=True)
    assert r.returncode == 0
    objs = [json.loads(x) for x in path.read_text().splitlines()]
    assert [o.get("action") for o in objs] == [None, "Abort"]


def test_no_renderer_process_falls_back_to_the_thread(tmp_path: Path, monkeypatch) -> None:
    import sys

    monkeypatch.setattr(sys, "executable", str(tmp_path / "no-such-python"))
    path = tmp_path / "fallback.ndjson"
    tw = TraceWriter(path)
    assert tw.renderer == "thread"
    tw.header(ranks=1)
    tw.recorder()((TPL, clock(), 0, 0, 4096, 1, 1, 0, 0))
    tw.close()
    assert tw.error is None
    assert [json.loads(x).get("seq") for x in path.read_text().splitlines()] == [None, 0]


# --- one owner of the format: writer and reader agree field for field -----------------------

def _one_of_each():
    """One (action, args, call, result, device, va, size, handle, state) per action of
    kvgrant.traceformat.ACTIONS, as the shape table says."""
    from kvgrant.traceformat import ACTIONS, GROUP_ACTIONS

    rank_state = {"phase": "Aborting", "va": True, "created": 3, "mapped": 2,
                  "alias_mapped": 1, "grants": 4, "ready": False, "failed": True}
    for action, shape in ACTIONS.items():
        group = action in GROUP_ACTIONS
        args = {"alloc": 2, "mapping": "alias", "devices": [0, 1], "failed_rank": 1}
        args = {k: args[k] for k in shape.args}
        yield (None if group else 1, action, args, shape.call,
               None if shape.call is None else "CUDA_ERROR_OUT_OF_MEMORY",
               None if group else 1, (1 << 40) + (2 << 20) if shape.va else None,
               (4 << 20) if shape.size else None, 77 if shape.handle else None,
               {"phase": "Aborting"} if group else rank_state)


def test_every_action_written_is_read_back_field_for_field() -> None:
    """For every action in the format's table, the line the writer formats (generic
    path), the line the engine's template formats (hot path) and format_event are the
    same bytes, and both readers (the regex fast path and the detailed one) give back
    every field. A change of format is one change in kvgrant.traceformat."""
    from kvgrant.conformance.mutants import make_header
    from kvgrant.conformance.trace_io import header_to_json, parse_trace, parse_trace_lines
    from kvgrant.traceformat import (ROW, event_template, format_event, state_template)

    head = header_to_json(make_header(2, 3, aliased=[2]))
    for res in head["reservations"].values():
        res[0] = None  # (one of each action, no Reserve kept: a base needs its Reserve)
    header = json.dumps(head)
    cases = list(_one_of_each())
    generic = io.StringIO()
    tw = TraceWriter(generic)
    tw.header(t0=clock(), **{k: v for k, v in json.loads(header).items()
                             if k not in ("kind", "version")})
    templated: list[str] = []
    for seq, (rank, action, args, call, result, device, va, size, handle, state) in \
            enumerate(cases):
        tw.event(rank, action, args, call, result, state, device=device, va=va, size=size,
                 handle=handle)
        ev = {"seq": seq, "t": 0.5, "rank": rank, "action": action, "args": args,
              "call": call, "result": result, "device": device, "va": va, "size": size,
              "handle": handle, "state": state}
        line = format_event(ev)
        if rank is not None:  # the engine's hot path: a template and a tuple
            tpl = event_template(
                rank, action, json.dumps(args).replace('"alloc": 2', '"alloc": %d'), call,
                result, device, "%d" if va is not None else "null",
                "%d" if size is not None else "null", "%d" if handle is not None else "null",
                state_template(state["phase"], state["va"], state["ready"], state["failed"]))
            values = [v for v in (args.get("alloc"), va, size, handle) if v is not None]
            values += [state[k] for k in ("created", "mapped", "alias_mapped", "grants")]
            assert tpl % (seq, 0.5, *values) == line + "\n", action
        templated.append(line)
    tw.close()
    written = generic.getvalue().splitlines()
    assert [json.loads(x) for x in written[1:]] == [
        {**json.loads(x), "t": json.loads(w)["t"]} for x, w in zip(templated, written[1:])]
    text = header + "\n" + "\n".join(templated) + "\n"
    fast, slow = parse_trace(text), parse_trace_lines(text.splitlines())
    assert fast.rows is not None, "the fast reader must take every line the writer writes"
    for k, (rank, action, args, call, result, device, va, size, handle, state) in \
            enumerate(cases):
        row = fast.rows[k]
        for ev in (fast.events[k], slow.events[k]):
            got = (ev.rank, ev.action, dict(ev.args), ev.call, ev.result, ev.device, ev.va,
                   ev.size, ev.handle, dict(ev.state))
            assert got == (rank, action, args, call, result, device, va, size, handle,
                           state), action
        assert row[ROW["action"]] == action and row[ROW["seq"]] == str(k)
        assert row[ROW["handle"]] == ("null" if handle is None else str(handle))
        assert row[ROW["va"]] == ("null" if va is None else str(va))


def _alloc_templates(rank: int) -> tuple[object, ...]:
    """A rank's allocation spec with the engine's line shapes (no alias regions)."""
    from kvgrant.runtime.trace import alloc_spec
    from kvgrant.traceformat import args_grant, state_template

    state = state_template("Allocating", True, False, False)
    create = event_template(rank, "Create", '{"alloc": %d}', "cuMemCreate", "CUDA_SUCCESS",
                            rank, "null", "%d", "%d", state)
    map_ = event_template(rank, "Map", '{"alloc": %d}', "cuMemMap", "CUDA_SUCCESS", rank,
                          "%d", "%d", "%d", state)
    grant = event_template(rank, "Grant", args_grant("plane", [rank]), "cuMemSetAccess",
                           "CUDA_SUCCESS", rank, "%d", "%d", "null", state)
    return alloc_spec(create, map_, "", grant, 1, [])


def test_allocation_entries_expand_to_their_events_with_each_events_counters(
        tmp_path: Path) -> None:
    """One entry per allocation stands for Create, Map and Grant; a partial entry (a step
    failed after ``done`` events) for its first ``done``; counters are each event's own."""
    from kvgrant.runtime.trace import ALLOC_ENTRY

    path = tmp_path / "e.ndjson"
    tw = TraceWriter(path, renderer="thread")
    tw.header(ranks=1)
    tw.define_allocs(0, _alloc_templates(0))
    entries = tw.alloc_entries(0)
    t = clock()
    entries += ALLOC_ENTRY.pack(0, 3, 0, 11, 4096, 0, 2048, 1, 1, 0, 1, t, t, t, 0.0, 0.0)
    entries += ALLOC_ENTRY.pack(0, 2, 1, 12, 8192, 0, 2048, 2, 2, 0, 1, t, t, 0.0, 0.0, 0.0)
    tw.close()
    objs = [json.loads(x) for x in path.read_text().splitlines()[1:]]
    got = [(o["seq"], o["action"], o["args"]["alloc"], o["va"], o["handle"],
            [o["state"][k] for k in ("created", "mapped", "alias_mapped", "grants")])
           for o in objs]
    assert got == [(0, "Create", 0, None, 11, [1, 0, 0, 0]), (1, "Map", 0, 4096, 11, [1, 1, 0, 0]),
                   (2, "Grant", 0, 4096, None, [1, 1, 0, 1]),
                   (3, "Create", 1, None, 12, [2, 1, 0, 1]), (4, "Map", 1, 8192, 12, [2, 2, 0, 1])]
    assert objs[2]["args"]["devices"] == [0]


def test_a_sigkill_loses_only_allocation_entries_not_yet_shipped(tmp_path: Path) -> None:
    """``ship_entries`` every ``entries_limit`` bytes: what was shipped is on file after
    the allocating process is killed, complete allocation by allocation."""
    path = tmp_path / "killed-entries.ndjson"
    code = f"""
import os
from kvgrant.runtime.trace import ALLOC_ENTRY, TraceWriter, clock
from tests.runtime.test_trace_writer import _alloc_templates
tw = TraceWriter({str(path)!r}, chunk=16)   # 3 allocations' entries per ship
tw.header(ranks=1)
tw.define_allocs(0, _alloc_templates(0))
entries = tw.alloc_entries(0)
for k in range(10):
    t = clock()
    entries += ALLOC_ENTRY.pack(0, 3, k, 100 + k, 4096 * k, 0, 4096, k + 1, k + 1, 0, k + 1,
                                t, t, t, 0.0, 0.0)
    if len(entries) >= tw.entries_limit:
        entries = tw.ship_entries(0)
"""
    objs = _lines_after_a_kill(code, path, 28)
    assert [o.get("seq") for o in objs] == [None, *range(27)]  # 9 of 10 allocations
    assert [o["args"]["alloc"] for o in objs[1:]] == [k for k in range(9) for _ in range(3)]
