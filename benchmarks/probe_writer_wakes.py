"""What does the trace writer's wake interval cost, without a GPU?

Emulates a start-up on any machine: N calls that, like the CUDA driver's, run without
the GIL (hashlib over 48 KiB, about 30 us), with one trace record per call. Runs in
random order per round: untraced; ``hotpath`` (records go to a bounded deque: no
writer); ``RENDERER@MS`` (a real TraceWriter with that renderer and latency_s, pumped
once per 4 records as the allocator does once per allocation); ``unpumped-RENDERER@MS``
(the same, never pumped: the writer thread ships everything, as before pumps). Reports
the mean difference from the round's untraced run, in total and inside the calls (where
waiting for the GIL shows up). An emulation: the driver's own behaviour (locks,
interrupts, memory traffic) is not in it, so use it to compare writer settings, and
benchmarks/bench_startup.py on a GPU host for the figure that counts.

Usage::

    python benchmarks/probe_writer_wakes.py --rounds 30 \\
        --variants hotpath,process@1,process@10,process@50,thread@10
"""

from __future__ import annotations

import argparse
import collections
import hashlib
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Callable, Sequence

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_startup import ab_rounds, ci_line  # noqa: E402

from kvgrant.gc_pause import gc_paused  # noqa: E402
from kvgrant.runtime.trace import (DEFAULT_LATENCY_S, TraceWriter, clock,  # noqa: E402
                                    event_template)

_TPL = event_template(0, "Map", '{"alloc": %d}', "cuMemMap", "CUDA_SUCCESS", 0, "%d", "%d",
                      '{"created": %d, "mapped": %d, "alias_mapped": %d, "grants": %d}')
_DATA = bytes(48 * 1024)


def _run(variant: str, calls: int, tmp: Path) -> tuple[float, float]:
    """(total seconds, seconds inside the GIL-free calls) of one emulated start-up."""
    writer: TraceWriter | None = None
    rec: Callable[[tuple[Any, ...]], None] | None = None
    pump: Callable[[], None] | None = None
    if variant == "hotpath":
        rec = collections.deque(maxlen=64).append
        pump = TraceWriter(None).pump  # its clock check; nothing to ship
    elif variant != "off":
        renderer, _, ms = variant.partition("@")
        unpumped = renderer.startswith("unpumped-")
        writer = TraceWriter(tmp / "t.ndjson", renderer=renderer.removeprefix("unpumped-"),
                             latency_s=float(ms) / 1000 if ms else DEFAULT_LATENCY_S)
        writer.header(ranks=1)
        rec = writer.recorder()
        pump = None if unpumped else writer.pump
    inside = 0.0
    digest = hashlib.sha256
    with gc_paused():
        t0 = time.perf_counter()
        for i in range(calls):
            a = time.perf_counter()
            digest(_DATA).digest()  # releases the GIL, like a driver call
            inside += time.perf_counter() - a
            if rec is not None:
                rec((_TPL, clock(), i, 4096 * i, 2097152, i + 1, i + 1, 0, 0))
                if pump is not None and not i & 3:  # the allocator pumps once per allocation
                    pump()
        total = time.perf_counter() - t0
    if writer is not None:
        writer.close()
    return total, inside


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=30)
    ap.add_argument("--calls", type=int, default=14_000, help="records per start-up")
    ap.add_argument("--variants", default="hotpath,process@1,process@10,process@50,thread@10")
    ap.add_argument("--seed", type=int, default=1)
    args = ap.parse_args(argv)
    variants = args.variants.split(",")
    tmp = Path(tempfile.mkdtemp())
    rows = ab_rounds(lambda v: _run(v, args.calls, tmp), variants, args.rounds, args.seed)
    off = statistics.median(r["off"][0] for r in rows)
    print(f"{args.calls:,} emulated calls, {args.rounds} rounds, untraced median {off:.3f} s "
          f"({off / args.calls * 1e6:.1f} us per call)")
    for v in variants:
        total = [(r[v][0] - r["off"][0]) / off for r in rows]
        inside = [(r[v][1] - r["off"][1]) / off for r in rows]
        print(ci_line(v, (("total", total), ("inside calls", inside))))
    return 0


if __name__ == "__main__":
    sys.exit(main())
