"""A structural check of a group's trace files (docs/group-trace.md), until the group
model's conformance checker is merged: each file on its own, then the files together."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

TERMINAL = {"AbortComplete", "ShutdownComplete"}
OWN_ORDER = ["Reserve", "Create", "Map", "MapAlias", "Grant", "Export", "Send", "Import",
             "ImportMap", "ImportGrant", "RankReady", "Vote", "Decide"]


def load(path: Path) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    lines = [json.loads(x) for x in path.read_text().splitlines()]
    assert lines and lines[0]["kind"] == "header", f"{path}: no header"
    return lines[0], lines[1:]


def check_file(path: Path, *, complete: bool = True) -> list[dict[str, Any]]:
    """One process's file: header of a group, gap-free seq, one rank, forward steps in
    the documented order, a Vote then one Decide, and (``complete``) a terminal event
    with nothing left."""
    head, events = load(path)
    assert head["mode"] == "group" and head["procs"] == head["ranks"], path
    rank = head["rank"]
    assert [e["seq"] for e in events] == list(range(len(events))), f"{path}: seq gaps"
    assert all(e["rank"] == rank for e in events), f"{path}: an event of another rank"
    forward = [e["action"] for e in events if e["action"] in OWN_ORDER]
    order = [OWN_ORDER.index(a) for a in forward]
    # Grant may follow Map/MapAlias of the next allocation only after its own Create...
    # the coarse check: no own-memory step after the first Export, no Import step
    # after RankReady/Vote, exactly one Vote and one Decide, Vote first.
    if "Export" in forward:
        first_export = forward.index("Export")
        assert not {"Create", "Map", "MapAlias", "Grant"} & set(forward[first_export:]), path
    assert forward.count("Vote") <= 1 and forward.count("Decide") <= 1, path
    if "Decide" in forward:
        assert forward.index("Vote") < forward.index("Decide"), path
        assert max(order) == OWN_ORDER.index("Decide") and forward[-1] == "Decide", path
    own_devices = {head["devices"][str(rank)]}
    for e in events:
        if e["action"] in ("Grant", "ImportGrant"):
            assert set(e["args"]["devices"]) == own_devices, f"{path}: grant beyond own device"
    check_action_properties(events)
    if complete:
        last = events[-1]
        assert last["action"] in TERMINAL, f"{path}: ends with {last['action']}"
        st = last["state"]
        assert not st["va"] and st["created"] == st["mapped"] == st["alias_mapped"] == 0, path
        assert st["grants"] == st["imported"] == st["import_mapped"] == st["import_grants"] == 0
    return events


PHASE_STEPS = {("Allocating", "Published"), ("Allocating", "Aborting"),
               ("Aborting", "Aborted"), ("Published", "ShuttingDown"),
               ("ShuttingDown", "Shutdown")}
MAKES = {"Reserve", "Create", "Map", "MapAlias", "Grant", "Export", "Send", "Import",
         "ImportMap", "ImportGrant", "RankReady"}


def check_action_properties(events: list[dict[str, Any]]) -> None:
    """specs/KVGroup.tla's action properties on one process's events, restated here
    from the events alone (not through the model): OneAttempt (the phase only moves
    forward; outside Allocating nothing is made), NoRetryAfterFailure (after a failed
    step nothing is made), MadeInPlanOrder (own handles in plan order, imports after
    them in (owner, allocation) order) and UnwindInReverseOrder (imports first, the
    newest first; then own allocations, the newest first; the VA last)."""
    imports: set[tuple[int, int]] = set()   # (owner, alloc) held
    own: set[int] = set()                   # own allocations whose handle is live
    made: list[tuple[int, ...]] = []        # handles made so far: (alloc,) or (owner, alloc)
    va = failed = False
    phase = "Allocating"
    for e in events:
        act, args = e["action"], e["args"]
        ok = e["result"] in ("CUDA_SUCCESS", "SUCCESS", None)  # None: a step with no call
        where = f"event {e['seq']} {act} {args}"
        to = e["state"]["phase"]
        assert to == phase or (phase, to) in PHASE_STEPS, f"{where}: {phase} -> {to}"
        if act in MAKES and ok:
            assert phase == "Allocating", f"{where}: made outside Allocating ({phase})"
            assert not failed, f"{where}: made after a failed step (a retry)"
        if act == "Create" and ok:
            assert made[-1:] == ([(args["alloc"] - 1,)] if args["alloc"] else []), \
                f"{where}: not in plan order"
        if act == "Import" and ok:
            key = (args["owner"], args["alloc"])
            assert made and (len(made[-1]) == 1 or made[-1] < key), f"{where}: import order"
        if act in ("ImportUnmap", "ImportRelease"):
            key = (args["owner"], args["alloc"])
            assert key in imports and key == max(imports), f"{where}: not the newest import"
        if act in ("Unmap", "Release", "Free"):
            assert not imports, f"{where}: own memory unwound while imports are held"
        if act in ("Unmap", "Release"):
            assert own and args["alloc"] == max(own), f"{where}: not the newest allocation"
        if act == "Free":
            assert not own, f"{where}: VA freed while handles are live"
        if ok:
            if act == "Reserve":
                va = True
            elif act == "Create":
                own.add(args["alloc"])
                made.append((args["alloc"],))
            elif act == "Import":
                imports.add((args["owner"], args["alloc"]))
                made.append((args["owner"], args["alloc"]))
            elif act == "ImportRelease":
                imports.discard((args["owner"], args["alloc"]))
            elif act == "Release":
                own.discard(args["alloc"])
            elif act == "Free":
                va = False
        failed = failed or (act in MAKES and not ok)
        assert e["state"]["failed"] == failed, f"{where}: failed is {e['state']['failed']}"
        phase = to
    assert not (va or own or imports) or phase not in ("Aborted", "Shutdown")


def check_group(paths: list[Path], *, dead: set[int] = frozenset()) -> str:  # type: ignore[assignment]
    """The files together: one decision everywhere, every Import after its Send, and
    sends only to importers; returns the decision."""
    heads, evs = {}, {}
    for p in paths:
        head, _ = load(p)
        r = head["rank"]
        heads[r] = head
        evs[r] = check_file(p, complete=r not in dead)
    decisions = {e["args"]["decision"] for es in evs.values() for e in es
                 if e["action"] == "Decide"}
    assert len(decisions) == 1, f"decisions disagree: {decisions}"
    # version 2: importers are the other members of each import group (the plan's topology)
    importers = {r: set() for r in heads}
    for g in next(iter(heads.values()))["topology"]["import_groups"]:
        for r in g:
            importers[r] = set(g) - {r}
    sent = {(r, e["args"]["alloc"], e["args"]["to"]) for r, es in evs.items() for e in es
            if e["action"] == "Send" and e["result"] == "SUCCESS"}
    for r, to_list in ((r, {t for (o, _, t) in sent if o == r}) for r in evs):
        assert to_list <= importers[r], f"rank {r} sent to non-importers {to_list - importers[r]}"
    for r, es in evs.items():
        for e in es:
            if e["action"] == "Import" and e["result"] == "CUDA_SUCCESS":
                o, a = e["args"]["owner"], e["args"]["alloc"]
                assert (o, a, r) in sent, f"rank {r} imported {o}/{a} that was never sent"
                assert r in importers[o]
    decision = decisions.pop()
    if decision == "publish":
        for r, es in evs.items():
            assert [e["action"] for e in es].count("RankReady") == 1
            assert "Publish" in [e["action"] for e in es]
    # and the files together are a behaviour of the group model (specs/KVGroup.tla)
    from kvgrant.conformance.group_check import check_group as model_check

    verdict = model_check([str(p) for p in paths])[0]
    assert verdict.accepted, verdict.summary()
    return decision
