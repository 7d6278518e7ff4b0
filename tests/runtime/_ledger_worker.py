"""A kvgrant process for the multi-process ledger tests (run as a script, never imported).

``python _ledger_worker.py alloc GEOMETRY LEDGER POOL BUDGET RESERVE PREFLIGHT``
allocates GEOMETRY on the sim backend (its driver drawing on the shared POOL), prints
one JSON line (``{"ok": true, ...}`` or the error's fields), then, when it succeeded,
waits for a line on stdin before releasing and printing ``{"released": ...}``.

``python _ledger_worker.py fill POOL BUDGET GO_FILE`` maps one 2 MiB allocation again
and again, granting each mapping to one device, until ``cuMemSetAccess`` fails (the
measurement of the issue, on the simulated host); it waits for GO_FILE to exist so that
several fillers start together, prints ``{"grants": N, "result": NAME}``, holds its
grants until a line arrives on stdin, then unwinds and prints ``{"live_empty": ...}``.

``python _ledger_worker.py hold LEDGER HANDLES GEOMETRY`` reserves HANDLES in LEDGER (no
driver), prints ``{"pid": ..., "pidns": ..., "holders": [...]}`` (every holder this
process sees after reaping, with its verdict), releases the lease when a line (or end of
file) arrives on stdin and prints ``{"released": true}``; the line ``die`` makes it exit
at once without releasing (the pid namespace tests run it under ``unshare --pid``).
"""

from __future__ import annotations

import json
import os
import sys
import time


def _alloc(geometry: str, ledger: str, pool: str, budget: str, reserve: str,
           preflight: str) -> int:
    from kvgrant.errors import AllocationError, HandleBudgetError, KVGrantError
    from kvgrant.runtime.allocator import allocate

    try:
        pub = allocate(geometry, backend="sim", ledger=ledger, handle_budget=int(budget),
                       handle_reserve=int(reserve), preflight=preflight == "1",
                       driver_options={"host_pool": pool, "handle_budget": int(budget)})
    except KVGrantError as err:
        out: dict[str, object] = {"ok": False, "pid": os.getpid(), "kind": type(err).__name__,
                                  "error": str(err)}
        if isinstance(err, HandleBudgetError):
            out.update(demand=err.demand, held=err.held, holders=err.holders)
        if isinstance(err, AllocationError):
            out.update(call=err.call, result=err.result_name, live=err.live,
                       cleanup_errors=[str(e) for e in err.cleanup_errors])
        print(json.dumps(out), flush=True)
        return 1
    print(json.dumps({"ok": True, "pid": os.getpid(), "grants": pub.counts.grants}), flush=True)
    sys.stdin.readline()
    pub.release()
    print(json.dumps({"released": True, "live_empty": pub.driver.live().is_empty()}),
          flush=True)
    return 0


def _fill(pool: str, budget: str, go_file: str) -> int:
    from kvgrant.errors import DriverError
    from kvgrant.runtime.sim import SimDriver

    drv = SimDriver(devices=1, handle_budget=int(budget), host_pool=pool)
    G = drv.granularity(0)
    n = int(budget) + 1
    va = drv.reserve(n * G, device=0)
    h = drv.create(G, 0)
    print(json.dumps({"ready": True}), flush=True)
    while not os.path.exists(go_file):
        time.sleep(0.01)
    grants, result = 0, "CUDA_SUCCESS"
    for i in range(n):
        drv.map(va + i * G, G, h)
        try:
            drv.set_access(va + i * G, G, [0])
        except DriverError as e:
            result = e.result_name
            drv.unmap(va + i * G, G)
            break
        grants += 1
    # hold the grants until every filler has failed (as the H200 measurement did)
    print(json.dumps({"grants": grants, "result": result}), flush=True)
    sys.stdin.readline()
    if grants:
        drv.unmap(va, grants * G)
    drv.release(h)
    drv.free_address(va, n * G)
    print(json.dumps({"live_empty": drv.live().is_empty()}), flush=True)
    return 0


def _hold(ledger: str, handles: str, geometry: str) -> int:
    from kvgrant.runtime.hostlock import current_process
    from kvgrant.runtime.ledger import HostLedger

    book = HostLedger(ledger)
    lease = book.reserve(int(handles), geometry=geometry, label="packed", budget=10**6,
                         reserve=0)
    seen = book.holders()
    verdicts, notes = getattr(book, "verdicts", {}), getattr(book, "notes", {})
    print(json.dumps({"pid": os.getpid(), "pidns": current_process().pidns, "holders": [
        {"pid": h.pid, "geometry": h.geometry,
         "state": verdicts[h.id].state if h.id in verdicts else None,
         "note": notes.get(h.id)} for h in seen]}), flush=True)
    if sys.stdin.readline().strip() == "die":
        os._exit(3)  # as if killed: the lease stays in the ledger
    lease.release()
    print(json.dumps({"released": True}), flush=True)
    return 0


if __name__ == "__main__":
    cmd, *rest = sys.argv[1:]
    sys.exit({"alloc": _alloc, "fill": _fill, "hold": _hold}[cmd](*rest))
