"""Views of published memory: torch tensors without copies, or raw device pointers.

Why an object and not a bare int: a :class:`DeviceBuffer` carries pointer, length and
device together and, on the CUDA backend, exposes ``__cuda_array_interface__`` (v3),
so ``torch.as_tensor(buf)`` (or CuPy, Numba) wraps the VMM mapping in place. torch is
optional and imported only when a tensor is asked for. Simulated memory has no real
device pointer, so a sim buffer has no ``__cuda_array_interface__`` at all (nothing can
dereference a fake address by accident); ``ptr`` is still there for bookkeeping.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from kvgrant.errors import BackendUnavailable, ReleasedError

__all__ = ["DeviceBuffer", "as_tensor"]


@dataclass(frozen=True, slots=True)
class DeviceBuffer:
    """``nbytes`` bytes of device memory at ``ptr`` on CUDA ordinal ``device``."""

    ptr: int
    nbytes: int
    device: int
    backend: str = "cuda"
    #: the cache whose memory this is (its ``released`` says whether the memory is still
    #: mapped), or None for a buffer made by hand
    owner: Any = field(default=None, repr=False, compare=False)

    def __int__(self) -> int:
        return self.ptr

    def _live(self, what: str) -> None:
        """A buffer taken before its cache's release would view unmapped memory: refuse
        (was: still sliced, and viewed, after ``release()``)."""
        if self.owner is not None and self.owner.released:
            raise ReleasedError(f"DeviceBuffer.{what}: the cache was released; the memory "
                                f"at {self.ptr:#x} is unmapped (allocate a new cache)")

    def slice(self, offset: int, nbytes: int) -> "DeviceBuffer":
        """A sub-range; ``offset`` and ``nbytes`` must be integers that stay inside this
        buffer (a float offset once gave a fractional pointer)."""
        from kvgrant.runtime.arguments import as_int, fail

        self._live("slice")
        for name, value in (("offset", offset), ("nbytes", nbytes)):
            n = as_int(value)
            if n is None or n < 0:
                raise fail(name, value, "must be an integer number of bytes >= 0")
        offset, nbytes = as_int(offset), as_int(nbytes)  # type: ignore[assignment]
        if offset + nbytes > self.nbytes:
            raise fail("nbytes", nbytes, f"slice [{offset}, {offset + nbytes}) is outside "
                       f"the buffer of {self.nbytes} bytes")
        return DeviceBuffer(self.ptr + offset, nbytes, self.device, self.backend, self.owner)

    @property
    def __cuda_array_interface__(self) -> dict[str, Any]:
        """CUDA Array Interface v3: a 1-D uint8 array, no stream synchronisation."""
        self._live("__cuda_array_interface__")
        if self.backend != "cuda":
            raise AttributeError(f"a {self.backend} buffer has no real device pointer, so no "
                                 "__cuda_array_interface__")
        return {"shape": (self.nbytes,), "typestr": "|u1", "data": (self.ptr, False),
                "strides": None, "version": 3}

    def as_tensor(self) -> Any:
        """A ``torch.uint8`` tensor over this memory (no copy); see :func:`as_tensor`."""
        return as_tensor(self)


def as_tensor(buf: DeviceBuffer) -> Any:
    """Wrap ``buf`` as a 1-D ``torch.uint8`` CUDA tensor sharing its memory.

    Raises
    ------
    BackendUnavailable
        The buffer is simulated (there is no device memory to wrap).
    ModuleNotFoundError
        torch is not installed (``pip install 'kvgrant[torch]'``).
    ArgumentError
        ``buf`` is not a DeviceBuffer (a VA from ``row_va`` is an int, not a buffer).
    """
    if not isinstance(buf, DeviceBuffer):
        from kvgrant.runtime.arguments import fail

        raise fail("buf", buf, "must be a DeviceBuffer (cache.row(...), cache.page(...) or "
                   "cache.plane(...)); a VA from row_va() is a bare address")
    buf._live("as_tensor")
    if buf.backend != "cuda":
        raise BackendUnavailable(
            f"CUDA_ERROR_NOT_SUPPORTED: {buf.backend} memory at {buf.ptr:#x} cannot be viewed "
            "as a torch tensor; use the cuda backend (or read it through the driver)",
            call="torch.as_tensor", result=801, result_name="CUDA_ERROR_NOT_SUPPORTED",
            device=buf.device, va=buf.ptr, size=buf.nbytes)
    try:
        import torch
    except ModuleNotFoundError as err:
        raise ModuleNotFoundError(
            "torch is not installed; install the extra with: pip install 'kvgrant[torch]' "
            "(without torch, use DeviceBuffer.ptr)") from err
    device = torch.device("cuda", buf.device)
    make = getattr(torch._C, "_construct_storage_from_data_pointer", None)
    if make is not None:
        # The device is said, not asked: torch.as_tensor asks cudaPointerGetAttributes,
        # which names the GPU holding the memory, and a peer's memory imported by a
        # group process (kvgrant.runtime.group) is readable only through this device.
        t = torch.empty(0, dtype=torch.uint8, device=device).set_(
            make(buf.ptr, device, buf.nbytes))
    else:  # pragma: no cover - older torch
        t = torch.as_tensor(buf, device=device)
    if t.data_ptr() != buf.ptr:  # pragma: no cover - would mean torch copied
        raise RuntimeError(f"torch copied the buffer at {buf.ptr:#x} (got {t.data_ptr():#x})")
    return t
