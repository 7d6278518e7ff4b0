"""The grouped options of allocate / allocate_rank (kvgrant.runtime.options, issue #15):
each object names a bad field, the flat keywords of earlier versions map onto the same
objects with the same result, a shorthand beside its object and an unknown keyword are
refused."""

from __future__ import annotations

import dataclasses
import io
import re
from pathlib import Path
from typing import Any, Callable

import pytest

from kvgrant.errors import AllocationError, ArgumentError, HandleBudgetError, TraceError
from kvgrant.layout.geometry import parse_geometry
from kvgrant.layout.plans import make_plan
from kvgrant.layout.preflight import handle_demand
from kvgrant.runtime import Backend, HandleBudget, TraceOptions, allocate, allocate_rank
from kvgrant.runtime.faults import Fault
from kvgrant.runtime.ledger import HostLedger
from kvgrant.runtime.sim import SimDriver

from tests.runtime._small import G, MIB, small_geometry

# one rank, no imports: allocate_rank runs in this process with an in-memory store
ONE_RANK = {"name": "one", "granularity": G, "pages": 4, "page_tokens": 16,
            "planes": [{"name": "a", "bytes_per_page": MIB}],
            "regions": [{"name": "snapshot", "rows": 1, "row_bytes": G}],
            "aliases": [{"region": "snapshot", "offset": 0, "plane": "a", "plane_offset": 0,
                         "length": G}],
            "topology": {"ranks": 1, "import_groups": []}}


class _Store:
    """The few torch.distributed Store calls allocate_rank makes, in memory."""

    def __init__(self) -> None:
        self.d: dict[str, bytes] = {}

    def add(self, key: str, n: int) -> int:
        self.d[key] = str(int(self.d.get(key, b"0")) + n).encode()
        return int(self.d[key])

    def set(self, key: str, value: str) -> None:
        self.d[key] = value.encode()

    def get(self, key: str) -> bytes:
        return self.d[key]

    def check(self, keys: list[str]) -> bool:
        return all(k in self.d for k in keys)

    def compare_set(self, key: str, expected: str, desired: str) -> bytes:
        if key not in self.d and expected == "":
            self.d[key] = desired.encode()
        return self.d[key]


class _Broken(io.StringIO):
    def write(self, s: str) -> int:
        raise OSError(5, "I/O error")


def _same(pub: Any) -> dict[str, Any]:
    """What must not differ between two equal calls (start-up time does)."""
    out = pub.summary()
    del out["startup_s"]
    return out


# ---------------------------------------------------------------- each bad value named
@pytest.mark.parametrize("make, argument, rule", [
    (lambda: HandleBudget(handles=-1), "HandleBudget.handles", "integer >= 0"),
    (lambda: HandleBudget(handles=1.5), "HandleBudget.handles", "integer >= 0"),
    (lambda: HandleBudget(handles=True), "HandleBudget.handles", "integer >= 0"),
    (lambda: HandleBudget(reserve="4k"), "HandleBudget.reserve", "integer >= 0"),
    (lambda: HandleBudget(preflight="no"), "HandleBudget.preflight", "True or False"),
    (lambda: HandleBudget(ledger=42), "HandleBudget.ledger", "HostLedger"),
    (lambda: TraceOptions(123), "TraceOptions.target", "text stream"),
    (lambda: TraceOptions(io.BytesIO()), "TraceOptions.target", "not 'wb'"),
    (lambda: TraceOptions(""), "TraceOptions.target", "not an empty string"),
    (lambda: TraceOptions("t", errors="ignore"), "TraceOptions.errors", "'continue'"),
    (lambda: Backend("gpu"), "Backend.name", "auto, sim, cuda"),
    (lambda: Backend(None), "Backend.name", "auto, sim, cuda"),
    (lambda: Backend("sim", [1]), "Backend.options", "mapping"),
    (lambda: Backend("cuda", {"memory_per_device": 1}), "Backend.options key",
     "for backend 'cuda'"),
    (lambda: Backend("sim", {"faults": 3}), "Backend.options['faults']", "FaultPlan"),
])
def test_each_option_object_names_the_bad_field_value_and_rule(
        make: Callable[[], Any], argument: str, rule: str) -> None:
    with pytest.raises(ArgumentError) as info:
        make()
    assert info.value.argument == argument
    assert str(info.value).startswith(f"{argument} = ") and rule in str(info.value)


