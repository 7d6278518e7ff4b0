"""kvgrant.gc_pause: the collector is paused inside the block and restored after it."""

from __future__ import annotations

import gc

import pytest

from kvgrant.gc_pause import gc_paused


def test_gc_paused_switches_the_collector_back_on_however_the_block_ends() -> None:
    assert gc.isenabled()
    with pytest.raises(KeyError):
        with gc_paused():
            assert not gc.isenabled()
            raise KeyError("boom")
    assert gc.isenabled()


def test_gc_paused_leaves_a_paused_collector_paused() -> None:
    gc.disable()
    try:
        with gc_paused():
            assert not gc.isenabled()
        assert not gc.isenabled()
    finally:
        gc.enable()
