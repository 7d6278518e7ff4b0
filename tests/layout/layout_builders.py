"""Geometry builders and hypothesis strategies shared by the layout tests.

Layout test modules (plans, bound, ...) import these directly::

    from layout_builders import geometries, geometry_dict, published_like_dict, simple_plan

(Not ``from conftest import ...``: tests/runtime has its own conftest.py, and which one
Python calls ``conftest`` depends on collection order.)

``geometries()`` draws random *valid* geometries (small integers, so byte maths
runs fast; G need not divide ``bytes_per_page`` or ``row_bytes``, as on real models).
"""

from __future__ import annotations

import random
from typing import Any

from hypothesis import strategies as st

from kvgrant.layout.geometry import Geometry, parse_geometry, round_up
from kvgrant.layout.plan import Allocation, PhysicalPlan

__all__ = [
    "geometries",
    "geometry_dict",
    "geometry_dicts",
    "published_like_dict",
    "simple_plan",
]

MiB = 1 << 20


def geometry_dict(**overrides: Any) -> dict[str, Any]:
    """A small valid geometry document (G = 4): 2 planes, 2 regions, 2 ranks.

    plane a: 10 pages x 6 B = 60 B; plane b: 10 x 5 = 50 B (52 reserved).
    region snap: 3 rows x 7 B = 21 B (24 reserved), chunks of 8+8+8;
    region exec: 1 row x 4 B, owner-only.
    """
    doc: dict[str, Any] = {
        "name": "small",
        "granularity": 4,
        "pages": 10,
        "page_tokens": 16,
        "planes": [{"name": "a", "bytes_per_page": 6}, {"name": "b", "bytes_per_page": 5}],
        "regions": [{"name": "snap", "rows": 3, "row_bytes": 7},
                    {"name": "exec", "rows": 1, "row_bytes": 4, "access": "owner"}],
        "aliases": [
            {"region": "snap", "offset": 0, "plane": "a", "plane_offset": 0, "length": 8},
            {"region": "snap", "offset": 8, "plane": "b", "plane_offset": 12, "length": 8},
            {"region": "snap", "offset": 16, "plane": "a", "plane_offset": 40, "length": 8},
            {"region": "exec", "offset": 0, "plane": "b", "plane_offset": 0, "length": 4},
        ],
        "topology": {"ranks": 2, "import_groups": [[0, 1]]},
    }
    doc.update(overrides)
    return doc


