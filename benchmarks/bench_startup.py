"""Start-up and release wall time per plan, and kvgrant's own share of it.

One geometry, one run per plan: the naive plan, the reference rule, the packed plan
and a floor of one allocation per plane with no aliases. The driver serialises VMM
calls across a host, so start-up follows the number of driver objects; the figure
that matters is seconds per driver object. A timing proxy around the driver sums the
time spent inside driver calls, so kvgrant's own time (everything else between
Reserve and Publish) can be shown to stay under 5% of start-up. The cost of tracing
comes from ``--trace-pairs`` pairs of packed runs, untraced and traced back to back:
the same work varies by +-20% between runs on an H200 host, so the figure is a mean
of per-pair differences with a 95% bootstrap interval (see :func:`trace_cost`).

Usage (2 GPUs)::

    python benchmarks/bench_startup.py examples/published-dcp16.json --ranks 2 \\
        --backend cuda --trace-pairs 40

Without ``--ranks`` the topology is used as written (16 ranks need 16 devices; the sim
backend simulates them).
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Callable, Sequence

from kvgrant.errors import HandleBudgetError
from kvgrant.layout.geometry import Geometry, on_ranks, load_geometry, parse_geometry
from kvgrant.layout.plan import Allocation, PhysicalPlan
from kvgrant.layout.plans import make_plan
from kvgrant.runtime.allocator import allocate
from kvgrant.runtime.capacity import fit_pages
from kvgrant.runtime.driver import Driver, open_driver
from kvgrant.runtime.trace import DEFAULT_CHUNK, TraceWriter

__all__ = ["TimedDriver", "ab_rounds", "ci_line", "floor_plan", "main", "pooled_pairs",
           "scaled", "trace_cost"]

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
         trace: Path | None, *, checks: bool = True,
         chunk: int = DEFAULT_CHUNK) -> dict[str, Any]:
    drv.reset()
    label = plan if isinstance(plan, str) else plan.label
    # the writer is closed when the cache is released, so _events reads a whole file
    writer = TraceWriter(trace, chunk=chunk) if trace is not None else None
    t_all = time.perf_counter()
    pub = allocate(g, plan=plan, driver=drv, memory_limit=memory_limit,  # type: ignore[arg-type]
                   check_contract=checks and label != "floor", preflight=checks, trace=writer)
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
        "startup_events": _events(trace) if trace else 0,
    }


def _events(path: Path) -> int:
    """Events of the start-up in a trace: up to and including Publish."""
    n = 0
    with open(path, "rb") as fh:
        next(fh)  # header
        for line in fh:
            n += 1
            if b'"action": "Publish"' in line:
                break
    return n


def _mean_ci(xs: Sequence[float], *, resamples: int = 4000, seed: int = 1) -> tuple[float, float, float]:
    """Mean and a 95% bootstrap confidence interval (percentile method)."""
    rng = random.Random(seed)
    n = len(xs)
    means = sorted(statistics.fmean(rng.choices(xs, k=n)) for _ in range(resamples))
    return statistics.fmean(xs), means[int(0.025 * resamples)], means[int(0.975 * resamples) - 1]


def ab_rounds(run: Callable[[str], Any], variants: Sequence[str], rounds: int,
              seed: int) -> list[dict[str, Any]]:
    """One warm-up ``run("off")``, then ``rounds`` rounds of ``run("off")`` and
    ``run(v)`` for every variant, each round in a new random order (so no variant always
    runs first or last): one dict ``variant -> result`` per round."""
    run("off")
    rng = random.Random(seed)
    rows = []
    for _ in range(rounds):
        order = ["off", *variants]
        rng.shuffle(order)
        rows.append({v: run(v) for v in order})
    return rows


def ci_line(label: str, series: Sequence[tuple[str, Sequence[float]]]) -> str:
    """``label | name mean% [lo, hi] | ...``: each series' mean with its 95% interval."""
    cells = [f"{label:<11}"]
    for name, xs in series:
        m, lo, hi = _mean_ci(xs)
        cells.append(f"{name} {m * 100:+6.2f}% [{lo * 100:+.2f}, {hi * 100:+.2f}]")
    return " | ".join(cells)


