"""One process per rank: allocate this rank's KV cache as one member of a group.

Serving engines run one process per GPU. :func:`allocate_rank` is called by each of
them, for its own rank, inside the engine's existing ``torch.distributed`` group; the
group publishes together or aborts together (DESIGN.md "Processes and the group"):

1. **Hello** (no driver call yet): every rank all-gathers its pid, uid, host, fd-socket
   address, device and handle demand. The demand is summed per host and checked against
   the budget (refused naming every rank's share), then each process takes its ledger
   lease (:func:`take_ledger_lease`, the one integration point of the host ledger).
2. **Set-up**: each process opens its driver and measures its own device; the free
   bytes are all-gathered so every rank fits the same pages and realises the same plan.
3. **Build** (one :class:`~kvgrant.runtime.transaction.Transaction`): ``Reserve`` one
   range (own planes and regions, then one slot of the same size per owner it imports
   from, ascending); per allocation ``Create`` (exportable: POSIX fd), ``Map``,
   ``MapAlias``, ``Grant`` (own device only); per allocation ``Export`` and one ``Send``
   per validated importer (SCM_RIGHTS, :mod:`kvgrant.runtime.fdpass`), the fd closed at
   once; per owner and allocation ``Import`` (fd closed at once), ``ImportMap`` (plane,
   and alias for ``access: importers`` regions), ``ImportGrant`` (own device only).
4. **Vote** before any barrier: every rank all-gathers ``ready`` or its first error.
   One decision is written once (``compare_set``): publish iff every rank is ready;
   otherwise every process unwinds what it made and imported and raises
   :class:`~kvgrant.errors.GroupError` naming the failed ranks and their first errors.
   A rank that dies or does not answer before the deadline is named ``missing``.

Why the group's store and not its collectives: a collective on a group whose member
died blocks until the group's own timeout (30 minutes for gloo by default) and cannot
say who is missing. Every wait here polls the rendezvous store with a deadline, notices
a dead same-host peer at once (its pid is gone), and stops as soon as another rank has
decided to abort. No retries, no smaller second attempt.
"""

from __future__ import annotations

import errno
import hashlib
import json
import os
import secrets
import socket
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any, Callable, Mapping, Protocol, NoReturn, Sequence, Unpack

from kvgrant.errors import (ArgumentError, DriverError, GroupError, HandleBudgetError,
                            KVGrantError, PlanError)
from kvgrant.gc_pause import gc_paused
from kvgrant.layout.geometry import Geometry, load_geometry, parse_geometry
from kvgrant.layout.validate import show_value
from kvgrant.layout.plan import Allocation, PhysicalPlan
from kvgrant.runtime.arguments import (MAX_DEVICE_ORDINAL, as_int, check_flag, check_index,
                                       check_plan_arg, check_trace_path)
from kvgrant.runtime.arguments import fail as refuse   # "fail" is a run's step failure here
from kvgrant.runtime.capacity import MemoryLimit, PageFit, fit_pages, parse_memory_limit
from kvgrant.runtime.driver import Driver, LiveCounts, open_driver
from kvgrant.runtime.fdpass import FdClient, FdServer
from kvgrant.runtime.engine import allocation_target_text, traced_shutdown, va_layout
from kvgrant.runtime.interrupts import DeferredInterrupt
from kvgrant.runtime.options import (Backend, HandleBudget, RankShorthands, TraceOptions,
                                     group_options)
from kvgrant.runtime.prepare import (host_ledger, require_allocatable_granularity,
                                     require_plan_for, resolve_plan)
from kvgrant.runtime.published import Capacity, Counts, Published
from kvgrant.runtime.trace import TraceWriter, open_trace
from kvgrant.runtime.transaction import Teardown, Transaction, attach_cleanup_errors
from kvgrant.traceformat import GROUP_VERSION, group_plan_header

__all__ = ["DEFAULT_TIMEOUT_S", "GroupPublished", "allocate_rank", "group_backend",
           "open_group_driver", "plan_digests", "rank_demand", "take_ledger_lease"]

#: How long any one group step waits for the others (seconds) before naming them missing.
DEFAULT_TIMEOUT_S = 120.0
#: The longest ``timeout_s`` accepted (a week): finite, and within what sockets take.
MAX_TIMEOUT_S = 7 * 24 * 3600
_OK = "CUDA_SUCCESS"
#: The result of a step that a held-back Ctrl-C stopped before its driver call.
_INTERRUPTED = "KeyboardInterrupt"
_POLL_S = (0.002, 0.05)   # first and longest pause between looks at the store
_STORE_METHODS = ("add", "set", "get", "check", "compare_set")  # what _Channel calls


# ----------------------------------------------------------------------- demand
def rank_demand(g: Geometry, plan: PhysicalPlan, rank: int) -> int:
    """Driver handles the process of ``rank`` spends: its own mappings (each granted to
    its own device) plus its imported mappings (each granted to its own device).

    Summed over a host this equals the one-process demand (mappings x granted
    devices): each (mapping, importer) grant of the one-process allocator becomes one
    mapping in the importer's own process.
    """
    own = sum(1 + (a.region is not None) for a in plan.allocations)
    shared = sum(1 + (a.region is not None and g.region_by_name[a.region].access == "importers")
                 for a in plan.allocations)
    owners = [o for o in range(g.topology.ranks) if rank in g.importers(o)]
    return own + shared * len(owners)


def _check_host_budget(g: Geometry, plan: PhysicalPlan, hosts: Sequence[str],
                       budget: int, reserve: int = 0) -> dict[str, int]:
    """Sum each host's demand; refuse naming every rank's share when one host's demand
    plus ``reserve`` (for users kvgrant cannot see) overdraws the budget."""
    per_host: dict[str, int] = {}
    shares: dict[str, list[tuple[int, int]]] = {}
    for r, host in enumerate(hosts):
        n = rank_demand(g, plan, r)
        per_host[host] = per_host.get(host, 0) + n
        shares.setdefault(host, []).append((r, n))
    over = {h: n for h, n in per_host.items() if n + reserve > budget}
    if over:
        parts = []
        for h, n in sorted(over.items()):
            each = ", ".join(f"rank {r} {k:,}" for r, k in shares[h])
            parts.append(f"host {h!r} needs {n:,} driver handles ({each}) + a reserve of "
                         f"{reserve:,} but the host budget is {budget:,} (over by "
                         f"{n + reserve - budget:,})")
        contributors = [(f"rank {r} on {h}", k) for h in sorted(over) for r, k in shares[h]]
        raise HandleBudgetError(
            f"{plan.label} plan of {g.name!r}, one process per rank: " + "; ".join(parts)
            + "; the pool is one per host, so splitting ranks over processes does not help",
            demand=max(over.values()), budget=budget, contributors=contributors)
    return per_host


# ----------------------------------------------------------------------- ledger
class Lease(Protocol):
    def release(self) -> None: ...


class _NoLease:
    """What :func:`take_ledger_lease` gives when no ledger is configured."""

    def release(self) -> None:
        return None


def take_ledger_lease(ledger: Any, *, handles: int, geometry: Geometry, label: str,
                      budget: int, reserve: int, backend: str, check: bool,
                      device: int) -> Lease:
    """This process's lease on the host's handle pool (:mod:`kvgrant.runtime.ledger`).

    Taken after the host pre-flight and before this process's first VMM call; released
    as the last undo of abort and of shutdown. Each rank reserves its own share, so the
    ledger sums the group's ranks on the host with every other holder; a share that
    does not fit raises HandleBudgetError naming the holders. ``ledger`` as for
    :class:`~kvgrant.runtime.options.HandleBudget` (None: the default ledger for cuda, for
    sim only when ``KVGRANT_LEDGER`` is set; False: none).
    """
    book = host_ledger(ledger, backend)
    if book is None:
        return _NoLease()
    return book.reserve(handles, geometry=geometry.name, label=label, budget=budget,
                        reserve=reserve, check=check, devices=[device])


def plan_digests(g: Geometry, plan: PhysicalPlan) -> dict[str, str]:
    """SHA-256 digests of the whole geometry (topology included) and of the plan.

    Why: every rank plans for itself; the hello compares these so ranks never build
    against different plans (an fd of the wrong size would abort the group late).
    """
    from kvgrant.layout.planfile import plan_document

    def h(doc: Any) -> str:
        text = json.dumps(doc, sort_keys=True, separators=(",", ":"))
        return "sha256:" + hashlib.sha256(text.encode()).hexdigest()[:16]

    return {"geometry": h(g.model_dump()), "plan": h(plan_document(plan))}


