"""A trace path that names an existing file that is not a kvgrant trace: the library
refuses it as the CLI does (it used to overwrite it; only ``kvgrant alloc --trace``
refused), unless told to overwrite (``TraceOptions(path, overwrite=True)``, the CLI's
``--force``). A trace, or an empty file, is overwritten either way."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from kvgrant.errors import ArgumentError, GroupError
from kvgrant.runtime import Backend, TraceOptions, allocate
from kvgrant.runtime.sim import SimDriver

from tests.runtime._dict_store import release_all, run_threads
from tests.runtime.test_runtime_mutation_kills import EMPTY, tiny
from tests.test_cli_review_fixes import SIM, SMALL, cli

KEEP = "model weights, not a trace\n"


def _first_kind(path: Path) -> str:
    return json.loads(path.read_text().splitlines()[0])["kind"]


def test_allocate_refuses_to_overwrite_a_file_that_is_not_a_trace(tmp_path: Path) -> None:
    target = tmp_path / "weights.bin"
    target.write_text(KEEP)
    drv = SimDriver(devices=2)
    with pytest.raises(ArgumentError) as err:
        allocate(tiny(), backend=drv, trace=str(target))
    assert err.value.argument == "trace" and err.value.value == str(target)
    assert f"trace = {str(target)!r}: exists and is not a kvgrant trace" in str(err.value)
    assert "TraceOptions(path, overwrite=True)" in str(err.value)
    assert target.read_text() == KEEP
    assert drv.calls["cuMemAddressReserve"] == 0  # refused before any driver call


def test_a_kvgrant_trace_variable_naming_another_file_is_refused_naming_the_variable(
        tmp_path: Path, monkeypatch: Any) -> None:
    target = tmp_path / "notes.txt"
    target.write_text(KEEP)
    monkeypatch.setenv("KVGRANT_TRACE", str(target))
    with pytest.raises(ArgumentError) as err:
        allocate(tiny(), backend="sim")
    assert err.value.argument == "KVGRANT_TRACE"
    assert target.read_text() == KEEP


def test_overwrite_true_writes_the_trace_over_the_file(tmp_path: Path) -> None:
    target = tmp_path / "weights.bin"
    target.write_text(KEEP)
    pub = allocate(tiny(), backend="sim", trace=TraceOptions(str(target), overwrite=True))
    pub.release()
    assert _first_kind(target) == "header"


def test_an_earlier_trace_and_an_empty_file_are_overwritten_without_being_asked(
        tmp_path: Path) -> None:
    earlier, empty = tmp_path / "earlier.ndjson", tmp_path / "empty.ndjson"
    allocate(tiny(), backend="sim", trace=str(earlier)).release()
    first = earlier.read_text()
    empty.write_text("")
    for target in (earlier, empty):
        allocate(tiny(), backend="sim", trace=str(target)).release()
        assert _first_kind(target) == "header"
    assert len(earlier.read_text().splitlines()) == len(first.splitlines())  # not appended


@pytest.mark.parametrize("value", ["yes", 1, None])
def test_trace_options_overwrite_is_a_flag(value: Any) -> None:
    with pytest.raises(ArgumentError) as err:
        TraceOptions("t.ndjson", overwrite=value)
    assert err.value.argument == "TraceOptions.overwrite"


def test_a_rank_whose_trace_path_is_another_file_is_named_by_every_rank(
        tmp_path: Path) -> None:
    target = tmp_path / "notes.txt"
    target.write_text(KEEP)
    g = tiny()
    drivers = [SimDriver(devices=2), SimDriver(devices=2)]
    outs = run_threads(g, drivers, per_rank={1: {"trace": str(target)}}, timeout_s=45.0)
    assert isinstance(outs[1], ArgumentError) and "is not a kvgrant trace" in str(outs[1])
    assert isinstance(outs[0], GroupError) and "is not a kvgrant trace" in str(outs[0])
    assert target.read_text() == KEEP
    assert [d.live().as_dict() for d in drivers] == [EMPTY, EMPTY]
    again = run_threads(g, drivers, timeout_s=45.0, per_rank={
        1: {"trace": TraceOptions(str(target), overwrite=True)}})
    try:
        assert all(not isinstance(o, BaseException) for o in again), again
    finally:
        release_all(again)
    assert _first_kind(target) == "header"


def test_alloc_procs_refuses_a_rank_file_that_is_not_a_trace_unless_forced(
        tmp_path: Path) -> None:
    pytest.importorskip("torch.distributed")
    folder = tmp_path / "traces"
    folder.mkdir()
    stale = folder / "rank1.ndjson"
    stale.write_text(KEEP)
    res = cli(["alloc", str(SMALL), *SIM, "--procs", "3", "--trace", str(folder)])
    assert res.rc == 2, res.err
    assert f"{str(stale)!r}: exists and is not a kvgrant trace" in res.err
    assert "--force" in res.err
    assert stale.read_text() == KEEP and not (folder / "rank0.ndjson").exists()
    res = cli(["alloc", str(SMALL), *SIM, "--procs", "3", "--trace", str(folder), "--force"])
    assert res.rc == 0, res.err
    assert all(_first_kind(folder / f"rank{r}.ndjson") == "header" for r in range(3))


def test_a_trace_whose_header_line_is_longer_than_64_kib_is_overwritten(
        tmp_path: Path) -> None:
    # the published layout's header line is about 90 KB: only its first 64 KiB were
    # read, which did not parse, so a second `make demo` refused the first one's trace
    earlier = tmp_path / "earlier.ndjson"
    earlier.write_text(json.dumps({"kind": "header", "pad": "x" * 100_000}) + "\n{}\n")
    pub = allocate(tiny(), backend="sim", trace=str(earlier))
    pub.release()
    assert _first_kind(earlier) == "header" and "pad" not in earlier.read_text()
    res = cli(["alloc", str(SMALL), *SIM, "--trace", str(earlier)])
    assert res.rc == 0, res.err


def test_a_long_first_line_that_is_not_a_trace_header_is_still_refused(
        tmp_path: Path) -> None:
    for text in (json.dumps({"kind": "notes", "pad": "x" * 100_000}) + "\n",
                 "x" * 100_000 + "\n", "{" + "x" * 100_000):
        target = tmp_path / "long.txt"
        target.write_text(text)
        with pytest.raises(ArgumentError, match="is not a kvgrant trace"):
            allocate(tiny(), backend="sim", trace=str(target))
        assert target.read_text() == text
