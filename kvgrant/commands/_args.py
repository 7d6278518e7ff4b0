"""Argument types shared by the subcommands."""

from __future__ import annotations

import argparse

from kvgrant.errors import GeometryError, KVGrantError, ToolError, TraceError

__all__ = ["count", "exit_status", "positive_int", "positive_seconds"]


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
    """2 when the command could not do its job: bad input (a geometry or trace file that
    breaks a rule) or a missing tool (Java, TLC, specs); 1 when the request was refused
    or failed (pre-flight, contract, capacity, driver, allocation)."""
    return 2 if isinstance(err, (GeometryError, TraceError, ToolError)) else 1


def positive_int(text: str) -> int:
    """An integer >= 1 (worker counts)."""
    value = count(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"{value}: must be >= 1")
    return value


def positive_seconds(text: str) -> float:
    """A number of seconds > 0."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}: not a number of seconds") from None
    if not value > 0:
        raise argparse.ArgumentTypeError(f"{value}: must be > 0")
    return value
