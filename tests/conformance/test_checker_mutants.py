"""Traces that kill mutants of the checker's own code (docs/mutation-score.md,
"Checker mutants (2026-12-07)").

Each fixture in tests/fixtures/checker_mutants is a simulated run of
examples/small.json (some with ``--fail-at``) with one edit, which the checker must
reject and a mutant of it accepted: a successful Grant missing one importer (the row
replay compared device sets as a subset), a failed step's recorded ``failed`` flag, an
end where one rank leaked and another still holds objects, a Create before the previous
allocation's alias Grant, a RankReady without the last allocation's alias mapping, a
Free while a rank that leaked still holds an unleaked handle, an AbortComplete after a
failed Release, a failed call naming the wrong device, handle or size, and a set-up
query that fails after a rank reserved. Both readers are held to the same verdict: the
fast reader of the writer's format (with its row replay) and the detailed one.
The group cases are made here from a group of threads (tests/runtime/_dict_store.py).
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from kvgrant.conformance.group_check import check_group
from kvgrant.conformance.replay import replay
from kvgrant.conformance.trace_io import parse_trace, parse_trace_lines
from kvgrant.errors import TraceError

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "checker_mutants"

# fixture -> (index of the rejected event, words of the reason)
REJECTED = {
    "m3": (6, "missing: [1]"),
    "m5": (13, "failed False != model True"),
    "m6": (22, "not terminal"),
    "m10": (7, "Create(r0, a1) is not enabled"),
    "m14": (8, "RankReady(r0) is not enabled"),
    "m17": (20, "Free(r0) is not enabled"),
    "m18": (24, "UndoFailureNeverCompletes"),
    "m22": (14, "Map on device 1 but rank 0's device is 0"),
    "m23": (14, "Map of handle 2 but alloc 2's live handle is 3"),
    "m24": (21, "Free of 71303168 bytes but the header's reservation is 73400320 bytes"),
}


def _readers(text: str, source: str):
    """(fast reader's trace, detailed reader's trace) of ``text``."""
    lines = text.rstrip("\n").split("\n")
    return parse_trace(text, source=source), parse_trace_lines(lines, source=source)


@pytest.mark.parametrize("name", sorted(REJECTED))
def test_both_readers_reject_the_edited_trace(name: str) -> None:
    index, words = REJECTED[name]
    fast, detailed = _readers((FIXTURES / f"{name}.ndjson").read_text(), name)
    for trace in (fast, detailed):
        v = replay(trace)
        assert not v.accepted and v.index == index, v.summary()
        assert words in v.reason, v.reason
    assert name not in ("m3", "m31") or fast.rows is not None  # the fast path ran


def test_a_set_up_query_that_fails_after_a_rank_reserved_is_malformed() -> None:
    """m31: rank 2's failed call is cuMemGetInfo (a set-up query) after ranks 0 and 1
    reserved; both readers refuse the file (the fast reader's check was a mutant's
    survivor)."""
    text = (FIXTURES / "m31.ndjson").read_text()
    for read in (lambda: parse_trace(text, source="m31"),
                 lambda: parse_trace_lines(text.rstrip("\n").split("\n"), source="m31")):
        with pytest.raises(TraceError) as info:
            read()
        assert "a set-up query fails only before any rank reserved" in str(info.value)


# --------------------------------------------------------------------- group traces
def _group(tmp_path: Path) -> list[Path]:
    from kvgrant.runtime.group import GroupPublished
    from kvgrant.runtime.sim import SimDriver

    from tests.runtime._dict_store import release_all, run_threads
    from tests.runtime._small import small_geometry

    g = small_geometry()
    n = g.topology.ranks
    outs = run_threads(g, [SimDriver(devices=n) for _ in range(n)], tmp_path)
    assert all(isinstance(o, GroupPublished) for o in outs), outs
    release_all(outs)
    files = [tmp_path / f"rank{r}.ndjson" for r in range(n)]
    assert check_group([str(f) for f in files])[0].accepted
    return files


def _edit(path: Path, pick, new_handle: int) -> int:
    """Give the first event ``pick`` accepts the handle ``new_handle``; its seq."""
    lines = path.read_text().split("\n")
    for i, line in enumerate(lines[1:], 1):
        if line and pick(json.loads(line)):
            ev = json.loads(line)
            lines[i] = line.replace(f'"handle": {ev["handle"]},', f'"handle": {new_handle},', 1)
            assert lines[i] != line
            path.write_text("\n".join(lines))
            return ev["seq"]
    raise AssertionError("no such event")


def _own_handle(path: Path, alloc: int) -> int:
    return next(e["handle"] for e in map(json.loads, path.read_text().split("\n")[1:])
                if e and e["action"] == "Create" and e["args"]["alloc"] == alloc)


def test_an_import_that_returns_a_live_own_handle_is_rejected(tmp_path: Path) -> None:
    """Rank 0's Import of owner 1's alloc 0 returns rank 0's own live handle (a mutant
    compared it with imported handles only)."""
    files = _group(tmp_path)
    own = _own_handle(files[0], 0)
    seq = _edit(files[0], lambda e: e["action"] == "Import" and e["args"]["owner"] == 1
                and e["args"]["alloc"] == 0, own)
    v = check_group([str(f) for f in files])[0]
    assert not v.accepted and "which is still live in this process" in v.reason, v.summary()
    assert f"seq {seq}" in v.summary()


def test_two_creates_that_return_one_handle_are_rejected(tmp_path: Path) -> None:
    """Rank 2's Create of alloc 1 returns alloc 0's live handle, and every later event
    of that allocation names it too (a mutant's fast path, group_fast, dropped the
    distinct-handles check, and nothing else in the file gives it away)."""
    files = _group(tmp_path)
    h0, h1 = _own_handle(files[2], 0), _own_handle(files[2], 1)
    seq = next(e["seq"] for e in map(json.loads, files[2].read_text().split("\n")[1:])
               if e and e["action"] == "Create" and e["args"]["alloc"] == 1)
    text = files[2].read_text()
    assert f'"handle": {h1},' in text
    files[2].write_text(text.replace(f'"handle": {h1},', f'"handle": {h0},'))
    v = check_group([str(f) for f in files])[0]
    assert not v.accepted and "which is still live (rank 2's alloc 0)" in v.reason, v.summary()
    assert f"seq {seq}" in v.summary()


def test_two_files_of_one_rank_are_refused(tmp_path: Path) -> None:
    """A copy of rank 1's file beside it: two files claim rank 1 (a mutant's fast path
    took both)."""
    files = _group(tmp_path)
    copy = tmp_path / "rank1b.ndjson"
    shutil.copy(files[1], copy)
    with pytest.raises(TraceError) as info:
        check_group([str(f) for f in files] + [str(copy)])
    assert "header.rank = 1" in str(info.value) and "has the same rank" in str(info.value)


def test_a_failed_import_from_a_rank_outside_the_import_group_is_rejected(
        tmp_path: Path) -> None:
    """Import groups {0, 3} and {1, 2}: rank 2's first Import fails, and the edit names
    owner 0, a rank it does not import from. No earlier import precedes it (0 sorts
    before rank 2's only source), so only the failed step's own owner check rejects it
    (a mutant of group_model ``_fail_extra`` without that check accepted the group,
    docs/mutation-score.md)."""
    from kvgrant.conformance.group_gen import simulate_group, write_group
    from kvgrant.conformance.group_model import constants_from

    c = constants_from(4, 2, [0, 1], [1], {0: [3], 1: [2], 2: [1], 3: [0]})
    assert c.sources[2] == (1,)
    steps = [e for e in map(json.loads, simulate_group(c, shutdown=False)[2].splitlines()[1:])
             if e["action"] not in ("Vote", "Decide", "Publish")]
    first_import = next(k for k, e in enumerate(steps) if e["action"] == "Import")
    texts = simulate_group(c, fail_at={2: first_import})
    assert check_group([str(p) for p in write_group(texts, tmp_path / "as_run")])[0].accepted
    lines = texts[2].splitlines()
    i, ev = next((i, json.loads(x)) for i, x in enumerate(lines) if '"action": "Import"' in x)
    assert ev["args"] == {"owner": 1, "alloc": 0} and ev["result"] != "CUDA_SUCCESS"
    ev["args"]["owner"] = 0
    lines[i] = json.dumps(ev)
    texts[2] = "\n".join(lines) + "\n"
    v = check_group([str(p) for p in write_group(texts, tmp_path / "edited")])[0]
    assert not v.accepted and "rank 0 is not an owner rank 2 imports from" in v.reason, \
        v.summary()
    assert f"seq {ev['seq']}" in v.summary()
