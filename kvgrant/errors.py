"""The kvgrant exception tree.

Every error kvgrant raises derives from :class:`KVGrantError`, so callers can
catch one class; the leaves say which part failed, never the message text::

    KVGrantError
    ├── ArgumentError          an argument of a public entry point is not accepted
    ├── GeometryError          a geometry file breaks a rule (field, value, rule)
    ├── ContractError          a physical plan breaks the layout contract
    ├── PlanError              no plan can be made (e.g. capacity does not fit)
    │   ├── HandleBudgetError  pre-flight: driver-handle demand exceeds the budget
    │   ├── PlanFileError      a plan file is malformed or does not fit the geometry
    │   └── PlanCacheTimeout   another process kept the host's plan-cache entry locked
    ├── DriverError            a VMM driver call failed (call, CUresult, device, VA range)
    │   └── BackendUnavailable the requested backend cannot run here (no GPU, no driver)
    ├── AllocationError        a multi-rank allocation failed and was unwound
    │   └── GroupError         a group of processes (one rank each) did not publish
    ├── ReleasedError          a released cache was used (its addresses are gone)
    ├── TraceError             a trace file is malformed (line number)
    ├── ToolError              an external tool (Java, TLC) is missing or failed
    └── LedgerError            the host ledger (or simulated host pool) file is unusable
        ├── NotALedger         the path names another program's JSON file (not repaired)
        └── LedgerLockTimeout  its lock stayed held (``holder_pid`` names the holder)
"""

from __future__ import annotations

from typing import Any

__all__ = [
    "AllocationError",
    "ArgumentError",
    "BackendUnavailable",
    "ContractError",
    "DriverError",
    "GeometryError",
    "GroupError",
    "HandleBudgetError",
    "KVGrantError",
    "LedgerError",
    "LedgerLockTimeout",
    "NotALedger",
    "PlanCacheTimeout",
    "PlanError",
    "PlanFileError",
    "ReleasedError",
    "ToolError",
    "TraceError",
]


class KVGrantError(Exception):
    """Base class of every kvgrant error."""


class ArgumentError(KVGrantError, ValueError):
    """An argument of a public function (or a command-line option) is not accepted;
    the message names the argument, the value and what is accepted."""

    def __init__(self, message: str, *, argument: str, value: Any = None) -> None:
        super().__init__(message)
        self.argument = argument
        self.value = value


class GeometryError(KVGrantError, ValueError):
    """A geometry file breaks a rule; the message names the field, value and rule."""

    def __init__(self, message: str, *, field: str | None = None, value: Any = None) -> None:
        super().__init__(message)
        self.field = field
        self.value = value


class ContractError(KVGrantError):
    """A physical plan breaks the layout contract; ``violations`` lists each point."""

    def __init__(self, message: str, *, violations: list[Any] | None = None) -> None:
        super().__init__(message)
        self.violations = list(violations or [])


class PlanError(KVGrantError):
    """No physical plan can be made for the request."""


class PlanCacheTimeout(PlanError):
    """The lock of a host plan-cache entry (runtime/plancache.py) stayed held past the
    wait limit (another process kept planning the layout). ``path`` is the entry,
    ``lock_path`` its lock, ``holder_pid`` the holder when known (else None), ``holder``
    what its lock record says (pid, host, geometry, geometry_hash, since; None when it
    has none), ``waited_s`` how long this process waited and ``wait_s`` its limit. A
    :class:`PlanError`: no plan was made (exit status 1 in the CLI)."""

    def __init__(self, message: str, *, path: str, lock_path: str, holder_pid: int | None,
                 holder: dict[str, Any] | None, waited_s: float, wait_s: float) -> None:
        super().__init__(message)
        self.path = path
        self.lock_path = lock_path
        self.holder_pid = holder_pid
        self.holder = holder
        self.waited_s = waited_s
        self.wait_s = wait_s


class PlanFileError(PlanError, ValueError):
    """A plan file (``kvgrant alloc --plan FILE``, the host's plan cache) is unreadable,
    malformed, made for another layout or breaks its layout contract: bad input, like
    a malformed geometry. The message names the file, the field, the value and the
    rule; ``path``, ``field`` and ``value`` hold them. A :class:`PlanError`, so code
    that caught plan-file errors as PlanError still does."""

    def __init__(self, message: str, *, path: str | None = None, field: str | None = None,
                 value: Any = None) -> None:
        super().__init__(message)
        self.path = path
        self.field = field
        self.value = value
        self.violations: list[Any] = []  # contract violations, when the plan breaks it


class HandleBudgetError(PlanError):
    """Pre-flight refusal: the plan's driver-handle demand, with what other holders on
    the host already reserved and the reserve for users kvgrant cannot see, exceeds the
    host's budget (one pool per host, shared by every process and GPU).

    ``holders`` lists the other ledger holders (dicts with pid, geometry, handles, ...);
    ``held`` is their sum.
    """

    def __init__(self, message: str, *, demand: int, budget: int,
                 contributors: list[tuple[str, int]] | None = None, reserve: int = 0,
                 held: int = 0, holders: list[dict[str, Any]] | None = None) -> None:
        super().__init__(message)
        self.demand = demand
        self.budget = budget
        self.contributors = list(contributors or [])
        self.reserve = reserve
        self.held = held
        self.holders = list(holders or [])

    @property
    def overdraw(self) -> int:
        """Handles beyond the budget: held + demand + reserve - budget."""
        return self.held + self.demand + self.reserve - self.budget


