------------------------------- MODULE KVGroup -------------------------------
(***************************************************************************)
(* The KV-cache lifecycle of a group of processes, one rank each (the     *)
(* form serving engines run): every process makes its own plan, exports   *)
(* one fd per allocation and sends it (SCM_RIGHTS) only to its validated  *)
(* importers; an importer imports, maps into its own VA and grants its    *)
(* own device only.  The group decides like TwoPhase.tla: every process   *)
(* votes ready or failed in one all-gather (Vote), then each decides      *)
(* (Decide) publish iff every rank voted ready, else every process        *)
(* unwinds what it made and imported.  A process may crash at any point  *)
(* (Crash); the others name it missing after the deadline and abort.      *)
(*                                                                         *)
(* One action per runtime step, with the trace's names (docs/group-       *)
(* trace.md).  Each process follows the order of that document: own       *)
(* allocations in plan order (each complete before the next Create), then *)
(* Export + Send per allocation, then imports per owner (ascending) and   *)
(* allocation, RankReady, Vote, Decide, Publish or Abort; unwinding is    *)
(* LIFO, imports first.  Any step of the forward path may fail (Fail); a  *)
(* process that fails does nothing more before its Vote (ready: false).   *)
(* An undo step may fail too (UndoFail, at most MaxUndoFailures in all):  *)
(* the object is leaked (stays live, never undone again), the process     *)
(* goes on with the rest of its undo stack in the same order, and never   *)
(* reaches AbortComplete / ShutdownComplete.                              *)
(* An importer whose owner will never send (crashed, or failed before     *)
(* sending) gives up after the deadline: a failed Import, which is fair.  *)
(*                                                                         *)
(* Omitted: byte ranges and VA values; fd closing (Export/Send are        *)
(* counted, not unwound); the owner's memory after its crash (the OS      *)
(* frees it; claims about leftovers are about surviving processes);       *)
(* retries (none: one attempt); a late rank that answers after being     *)
(* named missing (a rank named missing never votes).                      *)
(*                                                                         *)
(* Tags  \* @guard <name>  mark conjuncts a safety invariant relies on;   *)
(* kvgrant.conformance.spec_mutants removes one at a time (GROUP_MUTANTS) *)
(* and expects TLC to report that property.  One tag per line.            *)
(***************************************************************************)
EXTENDS Naturals, FiniteSets

CONSTANTS
    NumRanks,         \* processes of the group, one rank each
    NumAllocs,        \* allocations of the plan (same plan on every rank)
    Aliased,          \* allocations that are also mapped into a region
    OwnerOnly,        \* aliased allocations whose region has access: owner
    Importers,        \* Importers[o]: ranks whose validated imports map o's memory
    DeclaredReaders   \* DeclaredReaders[o]: readers declared by exported metadata

Ranks  == 0..(NumRanks - 1)
Allocs == 0..(NumAllocs - 1)

ASSUME NumRanks \in Nat \ {0}
ASSUME NumAllocs \in Nat \ {0}
ASSUME Aliased \subseteq Allocs
ASSUME OwnerOnly \subseteq Aliased
ASSUME \A r \in Ranks : Importers[r] \subseteq Ranks \ {r}
ASSUME \A r \in Ranks : Importers[r] \subseteq DeclaredReaders[r]
                        /\ DeclaredReaders[r] \subseteq Ranks

Phases == {"Allocating", "Published", "Aborting", "Aborted",
           "ShuttingDown", "Shutdown"}
MappingKinds == {"plane", "alias"}
Votes == {"none", "ready", "failed"}
Decisions == {"none", "publish", "abort"}

\* The forward steps that can fail (the x of Fail(p, x)).
FailSteps == {"Reserve", "Create", "Map", "MapAlias", "Grant", "Export", "Send",
              "Import", "ImportMap", "ImportGrant"}

\* The objects of a process as its undo stack names them, for the failed undos:
\* own <<"va", p, 0>>, <<"handle", p, a>>, <<"plane", p, a>>, <<"alias", p, a>>;
\* imported from owner o <<"ihandle", o, a>>, <<"iplane", o, a>>, <<"ialias", o, a>>.
ObjectKinds == {"va", "handle", "plane", "alias", "ihandle", "iplane", "ialias"}
LeakObjects == ObjectKinds \X Ranks \X Allocs
ImportKind(m) == IF m = "handle" THEN "ihandle" ELSE IF m = "plane" THEN "iplane" ELSE "ialias"

\* How many undo steps may fail in one run of the group, over all processes (a
\* failed Free that the driver must refuse, because a leaked mapping is still
\* in the VA range, is not counted).  A definition that a config overrides
\* (MaxUndoFailures <- ...): the default 0 turns undo failures off (the
\* liveness configs need that: a leaked object is never released); trace
\* validation allows any number, MCKVGroup_Undo.cfg one.
MaxUndoFailures == 0

\* Owners whose memory rank p imports (p is one of their validated importers).
\* (A constant function, so TLC evaluates it once.)
SourcesOf == [p \in Ranks |-> {o \in Ranks : p \in Importers[o]}]
Sources(p) == SourcesOf[p]

\* Mappings of an own allocation, and of an imported one (an importer maps
\* the alias only of regions with access: importers).
OwnKinds(a) == IF a \in Aliased THEN MappingKinds ELSE {"plane"}
ImportKinds(a) == IF a \in Aliased \ OwnerOnly THEN MappingKinds ELSE {"plane"}

\* Import order: owner ascending, then allocation.
Before(o1, a1, o2, a2) == o1 < o2 \/ (o1 = o2 /\ a1 < a2)

VARIABLES
    phase,         \* phase[p]: this process's phase, one of Phases
    va,            \* va[p]: p holds its VA reservation
    created,       \* created[p]: own allocations whose handle is live
    mapped,        \* mapped[p]: own allocations mapped into their plane
    aliasMapped,   \* aliasMapped[p]: own allocations mapped into their region
    access,        \* access[p]: <<a, m, d>>: mapping m of own a accessible by device d
    ready,         \* ready[p]: p finished its whole part (RankReady)
    failed,        \* failed[p]: a forward step of p failed
    exported,      \* exported[p]: own allocations exported as an fd
    sent,          \* <<o, a, i>>: o sent the fd of a to i (the Unix socket)
    imported,      \* imported[p]: <<o, a>>: p holds an imported handle of o's a
    importMapped,  \* importMapped[p]: <<o, a, m>>: p mapped mapping m of o's a
    importAccess,  \* importAccess[p]: <<o, a, m, d>>: that mapping accessible by d
    vote,          \* vote[p]: what p contributed to the all-gather
    decision,      \* decision[p]: what p decided
    crashed,       \* crashed[p]: p died (takes no step again)
    leaked         \* leaked[p]: objects of p whose undo failed (LeakObjects):
                   \* still live, never undone again

