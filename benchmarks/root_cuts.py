#!/usr/bin/env python3
"""How much of the root gap HiGHS's cuts close, and how few cuts carry it.

Why: on the slow layouts the time goes into HiGHS's root cut loop (docs/layout.md,
"Speed: which side is late"), and the open question is whether rows of our own (a
tighter formulation) could stand in for that loop. That is worth building only if a
few cuts carry the bound. This script solves the planner's model as the planner does
(``exact_plan`` from ``planner.warm_start``, default limits but no gap target, so that
the root is seen to its end) with HiGHS's presolve off, so that its cuts are over the
model's own columns. It takes the cuts in HiGHS's LP when HiGHS hands over its cut
pool (``kCallbackMipGetCutPool``, the first time: at the end of the first solve's root
cut rounds; a solve stopped before then hands over none) and solves the model's LP
relaxation without and with them (``exact._mip`` with every column continuous). Per
layout it prints the plan and bound of that solve, the LP bound, the LP bound with the
cuts, how many cuts there are and how many have a nonzero dual (those carry the bound),
how much of the gap between the LP and the solve's bound they close, and the LP's CPU
seconds either way.

HiGHS's cuts keep at least one optimal plan (its proofs rest on that), so the LP with
them is never above the solve's plan; the script exits 1 if it is.

Usage::

    .venv/bin/python benchmarks/root_cuts.py --seeds exporter:5,exporter:7
    .venv/bin/python benchmarks/root_cuts.py --geometry examples/published-dcp8.json --json
"""

from __future__ import annotations

import argparse
import json
import pathlib
import sys
import time
from dataclasses import dataclass
from typing import Any

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))  # fuzz_plan's --seeds syntax
from fuzz_plan import gen_layout, parse_seeds  # noqa: E402
from solve_timeline import markdown_table  # noqa: E402

from kvgrant.cli import one_blas_thread  # noqa: E402
from kvgrant.layout import exact  # noqa: E402
from kvgrant.layout.geometry import Geometry, load_geometry, parse_geometry  # noqa: E402
from kvgrant.layout.planner import warm_start  # noqa: E402


@dataclass
class Rows:
    """Rows over the model's columns, in CSR form, with their bounds."""

    lower: Any
    upper: Any
    start: Any  # one entry per row, plus the end
    index: Any
    value: Any


@dataclass
class Capture:
    """The first solve's model (columns and rows, as HiGHS holds it) and its cuts."""

    cost: Any
    col_lower: Any
    col_upper: Any
    rows: Rows
    cuts: Rows | None = None
    cut_columns: int = 0  # columns the cut pool is over (the model's, presolve off)


def solve_captured(g: Geometry, **limits: Any) -> tuple[Any, Capture]:
    """The planner's solve of ``g`` with presolve off and no gap target (``max_gap``
    0 unless ``limits`` says otherwise: a solve stopped inside its root hands over no
    cuts), and its first solve's model and cuts. Only the planner's check callback is
    wrapped (to subscribe to the cut pool too); it is restored on return."""
    import highspy
    import numpy as np

    plain = exact._count_checks
    pool_kind = int(highspy.cb.HighsCallbackType.kCallbackMipGetCutPool)
    got: list[Capture] = []

    def counting(h: Any, limit: int | None, progress: Any = None) -> Any:
        count = plain(h, limit, progress)
        if got:  # a repair or a later solve: another model
            return count
        lp = h.getLp()
        a = lp.a_matrix_
        if a.format_ != highspy.MatrixFormat.kRowwise:
            raise RuntimeError(f"expected the model's rows, got {a.format_}")
        cap = Capture(np.array(lp.col_cost_), np.array(lp.col_lower_), np.array(lp.col_upper_),
                      Rows(np.array(lp.row_lower_), np.array(lp.row_upper_), np.array(a.start_),
                           np.array(a.index_), np.array(a.value_)))
        got.append(cap)

        def on_pool(out: Any, into: Any) -> None:
            if cap.cuts is not None:  # a root evaluated again after a restart: keep the first
                return
            n = int(out.cutpool_num_cut)
            start = np.array(out.cutpool_start)[:n + 1].copy()
            end = int(start[-1]) if n else 0
            cap.cut_columns = int(out.cutpool_num_col)
            cap.cuts = Rows(np.array(out.cutpool_lower)[:n].copy(),
                            np.array(out.cutpool_upper)[:n].copy(), start if n else np.zeros(1),
                            np.array(out.cutpool_index)[:end].copy(),
                            np.array(out.cutpool_value)[:end].copy())

        count.handlers[pool_kind] = on_pool
        h.startCallback(highspy.cb.HighsCallbackType.kCallbackMipGetCutPool)
        return count

    exact._count_checks = counting
    try:
        options = {"presolve": "off", **limits.pop("options", {})}
        limits.setdefault("max_gap", 0.0)
        result = exact.exact_plan(g, start=warm_start(g)[0], options=options, **limits)
    finally:
        exact._count_checks = plain
    # a windowed solve's models are the whole model with columns fixed, window by window
    if "windows" in result.model or not result.model.get("rounds") or not got:
        raise RuntimeError(f"the whole model was not solved at once: {result.status}")
    return result, got[0]


