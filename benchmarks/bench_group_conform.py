"""The Python group engine on a 16-process published-scale group (issue 13, item 6:
under 2 s): events, CPU and wall seconds of ``kvgrant conform DIR`` 's check.

The group is written once by the group model's generator
(:func:`kvgrant.conformance.group_gen.simulate_group`) in the runtime's format, for the
published-dcp8 layout on its 16 ranks and the first ``--allocs`` allocations of its
packed plan (0: all of them; 450 gives about 340k events, all about 1M), or read from
``--dir``. Then it is checked ``--repeats`` times as the command checks it
(:func:`kvgrant.conformance.group_check.check_group`: the fast path, else the full
replay; here the fast path alone, which accepts a clean group); ``--full`` also times the
full replay (read + per-event model steps); ``--jobs N`` checks N files at once in worker
processes (CPU is then the parent's only).

    .venv/bin/python benchmarks/bench_group_conform.py --allocs 450 --repeats 3 --full
    .venv/bin/python benchmarks/bench_group_conform.py --allocs 0 --keep /tmp/g16
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Callable

ROOT = Path(__file__).resolve().parent.parent


def write_published_group(out: Path, allocs: int, geometry: str) -> int:
    """Write the 16 files of a clean published group; returns the allocation count."""
    from kvgrant.conformance.group_gen import simulate_group, write_group
    from kvgrant.conformance.group_model import constants_from
    from kvgrant.layout.geometry import load_geometry
    from kvgrant.layout.plans import make_plan

    g = load_geometry(ROOT / geometry)
    plan = make_plan(g, "packed").allocations
    plan = plan[:allocs] if allocs else plan
    aliased = [i for i, a in enumerate(plan) if a.region is not None]
    access = {r.name: r.access for r in g.regions}
    owner_only = [i for i in aliased if access[plan[i].region] == "owner"]
    n = g.topology.ranks
    c = constants_from(n, len(plan), aliased, owner_only, {r: g.importers(r) for r in range(n)},
                       {r: g.declared_readers(r) for r in range(n)})
    write_group(simulate_group(c, shutdown=False), out)
    return len(plan)


def _timed(fn: Callable[[], Any]) -> tuple[Any, float, float]:
    w, c = time.perf_counter(), time.process_time()
    out = fn()
    return out, time.process_time() - c, time.perf_counter() - w


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--geometry", default="examples/published-dcp8.json")
    ap.add_argument("--allocs", type=int, default=450,
                    help="first N allocations of the packed plan (0: all)")
    ap.add_argument("--dir", type=Path, help="check this group instead of writing one")
    ap.add_argument("--keep", type=Path, help="write the group here and keep it")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--full", action="store_true", help="also time the full replay")
    ap.add_argument("--jobs", type=int, default=1,
                    help="fast path: files checked at once in worker processes")
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args(argv)

    from kvgrant.conformance.group_fast import fast_accept
    from kvgrant.conformance.group_io import load_group
    from kvgrant.conformance.group_replay import replay_group

    tmp = None
    if a.dir is not None:
        d, allocs = a.dir, None
    else:
        d = a.keep or Path(tempfile.mkdtemp(prefix="kvgrant-g16-"))
        tmp = None if a.keep else d
        allocs, gen_s, gen_wall = _timed(lambda: write_published_group(d, a.allocs, a.geometry))
        print(f"wrote {d}: {allocs} allocations per rank in {gen_wall:.1f} s", file=sys.stderr)
    try:
        size = sum(p.stat().st_size for p in d.glob("*.ndjson"))
        runs = []
        for _ in range(a.repeats):
            v, cpu, wall = _timed(lambda: fast_accept([d], jobs=a.jobs))
            assert v is not None and v.accepted, "the fast path did not accept the group"
            runs.append({"cpu_s": round(cpu, 3), "wall_s": round(wall, 3)})
        out: dict[str, Any] = {"dir": str(d), "allocs": allocs, "procs": v.procs,
                               "events": v.events, "bytes": size, "jobs": a.jobs, "check": runs}
        if a.full:
            full = []
            for _ in range(a.repeats):
                t, rc, rw = _timed(lambda: load_group([d]))
                fv, pc, pw = _timed(lambda: replay_group(t))
                assert fv.accepted and fv.order == v.order, fv.summary()
                full.append({"read_cpu_s": round(rc, 3), "read_wall_s": round(rw, 3),
                             "replay_cpu_s": round(pc, 3), "replay_wall_s": round(pw, 3)})
                del t
            out["full_replay"] = full
        if a.json:
            print(json.dumps(out, indent=2))
        else:
            best = min(runs, key=lambda r: r["wall_s"])
            print(f"{v.procs} processes, {v.events:,} events, {size / 1e6:.0f} MB: check "
                  f"best wall {best['wall_s']:.2f} s, CPU {best['cpu_s']:.2f} s "
                  "(all: " + ", ".join("%.2f/%.2f" % (r["wall_s"], r["cpu_s"]) for r in runs)
                  + " wall/CPU s)")
            for r in out.get("full_replay", []):
                print(f"  full replay: read {r['read_wall_s']:.2f} s wall / {r['read_cpu_s']:.2f}"
                      f" CPU, replay {r['replay_wall_s']:.2f} / {r['replay_cpu_s']:.2f}")
    finally:
        if tmp is not None:
            shutil.rmtree(tmp, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
