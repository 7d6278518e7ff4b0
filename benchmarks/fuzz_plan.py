#!/usr/bin/env python3
"""``plan_packed`` on any seeds of the generated families, many layouts at a time.

Why: the planning benchmark (``bench_plan.py``) follows 35 layouts, and the settings
and limits were chosen while looking at some of them. Whether the planner's promises
hold elsewhere (a contract-keeping plan, never above the reference rule, a bound that
never exceeds a plan, and how often "optimal", "within 1%" and "under 2 s") is a
question for seeds nobody looked at. This plans each layout with the real entry point
(``plan_packed`` at its default limits, as ``kvgrant plan`` and ``allocate()`` do), in
a process of its own stopped after ``--limit`` wall seconds (some layouts keep HiGHS's
root LP busy for minutes, and no count stops that), ``--jobs`` at a time.

Checked per layout (a *finding*; exit status 1 if any): the plan keeps the contract
(``check_contract``), needs no more allocations than the reference rule, the
combinatorial bound and the returned bound are at most the plan, and "optimal" is
said exactly when the bound equals the plan; an error in planning is a finding too.
Printed per family: layouts, finished, over the limit, proven optimal, gap under 1%,
gap of 1% or more, over 2 s of CPU, median and largest CPU seconds (``process_time``
of ``plan_packed`` in its own process; many jobs on one host raise it).

``--planner NAME=VALUE`` (repeatable) plans with other work limits of ``plan_packed``
(``max_checks=100``, ``node_limit=none``), to measure what a limit buys on seeds nobody
tuned it on; each row then carries the limits. Every row carries its model's size, the
solver's limit checks and its repairs (``nonzeros``, ``checks``, ``repairs``; absent
when no model was built or nothing was repaired).

Usage::

    .venv/bin/python benchmarks/fuzz_plan.py --seeds exporter:2000-2039,random:10-49 \\
        --jobs 15 --limit 60 --out rows.jsonl
    .venv/bin/python benchmarks/fuzz_plan.py --seeds random:10-89 --planner max_checks=100
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import statistics
import subprocess
import sys
import time
from collections.abc import Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tools"))  # tools/ is not a package
import gen_layout  # noqa: E402  (tools/gen_layout.py: the seeded layout families)

FAMILIES = ("exporter", "random", "odd")
LIMITS = ("node_limit", "max_nonzeros", "max_solves", "max_checks", "max_windowed_nonzeros",
          "max_gap")
"""The work limits of ``plan_packed`` that ``--planner`` may set."""


def parse_seeds(text: str) -> list[tuple[str, int]]:
    """``family:A-B`` or ``family:N``, comma-separated, as (family, seed) pairs."""
    out: list[tuple[str, int]] = []
    for part in filter(None, (p.strip() for p in text.split(","))):
        family, _, span = part.partition(":")
        if family not in FAMILIES or not span:
            raise SystemExit(f"--seeds: {part!r} is not FAMILY:A-B with FAMILY one of "
                             f"{', '.join(FAMILIES)}")
        lo, _, hi = span.partition("-")
        try:
            a, b = int(lo), int(hi or lo)
        except ValueError:
            raise SystemExit(f"--seeds: {part!r}: seeds must be integers") from None
        if a < 0 or b < a:
            raise SystemExit(f"--seeds: {part!r}: want 0 <= A <= B")
        out.extend((family, s) for s in range(a, b + 1))
    return out


def parse_limits(items: list[str]) -> dict[str, int | float | None]:
    """``NAME=VALUE`` items as ``plan_packed`` keyword arguments (``none``: no limit;
    ``max_solves`` needs a number; ``max_gap`` is a fraction, 0 for the proof)."""
    out: dict[str, int | float | None] = {}
    for item in items:
        name, eq, text = item.partition("=")
        if name not in LIMITS or not eq:
            raise SystemExit(f"--planner: {item!r} is not NAME=VALUE with NAME one of "
                             f"{', '.join(LIMITS)}")
        if name == "max_gap":
            try:
                gap = float(text)
            except ValueError:
                gap = float("nan")
            if not 0 <= gap < 1:
                raise SystemExit(f"--planner: {item!r}: the value must be a fraction >= 0 "
                                 "and < 1")
            out[name] = gap
            continue
        if text == "none" and name != "max_solves":
            out[name] = None
            continue
        try:
            value = int(text)
        except ValueError:
            raise SystemExit(f"--planner: {item!r}: the value must be an integer"
                             f"{'' if name == 'max_solves' else ' or none'}") from None
        if value < 1:
            raise SystemExit(f"--planner: {item!r}: the value must be at least 1")
        out[name] = value
    return out


def findings(g: Any, result: Any) -> dict[str, Any]:
    """Figures of one planned layout and what it broke (``bad``), from ``plan_packed``'s
    result: the promises listed in the module docstring."""
    from kvgrant.layout.bound import allocation_lower_bound
    from kvgrant.layout.contract import check_contract
    from kvgrant.layout.rules import reference_plan

    n = len(result.plan.allocations)
    reference = len(reference_plan(g).allocations)
    floor = allocation_lower_bound(g).total
    bad = []
    if check_contract(g, result.plan):
        bad.append("the plan breaks the contract")
    if n > reference:
        bad.append(f"the plan needs {n} allocations, the reference rule {reference}")
    if floor > n or result.bound > n:
        bad.append(f"a bound exceeds the plan (combinatorial {floor}, returned "
                   f"{result.bound}, plan {n})")
    if result.optimal != (result.bound == n):
        bad.append(f"optimal={result.optimal} with bound {result.bound} and plan {n}")
    model = result.exact.model if result.exact is not None else {}
    return {"packed": n, "bound": result.bound, "optimal": result.optimal,
            "source": result.source, "reference": reference, "comb_bound": floor,
            **{k: model[k] for k in ("nonzeros", "checks", "repairs") if k in model},
            "bad": bad}


def plan_one(family: str, seed: int,
             limits: dict[str, int | None] | None = None) -> dict[str, Any]:
    """Plan one layout here (the child's work), with ``limits`` (``plan_packed``'s
    keyword arguments) instead of its defaults, and check it."""
    from kvgrant.layout.geometry import parse_geometry
    from kvgrant.layout.planner import plan_packed

    g = parse_geometry(getattr(gen_layout, f"{family}_layout")(seed))
    row: dict[str, Any] = {"name": f"{family}-{seed}", "chunks": len(g.aliases)}
    if limits:
        row["limits"] = limits
    try:
        t = time.process_time()
        result = plan_packed(g, **(limits or {}))
        row["cpu_s"] = round(time.process_time() - t, 2)
        row.update(findings(g, result))
    except Exception as exc:  # noqa: BLE001 - reported as the layout's finding
        row["error"] = f"{type(exc).__name__}: {exc}"
    return row


def _child(family: str, seed: int, limit: float, planner: Sequence[str]) -> dict[str, Any]:
    """One layout in a child process, killed (and reaped) past ``limit`` wall seconds;
    ``planner`` are the ``--planner`` items, passed on."""
    name = f"{family}-{seed}"
    env = dict(os.environ)
    env.setdefault("OPENBLAS_NUM_THREADS", "1")  # as the CLI: no spinning BLAS threads
    try:
        done = subprocess.run([sys.executable, __file__, "--one", f"{family}:{seed}",
                               *(f"--planner={item}" for item in planner)],
                              capture_output=True, text=True, timeout=limit, env=env)
    except subprocess.TimeoutExpired:
        return {"name": name, "over_s": limit}
    lines = done.stdout.strip().splitlines()
    if done.returncode != 0 or not lines:
        return {"name": name, "error": f"exit {done.returncode}: {done.stderr.strip()[-800:]}"}
    return json.loads(lines[-1])  # type: ignore[no-any-return]


def run(seeds: list[tuple[str, int]], jobs: int, limit: float,
        planner: Sequence[str] = ()) -> Iterator[dict[str, Any]]:
    """The rows, in seed order, planned ``jobs`` at a time (``planner``: the
    ``--planner`` items)."""
    with ThreadPoolExecutor(max_workers=jobs) as pool:
        yield from pool.map(lambda fs: _child(fs[0], fs[1], limit, planner), seeds)


def summary(rows: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """Per family: the counts printed by :func:`main`."""
    out: dict[str, dict[str, Any]] = {}
    for family in FAMILIES:
        rs = [r for r in rows if r["name"].rsplit("-", 1)[0] == family]
        if not rs:
            continue
        done = [r for r in rs if "cpu_s" in r]
        gaps = [100 * (r["packed"] - r["bound"]) / r["packed"] for r in done
                if not r["optimal"]]
        cpu = [r["cpu_s"] for r in done]
        out[family] = {
            "layouts": len(rs), "finished": len(done),
            "over_limit": sum("over_s" in r for r in rs),
            "errors": sum("error" in r for r in rs),
            "findings": sum(bool(r.get("bad")) or "error" in r for r in rs),
            "optimal": sum(r["optimal"] for r in done),
            "gap_under_1pct": sum(g < 1 for g in gaps),
            "gap_1pct_or_more": sum(g >= 1 for g in gaps),
            "over_2s_cpu": sum(c > 2 for c in cpu),
            "median_cpu_s": round(statistics.median(cpu), 2) if cpu else None,
            "max_cpu_s": max(cpu) if cpu else None,
        }
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seeds", help="FAMILY:A-B,... with FAMILY one of "
                    + ", ".join(FAMILIES) + " (e.g. exporter:2000-2039,odd:150-349)")
    ap.add_argument("--jobs", type=int, default=max(1, (os.cpu_count() or 2) - 1),
                    help="layouts planned at a time (default: CPUs - 1)")
    ap.add_argument("--limit", type=float, default=60.0,
                    help="wall seconds per layout before it is stopped (default 60)")
    ap.add_argument("--out", help="write one JSON line per layout here")
    ap.add_argument("--planner", action="append", default=[], metavar="NAME=VALUE",
                    help="a work limit of plan_packed instead of its default "
                    f"({', '.join(LIMITS)}; VALUE an integer or none, max_gap a "
                    "fraction); repeatable")
    ap.add_argument("--one", help=argparse.SUPPRESS)  # the child's entry point
    args = ap.parse_args(argv)
    limits = parse_limits(args.planner)
    if args.one:
        family, seed = parse_seeds(args.one)[0]
        print(json.dumps(plan_one(family, seed, limits)), flush=True)
        return 0
    if not args.seeds:
        ap.error("--seeds is required")
    if args.jobs < 1 or args.limit <= 0:
        ap.error("--jobs must be at least 1 and --limit above 0")
    rows = []
    out = open(args.out, "w") if args.out else None
    try:
        for row in run(parse_seeds(args.seeds), args.jobs, args.limit, args.planner):
            rows.append(row)
            if out:
                out.write(json.dumps(row) + "\n")
                out.flush()
            if row.get("bad") or "error" in row:
                print(f"FINDING {row['name']}: {row.get('bad') or row['error']}", flush=True)
    finally:
        if out:
            out.close()
    for family, figures in summary(rows).items():
        print(family, json.dumps(figures))
    return 1 if any(r.get("bad") or "error" in r for r in rows) else 0


if __name__ == "__main__":
    sys.exit(main())
