"""CUresult names and values shared by both driver backends.

The simulated driver must fail with the same names and numbers as CUDA, so traces and
error messages read the same on both backends. The names we use are kept in a small
built-in table (``import kvgrant`` must not need cuda-python); any other name is looked
up in ``cuda.bindings.driver.CUresult`` when that imports. A test checks that the
built-in table agrees with cuda-bindings, so the two cannot drift.
"""

from __future__ import annotations

from kvgrant.errors import DriverError

__all__ = [
    "CUDA_SUCCESS",
    "KNOWN_RESULTS",
    "driver_error",
    "result_name",
    "result_value",
]

CUDA_SUCCESS = "CUDA_SUCCESS"

# name -> value, as in cuda.h / cuda.bindings.driver.CUresult.
KNOWN_RESULTS: dict[str, int] = {
    "CUDA_SUCCESS": 0,
    "CUDA_ERROR_INVALID_VALUE": 1,
    "CUDA_ERROR_OUT_OF_MEMORY": 2,
    "CUDA_ERROR_NOT_INITIALIZED": 3,
    "CUDA_ERROR_DEINITIALIZED": 4,
    "CUDA_ERROR_NO_DEVICE": 100,
    "CUDA_ERROR_INVALID_DEVICE": 101,
    "CUDA_ERROR_INVALID_CONTEXT": 201,
    "CUDA_ERROR_INVALID_HANDLE": 400,
    "CUDA_ERROR_ILLEGAL_ADDRESS": 700,
    "CUDA_ERROR_PEER_ACCESS_UNSUPPORTED": 217,
    "CUDA_ERROR_NOT_PERMITTED": 800,
    "CUDA_ERROR_NOT_SUPPORTED": 801,
    "CUDA_ERROR_ILLEGAL_STATE": 401,
    "CUDA_ERROR_UNKNOWN": 999,
}
_NAMES: dict[int, str] = {v: k for k, v in KNOWN_RESULTS.items()}


def _bindings_enum():  # type: ignore[no-untyped-def]
    """cuda.bindings.driver.CUresult, or None when cuda-python is not importable."""
    try:
        from cuda.bindings import driver
    except Exception:  # noqa: BLE001 - any import failure means "not available"
        return None
    return driver.CUresult


def result_value(name: str | int) -> int:
    """The integer value of a CUresult given by name (or passed through if an int).

    Raises ``ValueError`` naming the value when the name is not a CUresult.
    """
    if isinstance(name, int) and not isinstance(name, bool):
        return name
    if not isinstance(name, str):
        raise ValueError(f"result = {name!r}: must be a CUresult name such as "
                         "'CUDA_ERROR_OUT_OF_MEMORY' or its integer value")
    if name in KNOWN_RESULTS:
        return KNOWN_RESULTS[name]
    enum = _bindings_enum()
    if enum is not None and hasattr(enum, name):
        return int(getattr(enum, name))
    raise ValueError(f"result = {name!r}: not a CUresult name (e.g. 'CUDA_ERROR_OUT_OF_MEMORY')")


def result_name(value: int | object) -> str:
    """The CUresult name of ``value`` (an int or a cuda.bindings CUresult member)."""
    name = getattr(value, "name", None)
    if isinstance(name, str):
        return name
    code = int(value)  # type: ignore[call-overload]
    if code in _NAMES:
        return _NAMES[code]
    enum = _bindings_enum()
    if enum is not None:
        try:
            return str(enum(code).name)
        except ValueError:
            pass
    return f"CUresult({code})"


def driver_error(result: str | int, explanation: str, *, call: str, device: int | None = None,
                 va: int | None = None, size: int | None = None,
                 cls: type[DriverError] = DriverError) -> DriverError:
    """Build the ``DriverError`` both backends raise: ``"NAME: explanation"`` plus context.

    The explanation gets the call, device and VA range appended so a log line alone says
    what failed where.
    """
    value = result_value(result)
    name = result_name(value)
    where = [f"in {call}"]
    if device is not None:
        where.append(f"device {device}")
    if va is not None:
        end = f"+{size:#x}" if size is not None else ""
        where.append(f"va {va:#x}{end}")
    elif size is not None:
        where.append(f"size {size:#x}")
    message = f"{name}: {explanation} ({', '.join(where)})"
    return cls(message, call=call, result=value, result_name=name, device=device, va=va,
               size=size)
