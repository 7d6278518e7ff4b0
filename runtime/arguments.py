"""Argument checks of the public runtime entry points (:func:`allocate`, views).

Why a module of its own: a wrong type must reach the user as an
:class:`~kvgrant.errors.ArgumentError` naming the argument, the value and what is
accepted -- not as a ``TypeError`` from pathlib or ``list index out of range`` from
deep inside -- and some wrong values were silently accepted (``devices="012"``,
``preflight="no"`` taken as true, ``trace=123`` losing the trace). Keeping every such
rule here leaves the allocator's code about allocating.
"""

from __future__ import annotations

import io
import os
from typing import Any, Callable, Mapping, Sequence

from kvgrant.errors import ArgumentError

__all__ = [
    "MAX_DEVICE_ORDINAL",
    "TRACE_ERRORS",
    "check_allocate_args",
    "check_devices",
    "check_index",
    "check_name",
    "checked_planner",
    "same_file",
    "show",
]

#: Largest CUDA ordinal accepted (the sim builds a table up to the largest one;
#: ``--devices=0,1,100000000`` was killed at 21.7 GB).
MAX_DEVICE_ORDINAL = 1023
#: ``allocate(trace_errors=...)``: a trace that cannot be written raises, unless the
#: caller asked to continue without it.
TRACE_ERRORS = ("raise", "continue")
_BACKENDS = ("auto", "sim", "cuda")
_DRIVER_METHODS = ("device_count", "granularity", "free_memory", "reserve", "create", "map",
                   "set_access", "unmap", "release", "free_address", "live")


def show(value: Any) -> str:
    """A short printable form of a user value (never the whole of a huge one)."""
    from kvgrant.layout.validate import show_value

    if isinstance(value, (bool, int, float, str)) or value is None:
        return show_value(value)
    text = repr(value)
    if len(text) > 80:
        text = text[:76] + " ..."
    return f"{text} ({type(value).__name__})"


def _fail(argument: str, value: Any, accepted: str) -> ArgumentError:
    return ArgumentError(f"{argument} = {show(value)}: {accepted}", argument=argument,
                         value=value)


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_path(value: Any) -> bool:
    return isinstance(value, (str, os.PathLike)) and not isinstance(value, bytes)


def check_devices(devices: Any, argument: str = "devices") -> list[int] | None:
    """``None`` or a sequence of CUDA ordinals 0..MAX_DEVICE_ORDINAL (ints, not bools,
    floats or a string of digits), as a list."""
    if devices is None:
        return None
    if isinstance(devices, (str, bytes, Mapping)) or not isinstance(devices, Sequence):
        raise _fail(argument, devices, "must be a list of CUDA ordinals, one per rank "
                                       "(e.g. [0, 1])")
    out: list[int] = []
    for i, d in enumerate(devices):
        if not _is_int(d) or not 0 <= d <= MAX_DEVICE_ORDINAL:
            raise _fail(f"{argument}[{i}]", d,
                        f"must be an integer CUDA ordinal in 0..{MAX_DEVICE_ORDINAL}")
        out.append(d)
    return out


def _check_trace(trace: Any) -> None:
    from kvgrant.runtime.trace import TraceWriter

    if trace is None or isinstance(trace, TraceWriter):
        return
    if _is_path(trace):
        if "\0" in os.fspath(trace):
            raise _fail("trace", trace, "a file path must not contain a NUL character")
        if not os.fspath(trace):
            raise _fail("trace", trace, "must be a file path, not an empty string")
        return
    binary = isinstance(trace, (io.RawIOBase, io.BufferedIOBase)) or \
        "b" in str(getattr(trace, "mode", ""))
    if binary or not callable(getattr(trace, "write", None)):
        raise _fail("trace", trace, "must be None, a file path, a text stream (opened "
                                    "with 'w', not 'wb') or a TraceWriter")


#: Options each backend's constructor takes (``allocate`` adds ``devices`` for sim).
_OPTIONS = {"sim": ("devices", "memory_per_device", "granularity", "handle_budget", "faults",
                    "used_by_others", "host_pool"),
            # the sim-only handle_budget and host_pool are dropped for cuda (the real
            # driver's budget and pool are the host's)
            "cuda": ("faults", "handle_budget", "host_pool")}


def _check_driver_options(options: Any, backend: Any) -> None:
    """A mapping of known option names; ``faults`` must read as a FaultPlan (a typo in
    a name reached the user as a TypeError from the constructor)."""
    if not isinstance(options, Mapping):
        raise _fail("driver_options", options, "must be None or a mapping of option "
                                               "name -> value")
    known = set(_OPTIONS["sim"]) if backend == "sim" else \
        set(_OPTIONS["cuda"]) if backend == "cuda" else set(_OPTIONS["sim"]) | set(_OPTIONS["cuda"])
    for key in options:
        if not isinstance(key, str) or key not in known:
            raise _fail("driver_options key", key,
                        f"must be one of {', '.join(sorted(known))} for backend {backend!r}")
    if options.get("faults") is not None:
        from kvgrant.runtime.faults import Fault, FaultPlan

        faults = options["faults"]
        if not isinstance(faults, (Fault, FaultPlan, list, tuple)):
            raise _fail("driver_options['faults']", faults,
                        "must be a Fault, a FaultPlan or a list of them")
        try:
            FaultPlan.coerce(options["faults"])  # type: ignore[arg-type]
        except (TypeError, ValueError) as err:
            raise _fail("driver_options['faults']", options["faults"],
                        f"must be a Fault, a FaultPlan or a list of them ({err})") from None


