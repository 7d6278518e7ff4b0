"""Prices for the Lagrangian bound (D) from an LP, and the pass that certifies them.

Why a module of its own: (D) (:func:`kvgrant.layout.bound.lagrangian_bound`) charges
the starts of label runs along each plane, with the rows that tie the planes together
priced: each label gets exactly its granules; each page of a row's conflict set is
touched by that row; at most one allocation crosses into each label from the label
before. Any prices give a bound (weak duality), and the best ones are the duals of
an LP over each plane class's labellings (the paths of an acyclic graph, whose flow
polytope is integral). This module builds and solves that LP and evaluates the
relaxation at its duals with a shortest-path pass of its own, so the bound rests on
the pass, never on the LP's value. Proof and figures: docs/layout.md, "(D) Lagrangian
relaxation".
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from kvgrant.layout.conflicts import declared_conflict_ranges
from kvgrant.layout.geometry import Geometry
from kvgrant.layout.granules import Labels

if TYPE_CHECKING:
    from kvgrant.layout.bound import _PlaneStates

__all__ = ["MAX_PRICE_LP_COLUMNS", "MAX_PRICE_LP_COVER_ENTRIES", "PRICE_LP_IPM_ITERATIONS",
           "Prices", "Touches", "lp_columns", "lp_prices", "priced_value", "touches"]

MAX_PRICE_LP_COLUMNS = 20_000
"""Largest price LP (in columns: about 4 per (granule, label) pair) solved for the
prices of (D); past it, or when the LP does not end, the prices come from the
subgradient steps. A count of the geometry, never a clock. Why: the LP over the needs
alone took 0.01-1.3 s on the benchmark's layouts measured (8,402 columns on
exporter-5, 13,082 on exporter-8, 12,302 on random-0) and 1.8 s at 5 times the
published scale (17,449), but 36 s at 20 times (70,104), where the subgradient takes
3.2 s (docs/layout.md, "(D) Lagrangian relaxation")."""
PRICE_LP_IPM_ITERATIONS = 200
"""Most interior-point iterations of the price LP (a count; the LPs measured ended in
fewer). Past it the subgradient prices are used."""
MAX_PRICE_LP_COVER_ENTRIES = 200_000
"""Most (state, page) entries of the coverage rows the price LP takes; past it the
LP has no coverage rows (still a bound, a weaker one). A count. Why: a tall region's
straddling labels have one part per row, and their pages are walked one by one."""


@dataclass(frozen=True)
class Touches:
    """The coverage rows of the price LP: ``rows`` distinct rows, and per plane class,
    per position of its states, per label state, the rows that state touches."""

    rows: int
    by_state: list[list[list[tuple[int, ...]]]]


@dataclass(frozen=True)
class Prices:
    """Prices of the relaxed rows: ``need`` per label (free sign), ``cover`` per
    coverage row (>= 0), ``enter`` per label (>= 0, for its one join in)."""

    need: list[float]
    cover: list[float]
    enter: list[float]


def touches(g: Geometry, lab: Labels, classes: list[tuple[int, list[int], list[list[int]]]]
            ) -> Touches | None:
    """The coverage rows for ``classes`` (per plane class: bytes per page, the granule
    of each position, the labels each position may take): per (region, row, page of
    its declared set), the label states whose row part touches that page, rows with
    the same states kept once. None past :data:`MAX_PRICE_LP_COVER_ENTRIES`, or when
    some page of a set is touched by no state (no plan keeps such a layout's contract;
    the exact planner says why)."""
    G = g.granularity
    sets = declared_conflict_ranges(g)
    entries: dict[tuple[str, int, int], list[tuple[int, int, int]]] = {}
    work = 0
    for c, (bpp, units, per_pos) in enumerate(classes):
        for pos, (u, labs) in enumerate(zip(units, per_pos)):
            for i, s in enumerate(labs):
                for region, row, o1, o2 in lab.parts[s]:
                    p0 = (u * G + o1) // bpp
                    p1 = min((u * G + o2 - 1) // bpp + 1, g.pages)
                    work += max(0, p1 - p0)
                    if work > MAX_PRICE_LP_COVER_ENTRIES:
                        return None
                    for q in range(p0, p1):
                        entries.setdefault((region, row, q), []).append((c, pos, i))
    rows: dict[tuple[tuple[int, int, int], ...], int] = {}
    by_state: list[list[list[list[int]]]] = [
        [[[] for _ in labs] for labs in per_pos] for _, _, per_pos in classes]
    for (region, row), ranges in sets.items():
        for a, b in ranges:
            for q in range(a, b):
                got = entries.get((region, row, q))
                if not got:
                    return None
                key = tuple(got)
                if key in rows:
                    continue
                rows[key] = len(rows)
                for c, pos, i in got:
                    by_state[c][pos][i].append(rows[key])
    return Touches(len(rows), [[[tuple(r) for r in st] for st in per_pos]
                               for per_pos in by_state])


def lp_columns(classes: list[tuple[int, "_PlaneStates"]]) -> int:
    """Columns of the price LP (per granule: new runs into each state, each state out
    to the next hub, and after the first granule the continuing arcs)."""
    return sum(2 * len(labs) + 2 + (u > 0) * (1 + sum(b >= 0 for b in same)
                                              + sum(b >= 0 for b in pred))
               for _, st in classes
               for u, (labs, same, pred) in enumerate(zip(st.labels, st.same, st.pred)))


def lp_prices(classes: list[tuple[int, "_PlaneStates"]], need: list[int],
              start: list[float], free_cost: float, cover: Touches | None) -> Prices | None:
    """The LP's prices: per plane class, ``mult`` paths through the pass's states (a
    flow; a new run enters a state from the granule's hub at its start cost, a
    continuation of the same label or of the label before is free) with each label
    getting exactly its need and, with ``cover``, each coverage row touched and each
    label entered from the label before at most once (without it those prices are
    0). The duals of those rows, or None when the LP is over
    :data:`MAX_PRICE_LP_COLUMNS` columns or does not end in
    :data:`PRICE_LP_IPM_ITERATIONS` interior-point iterations."""
    import highspy
    import numpy as np

    from kvgrant.layout.exact import _highs  # a silent instance (no banner on fd 1)

    if lp_columns(classes) > MAX_PRICE_LP_COLUMNS:
        return None
    nl = len(need)
    n_cover = cover.rows if cover is not None else 0
    n_enter = nl if cover is not None else 0  # the entry rows come with the coverage
    inf = highspy.kHighsInf
    lo = [float(n) for n in need] + [-inf] * n_enter + [1.0] * n_cover
    hi = [float(n) for n in need] + [1.0] * n_enter + [inf] * n_cover
    cost: list[float] = []
    col_rows: list[int] = []
    col_vals: list[float] = []
    starts = [0]

    def row(value: float) -> int:
        lo.append(value)
        hi.append(value)
        return len(lo) - 1

    def arc(c: float, rows: tuple[int, ...], ends: tuple[int, int]) -> None:
        cost.append(c)
        col_rows.extend((ends[0], ends[1]) + rows)
        col_vals.extend((-1.0, 1.0) + (1.0,) * len(rows))
        starts.append(len(col_rows))

    for c, (mult, st) in enumerate(classes):
        # node rows are (inflow - outflow): a hub per granule boundary (a new run may
        # start after any state) and a node per (granule, state)
        hub = row(-float(mult))  # the source: mult paths leave it
        prev: list[int] | None = None
        for pos, (labs, same, pred) in enumerate(zip(st.labels, st.same, st.pred)):
            nodes = [row(0.0) for _ in range(len(labs) + 1)]
            touched = cover.by_state[c][pos] if cover is not None else [()] * len(labs)
            arc(free_cost, (), (hub, nodes[0]))
            for i, s in enumerate(labs):
                arc(start[s], (s,) + tuple(nl + n_enter + r for r in touched[i]),
                    (hub, nodes[i + 1]))
            if prev is not None:
                arc(0.0, (), (prev[0], nodes[0]))  # non-aliased after non-aliased
                for i, s in enumerate(labs):
                    rows = (s,) + tuple(nl + n_enter + r for r in touched[i])
                    if same[i] >= 0:
                        arc(0.0, rows, (prev[same[i]], nodes[i + 1]))
                    if pred[i] >= 0:
                        entry = (nl + s,) if n_enter else ()
                        arc(0.0, rows + entry, (prev[pred[i]], nodes[i + 1]))
            hub = row(0.0)
            for node in nodes:
                arc(0.0, (), (node, hub))
            prev = nodes
        lo[hub] = hi[hub] = float(mult)  # the sink: mult paths end there
    h = _highs()
    h.setOptionValue("threads", 1)
    h.setOptionValue("solver", "ipm")
    h.setOptionValue("run_crossover", "off")
    h.setOptionValue("ipm_iteration_limit", PRICE_LP_IPM_ITERATIONS)
    lp = highspy.HighsLp()
    lp.num_col_, lp.num_row_ = len(cost), len(lo)
    lp.col_cost_ = np.array(cost)
    lp.col_lower_ = np.zeros(len(cost))
    lp.col_upper_ = np.full(len(cost), inf)
    lp.row_lower_ = np.array(lo)
    lp.row_upper_ = np.array(hi)
    lp.a_matrix_.format_ = highspy.MatrixFormat.kColwise
    lp.a_matrix_.start_ = np.array(starts, dtype=np.int32)
    lp.a_matrix_.index_ = np.array(col_rows, dtype=np.int32)
    lp.a_matrix_.value_ = np.array(col_vals)
    h.passModel(lp)
    h.run()
    if h.getModelStatus() != highspy.HighsModelStatus.kOptimal:
        return None
    dual = [float(v) for v in h.getSolution().row_dual]
    # the signs a bound needs: a >= row's price is >= 0, a <= row's <= 0 (an interior
    # point's duals may miss by a tolerance; clipped, they are still prices)
    enter = [max(0.0, -v) for v in dual[nl:nl + n_enter]] if n_enter else [0.0] * nl
    return Prices(dual[:nl], [max(0.0, v) for v in dual[nl + n_enter:nl + n_enter + n_cover]],
                  enter)


def priced_value(classes: list[tuple[int, "_PlaneStates"]], need: list[int],
                 prices: Prices, start: list[float], free_cost: float,
                 cover: Touches | None) -> float:
    """The relaxation (D) at ``prices``: the priced rows' right-hand sides plus each
    class's cheapest labelling (:func:`_priced_pass`) times its planes."""
    total = sum(p * n for p, n in zip(prices.need, need)) + sum(prices.cover) \
        - sum(prices.enter)
    for c, (mult, st) in enumerate(classes):
        earn = [[prices.need[s] + (sum(prices.cover[r] for r in cover.by_state[c][pos][i])
                                   if cover is not None else 0.0)
                 for i, s in enumerate(labs)] for pos, labs in enumerate(st.labels)]
        total += mult * _priced_pass(st, earn, start, free_cost, prices.enter)
    return total


def _priced_pass(states: "_PlaneStates", earn: list[list[float]], start: list[float],
                 free_cost: float, enter: list[float]) -> float:
    """Cheapest labelling of one plane's granules: a new run of label s costs
    ``start[s]`` (a non-aliased stretch ``free_cost``) unless it continues the same
    label, or the label before at ``enter[s]``; the i-th label state of position u
    earns ``earn[u][i]``. The value only (:func:`kvgrant.layout.bound._plane_pass`
    with these prices)."""
    prev: list[float] = []
    gmin = 0.0
    for labs, same, pred, gain in zip(states.labels, states.same, states.pred, earn):
        v = gmin + free_cost
        if prev and prev[0] < v:  # non-aliased after non-aliased
            v = prev[0]
        cur = [v]
        for i, s in enumerate(labs):
            v = gmin + start[s]
            sp, pp = same[i], pred[i]
            if sp >= 0 and prev[sp] < v:
                v = prev[sp]
            if pp >= 0 and prev[pp] + enter[s] < v:
                v = prev[pp] + enter[s]
            cur.append(v - gain[i])
        prev = cur
        gmin = min(cur)
    return gmin
