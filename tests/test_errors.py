"""The error tree: one base class, every leaf exported, the tree the docstring draws."""

from __future__ import annotations

import inspect

import kvgrant
from kvgrant import errors


def _error_classes() -> set[str]:
    return {name for name, obj in vars(errors).items()
            if inspect.isclass(obj) and issubclass(obj, BaseException)
            and obj.__module__ == errors.__name__}


def test_all_is_pinned_and_sorted() -> None:
    assert errors.__all__ == sorted(errors.__all__)
    assert set(errors.__all__) == _error_classes()


def test_every_error_is_exported_from_the_package() -> None:
    for name in _error_classes():
        assert getattr(kvgrant, name) is getattr(errors, name)
        assert name in kvgrant.__all__


def test_every_error_derives_from_the_base_and_appears_in_the_docstring_tree() -> None:
    for name in _error_classes():
        cls = getattr(errors, name)
        assert issubclass(cls, errors.KVGrantError), name
        assert name in (errors.__doc__ or ""), f"{name} missing from the module docstring tree"


def test_leaves_sit_where_the_tree_says() -> None:
    assert issubclass(errors.HandleBudgetError, errors.PlanError)
    assert issubclass(errors.BackendUnavailable, errors.DriverError)
    assert issubclass(errors.GeometryError, ValueError)
    assert issubclass(errors.TraceError, ValueError)


def test_driver_error_keeps_the_raw_result_and_context() -> None:
    e = errors.DriverError("CUDA_ERROR_OUT_OF_MEMORY: no", call="cuMemSetAccess", result=2,
                           result_name="CUDA_ERROR_OUT_OF_MEMORY", device=1, va=0x1000,
                           size=0x200000)
    assert (e.call, e.result, e.result_name, e.device, e.va, e.size) == (
        "cuMemSetAccess", 2, "CUDA_ERROR_OUT_OF_MEMORY", 1, 0x1000, 0x200000)
    assert str(e).startswith("CUDA_ERROR_OUT_OF_MEMORY:")
