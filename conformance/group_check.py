"""``kvgrant conform`` for a process group: run one or both engines on its trace files
and print the verdicts (the single-process path stays in kvgrant.commands.conform).

Why here: the group verdict has its own fields (file, rank, seq, the interleaving), and
keeping them out of the command module keeps that module's edits small.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Sequence

from kvgrant.conformance.group_io import is_group_trace, load_group
from kvgrant.conformance.group_replay import GroupVerdict, replay_group
from kvgrant.conformance.tlc import check_timeout
from kvgrant.errors import ArgumentError, ToolError, TraceError

__all__ = ["check_group", "is_group_input", "run_group", "trace_error_text"]


def is_group_input(paths: Sequence[str]) -> bool:
    """Several files, a directory, or one file whose header says ``mode: "group"``."""
    return len(paths) > 1 or any(Path(p).is_dir() for p in paths) or \
        (len(paths) == 1 and is_group_trace(paths[0]))


def check_group(paths: Sequence[str | Path], engine: str = "python", *,
                tlc_timeout: float | None = 300.0,
                tlc_max_events: int = 0) -> list[GroupVerdict]:
    """One verdict per engine (Python first). TLC checks the interleaving the Python
    engine followed, so both judge the same event. Raises TraceError / ToolError (also
    when the group has more events than ``tlc_max_events``, 0: no limit, and TLC is
    asked for: ``kvgrant conform --tlc-max-events``; ``tlc_timeout``: ``--tlc-timeout``,
    both ignored for groups before 2026-12-07)."""
    if not isinstance(engine, str) or engine not in ("python", "tlc", "both"):
        # an ArgumentError (a ValueError too), as check_trace's; was a bare ValueError
        raise ArgumentError(f"check_group: engine = {engine!r}: must be 'python', 'tlc' or "
                            "'both'", argument="engine", value=engine)
    check_timeout(tlc_timeout, "tlc_timeout")  # before the group is replayed
    if isinstance(tlc_max_events, bool) or not isinstance(tlc_max_events, int) \
            or tlc_max_events < 0:
        # "5" was a TypeError, -1 refused every group as "more than the -1 TLC checks"
        raise ArgumentError(f"check_group: tlc_max_events = {tlc_max_events!r}: must be an "
                            "integer >= 0 (0: no limit)", argument="tlc_max_events",
                            value=tlc_max_events)
    from kvgrant.conformance.group_fast import fast_accept

    t = None
    # a group of clean runs, without a per-event replay; files over PARALLEL_BYTES in
    # all are checked one per CPU at once
    py = fast_accept(paths, jobs=None)
    if py is None:
        t = load_group(paths)
        py = replay_group(t)
    out = [py] if engine in ("python", "both") else []
    if engine in ("tlc", "both"):
        from kvgrant.conformance.tla_trace import check_group_tlc

        t = t or load_group(paths)
        if tlc_max_events and t.events > tlc_max_events:
            raise ToolError(f"the group has {t.events:,} events, more than the "
                            f"{tlc_max_events:,} TLC checks within its timeout: check it "
                            "with --engine python, or raise --tlc-max-events and "
                            "--tlc-timeout")
        out.append(check_group_tlc(t, order=py.order, timeout=tlc_timeout))
    return out


def _print(v: GroupVerdict) -> None:
    print(v.summary())
    if v.accepted:
        return
    print(f"  event: {json.dumps(v.event, sort_keys=True)}")
    st = v.state_before or {}
    proc = st.get("process") or {}
    print(f"  process {v.rank} before it: " + ", ".join(
        f"{k}={len(x) if isinstance(x, list) else x}" for k, x in proc.items()))
    print("  group: " + "; ".join(f"r{q} {g['phase']} vote={g['vote']} decision="
                                  f"{g['decision']}{' CRASHED' if g['crashed'] else ''}"
                                  for q, g in (st.get("group") or {}).items()))
    print(f"  enabled for rank {v.rank} there: " + (", ".join(v.enabled) or "(none)"))


def trace_error_text(err: TraceError) -> str:
    """The command's message for ``err``: "malformed trace: ..." unless the file could
    not be read at all (a missing file is not malformed; the text says "cannot read")."""
    return str(err) if "cannot read trace" in str(err) else f"malformed trace: {err}"


def run_group(paths: Sequence[str], engine: str, as_json: bool, *,
              tlc_timeout: float = 300.0, tlc_max_events: int = 0) -> int:
    """The command: exit 0 accepted, 1 rejected, 2 malformed / TLC failed / disagreement."""
    try:
        verdicts = check_group(paths, engine, tlc_timeout=tlc_timeout,
                               tlc_max_events=tlc_max_events)
    except TraceError as err:
        _error(paths, engine, as_json, trace_error_text(err), "malformed", err.line,
               error_class=TraceError)
        return 2
    except ToolError as err:
        _error(paths, engine, as_json, f"TLC could not check the traces: {err}", "tool",
               error_class=type(err))
        return 2
    agree = len({(v.accepted, v.rank, v.index) for v in verdicts}) == 1
    status = 2 if not agree else 0 if verdicts[0].accepted else 1
    disagreement = "engines DISAGREE: " + "; ".join(
        f"{v.engine}: rank {v.rank} seq {v.index}" for v in verdicts)
    if as_json:
        from kvgrant.commands._report import verdict_document

        message = "" if status == 0 else disagreement if status == 2 else \
            next(v.summary() for v in verdicts if not v.accepted)
        print(json.dumps(verdict_document(
            {"traces": list(paths), "mode": "group", "engine": engine, "agree": agree,
             "accepted": all(v.accepted for v in verdicts),
             "verdicts": [v.to_json() for v in verdicts]}, status, message), indent=2))
    else:
        for v in verdicts:
            _print(v)
        if not agree:
            print(f"kvgrant conform: {disagreement}", file=sys.stderr)
    return status


def _error(paths: Sequence[str], engine: str, as_json: bool, message: str, kind: str,
           line: int | None = None, *, error_class: type[BaseException] = TraceError) -> None:
    """An exit-2 error: stderr, and with --json the group's error document, with the
    fields every kvgrant error document has (``ok``, ``kind`` the error class,
    ``message``, ``exit_status``; kvgrant.commands._report); ``error`` is the short
    code, as for a single trace."""
    if as_json:
        from kvgrant.commands._report import error_document

        doc = {**error_document(error_class.__name__, message, 2), "traces": list(paths),
               "mode": "group", "engine": engine, "error": kind, "line": line}
        print(json.dumps(doc, indent=2))
    print(f"kvgrant conform: error: {message}", file=sys.stderr)
