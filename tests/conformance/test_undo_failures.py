"""Failed undo steps (audit finding R1, 2026-12-07): a failed cuMemUnmap, cuMemRelease or
cuMemAddressFree while aborting or shutting down -- ImportUnmap / ImportRelease too in a
one-process-per-rank group -- is the model's ``UndoFail``: the object is leaked (stays
live, never undone again), the rank goes on unwinding the rest in the same LIFO order, as
the runtime's Transaction does, and it never reaches AbortComplete / ShutdownComplete
(``UndoFailureNeverCompletes``). The traces of real sim runs with such a failure conform,
with both engines; a trace that declares the attempt complete after a failed undo, frees
a VA under a leaked mapping, retries a failed undo, or records the object gone is
rejected at that event, by both engines."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from _conform_support import needs_java
from kvgrant.conformance.group_io import load_group
from kvgrant.conformance.group_replay import replay_group, replay_group_files
from kvgrant.conformance.replay import replay
from kvgrant.conformance.tla_trace import check_group_tlc, check_trace_tlc
from kvgrant.conformance.trace_io import load_trace, parse_trace_lines
from kvgrant.layout.geometry import parse_geometry
from kvgrant.runtime import allocate
from kvgrant.runtime.faults import Fault
from kvgrant.runtime.sim import SimDriver

SMALL = Path(__file__).resolve().parents[2] / "examples" / "small.json"
_OK = (None, "CUDA_SUCCESS", "SUCCESS")


def _small():
    return parse_geometry(json.loads(SMALL.read_text()))


def _one_process(path: Path, faults: list[Fault]) -> str:
    """examples/small.json on the sim driver (3 ranks, one process), ``faults``
    injected, released when it published; returns how it ended."""
    drv = SimDriver(devices=3, faults=faults)
    try:
        res = allocate(_small(), driver=drv, trace=path)
    except Exception:  # noqa: BLE001 - the abort is the point
        return "aborted"
    try:
        res.release()
    except Exception:  # noqa: BLE001 - a failed undo is the point
        return "release failed"
    return "released"


def _failed(lines: list[str]) -> list[tuple[Any, str]]:
    out = []
    for ln in lines[1:]:
        e = json.loads(ln)
        if e.get("result") not in _OK:
            out.append((e["action"], e["args"].get("mapping")))
    return out


@pytest.fixture(scope="module")
def sweep(tmp_path_factory: pytest.TempPathFactory) -> dict[int, Path]:
    """`kvgrant alloc examples/small.json --backend sim --fail-at N` for every N of the
    release (103..162; 97..102 fail the start-up), in process: N -> trace."""
    d = tmp_path_factory.mktemp("undo")
    out = {}
    for n in range(97, 163):
        p = d / f"t{n}.ndjson"
        _one_process(p, [Fault(nth=n)])
        out[n] = p
    return out


def test_every_failed_undo_of_the_release_conforms(sweep) -> None:
    kinds = set()
    for n, p in sweep.items():
        v = replay(load_trace(p))
        assert v.accepted, (n, v.summary())
        lines = p.read_text().splitlines()
        fails = _failed(lines)
        if n >= 103:
            assert fails and fails[0][0] in ("Unmap", "Release", "Free"), (n, fails)
            kinds.add(fails[0])
            assert v.final_phase == "ShuttingDown" and "undo failed" in v.summary()
            assert json.loads(lines[-1])["action"] != "ShutdownComplete"
    # a failed Unmap of a plane and of an alias, a failed Release, a failed Free
    assert {("Unmap", "plane"), ("Unmap", "alias"), ("Release", None), ("Free", None)} <= kinds


def test_a_failed_unmap_leaves_a_free_the_driver_refuses(sweep) -> None:
    """N = 105: rank 2's cuMemUnmap of an alias fails; the runtime unmaps its plane,
    releases its handle and the older allocations, then cuMemAddressFree fails
    (CUDA_ERROR_INVALID_VALUE: a mapping is still in the range). The model allows the
    plane's unmap past the leaked alias (the driver keeps the memory of a live mapping)
    but never a Free under it."""
    lines = sweep[105].read_text().splitlines()
    assert _failed(lines) == [("Unmap", "alias"), ("Free", None)]
    free = next(json.loads(x) for x in lines[1:] if json.loads(x)["action"] == "Free"
                and json.loads(x)["result"] != "CUDA_SUCCESS")
    assert free["result"] == "CUDA_ERROR_INVALID_VALUE"
    assert replay(load_trace(sweep[105])).accepted


def test_an_abort_whose_undo_failed_conforms(tmp_path: Path) -> None:
    """The abort path: the third cuMemMap fails, then an undo fails (cuMemUnmap,
    cuMemRelease or cuMemAddressFree); the trace ends in Aborting, with no
    AbortComplete, and conforms."""
    for call in ("cuMemUnmap", "cuMemRelease", "cuMemAddressFree"):
        p = tmp_path / f"{call}.ndjson"
        assert _one_process(p, [Fault(nth=3, call="cuMemMap"), Fault(nth=1, call=call)]) \
            == "aborted"
        lines = p.read_text().splitlines()
        assert [a for a, _ in _failed(lines)][:2] == ["Map", {"cuMemUnmap": "Unmap",
                                                             "cuMemRelease": "Release",
                                                             "cuMemAddressFree": "Free"}[call]]
        assert json.loads(lines[-1])["state"]["phase"] == "Aborting"
        v = replay(load_trace(p))
        assert v.accepted and v.final_phase == "Aborting", (call, v.summary())


# --- wrong traces: rejected at the event --------------------------------------------------

def _edit(lines: list[str], fn) -> tuple[list[str], int]:
    head, evs = lines[0], [json.loads(x) for x in lines[1:]]
    index = fn(evs)
    return [head] + [json.dumps({**e, "seq": k}) for k, e in enumerate(evs)], index


def _complete_appended(evs: list[dict[str, Any]]) -> int:
    last = evs[-1]
    evs.append({**last, "seq": len(evs), "rank": None, "action": "ShutdownComplete",
                "args": {}, "call": None, "result": None, "device": None, "va": None,
                "size": None, "handle": None, "state": {"phase": "Shutdown"}})
    return len(evs) - 1


def _free_succeeds(evs: list[dict[str, Any]]) -> int:
    i = next(k for k, e in enumerate(evs) if e["action"] == "Free" and e["result"] not in _OK)
    evs[i]["result"] = "CUDA_SUCCESS"
    evs[i]["state"].update(va=False, ready=False)
    return i


def _unmap_retried(evs: list[dict[str, Any]]) -> int:
    i = next(k for k, e in enumerate(evs) if e["action"] == "Unmap" and e["result"] not in _OK)
    retry = json.loads(json.dumps(evs[i]))
    retry["result"] = "CUDA_SUCCESS"
    st = retry["state"]
    st["mapped" if retry["args"]["mapping"] == "plane" else "alias_mapped"] -= 1
    st["grants"] -= 1
    evs.insert(i + 1, retry)
    return i + 1


def _failed_unmap_records_it_gone(evs: list[dict[str, Any]]) -> int:
    i = next(k for k, e in enumerate(evs) if e["action"] == "Unmap" and e["result"] not in _OK)
    evs[i]["state"]["mapped"] -= 1
    return i


WRONG = {
    "ShutdownComplete after a failed undo": (_complete_appended, "after a failed undo"),
    "cuMemAddressFree under a leaked mapping succeeds": (_free_succeeds, "not enabled"),
    "a failed cuMemUnmap retried": (_unmap_retried, "not enabled"),
    "a failed cuMemUnmap recorded as unmapped": (_failed_unmap_records_it_gone,
                                                 "recorded state disagrees"),
}


@pytest.mark.parametrize("name", list(WRONG))
def test_wrong_traces_after_a_failed_undo_are_rejected(sweep, name: str) -> None:
    fn, reason = WRONG[name]
    lines, index = _edit(sweep[103].read_text().splitlines(), fn)
    v = replay(parse_trace_lines(lines, source=name))
    assert not v.accepted and v.index == index, v.summary()
    assert reason in v.reason, v.reason


@pytest.mark.tlc
def test_the_tlc_engine_agrees_on_failed_undos(sweep) -> None:
    """KVLifecycleTrace.tla accepts the sim traces with a failed Unmap (plane, alias),
    Release and Free, and rejects each wrong trace at the same event as the Python
    engine."""
    needs_java()
    for n in (103, 104, 105, 160):
        t = load_trace(sweep[n])
        v = check_trace_tlc(t, timeout=300)
        assert v.accepted and v.final_phase == "ShuttingDown", (n, v.summary())
    for name, (fn, _) in WRONG.items():
        lines, index = _edit(sweep[103].read_text().splitlines(), fn)
        t = parse_trace_lines(lines, source=name)
        py, tl = replay(t), check_trace_tlc(t, timeout=300)
        assert (py.accepted, py.index) == (tl.accepted, tl.index) == (False, index), name


@pytest.mark.tlc
def test_the_drift_guard_covers_failed_undos() -> None:
    """The Python model and KVLifecycle.tla with one failed undo (MaxUndoFailures = 1):
    the same state graph, UndoFail edges and leaking ends included."""
    needs_java()
    from kvgrant.conformance.drift import check_drift
    from kvgrant.conformance.mutants import make_header

    h = make_header(2, 2, aliased=[0, 1], owner_only=[0], importers={0: [1], 1: []},
                    declared_readers={0: [0, 1], 1: [0, 1]})
    r = check_drift(h, paths=60, seed=3, undo_failures=1)
    assert r.ok, (r.problems, [v.summary() for v in r.rejected[:3]])
    assert r.states > 5000  # (8,672 states on 2026-12-07)


# --- groups (one process per rank) -----------------------------------------------------------

def _group(tmp: Path, faults: dict[int, list[Fault]]) -> list[Path]:
    from tests.runtime._dict_store import run_threads

    drivers = [SimDriver(devices=3, faults=faults.get(r, [])) for r in range(3)]
    for o in run_threads(_small(), drivers, tmp):
        if hasattr(o, "release"):
            try:
                o.release()
            except Exception:  # noqa: BLE001 - a failed undo is the point
                pass
    return sorted(tmp.glob("rank*.ndjson"))


# N -> the failed undo of rank 0 (the calls of `kvgrant alloc --procs 3 --fail-at` count
# 2 more set-up calls in the worker process)
GROUP_CASES = {69: ("ImportUnmap", "Free"), 70: ("ImportRelease",), 86: ("Unmap", "Free"),
               87: ("Release",), 105: ("Free",)}


@pytest.fixture(scope="module")
def groups(tmp_path_factory: pytest.TempPathFactory) -> dict[int, list[Path]]:
    out = {}
    for n in GROUP_CASES:
        out[n] = _group(tmp_path_factory.mktemp(f"undo-g{n}"), {0: [Fault(nth=n)]})
    return out


def test_group_traces_with_a_failed_undo_conform(groups) -> None:
    for n, paths in groups.items():
        lines = paths[0].read_text().splitlines()
        assert tuple(a for a, _ in _failed(lines)) == GROUP_CASES[n]
        v = replay_group_files(paths)
        assert v.accepted, (n, v.summary())
        assert v.final[0] == "ShuttingDown (an undo failed: objects left live)"
        assert v.final[1] == v.final[2] == "Shutdown"
        assert (0, -1) not in v.order  # not taken for a crash


def test_a_group_sweep_of_the_release_conforms(tmp_path: Path) -> None:
    """Every driver call of rank 0's release failed in turn (ImportUnmap, ImportRelease,
    Unmap, Release, Free of every allocation): every group conforms."""
    for n in range(69, 106):   # 66..68 fail the imports, 106 on is past the release
        d = tmp_path / str(n)
        d.mkdir()
        paths = _group(d, {0: [Fault(nth=n)]})
        failed = [a for a, _ in _failed(paths[0].read_text().splitlines())]
        assert failed and failed[0] in ("ImportUnmap", "ImportRelease", "Unmap", "Release",
                                        "Free"), (n, failed)   # the fault hit an undo
        v = replay_group_files(paths)
        assert v.accepted, (n, v.summary())


def test_a_group_abort_whose_undo_failed_conforms(tmp_path: Path) -> None:
    """Rank 1's third cuMemMap fails, then its first cuMemUnmap of the unwinding: rank 1
    ends in Aborting (no AbortComplete), rank 0 in Aborted; the group conforms."""
    paths = _group(tmp_path, {1: [Fault(nth=3, call="cuMemMap"),
                                  Fault(nth=1, call="cuMemUnmap")]})
    v = replay_group_files(paths)
    assert v.accepted, v.summary()
    assert v.final[1] == "Aborting (an undo failed: objects left live)"
    assert v.final[0] == "Aborted"


def _group_complete_appended(paths: list[Path], tmp: Path) -> tuple[list[Path], int]:
    """Rank 0's file, after its failed undo, still ends with ShutdownComplete."""
    lines = paths[0].read_text().splitlines()
    last = json.loads(lines[-1])
    ev = {**last, "seq": last["seq"] + 1, "action": "ShutdownComplete", "args": {},
          "call": None, "result": None, "va": None, "size": None, "handle": None,
          "state": {**last["state"], "phase": "Shutdown"}}
    tmp.mkdir()
    out = []
    for p in paths:
        q = tmp / p.name
        q.write_text(p.read_text() + (json.dumps(ev) + "\n" if p == paths[0] else ""))
        out.append(q)
    return out, ev["seq"]


def test_a_group_that_completes_after_a_failed_undo_is_rejected(groups, tmp_path: Path) -> None:
    for n in (69, 87):
        bad, seq = _group_complete_appended(groups[n], tmp_path / str(n))
        v = replay_group_files(bad)
        assert not v.accepted and (v.rank, v.index) == (0, seq), v.summary()
        assert "never completes" in v.reason


@pytest.mark.tlc
def test_the_tlc_engine_agrees_on_group_failed_undos(groups, tmp_path: Path) -> None:
    needs_java()
    for n in (69, 87):
        t = load_group(groups[n])
        v = check_group_tlc(t, timeout=300)
        assert v.accepted, (n, v.summary())
        assert v.final[0] == "ShuttingDown (an undo failed: objects left live)"
    bad, seq = _group_complete_appended(groups[69], tmp_path / "bad")
    t = load_group(bad)
    py = replay_group(t)
    tl = check_group_tlc(t, order=py.order, timeout=300)
    assert not tl.accepted and (tl.rank, tl.index) == (py.rank, py.index) == (0, seq)
