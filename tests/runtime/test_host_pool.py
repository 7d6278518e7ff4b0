"""Several real processes on one simulated host: the shared handle pool and the ledger.

Each test starts kvgrant processes (``_ledger_worker.py``) that share one ledger file
and one sim pool file in a temporary folder; every process ends with its test (a
timeout, then kill). The figures they reproduce are the H200's (docs/drivers.md): one
pool per host, so the grants of all processes together stop at the budget.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any, Iterator

import pytest

from kvgrant.layout.geometry import load_geometry
from kvgrant.layout.plans import make_plan
from kvgrant.layout.preflight import handle_demand
from kvgrant.errors import LedgerError
from kvgrant.runtime.hostpool import HostPool
from kvgrant.runtime.ledger import HostLedger
from kvgrant.runtime.sim import SimDriver

ROOT = Path(__file__).resolve().parents[2]
WORKER = str(Path(__file__).with_name("_ledger_worker.py"))
GEOMETRY = str(ROOT / "examples" / "small.json")
TIMEOUT_S = 120


@pytest.fixture(scope="module")
def demand() -> int:
    """Handles one worker's allocation of examples/small.json (packed) needs."""
    g = load_geometry(GEOMETRY)
    return handle_demand(g, make_plan(g, "packed"))


class Procs:
    """Worker processes of one test; all are killed and reaped at its end."""

    def __init__(self, tmp: Path) -> None:
        self.tmp = tmp
        self.ledger = str(tmp / "ledger.json")
        self.pool = str(tmp / "pool")
        self.live: list[subprocess.Popen[str]] = []

    def start(self, *args: str) -> subprocess.Popen[str]:
        env = dict(os.environ, PYTHONPATH=str(ROOT / "tests" / "runtime"))
        env.pop("KVGRANT_LEDGER", None)
        env.pop("KVGRANT_SIM_POOL", None)
        p = subprocess.Popen([sys.executable, WORKER, *args], stdin=subprocess.PIPE,
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                             env=env)
        self.live.append(p)
        return p

    def alloc(self, budget: int, reserve: int = 0, preflight: bool = True
              ) -> tuple[subprocess.Popen[str], dict[str, Any]]:
        p = self.start("alloc", GEOMETRY, self.ledger, self.pool, str(budget), str(reserve),
                       "1" if preflight else "0")
        return p, self.line(p)

    def line(self, p: subprocess.Popen[str]) -> dict[str, Any]:
        assert p.stdout is not None
        text = p.stdout.readline()  # the worker prints within seconds (or dies)
        if not text:
            p.wait(timeout=TIMEOUT_S)
            assert p.stderr is not None
            raise AssertionError(f"worker {p.pid} said nothing: {p.stderr.read()[-2000:]}")
        return json.loads(text)

    def release(self, p: subprocess.Popen[str]) -> dict[str, Any]:
        assert p.stdin is not None
        p.stdin.write("\n")
        p.stdin.flush()
        out = self.line(p)
        assert p.wait(timeout=TIMEOUT_S) == 0
        return out

    def finish(self) -> None:
        for p in self.live:
            if p.poll() is None:
                p.kill()
            p.wait(timeout=TIMEOUT_S)
            for f in (p.stdin, p.stdout, p.stderr):
                if f is not None:
                    f.close()


@pytest.fixture
def procs(tmp_path: Path) -> Iterator[Procs]:
    ps = Procs(tmp_path)
    try:
        yield ps
    finally:
        ps.finish()


def test_second_process_is_refused_by_the_ledger_naming_the_first(procs: Procs,
                                                                   demand: int) -> None:
    budget = demand + demand // 2
    a, out_a = procs.alloc(budget)
    assert out_a["ok"] and out_a["grants"] == demand
    b, out_b = procs.alloc(budget)
    assert out_b["ok"] is False and out_b["kind"] == "HandleBudgetError"
    assert [(h["pid"], h["handles"]) for h in out_b["holders"]] == [(a.pid, demand)]
    assert out_b["held"] == demand and out_b["demand"] == demand
    assert f"pid {a.pid} 'small'" in out_b["error"]
    assert b.wait(timeout=TIMEOUT_S) == 1
    # the refused process left nothing in the ledger or the pool
    assert [h.pid for h in HostLedger(procs.ledger).holders()] == [a.pid]
    assert HostPool(procs.pool, budget).holders() == {a.pid: demand}
    assert procs.release(a) == {"released": True, "live_empty": True}
    assert HostLedger(procs.ledger).holders() == []
    assert HostPool(procs.pool, budget).total() == 0


def test_without_preflight_the_second_fails_in_set_access_at_the_pools_count(
        procs: Procs, demand: int) -> None:
    budget = demand + demand // 2
    a, out_a = procs.alloc(budget)
    assert out_a["ok"]
    b, out_b = procs.alloc(budget, preflight=False)
    assert (out_b["kind"], out_b["call"], out_b["result"]) == (
        "AllocationError", "cuMemSetAccess", "CUDA_ERROR_OUT_OF_MEMORY")
    left = budget - demand  # what the pool had left for b
    widest = 2  # small.json grants a mapping to at most 2 devices
    assert left - widest < out_b["live"]["grants"] <= left
    assert out_b["cleanup_errors"] == []
    assert "after unwinding: nothing left" in out_b["error"]
    assert b.wait(timeout=TIMEOUT_S) == 1
    assert HostPool(procs.pool, budget).holders() == {a.pid: demand}
    procs.release(a)