def lp_bound(cap: Capture, with_cuts: bool) -> tuple[float, float, int]:
    """The LP relaxation of the captured model (with the cuts or not): its optimum,
    its CPU seconds and how many cuts have a nonzero dual there."""
    import highspy
    import numpy as np

    n = len(cap.cost)
    blocks = [cap.rows] + ([cap.cuts] if with_cuts and cap.cuts is not None else [])
    if len(blocks) > 1 and cap.cut_columns != n:
        raise RuntimeError(f"the cuts are over {cap.cut_columns} columns, the model has {n}")
    shift = np.cumsum([0] + [len(r.index) for r in blocks[:-1]])
    h = exact._mip(cap.cost, cap.col_lower, cap.col_upper,
                   np.concatenate([r.lower for r in blocks]),
                   np.concatenate([r.upper for r in blocks]),
                   np.concatenate([r.start[:-1] + k for r, k in zip(blocks, shift)]),
                   np.concatenate([r.index for r in blocks]),
                   np.concatenate([r.value for r in blocks]), None)
    h.changeColsIntegrality(n, np.arange(n, dtype=np.int32),
                            np.full(n, highspy.HighsVarType.kContinuous))
    t = time.process_time()
    h.run()
    seconds = time.process_time() - t
    if h.getModelStatus() != highspy.HighsModelStatus.kOptimal:
        raise RuntimeError(f"LP relaxation: {h.modelStatusToString(h.getModelStatus())}")
    binding = 0
    if len(blocks) > 1:
        duals = np.array(h.getSolution().row_dual)[len(cap.rows.lower):]
        binding = int((np.abs(duals) > 1e-7).sum())
    return float(h.getInfo().objective_function_value), seconds, binding


def summary(name: str, result: Any, cap: Capture) -> dict[str, Any]:
    """The figures printed for one layout (see the module docstring)."""
    lp, lp_s, _ = lp_bound(cap, with_cuts=False)
    cut, cut_s, binding = lp_bound(cap, with_cuts=True)
    cuts = None if cap.cuts is None else len(cap.cuts.lower)  # None: never handed over
    gap = result.bound - lp
    return {"name": name, "plan": result.cost, "bound": result.bound,
            "optimal": result.optimal, "columns": len(cap.cost), "cuts": cuts,
            "binding": binding, "lp": round(lp, 2), "lp_cuts": round(cut, 2),
            "closed": None if cuts is None or gap <= 1e-9 else round(
                min(1.0, (cut - lp) / gap), 3),
            "lp_s": round(lp_s, 3), "lp_cuts_s": round(cut_s, 3),
            "bad": [] if cut <= result.cost + 1e-6 else [
                f"LP with the cuts {cut:.3f} above the plan {result.cost}"]}


def _table(rows: list[dict[str, Any]]) -> str:
    return markdown_table(rows, ["name", "plan", "bound", "columns", "cuts", "binding", "lp",
                                 "lp_cuts", "closed", "lp_s", "lp_cuts_s"])


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seeds", default="", help="FAMILY:A-B,... as in fuzz_plan.py")
    ap.add_argument("--geometry", action="append", default=[], help="a geometry file "
                    "(repeatable)")
    ap.add_argument("--json", action="store_true", help="one JSON line per layout")
    args = ap.parse_args(argv)
    if not args.seeds and not args.geometry:
        ap.error("give --seeds or --geometry")
    one_blas_thread()
    todo = [(pathlib.Path(p).stem, lambda p=p: load_geometry(p)) for p in args.geometry]
    todo += [(f"{family}-{seed}", lambda f=family, s=seed: parse_geometry(
        getattr(gen_layout, f"{f}_layout")(s))) for family, seed in parse_seeds(args.seeds)]
    rows, bad = [], False
    for name, make in todo:
        result, cap = solve_captured(make())
        row = summary(name, result, cap)
        bad = bad or bool(row["bad"])
        rows.append(row)
        cuts = "no" if row["cuts"] is None else row["cuts"]
        print(json.dumps(row) if args.json else f"{name}: {row['lp']} -> {row['lp_cuts']} "
              f"with {cuts} cuts ({row['binding']} binding); solve {result.cost} / "
              f"{result.bound}", file=sys.stdout if args.json else sys.stderr, flush=True)
    if not args.json:
        print(_table(rows))
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
