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

Allocations, the hot path: one binary entry (:data:`ALLOC_ENTRY`) per allocation stands
for its ``Create``, ``Map``, ``MapAlias``, ``Grant`` (plane) and ``Grant`` (alias)
events, or for the first ``done`` of them when a step failed. ``["D", key, spec]``
defines a rank's spec: the templates of those events and the devices each grant adds
(:func:`alloc_spec`); ``["A", key, entries]`` carries packed entries. Why: building one
tuple per event and marshalling it was most of tracing's cost (about 1.2 us per event);
one ``struct.pack`` per allocation into a bytearray is a fraction of that, and the bytes
ship as they are.

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
from typing import IO, Any, Callable, Iterator

HEADER, FLUSH, STOP, DEFINE, ALLOCS = "H", "F", "S", "D", "A"
_LEN = struct.Struct("<I")

#: One allocation: region (0: none, k: the spec's k-th alias grant), done (events that
#: happened), alloc, handle, plane VA, alias VA, size, the rank's created, mapped,
#: alias_mapped and grants counters after the last event that happened, then the clock
#: value of each event in order (0.0 for those that did not happen).
ALLOC_ENTRY = struct.Struct("<11q5d")


def alloc_spec(create: str, map_: str, map_alias: str, grant: str, plane_devices: int,
               alias_grants: "list[tuple[str, int]]") -> tuple[Any, ...]:
    """A rank's allocation spec: the line templates of Create, Map, MapAlias and the plane
    Grant, how many devices that grant adds, and per region (entry region k at index
    k - 1) its alias Grant template and devices."""
    return (create, map_, map_alias, grant, plane_devices, tuple(alias_grants))


def alloc_records(spec: tuple[Any, ...], entries: bytes) -> Iterator[tuple[Any, ...]]:
    """The event records ``(template, t, *values)`` that packed allocation ``entries``
    of ``spec`` stand for, in order."""
    create, map_, map_alias, grant, kp, alias_grants = spec
    for (region, done, i, h, pva, ava, n, c, m, am, g,
         *times) in ALLOC_ENTRY.iter_unpack(entries):
        if region:
            t_ga, ka = alias_grants[region - 1]
            events = ((create, (i, n, h), 1, 0, 0, 0), (map_, (i, pva, n, h), 0, 1, 0, 0),
                      (map_alias, (i, ava, n, h), 0, 0, 1, 0), (grant, (i, pva, n), 0, 0, 0, kp),
                      (t_ga, (i, ava, n), 0, 0, 0, ka))[:done]
        else:
            events = ((create, (i, n, h), 1, 0, 0, 0), (map_, (i, pva, n, h), 0, 1, 0, 0),
                      (grant, (i, pva, n), 0, 0, 0, kp))[:done]
        # counters after each event: the entry's (after the last one) less what the
        # events after it added
        after: list[tuple[int, int, int, int]] = []
        for _tpl, _values, dc, dm, dam, dg in reversed(events):
            after.append((c, m, am, g))
            c, m, am, g = c - dc, m - dm, am - dam, g - dg
        after.reverse()
        for k, (tpl, values, *_deltas) in enumerate(events):
            yield (tpl, times[k], *values, *after[k])


def expand_allocs(spec: tuple[Any, ...], entries: bytes, seq: int, t0: float,
                  lines: list[str]) -> int:
    """Append the event lines of packed allocation ``entries``; returns the next seq."""
    for rec in alloc_records(spec, entries):
        lines.append(rec[0] % (seq, rec[1] - t0, *rec[2:]))
        seq += 1
    return seq


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
        self.specs: dict[Any, tuple[Any, ...]] = {}

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
            if kind == ALLOCS:  # after a write error only counted, like events
                try:
                    seq = expand_allocs(self.specs[item[1]], item[2], seq, t0,
                                        [] if self.errors else lines)
                except BaseException as err:  # a malformed record: report, go on
                    self.errors.append(err)
                continue
            if kind == DEFINE:
                self.specs[item[1]] = tuple(item[2])
                continue
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
