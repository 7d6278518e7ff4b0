"""The group runtime (one process per rank) on the simulated driver, across real processes.

Each test starts its worker processes (tests/runtime/_group_worker.py, a gloo group
through a FileStore) with a hard timeout and kills every one that is still there in a
``finally``. Workers report what they saw in JSON files; a test never trusts an exit
code alone.
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Callable

import pytest

from kvgrant.errors import GroupError, HandleBudgetError
from kvgrant.layout.geometry import parse_geometry
from kvgrant.layout.plans import make_plan
from kvgrant.layout.preflight import handle_demand
from kvgrant.runtime.fdpass import HANDLE_TYPE, FdClient, FdServer, open_fd_count
from kvgrant.runtime.group import _check_host_budget, allocate_rank, rank_demand

from tests.runtime._dict_store import DictStore
from tests.runtime._group_traces import check_group
from tests.runtime._small import G, MIB, scaled, small_geometry

if importlib.util.find_spec("torch") is None:  # not imported here: workers import it
    pytest.skip("the group runtime needs torch (pip install 'kvgrant[group]')",
                allow_module_level=True)

ROOT = Path(__file__).resolve().parents[2]
WORKER = Path(__file__).with_name("_group_worker.py")
HARD_TIMEOUT_S = 240     # whole group, torch imports included (2 shared CPU cores in CI)
EMPTY = {"handles": 0, "mappings": 0, "grants": 0, "reserved_bytes": 0, "reservations": 0}

# One plane of 2 G with one aliased G: 2 allocations per rank, ~20 driver calls a rank.
TINY = {"name": "tiny", "granularity": G, "pages": 4, "page_tokens": 16,
        "planes": [{"name": "a", "bytes_per_page": MIB}],
        "regions": [{"name": "snapshot", "rows": 1, "row_bytes": G}],
        "aliases": [{"region": "snapshot", "offset": 0, "plane": "a", "plane_offset": 0,
                     "length": G}],
        "topology": {"ranks": 2, "import_groups": [[0, 1]]}}


def run_group(tmp_path: Path, geometry: dict[str, Any], *,
              watch: Callable[[list[subprocess.Popen[bytes]]], None] | None = None,
              **spec: Any) -> list[dict[str, Any]]:
    """Run one worker per rank to the end (or kill them at the hard timeout); ``watch``
    runs while they do."""
    world = geometry["topology"]["ranks"]
    full = {"store": str(tmp_path / "store"), "world": world, "geometry": geometry,
            "out": str(tmp_path), "timeout_s": 20, "scenario": "once",
            "trace_dir": str(tmp_path)}
    full.update(spec)
    (tmp_path / "spec.json").write_text(json.dumps(full))
    env = dict(os.environ, PYTHONPATH=str(ROOT), PYTHONWARNINGS="ignore")
    procs = [subprocess.Popen([sys.executable, str(WORKER), str(tmp_path / "spec.json"), str(r)],
                              cwd=ROOT, env=env, stdout=subprocess.DEVNULL,
                              stderr=subprocess.PIPE)
             for r in range(world)]
    try:
        deadline = time.monotonic() + HARD_TIMEOUT_S
        if watch is not None:
            watch(procs)
        for p in procs:
            p.wait(timeout=max(deadline - time.monotonic(), 1))
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
            p.wait()
            if p.stderr is not None:
                p.stderr.close()
    out = []
    for r in range(world):
        path = tmp_path / f"rank{r}.json"
        out.append(json.loads(path.read_text()) if path.exists() else None)
    for rec in out:
        if rec is not None:
            assert "crash" not in rec, rec["crash"]
    return out


def unwound(rec: dict[str, Any], attempt: dict[str, Any]) -> None:
    """Nothing of the attempt is left in that process: driver objects, fds, sim memory."""
    assert attempt["live"] == EMPTY
    assert attempt["open_shareables"] == 0 and attempt["shared"] == 0
    assert not any(attempt["used"])
    assert attempt["fdlist"] == rec["fdlist0"]


def test_three_processes_publish_and_read_each_others_bytes(tmp_path: Path) -> None:
    g = scaled(small_geometry(), 3).model_dump()   # every rank imports the other two
    recs = run_group(tmp_path, g, pattern=True, access=True, alias_regression=True)
    for r, rec in enumerate(recs):
        (a,) = rec["attempts"]
        assert a["ok"], a
        assert a["access_checked"] > 0 and a["access_wrong"] == []   # own device only
        assert a["alias_bad"] == []
        assert a["peer_owner_only_row"] == "refused"   # a peer's 'exec' rows are not mapped
        assert a["imports_from"] == [o for o in range(3) if o != r]
        assert a["reads"] and all(a["reads"].values()), a["reads"]  # the owner's bytes
        assert a["device_of_view"] == r            # read through the importer's own device
        unwound(rec, a)
    decision = check_group([tmp_path / f"rank{r}.ndjson" for r in range(3)])
    assert decision == "publish"


def test_a_fault_at_every_driver_call_of_either_process_unwinds_every_process(
        tmp_path: Path) -> None:
    recs = run_group(tmp_path, TINY, scenario="sweep", fault_ranks=[0, 1])
    for rec in recs:
        assert rec["clean"]["ok"]
        unwound(rec, rec["clean"])
    by_rank = [{(a["fault_rank"], a["k"]): a for a in rec["attempts"]} for rec in recs]
    keys = sorted(by_rank[0])
    assert keys == sorted(by_rank[1])
    for fr in (0, 1):
        assert len([k for k in keys if k[0] == fr]) == recs[fr]["clean"]["calls"]
    for fr, k in keys:
        for r in (0, 1):
            a = by_rank[r][(fr, k)]
            assert not a["ok"], (fr, k, r)
            assert a["kind"] == "GroupError"
            assert fr in a["failed"], (fr, k, r, a["error"])
            assert f"rank {fr} failed:" in a["error"] and "injected fault" in a["error"]
            unwound(recs[r], a)
        assert check_group([tmp_path / f"f{fr}-k{k}-rank{r}.ndjson" for r in (0, 1)]) == "abort"


def test_kill_9_of_one_process_during_start_up_aborts_the_others_naming_it(
        tmp_path: Path) -> None:
    g = scaled(small_geometry(), 3).model_dump()
    # rank 1 SIGKILLs itself at its 6th driver call (inside its own build)
    recs = run_group(tmp_path, g, kill_rank=1, kill_at=6, timeout_s=30)
    assert recs[1] is None                      # it died without a word
    for r in (0, 2):
        (a,) = recs[r]["attempts"]
        assert not a["ok"] and a["kind"] == "GroupError"
        assert a["missing"] == [1], a["error"]
        assert "rank 1 died" in a["error"]
        unwound(recs[r], a)
    check_group([tmp_path / f"rank{r}.ndjson" for r in range(3)], dead={1})
    head, *events = (json.loads(x) for x in (tmp_path / "rank1.ndjson").read_text().splitlines())
    assert not any(e["action"] in ("AbortComplete", "ShutdownComplete", "Vote") for e in events)


@pytest.mark.parametrize("kill_at", [14, 18])
def test_kill_9_of_an_owner_after_it_sent_fds_keeps_its_sends_in_its_trace(
        tmp_path: Path, kill_at: int) -> None:
    """Audit: rank 1 SIGKILLed after its first fds left kept only its header (events were
    still in its buffer), so rank 0's Import of them had no Send and conform failed."""
    recs = run_group(tmp_path, TINY, kill_rank=1, kill_at=kill_at, timeout_s=20)
    assert recs[1] is None
    lines = (tmp_path / "rank1.ndjson").read_text().splitlines()
    assert "Send" in [json.loads(x).get("action") for x in lines[1:]]  # killed after a send
    assert check_group([tmp_path / f"rank{r}.ndjson" for r in (0, 1)], dead={1}) == "abort"