vars == <<phase, va, created, mapped, aliasMapped, access, ready, failed, exported,
          sent, imported, importMapped, importAccess, vote, decision, crashed, leaked>>

TypeOK ==
    /\ phase \in [Ranks -> Phases]
    /\ va \in [Ranks -> BOOLEAN]
    /\ created \in [Ranks -> SUBSET Allocs]
    /\ mapped \in [Ranks -> SUBSET Allocs]
    /\ aliasMapped \in [Ranks -> SUBSET Allocs]
    /\ access \in [Ranks -> SUBSET (Allocs \X MappingKinds \X Ranks)]
    /\ ready \in [Ranks -> BOOLEAN]
    /\ failed \in [Ranks -> BOOLEAN]
    /\ exported \in [Ranks -> SUBSET Allocs]
    /\ sent \subseteq Ranks \X Allocs \X Ranks
    /\ imported \in [Ranks -> SUBSET (Ranks \X Allocs)]
    /\ importMapped \in [Ranks -> SUBSET (Ranks \X Allocs \X MappingKinds)]
    /\ importAccess \in [Ranks -> SUBSET (Ranks \X Allocs \X MappingKinds \X Ranks)]
    /\ vote \in [Ranks -> Votes]
    /\ decision \in [Ranks -> Decisions]
    /\ crashed \in [Ranks -> BOOLEAN]
    /\ leaked \in [Ranks -> SUBSET LeakObjects]

-----------------------------------------------------------------------------
(* Helpers *)

HasMapping(p, a, m) ==
    IF m = "plane" THEN a \in mapped[p] ELSE a \in aliasMapped[p]

\* Set tests, not \E d (TLC would enumerate one successor per witness).
Granted(p, a, m) == {d \in Ranks : <<a, m, d>> \in access[p]} # {}
ImportGranted(p, o, a, m) == {d \in Ranks : <<o, a, m, d>> \in importAccess[p]} # {}

\* Own allocation a is created, mapped (twice if aliased) and granted.
Complete(p, a) ==
    /\ a \in created[p]
    /\ a \in mapped[p]
    /\ a \in Aliased => a \in aliasMapped[p]
    /\ \A m \in OwnKinds(a) : Granted(p, a, m)

OwnDone(p) == va[p] /\ \A a \in Allocs : Complete(p, a)

\* Own allocation a is exported and sent to every validated importer (vacuous for a
\* rank nobody imports from: it exports nothing).
SentAll(p, a) == Importers[p] = {}
                 \/ (a \in exported[p] /\ \A i \in Importers[p] : <<p, a, i>> \in sent)
Shared(p) == \A a \in Allocs : SentAll(p, a)

ImportComplete(p, o, a) ==
    /\ <<o, a>> \in imported[p]
    /\ \A m \in ImportKinds(a) : <<o, a, m>> \in importMapped[p]
                                 /\ ImportGranted(p, o, a, m)

ImportsDone(p) == \A o \in Sources(p), a \in Allocs : ImportComplete(p, o, a)

\* p holds everything it made and imported (what publishing relies on).
HoldsPlan(p) == OwnDone(p) /\ ImportsDone(p)

\* Process p holds no driver object at all, imported handles included.
NothingLeftOn(p) ==
    /\ ~va[p]
    /\ created[p] = {}
    /\ mapped[p] = {}
    /\ aliasMapped[p] = {}
    /\ access[p] = {}
    /\ imported[p] = {}
    /\ importMapped[p] = {}
    /\ importAccess[p] = {}

Alive(p) == ~crashed[p]
Unwinding(p) == phase[p] \in {"Aborting", "ShuttingDown"} /\ Alive(p)

-----------------------------------------------------------------------------
Init ==
    /\ phase = [p \in Ranks |-> "Allocating"]
    /\ va = [p \in Ranks |-> FALSE]
    /\ created = [p \in Ranks |-> {}]
    /\ mapped = [p \in Ranks |-> {}]
    /\ aliasMapped = [p \in Ranks |-> {}]
    /\ access = [p \in Ranks |-> {}]
    /\ ready = [p \in Ranks |-> FALSE]
    /\ failed = [p \in Ranks |-> FALSE]
    /\ exported = [p \in Ranks |-> {}]
    /\ sent = {}
    /\ imported = [p \in Ranks |-> {}]
    /\ importMapped = [p \in Ranks |-> {}]
    /\ importAccess = [p \in Ranks |-> {}]
    /\ vote = [p \in Ranks |-> "none"]
    /\ decision = [p \in Ranks |-> "none"]
    /\ crashed = [p \in Ranks |-> FALSE]
    /\ leaked = [p \in Ranks |-> {}]

-----------------------------------------------------------------------------
(* Forward steps: guards shared by each step and its failure Fail(p, x).  *)

\* p may take a forward step: before its vote, not failed, alive.
CanDrive(p) ==
    /\ phase[p] = "Allocating"
    /\ Alive(p)
    /\ ~failed[p]
    /\ vote[p] = "none"

CanReserve(p) == CanDrive(p) /\ ~va[p]

CanCreate(p, a) ==
    /\ CanDrive(p)
    /\ va[p]
    /\ a \notin created[p]
    /\ \A b \in Allocs : b < a => Complete(p, b)   \* @guard create-after-previous-complete

CanMap(p, a) ==
    /\ CanDrive(p)
    /\ a \in created[p]
    /\ a \notin mapped[p]

CanMapAlias(p, a) ==
    /\ CanDrive(p)
    /\ a \in Aliased                                \* @guard alias-only-aliased
    /\ a \in mapped[p]                               \* @guard alias-after-backing
    /\ a \in created[p]
    /\ a \notin aliasMapped[p]

CanGrant(p, a, m) ==
    /\ CanDrive(p)
    /\ m \in MappingKinds
    /\ HasMapping(p, a, m)                           \* @guard grant-needs-mapping
    /\ ~Granted(p, a, m)

CanExport(p, a) ==
    /\ CanDrive(p)
    /\ Importers[p] # {}
    /\ OwnDone(p)
    /\ a \notin exported[p]
    /\ \A b \in Allocs : b < a => SentAll(p, b)

