"""A small geometry and a hand-made naive plan shared by the allocator tests.

3 ranks; ranks 0 and 1 import each other, rank 2 is an overdeclared reader of both
(declared, imports nothing) and imports from nobody. Two planes, a snapshot region
(importers access) and an owner-only execution region.
"""

from __future__ import annotations

from kvgrant.layout.geometry import Geometry, on_ranks, parse_geometry
from kvgrant.layout.plan import Allocation, PhysicalPlan

MIB = 1 << 20
G = 2 * MIB

SMALL = {
    "name": "small-test", "granularity": G, "pages": 8, "page_tokens": 16,
    "planes": [{"name": "a", "bytes_per_page": MIB}, {"name": "b", "bytes_per_page": MIB // 2}],
    "regions": [{"name": "snapshot", "rows": 2, "row_bytes": 2 * G},
                {"name": "exec", "rows": 1, "row_bytes": G, "access": "owner"}],
    "aliases": [
        {"region": "snapshot", "offset": 0, "plane": "a", "plane_offset": 0, "length": G},
        {"region": "snapshot", "offset": G, "plane": "b", "plane_offset": 0, "length": G},
        {"region": "snapshot", "offset": 2 * G, "plane": "a", "plane_offset": 2 * G, "length": G},
        {"region": "snapshot", "offset": 3 * G, "plane": "b", "plane_offset": G, "length": G},
        {"region": "exec", "offset": 0, "plane": "a", "plane_offset": 3 * G, "length": G},
    ],
    "topology": {"ranks": 3, "import_groups": [[0, 1]],
                 "declared_readers": {"0": [0, 1, 2], "1": [0, 1, 2]}},
}


def small_geometry(**changes: object) -> Geometry:
    doc = dict(SMALL)
    doc.update(changes)
    return parse_geometry(doc)


def chunk_plan(g: Geometry, label: str = "chunks") -> PhysicalPlan:
    """One allocation per declared chunk, plus one per G of unaliased plane bytes."""
    allocs: list[Allocation] = []
    for p in g.planes:
        backed = {a.plane_offset: a for a in g.aliases if a.plane == p.name}
        off, end = 0, g.plane_bytes(p.name)
        while off < end:
            a = backed.get(off)
            if a is not None:
                allocs.append(Allocation(p.name, off, a.length, a.region, a.offset))
                off += a.length
            else:
                allocs.append(Allocation(p.name, off, g.granularity))
                off += g.granularity
    return PhysicalPlan(label, g, tuple(allocs))


scaled = on_ranks  # kvgrant.layout.geometry.on_ranks
