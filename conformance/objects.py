"""Object identity checks of a version-2 trace: each event acts on the right object.

Why apart from the model: ``KVLifecycle.tla`` abstracts VAs, sizes and handles away (it
checks the *order* of steps); this module checks that each step acts on the *object*
the plan says, so a trace cannot map at the wrong VA, grant a different range or
release a handle that is still mapped and still be accepted. The TLC engine checks the
same rules in ``specs/KVLifecycleTrace.tla`` (``ObjectsMatch``); both reject at the
same event. For every rank event:

* ``device`` is the rank's device (header ``devices``);
* Reserve / Free: ``va`` and ``size`` are the rank's reservation (header
  ``reservations``);
* Create: ``size`` is the allocation's length; its ``handle`` is not live on the rank;
* Map / MapAlias: ``handle`` is the allocation's live handle; ``va`` = base + the
  allocation's plane (alias) offset, ``size`` = its length, inside the reservation;
* Grant / Unmap: ``va`` and ``size`` are those of the live mapping the event names;
* Release: ``handle`` is the allocation's live handle, with no live mapping but one
  whose cuMemUnmap failed (leaked; the model already requires the same).

A failed driver call is checked for the fields it names. Grant devices are checked by
the model against owner + importers derived from the header's import groups.
"""

from __future__ import annotations

from typing import Any

from kvgrant.conformance.trace_io import Header

__all__ = ["ObjectChecker", "RowObjects", "objects_before"]


def _nothing(*_args: Any) -> str:
    return ""


def _no_effect(*_args: Any) -> None:
    return None