def test_option_objects_are_frozen_and_compare_by_value() -> None:
    b = Backend("sim", {"devices": 3})
    assert b == Backend("sim", {"devices": 3}) and hash(b) == hash(Backend("sim"))
    with pytest.raises(TypeError):
        b.options["devices"] = 4  # type: ignore[index]
    for obj, name in ((HandleBudget(), "handles"), (TraceOptions(), "errors"), (b, "name")):
        with pytest.raises(dataclasses.FrozenInstanceError):
            setattr(obj, name, None)
    assert HandleBudget().limits() == (523_880, 4_096)
    assert HandleBudget(handles=10, reserve=0).limits() == (10, 0)
    assert Backend().options == {} and Backend("sim", None).options == {}


def test_the_grouped_parameters_refuse_other_types() -> None:
    for kwargs, argument in (({"budget": 10}, "budget"), ({"trace": 123}, "trace"),
                             ({"backend": "gpu"}, "backend"), ({"backend": {}}, "backend"),
                             ({"backend": SimDriver}, "backend")):
        with pytest.raises(ArgumentError) as info:
            allocate(small_geometry(), **kwargs)
        assert info.value.argument == argument, kwargs
    with pytest.raises(ArgumentError, match="it is a class"):
        allocate(small_geometry(), backend=SimDriver)


# ------------------------------------------- old keyword == grouped object, on the sim
def test_budget_shorthands_and_handle_budget_give_the_same_refusal(tmp_path: Path) -> None:
    g = small_geometry()
    need = handle_demand(g, make_plan(g, "packed"))
    errors = []
    for kwargs in ({"handle_budget": need - 1, "handle_reserve": 0},
                   {"budget": HandleBudget(handles=need - 1, reserve=0)}):
        drv = SimDriver(devices=3)
        with pytest.raises(HandleBudgetError) as info:
            allocate(g, backend=drv, **kwargs)
        assert sum(drv.calls.values()) == 0
        errors.append((str(info.value), info.value.demand, info.value.budget))
    assert errors[0] == errors[1] and errors[0][1:] == (need, need - 1)


def test_budget_shorthands_and_handle_budget_give_the_same_cache_and_lease(
        tmp_path: Path) -> None:
    g = small_geometry()
    seen = []
    for i, kwargs in enumerate((
            {"handle_budget": 1, "handle_reserve": 0, "preflight": False,
             "ledger": str(tmp_path / "ledger0.json")},
            {"budget": HandleBudget(handles=1, reserve=0, preflight=False,
                                    ledger=str(tmp_path / "ledger1.json"))})):
        book = HostLedger(tmp_path / f"ledger{i}.json")
        with allocate(g, driver=SimDriver(devices=3), **kwargs) as pub:
            (h,) = book.holders()
            seen.append((_same(pub), h.handles, h.reserve, h.checked))
        assert book.holders() == []
    assert seen[0] == seen[1] and seen[0][1:] == (handle_demand(g, make_plan(g, "packed")),
                                                  0, False)


def test_driver_and_driver_options_shorthands_equal_backend() -> None:
    g = small_geometry()
    given = []
    for kwargs in ({"driver": SimDriver(devices=3)}, {"backend": SimDriver(devices=3)},
                   {"driver": SimDriver(devices=3), "backend": "cuda"}):  # the driver wins
        pub = allocate(g, **kwargs)
        pub.release()
        drv = kwargs.get("driver") or kwargs["backend"]
        assert pub.driver is drv and pub.backend_reason == "given"
        drv.free_memory(0)   # a given driver is left open on release
        given.append(_same(pub))
    assert given[0] == given[1] == given[2]
    failed = []
    for kwargs in ({"backend": "sim", "driver_options": {"faults": [Fault(nth=7)]}},
                   {"backend": Backend("sim", {"faults": [Fault(nth=7)]})}):
        with pytest.raises(AllocationError) as info:
            allocate(g, **kwargs)
        failed.append((str(info.value), info.value.call, info.value.live))
    assert failed[0] == failed[1]


