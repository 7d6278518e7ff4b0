"""Turns trace records into NDJSON lines, in order, with ``seq`` numbers.

Used in two places: in the writer thread of a trace written to a stream, and as the
renderer process that :class:`kvgrant.runtime.trace.TraceWriter` starts for a trace
file (``python -I -S trace_render.py FD``). Why a process: formatting ~15k lines per
start-up inside the allocating process holds the GIL, and the allocating thread then
waits for it each time it comes back from a driver call (measured on an H200 host:
+8% of start-up inside driver calls; docs/allocator.md). So this file is a script too,
standard library only, and must not import kvgrant.

Records: an event is a tuple ``(template, t, *values)`` whose template's first two
placeholders are ``seq`` and ``t`` (``t`` is made relative to the header's clock
value). A control record is a list: ``["H", header_line, t0]``, ``["F", ...]`` (write
and flush everything so far, then acknowledge), ``["S", ...]`` (the same, then close).

Pipe protocol of the process: frames of a 4-byte little-endian length and a
``marshal``-ed list of records on stdin; one frame ``marshal((seq, error or None))``
on stdout per ``F`` or ``S`` (the parent sends at most one of them per frame, as its
last record). End of stdin (the parent died) writes what came and exits.
"""

from __future__ import annotations

import marshal
import os
import struct
import sys
from typing import IO, Any, Callable

HEADER, FLUSH, STOP = "H", "F", "S"
_LEN = struct.Struct("<I")


class Renderer:
    """Numbers, formats and writes records. A write error is kept in ``errors`` and
    later lines are dropped; control records are still acknowledged, so nobody waits
    forever."""

    def __init__(self, fh: IO[str], owns: bool, ack: Callable[[list[Any]], None],
                 errors: list[BaseException] | None = None) -> None:
        self.fh = fh
        self.owns = owns
        self.ack = ack
        self.errors: list[BaseException] = [] if errors is None else errors
        self.seq = 0
        self.t0 = 0.0

    def _write(self, lines: list[str]) -> None:
        if self.errors or not lines:
            return
        try:
            self.fh.write("".join(lines))
            self.fh.flush()
        except BaseException as err:
            self.errors.append(err)

    def feed(self, items: list[Any]) -> bool:
        """Render ``items``: one write per call (and per flush); True after ``S``."""
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
            kind = item[0]
            if kind == HEADER:
                lines.append(item[1])
                t0 = item[2]
                continue
            self.seq, self.t0 = seq, t0
            self._write(lines)
            lines = []
            if kind == STOP:
                if self.owns:
                    try:
                        self.fh.close()
                    except BaseException as err:
                        self.errors.append(err)
                self.ack(item)
                return True
            self.ack(item)
        self.seq, self.t0 = seq, t0
        self._write(lines)
        return False


def frame(obj: Any) -> bytes:
    data = marshal.dumps(obj)
    return _LEN.pack(len(data)) + data


def read_frame(src: IO[bytes]) -> Any:
    """The next frame's object; EOFError at the end of the stream."""
    head = src.read(4)
    if len(head) < 4:
        raise EOFError
    (n,) = _LEN.unpack(head)
    data = src.read(n)
    if len(data) < n:
        raise EOFError
    return marshal.loads(data)


def main(argv: list[str]) -> int:
    fh = os.fdopen(int(argv[1]), "w", encoding="ascii", buffering=1 << 16)
    src = os.fdopen(0, "rb", buffering=1 << 20)
    out = os.fdopen(1, "wb", buffering=0)
    errors: list[BaseException] = []

    def ack(_item: list[Any]) -> None:
        err = f"{type(errors[0]).__name__}: {errors[0]}" if errors else None
        out.write(frame((renderer.seq, err)))

    renderer = Renderer(fh, True, ack, errors)
    while True:
        try:
            items = read_frame(src)
        except EOFError:  # the allocating process is gone: keep what came
            renderer.ack = lambda _item: None
            renderer.feed([[STOP]])
            return 0
        if renderer.feed(items):
            return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
