"""Ctrl-C (SIGINT) during the group runtime's start-up (allocate_rank).

In this process: a one-rank group on an in-memory store, a SIGINT after every driver
call of its start-up. Across processes (tests/runtime/_group_worker.py, scenario
``sigint``): a group of two, a SIGINT after every driver call of either rank and of
both at once (what a terminal does). Every process must unwind everything it made, the
interrupted ones must raise KeyboardInterrupt, the others GroupError naming them, and
the group's traces must be a behaviour of the group model.
"""

from __future__ import annotations

import importlib.util
import json
import os
import signal
from pathlib import Path
from types import FrameType
from typing import Any

import pytest

from kvgrant.conformance.group_check import check_group as model_check
from kvgrant.errors import GroupError
from kvgrant.layout.geometry import parse_geometry
from kvgrant.runtime.group import allocate_rank
from kvgrant.runtime.sim import SimDriver

from tests.runtime._group_traces import check_group
from tests.runtime._sigint import SigintSim
from tests.runtime.test_options import ONE_RANK, _Store

# one plane of 2 G with one aliased G, two ranks that import each other
TINY = {"name": "tiny", "granularity": 2 << 20, "pages": 4, "page_tokens": 16,
        "planes": [{"name": "a", "bytes_per_page": 1 << 20}],
        "regions": [{"name": "snapshot", "rows": 1, "row_bytes": 2 << 20}],
        "aliases": [{"region": "snapshot", "offset": 0, "plane": "a", "plane_offset": 0,
                     "length": 2 << 20}],
        "topology": {"ranks": 2, "import_groups": [[0, 1]]}}

def _events(path: Path) -> list[dict[str, Any]]:
    return [json.loads(x) for x in path.read_text().splitlines()[1:]]


def _one_rank(drv: SimDriver, trace: Path | None) -> Any:
    return allocate_rank(parse_geometry(ONE_RANK), 0, store=_Store(), driver=drv, trace=trace, timeout_s=10)


def test_a_ctrl_c_after_any_driver_call_of_a_one_rank_group_unwinds_and_conforms(
        tmp_path: Path) -> None:
    """The first SIGINT waits for an allocation boundary: the step that does not happen
    is a failed step (KeyboardInterrupt), the rank votes failed, the group aborts, nothing
    is left and the trace conforms; after the last allocation began the rank publishes,
    then shuts down. Either way the caller gets KeyboardInterrupt."""
    clean = SigintSim(None, devices=1)
    pub = _one_rank(clean, None)
    n = sum(clean.calls.values())   # the start-up's calls, not the release's
    pub.release()
    assert n > 10
    outcomes = set()
    for k in range(1, n + 1):
        drv = SigintSim(k, devices=1)
        trace = tmp_path / f"k{k}.ndjson"
        with pytest.raises(KeyboardInterrupt) as info:
            _one_rank(drv, trace)
        assert drv.live().is_empty(), (k, drv.live())
        assert drv.open_shareables() == 0 and not any(drv._used), k
        assert signal.getsignal(signal.SIGINT) is signal.default_int_handler
        events = _events(trace)
        actions = [e["action"] for e in events]
        if "Publish" in actions:   # the SIGINT came after the last allocation began
            assert actions[-1] == "ShutdownComplete", (k, actions[-4:])
            outcomes.add("shutdown")
        else:
            assert "Abort" in actions and actions[-1] == "AbortComplete", (k, actions[-4:])
            (stopped,) = [e for e in events if e["result"] == "KeyboardInterrupt"]
            assert stopped["state"]["failed"], k
            assert isinstance(info.value.__cause__, GroupError), k
            assert "interrupted (Ctrl-C)" in str(info.value.__cause__), k
            outcomes.add("abort")
        verdict = model_check([trace])[0]
        assert verdict.accepted, (k, verdict.summary())
    assert outcomes == {"abort", "shutdown"}


def test_a_second_ctrl_c_raises_at_once_and_the_handler_is_restored(tmp_path: Path) -> None:
    """Two SIGINTs: the second is not held back (a driver call that hangs must stay
    interruptible); Python's own handler is back afterwards."""
    drv = SigintSim(5, count=2, devices=1)
    with pytest.raises(KeyboardInterrupt):
        _one_rank(drv, tmp_path / "t.ndjson")
    undo = ("cuMemUnmap", "cuMemRelease", "cuMemAddressFree")
    forward = sum(v for c, v in drv.calls.items() if c not in undo)
    assert forward == 5                       # raised right after the 5th call
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler


