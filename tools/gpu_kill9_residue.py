"""What a surviving process holds on a dead peer's GPU (issue 13: kill -9 on 2 x H200).

On H200 the kill -9 test found GPU 1 (the dead rank's GPU) 65,536 bytes short of its
baseline while the survivor, aborted with nothing live, still ran; both GPUs were at the
baseline once it exited. This tool measures that without adding contexts of its own:
free memory comes from NVML (no CUDA context at all; processes run with
CUDA_DEVICE_ORDER=PCI_BUS_ID so CUDA and NVML number the GPUs alike) and, as the test
did, from a fresh process that calls cuMemGetInfo on both GPUs (its own two contexts
cost the same every time, so deltas compare). Scenarios, each in fresh processes:

* ``import-only`` / ``import-map`` / ``import-grant``: a process on GPU 1 makes one
  exportable allocation and sends its fd; a process on GPU 0 imports it (and maps it,
  and grants GPU 0), then undoes all of it and stays alive after the owner has exited:
  what is left on GPU 1 is the importer's. Bisects the import from the mapping.
* In every scenario the living processes are measured twice: with their primary
  context still held (as the GPU test holds it: the worker's driver and probe), then
  after releasing it while still alive (a driver object kept per context, such as a peer
  mapping of GPU 1's memory for GPU 0's context, goes with the context; one kept per
  process goes only at exit).
* ``clean``: ``allocate_rank`` on 2 processes (published-dcp8 on 2 ranks), publish,
  release, both stay alive: GPU deltas while they live and after they exit.
* ``kill9``: the issue's scenario (rank 1 SIGKILLs itself 100 calls into its imports;
  rank 0 aborts and stays alive): GPU deltas while the survivor lives (polled for a few
  seconds, in case the driver frees late) and after it exits, and what the survivor
  holds: its open fds by kind, its /dev/nvidia* mappings, NVML's per-process memory.

    .venv/bin/python tools/gpu_kill9_residue.py [--json out.json] [--only kill9,clean]

Needs 2 GPUs, cuda-python, torch (the group workers) and libnvidia-ml.so.1. A dry run of its
steps without GPUs (simulated driver, NVML figures all zero): ``KVGRANT_RESIDUE_SIM=1 ...
--no-cuda-measure``.
"""

from __future__ import annotations

import argparse
import ctypes
import json
import os
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
WORKER = ROOT / "tests" / "runtime" / "_group_worker.py"
ENV = dict(os.environ, CUDA_DEVICE_ORDER="PCI_BUS_ID", PYTHONPATH=str(ROOT),
           PYTHONWARNINGS="ignore")
SCENARIOS = ("import-only", "import-map", "import-grant", "clean", "kill9")


# ------------------------------------------------------------------ NVML (no context)
class _Mem(ctypes.Structure):
    _fields_ = [("total", ctypes.c_ulonglong), ("free", ctypes.c_ulonglong),
                ("used", ctypes.c_ulonglong)]


class _Proc(ctypes.Structure):
    _fields_ = [("pid", ctypes.c_uint), ("usedGpuMemory", ctypes.c_ulonglong),
                ("gpuInstanceId", ctypes.c_uint), ("computeInstanceId", ctypes.c_uint)]


class Nvml:
    """Free bytes and per-process memory of GPUs 0 and 1 through NVML (ctypes)."""

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

    def processes(self) -> list[dict[int, int]]:
        """Per GPU: pid -> used bytes, as NVML attributes them (None: not reported)."""
        out = []
        fn = getattr(self.lib, "nvmlDeviceGetComputeRunningProcesses_v3", None)
        for h in self.handles:
            count = ctypes.c_uint(64)
            arr = (_Proc * 64)()
            if fn is None or fn(h, ctypes.byref(count), arr) != 0:
                out.append({})
                continue
            out.append({int(arr[i].pid): int(arr[i].usedGpuMemory) for i in range(count.value)})
        return out


