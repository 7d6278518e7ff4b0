"""A process that plans a layout through the host's plan cache with a slow planner
that counts its runs in a file (tests/runtime/test_plancache.py, concurrency)."""

from __future__ import annotations

import json
import sys
import time

from kvgrant.layout.geometry import load_geometry
from kvgrant.layout.rules import reference_plan
from kvgrant.runtime.plancache import cached_packed_plan


def main(geometry: str, folder: str, counter: str) -> None:
    def slow_plan(g):
        with open(counter, "a") as f:
            f.write("planned\n")
        time.sleep(0.5)  # long enough for the other processes to reach the lock
        return reference_plan(g)

    g = load_geometry(geometry)
    plan = cached_packed_plan(g, slow_plan, {"test": 1},
                              env={"KVGRANT_PLAN_CACHE": folder})
    print(json.dumps([a.to_json() for a in plan.allocations]))


if __name__ == "__main__":
    main(*sys.argv[1:4])
