"""Does cuda-python release the GIL inside VMM driver calls?

Why it matters: the trace writer's thread (and any other Python thread of the
allocating process) only runs beside the allocation if the allocator's thread drops the
GIL while it waits in the driver; and while such a thread holds the GIL, the allocator's
thread waits for it at every return from a driver call. This probe times N
map/set-access/unmap cycles alone, then again while a Python thread spins, and reports
how far the spinner got during the driver calls.

    python benchmarks/probe_gil.py [--cycles 2000]   (needs a CUDA GPU)
"""

from __future__ import annotations

import argparse
import threading
import time

from kvgrant.runtime.cuda import CudaDriver


def _cycles(drv: CudaDriver, va: int, size: int, handle: int, n: int) -> float:
    t0 = time.perf_counter()
    for _ in range(n):
        drv.map(va, size, handle)
        drv.set_access(va, size, [0])
        drv.unmap(va, size)
    return time.perf_counter() - t0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cycles", type=int, default=2000)
    args = ap.parse_args()
    drv = CudaDriver()
    g = drv.granularity(0)
    va = drv.reserve(g)
    handle = drv.create(g, 0)
    try:
        _cycles(drv, va, g, handle, 100)  # warm-up
        alone = _cycles(drv, va, g, handle, args.cycles)
        stop = threading.Event()
        spins = [0]

        def spin() -> None:
            n = 0
            while not stop.is_set():
                n += 1
            spins[0] = n

        # spinner speed with the main thread asleep (GIL free): the reference rate
        th = threading.Thread(target=spin)
        th.start()
        time.sleep(alone)
        stop.set()
        th.join()
        free_rate = spins[0] / alone
        stop.clear()
        spins[0] = 0
        th = threading.Thread(target=spin)
        th.start()
        busy = _cycles(drv, va, g, handle, args.cycles)
        stop.set()
        th.join()
        busy_rate = spins[0] / busy
    finally:
        drv.release(handle)
        drv.free_address(va, g)
        drv.close()
    calls = 3 * args.cycles
    print(f"{calls} driver calls alone: {alone * 1e6 / calls:.1f} us/call")
    print(f"{calls} driver calls with a spinning Python thread: {busy * 1e6 / calls:.1f} us/call "
          f"({(busy / alone - 1) * 100:+.1f}%)")
    print(f"spinner progress while the main thread is in driver calls: "
          f"{busy_rate / free_rate * 100:.0f}% of its rate with the main thread asleep "
          f"(near 100%: the GIL is released in driver calls; near 0%: it is held)")


if __name__ == "__main__":
    main()
