"""Neighbourhood search: lower a plan's allocations by solving small windows of labels
exactly, with every other column of the model fixed at the plan (fix-and-optimize).

Why: where the whole model's solve stops at its work limits with a gap of 1% or more,
the gap is often the plan's, not only the bound's. On unseen layouts the planner
returned 407 allocations against a bound of 367 (exporter-2081), 147 / 132
(random-112) and 273 / 234 (random-119); HiGHS's search over the whole model had not
found better plans that differ from these only inside a few rows. A window of 6 labels
is a model of a few hundred columns, which HiGHS solves in milliseconds to a second,
and sweeping such windows along the region found 376, 141 and 262 (docs/layout.md,
"Neighbourhood search: measured").

How: the model is the exact planner's (:func:`kvgrant.layout.exact._build`, without
the pass-through cuts, which only tighten its relaxation: a window's plan that loses a
join is simply no better). The plan gives every column a value. A window frees the
columns of every plane granule that one of its labels may take (their non-aliased,
label and join columns, and the joins into them); every other column keeps its value,
so each row becomes a row over the free columns with its bounds moved by the fixed
part. HiGHS solves that from the plan's own values, within :data:`WINDOW_NODES` nodes
and :data:`WINDOW_CHECKS` limit checks; its solution is extracted into a plan
(:func:`kvgrant.layout.exact._extract`), checked against the contract, and kept when
it needs fewer allocations. Windows start every :data:`WINDOW_STEP` labels; the sweep
repeats while it lowers the plan, up to :data:`MAX_SWEEPS` sweeps and
:data:`MAX_WINDOWS` window solves (a window whose start and rows did not change since
it was solved is skipped: it would give the same solution), and stops once the plan
is within the gap target of the bound.

Every limit is a count (one thread, fixed seed), so the result is a function of the
geometry and the plan it starts from, as the rest of planning is; ``deadline`` (the
caller's ``time_limit``) is the one clock, and stops the search between windows.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any, Callable

from kvgrant.layout import exact
from kvgrant.layout.contract import check_contract
from kvgrant.layout.geometry import Geometry
from kvgrant.layout.plan import PhysicalPlan

__all__ = ["MAX_SWEEPS", "MAX_WINDOWS", "Searched", "WINDOW_CHECKS", "WINDOW_LABELS",
           "WINDOW_NODES", "WINDOW_STEP", "search"]

WINDOW_LABELS = 6
"""Consecutive labels (region order) whose granules one window frees. In a first
version (the whole model with its bounds changed per window), 10 labels every 5
planned 382, 142, 269 and 743 on exporter-2081, random-112, random-119 and
exporter-2117, against 375, 142, 261 and 744 with 6 every 3, in more time (88 s
against 80 s of CPU for those four and random-96)."""
WINDOW_STEP = 3
"""Labels between the first labels of consecutive windows (windows overlap by half)."""
WINDOW_NODES = 50
"""Branch-and-bound nodes per window solve (the repair's limit)."""
WINDOW_CHECKS = 20
"""HiGHS limit checks per window solve (see :data:`kvgrant.layout.exact.DEFAULT_MAX_CHECKS`):
without it some windows spent seconds in root cut rounds. In the first version 8
checks kept less of the gain (exporter-2081 395 against 375 with 20)."""
MAX_SWEEPS = 5
"""Sweeps over every window; a sweep that lowers nothing ends the search sooner. A
window whose start and rows are as when it was last solved is not solved again, so a
later sweep costs only the windows near the changes."""
MAX_WINDOWS = 400
"""Window solves in all, a cap on the search for layouts of many labels (the first
sweep of the layouts measured made 27-43 window solves, of 0.01-0.8 s each)."""


@dataclass(frozen=True)
class Searched:
    """What a search did: the best plan (the start when nothing was better), its
    allocations, and the window solves, the windows that lowered the plan and the
    sweeps made."""

    plan: PhysicalPlan
    cost: int
    windows: int
    improved: int
    sweeps: int


class _Windows:
    """The model as numpy arrays, and a window's model over its free columns."""

    def __init__(self, g: Geometry) -> None:
        import numpy as np

        self.m, self.lab = exact._build(g, 1.0, {}, pass_through=False)
        self.runs = 0  # window solves made
        m = self.m
        starts, index, values = exact._csr(m.rows)
        self.index = np.asarray(index, dtype=np.int64)
        self.values = np.asarray(values, dtype=np.float64)
        counts = np.diff(np.append(np.asarray(starts, dtype=np.int64), len(index)))
        self.row_of = np.repeat(np.arange(len(m.rows), dtype=np.int64), counts)
        self.row_lo = np.asarray(m.rows_lo, dtype=np.float64)
        self.row_hi = np.asarray(m.rows_hi, dtype=np.float64)
        self.cost = np.asarray(m.cost, dtype=np.float64)
        self.lower = np.asarray(m.lower, dtype=np.float64)
        self.upper = np.asarray(m.upper, dtype=np.float64)
        joins: dict[tuple[int, int], list[int]] = {}
        for (c, u, _, _), col in m.f.items():
            joins.setdefault((c, u), []).append(col)
        self.by_label: list[list[int]] = [[] for _ in self.lab.need]
        for (c, u), ls in m.at.items():
            cols = [m.z[(c, u)], *(m.x[(c, u, l_)] for l_ in ls),
                    *joins.get((c, u), ()), *joins.get((c, u - 1), ())]
            for l_ in ls:
                self.by_label[l_].extend(cols)

    def free_columns(self, first: int, count: int) -> Any:
        """The sorted columns a window of ``count`` labels from ``first`` frees."""
        import numpy as np

        cols = [c for l_ in range(first, min(first + count, len(self.by_label)))
                for c in self.by_label[l_]]
        return np.unique(np.asarray(cols, dtype=np.int64))

    def solve(self, x: Any, free: Any, nodes: int, checks: int, deadline: float | None,
              solved: set[bytes]) -> Any | None:
        """Column values equal to ``x`` off ``free`` and HiGHS's best solution of the
        window on it within ``nodes`` and ``checks`` (None when it found none); starts
        from ``x``. ``solved`` holds the windows already solved (their start and row
        bounds): such a window is not solved again (None), since the same model from
        the same start gives the same solution, which did not lower the plan then."""
        import highspy
        import numpy as np

        is_free = np.zeros(len(x), dtype=bool)
        is_free[free] = True
        on = is_free[self.index]
        fixed = np.bincount(self.row_of[~on], weights=self.values[~on] * x[self.index[~on]],
                            minlength=len(self.row_lo))
        rows = self.row_of[on]
        touched = np.unique(rows)
        local = np.searchsorted(touched, rows)
        starts = np.searchsorted(local, np.arange(len(touched)))
        column = np.full(len(x), -1, dtype=np.int64)
        column[free] = np.arange(len(free))
        with np.errstate(invalid="ignore"):  # inf - finite stays inf
            lo = self.row_lo[touched] - fixed[touched]
            hi = self.row_hi[touched] - fixed[touched]
        key = b"".join(a.tobytes() for a in (free, x[free], lo, hi))
        if key in solved:
            return None
        solved.add(key)
        self.runs += 1
        h = exact._mip(self.cost[free], self.lower[free], self.upper[free], lo, hi, starts,
                       column[self.index[on]], self.values[on], nodes)
        exact._count_checks(h, checks)[1] = 0  # no progress messages from a window
        start = highspy.HighsSolution()
        start.col_value = list(x[free])
        start.value_valid = True
        h.setSolution(start)
        exact.arm_clock(h, deadline)
        h.run()
        if exact.out_of_time(h, deadline, "one neighbourhood-search window solve"):
            return None
        if h.getInfo().primal_solution_status != 2:
            return None
        out = x.copy()
        out[free] = np.round(np.asarray(h.getSolution().col_value, dtype=np.float64))
        return out


def search(g: Geometry, plan: PhysicalPlan, *, bound: int, max_gap: float,
           node_limit: int | None = None, max_checks: int | None = None,
           deadline: float | None = None,
           progress: Callable[[str], None] | None = None) -> Searched | None:
    """The best plan found by sweeping windows of labels from ``plan`` (see the module
    docstring), or None when ``plan`` has no values in the exact model (a plan no
    window could start from). Stops early once a plan is within ``max_gap`` of
    ``bound`` (a lower bound on every plan), and between windows at ``deadline``.
    Each window solve stops at :data:`WINDOW_NODES` nodes and :data:`WINDOW_CHECKS`
    checks, or at the caller's ``node_limit`` and ``max_checks`` (the planner's work
    limits) when smaller, as a repair does: planning with small limits stays cheap."""
    import numpy as np

    win = _Windows(g)
    m, lab = win.m, win.lab
    vals = exact._start_values(g, m, lab, plan)
    if vals is None:
        return None
    x = np.asarray(vals, dtype=np.float64)
    nodes = WINDOW_NODES if node_limit is None else min(WINDOW_NODES, node_limit)
    checks = WINDOW_CHECKS if max_checks is None else min(WINDOW_CHECKS, max_checks)
    best, best_cost = plan, len(plan.allocations)
    improved = sweeps = 0
    solved: set[bytes] = set()
    starts = range(0, max(1, len(lab.need) - WINDOW_LABELS + WINDOW_STEP), WINDOW_STEP)
    while sweeps < MAX_SWEEPS and win.runs < MAX_WINDOWS:
        sweeps += 1
        before = best_cost
        for first in starts:
            if exact.within_gap(best_cost, bound, max_gap) or win.runs >= MAX_WINDOWS or (
                    deadline is not None and time.perf_counter() >= deadline):
                return Searched(best, best_cost, win.runs, improved, sweeps)
            got = win.solve(x, win.free_columns(first, WINDOW_LABELS), nodes, checks,
                            deadline, solved)
            # an equal objective may still extract into fewer allocations (the model
            # counts only the joins its columns say); the start itself cannot
            if got is None or float(win.cost @ got) > float(win.cost @ x) + 1e-6 \
                    or np.array_equal(got, x):
                continue
            new, _lost = exact._extract(g, m, lab, got, plan.label)
            new = PhysicalPlan(plan.label, g, new.allocations, (
                "neighbourhood search (windows of labels solved by HiGHS)",))
            cost = len(new.allocations)
            if cost >= best_cost or check_contract(g, new):
                continue
            again = exact._start_values(g, m, lab, new)
            if again is None:  # pragma: no cover - an extracted plan is the model's
                continue
            best, best_cost, x = new, cost, np.asarray(again, dtype=np.float64)
            improved += 1
        if progress:
            progress(f"neighbourhood search: sweep {sweeps}, {best_cost:,} allocations "
                     f"({win.runs:,} window solves)")
        if best_cost == before:
            break
    return Searched(best, best_cost, win.runs, improved, sweeps)