def _check_same_plan(digests: Mapping[int, Mapping[str, str] | None], rank: int,
                     when: str) -> None:
    """Refuse (GroupError naming the ranks and their digests) unless every rank's
    geometry and plan digests agree; the most common value is taken as the group's."""
    for key in ("geometry", "plan"):
        vals = {r: (d or {}).get(key) for r, d in digests.items()}
        counts: dict[Any, int] = {}
        for v in vals.values():
            counts[v] = counts.get(v, 0) + 1
        if len(counts) <= 1:
            continue
        # the majority (ties: the value of the lowest rank) is the reference
        ref = max(counts, key=lambda v: (counts[v], -min(r for r, x in vals.items()
                                                         if x == v)))
        odd = {r: v for r, v in sorted(vals.items()) if v != ref}
        same = sorted(r for r, v in vals.items() if v == ref)
        raise GroupError(
            f"{when}: the ranks' {key} digests differ: " + ", ".join(
                f"rank {r} has {v}" for r, v in odd.items())
            + f"; ranks {same} have {ref}: every rank must build the same plan of the "
            "same geometry (pass one plan file to every rank: --plan FILE); nothing was "
            "created", rank=rank, failed={r: f"{key} digest {v} differs from {ref}"
                                          for r, v in odd.items()})


def _ensure_fd_room(need: int) -> None:
    """Make room for ``need`` more open fds (RLIMIT_NOFILE's soft limit, up to the hard).

    Why: the fd receiver holds an owner's fds until this process imports them (it is
    still making its own memory), up to one per allocation and owner; the simulated
    driver keeps a memfd and an mmap (Python's mmap holds its own dup of the fd) per
    exported allocation and an mmap per imported one. A soft limit of 1024 fails a
    published-scale layout half-way (EMFILE), so ask for room before anything is made.
    """
    import resource

    from kvgrant.runtime.fdpass import open_fd_count

    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    want = open_fd_count() + need + 64
    inf = resource.RLIM_INFINITY
    if soft == inf or soft >= want:
        return
    if hard != inf and hard < want:
        raise GroupError(f"this process may open {hard} fds (RLIMIT_NOFILE hard limit) but "
                         f"the fd exchange needs about {want}; raise it (ulimit -Hn)")
    resource.setrlimit(resource.RLIMIT_NOFILE, (want, hard))


# ------------------------------------------------------------------- channel
def _pid_gone(pid: int) -> bool:
    """True when ``pid`` (same pid namespace) no longer runs: absent, or a zombie."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as fh:
            stat = fh.read()
    except OSError:
        return True
    return stat[stat.rfind(b")") + 2:][:1] in (b"Z", b"X")


def _pidns() -> str:
    try:
        return os.readlink("/proc/self/ns/pid")
    except OSError:
        return ""


class _Abandoned(Exception):
    """Internal: another rank decided to abort while this one waited."""

    def __init__(self, decision: dict[str, Any]) -> None:
        super().__init__(decision.get("reason", "abort"))
        self.decision = decision


class _Channel:
    """Control messages of one attempt over the group's rendezvous store.

    Every key lives under ``kvgrant/<attempt>/``; the attempt number is the count of
    this process's calls (``store.add``), the same on every rank that calls as often.
    """

    def __init__(self, store: Any, index: int, world: int, timeout_s: float) -> None:
        self.store = store
        self.index = index
        self.world = world
        self.timeout_s = timeout_s
        attempt = int(store.add(f"kvgrant/attempts/{index}", 1))
        self.prefix = f"kvgrant/{attempt}/"
        self.attempt = attempt
        self.pids: dict[int, int] = {}      # slot -> pid, where liveness can be checked
        self.slot_of: dict[int, int] = {}   # kvgrant rank -> slot (index in the group)

    def _key(self, name: str, slot: int) -> str:
        return f"{self.prefix}{name}/{slot}"

    def decision(self) -> dict[str, Any] | None:
        key = self.prefix + "decision"
        if self.store.check([key]):
            return json.loads(self.store.get(key))
        return None

    def decide(self, proposal: dict[str, Any]) -> dict[str, Any]:
        """Write ``proposal`` unless a decision exists; return the decision (the same on
        every rank: the first writer wins)."""
        key = self.prefix + "decision"
        got = self.store.compare_set(key, "", json.dumps(proposal, sort_keys=True))
        return json.loads(got)

    def peek(self, name: str, slot: int) -> dict[str, Any] | None:
        """``slot``'s value of gather ``name`` if it has written it, else None."""
        key = self._key(name, slot)
        return json.loads(self.store.get(key)) if self.store.check([key]) else None

    def dead(self, slots: Sequence[int]) -> list[int]:
        return [s for s in slots if s in self.pids and _pid_gone(self.pids[s])]

    def post(self, name: str, value: Mapping[str, Any]) -> None:
        """Write this rank's ``value`` of gather ``name``."""
        self.store.set(self._key(name, self.index), json.dumps(value, sort_keys=True))

    def gather(self, name: str, value: Mapping[str, Any]
               ) -> tuple[list[dict[str, Any] | None], list[int], list[int]]:
        """All-gather ``value``; returns (values by slot, missing slots, dead slots).

        Waits at most ``timeout_s``, and no longer once every rank still missing is a
        dead same-host process (the living ones notice the death too, and answer).

        Raises
        ------
        _Abandoned
            Another rank wrote an abort decision meanwhile.
        """
        store = self.store
        self.post(name, value)
        got: list[dict[str, Any] | None] = [None] * self.world
        missing = set(range(self.world))
        deadline = time.monotonic() + self.timeout_s
        pause = _POLL_S[0]
        while True:
            for s in sorted(missing):
                key = self._key(name, s)
                if store.check([key]):
                    got[s] = json.loads(store.get(key))
                    missing.discard(s)
            if not missing:
                return got, [], []
            dec = self.decision()
            if dec is not None and dec.get("decision") == "abort":
                raise _Abandoned(dec)
            dead = self.dead(sorted(missing))
            if len(dead) == len(missing) or time.monotonic() >= deadline:
                return got, sorted(missing), dead
            time.sleep(pause)
            pause = min(pause * 2, _POLL_S[1])


def _group_store(group: Any) -> tuple[Any, int, int]:
    """(store, index of this process, size) of a torch.distributed group (None: WORLD)."""
    try:
        import torch.distributed as dist
        from torch.distributed import distributed_c10d as c10d
    except ModuleNotFoundError as err:
        raise ModuleNotFoundError("allocate_rank needs torch.distributed; install the extra "
                                  "with: pip install 'kvgrant[group]'") from err
    if not dist.is_available() or not dist.is_initialized():
        raise GroupError("allocate_rank: torch.distributed is not initialised; call "
                         "torch.distributed.init_process_group first (or pass store=)")
    pg = group if group is not None else dist.group.WORLD
    if not isinstance(pg, dist.ProcessGroup):
        # was: a bare KeyError from torch's table of groups (a store passed as the
        # group, positionally, or a name)
        raise ArgumentError(f"group = {show_value(pg)} ({type(pg).__name__}): must be None "
                            "(the default group) or a torch.distributed ProcessGroup "
                            "(dist.new_group(...)); a Store goes to store=",
                            argument="group", value=pg)
    return c10d._get_process_group_store(pg), dist.get_rank(pg), dist.get_world_size(pg)


# ---------------------------------------------------------------------- run state
class _Slot:
    """A rank whose memory this process maps: its own, or an owner it imports from."""

    __slots__ = ("rank", "base")

    def __init__(self, rank: int, base: int) -> None:
        self.rank = rank
        self.base = base


class _StepFailed(Exception):
    """Internal: a step of the build failed; ``text`` is the rank's first error."""

    def __init__(self, text: str, cause: BaseException, peer: int | None = None,
                 call: str | None = None, result: str | None = None) -> None:
        super().__init__(text)
        self.text = text
        self.cause = cause
        self.peer = peer
        self.call = call
        self.result = result


@dataclass
class _State:
    va: bool = False
    created: int = 0
    mapped: int = 0
    alias_mapped: int = 0
    grants: int = 0
    ready: bool = False
    failed: bool = False
    exported: int = 0
    sent: int = 0
    imported: int = 0
    import_mapped: int = 0
    import_grants: int = 0
    plane_grants: dict[int, int] = field(default_factory=dict)
    alias_grants: dict[int, int] = field(default_factory=dict)


def group_backend(name: str, devices: Sequence[int]) -> str:
    """The backend a group worker opens for ``name``: ``auto`` is cuda when this host has
    a usable device for every rank's device number, else sim (every rank decides alike)."""
    if name != "auto":
        return name
    from kvgrant.runtime.cuda import usable_device_count

    return "cuda" if usable_device_count() > max(devices) else "sim"


def open_group_driver(name: str, options: Mapping[str, Any], devices: Sequence[int]) -> Driver:
    """The driver of one group worker, opened as every worker opens it: sim with a device
    for every rank's device number, cuda without the sim's handle budget. Shared with
    ``kvgrant alloc``'s --fail-at check, which must open the same driver (and the same
    sim host pool, with the same budget) as the workers it checks for."""
    opts = dict(options)
    if name == "sim":
        opts.setdefault("devices", max(devices) + 1)
    else:
        opts.pop("handle_budget", None)
    return open_driver(name, **opts)


