"""Pre-flight: will a plan exhaust the host's driver-handle budget?

Why: the driver counts (mapping, granted device) pairs against one pool per *host*,
shared by every process and GPU on it. On H200s with driver 580, ``cuMemSetAccess``
returned CUDA_ERROR_OUT_OF_MEMORY after 524,007 single-device grants of one 2 MiB
allocation in a fresh process (523,880 with PyTorch loaded; 261,940 two-device grants)
with 139 GiB free, and two processes at once failed at the same total together
(265,147 + 258,740 on two GPUs); extra allocations and ungranted mappings did not
lower it. So a plan's demand is the sum over its ranks of mappings x granted devices,
and it fits when that demand, what other kvgrant processes on the host hold (the host
ledger, :mod:`kvgrant.runtime.ledger`) and a reserve for users kvgrant cannot see
(NCCL's cuMem buffers, PyTorch expandable segments, other engines) stay within the
budget. This module checks the part it can see alone (demand + reserve); the ledger
adds the other holders atomically.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from typing import TYPE_CHECKING

from kvgrant.errors import ArgumentError, HandleBudgetError

if TYPE_CHECKING:
    from kvgrant.layout.geometry import Geometry
    from kvgrant.layout.plan import PhysicalPlan

__all__ = [
    "DEFAULT_HANDLE_BUDGET",
    "DEFAULT_HANDLE_RESERVE",
    "HandleDemand",
    "check_handle_budget",
    "handle_demand",
    "handle_demand_breakdown",
]

DEFAULT_HANDLE_BUDGET = 523_880
"""(mapping, device) grants a host held before cuMemSetAccess failed (H200, driver 580,
one process with PyTorch loaded; 524,007 in a fresh process). Measure yours with
``tools/measure_handle_budget.py`` on an idle host."""

DEFAULT_HANDLE_RESERVE = 4_096
"""Handles kept for users kvgrant cannot see on the host (NCCL cuMem buffers, PyTorch
expandable segments, another engine); ``--handle-reserve`` changes it."""


@dataclass(frozen=True)
class HandleDemand:
    """Driver-handle demand of one plan over all the ranks it runs (in one process).

    ``per_rank[r]`` and ``per_target["plane:NAME" | "region:NAME"]`` each sum to
    ``total``; ``mappings`` counts every mapping of every rank (granted or not).
    """

    total: int
    per_rank: dict[int, int]
    per_target: dict[str, int]
    mappings: int

    def contributors(self, limit: int = 5) -> list[tuple[str, int]]:
        """Largest contributors, targets first then ranks, each sorted by demand."""
        targets = sorted(self.per_target.items(), key=lambda kv: (-kv[1], kv[0]))[:limit]
        ranks = sorted(((f"rank {r}", n) for r, n in self.per_rank.items()),
                       key=lambda kv: (-kv[1], kv[0]))[:limit]
        return targets + ranks


def handle_demand_breakdown(g: "Geometry", plan: "PhysicalPlan", *,
                            declared: bool = False) -> HandleDemand:
    """Demand split per rank and per plane/region.

    Every rank maps every allocation into its plane (granted to owner + importers, or
    owner + declared readers when ``declared``) and, when aliased, into its region
    (granted the same, or owner only for ``access: owner`` regions).
    """
    from kvgrant.layout.geometry import require_geometry
    from kvgrant.layout.plan import PhysicalPlan

    require_geometry(g, "handle_demand")
    if not isinstance(plan, PhysicalPlan):
        raise ArgumentError(f"handle_demand: plan = {type(plan).__name__}: must be a "
                            "PhysicalPlan (e.g. kvgrant.layout.plans.packed_plan(g))",
                            argument="plan", value=plan)
    if not isinstance(declared, bool):  # "yes" was read as truthy, "" as False
        raise ArgumentError(f"handle_demand: declared = {declared!r}: must be True or False",
                            argument="declared", value=declared)
    plane_maps: Counter[str] = Counter(a.plane for a in plan.allocations)
    region_maps: Counter[str] = Counter(a.region for a in plan.allocations
                                        if a.region is not None)
    per_rank: dict[int, int] = {}
    per_target: Counter[str] = Counter()
    for r in range(g.topology.ranks):
        wide = g.granted_count(r, declared=declared)
        n = 0
        for name, count in plane_maps.items():
            per_target[f"plane:{name}"] += count * wide
            n += count * wide
        for name, count in region_maps.items():
            k = count * g.granted_count(r, name, declared=declared)
            per_target[f"region:{name}"] += k
            n += k
        per_rank[r] = n
    mappings = (sum(plane_maps.values()) + sum(region_maps.values())) * g.topology.ranks
    return HandleDemand(sum(per_rank.values()), per_rank, dict(per_target), mappings)


def handle_demand(g: "Geometry", plan: "PhysicalPlan", declared: bool = False) -> int:
    """Sum over ranks of mappings x granted devices (allocations and ungranted
    mappings do not count). ``declared`` grants every declared reader instead of
    owner + importers (the pre-fix behaviour, to show what it would cost)."""
    return handle_demand_breakdown(g, plan, declared=declared).total


def check_handle_budget(g: "Geometry", plan: "PhysicalPlan",
                        budget: int = DEFAULT_HANDLE_BUDGET, declared: bool = False, *,
                        reserve: int = 0) -> int:
    """Return the demand, or raise :class:`HandleBudgetError` when demand + ``reserve``
    exceeds ``budget`` (the host's; other kvgrant holders are the ledger's check).

    Raises
    ------
    HandleBudgetError
        Naming demand, reserve, budget, the overdraw and the largest contributors (per
        plane/region and per rank); nothing has touched the driver yet.
    ArgumentError
        ``budget`` or ``reserve`` is not a non-negative integer (a ValueError), or
        ``g`` / ``plan`` is not a Geometry / PhysicalPlan.
    """
    for name, v in (("budget", budget), ("reserve", reserve)):
        if not isinstance(v, int) or isinstance(v, bool) or v < 0:
            raise ArgumentError(f"check_handle_budget: {name} = {v!r}: must be a "
                                "non-negative integer", argument=name, value=v)
    d = handle_demand_breakdown(g, plan, declared=declared)
    if d.total + reserve <= budget:
        return d.total
    top = d.contributors(limit=3)
    shown = ", ".join(f"{name} {n:,}" for name, n in top)
    who = "declared readers" if declared else "owner + importers"
    kept = f" + a reserve of {reserve:,} for other users of the host" if reserve else ""
    raise HandleBudgetError(
        f"{plan.label} plan of {g.name!r} needs {d.total:,} driver handles (mappings x "
        f"granted devices, grants to {who}, {g.topology.ranks} ranks){kept}, but the "
        f"host's budget is {budget:,}, one pool for every process and GPU on it (over by "
        f"{d.total + reserve - budget:,}); largest: {shown}", demand=d.total, budget=budget,
        contributors=d.contributors(), reserve=reserve)
