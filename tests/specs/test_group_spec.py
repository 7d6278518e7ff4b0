"""The group model specs/KVGroup.tla: names shared with docs/group-trace.md, configs,
and negative tests (each safety invariant catches a guard-removal mutant; each liveness
property catches its mutants on the shipped Live config; liveness fails without
fairness and without the importer's deadline; the Live config is not vacuous).

Tests that run TLC carry the ``tlc`` mark and skip without Java.
"""

from __future__ import annotations

import re
import shutil
from pathlib import Path

import pytest

from kvgrant.conformance.group_model import GROUP_ACTIONS
from kvgrant.conformance.spec_mutants import (GROUP_ACTION_PROPERTIES,
                                              GROUP_LIVENESS_PROPERTIES, GROUP_LIVE_CONFIG,
                                              GROUP_MUTANT_CONFIG, GROUP_MUTANT_CONFIG_3,
                                              GROUP_MUTANT_CONFIG_PLAIN, GROUP_MUTANTS,
                                              GROUP_SAFETY_INVARIANTS, apply_mutant, caught,
                                              find_guards, live_config, mutate,
                                              property_kind, run_group_mutant,
                                              run_group_unmutated)
from kvgrant.conformance.tlc import TLCResult, discover_models, run_tlc

SPECS = Path(__file__).resolve().parents[2] / "specs"
BASE = SPECS / "KVGroup.tla"
LIVENESS = GROUP_LIVENESS_PROPERTIES

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


def test_every_group_property_except_typeok_has_a_mutant() -> None:
    claims = set(GROUP_SAFETY_INVARIANTS) | set(GROUP_ACTION_PROPERTIES) | set(LIVENESS)
    assert {m.invariant for m in GROUP_MUTANTS} == claims - {"TypeOK"}
    names = [(m.guard, m.invariant) for m in GROUP_MUTANTS]
    assert len(names) == len(set(names))


@pytest.mark.parametrize("mutant", [m for m in GROUP_MUTANTS if m.kind == "operator"],
                         ids=lambda m: f"{m.invariant}-{m.guard}")
def test_every_group_operator_mutant_changes_the_spec(mutant) -> None:
    text = spec_text()
    assert apply_mutant(text, mutant) != text and text.count(mutant.old) == mutant.count


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
    live = re.sub(r"\\\*.*", "", text[text.index("(* Liveness"):])  # comments aside
    for helper in ("NothingLeftOn", "CanDrive", "Unwinding(", "Alive(", "HoldsPlan"):
        assert helper not in live, helper


def test_the_live_config_bounds_crashes_only() -> None:
    """GiveUp is fair and sets failed[p]: a bound on failures would cut the GiveUp of an
    importer whose owner failed, and TLC would drop those behaviours as unfair.  Crashes
    may come at any point (MCCrashBeforeDecide hides a survivor waiting for a peer that
    crashed after deciding)."""
    cfg = (SPECS / GROUP_LIVE_CONFIG).read_text()
    body = cfg.split("SPECIFICATION", 1)[1]
    assert re.findall(r"^\s*(?:ACTION_)?CONSTRAINTS?\s+(\w+)", body, re.M) == ["MCLiveConstraint"]
    mc = (SPECS / "MCKVGroup.tla").read_text()
    definition = re.search(r"^MCLiveConstraint ==\n((?:    .*\n)+)", mc, re.M)
    assert definition and "crashed" in definition.group(1) and "failed" not in definition.group(1)
    assert set(re.findall(r"\b(\w+)\b", body.split("PROPERTIES", 1)[1])) == set(LIVENESS)
    assert "PROPERTIES" not in live_config(SPECS, GROUP_LIVE_CONFIG)


def test_group_configs_are_discovered_and_check_every_claim() -> None:
    cfgs = [c for _, c in discover_models(SPECS) if c.name.startswith("MCKVGroup")]
    assert {c.name for c in cfgs} == {"MCKVGroup.cfg", "MCKVGroup_TwoAllocs.cfg",
                                      "MCKVGroup_Plain.cfg", "MCKVGroup_TwoFaults.cfg",
                                      "MCKVGroup_Undo.cfg",
                                      "MCKVGroup_Live.cfg"}
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
    """Safety mutants on GROUP_MUTANT_CONFIG (TLC names the property); liveness mutants
    on the shipped Live config, one property per run, ending in a lasso."""
    res = run_group_mutant(mutant, SPECS, workers=2)
    assert caught(mutant, res), _explain(res)
    assert res.counterexample[0].action == "Initial predicate"
    if property_kind(mutant.invariant) == "liveness":
        last = res.counterexample[-1]
        assert last.stuttering or last.back_to is not None
    else:
        assert res.violated == mutant.invariant


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


