"""The group model specs/KVGroup.tla: names shared with docs/group-trace.md, configs,
and negative tests (each safety invariant catches a guard-removal mutant; liveness
fails without fairness and without the importer's deadline).

Tests that run TLC carry the ``tlc`` mark and skip without Java.
"""

from __future__ import annotations

import re
import shutil
from pathlib import Path

import pytest

from kvgrant.conformance.group_model import GROUP_ACTIONS
from kvgrant.conformance.spec_mutants import (GROUP_ACTION_PROPERTIES, GROUP_MUTANT_CONFIG,
                                              GROUP_MUTANT_CONFIG_3,
                                              GROUP_MUTANT_CONFIG_PLAIN, GROUP_MUTANTS,
                                              GROUP_SAFETY_INVARIANTS, caught, find_guards,
                                              mutate, run_group_mutant, run_group_unmutated)
from kvgrant.conformance.tlc import TLCResult, discover_models, run_tlc

SPECS = Path(__file__).resolve().parents[2] / "specs"
BASE = SPECS / "KVGroup.tla"
LIVENESS = ("SurvivorsDecide", "SurvivorsEnd")

needs_java = pytest.mark.skipif(shutil.which("java") is None,
                                reason="TLC needs Java (java is not on PATH)")


def spec_text() -> str:
    return BASE.read_text()


def definitions(text: str) -> set[str]:
    return {m.group(1) for m in re.finditer(r"^([A-Za-z]\w*)(?:\([^)]*\))?\s*==", text, re.M)}


def test_spec_defines_every_trace_action_and_claim() -> None:
    defs = definitions(spec_text())
    # every event of docs/group-trace.md is an action of the spec (a failed step is Fail)
    assert set(GROUP_ACTIONS) - {"Crash"} <= defs
    assert {"Fail", "Crash", "GiveUp", "Init", "Next", "Spec", "vars"} <= defs
    assert set(GROUP_SAFETY_INVARIANTS) | set(GROUP_ACTION_PROPERTIES) | set(LIVENESS) <= defs


def test_every_group_invariant_except_typeok_has_a_mutant() -> None:
    claims = set(GROUP_SAFETY_INVARIANTS) | set(GROUP_ACTION_PROPERTIES)
    assert {m.invariant for m in GROUP_MUTANTS} == claims - {"TypeOK"}


def test_every_group_guard_is_tagged_once_and_tested() -> None:
    guards = find_guards(spec_text())
    assert set(guards) == {m.guard for m in GROUP_MUTANTS if m.old is None}


def test_invariants_do_not_reuse_the_guards_they_check() -> None:
    """Each claim is written from the constants and variables, not from the operator
    its guard uses (e.g. access from Importers, not from a GrantSet)."""
    text = spec_text()
    body = text[text.index("(* Safety invariants"):text.index("(* Liveness")]
    for helper in ("CanGrant", "CanImport", "CanSend", "CanImportMap", "Missing",
                   "FailedVoters", "SentAll", "ImportComplete", "Granted("):
        assert helper not in body, helper


def test_group_configs_are_discovered_and_check_every_claim() -> None:
    cfgs = [c for _, c in discover_models(SPECS) if c.name.startswith("MCKVGroup")]
    assert {c.name for c in cfgs} == {"MCKVGroup.cfg", "MCKVGroup_TwoAllocs.cfg",
                                      "MCKVGroup_Plain.cfg", "MCKVGroup_Live.cfg"}
    checked: set[str] = set()
    for c in cfgs:
        checked |= set(re.findall(r"\b(\w+)\b", c.read_text().split("SPECIFICATION", 1)[1]))
    assert set(GROUP_SAFETY_INVARIANTS) | set(GROUP_ACTION_PROPERTIES) | set(LIVENESS) <= checked


def _constant(cfg: str, name: str) -> str:
    return re.search(rf"^\s*{name} = (.*)$", cfg, re.M).group(1).strip()


