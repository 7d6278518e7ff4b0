"""Transition traces: one NDJSON line per lifecycle transition, as it happens.

The format is docs/INTERFACES.md "Trace format": a header line holding the model's
constants, then one ``event`` line per transition with ``seq``, ``rank``, ``action``
(spec name), ``args``, driver ``call`` and ``result``, ``device``, ``va``, ``size``,
time ``t`` and the abstract ``state`` after the event. JSON only, no ad-hoc format.

Why a writer thread: tracing must be cheap when on and free when off (callers test
:attr:`TraceWriter.enabled` before building an event). The hot path only appends the
event's values to a list; every 64 events the batch goes to a writer thread that formats
and writes the lines while the allocator waits in the next driver calls (cuda-python
releases the GIL inside driver calls; ``benchmarks/probe_gil.py`` shows it). Every group
event (Publish, Abort, ...) waits until all earlier lines are on file. Tracing is switched
on by a path, an open text stream, or the ``KVGRANT_TRACE`` environment variable.
"""

from __future__ import annotations

import json
import os
import queue
import threading
import time
import weakref
from pathlib import Path
from typing import IO, Any, Mapping

from kvgrant.errors import TraceError

__all__ = ["TRACE_ENV", "TRACE_VERSION", "TraceWriter", "event_template", "open_trace"]

TRACE_ENV = "KVGRANT_TRACE"
TRACE_VERSION = 1

_encode = json.JSONEncoder(separators=(", ", ": "), ensure_ascii=True).encode
# One event line; fields in the order of docs/INTERFACES.md.
# (``t`` follows ``seq`` so every line, templated or not, starts with the two
# per-event values; JSON key order carries no meaning.)
_EVENT = ('{"kind": "event", "seq": %d, "t": %.6f, "rank": %s, "action": "%s", "args": %s, '
          '"call": %s, "result": %s, "device": %s, "va": %s, "size": %s, "state": %s}\n')


_clock = time.perf_counter
_BATCH = 64  # events handed to the writer thread at once (and at every group event)


def event_template(rank: int, action: str, args: str, call: str | None, result: str | None,
                   device: int | None, va: str, size: str, state: str) -> str:
    """A %-template for one kind of rank event, for :meth:`TraceWriter.event_line`.

    ``args``, ``va``, ``size`` and ``state`` are JSON fragments that may hold ``%d``
    placeholders (in that order); the template adds ``seq`` and ``t`` in front. Why:
    tracing a start-up of 10^5 driver calls must cost a few percent of the calls, so
    everything fixed for a (rank, action, phase, flags) is formatted once.
    """
    def q(v: str | None) -> str:
        return "null" if v is None else '"' + v + '"'

    return ('{"kind": "event", "seq": %d, "t": %.6f, "rank": ' + str(rank) + ', "action": "'
            + action + '", "args": ' + args + ', "call": ' + q(call) + ', "result": '
            + q(result) + ', "device": ' + ("null" if device is None else str(device))
            + ', "va": ' + va + ', "size": ' + size + ', "state": ' + state + '}\n')


def _write_loop(q: "queue.Queue[list[Any] | None]", fh: IO[str], owns: bool,
                error: list[BaseException]) -> None:
    """Writer thread: format each batch and write it, in order; on the stop sentinel,
    flush and close the file when the writer opened it. A write error is kept in
    ``error`` (reported by the writer's owner) and later batches are dropped."""
    while True:
        batch = q.get()
        try:
            if batch is None:
                try:
                    fh.flush()
                    if owns:
                        fh.close()
                except BaseException as err:
                    error.append(err)
                return
            if not error:
                fh.write("".join(item if item.__class__ is str
                                 else item[0] % (item[1], item[2], *item[3])
                                 for item in batch))
        except BaseException as err:
            error.append(err)
        finally:
            q.task_done()