CanSend(p, a, i) ==
    /\ CanDrive(p)
    /\ i \in Ranks \ {p}
    /\ a \in exported[p]                             \* @guard send-after-export
    /\ <<p, a, i>> \notin sent

CanImport(p, o, a) ==
    /\ CanDrive(p)
    /\ o \in Ranks \ {p}
    /\ OwnDone(p)                                    \* @guard import-after-own
    /\ Shared(p)                                     \* own fds sent before importing
    /\ <<o, a>> \notin imported[p]
    /\ \A o2 \in Sources(p), a2 \in Allocs :          \* import order
          Before(o2, a2, o, a) => ImportComplete(p, o2, a2)

CanImportMap(p, o, a, m) ==
    /\ CanDrive(p)
    /\ m \in MappingKinds
    /\ <<o, a>> \in imported[p]                      \* @guard import-map-after-import
    /\ <<o, a, m>> \notin importMapped[p]
    /\ m = "alias" => a \in Aliased \ OwnerOnly      \* @guard import-alias-only-shared
    /\ m = "alias" => <<o, a, "plane">> \in importMapped[p]

CanImportGrant(p, o, a, m) ==
    /\ CanDrive(p)
    /\ <<o, a, m>> \in importMapped[p]
    /\ ~ImportGranted(p, o, a, m)

\* The forward step x of p could run now (for some arguments).  A failed
\* Import needs no Send: it is how a receive that timed out is recorded.
StepEnabled(p, x) ==
    CASE x = "Reserve"     -> CanReserve(p)
      [] x = "Create"      -> \E a \in Allocs : CanCreate(p, a)
      [] x = "Map"         -> \E a \in Allocs : CanMap(p, a)
      [] x = "MapAlias"    -> \E a \in Allocs : CanMapAlias(p, a)
      [] x = "Grant"       -> \E a \in Allocs, m \in MappingKinds : CanGrant(p, a, m)
      [] x = "Export"      -> \E a \in Allocs : CanExport(p, a)
      [] x = "Send"        -> \E a \in Allocs, i \in Importers[p] : CanSend(p, a, i)
      [] x = "Import"      -> \E o \in Sources(p), a \in Allocs : CanImport(p, o, a)
      [] x = "ImportMap"   -> \E o \in Ranks, a \in Allocs, m \in MappingKinds :
                                  CanImportMap(p, o, a, m)
      [] x = "ImportGrant" -> \E o \in Ranks, a \in Allocs, m \in MappingKinds :
                                  CanImportGrant(p, o, a, m)
      [] OTHER             -> FALSE

Reserve(p) ==
    /\ CanReserve(p)
    /\ va' = [va EXCEPT ![p] = TRUE]
    /\ UNCHANGED <<phase, created, mapped, aliasMapped, access, ready, failed, exported,
                   sent, imported, importMapped, importAccess, vote, decision, crashed,
                   leaked>>

Create(p, a) ==
    /\ CanCreate(p, a)
    /\ created' = [created EXCEPT ![p] = @ \cup {a}]
    /\ UNCHANGED <<phase, va, mapped, aliasMapped, access, ready, failed, exported,
                   sent, imported, importMapped, importAccess, vote, decision, crashed,
                   leaked>>

Map(p, a) ==
    /\ CanMap(p, a)
    /\ mapped' = [mapped EXCEPT ![p] = @ \cup {a}]
    /\ UNCHANGED <<phase, va, created, aliasMapped, access, ready, failed, exported,
                   sent, imported, importMapped, importAccess, vote, decision, crashed,
                   leaked>>

MapAlias(p, a) ==
    /\ CanMapAlias(p, a)
    /\ aliasMapped' = [aliasMapped EXCEPT ![p] = @ \cup {a}]
    /\ UNCHANGED <<phase, va, created, mapped, access, ready, failed, exported,
                   sent, imported, importMapped, importAccess, vote, decision, crashed,
                   leaked>>

\* The owner grants its own device only (its importers grant theirs).
Grant(p, a, m) ==
    /\ CanGrant(p, a, m)
    /\ \E D \in SUBSET ({p} \cup DeclaredReaders[p]) :
          /\ D = {p}                                 \* @guard grant-own-device
          /\ access' = [access EXCEPT ![p] = @ \cup {<<a, m, d>> : d \in D}]
    /\ UNCHANGED <<phase, va, created, mapped, aliasMapped, ready, failed, exported,
                   sent, imported, importMapped, importAccess, vote, decision, crashed,
                   leaked>>

Export(p, a) ==
    /\ CanExport(p, a)
    /\ exported' = [exported EXCEPT ![p] = @ \cup {a}]
    /\ UNCHANGED <<phase, va, created, mapped, aliasMapped, access, ready, failed,
                   sent, imported, importMapped, importAccess, vote, decision, crashed,
                   leaked>>

Send(p, a, i) ==
    /\ CanSend(p, a, i)
    /\ i \in Importers[p]                            \* @guard send-only-to-importers
    /\ sent' = sent \cup {<<p, a, i>>}
    /\ UNCHANGED <<phase, va, created, mapped, aliasMapped, access, ready, failed,
                   exported, imported, importMapped, importAccess, vote, decision,
                   crashed, leaked>>

Import(p, o, a) ==
    /\ CanImport(p, o, a)
    /\ <<o, a, p>> \in sent                          \* @guard import-after-send
    /\ imported' = [imported EXCEPT ![p] = @ \cup {<<o, a>>}]
    /\ UNCHANGED <<phase, va, created, mapped, aliasMapped, access, ready, failed,
                   exported, sent, importMapped, importAccess, vote, decision, crashed,
                   leaked>>

ImportMap(p, o, a, m) ==
    /\ CanImportMap(p, o, a, m)
    /\ importMapped' = [importMapped EXCEPT ![p] = @ \cup {<<o, a, m>>}]
    /\ UNCHANGED <<phase, va, created, mapped, aliasMapped, access, ready, failed,
                   exported, sent, imported, importAccess, vote, decision, crashed,
                   leaked>>

\* An importer grants its own device only.
ImportGrant(p, o, a, m) ==
    /\ CanImportGrant(p, o, a, m)
    /\ \E D \in SUBSET ({p} \cup DeclaredReaders[o]) :
          /\ D = {p}                                 \* @guard import-grant-own-device
          /\ importAccess' = [importAccess EXCEPT ![p] = @ \cup {<<o, a, m, d>> : d \in D}]
    /\ UNCHANGED <<phase, va, created, mapped, aliasMapped, access, ready, failed,
                   exported, sent, imported, importMapped, vote, decision, crashed,
                   leaked>>