class _GroupRun:
    """One process's attempt: what :class:`~kvgrant.runtime.published.Published` and the
    unwinding need (the same names as the one-process allocator's run)."""

    def __init__(self, g: Geometry, plan: PhysicalPlan, driver: Driver | None, rank: int,
                 devices: Sequence[int], trace: TraceWriter,
                 interrupt: DeferredInterrupt | None = None, *,
                 backend: str | None = None) -> None:
        self.g = g
        self.plan = plan
        self.allocs: tuple[Allocation, ...] = plan.allocations
        # None only for a rank whose driver could not be opened: it makes no step
        self.driver: Driver = driver  # type: ignore[assignment]
        self.backend = backend if backend is not None else getattr(driver, "name", "?")
        self.rank = rank
        self.devices = list(devices)
        self.device = self.devices[rank]
        self.trace = trace
        self.st = _State()
        self.phase = "Allocating"
        self.G = g.granularity
        self.plane_off, self.region_off, self.slot_bytes = va_layout(g)
        n = g.topology.ranks
        self.importers = list(g.importers(rank))
        self.owners = [o for o in range(n) if o != rank and rank in g.importers(o)]
        self.ranks: list[_Slot] = []   # filled by Reserve: own slot, then owners'
        self.base = 0
        self._head: dict[str, Any] | None = None   # the header, written at the first event
        # a Ctrl-C held back until the next allocation boundary (see boundary())
        self.interrupt = interrupt if interrupt is not None else DeferredInterrupt()

    # ------------------------------------------- what Published asks of an engine
    def plane_vas(self) -> list[dict[str, int]]:
        """[slot][plane] -> VA (GroupPublished keys them by rank instead)."""
        return [{p: sl.base + o for p, o in self.plane_off.items()} for sl in self.ranks]

    def region_vas(self) -> list[dict[str, int]]:
        return [{r: sl.base + o for r, o in self.region_off.items()} for sl in self.ranks]

    def shutdown(self, teardown: Teardown) -> list[BaseException]:
        """``Unpublish``, the committed undos (imports first, then own objects, LIFO),
        ``ShutdownComplete``; returns the undos that failed."""
        return traced_shutdown(self, teardown)

    # ------------------------------------------------------------------ tracing
    def state(self) -> dict[str, Any]:
        s = self.st
        return {"phase": self.phase, "va": s.va, "created": s.created, "mapped": s.mapped,
                "alias_mapped": s.alias_mapped, "grants": s.grants, "ready": s.ready,
                "failed": s.failed, "exported": s.exported, "sent": s.sent,
                "imported": s.imported, "import_mapped": s.import_mapped,
                "import_grants": s.import_grants}

    def ev(self, action: str, args: Mapping[str, Any], call: str | None,
           result: str | None, va: int | None = None, size: int | None = None,
           handle: int | None = None) -> None:
        if self.trace.enabled:
            if self._head is not None:
                self.write_header()
            self.trace.event(self.rank, action, args, call, result, self.state(),
                             device=self.device, va=va, size=size, handle=handle)

    def _group(self, action: str, args: Mapping[str, Any] | None = None) -> None:
        """A group step in this process's file (``rank`` = own rank); flushes."""
        self.ev(action, args or {}, None, None)
        if self.trace.enabled:
            self.trace.flush()

    def header(self, procs: int, host: str, run_id: str) -> None:
        """The header (version 2, docs/group-trace.md), written with the first event:
        it names this process's reservation base, known once Reserve has returned
        (null when it never did), and the run id every process of the run shares (rank
        0's hello token), so files of two runs are not read as one group."""
        if not self.trace.enabled:
            return
        g = self.g
        self._head = dict(
            ranks=g.topology.ranks, allocs=len(self.allocs), geometry=g.name,
            plan=self.plan.label, backend=self.backend,
            devices={str(r): d for r, d in enumerate(self.devices)}, mode="group",
            rank=self.rank, procs=procs, host=host, pid=os.getpid(), run=run_id)

    def write_header(self) -> None:
        """Write the header now if it is still pending (the first event, or a close
        before any event)."""
        head, self._head = self._head, None
        if head is None or not self.trace.enabled:
            return
        head.update(group_plan_header(self.g, self.allocs, self.plane_off, self.region_off,
                                      self.slot_bytes, self.rank,
                                      self.base if self.st.va else None))
        self.trace.header(version=GROUP_VERSION, **head)

    # --------------------------------------------------------------- a driver step
    def step(self, action: str, args: Mapping[str, Any], call: str, fn: Callable[[], Any],
             target: str, va: int | None = None, size: int | None = None) -> Any:
        """Run one driver call; on failure trace it (state ``failed``) and raise
        :class:`_StepFailed` carrying the rank's first error."""
        try:
            return fn()
        except DriverError as e:
            result, cause = e.result_name, e
        except OSError as e:  # memfd / socket trouble inside a step
            code = errno.ETIMEDOUT if isinstance(e, TimeoutError) else e.errno or 0
            result, cause = errno.errorcode.get(code, "OSError"), e  # type: ignore[assignment]
        self.st.failed = True
        self.ev(action, args, call, result, va, size)
        where = f" at va {va:#x}+{size:#x}" if va is not None and size is not None else ""
        text = (f"{call} failed with {result} on rank {self.rank} (device {self.device}): "
                f"{target}{where}; cause: {cause}")
        raise _StepFailed(text, cause, call=call, result=result)

    def boundary(self, action: str, args: Mapping[str, Any], call: str, target: str,
                 size: int | None = None) -> None:
        """Stop here if a Ctrl-C was held back: an allocation boundary, where nothing is
        half made. The step that does not happen is traced as failed (result
        ``KeyboardInterrupt``, as the one-process engine does) and the rank votes
        failed, so the group unwinds as after any failed step."""
        if not self.interrupt.pending:
            return
        self.st.failed = True
        self.ev(action, args, call, _INTERRUPTED, None, size)
        text = (f"rank {self.rank} (device {self.device}) was interrupted (Ctrl-C) before "
                f"{call} of {target}")
        raise _StepFailed(text, KeyboardInterrupt(), call=call, result=_INTERRUPTED)

    def target(self, a: Allocation, mapping: str, owner: int | None = None) -> str:
        who = "" if owner is None else f"imported from rank {owner}, "
        return who + allocation_target_text(a, mapping)

    # ------------------------------------------------------------------- undos
    def undo_free(self, va: int, size: int) -> None:
        try:
            self.driver.free_address(va, size)
        except DriverError as e:
            e.locate(self.rank)  # (its byte range is the VA range it names)
            self.ev("Free", {}, "cuMemAddressFree", e.result_name, va, size)
            raise
        self.st.va = False
        self.st.ready = False
        self.ev("Free", {}, "cuMemAddressFree", _OK, va, size)

    def undo_release(self, i: int, handle: int) -> None:
        try:
            self.driver.release(handle)
        except DriverError as e:
            e.locate(self.rank, self.target(self.allocs[i], "plane"))
            self.ev("Release", {"alloc": i}, "cuMemRelease", e.result_name, handle=handle)
            raise
        self.st.created -= 1
        self.ev("Release", {"alloc": i}, "cuMemRelease", _OK, handle=handle)

    def undo_unmap(self, i: int, mapping: str, va: int, n: int) -> None:
        try:
            self.driver.unmap(va, n)
        except DriverError as e:
            e.locate(self.rank, self.target(self.allocs[i], mapping))
            self.ev("Unmap", {"alloc": i, "mapping": mapping}, "cuMemUnmap", e.result_name,
                    va, n)
            raise
        s = self.st
        if mapping == "plane":
            s.mapped -= 1
            s.grants -= s.plane_grants.pop(i, 0)
        else:
            s.alias_mapped -= 1
            s.grants -= s.alias_grants.pop(i, 0)
        self.ev("Unmap", {"alloc": i, "mapping": mapping}, "cuMemUnmap", _OK, va, n)

    def undo_import_unmap(self, owner: int, i: int, mapping: str, va: int, n: int,
                          granted: list[int]) -> None:
        args = {"owner": owner, "alloc": i, "mapping": mapping}
        try:
            self.driver.unmap(va, n)
        except DriverError as e:
            e.locate(self.rank, self.target(self.allocs[i], mapping, owner))
            self.ev("ImportUnmap", args, "cuMemUnmap", e.result_name, va, n)
            raise
        self.st.import_mapped -= 1
        self.st.import_grants -= granted[0]
        self.ev("ImportUnmap", args, "cuMemUnmap", _OK, va, n)

    def undo_import_release(self, owner: int, i: int, handle: int) -> None:
        args = {"owner": owner, "alloc": i}
        try:
            self.driver.release(handle)
        except DriverError as e:
            e.locate(self.rank, self.target(self.allocs[i], "plane", owner))
            self.ev("ImportRelease", args, "cuMemRelease", e.result_name, handle=handle)
            raise
        self.st.imported -= 1
        self.ev("ImportRelease", args, "cuMemRelease", _OK, handle=handle)

    # ------------------------------------------------------------------ build
    def build_own(self, txn: Transaction) -> None:
        """Reserve, then per allocation Create, Map, MapAlias, Grant (own device only)."""
        d, s, dev = self.driver, self.st, self.device
        size = self.slot_bytes * (1 + len(self.owners))
        what = f"reservation bytes [0x0, {size:#x}) (size {size:#x})"  # as one process
        self.boundary("Reserve", {}, "cuMemAddressReserve", what, size)
        base = self.step("Reserve", {}, "cuMemAddressReserve",
                         lambda: d.reserve(size, self.G, device=dev), what, None, size)
        s.va = True
        self.base = base
        self.ranks = [_Slot(self.rank, base)] + [
            _Slot(o, base + (k + 1) * self.slot_bytes) for k, o in enumerate(self.owners)]
        self.ev("Reserve", {}, "cuMemAddressReserve", _OK, base, size)
        txn.push(self.undo_free, base, size)
        self.handles: list[int] = []
        for i, a in enumerate(self.allocs):
            n = a.length
            self.boundary("Create", {"alloc": i}, "cuMemCreate", self.target(a, "plane"), n)
            h = self.step("Create", {"alloc": i}, "cuMemCreate", lambda: d.create(n, dev),
                          self.target(a, "plane"), None, n)
            s.created += 1
            self.ev("Create", {"alloc": i}, "cuMemCreate", _OK, None, n, h)
            txn.push(self.undo_release, i, h)
            self.handles.append(h)
            pva = base + self.plane_off[a.plane] + a.plane_offset
            self.step("Map", {"alloc": i}, "cuMemMap", lambda: d.map(pva, n, h),
                      self.target(a, "plane"), pva, n)
            s.mapped += 1
            self.ev("Map", {"alloc": i}, "cuMemMap", _OK, pva, n, h)
            txn.push(self.undo_unmap, i, "plane", pva, n)
            ava = 0
            if a.region is not None:
                ava = base + self.region_off[a.region] + (a.region_offset or 0)
                self.step("MapAlias", {"alloc": i}, "cuMemMap", lambda: d.map(ava, n, h),
                          self.target(a, "alias"), ava, n)
                s.alias_mapped += 1
                self.ev("MapAlias", {"alloc": i}, "cuMemMap", _OK, ava, n, h)
                txn.push(self.undo_unmap, i, "alias", ava, n)
            for mapping, va in (("plane", pva), ("alias", ava)):
                if mapping == "alias" and a.region is None:
                    continue
                args = {"alloc": i, "mapping": mapping, "devices": [dev]}
                self.step("Grant", args, "cuMemSetAccess", lambda: d.set_access(va, n, [dev]),
                          self.target(a, mapping), va, n)
                s.grants += 1
                (s.plane_grants if mapping == "plane" else s.alias_grants)[i] = 1
                self.ev("Grant", args, "cuMemSetAccess", _OK, va, n)

    def send_all(self, addresses: Mapping[int, str], timeout_s: float,
                 clients: dict[int, FdClient]) -> None:
        """Export each allocation once and send the fd to every validated importer (the
        connection to an importer is made by the first send to it)."""
        d, s = self.driver, self.st
        deadline = time.monotonic() + timeout_s

        def send(r: int, i: int, fd: int, n: int) -> None:
            c = clients.get(r)
            if c is None:
                c = clients[r] = FdClient(self.rank, r, addresses[r], deadline)
            c.send(i, fd, n, self.device, deadline)

        for i, a in enumerate(self.allocs):
            if not self.importers:
                break
            h = self.handles[i]
            self.boundary("Export", {"alloc": i}, "cuMemExportToShareableHandle",
                          self.target(a, "plane"), a.length)
            fd = self.step("Export", {"alloc": i}, "cuMemExportToShareableHandle",
                           lambda: d.export_handle(h), self.target(a, "plane"), None, a.length)
            try:
                s.exported += 1
                self.ev("Export", {"alloc": i}, "cuMemExportToShareableHandle", _OK, None,
                        a.length, h)
                for r in self.importers:
                    args = {"alloc": i, "to": r}
                    self.step("Send", args, "sendmsg", lambda: send(r, i, fd, a.length),
                              f"fd of allocation {i} to rank {r}")
                    s.sent += 1
                    self.ev("Send", args, "sendmsg", "SUCCESS")
                    # the importer traces its Import once the fd is there: a kill of
                    # this process must not lose the Send that Import needs
                    self.trace.ship()
            finally:
                d.close_shareable(fd)

    def import_all(self, server: FdServer, timeout_s: float, check: Callable[[int], None],
                   txn: Transaction) -> None:
        """Per owner (ascending) and allocation: Import, ImportMap, ImportGrant."""
        d, s, dev = self.driver, self.st, self.device
        deadline = time.monotonic() + timeout_s
        for k, o in enumerate(self.owners):
            slot = self.ranks[k + 1].base
            for i, a in enumerate(self.allocs):
                n = a.length
                iargs = {"owner": o, "alloc": i}
                target = self.target(a, "plane", o)

                def stop(iargs: dict[str, Any] = iargs, target: str = target, n: int = n,
                         o: int = o) -> None:
                    # before the import, and while its fd is awaited (nothing made yet)
                    self.boundary("Import", iargs, "cuMemImportFromShareableHandle",
                                  target, n)
                    check(o)

                self.boundary("Import", iargs, "cuMemImportFromShareableHandle", target, n)
                try:
                    got = server.take(o, i, deadline, stop)
                except GroupError as e:
                    # the model's failed Import: the fd never came (the owner failed,
                    # died or did not answer by the deadline)
                    s.failed = True
                    self.ev("Import", iargs, "recvmsg", "ETIMEDOUT" if e.missing else
                            "ECANCELED", None, n)
                    raise _StepFailed(f"rank {self.rank} stopped importing from rank {o}: {e}",
                                      e, peer=-1 if e.peer is None else e.peer) from e
                try:
                    if got.size != n:
                        s.failed = True
                        self.ev("Import", iargs, "recvmsg", "EINVAL", None, n)
                        raise _StepFailed(f"rank {o} sent allocation {i} of {got.size:#x} "
                                          f"bytes, the plan says {n:#x}", GroupError("size"),
                                          peer=o)
                    h = self.step("Import", iargs, "cuMemImportFromShareableHandle",
                                  lambda: d.import_handle(got.fd), self.target(a, "plane", o),
                                  None, n)
                finally:
                    d.close_shareable(got.fd)
                s.imported += 1
                self.ev("Import", iargs, "cuMemImportFromShareableHandle", _OK, None, n, h)
                txn.push(self.undo_import_release, o, i, h)
                maps: list[tuple[str, int, list[int]]] = []
                pva = slot + self.plane_off[a.plane] + a.plane_offset
                mappings = [("plane", pva)]
                if a.region is not None and self.g.region_by_name[a.region].access == "importers":
                    mappings.append(("alias", slot + self.region_off[a.region]
                                     + (a.region_offset or 0)))
                for mapping, va in mappings:
                    margs = {"owner": o, "alloc": i, "mapping": mapping}
                    self.step("ImportMap", margs, "cuMemMap", lambda: d.map(va, n, h),
                              self.target(a, mapping, o), va, n)
                    s.import_mapped += 1
                    granted = [0]   # filled by the grant; the undo reads it when it runs
                    self.ev("ImportMap", margs, "cuMemMap", _OK, va, n, h)
                    txn.push(self.undo_import_unmap, o, i, mapping, va, n, granted)
                    maps.append((mapping, va, granted))
                for mapping, va, granted in maps:
                    gargs = {"owner": o, "alloc": i, "mapping": mapping, "devices": [dev]}
                    self.step("ImportGrant", gargs, "cuMemSetAccess",
                              lambda: d.set_access(va, n, [dev]), self.target(a, mapping, o),
                              va, n)
                    s.import_grants += 1
                    granted[0] = 1
                    self.ev("ImportGrant", gargs, "cuMemSetAccess", _OK, va, n)

    def counts(self) -> Counts:
        A = len(self.allocs)
        aliased = sum(1 for a in self.allocs if a.region is not None)
        shared = sum(1 + (a.region is not None
                          and self.g.region_by_name[a.region].access == "importers")
                     for a in self.allocs)
        shared_alias = shared - A
        k = len(self.owners)
        maps = A + aliased + k * shared
        return Counts(ranks=1, reservations=1, allocations=A + k * A, mappings=maps,
                      alias_mappings=aliased + k * shared_alias, set_access_calls=maps,
                      grants=self.st.grants + self.st.import_grants)


