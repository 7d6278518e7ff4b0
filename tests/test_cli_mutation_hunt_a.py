"""Tests that kill hand-written CLI mutants the rest of the suite let through.

Each was found by a mutation hunt over ``kvgrant/cli.py`` and ``kvgrant/commands/``:
a plausible one-line bug (a boundary moved by one, a default that swallows an explicit
0, a JSON field filled from the wrong place, an exit status changed) under which every
existing test still passed. Each test here states the behaviour a user sees (exit
status, error text, a JSON field) and fails with its mutant applied.

Each test runs ``kvgrant.cli.main`` in this process (the sim backend; milliseconds),
through tests/test_cli_review_fixes.py's ``cli``.
"""

from __future__ import annotations

import contextlib
import errno
import io
import json
import os
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.test_cli_review_fixes import SIM, SMALL, cli
from tests.test_cli_review_fixes import small_trace  # noqa: F401 (a fixture)

class _ClosedPipe(io.TextIOBase):
    """A stdout whose reader went away: every write fails with EPIPE (as ``kvgrant ...
    | head`` sees it once head exits); ``fileno`` is a descriptor of our own, which the
    CLI points at /dev/null."""

    def __init__(self, fd: int) -> None:
        super().__init__()
        self._fd = fd

    def writable(self) -> bool:
        return True

    def write(self, text: str) -> int:
        raise BrokenPipeError(errno.EPIPE, "Broken pipe")

    def flush(self) -> None:
        pass

    def fileno(self) -> int:
        return self._fd


