"""Cache layout contract (pure Python, no CUDA): geometry, conflict sets, plans,
the contract checker and the driver-handle pre-flight."""

from kvgrant.layout.conflicts import conflict_sets, declared_conflict_sets
from kvgrant.layout.contract import Violation, check_contract, require_contract
from kvgrant.layout.geometry import Alias, Geometry, Plane, Region, Topology, load_geometry, parse_geometry
from kvgrant.layout.plan import Allocation, PhysicalPlan
from kvgrant.layout.preflight import DEFAULT_HANDLE_BUDGET, check_handle_budget, handle_demand

__all__ = [
    "Alias",
    "Allocation",
    "DEFAULT_HANDLE_BUDGET",
    "Geometry",
    "PhysicalPlan",
    "Plane",
    "Region",
    "Topology",
    "Violation",
    "check_contract",
    "check_handle_budget",
    "conflict_sets",
    "declared_conflict_sets",
    "handle_demand",
    "load_geometry",
    "parse_geometry",
    "require_contract",
]
