"""Review findings on the CLI: one JSON error document for every error with --json
(argparse's usage errors included), --fail-at past the plan's last driver call refused
up front, a --ledger path in a missing folder refused before anything is allocated,
conform --ranks without --geometry refused, and duplicate JSON keys refused where the
commands read JSON.

Each test runs ``kvgrant.cli.main`` in this process (the sim backend; milliseconds).
"""

from __future__ import annotations

import contextlib
import io
import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence

import pytest

ROOT = Path(__file__).resolve().parents[1]
SMALL = ROOT / "examples" / "small.json"
SIM = ["--backend", "sim"]


@dataclass
class Result:
    rc: int
    out: str
    err: str

    def doc(self) -> dict[str, Any]:
        """stdout as exactly one JSON document."""
        value = json.loads(self.out)
        assert isinstance(value, dict), self.out
        return value


def cli(argv: Sequence[str]) -> Result:
    from kvgrant.cli import main

    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            rc = main(list(argv))
        except SystemExit as exc:  # argparse
            rc = exc.code if isinstance(exc.code, int) else 2
    return Result(int(rc), out.getvalue(), err.getvalue())


def assert_error_document(res: Result, kind: str, status: int) -> dict[str, Any]:
    """The fields every error document has, and a human-readable stderr."""
    assert res.rc == status, (res.rc, res.out, res.err)
    doc = res.doc()
    assert doc["ok"] is False and doc["kind"] == kind, doc
    assert doc["exit_status"] == status, doc
    assert isinstance(doc["message"], str) and doc["message"], doc
    assert "error:" in res.err and not res.err.lstrip().startswith("{"), res.err
    return doc


