------------------------------ MODULE MCKVGroup ------------------------------
(***************************************************************************)
(* Bounds for model checking KVGroup.  The cfg files pick the sizes and   *)
(* bind  Importers <- MCImporters, DeclaredReaders <- MCDeclaredReaders.  *)
(* Importers form a chain (asymmetric): rank r's memory is imported by    *)
(* r + 1 only, so rank 0 imports nothing and the last rank's memory is    *)
(* imported by nobody.  Every rank is declared a reader of every rank, so *)
(* rank 0 (and, for rank 0's memory, every rank but 1) is an overdeclared *)
(* reader that must never be granted access.                              *)
(***************************************************************************)
EXTENDS KVGroup

MCImporters ==
    [r \in Ranks |-> IF r + 1 < NumRanks THEN {r + 1} ELSE {}]

MCDeclaredReaders == [r \in Ranks |-> Ranks]

\* Bound the interleaving space: at most MaxFailures failed steps and at
\* most MaxCrashes crashed processes in one attempt.
MaxFailures == 1
MaxCrashes == 1
MCStateConstraint ==
    /\ Cardinality({p \in Ranks : failed[p]}) <= MaxFailures
    /\ Cardinality({p \in Ranks : crashed[p]}) <= MaxCrashes

\* For liveness: crashes bounded, failures not.  GiveUp (the deadline) is fair
\* and sets failed[p]; a constraint that bounds failures cuts the GiveUp of an
\* importer whose owner failed before sending (a second failure), and TLC then
\* drops every such behaviour as unfair (GiveUp stays enabled, never taken),
\* so the deadline's failed-owner case would be checked vacuously.  Crash is
\* not fair, so bounding crashes only removes behaviours.
MCLiveConstraint ==
    Cardinality({p \in Ranks : crashed[p]}) <= MaxCrashes

\* For 3 processes: one fault in all (a failed step or a crash), which keeps
\* the state space small enough for `make verify`.
MCOneFault ==
    Cardinality({p \in Ranks : failed[p]}) + Cardinality({p \in Ranks : crashed[p]}) <= 1

\* For 2 processes: up to two faults (failed steps or a crash), so that both
\* processes fail, as when the owner's step fails before it sends and the importer
\* then times out (GiveUp, or its Import fails).  The other safety configs allow one
\* failed step in all: TLC checks the state of a second failure but none after it,
\* so what the group does when both processes failed is seen only here.
MCTwoFaults ==
    /\ Cardinality({p \in Ranks : failed[p]}) + Cardinality({p \in Ranks : crashed[p]}) <= 2
    /\ Cardinality({p \in Ranks : crashed[p]}) <= MaxCrashes

\* A crash after the process decided changes nothing for the others (no step
\* of another process waits for it then): only crashes before Decide are
\* explored (ACTION_CONSTRAINT MCCrashBeforeDecide).  True of the correct spec
\* only: the liveness config does without it, so a survivor that waits for a
\* peer which crashed after deciding is seen.
MCCrashBeforeDecide ==
    \A p \in Ranks : (crashed'[p] /\ ~crashed[p]) => decision[p] = "none"

\* One failed undo step (cuMemUnmap, cuMemRelease, cuMemAddressFree, or an
\* import's ImportUnmap / ImportRelease) in all, plus the cuMemAddressFree the
\* driver then refuses (MCKVGroup_Undo.cfg: MaxUndoFailures <- MCOneUndoFailure).
\* The other configs keep the spec's 0.
MCOneUndoFailure == 1

=============================================================================
