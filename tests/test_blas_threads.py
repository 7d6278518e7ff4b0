"""The CLI asks numpy's OpenBLAS for one thread (kvgrant.cli.one_blas_thread).

Why it matters: OpenBLAS starts a spinning thread per core when numpy is imported,
which on a 16-core GPU host was most of ``kvgrant plan``'s CPU time. Each case runs
the CLI in a fresh interpreter, since the setting only acts before numpy is loaded.
"""

from __future__ import annotations

import json
import os
import pathlib
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]

_SCRIPT = """
import contextlib, io, json, os, sys
if sys.argv[1] == "numpy-first":
    import numpy
from kvgrant.cli import main
with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
    status = main(["plan", "examples/small.json", "--no-bound"])
print(json.dumps({"status": status, "numpy": "numpy" in sys.modules,
                  "setting": os.environ.get("OPENBLAS_NUM_THREADS"),
                  "threads": len(os.listdir("/proc/self/task"))
                  if os.path.isdir("/proc/self/task") else None}))
"""


def _run(mode: str = "plain", setting: str | None = None) -> dict[str, object]:
    env = {k: v for k, v in os.environ.items() if k != "OPENBLAS_NUM_THREADS"}
    if setting is not None:
        env["OPENBLAS_NUM_THREADS"] = setting
    out = subprocess.run([sys.executable, "-c", _SCRIPT, mode], cwd=ROOT, env=env,
                         capture_output=True, text=True, timeout=120, check=True)
    got: dict[str, object] = json.loads(out.stdout)
    assert got["status"] == 0 and got["numpy"] is True  # the plan really loaded numpy
    return got


def test_cli_sets_one_thread_when_the_user_did_not():
    assert _run()["setting"] == "1"


def test_cli_keeps_the_users_setting():
    assert _run(setting="3")["setting"] == "3"


def test_cli_leaves_a_process_that_already_loaded_numpy_alone():
    assert _run("numpy-first")["setting"] is None


@pytest.mark.skipif((os.cpu_count() or 1) < 2 or not os.path.isdir("/proc/self/task"),
                    reason="OpenBLAS starts no extra thread on one CPU; needs /proc")
def test_the_setting_acts_the_cli_runs_no_more_threads_than_with_one_blas_thread():
    unset, one, numpy_first = _run(), _run(setting="1"), _run("numpy-first")
    assert unset["threads"] == one["threads"]
    # the comparison can fail: numpy loaded before the setting starts OpenBLAS's threads
    assert numpy_first["threads"] > one["threads"]
