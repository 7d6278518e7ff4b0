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
import operator
import os
import stat
from typing import Any, Callable, Mapping, Sequence

from kvgrant.errors import ArgumentError

#: Values that switch something on or off, never paths: refused where an environment
#: variable names a file (KVGRANT_TRACE=1 once wrote a trace to a file named "1").
SWITCH_WORDS = frozenset({"0", "1", "true", "false", "yes", "no", "on", "off", "y", "n",
                          "none"})


def is_switch_word(raw: str) -> bool:
    """Is ``raw`` a switch word (or blank) rather than a path?"""
    return raw.strip().lower() in SWITCH_WORDS or not raw.strip()

__all__ = [
    "MAX_DEVICE_ORDINAL",
    "TRACE_ERRORS",
    "as_int",
    "check_allocate_args",
    "check_backend_name",
    "check_count",
    "check_devices",
    "check_driver",
    "check_driver_options",
    "check_flag",
    "check_index",
    "check_ledger",
    "check_name",
    "check_plan_arg",
    "check_plan_object",
    "check_trace_errors",
    "check_trace_path",
    "check_trace_target",
    "checked_planner",
    "driver_gap",
    "fail",
    "refuse_overwriting",
    "same_file",
    "show",
]

#: Largest CUDA ordinal accepted (the sim builds a table up to the largest one;
#: ``--devices=0,1,100000000`` was killed at 21.7 GB).
MAX_DEVICE_ORDINAL = 1023
#: ``TraceOptions.errors`` (shorthand ``trace_errors``): a trace that cannot be written
#: raises, unless the caller asked to continue without it.
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


def fail(argument: str, value: Any, accepted: str) -> ArgumentError:
    """The error for ``argument = value``, saying what is accepted."""
    return ArgumentError(f"{argument} = {show(value)}: {accepted}", argument=argument,
                         value=value)


def as_int(value: Any) -> int | None:
    """``value`` as a Python int when it is an integer (an int, or an integer scalar of
    numpy or torch: anything with ``__index__``), else None; never a bool.

    Why: engines take ranks, devices and row indices from numpy arrays and 0-d tensors
    (block tables); ``np.int64(3)`` was refused as "must be an integer"."""
    if isinstance(value, bool) or type(value).__name__ == "bool_":  # numpy's bool too
        return None
    if isinstance(value, int):
        return int(value)
    try:
        return operator.index(value)
    except TypeError:
        return None
    except Exception:  # noqa: BLE001 - a 0-d tensor of floats, a broken __index__
        return None


def _is_int(value: Any) -> bool:
    return as_int(value) is not None


def _is_path(value: Any) -> bool:
    return isinstance(value, (str, os.PathLike)) and not isinstance(value, bytes)


def check_devices(devices: Any, argument: str = "devices") -> list[int] | None:
    """``None`` or a sequence of CUDA ordinals 0..MAX_DEVICE_ORDINAL (ints, not bools,
    floats or a string of digits), as a list."""
    if devices is None:
        return None
    if isinstance(devices, (str, bytes, Mapping)) or not isinstance(devices, Sequence):
        raise fail(argument, devices, "must be a list of CUDA ordinals, one per rank "
                                       "(e.g. [0, 1])")
    out: list[int] = []
    for i, d in enumerate(devices):
        n = as_int(d)
        if n is None or not 0 <= n <= MAX_DEVICE_ORDINAL:
            raise fail(f"{argument}[{i}]", d,
                        f"must be an integer CUDA ordinal in 0..{MAX_DEVICE_ORDINAL}")
        d = n
        if d in out:
            raise fail(argument, list(devices), f"two ranks on one device: {argument}[{i}] = "
                                               f"{d} as {argument}[{out.index(d)}] (one "
                                               "distinct CUDA ordinal per rank)")
        out.append(d)
    return out


