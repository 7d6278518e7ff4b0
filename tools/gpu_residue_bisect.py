#!/usr/bin/env python3
"""Which part of a group worker leaves 64 KiB per GPU until exit (issue 13, kill -9 residue).

The kill -9 GPU test found a dead rank's GPU 65,536 bytes short while the survivor lived.
A group worker differs from a one-process allocation in scale and company: reservations
of tens of GiB, thousands of exported and imported handles, torch and its gloo group,
other CUDA processes on the host. Each scenario here runs in a fresh process that does
one of those things, undoes it, releases its context and stays alive (beside 0-2 idle
CUDA processes); the parent reads every GPU's free memory through NVML (no context of
its own) then, and after every process exited. Findings: docs/group.md::

    python3 tools/gpu_residue_bisect.py [--json FILE] [--only a,b]
"""

from __future__ import annotations

import argparse
import ctypes
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

ENV = {**os.environ, "CUDA_DEVICE_ORDER": "PCI_BUS_ID"}

_PRELUDE = r'''
import os, sys
from cuda.bindings import driver as d

def ok(r):
    err = r[0] if isinstance(r, tuple) else r
    if err != d.CUresult.CUDA_SUCCESS:
        raise SystemExit(f"driver call failed: {err}")
    return r[1] if isinstance(r, tuple) and len(r) == 2 else r

FD = d.CUmemAllocationHandleType.CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR
S = 2 << 20
GiB = 1 << 30

def prop(dev, exportable):
    p = d.CUmemAllocationProp()
    p.type = d.CUmemAllocationType.CU_MEM_ALLOCATION_TYPE_PINNED
    p.location.type = d.CUmemLocationType.CU_MEM_LOCATION_TYPE_DEVICE
    p.location.id = dev
    if exportable:
        p.requestedHandleTypes = FD
    return p

def access(dev):
    a = d.CUmemAccessDesc()
    a.location.type = d.CUmemLocationType.CU_MEM_LOCATION_TYPE_DEVICE
    a.location.id = dev
    a.flags = d.CUmemAccess_flags.CU_MEM_ACCESS_FLAGS_PROT_READWRITE
    return a

ok(d.cuInit(0))
dev0 = ok(d.cuDeviceGet(0))
ctx = ok(d.cuDevicePrimaryCtxRetain(dev0))
ok(d.cuCtxSetCurrent(ctx))

def mapped(n, reserve, owner, grant, exportable=False, imported=False, spread=False):
    """n 2 MiB allocations on GPU ``owner``, mapped in a ``reserve``-byte range and
    granted to ``grant``, then undone; ``imported``: mapped through an imported handle."""
    va = int(ok(d.cuMemAddressReserve(reserve, 0, 0, 0)))
    step = (reserve // n) // S * S if spread else S
    made = []
    for k in range(n):
        h = ok(d.cuMemCreate(S, prop(owner, exportable or imported), 0))
        m = h
        if imported:
            fd = ok(d.cuMemExportToShareableHandle(h, FD, 0))
            m = ok(d.cuMemImportFromShareableHandle(fd, FD)); os.close(fd)
        ok(d.cuMemMap(va + k * step, S, 0, m, 0))
        ok(d.cuMemSetAccess(va + k * step, S, [access(g) for g in grant], len(grant)))
        made.append((h, m, va + k * step))
    for h, m, at in reversed(made):
        ok(d.cuMemUnmap(at, S))
        if m is not h:
            ok(d.cuMemRelease(m))
        ok(d.cuMemRelease(h))
    ok(d.cuMemAddressFree(va, reserve))
'''

_RELEASE = r'''
ok(d.cuCtxSetCurrent(d.CUcontext(0)))
ok(d.cuDevicePrimaryCtxRelease(dev0))
print("done", flush=True)
sys.stdin.readline()
'''

