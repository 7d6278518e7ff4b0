"""The lifecycle model specs/KVLifecycle.tla: its contract with docs/INTERFACES.md,
its configs, and negative tests (each safety invariant catches a guard-removal
mutant; liveness fails without fairness; every driver step can fail).

Tests that run TLC carry the ``tlc`` mark and skip without Java.
"""

from __future__ import annotations

import re
import shutil
from pathlib import Path

import pytest

from kvgrant.conformance.spec_mutants import (MUTANT_CONFIG, MUTANTS, SAFETY_INVARIANTS,
                                              find_guards, mutate, run_mutant,
                                              run_unmutated)
from kvgrant.conformance.tlc import TLCResult, discover_models, run_tlc

SPECS = Path(__file__).resolve().parents[2] / "specs"
BASE = SPECS / "KVLifecycle.tla"

needs_java = pytest.mark.skipif(shutil.which("java") is None,
                                reason="TLC needs Java (java is not on PATH)")

# docs/INTERFACES.md "The lifecycle model": names the trace and replay engine share.
CONSTANTS = ("NumRanks", "NumAllocs", "Aliased", "OwnerOnly", "Importers", "DeclaredReaders")
VARIABLES = ("phase", "va", "created", "mapped", "aliasMapped", "access", "ready", "failed",
             "published")
ACTIONS = ("Reserve(r)", "Create(r, a)", "Map(r, a)", "MapAlias(r, a)", "Grant(r, a, m)",
           "RankReady(r)", "Publish", "Fail(r, x)", "Abort", "Unpublish", "Unmap(r, a, m)",
           "Release(r, a)", "Free(r)", "AbortComplete", "ShutdownComplete")
LIVENESS = ("AttemptEnds", "ShutdownEnds")


def spec_text() -> str:
    return BASE.read_text()


def definitions(text: str) -> set[str]:
    return {m.group(1) for m in re.finditer(r"^([A-Za-z]\w*(?:\([^)]*\))?)\s*==", text, re.M)}


def cfg_constants(text: str) -> dict[str, str]:
    return dict(re.findall(r"^\s+(\w+)\s*(?:=|<-)\s*(.+?)\s*$", text, re.M))


# ---------------------------------------------------------------------------
# Structure (no TLC)

def test_spec_declares_the_interface_names() -> None:
    text = spec_text()
    declared = re.search(r"^CONSTANTS(.*?)^\S", text, re.M | re.S)
    assert declared is not None
    assert re.findall(r"^\s+(\w+),?", declared.group(1), re.M) == list(CONSTANTS)
    variables = re.search(r"^VARIABLES(.*?)^\S", text, re.M | re.S)
    assert variables is not None
    assert re.findall(r"^\s+(\w+),?", variables.group(1), re.M) == list(VARIABLES)
    defs = definitions(text)
    missing = [name for name in ACTIONS + SAFETY_INVARIANTS + LIVENESS + ("GrantSet(r, a, m)",
               "Init", "Next", "Spec", "vars") if name not in defs]
    assert missing == []


def test_every_safety_invariant_except_typeok_has_a_mutant() -> None:
    covered = {m.invariant for m in MUTANTS}
    assert covered == set(SAFETY_INVARIANTS) - {"TypeOK"}


def test_every_mutant_guard_is_tagged_once() -> None:
    guards = find_guards(spec_text())
    assert {m.guard for m in MUTANTS} <= set(guards)
    assert set(guards) <= {m.guard for m in MUTANTS}  # no untested tag


def test_mutate_replaces_exactly_the_tagged_conjunct() -> None:
    text = spec_text()
    mutant = mutate(text, "unmap-alias-before-backing")
    changed = [(a, b) for a, b in zip(text.splitlines(), mutant.splitlines()) if a != b]
    assert len(changed) == 1 and len(text.splitlines()) == len(mutant.splitlines())
    before, after = changed[0]
    assert "a \\notin aliasMapped[r]" in before
    assert re.match(r"^\s*/\\ TRUE\s+\\\* @guard unmap-alias-before-backing", after)
    with pytest.raises(ValueError, match="no-such-guard"):
        mutate(text, "no-such-guard")


def test_find_guards_rejects_bad_tags() -> None:
    with pytest.raises(ValueError, match="already tagged"):
        find_guards("  /\\ x  \\* @guard g\n  /\\ y  \\* @guard g\n")
    with pytest.raises(ValueError, match="not on a"):
        find_guards("Foo == x  \\* @guard g\n")
    assert find_guards("(* \\* @guard g explained *)\n  /\\ y \\* @guard h\n") == {"h": 2}


