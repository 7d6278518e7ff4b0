"""The host's plan cache (runtime/plancache.py): one process plans, the others and
later start-ups read; anything invalid in the folder is ignored and replaced."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from kvgrant.errors import ArgumentError
from kvgrant.layout.contract import check_contract
from kvgrant.layout.geometry import load_geometry
from kvgrant.layout.rules import naive_plan, reference_plan
from kvgrant.runtime import allocate
from kvgrant.runtime.plancache import PLAN_CACHE_ENV, cache_dir, cached_packed_plan

ROOT = Path(__file__).resolve().parents[2]
SMALL = ROOT / "examples" / "small.json"


@pytest.fixture
def g():
    return load_geometry(SMALL)


def _counting(plans: list[str], make=reference_plan):
    def plan(g):
        plans.append(g.name)
        return make(g)
    return plan


def test_cache_folder_from_the_environment(tmp_path):
    assert cache_dir({PLAN_CACHE_ENV: "off"}) is None
    assert cache_dir({PLAN_CACHE_ENV: "OFF"}) is None
    assert cache_dir({PLAN_CACHE_ENV: str(tmp_path)}) == tmp_path
    assert cache_dir({"XDG_CACHE_HOME": "/x"}) == Path("/x/kvgrant/plans")
    assert cache_dir({"HOME": "/home/u"}) == Path("/home/u/.cache/kvgrant/plans")
    with pytest.raises(ArgumentError, match="KVGRANT_PLAN_CACHE = ''") as err:
        cache_dir({PLAN_CACHE_ENV: ""})
    assert err.value.argument == PLAN_CACHE_ENV


def test_the_first_call_plans_and_the_next_reads(g, tmp_path):
    env = {PLAN_CACHE_ENV: str(tmp_path)}
    plans: list[str] = []
    first = cached_packed_plan(g, _counting(plans), {"a": 1}, env=env)
    again = cached_packed_plan(g, _counting(plans), {"a": 1}, env=env)
    assert plans == [g.name]
    assert again.allocations == first.allocations
    assert "plan cache" in again.notes[0]
    files = list(tmp_path.glob("*.json"))
    assert len(files) == 1
    # the file is a plan document that kvgrant alloc --plan takes as well
    assert json.loads(files[0].read_text())["geometry_hash"].startswith("sha256:")


def test_other_limits_or_layouts_are_a_miss(g, tmp_path):
    env = {PLAN_CACHE_ENV: str(tmp_path)}
    plans: list[str] = []
    cached_packed_plan(g, _counting(plans), {"a": 1}, env=env)
    cached_packed_plan(g, _counting(plans), {"a": 2}, env=env)
    other = load_geometry(ROOT / "examples" / "small-inward.json")
    cached_packed_plan(other, _counting(plans), {"a": 1}, env=env)
    assert plans == [g.name, g.name, other.name]
    assert len(list(tmp_path.glob("*.json"))) == 3


def test_another_planner_source_is_a_miss(g, tmp_path, monkeypatch):
    """The key holds a digest of the planner's source: a plan cached by other planner
    code (an upgrade that kept the version string) is not served."""
    import kvgrant.runtime.plancache as plancache

    digest = plancache.planner_digest()
    assert len(digest) == 64 and digest == plancache.planner_digest()
    env = {PLAN_CACHE_ENV: str(tmp_path)}
    plans: list[str] = []
    monkeypatch.setattr(plancache, "_DIGEST", ["an older planner"])
    cached_packed_plan(g, _counting(plans), {"a": 1}, env=env)
    cached_packed_plan(g, _counting(plans), {"a": 1}, env=env)
    assert plans == [g.name]
    monkeypatch.setattr(plancache, "_DIGEST", [digest])
    cached_packed_plan(g, _counting(plans), {"a": 1}, env=env)
    assert plans == [g.name, g.name]
    assert len(list(tmp_path.glob("*.json"))) == 2
    # no source to fingerprint (an install without it): the cache is not used at all
    monkeypatch.setattr(plancache, "_DIGEST", [""])
    cached_packed_plan(g, _counting(plans), {"a": 1}, env=env)
    cached_packed_plan(g, _counting(plans), {"a": 1}, env=env)
    assert plans == [g.name] * 4
    assert len(list(tmp_path.glob("*.json"))) == 2


@pytest.mark.parametrize("damage", ["garbage", "truncated", "other key", "broken plan",
                                    "empty", "a folder"])
def test_an_invalid_cache_file_is_ignored_and_replaced(g, tmp_path, damage):
    env = {PLAN_CACHE_ENV: str(tmp_path)}
    plans: list[str] = []
    good = cached_packed_plan(g, _counting(plans), {"a": 1}, env=env)
    path = next(tmp_path.glob("*.json"))
    doc = json.loads(path.read_text())
    if damage == "garbage":
        path.write_bytes(b"\xff\x00garbage")
    elif damage == "truncated":
        path.write_text(path.read_text()[:40])
    elif damage == "other key":
        path.write_text(json.dumps(dict(doc, cache_key="0" * 64)))
    elif damage == "broken plan":  # one allocation fewer: the contract is broken
        path.write_text(json.dumps(dict(doc, allocations=doc["allocations"][1:])))
    elif damage == "empty":
        path.write_text("")
    else:
        path.unlink()
        path.mkdir()
    out = cached_packed_plan(g, _counting(plans), {"a": 1}, env=env)
    assert plans == [g.name, g.name]  # planned again
    assert out.allocations == good.allocations and not check_contract(g, out)
    if damage != "a folder":  # the file was replaced with a valid one
        again = cached_packed_plan(g, _counting(plans), {"a": 1}, env=env)
        assert plans == [g.name, g.name] and again.allocations == good.allocations


def test_a_folder_that_cannot_be_written_is_not_used(g, tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("")
    env = {PLAN_CACHE_ENV: str(blocker / "plans")}  # a folder inside a file
    plans: list[str] = []
    out = cached_packed_plan(g, _counting(plans, naive_plan), {"a": 1}, env=env)
    assert plans == [g.name] and out.allocations == naive_plan(g).allocations


def test_processes_planning_one_layout_at_once_plan_it_once(tmp_path):
    counter = tmp_path / "count"
    folder = tmp_path / "cache"
    procs = [subprocess.Popen([sys.executable, str(Path(__file__).with_name(
        "_plancache_worker.py")), str(SMALL), str(folder), str(counter)],
        stdout=subprocess.PIPE, text=True) for _ in range(3)]
    try:
        outs = [p.communicate(timeout=120)[0] for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    assert [p.returncode for p in procs] == [0, 0, 0]
    assert counter.read_text().count("planned") == 1
    assert len({o.strip() for o in outs}) == 1


def test_allocate_plans_through_the_cache(tmp_path, monkeypatch):
    monkeypatch.setenv(PLAN_CACHE_ENV, str(tmp_path))
    with allocate(SMALL, backend="sim") as kv:
        used = kv.plan.allocations
    files = list(tmp_path.glob("*.json"))
    assert len(files) == 1
    cached = json.loads(files[0].read_text())["allocations"]
    assert [a.to_json() for a in used] == cached


def test_a_bad_cache_variable_is_an_argument_error_naming_it(monkeypatch):
    monkeypatch.setenv(PLAN_CACHE_ENV, "")
    with pytest.raises(ArgumentError, match=PLAN_CACHE_ENV):
        allocate(SMALL, backend="sim")


def test_a_cache_hit_parses_the_file_once(g, tmp_path, monkeypatch):
    """The key, version, hash and contract checks share one decoding of the file
    (was: json.loads for the key, then read_plan_file parsed it again)."""
    env = {PLAN_CACHE_ENV: str(tmp_path)}
    good = cached_packed_plan(g, _counting([]), {"a": 1}, env=env)
    decoded: list[int] = []
    real = json.loads

    def counting(*a, **k):
        decoded.append(1)
        return real(*a, **k)

    monkeypatch.setattr(json, "loads", counting)
    plans: list[str] = []
    hit = cached_packed_plan(g, _counting(plans), {"a": 1}, env=env)
    assert plans == [] and hit.allocations == good.allocations
    assert len(decoded) == 1


@pytest.mark.parametrize("field, value", [("version", 2), ("geometry_hash", "sha256:0"),
                                          ("label", "fastest")])
def test_a_cache_file_with_the_key_but_a_bad_field_is_ignored(g, tmp_path, field, value):
    env = {PLAN_CACHE_ENV: str(tmp_path)}
    plans: list[str] = []
    good = cached_packed_plan(g, _counting(plans), {"a": 1}, env=env)
    path = next(tmp_path.glob("*.json"))
    path.write_text(json.dumps(dict(json.loads(path.read_text()), **{field: value})))
    out = cached_packed_plan(g, _counting(plans), {"a": 1}, env=env)
    assert plans == [g.name, g.name] and out.allocations == good.allocations