def _stop_writer(q: "queue.Queue[list[Any] | None]") -> None:
    q.put(None)


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

    Notes
    -----
    Tracing never aborts the lifecycle it records: a write error switches the writer
    off and is kept in :attr:`error` for the caller to report once the allocation or
    its unwinding is complete. A writer that is never closed stops its thread when it
    is garbage-collected.
    """

    __slots__ = ("_fh", "_on", "_seq", "_t0", "_flush_each", "_pending", "path",
                 "header_written", "_queue", "_thread", "_errors", "_finalizer",
                 "__weakref__")

    def __init__(self, target: str | os.PathLike[str] | IO[str] | None = None, *,
                 flush_each: bool = False) -> None:
        self._seq = 0
        # events not yet handed to the writer: a line (str) or (template, seq, t, values)
        self._pending: list[Any] = []
        self._t0 = time.perf_counter()
        self._flush_each = flush_each
        self._errors: list[BaseException] = []
        self.header_written = False
        self.path: Path | None = None
        self._queue: "queue.Queue[list[Any] | None] | None" = None
        self._thread: threading.Thread | None = None
        self._finalizer: weakref.finalize | None = None
        owns = False
        if target is None:
            self._fh: IO[str] | None = None
        elif isinstance(target, (str, os.PathLike)):
            self.path = Path(target)
            try:
                self.path.parent.mkdir(parents=True, exist_ok=True)
                self._fh = open(self.path, "w", encoding="ascii", buffering=1 << 20)
            except OSError as err:
                raise TraceError(f"trace = {str(self.path)!r}: cannot open for writing: "
                                 f"{err.strerror or err}") from None
            owns = True
        else:
            self._fh = target
        self._on = self._fh is not None
        if self._fh is not None:
            self._queue = queue.Queue()
            self._thread = threading.Thread(
                target=_write_loop, args=(self._queue, self._fh, owns, self._errors),
                name="kvgrant-trace", daemon=True)
            self._thread.start()
            self._finalizer = weakref.finalize(self, _stop_writer, self._queue)

    @property
    def enabled(self) -> bool:
        """True while lines are written; test this before building an event."""
        return self._on

    @property
    def error(self) -> BaseException | None:
        """The first write error, if any (the writer is then switched off)."""
        return self._errors[0] if self._errors else None

    @property
    def events(self) -> int:
        """Events written so far (the next ``seq``)."""
        return self._seq

    def header(self, **constants: Any) -> None:
        """Write the header line (must come first, once)."""
        if not self._on:
            return
        if self.header_written or self._seq:
            raise RuntimeError("trace header must be the first line and written once")
        line = {"kind": "header", "version": TRACE_VERSION}
        line.update(constants)
        self._pending.append(_encode(line) + "\n")
        self._drain()
        self.header_written = True
        self._t0 = time.perf_counter()

    def event(self, rank: int | None, action: str, args: Mapping[str, Any],
              call: str | None, result: str | None, state: Mapping[str, Any], *,
              device: int | None = None, va: int | None = None,
              size: int | None = None) -> None:
        """Write one transition; ``seq`` is assigned here, without gaps."""
        if not self._on:
            return
        self.event_json(rank, action, _encode(args), call, result, _encode(state),
                        device=device, va=va, size=size)

    def event_json(self, rank: int | None, action: str, args_json: str, call: str | None,
                   result: str | None, state_json: str, *, device: int | None = None,
                   va: int | None = None, size: int | None = None) -> None:
        """:meth:`event` with ``args`` and ``state`` already JSON-encoded.

        ``action``, ``call`` and ``result`` are identifiers (no quoting needed).
        """
        if not self._on:
            return
        self._pending.append(_EVENT % (
            self._seq, _clock() - self._t0, "null" if rank is None else rank, action, args_json,
            "null" if call is None else '"' + call + '"',
            "null" if result is None else '"' + result + '"',
            "null" if device is None else device, "null" if va is None else va,
            "null" if size is None else size, state_json))
        self._seq += 1
        if self._flush_each or rank is None:
            self._drain()

    def event_line(self, template: str, *values: object) -> None:
        """Write one rank event from an :func:`event_template` (the hot path: it only
        records the values; the writer thread formats them).

        ``values`` fill the template's placeholders after ``seq`` and ``t``.
        """
        if not self._on:
            return
        pending = self._pending
        pending.append((template, self._seq, _clock() - self._t0, values))
        self._seq += 1
        if self._flush_each:
            self._drain()
        elif len(pending) >= _BATCH:
            self._queue.put(pending)  # type: ignore[union-attr]
            self._pending = []

    def _drain(self) -> None:
        """Hand everything to the writer, wait until it is written, flush the file.
        Never raises: a write error switches the writer off (see :attr:`error`)."""
        q, fh = self._queue, self._fh
        if q is None or fh is None or not self._on:
            return
        if self._pending:
            q.put(self._pending)
            self._pending = []
        q.join()
        if not self._errors:
            try:
                fh.flush()
            except BaseException as err:
                self._errors.append(err)
        if self._errors:
            self._on = False

    def flush(self) -> None:
        self._drain()

    def close(self) -> None:
        """Flush, stop the writer thread, close the file when this writer opened it.
        Safe to call twice; never raises (see :attr:`error`)."""
        self._drain()
        self._on = False
        if self._finalizer is not None and self._thread is not None:
            self._finalizer()  # puts the stop sentinel, once
            self._thread.join()
            self._finalizer = None
            self._thread = self._queue = None
        self._fh = None

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
