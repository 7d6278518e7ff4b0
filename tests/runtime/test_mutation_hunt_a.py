"""Tests that kill hand-written runtime mutants the rest of the suite let through.

Each was found by a mutation hunt over runtime/plancache.py, runtime/trace.py,
runtime/options.py and runtime/arguments.py: a plausible one-line bug (a permission
dropped, a path resolved too late, a boundary moved by one, a caller's mapping kept by
reference) under which every existing test still passed. Each test states the
behaviour a library user sees and fails with its mutant applied.

The suite turns the plan cache off (tests/conftest.py); the plan-cache tests here give
it a folder of their own, as tests/runtime/test_plancache.py does.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from kvgrant.layout.geometry import Geometry, load_geometry
from kvgrant.layout.plan import PhysicalPlan
from kvgrant.layout.rules import reference_plan
from kvgrant.runtime.plancache import PLAN_CACHE_ENV, cached_packed_plan

ROOT = Path(__file__).resolve().parents[2]
SMALL = ROOT / "examples" / "small.json"


@pytest.fixture
def g() -> Geometry:
    return load_geometry(SMALL)


def _umask() -> int:
    """The process's umask, read without changing it."""
    with open("/proc/self/status", encoding="ascii") as f:
        for line in f:
            if line.startswith("Umask:"):
                return int(line.split()[1], 8)
    return 0o022


# ------------------------------------------------------------------ plancache.py
def test_a_cache_entry_is_readable_by_the_hosts_other_users(g: Geometry,
                                                             tmp_path: Path) -> None:
    """The entry a process writes is mode 0644 less the umask, so rank processes of
    other users on the host read it instead of planning again (mutant: the fchmod was
    dropped and the entry kept mkstemp's 0600)."""
    env = {PLAN_CACHE_ENV: str(tmp_path)}
    plans: list[str] = []

    def plan(geometry: Geometry) -> PhysicalPlan:
        plans.append(geometry.name)
        return reference_plan(geometry)

    cached_packed_plan(g, plan, {"a": 1}, env=env)
    (entry,) = tmp_path.glob("*.json")
    assert plans == [g.name]
    assert stat.S_IMODE(os.stat(entry).st_mode) == 0o644 & ~_umask()


# ------------------------------------------------------------------ trace.py
@pytest.mark.parametrize("renderer", ["process", "thread"])
def test_a_relative_trace_path_is_the_file_in_the_folder_it_was_named_in(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, renderer: str) -> None:
    """The trace file is created at its first line, maybe after the caller changed
    its working folder; a relative path still names the file in the folder where the
    writer was made (mutant: the path was kept relative and the file landed in the
    folder current at the first line)."""
    from kvgrant.runtime.trace import TraceWriter

    first, later = tmp_path / "first", tmp_path / "later"
    first.mkdir()
    later.mkdir()
    monkeypatch.chdir(first)
    tw = TraceWriter("t.ndjson", renderer=renderer)
    monkeypatch.chdir(later)
    with tw:
        tw.header(ranks=1)
    assert tw.error is None, tw.error
    assert (first / "t.ndjson").read_text().startswith('{"kind": "header"')
    assert not (later / "t.ndjson").exists()


# ------------------------------------------------------------------ options.py
def test_the_largest_handle_budget_is_accepted_and_one_more_is_refused() -> None:
    """``HandleBudget`` takes counts up to MAX_HANDLES (10**15, the CLI's cap)
    inclusive, as ``--handle-budget 1000000000000000`` does (mutant: ``>=``, the cap
    itself refused)."""
    from kvgrant.errors import ArgumentError
    from kvgrant.runtime.options import MAX_HANDLES, HandleBudget

    assert HandleBudget(handles=MAX_HANDLES, reserve=MAX_HANDLES).limits() == (
        MAX_HANDLES, MAX_HANDLES)
    with pytest.raises(ArgumentError, match=r"HandleBudget\.handles = .*must be at most"):
        HandleBudget(handles=MAX_HANDLES + 1)


def test_a_backend_keeps_the_options_it_checked() -> None:
    """``Backend(name, options)`` holds a copy of the options it checked: a caller that
    changes its dict afterwards (a typo'd key, another handle budget) changes nothing
    the driver is opened with (mutant: the caller's dict was wrapped, not copied, so an
    unchecked key reached the driver's constructor)."""
    from kvgrant.runtime.options import Backend

    options: dict[str, object] = {"handle_budget": 100}
    backend = Backend("sim", options)
    options["handle_budget"] = 5
    options["granularty"] = 1  # a key no sim driver takes
    assert dict(backend.options) == {"handle_budget": 100}


# ------------------------------------------------------------------ trace.py (more)
def test_a_trace_in_folders_that_do_not_exist_yet_is_made_with_them(tmp_path: Path) -> None:
    """A trace path below several missing folders is written: the folders are made at
    the first line (mutant: only the last folder was made, and the trace was lost with
    "cannot open for writing")."""
    from kvgrant.runtime.trace import TraceWriter

    path = tmp_path / "a" / "b" / "c" / "t.ndjson"
    with TraceWriter(path, renderer="thread") as tw:
        tw.header(ranks=1)
    assert tw.error is None, tw.error
    assert path.read_text().startswith('{"kind": "header"')


# ------------------------------------------------------------------ arguments.py
def test_a_blank_ledger_path_is_refused_naming_the_field() -> None:
    """``HandleBudget(ledger="  ")`` is refused like an empty path, as the CLI refuses
    ``--ledger "  "`` (mutant: only the empty string was refused, and a blank one became
    a ledger file named by spaces in the working folder)."""
    from kvgrant.errors import ArgumentError
    from kvgrant.runtime.options import HandleBudget

    with pytest.raises(ArgumentError, match=r"HandleBudget\.ledger = .*not an empty string"):
        HandleBudget(ledger="   ")