# -------------------------------------------------------------------- published
class _Mapped(dict):  # type: ignore[type-arg]
    """rank -> VAs, for the ranks this process maps; any other rank is a clear error."""

    def __init__(self, pub: "GroupPublished", items: Mapping[int, Any]) -> None:
        super().__init__(items)
        self._pub = pub

    def __missing__(self, rank: int) -> Any:
        self._pub._view_device(rank)  # raises GroupError naming what is mapped


class _PeerRegions(dict):  # type: ignore[type-arg]
    """region -> VA of one rank's slot; a peer's owner-only region is a clear error."""

    def __init__(self, owner: int, me: int, items: Mapping[str, int]) -> None:
        super().__init__(items)
        self._owner, self._me = owner, me

    def __missing__(self, region: str) -> int:
        raise GroupError(f"region {region!r} of rank {self._owner} is not mapped in the "
                         f"process of rank {self._me} (owner-only regions are not imported)",
                         rank=self._me, peer=self._owner)


class GroupPublished(Published):
    """What :func:`allocate_rank` returns: the :class:`Published` shape for one process.

    ``plane_va`` / ``region_va`` hold the ranks whose memory this process maps: its own
    and every owner it imports from (``imports_from``); views of an imported plane are
    on this process's own device (the peer read goes through its own mapping).
    Release unwinds imports first, then own objects, then frees the reservation.
    """

    def __init__(self, run: _GroupRun, *args: Any, **kwargs: Any) -> None:
        super().__init__(run, *args, **kwargs)  # type: ignore[arg-type]
        self.rank = run.rank
        self.device = run.device
        self.imports_from: tuple[int, ...] = tuple(run.owners)
        self.importers: tuple[int, ...] = tuple(run.importers)
        self.plane_va = _Mapped(self, {  # type: ignore[assignment]
            sl.rank: {p: sl.base + o for p, o in run.plane_off.items()} for sl in run.ranks})
        g = run.g
        self.region_va = _Mapped(self, {  # type: ignore[assignment]
            sl.rank: _PeerRegions(sl.rank, run.rank, {
                reg: sl.base + o for reg, o in run.region_off.items()
                if sl.rank == run.rank or g.region_by_name[reg].access == "importers"})
            for sl in run.ranks})   # a peer's owner-only rows are not mapped here

    def _view_device(self, rank: int) -> int:
        if rank not in self.plane_va:
            raise GroupError(f"rank {rank}'s memory is not mapped in the process of rank "
                             f"{self.rank} (it maps its own and imports from "
                             f"{list(self.imports_from)})", rank=self.rank, peer=rank)
        return self.device

    def summary(self) -> dict[str, Any]:
        out = super().summary()
        out.update({"rank": self.rank, "device": self.device,
                    "imports_from": list(self.imports_from), "importers": list(self.importers),
                    "mode": "group"})
        return out