def test_ranks_with_different_plans_are_refused_before_any_driver_call(
        tmp_path: Path) -> None:
    """Each rank plans for itself; the hello compares the plan digests, so a rank whose
    plan differs is named (with both digests) and nobody calls the driver."""
    recs = run_group(tmp_path, TINY, plans={"0": "packed", "1": "naive"})
    g = parse_geometry(TINY)
    from kvgrant.runtime.group import plan_digests

    packed, naive = (plan_digests(g, make_plan(g, x))["plan"] for x in ("packed", "naive"))
    assert packed != naive
    for r in (0, 1):
        (a,) = recs[r]["attempts"]
        assert not a["ok"] and a["kind"] == "GroupError", a
        assert a["calls"] == 0 and a["live"] == EMPTY
        assert "plan digests differ" in a["error"], a["error"]
        # a tie of one against one: the lowest rank's plan is the reference
        assert f"rank 1 has {naive}" in a["error"] and f"ranks [0] have {packed}" \
            in a["error"], a["error"]
        assert a["failed"] == [1]


def test_plan_digest_check_names_the_odd_ranks() -> None:
    from kvgrant.runtime.group import _check_same_plan

    same = {"geometry": "sha256:g", "plan": "sha256:a"}
    _check_same_plan({0: same, 1: dict(same), 2: dict(same)}, 0, "x")
    odd = {"geometry": "sha256:g", "plan": "sha256:b"}
    with pytest.raises(GroupError) as ei:
        _check_same_plan({0: same, 1: odd, 2: same}, 2, "the group did not start")
    assert ei.value.failed == {1: "plan digest sha256:b differs from sha256:a"}
    assert "rank 1 has sha256:b; ranks [0, 2] have sha256:a" in str(ei.value)
    with pytest.raises(GroupError, match="geometry digests differ: rank 0 has sha256:h"):
        _check_same_plan({0: {**same, "geometry": "sha256:h"}, 1: same, 2: same}, 1, "x")


