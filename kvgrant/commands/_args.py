"""Argument types shared by the subcommands."""

from __future__ import annotations

import argparse

__all__ = ["count"]


def count(text: str) -> int:
    """A non-negative integer; ``_`` and ``,`` separators allowed (``523_880``, ``523,880``)."""
    try:
        value = int(text.replace("_", "").replace(",", ""))
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}: not an integer") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"{value}: must be >= 0")
    return value
