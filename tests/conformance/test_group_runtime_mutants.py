"""Group runtime mutants (runtime/group_mutants.py): a real group (threads of this
process, one rank each, on the simulated driver) where one rank's run commits one bug;
the group's trace files must be rejected by the group checker at the bugged rank's
event named in REJECTED_AT, and the same group without the bug accepted. The group
counterpart of tests/conformance/test_runtime_traces.py::test_runtime_mutants_are_rejected
(docs/mutation-score.md)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from kvgrant.conformance.group_check import check_group
from kvgrant.errors import DriverError
from kvgrant.runtime.group import GroupPublished
from kvgrant.runtime.group_mutants import GROUP_RUN_MUTANTS, REJECTED_AT, group_mutant
from kvgrant.runtime.sim import SimDriver

from tests.runtime._dict_store import run_threads
from tests.runtime.test_runtime_mutation_kills import tiny, traces


def _run(tmp_path: Path, bug: str | None, rank: int) -> list[str]:
    drivers = [SimDriver(devices=2), SimDriver(devices=2)]
    if bug is None:
        outs = run_threads(tiny(), drivers, tmp_path)
    else:
        with group_mutant(bug, rank):
            outs = run_threads(tiny(), drivers, tmp_path)
    assert all(isinstance(o, GroupPublished) for o in outs), outs
    for o in outs:   # shutdown unwinds through the same undos as an abort
        try:
            o.release()
        except DriverError:   # a mutant's unwinding may leave what the driver refuses
            assert bug is not None
    return traces(tmp_path, 2)


def test_the_same_group_without_a_bug_is_accepted(tmp_path: Path) -> None:
    (v,) = check_group(_run(tmp_path, None, 0))
    assert v.accepted, v.summary()
    assert set(GROUP_RUN_MUTANTS) == set(REJECTED_AT)


@pytest.mark.parametrize("rank", [0, 1])
@pytest.mark.parametrize("bug", sorted(GROUP_RUN_MUTANTS))
def test_group_runtime_mutants_are_rejected(tmp_path: Path, bug: str, rank: int) -> None:
    paths = _run(tmp_path, bug, rank)
    (v,) = check_group(paths)
    assert not v.accepted, bug
    assert v.rank == rank, v.summary()
    assert v.event is not None and v.event["action"] == REJECTED_AT[bug], v.summary()
    # the rejected event is in the bugged rank's own file, at that seq
    lines = Path(paths[rank]).read_text().splitlines()
    assert json.loads(lines[v.index + 1])["action"] == REJECTED_AT[bug]


def test_a_mutant_is_gone_after_its_block(tmp_path: Path) -> None:
    from kvgrant.runtime import group

    before = group._GroupRun
    with group_mutant("grant_importers", 0) as cls:
        assert group._GroupRun is cls and cls.bugged == 0
    assert group._GroupRun is before
    with pytest.raises(ValueError, match="must be one of"):
        with group_mutant("nope", 0):
            pass


@pytest.mark.tlc
@pytest.mark.parametrize("bug", sorted(GROUP_RUN_MUTANTS))
def test_tlc_rejects_the_group_runtime_mutants_where_python_does(java, tmp_path: Path,
                                                                 bug: str) -> None:
    py, tl = check_group(_run(tmp_path, bug, 1), engine="both")
    assert not py.accepted and not tl.accepted, bug
    assert (tl.rank, tl.index) == (py.rank, py.index), (py.summary(), tl.summary())
