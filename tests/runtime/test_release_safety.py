"""Release and abort when an undo fails or Ctrl-C comes: what stays held, what is raised.

Audit findings: the ledger lease went with the first undo even when driver objects were
left live; a Ctrl-C during ``Published.release()`` stopped the teardown half way; and an
error of a ``with allocate(...)`` block was replaced by the release's own failure.
"""

from __future__ import annotations

import os
import signal
from pathlib import Path

import pytest
from _small import chunk_plan, small_geometry

from kvgrant.errors import AllocationError, DriverError
from kvgrant.runtime.allocator import allocate
from kvgrant.runtime.faults import Fault
from kvgrant.runtime.ledger import HostLedger
from kvgrant.runtime.sim import SimDriver
from kvgrant.runtime.transaction import Transaction


@pytest.fixture
def book(tmp_path: Path) -> HostLedger:
    return HostLedger(tmp_path / "ledger.json", lock_timeout_s=2.0)


# ------------------------------------------------------------------- the transaction
def test_an_undo_pushed_unless_undo_failed_is_skipped_after_a_newer_failure() -> None:
    ran: list[str] = []

    def boom() -> None:
        ran.append("boom")
        raise OSError("undo failed")

    txn = Transaction()
    txn.push(ran.append, "oldest")
    txn.push_unless_undo_failed(ran.append, "lease")
    txn.push(boom)
    txn.push(ran.append, "newest")
    errors = txn.rollback()
    assert [type(e) for e in errors] == [OSError]
    assert ran == ["newest", "boom", "oldest"]   # the lease step alone is skipped


def test_an_undo_pushed_unless_undo_failed_runs_when_every_newer_undo_succeeded() -> None:
    ran: list[str] = []
    txn = Transaction()
    txn.push_unless_undo_failed(ran.append, "lease")
    txn.push(ran.append, "newest")
    assert txn.commit().run() == [] and ran == ["newest", "lease"]


# ------------------------------------------------------------- the lease and a failed undo
def test_a_failed_release_keeps_the_lease_while_objects_stay_live(book: HostLedger) -> None:
    g = small_geometry()
    drv = SimDriver(devices=3, faults=Fault(call="cuMemRelease"))
    pub = allocate(g, plan=chunk_plan, driver=drv, ledger=book)
    (held,) = book.holders()
    with pytest.raises(DriverError):
        pub.release()
    assert not drv.live().is_empty()             # one allocation could not be released
    assert book.holders() == [held]              # so its handles stay counted


def test_a_failed_undo_during_abort_keeps_the_lease(book: HostLedger) -> None:
    g = small_geometry()
    drv = SimDriver(devices=3, faults=[Fault(call="cuMemSetAccess", nth=5),
                                       Fault(call="cuMemUnmap")])
    with pytest.raises(AllocationError) as info:
        allocate(g, plan=chunk_plan, driver=drv, ledger=book)
    assert info.value.cleanup_errors                    # the Unmap failed
    assert not drv.live().is_empty()
    assert len(book.holders()) == 1


def test_a_clean_release_still_gives_the_lease_back(book: HostLedger) -> None:
    drv = SimDriver(devices=3)
    allocate(small_geometry(), plan=chunk_plan, driver=drv, ledger=book).release()
    assert book.holders() == [] and drv.live().is_empty()


# ----------------------------------------------------------------- Ctrl-C during release
class _InterruptedOnce(SimDriver):
    """A sim driver that sends itself SIGINT from inside its first cuMemUnmap."""

    interrupted = False

    def unmap(self, va: int, size: int) -> None:
        if not self.interrupted:
            self.interrupted = True
            os.kill(os.getpid(), signal.SIGINT)
        super().unmap(va, size)


def test_ctrl_c_during_release_waits_until_the_teardown_ran(book: HostLedger) -> None:
    drv = _InterruptedOnce(devices=3)
    pub = allocate(small_geometry(), plan=chunk_plan, driver=drv, ledger=book)
    with pytest.raises(KeyboardInterrupt):
        pub.release()
    assert drv.interrupted
    assert drv.live().is_empty() and book.holders() == []   # nothing left half released
    assert pub.released and pub.release_s is not None
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler


# ----------------------------------------------------------- an error of the with-block
def test_the_with_blocks_error_stays_raised_and_a_failed_release_is_attached() -> None:
    drv = SimDriver(devices=3, faults=Fault(call="cuMemRelease"))
    with pytest.raises(LookupError) as info:
        with allocate(small_geometry(), plan=chunk_plan, driver=drv):
            raise LookupError("the engine's own error")
    (cleanup,) = info.value.cleanup_errors  # type: ignore[attr-defined]
    assert isinstance(cleanup, DriverError) and cleanup.call == "cuMemRelease"


def test_a_failed_release_after_a_clean_with_block_is_raised() -> None:
    drv = SimDriver(devices=3, faults=Fault(call="cuMemRelease"))
    with pytest.raises(DriverError):
        with allocate(small_geometry(), plan=chunk_plan, driver=drv):
            pass


# --------------------------------------------------------- what a failed undo says
def test_a_failed_release_says_its_call_rank_device_and_bytes_to_a_library_caller() -> None:
    drv = SimDriver(devices=3, faults=Fault(call="cuMemRelease"))
    pub = allocate(small_geometry(), plan=chunk_plan, driver=drv)
    with pytest.raises(DriverError) as info:
        pub.release()
    text, e = str(info.value), info.value
    assert text.startswith(f"cuMemRelease failed with CUDA_ERROR_OUT_OF_MEMORY on rank "
                           f"{e.rank} (device {e.device}, plane "), text
    assert "bytes [0x" in text and text == e.headline()
    assert text.count("cuMemRelease failed with") == 1   # said once, not nested


def test_a_group_set_up_query_failure_says_call_result_and_device() -> None:
    from kvgrant.runtime.group import _err_text

    e = DriverError("CUDA_ERROR_INVALID_DEVICE: no such device", call="cuMemGetInfo",
                    result=101, result_name="CUDA_ERROR_INVALID_DEVICE", device=3)
    assert _err_text(e).startswith("cuMemGetInfo failed with CUDA_ERROR_INVALID_DEVICE "
                                   "(device 3) before anything was created")
    assert _err_text(OSError("x")) == "OSError: x"


class _InterruptedAndFailing(_InterruptedOnce):
    """SIGINT inside the first cuMemUnmap, and the first cuMemRelease fails."""


def test_ctrl_c_during_a_release_whose_undo_failed_is_not_lost() -> None:
    drv = _InterruptedAndFailing(devices=3, faults=Fault(call="cuMemRelease"))
    pub = allocate(small_geometry(), plan=chunk_plan, driver=drv)
    with pytest.raises(KeyboardInterrupt) as info:
        pub.release()
    (failed,) = info.value.cleanup_errors  # type: ignore[attr-defined]
    assert isinstance(failed, DriverError) and failed.call == "cuMemRelease"
    assert pub.released
