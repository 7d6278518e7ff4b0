"""``kvgrant alloc GEOMETRY``: allocate the cache on every rank, print it, release it.

The README's main job. Allocation is one transaction over all ranks (one process,
one GPU per rank): it publishes capacities only when every rank succeeded and
otherwise unwinds everything and exits non-zero with the error (call, rank, device,
plane/region, byte range, CUresult, live counts, free memory). ``--fail-at K`` makes
the K-th driver call fail, to watch the unwinding; ``--trace FILE`` (or
``KVGRANT_TRACE``) records every transition for ``kvgrant conform``.
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from kvgrant.errors import AllocationError, KVGrantError

from kvgrant.commands._args import count, exit_status, positive_int

__all__ = ["add_parser", "run"]

_LABELS = ("naive", "reference", "packed")


def _memory_limit(text: str) -> str:
    from kvgrant.runtime.capacity import parse_memory_limit

    try:
        parse_memory_limit(text)
    except KVGrantError as err:
        raise argparse.ArgumentTypeError(str(err)) from None
    return text


def add_parser(subparsers: Any) -> None:
    p = subparsers.add_parser(
        "alloc", help="allocate the KV cache on every rank, print capacities, release",
        description=__doc__.split("\n\n")[1] if __doc__ else None)
    p.add_argument("geometry", metavar="GEOMETRY", help="geometry JSON file")
    p.add_argument("--backend", choices=("auto", "cuda", "sim"), default="auto",
                   help="driver backend (default auto: cuda when a GPU is usable, else sim)")
    p.add_argument("--plan", default="packed", metavar="LABEL|FILE",
                   help="physical plan: naive, reference, packed (default), or a plan file "
                        "written by kvgrant plan --json (reused as it is, not planned again)")
    # "=" form matters: argparse reads "--memory-limit -1G" as a missing value
    p.add_argument("--memory-limit", type=_memory_limit, default=None, metavar="SIZE",
                   help="use what is free (default, or -0G); -1G keeps 1 GiB free per GPU; "
                        "40G uses at most 40 GiB per GPU (write --memory-limit=-1G)")
    p.add_argument("--trace", metavar="FILE", default=None,
                   help="write the transition trace (NDJSON) here (or set KVGRANT_TRACE)")
    p.add_argument("--fail-at", type=positive_int, default=None, metavar="K",
                   help="inject CUDA_ERROR_OUT_OF_MEMORY at the K-th driver call (1-based)")
    p.add_argument("--handle-budget", type=count, default=None, metavar="N",
                   help="per-process driver-handle budget for the pre-flight check "
                        "(default 523,880, measured on H200 / driver 580)")
    p.add_argument("--no-preflight", action="store_true",
                   help="skip the handle-budget pre-flight (reproduces the field failure)")
    p.add_argument("--ranks", type=int, default=None, metavar="N",
                   help="run the layout on N ranks that all import each other (e.g. a "
                        "16-rank published layout on the 2 GPUs a test host has)")
    p.add_argument("--devices", default=None, metavar="LIST",
                   help="comma-separated CUDA ordinal of each rank (default 0..ranks-1)")
    p.add_argument("--sim-handle-budget", type=count, default=None, metavar="N",
                   help="sim backend only: the simulated driver's handle budget")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.set_defaults(run=run)


def _driver_options(args: argparse.Namespace) -> dict[str, Any]:
    opts: dict[str, Any] = {}
    if args.fail_at is not None:
        from kvgrant.runtime.faults import Fault

        opts["faults"] = [Fault(nth=args.fail_at)]
    if args.sim_handle_budget is not None:
        opts["handle_budget"] = args.sim_handle_budget
    return opts


def _print_text(s: dict[str, Any], release_s: float | None, live_after: dict[str, int],
                trace: str | None) -> None:
    cap, c = s["capacity"], s["counts"]
    print(f"kvgrant alloc: {s['geometry']} ({s['plan']} plan) on {s['backend']}, "
          f"{s['ranks']} ranks on devices {s['devices']}")
    if s.get("backend_reason", "").startswith("auto:"):
        print(f"  backend {s['backend_reason']}")
    reduced = "" if cap["pages"] == cap["requested_pages"] else \
        f" (fitted from {cap['requested_pages']} under --memory-limit={cap['memory_limit']})"
    print(f"  published: {cap['pages']} KV pages{reduced} = {cap['kv_tokens']:,} KV tokens "
          f"per rank, {cap['snapshot_slots']} snapshot slots; rows "
          + ", ".join(f"{k}={v}" for k, v in cap["rows"].items()))
    print(f"  {cap['bytes_per_rank'] / 2**30:.2f} GiB per rank")
    print(f"  driver objects: {c['objects']:,} ({c['reservations']} reservations, "
          f"{c['allocations']:,} allocations, {c['mappings']:,} mappings); "
          f"{c['set_access_calls']:,} cuMemSetAccess calls, {c['grants']:,} grants "
          f"(driver handles)")
    print(f"  start-up {s['startup_s'] * 1e3:.1f} ms, release "
          f"{(release_s or 0.0) * 1e3:.1f} ms; live after release: "
          + ("nothing" if not any(live_after.values()) else
             ", ".join(f"{k}={v}" for k, v in live_after.items())))
    if trace:
        print(f"  trace: {trace}")


def run(args: argparse.Namespace) -> int:
    from kvgrant.runtime.allocator import allocate

    devices = None
    if args.devices:
        try:
            devices = [int(x) for x in args.devices.split(",")]
        except ValueError:
            print(f"kvgrant alloc: error: --devices = {args.devices!r}: must be comma-separated "
                  "integers", file=sys.stderr)
            return 2
    geometry: Any = args.geometry
    plan: Any = args.plan
    try:
        from kvgrant.layout.geometry import load_geometry, on_ranks

        if args.ranks is not None or plan not in _LABELS:
            geometry = load_geometry(args.geometry)
        if args.ranks is not None:
            geometry = on_ranks(geometry, args.ranks)
        if plan not in _LABELS:
            from kvgrant.layout.planfile import read_plan_file

            plan = read_plan_file(plan, geometry)
        pub = allocate(geometry, plan=plan, backend=args.backend, devices=devices,
                       memory_limit=args.memory_limit, handle_budget=args.handle_budget,
                       preflight=not args.no_preflight, trace=args.trace,
                       driver_options=_driver_options(args))
    except KVGrantError as err:
        if args.json:
            out: dict[str, object] = {"ok": False, "kind": type(err).__name__,
                                      "error": str(err)}
            if isinstance(err, AllocationError):
                out.update({"call": err.call, "rank": err.rank, "device": err.device,
                            "result": err.result_name, "target": err.target,
                            "byte_range": err.byte_range, "live": err.live,
                            "free_before": err.free_before, "free_after": err.free_after})
            print(json.dumps(out))
        print(f"kvgrant alloc: error: {err}", file=sys.stderr)
        return exit_status(err)
    summary = pub.summary()
    trace = str(pub.trace_path) if pub.trace_path else None
    pub.release()
    live_after = pub.driver.live().as_dict()
    trace_error = pub.trace_error
    if args.json:
        summary.update({"ok": trace_error is None, "release_s": round(pub.release_s or 0.0, 6),
                        "live_after_release": live_after, "trace": trace,
                        "trace_error": None if trace_error is None else str(trace_error)})
        print(json.dumps(summary))
    else:
        _print_text(summary, pub.release_s, live_after, trace)
    if trace_error is not None:
        print(f"kvgrant alloc: error: the trace {trace} is incomplete: writing it failed: "
              f"{trace_error}", file=sys.stderr)
        return 1
    return 0
