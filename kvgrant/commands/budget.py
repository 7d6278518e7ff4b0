"""``kvgrant budget``: who holds the host's driver handles, per the host ledger.

The driver-handle budget is one pool for every process and GPU of a host. Every kvgrant
process records its share in the host ledger before its first driver call; this lists
the holders (dead ones are reaped first), their total, the budget, the reserve kept for
users kvgrant cannot see, and the margin left. A holder recorded from another pid
namespace (``unshare --pid``, a container sharing /dev/shm) is marked "other pid
namespace": alive, or "cannot tell" when this process cannot see that namespace (it is
kept; ``--drop PID`` or ``--drop-unknown`` removes it once you know it is gone).
``--repair`` makes an unreadable ledger usable again (its content is kept next to it).
``--json`` prints one object.
"""

from __future__ import annotations

import argparse
import json
import os
from typing import Any

from kvgrant.commands._args import check_ledger_path, count, path_arg, positive_int

__all__ = ["add_parser", "run"]


def add_parser(subparsers: Any) -> None:
    from kvgrant.layout.preflight import DEFAULT_HANDLE_BUDGET, DEFAULT_HANDLE_RESERVE

    p = subparsers.add_parser(
        "budget", help="list the host ledger: holders of driver handles, total, margin",
        description=__doc__.split("\n\n")[1] if __doc__ else None)
    p.add_argument("--ledger", type=path_arg, default=None, metavar="PATH",
                   help="ledger file (default KVGRANT_LEDGER or /dev/shm/kvgrant-ledger.json)")
    p.add_argument("--handle-budget", type=count, default=DEFAULT_HANDLE_BUDGET, metavar="N",
                   help=f"the host's budget (default {DEFAULT_HANDLE_BUDGET:,})")
    p.add_argument("--handle-reserve", type=count, default=DEFAULT_HANDLE_RESERVE, metavar="N",
                   help=f"kept for users kvgrant cannot see (default {DEFAULT_HANDLE_RESERVE:,})")
    p.add_argument("--repair", action="store_true",
                   help="make an unreadable ledger usable (only when no kvgrant process runs); "
                        "it keeps holders kvgrant cannot judge (see --drop)")
    p.add_argument("--drop", type=positive_int, action="append", default=[], metavar="PID",
                   help="remove the holders recorded with this pid (repeatable): for a holder "
                        "of another pid namespace marked 'cannot tell' once you know it is "
                        "gone; a holder found alive is refused")
    p.add_argument("--drop-unknown", action="store_true",
                   help="remove every holder marked 'cannot tell' (another pid namespace this "
                        "process cannot see): only when you know they are gone")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    from kvgrant.runtime.hostlock import clock_text
    from kvgrant.runtime.ledger import HostLedger, binding_limits

    check_ledger_path(args.ledger)  # a missing folder is bad input (exit 2), not a failure
    ledger = HostLedger(args.ledger)
    # a listing is a read: a path with no file yet has no holders, and is not created
    # (a mistyped --ledger became a new empty ledger and looked like an idle host); the
    # first kvgrant process to reserve creates it, and so do --repair and --drop
    exists = os.path.lexists(ledger.path) or args.repair or args.drop or args.drop_unknown
    aside = ledger.repair() if args.repair else None
    reaped, earlier, notes = list(ledger.reaped), list(ledger.earlier_boot), dict(ledger.notes)
    dropped = []
    if args.drop or args.drop_unknown:
        dropped = ledger.drop(args.drop, unknown=args.drop_unknown)
        reaped += ledger.reaped
        earlier += ledger.earlier_boot
        notes.update(ledger.notes)
    holders = ledger.holders() if exists else []
    reaped += ledger.reaped
    earlier += ledger.earlier_boot
    notes.update(ledger.notes)
    verdicts = ledger.verdicts
    held = sum(h.handles for h in holders)
    # the figures the next reservation is checked against: a holder admitted with a
    # smaller budget or a larger reserve than asked here binds (ledger.binding_limits)
    budget, reserve, why = binding_limits(args.handle_budget, args.handle_reserve, holders)
    margin = budget - held - reserve

    def state(h: Any) -> str:
        v = verdicts.get(h.id)
        return v.state if v is not None else "alive"

    out: dict[str, Any] = {
        "ok": True, "exit_status": 0, "ledger": str(ledger.path), "exists": bool(exists),
        "holders": [{**h.as_dict(), "state": state(h), "note": ledger.notes.get(h.id)}
                    for h in holders],
        "held": held, "budget": args.handle_budget, "reserve": args.handle_reserve,
        "binding_budget": budget, "binding_reserve": reserve, "margin": margin,
        "reaped": [{**h.as_dict(), "note": notes.get(h.id)} for h in reaped],
        "earlier_boot": len(earlier),
        "dropped": [h.as_dict() for h in dropped],
        "unknown": sum(state(h) == "unknown" for h in holders),
        "repaired": args.repair, "kept_bad_content": None if aside is None else str(aside)}
    if args.json:
        print(json.dumps(out))
        return 0
    if not exists:
        print(f"host ledger {ledger.path}: no such file yet, so 0 holder(s): no kvgrant "
              "process has reserved driver handles with this ledger (it is created by the "
              "first one; check the path if you expected holders)")
    else:
        print(f"host ledger {ledger.path}: {len(holders)} holder(s)")
    if args.repair:
        print("  repaired: " + (f"the unreadable content is kept at {aside}; the ledger is "
                                "empty now" if aside else "the ledger was readable"))
    if earlier:
        print(f"  dropped {len(earlier)} holder(s) recorded in an earlier boot of this host "
              "(their processes are gone)")
    for h in reaped:
        if h not in earlier:
            print(f"  reaped (process gone): {h.describe()}"
                  + (f" [{notes[h.id]}]" if h.id in notes else ""))
    for h in dropped:
        print(f"  dropped (--drop): {h.describe()}"
              + (f" [{notes[h.id]}]" if h.id in notes else ""))
    if holders:
        print(f"  {'pid':>8} {'geometry':<24} {'plan':<10} {'devices':<12} {'handles':>10}  since")
        for h in holders:
            since = clock_text(h.since, "%Y-%m-%d %H:%M:%S") or "?"
            flag = "" if h.checked else "  (pre-flight off)"
            note = ledger.notes.get(h.id)
            mark = f"  [{note}]" if note else ""
            print(f"  {h.pid:>8} {h.geometry[:24]:<24} {h.label[:10]:<10} "
                  f"{','.join(map(str, h.devices))[:12]:<12} {h.handles:>10,}  {since}{flag}"
                  f"{mark}")
    print(f"  held {held:,} + reserve {reserve:,} of budget {budget:,}{why}: margin "
          f"{margin:+,}" + ("" if margin >= 0 else "  (OVERCOMMITTED)"))
    unknown = [h for h in holders if state(h) == "unknown"]
    if unknown:
        print(f"  {len(unknown)} holder(s) of another pid namespace that this process cannot "
              f"judge are kept and counted (pids {', '.join(str(h.pid) for h in unknown)}); "
              "once you know they are gone: kvgrant budget --drop PID (or --drop-unknown)")
    return 0

