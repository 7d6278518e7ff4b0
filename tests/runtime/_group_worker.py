"""One process of a test group: ``python _group_worker.py SPEC.json RANK``.

Joins a gloo group through a FileStore, then runs the scenario the spec names and writes
what it saw to ``<out>/rank<R>.json`` (the test reads those; it never trusts an exit code
alone). Scenarios:

* ``once``: one allocate_rank; the owner writes a pattern into its planes, every
  importer reads it back through its own mapping; optional ``faults`` / ``kill_at``.
  ``hold``: once published, wait until that file exists before releasing.
* ``sweep``: for k in 1..calls, one attempt where rank ``fault_rank`` fails its k-th
  driver call; after each, this process's live counts, open fds and sim pool are recorded.
* ``sigint``: for each set of ranks in ``sigint_sets`` and k in 1..calls (the fewest of
  the set's clean calls), one attempt where each rank of the set sends itself a SIGINT
  after its k-th driver call (tests/runtime/_sigint.py); recorded as for ``sweep``.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import time
import traceback
from pathlib import Path
from typing import Any

from kvgrant.errors import GroupError
from kvgrant.layout.geometry import parse_geometry
from kvgrant.runtime.faults import Fault
from kvgrant.runtime.group import allocate_rank
from kvgrant.runtime.sim import SimDriver
from kvgrant.runtime.trace import TraceWriter

PATTERN = 0x5A


def _killing(base: type, sig: int) -> type:
    """``base`` driver that sends ``sig`` to its own process at its ``kill_at``-th call."""

    class Killing(base):  # type: ignore[misc, valid-type]
        def __init__(self, kill_at: int, **kw: Any) -> None:
            super().__init__(**kw)
            self.kill_at = kill_at

        def _enter(self, call: str, device: int | None, va: int | None = None,
                   size: int | None = None) -> None:
            if sum(self.calls.values()) + 1 == self.kill_at:
                os.kill(os.getpid(), sig)
            super()._enter(call, device, va, size)
    return Killing


def _driver(spec: dict[str, Any], n: int, faults: list[Fault] | None,
            kill_at: int | None, sig: int = signal.SIGKILL, sigint_at: int | None = None
            ) -> Any:
    if spec.get("scenario") == "sigint":
        from tests.runtime._sigint import SigintSim

        return SigintSim(sigint_at, devices=n, faults=faults)
    if spec.get("backend") == "cuda":
        from kvgrant.runtime.cuda import CudaDriver

        base: type = CudaDriver
        kw: dict[str, Any] = {"faults": faults}
    else:
        base, kw = SimDriver, {"devices": n, "faults": faults}
    return _killing(base, sig)(kill_at, **kw) if kill_at is not None else base(**kw)


def _mappings(pub: Any, g: Any) -> list[tuple[str, int]]:
    """(what, va) of every mapping this process made: own plane + alias, imported plane
    + alias of importers-access regions."""
    out = []
    for r in [pub.rank, *pub.imports_from]:
        for i, a in enumerate(pub.plan.allocations):
            out.append((f"rank {r} alloc {i} plane", pub.plane_va[r][a.plane] + a.plane_offset))
            if a.region is not None and (r == pub.rank or
                                         g.region_by_name[a.region].access == "importers"):
                out.append((f"rank {r} alloc {i} alias",
                            pub.region_va[r][a.region] + (a.region_offset or 0)))
    return out


def _attempt(spec: dict[str, Any], rank: int, g: Any, out: dict[str, Any], trace: str | None,
             faults: list[Fault] | None, kill_at: int | None,
             sigint_at: int | None = None) -> dict[str, Any]:
    n = g.topology.ranks
    sig = signal.SIGKILL
    if kill_at is None and spec.get("stop_rank") == rank:
        kill_at, sig = spec["stop_at"], signal.SIGSTOP
    drv = _driver(spec, n, faults, kill_at, sig, sigint_at)
    cuda = drv.name == "cuda"
    res: dict[str, Any] = {}
    probe = None
    if spec.get("free_check"):
        # this GPU's free bytes, through an uncounted driver (the same primary context;
        # no context on any other GPU, so the test can measure those from outside)
        if cuda:
            from kvgrant.runtime.cuda import CudaDriver

            probe = CudaDriver()
        else:                      # the sim backend: a dry run of the same steps
            probe = SimDriver(devices=n)
        res["free_before"] = probe.free_memory(rank)[0]
    try:
        tw = TraceWriter(trace, renderer="thread") if trace else None
        plan = (spec.get("plans") or {}).get(str(rank), "packed")
        pub = allocate_rank(g, rank, driver=drv, trace=tw, timeout_s=spec["timeout_s"],
                            plan=plan,
                            device=rank, ledger=spec.get("ledger"),
                            handle_budget=spec.get("handle_budget"),
                            handle_reserve=spec.get("handle_reserve"))
    except (Exception, KeyboardInterrupt) as e:  # noqa: BLE001 - recorded for the test
        res.update(ok=False, kind=type(e).__name__, error=str(e),
                   calls=sum(drv.calls.values()), failed=sorted(getattr(e, "failed", {})),
                   missing=list(getattr(e, "missing", [])))
    else:
        res.update(ok=True, imports_from=list(pub.imports_from),
                   calls=sum(drv.calls.values()), startup_s=pub.startup_s,
                   counts=pub.counts.as_dict())
        if spec.get("access"):
            # cuMemGetAccess of every mapping, for every device: only our own
            wrong = []
            for what, va in _mappings(pub, g):
                for d in range(drv.device_count()):
                    if drv.get_access(va, d) != (d == rank):
                        wrong.append(f"{what} va {va:#x}: device {d}")
            res["access_wrong"] = wrong
            res["access_checked"] = len(_mappings(pub, g))
        owner_only = [reg.name for reg in g.regions if reg.access == "owner"]
        if owner_only and pub.imports_from:
            try:
                pub.row(pub.imports_from[0], owner_only[0], 0)
            except GroupError:
                res["peer_owner_only_row"] = "refused"
            else:
                res["peer_owner_only_row"] = "given"
        reads: dict[str, bool] = {}
        if spec.get("pattern"):
            for p in g.planes:
                buf = pub.plane(rank, p.name)
                if cuda:
                    buf.as_tensor().fill_(PATTERN ^ rank)
                    import torch

                    torch.cuda.synchronize(rank)
                else:
                    drv.write(buf.ptr, bytes([PATTERN ^ rank]) * 4096, rank)
            _sync(spec, rank, "written")
            for o in pub.imports_from:
                for p in g.planes:
                    buf = pub.plane(o, p.name)
                    res["device_of_view"] = buf.device
                    if cuda:   # a kernel on our own GPU reads the owner's bytes
                        t = buf.as_tensor()
                        reads[f"{o}:{p.name}"] = bool((t == (PATTERN ^ o)).all().item())
                        res["tensor_device"] = str(t.device)
                    else:
                        reads[f"{o}:{p.name}"] = drv.read(buf.ptr, 4096, rank) == bytes(
                            [PATTERN ^ o]) * 4096
            _sync(spec, rank, "read")
        res["reads"] = reads
        if spec.get("hold"):
            # published and holding (its ledger lease too) until the test says release
            Path(spec["out"], f"published-{rank}").touch()
            deadline = time.monotonic() + 120
            while not Path(spec["hold"]).exists() and time.monotonic() < deadline:
                time.sleep(0.05)
        if spec.get("alias_regression"):
            from tests.runtime.test_alias_regression import alias_regression, pick_live_rows

            res["alias_bad"] = alias_regression(pub, pick_live_rows(g, 0), ranks=[rank])
        pub.release()
    if probe is not None:
        deadline = time.monotonic() + 30   # a dead peer's imports of ours go when it does
        res["free_after"] = probe.free_memory(rank)[0]
        while res["free_after"] != res["free_before"] and time.monotonic() < deadline:
            time.sleep(0.5)
            res["free_after"] = probe.free_memory(rank)[0]
        # hold here, aborted but alive, while the test measures the other GPU
        Path(spec["out"], f"aborted-{rank}").touch()
        if spec.get("close_ctx_stage"):
            # then, still alive, release this process's primary context (kvgrant's
            # driver and the probe are its only holders) and hold again
            deadline = time.monotonic() + 120
            while not Path(spec["out"], "closectx").exists() and time.monotonic() < deadline:
                time.sleep(0.1)
            probe.close()
            drv.close()
            Path(spec["out"], f"ctxclosed-{rank}").touch()
        deadline = time.monotonic() + 120
        while not Path(spec["out"], "measured").exists() and time.monotonic() < deadline:
            time.sleep(0.1)
        probe.close()
    res["live"] = drv.live().as_dict()
    if not cuda:
        res["open_shareables"] = drv.open_shareables()
        res["shared"] = len(drv._shared)
        res["used"] = list(drv._used)
    else:
        drv.close()
    res["fdlist"] = _fdlist()
    return res


def _sigint_sweep(spec: dict[str, Any], rank: int, g: Any, record: dict[str, Any]
                  ) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """The ``sigint`` scenario: a clean attempt (its driver calls counted), then one
    attempt per set of ranks and k where those ranks get a SIGINT after their k-th call."""
    out = Path(spec["out"])
    clean = _attempt(spec, rank, g, record, None, None, None)
    (out / f"calls{rank}").write_text(str(clean.get("calls", 0)))
    _sync(spec, rank, "clean")
    calls = {r: int((out / f"calls{r}").read_text()) for r in range(spec["world"])}
    attempts = []
    for who in spec["sigint_sets"]:
        name = "".join(map(str, who))
        for k in range(1, min(calls[r] for r in who) + 1):
            trace = f"{spec['trace_dir']}/s{name}-k{k}-rank{rank}.ndjson"
            res = _attempt(spec, rank, g, record, trace, None, None,
                           k if rank in who else None)
            res.update(k=k, sigint=who)
            attempts.append(res)
    return clean, attempts


def _fdlist() -> dict[str, str]:
    """Open fds and what they are, minus gloo's TCP sockets (gloo opens and closes
    those on its own schedule; kvgrant never opens a TCP socket)."""
    tcp: set[str] = set()
    for table in ("/proc/self/net/tcp", "/proc/self/net/tcp6"):
        try:
            with open(table) as fh:
                tcp.update(line.split()[9] for line in list(fh)[1:])
        except OSError:
            pass
    out = {}
    for name in os.listdir("/proc/self/fd"):
        try:
            target = os.readlink(f"/proc/self/fd/{name}")
        except OSError:
            continue
        if target.startswith("socket:[") and target[8:-1] in tcp:
            continue
        out[name] = target
    return out


def _sync(spec: dict[str, Any], rank: int, what: str) -> None:
    """A file barrier between the scenario's steps (the group's own vote is done)."""
    d = Path(spec["out"]) / f"sync-{what}"
    d.mkdir(exist_ok=True)
    (d / str(rank)).touch()
    deadline = time.monotonic() + 30
    while len(list(d.iterdir())) < spec["world"] and time.monotonic() < deadline:
        time.sleep(0.01)


def main() -> None:
    spec = json.loads(Path(sys.argv[1]).read_text())
    rank = int(sys.argv[2])
    out = Path(spec["out"])
    import torch.distributed as dist

    store = dist.FileStore(spec["store"], spec["world"])
    dist.init_process_group("gloo", store=store, rank=rank, world_size=spec["world"])
    g = parse_geometry(spec["geometry"])
    record: dict[str, Any] = {"rank": rank, "pid": os.getpid()}
    try:
        record["fdlist0"] = _fdlist()
        trace_dir = spec.get("trace_dir")
        if spec["scenario"] == "once":
            faults = None
            if spec.get("fault_rank") == rank:
                faults = [Fault(nth=spec["fault_nth"])]
            kill_at = spec.get("kill_at") if spec.get("kill_rank") == rank else None
            trace = f"{trace_dir}/rank{rank}.ndjson" if trace_dir else None
            record["attempts"] = [_attempt(spec, rank, g, record, trace, faults, kill_at)]
        elif spec["scenario"] == "sigint":
            record["clean"], record["attempts"] = _sigint_sweep(spec, rank, g, record)
        else:
            clean = _attempt(spec, rank, g, record, None, None, None)
            record["clean"] = clean
            (out / f"calls{rank}").write_text(str(clean.get("calls", 0)))
            _sync(spec, rank, "clean")
            record["attempts"] = []
            for fr in spec["fault_ranks"]:
                calls = int((out / f"calls{fr}").read_text())
                for k in range(1, calls + 1):
                    faults = [Fault(nth=k)] if fr == rank else None
                    trace = f"{trace_dir}/f{fr}-k{k}-rank{rank}.ndjson" if trace_dir else None
                    res = _attempt(spec, rank, g, record, trace, faults, None)
                    res.update(k=k, fault_rank=fr)
                    record["attempts"].append(res)
    except BaseException:
        record["crash"] = traceback.format_exc()
    (out / f"rank{rank}.json").write_text(json.dumps(record))
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
