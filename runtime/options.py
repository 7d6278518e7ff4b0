"""The grouped options of :func:`~kvgrant.runtime.allocate` and
:func:`~kvgrant.runtime.allocate_rank`.

Why: the flat keyword list mixed the few arguments every caller sets (plan, devices,
memory limit) with three groups that are set together or not at all: the host's
driver-handle budget (:class:`HandleBudget`), the trace (:class:`TraceOptions`) and the
driver (:class:`Backend`). Each object checks its fields when it is made, so a wrong
value is named where it was written. The flat keywords of earlier versions stay as
shorthands (:class:`Shorthands`); :func:`group_options` maps them onto the objects,
with no warning, and refuses a shorthand given together with the object that holds it.
"""

from __future__ import annotations

import inspect
import os
from dataclasses import KW_ONLY, dataclass, field
from types import MappingProxyType
from typing import IO, TYPE_CHECKING, Any, Callable, Mapping, NamedTuple, NoReturn, TypedDict

from kvgrant.errors import ArgumentError
from kvgrant.runtime.arguments import (
    check_backend_name,
    check_count,
    check_driver,
    check_driver_options,
    check_flag,
    check_ledger,
    check_trace_errors,
    check_trace_target,
    driver_gap,
    fail,
    show,
)

if TYPE_CHECKING:
    from kvgrant.runtime.driver import Driver
    from kvgrant.runtime.ledger import HostLedger
    from kvgrant.runtime.trace import TraceWriter

__all__ = ["Backend", "Grouped", "HandleBudget", "MAX_HANDLES", "RankShorthands", "Shorthands",
           "TraceOptions", "group_options"]

#: Largest ``HandleBudget.handles`` / ``reserve``: the cap the CLI puts on its counts
#: (kvgrant.commands._args.MAX_COUNT); no driver has a pool near it, and a larger value
#: (``handles=2**200``) is a typo that pre-flight and the ledger would carry on.
MAX_HANDLES = 10**15


@dataclass(frozen=True, kw_only=True)
class HandleBudget:
    """The host's one pool of driver handles: its size, what to leave to others, whether
    to refuse before overdrawing it, and the ledger that shares it between processes."""

    #: the host's driver-handle budget (None: ``DEFAULT_HANDLE_BUDGET``, 523,880)
    handles: int | None = None
    #: handles kept for users kvgrant cannot see (None: ``DEFAULT_HANDLE_RESERVE``, 4,096)
    reserve: int | None = None
    #: refuse, before any driver call, a demand that overdraws the budget (False: the
    #: field failure, reproduced; the ledger lease is still recorded)
    preflight: bool = True
    #: HostLedger or its path; None: the default ledger for cuda (sim: only with
    #: ``KVGRANT_LEDGER`` set); True: the default ledger; False: none
    ledger: "HostLedger | str | os.PathLike[str] | bool | None" = None

    def __post_init__(self) -> None:
        for name in ("handles", "reserve"):
            value = check_count(f"HandleBudget.{name}", getattr(self, name))
            object.__setattr__(self, name, value)  # a numpy integer as a Python int
            if value is not None and value > MAX_HANDLES:
                raise fail(f"HandleBudget.{name}", value,
                           f"must be at most {MAX_HANDLES:,} (10**15, the cap on the CLI's "
                           "counts)")
        check_flag("HandleBudget.preflight", self.preflight)
        check_ledger("HandleBudget.ledger", self.ledger)

    def limits(self) -> tuple[int, int]:
        """(budget, reserve), kvgrant's defaults where a field is None."""
        from kvgrant.layout.preflight import DEFAULT_HANDLE_BUDGET, DEFAULT_HANDLE_RESERVE

        return (DEFAULT_HANDLE_BUDGET if self.handles is None else self.handles,
                DEFAULT_HANDLE_RESERVE if self.reserve is None else self.reserve)


@dataclass(frozen=True)
class TraceOptions:
    """Where the trace goes and whether losing it fails the call: the trace is the
    evidence the conformance check reads, so the caller decides both together."""

    #: a path, a text stream or a TraceWriter; None reads ``KVGRANT_TRACE``
    target: "str | os.PathLike[str] | IO[str] | TraceWriter | None" = None
    _: KW_ONLY
    #: "raise": release and raise TraceError; "continue": keep the cache, the error in
    #: ``trace_error``; None: the call's default ("raise" for allocate, "continue" for
    #: allocate_rank, which never releases one rank of a published group for its trace)
    errors: str | None = None
    #: let a path ``target`` overwrite an existing file that is not a kvgrant trace (the
    #: CLI's ``--force``); else such a file is refused before any work, since writing
    #: the trace would destroy it. A trace, or an empty file, is overwritten either way
    overwrite: bool = False

    def __post_init__(self) -> None:
        check_trace_target("TraceOptions.target", self.target)
        if self.errors is not None:
            check_trace_errors("TraceOptions.errors", self.errors)
        check_flag("TraceOptions.overwrite", self.overwrite)


@dataclass(frozen=True)
class Backend:
    """A driver backend to open, with the options of its driver: the options mean
    something only for the backend they name, so they travel with the name."""

    #: "auto" (cuda when every rank has a usable GPU, else sim), "sim" or "cuda"
    name: str = "auto"
    #: keywords of the driver's constructor (None: none) (sim: devices, memory_per_device,
    #: granularity, handle_budget, faults, used_by_others, host_pool; cuda: faults)
    options: Mapping[str, Any] | None = field(default_factory=dict, hash=False)

    def __post_init__(self) -> None:
        check_backend_name("Backend.name", self.name)
        options = {} if self.options is None else self.options
        check_driver_options("Backend.options", options, self.name)
        object.__setattr__(self, "options", MappingProxyType(dict(options)))