class ObjectChecker:
    """Live handles and mappings per rank, checked and updated event by event."""

    __slots__ = ("h", "lay", "handles", "maps", "live", "leaked", "check", "apply")

    def __init__(self, header: Header) -> None:
        on = header.layout is not None  # else a model-only behaviour made in memory
        self.check = self._check if on else _nothing
        self.apply = self._apply if on else _no_effect
        self.h = header
        self.lay = header.layout
        n = header.ranks
        self.handles: list[dict[int, int]] = [{} for _ in range(n)]   # alloc -> handle
        self.live: list[dict[int, int]] = [{} for _ in range(n)]      # handle -> alloc
        self.maps: list[dict[tuple[int, str], tuple[int, int]]] = [{} for _ in range(n)]
        # mappings whose cuMemUnmap failed: still live, a Release may follow them
        self.leaked: list[set[tuple[int, str]]] = [set() for _ in range(n)]

    # -- what the plan says ------------------------------------------------------------
    def _where(self, r: int, a: int, m: str) -> str:
        p = self.lay.allocations[a]
        if m == "alias" and p.region is None:
            return "no region bytes (the plan does not alias it)"
        if m == "alias":
            return f"region {p.region!r} bytes [{p.region_offset:#x}, {p.region_offset + p.length:#x})"  # type: ignore[operator]
        return f"plane {p.plane!r} bytes [{p.plane_offset:#x}, {p.plane_offset + p.length:#x})"

    @staticmethod
    def _rng(va: int | None, size: int | None) -> str:
        if va is None:  # (a failed call may name its size alone: say it)
            return "no VA" if size is None else f"no VA, {size:#x} bytes"
        return f"va [{va:#x}, {va + (size or 0):#x})"

    def _overlap(self, r: int, va: int, size: int) -> str:
        for (b, m), (v, n) in self.maps[r].items():
            if va < v + n and v < va + size:
                return f"; it overlaps the live {m} mapping of alloc {b} at {self._rng(v, n)}"
        return ""

    # -- the check ----------------------------------------------------------------------
    def _check(self, r: int, action: str, ok: bool, a: int | None, m: str | None,
              device: int | None, va: int | None, size: int | None,
              handle: int | None) -> str:
        """Why this rank event acts on the wrong object ('' when it does not)."""
        want_dev = self.h.devices[r]
        if device != want_dev:
            return (f"rank {r}: {action} on device {device} but rank {r}'s device is "
                    f"{want_dev}")
        base, res = self.lay.reservations[r]
        if action in ("Reserve", "Free"):
            if ok and va is None:
                return f"rank {r}: {action} names no VA (the reservation it acts on)"
            if (ok or va is not None) and va != base:
                return (f"rank {r}: {action} at va {va if va is None else hex(va)} but the "
                        f"header's reservation base is {base if base is None else hex(base)}")
            if (ok or size is not None) and size != res:
                return (f"rank {r}: {action} of {size} bytes but the header's reservation is "
                        f"{res} bytes")
            return ""
        if a is None:  # RankReady
            return ""
        p = self.lay.allocations[a]
        live_h = self.handles[r].get(a)
        if action == "Create":
            if (ok or size is not None) and size != p.length:
                return (f"rank {r}, alloc {a}: Create of {size} bytes but the plan's length "
                        f"is {p.length} ({self._where(r, a, 'plane')})")
            # the ranks of one trace share one process, whose handles are unique
            holder = None if handle is None else next(
                (q for q, lv in enumerate(self.live) if handle in lv), None)
            if ok and (handle is None or holder is not None):
                return (f"rank {r}, alloc {a}: Create returned handle {handle}, which "
                        + ("is missing" if handle is None or holder is None else
                           f"is still live (rank {holder}'s alloc "
                           f"{self.live[holder][handle]})"))
            if not ok and handle is not None:
                return f"rank {r}, alloc {a}: a failed Create names handle {handle}"
            return ""
        if action in ("Map", "MapAlias"):
            mm = "plane" if action == "Map" else "alias"
            if mm == "alias" and p.region is None:   # was a TypeError on the None offset
                return (f"rank {r}, alloc {a}: MapAlias of an allocation the plan does not "
                        f"alias ({self._where(r, a, 'plane')} only)")
            if (ok or handle is not None) and handle != live_h:
                return (f"rank {r}, alloc {a}: {action} of handle {handle} but alloc {a}'s "
                        f"live handle is {live_h}")
            want = self.lay.va(r, a, mm)
            # each field a failed call names is checked (was: its size only with its VA,
            # so a failed MapAlias naming no VA passed with any size)
            if ((ok or va is not None) and va != want) or \
                    ((ok or size is not None) and size != p.length):
                return (f"rank {r}, alloc {a}, handle {handle}: {action} at "
                        f"{self._rng(va, size)} but the plan puts {self._where(r, a, mm)} at "
                        f"{self._rng(want, p.length)}"
                        + ("" if va is None or size is None else self._overlap(r, va, size)))
            if ok and base is not None and not (base <= va < base + res  # type: ignore[operator]
                                                and va + size <= base + res):  # type: ignore[operator]
                return (f"rank {r}, alloc {a}: {action} at {self._rng(va, size)} is outside "
                        f"the reservation {self._rng(base, res)}")
            return ""
        if action in ("Grant", "Unmap"):
            live = self.maps[r].get((a, m))  # type: ignore[arg-type]
            if live is None:
                want = self.lay.va(r, a, m or "plane") if m in ("plane", "alias") else None
                live = (want, p.length)  # type: ignore[assignment]
            if ((ok or va is not None) and va != live[0]) or \
                    ((ok or size is not None) and size != live[1]):
                return (f"rank {r}, alloc {a}: {action} of the {m} mapping at "
                        f"{self._rng(va, size)} but that mapping is at "
                        f"{self._rng(live[0], live[1])}")
            return ""
        if action == "Release":
            if (ok or handle is not None) and handle != live_h:
                return (f"rank {r}, alloc {a}: Release of handle {handle} but alloc {a}'s "
                        f"live handle is {live_h}")
            if ok:
                held = [k for k in self.maps[r] if k[0] == a and k not in self.leaked[r]]
                if held:
                    return (f"rank {r}, alloc {a}: Release of handle {handle} while its "
                            f"{held[0][1]} mapping is live")
            return ""
        return ""

    def _apply(self, r: int, action: str, a: int | None, m: str | None, va: int | None,
              size: int | None, handle: int | None) -> None:
        """The effect of a successful, checked rank event."""
        if action == "Create":
            self.handles[r][a] = handle  # type: ignore[index,assignment]
            self.live[r][handle] = a  # type: ignore[index,assignment]
        elif action == "Map":
            self.maps[r][(a, "plane")] = (va, size)  # type: ignore[index,assignment]
        elif action == "MapAlias":
            self.maps[r][(a, "alias")] = (va, size)  # type: ignore[index,assignment]
        elif action == "Unmap":
            self.maps[r].pop((a, m), None)  # type: ignore[arg-type]
        elif action == "Release":
            h = self.handles[r].pop(a, None)  # type: ignore[arg-type]
            self.live[r].pop(h, None)  # type: ignore[arg-type]

    def step(self, ev: Any) -> str:
        """Check and (when it passes and succeeded) apply one parsed event."""
        if ev.rank is None:
            return ""
        why = self.check(ev.rank, ev.action, ev.ok, ev.alloc, ev.mapping, ev.device, ev.va,
                         ev.size, ev.handle)
        if not why and ev.ok:
            self.apply(ev.rank, ev.action, ev.alloc, ev.mapping, ev.va, ev.size, ev.handle)
        elif not why and ev.action == "Unmap":
            self.leaked[ev.rank].add((ev.alloc, ev.mapping))
        return why


