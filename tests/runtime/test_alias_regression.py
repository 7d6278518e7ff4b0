"""The alias regression: a released snapshot's KV pages may be reused without touching
any live row.

Each row of every region is filled (through the region mapping) with a distinct byte
per chunk; then the rows of released snapshots are given up and every KV page that no
live row owns (by the *declared* conflict sets, the ones the scheduler uses) is
overwritten through the plane mappings; every live row must still hold its bytes. A
physical plan whose aliasing differs from the declared conflict sets fails this.
Runs on the simulator and, marked gpu/gpu2, on two real GPUs (torch views if torch is
installed, else driver copies).
"""

from __future__ import annotations

import os
import random
from pathlib import Path
from typing import Iterable

import pytest

from kvgrant.layout.conflicts import declared_conflict_sets
from kvgrant.layout.geometry import Geometry
from kvgrant.layout.plan import PhysicalPlan
from kvgrant.runtime.allocator import Published, allocate

from tests.runtime._small import G, chunk_plan, scaled, small_geometry

OVERWRITE = 0xFF


class Memory:
    """Fill and compare device bytes: torch views when possible, driver copies otherwise."""

    def __init__(self, pub: Published) -> None:
        self.pub = pub
        self.drv = pub.driver
        self.torch = None
        if getattr(self.drv, "name", "") == "cuda":
            try:
                import torch  # noqa: F401

                self.torch = torch
            except ModuleNotFoundError:
                pass

    def fill(self, va: int, n: int, value: int, device: int) -> None:
        if self.torch is not None:
            from kvgrant.runtime.views import DeviceBuffer

            DeviceBuffer(va, n, device).as_tensor().fill_(value)
        else:
            self.drv.write(va, bytes([value]) * n, device)  # type: ignore[attr-defined]

    def holds(self, va: int, n: int, value: int, device: int) -> bool:
        if self.torch is not None:
            from kvgrant.runtime.views import DeviceBuffer

            t = DeviceBuffer(va, n, device).as_tensor()
            return bool((t == value).all().item())
        return self.drv.read(va, n, device) == bytes([value]) * n  # type: ignore[attr-defined]

    def sync(self) -> None:
        if self.torch is not None:
            self.torch.cuda.synchronize()


def _chunk_values(plan: PhysicalPlan) -> dict[int, int]:
    """A byte 1..254 per aliased allocation; neighbours in a region differ."""
    aliased = sorted((a.region, a.region_offset, i) for i, a in enumerate(plan.allocations)
                     if a.region is not None)
    return {i: 1 + k % 254 for k, (_, _, i) in enumerate(aliased)}


def _merge(pages: Iterable[int]) -> list[tuple[int, int]]:
    out: list[tuple[int, int]] = []
    for p in sorted(pages):
        if out and out[-1][1] == p:
            out[-1] = (out[-1][0], p + 1)
        else:
            out.append((p, p + 1))
    return out