# --------------------------------------------------------------------- the API
def _err_text(e: BaseException) -> str:
    """``DriverError: ...``; a driver query failed before any address was reserved says
    its call, CUresult and device first, as the one-process runtime does."""
    if isinstance(e, DriverError) and e.rank is None:
        return (f"{e.call} failed with {e.result_name} (device {e.device}) before anything "
                f"was created (no address reserved, so no byte range): {e}")
    return f"{type(e).__name__}: {e}"


def _check_timeout(timeout_s: Any) -> None:
    if isinstance(timeout_s, bool) or not isinstance(timeout_s, (int, float)) \
            or not 0 < timeout_s <= MAX_TIMEOUT_S:
        # inf or 2**1100 once reached socket.settimeout as a bare OverflowError
        raise ArgumentError(f"timeout_s = {show_value(timeout_s)}: must be a number of "
                            f"seconds > 0 and at most {MAX_TIMEOUT_S:,} (a week)",
                            argument="timeout_s", value=timeout_s)


def _local_rank_device(rank: int) -> int:
    """The CUDA ordinal of a rank given no ``device``: ``LOCAL_RANK`` (torchrun), else
    ``rank``."""
    local = os.environ.get("LOCAL_RANK", str(rank))
    if not (local.isascii() and local.isdigit()):
        raise ArgumentError(f"LOCAL_RANK = {show_value(local)}: must be a device "
                            "number >= 0 (torchrun sets it; or pass device=)",
                            argument="LOCAL_RANK", value=local)
    if int(local) > MAX_DEVICE_ORDINAL:
        raise ArgumentError(f"LOCAL_RANK = {show_value(local)}: must be a device "
                            f"number in 0..{MAX_DEVICE_ORDINAL}", argument="LOCAL_RANK",
                            value=local)
    return int(local)


def _store_of(group: Any, store: Any, rank: int, n: int) -> tuple[Any, int, int]:
    """(store, index of this process, size): the group's, or the one given (tests)."""
    if store is None:
        return _group_store(group)
    missing = [m for m in _STORE_METHODS if not callable(getattr(store, m, None))]
    if missing:
        raise ArgumentError(f"store = {show_value(store)}: must be a "
                            "torch.distributed Store (it has no "
                            f"{', '.join(missing)})", argument="store", value=store)
    return store, rank, n


def _tell_group(chan: "_Channel", rank: int, error: KVGrantError) -> NoReturn:
    """Post this rank's hello with its argument error and raise ``error``: every other
    rank reads the error in the hello and refuses at once, naming it, before any driver
    call (without waiting for them here: a lone caller is not held up either)."""
    chan.post("hello", _hello(rank, socket.gethostname(), error=_err_text(error)))
    raise error


def _hello(rank: int, host: str, *, addr: Any = None, device: int | None = None,
           demand: Any = None, digests: Any = None, error: str | None = None,
           trace: str | None = None) -> dict[str, Any]:
    """This process's hello record (what :func:`_join` reads of every rank)."""
    return {"rank": rank, "pid": os.getpid(), "uid": os.getuid(), "host": host,
            "pidns": _pidns(), "addr": addr, "device": device, "demand": demand,
            "digests": digests, "error": error, "run": secrets.token_hex(8),
            "trace": trace}


def _trace_file(target: Any) -> str | None:
    """The absolute path of the file this rank's trace goes to (its argument, else
    ``KVGRANT_TRACE``), or None (a stream, a writer, no trace): the hello compares them,
    since two ranks of one host writing one file interleave two traces in it."""
    from kvgrant.runtime.trace import env_trace_path

    if target is None:
        target = env_trace_path()
    if isinstance(target, (str, os.PathLike)) and not isinstance(target, bytes):
        return os.path.realpath(os.fspath(target))
    return None


def allocate_rank(geometry: "Geometry | str | Path", rank: int, group: Any = None, *,
                  plan: "PhysicalPlan | str | Callable[[Geometry], PhysicalPlan]" = "packed",
                  backend: "str | Backend | Driver" = "auto",
                  device: int | None = None,
                  memory_limit: "str | int | MemoryLimit | None" = None,
                  check_contract: bool = True,
                  budget: HandleBudget | None = None,
                  trace: "str | Path | IO[str] | TraceWriter | TraceOptions | None" = None,
                  timeout_s: float = DEFAULT_TIMEOUT_S, store: Any = None,
                  **shorthands: Unpack[RankShorthands]) -> GroupPublished:
    """Allocate ``rank``'s KV cache in this process, as one member of ``group``.

    Every process of the group calls it (once per attempt, with the same geometry and
    plan); each returns its own :class:`GroupPublished`, or every one raises.

    Parameters
    ----------
    geometry, plan, backend, memory_limit, check_contract
        As for :func:`kvgrant.runtime.allocate`.
    rank
        The rank this process owns (0..topology.ranks-1); the group has one process
        per rank.
    group
        An initialised ``torch.distributed`` process group (gloo or NCCL; None: the
        default group). kvgrant uses only its rendezvous store, for small control
        messages.
    device
        This rank's CUDA ordinal (default: ``LOCAL_RANK`` when set, else ``rank``).
    budget
        The host's driver-handle pool (:class:`HandleBudget`): the demand of every rank
        on a host is summed before any driver call and refused when it and ``reserve``
        overdraw ``handles``; then this process reserves its own share in ``ledger``
        (see :func:`take_ledger_lease`), which sums it with every other holder.
        ``preflight=False`` skips both refusals; the lease is still recorded.
    trace
        This process's own trace, as for :func:`~kvgrant.runtime.allocate`. A trace
        that could not be written leaves the rank published, the error in
        ``trace_error`` (the group published together; one rank is not released for
        its trace), so ``TraceOptions(errors="raise")`` is refused.
    timeout_s
        How long any group step waits for the others; a rank that has not answered by
        then (or whose process is gone) is named missing and the group aborts.
    store
        A ``torch.distributed.Store`` to use instead of the group's (tests).
    **shorthands
        As for :func:`~kvgrant.runtime.allocate` (``handle_budget``, ``handle_reserve``,
        ``preflight``, ``ledger``, ``driver``, ``driver_options``), without a warning.

    Returns
    -------
    GroupPublished
        Views of this rank's planes and of the imported peers' planes.

    Raises
    ------
    HandleBudgetError
        A host's summed demand exceeds the budget (every rank's share named); nothing
        was created anywhere.
    GroupError
        The group did not publish: every process unwound what it made and imported;
        the error names each failed rank with its first error and each missing rank.
    KeyboardInterrupt
        Ctrl-C (SIGINT) during the start-up: this process unwound everything it made
        and imported (the group's error is the ``__cause__``), and the other ranks
        raise GroupError naming this one. After this rank's last import began: the
        group publishes, then this process releases its cache and raises.

    Notes
    -----
    One attempt: no retries, no smaller second attempt.

    While it runs (main thread, Python's own SIGINT handler in place), the first SIGINT
    is held back to the next allocation boundary of this rank's build (before Reserve,
    each Create, each Export, each Import, or while an owner's fd is awaited): the step
    that does not happen is traced as failed (``KeyboardInterrupt``), the rank votes
    failed and the group aborts as after any failed step, so nothing leaks and the
    group's traces conform. A second SIGINT raises at once. A handler the program
    installed itself is left alone (then nothing is held back).
    """
    interrupt = DeferredInterrupt()
    with interrupt:  # a Ctrl-C waits for an allocation boundary (runtime/interrupts.py)
        try:
            pub = _allocate_rank(
                geometry, rank, group, interrupt, plan=plan, backend=backend, device=device,
                memory_limit=memory_limit, check_contract=check_contract, budget=budget,
                trace=trace, timeout_s=timeout_s, store=store, **shorthands)
        except Exception as err:
            if interrupt.pending:  # unwound already; the Ctrl-C is what the caller asked for
                raise KeyboardInterrupt from err
            raise
    if interrupt.pending:  # Ctrl-C after the last import began: published, now shut down
        pub.release()
        raise KeyboardInterrupt
    return pub


