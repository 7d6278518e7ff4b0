"""Mutants of group traces: one bug injected into a valid group, and the event
(rank, seq) where any correct engine must reject it.

The expected place comes from where the bug was put, never from an engine: the
mutated event itself, or, when the bug is a missing event, the event that the model
refuses because of it (named in each mutation's description). Base groups come from
:func:`kvgrant.conformance.group_gen.simulate_group` (valid by construction).

:data:`OBJECT_MUTATIONS` act on the objects a version-2 event names (device, VA, handle)
with the order of steps unchanged: only the object checks
(:mod:`kvgrant.conformance.group_objects`) can reject them; the rejection must name the
object (``OBJECT_WORDS``).
"""

from __future__ import annotations

import copy
import json
from dataclasses import dataclass
from typing import Any, Callable

from kvgrant.traceformat import GROUP_SHAPES, format_group_event

__all__ = ["GROUP_MUTATIONS", "GroupMutant", "OBJECT_MUTATIONS", "OBJECT_WORDS",
           "group_mutants", "parse_texts", "to_texts"]

Raw = list[list[dict[str, Any]]]   # per rank: its events as dicts


@dataclass(frozen=True)
class GroupMutant:
    """Per-rank NDJSON texts with one bug, and where it must be rejected."""

    name: str
    texts: list[str]
    rank: int
    seq: int
    description: str


def parse_texts(texts: list[str]) -> tuple[list[dict[str, Any]], Raw]:
    """Headers and events of per-rank texts."""
    heads, evs = [], []
    for text in texts:
        lines = [json.loads(ln) for ln in text.splitlines() if ln.strip()]
        heads.append(lines[0])
        evs.append(lines[1:])
    return heads, evs


def to_texts(heads: list[dict[str, Any]], evs: Raw) -> list[str]:
    """Back to texts, renumbering seq (the writer's line: the fast reader applies)."""
    out = []
    for h, es in zip(heads, evs):
        lines = [json.dumps(h)]
        for k, e in enumerate(es):
            e = dict(e)
            e["seq"] = k
            lines.append(format_group_event(e))
        out.append("\n".join(lines) + "\n")
    return out


def _find(es: list[dict[str, Any]], pred: Callable[[dict[str, Any]], bool]) -> int | None:
    return next((k for k, e in enumerate(es) if pred(e)), None)


def _importers(h: dict[str, Any]) -> dict[int, set[int]]:
    """rank -> its importers, from the header's import groups (as the readers derive them)."""
    out: dict[int, set[int]] = {}
    for g in h["topology"]["import_groups"]:
        for r in g:
            out[r] = set(g) - {r}
    return out


def _other_device(h: dict[str, Any], r: int) -> int:
    devs = {int(k): v for k, v in h["devices"].items()}
    own = devs.get(r, r)
    return next((d for q, d in sorted(devs.items()) if d != own), own + 1)


def _grant_other_device(heads: list[dict[str, Any]], evs: Raw):
    for r, es in enumerate(evs):
        k = _find(es, lambda e: e["action"] == "Grant" and e["result"] == "CUDA_SUCCESS")
        if k is not None:
            es[k]["args"]["devices"] = sorted(es[k]["args"]["devices"]
                                              + [_other_device(heads[r], r)])
            es[k]["state"]["grants"] += 1
            return r, k, f"rank {r}'s Grant at seq {k} also grants another device"
    return None


def _import_grant_other_device(heads: list[dict[str, Any]], evs: Raw):
    for r, es in enumerate(evs):
        k = _find(es, lambda e: e["action"] == "ImportGrant" and e["result"] == "CUDA_SUCCESS")
        if k is not None:
            owner = es[k]["args"]["owner"]
            es[k]["args"]["devices"] = sorted(set(es[k]["args"]["devices"])
                                              | {heads[r]["devices"][str(owner)]})
            es[k]["state"]["import_grants"] += 1
            return r, k, (f"importer {r}'s ImportGrant at seq {k} also grants the owner's "
                          f"device (rank {owner})")
    return None


def _null_unset_fields(ev: dict[str, Any]) -> None:
    """An event made from another action's line keeps a well-formed line: the object
    fields its own action leaves null (GROUP_SHAPES) become null, so the mutant is
    rejected by the model at its event, not by the reader."""
    shape = GROUP_SHAPES[ev["action"]]
    for key in ("va", "size", "handle"):
        if not getattr(shape, key):
            ev[key] = None


