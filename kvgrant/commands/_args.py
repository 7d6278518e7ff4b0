"""Argument types shared by the subcommands."""

from __future__ import annotations

import argparse

from kvgrant.errors import GeometryError, KVGrantError, TraceError

__all__ = ["count", "exit_status"]


def count(text: str) -> int:
    """A non-negative integer; ``_`` and ``,`` separators allowed (``523_880``, ``523,880``)."""
    try:
        value = int(text.replace("_", "").replace(",", ""))
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}: not an integer") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"{value}: must be >= 0")
    return value


def exit_status(err: KVGrantError) -> int:
    """2 for bad input (a geometry or trace file that breaks a rule), 1 for a request
    that was refused or failed (pre-flight, contract, capacity, driver, allocation)."""
    return 2 if isinstance(err, (GeometryError, TraceError)) else 1
