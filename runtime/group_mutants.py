"""Group runtime mutants: runs of one rank of a group that commit exactly one bug, for
the conformance self-test (the group's traces must be rejected at the named action).

As :mod:`kvgrant.runtime.mutant_engines` does for the one-process engine, each mutant is
a subclass of the group runtime's per-process run (``_GroupRun`` in
:mod:`kvgrant.runtime.group`) that overrides the few lines it breaks; the production
code has no test switches. ``allocate_rank`` builds its run from the module's
``_GroupRun``, so :func:`group_mutant` puts the mutant there for the duration of a
``with`` block: every ``allocate_rank`` of this process then builds with it, and the
mutant misbehaves only on the rank it was given. Tests run all ranks of a group as
threads of one process (tests/conformance/test_group_runtime_mutants.py). Never used by
:func:`~kvgrant.runtime.group.allocate_rank` on its own.
"""

from __future__ import annotations

from contextlib import contextmanager
from typing import Any, Callable, Iterator, Mapping

from kvgrant.runtime import group as _group
from kvgrant.runtime.group import _GroupRun
from kvgrant.runtime.transaction import Transaction

__all__ = ["GROUP_RUN_MUTANTS", "REJECTED_AT", "group_mutant"]


class _Mutant(_GroupRun):
    """A run whose bug applies only to rank :attr:`bugged` (the others are correct)."""

    bugged: int = 0

    @property
    def buggy(self) -> bool:
        return self.rank == self.bugged


class GrantImporters(_Mutant):
    """Grants its own mappings to its importers' devices too: the one-process rule
    (owner + importers) applied in a group, where each importer maps for itself."""

    def step(self, action: str, args: Mapping[str, Any], call: str, fn: Callable[[], Any],
             target: str, va: int | None = None, size: int | None = None) -> Any:
        if action == "Grant" and self.buggy:
            devs = sorted({self.device, *(self.devices[r] for r in self.importers)})
            args["devices"] = devs  # type: ignore[index]  # the event reads the same dict
            assert va is not None and size is not None
            fn = lambda: self.driver.set_access(va, size, devs)  # noqa: E731
        return super().step(action, args, call, fn, target, va, size)


class ImportGrantOwnerDevice(_Mutant):
    """Grants an imported mapping to the owner's device instead of its own."""

    def step(self, action: str, args: Mapping[str, Any], call: str, fn: Callable[[], Any],
             target: str, va: int | None = None, size: int | None = None) -> Any:
        if action == "ImportGrant" and self.buggy:
            devs = [self.devices[int(args["owner"])]]
            args["devices"] = devs  # type: ignore[index]
            assert va is not None and size is not None
            fn = lambda: self.driver.set_access(va, size, devs)  # noqa: E731
        return super().step(action, args, call, fn, target, va, size)


class ReadyBeforeImports(_Mutant):
    """Says RankReady before it imported, mapped and granted its owners' memory."""

    def import_all(self, server: Any, timeout_s: float, check: Callable[[int], None],
                   txn: Transaction) -> None:
        if self.buggy and self.owners:
            self.st.ready = True
            self.ev("RankReady", {}, None, None)
        super().import_all(server, timeout_s, check, txn)


class _Front:
    """A transaction front for one import phase that holds back one kind of undo and
    pushes it after the next undo of ``after`` kind (or at the end), swapping their
    LIFO order."""

    def __init__(self, txn: Transaction, hold: Callable[[Callable[..., Any], tuple[Any, ...]], bool],
                 after: Callable[[Callable[..., Any], tuple[Any, ...]], bool]) -> None:
        self.txn, self.hold, self.after = txn, hold, after
        self.held: list[tuple[Callable[..., Any], tuple[Any, ...]]] = []

    def push(self, fn: Callable[..., Any], *args: Any) -> None:
        if self.hold(fn, args):
            self.flush()
            self.held.append((fn, args))
            return
        self.txn.push(fn, *args)
        if self.after(fn, args):
            self.flush()

    def flush(self) -> None:
        while self.held:
            fn, args = self.held.pop(0)
            self.txn.push(fn, *args)


