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
path, an open text stream, or ``KVGRANT_TRACE`` (a file path; a switch word such as
``1`` is refused, it once wrote a trace to a file named ``1``).

When the file is made: at the first line shipped, not when the writer is made. The
renderer process starts up front (27-37 ms on the 2-core machine, more than a small
start-up), but the file is created or truncated only once there is a line to write and its descriptor is
then handed to the renderer over a socket; a run refused before its first event (bad
options, too few devices, a ledger refusal) leaves the file the user named as it was.
(A driver query that fails before the first reserve is a failure, and is traced:
:meth:`kvgrant.runtime.engine.Engine.setup_failed`.)
"""

from __future__ import annotations

import os
import socket
import stat
import subprocess
import sys
import time
import weakref
from pathlib import Path
from typing import IO, Any, Callable, Mapping

from kvgrant.errors import ArgumentError, TraceError
from kvgrant.runtime import trace_render
from kvgrant.runtime.arguments import is_switch_word
from kvgrant.traceformat import LIFECYCLE_VERSION, encode_json, event_line, event_template
from kvgrant.runtime.trace_render import (ALLOC_ENTRY, ALLOCS, DEFINE, FLUSH, HEADER, STOP,
                                          Renderer, alloc_spec, frame, read_frame)

__all__ = ["ALLOC_ENTRY", "DEFAULT_CHUNK", "TRACE_ENV", "TRACE_VERSION", "TraceWriter",
           "alloc_spec", "clock", "env_trace_path", "event_template", "open_trace"]

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

#: The renderer process's start: import the renderer, say ready, wait for the trace
#: file's descriptor (sent once there is a line to write) and run the renderer on it;
#: no descriptor (the writer closed without a line) means no file: exit at once.
_BOOT = """import socket, sys
sys.path.insert(0, sys.argv[1])
import trace_render
del sys.path[0]
sock = socket.socket(fileno=int(sys.argv[2]))
sock.sendall(b"R")
try:
    fds = socket.recv_fds(sock, 1, 1)[1]
except OSError:
    fds = []
