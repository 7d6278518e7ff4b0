"""Headers that contradict the contract or their own events (review 2026-12-07, a hunt
for conform holes): a plan that leaves plane or region bytes in no allocation, and a
reservation base given to a rank whose Reserve never succeeded; and an event key the
format does not have. Both readers (the fast one for the writer's lines, the detailed
one) refuse them as malformed."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from kvgrant.conformance import parse_trace
from kvgrant.errors import TraceError
from kvgrant.traceformat import format_event

from tests.conformance._conform_support import record_small_trace


def _text(head: dict, evs: list[dict], fast: bool) -> str:
    lines = [json.dumps(head)] + [format_event(e) if fast else json.dumps(e, sort_keys=True)
                                  for e in evs]
    return "\n".join(lines) + "\n"


def _split(lines: list[str]) -> tuple[dict, list[dict]]:
    return json.loads(lines[0]), [json.loads(x) for x in lines[1:]]


@pytest.mark.parametrize("fast", [True, False], ids=["writer-lines", "sorted-keys"])
def test_a_plan_that_leaves_plane_bytes_in_no_allocation_is_malformed(
        tmp_path: Path, fast: bool) -> None:
    head, evs = _split(record_small_trace(tmp_path))
    last = head["allocs"] - 1
    plane, poff, length = head["allocations"][last][:3]
    assert head["allocations"][last][3] is None   # small.json: the last one is not aliased
    head["allocations"] = head["allocations"][:last]
    head["allocs"] = last
    evs = [e for e in evs if e["args"].get("alloc") != last]
    with pytest.raises(TraceError) as err:
        parse_trace(_text(head, evs, fast))
    i = [p[0] for p in head["planes"]].index(plane)
    assert err.value.line == 1
    assert (f"header.planes[{i}] {plane!r}: bytes [{poff:#x}, {poff + length:#x})"
            in str(err.value)), err.value
    assert "contract point 1" in str(err.value)


def test_a_plan_that_leaves_region_bytes_unbacked_is_malformed(tmp_path: Path) -> None:
    head, evs = _split(record_small_trace(tmp_path))
    a = next(i for i, x in enumerate(head["allocations"]) if x[3] is not None)
    region, roff, length = head["allocations"][a][3], head["allocations"][a][4], \
        head["allocations"][a][2]
    head["allocations"][a][3:] = [None, None]
    with pytest.raises(TraceError) as err:
        parse_trace(_text(head, evs, True))
    i = [r[0] for r in head["regions"]].index(region)
    assert f"header.regions[{i}] {region!r}: bytes [{roff:#x}, " in str(err.value)
    assert "contract point 2" in str(err.value)


def _failed_reserve(tmp_path: Path) -> tuple[dict, list[dict], int]:
    """A sim trace whose rank 1 cuMemAddressReserve fails after rank 0's succeeded (rank
    2 never reserves): the header gives ranks 1 and 2 no base."""
    for k in range(1, 20):
        head, evs = _split(record_small_trace(tmp_path, "--fail-at", str(k)))
        bad = [e for e in evs if e["action"] == "Reserve" and e["result"] != "CUDA_SUCCESS"]
        if bad and bad[0]["rank"] == 1 and head["reservations"]["0"][0] is not None:
            assert head["reservations"]["1"][0] is None and head["reservations"]["2"][0] is None
            return head, evs, evs.index(bad[0]) + 2
    raise AssertionError("no --fail-at K fails rank 1's Reserve")


@pytest.mark.parametrize("fast", [True, False], ids=["writer-lines", "sorted-keys"])
@pytest.mark.parametrize("rank", [1, 2], ids=["reserve-failed", "never-reserved"])
def test_a_base_for_a_rank_that_never_reserved_is_malformed(tmp_path: Path, fast: bool,
                                                            rank: int) -> None:
    head, evs, line = _failed_reserve(tmp_path)
    assert parse_trace(_text(head, evs, fast)).header.layout.reservations[rank][0] is None
    size = head["reservations"]["0"][1]
    head["reservations"][str(rank)][0] = head["reservations"]["0"][0] + 4 * size
    with pytest.raises(TraceError) as err:
        parse_trace(_text(head, evs, fast))
    assert err.value.line == 1
    assert f"header.reservations[{rank}].base = " in str(err.value)
    assert (f"its Reserve failed at line {line}" if rank == 1 else
            "the trace has no successful Reserve of it") in str(err.value), err.value


def test_an_event_key_the_format_does_not_have_is_refused(tmp_path: Path) -> None:
    head, evs = _split(record_small_trace(tmp_path))
    k = next(i for i, e in enumerate(evs) if e["action"] == "Publish")
    evs[k]["published_by"] = 0   # (was: read by nothing, the trace accepted)
    with pytest.raises(TraceError) as err:
        parse_trace(_text(head, evs, False))
    assert err.value.line == k + 2
    assert "published_by = 0: unknown key (an event has kind, seq, t," in str(err.value)


@pytest.mark.parametrize("fast", [True, False], ids=["writer-lines", "sorted-keys"])
@pytest.mark.parametrize("fail_at, action, key", [
    (104, "Release", "handle"), (120, "Unmap", "va"), (160, "Free", "size")])
def test_a_failed_undo_must_name_the_object_it_leaves_live(
        tmp_path: Path, fast: bool, fail_at: int, action: str, key: str) -> None:
    # review 2026-12-07, a runtime mutant: a failed undo traced with null fields (which
    # handle or range stays live, unsaid) conformed; a failed forward step may name none
    head, evs = _split(record_small_trace(tmp_path, "--fail-at", str(fail_at)))
    k = next(i for i, e in enumerate(evs) if e["result"] not in (None, "CUDA_SUCCESS"))
    assert evs[k]["action"] == action and evs[k][key] is not None
    parse_trace(_text(head, evs, fast))   # as recorded: read
    evs[k][key] = None
    with pytest.raises(TraceError) as err:
        parse_trace(_text(head, evs, fast))
    assert err.value.line == k + 2
    assert f"{key} = null: a failed {action} names its {key}" in str(err.value), err.value