def _is(fn: Callable[..., Any], name: str) -> bool:
    return getattr(fn, "__name__", "") == name


class _ReorderedUndo(_Mutant):
    """Pushes the undos of one import phase through a :class:`_Front`: the undo
    :meth:`held` picks is pushed after the next one :meth:`after` picks."""

    @staticmethod
    def held(fn: Callable[..., Any], args: tuple[Any, ...]) -> bool:
        raise NotImplementedError

    @staticmethod
    def after(fn: Callable[..., Any], args: tuple[Any, ...]) -> bool:
        return _is(fn, "undo_import_unmap") and args[2] == "alias"

    def import_all(self, server: Any, timeout_s: float, check: Callable[[int], None],
                   txn: Transaction) -> None:
        if not self.buggy:
            return super().import_all(server, timeout_s, check, txn)
        front = _Front(txn, self.held, self.after)
        try:
            super().import_all(server, timeout_s, check, front)  # type: ignore[arg-type]
        finally:
            front.flush()


class ReleaseImportBeforeUnmap(_ReorderedUndo):
    """Unwinds an imported handle before its mappings (the release's undo pushed after
    the imported mappings' undos)."""

    @staticmethod
    def held(fn: Callable[..., Any], args: tuple[Any, ...]) -> bool:
        return _is(fn, "undo_import_release")


class UnmapImportedPlaneFirst(_ReorderedUndo):
    """Unwinds an imported plane mapping before the imported alias of the same
    allocation (the backing goes while its alias is still mapped)."""

    @staticmethod
    def held(fn: Callable[..., Any], args: tuple[Any, ...]) -> bool:
        return _is(fn, "undo_import_unmap") and args[2] == "plane"


class SkipImportedAliasUnmap(_Mutant):
    """Never unmaps an imported alias when it unwinds (and no event says so)."""

    def undo_import_unmap(self, owner: int, i: int, mapping: str, va: int, n: int,
                          granted: list[int]) -> None:
        if self.buggy and mapping == "alias":
            return
        super().undo_import_unmap(owner, i, mapping, va, n, granted)


GROUP_RUN_MUTANTS: dict[str, type[_Mutant]] = {
    "grant_importers": GrantImporters,
    "import_grant_owner_device": ImportGrantOwnerDevice,
    "ready_before_imports": ReadyBeforeImports,
    "release_import_before_unmap": ReleaseImportBeforeUnmap,
    "skip_imported_alias_unmap": SkipImportedAliasUnmap,
    "unmap_imported_plane_first": UnmapImportedPlaneFirst,
}

#: the action of the bugged rank's file at which the group checker must reject the group
REJECTED_AT = {"grant_importers": "Grant", "import_grant_owner_device": "ImportGrant",
               "ready_before_imports": "RankReady", "release_import_before_unmap":
               "ImportRelease", "skip_imported_alias_unmap": "ImportUnmap",
               "unmap_imported_plane_first": "ImportUnmap"}


@contextmanager
def group_mutant(bug: str, rank: int) -> Iterator[type[_Mutant]]:
    """Within the block, every :func:`~kvgrant.runtime.group.allocate_rank` of this
    process builds with mutant ``bug`` (one of :data:`GROUP_RUN_MUTANTS`), which
    misbehaves on ``rank`` only. Tests only: the module's run class is swapped for the
    block, for every thread."""
    try:
        base = GROUP_RUN_MUTANTS[bug]
    except KeyError:
        raise ValueError(f"bug = {bug!r}: must be one of {sorted(GROUP_RUN_MUTANTS)}") from None
    cls = type(base.__name__, (base,), {"bugged": rank})
    saved = _group._GroupRun
    _group._GroupRun = cls  # type: ignore[misc]
    try:
        yield cls
    finally:
        _group._GroupRun = saved  # type: ignore[misc]
