"""JSON for input files a person may have edited: one key per object, no NaN.

Why a module of its own: geometry and plan files (kvgrant.layout) and traces
(kvgrant.conformance) read JSON the same way, and the conformance checker should not
import pydantic with the geometry module to get it.
"""

from __future__ import annotations

import json
import re
import sys
from typing import Any

__all__ = ["BOM_RULE", "DuplicateKeyError", "HugeIntegerError", "NonFiniteNumberError",
           "field_path", "is_json_document", "json_error_text", "show_value",
           "strict_json_loads", "unique_keys_loads"]


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


class NonFiniteNumberError(ValueError):
    """A value is NaN, Infinity or -Infinity, which json.loads accepts but JSON has not.

    ``field`` is where it is, in the form the geometry and plan errors name fields
    (``pages``, ``planes[0].bytes_per_page``, ``topology.import_groups[0][1]``; the
    whole document is ``<root>``); ``value`` is the literal as written (``"NaN"``), a
    string, so an error document stays JSON."""

    def __init__(self, field: str, value: str, why: str | None = None) -> None:
        why = why or (f"{value} is not a JSON number (JSON has no NaN, Infinity or "
                      "-Infinity)")
        super().__init__(f"{field} = {value}: must be a finite number: {why}")
        self.field = field
        self.value = value


class _NonFinite:
    """What parse_constant gives for NaN / Infinity, and parse_float for a literal past
    the largest double (``1e309``, which float() reads as inf): a marker found after the
    parse (json.loads calls them without saying where the value is)."""

    __slots__ = ("literal", "why")

    def __init__(self, literal: str, why: str | None = None) -> None:
        self.literal = literal
        self.why = why


def _finite_float(literal: str) -> "float | _NonFinite":
    """parse_float: the number, or a marker when it overflows to inf (was: read as inf,
    and the geometry said "pages = inf: Input should be a valid integer")."""
    value = float(literal)
    if value in (float("inf"), float("-inf")):
        return _NonFinite(literal, f"{literal} is past the largest number a double holds")
    return value


class HugeIntegerError(ValueError):
    """An integer literal longer than Python's int-to-str limit (4,300 digits by default),
    which json.loads refuses with a ValueError naming no field and suggesting
    ``sys.set_int_max_str_digits()``.

    ``field`` is where it is (as for :class:`NonFiniteNumberError`), ``digits`` how many
    digits it has, ``limit`` the limit it passed; ``value`` describes the number
    (``"<integer of 5000 digits>"``), a short string, so an error document stays JSON."""

    def __init__(self, field: str, digits: int, limit: int) -> None:
        self.field = field
        self.digits = digits
        self.limit = limit
        self.value = f"<integer of {digits} digits>"
        super().__init__(f"{field} = {self.value}: a number with more than {limit:,} "
                         "digits: no count or size in an input file is that large")


class _HugeInt:
    """What parse_int gives for a literal past the digit limit (see _NonFinite)."""

    __slots__ = ("digits",)

    def __init__(self, digits: int) -> None:
        self.digits = digits


_PLAIN_KEY = re.compile(r"[A-Za-z0-9_]+\Z")
_KEY_LIMIT = 80  # a key is cut as show_value (below) cuts a string


def field_path(parts: list[str | int]) -> str:
    """``["planes", 0, "bytes_per_page"]`` -> ``planes[0].bytes_per_page`` (the root:
    ``<root>``; a key that is not a plain name is quoted, ``a["b c"]``, and a long one
    cut)."""
    out = ""
    for part in parts:
        if isinstance(part, int):
            out += f"[{part}]"
        elif len(part) <= _KEY_LIMIT and _PLAIN_KEY.match(part):
            out += f".{part}" if out else part
        else:
            text = json.dumps(part)
            if len(text) > _KEY_LIMIT:
                text = text[:_KEY_LIMIT - 4] + '..."'
            out += f"[{text}]"
    return out or "<root>"


def _first_marker(doc: Any, kind: type) -> tuple[str, Any] | None:
    """(field path, marker) of the first ``kind`` marker in document order, or None. A
    loop, not recursion: a document json.loads could decode must not overflow the
    stack."""
    stack: list[tuple[Any, list[str | int]]] = [(doc, [])]
    while stack:
        value, path = stack.pop()
        if isinstance(value, kind):
            return field_path(path), value
        if isinstance(value, dict):
            items: list[tuple[str | int, Any]] = list(value.items())
        elif isinstance(value, list):
            items = list(enumerate(value))
        else:
            continue
        stack.extend((v, [*path, k]) for k, v in reversed(items))
    return None


BOM_RULE = "the file starts with a UTF-8 byte-order mark (BOM); save it as UTF-8 without one"


def _refuse_bom(text: str | bytes) -> None:
    """Python's own message for a BOM says "(decode using utf-8-sig)", advice for the
    programmer, not for whoever saved the file (review 2026-12-07). (Bytes are left to
    json.loads, which decodes them as it finds them.)"""
    if isinstance(text, str) and text.startswith("\ufeff"):
        raise json.JSONDecodeError(BOM_RULE, text, 0)


