"""``kvgrant alloc GEOMETRY``: allocate the cache on every rank, print it, release it.

The README's main job. Allocation is one transaction over all ranks (one process,
one GPU per rank), after its driver-handle demand was reserved in the host ledger (the
budget is one pool per host; ``kvgrant budget`` lists who holds it): it publishes
capacities only when every rank succeeded and
otherwise unwinds everything and exits non-zero with the error (call, rank, device,
plane/region, byte range, CUresult, live counts, free memory). ``--fail-at K`` makes
the K-th driver call fail, to watch the unwinding; ``--trace FILE`` (or
``KVGRANT_TRACE``) records every transition for ``kvgrant conform``.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from typing import TYPE_CHECKING, Any

from kvgrant.errors import (AllocationError, ArgumentError, GeometryError, HandleBudgetError,
                            KVGrantError, PlanFileError)

from kvgrant.commands._args import count, device_list, exit_status, positive_int, positive_seconds

if TYPE_CHECKING:
    from kvgrant.runtime.options import HandleBudget

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
                   help="write the transition trace (NDJSON) here (or set KVGRANT_TRACE); "
                        "an existing file that is not a trace is kept unless --force")
    p.add_argument("--force", action="store_true",
                   help="let --trace overwrite an existing file that is not a trace")
    p.add_argument("--fail-at", type=positive_int, default=None, metavar="K",
                   help="inject CUDA_ERROR_OUT_OF_MEMORY at the K-th driver call (1-based)")
    p.add_argument("--handle-budget", type=count, default=None, metavar="N",
                   help="the host's driver-handle budget, one pool for every process and GPU "
                        "(default 523,880, measured on H200 / driver 580; "
                        "tools/measure_handle_budget.py measures yours)")
    p.add_argument("--handle-reserve", type=count, default=None, metavar="N",
                   help="handles kept for users kvgrant cannot see (NCCL, PyTorch, other "
                        "engines; default 4,096)")
    p.add_argument("--ledger", default=None, metavar="PATH",
                   help="host ledger file (default KVGRANT_LEDGER or "
                        "/dev/shm/kvgrant-ledger.json; used by the sim backend only when given)")
    p.add_argument("--no-preflight", action="store_true",
                   help="skip the handle-budget pre-flight and the ledger's refusal (the lease "
                        "is still recorded; reproduces the field failure)")
    p.add_argument("--ranks", type=positive_int, default=None, metavar="N",
                   help="run the layout on N ranks that all import each other (e.g. a "
                        "16-rank published layout on the 2 GPUs a test host has)")
    p.add_argument("--devices", type=device_list, default=None, metavar="LIST",
                   help="comma-separated CUDA ordinal of each rank (default 0..ranks-1)")
    p.add_argument("--sim-handle-budget", type=count, default=None, metavar="N",
                   help="sim backend only: the simulated host's handle budget")
    p.add_argument("--sim-pool", default=None, metavar="PATH",
                   help="sim backend only: a handle pool file shared with the sim drivers of "
                        "other processes (or set KVGRANT_SIM_POOL)")
    p.add_argument("--procs", type=positive_int, default=None, metavar="N",
                   help="one process per rank: start N worker processes (a gloo group), "
                        "each allocates its own rank, imports its peers' memory through "
                        "fds, and the group publishes or aborts together; under torchrun "
                        "this process is one of them (N = WORLD_SIZE); --trace names a folder")
    p.add_argument("--fail-rank", type=count, default=None, metavar="R",
                   help="with --procs and --fail-at: the rank whose process fails (default 0)")
    p.add_argument("--timeout", type=positive_seconds, default=None, metavar="S",
                   help="with --procs: how long a rank waits for the others before it "
                        "names them missing and the group aborts (default 120)")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.set_defaults(run=run)


def _json_value(value: object) -> object:
    """``value`` when JSON holds it in at most 200 characters, else a short repr (an
    error's offending value may be a whole plan file's allocation list)."""
    try:
        if len(json.dumps(value)) <= 200:
            return value
    except (TypeError, ValueError):
        pass
    return repr(value)[:200]


def _budget(args: argparse.Namespace) -> "HandleBudget":
    from kvgrant.runtime.options import HandleBudget

    return HandleBudget(handles=args.handle_budget, reserve=args.handle_reserve,
                        preflight=not args.no_preflight, ledger=args.ledger)


def _driver_options(args: argparse.Namespace) -> dict[str, Any]:
    opts: dict[str, Any] = {}
    if args.fail_at is not None:
        from kvgrant.runtime.faults import Fault

        opts["faults"] = [Fault(nth=args.fail_at)]
    if args.sim_handle_budget is not None:
        opts["handle_budget"] = args.sim_handle_budget
    if args.sim_pool is not None:
        opts["host_pool"] = args.sim_pool
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


def _run_group(args: argparse.Namespace, devices: list[int] | None) -> int:
    """``--procs N``: one process per rank (kvgrant.runtime.group)."""
    from kvgrant.layout.geometry import load_geometry, on_ranks

    try:
        g = load_geometry(args.geometry)
        if args.ranks is not None:
            g = on_ranks(g, args.ranks)
    except KVGrantError as err:
        print(f"kvgrant alloc: error: {err}", file=sys.stderr)
        return exit_status(err)
    if g.topology.ranks != args.procs:
        print(f"kvgrant alloc: error: --procs = {args.procs}: the layout has "
              f"topology.ranks = {g.topology.ranks} (one process per rank; use --ranks "
              f"{args.procs} to run it on {args.procs} ranks)", file=sys.stderr)
        return 2
    fail_rank = 0 if args.fail_rank is None else args.fail_rank
    if fail_rank >= args.procs:
        # was: the fault went to no process, and the group published (exit 0)
        print(f"kvgrant alloc: error: --fail-rank = {fail_rank}: must be a rank of the "
              f"group, 0..{args.procs - 1}", file=sys.stderr)
        return 2
    plan: Any = args.plan
    try:
        if args.trace is not None and os.path.exists(args.trace) \
                and not os.path.isdir(args.trace):
            raise ArgumentError(f"--trace = {args.trace!r}: with --procs, --trace names a "
                                "folder (one trace per rank); this is an existing file",
                                argument="trace", value=args.trace)
        if plan not in _LABELS:
            # a plan file is read (and checked against the layout) here, once; every
            # worker gets the same plan (was: each worker refused it as a label)
            from kvgrant.layout.planfile import read_plan_file

            plan = read_plan_file(plan, g)
    except KVGrantError as err:
        print(f"kvgrant alloc: error: {err}", file=sys.stderr)
        return exit_status(err)
    try:
        from kvgrant.runtime import group_launch
    except ModuleNotFoundError as err:  # pragma: no cover - torch missing
        print(f"kvgrant alloc: error: --procs needs torch: pip install 'kvgrant[group]' "
              f"({err})", file=sys.stderr)
        return 2
    spec: dict[str, Any] = {
        "geometry": g.model_dump(), "procs": args.procs, "plan": plan,
        "backend": args.backend, "memory_limit": args.memory_limit,
        "handle_budget": args.handle_budget, "handle_reserve": args.handle_reserve,
        "ledger": args.ledger, "preflight": not args.no_preflight, "trace_dir": args.trace, "fail_at": args.fail_at, "fail_rank": fail_rank,
        "timeout_s": args.timeout or 120.0,
        "devices": {str(r): d for r, d in enumerate(devices)} if devices else None,
        "driver_options": {**({"handle_budget": args.sim_handle_budget}
                              if args.sim_handle_budget is not None else {}),
                           **({"host_pool": args.sim_pool} if args.sim_pool else {})}}
    if group_launch.in_torchrun():
        reports = [group_launch.run_under_torchrun(spec)]
    else:
        reports = group_launch.launch(spec)
    ok = all(r.get("ok") for r in reports)
    # every rank published and released: had the fault fired, rank fail_rank's start-up
    # or release would have failed (was: exit 0, as if the fault had been watched)
    unfired = ok and args.fail_at is not None
    if args.json:
        print(json.dumps({"ok": ok and not unfired, "procs": args.procs, "mode": "group",
                          **({"fault_fired": False} if unfired else {}),
                          "ranks": reports}))
    else:
        for r in reports:
            if r.get("ok"):
                cap, c = r["capacity"], r["counts"]
                print(f"kvgrant alloc: rank {r['rank']} (pid {r['pid']}, {r['backend']} device "
                      f"{r['device']}): published {cap['pages']} KV pages = "
                      f"{cap['kv_tokens']:,} KV tokens, {cap['snapshot_slots']} snapshot slots; "
                      f"imports from {r['imports_from']}; {c['objects']:,} driver objects, "
                      f"{c['grants']:,} grants; start-up {r['startup_s'] * 1e3:.1f} ms; "
                      "live after release: " + ("nothing" if not any(
                          r["live_after_release"].values()) else str(r["live_after_release"])))
    if not ok:
        first = next(r for r in reports if not r.get("ok"))
        print(f"kvgrant alloc: error: rank {first['rank']}: {first.get('error')}",
              file=sys.stderr)
        return 1
    if unfired:
        print(f"kvgrant alloc: error: --fail-at {args.fail_at}: the fault never fired: rank "
              f"{fail_rank}'s start-up and release made fewer driver calls (choose a "
              "smaller K)", file=sys.stderr)
        return 1
    return 0


def _check_trace_target(geometry: str, trace: str | None, force: bool) -> None:
    """Refuse a trace path that would destroy data: the geometry file itself (same
    inode), or an existing non-empty file that does not start with a trace header
    (unless ``--force``). ``kvgrant alloc G.json --trace G.json`` overwrote G.json."""
    from kvgrant.runtime.arguments import same_file

    if trace is None:
        return
    if same_file(geometry, trace):
        raise ArgumentError(f"--trace = {trace!r}: is the geometry file {geometry!r}; the "
                            "trace would overwrite it", argument="trace", value=trace)
    if force or not os.path.isfile(trace) or os.path.getsize(trace) == 0:
        return
    try:
        with open(trace, "rb") as fh:
            first = fh.readline(1 << 16)
        is_trace = json.loads(first).get("kind") == "header"
    except (OSError, ValueError, AttributeError, RecursionError):
        is_trace = False
    if not is_trace:
        raise ArgumentError(f"--trace = {trace!r}: exists and is not a kvgrant trace; "
                            "refusing to overwrite it (pass --force to overwrite)",
                            argument="trace", value=trace)


def _release_failed(args: argparse.Namespace, pub: Any, err: KVGrantError) -> int:
    """A driver call of the shutdown failed (the other undos still ran): name each failed
    call with its rank, device, byte range and CUresult, and what is left live.
    Was: only the first error's own text, with no rank and no word of what was left."""
    from kvgrant.errors import DriverError

    errors = [err, *(getattr(err, "cleanup_errors", None) or [])]
    devices = list(pub.devices)

    def describe(e: BaseException) -> str:
        if not isinstance(e, DriverError):
            return f"{type(e).__name__}: {e}"
        rank = devices.index(e.device) if e.device in devices else "?"
        where = "" if e.va is None else \
            f", va 0x{e.va:x}+0x{e.size or 0:x}"
        return (f"{e.call} failed with {e.result_name} on rank {rank} (device {e.device}"
                f"{where}): {e}")

    live = pub.driver.live().as_dict()
    left = ", ".join(f"{k}={v}" for k, v in live.items() if v) or "nothing"
    text = (f"release failed: {len(errors)} undo step(s) failed, the others ran: "
            + "; ".join(describe(e) for e in errors[:5])
            + (f"; and {len(errors) - 5} more" if len(errors) > 5 else "")
            + f"; left live after release: {left}")
    if args.json:
        print(json.dumps({"ok": False, "kind": type(err).__name__, "error": text,
                          "live_after_release": live}))
    print(f"kvgrant alloc: error: {text}", file=sys.stderr)
    return 1


