"""Which part of tracing costs start-up time? A/B rounds on one packed plan.

Each round runs, in random order, untraced and each variant; a variant is compared
with the untraced run of its round: mean relative difference with a 95% bootstrap
interval, split into kvgrant's own time and time inside driver calls (where GIL waits
and memory effects show up). Rounds share their untraced run, so compare variants with
each other, not only with zero. Variants, from least to most of the real writer:

- ``hotpath``: records go to a 64-slot deque (the allocator's per-event work only);
- ``keep``: records are kept in a list until release (adds their memory, no thread);
- ``idlethread``: untraced, plus a Python thread waking every millisecond;
- ``drop@MS``: the real shipping (pumps every MS ms, the writer thread behind
  them), records dropped;
- ``devnull@MS``: the real writer and renderer process, writing to /dev/null;
- ``process@MS`` / ``thread@MS``: the real writer, renderer process or in-process
  thread, writing a file (``@MS`` may be left out: the writer's default latency).

Usage (2 GPUs)::

    python benchmarks/probe_trace_parts.py --rounds 30
"""

from __future__ import annotations

import argparse
import collections
import statistics
import sys
import tempfile
import threading
from pathlib import Path
from typing import Any, Callable, Sequence

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_startup import TimedDriver, ab_rounds, ci_line  # noqa: E402

from kvgrant.layout.geometry import load_geometry, on_ranks, parse_geometry  # noqa: E402
from kvgrant.layout.plans import make_plan  # noqa: E402
from kvgrant.runtime.allocator import allocate  # noqa: E402
from kvgrant.runtime.capacity import fit_pages  # noqa: E402
from kvgrant.runtime.driver import open_driver  # noqa: E402
from kvgrant.runtime import trace as trace_mod  # noqa: E402
from kvgrant.runtime.trace import TraceWriter  # noqa: E402

VARIANTS = ("hotpath", "keep", "drop@10", "devnull@10", "process@10")


class HotPathOnly(TraceWriter):
    """Enabled, but every record lands in ``sink`` (a 64-slot deque by default): no
    thread, no formatting."""

    __slots__ = ("_sunk",)

    def __init__(self, sink: Any = None) -> None:
        super().__init__(None)
        self._on = True
        self._sunk = collections.deque(maxlen=64) if sink is None else sink

    def recorder(self) -> Callable[[tuple[Any, ...]], None]:
        return self._sunk.append

    def header(self, **constants: Any) -> None:
        pass

    def event_json(self, *args: Any, **kwargs: Any) -> None:
        pass

    def close(self) -> None:
        self._on = False


class DroppingWriter(HotPathOnly):
    """The real shipping (the allocating thread's pumps every ``latency_s``, the writer
    thread trace._poll behind them) with a feed that drops the records: no marshal,
    pipe or file."""

    __slots__ = ("_thread_",)

    def __init__(self, latency_s: float) -> None:
        shipper = trace_mod._Shipper(self._drop)
        super().__init__(sink=shipper.buf)
        self._shipper = shipper
        self._latency_s = latency_s
        self._thread_ = threading.Thread(target=trace_mod._poll,
                                         args=(shipper, self._kick, latency_s), daemon=True)
        self._thread_.start()

    @staticmethod
    def _drop(items: list[Any]) -> bool:
        return items[-1].__class__ is list  # the stop record

    def close(self) -> None:
        if self._on:
            self._on = False
            self._sunk.append(["S"])
            self._kick.set()
            self._thread_.join()


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("geometry", nargs="?", default="examples/published-dcp16.json")
    ap.add_argument("--ranks", type=int, default=2)
    ap.add_argument("--backend", choices=("cuda", "sim"), default="cuda")
    ap.add_argument("--rounds", type=int, default=30)
    ap.add_argument("--variants", default=",".join(VARIANTS))
    args = ap.parse_args(argv)
    variants = args.variants.split(",")
    g = on_ranks(load_geometry(args.geometry), args.ranks)
    opts = {"devices": args.ranks} if args.backend == "sim" else {}
    drv = TimedDriver(open_driver(args.backend, **opts))
    fit = fit_pages(g, {d: drv.free_memory(d)[0] for d in range(args.ranks)}, "-8G")
    if fit.reduced:
        g = parse_geometry({**g.model_dump(), "pages": fit.pages})
    plan = make_plan(g, "packed")
    tmp = Path(tempfile.mkdtemp())

    def run(v: str) -> dict[str, float]:
        trace: TraceWriter | None = None
        stop = threading.Event()
        idle = None
        name, _, ms = v.partition("@")
        latency = {"latency_s": float(ms) / 1000} if ms else {}
        if name == "hotpath":
            trace = HotPathOnly()
        elif name == "keep":
            trace = HotPathOnly(sink=[])
        elif name == "drop":
            trace = DroppingWriter(float(ms) / 1000 if ms else trace_mod.DEFAULT_LATENCY_S)
        elif name == "devnull":
            trace = TraceWriter("/dev/null", renderer="process", **latency)
        elif name == "idlethread":
            idle = threading.Thread(target=lambda: [None for _ in iter(
                lambda: stop.wait(0.001), True)])
            idle.start()
        elif name != "off":  # a renderer (TraceWriter refuses unknown ones)
            trace = TraceWriter(tmp / f"{name}.ndjson", renderer=name, **latency)
        drv.reset()
        pub = allocate(g, plan=plan, driver=drv, trace=trace, check_contract=False,
                       preflight=False)
        inside = drv.seconds
        stop.set()
        if idle is not None:
            idle.join()
        pub.release()
        return {"s": pub.startup_s, "d": inside}

    try:
        rows = ab_rounds(run, variants, args.rounds, seed=5)
    finally:
        drv.close()
    off_med = statistics.median(r["off"]["s"] for r in rows)
    print(f"{g.name} on {args.ranks} ranks ({args.backend}), {args.rounds} rounds, untraced "
          f"median start-up {off_med:.4f} s")
    for v in variants:
        rel = [r[v]["s"] / r["off"]["s"] - 1 for r in rows]
        own = [((r[v]["s"] - r[v]["d"]) - (r["off"]["s"] - r["off"]["d"])) / off_med
               for r in rows]
        inside = [(r[v]["d"] - r["off"]["d"]) / off_med for r in rows]
        print(ci_line(v, (("start-up", rel), ("own", own), ("driver", inside))))
    return 0


if __name__ == "__main__":
    sys.exit(main())
