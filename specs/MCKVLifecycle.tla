--------------------------- MODULE MCKVLifecycle ---------------------------
(***************************************************************************)
(* Bounds for model checking KVLifecycle.  The cfg files pick the sizes    *)
(* (NumRanks, NumAllocs, Aliased, OwnerOnly) and bind the functions below: *)
(*   CONSTANT Importers <- MCImporters                                     *)
(*   CONSTANT DeclaredReaders <- MCDeclaredReaders                         *)
(* The last rank imports nothing but every rank declares it as a reader,   *)
(* so it is an overdeclared reader that must never be granted access.      *)
(***************************************************************************)
EXTENDS KVLifecycle

\* Ranks 0..NumRanks-2 import each other's memory (a DCP-like import group);
\* the last rank imports nothing.
MCImporters ==
    [r \in Ranks |-> IF r = NumRanks - 1 THEN {}
                     ELSE (0..(NumRanks - 2)) \ {r, NumRanks - 1}]

\* Exported metadata declares every rank a reader of every rank.
MCDeclaredReaders == [r \in Ranks |-> Ranks]

\* Bound the otherwise large interleaving space: at most MaxFailures ranks
\* fail in one attempt (1 keeps every step failable on every rank).
MaxFailures == 1
MCStateConstraint ==
    Cardinality({r \in Ranks : failed[r]}) <= MaxFailures

=============================================================================