def _progress(pairs: Sequence[tuple[dict[str, Any], dict[str, Any]]], total: int) -> None:
    """One line on stderr with the running figure (pairs take minutes on a GPU host)."""
    rel = [b["startup_s"] / a["startup_s"] - 1.0 for a, b in pairs]
    mean, lo, hi = _mean_ci(rel, resamples=1000)
    print(f"  pairs {len(pairs)}/{total}: tracing on vs off {mean * 100:+.2f}% "
          f"(95% CI {lo * 100:+.2f}% .. {hi * 100:+.2f}%)", file=sys.stderr, flush=True)


def trace_cost(pairs: Sequence[tuple[dict[str, Any], dict[str, Any]]]) -> dict[str, Any]:
    """Tracing on vs off from (untraced, traced) pairs run back to back.

    Driver time varies by +-20% from run to run on the H200 host (the same work took
    0.48-0.84 s in one sequence of 36 runs), so one pair says little: the figure is the mean of the per-pair
    relative differences with a bootstrap 95% interval, split into kvgrant's own time
    (measured precisely, outside driver calls) and time inside driver calls (where a
    thread holding the GIL would show up, and where the noise is).
    """
    off_med = statistics.median(a["startup_s"] for a, _ in pairs)
    rel = [b["startup_s"] / a["startup_s"] - 1.0 for a, b in pairs]
    own = [((b["startup_s"] - b["startup_driver_s"]) - (a["startup_s"] - a["startup_driver_s"]))
           for a, b in pairs]
    drv = [b["startup_driver_s"] - a["startup_driver_s"] for a, b in pairs]
    events = statistics.median(b["startup_events"] for _, b in pairs)
    mean, lo, hi = _mean_ci(rel)
    own_mean, own_lo, own_hi = _mean_ci(own)
    drv_mean, drv_lo, drv_hi = _mean_ci(drv)
    return {
        "pairs": len(pairs), "events": events, "untraced_median_s": off_med,
        "traced_median_s": statistics.median(b["startup_s"] for _, b in pairs),
        "relative_mean": mean, "relative_ci95": [lo, hi],
        "relative_median": statistics.median(rel),
        "own_share_mean": own_mean / off_med, "own_share_ci95": [own_lo / off_med, own_hi / off_med],
        "own_us_per_event": own_mean / events * 1e6,
        "driver_share_mean": drv_mean / off_med,
        "driver_share_ci95": [drv_lo / off_med, drv_hi / off_med],
    }


def pooled_pairs(paths: Sequence[str]) -> list[tuple[dict[str, Any], dict[str, Any]]]:
    """The (untraced, traced) pairs of earlier ``--json-out`` files, for one figure over
    several runs (each run on this host holds a few hundred pairs at most)."""
    pairs = []
    for path in paths:
        meta = json.loads(Path(path).read_text())["meta"]
        events = (meta.get("trace_cost") or {}).get("events", 0)
        for p in meta["trace_pairs"]:
            (us, ud), (ts, td) = p["untraced"], p["traced"]
            pairs.append(({"startup_s": us, "startup_driver_s": ud},
                          {"startup_s": ts, "startup_driver_s": td, "startup_events": events}))
    return pairs


