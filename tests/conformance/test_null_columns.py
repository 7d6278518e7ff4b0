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
from kvgrant.errors import TraceError
from kvgrant.runtime.allocator import allocate
from kvgrant.runtime.sim import SimDriver
from kvgrant.traceformat import ACTIONS, GROUP_SHAPES

ROOT = Path(__file__).resolve().parents[2]
C2 = constants_from(2, 2, [0, 1], [1], {0: [1], 1: [0]}, {r: [0, 1] for r in range(2)})


@pytest.fixture(scope="module")
def trace_text(tmp_path_factory) -> str:
    path = tmp_path_factory.mktemp("null") / "t.ndjson"
    allocate(ROOT / "examples" / "small.json", backend=SimDriver(devices=3),
             trace=path).release()
    return path.read_text()


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
        trace_text: str, action: str, key: str) -> None:
    lines = trace_text.splitlines()
    bad = _set_field(lines, action, key)
    if bad is None:
        pytest.skip(f"no {action} event in the trace")
    text = "\n".join(bad) + "\n"
    assert _parse_fast(text, "t") is None
    with pytest.raises(TraceError, match=f"{key} = 7: must be null: a {action} event"):
        parse_trace(text)


@pytest.mark.parametrize("action, key", _cases(GROUP_SHAPES))
def test_a_group_trace_with_a_field_its_action_leaves_null_is_refused(
        tmp_path: Path, action: str, key: str) -> None:
    texts = simulate_group(C2)
    bad = _set_field(texts[1].splitlines(), action, key)
    if bad is None:
        pytest.skip(f"no {action} event in rank 1's trace")
    paths = write_group([texts[0], "\n".join(bad) + "\n"], tmp_path)
    with pytest.raises(TraceError, match=f"{key} = 7: must be null: a {action} event"):
        check_group([str(p) for p in paths])


def test_the_clean_traces_are_still_accepted(trace_text: str, tmp_path: Path) -> None:
    assert _parse_fast(trace_text, "t") is not None
    paths = write_group(simulate_group(C2), tmp_path)
    assert check_group([str(p) for p in paths])[0].accepted
