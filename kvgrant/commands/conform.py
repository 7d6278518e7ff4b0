"""``kvgrant conform TRACE``: check a runtime trace against the lifecycle model.

Several files (or a directory) of one process group, or a file whose header has
``mode: "group"``, are checked together against the group model instead
(:mod:`kvgrant.conformance.group_check`, docs/group-trace.md).

Exit status: 0 accepted, 1 rejected (the first event the model does not allow is
printed with the model state before it and the actions enabled there), 2 when the
trace is malformed (with its line number) or TLC cannot run. With ``--engine both``
the two engines must agree; a disagreement is reported and exits 2. The Python
verdict is printed as soon as it is known, before TLC starts; a trace longer than
TLC can check (``--tlc-max-events``) is refused up front with the reason.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from typing import Any, Callable, Iterable

from kvgrant.commands._args import count, path_arg, positive_int, positive_seconds
from kvgrant.commands._report import error_document, error_fields, verdict_document
from kvgrant.errors import ArgumentError, KVGrantError, ToolError, TraceError

__all__ = ["TLC_MAX_EVENTS", "add_parser", "run"]

#: Longest trace handed to TLC by default. Measured on the 2-core development VM under
#: load (load average 10-13), prefixes of a published-layout trace on one rank, TLC 2.15
#: with the 256 MiB thread stack the wrapper now asks for (with the JVM's default stack
#: it overflowed below 1,000 events): 1,000 events 47 s, 2,000 100 s, 3,000 148 s (about
#: 50 ms per event up to there), then 5,000 485 s, past the default 300 s timeout. So
#: 3,000, with half the timeout to spare for a slower machine. ``make demo``'s trace
#: (178,611 events) is far beyond TLC: the Python engine checks it in about a second.
TLC_MAX_EVENTS = 3_000
#: Seconds TLC may take on one trace before the check is reported as not finished.
TLC_TIMEOUT_S = 300.0
#: Ranks and list items shown in a human-readable model state; --json has them all.
_SHOW_RANKS = 8
_SHOW_ITEMS = 12


def add_parser(subparsers: Any) -> None:
    p = subparsers.add_parser(
        "conform", help="check a trace against the lifecycle model (TLC and/or Python)",
        description=__doc__.split("\n\n")[1] if __doc__ else None)
    p.add_argument("trace", type=path_arg, metavar="TRACE", nargs="+",
                   help="NDJSON trace written by kvgrant alloc --trace; for a process group "
                        "(docs/group-trace.md) its per-rank files, or their directory")
    p.add_argument("--engine", choices=("python", "tlc", "both"), default="python",
                   help="python: fast replay; tlc: TLC on specs/KVLifecycleTrace.tla; "
                        "both: run both and require the same verdict (default: python)")
    p.add_argument("--tlc-max-events", type=count, default=None, metavar="N",
                   help=f"refuse to hand TLC a trace of more than N events (default "
                        f"{TLC_MAX_EVENTS:,}, what it finishes within the timeout; 0: no limit)")
    p.add_argument("--tlc-timeout", type=positive_seconds, default=None, metavar="S",
                   help=f"seconds TLC may take (default {TLC_TIMEOUT_S:.0f})")
    p.add_argument("--geometry", type=path_arg, metavar="FILE", default=None,
                   help="also check that the trace header's plan (allocations, planes, "
                        "regions, reservation sizes, import groups, declared readers) is "
                        "the one this geometry gives for the header's plan label and pages "
                        "(for a group: every process's header)")
    p.add_argument("--ranks", type=positive_int, default=None, metavar="N",
                   help="with --geometry: the geometry run on N ranks, as `kvgrant alloc "
                        "--ranks N` did")
    p.add_argument("--json", action="store_true", help="print the verdict(s) as JSON")
    p.set_defaults(run=run)


def _short_list(items: Iterable[Any], limit: int = _SHOW_ITEMS) -> str:
    """Integers as ranges (``0..200``), at most ``limit`` parts, then how many more."""
    seq = list(items)
    values = sorted(seq) if all(isinstance(x, int) for x in seq) else sorted(seq, key=str)
    parts: list[str] = []
    i = 0
    while i < len(values):
        j = i
        if isinstance(values[i], int):
            while j + 1 < len(values) and values[j + 1] == values[j] + 1:
                j += 1
        parts.append(str(values[i]) if j == i else f"{values[i]}..{values[j]}")
        i = j + 1
    shown = ", ".join(parts[:limit])
    more = f", ... {len(parts) - limit} more runs" if len(parts) > limit else ""
    return f"[{shown}{more}] ({len(values)})" if len(values) > 1 else f"[{shown}]"


def _print_verdict(v: Any) -> None:
    print(v.summary())
    if v.accepted:
        return
    if v.event is not None:
        text = json.dumps(dict(v.event.raw), sort_keys=True)
        print("  event: " + (text if len(text) <= 400 else text[:400] + " ... (see --json)"))
    st = v.state_before or {}
    print(f"  model state before it: phase {st.get('phase')}, published "
          f"{_short_list(st.get('published') or [])}")
    ranks = sorted((st.get("ranks") or {}).items(), key=lambda kv: int(kv[0]))
    for r, rs in ranks[:_SHOW_RANKS]:
        print(f"    rank {r}: va={rs['va']} created={_short_list(rs['created'])} "
              f"mapped={_short_list(rs['mapped'])} "
              f"alias_mapped={_short_list(rs['alias_mapped'])} grants={len(rs['access'])} "
              f"ready={rs['ready']} failed={rs['failed']}")
    if len(ranks) > _SHOW_RANKS:
        print(f"    ... {len(ranks) - _SHOW_RANKS} more ranks (all of them with --json)")
    enabled = list(v.enabled)
    shown = ", ".join(enabled[:_SHOW_ITEMS])
    if len(enabled) > _SHOW_ITEMS:
        shown += f", ... {len(enabled) - _SHOW_ITEMS} more (all of them with --json)"
    print("  enabled there: " + (shown or "(none)"))
    sys.stdout.flush()


def _tlc_progress(events: int) -> Any:
    def report(elapsed: float) -> None:
        print(f"kvgrant conform: TLC still checking {events:,} events ({elapsed:.0f} s)",
              file=sys.stderr, flush=True)
    return report


def run(args: argparse.Namespace) -> int:
    from kvgrant.conformance.group_check import is_group_input, run_group
    from kvgrant.conformance.tlc import exit_on_signals

    tlc_options = [(f"--{name.replace('_', '-')}", getattr(args, name, None))
                   for name in ("tlc_max_events", "tlc_timeout")]
    given = [(flag, v) for flag, v in tlc_options if v is not None]
    if given and getattr(args, "engine", "python") == "python":
        # was: ignored; only the TLC engine reads them
        flag, value = given[0]
        err = ArgumentError(f"{flag} = {value:g}: only with --engine tlc or both (the "
                            "python engine does not run TLC)", argument=flag.lstrip("-"),
                            value=value)
        if len(args.trace) == 1:
            args.trace = args.trace[0]
        _error(args, str(err), kind="argument", error_class=ArgumentError, cause=err)
        return 2
    if getattr(args, "tlc_max_events", None) is None:
        args.tlc_max_events = TLC_MAX_EVENTS
    if getattr(args, "tlc_timeout", None) is None:
        args.tlc_timeout = TLC_TIMEOUT_S
    if getattr(args, "ranks", None) is not None and getattr(args, "geometry", None) is None:
        # was: ignored; the trace's header says its ranks, --ranks only says how the
        # geometry was run (kvgrant alloc --ranks N) for the --geometry comparison
        err = ArgumentError(f"--ranks = {args.ranks}: needs --geometry (it says the "
                            f"geometry was run on {args.ranks} ranks, as `kvgrant alloc "
                            f"--ranks {args.ranks}` ran it, for the comparison with the trace "
                            "header; a trace's own ranks are in its header)",
                            argument="ranks", value=args.ranks)
        if len(args.trace) == 1:
            args.trace = args.trace[0]  # as the other documents name a single file
        _error(args, str(err), kind="argument", error_class=ArgumentError, cause=err)
        return 2
    # TLC and its temp folders must go on SIGTERM/SIGHUP/SIGINT too (issue #16).
    with exit_on_signals():
        if is_group_input(args.trace):
            if getattr(args, "geometry", None) is not None:
                rc = _check_geometry(
                    args, lambda notes: group_geometry_mismatches(
                        args.trace, args.geometry, args.ranks, notes),
                    f"every header matches {args.geometry}",
                    f"every header keeps the layout contract of {args.geometry}")
                if rc is not None:
                    return rc
            return run_group(args.trace, args.engine, args.json,
                             tlc_timeout=args.tlc_timeout, tlc_max_events=args.tlc_max_events)
        args.trace = args.trace[0]
        return _run(args)


def _run(args: argparse.Namespace) -> int:
    from kvgrant.conformance import load_trace
    from kvgrant.conformance.group_check import trace_error_text

    try:
        trace = load_trace(args.trace)
        # (a fast-read trace builds its events lazily: a line the fast reader vouched for
        # but the detailed one refuses would raise here, and is bad input all the same)
        return _check(args, trace)
    except TraceError as err:
        _error(args, trace_error_text(err), kind="malformed", error_class=TraceError,
               line=err.line)
        return 2


def _check(args: argparse.Namespace, trace: Any) -> int:
    """The geometry comparison and the engines' verdicts on a parsed trace."""
    from kvgrant.conformance import replay

    if getattr(args, "geometry", None) is not None:
        rc = _check_geometry(
            args, lambda notes: geometry_mismatches(trace, args.geometry, args.ranks, notes),
            f"header matches {args.geometry} (plan {trace.header.extra.get('plan')!r})",
            f"header keeps the layout contract of {args.geometry} "
            f"(plan {trace.header.extra.get('plan')!r})")
        if rc is not None:
            return rc
    verdicts = []
    if args.engine in ("python", "both"):
        verdicts.append(replay(trace))
        if not args.json:
            _print_verdict(verdicts[-1])
    if args.engine in ("tlc", "both"):
        n = len(trace.events)
        limit = args.tlc_max_events
        if limit and n > limit:
            _error(args, f"TLC cannot check this trace: it has {n:,} events, more than the "
                         f"{limit:,} TLC checks within its timeout (measured on a 2-core "
                         "machine: 3,000 events in 148 s, 5,000 in 485 s). Check it with "
                         "--engine python, or record a shorter trace (e.g. kvgrant alloc "
                         "--ranks 1 on a smaller layout), or raise --tlc-max-events and "
                         "--tlc-timeout", kind="too_long", error_class=ToolError)
            return 2
        try:
            verdicts.append(_check_tlc(trace, args))
        except ToolError as err:
            _error(args, f"TLC could not check the trace: {err}", kind="tool",
                   error_class=type(err))
            return 2
        if not args.json:
            _print_verdict(verdicts[-1])
    agree = len({(v.accepted, v.index) for v in verdicts}) == 1
    status = 2 if not agree else 0 if verdicts[0].accepted else 1
    disagreement = "engines DISAGREE: " + "; ".join(f"{v.engine}: index {v.index}"
                                                    for v in verdicts)
    if args.json:
        doc: dict[str, Any] = {"trace": args.trace, "engine": args.engine, "agree": agree,
                               "accepted": all(v.accepted for v in verdicts),
                               "verdicts": [v.to_json() for v in verdicts]}
        message = "" if status == 0 else disagreement if status == 2 else \
            next(v.summary() for v in verdicts if not v.accepted)
        print(json.dumps(verdict_document(doc, status, message), indent=2))
    elif not agree:
        print(f"kvgrant conform: {disagreement}", file=sys.stderr)
    return status