RankReady(p) ==
    /\ CanDrive(p)
    /\ ~ready[p]
    /\ OwnDone(p) /\ Shared(p) /\ ImportsDone(p)     \* @guard ready-after-imports
    /\ ready' = [ready EXCEPT ![p] = TRUE]
    /\ UNCHANGED <<phase, va, created, mapped, aliasMapped, access, failed, exported,
                   sent, imported, importMapped, importAccess, vote, decision, crashed,
                   leaked>>

\* Forward step x of p failed: nothing changes but the failure flag.
Fail(p, x) ==
    /\ x \in FailSteps
    /\ StepEnabled(p, x)
    /\ failed' = [failed EXCEPT ![p] = TRUE]
    /\ UNCHANGED <<phase, va, created, mapped, aliasMapped, access, ready, exported,
                   sent, imported, importMapped, importAccess, vote, decision, crashed,
                   leaked>>

\* The deadline: an importer whose owner will never send (crashed, or failed
\* before sending) stops waiting; its Import fails.  Fair, unlike Fail.
GiveUp(p) ==
    /\ \E o \in Sources(p), a \in Allocs :
          /\ CanImport(p, o, a)
          /\ <<o, a, p>> \notin sent
          /\ crashed[o] \/ failed[o]
    /\ failed' = [failed EXCEPT ![p] = TRUE]
    /\ UNCHANGED <<phase, va, created, mapped, aliasMapped, access, ready, exported,
                   sent, imported, importMapped, importAccess, vote, decision, crashed,
                   leaked>>

Crash(p) ==
    /\ Alive(p)
    /\ phase[p] \notin {"Aborted", "Shutdown"}
    /\ crashed' = [crashed EXCEPT ![p] = TRUE]
    /\ UNCHANGED <<phase, va, created, mapped, aliasMapped, access, ready, failed,
                   exported, sent, imported, importMapped, importAccess, vote, decision,
                   leaked>>

-----------------------------------------------------------------------------
(* The group decision: one all-gather of votes, then each process decides. *)

\* p's contribution: ready once RankReady ran, failed once a step failed.
Vote(p, v) ==
    /\ phase[p] = "Allocating"
    /\ Alive(p)
    /\ vote[p] = "none"
    /\ v \in {"ready", "failed"}
    /\ v = "ready" => ready[p] /\ ~failed[p]         \* @guard vote-ready-only-if-ready
    /\ v = "failed" => failed[p]                     \* @guard vote-failed-only-if-failed
    /\ vote' = [vote EXCEPT ![p] = v]
    /\ UNCHANGED <<phase, va, created, mapped, aliasMapped, access, ready, failed,
                   exported, sent, imported, importMapped, importAccess, decision,
                   crashed, leaked>>

\* Ranks without a vote (named missing) and ranks that voted failed.
Missing == {q \in Ranks : vote[q] = "none"}
FailedVoters == {q \in Ranks : vote[q] = "failed"}

\* p decides d; a rank is named missing only once it is dead (the deadline).
Decide(p, d) ==
    /\ phase[p] = "Allocating"
    /\ Alive(p)
    /\ vote[p] # "none"
    /\ decision[p] = "none"
    /\ d \in {"publish", "abort"}
    /\ \A q \in Missing : crashed[q]                 \* @guard decide-after-all-votes
    /\ d = "publish" => Missing = {} /\ FailedVoters = {}  \* @guard publish-only-if-all-ready
    /\ d = "abort" => Missing # {} \/ FailedVoters # {}  \* @guard abort-only-on-fault
    /\ decision' = [decision EXCEPT ![p] = d]
    /\ UNCHANGED <<phase, va, created, mapped, aliasMapped, access, ready, failed,
                   exported, sent, imported, importMapped, importAccess, vote, crashed,
                   leaked>>

Publish(p) ==
    /\ phase[p] = "Allocating"
    /\ Alive(p)
    /\ decision[p] = "publish"
    /\ phase' = [phase EXCEPT ![p] = "Published"]
    /\ UNCHANGED <<va, created, mapped, aliasMapped, access, ready, failed, exported,
                   sent, imported, importMapped, importAccess, vote, decision, crashed,
                   leaked>>

Abort(p) ==
    /\ phase[p] = "Allocating"
    /\ Alive(p)
    /\ decision[p] = "abort"                          \* @guard abort-after-decision
    /\ phase' = [phase EXCEPT ![p] = "Aborting"]
    /\ UNCHANGED <<va, created, mapped, aliasMapped, access, ready, failed, exported,
                   sent, imported, importMapped, importAccess, vote, decision, crashed,
                   leaked>>

Unpublish(p) ==
    /\ phase[p] = "Published"
    /\ Alive(p)
    /\ phase' = [phase EXCEPT ![p] = "ShuttingDown"]
    /\ UNCHANGED <<va, created, mapped, aliasMapped, access, ready, failed, exported,
                   sent, imported, importMapped, importAccess, vote, decision, crashed,
                   leaked>>

