#!/usr/bin/env python3
"""Planning CPU time, phase by phase, on regions of very many small rows.

Why: a region of 2^20 rows makes every per-row step of planning count (conflict sets,
labels, the exact model's coverage rows, the bounds, the contract check, the report),
and such layouts are easy to declare. The phases mirror ``kvgrant plan``.

Layouts (built in memory from the examples, each valid under the geometry rules):

* ``small-131072x128``, ``small-1048576x16``: ``examples/small.json`` with its snapshot
  region made that many rows of that many bytes (16 MiB either way);
* ``small-131072x16``: 2 MiB of 16-byte rows behind one alias;
* ``dcp8-1048576``: ``examples/published-dcp8.json`` with its snapshot region cut into
  2^20 rows.

Usage::

    .venv/bin/python benchmarks/bench_tall.py                 # all four
    .venv/bin/python benchmarks/bench_tall.py --only small-131072x128
    .venv/bin/python benchmarks/bench_tall.py --write DIR     # the JSON files only

Prints CPU seconds (``time.process_time``) per phase; times are figures, never checks.
"""

from __future__ import annotations

import argparse
import copy
import json
import pathlib
import sys
import time
from typing import Any, Callable

from kvgrant.cli import one_blas_thread

ROOT = pathlib.Path(__file__).resolve().parents[1]
EXAMPLES = ROOT / "examples"


def _small(rows: int, row_bytes: int, one_alias: bool = False) -> dict[str, Any]:
    d = json.loads((EXAMPLES / "small.json").read_text())
    d["name"] = f"small-{rows}x{row_bytes}"
    d["regions"][0].update(rows=rows, row_bytes=row_bytes)
    if one_alias:  # rows * row_bytes = one granule: one alias backs the region
        d["aliases"] = [{"region": "snapshot", "offset": 0, "plane": "kv0",
                         "plane_offset": 0, "length": d["granularity"]}] + [
            a for a in d["aliases"] if a["region"] != "snapshot"]
    return d


def _dcp8(rows: int) -> dict[str, Any]:
    d = json.loads((EXAMPLES / "published-dcp8.json").read_text())
    snap = d["regions"][0]
    total = sum(a["length"] for a in d["aliases"] if a["region"] == snap["name"])
    snap.update(rows=rows, row_bytes=total // rows)
    d["name"] = f"dcp8-{rows}"
    return d


LAYOUTS: dict[str, Callable[[], dict[str, Any]]] = {
    "small-131072x128": lambda: _small(131_072, 128),
    "small-131072x16": lambda: _small(131_072, 16, one_alias=True),
    "small-1048576x16": lambda: _small(1_048_576, 16),
    "dcp8-1048576": lambda: _dcp8(1_048_576),
}


def phases(doc: dict[str, Any]) -> dict[str, float]:
    """CPU seconds of each phase of ``kvgrant plan`` on ``doc`` (as commands/plan.py)."""
    from kvgrant.layout.bound import allocation_lower_bound, handle_lower_bound
    from kvgrant.layout.geometry import parse_geometry
    from kvgrant.layout.planner import plan_packed
    from kvgrant.layout.preflight import DEFAULT_HANDLE_BUDGET
    from kvgrant.layout.report import build_report
    from kvgrant.layout.rules import naive_plan, reference_plan

    out: dict[str, float] = {}
    clock = [time.process_time()]

    def lap(name: str) -> None:
        now = time.process_time()
        out[name] = round(now - clock[0], 2)
        clock[0] = now

    g = parse_geometry(copy.deepcopy(doc))
    lap("load")
    g._declared_ranges  # noqa: B018 - the declared conflict sets, computed once here
    lap("conflict sets")
    plans = [naive_plan(g), reference_plan(g)]
    lap("naive + reference")
    packed = plan_packed(g)
    plans.append(packed.plan)
    lap("plan_packed")
    bound = packed.lower_bound or allocation_lower_bound(g)
    lap("combinatorial bound")
    handles = {"importers": handle_lower_bound(g, bound),
               "declared": handle_lower_bound(g, bound, declared=True)}
    lap("handle bounds")
    build_report(g, plans, DEFAULT_HANDLE_BUDGET, lower_bound=bound, packed=packed,
                 handle_bound=handles)
    lap("report")
    out["total"] = round(sum(out.values()), 2)
    out["allocations"] = len(packed.plan.allocations)
    out["bound"] = packed.bound
    return out


def main(argv: list[str] | None = None) -> int:
    one_blas_thread()  # as the CLI: OpenBLAS's spinning threads are not planning
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--only", metavar="NAMES",
                    help=f"comma-separated, of: {', '.join(LAYOUTS)}")
    ap.add_argument("--write", metavar="DIR", help="write the layouts as JSON and stop")
    args = ap.parse_args(argv)
    names = args.only.split(",") if args.only else list(LAYOUTS)
    unknown = [n for n in names if n not in LAYOUTS]
    if unknown:
        ap.error(f"--only: unknown layout(s) {', '.join(unknown)}; known: {', '.join(LAYOUTS)}")
    if args.write:
        folder = pathlib.Path(args.write)
        folder.mkdir(parents=True, exist_ok=True)
        for n in names:
            (folder / f"{n}.json").write_text(json.dumps(LAYOUTS[n]()))
            print(folder / f"{n}.json")
        return 0
    for n in names:
        print(n, json.dumps(phases(LAYOUTS[n]())), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