def test_the_plain_mutant_config_has_a_plain_allocation() -> None:
    """The other mutant configs alias every allocation, so a mutant that maps a plain
    allocation into a region shows only here."""
    for cfg in (GROUP_MUTANT_CONFIG, GROUP_MUTANT_CONFIG_3):
        assert _constant(cfg, "Aliased") == ("{0, 1}" if "NumAllocs = 2" in cfg else "{0}")
    assert _constant(GROUP_MUTANT_CONFIG_PLAIN, "NumAllocs") == "2"
    assert _constant(GROUP_MUTANT_CONFIG_PLAIN, "Aliased") == "{1}"
    assert _constant(GROUP_MUTANT_CONFIG_PLAIN, "OwnerOnly") == "{}"
    plain = (SPECS / "MCKVGroup_Plain.cfg").read_text()
    assert _constant(plain, "Aliased") == "{1}" and _constant(plain, "NumAllocs") == "2"


def _explain(res: TLCResult) -> str:
    return f"{res.status} {res.violated} {res.message[:300]}"


@pytest.mark.tlc
@needs_java
@pytest.mark.parametrize("config", [GROUP_MUTANT_CONFIG, GROUP_MUTANT_CONFIG_PLAIN,
                                    GROUP_MUTANT_CONFIG_3], ids=["two", "plain", "three"])
def test_unmutated_group_spec_passes_the_mutant_config(config: str) -> None:
    res = run_group_unmutated(SPECS, workers=2, config=config)
    assert res.ok, _explain(res)
    assert res.distinct and res.distinct > 1000


@pytest.mark.tlc
@needs_java
@pytest.mark.parametrize("mutant", GROUP_MUTANTS, ids=lambda m: f"{m.invariant}-{m.guard}")
def test_removing_a_group_guard_breaks_its_invariant(mutant) -> None:
    res = run_group_mutant(mutant, SPECS, workers=2)
    assert caught(mutant, res), _explain(res)
    assert res.violated == mutant.invariant
    assert res.counterexample[0].action == "Initial predicate"


LIVE_CFG = """\
CONSTANTS
    NumRanks = 2
    NumAllocs = 1
    Aliased = {}
    OwnerOnly = {}
    Importers <- MCImporters
    DeclaredReaders <- MCDeclaredReaders
SPECIFICATION Spec
CONSTRAINT MCStateConstraint
ACTION_CONSTRAINT MCCrashBeforeDecide
PROPERTIES SurvivorsDecide
"""


def _run_live(tmp_path: Path, base: str) -> TLCResult:
    (tmp_path / "KVGroup.tla").write_text(base)
    shutil.copy2(SPECS / "MCKVGroup.tla", tmp_path / "MCKVGroup.tla")
    (tmp_path / "MCLive.cfg").write_text(LIVE_CFG)
    return run_tlc(tmp_path / "MCKVGroup.tla", tmp_path / "MCLive.cfg", timeout=300,
                   workers=2)


@pytest.mark.tlc
@needs_java
def test_survivors_decide_on_a_small_model(tmp_path: Path) -> None:
    res = _run_live(tmp_path, spec_text())
    assert res.ok, _explain(res)


@pytest.mark.tlc
@needs_java
def test_without_the_deadline_an_importer_waits_forever(tmp_path: Path) -> None:
    text = spec_text().replace("\\/ GroupStep(p) \\/ GiveUp(p)", "\\/ GroupStep(p)")
    assert text != spec_text()
    res = _run_live(tmp_path, text)
    assert res.status == "property", _explain(res)
    last = res.counterexample[-1]
    assert last.stuttering or last.back_to is not None
    # the owner died or failed before sending: nobody will send
    faults = [list(s.value("crashed").values()) + list(s.value("failed").values())
              for s in res.counterexample if s.values]
    assert any(any(f) for f in faults)


@pytest.mark.tlc
@needs_java
def test_without_fairness_survivors_need_not_decide(tmp_path: Path) -> None:
    text = spec_text().replace("/\\ WF_vars(Progress)", "")
    assert text != spec_text()
    res = _run_live(tmp_path, text)
    assert res.status == "property", _explain(res)


def test_mutate_group_spec_replaces_one_conjunct() -> None:
    text = spec_text()
    m = mutate(text, "send-only-to-importers")
    changed = [(a, b) for a, b in zip(text.splitlines(), m.splitlines()) if a != b]
    assert len(changed) == 1 and "i \\in Importers[p]" in changed[0][0]
    assert GROUP_MUTANT_CONFIG.count("@INVARIANTS@") == 1
