"""Per-plan figures for ``kvgrant plan``: what each plan costs each rank and the host.

Why a module of its own: the CLI prints these figures as a table or as JSON, and tests
and benchmarks read the same numbers, so they are computed once, here, from the plan
alone (no driver): bytes, allocations, mappings, access grants (one
``cuMemSetAccess`` per mapping) and driver handles (mappings x granted devices) per
rank, the pre-flight demand of the whole host against the handle budget, and whether
the plan keeps the layout contract.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Sequence

from kvgrant.gc_pause import gc_paused
from kvgrant.layout.conflicts import declared_conflict_arrays, declared_conflict_ranges
from kvgrant.layout.contract import check_contract
from kvgrant.layout.planfile import geometry_hash, plan_document
from kvgrant.layout.preflight import handle_demand_breakdown

if TYPE_CHECKING:
    from kvgrant.layout.geometry import Geometry
    from kvgrant.layout.plan import PhysicalPlan
    from kvgrant.layout.planner import PackedResult

__all__ = [
    "PlanFigures",
    "RankFigures",
    "build_report",
    "format_report",
    "plan_figures",
]


@dataclass(frozen=True)
class RankFigures:
    """One rank's cost under one plan (handles with grants to owner + importers, and
    with grants to every declared reader)."""

    rank: int
    bytes: int
    allocations: int
    mappings: int
    grants: int
    handles: int
    handles_declared: int


@dataclass(frozen=True)
class PlanFigures:
    """One plan's figures: per rank, host demand for both grant policies, contract."""

    label: str
    ranks: tuple[RankFigures, ...]
    demand: int
    demand_declared: int
    budget: int
    contract: tuple[str, ...]
    reserve: int = 0            # handles kept for users kvgrant cannot see

    @property
    def margin(self) -> int:
        """``budget - reserve - demand``: what kvgrant alloc's pre-flight checks."""
        return self.budget - self.reserve - self.demand

    @property
    def margin_declared(self) -> int:
        return self.budget - self.reserve - self.demand_declared


def plan_figures(g: "Geometry", plan: "PhysicalPlan", budget: int,
                 reserve: int = 0) -> PlanFigures:
    """Compute a plan's :class:`PlanFigures` (pure arithmetic, no driver)."""
    own = handle_demand_breakdown(g, plan, declared=False)
    dec = handle_demand_breakdown(g, plan, declared=True)
    nbytes = sum(a.length for a in plan.allocations)
    n = len(plan.allocations)
    ranks = tuple(RankFigures(r, nbytes, n, plan.mappings, plan.mappings, own.per_rank[r],
                              dec.per_rank[r]) for r in range(g.topology.ranks))
    contract = tuple(str(v) for v in check_contract(g, plan))
    return PlanFigures(plan.label, ranks, own.total, dec.total, budget, contract, reserve)


def _rank_groups(figs: PlanFigures) -> list[tuple[list[int], RankFigures]]:
    """Consecutive ranks with identical figures, so 16 equal ranks print as one row."""
    out: list[tuple[list[int], RankFigures]] = []
    for rf in figs.ranks:
        key = dataclasses.replace(rf, rank=0)
        if out and dataclasses.replace(out[-1][1], rank=0) == key:
            out[-1][0].append(rf.rank)
        else:
            out.append(([rf.rank], rf))
    return out


def _lower_bound_json(bound: Any) -> dict[str, Any] | None:
    if bound is None:
        return None
    if dataclasses.is_dataclass(bound) and not isinstance(bound, type):
        # the fields asdict would keep, without deep-copying the tuples it drops (a
        # LowerBound's per-row figures: 2^20 of them in a tall region)
        out: dict[str, Any] = {}
        for f in dataclasses.fields(bound):
            v = getattr(bound, f.name)
            if isinstance(v, tuple):
                continue
            if not isinstance(v, (int, float, str, bool, type(None))):
                v = dataclasses.asdict(bound)[f.name]
            if isinstance(v, (int, float, str, bool, type(None), list, dict)):
                out[f.name] = v
        return out
    return {"total": int(bound.total)}


def _largest_set(ranges: Any) -> dict[str, Any] | None:
    """The first row with the most conflict pages (each distinct set is summed once:
    the rows of a tall region share a few sets)."""
    best, size = None, -1
    sizes: dict[Any, int] = {}
    for key, rs in ranges.items():
        n = sizes.get(rs)
        if n is None:
            n = sizes[rs] = sum(e - s for s, e in rs)
        if n > size:
            best, size = key, n
    return None if best is None else {"region": best[0], "row": best[1], "pages": size}


