"""The exact model solved window by window along the plane order (a decomposition).

Why: a layout whose exact model is too large for one solve (tens of thousands of
declared chunks) is a long chain of rows that share pages only with their
neighbours. Solving it a window of labels at a time gives a plan close to the
optimum at a cost that grows with the number of windows; the heuristic packer takes
about as long and plans more (the published layout at 20 times its scale: 25,981
allocations in 41 to 48 s of CPU against the packer's 27,989 in 34 to 37 s). It
proves nothing by itself: the caller reports the plan against a lower bound.

Labels are taken in the order of the first page their granules touch (region order
is not the plane order: a later region may alias the same pages as an earlier one).
A window solves ``core`` labels, then ``margin`` more with their whole model (so the
core leaves them what they need), then ``horizon`` more with only their need and
their granules (a chain of rows with no spare granules passes a shortage far down).
Its model is the full model (:func:`kvgrant.layout.exact._build`) restricted:

* columns of earlier windows' labels are constants, columns of later labels are 0;
* rows that tie a granule's labels (``assign``) or a join to its granule (``join``)
  keep their other terms as constants; a label's need, coverage, joins-in and cuts
  are kept only when every label in them is solved in this window.

The core's columns are then fixed and the next window starts after it. When a
window has no solution (an earlier window took what a later label needed), it is
merged with the window before it and solved again, up to :data:`MAX_MERGES` times.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Callable, Sequence

from kvgrant.layout.exact import (_FREE, OutOfTime, _count_checks, _mip, _Model, arm_clock,
                                  out_of_time)

__all__ = ["MAX_MERGES", "WindowResult", "first_window_refusal", "solve_windows"]

MAX_MERGES = 8
"""Windows merged with the one before after finding no solution, in all."""

_KEEP_LATER_AS_ZERO = frozenset({"assign", "join"})
_HORIZON_KINDS = frozenset({"assign", "join", "need"})


@dataclass
class WindowResult:
    """Column values of the whole model (None when the windows found no plan)."""

    values: list[float] | None
    windows: int
    merges: int
    status: str
    sizes: list[int] = field(default_factory=list)  # nonzeros per window solved


@dataclass
class _Chain:
    """The model's columns and rows indexed by label rank (the window order)."""

    max_rank: list[int]  # per column: the highest rank it is about (-1: none)
    is_x: list[bool]
    granule: list[tuple[int, int]]  # per column: its (class, granule)
    rows_of_rank: list[list[int]]
    rows_of_granule: dict[tuple[int, int], list[int]]
    granules_of_rank: list[set[tuple[int, int]]]
    cols_of_rank: list[list[int]]


def _label_order(m: _Model, nl: int, granularity: int) -> list[int]:
    """Labels by the first page their eligible granules touch, then by number."""
    first = [float("inf")] * nl
    for (c, u, l_) in m.x:
        page = u * granularity // m.classes[c][0]
        if page < first[l_]:
            first[l_] = page
    return sorted(range(nl), key=lambda l_: (first[l_], l_))


def _chain(m: _Model, nl: int, granularity: int) -> _Chain:
    rank = [0] * nl
    for i, l_ in enumerate(_label_order(m, nl, granularity)):
        rank[l_] = i
    ncol = len(m.lower)
    ranks: list[tuple[int, ...]] = [()] * ncol
    granule: list[tuple[int, int]] = [(-1, -1)] * ncol
    is_x = [False] * ncol
    for (c, u, l_), col in m.x.items():
        ranks[col], granule[col], is_x[col] = (rank[l_],), (c, u), True
    for (c, u), col in m.z.items():
        granule[col] = (c, u)
    for (c, u, a, b), col in m.f.items():
        ranks[col] = tuple(rank[x] for x in (a, b) if x != _FREE)
        granule[col] = (c, u)
    max_rank = [max(rs) if rs else -1 for rs in ranks]
    rows_of_rank: list[list[int]] = [[] for _ in range(nl)]
    rows_of_granule: dict[tuple[int, int], list[int]] = {}
    for r, ents in enumerate(m.rows):
        rs = {x for col, _ in ents for x in ranks[col]}
        for x in rs:
            rows_of_rank[x].append(r)
        if not rs:
            rows_of_granule.setdefault(granule[ents[0][0]], []).append(r)
    granules_of_rank: list[set[tuple[int, int]]] = [set() for _ in range(nl)]
    for (c, u, l_) in m.x:
        granules_of_rank[rank[l_]].add((c, u))
    cols_of_rank: list[list[int]] = [[] for _ in range(nl)]
    for col, x in enumerate(max_rank):
        if x >= 0:
            cols_of_rank[x].append(col)
    return _Chain(max_rank, is_x, granule, rows_of_rank, rows_of_granule, granules_of_rank,
                  cols_of_rank)


