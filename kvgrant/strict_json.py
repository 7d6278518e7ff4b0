"""JSON for input files a person may have edited: one key per object, no NaN.

Why a module of its own: geometry and plan files (kvgrant.layout) and traces
(kvgrant.conformance) read JSON the same way, and the conformance checker should not
import pydantic with the geometry module to get it.
"""

from __future__ import annotations

import json
from typing import Any

__all__ = ["DuplicateKeyError", "strict_json_loads", "unique_keys_loads"]


class DuplicateKeyError(ValueError):
    """A JSON object names one key twice (json.loads would keep the last silently)."""

    def __init__(self, key: str) -> None:
        super().__init__(f"key {json.dumps(key)} appears twice in one object: each field "
                         "must be named once")
        self.key = key


def _unique_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    """object_pairs_hook: the object, or DuplicateKeyError for a repeated key."""
    out: dict[str, Any] = {}
    for k, v in pairs:
        if k in out:
            raise DuplicateKeyError(k)
        out[k] = v
    return out


def _no_constant(name: str) -> Any:
    """parse_constant: NaN and Infinity are not JSON (json.loads accepts them)."""
    raise ValueError(f"{name} is not a JSON number")


def strict_json_loads(text: str) -> Any:
    """json.loads refusing what a hand-edited input file gets wrong unseen: a key
    named twice in one object (the last would win) and NaN / Infinity."""
    return json.loads(text, object_pairs_hook=_unique_keys, parse_constant=_no_constant)


def unique_keys_loads(text: str) -> Any:
    """json.loads refusing a key named twice in one object only: NaN and Infinity pass,
    so the reader's own check names the field (a trace's ``t = nan: must be ...``)."""
    return json.loads(text, object_pairs_hook=_unique_keys)