NON_VACUOUS = """\
---- MODULE MCExtra ----
EXTENDS MCKVGroup
\\* the owner (rank 0) failed a step before sending, and nobody crashed: rank 1 must
\\* give up (GiveUp); stable once true, so <>[]~ is violated iff a fair behaviour
\\* reaches it
OwnerFailedBeforeSend == failed[0] /\\ sent = {} /\\ ~crashed[0] /\\ ~crashed[1]
NoFairOwnerFailure == <>[]~OwnerFailedBeforeSend
MCNoFault == \\A p \\in Ranks : ~failed[p] /\\ ~crashed[p]
\\* both processes failed and went on to decide, nobody crashed, and rank 1 never got
\\* the fd: the owner's step failed before it sent, the importer timed out (GiveUp or
\\* a failed Import).  (A state constraint still lets TLC check the state that breaks
\\* it, so a second failure alone is seen by every config; what follows it is not.)
NeverBothFailedBeforeSend == ~(failed[0] /\\ failed[1] /\\ sent = {}
                               /\\ ~crashed[0] /\\ ~crashed[1]
                               /\\ decision[0] # "none" /\\ decision[1] # "none")
====
"""


def _run_extra(tmp_path: Path, cfg: str, base: str | None = None) -> TLCResult:
    (tmp_path / "KVGroup.tla").write_text(base if base is not None else spec_text())
    shutil.copy2(SPECS / "MCKVGroup.tla", tmp_path / "MCKVGroup.tla")
    (tmp_path / "MCExtra.tla").write_text(NON_VACUOUS)
    (tmp_path / "MCExtra.cfg").write_text(cfg)
    return run_tlc(tmp_path / "MCExtra.tla", tmp_path / "MCExtra.cfg", timeout=300,
                   workers=2, deadlock=False)


@pytest.mark.tlc
@needs_java
def test_the_live_config_has_fair_behaviours_where_the_owner_fails(tmp_path: Path) -> None:
    """The deadline's failed-owner case is checked, not excluded as unfair: a fair
    behaviour of the Live config has rank 0 fail before it sends (under the safety
    configs' MCStateConstraint it had none: the importer's GiveUp was a second failure)."""
    res = _run_extra(tmp_path, live_config(SPECS, GROUP_LIVE_CONFIG)
                     + "PROPERTIES NoFairOwnerFailure\n")
    assert res.status == "property", _explain(res)
    assert any(s.values and s.value("failed")[1] for s in res.counterexample)


def _safety_part(cfg: str) -> str:
    """A shipped safety config without its INVARIANTS and PROPERTIES sections."""
    return cfg.split("INVARIANTS", 1)[0]


@pytest.mark.tlc
@needs_java
def test_the_two_faults_config_reaches_both_processes_failed(tmp_path: Path) -> None:
    """MCKVGroup_TwoFaults.cfg explores the common double failure (the owner's step
    fails before it sends, the importer times out), which every other safety config
    cuts off (one failed step in all); the parity mutant shows only there."""
    cfg = _safety_part((SPECS / "MCKVGroup_TwoFaults.cfg").read_text())
    res = _run_extra(tmp_path, cfg + "INVARIANT NeverBothFailedBeforeSend\n")
    assert res.status == "invariant" and res.violated == "NeverBothFailedBeforeSend", \
        _explain(res)
    for other in ("MCKVGroup_Plain.cfg", "MCKVGroup_TwoAllocs.cfg"):
        res = _run_extra(tmp_path, _safety_part((SPECS / other).read_text())
                         + "INVARIANT NeverBothFailedBeforeSend\n")
        assert res.ok, (other, _explain(res))
    parity = next(m for m in GROUP_MUTANTS if m.guard == "failed-votes-by-parity")
    text = apply_mutant(spec_text(), parity)
    res = _run_extra(tmp_path, _safety_part((SPECS / "MCKVGroup_Plain.cfg").read_text())
                     + "INVARIANT Validity\n", base=text)
    assert res.ok, _explain(res)  # one failure at most: parity is right
    res = _run_extra(tmp_path, cfg + "INVARIANT Validity\n", base=text)
    assert res.status == "invariant" and res.violated == "Validity", _explain(res)


@pytest.mark.tlc
@needs_java
def test_without_faults_the_live_properties_still_bite(tmp_path: Path) -> None:
    """With no failure and no crash the survivors must publish, shut down and release
    everything: the properties hold, and a survivor that never unpublishes breaks
    SurvivorsRelease there too."""
    cfg = live_config(SPECS, GROUP_LIVE_CONFIG).replace("CONSTRAINT MCLiveConstraint",
                                                        "CONSTRAINT MCNoFault")
    assert "MCNoFault" in cfg
    res = _run_extra(tmp_path, cfg + "PROPERTIES " + " ".join(LIVENESS) + "\n")
    assert res.ok, _explain(res)
    assert res.distinct and res.distinct > 100
    never = next(m for m in GROUP_MUTANTS if m.guard == "unpublish-never")
    res = _run_extra(tmp_path, cfg + "PROPERTIES SurvivorsRelease\n",
                     base=apply_mutant(spec_text(), never))
    assert res.status == "property", _explain(res)


def test_mutate_group_spec_replaces_one_conjunct() -> None:
    text = spec_text()
    m = mutate(text, "send-only-to-importers")
    changed = [(a, b) for a, b in zip(text.splitlines(), m.splitlines()) if a != b]
    assert len(changed) == 1 and "i \\in Importers[p]" in changed[0][0]
    assert GROUP_MUTANT_CONFIG.count("@INVARIANTS@") == 1
