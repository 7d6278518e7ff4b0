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


def main(argv: Sequence[str] | None = None) -> int:
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
