"""Trace mutants a second adversarial review found accepted or crashing (2026-12-02);
each test failed on the code before the fix.

1. A failed Grant (and, in a group, a failed ImportGrant) was not checked for the devices
   it was given: a cuMemSetAccess to a declared reader that is not an importer -- the
   field failure's own call, failing at the handle budget -- was accepted as an abort.
2. A key of ``args`` that the action does not take (``alloc`` on RankReady, ``devices``
   on Map, ...) was read anyway: an alloc past the plan crashed the object check
   (IndexError / TypeError), a non-string mapping crashed the rejection's text, and
   non-integer devices crashed the TLC module writer. Both readers now refuse it.
3. TLC's integers are 32 bits: an event's device, counter or Grant ordinal past them
   made TLC refuse the module ("can't handle a number this big") where the Python
   engine rejects the trace, so ``--engine both`` could not agree.
4. A group trace's call (a driver call, sendmsg, all_gather) with ``result: null`` was
   read as a success, and a model-only step with a result was accepted: the group reader
   now holds the one-process reader's rule (a call records what it returned; a
   model-only step has none).
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from kvgrant.cli import main
from kvgrant.conformance.group_gen import simulate_group, write_group
from kvgrant.conformance.group_io import load_group
from kvgrant.conformance.group_model import constants_from
from kvgrant.conformance.group_mutants import parse_texts, to_texts
from kvgrant.conformance.group_replay import replay_group
from kvgrant.conformance.replay import replay
from kvgrant.conformance.tla_trace import (check_group_tlc, check_traces_tlc,
                                           group_module_text, trace_module_text)
from kvgrant.conformance.trace_io import load_trace, parse_trace, parse_trace_lines
from kvgrant.errors import TraceError

from _conform_support import needs_java, record_small_trace

ROOT = Path(__file__).resolve().parents[2]
FAILED = ("CUDA_SUCCESS", "SUCCESS", None)
# as tests/conformance/test_group_replay.py: ranks 0 and 1 import each other, rank 2 is a
# declared reader of all and imports nothing
C3 = constants_from(3, 2, [0, 1], [1], {0: [1], 1: [0], 2: []},
                    {r: [0, 1, 2] for r in range(3)})




def _text(lines: list[str]) -> str:
    return "\n".join(lines) + "\n"


def _failed_grant(tmp_path: Path) -> tuple[list[str], int]:
    """The --fail-at 40 trace: rank 0's plane Grant of alloc 6 fails (devices [0, 1]),
    then Abort and the unwinding."""
    lines = record_small_trace(tmp_path, "--fail-at", "40")
    i = next(k for k, ln in enumerate(lines) if k and json.loads(ln)["result"] not in FAILED)
    ev = json.loads(lines[i])
    assert ev["action"] == "Grant" and ev["rank"] == 0 and ev["args"]["devices"] == [0, 1]
    return lines, i


# --- 1. a failed Grant is checked for the devices it was given ------------------------------

_WRONG_DEVICES = {"declared_reader": [0, 1, 2], "missing_importer": [0],
                  "unknown_ordinal": [0, 1, 9]}


@pytest.mark.parametrize("fast", [True, False], ids=["writer-line", "other-key-order"])
@pytest.mark.parametrize("case", sorted(_WRONG_DEVICES))
def test_a_failed_grant_must_name_owner_and_importers(tmp_path, case, fast) -> None:
    lines, i = _failed_grant(tmp_path)
    devices = _WRONG_DEVICES[case]
    if fast:  # the writer's line: the fast reader and the row replay take it
        lines[i] = lines[i].replace('"devices": [0, 1]', f'"devices": {json.dumps(devices)}')
    else:
        ev = json.loads(lines[i])
        ev["args"]["devices"] = devices
        lines[i] = json.dumps(ev, sort_keys=True)
    t = parse_trace(_text(lines))
    assert (t.rows is not None) is fast
    v = replay(t)
    assert not v.accepted and v.index == i - 1, v.summary()
    assert "was asked (and failed, CUDA_ERROR_OUT_OF_MEMORY) to grant" in v.reason
    assert "GrantSet is [0, 1]" in v.reason


def test_the_failed_grant_with_the_model_devices_is_still_accepted(tmp_path) -> None:
    lines, _ = _failed_grant(tmp_path)
    assert replay(parse_trace(_text(lines))).accepted


@pytest.mark.tlc
def test_tlc_agrees_on_the_failed_grant_mutants(tmp_path) -> None:
    needs_java()
    lines, i = _failed_grant(tmp_path)
    traces = [parse_trace(_text(lines))]
    for devices in (_WRONG_DEVICES["declared_reader"], _WRONG_DEVICES["missing_importer"]):
        mutated = list(lines)
        mutated[i] = mutated[i].replace('"devices": [0, 1]', f'"devices": {json.dumps(devices)}')
        traces.append(parse_trace(_text(mutated)))
    verdicts = check_traces_tlc(traces, jobs=2)
    assert [v.accepted for v in verdicts] == [True, False, False]
    assert [v.index for v in verdicts[1:]] == [i - 1, i - 1]


def _group_with_failed(p: int, k: int, tmp_path: Path, devices: list[int] | None):
    """simulate_group(C3) with process p's k-th forward step failing, that step's devices
    replaced (None: as the model gives them); returns (group, seq of the failed step)."""
    heads, evs = parse_texts(simulate_group(C3, fail_at={p: k}))
    seq = next(e["seq"] for e in evs[p] if e["result"] not in FAILED)
    if devices is not None:
        evs[p][seq]["args"]["devices"] = devices
    d = tmp_path / f"g{p}-{k}-{devices}"
    write_group(to_texts(heads, evs), d)
    return load_group([d]), seq


# (process, forward step that fails): rank 1's own plane Grant of alloc 0, rank 0's
# ImportGrant of rank 1's alloc 0 (plane)
_GROUP_FAILS = {"Grant": (1, 4), "ImportGrant": (0, 18)}


@pytest.mark.parametrize("devices", [[0, 1], [2], []], ids=str)
@pytest.mark.parametrize("action", sorted(_GROUP_FAILS))
def test_a_failed_group_grant_must_name_the_own_device(tmp_path, action, devices) -> None:
    p, k = _GROUP_FAILS[action]
    clean, _ = _group_with_failed(p, k, tmp_path, None)
    assert replay_group(clean).accepted
    t, seq = _group_with_failed(p, k, tmp_path, devices)
    assert t.procs[p].raw_event(seq)["action"] == action
    v = replay_group(t)
    assert not v.accepted and (v.rank, v.index) == (p, seq), v.summary()
    assert f"a failed {action} was asked to grant ranks" in v.reason
    assert f"own device only (rank {p})" in v.reason


@pytest.mark.tlc
@pytest.mark.parametrize("action", sorted(_GROUP_FAILS))
def test_tlc_agrees_on_the_failed_group_grant_mutants(tmp_path, action) -> None:
    needs_java()
    p, k = _GROUP_FAILS[action]
    clean, _ = _group_with_failed(p, k, tmp_path, None)
    assert check_group_tlc(clean).accepted
    t, seq = _group_with_failed(p, k, tmp_path, [0, 1])
    v = check_group_tlc(t)
    assert not v.accepted and (v.rank, v.index) == (p, seq)


# --- 2. args keys an action does not take are refused, never read ---------------------------

_MISPLACED = [
    ("RankReady", "alloc", 999),       # old: IndexError in the object check
    ("RankReady", "alloc", "x"),       # old: TypeError in the object check
    ("RankReady", "alloc", 3),         # old: accepted (read as an allocation)
    ("Reserve", "alloc", 3),
    ("Free", "mapping", "plane"),
    ("Map", "mapping", [1]),           # old: TypeError writing the rejection
    ("Map", "devices", ["x"]),         # old: TypeError writing the TLC module
    ("Create", "devices", [0, 1, 2]),
    ("Unmap", "devices", [0, 1, 2]),
    ("Publish", "alloc", 0),
    ("Publish", "failed_rank", 0),
]


def _misplaced(tmp_path: Path, action: str, key: str, value) -> tuple[list[str], int]:
    lines = record_small_trace(tmp_path)
    i = next(k for k, ln in enumerate(lines) if k and json.loads(ln)["action"] == action)
    ev = json.loads(lines[i])
    ev["args"][key] = value
    lines[i] = json.dumps(ev)  # the writer's key order and spacing: the fast reader tries it
    return lines, i


@pytest.mark.parametrize("action, key, value", _MISPLACED, ids=lambda x: str(x))
def test_an_args_key_the_action_does_not_take_is_refused(tmp_path, capsys, action, key,
                                                          value) -> None:
    lines, i = _misplaced(tmp_path, action, key, value)
    with pytest.raises(TraceError) as fast:
        parse_trace(_text(lines))
    with pytest.raises(TraceError) as slow:
        parse_trace_lines(lines)
    assert str(fast.value) == str(slow.value) and fast.value.line == i + 1
    assert f"args.{key} = " in str(fast.value) and f"{action} takes no {key}" in str(fast.value)
    path = tmp_path / "m.ndjson"
    path.write_text(_text(lines))
    capsys.readouterr()
    for engine in ("python", "tlc"):  # refused before either engine runs (no Java needed)
        assert main(["conform", str(path), "--engine", engine, "--json"]) == 2
        doc = json.loads(capsys.readouterr().out)
        assert doc["error"] == "malformed" and doc["line"] == i + 1


# --- 3. the TLC module holds only 32-bit integers -------------------------------------------

_HUGE = 1 << 40
_INT_LITERAL = re.compile(r"(?<![\w.])-?\d+")


def _big_integers(module: str) -> list[int]:
    body = module.split("\n", 2)[2]  # past the generated-from line (it names a path)
    return [int(x) for x in _INT_LITERAL.findall(body) if abs(int(x)) > (1 << 31) - 1]


def _huge_mutants(tmp_path: Path) -> list[tuple[list[str], int]]:
    out = []
    for action, edit in (("Map", lambda ev: ev.update(device=_HUGE)),
                         ("Grant", lambda ev: ev["state"].update(grants=_HUGE)),
                         ("Grant", lambda ev: ev["args"].update(devices=[0, _HUGE]))):
        lines = record_small_trace(tmp_path)
        i = next(k for k, ln in enumerate(lines) if k and json.loads(ln)["action"] == action)
        ev = json.loads(lines[i])
        edit(ev)
        lines[i] = json.dumps(ev)
        out.append((lines, i))
    return out


def test_the_trace_module_holds_only_tlc_sized_integers(tmp_path) -> None:
    for lines, i in _huge_mutants(tmp_path):
        t = parse_trace(_text(lines))
        v = replay(t)
        assert not v.accepted and v.index == i - 1
        assert _big_integers(trace_module_text(t)) == []


def test_the_group_module_holds_only_tlc_sized_integers(tmp_path) -> None:
    heads, evs = parse_texts(simulate_group(C3))
    k = next(j for j, e in enumerate(evs[2]) if e["action"] == "Map")
    evs[2][k]["device"] = _HUGE
    g = next(j for j, e in enumerate(evs[2]) if e["action"] == "Grant")
    evs[2][g]["state"]["grants"] = _HUGE
    write_group(to_texts(heads, evs), tmp_path / "g")
    t = load_group([tmp_path / "g"])
    v = replay_group(t)
    assert not v.accepted and (v.rank, v.index) == (2, k)
    every = [(p, j) for p in range(3) for j in range(len(t.procs[p].rows))]
    assert _big_integers(group_module_text(t, every)) == []


@pytest.mark.tlc
def test_tlc_rejects_the_huge_integer_mutants_where_python_does(tmp_path) -> None:
    needs_java()
    cases = _huge_mutants(tmp_path)
    verdicts = check_traces_tlc([parse_trace(_text(lines)) for lines, _ in cases], jobs=2)
    assert [(v.accepted, v.index) for v in verdicts] == [(False, i - 1) for _, i in cases]


# --- 4. a group call records its result; a model-only step has none -------------------------

@pytest.mark.parametrize("writer_line", [True, False], ids=["writer-line", "other-key-order"])
@pytest.mark.parametrize("action, result", [("Grant", None), ("Unmap", None), ("Vote", None),
                                            ("Send", None), ("RankReady", "CUDA_SUCCESS"),
                                            ("Decide", "SUCCESS")])
def test_a_group_call_names_its_result_and_a_model_step_none(tmp_path, action, result,
                                                             writer_line) -> None:
    heads, evs = parse_texts(simulate_group(C3))
    p = 0
    k = next(j for j, e in enumerate(evs[p]) if e["action"] == action)
    evs[p][k]["result"] = result
    texts = to_texts(heads, evs)
    if not writer_line:  # the detailed reader only
        lines = texts[p].splitlines()
        lines[k + 1] = json.dumps(json.loads(lines[k + 1]), sort_keys=True)
        texts[p] = "\n".join(lines) + "\n"
    write_group(texts, tmp_path / "g")
    with pytest.raises(TraceError) as err:
        load_group([tmp_path / "g"])
    assert err.value.line == k + 2
    assert (f"result = null: {action} is a call" if result is None else
            f"result = {result!r}: {action} is a model-only step") in str(err.value)


# --- 5. a key named twice in one JSON object (json.loads kept the last silently) -------

def _twice(line: str, key: str, value: str) -> str:
    """``line`` with ``"key": value`` inserted before its first ``"key"``."""
    at = line.index(f'"{key}"')
    return line[:at] + f'"{key}": {value}, ' + line[at:]


@pytest.mark.parametrize("where, key, value", [(0, "ranks", "2"), (5, "rank", "2"),
                                               (5, "action", '"Publish"')])
def test_a_trace_line_naming_a_key_twice_is_refused(tmp_path: Path, capsys,
                                                    where: int, key: str, value: str) -> None:
    lines = record_small_trace(tmp_path)
    lines[where] = _twice(lines[where], key, value)
    with pytest.raises(TraceError, match=f'key "{key}" appears twice') as err:
        parse_trace("\n".join(lines) + "\n")
    assert err.value.line == where + 1
    path = tmp_path / "dup.ndjson"
    path.write_text("\n".join(lines) + "\n")
    capsys.readouterr()  # the recording's own output
    assert main(["conform", str(path), "--json"]) == 2
    assert json.loads(capsys.readouterr().out)["error"] == "malformed"


def test_a_group_trace_line_naming_a_key_twice_is_refused(tmp_path: Path, capsys) -> None:
    import shutil

    d = tmp_path / "g"
    shutil.copytree(ROOT / "tests" / "fixtures" / "group" / "2proc-published-shutdown", d)
    f = d / "rank1.ndjson"
    lines = f.read_text().splitlines()
    lines[3] = _twice(lines[3], "rank", "0")
    f.write_text("\n".join(lines) + "\n")
    assert main(["conform", str(d)]) == 2
    assert 'key "rank" appears twice' in capsys.readouterr().err
