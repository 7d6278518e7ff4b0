"""A simulated driver that sends its own process a SIGINT (Ctrl-C) after a given call.

Shared by the in-process tests and the group workers (tests/runtime/_group_worker.py).
"""

from __future__ import annotations

import os
import signal
from typing import Any, Callable

from kvgrant.runtime.sim import SimDriver

#: The sim driver's calls (what the start-up does and the unwinding undoes); each counts
#: itself in ``SimDriver.calls``.
CALLS = ("granularity", "free_memory", "reserve", "create", "map", "set_access",
         "export_handle", "import_handle", "unmap", "release", "free_address")


class SigintSim(SimDriver):
    """SimDriver that sends this process ``count`` SIGINTs once its ``at``-th counted
    call (``sum(calls.values())``) has returned or raised, as a terminal does while the
    driver works: Python raises KeyboardInterrupt at its next safe point, usually before
    the caller has pushed the call's undo, unless allocate_rank holds it back."""

    def __init__(self, at: int | None, count: int = 1, **kw: Any) -> None:
        super().__init__(**kw)
        self.at, self.count, self.fired = at, count, False

    def _after(self) -> None:
        if self.fired or self.at is None or sum(self.calls.values()) < self.at:
            return
        self.fired = True
        for _ in range(self.count):
            os.kill(os.getpid(), signal.SIGINT)


def _wrap(name: str) -> Callable[..., Any]:
    base = getattr(SimDriver, name)

    def call(self: SigintSim, *a: Any, **kw: Any) -> Any:
        try:
            return base(self, *a, **kw)
        finally:
            self._after()

    call.__name__ = name
    return call


for _name in CALLS:
    setattr(SigintSim, _name, _wrap(_name))
