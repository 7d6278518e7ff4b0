"""Hypothesis fuzz of the public library API with bad arguments (issue #16 item 8):
every entry point answers a wrong type or value with a KVGrantError subclass naming
the argument -- never a plain TypeError/KeyError/IndexError from deep inside -- and
leaves no driver object behind. Runs in this process under ``_fuzz_support.limits``."""

from __future__ import annotations

import io
import json
from typing import Any, Iterator

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from _fuzz_support import SMALL, count_case, examples, flush_report, limits
from kvgrant.errors import ArgumentError, GeometryError, KVGrantError, PlanError, TraceError

@pytest.fixture(scope="module", autouse=True)
def _report() -> Iterator[None]:
    yield
    flush_report()


_SETTINGS = dict(deadline=None, database=None,
                 suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])

_junk = st.one_of(st.none(), st.booleans(), st.integers(), st.floats(), st.binary(max_size=6),
                  st.text(max_size=6), st.lists(st.integers(), max_size=3),
                  st.dictionaries(st.text(max_size=3), st.integers(), max_size=2),
                  st.builds(object), st.builds(io.BytesIO))
_not_bool = _junk.filter(lambda v: not isinstance(v, bool))

#: argument -> values that are never accepted
_BAD: dict[str, st.SearchStrategy[Any]] = {
    "geometry": st.one_of(_junk.filter(lambda v: not isinstance(v, str)), st.just(""),
                          st.text(max_size=5).map(lambda t: t + "\0"),
                          st.text(min_size=1, max_size=8).map(lambda t: f"/nonexistent/{t}")),
    "plan": st.one_of(_junk.filter(lambda v: v not in ("naive", "reference", "packed")
                                   if isinstance(v, str) else True),
                      _junk.map(lambda v: (lambda g: v))),
    "backend": _junk.filter(lambda v: v not in ("auto", "sim", "cuda")),
    "devices": st.one_of(
        st.text(max_size=4), st.binary(max_size=3), st.integers(), st.floats(),
        st.lists(st.one_of(st.floats(), st.booleans(), st.text(max_size=2)), min_size=1,
                 max_size=3).map(lambda xs: [0, 1] + xs[:1]),
        st.lists(st.integers(1024, 10**12), min_size=1, max_size=1).map(lambda x: [0, 1] + x),
        st.lists(st.integers(max_value=-1), min_size=1, max_size=1).map(lambda x: [0, 1] + x),
        st.lists(st.integers(0, 8), max_size=6).filter(
            lambda xs: len(xs) != 3 or len(set(xs)) != 3)),
    "memory_limit": st.one_of(
        st.floats(), st.booleans(), st.lists(st.integers(), max_size=2), st.builds(object),
        st.integers(min_value=1 << 51), st.integers(1, (1 << 20) - 1).map(lambda n: f"-{n}"),
        st.sampled_from(["", "G", "--1G", "lots", "\uff14\uff10G", "9999999999999T", "1K",
                         "0", "nan", "1e3G"])),
    "handle_budget": st.one_of(st.integers(max_value=-1), st.floats(), st.text(max_size=3),
                               st.booleans(), st.integers(0, 20)),
    "preflight": _not_bool,
    "check_contract": _not_bool,
    "trace": st.one_of(st.integers(), st.floats(), st.binary(max_size=4), st.just(""),
                       st.builds(io.BytesIO), st.builds(object), st.lists(st.integers()),
                       st.text(max_size=4).map(lambda t: t + "\0")),
    "driver_options": st.one_of(
        st.lists(st.integers(), max_size=2), st.text(max_size=3), st.integers(),
        st.dictionaries(st.text(max_size=6).filter(lambda k: k not in (
            "devices", "memory_per_device", "granularity", "handle_budget", "faults",
            "used_by_others", "host_pool")), st.integers(), min_size=1, max_size=2),
        st.fixed_dictionaries({"devices": st.one_of(st.integers(min_value=1025),
                                                    st.integers(max_value=0), _not_bool.filter(
                                                        lambda v: not isinstance(v, int)))}),
        st.fixed_dictionaries({"faults": st.one_of(st.integers(), st.text(max_size=3),
                                                   st.lists(st.integers(), min_size=1))}),
        st.fixed_dictionaries({"granularity": st.integers(max_value=0)})),
    "handle_reserve": st.one_of(st.integers(max_value=-1), st.floats(), st.text(max_size=3),
                                st.booleans()),
    "ledger": st.one_of(st.integers(), st.floats(), st.lists(st.integers(), min_size=1),
                        st.builds(object)),
    "trace_errors": _junk.filter(lambda v: v not in ("raise", "continue")),
}


@st.composite
def bad_call(draw: st.DrawFn) -> tuple[str, dict[str, Any]]:
    """allocate() keyword arguments with exactly one bad argument (the rest valid)."""
    name = draw(st.sampled_from(sorted(_BAD)))
    kwargs: dict[str, Any] = {"plan": draw(st.sampled_from(["packed", "naive"]))}
    kwargs[name] = draw(_BAD[name])
    return name, kwargs


@settings(max_examples=examples(150), **_SETTINGS)
@given(case=bad_call())
def test_allocate_with_one_bad_argument(case: tuple[str, dict[str, Any]]) -> None:
    count_case("allocate_with_one_bad_argument")
    from kvgrant.runtime import allocate
    from kvgrant.runtime.sim import SimDriver

    name, kwargs = case
    geometry = kwargs.pop("geometry", str(SMALL))
    own_driver = name in ("backend", "driver_options")
    drv = None if own_driver else SimDriver(devices=3)
    if own_driver:
        kwargs.setdefault("backend", "sim")
    with limits():
        with pytest.raises(KVGrantError) as info:
            allocate(geometry, driver=drv, **kwargs).release()
    err = info.value
    assert isinstance(err, (ArgumentError, GeometryError, PlanError, TraceError)), repr(err)
    if isinstance(err, ArgumentError):
        assert err.argument.split("[")[0].split(" ")[0] in (name, "plan", "driver_options",
                                                            "devices", "granularity")
    if drv is not None:
        assert drv.live().is_empty()


