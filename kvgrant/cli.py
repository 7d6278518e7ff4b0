"""The ``kvgrant`` command: plan, alloc, verify, conform, budget.

Each subcommand lives in ``kvgrant/commands/<name>.py`` with ``add_parser`` and
``run``; they are imported only when the CLI starts, so a missing optional piece
(Java for ``verify``) is reported by that subcommand, not at import.
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import re
import sys
from functools import partial
from typing import NoReturn, Sequence

from kvgrant import __version__
from kvgrant.commands._report import error_document, report_error
from kvgrant.errors import KVGrantError

__all__ = ["main"]

SUBCOMMANDS = ("plan", "alloc", "verify", "conform", "budget")


class _Parser(argparse.ArgumentParser):
    """argparse's parser, whose usage errors (exit 2) also print the ``--json`` error
    document on stdout when the command line asks for ``--json``.

    Why: argparse reports them before ``args.json`` exists, so ``kvgrant alloc G --json
    --fail-at=0`` printed nothing on stdout while every other refusal printed a
    document. Subcommand parsers are made with the same class and setting."""

    def __init__(self, *args: object, json_errors: bool = False, **kwargs: object) -> None:
        super().__init__(*args, **kwargs)  # type: ignore[arg-type]
        self.json_errors = json_errors

    def error(self, message: str) -> NoReturn:
        if self.json_errors:
            print(json.dumps(error_document("ArgumentError", message, 2,
                                            **usage_error_fields(message))), flush=True)
        super().error(message)  # usage and message on stderr, exit 2


def usage_error_fields(message: str) -> dict[str, str]:
    """``argument`` (the option, without dashes, as a kvgrant ArgumentError names it)
    and, where the message quotes it, ``value`` of an argparse usage error
    (``argument --ranks: 'abc': not an integer ...``). Why: every other ``--json``
    error document of a bad argument has them (review 2026-12-07)."""
    said = re.match(r"argument ([^:]+): (.*)", message, re.S)
    if said is None:
        return {}
    out = {"argument": said.group(1).split("/")[0].lstrip("-")}
    quoted = re.match(r"(?:invalid choice: )?'((?:[^'\\]|\\.)*)'", said.group(2))
    if quoted is not None:
        out["value"] = quoted.group(1)
    return out


def asks_for_json(argv: Sequence[str]) -> bool:
    """Whether ``--json`` (or an abbreviation argparse accepts, ``--js``) is among the
    options, before any ``--`` (after it every token is an operand)."""
    for token in argv:
        if token == "--":
            return False
        if len(token) >= 3 and "--json".startswith(token):
            return True
    return False


def build_parser(json_errors: bool = False) -> argparse.ArgumentParser:
    parser = _Parser(
        prog="kvgrant", json_errors=json_errors,
        description="Allocate a multi-GPU KV cache through CUDA VMM in few driver objects.")
    parser.add_argument("--version", action="version", version=f"kvgrant {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True,
                                parser_class=partial(_Parser, json_errors=json_errors))
    for name in SUBCOMMANDS:
        module = importlib.import_module(f"kvgrant.commands.{name}")
        module.add_parser(sub)
    return parser


#: Options whose value may start with "-" (``--memory-limit -1G``: all but 1 GiB).
_SIGNED_VALUE_OPTIONS = ("--memory-limit",)


def _negative_values_joined(argv: list[str]) -> list[str]:
    """``--memory-limit -1G`` as ``--memory-limit=-1G``. Why: argparse reads a value
    that starts with "-" and is not a plain number as the next option, and said only
    "expected one argument" to the form users type first."""
    out: list[str] = []
    i = 0
    while i < len(argv):
        tok = argv[i]
        if tok == "--":
            return out + argv[i:]
        if (tok in _SIGNED_VALUE_OPTIONS and i + 1 < len(argv)
                and len(argv[i + 1]) > 1 and argv[i + 1][0] == "-"
                and (argv[i + 1][1].isdigit() or argv[i + 1][1] == ".")):
            out.append(f"{tok}={argv[i + 1]}")
            i += 2
            continue
        out.append(tok)
        i += 1
    return out


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


#: The exit status of a command stopped by Ctrl-C (SIGINT), as a shell reports it.
_INTERRUPTED_STATUS = 130


def _interrupted(command: str | None, as_json: bool, err: BaseException) -> int:
    """Ctrl-C (SIGINT) stopped the command: with ``--json`` the error document on
    stdout (``kind`` ``Interrupted``, ``exit_status`` 130, ``signal``); stderr stays as
    it was (nothing: the terminal shows the ``^C``) unless an undo of the unwinding
    failed, which is named there and in the document (``cleanup_errors``). Returns 130.

    Why: a script reading ``--json`` got no document at all (empty stdout, exit 130),
    unlike every other way a command ends. What the command had made is unwound before
    this runs (the allocator and the group runtime unwind at the next allocation
    boundary; ``kvgrant alloc`` holds the Ctrl-C back during its release)."""
    text = "interrupted (Ctrl-C, SIGINT) before the command finished"
    failed = (getattr(err, "cleanup_errors", None)  # the group's: on the cause
              or getattr(err.__cause__, "cleanup_errors", None) or [])
    undos = [f"{type(e).__name__}: {e}" for e in failed]
    if undos:
        text += (f"; unwinding then failed: {len(undos)} undo step(s) failed: "
                 + "; ".join(undos[:5]) + (f"; and {len(undos) - 5} more"
                                           if len(undos) > 5 else ""))
    if as_json:
        doc = error_document("Interrupted", text, _INTERRUPTED_STATUS, signal="SIGINT",
                             **({"cleanup_errors": undos[:100]} if undos else {}))
        try:
            print(json.dumps(doc), flush=True)
        except BrokenPipeError:  # the reader went away too
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
    if undos:
        who = f"kvgrant {command}" if command else "kvgrant"
        print(f"{who}: error: {text}", file=sys.stderr)
    return _INTERRUPTED_STATUS


def main(argv: Sequence[str] | None = None) -> int:
    one_blas_thread()
    argv = _negative_values_joined(sys.argv[1:] if argv is None else list(argv))
    args: argparse.Namespace | None = None
    try:
        # inside: a Ctrl-C while the subcommands are imported is an interruption too
        parser = build_parser(json_errors=asks_for_json(argv))
        args = parser.parse_args(argv)
        try:
            return int(args.run(args))
        except KVGrantError as err:  # with --json also the error document on stdout
            return report_error(args.command, err, as_json=bool(getattr(args, "json", False)))
    except KeyboardInterrupt as err:
        if args is None:
            return _interrupted(None, asks_for_json(argv), err)
        return _interrupted(args.command, bool(getattr(args, "json", False)), err)
    except BrokenPipeError:  # e.g. `kvgrant conform T | head`: the reader went away
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 141  # as a shell reports SIGPIPE


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
