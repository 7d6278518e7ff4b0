"""The group runtime on two real GPUs: two processes, one per GPU (marks gpu, gpu2).

Run on a host with 2 VMM GPUs (and torch with CUDA)::

    .venv/bin/python -m pytest -q -m gpu2 tests/runtime/test_group_gpu.py

The layout is the published DCP8 layout scaled to 2 ranks that import each other
(``on_ranks``), as ``kvgrant alloc --ranks 2`` runs it. Workers are
tests/runtime/_group_worker.py with ``backend: cuda``.
"""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from kvgrant.layout.geometry import load_geometry, on_ranks, parse_geometry
from kvgrant.layout.plans import make_plan

from tests.runtime.conftest import _cuda_devices
from tests.runtime.test_group_sim import ROOT, run_group

pytestmark = [pytest.mark.gpu, pytest.mark.gpu2]

EXAMPLES = ROOT / "examples"
_FREE = ("from cuda.bindings import driver as d\n"
         "d.cuInit(0)\n"
         "out = []\n"
         "for i in range(2):\n"
         "    _, dev = d.cuDeviceGet(i)\n"
         "    _, ctx = d.cuDevicePrimaryCtxRetain(dev)\n"
         "    d.cuCtxSetCurrent(ctx)\n"
         "    _, free, total = d.cuMemGetInfo()\n"
         "    out.append(int(free))\n"
         "print(out)\n")


@pytest.fixture(autouse=True)
def _two_gpus() -> None:
    if _cuda_devices() < 2:
        pytest.skip(f"needs 2 CUDA GPUs with VMM support, found {_cuda_devices()}")
    if importlib.util.find_spec("torch") is None:  # the workers import it, not pytest
        pytest.skip("needs torch with CUDA (pip install 'kvgrant[group]')")


def _published_on_2() -> dict[str, Any]:
    return on_ranks(load_geometry(EXAMPLES / "published-dcp8.json"), 2).model_dump()


def _free_memory() -> list[int]:
    """Free bytes of GPUs 0 and 1, measured by a fresh process (its own contexts are
    the same every time, so two measurements compare)."""
    out = subprocess.run([sys.executable, "-c", _FREE], capture_output=True, text=True,
                         timeout=120, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


_STAND_IN = ("import sys\n"
             "from cuda.bindings import driver as d\n"
             "d.cuInit(0)\n"
             "_, dev = d.cuDeviceGet(0)\n"
             "_, ctx = d.cuDevicePrimaryCtxRetain(dev)\n"
             "d.cuCtxSetCurrent(ctx)\n"
             "print('ready', flush=True)\n"
             "sys.stdin.readline()\n")


def _free_memory_beside_a_survivor() -> list[int]:
    """:func:`_free_memory` while a stand-in for the survivor lives: a process with a
    context on GPU 0 and nothing else. The driver keeps 64 KiB per GPU for every further
    CUDA process on the host (tools/gpu_residue_bisect.py, docs/group.md), so a survivor's
    GPU 1 is compared with a baseline taken beside a process like it, not beside none."""
    p = subprocess.Popen([sys.executable, "-c", _STAND_IN], stdin=subprocess.PIPE,
                         stdout=subprocess.PIPE, text=True)
    try:
        assert p.stdout is not None and p.stdout.readline().strip() == "ready"
        return _free_memory()
    finally:
        p.communicate(timeout=120)  # closes its stdin: it exits


def test_two_processes_grant_only_their_own_device_and_read_the_peer_through_it(
        tmp_path: Path) -> None:
    recs = run_group(tmp_path, _published_on_2(), backend="cuda", access=True, pattern=True,
                     alias_regression=True, timeout_s=120)
    for r, rec in enumerate(recs):
        (a,) = rec["attempts"]
        assert a["ok"], a.get("error")
        assert a["imports_from"] == [1 - r]
        # cuMemGetAccess on every own and imported mapping: only this process's device
        assert a["access_checked"] > 0 and a["access_wrong"] == [], a["access_wrong"][:5]
        # a kernel on this GPU read the bytes the other process wrote into its planes
        assert a["reads"] and all(a["reads"].values()), a["reads"]
        assert a["tensor_device"] == f"cuda:{r}"
        assert a["alias_bad"] == [], a["alias_bad"][:5]
        assert a["live"] == {"handles": 0, "mappings": 0, "grants": 0, "reserved_bytes": 0,
                             "reservations": 0}


def test_kill_9_during_start_up_leaves_both_gpus_free_once_the_survivor_aborted(
        tmp_path: Path) -> None:
    g = _published_on_2()
    plan = make_plan(parse_geometry(g), "packed")
    A = len(plan.allocations)
    aliased = sum(a.region is not None for a in plan.allocations)
    # rank 1 dies a hundred calls into its imports: it has made, exported and sent all its
    # allocations, and rank 0 may hold imported handles of them when it aborts
    kill_at = 3 + 4 * A + 2 * aliased + 100
    before = _free_memory()
    beside = _free_memory_beside_a_survivor()
    seen: dict[str, list[int]] = {}

    def measure_while_the_survivor_waits(procs: list[subprocess.Popen[bytes]]) -> None:
        marker = tmp_path / "aborted-0"
        deadline = time.monotonic() + 200
        while not marker.exists() and time.monotonic() < deadline:
            time.sleep(0.2)
        if marker.exists():
            # rank 1 is dead, rank 0 has aborted (its imports of rank 1 released) and
            # still runs, holding only its context on GPU 0: GPU 1 must be as it is
            # beside a process that never allocated
            seen["held"] = _free_memory()
            deadline = time.monotonic() + 10     # in case the driver frees late
            while seen["held"][1] != beside[1] and time.monotonic() < deadline:
                time.sleep(1)
                seen["held"] = _free_memory()
        (tmp_path / "measured").touch()

    recs = run_group(tmp_path, g, backend="cuda", kill_rank=1, kill_at=kill_at, timeout_s=60,
                     free_check=True, watch=measure_while_the_survivor_waits)
    assert recs[1] is None
    (a,) = recs[0]["attempts"]
    assert not a["ok"] and a["missing"] == [1] and "rank 1 died" in a["error"], a
    assert a["live"]["handles"] == a["live"]["mappings"] == a["live"]["reservations"] == 0
    # GPU 0, measured by the survivor after its abort: what it made is gone
    assert a["free_after"] == a["free_before"], (a["free_before"], a["free_after"])
    assert "held" in seen, "the survivor never reported its abort"
    deadline = time.monotonic() + 60
    after = _free_memory()
    while after != before and time.monotonic() < deadline:  # the driver frees on exit
        time.sleep(1)
        after = _free_memory()
    # both checks, with every figure in the message (GPU 1 while the survivor lives, and
    # both GPUs once every process has exited)
    figures = (f"free before {before}, beside a stand-in survivor {beside}, after the abort "
               f"{seen['held']}, after exit {after}")
    assert seen["held"][1] == beside[1] and after == before, figures
