"""Geometry model: loads the DESIGN.md format, rejects every broken rule by name."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import pytest
from layout_builders import geometry_dict, geometry_dicts, published_like_dict
from hypothesis import given, settings
from hypothesis import strategies as st

from kvgrant.errors import GeometryError
from kvgrant.layout import geometry as geometry_module
from kvgrant.layout.geometry import (
    MAX_BYTES,
    Geometry,
    load_geometry,
    parse_geometry,
    round_up,
    show_value,
)

DESIGN_EXAMPLE = {
    "name": "example",
    "granularity": 2097152,
    "pages": 2234,
    "page_tokens": 128,
    "planes": [{"name": "layer0.latent", "bytes_per_page": 1179648}],
    "regions": [{"name": "snapshot", "rows": 1, "row_bytes": 2097152, "access": "importers"}],
    "aliases": [{"region": "snapshot", "offset": 0, "plane": "layer0.latent",
                 "plane_offset": 0, "length": 2097152}],
    "topology": {"ranks": 16,
                 "import_groups": [[0, 1, 2, 3, 4, 5, 6, 7], [8, 9, 10, 11, 12, 13, 14, 15]],
                 "declared_readers": {"0": list(range(16))}},
}


def rejected(doc: Any) -> GeometryError:
    with pytest.raises(GeometryError) as info:
        parse_geometry(doc)
    return info.value


def test_all_is_sorted() -> None:
    assert geometry_module.__all__ == sorted(geometry_module.__all__)


def test_design_example_loads(tmp_path: Path) -> None:
    path = tmp_path / "g.json"
    path.write_text(json.dumps(DESIGN_EXAMPLE))
    g = load_geometry(path)
    assert g.plane_bytes("layer0.latent") == round_up(2234 * 1179648, 2097152)
    assert g.plane_bytes("layer0.latent") % g.granularity == 0
    assert g.region_bytes("snapshot") == 2097152
    assert g.importers(0) == (1, 2, 3, 4, 5, 6, 7)
    assert g.importers(9) == (8, 10, 11, 12, 13, 14, 15)
    assert g.declared_readers(0) == tuple(range(16))
    assert g.declared_readers(3) == tuple(range(8))  # not declared: importers + owner
    assert g.granted_devices(0) == tuple(range(8))
    assert g.granted_devices(0, declared=True) == tuple(range(16))


def test_owner_only_region_grants_the_owner() -> None:
    g = parse_geometry(geometry_dict())
    assert g.granted_devices(1, "exec") == (1,)
    assert g.granted_devices(1, "exec", declared=True) == (1,)
    assert g.granted_devices(1, "snap") == (0, 1)


def test_defaults_no_imports_and_importers_as_readers() -> None:
    doc = geometry_dict(topology={"ranks": 3})
    g = parse_geometry(doc)
    assert g.importers(2) == () and g.declared_readers(2) == (2,)
    assert g.regions[0].access == "importers"


def test_region_tail_past_rows_may_stay_unbacked() -> None:
    # snap: 21 bytes of rows, 24 reserved; aliases cover [0, 24). Shrink the last
    # chunk: [16, 20) leaves [20, 21) uncovered -> rejected, naming the range.
    doc = geometry_dict()
    doc["aliases"][2]["length"] = 4
    err = rejected(doc)
    assert err.field == "regions[0]" and err.value == [20, 21]
    assert "[20, 21)" in str(err) and "cover every byte" in str(err)


@pytest.mark.parametrize("mutate, field, value, rule", [
    (lambda d: d["aliases"][0].update(length=6), "aliases[0].length", 6, "multiple of the granularity"),
    (lambda d: d["aliases"][1].update(offset=9), "aliases[1].offset", 9, "multiple of the granularity"),
    (lambda d: d["aliases"][1].update(plane_offset=2), "aliases[1].plane_offset", 2, "multiple"),
    (lambda d: d["aliases"][1].update(offset=4), "aliases[1].offset", 4, "must not overlap in a region"),
    (lambda d: d["aliases"][2].update(plane_offset=4), "aliases[2].plane_offset", 4,
     "must not overlap in a plane"),
    (lambda d: d["aliases"][2].update(plane_offset=56), "aliases[2].plane_offset", 56,
     "must stay inside plane 'a' of 60 bytes"),
    (lambda d: d["aliases"][1].update(offset=24), "aliases[1].offset", 24,
     "must stay inside region 'snap' of 24 bytes"),
    (lambda d: d["aliases"][0].update(region="nope"), "aliases[0].region", "nope", "declared region"),
    (lambda d: d["aliases"][0].update(plane="nope"), "aliases[0].plane", "nope", "declared plane"),
    (lambda d: d["planes"][1].update(name="a"), "planes[1].name", "a", "unique"),
    (lambda d: d["regions"][1].update(name="a"), "regions[1].name", "a", "unique"),
    (lambda d: d["aliases"].pop(1), "regions[0]", [8, 16], "cover every byte"),
    (lambda d: d["topology"].update(import_groups=[[0, 2]]), "topology.import_groups[0]", 2,
     "ranks must be in 0..1"),
    (lambda d: d["topology"].update(import_groups=[[0], [0, 1]]), "topology.import_groups[1]", 0,
     "one import group"),
    (lambda d: d["topology"].update(declared_readers={"0": [0]}), "topology.declared_readers.0",
     [0], "every importer must be a declared reader"),
    (lambda d: d["topology"].update(declared_readers={"5": [0, 1]}), "topology.declared_readers",
     5, "owner ranks must be in 0..1"),
    (lambda d: d["topology"].update(declared_readers={"0": [0, 1, 7]}),
     "topology.declared_readers.0", 7, "reader ranks must be in 0..1"),
    (lambda d: d["topology"].update(declared_readers={"zero": [0, 1]}), "topology.declared_readers",
     "zero", "decimal"),
    (lambda d: d["topology"].update(declared_readers={"0": [0, 1], "00": [0, 1]}),
     "topology.declared_readers", "00", "listed twice"),
    (lambda d: d.update(pages=1 << 62), "planes[0].bytes_per_page", 6,
     "at most 4,194,304 granules"),
    (lambda d: d.update(pages=10 ** 8), "planes[0].bytes_per_page", 6,
     "at most 4,194,304 granules"),
])
def test_each_rule_names_field_value_and_rule(mutate: Any, field: str, value: Any,
                                              rule: str) -> None:
    doc = geometry_dict()
    mutate(doc)
    err = rejected(doc)
    assert err.field == field
    assert err.value == value
    assert rule in str(err) and field in str(err)


@pytest.mark.parametrize("path, bad, field", [
    (("granularity",), True, "granularity"),
    (("granularity",), 4.0, "granularity"),
    (("granularity",), "4", "granularity"),
    (("granularity",), 0, "granularity"),
    (("pages",), -3, "pages"),
    (("pages",), 10 ** 5000, "pages"),
    (("planes",), [], "planes"),
    (("planes", 0, "bytes_per_page"), None, "planes[0].bytes_per_page"),
    (("regions", 0, "rows"), 0, "regions[0].rows"),
    (("regions", 0, "access"), "everyone", "regions[0].access"),
    (("aliases", 0, "offset"), -4, "aliases[0].offset"),
    (("topology", "ranks"), 0, "topology.ranks"),
    (("topology", "ranks"), True, "topology.ranks"),
    (("topology", "import_groups"), [["0", "1"]], "topology.import_groups[0][0]"),
    (("name",), "", "name"),
    (("extra",), 1, "extra"),
], ids=lambda v: v if isinstance(v, str) else type(v).__name__)
def test_field_types_are_strict(path: tuple[Any, ...], bad: Any, field: str) -> None:
    doc = geometry_dict()
    target = doc
    for key in path[:-1]:
        target = target[key]
    target[path[-1]] = bad
    err = rejected(doc)
    assert err.field == field
    assert field in str(err)


def test_missing_field_and_non_object() -> None:
    doc = geometry_dict()
    del doc["pages"]
    assert rejected(doc).field == "pages"
    assert rejected([1, 2]).field == "<root>"
    assert rejected(None).field == "<root>"


def test_huge_integers_are_described_not_printed() -> None:
    err = rejected(geometry_dict(granularity=10 ** 5000))
    assert "integer of" in str(err) and str(MAX_BYTES) in str(err)
    assert show_value(-(10 ** 5000)).startswith("<negative integer of")
    assert show_value("x" * 500).endswith('..."') and len(show_value("x" * 500)) <= 80
    # a short container is shown as it is, a long one by its size, at the same cost
    assert show_value([1]) == "[1]"
    assert show_value({"plane": "kv0", "length": 10 ** 5000}) == \
        '{"plane": "kv0", "length": <integer of 16610 bits>}'
    assert show_value([[1, [2]], {"a": None}, (True, 1.5)]) == \
        '[[1, [2]], {"a": null}, [true, 1.5]]'
    assert show_value(list(range(10 ** 6))) == "<list of 1,000,000 entries>"
    assert show_value(["x" * 200]) == "<list of 1 entry>"
    assert show_value({"k" * 200: 1}) == "<object of 1 entry>"
    assert len(show_value([str(i) for i in range(40)])) <= 120


@pytest.mark.parametrize("content, words", [
    (b"\xff\xfe{}", "not UTF-8"),
    (b"{", "not valid JSON at line 1"),
    (b"[" * 100_000, "nested too deeply"),
    (b'{"pages": 1' + b"1" * 5000 + b"}", "unreadable JSON value"),
    (b"[]", "must be a JSON object"),
])
def test_bad_files(tmp_path: Path, content: bytes, words: str) -> None:
    path = tmp_path / "g.json"
    path.write_bytes(content)
    with pytest.raises(GeometryError) as info:
        load_geometry(path)
    assert words in str(info.value)


def test_missing_file_and_directory(tmp_path: Path) -> None:
    for path in (tmp_path / "absent.json", tmp_path):
        with pytest.raises(GeometryError) as info:
            load_geometry(path)
        # the message shortens a long path; its start names it
        assert info.value.field == "<file>" and str(path)[:50] in str(info.value)


def test_published_like_geometry_is_valid() -> None:
    g = parse_geometry(published_like_dict())
    assert len(g.aliases) == 1921 and g.topology.ranks == 16
    assert g.granted_devices(0, declared=True) == tuple(range(16))
    assert g.granted_devices(0) == tuple(range(8))


@settings(max_examples=300, deadline=None)
@given(geometry_dicts())
def test_random_valid_geometries_round_trip(doc: dict[str, Any]) -> None:
    g = parse_geometry(doc)
    again = parse_geometry(json.loads(json.dumps(g.model_dump(mode="json"))))
    assert again == g
    for p in g.planes:
        assert g.plane_bytes(p.name) % g.granularity == 0
        assert g.plane_bytes(p.name) >= g.pages * p.bytes_per_page


json_values = st.recursive(
    st.none() | st.booleans() | st.integers(-(2 ** 70), 2 ** 70) | st.floats()
    | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner,
                                                                max_size=4),
    max_leaves=20)


def _paths(obj: Any, prefix: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    out = [prefix] if prefix else []
    if isinstance(obj, dict):
        for k, v in obj.items():
            out += _paths(v, prefix + (k,))
    elif isinstance(obj, list):
        for i, v in enumerate(obj):
            out += _paths(v, prefix + (i,))
    return out


def _outcome(doc: Any) -> None:
    """Either a Geometry or a GeometryError whose message names a field; nothing else."""
    try:
        g = parse_geometry(doc)
    except GeometryError as err:
        assert err.field, "a geometry error must name its field"
        assert str(err)
        return
    assert isinstance(g, Geometry)


@settings(max_examples=200, deadline=None)
@given(json_values)
def test_arbitrary_json_never_tracebacks(doc: Any) -> None:
    _outcome(doc)


@settings(max_examples=300, deadline=None)
@given(geometry_dicts(), st.data())
def test_mutated_geometries_never_traceback(doc: dict[str, Any], data: st.DataObject) -> None:
    doc = copy.deepcopy(doc)
    for _ in range(data.draw(st.integers(1, 3))):
        paths = _paths(doc)
        path = data.draw(st.sampled_from(paths))
        parent = doc
        for key in path[:-1]:
            parent = parent[key]
        action = data.draw(st.sampled_from(["replace", "delete", "nudge"]))
        if action == "delete":
            del parent[path[-1]]
        elif action == "nudge" and isinstance(parent[path[-1]], int):
            parent[path[-1]] += data.draw(st.sampled_from([-1, 1, -4, 4, 2 ** 64]))
        else:
            parent[path[-1]] = data.draw(json_values)
    _outcome(doc)


def test_a_planned_geometry_pickles_without_its_cached_values() -> None:
    """Worker processes get the geometry by pickle; its conflict ranges (a read-only
    mappingproxy) and other cached values stay behind and are recomputed."""
    import pickle

    from kvgrant.layout.conflicts import declared_conflict_ranges
    from kvgrant.layout.geometry import load_geometry
    from kvgrant.layout.granules import labels

    g = load_geometry(Path(__file__).resolve().parents[2] / "examples" / "small.json")
    want = dict(declared_conflict_ranges(g))
    labels(g)
    back = pickle.loads(pickle.dumps(g))
    assert back == g and "_declared_ranges" not in back.__dict__
    assert dict(declared_conflict_ranges(back)) == want


@pytest.mark.parametrize("text, kind", [("null", "null"), ("[1, 2]", "an array"),
                                        ('"x"', "a string"), ("5", "a number"),
                                        ("true", "a boolean")])
def test_a_file_that_is_not_an_object_is_named_with_its_json_type(
        tmp_path: Path, text: str, kind: str) -> None:
    # was: "geometry must be a JSON object, got NoneType", and no file named
    path = tmp_path / "g.json"
    path.write_text(text)
    with pytest.raises(GeometryError) as err:
        load_geometry(path)
    assert str(err.value).startswith(f'"{path}": a geometry must be a JSON object')
    assert str(err.value).endswith(f"got {kind}")
    assert (err.value.field, err.value.value) == ("<root>", kind)


def test_the_kv_tokens_fit_a_signed_64_bit_integer() -> None:
    # was accepted: page_tokens = 2**63 - 1 gave 36,893,488,147,419,103,228 KV tokens
    pages = geometry_dict()["pages"]
    limit = (1 << 63) - 1
    assert parse_geometry(geometry_dict(page_tokens=limit // pages)).page_tokens == \
        limit // pages
    err = rejected(geometry_dict(page_tokens=limit // pages + 1))
    assert err.field == "page_tokens" and "must be at most 9,223,372,036,854,775,807" in str(err)
