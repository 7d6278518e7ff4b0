"""Transaction: LIFO undo, values bound at push time, undo failures attached, commit."""

from __future__ import annotations

import pytest

from kvgrant.errors import AllocationError
from kvgrant.runtime.transaction import Teardown, Transaction, attach_cleanup_errors


def test_rollback_runs_undos_newest_first() -> None:
    log: list[int] = []
    txn = Transaction()
    for i in range(5):
        txn.push(log.append, i)
    assert len(txn) == 5
    assert txn.rollback() == []
    assert log == [4, 3, 2, 1, 0]
    assert not txn.open


def test_values_are_bound_at_push_time() -> None:
    log: list[int] = []
    txn = Transaction()
    x = 1
    txn.push(log.append, x)
    x = 2
    txn.push(log.append, x)
    x = 99  # a late mutation must not change what the undos see
    txn.rollback()
    assert log == [2, 1]


def test_exception_in_block_unwinds_and_keeps_first_error() -> None:
    log: list[str] = []

    def bad_undo() -> None:
        log.append("bad")
        raise RuntimeError("undo broke")

    with pytest.raises(AllocationError) as info:
        with Transaction() as txn:
            txn.push(log.append, "first")
            txn.push(bad_undo)
            txn.push(log.append, "last")
            raise AllocationError("step failed")
    # every undo ran, LIFO, despite the failing one in the middle
    assert log == ["last", "bad", "first"]
    err = info.value
    assert str(err) == "step failed"
    assert [str(e) for e in err.cleanup_errors] == ["undo broke"]
    assert any("undo broke" in n for n in err.__notes__)


def test_plain_exception_gets_cleanup_errors_attribute() -> None:
    def bad_undo() -> None:
        raise OSError("nope")

    with pytest.raises(KeyError) as info:
        with Transaction() as txn:
            txn.push(bad_undo)
            raise KeyError("x")
    assert [type(e) for e in info.value.cleanup_errors] == [OSError]  # type: ignore[attr-defined]


def test_commit_disarms_and_hands_over_teardown() -> None:
    log: list[int] = []
    with Transaction() as txn:
        txn.push(log.append, 1)
        txn.push(log.append, 2)
        teardown = txn.commit()
    assert log == []  # leaving the block after commit undoes nothing
    assert isinstance(teardown, Teardown) and len(teardown) == 2
    assert teardown.run() == []
    assert log == [2, 1]
    assert teardown.run() == [] and log == [2, 1]  # consumed: runs once


def test_leaving_block_without_commit_unwinds_even_without_error() -> None:
    log: list[int] = []
    with Transaction() as txn:
        txn.push(log.append, 1)
    assert log == [1]


def test_clean_exit_with_failing_undo_raises_it() -> None:
    def bad() -> None:
        raise ValueError("undo failed")

    with pytest.raises(ValueError, match="undo failed"):
        with Transaction() as txn:
            txn.push(bad)


def test_push_after_commit_and_double_commit_are_refused() -> None:
    txn = Transaction()
    txn.commit()
    with pytest.raises(RuntimeError, match="already committed"):
        txn.push(print)
    with pytest.raises(RuntimeError, match="already committed"):
        txn.commit()


def test_teardown_collects_failures_and_continues() -> None:
    log: list[str] = []

    def bad() -> None:
        raise RuntimeError("x")

    txn = Transaction()
    txn.push(log.append, "a")
    txn.push(bad)
    txn.push(log.append, "c")
    errors = txn.commit().run()
    assert log == ["c", "a"]
    assert [str(e) for e in errors] == ["x"]


def test_attach_cleanup_errors_extends_existing_list() -> None:
    err = AllocationError("first", cleanup_errors=[RuntimeError("a")])
    attach_cleanup_errors(err, [RuntimeError("b")])
    assert [str(e) for e in err.cleanup_errors] == ["a", "b"]
    attach_cleanup_errors(err, [])
    assert len(err.cleanup_errors) == 2


def test_runtime_package_exports_are_pinned() -> None:
    import kvgrant.runtime as rt

    assert rt.__all__ == sorted(rt.__all__)
    assert {"allocate", "Published", "Transaction", "TraceWriter", "parse_memory_limit",
            "DeviceBuffer", "open_driver"} <= set(rt.__all__)
    for name in rt.__all__:
        assert getattr(rt, name) is not None
    for mod in ("allocator", "capacity", "trace", "transaction", "views"):
        m = __import__(f"kvgrant.runtime.{mod}", fromlist=["__all__"])
        assert m.__all__ == sorted(m.__all__), mod
        assert all(hasattr(m, n) for n in m.__all__), mod
