"""Driver fixtures: every suite test runs on the simulator and, where a GPU is usable,
on the real driver (cuda cases carry the ``gpu``/``gpu2`` marks and skip otherwise)."""

from __future__ import annotations

import functools
import runpy
import sys
from pathlib import Path
from typing import Any, Callable, Iterator

import pytest

from kvgrant.runtime.driver import Driver


@functools.cache
def _cuda_devices() -> int:
    """VMM-capable GPUs usable here (0 without cuda-python, driver or GPU)."""
    from kvgrant.runtime.cuda import usable_device_count

    return usable_device_count()


def _opener(backend: str, min_devices: int) -> Callable[..., Driver]:
    if backend == "sim":
        from kvgrant.runtime.sim import SimDriver

        return functools.partial(SimDriver, devices=max(2, min_devices))
    have = _cuda_devices()
    if have < min_devices:
        pytest.skip(f"needs {min_devices} CUDA GPU(s) with VMM support, found {have}")
    from kvgrant.runtime.cuda import CudaDriver

    return CudaDriver


_ONE = ["sim", pytest.param("cuda", marks=pytest.mark.gpu)]
_TWO = ["sim", pytest.param("cuda", marks=[pytest.mark.gpu, pytest.mark.gpu2])]


@pytest.fixture(params=_ONE)
def make_driver(request: pytest.FixtureRequest) -> Iterator[Callable[..., Driver]]:
    """Factory for drivers of one backend (keyword options such as ``faults=``);
    every driver it made is closed at teardown."""
    opener = _opener(request.param, 1)
    made: list[Driver] = []

    def make(**options: object) -> Driver:
        drv = opener(**options)
        made.append(drv)
        return drv

    yield make
    for drv in made:
        drv.close()


@pytest.fixture
def driver(make_driver: Callable[..., Driver]) -> Driver:
    """A fresh driver with at least one device."""
    return make_driver()


@pytest.fixture(params=_TWO)
def driver2(request: pytest.FixtureRequest) -> Iterator[Driver]:
    """A fresh driver with at least two devices (peer cases)."""
    drv = _opener(request.param, 2)()
    yield drv
    drv.close()


@pytest.fixture(scope="session")
def load_benchmark() -> Callable[[str], dict[str, Any]]:
    """``load_benchmark("bench_startup.py")``: the script's globals (``main`` and its
    helpers), loaded as ``python benchmarks/SCRIPT`` would, with benchmarks/ on the path
    for the scripts that import each other."""
    bench_dir = str(Path(__file__).resolve().parents[2] / "benchmarks")

    def load(script: str) -> dict[str, Any]:
        sys.path.insert(0, bench_dir)
        try:
            return runpy.run_path(str(Path(bench_dir) / script))
        finally:
            sys.path.remove(bench_dir)
    return load
