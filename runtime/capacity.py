"""Capacity from free memory: parse ``--memory-limit`` and fit pages before any create.

Published semantics of ``--memory-limit``:

* absent, ``-0G`` or ``-0``: use what is free on each GPU;
* ``-1G`` (a negative size): keep that much free on every GPU;
* ``40G`` (a positive size): use at most that much of each GPU (and never more than
  is free).

Sizes take a binary unit ``K``, ``M``, ``G`` or ``T`` (optionally ``KiB``/``KB``...).
A string without a unit is a byte count and must be 0 or at least 1 MiB (``-1`` is
surely a missing ``G``, not one byte); no size may exceed 1 PiB per GPU. Digits are
ASCII only. A value that breaks these rules is an :class:`~kvgrant.errors.ArgumentError`
naming ``memory_limit`` (bad input, as any other argument); a well-formed limit that
leaves too little for the layout on the GPUs at hand is a
:class:`~kvgrant.errors.PlanError` (the request was refused: the same limit fits a
larger GPU). Why here and not after a failure: pages are chosen so the cache
fits *before* anything is created, and a failed start-up is never retried smaller.
Rows are not fitted: the declared layout fixes every region row (snapshot slots);
only KV pages shrink, and only while every declared alias still lies inside its plane.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, Mapping

from kvgrant.errors import ArgumentError, PlanError
from kvgrant.layout.geometry import Geometry, require_geometry, round_up

__all__ = ["MemoryLimit", "PageFit", "fit_pages", "parse_memory_limit", "rank_bytes"]

_UNITS = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40}
_PATTERN = re.compile(r"^\s*([+-]?)(\d{1,20}(?:\.\d{1,12})?)\s*([KMGT]?)(?:I?B)?\s*$",
                      re.IGNORECASE | re.ASCII)
#: Largest size accepted: 1 PiB per GPU (far above any GPU, far below 64-bit limits).
MAX_LIMIT_BYTES = 1 << 50
#: A size written without a unit is bytes; below this it is surely a missing unit.
MIN_UNITLESS_BYTES = 1 << 20


#: What a limit may be, for the messages.
_FORMS = "must be a size such as -1G, -0G, -512M or 40G"


def _shown(value: Any) -> str:
    """``repr`` of a user value, cut to 80 characters (a huge int by its size)."""
    if isinstance(value, int) and not isinstance(value, bool) and value.bit_length() > 128:
        return f"<{'negative ' if value < 0 else ''}integer of {value.bit_length()} bits>"
    text = repr(value)
    if len(text) > 80:
        text = text[:76] + " ..."
    if not isinstance(value, (str, int, float)) or isinstance(value, bool):
        return text if isinstance(value, bool) else f"{text} ({type(value).__name__})"
    return text


def _bad(field: str, value: Any, rule: str) -> ArgumentError:
    """``field = value: rule`` as the ArgumentError of a malformed memory limit."""
    return ArgumentError(f"{field} = {_shown(value)}: {rule}", argument=field, value=value)


@dataclass(frozen=True)
class MemoryLimit:
    """A parsed ``--memory-limit``: keep ``keep`` bytes free, or use at most ``cap``."""

    text: str
    keep: int = 0           # bytes to leave free on each GPU (negative form)
    cap: int | None = None  # bytes to use at most on each GPU (positive form)

    def budget(self, free: int) -> int:
        """Bytes kvgrant may use on a GPU with ``free`` bytes free (never negative)."""
        usable = free - self.keep
        if self.cap is not None:
            usable = min(usable, self.cap)
        return max(usable, 0)

    def __str__(self) -> str:
        return self.text


def _checked_limit(limit: MemoryLimit) -> MemoryLimit:
    """A MemoryLimit built by hand: ``keep`` and ``cap`` byte counts in range (a str
    ``keep`` once failed in fit_pages as a TypeError)."""
    for name, value, none_ok in (("keep", limit.keep, False), ("cap", limit.cap, True)):
        if value is None and none_ok:
            continue
        if isinstance(value, bool) or not isinstance(value, int) \
                or not 0 <= value <= MAX_LIMIT_BYTES:
            raise _bad(f"memory_limit.{name}", value,
                       f"must be {'None or ' if none_ok else ''}a byte count in "
                       f"0..{MAX_LIMIT_BYTES:,} (1 PiB)")
    if not isinstance(limit.text, str):
        raise _bad("memory_limit.text", limit.text, "must be a str (how the limit was "
                   "written, for messages)")
    return limit


def parse_memory_limit(value: "str | int | MemoryLimit | None") -> MemoryLimit:
    """Parse ``-1G``, ``-0G``, ``-512M``, ``40G``, ``1073741824`` (or None: use what is free).

    Raises
    ------
    ArgumentError
        The value is not a size (wrong type, bad syntax, a unitless count below 1 MiB,
        more than 1 PiB, a positive 0), or a MemoryLimit's fields are out of range; the
        message names ``memory_limit`` (or its field), the value and the rule.
    """
    if value is None:
        return MemoryLimit(text="-0G")
    if isinstance(value, MemoryLimit):
        return _checked_limit(value)
    if isinstance(value, bool):
        raise _bad("memory_limit", value, f"{_FORMS} (True and False are not sizes)")
    if not isinstance(value, (int, str)):
        from kvgrant.runtime.arguments import as_int

        n = as_int(value)   # a numpy integer is a byte count too
        value = value if n is None else n
    if isinstance(value, int):
        if abs(value) > MAX_LIMIT_BYTES:
            raise _bad("memory_limit", value, f"must be at most {MAX_LIMIT_BYTES:,} bytes "
                       "(1 PiB) per GPU either way (a negative count keeps that much free)")
        text = str(value)
    elif isinstance(value, str):
        text = value
    else:
        raise _bad("memory_limit", value, f"{_FORMS}, a byte count (int) or a MemoryLimit")
    m = _PATTERN.match(text)
    if not m:
        raise _bad("memory_limit", value, f"{_FORMS} (a leading '-' keeps that much free per "
                   "GPU; units K, M, G, T are binary; ASCII digits)")
    sign, number, unit = m.group(1), m.group(2), m.group(3).upper()
    nbytes = int(float(number) * _UNITS[unit]) if "." in number else int(number) * _UNITS[unit]
    if nbytes > MAX_LIMIT_BYTES:
        raise _bad("memory_limit", value, f"{nbytes:,} bytes is more than 1 PiB per GPU; "
                   "write a size such as -1G or 40G")
    if not unit and 0 < nbytes < MIN_UNITLESS_BYTES and isinstance(value, str):
        # (an int is a byte count a program computed, taken as it is)
        raise _bad("memory_limit", value, f"a size without a unit is bytes, and {nbytes} "
                   f"byte(s) is surely not meant; write e.g. {sign}{number}G (units K, M, "
                   "G, T are binary)")
    if sign == "-":
        return MemoryLimit(text=text.strip(), keep=nbytes)
    if nbytes == 0:
        raise _bad("memory_limit", value, "a positive limit of 0 bytes leaves nothing to "
                   "allocate; use -0G to use all free memory")
    return MemoryLimit(text=text.strip(), cap=nbytes)


def rank_bytes(g: Geometry, pages: int | None = None) -> int:
    """Physical bytes one rank creates: every plane once (regions are aliases)."""
    n = g.pages if pages is None else pages
    return sum(round_up(n * p.bytes_per_page, g.granularity) for p in g.planes)


def _min_pages(g: Geometry) -> int:
    """Fewest pages whose plane sizes still contain every declared alias."""
    need = 1
    for a in g.aliases:
        bpp = g.plane_by_name[a.plane].bytes_per_page
        end = a.plane_offset + a.length
        # round_up(n * bpp, G) >= end  <=>  n * bpp > end - G  (end is a G-multiple)
        n = max(1, (end - g.granularity) // bpp + 1)
        need = max(need, n)
    return need


@dataclass(frozen=True)
class PageFit:
    """The outcome of fitting: pages to create and why."""

    pages: int                   # pages every rank creates (<= the geometry's pages)
    requested: int               # the geometry's pages
    bytes_per_rank: int          # physical bytes per rank at ``pages``
    budget: dict[int, int]       # usable bytes per device under the limit
    free: dict[int, int]         # free bytes per device when measured
    limit: MemoryLimit

    @property
    def reduced(self) -> bool:
        return self.pages < self.requested


def _check_free(free: Any) -> None:
    """``free``: a mapping of CUDA ordinals to free byte counts (was: AttributeError for
    a list, TypeError for a str count, deep in MemoryLimit.budget)."""
    if not isinstance(free, Mapping):
        raise _bad("free", free, "must be a mapping of CUDA ordinal to free bytes, e.g. "
                   "{0: 150_000_000_000}")
    for device, nbytes in free.items():
        if isinstance(device, bool) or not isinstance(device, int) or device < 0:
            raise _bad("free", device, "keys must be CUDA ordinals (integers >= 0)")
        if isinstance(nbytes, bool) or not isinstance(nbytes, int) or nbytes < 0:
            raise _bad(f"free[{device}]", nbytes, "must be a byte count (an integer >= 0)")


def fit_pages(g: Geometry, free: Mapping[int, int], limit: MemoryLimit | str | None = None) -> PageFit:
    """Largest page count <= ``g.pages`` whose planes fit every device's budget.

    ``free`` maps each device to its free bytes. All ranks create the same bytes, so
    the tightest device decides.

    Raises
    ------
    ArgumentError
        ``g`` is not a Geometry, ``free`` is not a mapping of ordinals to byte counts,
        or ``limit`` is malformed (:func:`parse_memory_limit`).
    PlanError
        Not even the pages that the declared aliases need fit; the message names the
        device, its free bytes, the limit and the bytes needed.
    """
    require_geometry(g, "fit_pages")
    lim = parse_memory_limit(limit)
    _check_free(free)
    budget = {d: lim.budget(f) for d, f in free.items()}
    if not budget:
        raise PlanError("fit_pages: no devices given")
    tight_dev = min(budget, key=lambda d: (budget[d], d))
    tight = budget[tight_dev]
    lo, hi = 0, g.pages
    while lo < hi:  # largest n in [0, pages] with rank_bytes(n) <= tight
        mid = (lo + hi + 1) // 2
        if rank_bytes(g, mid) <= tight:
            lo = mid
        else:
            hi = mid - 1
    floor = _min_pages(g)
    if lo < floor:
        need = rank_bytes(g, floor)
        raise PlanError(
            f"memory_limit = {lim.text!r}: device {tight_dev} has {free[tight_dev]} bytes free "
            f"({free[tight_dev] / 2**30:.2f} GiB), leaving {tight} bytes usable; geometry "
            f"{g.name!r} needs {need} bytes per rank for its smallest valid size of {floor} pages "
            f"(requested {g.pages} pages = {rank_bytes(g)} bytes)")
    return PageFit(pages=lo, requested=g.pages, bytes_per_rank=rank_bytes(g, lo),
                   budget=budget, free=dict(free), limit=lim)
