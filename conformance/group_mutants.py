"""Mutants of group traces: one bug injected into a valid group, and the event
(rank, seq) where any correct engine must reject it.

The expected place comes from where the bug was put, never from an engine: the
mutated event itself, or, when the bug is a missing event, the event that the model
refuses because of it (named in each mutation's description). Base groups come from
:func:`kvgrant.conformance.group_gen.simulate_group` (valid by construction).
"""

from __future__ import annotations

import copy
import json
from dataclasses import dataclass
from typing import Any, Callable

__all__ = ["GROUP_MUTATIONS", "GroupMutant", "group_mutants", "parse_texts", "to_texts"]

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
    """Back to texts, renumbering seq (key order kept, so the fast reader applies)."""
    out = []
    for h, es in zip(heads, evs):
        lines = [json.dumps(h)]
        for k, e in enumerate(es):
            e = dict(e)
            e["seq"] = k
            lines.append(json.dumps(e))
        out.append("\n".join(lines) + "\n")
    return out


def _find(es: list[dict[str, Any]], pred: Callable[[dict[str, Any]], bool]) -> int | None:
    return next((k for k, e in enumerate(es) if pred(e)), None)


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


def _import_from_non_importer(heads: list[dict[str, Any]], evs: Raw):
    h = heads[0]
    n = h["ranks"]
    imp = {int(k): set(v) for k, v in h["importers"].items()}
    for r in range(n):
        owners = [o for o in range(n) if o != r and r not in imp.get(o, set())]
        k = _find(evs[r], lambda e: e["action"] == "RankReady")
        if owners and k is not None:
            o = owners[-1]
            ev = copy.deepcopy(evs[r][k - 1])
            ev.update(action="Import", args={"owner": o, "alloc": 0},
                      call="cuMemImportFromShareableHandle", result="CUDA_SUCCESS")
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
    imp = {int(k): set(v) for k, v in h["importers"].items()}
    for r, es in enumerate(evs):
        others = [q for q in range(n) if q != r and q not in imp.get(r, set())]
        k = _find(es, lambda e: e["action"] == "Export")
        if others and k is not None:
            ev = copy.deepcopy(es[k])
            ev.update(action="Send", args={"alloc": ev["args"]["alloc"], "to": others[0]},
                      call="sendmsg", result="SUCCESS")
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
}


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