def _largest_declared_set(g: "Geometry") -> dict[str, Any] | None:
    """:func:`_largest_set` of the declared conflict sets, from their range arrays
    where there are some (a dict walk of 2^20 rows took most of a second)."""
    import numpy as np

    arr = declared_conflict_arrays(g)
    total = sum(r.rows for r in g.regions)
    if arr is None or total == 0:
        return _largest_set(declared_conflict_ranges(g))
    row, lo, hi = arr
    sizes = np.zeros(total, dtype=np.int64)
    np.add.at(sizes, row, hi - lo)
    i = int(np.argmax(sizes))  # the first row of the largest size, as _largest_set
    for r in g.regions:
        if i < r.rows:
            return {"region": r.name, "row": i, "pages": int(sizes.max())}
        i -= r.rows
    raise AssertionError("row index past the regions")  # pragma: no cover


@gc_paused()
def build_report(g: "Geometry", plans: Sequence["PhysicalPlan"], budget: int, *,
                 lower_bound: Any = None, include_plan: str | None = "packed",
                 packed: "PackedResult | None" = None,
                 handle_bound: dict[str, int] | None = None,
                 figures: "Sequence[PlanFigures] | None" = None,
                 reserve: int = 0) -> dict[str, Any]:
    """The whole ``kvgrant plan`` result as a JSON-ready dict.

    ``include_plan`` names the plan whose every allocation is listed (plane,
    plane_offset, length, and region, region_offset when aliased), so anyone can
    check it independently; that entry is a plan document
    (:func:`kvgrant.layout.planfile.plan_document`) that ``kvgrant alloc --plan``
    reads. ``packed`` adds the solver's verdict on the packed plan; ``handle_bound``
    the handles any contract-keeping plan needs (``importers`` / ``declared``).
    ``figures``: the plans' :func:`plan_figures`, when the caller has them already.
    ``reserve``: handles kept for users kvgrant cannot see; a verdict fits when
    ``demand + reserve <= budget``, as kvgrant alloc's pre-flight counts it.
    """
    largest = _largest_declared_set(g)
    if figures is None:
        figures = [plan_figures(g, p, budget, reserve) for p in plans]
    out: dict[str, Any] = {
        "geometry": {
            "name": g.name, "granularity": g.granularity, "pages": g.pages,
            "page_tokens": g.page_tokens, "ranks": g.topology.ranks,
            "planes": len(g.planes), "regions": len(g.regions),
            "rows": sum(r.rows for r in g.regions), "declared_chunks": len(g.aliases),
            "declared_bytes": sum(g.plane_bytes(p.name) for p in g.planes),
            "hash": geometry_hash(g),
            # a planning-only layout may have any granularity; memory needs a power of two
            "allocatable": not g.granularity & (g.granularity - 1),
        },
        "largest_conflict_set": largest,
        "lower_bound": _lower_bound_json(lower_bound),
        "handle_lower_bound": handle_bound,
        "packed_solver": None if packed is None else packed.to_json(),
        "handle_budget": budget,
        "handle_reserve": reserve,
        "plans": {},
    }
    for f in figures:
        out["plans"][f.label] = {
            "allocations": f.ranks[0].allocations if f.ranks else 0,
            "mappings": f.ranks[0].mappings if f.ranks else 0,
            "bytes": f.ranks[0].bytes if f.ranks else 0,
            "contract_violations": list(f.contract),
            "per_rank": [dataclasses.asdict(r) for r in f.ranks],
            "preflight": {
                "importers": {"demand": f.demand, "budget": budget, "reserve": reserve,
                              "margin": f.margin, "fits": f.margin >= 0},
                "declared": {"demand": f.demand_declared, "budget": budget,
                             "reserve": reserve, "margin": f.margin_declared,
                             "fits": f.margin_declared >= 0},
            },
        }
    if packed is not None and "packed" in out["plans"]:
        out["plans"]["packed"]["verdict"] = packed.verdict()
    for p in plans:
        if p.label == include_plan:
            out[f"{p.label}_plan"] = plan_document(p)
    return out


def _ranks_text(ranks: list[int]) -> str:
    if len(ranks) == 1:
        return f"rank {ranks[0]}"
    if ranks == list(range(ranks[0], ranks[-1] + 1)):
        return f"ranks {ranks[0]}-{ranks[-1]}"
    return "ranks " + ",".join(map(str, ranks))


def _size(n: int) -> str:
    """Bytes for people: MiB (one decimal) from 1 MiB up, exact bytes below."""
    return f"{n / (1 << 20):,.1f} MiB" if n >= 1 << 20 else f"{n:,} B"