def _allocate_rank(geometry: "Geometry | str | Path", rank: int, group: Any,
                   interrupt: DeferredInterrupt, *,
                   plan: "PhysicalPlan | str | Callable[[Geometry], PhysicalPlan]",
                   backend: "str | Backend | Driver", device: int | None,
                   memory_limit: "str | int | MemoryLimit | None", check_contract: bool,
                   budget: HandleBudget | None,
                   trace: "str | Path | IO[str] | TraceWriter | TraceOptions | None",
                   timeout_s: float, store: Any,
                   **shorthands: Unpack[RankShorthands]) -> GroupPublished:
    """:func:`allocate_rank` with ``interrupt`` armed: its build stops at the first
    allocation boundary after a held-back Ctrl-C (see :meth:`_GroupRun.boundary`)."""
    # A bad argument of this rank only (memory_limit, device, timeout_s, ...) is told to
    # the group in the hello, so the others abort at once naming it instead of waiting
    # out timeout_s, and every rank's attempt count stays the same for the next call.
    arg_error: KVGrantError | None = None   # an ArgumentError (memory_limit's too)
    try:
        opts = group_options(allocate_rank, shorthands, budget=budget, trace=trace,
                             backend=backend,
                             accepted=frozenset(RankShorthands.__annotations__))
        if opts.trace.errors == "raise":
            raise refuse("TraceOptions.errors", "raise", "allocate_rank keeps a rank of a "
                         "published group whose trace was lost, the error in trace_error "
                         "(the group published together); pass 'continue' or None")
        _check_timeout(timeout_s)
        check_flag("check_contract", check_contract)   # was: any value, read as truthy
        check_plan_arg(plan)   # as allocate() checks it
        if device is not None:   # a str once failed as a bare TypeError, -1 in the driver
            device = check_index("device", device, MAX_DEVICE_ORDINAL + 1, "CUDA ordinal")
        limit = parse_memory_limit(memory_limit)
        # never the geometry file; a file that is not a trace only with overwrite=True
        check_trace_path("trace", opts.trace.target, geometry,
                         overwrite=opts.trace.overwrite)
    except KVGrantError as e:
        arg_error = e
    try:
        g = geometry if isinstance(geometry, Geometry) else load_geometry(geometry)
        n = g.topology.ranks
        r = as_int(rank)   # a numpy or torch integer is a rank too
        if r is None or not 0 <= r < n:
            # a bad argument (was GroupError, as if the group had refused)
            raise refuse("rank", rank, f"must be an integer rank 0..{n - 1} "
                                       f"(topology.ranks = {n})")
        rank = r
        store, index, world = _store_of(group, store, rank, n)
        if world != n:
            raise GroupError(f"the group has {world} process(es) but topology.ranks = {n}: "
                             "allocate_rank needs one process per rank", rank=rank)
    except BaseException as e:   # no group to tell: this rank's own refusal only
        if arg_error is not None:
            e.add_note(f"and an argument of this rank is bad too: {_err_text(arg_error)}")
        raise
    if device is None and arg_error is None:
        try:
            device = _local_rank_device(rank)
        except ArgumentError as e:
            arg_error = e
    if arg_error is not None:
        _tell_group(_Channel(store, index, world, DEFAULT_TIMEOUT_S), rank, arg_error)
    host = socket.gethostname()
    chan = _Channel(store, index, world, timeout_s)
    handles, reserve = opts.budget.limits()
    preflight = opts.budget.preflight
    driver = None if isinstance(opts.backend, Backend) else opts.backend
    name = getattr(opts.backend, "name", "?")

    def checked(gg: Geometry) -> PhysicalPlan:
        require_allocatable_granularity(gg)
        # a wait for another process planning into the host's cache ends with timeout_s
        p = resolve_plan(gg, plan, cache_wait_s=timeout_s)
        if isinstance(plan, PhysicalPlan):
            require_plan_for(p, gg)
        from kvgrant.layout.contract import require_buildable, require_contract

        if check_contract:
            require_contract(gg, p)
        else:  # the contract is not asked for, but the engine needs what it names
            require_buildable(gg, p)
        return p

    # -- 1. hello: before any driver call --------------------------------------------
    server: FdServer | None = None
    local_error: BaseException | None = None
    the_plan: PhysicalPlan | None = None
    try:
        the_plan = checked(g)
        owners = [o for o in range(n) if o != rank and rank in g.importers(o)]
        _ensure_fd_room(len(the_plan.allocations) * (2 * len(owners) + 2))
        server = FdServer(rank, f"{chan.attempt}")
    except (KVGrantError, OSError) as e:
        local_error = e
    if local_error is None and interrupt.pending:  # Ctrl-C before the hello: nobody starts
        local_error = KeyboardInterrupt("interrupted (Ctrl-C) before the group started")
    hello = _hello(rank, host, addr=server.address if server else None, device=device,
                   demand=rank_demand(g, the_plan, rank) if the_plan is not None else None,
                   digests=plan_digests(g, the_plan) if the_plan is not None else None,
                   error=_err_text(local_error) if local_error else None,
                   trace=_trace_file(opts.trace.target))
    try:
        recs = _join(chan, hello, g, rank, timeout_s)
        assert the_plan is not None and server is not None
        hosts = [recs[r]["host"] for r in range(n)]
        devices = [int(recs[r]["device"]) for r in range(n)]
        if preflight:
            _check_host_budget(g, the_plan, hosts, handles, reserve)
    except BaseException as e:
        if not isinstance(e, KVGrantError):  # not a refusal every rank makes alike
            _decide_abort(chan, rank, f"rank {rank} stopped in the hello: {_err_text(e)}", e)
        if server is not None:
            server.close()
        raise

    # -- ledger lease, then 2. set-up ----------------------------------------------------
    tw: TraceWriter | None = None
    lease: Lease | None = None
    owns = driver is None
    setup_error: BaseException | None = None
    free: int | None = None
    try:
        if driver is None:
            name = group_backend(name, devices)
        lease = take_ledger_lease(
            opts.budget.ledger, handles=rank_demand(g, the_plan, rank), geometry=g,
            label=f"{the_plan.label}, rank {rank} of {n}", budget=handles, reserve=reserve,
            backend=name, check=preflight, device=device)
        tw = open_trace(opts.trace.target)
        try:
            if driver is None:
                assert isinstance(opts.backend, Backend)
                driver = open_group_driver(name, opts.backend.options, devices)
            if driver.device_count() <= device:
                raise PlanError(f"rank {rank}: device {device} does not exist (the "
                                f"{driver.name} backend has {driver.device_count()})")
            gran = driver.granularity(device)
            if g.granularity % gran:
                raise PlanError(f"granularity = {g.granularity}: not a multiple of device "
                                f"{device}'s allocation granularity {gran}")
            free = driver.free_memory(device)[0]
        except (KVGrantError, OSError) as e:
            setup_error = e
    except BaseException as e:
        _decide_abort(chan, rank, f"rank {rank} failed before start-up: {_err_text(e)}", e)
        if server is not None:
            server.close()
        if lease is not None:
            lease.release()
        if tw is not None:
            tw.close()
        if owns and driver is not None:
            driver.close()
        raise
    assert server is not None and tw is not None and lease is not None

    # -- 3. build, 4. vote, decide, publish or abort -----------------------------------
    t0 = time.perf_counter()   # reset when the build starts: start-up as the allocator's
    txn = Transaction()
    txn.push_unless_undo_failed(lease.release)  # the last undo; kept if objects are left live
    clients: dict[int, FdClient] = {}
    fail: _StepFailed | None = None
    run: _GroupRun | None = None
    capacity: Capacity | None = None
    fit: PageFit | None = None
    try:
        with gc_paused():
            try:
                got, missing, dead = chan.gather("setup", {
                    "rank": rank, "free": free,
                    "error": _err_text(setup_error) if setup_error else None})
            except _Abandoned as ab:
                got, missing, dead = [], [], []
                fail = _StepFailed(f"rank {rank} stopped: {ab}", ab, peer=-1)
            if fail is None and (missing or setup_error is not None
                                 or any(x and x["error"] for x in got)):
                bad = {int(x["rank"]): x["error"] for x in got if x and x["error"]}
                text = (f"rank {rank} failed before start-up: {_err_text(setup_error)}"
                        if setup_error is not None else
                        f"rank {rank} did not start: " + "; ".join(
                            [f"rank {r} failed: {t}" for r, t in sorted(bad.items())]
                            + [f"rank {_rank_of(chan, s)} did not answer" for s in missing]))
                culprit = min(bad) if bad else _rank_of(chan, missing[0]) if missing else None
                fail = _StepFailed(text, setup_error or GroupError(text),
                                   peer=None if setup_error is not None else culprit)
            if fail is None:
                per_dev: dict[int, int] = {}
                for x in got:
                    assert x is not None
                    dv = devices[int(x["rank"])]
                    per_dev[dv] = min(per_dev.get(dv, x["free"]), x["free"])
                try:
                    fit = fit_pages(g, per_dev, limit)
                    if fit.reduced:
                        if isinstance(plan, PhysicalPlan):
                            raise PlanError(f"memory_limit = {limit.text!r}: plan {plan.label!r} "
                                            f"needs {g.pages} pages; only {fit.pages} fit")
                        g = parse_geometry(g.model_copy(update={"pages": fit.pages}).model_dump())
                        the_plan = checked(g)
                except KVGrantError as e:
                    fail = _StepFailed(f"rank {rank}: {_err_text(e)}", e)
                if fit is not None and fit.reduced and not isinstance(plan, PhysicalPlan):
                    fail = _agree_on_replan(chan, g, the_plan, rank, fail)
            # no driver only when the set-up failed opening it: then the run makes no
            # driver call, it traces the failed Reserve and votes
            assert driver is not None or fail is not None
            run = _GroupRun(g, the_plan, driver, rank, devices, tw, interrupt, backend=name)
            run.header(n, host, str(recs[0]["run"]))
            if fail is not None:
                # stopped before its first step (its own set-up failed, or another
                # rank's did): the model's failed Reserve, nothing was made
                run.st.failed = True
                cause = fail.cause
                run.ev("Reserve", {}, getattr(cause, "call", None) or "all_gather",
                       getattr(cause, "result_name", None) or "ECANCELED")
            # drain what owners send even if this rank fails, so no sender blocks
            server.start({o: recs[o]["pid"] for o in run.owners})
            if fail is None:
                t0 = time.perf_counter()
                try:
                    run.build_own(txn)
                    addrs = {r: recs[r]["addr"] for r in run.importers}
                    run.send_all(addrs, timeout_s, clients)
                    for c in clients.values():
                        c.finish()
                    clients.clear()

                    def check(o: int) -> None:
                        vote = chan.peek("vote", chan.slot_of[o])
                        if vote is not None and not vote["ready"]:
                            raise GroupError(f"rank {o} voted failed (its error is above) "
                                             f"while rank {rank} waited for its fds",
                                             rank=rank, peer=o)
                        dec = chan.decision()
                        if dec is not None and dec.get("decision") == "abort":
                            raise GroupError(f"rank {rank} stopped: the group decided to "
                                             f"abort: {dec.get('reason')}", rank=rank)
                        if chan.dead([chan.slot_of[o]]):
                            raise GroupError(f"rank {o}'s process (pid {recs[o]['pid']}) is "
                                             "gone", rank=rank, peer=o, missing=[o])

                    run.import_all(server, timeout_s, check, txn)
                    run.st.ready = True
                    run.ev("RankReady", {}, None, None)
                except _StepFailed as f:
                    fail = f
                    _tell_importers(run, recs, clients, f.text)
            # -- the vote, before any barrier ----------------------------------
            if fail is not None:
                run.st.failed = True
            decision = _vote(chan, rank, fail, timeout_s)
            vargs: dict[str, Any] = {"ready": fail is None}
            if fail is not None:
                vargs["error"] = fail.text
            run.ev("Vote", vargs, "all_gather", "SUCCESS")
            failed = _failed_of(decision)
            run.ev("Decide", {"decision": decision["decision"], "failed": sorted(failed),
                              "missing": sorted(decision.get("missing", []))}, None, None)
            server.close()
            if decision["decision"] == "publish" and fail is None:
                run.phase = "Published"
                run._group("Publish")
                teardown = txn.commit()
                startup = time.perf_counter() - t0
                assert fit is not None
                capacity = Capacity(pages=g.pages, page_tokens=g.page_tokens,
                                    rows={reg.name: reg.rows for reg in g.regions},
                                    bytes_per_rank=fit.bytes_per_rank,
                                    requested_pages=fit.requested, memory_limit=limit.text)
                reason = f"{driver.name}, rank {rank} of {n} processes"
                return GroupPublished(run, teardown, capacity, fit, startup, owns,
                                      run.counts(), reason)
            _abort(run, txn, decision, fail, owns)
            raise AssertionError("unreachable")  # pragma: no cover
    except BaseException as e:
        if isinstance(e, GroupError) and getattr(e, "_kvgrant_unwound", False):
            raise
        # an unexpected error (KeyboardInterrupt, a bug): unwind, then let it go
        if run is not None:
            _tell_importers(run, recs, clients, _err_text(e))
        server.close()
        _decide_abort(chan, rank, f"rank {rank} raised {_err_text(e)}", e)
        if run is not None:
            run.phase = "Aborting"
            run._group("Abort")
        errors = txn.rollback()
        if run is not None and not errors:
            run.phase = "Aborted"
            run._group("AbortComplete")
        tw.close()
        if owns and driver is not None:
            driver.close()
        attach_cleanup_errors(e, errors)
        raise


