"""Transition traces: one NDJSON line per lifecycle transition, as it happens.

The format is docs/INTERFACES.md "Trace format": a header line holding the model's
constants, then one ``event`` line per transition with ``seq``, ``rank``, ``action``
(spec name), ``args``, driver ``call`` and ``result``, ``device``, ``va``, ``size``,
time ``t`` and the abstract ``state`` after the event. JSON only, no ad-hoc format.

Why this shape: tracing must be cheap when on (a few percent of a start-up whose
driver calls take 30-40 us each) and free when off (callers test
:attr:`TraceWriter.enabled` before building an event). The allocating thread only
appends one tuple per event to a list (:meth:`TraceWriter.recorder`: no lock, no queue,
no formatting, no ``seq`` bookkeeping). A writer thread polls that list every
millisecond while records come, numbers and formats what it finds, and writes it with
one write to the OS; it mostly runs while the allocating thread is inside a driver call
(cuda-python releases the GIL there, ``benchmarks/probe_gil.py``). Lines therefore reach
the OS within about a millisecond of the transition, and every group event (Publish,
Abort, ...) waits until all earlier lines are on file. docs/allocator.md has the
designs measured against this one on an H200 host (a queue of batches, writes every 16
lines, formatting in the caller, a renderer process) and what each cost.
Tracing is switched on by a path, an open text stream, or ``KVGRANT_TRACE``.
"""

from __future__ import annotations

import json
import os
import threading
import time
import weakref
from pathlib import Path
from typing import IO, Any, Callable, Mapping

from kvgrant.errors import TraceError

__all__ = ["TRACE_ENV", "TRACE_VERSION", "TraceWriter", "clock", "event_template",
           "open_trace"]

TRACE_ENV = "KVGRANT_TRACE"
TRACE_VERSION = 1

_encode = json.JSONEncoder(separators=(", ", ": "), ensure_ascii=True).encode
# One event line; fields in the order of docs/INTERFACES.md.
# (``t`` follows ``seq`` so every line, templated or not, starts with the two
# per-event values; JSON key order carries no meaning.)
_EVENT = ('{"kind": "event", "seq": %d, "t": %.6f, "rank": %s, "action": "%s", "args": %s, '
          '"call": %s, "result": %s, "device": %s, "va": %s, "size": %s, "state": %s}\n')

#: The clock of a record's time stamp (the writer subtracts the trace's start).
clock: Callable[[], float] = time.perf_counter

_POLL_S = 0.001   # how often the writer looks for new records while they come
_IDLE_S = 0.1     # ... and once none came for a while (flushes and group events wake it)