@pytest.mark.parametrize("cfg", sorted(SPECS.glob("MCKVLifecycle*.cfg")), ids=lambda p: p.name)
def test_model_configs_meet_the_bounds(cfg: Path) -> None:
    consts = cfg_constants(cfg.read_text())
    assert int(consts["NumRanks"]) >= 3
    assert int(consts["NumAllocs"]) >= 2
    aliased = set(re.findall(r"\d+", consts["Aliased"]))
    assert aliased and len(aliased) < int(consts["NumAllocs"])  # aliased and plain ones
    assert consts["Importers"] == "MCImporters"
    assert consts["DeclaredReaders"] == "MCDeclaredReaders"
    text = cfg.read_text()
    checked = set(re.findall(r"\b([A-Z]\w+)\b", text.split("SPECIFICATION", 1)[1]))
    assert checked & set(SAFETY_INVARIANTS + LIVENESS), f"{cfg.name} checks nothing"


def test_configs_together_check_every_claim() -> None:
    checked: set[str] = set()
    for _, cfg in discover_models(SPECS):
        checked |= set(re.findall(r"\b(\w+)\b", cfg.read_text().split("SPECIFICATION", 1)[1]))
    assert set(SAFETY_INVARIANTS) | set(LIVENESS) <= checked
    owner_only = [c for _, c in discover_models(SPECS)
                  if re.search(r"\d", cfg_constants(c.read_text())["OwnerOnly"])]
    assert owner_only, "no config has an owner-only region"


# ---------------------------------------------------------------------------
# TLC: negative tests

def _explain(res: TLCResult) -> str:
    return f"{res.status} {res.violated} {res.message[:300]}"


@pytest.mark.tlc
@needs_java
def test_unmutated_spec_passes_the_mutant_config() -> None:
    res = run_unmutated(SPECS)
    assert res.ok, _explain(res)
    assert res.distinct and res.distinct > 1000


@pytest.mark.tlc
@needs_java
@pytest.mark.parametrize("mutant", MUTANTS, ids=lambda m: f"{m.invariant}-{m.guard}")
def test_removing_a_guard_breaks_its_invariant(mutant) -> None:
    res = run_mutant(mutant, SPECS)
    assert res.status == "invariant", _explain(res)
    assert res.violated == mutant.invariant
    assert res.counterexample and res.counterexample[0].action == "Initial predicate"
    assert res.counterexample[0].value("phase") == "Allocating"


def _run_module(tmp_path: Path, cfg_body: str, *, base: str | None = None,
                extra: str | None = None) -> TLCResult:
    """Run MCKVLifecycle (or ``extra`` EXTENDing it) on a small config in tmp_path."""
    shutil.copy2(SPECS / "MCKVLifecycle.tla", tmp_path / "MCKVLifecycle.tla")
    (tmp_path / "KVLifecycle.tla").write_text(base if base is not None else spec_text())
    root = tmp_path / "MCKVLifecycle.tla"
    if extra is not None:
        root = tmp_path / "MCExtra.tla"
        root.write_text(extra)
    cfg = tmp_path / "MCSmall.cfg"
    cfg.write_text(MUTANT_CONFIG.replace("INVARIANTS @INVARIANTS@\n", cfg_body))
    return run_tlc(root, cfg, timeout=120)


@pytest.mark.tlc
@needs_java
def test_liveness_holds_on_a_small_model(tmp_path: Path) -> None:
    res = _run_module(tmp_path, "PROPERTIES AttemptEnds ShutdownEnds\n")
    assert res.ok, _explain(res)


@pytest.mark.tlc
@needs_java
def test_attempt_does_not_end_without_fairness(tmp_path: Path) -> None:
    unfair = spec_text().replace("/\\ WF_vars(Progress)", "")
    assert unfair != spec_text()
    res = _run_module(tmp_path, "PROPERTIES AttemptEnds\n", base=unfair)
    assert res.status == "property", _explain(res)
    assert res.counterexample[-1].stuttering or res.counterexample[-1].back_to is not None


STEP_REACH = """\
---- MODULE MCExtra ----
EXTENDS MCKVLifecycle
""" + "".join(
    f'NeverFails{x} == [][\\A r \\in Ranks : ~Fail(r, "{x}")]_vars\n'
    for x in ("Reserve", "Create", "Map", "MapAlias", "Grant")) + """\
====
"""


@pytest.mark.tlc
@needs_java
@pytest.mark.parametrize("step", ["Reserve", "Create", "Map", "MapAlias", "Grant"])
def test_every_driver_step_can_fail(tmp_path: Path, step: str) -> None:
    res = _run_module(tmp_path, f"PROPERTY NeverFails{step}\n", extra=STEP_REACH)
    assert res.status == "property" and res.violated == f"NeverFails{step}", _explain(res)
    last, before = res.counterexample[-1], res.counterexample[-2]
    assert last.action == "Fail"
    assert sum(last.value("failed").values()) == sum(before.value("failed").values()) + 1
