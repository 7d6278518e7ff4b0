#!/usr/bin/env python3
"""Independent cross-check of the exact planner's "optimal" claims and of both bounds.

Why: ``plan_packed`` calls a plan "optimal" when it needs exactly HiGHS's dual bound
of the *aggregated* model of ``kvgrant.layout.exact`` (plane classes, labels per row
interior and per straddling granule, join columns, pass-through cuts). A wrong
aggregation, eligibility rule, cut or extraction would make that claim (or the bound)
wrong without any test of the planner noticing, since those tests share its model.
This script solves the same problem with a second exact model written from the layout
contract alone (``../shared/DESIGN.md``, points 1-5) and compares.

It imports no planner internals: not ``exact`` (except its constructor of a HiGHS
instance that prints no banner, which holds no model), ``granules``, ``packer``, ``bound``
(except to read the combinatorial bound it checks), ``windows`` or ``planner``
internals. It uses ``geometry`` (parsing, sizes), ``conflicts`` only to compare its own
declared conflict sets with kvgrant's, ``contract.check_contract`` to validate the
plans it builds, ``rules.reference_plan``/``naive_plan`` as baselines and
``finish_plan`` only to compare allocation counts (its own plan is built here).

The independent model (disaggregated: one copy per plane, one per region granule)
----------------------------------------------------------------------------------
Everything is G-aligned (offsets and lengths are G-multiples), so a plan is the same
as a map from region granules to plane granules:

* region granule ``(R, j)``: region bytes ``[jG, (j+1)G)``, for ``j < ceil(rows *
  row_bytes / G)`` (every such granule holds a byte of some row, so point 2 makes
  each one backed exactly once); plane granule ``(P, u)``, ``u < plane_bytes(P)/G``.
* ``y[R,j,P,u]`` binary: region granule (R, j) is backed by plane granule (P, u).
  ``sum_{P,u} y = 1`` per region granule (point 2); ``sum_{R,j} y <= 1`` per plane
  granule (point 1: one allocation per plane byte, mapped once into one region).
* Pages touched: the row parts of region granule j are its bytes ``[s, e)`` inside
  row k (bytes past ``rows * row_bytes`` belong to no row); backed by (P, u) they are
  plane bytes ``[s + (u - j)G, e + (u - j)G)``, i.e. pages ``floor(b / bpp)`` of those
  bytes, below ``pages`` (plane tail bytes belong to no page). Point 4 says the union
  over the row's parts equals the declared set ``C_k``. So: *eligibility* -- y may be
  1 only when every row part of (j, P, u) touches pages of its row's ``C_k`` only (a
  straddling granule must fit both rows' sets; a part past the last row constrains
  nothing; a part in the plane's tail touches no page); *coverage* -- for every row
  k and page q of ``C_k``: ``sum y >= 1`` over the (j, P, u) whose row-k part touches q.
  Eligibility is computed by interval arithmetic and every candidate is re-checked by
  the direct page computation; on small layouts every (j, P, u) pair is enumerated and
  compared with the candidate set (``complete_check``).
* Allocations (finish_plan's count: aliased pieces merged when contiguous in region
  and plane, one non-aliased allocation per maximal gap of each plane): every plane
  granule starts an allocation unless it is *joined* to the previous one of its plane.
  ``u`` and ``u+1`` are joined iff both are non-aliased, or u backs (R, j) and u+1
  backs (R, j+1). So allocations = ``sum_P n_P - joins``, with join columns
  ``w[R,j,P,u] <= y[R,j,P,u], <= y[R,j+1,P,u+1]`` and
  ``z[P,u] <= 1 - sum y[.,P,u], <= 1 - sum y[.,P,u+1]`` (continuous in [0, 1]: for a
  fixed binary y the best w, z are exactly the real joins). Minimise
  ``sum_P n_P - sum w - sum z``.

The solution's y is turned into allocations here (own merge and gap fill), checked
with ``check_contract``, and its count must equal the model's objective. HiGHS runs
deterministically (one thread, seed 0, ``mip_rel_gap`` 0; ``mip_abs_gap`` 0.999, sound
because the optimum is an integer) with a generous time limit; "proven" means the plan's
count equals the dual bound rounded up.

Findings (each printed as a ``FAIL`` line; exit status 1 if any):

* ``wrong-optimal``: kvgrant says optimal but a contract-keeping plan here has fewer
  allocations (needs no proof: the plan is checked by check_contract);
* ``unsound-bound``: kvgrant's solver bound, packed bound or combinatorial bound is
  above a contract-keeping plan's count;
* ``kv-below-optimum``: kvgrant's plan is below this model's proven dual bound (then
  check_contract decides: ``kv-breaks-contract`` or ``model-too-strict``);
* ``model-cannot-express``: a contract-keeping plan (kvgrant's, the reference rule's or
  the naive one) is not a point of this model, or its point's objective is not its count;
* ``model-extract``: this model's plan breaks the contract or miscounts;
* ``conflict-mismatch``: the conflict sets computed here differ from kvgrant's.

Usage::

    .venv/bin/python benchmarks/cross_check_optimum.py --random 50
    .venv/bin/python benchmarks/cross_check_optimum.py --seeds random:1-4,mini:0-20 --json
    .venv/bin/python benchmarks/cross_check_optimum.py --seeds /tmp/xcheck/x.json

``--seeds`` takes comma-separated items: ``random:A-B`` (tools/gen_layout.py
``random_layout``), ``exporter:A-B`` (``exporter_layout``), ``odd:A-B``
(``odd_layout``), ``mini:A-B`` (the page-group exporter of tools/gen_layout.py at a
small scale and small G, :func:`mini_exporter`),
``own:A-B`` (:func:`small_random`, this script's own small random geometries), or a
geometry JSON path. ``--random N`` adds ``own:0-(N-1)``.
"""

