"""Pre-flight: will a host run as one process exhaust the driver-handle budget?

Why: the driver hands out resource handles per process and counts (mapping, granted
device) pairs. On an H200 with driver 580, ``cuMemSetAccess`` returned
CUDA_ERROR_OUT_OF_MEMORY after 523,880 single-device grants (261,940 two-device
grants) of one 2 MiB allocation with 139 GiB free; extra allocations and ungranted
mappings did not lower that. So the demand is the sum over ranks of mappings x
granted devices, and a plan that overdraws it can be refused before start-up
instead of failing half-way through.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from typing import TYPE_CHECKING

from kvgrant.errors import HandleBudgetError

if TYPE_CHECKING:
    from kvgrant.layout.geometry import Geometry
    from kvgrant.layout.plan import PhysicalPlan

__all__ = [
    "DEFAULT_HANDLE_BUDGET",
    "HandleDemand",
    "check_handle_budget",
    "handle_demand",
    "handle_demand_breakdown",
]

DEFAULT_HANDLE_BUDGET = 523_880
"""(mapping, device) grants one process got before cuMemSetAccess failed (H200, driver 580)."""


@dataclass(frozen=True)
class HandleDemand:
    """Driver-handle demand of one plan over a whole host run as one process.

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
    plane_maps: Counter[str] = Counter(a.plane for a in plan.allocations)
    region_maps: Counter[str] = Counter(a.region for a in plan.allocations
                                        if a.region is not None)
    per_rank: dict[int, int] = {}
    per_target: Counter[str] = Counter()
    for r in range(g.topology.ranks):
        wide = len(g.granted_devices(r, declared=declared))
        n = 0
        for name, count in plane_maps.items():
            per_target[f"plane:{name}"] += count * wide
            n += count * wide
        for name, count in region_maps.items():
            k = count * len(g.granted_devices(r, name, declared=declared))
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
                        budget: int = DEFAULT_HANDLE_BUDGET, declared: bool = False) -> int:
    """Return the demand, or raise :class:`HandleBudgetError` when it exceeds ``budget``.

    Raises
    ------
    HandleBudgetError
        Naming demand, budget, the overdraw and the largest contributors (per
        plane/region and per rank); nothing has touched the driver yet.
    ValueError
        ``budget`` is not a non-negative integer.
    """
    if not isinstance(budget, int) or isinstance(budget, bool) or budget < 0:
        raise ValueError(f"budget = {budget!r}: must be a non-negative integer")
    d = handle_demand_breakdown(g, plan, declared=declared)
    if d.total <= budget:
        return d.total
    top = d.contributors(limit=3)
    shown = ", ".join(f"{name} {n:,}" for name, n in top)
    who = "declared readers" if declared else "owner + importers"
    raise HandleBudgetError(
        f"{plan.label} plan of {g.name!r} needs {d.total:,} driver handles (mappings x "
        f"granted devices, grants to {who}, {g.topology.ranks} ranks in one process) but "
        f"the per-process budget is {budget:,} (over by {d.total - budget:,}); largest: "
        f"{shown}", demand=d.total, budget=budget, contributors=d.contributors())
