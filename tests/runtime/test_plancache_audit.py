"""Audit findings on the host's plan cache (runtime/plancache.py) and ``kvgrant plan``'s
pre-flight (kvgrant/commands/plan.py):

* B3: a wait on another process's lock is bounded by the caller (``wait_s``), said
  once when it lasts (naming the holder: pid, what it plans, since when), and a wait
  that runs out is a ``PlanCacheTimeout`` naming the entry, the holder and the wait;
* B4: an entry that is not a regular file (a FIFO) is never opened (the open blocked
  for ever) and never replaced;
* B7: an entry's ``label`` (and ``cache_format``) are checked when it is read: a
  foreign or edited entry is not served, and the process that replaces it says why;
* B5: ``kvgrant plan`` counts the handle reserve ``kvgrant alloc`` enforces
  (``--handle-reserve``, default 4,096).

No test asserts on timing: the lock is held by a thread of the test (blocked on an
event, not a sleep), every wait that could hang runs with a join timeout and is
released in ``finally``.
"""

from __future__ import annotations

import argparse
import fcntl
import json
import os
import sys
import threading
from pathlib import Path
from typing import Any

import pytest

import kvgrant.runtime.plancache as plancache
from kvgrant.errors import ArgumentError, HandleBudgetError, PlanCacheTimeout, PlanError
from kvgrant.layout.geometry import load_geometry
from kvgrant.layout.plan import PhysicalPlan
from kvgrant.layout.planfile import plan_document
from kvgrant.layout.preflight import (DEFAULT_HANDLE_RESERVE, check_handle_budget,
                                      handle_demand)
from kvgrant.layout.rules import naive_plan, reference_plan
from kvgrant.runtime.plancache import PLAN_CACHE_ENV, cached_packed_plan

ROOT = Path(__file__).resolve().parents[2]
SMALL = ROOT / "examples" / "small.json"
LIMITS = {"a": 1}
JOIN_S = 60.0  # only reached when a regression hangs: the test then fails, not hangs


@pytest.fixture
def g():
    return load_geometry(SMALL)


def _counting(plans: list[str], make=reference_plan):
    def plan(g):
        plans.append(g.name)
        return make(g)
    return plan


def _entry(folder: Path, g) -> Path:
    return folder / f"{plancache._key(g, LIMITS)}.json"


class _Holder:
    """A thread that plans ``g`` through the cache and blocks inside the planner (so
    it holds the entry's lock) until :meth:`release`."""

    def __init__(self, g, env: dict[str, str]) -> None:
        self.planning = threading.Event()
        self.go = threading.Event()
        self.result: Any = None

        def slow(gg):
            self.planning.set()
            self.go.wait(JOIN_S)
            return reference_plan(gg)

        def body() -> None:
            try:
                self.result = cached_packed_plan(g, slow, LIMITS, env=env)
            except BaseException as err:  # noqa: BLE001 (reported by the test)
                self.result = err

        self.thread = threading.Thread(target=body, daemon=True)

    def __enter__(self) -> "_Holder":
        self.thread.start()
        assert self.planning.wait(JOIN_S), "the holder never started planning"
        return self

    def release(self) -> None:
        self.go.set()

    def __exit__(self, *exc: object) -> None:
        self.release()
        self.thread.join(JOIN_S)
        assert not self.thread.is_alive()


# -- B3: the lock wait ------------------------------------------------------------------

def test_a_wait_past_its_limit_raises_naming_the_entry_the_holder_and_the_wait(g, tmp_path):
    env = {PLAN_CACHE_ENV: str(tmp_path)}
    said: list[str] = []
    plans: list[str] = []
    with _Holder(g, env) as holder:
        with pytest.raises(PlanCacheTimeout) as err:
            cached_packed_plan(g, _counting(plans), LIMITS, env=env, wait_s=0.05,
                               progress=said.append)
        holder.release()
    e = err.value
    assert isinstance(e, PlanError)  # the existing hierarchy: exit status 1 in the CLI
    assert plans == []  # it did not plan behind the holder's back
    entry = _entry(tmp_path, g)
    assert e.path == str(entry) and e.lock_path == str(entry.with_suffix(".lock"))
    assert e.holder_pid == os.getpid()  # from the holder's lock record
    assert e.holder["geometry"] == g.name and e.wait_s == 0.05
    text = str(e)
    for words in (str(entry), f"pid {os.getpid()}", f"planning {g.name!r}",
                  "wait limit 0.1 s", "kvgrant plan GEOMETRY --json",
                  f"{PLAN_CACHE_ENV}=off", "stop it"):
        assert words in text, words
    assert said == []  # a wait shorter than NOTICE_S is not announced
    # the holder went on: its plan is written, and its record left the lock file
    assert isinstance(holder.result, PhysicalPlan)
    assert entry.is_file() and entry.with_suffix(".lock").read_bytes() == b""


