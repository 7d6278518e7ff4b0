"""The TLC engine on group traces (tlc mark, needs Java): it accepts what the Python
engine accepts and rejects every group mutant, object-identity mutants included, at the
same event, with the same state and enabled actions."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from kvgrant.conformance.group_gen import simulate_group, write_group
from kvgrant.conformance.group_io import load_group
from kvgrant.conformance.group_model import constants_from
from kvgrant.conformance.group_mutants import OBJECT_MUTATIONS, group_mutants
from kvgrant.conformance.group_replay import replay_group
from kvgrant.conformance.tla_trace import check_group_tlc, group_module_text

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "group"
C3 = constants_from(3, 2, [0, 1], [1], {0: [1], 1: [0], 2: []},
                    {r: [0, 1, 2] for r in range(3)})


def test_group_module_holds_constants_and_the_interleaving() -> None:
    t = load_group([FIXTURES / "2proc-owner-crashes"])
    v = replay_group(t)
    text = group_module_text(t, v.order)
    assert text.startswith("---- MODULE KVGroupTraceData ----")
    assert "TraceNumRanks == 2" in text and "TraceOwnerOnly == {1}" in text
    assert text.count("[p |-> ") == len(v.order) == t.events + 1  # + rank 0's crash
    assert '[p |-> 0, action |-> "Crash"' in text


@pytest.mark.tlc
@pytest.mark.parametrize("case", sorted(p.name for p in FIXTURES.iterdir() if p.is_dir()))
def test_tlc_accepts_the_fixtures(java, case: str) -> None:
    t = load_group([FIXTURES / case])
    v = check_group_tlc(t, timeout=120)
    assert v.accepted, v.summary()
    assert v.final == replay_group(t).final


@pytest.mark.tlc
def test_tlc_rejects_every_group_mutant_where_python_does(java, tmp_path: Path) -> None:
    cases = group_mutants(simulate_group(C3)) + group_mutants(
        simulate_group(C3, fail_at={1: 17}),
        ["publish_while_abort", "importer_keeps_mapping", "vote_ready_after_failure"])
    assert set(OBJECT_MUTATIONS) <= {m.name for m in cases}   # TLC checks objects too
    groups = []
    for i, m in enumerate(cases):
        d = tmp_path / f"m{i}"
        write_group(m.texts, d)
        groups.append(load_group([d]))
    py = [replay_group(t) for t in groups]
    with ThreadPoolExecutor(max_workers=2) as pool:
        tl = list(pool.map(lambda t: check_group_tlc(t, timeout=120), groups))
    for m, a, b in zip(cases, py, tl):
        assert not b.accepted, m.name
        assert (b.rank, b.index) == (m.rank, m.seq) == (a.rank, a.index), m.name
        assert b.state_before == a.state_before, m.name
        assert b.enabled == a.enabled, m.name
