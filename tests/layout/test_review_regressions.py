"""Regressions from the review of the tall-region and plan-file changes (2026-12-01)."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest

from kvgrant.cli import main
from kvgrant.errors import ArgumentError, GeometryError, PlanFileError
from kvgrant.layout.conflicts import conflict_ranges
from kvgrant.layout.geometry import Geometry, load_geometry
from kvgrant.layout.plan import Allocation
from kvgrant.layout.planfile import plan_document, read_plan_file
from kvgrant.layout.rules import reference_plan

ROOT = Path(__file__).resolve().parents[2]
SMALL = ROOT / "examples" / "small.json"


def test_alloc_json_does_not_echo_a_whole_plan_file(tmp_path: Path, capsys) -> None:
    g = load_geometry(SMALL)
    doc = plan_document(reference_plan(g))
    doc["allocations"] = doc["allocations"] * 5000  # was echoed whole: 3.8 MB of JSON
    path = tmp_path / "big.json"
    path.write_text(json.dumps(doc))
    rc = main(["alloc", str(SMALL), "--backend", "sim", "--plan", str(path), "--json"])
    out = capsys.readouterr().out
    assert rc == 2
    report = json.loads(out)
    assert report["field"].startswith("allocations") and len(out) < 5_000


def test_a_contract_breaking_plan_file_lists_its_violations(tmp_path: Path) -> None:
    g = load_geometry(SMALL)
    doc = plan_document(reference_plan(g))
    doc["allocations"][0]["length"] += g.granularity  # overlaps the next allocation
    path = tmp_path / "bad.json"
    path.write_text(json.dumps(doc))
    with pytest.raises(PlanFileError) as info:
        read_plan_file(path, g)
    err = info.value
    assert len(err.violations) > 1
    assert all(str(v) in str(err) for v in err.violations[:10])


def test_conflict_ranges_refuse_a_chunk_before_its_region() -> None:
    # the bulk walk moved such a chunk into the previous region's last row, silently
    doc = json.loads(SMALL.read_text())
    doc["regions"][0].update(rows=131_072, row_bytes=128)
    from kvgrant.layout.geometry import parse_geometry

    g = parse_geometry(doc)
    G = g.granularity
    bad = list(g.aliases) + [Allocation("kv0", 0, 2 * G, region="execution",
                                        region_offset=-G)]
    with pytest.raises(ArgumentError, match="offsets must be >= 0"):
        conflict_ranges(g, bad)
    with pytest.raises(ArgumentError, match="region = 'nope'"):
        conflict_ranges(g, [Allocation("kv0", 0, G, region="nope", region_offset=0)])


def test_a_copied_geometry_does_not_share_or_keep_cached_values() -> None:
    g = load_geometry(SMALL)
    reference_plan(g)
    g._declared_ranges  # noqa: B018 - fill the caches
    g._memo["x"] = 1
    c = g.model_copy(update={"pages": 30})
    assert "x" not in c._memo and "x" in g._memo
    assert max(b for rs in c._declared_ranges.values() for _, b in rs) <= 30
    assert copy.deepcopy(g) == g  # refused before: the cached mappingproxy


def _with_a_repeated_key(text: str, key: str) -> str:
    """``text`` with the first ``"key": value`` pair's key written twice (the copy
    first, holding another value), as a hand edit leaves it."""
    at = text.index(f'"{key}"')
    return text[:at] + f'"{key}": 1, ' + text[at:]


@pytest.mark.parametrize("key", ["name", "granularity", "bytes_per_page"])
def test_a_geometry_file_naming_a_key_twice_is_refused(tmp_path: Path, key: str) -> None:
    # was: json.loads kept the last value silently, so the file meant two things
    path = tmp_path / "dup.json"
    path.write_text(_with_a_repeated_key(SMALL.read_text(), key))
    with pytest.raises(GeometryError, match=f'key "{key}" appears twice') as err:
        load_geometry(path)
    assert err.value.field == key


def test_a_geometry_file_with_nan_is_refused(tmp_path: Path, capsys) -> None:
    path = tmp_path / "nan.json"
    path.write_text(SMALL.read_text().replace('"granularity": ', '"granularity": NaN, "x": ', 1))
    assert main(["plan", str(path)]) == 2
    assert "NaN is not a JSON number" in capsys.readouterr().err


def test_a_plan_file_naming_a_key_twice_is_refused(tmp_path: Path) -> None:
    g = load_geometry(SMALL)
    path = tmp_path / "plan.json"
    path.write_text(_with_a_repeated_key(json.dumps(plan_document(reference_plan(g))),
                                         "plane_offset"))
    with pytest.raises(PlanFileError, match='key "plane_offset" appears twice') as err:
        read_plan_file(path, g)
    assert err.value.field == "plane_offset"


def _mid_plane_geometry() -> "Geometry":
    """Two chunks in the middle of their planes: the reference rule's 6 allocations
    are optimal (the combinatorial bound is 6), the trivial floor is 3."""
    from kvgrant.layout.geometry import parse_geometry

    return parse_geometry({
        "name": "mid-plane", "granularity": 96, "pages": 40, "page_tokens": 16,
        "topology": {"ranks": 2},
        "planes": [{"name": "p0", "bytes_per_page": 959},
                   {"name": "p1", "bytes_per_page": 959}],
        "regions": [{"name": "r0", "rows": 4, "row_bytes": 2510},
                    {"name": "r1", "rows": 1, "row_bytes": 4800}],
        "aliases": [{"region": "r0", "offset": 0, "plane": "p1", "plane_offset": 9600,
                     "length": 10080},
                    {"region": "r1", "offset": 0, "plane": "p0", "plane_offset": 14400,
                     "length": 4800}]})


def test_a_model_for_windows_is_not_solved_when_the_bound_proves_the_start(
        monkeypatch) -> None:
    # was: a 2-chunk layout at G = 96 B (365,001 nonzeros) ran its windows for over
    # 5 minutes, where the combinatorial bound (1.6 s) proves the reference rule optimal
    from kvgrant.layout import windows
    from kvgrant.layout.planner import plan_packed

    g = _mid_plane_geometry()

    def no_windows(*a, **k):
        raise AssertionError("the windows ran although the bound proves the start")

    monkeypatch.setattr(windows, "solve_windows", no_windows)
    res = plan_packed(g, max_nonzeros=1)
    assert res.optimal and res.bound == 6 and res.bound_source == "combinatorial"
    assert res.plan.allocations == reference_plan(g).allocations
    assert res.source == "reference" and res.exact is not None
    assert res.exact.status.startswith("Optimal (start meets the combinatorial bound")
