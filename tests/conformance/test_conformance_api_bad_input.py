"""Bad input to the public conformance API a review found crashing or silently accepted
(each case is the review's reproduction):

1. ``mutants(t, names=["nope"])`` raised KeyError, ``names="drop_grant"`` KeyError 'd';
   ``make_header`` raised TypeError / IndexError or made a header of -1 ranks;
   ``reference_trace(None)`` raised AttributeError and a ``fail_at`` out of range was
   ignored (the trace published as if nothing had failed);
2. a TLC ``timeout`` of "5", nan, -1 or 0 was used only after Java started (TypeError,
   ValueError from selectors, "did not finish within -1 s");
3. ``replay(t, engine="tlc")`` returned a Verdict claiming TLC had judged the trace;
4. ``KVGRANT_SPECS=<a file>`` was reported as ``<file>/KVLifecycle.tla is missing``.

Each is now an ArgumentError (item 4: a ToolError, as a missing spec) whose message
names the argument, the value and the rule. No test here runs Java.
"""

from __future__ import annotations

import math
import sys
import time
from pathlib import Path
from typing import Any, Callable

import pytest

from _conform_support import small_header
from kvgrant.conformance import check_trace, check_trace_tlc, make_header, mutants, \
    reference_trace, replay
from kvgrant.conformance import tlc
from kvgrant.conformance.group_check import check_group
from kvgrant.conformance.group_gen import simulate_group, write_group
from kvgrant.conformance.group_model import constants_from
from kvgrant.conformance.mutants import MUTATIONS, OBJECT_MUTATIONS
from kvgrant.conformance.tla_trace import check_group_tlc, check_traces_tlc
from kvgrant.errors import ArgumentError, ToolError

ROOT = Path(__file__).resolve().parents[2]


def _refused(call: Callable[[], Any], argument: str, *words: str) -> ArgumentError:
    """``call()`` raises an ArgumentError for ``argument`` whose message has ``words``."""
    with pytest.raises(ArgumentError) as info:
        call()
    assert info.value.argument == argument, (info.value.argument, str(info.value))
    for w in words:
        assert w in str(info.value), (w, str(info.value))
    return info.value


# --- 1. mutants, make_header, reference_trace ----------------------------------------------

@pytest.mark.parametrize("names, argument, words", [
    (["nope"], "names", ("names[0] = 'nope'", "must be one of", "drop_grant")),
    (["drop_grant", None], "names", ("names[1] = None", "must be one of")),
    ("drop_grant", "names", ("names = 'drop_grant' (str)", "a list of mutation names")),
    (5, "names", ("names = 5 (int)", "a list of mutation names")),
])
def test_mutants_refuses_unknown_names(names: Any, argument: str,
                                       words: tuple[str, ...]) -> None:
    _refused(lambda: mutants(reference_trace(small_header()), names=names), argument, *words)


def test_mutants_refuses_object_mutations_of_a_version_1_trace() -> None:
    # asymmetric importers: no geometry declares them, so a model-only version-1 header
    # (was: KeyError 'va' from inside the mutation)
    t = reference_trace(make_header(2, 3, aliased=[1], importers={0: [1], 1: []}))
    assert t.header.version == 1
    name = next(iter(OBJECT_MUTATIONS))
    _refused(lambda: mutants(t, names=[name]), "names", name, "version-2 traces only")


def test_mutants_still_makes_the_named_ones() -> None:
    t = reference_trace(small_header())
    assert [m.name for m in mutants(t, names=("drop_grant",))] == ["drop_grant"]
    assert len(mutants(t)) == len(MUTATIONS) + len(OBJECT_MUTATIONS)


@pytest.mark.parametrize("args, kwargs, argument, words", [
    (("2", 3), {}, "ranks", ("ranks = '2' (str)", "an integer in 1..4,096")),
    ((-1, 3), {}, "ranks", ("ranks = -1", "an integer in 1..")),
    ((0, 3), {}, "ranks", ("ranks = 0",)),
    ((True, 3), {}, "ranks", ("ranks = True (bool)",)),
    ((2, 0), {}, "allocs", ("allocs = 0", "an integer in 1..")),
    ((2, 3.0), {}, "allocs", ("allocs = 3.0 (float)",)),
    ((2, 3), {"aliased": [7]}, "aliased", ("aliased = [7]", "7 is not a valid alloc",
                                            "0..2")),
    ((2, 3), {"aliased": "1"}, "aliased", ("aliased = '1' (str)", "a list of alloc")),
    ((2, 3), {"aliased": [0], "owner_only": [1]}, "owner_only",
     ("alloc 1 is not aliased", "subset of aliased")),
    ((2, 3), {"importers": {0: [5]}}, "importers[0]", ("importers[0] = [5]",
                                                       "5 is not a valid rank", "0..1")),
    ((2, 3), {"importers": {5: [0]}}, "importers", ("key 5", "not a rank")),
    ((2, 3), {"importers": {0: [0]}}, "importers", ("importers[0] = [0]",
                                                    "does not import its own memory")),
    ((2, 3), {"importers": [1]}, "importers", ("importers = [1] (list)", "a dict rank")),
    ((2, 3), {"declared_readers": {0: [9]}}, "declared_readers[0]",
     ("declared_readers[0] = [9]", "9 is not a valid rank")),
    ((2, 3), {"declared_readers": {0: [0]}}, "declared_readers",
     ("importer 1 is not a declared reader",)),
])
def test_make_header_refuses_values_no_header_has(args: tuple[Any, ...], kwargs: dict[str, Any],
                                                  argument: str, words: tuple[str, ...]) -> None:
    err = _refused(lambda: make_header(*args, **kwargs), argument, "make_header: ", *words)
    assert isinstance(err, ValueError)  # an ArgumentError is one too


