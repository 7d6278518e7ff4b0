"""Run a group of N processes, one rank each, from one command (``kvgrant alloc --procs N``).

Why its own launcher: a serving engine starts its workers itself and calls
:func:`~kvgrant.runtime.group.allocate_rank` in each; to show (and test) the same flow
from the CLI, :func:`launch` starts N worker processes with ``torch.multiprocessing``
(spawn), joins them into a gloo group through a ``FileStore`` in a private temporary
folder, lets each allocate its rank, report, and release. :func:`run_under_torchrun`
does the part of one worker when ``torchrun`` started the processes (``RANK``,
``WORLD_SIZE``, ``LOCAL_RANK`` in the environment).

Each worker writes its report to ``rank<R>.json`` in the launcher's folder; the parent
waits for every worker with a deadline and kills any that is left, so no worker
outlives the command. On Ctrl-C the parent waits :data:`INTERRUPT_GRACE_S` more before
it kills: a terminal's Ctrl-C reaches the workers too, and each unwinds at its next
allocation boundary (docs/group.md, "Ctrl-C during the start-up") if it is given the
time; a second Ctrl-C ends the wait.
"""

from __future__ import annotations

import json
import os
import tempfile
import time
from pathlib import Path
from typing import Any, Mapping

from kvgrant.errors import KVGrantError
from kvgrant.runtime.transaction import release_failure_text

__all__ = ["INTERRUPT_GRACE_S", "in_torchrun", "launch", "run_under_torchrun",
           "worker_report"]

INTERRUPT_GRACE_S = 15.0
"""After a Ctrl-C, how long the launcher waits for its workers to unwind before it kills
them. The parent passes no signal on: a worker that got none finishes its start-up and
releases, which a healthy group does well within this time."""