-----------------------------------------------------------------------------
(* Unwinding (after Abort or Unpublish), LIFO: imports first, the last    *)
(* import first; then own objects as in KVLifecycle.  An undo may fail    *)
(* (UndoFail): its object is leaked (stays live, never undone again) and  *)
(* the process goes on with the next undo, as the runtime's Transaction   *)
(* does; the guards read a leaked object as gone for the order, but the   *)
(* driver's own refusal stays: no VA is freed with a mapping in it.       *)

\* p's own object, and the object of p's import of o's a (kind m: "handle",
\* "plane", "alias"), as leaked[p] names them.
Own(p, k, a) == <<k, p, a>>
Imp(o, a, m) == <<ImportKind(m), o, a>>

\* No import later than <<o, a>> is still held (but a leaked one).
LastImport(p, o, a) ==
    \A x \in imported[p] : ~Before(o, a, x[1], x[2]) \/ Imp(x[1], x[2], "handle") \in leaked[p]

\* Every import is unwound (or leaked): own unwinding may start.
ImportsGone(p) ==
    \A x \in imported[p] : Imp(x[1], x[2], "handle") \in leaked[p]

\* The undo of each object is due (shared by the step and its UndoFail).
CanImportUnmap(p, o, a, m) ==
    /\ Unwinding(p)
    /\ <<o, a, m>> \in importMapped[p]
    /\ Imp(o, a, m) \notin leaked[p]                 \* @guard undo-never-retried
    /\ m = "plane" => <<o, a, "alias">> \notin importMapped[p] \/ Imp(o, a, "alias") \in leaked[p]  \* @guard import-unmap-alias-before-backing
    /\ LastImport(p, o, a)                           \* @guard import-unmap-newest-first

CanImportRelease(p, o, a) ==
    /\ Unwinding(p)
    /\ <<o, a>> \in imported[p]
    /\ \A m \in MappingKinds : <<o, a, m>> \notin importMapped[p] \/ Imp(o, a, m) \in leaked[p]  \* @guard import-release-after-unmap
    /\ Imp(o, a, "handle") \notin leaked[p]
    /\ LastImport(p, o, a)

CanUnmap(p, a, m) ==
    /\ Unwinding(p)                                  \* @guard unmap-only-unwinding
    /\ ImportsGone(p)                                \* @guard own-after-imports
    /\ m \in MappingKinds
    /\ HasMapping(p, a, m)
    /\ Own(p, m, a) \notin leaked[p]
    /\ m = "plane" => a \notin aliasMapped[p] \/ Own(p, "alias", a) \in leaked[p]  \* @guard unmap-alias-before-backing
    /\ \A b \in Allocs : b > a => b \notin created[p] \/ Own(p, "handle", b) \in leaked[p]  \* @guard unmap-reverse-order

CanRelease(p, a) ==
    /\ Unwinding(p)
    /\ ImportsGone(p)
    /\ a \in created[p]
    /\ a \notin mapped[p] \/ Own(p, "plane", a) \in leaked[p]
    /\ a \notin aliasMapped[p] \/ Own(p, "alias", a) \in leaked[p]
    /\ Own(p, "handle", a) \notin leaked[p]
    /\ \A b \in Allocs : b > a => b \notin created[p] \/ Own(p, "handle", b) \in leaked[p]

CanFree(p) ==
    /\ Unwinding(p)
    /\ ImportsGone(p)
    /\ va[p]
    /\ Own(p, "va", 0) \notin leaked[p]
    /\ \A a \in created[p] : Own(p, "handle", a) \in leaked[p]
    /\ \A a \in mapped[p] : Own(p, "plane", a) \in leaked[p]
    /\ \A a \in aliasMapped[p] : Own(p, "alias", a) \in leaked[p]
    /\ \A x \in importMapped[p] : Imp(x[1], x[2], x[3]) \in leaked[p]

ImportUnmap(p, o, a, m) ==
    /\ CanImportUnmap(p, o, a, m)
    /\ importMapped' = [importMapped EXCEPT ![p] = @ \ {<<o, a, m>>}]
    /\ importAccess' = [importAccess EXCEPT ![p] =
                           {g \in @ : ~(g[1] = o /\ g[2] = a /\ g[3] = m)}]
    /\ UNCHANGED <<phase, va, created, mapped, aliasMapped, access, ready, failed,
                   exported, sent, imported, vote, decision, crashed, leaked>>

\* cuMemRelease of an imported handle; with a leaked mapping still live it
\* succeeds (the memory goes with the last mapping).
ImportRelease(p, o, a) ==
    /\ CanImportRelease(p, o, a)
    /\ imported' = [imported EXCEPT ![p] = @ \ {<<o, a>>}]
    /\ UNCHANGED <<phase, va, created, mapped, aliasMapped, access, ready, failed,
                   exported, sent, importMapped, importAccess, vote, decision, crashed,
                   leaked>>

Unmap(p, a, m) ==
    /\ CanUnmap(p, a, m)
    /\ IF m = "plane"
          THEN /\ mapped' = [mapped EXCEPT ![p] = @ \ {a}]
               /\ UNCHANGED aliasMapped
          ELSE /\ aliasMapped' = [aliasMapped EXCEPT ![p] = @ \ {a}]
               /\ UNCHANGED mapped
    /\ access' = [access EXCEPT ![p] = {g \in @ : ~(g[1] = a /\ g[2] = m)}]
    /\ UNCHANGED <<phase, va, created, ready, failed, exported, sent, imported,
                   importMapped, importAccess, vote, decision, crashed, leaked>>

Release(p, a) ==
    /\ CanRelease(p, a)
    /\ created' = [created EXCEPT ![p] = @ \ {a}]
    /\ UNCHANGED <<phase, va, mapped, aliasMapped, access, ready, failed, exported,
                   sent, imported, importMapped, importAccess, vote, decision, crashed,
                   leaked>>

\* cuMemAddressFree; the driver refuses it while a (leaked) mapping, own or
\* imported, is in the range.
Free(p) ==
    /\ CanFree(p)
    /\ mapped[p] = {} /\ aliasMapped[p] = {}         \* @guard free-after-unmap
    /\ importMapped[p] = {}
    /\ va' = [va EXCEPT ![p] = FALSE]
    /\ ready' = [ready EXCEPT ![p] = FALSE]
    /\ UNCHANGED <<phase, created, mapped, aliasMapped, access, failed, exported,
                   sent, imported, importMapped, importAccess, vote, decision, crashed,
                   leaked>>

\* The objects p holds, as leaked[p] names them.
LiveObjects(p) ==
    (IF va[p] THEN {Own(p, "va", 0)} ELSE {})
    \cup {Own(p, "handle", a) : a \in created[p]}
    \cup {Own(p, "plane", a) : a \in mapped[p]}
    \cup {Own(p, "alias", a) : a \in aliasMapped[p]}
    \cup {Imp(x[1], x[2], "handle") : x \in imported[p]}
    \cup {Imp(x[1], x[2], x[3]) : x \in importMapped[p]}

\* A mapping (own or imported) of p is live: the driver refuses cuMemAddressFree.
MappingLive(p) == mapped[p] \cup aliasMapped[p] # {} \/ importMapped[p] # {}

\* The undo of object x of p is due.
UndoDue(p, x) ==
    CASE x[1] = "va"      -> x[2] = p /\ x[3] = 0 /\ CanFree(p)
      [] x[1] = "handle"  -> x[2] = p /\ CanRelease(p, x[3])
      [] x[1] = "plane"   -> x[2] = p /\ CanUnmap(p, x[3], "plane")
      [] x[1] = "alias"   -> x[2] = p /\ CanUnmap(p, x[3], "alias")
      [] x[1] = "ihandle" -> CanImportRelease(p, x[2], x[3])
      [] x[1] = "iplane"  -> CanImportUnmap(p, x[2], x[3], "plane")
      [] OTHER            -> CanImportUnmap(p, x[2], x[3], "alias")

