"""Cross-field rules of a geometry (the ones pydantic field types cannot express)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from kvgrant.errors import GeometryError

if TYPE_CHECKING:
    from kvgrant.layout.geometry import Geometry

__all__ = ["check_geometry_rules"]


def _fail(field: str, value: object, rule: str) -> None:
    raise GeometryError(f"{field} = {value!r}: {rule}", field=field, value=value)


def check_geometry_rules(g: "Geometry") -> None:
    """Raise GeometryError for the first broken rule of DESIGN.md's geometry section."""
    from kvgrant.layout.geometry import round_up

    G = g.granularity
    seen: set[str] = set()
    for i, p in enumerate(g.planes):
        if p.name in seen:
            _fail(f"planes[{i}].name", p.name, "plane names must be unique")
        seen.add(p.name)
    seen_r: set[str] = set()
    for i, r in enumerate(g.regions):
        if r.name in seen_r or r.name in seen:
            _fail(f"regions[{i}].name", r.name, "region names must be unique and differ from plane names")
        seen_r.add(r.name)

    by_region: dict[str, list[tuple[int, int, int]]] = {r.name: [] for r in g.regions}
    by_plane: dict[str, list[tuple[int, int, int]]] = {p.name: [] for p in g.planes}
    for i, a in enumerate(g.aliases):
        if a.region not in by_region:
            _fail(f"aliases[{i}].region", a.region, "must name a declared region")
        if a.plane not in by_plane:
            _fail(f"aliases[{i}].plane", a.plane, "must name a declared plane")
        for fname in ("offset", "plane_offset", "length"):
            v = getattr(a, fname)
            if v % G:
                _fail(f"aliases[{i}].{fname}", v, f"must be a multiple of the granularity {G}")
        plane_size = g.plane_bytes(a.plane)
        if a.plane_offset + a.length > plane_size:
            _fail(f"aliases[{i}].plane_offset", a.plane_offset,
                  f"plane range [{a.plane_offset}, {a.plane_offset + a.length}) must stay inside "
                  f"plane '{a.plane}' of {plane_size} bytes (pages * bytes_per_page rounded up to G)")
        region_size = g.region_bytes(a.region)
        if a.offset + a.length > region_size:
            _fail(f"aliases[{i}].offset", a.offset,
                  f"region range [{a.offset}, {a.offset + a.length}) must stay inside region "
                  f"'{a.region}' of {region_size} bytes (rows * row_bytes rounded up to G)")
        by_region[a.region].append((a.offset, a.offset + a.length, i))
        by_plane[a.plane].append((a.plane_offset, a.plane_offset + a.length, i))

    for name, spans in by_plane.items():
        spans.sort()
        for (s0, e0, i0), (s1, e1, i1) in zip(spans, spans[1:]):
            if s1 < e0:
                _fail(f"aliases[{i1}].plane_offset", s1,
                      f"overlaps aliases[{i0}] in plane '{name}' ([{s0}, {e0})); aliases must not overlap in a plane")
    for r in g.regions:
        spans = sorted(by_region[r.name])
        cursor = 0
        need = r.rows * r.row_bytes
        for s, e, i in spans:
            if s < cursor:
                _fail(f"aliases[{i}].offset", s,
                      f"overlaps another alias in region '{r.name}'; aliases must not overlap in a region")
            if s > cursor and cursor < need:
                _fail(f"regions.{r.name}", f"[{cursor}, {min(s, need)})",
                      "aliases must cover every byte of the region's rows; this range is not covered")
            cursor = max(cursor, e)
        if cursor < need:
            _fail(f"regions.{r.name}", f"[{cursor}, {need})",
                  "aliases must cover every byte of the region's rows; this range is not covered")

    t = g.topology
    member: dict[int, int] = {}
    for gi, group in enumerate(t.import_groups):
        for rank in group:
            if not 0 <= rank < t.ranks:
                _fail(f"topology.import_groups[{gi}]", rank, f"ranks must be in 0..{t.ranks - 1}")
            if rank in member:
                _fail(f"topology.import_groups[{gi}]", rank,
                      f"a rank may belong to one import group only (also in group {member[rank]})")
            member[rank] = gi
    if t.declared_readers is not None:
        for owner, readers in t.declared_readers.items():
            if not 0 <= owner < t.ranks:
                _fail("topology.declared_readers", owner, f"owner ranks must be in 0..{t.ranks - 1}")
            for rd in readers:
                if not 0 <= rd < t.ranks:
                    _fail(f"topology.declared_readers.{owner}", rd, f"ranks must be in 0..{t.ranks - 1}")
            missing = sorted(set(g.importers(owner)) - set(readers) - {owner})
            if missing:
                _fail(f"topology.declared_readers.{owner}", readers,
                      f"every importer must be a declared reader; importers {missing} are not declared")