def in_torchrun(env: Mapping[str, str] | None = None) -> bool:
    """True when torchrun (or another launcher using its variables) started us."""
    e = os.environ if env is None else env
    return all(k in e for k in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"))


def worker_report(spec: Mapping[str, Any], rank: int, group: Any = None) -> dict[str, Any]:
    """Allocate ``rank`` in an initialised group, release it, and say what happened."""
    from kvgrant.layout.geometry import parse_geometry
    from kvgrant.runtime.faults import Fault
    from kvgrant.runtime.group import allocate_rank
    from kvgrant.runtime.options import Backend, HandleBudget, TraceOptions

    g = parse_geometry(spec["geometry"])
    opts: dict[str, Any] = dict(spec.get("driver_options") or {})
    if spec.get("fail_at") is not None and spec.get("fail_rank", 0) == rank:
        opts["faults"] = [Fault(nth=int(spec["fail_at"]))]
    trace = None
    if spec.get("trace_dir"):
        Path(spec["trace_dir"]).mkdir(parents=True, exist_ok=True)
        # overwrite: the command refused a rank file that is not a trace (unless --force)
        trace = TraceOptions(str(Path(spec["trace_dir"]) / f"rank{rank}.ndjson"),
                             overwrite=True)
    device = spec.get("devices", {}).get(str(rank)) if spec.get("devices") else None
    if device is None and spec.get("launcher") == "kvgrant":
        # started by launch(), one process per rank: a LOCAL_RANK in the environment is
        # a stray one (it put every worker on one device, silently), so rank r -> r
        device = rank
    out: dict[str, Any] = {"rank": rank, "pid": os.getpid()}
    try:
        budget = HandleBudget(handles=spec.get("handle_budget"),
                              reserve=spec.get("handle_reserve"),
                              preflight=spec.get("preflight", True), ledger=spec.get("ledger"))
        pub = allocate_rank(g, rank, group, plan=spec.get("plan", "packed"),
                            backend=Backend(spec.get("backend", "auto"), opts), device=device,
                            memory_limit=spec.get("memory_limit"), budget=budget, trace=trace,
                            timeout_s=spec.get("timeout_s", 120.0))
    except KVGrantError as err:
        out.update(ok=False, kind=type(err).__name__, error=str(err),
                   failed=sorted(getattr(err, "failed", {}) or {}),
                   missing=list(getattr(err, "missing", []) or []))
        return out
    summary = pub.summary()
    hold = float(spec.get("hold_s", 0) or 0)
    if hold:
        time.sleep(hold)
    try:
        pub.release()
    except KVGrantError as err:
        # name each failed undo's call, rank, device, byte range and CUresult, and what
        # is left (was: the first error's own text, "rank 0: CUDA_ERROR_...: injected
        # fault ..." with no call or byte range)
        live = pub.driver.live().as_dict()
        out.update(summary, ok=False, kind=type(err).__name__, live_after_release=live,
                   error=release_failure_text(err, live))
        return out
    summary.update(ok=pub.trace_error is None, release_s=round(pub.release_s or 0.0, 6),
                   live_after_release=pub.driver.live().as_dict(),
                   trace=str(pub.trace_path) if pub.trace_path else None,
                   trace_error=None if pub.trace_error is None else str(pub.trace_error))
    out.update(summary)
    return out


def _worker(index: int, spec: dict[str, Any]) -> None:
    """One spawned process: join the file-store gloo group, allocate, report, leave."""
    import datetime

    import torch.distributed as dist

    world = int(spec["procs"])
    store = dist.FileStore(spec["store"], world)
    dist.init_process_group("gloo", store=store, rank=index, world_size=world,
                            timeout=datetime.timedelta(seconds=float(spec.get("timeout_s", 120))))
    try:
        rep = worker_report(spec, index)
    except BaseException as err:  # noqa: BLE001 - reported to the parent, then re-raised
        rep = {"rank": index, "ok": False, "kind": type(err).__name__, "error": str(err)}
        Path(spec["out"], f"rank{index}.json").write_text(json.dumps(rep))
        raise
    Path(spec["out"], f"rank{index}.json").write_text(json.dumps(rep))
    if rep.get("ok"):
        dist.destroy_process_group()


def launch(spec: Mapping[str, Any], *, wall_s: float | None = None) -> list[dict[str, Any]]:
    """Start ``spec["procs"]`` workers, wait for all of them, return their reports.

    ``spec`` holds ``geometry`` (a dict), ``procs`` and the ``allocate_rank`` options
    (``plan``, ``backend``, ``memory_limit``, ``handle_budget``, ``handle_reserve``,
    ``ledger``, ``preflight``,
    ``trace_dir``, ``fail_at``/``fail_rank``, ``timeout_s``, ``driver_options``). A
    worker that did not report (it died) is reported as ``{"ok": False, "died": True}``.
    Workers still running after ``wall_s`` (default: three deadlines plus two minutes)
    are killed.
    """
    import torch.multiprocessing as mp

    procs = int(spec["procs"])
    timeout_s = float(spec.get("timeout_s", 120.0))
    wall = wall_s if wall_s is not None else 3 * timeout_s + 120
    with tempfile.TemporaryDirectory(prefix="kvgrant-group-") as tmp:
        full = dict(spec, store=str(Path(tmp) / "store"), out=tmp, launcher="kvgrant")
        ctx = mp.start_processes(_worker, args=(full,), nprocs=procs, join=False,
                                 start_method="spawn")
        try:
            try:
                _wait(ctx.processes, time.monotonic() + wall)
            except KeyboardInterrupt:
                _wait(ctx.processes, time.monotonic() + INTERRUPT_GRACE_S)
                raise
        finally:
            for p in ctx.processes:
                if p.is_alive():
                    p.kill()
                p.join()
        reports = []
        for r in range(procs):
            path = Path(tmp, f"rank{r}.json")
            if path.exists():
                reports.append(json.loads(path.read_text()))
            else:
                code = ctx.processes[r].exitcode
                reports.append({"rank": r, "ok": False, "died": True, "kind": "died",
                                "error": f"worker of rank {r} ended with exit code {code} "
                                         "before it reported"})
        return reports


def _wait(processes: list[Any], deadline: float) -> None:
    """Until every process has ended or the monotonic ``deadline`` has passed."""
    while time.monotonic() < deadline and any(p.is_alive() for p in processes):
        time.sleep(0.05)


def run_under_torchrun(spec: Mapping[str, Any]) -> dict[str, Any]:
    """This process's part when torchrun started the group: env:// gloo group, one rank."""
    import datetime

    import torch.distributed as dist

    rank = int(os.environ["RANK"])
    devices = dict(spec.get("devices") or {})
    if "LOCAL_RANK" in os.environ and str(rank) not in devices:
        devices[str(rank)] = int(os.environ["LOCAL_RANK"])
    full = dict(spec, devices=devices)
    dist.init_process_group("gloo", timeout=datetime.timedelta(
        seconds=float(spec.get("timeout_s", 120))))
    try:
        return worker_report(full, rank)
    finally:
        dist.destroy_process_group()
