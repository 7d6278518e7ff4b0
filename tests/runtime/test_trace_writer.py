"""TraceWriter: NDJSON header + events, seq without gaps, off by default, env switch."""

from __future__ import annotations

import io
import json
import threading
import time
from pathlib import Path

import pytest

from kvgrant.runtime import trace as trace_mod
from kvgrant.runtime.trace import TRACE_ENV, TraceWriter, clock, event_template, open_trace

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
    assert objs[0] == {"kind": "header", "version": 1, "ranks": 2, "allocs": 3, "aliased": [1]}
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
                         "cuMemSetAccess", "CUDA_SUCCESS", 0, "%d", "%d", state)
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


def test_flush_each_writes_every_line_at_once() -> None:
    buf = io.StringIO()
    tw = TraceWriter(buf, flush_each=True)
    tw.header(ranks=1)
    tw.event(0, "Reserve", {}, "cuMemAddressReserve", "CUDA_SUCCESS", STATE, device=0)
    assert buf.getvalue().count("\n") == 2
    tw.recorder()((TPL, clock(), 7, 4096, 4096, 1, 1, 0, 0))
    assert buf.getvalue().count("\n") == 3
    tw.close()


TPL = event_template(0, "Map", '{"alloc": %d}', "cuMemMap", "CUDA_SUCCESS", 0, "%d", "%d",
                     '{"phase": "Allocating", "va": true, "created": %d, "mapped": %d, '
                     '"alias_mapped": %d, "grants": %d, "ready": false, "failed": false}')


def test_recorded_events_reach_the_file_without_a_flush(tmp_path: Path) -> None:
    """As it happens: the writer thread picks records up by itself (no group event)."""
    path = tmp_path / "live.ndjson"
    tw = TraceWriter(path)
    tw.header(ranks=1)
    record = tw.recorder()
    for k in range(3):
        record((TPL, clock(), k, 4096 * k, 4096, k + 1, k + 1, 0, 0))
    deadline = time.monotonic() + 10
    while path.read_text().count("\n") < 4 and time.monotonic() < deadline:
        time.sleep(0.005)
    lines = [json.loads(x) for x in path.read_text().splitlines()]
    assert [o.get("seq") for o in lines] == [None, 0, 1, 2]
    assert [o["args"]["alloc"] for o in lines[1:]] == [0, 1, 2]
    tw.close()


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


def test_an_unclosed_writer_stops_its_thread_when_collected(tmp_path) -> None:
    import gc

    before = set(threading.enumerate())
    tws = [TraceWriter(tmp_path / f"t{i}.ndjson") for i in range(5)]
    for tw in tws:
        tw.header(ranks=1)
    ours = [t for t in threading.enumerate() if t not in before and t.name == "kvgrant-trace"]
    assert len(ours) == 5
    procs = [tw._sink.proc for tw in tws]  # type: ignore[union-attr]
    del tw, tws
    gc.collect()
    deadline = time.monotonic() + 5
    while any(t.is_alive() for t in ours) and time.monotonic() < deadline:
        time.sleep(0.01)
    assert not any(t.is_alive() for t in ours)
    assert all(p.poll() is not None for p in procs)  # the renderer processes ended too
    # the collected writer still closed its file with the header in it
    assert (tmp_path / "t4.ndjson").read_text().startswith('{"kind": "header"')


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
    with pytest.raises(ValueError, match="renderer = 'fork'"):
        TraceWriter(None, renderer="fork")


@pytest.mark.parametrize("latency", [0, -0.01, 2.0])
def test_bad_latency_is_refused(latency: float) -> None:
    with pytest.raises(ValueError, match=f"latency_s = {latency!r}: must be > 0"):
        TraceWriter(None, latency_s=latency)


def _counting(feed, batches: list):
    """``feed`` that also notes (thread name, batch size) of every batch."""
    def counting_feed(items: list) -> bool:
        batches.append((threading.current_thread().name, len(items)))
        return feed(items)
    return counting_feed


def test_the_writer_thread_takes_unpumped_records_once_per_latency() -> None:
    """Each wake of the writer can cost the producing thread a wait for the GIL, so a
    steady stream of records nobody pumps is taken in batches, one per ``latency_s``,
    not one batch per few records."""
    batches: list = []
    shipper = trace_mod._Shipper(_counting(lambda items: items[-1] == ["S"], batches))
    kick = threading.Event()
    writer = threading.Thread(target=trace_mod._poll, args=(shipper, kick, 0.05))
    writer.start()
    end = time.monotonic() + 0.5
    n = 0
    while time.monotonic() < end:  # about one record every 20 us, like a start-up
        shipper.buf.append((n,))
        n += 1
        time.sleep(0.00002)
    shipper.buf.append(["S"])
    kick.set()
    writer.join(5)
    assert sum(k for _, k in batches) == n + 1
    # 0.5 s at 50 ms: about 10 batches (plus the one the stop record kicked)
    assert 3 <= len(batches) <= 14, batches


