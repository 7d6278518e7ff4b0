"""``kvgrant plan GEOMETRY``: what the naive, reference-rule and packed plans cost.

Prints per rank bytes, allocations, mappings, access grants and driver handles
(mappings x granted devices), whether the packed plan is proven optimal (or how far
from optimal it may be), the allocation lower bound, the handles any contract-keeping
plan needs, the largest conflict set, and the pre-flight: the driver-handle demand of
all ranks against the host's budget (one pool for every process and GPU of the
host) less the reserve for users kvgrant cannot see (default 4,096, set with
--handle-reserve N as for kvgrant alloc, so "fits" here means alloc's pre-flight
accepts the plan on a host where no other kvgrant process holds handles: their
shares, in the host ledger, are what ``kvgrant budget`` lists), with grants to
owner + importers and to every declared reader, so a user sees before start-up
whether it will fail. ``--json`` prints the same plus the packed plan as a plan
document that ``kvgrant alloc --plan FILE`` reuses (``--json`` writes JSON on an
error too). Steps that take more than a second report progress on stderr.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import sys
import threading
import time
from typing import Any, Callable, Iterator

from kvgrant.commands._args import count, path_arg, positive_seconds
from kvgrant.commands._report import report_error
from kvgrant.errors import KVGrantError

__all__ = ["add_parser", "run"]


def add_parser(subparsers: Any) -> None:
    from kvgrant.layout.preflight import DEFAULT_HANDLE_BUDGET, DEFAULT_HANDLE_RESERVE

    p = subparsers.add_parser(
        "plan", help="compare naive, reference and packed plans; pre-flight handle demand",
        description=__doc__.split("\n\n")[1] if __doc__ else None)
    p.add_argument("geometry", type=path_arg, metavar="GEOMETRY", help="geometry JSON file")
    p.add_argument("--handle-budget", type=count, default=DEFAULT_HANDLE_BUDGET,
                   metavar="N",
                   help=f"driver handles the whole host may hold, over every process and GPU "
                        f"(default {DEFAULT_HANDLE_BUDGET:,}, measured on an H200 with driver 580)")
    # the name, type (validation) and help of kvgrant alloc's option: the pre-flight
    # counts the same reserve, so "fits" here means alloc's pre-flight accepts the plan
    # (the ledger's other holders aside)
    p.add_argument("--handle-reserve", type=count, default=None, metavar="N",
                   help="handles kept for users kvgrant cannot see (NCCL, PyTorch, other "
                        f"engines; default {DEFAULT_HANDLE_RESERVE:,})")
    p.add_argument("--no-bound", action="store_true",
                   help="skip the combinatorial lower bound and the any-plan handle bound "
                        "(the solver's optimality proof is still printed)")
    p.add_argument("--json", action="store_true",
                   help="machine-readable output, including the packed plan as a plan "
                        "document for kvgrant alloc --plan FILE")
    p.add_argument("--time-limit", type=_time_limit, default=None, metavar="S",
                   help="stop the solver, the heuristic packer and the neighbourhood "
                        "search after S wall seconds "
                        "and keep the best plan found, with its gap. Such a plan depends "
                        "on this host's speed: write it with --json and give every rank "
                        "the file (kvgrant alloc --plan FILE). Default: no limit")
    p.add_argument("--max-gap", type=_max_gap, default=None, metavar="FRACTION",
                   help="stop the solver once its plan is within this fraction of optimal "
                        "(0 solves on to the proof; default 0.01, what every rank uses). "
                        "A plan of another gap is not the one ranks compute for "
                        "themselves: write it with --json and give every rank the file")
    p.set_defaults(run=run)


def _max_gap(text: str) -> float:
    """``--max-gap``: a fraction >= 0 and < 1 (0.01 is 1%)."""
    bare = text.strip()
    try:
        value = float(bare)
    except ValueError:
        value = float("nan")
    if not 0 <= value < 1:
        raise argparse.ArgumentTypeError(f"{bare[:40]!r}: must be a fraction >= 0 and < 1 "
                                         "(0.01 is 1%; 0 asks for the proof)")
    return value


def _time_limit(text: str) -> float:
    """``--time-limit``: seconds > 0, at most the planner's limit (a day)."""
    from kvgrant.layout.planner import MAX_TIME_LIMIT

    return positive_seconds(text, most=MAX_TIME_LIMIT)


HEARTBEAT_S = 30.0
"""Seconds between "still planning" lines while the planner runs."""