def test_a_rank_that_stops_answering_is_named_after_the_deadline(tmp_path: Path) -> None:
    g = scaled(small_geometry(), 3).model_dump()

    def kill_the_stopped_one_once_the_others_reported(procs: list[Any]) -> None:
        deadline = time.monotonic() + HARD_TIMEOUT_S - 30
        while time.monotonic() < deadline and not all(
                (tmp_path / f"rank{r}.json").exists() for r in (0, 2)):
            time.sleep(0.1)
        procs[1].kill()          # SIGSTOPped: it would never end on its own

    # rank 1 SIGSTOPs itself at its 6th driver call: alive, silent
    recs = run_group(tmp_path, g, stop_rank=1, stop_at=6, timeout_s=3,
                     watch=kill_the_stopped_one_once_the_others_reported)
    assert recs[1] is None
    for r in (0, 2):
        (a,) = recs[r]["attempts"]
        assert not a["ok"] and a["kind"] == "GroupError"
        assert a["missing"] == [1], a["error"]
        assert "rank 1 did not answer within 3 s" in a["error"]
        unwound(recs[r], a)


# ------------------------------------------------- in-process pieces (no group needed)
def test_a_group_and_another_kvgrant_process_share_the_host_ledger(tmp_path: Path) -> None:
    """Another kvgrant allocation on the host holds a lease; a group whose shares do not
    fit beside it is refused by the ledger before any driver call, naming that holder;
    once the holder has gone, the same group publishes and leaves the ledger empty."""
    from kvgrant.runtime.ledger import HostLedger

    ledger = tmp_path / "ledger.json"
    geo = tmp_path / "tiny.json"
    geo.write_text(json.dumps(TINY))
    g = parse_geometry(TINY)
    plan = make_plan(g, "packed")
    group_need = sum(rank_demand(g, plan, r) for r in range(2))
    holder = subprocess.Popen(
        [sys.executable, str(ROOT / "tests" / "runtime" / "_ledger_worker.py"), "alloc",
         str(geo), str(ledger), str(tmp_path / "pool"), "100000", "0", "1"],
        cwd=ROOT, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
        env=dict(os.environ, PYTHONPATH=str(ROOT)))
    try:
        first = json.loads(holder.stdout.readline())  # type: ignore[union-attr]
        assert first["ok"], first
        held = sum(h.handles for h in HostLedger(ledger).holders())
        assert held == handle_demand(g, plan) == group_need
        # room for the holder and one rank's share, not two
        budget = held + group_need - 1
        (tmp_path / "a").mkdir()
        refused = run_group(tmp_path / "a", TINY, ledger=str(ledger), handle_budget=budget,
                            handle_reserve=0)
        tries = [r["attempts"][0] for r in refused]
        assert not any(t["ok"] for t in tries), tries
        assert any(f"pid {holder.pid}" in t["error"] for t in tries), tries
        for t in tries:
            assert t["live"] == EMPTY
        assert [h.pid for h in HostLedger(ledger).holders()] == [holder.pid]
    finally:
        holder.communicate("go\n", timeout=HARD_TIMEOUT_S)
    assert HostLedger(ledger).holders() == []
    (tmp_path / "b").mkdir()
    ok = run_group(tmp_path / "b", TINY, ledger=str(ledger), handle_budget=budget,
                   handle_reserve=0)
    assert all(r["attempts"][0]["ok"] for r in ok), ok
    assert HostLedger(ledger).holders() == []