def _decide_abort(chan: _Channel, rank: int, reason: str, e: BaseException) -> None:
    """Write the abort decision naming this rank, so nobody else waits for it until the
    deadline. Best effort: the store may be gone too."""
    try:
        chan.decide(_abort_decision(reason, {rank: _err_text(e)}, []))
    except Exception:  # noqa: BLE001 - the store may be gone too
        pass


def _vote(chan: _Channel, rank: int, fail: _StepFailed | None, timeout_s: float
          ) -> dict[str, Any]:
    """All-gather this rank's vote, propose a decision, return the group's decision.

    Publish only when every rank voted ready; a rank missing at the deadline (or dead)
    makes it abort. ``compare_set`` keeps the first proposal written, so every rank
    follows the same decision even when their views of the votes differ.
    """
    vote: dict[str, Any] = {"rank": rank, "ready": fail is None}
    if fail is not None:
        vote.update(error=fail.text, peer=fail.peer)
    try:
        votes, missing, dead = chan.gather("vote", vote)
    except _Abandoned as ab:
        return ab.decision
    if missing:
        proposal = _abort_decision(_missing_reason(chan, missing, dead, timeout_s),
                                   _failed(votes), [_rank_of(chan, s) for s in missing])
    elif all(v and v["ready"] for v in votes):
        proposal = {"decision": "publish", "failed": [], "missing": [], "reason": ""}
    else:
        proposal = _abort_decision("a rank failed", _failed(votes), [])
    return chan.decide(proposal)


def _join(chan: _Channel, hello: Mapping[str, Any], g: Geometry, rank: int,
          timeout_s: float) -> dict[int, dict[str, Any]]:
    """The hello all-gather and its checks; returns rank -> hello record (with ``slot``).

    Every rank gets the same records, so every rank raises the same refusal: ranks that
    are not 0..N-1, a rank's own error (plan, contract, fds, socket), an importer on
    another host than its owner (POSIX fds do not cross hosts).
    """
    n = g.topology.ranks
    try:
        got, missing, _ = chan.gather("hello", hello)
    except _Abandoned as ab:
        raise _abandoned_error(rank, ab.decision) from None
    if missing:
        dec = chan.decide(_abort_decision(
            f"rank(s) {missing} did not join within {timeout_s:g} s", {}, missing))
        raise _abandoned_error(rank, dec)
    recs: dict[int, dict[str, Any]] = {}
    for s, rec in enumerate(got):
        assert rec is not None
        r = int(rec["rank"])
        if r in recs:
            raise GroupError(f"two processes claim rank {r} (group members "
                             f"{recs[r]['slot']} and {s})", rank=rank)
        rec["slot"] = s
        recs[r] = rec
    if sorted(recs) != list(range(n)):
        raise GroupError(f"the group's ranks are {sorted(recs)}, not 0..{n - 1}", rank=rank)
    errors = {r: rec["error"] for r, rec in recs.items() if rec["error"]}
    if errors:
        raise GroupError("the group did not start; nothing was created: " + "; ".join(
            f"rank {r} failed: {t}" for r, t in sorted(errors.items())), rank=rank,
            failed=errors)
    _check_same_plan({r: rec.get("digests") for r, rec in recs.items()}, rank,
                     "the group did not start")
    _check_own_trace_files(recs, rank)
    chan.slot_of = {r: rec["slot"] for r, rec in recs.items()}
    ns, host = _pidns(), hello["host"]
    chan.pids = {rec["slot"]: rec["pid"] for rec in recs.values()
                 if rec["host"] == host and rec["pidns"] == ns and rec["pid"] != os.getpid()}
    hosts = [recs[r]["host"] for r in range(n)]
    apart = [(o, i) for o in range(n) for i in g.importers(o) if hosts[o] != hosts[i]]
    if apart:
        raise GroupError("; ".join(
            f"rank {i} (host {hosts[i]!r}) imports from rank {o} (host {hosts[o]!r})"
            for o, i in apart) + ": POSIX fds do not cross hosts, so an import group "
            "must live on one host; nothing was created", rank=rank)
    return recs