def same_file(a: Any, b: Any) -> bool:
    """True when two paths name one existing file (same inode), e.g. a trace path that
    is the geometry file it would overwrite."""
    if not (_is_path(a) and _is_path(b)):
        return False
    try:
        return os.path.samefile(a, b)
    except (OSError, ValueError):
        return False


def check_allocate_args(geometry: Any, *, plan: Any, driver: Any, backend: Any,
                        devices: Any, memory_limit: Any, handle_budget: Any, preflight: Any,
                        handle_reserve: Any, ledger: Any, check_contract: Any, trace: Any,
                        driver_options: Any, trace_errors: Any
                        ) -> tuple[list[int] | None, Any]:
    """Check every argument of :func:`~kvgrant.runtime.allocator.allocate` before any
    work; returns ``devices`` as a list (or None) and ``plan`` (a planner callable
    wrapped so its result is checked).

    Raises
    ------
    ArgumentError
        The first argument that is not accepted, with its value and the accepted forms.
    """
    from kvgrant.layout.geometry import Geometry
    from kvgrant.layout.plan import PhysicalPlan

    if not isinstance(geometry, Geometry):
        if not _is_path(geometry):
            raise _fail("geometry", geometry, "must be a Geometry or the path of a geometry "
                                              "JSON file")
        if not os.fspath(geometry) or "\0" in os.fspath(geometry):
            raise _fail("geometry", geometry, "must be a file path (non-empty, no NUL)")
    if isinstance(plan, str):
        from kvgrant.layout.plans import PLAN_LABELS

        if plan not in PLAN_LABELS:
            raise _fail("plan", plan, f"must be one of {', '.join(PLAN_LABELS)}, a "
                                      "PhysicalPlan or a planner callable")
    elif not isinstance(plan, PhysicalPlan) and not callable(plan):
        raise _fail("plan", plan, "must be a plan label, a PhysicalPlan or a planner "
                                  "callable geometry -> PhysicalPlan")
    if driver is not None:
        missing = [m for m in _DRIVER_METHODS if not callable(getattr(driver, m, None))]
        if missing:
            raise _fail("driver", driver, f"must be an open Driver (it lacks {missing[0]}); "
                                          "or pass backend= instead")
    if not isinstance(backend, str) or backend not in _BACKENDS:
        raise _fail("backend", backend, f"must be one of {', '.join(_BACKENDS)}")
    devs = check_devices(devices)
    if isinstance(memory_limit, bool) or (
            memory_limit is not None and not isinstance(memory_limit, (str, int))):
        from kvgrant.runtime.capacity import MemoryLimit

        if not isinstance(memory_limit, MemoryLimit):
            raise _fail("memory_limit", memory_limit, "must be None, a size such as '-1G' or "
                                                      "'40G', a byte count or a MemoryLimit")
    if handle_budget is not None and (not _is_int(handle_budget) or handle_budget < 0):
        raise _fail("handle_budget", handle_budget, "must be None or an integer >= 0")
    if handle_reserve is not None and (not _is_int(handle_reserve) or handle_reserve < 0):
        raise _fail("handle_reserve", handle_reserve, "must be None or an integer >= 0")
    if ledger is not None and not isinstance(ledger, bool):
        from kvgrant.runtime.ledger import HostLedger

        if not isinstance(ledger, HostLedger) and not _is_path(ledger):
            raise _fail("ledger", ledger, "must be None, True, False, a HostLedger or the "
                                          "path of a ledger file")
    for name, value in (("preflight", preflight), ("check_contract", check_contract)):
        if not isinstance(value, bool):
            raise _fail(name, value, "must be True or False")
    _check_trace(trace)
    if driver_options is not None:
        _check_driver_options(driver_options, backend)
    if not isinstance(trace_errors, str) or trace_errors not in TRACE_ERRORS:
        raise _fail("trace_errors", trace_errors, "must be 'raise' (a trace that cannot be "
                                                  "written is an error) or 'continue'")
    if same_file(geometry, trace):
        raise _fail("trace", trace, f"is the geometry file {show(os.fspath(geometry))}; "
                                    "writing the trace there would overwrite it")
    if callable(plan) and not isinstance(plan, (str, PhysicalPlan)):
        plan = checked_planner(plan)
    return devs, plan


def checked_planner(planner: Callable[[Any], Any]) -> Callable[[Any], Any]:
    """Wrap a planner callable so that what it returns is checked to be a
    PhysicalPlan (a planner returning None failed deep inside the contract check)."""
    from kvgrant.layout.plan import PhysicalPlan

    def run(g: Any) -> Any:
        result = planner(g)
        if not isinstance(result, PhysicalPlan):
            raise _fail("plan", planner, f"a planner must return a PhysicalPlan; it "
                                         f"returned {show(result)}")
        return result
    return run


def check_name(argument: str, value: Any, names: Sequence[str]) -> str:
    """``value`` must be one of ``names`` (a plane or region of the geometry)."""
    if not isinstance(value, str) or value not in names:
        shown = ", ".join(repr(n) for n in list(names)[:8])
        more = f" and {len(names) - 8} more" if len(names) > 8 else ""
        raise _fail(argument, value, f"must be one of {shown}{more}")
    return value


def check_index(argument: str, value: Any, size: int, what: str) -> int:
    """``value`` must be an int in ``0..size-1`` (a rank, row or page)."""
    if not _is_int(value) or not 0 <= value < size:
        raise _fail(argument, value, f"must be an integer {what} in 0..{size - 1}")
    return value