from __future__ import annotations

import argparse
import bisect
import json
import math
import os
import pathlib
import random
import sys
import time
from dataclasses import dataclass, field
from typing import Any, Iterable

os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
os.environ.setdefault("KVGRANT_PLAN_CACHE", "off")

from kvgrant.layout.conflicts import declared_conflict_sets  # noqa: E402
from kvgrant.layout.contract import check_contract  # noqa: E402
from kvgrant.layout.geometry import Geometry, load_geometry, parse_geometry  # noqa: E402
from kvgrant.layout.plan import Allocation, PhysicalPlan  # noqa: E402
from kvgrant.layout.exact import _highs as silent_highs  # noqa: E402  (no model, a quiet HiGHS)
from kvgrant.layout.rules import finish_plan, naive_plan, reference_plan  # noqa: E402

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tools"))  # tools/ is not a package
import gen_layout  # noqa: E402  (tools/gen_layout.py: the seeded layout families)

__all__ = ["IndependentModel", "cross_check", "mini_exporter", "small_random", "solve"]


# --------------------------------------------------------------------------- model

Key = tuple[int, int, int, int]
"""(region index, region granule j, plane index, plane granule u)."""


def _merge_ranges(items: Iterable[tuple[int, int]]) -> list[tuple[int, int]]:
    out: list[list[int]] = []
    for s, e in sorted(items):
        if s >= e:
            continue
        if out and s <= out[-1][1]:
            out[-1][1] = max(out[-1][1], e)
        else:
            out.append([s, e])
    return [(s, e) for s, e in out]


