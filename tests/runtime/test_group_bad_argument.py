"""A bad argument on one rank of a group: that rank raises its ArgumentError, the others
refuse at once naming it (they used to wait out timeout_s and then name the rank as
missing), nothing is created anywhere, and the group's next call starts cleanly (the
bad rank used to skip an attempt number, so the next call never met)."""

from __future__ import annotations

from typing import Any

import pytest

from kvgrant.errors import ArgumentError, GroupError
from kvgrant.runtime.group import GroupPublished, allocate_rank
from kvgrant.runtime.sim import SimDriver

from tests.runtime._dict_store import DictStore, release_all, run_threads
from tests.runtime.test_runtime_mutation_kills import EMPTY, tiny

class _CountingSim(SimDriver):
    """The simulated driver, counting address reservations and creates."""

    made = 0

    def reserve(self, size: int, alignment: int = 0, device: int | None = None) -> int:
        self.made += 1
        return super().reserve(size, alignment, device)

    def create(self, size: int, device: int) -> int:
        self.made += 1
        return super().create(size, device)


# Long enough that a rank which waited it out would not be named as the bad one in
# time: run_threads gives up on its threads after 60 s.
PATIENT_S = 45.0


@pytest.mark.parametrize("bad, names", [
    ({"memory_limit": "lots"}, "memory_limit = 'lots'"),
    ({"memory_limit": "-2Q"}, "memory_limit = '-2Q'"),
    ({"device": "gpu1"}, "device = "),
    ({"timeout_s": float("inf")}, "timeout_s = "),
    ({"handle_budget": -1}, "handle_budget = -1"),
    ({"trace_errors": "raise"}, "raise"),
    # review 2026-12-02: accepted as truthy, and a GroupError wrapping a PlanError
    ({"check_contract": "yes"}, 'check_contract = "yes"'),
    ({"plan": "pakced"}, 'plan = "pakced"'),
    ({"plan": 5}, "plan = 5"),
])
def test_a_bad_argument_of_one_rank_is_named_by_every_rank_at_once(
        bad: dict[str, Any], names: str) -> None:
    g = tiny()
    drivers = [_CountingSim(devices=2), _CountingSim(devices=2)]
    store = DictStore()
    outs = run_threads(g, drivers, per_rank={1: bad}, timeout_s=PATIENT_S, store=store)
    # the bad rank raises what allocate() raises for it: an ArgumentError (memory_limit
    # too: it was a PlanError)
    assert isinstance(outs[1], ArgumentError), outs[1]
    assert names in str(outs[1])
    assert isinstance(outs[0], GroupError), outs[0]
    text = str(outs[0])
    assert f"rank 1 failed: {type(outs[1]).__name__}" in text and names in text, text
    assert "did not join" not in text
    assert [drv.made for drv in drivers] == [0, 0]   # refused before any driver object

    # The next call of the same group, every argument good, publishes together.
    again = run_threads(g, drivers, timeout_s=PATIENT_S, store=store)
    try:
        assert all(isinstance(o, GroupPublished) for o in again), again
    finally:
        release_all(again)
    for drv in drivers:
        assert drv.live().as_dict() == EMPTY


def test_with_no_group_to_join_the_rank_raises_what_stops_the_join_noting_its_argument(
        ) -> None:
    """A store that is not one: nothing can be told, so the store's error is raised, with
    the bad argument of the same call in a note."""
    with pytest.raises(ArgumentError) as err:
        allocate_rank(tiny(), 0, store=5, backend="sim", memory_limit="lots")
    assert "store = 5" in str(err.value)
    assert any("memory_limit = 'lots'" in note for note in err.value.__notes__)


@pytest.mark.parametrize("rank", [5, -1, True, 1.0, "0"])
def test_a_rank_out_of_the_layout_is_a_bad_argument(rank: Any) -> None:
    """Was a GroupError (as if the group had refused); it is the caller's argument."""
    with pytest.raises(ArgumentError, match=r"rank = .*: must be an integer rank 0\.\.1"):
        allocate_rank(tiny(), rank, store=DictStore(), backend=SimDriver(devices=2))


def test_a_granularity_that_is_no_power_of_two_is_refused_by_every_rank_before_the_driver(
        ) -> None:
    """6 MiB is a multiple of the sim's 2 MiB granularity, so the group's device check
    let it through to the VA reservation (aligned to G); allocate() refused it up front.
    Every rank now refuses it alike in the hello (as a plan that breaks the contract),
    naming the geometry's field, with no driver object."""
    from kvgrant.layout.geometry import parse_geometry

    G = 3 << 21
    g = parse_geometry({
        "name": "g6m", "granularity": G, "pages": 2, "page_tokens": 16,
        "planes": [{"name": "p", "bytes_per_page": G}],
        "regions": [{"name": "r", "rows": 1, "row_bytes": G}],
        "aliases": [{"region": "r", "offset": 0, "plane": "p", "plane_offset": 0,
                     "length": G}],
        "topology": {"ranks": 2, "import_groups": [[0, 1]]}})
    drivers = [_CountingSim(devices=2), _CountingSim(devices=2)]
    outs = run_threads(g, drivers, timeout_s=PATIENT_S)
    for out in outs:
        assert isinstance(out, GroupError) and "nothing was created" in str(out), out
        assert sorted(out.failed) == [0, 1], out.failed
        for why in out.failed.values():
            assert why.startswith("GeometryError: granularity = 6291456: must be a power "
                                  "of two"), why
    assert [drv.made for drv in drivers] == [0, 0]
    for drv in drivers:
        assert drv.live().as_dict() == EMPTY
