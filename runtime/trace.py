"""Transition traces: one NDJSON line per lifecycle transition, as it happens.

The format is docs/INTERFACES.md "Trace format", owned by :mod:`kvgrant.traceformat`
(action table, field order, line templates; this module only ships records): a header
line (version 2: the plan, reservations and topology; group traces: version 1), then one
``event`` line per transition with ``seq``, ``rank``, ``action`` (spec name), ``args``,
driver ``call`` and ``result``, ``device``, ``va``, ``size``, ``handle``, time ``t`` and
the abstract ``state`` after the event. JSON only, no ad-hoc format.

Why this shape: tracing must be cheap when on (a few percent of a start-up whose driver
calls take 30-60 us each) and free when off (callers test :attr:`TraceWriter.enabled`
before building an event). Formatting a line costs about 2.4 us wherever it runs, so it
must not run in the allocating process: the allocating thread only records, and ships
the records (a ``marshal`` and one pipe write) to a renderer process
(:mod:`kvgrant.runtime.trace_render`) that numbers, formats and writes the lines on
another core. Its hot path is one packed binary entry per allocation
(:meth:`TraceWriter.alloc_entries`), which the renderer expands into the allocation's
Create, Map, MapAlias and Grant lines; other events are one tuple each
(:meth:`TraceWriter.recorder`). It ships at group events (Publish, Abort, ...), every
:data:`DEFAULT_CHUNK` events' worth (:meth:`ship_if_full`, :meth:`ship_entries`, called
between driver calls), and on flush and close. Only :meth:`flush`, :meth:`close` and the
``Abort`` event wait until the file has every line. There is no writer thread: another
Python thread waking while cuda-python has released the GIL made the allocating thread
wait for the GIL after its driver calls (measured; docs/allocator.md).

What a crash loses: the renderer runs in its own session and writes everything it was
sent, so a SIGKILL of the allocating process loses only the records not yet shipped (at
most one chunk's worth plus the events of the allocation in progress). Streams (and hosts where
no process can start) are formatted in the shipping thread. Tracing is switched on by a
path, an open text stream, or ``KVGRANT_TRACE``.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
import weakref
from pathlib import Path
from typing import IO, Any, Callable, Mapping

from kvgrant.errors import TraceError
from kvgrant.runtime import trace_render
from kvgrant.traceformat import LIFECYCLE_VERSION, encode_json, event_line, event_template
from kvgrant.runtime.trace_render import (ALLOC_ENTRY, ALLOCS, DEFINE, FLUSH, HEADER, STOP,
                                          Renderer, alloc_spec, frame, read_frame)

__all__ = ["ALLOC_ENTRY", "DEFAULT_CHUNK", "TRACE_ENV", "TRACE_VERSION", "TraceWriter",
           "alloc_spec", "clock", "event_template", "open_trace"]

TRACE_ENV = "KVGRANT_TRACE"
#: Header version of a lifecycle trace (kvgrant.traceformat owns the format).
TRACE_VERSION = LIFECYCLE_VERSION

_encode = encode_json

_HANDLE_LINE = event_line(LIFECYCLE_VERSION)

#: The clock of a record's time stamp (the writer subtracts the trace's start).
clock: Callable[[], float] = time.perf_counter

#: Records :meth:`TraceWriter.ship_if_full` lets pile up before shipping them.
DEFAULT_CHUNK = 512
_RENDER_SCRIPT = os.path.abspath(trace_render.__file__)


class _InProcess:
    """Ships records to a renderer process (trace files): this process only marshals
    them and writes them to a pipe; the renderer formats and writes the lines."""

    def __init__(self, fd: int, errors: list[BaseException]) -> None:
        self.errors = errors
        self.seq = 0
        self.proc = subprocess.Popen(
            [sys.executable, "-I", "-S", _RENDER_SCRIPT, str(fd)], stdin=subprocess.PIPE,
            stdout=subprocess.PIPE, pass_fds=(fd,), bufsize=0,
            # its own session: a Ctrl-C meant for the allocation (which then unwinds
            # and traces Abort) must not kill the renderer first
            start_new_session=True)
        self.to_child = self.proc.stdin.fileno()  # type: ignore[union-attr]
        self.from_child = self.proc.stdout  # type: ignore[assignment]
        try:  # room for a whole chunk while the renderer catches up (Linux)
            import fcntl

            fcntl.fcntl(self.to_child, getattr(fcntl, "F_SETPIPE_SZ", 1031), 1 << 20)
        except (ImportError, OSError):
            pass
        self.dead = False
        try:  # handshake: a renderer that cannot run fails here, not mid-allocation
            os.write(self.to_child, frame([[FLUSH]]))
            read_frame(self.from_child)  # type: ignore[arg-type]
        except (EOFError, OSError, ValueError) as err:
            self.proc.kill()
            self.proc.communicate()  # reaps it and closes both pipes
            raise OSError(f"trace renderer process did not start: {err}") from None

    def _lost(self) -> None:
        if not self.dead:
            self.dead = True
            code = self.proc.poll()
            self.errors.append(TraceError(
                "trace renderer process exited" + (f" with code {code}" if code is not None
                                                   else "") + "; the trace is incomplete"))

    def feed(self, items: list[Any]) -> bool:
        """Ship ``items``; after a FLUSH or STOP (always the last record) wait for the
        renderer's acknowledgement; True after STOP."""
        if not self.dead:
            try:
                view = memoryview(frame(items))
                while view:
                    view = view[os.write(self.to_child, view):]
            except OSError:
                self._lost()
        last = items[-1]
        if last.__class__ is not list or last[0] not in (FLUSH, STOP):
            return False
        if not self.dead:
            try:
                self.seq, err = read_frame(self.from_child)  # type: ignore[arg-type]
                if err is not None and not self.errors:
                    self.errors.append(TraceError(f"writing the trace failed: {err}"))
            except (EOFError, OSError, ValueError):
                self._lost()
        if last[0] != STOP:
            return False
        for f in (self.proc.stdin, self.proc.stdout):
            try:
                f.close()  # type: ignore[union-attr]
            except OSError:
                pass
        try:
            self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        return True