def test_trace_errors_shorthand_equals_trace_options(tmp_path: Path) -> None:
    g = small_geometry()
    for kwargs in ({"trace": _Broken(), "trace_errors": "continue"},
                   {"trace": TraceOptions(_Broken(), errors="continue")}):
        drv = SimDriver(devices=3)
        pub = allocate(g, backend=drv, **kwargs)
        assert pub.trace_error is not None
        pub.release()
        assert drv.live().is_empty()
    for kwargs in ({"trace": _Broken(), "trace_errors": "raise"},
                   {"trace": TraceOptions(_Broken(), errors="raise")},
                   {"trace": TraceOptions(_Broken())}):
        drv = SimDriver(devices=3)
        with pytest.raises(TraceError, match="I/O error"):
            allocate(g, backend=drv, **kwargs)
        assert drv.live().is_empty()
    lines = []
    for name, trace in (("a", str(tmp_path / "a.ndjson")),
                        ("b", TraceOptions(tmp_path / "b.ndjson", errors="raise"))):
        allocate(g, backend=SimDriver(devices=3), trace=trace).release()
        lines.append(len((tmp_path / f"{name}.ndjson").read_text().splitlines()))
    assert lines[0] == lines[1] > 10


def test_allocate_rank_shorthands_equal_the_grouped_objects(tmp_path: Path) -> None:
    g = parse_geometry(ONE_RANK)
    need = handle_demand(g, make_plan(g, "packed"))
    refusals = []
    for kwargs in ({"handle_budget": need - 1, "handle_reserve": 0},
                   {"budget": HandleBudget(handles=need - 1, reserve=0)}):
        with pytest.raises(HandleBudgetError) as info:
            allocate_rank(g, 0, store=_Store(), backend="sim", timeout_s=10, **kwargs)
        refusals.append(str(info.value))
    assert refusals[0] == refusals[1]
    done = []
    for kwargs in ({"backend": "sim", "driver_options": {"memory_per_device": 1 << 30},
                    "ledger": str(tmp_path / "l0.json"), "handle_reserve": 0},
                   {"backend": Backend("sim", {"memory_per_device": 1 << 30}),
                    "budget": HandleBudget(reserve=0, ledger=str(tmp_path / "l1.json"))},
                   {"driver": SimDriver(devices=1, memory_per_device=1 << 30),
                    "ledger": str(tmp_path / "l2.json"), "handle_reserve": 0},
                   {"backend": SimDriver(devices=1, memory_per_device=1 << 30),
                    "trace": TraceOptions(tmp_path / "t.ndjson", errors="continue"),
                    "budget": HandleBudget(reserve=0, ledger=str(tmp_path / "l3.json"))}):
        with allocate_rank(g, 0, store=_Store(), timeout_s=10, **kwargs) as pub:
            i = len(done)
            (h,) = HostLedger(tmp_path / f"l{i}.json").holders()
            out = _same(pub)
            del out["backend_reason"]
            done.append((out, pub.driver.free_memory(0)[1], h.handles, h.reserve))
    assert done[0] == done[1] == done[2] == done[3]
    assert (tmp_path / "t.ndjson").read_text().startswith("{")


