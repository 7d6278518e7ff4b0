"""Argument types shared by the subcommands."""

from __future__ import annotations

import argparse
import os
import re

from kvgrant.errors import (ArgumentError, GeometryError, KVGrantError, PlanFileError, ToolError,
                            TraceError)

__all__ = ["MAX_COUNT", "check_ledger_path", "check_new_file_path", "count", "device_list",
           "exit_status", "path_arg", "positive_int", "positive_seconds"]

#: Largest integer option accepted (no count kvgrant takes comes near it).
MAX_COUNT = 10**15
# ASCII digits only (int() also reads full-width digits); a separator only between
# groups of three, so 523_880 and 523,880 read as before but 1,0 and 1_0 are refused.
_COUNT = re.compile(r"[0-9]+|[0-9]{1,3}(?:,[0-9]{3})+|[0-9]{1,3}(?:_[0-9]{3})+", re.ASCII)


def count(text: str) -> int:
    """A non-negative integer; thousands separators allowed (``523_880``, ``523,880``)."""
    if not _COUNT.fullmatch(text.strip()):
        if text.strip().startswith("-") and _COUNT.fullmatch(text.strip()[1:]):
            # the rule it breaks (was: "'-1': not an integer")
            raise argparse.ArgumentTypeError(f"{text.strip()[:40]!r}: must be >= 0")
        raise argparse.ArgumentTypeError(
            f"{text[:40]!r}: not an integer (ASCII digits; '_' or ',' only between groups "
            "of three digits, e.g. 523,880)")
    value = int(text.strip().replace("_", "").replace(",", ""))
    if value > MAX_COUNT:
        raise argparse.ArgumentTypeError(f"{text[:40]!r}: must be at most {MAX_COUNT:,}")
    return value


def path_arg(text: str) -> str:
    """A file or folder path: not empty and no NUL byte. Why: an empty path became "."
    (``conform ""`` read the working folder as a group, ``verify ""`` checked the shipped
    specs, ``--ledger ""`` said "Is a directory: '.'")."""
    if not text.strip():
        raise argparse.ArgumentTypeError(f"{text!r}: must be a path (not empty)")
    if "\0" in text:
        raise argparse.ArgumentTypeError(f"{text[:60]!r}: a path cannot hold a NUL byte")
    return text


def device_list(text: str) -> list[int]:
    """``--devices``: comma-separated distinct CUDA ordinals, e.g. ``0,1`` (not empty)."""
    from kvgrant.runtime.arguments import MAX_DEVICE_ORDINAL

    parts = text.split(",")
    if any(not re.fullmatch(r"[0-9]+", p, re.ASCII) for p in parts):
        raise argparse.ArgumentTypeError(
            f"{text[:60]!r}: must be comma-separated CUDA ordinals, one per rank (e.g. 0,1)")
    # a long number is out of range whatever its value (read no more of it than that)
    big = [p for p in parts if len(p.lstrip("0")) > 7 or int(p) > MAX_DEVICE_ORDINAL]
    if big:
        raise argparse.ArgumentTypeError(f"{big[0][:20]}{'...' if len(big[0]) > 20 else ''}: "
                                         f"a CUDA ordinal must be in 0..{MAX_DEVICE_ORDINAL}")
    values = [int(p) for p in parts]
    if len(set(values)) != len(values):
        raise argparse.ArgumentTypeError(f"{text[:60]!r}: two ranks on one device")
    return values


def exit_status(err: KVGrantError) -> int:
    """2 when the command could not do its job: bad input (an argument, or a geometry,
    trace or plan file that breaks a rule) or a missing tool (Java, TLC, specs); 1 when
    the request was refused or failed (pre-flight, contract of a plan kvgrant made,
    capacity, driver, allocation)."""
    bad_input = (ArgumentError, GeometryError, TraceError, PlanFileError, ToolError)
    return 2 if isinstance(err, bad_input) else 1


def positive_int(text: str) -> int:
    """An integer >= 1 (worker counts). A negative one breaks this rule, not
    :func:`count`'s (``--ranks -1`` said "must be >= 0", ``--ranks 0`` ">= 1")."""
    bare = text.strip()
    if bare.startswith("-") and _COUNT.fullmatch(bare[1:]):
        raise argparse.ArgumentTypeError(f"{bare[:40]!r}: must be >= 1")
    value = count(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"{value}: must be >= 1")
    return value


#: A decimal number of seconds: digits, one point, an exponent (``30``, ``2.5``, ``1e3``);
#: not ``inf``, ``nan``, ``1_0`` or full-width digits, which ``float()`` also reads.
_SECONDS = re.compile(r"(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+)(?:[eE][-+]?[0-9]+)?", re.ASCII)


def positive_seconds(text: str, most: float = 10**7) -> float:
    """A number of seconds > 0 and at most ``most`` (the option's own limit, named in
    the error: ``--time-limit=1e7`` was told "below 10,000,000 s" where a day is the
    most it takes)."""
    bare = text.strip()
    if bare.startswith("-") and _SECONDS.fullmatch(bare[1:]):
        raise argparse.ArgumentTypeError(f"{bare[:40]!r}: must be > 0 seconds")
    if not _SECONDS.fullmatch(bare):
        raise argparse.ArgumentTypeError(f"{text[:40]!r}: not a number of seconds (a "
                                         "decimal such as 30 or 2.5)")
    value = float(bare)
    if value <= 0:
        raise argparse.ArgumentTypeError(f"{bare[:40]!r}: must be > 0 seconds")
    if value > most:
        raise argparse.ArgumentTypeError(f"{bare[:40]!r}: must be at most {most:,.0f} s")
    return value


def check_new_file_path(field: str, path: str, what: str) -> None:
    """Refuse, before any work, a path where the command cannot make the file ``what``
    (its folder is missing or is a file, or the path is a folder): bad input, exit 2.

    Why: the file is made only when it is first used (the ledger: after planning, just
    before the first driver call), and then the error was an exit-1 failure naming a
    temporary file, as if the host had refused the request.

    Raises
    ------
    ArgumentError
        ``FIELD = VALUE: rule``, naming the folder that is wrong.
    """
    if "\0" in path:
        raise ArgumentError(f"{field} = {path!r}: a path cannot hold a NUL byte",
                            argument=field.lstrip("-"), value=path)
    folder = os.path.dirname(path) or "."
    if os.path.isdir(path):
        rule = f"is a folder; name the {what} file itself (e.g. {os.path.join(path, 'x.json')!r})"
    elif not os.path.exists(folder):
        rule = f"its folder {folder!r} does not exist (the {what} file is made there)"
    elif not os.path.isdir(folder):
        rule = f"its folder {folder!r} is a file, not a folder"
    else:
        return
    raise ArgumentError(f"{field} = {path!r}: {rule}", argument=field.lstrip("-"), value=path)


def check_ledger_path(option: str | None) -> None:
    """:func:`check_new_file_path` for the host ledger the command would use: the
    option's value, else ``KVGRANT_LEDGER`` when set (the default folder is the system's)."""
    from kvgrant.runtime.ledger import LEDGER_ENV, env_ledger_path

    if option is not None:
        check_new_file_path("--ledger", option, "ledger")
    elif (named := env_ledger_path()) is not None:  # refuses a switch word such as 1
        check_new_file_path(LEDGER_ENV, str(named), "ledger")