def test_two_groups_on_one_host_share_the_ledger(tmp_path: Path) -> None:
    """Two independent groups (own stores, own processes) and one host ledger: while
    group A holds its published shares, group B is refused by the ledger, before any
    driver call, naming A's processes; with room for both, B publishes beside A; once
    both have released, the ledger is empty."""
    import threading

    from kvgrant.runtime.ledger import HostLedger

    ledger = tmp_path / "ledger.json"
    g = parse_geometry(TINY)
    plan = make_plan(g, "packed")
    need = sum(rank_demand(g, plan, r) for r in range(2))
    results: dict[str, Any] = {}
    for d in ("A", "B1", "B2"):
        (tmp_path / d).mkdir()
    release = tmp_path / "A" / "release"

    def group_b(a_procs: list[subprocess.Popen[bytes]]) -> None:
        try:
            deadline = time.monotonic() + HARD_TIMEOUT_S - 30
            while time.monotonic() < deadline and not all(
                    (tmp_path / "A" / f"published-{r}").exists() for r in range(2)):
                time.sleep(0.05)
            results["a_pids"] = [p.pid for p in a_procs]
            results["held"] = sorted(h.pid for h in HostLedger(ledger).holders())
            # room for A and one of B's two shares: B is refused
            results["refused"] = run_group(tmp_path / "B1", TINY, ledger=str(ledger),
                                           handle_budget=2 * need - 1, handle_reserve=0)
            results["held_after_refusal"] = sorted(h.pid for h in
                                                   HostLedger(ledger).holders())
            # room for both groups: B publishes beside A
            results["fits"] = run_group(tmp_path / "B2", TINY, ledger=str(ledger),
                                        handle_budget=2 * need, handle_reserve=0)
        finally:
            release.touch()

    a = run_group(tmp_path / "A", TINY, ledger=str(ledger), handle_budget=2 * need,
                  handle_reserve=0, hold=str(release), watch=group_b)
    assert all(r["attempts"][0]["ok"] for r in a), a
    a_pids = sorted(results["a_pids"])
    assert results["held"] == a_pids                        # A's two shares, A's pids
    tries = [r["attempts"][0] for r in results["refused"]]
    assert not any(t["ok"] for t in tries), tries
    named = [t for t in tries if t["kind"] == "HandleBudgetError" or "ledger" in t["error"]]
    assert named, tries
    for t in named:
        assert all(f"pid {pid}" in t["error"] for pid in a_pids), t["error"]
    for t in tries:   # a rank whose lease fitted only queried its device
        assert t["live"] == EMPTY, t
    refused_by_ledger = [t for t in tries if t["kind"] == "HandleBudgetError"]
    assert refused_by_ledger and all(t["calls"] == 0 for t in refused_by_ledger), tries
    assert results["held_after_refusal"] == a_pids          # B left nothing behind
    assert all(r["attempts"][0]["ok"] for r in results["fits"]), results["fits"]
    assert HostLedger(ledger).holders() == []


def test_fd_server_takes_fds_from_an_owner_it_imports_from() -> None:
    before = open_fd_count()
    server = FdServer(1, "unit")
    server.start({0: os.getpid()})
    data = os.memfd_create("kvgrant-test")
    os.write(data, b"owner bytes")
    try:
        c = FdClient(0, 1, server.address, time.monotonic() + 5)
        c.send(0, data, G, 0, time.monotonic() + 5)
        c.finish()
        got = server.take(0, 0, time.monotonic() + 5)
        assert (got.owner, got.alloc, got.size, got.handle_type) == (0, 0, G, HANDLE_TYPE)
        assert os.pread(got.fd, 11, 0) == b"owner bytes"    # the same file, another fd
        os.close(got.fd)
        with pytest.raises(GroupError, match="said done"):
            server.take(0, 1, time.monotonic() + 5)
    finally:
        os.close(data)
        server.close()
    assert open_fd_count() == before