def check_count(argument: str, value: Any) -> int | None:
    """``None`` (kvgrant's default) or an integer >= 0 (a handle budget or reserve), as a
    Python int."""
    if value is None:
        return None
    n = as_int(value)
    if n is None or n < 0:
        raise fail(argument, value, "must be None or an integer >= 0")
    return n


def check_flag(argument: str, value: Any) -> None:
    """``True`` or ``False`` exactly (``preflight="no"`` was once taken as true)."""
    if not isinstance(value, bool):
        raise fail(argument, value, "must be True or False")


def check_ledger(argument: str, value: Any) -> None:
    """``None``, ``True``, ``False``, a HostLedger or the path of a ledger file."""
    if value is not None and not isinstance(value, bool):
        from kvgrant.runtime.ledger import HostLedger

        if not isinstance(value, HostLedger) and not _is_path(value):
            raise fail(argument, value, "must be None, True, False, a HostLedger or the "
                                        "path of a ledger file")
        if _is_path(value):  # as the trace's path (an empty one became ".", a folder)
            if not os.fspath(value).strip():
                raise fail(argument, value, "must be the path of a ledger file, not an "
                                            "empty string")
            if "\0" in os.fspath(value):
                raise fail(argument, value, "a file path must not contain a NUL character")


def check_trace_target(argument: str, trace: Any) -> None:
    """``None``, a file path, a text stream or a TraceWriter (``trace=123`` lost the
    trace)."""
    from kvgrant.runtime.trace import TraceWriter

    if trace is None:
        return
    if isinstance(trace, TraceWriter):
        # one writer per allocation: a second run on a used writer wrote nothing (its
        # header slot was taken) and a closed one dropped every line, both silently
        if trace.closed:
            raise fail(argument, trace, "is a closed TraceWriter; pass a new one (or the "
                                        "path: allocate opens and closes it)")
        if trace.used:
            raise fail(argument, trace, "is a TraceWriter that already holds a trace (one "
                                        "writer per allocation); pass a new one")
        return
    if _is_path(trace):
        if "\0" in os.fspath(trace):
            raise fail(argument, trace, "a file path must not contain a NUL character")
        if not os.fspath(trace):
            raise fail(argument, trace, "must be a file path, not an empty string")
        return
    binary = isinstance(trace, (io.RawIOBase, io.BufferedIOBase)) or \
        "b" in str(getattr(trace, "mode", ""))
    if binary or not callable(getattr(trace, "write", None)):
        raise fail(argument, trace, "must be None, a file path, a text stream (opened "
                                    "with 'w', not 'wb') or a TraceWriter")


def check_trace_errors(argument: str, value: Any) -> None:
    """One of :data:`TRACE_ERRORS`."""
    if not isinstance(value, str) or value not in TRACE_ERRORS:
        raise fail(argument, value, "must be 'raise' (a trace that cannot be written is an "
                                    "error) or 'continue'")


def check_backend_name(argument: str, value: Any) -> None:
    """One of ``auto``, ``sim``, ``cuda``."""
    if not isinstance(value, str) or value not in _BACKENDS:
        raise fail(argument, value, f"must be one of {', '.join(_BACKENDS)}")


def driver_gap(value: Any) -> str | None:
    """Why ``value`` is not an open driver (a class, a VMM method it lacks, or a ``name``
    that is not a backend's), or None.

    Why the name: it is the trace header's ``backend``, which ``kvgrant conform``
    takes only as ``sim`` or ``cuda`` (kvgrant.traceformat.TRACE_BACKENDS, as the
    Driver protocol says); a driver of another name wrote traces the checker refuses."""
    from kvgrant.traceformat import TRACE_BACKENDS

    if isinstance(value, type):
        return "it is a class; pass an open instance"
    missing = [m for m in _DRIVER_METHODS if not callable(getattr(value, m, None))]
    if missing:
        return f"it lacks {missing[0]}"
    name = getattr(value, "name", None)
    if not isinstance(name, str) or name not in TRACE_BACKENDS:
        return (f"its name is {show(name)}; a driver's name is "
                + " or ".join(repr(b) for b in TRACE_BACKENDS)
                + ", the backend its traces name")
    return None


