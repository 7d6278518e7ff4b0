"""A review of the group path under torch.distributed (2026-12-08): a ``group`` that is
not a ProcessGroup (a Store passed positionally, a name) was a bare KeyError from
torch's table of groups; torchrun running ``kvgrant alloc`` without ``--procs`` made
every worker allocate every rank."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

_SCRIPT = r"""
import os, socket, torch.distributed as dist
s = socket.socket(); s.bind(("127.0.0.1", 0)); port = s.getsockname()[1]; s.close()
dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=0, world_size=1)
from kvgrant.errors import ArgumentError
from kvgrant.layout.geometry import load_geometry, on_ranks
from kvgrant.runtime.group import allocate_rank
g = on_ranks(load_geometry("examples/small.json"), 1)
store = dist.distributed_c10d._get_process_group_store(dist.group.WORLD)
for group in ("abc", 123, store):
    try:
        allocate_rank(g, 0, group, backend="sim", timeout_s=30)
    except ArgumentError as e:
        assert e.argument == "group" and "must be None (the default group) or a" in str(e), e
    else:
        raise AssertionError(f"group = {group!r} was taken")
for group in (None, dist.group.WORLD):
    allocate_rank(g, 0, group, backend="sim", timeout_s=30).release()
dist.destroy_process_group()
print("OK")
"""


def test_a_group_that_is_no_process_group_is_named() -> None:
    pytest.importorskip("torch.distributed")
    env = {**os.environ, "KVGRANT_PLAN_CACHE": "off"}
    out = subprocess.run([sys.executable, "-c", _SCRIPT], cwd=ROOT, env=env,
                         capture_output=True, text=True, timeout=240)
    assert out.returncode == 0 and out.stdout.strip().endswith("OK"), out.stderr[-2000:]


def test_kvgrant_alloc_under_torchrun_needs_procs(monkeypatch: pytest.MonkeyPatch) -> None:
    import contextlib
    import io

    from kvgrant.cli import main

    for k, v in {"RANK": "0", "WORLD_SIZE": "2", "MASTER_ADDR": "127.0.0.1",
                 "MASTER_PORT": "1"}.items():
        monkeypatch.setenv(k, v)
    err = io.StringIO()
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
        rc = main(["alloc", str(ROOT / "examples" / "small.json"), "--backend", "sim"])
    assert rc == 2 and "without --procs: each worker would allocate every rank" in \
        err.getvalue(), err.getvalue()
    monkeypatch.setenv("WORLD_SIZE", "1")  # a one-worker torchrun is one process: fine
    with contextlib.redirect_stderr(io.StringIO()), contextlib.redirect_stdout(io.StringIO()):
        assert main(["alloc", str(ROOT / "examples" / "small.json"), "--backend", "sim"]) == 0


def test_the_cli_timeout_is_refused_past_the_library_limit() -> None:
    """--timeout took up to 10**7 s, allocate_rank at most a week: the workers started
    (8 s) and each refused it, exit 1."""
    import contextlib
    import io

    from kvgrant.cli import main
    from kvgrant.runtime.group import MAX_TIMEOUT_S

    err = io.StringIO()
    with contextlib.redirect_stderr(err), pytest.raises(SystemExit) as info:
        main(["alloc", str(ROOT / "examples" / "small.json"), "--procs", "3",
              "--backend", "sim", "--timeout", str(MAX_TIMEOUT_S + 1)])
    assert info.value.code == 2 and f"must be at most {MAX_TIMEOUT_S:,} s" in err.getvalue()


def test_ranks_given_one_trace_file_are_refused_before_any_driver_call(
        tmp_path: Path) -> None:
    """Every rank given trace="t.ndjson" (as the one-process examples do) published,
    both processes wrote the file, and kvgrant conform rejected it."""
    from kvgrant.errors import GroupError
    from kvgrant.runtime.sim import SimDriver

    from tests.runtime._dict_store import run_threads
    from tests.runtime._small import small_geometry

    g = small_geometry()
    n = g.topology.ranks
    same = tmp_path / "t.ndjson"
    drivers = [SimDriver(devices=n) for _ in range(n)]
    outs = run_threads(g, drivers, per_rank={r: {"trace": same} for r in range(n)})
    for r, out in enumerate(outs):
        assert isinstance(out, GroupError), out
        assert f"ranks 0..{n - 1} would write one trace file {same}" in str(out), str(out)
    assert all(d.live().is_empty() for d in drivers) and not same.exists()
    # two ranks sharing one file, the third its own: the two are named
    per = {0: {"trace": same}, 1: {"trace": same}, 2: {"trace": tmp_path / "r2.ndjson"}}
    outs = run_threads(g, [SimDriver(devices=n) for _ in range(n)], per_rank=per)
    assert all("ranks 0..1 would write one trace file" in str(o) for o in outs), outs


def test_the_clis_own_workers_ignore_a_stray_local_rank(tmp_path: Path) -> None:
    """``LOCAL_RANK=5 kvgrant alloc G --procs 3`` put every worker on device 5 (the
    workers inherited the variable); the CLI's own launcher gives rank r device r."""
    import json

    pytest.importorskip("torch.multiprocessing")
    env = {**os.environ, "LOCAL_RANK": "5", "KVGRANT_PLAN_CACHE": "off",
           "KVGRANT_LEDGER": str(tmp_path / "ledger.json")}
    out = subprocess.run([sys.executable, "-m", "kvgrant", "alloc", "examples/small.json",
                          "--procs", "3", "--backend", "sim", "--json"], cwd=ROOT, env=env,
                         capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-2000:]
    doc = json.loads(out.stdout)
    assert sorted((r["rank"], r["device"]) for r in doc["ranks"]) == [(0, 0), (1, 1), (2, 2)]
