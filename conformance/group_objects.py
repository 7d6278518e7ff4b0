"""Object identity checks of one process's group trace (version 2): each event acts on
the object the plan names.

Why apart from the group model: ``KVGroup.tla`` (and :mod:`group_model`) abstract VAs,
sizes and handles away; this module checks that each step acts on the right object,
with the one-process rules of :class:`kvgrant.conformance.objects.ObjectChecker` for
the process's own memory (it is that checker, on the process's rank) and the same
rules for imported memory. For every event of process p:

* ``device`` is p's own device (header ``devices[p]``);
* own memory: as :mod:`kvgrant.conformance.objects` (Reserve/Free name the header's
  reservation; Map/MapAlias the live handle at base + the plan's offset, inside the
  reservation; Grant/Unmap the live mapping's VA and size; Release a live handle with
  no live mapping); a Grant names exactly p's own device; Export names the live handle
  of the allocation it exports;
* imported memory (owner o, allocation a; slot k of o among the owners p imports from,
  ascending): Import returns a handle not live in p, of the allocation's length;
  ImportMap maps that handle at base + (k + 1) * slot + the plan's offset, inside the
  reservation; ImportGrant/ImportUnmap name the live imported mapping's VA and size;
  ImportRelease names the imported handle when it has no live mapping (but one whose
  cuMemUnmap failed: leaked).

A failed call is checked for the fields it names. Checks run before the model's step
(:func:`kvgrant.conformance.group_replay.replay_group`), so a wrong object is reported
at its event naming the object.
"""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

from kvgrant.conformance.group_model import Args
from kvgrant.conformance.objects import ObjectChecker

__all__ = ["GroupObjects"]

_OWN = frozenset({"Reserve", "Free", "Create", "Map", "MapAlias", "Grant", "Unmap", "Release"})


def _rng(va: int | None, size: int | None) -> str:
    if va is None:  # (a failed call may name its size alone: say it)
        return "no VA" if size is None else f"no VA, {size:#x} bytes"
    return f"va [{va:#x}, {va + (size or 0):#x})"


