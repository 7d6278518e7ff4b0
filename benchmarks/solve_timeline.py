#!/usr/bin/env python3
"""When, in one exact solve, the bound and the plan reach their final values.

Why: "under 2 s of CPU" is missed on layouts that are proven optimal in the end, and
what to work on next depends on which side is late: the dual bound (cuts, a tighter
model) or the plan (primal heuristics, a better warm start). HiGHS calls the
planner's check callback (``exact._count_checks``, see ``DEFAULT_MAX_CHECKS``) at
fixed points of its search; this script watches the same callback and records, per
check, this process's CPU seconds (``time.process_time`` from before the warm start),
the solver's best plan and its dual bound. It prints per layout: the first check
(presolve done), the root LP bound, when the bound reached the result's (rounded up),
when the plan reached the result's, when the plan was first within 1% of the bound, and the end.
The solve is the planner's own (``exact_plan`` from ``planner.warm_start``, default
limits); only the callback is wrapped, so the checks, the plan and the bound are the
planner's (the result's ``checks`` is compared with the count seen here).

Usage::

    .venv/bin/python benchmarks/solve_timeline.py --seeds exporter:5,random:5
    .venv/bin/python benchmarks/solve_timeline.py --seeds exporter:8 --checks   # every check
"""

from __future__ import annotations

import argparse
import json
import math
import pathlib
import sys
import time
from typing import Any

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))  # fuzz_plan's --seeds syntax
from fuzz_plan import gen_layout, parse_seeds  # noqa: E402

from kvgrant.cli import one_blas_thread  # noqa: E402
from kvgrant.layout import exact  # noqa: E402
from kvgrant.layout.geometry import Geometry, parse_geometry  # noqa: E402
from kvgrant.layout.planner import warm_start  # noqa: E402

INF = float("inf")


def _ceil(x: float) -> float:
    return -INF if x == -INF else math.ceil(x - 1e-6)


def watch(g: Geometry, **limits: Any) -> tuple[list[dict[str, float]], Any]:
    """Solve ``g`` as the planner does, returning the per-check records and the
    ``ExactResult``. Each record: ``check`` (1, 2, ... per solve, as the planner
    counts them), ``cpu_s``, ``plan`` (the solver's best, inf before one) and
    ``bound`` (its dual bound, -inf before the root LP), ``repair`` (1 in a repair: a
    solve of a neighbourhood, whose dual bound is not a bound on every plan); the last
    record (``check`` 0) is the result's plan and bound when ``exact_plan`` returns."""
    records: list[dict[str, float]] = []
    plain = exact._count_checks

    def counting(h: Any, limit: int | None, progress: Any = None) -> list[int]:
        count = plain(h, limit, progress)
        import highspy

        interrupt = int(highspy.cb.HighsCallbackType.kCallbackMipInterrupt)

        def on_check(kind: int, message: str, out: Any, into: Any, user: Any) -> None:
            if int(kind) != interrupt:  # the planner's other callbacks, as they were
                handler = count.handlers.get(int(kind))
                if handler is not None:
                    handler(out, into)
                return
            count[0] += 1
            stop = (limit is not None and count[0] > limit) or (
                count.enough is not None and count.enough(out))
            into.user_interrupt = stop  # as exact._count_checks: set both ways
            records.append({"check": count[0], "cpu_s": time.process_time() - t0,
                            "plan": float(getattr(out, "mip_primal_bound", INF)),
                            "bound": float(getattr(out, "mip_dual_bound", -INF)),
                            "repair": int(count[1] == 0)})  # exact._repair clears count[1]

        h.setCallback(on_check, None)
        h.startCallback(highspy.cb.HighsCallbackType.kCallbackMipInterrupt)
        return count

    exact._count_checks = counting
    try:
        t0 = time.process_time()
        start, _ = warm_start(g)
        result = exact.exact_plan(g, start=start, **limits)
        # HiGHS may close the gap after its last check: the result is the last record
        records.append({"check": 0, "cpu_s": time.process_time() - t0,
                        "plan": float(result.cost), "bound": float(result.bound), "repair": 0})
    finally:
        exact._count_checks = plain
    for r in records:
        r["cpu_s"] = round(r["cpu_s"], 3)
    return records, result


