"""Bad-input gaps of the CLI, third review: NaN / Infinity in a geometry or plan file
named by field, value and rule; Ctrl-C (SIGINT) with --json prints one error document
(exit 130) and leaves nothing allocated, the release included; and --fail-at past the
last driver call of the failing rank's process refused before any process starts with
--procs, as it is without.

Most tests run ``kvgrant.cli.main`` in this process (the sim backend; milliseconds);
the test that the --procs count is exact starts real groups in child processes.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import re
import signal
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator, Sequence

import pytest

from kvgrant.errors import GeometryError, PlanFileError

ROOT = Path(__file__).resolve().parents[1]
SMALL = ROOT / "examples" / "small.json"
SIM = ["--backend", "sim"]


@dataclass
class Result:
    rc: int
    out: str
    err: str

    def doc(self) -> dict[str, Any]:
        """stdout as exactly one JSON document, strictly (no NaN token either)."""
        lines = self.out.splitlines()
        assert len(lines) == 1, self.out
        value = json.loads(lines[0], parse_constant=_no_constant)
        assert isinstance(value, dict), self.out
        return value


def _no_constant(name: str) -> Any:
    raise AssertionError(f"the document holds {name}, which is not JSON")


def cli(argv: Sequence[str]) -> Result:
    from kvgrant.cli import main

    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            rc = main(list(argv))
        except SystemExit as exc:  # argparse
            rc = exc.code if isinstance(exc.code, int) else 2
    return Result(int(rc), out.getvalue(), err.getvalue())


# ------------------------------------------------ 1. NaN / Infinity, named by field

def _geometry_with(tmp_path: Path, old: str, new: str) -> Path:
    text = json.dumps(json.loads(SMALL.read_text()))
    assert old in text, old
    # a long folder name: the message must name the file in full however long its path
    # (it was cut at 80 characters, which CI's deeper tmp_path passed)
    folder = tmp_path / ("a-long-folder-name-" * 5)
    folder.mkdir()
    path = folder / "g.json"
    path.write_text(text.replace(old, new, 1))
    return path


GEOMETRY_CASES = [
    ('"pages": 24', '"pages": NaN', "pages", "NaN"),
    ('"bytes_per_page": 1179648', '"bytes_per_page": Infinity',
     "planes[0].bytes_per_page", "Infinity"),
    ('"import_groups": [[0, 1]]', '"import_groups": [[0, -Infinity]]',
     "topology.import_groups[0][1]", "-Infinity"),
    ('"offset": 0, "plane": "kv0"', '"offset": NaN, "plane": "kv0"', "aliases[0].offset",
     "NaN"),
]


@pytest.mark.parametrize("old, new, field, literal", GEOMETRY_CASES,
                         ids=[c[2] for c in GEOMETRY_CASES])
@pytest.mark.parametrize("command", ["plan", "alloc"])
def test_nan_in_a_geometry_file_names_the_field_value_and_rule(
        tmp_path: Path, command: str, old: str, new: str, field: str, literal: str) -> None:
    # was: '"g.json": unreadable JSON value: NaN is not a JSON number', field "<file>"
    path = _geometry_with(tmp_path, old, new)
    extra = SIM if command == "alloc" else []
    res = cli([command, str(path), *extra])
    assert res.rc == 2 and res.out == "", (res.rc, res.out, res.err)
    assert f"{field} = {literal}: must be a finite number: {literal} is not a JSON number " \
           "(JSON has no NaN, Infinity or -Infinity)" in res.err, res.err
    assert json.dumps(str(path)) in res.err, res.err  # the file is still named
    res = cli([command, str(path), *extra, "--json"])
    assert res.rc == 2, res.err
    doc = res.doc()
    assert doc["ok"] is False and doc["kind"] == "GeometryError", doc
    assert doc["exit_status"] == 2, doc
    assert doc["field"] == field and doc["value"] == literal, doc
    assert f"{field} = {literal}: " in doc["message"], doc


@pytest.mark.parametrize("old, new, field, literal", [
    ('"pages": 24', '"pages": 1e309', "pages", "1e309"),
    ('"row_bytes": 8384512', '"row_bytes": -2.5e400', "regions[0].row_bytes", "-2.5e400"),
])
def test_a_number_past_the_largest_double_is_named_as_not_finite(
        tmp_path: Path, old: str, new: str, field: str, literal: str) -> None:
    # was: read as inf: "pages = inf: Input should be a valid integer"
    path = _geometry_with(tmp_path, old, new)
    res = cli(["plan", str(path), "--json"])
    assert res.rc == 2, res.err
    doc = res.doc()
    assert (doc["kind"], doc["field"], doc["value"]) == ("GeometryError", field, literal), doc
    assert f"{field} = {literal}: must be a finite number: {literal} is past the largest " \
           "number a double holds" in doc["message"], doc


LONG_NAME = "x" * 120 + ".json"


@pytest.mark.parametrize("content, rule", [
    (None, "cannot read geometry file"),
    (b"\xff{}", "not UTF-8 text"),
    (b'{"pages": 1,', "JSON"),
])
def test_a_long_geometry_path_is_named_in_full(tmp_path: Path, content: bytes | None,
                                               rule: str) -> None:
    from kvgrant.layout.geometry import load_geometry

    path = tmp_path / LONG_NAME
    if content is not None:
        path.write_bytes(content)
    with pytest.raises(GeometryError) as err:
        load_geometry(path)
    assert rule in str(err.value), err.value
    assert json.dumps(str(path)) in str(err.value), err.value


def test_the_library_error_carries_field_and_value(tmp_path: Path) -> None:
    from kvgrant.layout.geometry import load_geometry

    path = _geometry_with(tmp_path, '"row_bytes": 8384512', '"row_bytes": -Infinity')
    with pytest.raises(GeometryError) as info:
        load_geometry(path)
    assert info.value.field == "regions[0].row_bytes" and info.value.value == "-Infinity"


@pytest.fixture(scope="module")
def plan_doc() -> dict[str, Any]:
    res = cli(["plan", str(SMALL), "--json", "--no-bound"])
    assert res.rc == 0, res.err
    return json.loads(res.out)["packed_plan"]


@pytest.mark.parametrize("wrap", [False, True], ids=["plan document", "plan report"])
def test_nan_in_a_plan_file_names_the_field_value_and_rule(
        tmp_path: Path, plan_doc: dict[str, Any], wrap: bool) -> None:
    # was: 'plan file "p.json": not JSON: NaN is not a JSON number', field "<file>"
    doc: Any = {"packed_plan": plan_doc} if wrap else plan_doc
    text = json.dumps(doc)
    key = '"length": '
    assert key in text
    path = tmp_path / "p.json"
    path.write_text(text.replace(key, key + "NaN, \"was\": ", 1))
    field = ("packed_plan." if wrap else "") + "allocations[0].length"
    res = cli(["alloc", str(SMALL), *SIM, "--plan", str(path), "--json"])
    assert res.rc == 2, res.err
    out = res.doc()
    assert out["kind"] == "PlanFileError" and out["exit_status"] == 2, out
    assert out["field"] == field and out["value"] == "NaN", out
    assert out["path"] == str(path), out
    assert f"plan file {json.dumps(str(path))}: {field} = NaN: must be a finite number" \
        in res.err, res.err


def test_a_plan_file_error_from_the_library_names_the_field(
        tmp_path: Path, plan_doc: dict[str, Any]) -> None:
    from kvgrant.layout.geometry import load_geometry
    from kvgrant.layout.planfile import read_plan_file

    doc = json.loads(json.dumps(plan_doc))
    doc["allocations"][1]["plane_offset"] = "__here__"  # replaced by Infinity below
    path = tmp_path / "p.json"
    path.write_text(json.dumps(doc).replace('"__here__"', "Infinity"))
    with pytest.raises(PlanFileError) as info:
        read_plan_file(path, load_geometry(SMALL))
    assert info.value.field == "allocations[1].plane_offset"
    assert info.value.value == "Infinity"


@pytest.mark.parametrize("text, field, literal", [
    ("NaN", "<root>", "NaN"),
    ('{"a": 1, "b": [2, {"c": 3}], "d": {"e": [NaN, Infinity]}}', "d.e[0]", "NaN"),
    ('[1, {"x": 2}, {"y": [3, -Infinity]}, NaN]', "[2].y[1]", "-Infinity"),
    ('{"a b": {"c": Infinity}}', '["a b"].c', "Infinity"),
    ('{"' + "k" * 200 + '": NaN}', '["' + "k" * 75 + '..."]', "NaN"),
])
def test_strict_json_names_the_first_non_finite_value_in_document_order(
        text: str, field: str, literal: str) -> None:
    from kvgrant.strict_json import NonFiniteNumberError, strict_json_loads

    with pytest.raises(NonFiniteNumberError) as info:
        strict_json_loads(text)
    assert (info.value.field, info.value.value) == (field, literal)
    assert str(info.value).startswith(f"{field} = {literal}: must be a finite number")


def test_strict_json_reads_a_deep_document_and_the_trace_loader_still_lets_nan_through(
        ) -> None:
    import math

    from kvgrant.strict_json import NonFiniteNumberError, strict_json_loads, \
        unique_keys_loads

    deep = "[" * 500 + "NaN" + "]" * 500  # the walk is a loop, not recursion
    with pytest.raises(NonFiniteNumberError) as info:
        strict_json_loads(deep)
    assert info.value.field == "[0]" * 500
    assert strict_json_loads('{"a": [1.5, 2]}') == {"a": [1.5, 2]}
    # the conformance readers' loader is unchanged: their own checks name the field
    assert math.isnan(unique_keys_loads('{"t": NaN}')["t"])


# ----------------------------------------------------------- 2. Ctrl-C with --json

@contextlib.contextmanager
def sigint_sim(at: int | None) -> Iterator[list[Any]]:
    """Every SimDriver the CLI opens sends this process a SIGINT after its ``at``-th
    driver call (tests/runtime/_sigint.py); yields the drivers made."""
    import importlib.util

    import kvgrant.runtime.sim as sim

    spec = importlib.util.spec_from_file_location(
        "_cli3_sigint", ROOT / "tests" / "runtime" / "_sigint.py")
    assert spec is not None and spec.loader is not None
    helper = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(helper)
    SigintSim = helper.SigintSim

    made: list[Any] = []

    class Recorded(SigintSim):
        def __init__(self, **kw: Any) -> None:
            super().__init__(at, **kw)
            made.append(self)

    real = sim.SimDriver
    sim.SimDriver = Recorded  # type: ignore[misc]
    try:
        yield made
    finally:
        sim.SimDriver = real  # type: ignore[misc]
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler


def _clean_calls(extra: Sequence[str] = ()) -> int:
    with sigint_sim(None) as made:
        res = cli(["alloc", str(SMALL), *SIM, *extra])
    assert res.rc == 0, res.err
    return sum(sum(d.calls.values()) for d in made)


def _assert_interrupted_document(res: Result) -> dict[str, Any]:
    assert res.rc == 130, (res.rc, res.out, res.err)
    doc = res.doc()
    assert doc["ok"] is False and doc["kind"] == "Interrupted", doc
    assert doc["exit_status"] == 130 and doc["signal"] == "SIGINT", doc
    assert doc["message"] == doc["error"] and "interrupted (Ctrl-C" in doc["message"], doc
    return doc


def test_ctrl_c_after_any_driver_call_of_alloc_json_prints_one_document_and_leaves_nothing(
        tmp_path: Path) -> None:
    """Every driver call of the start-up and of the release: exit 130, one error
    document, nothing live on any driver the command opened, and the trace (when one
    was written) a behaviour of the model. Was: nothing on stdout; and a Ctrl-C during
    the CLI's release left the cache half released (the release was not held back)."""
    from kvgrant.conformance.replay import replay_file

    n = _clean_calls()
    assert n > 100
    phases = set()
    for k in range(1, n + 1):
        trace = tmp_path / f"k{k}.ndjson"
        with sigint_sim(k) as made:
            res = cli(["alloc", str(SMALL), *SIM, "--json", "--trace", str(trace)])
        _assert_interrupted_document(res)
        assert res.err == "", (k, res.err)
        for d in made:
            assert d.live().is_empty(), (k, d.live())
        if trace.exists() and trace.read_text():
            verdict = replay_file(trace)
            assert verdict.accepted, (k, verdict.summary())
            phases.add(verdict.final_phase)
    assert phases == {"Aborted", "Shutdown"}, phases


