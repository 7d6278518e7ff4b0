"""``kvgrant conform TRACE``: check a runtime trace against the lifecycle model.

Several files (or a directory) of one process group, or a file whose header has
``mode: "group"``, are checked together against the group model instead
(:mod:`kvgrant.conformance.group_check`, docs/group-trace.md).

Exit status: 0 accepted, 1 rejected (the first event the model does not allow is
printed with the model state before it and the actions enabled there), 2 when the
trace is malformed (with its line number) or TLC cannot run. With ``--engine both``
the two engines must agree; a disagreement is reported and exits 2.
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from kvgrant.errors import ToolError, TraceError

__all__ = ["add_parser", "run"]


def add_parser(subparsers: Any) -> None:
    p = subparsers.add_parser(
        "conform", help="check a trace against the lifecycle model (TLC and/or Python)",
        description=__doc__.split("\n\n")[1] if __doc__ else None)
    p.add_argument("trace", metavar="TRACE", nargs="+",
                   help="NDJSON trace written by kvgrant alloc --trace; for a process group "
                        "(docs/group-trace.md) its per-rank files, or their directory")
    p.add_argument("--engine", choices=("python", "tlc", "both"), default="python",
                   help="python: fast replay; tlc: TLC on specs/KVLifecycleTrace.tla; "
                        "both: run both and require the same verdict (default: python)")
    p.add_argument("--json", action="store_true", help="print the verdict(s) as JSON")
    p.set_defaults(run=run)


def _print_verdict(v: Any) -> None:
    print(v.summary())
    if v.accepted:
        return
    if v.event is not None:
        print(f"  event: {json.dumps(dict(v.event.raw), sort_keys=True)}")
    st = v.state_before or {}
    print(f"  model state before it: phase {st.get('phase')}, published {st.get('published')}")
    for r, rs in sorted((st.get("ranks") or {}).items(), key=lambda kv: int(kv[0])):
        print(f"    rank {r}: va={rs['va']} created={rs['created']} mapped={rs['mapped']} "
              f"alias_mapped={rs['alias_mapped']} grants={len(rs['access'])} "
              f"ready={rs['ready']} failed={rs['failed']}")
    print("  enabled there: " + (", ".join(v.enabled) if v.enabled else "(none)"))


def run(args: argparse.Namespace) -> int:
    from kvgrant.conformance import check_trace
    from kvgrant.conformance.group_check import is_group_input, run_group

    if is_group_input(args.trace):
        return run_group(args.trace, args.engine, args.json)
    args.trace = args.trace[0]

    try:
        verdicts = check_trace(args.trace, engine=args.engine)
    except TraceError as err:
        _error(args, f"malformed trace: {err}", kind="malformed", line=err.line)
        return 2
    except ToolError as err:
        _error(args, f"TLC could not check the trace: {err}", kind="tool")
        return 2
    agree = len({(v.accepted, v.index) for v in verdicts}) == 1
    if args.json:
        print(json.dumps({"trace": args.trace, "engine": args.engine, "agree": agree,
                          "accepted": all(v.accepted for v in verdicts),
                          "verdicts": [v.to_json() for v in verdicts]}, indent=2))
    else:
        for v in verdicts:
            _print_verdict(v)
        if not agree:
            print("kvgrant conform: engines DISAGREE: "
                  + "; ".join(f"{v.engine}: index {v.index}" for v in verdicts),
                  file=sys.stderr)
    if not agree:
        return 2
    return 0 if verdicts[0].accepted else 1


def _error(args: argparse.Namespace, message: str, *, kind: str,
           line: int | None = None) -> None:
    if args.json:
        print(json.dumps({"trace": args.trace, "engine": args.engine, "error": kind,
                          "line": line, "message": message}, indent=2))
    print(f"kvgrant conform: error: {message}", file=sys.stderr)
