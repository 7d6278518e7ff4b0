#!/usr/bin/env python3
"""Generate realistic declared layouts (geometry JSON) the way model exporters chunk them.

Why: the packer and the lower bound must be judged on layouts shaped like the ones
exporters really emit, not on layouts picked to flatter the packer. The exporter model
here ("page-group exporter") is fixed and documented in ``docs/layout.md``:

* Alias regions are filled front to back, region by region, from consecutive KV page
  groups of ``group_pages`` pages (starting at ``first_page``).
* For each page group, the exporter walks the planes in order (interleaving planes
  within a row) and declares one chunk per plane, rounded to G-granules: ``claim``
  takes the granules touching the group's bytes that no earlier group claimed (so a
  chunk also touches the next group's first page); ``inward`` takes only the granules
  wholly inside the group's bytes (granules straddling two groups stay unaliased).
* A row's ``row_bytes`` is what ``groups_per_row`` groups yield on average, rounded
  down to 4 KiB (``max(1, G // 8)`` when G is 4 KiB or less) and, for G > 1, never a
  multiple of G; so row boundaries fall inside chunks and the chunk under a boundary
  is shared by two rows (its pages are in both conflict sets).

Usage::

    python tools/gen_layout.py published --dcp 8 -o examples/published-dcp8.json
    python tools/gen_layout.py random --seed 3 -o /tmp/random.json
    python tools/gen_layout.py odd --seed 7 -o /tmp/odd.json      # fuzz-like, see odd_layout
    python tools/gen_layout.py examples          # rewrite every examples/*.json
"""

from __future__ import annotations

import argparse
import json
import random
import sys
from dataclasses import dataclass
from typing import Any, Iterator

__all__ = [
    "RegionSpec",
    "generate",
    "published_layout",
    "EXAMPLES",
    "exporter_layout",
    "random_layout",
    "small_fine_rows_layout",
    "small_inward_layout",
    "small_layout",
    "write_examples",
]

MiB = 1 << 20
G_H200 = 2 * MiB
# bytes per page of MLA latent planes (576 values x 2 bytes x layers x 128 tokens)
LATENT_8 = 576 * 2 * 8 * 128  # 1,179,648: 8 layers
LATENT_5 = 576 * 2 * 5 * 128  # 737,280: 5 layers
LATENT_4 = 576 * 2 * 4 * 128  # 589,824: 4 layers
LATENT_1 = 576 * 2 * 1 * 128  # 147,456: 1 layer
INDEXER = 132 * 61 * 128      # 1,030,656: a sparse-attention indexer cache


@dataclass(frozen=True)
class RegionSpec:
    """An alias region to declare: ``rows`` rows of about ``groups_per_row`` page groups."""

    name: str
    rows: int
    groups_per_row: float
    access: str = "importers"


class RowBytesError(ValueError):
    """A region's page groups give too few bytes for a row size that is a positive
    multiple of the rounding step and not a multiple of G (a small G)."""


