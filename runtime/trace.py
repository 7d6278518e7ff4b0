"""Transition traces: one NDJSON line per lifecycle transition, as it happens.

The format is docs/INTERFACES.md "Trace format": a header line holding the model's
constants, then one ``event`` line per transition with ``seq``, ``rank``, ``action``
(spec name), ``args``, driver ``call`` and ``result``, ``device``, ``va``, ``size``,
time ``t`` and the abstract ``state`` after the event. JSON only, no ad-hoc format.

Why this shape: tracing must be cheap when on (a few percent of a start-up whose driver
calls take 30-40 us each) and free when off (callers test :attr:`TraceWriter.enabled`
before building an event). The allocating thread appends one tuple per event to a list
(:meth:`TraceWriter.recorder`: no lock, no queue, no formatting, no ``seq`` bookkeeping)
and, between driver calls, ships that list itself at most once per ``latency_s``
(:meth:`TraceWriter.pump`, 10 ms by default). For a trace file it marshals the records
into a pipe to a renderer process (:mod:`kvgrant.runtime.trace_render`) that numbers,
formats and writes the lines; for a stream, whichever thread ships formats them. Why not
a writer thread doing that: cuda-python releases the GIL inside each driver call, and
every wake of another Python thread could make the allocating thread wait for the GIL
when a call returned (on an H200 host the time inside driver calls grew with the writer
thread's wakes; docs/allocator.md has the figures). So the writer thread here only
catches records that nobody pumps (a producer stuck in a long call, or one that never
pumps): it looks every ``latency_s``, and every ``STALL_S`` while the producer pumps.
Group events (Publish, Abort, ...) and flushes write everything recorded before them, in
the calling thread, before they return. Tracing is switched on by a path, an open text
stream, or ``KVGRANT_TRACE``.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
import weakref
from pathlib import Path
from typing import IO, Any, Callable, Mapping

from kvgrant.errors import TraceError
from kvgrant.runtime import trace_render
from kvgrant.runtime.trace_render import FLUSH, HEADER, STOP, Renderer, frame, read_frame

__all__ = ["DEFAULT_LATENCY_S", "STALL_S", "TRACE_ENV", "TRACE_VERSION", "TraceWriter",
           "clock", "event_template", "open_trace"]

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

#: How long a recorded line may wait before it is shipped: the producer's pumps ship at
#: most once per latency, and the writer thread looks once per latency while nobody pumps.
DEFAULT_LATENCY_S = 0.01
#: How often the writer thread looks while the producer pumps: it only has to catch a
#: producer stuck in a long call, and each of its wakes costs that producer time.
STALL_S = 0.1
_IDLE_S = 0.1
_RENDER_SCRIPT = os.path.abspath(trace_render.__file__)


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


class _Shipper:
    """Records not yet shipped, and the one way out for them: whoever holds ``lock``
    (a pumping producer, a flush, or the writer thread) takes them all and hands them to
    ``feed`` (a :class:`Renderer`'s, or :class:`_InProcess`'s), so batches leave in
    order. FLUSH is appended and shipped under the lock, and STOP is the last record
    anyone appends, so each is the last record of its batch."""

    __slots__ = ("buf", "feed", "lock", "pumped", "stopped")

    def __init__(self, feed: Callable[[list[Any]], bool]) -> None:
        # a tuple (template, clock(), *values) per event, or a control record (a list,
        # see trace_render); the producer only appends
        self.buf: list[Any] = []
        self.feed = feed
        self.lock = threading.Lock()
        self.pumped = False  # a producer shipped since the writer thread last looked
        self.stopped = False

    def ship(self) -> bool:
        """Hand everything recorded so far to ``feed`` (hold ``lock``); True once the
        stop record has gone."""
        n = len(self.buf)
        if n and not self.stopped:
            items = self.buf[:n]
            del self.buf[:n]  # producers only append, so these n are ours
            self.stopped = self.feed(items)
        return self.stopped


def _poll(shipper: _Shipper, kick: threading.Event, latency_s: float) -> None:
    """The writer thread: ship what nobody else shipped, until the stop record went.
    It looks every ``latency_s`` while records come unpumped, every ``STALL_S`` while
    a producer pumps, and backs off to ``_IDLE_S`` while none come."""
    idle_s = max(_IDLE_S, latency_s)
    stall_s = max(STALL_S, latency_s)
    wait = latency_s
    while True:
        kick.wait(wait)  # the stop record kicks it
        kick.clear()
        with shipper.lock:
            pumped, shipper.pumped = shipper.pumped, False
            had = bool(shipper.buf)
            if shipper.ship():
                return
        wait = stall_s if pumped else latency_s if had else min(wait * 2, idle_s)


class _InProcess:
    """Ships records to a renderer process (trace files): the writer thread only
    marshals them and writes them to a pipe, so it hardly ever holds the GIL."""

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
        try:  # room for bursts while the renderer catches up (Linux; else the default)
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
                data = frame(items)
                view = memoryview(data)
                while view:
                    view = view[os.write(self.to_child, view):]
            except OSError:
                self._lost()
        last = items[-1]
        if last.__class__ is not list or last[0] == HEADER:
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


def _stop_writer(shipper: _Shipper, kick: threading.Event, thread: threading.Thread) -> None:
    """Finaliser of a writer (run by close, or when nobody closed it): its thread ships
    the stop record, finishes the file and ends. (Not shipped here: a finaliser can run
    inside the writer thread while it holds the lock.)"""
    shipper.buf.append([STOP])
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
        Wait until every line is on file before going on (for tailing a live run);
        otherwise rank events reach the file within about ``latency_s`` (``STALL_S``
        while the producer is inside one long call), and group events (Publish,
        Abort, ...) write all earlier lines before they return.
    renderer
        Where a trace *file* is formatted: ``"process"`` (default; a small Python
        process fed through a pipe, so formatting never holds this process's GIL, and
        lines already shipped survive this process being killed) or ``"thread"``
        (in this process, by whichever thread ships; also the fallback when no process
        can be started). Streams are always formatted in this process.
    latency_s
        How often recorded lines are shipped (seconds, default 10 ms): how long a line
        may wait before the OS has it, and how much of it is lost if the process is
        killed. Each ship costs the producer a marshal and a pipe write.

    Notes
    -----
    Tracing never aborts the lifecycle it records: a write error switches the writer
    off and is kept in :attr:`error` for the caller to report once the allocation or
    its unwinding is complete. A writer that is never closed finishes its file when it
    is garbage-collected or at interpreter exit.
    """

    __slots__ = ("_on", "_buf", "_kick", "_flush_each", "path", "header_written",
                 "_sink", "_shipper", "_thread", "_errors", "_finalizer", "renderer",
                 "_latency_s", "_due", "__weakref__")

    def __init__(self, target: str | os.PathLike[str] | IO[str] | None = None, *,
                 flush_each: bool = False, renderer: str = "process",
                 latency_s: float = DEFAULT_LATENCY_S) -> None:
        if renderer not in ("process", "thread"):
            raise ValueError(f"renderer = {renderer!r}: must be 'process' or 'thread'")
        if not 0 < latency_s <= 1:
            raise ValueError(f"latency_s = {latency_s!r}: must be > 0 and at most 1 second")
        self._flush_each = flush_each
        self._latency_s = latency_s
        self._due = 0.0  # when the next pump ships
        self._errors: list[BaseException] = []
        self.header_written = False
        self.path: Path | None = None
        self.renderer: str | None = None  # where lines are formatted: process or thread
        # formats in this process (Renderer) or ships to the renderer process
        self._sink: Renderer | _InProcess | None = None
        self._shipper: _Shipper | None = None
        self._thread: threading.Thread | None = None
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
        self._kick = threading.Event()
        if self._sink is None:
            self._buf: list[Any] = []  # a disabled writer's (nothing reads it)
            return
        self._shipper = _Shipper(self._sink.feed)
        self._buf = self._shipper.buf
        self._thread = threading.Thread(target=_poll, args=(self._shipper, self._kick,
                                                            latency_s),
                                        name="kvgrant-trace", daemon=True)
        self._thread.start()
        self._finalizer = weakref.finalize(self, _stop_writer, self._shipper, self._kick,
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
        """Events written so far (the next ``seq``); flushes first."""
        self._drain()
        return self._sink.seq if self._sink is not None else 0

    def recorder(self) -> Callable[[tuple[Any, ...]], None]:
        """The hot path: a callable taking ``(template, clock(), *values)`` for one event.

        ``template`` comes from :func:`event_template` (or is any %-template whose first
        two placeholders are ``seq`` and ``t``); ``values`` fill the rest; ``seq`` is
        assigned when the line is formatted, without gaps, in call order. Only for an
        enabled writer. Call :meth:`pump` every few records, between driver calls.
        """
        if not self._flush_each:
            return self._buf.append

        def record_and_wait(rec: tuple[Any, ...]) -> None:
            self._buf.append(rec)
            self._drain()
        return record_and_wait

    def pump(self) -> None:
        """Ship what this thread recorded, at most once per ``latency_s``.

        For the producing thread, every few records, where a short stop costs nothing
        (between driver calls): shipping here is a marshal and a pipe write, whereas the
        writer thread's wakes made the producer wait for the GIL. Cheap when not due (a
        clock read); skips a ship the writer thread is doing at that moment.
        """
        now = clock()
        if now < self._due:
            return
        self._due = now + self._latency_s
        shipper = self._shipper
        if shipper is not None and shipper.lock.acquire(False):
            try:
                shipper.pumped = True
                shipper.ship()
            finally:
                shipper.lock.release()

    def header(self, **constants: Any) -> None:
        """Write the header line (must come first, once); ``t`` counts from here."""
        if not self._on:
            return
        if self.header_written or self._buf or (self._sink is not None and self._sink.seq):
            raise RuntimeError("trace header must be the first line and written once")
        line = {"kind": "header", "version": TRACE_VERSION}
        line.update(constants)
        self._buf.append([HEADER, _encode(line) + "\n", clock()])
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
        group event (``rank`` None) returns once it and every earlier line is on file;
        a rank event pumps (see :meth:`pump`).
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
        else:
            self.pump()

    def _drain(self) -> None:
        """Write everything recorded so far, in this thread, and wait until it is on
        file (flushed to the OS). Never raises: a write error switches the writer off
        (see :attr:`error`)."""
        shipper = self._shipper
        if shipper is None or not self._on:
            return
        with shipper.lock:
            shipper.buf.append([FLUSH])
            shipper.ship()
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
