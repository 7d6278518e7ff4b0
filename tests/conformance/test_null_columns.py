"""An event's object fields that its action's shape leaves null (docs/INTERFACES.md; e.g.
a handle on Reserve, a VA on Create) are refused by every reader, one-process and group,
fast path or not (a review found them accepted, 2026-12-02)."""

from __future__ import annotations

from pathlib import Path

import pytest

from kvgrant.conformance.group_check import check_group
from kvgrant.conformance.group_gen import simulate_group, write_group
from kvgrant.conformance.group_model import constants_from
from kvgrant.conformance.trace_io import _parse_fast, parse_trace
from kvgrant.errors import AllocationError, TraceError
from kvgrant.runtime.allocator import allocate
from kvgrant.runtime.faults import Fault
from kvgrant.runtime.sim import SimDriver
from kvgrant.traceformat import ACTIONS, GROUP_SHAPES

ROOT = Path(__file__).resolve().parents[2]
C2 = constants_from(2, 2, [0, 1], [1], {0: [1], 1: [0]}, {r: [0, 1] for r in range(2)})


@pytest.fixture(scope="module")
def trace_texts(tmp_path_factory) -> list[str]:
    """A published-and-released run and an aborted one (Abort, AbortComplete)."""
    d = tmp_path_factory.mktemp("null")
    small = ROOT / "examples" / "small.json"
    allocate(small, backend=SimDriver(devices=3), trace=d / "ok.ndjson").release()
    with pytest.raises(AllocationError):
        allocate(small, backend=SimDriver(devices=3, faults=[Fault(call="cuMemCreate", nth=2)]),
                 trace=d / "abort.ndjson")
    return [(d / "ok.ndjson").read_text(), (d / "abort.ndjson").read_text()]


def _edited(texts: list[str], action: str, key: str) -> tuple[int, list[str]]:
    """(which text, its lines with the field set) for the first text with such a line."""
    for i, text in enumerate(texts):
        bad = _set_field(text.splitlines(), action, key)
        if bad is not None:
            return i, bad
    raise AssertionError(f"no {action} line with {key} null in any trace")


def _cases(shapes) -> list[tuple[str, str]]:
    return [(a, k) for a, s in shapes.items() for k in ("va", "size", "handle")
            if not getattr(s, k)]


def _set_field(lines: list[str], action: str, key: str) -> list[str] | None:
    """``lines`` with ``key`` of the first ``action`` line set to 7 (text edit, so the
    line keeps the writer's format and the fast path sees it), or None: no such line."""
    for i, line in enumerate(lines):
        if f'"action": "{action}"' in line and f'"{key}": null' in line:
            return lines[:i] + [line.replace(f'"{key}": null', f'"{key}": 7')] + lines[i + 1:]
    return None


@pytest.mark.parametrize("action, key", _cases(ACTIONS))
def test_a_one_process_trace_with_a_field_its_action_leaves_null_is_refused(
        trace_texts: list[str], action: str, key: str) -> None:
    _, bad = _edited(trace_texts, action, key)
    text = "\n".join(bad) + "\n"
    assert _parse_fast(text, "t") is None
    with pytest.raises(TraceError, match=f"{key} = 7: must be null: a {action} event"):
        parse_trace(text)


@pytest.mark.parametrize("action, key", _cases(GROUP_SHAPES))
def test_a_group_trace_with_a_field_its_action_leaves_null_is_refused(
        tmp_path: Path, action: str, key: str) -> None:
    runs = [simulate_group(C2), simulate_group(C2, fail_at={1: 3})]   # published, aborted
    which, bad = _edited([run[1] for run in runs], action, key)
    paths = write_group([runs[which][0], "\n".join(bad) + "\n"], tmp_path)
    with pytest.raises(TraceError, match=f"{key} = 7: must be null: a {action} event"):
        check_group([str(p) for p in paths])


def test_the_clean_traces_are_still_accepted(trace_texts: list[str], tmp_path: Path) -> None:
    assert all(_parse_fast(text, "t") is not None for text in trace_texts)
    paths = write_group(simulate_group(C2), tmp_path)
    assert check_group([str(p) for p in paths])[0].accepted
