"""Cache layout contract (pure Python, no CUDA): geometry, conflict sets, plans."""

from kvgrant.layout.geometry import Alias, Geometry, Plane, Region, Topology, load_geometry, parse_geometry
from kvgrant.layout.plan import Allocation, PhysicalPlan

__all__ = [
    "Alias",
    "Allocation",
    "Geometry",
    "PhysicalPlan",
    "Plane",
    "Region",
    "Topology",
    "load_geometry",
    "parse_geometry",
]
