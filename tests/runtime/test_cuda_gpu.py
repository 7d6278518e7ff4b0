"""CudaDriver cases that need real GPUs (skipped without one), plus the no-GPU path."""

from __future__ import annotations

import pytest

from kvgrant.errors import BackendUnavailable, DriverError
from kvgrant.runtime.cuda import CudaDriver, cuda_available, driver_version

_HAVE_GPU = cuda_available()
needs_gpu = pytest.mark.skipif(not _HAVE_GPU, reason="needs a CUDA GPU with VMM support")


def test_cuda_available_never_raises_and_agrees_with_the_constructor() -> None:
    if _HAVE_GPU:
        drv = CudaDriver()
        assert drv.device_count() >= 1
        drv.close()
    else:
        with pytest.raises(BackendUnavailable) as info:
            CudaDriver()
        assert info.value.result_name.startswith("CUDA_ERROR_")
        assert "sim" in str(info.value)            # says what to use instead
        assert driver_version() is None


@pytest.mark.gpu
@needs_gpu
def test_describe_names_the_driver_and_devices() -> None:
    drv = CudaDriver()
    info = drv.describe()
    drv.close()
    assert isinstance(info["driver_version"], int) and info["driver_version"] >= 12000
    assert len(info["devices"]) == drv.device_count()  # type: ignore[arg-type]
    for name in info["devices"]:  # type: ignore[union-attr]
        assert name and "\0" not in name and name == name.strip(), repr(name)
    assert info["driver_version"] == driver_version()
    print("GPU:", info)


@pytest.mark.gpu
@needs_gpu
def test_real_driver_failure_carries_call_result_device_and_size() -> None:
    drv = CudaDriver()
    g = drv.granularity(0)
    _, total = drv.free_memory(0)
    too_big = (total // g + 16) * g
    with pytest.raises(DriverError) as info:
        drv.create(too_big, 0)
    err = info.value
    assert err.call == "cuMemCreate" and err.device == 0 and err.size == too_big
    assert err.result_name == "CUDA_ERROR_OUT_OF_MEMORY" and err.result == 2
    assert str(err).startswith("CUDA_ERROR_OUT_OF_MEMORY: ")
    assert drv.live().is_empty()
    drv.close()


@pytest.mark.gpu
@needs_gpu
def test_unknown_device_is_refused_before_the_driver() -> None:
    drv = CudaDriver()
    with pytest.raises(DriverError) as info:
        drv.create(drv.granularity(0), drv.device_count())
    assert info.value.result_name == "CUDA_ERROR_INVALID_DEVICE"
    # refused by kvgrant's own check, naming the call and the ordinals there are (not
    # by a cuDeviceGet the ordinal reached)
    assert info.value.call == "cuMemCreate" and "not a device ordinal" in str(info.value)
    drv.close()


@pytest.mark.gpu
@pytest.mark.gpu2
@needs_gpu
def test_access_on_every_device_is_exactly_the_grant_set() -> None:
    """cuMemGetAccess on every visible device equals membership in the grant list, for
    memory owned by each device and grant sets of every size."""
    drv = CudaDriver()
    n = drv.device_count()
    if n < 2:
        drv.close()
        pytest.skip(f"needs 2 GPUs, found {n}")
    g = drv.granularity(0)
    va = drv.reserve(n * n * g, device=0)
    made = []
    for owner in range(n):
        for k in range(1, n + 1):
            grant = sorted({owner} | {(owner + j) % n for j in range(k)})
            slot = va + (owner * n + k - 1) * g
            h = drv.create(g, owner)
            drv.map(slot, g, h)
            drv.set_access(slot, g, grant)
            made.append((slot, h))
            seen = [d for d in range(n) if drv.get_access(slot, d)]
            assert seen == grant, (owner, grant, seen)
    assert drv.live().grants == sum(
        len({o} | {(o + j) % n for j in range(k)}) for o in range(n) for k in range(1, n + 1))
    for slot, h in reversed(made):
        drv.unmap(slot, g)
        drv.release(h)
    drv.free_address(va, n * n * g)
    assert drv.live().is_empty()
    drv.close()


_CONTEXT_STATE = """
from cuda.bindings import driver as d
from kvgrant.runtime.cuda import CudaDriver

def active():
    res, dev = d.cuDeviceGet(0)
    res, flags, on = d.cuDevicePrimaryCtxGetState(dev)
    assert int(res) == 0, res
    return int(on)

drv = CudaDriver()
drv.free_memory(0)          # retains device 0's primary context and makes it current
held = active()
drv.close()
print(held, active())
"""


@pytest.mark.gpu
@needs_gpu
def test_close_gives_the_primary_context_back() -> None:
    """close() releases each primary context it retained, so a process that closes its
    driver holds no context (and its memory) on the GPU. In a fresh process: nothing
    else there retains the context."""
    import subprocess
    import sys

    out = subprocess.run([sys.executable, "-c", _CONTEXT_STATE], capture_output=True,
                         text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["1", "0"]