\* Undo failures so far, over all processes: leaked objects, less the VAs the
\* driver had to refuse.
UndoFailures ==
    Cardinality(UNION {{<<q, x>> : x \in {y \in leaked[q] : y[1] # "va" \/ ~MappingLive(q)}}
                       : q \in Ranks})

\* The undo of x failed: x stays live and is leaked; the process goes on.
UndoFail(p, x) ==
    /\ x \in LeakObjects
    /\ \/ MaxUndoFailures > 0 /\ UndoFailures < MaxUndoFailures
       \/ x[1] = "va" /\ MappingLive(p)
    /\ UndoDue(p, x)
    /\ leaked' = [leaked EXCEPT ![p] = @ \cup {x}]
    /\ UNCHANGED <<phase, va, created, mapped, aliasMapped, access, ready, failed,
                   exported, sent, imported, importMapped, importAccess, vote, decision,
                   crashed>>

\* p's unwinding ended leaking: an undo failed and p ran every undo (all it
\* still holds is leaked).  The runtime traces no AbortComplete /
\* ShutdownComplete then: p stays in Aborting or ShuttingDown.
UnwindEndedLeaking(p) ==
    /\ Unwinding(p)
    /\ leaked[p] # {}
    /\ LiveObjects(p) \subseteq leaked[p]

AbortComplete(p) ==
    /\ phase[p] = "Aborting"
    /\ Alive(p)
    /\ NothingLeftOn(p)                              \* @guard abort-complete-when-empty
    /\ phase' = [phase EXCEPT ![p] = "Aborted"]
    /\ UNCHANGED <<va, created, mapped, aliasMapped, access, ready, failed, exported,
                   sent, imported, importMapped, importAccess, vote, decision, crashed,
                   leaked>>

ShutdownComplete(p) ==
    /\ phase[p] = "ShuttingDown"
    /\ Alive(p)
    /\ NothingLeftOn(p)                              \* @guard shutdown-complete-when-empty
    /\ phase' = [phase EXCEPT ![p] = "Shutdown"]
    /\ UNCHANGED <<va, created, mapped, aliasMapped, access, ready, failed, exported,
                   sent, imported, importMapped, importAccess, vote, decision, crashed,
                   leaked>>

\* Every process finished, dead, or ended leaking: stutter, so this is not a
\* deadlock.
Done ==
    /\ \A p \in Ranks : crashed[p] \/ phase[p] \in {"Aborted", "Shutdown"}
                         \/ UnwindEndedLeaking(p)
    /\ UNCHANGED vars

-----------------------------------------------------------------------------
\* (CanDrive first: TLC skips the whole disjunction when it is false.)
ForwardStep(p) ==
  /\ CanDrive(p)
  /\ \/ Reserve(p)
     \/ \E a \in Allocs : Create(p, a) \/ Map(p, a) \/ MapAlias(p, a) \/ Export(p, a)
     \/ \E a \in Allocs, m \in MappingKinds : Grant(p, a, m)
     \/ \E a \in Allocs, i \in Ranks : Send(p, a, i)
     \/ \E o \in Ranks, a \in Allocs : Import(p, o, a)
     \/ \E o \in Ranks, a \in Allocs, m \in MappingKinds :
           ImportMap(p, o, a, m) \/ ImportGrant(p, o, a, m)
     \/ RankReady(p)

\* (No Unwinding(p) prefix here: Unmap's own guard is a tagged mutant.)
UnwindStep(p) ==
    \/ \E o \in Ranks, a \in Allocs, m \in MappingKinds : ImportUnmap(p, o, a, m)
    \/ \E o \in Ranks, a \in Allocs : ImportRelease(p, o, a)
    \/ \E a \in Allocs, m \in MappingKinds : Unmap(p, a, m)
    \/ \E a \in Allocs : Release(p, a)
    \/ Free(p)

GroupStep(p) ==
    \/ \E v \in {"ready", "failed"} : Vote(p, v)
    \/ \E d \in {"publish", "abort"} : Decide(p, d)
    \/ Publish(p) \/ Abort(p) \/ Unpublish(p) \/ AbortComplete(p) \/ ShutdownComplete(p)

\* Every step except failures, crashes and terminal stuttering; the deadline
\* (GiveUp) is part of it.
Progress ==
    \E p \in Ranks : ForwardStep(p) \/ UnwindStep(p) \/ GroupStep(p) \/ GiveUp(p)

Next ==
    \/ Progress
    \/ \E p \in Ranks : CanDrive(p) /\ \E x \in FailSteps : Fail(p, x)
    \/ \E p \in Ranks : Crash(p)
    \/ \E p \in Ranks : Unwinding(p) /\ \E x \in LeakObjects : UndoFail(p, x)
    \/ Done

Spec == Init /\ [][Next]_vars /\ WF_vars(Progress)

-----------------------------------------------------------------------------
(* Safety invariants, each stated from the constants, not from the guards. *)

\* No process publishes while another aborts (TwoPhase's consistency): in
\* their decisions, and in their phases (a published process next to an
\* aborting one).
Agreement ==
    \A p, q \in Ranks :
        /\ ~(decision[p] = "publish" /\ decision[q] = "abort")
        /\ ~(phase[p] \in {"Published", "ShuttingDown", "Shutdown"}
             /\ phase[q] \in {"Aborting", "Aborted"})

\* A process decides publish only if every rank voted ready.
Validity ==
    \A p \in Ranks : decision[p] = "publish" => \A q \in Ranks : vote[q] = "ready"

\* The owner's cuMemSetAccess names its own device only.
OwnerGrantsOnlyOwnDevice ==
    \A p \in Ranks : \A g \in access[p] : g[3] = p

\* An importer's cuMemSetAccess names its own device only.
ImporterGrantsOnlyOwnDevice ==
    \A p \in Ranks : \A g \in importAccess[p] : g[4] = p

\* Only a validated importer of o holds a handle of o's memory, and every fd on
\* the socket was exported by its owner.
ImportOnlyByImporters ==
    /\ \A p \in Ranks : \A x \in imported[p] : p \in Importers[x[1]]
    /\ \A s \in sent : s[2] \in exported[s[1]]

\* No importer maps a handle it has not imported (or has released).  Exempt: a
\* mapping whose cuMemUnmap failed (leaked); the runtime goes on and releases
\* its handle, which the driver allows (the memory goes with the last mapping).
MapOnlyImported ==
    \A p \in Ranks : \A x \in importMapped[p] :
        <<x[1], x[2]>> \in imported[p] \/ <<ImportKind(x[3]), x[1], x[2]>> \in leaked[p]

\* The devices that can reach mapping m of o's allocation a, over the whole
\* group, are o and o's importers (an owner-only region: o alone); never a
\* declared reader that imports nothing.  A grant also needs its mapping to
\* exist, own or imported (an unmap takes the access with it).
AccessOnlyOwnerAndImporters ==
    /\ \A o \in Ranks, a \in Allocs, m \in MappingKinds :
          LET reach == {g[3] : g \in {h \in access[o] : h[1] = a /\ h[2] = m}}
                       \cup UNION {{g[4] : g \in {h \in importAccess[p] :
                                     h[1] = o /\ h[2] = a /\ h[3] = m}} : p \in Ranks}
              allowed == IF m = "alias" /\ a \in OwnerOnly THEN {o}
                         ELSE {o} \cup Importers[o]
          IN reach \subseteq allowed
    /\ \A p \in Ranks :
          /\ \A g \in access[p] :
                IF g[2] = "plane" THEN g[1] \in mapped[p] ELSE g[1] \in aliasMapped[p]
          /\ \A g \in importAccess[p] : <<g[1], g[2], g[3]>> \in importMapped[p]

\* A region mapping exists only while its plane mapping, handle and VA do,
\* for own and imported memory.  Exempt: an object whose own undo failed
\* (leaked): the runtime goes on unwinding past it, so a leaked alias may
\* outlive its plane mapping and handle, a leaked mapping its handle, a leaked
\* handle the VA (the driver keeps a mapped allocation's memory; nothing is
\* published then: UndoFailureNeverCompletes).  Never exempt: a VA freed under
\* a live mapping, own or imported.
AliasNeverOutlivesBacking ==
    \A p \in Ranks :
        /\ \A a \in aliasMapped[p] : a \in mapped[p] \/ <<"alias", p, a>> \in leaked[p]
        /\ \A a \in mapped[p] : a \in created[p] \/ <<"plane", p, a>> \in leaked[p]
        /\ {a \in created[p] : <<"handle", p, a>> \notin leaked[p]} # {} => va[p]
        /\ mapped[p] \cup aliasMapped[p] # {} \/ importMapped[p] # {} => va[p]
        /\ \A x \in importMapped[p] :
              x[3] = "alias" => \/ <<x[1], x[2], "plane">> \in importMapped[p]
                               \/ <<"ialias", x[1], x[2]>> \in leaked[p]

\* An object whose undo failed stays live (the runtime reports it left live)
\* and is never undone again (no silent retry).
LeakedStayLive ==
    \A p \in Ranks : \A x \in leaked[p] :
        CASE x[1] = "va"      -> va[p]
          [] x[1] = "handle"  -> x[3] \in created[p]
          [] x[1] = "plane"   -> x[3] \in mapped[p]
          [] x[1] = "alias"   -> x[3] \in aliasMapped[p]
          [] x[1] = "ihandle" -> <<x[2], x[3]>> \in imported[p]
          [] x[1] = "iplane"  -> <<x[2], x[3], "plane">> \in importMapped[p]
          [] OTHER            -> <<x[2], x[3], "alias">> \in importMapped[p]

\* A process whose undo failed never declares its attempt finished (no
\* AbortComplete / ShutdownComplete: objects are left live) and is not
\* published.
UndoFailureNeverCompletes ==
    \A p \in Ranks : leaked[p] # {} => phase[p] \in {"Aborting", "ShuttingDown"}

\* A published process holds its whole part: own plan and every import.
PublishedHoldsPlan ==
    \A p \in Ranks : phase[p] = "Published" =>
        /\ va[p]
        /\ created[p] = Allocs /\ mapped[p] = Allocs /\ aliasMapped[p] = Aliased
        /\ \A a \in Allocs, m \in MappingKinds :
              HasMapping(p, a, m) => <<a, m, p>> \in access[p]
        /\ \A o \in Sources(p), a \in Allocs : <<o, a>> \in imported[p]
        \* the importer maps and grants the plane, and the alias of a region with
        \* access: importers (written out, not through the guards' ImportKinds)
        /\ \A o \in Sources(p), a \in Allocs :
              \A m \in IF a \in Aliased \ OwnerOnly THEN {"plane", "alias"} ELSE {"plane"} :
                  <<o, a, m, p>> \in importAccess[p]

\* Process p holds no driver object, imported handles included. Written out for
\* the properties below, apart from the guards' NothingLeftOn, so a wrong
\* NothingLeftOn cannot weaken the property with the guard.
HeldNothing(p) ==
    /\ ~va[p]
    /\ created[p] = {} /\ mapped[p] = {} /\ aliasMapped[p] = {} /\ access[p] = {}
    /\ imported[p] = {} /\ importMapped[p] = {} /\ importAccess[p] = {}

\* After Abort nothing is left in the process, imported handles included.
NothingLeftAfterAbort ==
    \A p \in Ranks : phase[p] = "Aborted" => HeldNothing(p)

\* After shutdown likewise.
NothingLeftAfterShutdown ==
    \A p \in Ranks : phase[p] = "Shutdown" => HeldNothing(p)

\* A process decides abort only after a fault: some rank failed a step or
\* crashed (a healthy group is never torn down; a rank that votes failed has
\* failed).
AbortOnlyOnFault ==
    \A p \in Ranks : decision[p] = "abort" => \E q \in Ranks : failed[q] \/ crashed[q]

-----------------------------------------------------------------------------
(* Safety properties of steps (action properties, checked as PROPERTIES), *)
(* the counterparts of KVLifecycle's, per process.                        *)

\* The phase steps of one process's attempt: its lifecycle moves only forward.
PhaseSteps ==
    {<<"Allocating", "Published">>, <<"Allocating", "Aborting">>,
     <<"Aborting", "Aborted">>, <<"Published", "ShuttingDown">>,
     <<"ShuttingDown", "Shutdown">>}

\* Everything of process p a step may change (its crash flag aside).
StateOf(p) ==
    <<phase[p], va[p], created[p], mapped[p], aliasMapped[p], access[p], ready[p],
      failed[p], exported[p], {s \in sent : s[1] = p}, imported[p], importMapped[p],
      importAccess[p], vote[p], decision[p]>>

\* Process p makes, imports, grants, exports or sends nothing in this step and
\* does not get ready: written from the variables, not from CanDrive.
MakesNothing(p) ==
    /\ va'[p] => va[p]
    /\ created'[p] \subseteq created[p]
    /\ mapped'[p] \subseteq mapped[p]
    /\ aliasMapped'[p] \subseteq aliasMapped[p]
    /\ access'[p] \subseteq access[p]
    /\ exported'[p] \subseteq exported[p]
    /\ {s \in sent' : s[1] = p} \subseteq sent
    /\ imported'[p] \subseteq imported[p]
    /\ importMapped'[p] \subseteq importMapped[p]
    /\ importAccess'[p] \subseteq importAccess[p]
    /\ ready'[p] => ready[p]

\* One attempt per process (no silent retry): its phase only moves forward, a
\* failure, a vote and a decision are never taken back, a crashed or finished
\* process changes nothing, and once it has left Allocating it only unwinds.
OneAttempt ==
    [][\A p \in Ranks :
          /\ phase'[p] # phase[p] => <<phase[p], phase'[p]>> \in PhaseSteps
          /\ failed[p] => failed'[p]
          /\ crashed[p] => crashed'[p]
          /\ vote[p] # "none" => vote'[p] = vote[p]
          /\ decision[p] # "none" => decision'[p] = decision[p]
          /\ crashed[p] \/ phase[p] \in {"Aborted", "Shutdown"} =>
                StateOf(p)' = StateOf(p)
          /\ phase[p] # "Allocating" => MakesNothing(p)
      ]_vars

\* No silent retry: a process whose forward step failed (or whose import gave
\* up at the deadline) makes nothing more in this attempt and does not get ready.
NoRetryAfterFailure ==
    [][\A p \in Ranks : failed[p] => MakesNothing(p)]_vars

\* Made in plan order (docs/group-trace.md), so that unwinding in plan order
\* (below) is LIFO: a new handle only once every earlier own allocation is
\* complete (mapped, alias mapped if aliased, each mapping granted to p); a new
\* import only once p's own allocations are all complete and every earlier
\* import (owner, then allocation) is mapped and granted.
MadeInPlanOrder ==
    [][\A p \in Ranks :
          LET ownKinds(b) == IF b \in Aliased THEN {"plane", "alias"} ELSE {"plane"}
              impKinds(b) == IF b \in Aliased \ OwnerOnly THEN {"plane", "alias"}
                             ELSE {"plane"}
              ownComplete(b) == \A m \in ownKinds(b) : <<b, m, p>> \in access[p]
                                                     /\ IF m = "plane" THEN b \in mapped[p]
                                                        ELSE b \in aliasMapped[p]
          IN /\ \A a \in created'[p] \ created[p] : \A b \in Allocs : b < a => ownComplete(b)
             /\ \A x \in imported'[p] \ imported[p] :
                   /\ \A b \in Allocs : ownComplete(b)
                   /\ \A o \in Ranks, b \in Allocs :
                         (p \in Importers[o] /\ (o < x[1] \/ (o = x[1] /\ b < x[2]))) =>
                             \A m \in impKinds(b) : /\ <<o, b, m>> \in importMapped[p]
                                                  /\ <<o, b, m, p>> \in importAccess[p]
      ]_vars

\* Unwinding in reverse order (docs/group-trace.md; the runtime's LIFO
\* Transaction): imports go first, the newest first (owner, then allocation,
\* descending); then own allocations, the newest first; the VA last.
UnwindInReverseOrder ==
    [][\A p \in Ranks :
          LET new == leaked'[p] \ leaked[p]     \* an undo that failed is unwound too
              isImp(x) == x[1] \in {"ihandle", "iplane", "ialias"}
              goneImports == (imported[p] \ imported'[p])
                             \cup {<<x[1], x[2]>> : x \in importMapped[p] \ importMapped'[p]}
                             \cup {<<x[2], x[3]>> : x \in {y \in new : isImp(y)}}
              goneOwn == (created[p] \ created'[p]) \cup (mapped[p] \ mapped'[p])
                         \cup (aliasMapped[p] \ aliasMapped'[p])
                         \cup {x[3] : x \in {y \in new : y[1] \in {"handle", "plane", "alias"}}}
              vaGone == (va[p] /\ ~va'[p]) \/ \E x \in new : x[1] = "va"
              \* what p still holds and has not leaked
              held == {y \in imported[p] : <<"ihandle", y[1], y[2]>> \notin leaked[p]}
              heldMaps == {y \in importMapped[p] : <<ImportKind(y[3]), y[1], y[2]>> \notin leaked[p]}
              heldOwn == {b \in created[p] : <<"handle", p, b>> \notin leaked[p]}
          IN /\ \A x \in goneImports, y \in held :
                   y[1] < x[1] \/ (y[1] = x[1] /\ y[2] <= x[2])
             /\ goneOwn # {} \/ vaGone => held = {} /\ heldMaps = {}
             /\ \A a \in goneOwn, b \in heldOwn : b <= a
             /\ vaGone => heldOwn = {}
      ]_vars

-----------------------------------------------------------------------------
(* Liveness (under WF_vars(Progress), the deadline included). *)

\* Every process that does not crash decides, also when another crashes.
SurvivorsDecide == \A p \in Ranks : <>(crashed[p] \/ decision[p] # "none")

\* Every surviving process ends its attempt: published or aborted.
SurvivorsEnd ==
    \A p \in Ranks : <>(crashed[p] \/ phase[p] \in {"Published", "Aborted"})

\* Every surviving process finishes with nothing held: it aborts, or it is
\* published and then shut down (the request to shut down, Unpublish, is part
\* of the fair Progress: the model assumes it comes), and it ends holding no
\* driver object, imported handles included (HeldNothing, written out apart
\* from the guards' NothingLeftOn), and stays so.  SurvivorsEnd alone is met
\* by a process that stops in Aborting or ShuttingDown, never unpublishes,
\* or reaches Aborted while it still holds objects.
SurvivorsRelease ==
    \A p \in Ranks :
        <>[](crashed[p] \/ (phase[p] \in {"Aborted", "Shutdown"} /\ HeldNothing(p)))

=============================================================================