def run(args: argparse.Namespace) -> int:
    from kvgrant.runtime.allocator import allocate
    from kvgrant.runtime.options import Backend
    from kvgrant.runtime.trace import TRACE_ENV

    devices = args.devices
    if args.procs is not None:
        return _run_group(args, devices)
    if args.fail_rank is not None:
        # was: silently ignored (one process runs every rank; --fail-at picks the call)
        print(f"kvgrant alloc: error: --fail-rank = {args.fail_rank}: only with --procs "
              "(one process per rank); without it --fail-at K fails the K-th driver call "
              "of the one process", file=sys.stderr)
        return 2
    geometry: Any = args.geometry
    plan: Any = args.plan
    try:
        _check_trace_target(args.geometry, args.trace or os.environ.get(TRACE_ENV) or None,
                            args.force)
        from kvgrant.layout.geometry import load_geometry, on_ranks

        if args.ranks is not None or plan not in _LABELS:
            geometry = load_geometry(args.geometry)
        if args.ranks is not None:
            geometry = on_ranks(geometry, args.ranks)
        if plan not in _LABELS:
            from kvgrant.layout.planfile import read_plan_file

            plan = read_plan_file(plan, geometry)
        pub = allocate(geometry, plan=plan,
                       backend=Backend(args.backend, _driver_options(args)),
                       devices=devices, memory_limit=args.memory_limit,
                       budget=_budget(args), trace=args.trace)
    except KVGrantError as err:
        if args.json:
            out: dict[str, object] = {"ok": False, "kind": type(err).__name__,
                                      "error": str(err)}
            if isinstance(err, (GeometryError, PlanFileError)):  # bad input: where
                out.update({"field": err.field, "value": _json_value(err.value)})
            if isinstance(err, HandleBudgetError):
                out.update({"demand": err.demand, "budget": err.budget,
                            "reserve": err.reserve, "held": err.held,
                            "holders": err.holders})
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
    try:
        pub.release()
    except KVGrantError as err:
        return _release_failed(args, pub, err)
    live_after = pub.driver.live().as_dict()
    trace_error = pub.trace_error
    # the fault never fired: had it, the start-up or the release would have failed
    unfired = args.fail_at is not None
    if args.json:
        summary.update({"ok": trace_error is None and not unfired,
                        "fault_fired": False if unfired else None,
                        "release_s": round(pub.release_s or 0.0, 6),
                        "live_after_release": live_after, "trace": trace,
                        "trace_error": None if trace_error is None else str(trace_error)})
        print(json.dumps(summary))
    else:
        _print_text(summary, pub.release_s, live_after, trace)
    if trace_error is not None:
        print(f"kvgrant alloc: error: the trace {trace} is incomplete: writing it failed: "
              f"{trace_error}", file=sys.stderr)
        return 1
    if unfired:
        calls = sum(pub.driver.calls.values())
        print(f"kvgrant alloc: error: --fail-at {args.fail_at}: the fault never fired: the "
              f"start-up and release made {calls} driver calls (choose K in 1..{calls})",
              file=sys.stderr)
        return 1
    return 0