def test_a_killed_holder_is_reaped_from_ledger_and_pool(procs: Procs, demand: int) -> None:
    budget = demand + demand // 2
    a, out_a = procs.alloc(budget)
    assert out_a["ok"]
    a.send_signal(signal.SIGKILL)
    a.wait(timeout=TIMEOUT_S)
    assert [h.pid for h in HostLedger(procs.ledger).holders(reap=False)] == [a.pid]
    b, out_b = procs.alloc(budget)  # fits only once a's ledger entry and grants are reaped
    assert out_b["ok"] and out_b["grants"] == demand
    assert [h.pid for h in HostLedger(procs.ledger).holders()] == [b.pid]
    assert HostPool(procs.pool, budget).holders() == {b.pid: demand}
    procs.release(b)


def test_three_processes_the_third_is_refused_naming_both(procs: Procs, demand: int) -> None:
    budget = 2 * demand + demand // 2
    a, out_a = procs.alloc(budget)
    b, out_b = procs.alloc(budget)
    assert out_a["ok"] and out_b["ok"]
    c, out_c = procs.alloc(budget)
    assert out_c["kind"] == "HandleBudgetError"
    assert sorted(h["pid"] for h in out_c["holders"]) == sorted([a.pid, b.pid])
    assert out_c["held"] == 2 * demand
    c2, out_c2 = procs.alloc(budget, preflight=False)
    assert (out_c2["call"], out_c2["result"]) == ("cuMemSetAccess", "CUDA_ERROR_OUT_OF_MEMORY")
    left = budget - 2 * demand
    assert left - 2 < out_c2["live"]["grants"] <= left
    procs.release(a)
    procs.release(b)
    assert HostLedger(procs.ledger).holders() == []
    assert HostPool(procs.pool, budget).total() == 0


@pytest.mark.parametrize("n", [2, 3])
def test_fillers_at_once_stop_together_at_the_budget(procs: Procs, n: int) -> None:
    """The issue's measurement on the simulated host: processes mapping one 2 MiB
    allocation again and again, each mapping granted to one device, stop when their
    grants *together* reach the budget (H200: 265,147 + 258,740 = 523,887)."""
    budget = 3000
    go = procs.tmp / "go"
    fillers = [procs.start("fill", procs.pool, str(budget), str(go)) for _ in range(n)]
    for p in fillers:
        assert procs.line(p) == {"ready": True}
    go.touch()
    outs = [procs.line(p) for p in fillers]
    assert all(o["result"] == "CUDA_ERROR_OUT_OF_MEMORY" for o in outs)
    assert sum(o["grants"] for o in outs) == budget
    assert all(procs.release(p) == {"live_empty": True} for p in fillers)
    assert HostPool(procs.pool, budget).total() == 0


def test_one_process_two_pooled_drivers_share_the_budget(tmp_path: Path) -> None:
    a = SimDriver(devices=1, handle_budget=3, host_pool=tmp_path / "pool")
    b = SimDriver(devices=1, handle_budget=3, host_pool=tmp_path / "pool")
    G = a.G
    vas = []
    for drv in (a, b):
        va = drv.reserve(2 * G, device=0)
        h = drv.create(G, 0)
        drv.map(va, G, h)
        drv.map(va + G, G, h)
        vas.append(va)
    a.set_access(vas[0], 2 * G, [0])
    b.set_access(vas[1], G, [0])
    with pytest.raises(Exception) as info:
        b.set_access(vas[1] + G, G, [0])
    assert getattr(info.value, "result_name", None) == "CUDA_ERROR_OUT_OF_MEMORY"
    assert "budget of the host exhausted" in str(info.value)
    assert b.live().grants == 1  # the failed call granted nothing
    a.unmap(vas[0], 2 * G)  # unmap gives the handles back to the host
    b.set_access(vas[1] + G, G, [0])
    assert a.host_pool is not None and a.host_pool.total() == 2
    b.close()  # a closed driver's grants go back too
    assert a.host_pool.total() == 0
    a.close()


def test_a_pool_made_with_another_budget_or_garbage_is_refused(tmp_path: Path) -> None:
    HostPool(tmp_path / "pool", 10).close()
    with pytest.raises(LedgerError, match="budget 10, not 11"):
        SimDriver(devices=1, handle_budget=11, host_pool=tmp_path / "pool")
    (tmp_path / "bad").write_bytes(b"x" * 40)
    with pytest.raises(LedgerError, match="not a pool file"):
        HostPool(tmp_path / "bad", 10)
    (tmp_path / "short").write_bytes(b"KVG")
    with pytest.raises(LedgerError, match="truncated header"):
        HostPool(tmp_path / "short", 10)


def test_the_environment_names_the_pool(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("KVGRANT_SIM_POOL", str(tmp_path / "envpool"))
    drv = SimDriver(devices=1, handle_budget=5)
    assert drv.host_pool is not None and drv.host_pool.path == tmp_path / "envpool"
    drv.close()
    monkeypatch.setenv("KVGRANT_SIM_POOL", "")
    assert SimDriver(devices=1).host_pool is None


def test_closed_pools_free_their_slots(tmp_path: Path) -> None:
    for _ in range(5):
        drv = SimDriver(devices=1, handle_budget=4, host_pool=tmp_path / "pool")
        va = drv.reserve(drv.G, device=0)
        h = drv.create(drv.G, 0)
        drv.map(va, drv.G, h)
        drv.set_access(va, drv.G, [0])
        drv.close()  # closed with a live grant: given back, slot freed
    assert (tmp_path / "pool").stat().st_size == 32 + 32  # the header and one slot, reused
    assert HostPool(tmp_path / "pool", 4).total() == 0
