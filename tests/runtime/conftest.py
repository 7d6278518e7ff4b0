"""Driver fixtures: every suite test runs on the simulator and, where a GPU is usable,
on the real driver (cuda cases carry the ``gpu``/``gpu2`` marks and skip otherwise)."""

from __future__ import annotations

import functools
from typing import Callable, Iterator

import pytest

from kvgrant.runtime.driver import Driver


@functools.cache
def _cuda_devices() -> int:
    """VMM-capable GPUs usable here (0 without cuda-python, driver or GPU)."""
    from kvgrant.runtime.cuda import cuda_available

    if not cuda_available():
        return 0
    from kvgrant.runtime.cuda import CudaDriver

    drv = CudaDriver()
    try:
        return drv.device_count()
    finally:
        drv.close()


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
