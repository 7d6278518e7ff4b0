"""The kvgrant exception tree.

Every error kvgrant raises derives from :class:`KVGrantError`, so callers can
catch one class; the leaves say which part failed, never the message text::

    KVGrantError
    ├── ArgumentError          an argument of a public entry point is not accepted
    ├── GeometryError          a geometry file breaks a rule (field, value, rule)
    ├── ContractError          a physical plan breaks the layout contract
    ├── PlanError              no plan can be made (e.g. capacity does not fit)
    │   └── HandleBudgetError  pre-flight: driver-handle demand exceeds the budget
    ├── DriverError            a VMM driver call failed (call, CUresult, device, VA range)
    │   └── BackendUnavailable the requested backend cannot run here (no GPU, no driver)
    ├── AllocationError        a multi-rank allocation failed and was unwound
    ├── ReleasedError          a released cache was used (its addresses are gone)
    ├── TraceError             a trace file is malformed (line number)
    └── ToolError              an external tool (Java, TLC) is missing or failed
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
    "HandleBudgetError",
    "KVGrantError",
    "PlanError",
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


class HandleBudgetError(PlanError):
    """Pre-flight refusal: the plan's driver-handle demand exceeds the per-process budget."""

    def __init__(self, message: str, *, demand: int, budget: int,
                 contributors: list[tuple[str, int]] | None = None) -> None:
        super().__init__(message)
        self.demand = demand
        self.budget = budget
        self.contributors = list(contributors or [])


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


class ReleasedError(KVGrantError):
    """A released cache was used: its VAs are unmapped (on CUDA, dangling pointers)."""


class TraceError(KVGrantError, ValueError):
    """A trace file is malformed; ``line`` is its 1-based line number."""

    def __init__(self, message: str, *, line: int | None = None) -> None:
        super().__init__(message)
        self.line = line


class ToolError(KVGrantError):
    """An external tool (Java, TLC) is missing or failed to run."""