#: compare_plan's line for a rank count that differs (a file prefix for a group's)
_RANKS_DIFF = re.compile(r"(?:.*: )?header\.ranks = (\d+) but the geometry has (\d+) ranks")


def _geometry_rejected(args: argparse.Namespace, diffs: list[str]) -> int:
    msg = (f"the trace header does not match {args.geometry}: " + "; ".join(diffs[:5])
           + (f"; ... {len(diffs) - 5} more" if len(diffs) > 5 else ""))
    fewer = next((m for m in map(_RANKS_DIFF.fullmatch, diffs)
                  if m and int(m.group(1)) < int(m.group(2))), None)
    if fewer is not None and getattr(args, "ranks", None) is None:
        # the usual cause: the trace of `kvgrant alloc --ranks N` checked without it
        msg += (f" (the trace was made on {fewer.group(1)} ranks: if it comes from "
                f"`kvgrant alloc --ranks {fewer.group(1)}`, check it with --ranks "
                f"{fewer.group(1)} too)")
    if args.json:
        print(json.dumps(verdict_document(
            {"trace": args.trace, "engine": args.engine, "accepted": False, "agree": True,
             "error": "geometry", "mismatches": diffs}, 1, msg), indent=2))
    print(f"kvgrant conform: rejected: {msg}", file=sys.stderr)
    return 1


