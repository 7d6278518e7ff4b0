--------------------------- MODULE MCKVLifecycle ---------------------------
(***************************************************************************)
(* Bounds for model checking KVLifecycle.  The cfg files pick the sizes    *)
(* (NumRanks, NumAllocs, Aliased, OwnerOnly) and bind the functions below: *)
(*   CONSTANT Importers <- MCImporters                                     *)
(*   CONSTANT DeclaredReaders <- MCDeclaredReaders                         *)
(* The importer relation is asymmetric (rank d imports rank r's memory     *)
(* iff d < r, except the last rank, which imports nothing), so a spec that *)
(* transposes it is caught; every rank declares every rank a reader, so    *)
(* the last rank is an overdeclared reader that must never get access.     *)
(* No symmetry set: neither ranks (asymmetric importers) nor allocations   *)
(* (plan order) are interchangeable.                                       *)
(***************************************************************************)
EXTENDS KVLifecycle

\* Importers[r] = the ranks below r, the last rank excluded: with 3 ranks
\* rank 0 imports ranks 1 and 2, rank 1 imports rank 2 (not rank 0), and
\* rank 2 imports nothing.
MCImporters ==
    [r \in Ranks |-> {d \in 0..(NumRanks - 2) : d < r}]

\* Exported metadata declares every rank a reader of every rank.
MCDeclaredReaders == [r \in Ranks |-> Ranks]

\* Bound the otherwise large interleaving space: at most MaxFailures ranks
\* fail in one attempt (1 keeps every step failable on every rank).
MaxFailures == 1
MCStateConstraint ==
    Cardinality({r \in Ranks : failed[r]}) <= MaxFailures

\* At most two failing ranks (the liveness config: two ranks fail, at any
\* step each, and the attempt must still end in Aborted).
MCTwoFailures ==
    Cardinality({r \in Ranks : failed[r]}) <= 2

\* One failed undo step (cuMemUnmap, cuMemRelease or cuMemAddressFree) in an
\* attempt, plus the cuMemAddressFree the driver then refuses
\* (MCKVLifecycle_Undo.cfg: MaxUndoFailures <- MCOneUndoFailure).  The other
\* configs keep the spec's 0: one failed undo multiplies the unwinding states
\* (MCKVLifecycle.cfg: 32,733 -> 213,504), and a leaked object is never
\* released, which the liveness properties rightly reject.
MCOneUndoFailure == 1

=============================================================================
