"""Mutants of the lifecycle spec: every safety property must catch at least one.

Two kinds, both applied to a temp copy of ``specs/KVLifecycle.tla``:

* guard removal: ``specs/KVLifecycle.tla`` tags every guard a property relies on
  with a trailing ``\\* @guard <name>`` comment on the guard's own ``/\\`` line;
  the mutant replaces exactly that conjunct with ``TRUE``;
* operator change: every occurrence of a text ``old`` becomes ``new`` (e.g. GrantSet
  granting every declared reader, the field failure this project exists to prevent;
  the importer relation transposed; a failed step retried; Aborted going back to
  Allocating; unwinding in forward order).  ``old`` must occur ``count`` times, so a
  spec edit that moves the text breaks the mutant loudly instead of silently.

TLC then checks the mutant on :data:`MUTANT_CONFIG` against the one property named
by the mutant, and must report exactly that property violated (:func:`caught`),
while the unmutated spec passes the same config with every property.  This proves
each property is not vacuous, is stated independently of the guards, and that each
guard is load-bearing.  A liveness mutant runs on the spec's shipped liveness config
instead (``MCKVLifecycle_Live.cfg`` / ``MCKVGroup_Live.cfg`` of the spec folder, its
PROPERTIES replaced by the mutant's one property; :func:`live_config`), without
deadlock checking: a stuck attempt is what it must show, and the property is the claim.

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
    "ACTION_PROPERTIES",
    "BASE_SPEC",
    "GROUP_ACTION_PROPERTIES",
    "GROUP_LIVENESS_PROPERTIES",
    "GROUP_LIVE_CONFIG",
    "GROUP_MUTANTS",
    "GROUP_MUTANT_CONFIG",
    "GROUP_MUTANT_CONFIG_3",
    "GROUP_MUTANT_CONFIG_PLAIN",
    "GROUP_MUTANT_CONFIG_TWO_FAULTS",
    "GROUP_MUTANT_CONFIG_UNDO",
    "GROUP_SAFETY_INVARIANTS",
    "GROUP_SPEC",
    "LIVENESS_PROPERTIES",
    "LIVE_CONFIG",
    "MUTANTS",
    "MUTANT_CONFIG",
    "MUTANT_CONFIG_PLAIN",
    "MUTANT_CONFIG_UNDO",
    "Mutant",
    "SAFETY_INVARIANTS",
    "apply_mutant",
    "caught",
    "find_guards",
    "live_config",
    "mutate",
    "property_kind",
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
    """A spec mutant; TLC must report ``invariant`` (any property: an invariant, an
    action property or a liveness property) violated.

    ``guard`` names it: a ``@guard`` tag when ``old`` is None (that conjunct becomes
    ``TRUE``), else the name of an operator change (each of the ``count``
    occurrences of ``old`` becomes ``new``).
    """

    guard: str
    invariant: str
    why: str
    old: str | None = None
    new: str = "TRUE"
    count: int = 1

    @property
    def kind(self) -> str:
        """``guard`` (a removed conjunct) or ``operator`` (a changed operator body)."""
        return "guard" if self.old is None else "operator"


#: The safety invariants of the lifecycle spec (state predicates, INVARIANTS).
SAFETY_INVARIANTS: tuple[str, ...] = (
    "TypeOK", "PublishOnlyWhenAllReady", "AccessOnlyOwnerAndImporters",
    "AliasNeverOutlivesBacking", "NothingLeftAfterAbort", "NothingLeftAfterShutdown",
    "PublishAllOrNothing", "FailureNeverPublishes", "AbortOnlyOnFailure",
    "LeakedStayLive", "UndoFailureNeverCompletes")

#: Safety properties of steps ([][A]_vars, checked as PROPERTIES; TLC names them).
ACTION_PROPERTIES: tuple[str, ...] = ("OneAttempt", "NoRetryAfterFailure",
                                      "UnwindInReverseOrder", "ReservedBeforeAnyCreate")

#: Liveness properties (TLC 2.15 does not name a violated one: one per run).
LIVENESS_PROPERTIES: tuple[str, ...] = ("AttemptEnds", "ShutdownEnds",
                                        "FailureLeadsToAbort", "EverythingReleased")

#: The shipped liveness configs (in the spec folder) that liveness mutants run on.
LIVE_CONFIG = "MCKVLifecycle_Live.cfg"
GROUP_LIVE_CONFIG = "MCKVGroup_Live.cfg"

_SPEC_FAIR = "Spec == Init /\\ [][Next]_vars /\\ WF_vars(Progress)"

_GRANTSET_ELSE = "ELSE {r} \\cup Importers[r]"
_GRANTSET_IF = 'IF m = "alias" /\\ a \\in OwnerOnly THEN {r}'
_REVERSE = "b > a => b \\notin created[r]"

#: One or more mutants per property (TypeOK excluded, see module doc).
MUTANTS: tuple[Mutant, ...] = (
    # --- guard removal ------------------------------------------------------------------
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
    Mutant("release-after-unmap", "AliasNeverOutlivesBacking",
           "releasing a handle whose plane mapping is still live"),
    Mutant("free-after-release", "AliasNeverOutlivesBacking",
           "freeing the VA while handles are still live"),
    Mutant("abort-complete-when-empty", "NothingLeftAfterAbort",
           "declaring the abort complete while ranks still hold objects"),
    Mutant("shutdown-complete-when-empty", "NothingLeftAfterShutdown",
           "declaring shutdown complete while ranks still hold objects"),
    Mutant("publish-all-ready", "PublishAllOrNothing",
           "Publish with some ranks not ready publishes only the ready ones"),
    Mutant("abort-only-on-failure", "AbortOnlyOnFailure",
           "Abort with no failed step: a healthy start-up is torn down"),
    Mutant("alias-only-aliased", "PublishOnlyWhenAllReady",
           "a plain allocation is mapped into a region it does not alias (runs on "
           "MUTANT_CONFIG_PLAIN: the other configs alias every allocation)"),
    Mutant("create-after-previous-complete", "UnwindInReverseOrder",
           "creating ahead of mapping: the plan-order unwind is no longer LIFO"),
    Mutant("unmap-reverse-order", "UnwindInReverseOrder",
           "unmapping an older allocation while a newer handle is live"),
    Mutant("reserve-all-before-create", "ReservedBeforeAnyCreate",
           "a rank creates memory while another rank has no VA yet"),
    # --- operator changes ---------------------------------------------------------------
    Mutant("grantset-declared-readers", "AccessOnlyOwnerAndImporters",
           "the field failure: GrantSet grants every declared reader, not the importers",
           old=_GRANTSET_ELSE, new="ELSE {r} \\cup DeclaredReaders[r]"),
    Mutant("grantset-transposed-importers", "AccessOnlyOwnerAndImporters",
           "GrantSet reads the importer relation transposed (the ranks r imports from)",
           old=_GRANTSET_ELSE, new="ELSE {r} \\cup {i \\in Ranks : r \\in Importers[i]}"),
    Mutant("grantset-ignores-owner-only", "AccessOnlyOwnerAndImporters",
           "the alias of an owner-only region is granted to the importers too",
           old=_GRANTSET_IF, new="IF FALSE THEN {r}"),
    Mutant("grantset-owner-only-plane", "AccessOnlyOwnerAndImporters",
           "owner-only applied to the plane mapping instead of the alias",
           old=_GRANTSET_IF, new='IF m = "plane" /\\ a \\in OwnerOnly THEN {r}'),
    Mutant("unmap-keeps-grant", "AccessOnlyOwnerAndImporters",
           "cuMemUnmap leaves the mapping's access behind (a grant with no mapping)",
           old="/\\ access' = [access EXCEPT ![r] = {g \\in @ : ~(g[1] = a /\\ g[2] = m)}]",
           new="/\\ access' = access"),
    Mutant("unpublish-keeps-capacity", "NothingLeftAfterShutdown",
           "Unpublish leaves the capacity published through shutdown",
           old="/\\ published' = {}", new="/\\ published' = published"),
    Mutant("aborted-to-allocating", "OneAttempt",
           "a second attempt: AbortComplete goes back to Allocating",
           old="/\\ phase' = \"Aborted\"", new="/\\ phase' = \"Allocating\""),
    Mutant("shutdown-to-allocating", "OneAttempt",
           "a second attempt after shutdown: ShutdownComplete goes back to Allocating",
           old="/\\ phase' = \"Shutdown\"", new="/\\ phase' = \"Allocating\""),
    Mutant("abort-forgets-failures", "OneAttempt",
           "Abort clears the failure flags: the failed attempt is forgotten",
           old="/\\ phase' = \"Aborting\"\n    /\\ UNCHANGED <<va, created, mapped, aliasMapped, "
               "access, ready, failed,",
           new="/\\ phase' = \"Aborting\"\n    /\\ failed' = [x \\in Ranks |-> FALSE]\n"
               "    /\\ UNCHANGED <<va, created, mapped, aliasMapped, access, ready,"),
    Mutant("retry-failed-step", "NoRetryAfterFailure",
           "a failed driver step is retried silently: the rank goes on after Fail",
           old="~failed[r]", new="TRUE", count=7),
    Mutant("retry-failed-step", "FailureNeverPublishes",
           "a silently retried step lets the group publish after a failure",
           old="~failed[r]", new="TRUE", count=7),
    Mutant("retry-failed-step", "FailureLeadsToAbort",
           "after a silently retried step the attempt publishes instead of aborting",
           old="~failed[r]", new="TRUE", count=7),
    Mutant("abort-needs-every-rank-failed", "FailureLeadsToAbort",
           "Abort waits for every rank to fail: one failure leaves the group stuck",
           old="/\\ \\E r \\in Ranks : failed[r]", new="/\\ \\A r \\in Ranks : failed[r]"),
    Mutant("forward-order-unwind", "UnwindInReverseOrder",
           "unwinding releases the oldest allocation first (forward order)",
           old=_REVERSE, new="b < a => b \\notin created[r]", count=2),
    Mutant("no-fairness", "AttemptEnds",
           "without weak fairness an attempt may stop half-way",
           old="/\\ WF_vars(Progress)", new=""),
    Mutant("free-only-when-aborting", "ShutdownEnds",
           "cuMemAddressFree only while aborting: shutdown never frees the VA",
           old="    /\\ Unwinding\n    /\\ va[r]\n",
           new="    /\\ phase = \"Aborting\"\n    /\\ va[r]\n"),
    # liveness audit (2026-12-03): each on MCKVLifecycle_Live.cfg, one property per run
    Mutant("unpublish-after-release", "ShutdownEnds",
           "Unpublish waits until every rank has released everything, which only "
           "unwinding does: a published cache never shuts down",
           old="Unpublish ==\n    /\\ phase = \"Published\"\n",
           new="Unpublish ==\n    /\\ phase = \"Published\"\n    /\\ NothingLeft\n"),
    Mutant("release-skips-first", "FailureLeadsToAbort",
           "the unwind loop stops before allocation 0 (off by one): its handle is never "
           "released, so the VA is never freed and the abort never completes",
           old="    /\\ a \\in created[r]\n    /\\ a \\notin mapped[r] ",
           new="    /\\ a \\in created[r] /\\ a > 0\n    /\\ a \\notin mapped[r] "),
    Mutant("free-only-when-shutting-down", "FailureLeadsToAbort",
           "cuMemAddressFree only on shutdown: an abort never frees the VA",
           old="    /\\ Unwinding\n    /\\ va[r]\n",
           new="    /\\ phase = \"ShuttingDown\"\n    /\\ va[r]\n"),
    Mutant("unwinding-not-fair", "FailureLeadsToAbort",
           "fairness left out for the unwinding steps: an aborting attempt may stop",
           old=_SPEC_FAIR,
           new="Spec == Init /\\ [][Next]_vars /\\ WF_vars((\\E r \\in Ranks : RankStep(r)) "
               "\\/ GroupStep)"),
    Mutant("last-rank-starved", "AttemptEnds",
           "fairness left out for the last rank: it may never get ready (or unwind)",
           old=_SPEC_FAIR,
           new="Spec == Init /\\ [][Next]_vars /\\ WF_vars((\\E r \\in Ranks \\ {NumRanks - 1} "
               ": RankStep(r) \\/ UnwindStep(r)) \\/ GroupStep)"),
    Mutant("abort-complete-when-empty", "EverythingReleased",
           "the abort declared complete while ranks hold objects: unwinding stops there "
           "and they are never released"),
    Mutant("unpublish-never", "EverythingReleased",
           "Unpublish never runs: the published cache is never released",
           old="Unpublish ==\n    /\\ phase = \"Published\"\n",
           new="Unpublish ==\n    /\\ FALSE\n"),
    # helpers the guards share: the properties are written out apart from them, so a
    # wrong helper weakens the guard only (helper-17's audit, 2026-12-02)
    Mutant("nothing-left-keeps-va", "NothingLeftAfterAbort",
           "the guards' NothingLeftOn forgets the VA: the attempt ends holding it",
           old="NothingLeftOn(r) ==\n    /\\ ~va[r]\n", new="NothingLeftOn(r) ==\n    /\\ TRUE\n"),
    Mutant("granted-always", "PublishOnlyWhenAllReady",
           "the guards' Granted is always true: a rank gets ready with mappings never "
           "granted",
           old="Granted(r, a, m) == {d \\in Ranks : <<a, m, d>> \\in access[r]} # {}",
           new="Granted(r, a, m) == TRUE"),
    Mutant("grant-while-unwinding", "OneAttempt",
           "cuMemSetAccess outside Allocating: a new grant while the attempt unwinds",
           old="CanGrant(r, a, m) ==\n    /\\ phase = \"Allocating\"\n",
           new="CanGrant(r, a, m) ==\n    /\\ TRUE\n"),
    # failed undo steps (2026-12-07; on MUTANT_CONFIG_UNDO: one failed undo)
    Mutant("undo-never-retried", "LeakedStayLive",
           "a mapping whose cuMemUnmap failed is unmapped after all (a silent retry): "
           "what the runtime reports left live is gone"),
    Mutant("free-after-unmap", "AliasNeverOutlivesBacking",
           "cuMemAddressFree succeeds with a leaked mapping still in the VA range (the "
           "driver refuses it)"),
    Mutant("complete-after-every-undo", "UndoFailureNeverCompletes",
           "AbortComplete / ShutdownComplete once every undo ran, failed ones too (the "
           "runtime mutant 'AbortComplete traced although an undo failed')",
           old=("    /\\ NothingLeft" + " " * 35 + "\\* @guard abort-complete-when-empty\n"),
           new="    /\\ \\A r \\in Ranks : LiveObjects(r) \\subseteq leaked[r]\n"),
)

#: A small config for mutants: 2 ranks with asymmetric importers (rank 0 imports
#: rank 1's memory, not vice versa, so rank 1 is an overdeclared reader of rank 0 and
#: a transposed relation grants it), two allocations, both aliased: allocation 0 into
#: an owner-only region, allocation 1 into an importer-granted one; at most one
#: failing rank.  TLC stops at the first violation; the unmutated spec explores it
#: fully in seconds (3 ranks: 42,240 states, and 470 s for all mutants under load).
MUTANT_CONFIG = """\
CONSTANTS
    NumRanks = 2
    NumAllocs = 2
    Aliased = {0, 1}
    OwnerOnly = {0}
    Importers <- MCImporters
    DeclaredReaders <- MCDeclaredReaders
