"""Holes a mutation hunt found in the layout tests (review 2026-12-07, hunt B): rule
boundaries of the geometry (a value exactly at a limit), the contiguous plan at its
exact fits, the packer's fallback note, the windows' merge cap and size limit, the
neighbourhood search's windows and limits, and figures of the plan report."""

from __future__ import annotations

import pathlib
from types import SimpleNamespace
from typing import Any

import pytest
from layout_builders import geometry_dict

from kvgrant.errors import GeometryError
from kvgrant.layout import exact, neighbourhood, windows
from kvgrant.layout.contiguous import contiguous_plan
from kvgrant.layout.contract import check_contract
from kvgrant.layout.exact import _build
from kvgrant.layout.geometry import Geometry, load_geometry, parse_geometry
from kvgrant.layout.packer import pack
from kvgrant.layout.plan import PhysicalPlan
from kvgrant.layout.preflight import handle_demand_breakdown
from kvgrant.layout.report import build_report, format_report, plan_figures
from kvgrant.layout.rules import naive_plan, reference_plan
from kvgrant.layout.windows import first_window_refusal, solve_windows

ROOT = pathlib.Path(__file__).resolve().parents[2]


def _rejected(doc: dict[str, Any]) -> GeometryError:
    with pytest.raises(GeometryError) as err:
        parse_geometry(doc)
    return err.value


def _identity(pages: int, rows: int, G: int = 4) -> Geometry:
    """One plane of ``pages`` one-granule pages, one region of ``rows`` one-granule rows
    aliased onto the plane's first granules (row k on page k)."""
    return parse_geometry({
        "name": "identity", "granularity": G, "pages": pages, "page_tokens": 16,
        "planes": [{"name": "p", "bytes_per_page": G}],
        "regions": [{"name": "r", "rows": rows, "row_bytes": G}],
        "aliases": [{"region": "r", "offset": 0, "plane": "p", "plane_offset": 0,
                     "length": rows * G}],
        "topology": {"ranks": 1}})


# -- geometry rules at their limits ----------------------------------------------


def test_a_region_as_large_as_its_plane_is_placed_whole() -> None:
    """The contiguous plan places a region on a plane of exactly the region's size (one
    allocation), not only on larger planes."""
    g = _identity(pages=2, rows=2)
    plan = contiguous_plan(g)
    assert plan is not None and not check_contract(g, plan)
    assert [(a.plane, a.plane_offset, a.length, a.region, a.region_offset)
            for a in plan.allocations] == [("p", 0, 8, "r", 0)]


def test_a_label_whose_eligible_granules_fit_it_exactly_is_placed() -> None:
    """A row whose only eligible granules are exactly as many as it needs (row k may
    sit on page k alone) still gets the contiguous plan: the region whole, and the
    plane's last granule as a non-aliased rest."""
    g = _identity(pages=3, rows=2)
    plan = contiguous_plan(g)
    assert plan is not None and not check_contract(g, plan)
    assert [(a.plane_offset, a.length, a.region) for a in plan.allocations] == \
        [(0, 8, "r"), (8, 4, None)]


def test_the_packer_keeps_its_own_plan_when_it_ties_the_reference_rule() -> None:
    """The packed plan falls back to the reference rule's allocations (saying the
    reference "needed fewer allocations") only when the reference really needs fewer:
    on a layout the reference rule already plans in one allocation, the packer's own
    plan of one allocation is kept, with its own note."""
    g = _identity(pages=2, rows=2)
    assert len(reference_plan(g).allocations) == 1
    plan = pack(g)
    assert len(plan.allocations) == 1 and not check_contract(g, plan)
    assert plan.label == "packed"
    assert not any("needed fewer" in n for n in plan.notes), plan.notes
    assert plan.notes and plan.notes[0].startswith("packed from the")


# -- windows ---------------------------------------------------------------------


@pytest.fixture(scope="module")
def published_model() -> tuple[Geometry, Any, Any]:
    g = load_geometry(ROOT / "examples" / "published-dcp16.json")
    m, lab = _build(g, 1.0, {})
    return g, m, lab


def test_the_windows_stop_after_max_merges(published_model: tuple[Geometry, Any, Any],
                                           monkeypatch: pytest.MonkeyPatch) -> None:
    """MAX_MERGES is the number of merges allowed, no more: with no horizon some window
    of the published layout needs a merge (tests/layout/test_windows.py), so with a cap
    of 0 the windows end at that window with no plan, after 0 merges."""
    g, m, lab = published_model
    monkeypatch.setattr(windows, "MAX_MERGES", 0)
    res = solve_windows(m, lab.need, g.granularity, core=40, margin=20, horizon=0)
    assert res.values is None
    assert res.merges == 0
    assert "after 0 merges" in res.status and "no plan for labels" in res.status