sock.close()
sys.exit(trace_render.main(["trace_render", str(fds[0])]) if fds else 0)
"""


def _refusal(path: Path) -> str | None:
    """Why ``path`` cannot be opened for writing, found without creating or truncating
    anything (None: as far as can be told, it can). Why: the file is opened only at the
    first line, but a path that can never be written must still fail up front, before
    any driver exists."""
    try:
        st = os.stat(path)
    except FileNotFoundError:
        st = None
    except OSError as err:  # a parent that is a file, a loop of links, no search right
        return err.strerror or str(err)
    if st is not None:
        if stat.S_ISDIR(st.st_mode):
            return "Is a directory"
        return None if os.access(path, os.W_OK) else "Permission denied"
    folder = path.parent
    while not folder.exists() and folder != folder.parent:  # the parents are made later
        folder = folder.parent
    if not folder.is_dir():
        return f"{folder} is not a folder"
    if not os.access(folder, os.W_OK | os.X_OK):
        return f"Permission denied (cannot create files in {folder})"
    return None


def _create(path: Path, label: str) -> int:
    """Create or truncate the trace file (and its folders), at its first line: inside
    the timed start-up, so the folders are made only when they are missing."""
    flags = os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC
    try:
        try:
            return os.open(path, flags, 0o666)
        except FileNotFoundError:
            path.parent.mkdir(parents=True, exist_ok=True)
            return os.open(path, flags, 0o666)
    except OSError as err:
        raise TraceError(f"{label}: cannot open for writing: {err.strerror or err}"
                         ) from None


def _is_line(item: Any) -> bool:
    """Does record ``item`` write a line (an event, the header, allocation entries)?"""
    return item.__class__ is tuple or item[0] == HEADER or (item[0] == ALLOCS
                                                            and len(item[2]) > 0)


class _PendingFile:
    """The trace file of the in-process renderer, created (or truncated) at its first
    write: a run refused before its first event leaves the file as it was."""

    def __init__(self, path: Path, label: str) -> None:
        self.path = path
        self.label = label  # "trace = 'PATH'" or "KVGRANT_TRACE = 'PATH'", for errors
        self.fh: IO[str] | None = None

    def write(self, text: str) -> int:
        if self.fh is None:
            self.fh = os.fdopen(_create(self.path, self.label), "w", encoding="ascii",
                                buffering=1 << 16)
        return self.fh.write(text)

    def flush(self) -> None:
        if self.fh is not None:
            self.fh.flush()

    def close(self) -> None:
        if self.fh is not None:
            self.fh.close()


class _InProcess:
    """Ships records to a renderer process (trace files): this process only marshals
    them and writes them to a pipe; the renderer formats and writes the lines. The file
    is opened here at the first line and its descriptor sent to the renderer."""

    def __init__(self, path: Path, label: str, errors: list[BaseException]) -> None:
        self.errors = errors
        self.seq = 0
        self.path = path
        self.label = label  # "trace = 'PATH'" or "KVGRANT_TRACE = 'PATH'", for errors
        self.opened = False          # the file exists and the renderer has it
        self.held: list[Any] = []    # spec definitions received before the first line
        self.dead = False
        self.sock, child = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            self.proc = subprocess.Popen(
                [sys.executable, "-I", "-S", "-c", _BOOT, os.path.dirname(_RENDER_SCRIPT),
                 str(child.fileno())], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                pass_fds=(child.fileno(),), bufsize=0,
                # its own session: a Ctrl-C meant for the allocation (which then unwinds
                # and traces Abort) must not kill the renderer first
                start_new_session=True)
        except BaseException:
            self.sock.close()
            raise
        finally:
            child.close()
        self.to_child = self.proc.stdin.fileno()  # type: ignore[union-attr]
        self.from_child = self.proc.stdout  # type: ignore[assignment]
        try:  # room for a whole chunk while the renderer catches up (Linux)
            import fcntl

            fcntl.fcntl(self.to_child, getattr(fcntl, "F_SETPIPE_SZ", 1031), 1 << 20)
        except (ImportError, OSError):
            pass
        try:  # handshake: a renderer that cannot run fails here, not mid-allocation
            ready = self.sock.recv(1)
        except OSError as err:
            ready = str(err).encode()
        if ready != b"R":
            self.sock.close()
            self.proc.kill()
            self.proc.communicate()  # reaps it and closes both pipes
            raise OSError(f"trace renderer process did not start: {ready!r}")

    def _open(self) -> None:
        """Create the file and hand its descriptor to the renderer (first line)."""
        self.opened = True
        try:
            fd = _create(self.path, self.label)
        except TraceError as err:
            self.errors.append(err)
            self.dead = True   # nothing more is sent; the renderer exits without a file
            self.sock.close()
            return
        try:
            socket.send_fds(self.sock, [b"F"], [fd])
        except OSError:
            self._lost()
        finally:
            os.close(fd)
            self.sock.close()

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
        if not self.opened:
            if not any(_is_line(item) for item in items):  # no file yet, none needed
                self.held += [x for x in items if x.__class__ is list and x[0] == DEFINE]
                if items[-1].__class__ is list and items[-1][0] == STOP:
                    self._end()
                    return True
                return False
            items = self.held + items
            self.held = []
            self._open()
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
        self._end()
        return True

    def _end(self) -> None:
        """Close the pipes (and the socket, if the file was never sent) and reap the
        renderer."""
        self.sock.close()
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
        A path (the file is created or truncated at the first line written, so a run
        refused before its first event leaves it as it was; a path that cannot be
        written is refused here), an open text stream (left open on :meth:`close`),
        or None (tracing off).
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
    source
        What named the path, for error messages: ``"trace"`` (the argument) or
        ``KVGRANT_TRACE`` when :func:`open_trace` read it from the environment.

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
                 renderer: str = "process", chunk: int = DEFAULT_CHUNK,
                 source: str = "trace") -> None:
        from kvgrant.runtime.arguments import check_trace_target, fail

        if not isinstance(renderer, str) or renderer not in ("process", "thread"):
            raise fail("renderer", renderer, "must be 'process' or 'thread'")
        if isinstance(chunk, bool) or not isinstance(chunk, int) or chunk < 1:
            raise fail("chunk", chunk, "must be an integer >= 1")
        if isinstance(target, TraceWriter):
            raise fail("target", target, "must be None, a file path or a text stream (a "
                                         "TraceWriter is passed to allocate() as it is)")
        check_trace_target("target", target)  # TraceWriter(5) took an int as a stream
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
            where = Path(os.path.abspath(self.path))  # opened later: not in another cwd
            label = f"{source} = {str(self.path)!r}"
            why = _refusal(where)
            if why is not None:
                raise TraceError(f"{label}: cannot open for writing: {why}")
            if renderer == "process":
                try:
                    self._sink = _InProcess(where, label, self._errors)
                    self.renderer = "process"
                except (OSError, ValueError):
                    pass  # no process here (no executable, no pass_fds): format in-process
            if self._sink is None:
                self._sink = Renderer(_PendingFile(where, label), True,  # type: ignore[arg-type]
                                      _no_ack, self._errors)
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
    def closed(self) -> bool:
        """True once :meth:`close` ran on a writer that had a target (a disabled writer
        is never closed: it writes nothing either way)."""
        return self._sink is not None and self._finalizer is None

    @property
    def used(self) -> bool:
        """True once anything was recorded (a header at least): the writer holds one
        trace, and a second allocation must have its own."""
        return self.header_written or bool(self._buf) or bool(
            self._sink is not None and self._sink.seq)

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

    def ship(self) -> None:
        """Hand everything recorded so far to the renderer, without waiting: once
        shipped, a line reaches the file even when this process is killed (the renderer
        outlives it). For events another process can observe the effect of (a Send)."""
        if self._on:
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


def env_trace_path(env: Mapping[str, str] | None = None) -> str | None:
    """The trace path ``KVGRANT_TRACE`` names; None when it is unset or empty.

    Why a rule: the variable is a file path, and ``KVGRANT_TRACE=1`` (or ``true``,
    ``yes``, ``on``) wrote the trace to a file named ``1`` in the working folder, while
    ``0``/``off`` wrote one named ``0``. A switch word is refused rather than guessed.

    Raises
    ------
    ArgumentError
        The value is a switch word or blank (``argument`` is ``KVGRANT_TRACE``).
    """
    environ = os.environ if env is None else env
    raw = environ.get(TRACE_ENV, "")
    if not raw:
        return None
    if is_switch_word(raw):
        raise ArgumentError(
            f"{TRACE_ENV} = {raw!r}: must be a file path (the trace file to write), not a "
            "switch; set it to a path such as trace.ndjson, or unset it (or set it empty) "
            "for no trace", argument=TRACE_ENV, value=raw)
    return raw


def open_trace(trace: "str | os.PathLike[str] | IO[str] | TraceWriter | None" = None, *,
               env: Mapping[str, str] | None = None) -> TraceWriter:
    """The writer for an ``allocate(trace=...)`` argument.

    An explicit ``trace`` wins; else ``KVGRANT_TRACE=path`` switches tracing on (see
    :func:`env_trace_path`; its errors name the variable); else a disabled writer. A
    :class:`TraceWriter` passes through unchanged.
    """
    if isinstance(trace, TraceWriter):
        return trace
    if trace is not None:
        from kvgrant.runtime.arguments import check_trace_target

        check_trace_target("trace", trace)  # was: ValueError: embedded null byte
        return TraceWriter(trace)
    path = env_trace_path(env)
    return TraceWriter(path, source=TRACE_ENV) if path else TraceWriter(None)