def test_a_handler_the_program_installed_is_left_alone(tmp_path: Path) -> None:
    """With its own SIGINT handler the program decides: nothing is held back, the
    handler sees the signal, the group publishes and the handler is still installed."""
    seen: list[int] = []

    def mine(signum: int, frame: FrameType | None) -> None:
        seen.append(signum)

    before = signal.signal(signal.SIGINT, mine)
    try:
        drv = SigintSim(8, devices=1)
        pub = _one_rank(drv, tmp_path / "t.ndjson")
        pub.release()
        assert seen == [signal.SIGINT]
        assert signal.getsignal(signal.SIGINT) is mine
    finally:
        signal.signal(signal.SIGINT, before)
    assert drv.live().is_empty()


def test_a_ctrl_c_before_the_hello_starts_nobody(tmp_path: Path) -> None:
    """A SIGINT while the rank plans (before its hello is written) is the rank's hello
    error: every rank refuses alike before any driver call, this one raises it."""
    from kvgrant.layout.plans import make_plan

    def plan(g: Any) -> Any:
        os.kill(os.getpid(), signal.SIGINT)
        return make_plan(g, "packed")

    drv = SigintSim(None, devices=1)
    with pytest.raises(KeyboardInterrupt) as info:
        allocate_rank(parse_geometry(ONE_RANK), 0, store=_Store(), driver=drv,
                      trace=tmp_path / "t.ndjson", timeout_s=10, plan=plan)
    assert isinstance(info.value.__cause__, GroupError)
    assert "interrupted (Ctrl-C) before the group started" in str(info.value.__cause__)
    assert sum(drv.calls.values()) == 0 and drv.live().is_empty()


class _SigintStore(_Store):
    """In-memory store whose ``check`` (the gathers' look) sends this process a SIGINT
    at its calls named in ``at``."""

    def __init__(self, at: set[int]) -> None:
        super().__init__()
        self.at, self.checks = at, 0

    def check(self, keys: list[str]) -> bool:
        self.checks += 1
        if self.checks in self.at:
            os.kill(os.getpid(), signal.SIGINT)
        return super().check(keys)


def test_a_second_ctrl_c_while_the_hello_waits_tells_the_group() -> None:
    """Rank 0 of two waits in the hello for rank 1 (which never comes): the first SIGINT
    is held back, the second raises at once, and the abort decision names rank 0, so no
    peer waits for it until the deadline."""
    store = _SigintStore({3, 4})
    drv = SigintSim(None, devices=2)
    g = parse_geometry(TINY)
    with pytest.raises(KeyboardInterrupt):
        allocate_rank(g, 0, store=store, driver=drv, timeout_s=60)
    decision = json.loads(store.get("kvgrant/1/decision"))
    assert decision["decision"] == "abort" and [r for r, *_ in decision["failed"]] == [0]
    assert sum(drv.calls.values()) == 0
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler


# ------------------------------------------------------------------ real processes
needs_torch = pytest.mark.skipif(importlib.util.find_spec("torch") is None,
                                 reason="the group runtime needs torch")


@needs_torch
def test_a_ctrl_c_after_any_driver_call_of_a_two_process_group(tmp_path: Path) -> None:
    """SIGINT after every driver call of rank 0, of rank 1, and of both (a terminal's
    Ctrl-C reaches every process of its group): the interrupted processes raise
    KeyboardInterrupt, the others GroupError naming them (or, after the last
    allocation began, the group publishes and the interrupted ones shut down); every
    process unwinds everything and the two traces together conform."""
    from tests.runtime.test_group_sim import run_group, unwound

    sets = [[0], [1], [0, 1]]
    recs = run_group(tmp_path, TINY, scenario="sigint", sigint_sets=sets)
    for rec in recs:
        assert rec["clean"]["ok"]
        unwound(rec, rec["clean"])
    by_rank = [{(tuple(a["sigint"]), a["k"]): a for a in rec["attempts"]} for rec in recs]
    keys = sorted(by_rank[0])
    assert keys == sorted(by_rank[1])
    calls = [rec["clean"]["calls"] for rec in recs]
    for s in sets:
        assert len([k for k in keys if list(k[0]) == s]) == min(calls[r] for r in s)
    outcomes = set()
    for who, k in keys:
        res = [by_rank[r][(who, k)] for r in (0, 1)]
        paths = [tmp_path / f"s{''.join(map(str, who))}-k{k}-rank{r}.ndjson" for r in (0, 1)]
        published = any(e["action"] == "Publish" for p in paths for e in _events(p))
        for r in (0, 1):
            a = res[r]
            unwound(recs[r], a)
            if r in who:
                assert a["kind"] == "KeyboardInterrupt", (who, k, r, a)
            elif published:
                assert a["ok"], (who, k, r, a)
            else:
                assert a["kind"] == "GroupError", (who, k, r, a)
                assert set(a["failed"]) & set(who), (who, k, r, a["error"])
                assert "interrupted (Ctrl-C)" in a["error"], (who, k, r, a["error"])
        outcomes.add("published" if published else "aborted")
        assert check_group(paths) == ("publish" if published else "abort"), (who, k)
    assert outcomes == {"published", "aborted"}
