-------------------------- MODULE KVLifecycleTrace --------------------------
(***************************************************************************)
(* Trace validation of KVLifecycle: does a runtime trace describe a        *)
(* behaviour of the lifecycle model?  This module EXTENDS the spec (it     *)
(* never copies it) and reads the trace from the generated module          *)
(* KVTraceData (written by kvgrant.conformance.tla_trace into a temporary  *)
(* directory on TLC's module path), because the pinned TLC 2.15 has no     *)
(* Json module.                                                            *)
(*                                                                         *)
(* One IsX(e) per event kind: each conjoins the spec's own action X with   *)
(* the event's arguments, and StateMatches(e) pins the recorded abstract   *)
(* state (phase and the acting rank's counters); every spec action already *)
(* pins all variables (UNCHANGED), and IsGrant pins the granted devices,   *)
(* so trace mode is deterministic and BFS follows a single path.           *)
(*                                                                         *)
(* TLC 2.15 has no POSTCONDITION, so acceptance is an invariant over the   *)
(* cursor l: TraceNotAccepted is violated exactly when every event matched *)
(* and the model sits in a terminal phase.  A rejected trace deadlocks     *)
(* instead; the last state of the counterexample has l = the 1-based       *)
(* position of the first unmatched event (Len(Trace) + 1: the trace ended  *)
(* in a non-terminal phase).                                               *)
(*                                                                         *)
(* Objects (ObjectsMatch, with the history variable hdl): every rank event *)
(* is on the rank's device; Reserve/Free name the header's reservation;     *)
(* Map/MapAlias name the allocation's live handle at base + its plane      *)
(* (alias) offset with its length, inside the reservation; Grant/Unmap     *)
(* name that mapping's VA and size; Create returns a handle not live on    *)
(* any rank (the ranks share one process, whose handles are unique);      *)
(* Release names the live handle of an unmapped allocation (or of one     *)
(* whose mapping leaked: its cuMemUnmap failed).                          *)
(* The same rules as kvgrant.conformance.objects (the Python engine).      *)
(* TLC's integers are 32-bit: VAs come as granules from the rank's base,   *)
(* sizes in granules, handles by order of appearance (-1 null, -2 a value  *)
(* no plan position has); see kvgrant.conformance.tla_trace.               *)
(*                                                                         *)
(* Omitted: the trace's times.                                             *)
(***************************************************************************)
EXTENDS KVLifecycle, KVTraceData, Integers, Sequences, FiniteSets

\* Trace record fields (all present in every record; -1 / "none" when unused):
\*   action, rank, alloc, mapping, devices (ranks), ok (driver result was
\*   CUDA_SUCCESS or null), hasResult, phase, va, created, mapped,
\*   aliasMapped, grants, ready, failed, device (CUDA ordinal), evVa (granules
\*   from the rank's base), size (granules), handle (id by appearance),
\*   failedRank (an Abort's args.failed_rank).

VARIABLE l     \* cursor: 1-based position of the next trace event to match
VARIABLE hdl   \* hdl[r][a]: id of allocation a's live handle on rank r (-1: none)

traceVars == <<vars, l, hdl>>

TerminalPhases == {"Published", "Aborted", "Shutdown"}

\* Trace validation allows any number of failed undo steps (the config binds
\* the spec's MaxUndoFailures to it).
TraceMaxUndoFailures == 1000000000

TraceInit ==
    /\ Init
    /\ l = 1
    /\ hdl = [r \in Ranks |-> [a \in Allocs |-> -1]]

\* The VA (granules from the base) of mapping m of allocation a on rank r.
MapVA(r, a, m) ==
    TraceBase[r] + (IF m = "plane" THEN TraceMapOff[a] ELSE TraceAliasOff[a])

\* A field that a successful event must name, and a failed one may: it is want.
Named(x, want, ok) == (ok \/ x # -1) => x = want

\* The event acts on the object the header's plan names (see the header).
\* (IF, not \/: inside an action TLC explores every disjunct.)
ObjectsMatch(e) ==
    IF ~TraceChecksObjects \/ e.rank < 0 THEN TRUE ELSE
       /\ e.device = TraceDevice[e.rank]
       /\ CASE e.action \in {"Reserve", "Free"} ->
                 /\ e.ok => e.evVa # -1
                 /\ Named(e.evVa, TraceBase[e.rank], e.ok)
                 /\ Named(e.size, TraceResSize[e.rank], e.ok)
            [] e.action = "Create" ->
                 /\ Named(e.size, TraceLen[e.alloc], e.ok)
                 /\ e.ok => /\ e.handle # -1
                            /\ e.handle \notin {hdl[q][b] : q \in Ranks, b \in Allocs}
                 /\ ~e.ok => e.handle = -1
            [] e.action \in {"Map", "MapAlias"} ->
                 LET m == IF e.action = "Map" THEN "plane" ELSE "alias" IN
                 /\ Named(e.handle, hdl[e.rank][e.alloc], e.ok)
                 /\ Named(e.evVa, MapVA(e.rank, e.alloc, m), e.ok)
                 /\ Named(e.size, TraceLen[e.alloc], e.ok)
                 /\ e.ok => /\ TraceBase[e.rank] <= e.evVa
                            /\ e.evVa + e.size <= TraceBase[e.rank] + TraceResSize[e.rank]
            [] e.action \in {"Grant", "Unmap"} ->
                 /\ Named(e.evVa, MapVA(e.rank, e.alloc, e.mapping), e.ok)
                 /\ Named(e.size, TraceLen[e.alloc], e.ok)
            [] e.action = "Release" ->
                 /\ Named(e.handle, hdl[e.rank][e.alloc], e.ok)
                 /\ e.ok => /\ e.alloc \in mapped[e.rank] =>
                                  <<"plane", e.alloc>> \in leaked[e.rank]
                            /\ e.alloc \in aliasMapped[e.rank] =>
                                  <<"alias", e.alloc>> \in leaked[e.rank]
            [] OTHER -> TRUE

\* The live handles after e.
HandlesNext(e) ==
    hdl' = IF e.ok /\ e.action = "Create" /\ e.rank >= 0
              THEN [hdl EXCEPT ![e.rank][e.alloc] = e.handle]
           ELSE IF e.ok /\ e.action = "Release" /\ e.rank >= 0
              THEN [hdl EXCEPT ![e.rank][e.alloc] = -1]
           ELSE hdl

\* The abstract state recorded with event e equals the model state after it.
StateMatches(e) ==
    /\ phase' = e.phase
    /\ e.rank >= 0 =>
         /\ va'[e.rank] = e.va
         /\ Cardinality(created'[e.rank]) = e.created
         /\ Cardinality(mapped'[e.rank]) = e.mapped
         /\ Cardinality(aliasMapped'[e.rank]) = e.aliasMapped
         /\ Cardinality(access'[e.rank]) = e.grants
         /\ ready'[e.rank] = e.ready
         /\ failed'[e.rank] = e.failed


\* Steps that only the model takes carry no driver result.
ModelOnly(e) == ~e.hasResult

IsReserve(e)  == e.action = "Reserve"  /\ e.ok /\ Reserve(e.rank)
IsCreate(e)   == e.action = "Create"   /\ e.ok /\ Create(e.rank, e.alloc)
IsMap(e)      == e.action = "Map"      /\ e.ok /\ Map(e.rank, e.alloc)
IsMapAlias(e) == e.action = "MapAlias" /\ e.ok /\ MapAlias(e.rank, e.alloc)

\* The devices the runtime granted must be exactly the ones the model grants.
IsGrant(e) ==
    /\ e.action = "Grant"
    /\ e.ok
    /\ Grant(e.rank, e.alloc, e.mapping)
    /\ access'[e.rank] = access[e.rank] \cup {<<e.alloc, e.mapping, d>> : d \in e.devices}

IsRankReady(e) == e.action = "RankReady" /\ ModelOnly(e) /\ RankReady(e.rank)
IsPublish(e)   == e.action = "Publish"   /\ ModelOnly(e) /\ Publish

\* A failed driver call is Fail(r, x); the call itself, with its own
\* arguments, must have been able to run.  A failed Grant was given its
\* devices too: they are the model's (a cuMemSetAccess to a declared reader
\* that failed, e.g. at the handle budget, is still the wrong call).
FailedCallCouldRun(e) ==
    CASE e.action = "Reserve"  -> CanReserve(e.rank)
      [] e.action = "Create"   -> CanCreate(e.rank, e.alloc)
      [] e.action = "Map"      -> CanMap(e.rank, e.alloc)
      [] e.action = "MapAlias" -> CanMapAlias(e.rank, e.alloc)
      [] e.action = "Grant"    -> /\ CanGrant(e.rank, e.alloc, e.mapping)
                                  /\ e.devices = GrantSet(e.rank, e.alloc, e.mapping)
      [] OTHER                 -> FALSE

IsFail(e) ==
    /\ ~e.ok
    /\ e.action \in FailSteps
    /\ FailedCallCouldRun(e)
    /\ Fail(e.rank, e.action)

\* Abort names a rank whose driver step failed (failedRank; -1 for null).
IsAbort(e)     == e.action = "Abort"     /\ ModelOnly(e)
                  /\ e.failedRank \in Ranks /\ failed[e.failedRank] /\ Abort
IsUnpublish(e) == e.action = "Unpublish" /\ ModelOnly(e) /\ Unpublish
IsUnmap(e)     == e.action = "Unmap"     /\ e.ok /\ Unmap(e.rank, e.alloc, e.mapping)
IsRelease(e)   == e.action = "Release"   /\ e.ok /\ Release(e.rank, e.alloc)
IsFree(e)      == e.action = "Free"      /\ e.ok /\ Free(e.rank)
\* A failed cuMemUnmap / cuMemRelease / cuMemAddressFree: the undo of that
\* object was due, and it is leaked (UndoFail).
UndoObject(e) ==
    CASE e.action = "Free"    -> <<"va", 0>>
      [] e.action = "Release" -> <<"handle", e.alloc>>
      [] OTHER                -> <<e.mapping, e.alloc>>
IsUndoFail(e)  == ~e.ok /\ e.action \in UndoSteps /\ e.rank \in Ranks
                  /\ UndoFail(e.rank, UndoObject(e))
IsAbortComplete(e)    == e.action = "AbortComplete"    /\ ModelOnly(e) /\ AbortComplete
IsShutdownComplete(e) == e.action = "ShutdownComplete" /\ ModelOnly(e) /\ ShutdownComplete

IsEvent(e) ==
    \/ IsReserve(e) \/ IsCreate(e) \/ IsMap(e) \/ IsMapAlias(e) \/ IsGrant(e)
    \/ IsRankReady(e) \/ IsPublish(e) \/ IsFail(e) \/ IsAbort(e) \/ IsUnpublish(e)
    \/ IsUnmap(e) \/ IsRelease(e) \/ IsFree(e) \/ IsUndoFail(e) \/ IsAbortComplete(e)
    \/ IsShutdownComplete(e)

TraceNext ==
    /\ l <= Len(Trace)
    /\ ObjectsMatch(Trace[l])
    /\ IsEvent(Trace[l])
    /\ StateMatches(Trace[l])
    /\ HandlesNext(Trace[l])
    /\ l' = l + 1

TraceSpec == TraceInit /\ [][TraceNext]_traceVars

\* Every event matched and the model is in a terminal phase, or its unwinding
\* ended leaking (an undo failed; every rank ran every undo; no
\* AbortComplete / ShutdownComplete).
TraceAccepted == l = Len(Trace) + 1 /\ (phase \in TerminalPhases \/ UnwindEndedLeaking)

\* Checked as an invariant: its violation is the verdict "accepted".
TraceNotAccepted == ~TraceAccepted

-----------------------------------------------------------------------------
(* Running it by hand (kvgrant conform TRACE --engine tlc does this):    *)
(*   d=$(mktemp -d); python -c "from kvgrant.conformance.tla_trace import *)
(*     write_trace_module as w; w('trace.ndjson', '$d')"                  *)
(*   java -DTLA-Library=$PWD/specs:$d -cp tla2tools.jar tlc2.TLC          *)
(*     -metadir $d/meta -config specs/TraceKVLifecycle.cfg                *)
(*     specs/KVLifecycleTrace.tla                                         *)
(* "Invariant TraceNotAccepted is violated" means ACCEPTED; "Deadlock     *)
(* reached" means rejected: the last state's l is the first unmatched     *)
(* event.                                                                 *)
=============================================================================
