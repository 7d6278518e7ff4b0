"""Transition traces: one NDJSON line per lifecycle transition, as it happens.

The format is docs/INTERFACES.md "Trace format": a header line holding the model's
constants, then one ``event`` line per transition with ``seq``, ``rank``, ``action``
(spec name), ``args``, driver ``call`` and ``result``, ``device``, ``va``, ``size``,
time ``t`` and the abstract ``state`` after the event. JSON only, no ad-hoc format.

Why so small: tracing must be cheap when on (one C-accelerated ``json`` encode and a
buffered write per event) and free when off (callers test :attr:`TraceWriter.enabled`
before building an event). Tracing is switched on by a path, an open text file, or the
``KVGRANT_TRACE`` environment variable.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import IO, Any, Mapping

__all__ = ["TRACE_ENV", "TRACE_VERSION", "TraceWriter", "open_trace"]

TRACE_ENV = "KVGRANT_TRACE"
TRACE_VERSION = 1

_encode = json.JSONEncoder(separators=(", ", ": "), ensure_ascii=True).encode
# One event line; fields in the order of docs/INTERFACES.md.
_EVENT = ('{"kind": "event", "seq": %d, "rank": %s, "action": "%s", "args": %s, "call": %s, '
          '"result": %s, "device": %s, "va": %s, "size": %s, "t": %.6f, "state": %s}\n')


def _num(v: int | None) -> str:
    return "null" if v is None else str(int(v))


def _str(v: str | None) -> str:
    return "null" if v is None else '"' + v + '"'


class TraceWriter:
    """Writes one trace; ``TraceWriter(None)`` is a disabled writer that does nothing.

    Parameters
    ----------
    target
        A path (the file is created or truncated), an open text stream (left open
        on :meth:`close`), or None (tracing off).
    flush_each
        Flush after every line (for tailing a live run); otherwise lines are
        flushed at group events (Publish, Abort, ...) and on close.
    """

    __slots__ = ("_fh", "_owns", "_seq", "_t0", "_flush_each", "path", "header_written")

    def __init__(self, target: str | os.PathLike[str] | IO[str] | None = None, *,
                 flush_each: bool = False) -> None:
        self._seq = 0
        self._t0 = time.perf_counter()
        self._flush_each = flush_each
        self.header_written = False
        self.path: Path | None = None
        if target is None:
            self._fh: IO[str] | None = None
            self._owns = False
        elif isinstance(target, (str, os.PathLike)):
            self.path = Path(target)
            if self.path.parent and not self.path.parent.exists():
                self.path.parent.mkdir(parents=True, exist_ok=True)
            self._fh = open(self.path, "w", encoding="ascii", buffering=1 << 20)
            self._owns = True
        else:
            self._fh = target
            self._owns = False

    @property
    def enabled(self) -> bool:
        """True while lines are written; test this before building an event."""
        return self._fh is not None

    @property
    def events(self) -> int:
        """Events written so far (the next ``seq``)."""
        return self._seq

    def header(self, **constants: Any) -> None:
        """Write the header line (must come first, once)."""
        if self._fh is None:
            return
        if self.header_written or self._seq:
            raise RuntimeError("trace header must be the first line and written once")
        line = {"kind": "header", "version": TRACE_VERSION}
        line.update(constants)
        self._fh.write(_encode(line) + "\n")
        self.header_written = True
        self._t0 = time.perf_counter()

    def event(self, rank: int | None, action: str, args: Mapping[str, Any],
              call: str | None, result: str | None, state: Mapping[str, Any], *,
              device: int | None = None, va: int | None = None,
              size: int | None = None) -> None:
        """Write one transition; ``seq`` is assigned here, without gaps."""
        if self._fh is None:
            return
        self.event_json(rank, action, _encode(args), call, result, _encode(state),
                        device=device, va=va, size=size)

    def event_json(self, rank: int | None, action: str, args_json: str, call: str | None,
                   result: str | None, state_json: str, *, device: int | None = None,
                   va: int | None = None, size: int | None = None) -> None:
        """:meth:`event` with ``args`` and ``state`` already JSON-encoded (the hot path).

        ``action``, ``call`` and ``result`` are identifiers (no quoting needed).
        """
        fh = self._fh
        if fh is None:
            return
        fh.write(_EVENT % (self._seq, _num(rank), action, args_json, _str(call), _str(result),
                           _num(device), _num(va), _num(size),
                           time.perf_counter() - self._t0, state_json))
        self._seq += 1
        if self._flush_each or rank is None:
            fh.flush()

    def flush(self) -> None:
        if self._fh is not None:
            self._fh.flush()

    def close(self) -> None:
        """Flush; close the file when this writer opened it. Safe to call twice."""
        fh, self._fh = self._fh, None
        if fh is None:
            return
        fh.flush()
        if self._owns:
            fh.close()

    def __enter__(self) -> "TraceWriter":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def open_trace(trace: "str | os.PathLike[str] | IO[str] | TraceWriter | None" = None, *,
               env: Mapping[str, str] | None = None) -> TraceWriter:
    """The writer for an ``allocate(trace=...)`` argument.

    An explicit ``trace`` wins; else ``KVGRANT_TRACE=path`` switches tracing on;
    else a disabled writer. A :class:`TraceWriter` passes through unchanged.
    """
    if isinstance(trace, TraceWriter):
        return trace
    if trace is not None:
        return TraceWriter(trace)
    environ = os.environ if env is None else env
    path = environ.get(TRACE_ENV, "")
    return TraceWriter(path) if path else TraceWriter(None)