def _no_ack(_item: list[Any]) -> None:
    """A Renderer in this process acknowledges nothing: its feed returns when done."""


def _finish(sink: "Renderer | _InProcess", buf: list[Any]) -> None:
    """Finaliser of a writer (run by close, or when nobody closed it): ship what is
    left and the stop record, and wait until the file is complete."""
    items = buf[:]
    del buf[:]
    items.append([STOP])
    sink.feed(items)


class TraceWriter:
    """Writes one trace; ``TraceWriter(None)`` is a disabled writer that does nothing.

    Parameters
    ----------
    target
        A path (the file is created or truncated), an open text stream (left open
        on :meth:`close`), or None (tracing off).
    renderer
        Where a trace *file* is formatted: ``"process"`` (default; a small Python
        process fed through a pipe, so formatting never runs in this process, and
        lines already shipped survive this process being killed) or ``"thread"``
        (in this process, by the shipping thread; also the fallback when no process
        can be started). Streams are always formatted in this process.
    chunk
        Records :meth:`ship_if_full` lets pile up before it ships them: the most a
        SIGKILL of this process can lose. Each ship costs a pipe write (~10-20 us);
        the marshal costs the same per record however the records are batched.

    Notes
    -----
    One producing thread per writer. Tracing never aborts the lifecycle it records: a
    write error switches the writer off and is kept in :attr:`error` for the caller to
    report once the allocation or its unwinding is complete. A writer that is never
    closed finishes its file when it is garbage-collected or at interpreter exit.
    """

    __slots__ = ("_on", "_buf", "_chunk", "path", "header_written", "_sink", "_errors",
                 "_finalizer", "renderer", "_line", "__weakref__")

    def __init__(self, target: str | os.PathLike[str] | IO[str] | None = None, *,
                 renderer: str = "process", chunk: int = DEFAULT_CHUNK) -> None:
        if renderer not in ("process", "thread"):
            raise ValueError(f"renderer = {renderer!r}: must be 'process' or 'thread'")
        if isinstance(chunk, bool) or not isinstance(chunk, int) or chunk < 1:
            raise ValueError(f"chunk = {chunk!r}: must be an integer >= 1")
        self._chunk = chunk
        self._line = event_line(LIFECYCLE_VERSION)  # set again by header()
        self._errors: list[BaseException] = []
        self._buf: list[Any] = []
        self.header_written = False
        self.path: Path | None = None
        self.renderer: str | None = None  # where lines are formatted: process or thread
        # formats in this process (Renderer) or ships to the renderer process
        self._sink: Renderer | _InProcess | None = None
        self._finalizer: weakref.finalize | None = None
        if isinstance(target, (str, os.PathLike)):
            self.path = Path(target)
            try:
                self.path.parent.mkdir(parents=True, exist_ok=True)
                fh = open(self.path, "w", encoding="ascii", buffering=1 << 16)
            except OSError as err:
                raise TraceError(f"trace = {str(self.path)!r}: cannot open for writing: "
                                 f"{err.strerror or err}") from None
            if renderer == "process":
                try:
                    self._sink = _InProcess(fh.fileno(), self._errors)
                    fh.close()  # the renderer has its own descriptor of the file
                    self.renderer = "process"
                except (OSError, ValueError):
                    pass  # no process here (no executable, no pass_fds): format in-process
            if self._sink is None:
                self._sink = Renderer(fh, True, _no_ack, self._errors)
                self.renderer = "thread"
        elif target is not None:
            self._sink = Renderer(target, False, _no_ack, self._errors)
            self.renderer = "thread"
        self._on = self._sink is not None
        if self._sink is not None:
            self._finalizer = weakref.finalize(self, _finish, self._sink, self._buf)

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
        """Events written so far (the next ``seq``); flushes first."""
        self.flush()
        return self._sink.seq if self._sink is not None else 0

    def recorder(self) -> Callable[[tuple[Any, ...]], None]:
        """A callable taking ``(template, clock(), *values)`` for one event (events that
        are not part of an allocation's entry, see :meth:`alloc_entries`).

        ``template`` comes from :func:`event_template` (or is any %-template whose first
        two placeholders are ``seq`` and ``t``); ``values`` fill the rest; ``seq`` is
        assigned when the line is formatted, without gaps, in call order. Call
        :meth:`ship_if_full` between driver calls.
        """
        return self._buf.append

    def define_allocs(self, key: Any, spec: tuple[Any, ...]) -> None:
        """Define the allocation spec ``key`` (:func:`alloc_spec`, one per rank and its
        flags) for the entries of :meth:`alloc_entries`."""
        self._buf.append([DEFINE, key, spec])

    def alloc_entries(self, key: Any) -> bytearray:
        """The hot path of an allocation loop: a bytearray, in place in the record
        stream, to which the caller appends one :data:`ALLOC_ENTRY` per allocation (spec
        ``key``). Once it holds :attr:`entries_limit` bytes, call :meth:`ship_entries`."""
        entries = bytearray()
        self._buf.append([ALLOCS, key, entries])
        return entries

    @property
    def entries_limit(self) -> int:
        """Bytes of entries to gather before :meth:`ship_entries`: a chunk's worth of
        events, an allocation counting as its five."""
        return max(1, self._chunk // 5) * ALLOC_ENTRY.size

    def ship_entries(self, key: Any) -> bytearray:
        """Ship everything recorded so far (without waiting) and return a new
        bytearray for the next entries of spec ``key``."""
        if self._on:
            self._ship()
        else:
            del self._buf[:]  # switched off by a write error: keep nothing
        return self.alloc_entries(key)

    def ship_if_full(self) -> None:
        """Ship the recorded events once a chunk has piled up (a length test otherwise):
        bounds what a crash can lose, at one pipe write per chunk."""
        if len(self._buf) >= self._chunk and self._on:
            self._ship()

    def _ship(self) -> None:
        """Hand everything recorded so far to the renderer, without waiting for it."""
        buf = self._buf
        if buf and self._sink is not None:
            items = buf[:]
            del buf[:]
            self._sink.feed(items)
            if self._errors:
                self._on = False

    def header(self, *, version: int = LIFECYCLE_VERSION, t0: float | None = None,
               wait: bool = True, encoded: str | None = None, **constants: Any) -> None:
        """Write the header line (must come first, once); ``t`` counts from ``t0``
        (default: now). ``version`` picks the event line (kvgrant.traceformat).
        ``wait=False`` ships it without waiting until it is on file (the allocating
        thread's choice: the renderer outlives a kill of this process either way).
        ``encoded``: more fields as one JSON object already encoded (built before a timed
        start-up), appended after ``constants``."""
        if not self._on:
            return
        if self.header_written or self._buf or (self._sink is not None and self._sink.seq):
            raise RuntimeError("trace header must be the first line and written once")
        self._line = event_line(version)
        line = {"kind": "header", "version": version}
        line.update(constants)
        text = _encode(line)
        if encoded is not None and encoded != "{}":
            text = text[:-1] + ", " + encoded[1:]
        self._buf.append([HEADER, text + "\n", clock() if t0 is None else t0])
        if wait:
            self.flush()
        else:
            self._ship()
        self.header_written = True

    def event(self, rank: int | None, action: str, args: Mapping[str, Any],
              call: str | None, result: str | None, state: Mapping[str, Any], *,
              device: int | None = None, va: int | None = None,
              size: int | None = None, handle: int | None = None) -> None:
        """Write one transition; ``seq`` is assigned in call order, without gaps."""
        if not self._on:
            return
        self.event_json(rank, action, _encode(args), call, result, _encode(state),
                        device=device, va=va, size=size, handle=handle)

    def event_json(self, rank: int | None, action: str, args_json: str, call: str | None,
                   result: str | None, state_json: str, *, device: int | None = None,
                   va: int | None = None, size: int | None = None,
                   handle: int | None = None) -> None:
        """:meth:`event` with ``args`` and ``state`` already JSON-encoded.

        ``action``, ``call`` and ``result`` are identifiers (no quoting needed). A
        group event (``rank`` None) ships everything recorded before it; ``Abort``
        also waits until it is on file (the unwinding after it may hang or crash).
        """
        if not self._on:
            return
        rec: tuple[Any, ...] = (
            self._line, clock(), "null" if rank is None else rank, action, args_json,
            "null" if call is None else '"' + call + '"',
            "null" if result is None else '"' + result + '"',
            "null" if device is None else device, "null" if va is None else va,
            "null" if size is None else size)
        if self._line is _HANDLE_LINE:
            rec += ("null" if handle is None else handle,)
        self._buf.append(rec + (state_json,))
        if rank is None:
            if action == "Abort":
                self.flush()
            else:
                self._ship()
        elif len(self._buf) >= self._chunk:
            self._ship()

    def flush(self) -> None:
        """Write everything recorded so far and wait until it is on file (flushed to
        the OS). Never raises: a write error switches the writer off (see
        :attr:`error`)."""
        if self._sink is None or not self._on:
            return
        self._buf.append([FLUSH])
        self._ship()

    def close(self) -> None:
        """Write what is left, finish the file (closing it when this writer opened
        it) and stop the renderer. Safe to call twice; never raises (see :attr:`error`)."""
        self._on = False
        if self._finalizer is not None:
            self._finalizer()  # ships the rest and the stop record, once
            self._finalizer = None

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