def _check_geometry(args: argparse.Namespace,
                    mismatches: Callable[[list[str]], list[str]],
                    matched: str, kept: str) -> int | None:
    """``--geometry``: None when the header(s) carry the geometry's plan, or a packed
    plan other than this kvgrant's that keeps the geometry's layout contract (the check
    goes on), else the exit status (1 mismatch, 2 the geometry or plan label is
    unusable). ``mismatches`` appends a note per such packed plan to the list it is
    given; then ``kept`` is printed instead of ``matched``, and the notes after it (to
    stderr with ``--json``, whose stdout is the verdict)."""
    notes: list[str] = []
    try:
        diffs = mismatches(notes)
    except KVGrantError as err:
        _error(args, f"--geometry {args.geometry}: {err}", kind="geometry",
               error_class=type(err), cause=err)
        return 2
    if diffs:
        return _geometry_rejected(args, diffs)
    if not args.json:
        print(kept if notes else matched)
    for note in notes:
        print(f"  note: {note}" if not args.json else f"kvgrant conform: note: {note}",
              file=sys.stderr if args.json else sys.stdout)
    return None


def _expected_plan(layout: Any, label: Any, geometry: str, ranks: int | None
                   ) -> tuple[dict[str, Any], Any, list[str]]:
    """The header fields the runtime derives from ``geometry`` for a plan ``label`` and
    the header's fitted page count (kvgrant.traceformat.plan_header), the geometry as
    the runtime saw it (on ``ranks``, fitted pages), and what no fitting explains: more
    pages than the geometry declares (fitting to free memory only takes pages away)."""
    from kvgrant.layout.geometry import load_geometry, on_ranks
    from kvgrant.layout.plans import make_plan
    from kvgrant.runtime.engine import va_layout
    from kvgrant.traceformat import plan_header

    g = load_geometry(geometry)
    if ranks is not None:
        g = on_ranks(g, ranks)
    wrong: list[str] = []
    if layout.pages is not None and layout.pages > g.pages:
        wrong.append(f"header.pages = {layout.pages:,}: more than the geometry's "
                     f"pages = {g.pages:,} (pages are only ever fitted down to free memory)")
    elif layout.pages is not None and layout.pages != g.pages:
        g = g.model_copy(update={"pages": layout.pages})  # fitted to free memory
    plan = make_plan(g, label if isinstance(label, str) else "?")
    plane_off, region_off, size = va_layout(g)
    want = plan_header(g, plan.allocations, plane_off, region_off, size,
                       {r: None for r in range(g.topology.ranks)})
    want["ranks"] = g.topology.ranks
    return want, g, wrong


