----------------------------- MODULE KVLifecycle -----------------------------
(***************************************************************************)
(* The allocation lifecycle of a multi-GPU KV cache built with the CUDA    *)
(* virtual-memory API, at the granularity of the kvgrant runtime: one      *)
(* action per driver call (cuMemAddressReserve, cuMemCreate, cuMemMap of   *)
(* the plane, cuMemMap of the alias, one cuMemSetAccess per mapping,       *)
(* cuMemUnmap, cuMemRelease, cuMemAddressFree) plus the group steps that   *)
(* publish capacity, abort an attempt and shut down.                       *)
(*                                                                         *)
(* Every rank realises the same physical plan: allocations 0..NumAllocs-1  *)
(* in creation order, some of them aliased (mapped a second time into a    *)
(* region).  A driver step may fail at any point before Publish (Fail);    *)
(* the group then aborts and every rank unwinds what it made in reverse    *)
(* order.  An unwinding step may fail too (UndoFail, at most            *)
(* MaxUndoFailures of them in one attempt): the object stays live (it is  *)
(* leaked, never undone again), the rank goes on with the rest of its     *)
(* undo stack in the same order, and the attempt never completes (it ends *)
(* in Aborting or ShuttingDown with the leaked objects: UnwindEndedLeaking).*)
(*                                                                         *)
(* Omitted: byte ranges, VA values and page geometry (the layout contract  *)
(* is checked in Python, kvgrant.layout.contract); the driver-handle       *)
(* budget (a Fail is any reason a driver step fails); devices other than   *)
(* the ranks' own (a rank's device is named by its rank); retries (there   *)
(* are none: one attempt).                                                 *)
(*                                                                         *)
(* Each allocation is complete (mapped, alias-mapped, granted) before the *)
(* next Create, as the runtime builds it; the history variable undo is the *)
(* runtime's undo stack (Transaction), so "unwind in reverse order" is a   *)
(* claim about it (UnwindInReverseOrder), not a consequence of the guards. *)
(*                                                                         *)
(* The safety properties below are written from the constants and the     *)
(* variables only, never through the operators the guards use (GrantSet,   *)
(* the Can* guards): a wrong guard or a wrong GrantSet must break them.    *)
(*                                                                         *)
(* Tags of the form  \* @guard <name>  mark the conjuncts that the safety  *)
(* properties rely on; kvgrant.conformance.spec_mutants removes one of     *)
(* them at a time (and changes operator bodies, e.g. GrantSet) and expects *)
(* TLC to report the property violated.  Keep each tagged guard on its own *)
(* line.                                                                   *)
(***************************************************************************)
EXTENDS Naturals, FiniteSets, Sequences

CONSTANTS
    NumRanks,         \* ranks of the tensor-parallel group
    NumAllocs,        \* allocations of the plan (same plan on every rank)
    Aliased,          \* allocations that are also mapped into a region
    OwnerOnly,        \* aliased allocations whose region has access: owner
    Importers,        \* Importers[r]: ranks whose validated peer imports map r's memory
    DeclaredReaders   \* DeclaredReaders[r]: readers declared by exported metadata

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

\* The two mappings an allocation can have.
MappingKinds == {"plane", "alias"}

\* The objects a rank makes, as pushed on its undo stack: its VA reservation,
\* the handle of allocation a, and a's plane and alias mappings.
Objects == ({"va"} \X {0}) \cup ({"handle", "plane", "alias"} \X Allocs)

\* The driver steps that can fail (the x of Fail(r, x)).
FailSteps == {"Reserve", "Create", "Map", "MapAlias", "Grant"}

\* The unwinding steps that can fail too (UndoFail), and how many may fail in
\* one attempt, over all ranks (a failed Free that the driver must refuse,
\* because a leaked mapping is still in the VA range, is not counted).  A
\* definition, not a constant, so that only the configs that want undo
\* failures name it (MaxUndoFailures <- ...): the default 0 turns them off
\* (the liveness configs need that: a leaked object is never released); trace
\* validation (KVLifecycleTrace) allows any number, MCKVLifecycle_Undo.cfg one.
UndoSteps == {"Unmap", "Release", "Free"}
MaxUndoFailures == 0

\* Devices that mapping m of allocation a on rank r is granted to: the owner,
\* plus the importers unless it is the alias of an owner-only region.
GrantSet(r, a, m) ==
    IF m = "alias" /\ a \in OwnerOnly THEN {r} ELSE {r} \cup Importers[r]

VARIABLES
    phase,        \* group phase, one of Phases
    va,           \* va[r]: rank r holds its VA reservation
    created,      \* created[r]: allocations whose handle (cuMemCreate) is live
    mapped,       \* mapped[r]: allocations mapped into their plane
    aliasMapped,  \* aliasMapped[r]: allocations mapped into their region
    access,       \* access[r]: <<a, m, d>> = mapping m of a is accessible by device d
    ready,        \* ready[r]: rank r finished its whole plan (RankReady)
    failed,       \* failed[r]: a driver step of rank r failed
    published,    \* ranks whose capacity (KV tokens, snapshot slots) is published
    undo,         \* undo[r]: history, the objects rank r made and has not yet
                  \* unwound, oldest first (the runtime's undo stack)
    leaked        \* leaked[r]: objects of rank r whose undo failed (UndoFail):
                  \* still live, off the undo stack, never undone again

vars == <<phase, va, created, mapped, aliasMapped, access, ready, failed,
          published, undo, leaked>>

TypeOK ==
    /\ phase \in Phases
    /\ va \in [Ranks -> BOOLEAN]
    /\ created \in [Ranks -> SUBSET Allocs]
    /\ mapped \in [Ranks -> SUBSET Allocs]
    /\ aliasMapped \in [Ranks -> SUBSET Allocs]
    /\ access \in [Ranks -> SUBSET (Allocs \X MappingKinds \X Ranks)]
    /\ ready \in [Ranks -> BOOLEAN]
    /\ failed \in [Ranks -> BOOLEAN]
    /\ published \subseteq Ranks
    /\ undo \in [Ranks -> Seq(Objects)]
    /\ leaked \in [Ranks -> SUBSET Objects]

-----------------------------------------------------------------------------
(* Helpers *)

\* Mapping m of allocation a exists on rank r.
HasMapping(r, a, m) ==
    IF m = "plane" THEN a \in mapped[r] ELSE a \in aliasMapped[r]

\* Mapping m of allocation a on rank r has been granted (cuMemSetAccess ran).
\* Written as a set test, not \E d: inside an action TLC would otherwise enumerate a
\* witness per mapping and produce 2^mappings duplicate successors.
Granted(r, a, m) == {d \in Ranks : <<a, m, d>> \in access[r]} # {}

\* Every existing mapping of rank r has been granted.
AllMappingsGranted(r) ==
    \A a \in Allocs, m \in MappingKinds : HasMapping(r, a, m) => Granted(r, a, m)

\* Rank r holds no driver object at all.
NothingLeftOn(r) ==
    /\ ~va[r]
    /\ created[r] = {}
    /\ mapped[r] = {}
    /\ aliasMapped[r] = {}
    /\ access[r] = {}

NothingLeft == \A r \in Ranks : NothingLeftOn(r)

Unwinding == phase \in {"Aborting", "ShuttingDown"}

\* Allocation a of rank r is complete: mapped, alias-mapped if aliased, and
\* every mapping granted (the runtime finishes an allocation before the next).
Complete(r, a) ==
    /\ a \in mapped[r]
    /\ a \in Aliased => a \in aliasMapped[r]
    /\ Granted(r, a, "plane")
    /\ a \in Aliased => Granted(r, a, "alias")

\* History: push the object o made by rank r; drop o (wherever it is) when it
\* is unwound.  Drop does not pop: UnwindInReverseOrder checks that it was
\* the top.
Push(r, o) == undo' = [undo EXCEPT ![r] = Append(@, o)]
Drop(r, o) == undo' = [undo EXCEPT ![r] = SelectSeq(@, LAMBDA x : x # o)]

-----------------------------------------------------------------------------
Init ==
    /\ phase = "Allocating"
    /\ va = [r \in Ranks |-> FALSE]
    /\ created = [r \in Ranks |-> {}]
    /\ mapped = [r \in Ranks |-> {}]
    /\ aliasMapped = [r \in Ranks |-> {}]
    /\ access = [r \in Ranks |-> {}]
    /\ ready = [r \in Ranks |-> FALSE]
    /\ failed = [r \in Ranks |-> FALSE]
    /\ published = {}
    /\ undo = [r \in Ranks |-> <<>>]
    /\ leaked = [r \in Ranks |-> {}]

-----------------------------------------------------------------------------
(* Allocation: the guards of each driver step, shared by the step itself  *)
(* and by its failure Fail(r, x).                                          *)

CanReserve(r) ==
    /\ phase = "Allocating"
    /\ ~failed[r]
    /\ ~va[r]

CanCreate(r, a) ==
    /\ phase = "Allocating"
    /\ ~failed[r]
    /\ va[r]
    /\ \A s \in Ranks : va[s]                        \* @guard reserve-all-before-create
    /\ a \notin created[r]
    /\ \A b \in Allocs : b < a => b \in created[r]   \* creation in plan order
    /\ \A b \in Allocs : b < a => Complete(r, b)     \* @guard create-after-previous-complete

CanMap(r, a) ==
    /\ phase = "Allocating"
    /\ ~failed[r]
    /\ a \in created[r]
    /\ a \notin mapped[r]

CanMapAlias(r, a) ==
    /\ phase = "Allocating"
    /\ ~failed[r]
    /\ a \in Aliased                                \* @guard alias-only-aliased
    /\ a \in mapped[r]                               \* @guard alias-after-backing
    /\ a \in created[r]
    /\ a \notin aliasMapped[r]

CanGrant(r, a, m) ==
    /\ phase = "Allocating"
    /\ ~failed[r]
    /\ HasMapping(r, a, m)
    /\ ~Granted(r, a, m)

\* The driver step x of rank r could run now (for some arguments).
StepEnabled(r, x) ==
    CASE x = "Reserve"  -> CanReserve(r)
      [] x = "Create"   -> \E a \in Allocs : CanCreate(r, a)
      [] x = "Map"      -> \E a \in Allocs : CanMap(r, a)
      [] x = "MapAlias" -> \E a \in Allocs : CanMapAlias(r, a)
      [] x = "Grant"    -> \E a \in Allocs, m \in MappingKinds : CanGrant(r, a, m)
      [] OTHER          -> FALSE

Reserve(r) ==
    /\ CanReserve(r)
    /\ va' = [va EXCEPT ![r] = TRUE]
    /\ Push(r, <<"va", 0>>)
    /\ UNCHANGED <<phase, created, mapped, aliasMapped, access, ready, failed,
                   published, leaked>>

Create(r, a) ==
    /\ CanCreate(r, a)
    /\ created' = [created EXCEPT ![r] = @ \cup {a}]
    /\ Push(r, <<"handle", a>>)
    /\ UNCHANGED <<phase, va, mapped, aliasMapped, access, ready, failed,
                   published, leaked>>

Map(r, a) ==
    /\ CanMap(r, a)
    /\ mapped' = [mapped EXCEPT ![r] = @ \cup {a}]
    /\ Push(r, <<"plane", a>>)
    /\ UNCHANGED <<phase, va, created, aliasMapped, access, ready, failed,
                   published, leaked>>

MapAlias(r, a) ==
    /\ CanMapAlias(r, a)
    /\ aliasMapped' = [aliasMapped EXCEPT ![r] = @ \cup {a}]
    /\ Push(r, <<"alias", a>>)
    /\ UNCHANGED <<phase, va, created, mapped, access, ready, failed,
                   published, leaked>>

\* One cuMemSetAccess for mapping m of a.  The devices D are chosen by the
\* runtime; the guard pins them to the owner and the validated importers
\* (never every declared reader).
Grant(r, a, m) ==
    /\ CanGrant(r, a, m)
    /\ \E D \in SUBSET ({r} \cup DeclaredReaders[r]) :
          /\ D = GrantSet(r, a, m)                   \* @guard grant-owner-and-importers
          /\ access' = [access EXCEPT ![r] = @ \cup {<<a, m, d>> : d \in D}]
    /\ UNCHANGED <<phase, va, created, mapped, aliasMapped, ready, failed,
                   published, undo, leaked>>

RankReady(r) ==
    /\ phase = "Allocating"
    /\ ~failed[r]
    /\ ~ready[r]
    /\ va[r]
    /\ created[r] = Allocs
    /\ mapped[r] = Allocs
    /\ aliasMapped[r] = Aliased
    /\ AllMappingsGranted(r)                         \* @guard ready-after-grants
    /\ ready' = [ready EXCEPT ![r] = TRUE]
    /\ UNCHANGED <<phase, va, created, mapped, aliasMapped, access, failed,
                   published, undo, leaked>>

\* The capacity of every ready rank is published; the guard, not the effect,
\* makes it every rank or none.
Publish ==
    /\ phase = "Allocating"
    /\ \A r \in Ranks : ready[r]                     \* @guard publish-all-ready
    /\ \A r \in Ranks : ~failed[r]
    /\ published' = {r \in Ranks : ready[r]}
    /\ phase' = "Published"
    /\ UNCHANGED <<va, created, mapped, aliasMapped, access, ready, failed, undo,
                   leaked>>

\* Driver step x of rank r failed: nothing changes but the failure flag.
Fail(r, x) ==
    /\ x \in FailSteps
    /\ StepEnabled(r, x)
    /\ failed' = [failed EXCEPT ![r] = TRUE]
    /\ UNCHANGED <<phase, va, created, mapped, aliasMapped, access, ready,
                   published, undo, leaked>>

Abort ==
    /\ phase = "Allocating"
    /\ \E r \in Ranks : failed[r]                    \* @guard abort-only-on-failure
    /\ phase' = "Aborting"
    /\ UNCHANGED <<va, created, mapped, aliasMapped, access, ready, failed,
                   published, undo, leaked>>

-----------------------------------------------------------------------------
(* Shutdown and unwinding (after Abort or Unpublish).  Each undo runs in  *)
(* LIFO order; it may fail (UndoFail): the object is leaked (stays live,   *)
(* never undone again) and the rank goes on with the next undo, exactly    *)
(* as the runtime's Transaction does.  The guards read a leaked object as  *)
(* gone for the order; what the driver itself refuses stays refused: the  *)
(* VA is never freed while a mapping in it is live.                       *)

Unpublish ==
    /\ phase = "Published"
    /\ published' = {}
    /\ phase' = "ShuttingDown"
    /\ UNCHANGED <<va, created, mapped, aliasMapped, access, ready, failed, undo,
                   leaked>>

\* The undo of mapping m of a is due: the mapping is live and not leaked, its
\* alias is gone (unmapped, or leaked), and no newer handle is left (released,
\* or leaked).  Shared by Unmap and its failure UndoFail.
CanUnmap(r, a, m) ==
    /\ Unwinding                                     \* @guard unmap-only-unwinding
    /\ m \in MappingKinds
    /\ HasMapping(r, a, m)
    /\ <<m, a>> \notin leaked[r]                     \* @guard undo-never-retried
    /\ m = "plane" => a \notin aliasMapped[r] \/ <<"alias", a>> \in leaked[r]  \* @guard unmap-alias-before-backing
    /\ \A b \in Allocs : b > a => b \notin created[r] \/ <<"handle", b>> \in leaked[r]  \* @guard unmap-reverse-order

\* The undo of a's handle is due: live, not leaked, its mappings gone
\* (unmapped, or leaked: cuMemRelease of a handle with a live mapping succeeds,
\* the memory goes with the last mapping), no newer handle left.
CanRelease(r, a) ==
    /\ Unwinding
    /\ a \in created[r]
    /\ a \notin mapped[r] \/ <<"plane", a>> \in leaked[r]  \* @guard release-after-unmap
    /\ a \notin aliasMapped[r] \/ <<"alias", a>> \in leaked[r]
    /\ <<"handle", a>> \notin leaked[r]
    /\ \A b \in Allocs : b > a => b \notin created[r] \/ <<"handle", b>> \in leaked[r]  \* reverse order

\* The undo of the VA is due: every handle and mapping is gone or leaked.
CanFree(r) ==
    /\ Unwinding
    /\ va[r]
    /\ <<"va", 0>> \notin leaked[r]
    /\ \A a \in created[r] : <<"handle", a>> \in leaked[r]  \* @guard free-after-release
    /\ \A a \in mapped[r] : <<"plane", a>> \in leaked[r]
    /\ \A a \in aliasMapped[r] : <<"alias", a>> \in leaked[r]

\* cuMemUnmap of mapping m of a; the mapping's access goes with it.
Unmap(r, a, m) ==
    /\ CanUnmap(r, a, m)
    /\ IF m = "plane"
          THEN /\ mapped' = [mapped EXCEPT ![r] = @ \ {a}]
               /\ UNCHANGED aliasMapped
          ELSE /\ aliasMapped' = [aliasMapped EXCEPT ![r] = @ \ {a}]
               /\ UNCHANGED mapped
    /\ access' = [access EXCEPT ![r] = {g \in @ : ~(g[1] = a /\ g[2] = m)}]
    /\ Drop(r, <<m, a>>)
    /\ UNCHANGED <<phase, va, created, ready, failed, published, leaked>>

\* cuMemRelease of the handle of a, once it has no mapping (but a leaked one).
Release(r, a) ==
    /\ CanRelease(r, a)
    /\ created' = [created EXCEPT ![r] = @ \ {a}]
    /\ Drop(r, <<"handle", a>>)
    /\ UNCHANGED <<phase, va, mapped, aliasMapped, access, ready, failed,
                   published, leaked>>

\* cuMemAddressFree of the rank's reservation, once no handle is left (but
\* leaked ones); the driver refuses it while a (leaked) mapping is in the range.
Free(r) ==
    /\ CanFree(r)
    /\ mapped[r] = {}                                \* @guard free-after-unmap
    /\ aliasMapped[r] = {}
    /\ va' = [va EXCEPT ![r] = FALSE]
    /\ ready' = [ready EXCEPT ![r] = FALSE]
    /\ Drop(r, <<"va", 0>>)
    /\ UNCHANGED <<phase, created, mapped, aliasMapped, access, failed,
                   published, leaked>>

\* The objects rank r holds (as they are named on its undo stack).
LiveObjects(r) ==
    (IF va[r] THEN {<<"va", 0>>} ELSE {})
    \cup {<<"handle", a>> : a \in created[r]}
    \cup {<<"plane", a>> : a \in mapped[r]}
    \cup {<<"alias", a>> : a \in aliasMapped[r]}

\* The undo of object o of rank r is due (its step's guard, as for Fail).
UndoDue(r, o) ==
    CASE o[1] = "va"     -> CanFree(r)
      [] o[1] = "handle" -> CanRelease(r, o[2])
      [] OTHER           -> CanUnmap(r, o[2], o[1])

\* The undo failures of the attempt so far: leaked objects, less the VAs the
\* driver had to refuse (a leaked mapping is still in them).
UndoFailures ==
    Cardinality(UNION {{<<r, o>> : o \in {x \in leaked[r] :
                                              x[1] # "va" \/ mapped[r] \cup aliasMapped[r] = {}}}
                       : r \in Ranks})

\* The undo of o failed (cuMemUnmap, cuMemRelease or cuMemAddressFree returned
\* an error): o stays live and is leaked; the runtime drops it from its undo
\* stack and goes on with the next one.  At most MaxUndoFailures in one
\* attempt, plus the Free the driver must refuse after a leaked mapping.
UndoFail(r, o) ==
    /\ o \in Objects
    /\ \/ MaxUndoFailures > 0 /\ UndoFailures < MaxUndoFailures
       \/ o[1] = "va" /\ mapped[r] \cup aliasMapped[r] # {}
    /\ UndoDue(r, o)
    /\ leaked' = [leaked EXCEPT ![r] = @ \cup {o}]
    /\ Drop(r, o)
    /\ UNCHANGED <<phase, va, created, mapped, aliasMapped, access, ready, failed,
                   published>>

AbortComplete ==
    /\ phase = "Aborting"
    /\ NothingLeft                                   \* @guard abort-complete-when-empty
    /\ phase' = "Aborted"
    /\ UNCHANGED <<va, created, mapped, aliasMapped, access, ready, failed,
                   published, undo, leaked>>

ShutdownComplete ==
    /\ phase = "ShuttingDown"
    /\ NothingLeft                                   \* @guard shutdown-complete-when-empty
    /\ phase' = "Shutdown"
    /\ UNCHANGED <<va, created, mapped, aliasMapped, access, ready, failed,
                   published, undo, leaked>>

\* An unwinding that ended leaking: an undo failed, and every rank has run every
\* undo (all it still holds is leaked).  The runtime traces no AbortComplete /
\* ShutdownComplete then; the attempt ends here, in Aborting or ShuttingDown.
UnwindEndedLeaking ==
    /\ Unwinding
    /\ \E r \in Ranks : leaked[r] # {}
    /\ \A r \in Ranks : LiveObjects(r) \subseteq leaked[r]

\* Terminal phases stutter, so a finished attempt is not a deadlock; so does an
\* unwinding that ended leaking.
Done ==
    /\ phase \in {"Aborted", "Shutdown"} \/ UnwindEndedLeaking
    /\ UNCHANGED vars

-----------------------------------------------------------------------------
RankStep(r) ==
    \/ Reserve(r)
    \/ \E a \in Allocs : Create(r, a) \/ Map(r, a) \/ MapAlias(r, a)
    \/ \E a \in Allocs, m \in MappingKinds : Grant(r, a, m)
    \/ RankReady(r)

UnwindStep(r) ==
    \/ \E a \in Allocs, m \in MappingKinds : Unmap(r, a, m)
    \/ \E a \in Allocs : Release(r, a)
    \/ Free(r)

GroupStep == Publish \/ Abort \/ Unpublish \/ AbortComplete \/ ShutdownComplete

\* Every step except failures and terminal stuttering.
Progress ==
    \/ \E r \in Ranks : RankStep(r) \/ UnwindStep(r)
    \/ GroupStep

Next ==
    \/ Progress
    \/ \E r \in Ranks, x \in FailSteps : Fail(r, x)
    \/ \E r \in Ranks, o \in Objects : UndoFail(r, o)
    \/ Done

\* Failures (of driver and undo steps) may or may not happen; everything else is
\* weakly fair.
Spec == Init /\ [][Next]_vars /\ WF_vars(Progress)

-----------------------------------------------------------------------------
(* Safety invariants. *)

\* Protects users of the cache from capacity that is not there: while any
\* capacity is published, every rank is ready and holds its whole plan
\* (VA, handles, mappings, grants).
\* Written out from the variables and the constants, not through the guards'
\* helpers (AllMappingsGranted, Granted, GrantSet), so a wrong helper cannot weaken the
\* property with the guard: every mapping is granted to exactly its owner and,
\* unless it is the alias of an owner-only region, every importer.
PublishOnlyWhenAllReady ==
    (published # {} \/ phase = "Published") =>
        \A r \in Ranks :
            /\ ready[r]
            /\ va[r]
            /\ created[r] = Allocs
            /\ mapped[r] = Allocs
            /\ aliasMapped[r] = Aliased
            /\ \A a \in Allocs, m \in MappingKinds :
                  (m = "plane" \/ a \in Aliased) =>
                      {d \in Ranks : <<a, m, d>> \in access[r]} =
                          IF a \in OwnerOnly /\ m = "alias" THEN {r}
                          ELSE Importers[r] \cup {r}

\* Protects the driver-handle budget and isolation (DESIGN.md: access is
\* never granted to a rank that is neither owner nor importer): device d may
\* reach mapping m of allocation a on rank r only if d is r, or d imports r's
\* memory (Importers[r], the validated importers, never DeclaredReaders) and
\* the mapping is not the alias of an owner-only region.  Written from the
\* constants, not through GrantSet, so a wrong GrantSet breaks it.  A grant
\* also needs its mapping to exist (Unmap takes the access with it).
AccessOnlyOwnerAndImporters ==
    \A r \in Ranks : \A g \in access[r] :
        /\ \/ g[3] = r
           \/ /\ g[3] \in Importers[r]
              /\ ~(g[2] = "alias" /\ g[1] \in OwnerOnly)
        /\ HasMapping(r, g[1], g[2])

\* Protects against dangling aliases: a region mapping exists only while
\* the plane mapping of the same allocation, its handle and the VA exist.
\* Exempt: an object whose own undo failed (leaked).  The runtime goes on
\* unwinding past it, so a leaked alias can outlive its plane mapping and
\* handle, and a leaked mapping its handle, and a leaked handle the VA: the
\* driver keeps the memory of a live mapping (cuMemRelease frees it with the
\* last mapping), nothing is published by then (UndoFailureNeverCompletes),
\* and the attempt never completes.  Never exempt: a VA with a live mapping
\* in it (cuMemAddressFree under a mapping).
AliasNeverOutlivesBacking ==
    \A r \in Ranks :
        /\ \A a \in aliasMapped[r] : a \in mapped[r] \/ <<"alias", a>> \in leaked[r]
        /\ \A a \in mapped[r] : a \in created[r] \/ <<"plane", a>> \in leaked[r]
        /\ mapped[r] \cup aliasMapped[r] # {} => va[r]
        /\ {a \in created[r] : <<"handle", a>> \notin leaked[r]} # {} => va[r]

\* Protects the accounting of a failed undo (no silent retry): an object whose
\* undo failed stays live (the runtime reports it left live) and is never
\* undone again.
LeakedStayLive ==
    \A r \in Ranks : \A o \in leaked[r] :
        CASE o[1] = "va"     -> va[r]
          [] o[1] = "handle" -> o[2] \in created[r]
          [] o[1] = "plane"  -> o[2] \in mapped[r]
          [] OTHER           -> o[2] \in aliasMapped[r]

\* Protects users from an attempt declared finished while objects are left
\* live: once an undo failed on some rank, the attempt never reaches Aborted
\* or Shutdown (no AbortComplete / ShutdownComplete), and nothing is published.
UndoFailureNeverCompletes ==
    (\E r \in Ranks : leaked[r] # {}) =>
        /\ phase \in {"Aborting", "ShuttingDown"}
        /\ published = {}

\* Rank r holds no VA, handle, mapping or grant, and its undo stack is empty.
\* Written out for the properties below, apart from the guard's NothingLeftOn,
\* so a wrong NothingLeftOn cannot weaken the property with the guard.
HeldNothing(r) ==
    /\ ~va[r]
    /\ created[r] = {}
    /\ mapped[r] = {}
    /\ aliasMapped[r] = {}
    /\ access[r] = {}
    /\ undo[r] = <<>>

\* Protects against leaks on failure: an aborted attempt holds no handle,
\* mapping, grant or VA on any rank, and published nothing.
NothingLeftAfterAbort ==
    phase = "Aborted" => (\A r \in Ranks : HeldNothing(r)) /\ published = {}

\* Protects against leaks on shutdown: a finished shutdown holds nothing.
NothingLeftAfterShutdown ==
    phase = "Shutdown" => (\A r \in Ranks : HeldNothing(r)) /\ published = {}

\* Protects the group from a partial start-up: capacity is published on
\* every rank or on none, and never during or after an abort.
PublishAllOrNothing ==
    /\ published \in {{}, Ranks}
    /\ phase \in {"Aborting", "Aborted"} => published = {}

\* Protects users from a start-up that half failed (DESIGN.md: any failure
\* before Publish leads to Abort and nothing is published): once a driver
\* step failed on any rank in this attempt, nothing is or ever was published.
FailureNeverPublishes ==
    (\E r \in Ranks : failed[r]) =>
        /\ published = {}
        /\ phase \notin {"Published", "ShuttingDown", "Shutdown"}

\* An abort has a cause (DESIGN.md: Abort follows a failure): the attempt
\* aborts only after a driver step failed on some rank.
AbortOnlyOnFailure ==
    phase \in {"Aborting", "Aborted"} => \E r \in Ranks : failed[r]

-----------------------------------------------------------------------------
(* Safety properties of steps (action properties, checked as PROPERTIES). *)

\* The phase steps of one attempt: the lifecycle moves only forward.
PhaseSteps ==
    {<<"Allocating", "Published">>, <<"Allocating", "Aborting">>,
     <<"Aborting", "Aborted">>, <<"Published", "ShuttingDown">>,
     <<"ShuttingDown", "Shutdown">>}

\* One attempt (DESIGN.md: one attempt, no silent retry): the phase only
\* moves forward (Aborted never goes back to Allocating), a failure is never
\* forgotten, a finished attempt (Aborted, Shutdown) changes nothing, and once
\* the attempt has left Allocating only unwinding changes the driver objects.
OneAttempt ==
    [][ /\ phase' # phase => <<phase, phase'>> \in PhaseSteps
        /\ \A r \in Ranks : failed[r] => failed'[r]
        /\ phase \in {"Aborted", "Shutdown"} => UNCHANGED vars
        \* outside Allocating nothing is made or granted, and no rank gets ready
        /\ phase # "Allocating" =>
              \A r \in Ranks :
                  /\ Len(undo'[r]) <= Len(undo[r])
                  /\ access'[r] \subseteq access[r]
                  /\ ready'[r] => ready[r]
      ]_vars

\* No silent retry: a rank whose driver step failed makes nothing more in
\* this attempt (no new object on its undo stack, no new grant) and does not
\* become ready.
NoRetryAfterFailure ==
    [][\A r \in Ranks : failed[r] =>
          /\ Len(undo'[r]) <= Len(undo[r])
          /\ access'[r] \subseteq access[r]
          /\ ready'[r] => ready[r]
      ]_vars

\* Unwinding in reverse order (DESIGN.md; the runtime's LIFO Transaction):
\* whatever a step takes off a rank's undo stack is its newest object.
\* Unwinding steps Drop the object they name wherever it is, so a step that
\* unwinds an older object first breaks this.
UnwindInReverseOrder ==
    [][\A r \in Ranks :
          Len(undo'[r]) < Len(undo[r]) =>
              undo'[r] = SubSeq(undo[r], 1, Len(undo[r]) - 1)
      ]_vars

\* Every rank reserves before any rank creates (docs/INTERFACES.md): a VA
\* that cannot be had fails the attempt before any physical memory exists,
\* and no rank's memory waits on another rank's reservation.  Written from the
\* variables: a step that gives some rank a new handle happens only while
\* every rank holds its VA.
ReservedBeforeAnyCreate ==
    [][(\E r \in Ranks : ~(created'[r] \subseteq created[r])) => \A s \in Ranks : va[s]]_vars

-----------------------------------------------------------------------------
(* Liveness properties (under WF_vars(Progress)). *)

\* Every attempt ends: the cache is published or the attempt is aborted.
AttemptEnds == <>(phase \in {"Published", "Aborted"})

\* A published cache is shut down when asked, and every shutdown ends (with
\* NothingLeftAfterShutdown, with nothing left).  The request to shut down,
\* Unpublish, is part of the fair Progress: the model assumes it comes, so a
\* cache that stays published because Unpublish cannot run (it waits for
\* something that never happens) breaks this; "ShuttingDown ~> Shutdown"
\* alone did not see it.
ShutdownEnds == (phase \in {"Published", "ShuttingDown"}) ~> (phase = "Shutdown")

\* A failure before Publish leads to a completed Abort (and, with
\* FailureNeverPublishes, never to Publish).
FailureLeadsToAbort == (\E r \in Ranks : failed[r]) ~> (phase = "Aborted")

\* Every attempt finishes with every driver object released on every rank
\* and nothing published, and stays so: it aborts, or it publishes and is
\* shut down.  Written from the variables (HeldNothing, apart from the
\* guards' NothingLeft), so it is not met by reaching a phase: an abort or
\* shutdown declared complete while ranks still hold objects breaks it, as
\* does unwinding that stops before the VA is freed.  (The safety invariants
\* NothingLeftAfterAbort / ...Shutdown say the same of the terminal phases;
\* this is the claim that the release happens, checked where they are not.)
EverythingReleased ==
    <>[](/\ phase \in {"Aborted", "Shutdown"}
         /\ published = {}
         /\ \A r \in Ranks : HeldNothing(r))

=============================================================================
