"""Bad input found by a review of the geometry and plan-file readers: each is refused
with an error naming the field, the value and the rule (exit 2 from the CLI), never a
traceback, and the valid inputs next to it are still accepted."""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path
from typing import Any

import pytest

from kvgrant.cli import main
from kvgrant.errors import ArgumentError, GeometryError, PlanError, PlanFileError
from kvgrant.layout.geometry import load_geometry, parse_geometry
from kvgrant.layout.planfile import plan_document, read_plan_file
from kvgrant.layout.plans import packed_plan
from kvgrant.layout.rules import naive_plan
from kvgrant.strict_json import strict_json_loads
from layout_builders import geometry_dict

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
SMALL = EXAMPLES / "small.json"
LIMIT = sys.get_int_max_str_digits()


def _rejected(doc: dict[str, Any]) -> GeometryError:
    with pytest.raises(GeometryError) as info:
        parse_geometry(doc)
    return info.value


# ------------------------------------------------- integers past Python's digit limit
@pytest.mark.skipif(LIMIT == 0, reason="no int-to-str digit limit in this interpreter")
def test_a_huge_integer_in_a_geometry_file_names_its_field(tmp_path: Path) -> None:
    # was: field "<file>", '"g.json": unreadable JSON value: Exceeds the limit (4300
    # digits) ... use sys.set_int_max_str_digits() t' (cut mid-word, no field)
    path = tmp_path / "g.json"
    path.write_text(re.sub(r'"pages": \d+', '"pages": ' + "9" * 5000, SMALL.read_text(),
                           count=1))
    with pytest.raises(GeometryError) as info:
        load_geometry(path)
    err = info.value
    assert err.field == "pages"
    assert err.value == "<integer of 5000 digits>"
    assert f"more than {LIMIT:,} digits" in str(err)
    assert "no count or size in a geometry is that large" in str(err)
    assert "set_int_max_str_digits" not in str(err)
    assert str(path) in str(err)


@pytest.mark.skipif(LIMIT == 0, reason="no int-to-str digit limit in this interpreter")
def test_a_huge_integer_deep_in_a_geometry_names_the_path(tmp_path: Path) -> None:
    doc = geometry_dict()
    text = json.dumps(doc).replace('"bytes_per_page": 5', '"bytes_per_page": -' + "1" * 4400)
    path = tmp_path / "g.json"
    path.write_text(text)
    with pytest.raises(GeometryError) as info:
        load_geometry(path)
    assert info.value.field == "planes[1].bytes_per_page"
    assert "<integer of 4400 digits>" in str(info.value)


@pytest.mark.skipif(LIMIT == 0, reason="no int-to-str digit limit in this interpreter")
def test_strict_json_names_a_huge_integer_and_reads_one_at_the_limit() -> None:
    from kvgrant.strict_json import HugeIntegerError

    with pytest.raises(HugeIntegerError) as info:
        strict_json_loads('{"a": [1, {"b": ' + "7" * (LIMIT + 1) + "}]}")
    assert info.value.field == "a[1].b" and info.value.digits == LIMIT + 1
    assert isinstance(info.value, ValueError)  # callers catching ValueError still do
    assert strict_json_loads('{"a": ' + "7" * LIMIT + "}")["a"] == int("7" * LIMIT)
    with pytest.raises(json.JSONDecodeError):  # other errors are as before
        strict_json_loads('{"a": 1')


@pytest.mark.skipif(LIMIT == 0, reason="no int-to-str digit limit in this interpreter")
def test_a_huge_integer_in_a_geometry_file_is_exit_2_on_the_cli(tmp_path: Path,
                                                                capsys: Any) -> None:
    path = tmp_path / "g.json"
    path.write_text(re.sub(r'"pages": \d+', '"pages": ' + "9" * 5000, SMALL.read_text(),
                           count=1))
    assert main(["plan", str(path)]) == 2
    err = capsys.readouterr().err
    assert "pages = <integer of 5000 digits>" in err and "Traceback" not in err


@pytest.mark.skipif(LIMIT == 0, reason="no int-to-str digit limit in this interpreter")
def test_a_huge_integer_in_a_plan_file_names_its_field(tmp_path: Path) -> None:
    g = parse_geometry(geometry_dict())
    doc = plan_document(packed_plan(g))
    text = json.dumps(doc).replace('"plane_offset": 0', '"plane_offset": ' + "9" * 5000, 1)
    path = tmp_path / "plan.json"
    path.write_text(text)
    with pytest.raises(PlanFileError) as info:
        read_plan_file(path, g)
    assert info.value.field.endswith(".plane_offset")
    assert "<integer of 5000 digits>" in str(info.value)
    assert "set_int_max_str_digits" not in str(info.value)


# ----------------------------------------------------------------- topology lists
def test_a_reader_declared_twice_for_one_owner_is_refused() -> None:
    # was: silently deduplicated (while a rank twice in an import group is refused)
    doc = geometry_dict(topology={"ranks": 2, "import_groups": [[0, 1]],
                                  "declared_readers": {"0": [0, 1], "1": [0, 0, 1]}})
    err = _rejected(doc)
    assert err.field == "topology.declared_readers.1" and err.value == 0
    assert "reader 0 is listed twice for owner 1" in str(err)


