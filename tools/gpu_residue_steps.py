#!/usr/bin/env python3
"""Which driver call leaves per-process memory on a GPU (issue 13: the kill -9 residue).

tools/gpu_kill9_residue.py showed a group worker holding 64 KiB more per GPU than an
import-only process, even with its context released, until it exits. This tool walks
one process through the VMM calls kvgrant makes, one at a time, and after each step
reads every GPU's free memory through NVML from the parent (NVML creates no context).
It prints the bytes short of the baseline per GPU after each step, so the call that
adds a fixed per-process cost stands out. Needs 2 GPUs, cuda-bindings and NVML::

    python3 tools/gpu_residue_steps.py [--json FILE]
"""

from __future__ import annotations

import argparse
import json
import os
import runpy
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

ENV = {**os.environ, "CUDA_DEVICE_ORDER": "PCI_BUS_ID"}
MiB2 = 2 << 20

# The child: one step per line of stdin; it prints the step's name once done.
_CHILD = r'''
import os, sys
from cuda.bindings import driver as d

def ok(r):
    err = r[0] if isinstance(r, tuple) else r
    if err != d.CUresult.CUDA_SUCCESS:
        raise SystemExit(f"driver call failed: {err}")
    return r[1] if isinstance(r, tuple) and len(r) == 2 else r

FD = d.CUmemAllocationHandleType.CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR
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

S = 2 << 20
st = {}
def step(name):
    if name == "cuInit":
        ok(d.cuInit(0))
    elif name == "context-gpu0":
        st["dev0"] = ok(d.cuDeviceGet(0)); st["ctx"] = ok(d.cuDevicePrimaryCtxRetain(st["dev0"]))
        ok(d.cuCtxSetCurrent(st["ctx"]))
    elif name == "create-plain-gpu0":
        st["plain"] = ok(d.cuMemCreate(S, prop(0, False), 0))
    elif name == "create-exportable-gpu0":
        st["exp0"] = ok(d.cuMemCreate(S, prop(0, True), 0))
    elif name == "export-gpu0":
        st["fd0"] = ok(d.cuMemExportToShareableHandle(st["exp0"], FD, 0))
    elif name == "import-gpu0":
        st["imp0"] = ok(d.cuMemImportFromShareableHandle(st["fd0"], FD)); os.close(st["fd0"])
    elif name == "map-grant-gpu0":
        st["va"] = ok(d.cuMemAddressReserve(4 * S, 0, 0, 0))
        ok(d.cuMemMap(st["va"], S, 0, st["imp0"], 0))
        ok(d.cuMemSetAccess(st["va"], S, [access(0)], 1))
    elif name == "create-exportable-gpu1":
        st["exp1"] = ok(d.cuMemCreate(S, prop(1, True), 0))
    elif name == "export-import-gpu1":
        fd = ok(d.cuMemExportToShareableHandle(st["exp1"], FD, 0))
        st["imp1"] = ok(d.cuMemImportFromShareableHandle(fd, FD)); os.close(fd)
    elif name == "map-gpu1-grant-gpu0":
        va1 = int(st["va"]) + S
        ok(d.cuMemMap(va1, S, 0, st["imp1"], 0))
        ok(d.cuMemSetAccess(va1, S, [access(0)], 1))
    elif name == "release-all":
        va = int(st["va"])
        ok(d.cuMemUnmap(va, S)); ok(d.cuMemUnmap(va + S, S))
        for k in ("imp0", "imp1", "exp0", "exp1", "plain"):
            ok(d.cuMemRelease(st[k]))
        ok(d.cuMemAddressFree(st["va"], 4 * S))
    elif name == "context-released":
        ok(d.cuCtxSetCurrent(d.CUcontext(0)))
        ok(d.cuDevicePrimaryCtxRelease(st["dev0"]))
    print(name, flush=True)

for line in sys.stdin:
    step(line.strip())
'''

STEPS = ("started", "cuInit", "context-gpu0", "create-plain-gpu0", "create-exportable-gpu0",
         "export-gpu0", "import-gpu0", "map-grant-gpu0", "create-exportable-gpu1",
         "export-import-gpu1", "map-gpu1-grant-gpu0", "release-all", "context-released")


def _nvml() -> Any:
    tool = runpy.run_path(str(Path(__file__).with_name("gpu_kill9_residue.py")))
    return tool["Nvml"]()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--json", help="also write the figures here")
    args = ap.parse_args(argv)
    nvml = _nvml()
    base = nvml.free()
    rows: list[tuple[str, list[int]]] = []
    child = subprocess.Popen([sys.executable, "-c", _CHILD], stdin=subprocess.PIPE,
                             stdout=subprocess.PIPE, text=True, env=ENV)
    try:
        assert child.stdin and child.stdout
        time.sleep(1.0)
        rows.append(("started", [b - f for b, f in zip(base, nvml.free())]))
        for name in STEPS[1:]:
            child.stdin.write(name + "\n")
            child.stdin.flush()
            got = child.stdout.readline().strip()
            if got != name:
                raise SystemExit(f"child stopped at {name!r} (said {got!r})")
            time.sleep(0.5)
            rows.append((name, [b - f for b, f in zip(base, nvml.free())]))
        child.stdin.close()
        child.wait(timeout=60)
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()
    time.sleep(1.0)
    rows.append(("exited", [b - f for b, f in zip(base, nvml.free())]))
    print("bytes short of the baseline per GPU after each step [GPU 0, GPU 1] (NVML):")
    prev = [0, 0]
    for name, short in rows:
        step = [s - p for s, p in zip(short, prev)]
        print(f"  {name:<24} {short!s:<28} step {step}")
        prev = short
    if args.json:
        Path(args.json).write_text(json.dumps({"baseline_free": base, "rows": rows}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
