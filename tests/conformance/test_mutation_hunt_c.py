"""Holes a mutation hunt found in the tests of the TLC wrapper, the TLC trace engine, the
group reader and checker, and ``kvgrant conform`` / ``kvgrant verify``: each test here
fails with one plausible source edit applied and passes on the real code."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from kvgrant.cli import main
from kvgrant.conformance.group_gen import simulate_group, write_group
from kvgrant.conformance.group_model import constants_from

C2 = constants_from(2, 2, [0, 1], [1], {0: [1], 1: [0]})


def _group_dir(tmp_path: Path, texts: list[str], name: str = "g") -> Path:
    d = tmp_path / name
    write_group(texts, d)
    return d


def _conform(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    rc = main(["conform", *argv])
    out = capsys.readouterr()
    return rc, out.out, out.err


# ---------------------------------------------------------------- the TLC wrapper


def test_the_most_workers_tlc_may_have_is_allowed(tmp_path: Path) -> None:
    """``MAX_WORKERS`` itself is a valid worker count (1..MAX_WORKERS, both ends in):
    ``kvgrant verify --workers 1024`` takes it at the command line, so the library must
    too; one more is refused, naming the rule."""
    from kvgrant.commands.verify import verify_specs
    from kvgrant.conformance.tlc import MAX_WORKERS, check_workers
    from kvgrant.errors import ArgumentError, ToolError

    assert check_workers(MAX_WORKERS) == MAX_WORKERS
    assert check_workers(1) == 1
    with pytest.raises(ArgumentError, match=f"must be an integer in 1..{MAX_WORKERS:,}"):
        check_workers(MAX_WORKERS + 1)
    # verify checks the count first: a folder without configs is then the only error
    with pytest.raises(ToolError, match="no model-checking configs"):
        verify_specs(tmp_path, workers=MAX_WORKERS)


# ---------------------------------------------------------------- the group reader


def test_a_group_file_whose_events_all_name_another_rank_is_malformed(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Every event of a process's file carries the header's rank. A file whose events
    all name one other rank (one rank per file, but not its own) is malformed at its
    first event, also where every line is in the writer's shape (the fast reader)."""
    texts = simulate_group(C2)
    lines = texts[0].splitlines()
    assert '"rank": 0, "action"' in lines[1]
    texts[0] = "\n".join([lines[0]] + [ln.replace('"rank": 0, "action"', '"rank": 1, "action"')
                                      for ln in lines[1:]]) + "\n"
    d = _group_dir(tmp_path, texts)
    rc, _out, err = _conform(capsys, str(d))
    assert rc == 2, err
    assert "rank0.ndjson:2: rank = 1: every event of this file has the header's rank 0" in err