def _with_pages(wrong: list[str], diffs: list[str]) -> list[str]:
    """``wrong`` (more pages than the geometry's) first, then the other differences
    from the geometry's own plan (its pages difference is ``wrong`` already)."""
    if not wrong:
        return diffs
    return wrong + [d for d in diffs if not d.startswith("header.pages")]


def _other_packed_plan(layout: Any, ranks: int, label: Any, g: Any,
                       want: dict[str, Any], prefix: str = "") -> str | None:
    """A note when the header differs from ``want`` (the fields ``g`` gives) in the
    allocations of a ``packed`` plan only, and those keep the layout contract of
    ``g``; else None (the differences stand).

    Why: the packed plan is the planner's optimum, a function of the geometry *and*
    of the planner's code (the host plan cache keys on both): a trace recorded by an
    earlier kvgrant carries that planner's packed plan, and ``kvgrant alloc --plan
    FILE`` allocates a plan file's; either may differ allocation by allocation (same
    count or not) while being a plan of this very geometry. So a packed plan is
    checked as a plan of the geometry (the contract check, as for a plan file), not
    as this planner's answer. The rule plans (``naive``, ``reference``) have one
    answer and are compared exactly."""
    from kvgrant.conformance.trace_plan import compare_plan
    from kvgrant.layout.contract import check_contract
    from kvgrant.layout.plan import Allocation

    # the header against the geometry's fields with its own allocations in: nothing
    # else may differ
    if label != "packed" or compare_plan(
            layout, ranks, {**want, "allocations": layout.to_json()["allocations"]}):
        return None
    allocs = [Allocation(a.plane, a.plane_offset, a.length, a.region, a.region_offset)
              for a in layout.allocations]
    if check_contract(g, allocs):
        return None
    return (f"{prefix}the header's packed plan ({len(allocs):,} allocations) is not the one "
            "this kvgrant computes (an earlier planner, or a plan file) but keeps the "
            "layout contract of the geometry")