def test_fd_server_refuses_a_sender_it_does_not_import_from_and_closes_its_fds() -> None:
    before = open_fd_count()
    server = FdServer(1, "unit")
    server.start({0: 1})          # owner 0 is pid 1 here: this process is nobody it imports from
    data = os.memfd_create("kvgrant-test")
    try:
        c = FdClient(0, 1, server.address, time.monotonic() + 5)
        try:
            c.send(0, data, G, 0, time.monotonic() + 5)
        except OSError:
            pass                  # the receiver may already have closed the connection
        c.finish()
        with pytest.raises(GroupError, match="refused a connection") as info:
            server.take(0, 0, time.monotonic() + 5)
        assert f"peer pid {os.getpid()}" in str(info.value)
    finally:
        os.close(data)
        server.close()
    assert open_fd_count() == before


def test_host_demand_sums_to_the_one_process_demand_and_refusal_names_every_share() -> None:
    g = parse_geometry(small_geometry().model_dump())
    plan = make_plan(g, "packed")
    shares = [rank_demand(g, plan, r) for r in range(g.topology.ranks)]
    assert sum(shares) == handle_demand(g, plan)
    hosts = ["a", "a", "b"]
    per_host = _check_host_budget(g, plan, hosts, budget=10**6)
    assert per_host == {"a": shares[0] + shares[1], "b": shares[2]}
    with pytest.raises(HandleBudgetError) as info:
        _check_host_budget(g, plan, hosts, budget=shares[0] + shares[1] - 1)
    msg = str(info.value)
    assert f"rank 0 {shares[0]:,}" in msg and f"rank 1 {shares[1]:,}" in msg
    assert "host 'a'" in msg and "host 'b'" not in msg


# ------------------------------------------------------------------------------ CLI
def _cli(*args: str, timeout: float = HARD_TIMEOUT_S) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ, PYTHONPATH=str(ROOT), PYTHONWARNINGS="ignore")
    return subprocess.run([sys.executable, "-m", "kvgrant.cli", *args], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=timeout)


def test_cli_procs_runs_one_process_per_rank_and_writes_one_trace_each(tmp_path: Path) -> None:
    out = _cli("alloc", "examples/small.json", "--procs", "3", "--backend", "sim", "--json",
               "--trace", str(tmp_path / "traces"))
    assert out.returncode == 0, out.stderr[-3000:]
    doc = json.loads(out.stdout.strip().splitlines()[-1])
    assert doc["ok"] and doc["mode"] == "group" and doc["procs"] == 3
    by_rank = {r["rank"]: r for r in doc["ranks"]}
    # small.json: ranks 0 and 1 import each other; rank 2 imports from nobody
    assert [by_rank[r]["imports_from"] for r in range(3)] == [[1], [0], []]
    assert len({by_rank[r]["pid"] for r in range(3)}) == 3
    for r in range(3):
        assert not any(by_rank[r]["live_after_release"].values())
    files = sorted((tmp_path / "traces").glob("rank*.ndjson"))
    assert len(files) == 3 and check_group(files) == "publish"


def test_cli_procs_must_match_the_layouts_ranks() -> None:
    out = _cli("alloc", "examples/small.json", "--procs", "2", "--backend", "sim", timeout=60)
    assert out.returncode == 2
    assert "--procs = 2" in out.stderr and "topology.ranks = 3" in out.stderr


def test_group_modules_pin_their_public_names() -> None:
    import kvgrant.runtime as rt
    from kvgrant.runtime import fdpass, group, group_launch

    for m in (fdpass, group, group_launch):
        assert m.__all__ == sorted(m.__all__) and all(hasattr(m, n) for n in m.__all__)
    assert rt.allocate_rank is group.allocate_rank and rt.GroupPublished is group.GroupPublished
    assert issubclass(GroupError, Exception) and "GroupError" in __import__("kvgrant").__all__