def _window_rows(m: _Model, ch: _Chain, value: list[float | None], a: int, e: int,
                 end: int) -> tuple[list[int], list[float], list[float], list[int],
                                    list[int], list[float]]:
    """The window's model in CSR form: (columns, row lower, row upper, row starts,
    local column index, coefficients); see the module docstring for what is kept."""
    grans: set[tuple[int, int]] = set()
    rows: set[int] = set()
    for x in range(a, end):
        grans |= ch.granules_of_rank[x]
        rows.update(ch.rows_of_rank[x])
    for gr in grans:
        rows.update(ch.rows_of_granule.get(gr, ()))
    local: dict[int, int] = {}
    cols: list[int] = []
    lo_out: list[float] = []
    hi_out: list[float] = []
    starts: list[int] = []
    index: list[int] = []
    coefs: list[float] = []
    for r in sorted(rows):
        kind = m.kinds[r]
        const = 0.0
        ents: list[tuple[int, float]] = []
        keep = True
        for col, k in m.rows[r]:
            fixed = value[col]
            x = ch.max_rank[col]
            if fixed is not None:
                const += k * fixed
            elif x >= e and kind not in _HORIZON_KINDS:
                keep = False  # a later window's row
                break
            elif x >= end or (x >= e and not ch.is_x[col]):
                if kind not in _KEEP_LATER_AS_ZERO:
                    keep = False
                    break
            elif x >= 0 or ch.granule[col] in grans:
                ents.append((col, k))
            else:
                keep = False  # a granule no label of the window may take
                break
        if not keep or not ents:
            continue
        starts.append(len(index))
        for col, k in ents:
            if col not in local:
                local[col] = len(cols)
                cols.append(col)
            index.append(local[col])
            coefs.append(k)
        lo, hi = m.rows_lo[r], m.rows_hi[r]
        lo_out.append(lo - const)
        hi_out.append(hi - const)
    return cols, lo_out, hi_out, starts, index, coefs


def _solve(m: _Model, cols: list[int], lo: list[float], hi: list[float], starts: list[int],
           index: list[int], coefs: list[float], node_limit: int | None,
           max_checks: int | None, deadline: float | None = None) -> list[float] | None:
    """One window's MIP under the planner's deterministic limits; None: no solution.
    Raises :class:`~kvgrant.layout.exact.OutOfTime` when it reaches ``deadline``."""
    h = _mip([m.cost[c] for c in cols], [m.lower[c] for c in cols],
             [m.upper[c] for c in cols], lo, hi, starts, index, coefs, node_limit)
    _count_checks(h, max_checks)
    arm_clock(h, deadline)
    h.run()
    if out_of_time(h, deadline, f"one window solve ({len(index):,} nonzeros)"):
        raise OutOfTime
    if h.getInfo().primal_solution_status != 2:
        return None
    return list(h.getSolution().col_value)


def first_window_refusal(m: _Model, nl: int, granularity: int,
                         kept_later: Callable[[list[int], int], int],
                         max_window_nonzeros: int, *, core: int = 80, margin: int = 20,
                         horizon: int = 100) -> str | None:
    """Why :func:`solve_windows` would refuse ``m`` at its first window (its status),
    or None when the first window is within ``max_window_nonzeros``.

    ``m`` lacks rows that are added later (the coverage rows); ``kept_later(rank, e)``
    counts the nonzeros of those the first window keeps, given each label's rank and
    the window's end ``e``. The first window fixes nothing before it, so its size is a
    function of the model alone, and each row is kept or dropped on its own: its
    count is this one, and nothing is solved to find it."""
    if nl <= 0:
        return None
    rank = [0] * nl
    for i, l_ in enumerate(_label_order(m, nl, granularity)):
        rank[l_] = i
    ch = _chain(m, nl, granularity)
    b = min(nl, core)
    e = min(nl, b + margin)
    end = min(nl, e + horizon)
    index = _window_rows(m, ch, [None] * len(m.lower), 0, e, end)[4]
    size = len(index) + kept_later(rank, e)
    if size > max_window_nonzeros:
        return (f"window 1 (labels 0-{e - 1:,}) has {size:,} nonzeros, over "
                f"{max_window_nonzeros:,}")
    return None