def strict_json_loads(text: str) -> Any:
    """json.loads refusing what a hand-edited input file gets wrong unseen: a key
    named twice in one object (the last would win) and NaN / Infinity.

    Raises
    ------
    DuplicateKeyError
        A key named twice in one object (``key`` names it).
    NonFiniteNumberError
        NaN, Infinity or -Infinity, or a number past the largest double (``1e309``)
        (``field`` is where, ``value`` the literal). Was: a ValueError naming no field
        (the geometry error said only "unreadable JSON value: NaN is not a JSON number"
        and the file).
    json.JSONDecodeError, RecursionError, ValueError
        As json.loads.
    """
    _refuse_bom(text)
    found: list[bool] = []

    def constant(literal: str) -> _NonFinite:
        found.append(True)
        return _NonFinite(literal)

    def number(literal: str) -> "float | _NonFinite":
        value = _finite_float(literal)
        if value.__class__ is _NonFinite:
            found.append(True)
        return value

    try:
        doc = json.loads(text, object_pairs_hook=_unique_keys, parse_constant=constant,
                         parse_float=number)
    except (json.JSONDecodeError, DuplicateKeyError):
        raise
    except ValueError:
        # an integer past the digit limit (was: "Exceeds the limit (4300 digits) ...
        # use sys.set_int_max_str_digits()", naming no field): find it and name it
        _raise_huge_integer(text)
        raise
    if found:
        where = _first_marker(doc, _NonFinite)
        if where is not None:  # always, unless a hook dropped it
            raise NonFiniteNumberError(where[0], where[1].literal, where[1].why)
    return doc


def _raise_huge_integer(text: str) -> None:
    """Raise HugeIntegerError for the first integer literal of ``text`` past Python's
    int-to-str digit limit; return when there is none. Only called after json.loads
    failed, so a document that loads pays nothing for it."""
    limit = sys.get_int_max_str_digits()
    if limit <= 0:  # no limit: json.loads failed for another reason
        return

    def integer(literal: str) -> Any:
        digits = len(literal) - literal.startswith("-")
        return _HugeInt(digits) if digits > limit else int(literal)

    try:
        doc = json.loads(text, object_pairs_hook=_unique_keys, parse_constant=str,
                         parse_int=integer)
    except (ValueError, RecursionError):
        return
    where = _first_marker(doc, _HugeInt)
    if where is not None:
        raise HugeIntegerError(where[0], where[1].digits, limit) from None


def unique_keys_loads(text: str) -> Any:
    """json.loads refusing a key named twice in one object only: NaN and Infinity pass,
    so the reader's own check names the field (a trace's ``t = nan: must be ...``)."""
    _refuse_bom(text)
    return json.loads(text, object_pairs_hook=_unique_keys)


_SHOW_LIMIT = 80
_SHOW_CONTAINER_LIMIT = 120  # an allocation of a plan file, in full


def show_value(value: Any) -> str:
    """A short, always-printable rendering of a user value for error messages.

    Never raises: huge integers (past Python's int-to-str limit) are described by
    their size, long strings are cut, a container is shown as compact JSON when that is
    short and by its size when not. Here, not in the layout package, so the trace
    readers use it without importing pydantic.
    """
    if isinstance(value, bool) or value is None:
        return json.dumps(value)
    if isinstance(value, int):
        if value.bit_length() > 128:
            return f"<{'negative ' if value < 0 else ''}integer of {value.bit_length()} bits>"
        return str(value)
    if isinstance(value, float):
        return repr(value)
    if isinstance(value, str):
        text = json.dumps(value)
        return text if len(text) <= _SHOW_LIMIT else text[:_SHOW_LIMIT - 4] + '..."'
    if isinstance(value, (dict, list, tuple)):  # the value itself when it is short
        text = _brief(value, _SHOW_CONTAINER_LIMIT)
        if text is not None:
            return text
        kind = "object" if isinstance(value, dict) else "list"
        n = len(value)  # (was: the type name, "dict")
        return f"<{kind} of {n:,} {'entry' if n == 1 else 'entries'}>"
    return type(value).__name__


def _brief(value: Any, room: int) -> str | None:
    """Compact JSON of ``value`` if it takes at most ``room`` characters, else None;
    stops as soon as the room is spent (a huge list costs no more than a short one)."""
    if isinstance(value, (dict, list, tuple)):
        if room < 2:
            return None
        opened, closed = ("{", "}") if isinstance(value, dict) else ("[", "]")
        parts: list[str] = []
        left = room - 2
        items = value.items() if isinstance(value, dict) else ((None, v) for v in value)
        for key, v in items:
            head = ""
            if key is not None:
                shown = _brief(str(key), left)
                if shown is None:
                    return None
                head = shown + ": "
            body = _brief(v, left - len(head) - (2 if parts else 0))
            if body is None:
                return None
            parts.append(head + body)
            left -= len(head) + len(body) + (2 if len(parts) > 1 else 0)
        return opened + ", ".join(parts) + closed
    if isinstance(value, str):  # whole, or not at all (a cut string inside is no JSON)
        text = json.dumps(value)
        return text if len(text) <= min(room, _SHOW_LIMIT) else None
    text = show_value(value)
    return text if len(text) <= room else None


def json_error_text(err: "json.JSONDecodeError") -> str:
    """``Expecting value at column 7``: the decoder's message and where. Why: some of
    its messages end in "at" already ("Unterminated string starting at"), which read
    "starting at at column 160"."""
    if err.msg == BOM_RULE:
        return BOM_RULE
    msg = err.msg[:-3] if err.msg.endswith(" at") else err.msg
    return f"{msg} at column {err.colno}"


def is_json_document(data: str | bytes) -> bool:
    """Whether the whole of ``data`` is one JSON document. Why: a file that parses only
    as a whole (an indented geometry) given where a one-line format belongs (a trace's
    NDJSON, the host ledger) is another program's file, not a damaged one of ours."""
    try:
        json.loads(data)
    except (UnicodeDecodeError, ValueError, RecursionError):
        return False
    return True
