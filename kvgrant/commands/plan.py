"""``kvgrant plan GEOMETRY``: what the naive, reference-rule and packed plans cost.

Prints per rank bytes, allocations, mappings, access grants and driver handles
(mappings x granted devices), the allocation lower bound, the largest conflict set,
and the pre-flight: the driver-handle demand of all ranks against the host's budget
(one pool for every process and GPU of the host), with grants to owner + importers
and to every declared reader, so a user sees before start-up whether it will fail. ``--json``
prints the same plus every allocation of the packed plan.
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from kvgrant.commands._args import count

__all__ = ["add_parser", "run"]


def add_parser(subparsers: Any) -> None:
    from kvgrant.layout.preflight import DEFAULT_HANDLE_BUDGET

    p = subparsers.add_parser(
        "plan", help="compare naive, reference and packed plans; pre-flight handle demand",
        description=__doc__.split("\n\n")[1] if __doc__ else None)
    p.add_argument("geometry", metavar="GEOMETRY", help="geometry JSON file")
    p.add_argument("--handle-budget", type=count, default=DEFAULT_HANDLE_BUDGET,
                   metavar="N",
                   help=f"driver handles the whole host may hold, over every process and GPU "
                        f"(default {DEFAULT_HANDLE_BUDGET:,}, measured on an H200 with driver 580)")
    p.add_argument("--json", action="store_true",
                   help="machine-readable output, including the packed plan's allocations")
    p.set_defaults(run=run)


def _lower_bound(g: Any) -> Any:
    """The allocation lower bound (kvgrant.layout.bound), independent of the packer."""
    from kvgrant.layout.bound import allocation_lower_bound

    return allocation_lower_bound(g)


def run(args: argparse.Namespace) -> int:
    from kvgrant.layout.geometry import load_geometry
    from kvgrant.layout.plans import PLAN_LABELS, make_plan
    from kvgrant.layout.report import build_report, format_report

    g = load_geometry(args.geometry)
    plans = [make_plan(g, label) for label in PLAN_LABELS]
    bound = _lower_bound(g)
    if args.json:
        json.dump(build_report(g, plans, args.handle_budget, lower_bound=bound),
                  sys.stdout, indent=1)
        sys.stdout.write("\n")
    else:
        print(format_report(g, plans, args.handle_budget, lower_bound=bound))
    return 0
