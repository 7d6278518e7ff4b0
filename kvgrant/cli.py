"""The ``kvgrant`` command: plan, alloc, verify, conform, budget.

Each subcommand lives in ``kvgrant/commands/<name>.py`` with ``add_parser`` and
``run``; they are imported only when the CLI starts, so a missing optional piece
(Java for ``verify``) is reported by that subcommand, not at import.
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys
from typing import Sequence

from kvgrant.commands._args import exit_status
from kvgrant.errors import KVGrantError

__all__ = ["main"]

SUBCOMMANDS = ("plan", "alloc", "verify", "conform", "budget")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="kvgrant",
        description="Allocate a multi-GPU KV cache through CUDA VMM in few driver objects.")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for name in SUBCOMMANDS:
        module = importlib.import_module(f"kvgrant.commands.{name}")
        module.add_parser(sub)
    return parser


def one_blas_thread() -> None:
    """Ask numpy's OpenBLAS for one thread, unless the user chose a number or numpy is
    already loaded (then the setting would come too late and is left alone).

    Why: OpenBLAS starts a spinning thread per core when numpy is imported, and kvgrant
    never calls BLAS. On a 16-core GPU host that was most of ``kvgrant plan``'s CPU
    (published-dcp8: 4.80 s user, 1.94 s with one thread; examples/small.json: 2.51 s
    and 0.64 s). The setting is inherited by the rank processes a command starts.
    The library (``import kvgrant``) never changes the environment of its host process.
    """
    if "numpy" not in sys.modules:
        os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")


def main(argv: Sequence[str] | None = None) -> int:
    one_blas_thread()
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return int(args.run(args))
    except KVGrantError as err:
        print(f"kvgrant {args.command}: error: {err}", file=sys.stderr)
        return exit_status(err)
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:  # e.g. `kvgrant conform T | head`: the reader went away
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 141  # as a shell reports SIGPIPE


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
