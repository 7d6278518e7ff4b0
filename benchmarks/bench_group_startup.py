"""Start-up of one process per rank (the group runtime) against the one-process allocator.

Same layout, same ranks: the one-process allocator makes every rank's objects in one
process; the group runs one process per rank (``kvgrant.runtime.group_launch``), each
making its own objects and importing its peers' allocations (one imported handle and
its mappings per allocation and owner). VMM calls serialise across a host, so the
figure that compares is seconds per driver object: start-up wall time over every
driver object the start-up made (reservations + allocations or imported handles +
mappings). For the group the wall time is the slowest process's start-up (from its
first driver object to Publish, the vote included) and the objects are summed over
the processes.

Usage (2 GPUs; the published DCP8 layout on 2 ranks)::

    python benchmarks/bench_group_startup.py examples/published-dcp8.json --ranks 2 \\
        --backend cuda --repeats 5

``--backend sim`` runs anywhere (the simulated driver; the figures are then Python's).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path
from typing import Any

from kvgrant.layout.geometry import load_geometry, on_ranks
from kvgrant.runtime.allocator import allocate

__all__ = ["group_run", "main", "one_process_run"]


def one_process_run(g: Any, backend: str, plan: str) -> dict[str, Any]:
    """One start-up of every rank in this process; released before it returns."""
    with allocate(g, plan=plan, backend=backend) as pub:
        objects = pub.counts.objects
        out = {"startup_s": pub.startup_s, "objects": objects,
               "backend": pub.driver.name, "counts": pub.counts.as_dict()}
    out["s_per_object"] = out["startup_s"] / objects
    return out


def group_run(g: Any, backend: str, plan: str, timeout_s: float) -> dict[str, Any]:
    """One start-up of one process per rank (spawned, gloo FileStore group)."""
    from kvgrant.runtime.group_launch import launch

    reports = launch({"geometry": g.model_dump(), "procs": g.topology.ranks, "plan": plan,
                      "backend": backend, "timeout_s": timeout_s})
    bad = [r for r in reports if not r.get("ok")]
    if bad:
        raise SystemExit(f"group start-up failed: rank {bad[0]['rank']}: {bad[0].get('error')}")
    wall = max(r["startup_s"] for r in reports)
    objects = sum(r["counts"]["objects"] for r in reports)
    return {"startup_s": wall, "objects": objects, "s_per_object": wall / objects,
            "backend": reports[0]["backend"],
            "per_process": [{"rank": r["rank"], "startup_s": r["startup_s"],
                             "objects": r["counts"]["objects"],
                             "s_per_object": r["startup_s"] / r["counts"]["objects"]}
                            for r in reports]}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("geometry", nargs="?", default="examples/published-dcp8.json")
    ap.add_argument("--ranks", type=int, default=2, help="run the layout on N ranks (default 2)")
    ap.add_argument("--backend", default="auto", choices=("auto", "cuda", "sim"))
    ap.add_argument("--plan", default="packed", choices=("naive", "reference", "packed"))
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--timeout", type=float, default=300.0,
                    help="the group's deadline per step (seconds)")
    ap.add_argument("--json-out", default=None, metavar="FILE")
    args = ap.parse_args(argv)
    g = on_ranks(load_geometry(args.geometry), args.ranks)
    runs: dict[str, list[dict[str, Any]]] = {"one_process": [], "group": []}
    for i in range(args.repeats):
        # alternate the order so neither always runs on a warmer host
        order = ("one_process", "group") if i % 2 == 0 else ("group", "one_process")
        for kind in order:
            if kind == "one_process":
                runs[kind].append(one_process_run(g, args.backend, args.plan))
            else:
                runs[kind].append(group_run(g, args.backend, args.plan, args.timeout))
            r = runs[kind][-1]
            print(f"run {i + 1} {kind:11s} {r['backend']}: start-up {r['startup_s']:.3f} s, "
                  f"{r['objects']:,} driver objects, {r['s_per_object'] * 1e6:.2f} us/object",
                  flush=True)
    summary: dict[str, Any] = {"geometry": g.name, "ranks": args.ranks, "plan": args.plan,
                               "repeats": args.repeats}
    for kind, rs in runs.items():
        summary[kind] = {
            "median_startup_s": statistics.median(r["startup_s"] for r in rs),
            "objects": rs[0]["objects"],
            "median_s_per_object": statistics.median(r["s_per_object"] for r in rs),
            "runs": rs}
    one, grp = summary["one_process"], summary["group"]
    print(f"\n{g.name} on {args.ranks} ranks, {args.plan} plan, median of {args.repeats}:")
    print(f"  one process : {one['median_startup_s']:.3f} s for {one['objects']:,} objects = "
          f"{one['median_s_per_object'] * 1e6:.2f} us per driver object")
    print(f"  {args.ranks} processes: {grp['median_startup_s']:.3f} s for {grp['objects']:,} "
          f"objects = {grp['median_s_per_object'] * 1e6:.2f} us per driver object "
          f"(slowest process; objects summed, imports included)")
    if args.json_out:
        Path(args.json_out).write_text(json.dumps(summary, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
