"""The price LP of the Lagrangian bound (D): its coverage rows against the conflict
sets of single granules, and its certifying pass against the subgradient's pass."""

from __future__ import annotations

from hypothesis import HealthCheck, given, settings, strategies as st

from kvgrant.layout import bound, price_lp
from kvgrant.layout.conflicts import conflict_sets, declared_conflict_ranges
from kvgrant.layout.granules import labels
from kvgrant.layout.plan import Allocation
from layout_builders import geometries


def _classes(g):
    """Per plane class: (bytes per page, plane names, kept granules, states), as
    :func:`bound.lagrangian_bound` walks them."""
    G = g.granularity
    return [(bpp, [p.name for p in g.planes
                   if (p.bytes_per_page, g.plane_bytes(p.name) // G) == (bpp, units)],
             kept, st) for _, (bpp, units), kept, st in bound._plane_class_states(g)]


@settings(max_examples=60, deadline=None, suppress_health_check=list(HealthCheck))
@given(geometries(max_planes=3, max_regions=2, max_ranks=1))
def test_each_state_touches_the_pages_a_one_granule_allocation_adds(g):
    # oracle: back the label's first region granule with that plane granule alone and
    # read the pages it adds to each row's conflict set; each declared (row, page)
    # must be a coverage row holding exactly the states that touch it
    G = g.granularity
    lab = labels(g)
    classes = _classes(g)
    got = price_lp.touches(g, lab, [(bpp, kept, st.labels) for bpp, _, kept, st in classes])
    want: dict[tuple[str, int, int], set] = {}
    for c, (_, names, kept, st) in enumerate(classes):
        for pos, (u, labs) in enumerate(zip(kept, st.labels)):
            for i, s in enumerate(labs):
                one = Allocation(names[0], u * G, G, lab.region[s], lab.first[s] * G)
                for (region, row), pages in conflict_sets(g, [one]).items():
                    for q in pages:
                        want.setdefault((region, row, q), set()).add((c, pos, i))
    declared = [(region, row, q) for (region, row), ranges in
                declared_conflict_ranges(g).items() for a, b in ranges for q in range(a, b)]
    if any(not want.get(k) for k in declared):
        assert got is None  # a page no state can touch: no plan keeps the contract
        return
    assert got is not None
    rows = {}
    for c, per_pos in enumerate(got.by_state):
        for pos, per_state in enumerate(per_pos):
            for i, touched in enumerate(per_state):
                for r in touched:
                    rows.setdefault(r, set()).add((c, pos, i))
    assert sorted(map(sorted, rows.values())) == \
        sorted(map(sorted, {frozenset(want[k]) for k in declared}))
    assert got.rows == len(rows)


@settings(max_examples=200, deadline=None)
@given(st.lists(st.lists(st.integers(0, 4), max_size=3, unique=True), min_size=1,
                max_size=12),
       st.lists(st.floats(-3, 3), min_size=5, max_size=5),
       st.lists(st.floats(0.5, 3), min_size=5, max_size=5), st.floats(0.5, 3))
def test_the_priced_pass_without_side_prices_is_the_subgradient_pass(per_unit, lam, start,
                                                                       free):
    states = bound._PlaneStates.of(per_unit, [-1, 0, 1, 2, 3])
    earn = [[lam[s] for s in labs] for labs in per_unit]
    want = bound._plane_pass(states, lam, start, free)[0]
    assert price_lp._priced_pass(states, earn, start, free, [0.0] * 5) == want


@settings(max_examples=100, deadline=None)
@given(st.lists(st.lists(st.integers(0, 4), max_size=3, unique=True), min_size=1,
                max_size=12),
       st.lists(st.floats(0, 3), min_size=5, max_size=5))
def test_a_price_on_entering_a_label_never_lowers_the_pass(per_unit, enter):
    states = bound._PlaneStates.of(per_unit, [-1, 0, 1, 2, 3])
    earn = [[1.0] * len(labs) for labs in per_unit]
    start = [1.0] * 5
    free = price_lp._priced_pass(states, earn, start, 1.0, [0.0] * 5)
    assert price_lp._priced_pass(states, earn, start, 1.0, enter) >= free
