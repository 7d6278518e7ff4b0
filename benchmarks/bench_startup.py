"""Start-up and release wall time per plan, and kvgrant's own share of it.

One geometry, one run per plan: the naive plan, the reference rule, the packed plan
and a floor of one allocation per plane with no aliases. The driver serialises VMM
calls across a host, so start-up follows the number of driver objects; the figure
that matters is seconds per driver object. A timing proxy around the driver sums the
time spent inside driver calls, so kvgrant's own time (everything else between
Reserve and Publish) can be shown to stay under 5% of start-up; the packed plan is
also run with tracing on to show tracing costs under 5%.

Usage (2 GPUs)::

    python benchmarks/bench_startup.py examples/published-dcp16.json --ranks 2 \\
        --backend cuda --memory-limit=-8G

Without ``--ranks`` the topology is used as written (16 ranks need 16 devices; the sim
backend simulates them).
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Sequence

from kvgrant.errors import HandleBudgetError
from kvgrant.layout.geometry import Geometry, on_ranks, load_geometry, parse_geometry
from kvgrant.layout.plan import Allocation, PhysicalPlan
from kvgrant.runtime.allocator import allocate
from kvgrant.runtime.capacity import fit_pages
from kvgrant.runtime.driver import Driver, open_driver

__all__ = ["TimedDriver", "floor_plan", "main", "scaled"]

_TIMED = ("reserve", "free_address", "create", "release", "map", "unmap", "set_access")


class TimedDriver:
    """Forwards to a driver and sums wall time spent inside the VMM calls."""

    def __init__(self, inner: Driver) -> None:
        self._inner = inner
        self.name = inner.name
        self.seconds = 0.0
        self.calls = 0
        for meth in _TIMED:
            setattr(self, meth, self._timed(getattr(inner, meth)))

    def _timed(self, fn: Any) -> Any:
        clock = time.perf_counter

        def call(*args: Any, **kwargs: Any) -> Any:
            t0 = clock()
            try:
                return fn(*args, **kwargs)
            finally:
                self.seconds += clock() - t0
                self.calls += 1
        return call

    def reset(self) -> None:
        self.seconds = 0.0
        self.calls = 0

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)


scaled = on_ranks  # kvgrant.layout.geometry.on_ranks


def floor_plan(g: Geometry) -> PhysicalPlan:
    """One allocation per plane, no aliases: the fewest objects any plan could make."""
    return PhysicalPlan("floor", g, tuple(Allocation(p.name, 0, g.plane_bytes(p.name))
                                          for p in g.planes))


def _one(g: Geometry, plan: Any, drv: TimedDriver, memory_limit: str | None,
         trace: Path | None) -> dict[str, Any]:
    drv.reset()
    label = plan if isinstance(plan, str) else plan.label
    t_all = time.perf_counter()
    pub = allocate(g, plan=plan, driver=drv, memory_limit=memory_limit,  # type: ignore[arg-type]
                   check_contract=label != "floor", trace=trace if trace else None)
    wall = time.perf_counter() - t_all
    start_driver = drv.seconds
    start_calls = drv.calls
    drv.reset()
    pub.release()
    release_driver = drv.seconds
    c = pub.counts
    s = pub.startup_s
    return {
        "plan": label, "ranks": c.ranks, "pages": pub.capacity.pages,
        "allocations": c.allocations, "mappings": c.mappings, "objects": c.objects,
        "driver_calls": start_calls, "grants": c.grants,
        "startup_s": round(s, 6), "release_s": round(pub.release_s or 0.0, 6),
        "startup_driver_s": round(start_driver, 6), "release_driver_s": round(release_driver, 6),
        "s_per_object": s / c.objects, "s_per_call": s / max(start_calls, 1),
        "own_share": (s - start_driver) / s if s else 0.0,
        "plan_and_preflight_s": round(wall - s, 6), "traced": trace is not None,
    }


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("geometry", nargs="?", default="examples/published-dcp16.json")
    ap.add_argument("--ranks", type=int, default=None, help="scale the topology to N ranks")
    ap.add_argument("--backend", choices=("auto", "cuda", "sim"), default="auto")
    ap.add_argument("--memory-limit", default=None)
    ap.add_argument("--plans", default="naive,reference,packed,floor")
    ap.add_argument("--trace-repeats", type=int, default=3,
                    help="packed runs with tracing off and on, alternating (best of each)")
    ap.add_argument("--json", action="store_true", help="print one JSON object instead")
    ap.add_argument("--json-out", default=None, metavar="FILE",
                    help="also write the JSON object to FILE")
    args = ap.parse_args(argv)

    g = load_geometry(args.geometry)
    if args.ranks:
        g = scaled(g, args.ranks)
    opts: dict[str, Any] = {}
    backend = args.backend
    if backend == "auto":
        from kvgrant.runtime.cuda import cuda_available

        backend = "cuda" if cuda_available() else "sim"
    if backend == "sim":
        opts["devices"] = g.topology.ranks
    drv = TimedDriver(open_driver(backend, **opts))
    rows: list[dict[str, Any]] = []
    refused: list[str] = []
    try:
        # fit pages once, before any plan, so every plan allocates the same bytes
        free = {d: drv.free_memory(d)[0] for d in range(g.topology.ranks)}
        fit = fit_pages(g, free, args.memory_limit)
        if fit.reduced:
            g = parse_geometry({**g.model_dump(), "pages": fit.pages})
        for label in args.plans.split(","):
            plan: Any = floor_plan(g) if label == "floor" else label
            try:
                rows.append(_one(g, plan, drv, None, None))
            except HandleBudgetError as err:  # pre-flight refusal: report, go on
                refused.append(f"{label}: refused by pre-flight, demand {err.demand:,} > "
                               f"budget {err.budget:,}")
        pair: dict[bool, list[dict[str, Any]]] = {False: [], True: []}
        if "packed" in args.plans.split(","):
            # tracing off/on, alternating, so neither side always runs later
            with tempfile.TemporaryDirectory() as tmp:
                for _ in range(args.trace_repeats):
                    for traced in (False, True):
                        pair[traced].append(_one(g, "packed", drv, None,
                                                 Path(tmp) / "t.ndjson" if traced else None))
            rows.append(min(pair[True], key=lambda r: r["startup_s"]))
    finally:
        drv.close()
    trace_cost = per_event = None
    if pair[True]:
        off = min(r["startup_s"] for r in pair[False])
        on = min(r["startup_s"] for r in pair[True])
        trace_cost = on / off - 1.0
        own_off = min(r["startup_s"] - r["startup_driver_s"] for r in pair[False])
        own_on = min(r["startup_s"] - r["startup_driver_s"] for r in pair[True])
        per_event = (own_on - own_off) / pair[True][0]["driver_calls"]
    meta = {"geometry": g.name, "backend": drv.name, "ranks": g.topology.ranks,
            "command": " ".join(["python", *sys.argv]), "trace_overhead": trace_cost, "trace_s_per_event": per_event,
            "trace_repeats": args.trace_repeats, "refused": refused,
            "packed_runs": {"untraced": [r["startup_s"] for r in pair[False]],
                            "traced": [r["startup_s"] for r in pair[True]]}}
    if args.json_out:
        Path(args.json_out).write_text(json.dumps({"meta": meta, "rows": rows}, indent=1))
    if args.json:
        print(json.dumps({"meta": meta, "rows": rows}))
        return 0
    print(f"geometry {g.name}, {g.topology.ranks} ranks, backend {drv.name}")
    hdr = (f"{'plan':<10}{'traced':>7}{'pages':>7}{'allocs':>9}{'mappings':>10}{'objects':>9}"
           f"{'calls':>9}{'start s':>10}{'release s':>11}{'us/object':>11}{'us/call':>9}"
           f"{'own %':>8}")
    print(hdr)
    for r in rows:
        print(f"{r['plan']:<10}{'yes' if r['traced'] else 'no':>7}{r['pages']:>7}"
              f"{r['allocations']:>9}{r['mappings']:>10}{r['objects']:>9}{r['driver_calls']:>9}"
              f"{r['startup_s']:>10.4f}{r['release_s']:>11.4f}{r['s_per_object'] * 1e6:>11.2f}"
              f"{r['s_per_call'] * 1e6:>9.2f}{r['own_share'] * 100:>8.2f}")
    for line in refused:
        print(line)
    if trace_cost is not None and per_event is not None:
        print(f"tracing on vs off (packed start-up, best of {args.trace_repeats} alternating "
              f"runs each): {trace_cost * 100:+.2f}%; kvgrant's own time per traced event "
              f"{per_event * 1e6:.2f} us")
    return 0


if __name__ == "__main__":
    sys.exit(main())