def _import_from_non_importer(heads: list[dict[str, Any]], evs: Raw):
    h = heads[0]
    n = h["ranks"]
    imp = _importers(h)
    for r in range(n):
        owners = [o for o in range(n) if o != r and r not in imp.get(o, set())]
        k = _find(evs[r], lambda e: e["action"] == "RankReady")
        if owners and k is not None:
            o = owners[-1]
            ev = copy.deepcopy(evs[r][k - 1])
            ev.update(action="Import", args={"owner": o, "alloc": 0},
                      call="cuMemImportFromShareableHandle", result="CUDA_SUCCESS")
            _null_unset_fields(ev)
            ev["state"]["imported"] += 1
            evs[r].insert(k, ev)
            return r, k, (f"rank {r} (not an importer of rank {o}) imports rank {o}'s "
                          f"allocation 0 at seq {k}; no Send to it exists")
    return None


def _publish_while_abort(heads: list[dict[str, Any]], evs: Raw):
    for r, es in enumerate(evs):
        k = _find(es, lambda e: e["action"] == "Decide" and e["args"]["decision"] == "abort")
        if k is not None:
            es[k]["args"]["decision"] = "publish"
            return r, k, f"rank {r} decides publish at seq {k} while the votes say abort"
    return None


def _importer_keeps_mapping(heads: list[dict[str, Any]], evs: Raw):
    for r, es in enumerate(evs):
        a = _find(es, lambda e: e["action"] == "Abort")
        k = _find(es, lambda e: e["action"] == "ImportUnmap")
        if a is not None and k is not None and k > a:
            del es[k]
            return r, k, (f"importer {r} skips an ImportUnmap after Abort; its next unwinding "
                          f"step (seq {k}) is refused")
    return None


def _import_without_send(heads: list[dict[str, Any]], evs: Raw):
    for o, es in enumerate(evs):
        k = _find(es, lambda e: e["action"] == "Send")
        if k is None:
            continue
        a, i = es[k]["args"]["alloc"], es[k]["args"]["to"]
        j = _find(evs[i], lambda e: e["action"] == "Import" and e["args"]["owner"] == o
                  and e["args"]["alloc"] == a and e["result"] == "CUDA_SUCCESS")
        if j is None:
            continue
        del es[k:]   # the owner crashes before that Send
        return i, j, (f"rank {o} dies before sending allocation {a}, yet rank {i} imports it "
                      f"at seq {j}")
    return None


def _decide_before_vote(heads: list[dict[str, Any]], evs: Raw):
    for r, es in enumerate(evs):
        k = _find(es, lambda e: e["action"] == "Vote")
        if k is not None and k + 1 < len(es) and es[k + 1]["action"] == "Decide":
            es[k], es[k + 1] = es[k + 1], es[k]
            return r, k, f"rank {r} decides (seq {k}) before its own Vote"
    return None


def _decide_without_live_vote(heads: list[dict[str, Any]], evs: Raw):
    n = heads[0]["ranks"]
    for r, es in enumerate(evs):
        k = _find(es, lambda e: e["action"] == "Decide")
        if k is not None and n > 1:
            q = (r + 1) % n
            es[k]["args"]["missing"] = sorted(set(es[k]["args"]["missing"]) | {q})
            es[k]["args"]["decision"] = "abort"
            return r, k, (f"rank {r} names rank {q} missing at seq {k}, but rank {q} is alive "
                          "and votes")
    return None


def _vote_ready_after_failure(heads: list[dict[str, Any]], evs: Raw):
    for r, es in enumerate(evs):
        k = _find(es, lambda e: e["action"] == "Vote" and not e["args"]["ready"])
        if k is not None:
            es[k]["args"] = {"ready": True}
            return r, k, f"rank {r} votes ready at seq {k} after a failed step"
    return None


def _send_to_non_importer(heads: list[dict[str, Any]], evs: Raw):
    h = heads[0]
    n = h["ranks"]
    imp = _importers(h)
    for r, es in enumerate(evs):
        others = [q for q in range(n) if q != r and q not in imp.get(r, set())]
        k = _find(es, lambda e: e["action"] == "Export")
        if others and k is not None:
            ev = copy.deepcopy(es[k])
            ev.update(action="Send", args={"alloc": ev["args"]["alloc"], "to": others[0]},
                      call="sendmsg", result="SUCCESS")
            _null_unset_fields(ev)
            ev["state"]["sent"] += 1
            es.insert(k + 1, ev)
            return r, k + 1, (f"rank {r} sends an fd to rank {others[0]} (a declared reader "
                              f"that is not an importer) at seq {k + 1}")
    return None


