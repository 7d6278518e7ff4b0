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
(***************************************************************************)
EXTENDS KVGroup, KVGroupTraceData, Integers, Sequences, FiniteSets

\* Record fields (all present; -1 / "none" / {} when unused): p, action,
\* owner, alloc, mapping, devices (ranks), to, ready, decision, failedRanks,
\* missingRanks, ok, and the recorded state: phase, va, created, mapped,
\* aliasMapped, grants, isReady, isFailed, exported, sent, imported,
\* importMapped, importGrants.

VARIABLE l   \* cursor: 1-based position of the next record to match

traceVars == <<vars, l>>

TerminalPhases == {"Published", "Aborted", "Shutdown"}

TraceInit == Init /\ l = 1

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
FailedCallCouldRun(e) ==
    CASE e.action = "Reserve"     -> CanReserve(e.p)
      [] e.action = "Create"      -> CanCreate(e.p, e.alloc)
      [] e.action = "Map"         -> CanMap(e.p, e.alloc)
      [] e.action = "MapAlias"    -> CanMapAlias(e.p, e.alloc)
      [] e.action = "Grant"       -> CanGrant(e.p, e.alloc, e.mapping)
      [] e.action = "Export"      -> CanExport(e.p, e.alloc)
      [] e.action = "Send"        -> CanSend(e.p, e.alloc, e.to) /\ e.to \in Importers[e.p]
      [] e.action = "Import"      -> CanImport(e.p, e.owner, e.alloc)
                                     /\ e.owner \in Sources(e.p)
      [] e.action = "ImportMap"   -> CanImportMap(e.p, e.owner, e.alloc, e.mapping)
      [] e.action = "ImportGrant" -> CanImportGrant(e.p, e.owner, e.alloc, e.mapping)
      [] OTHER                    -> FALSE

IsFail(e) ==
    /\ ~e.ok
    /\ e.action \in FailSteps
    /\ FailedCallCouldRun(e)
    /\ Fail(e.p, e.action)

IsEvent(e) ==
    \/ IsReserve(e) \/ IsCreate(e) \/ IsMap(e) \/ IsMapAlias(e) \/ IsGrant(e)
    \/ IsExport(e) \/ IsSend(e) \/ IsImport(e) \/ IsImportMap(e) \/ IsImportGrant(e)
    \/ IsRankReady(e) \/ IsVote(e) \/ IsDecide(e) \/ IsPublish(e) \/ IsAbort(e)
    \/ IsUnpublish(e) \/ IsImportUnmap(e) \/ IsImportRelease(e) \/ IsUnmap(e)
    \/ IsRelease(e) \/ IsFree(e) \/ IsAbortComplete(e) \/ IsShutdownComplete(e)
    \/ IsCrash(e) \/ IsFail(e)

TraceNext ==
    /\ l <= Len(Trace)
    /\ IsEvent(Trace[l])
    /\ StateMatches(Trace[l])
    /\ l' = l + 1

TraceSpec == TraceInit /\ [][TraceNext]_traceVars

\* Every record matched and every process ended (terminal phase or crash).
TraceAccepted ==
    /\ l = Len(Trace) + 1
    /\ \A p \in Ranks : crashed[p] \/ phase[p] \in TerminalPhases

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