SCENARIOS: dict[str, str] = {
    "nothing": "",
    "reserve-50G": "va = ok(d.cuMemAddressReserve(50 * GiB, 0, 0, 0)); "
                   "ok(d.cuMemAddressFree(va, 50 * GiB))",
    "map-1-small-range": "mapped(1, 8 * S, 0, [0])",
    "map-2-spread-50G": "mapped(2, 50 * GiB, 0, [0], spread=True)",
    "map-64-spread-50G": "mapped(64, 50 * GiB, 0, [0], spread=True)",
    "map-4096-dense": "mapped(4096, 4096 * S, 0, [0])",
    "map-4096-exportable": "mapped(4096, 4096 * S, 0, [0], exportable=True)",
    "import-4096-own-gpu": "mapped(4096, 4096 * S, 0, [0], imported=True)",
    "import-4096-peer-gpu1": "mapped(4096, 4096 * S, 1, [0], imported=True)",
    "import-64-peer-spread-50G": "mapped(64, 50 * GiB, 1, [0], imported=True, spread=True)",
    "torch-import": "import torch",
    "torch-gloo": ("import tempfile, torch, torch.distributed as dist\n"
                   "f = tempfile.mktemp()\n"
                   "dist.init_process_group('gloo', init_method='file://' + f, rank=0, "
                   "world_size=1)\n"
                   "dist.barrier(); dist.destroy_process_group()"),
    "torch-cuda-tensor": ("import torch\n"
                          "x = torch.ones(16, device='cuda:0'); torch.cuda.synchronize(); "
                          "del x; torch.cuda.empty_cache()"),
}


class _Mem(ctypes.Structure):
    _fields_ = [("total", ctypes.c_ulonglong), ("free", ctypes.c_ulonglong),
                ("used", ctypes.c_ulonglong)]


class Nvml:
    """Free bytes of GPUs 0 and 1 through NVML (ctypes; no CUDA context)."""

    def __init__(self) -> None:
        self.lib = ctypes.CDLL("libnvidia-ml.so.1")
        self._ok(self.lib.nvmlInit_v2(), "nvmlInit_v2")
        self.handles = []
        for i in range(2):
            h = ctypes.c_void_p()
            self._ok(self.lib.nvmlDeviceGetHandleByIndex_v2(ctypes.c_uint(i),
                                                            ctypes.byref(h)), "GetHandle")
            self.handles.append(h)

    @staticmethod
    def _ok(rc: int, what: str) -> None:
        if rc != 0:
            raise RuntimeError(f"NVML {what} returned {rc}")

    def free(self) -> list[int]:
        out = []
        for h in self.handles:
            m = _Mem()
            self._ok(self.lib.nvmlDeviceGetMemoryInfo(h, ctypes.byref(m)), "GetMemoryInfo")
            out.append(int(m.free))
        return out


#: scenarios that are "nothing" with this many other CUDA processes alive beside it
COMPANIONS = {"nothing+1-other-process": 1, "nothing+2-other-processes": 2}
SCENARIOS.update({name: "" for name in COMPANIONS})


def _idle_cuda_process() -> subprocess.Popen[str]:
    """Another process of the host that has only called cuInit and holds a context on
    GPU 0 (as a group's survivor does), until its stdin closes."""
    p = subprocess.Popen([sys.executable, "-c", _PRELUDE + _RELEASE], stdin=subprocess.PIPE,
                         stdout=subprocess.PIPE, text=True, env=ENV)
    assert p.stdout is not None
    if p.stdout.readline().strip() != "done":
        raise SystemExit("an idle CUDA process failed to start")
    return p


def run(nvml: Any, name: str) -> dict[str, Any]:
    base = nvml.free()
    others = [_idle_cuda_process() for _ in range(COMPANIONS.get(name, 0))]
    child = subprocess.Popen([sys.executable, "-c", _PRELUDE + SCENARIOS[name] + "\n" + _RELEASE],
                             stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=ENV)
    try:
        assert child.stdin and child.stdout
        said = child.stdout.readline().strip()
        if said != "done":
            raise SystemExit(f"{name}: the child failed ({said!r})")
        time.sleep(0.5)
        alive = [b - f for b, f in zip(base, nvml.free())]
        child.stdin.close()
        child.wait(timeout=120)
    finally:
        for p in [child, *others]:
            if p.stdin and not p.stdin.closed:
                p.stdin.close()
            try:
                p.wait(timeout=120)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()
    time.sleep(0.5)
    exited = [b - f for b, f in zip(base, nvml.free())]
    return {"scenario": name, "alive_context_released": alive, "exited": exited}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--json", help="also write the figures here")
    ap.add_argument("--only", help="comma-separated scenarios (default: all)")
    args = ap.parse_args(argv)
    names = args.only.split(",") if args.only else list(SCENARIOS)
    nvml = Nvml()
    rows = []
    print("bytes short of the baseline [GPU 0, GPU 1] (NVML): alive with its context "
          "released / after exit")
    for name in names:
        row = run(nvml, name)
        rows.append(row)
        print(f"  {name:<28} {row['alive_context_released']!s:<28} {row['exited']}", flush=True)
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