_CUDA_FREE = (
    "from cuda.bindings import driver as d\n"
    "d.cuInit(0)\nout = []\n"
    "for i in range(2):\n"
    "    _, dev = d.cuDeviceGet(i)\n"
    "    _, ctx = d.cuDevicePrimaryCtxRetain(dev)\n"
    "    d.cuCtxSetCurrent(ctx)\n"
    "    _, free, total = d.cuMemGetInfo()\n"
    "    out.append(int(free))\n"
    "print(out)\n")


def cuda_free() -> list[int]:
    """The test's own measure: a fresh process with a context on each GPU."""
    out = subprocess.run([sys.executable, "-c", _CUDA_FREE], capture_output=True, text=True,
                         timeout=120, check=True, env=ENV)
    return json.loads(out.stdout.strip().splitlines()[-1])


def holdings(pid: int) -> dict[str, Any]:
    """What a live process holds, from /proc: fds by kind, /dev/nvidia* mappings."""
    kinds: dict[str, int] = {}
    odd: list[str] = []
    try:
        for name in os.listdir(f"/proc/{pid}/fd"):
            try:
                t = os.readlink(f"/proc/{pid}/fd/{name}")
            except OSError:
                continue
            k = t.split(":", 1)[0] if ":" in t else t if t.startswith("/dev/") else "file"
            kinds[k] = kinds.get(k, 0) + 1
            if not t.startswith(("/dev/nvidia", "socket:", "pipe:", "/dev/null", "/dev/pts")):
                odd.append(t)
        maps: dict[str, int] = {}
        with open(f"/proc/{pid}/maps") as fh:
            for line in fh:
                parts = line.split()
                if len(parts) >= 6 and parts[5].startswith("/dev/nvidia"):
                    maps[parts[5]] = maps.get(parts[5], 0) + 1
    except OSError as e:
        return {"error": str(e)}
    return {"fds": kinds, "other_fds": sorted(odd)[:40], "nvidia_maps": maps}


def _delta(now: list[int], base: list[int]) -> list[int]:
    return [b - n for n, b in zip(now, base)]   # bytes short of the baseline


# ---------------------------------------------------------- minimal import bisect
def _open_driver() -> Any:
    """CudaDriver; the simulated driver under KVGRANT_RESIDUE_SIM=1 (a dry run of this
    tool's steps on a machine without GPUs)."""
    if os.environ.get("KVGRANT_RESIDUE_SIM") == "1":
        from kvgrant.runtime.sim import SimDriver

        return SimDriver(devices=2)
    from kvgrant.runtime.cuda import CudaDriver

    return CudaDriver()


class _FakeNvml:
    """Zeros, for the dry run."""

    def free(self) -> list[int]:
        return [0, 0]

    def processes(self) -> list[dict[int, int]]:
        return [{}, {}]


def _owner(sock_path: str, dev: int) -> None:
    drv = _open_driver()
    size = drv.granularity(dev)
    h = drv.create(size, dev)
    fd = drv.export_handle(h)
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.connect(sock_path)
    socket.send_fds(s, [json.dumps({"size": size}).encode()], [fd])
    drv.close_shareable(fd)
    s.recv(16)               # the importer is done: release and exit
    drv.release(h)
    if hasattr(drv, "close"):
        drv.close()
    s.close()


def _importer(sock_path: str, dev: int, mode: str, marks: str) -> None:
    drv = _open_driver()
    drv.free_memory(dev)      # the same context the group's ranks make on their GPU
    srv = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    srv.bind(sock_path)
    srv.listen(1)
    Path(marks, "listening").touch()
    conn, _ = srv.accept()
    msg, fds, _, _ = socket.recv_fds(conn, 1024, 1)
    size = json.loads(msg)["size"]
    h = drv.import_handle(fds[0])
    os.close(fds[0])
    if mode != "import-only":
        va = drv.reserve(size, 0, dev)
        drv.map(va, size, h)
        if mode == "import-grant":
            drv.set_access(va, size, [dev])
        drv.unmap(va, size)
        drv.free_address(va, size)
    drv.release(h)
    live = drv.live().as_dict()
    conn.send(b"bye")
    conn.close()
    srv.close()
    Path(marks, "done").write_text(json.dumps(live))
    _wait(Path(marks, "closectx"), 120)
    if hasattr(drv, "close"):
        drv.close()           # its only holder: the primary context on GPU 0 goes
    Path(marks, "ctxclosed").touch()
    _wait(Path(marks, "measured"), 120)