def event_template(rank: int, action: str, args: str, call: str | None, result: str | None,
                   device: int | None, va: str, size: str, state: str) -> str:
    """A %-template for one kind of rank event, for :meth:`TraceWriter.recorder`.

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


class _Header:
    """Control record: the header line, and the clock value ``t`` counts from."""

    __slots__ = ("line", "t0")

    def __init__(self, line: str, t0: float) -> None:
        self.line = line
        self.t0 = t0


class _Flush:
    """Control record: flush everything before me, then set ``done``."""

    __slots__ = ("done",)

    def __init__(self) -> None:
        self.done = threading.Event()


_STOP = object()  # control record: flush, close an owned file, end the thread


class _Output:
    """The writer thread's side: numbers, formats and writes records in order.

    A write error is kept in ``errors`` (reported by the writer's owner) and later
    records are dropped; control records are still honoured, so nobody waits forever.
    """

    def __init__(self, fh: IO[str], owns: bool, errors: list[BaseException]) -> None:
        self.fh = fh
        self.owns = owns
        self.errors = errors
        self.seq = 0
        self.t0 = clock()

    def _write(self, lines: list[str], flush: bool) -> None:
        if self.errors or not lines:
            return
        try:
            self.fh.write("".join(lines))
            if flush:
                self.fh.flush()
        except BaseException as err:
            self.errors.append(err)

    def run(self, buf: list[Any], kick: threading.Event) -> None:
        wait = _POLL_S
        while True:
            kick.clear()
            n = len(buf)
            if not n:
                # idle (e.g. while the published cache lives): back off to _IDLE_S
                kick.wait(wait)
                wait = min(wait * 2, _IDLE_S)
                continue
            wait = _POLL_S
            items = buf[:n]
            del buf[:n]  # the allocating thread only appends, so these n are ours
            if self.handle(items):
                return

    def handle(self, items: list[Any]) -> bool:
        """Write ``items``; True once the stop record was seen."""
        lines: list[str] = []
        seq, t0 = self.seq, self.t0
        for item in items:
            if item.__class__ is tuple:
                if not self.errors:
                    try:
                        lines.append(item[0] % (seq, item[1] - t0, *item[2:]))
                    except BaseException as err:  # a malformed record: report, go on
                        self.errors.append(err)
                seq += 1
                continue
            self.seq = seq
            if item.__class__ is str:
                lines.append(item)
            elif item.__class__ is _Header:
                lines.append(item.line)
                self.t0 = t0 = item.t0
            elif item.__class__ is _Flush:
                self._write(lines, True)
                lines = []
                item.done.set()
            elif item is _STOP:
                self._write(lines, True)
                if self.owns:
                    try:
                        self.fh.close()
                    except BaseException as err:
                        self.errors.append(err)
                return True
        self.seq = seq
        self._write(lines, True)
        return False


def _stop_writer(buf: list[Any], kick: threading.Event, thread: threading.Thread) -> None:
    """Finaliser of a writer nobody closed: let its thread finish the file and end."""
    buf.append(_STOP)
    kick.set()
    if thread is not threading.current_thread():
        thread.join(timeout=10)


class TraceWriter:
    """Writes one trace; ``TraceWriter(None)`` is a disabled writer that does nothing.

    Parameters
    ----------
    target
        A path (the file is created or truncated), an open text stream (left open
        on :meth:`close`), or None (tracing off).
    flush_each
        Wait until every line is on file before going on (for tailing a live run, or
        a process that may be killed); otherwise rank events reach the file within
        about a millisecond, and group events (Publish, Abort, ...) wait for all
        earlier lines.

    Notes
    -----
    Tracing never aborts the lifecycle it records: a write error switches the writer
    off and is kept in :attr:`error` for the caller to report once the allocation or
    its unwinding is complete. A writer that is never closed finishes its file when it
    is garbage-collected or at interpreter exit.
    """

    __slots__ = ("_fh", "_on", "_buf", "_kick", "_flush_each", "path", "header_written",
                 "_out", "_thread", "_errors", "_finalizer", "__weakref__")

    def __init__(self, target: str | os.PathLike[str] | IO[str] | None = None, *,
                 flush_each: bool = False) -> None:
        # records not yet taken by the writer thread: a tuple (template, clock(), *values)
        # per event, or a control record
        self._buf: list[Any] = []
        self._kick = threading.Event()
        self._flush_each = flush_each
        self._errors: list[BaseException] = []
        self.header_written = False
        self.path: Path | None = None
        self._out: _Output | None = None
        self._thread: threading.Thread | None = None
        self._finalizer: weakref.finalize | None = None
        owns = False
        if target is None:
            self._fh: IO[str] | None = None
        elif isinstance(target, (str, os.PathLike)):
            self.path = Path(target)
            try:
                self.path.parent.mkdir(parents=True, exist_ok=True)
                self._fh = open(self.path, "w", encoding="ascii", buffering=1 << 16)
            except OSError as err:
                raise TraceError(f"trace = {str(self.path)!r}: cannot open for writing: "
                                 f"{err.strerror or err}") from None
            owns = True
        else:
            self._fh = target
        self._on = self._fh is not None
        if self._fh is not None:
            self._out = _Output(self._fh, owns, self._errors)
            self._thread = threading.Thread(target=self._out.run, args=(self._buf, self._kick),
                                            name="kvgrant-trace", daemon=True)
            self._thread.start()
            self._finalizer = weakref.finalize(self, _stop_writer, self._buf, self._kick,
                                               self._thread)

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
        """Events written so far (the next ``seq``); waits for the writer."""
        self._drain()
        return self._out.seq if self._out is not None else 0

    def recorder(self) -> Callable[[tuple[Any, ...]], None]:
        """The hot path: a callable taking ``(template, clock(), *values)`` for one event.

        ``template`` comes from :func:`event_template` (or is any %-template whose first
        two placeholders are ``seq`` and ``t``); ``values`` fill the rest; ``seq`` is
        assigned by the writer, without gaps, in call order. Only for an enabled writer.
        """
        if not self._flush_each:
            return self._buf.append

        def record_and_wait(rec: tuple[Any, ...]) -> None:
            self._buf.append(rec)
            self._drain()
        return record_and_wait

    def header(self, **constants: Any) -> None:
        """Write the header line (must come first, once); ``t`` counts from here."""
        if not self._on:
            return
        if self.header_written or self._buf or (self._out is not None and self._out.seq):
            raise RuntimeError("trace header must be the first line and written once")
        line = {"kind": "header", "version": TRACE_VERSION}
        line.update(constants)
        self._buf.append(_Header(_encode(line) + "\n", clock()))
        self._drain()
        self.header_written = True

    def event(self, rank: int | None, action: str, args: Mapping[str, Any],
              call: str | None, result: str | None, state: Mapping[str, Any], *,
              device: int | None = None, va: int | None = None,
              size: int | None = None) -> None:
        """Write one transition; ``seq`` is assigned in call order, without gaps."""
        if not self._on:
            return
        self.event_json(rank, action, _encode(args), call, result, _encode(state),
                        device=device, va=va, size=size)

    def event_json(self, rank: int | None, action: str, args_json: str, call: str | None,
                   result: str | None, state_json: str, *, device: int | None = None,
                   va: int | None = None, size: int | None = None) -> None:
        """:meth:`event` with ``args`` and ``state`` already JSON-encoded.

        ``action``, ``call`` and ``result`` are identifiers (no quoting needed). A
        group event (``rank`` None) returns once it and every earlier line is on file.
        """
        if not self._on:
            return
        self._buf.append((
            _EVENT, clock(), "null" if rank is None else rank, action, args_json,
            "null" if call is None else '"' + call + '"',
            "null" if result is None else '"' + result + '"',
            "null" if device is None else device, "null" if va is None else va,
            "null" if size is None else size, state_json))
        if self._flush_each or rank is None:
            self._drain()

    def event_line(self, template: str, *values: object) -> None:
        """One event from an :func:`event_template`; ``values`` fill the placeholders
        after ``seq`` and ``t`` (what :meth:`recorder` does, as a method)."""
        if self._on:
            self.recorder()((template, clock(), *values))

    def _drain(self) -> None:
        """Wait until everything recorded is on file (flushed to the OS).
        Never raises: a write error switches the writer off (see :attr:`error`)."""
        thread = self._thread
        if thread is None or not self._on:
            return
        req = _Flush()
        self._buf.append(req)
        self._kick.set()
        while not req.done.wait(0.5):
            if not thread.is_alive():
                break
        if self._errors:
            self._on = False

    def flush(self) -> None:
        self._drain()

    def close(self) -> None:
        """Flush, stop the writer thread, close the file when this writer opened it.
        Safe to call twice; never raises (see :attr:`error`)."""
        self._drain()
        self._on = False
        if self._finalizer is not None:
            self._finalizer()  # stop record, once; joins the thread
            self._finalizer = None
            self._thread = None
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
