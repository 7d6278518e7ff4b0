"""The plan a version-2 trace header carries, read and checked for consistency.

Why: a trace that names its objects (handles, VAs, sizes) can be checked against the
plan only when the plan itself is trustworthy. The header carries every allocation's
plane, plane offset, length, region and region offset, the VA layout of a rank's
reservation, each rank's reservation base and size, and the geometry's topology
(import groups, declared readers). Importers are *derived* from the import groups,
as the geometry does, never read from a list the trace could forge; a header whose
plan is inconsistent (overlaps, out-of-range offsets, unaligned lengths) is malformed.
``kvgrant conform --geometry`` additionally compares it with the geometry's own plan.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, Mapping

from kvgrant.errors import TraceError
from kvgrant.strict_json import show_value

__all__ = ["Layout", "PlanAlloc", "compare_plan", "derive_importers", "parse_layout",
           "rank_key_error"]


@dataclass(frozen=True)
class PlanAlloc:
    """One allocation of the plan: plane bytes [plane_offset, +length), and the region
    bytes [region_offset, +length) it backs when aliased."""

    plane: str
    plane_offset: int
    length: int
    region: str | None
    region_offset: int | None


@dataclass(frozen=True)
class Layout:
    """A rank's VA layout and the plan, as the header states them.

    ``map_off[a]`` / ``alias_off[a]`` are allocation ``a``'s plane and alias offsets
    inside a reservation (alias -1 when not aliased); ``reservations[r]`` is rank r's
    (base or None when it never reserved, size).
    """

    granularity: int
    pages: int | None
    planes: Mapping[str, tuple[int, int]]
    regions: Mapping[str, tuple[int, int, str]]
    allocations: tuple[PlanAlloc, ...]
    reservations: Mapping[int, tuple[int | None, int]]
    import_groups: tuple[tuple[int, ...], ...]
    declared_readers: Mapping[int, tuple[int, ...]] | None
    map_off: tuple[int, ...]
    alias_off: tuple[int, ...]

    def va(self, rank: int, alloc: int, mapping: str) -> int | None:
        """The VA of mapping ``mapping`` of ``alloc`` on ``rank`` (None: no base)."""
        base = self.reservations[rank][0]
        off = self.map_off[alloc] if mapping == "plane" else self.alias_off[alloc]
        return None if base is None or off < 0 else base + off

    def to_json(self) -> dict[str, Any]:
        """The header fields this layout came from (inverse of :func:`parse_layout`)."""
        return {
            "granularity": self.granularity, "pages": self.pages,
            "planes": [[n, o, b] for n, (o, b) in self.planes.items()],
            "regions": [[n, o, b, acc] for n, (o, b, acc) in self.regions.items()],
            "allocations": [[a.plane, a.plane_offset, a.length, a.region, a.region_offset]
                            for a in self.allocations],
            "reservations": {str(r): [b, s] for r, (b, s) in sorted(self.reservations.items())},
            "topology": {"import_groups": [list(g) for g in self.import_groups],
                         "declared_readers": None if self.declared_readers is None else
                         {str(r): list(v) for r, v in sorted(self.declared_readers.items())}},
        }


def derive_importers(ranks: int, groups: tuple[tuple[int, ...], ...]
                     ) -> tuple[frozenset[int], ...]:
    """Importers of each rank: the other members of its import group (as
    ``Geometry.importers``); a rank in no group has none."""
    of: dict[int, frozenset[int]] = {}
    for g in groups:
        for r in g:
            of[r] = frozenset(g) - {r}
    return tuple(of.get(r, frozenset()) for r in range(ranks))


def _is_int(v: Any) -> bool:
    return type(v) is int


# A rank written as a JSON object key: ASCII decimal, no leading zeros (so each rank has
# one spelling and "0" / "00" cannot both name rank 0); str.isdigit() would also take
# "\u00b2" (int() refuses it) and "\u0660" (int() reads it as 0).
_RANK_KEY = re.compile(r"0|[1-9][0-9]*")


def rank_key_error(key: Any, ranks: int, field: str) -> str | None:
    """Why ``key`` (an object key of the rank table ``field``, e.g. ``header.devices``)
    does not name a rank 0..ranks-1, as a message naming the field, the key and the
    rule; None when it does (then ``int(key)`` is that rank)."""
    shown = repr(key)
    if len(shown) > 40:  # the rule stays readable after a 5000-digit key
        shown = shown[:32] + f"... ({len(key) if isinstance(key, str) else '?'} chars)"
    if not isinstance(key, str) or not _RANK_KEY.fullmatch(key):
        return (f"{field} key {shown}: must be a rank number written in ASCII decimal "
                f"without leading zeros (0..{ranks - 1})")
    if len(key) > len(str(ranks - 1)) or int(key) >= ranks:  # no int() of 10^4 digits
        return f"{field} key {shown}: rank out of range (the ranks are 0..{ranks - 1})"
    return None


def _first_overlap(spans: list[tuple[int, int, int]]
                   ) -> tuple[tuple[int, int, int], tuple[int, int]] | None:
    """The first pair of ``(lo, hi, owner)`` byte ranges that overlap, in address order:
    ``((lo, hi, owner) of the earlier, (lo, owner) of the later)``; None when none do."""
    items = sorted(spans)
    for (lo1, hi1, o1), (lo2, _hi2, o2) in zip(items, items[1:]):
        if lo2 < hi1:
            return (lo1, hi1, o1), (lo2, o2)
    return None


def _first_gap(spans: list[tuple[int, int, int]], size: int) -> tuple[int, int] | None:
    """The first byte range of [0, size) that no span covers (spans do not overlap)."""
    at = 0
    for lo, hi, _ in sorted(spans):
        if lo > at:
            return at, lo
        at = max(at, hi)
    return (at, size) if at < size else None


def parse_layout(obj: Mapping[str, Any], ranks: int, allocs: int, lineno: int,
                 source: str, *, one_slot: bool = True) -> Layout:
    """Read and check the plan fields of a version-2 header (TraceError names the
    field, the value and the rule). ``one_slot``: a reservation holds the layout and
    nothing else (one process's ranks); a group process reserves one slot per rank it
    maps, whose count conformance.group_io checks, so here the size need only hold the
    layout."""
    def fail(msg: str) -> TraceError:
        if len(msg) > 400:
            msg = msg[:400] + " ... (cut)"
        return TraceError(f"{source}:{lineno}: {msg}", line=lineno)

    def g_int(v: Any, name: str, lo: int = 0) -> int:
        if not _is_int(v) or v < lo:
            raise fail(f"header.{name} = {v!r}: must be an integer >= {lo}")
        return v

    G = g_int(obj.get("granularity"), "granularity", 1)
    pages = obj.get("pages")
    if pages is not None:
        g_int(pages, "pages", 1)

    def aligned(v: Any, name: str, lo: int = 0) -> int:
        g_int(v, name, lo)
        if v % G:
            raise fail(f"header.{name} = {v}: must be a multiple of the granularity {G}")
        return v

    def spans(key: str, width: int) -> dict[str, tuple]:
        raw = obj.get(key)
        if not isinstance(raw, list):
            raise fail(f"header.{key} = {raw!r}: must be a list of [name, offset, bytes"
                       + (", access]" if width == 4 else "]"))
        out: dict[str, tuple] = {}
        for i, item in enumerate(raw):
            name = f"{key}[{i}]"
            if not isinstance(item, list) or len(item) != width or type(item[0]) is not str:
                raise fail(f"header.{name} = {item!r}: must be [name, offset, bytes"
                           + (", access]" if width == 4 else "]"))
            if item[0] in out:
                raise fail(f"header.{name} = {item!r}: name {item[0]!r} is used twice")
            off = aligned(item[1], name + ".offset")
            size = aligned(item[2], name + ".bytes", 1)
            if width == 4:
                if item[3] not in ("importers", "owner"):
                    raise fail(f"header.{name}.access = {item[3]!r}: must be 'importers' "
                               "or 'owner'")
                out[item[0]] = (off, size, item[3])
            else:
                out[item[0]] = (off, size)
        return out

    planes = spans("planes", 3)
    regions = spans("regions", 4)
    every = sorted([(o, o + b, "plane " + n) for n, (o, b) in planes.items()]
                   + [(v[0], v[0] + v[1], "region " + n) for n, v in regions.items()])
    for (lo1, hi1, n1), (lo2, _hi2, n2) in zip(every, every[1:]):
        if lo2 < hi1:
            raise fail(f"header: {n1} [{lo1:#x}, {hi1:#x}) overlaps {n2} at {lo2:#x} in the "
                       "reservation layout")
    span_end = max((hi for _, hi, _ in every), default=0)

    raw = obj.get("allocations")
    if not isinstance(raw, list) or len(raw) != allocs:
        raise fail(f"header.allocations: must be a list of {allocs} entries (header.allocs), "
                   f"got {type(raw).__name__ if not isinstance(raw, list) else len(raw)}")
    plan: list[PlanAlloc] = []
    map_off: list[int] = []
    alias_off: list[int] = []
    used: dict[str, list[tuple[int, int, int]]] = {}
    for a, item in enumerate(raw):
        name = f"allocations[{a}]"
        if not isinstance(item, list) or len(item) != 5:
            raise fail(f"header.{name} = {item!r}: must be [plane, plane_offset, length, "
                       "region or null, region_offset or null]")
        plane, poff, length, region, roff = item
        if type(plane) is not str or plane not in planes:  # a list would be unhashable
            raise fail(f"header.{name}.plane = {plane!r}: must be a string naming a plane "
                       "of header.planes")
        aligned(poff, name + ".plane_offset")
        aligned(length, name + ".length", 1)
        if poff + length > planes[plane][1]:
            raise fail(f"header.{name}: plane bytes [{poff:#x}, {poff + length:#x}) pass the "
                       f"end of plane {plane!r} ({planes[plane][1]:#x} bytes)")
        used.setdefault("plane " + plane, []).append((poff, poff + length, a))
        map_off.append(planes[plane][0] + poff)
        if region is None:
            if roff is not None:
                raise fail(f"header.{name}.region_offset = {roff!r}: must be null when the "
                           "allocation is not aliased")
            alias_off.append(-1)
        else:
            if type(region) is not str or region not in regions:
                raise fail(f"header.{name}.region = {region!r}: must be null or a string "
                           "naming a region of header.regions")
            aligned(roff, name + ".region_offset")
            if roff + length > regions[region][1]:
                raise fail(f"header.{name}: region bytes [{roff:#x}, {roff + length:#x}) pass "
                           f"the end of region {region!r} ({regions[region][1]:#x} bytes)")
            used.setdefault("region " + region, []).append((roff, roff + length, a))
            alias_off.append(regions[region][0] + roff)
        plan.append(PlanAlloc(plane, poff, length, region, roff))
    for where, items in used.items():
        hit = _first_overlap(items)
        if hit is not None:
            (lo1, hi1, a1), (lo2, a2) = hit
            raise fail(f"header.allocations[{a2}]: {where} bytes from {lo2:#x} overlap "
                       f"allocation {a1}'s [{lo1:#x}, {hi1:#x})")
    for kind, table, point in (("plane", planes, "1: every plane's bytes are covered "
                                "exactly once"), ("region", regions, "2: every region byte "
                                "is backed exactly once")):
        for i, (n, item) in enumerate(table.items()):
            gap = _first_gap(used.get(f"{kind} {n}", []), item[1])
            if gap is not None:
                raise fail(f"header.{kind}s[{i}] {n!r}: bytes [{gap[0]:#x}, {gap[1]:#x}) of "
                           f"its {item[1]:#x} are in no allocation (layout contract point "
                           f"{point})")

    res_raw = obj.get("reservations")
    if not isinstance(res_raw, dict):
        raise fail(f"header.reservations = {res_raw!r}: must be an object rank -> [base or "
                   "null, size]")
    reservations: dict[int, tuple[int | None, int]] = {}
    for r in range(ranks):
        item = res_raw.get(str(r))
        name = f"reservations[{r}]"
        if str(r) not in res_raw:  # (was "reservations[3] = None", a Python None)
            raise fail(f"header.{name}: missing (header.ranks = {ranks} asks for one "
                       f"[base or null, size] per rank 0..{ranks - 1})")
        if not isinstance(item, list) or len(item) != 2:
            raise fail(f"header.{name} = {show_value(item)}: must be [base or null, size]")
        base, size = item
        if base is not None:
            aligned(base, name + ".base", 1)
        aligned(size, name + ".size", 1)
        if size < span_end or (one_slot and size != span_end):  # docs/INTERFACES.md
            raise fail(f"header.{name}.size = {size:#x}: must be the layout's "
                       f"{span_end:#x} bytes of planes and regions (a reservation holds "
                       f"them{' and nothing else' if one_slot else ''}), "
                       f"{'smaller' if size < span_end else 'larger'}")
        reservations[r] = (base, size)
    for k in res_raw:
        why = rank_key_error(k, ranks, "header.reservations")
        if why is not None:
            raise fail(why)
    hit = _first_overlap([(b, b + s, r) for r, (b, s) in reservations.items()
                          if b is not None])
    if hit is not None:
        (lo1, hi1, r1), (lo2, r2) = hit
        raise fail(f"header.reservations[{r2}]: base {lo2:#x} overlaps rank {r1}'s "
                   f"reservation [{lo1:#x}, {hi1:#x})")

    topo = obj.get("topology")
    if not isinstance(topo, dict):
        raise fail(f"header.topology = {topo!r}: must be an object with import_groups and "
                   "declared_readers (as in the geometry)")
    groups_raw = topo.get("import_groups")
    if not isinstance(groups_raw, list):  # 0, "", {}, false and a missing key included
        raise fail(f"header.topology.import_groups = {groups_raw!r}: must be a list of "
                   f"lists of distinct ranks 0..{ranks - 1} ([] when no rank imports)")
    seen: set[int] = set()
    groups: list[tuple[int, ...]] = []
    for i, grp in enumerate(groups_raw):
        if not isinstance(grp, list) or not all(_is_int(x) and 0 <= x < ranks for x in grp):
            raise fail(f"header.topology.import_groups[{i}] = {grp!r}: must be a list of "
                       f"ranks 0..{ranks - 1}")
        if seen & set(grp) or len(set(grp)) != len(grp):
            raise fail(f"header.topology.import_groups[{i}] = {grp!r}: a rank is in two "
                       "groups (or twice in one)")
        seen |= set(grp)
        groups.append(tuple(grp))
    dec_raw = topo.get("declared_readers")
    declared: dict[int, tuple[int, ...]] | None = None
    if dec_raw is not None:
        if not isinstance(dec_raw, dict):
            raise fail(f"header.topology.declared_readers = {dec_raw!r}: must be an object "
                       "rank -> list of ranks")
        declared = {}
        for k, v in dec_raw.items():
            why = rank_key_error(k, ranks, "header.topology.declared_readers")
            if why is not None:
                raise fail(why)
            if not isinstance(v, list) or not all(_is_int(x) and 0 <= x < ranks for x in v):
                raise fail(f"header.topology.declared_readers[{k}] = {v!r}: must be a list "
                           f"of ranks 0..{ranks - 1}")
            if len(set(v)) != len(v):
                dup = next(x for i, x in enumerate(v) if x in v[:i])
                raise fail(f"header.topology.declared_readers[{k}] = {v!r}: reader {dup} is "
                           f"listed twice for owner {k} (each reader once)")
            declared[int(k)] = tuple(sorted(v))
    return Layout(G, pages, planes, regions, tuple(plan), reservations, tuple(groups),
                  declared, tuple(map_off), tuple(alias_off))


def _diff(path: str, got: Any, want: Any, out: list[str]) -> None:
    if isinstance(want, dict) and isinstance(got, dict):
        for k in list(want) + [k for k in got if k not in want]:
            _diff(f"{path}.{k}", got.get(k), want.get(k), out)
    elif isinstance(want, list) and isinstance(got, list) and len(got) == len(want):
        for i, (g, w) in enumerate(zip(got, want)):
            _diff(f"{path}[{i}]", g, w, out)
    elif got != want:
        out.append(f"{path} = {_clip(got)} but the geometry says {_clip(want)}")


def _clip(value: Any, most: int = 140) -> str:
    """``repr(value)``, cut to ``most`` characters with a mark saying so. Why: a list of
    differing length (a whole plane list) was cut mid-value with the line, and the
    geometry's side lost without a word."""
    text = repr(value)
    if len(text) <= most:
        return text
    n = f" ({len(value)} items)" if isinstance(value, (list, tuple, dict)) else ""
    return text[:most] + f"... (cut{n})"


def compare_plan(layout: Layout, ranks: int, expected: Mapping[str, Any]) -> list[str]:
    """Where the header's plan differs from ``expected`` (the header fields derived from
    the geometry, ``kvgrant.traceformat.plan_header``): one line per field, naming it
    (``header.allocations[3][2] = ... but the geometry says ...``). Reservation bases
    are the driver's choice and are not compared; their sizes are."""
    got = layout.to_json()
    want = {k: v for k, v in expected.items() if k in got}
    if "reservations" in want:
        want["reservations"] = {r: [got["reservations"].get(r, [None])[0], v[1]]
                                for r, v in want["reservations"].items()}
    if expected.get("pages") is None:
        want.pop("pages", None)
    out: list[str] = []
    if "ranks" in expected and expected["ranks"] != ranks:
        out.append(f"header.ranks = {ranks} but the geometry has {expected['ranks']} ranks")
    _diff("header", got, want, out)
    return out