def test_a_first_window_of_exactly_the_limit_is_not_refused(
        published_model: tuple[Geometry, Any, Any]) -> None:
    """first_window_refusal refuses a first window over max_window_nonzeros, and one of
    exactly that many nonzeros is within it (as solve_windows counts it)."""
    g, m, lab = published_model
    nl = len(lab.need)
    said = first_window_refusal(m, nl, g.granularity, lambda rank, e: 0, 0)
    assert said is not None and said.startswith("window 1 (labels 0-")
    size = int(said.split(" has ")[1].split(" nonzeros")[0].replace(",", ""))
    assert size > 0
    assert first_window_refusal(m, nl, g.granularity, lambda rank, e: 0, size) is None
    over = first_window_refusal(m, nl, g.granularity, lambda rank, e: 0, size - 1)
    assert over is not None and f"has {size:,} nonzeros, over {size - 1:,}" in over
    # the nonzeros of rows added later count too
    assert first_window_refusal(m, nl, g.granularity, lambda rank, e: 1, size) is not None


# -- neighbourhood search --------------------------------------------------------


def test_the_neighbourhood_windows_reach_every_label(monkeypatch: pytest.MonkeyPatch) -> None:
    """A sweep's windows (WINDOW_LABELS labels every WINDOW_STEP) free every label of the
    layout at least once, the last ones included."""
    g = parse_geometry(geometry_dict())
    freed: list[tuple[int, int]] = []
    real = neighbourhood._Windows.free_columns

    def spy(self: Any, first: int, count: int) -> Any:
        freed.append((first, count))
        return real(self, first, count)

    monkeypatch.setattr(neighbourhood._Windows, "free_columns", spy)
    nl = len(neighbourhood._Windows(g).lab.need)
    assert nl > neighbourhood.WINDOW_LABELS  # else one window covers them all
    found = neighbourhood.search(g, naive_plan(g), bound=0, max_gap=0.0)
    assert found is not None
    covered = {l_ for first, count in freed for l_ in range(first, min(first + count, nl))}
    assert covered == set(range(nl))


