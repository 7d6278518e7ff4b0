"""An undo-stack transaction, as ``Transaction`` in cuda.core's ``cuda_utils``.

Why: a multi-rank start-up makes thousands of driver objects; any failure must undo
exactly what was made, newest first, and a failing undo must never hide the first
error. The allocator pushes each step's undo *after* the step's result was checked
(so a failed step is never undone), and calls :meth:`Transaction.commit` last. The
committed undos come back as a :class:`Teardown`, which shutdown runs in the same
LIFO order, so abort and shutdown cannot drift apart.

Values are bound at push time (``functools.partial``), "so late mutations don't bite
you".
"""

from __future__ import annotations

from functools import partial
from types import TracebackType
from typing import Any, Callable, Mapping

__all__ = ["Teardown", "Transaction", "attach_cleanup_errors", "release_failure_text"]


def attach_cleanup_errors(err: BaseException, errors: list[BaseException]) -> None:
    """Attach undo failures to ``err`` without replacing it.

    ``err.cleanup_errors`` (as on :class:`kvgrant.errors.AllocationError`) is
    extended; a note names each failure so a traceback shows them too.
    """
    if not errors:
        return
    existing = getattr(err, "cleanup_errors", None)
    if isinstance(existing, list):
        existing.extend(errors)
    else:
        try:
            err.cleanup_errors = list(errors)  # type: ignore[attr-defined]
        except AttributeError:  # pragma: no cover - exceptions with __slots__
            pass
    for e in errors:
        err.add_note(f"undo failed: {type(e).__name__}: {e}")


def release_failure_text(err: BaseException, live: Mapping[str, int]) -> str:
    """``release failed: N undo step(s) failed, the others ran: ...; left live after
    release: ...``: ``err`` and its ``cleanup_errors``, each driver error as
    :meth:`kvgrant.errors.DriverError.headline` says it (at most 5), then the nonzero
    counts of ``live`` (the driver's live objects). Why: a release goes on past a
    failed undo, and the first error's own text named neither the rank nor the bytes
    nor what was left (the CLI's one-process and ``--procs`` runs both print this)."""
    from kvgrant.errors import DriverError

    errors = [err, *(getattr(err, "cleanup_errors", None) or [])]
    said = [e.headline() if isinstance(e, DriverError) else f"{type(e).__name__}: {e}"
            for e in errors[:5]]
    more = f"; and {len(errors) - 5} more" if len(errors) > 5 else ""
    left = ", ".join(f"{k}={v}" for k, v in live.items() if v) or "nothing"
    return (f"release failed: {len(errors)} undo step(s) failed, the others ran: "
            + "; ".join(said) + more + f"; left live after release: {left}")


class _UnlessUndoFailed(partial):  # type: ignore[type-arg]
    """An undo that is skipped once a newer undo failed (see :meth:`Transaction.push_unless_undo_failed`)."""


def _run_lifo(steps: list[Callable[[], Any]]) -> list[BaseException]:
    """Run and drop ``steps`` newest first; collect (never raise) ``Exception``s.

    A step pushed with :meth:`Transaction.push_unless_undo_failed` is dropped without
    running when any newer step failed."""
    errors: list[BaseException] = []
    while steps:
        step = steps.pop()
        if errors and isinstance(step, _UnlessUndoFailed):
            continue
        try:
            step()
        except Exception as e:  # noqa: BLE001 - every undo must get its turn
            errors.append(e)
    return errors


class Teardown:
    """The committed undo steps of a transaction, run once, newest first."""

    __slots__ = ("_steps",)

    def __init__(self, steps: list[Callable[[], Any]]) -> None:
        self._steps = steps

    def __len__(self) -> int:
        return len(self._steps)

    def run(self) -> list[BaseException]:
        """Run every step LIFO; return the failures (the remaining steps still run).

        A second call does nothing: the steps are consumed.
        """
        return _run_lifo(self._steps)


class Transaction:
    """Undo stack: ``push`` after each checked step, ``commit()`` last.

    Used as a context manager, leaving the block without ``commit()`` (by an
    exception or not) runs the undos in LIFO order; undo failures are attached to
    the raised exception (``cleanup_errors`` and notes), never raised instead.
    ``rollback()`` does the same explicitly and returns the failures.

    Raises
    ------
    RuntimeError
        ``push`` after ``commit``/``rollback``, or ``commit`` twice.
    """

    __slots__ = ("_steps", "_open")

    def __init__(self) -> None:
        self._steps: list[Callable[[], Any]] = []
        self._open = True

    def __len__(self) -> int:
        return len(self._steps)

    @property
    def open(self) -> bool:
        """True until ``commit()`` or ``rollback()``."""
        return self._open

    def push(self, fn: Callable[..., Any], /, *args: Any, **kwargs: Any) -> None:
        """Register the undo of a step that just succeeded; arguments bound now."""
        if not self._open:
            raise RuntimeError("push() on a transaction that was already committed or rolled back")
        self._steps.append(partial(fn, *args, **kwargs))

    def push_unless_undo_failed(self, fn: Callable[..., Any], /, *args: Any,
                                **kwargs: Any) -> None:
        """Like :meth:`push`, but the undo is skipped when a newer undo failed.

        Why: the host ledger's lease accounts for the driver handles of every step
        pushed after it; when one of their undos fails, objects are left live, and
        releasing the lease would let other processes count on handles still held
        (the share goes when this process exits, as the ledger reaps dead holders)."""
        if not self._open:
            raise RuntimeError("push() on a transaction that was already committed or rolled back")
        self._steps.append(_UnlessUndoFailed(fn, *args, **kwargs))

    def commit(self) -> Teardown:
        """Disarm the undos and hand them over (for shutdown) as a :class:`Teardown`."""
        if not self._open:
            raise RuntimeError("commit() on a transaction that was already committed or rolled back")
        self._open = False
        steps, self._steps = self._steps, []
        return Teardown(steps)

    def rollback(self) -> list[BaseException]:
        """Run every pushed undo, newest first; return the undo failures."""
        self._open = False
        return _run_lifo(self._steps)

    def __enter__(self) -> "Transaction":
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        if not self._open and not self._steps:
            return None
        errors = self.rollback()
        if exc is not None:
            attach_cleanup_errors(exc, errors)
        elif errors:
            raise errors[0]
        return None