def alias_regression(pub: Published, live_rows: dict[str, set[int]], *,
                     conflicts: dict[tuple[str, int], frozenset[int]] | None = None,
                     ranks: Iterable[int] | None = None) -> list[str]:
    """Run the regression on ``pub``; return one line per corrupted (rank, row, chunk)."""
    g, plan = pub.geometry, pub.plan
    mem = Memory(pub)
    values = _chunk_values(plan)
    sets = declared_conflict_sets(g) if conflicts is None else conflicts
    owned = set().union(*(sets[(reg, row)] for reg, rows in live_rows.items() for row in rows))
    free_ranges = _merge(set(range(g.pages)) - owned)
    # (region, row) -> [(row-relative start, length, value)] for the rows' bytes
    pieces: dict[tuple[str, int], list[tuple[int, int, int]]] = {}
    for i, a in enumerate(plan.allocations):
        if a.region is None:
            continue
        reg = g.region_by_name[a.region]
        start = a.region_offset or 0
        end = min(start + a.length, reg.rows * reg.row_bytes)
        row = start // reg.row_bytes
        while row * reg.row_bytes < end:
            s = max(start, row * reg.row_bytes)
            e = min(end, (row + 1) * reg.row_bytes)
            pieces.setdefault((a.region, row), []).append((s - row * reg.row_bytes, e - s, values[i]))
            row += 1
    bad: list[str] = []
    for r in (range(pub.ranks) if ranks is None else ranks):
        dev = pub.devices[r]
        # 1. every row, every chunk: its own byte
        for (region, row), parts in pieces.items():
            base = pub.row_va(r, region, row)
            for off, n, v in parts:
                mem.fill(base + off, n, v, dev)
        mem.sync()
        # 2. released snapshots give their pages back: overwrite every page no live row owns
        for p in g.planes:
            bpp = p.bytes_per_page
            for s, e in free_ranges:
                mem.fill(pub.plane_va[r][p.name] + s * bpp, (e - s) * bpp, OVERWRITE, dev)
        mem.sync()
        # 3. every live row still holds its bytes
        for region, rows in live_rows.items():
            for row in sorted(rows):
                base = pub.row_va(r, region, row)
                for off, n, v in pieces.get((region, row), []):
                    if not mem.holds(base + off, n, v, dev):
                        bad.append(f"rank {r} {region} row {row} bytes [{off}, {off + n}) "
                                   f"lost pattern {v:#x}")
    return bad


