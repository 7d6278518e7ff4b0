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

from kvgrant.errors import ArgumentError, GeometryError, KVGrantError, ToolError, TraceError

from kvgrant.commands._args import (check_ledger_path, check_new_file_path, count,
                                    device_list, path_arg, positive_int, positive_seconds)
from kvgrant.commands._report import error_document, error_fields, report_error

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
    p.add_argument("geometry", type=path_arg, metavar="GEOMETRY", help="geometry JSON file")
    p.add_argument("--backend", choices=("auto", "cuda", "sim"), default="auto",
                   help="driver backend (default auto: cuda when a GPU is usable, else sim)")
    p.add_argument("--plan", type=path_arg, default="packed", metavar="LABEL|FILE",
                   help="physical plan: naive, reference, packed (default), or a plan file "
                        "written by kvgrant plan --json (reused as it is, not planned again)")
    # argparse reads "--memory-limit -1G" as a missing value; kvgrant.cli joins the two
    p.add_argument("--memory-limit", type=_memory_limit, default=None, metavar="SIZE",
                   help="use what is free (default, or -0G); -1G keeps 1 GiB free per GPU; "
                        "40G uses at most 40 GiB per GPU (--memory-limit -1G and "
                        "--memory-limit=-1G both work)")
    p.add_argument("--trace", type=path_arg, metavar="FILE", default=None,
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
    p.add_argument("--ledger", type=path_arg, default=None, metavar="PATH",
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
    p.add_argument("--sim-pool", type=path_arg, default=None, metavar="PATH",
                   help="sim backend only: a handle pool file shared with the sim drivers of "
                        "other processes (or set KVGRANT_SIM_POOL)")
    p.add_argument("--procs", type=positive_int, default=None, metavar="N",
                   help="one process per rank: start N worker processes (a gloo group), "
                        "each allocates its own rank, imports its peers' memory through "
                        "fds, and the group publishes or aborts together; under torchrun "
                        "this process is one of them (N = WORLD_SIZE); --trace names a folder")
    p.add_argument("--fail-rank", type=count, default=None, metavar="R",
                   help="with --procs and --fail-at: the rank whose process fails (default 0)")
    p.add_argument("--timeout", type=_group_timeout, default=None, metavar="S",
                   help="with --procs: how long a rank waits for the others before it "
                        "names them missing and the group aborts (default 120)")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.set_defaults(run=run)


def _error(args: argparse.Namespace, err: KVGrantError) -> int:
    """Report ``err`` (stderr; the error document with --json) and give its exit status."""
    return report_error("alloc", err, as_json=args.json)


def _budget(args: argparse.Namespace) -> "HandleBudget":
    from kvgrant.runtime.options import HandleBudget

    return HandleBudget(handles=args.handle_budget, reserve=args.handle_reserve,
                        preflight=not args.no_preflight, ledger=args.ledger)


def _driver_options(args: argparse.Namespace, faults: bool = True) -> dict[str, Any]:
    opts: dict[str, Any] = {}
    if faults and args.fail_at is not None:
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
    print(f"  published: {cap['pages']:,} KV pages{reduced} = {cap['kv_tokens']:,} KV tokens "
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
    from kvgrant.layout.geometry import load_geometry

    fail_rank = 0 if args.fail_rank is None else args.fail_rank
    plan: Any = args.plan
    try:
        _check_paths_and_options(args)
        g = load_geometry(args.geometry)
        if args.ranks is not None:
            g = _on_ranks(g, args.ranks)
        if g.topology.ranks != args.procs:
            raise ArgumentError(f"--procs = {args.procs}: the layout has topology.ranks = "
                                f"{g.topology.ranks} (one process per rank; use --ranks "
                                f"{args.procs} to run it on {args.procs} ranks)",
                                argument="procs", value=args.procs)
        if devices is not None and len(devices) != args.procs:
            # was: a short list left the last ranks on their rank numbers (two ranks on
            # one device), a long one was cut
            raise ArgumentError(f"--devices = {','.join(map(str, devices))}: with --procs "
                                f"{args.procs}, one distinct CUDA ordinal per rank "
                                f"({args.procs} of them, not {len(devices)})",
                                argument="devices", value=devices)
        if args.fail_rank is not None and args.fail_at is None:
            # was: ignored, the group ran without a fault (exit 0)
            raise ArgumentError(f"--fail-rank = {args.fail_rank}: only with --fail-at K (it "
                                "says which rank's K-th driver call fails)",
                                argument="fail-rank", value=args.fail_rank)
        if fail_rank >= args.procs:
            # was: the fault went to no process, and the group published (exit 0)
            raise ArgumentError(f"--fail-rank = {fail_rank}: must be a rank of the group, "
                                f"0..{args.procs - 1}", argument="fail-rank", value=fail_rank)
        trace_dir = _group_trace_dir(args.trace, args.procs, args.force)
        if plan not in _LABELS:
            # a plan file is read (and checked against the layout) here, once; every
            # worker gets the same plan (was: each worker refused it as a label)
            from kvgrant.layout.planfile import read_plan_file

            plan = read_plan_file(plan, g)
        try:
            from kvgrant.runtime import group_launch
        except ModuleNotFoundError as err:  # pragma: no cover - torch missing
            raise ToolError(f"--procs needs torch: pip install 'kvgrant[group]' ({err})"
                            ) from None
        if args.fail_at is not None and not group_launch.in_torchrun():
            _check_group_fail_at(args, g, plan, devices, fail_rank)
    except KVGrantError as err:
        return _error(args, err)
    spec: dict[str, Any] = {
        "geometry": g.model_dump(), "procs": args.procs, "plan": plan,
        "backend": args.backend, "memory_limit": args.memory_limit,
        "handle_budget": args.handle_budget, "handle_reserve": args.handle_reserve,
        "ledger": args.ledger, "preflight": not args.no_preflight, "trace_dir": trace_dir,
        "fail_at": args.fail_at, "fail_rank": fail_rank,
        "timeout_s": args.timeout or 120.0,
        "devices": {str(r): d for r, d in enumerate(devices)} if devices else None,
        "driver_options": _driver_options(args, faults=False)}
    if group_launch.in_torchrun():
        reports = [group_launch.run_under_torchrun(spec)]
    else:
        reports = group_launch.launch(spec)
    ok = all(r.get("ok") for r in reports)
    # every rank published and released: had the fault fired, rank fail_rank's start-up
    # or release would have failed (was: exit 0, as if the fault had been watched)
    unfired = ok and args.fail_at is not None
    first = None if ok else next(r for r in reports if not r.get("ok"))
    problem = None if first is None else f"rank {first['rank']}: {first.get('error')}"
    if unfired:
        problem = (f"--fail-at {args.fail_at}: the fault never fired: rank {fail_rank}'s "
                   "start-up and release made fewer driver calls (choose a smaller K)")
    if args.json:
        doc: dict[str, Any] = {"ok": ok and not unfired, "exit_status": 0,
                               "procs": args.procs, "mode": "group",
                               **({"fault_fired": False} if unfired else {}),
                               "ranks": reports}
        if problem is not None:  # the error document's fields, the ranks' reports kept
            kind = "KVGrantError" if first is None else str(first.get("kind"))
            doc = {**doc, **error_document(kind, problem, 1), "ranks": reports}
        print(json.dumps(doc))
    else:
        for r in reports:
            if r.get("ok"):
                cap, c = r["capacity"], r["counts"]
                print(f"kvgrant alloc: rank {r['rank']} (pid {r['pid']}, {r['backend']} device "
                      f"{r['device']}): published {cap['pages']:,} KV pages = "
                      f"{cap['kv_tokens']:,} KV tokens, {cap['snapshot_slots']} snapshot slots; "
                      f"imports from {r['imports_from']}; {c['objects']:,} driver objects, "
                      f"{c['grants']:,} grants; start-up {r['startup_s'] * 1e3:.1f} ms; "
                      "live after release: " + ("nothing" if not any(
                          r["live_after_release"].values()) else str(r["live_after_release"])))
    if problem is not None:
        print(f"kvgrant alloc: error: {problem}", file=sys.stderr)
        return 1
    return 0


def _on_ranks(g: Any, ranks: int) -> Any:
    """``--ranks N``: the layout on N ranks; a count it refuses is this option's bad
    value (was: reported as a GeometryError of the layout)."""
    from kvgrant.layout.geometry import on_ranks

    try:
        return on_ranks(g, ranks)
    except GeometryError as err:
        if err.field != "ranks":
            raise
        raise ArgumentError(f"--{err}", argument="ranks", value=ranks) from None


def _group_trace_dir(option: str | None, procs: int, force: bool) -> str | None:
    """With ``--procs``: the folder the ranks' traces go to (``rank<R>.ndjson`` each),
    ``--trace``'s, else ``KVGRANT_TRACE``'s; an existing file is refused (the error names
    which). Why the variable too: each worker read it as its own trace file, so every
    rank wrote the one path (a file that was not a trace was overwritten, and ``kvgrant
    conform`` then found rank 0's trace alone). A rank's file that exists and is not
    a trace is refused here, unless ``--force``, as a one-process ``--trace`` is."""
    from kvgrant.runtime.trace import TRACE_ENV, env_trace_path

    field, trace = ("--trace", option) if option else (TRACE_ENV, env_trace_path())
    if trace is not None and os.path.exists(trace) and not os.path.isdir(trace):
        raise ArgumentError(f"{field} = {trace!r}: with --procs, {field} names a folder "
                            "(one trace per rank); this is an existing file",
                            argument=field.lstrip("-"), value=trace)
    if trace is not None and not force:
        from kvgrant.runtime.arguments import refuse_overwriting

        for rank in range(procs):
            refuse_overwriting(field, os.path.join(trace, f"rank{rank}.ndjson"),
                               "pass --force to overwrite it")
    return trace


def _check_paths_and_options(args: argparse.Namespace) -> None:
    """The checks both the one-process and the ``--procs`` run make before any work:
    where the ledger and the sim pool go, that no output is an input, and the plan and
    backend options."""
    check_ledger_path(args.ledger)
    if args.sim_pool is not None:
        check_new_file_path("--sim-pool", args.sim_pool, "sim pool")
    _check_outputs_spare_inputs(args)
    _check_plan_and_backend_options(args)


def _check_plan_and_backend_options(args: argparse.Namespace) -> None:
    """``--plan`` that is neither a label nor an existing file, and sim-only options with
    ``--backend cuda`` (they were dropped without a word), are bad input."""
    if args.plan not in _LABELS and not os.path.exists(args.plan):
        raise ArgumentError(f"--plan = {args.plan!r}: not a plan label ({', '.join(_LABELS)}) "
                            "and no such file (a plan file is written by kvgrant plan --json)",
                            argument="plan", value=args.plan)
    if args.backend == "cuda":
        for flag, value in (("--sim-handle-budget", args.sim_handle_budget),
                            ("--sim-pool", args.sim_pool)):
            if value is not None:
                raise ArgumentError(f"{flag} = {value!r}: sim backend only, and --backend is "
                                    "cuda (the real host's budget is --handle-budget)",
                                    argument=flag.lstrip("-"), value=value)


def _check_outputs_spare_inputs(args: argparse.Namespace) -> None:
    """Refuse a file the command writes (trace, ledger, sim pool: an option or its
    environment variable) that is one of the files it reads (the geometry, a plan
    file), even with ``--force``: ``--ledger G.json`` once led to "repair it with
    kvgrant budget --repair", which replaced G.json by an empty ledger, and ``--trace
    PLAN.json --force`` overwrote the plan being read."""
    from kvgrant.runtime.arguments import same_file
    from kvgrant.runtime.hostpool import POOL_ENV
    from kvgrant.runtime.ledger import LEDGER_ENV
    from kvgrant.runtime.trace import TRACE_ENV

    inputs = [("the geometry file", args.geometry)]
    if args.plan not in _LABELS:
        inputs.append(("the plan file", args.plan))
    outputs = [("--trace", args.trace, TRACE_ENV, "trace"),
               ("--ledger", args.ledger, LEDGER_ENV, "ledger"),
               ("--sim-pool", args.sim_pool, POOL_ENV, "sim pool")]
    for option, value, env, what in outputs:
        field, path = (option, value) if value else (env, os.environ.get(env) or None)
        if not path:
            continue
        for name, source in inputs:
            if same_file(source, path):
                raise ArgumentError(f"{field} = {path!r}: is {name} {source!r}; the {what} "
                                    "would overwrite it", argument=field.lstrip("-"),
                                    value=path)


def _check_trace_target(geometry: str, option: str | None, force: bool) -> None:
    """Refuse a trace path that would destroy data: the geometry file itself (same
    inode), or an existing non-empty file that does not start with a trace header
    (unless ``--force``). ``kvgrant alloc G.json --trace G.json`` overwrote G.json.
    The path is ``--trace``'s, else ``KVGRANT_TRACE``'s (the errors name which)."""
    from kvgrant.runtime.arguments import refuse_fifo, refuse_overwriting, same_file
    from kvgrant.runtime.trace import TRACE_ENV, env_trace_path

    field, trace = ("--trace", option) if option else (TRACE_ENV, env_trace_path())
    if trace is None:
        return
    if same_file(geometry, trace):
        raise ArgumentError(f"{field} = {trace!r}: is the geometry file {geometry!r}; the "
                            "trace would overwrite it", argument=field.lstrip("-"),
                            value=trace)
    if os.path.isdir(trace):  # named as the option, not as the library's `trace`
        raise ArgumentError(f"{field} = {trace!r}: is a folder; the trace is one file (for "
                            "--procs, --trace DIR names a folder of rank files)",
                            argument=field.lstrip("-"), value=trace)
    refuse_fifo(field, trace)
    if not force:
        refuse_overwriting(field, trace, "pass --force to overwrite it")


def _release_failed(args: argparse.Namespace, pub: Any, err: KVGrantError) -> int:
    """A driver call of the shutdown failed (the other undos still ran): name each failed
    call with its rank, device, byte range and CUresult, and what is left live.
    Was: only the first error's own text, with no rank and no word of what was left."""
    from kvgrant.runtime.transaction import release_failure_text

    live = pub.driver.live().as_dict()
    text = release_failure_text(err, live)
    if args.json:
        print(json.dumps(error_document(type(err).__name__, text, 1, **error_fields(err),
                                        live_after_release=live)))
    print(f"kvgrant alloc: error: {text}", file=sys.stderr)
    return 1


def _check_fail_at(args: argparse.Namespace, geometry: Any, plan: Any,
                   devices: list[int] | None) -> None:
    """Refuse ``--fail-at K`` past the last driver call this plan makes, before anything
    is allocated (was: the run went ahead, published, released, and then said the fault
    never fired).

    The count is the allocator's: what :func:`~kvgrant.runtime.prepare.prepare` asks
    the driver (granularity and free memory of each device: the pages are fitted to
    what is free, so the plan and its allocations are known only then), counted by a
    prepare of its own on the same backend with no fault, no ledger and no trace,
    which creates nothing; then per rank a reserve, per allocation a create, per
    mapping (the plane's, and the alias of an aliased allocation) a map and a
    cuMemSetAccess; and in the release an unmap per mapping, a release per allocation
    and a free per rank (:class:`~kvgrant.runtime.engine.Engine`).

    Raises
    ------
    ArgumentError
        ``--fail-at = K: must be at most N (the driver calls this plan makes)``.
    """
    from kvgrant.runtime.options import Backend, HandleBudget
    from kvgrant.runtime.prepare import prepare
    from kvgrant.runtime.trace import TraceWriter

    prep = prepare(geometry, plan=plan, backend=Backend(args.backend,
                                                        _driver_options(args, faults=False)),
                   devices=devices, memory_limit=args.memory_limit,
                   budget=HandleBudget(handles=args.handle_budget, reserve=args.handle_reserve,
                                       preflight=not args.no_preflight, ledger=False),
                   trace=TraceWriter(None))
    before = sum(prep.driver.calls.values())
    ranks = len(prep.devices)
    allocs = len(prep.plan.allocations)
    mappings = allocs + sum(a.region is not None for a in prep.plan.allocations)
    prep.discard(KVGrantError("--fail-at: counting driver calls"))  # nothing to give back
    startup = ranks * (1 + allocs + 2 * mappings)
    release = ranks * (mappings + allocs + 1)
    last = before + startup + release
    if args.fail_at > last:
        raise ArgumentError(
            f"--fail-at = {args.fail_at}: must be at most {last} (the driver calls this plan "
            f"makes: {before} before the start-up, {startup} in it, {release} in the "
            "release)", argument="fail-at", value=args.fail_at)


def _group_rank_calls(g: Any, plan: Any, rank: int) -> tuple[int, int, int]:
    """(before, start-up, release): the driver calls the process of ``rank`` makes
    with this (fitted) geometry and plan (kvgrant.runtime.group).

    Before the start-up its own device's granularity and free memory; in the start-up
    a reserve, per allocation a create, per own mapping (the plane's, and the alias of
    an aliased allocation) a map and a cuMemSetAccess, per allocation an export when
    the rank has importers, and per owner it imports from, per allocation an import
    and per imported mapping (the plane's, and the alias of an ``access: importers``
    region) a map and a cuMemSetAccess; in the release an unmap per mapping, a
    release per allocation made or imported and one free of the reservation.
    ``rank_demand`` is the rank's mappings, own and imported (one grant each)."""
    from kvgrant.runtime.group import rank_demand

    allocs = len(plan.allocations)
    owners = sum(1 for o in range(g.topology.ranks) if o != rank and rank in g.importers(o))
    mappings = rank_demand(g, plan, rank)
    exports = allocs if g.importers(rank) else 0
    startup = 1 + allocs + exports + owners * allocs + 2 * mappings
    release = mappings + allocs * (1 + owners) + 1
    return 2, startup, release


def _check_group_fail_at(args: argparse.Namespace, g: Any, plan: Any,
                         devices: list[int] | None, fail_rank: int) -> None:
    """With ``--procs``, refuse ``--fail-at K`` past the last driver call of rank
    ``fail_rank``'s process, before any process starts (was: the group ran, published,
    released, and then the launcher said the fault never fired).

    The fault goes to that one process's driver and counts its calls only
    (runtime/group_launch.py ``worker_report``), so the count is that rank's
    (:func:`_group_rank_calls`) with the plan the group builds: the pages every rank
    fits to the tightest device (what each device has free, under --memory-limit),
    measured here as each worker measures it, on the same backend with no fault. The
    device of a rank is its --devices entry, else its rank number (the workers' default
    when LOCAL_RANK is unset).

    Not checked (the launcher's report after the run stays the net): under torchrun
    (the other ranks' devices may be on other hosts: this process cannot measure them),
    with LOCAL_RANK set (every worker would take that device), or when the measure
    fails or the run would refuse the layout anyway (granularity, too little memory, a
    plan file that does not fit): the run then reports its own error.

    Raises
    ------
    ArgumentError
        ``--fail-at = K: must be at most N (the driver calls of rank R's process ...)``.
    """
    from kvgrant.layout.geometry import parse_geometry
    from kvgrant.layout.plan import PhysicalPlan
    from kvgrant.runtime.capacity import fit_pages
    from kvgrant.runtime.group import group_backend, open_group_driver
    from kvgrant.runtime.prepare import resolve_plan

    n = g.topology.ranks
    if devices is None and "LOCAL_RANK" in os.environ:
        return
    devs = [devices[r] if devices and r < len(devices) else r for r in range(n)]
    driver = None
    try:  # the backend, options and sim host pool each worker opens (runtime/group.py)
        driver = open_group_driver(group_backend(args.backend, devs),
                                   _driver_options(args, faults=False), devs)
        if driver.device_count() <= max(devs):
            return
        free: dict[int, int] = {}
        for d in sorted(set(devs)):
            if g.granularity % driver.granularity(d):
                return
            free[d] = driver.free_memory(d)[0]
        fit = fit_pages(g, free, args.memory_limit)
        if fit.reduced:
            if isinstance(plan, PhysicalPlan):
                return
            g = parse_geometry(g.model_copy(update={"pages": fit.pages}).model_dump())
        the_plan = plan if isinstance(plan, PhysicalPlan) else resolve_plan(g, plan)
    except (KVGrantError, OSError):
        return
    finally:
        if driver is not None:
            try:
                driver.close()
            except KVGrantError:
                pass
    before, startup, release = _group_rank_calls(g, the_plan, fail_rank)
    last = before + startup + release
    if args.fail_at > last:
        raise ArgumentError(
            f"--fail-at = {args.fail_at}: must be at most {last} (the driver calls of rank "
            f"{fail_rank}'s process, which --fail-rank picks: {before} before the "
            f"start-up, {startup} in it, {release} in the release)",
            argument="fail-at", value=args.fail_at)


def _group_timeout(text: str) -> float:
    """``--timeout``: seconds > 0, at most what a rank takes (allocate_rank's limit, a
    week). Why: 10**7 s was taken here, the workers started, and each then refused it."""
    from kvgrant.runtime.group import MAX_TIMEOUT_S

    return positive_seconds(text, MAX_TIMEOUT_S)


def run(args: argparse.Namespace) -> int:
    from kvgrant.runtime.allocator import allocate
    from kvgrant.runtime.interrupts import DeferredInterrupt
    from kvgrant.runtime.options import Backend, TraceOptions

    devices = args.devices
    if args.procs is not None:
        return _run_group(args, devices)
    geometry: Any = args.geometry
    plan: Any = args.plan
    try:
        from kvgrant.runtime import group_launch

        if group_launch.in_torchrun() and os.environ.get("WORLD_SIZE", "1") != "1":
            # was: every torchrun worker allocated every rank (on CUDA: every GPU's share
            # from each process) and they all wrote one trace file
            raise ArgumentError(
                f"started by torchrun (WORLD_SIZE = {os.environ['WORLD_SIZE']}) without "
                "--procs: each worker would allocate every rank; pass --procs N (one "
                "process per rank, N = WORLD_SIZE), or run kvgrant alloc without torchrun",
                argument="procs", value=None)
        if args.fail_rank is not None:
            # was: silently ignored (one process runs every rank; --fail-at picks the call)
            raise ArgumentError(f"--fail-rank = {args.fail_rank}: only with --procs (one "
                                "process per rank); without it --fail-at K fails the K-th "
                                "driver call of the one process", argument="fail-rank",
                                value=args.fail_rank)
        if args.timeout is not None:
            # was: silently ignored (one process waits for no other rank)
            raise ArgumentError(f"--timeout = {args.timeout:g}: only with --procs (how long "
                                "a rank waits for the others); one process runs every rank "
                                "here", argument="timeout", value=args.timeout)
        _check_paths_and_options(args)
        _check_trace_target(args.geometry, args.trace, args.force)
        from kvgrant.layout.geometry import load_geometry

        if args.ranks is not None or plan not in _LABELS:
            geometry = load_geometry(args.geometry)
        if args.ranks is not None:
            geometry = _on_ranks(geometry, args.ranks)
        if plan not in _LABELS:
            from kvgrant.layout.planfile import read_plan_file

            plan = read_plan_file(plan, geometry)
        if args.fail_at is not None:
            _check_fail_at(args, geometry, plan, devices)
        pub = allocate(geometry, plan=plan,
                       backend=Backend(args.backend, _driver_options(args)),
                       devices=devices, memory_limit=args.memory_limit,
                       budget=_budget(args),
                       # the command goes on to its release and reports a lost trace
                       # after it (exit 1), with the summary and what is left live
                       # overwrite: _check_trace_target applied the rule already,
                       # naming --trace / KVGRANT_TRACE and --force
                       trace=TraceOptions(args.trace, errors="continue", overwrite=True))
    except KVGrantError as err:
        return _error(args, err)
    hold = DeferredInterrupt()
    try:
        # a Ctrl-C from here on waits for the release to finish (was: KeyboardInterrupt
        # between two undos of the release left the cache half released)
        with hold:
            summary = pub.summary()
            trace = str(pub.trace_path) if pub.trace_path else None
            try:
                pub.release()
            except KVGrantError as err:
                # a Ctrl-C held back meanwhile is dropped: the command ends here anyway,
                # and the failed release (exit 1) is what the user must see
                return _release_failed(args, pub, err)
    except KeyboardInterrupt:
        # before the hold was armed (nothing released yet): release, then stop; a second
        # Ctrl-C during the release stops at once (a hung driver call stays interruptible)
        if not pub.released:
            with DeferredInterrupt():
                pub.release()
        raise
    if hold.pending:  # released; the Ctrl-C stops the command now (exit 130)
        raise KeyboardInterrupt
    live_after = pub.driver.live().as_dict()
    trace_error = pub.trace_error
    problem: tuple[str, str] | None = None  # (error kind, message)
    if trace_error is not None:
        why = str(trace_error).removeprefix("writing the trace failed: ")  # said once
        problem = (TraceError.__name__, f"the trace {trace} is incomplete: writing it "
                                        f"failed: {why}")
    # the fault never fired: had it, the start-up or the release would have failed (the
    # count checked up front was the plan's; this is the net should the run differ)
    unfired = args.fail_at is not None
    if unfired and problem is None:
        calls = sum(pub.driver.calls.values())
        problem = (KVGrantError.__name__, f"--fail-at {args.fail_at}: the fault never "
                   f"fired: the start-up and release made {calls} driver calls (choose K "
                   f"in 1..{calls})")
    if args.json:
        summary.update({"ok": problem is None, "exit_status": 0,
                        "fault_fired": False if unfired else None,
                        "release_s": round(pub.release_s or 0.0, 6),
                        "live_after_release": live_after, "trace": trace,
                        "trace_error": None if trace_error is None else str(trace_error)})
        if problem is not None:
            summary.update(error_document(problem[0], problem[1], 1))
        print(json.dumps(summary))
    else:
        _print_text(summary, pub.release_s, live_after, trace)
    if problem is not None:
        print(f"kvgrant alloc: error: {problem[1]}", file=sys.stderr)
        return 1
    return 0