def test_an_empty_import_group_is_refused() -> None:
    # was: accepted
    err = _rejected(geometry_dict(topology={"ranks": 2, "import_groups": [[0, 1], []]}))
    assert err.field == "topology.import_groups[1]" and err.value == []
    assert "empty group" in str(err)
    err = _rejected(geometry_dict(topology={"ranks": 2, "import_groups": [[]]}))
    assert err.field == "topology.import_groups[0]"


def test_one_rank_groups_and_distinct_readers_are_still_accepted() -> None:
    g = parse_geometry(geometry_dict(topology={
        "ranks": 3, "import_groups": [[0], [1, 2]],
        "declared_readers": {"0": [0, 1, 2], "1": [2, 1], "2": [1]}}))
    assert g.importers(0) == () and g.importers(1) == (2,)
    assert g.declared_readers(1) == (1, 2)
    assert parse_geometry(geometry_dict(topology={"ranks": 1, "import_groups": []}))


# ---------------------------------------------------------------------- plan files
def _write(tmp_path: Path, doc: Any) -> Path:
    path = tmp_path / "plan.json"
    path.write_text(json.dumps(doc))
    return path


def test_an_unknown_plan_file_key_is_refused_naming_the_known_ones(tmp_path: Path) -> None:
    # was: "lable": "naive" was ignored and the plan read as "packed"
    g = parse_geometry(geometry_dict())
    doc = plan_document(naive_plan(g))
    doc["lable"] = doc.pop("label")
    with pytest.raises(PlanFileError) as info:
        read_plan_file(_write(tmp_path, doc), g)
    err = info.value
    assert err.field == "lable" and "unknown key" in str(err)
    for known in ("version", "label", "geometry", "geometry_hash", "allocations"):
        assert known in str(err)


@pytest.mark.parametrize("key, value", [
    ("geometry", {"name": "small"}), ("geometry", 7), ("geometry", None),
    ("geometry_hash", 1), ("cache_key", []), ("cache_format", 1),
])
def test_plan_file_keys_of_the_wrong_type_are_refused(tmp_path: Path, key: str,
                                                      value: Any) -> None:
    g = parse_geometry(geometry_dict())
    doc = dict(plan_document(packed_plan(g)), **{key: value})
    with pytest.raises(PlanFileError) as info:
        read_plan_file(_write(tmp_path, doc), g)
    assert info.value.field == key and "must be a string" in str(info.value)


def test_plan_file_unknown_keys_are_exit_2_on_the_cli(tmp_path: Path, capsys: Any) -> None:
    g = load_geometry(SMALL)
    doc = plan_document(packed_plan(g))
    doc["allocation"] = doc["allocations"]
    assert main(["alloc", str(SMALL), "--backend", "sim", "--plan",
                 str(_write(tmp_path, doc))]) == 2
    err = capsys.readouterr().err
    assert "allocation: unknown key" in err and "Traceback" not in err


def test_plan_documents_reports_and_cache_files_still_load(tmp_path: Path) -> None:
    g = parse_geometry(geometry_dict())
    doc = plan_document(packed_plan(g))
    assert read_plan_file(_write(tmp_path, doc), g).label == "packed"
    assert read_plan_file(_write(tmp_path, {"packed_plan": doc, "geometry": {}}), g)
    cached = dict(doc, cache_key="k", cache_format="kvgrant-plan-cache/1")
    assert read_plan_file(_write(tmp_path, cached), g).allocations == \
        packed_plan(g).allocations
    bare = {k: v for k, v in doc.items() if k not in ("label", "geometry")}
    assert read_plan_file(_write(tmp_path, bare), g).label == "packed"


# -------------------------------------------------------------------- HandleBudget
@pytest.mark.parametrize("kwargs, field", [
    ({"handles": 2 ** 200}, "HandleBudget.handles"),
    ({"handles": 10 ** 15 + 1}, "HandleBudget.handles"),
    ({"reserve": 2 ** 64}, "HandleBudget.reserve"),
])
def test_handle_budget_caps_counts_as_the_cli_does(kwargs: dict[str, int],
                                                   field: str) -> None:
    from kvgrant.runtime import HandleBudget

    # was: HandleBudget(handles=2**200) accepted (the CLI caps counts at 10**15)
    with pytest.raises(ArgumentError) as info:
        HandleBudget(**kwargs)
    assert info.value.argument == field
    assert "must be at most 1,000,000,000,000,000" in str(info.value)
    assert field in str(info.value)


def test_handle_budget_at_the_cap_is_accepted() -> None:
    from kvgrant.runtime import HandleBudget

    assert HandleBudget(handles=10 ** 15, reserve=10 ** 15).limits() == (10 ** 15, 10 ** 15)


def test_the_handle_budget_shorthand_is_capped_too() -> None:
    from kvgrant.runtime import allocate

    with pytest.raises((ArgumentError, PlanError)) as info:
        allocate(parse_geometry(geometry_dict()), handle_budget=2 ** 200)
    assert "at most 1,000,000,000,000,000" in str(info.value)


def test_a_decimal_owner_key_past_every_rank_says_so() -> None:
    """Was "owner keys must be rank numbers written in decimal" for a decimal key."""
    doc = json.loads((Path(__file__).resolve().parents[2] / "examples" / "small.json")
                     .read_text())
    doc["topology"]["declared_readers"] = {"9999999": [0]}
    with pytest.raises(GeometryError, match=r'key = "9999999": not a rank'):
        parse_geometry(doc)
