"""Hypothesis fuzz of the ``kvgrant`` CLI with inputs that are invalid by construction
(issue #16 acceptance): geometries, traces and flags. Every case must end with a short
error and a non-zero exit -- never a traceback, a hang, exit 0, or memory beyond the
cap. Most cases run ``kvgrant.cli.main`` in this process (``_fuzz_support.run_cli``);
``test_subprocess_cases`` runs a sample as real processes and checks none is left
behind. ``make fuzz`` scales the example counts (KVGRANT_FUZZ_SCALE)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Iterator

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from kvgrant.traceformat import LIFECYCLE_VERSION

from _fuzz_support import (SMALL, assert_clean, count_case, examples, flush_report, run_cli,
                           run_cli_process)

@pytest.fixture(scope="module", autouse=True)
def _report() -> Iterator[None]:
    yield
    flush_report()


_SETTINGS = dict(deadline=None, database=None,
                 suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large,
                                        HealthCheck.function_scoped_fixture])

# ------------------------------------------------------------------- bad geometries

_DOC: dict[str, Any] = json.loads(SMALL.read_text())
#: numeric fields and whether 0 is allowed there
_NUMBERS = ([(("granularity",), False), (("pages",), False), (("page_tokens",), False),
             (("topology", "ranks"), False)]
            + [(("planes", i, "bytes_per_page"), False) for i in range(len(_DOC["planes"]))]
            + [(("regions", i, f), False) for i in range(len(_DOC["regions"]))
               for f in ("rows", "row_bytes")]
            + [(("aliases", i, f), f != "length") for i in range(len(_DOC["aliases"]))
               for f in ("offset", "plane_offset", "length")])
_NAMES = [("name",)] + [("planes", i, "name") for i in range(len(_DOC["planes"]))] + \
    [("regions", i, "name") for i in range(len(_DOC["regions"]))]
_OBJECTS = [()] + [("planes", i) for i in range(len(_DOC["planes"]))] + \
    [("regions", i) for i in range(len(_DOC["regions"]))] + \
    [("aliases", i) for i in range(len(_DOC["aliases"]))] + [("topology",)]
_REQUIRED = {(): ["name", "granularity", "pages", "page_tokens", "planes", "topology"],
             ("planes",): ["name", "bytes_per_page"],
             ("regions",): ["name", "rows", "row_bytes"],
             ("aliases",): ["region", "offset", "plane", "plane_offset", "length"],
             ("topology",): ["ranks"]}

_not_int = st.one_of(st.floats(allow_nan=True), st.booleans(), st.none(),
                     st.text(max_size=8), st.lists(st.integers(), max_size=3),
                     st.dictionaries(st.text(max_size=3), st.integers(), max_size=2))
_garbling = st.characters(categories=["Cc", "Cf", "Zl", "Zp"])


def _get(doc: Any, path: tuple[Any, ...]) -> Any:
    for key in path:
        doc = doc[key]
    return doc


@st.composite
def bad_geometry_text(draw: st.DrawFn) -> bytes:
    """A geometry file that breaks at least one rule, as bytes."""
    doc = json.loads(json.dumps(_DOC))
    kind = draw(st.sampled_from(["number", "name", "extra", "missing", "truncate",
                                 "bytes", "deep", "not_object"]))
    if kind == "number":
        path, zero_ok = draw(st.sampled_from(_NUMBERS))
        bad = draw(st.one_of(_not_int,
                             st.integers(max_value=-1 if zero_ok else 0),
                             st.integers(min_value=1 << 63, max_value=1 << 200)))
        _get(doc, path[:-1])[path[-1]] = bad
    elif kind == "name":
        path = draw(st.sampled_from(_NAMES))
        text = draw(st.text(max_size=6))
        pos = draw(st.integers(0, len(text)))
        bad = text[:pos] + draw(_garbling) + text[pos:]
        _get(doc, path[:-1])[path[-1]] = draw(st.sampled_from([bad, "", " " + text + "x"]))
    elif kind == "extra":
        obj = _get(doc, draw(st.sampled_from(_OBJECTS)))
        key = draw(st.text(min_size=1, max_size=8).filter(lambda k: k not in obj))
        obj[key] = draw(st.one_of(st.integers(), st.text(max_size=5), st.none()))
    elif kind == "missing":
        where = draw(st.sampled_from(sorted(_REQUIRED)))
        obj = doc if not where else (doc[where[0]] if where == ("topology",)
                                     else draw(st.sampled_from(doc[where[0]])))
        del obj[draw(st.sampled_from(_REQUIRED[where]))]
    elif kind == "not_object":
        doc = draw(st.one_of(_not_int, st.lists(st.integers(), max_size=3)))
    text = json.dumps(doc, allow_nan=True).encode()
    if kind == "deep":  # built as text: json.dumps itself stops near 1,000 levels
        depth = draw(st.integers(33, 3000))
        text = text[:-1] + b', "x": ' + b"[" * depth + b"0" + b"]" * depth + b"}"
    elif kind == "truncate":
        text = text[:draw(st.integers(0, text.rindex(b"}") - 1))]
    elif kind == "bytes":
        pos = draw(st.integers(0, len(text)))
        text = text[:pos] + draw(st.sampled_from([b"\xff", b"\xc3", b"\xed\xa0\x80",
                                                  b"\x00"])) + text[pos:]
    return text


@settings(max_examples=examples(150), **_SETTINGS)
@given(text=bad_geometry_text(), command=st.sampled_from(["alloc", "alloc", "plan"]))
def test_bad_geometries(tmp_path: Path, text: bytes, command: str) -> None:
    count_case("bad_geometries")
    path = tmp_path / "g.json"
    path.write_bytes(text)
    argv = [command, str(path)] + (["--backend", "sim"] if command == "alloc" else [])
    res = run_cli(argv)
    assert_clean(res, invalid=True, argv=argv)
    assert res.rc == 2, (argv, res.err[-500:])


# ------------------------------------------------------------------------ bad traces

def _small_trace_lines() -> list[str]:
    import io

    from kvgrant.runtime import allocate

    buf = io.StringIO()
    allocate(str(SMALL), backend="sim", trace=buf).release()
    return buf.getvalue().splitlines()


_TRACE = _small_trace_lines()
_BAD_FIELD = {
    "seq": st.one_of(st.integers().filter(lambda x: x > 10**6 or x < 0), _not_int),
    "action": st.text(max_size=10).filter(lambda a: a not in (
        "Reserve", "Create", "Map", "MapAlias", "Grant", "RankReady", "Unmap", "Release",
        "Free", "Publish", "Abort", "Unpublish", "AbortComplete", "ShutdownComplete")),
    "kind": st.text(max_size=6).filter(lambda k: k != "event"),
    "state": st.one_of(st.none(), st.integers(), st.text(max_size=4)),
}
_BAD_HEADER = {
    "ranks": st.one_of(st.integers(max_value=0), st.integers(min_value=4097), _not_int),
    "allocs": st.one_of(st.integers(max_value=0), st.integers(min_value=(1 << 22) + 1),
                        _not_int),
    "version": st.one_of(st.integers().filter(lambda v: v != LIFECYCLE_VERSION), _not_int),
    "kind": st.text(max_size=6).filter(lambda k: k != "header"),
    # version 2 names its objects: a plan and reservations that are not well formed
    "allocations": st.one_of(st.integers(), st.text(max_size=4), st.lists(st.integers())),
    "reservations": st.one_of(st.integers(), st.text(max_size=4), st.lists(st.integers())),
    "topology": st.one_of(st.integers(), st.text(max_size=4), st.lists(st.integers())),
}


@st.composite
def bad_trace_bytes(draw: st.DrawFn) -> bytes:
    """A trace that is malformed or breaks the model, as bytes."""
    lines = list(_TRACE)
    n = len(lines)
    kind = draw(st.sampled_from(["delete", "swap", "field", "header", "blank", "bytes",
                                 "cut", "deep", "counter", "empty"]))
    if kind == "delete":
        del lines[draw(st.integers(1, n - 1))]
    elif kind == "swap":
        i, j = draw(st.lists(st.integers(1, n - 1), min_size=2, max_size=2, unique=True))
        lines[i], lines[j] = lines[j], lines[i]
    elif kind == "field":
        i = draw(st.integers(1, n - 1))
        ev = json.loads(lines[i])
        key = draw(st.sampled_from(sorted(_BAD_FIELD)))
        ev[key] = draw(_BAD_FIELD[key])
        lines[i] = json.dumps(ev)
    elif kind == "header":
        head = json.loads(lines[0])
        key = draw(st.sampled_from(sorted(_BAD_HEADER)))
        head[key] = draw(_BAD_HEADER[key])
        lines[0] = json.dumps(head)
    elif kind == "blank":
        lines.insert(draw(st.integers(1, n)), draw(st.sampled_from(["", " ", "\t"])))
    elif kind == "cut":
        i = draw(st.integers(0, n - 1))
        lines[i] = lines[i][:draw(st.integers(1, len(lines[i]) - 2))]
    elif kind == "deep":
        i = draw(st.integers(1, n - 1))
        depth = draw(st.integers(33, 3000))
        lines[i] = lines[i][:-1] + ', "x": ' + "[" * depth + "0" + "]" * depth + "}"
    elif kind == "counter":
        i = draw(st.integers(1, n - 1))
        ev = json.loads(lines[i])
        if ev["rank"] is None:
            ev["state"]["phase"] = draw(st.sampled_from(
                [p for p in ("Allocating", "Published", "Aborting", "Aborted", "ShuttingDown",
                             "Shutdown") if p != ev["state"]["phase"]]))
        else:
            key = draw(st.sampled_from(["created", "mapped", "alias_mapped", "grants"]))
            ev["state"][key] += draw(st.integers(1, 1000))
        lines[i] = json.dumps(ev)
    elif kind == "empty":
        lines = []
    data = "\n".join(lines).encode() + (b"\n" if lines else b"")
    if kind == "bytes":
        pos = draw(st.integers(0, len(data) - 1))
        data = data[:pos] + draw(st.sampled_from([b"\xff", b"\xfe\xfe", b"\xc0"])) + data[pos:]
    return data


@settings(max_examples=examples(150), **_SETTINGS)
@given(data=bad_trace_bytes(), json_out=st.booleans())
def test_bad_traces(tmp_path: Path, data: bytes, json_out: bool) -> None:
    count_case("bad_traces")
    path = tmp_path / "t.ndjson"
    path.write_bytes(data)
    argv = ["conform", str(path)] + (["--json"] if json_out else [])
    res = run_cli(argv)
    assert_clean(res, invalid=True, argv=argv)
    if json_out:
        json.loads(res.out)  # still one JSON document


# ------------------------------------------------------------------------- bad flags

_digits = st.integers(0, 10**12).map(str)
_bad_flag = st.one_of(
    st.tuples(st.just("--devices"), st.one_of(
        st.just(""), st.just("0,,1"), st.just("0,1,1"), st.just("0, 1,-2"),
        st.integers(1024, 10**12).map(lambda d: f"0,1,{d}"),
        st.text(min_size=1, max_size=6).filter(lambda t: not t.replace(",", "").isascii()
                                                or not t.replace(",", "").isdigit()),
        st.just("0,1"), st.just("0,1,2,3"))),          # not one ordinal per rank
    st.tuples(st.just("--fail-at"), st.one_of(
        st.integers(1, 3000).map(str),                 # fires (rc 1) or never fires (rc 1)
        st.sampled_from(["0", "-1", "1,0", "1_0", "\uff11", "1e3", " ", "0x10"]))),
    st.tuples(st.just("--memory-limit"), st.one_of(
        st.integers(1, (1 << 20) - 1).map(lambda n: f"-{n}"),
        st.integers(1, (1 << 20) - 1).map(str),
        st.integers(1025, 10**15).map(lambda n: f"{n}T"),
        st.sampled_from(["", "G", "--1G", "1X", "\uff14\uff10G", "-1.5.5G", "nanG",
                         "1" * 40 + "G", "1K"]))),
    st.tuples(st.just("--ranks"), st.one_of(
        st.integers(max_value=0).map(str), st.integers(1025, 10**9).map(str),
        st.sampled_from(["x", "\uff12", "1.5", ""]))),
    st.tuples(st.just("--handle-budget"), st.one_of(
        st.integers(0, 30).map(str), st.sampled_from(["1,0", "-5", "x", "1_0"]))),
    st.tuples(st.just("--sim-handle-budget"), st.integers(0, 5).map(str)),
    st.tuples(st.just("--plan"), st.text(max_size=8).filter(
        lambda p: p not in ("naive", "reference", "packed"))),
    st.tuples(st.just("--backend"), st.text(max_size=8).filter(
        lambda b: b not in ("auto", "cuda", "sim"))),
)
_good_flag = st.sampled_from([[], ["--json"], ["--plan", "naive"], ["--plan", "reference"],
                              ["--memory-limit=-1G"]])


@settings(max_examples=examples(150), **_SETTINGS)
@given(bad=_bad_flag, good=_good_flag, eq=st.booleans())
def test_bad_alloc_flags(bad: tuple[str, str], good: list[str], eq: bool) -> None:
    count_case("bad_alloc_flags")
    flag, value = bad
    argv = ["alloc", str(SMALL), *good]
    if flag != "--backend":
        argv += ["--backend", "sim"]
    argv += [f"{flag}={value}"] if eq else [flag, value]
    res = run_cli(argv)
    assert_clean(res, invalid=True, argv=argv)


_token = st.one_of(st.sampled_from(["plan", "alloc", "conform", "verify", "--json",
                                    "--engine", "python", "--devices", "--fail-at", "-h",
                                    "--trace", str(SMALL), "/dev/null", "/nonexistent"]),
                   st.text(max_size=12))


@settings(max_examples=examples(150), **_SETTINGS)
@given(argv=st.lists(_token, max_size=6))
@example(argv=["conform", "\x00", "plan"])   # a group of traces, one path with a NUL byte
def test_random_argv_never_gives_a_traceback(argv: list[str]) -> None:
    """Arbitrary tokens (valid or not): never a traceback, a hang or a runaway; exit
    0 only for a real success (a help page or a valid command line)."""
    count_case("random_argv_never_gives_a_traceback")
    if "--trace" in argv or "verify" in argv:  # never write files or start TLC here
        argv = [a for a in argv if a not in ("--trace", "verify")]
    argv = [a for a in argv if not a.startswith("--backend")] + (
        ["--backend", "sim"] if argv[:1] == ["alloc"] else [])
    res = run_cli(argv)
    assert_clean(res, invalid=False, argv=argv)
    assert res.rc in (0, 1, 2), (argv, res.rc)


# ---------------------------------------------------- real processes (fewer cases)

@settings(max_examples=examples(12), **_SETTINGS)
@given(case=st.one_of(
    bad_geometry_text().map(lambda t: ("alloc", t)),
    bad_trace_bytes().map(lambda t: ("conform", t)),
    # a real process's argv cannot hold a NUL byte (the OS refuses it, not kvgrant)
    _bad_flag.filter(lambda f: "\x00" not in f[1]).map(lambda f: ("flag", f))))
def test_subprocess_cases(tmp_path: Path, case: tuple[str, Any]) -> None:
    count_case("subprocess_cases")
    kind, value = case
    if kind == "flag":
        argv = ["alloc", str(SMALL), f"{value[0]}={value[1]}"]
        if value[0] != "--backend":
            argv += ["--backend", "sim"]
    else:
        path = tmp_path / "input"
        path.write_bytes(value)
        argv = [kind, str(path)] + (["--backend", "sim"] if kind == "alloc" else [])
    res = run_cli_process(argv)
    assert_clean(res, invalid=True, argv=argv)


@pytest.mark.tlc
def test_subprocess_conform_with_tlc_on_a_bad_trace_leaves_nothing(tmp_path: Path) -> None:
    """A trace with a wrong state counter through --engine both in a real process: both
    engines reject it (exit 1), and no Java or temp folder is left (run_cli_process
    fails on leftover processes)."""
    lines = list(_TRACE)
    ev = json.loads(lines[5])
    ev["state"]["grants"] = ev["state"].get("grants", 0) + 7
    ev["state"].setdefault("va", True)
    lines[5] = json.dumps(ev)
    path = tmp_path / "t.ndjson"
    path.write_text("\n".join(lines) + "\n")
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    import os

    # no address-space cap here: it would bind Java too, whose JVM reserves far more
    # virtual memory than it uses (kvgrant's own bounds are fuzzed above)
    res = run_cli_process(["conform", str(path), "--engine", "both"], memory=-1,
                          env=dict(os.environ, TMPDIR=str(tmp)))
    assert_clean(res, invalid=True)
    assert res.rc == 1, res.out + res.err
    assert "DISAGREE" not in res.err and list(tmp.iterdir()) == []