def published_like_dict(ranks: int = 16, seed: int = 7) -> dict[str, Any]:
    """A published-scale geometry: G = 2 MiB, 2,234 pages, 112 snapshot rows and 5
    execution rows (row boundaries not G-aligned), 1,921 declared 2 MiB chunks
    scattered over 4 planes, DCP8 import groups, every rank declared a reader."""
    rng = random.Random(seed)
    G = 2 * MiB
    pages = 2234
    bpp = 1179648
    planes = [{"name": f"layer{i}.latent", "bytes_per_page": bpp} for i in range(4)]
    regions = [{"name": "snapshot", "rows": 112, "row_bytes": 33 * MiB},
               {"name": "execution", "rows": 5, "row_bytes": 29 * MiB, "access": "owner"}]
    free = [(p["name"], u) for p in planes
            for u in range(round_up(pages * bpp, G) // G)]
    rng.shuffle(free)
    aliases = []
    for r in regions:
        for u in range(round_up(r["rows"] * r["row_bytes"], G) // G):
            plane, pu = free.pop()
            aliases.append({"region": r["name"], "offset": u * G, "plane": plane,
                            "plane_offset": pu * G, "length": G})
    half = ranks // 2 or 1
    groups = [list(range(0, half)), list(range(half, ranks))] if ranks > 1 else [[0]]
    return {
        "name": "published-like",
        "granularity": G,
        "pages": pages,
        "page_tokens": 128,
        "planes": planes,
        "regions": regions,
        "aliases": aliases,
        "topology": {"ranks": ranks, "import_groups": [g for g in groups if g],
                     "declared_readers": {str(r): list(range(ranks)) for r in range(ranks)}},
    }


@st.composite
def geometry_dicts(draw: st.DrawFn, max_planes: int = 3, max_regions: int = 3,
                   max_ranks: int = 5) -> dict[str, Any]:
    """Random valid geometry documents (JSON-shaped dicts)."""
    G = draw(st.sampled_from([1, 2, 4, 8]))
    pages = draw(st.integers(1, 24))
    planes = [{"name": f"p{i}", "bytes_per_page": draw(st.integers(1, 20))}
              for i in range(draw(st.integers(1, max_planes)))]
    cap = {p["name"]: round_up(pages * p["bytes_per_page"], G) // G for p in planes}
    left = dict(cap)

    regions: list[dict[str, Any]] = []
    chunks: list[tuple[str, int, int, str]] = []  # (region, offset unit, units, plane)
    for i in range(draw(st.integers(0, max_regions))):
        rows = draw(st.integers(1, 6))
        row_bytes = draw(st.integers(1, 3 * G + 3))
        units = round_up(rows * row_bytes, G) // G
        cuts = sorted(draw(st.sets(st.integers(1, max(units - 1, 1)), max_size=units))
                      ) if units > 1 else []
        bounds = [0, *[c for c in cuts if 0 < c < units], units]
        pieces = [(bounds[k], bounds[k + 1] - bounds[k]) for k in range(len(bounds) - 1)]
        name = f"r{i}"
        region: dict[str, Any] = {"name": name, "rows": rows, "row_bytes": row_bytes}
        if draw(st.booleans()):
            region["access"] = draw(st.sampled_from(["importers", "owner"]))
        placed = _place(draw, left, [(name, s, n) for s, n in pieces])
        if placed is None:
            continue
        regions.append(region)
        chunks.extend(placed)

    aliases = [{"region": r, "offset": s * G, "plane": p, "plane_offset": po * G,
                "length": n * G} for r, s, n, p, po in _layout(draw, cap, chunks)]
    aliases = draw(st.permutations(aliases)) if aliases else []

    ranks = draw(st.integers(1, max_ranks))
    order = draw(st.permutations(list(range(ranks))))
    groups: list[list[int]] = []
    k = 0
    while k < ranks:
        size = draw(st.integers(1, ranks - k))
        if draw(st.booleans()) or size > 1:
            groups.append(sorted(order[k:k + size]))
        k += size
    topo: dict[str, Any] = {"ranks": ranks}
    if groups or draw(st.booleans()):
        topo["import_groups"] = groups
    if draw(st.booleans()):
        declared: dict[str, list[int]] = {}
        for r in range(ranks):
            if draw(st.booleans()):
                imp = next((set(gr) - {r} for gr in groups if r in gr), set())
                extra = draw(st.sets(st.integers(0, ranks - 1), max_size=ranks))
                declared[str(r)] = sorted(imp | extra)
        topo["declared_readers"] = declared
    return {"name": "random", "granularity": G, "pages": pages,
            "page_tokens": draw(st.integers(1, 256)), "planes": planes,
            "regions": regions, "aliases": aliases, "topology": topo}


def _place(draw: st.DrawFn, left: dict[str, int], pieces: list[tuple[str, int, int]]
           ) -> list[tuple[str, int, int, str]] | None:
    """Give each piece a plane with room (largest first, plane drawn at random);
    ``None`` (and ``left`` untouched) when they do not all fit."""
    trial = dict(left)
    out = []
    for name, s, n in sorted(pieces, key=lambda x: (-x[2], x[1])):
        fit = [p for p in sorted(trial) if trial[p] >= n]
        if not fit:
            return None
        p = draw(st.sampled_from(fit))
        trial[p] -= n
        out.append((name, s, n, p))
    left.update(trial)
    return out


def _layout(draw: st.DrawFn, cap: dict[str, int], chunks: list[tuple[str, int, int, str]]
            ) -> list[tuple[str, int, int, str, int]]:
    """Give each chunk a G-aligned plane offset: each plane's chunks in a random
    order with random gaps, never overlapping, never past the plane's reserved size."""
    out = []
    for p in sorted(cap):
        items = [c for c in chunks if c[3] == p]
        if not items:
            continue
        items = draw(st.permutations(items))
        slack = cap[p] - sum(c[2] for c in items)
        pos = 0
        for r, s, n, _ in items:
            gap = draw(st.integers(0, slack)) if slack else 0
            slack -= gap
            pos += gap
            out.append((r, s, n, p, pos))
            pos += n
    return out


def geometries(**kwargs: Any) -> st.SearchStrategy[Geometry]:
    """Random valid :class:`Geometry` objects (see :func:`geometry_dicts`)."""
    return geometry_dicts(**kwargs).map(parse_geometry)


def simple_plan(g: Geometry, label: str = "simple") -> PhysicalPlan:
    """A plan that keeps the contract by construction, independent of the planners:
    one allocation per declared alias, plus one per unaliased gap of each plane."""
    allocs = [Allocation(a.plane, a.plane_offset, a.length, a.region, a.offset)
              for a in g.aliases]
    for p in g.planes:
        spans = sorted((a.plane_offset, a.plane_offset + a.length)
                       for a in g.aliases if a.plane == p.name)
        cursor = 0
        for s, e in [*spans, (g.plane_bytes(p.name), g.plane_bytes(p.name))]:
            if s > cursor:
                allocs.append(Allocation(p.name, cursor, s - cursor))
            cursor = max(cursor, e)
    return PhysicalPlan(label, g, tuple(allocs))


def gen_layout():
    """tools/gen_layout.py as a module (tools/ is not a package; the benchmarks import it
    the same way, by name from tools/)."""
    import pathlib
    import sys

    tools = str(pathlib.Path(__file__).resolve().parents[2] / "tools")
    if tools not in sys.path:
        sys.path.insert(0, tools)
    import gen_layout as mod

    return mod


CHEAP = {"node_limit": 20, "max_nonzeros": 1_500, "max_solves": 2, "max_checks": 10,
         "max_windowed_nonzeros": 0}
"""Work limits for property tests whose assertions hold for ANY plan the planner
returns (contract kept, never above the reference rule, never below a bound): larger
models go to the heuristic (not to the windows: test_windows.py covers those), so a
test of hundreds of examples stays quick. The limits
are counts, so the tests stay deterministic. The full limits run in
benchmarks/bench_plan.py (which fails on a broken contract or a bound above a plan)."""