def test_a_long_wait_is_said_once_on_stderr_naming_the_holder_and_the_limit(
        g, tmp_path, monkeypatch):
    """Past NOTICE_S (0 here) the waiter says once who holds the lock and how long it
    will wait; the holder is let go when the line is written, and the waiter then reads
    the holder's plan."""
    env = {PLAN_CACHE_ENV: str(tmp_path)}
    monkeypatch.setattr(plancache, "NOTICE_S", 0.0)
    plans: list[str] = []
    with _Holder(g, env) as holder:
        class Stderr:
            lines: list[str] = []

            def write(self, text: str) -> int:
                self.lines.append(text)
                holder.release()
                return len(text)

            def flush(self) -> None:
                pass

        err = Stderr()
        monkeypatch.setattr(sys, "stderr", err)
        out = cached_packed_plan(g, _counting(plans), LIMITS, env=env, wait_s=JOIN_S)
        monkeypatch.undo()
    said = [ln for ln in "".join(err.lines).splitlines() if ln]
    assert len(said) == 1, said
    line = said[0]
    assert line.startswith("kvgrant: plan cache: ")
    for words in (f"pid {os.getpid()}", f"planning {g.name!r}", str(_entry(tmp_path, g)),
                  "at most", f"wait limit {JOIN_S:,.0f} s"):
        assert words in line, words
    assert plans == []  # read what the holder planned
    assert out.allocations == reference_plan(g).allocations


@pytest.mark.parametrize("bad", [-1, float("nan"), float("inf"), True, "5", 1e12])
def test_the_wait_limit_is_checked(g, tmp_path, bad):
    with pytest.raises(ArgumentError) as err:
        cached_packed_plan(g, _counting([]), LIMITS, env={PLAN_CACHE_ENV: str(tmp_path)},
                           wait_s=bad)
    assert err.value.argument == "wait_s"


def test_packed_plan_passes_the_wait_limit_on(g, tmp_path, monkeypatch):
    """How a group bounds the wait by its timeout: packed_plan(g, wait_s=timeout_s)."""
    seen: dict[str, Any] = {}

    def fake(gg, plan, limits, **kw):
        seen.update(kw)
        return reference_plan(gg)

    monkeypatch.setattr(plancache, "cached_packed_plan", fake)
    plancache.packed_plan(g, env={PLAN_CACHE_ENV: str(tmp_path)}, wait_s=7.5)
    assert seen["wait_s"] == 7.5


# -- B4: an entry that is not a regular file --------------------------------------------

@pytest.mark.parametrize("how", ["fifo", "link to a fifo"])
def test_a_fifo_entry_is_never_opened_nor_replaced(g, tmp_path, how):
    env = {PLAN_CACHE_ENV: str(tmp_path / "cache")}
    plans: list[str] = []
    cached_packed_plan(g, _counting(plans), LIMITS, env=env)
    entry = _entry(tmp_path / "cache", g)
    entry.unlink()
    fifo = entry if how == "fifo" else tmp_path / "fifo"
    os.mkfifo(fifo)
    if how != "fifo":
        entry.symlink_to(fifo)
    said: list[str] = []
    box: list[Any] = []

    def body() -> None:
        try:
            box.append(cached_packed_plan(g, _counting(plans), LIMITS, env=env,
                                          progress=said.append))
        except BaseException as err:  # noqa: BLE001
            box.append(err)

    t = threading.Thread(target=body, daemon=True)
    t.start()
    try:
        t.join(JOIN_S)
        hung = t.is_alive()
    finally:
        if t.is_alive():  # a regression opened the FIFO blocking: let it go
            os.close(os.open(fifo, os.O_WRONLY | os.O_NONBLOCK))
            t.join(JOIN_S)
    assert not hung, "the FIFO at the cache entry was opened blocking"
    assert isinstance(box[0], PhysicalPlan), box
    assert plans == [g.name, g.name]  # planned in this process
    assert box[0].allocations == reference_plan(g).allocations
    assert fifo.is_fifo() and entry.is_fifo()  # not replaced
    assert len(said) == 1 and str(entry) in said[0] and "FIFO" in said[0]


# -- B7: the entry's label and format ---------------------------------------------------