def _release_import_before_unmap(heads: list[dict[str, Any]], evs: Raw):
    for r, es in enumerate(evs):
        k = _find(es, lambda e: e["action"] == "ImportUnmap"
                  and e["args"]["mapping"] == "plane")
        if k is not None and k + 1 < len(es) and es[k + 1]["action"] == "ImportRelease":
            es[k], es[k + 1] = es[k + 1], es[k]
            return r, k, f"importer {r} releases an imported handle at seq {k} while mapped"
    return None


def _map_before_import(heads: list[dict[str, Any]], evs: Raw):
    for r, es in enumerate(evs):
        k = _find(es, lambda e: e["action"] == "Import" and e["result"] == "CUDA_SUCCESS")
        if k is not None and k + 1 < len(es) and es[k + 1]["action"] == "ImportMap":
            es[k], es[k + 1] = es[k + 1], es[k]
            return r, k, f"importer {r} maps a handle at seq {k} before importing it"
    return None


#: name -> mutation of (headers, per-rank events), returning (rank, seq, description) or
#: None when the group offers no place for this bug.
def _complete_after_failed_undo(heads: list[dict[str, Any]], evs: Raw):
    """The runtime mutant "AbortComplete traced although an undo failed" (group.py
    ``_abort``): a process's cuMemAddressFree fails (it keeps the VA, as the runtime
    records it) and it still traces AbortComplete / ShutdownComplete."""
    for r, es in enumerate(evs):
        k = _find(es, lambda e: e["action"] in ("AbortComplete", "ShutdownComplete"))
        if k is None or k == 0 or es[k - 1]["action"] != "Free" \
                or es[k - 1].get("result") != "CUDA_SUCCESS":
            continue
        ready = bool(k >= 2 and es[k - 2]["state"].get("ready"))
        es[k - 1]["result"] = "CUDA_ERROR_OUT_OF_MEMORY"
        for e in (es[k - 1], es[k]):
            e["state"]["va"] = True
            e["state"]["ready"] = ready
        return r, k, (f"rank {r}'s cuMemAddressFree at seq {k - 1} failed, yet it traces "
                      f"{es[k]['action']} at seq {k}")
    return None


GROUP_MUTATIONS: dict[str, Callable[[list[dict[str, Any]], Raw], Any]] = {
    "grant_other_device": _grant_other_device,
    "import_grant_other_device": _import_grant_other_device,
    "import_from_non_importer": _import_from_non_importer,
    "publish_while_abort": _publish_while_abort,
    "importer_keeps_mapping": _importer_keeps_mapping,
    "import_without_send": _import_without_send,
    "decide_before_vote": _decide_before_vote,
    "decide_without_live_vote": _decide_without_live_vote,
    "vote_ready_after_failure": _vote_ready_after_failure,
    "send_to_non_importer": _send_to_non_importer,
    "release_import_before_unmap": _release_import_before_unmap,
    "map_before_import": _map_before_import,
    "complete_after_failed_undo": _complete_after_failed_undo,
}


# --- object identity (version 2) -------------------------------------------------------------

def _ok(e: dict[str, Any]) -> bool:
    return e["result"] in (None, "CUDA_SUCCESS", "SUCCESS")


def _res(h: dict[str, Any], r: int) -> tuple[int, int, int]:
    base, size = h["reservations"][str(r)]
    return base, size, h["granularity"]


def _first(evs: Raw, pred: Callable[[dict[str, Any]], bool]) -> tuple[int, int] | None:
    for r, es in enumerate(evs):
        k = _find(es, lambda e: _ok(e) and pred(e))
        if k is not None:
            return r, k
    return None


def _grant_names_another_device(heads: list[dict[str, Any]], evs: Raw):
    at = _first(evs, lambda e: e["action"] == "Grant")
    if at is None:
        return None
    r, k = at
    other = _other_device(heads[r], r)
    evs[r][k]["args"]["devices"] = [other]
    return r, k, (f"rank {r}'s Grant at seq {k} (alloc {evs[r][k]['args']['alloc']}) grants "
                  f"device {other} instead of its own")


def _map_at_wrong_va(heads: list[dict[str, Any]], evs: Raw):
    at = _first(evs, lambda e: e["action"] == "Map" and e["args"]["alloc"] > 0)
    if at is None:
        return None
    r, k = at
    evs[r][k]["va"] += _res(heads[r], r)[2]
    return r, k, f"rank {r}'s Map at seq {k} is one granule off the plan's VA"


