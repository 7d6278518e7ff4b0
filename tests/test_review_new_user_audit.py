"""Regressions of a new-user audit (2026-12-07): library calls and input files that
failed inside kvgrant (a KeyError, a rank that does not exist answered as if it did) or
were told the wrong rule."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from kvgrant.errors import ContractError, GeometryError, PlanFileError
from kvgrant.layout import load_geometry
from kvgrant.layout.plan import Allocation, PhysicalPlan

ROOT = Path(__file__).resolve().parents[1]
SMALL = ROOT / "examples" / "small.json"


@pytest.fixture(scope="module")
def small():
    return load_geometry(SMALL)


@pytest.mark.parametrize("call, field, says", [
    (lambda g: g.plane_bytes("nope"), "plane", 'plane = "nope": no such plane'),
    (lambda g: g.region_bytes("nope"), "region", 'region = "nope": no such region'),
    (lambda g: g.granted_devices(0, region="nope"), "region", "no such region"),
    (lambda g: g.granted_count(0, region="nope"), "region", "no such region"),
    (lambda g: g.importers(99), "rank", "rank = 99: must be a rank of this geometry, 0..2"),
    (lambda g: g.granted_devices(3), "rank", "rank = 3: must be a rank"),
    (lambda g: g.declared_readers(-1), "rank", "rank = -1: must be a rank"),
    (lambda g: g.importers(True), "rank", "rank = True: must be a rank"),
])
def test_a_name_or_rank_the_geometry_lacks_is_a_geometry_error(small, call, field: str,
                                                                says: str) -> None:
    # was: KeyError: 'nope'; importers(99) == () and granted_devices(99) == (99,)
    with pytest.raises(GeometryError, match=says) as info:
        call(small)
    assert info.value.field == field


def test_the_names_and_ranks_it_has_answer_as_before(small) -> None:
    plane, region = small.planes[0], small.regions[0]
    assert small.plane_bytes(plane.name) % small.granularity == 0
    assert small.region_bytes(region.name) >= region.rows * region.row_bytes
    for r in range(small.topology.ranks):
        assert r in small.granted_devices(r)
        assert r not in small.importers(r)


@pytest.mark.parametrize("alloc, says", [
    (lambda g: Allocation("nope", 0, g.granularity), 'plane "nope" is not a plane'),
    (lambda g: Allocation(g.planes[0].name, 1, g.granularity),
     "plane_offset = 1 must be a non-negative multiple of the granularity"),
    (lambda g: Allocation(g.planes[0].name, 0, g.granularity * 10**6), "runs past plane"),
    (lambda g: Allocation(g.planes[0].name, 0, g.granularity, "nope", 0),
     'region "nope" is not a region'),
])
def test_allocate_without_the_contract_check_still_refuses_a_plan_it_cannot_build(
        small, alloc, says: str) -> None:
    # check_contract=False skips the contract; such a plan failed as KeyError: 'nope'
    # inside the engine
    from kvgrant.runtime import allocate

    plan = PhysicalPlan("packed", small, (alloc(small),))
    with pytest.raises(ContractError, match="cannot be built in 'small'") as info:
        allocate(small, backend="sim", plan=plan, check_contract=False)
    assert says in str(info.value)


def test_allocate_without_the_contract_check_builds_a_plan_that_maps_no_region(small) -> None:
    # what check_contract=False is for: a floor that maps the planes only
    from kvgrant.runtime import allocate

    plan = PhysicalPlan("packed", small, tuple(
        Allocation(p.name, 0, small.plane_bytes(p.name)) for p in small.planes))
    pub = allocate(small, backend="sim", plan=plan, check_contract=False)
    try:
        assert pub.counts.allocations == small.topology.ranks * len(small.planes)
    finally:
        pub.release()


def _packed_plan_doc() -> dict:
    """The plan document ``kvgrant plan --json`` writes (its ``packed_plan``)."""
    import contextlib
    import io

    from kvgrant.cli import main

    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        assert main(["plan", str(SMALL), "--json"]) == 0
    return json.loads(buf.getvalue())["packed_plan"]


def test_a_plan_file_allocation_with_an_unknown_key_names_the_key(tmp_path: Path,
                                                                 small) -> None:
    from kvgrant.layout.planfile import read_plan_file

    doc = _packed_plan_doc()
    path = tmp_path / "extra.json"
    path.write_text(json.dumps(doc))
    read_plan_file(str(path), small)  # as written: read
    doc["allocations"][0]["colour"] = "x"
    path.write_text(json.dumps(doc))
    # was: "allocations[0] = {...}: must have plane, plane_offset, length and ..."
    with pytest.raises(PlanFileError, match=r'allocations\[0\]\.colour = "x": unknown key'):
        read_plan_file(str(path), small)
    del doc["geometry_hash"]
    doc["allocations"][0].pop("colour")
    path.write_text(json.dumps(doc))
    # was: "geometry_hash = null: the plan was made for another layout"
    with pytest.raises(PlanFileError, match="geometry_hash = null: missing"):
        read_plan_file(str(path), small)


def test_a_json_error_in_a_trace_reads_once_at(tmp_path: Path) -> None:
    from kvgrant.conformance import load_trace
    from kvgrant.errors import TraceError

    path = tmp_path / "t.ndjson"
    path.write_text('{"kind": "header", "unterminated\n')
    with pytest.raises(TraceError) as info:
        load_trace(str(path))
    # was: "Unterminated string starting at at column 24"
    assert "starting at column" in str(info.value) and "at at" not in str(info.value)


def test_a_header_with_more_ranks_than_reservations_names_the_missing_rank(
        tmp_path: Path) -> None:
    from kvgrant.conformance import load_trace
    from kvgrant.errors import TraceError
    from kvgrant.runtime import allocate

    path = tmp_path / "t.ndjson"
    allocate(load_geometry(SMALL), backend="sim", trace=str(path)).release()
    lines = path.read_text().splitlines()
    head = json.loads(lines[0])
    head["ranks"] += 1
    path.write_text("\n".join([json.dumps(head), *lines[1:]]) + "\n")
    with pytest.raises(TraceError) as info:
        load_trace(str(path))
    # was: "header.reservations[3] = None: must be [base or null, size]"
    assert "header.reservations[3]: missing (header.ranks = 4" in str(info.value), info.value


def test_ranks_past_the_limit_is_the_options_bad_value(capsys) -> None:
    from kvgrant.cli import main

    # was: kind GeometryError with field "ranks", as if the layout file were wrong
    assert main(["alloc", str(SMALL), "--backend", "sim", "--ranks", "99999999",
                 "--json"]) == 2
    doc = json.loads(capsys.readouterr().out)
    assert (doc["kind"], doc["argument"], doc["value"]) == ("ArgumentError", "ranks", 99999999)
    assert doc["message"].startswith("--ranks = 99999999: must be an integer in 1..")


def test_a_rule_broken_inside_a_geometry_file_names_the_file(tmp_path: Path) -> None:
    doc = json.loads(SMALL.read_text())
    doc["pages"] = -1
    path = tmp_path / "bad.json"
    path.write_text(json.dumps(doc))
    with pytest.raises(GeometryError) as info:
        load_geometry(path)
    # was: "invalid geometry: pages = -1: ..." with no file, where a JSON error names it
    assert str(info.value).startswith(f'"{path}": invalid geometry: pages = -1'), info.value
    assert (info.value.field, info.value.value) == ("pages", -1)


def test_a_missing_geometry_field_has_no_value(tmp_path: Path, capsys) -> None:
    from kvgrant.cli import main

    doc = json.loads(SMALL.read_text())
    del doc["pages"]
    path = tmp_path / "bad.json"
    path.write_text(json.dumps(doc))
    assert main(["plan", str(path), "--json"]) == 2
    out = json.loads(capsys.readouterr().out)
    # was: "value" = a cut Python repr of the whole document
    assert (out["field"], out["value"]) == ("pages", None)
    assert "pages: missing (the field is required)" in out["message"]


@pytest.mark.parametrize("argv, argument, value", [
    (["alloc", str(SMALL), "--ranks", "abc"], "ranks", "abc"),
    (["alloc", str(SMALL), "--backend", "nope"], "backend", "nope"),
    (["alloc", str(SMALL), "--fail-at", "-3"], "fail-at", "-3"),
    (["plan", str(SMALL), "--time-limit", "inf"], "time-limit", "inf"),
])
def test_a_usage_error_document_names_the_argument_and_value(argv, argument: str,
                                                             value: str, capsys) -> None:
    from kvgrant.cli import main

    with pytest.raises(SystemExit) as info:
        main([*argv, "--json"])
    assert info.value.code == 2
    doc = json.loads(capsys.readouterr().out)
    # was: kind, message and exit_status only, where every other bad argument's
    # document has argument and value
    assert (doc["kind"], doc["argument"], doc["value"]) == ("ArgumentError", argument, value)


def test_a_byte_order_mark_is_named_for_whoever_saved_the_file(tmp_path: Path) -> None:
    from kvgrant.conformance import load_trace
    from kvgrant.errors import TraceError
    from kvgrant.strict_json import BOM_RULE

    bom = "\ufeff"
    geometry = tmp_path / "g.json"
    geometry.write_text(bom + SMALL.read_text(), encoding="utf-8")
    trace = tmp_path / "t.ndjson"
    trace.write_text(bom + '{"kind": "header"}\n', encoding="utf-8")
    # was: "Unexpected UTF-8 BOM (decode using utf-8-sig)", advice for a programmer
    for load, path, error in ((load_geometry, geometry, GeometryError),
                              (load_trace, trace, TraceError)):
        with pytest.raises(error) as info:
            load(path)
        assert BOM_RULE in str(info.value) and "utf-8-sig" not in str(info.value)
