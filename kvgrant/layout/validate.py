"""Cross-field rules of a geometry (the ones pydantic field types cannot express).

Why a separate pass: these rules relate fields to each other (an alias to its
plane's size, aliases to each other, importers to declared readers), and each
broken rule must come back as one :class:`GeometryError` naming the field, the
value and the rule, in the order a user would fix them.
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any, NoReturn

from kvgrant.errors import GeometryError
from kvgrant.strict_json import show_value  # (kept here too: the layout's errors import it)

if TYPE_CHECKING:
    from kvgrant.layout.geometry import Geometry

#: 2**22 granules: 8 TiB per rank at G = 2 MiB.
MAX_RANK_GRANULES = 1 << 22

__all__ = ["MAX_RANK_GRANULES", "check_geometry_rules", "show_path", "show_value"]

_VA_LIMIT = 1 << 64
_TOKEN_LIMIT = (1 << 63) - 1


def show_path(path: object) -> str:
    """A file path quoted in full, control and non-ASCII characters escaped: unlike
    :func:`show_value` it is never cut, because the message must name the file (a
    pytest or container path easily passes 80 characters)."""
    return json.dumps(str(path))


def _fail(field: str, value: object, rule: str, *, shown: str | None = None) -> NoReturn:
    """Raise the GeometryError; ``shown`` overrides how the value is printed."""
    text = shown if shown is not None else show_value(value)
    raise GeometryError(f"{field} = {text}: {rule}", field=field, value=value)


def _check_names(g: "Geometry") -> None:
    planes: set[str] = set()
    for i, p in enumerate(g.planes):
        if p.name in planes:
            _fail(f"planes[{i}].name", p.name, "plane names must be unique")
        planes.add(p.name)
    regions: set[str] = set()
    for i, r in enumerate(g.regions):
        if r.name in regions or r.name in planes:
            _fail(f"regions[{i}].name", r.name,
                  "region names must be unique and differ from plane names")
        regions.add(r.name)


def _check_sizes(g: "Geometry") -> None:
    """The rank's one VA reservation (all planes, then all regions) stays within
    MAX_RANK_GRANULES granules: far above any GPU, and small enough that planning
    (which works per granule) stays fast and bounded. And the KV tokens (pages x
    page_tokens) fit a signed 64-bit integer, as every reader of the capacity takes it
    (page_tokens = 2**63 - 1 gave 36,893,488,147,419,103,228 tokens)."""
    limit = min(_VA_LIMIT, MAX_RANK_GRANULES * g.granularity)
    rule = (f"all planes and regions of a rank must fit one reservation of at most "
            f"{MAX_RANK_GRANULES:,} granules ({limit:,} bytes at G = {g.granularity})")
    total = 0
    for i, p in enumerate(g.planes):
        total += g.plane_bytes(p.name)
        if total > limit:
            _fail(f"planes[{i}].bytes_per_page", p.bytes_per_page,
                  f"plane '{p.name}' reserves pages ({g.pages}) * bytes_per_page = "
                  f"{g.plane_bytes(p.name)} bytes; {rule}")
    for i, r in enumerate(g.regions):
        total += g.region_bytes(r.name)
        if total > limit:
            _fail(f"regions[{i}].row_bytes", r.row_bytes,
                  f"region '{r.name}' reserves rows ({r.rows}) * row_bytes = "
                  f"{g.region_bytes(r.name)} bytes; {rule}")
    if g.pages * g.page_tokens > _TOKEN_LIMIT:
        _fail("page_tokens", g.page_tokens,
              f"pages ({g.pages}) * page_tokens = {g.pages * g.page_tokens} KV tokens; the "
              f"KV tokens must be at most {_TOKEN_LIMIT:,} (2**63 - 1)")


def _check_aliases(g: "Geometry") -> None:
    G = g.granularity
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
                  f"plane range [{a.plane_offset}, {a.plane_offset + a.length}) must stay "
                  f"inside plane '{a.plane}' of {plane_size} bytes (pages * bytes_per_page "
                  "rounded up to G)")
        region_size = g.region_bytes(a.region)
        if a.offset + a.length > region_size:
            _fail(f"aliases[{i}].offset", a.offset,
                  f"region range [{a.offset}, {a.offset + a.length}) must stay inside region "
                  f"'{a.region}' of {region_size} bytes (rows * row_bytes rounded up to G)")
        by_region[a.region].append((a.offset, a.offset + a.length, i))
        by_plane[a.plane].append((a.plane_offset, a.plane_offset + a.length, i))

    for name, spans in by_plane.items():
        spans.sort()
        for (s0, e0, i0), (s1, _e1, i1) in zip(spans, spans[1:]):
            if s1 < e0:
                first, second = sorted((i0, i1))
                _fail(f"aliases[{second}].plane_offset", g.aliases[second].plane_offset,
                      f"plane range overlaps aliases[{first}] in plane '{name}' "
                      f"(bytes [{s1}, {min(e0, _e1)}) twice); aliases must not overlap in a plane")
    for r in g.regions:
        spans = sorted(by_region[r.name])
        cursor, last = 0, -1
        need = r.rows * r.row_bytes
        for s, e, i in spans:
            if s < cursor:
                first, second = sorted((last, i))
                _fail(f"aliases[{second}].offset", g.aliases[second].offset,
                      f"region range overlaps aliases[{first}] in region '{r.name}' "
                      f"(bytes [{s}, {min(e, cursor)}) twice); aliases must not overlap in a "
                      "region")
            if s > cursor and cursor < need:
                hole = [cursor, min(s, need)]
                _fail(f"regions[{g.regions.index(r)}]", hole, shown=f"[{hole[0]}, {hole[1]})",
                      rule=f"aliases must cover every byte of region '{r.name}' rows "
                      f"[0, {need}); this range is not covered")
            if e > cursor:
                cursor, last = e, i
        if cursor < need:
            _fail(f"regions[{g.regions.index(r)}]", [cursor, need], shown=f"[{cursor}, {need})",
                  rule=f"aliases must cover every byte of region '{r.name}' rows [0, {need}); "
                  "this range is not covered")


def _check_topology(g: "Geometry") -> None:
    t = g.topology
    member: dict[int, int] = {}
    for gi, group in enumerate(t.import_groups):
        if not group:
            _fail(f"topology.import_groups[{gi}]", group, shown="[]",
                  rule="an import group lists the ranks that import each other's memory; "
                  "an empty group names no rank (leave it out)")
        for rank in group:
            if not 0 <= rank < t.ranks:
                _fail(f"topology.import_groups[{gi}]", rank,
                      f"ranks must be in 0..{t.ranks - 1} (topology.ranks = {t.ranks})")
            if rank in member:
                where = "twice in this group" if member[rank] == gi else \
                    f"also in import_groups[{member[rank]}]"
                _fail(f"topology.import_groups[{gi}]", rank,
                      f"a rank may belong to one import group, once ({where})")
            member[rank] = gi
    if t.declared_readers is None:
        return
    for owner, readers in t.declared_readers.items():
        if not 0 <= owner < t.ranks:
            _fail("topology.declared_readers", owner,
                  f"owner ranks must be in 0..{t.ranks - 1} (topology.ranks = {t.ranks})")
        seen: set[int] = set()
        for rd in readers:
            if not 0 <= rd < t.ranks:
                _fail(f"topology.declared_readers.{owner}", rd,
                      f"reader ranks must be in 0..{t.ranks - 1} (topology.ranks = {t.ranks})")
            if rd in seen:
                _fail(f"topology.declared_readers.{owner}", rd,
                      f"reader {rd} is listed twice for owner {owner}: each declared "
                      "reader must be listed once")
            seen.add(rd)
        missing = sorted(set(g.importers(owner)) - set(readers) - {owner})
        if missing:
            _fail(f"topology.declared_readers.{owner}", list(readers),
                  shown=str(sorted(set(readers))), rule=f"every importer must be a declared reader; importers {missing} of rank "
                  f"{owner} are not declared")


def check_geometry_rules(g: "Geometry") -> None:
    """Raise GeometryError for the first broken rule of DESIGN.md's geometry section."""
    _check_names(g)
    _check_sizes(g)
    _check_aliases(g)
    _check_topology(g)
