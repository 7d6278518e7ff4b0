"""Library bad input found by a probe of the public entry points (2026-12-02): each
was a bare TypeError / ValueError / OverflowError from deep inside, or was accepted
and misbehaved; each is now an ArgumentError naming the argument, value and rule."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from kvgrant.errors import ArgumentError
from kvgrant.runtime import Backend, allocate
from kvgrant.runtime.faults import Fault, FaultPlan
from kvgrant.runtime.group import MAX_TIMEOUT_S, allocate_rank

from tests.runtime._dict_store import DictStore
from tests.runtime.test_runtime_mutation_kills import tiny

SMALL = Path(__file__).resolve().parents[2] / "examples" / "small.json"


@pytest.mark.parametrize("kw, argument", [
    ({"repeat": "no"}, "Fault.repeat"),        # was accepted: failed every call
    ({"repeat": 1}, "Fault.repeat"),
    ({"call": ["cuMemCreate"]}, "Fault.call"),  # was TypeError: unhashable
    ({"call": "cuMemcreate"}, "Fault.call"),
    ({"nth": 0}, "Fault.nth"),
    ({"nth": 1.0}, "Fault.nth"),
    ({"device": -1}, "Fault.device"),
    ({"result": "CUDA_SUCCESS"}, "Fault.result"),
    ({"result": "BOGUS"}, "Fault.result"),
    ({"result": True}, "Fault.result"),
    ({"result": None}, "Fault.result"),
])
def test_a_bad_fault_field_is_an_argument_error(kw: dict[str, Any], argument: str) -> None:
    with pytest.raises(ArgumentError) as err:
        Fault(**kw)
    assert err.value.argument == argument
    assert str(err.value).startswith(f"{argument} = "), err.value


def test_a_fault_keeps_its_integer_result_and_its_defaults() -> None:
    assert Fault(result=2).result == "CUDA_ERROR_OUT_OF_MEMORY"
    assert Fault(repeat=True).describe().endswith("and every later one")
    assert "every later" not in Fault().describe()


@pytest.mark.parametrize("spec, needle", [
    (FaultPlan(faults=[1]), "faults[0] = 1: must be a Fault"),     # was AttributeError
    (3, "must be a Fault, a FaultPlan"),                           # was TypeError
    ([{"nht": 2}], "unknown field(s) ['nht']"),                    # was TypeError
    ([{"nth": 0}], "Fault.nth = 0"),
])
def test_a_bad_fault_plan_is_refused_before_any_driver_call(spec: Any, needle: str) -> None:
    with pytest.raises(ArgumentError) as err:
        allocate(SMALL, backend=Backend("sim", {"faults": spec}))
    assert needle in str(err.value), err.value


def test_a_fault_plan_without_a_list_is_no_faults() -> None:
    pub = allocate(SMALL, backend=Backend("sim", {"faults": FaultPlan(faults=None)}))  # type: ignore[arg-type]
    pub.release()
    assert pub.driver.live().is_empty()


@pytest.mark.parametrize("timeout_s", [float("inf"), 1e300, 2 ** 1100, MAX_TIMEOUT_S + 1,
                                       0, -1, float("nan"), True, "5"])
def test_allocate_rank_refuses_a_timeout_it_cannot_wait(timeout_s: Any) -> None:
    # inf reached socket.settimeout after the creates: a bare OverflowError on two ranks
    with pytest.raises(ArgumentError) as err:
        allocate_rank(tiny(), 0, store=DictStore(), backend="sim", timeout_s=timeout_s)
    assert err.value.argument == "timeout_s"
    assert f"at most {MAX_TIMEOUT_S:,}" in str(err.value), err.value


@pytest.mark.parametrize("device", ["1", -1, True, 1.5, 1024])
def test_allocate_rank_refuses_a_device_that_is_not_an_ordinal(device: Any) -> None:
    # "1" was a bare TypeError; -1, True and 1.5 reached the driver (INVALID_DEVICE)
    with pytest.raises(ArgumentError) as err:
        allocate_rank(tiny(), 0, store=DictStore(), backend="sim", device=device,
                      timeout_s=5)
    assert err.value.argument == "device"
    assert "must be an integer CUDA ordinal in 0..1023" in str(err.value), err.value


def test_allocate_rank_refuses_a_local_rank_past_the_largest_ordinal(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("LOCAL_RANK", "100000000")
    with pytest.raises(ArgumentError, match=r"LOCAL_RANK = \"100000000\": must be a device "
                                            r"number in 0\.\.1023"):
        allocate_rank(tiny(), 0, store=DictStore(), backend="sim", timeout_s=5)


@pytest.mark.parametrize("offset, nbytes, argument", [
    (0.5, 5, "offset"),      # was accepted: a fractional pointer
    ("0", 5, "offset"),      # was TypeError
    (-1, 5, "offset"),       # was a bare ValueError
    (0, True, "nbytes"),
    (0, 1 << 60, "nbytes"),  # past the buffer
])
def test_a_buffer_slice_takes_integer_bytes_inside_it(offset: Any, nbytes: Any,
                                                     argument: str) -> None:
    pub = allocate(SMALL, backend="sim")
    try:
        buf = pub.plane(0, "kv0")
        with pytest.raises(ArgumentError) as err:
            buf.slice(offset, nbytes)
        assert err.value.argument == argument, err.value
        assert buf.slice(4, 8).ptr == buf.ptr + 4
    finally:
        pub.release()


def _plans() -> list[tuple[Any, str]]:
    import json

    from kvgrant.layout.geometry import load_geometry
    from kvgrant.layout.plan import PhysicalPlan
    from kvgrant.layout.plans import make_plan

    g = load_geometry(SMALL)
    raw = json.loads(SMALL.read_text())
    naive = make_plan(g, "naive").allocations
    return [(PhysicalPlan("packed", g, None), "plan.allocations = null"),  # was TypeError
            (PhysicalPlan("packed", g, ("x",)), "plan.allocations[0] = \"x\""),
            (PhysicalPlan("packed", raw, ()), "plan.geometry = "),       # was AttributeError
            (PhysicalPlan(None, g, naive), "plan.label = null"),          # was allocated
            (PhysicalPlan("", g, naive), "plan.label = \"\"")]


@pytest.mark.parametrize("case", range(5))
def test_a_hand_made_plan_must_hold_what_the_allocator_reads(case: int) -> None:
    plan, needle = _plans()[case]
    with pytest.raises(ArgumentError) as err:
        allocate(SMALL, plan=plan, backend="sim")
    assert str(err.value).startswith(needle), err.value


def test_a_plan_for_a_layout_of_the_same_name_names_the_fields_that_differ() -> None:
    import json

    from kvgrant.errors import PlanError
    from kvgrant.layout.geometry import parse_geometry
    from kvgrant.layout.plans import make_plan

    doc = json.loads(SMALL.read_text())
    doc["pages"] = 20
    other = make_plan(parse_geometry(doc), "naive")
    with pytest.raises(PlanError, match=r"was made for geometry 'small', not for 'small' as "
                                        r"given: they differ in pages$"):
        allocate(SMALL, plan=other, backend="sim")


@pytest.mark.parametrize("kw, needle", [
    ({"text": "x", "keep": "a"}, "memory_limit.keep = 'a'"),   # was TypeError in fit_pages
    ({"text": "x", "cap": "1G"}, "memory_limit.cap = '1G'"),
    ({"text": "x", "keep": -5}, "memory_limit.keep = -5"),
    ({"text": 3}, "memory_limit.text = 3"),
])
def test_a_hand_made_memory_limit_is_checked(kw: dict[str, Any], needle: str) -> None:
    from kvgrant.errors import ArgumentError
    from kvgrant.runtime.capacity import MemoryLimit

    with pytest.raises(ArgumentError) as err:   # bad input (was a PlanError)
        allocate(SMALL, backend="sim", memory_limit=MemoryLimit(**kw))
    assert str(err.value).startswith(needle), err.value
    assert err.value.argument == needle.split(" =")[0]
    pub = allocate(SMALL, backend="sim", memory_limit=MemoryLimit(text="40G", cap=40 << 30))
    pub.release()


def test_more_ranks_than_ordinals_in_one_process_names_topology_ranks() -> None:
    import json

    from kvgrant.errors import PlanError
    from kvgrant.layout.geometry import parse_geometry

    doc = json.loads(SMALL.read_text())
    doc["topology"] = {"ranks": 1025, "import_groups": []}
    # was: "devices = 1025: must be an integer in 1..1024", an argument never passed
    with pytest.raises(PlanError, match=r"^topology\.ranks = 1025: allocate\(\) gives every "
                                        r"rank its own CUDA ordinal"):
        allocate(parse_geometry(doc), backend="sim")


def _misnamed(name: Any) -> Any:
    """A working sim driver under another ``name`` (the trace header's ``backend``)."""
    from kvgrant.runtime.sim import SimDriver

    class Renamed(SimDriver):
        pass

    Renamed.name = name  # type: ignore[assignment]
    return Renamed(devices=3)


@pytest.mark.parametrize("name", ["mydriver", "", "SIM", None, 5])
@pytest.mark.parametrize("keyword", ["backend", "driver"])
def test_a_driver_not_named_sim_or_cuda_is_refused(name: Any, keyword: str) -> None:
    """Its name is the trace header's ``backend``, which ``kvgrant conform`` takes only
    as sim or cuda: such a driver wrote traces the checker refuses (was accepted)."""
    drv = _misnamed(name)
    with pytest.raises(ArgumentError) as err:
        allocate(SMALL, **{keyword: drv})
    assert err.value.argument == keyword
    text = str(err.value)
    assert text.startswith(f"{keyword} = ") and "its name is " in text, text
    assert "a driver's name is 'sim' or 'cuda'" in text, text
    assert sum(drv.calls.values()) == 0 and drv.live().is_empty()


def test_a_misnamed_driver_of_one_group_rank_is_named_by_every_rank() -> None:
    from kvgrant.errors import GroupError
    from kvgrant.runtime.sim import SimDriver
    from tests.runtime._dict_store import run_threads

    bad, good = _misnamed("mydriver"), SimDriver(devices=2)
    outs = run_threads(tiny(), [good, bad], timeout_s=30.0)
    assert isinstance(outs[1], ArgumentError) and outs[1].argument == "driver", outs[1]
    assert "its name is \"mydriver\"" in str(outs[1]), outs[1]
    assert isinstance(outs[0], GroupError) and "rank 1 failed: ArgumentError" in str(outs[0])
    assert sum(bad.calls.values()) == 0 and good.live().is_empty()