def format_report(g: "Geometry", plans: Sequence["PhysicalPlan"], budget: int, *,
                  lower_bound: Any = None, packed: "PackedResult | None" = None,
                  handle_bound: dict[str, int] | None = None, reserve: int = 0) -> str:
    """The human-readable ``kvgrant plan`` output (same figures as :func:`build_report`)."""
    # each plan's figures once: they check the contract, linear in the region rows
    # (was computed twice: a region of 1,048,576 rows spent 150 s in the report)
    figures = [plan_figures(g, p, budget, reserve) for p in plans]
    rep = build_report(g, plans, budget, lower_bound=lower_bound, include_plan=None,
                       packed=packed, handle_bound=handle_bound, figures=figures,
                       reserve=reserve)
    geo = rep["geometry"]
    lines = [
        f"geometry {g.name!r}: {geo['ranks']} ranks, G = {_size(g.granularity)}, "
        f"{g.pages:,} pages x {g.page_tokens} tokens, {geo['planes']} planes, "
        f"{geo['regions']} regions ({geo['rows']} rows), {geo['declared_chunks']:,} "
        "declared chunks",
    ]
    lc = rep["largest_conflict_set"]
    lines.append("largest conflict set: " + (
        f"region {lc['region']!r} row {lc['row']}: {lc['pages']:,} pages" if lc else "none (no regions)"))
    lb = rep["lower_bound"]
    if lb is not None:
        extra = ""
        figs = rep["plans"].get("packed")
        if figs:
            gap = figs["allocations"] - lb["total"]
            pct = 100.0 * gap / lb["total"] if lb["total"] else 0.0
            extra = f" (packed plan: {figs['allocations']:,}, +{gap:,} = {pct:.1f}% above)"
        lines.append(f"allocation lower bound per rank (combinatorial): {lb['total']:,}{extra}")
    else:
        lines.append("allocation lower bound per rank: not computed")
    if packed is not None:
        which = ("the solver's dual bound" if packed.bound_source == "solver"
                 else "the combinatorial bound")
        proof = (f"{which} is {packed.bound:,}" if packed.bound > 0
                 else "the solver gave no bound")
        lines.append(f"packed plan: {len(packed.plan.allocations):,} allocations per rank, "
                     f"{packed.verdict()} ({proof}; {packed.source} plan)")
    lines.append("")
    header = (f"{'per rank':<14} {'plan':<10} {'bytes':>16} {'allocations':>12} "
              f"{'mappings':>9} {'grants':>7} {'handles':>10} {'handles(declared)':>18}")
    lines += [header, "-" * len(header)]
    for f in figures:
        for ranks, rf in _rank_groups(f):
            lines.append(f"{_ranks_text(ranks):<14} {f.label:<10} {_size(rf.bytes):>16} "
                         f"{rf.allocations:>12,} {rf.mappings:>9,} {rf.grants:>7,} "
                         f"{rf.handles:>10,} {rf.handles_declared:>18,}")
    lines.append("")
    kept = (f", less a reserve of {reserve:,} for users kvgrant cannot see (--handle-reserve, "
            f"as kvgrant alloc counts it): {budget - reserve:,} for kvgrant" if reserve else "")
    lines.append(f"pre-flight: all {g.topology.ranks} ranks, budget {budget:,} driver handles "
                 "(mapping x granted device) for the whole host, shared by every process and "
                 f"GPU on it{kept} (what others hold: kvgrant budget)")
    header = f"{'plan':<10} {'grants to':<18} {'demand':>10} {'margin':>10}  verdict"
    lines += [header, "-" * len(header)]
    for f in figures:
        for who, demand, margin in (("owner+importers", f.demand, f.margin),
                                    ("declared readers", f.demand_declared, f.margin_declared)):
            verdict = "fits" if margin >= 0 else "EXCEEDS BUDGET: start-up would fail"
            lines.append(f"{f.label:<10} {who:<18} {demand:>10,} {margin:>+10,}  {verdict}")
    if handle_bound is not None:
        lines.append("")
        lines.append("any plan that keeps the layout contract needs at least (all ranks of the host, however many processes):")
        for who, key in (("owner+importers", "importers"), ("declared readers", "declared")):
            need = handle_bound[key]
            verdict = "fits" if need + reserve <= budget else \
                "EXCEEDS BUDGET: no plan can start this layout on one host"
            lines.append(f"  {who:<18} {need:>10,} handles  {verdict}")
    lines.append("")
    for f in figures:
        status = "kept" if not f.contract else f"BROKEN ({len(f.contract)}): {f.contract[0]}"
        lines.append(f"layout contract, {f.label} plan: {status}")
    if not geo["allocatable"]:
        lines.append(f"note: granularity = {g.granularity} is not a power of two: these plans "
                     "can be checked, but allocating them is refused (the driver's "
                     "granularities are powers of two)")
    return "\n".join(lines)
