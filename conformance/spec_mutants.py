"""Guard-removal mutants of the lifecycle spec: each safety invariant must catch one.

``specs/KVLifecycle.tla`` tags every guard a safety invariant relies on with a
trailing ``\\* @guard <name>`` comment on the guard's own ``/\\`` line.  A mutant
replaces exactly that conjunct with ``TRUE`` in a temp copy of the spec; TLC
must then report the expected invariant violated, while the unmutated spec
passes the same small config.  This proves each invariant is not vacuous and
each guard is load-bearing.

``TypeOK`` has no mutant: no guard protects it (it holds for any subset-valued
update), so removing a guard cannot break it.

Standard library only, like :mod:`tlc` (it imports that module by path when
kvgrant is not installed).
"""

from __future__ import annotations

import re
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path

from kvgrant.conformance.tlc import TLCResult, ToolError, run_tlc

__all__ = [
    "BASE_SPEC",
    "GROUP_MUTANTS",
    "GROUP_MUTANT_CONFIG",
    "GROUP_MUTANT_CONFIG_3",
    "GROUP_SAFETY_INVARIANTS",
    "GROUP_SPEC",
    "MUTANTS",
    "MUTANT_CONFIG",
    "Mutant",
    "SAFETY_INVARIANTS",
    "find_guards",
    "mutate",
    "run_group_mutant",
    "run_group_unmutated",
    "run_mutant",
    "run_unmutated",
]

BASE_SPEC = "KVLifecycle.tla"
_MC_SPEC = "MCKVLifecycle.tla"

_GUARD_LINE = re.compile(
    r"^(?P<lead>\s*/\\\s+)(?P<expr>.*?)(?P<tag>\s*\\\*\s*@guard\s+(?P<name>[\w-]+))\s*$")


@dataclass(frozen=True)
class Mutant:
    """Remove guard ``guard``; TLC must then report ``invariant`` violated."""

    guard: str
    invariant: str
    why: str


#: One or more mutants per safety invariant (TypeOK excluded, see module doc).
MUTANTS: tuple[Mutant, ...] = (
    Mutant("publish-all-ready", "PublishOnlyWhenAllReady",
           "Publish before every rank is ready publishes capacity that is not there"),
    Mutant("ready-after-grants", "PublishOnlyWhenAllReady",
           "RankReady before every cuMemSetAccess publishes ungranted memory"),
    Mutant("unmap-only-unwinding", "PublishOnlyWhenAllReady",
           "unmapping while published pulls memory from under published capacity"),
    Mutant("grant-owner-and-importers", "AccessOnlyOwnerAndImporters",
           "granting any declared reader reaches the overdeclared reader"),
    Mutant("unmap-alias-before-backing", "AliasNeverOutlivesBacking",
           "unmapping the plane first leaves the alias dangling"),
    Mutant("alias-after-backing", "AliasNeverOutlivesBacking",
           "mapping the alias before its plane mapping"),
    Mutant("abort-complete-when-empty", "NothingLeftAfterAbort",
           "declaring the abort complete while ranks still hold objects"),
    Mutant("shutdown-complete-when-empty", "NothingLeftAfterShutdown",
           "declaring shutdown complete while ranks still hold objects"),
    Mutant("publish-all-ready", "PublishAllOrNothing",
           "Publish with some ranks not ready publishes only the ready ones"),
)

#: A small config for mutants: 3 ranks (rank 2 an overdeclared reader), one
#: allocation, aliased.  TLC stops at the first violation; the unmutated spec
#: explores it fully in a few seconds.
MUTANT_CONFIG = """\
CONSTANTS
    NumRanks = 3
    NumAllocs = 1
    Aliased = {0}
    OwnerOnly = {}
    Importers <- MCImporters
    DeclaredReaders <- MCDeclaredReaders
SPECIFICATION Spec
CONSTRAINT MCStateConstraint
INVARIANTS @INVARIANTS@
"""

#: The safety invariants of the lifecycle spec (docs/INTERFACES.md).
SAFETY_INVARIANTS: tuple[str, ...] = (
    "TypeOK", "PublishOnlyWhenAllReady", "AccessOnlyOwnerAndImporters",
    "AliasNeverOutlivesBacking", "NothingLeftAfterAbort", "NothingLeftAfterShutdown",
    "PublishAllOrNothing")


def find_guards(text: str) -> dict[str, int]:
    """Map each ``@guard`` name in spec ``text`` to its 1-based line number.

    Raises
    ------
    ValueError
        When a name is tagged twice or a tag is not on a ``/\\`` conjunct line.
    """
    guards: dict[str, int] = {}
    for number, line in enumerate(text.splitlines(), start=1):
        if "@guard" not in line or line.lstrip().startswith("(*"):
            continue  # no tag, or the block comment that explains the tags
        match = _GUARD_LINE.match(line)
        if match is None:
            raise ValueError(f"line {number}: @guard tag is not on a '/\\ expr' line: {line!r}")
        name = match.group("name")
        if name in guards:
            raise ValueError(f"line {number}: guard {name!r} already tagged on line "
                             f"{guards[name]}")
        guards[name] = number
    return guards


