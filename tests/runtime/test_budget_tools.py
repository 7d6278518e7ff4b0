"""The budget tools: measure_handle_budget.py's arguments (its measurement needs an idle
GPU and is never run here), the acceptance script end to end on the simulated host, and
``kvgrant budget``."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

from kvgrant.cli import main as cli_main
from kvgrant.runtime.ledger import HostLedger

ROOT = Path(__file__).resolve().parents[2]
TOOLS = ROOT / "tools"


def _load(name: str) -> ModuleType:
    spec = importlib.util.spec_from_file_location(f"_tool_{name}", TOOLS / f"{name}.py")
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_measure_tool_refuses_to_run_unless_told_the_gpu_is_idle(capsys: Any) -> None:
    tool = _load("measure_handle_budget")
    with pytest.raises(SystemExit) as info:
        tool.parse_args([])
    assert info.value.code == 2
    assert "--i-know-the-gpu-is-idle" in capsys.readouterr().err


@pytest.mark.parametrize("argv, words", [
    (["--devices-per-grant", "0"], "--devices-per-grant = 0"),
    (["--processes", "0"], "--processes = 0"),
    (["--device", "-1"], "--device = -1"),
    (["--gpus", "0,x"], "--gpus = '0,x'"),
])
def test_measure_tool_bad_arguments_name_the_flag(argv: list[str], words: str,
                                                  capsys: Any) -> None:
    tool = _load("measure_handle_budget")
    with pytest.raises(SystemExit):
        tool.parse_args(["--i-know-the-gpu-is-idle", *argv])
    assert words in capsys.readouterr().err


def test_measure_tool_arguments_parse_without_importing_cuda() -> None:
    code = ("import importlib.util, sys; s = importlib.util.spec_from_file_location('m', "
            f"{str(TOOLS / 'measure_handle_budget.py')!r}); m = importlib.util.module_from_spec(s);"
            " s.loader.exec_module(m); a = m.parse_args(['--i-know-the-gpu-is-idle', "
            "'--processes', '2', '--gpus', '0,1']); print(a.gpus, a.processes, "
            "'cuda.bindings' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=120, check=True)
    assert out.stdout.split() == ["[0,", "1]", "2", "False"]


def test_acceptance_script_passes_on_the_simulated_host(tmp_path: Path) -> None:
    out_json = tmp_path / "acc.json"
    env = dict(os.environ)
    env.pop("KVGRANT_LEDGER", None)
    env.pop("KVGRANT_SIM_POOL", None)
    proc = subprocess.run([sys.executable, str(TOOLS / "gpu_ledger_acceptance.py"), "--backend",
                           "sim", "--allocations", "400", "--handle-budget", "3000",
                           "--json-out", str(out_json)], capture_output=True, text=True,
                          timeout=300, env=env)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    fig = json.loads(out_json.read_text())
    assert fig["checks"] and all(fig["checks"].values())
    # H = 3000, D = 800, F = 3000 - 800 - 400: B fails with 400 grants, exactly
    assert (fig["filler"], fig["predicted_b_grants"], fig["actual_b_grants"]) == (1800, 400, 400)
    assert "ACCEPTANCE: PASS" in proc.stdout


def test_acceptance_script_cuda_path_on_a_fake_driver(tmp_path: Path) -> None:
    """The cuda path (measure_handle_budget.py alone and with 3 processes at once, then
    CudaDriver in every worker) against tests/runtime/fakecuda: a stand-in for
    cuda.bindings whose grants share one pool file, so the tool's and the script's
    arithmetic and unwinding run here; it proves nothing about the real driver."""
    out_json = tmp_path / "acc.json"
    env = dict(os.environ, FAKECUDA_POOL=str(tmp_path / "fakepool"), FAKECUDA_BUDGET="4000",
               PYTHONPATH=os.pathsep.join([str(Path(__file__).with_name("fakecuda")),
                                           os.environ.get("PYTHONPATH", "")]))
    env.pop("KVGRANT_LEDGER", None)
    env.pop("KVGRANT_SIM_POOL", None)
    proc = subprocess.run([sys.executable, str(TOOLS / "gpu_ledger_acceptance.py"),
                           "--i-know-the-gpus-are-idle", "--allocations", "300",
                           "--json-out", str(out_json)], capture_output=True, text=True,
                          timeout=300, env=env)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    fig = json.loads(out_json.read_text())
    assert (fig["budget_one_process"], fig["budget"]) == (4000, 4000)
    assert (fig["filler"], fig["predicted_b_grants"], fig["actual_b_grants"]) == (3100, 300, 300)
    assert fig["b_preflight"]["kind"] == "HandleBudgetError"
    assert all(fig["checks"].values())


def test_acceptance_script_refuses_cuda_without_the_flag() -> None:
    proc = subprocess.run([sys.executable, str(TOOLS / "gpu_ledger_acceptance.py")],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2 and "--i-know-the-gpus-are-idle" in proc.stderr


@pytest.mark.gpu
@pytest.mark.gpu2
def test_acceptance_on_two_gpus(tmp_path: Path) -> None:
    """The H200 acceptance of issue #12. It exhausts the host's driver handles, so it runs
    only with KVGRANT_EXHAUST_HANDLES=1 on an idle host."""
    if os.environ.get("KVGRANT_EXHAUST_HANDLES") != "1":
        pytest.skip("set KVGRANT_EXHAUST_HANDLES=1 on an idle 2-GPU host")
    from kvgrant.runtime.cuda import usable_device_count

    if usable_device_count() < 2:
        pytest.skip("needs 2 CUDA GPUs")
    out_json = tmp_path / "acc.json"
    proc = subprocess.run([sys.executable, str(TOOLS / "gpu_ledger_acceptance.py"),
                           "--i-know-the-gpus-are-idle", "--json-out", str(out_json)],
                          capture_output=True, text=True, timeout=590)
    print(proc.stdout)
    assert proc.returncode == 0, proc.stdout + proc.stderr


# --------------------------------------------------------------------- kvgrant budget
def test_budget_command_lists_holders_total_and_margin(tmp_path: Path, capsys: Any) -> None:
    path = tmp_path / "ledger.json"
    lease = HostLedger(path).reserve(1234, geometry="dcp8", label="packed", budget=10_000,
                                     reserve=0, devices=[0, 1])
    assert cli_main(["budget", "--ledger", str(path), "--handle-budget", "10000",
                     "--handle-reserve", "100", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert (out["held"], out["budget"], out["reserve"], out["margin"]) == (1234, 10_000, 100,
                                                                          8666)
    assert [(h["pid"], h["geometry"], h["handles"]) for h in out["holders"]] == [
        (os.getpid(), "dcp8", 1234)]
    assert cli_main(["budget", "--ledger", str(path), "--handle-budget", "1000"]) == 0
    text = capsys.readouterr().out
    assert "dcp8" in text and "1,234" in text and "OVERCOMMITTED" in text
    # asked with a larger budget than the holder was admitted with: the holder's binds
    assert cli_main(["budget", "--ledger", str(path), "--handle-budget", "20000",
                     "--handle-reserve", "0", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert (out["budget"], out["binding_budget"], out["margin"]) == (20_000, 10_000, 8766)
    assert cli_main(["budget", "--ledger", str(path), "--handle-budget", "20000"]) == 0
    assert f"budget 10,000 (the budget and reserve pid {os.getpid()} was admitted with" in \
        capsys.readouterr().out
    lease.release()


def test_budget_command_reports_a_bad_ledger_without_a_traceback(tmp_path: Path,
                                                                 capsys: Any) -> None:
    path = tmp_path / "ledger.json"
    path.write_bytes(b"\x00garbage")
    assert cli_main(["budget", "--ledger", str(path)]) == 1
    err = capsys.readouterr().err
    assert "kvgrant budget: error: ledger" in err and "Traceback" not in err
    assert cli_main(["budget", "--ledger", str(path), "--repair", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["holders"] == [] and Path(out["kept_bad_content"]).read_bytes() == b"\x00garbage"


def test_alloc_cli_refusal_by_the_ledger_names_the_holder_in_json(tmp_path: Path,
                                                                  capsys: Any) -> None:
    path = tmp_path / "ledger.json"
    small = str(ROOT / "examples" / "small.json")
    with HostLedger(path).reserve(60, geometry="other", label="packed", budget=10**6,
                                  reserve=0):
        rc = cli_main(["alloc", small, "--backend", "sim", "--ledger", str(path),
                       "--handle-budget", "100", "--handle-reserve", "0", "--json"])
        out = json.loads(capsys.readouterr().out)
    assert rc == 1 and out["kind"] == "HandleBudgetError"
    assert (out["held"], out["budget"], out["reserve"]) == (60, 100, 0)
    assert [(h["pid"], h["geometry"]) for h in out["holders"]] == [(os.getpid(), "other")]
    # with pre-flight off it is recorded unchecked, runs (the sim driver has room), and
    # leaves nothing behind
    assert cli_main(["alloc", small, "--backend", "sim", "--ledger", str(path),
                     "--handle-budget", "100", "--no-preflight", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["ok"] is True
    assert HostLedger(path).holders() == []