def geometry_mismatches(trace: Any, geometry: str, ranks: int | None = None,
                        notes: list[str] | None = None) -> list[str]:
    """Where the trace header's plan differs from the one ``geometry`` gives (its plan
    label, fitted pages and VA layout, as the runtime derives them); [] when equal,
    or when the only difference is a ``packed`` plan that is not this kvgrant's (an
    earlier planner's, or a plan file's) and keeps the layout contract (said in
    ``notes``). Raises KVGrantError when the geometry cannot be read or the header's
    plan label is not one the geometry can make."""
    from kvgrant.conformance.trace_plan import compare_plan

    h = trace.header
    if h.layout is None:
        raise TraceError("the trace has no plan in its header (version 1)", line=1)
    label = h.extra.get("plan")
    want, g, wrong = _expected_plan(h.layout, label, geometry, ranks)
    diffs = _with_pages(wrong, compare_plan(h.layout, h.ranks, want))
    note = _other_packed_plan(h.layout, h.ranks, label, g, want) \
        if diffs and not wrong else None
    if note is None:
        return diffs
    if notes is not None:
        notes.append(note)
    return []


def group_geometry_mismatches(paths: list[str], geometry: str,
                              ranks: int | None = None,
                              notes: list[str] | None = None) -> list[str]:
    """:func:`geometry_mismatches` for each file of a group, each line prefixed with the
    file. Reservation sizes are left to the group reader, which checks them against the
    plan (one slot per rank the process maps)."""
    from kvgrant.conformance.group_io import read_group_headers
    from kvgrant.conformance.trace_plan import compare_plan

    out: list[str] = []
    first: tuple[str, Any] | None = None  # the first file and its allocations
    for path, h in read_group_headers(paths):
        # every process of a group allocates one plan: other allocations in a second
        # file are a group whose processes planned differently (the failure the
        # host's plan cache exists to prevent), whatever the geometry says
        if first is None:
            first = (path, h.layout.allocations)
        elif h.layout.allocations != first[1]:
            out.append(f"{path}: header.allocations differ from {first[0]}'s (the processes "
                       "of one group allocate one plan)")
            continue
        label = h.extra.get("plan")
        want, g, wrong = _expected_plan(h.layout, label, geometry, ranks)
        want["reservations"] = h.layout.to_json()["reservations"]
        diffs = [f"{path}: {d}" for d in _with_pages(
            wrong, compare_plan(h.layout, h.constants.ranks, want))]
        note = _other_packed_plan(h.layout, h.constants.ranks, label, g, want,
                                  f"{path}: ") if diffs and not wrong else None
        if note is None:
            out += diffs
        elif notes is not None:
            notes.append(note)
    return out


def _check_tlc(trace: Any, args: argparse.Namespace) -> Any:
    from kvgrant.conformance import check_trace_tlc
    from kvgrant.conformance.tlc import reporting_progress

    if args.json:
        return check_trace_tlc(trace, timeout=args.tlc_timeout)
    with reporting_progress(_tlc_progress(len(trace.events)), every=30.0):
        return check_trace_tlc(trace, timeout=args.tlc_timeout)


def _error(args: argparse.Namespace, message: str, *, kind: str,
           error_class: type[BaseException],
           line: int | None = None, cause: BaseException | None = None) -> None:
    """An exit-2 error: stderr, and with --json conform's error document (``error`` is
    the short ``kind``, ``message`` the text), with the fields every kvgrant error
    document has (kvgrant.commands._report: ``ok``, ``kind`` the error class,
    ``exit_status``) and those ``cause`` carries (an ArgumentError's ``argument`` and
    ``value``, a geometry's ``field``: they were left out)."""
    if args.json:
        fields = error_fields(cause) if cause is not None else {}
        fields.pop("line", None)
        doc = {**error_document(error_class.__name__, message, 2, **fields),
               "trace": args.trace, "engine": args.engine, "error": kind, "line": line}
        print(json.dumps(doc, indent=2))
    print(f"kvgrant conform: error: {message}", file=sys.stderr)