def objects_before(trace: Any, index: int) -> ObjectChecker:
    """The checker after the first ``index`` events (assumed accepted): where the
    replay hands a trace from the fast rows to the detailed loop."""
    objs = ObjectChecker(trace.header)
    for ev in trace.events[:index]:
        if ev.rank is not None and ev.ok:
            objs.apply(ev.rank, ev.action, ev.alloc, ev.mapping, ev.va, ev.size, ev.handle)
        elif ev.rank is not None and ev.action == "Unmap":
            objs.leaked[ev.rank].add((ev.alloc, ev.mapping))
    return objs


class RowObjects:
    """:class:`ObjectChecker`'s rules on the fast reader's text fields, for the replay
    of writer-format rows: the plan's VAs, sizes and devices as decimal strings (one
    spelling per integer, so equal text is equal values), no int() per event. It only
    says yes or no; at the first no the replay hands the trace to the detailed loop,
    where :class:`ObjectChecker` finds the same event and names the object."""

    __slots__ = ("dev", "base", "res", "map_va", "alias_va", "length", "handles", "live",
                 "on")

    def __init__(self, header: Header) -> None:
        lay = header.layout
        self.on = lay is not None
        n = header.ranks
        self.dev = [str(header.devices[r]) for r in range(n)]
        self.handles: list[dict[int, str]] = [{} for _ in range(n)]
        self.live: list[set[str]] = [set() for _ in range(n)]
        if lay is None:
            return
        self.base = [str(lay.reservations[r][0]) for r in range(n)]  # "None": never matches
        self.res = [str(lay.reservations[r][1]) for r in range(n)]
        self.length = [str(p.length) for p in lay.allocations]
        self.map_va: list[list[str]] = []
        self.alias_va: list[list[str]] = []
        for r in range(n):
            b = lay.reservations[r][0]
            self.map_va.append(["" if b is None else str(b + o) for o in lay.map_off])
            self.alias_va.append(["" if b is None or o < 0 else str(b + o)
                                  for o in lay.alias_off])

    @staticmethod
    def _range_ok(ok: bool, va: str, size: str, want: str, n: str) -> bool:
        """Each field the event names is the plan's (a failed call may name neither, or
        its size alone: the size is checked then too, as ObjectChecker does)."""
        return ((va == want if ok or va != "null" else True)
                and (size == n if ok or size != "null" else True))

    def step(self, r: int, action: str, ok: bool, a: int | None, m: str | None, dv: str,
             va: str, size: str, hd: str) -> bool:
        """True when the event passes (and, if it succeeded, its effect is applied)."""
        if not self.on:
            return True
        if dv != self.dev[r]:
            return False
        if action == "Reserve" or action == "Free":
            return ((va == self.base[r] if ok or va != "null" else True)
                    and (size == self.res[r] if ok or size != "null" else True))
        if a is None:
            return True
        n = self.length[a]
        if action == "Create":
            if (ok or size != "null") and size != n:
                return False
            if not ok:
                return hd == "null"
            if hd == "null" or any(hd in lv for lv in self.live):  # one process's handles
                return False
            self.handles[r][a] = hd
            self.live[r].add(hd)
            return True
        if action == "Map" or action == "MapAlias":
            want = (self.map_va if action == "Map" else self.alias_va)[r][a]
            if (ok or hd != "null") and hd != self.handles[r].get(a, "null"):
                return False
            return self._range_ok(ok, va, size, want, n)
        if action == "Grant" or action == "Unmap":
            want = (self.map_va if m == "plane" else self.alias_va)[r][a]
            return self._range_ok(ok, va, size, want, n)
        if action == "Release":
            if (ok or hd != "null") and hd != self.handles[r].get(a, "null"):
                return False
            if ok:
                self.live[r].discard(self.handles[r].pop(a))
            return True
        return True