def check_driver(argument: str, value: Any) -> None:
    """``None`` or an open driver (every VMM method kvgrant calls)."""
    gap = None if value is None else driver_gap(value)
    if gap is not None:
        raise fail(argument, value, f"must be an open Driver ({gap}); or pass backend= "
                                    "instead")


#: Options each backend's constructor takes (``allocate`` adds ``devices`` for sim).
_OPTIONS = {"sim": ("devices", "memory_per_device", "granularity", "handle_budget", "faults",
                    "used_by_others", "host_pool"),
            # the sim-only handle_budget and host_pool are dropped for cuda (the real
            # driver's budget and pool are the host's)
            "cuda": ("faults", "handle_budget", "host_pool")}


def check_driver_options(argument: str, options: Any, backend: Any) -> None:
    """A mapping of option names ``backend``'s driver takes; ``faults`` must read as a
    FaultPlan (a typo in a name reached the user as a TypeError from the constructor)."""
    if not isinstance(options, Mapping):
        raise fail(argument, options, "must be None or a mapping of option name -> value")
    known = set(_OPTIONS["sim"]) if backend == "sim" else \
        set(_OPTIONS["cuda"]) if backend == "cuda" else set(_OPTIONS["sim"]) | set(_OPTIONS["cuda"])
    for key in options:
        if not isinstance(key, str) or key not in known:
            raise fail(f"{argument} key", key,
                       f"must be one of {', '.join(sorted(known))} for backend {backend!r}")
    if options.get("faults") is not None:
        from kvgrant.runtime.faults import Fault, FaultPlan

        faults = options["faults"]
        if not isinstance(faults, (Fault, FaultPlan, list, tuple)):
            raise fail(f"{argument}['faults']", faults,
                       "must be a Fault, a FaultPlan or a list of them")
        try:
            FaultPlan.coerce(options["faults"])  # type: ignore[arg-type]
        except (TypeError, ValueError) as err:
            raise fail(f"{argument}['faults']", options["faults"],
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


def refuse_fifo(argument: str, trace: Any) -> None:
    """Refuse a trace path that is a FIFO or a socket. Why: opening a FIFO for writing
    waits for a reader, and the trace file is opened once every rank has reserved its
    address range: with no reader, allocate() hung there holding the reservations, and
    Ctrl-C (deferred while kvgrant holds driver objects) needed several presses. A
    stream the caller opened itself (``trace=open(fifo, "w")``) is taken as before."""
    if not _is_path(trace):
        return
    try:
        mode = os.stat(trace).st_mode
    except (OSError, ValueError):
        return  # missing (created later) or unreadable: the writer's open says why
    if stat.S_ISFIFO(mode) or stat.S_ISSOCK(mode):
        kind = "a FIFO" if stat.S_ISFIFO(mode) else "a socket"
        raise ArgumentError(f"{argument} = {os.fspath(trace)!r}: is {kind}; the trace is "
                            "written to a file (opening a FIFO waits for a reader, while "
                            "the ranks hold their reservations): open it yourself and pass "
                            "the stream (trace=open(path, 'w')), or name a file",
                            argument=argument.lstrip("-"), value=os.fspath(trace))


def refuse_overwriting(argument: str, trace: Any, remedy: str) -> None:
    """Refuse a trace path that names an existing, non-empty file that does not start
    with a trace header: writing the trace would destroy it (a geometry, a model file,
    a typo'd path). A trace is overwritten as before, and so is an empty file.
    ``remedy`` says how the caller lets it be overwritten (an option, a flag)."""
    from kvgrant.strict_json import strict_json_loads
    from kvgrant.traceformat import MAX_HEADER_BYTES

    if not _is_path(trace) or not os.path.isfile(trace):
        return
    try:
        with open(trace, "rb") as fh:
            first = fh.readline(1 << 16)
            if first.startswith(b"{") and not first.endswith(b"\n"):
                # a header line longer than that (the published layout's is about 90 KB:
                # a second `make demo` refused the first one's trace), up to the readers'
                # bound; a file that does not start as JSON is judged by its first 64 KiB
                first += fh.readline(MAX_HEADER_BYTES - len(first))
    except OSError:  # unreadable: judged by its size
        first = None if os.path.getsize(trace) else b""
    if first == b"":
        # empty: read, not judged by its size (a /proc file reports 0 bytes and is not
        # empty; --trace /proc/version was opened and failed to write, after allocating)
        return
    try:
        # strictly: a first line naming "kind" twice is not a header (the last would win)
        is_trace = first is not None and strict_json_loads(first).get("kind") == "header"
    except (ValueError, AttributeError, RecursionError):
        is_trace = False
    if not is_trace:
        raise ArgumentError(f"{argument} = {os.fspath(trace)!r}: exists and is not a "
                            f"kvgrant trace; refusing to overwrite it ({remedy})",
                            argument=argument.lstrip("-"), value=os.fspath(trace))


def check_trace_path(argument: str, trace: Any, geometry: Any = None, *,
                     overwrite: bool = False) -> None:
    """The trace path of allocate() / allocate_rank() (or, with ``trace`` None, the
    path ``KVGRANT_TRACE`` names, the errors then naming the variable): never the
    geometry file, and an existing file that is not a trace only with ``overwrite``
    (``TraceOptions(path, overwrite=True)``). Was: the library overwrote any file, where
    ``kvgrant alloc --trace`` refused it without ``--force``."""
    name = argument
    if trace is None:
        from kvgrant.runtime.trace import TRACE_ENV, env_trace_path

        name, trace = TRACE_ENV, env_trace_path()
    if trace is None:
        return
    if same_file(geometry, trace):
        raise fail(name, trace, f"is the geometry file {show(os.fspath(geometry))}; "
                                "writing the trace there would overwrite it")
    refuse_fifo(name, trace)
    if not overwrite:
        refuse_overwriting(name, trace, "pass trace=TraceOptions(path, overwrite=True) to "
                                        "overwrite it")


def check_allocate_args(geometry: Any, *, plan: Any, devices: Any, memory_limit: Any,
                        check_contract: Any, trace: Any, overwrite_trace: bool = False
                        ) -> tuple[list[int] | None, Any]:
    """Check the flat arguments of :func:`~kvgrant.runtime.allocator.allocate` before
    any work (the grouped ones checked themselves: :mod:`kvgrant.runtime.options`);
    ``trace`` is the trace target (None: the path ``KVGRANT_TRACE`` names, checked the
    same way, its errors naming the variable; :func:`check_trace_path`; a file that is
    not a trace only with ``overwrite_trace``). Returns ``devices`` as a list (or None)
    and ``plan`` (a planner callable wrapped so its result is checked).

    Raises
    ------
    ArgumentError
        The first argument (or KVGRANT_TRACE) that is not accepted, with its value and
        the accepted forms.
    """
    from kvgrant.layout.geometry import Geometry
    from kvgrant.layout.plan import PhysicalPlan

    if not isinstance(geometry, Geometry):
        if not _is_path(geometry):
            raise fail("geometry", geometry, "must be a Geometry or the path of a geometry "
                                             "JSON file")
        if not os.fspath(geometry) or "\0" in os.fspath(geometry):
            raise fail("geometry", geometry, "must be a file path (non-empty, no NUL)")
    check_plan_arg(plan)
    devs = check_devices(devices)
    if isinstance(memory_limit, bool) or (
            memory_limit is not None and not isinstance(memory_limit, (str, int))
            and as_int(memory_limit) is None):
        from kvgrant.runtime.capacity import MemoryLimit

        if not isinstance(memory_limit, MemoryLimit):
            raise fail("memory_limit", memory_limit, "must be None, a size such as '-1G' or "
                                                     "'40G', a byte count or a MemoryLimit")
    check_flag("check_contract", check_contract)
    check_trace_path("trace", trace, geometry, overwrite=overwrite_trace)
    if callable(plan) and not isinstance(plan, (str, PhysicalPlan)):
        plan = checked_planner(plan)
    return devs, plan


def check_plan_arg(plan: Any) -> None:
    """``plan`` of allocate() / allocate_rank(): a plan label, a PhysicalPlan or a
    planner callable (a PhysicalPlan's own fields: :func:`check_plan_object`)."""
    from kvgrant.layout.plan import PhysicalPlan

    if isinstance(plan, str):
        from kvgrant.layout.plans import PLAN_LABELS

        if plan not in PLAN_LABELS:
            raise fail("plan", plan, f"must be one of {', '.join(PLAN_LABELS)}, a "
                                     "PhysicalPlan or a planner callable")
    elif not isinstance(plan, PhysicalPlan) and not callable(plan):
        raise fail("plan", plan, "must be a plan label, a PhysicalPlan or a planner "
                                 "callable geometry -> PhysicalPlan")


def check_plan_object(plan: Any, argument: str = "plan") -> None:
    """A PhysicalPlan built by hand must hold what the allocator reads: a str label, a
    Geometry, a tuple of Allocations (``PhysicalPlan("packed", g, None)`` failed as a
    TypeError deep inside, a raw dict for the geometry as an AttributeError)."""
    from kvgrant.layout.geometry import Geometry
    from kvgrant.layout.plan import Allocation

    if not isinstance(plan.label, str) or not plan.label:
        raise fail(f"{argument}.label", plan.label, "must be a non-empty str (naive, "
                   "reference, packed or a name of your own)")
    if not isinstance(plan.geometry, Geometry):
        raise fail(f"{argument}.geometry", plan.geometry, "must be a Geometry "
                   "(kvgrant.layout.load_geometry or parse_geometry)")
    allocs = plan.allocations
    if not isinstance(allocs, (tuple, list)):
        raise fail(f"{argument}.allocations", allocs, "must be a tuple of Allocation")
    for i, a in enumerate(allocs):
        if not isinstance(a, Allocation):
            raise fail(f"{argument}.allocations[{i}]", a, "must be an Allocation")


def checked_planner(planner: Callable[[Any], Any]) -> Callable[[Any], Any]:
    """Wrap a planner callable so that what it returns is checked to be a
    PhysicalPlan (a planner returning None failed deep inside the contract check)."""
    from kvgrant.layout.plan import PhysicalPlan

    def run(g: Any) -> Any:
        result = planner(g)
        if not isinstance(result, PhysicalPlan):
            raise fail("plan", planner, f"a planner must return a PhysicalPlan; it "
                                         f"returned {show(result)}")
        check_plan_object(result)
        return result
    return run


def check_name(argument: str, value: Any, names: Sequence[str]) -> str:
    """``value`` must be one of ``names`` (a plane or region of the geometry)."""
    if not isinstance(value, str) or value not in names:
        shown = ", ".join(repr(n) for n in list(names)[:8])
        more = f" and {len(names) - 8} more" if len(names) > 8 else ""
        raise fail(argument, value, f"must be one of {shown}{more}")
    return value


def check_index(argument: str, value: Any, size: int, what: str) -> int:
    """``value`` must be an integer in ``0..size-1`` (a rank, row or page); returned as
    a Python int (a numpy or torch integer is taken, :func:`as_int`)."""
    n = as_int(value)
    if n is None or not 0 <= n < size:
        raise fail(argument, value, f"must be an integer {what} in 0..{size - 1}")
    return n