@pytest.mark.parametrize("header", [None, "t.ndjson", 3])
def test_reference_trace_refuses_what_is_not_a_header(header: Any) -> None:
    _refused(lambda: reference_trace(header), "header", "reference_trace: header = ",
             "must be a Header", "make_header")


def test_reference_trace_refuses_a_trace_in_place_of_its_header() -> None:
    t = reference_trace(small_header())
    _refused(lambda: reference_trace(t), "header", "(Trace)", "trace.header")  # type: ignore[arg-type]


@pytest.mark.parametrize("fail_at", ["3", -1, 51, 10 ** 6, True, 3.0])
def test_reference_trace_refuses_a_fail_at_no_driver_call_has(fail_at: Any) -> None:
    # small_header: 3 ranks x (1 Reserve + 4 x (Create, Map, Grant) + 2 aliased x
    # (MapAlias, Grant)) = 51 forward driver calls; was: ignored (published, no Fail)
    _refused(lambda: reference_trace(small_header(), fail_at=fail_at), "fail_at",
             f"fail_at = {fail_at!r}", "None or an integer in 0..50", "51 forward driver calls")


def test_reference_trace_fails_at_the_last_driver_call() -> None:
    t = reference_trace(small_header(), fail_at=50)
    assert sum(not e.ok for e in t.events) == 1 and replay(t).final_phase == "Aborted"


def test_reference_trace_refuses_a_shutdown_that_is_not_a_bool() -> None:
    _refused(lambda: reference_trace(small_header(), shutdown="no"), "shutdown",  # type: ignore[arg-type]
             "shutdown = 'no'", "True or False")


# --- 2. TLC timeouts, refused before Java starts -------------------------------------------

BAD_TIMEOUTS = ["5", math.nan, math.inf, -math.inf, -1, 0, 0.0, True, [5]]


@pytest.fixture
def no_tlc(monkeypatch: pytest.MonkeyPatch) -> None:
    """Starting TLC (a process) fails the test: the timeout must be refused first."""
    def started(*args: Any, **kwargs: Any) -> Any:
        raise AssertionError(f"TLC was started: {args[0] if args else kwargs}")

    monkeypatch.setattr(tlc.subprocess, "Popen", started)


def _timeout_refused(call: Callable[[], Any], timeout: Any, argument: str = "timeout") -> None:
    _refused(call, argument, f"{argument} = {timeout!r}", "finite number of seconds > 0")


def _group(tmp_path: Path) -> list[Path]:
    c = constants_from(2, 1, [0], [], {0: [1], 1: [0]}, {r: [0, 1] for r in range(2)})
    return write_group(simulate_group(c), tmp_path / "g")


@pytest.mark.parametrize("timeout", BAD_TIMEOUTS, ids=repr)
def test_check_trace_tlc_refuses_a_bad_timeout_before_java(no_tlc: None, timeout: Any) -> None:
    _timeout_refused(lambda: check_trace_tlc(reference_trace(small_header()), timeout=timeout),
                     timeout)


@pytest.mark.parametrize("timeout", BAD_TIMEOUTS, ids=repr)
def test_every_tlc_entry_point_refuses_a_bad_timeout_before_java(
        no_tlc: None, tmp_path: Path, timeout: Any) -> None:
    t = reference_trace(small_header())
    _timeout_refused(lambda: check_traces_tlc([t, t], timeout=timeout), timeout)
    specs = ROOT / "specs"
    _timeout_refused(lambda: tlc.run_tlc(specs / "MCKVLifecycle.tla",
                                         specs / "MCKVLifecycle.cfg", timeout=timeout),
                     timeout)
    paths = _group(tmp_path)
    _timeout_refused(lambda: check_group_tlc(paths, timeout=timeout), timeout)
    _timeout_refused(lambda: check_group([str(p) for p in paths], "tlc",
                                         tlc_timeout=timeout), timeout, "tlc_timeout")


