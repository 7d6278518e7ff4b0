"""Transition traces: one NDJSON line per lifecycle transition, as it happens.

The format is docs/INTERFACES.md "Trace format": a header line holding the model's
constants, then one ``event`` line per transition with ``seq``, ``rank``, ``action``
(spec name), ``args``, driver ``call`` and ``result``, ``device``, ``va``, ``size``,
time ``t`` and the abstract ``state`` after the event. JSON only, no ad-hoc format.

Why this shape: tracing must be cheap when on (a few percent of a start-up whose
driver calls take 30-40 us each) and free when off (callers test
:attr:`TraceWriter.enabled` before building an event). The allocating thread only
appends one tuple per event to a list (:meth:`TraceWriter.recorder`: no lock, no queue,
no formatting, no ``seq`` bookkeeping). A writer thread takes that list every
``latency_s`` (10 ms by default) while records come. For a trace file it marshals them
into a pipe to a renderer process (:mod:`kvgrant.runtime.trace_render`) that numbers,
formats and writes the lines: formatting in this process held the GIL, and the
allocating thread waited for it at every return from a driver call. For a stream the
thread formats them itself. Why not 1 ms: each wake of the writer thread can make the
allocating thread wait for the GIL when it returns from a driver call (docs/allocator.md
has the designs measured on an H200 host and what each cost, 1, 10 and 50 ms
included). Lines reach the OS within about ``latency_s`` of the transition, and every
group event (Publish, Abort, ...) waits until all earlier lines are on file. Tracing is
switched on by a path, an open text stream, or ``KVGRANT_TRACE``.
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

__all__ = ["DEFAULT_LATENCY_S", "TRACE_ENV", "TRACE_VERSION", "TraceWriter", "clock",
           "event_template", "open_trace"]

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

#: How long a recorded line may wait before the writer thread ships it (while records
#: come; once none came for a while it backs off to _IDLE_S, and flushes and group events
#: wake it at once).
DEFAULT_LATENCY_S = 0.01
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


def _poll(buf: list[Any], kick: threading.Event, feed: Callable[[list[Any]], bool],
          latency_s: float) -> None:
    """The writer thread: hand what the allocating thread appended to ``feed`` (a
    :class:`Renderer`'s, or :class:`_InProcess`'s), in order, until it reports the stop
    record. It sleeps ``latency_s`` after every batch, even when more records came
    meanwhile, so a start-up of T seconds wakes it about T / latency_s times."""
    idle_s = max(_IDLE_S, latency_s)
    wait = latency_s
    while True:
        kick.wait(wait)  # flushes, group events and the stop record kick it
        kick.clear()
        n = len(buf)
        if not n:
            # idle (e.g. while the published cache lives): back off to idle_s
            wait = min(wait * 2, idle_s)
            continue
        wait = latency_s
        items = buf[:n]
        del buf[:n]  # the allocating thread only appends, so these n are ours
        if feed(items):
            return


def _release_waiter(item: list[Any]) -> None:
    """Acknowledge a control record formatted in this process: wake the flusher."""
    if item[0] == FLUSH:
        item[1].set()


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
        """Ship ``items``; wait for the renderer's acknowledgements; True after stop."""
        waiters: list[list[Any]] = []
        for i, item in enumerate(items):
            if item.__class__ is list and item[0] != HEADER:
                waiters.append(item)
                items[i] = [item[0]]  # the Event stays here
        if not self.dead:
            try:
                data = frame(items)
                view = memoryview(data)
                while view:
                    view = view[os.write(self.to_child, view):]
            except OSError:
                self._lost()
        for item in waiters:
            if not self.dead:
                try:
                    self.seq, err = read_frame(self.from_child)  # type: ignore[arg-type]
                    if err is not None and not self.errors:
                        self.errors.append(TraceError(f"writing the trace failed: {err}"))
                except (EOFError, OSError, ValueError):
                    self._lost()
            if item[0] == STOP:
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
            item[1].set()
        return False


def _stop_writer(buf: list[Any], kick: threading.Event, thread: threading.Thread) -> None:
    """Finaliser of a writer nobody closed: let its thread finish the file and end."""
    buf.append([STOP])
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
        otherwise rank events reach the file within about ``latency_s``, and group
        events (Publish, Abort, ...) wait for all earlier lines.
    renderer
        Where a trace *file* is formatted: ``"process"`` (default; a small Python
        process fed through a pipe, so formatting never holds this process's GIL, and
        lines already shipped survive this process being killed) or ``"thread"``
        (in this process; also the fallback when no process can be started). Streams
        are always formatted in the writer thread.
    latency_s
        How often the writer thread takes what was recorded (seconds, default 10 ms):
        how long a line may wait before the OS has it, and how much of it is lost if
        the process is killed. Shorter costs start-up time: each wake of the writer
        thread can make the allocating thread wait for the GIL.

    Notes
    -----
    Tracing never aborts the lifecycle it records: a write error switches the writer
    off and is kept in :attr:`error` for the caller to report once the allocation or
    its unwinding is complete. A writer that is never closed finishes its file when it
    is garbage-collected or at interpreter exit.
    """

    __slots__ = ("_on", "_buf", "_kick", "_flush_each", "path", "header_written",
                 "_sink", "_thread", "_errors", "_finalizer", "renderer", "__weakref__")

    def __init__(self, target: str | os.PathLike[str] | IO[str] | None = None, *,
                 flush_each: bool = False, renderer: str = "process",
                 latency_s: float = DEFAULT_LATENCY_S) -> None:
        if renderer not in ("process", "thread"):
            raise ValueError(f"renderer = {renderer!r}: must be 'process' or 'thread'")
        if not 0 < latency_s <= 1:
            raise ValueError(f"latency_s = {latency_s!r}: must be > 0 and at most 1 second")
        # records not yet taken by the writer thread: a tuple (template, clock(), *values)
        # per event, or a control record (a list, see trace_render)
        self._buf: list[Any] = []
        self._kick = threading.Event()
        self._flush_each = flush_each
        self._errors: list[BaseException] = []
        self.header_written = False
        self.path: Path | None = None
        self.renderer: str | None = None  # where lines are formatted: process or thread
        # formats in the writer thread (Renderer) or ships to the renderer process
        self._sink: Renderer | _InProcess | None = None
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
                    pass  # no process here (no executable, no pass_fds): format in a thread
            if self._sink is None:
                self._sink = Renderer(fh, True, _release_waiter, self._errors)
                self.renderer = "thread"
        elif target is not None:
            self._sink = Renderer(target, False, _release_waiter, self._errors)
            self.renderer = "thread"
        self._on = self._sink is not None
        if self._sink is not None:
            self._thread = threading.Thread(target=_poll,
                                            args=(self._buf, self._kick, self._sink.feed,
                                                  latency_s),
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
        return self._sink.seq if self._sink is not None else 0

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

    def _drain(self) -> None:
        """Wait until everything recorded is on file (flushed to the OS).
        Never raises: a write error switches the writer off (see :attr:`error`)."""
        thread = self._thread
        if thread is None or not self._on:
            return
        done = threading.Event()
        self._buf.append([FLUSH, done])
        self._kick.set()
        while not done.wait(0.5):
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