def _print_cost(cost: dict[str, Any]) -> None:
    def pct(x: float) -> str:
        return f"{x * 100:+.2f}%"

    print(f"tracing on vs off, packed start-up, {cost['pairs']} pairs back to back "
          f"({cost['events']:,.0f} start-up events per traced run; median start-up untraced "
          f"{cost['untraced_median_s']:.4f} s, traced {cost['traced_median_s']:.4f} s):")
    print(f"  start-up: mean {pct(cost['relative_mean'])} (95% CI "
          f"{pct(cost['relative_ci95'][0])} .. {pct(cost['relative_ci95'][1])}), median "
          f"{pct(cost['relative_median'])}")
    print(f"  kvgrant's own time: {pct(cost['own_share_mean'])} of start-up (95% CI "
          f"{pct(cost['own_share_ci95'][0])} .. {pct(cost['own_share_ci95'][1])}), "
          f"{cost['own_us_per_event']:.2f} us per event")
    print(f"  time inside driver calls: {pct(cost['driver_share_mean'])} of start-up (95% CI "
          f"{pct(cost['driver_share_ci95'][0])} .. {pct(cost['driver_share_ci95'][1])})")


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("geometry", nargs="?", default="examples/published-dcp16.json")
    ap.add_argument("--ranks", type=int, default=None, help="scale the topology to N ranks")
    ap.add_argument("--backend", choices=("auto", "cuda", "sim"), default="auto")
    ap.add_argument("--memory-limit", default=None)
    ap.add_argument("--plans", default="naive,reference,packed,floor")
    ap.add_argument("--trace-pairs", type=int, default=20,
                    help="pairs of packed runs, tracing off and on back to back in random "
                         "order, for the cost of tracing (0: skip)")
    ap.add_argument("--seed", type=int, default=1, help="order of the traced pairs")
    ap.add_argument("--trace-chunk", type=int, default=DEFAULT_CHUNK, metavar="N",
                    help="records the trace writer ships at once (default: the writer's)")
    ap.add_argument("--time-limit", type=float, default=None, metavar="S",
                    help="start no new pair after S seconds of pairs; report those done")
    ap.add_argument("--json", action="store_true", help="print one JSON object instead")
    ap.add_argument("--json-out", default=None, metavar="FILE",
                    help="also write the JSON object to FILE")
    ap.add_argument("--pool", nargs="+", default=None, metavar="JSON",
                    help="run nothing: report tracing's cost over the pairs of these "
                         "--json-out files together")
    args = ap.parse_args(argv)
    if args.pool:
        pairs = pooled_pairs(args.pool)
        if not pairs:
            ap.error(f"--pool {' '.join(args.pool)}: the files hold no trace pairs")
        _print_cost(trace_cost(pairs))
        return 0
    if args.trace_chunk < 1:
        ap.error(f"--trace-chunk = {args.trace_chunk}: must be at least 1")

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
        pairs: list[tuple[dict[str, Any], dict[str, Any]]] = []
        stopped = ""
        if "packed" in args.plans.split(",") and args.trace_pairs > 0:
            # One plan for every pair (checked in the packed run above, so the pairs
            # skip contract check and pre-flight); each pair runs off and on back to
            # back in random order, so neither side always runs first.
            packed = make_plan(g, "packed")
            rng = random.Random(args.seed)
            t_pairs = time.perf_counter()
            with tempfile.TemporaryDirectory() as tmp:
                trace = Path(tmp) / "t.ndjson"
                for k in range(args.trace_pairs):
                    if (args.time_limit is not None
                            and time.perf_counter() - t_pairs > args.time_limit and pairs):
                        stopped = f"stopped after {k} of {args.trace_pairs} pairs: --time-limit"
                        break
                    order = [False, True]
                    rng.shuffle(order)
                    got = {on: _one(g, packed, drv, None, trace if on else None, checks=False,
                                    chunk=args.trace_chunk)
                           for on in order}
                    pairs.append((got[False], got[True]))
                    if len(pairs) % 20 == 0:  # a run cut short still leaves figures
                        _progress(pairs, args.trace_pairs)
            rows.append(min((b for _, b in pairs), key=lambda r: r["startup_s"]))
    finally:
        drv.close()
    cost = trace_cost(pairs) if pairs else None
    meta = {"geometry": g.name, "backend": drv.name, "ranks": g.topology.ranks,
            "command": " ".join(["python", *sys.argv]), "trace_cost": cost, "refused": refused,
            "trace_chunk": args.trace_chunk, "stopped": stopped,
            "trace_pairs": [{"untraced": [a["startup_s"], a["startup_driver_s"]],
                             "traced": [b["startup_s"], b["startup_driver_s"]]}
                            for a, b in pairs]}
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
    if cost is not None:
        if stopped:
            print(stopped)
        _print_cost(cost)
    return 0


if __name__ == "__main__":
    sys.exit(main())
