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

__all__ = ["SPECS_ENV", "specs_dir"]

SPECS_ENV = "KVGRANT_SPECS"


def specs_dir() -> Path:
    """The folder holding ``KVLifecycle.tla`` and its configs (``KVGRANT_SPECS`` wins)."""
    env = os.environ.get(SPECS_ENV)
    if env:
        return Path(env)
    from importlib.resources import files

    # setuptools installs package data as plain files, so the traversable is a path
    return Path(str(files("kvgrant.specs")))