def _round_up(v: int, m: int) -> int:
    return -(-v // m) * m


def _chunks(planes: list[tuple[str, int]], G: int, pages: int, group_pages: int,
            first_page: int, rounding: str, claimed: dict[str, int],
            interleave: str = "in-order") -> Iterator[tuple[int, str, int, int]]:
    """Exporter chunk stream: (group end page, plane, plane_offset, length).

    ``inward``: the granules wholly inside the group's bytes; ``claim``: the granules
    touching the group's bytes that no earlier group claimed. ``interleave`` is the
    order the planes are walked in each group: ``in-order``, ``zigzag`` (reversed
    every other group) or ``shuffled`` (a seeded shuffle per group)."""
    p = first_page
    claimed = dict(claimed)
    rng = random.Random(first_page * 7919 + group_pages)
    group = 0
    while p < pages:
        q = min(p + group_pages, pages)
        walk = list(planes)
        if interleave == "zigzag" and group % 2:
            walk.reverse()
        elif interleave == "shuffled":
            rng.shuffle(walk)
        group += 1
        for name, bpp in walk:
            end = _round_up(pages * bpp, G)
            if rounding == "inward":
                lo = _round_up(p * bpp, G)
                hi = end if q >= pages else (q * bpp) // G * G
            else:
                lo = max(p * bpp // G * G, claimed[name])
                hi = end if q >= pages else _round_up(q * bpp, G)
            if hi > lo:
                claimed[name] = hi
                yield q, name, lo, hi - lo
        p = q


def generate(*, name: str, planes: list[tuple[str, int]], regions: list[RegionSpec],
             pages: int, group_pages: int, granularity: int = G_H200,
             page_tokens: int = 128, first_page: int = 0, ranks: int = 1,
             group_size: int | None = None, overdeclare: bool = False,
             rounding: str = "inward", interleave: str = "in-order") -> dict[str, Any]:
    """Build one geometry document with the page-group exporter model.

    Parameters
    ----------
    planes : list of (name, bytes_per_page)
    regions : list of RegionSpec, filled in order from consecutive page groups
    group_size : ranks per import group (DCP degree); ``None`` or 1: no peer imports
    overdeclare : every rank declares every rank a reader (as exporters do in the field)

    Raises
    ------
    ValueError
        When the KV pages run out before every region is filled; its subclass
        :class:`RowBytesError` when a region's groups are too few bytes for its rows
        (the groups' bytes set the rows' size: more pages rarely help, so the seeded
        layouts that retry with more pages on ValueError do not retry on this one).
    """
    G = granularity
    aliases: list[dict[str, Any]] = []
    region_docs: list[dict[str, Any]] = []
    page = first_page
    used_end = {name: 0 for name, _ in planes}
    for spec in regions:
        # what groups_per_row groups yield on average, from the page where we are
        sample = list(_chunks(planes, G, pages, group_pages, page, rounding, used_end,
                              interleave))
        groups = max(1, round(spec.rows * spec.groups_per_row))
        ends = sorted({q for q, *_ in sample})
        if len(ends) < groups:
            raise ValueError(f"regions: {spec.name} needs {groups} page groups of "
                             f"{group_pages} pages from page {page}; only {len(ends)} left")
        last_end = ends[groups - 1]
        total = sum(n for q, _, _, n in sample if q <= last_end)
        step = 4096 if G > 4096 else max(1, G // 8)  # 4 KiB, or finer for a small G
        row_bytes = total // spec.rows // step * step
        if G > 1 and row_bytes % G == 0:
            row_bytes -= step
        if row_bytes <= 0:
            raise RowBytesError(f"regions: {spec.name}: {total} bytes of {groups} page "
                                f"groups over {spec.rows} rows leave no row size that is "
                                f"a positive multiple of {step} and not of G = {G}")
        need = _round_up(spec.rows * row_bytes, G)
        cursor = 0
        for q, plane, po, n in sample:
            if cursor >= need:
                break
            n = min(n, need - cursor)
            aliases.append({"region": spec.name, "offset": cursor, "plane": plane,
                            "plane_offset": po, "length": n})
            cursor += n
            page = q
            used_end[plane] = po + n
        doc: dict[str, Any] = {"name": spec.name, "rows": spec.rows, "row_bytes": row_bytes}
        if spec.access != "importers":
            doc["access"] = spec.access
        region_docs.append(doc)
    topo: dict[str, Any] = {"ranks": ranks}
    if group_size and group_size > 1:
        topo["import_groups"] = [list(range(s, min(s + group_size, ranks)))
                                 for s in range(0, ranks, group_size)]
    if overdeclare:
        topo["declared_readers"] = {str(r): list(range(ranks)) for r in range(ranks)}
    return {"name": name, "granularity": G, "pages": pages, "page_tokens": page_tokens,
            "planes": [{"name": n, "bytes_per_page": b} for n, b in planes],
            "regions": region_docs, "aliases": aliases, "topology": topo}


def published_layout(dcp: int = 8) -> dict[str, Any]:
    """The published case's scale: 16 ranks, 2,234 pages per rank, 112 snapshot rows,
    5 execution rows (owner-only); a 61-layer MLA model cached in 16 planes (15 of
    4 layers, one of 1 layer: mixed bytes per page); DCP``dcp`` import groups; every
    rank declares all 16 readers (overdeclared, as in the field case).

    The exporter model's two free parameters (6-page groups, 1.1 groups per row) were
    set so that the naive chunk count and the reference rule's saving land near the
    published figures (1,920 -> 1,625 chunks, about 15%), judging the reference rule
    only, never the packer."""
    planes = [(f"layers{4 * i}-{4 * i + 3}.latent", LATENT_4) for i in range(15)]
    planes += [("layer60.latent", LATENT_1)]
    regions = [RegionSpec("snapshot", 112, 1.1), RegionSpec("execution", 5, 1.65, "owner")]
    return generate(name=f"published-dcp{dcp}", planes=planes, regions=regions,
                    pages=2234, group_pages=6, ranks=16, group_size=dcp, overdeclare=True,
                    rounding="claim")


def small_layout() -> dict[str, Any]:
    """A small layout for allocator and trace tests: 3 ranks (ranks 0 and 1 import each
    other, rank 2 alone; rank 0 overdeclares rank 2), 2 planes of different page sizes,
    a 2-row snapshot region and a 1-row owner-only execution region."""
    doc = generate(name="small", planes=[("kv0", LATENT_8), ("kv1", LATENT_5)],
                   regions=[RegionSpec("snapshot", 2, 1),
                            RegionSpec("execution", 1, 1, "owner")],
                   pages=24, group_pages=4, ranks=3, group_size=2, rounding="claim")
    doc["topology"]["import_groups"] = [[0, 1]]
    doc["topology"]["declared_readers"] = {"0": [0, 1, 2], "1": [0, 1], "2": [2]}
    return doc


def small_inward_layout() -> dict[str, Any]:
    """Small, inward-rounding exporter: chunks hold only granules wholly inside their
    page group, so the granules between groups stay unaliased (2 ranks, 2 planes)."""
    return generate(name="small-inward", planes=[("kv0", LATENT_8), ("idx", INDEXER)],
                    regions=[RegionSpec("snapshot", 3, 1.5)], pages=40, group_pages=4,
                    ranks=2, group_size=2, rounding="inward")


def small_fine_rows_layout() -> dict[str, Any]:
    """Small layout whose rows are shorter than one granule (several row boundaries
    inside one 2 MiB unit); 4 ranks, one DCP4 group, every rank overdeclared to 4."""
    return generate(name="small-fine-rows", planes=[("kv0", LATENT_1), ("kv1", LATENT_4)],
                    regions=[RegionSpec("snapshot", 8, 0.5)], pages=64, group_pages=4,
                    ranks=4, group_size=4, overdeclare=True, rounding="claim")


EXAMPLES = {
    "published-dcp8": lambda: published_layout(8),
    "published-dcp16": lambda: published_layout(16),
    "small": small_layout,
    "small-inward": small_inward_layout,
    "small-fine-rows": small_fine_rows_layout,
}
"""Every file under ``examples/``, by name (``examples/<name>.json``)."""


def write_examples(folder: str) -> list[str]:
    """(Re)write every example geometry into ``folder``; return the paths."""
    import os

    paths = []
    os.makedirs(folder, exist_ok=True)
    for name, build in EXAMPLES.items():
        path = os.path.join(folder, f"{name}.json")
        with open(path, "w") as f:
            f.write(_dump(build()))
        paths.append(path)
    return paths


def _dump(doc: dict[str, Any]) -> str:
    """Stable JSON: one plane, region or alias per line, so example diffs stay readable."""
    out = []
    for key, value in doc.items():
        if isinstance(value, list) and value and isinstance(value[0], dict):
            items = ",\n".join("  " + json.dumps(v) for v in value)
            out.append(f' "{key}": [\n{items}\n ]')
        else:
            out.append(f" {json.dumps(key)}: {json.dumps(value)}")
    return "{\n" + ",\n".join(out) + "\n}\n"


def random_layout(seed: int, *, granularity: int = G_H200) -> dict[str, Any]:
    """A random layout of the same exporter model: 1-6 planes of realistic page
    sizes, 1-3 regions, random group sizes, rows and page offsets."""
    rng = random.Random(seed)
    sizes = [LATENT_8, LATENT_5, LATENT_4, LATENT_1, INDEXER, 2_359_296, 655_360]
    planes = [(f"p{i}", rng.choice(sizes)) for i in range(rng.randint(1, 6))]
    group_pages = rng.randint(2, 12)
    pages = rng.randint(200, 1200)
    regions = [RegionSpec(f"r{i}", rng.randint(1, 40), rng.choice([1, 1.1, 1.5, 2, 3]),
                          rng.choice(["importers", "owner"]))
               for i in range(rng.randint(1, 3))]
    first = rng.randint(0, 20)
    while True:
        try:
            return generate(name=f"random-{seed}", planes=planes, regions=regions,
                            pages=pages, group_pages=group_pages, first_page=first,
                            granularity=granularity, ranks=rng.randint(1, 8),
                            group_size=rng.choice([None, 2, 4]),
                            overdeclare=rng.random() < 0.5,
                            rounding=rng.choice(["claim", "inward"]))
        except RowBytesError:
            raise
        except ValueError:
            pages *= 2


def exporter_layout(seed: int) -> dict[str, Any]:
    """One member of the seeded *exporter family*: published-scale layouts of the
    page-group exporter with a different plane mix, page count, group size, rows per
    region (row bytes never a multiple of G), rounding and plane interleaving per seed.

    Why: the benchmark judges the planners on a family, not on the few examples; the
    family's parameters were fixed before any planner ran on it, and the benchmark's
    default seeds include seeds nobody looked at while tuning.
    """
    rng = random.Random(f"exporter-{seed}")
    mixes = [
        [(LATENT_4, 15), (LATENT_1, 1)],
        [(LATENT_8, 7), (LATENT_5, 1)],
        [(LATENT_4, 8), (INDEXER, 1), (LATENT_1, 1)],
        [(LATENT_8, 4), (LATENT_4, 4), (LATENT_1, 2)],
        [(2_359_296, 3), (655_360, 3)],
        [(LATENT_4, 12)],
    ]
    mix = rng.choice(mixes)
    planes = [(f"p{i}.{bpp}", bpp) for i, (bpp, n) in enumerate(
        (b, n) for b, n in mix for _ in range(n))]
    planes = [(f"plane{i:02d}", bpp) for i, (_, bpp) in enumerate(planes)]
    regions = [RegionSpec("snapshot", rng.randint(48, 128), rng.choice([1.0, 1.1, 1.25, 1.5])),
               RegionSpec("execution", rng.randint(2, 8), rng.choice([1.0, 1.65, 2.0]), "owner")]
    pages = rng.randint(1200, 3000)
    ranks = rng.choice([8, 16])
    while True:
        try:
            return generate(name=f"exporter-{seed}", planes=planes, regions=regions,
                            pages=pages, group_pages=rng.randint(4, 8), ranks=ranks,
                            group_size=rng.choice([ranks // 2, ranks]), overdeclare=True,
                            rounding=rng.choice(["claim", "claim", "inward"]),
                            interleave=rng.choice(["in-order", "zigzag", "shuffled"]))
        except RowBytesError:
            raise
        except ValueError:
            pages = pages * 3 // 2


ODD_GRANULES = (4, 16, 64, 96, 256, 4096, 65536, G_H200)
ODD_MAX_GRANULES = 1 << 20  # per rank: a quarter of the geometry's reservation limit


def odd_layout(seed: int) -> dict[str, Any]:
    """One member of the seeded *odd family*: layouts unlike any exporter's, the kind
    a fuzzer finds (G from 4 B to 2 MiB, 1 to 5,000 pages, 1 to 40 planes of mixed
    bytes per page, rows of a third of a granule to a hundred granules and past them,
    chunks of 1 to 400 granules dealt to random planes with gaps, owner-only regions).

    Why: the exporter family is what engines emit; this family is where the planner's
    work caps and fallbacks are exercised, and it is judged by the same benchmark
    (``bench_plan.py --odd N``) without picking seeds. Every member is a valid
    geometry: a draw whose chunks do not fit its planes is drawn again from the next
    sub-seed (``random.Random(f"odd-{seed}-{attempt}")``), so a seed always names
    the same layout.
    """
    for attempt in range(1000):
        doc = _odd_draw(random.Random(f"odd-{seed}-{attempt}"), f"odd-{seed}")
        if doc is not None:
            return doc
    raise ValueError(f"odd_layout({seed}): no valid draw in 1,000 attempts")


def _odd_draw(rng: random.Random, name: str) -> dict[str, Any] | None:
    G = rng.choice(ODD_GRANULES)
    pages = rng.choice([1, 2, 7, 64, 500, 2234, 5000])
    planes = []
    for i in range(rng.choice([1, 2, 4, 12, 22, 40])):
        bpp = rng.choice([G, max(1, G // 2), 3 * G, 4 * G + 7, rng.randint(1, 8 * G), 128 * G])
        planes.append({"name": f"p{i}", "bytes_per_page": bpp})
    plane_bytes = {p["name"]: _round_up(p["bytes_per_page"] * pages, G) for p in planes}
    total = sum(plane_bytes.values())
    regions: list[dict[str, Any]] = []
    aliases: list[dict[str, Any]] = []
    cursor = dict.fromkeys(plane_bytes, 0)
    region_granules = 0
    for k in range(rng.choice([1, 1, 2])):
        rows = rng.choice([1, 2, 5, 112, 1000, 20000])
        budget = total // (3 * (k + 1))
        row_bytes = max(1, min(budget // rows, rng.choice(
            [G // 3 + 1, G + 5, 7 * G - 3, 100 * G + 1, 6344])))
        region = {"name": f"r{k}", "rows": rows, "row_bytes": row_bytes}
        if rng.random() < 0.3:
            region["access"] = "owner"
        regions.append(region)
        need = _round_up(rows * row_bytes, G)
        region_granules += need // G
        offset = 0
        while offset < need:
            length = min(need - offset, G * rng.choice([1, 1, 2, 5, 30, 400]))
            fits = [p for p in plane_bytes if plane_bytes[p] - cursor[p] >= length]
            if not fits:
                return None
            plane = rng.choice(fits)
            room = (plane_bytes[plane] - cursor[plane] - length) // G
            gap = G * rng.randint(0, max(0, min(3, room)))
            aliases.append({"region": region["name"], "offset": offset, "plane": plane,
                            "plane_offset": cursor[plane] + gap, "length": length})
            cursor[plane] += gap + length
            offset += length
    if total // G + region_granules > ODD_MAX_GRANULES or len(aliases) > 6000:
        return None
    return {"name": name, "granularity": G, "pages": pages, "page_tokens": 16,
            "planes": planes, "regions": regions, "aliases": aliases,
            "topology": {"ranks": 2, "import_groups": [[0, 1]],
                         "declared_readers": {"0": [0, 1], "1": [0, 1]}}}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    out = argparse.ArgumentParser(add_help=False)
    out.add_argument("-o", "--output", help="write here (default: stdout)")
    sub = ap.add_subparsers(dest="kind", required=True)
    p = sub.add_parser("published", parents=[out], help="the published-scale layout")
    p.add_argument("--dcp", type=int, default=8, choices=[8, 16])
    sub.add_parser("small", parents=[out], help="the small test layout")
    r = sub.add_parser("random", parents=[out], help="a random layout of the same exporter model")
    r.add_argument("--seed", type=int, default=0)
    x = sub.add_parser("exporter", parents=[out], help="a member of the seeded exporter family")
    x.add_argument("--seed", type=int, default=0)
    o = sub.add_parser("odd", parents=[out], help="a member of the seeded odd (fuzz-like) family")
    o.add_argument("--seed", type=int, default=0)
    e = sub.add_parser("examples", help="rewrite every examples/*.json")
    e.add_argument("folder", nargs="?", default="examples")
    args = ap.parse_args(argv)
    if args.kind == "examples":
        for path in write_examples(args.folder):
            print(path)
        return 0
    if args.kind == "published":
        doc = published_layout(args.dcp)
    elif args.kind == "small":
        doc = small_layout()
    elif args.kind == "exporter":
        doc = exporter_layout(args.seed)
    elif args.kind == "odd":
        doc = odd_layout(args.seed)
    else:
        doc = random_layout(args.seed)
    text = _dump(doc)
    if args.output:
        with open(args.output, "w") as f:
            f.write(text)
    else:
        sys.stdout.write(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