def test_an_entry_with_another_label_is_not_served(tmp_path):
    """An entry with the right key labelled ``naive`` (holding the naive rule's plan,
    which a plan file may) was served as the packed plan; it is a miss now, said with
    its reason, and replaced by an entry labelled ``packed``."""
    g = load_geometry(ROOT / "examples" / "small-fine-rows.json")  # naive != reference
    env = {PLAN_CACHE_ENV: str(tmp_path)}
    plans: list[str] = []
    cached_packed_plan(g, _counting(plans), LIMITS, env=env)
    entry = _entry(tmp_path, g)
    doc = json.loads(entry.read_text())
    assert doc["label"] == "packed"  # what it is read back as, whatever planned it
    entry.write_text(json.dumps(dict(doc, **plan_document(naive_plan(g)))))
    said: list[str] = []
    out = cached_packed_plan(g, _counting(plans), LIMITS, env=env, progress=said.append)
    assert plans == [g.name, g.name]
    assert out.allocations == reference_plan(g).allocations != naive_plan(g).allocations
    assert len(said) == 1 and str(entry) in said[0] and "label = \"naive\"" in said[0]
    assert json.loads(entry.read_text())["label"] == "packed"
    again = cached_packed_plan(g, _counting(plans), LIMITS, env=env)
    assert plans == [g.name, g.name] and again.label == "packed"


def test_an_entry_of_another_cache_format_is_not_served(g, tmp_path):
    env = {PLAN_CACHE_ENV: str(tmp_path)}
    plans: list[str] = []
    cached_packed_plan(g, _counting(plans), LIMITS, env=env)
    entry = _entry(tmp_path, g)
    doc = json.loads(entry.read_text())
    entry.write_text(json.dumps(dict(doc, cache_format="kvgrant-plan-cache/0")))
    said: list[str] = []
    cached_packed_plan(g, _counting(plans), LIMITS, env=env, progress=said.append)
    assert plans == [g.name, g.name]
    assert len(said) == 1 and "cache_format" in said[0]


def test_an_unusable_entry_is_said_by_the_one_that_replaces_it(g, tmp_path):
    env = {PLAN_CACHE_ENV: str(tmp_path)}
    plans: list[str] = []
    cached_packed_plan(g, _counting(plans), LIMITS, env=env)
    entry = _entry(tmp_path, g)
    entry.write_text("{")
    said: list[str] = []
    cached_packed_plan(g, _counting(plans), LIMITS, env=env, progress=said.append)
    assert plans == [g.name, g.name]
    assert len(said) == 1 and "not JSON" in said[0] and "replacing it" in said[0]


# -- B5: kvgrant plan counts alloc's handle reserve -------------------------------------

def _parser(command: str) -> argparse.ArgumentParser:
    from kvgrant.commands import alloc, plan

    parser = argparse.ArgumentParser(prog="kvgrant")
    {"plan": plan, "alloc": alloc}[command].add_parser(
        parser.add_subparsers(dest="command", required=True))
    return parser


def _run_plan(argv: list[str]) -> int:
    parser = _parser("plan")
    args = parser.parse_args(["plan", *argv])
    return int(args.run(args))


def _packed_line(text: str) -> str:
    return next(ln for ln in text.splitlines()
                if ln.startswith("packed") and "owner+importers" in ln)


def test_plan_says_exceeds_where_alloc_refuses_for_the_reserve(g, capsys):
    """A budget that holds the packed plan's demand but not demand + 4,096: alloc's
    pre-flight refuses it, and plan, which said "fits", now says so too."""
    from kvgrant.layout.plans import make_plan
    from kvgrant.runtime import HandleBudget, allocate

    demand = handle_demand(g, make_plan(g, "packed"))
    budget = demand + DEFAULT_HANDLE_RESERVE - 1
    with pytest.raises(HandleBudgetError):
        check_handle_budget(g, make_plan(g, "packed"), budget, reserve=DEFAULT_HANDLE_RESERVE)
    with pytest.raises(HandleBudgetError):
        allocate(SMALL, backend="sim", budget=HandleBudget(handles=budget))
    assert _run_plan([str(SMALL), "--handle-budget", str(budget)]) == 0
    text = capsys.readouterr().out
    assert "EXCEEDS BUDGET" in _packed_line(text) and "-1" in _packed_line(text)
    assert f"reserve of {DEFAULT_HANDLE_RESERVE:,}" in text
    assert _run_plan([str(SMALL), "--handle-budget", str(budget), "--json"]) == 0
    rep = json.loads(capsys.readouterr().out)
    assert rep["handle_budget"] == budget and rep["handle_reserve"] == DEFAULT_HANDLE_RESERVE
    pre = rep["plans"]["packed"]["preflight"]["importers"]
    assert pre == {"demand": demand, "budget": budget, "reserve": DEFAULT_HANDLE_RESERVE,
                   "margin": -1, "fits": False}


