#!/usr/bin/env python3
"""CP-SAT against HiGHS on the exact planner's model (issue #17): a measurement only.

Why: HiGHS spends seconds in presolve, root cut separation and sub-MIP heuristics on
the slow layouts (docs/layout.md, "Speed"), and only HiGHS was ever measured. This
script builds the *same* model (``exact._build`` with the costs ``exact_plan`` uses by
default: ``plane_cost`` 1, no region costs, the pass-through cuts included), hands it
to OR-Tools CP-SAT (integer variables with the same bounds, the same rows, the same
integral objective; the reference rule's plan as a solution hint via
``exact._start_values``) and prints, per layout and CP-SAT setting, the plan
(allocations: the model's objective, and the allocations of the plan extracted from
CP-SAT's solution by ``exact._extract``, checked with the contract checker), the
bound (rounded up), proof or gap, CP-SAT's own user time (measured: it equals CP-SAT's
wall time, so it is not a CPU figure) and this process's CPU time
(``time.process_time``: model build, translation, solve, extraction), next to HiGHS's
figures from the current planner (``exact_plan(g, start=reference_plan(g))``).

Every CP-SAT setting here is deterministic (``num_workers`` 1, or ``interleave_search``)
and limited by ``max_deterministic_time`` (a count of CP-SAT's work, not a clock).
Per run it also records the CPU time (``process_time`` in the callbacks) at which the
plan was first within 1% of the bound and when it was proven, so one long run shows
what a 2 s CPU budget would have given.

Usage::

    .venv/bin/python benchmarks/bench_cpsat.py --only published-dcp8,exporter-5 \
        --setting default:dt=5 --setting lin2:dt=20,linearization_level=2 --highs
    .venv/bin/python benchmarks/bench_cpsat.py --only random-0 --setting default:dt=20 \
        --hash          # objective and solution hash (for the determinism check)

Settings are ``NAME:KEY=VALUE,...``; ``dt`` is ``max_deterministic_time``, ``hint=0``
leaves the hint out, other keys are CP-SAT parameters (``linearization_level=2``,
``symmetry_level=4``, ``num_workers=8``, ``interleave_search=true``, ...).
Output: one JSON line per run on stdout (``--json``), else a markdown table.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import math
import pathlib
import sys
import time
from typing import Any

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

from bench_plan import gen_layout  # noqa: E402  (tools/gen_layout.py)

from kvgrant.layout import exact  # noqa: E402
from kvgrant.layout.contract import check_contract  # noqa: E402
from kvgrant.layout.geometry import Geometry, load_geometry, parse_geometry  # noqa: E402
from kvgrant.layout.rules import reference_plan  # noqa: E402

DEFAULT_LAYOUTS = ("published-dcp8,exporter-0,exporter-1,exporter-5,exporter-7,exporter-8,"
                   "exporter-1000,exporter-1002,exporter-1003,exporter-1005,exporter-1006,"
                   "random-0,random-1,random-5,random-7")


def geometry(name: str) -> Geometry:
    """A layout by name: ``published-dcpN`` (examples/), ``exporter-N``, ``random-N``."""
    if name.startswith("published"):
        return load_geometry(ROOT / "examples" / f"{name}.json")
    kind, _, seed = name.rpartition("-")
    gen = gen_layout
    doc = gen.exporter_layout(int(seed)) if kind == "exporter" else gen.random_layout(int(seed))
    return parse_geometry(doc)


def _int(x: float) -> int:
    k = int(round(x))
    if abs(k - x) > 1e-9:
        raise ValueError(f"non-integral model data {x!r}")
    return k


def _parse_setting(text: str) -> tuple[str, dict[str, Any]]:
    name, _, rest = text.partition(":")
    out: dict[str, Any] = {}
    for kv in filter(None, rest.split(",")):
        k, _, v = kv.partition("=")
        try:
            out[k] = json.loads(v)
        except json.JSONDecodeError:
            out[k] = v
    return name, out


def run_highs(g: Geometry) -> dict[str, Any]:
    ref = reference_plan(g)
    c0 = time.process_time()
    ex = exact.exact_plan(g, start=ref)
    cpu = time.process_time() - c0
    return {"layout": g.name, "solver": "highs", "setting": "planner defaults",
            "plan": ex.cost, "bound": ex.bound, "proven": ex.optimal,
            "gap_pct": round(100 * (ex.cost - ex.bound) / ex.cost, 2),
            "cpu_s": round(cpu, 2), "status": ex.status, "source": ex.source,
            "checks": ex.model.get("checks"), "nonzeros": ex.model.get("nonzeros")}


def run_cpsat(g: Geometry, name: str, opts: dict[str, Any], *,
              log: bool = False, want_hash: bool = False) -> dict[str, Any]:
    try:
        from ortools.sat.python import cp_model
    except ImportError:
        raise SystemExit("bench_cpsat.py needs OR-Tools, which kvgrant does not depend on: "
                         ".venv/bin/pip install ortools==9.14.6206") from None

    opts = dict(opts)
    dt = float(opts.pop("dt", 20))
    hint = bool(opts.pop("hint", 1))
    ref = reference_plan(g)  # the start, as exact_plan is given it (not timed, as there)
    c0 = time.process_time()
    m, lab = exact._build(g, 1.0, {})
    vals = exact._start_values(g, m, lab, ref) if hint else None
    md = cp_model.CpModel()
    xs = [md.new_int_var(_int(lo), _int(hi), "") for lo, hi in zip(m.lower, m.upper)]
    for ents, lo, hi in zip(m.rows, m.rows_lo, m.rows_hi):
        expr = sum(_int(k) * xs[c] for c, k in ents)
        if lo == hi:
            md.add(expr == _int(lo))
        elif lo == -math.inf:
            md.add(expr <= _int(hi))
        elif hi == math.inf:
            md.add(expr >= _int(lo))
        else:
            md.add_linear_constraint(expr, _int(lo), _int(hi))
    md.minimize(sum(_int(k) * x for k, x in zip(m.cost, xs) if k) + _int(m.offset))
    hint_obj = None
    if vals is not None:
        for x, v in zip(xs, vals):
            md.add_hint(x, _int(v))
        hint_obj = sum(_int(k) * _int(v) for k, v in zip(m.cost, vals))
    t_model = time.process_time() - c0
    solver = cp_model.CpSolver()
    p = solver.parameters
    p.num_workers = 1
    p.random_seed = 0
    p.max_deterministic_time = dt
    p.max_time_in_seconds = exact.SAFETY_SECONDS
    p.log_search_progress = log
    for k, v in opts.items():
        setattr(p, k, v)
    trace = {"first_within_1pct_cpu_s": None, "proven_cpu_s": None}
    best = {"obj": math.inf, "bound": -math.inf}

    def note() -> None:
        cpu = time.process_time() - c0
        o, b = best["obj"], math.ceil(best["bound"] - 1e-6)
        if o < math.inf and trace["first_within_1pct_cpu_s"] is None and (o - b) < 0.01 * o:
            trace["first_within_1pct_cpu_s"] = round(cpu, 2)
        if o < math.inf and trace["proven_cpu_s"] is None and b >= o:
            trace["proven_cpu_s"] = round(cpu, 2)

    class CB(cp_model.CpSolverSolutionCallback):
        def __init__(self) -> None:
            super().__init__()
            self.first: float | None = None

        def on_solution_callback(self) -> None:
            best["obj"] = min(best["obj"], self.objective_value)
            best["bound"] = max(best["bound"], self.best_objective_bound)
            if self.first is None:
                self.first = self.objective_value
            note()

    def on_bound(b: float) -> None:
        best["bound"] = max(best["bound"], b)
        note()

    solver.best_bound_callback = on_bound
    cb = CB()
    s0 = time.process_time()
    status = solver.solve(md, cb)
    t_solve = time.process_time() - s0
    if status == cp_model.OPTIMAL and trace["proven_cpu_s"] is None:
        trace["proven_cpu_s"] = round(time.process_time() - c0, 2)
    st = solver.status_name(status)
    row: dict[str, Any] = {"layout": g.name, "solver": "cpsat", "setting": name,
                           "dt_limit": dt, "hint": hint, "params": opts, "status": st,
                           "hint_objective": hint_obj, "first_objective": cb.first}
    if status in (cp_model.OPTIMAL, cp_model.FEASIBLE):
        obj = _int(solver.objective_value)
        bound = math.ceil(solver.best_objective_bound - 1e-6)
        sol = [int(solver.value(x)) for x in xs]
        plan, lost = exact._extract(g, m, lab, sol, "cpsat")
        bad = check_contract(g, plan)
        # the plan is the extracted one (finish_plan may merge more than the model's
        # joins), as in exact_plan; the bound holds for every plan
        n = len(plan.allocations)
        row.update(objective=obj, plan=n, lost_joins=len(lost),
                   contract_violations=len(bad), bound=bound,
                   proven=bound >= n, gap_pct=round(100 * (n - bound) / n, 2))
        if want_hash:
            row["solution_sha256"] = hashlib.sha256(
                ",".join(map(str, sol)).encode()).hexdigest()[:16]
    else:
        row.update(objective=None, plan=None, bound=math.ceil(solver.best_objective_bound),
                   proven=False, gap_pct=None)
    row.update(cpu_s=round(time.process_time() - c0, 2), model_cpu_s=round(t_model, 2),
               solve_cpu_s=round(t_solve, 2), user_time_s=round(solver.user_time, 2),
               wall_s=round(solver.wall_time, 2),
               det_time=round(solver.response_proto.deterministic_time, 2), **trace)
    return row


def _table(rows: list[dict[str, Any]]) -> str:
    out = ["| layout | solver | setting | plan (obj / extracted) | bound | verdict "
           "| CPU s | solver user s | 1% at CPU s | proof at CPU s |",
           "|" + "---|" * 10]
    for r in rows:
        if r["solver"] == "highs":
            plan = f"{r['plan']}"
            user, first, proof = "-", "-", "-"
        else:
            plan = f"{r.get('objective')} / {r.get('plan')}"
            user = r["user_time_s"]
            first, proof = r["first_within_1pct_cpu_s"] or "-", r["proven_cpu_s"] or "-"
        verdict = "optimal" if r["proven"] else (f"gap {r['gap_pct']}%" if r["gap_pct"]
                                                 is not None else r["status"])
        out.append(f"| {r['layout']} | {r['solver']} | {r['setting']} | {plan} | {r['bound']} "
                   f"| {verdict} | {r['cpu_s']} | {user} | {first} | {proof} |")
    return "\n".join(out)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--only", default=DEFAULT_LAYOUTS, metavar="NAMES",
                    help="comma-separated layouts (published-dcp8, exporter-N, random-N)")
    ap.add_argument("--setting", action="append", default=[], metavar="NAME:K=V,...",
                    help="a CP-SAT setting (repeatable; default 'default:dt=20')")
    ap.add_argument("--highs", action="store_true", help="also run the current planner")
    ap.add_argument("--log", action="store_true", help="CP-SAT's search log on stderr")
    ap.add_argument("--hash", action="store_true", help="add a hash of CP-SAT's solution")
    ap.add_argument("--json", action="store_true", help="one JSON line per run")
    args = ap.parse_args(argv)
    settings = [_parse_setting(s) for s in (args.setting or ["default:dt=20"])]
    rows = []
    for name in args.only.split(","):
        g = geometry(name)
        runs = [("highs", {})] if args.highs else []
        runs += settings
        for sname, opts in runs:
            print(f"bench_cpsat: {name} {sname} {opts}", file=sys.stderr, flush=True)
            r = run_highs(g) if sname == "highs" else run_cpsat(
                g, sname, opts, log=args.log, want_hash=args.hash)
            rows.append(r)
            if args.json:
                print(json.dumps(r), flush=True)
    if not args.json:
        print(_table(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