class RankShorthands(TypedDict, total=False):
    """The flat keywords of earlier versions of ``allocate_rank`` (see Shorthands)."""

    handle_budget: int | None            # budget=HandleBudget(handles=...)
    handle_reserve: int | None           # budget=HandleBudget(reserve=...)
    preflight: bool                      # budget=HandleBudget(preflight=...)
    ledger: "HostLedger | str | os.PathLike[str] | bool | None"  # HandleBudget(ledger=)
    driver: "Driver | None"              # backend=<the open driver>
    driver_options: Mapping[str, Any] | None  # backend=Backend(name, options)


class Shorthands(RankShorthands, total=False):
    """The flat keywords of earlier versions of ``allocate``, kept working as they were."""

    trace_errors: str                    # trace=TraceOptions(target, errors=...)


#: shorthand -> (the grouped parameter that holds it, the grouped form)
_MAPS_TO = {"handle_budget": ("budget", "budget=HandleBudget(handles=...)"),
            "handle_reserve": ("budget", "budget=HandleBudget(reserve=...)"),
            "preflight": ("budget", "budget=HandleBudget(preflight=...)"),
            "ledger": ("budget", "budget=HandleBudget(ledger=...)"),
            "trace_errors": ("trace", "trace=TraceOptions(target, errors=...)"),
            "driver": ("backend", "backend=<the open driver>"),
            "driver_options": ("backend", "backend=Backend(name, options)")}


class Grouped(NamedTuple):
    """The grouped options of one call, shorthands mapped in."""

    budget: HandleBudget
    trace: TraceOptions
    backend: "Backend | Driver"   # a Backend to open, or an open driver (left open)


def group_options(entry: Callable[..., Any], shorthands: Mapping[str, Any], *,
                  budget: Any, trace: Any, backend: Any,
                  accepted: frozenset[str] = frozenset(Shorthands.__annotations__)
                  ) -> Grouped:
    """Check ``budget``, ``trace`` and ``backend`` as given to ``entry`` and map the
    ``shorthands`` (keyword -> value) onto them.

    A shorthand counts as given unless it is None. Each is checked under its own name
    first, so its errors read as they always did.

    Raises
    ------
    ArgumentError
        A keyword ``entry`` does not take (the accepted ones listed), a bad value, or a
        shorthand given together with the grouped object that holds it (both named).
    """
    for key, value in shorthands.items():
        if key not in accepted:
            raise fail(key, value, f"not a keyword of {entry.__name__}(); it takes "
                                   f"{', '.join(_keywords(entry))} (and the shorthands "
                                   f"{', '.join(sorted(accepted))})")
    checks = {"handle_budget": check_count, "handle_reserve": check_count,
              "preflight": check_flag, "ledger": check_ledger,
              "trace_errors": check_trace_errors, "driver": check_driver}
    for key, check in checks.items():
        if key in shorthands:
            check(key, shorthands[key])
    given = {k: v for k, v in shorthands.items() if v is not None}
    return Grouped(_budget(budget, given), _trace(trace, given),
                   _backend(backend, given))


def _keywords(entry: Callable[..., Any]) -> list[str]:
    params = inspect.signature(entry).parameters.values()
    return [p.name for p in params if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)]


def _conflict(key: str, value: Any, obj: Any) -> NoReturn:
    """Refuse shorthand ``key`` given with the grouped object ``obj`` that holds it."""
    param, form = _MAPS_TO[key]
    raise ArgumentError(
        f"{key} = {show(value)} and {param} = {show(obj)} were both given: {key} is a "
        f"shorthand for {form}; pass one of them", argument=key, value=value)


def _budget(budget: Any, given: Mapping[str, Any]) -> HandleBudget:
    if budget is None:
        return HandleBudget(handles=given.get("handle_budget"),
                            reserve=given.get("handle_reserve"),
                            preflight=given.get("preflight", True),
                            ledger=given.get("ledger"))
    if not isinstance(budget, HandleBudget):
        raise fail("budget", budget, "must be None or a HandleBudget(handles=..., "
                                     "reserve=..., preflight=..., ledger=...)")
    for key in ("handle_budget", "handle_reserve", "preflight", "ledger"):
        if key in given:
            _conflict(key, given[key], budget)
    return budget


def _trace(trace: Any, given: Mapping[str, Any]) -> TraceOptions:
    if isinstance(trace, TraceOptions):
        if "trace_errors" in given:
            _conflict("trace_errors", given["trace_errors"], trace)
        return trace
    check_trace_target("trace", trace)
    return TraceOptions(trace, errors=given.get("trace_errors"))


def _backend(backend: Any, given: Mapping[str, Any]) -> "Backend | Driver":
    if isinstance(backend, str):
        check_backend_name("backend", backend)
        if "driver_options" in given:
            check_driver_options("driver_options", given["driver_options"], backend)
        if "driver" in given:   # as before: an open driver wins over the name
            return given["driver"]  # type: ignore[no-any-return]
        return Backend(backend, given.get("driver_options"))
    if not isinstance(backend, Backend):
        gap = driver_gap(backend)
        if gap is not None:
            raise fail("backend", backend, "must be one of auto, sim, cuda, a Backend(name, "
                                           f"options) or an open Driver ({gap})")
    for key in ("driver", "driver_options"):
        if key in given:
            _conflict(key, given[key], backend)
    return backend  # type: ignore[no-any-return]