def test_ctrl_c_without_json_keeps_the_human_output() -> None:
    """Without --json: exit 130, nothing on stdout or stderr (as before)."""
    n = _clean_calls()
    for k in (1, 10, n // 2, n - 5, n):
        with sigint_sim(k) as made:
            res = cli(["alloc", str(SMALL), *SIM])
        assert (res.rc, res.out, res.err) == (130, "", ""), (k, res)
        assert all(d.live().is_empty() for d in made), k


def _interrupting_run(args: argparse.Namespace) -> int:
    raise KeyboardInterrupt


@pytest.mark.parametrize("argv", [
    ["plan", str(SMALL)], ["alloc", str(SMALL), *SIM], ["conform", "t.ndjson"],
    ["verify"], ["budget"], ["alloc", str(SMALL), *SIM, "--procs", "3"],
], ids=["plan", "alloc", "conform", "verify", "budget", "alloc --procs"])
def test_ctrl_c_in_any_command_with_json_prints_the_document(
        monkeypatch: pytest.MonkeyPatch, argv: list[str]) -> None:
    import importlib

    if "--procs" in argv:  # the launcher re-raises the Ctrl-C after its workers ended
        from kvgrant.runtime import group_launch

        monkeypatch.setattr(group_launch, "launch", lambda spec: _interrupting_run(
            argparse.Namespace()))
    else:
        module = importlib.import_module(f"kvgrant.commands.{argv[0]}")
        monkeypatch.setattr(module, "run", _interrupting_run)
    res = cli([*argv, "--json"])
    _assert_interrupted_document(res)
    assert res.err == ""
    res = cli(argv)
    assert (res.rc, res.out, res.err) == (130, "", "")


def test_ctrl_c_while_the_cli_starts_with_json_prints_the_document(
        monkeypatch: pytest.MonkeyPatch) -> None:
    import kvgrant.cli

    def interrupted(json_errors: bool = False) -> argparse.ArgumentParser:
        raise KeyboardInterrupt  # e.g. while the subcommands are imported

    monkeypatch.setattr(kvgrant.cli, "build_parser", interrupted)
    _assert_interrupted_document(cli(["plan", str(SMALL), "--json"]))
    assert cli(["plan", str(SMALL)]).rc == 130


def test_an_undo_that_failed_while_unwinding_a_ctrl_c_is_named(
        monkeypatch: pytest.MonkeyPatch) -> None:
    from kvgrant.commands import alloc
    from kvgrant.errors import DriverError
    from kvgrant.runtime.transaction import attach_cleanup_errors

    def run(args: argparse.Namespace) -> int:
        err = KeyboardInterrupt()
        attach_cleanup_errors(err, [DriverError("CUDA_ERROR_OUT_OF_MEMORY: unmap failed",
                                                call="cuMemUnmap", result=2,
                                                result_name="CUDA_ERROR_OUT_OF_MEMORY")])
        raise err

    monkeypatch.setattr(alloc, "run", run)
    res = cli(["alloc", str(SMALL), *SIM, "--json"])
    doc = _assert_interrupted_document(res)
    assert doc["cleanup_errors"] == ["DriverError: CUDA_ERROR_OUT_OF_MEMORY: unmap failed"]
    assert "1 undo step(s) failed" in doc["message"], doc
    assert "kvgrant alloc: error: interrupted (Ctrl-C" in res.err, res.err


# ------------------------------- 3. --procs --fail-at past the failing rank's last call

def _group_last(extra: Sequence[str]) -> int:
    res = cli(["alloc", str(SMALL), *SIM, "--procs", "3", *extra, "--fail-at", "100000",
               "--json"])
    assert res.rc == 2, (res.rc, res.out, res.err)
    doc = res.doc()
    assert doc["kind"] == "ArgumentError" and doc["exit_status"] == 2, doc
    assert doc["argument"] == "fail-at" and doc["value"] == 100000, doc
    m = re.search(r"--fail-at = 100000: must be at most (\d+) \(the driver calls of rank "
                  r"(\d)'s process, which --fail-rank picks: 2 before the start-up, (\d+) "
                  r"in it, (\d+) in the release\)", res.err)
    assert m, res.err
    last, _rank, startup, release = map(int, m.groups())
    assert last == 2 + startup + release
    assert "never fired" not in res.err
    return last


@pytest.mark.parametrize("extra, last", [
    # rank 0 imports from rank 1 and exports to it; rank 2 is alone in its group
    ([], 105), (["--fail-rank", "1"], 105), (["--fail-rank", "2"], 54),
    (["--memory-limit=30M"], 105), (["--plan", "naive"], 122),
], ids=lambda v: " ".join(v) if isinstance(v, list) else str(v))
def test_procs_fail_at_past_the_last_call_is_refused_before_any_process_starts(
        tmp_path: Path, extra: list[str], last: int) -> None:
    # was: the group ran (3 processes), published, released, then exit 1 "the fault
    # never fired"; now exit 2 before any process starts, naming the largest K
    trace = tmp_path / "traces"
    assert _group_last([*extra, "--trace", str(trace)]) == last
    assert not trace.exists()  # no worker ran


def test_procs_fail_at_is_not_checked_where_the_group_cannot_be_measured(
        monkeypatch: pytest.MonkeyPatch) -> None:
    from kvgrant.commands.alloc import _check_group_fail_at
    from kvgrant.errors import ArgumentError
    from kvgrant.layout.geometry import load_geometry

    args = argparse.Namespace(backend="sim", memory_limit=None, fail_at=100000,
                              sim_handle_budget=None, sim_pool=None)
    g = load_geometry(SMALL)
    with pytest.raises(ArgumentError, match="must be at most 105"):
        _check_group_fail_at(args, g, "packed", None, 0)
    monkeypatch.setenv("LOCAL_RANK", "0")  # every worker would take device 0
    assert _check_group_fail_at(args, g, "packed", None, 0) is None
    # --memory-limit leaving too little: the run refuses the layout itself
    monkeypatch.delenv("LOCAL_RANK")
    args.memory_limit = "1M"
    assert _check_group_fail_at(args, g, "packed", None, 0) is None


@pytest.mark.parametrize("how", ["KVGRANT_SIM_POOL", "--sim-pool"])
def test_the_procs_fail_at_check_opens_the_workers_sim_host_pool(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, how: str) -> None:
    """The check opens the sim as the workers do, with their budget and host pool (was:
    it opened a sim of the default budget, which, under KVGRANT_SIM_POOL, made the pool
    file with 523,880; every worker asking for 100,000 then failed, an AssertionError
    with an empty message)."""
    pool = tmp_path / "pool"
    opts = ["--sim-handle-budget", "100000"]
    if how == "--sim-pool":
        opts += ["--sim-pool", str(pool)]
    else:
        monkeypatch.setenv("KVGRANT_SIM_POOL", str(pool))
    res = cli(["alloc", str(SMALL), *SIM, "--procs", "3", *opts, "--fail-at", "5", "--json"])
    assert res.rc == 1, (res.rc, res.out, res.err)
    doc = res.doc()
    assert doc["kind"] == "GroupError", doc
    assert "injected fault: call #5 " in doc["message"], doc
    # the pool was made with the workers' budget: a later run asking for it is served
    res = cli(["alloc", str(SMALL), *SIM, *opts, "--json"])
    assert res.rc == 0 and res.doc()["ok"] is True, (res.rc, res.out, res.err)


_LAUNCH = """
import json, sys
from kvgrant.layout.geometry import load_geometry
from kvgrant.runtime import group_launch
g = load_geometry(sys.argv[1])
out = []
for rank, k in json.loads(sys.argv[2]):
    spec = {"geometry": g.model_dump(), "procs": 3, "plan": "packed", "backend": "sim",
            "memory_limit": None, "preflight": True, "trace_dir": None, "fail_at": k,
            "fail_rank": rank, "timeout_s": 60.0, "devices": None, "driver_options": {}}
    out.append([rank, k, group_launch.launch(spec)])
print(json.dumps(out))
"""


def test_the_procs_count_is_exact_the_fault_fires_at_it_and_never_past_it() -> None:
    """K = the refusal's largest fails the failing rank's last call (the free of its
    reservation in the release); K + 1 (started without the CLI's check) never fires:
    every rank publishes and releases."""
    lasts = {0: _group_last([]), 2: _group_last(["--fail-rank", "2"])}
    cases = [[r, k] for r, last in lasts.items() for k in (last, last + 1)]
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    proc = subprocess.run([sys.executable, "-c", _LAUNCH, str(SMALL), json.dumps(cases)],
                          capture_output=True, text=True, timeout=540, cwd=ROOT, env=env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    for rank, k, reports in json.loads(proc.stdout.splitlines()[-1]):
        failed = [r for r in reports if not r.get("ok")]
        if k == lasts[rank]:
            assert [r["rank"] for r in failed] == [rank], (rank, k, reports)
            assert f"injected fault: call #{k} " in failed[0]["error"], failed
            assert "cuMemAddressFree" in failed[0]["error"], failed
        else:
            assert failed == [], (rank, k, failed)
