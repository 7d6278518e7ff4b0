"""Physical plans: what is actually created, one ``cuMemCreate`` per allocation."""

from __future__ import annotations

from dataclasses import dataclass, field

from kvgrant.layout.geometry import Geometry

__all__ = ["Allocation", "PhysicalPlan"]


@dataclass(frozen=True, slots=True)
class Allocation:
    """One physical allocation of a rank, mapped once into its plane and, when
    aliased, once into its region (always a whole-handle mapping)."""

    plane: str
    plane_offset: int
    length: int
    region: str | None = None
    region_offset: int | None = None

    @property
    def aliased(self) -> bool:
        return self.region is not None

    def to_json(self) -> dict[str, object]:
        d: dict[str, object] = {"plane": self.plane, "plane_offset": self.plane_offset,
                                "length": self.length}
        if self.region is not None:
            d["region"] = self.region
            d["region_offset"] = self.region_offset
        return d


@dataclass(frozen=True)
class PhysicalPlan:
    """Per-rank physical plan (every rank of the topology uses the same one).

    ``label`` is ``naive``, ``reference`` or ``packed`` (or a test's own name).
    """

    label: str
    geometry: Geometry
    allocations: tuple[Allocation, ...]
    notes: tuple[str, ...] = field(default=())

    @property
    def mappings(self) -> int:
        """Mappings per rank: one per allocation, plus one per aliased allocation."""
        return sum(2 if a.aliased else 1 for a in self.allocations)
