#!/usr/bin/env python3
"""Measure this host's driver-handle budget: how many (mapping, device) grants it holds.

Plain cuda-python, no kvgrant: one 2 MiB allocation (the granularity) is mapped again
and again, each mapping granted to ``--devices-per-grant`` devices, until
``cuMemSetAccess`` (or ``cuMemMap``) fails; then everything is unwound and the count is
printed. This is how the default budget (docs/drivers.md) was measured on 2 x H200 with
driver 580: 524,007 grants in a fresh process, 523,880 with PyTorch loaded; two
processes at once failed at 265,147 + 258,740 = 523,887 together, so the budget is one
pool per host. Give kvgrant your figure with ``--handle-budget``.

It drives the GPU to resource exhaustion, so it runs only when asked explicitly
(``--i-know-the-gpu-is-idle``) on a host where nothing else uses the GPUs: anything else
mapping VMM memory meanwhile would fail, and would lower the figure.

    python tools/measure_handle_budget.py --i-know-the-gpu-is-idle            # GPU 0
    python tools/measure_handle_budget.py --i-know-the-gpu-is-idle --device 1 --import-torch
    python tools/measure_handle_budget.py --i-know-the-gpu-is-idle --processes 2 --gpus 0,1

With ``--processes N`` it starts N copies of itself at once (GPUs taken from ``--gpus`` in
turn); each holds its grants until all have failed, so their sum is the host's pool.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from typing import Any, Sequence

CHUNK = 1 << 16        # mappings per VA reservation (128 GiB of VA at 2 MiB)
DEFAULT_LIMIT = 4_000_000


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="measure_handle_budget.py",
        description="Count (mapping, device) grants until cuMemSetAccess fails; unwind; "
                    "print the figure. Run only on an idle host.")
    p.add_argument("--i-know-the-gpu-is-idle", dest="idle", action="store_true",
                   help="required: this exhausts the driver's handles for the whole host")
    p.add_argument("--device", type=int, default=0, help="CUDA ordinal (default 0)")
    p.add_argument("--devices-per-grant", type=int, default=1, metavar="K",
                   help="grant each mapping to K devices, --device first (default 1)")
    p.add_argument("--limit", type=int, default=DEFAULT_LIMIT, metavar="N",
                   help=f"stop after N mappings even without a failure (default {DEFAULT_LIMIT:,})")
    p.add_argument("--import-torch", action="store_true",
                   help="import torch and initialise CUDA through it first (as an engine would)")
    p.add_argument("--processes", type=int, default=1, metavar="N",
                   help="run N processes at once; their grants together are the host's pool")
    p.add_argument("--gpus", default=None, metavar="LIST",
                   help="comma-separated ordinals for the processes, used in turn (default: "
                        "--device for all)")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.add_argument("--go-file", default=None, help=argparse.SUPPRESS)   # child: start signal
    p.add_argument("--hold", action="store_true", help=argparse.SUPPRESS)  # child: wait stdin
    return p


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    """Parse and check the arguments (no CUDA import: safe on any machine)."""
    p = build_parser()
    args = p.parse_args(argv)
    if not args.idle:
        p.error("refusing to run without --i-know-the-gpu-is-idle: this exhausts the driver's "
                "handle pool of the whole host (every process and GPU on it)")
    for name in ("device", "devices_per_grant", "limit", "processes"):
        v = getattr(args, name)
        if v < (0 if name == "device" else 1):
            p.error(f"--{name.replace('_', '-')} = {v}: must be >= "
                    f"{0 if name == 'device' else 1}")
    if args.gpus is not None:
        try:
            args.gpus = [int(x) for x in args.gpus.split(",")]
        except ValueError:
            p.error(f"--gpus = {args.gpus!r}: must be comma-separated integers")
        if not args.gpus or min(args.gpus) < 0:
            p.error(f"--gpus = {args.gpus!r}: need one or more ordinals >= 0")
    else:
        args.gpus = [args.device]
    return args


# --------------------------------------------------------------------- one process
def _check(res: Any, call: str) -> None:
    from cuda.bindings import driver as cu

    if res != cu.CUresult.CUDA_SUCCESS:
        raise RuntimeError(f"{call} failed: {res.name}")


def measure(device: int, per_grant: int, limit: int, go_file: str | None = None,
            hold: bool = False) -> dict[str, Any]:
    """Map one G-sized allocation until a grant fails; unwind; return the figures."""
    from cuda.bindings import driver as cu

    (res,) = cu.cuInit(0)
    _check(res, "cuInit")
    res, n_dev = cu.cuDeviceGetCount()
    _check(res, "cuDeviceGetCount")
    if per_grant > n_dev or device >= n_dev:
        raise SystemExit(f"--device {device} --devices-per-grant {per_grant}: this host has "
                         f"{n_dev} GPU(s)")
    devs = [(device + i) % n_dev for i in range(per_grant)]
    ctxs: dict[int, tuple[Any, Any]] = {}   # ordinal -> (CUdevice, primary context)
    for d in sorted(set(devs)):
        res, dev = cu.cuDeviceGet(d)
        _check(res, "cuDeviceGet")
        res, ctx = cu.cuDevicePrimaryCtxRetain(dev)
        _check(res, "cuDevicePrimaryCtxRetain")
        ctxs[d] = (dev, ctx)
    (res,) = cu.cuCtxSetCurrent(ctxs[device][1])
    _check(res, "cuCtxSetCurrent")
    prop = cu.CUmemAllocationProp()
    prop.type = cu.CUmemAllocationType.CU_MEM_ALLOCATION_TYPE_PINNED
    prop.location.type = cu.CUmemLocationType.CU_MEM_LOCATION_TYPE_DEVICE
    prop.location.id = device
    res, G = cu.cuMemGetAllocationGranularity(
        prop, cu.CUmemAllocationGranularity_flags.CU_MEM_ALLOC_GRANULARITY_MINIMUM)
    _check(res, "cuMemGetAllocationGranularity")
    res, free0, total = cu.cuMemGetInfo()
    _check(res, "cuMemGetInfo")
    res, handle = cu.cuMemCreate(G, prop, 0)
    _check(res, "cuMemCreate")
    descs = []
    for d in devs:
        desc = cu.CUmemAccessDesc()  # one object per device (a shared one grants wrong ones)
        desc.location.type = cu.CUmemLocationType.CU_MEM_LOCATION_TYPE_DEVICE
        desc.location.id = d
        desc.flags = cu.CUmemAccess_flags.CU_MEM_ACCESS_FLAGS_PROT_READWRITE
        descs.append(desc)
    reservations: list[tuple[int, int]] = []   # (va, mappings in it)
    grants, failed_call, result = 0, None, "CUDA_SUCCESS"
    if go_file:
        print(json.dumps({"ready": True, "pid": os.getpid(), "device": device}), flush=True)
        while not os.path.exists(go_file):
            time.sleep(0.01)
    t0 = time.perf_counter()
    try:
        while grants < limit and failed_call is None:
            res, base = cu.cuMemAddressReserve(CHUNK * G, G, 0, 0)
            if res != cu.CUresult.CUDA_SUCCESS:
                failed_call, result = "cuMemAddressReserve", res.name
                break
            reservations.append((int(base), 0))
            for i in range(CHUNK):
                if grants >= limit:
                    break
                va = int(base) + i * G
                (res,) = cu.cuMemMap(va, G, 0, handle, 0)
                if res != cu.CUresult.CUDA_SUCCESS:
                    failed_call, result = "cuMemMap", res.name
                    break
                reservations[-1] = (int(base), i + 1)
                (res,) = cu.cuMemSetAccess(va, G, descs, len(descs))
                if res != cu.CUresult.CUDA_SUCCESS:
                    failed_call, result = "cuMemSetAccess", res.name
                    break
                grants += 1
        elapsed = time.perf_counter() - t0
        res, free_full, _ = cu.cuMemGetInfo()
        out = {"pid": os.getpid(), "device": device, "granted_devices": devs,
               "mappings_granted": grants, "grants": grants * len(devs),
               "failed_call": failed_call, "result": result, "granularity": int(G),
               "free_before": int(free0), "free_at_failure": int(free_full),
               "total": int(total), "seconds": round(elapsed, 3)}
        if hold:
            print(json.dumps(out), flush=True)
            sys.stdin.readline()
    finally:
        undo_errors = []
        for base, n in reversed(reservations):
            if n:
                (res,) = cu.cuMemUnmap(base, n * G)  # whole mappings: one call per reservation
                if res != cu.CUresult.CUDA_SUCCESS:
                    undo_errors.append(f"cuMemUnmap: {res.name}")
            (res,) = cu.cuMemAddressFree(base, CHUNK * G)
            if res != cu.CUresult.CUDA_SUCCESS:
                undo_errors.append(f"cuMemAddressFree: {res.name}")
        (res,) = cu.cuMemRelease(handle)
        if res != cu.CUresult.CUDA_SUCCESS:
            undo_errors.append(f"cuMemRelease: {res.name}")
    res, free1, _ = cu.cuMemGetInfo()
    for dev, _ in ctxs.values():
        cu.cuDevicePrimaryCtxRelease(dev)
    out.update(free_after=int(free1), unwound=not undo_errors, undo_errors=undo_errors)
    return out


# ------------------------------------------------------------------ many processes
def _answer(p: "subprocess.Popen[str]") -> dict[str, Any]:
    line = p.stdout.readline()  # type: ignore[union-attr]
    if not line:
        raise RuntimeError(f"process {p.pid} ended without an answer (exit status {p.wait()})")
    return json.loads(line)


def run_many(args: argparse.Namespace) -> dict[str, Any]:
    """Start the processes together, let each fail, then release them all."""
    go = os.path.join(tempfile.mkdtemp(prefix="kvgrant-measure-"), "go")
    procs = []
    try:
        for i in range(args.processes):
            gpu = args.gpus[i % len(args.gpus)]
            cmd = [sys.executable, os.path.abspath(__file__), "--i-know-the-gpu-is-idle",
                   "--device", str(gpu), "--devices-per-grant", str(args.devices_per_grant),
                   "--limit", str(args.limit), "--go-file", go, "--hold"]
            if args.import_torch:
                cmd.append("--import-torch")
            procs.append(subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                          text=True))
        for p in procs:
            _answer(p)  # ready
        open(go, "w").close()
        held = [_answer(p) for p in procs]
        for p in procs:
            p.stdin.write("\n")  # type: ignore[union-attr]
            p.stdin.flush()  # type: ignore[union-attr]
        done = [_answer(p) for p in procs]
        for p in procs:
            p.wait(timeout=600)
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    return {"processes": done, "grants_total": sum(d["grants"] for d in held),
            "unwound": all(d["unwound"] for d in done)}


def _print(out: dict[str, Any]) -> None:
    if "processes" in out:
        for d in out["processes"]:
            _print(d)
        parts = " + ".join(f"{d['grants']:,}" for d in out["processes"])
        print(f"host total: {parts} = {out['grants_total']:,} grants "
              f"(unwound: {'yes' if out['unwound'] else 'NO'})")
        return
    print(f"pid {out['pid']} device {out['device']}: {out['grants']:,} (mapping, device) grants "
          f"({out['mappings_granted']:,} mappings x {len(out['granted_devices'])} devices), "
          f"then {out['failed_call'] or 'no failure (limit)'} -> {out['result']}; "
          f"free {out['free_before'] / 2**30:.2f} GiB before, "
          f"{out['free_at_failure'] / 2**30:.2f} at failure, {out['free_after'] / 2**30:.2f} "
          f"after unwinding ({'clean' if out['unwound'] else out['undo_errors']})")


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    if args.import_torch:
        import torch

        torch.cuda.init()
    try:
        if args.processes > 1:
            out = run_many(args)
        else:
            out = measure(args.device, args.devices_per_grant, args.limit, args.go_file,
                          args.hold)
    except (RuntimeError, ImportError) as e:  # no driver, no GPU, a child that failed
        print(f"measure_handle_budget.py: error: {e}", file=sys.stderr)
        return 1
    if args.json or args.hold:
        print(json.dumps(out), flush=True)
    else:
        _print(out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