def test_plan_takes_alloc_s_handle_reserve_option(g, capsys):
    from kvgrant.layout.plans import make_plan

    demand = handle_demand(g, make_plan(g, "packed"))
    assert _run_plan([str(SMALL), "--handle-budget", str(demand + 10),
                      "--handle-reserve", "10"]) == 0
    text = capsys.readouterr().out
    assert "fits" in _packed_line(text) and "+0" in _packed_line(text)
    assert "reserve of 10 " in text
    assert _run_plan([str(SMALL), "--handle-budget", str(demand + 10),
                      "--handle-reserve", "11"]) == 0
    assert "EXCEEDS" in _packed_line(capsys.readouterr().out)


def _option(parser: argparse.ArgumentParser, command: str, name: str) -> argparse.Action:
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return next(a for a in sub.choices[command]._actions if name in a.option_strings)


def test_plan_s_handle_reserve_has_alloc_s_name_help_and_validation(capsys):
    mine = _option(_parser("plan"), "plan", "--handle-reserve")
    theirs = _option(_parser("alloc"), "alloc", "--handle-reserve")
    assert (mine.help, mine.type, mine.metavar, mine.default) == \
        (theirs.help, theirs.type, theirs.metavar, theirs.default)
    for bad in ("-1", "x", "1.5"):
        errors = []
        for command in ("plan", "alloc"):
            with pytest.raises(SystemExit) as err:
                _parser(command).parse_args([command, str(SMALL), "--handle-reserve", bad])
            assert err.value.code == 2
            errors.append(capsys.readouterr().err.splitlines()[-1].split(": ", 2)[2])
        assert errors[0] == errors[1] and "--handle-reserve" in errors[0]


def test_the_lock_file_is_held_by_flock_only(g, tmp_path):
    """The holder record is information: a process that finds the lock free takes it
    whatever the record says (a record left by a killed holder does not block)."""
    env = {PLAN_CACHE_ENV: str(tmp_path)}
    entry = _entry(tmp_path, g)
    tmp_path.mkdir(exist_ok=True)
    entry.with_suffix(".lock").write_text(json.dumps({"pid": 1, "geometry": "x"}))
    plans: list[str] = []
    cached_packed_plan(g, _counting(plans), LIMITS, env=env, wait_s=0)
    assert plans == [g.name]
    fd = os.open(entry.with_suffix(".lock"), os.O_RDWR)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)  # released
    finally:
        os.close(fd)


def test_resolve_plan_bounds_the_cache_wait_as_asked(monkeypatch: pytest.MonkeyPatch,
                                                     g: Any) -> None:
    """A group rank passes its timeout_s (runtime/group.py), so a hung planner elsewhere
    on the host cannot hold it past the group's own deadline."""
    from kvgrant.runtime import prepare

    seen: list[object] = []
    monkeypatch.setattr(plancache, "packed_plan",
                        lambda g, *, wait_s=None: seen.append(wait_s) or "plan")
    assert prepare.resolve_plan(g, "packed", cache_wait_s=7.5) == "plan"
    assert prepare.resolve_plan(g, "packed") == "plan"
    assert seen == [7.5, None]


# -- review: the holder record never writes through a link ----------------------------

@pytest.mark.parametrize("link", ["symbolic", "hard"])
def test_a_link_at_the_lock_path_never_has_its_target_written(g, tmp_path, link):
    """The lock file holds the holder's record (written, then emptied); a link there, in
    a shared cache folder, emptied the file it pointed to."""
    folder = tmp_path / "cache"
    folder.mkdir()
    victim = tmp_path / "victim.txt"
    victim.write_text("keep me")
    lock = _entry(folder, g).with_suffix(".lock")
    (os.symlink if link == "symbolic" else os.link)(victim, lock)
    said: list[str] = []
    plans: list[str] = []
    out = cached_packed_plan(g, _counting(plans), LIMITS, env={PLAN_CACHE_ENV: str(folder)},
                             progress=said.append)
    assert out.allocations and plans == [g.name]
    assert victim.read_text() == "keep me"
    if link == "symbolic":
        assert any("is a symbolic link" in m for m in said), said


def test_a_holder_of_another_pid_namespace_is_named_with_it() -> None:
    """Review: the timeout told the waiter to stop "pid N", a pid of a container's
    namespace that means another process here."""
    import socket

    holder = {"pid": 7, "pidns": "pid:[1]", "host": socket.gethostname(), "geometry": "g"}
    assert plancache._who(7, holder).startswith("pid 7 of pid namespace pid:[1] (a container")
    here = dict(holder, pidns=plancache.current_process().pidns)
    assert plancache._who(7, here).startswith("pid 7, planning 'g'")