def test_a_re_plan_that_differs_fails_every_rank_before_its_first_object() -> None:
    """After a memory limit shrank the pages each rank re-plans; the new digests are
    all-gathered and a difference fails every rank (naming the odd one), as does a rank
    whose re-plan failed; equal plans go on."""
    import threading

    from kvgrant.runtime.group import _agree_on_replan, _Channel, _StepFailed

    g = parse_geometry(TINY)
    packed, naive = make_plan(g, "packed"), make_plan(g, "naive")

    def run(plans: list[Any], fails: list[Any]) -> list[Any]:
        store = DictStore()
        chans = [_Channel(store, r, 2, 10.0) for r in range(2)]
        out: list[Any] = [None, None]

        def one(r: int) -> None:
            out[r] = _agree_on_replan(chans[r], g, plans[r], r, fails[r])

        ts = [threading.Thread(target=one, args=(r,)) for r in range(2)]
        for t in ts:
            t.start()
        for t in ts:
            t.join(30)
        return out

    assert run([packed, packed], [None, None]) == [None, None]
    differ = run([packed, naive], [None, None])
    for f in differ:
        assert isinstance(f, _StepFailed) and "plan digests differ: rank 1 has" in f.text
        assert f.peer == 1
    own = _StepFailed("rank 1: no memory", GroupError("no memory"))
    failed = run([packed, packed], [None, own])
    assert failed[1] is own
    assert isinstance(failed[0], _StepFailed) and "ranks [1] failed to re-plan" in \
        failed[0].text


class _FakeProcess:
    """A worker that ends ``after`` looks at it (never, for None), or when killed."""

    def __init__(self, after: int | None) -> None:
        self.after, self.looks, self.killed, self.joined = after, 0, False, False
        self.exitcode: int | None = None

    def is_alive(self) -> bool:
        self.looks += 1
        return not self.killed and (self.after is None or self.looks <= self.after)

    def kill(self) -> None:
        self.killed = True

    def join(self) -> None:
        self.joined = True


def test_launcher_gives_workers_time_to_unwind_after_ctrl_c(monkeypatch) -> None:
    """A Ctrl-C in the launcher's wait: the workers (which a terminal's Ctrl-C reaches
    too) get INTERRUPT_GRACE_S to unwind before any is killed, then it raises."""
    import torch.multiprocessing as mp

    from kvgrant.runtime import group_launch

    finishing, stuck = _FakeProcess(after=3), _FakeProcess(after=None)
    ctx = type("Ctx", (), {"processes": [finishing, stuck]})()
    monkeypatch.setattr(mp, "start_processes", lambda *a, **k: ctx)
    waits: list[float] = []
    real_wait = group_launch._wait
    now = [0.0]
    monkeypatch.setattr(group_launch.time, "monotonic", lambda: now[0])
    monkeypatch.setattr(group_launch.time, "sleep", lambda s: now.__setitem__(0, now[0] + s))

    def wait(processes, deadline):
        waits.append(deadline - now[0])
        if len(waits) == 1:
            raise KeyboardInterrupt
        real_wait(processes, deadline)

    monkeypatch.setattr(group_launch, "_wait", wait)
    with pytest.raises(KeyboardInterrupt):
        group_launch.launch({"procs": 2, "geometry": {}, "timeout_s": 5})
    assert waits[1] == group_launch.INTERRUPT_GRACE_S
    assert not finishing.killed and finishing.joined   # it ended within the grace
    assert stuck.killed and stuck.joined                # the grace ran out: killed
    assert now[0] >= group_launch.INTERRUPT_GRACE_S


@pytest.mark.parametrize("kwargs, env, names", [
    ({"store": 5}, {}, "store = 5: must be a torch.distributed Store"),
    ({"store": object(), "timeout_s": 0}, {}, "store = "),
    ({"timeout_s": "soon"}, {}, 'timeout_s = "soon": must be a number of seconds > 0'),
    ({"timeout_s": True}, {}, "timeout_s = true"),
    ({"timeout_s": -1}, {}, "timeout_s = -1"),
    ({}, {"LOCAL_RANK": "gpu0"}, 'LOCAL_RANK = "gpu0": must be a device number'),
])
def test_allocate_rank_names_a_bad_store_timeout_or_local_rank(kwargs, env, names,
                                                              monkeypatch) -> None:
    """Refused with an ArgumentError naming the argument and value before any group
    step (was an AttributeError / TypeError / ValueError traceback)."""
    import torch.distributed as dist

    from kvgrant.errors import ArgumentError

    for k, v in env.items():
        monkeypatch.setenv(k, v)
    kwargs = dict(kwargs)
    if "store" not in kwargs:
        kwargs["store"] = dist.HashStore()
    with pytest.raises(ArgumentError) as err:
        allocate_rank(ROOT / "examples" / "small.json", 0, backend="sim", **kwargs)
    assert names in str(err.value)
