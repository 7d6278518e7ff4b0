"""Suite-wide test configuration: Hypothesis profiles, and Ctrl-C as Python sets it.

Why: a property test that draws fresh examples on every CI run can fail on one run
and pass on the next, so CI runs are derandomized (the same examples every time, no
example database). Exploration happens on developer machines with the ``dev``
profile, whose example database lives outside the checkout so nothing found there is
committed by accident. ``CI`` set (as every CI service sets it) selects ``ci``;
``KVGRANT_HYPOTHESIS_PROFILE`` picks one explicitly.

Ctrl-C: a suite started as a background job of a non-interactive shell (``make test &``,
some CI runners) inherits SIGINT ignored, and so would every process it starts; the
tests that send SIGINT (to the allocator, to ``kvgrant conform`` running TLC) would then
see nothing happen. The suite restores Python's own handler, which a child process
gets back as the default action when it starts.

The host's plan cache (runtime/plancache.py) is off for the whole suite and every
process it starts: a test that plans in fresh processes (determinism) must plan there,
not read what an earlier test or run left. tests/runtime/test_plancache.py turns it
on in folders of its own.
"""

from __future__ import annotations

import os
import signal
from pathlib import Path

from hypothesis import settings
from hypothesis.database import DirectoryBasedExampleDatabase

settings.register_profile("ci", derandomize=True, database=None, print_blob=True)
settings.register_profile(
    "dev",
    database=DirectoryBasedExampleDatabase(
        Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "kvgrant" / "hypothesis"),
)
settings.load_profile(os.environ.get("KVGRANT_HYPOTHESIS_PROFILE")
                      or ("ci" if os.environ.get("CI") else "dev"))

os.environ["KVGRANT_PLAN_CACHE"] = "off"

if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)
