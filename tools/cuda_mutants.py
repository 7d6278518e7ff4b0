"""One-at-a-time mutants of the CUDA backend (runtime/cuda.py), run against the GPU
tests on a machine with a GPU: each mutant is applied, the one-GPU tests of the driver
suite and of test_cuda_gpu.py run, and the source is put back (also on Ctrl-C).

Why: the CUDA backend is checked only by GPU tests, which CI (no GPU) never runs; a
mutation run on the GPU host says which of its bugs those tests would catch.
docs/mutation-score.md ("CUDA backend mutants") has the last run's table.

    python tools/cuda_mutants.py            # baseline, then every mutant
    python tools/cuda_mutants.py 3:6        # entries 3..5 of [baseline, *MUTANTS]

Prints one JSON line per run (and appends it to $OUT/mutants.jsonl when OUT is set).
Run it in a scratch copy of the repository: it rewrites runtime/cuda.py while a run
lasts.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SOURCE = ROOT / "runtime" / "cuda.py"
TESTS = ["tests/runtime/test_driver_suite.py", "tests/runtime/test_cuda_gpu.py"]

#: (name, text in runtime/cuda.py, its replacement); each text occurs exactly once
MUTANTS: list[tuple[str, str, str]] = [
    ('free-total-swapped',
     'return int(free), int(total)',
     'return int(total), int(free)'),
    ('unmap-keeps-access',
     '            del self._maps[m]\n            self._access.pop(m, None)',
     '            del self._maps[m]'),
    ('release-ignores-refs',
     'left = self._refs.get(handle, 1) - 1',
     'left = 0'),
    ('check-ignores-invalid-value',
     '        if code == 0:\n            return\n        err, text',
     '        if code in (0, 1):\n            return\n        err, text'),
    ('no-fault-injection',
     '        if self._fault_state:\n',
     '        if False:\n'),
    ('maps-in-general-empty',
     'return [m for m, (s, _) in self._maps.items() if va <= m and m + s <= end]',
     'return []'),
    ('get-access-always-true',
     'return int(flags) == int(self._RW)',
     'return True'),
    ('map-forgets-device',
     'self._maps[va] = (size, device)',
     'self._maps[va] = (size, None)'),
    ('write-no-sync',
     '        (res,) = self._drv.cuCtxSynchronize()     # order against reads in other contexts\n        self._check(res, "cuCtxSynchronize", device, va, len(data))\n',
     ''),
    ('import-not-tracked',
     '        self._track_handle(key, handle, device, size)\n        return key\n\n    def _track_handle',
     '        return key\n\n    def _track_handle'),
    ('free-address-keeps-record',
     '        self._res.pop(va, None)\n',
     ''),
    ('close-keeps-contexts',
     '(res,) = self._drv.cuDevicePrimaryCtxRelease(dev)',
     'res = 0'),
    ('device-ok-off-by-one',
     '0 <= device < self._count',
     '0 <= device <= self._count'),
    ('describe-no-nul-split',
     'names.append(raw.split(b"\\0", 1)[0].decode())',
     'names.append(raw.decode(errors="replace"))'),
    ('create-forgets-device',
     'self._track_handle(key, handle, device, size)\n        return key\n\n    def release',
     'self._track_handle(key, handle, None, size)\n        return key\n\n    def release'),
    ('granularity-recommended',
     'CU_MEM_ALLOC_GRANULARITY_MINIMUM',
     'CU_MEM_ALLOC_GRANULARITY_RECOMMENDED'),
    ('set-access-records-before-check',
     '        (res,) = self._drv.cuMemSetAccess(va, size, descs, len(descs))\n        self._check(res, call, device, va, size)\n        for m in self._maps_in(va, size):\n            self._access.setdefault(m, set()).update(int(d) for d in devices)',
     '        (res,) = self._drv.cuMemSetAccess(va, size, descs, len(descs))\n        for m in self._maps_in(va, size):\n            self._access.setdefault(m, set()).update(int(d) for d in devices)\n        self._check(res, call, device, va, size)'),
    ('read-wrong-size',
     'return buf.raw[:size]',
     'return buf.raw[:size - 1]'),
]


def run(name: str, tests: list[str]) -> dict[str, object]:
    """The one-GPU tests' outcome with the source as it is now."""
    t = time.time()
    r = subprocess.run([sys.executable, "-m", "pytest", "-q", "-x", "-p", "no:cacheprovider",
                        "-m", "gpu and not gpu2 and not tlc", *tests], cwd=ROOT,
                       capture_output=True, text=True, timeout=300)
    tail = (r.stdout + r.stderr).strip().splitlines()
    return {"mutant": name, "caught": r.returncode != 0, "rc": r.returncode,
            "s": round(time.time() - t, 1), "last": tail[-1] if tail else "",
            "failed": [ln for ln in tail if ln.startswith("FAILED")][:3]}


def main(argv: list[str]) -> int:
    todo: list[tuple[str, str | None, str | None]] = [("baseline", None, None), *MUTANTS]
    if argv:
        lo, hi = map(int, argv[0].split(":"))
        todo = todo[lo:hi]
    orig = SOURCE.read_text()
    out = Path(os.environ["OUT"]) / "mutants.jsonl" if os.environ.get("OUT") else None
    for name, old, new in todo:
        try:
            if old is not None and new is not None:
                if orig.count(old) != 1:
                    raise SystemExit(f"{name}: its text occurs {orig.count(old)} times in "
                                     f"{SOURCE} (must be once)")
                SOURCE.write_text(orig.replace(old, new))
            rec = run(name, TESTS)
        finally:
            SOURCE.write_text(orig)
        print(json.dumps(rec), flush=True)
        if out is not None:
            with out.open("a") as fh:
                fh.write(json.dumps(rec) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
