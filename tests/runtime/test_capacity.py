"""--memory-limit parsing and fitting pages to free memory before any create."""

from __future__ import annotations

import pytest
from hypothesis import given, strategies as st

from kvgrant.errors import ArgumentError, PlanError
from kvgrant.layout.geometry import parse_geometry
from kvgrant.runtime.capacity import fit_pages, parse_memory_limit, rank_bytes

GIB = 1 << 30
MIB = 1 << 20
G = 2 * MIB


def geometry(pages: int = 100, alias_plane_offset: int = 0) -> dict:
    return {
        "name": "cap", "granularity": G, "pages": pages, "page_tokens": 64,
        "planes": [{"name": "a", "bytes_per_page": MIB}, {"name": "b", "bytes_per_page": 3 * MIB}],
        "regions": [{"name": "snapshot", "rows": 1, "row_bytes": G}],
        "aliases": [{"region": "snapshot", "offset": 0, "plane": "a",
                     "plane_offset": alias_plane_offset, "length": G}],
        "topology": {"ranks": 2},
    }


@pytest.mark.parametrize("text, keep, cap", [
    ("-1G", GIB, None), ("-0G", 0, None), ("-0", 0, None), ("-512M", 512 * MIB, None),
    ("40G", None, 40 * GIB), ("-1GiB", GIB, None), ("2097152", None, 2097152), ("-1.5G", GIB * 3 // 2, None),
])
def test_parse(text: str, keep: int | None, cap: int | None) -> None:
    lim = parse_memory_limit(text)
    assert lim.keep == (keep or 0)
    assert lim.cap == cap


def test_default_is_use_what_is_free() -> None:
    lim = parse_memory_limit(None)
    assert lim.keep == 0 and lim.cap is None
    assert lim.budget(123) == 123


@pytest.mark.parametrize("bad", ["1X", "", "--1G", "G", "0", True, 1.5,
                                 # issue #16: no unit, past 1 PiB, non-ASCII digits
                                 "-1", "2048", "9999999999999T", 1 << 60, "\uff14\uff10G"])
def test_parse_rejects_bad_values_naming_them(bad: object) -> None:
    # a malformed limit is bad input (ArgumentError, exit 2), not a refused plan
    with pytest.raises(ArgumentError, match="^memory_limit = ") as err:
        parse_memory_limit(bad)  # type: ignore[arg-type]
    assert err.value.argument == "memory_limit" and err.value.value is bad
    assert not isinstance(err.value, PlanError)


def test_budget_keep_and_cap() -> None:
    assert parse_memory_limit("-1G").budget(10 * GIB) == 9 * GIB
    assert parse_memory_limit("-1G").budget(GIB // 2) == 0
    assert parse_memory_limit("4G").budget(10 * GIB) == 4 * GIB
    assert parse_memory_limit("40G").budget(10 * GIB) == 10 * GIB


def test_fit_keeps_requested_pages_when_they_fit() -> None:
    g = parse_geometry(geometry(pages=100))
    need = rank_bytes(g)
    assert need == 100 * MIB + 300 * MIB
    fit = fit_pages(g, {0: need, 1: need + GIB}, "-0G")
    assert fit.pages == 100 and not fit.reduced


def test_fit_reduces_pages_to_the_tightest_device_under_the_limit() -> None:
    g = parse_geometry(geometry(pages=1000))
    free = {0: 10 * GIB, 1: 2 * GIB}
    fit = fit_pages(g, free, "-1G")
    assert fit.reduced and fit.budget[1] == GIB
    assert rank_bytes(g, fit.pages) <= GIB < rank_bytes(g, fit.pages + 1)
    # a bigger reserve never yields more pages
    assert fit_pages(g, free, "-1536M").pages < fit.pages


@given(free=st.integers(min_value=8 * MIB, max_value=64 * GIB),
       keep_mib=st.integers(min_value=0, max_value=4096))
def test_fit_is_the_largest_page_count_that_fits(free: int, keep_mib: int) -> None:
    g = parse_geometry(geometry(pages=20_000))
    lim = f"-{keep_mib}M"
    budget = max(free - keep_mib * MIB, 0)
    try:
        fit = fit_pages(g, {0: free}, lim)
    except PlanError:
        assert rank_bytes(g, 1) > budget
        return
    assert fit.pages <= g.pages
    assert rank_bytes(g, fit.pages) <= budget
    assert fit.pages == g.pages or rank_bytes(g, fit.pages + 1) > budget


def test_too_little_memory_is_a_clear_error_before_anything_exists() -> None:
    g = parse_geometry(geometry(pages=100, alias_plane_offset=40 * G))
    # the alias reaches plane a up to byte 41 G = 82 MiB; 81 pages of 1 MiB round up to it
    with pytest.raises(PlanError) as info:
        fit_pages(g, {0: GIB, 1: 100 * MIB}, "-0G")
    msg = str(info.value)
    assert "device 1" in msg and "81 pages" in msg and "memory_limit = '-0G'" in msg