def test_check_group_refuses_an_unknown_engine_as_an_argument_error(tmp_path: Path) -> None:
    # was: a bare ValueError (check_trace's was made an ArgumentError)
    _refused(lambda: check_group([str(p) for p in _group(tmp_path)], "fast"), "engine",
             "check_group: engine = 'fast'", "'python', 'tlc' or 'both'")


def test_timeouts_that_are_accepted() -> None:
    for ok in (None, 1, 0.5, 300.0, 5e6):
        assert tlc.check_timeout(ok) == ok


def test_a_timeout_longer_than_one_poll_is_waited_for(tmp_path: Path) -> None:
    # poll() takes at most 2**31 - 1 ms (~24.8 days): `kvgrant verify --timeout 5000000`
    # (the command line takes up to 10**7 s) raised OverflowError once TLC had started
    cmd = [sys.executable, "-c", "print('done')"]
    output, code = tlc._communicate(cmd, tmp_path, 5e6, time.monotonic())
    assert (output.strip(), code) == ("done", 0)


# --- 3. replay runs the Python model only --------------------------------------------------

@pytest.mark.parametrize("engine", ["tlc", None, "both", "Python", 1])
def test_replay_refuses_an_engine_it_does_not_run(engine: Any) -> None:
    t = reference_trace(small_header())
    _refused(lambda: replay(t, engine=engine), "engine", f"replay: engine = {engine!r}",
             "must be 'python'")


def test_replay_and_check_trace_still_name_the_python_engine() -> None:
    t = reference_trace(small_header())
    assert replay(t).engine == replay(t, engine="python").engine == "python"
    assert [v.engine for v in check_trace(t)] == ["python"]


# --- 4. KVGRANT_SPECS must name a folder ---------------------------------------------------

@pytest.mark.parametrize("target, what", [
    (str(ROOT / "examples" / "small.json"), "is a file"),
    ("/no/such/folder", "does not exist"),
])
def test_kvgrant_specs_that_names_no_folder_is_named(
        no_tlc: None, monkeypatch: pytest.MonkeyPatch, target: str, what: str) -> None:
    """Was: ``.../small.json/KVLifecycle.tla is missing: the TLC engine needs it``."""
    from kvgrant.specfiles import specs_dir

    monkeypatch.setenv("KVGRANT_SPECS", target)
    for call in (specs_dir, lambda: check_trace_tlc(reference_trace(small_header()))):
        with pytest.raises(ToolError) as info:
            call()
        text = str(info.value)
        assert f"KVGRANT_SPECS = {target!r} {what}" in text, text
        assert "a folder holding the TLA+ specs" in text, text


def test_kvgrant_specs_that_names_no_folder_is_named_by_conform(
        no_tlc: None, monkeypatch: pytest.MonkeyPatch, tmp_path: Path,
        capsys: pytest.CaptureFixture[str]) -> None:
    from kvgrant.cli import main

    path = tmp_path / "t.ndjson"
    path.write_text("\n".join(reference_trace(small_header()).to_lines()) + "\n")
    target = str(ROOT / "examples" / "small.json")
    monkeypatch.setenv("KVGRANT_SPECS", target)
    assert main(["conform", str(path), "--engine", "tlc"]) == 2
    err = capsys.readouterr().err
    assert f"KVGRANT_SPECS = {target!r} is a file" in err, err


def test_kvgrant_specs_naming_a_folder_is_used(monkeypatch: pytest.MonkeyPatch,
                                               tmp_path: Path) -> None:
    from kvgrant.specfiles import specs_dir

    monkeypatch.setenv("KVGRANT_SPECS", str(tmp_path))
    assert specs_dir() == tmp_path
    monkeypatch.setenv("KVGRANT_SPECS", "")  # empty: the specs kvgrant ships
    assert (specs_dir() / "KVLifecycle.tla").is_file()


@pytest.mark.parametrize("jobs", ["2", 0, -1, True, 1.5])
def test_check_traces_tlc_refuses_a_bad_job_count_before_java(jobs: object) -> None:
    from kvgrant.conformance.tla_trace import check_traces_tlc

    with pytest.raises(ArgumentError, match="jobs = .*must be an integer >= 1"):
        check_traces_tlc([], jobs=jobs)  # type: ignore[arg-type]


@pytest.mark.parametrize("limit", ["5", -1, True, 2.0])
def test_check_group_refuses_a_bad_tlc_event_limit(limit: object, tmp_path: Path) -> None:
    from kvgrant.conformance.group_check import check_group

    with pytest.raises(ArgumentError, match="tlc_max_events = .*must be an integer >= 0"):
        check_group([str(tmp_path / "r0.ndjson")], "python",
                     tlc_max_events=limit)  # type: ignore[arg-type]
