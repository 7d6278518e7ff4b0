--------------------------- MODULE KVGroupTrace ---------------------------
(***************************************************************************)
(* Trace validation of KVGroup: is one interleaving of a group's trace     *)
(* files a behaviour of the group model?  The Python engine               *)
(* (kvgrant.conformance.group_replay) finds the interleaving (each file in *)
(* its own order, an Import after its Send, every Vote before a Decide)   *)
(* and kvgrant.conformance.tla_trace writes it as the generated module    *)
(* KVGroupTraceData; a process whose file ends before a terminal phase    *)
(* appears as a "Crash" record after its last event.  EXTENDS the spec,   *)
(* never copies it.                                                        *)
(*                                                                         *)
(* One IsX(e) per event kind conjoins the spec's own action with the      *)
(* event's arguments; StateMatches(e) pins the acting process's recorded  *)
(* counters.  As in KVLifecycleTrace, acceptance is the violation of the  *)
(* invariant TraceNotAccepted (TLC 2.15 has no POSTCONDITION); a rejected *)
(* interleaving deadlocks with l = the first unmatched record.            *)
(*                                                                         *)
(* Objects (version 2, ObjectsMatch, history variables hdl and ihdl): the *)
(* rules of kvgrant.conformance.group_objects.  Every event is on the      *)
(* process's own device; Reserve/Free name its reservation; Map/MapAlias  *)
(* the live handle at base + the plan's offset, inside the reservation;   *)
(* Grant/Unmap that mapping's VA and size; Export and Release the live    *)
(* handle (Release: unmapped); Import a handle not live in the process;   *)
(* ImportMap the imported handle at base + slot * TraceSlot + offset;     *)
(* ImportGrant/ImportUnmap that mapping; ImportRelease the imported       *)
(* handle, unmapped.  VAs in granules from the process's own base, sizes  *)
(* in granules, handles by order of appearance per process (-1 null).    *)
(***************************************************************************)
EXTENDS KVGroup, KVGroupTraceData, Integers, Sequences, FiniteSets

\* Record fields (all present; -1 / "none" / {} when unused): p, action,
\* owner, alloc, mapping, devices (ranks), to, ready, decision, failedRanks,
\* missingRanks, ok, and the recorded state: phase, va, created, mapped,
\* aliasMapped, grants, isReady, isFailed, exported, sent, imported,
\* importMapped, importGrants.

VARIABLE l      \* cursor: 1-based position of the next record to match
VARIABLE hdl    \* hdl[p][a]: id of p's live handle of allocation a (-1: none)
VARIABLE ihdl   \* ihdl[p][o][a]: id of p's imported handle of o's allocation a

traceVars == <<vars, l, hdl, ihdl>>

TerminalPhases == {"Published", "Aborted", "Shutdown"}

\* Trace validation allows any number of failed undo steps (TraceKVGroup.cfg
\* binds the spec's MaxUndoFailures to it).
TraceMaxUndoFailures == 1000000000

TraceInit ==
    /\ Init
    /\ l = 1
    /\ hdl = [p \in Ranks |-> [a \in Allocs |-> -1]]
    /\ ihdl = [p \in Ranks |-> [o \in Ranks |-> [a \in Allocs |-> -1]]]

\* The VA (granules from p's base) of mapping m of allocation a in slot k
\* (0: p's own memory, k > 0: the k-th owner p imports from).
SlotVA(p, k, a, m) ==
    TraceBase[p] + k * TraceSlot + (IF m = "plane" THEN TraceMapOff[a] ELSE TraceAliasOff[a])

\* A field that a successful event must name, and a failed one may: it is want.
Named(x, want, ok) == (ok \/ x # -1) => x = want

InReservation(e) ==
    /\ TraceBase[e.p] <= e.evVa
    /\ e.evVa + e.size <= TraceBase[e.p] + TraceResSize[e.p]

\* A mapping event names the planned VA and the allocation's size (a failed one: each
\* of them it names).
AtVA(e, k, m) ==
    /\ Named(e.evVa, SlotVA(e.p, k, e.alloc, m), e.ok)
    /\ Named(e.size, TraceLen[e.alloc], e.ok)

OwnLive(p) == {hdl[p][b] : b \in Allocs} \ {-1}
Live(p) == OwnLive(p) \cup ({ihdl[p][o][b] : o \in Ranks, b \in Allocs} \ {-1})

NewHandle(e, live) ==
    /\ Named(e.size, TraceLen[e.alloc], e.ok)
    /\ e.ok => (e.handle # -1 /\ e.handle \notin live)
    /\ ~e.ok => e.handle = -1

ImportActions == {"Import", "ImportMap", "ImportGrant", "ImportUnmap", "ImportRelease"}

\* The event acts on the object the header's plan names (see the header).
\* (IF/CASE, not \/: inside an action TLC explores every disjunct.)
ObjectsMatch(e) ==
    IF e.action = "Crash" THEN TRUE ELSE
    /\ e.device = TraceDevice[e.p]
    /\ CASE e.action \in {"Reserve", "Free"} ->
             /\ e.ok => e.evVa # -1
             /\ Named(e.evVa, TraceBase[e.p], e.ok)
             /\ Named(e.size, TraceResSize[e.p], e.ok)
        [] e.action = "Create" -> NewHandle(e, OwnLive(e.p))
        [] e.action \in {"Map", "MapAlias"} ->
             /\ Named(e.handle, hdl[e.p][e.alloc], e.ok)
             /\ e.ok => InReservation(e)
             /\ AtVA(e, 0, IF e.action = "Map" THEN "plane" ELSE "alias")
        [] e.action \in {"Grant", "Unmap"} -> AtVA(e, 0, e.mapping)
        [] e.action = "Release" ->
             /\ Named(e.handle, hdl[e.p][e.alloc], e.ok)
             \* (a mapping whose cuMemUnmap failed may still be live: leaked)
             /\ e.ok => /\ e.alloc \in mapped[e.p] => Own(e.p, "plane", e.alloc) \in leaked[e.p]
                        /\ e.alloc \in aliasMapped[e.p] =>
                              Own(e.p, "alias", e.alloc) \in leaked[e.p]
        [] e.action = "Export" ->
             /\ Named(e.handle, hdl[e.p][e.alloc], e.ok)
             /\ Named(e.size, TraceLen[e.alloc], e.ok)
        [] e.action \in ImportActions /\ TraceSlotOf[e.p][e.owner] < 0 -> TRUE
        [] e.action = "Import" -> NewHandle(e, Live(e.p))
        [] e.action = "ImportMap" ->
             /\ Named(e.handle, ihdl[e.p][e.owner][e.alloc], e.ok)
             /\ e.ok => InReservation(e)
             /\ AtVA(e, TraceSlotOf[e.p][e.owner], e.mapping)
        [] e.action \in {"ImportGrant", "ImportUnmap"} ->
             AtVA(e, TraceSlotOf[e.p][e.owner], e.mapping)
        [] e.action = "ImportRelease" ->
             /\ Named(e.handle, ihdl[e.p][e.owner][e.alloc], e.ok)
             /\ e.ok => \A m \in MappingKinds : <<e.owner, e.alloc, m>> \in importMapped[e.p] =>
                                                  Imp(e.owner, e.alloc, m) \in leaked[e.p]
        [] OTHER -> TRUE

\* The live handles after e.
HandlesNext(e) ==
    /\ hdl' = IF e.ok /\ e.action = "Create" THEN [hdl EXCEPT ![e.p][e.alloc] = e.handle]
              ELSE IF e.ok /\ e.action = "Release" THEN [hdl EXCEPT ![e.p][e.alloc] = -1]
              ELSE hdl
    /\ ihdl' = IF e.ok /\ e.action = "Import"
                 THEN [ihdl EXCEPT ![e.p][e.owner][e.alloc] = e.handle]
               ELSE IF e.ok /\ e.action = "ImportRelease"
                 THEN [ihdl EXCEPT ![e.p][e.owner][e.alloc] = -1]
               ELSE ihdl

\* The counters recorded with event e equal the model's after it.
StateMatches(e) ==
    e.action = "Crash" \/
    (/\ phase'[e.p] = e.phase
     /\ va'[e.p] = e.va
     /\ Cardinality(created'[e.p]) = e.created
     /\ Cardinality(mapped'[e.p]) = e.mapped
     /\ Cardinality(aliasMapped'[e.p]) = e.aliasMapped
     /\ Cardinality(access'[e.p]) = e.grants
     /\ ready'[e.p] = e.isReady
     /\ failed'[e.p] = e.isFailed
     /\ Cardinality(exported'[e.p]) = e.exported
     /\ Cardinality({x \in sent' : x[1] = e.p}) = e.sent
     /\ Cardinality(imported'[e.p]) = e.imported
     /\ Cardinality(importMapped'[e.p]) = e.importMapped
     /\ Cardinality(importAccess'[e.p]) = e.importGrants)

IsReserve(e)  == e.action = "Reserve"  /\ e.ok /\ Reserve(e.p)
IsCreate(e)   == e.action = "Create"   /\ e.ok /\ Create(e.p, e.alloc)
IsMap(e)      == e.action = "Map"      /\ e.ok /\ Map(e.p, e.alloc)
IsMapAlias(e) == e.action = "MapAlias" /\ e.ok /\ MapAlias(e.p, e.alloc)
IsExport(e)   == e.action = "Export"   /\ e.ok /\ Export(e.p, e.alloc)
IsSend(e)     == e.action = "Send"     /\ e.ok /\ Send(e.p, e.alloc, e.to)
IsImport(e)   == e.action = "Import"   /\ e.ok /\ Import(e.p, e.owner, e.alloc)
IsImportMap(e) ==
    e.action = "ImportMap" /\ e.ok /\ ImportMap(e.p, e.owner, e.alloc, e.mapping)

\* The devices the runtime granted must be exactly the model's.
IsGrant(e) ==
    /\ e.action = "Grant" /\ e.ok
    /\ Grant(e.p, e.alloc, e.mapping)
    /\ access'[e.p] = access[e.p] \cup {<<e.alloc, e.mapping, d>> : d \in e.devices}

IsImportGrant(e) ==
    /\ e.action = "ImportGrant" /\ e.ok
    /\ ImportGrant(e.p, e.owner, e.alloc, e.mapping)
    /\ importAccess'[e.p] = importAccess[e.p]
                            \cup {<<e.owner, e.alloc, e.mapping, d>> : d \in e.devices}

IsRankReady(e) == e.action = "RankReady" /\ e.ok /\ RankReady(e.p)
IsVote(e) ==
    e.action = "Vote" /\ e.ok /\ Vote(e.p, IF e.ready THEN "ready" ELSE "failed")
IsDecide(e) ==
    /\ e.action = "Decide" /\ e.ok
    /\ Decide(e.p, e.decision)
    /\ Missing = e.missingRanks
    /\ FailedVoters = e.failedRanks
IsPublish(e)   == e.action = "Publish"   /\ e.ok /\ Publish(e.p)
IsAbort(e)     == e.action = "Abort"     /\ e.ok /\ Abort(e.p)
IsUnpublish(e) == e.action = "Unpublish" /\ e.ok /\ Unpublish(e.p)
IsImportUnmap(e) ==
    e.action = "ImportUnmap" /\ e.ok /\ ImportUnmap(e.p, e.owner, e.alloc, e.mapping)
IsImportRelease(e) ==
    e.action = "ImportRelease" /\ e.ok /\ ImportRelease(e.p, e.owner, e.alloc)
IsUnmap(e)     == e.action = "Unmap"   /\ e.ok /\ Unmap(e.p, e.alloc, e.mapping)
IsRelease(e)   == e.action = "Release" /\ e.ok /\ Release(e.p, e.alloc)
IsFree(e)      == e.action = "Free"    /\ e.ok /\ Free(e.p)
IsAbortComplete(e)    == e.action = "AbortComplete"    /\ e.ok /\ AbortComplete(e.p)
IsShutdownComplete(e) == e.action = "ShutdownComplete" /\ e.ok /\ ShutdownComplete(e.p)
IsCrash(e) == e.action = "Crash" /\ Crash(e.p)

\* A failed step is Fail(p, x); the call itself, with its own arguments,
\* must have been able to run (a failed Import needs no Send: the deadline).
\* A failed Grant / ImportGrant was given its devices: the own device only.
FailedCallCouldRun(e) ==
    CASE e.action = "Reserve"     -> CanReserve(e.p)
      [] e.action = "Create"      -> CanCreate(e.p, e.alloc)
      [] e.action = "Map"         -> CanMap(e.p, e.alloc)
      [] e.action = "MapAlias"    -> CanMapAlias(e.p, e.alloc)
      [] e.action = "Grant"       -> CanGrant(e.p, e.alloc, e.mapping) /\ e.devices = {e.p}
      [] e.action = "Export"      -> CanExport(e.p, e.alloc)
      [] e.action = "Send"        -> CanSend(e.p, e.alloc, e.to) /\ e.to \in Importers[e.p]
      [] e.action = "Import"      -> CanImport(e.p, e.owner, e.alloc)
                                     /\ e.owner \in Sources(e.p)
      [] e.action = "ImportMap"   -> CanImportMap(e.p, e.owner, e.alloc, e.mapping)
      [] e.action = "ImportGrant" -> /\ CanImportGrant(e.p, e.owner, e.alloc, e.mapping)
                                     /\ e.devices = {e.p}
      [] OTHER                    -> FALSE

IsFail(e) ==
    /\ ~e.ok
    /\ e.action \in FailSteps
    /\ FailedCallCouldRun(e)
    /\ Fail(e.p, e.action)

\* A failed undo (cuMemUnmap, cuMemRelease, cuMemAddressFree of own or
\* imported memory): that object's undo was due, and it is leaked (UndoFail).
UndoActions == {"Unmap", "Release", "Free", "ImportUnmap", "ImportRelease"}
UndoObject(e) ==
    CASE e.action = "Free"          -> Own(e.p, "va", 0)
      [] e.action = "Release"       -> Own(e.p, "handle", e.alloc)
      [] e.action = "Unmap"         -> Own(e.p, e.mapping, e.alloc)
      [] e.action = "ImportRelease" -> Imp(e.owner, e.alloc, "handle")
      [] OTHER                      -> Imp(e.owner, e.alloc, e.mapping)
IsUndoFail(e) ==
    /\ ~e.ok
    /\ e.action \in UndoActions
    /\ UndoFail(e.p, UndoObject(e))

IsEvent(e) ==
    \/ IsReserve(e) \/ IsCreate(e) \/ IsMap(e) \/ IsMapAlias(e) \/ IsGrant(e)
    \/ IsExport(e) \/ IsSend(e) \/ IsImport(e) \/ IsImportMap(e) \/ IsImportGrant(e)
    \/ IsRankReady(e) \/ IsVote(e) \/ IsDecide(e) \/ IsPublish(e) \/ IsAbort(e)
    \/ IsUnpublish(e) \/ IsImportUnmap(e) \/ IsImportRelease(e) \/ IsUnmap(e)
    \/ IsRelease(e) \/ IsFree(e) \/ IsAbortComplete(e) \/ IsShutdownComplete(e)
    \/ IsCrash(e) \/ IsFail(e) \/ IsUndoFail(e)

TraceNext ==
    /\ l <= Len(Trace)
    /\ ObjectsMatch(Trace[l])
    /\ IsEvent(Trace[l])
    /\ StateMatches(Trace[l])
    /\ HandlesNext(Trace[l])
    /\ l' = l + 1

TraceSpec == TraceInit /\ [][TraceNext]_traceVars

\* Every record matched and every process ended (terminal phase, crash, or an
\* unwinding that ended leaking: an undo failed, every undo ran, and no
\* AbortComplete / ShutdownComplete).
TraceAccepted ==
    /\ l = Len(Trace) + 1
    /\ \A p \in Ranks : crashed[p] \/ phase[p] \in TerminalPhases \/ UnwindEndedLeaking(p)

\* Checked as an invariant: its violation is the verdict "accepted".
TraceNotAccepted == ~TraceAccepted

-----------------------------------------------------------------------------
(* By hand (kvgrant conform DIR --engine tlc does this):                   *)
(*   d=$(mktemp -d); python -c "from kvgrant.conformance.tla_trace import  *)
(*     write_group_module as w; w(['r0.ndjson', 'r1.ndjson'], '$d')"       *)
(*   java -DTLA-Library=$PWD/specs:$d -cp tla2tools.jar tlc2.TLC           *)
(*     -metadir $d/meta -config specs/TraceKVGroup.cfg                     *)
(*     specs/KVGroupTrace.tla                                              *)
(* "Invariant TraceNotAccepted is violated" means ACCEPTED; "Deadlock      *)
(* reached" means rejected: the last state's l is the first unmatched      *)
(* record of the interleaving.                                             *)
=============================================================================
