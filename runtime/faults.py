"""Fault injection for the driver backends: make a chosen driver call fail.

The allocator's unwinding is only believable if every driver step can fail and the
failure is seen to unwind everything. A :class:`FaultPlan` names which calls fail:

* ``Fault(nth=k)``: the k-th driver call of this driver instance fails (1-based: the
  first call is ``nth=1``; ``sum(driver.calls.values())`` after a clean run is the
  number of positions a sweep can fail);
* ``Fault(call="cuMemSetAccess", device=3)``: the first ``cuMemSetAccess`` attributed to
  device 3 fails (``nth`` counts matching calls, so ``nth=2`` is the second one);
* ``result`` is the CUresult name (default ``CUDA_ERROR_OUT_OF_MEMORY``);
  ``repeat=True`` keeps failing every later matching call too.

A failed call has no effect on driver state; it is still counted in ``driver.calls``.
Both backends accept ``faults=`` so unwinding can be exercised on real GPUs as well.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from typing import Iterable, Mapping

from kvgrant.runtime.arguments import fail
from kvgrant.runtime.cuda_errors import result_name, result_value
from kvgrant.traceformat import DRIVER_CALLS

__all__ = ["CALL_NAMES", "Fault", "FaultPlan", "FaultState"]

# Every driver entry point a backend counts; fault specs must name one of these: the
# calls lifecycle trace events name (kvgrant.traceformat's action table) and the rest.
CALL_NAMES: frozenset[str] = DRIVER_CALLS | frozenset({
    "cuMemGetAllocationGranularity",
    "cuMemGetInfo",
    "cuMemGetAccess",
    "cuMemExportToShareableHandle",
    "cuMemImportFromShareableHandle",
    "cuMemcpyHtoD",
    "cuMemcpyDtoH",
})


@dataclass(frozen=True)
class Fault:
    """One injected failure: the ``nth`` call (1-based) matching ``call`` and ``device``.

    ``call=None`` matches every call, ``device=None`` every device (calls attributed to no
    device, such as a reserve without ``device=``, match only ``device=None``).
    """

    nth: int = 1
    call: str | None = None
    device: int | None = None
    result: str = "CUDA_ERROR_OUT_OF_MEMORY"
    repeat: bool = False

    def __post_init__(self) -> None:
        # ArgumentError is a ValueError too, so callers catching ValueError still do
        if isinstance(self.nth, bool) or not isinstance(self.nth, int) or self.nth < 1:
            raise fail("Fault.nth", self.nth, "must be an integer >= 1 (1-based: nth=1 "
                       "fails the first matching call)")
        if self.call is not None and (not isinstance(self.call, str)
                                      or self.call not in CALL_NAMES):
            raise fail("Fault.call", self.call, f"must be one of {sorted(CALL_NAMES)} or "
                       "None (any call)")
        if self.device is not None and (isinstance(self.device, bool)
                                        or not isinstance(self.device, int)
                                        or self.device < 0):
            raise fail("Fault.device", self.device, "must be a device ordinal >= 0 or None "
                       "(any device)")
        if not isinstance(self.repeat, bool):  # repeat="no" once failed every call
            raise fail("Fault.repeat", self.repeat, "must be True or False")
        try:
            if isinstance(self.result, bool):
                raise ValueError(self.result)
            value = result_value(self.result)
        except ValueError:
            raise fail("Fault.result", self.result, "must be a CUresult name such as "
                       "'CUDA_ERROR_OUT_OF_MEMORY' or its integer value") from None
        if value == 0:
            raise fail("Fault.result", self.result, "a fault must be an error, not "
                       "CUDA_SUCCESS")
        object.__setattr__(self, "result", result_name(value))

    def matches(self, call: str, device: int | None) -> bool:
        """Whether a call of this kind on this device counts towards ``nth``."""
        return ((self.call is None or self.call == call)
                and (self.device is None or self.device == device))

    def describe(self) -> str:
        what = self.call or "driver call"
        on = f" on device {self.device}" if self.device is not None else ""
        return f"injected fault: call #{self.nth} of {what}{on}" + (
            " and every later one" if self.repeat else "")


@dataclass
class FaultPlan:
    """A list of :class:`Fault` entries; the first that fires decides the result."""

    faults: list[Fault] = field(default_factory=list)

    @classmethod
    def coerce(cls, spec: "FaultPlan | Fault | Iterable[Fault | Mapping[str, object]] | None"
               ) -> "FaultPlan":
        """Accept a plan, one fault, a list of faults or dicts, or None (no faults)."""
        if spec is None:
            return cls()
        if isinstance(spec, FaultPlan):
            return cls.coerce(spec.faults) if spec.faults is not None else cls()
        if isinstance(spec, Fault):
            return cls([spec])
        if isinstance(spec, (str, bytes, Mapping)) or not isinstance(spec, Iterable):
            raise fail("faults", spec, "must be a Fault, a FaultPlan, a list of Faults or "
                       "of dicts of Fault fields, or None")
        faults: list[Fault] = []
        for i, item in enumerate(spec):
            if isinstance(item, Fault):
                faults.append(item)
            elif isinstance(item, Mapping):
                unknown = sorted(map(str, set(item) - _FAULT_FIELDS))
                if unknown:
                    raise fail(f"faults[{i}]", dict(item), f"unknown field(s) {unknown}; "
                               f"a Fault has {sorted(_FAULT_FIELDS)}")
                faults.append(Fault(**item))  # type: ignore[arg-type]
            else:
                raise fail(f"faults[{i}]", item, "must be a Fault or a dict of Fault fields")
        return cls(faults)


_FAULT_FIELDS = frozenset(f.name for f in fields(Fault))


class FaultState:
    """Per-driver matching counters for a plan (kept on the driver, never global)."""

    __slots__ = ("_faults", "_seen")

    def __init__(self, plan: FaultPlan) -> None:
        self._faults = list(plan.faults)
        self._seen = [0] * len(self._faults)

    def __bool__(self) -> bool:
        return bool(self._faults)

    def check(self, call: str, device: int | None) -> Fault | None:
        """Count this call against every fault; return the fault that fires, if any."""
        fired: Fault | None = None
        for i, fault in enumerate(self._faults):
            if not fault.matches(call, device):
                continue
            self._seen[i] += 1
            seen = self._seen[i]
            if fired is None and (seen == fault.nth or (fault.repeat and seen > fault.nth)):
                fired = fault
        return fired