def test_the_neighbourhood_windows_take_the_callers_smaller_node_limit(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Each window solve stops at WINDOW_NODES nodes, or at the caller's node_limit when
    that is smaller (planning with small limits stays cheap)."""
    g = parse_geometry(geometry_dict())
    limits: list[int | None] = []
    real = exact._mip

    def spy(*args: Any, **kwargs: Any) -> Any:
        limits.append(args[8])
        return real(*args, **kwargs)

    monkeypatch.setattr(exact, "_mip", spy)
    neighbourhood.search(g, naive_plan(g), bound=0, max_gap=0.0, node_limit=3)
    assert limits and set(limits) == {3}
    limits.clear()
    neighbourhood.search(g, naive_plan(g), bound=0, max_gap=0.0,
                         node_limit=10 * neighbourhood.WINDOW_NODES)
    assert limits and set(limits) == {neighbourhood.WINDOW_NODES}


# -- the plan report -------------------------------------------------------------


def _overdeclared() -> Geometry:
    """geometry_dict with no importers but both ranks declared readers of each other."""
    return parse_geometry(geometry_dict(topology={
        "ranks": 2, "import_groups": [], "declared_readers": {"0": [0, 1], "1": [0, 1]}}))


def test_the_reports_handles_per_rank_are_owner_plus_importers() -> None:
    """A rank's ``handles`` grant owner + importers, ``handles_declared`` every declared
    reader: with readers declared but no importers they differ, each as pre-flight
    counts it."""
    g = _overdeclared()
    plan = reference_plan(g)
    own = handle_demand_breakdown(g, plan)
    dec = handle_demand_breakdown(g, plan, declared=True)
    figs = plan_figures(g, plan, 10**6)
    assert [r.handles for r in figs.ranks] == [own.per_rank[0], own.per_rank[1]]
    assert [r.handles_declared for r in figs.ranks] == [dec.per_rank[0], dec.per_rank[1]]
    assert figs.ranks[0].handles == plan.mappings  # every grant to the owner alone
    assert figs.ranks[0].handles < figs.ranks[0].handles_declared
    row = build_report(g, [plan], 10**6)["plans"]["reference"]["per_rank"][0]
    assert (row["handles"], row["handles_declared"]) == (own.per_rank[0], dec.per_rank[0])


def test_a_plan_that_uses_the_whole_budget_fits() -> None:
    """The report's pre-flight verdict fits at a margin of exactly 0 (demand + reserve
    == budget, as kvgrant alloc's pre-flight accepts it), and not one handle below."""
    g = parse_geometry(geometry_dict())
    plan = reference_plan(g)
    demand = handle_demand_breakdown(g, plan).total
    declared = handle_demand_breakdown(g, plan, declared=True).total
    rep = build_report(g, [plan], demand + 5, reserve=5)
    pre = rep["plans"]["reference"]["preflight"]
    assert pre["importers"] == {"demand": demand, "budget": demand + 5, "reserve": 5,
                                "margin": 0, "fits": True}
    assert pre["declared"]["fits"] is (declared <= demand)
    rep = build_report(g, [plan], demand + 4, reserve=5)
    pre = rep["plans"]["reference"]["preflight"]["importers"]
    assert pre["margin"] == -1 and pre["fits"] is False


def test_the_text_reports_gap_is_the_packed_plans() -> None:
    """The lower-bound line of the text report compares the bound with the packed
    plan's allocations, not another plan's."""
    g = parse_geometry(geometry_dict())
    ref = reference_plan(g)
    other = PhysicalPlan("reference", g, ref.allocations[:3])  # another plan's figures
    packed = PhysicalPlan("packed", g, ref.allocations)
    text = format_report(g, [other, packed], 10**6, lower_bound=SimpleNamespace(total=1))
    n = len(ref.allocations)
    assert n != 3
    assert (f"allocation lower bound per rank (combinatorial): 1 (packed plan: {n}, "
            f"+{n - 1} = {100.0 * (n - 1):.1f}% above)") in text


def test_the_text_reports_handle_bound_counts_the_reserve() -> None:
    """The handle lower bound "fits" only when it and the reserve fit the budget
    together, as the plans' own verdicts count it."""
    g = parse_geometry(geometry_dict())
    plan = reference_plan(g)
    text = format_report(g, [plan], 1000, handle_bound={"importers": 999, "declared": 990},
                         reserve=5)
    lines = [ln for ln in text.splitlines() if ln.lstrip().startswith(
        ("owner+importers", "declared readers")) and "handles" in ln]
    assert len(lines) == 2
    assert "999 handles  EXCEEDS BUDGET: no plan can start this layout" in lines[0]
    assert "990 handles  fits" in lines[1]


def test_the_largest_conflict_set_of_a_later_region_after_a_tall_one() -> None:
    """The report names the largest conflict set's own region and row when it is the
    first row of a region after a tall one (rows counted region by region)."""
    tall = 5000  # over the bulk walk's 4,096 pieces
    g = parse_geometry({
        "name": "tall-then-wide", "granularity": 1, "pages": tall + 3, "page_tokens": 1,
        "planes": [{"name": "p", "bytes_per_page": 1}],
        "regions": [{"name": "tall", "rows": tall, "row_bytes": 1},
                    {"name": "wide", "rows": 1, "row_bytes": 3}],
        "aliases": [{"region": "tall", "offset": 0, "plane": "p", "plane_offset": 0,
                     "length": tall},
                    {"region": "wide", "offset": 0, "plane": "p", "plane_offset": tall,
                     "length": 3}],
        "topology": {"ranks": 1}})
    rep = build_report(g, [], 10**6)
    assert rep["largest_conflict_set"] == {"region": "wide", "row": 0, "pages": 3}
    assert rep["geometry"]["rows"] == tall + 1


def test_the_report_counts_the_rows_of_every_region() -> None:
    """The report's geometry ``rows`` is the rows of all regions together (not the
    number of regions)."""
    g = parse_geometry(geometry_dict())
    rep = build_report(g, [reference_plan(g)], 10**6)
    assert rep["geometry"]["regions"] == 2
    assert rep["geometry"]["rows"] == 3 + 1


# -- geometry rules at their limits (continued) ------------------------------------


def test_a_name_with_surrounding_white_space_is_refused() -> None:
    """Plane, region and geometry names may not start or end with white space; the
    error names the field, the value and the rule."""
    doc = geometry_dict()
    doc["planes"][1]["name"] = "b "
    err = _rejected(doc)
    assert err.field == "planes[1].name" and err.value == "b "
    assert 'planes[1].name = "b ": ' in str(err)
    assert "must not start or end with white space" in str(err)
    err = _rejected(geometry_dict(name=" small"))
    assert err.field == "name" and "white space" in str(err)


def test_the_whole_reservation_limit_is_usable() -> None:
    """A rank's reservation of exactly MAX_RANK_GRANULES granules is accepted; one
    granule more is refused, naming the plane that passes the limit."""
    from kvgrant.layout.validate import MAX_RANK_GRANULES

    def doc(pages: int) -> dict[str, Any]:
        return {"name": "big", "granularity": 4, "pages": pages, "page_tokens": 1,
                "planes": [{"name": "p", "bytes_per_page": 4}], "topology": {"ranks": 1}}

    g = parse_geometry(doc(MAX_RANK_GRANULES))
    assert g.plane_bytes("p") == MAX_RANK_GRANULES * 4
    err = _rejected(doc(MAX_RANK_GRANULES + 1))
    assert err.field == "planes[0].bytes_per_page" and err.value == 4
    assert "at most 4,194,304 granules" in str(err)


def test_kv_tokens_of_exactly_the_signed_64_bit_limit_are_accepted() -> None:
    """pages * page_tokens == 2**63 - 1 is accepted (7 divides it); one token more per
    page is refused, naming page_tokens."""
    limit = (1 << 63) - 1
    assert limit % 7 == 0

    def doc(tokens: int) -> dict[str, Any]:
        return {"name": "tokens", "granularity": 4, "pages": 7, "page_tokens": tokens,
                "planes": [{"name": "p", "bytes_per_page": 4}], "topology": {"ranks": 1}}

    assert parse_geometry(doc(limit // 7)).page_tokens * 7 == limit
    err = _rejected(doc(limit // 7 + 1))
    assert err.field == "page_tokens" and err.value == limit // 7 + 1
    assert "KV tokens must be at most 9,223,372,036,854,775,807" in str(err)


def test_a_rank_twice_in_one_import_group_is_refused() -> None:
    """A rank listed twice in the same import group is refused, naming the group, the
    rank and the rule."""
    err = _rejected(geometry_dict(topology={"ranks": 2, "import_groups": [[0, 1, 0]]}))
    assert err.field == "topology.import_groups[0]" and err.value == 0
    assert "one import group, once (twice in this group)" in str(err)


def test_a_declared_reader_one_past_the_last_rank_is_refused() -> None:
    """A declared reader equal to topology.ranks is not a rank: refused, naming the
    owner's field, the reader and the range."""
    err = _rejected(geometry_dict(topology={"ranks": 2, "import_groups": [[0, 1]],
                                            "declared_readers": {"0": [0, 1, 2]}}))
    assert err.field == "topology.declared_readers.0" and err.value == 2
    assert "reader ranks must be in 0..1 (topology.ranks = 2)" in str(err)


def test_on_ranks_takes_up_to_its_limit_of_ranks() -> None:
    """on_ranks accepts 1..MAX_ALL_TO_ALL_RANKS ranks, the limit itself included, and
    refuses one more, naming the argument and the range."""
    from kvgrant.layout.geometry import MAX_ALL_TO_ALL_RANKS, on_ranks

    g = parse_geometry(geometry_dict())
    wide = on_ranks(g, MAX_ALL_TO_ALL_RANKS)
    assert wide.topology.ranks == MAX_ALL_TO_ALL_RANKS
    assert wide.granted_count(MAX_ALL_TO_ALL_RANKS - 1) == MAX_ALL_TO_ALL_RANKS
    with pytest.raises(GeometryError) as err:
        on_ranks(g, MAX_ALL_TO_ALL_RANKS + 1)
    assert err.value.field == "ranks" and err.value.value == MAX_ALL_TO_ALL_RANKS + 1
    assert f"must be an integer in 1..{MAX_ALL_TO_ALL_RANKS}" in str(err.value)


def test_a_geometry_file_of_exactly_the_size_limit_is_read(tmp_path: pathlib.Path) -> None:
    """load_geometry reads a file of exactly MAX_FILE_BYTES bytes (JSON padded with
    blanks) and refuses one byte more, naming the file and the limit."""
    import json

    from kvgrant.layout.geometry import MAX_FILE_BYTES

    text = json.dumps(geometry_dict())
    path = tmp_path / "padded.json"
    with path.open("w") as fh:
        fh.write(text)
        fh.write(" " * (MAX_FILE_BYTES - len(text)))
    assert path.stat().st_size == MAX_FILE_BYTES
    assert load_geometry(path).name == "small"
    with path.open("a") as fh:
        fh.write(" ")
    with pytest.raises(GeometryError) as err:
        load_geometry(path)
    assert err.value.field == "<file>"
    assert f"larger than {MAX_FILE_BYTES:,} bytes" in str(err.value)