def test_a_group_header_without_procs_is_malformed(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A group header says how many processes the group has (``procs``, one per rank);
    a header without it is malformed at line 1 (docs/group-trace.md)."""
    texts = simulate_group(C2)
    lines = texts[1].splitlines()
    head = json.loads(lines[0])
    del head["procs"]
    texts[1] = "\n".join([json.dumps(head)] + lines[1:]) + "\n"
    rc, _out, err = _conform(capsys, str(_group_dir(tmp_path, texts)))
    assert rc == 2, err
    assert "rank1.ndjson:1: header.procs = None: must equal header.ranks (2" in err


def test_a_failed_import_naming_another_actions_call_is_malformed(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A failed Import names its own driver call, or ``recvmsg`` (no fd came); a failed
    Import that names another action's call (cuMemCreate) is malformed, where the same
    file naming recvmsg is accepted."""
    texts = simulate_group(C2, fail_at={1: 15})
    lines = texts[1].splitlines()
    ev = json.loads(lines[16])  # seq 15: rank 1's first Import, failed
    assert ev["action"] == "Import" and ev["result"] == "CUDA_ERROR_OUT_OF_MEMORY"

    def with_call(call: str) -> list[str]:
        edited = lines[16].replace('"call": "cuMemImportFromShareableHandle"',
                                   f'"call": "{call}"')
        assert edited != lines[16]
        return [texts[0], "\n".join(lines[:16] + [edited] + lines[17:]) + "\n"]

    rc, out, err = _conform(capsys, str(_group_dir(tmp_path, with_call("recvmsg"), "ok")))
    assert rc == 0, out + err
    rc, _out, err = _conform(capsys, str(_group_dir(tmp_path, with_call("cuMemCreate"),
                                                    "bad")))
    assert rc == 2, err
    assert ('rank1.ndjson:17: call = "cuMemCreate": Import calls '
            "cuMemImportFromShareableHandle") in err


def test_a_group_header_naming_another_processs_base_is_malformed(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A process's header names its own reservation base only: another rank's base is
    null there (each process reserves its own VA range, which the others never see)."""
    texts = simulate_group(C2)
    lines = texts[0].splitlines()
    head = json.loads(lines[0])
    base, size = head["reservations"]["0"]
    assert head["reservations"]["1"] == [None, size]
    head["reservations"]["1"] = [2 * base, size]
    texts[0] = "\n".join([json.dumps(head)] + lines[1:]) + "\n"
    rc, _out, err = _conform(capsys, str(_group_dir(tmp_path, texts)))
    assert rc == 2, err
    assert (f"rank0.ndjson:1: header.reservations[1].base = {2 * base:#x}: must be null "
            "(a file names only its own process's base, rank 0)") in err


def test_a_group_rejection_names_the_line_of_the_rejected_event(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """The rejection of a group names the file, the seq and the line of the event (the
    header is line 1, seq k is line k + 2): the line it names holds that event."""
    from kvgrant.conformance.group_mutants import group_mutants

    (m,) = group_mutants(simulate_group(C2), ["decide_before_vote"])
    d = _group_dir(tmp_path, m.texts)
    rc, out, _err = _conform(capsys, str(d), "--json")
    assert rc == 1, out
    (v,) = json.loads(out)["verdicts"]
    assert (v["rank"], v["index"], v["line"]) == (m.rank, m.seq, m.seq + 2)
    named = (d / f"rank{m.rank}.ndjson").read_text().splitlines()[v["line"] - 1]
    assert json.loads(named)["seq"] == m.seq and json.loads(named) == v["event"]
    rc, out, _err = _conform(capsys, str(d))
    assert rc == 1 and f"seq {m.seq} (line {m.seq + 2}, rank {m.rank})" in out, out


# ---------------------------------------------------------------- the trace renderer


def test_each_event_of_an_allocation_entry_keeps_its_own_time() -> None:
    """One packed entry stands for an allocation's Create, Map and Grant; each of those
    event lines gets its own clock value (``t``), relative to the header's, and the
    events that did not happen (a partial entry) get none."""
    from kvgrant.runtime.trace_render import ALLOC_ENTRY, alloc_spec, expand_allocs

    spec = alloc_spec("C %d %.3f %d %d %d %d %d %d %d\n", "M %d %.3f %d %d %d %d %d %d %d %d\n",
                      "A\n", "G %d %.3f %d %d %d %d %d %d %d\n", 1, [])
    entries = ALLOC_ENTRY.pack(0, 3, 0, 11, 4096, 0, 2048, 1, 1, 0, 1, 10.5, 11.0, 12.25, 0, 0)
    entries += ALLOC_ENTRY.pack(0, 2, 1, 12, 8192, 0, 2048, 2, 2, 0, 1, 13.0, 14.5, 0, 0, 0)
    lines: list[str] = []
    assert expand_allocs(spec, entries, 5, 10.0, lines) == 10
    got = [(ln.split()[0], int(ln.split()[1]), float(ln.split()[2])) for ln in lines]
    assert got == [("C", 5, 0.5), ("M", 6, 1.0), ("G", 7, 2.25), ("C", 8, 3.0), ("M", 9, 4.5)]


# ---------------------------------------------------------------- spec mutants


def test_a_spec_mutant_is_caught_only_by_the_invariant_it_names() -> None:
    """``kvgrant verify --mutants`` counts a spec mutant as caught only when TLC reports
    the property the mutant names: another invariant's violation (a mutant that broke
    something else first) is NOT CAUGHT, as is an action property named elsewhere."""
    from kvgrant.conformance.spec_mutants import MUTANTS, caught
    from kvgrant.conformance.tlc import TLCResult

    def result(status: str, violated: str) -> TLCResult:
        return TLCResult(spec="s", config="c", status=status, exit_code=12, seconds=0.0,
                         violated=violated)

    inv = next(m for m in MUTANTS if m.invariant == "AliasNeverOutlivesBacking")
    assert caught(inv, result("invariant", "AliasNeverOutlivesBacking"))
    assert not caught(inv, result("invariant", "PublishOnlyWhenAllReady"))
    assert not caught(inv, result("deadlock", "AliasNeverOutlivesBacking"))
    act = next(m for m in MUTANTS if m.invariant == "UnwindInReverseOrder")
    assert caught(act, result("property", "UnwindInReverseOrder"))
    assert not caught(act, result("property", "OneAttempt"))


def test_a_spec_mutant_whose_text_occurs_more_often_than_it_says_is_refused() -> None:
    """An operator mutant says how often its text occurs in the spec; when the spec
    moved on and has it once more, applying the mutant is an error that names the
    counts (the mutant must follow the spec), not a silent change of both places."""
    from kvgrant.conformance.spec_mutants import BASE_SPEC, MUTANTS, apply_mutant
    from kvgrant.specfiles import specs_dir

    text = (specs_dir() / BASE_SPEC).read_text()
    m = next(m for m in MUTANTS if m.old is not None and m.count == 1)
    assert text.count(m.old) == 1
    apply_mutant(text, m)  # as the spec is: applies
    moved = text + "\n\\* " + m.old.replace("\n", " ") + "\n"
    assert moved.count(m.old) == 2
    with pytest.raises(ValueError, match="occurs 2 times in the spec, expected 1"):
        apply_mutant(moved, m)


# ---------------------------------------------------------------- the group line writer


def test_the_group_line_writer_keeps_an_argument_the_format_does_not_have(
        tmp_path: Path) -> None:
    """``format_group_event`` writes every ``args`` key it is given (the known ones in
    the format's order, then the others), so a tool that writes a bad event gets it on
    file, where the reader refuses it, naming the key."""
    from kvgrant.conformance.group_io import load_group
    from kvgrant.errors import TraceError
    from kvgrant.traceformat import format_group_event

    texts = simulate_group(C2)
    lines = texts[0].splitlines()
    k = next(i for i, ln in enumerate(lines) if '"action": "Create"' in ln)
    ev = json.loads(lines[k])
    ev["args"] = {"bogus": 1, **ev["args"]}
    line = format_group_event(ev)
    assert '"args": {"alloc": 0, "bogus": 1}' in line
    texts[0] = "\n".join(lines[:k] + [line] + lines[k + 1:]) + "\n"
    with pytest.raises(TraceError, match="args.bogus = 1: Create takes no bogus"):
        load_group([_group_dir(tmp_path, texts)])


# ---------------------------------------------------------------- trace mutants


def test_a_mutant_rejected_at_another_event_is_not_killed() -> None:
    """The mutation score counts a mutant as killed only when the engine rejects it at
    the event where the bug was put: a rejection elsewhere is a miss that names both
    events."""
    import dataclasses

    from _conform_support import small_header
    from kvgrant.conformance import replay
    from kvgrant.conformance.mutants import mutants, mutation_score, reference_trace

    cases = mutants(reference_trace(small_header()))
    right = [replay(m.trace) for m in cases]
    assert mutation_score(cases, right).killed == len(cases)
    late = [dataclasses.replace(v, index=v.index + 1) for v in right]
    s = mutation_score(cases, late)
    assert s.killed == 0 and s.total == len(cases) and s.score == 0.0
    m = cases[0]
    assert s.misses[0] == (f"{m.trace.source}: expected rejection at {m.expected_index}, "
                           f"got {m.expected_index + 1}")


@pytest.mark.tlc
def test_an_invariant_broken_by_the_initial_state_is_named(tmp_path: Path) -> None:
    """TLC reports an invariant that the initial state already breaks with its own
    message (2107): the result names that invariant, as for one broken later."""
    from _conform_support import needs_java
    from kvgrant.conformance.tlc import run_tlc

    needs_java()
    spec = tmp_path / "Start.tla"
    spec.write_text("---- MODULE Start ----\nEXTENDS Naturals\nVARIABLES x\nInit == x = 0\n"
                    "Next == x < 2 /\\ x' = x + 1\nPositive == x > 0\n====\n")
    cfg = tmp_path / "Start.cfg"
    cfg.write_text("INIT Init\nNEXT Next\nINVARIANT Positive\n")
    res = run_tlc(spec, cfg, timeout=120)
    assert res.status == "invariant" and not res.ok
    assert res.violated == "Positive"


def test_a_second_trace_in_tlc_output_replaces_the_first() -> None:
    """When TLC prints a trace again (liveness prints its prefix once more; ``-continue``
    prints one trace per violation), the counterexample is the last trace printed, not
    the traces run together."""
    from kvgrant.conformance.tlc import parse_tool_output

    def state(k: int, x: int) -> str:
        label = ("Initial predicate" if k == 1
                 else "Next line 5, col 9 to line 5, col 30 of module T")
        return (f"@!@!@STARTMSG 2217:4 @!@!@\n{k}: <{label}>\n/\\ x = {x}\n\n"
                "@!@!@ENDMSG 2217 @!@!@\n")

    out = ("@!@!@STARTMSG 2110:1 @!@!@\nInvariant Small is violated.\n@!@!@ENDMSG 2110 @!@!@\n"
           + state(1, 0) + state(2, 1)
           + "@!@!@STARTMSG 2110:1 @!@!@\nInvariant Small is violated.\n@!@!@ENDMSG 2110 @!@!@\n"
           + state(1, 0) + state(2, 1) + state(3, 2))
    res = parse_tool_output(out, 12)
    assert res.status == "invariant" and res.violated == "Small"
    assert [(s.index, s.value("x")) for s in res.counterexample] == [(1, 0), (2, 1), (3, 2)]
    assert res.summary()["counterexample_length"] == 3


def _processes_naming(marker: str) -> list[int]:
    """Pids of live (not zombie) processes whose command line holds ``marker``."""
    out = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == os.getpid():
            continue
        try:
            cmd = Path(f"/proc/{entry}/cmdline").read_bytes().replace(b"\0", b" ").decode(
                errors="replace")
            stat = Path(f"/proc/{entry}/stat").read_text()
        except OSError:
            continue
        if marker in cmd and stat[stat.rindex(")") + 2:].split()[0] != "Z":
            out.append(int(entry))
    return out


@pytest.mark.tlc
@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
def test_a_timeout_ends_java_started_through_a_launcher_script(tmp_path: Path) -> None:
    """The ``java`` that runs TLC may be a launcher script that starts the JVM as its
    child (a version manager's shim): a timeout ends the whole process group, the JVM
    included, and run_tlc returns (it does not wait for an orphaned JVM that holds
    TLC's output pipe)."""
    from _conform_support import needs_java
    from kvgrant.conformance.tlc import find_java

    needs_java()
    launcher = tmp_path / "java-launcher"
    launcher.write_text(f'#!/bin/sh\n"{find_java()}" "$@"\nstatus=$?\nexit $status\n')
    launcher.chmod(0o755)
    spec = tmp_path / "Forever.tla"
    spec.write_text("---- MODULE Forever ----\nEXTENDS Naturals\nVARIABLES x\nInit == x = 0\n"
                    "Next == x' = x + 1\n====\n")
    (tmp_path / "Forever.cfg").write_text("INIT Init\nNEXT Next\n")
    work = tmp_path / "tmp"
    work.mkdir()
    code = ("from kvgrant.conformance.tlc import run_tlc\n"
            f"res = run_tlc({str(spec)!r}, timeout=3, java={str(launcher)!r})\n"
            "print(res.status)\n")
    env = {**os.environ, "TMPDIR": str(work)}
    try:
        # a hang limit, not a speed claim: an orphaned JVM would keep run_tlc waiting
        run = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True,
                             text=True, timeout=90)
        assert run.returncode == 0, run.stderr
        assert run.stdout.strip() == "timeout"
        left = _processes_naming(str(work))
        for _ in range(50):
            if not left:
                break
            time.sleep(0.1)
            left = _processes_naming(str(work))
        assert left == [], "the JVM outlived the timeout"
    finally:
        for pid in _processes_naming(str(work)):
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGKILL)


# ---------------------------------------------------------------- kvgrant conform --engine


def _single(tmp_path: Path, raw: list[dict[str, Any]], name: str = "t.ndjson") -> str:
    from _conform_support import small_header
    from kvgrant.conformance.mutants import trace_from_events

    p = tmp_path / name
    p.write_text("\n".join(trace_from_events(small_header(), raw).to_lines()) + "\n")
    return str(p)


def _reference_raw() -> list[dict[str, Any]]:
    from _conform_support import small_header
    from kvgrant.conformance.mutants import reference_trace

    return [json.loads(json.dumps(dict(e.raw))) for e in reference_trace(small_header()).events]


def _as_tlc(verdict: Any) -> Any:
    import dataclasses

    return dataclasses.replace(verdict, engine="tlc")


def _duplicated(raw: list[dict[str, Any]], k: int) -> list[dict[str, Any]]:
    """``raw`` with event k written twice: rejected at k + 1."""
    return raw[:k + 1] + [dict(raw[k])] + raw[k + 1:]


def test_a_tlc_timeout_on_a_trace_is_no_verdict(
        tmp_path: Path, capsys: pytest.CaptureFixture[str],
        monkeypatch: pytest.MonkeyPatch) -> None:
    """TLC stopped by its timeout has judged nothing: the trace is neither accepted nor
    rejected; ``kvgrant conform --engine tlc`` says TLC could not check it (exit 2)."""
    from kvgrant.conformance import tlc
    from kvgrant.conformance.tla_trace import check_trace_tlc
    from kvgrant.errors import ToolError

    def timed_out(spec: Any, config: Any = None, **kw: Any) -> Any:
        return tlc.TLCResult(spec=str(spec), config=str(config), status="timeout",
                             exit_code=None, seconds=kw["timeout"],
                             message=f"TLC did not finish within {kw['timeout']} s")

    monkeypatch.setattr(tlc, "run_tlc", timed_out)
    path = _single(tmp_path, _reference_raw())
    with pytest.raises(ToolError, match=r"\(timeout\): TLC did not finish within 0.5 s"):
        check_trace_tlc(path, timeout=0.5)
    rc, out, err = _conform(capsys, path, "--engine", "tlc", "--tlc-timeout", "0.5")
    assert rc == 2
    assert "rejected" not in out and "accepted" not in out
    assert "TLC could not check the trace: TLC failed on the trace spec (timeout)" in err


def test_engines_rejecting_different_events_disagree(
        tmp_path: Path, capsys: pytest.CaptureFixture[str],
        monkeypatch: pytest.MonkeyPatch) -> None:
    """``--engine both`` needs the same verdict from both engines, the rejected event
    included: two rejections at different events are a disagreement (exit 2, both
    indices named), not an agreed rejection."""
    import kvgrant.conformance as conf
    from kvgrant.conformance import load_trace, replay

    raw = _reference_raw()
    path = _single(tmp_path, _duplicated(raw, 19))
    assert replay(load_trace(path)).index == 20
    elsewhere = _as_tlc(replay(load_trace(_single(tmp_path, _duplicated(raw, 29), "o.ndjson"))))
    assert elsewhere.index == 30
    monkeypatch.setattr(conf, "check_trace_tlc", lambda trace, timeout: elsewhere)
    rc, _out, err = _conform(capsys, path, "--engine", "both")
    assert rc == 2
    assert "engines DISAGREE: python: index 20; tlc: index 30" in err


def test_the_json_verdict_of_disagreeing_engines_is_not_accepted(
        tmp_path: Path, capsys: pytest.CaptureFixture[str],
        monkeypatch: pytest.MonkeyPatch) -> None:
    """With ``--json`` a trace one engine accepts and the other rejects is not
    ``accepted``: the document says the engines disagree and exits 2."""
    import kvgrant.conformance as conf
    from kvgrant.conformance import load_trace, replay

    raw = _reference_raw()
    path = _single(tmp_path, raw)
    rejected = _as_tlc(replay(load_trace(_single(tmp_path, _duplicated(raw, 19), "o.ndjson"))))
    monkeypatch.setattr(conf, "check_trace_tlc", lambda trace, timeout: rejected)
    rc, out, _err = _conform(capsys, path, "--engine", "both", "--json")
    doc = json.loads(out)
    assert rc == 2 and doc["agree"] is False
    assert doc["accepted"] is False
    assert [v["accepted"] for v in doc["verdicts"]] == [True, False]


def test_a_trace_of_exactly_tlc_max_events_goes_to_tlc(
        tmp_path: Path, capsys: pytest.CaptureFixture[str],
        monkeypatch: pytest.MonkeyPatch) -> None:
    """``--tlc-max-events N`` refuses a trace of more than N events: one of exactly N
    goes to TLC; one of N + 1 is refused up front (exit 2, before TLC starts)."""
    import kvgrant.conformance as conf
    from kvgrant.conformance import load_trace, replay

    path = _single(tmp_path, _reference_raw())
    n = len(load_trace(path).events)
    ran: list[int] = []

    def fake_tlc(trace: Any, timeout: float) -> Any:
        ran.append(len(trace.events))
        return _as_tlc(replay(trace))

    monkeypatch.setattr(conf, "check_trace_tlc", fake_tlc)
    rc, out, err = _conform(capsys, path, "--engine", "tlc", "--tlc-max-events", str(n))
    assert rc == 0, err
    assert ran == [n] and "accepted by tlc" in out
    rc, _out, err = _conform(capsys, path, "--engine", "tlc", "--tlc-max-events", str(n - 1))
    assert rc == 2 and ran == [n]
    assert f"TLC cannot check this trace: it has {n:,} events, more than the {n - 1:,}" in err


@pytest.mark.parametrize("json_flag", [(), ("--json",)], ids=["text", "json"])
def test_the_tlc_timeout_reaches_tlc_with_and_without_json(
        tmp_path: Path, capsys: pytest.CaptureFixture[str],
        monkeypatch: pytest.MonkeyPatch, json_flag: tuple[str, ...]) -> None:
    """``--tlc-timeout S`` is the time TLC is given, whether the verdict is printed as
    text or as JSON."""
    import kvgrant.conformance as conf
    from kvgrant.conformance import replay

    path = _single(tmp_path, _reference_raw())
    given: list[float] = []

    def fake_tlc(trace: Any, timeout: float = 300.0) -> Any:
        given.append(timeout)
        return _as_tlc(replay(trace))

    monkeypatch.setattr(conf, "check_trace_tlc", fake_tlc)
    rc, _out, err = _conform(capsys, path, "--engine", "tlc", "--tlc-timeout", "7",
                             *json_flag)
    assert rc == 0, err
    assert given == [7.0]


# ---------------------------------------------------------------- kvgrant verify


def _ok_run(spec: Any, cfg: Any, *, workers: int = 1, timeout: Any = None) -> Any:
    from kvgrant.conformance.tlc import TLCResult

    return TLCResult(spec=str(spec), config=str(cfg), status="ok", exit_code=0, seconds=0.1,
                     distinct=1, depth=1)


def test_verify_counts_a_mutant_that_broke_another_invariant_as_not_caught(
        tmp_path: Path, capsys: pytest.CaptureFixture[str],
        monkeypatch: pytest.MonkeyPatch) -> None:
    """``kvgrant verify --mutants``: a spec mutant must be caught by the property it
    names; TLC reporting another invariant violated is NOT CAUGHT (exit 1), in the
    table and in the JSON rows."""
    import kvgrant.commands.verify as verify
    from kvgrant.conformance.spec_mutants import MUTANTS
    from kvgrant.conformance.tlc import TLCResult

    (tmp_path / "MCA.tla").write_text("")
    (tmp_path / "MCA.cfg").write_text("")
    mutant = next(m for m in MUTANTS if m.invariant == "AliasNeverOutlivesBacking")

    def other_invariant(m: Any, specdir: Any, *, timeout: Any, workers: int) -> TLCResult:
        return TLCResult(spec="MCKVLifecycle.tla", config="mutant.cfg", status="invariant",
                         exit_code=12, seconds=0.1, violated="PublishOnlyWhenAllReady")

    monkeypatch.setattr(verify, "run_tlc", _ok_run)
    monkeypatch.setattr(verify, "MUTANTS", (mutant,))
    monkeypatch.setattr(verify, "GROUP_MUTANTS", ())
    monkeypatch.setattr(verify, "run_mutant", other_invariant)
    assert main(["verify", str(tmp_path), "--mutants", "--workers", "1"]) == 1
    out = capsys.readouterr().out
    assert "NOT CAUGHT (invariant: PublishOnlyWhenAllReady)" in out
    assert "1 of 2 checks passed" in out
    assert main(["verify", str(tmp_path), "--mutants", "--workers", "1", "--json"]) == 1
    rows = json.loads(capsys.readouterr().out)
    assert rows[1]["mutant"] == mutant.guard and rows[1]["caught"] is False


def test_verify_gives_tlc_the_timeout_asked_for(
        tmp_path: Path, capsys: pytest.CaptureFixture[str],
        monkeypatch: pytest.MonkeyPatch) -> None:
    """``kvgrant verify --timeout S`` is each config's time limit: every TLC run of the
    folder is given S seconds."""
    import kvgrant.commands.verify as verify
    from kvgrant.conformance.tlc import TLCResult

    for name in ("MCA.tla", "MCA.cfg", "MCB.tla", "MCB.cfg"):
        (tmp_path / name).write_text("")
    given: list[tuple[str, Any]] = []

    def fake_run(spec: Any, cfg: Any, *, workers: int = 1, timeout: Any = None) -> TLCResult:
        given.append((Path(cfg).name, timeout))
        return TLCResult(spec=str(spec), config=str(cfg), status="ok", exit_code=0,
                         seconds=0.1, distinct=1, depth=1)

    monkeypatch.setattr(verify, "run_tlc", fake_run)
    assert main(["verify", str(tmp_path), "--timeout", "7", "--workers", "1"]) == 0
    assert given == [("MCA.cfg", 7.0), ("MCB.cfg", 7.0)]
    assert "2 of 2 checks passed" in capsys.readouterr().out


# ---------------------------------------------------------------- kvgrant conform on a group


def _group_and_tlc_like_python(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                               mutation: str | None = None) -> tuple[Path, list[int], Any]:
    """A group (one mutant of it when ``mutation``), and the TLC group engine replaced by
    the Python verdict relabelled ``tlc`` (it records the group's event counts)."""
    import dataclasses

    import kvgrant.conformance.tla_trace as tla_trace
    from kvgrant.conformance.group_mutants import group_mutants
    from kvgrant.conformance.group_replay import replay_group

    texts = simulate_group(C2)
    if mutation is not None:
        (m,) = group_mutants(texts, [mutation])
        texts = m.texts
    ran: list[int] = []

    def fake(t: Any, order: Any, timeout: float) -> Any:
        ran.append(t.events)
        return dataclasses.replace(replay_group(t), engine="tlc")

    monkeypatch.setattr(tla_trace, "check_group_tlc", fake)
    return _group_dir(tmp_path, texts), ran, texts


def test_a_group_of_exactly_tlc_max_events_goes_to_tlc(
        tmp_path: Path, capsys: pytest.CaptureFixture[str],
        monkeypatch: pytest.MonkeyPatch) -> None:
    """For a group too, ``--tlc-max-events N`` refuses more than N events in all: a group
    of exactly N goes to TLC, one of N + 1 is refused (exit 2)."""
    d, ran, texts = _group_and_tlc_like_python(tmp_path, monkeypatch)
    n = sum(len(t.splitlines()) - 1 for t in texts)
    rc, out, err = _conform(capsys, str(d), "--engine", "tlc", "--tlc-max-events", str(n))
    assert rc == 0, err
    assert ran == [n] and "accepted by tlc" in out
    rc, _out, err = _conform(capsys, str(d), "--engine", "tlc", "--tlc-max-events", str(n - 1))
    assert rc == 2 and ran == [n]
    assert f"the group has {n:,} events, more than the {n - 1:,} TLC checks" in err


def test_group_engines_rejecting_different_ranks_disagree(
        tmp_path: Path, capsys: pytest.CaptureFixture[str],
        monkeypatch: pytest.MonkeyPatch) -> None:
    """For a group, the rejected event is (rank, seq): two engines that reject the same
    seq of different ranks' files disagree (exit 2, both places named)."""
    import dataclasses

    import kvgrant.conformance.tla_trace as tla_trace
    from kvgrant.conformance.group_mutants import group_mutants
    from kvgrant.conformance.group_replay import replay_group_files

    (m,) = group_mutants(simulate_group(C2), ["decide_before_vote"])
    d = _group_dir(tmp_path, m.texts)
    py = replay_group_files([d])
    assert (py.accepted, py.rank, py.index) == (False, m.rank, m.seq)
    other = dataclasses.replace(py, engine="tlc", rank=1 - m.rank)
    monkeypatch.setattr(tla_trace, "check_group_tlc", lambda t, order, timeout: other)
    rc, _out, err = _conform(capsys, str(d), "--engine", "both")
    assert rc == 2, err
    assert (f"engines DISAGREE: python: rank {m.rank} seq {m.seq}; "
            f"tlc: rank {1 - m.rank} seq {m.seq}") in err


def test_both_engines_on_a_group_print_both_verdicts(
        tmp_path: Path, capsys: pytest.CaptureFixture[str],
        monkeypatch: pytest.MonkeyPatch) -> None:
    """``--engine both`` on a group gives the Python verdict and the TLC one, in that
    order (the JSON document lists both)."""
    d, _ran, _texts = _group_and_tlc_like_python(tmp_path, monkeypatch, "decide_before_vote")
    rc, out, _err = _conform(capsys, str(d), "--engine", "both", "--json")
    doc = json.loads(out)
    assert rc == 1 and doc["agree"] is True
    assert [v["engine"] for v in doc["verdicts"]] == ["python", "tlc"]


def test_the_json_verdict_of_a_group_the_engines_disagree_on_is_not_accepted(
        tmp_path: Path, capsys: pytest.CaptureFixture[str],
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A group that one engine accepts and the other rejects is not ``accepted`` in the
    JSON document (the engines disagree: exit 2)."""
    import dataclasses

    import kvgrant.conformance.tla_trace as tla_trace
    from kvgrant.conformance.group_mutants import group_mutants
    from kvgrant.conformance.group_replay import replay_group
    from kvgrant.conformance.group_io import load_group

    (m,) = group_mutants(simulate_group(C2), ["decide_before_vote"])
    rejected = replay_group(load_group([_group_dir(tmp_path, m.texts, "bad")]))
    assert not rejected.accepted
    monkeypatch.setattr(tla_trace, "check_group_tlc",
                        lambda t, order, timeout: dataclasses.replace(rejected, engine="tlc"))
    d = _group_dir(tmp_path, simulate_group(C2))
    rc, out, _err = _conform(capsys, str(d), "--engine", "both", "--json")
    doc = json.loads(out)
    assert rc == 2 and doc["agree"] is False
    assert doc["accepted"] is False
    assert [v["accepted"] for v in doc["verdicts"]] == [True, False]


def test_tlc_failing_on_a_group_is_exit_2_not_a_rejection(
        tmp_path: Path, capsys: pytest.CaptureFixture[str],
        monkeypatch: pytest.MonkeyPatch) -> None:
    """When TLC cannot check a group (no Java, a spec error, a timeout) conform exits 2
    and says so; it does not report the group rejected (exit 1)."""
    import kvgrant.conformance.tla_trace as tla_trace
    from kvgrant.errors import ToolError

    def no_java(t: Any, order: Any, timeout: float) -> Any:
        raise ToolError("java not found (checked $JAVA_HOME and PATH)")

    monkeypatch.setattr(tla_trace, "check_group_tlc", no_java)
    d = _group_dir(tmp_path, simulate_group(C2))
    rc, _out, err = _conform(capsys, str(d), "--engine", "tlc")
    assert rc == 2
    assert "kvgrant conform: error: TLC could not check the traces: java not found" in err
    rc, out, _err = _conform(capsys, str(d), "--engine", "both", "--json")
    doc = json.loads(out)
    assert rc == 2 and doc["error"] == "tool" and doc["exit_status"] == 2


# ---------------------------------------------------------------- the drift guard


def test_a_cut_simulated_behaviour_rejected_before_its_end_is_drift(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """``check_simulated``: a behaviour that TLC's depth bound cut before a terminal
    phase must be rejected exactly at its end (every step matched, the trace only
    stops); a rejection at an earlier event is a step TLC took that the Python engine
    refuses, and the report is not ok."""
    import dataclasses

    from kvgrant.conformance import drift, model
    from kvgrant.conformance.mutants import make_header

    h = make_header(2, 1, importers={0: [1], 1: [0]})
    c = model.Constants.from_header(h, 0)
    s = model.initial_state(c)
    states = [s]
    for _ in range(4):   # four forward steps: still Allocating
        act = next(a for a in model.enabled(c, s) if a.name != "Fail")
        s = s.copy()
        model.apply(c, s, act)
        states.append(s)
    assert s.phase == "Allocating"
    monkeypatch.setattr(drift, "simulate_behaviours", lambda h, **kw: [states])
    report = drift.check_simulated(h, num=1)
    assert report.ok and report.traces == 1   # cut, rejected at its end: no drift
    real = drift.replay
    monkeypatch.setattr(drift, "replay", lambda t: dataclasses.replace(real(t), index=1))
    report = drift.check_simulated(h, num=1)
    assert not report.ok and [v.index for v in report.rejected] == [1]