def mutate(text: str, guard: str) -> str:
    """``text`` with the conjunct tagged ``guard`` replaced by ``TRUE``.

    Raises
    ------
    ValueError
        When ``guard`` is not tagged in ``text``.
    """
    lines = text.splitlines(keepends=True)
    number = find_guards(text).get(guard)
    if number is None:
        raise ValueError(f"guard {guard!r} is not tagged in the spec "
                         f"(tags: {sorted(find_guards(text))})")
    line = lines[number - 1]
    match = _GUARD_LINE.match(line.rstrip("\n"))
    assert match is not None  # find_guards checked it
    lines[number - 1] = (match.group("lead") + "TRUE" + match.group("tag")
                         + " (mutated)" + ("\n" if line.endswith("\n") else ""))
    return "".join(lines)


def _check(specdir: Path, text: str, invariants: tuple[str, ...], *,
           timeout: float | None, workers: int) -> TLCResult:
    work = Path(tempfile.mkdtemp(prefix="kvgrant-mutant-"))
    try:
        (work / BASE_SPEC).write_text(text)
        shutil.copy2(specdir / _MC_SPEC, work / _MC_SPEC)
        cfg = work / "MCMutant.cfg"
        cfg.write_text(MUTANT_CONFIG.replace("@INVARIANTS@", " ".join(invariants)))
        return run_tlc(work / _MC_SPEC, cfg, timeout=timeout, workers=workers)
    finally:
        shutil.rmtree(work, ignore_errors=True)


def run_mutant(mutant: Mutant, specdir: str | Path, *, timeout: float | None = 120,
               workers: int = 1) -> TLCResult:
    """Model-check ``mutant`` against its invariant on :data:`MUTANT_CONFIG`.

    The caller expects ``status == "invariant"`` and ``violated == mutant.invariant``.
    """
    root = Path(specdir)
    if not (root / BASE_SPEC).is_file():
        raise ToolError(f"{root / BASE_SPEC} does not exist")
    text = mutate((root / BASE_SPEC).read_text(), mutant.guard)
    return _check(root, text, (mutant.invariant,), timeout=timeout, workers=workers)


def run_unmutated(specdir: str | Path, invariants: tuple[str, ...] = SAFETY_INVARIANTS,
                  *, timeout: float | None = 120, workers: int = 1) -> TLCResult:
    """The unmutated spec on :data:`MUTANT_CONFIG` (expected ``status == "ok"``)."""
    root = Path(specdir)
    return _check(root, (root / BASE_SPEC).read_text(), tuple(invariants),
                  timeout=timeout, workers=workers)


# --- the group model (specs/KVGroup.tla) ----------------------------------------------------

GROUP_SPEC = "KVGroup.tla"
_GROUP_MC_SPEC = "MCKVGroup.tla"

#: One or more guard-removal mutants per safety invariant of KVGroup (TypeOK excluded).
GROUP_MUTANTS: tuple[Mutant, ...] = (
    Mutant("decide-after-all-votes", "Agreement",
           "deciding while a live rank has not voted lets one abort and another publish"),
    Mutant("publish-only-if-all-ready", "Validity",
           "publishing although a rank voted failed"),
    Mutant("grant-own-device", "OwnerGrantsOnlyOwnDevice",
           "the owner grants its importers' devices itself"),
    Mutant("import-grant-own-device", "ImporterGrantsOnlyOwnDevice",
           "an importer grants a device other than its own"),
    Mutant("send-only-to-importers", "ImportOnlyByImporters",
           "sending an fd to a declared reader that is not an importer"),
    Mutant("import-after-send", "ImportOnlyByImporters",
           "importing without a Send (from an owner that never sent to this rank)"),
    Mutant("import-map-after-import", "MapOnlyImported",
           "mapping an owner's memory without an imported handle"),
    Mutant("import-release-after-unmap", "MapOnlyImported",
           "releasing an imported handle that is still mapped"),
    Mutant("import-alias-only-shared", "AccessOnlyOwnerAndImporters",
           "an importer maps (and grants) the alias of an owner-only region"),
    Mutant("alias-after-backing", "AliasNeverOutlivesBacking",
           "mapping an own alias before its plane mapping"),
    Mutant("unmap-alias-before-backing", "AliasNeverOutlivesBacking",
           "unmapping an own plane mapping before its alias"),
    Mutant("import-unmap-alias-before-backing", "AliasNeverOutlivesBacking",
           "unmapping an imported plane mapping before its alias"),
    Mutant("ready-after-imports", "PublishedHoldsPlan",
           "RankReady before the imports are mapped and granted"),
    Mutant("vote-ready-only-if-ready", "PublishedHoldsPlan",
           "voting ready before RankReady"),
    Mutant("unmap-only-unwinding", "PublishedHoldsPlan",
           "unmapping while published"),
    Mutant("abort-complete-when-empty", "NothingLeftAfterAbort",
           "finishing the abort while the process still holds (imported) objects"),
    Mutant("shutdown-complete-when-empty", "NothingLeftAfterShutdown",
           "finishing shutdown while the process still holds (imported) objects"),
)