@contextlib.contextmanager
def _heartbeat(progress: Callable[[str], None], limit: float | None,
               every: float = HEARTBEAT_S) -> Iterator[None]:
    """A "still planning" line every ``every`` seconds while the body runs.

    Why: the solver reports at its limit checks only, and a root LP can run for minutes
    between two (docs/layout.md, "Determinism"); a user watching a silent terminal
    should learn it is working and, without a time limit, how to stop it early. It only
    prints: the plan is the same with or without it (HiGHS frees the GIL while it runs).
    """
    done = threading.Event()
    t0 = time.perf_counter()

    def beat() -> None:
        while not done.wait(every):
            took = time.perf_counter() - t0
            progress(f"still planning ({took:,.0f} s)" + (
                f" of at most {limit:g} s" if limit is not None else
                "; --time-limit S stops the solver after S s with its best plan and gap"))

    thread = threading.Thread(target=beat, name="kvgrant-plan-heartbeat", daemon=True)
    thread.start()
    try:
        yield
    finally:
        done.set()
        thread.join()


def _watched() -> bool:
    """Whether stderr is a terminal (a closed or replaced stream counts as not)."""
    try:
        return sys.stderr.isatty()
    except (AttributeError, ValueError):
        return False


class _Progress:
    """Progress lines on stderr, shown once a step has run for more than a second
    (quick runs stay quiet). Thread-safe: the heartbeat reports from its own thread."""

    def __init__(self, delay: float = 1.0) -> None:
        self.t0 = time.perf_counter()
        self.delay = delay
        self.lock = threading.Lock()
        self.pending: list[tuple[float, str]] = []

    def __call__(self, message: str) -> None:
        with self.lock:
            self.pending.append((time.perf_counter() - self.t0, message))
            self._flush()

    def flush(self) -> None:
        """Print the held lines, each with the time it was reported at."""
        with self.lock:
            self._flush()

    def _flush(self) -> None:
        if time.perf_counter() - self.t0 < self.delay:
            return
        for at, m in self.pending:
            print(f"kvgrant plan: [{at:5.1f} s] {m}", file=sys.stderr, flush=True)
        self.pending.clear()


def run(args: argparse.Namespace) -> int:
    try:
        return _run(args)
    except KVGrantError as err:
        return report_error("plan", err, as_json=args.json)


def _run(args: argparse.Namespace) -> int:
    from kvgrant.layout.geometry import load_geometry
    from kvgrant.layout.planner import plan_packed
    from kvgrant.layout.report import build_report, format_report
    from kvgrant.layout.rules import naive_plan, reference_plan

    progress = _Progress()
    g = load_geometry(args.geometry)
    progress(f"planning {g.name!r} ({len(g.aliases):,} declared chunks)")
    plans = [naive_plan(g), reference_plan(g)]
    # the heartbeat is for someone watching a terminal (and a thread of its own, which
    # a caller counting this process's threads would see)
    beat = _heartbeat(progress, args.time_limit) if _watched() else contextlib.nullcontext()
    with beat:
        gap = {} if args.max_gap is None else {"max_gap": args.max_gap}
        packed = plan_packed(g, progress=progress, time_limit=args.time_limit, **gap)
    plans.append(packed.plan)
    progress(f"packed plan: {len(packed.plan.allocations):,} allocations, {packed.verdict()}")
    bound = handles = None
    if not args.no_bound:
        from kvgrant.layout.bound import allocation_lower_bound, handle_lower_bound

        bound = packed.lower_bound  # computed for the gap when there is no proof
        if bound is None:
            progress("combinatorial lower bound (--no-bound skips it)")
            bound = allocation_lower_bound(g)
        progress("any-plan handle bound")
        imp = handle_lower_bound(g, bound)
        # the bound depends on the granted-device counts only; e.g. DCP16: every reader
        # imports (comparing the reader tuples took ranks x group size)
        same = all(g.granted_count(r, declared=True) == g.granted_count(r)
                   for r in range(g.topology.ranks))
        handles = {"importers": imp,
                   "declared": imp if same else handle_lower_bound(g, bound, declared=True)}
    progress("report")
    from kvgrant.layout.preflight import DEFAULT_HANDLE_RESERVE

    reserve = DEFAULT_HANDLE_RESERVE if args.handle_reserve is None else args.handle_reserve
    if args.json:
        rep = build_report(g, plans, args.handle_budget, lower_bound=bound,
                           packed=packed, handle_bound=handles, reserve=reserve)
        json.dump({"ok": True, "exit_status": 0, **rep}, sys.stdout, indent=1)
        sys.stdout.write("\n")
    else:
        print(format_report(g, plans, args.handle_budget, lower_bound=bound,
                            packed=packed, handle_bound=handles, reserve=reserve))
    return 0