def test_a_pumping_producer_ships_its_own_records_and_the_writer_thread_rests() -> None:
    """While the producer pumps, it ships once per ``latency_s`` itself and the writer
    thread only looks every ``STALL_S``; every record is shipped once, in order."""
    tw = TraceWriter(io.StringIO(), latency_s=0.02)
    batches: list = []
    shipper = tw._shipper
    shipper.feed = _counting(shipper.feed, batches)
    record, pump = tw.recorder(), tw.pump
    end = time.monotonic() + 0.5
    n = 0
    while time.monotonic() < end:
        record((TPL, clock(), n, 4096 * n, 4096, n + 1, n + 1, 0, 0))
        n += 1
        if not n % 4:
            pump()
        time.sleep(0.00002)
    tw.close()
    by_producer = [k for who, k in batches if who == threading.current_thread().name]
    by_writer = [k for who, k in batches if who == "kvgrant-trace"]
    assert sum(by_producer) + sum(by_writer) == n + 2  # and the flush and stop records
    # 0.5 s at 20 ms: about 25 pumps; the writer thread looks about every STALL_S
    assert len(by_producer) >= 10, batches
    assert len(by_writer) <= 0.5 / trace_mod.STALL_S + 3, batches
    lines = tw._sink.fh.getvalue().splitlines()  # type: ignore[union-attr]
    assert [json.loads(x)["seq"] for x in lines] == list(range(n))
    assert [json.loads(x)["args"]["alloc"] for x in lines] == list(range(n))


def test_lines_of_a_producer_stuck_after_pumping_reach_the_file(tmp_path: Path) -> None:
    """A producer that pumped and then sits in one long driver call (a hang) still gets
    the lines it recorded before the call out, from the writer thread, in about
    ``STALL_S``: what shows where it hangs."""
    path = tmp_path / "stuck.ndjson"
    tw = TraceWriter(path, latency_s=0.01)
    tw.header(ranks=1)
    record = tw.recorder()
    for k in range(40):  # pumping while records come
        record((TPL, clock(), k, 4096 * k, 4096, k + 1, k + 1, 0, 0))
        tw.pump()
        time.sleep(0.001)
    record((TPL, clock(), 40, 4096 * 40, 4096, 41, 41, 0, 0))  # then stuck
    t0 = time.monotonic()
    while path.read_text().count("\n") < 42 and time.monotonic() < t0 + 10:
        time.sleep(0.005)
    waited = time.monotonic() - t0
    lines = [json.loads(x) for x in path.read_text().splitlines()]
    assert [o["args"]["alloc"] for o in lines[1:]] == list(range(41))
    assert waited < 1.0, waited  # STALL_S is 0.1 s
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


def test_lines_shipped_before_the_process_dies_are_kept(tmp_path: Path) -> None:
    """A process killed mid-allocation (no close, no flush) still leaves its trace up
    to the last poll: the renderer process writes what it got and exits."""
    import subprocess
    import sys

    path = tmp_path / "killed.ndjson"
    code = f"""
import os, time
from kvgrant.runtime.trace import TraceWriter, clock, event_template
TPL = event_template(0, "Map", '{{"alloc": %d}}', "cuMemMap", "CUDA_SUCCESS", 0, "%d", "%d",
                     '{{"created": %d, "mapped": %d, "alias_mapped": %d, "grants": %d}}')
tw = TraceWriter({str(path)!r})
tw.header(ranks=1)
rec = tw.recorder()
for k in range(40):
    rec((TPL, clock(), k, 0, 4096, k + 1, k + 1, 0, 0))
time.sleep(0.3)  # a few polls
os._exit(9)  # like a segfault in the driver: no close, no atexit
"""
    root = Path(__file__).resolve().parents[2]
    r = subprocess.run([sys.executable, "-c", code], cwd=root, timeout=60)
    assert r.returncode == 9
    deadline = time.monotonic() + 10
    while path.read_text().count("\n") < 41 and time.monotonic() < deadline:
        time.sleep(0.01)
    objs = [json.loads(x) for x in path.read_text().splitlines()]
    assert [o.get("seq") for o in objs] == [None, *range(40)]
    assert [o["state"]["created"] for o in objs[1:]] == list(range(1, 41))


def test_the_renderer_process_survives_a_ctrl_c_aimed_at_the_allocation(tmp_path: Path) -> None:
    """Ctrl-C sends SIGINT to the whole foreground process group; the renderer runs in
    its own session, so the unwinding after the KeyboardInterrupt is still traced."""
    import subprocess
    import sys

    path = tmp_path / "int.ndjson"
    code = f"""
import os, signal, sys
from kvgrant.runtime.trace import TraceWriter
tw = TraceWriter({str(path)!r})
tw.header(ranks=1)
try:
    os.killpg(os.getpgrp(), signal.SIGINT)  # what the terminal does on Ctrl-C
    signal.pause()
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