def solve_windows(m: _Model, need: Sequence[int], granularity: int, *, core: int = 80,
                  margin: int = 20, horizon: int = 100, node_limit: int | None = 300,
                  max_checks: int | None = 20, max_window_nonzeros: int | None = None,
                  progress: Callable[[str], None] | None = None,
                  deadline: float | None = None) -> WindowResult:
    """Column values for the whole model ``m``, window by window (module docstring).

    Deterministic: every limit is a count (labels per window, nodes and limit checks
    per window solve, merges), never a clock, unless the caller gives a ``deadline``
    (a :func:`time.perf_counter` reading; ``kvgrant plan --time-limit``): reaching it
    ends the attempt, no plan. A window over ``max_window_nonzeros`` (labels whose
    granules span most of the planes) ends it too.
    """
    nl = len(need)
    ch = _chain(m, nl, granularity)
    value: list[float | None] = [None] * len(m.lower)
    starts_done: list[int] = []  # where each fixed window began
    sizes: list[int] = []
    a, width, merges, windows = 0, core, 0, 0
    while a < nl:
        b = min(nl, a + width)
        e = min(nl, b + margin)
        end = min(nl, e + horizon)
        cols, lo, hi, starts, index, coefs = _window_rows(m, ch, value, a, e, end)
        windows += 1
        sizes.append(len(index))
        if max_window_nonzeros is not None and len(index) > max_window_nonzeros:
            return WindowResult(None, windows, merges,
                                f"window {windows} (labels {a:,}-{e - 1:,}) has "
                                f"{len(index):,} nonzeros, over {max_window_nonzeros:,}",
                                sizes)
        if deadline is not None and time.perf_counter() >= deadline:
            return WindowResult(None, windows, merges, "the time limit ran out before "
                                f"window {windows}", sizes)
        try:
            sol = _solve(m, cols, lo, hi, starts, index, coefs, node_limit, max_checks,
                         deadline)
        except OutOfTime:
            return WindowResult(None, windows, merges, f"the time limit ran out in window "
                                f"{windows}", sizes)
        if sol is None:
            if not starts_done or merges >= MAX_MERGES:
                return WindowResult(None, windows, merges,
                                    f"no plan for labels {a:,}-{e - 1:,} (window {windows}, "
                                    f"after {merges} merges)", sizes)
            merges += 1
            prev = starts_done.pop()
            for x in range(prev, a):  # un-fix the window before and solve both at once
                for col in ch.cols_of_rank[x]:
                    value[col] = None
            a, width = prev, (a - prev) + width
            continue
        got = dict(zip(cols, sol))
        for x in range(a, b):
            for col in ch.cols_of_rank[x]:
                value[col] = float(round(got.get(col, 0.0)))
        if progress and (windows == 1 or windows % 10 == 0 or b == nl):
            progress(f"window {windows}: labels {a:,}-{b - 1:,} of {nl:,} "
                     f"({len(cols):,} columns, {len(lo):,} rows)")
        starts_done.append(a)
        a, width = b, core
    return WindowResult(_complete(m, value), windows, merges, "solved", sizes)


def _complete(m: _Model, value: list[float | None]) -> list[float]:
    """Every column's value: granules no label took are non-aliased, and consecutive
    non-aliased granules of a class join as far as their counts allow."""
    out = [0.0 if v is None else v for v in value]
    mults = [len(idx) for _, _, idx in m.classes]
    for (c, u), zc in m.z.items():
        out[zc] = mults[c] - sum(out[m.x[(c, u, l_)]] for l_ in m.at[(c, u)])
    for (c, u, a, _b), fc in m.f.items():
        if a == _FREE:
            out[fc] = min(out[m.z[(c, u)]], out[m.z[(c, u + 1)]])
    return out
