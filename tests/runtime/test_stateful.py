"""Stateful test: the sim runtime against the Python model, step by step.

A Hypothesis state machine allocates caches (several live at once, each on its own
simulated driver), injects a fault at any driver call, and releases caches in any
order. After every step it replays each cache's trace through the Python model and
checks the runtime's live driver objects against the model's state: what the model
says is held (VA reservations, handles, mappings, grants) is exactly what the driver
holds, a failed attempt leaves nothing, a released cache leaves nothing.
"""

from __future__ import annotations

import itertools
from pathlib import Path

import pytest
from hypothesis import settings, strategies as st
from hypothesis.stateful import Bundle, RuleBasedStateMachine, consumes, invariant, rule

from kvgrant.conformance.model import ModelState
from kvgrant.conformance.replay import replay, state_before
from kvgrant.conformance.trace_io import load_trace
from kvgrant.errors import AllocationError
from kvgrant.runtime import allocate
from kvgrant.runtime.driver import LiveCounts
from kvgrant.runtime.faults import Fault
from kvgrant.runtime.sim import SimDriver

from _small import chunk_plan, small_geometry

#: driver calls a clean small-test allocation makes, per plan (measured once per run)
_CALLS: dict[str, int] = {}


def _model_live(s: ModelState) -> LiveCounts:
    """What the model says the driver holds: one reservation per rank with ``va``."""
    return LiveCounts(
        handles=sum(len(r.created) for r in s.ranks),
        mappings=sum(len(r.mapped) + len(r.alias_mapped) for r in s.ranks),
        grants=sum(r.grants for r in s.ranks),
        reservations=sum(1 for r in s.ranks if r.va),
    )


def _without_bytes(live: LiveCounts) -> LiveCounts:
    return LiveCounts(live.handles, live.mappings, live.grants, 0, live.reservations)


def _plan(label: str):  # noqa: ANN202 - a plan object or a label allocate() resolves
    return chunk_plan(small_geometry()) if label == "chunks" else label


def _clean_calls(label: str) -> int:
    if label not in _CALLS:
        d = SimDriver(devices=3)
        with allocate(small_geometry(), plan=_plan(label), driver=d, backend="sim"):
            _CALLS[label] = sum(d.calls.values())  # start-up only, not the teardown
        d.close()
    return _CALLS[label]


class RuntimeAgainstModel(RuleBasedStateMachine):
    """Live caches and their traces; every step re-checks runtime vs model."""

    caches = Bundle("caches")

    def __init__(self) -> None:
        super().__init__()
        self.dir = Path(_TMP) / f"m{next(_RUNS)}"
        self.dir.mkdir()
        self.n = 0
        self.live: dict[int, tuple[object, SimDriver, Path]] = {}

    def _trace_path(self) -> Path:
        self.n += 1
        return self.dir / f"t{self.n}.ndjson"

    @rule(target=caches, label=st.sampled_from(["naive", "chunks", "packed"]))
    def allocate_cache(self, label: str) -> int:
        path = self._trace_path()
        d = SimDriver(devices=3)
        cache = allocate(small_geometry(), plan=_plan(label), driver=d, backend="sim",
                         trace=path)
        cache.flush_trace()
        s = state_before(load_trace(path), len(load_trace(path).events))
        assert s.phase == "Published"
        assert _model_live(s) == _without_bytes(d.live())
        self.live[self.n] = (cache, d, path)
        return self.n

    @rule(label=st.sampled_from(["naive", "chunks", "packed"]), data=st.data())
    def failed_attempt(self, label: str, data: st.DataObject) -> None:
        k = data.draw(st.integers(1, _clean_calls(label)), label="failing call")
        path = self._trace_path()
        d = SimDriver(devices=3, faults=[Fault(nth=k)])
        with pytest.raises(AllocationError) as info:
            allocate(small_geometry(), plan=_plan(label), driver=d, backend="sim", trace=path)
        assert d.live().is_empty(), f"call {k} failed and left {d.live()}"
        assert info.value.call is not None
        # a query before the first lifecycle step (granularity, free memory) failing is
        # traced too: that rank's failed Reserve naming it, Abort, AbortComplete
        assert path.exists() and path.stat().st_size > 0, info.value
        if "before anything was created" in str(info.value):
            assert d.calls["cuMemAddressReserve"] == 0
        trace = load_trace(path)
        verdict = replay(trace)
        assert verdict.accepted, verdict.summary()
        s = state_before(trace, len(trace.events))
        assert s.phase == "Aborted" and all(r.empty() for r in s.ranks)
        assert info.value.rank is not None

    @rule(key=consumes(caches))
    def release(self, key: int) -> None:
        cache, d, path = self.live.pop(key)
        cache.release()  # type: ignore[attr-defined]
        assert d.live().is_empty()
        trace = load_trace(path)
        verdict = replay(trace)
        assert verdict.accepted and verdict.final_phase == "Shutdown", verdict.summary()

    @invariant()
    def every_live_cache_holds_what_its_model_says(self) -> None:
        for cache, d, path in self.live.values():
            trace = load_trace(path)
            s = state_before(trace, len(trace.events))
            assert s.phase == "Published"
            assert _model_live(s) == _without_bytes(d.live())
            assert cache.live() == d.live()  # type: ignore[attr-defined]

    def teardown(self) -> None:
        for cache, _, _ in self.live.values():
            cache.release()  # type: ignore[attr-defined]


_RUNS = itertools.count()
_TMP = ""


@pytest.fixture(autouse=True)
def _tmp_for_machine(tmp_path: Path) -> None:
    global _TMP
    _TMP = str(tmp_path)


TestRuntimeAgainstModel = RuntimeAgainstModel.TestCase
TestRuntimeAgainstModel.settings = settings(max_examples=15, stateful_step_count=6,
                                            deadline=None)
