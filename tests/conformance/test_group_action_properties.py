"""KVGroup's action properties (OneAttempt, NoRetryAfterFailure, UnwindInReverseOrder),
restated from the events in tests/runtime/_group_traces.py, hold on the group model's
traces for a fault at every step of every process and for crashes, and catch the
traces that break them; the model's engine rejects those traces too. The same check
runs on the runtime's own group traces (tests/runtime/test_group_sim.py)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from kvgrant.conformance.group_check import check_group
from kvgrant.conformance.group_gen import simulate_group, write_group
from kvgrant.conformance.group_model import constants_from

from tests.runtime._group_traces import check_action_properties

# 3 processes in one import group, 2 allocations: 0 into a shared region, 1 owner-only.
C3 = constants_from(3, 2, [0, 1], [1], {0: [1, 2], 1: [0, 2], 2: [0, 1]},
                    {r: [0, 1, 2] for r in range(3)})


def _events(text: str) -> list[dict]:
    return [json.loads(x) for x in text.splitlines()[1:]]


def _forward_steps(rank: int) -> int:
    clean = _events(simulate_group(C3, shutdown=False)[rank])
    return sum(e["action"] not in ("Vote", "Decide", "Publish") for e in clean)


@pytest.mark.parametrize("rank", range(3))
def test_the_properties_hold_for_a_fault_at_every_step(rank: int) -> None:
    for k in range(_forward_steps(rank)):
        for text in simulate_group(C3, fail_at={rank: k}):
            check_action_properties(_events(text))


def test_the_properties_hold_with_a_crash_and_after_shutdown() -> None:
    for text in simulate_group(C3):
        check_action_properties(_events(text))
    for k in (3, 12, 20):
        texts = simulate_group(C3, crash_after={0: k})
        for text in texts[1:]:
            check_action_properties(_events(text))


def _aborted_importer() -> list[str]:
    """Rank 2 fails its last import: it unwinds an import and its own memory."""
    for k in range(_forward_steps(2) - 1, -1, -1):
        texts = simulate_group(C3, fail_at={2: k})
        acts = [e["action"] for e in _events(texts[2])]
        if acts.count("ImportRelease") >= 2:
            return texts
    raise AssertionError("no fault leaves rank 2 with two imports to unwind")


def _swap(text: str, first: str, second: str) -> str:
    """Rank's file with the first ``first`` event and the first ``second`` event after
    it exchanged (seq and state stay where they were)."""
    lines = text.splitlines()
    evs = [json.loads(x) for x in lines[1:]]
    i = next(n for n, e in enumerate(evs) if e["action"] == first)
    j = next(n for n, e in enumerate(evs) if e["action"] == second and n > i)
    for key in ("action", "args", "call", "result", "device", "va", "size", "handle"):
        evs[i][key], evs[j][key] = evs[j][key], evs[i][key]
    return "\n".join([lines[0]] + [json.dumps(e) for e in evs]) + "\n"


@pytest.mark.parametrize("first,second,why", [
    ("ImportUnmap", "Unmap", "own memory unwound while imports are held"),
    ("ImportRelease", "ImportRelease", "not the newest import"),
    ("Release", "Release", "not the newest allocation"),
])
def test_an_unwinding_out_of_order_breaks_the_property_and_the_model(
        tmp_path: Path, first: str, second: str, why: str) -> None:
    texts = _aborted_importer()
    bad = _swap(texts[2], first, second)
    with pytest.raises(AssertionError, match=why):
        check_action_properties(_events(bad))
    paths = write_group([texts[0], texts[1], bad], tmp_path)
    verdict = check_group([str(p) for p in paths])[0]
    assert not verdict.accepted


def test_a_step_after_a_failure_breaks_no_retry() -> None:
    texts = simulate_group(C3, fail_at={1: 4})
    evs = _events(texts[1])
    i = next(n for n, e in enumerate(evs) if e["result"] not in ("CUDA_SUCCESS", "SUCCESS",
                                                                   None))
    retried = dict(evs[i], result="CUDA_SUCCESS", seq=evs[i]["seq"])
    bad = evs[:i + 1] + [retried]
    with pytest.raises(AssertionError, match="a retry"):
        check_action_properties(bad)


@pytest.mark.parametrize("first,second,why", [
    ("Create", "Create", "not in plan order"),
    ("Import", "Import", "import order"),
])
def test_making_out_of_plan_order_breaks_the_property_and_the_model(
        tmp_path: Path, first: str, second: str, why: str) -> None:
    texts = simulate_group(C3, shutdown=False)
    bad = _swap(texts[2], first, second)
    with pytest.raises(AssertionError, match=why):
        check_action_properties(_events(bad))
    paths = write_group([texts[0], texts[1], bad], tmp_path)
    assert not check_group([str(p) for p in paths])[0].accepted
