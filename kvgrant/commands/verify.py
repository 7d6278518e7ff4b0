"""``kvgrant verify``: model-check every ``MC*.cfg`` under ``specs/`` with TLC.

Prints one row per config (spec, config, distinct states, depth, result,
seconds) as each run finishes, or a JSON list with ``--json``; exits 1 when
any check fails.  ``--mutants`` also runs the spec mutants of
:mod:`kvgrant.conformance.spec_mutants` (lifecycle: guard removals and operator
changes, checked against invariants, action and liveness properties; group: guard
removals), each of which must be caught by the property it names.

The configs are every ``MC*.cfg`` of the folder (``discover_models``), so a new
config such as ``MCKVLifecycle_Rich.cfg`` is found without registering it here; the
wheel ships them as ``kvgrant.specs`` package data (``*.cfg``).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path
from typing import Any, TextIO

from kvgrant.commands._args import path_arg, positive_int, positive_seconds
from kvgrant.conformance.spec_mutants import (GROUP_MUTANTS, MUTANTS, caught,
                                              run_group_mutant, run_mutant)
from kvgrant.conformance.tlc import MAX_WORKERS, TLCResult, check_workers, discover_models, run_tlc
from kvgrant.errors import ToolError
from kvgrant.specfiles import SPECS_ENV, specs_dir

__all__ = ["add_parser", "default_specdir", "run", "verify_specs"]

_COLUMNS = ("spec", "config", "distinct states", "depth", "result", "seconds")
_WIDTHS = (18, 28, 15, 5, 40, 7)


def add_parser(subparsers: Any) -> None:
    p = subparsers.add_parser(
        "verify", help="model-check the lifecycle specs with TLC",
        description="Run TLC on every MC*.cfg under SPECDIR and print a table; "
                    "exit 1 when any check fails.")
    p.add_argument("specdir", type=path_arg, nargs="?", default=None, metavar="SPECDIR",
                   help="folder of specs (default: the specs kvgrant ships; KVGRANT_SPECS)")
    p.add_argument("--json", action="store_true", help="print a JSON list instead of a table")
    p.add_argument("--timeout", type=positive_seconds, default=600.0, metavar="S",
                   help="seconds allowed per config (default 600)")
    p.add_argument("--workers", type=_workers, default=min(os.cpu_count() or 1, MAX_WORKERS),
                   metavar="N", help=f"TLC worker threads, 1..{MAX_WORKERS:,} (default: CPU "
                                     "count)")
    p.add_argument("--mutants", action="store_true",
                   help="also check that each spec mutant (guard removal or operator "
                        "change) is caught")
    p.set_defaults(run=run)


def _workers(text: str) -> int:
    """``--workers``: an integer in 1..MAX_WORKERS (was: any count; 1,000,000,000 ran
    TLC until its timeout and exited 1, as if a check had failed)."""
    value = positive_int(text)
    if value > MAX_WORKERS:
        raise argparse.ArgumentTypeError(f"{value:,}: must be at most {MAX_WORKERS:,} (TLC "
                                         "starts one thread per worker)")
    return value


def default_specdir() -> Path:
    """The specs kvgrant ships (``KVGRANT_SPECS`` overrides; see kvgrant.specfiles)."""
    return specs_dir()


def verify_specs(specdir: str | Path, *, timeout: float | None = 600.0, workers: int = 1,
                 out: TextIO | None = None) -> list[TLCResult]:
    """Run TLC on every model config of ``specdir``; rows go to ``out`` as they finish.

    Raises
    ------
    ToolError
        When the folder has no ``MC*.cfg``, or Java/TLC is missing.
    ArgumentError
        When ``workers`` is not an integer in 1..MAX_WORKERS.
    """
    check_workers(workers)
    models = discover_models(specdir)
    if not models:
        raise ToolError(f"no model-checking configs (MC*.cfg) in {specdir}")
    results = []
    for spec, cfg in models:
        result = run_tlc(spec, cfg, workers=workers, timeout=timeout)
        results.append(result)
        if out is not None:
            _print_row(out, _row(result))
    return results


def _result_text(result: TLCResult) -> str:
    if result.ok:
        return "ok"
    detail = result.violated or (result.message.splitlines() or [""])[0]
    return f"{result.status}: {detail}" if detail else result.status


def _row(result: TLCResult) -> tuple[str, ...]:
    return (Path(result.spec).name, Path(result.config).name,
            "-" if result.distinct is None else f"{result.distinct:,}",
            "-" if result.depth is None else str(result.depth),
            _result_text(result), f"{result.seconds:.1f}")


def _print_row(out: TextIO, cells: tuple[str, ...]) -> None:
    out.write("  ".join(c.ljust(w) if i < len(cells) - 1 else c.rjust(w)
                        for i, (c, w) in enumerate(zip(cells, _WIDTHS))).rstrip() + "\n")
    out.flush()


def run(args: argparse.Namespace) -> int:
    from kvgrant.conformance.tlc import exit_on_signals

    specdir = Path(args.specdir) if args.specdir else default_specdir()
    # the field the folder came from: the argument, or the environment (was: SPECDIR
    # for a KVGRANT_SPECS the user never typed on the command line)
    field = "SPECDIR" if args.specdir or not os.environ.get(SPECS_ENV) else SPECS_ENV
    if specdir.is_file():
        hint = (" (a trace: check it with `kvgrant conform FILE`)"
                if specdir.suffix in (".ndjson", ".jsonl", ".json") else "")
        raise ToolError(f"{field} = {str(specdir)!r} is a file: kvgrant verify takes a folder "
                        f"of TLA+ specs with MC*.cfg configs{hint}")
    if not specdir.is_dir():
        # was: "does not exist" for /dev/null too
        rule = "is not a folder" if specdir.exists() else "does not exist"
        raise ToolError(f"{field} = {str(specdir)!r} {rule}: kvgrant verify takes a folder "
                        "of TLA+ specs with MC*.cfg configs")
    # TLC's process group and temp folders go on SIGTERM/SIGHUP/SIGINT too (issue #16).
    with exit_on_signals():
        return _run(args, specdir)


def _run(args: argparse.Namespace, specdir: Path) -> int:
    if not discover_models(specdir):  # before the table's header (was: header, then error)
        raise ToolError(f"no model-checking configs (MC*.cfg) in {specdir}")
    table = None if args.json else sys.stdout
    if table is not None:
        _print_row(table, _COLUMNS)
    results = verify_specs(specdir, timeout=args.timeout, workers=args.workers, out=table)
    rows: list[dict[str, Any]] = [r.summary() for r in results]
    failed = sum(not r.ok for r in results)
    if args.mutants:
        runs = [(m, run_mutant) for m in MUTANTS] + [(m, run_group_mutant) for m in GROUP_MUTANTS]
        for mutant, run_one in runs:
            res = run_one(mutant, specdir, timeout=args.timeout, workers=args.workers)
            ok = caught(mutant, res)
            failed += not ok
            summary = res.summary() | {"mutant": mutant.guard, "kind": mutant.kind,
                                       "expected": mutant.invariant, "caught": ok}
            rows.append(summary)
            if table is not None:
                verdict = (f"caught: {mutant.invariant}" if ok
                           else f"NOT CAUGHT ({_result_text(res)})")
                _print_row(table, ("mutant", mutant.guard,
                                   "-" if res.distinct is None else f"{res.distinct:,}",
                                   "-" if res.depth is None else str(res.depth),
                                   verdict, f"{res.seconds:.1f}"))
    if args.json:
        json.dump(rows, sys.stdout, indent=2)
        sys.stdout.write("\n")
    else:
        total = sum(r["seconds"] for r in rows)
        print(f"{len(rows) - failed} of {len(rows)} checks passed in {total:.1f} s")
    return 1 if failed else 0