class IndependentModel:
    """The disaggregated model of one geometry (see the module docstring)."""

    def __init__(self, g: Geometry, *, complete_check_limit: int = 150_000) -> None:
        self.g = g
        G = self.G = g.granularity
        self.planes = list(g.planes)
        self.regions = list(g.regions)
        self.n_plane = [g.plane_bytes(p.name) // G for p in self.planes]
        self.n_region = [-(-(r.rows * r.row_bytes) // G) for r in self.regions]
        self.conflicts = self._declared_conflicts()
        # merged page ranges per row, for subset tests by bisection
        self.ranges = {k: _merge_ranges((q, q + 1) for q in sorted(v))
                       for k, v in self.conflicts.items()}
        self.cand: dict[Key, list[tuple[int, int, int]]] = {}  # key -> (row, p0, p1) touched
        self._candidates()
        self.complete_checked = False
        pairs = sum(self.n_region) * sum(self.n_plane)
        if pairs <= complete_check_limit:
            self._complete_check()
            self.complete_checked = True

    # -- geometry, first principles ------------------------------------------
    def parts(self, ri: int, j: int) -> list[tuple[int, int, int]]:
        """Row parts of region granule j: (row k, offset in the granule, length)."""
        r = self.regions[ri]
        G, rb, total = self.G, r.row_bytes, r.rows * r.row_bytes
        out = []
        k = (j * G) // rb
        while k < r.rows and k * rb < (j + 1) * G:
            s = max(j * G, k * rb)
            e = min((j + 1) * G, (k + 1) * rb, total)
            if s < e:
                out.append((k, s - j * G, e - s))
            k += 1
        return out

    def touched(self, ri: int, j: int, pi: int, u: int) -> list[tuple[int, int, int]]:
        """(row, p0, p1): pages [p0, p1) each row part of (j, P, u) touches (none for
        a part wholly in the plane's tail)."""
        bpp = self.planes[pi].bytes_per_page
        pages = self.g.pages
        out = []
        for k, d, L in self.parts(ri, j):
            ps = u * self.G + d
            pe = ps + L
            p0, p1 = ps // bpp, min((pe - 1) // bpp + 1, pages)
            if p0 < p1:
                out.append((k, p0, p1))
        return out

    def _declared_conflicts(self) -> dict[tuple[int, int], set[int]]:
        """C_k from the declared aliases, byte-precise, computed here (not by kvgrant)."""
        g = self.g
        ridx = {r.name: i for i, r in enumerate(self.regions)}
        pidx = {p.name: i for i, p in enumerate(self.planes)}
        out: dict[tuple[int, int], set[int]] = {
            (ri, k): set() for ri, r in enumerate(self.regions) for k in range(r.rows)}
        for a in g.aliases:
            ri, pi = ridx[a.region], pidx[a.plane]
            r = self.regions[ri]
            bpp = self.planes[pi].bytes_per_page
            total = r.rows * r.row_bytes
            s0, e0 = a.offset, min(a.offset + a.length, total)
            k = s0 // r.row_bytes
            while k < r.rows and k * r.row_bytes < e0:
                s = max(s0, k * r.row_bytes)
                e = min(e0, (k + 1) * r.row_bytes)
                if s < e:
                    ps, pe = s - a.offset + a.plane_offset, e - a.offset + a.plane_offset
                    out[(ri, k)].update(range(ps // bpp, min((pe - 1) // bpp + 1, g.pages)))
                k += 1
        return out

    def _subset(self, row: tuple[int, int], p0: int, p1: int) -> bool:
        rs = self.ranges[row]
        i = bisect.bisect_right(rs, (p0, float("inf"))) - 1
        return i >= 0 and rs[i][0] <= p0 and p1 <= rs[i][1]

    def eligible(self, ri: int, j: int, pi: int, u: int) -> bool:
        """The direct test: every row part touches pages of its row's set only."""
        return all(self._subset((ri, k), p0, p1) for k, p0, p1 in self.touched(ri, j, pi, u))

    def _allowed_bytes(self, ri: int, k: int, pi: int) -> list[tuple[int, int]]:
        """Plane byte intervals whose pages all lie in C_k (tail bytes: no page)."""
        p = self.planes[pi]
        bpp, pages = p.bytes_per_page, self.g.pages
        size = self.n_plane[pi] * self.G
        iv = [(a * bpp, b * bpp if b < pages else size) for a, b in self.ranges[(ri, k)]]
        iv.append((pages * bpp, size))
        return _merge_ranges((s, min(e, size)) for s, e in iv)

    def _candidates(self) -> None:
        G = self.G
        allowed: dict[tuple[int, int, int], list[tuple[int, int]]] = {}
        for ri in range(len(self.regions)):
            for j in range(self.n_region[ri]):
                parts = self.parts(ri, j)
                for pi in range(len(self.planes)):
                    us: set[int] | None = None
                    for k, d, L in parts:
                        key = (ri, k, pi)
                        if key not in allowed:
                            allowed[key] = self._allowed_bytes(ri, k, pi)
                        got = set()
                        for lo, hi in allowed[key]:
                            umin = max(0, -(-(lo - d) // G))
                            umax = min(self.n_plane[pi] - 1, (hi - d - L) // G)
                            got.update(range(umin, umax + 1))
                        us = got if us is None else us & got
                        if not us:
                            break
                    for u in sorted(us or ()):
                        if not self.eligible(ri, j, pi, u):
                            raise AssertionError(f"interval eligibility admitted {(ri, j, pi, u)}"
                                                 " which the direct page test refuses")
                        self.cand[(ri, j, pi, u)] = self.touched(ri, j, pi, u)

    def _complete_check(self) -> None:
        """Every (j, P, u) pair by the direct test: the candidate set must be exactly
        the eligible pairs (no pair missed by the interval arithmetic)."""
        for ri in range(len(self.regions)):
            for j in range(self.n_region[ri]):
                for pi in range(len(self.planes)):
                    for u in range(self.n_plane[pi]):
                        if self.eligible(ri, j, pi, u) != ((ri, j, pi, u) in self.cand):
                            raise AssertionError(f"candidate set wrong at {(ri, j, pi, u)}")

    # -- the MIP ---------------------------------------------------------------
    def build(self) -> None:
        """Columns and rows (CSR); ``self.const`` is the objective's constant."""
        keys = sorted(self.cand)
        self.keys = keys
        self.col = {k: i for i, k in enumerate(keys)}
        ny = len(keys)
        cost = [0.0] * ny
        integ = [True] * ny
        rows: list[tuple[list[int], list[float], float, float]] = []
        inf = math.inf
        by_region: dict[tuple[int, int], list[int]] = {}
        by_plane: dict[tuple[int, int], list[int]] = {}
        cover: dict[tuple[int, int, int], list[int]] = {}
        for i, (ri, j, pi, u) in enumerate(keys):
            by_region.setdefault((ri, j), []).append(i)
            by_plane.setdefault((pi, u), []).append(i)
            for k, p0, p1 in self.cand[(ri, j, pi, u)]:
                for q in range(p0, p1):
                    cover.setdefault((ri, k, q), []).append(i)
        self.infeasible = []
        for ri in range(len(self.regions)):
            for j in range(self.n_region[ri]):
                cols = by_region.get((ri, j), [])
                if not cols:
                    self.infeasible.append(f"region granule {(ri, j)} has no eligible backing")
                rows.append((cols, [1.0] * len(cols), 1.0, 1.0))
        for (pi, u), cols in sorted(by_plane.items()):
            if len(cols) > 1:
                rows.append((cols, [1.0] * len(cols), -inf, 1.0))
        for (ri, k), pages in sorted(self.conflicts.items()):
            for q in sorted(pages):
                cols = cover.get((ri, k, q), [])
                if not cols:
                    self.infeasible.append(f"page {q} of row {(ri, k)} has no backing")
                rows.append((cols, [1.0] * len(cols), 1.0, inf))
        # aliased joins
        self.wcols: dict[Key, int] = {}
        ncol = ny
        for (ri, j, pi, u) in keys:
            nxt = (ri, j + 1, pi, u + 1)
            if nxt in self.col:
                self.wcols[(ri, j, pi, u)] = ncol
                rows.append(([ncol, self.col[(ri, j, pi, u)]], [1.0, -1.0], -inf, 0.0))
                rows.append(([ncol, self.col[nxt]], [1.0, -1.0], -inf, 0.0))
                ncol += 1
        # non-aliased joins
        self.zcols: dict[tuple[int, int], int] = {}
        const_joins = 0
        for pi in range(len(self.planes)):
            for u in range(self.n_plane[pi] - 1):
                a, b = by_plane.get((pi, u), []), by_plane.get((pi, u + 1), [])
                if not a and not b:
                    const_joins += 1
                    continue
                self.zcols[(pi, u)] = ncol
                for side in (a, b):
                    if side:
                        rows.append(([ncol, *side], [1.0] * (1 + len(side)), -inf, 1.0))
                ncol += 1
        nj = ncol - ny
        self.cost = cost + [-1.0] * nj
        self.integ = integ + [False] * nj
        self.ncol = ncol
        self.rows = rows
        self.const = sum(self.n_plane) - const_joins
        self.by_plane = by_plane

    # -- points ----------------------------------------------------------------
    def point_of(self, plan: PhysicalPlan | Iterable[Allocation]
                 ) -> tuple[list[float] | None, list[str]]:
        """The model point of a plan (its granule assignment and real joins), and the
        reasons it is not a point (a pair not eligible, a row of the model broken)."""
        G = self.G
        ridx = {r.name: i for i, r in enumerate(self.regions)}
        pidx = {p.name: i for i, p in enumerate(self.planes)}
        why: list[str] = []
        vals = [0.0] * self.ncol
        for a in getattr(plan, "allocations", plan):
            if a.region is None:
                continue
            for t in range(a.length // G):
                key = (ridx[a.region], a.region_offset // G + t, pidx[a.plane],
                       a.plane_offset // G + t)
                if key not in self.col:
                    why.append(f"pair {key} ({a.region} granule {key[1]} <- {a.plane} "
                               f"granule {key[3]}) is not eligible in this model")
                    continue
                vals[self.col[key]] += 1.0
        for k, c in self.wcols.items():
            nxt = (k[0], k[1] + 1, k[2], k[3] + 1)
            vals[c] = min(vals[self.col[k]], vals[self.col[nxt]])
        for (pi, u), c in self.zcols.items():
            busy = (sum(vals[i] for i in self.by_plane.get((pi, u), []))
                    + sum(vals[i] for i in self.by_plane.get((pi, u + 1), [])))
            vals[c] = 1.0 if busy == 0 else 0.0
        for n, (cols, coef, lo, hi) in enumerate(self.rows):
            s = sum(vals[c] * v for c, v in zip(cols, coef))
            if not (lo - 1e-9 <= s <= hi + 1e-9):
                why.append(f"model row {n} ({len(cols)} columns) = {s}, not in [{lo}, {hi}]")
                if len(why) > 10:
                    break
        return (None if why else vals), why

    def objective(self, vals: list[float]) -> float:
        return self.const + sum(c * v for c, v in zip(self.cost, vals))

    def plan_of(self, vals: list[float], label: str = "independent") -> PhysicalPlan:
        """Allocations of a solution, built here: aliased granules merged into runs
        contiguous in region and plane, one non-aliased allocation per maximal gap."""
        G = self.G
        chosen = sorted(k for k in self.keys if vals[self.col[k]] > 0.5)
        runs: list[list[int]] = []  # [ri, j0, pi, u0, n]
        for ri, j, pi, u in chosen:  # sorted by region, then j
            if runs:
                r = runs[-1]
                if r[0] == ri and r[2] == pi and r[1] + r[4] == j and r[3] + r[4] == u:
                    r[4] += 1
                    continue
            runs.append([ri, j, pi, u, 1])
        allocs: list[Allocation] = []
        used: dict[int, list[tuple[int, int]]] = {pi: [] for pi in range(len(self.planes))}
        for ri, j, pi, u, n in runs:
            allocs.append(Allocation(self.planes[pi].name, u * G, n * G,
                                     self.regions[ri].name, j * G))
            used[pi].append((u, u + n))
        for pi, spans in used.items():
            cursor = 0
            for s, e in sorted(spans) + [(self.n_plane[pi], self.n_plane[pi])]:
                if s > cursor:
                    allocs.append(Allocation(self.planes[pi].name, cursor * G,
                                             (s - cursor) * G))
                cursor = max(cursor, e)
        order = {p.name: i for i, p in enumerate(self.planes)}
        allocs.sort(key=lambda a: (order[a.plane], a.plane_offset))
        return PhysicalPlan(label, self.g, tuple(allocs))


# --------------------------------------------------------------------------- solve

@dataclass
class Solved:
    count: int | None  # allocations of the best plan found (checked by check_contract)
    dual: float  # HiGHS's dual bound (a valid lower bound on every plan)
    proven: bool
    status: str
    seconds: float
    plan: PhysicalPlan | None
    objective: float | None
    size: dict[str, int] = field(default_factory=dict)
    problems: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    def bound_usable(self) -> bool:
        """Whether ``dual`` is a finite lower bound of a model with plans."""
        return self.dual == self.dual and abs(self.dual) != math.inf


def solve(m: IndependentModel, *, time_limit: float = 120.0,
          starts: Iterable[PhysicalPlan] = ()) -> Solved:
    """Solve the model with HiGHS (deterministic options, ``time_limit`` as a net)."""
    t0 = time.perf_counter()
    if not hasattr(m, "rows"):
        m.build()
    size = {"y": len(m.keys), "w": len(m.wcols), "z": len(m.zcols), "rows": len(m.rows),
            "nonzeros": sum(len(r[0]) for r in m.rows)}
    if m.infeasible:
        return Solved(None, math.inf, False, "infeasible (by construction)",
                      time.perf_counter() - t0, None, None, size, list(m.infeasible))
    n = m.ncol
    best_start = None
    for plan in starts:
        vals, _ = m.point_of(plan)
        if vals is not None and (best_start is None
                                 or m.objective(vals) < m.objective(best_start)):
            best_start = vals
    problems: list[str] = []
    notes: list[str] = []
    if n == 0:  # nothing to choose (no region granule, planes of one granule)
        status, dual, vals, hobj = "Optimal (empty model)", float(m.const), [], float(m.const)
    else:
        status, dual, vals, hobj = _run_highs(m, time_limit, best_start)
        if vals is not None and best_start is not None \
                and abs(m.objective(vals) - hobj) > 1e-6:
            # HiGHS 1.16 quirk (seen with presolve on and a user solution): the
            # reported objective is the optimum's, the values are the start's. Solve
            # again without the start.
            notes.append(f"HiGHS returned values of objective {m.objective(vals)} while "
                         f"reporting {hobj}; solved again without the start")
            status, dual, vals, hobj = _run_highs(m, time_limit, None)
        if vals is None:
            return Solved(None, dual, False, status, time.perf_counter() - t0, None, None,
                          size, ["no feasible solution"], notes)
    # binary y exactly, joins recomputed from y (the real joins of the plan)
    yv = [1.0 if vals[i] > 0.5 else 0.0 for i in range(len(m.keys))]
    plan = m.plan_of(yv + [0.0] * (n - len(m.keys)))
    point, why = m.point_of(plan)
    count = len(plan.allocations)
    bad = check_contract(m.g, plan)
    if bad:
        problems.append(f"model-extract: this model's plan breaks the contract: "
                        f"{'; '.join(map(str, bad[:5]))}")
    if point is None:
        problems.append(f"model-extract: this model's plan is not its own point: {why[:3]}")
        obj = None
    else:
        obj = m.objective(point)
        if round(obj) != count:
            problems.append(f"model-extract: objective {obj} of the plan's point, but the "
                            f"plan has {count} allocations")
    fin = len(finish_plan(m.g, "fp", [a for a in plan.allocations if a.aliased]).allocations)
    if fin != count:
        problems.append(f"model-extract: finish_plan counts {fin} for this plan, here {count}")
    if hobj < count - 1e-6 and not bad:
        problems.append(f"model-extract: HiGHS objective {hobj} below the plan's {count}")
    finite = dual == dual and abs(dual) != math.inf
    proven = not bad and finite and count <= math.ceil(dual - 1e-6)
    return Solved(count if not bad else None, dual, proven, status,
                  time.perf_counter() - t0, plan, obj, size, problems, notes)


def _run_highs(m: IndependentModel, time_limit: float, start: list[float] | None
               ) -> tuple[str, float, list[float] | None, float]:
    """One HiGHS run of the model: (status, dual bound, values or None, objective)."""
    import highspy
    import numpy as np

    inf = highspy.kHighsInf
    h = silent_highs()
    n = m.ncol
    h.addCols(n, np.array(m.cost, dtype=np.float64), np.zeros(n), np.ones(n), 0,
              np.zeros(n, dtype=np.int32), np.array([], dtype=np.int32),
              np.array([], dtype=np.float64))
    ints = np.array([i for i in range(n) if m.integ[i]], dtype=np.int32)
    h.changeColsIntegrality(len(ints), ints, np.full(len(ints), highspy.HighsVarType.kInteger))
    starts_, index, value, lo, hi = [], [], [], [], []
    for cols, coef, a, b in m.rows:
        starts_.append(len(index))
        index.extend(cols)
        value.extend(coef)
        lo.append(-inf if a == -math.inf else a)
        hi.append(inf if b == math.inf else b)
    h.addRows(len(lo), np.array(lo, dtype=np.float64), np.array(hi, dtype=np.float64),
              len(index), np.array(starts_, dtype=np.int32), np.array(index, dtype=np.int32),
              np.array(value, dtype=np.float64))
    h.changeObjectiveOffset(float(m.const))
    for key, v in (("threads", 1), ("random_seed", 0), ("mip_rel_gap", 0.0),
                   ("mip_abs_gap", 0.999), ("time_limit", float(time_limit)),
                   ("presolve", "on")):
        h.setOptionValue(key, v)
    if start is not None:
        sol = highspy.HighsSolution()
        sol.col_value = start
        sol.value_valid = True
        h.setSolution(sol)
    h.run()
    status = h.modelStatusToString(h.getModelStatus())
    info = h.getInfo()
    if info.primal_solution_status != 2:
        return status, info.mip_dual_bound, None, math.inf
    return (status, info.mip_dual_bound, list(h.getSolution().col_value),
            info.objective_function_value)


# --------------------------------------------------------------------------- compare

def cross_check(g: Geometry, *, time_limit: float = 120.0, max_y: int = 400_000,
                kv_limits: dict[str, Any] | None = None) -> dict[str, Any]:
    """One layout: the independent optimum against plan_packed, its verdict and bounds."""
    from kvgrant.layout.bound import allocation_lower_bound
    from kvgrant.layout.planner import plan_packed

    row: dict[str, Any] = {"name": g.name, "chunks": len(g.aliases), "planes": len(g.planes),
                           "regions": len(g.regions),
                           "rows": sum(r.rows for r in g.regions), "G": g.granularity}
    fails: list[str] = []
    t0 = time.perf_counter()
    m = IndependentModel(g)
    row["complete_check"] = m.complete_checked
    mine = {(r, k): frozenset(v) for (ri, k), v in m.conflicts.items()
            for r in [m.regions[ri].name]}
    theirs = declared_conflict_sets(g)
    if mine != {k: frozenset(v) for k, v in theirs.items()}:
        fails.append("conflict-mismatch: declared conflict sets computed here differ from "
                     "kvgrant.layout.conflicts")
    row["y"] = len(m.cand)
    if len(m.cand) > max_y:
        row["skipped"] = f"{len(m.cand)} y columns > {max_y}"
        row["fails"] = fails
        return row
    m.build()

    t1 = time.perf_counter()
    try:
        kv = plan_packed(g, **(kv_limits or {}))
    except Exception as e:  # kvgrant refuses a layout the contract allows a plan for
        res = solve(m, time_limit=time_limit, starts=[p for p in (reference_plan(g),)
                                                      if not check_contract(g, p)])
        fails.append(f"kv-error: plan_packed raised {type(e).__name__}: {e}; this model "
                     f"finds a contract-keeping plan of {res.count} ({res.status})")
        row.update(kv_error=str(e), xc_count=res.count, xc_proven=res.proven,
                   xc_status=res.status, fails=fails)
        return row
    row["kv_seconds"] = round(time.perf_counter() - t1, 2)
    kvn = len(kv.plan.allocations)
    row["kv_packed"] = kvn
    row["kv_optimal"] = kv.optimal
    row["kv_verdict"] = kv.verdict()
    row["kv_bound"] = kv.bound
    row["kv_bound_source"] = kv.bound_source
    row["kv_source"] = kv.source
    ex = kv.exact
    row["kv_solver_cost"] = ex.cost if ex is not None else None
    row["kv_solver_bound"] = ex.bound if ex is not None else None
    row["kv_solver_optimal"] = ex.optimal if ex is not None else None
    row["kv_solver_source"] = ex.source if ex is not None else None
    lb = allocation_lower_bound(g).total
    row["comb_bound"] = lb
    ref = reference_plan(g)
    nai = naive_plan(g)
    row["reference"] = len(ref.allocations)
    row["naive"] = len(nai.allocations)
    kv_bad = check_contract(g, kv.plan)
    if kv_bad:
        fails.append(f"kv-breaks-contract: plan_packed's plan: {'; '.join(map(str, kv_bad[:5]))}")

    # every contract-keeping plan must be a point of this model, costing its count
    for label, plan in (("packed", kv.plan), ("reference", ref), ("naive", nai)):
        if check_contract(g, plan):
            continue
        vals, why = m.point_of(plan)
        if vals is None:
            fails.append(f"model-cannot-express: kvgrant's {label} plan keeps the contract but "
                         f"is not a point of this model: {why[:3]}")
        elif round(m.objective(vals)) > len(plan.allocations):
            fails.append(f"model-cannot-express: kvgrant's {label} plan has "
                         f"{len(plan.allocations)} allocations, its point here costs "
                         f"{m.objective(vals)}")
        elif round(m.objective(vals)) < len(plan.allocations) and label != "naive":
            row.setdefault("notes", []).append(
                f"kvgrant's {label} plan has {len(plan.allocations)} allocations; the same "
                f"assignment needs {round(m.objective(vals))} (unmerged pieces)")

    res = solve(m, time_limit=time_limit, starts=[p for p in (kv.plan, ref, nai)
                                                  if not check_contract(g, p)])
    row["seconds"] = round(time.perf_counter() - t0, 2)
    row["xc_seconds"] = round(res.seconds, 2)
    row["xc_size"] = res.size
    row["xc_status"] = res.status
    row["xc_count"] = res.count
    row["xc_dual"] = None if res.dual != res.dual or abs(res.dual) == math.inf \
        else round(res.dual, 4)
    row["xc_proven"] = res.proven
    fails += res.problems
    if res.notes:
        row.setdefault("notes", []).extend(res.notes)
    best = res.count  # a contract-keeping plan's count: no proof needed for these
    if best is not None:
        if kv.optimal and kvn > best:
            fails.append(f"wrong-optimal: plan_packed says optimal at {kvn}, a contract-keeping "
                         f"plan here has {best}")
        if ex is not None and ex.optimal and ex.cost > best:
            fails.append(f"wrong-optimal: exact_plan says optimal at {ex.cost}, a "
                         f"contract-keeping plan here has {best}")
        if kv.bound > best:
            fails.append(f"unsound-bound: plan_packed bound {kv.bound} ({kv.bound_source}) > "
                         f"a contract-keeping plan of {best}")
        if ex is not None and ex.bound > best:
            fails.append(f"unsound-bound: solver bound {ex.bound} > a contract-keeping plan "
                         f"of {best}")
        if lb > best:
            fails.append(f"unsound-bound: combinatorial bound {lb} > a contract-keeping plan "
                         f"of {best}")
    if res.bound_usable():
        floor = math.ceil(res.dual - 1e-6)
        if kvn < floor:
            if kv_bad:
                fails.append(f"kv-below-optimum: plan_packed {kvn} < proven bound {floor} here, "
                             "and it breaks the contract")
            else:
                fails.append(f"model-too-strict: plan_packed {kvn} keeps the contract but this "
                             f"model's bound is {floor}")
    if res.proven and best is not None:
        row["kv_gap_to_optimum"] = kvn - best
    row["fails"] = fails
    return row


# --------------------------------------------------------------------------- layouts


def small_random(seed: int) -> dict[str, Any]:
    """A small random valid geometry: G in 2..64, odd row sizes (rarely G-multiples),
    chunks of 1-4 granules crossing rows and reaching past the last row, several planes
    of mixed (sometimes equal) bytes per page with gaps between chunks, several regions.
    Chunks are cut at random, so straddling granules and swaps across planes appear."""
    rng = random.Random(f"xcheck-own-{seed}")
    G = rng.choice([2, 4, 8, 8, 16, 32, 64])
    nplanes = rng.choice([1, 2, 2, 3, 3, 4])
    pool = [rng.randint(1, 3 * G) for _ in range(rng.randint(1, 3))]
    bpps = [rng.choice(pool) for _ in range(nplanes)]
    nregions = rng.choice([1, 1, 2, 2, 3])
    regions = []
    for i in range(nregions):
        rows = rng.randint(1, 6)
        rb = rng.randint(1, 3 * G + 3)
        if rng.random() < 0.85 and rb % G == 0:
            rb += rng.randint(1, G - 1) if G > 1 else 1
        regions.append({"name": f"r{i}", "rows": rows, "row_bytes": rb,
                        **({"access": "owner"} if rng.random() < 0.3 else {})})
    units = [-(-(r["rows"] * r["row_bytes"]) // G) for r in regions]
    pieces = []  # (region, start unit, n units)
    maxlen = rng.choice([1, 2, 3, 4])
    for r, n in zip(regions, units):
        s = 0
        while s < n:
            k = min(n - s, rng.randint(1, maxlen))
            pieces.append((r["name"], s, k))
            s += k
    need = sum(units)
    slack = rng.choice([0, 0, 1, 2, 4, 8])
    # pages so that the planes hold every piece plus some free granules
    per_page = sum(bpps)
    pages = max(1, -(-(need + slack) * G // per_page))
    while True:
        caps = [-(-(pages * b) // G) for b in bpps]
        placed = _place_pieces(rng, pieces, caps)
        if placed is not None:
            break
        pages += 1 + pages // 8
    aliases = []
    for pi, items in placed.items():
        free = caps[pi] - sum(k for _, _, k in items)
        pos = 0
        for name, s, k in items:
            gap = rng.randint(0, free) if free and rng.random() < 0.4 else 0
            free -= gap
            pos += gap
            aliases.append({"region": name, "offset": s * G, "plane": f"p{pi}",
                            "plane_offset": pos * G, "length": k * G})
            pos += k
    rng.shuffle(aliases)
    return {"name": f"own-{seed}", "granularity": G, "pages": pages, "page_tokens": 16,
            "planes": [{"name": f"p{i}", "bytes_per_page": b} for i, b in enumerate(bpps)],
            "regions": regions, "aliases": aliases, "topology": {"ranks": 1}}


def _place_pieces(rng: random.Random, pieces: list[tuple[str, int, int]],
                  caps: list[int]) -> dict[int, list[tuple[str, int, int]]] | None:
    left = list(caps)
    out: dict[int, list[tuple[str, int, int]]] = {i: [] for i in range(len(caps))}
    mode = rng.random()
    for name, s, k in sorted(pieces, key=lambda x: -x[2]):
        fit = [i for i in range(len(caps)) if left[i] >= k]
        if not fit:
            return None
        i = rng.choice(fit)
        left[i] -= k
        out[i].append((name, s, k))
    for i in out:
        if mode < 0.4:  # in region order: declared runs already contiguous
            out[i].sort(key=lambda x: (x[0], x[1]))
        else:
            rng.shuffle(out[i])
    return out


def mini_exporter(seed: int) -> dict[str, Any]:
    """The page-group exporter of tools/gen_layout.py (``generate``) at a small scale:
    G = 256 bytes and the real page sizes scaled by 256 / 2 MiB (so bytes per page
    relative to G are as on H200: 144 = LATENT_8, 72 = LATENT_4, 18 = LATENT_1, ...),
    1-5 planes, 1-2 regions of 1-10 rows, claim or inward rounding, any interleave."""
    gen = gen_layout
    rng = random.Random(f"xcheck-mini-{seed}")
    sizes = [144, 90, 72, 18, 126, 288, 80]
    mix = rng.choice(["same", "mixed", "two"])
    n = rng.randint(1, 5)
    if mix == "same":
        b = rng.choice(sizes)
        planes = [(f"p{i}", b) for i in range(n)]
    elif mix == "two":
        b1, b2 = rng.sample(sizes, 2)
        planes = [(f"p{i}", b1 if i < max(1, n - 1) else b2) for i in range(n)]
    else:
        planes = [(f"p{i}", rng.choice(sizes)) for i in range(n)]
    regions = [gen.RegionSpec(f"r{i}", rng.randint(1, 10), rng.choice([0.5, 1, 1.1, 1.5, 2]),
                              rng.choice(["importers", "owner"]))
               for i in range(rng.choice([1, 1, 2]))]
    pages = rng.randint(20, 120)
    kw = dict(name=f"mini-{seed}", planes=planes, regions=regions, group_pages=rng.randint(2, 8),
              granularity=256, first_page=rng.randint(0, 6),
              rounding=rng.choice(["claim", "claim", "inward"]),
              interleave=rng.choice(["in-order", "zigzag", "shuffled"]))
    for _ in range(12):
        try:
            return gen.generate(pages=pages, **kw)
        except gen.RowBytesError:
            kw["regions"] = [gen.RegionSpec(r.name, r.rows, r.groups_per_row * 2, r.access)
                             for r in kw["regions"]]
        except ValueError:
            pages *= 2
    raise ValueError(f"mini-{seed}: no layout")


def _span(text: str) -> list[int]:
    if "-" in text:
        a, b = text.split("-", 1)
        return list(range(int(a), int(b) + 1))
    return [int(text)]


def layouts(spec: str, n_random: int) -> list[tuple[str, Any]]:
    """(name, thunk returning a Geometry) for ``--seeds`` and ``--random``."""
    out: list[tuple[str, Any]] = []
    items = [s for s in spec.split(",") if s] if spec else []
    if n_random:
        items.append(f"own:0-{n_random - 1}")
    for item in items:
        kind, _, rng = item.partition(":")
        if kind in ("random", "exporter", "odd", "mini", "own") and rng:
            for s in _span(rng):
                if kind == "random":
                    out.append((f"random-{s}", lambda s=s: parse_geometry(gen_layout.random_layout(s))))
                elif kind == "exporter":
                    out.append((f"exporter-{s}",
                                lambda s=s: parse_geometry(gen_layout.exporter_layout(s))))
                elif kind == "odd":
                    out.append((f"odd-{s}", lambda s=s: parse_geometry(gen_layout.odd_layout(s))))
                elif kind == "mini":
                    out.append((f"mini-{s}", lambda s=s: parse_geometry(mini_exporter(s))))
                else:
                    out.append((f"own-{s}", lambda s=s: parse_geometry(small_random(s))))
        else:
            out.append((pathlib.Path(item).stem, lambda p=item: load_geometry(p)))
    return out


def _line(r: dict[str, Any]) -> str:
    if "skipped" in r:
        return f"{r['name']}: skipped ({r['skipped']})"
    if "kv_error" in r:
        return f"{r['name']}: independent {r['xc_count']} | kvgrant error {r['kv_error']}"
    xc = r["xc_count"]
    proof = "proven" if r["xc_proven"] else f"unproven, status {r['xc_status']}, dual {r['xc_dual']}"
    return (f"{r['name']}: independent {xc} ({proof}, {r['xc_seconds']} s, "
            f"{r['xc_size'].get('y', 0)} y) | kvgrant packed {r['kv_packed']} "
            f"{'optimal' if r['kv_optimal'] else r['kv_verdict']} bound {r['kv_bound']} "
            f"({r['kv_bound_source']}), solver {r['kv_solver_cost']}/{r['kv_solver_bound']} "
            f"| comb bound {r['comb_bound']} | reference {r['reference']} naive {r['naive']}")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seeds", default="", help="comma-separated: random:A-B, exporter:A-B, odd:A-B, "
                    "mini:A-B, own:A-B or geometry JSON paths")
    ap.add_argument("--random", type=int, default=0, metavar="N",
                    help="add N of this script's own small random geometries (own:0-(N-1))")
    ap.add_argument("--time-limit", type=float, default=120.0,
                    help="HiGHS time limit per layout for the independent model (a net)")
    ap.add_argument("--kv", action="append", default=[], metavar="NAME=VALUE",
                    help="a work limit for plan_packed (node_limit, max_nonzeros, max_solves, "
                         "max_checks, max_windowed_nonzeros; 'none' for None), e.g. "
                         "max_nonzeros=1 to force the windows")
    ap.add_argument("--max-y", type=int, default=50_000,
                    help="skip layouts with more y columns than this")
    ap.add_argument("--json", action="store_true", help="print one JSON document at the end")
    ap.add_argument("--save-failures", default="/tmp/xcheck",
                    help="write the geometry of every failing layout here")
    args = ap.parse_args(argv)
    kv_limits = {}
    for item in args.kv:
        k, _, v = item.partition("=")
        kv_limits[k] = None if v.lower() == "none" else int(v)
    todo = layouts(args.seeds, args.random)
    if not todo:
        ap.error("nothing to check: give --seeds or --random")
    rows = []
    failed = 0
    for name, make in todo:
        try:
            g = make()
        except Exception as e:  # a generator that cannot build this seed
            print(f"{name}: not generated ({type(e).__name__}: {e})", file=sys.stderr)
            continue
        r = cross_check(g, time_limit=args.time_limit, max_y=args.max_y, kv_limits=kv_limits)
        if kv_limits:
            r["kv_limits"] = kv_limits
        rows.append(r)
        out = sys.stderr if args.json else sys.stdout  # --json: stdout is the document
        print(_line(r), file=out, flush=True)
        for f in r["fails"]:
            print(f"FAIL {r['name']}: {f}", file=out, flush=True)
        for note in r.get("notes", []):
            print(f"note {r['name']}: {note}", file=out, flush=True)
        if r["fails"]:
            failed += 1
            if args.save_failures:
                os.makedirs(args.save_failures, exist_ok=True)
                doc = json.loads(g.model_dump_json())
                with open(os.path.join(args.save_failures, f"{g.name}.json"), "w") as fh:
                    json.dump(doc, fh, indent=1)
    checked = [r for r in rows if "skipped" not in r and "kv_error" not in r]
    summary = {
        "layouts": len(rows), "checked": len(checked),
        "proven": sum(1 for r in checked if r["xc_proven"]),
        "skipped": sum(1 for r in rows if "skipped" in r),
        "kv_errors": sum(1 for r in rows if "kv_error" in r), "with_findings": failed,
        "kv_optimal": sum(1 for r in checked if r["kv_optimal"]),
        "kv_optimal_confirmed": sum(1 for r in checked if r["kv_optimal"] and r["xc_proven"]
                                    and r["xc_count"] == r["kv_packed"]),
        "kv_unproven_but_optimal": sum(1 for r in checked if not r["kv_optimal"]
                                       and r["xc_proven"] and r["xc_count"] == r["kv_packed"]),
        "kv_above_optimum": sum(1 for r in checked if r["xc_proven"]
                                and r["kv_packed"] > r["xc_count"]),
        "comb_bound_tight": sum(1 for r in checked if r["xc_proven"]
                                and r["comb_bound"] == r["xc_count"]),
    }
    if args.json:
        print(json.dumps({"summary": summary, "layouts": rows}, indent=1))
    else:
        print("summary: " + ", ".join(f"{k} {v}" for k, v in summary.items()))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
