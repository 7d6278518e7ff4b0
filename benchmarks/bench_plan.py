#!/usr/bin/env python3
"""Planning benchmark: allocations, driver handles and planning time per plan.

Why: the packer's worth is a number of driver objects, and how far it is from the
provable lower bound. This prints, for every ``examples/*.json`` and for generated
layouts (``tools/gen_layout.py``'s exporter model): allocations and mappings per rank
for the naive plan, the reference rule and the packed plan; the lower bound and
packed / bound; driver handles for all ranks of the host (sum over ranks of
mappings x granted devices) with access granted to owner + importers and to every
declared reader, and the least any contract-keeping plan needs (the bound's counts, or
the relaxation weighted by handles, whichever is larger); and the wall and CPU time of
packed planning.

Usage::

    .venv/bin/python benchmarks/bench_plan.py              # markdown tables
    .venv/bin/python benchmarks/bench_plan.py --random 200 --json

It is a benchmark that prints figures, not a timed test; it exits 1 only if the
packed plan breaks the contract or needs more allocations than the reference rule.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import pathlib
import sys
import time
from typing import Any

from kvgrant.layout.bound import allocation_lower_bound, lagrangian_bound
from kvgrant.layout.contract import check_contract
from kvgrant.layout.geometry import Geometry, load_geometry, parse_geometry
from kvgrant.layout.plans import PLAN_LABELS, make_plan
from kvgrant.layout.preflight import DEFAULT_HANDLE_BUDGET, handle_demand

ROOT = pathlib.Path(__file__).resolve().parents[1]


def _gen() -> Any:
    spec = importlib.util.spec_from_file_location("gen_layout", ROOT / "tools" / "gen_layout.py")
    mod = importlib.util.module_from_spec(spec)
    sys.modules["gen_layout"] = mod
    spec.loader.exec_module(mod)
    return mod


def measure(g: Geometry) -> dict[str, Any]:
    """Figures of one geometry (see the module docstring)."""
    row: dict[str, Any] = {"name": g.name, "ranks": g.topology.ranks,
                           "declared_chunks": len(g.aliases)}
    for label in PLAN_LABELS:
        w0, c0 = time.perf_counter(), time.process_time()
        plan = make_plan(g, label)
        wall, cpu = time.perf_counter() - w0, time.process_time() - c0
        row[label] = {
            "allocations": len(plan.allocations),
            "aliased": sum(a.aliased for a in plan.allocations),
            "mappings": plan.mappings,
            "handles_importers": handle_demand(g, plan),
            "handles_declared": handle_demand(g, plan, declared=True),
            "contract_violations": len(check_contract(g, plan)),
            "wall_s": round(wall, 3), "cpu_s": round(cpu, 3),
            "notes": list(plan.notes),
        }
    w0 = time.perf_counter()
    lb = allocation_lower_bound(g)
    row["bound"] = {**lb.to_json(), "wall_s": round(time.perf_counter() - w0, 3)}
    row["packed_over_bound"] = round(row["packed"]["allocations"] / lb.total, 3)
    row["bound"]["handles_importers"] = _bound_handles(g, lb, declared=False)
    row["bound"]["handles_declared"] = _bound_handles(g, lb, declared=True)
    return row


def _bound_handles(g: Geometry, lb: Any, *, declared: bool) -> int:
    """Handles any contract-keeping plan needs at least. The larger of: every
    allocation has a plane mapping and each region at least ``pieces`` alias mappings;
    and the Lagrangian bound on the weighted sum (each allocation costs its plane
    mapping's devices summed over ranks, plus its alias mapping's when aliased)."""
    total = 0
    devices = 0
    per_region = {rb.region: 0 for rb in lb.regions}
    for r in range(g.topology.ranks):
        total += lb.total * len(g.granted_devices(r, declared=declared))
        devices += len(g.granted_devices(r, declared=declared))
        for rb in lb.regions:
            n = len(g.granted_devices(r, rb.region, declared=declared))
            total += rb.pieces * n
            per_region[rb.region] += n
    weighted = lagrangian_bound(g, free_cost=devices,
                                region_cost={k: devices + v for k, v in per_region.items()})
    return max(total, weighted)


def _table(rows: list[dict[str, Any]]) -> str:
    head = ("| layout | chunks | naive | reference | packed | bound | packed/bound "
            "| handles naive (imp / decl) | handles reference (imp / decl) "
            "| handles packed (imp / decl) | handles bound (imp / decl) "
            "| packed plan s (wall / cpu) |")
    out = [head, "|" + "---|" * 12]
    for r in rows:
        n, f, p = r["naive"], r["reference"], r["packed"]
        out.append(
            f"| {r['name']} | {r['declared_chunks']} | {n['allocations']} ({n['aliased']}) "
            f"| {f['allocations']} ({f['aliased']}) | {p['allocations']} ({p['aliased']}) "
            f"| {r['bound']['total']} ({r['bound']['aliased']}) | {r['packed_over_bound']:.2f} "
            f"| {n['handles_importers']:,} / {n['handles_declared']:,} "
            f"| {f['handles_importers']:,} / {f['handles_declared']:,} "
            f"| {p['handles_importers']:,} / {p['handles_declared']:,} "
            f"| {r['bound']['handles_importers']:,} / {r['bound']['handles_declared']:,} "
            f"| {p['wall_s']:.2f} / {p['cpu_s']:.2f} |")
    return "\n".join(out)


def _summary(rows: list[dict[str, Any]]) -> dict[str, Any]:
    ratios = [r["packed_over_bound"] for r in rows]
    saved_ref = [1 - r["reference"]["allocations"] / r["naive"]["allocations"] for r in rows]
    saved_pk = [1 - r["packed"]["allocations"] / r["naive"]["allocations"] for r in rows]
    return {
        "layouts": len(rows),
        "packed_equals_bound": sum(r["packed"]["allocations"] == r["bound"]["total"] for r in rows),
        "packed_below_reference": sum(r["packed"]["allocations"] < r["reference"]["allocations"]
                                      for r in rows),
        "packed_above_reference": sum(r["packed"]["allocations"] > r["reference"]["allocations"]
                                      for r in rows),
        "packed_over_bound_median": sorted(ratios)[len(ratios) // 2],
        "packed_over_bound_max": max(ratios),
        "mean_saving_reference": round(sum(saved_ref) / len(rows), 3),
        "mean_saving_packed": round(sum(saved_pk) / len(rows), 3),
        "max_packed_wall_s": max(r["packed"]["wall_s"] for r in rows),
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--random", type=int, default=100, metavar="N",
                    help="generated layouts to measure (seeds 0..N-1; default 100)")
    ap.add_argument("--json", action="store_true", help="print one JSON document")
    args = ap.parse_args(argv)

    examples = [measure(load_geometry(p)) for p in sorted((ROOT / "examples").glob("*.json"))]
    gen = _gen()
    generated = [measure(parse_geometry(gen.random_layout(s))) for s in range(args.random)]
    bad = [r["name"] for r in examples + generated
           if r["packed"]["contract_violations"]
           or r["packed"]["allocations"] > r["reference"]["allocations"]]
    if args.json:
        print(json.dumps({"examples": examples, "generated": generated,
                          "generated_summary": _summary(generated) if generated else None,
                          "handle_budget": DEFAULT_HANDLE_BUDGET, "failures": bad}, indent=1))
    else:
        print("Allocations per rank, total (aliased in brackets); handles for all ranks of the "
              f"host (budget {DEFAULT_HANDLE_BUDGET:,}, one pool for every process and GPU of "
              "the host), granted to owner + importers / to every declared reader.\n")
        print("## Examples\n")
        print(_table(examples))
        if generated:
            print(f"\n## Generated layouts (tools/gen_layout.py random, seeds 0..{args.random - 1})\n")
            for key, value in _summary(generated).items():
                print(f"- {key}: {value}")
        if bad:
            print(f"\nFAILED: {bad}")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