#: The safety invariants of KVGroup.
GROUP_SAFETY_INVARIANTS: tuple[str, ...] = (
    "TypeOK", "Agreement", "Validity", "OwnerGrantsOnlyOwnDevice",
    "ImporterGrantsOnlyOwnDevice", "ImportOnlyByImporters", "MapOnlyImported",
    "AccessOnlyOwnerAndImporters", "AliasNeverOutlivesBacking", "PublishedHoldsPlan",
    "NothingLeftAfterAbort", "NothingLeftAfterShutdown")

#: A small config for group mutants: 2 processes (rank 1 imports rank 0, rank 0 is an
#: overdeclared reader of rank 1), both allocations aliased, allocation 1 owner-only,
#: one fault in all.
GROUP_MUTANT_CONFIG = """\
CONSTANTS
    NumRanks = 2
    NumAllocs = 2
    Aliased = {0, 1}
    OwnerOnly = {1}
    Importers <- MCImporters
    DeclaredReaders <- MCDeclaredReaders
SPECIFICATION Spec
CONSTRAINT MCOneFault
ACTION_CONSTRAINT MCCrashBeforeDecide
INVARIANTS @INVARIANTS@
"""


#: Mutants that need a rank that exports and a third rank that is not its importer: on
#: GROUP_MUTANT_CONFIG's two ranks the only rank that exports has the other as importer.
#: They run on three ranks (the importer chain 0 -> 1 -> 2) with one allocation.
GROUP_MUTANT_CONFIG_3 = """\
CONSTANTS
    NumRanks = 3
    NumAllocs = 1
    Aliased = {0}
    OwnerOnly = {}
    Importers <- MCImporters
    DeclaredReaders <- MCDeclaredReaders
SPECIFICATION Spec
CONSTRAINT MCOneFault
ACTION_CONSTRAINT MCCrashBeforeDecide
INVARIANTS @INVARIANTS@
"""
_THREE_RANKS = frozenset({"send-only-to-importers"})


def _check_group(specdir: Path, text: str, invariants: tuple[str, ...], *,
                 timeout: float | None, workers: int,
                 config: str = GROUP_MUTANT_CONFIG) -> TLCResult:
    work = Path(tempfile.mkdtemp(prefix="kvgrant-group-mutant-"))
    try:
        (work / GROUP_SPEC).write_text(text)
        shutil.copy2(specdir / _GROUP_MC_SPEC, work / _GROUP_MC_SPEC)
        cfg = work / "MCMutant.cfg"
        cfg.write_text(config.replace("@INVARIANTS@", " ".join(invariants)))
        return run_tlc(work / _GROUP_MC_SPEC, cfg, timeout=timeout, workers=workers)
    finally:
        shutil.rmtree(work, ignore_errors=True)


def run_group_mutant(mutant: Mutant, specdir: str | Path, *, timeout: float | None = 300,
                     workers: int = 1) -> TLCResult:
    """Model-check a KVGroup ``mutant`` against its invariant on GROUP_MUTANT_CONFIG."""
    root = Path(specdir)
    if not (root / GROUP_SPEC).is_file():
        raise ToolError(f"{root / GROUP_SPEC} does not exist")
    text = mutate((root / GROUP_SPEC).read_text(), mutant.guard)
    config = GROUP_MUTANT_CONFIG_3 if mutant.guard in _THREE_RANKS else GROUP_MUTANT_CONFIG
    return _check_group(root, text, (mutant.invariant,), timeout=timeout, workers=workers,
                        config=config)


def run_group_unmutated(specdir: str | Path,
                        invariants: tuple[str, ...] = GROUP_SAFETY_INVARIANTS, *,
                        timeout: float | None = 300, workers: int = 1) -> TLCResult:
    """The unmutated KVGroup on GROUP_MUTANT_CONFIG (expected ``status == "ok"``)."""
    root = Path(specdir)
    return _check_group(root, (root / GROUP_SPEC).read_text(), tuple(invariants),
                        timeout=timeout, workers=workers)