class DriverError(KVGrantError):
    """A driver call failed.

    The message reads ``"CUDA_ERROR_NAME: explanation"``; the raw result and the
    context live in keyword attributes so callers never parse text.
    """

    def __init__(self, message: str, *, call: str, result: int, result_name: str,
                 device: int | None = None, va: int | None = None,
                 size: int | None = None) -> None:
        super().__init__(message)
        self.call = call
        self.result = result
        self.result_name = result_name
        self.device = device
        self.va = va
        self.size = size
        self.rank: int | None = None
        self.target: str | None = None

    def locate(self, rank: int, target: str | None = None) -> "DriverError":
        """Say which rank's call this was and what it acted on (``target``: the plane or
        region bytes of the allocation, e.g. ``plane 'kv' bytes [0x0, 0x200000)``), where
        the raiser knows; returns ``self``. Why: an undo's failure (a ``cuMemRelease`` of
        the release) named neither, since a handle has no virtual address."""
        self.rank, self.target = rank, target
        return self

    def headline(self, rank: int | None = None) -> str:
        """``cuMemRelease failed with CUDA_ERROR_X on rank R (device D, va ..., plane
        'kv' bytes [...)): message``: the call, rank, device, byte range and CUresult
        (``rank`` when the error does not know its own)."""
        who = self.rank if self.rank is not None else "?" if rank is None else rank
        where = "" if self.va is None else f", va 0x{self.va:x}+0x{self.size or 0:x}"
        if self.target is not None:
            where += f", {self.target}"
        return (f"{self.call} failed with {self.result_name} on rank {who} (device "
                f"{self.device}{where}): {super().__str__()}")

    def __str__(self) -> str:
        """The driver's message; once :meth:`locate` said the rank, the headline. Why:
        ``Published.release()`` raises an undo's error as it is, and a library caller
        printing it saw neither the rank nor the bytes (only the CLI said them)."""
        return self.headline() if self.rank is not None else super().__str__()


class BackendUnavailable(DriverError):
    """The requested backend cannot run on this machine."""


class AllocationError(KVGrantError):
    """A multi-rank allocation failed; every rank was unwound and nothing published.

    ``cause`` is the first error; ``cleanup_errors`` holds undo failures, which never
    hide the first error.
    """

    def __init__(self, message: str, *, cause: BaseException | None = None,
                 rank: int | None = None, device: int | None = None,
                 call: str | None = None, result_name: str | None = None,
                 target: str | None = None, byte_range: tuple[int, int] | None = None,
                 live: dict[str, int] | None = None,
                 free_before: dict[int, int] | None = None,
                 free_after: dict[int, int] | None = None,
                 cleanup_errors: list[BaseException] | None = None) -> None:
        super().__init__(message)
        self.cause = cause
        self.rank = rank
        self.device = device
        self.call = call
        self.result_name = result_name
        self.target = target
        self.byte_range = byte_range
        self.live = dict(live or {})
        self.free_before = dict(free_before or {})
        self.free_after = dict(free_after or {})
        self.cleanup_errors = list(cleanup_errors or [])


class GroupError(AllocationError):
    """A group of processes, one rank each, aborted together (or could not start).

    ``rank`` is the process that raises; ``failed`` maps each rank that voted failed to
    its first error; ``missing`` lists the ranks that died or did not answer before the
    deadline; ``peer`` is the other rank a step was waiting on, if any.
    """

    def __init__(self, message: str, *, rank: int | None = None, peer: int | None = None,
                 failed: dict[int, str] | None = None, missing: list[int] | None = None,
                 **kwargs: Any) -> None:
        super().__init__(message, rank=rank, **kwargs)
        self.peer = peer
        self.failed = dict(failed or {})
        self.missing = list(missing or [])


class ReleasedError(KVGrantError):
    """A released cache was used: its VAs are unmapped (on CUDA, dangling pointers)."""


class TraceError(KVGrantError, ValueError):
    """A trace file is malformed; ``line`` is its 1-based line number."""

    def __init__(self, message: str, *, line: int | None = None) -> None:
        super().__init__(message)
        self.line = line


class ToolError(KVGrantError):
    """An external tool (Java, TLC) is missing or failed to run."""


class LedgerError(KVGrantError):
    """The host ledger (or the simulated host pool) cannot be used: garbage, truncated,
    written by a newer kvgrant, another host's, or not writable. ``path`` is the file;
    nothing was reserved."""

    def __init__(self, message: str, *, path: str | None = None) -> None:
        super().__init__(message)
        self.path = path


class NotALedger(LedgerError):
    """The ledger path names another program's file: a JSON document (or a JSON first
    line, as a trace's header) that is not a kvgrant ledger. Unlike a garbage or
    truncated ledger it is neither used nor repaired (``--repair`` would move someone's
    file aside), so the remedy is another path."""


class LedgerLockTimeout(LedgerError):
    """The ledger's lock stayed held past the timeout; ``holder_pid`` is the process
    holding it when it could be found (else None)."""

    def __init__(self, message: str, *, path: str | None = None,
                 holder_pid: int | None = None, waited_s: float = 0.0) -> None:
        super().__init__(message, path=path)
        self.holder_pid = holder_pid
        self.waited_s = waited_s