def _check_own_trace_files(recs: Mapping[int, Mapping[str, Any]], rank: int) -> None:
    """Refuse, before any driver call, ranks of one host that would write one trace
    file. Why: ``trace="t.ndjson"`` given to every rank (as the one-process examples
    do) was accepted, both processes wrote the file, and it conformed to nothing."""
    by_file: dict[tuple[str, str], list[int]] = {}
    for r, rec in sorted(recs.items()):
        if rec.get("trace"):
            by_file.setdefault((rec["host"], rec["trace"]), []).append(r)
    shared = [(f, rs) for (_, f), rs in by_file.items() if len(rs) > 1]
    if shared:
        raise GroupError("; ".join(f"{_ranks_text(rs)} would write one trace file {f}"
                                   for f, rs in shared)
                         + ": each rank writes its own trace (e.g. trace=f\"rank{rank}.ndjson\" "
                         "in one folder, which kvgrant conform DIR reads); nothing was "
                         "created", rank=rank)


def _agree_on_replan(chan: _Channel, g: Geometry, plan: PhysicalPlan, rank: int,
                     fail: "_StepFailed | None") -> "_StepFailed | None":
    """After a memory limit shrank the pages every rank re-planned: all-gather the new
    digests (every rank takes part, a failed one with None) and fail before the first
    driver object unless they agree."""
    mine = plan_digests(g, plan) if fail is None else None
    try:
        got, missing, _ = chan.gather("replan", {"rank": rank, "digests": mine})
    except _Abandoned as ab:
        return fail or _StepFailed(f"rank {rank} stopped: {ab}", ab, peer=-1)
    if fail is not None:
        return fail
    if missing:
        text = f"rank {rank} did not start: ranks " + ", ".join(
            str(_rank_of(chan, s)) for s in missing) + " did not answer the re-plan"
        return _StepFailed(text, GroupError(text, rank=rank), peer=_rank_of(chan, missing[0]))
    digests = {int(x["rank"]): x["digests"] for x in got if x is not None}
    if any(d is None for d in digests.values()):
        bad = sorted(r for r, d in digests.items() if d is None)
        text = f"rank {rank} did not start: ranks {bad} failed to re-plan"
        return _StepFailed(text, GroupError(text, rank=rank), peer=bad[0])
    try:
        _check_same_plan(digests, rank, f"rank {rank} did not start (re-plan for "
                                        f"{g.pages} pages)")
    except GroupError as e:
        return _StepFailed(str(e), e, peer=min(e.failed) if e.failed else None)
    return None


def _tell_importers(run: _GroupRun, recs: Mapping[int, Mapping[str, Any]],
                    clients: dict[int, FdClient], error: str) -> None:
    """After a failure: tell every importer (connected or not) that no more fds come,
    so none waits for them until its deadline. Best effort, a second at most each."""
    for r in run.importers:
        c = clients.pop(r, None)
        if c is None:
            try:
                c = FdClient(run.rank, r, recs[r]["addr"], time.monotonic() + 1.0)
            except OSError:
                continue
        c.finish(error)
    clients.clear()


def _rank_of(chan: _Channel, slot: int) -> int:
    for r, s in chan.slot_of.items():
        if s == slot:
            return r
    return slot


def _failed(votes: Sequence[dict[str, Any] | None]) -> list[list[Any]]:
    """``[rank, first error, peer]`` of every rank that voted failed; ``peer`` is the
    rank whose failure stopped it (None: its own step failed)."""
    return [[int(v["rank"]), str(v.get("error")), v.get("peer")]
            for v in votes if v and not v["ready"]]


def _abort_decision(reason: str, failed: Sequence[Sequence[Any]] | Mapping[int, str],
                    missing: Sequence[int]) -> dict[str, Any]:
    rows = ([[r, t, None] for r, t in failed.items()] if isinstance(failed, Mapping)
            else [list(x) for x in failed])
    return {"decision": "abort", "reason": reason, "failed": sorted(rows, key=lambda x: x[0]),
            "missing": sorted(missing)}


def _failed_of(decision: Mapping[str, Any]) -> dict[int, str]:
    """rank -> first error, ranks whose own step failed first (the root causes)."""
    rows = sorted(decision.get("failed", []), key=lambda x: (x[2] is not None, x[0]))
    return {int(r): str(t) for r, t, _ in rows}


def _failed_parts(failed: Mapping[int, str]) -> list[str]:
    """"rank r failed: text" per failed rank, ranks with the same text in one part
    ("ranks 0..15 failed: text"), in the order of each text's first rank (root causes
    first, as :func:`_failed_of` orders them). Why: a limit every rank hits (the fd
    limit) made each of 16 ranks' messages repeat one reason 16 times (about 2.4 KB)."""
    by_text: dict[str, list[int]] = {}
    for r, t in failed.items():
        by_text.setdefault(t, []).append(r)
    return [f"{_ranks_text(rs)} failed: {t}" for t, rs in by_text.items()]


def _ranks_text(ranks: Sequence[int]) -> str:
    """``rank 3``, ``ranks 0..15`` (consecutive) or ``ranks 1, 4, 6``."""
    rs = sorted(ranks)
    if len(rs) == 1:
        return f"rank {rs[0]}"
    if rs == list(range(rs[0], rs[-1] + 1)):
        return f"ranks {rs[0]}..{rs[-1]}"
    return "ranks " + ", ".join(map(str, rs))


def _missing_reason(chan: _Channel, missing: Sequence[int], dead: Sequence[int],
                    timeout_s: float) -> str:
    parts = []
    for s in missing:
        r = _rank_of(chan, s)
        if s in dead:
            parts.append(f"rank {r} died (pid {chan.pids[s]} is gone)")
        else:
            parts.append(f"rank {r} did not answer within {timeout_s:g} s")
    return "; ".join(parts)


def _abandoned_error(rank: int, decision: Mapping[str, Any]) -> GroupError:
    failed = _failed_of(decision)
    return GroupError(f"the group aborted before start-up: {decision.get('reason')}; nothing "
                      "was created", rank=rank, failed=failed,
                      missing=list(decision.get("missing", [])))


def _abort(run: _GroupRun, txn: Transaction, decision: Mapping[str, Any],
           fail: _StepFailed | None, owns: bool) -> None:
    """Unwind this process (imports first, then own objects LIFO, then the VA) and raise
    the GroupError that names every failed and missing rank."""
    driver: Driver | None = run.driver   # None: the set-up could not open it
    live_before = driver.live().as_dict() if driver is not None else LiveCounts().as_dict()
    run.phase = "Aborting"
    run._group("Abort")
    errors = txn.rollback()
    if not errors:
        run.phase = "Aborted"
        run._group("AbortComplete")
    run.write_header()
    run.trace.close()
    free_after: dict[int, int] = {}
    query_error: DriverError | None = None
    try:
        if driver is not None:
            free_after = {run.device: driver.free_memory(run.device)[0]}
    except DriverError as e:
        # a query, not an undo (was counted as "1 undo(s) failed" when the device itself
        # was bad, e.g. allocate_rank(device=99))
        query_error = e
    live_after = driver.live() if driver is not None else LiveCounts()
    if owns and driver is not None:
        driver.close()
    failed = _failed_of(decision)
    missing = list(decision.get("missing", []))
    parts = _failed_parts(failed)
    if missing:
        parts.append(str(decision.get("reason")))
    after = "nothing left" if live_after.is_empty() else ", ".join(
        f"{k}={v}" for k, v in live_after.as_dict().items())
    msg = (f"the group of {run.g.topology.ranks} processes aborted; nothing was published: "
           + "; ".join(parts) + f". This process (rank {run.rank}, device {run.device}) "
           f"unwound: {after}")
    if errors:
        msg += f"; {len(errors)} undo(s) failed, first: {errors[0]}"
    if query_error is not None:
        msg += f"; the free-memory query after the unwinding failed: {query_error}"
    if run.trace.error is not None:
        msg += f"; the trace is incomplete: writing it failed: {run.trace.error}"
    cause = fail.cause if fail is not None else None
    err = GroupError(msg, rank=run.rank, device=run.device, failed=failed, missing=missing,
                     cause=cause, call=fail.call if fail else None,
                     result_name=fail.result if fail else None, live=live_before,
                     free_after=free_after, cleanup_errors=errors,
                     peer=fail.peer if fail else None)
    err._kvgrant_unwound = True  # type: ignore[attr-defined]
    raise err