def _wait(path: Path, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while not path.exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    return path.exists()


def bisect(mode: str, nvml: Nvml, tmp: Path) -> dict[str, Any]:
    d = tmp / mode
    d.mkdir()
    sock = str(d / "sock")
    me = [sys.executable, __file__]
    base = nvml.free()
    imp = subprocess.Popen(me + ["_importer", sock, "0", mode, str(d)], env=ENV)
    own = None
    try:
        if not _wait(d / "listening", 60):
            raise RuntimeError(f"{mode}: the importer did not start")
        own = subprocess.Popen(me + ["_owner", sock, "1"], env=ENV)
        if not _wait(d / "done", 60):
            raise RuntimeError(f"{mode}: the importer did not finish")
        own.wait(timeout=60)
        polls = []
        for _ in range(6):           # owner gone, importer alive: GPU 1 is the importer's
            polls.append(_delta(nvml.free(), base))
            time.sleep(0.5)
        procs = nvml.processes()
        held = holdings(imp.pid)
        (d / "closectx").touch()
        if not _wait(d / "ctxclosed", 60):
            raise RuntimeError(f"{mode}: the importer did not release its context")
        time.sleep(1)
        no_ctx = _delta(nvml.free(), base)
        (d / "measured").touch()
        imp.wait(timeout=60)
        after = _delta(nvml.free(), base)
        return {"scenario": mode, "live_in_importer": json.loads((d / "done").read_text()),
                "short_while_alive": polls[-1], "polls": polls,
                "short_alive_context_released": no_ctx,
                "nvml_processes": [{str(k): v for k, v in m.items()} for m in procs],
                "importer_pid": imp.pid, "holdings": held, "short_after_exit": after}
    finally:
        for p in (imp, own):
            if p is not None and p.poll() is None:
                p.kill()
                p.wait()


# ------------------------------------------------------------------ the group runs
def _group(tmp: Path, name: str, **spec: Any) -> tuple[list[subprocess.Popen[bytes]], Path]:
    from kvgrant.layout.geometry import load_geometry, on_ranks

    d = tmp / name
    d.mkdir()
    g = on_ranks(load_geometry(ROOT / "examples" / "published-dcp8.json"), 2).model_dump()
    full = {"store": str(d / "store"), "world": 2, "geometry": g, "out": str(d),
            "timeout_s": 60, "scenario": "once", "trace_dir": None,
            "backend": "sim" if os.environ.get("KVGRANT_RESIDUE_SIM") == "1" else "cuda",
            "free_check": True}
    full.update(spec)
    (d / "spec.json").write_text(json.dumps(full))
    procs = [subprocess.Popen([sys.executable, str(WORKER), str(d / "spec.json"), str(r)],
                              cwd=ROOT, env=ENV) for r in range(2)]
    return procs, d


def group_run(name: str, nvml: Nvml, tmp: Path, cuda_measure: bool) -> dict[str, Any]:
    from kvgrant.layout.geometry import load_geometry, on_ranks
    from kvgrant.layout.plans import make_plan

    base = nvml.free()
    base_cuda = cuda_free() if cuda_measure else None
    spec: dict[str, Any] = {}
    alive = [0, 1]
    if name == "kill9":
        plan = make_plan(on_ranks(load_geometry(ROOT / "examples" / "published-dcp8.json"), 2),
                         "packed")
        A = len(plan.allocations)
        aliased = sum(a.region is not None for a in plan.allocations)
        spec = {"kill_rank": 1, "kill_at": 3 + 4 * A + 2 * aliased + 100}
        alive = [0]
    spec["close_ctx_stage"] = True
    procs, d = _group(tmp, name, **spec)
    out: dict[str, Any] = {"scenario": name, "pids": [p.pid for p in procs]}
    try:
        if not all(_wait(d / f"aborted-{r}", 150) for r in alive):
            raise RuntimeError(f"{name}: the processes never reported (see stderr)")
        polls = []
        for _ in range(8):       # the survivor(s) alive, after release or abort
            polls.append(_delta(nvml.free(), base))
            time.sleep(0.5)
        out["short_while_alive"] = polls[-1]
        out["polls"] = polls
        if cuda_measure:
            out["short_while_alive_cuda_measure"] = _delta(cuda_free(), base_cuda)
        procs_mem = nvml.processes()
        # every process NVML lists per GPU (in a container its pids may be the host's)
        out["nvml_processes"] = [{str(pid): b for pid, b in m.items()} for m in procs_mem]
        out["holdings"] = {str(procs[r].pid): holdings(procs[r].pid) for r in alive}
        # still alive, with their primary contexts released (kvgrant's driver and the
        # probe were the only holders)
        (d / "closectx").touch()
        if not all(_wait(d / f"ctxclosed-{r}", 60) for r in alive):
            raise RuntimeError(f"{name}: the processes did not release their contexts")
        time.sleep(1)
        out["short_alive_context_released"] = _delta(nvml.free(), base)
        if cuda_measure:
            out["short_alive_context_released_cuda_measure"] = _delta(cuda_free(), base_cuda)
        (d / "measured").touch()
        for p in procs:
            p.wait(timeout=120)
        after = _delta(nvml.free(), base)
        deadline = time.monotonic() + 20
        while any(after) and time.monotonic() < deadline:
            time.sleep(0.5)
            after = _delta(nvml.free(), base)
        out["short_after_exit"] = after
        if cuda_measure:
            out["short_after_exit_cuda_measure"] = _delta(cuda_free(), base_cuda)
        recs = {}
        for r in alive:
            rec = json.loads((d / f"rank{r}.json").read_text())
            a = rec["attempts"][0]
            extra = {k: v for k, v in a["fdlist"].items() if rec["fdlist0"].get(k) != v}
            recs[r] = {"ok": a["ok"], "error": a.get("error", "")[:300], "live": a["live"],
                       "free_before_own_gpu": a.get("free_before"),
                       "free_after_own_gpu": a.get("free_after"),
                       "fds_opened_and_kept": extra}
        out["ranks"] = recs
        return out
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["_owner"]:
        _owner(argv[1], int(argv[2]))
        return 0
    if argv[:1] == ["_importer"]:
        _importer(argv[1], int(argv[2]), argv[3], argv[4])
        return 0
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--only", default=",".join(SCENARIOS),
                    help=f"comma-separated subset of {', '.join(SCENARIOS)}")
    ap.add_argument("--json", type=Path, help="also write every figure here")
    ap.add_argument("--no-cuda-measure", action="store_true",
                    help="NVML only (skip the test's fresh-process cuMemGetInfo measure)")
    a = ap.parse_args(argv)
    nvml: Any = _FakeNvml() if os.environ.get("KVGRANT_RESIDUE_SIM") == "1" else Nvml()
    t0 = time.monotonic()
    results = []
    with tempfile.TemporaryDirectory(prefix="kvgrant-residue-") as tmp:
        idle = [_delta(nvml.free(), nvml.free()) for _ in range(3)]
        print(f"NVML noise at rest (3 pairs, bytes): {idle}", flush=True)
        for name in a.only.split(","):
            t = time.monotonic()
            try:
                if name.startswith("import"):
                    r = bisect(name, nvml, Path(tmp))
                else:
                    r = group_run(name, nvml, Path(tmp), not a.no_cuda_measure)
            except Exception as e:  # noqa: BLE001 - report and go on
                r = {"scenario": name, "error": f"{type(e).__name__}: {e}"}
            r["seconds"] = round(time.monotonic() - t, 1)
            results.append(r)
            print(json.dumps(r, indent=1), flush=True)
    print("\nbytes short of the baseline per GPU [GPU 0, GPU 1] (NVML):")
    for r in results:
        print(f"  {r['scenario']:13s} alive {r.get('short_while_alive')}  alive, context "
              f"released {r.get('short_alive_context_released')}  after exit "
              f"{r.get('short_after_exit')}  (cuda-measure alive "
              f"{r.get('short_while_alive_cuda_measure')})  {r.get('error', '')}")
    print(f"total {time.monotonic() - t0:.0f} s")
    if a.json:
        a.json.write_text(json.dumps({"idle": idle, "results": results}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
