"""Physical plans: the naive plan, the reference rule and kvgrant's packed plan.

Why three: the naive plan is what the declared layout costs as-is (one allocation per
declared chunk); the reference rule is the published fix, kept as a labelled comparison
so every report can say how much better the packed plan does; the packed plan
(:mod:`kvgrant.layout.planner`: the exact planner, with the heuristic packer as its
fallback) is what kvgrant allocates.

Every plan covers each plane exactly once: aliased allocations, plus one non-aliased
allocation per maximal gap between them. Allocation order is creation order; all plans
sort by (plane in geometry order, plane offset), so the order is deterministic.
"""

from __future__ import annotations

from kvgrant.errors import ArgumentError
from kvgrant.layout.geometry import Geometry, require_geometry
from kvgrant.layout.plan import PhysicalPlan
from kvgrant.layout.planner import plan_packed
from kvgrant.layout.rules import finish_plan, naive_plan, reference_plan

__all__ = [
    "PLAN_LABELS",
    "finish_plan",
    "make_plan",
    "naive_plan",
    "packed_plan",
    "reference_plan",
]

PLAN_LABELS: tuple[str, ...] = ("naive", "reference", "packed")
"""Labels :func:`make_plan` accepts, cheapest-to-compute first."""


def packed_plan(g: Geometry) -> PhysicalPlan:
    """kvgrant's packed plan (see :func:`kvgrant.layout.planner.plan_packed`)."""
    return plan_packed(require_geometry(g, "packed_plan")).plan


def make_plan(g: Geometry, label: str) -> PhysicalPlan:
    """The plan named ``label`` (one of :data:`PLAN_LABELS`)."""
    require_geometry(g, "make_plan")
    makers = {"naive": naive_plan, "reference": reference_plan, "packed": packed_plan}
    if not isinstance(label, str) or label not in makers:  # a list was a TypeError
        # a bad argument, as allocate(plan=...) says it (was PlanError: "refused")
        raise ArgumentError(f"plan = {label!r}: unknown plan label; choose one of "
                            f"{', '.join(PLAN_LABELS)}", argument="plan", value=label)
    return makers[label](g)