# ------------------------------------------------------------------ cli.py
def test_a_reader_that_went_away_ends_the_command_with_the_sigpipe_status(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """``kvgrant budget --json | head -c0``: the write fails with EPIPE and the command
    exits 141, as a shell reports a SIGPIPE death, without a traceback (mutant: exit 1,
    which a pipeline reads as the command's own failure)."""
    from kvgrant.cli import main

    fd = os.open(os.devnull, os.O_WRONLY)
    try:
        err = io.StringIO()
        monkeypatch.setattr(sys, "stdout", _ClosedPipe(fd))
        with contextlib.redirect_stderr(err):
            rc = main(["budget", "--ledger", str(tmp_path / "ledger.json"), "--json"])
        monkeypatch.undo()
    finally:
        os.close(fd)
    assert rc == 141, rc
    assert "Traceback" not in err.getvalue()


# ------------------------------------------------------------------ _args.py
def test_the_largest_count_is_accepted_and_one_more_is_refused(tmp_path: Path) -> None:
    """A count option takes up to 10**15 (MAX_COUNT) inclusive: ``--handle-budget
    1000000000000000`` runs and is reported as given, one more is refused naming the
    cap (mutant: ``>=``, the cap itself refused)."""
    ledger = str(tmp_path / "ledger.json")
    res = cli(["budget", "--ledger", ledger, "--handle-budget", "1000000000000000",
               "--json"])
    assert res.rc == 0, res.err
    assert res.doc()["budget"] == 10**15
    res = cli(["budget", "--ledger", ledger, "--handle-budget", "1000000000000001"])
    assert res.rc == 2
    assert "must be at most 1,000,000,000,000,000" in res.err


def test_the_largest_cuda_ordinal_is_a_device(tmp_path: Path) -> None:
    """``--devices`` takes ordinals up to MAX_DEVICE_ORDINAL (1023) inclusive: a rank on
    device 1023 of the simulated host runs, and 1024 is refused naming the range
    (mutant: ``>=``, device 1023 refused)."""
    from kvgrant.runtime.arguments import MAX_DEVICE_ORDINAL

    top = MAX_DEVICE_ORDINAL
    res = cli(["alloc", str(SMALL), *SIM, "--devices", f"0,1,{top}", "--json"])
    assert res.rc == 0, res.err
    assert res.doc()["devices"] == [0, 1, top]
    res = cli(["alloc", str(SMALL), *SIM, "--devices", f"0,1,{top + 1}"])
    assert res.rc == 2
    assert f"a CUDA ordinal must be in 0..{top}" in res.err


# ------------------------------------------------------------------ plan.py
def test_plan_takes_an_explicit_zero_handle_reserve(tmp_path: Path) -> None:
    """``kvgrant plan --handle-reserve 0`` counts no reserve, as ``kvgrant alloc
    --handle-reserve 0`` does (mutant: ``args.handle_reserve or DEFAULT``, so 0 became
    the default 4,096 and "fits" no longer meant alloc's pre-flight accepts it)."""
    res = cli(["plan", str(SMALL), "--no-bound", "--handle-reserve", "0", "--json"])
    assert res.rc == 0, res.err
    doc = res.doc()
    assert doc["handle_reserve"] == 0, doc["handle_reserve"]


# ------------------------------------------------------------------ budget.py
def test_budget_with_a_margin_of_exactly_zero_is_not_overcommitted(tmp_path: Path) -> None:
    """Held + reserve == budget leaves a margin of 0: the host is full, not overcommitted
    (mutant: ``margin > 0``, which printed OVERCOMMITTED for a host kvgrant's own
    pre-flight accepts, ``held + reserve <= budget``)."""
    res = cli(["budget", "--ledger", str(tmp_path / "ledger.json"),
               "--handle-budget", "4096", "--handle-reserve", "4096"])
    assert res.rc == 0, res.err
    assert "margin +0" in res.out, res.out
    assert "OVERCOMMITTED" not in res.out


# ------------------------------------------------------------------ alloc.py
def test_a_ledger_named_by_the_environment_that_is_the_geometry_is_refused(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """``KVGRANT_LEDGER`` naming the geometry file being read is refused up front as bad
    input naming the variable, and the geometry is left as it was (mutant: only the
    ``--ledger`` option was compared with the inputs, so the run went on to read the
    geometry as a ledger and failed with exit 1, advising ``kvgrant budget --repair``,
    which would have replaced the geometry by an empty ledger)."""
    geometry = tmp_path / "g.json"
    geometry.write_bytes(SMALL.read_bytes())
    monkeypatch.setenv("KVGRANT_LEDGER", str(geometry))
    res = cli(["alloc", str(geometry), *SIM, "--json"])
    assert res.rc == 2, (res.rc, res.err)
    doc = res.doc()
    assert doc["kind"] == "ArgumentError" and doc["argument"] == "KVGRANT_LEDGER", doc
    assert "is the geometry file" in doc["message"]
    assert geometry.read_bytes() == SMALL.read_bytes()


def test_alloc_json_names_the_trace_written_through_the_environment(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """With ``KVGRANT_TRACE`` (no ``--trace``) the ``--json`` summary's ``trace`` is the
    file that was written, as the text output's "trace:" line says (mutant: the field
    came from the ``--trace`` option and was null)."""
    trace = tmp_path / "t.ndjson"
    monkeypatch.setenv("KVGRANT_TRACE", str(trace))
    res = cli(["alloc", str(SMALL), *SIM, "--json"])
    assert res.rc == 0, res.err
    doc = res.doc()
    assert doc["trace"] is not None and Path(doc["trace"]) == trace, doc["trace"]
    assert json.loads(trace.read_text().splitlines()[0])["kind"] == "header"


# ------------------------------------------------------------------ conform.py
def test_a_tlc_option_with_the_python_engine_names_the_one_trace_as_a_path(
        small_trace: Path) -> None:
    """``conform T --tlc-timeout 5 --json`` (the python engine runs no TLC) is refused,
    exit 2, and its document's ``trace`` is the file, a string, as in every other
    document of a single trace (mutant: the list of operands, ``["T"]``)."""
    res = cli(["conform", str(small_trace), "--tlc-timeout", "5", "--json"])
    assert res.rc == 2, (res.rc, res.err)
    doc = res.doc()
    assert doc["kind"] == "ArgumentError" and "--tlc-timeout = 5" in doc["message"], doc
    assert doc["trace"] == str(small_trace), doc["trace"]
    # and, as every other ArgumentError document, the argument and its value (conform's
    # refusals left both out)
    assert (doc["argument"], doc["value"]) == ("tlc-timeout", 5), doc


def test_conform_ranks_without_geometry_names_the_argument_in_its_document(
        small_trace: Path) -> None:
    """``--ranks`` needs ``--geometry``: exit 2, and the document names the argument
    and its value, as ``kvgrant alloc``'s ArgumentError documents do."""
    res = cli(["conform", str(small_trace), "--ranks", "2", "--json"])
    assert res.rc == 2, (res.rc, res.err)
    doc = res.doc()
    assert doc["kind"] == "ArgumentError" and doc["error"] == "argument", doc
    assert (doc["argument"], doc["value"]) == ("ranks", 2), doc


def test_tlc_max_events_zero_hands_any_trace_to_tlc(
        small_trace: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """``--tlc-max-events 0`` means no limit: the trace goes to the TLC engine however
    long it is (mutant: ``n > limit`` without the 0 test refused every trace as "more
    than the 0 events TLC checks"). TLC itself is replaced by the Python replay here:
    what is checked is the gate in front of it, not TLC."""
    import dataclasses

    from kvgrant.commands import conform
    from kvgrant.conformance import replay

    handed: list[int] = []

    def fake_tlc(trace: Any, args: Any) -> Any:
        handed.append(len(trace.events))
        # (replay refuses engine="tlc": it runs the Python model only)
        return dataclasses.replace(replay(trace), engine="tlc")

    monkeypatch.setattr(conform, "_check_tlc", fake_tlc)
    res = cli(["conform", str(small_trace), "--engine", "tlc", "--tlc-max-events", "0",
               "--json"])
    assert res.rc == 0, (res.rc, res.out, res.err)
    assert res.doc()["accepted"] is True
    assert handed and handed[0] > 0


# ------------------------------------------------------------------ more of cli.py, _report.py, budget.py
def test_the_shortest_abbreviation_of_json_still_prints_the_usage_error_document() -> None:
    """``--j`` is an abbreviation argparse accepts for ``--json``; a usage error on that
    command line prints the error document too (mutant: only ``--js`` and longer were
    recognised, so ``--j`` gave an empty stdout and exit 2)."""
    res = cli(["alloc", str(SMALL), *SIM, "--j", "--fail-at=0"])
    assert res.rc == 2
    doc = res.doc()
    assert doc["kind"] == "ArgumentError" and doc["argument"] == "fail-at", doc


def test_an_error_value_of_exactly_200_json_characters_is_kept_as_it_is(
        tmp_path: Path) -> None:
    """An error document's ``value`` is the value itself while its JSON is at most 200
    characters (longer ones become a short repr): a ``--ledger`` path whose JSON form
    is exactly 200 characters comes back as the path (mutant: ``< 200``, it came back
    as a quoted repr)."""
    base = str(tmp_path / "missing") + "/"
    path = base + "l" * (198 - len(base))
    assert len(json.dumps(path)) == 200
    res = cli(["budget", "--ledger", path, "--json"])
    assert res.rc == 2, (res.rc, res.err)
    doc = res.doc()
    assert doc["argument"] == "ledger" and doc["value"] == path, doc["value"]


def test_budget_lists_a_holder_of_an_earlier_boot_once(tmp_path: Path) -> None:
    """A holder recorded in an earlier boot of this host is dropped and said once, in
    the "earlier boot" line, not again as "reaped (process gone)" (mutant: every reaped
    holder was listed, the earlier boot's too)."""
    from kvgrant.runtime.ledger import HostLedger

    path = tmp_path / "ledger.json"
    lease = HostLedger(path).reserve(7, geometry="old", label="packed", budget=10_000,
                                     reserve=0, devices=[0])
    doc = json.loads(path.read_text())
    lease.release()
    doc["boot_id"] = "0" * 32 if doc.get("boot_id") != "0" * 32 else "1" * 32
    path.write_text(json.dumps(doc))
    res = cli(["budget", "--ledger", str(path)])
    assert res.rc == 0, res.err
    assert "dropped 1 holder(s) recorded in an earlier boot" in res.out, res.out
    assert "reaped (process gone)" not in res.out, res.out