def _map_outside_reservation(heads: list[dict[str, Any]], evs: Raw):
    at = _first(evs, lambda e: e["action"] == "Map")
    if at is None:
        return None
    r, k = at
    base, size, _ = _res(heads[r], r)
    evs[r][k]["va"] = base + size
    return r, k, f"rank {r}'s Map at seq {k} lies past the end of its reservation"


def _import_map_of_a_handle_not_imported(heads: list[dict[str, Any]], evs: Raw):
    at = _first(evs, lambda e: e["action"] == "ImportMap")
    if at is None:
        return None
    r, k = at
    own = [e["handle"] for e in evs[r] if e["action"] == "Create" and _ok(e)]
    evs[r][k]["handle"] = own[0]   # a handle of this process, not the imported one
    return r, k, (f"importer {r}'s ImportMap at seq {k} maps its own allocation 0's handle, "
                  "not the imported one")


def _unmap_at_wrong_va(heads: list[dict[str, Any]], evs: Raw):
    at = _first(evs, lambda e: e["action"] == "Unmap")
    if at is None:
        return None
    r, k = at
    evs[r][k]["va"] += _res(heads[r], r)[2]
    return r, k, f"rank {r}'s Unmap at seq {k} names a VA one granule off the live mapping"


def _import_unmap_at_wrong_va(heads: list[dict[str, Any]], evs: Raw):
    at = _first(evs, lambda e: e["action"] == "ImportUnmap")
    if at is None:
        return None
    r, k = at
    evs[r][k]["va"] -= _res(heads[r], r)[2]
    return r, k, f"importer {r}'s ImportUnmap at seq {k} names a VA off the live mapping"


def _release_with_live_mapping(heads: list[dict[str, Any]], evs: Raw):
    for r, es in enumerate(evs):
        k = _find(es, lambda e: e["action"] == "Unmap" and e["args"]["mapping"] == "plane")
        if k is not None and k + 1 < len(es) and es[k + 1]["action"] == "Release":
            es[k], es[k + 1] = es[k + 1], es[k]
            es[k]["state"]["created"] -= 1
            es[k]["state"]["mapped"] += 1
            es[k]["state"]["grants"] += 1
            return r, k, (f"rank {r} releases allocation {es[k]['args']['alloc']}'s handle at "
                          f"seq {k} while its plane mapping is live")
    return None


def _event_on_another_device(heads: list[dict[str, Any]], evs: Raw):
    at = _first(evs, lambda e: e["action"] == "Create")
    if at is None:
        return None
    r, k = at
    evs[r][k]["device"] = _other_device(heads[r], r)
    return r, k, f"rank {r}'s Create at seq {k} names another process's device"


#: Object-identity mutations (version 2), as GROUP_MUTATIONS.
OBJECT_MUTATIONS: dict[str, Callable[[list[dict[str, Any]], Raw], Any]] = {
    "grant_names_another_device": _grant_names_another_device,
    "map_at_wrong_va": _map_at_wrong_va,
    "map_outside_reservation": _map_outside_reservation,
    "import_map_of_a_handle_not_imported": _import_map_of_a_handle_not_imported,
    "unmap_at_wrong_va": _unmap_at_wrong_va,
    "import_unmap_at_wrong_va": _import_unmap_at_wrong_va,
    "release_with_live_mapping": _release_with_live_mapping,
    "event_on_another_device": _event_on_another_device,
}
#: Words the rejection of each object mutant must contain (it names the object).
OBJECT_WORDS: dict[str, tuple[str, ...]] = {
    "grant_names_another_device": ("alloc", "va [", "own device"),
    "map_at_wrong_va": ("alloc", "handle", "the plan puts"),
    "map_outside_reservation": ("alloc", "outside the reservation"),
    "import_map_of_a_handle_not_imported": ("owner", "alloc", "handle", "imported for it"),
    "unmap_at_wrong_va": ("alloc", "mapping is at"),
    "import_unmap_at_wrong_va": ("owner", "alloc", "mapping is at"),
    "release_with_live_mapping": ("alloc", "handle", "mapping is live"),
    "event_on_another_device": ("device",),
}
GROUP_MUTATIONS.update(OBJECT_MUTATIONS)


def group_mutants(texts: list[str], names: list[str] | None = None) -> list[GroupMutant]:
    """Every applicable mutant of a valid group (a mutation with no place is skipped)."""
    out = []
    for name in names if names is not None else list(GROUP_MUTATIONS):
        heads, evs = parse_texts(texts)
        res = GROUP_MUTATIONS[name](heads, evs)
        if res is None:
            continue
        r, k, desc = res
        out.append(GroupMutant(name, to_texts(heads, evs), r, k, desc))
    return out