SPECIFICATION Spec
CONSTRAINT MCStateConstraint
INVARIANTS @INVARIANTS@
"""

#: MUTANT_CONFIG with allocation 0 plain (not aliased), for mutants that only a plain
#: allocation shows: the other configs alias every allocation.
MUTANT_CONFIG_PLAIN = MUTANT_CONFIG.replace("Aliased = {0, 1}\n    OwnerOnly = {0}",
                                            "Aliased = {1}\n    OwnerOnly = {}")
_PLAIN = frozenset({"alias-only-aliased"})

#: MUTANT_CONFIG with one failed undo step (specs/MCKVLifecycle_Undo.cfg's bound), for
#: the mutants only a failed undo shows; the other mutants keep the spec's default (no
#: undo fails), so their state spaces stay as they were.
MUTANT_CONFIG_UNDO = MUTANT_CONFIG.replace(
    "    DeclaredReaders <- MCDeclaredReaders\n",
    "    DeclaredReaders <- MCDeclaredReaders\n    MaxUndoFailures <- MCOneUndoFailure\n")
_UNDO = frozenset({"undo-never-retried", "free-after-unmap", "complete-after-every-undo"})


def property_kind(name: str) -> str:
    """``invariant``, ``action`` or ``liveness``: how TLC checks ``name`` (any name not
    listed as an action or liveness property, e.g. a group invariant, is an invariant)."""
    if name in ACTION_PROPERTIES or name in GROUP_ACTION_PROPERTIES:
        return "action"
    if name in LIVENESS_PROPERTIES or name in GROUP_LIVENESS_PROPERTIES:
        return "liveness"
    return "invariant"


def caught(mutant: Mutant, res: TLCResult) -> bool:
    """Did TLC report ``mutant``'s property violated?  Invariants and action
    properties are named by TLC; a liveness violation is not (TLC 2.15), so the run
    checks that one property only and any temporal violation is it."""
    kind = property_kind(mutant.invariant)
    if kind == "invariant":
        return res.status == "invariant" and res.violated == mutant.invariant
    if kind == "action":
        return res.status == "property" and res.violated == mutant.invariant
    return res.status == "property" and res.violated in (None, "temporal properties",
                                                         mutant.invariant)


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


def apply_mutant(text: str, mutant: Mutant) -> str:
    """``text`` (the spec) with ``mutant`` applied.

    Raises
    ------
    ValueError
        When the guard is not tagged, or ``old`` does not occur exactly ``count``
        times (the spec moved on and the mutant must follow).
    """
    if mutant.old is None:
        return mutate(text, mutant.guard)
    found = text.count(mutant.old)
    if found != mutant.count:
        raise ValueError(f"mutant {mutant.guard!r}: {mutant.old!r} occurs {found} times in "
                         f"the spec, expected {mutant.count}")
    return text.replace(mutant.old, mutant.new)


_PROPERTIES_LINE = re.compile(r"^PROPERT(?:Y|IES)\b", re.M)


def live_config(specdir: str | Path, name: str = LIVE_CONFIG) -> str:
    """The shipped liveness config ``name`` of ``specdir`` without its PROPERTIES (the
    template a liveness mutant runs on; :func:`_config` appends the one property).

    Raises
    ------
    ToolError
        When the config is missing, has no PROPERTIES, or has anything after them
        but property names and comments.
    """
    path = Path(specdir) / name
    if not path.is_file():
        raise ToolError(f"{path} does not exist: liveness mutants run on it")
    text = path.read_text()
    match = _PROPERTIES_LINE.search(text)
    if match is None:
        raise ToolError(f"{path} has no PROPERTIES")
    tail = re.sub(r"\\\*[^\n]*", "", text[match.end():])
    if not re.fullmatch(r"[\s\w]*", tail):
        raise ToolError(f"{path}: only property names may follow PROPERTIES")
    return text[:match.start()]


def _config(properties: tuple[str, ...], template: str = MUTANT_CONFIG) -> str:
    """``template`` checking ``properties``: invariants as INVARIANTS, the rest as
    PROPERTIES."""
    inv = [p for p in properties if property_kind(p) == "invariant"]
    props = [p for p in properties if property_kind(p) != "invariant"]
    body = template.replace("INVARIANTS @INVARIANTS@\n",
                            f"INVARIANTS {' '.join(inv)}\n" if inv else "")
    return body + (f"PROPERTIES {' '.join(props)}\n" if props else "")


def _check(specdir: Path, text: str, properties: tuple[str, ...], *,
           timeout: float | None, workers: int, config: str = MUTANT_CONFIG) -> TLCResult:
    work = Path(tempfile.mkdtemp(prefix="kvgrant-mutant-"))
    try:
        (work / BASE_SPEC).write_text(text)
        shutil.copy2(specdir / _MC_SPEC, work / _MC_SPEC)
        cfg = work / "MCMutant.cfg"
        cfg.write_text(_config(properties, config))
        # A liveness mutant may also deadlock (a stuck attempt); the property is the claim.
        live = any(property_kind(p) == "liveness" for p in properties)
        return run_tlc(work / _MC_SPEC, cfg, timeout=timeout, workers=workers,
                       deadlock=not live)
    finally:
        shutil.rmtree(work, ignore_errors=True)


def run_mutant(mutant: Mutant, specdir: str | Path, *, timeout: float | None = 120,
               workers: int = 1) -> TLCResult:
    """Model-check ``mutant`` against its one property on :data:`MUTANT_CONFIG`
    (:data:`MUTANT_CONFIG_PLAIN` for a mutant only a plain allocation shows; a liveness
    mutant on :data:`LIVE_CONFIG` of ``specdir``, see :func:`live_config`).

    The caller expects :func:`caught` to hold.
    """
    root = Path(specdir)
    if not (root / BASE_SPEC).is_file():
        raise ToolError(f"{root / BASE_SPEC} does not exist")
    text = apply_mutant((root / BASE_SPEC).read_text(), mutant)
    config = (live_config(root, LIVE_CONFIG) if property_kind(mutant.invariant) == "liveness"
              else MUTANT_CONFIG_PLAIN if mutant.guard in _PLAIN
              else MUTANT_CONFIG_UNDO if mutant.guard in _UNDO else MUTANT_CONFIG)
    return _check(root, text, (mutant.invariant,), timeout=timeout, workers=workers,
                  config=config)


def run_unmutated(specdir: str | Path,
                  invariants: tuple[str, ...] = SAFETY_INVARIANTS + ACTION_PROPERTIES,
                  *, timeout: float | None = 120, workers: int = 1,
                  config: str = MUTANT_CONFIG) -> TLCResult:
    """The unmutated spec on ``config`` (expected ``status == "ok"``); ``invariants``
    may name action and liveness properties too."""
    root = Path(specdir)
    return _check(root, (root / BASE_SPEC).read_text(), tuple(invariants),
                  timeout=timeout, workers=workers, config=config)


# --- the group model (specs/KVGroup.tla) ----------------------------------------------------

GROUP_SPEC = "KVGroup.tla"
_GROUP_MC_SPEC = "MCKVGroup.tla"

#: One or more mutants per property of KVGroup (TypeOK excluded): guard removals and
#: operator changes; the liveness ones run on GROUP_LIVE_CONFIG.
GROUP_MUTANTS: tuple[Mutant, ...] = (
    Mutant("decide-after-all-votes", "Agreement",
           "deciding while a live rank has not voted lets one abort and another publish"),
    Mutant("abort-after-decision", "Agreement",
           "a process aborts without having decided abort, next to one that publishes"),
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
    # operator changes in helpers the guards share (the properties are written out)
    Mutant("nothing-left-keeps-va", "NothingLeftAfterAbort",
           "the guards' NothingLeftOn forgets the VA: a process ends holding it",
           old="NothingLeftOn(p) ==\n    /\\ ~va[p]\n", new="NothingLeftOn(p) ==\n    /\\ TRUE\n"),
    Mutant("import-kinds-swapped", "PublishedHoldsPlan",
           "the guards' ImportKinds reads Aliased \\ OwnerOnly backwards: an importer "
           "publishes without the shared alias",
           old="IF a \\in Aliased \\ OwnerOnly THEN MappingKinds",
           new="IF a \\in OwnerOnly \\ Aliased THEN MappingKinds"),
    # an abort has a cause
    Mutant("abort-only-on-fault", "AbortOnlyOnFault",
           "deciding abort although every rank voted ready: a healthy group torn down"),
    Mutant("vote-failed-only-if-failed", "AbortOnlyOnFault",
           "voting failed without a failed step: the group aborts for nothing"),
    Mutant("alias-only-aliased", "PublishedHoldsPlan",
           "a plain allocation mapped into a region (runs on GROUP_MUTANT_CONFIG_PLAIN: "
           "the other configs alias every allocation)"),
    # the action properties, KVLifecycle's counterparts
    Mutant("import-unmap-newest-first", "UnwindInReverseOrder",
           "unmapping an older import while a newer one is still held"),
    Mutant("unmap-reverse-order", "UnwindInReverseOrder",
           "unmapping an older own allocation while a newer handle is live"),
    Mutant("own-after-imports", "UnwindInReverseOrder",
           "unwinding own memory while imported handles are still held"),
    Mutant("forward-order-unwind", "UnwindInReverseOrder",
           "unwinding releases the oldest own allocation first (forward order)",
           old="b > a => b \\notin created[p]", new="b < a => b \\notin created[p]",
           count=2),
    Mutant("imports-forward-order", "UnwindInReverseOrder",
           "imports unwound oldest first: LastImport reads the import order backwards",
           old="~Before(o, a, x[1], x[2])", new="~Before(x[1], x[2], o, a)"),
    Mutant("retry-failed-step", "NoRetryAfterFailure",
           "a failed step is retried silently: the process goes on after Fail",
           old="/\\ Alive(p)\n    /\\ ~failed[p]\n", new="/\\ Alive(p)\n    /\\ TRUE\n"),
    Mutant("aborted-to-allocating", "OneAttempt",
           "a second attempt: AbortComplete goes back to Allocating",
           old="/\\ phase' = [phase EXCEPT ![p] = \"Aborted\"]",
           new="/\\ phase' = [phase EXCEPT ![p] = \"Allocating\"]"),
    Mutant("unpublish-to-allocating", "OneAttempt",
           "a second attempt after publishing: Unpublish goes back to Allocating",
           old="/\\ phase' = [phase EXCEPT ![p] = \"ShuttingDown\"]",
           new="/\\ phase' = [phase EXCEPT ![p] = \"Allocating\"]"),
    Mutant("abort-forgets-failures", "OneAttempt",
           "Abort clears the process's failure flag: the failed attempt is forgotten",
           old="/\\ phase' = [phase EXCEPT ![p] = \"Aborting\"]\n    /\\ UNCHANGED <<va, "
               "created, mapped, aliasMapped, access, ready, failed, exported,",
           new="/\\ phase' = [phase EXCEPT ![p] = \"Aborting\"]\n    /\\ failed' = [failed "
               "EXCEPT ![p] = FALSE]\n    /\\ UNCHANGED <<va, created, mapped, aliasMapped, "
               "access, ready, exported,"),
    Mutant("create-after-previous-complete", "MadeInPlanOrder",
           "creating ahead of the previous allocation: unwinding in plan order is not LIFO"),
    Mutant("import-after-own", "MadeInPlanOrder",
           "a rank nobody imports from imports before its own allocations are complete"),
    Mutant("import-in-plan-order", "MadeInPlanOrder",
           "importing out of order: unwinding in import order is not LIFO",
           old="Before(o2, a2, o, a) => ImportComplete(p, o2, a2)", new="TRUE"),
    # a grant needs its mapping; an fd on the socket was exported
    Mutant("grant-needs-mapping", "AccessOnlyOwnerAndImporters",
           "cuMemSetAccess on a mapping that does not exist"),
    Mutant("send-after-export", "ImportOnlyByImporters",
           "sending an fd that was never exported"),
    # seen only when two processes fail (GROUP_MUTANT_CONFIG_TWO_FAULTS)
    Mutant("failed-votes-by-parity", "Validity",
           "the failed votes combined by parity (an all-reduce with XOR where OR was "
           "meant): two failures cancel and the group publishes",
           old="Missing = {} /\\ FailedVoters = {}",
           new="Missing = {} /\\ Cardinality(FailedVoters) % 2 = 0"),
    # --- liveness (audit of 2026-12-03): each on MCKVGroup_Live.cfg, one property per run
    Mutant("no-deadline", "SurvivorsDecide",
           "no deadline (GiveUp gone): an importer whose owner died or failed before "
           "sending waits in the receive forever",
           old="\\/ GroupStep(p) \\/ GiveUp(p)", new="\\/ GroupStep(p)"),
    Mutant("deadline-only-on-crash", "SurvivorsDecide",
           "the deadline fires for a dead owner only: an importer waits forever for an "
           "owner whose step failed before it sent",
           old="/\\ crashed[o] \\/ failed[o]", new="/\\ crashed[o]"),
    Mutant("decide-waits-for-crashed-vote", "SurvivorsDecide",
           "Decide waits for every vote, a crashed process's too: nobody decides",
           old="/\\ \\A q \\in Missing : crashed[q]", new="/\\ Missing = {}"),
    Mutant("failed-rank-never-votes", "SurvivorsDecide",
           "a process whose step failed leaves without voting: the others wait for it",
           old='/\\ v = "failed" => failed[p]', new='/\\ v = "failed" => FALSE'),
    Mutant("no-fairness", "SurvivorsDecide",
           "without weak fairness a process may stop anywhere",
           old="/\\ WF_vars(Progress)", new=""),
    Mutant("last-rank-starved", "SurvivorsDecide",
           "fairness left out for the last process: it may never be scheduled",
           old=_SPEC_FAIR,
           new="Spec == Init /\\ [][Next]_vars /\\ WF_vars(\\E p \\in Ranks \\ {NumRanks - 1} : "
               "ForwardStep(p) \\/ UnwindStep(p) \\/ GroupStep(p) \\/ GiveUp(p))"),
    Mutant("unwinding-not-fair", "SurvivorsEnd",
           "fairness left out for the unwinding steps: an aborting process may stop",
           old=_SPEC_FAIR,
           new="Spec == Init /\\ [][Next]_vars /\\ WF_vars(\\E p \\in Ranks : "
               "ForwardStep(p) \\/ GroupStep(p) \\/ GiveUp(p))"),
    Mutant("abort-waits-for-every-decision", "SurvivorsEnd",
           "Abort waits until every process has decided, a crashed one too (a barrier "
           "that counts the dead): the survivor never unwinds",
           old='/\\ decision[p] = "abort"  ',
           new='/\\ decision[p] = "abort" /\\ \\A q \\in Ranks : decision[q] # "none"  '),
    Mutant("abort-complete-waits-for-peers", "SurvivorsEnd",
           "AbortComplete waits until every other live process has aborted: two "
           "aborting processes wait for each other",
           old="/\\ phase' = [phase EXCEPT ![p] = \"Aborted\"]",
           new="/\\ \\A q \\in Ranks \\ {p} : crashed[q] \\/ phase[q] = \"Aborted\"\n"
               "    /\\ phase' = [phase EXCEPT ![p] = \"Aborted\"]"),
    Mutant("release-skips-first", "SurvivorsEnd",
           "the unwind loop stops before allocation 0 (off by one): its handle is never "
           "released, so the VA is never freed and the abort never completes",
           old="    /\\ ImportsGone(p)\n    /\\ a \\in created[p]\n",
           new="    /\\ ImportsGone(p)\n    /\\ a \\in created[p] /\\ a > 0\n"),
    Mutant("import-release-never", "SurvivorsEnd",
           "an imported handle is never released: own unwinding (after the imports) "
           "never starts",
           old="    /\\ <<o, a>> \\in imported[p]\n    /\\ \\A m \\in MappingKinds",
           new="    /\\ FALSE\n    /\\ <<o, a>> \\in imported[p]\n    /\\ \\A m \\in MappingKinds"),
    Mutant("free-only-when-aborting", "SurvivorsRelease",
           "cuMemAddressFree only while aborting: a shutdown never frees the VA",
           old="    /\\ Unwinding(p)\n    /\\ ImportsGone(p)\n    /\\ va[p]\n",
           new="    /\\ phase[p] = \"Aborting\" /\\ Alive(p)\n    /\\ ImportsGone(p)\n"
               "    /\\ va[p]\n"),
    Mutant("unpublish-never", "SurvivorsRelease",
           "Unpublish never runs: a published process never releases its memory",
           old="Unpublish(p) ==\n    /\\ phase[p] = \"Published\"",
           new="Unpublish(p) ==\n    /\\ FALSE"),
    Mutant("unpublish-waits-for-peers", "SurvivorsRelease",
           "Unpublish waits until every other live process is shutting down: published "
           "processes wait for each other",
           old="/\\ phase' = [phase EXCEPT ![p] = \"ShuttingDown\"]",
           new="/\\ \\A q \\in Ranks \\ {p} : crashed[q] \\/ phase[q] \\in "
               "{\"ShuttingDown\", \"Shutdown\"}\n"
               "    /\\ phase' = [phase EXCEPT ![p] = \"ShuttingDown\"]"),
    Mutant("shutdown-waits-for-published-peers", "SurvivorsRelease",
           "ShutdownComplete waits until every peer that decided publish has unpublished, "
           "a peer that crashed after deciding too (seen only since the Live config "
           "explores crashes after Decide)",
           old="/\\ phase' = [phase EXCEPT ![p] = \"Shutdown\"]",
           new="/\\ \\A q \\in Ranks \\ {p} : decision[q] = \"publish\" => phase[q] \\in "
               "{\"ShuttingDown\", \"Shutdown\"}\n"
               "    /\\ phase' = [phase EXCEPT ![p] = \"Shutdown\"]"),
    Mutant("abort-complete-when-empty", "SurvivorsRelease",
           "the abort declared complete while the process holds objects: unwinding stops "
           "there and they are never released"),
    # failed undo steps (2026-12-07; on GROUP_MUTANT_CONFIG_UNDO: one failed undo)
    Mutant("undo-never-retried", "LeakedStayLive",
           "an imported mapping whose cuMemUnmap failed is unmapped after all (a silent "
           "retry): what the runtime reports left live is gone"),
    Mutant("free-after-unmap", "AliasNeverOutlivesBacking",
           "cuMemAddressFree succeeds with a leaked own mapping still in the VA range (the "
           "driver refuses it)"),
    Mutant("complete-after-every-undo", "UndoFailureNeverCompletes",
           "AbortComplete once every undo ran, failed ones too (the runtime mutant "
           "'AbortComplete traced although an undo failed', group.py _abort)",
           old=("    /\\ NothingLeftOn(p)" + " " * 30
                + "\\* @guard abort-complete-when-empty\n"),
           new="    /\\ LiveObjects(p) \\subseteq leaked[p]\n"),
)

#: Liveness properties of KVGroup (checked on GROUP_LIVE_CONFIG, one per run).
GROUP_LIVENESS_PROPERTIES: tuple[str, ...] = ("SurvivorsDecide", "SurvivorsEnd",
                                              "SurvivorsRelease")

#: The action properties of KVGroup: the lifecycle's, stated per process, and the plan
#: order of making (which the lifecycle's undo stack holds).
#: (Not ReservedBeforeAnyCreate: each process reserves for itself, and waits for no
#: other process's VA before it creates.)
GROUP_ACTION_PROPERTIES: tuple[str, ...] = ("OneAttempt", "NoRetryAfterFailure",
                                            "UnwindInReverseOrder", "MadeInPlanOrder")

#: The safety invariants of KVGroup.
GROUP_SAFETY_INVARIANTS: tuple[str, ...] = (
    "TypeOK", "Agreement", "Validity", "OwnerGrantsOnlyOwnDevice",
    "ImporterGrantsOnlyOwnDevice", "ImportOnlyByImporters", "MapOnlyImported",
    "AccessOnlyOwnerAndImporters", "AliasNeverOutlivesBacking", "PublishedHoldsPlan",
    "NothingLeftAfterAbort", "NothingLeftAfterShutdown", "AbortOnlyOnFault",
    "LeakedStayLive", "UndoFailureNeverCompletes")

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

#: GROUP_MUTANT_CONFIG with allocation 0 plain (not aliased), for mutants only a plain
#: allocation shows.
GROUP_MUTANT_CONFIG_PLAIN = GROUP_MUTANT_CONFIG.replace(
    "Aliased = {0, 1}\n    OwnerOnly = {1}", "Aliased = {1}\n    OwnerOnly = {}")
_GROUP_PLAIN = frozenset({"alias-only-aliased"})

#: GROUP_MUTANT_CONFIG with up to two faults (specs/MCKVGroup_TwoFaults.cfg's
#: constraint), for mutants that show only when both processes fail.
GROUP_MUTANT_CONFIG_TWO_FAULTS = GROUP_MUTANT_CONFIG.replace(
    "CONSTRAINT MCOneFault", "CONSTRAINT MCTwoFaults")
_GROUP_TWO_FAULTS = frozenset({"failed-votes-by-parity"})

#: GROUP_MUTANT_CONFIG with one failed undo step (specs/MCKVGroup_Undo.cfg's bound), for
#: the mutants only a failed undo shows.
GROUP_MUTANT_CONFIG_UNDO = GROUP_MUTANT_CONFIG.replace(
    "    DeclaredReaders <- MCDeclaredReaders\n",
    "    DeclaredReaders <- MCDeclaredReaders\n    MaxUndoFailures <- MCOneUndoFailure\n")
_GROUP_UNDO = frozenset({"undo-never-retried", "free-after-unmap",
                         "complete-after-every-undo"})


def _check_group(specdir: Path, text: str, invariants: tuple[str, ...], *,
                 timeout: float | None, workers: int,
                 config: str = GROUP_MUTANT_CONFIG) -> TLCResult:
    work = Path(tempfile.mkdtemp(prefix="kvgrant-group-mutant-"))
    try:
        (work / GROUP_SPEC).write_text(text)
        shutil.copy2(specdir / _GROUP_MC_SPEC, work / _GROUP_MC_SPEC)
        cfg = work / "MCMutant.cfg"
        cfg.write_text(_config(invariants, config))
        live = any(property_kind(p) == "liveness" for p in invariants)
        return run_tlc(work / _GROUP_MC_SPEC, cfg, timeout=timeout, workers=workers,
                       deadlock=not live)
    finally:
        shutil.rmtree(work, ignore_errors=True)


def run_group_mutant(mutant: Mutant, specdir: str | Path, *, timeout: float | None = 300,
                     workers: int = 1) -> TLCResult:
    """Model-check a KVGroup ``mutant`` against its property on GROUP_MUTANT_CONFIG (a
    liveness mutant on :data:`GROUP_LIVE_CONFIG` of ``specdir``, see :func:`live_config`)."""
    root = Path(specdir)
    if not (root / GROUP_SPEC).is_file():
        raise ToolError(f"{root / GROUP_SPEC} does not exist")
    text = apply_mutant((root / GROUP_SPEC).read_text(), mutant)
    config = (live_config(root, GROUP_LIVE_CONFIG)
              if property_kind(mutant.invariant) == "liveness"
              else GROUP_MUTANT_CONFIG_3 if mutant.guard in _THREE_RANKS
              else GROUP_MUTANT_CONFIG_PLAIN if mutant.guard in _GROUP_PLAIN
              else GROUP_MUTANT_CONFIG_TWO_FAULTS if mutant.guard in _GROUP_TWO_FAULTS
              else GROUP_MUTANT_CONFIG_UNDO if mutant.guard in _GROUP_UNDO
              else GROUP_MUTANT_CONFIG)
    return _check_group(root, text, (mutant.invariant,), timeout=timeout, workers=workers,
                        config=config)


def run_group_unmutated(specdir: str | Path,
                        invariants: tuple[str, ...] = (GROUP_SAFETY_INVARIANTS
                                                       + GROUP_ACTION_PROPERTIES), *,
                        timeout: float | None = 300, workers: int = 1,
                        config: str = GROUP_MUTANT_CONFIG) -> TLCResult:
    """The unmutated KVGroup on ``config`` (expected ``status == "ok"``); ``invariants``
    may name action properties too."""
    root = Path(specdir)
    return _check_group(root, (root / GROUP_SPEC).read_text(), tuple(invariants),
                        timeout=timeout, workers=workers, config=config)