@pytest.fixture(scope="module")
def published() -> Iterator[Any]:
    from kvgrant.runtime import allocate

    pub = allocate(str(SMALL), backend="sim")
    yield pub
    pub.release()


_index = st.one_of(st.integers(-3, 12), st.integers(), _junk)
_name = st.one_of(st.sampled_from(["kv0", "kv1", "snapshot", "execution"]), _junk)


@settings(max_examples=examples(150), **_SETTINGS)
@given(method=st.sampled_from(["row_va", "row", "page", "plane"]), a=_index, b=_name,
       c=_index)
def test_views_with_any_arguments(published: Any, method: str, a: Any, b: Any,
                                  c: Any) -> None:
    count_case("views_with_any_arguments")
    args = (a, b) if method == "plane" else (a, b, c)
    with limits():
        try:
            value = getattr(published, method)(*args)
        except ArgumentError as err:
            assert err.argument in ("rank", "region", "plane", "row", "page")
            return
    assert value is not None


_json = st.recursive(st.one_of(st.none(), st.booleans(), st.integers(), st.floats(),
                               st.text(max_size=8)),
                     lambda kids: st.one_of(st.lists(kids, max_size=4),
                                            st.dictionaries(st.text(max_size=8), kids,
                                                            max_size=4)),
                     max_leaves=20)


@st.composite
def geometry_like(draw: st.DrawFn) -> Any:
    """The small example with one field replaced by arbitrary JSON, or arbitrary JSON."""
    if draw(st.booleans()):
        return draw(_json)
    doc = json.loads(SMALL.read_text())
    target = draw(st.sampled_from([doc, doc["topology"], *doc["planes"], *doc["regions"],
                                   *doc["aliases"]]))
    target[draw(st.sampled_from(sorted(target) + ["extra"]))] = draw(_json)
    return doc


@settings(max_examples=examples(150), **_SETTINGS)
@given(doc=geometry_like())
def test_parse_geometry_with_any_document(doc: Any) -> None:
    count_case("parse_geometry_with_any_document")
    from kvgrant.layout.geometry import Geometry, parse_geometry

    with limits():
        try:
            assert isinstance(parse_geometry(doc), Geometry)
        except GeometryError as err:
            assert str(err) and len(str(err)) < 5000


@settings(max_examples=examples(150), **_SETTINGS)
@given(value=st.one_of(st.text(max_size=16), _junk, st.integers()))
def test_parse_memory_limit_with_any_value(value: Any) -> None:
    count_case("parse_memory_limit_with_any_value")
    from kvgrant.runtime.capacity import MemoryLimit, parse_memory_limit

    try:
        lim = parse_memory_limit(value)
    except ArgumentError as err:   # bad input (was a PlanError)
        assert err.argument == "memory_limit" and str(err).startswith("memory_limit = ")
        assert len(str(err)) < 1000
        return
    assert isinstance(lim, MemoryLimit)
    assert 0 <= lim.keep <= 1 << 50 and (lim.cap is None or 0 < lim.cap <= 1 << 50)
    if isinstance(value, str) and not any(u in value.upper() for u in "KMGT"):
        assert lim.keep + (lim.cap or 0) == 0 or lim.keep + (lim.cap or 0) >= 1 << 20


def _small_trace_text() -> str:
    from kvgrant.runtime import allocate

    buf = io.StringIO()
    allocate(str(SMALL), backend="sim", trace=buf).release()
    return buf.getvalue()


_TRACE = _small_trace_text()


_LINES = _TRACE.splitlines()
_KEYS = sorted({k for line in _LINES[:3] for k in json.loads(line)} | {"extra"})


def _edit_trace(line: int, key: str, value: Any) -> str:
    """The small trace with ``key`` of line ``line`` set to ``value`` (small to report)."""
    lines = list(_LINES)
    obj = json.loads(lines[line])
    obj[key] = value
    lines[line] = json.dumps(obj)
    return "\n".join(lines) + "\n"


_trace_case = st.one_of(
    _junk, st.text(max_size=60),
    st.tuples(st.integers(0, len(_LINES) - 1), st.sampled_from(_KEYS), _json))


@settings(max_examples=examples(150), **_SETTINGS)
@given(case=_trace_case)
def test_parse_trace_with_any_text(case: Any) -> None:
    count_case("parse_trace_with_any_text")
    from kvgrant.conformance import replay
    from kvgrant.conformance.trace_io import Trace, parse_trace

    text = _edit_trace(*case) if isinstance(case, tuple) else case
    with limits():
        try:
            trace = parse_trace(text)
        except TraceError as err:
            assert str(err) and len(str(err)) < 5000
            return
        assert isinstance(trace, Trace)
        replay(trace)  # a well-formed trace always gets a verdict


@settings(max_examples=examples(50), **_SETTINGS)
@given(path=st.one_of(_junk, st.text(max_size=10)))
def test_load_geometry_and_trace_with_any_path(path: Any) -> None:
    count_case("load_geometry_and_trace_with_any_path")
    from kvgrant.conformance.trace_io import load_trace
    from kvgrant.layout.geometry import load_geometry

    with limits():
        with pytest.raises((GeometryError, TraceError)):
            load_geometry(path if path not in (".", "..") else "/nonexistent")
        with pytest.raises(TraceError):
            load_trace(path if path not in (".", "..") else "/nonexistent")
