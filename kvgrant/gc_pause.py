"""Bursts of work that allocate many objects but make no reference cycles.

One helper for the allocator's start-up and teardown and for the trace reader and
replay: a full cyclic-GC collection inside such a burst only rescans what the burst
made (on the H200 host the reference plan's own share of start-up was 6.3% in two
runs without the pause and 3.9% with it; docs/allocator.md).
"""

from __future__ import annotations

import gc
from contextlib import contextmanager
from typing import Iterator

__all__ = ["gc_paused"]


@contextmanager
def gc_paused() -> Iterator[None]:
    """Pause the cyclic collector for the block (as ``timeit`` does); it is switched
    back on, if it was on, however the block ends. ``@gc_paused()`` pauses it for a
    function's calls (the planners and bounds: a region of 2^20 rows makes millions
    of row tuples, and the collections rescanning them took over half the time)."""
    was_on = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_on:
            gc.enable()
