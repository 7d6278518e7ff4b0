"""Where the TLA+ specs are: the one accessor for every command and engine that runs TLC.

Why: the specs ship inside the package as data (``kvgrant.specs``, built from the
repository's top-level ``specs/`` folder), so ``kvgrant verify`` and ``kvgrant conform
--engine tlc`` find them the same way from a source checkout, an editable install and an
installed wheel, whatever the current directory. ``KVGRANT_SPECS`` points elsewhere (a
folder of edited specs, the spec mutants' copies).
"""

from __future__ import annotations

import os
from pathlib import Path

from kvgrant.errors import ToolError

__all__ = ["SPECS_ENV", "specs_dir"]

SPECS_ENV = "KVGRANT_SPECS"


def specs_dir() -> Path:
    """The folder holding ``KVLifecycle.tla`` and its configs (``KVGRANT_SPECS`` wins).

    Raises :class:`~kvgrant.errors.ToolError` (as a missing spec) when ``KVGRANT_SPECS``
    names no folder. Why: ``KVGRANT_SPECS=small.json`` was reported as ``small.json/
    KVLifecycle.tla is missing``, naming neither the variable nor what it must be."""
    env = os.environ.get(SPECS_ENV)
    if env:
        path = Path(env)
        if not path.is_dir():
            what = "is a file" if path.is_file() else "is not a folder" if path.exists() \
                else "does not exist"
            raise ToolError(f"{SPECS_ENV} = {env!r} {what}: it must name a folder holding the "
                            "TLA+ specs (KVLifecycle.tla, KVGroup.tla and their configs); "
                            "unset it for the specs kvgrant ships")
        return path
    from importlib.resources import files

    # setuptools installs package data as plain files, so the traversable is a path
    return Path(str(files("kvgrant.specs")))