class GroupObjects:
    """Live handles and mappings of one process, own and imported."""

    __slots__ = ("p", "dev", "lay", "own", "base", "res", "slot", "slot_of", "imp",
                 "imp_live", "imp_maps", "imp_leaked")

    def __init__(self, header: Any) -> None:
        """``header``: the process's :class:`~kvgrant.conformance.group_io.GroupHeader`."""
        self.p = p = header.rank
        self.dev = header.own_device
        self.lay = lay = header.layout
        c = header.constants
        devs = {r: header.devices.get(r, r) for r in range(c.ranks)}
        devs[p] = self.dev
        self.own = ObjectChecker(SimpleNamespace(layout=lay, ranks=c.ranks,  # type: ignore[arg-type]
                                                 devices=devs))
        self.base, self.res = lay.reservations[p]
        self.slot = max([o + b for o, b in lay.planes.values()]
                        + [v[0] + v[1] for v in lay.regions.values()], default=0)
        self.slot_of = {o: k + 1 for k, o in enumerate(c.sources[p])}
        self.imp: dict[tuple[int, int], int] = {}                    # (o, a) -> handle
        self.imp_live: set[int] = set()                              # its values
        self.imp_maps: dict[tuple[int, int, str], tuple[int, int]] = {}  # -> (va, size)
        # imported mappings whose cuMemUnmap failed: still live, an ImportRelease may
        # follow them
        self.imp_leaked: set[tuple[int, int, str]] = set()

    # -- what the plan says -----------------------------------------------------------
    def import_va(self, o: int, a: int, m: str) -> int | None:
        """The VA of owner o's allocation a, mapping m, in this process (None: no base
        or not an owner it imports from)."""
        k = self.slot_of.get(o)
        off = self.lay.map_off[a] if m == "plane" else self.lay.alias_off[a]
        if self.base is None or k is None or off < 0:
            return None
        return self.base + k * self.slot + off

    def _outside(self, va: int, size: int) -> bool:
        return self.base is not None and not (
            self.base <= va and va + size <= self.base + self.res)

    def _is_live(self, handle: int) -> bool:
        return handle in self.own.live[self.p] or handle in self.imp_live

    # -- the check ------------------------------------------------------------------------
    def check(self, action: str, ok: bool, e: Args, device: int | None, va: int | None,
              size: int | None, handle: int | None) -> str:
        """Why this event acts on the wrong object ('' when it does not)."""
        p = self.p
        if device != self.dev:
            return (f"rank {p}: {action} on device {device} but rank {p}'s process uses "
                    f"device {self.dev}")
        a = e.alloc
        if action in _OWN:
            if action in ("Map", "MapAlias") and ok and va is not None and size is not None \
                    and self._outside(va, size):
                return (f"rank {p}, alloc {a}, handle {handle}: {action} at "
                        f"{_rng(va, size)} is outside the reservation "
                        f"{_rng(self.base, self.res)}")
            if action == "Grant" and ok and e.devices != frozenset({p}):
                return (f"rank {p}, alloc {a}: Grant of the {e.mapping} mapping at "
                        f"{_rng(va, size)} names devices other than rank {p}'s own device "
                        f"{self.dev} (a process grants its own device only)")
            return self.own.check(p, action, ok, a, e.mapping, device, va, size, handle)
        if a is None or action in ("Send",):
            return ""
        length = self.lay.allocations[a].length
        if action == "Export":
            live = self.own.handles[p].get(a)
            if (ok or handle is not None) and handle != live:
                return (f"rank {p}, alloc {a}: Export of handle {handle} but alloc {a}'s "
                        f"live handle is {live}")
            if (ok or size is not None) and size != length:
                return (f"rank {p}, alloc {a}: Export of {size} bytes but the plan's length "
                        f"is {length}")
            return ""
        o = e.owner
        if o is None or o not in self.slot_of:
            return ""  # the model names what is wrong with the owner
        key = (o, a)
        live_h = self.imp.get(key)
        who = f"rank {p}, owner {o}'s alloc {a}"
        if action == "Import":
            if (ok or size is not None) and size != length:
                return f"{who}: Import of {size} bytes but the plan's length is {length}"
            if ok and (handle is None or self._is_live(handle)):
                return (f"{who}: Import returned handle {handle}, which "
                        + ("is missing" if handle is None else "is still live in this "
                           "process"))
            if not ok and handle is not None:
                return f"{who}: a failed Import names handle {handle}"
            return ""
        m = e.mapping
        if action == "ImportMap":
            if (ok or handle is not None) and handle != live_h:
                return (f"{who}: ImportMap of handle {handle} but the handle imported for "
                        f"it is {live_h}" + (" (it is not imported)" if live_h is None else ""))
            if ok and va is not None and size is not None and self._outside(va, size):
                return (f"{who}, handle {handle}: ImportMap at {_rng(va, size)} is outside "
                        f"the reservation {_rng(self.base, self.res)}")
            want = self.import_va(o, a, m or "plane")
            if ((ok or va is not None) and va != want) or \
                    ((ok or size is not None) and size != length):
                return (f"{who}, handle {handle}: ImportMap of the {m} mapping at "
                        f"{_rng(va, size)} but the plan puts it at {_rng(want, length)} "
                        f"(slot {self.slot_of[o]} of the reservation)")
            return ""
        if action in ("ImportGrant", "ImportUnmap"):
            live = self.imp_maps.get((o, a, m or "plane"))
            if live is None:
                live = (self.import_va(o, a, m or "plane"), length)  # type: ignore[assignment]
            if ((ok or va is not None) and va != live[0]) or \
                    ((ok or size is not None) and size != live[1]):
                return (f"{who}: {action} of the {m} mapping at {_rng(va, size)} but that "
                        f"mapping is at {_rng(live[0], live[1])}")
            if action == "ImportGrant" and ok and e.devices != frozenset({p}):
                return (f"{who}: ImportGrant of the {m} mapping at {_rng(va, size)} names "
                        f"devices other than rank {p}'s own device {self.dev}")
            return ""
        if action == "ImportRelease":
            if (ok or handle is not None) and handle != live_h:
                return (f"{who}: ImportRelease of handle {handle} but the imported handle "
                        f"is {live_h}")
            if ok:
                held = [k[2] for k in self.imp_maps if k[:2] == key
                        and k not in self.imp_leaked]
                if held:
                    return (f"{who}: ImportRelease of handle {handle} while its {held[0]} "
                            "mapping is live")
            return ""
        return ""

    def leak(self, action: str, e: Args) -> None:
        """A checked undo failed: a mapping whose cuMemUnmap failed stays live, and the
        handle's release may still follow it (the driver allows that)."""
        if action == "Unmap":
            self.own.leaked[self.p].add((e.alloc, e.mapping))  # type: ignore[arg-type]
        elif action == "ImportUnmap":
            self.imp_leaked.add((e.owner, e.alloc, e.mapping))  # type: ignore[arg-type]

    def apply(self, action: str, e: Args, va: int | None, size: int | None,
              handle: int | None) -> None:
        """The effect of a successful, checked event."""
        if action in _OWN:
            self.own.apply(self.p, action, e.alloc, e.mapping, va, size, handle)
        elif action == "Import":
            self.imp[(e.owner, e.alloc)] = handle  # type: ignore[index,assignment]
            self.imp_live.add(handle)  # type: ignore[arg-type]
        elif action == "ImportMap":
            self.imp_maps[(e.owner, e.alloc, e.mapping)] = (va, size)  # type: ignore
        elif action == "ImportUnmap":
            self.imp_maps.pop((e.owner, e.alloc, e.mapping), None)  # type: ignore[arg-type]
        elif action == "ImportRelease":
            self.imp_live.discard(self.imp.pop((e.owner, e.alloc), None))  # type: ignore
