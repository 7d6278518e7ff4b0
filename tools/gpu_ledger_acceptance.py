#!/usr/bin/env python3
"""Issue #12's acceptance run: two kvgrant processes on two GPUs share one handle pool.

On 2 x H200 (``--backend cuda``; run only on an idle host)::

    python tools/gpu_ledger_acceptance.py --i-know-the-gpus-are-idle

1. Measure the host's budget H with ``tools/measure_handle_budget.py`` with three
   processes at once on the devices the run uses (and, for the record, one process
   alone), unless ``--handle-budget`` gives it.
2. Write a one-rank geometry of N aliased 2 MiB chunks (naive plan: N allocations, 2N
   mappings, each granted to its own device: demand D = 2N handles, 2 MiB x N of memory).
3. Start a *filler* that kvgrant cannot see (plain driver calls, no ledger entry), holding
   F = H - D - N grants on device 0: it stands for NCCL, PyTorch or another engine, and
   ``--handle-reserve F`` tells kvgrant about it. (Why a filler: a kvgrant rank maps each
   allocation at most twice, so one process on one 141 GB GPU cannot demand more than
   about 140k handles; two cannot overdraw 524k alone.)
4. Process A on device 0 allocates the geometry and holds it (ledger: D).
5. Process B on device 1, pre-flight on: refused by the ledger, naming A.
6. Process B on device 1, pre-flight off: fails in cuMemSetAccess with
   CUDA_ERROR_OUT_OF_MEMORY; its grants at failure against the prediction H - F - D
   (the criterion: within 0.1% of H), and it unwinds everything.
7. A and the filler release; the ledger is empty; free memory on every device is back at
   its baseline (each read in a fresh process).

``--backend sim`` runs the same steps on the simulated driver with a shared pool file
(no GPU; H defaults to 523,880), to check the script itself. Prints every figure and
``ACCEPTANCE: PASS`` or ``FAIL``; ``--json-out FILE`` saves them.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Sequence

ROOT = Path(__file__).resolve().parents[1]
MEASURE = ROOT / "tools" / "measure_handle_budget.py"
G = 2 << 20
TIMEOUT_S = 540


# --------------------------------------------------------------------------- workers
def _driver(backend: str, devices: int) -> Any:
    from kvgrant.runtime.driver import open_driver

    return open_driver(backend) if backend == "cuda" else open_driver("sim", devices=devices,
                                                                      handle_budget=_sim_budget())


def _sim_budget() -> int:
    return int(os.environ["ACCEPT_SIM_BUDGET"])


def worker_free(backend: str, devices: list[int]) -> None:
    drv = _driver(backend, max(devices) + 1)
    print(json.dumps({str(d): drv.free_memory(d)[0] for d in devices}), flush=True)
    drv.close()


def worker_fill(backend: str, device: int, count: int) -> None:
    """Hold ``count`` grants on ``device`` (one G allocation mapped ``count`` times), no
    ledger entry; release on a line from stdin."""
    drv = _driver(backend, device + 1)
    va = drv.reserve(count * G, device=device)
    h = drv.create(G, device)
    done = 0
    try:
        for i in range(count):
            drv.map(va + i * G, G, h)
            drv.set_access(va + i * G, G, [device])
            done += 1
        print(json.dumps({"ok": True, "pid": os.getpid(), "grants": done}), flush=True)
        sys.stdin.readline()
    except Exception as e:  # report, then unwind
        print(json.dumps({"ok": False, "grants": done, "error": str(e)}), flush=True)
    finally:
        mapped = done + (1 if done < count and _mapped(drv, va + done * G, device) else 0)
        if mapped:
            drv.unmap(va, mapped * G)
        drv.release(h)
        drv.free_address(va, count * G)
        print(json.dumps({"released": True, "live_empty": drv.live().is_empty()}), flush=True)
        drv.close()


def _mapped(drv: Any, va: int, device: int) -> bool:
    try:
        drv.get_access(va, device)
        return True
    except Exception:  # noqa: BLE001 - unmapped address
        return False


def worker_alloc(backend: str, geometry: str, device: int, ledger: str, budget: int,
                 reserve: int, preflight: bool) -> None:
    from kvgrant.errors import AllocationError, HandleBudgetError, KVGrantError
    from kvgrant.runtime.allocator import allocate

    opts = {"devices": 2, "handle_budget": _sim_budget()} if backend == "sim" else None
    t0 = time.perf_counter()
    try:
        pub = allocate(geometry, plan="naive", backend=backend, devices=[device], ledger=ledger,
                       handle_budget=budget, handle_reserve=reserve, preflight=preflight,
                       driver_options=opts)
    except KVGrantError as err:
        out: dict[str, Any] = {"ok": False, "pid": os.getpid(), "kind": type(err).__name__,
                               "error": str(err), "seconds": round(time.perf_counter() - t0, 3)}
        if isinstance(err, HandleBudgetError):
            out.update(demand=err.demand, held=err.held, holders=err.holders)
        if isinstance(err, AllocationError):
            out.update(call=err.call, result=err.result_name, live=err.live,
                       cleanup_errors=[str(e) for e in err.cleanup_errors],
                       free_before=err.free_before, free_after=err.free_after)
        print(json.dumps(out), flush=True)
        return
    print(json.dumps({"ok": True, "pid": os.getpid(), "grants": pub.counts.grants,
                      "startup_s": round(pub.startup_s, 3)}), flush=True)
    sys.stdin.readline()
    pub.release()
    print(json.dumps({"released": True, "live_empty": pub.driver.live().is_empty()}),
          flush=True)


# ----------------------------------------------------------------------- orchestration
def write_geometry(path: Path, n: int) -> None:
    doc = {"name": f"acceptance-{2 * n}-handles", "granularity": G, "pages": n,
           "page_tokens": 16, "planes": [{"name": "p", "bytes_per_page": G}],
           "regions": [{"name": "r", "rows": n, "row_bytes": G, "access": "owner"}],
           "aliases": [{"region": "r", "offset": i * G, "plane": "p", "plane_offset": i * G,
                        "length": G} for i in range(n)],
           "topology": {"ranks": 1}}
    path.write_text(json.dumps(doc))


class Run:
    """The child processes of the run; every one is ended when the run ends."""

    def __init__(self, env: dict[str, str]) -> None:
        self.env = env
        self.procs: list[subprocess.Popen[str]] = []

    def start(self, *args: str) -> subprocess.Popen[str]:
        p = subprocess.Popen([sys.executable, __file__, *args], stdin=subprocess.PIPE,
                             stdout=subprocess.PIPE, text=True, env=self.env)
        self.procs.append(p)
        return p

    @staticmethod
    def line(p: subprocess.Popen[str]) -> dict[str, Any]:
        text = p.stdout.readline()  # type: ignore[union-attr]
        if not text:
            raise RuntimeError(f"process {p.pid} ended without an answer (rc {p.wait()})")
        return json.loads(text)

    def release(self, p: subprocess.Popen[str]) -> dict[str, Any]:
        p.stdin.write("\n")  # type: ignore[union-attr]
        p.stdin.flush()  # type: ignore[union-attr]
        out = self.line(p)
        p.wait(timeout=TIMEOUT_S)
        return out

    def once(self, *args: str) -> dict[str, Any]:
        p = self.start(*args)
        out = self.line(p)
        p.wait(timeout=TIMEOUT_S)
        return out

    def end(self) -> None:
        for p in self.procs:
            if p.poll() is None:
                p.kill()
            p.wait(timeout=60)
            for f in (p.stdin, p.stdout):
                if f is not None:
                    f.close()


def measure_budget(gpus: list[int]) -> int:
    """The host's pool with ``len(gpus)`` processes alive at once (one per entry)."""
    cmd = [sys.executable, str(MEASURE), "--i-know-the-gpu-is-idle", "--json"]
    cmd += (["--device", str(gpus[0])] if len(gpus) == 1 else
            ["--processes", str(len(gpus)), "--gpus", ",".join(map(str, gpus))])
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=TIMEOUT_S, check=True)
    res = json.loads(out.stdout.strip().splitlines()[-1])
    each = res.get("processes", [res])
    if any(r["failed_call"] != "cuMemSetAccess" or not r["unwound"] for r in each):
        raise RuntimeError(f"the measurement did not end as expected: {res}")
    return int(res.get("grants_total", res.get("grants", 0)))


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--backend", choices=("cuda", "sim"), default="cuda")
    p.add_argument("--i-know-the-gpus-are-idle", dest="idle", action="store_true",
                   help="required for cuda: the run exhausts the host's driver handles")
    p.add_argument("--allocations", type=int, default=50_000, metavar="N",
                   help="2 MiB chunks per process (demand 2N handles; default 50,000 = "
                        "97.7 GiB)")
    p.add_argument("--handle-budget", type=int, default=None, metavar="H",
                   help="the host's budget (cuda default: measured first; sim: 523,880)")
    p.add_argument("--devices", default="0,1", help="GPU of A (and the filler), GPU of B")
    p.add_argument("--json-out", default=None, metavar="FILE")
    args = p.parse_args(argv)
    if args.backend == "cuda" and not args.idle:
        p.error("refusing to run on cuda without --i-know-the-gpus-are-idle: it exhausts the "
                "driver-handle pool of the whole host")
    dev_a, dev_b = (int(x) for x in args.devices.split(","))
    n = args.allocations
    tmp = Path(tempfile.mkdtemp(prefix="kvgrant-accept-"))
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    env.pop("KVGRANT_LEDGER", None)
    ledger = str(tmp / "ledger.json")
    fig: dict[str, Any] = {"backend": args.backend, "allocations": n, "demand": 2 * n,
                           "devices": [dev_a, dev_b], "ledger": ledger}
    checks: dict[str, bool] = {}
    run = Run(env)
    try:
        if args.handle_budget is not None:
            budget, how = args.handle_budget, "given"
        elif args.backend == "sim":
            budget, how = 523_880, "sim default"
        else:
            # the pool as this run will use it: 3 processes (filler and A on dev_a, B on
            # dev_b); each process's context takes a few handles of its own
            t = time.perf_counter()
            one = measure_budget([dev_b])
            budget = measure_budget([dev_a, dev_a, dev_b])
            fig["budget_one_process"] = one
            how = (f"measured with 3 processes at once on devices {dev_a},{dev_a},{dev_b}; "
                   f"one process alone: {one:,} ({time.perf_counter() - t:.1f} s)")
        env["ACCEPT_SIM_BUDGET"] = str(budget)
        env["KVGRANT_SIM_POOL"] = str(tmp / "sim-pool") if args.backend == "sim" else ""
        demand = 2 * n
        filler = budget - demand - n
        predicted = budget - filler - demand
        fig.update(budget=budget, budget_how=how, filler=filler, predicted_b_grants=predicted)
        print(f"host budget H = {budget:,} ({how})")
        if filler < 0:
            raise SystemExit(f"--allocations {n}: demand 3N = {3 * n:,} exceeds H")
        geo = tmp / "geometry.json"
        write_geometry(geo, n)
        base = run.once("worker-free", args.backend, f"{dev_a},{dev_b}")
        fig["free_baseline"] = base
        print(f"free memory at baseline: {base}")

        f = run.start("worker-fill", args.backend, str(dev_a), str(filler))
        out_f = run.line(f)
        fig["filler_out"] = out_f
        print(f"filler (no ledger entry; kvgrant's --handle-reserve): pid {f.pid}, "
              f"{out_f.get('grants', 0):,} grants on device {dev_a}")
        checks["filler holds F"] = bool(out_f["ok"]) and out_f["grants"] == filler

        common = [str(geo), ledger, str(budget), str(filler)]
        a = run.start("worker-alloc", args.backend, str(dev_a), *common, "1")
        out_a = run.line(a)
        fig["a"] = out_a
        print(f"A: pid {a.pid} device {dev_a}: {json.dumps(out_a)}")
        checks["A published with D grants"] = bool(out_a["ok"]) and out_a["grants"] == demand

        out_b1 = run.once("worker-alloc", args.backend, str(dev_b), *common, "1")
        fig["b_preflight"] = out_b1
        print(f"B with pre-flight, device {dev_b}: {out_b1.get('kind')}: {out_b1.get('error')}")
        checks["B refused by the ledger naming A"] = (
            out_b1.get("kind") == "HandleBudgetError"
            and [h["pid"] for h in out_b1.get("holders", [])] == [a.pid])

        out_b2 = run.once("worker-alloc", args.backend, str(dev_b), *common, "0")
        fig["b_no_preflight"] = out_b2
        actual = (out_b2.get("live") or {}).get("grants")
        print(f"B without pre-flight, device {dev_b}: {out_b2.get('kind')} in "
              f"{out_b2.get('call')} -> {out_b2.get('result')}")
        checks["B failed in cuMemSetAccess with OOM"] = (
            out_b2.get("call") == "cuMemSetAccess"
            and out_b2.get("result") == "CUDA_ERROR_OUT_OF_MEMORY")
        if actual is not None:
            diff = actual - predicted
            fig.update(actual_b_grants=actual, difference=diff,
                       difference_pct_of_budget=round(100.0 * diff / budget, 4))
            print(f"  grants at failure: actual {actual:,}, predicted H - F - D = {predicted:,}, "
                  f"difference {diff:+,} ({100.0 * diff / budget:+.4f}% of H)")
            checks["within 0.1% of H"] = abs(diff) <= 0.001 * budget
        checks["B unwound cleanly"] = ("after unwinding: nothing left" in out_b2.get("error", "")
                                       and not out_b2.get("cleanup_errors"))

        rel_a = run.release(a)
        rel_f = run.release(f)
        fig.update(a_release=rel_a, filler_release=rel_f)
        checks["A and filler released"] = rel_a.get("live_empty") is True and \
            rel_f.get("live_empty") is True
        from kvgrant.runtime.ledger import HostLedger

        left = HostLedger(ledger).holders()
        fig["ledger_after"] = [h.as_dict() for h in left]
        checks["ledger empty"] = not left
        after = run.once("worker-free", args.backend, f"{dev_a},{dev_b}")
        fig["free_after"] = after
        delta = {d: after[d] - base[d] for d in base}
        fig["free_delta"] = delta
        print(f"free memory after: {after} (difference from baseline: {delta})")
        checks["free memory back at baseline"] = all(abs(v) <= G for v in delta.values())
    finally:
        run.end()
    fig["checks"] = checks
    ok = bool(checks) and all(checks.values())
    for name, good in checks.items():
        print(f"  [{'ok' if good else 'FAILED'}] {name}")
    print(f"ACCEPTANCE: {'PASS' if ok else 'FAIL'}")
    if args.json_out:
        Path(args.json_out).write_text(json.dumps(fig, indent=1))
    return 0 if ok else 1


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1].startswith("worker-"):
        cmd, backend, *rest = sys.argv[1:]
        if cmd == "worker-free":
            worker_free(backend, [int(x) for x in rest[0].split(",")])
        elif cmd == "worker-fill":
            worker_fill(backend, int(rest[0]), int(rest[1]))
        else:
            dev, geo, led, bud, res, pre = rest[0], rest[1], rest[2], rest[3], rest[4], rest[5]
            worker_alloc(backend, geo, int(dev), led, int(bud), int(res), pre == "1")
        sys.exit(0)
    sys.exit(main())