def pick_live_rows(g: Geometry, seed: int = 0) -> dict[str, set[int]]:
    """About half of each region's rows stay live (at least one; one released if >1 rows)."""
    rng = random.Random(seed)
    out: dict[str, set[int]] = {}
    for reg in g.regions:
        rows = list(range(reg.rows))
        rng.shuffle(rows)
        keep = max(1, reg.rows // 2)
        out[reg.name] = set(rows[:keep])
    return out


def _plans(g: Geometry) -> list[PhysicalPlan]:
    from kvgrant.layout.plans import make_plan

    return [chunk_plan(g)] + [make_plan(g, label) for label in ("naive", "reference", "packed")]


# --------------------------------------------------------------------------- sim
EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
SMALL_EXAMPLES = ["small.json", "small-fine-rows.json", "small-inward.json"]


def _geometry(name: str) -> Geometry:
    if name == "test":
        return small_geometry()
    from kvgrant.layout.geometry import load_geometry

    path = EXAMPLES / name
    if not path.exists():
        pytest.skip(f"{path} not present")
    return load_geometry(path)


@pytest.mark.parametrize("name", ["test", *SMALL_EXAMPLES])
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_alias_regression_sim(name: str, seed: int) -> None:
    from kvgrant.runtime.sim import SimDriver

    g = _geometry(name)
    for plan in _plans(g):
        drv = SimDriver(devices=g.topology.ranks)
        with allocate(g, plan=plan, driver=drv) as pub:
            assert alias_regression(pub, pick_live_rows(g, seed)) == [], plan.label
        assert drv.live().is_empty()


def test_alias_regression_detects_a_wrong_conflict_set() -> None:
    """Drop one page from a live row's conflict set: the overwrite must corrupt that row."""
    from kvgrant.runtime.sim import SimDriver

    g = small_geometry()
    sets = dict(declared_conflict_sets(g))
    live = {"snapshot": {0}, "exec": {0}}
    victim = min(sets[("snapshot", 0)])
    sets[("snapshot", 0)] = sets[("snapshot", 0)] - {victim}
    with allocate(g, plan=chunk_plan(g), driver=SimDriver(devices=3)) as pub:
        bad = alias_regression(pub, live, conflicts=sets, ranks=[0])
    assert bad and all("snapshot row 0" in b for b in bad)


def test_alias_regression_detects_a_plan_that_moves_bytes() -> None:
    """A plan that swaps which plane bytes back two chunks of different pages breaks the
    declared conflict sets; the regression sees it."""
    from kvgrant.runtime.sim import SimDriver

    g = small_geometry()
    plan = chunk_plan(g)
    allocs = list(plan.allocations)
    # swap the region ranges of the snapshot chunks at plane a offset 0 and 2G
    i = next(k for k, a in enumerate(allocs) if a.plane == "a" and a.plane_offset == 0)
    j = next(k for k, a in enumerate(allocs) if a.plane == "a" and a.plane_offset == 2 * G)
    ai, aj = allocs[i], allocs[j]
    allocs[i] = type(ai)(ai.plane, ai.plane_offset, ai.length, aj.region, aj.region_offset)
    allocs[j] = type(aj)(aj.plane, aj.plane_offset, aj.length, ai.region, ai.region_offset)
    moved = PhysicalPlan("moved", g, tuple(allocs))
    live = {"snapshot": {1}, "exec": {0}}  # row 1 holds region bytes [2G, 4G)
    with allocate(g, plan=moved, driver=SimDriver(devices=3), check_contract=False) as pub:
        assert alias_regression(pub, live, ranks=[0])


# ---------------------------------------------------------------------------- gpu
def _cuda_driver_or_skip(n: int):  # type: ignore[no-untyped-def]
    from kvgrant.runtime.cuda import cuda_available

    if not cuda_available():
        pytest.skip("needs CUDA GPUs with VMM support")
    from kvgrant.runtime.cuda import CudaDriver

    drv = CudaDriver()
    if drv.device_count() < n:
        drv.close()
        pytest.skip(f"needs {n} CUDA GPUs, found {drv.device_count()}")
    return drv


@pytest.mark.gpu
@pytest.mark.gpu2
@pytest.mark.parametrize("name", ["test", *SMALL_EXAMPLES])
def test_alias_regression_cuda_small(tmp_path: Path, name: str) -> None:
    g = scaled(_geometry(name), 2)
    drv = _cuda_driver_or_skip(2)
    out = Path(os.environ.get("KVGRANT_GPU_OUT") or tmp_path)
    traces = []
    try:
        for k, plan in enumerate(_plans(g)):
            t = out / f"h200-{Path(name).stem}-{k}-{plan.label}-2rank.ndjson"
            with allocate(g, plan=plan, driver=drv, trace=t) as pub:
                assert alias_regression(pub, pick_live_rows(g, 0)) == [], plan.label
            assert drv.live().is_empty()
            traces.append(t)
    finally:
        drv.close()
    from kvgrant.conformance.replay import replay_file

    for t in traces:
        v = replay_file(t)
        assert v.accepted and v.final_phase == "Shutdown", v.summary()


@pytest.mark.gpu
@pytest.mark.gpu2
def test_alias_regression_cuda_published_scale(tmp_path: Path) -> None:
    path = Path(__file__).resolve().parents[2] / "examples" / "published-dcp16.json"
    if not path.exists():
        pytest.skip(f"{path} not present")
    from kvgrant.layout.geometry import load_geometry

    g = scaled(load_geometry(path), 2)
    drv = _cuda_driver_or_skip(2)
    out = Path(os.environ.get("KVGRANT_GPU_OUT") or tmp_path)
    trace = out / "h200-published-dcp16-packed-2rank.ndjson"
    try:
        with allocate(g, plan="packed", driver=drv, trace=trace) as pub:
            assert pub.capacity.snapshot_slots == g.region_by_name["snapshot"].rows
            assert pub.capacity.kv_tokens == pub.geometry.pages * g.page_tokens
            assert alias_regression(pub, pick_live_rows(pub.geometry, 0)) == []
        assert drv.live().is_empty()
    finally:
        drv.close()
    from kvgrant.conformance.replay import replay_file

    v = replay_file(trace)
    assert v.accepted and v.final_phase == "Shutdown", v.summary()
