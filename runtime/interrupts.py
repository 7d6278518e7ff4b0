"""Ctrl-C during a start-up, held back to the next allocation boundary.

Why: Python raises ``KeyboardInterrupt`` at its next safe point after the signal, which
is usually just after a driver call returned and before its undo was pushed: the object
the call made would leak, and the trace would not show it. While the allocator builds,
the first SIGINT only sets :attr:`DeferredInterrupt.pending`; the engine checks it before
each allocation's first driver call (where nothing is half made) and raises
``KeyboardInterrupt`` there, traced as that step's ``Fail``, so the attempt unwinds as
after any failure. The group runtime (runtime/group.py) checks it at the same kind of
boundary of its rank's build and votes failed, so the whole group aborts (docs/group.md
"Ctrl-C during the start-up"). A second SIGINT raises at once (a driver call that hangs must stay
interruptible). Only the main thread can take signals, and a handler the program
installed itself is left alone: then nothing is held back.
"""

from __future__ import annotations

import signal
import threading
from types import FrameType, TracebackType

__all__ = ["DeferredInterrupt"]


class DeferredInterrupt:
    """Context manager: while inside, the first SIGINT sets :attr:`pending`."""

    __slots__ = ("pending", "_armed")

    def __init__(self) -> None:
        self.pending = False
        self._armed = False

    def _on_sigint(self, signum: int, frame: FrameType | None) -> None:
        if self.pending:
            raise KeyboardInterrupt
        self.pending = True

    def __enter__(self) -> "DeferredInterrupt":
        if (threading.current_thread() is threading.main_thread()
                and signal.getsignal(signal.SIGINT) is signal.default_int_handler):
            signal.signal(signal.SIGINT, self._on_sigint)
            self._armed = True
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        if self._armed:
            signal.signal(signal.SIGINT, signal.default_int_handler)
            self._armed = False
