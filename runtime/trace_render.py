"""Trace renderer process: turns a trace writer's event records into NDJSON lines.

Why a process: formatting ~10^5 JSON lines in the allocator's own interpreter costs
start-up time (in the allocating thread, or in a helper thread through GIL hand-overs).
The allocating process only sends marshalled records through a pipe; this process,
with its own interpreter, formats and writes them as they arrive.

Stand-alone on purpose (standard library only, run as ``python -I trace_render.py FD``)
so it starts in milliseconds without importing kvgrant.

Protocol on stdin: frames of a 4-byte little-endian length and a ``marshal`` payload,
a list of items: a ``str`` (a finished line), ``(-1, tid, template)`` (register a
%-template), ``(tid, seq, t, values)`` (an event: ``template % (seq, t, *values)``),
or ``None`` (flush the file). End of input: flush, close, exit 0. A write error is
printed to stderr and the exit status is 3.
"""

import marshal
import os
import sys


def _read_exact(src, n: int) -> bytes:
    data = src.read(n)
    return data if data is not None else b""


def main(argv: list[str]) -> int:
    fd = int(argv[1])
    out = os.fdopen(fd, "w", encoding="ascii", buffering=1 << 20)
    src = sys.stdin.buffer
    templates: dict[int, str] = {}
    failed = None
    while True:
        head = _read_exact(src, 4)
        if len(head) < 4:
            break
        body = _read_exact(src, int.from_bytes(head, "little"))
        if failed is not None:
            continue  # keep draining so the writer never blocks on a full pipe
        try:
            lines = []
            for item in marshal.loads(body):
                if item.__class__ is str:
                    lines.append(item)
                elif item is None:
                    out.write("".join(lines))
                    lines = []
                    out.flush()
                elif item[0] == -1:
                    templates[item[1]] = item[2]
                else:
                    lines.append(templates[item[0]] % (item[1], item[2], *item[3]))
            out.write("".join(lines))
        except Exception as err:  # reported to the writer through stderr + status
            failed = err
    try:
        if failed is None:
            out.close()
    except Exception as err:
        failed = err
    if failed is not None:
        print(f"{type(failed).__name__}: {failed}", file=sys.stderr)
        return 3
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