@pytest.fixture(scope="module")
def small_trace(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("trace") / "small.ndjson"
    res = cli(["alloc", str(SMALL), *SIM, "--trace", str(path)])
    assert res.rc == 0, res.err
    return path


# ------------------------------------------------- 1. --json: one error document

@pytest.mark.parametrize("argv", [
    ["alloc", str(SMALL), *SIM, "--json", "--fail-at=0"],
    ["alloc", str(SMALL), *SIM, "--json", "--no-such-option"],
    ["alloc", str(SMALL), *SIM, "--js", "--devices=0,0,1"],       # an abbreviation
    ["plan", "--json"],                                            # GEOMETRY missing
    ["plan", str(SMALL), "--json", "--handle-budget=x"],
    ["conform", str(SMALL), "--json", "--engine", "nope"],
    ["budget", "--json", "--handle-budget", "-5"],
    ["verify", "--json", "--workers", "0"],
], ids=lambda a: " ".join(a[:1] + a[-2:]))
def test_a_usage_error_with_json_prints_the_error_document(argv: list[str]) -> None:
    # was: argparse's usage and message on stderr only, nothing on stdout
    res = cli(argv)
    doc = assert_error_document(res, "ArgumentError", 2)
    assert "usage:" in res.err, res.err
    assert doc["message"] in res.err, (doc, res.err)


def test_a_usage_error_without_json_prints_nothing_on_stdout() -> None:
    res = cli(["alloc", str(SMALL), *SIM, "--fail-at=0"])
    assert res.rc == 2 and res.out == "" and "usage:" in res.err


def test_json_after_a_double_dash_is_an_operand_not_the_option() -> None:
    from kvgrant.cli import asks_for_json

    assert asks_for_json(["alloc", "g.json", "--json"])
    assert not asks_for_json(["conform", "--", "--json"])
    assert not asks_for_json(["alloc", "g.json", "-j"])


def test_errors_raised_to_the_cli_print_the_document(tmp_path: Path) -> None:
    # was: budget and verify printed nothing on stdout with --json
    bad = tmp_path / "ledger.json"
    bad.write_text("[")  # truncated ("[]", a JSON document, is NotALedger: below)
    doc = assert_error_document(cli(["budget", "--json", "--ledger", str(bad)]),
                                "LedgerError", 1)
    assert doc["path"] == str(bad), doc
    bad.write_text("[]")
    doc = assert_error_document(cli(["budget", "--json", "--ledger", str(bad)]),
                                "NotALedger", 1)
    assert doc["path"] == str(bad) and "--repair" not in doc["message"], doc
    assert_error_document(cli(["verify", "--json", str(tmp_path / "none")]), "ToolError", 2)


def test_alloc_refusals_that_printed_only_stderr_print_the_document() -> None:
    doc = assert_error_document(cli(["alloc", str(SMALL), *SIM, "--fail-rank", "1",
                                     "--json"]), "ArgumentError", 2)
    assert doc["argument"] == "fail-rank" and doc["value"] == 1, doc


def test_the_existing_documents_keep_their_keys(tmp_path: Path) -> None:
    doc = assert_error_document(cli(["alloc", str(tmp_path / "no.json"), *SIM, "--json"]),
                                "GeometryError", 2)
    assert doc["error"] == doc["message"] and doc["field"] == "<file>", doc
    doc = assert_error_document(cli(["plan", str(tmp_path / "no.json"), "--json"]),
                                "GeometryError", 2)
    assert doc["error"] == doc["message"] and doc["field"] == "<file>", doc
    empty = tmp_path / "empty.ndjson"
    empty.write_text("")
    doc = assert_error_document(cli(["conform", str(empty), "--json"]), "TraceError", 2)
    assert doc["error"] == "malformed" and doc["line"] == 1, doc  # conform's code, as before


# ------------------------------------------- 2. --fail-at past the plan's last call

def _last_call(extra: list[str]) -> int:
    res = cli(["alloc", str(SMALL), *SIM, *extra, "--fail-at", "1000000"])
    assert res.rc == 2 and res.out == "", (res.rc, res.out, res.err)
    m = re.search(r"--fail-at = 1000000: must be at most (\d+) \(the driver calls this "
                  r"plan makes", res.err)
    assert m, res.err
    return int(m.group(1))


@pytest.mark.parametrize("extra", [[], ["--plan", "naive"], ["--plan", "reference"],
                                   ["--ranks", "2"], ["--memory-limit=30M"],
                                   ["--plan", "naive", "--memory-limit=30M"]],
                         ids=lambda e: " ".join(e) or "packed")
def test_fail_at_is_refused_past_the_last_call_and_fires_at_it(extra: list[str]) -> None:
    # was: exit 1 after a whole run (published, released), "the fault never fired"
    last = _last_call(extra)
    res = cli(["alloc", str(SMALL), *SIM, *extra, "--fail-at", str(last)])
    # the last call frees a rank's VA reservation in the release: it fired
    assert res.rc == 1 and "cuMemAddressFree failed with CUDA_ERROR_OUT_OF_MEMORY" in res.err, \
        res.err
    assert "never fired" not in res.err, res.err
    res = cli(["alloc", str(SMALL), *SIM, *extra, "--fail-at", str(last + 1), "--json"])
    doc = assert_error_document(res, "ArgumentError", 2)
    assert doc["argument"] == "fail-at" and doc["value"] == last + 1, doc
    assert f"must be at most {last} " in doc["message"], doc


def test_fail_at_is_refused_before_anything_is_allocated(tmp_path: Path) -> None:
    trace = tmp_path / "t.ndjson"
    ledger = tmp_path / "ledger.json"
    res = cli(["alloc", str(SMALL), *SIM, "--fail-at", "1000000", "--trace", str(trace),
               "--ledger", str(ledger)])
    assert res.rc == 2, res.err
    assert not trace.exists()
    if ledger.exists():
        assert cli(["budget", "--ledger", str(ledger), "--json"]).doc()["held"] == 0


def test_the_count_is_the_driver_calls_of_a_clean_run() -> None:
    from kvgrant.runtime.allocator import allocate

    pub = allocate(str(SMALL), backend="sim")
    pub.release()
    assert _last_call([]) == sum(pub.driver.calls.values())


# ---------------------------------------------------- 3. --ledger checked up front

@pytest.mark.parametrize("command", [["alloc", str(SMALL), *SIM], ["budget"],
                                     ["alloc", str(SMALL), *SIM, "--procs", "3"]],
                         ids=["alloc", "budget", "alloc-procs"])
@pytest.mark.parametrize("where", ["missing", "file", "folder"])
def test_a_ledger_path_that_cannot_be_made_is_bad_input(tmp_path: Path, command: list[str],
                                                        where: str) -> None:
    # was: exit 1 (LedgerError naming a temporary file), after planning
    a_file = tmp_path / "f.json"
    a_file.write_text("{}")
    path = {"missing": tmp_path / "no" / "such" / "ledger.json",
            "file": a_file / "ledger.json", "folder": tmp_path}[where]
    rule = {"missing": f"its folder {str(path.parent)!r} does not exist",
            "file": f"its folder {str(a_file)!r} is a file, not a folder",
            "folder": "is a folder"}[where]
    trace = tmp_path / "t.ndjson" if command[0] == "alloc" and "--procs" not in command \
        else None
    argv = [*command, "--ledger", str(path), "--json"] + (
        ["--trace", str(trace)] if trace else [])
    res = cli(argv)
    doc = assert_error_document(res, "ArgumentError", 2)
    assert doc["message"].startswith(f"--ledger = {str(path)!r}: {rule}"), doc
    assert doc["argument"] == "ledger" and doc["value"] == str(path), doc
    assert trace is None or not trace.exists()
    assert not (tmp_path / "no").exists()


def test_the_ledger_named_by_the_environment_is_checked_too(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "no" / "ledger.json"
    monkeypatch.setenv("KVGRANT_LEDGER", str(path))
    res = cli(["budget"])
    assert res.rc == 2 and f"KVGRANT_LEDGER = {str(path)!r}: its folder" in res.err, res.err


def test_a_ledger_in_an_existing_folder_still_works(tmp_path: Path) -> None:
    ledger = tmp_path / "ledger.json"
    assert cli(["alloc", str(SMALL), *SIM, "--ledger", str(ledger)]).rc == 0
    assert cli(["budget", "--ledger", str(ledger)]).rc == 0


# ------------------------------------------------ 4. conform --ranks needs --geometry

def test_conform_ranks_without_geometry_is_refused(small_trace: Path) -> None:
    # was: accepted, --ranks silently ignored (exit 0)
    res = cli(["conform", str(small_trace), "--ranks", "2"])
    assert res.rc == 2 and "--ranks = 2: needs --geometry" in res.err, res.err
    assert res.out == ""
    doc = assert_error_document(cli(["conform", str(small_trace), "--ranks", "2", "--json"]),
                                "ArgumentError", 2)
    assert doc["trace"] == str(small_trace) and doc["error"] == "argument", doc


def test_conform_ranks_with_geometry_still_compares(small_trace: Path) -> None:
    # the trace was recorded on the geometry's own 3 ranks; --ranks 3 makes all-to-all
    # readers, which the header does not have: a mismatch, exit 1 (not a refusal)
    res = cli(["conform", str(small_trace), "--geometry", str(SMALL), "--ranks", "3"])
    assert res.rc == 1 and "does not match" in res.err, res.err
    assert cli(["conform", str(small_trace), "--geometry", str(SMALL)]).rc == 0


# ------------------------------------------------------- 5. duplicate JSON keys

def _with_duplicate(text: str, key: str, value: str) -> str:
    """``text`` (a JSON object) with ``key`` named once more, first."""
    return text.replace("{", f'{{"{key}": {value}, ', 1)


@pytest.mark.parametrize("command", [["plan"], ["alloc", *SIM]], ids=["plan", "alloc"])
def test_a_geometry_naming_a_key_twice_is_refused(tmp_path: Path, command: list[str]) -> None:
    geometry = tmp_path / "g.json"
    geometry.write_text(_with_duplicate(SMALL.read_text(), "pages", "3"))
    doc = assert_error_document(cli([command[0], str(geometry), *command[1:], "--json"]),
                                "GeometryError", 2)
    assert str(geometry) in doc["message"] and doc["field"] == "pages", doc
    assert 'key "pages" appears twice' in doc["message"], doc


def test_conform_geometry_naming_a_key_twice_is_refused(tmp_path: Path,
                                                        small_trace: Path) -> None:
    geometry = tmp_path / "g.json"
    geometry.write_text(_with_duplicate(SMALL.read_text(), "pages", "3"))
    res = cli(["conform", str(small_trace), "--geometry", str(geometry)])
    assert res.rc == 2 and str(geometry) in res.err and 'key "pages" appears twice' in res.err


def test_a_plan_file_naming_a_key_twice_is_refused(tmp_path: Path) -> None:
    report = cli(["plan", str(SMALL), "--json", "--no-bound"])
    assert report.rc == 0, report.err
    plan = report.doc()["packed_plan"]
    text = json.dumps(plan)
    path = tmp_path / "p.json"
    path.write_text(_with_duplicate(text, "version", json.dumps(plan["version"])))
    doc = assert_error_document(cli(["alloc", str(SMALL), *SIM, "--plan", str(path), "--json"]),
                                "PlanFileError", 2)
    assert str(path) in doc["message"] and 'key "version" appears twice' in doc["message"], doc


def test_a_trace_target_whose_first_line_names_kind_twice_is_not_overwritten(
        tmp_path: Path) -> None:
    # was: read with json.loads (the last "kind" won), taken for a trace and overwritten
    target = tmp_path / "notes.json"
    content = '{"kind": "notes", "kind": "header"}\nkeep me\n'
    target.write_text(content)
    res = cli(["alloc", str(SMALL), *SIM, "--trace", str(target)])
    assert res.rc == 2 and "is not a kvgrant trace" in res.err, res.err
    assert target.read_text() == content


@pytest.mark.skipif(not Path("/proc/version").is_file(), reason="needs Linux's /proc")
def test_a_trace_target_that_reports_no_bytes_but_holds_some_is_read_not_sized(
        tmp_path: Path) -> None:
    # was: judged empty by its size (0 for a /proc file), allocated, then failed to write
    res = cli(["alloc", str(SMALL), *SIM, "--trace", "/proc/version"])
    assert res.rc == 2 and "'/proc/version': exists and is not a kvgrant trace" in res.err, \
        res.err
    empty = tmp_path / "empty.ndjson"
    empty.write_text("")
    res = cli(["alloc", str(SMALL), *SIM, "--trace", str(empty)])  # truly empty: written
    assert res.rc == 0, res.err
    assert json.loads(empty.read_text().splitlines()[0])["kind"] == "header"


def test_a_kvgrant_trace_path_that_is_not_a_trace_is_refused_naming_the_variable(
        tmp_path: Path, monkeypatch: Any) -> None:
    # was: "--trace = ...", an option the user never gave
    other = tmp_path / "notes.txt"
    other.write_text("keep me\n")
    monkeypatch.setenv("KVGRANT_TRACE", str(other))
    res = cli(["alloc", str(SMALL), *SIM, "--json"])
    assert res.rc == 2, res.err
    assert res.doc()["argument"] == "KVGRANT_TRACE"
    assert f"KVGRANT_TRACE = {str(other)!r}: exists and is not a kvgrant trace" in res.err
    assert other.read_text() == "keep me\n"


def test_a_switch_word_in_kvgrant_ledger_is_refused_up_front(monkeypatch: Any) -> None:
    monkeypatch.setenv("KVGRANT_LEDGER", "yes")
    res = cli(["alloc", str(SMALL), *SIM, "--json"])
    assert res.rc == 2 and res.doc()["argument"] == "KVGRANT_LEDGER", res.err
    assert not Path("yes").exists()


def test_a_malformed_group_trace_with_json_prints_the_common_error_document(
        tmp_path: Path) -> None:
    # was: group mode printed {"traces", "mode", "engine", "error", "line", "message"}
    # without ok, kind and exit_status, unlike every other error document
    import shutil

    src = ROOT / "tests" / "fixtures" / "group" / "2proc-owner-crashes"
    bad = tmp_path / "group"
    shutil.copytree(src, bad)
    with (bad / "rank1.ndjson").open("a") as fh:
        fh.write("garbage\n")
    res = cli(["conform", str(bad), "--json"])
    assert res.rc == 2, res.err
    doc = res.doc()
    assert doc["ok"] is False and doc["kind"] == "TraceError" and doc["exit_status"] == 2
    assert doc["mode"] == "group" and doc["error"] == "malformed" and doc["line"]


def test_budget_on_a_path_with_no_ledger_yet_lists_nothing_and_creates_nothing(
        tmp_path: Path) -> None:
    """A listing is a read: a mistyped --ledger used to become a new empty ledger file
    (and look like an idle host); now it says there is no file yet, and leaves none."""
    path = tmp_path / "typo-ledger.json"
    res = cli(["budget", "--ledger", str(path), "--json"])
    assert res.rc == 0, res
    doc = res.doc()
    assert doc["ok"] is True and doc["exit_status"] == 0 and doc["exists"] is False, doc
    assert doc["holders"] == [] and doc["held"] == 0, doc
    assert doc["margin"] == doc["binding_budget"] - doc["binding_reserve"], doc
    res = cli(["budget", "--ledger", str(path)])
    assert res.rc == 0 and "no such file yet, so 0 holder(s)" in res.out, res
    assert not path.exists() and list(tmp_path.iterdir()) == []
    # a ledger that exists is read as before (and says so)
    from kvgrant.runtime.ledger import HostLedger

    HostLedger(path).holders()  # the library creates it, as a reserving process does
    doc = cli(["budget", "--ledger", str(path), "--json"]).doc()
    assert doc["exists"] is True and doc["ok"] is True and doc["exit_status"] == 0, doc


def test_success_documents_carry_ok_and_exit_status(tmp_path: Path) -> None:
    """Every --json document has ``ok`` and ``exit_status`` (docs/conformance.md); the
    success documents of plan and alloc had only ``ok``, budget's neither."""
    plan = cli(["plan", str(SMALL), "--json"])
    assert plan.rc == 0 and plan.doc()["ok"] is True and plan.doc()["exit_status"] == 0
    alloc = cli(["alloc", str(SMALL), "--backend", "sim", "--json"])
    assert alloc.rc == 0 and alloc.doc()["ok"] is True and alloc.doc()["exit_status"] == 0


def test_a_negative_memory_limit_may_follow_its_option_as_a_separate_word() -> None:
    """``--memory-limit -1G`` (argparse alone: "expected one argument") is
    ``--memory-limit=-1G``; another option after it and words after ``--`` stay as
    they are."""
    from kvgrant.cli import _negative_values_joined

    assert _negative_values_joined(["alloc", "g.json", "--memory-limit", "-1G"]) == [
        "alloc", "g.json", "--memory-limit=-1G"]
    assert _negative_values_joined(["alloc", "--memory-limit", "-.5G", "x"]) == [
        "alloc", "--memory-limit=-.5G", "x"]
    assert _negative_values_joined(["alloc", "--memory-limit", "--json"]) == [
        "alloc", "--memory-limit", "--json"]
    assert _negative_values_joined(["alloc", "--", "--memory-limit", "-1G"]) == [
        "alloc", "--", "--memory-limit", "-1G"]
    res = cli(["alloc", str(SMALL), "--backend", "sim", "--memory-limit", "-1G", "--json"])
    assert res.rc == 0 and res.doc()["ok"] is True, res
    res = cli(["alloc", str(SMALL), "--backend", "sim", "--memory-limit", "--json"])
    assert res.rc == 2 and "--memory-limit" in res.err, res


def test_version_prints_the_package_version(capsys: pytest.CaptureFixture[str]) -> None:
    import kvgrant
    from kvgrant.cli import main

    with pytest.raises(SystemExit) as info:
        main(["--version"])
    assert info.value.code == 0
    assert capsys.readouterr().out.strip() == f"kvgrant {kvgrant.__version__}"


def test_a_geometry_given_as_a_trace_is_named_as_such(tmp_path: Path) -> None:
    res = cli(["conform", str(SMALL)])
    assert res.rc == 2 and "one JSON document over several lines, not a trace" in res.err, res
    res = cli(["conform", str(tmp_path / "missing.ndjson")])
    assert res.rc == 2 and "malformed" not in res.err and "cannot read trace" in res.err, res


def test_a_trace_made_on_fewer_ranks_is_told_to_add_ranks(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """`kvgrant alloc G --ranks 2` then `conform --geometry G` without --ranks: the
    rejection says how to check it (not when the trace has more ranks, nor with
    --ranks given)."""
    trace = tmp_path / "r2.ndjson"
    big = ROOT / "examples" / "published-dcp8.json"
    assert cli(["alloc", str(big), "--backend", "sim", "--ranks", "2", "--trace",
                str(trace)]).rc == 0
    res = cli(["conform", str(trace), "--geometry", str(big)])
    assert res.rc == 1 and "check it with --ranks 2 too" in res.err, res.err
    assert cli(["conform", str(trace), "--geometry", str(big), "--ranks", "2"]).rc == 0
    from argparse import Namespace

    from kvgrant.commands.conform import _geometry_rejected

    for diff, hint in (("header.ranks = 16 but the geometry has 3 ranks", False),
                       ("r1.ndjson: header.ranks = 3 but the geometry has 16 ranks", True)):
        args = Namespace(geometry="g.json", json=False, trace="t", engine="python", ranks=None)
        assert _geometry_rejected(args, [diff]) == 1
        assert ("check it with --ranks 3 too" in capsys.readouterr().err) is hint
    # a value too long for the line is cut with a mark, and the geometry's side stays
    res = cli(["conform", str(trace), "--geometry", str(SMALL), "--ranks", "2"])
    assert res.rc == 1 and "check it with" not in res.err, res.err
    assert re.search(r"header\.planes = \[.*\.\.\. \(cut \(16 items\)\) but the geometry "
                     r"says \[\['kv0', 0, \d+\], \['kv1'", res.err), res.err


def test_counts_in_messages_have_thousands_separators(tmp_path: Path) -> None:
    trace = tmp_path / "t.ndjson"
    big = ROOT / "examples" / "published-dcp8.json"
    res = cli(["alloc", str(big), "--backend", "sim", "--ranks", "2", "--trace", str(trace)])
    assert res.rc == 0 and "published: 2,234 KV pages" in res.out, res.out
    res = cli(["conform", str(trace)])
    assert res.rc == 0 and re.search(r"accepted by python: \d{1,3}(,\d{3})+ events", res.out), \
        res.out


def test_a_folder_given_as_the_trace_is_named_as_the_option(tmp_path: Path) -> None:
    res = cli(["alloc", str(SMALL), "--backend", "sim", "--trace", str(tmp_path)])
    assert res.rc == 2 and f"--trace = {str(tmp_path)!r}: is a folder" in res.err, res.err
