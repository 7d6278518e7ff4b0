"""The exact model's coverage rows counted before they are built (exact._cover_count):
the counts, the rows built from the count and the first window's verdict are those of
the model built whole, so refusing a model unbuilt changes no decision."""

from __future__ import annotations

import pathlib

import pytest
from hypothesis import HealthCheck, given, settings

from kvgrant.errors import PlanError
from kvgrant.layout.exact import _build, _cover_count
from kvgrant.layout.geometry import load_geometry
from kvgrant.layout.windows import _label_order, first_window_refusal, solve_windows
from layout_builders import geometries

ROOT = pathlib.Path(__file__).resolve().parents[2]
EXAMPLES = sorted((ROOT / "examples").glob("small*.json"))


def _check(g) -> None:
    try:
        whole, lab = _build(g, 1.0, {})
    except PlanError:
        return  # (the caller builds whole when the count says coverage is incomplete)
    core, _ = _build(g, 1.0, {}, cover=False)
    n = len(core.rows)
    got = _cover_count(g, core, lab)
    assert got is not None and got.complete
    assert got.rows == len(whole.rows) - n
    assert got.nonzeros == sum(len(r) for r in whole.rows[n:])
    nl = len(lab.need)
    rank = [0] * nl
    for i, l_ in enumerate(_label_order(whole, nl, g.granularity)):
        rank[l_] = i
    label_of = {col: l_ for (_, _, l_), col in whole.x.items()}
    for e in sorted({0, 1, nl // 2, min(nl, 100), nl}):
        want = sum(len(r) for r in whole.rows[n:]
                   if all(rank[label_of[col]] < e for col, _ in r))
        assert got.kept_by(rank, e) == want
    # the first window's verdict: refused exactly when solve_windows refuses it there
    for limit in (0, 10, 1_000, 10**9):
        verdict = first_window_refusal(core, nl, g.granularity, got.kept_by, limit)
        if nl == 0:
            assert verdict is None
            continue
        res = solve_windows(whole, lab.need, g.granularity, max_window_nonzeros=limit,
                            node_limit=1, max_checks=1)
        first_refused = res.values is None and res.windows == 1 and "nonzeros" in res.status
        assert (verdict is not None) == first_refused
        if verdict is not None:
            assert verdict == res.status
    got.add_rows(core)
    assert core.rows == whole.rows and core.kinds == whole.kinds
    assert core.nonzeros == whole.nonzeros == sum(len(r) for r in whole.rows)
    assert core.rows_lo == whole.rows_lo and core.rows_hi == whole.rows_hi


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: p.name)
def test_the_count_is_the_built_model_on_the_examples(path):
    _check(load_geometry(path))


@settings(max_examples=30, deadline=None, suppress_health_check=list(HealthCheck))
@given(geometries(max_planes=3, max_regions=2, max_ranks=1))
def test_the_count_is_the_built_model(g):
    _check(g)
