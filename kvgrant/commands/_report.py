"""How a subcommand reports a failure: one line on stderr, ``kvgrant CMD: error: ...``,
and with ``--json`` one error document on stdout.

Why one place: each command printed its own document or none (``budget``, ``verify``,
argparse's usage errors and several ``alloc`` refusals printed nothing on stdout), so a
script reading ``--json`` could not tell an error from a crash. The document keeps the
shape ``alloc`` and ``plan`` already printed::

    {"ok": false, "kind": "<error class>", "error": "<message>", "message": "<message>",
     "exit_status": 2, ...}

``message`` repeats ``error`` under the name ``conform``'s documents use for the text
(their ``error`` is a short code, kept as it was), so every error document has ``ok``,
``kind``, ``message`` and ``exit_status``. The fields after those come from the error's
attributes (:func:`error_fields`).
"""

from __future__ import annotations

import json
import sys
from typing import Any

from kvgrant.commands._args import exit_status
from kvgrant.errors import (AllocationError, ArgumentError, DriverError, GeometryError,
                            GroupError, HandleBudgetError, KVGrantError, LedgerError,
                            PlanFileError, TraceError)

__all__ = ["error_document", "error_fields", "json_value", "report_error"]


def json_value(value: object) -> object:
    """``value`` when JSON holds it in at most 200 characters, else a short repr (an
    error's offending value may be a whole plan file's allocation list)."""
    try:
        if len(json.dumps(value)) <= 200:
            return value
    except (TypeError, ValueError, RecursionError):
        pass
    return repr(value)[:200]


def error_document(kind: str, message: str, status: int, **fields: Any) -> dict[str, Any]:
    """The ``--json`` error document (see the module docstring)."""
    return {"ok": False, "kind": kind, "error": message, "message": message,
            "exit_status": status, **fields}


def verdict_document(doc: dict[str, Any], status: int, message: str) -> dict[str, Any]:
    """``kvgrant conform``'s verdict document with the fields every ``--json`` document
    has: ``ok`` and ``exit_status``, and when the trace was not accepted ``kind``
    ("Rejected", or "Disagreement" between the engines) and ``message``. Why: a
    rejection was the one failure whose document had none of them (review 2026-12-07)."""
    out = {"ok": status == 0, **doc, "exit_status": status}
    if status:
        out.update(kind="Disagreement" if status == 2 else "Rejected", message=message)
    return out


def error_fields(err: BaseException) -> dict[str, Any]:
    """What the error's attributes say, JSON-ready: where bad input broke a rule (field,
    value, argument, file, line) or where a refusal or a driver call happened."""
    out: dict[str, Any] = {}
    if isinstance(err, ArgumentError):
        out.update(argument=err.argument, value=json_value(err.value))
    if isinstance(err, (GeometryError, PlanFileError)):
        out.update(field=err.field, value=json_value(err.value))
    if isinstance(err, (PlanFileError, LedgerError)):
        out["path"] = err.path
    if isinstance(err, TraceError):
        out["line"] = err.line
    if isinstance(err, HandleBudgetError):
        out.update(demand=err.demand, budget=err.budget, reserve=err.reserve,
                   held=err.held, holders=err.holders)
    if isinstance(err, DriverError):
        out.update(call=err.call, result=err.result_name, device=err.device)
        if err.rank is not None:  # where the raiser knew them (an undo's failure)
            out.update(rank=err.rank, target=err.target)
    if isinstance(err, AllocationError):
        out.update(call=err.call, rank=err.rank, device=err.device, result=err.result_name,
                   target=err.target, byte_range=err.byte_range, live=err.live,
                   free_before=err.free_before, free_after=err.free_after)
    if isinstance(err, GroupError):
        out.update(failed=err.failed, missing=err.missing, peer=err.peer)
    return out


def report_error(command: str, err: KVGrantError, *, as_json: bool,
                 status: int | None = None, **fields: Any) -> int:
    """Print ``err`` on stderr and, when ``as_json``, its error document on stdout;
    return the exit status (``exit_status(err)`` unless ``status`` is given).
    ``fields`` go into the document after the error's own (:func:`error_fields`)."""
    code = exit_status(err) if status is None else status
    if as_json:
        doc = error_document(type(err).__name__, str(err), code,
                             **{**error_fields(err), **fields})
        print(json.dumps(doc), flush=True)
    print(f"kvgrant {command}: error: {err}", file=sys.stderr)
    return code
