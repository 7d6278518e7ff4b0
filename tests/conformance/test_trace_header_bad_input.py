"""Bad header input a review found crashing or accepted (2026-12): a plane or region name
that is a list or object (a TypeError traceback), rank keys that str.isdigit() takes but
are not ASCII decimal ("\u00b2" a ValueError traceback, "\u0660" read as rank 0) or that
spell one rank twice ("0" and "00"), an import_groups of 0 / "" / {} / false read as no
groups, and a declared reader listed twice for one owner. Each is a TraceError naming
the field, the value and the rule (exit 2 from ``kvgrant conform``), from the detailed
reader and from the fast paths alike (one-process ``_parse_fast``, group
``fast_accept``)."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any, Callable

import pytest

from kvgrant.cli import main
from kvgrant.conformance.group_fast import fast_accept_texts
from kvgrant.conformance.group_gen import simulate_group, write_group
from kvgrant.conformance.group_io import load_group, parse_proc_trace
from kvgrant.conformance.group_model import constants_from
from kvgrant.conformance.trace_io import load_trace, parse_trace, parse_trace_lines
from kvgrant.conformance.trace_plan import rank_key_error
from kvgrant.errors import TraceError

ROOT = Path(__file__).resolve().parents[2]
SMALL = ROOT / "examples" / "small.json"

# 3 processes, 0 and 1 import each other, 2 imports nothing; 2 allocations, 0 aliased
# into a shared region, 1 owner-only.
C3 = constants_from(3, 2, [0, 1], [1], {0: [1], 1: [0], 2: []},
                    {r: [0, 1, 2] for r in range(3)})

Edit = Callable[[dict[str, Any]], None]


def _set(*path: Any, value: Any) -> Edit:
    def edit(h: dict[str, Any]) -> None:
        obj = h
        for k in path[:-1]:
            obj = obj[k]
        obj[path[-1]] = value
    return edit


def _dec(**readers: list[int]) -> Edit:
    """declared_readers with the given entries added (the others kept)."""
    def edit(h: dict[str, Any]) -> None:
        h["topology"]["declared_readers"].update(readers)
    return edit


def _dec_keys(table: dict[str, list[int]]) -> Edit:
    return _set("topology", "declared_readers", value=table)


# (id, edit, substrings the message must hold). Ranks 0..2 in every trace here.
CASES: list[tuple[str, Edit, tuple[str, ...]]] = [
    ("plane-list", _set("allocations", 0, 0, value=["kv0"]),
     ("header.allocations[0].plane = ['kv0']", "must be a string naming a plane of "
      "header.planes")),
    ("plane-object", _set("allocations", 0, 0, value={"x": 1}),
     ("header.allocations[0].plane = {'x': 1}", "must be a string naming a plane")),
    ("region-object", _set("allocations", 0, 3, value={"x": 1}),
     ("header.allocations[0].region = {'x': 1}", "must be null or a string naming a "
      "region of header.regions")),
    ("region-list", _set("allocations", 0, 3, value=["snapshot"]),
     ("header.allocations[0].region = ['snapshot']", "naming a region")),
    ("plane-name-list", _set("planes", 0, 0, value=["kv0"]),
     ("header.planes[0] = [['kv0'],", "must be [name, offset, bytes]")),
    ("region-name-object", _set("regions", 0, 0, value={"x": 1}),
     ("header.regions[0] = [{'x': 1},", "must be [name, offset, bytes, access]")),
    ("region-access-list", _set("regions", 0, 3, value=["owner"]),
     ("header.regions[0].access = ['owner']", "must be 'importers' or 'owner'")),
    ("declared-superscript-two", _dec(**{"\u00b2": [2]}),
     ("header.topology.declared_readers key '\u00b2'", "ASCII decimal")),
    ("declared-arabic-zero", _dec_keys({"\u0660": [0, 1], "1": [0, 1], "2": [2]}),
     ("header.topology.declared_readers key '\u0660'", "ASCII decimal")),
    ("declared-leading-zero", _dec(**{"01": [0, 1]}),
     ("header.topology.declared_readers key '01'", "without leading zeros")),
    ("declared-out-of-range", _dec(**{"9999999": [0]}),
     ("header.topology.declared_readers key '9999999'", "out of range", "0..2")),
    ("declared-reader-twice", _dec(**{"1": [0, 1, 1]}),
     ("header.topology.declared_readers[1] = [0, 1, 1]", "reader 1", "owner 1",
      "twice")),
    ("reservations-leading-zero", lambda h: h["reservations"].update(
        {"00": h["reservations"]["0"]}),
     ("header.reservations key '00'", "without leading zeros")),
    ("reservations-superscript", lambda h: h["reservations"].update(
        {"\u00b2": h["reservations"]["0"]}),
     ("header.reservations key '\u00b2'", "ASCII decimal")),
    ("reservations-out-of-range", lambda h: h["reservations"].update(
        {"12": h["reservations"]["0"]}),
     ("header.reservations key '12'", "out of range")),
]
for _v in (0, "", {}, False, None, "[[0, 1]]"):
    CASES.append((f"import-groups-{json.dumps(_v)}", _set("topology", "import_groups",
                                                          value=_v),
                  (f"header.topology.import_groups = {_v!r}", "must be a list of lists")))
CASES.append(("import-groups-missing", lambda h: h["topology"].pop("import_groups"),
              ("header.topology.import_groups = None", "must be a list")))

# The run's account in the header (review 2026-12-02: "take any JSON type"): ``plan``
# is the plan's label (a non-empty str: check_plan_object), ``backend`` the driver's
# name (sim or cuda), ``geometry`` the geometry's name (Geometry's Name rule).
RUN_FIELD_CASES: list[tuple[str, Edit, tuple[str, ...]]] = []
for _v in (5, None, "", True, ["packed"], {"label": "packed"}, 1.5):
    RUN_FIELD_CASES.append((f"plan-{json.dumps(_v)}", _set("plan", value=_v),
                            (f"header.plan = {_v!r}", "must be the plan's label, a "
                             "non-empty string")))
for _v in ("gpu", "SIM", "sim ", "", "?", None, 0, ["sim"], {"name": "sim"}, False):
    RUN_FIELD_CASES.append((f"backend-{json.dumps(_v)}", _set("backend", value=_v),
                            (f"header.backend = {_v!r}", "must be 'sim' or 'cuda'")))
for _v in (None, 3, "", " small", "small\n", "sm\u202eall", "x" * 257, ["small"],
           {"name": "small"}, True):
    RUN_FIELD_CASES.append((f"geometry-{json.dumps(_v)[:20]}", _set("geometry", value=_v),
                            (f"header.geometry = {_v!r}"[:50], "must be the geometry's "
                             "name (a string of 1..256 printable characters")))
CASES += RUN_FIELD_CASES

# header.devices: a one-process trace reads it in trace_io, a group file in group_io.
DEVICE_CASES: list[tuple[str, Edit, tuple[str, ...]]] = [
    ("devices-superscript-two", lambda h: h["devices"].update({"\u00b2": 7}),
     ("header.devices key '\u00b2'", "ASCII decimal")),
    ("devices-arabic-zero", lambda h: h.update(
        devices={"\u0660" if k == "0" else k: v for k, v in h["devices"].items()}),
     ("header.devices key '\u0660'", "ASCII decimal")),
    ("devices-leading-zero", lambda h: h["devices"].update({"00": 5}),
     ("header.devices key '00'", "without leading zeros")),
    ("devices-out-of-range", lambda h: h["devices"].update({"9999999": 5}),
     ("header.devices key '9999999'", "out of range", "0..2")),
    ("devices-huge-key", lambda h: h["devices"].update({"9" * 5000: 5}),
     ("header.devices key '999", "(5000 chars)", "out of range")),
]


@pytest.fixture(scope="module")
def one_proc(tmp_path_factory: pytest.TempPathFactory) -> list[str]:
    path = tmp_path_factory.mktemp("one") / "t.ndjson"
    assert main(["alloc", str(SMALL), "--backend", "sim", "--trace", str(path)]) == 0
    lines = path.read_text().splitlines()
    assert json.loads(lines[0])["ranks"] == 3
    return lines


def _with_header(lines: list[str], edit: Edit) -> list[str]:
    h = copy.deepcopy(json.loads(lines[0]))
    edit(h)
    return [json.dumps(h)] + lines[1:]


def _expect(err: pytest.ExceptionInfo[TraceError], want: tuple[str, ...]) -> None:
    msg = str(err.value)
    for s in want:
        assert s in msg, msg


def _conform_rc(capsys: pytest.CaptureFixture[str], path: Path) -> tuple[int, str]:
    capsys.readouterr()
    rc = main(["conform", str(path)])
    got = capsys.readouterr()
    return rc, got.out + got.err


def test_the_unedited_traces_are_accepted(one_proc: list[str], tmp_path: Path) -> None:
    """The controls: the recordings the cases edit read cleanly."""
    assert parse_trace_lines(one_proc).header.ranks == 3
    write_group(simulate_group(C3), tmp_path / "g")
    assert load_group([tmp_path / "g"]).constants.ranks == 3


@pytest.mark.parametrize("case", CASES + DEVICE_CASES, ids=lambda c: c[0])
def test_a_bad_one_process_header_is_a_trace_error(
        case: tuple[str, Edit, tuple[str, ...]], one_proc: list[str], tmp_path: Path,
        capsys: pytest.CaptureFixture[str]) -> None:
    _, edit, want = case
    lines = _with_header(one_proc, edit)
    with pytest.raises(TraceError) as err:   # the detailed reader
        parse_trace_lines(lines)
    _expect(err, want)
    with pytest.raises(TraceError) as err:   # the fast path first (it reads the header)
        parse_trace("\n".join(lines) + "\n")
    _expect(err, want)
    path = tmp_path / "t.ndjson"
    path.write_text("\n".join(lines) + "\n")
    with pytest.raises(TraceError):
        load_trace(path)
    rc, text = _conform_rc(capsys, path)
    assert rc == 2, text
    assert "Traceback" not in text and want[0] in text, text


def _group_texts(edit: Edit) -> list[str]:
    """Every file of a clean C3 run with the same header edit (so the files still agree
    with each other and only the edit can be refused)."""
    out = []
    for text in simulate_group(C3):
        lines = text.splitlines()
        out.append("\n".join(_with_header(lines, edit)) + "\n")
    return out


@pytest.mark.parametrize("case", CASES + DEVICE_CASES, ids=lambda c: c[0])
def test_a_bad_group_header_is_a_trace_error(
        case: tuple[str, Edit, tuple[str, ...]], tmp_path: Path,
        capsys: pytest.CaptureFixture[str]) -> None:
    _, edit, want = case
    texts = _group_texts(edit)
    with pytest.raises(TraceError) as err:
        parse_proc_trace(texts[0], "g/rank0")
    _expect(err, want)
    assert fast_accept_texts((f"rank{p}", t) for p, t in enumerate(texts)) is None
    d = tmp_path / "g"
    write_group(texts, d)
    with pytest.raises(TraceError) as err:
        load_group([d])
    _expect(err, want)
    rc, text = _conform_rc(capsys, d)
    assert rc == 2, text
    assert "Traceback" not in text and want[0] in text, text


def test_the_declared_readers_are_still_read_in_order(one_proc: list[str]) -> None:
    """Readers listed out of order are one set, as before (only duplicates are refused)."""
    lines = _with_header(one_proc, _dec(**{"0": [2, 1, 0]}))
    lay = parse_trace_lines(lines).header.layout
    assert lay is not None and lay.declared_readers is not None
    assert lay.declared_readers[0] == (0, 1, 2)


@pytest.mark.parametrize("key, ranks, ok", [
    ("0", 1, True), ("9", 10, True), ("10", 11, True), ("1023", 1024, True),
    ("10", 10, False), ("1", 1, False), ("00", 3, False), ("01", 3, False),
    ("-1", 3, False), ("+1", 3, False), (" 1", 3, False), ("1 ", 3, False), ("", 3, False),
    ("1.0", 3, False), ("\u00b2", 3, False), ("\u0660", 3, False), ("\uff11", 3, False),
    ("1\n", 3, False), (1, 3, False), (None, 3, False), ("9" * 5000, 3, False)])
def test_rank_key_error(key: Any, ranks: int, ok: bool) -> None:
    why = rank_key_error(key, ranks, "header.devices")
    assert (why is None) == ok
    if why is not None:
        assert why.startswith("header.devices key ") and len(why) < 200, why


@pytest.mark.parametrize("field, value", [
    ("plan", "packed"), ("plan", "naive"), ("plan", "reference"), ("plan", "chunks"),
    ("plan", "my plan (v2)"), ("backend", "sim"), ("backend", "cuda"),
    ("geometry", "small"), ("geometry", "published dcp8 \u00fc"), ("geometry", "x" * 256)])
def test_what_a_writer_writes_in_the_run_fields_is_read(field: str, value: str,
                                                        one_proc: list[str]) -> None:
    """The controls of RUN_FIELD_CASES: every value the writers can write (a plan label
    of a planner's own, a geometry name of 256 characters) reads, by both readers and
    in a group file; and a header without the fields (as tools build them) reads."""
    lines = _with_header(one_proc, _set(field, value=value))
    for trace in (parse_trace_lines(lines), parse_trace("\n".join(lines) + "\n")):
        assert trace.header.extra[field] == value
    assert parse_trace("\n".join(lines) + "\n").rows is not None   # the fast path took it
    texts = _group_texts(_set(field, value=value))
    assert parse_proc_trace(texts[0], "g/rank0").header.extra[field] == value
    assert fast_accept_texts((f"rank{p}", t) for p, t in enumerate(texts)) is not None
    bare = _with_header(one_proc, lambda h: [h.pop(k) for k in ("plan", "backend",
                                                                 "geometry")])
    assert parse_trace("\n".join(bare) + "\n").header.extra.get(field) is None


def test_the_recorded_run_fields_are_the_writers(one_proc: list[str]) -> None:
    """What the runtime wrote is what the rules describe (so the rules track it)."""
    h = json.loads(one_proc[0])
    assert (h["geometry"], h["plan"], h["backend"]) == ("small", "packed", "sim")


def test_the_geometry_name_rule_is_the_geometrys() -> None:
    """The reader's copy of the name rule (it does not import the layout package) keeps
    up with the geometry model's: every name the model takes reads, the others do not."""
    from kvgrant.conformance import trace_io
    from kvgrant.errors import GeometryError
    from kvgrant.layout.geometry import MAX_NAME_CHARS, parse_geometry

    assert trace_io._MAX_NAME_CHARS == MAX_NAME_CHARS
    doc = json.loads(SMALL.read_text())
    for name in ("small", "x" * 256, "x" * 257, "", " a", "a\t", "a\u200bb", "\u00fc-1",
                 "a b"):
        try:
            parse_geometry({**doc, "name": name})
            model_ok = True
        except GeometryError:
            model_ok = False
        assert trace_io._is_geometry_name(name) is model_ok, name