# ------------------------------------------------------------------------ refusals
@pytest.mark.parametrize("shorthand, grouped", [
    ({"handle_budget": 10}, {"budget": HandleBudget()}),
    ({"handle_reserve": 0}, {"budget": HandleBudget(reserve=0)}),
    ({"preflight": True}, {"budget": HandleBudget()}),
    ({"ledger": False}, {"budget": HandleBudget(ledger=False)}),
    ({"trace_errors": "continue"}, {"trace": TraceOptions(None, errors="continue")}),
    ({"driver_options": {}}, {"backend": Backend("sim")}),
    ({"driver": "DRIVER"}, {"backend": Backend("sim")}),
    ({"driver": "DRIVER"}, {"backend": "DRIVER"}),
    ({"driver_options": {"faults": None}}, {"backend": "DRIVER"}),
])
def test_a_shorthand_beside_its_grouped_object_is_refused_naming_both(
        shorthand: dict[str, Any], grouped: dict[str, Any]) -> None:
    drv = SimDriver(devices=3)
    kwargs = {k: drv if v == "DRIVER" else v for k, v in {**shorthand, **grouped}.items()}
    (key,), (param,) = shorthand, grouped
    with pytest.raises(ArgumentError) as info:
        allocate(small_geometry(), **kwargs)
    assert info.value.argument == key
    assert f"{key} = " in str(info.value) and f"{param} = " in str(info.value)
    assert "pass one of them" in str(info.value)
    assert sum(drv.calls.values()) == 0
    if key != "trace_errors":
        with pytest.raises(ArgumentError) as info:
            allocate_rank(parse_geometry(ONE_RANK), 0, store=_Store(), **kwargs)
        assert info.value.argument == key


def test_a_shorthand_of_none_is_not_given() -> None:
    """None was each shorthand's default (or refused, as before): it is not a conflict."""
    with allocate(small_geometry(), driver=None, driver_options=None, handle_budget=None,
                  handle_reserve=None, ledger=None, budget=HandleBudget(),
                  backend=Backend("sim")) as pub:
        assert pub.driver.name == "sim"
    for key in ("preflight", "trace_errors"):
        with pytest.raises(ArgumentError) as info:
            allocate(small_geometry(), backend="sim", **{key: None})
        assert info.value.argument == key


def test_an_unknown_keyword_is_refused_listing_the_accepted_ones() -> None:
    with pytest.raises(ArgumentError) as info:
        allocate(small_geometry(), backend="sim", handle_budgte=10)
    msg = str(info.value)
    assert info.value.argument == "handle_budgte" and "not a keyword of allocate()" in msg
    for name in ("plan", "backend", "devices", "memory_limit", "check_contract", "budget",
                 "trace", "handle_budget", "handle_reserve", "preflight", "ledger",
                 "driver", "driver_options", "trace_errors"):
        assert re.search(rf"[ (]{name}[,) ]", msg), name
    # allocate_rank never took trace_errors
    with pytest.raises(ArgumentError) as info:
        allocate_rank(parse_geometry(ONE_RANK), 0, store=_Store(), trace_errors="continue")
    assert info.value.argument == "trace_errors"
    assert "not a keyword of allocate_rank()" in str(info.value)
    assert " timeout_s," in str(info.value) and " device," in str(info.value)
    assert "trace_errors," not in str(info.value).split("shorthands")[1]


def test_allocate_rank_refuses_to_raise_for_a_lost_trace() -> None:
    with pytest.raises(ArgumentError) as info:
        allocate_rank(parse_geometry(ONE_RANK), 0, store=_Store(), backend="sim",
                      trace=TraceOptions(None, errors="raise"))
    assert info.value.argument == "TraceOptions.errors" and "trace_error" in str(info.value)


def test_the_old_keywords_still_name_themselves_when_bad() -> None:
    for kwargs, argument in (({"handle_budget": -1}, "handle_budget"),
                             ({"handle_reserve": 1.5}, "handle_reserve"),
                             ({"preflight": "no"}, "preflight"), ({"ledger": 42}, "ledger"),
                             ({"trace_errors": "ignore"}, "trace_errors"),
                             ({"driver": object()}, "driver"),
                             ({"driver_options": [1]}, "driver_options"),
                             ({"driver_options": {"nope": 1}}, "driver_options key")):
        with pytest.raises(ArgumentError) as info:
            allocate(small_geometry(), backend="sim", **kwargs)
        assert info.value.argument == argument
        assert str(info.value).startswith(f"{argument} = ")


def test_the_option_objects_are_exported_where_allocate_is() -> None:
    import kvgrant.runtime as rt
    from kvgrant.runtime import options

    assert options.__all__ == sorted(options.__all__)
    assert all(hasattr(options, n) for n in options.__all__)
    assert (rt.Backend, rt.HandleBudget, rt.TraceOptions) == (
        options.Backend, options.HandleBudget, options.TraceOptions)