def summary(name: str, records: list[dict[str, float]], result: Any) -> dict[str, Any]:
    """The figures this script prints for one layout (see the module docstring); times
    are CPU seconds at the check where the thing was first seen, None if never. The
    plan at a check is the best seen so far (a repair's plans are plans of the whole
    model), the bound the best seen so far outside repairs."""
    final_bound, final_plan = float(result.bound), float(result.cost)
    checks = records[:-1]
    solve = [r for r in checks if not r["repair"]]
    root = next((r for r in solve if r["bound"] > -INF), None)
    running, plan, bound = [], INF, -INF
    for r in records:
        plan = min(plan, r["plan"])
        bound = bound if r["repair"] else max(bound, _ceil(r["bound"]))
        running.append((r["cpu_s"], plan, bound))

    def first(pred: Any) -> float | None:
        return next((t for t, p, b in running if pred(p, b)), None)

    return {
        "name": name, "plan": result.cost, "bound": result.bound, "optimal": result.optimal,
        "checks": len(checks), "repair_checks": len(checks) - len(solve),
        "result_checks": result.model.get("checks", 0) + result.model.get("repair_checks", 0),
        "first_check_s": solve[0]["cpu_s"] if solve else None,
        "root_lp_s": root["cpu_s"] if root else None,
        "root_lp_bound": round(root["bound"], 2) if root else None,
        "bound_final_s": first(lambda p, b: b >= final_bound),
        "plan_final_s": first(lambda p, b: p <= final_plan + 1e-6),
        "within_1pct_s": first(lambda p, b: b > -INF and p <= 1.01 * b),
        "end_s": records[-1]["cpu_s"],
    }


def markdown_table(rows: list[dict[str, Any]], keys: list[str]) -> str:
    """``rows`` as a Markdown table of ``keys`` (None shown as "-"); root_cuts.py's too."""
    out = ["| " + " | ".join(keys) + " |", "|" + "---|" * len(keys)]
    for r in rows:
        out.append("| " + " | ".join("-" if r[k] is None else str(r[k]) for k in keys) + " |")
    return "\n".join(out)


def _table(rows: list[dict[str, Any]]) -> str:
    return markdown_table(rows, [
        "name", "plan", "bound", "checks", "repair_checks", "first_check_s", "root_lp_s",
        "root_lp_bound", "bound_final_s", "plan_final_s", "within_1pct_s", "end_s"])


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seeds", required=True, help="FAMILY:A-B,... as in fuzz_plan.py")
    ap.add_argument("--checks", action="store_true", help="also print every check")
    ap.add_argument("--json", action="store_true", help="one JSON line per layout")
    args = ap.parse_args(argv)
    one_blas_thread()
    rows = []
    for family, seed in parse_seeds(args.seeds):
        name = f"{family}-{seed}"
        g = parse_geometry(getattr(gen_layout, f"{family}_layout")(seed))
        records, result = watch(g)
        row = summary(name, records, result)
        if args.checks:
            row["records"] = records
        rows.append(row)
        print(json.dumps(row) if args.json else f"{name}: {result.cost} / {result.bound}, "
              f"{len(records)} checks", file=sys.stdout if args.json else sys.stderr,
              flush=True)
        if args.checks and not args.json:
            for r in records:
                print(f"  check {r['check']:4}{' (repair)' if r['repair'] else ''}  cpu "
                      f"{r['cpu_s']:8.3f}  plan {r['plan']:>8}  bound {r['bound']:.2f}",
                      file=sys.stderr)
    if not args.json:
        print(_table(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
