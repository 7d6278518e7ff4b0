"""Issue #16 item 1: no Java process and no temp folder outlives a TLC check.

Real signals to a real ``kvgrant conform --engine tlc`` process, sent once its Java
child is running; then no process of that Java process group may remain and the
temp folder (``TMPDIR``) must be empty. Also the in-process ways out: an exception
while TLC runs, kvgrant's own timeout, and interpreter exit (atexit).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path

import pytest

from kvgrant.conformance import tlc

pytestmark = pytest.mark.tlc

ROOT = Path(__file__).resolve().parents[2]
WAIT_S = 120.0  # a hang limit, not a speed claim: the test fails past it


def _need_java() -> None:
    try:
        tlc.find_java()
        tlc.find_jar()
    except tlc.ToolError as err:
        pytest.skip(str(err))


def _processes() -> list[tuple[int, int, int, str]]:
    """(pid, ppid, pgid, cmdline) of every process we can see."""
    out = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            stat = Path(f"/proc/{entry}/stat").read_text()
            cmd = Path(f"/proc/{entry}/cmdline").read_bytes().replace(b"\0", b" ").decode(
                errors="replace")
        except OSError:
            continue
        fields = stat[stat.rindex(")") + 2:].split()
        if fields[0] == "Z":
            continue
        out.append((int(entry), int(fields[1]), int(fields[2]), cmd))
    return out


def _java_child(parent: int) -> tuple[int, int] | None:
    for pid, ppid, pgid, cmd in _processes():
        if ppid == parent and "java" in cmd and "tlc2.TLC" in cmd:
            return pid, pgid
    return None


def _group_alive(pgid: int) -> list[int]:
    return [pid for pid, _ppid, g, _cmd in _processes() if g == pgid]


def _kill_group_quietly(pgid: int) -> None:
    try:
        os.killpg(pgid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def _default_signals() -> None:
    """In the child: the tested signals at their default disposition. kvgrant takes
    only signals at their default (an embedding program keeps its own), and a test run
    started under ``nohup`` hands its children SIGHUP ignored: kvgrant then rightly
    ignored it and finished with status 0."""
    for sig in (signal.SIGTERM, signal.SIGHUP, signal.SIGINT):
        signal.signal(sig, signal.SIG_DFL)


@pytest.fixture(scope="module")
def long_trace(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A small trace; the tests signal once Java is running, whatever its length."""
    from kvgrant.cli import main

    path = tmp_path_factory.mktemp("trace") / "t.ndjson"
    rc = main(["alloc", str(ROOT / "examples" / "small.json"), "--backend", "sim",
               "--trace", str(path)])
    assert rc == 0
    return path


@pytest.mark.parametrize("command, signum, expected", [
    ("conform", signal.SIGTERM, 128 + signal.SIGTERM),
    ("conform", signal.SIGHUP, 128 + signal.SIGHUP),
    ("conform", signal.SIGINT, 130),
    ("both", signal.SIGTERM, 128 + signal.SIGTERM),
    ("verify", signal.SIGTERM, 128 + signal.SIGTERM),
])
def test_a_signal_to_kvgrant_ends_java_and_removes_temp_folders(
        long_trace: Path, tmp_path: Path, command: str, signum: int, expected: int) -> None:
    _need_java()
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    env = dict(os.environ, TMPDIR=str(tmp))
    argv = {"conform": ["conform", str(long_trace), "--engine", "tlc"],
            "both": ["conform", str(long_trace), "--engine", "both"],
            "verify": ["verify", "--workers", "1"]}[command]
    proc = subprocess.Popen([sys.executable, "-m", "kvgrant.cli", *argv], env=env, cwd=ROOT,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            start_new_session=True, preexec_fn=_default_signals)
    java: tuple[int, int] | None = None
    try:
        deadline = time.monotonic() + WAIT_S
        while java is None and proc.poll() is None and time.monotonic() < deadline:
            java = _java_child(proc.pid)
            time.sleep(0.02)
        assert java is not None, f"Java never started (rc {proc.poll()})"
        assert any(tmp.iterdir()), "TLC's temp folder should exist while it runs"
        assert proc.poll() is None, "kvgrant ended before the signal"
        os.kill(proc.pid, signum)
        _out, err = proc.communicate(timeout=WAIT_S)
        assert proc.returncode == expected, err.decode(errors="replace")[-2000:]
        assert b"Traceback" not in err
        assert _group_alive(java[1]) == [], "a process of TLC's group outlived kvgrant"
        assert list(tmp.iterdir()) == [], "a temp folder outlived kvgrant"
    finally:
        if proc.poll() is None:
            _kill_group_quietly(proc.pid)
            proc.wait()
        if java is not None:
            _kill_group_quietly(java[1])
        for stream in (proc.stdout, proc.stderr):
            if stream is not None:
                stream.close()


@pytest.fixture(scope="module")
def slow_trace(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The first 3,000 events of the published layout on one rank: TLC works on it for
    well over a minute, so Java outlives the checks below unless something ends it."""
    from kvgrant.cli import main

    full = tmp_path_factory.mktemp("slow") / "full.ndjson"
    rc = main(["alloc", str(ROOT / "examples" / "published-dcp8.json"), "--backend", "sim",
               "--ranks", "1", "--trace", str(full)])
    assert rc == 0
    cut = full.with_name("cut.ndjson")
    with full.open() as src:
        cut.write_text("".join(line for _i, line in zip(range(3001), src)))
    return cut


def test_sigkill_of_kvgrant_still_ends_java(slow_trace: Path, tmp_path: Path) -> None:
    """SIGKILL reaches no handler; the kernel's parent-death signal ends Java anyway
    (the temp folder cannot be removed then; it is TMPDIR's to clean)."""
    _need_java()
    proc = subprocess.Popen([sys.executable, "-m", "kvgrant.cli", "conform", str(slow_trace),
                             "--engine", "tlc"], cwd=ROOT, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL, start_new_session=True,
                            env=dict(os.environ, TMPDIR=str(tmp_path)))
    java: tuple[int, int] | None = None
    try:
        deadline = time.monotonic() + WAIT_S
        while java is None and proc.poll() is None and time.monotonic() < deadline:
            java = _java_child(proc.pid)
            time.sleep(0.02)
        assert java is not None, f"Java never started (rc {proc.poll()})"
        time.sleep(1.0)  # past the JVM start: TLC is reading the trace
        assert _group_alive(java[1]), "TLC ended before the test could kill kvgrant"
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(timeout=WAIT_S)
        deadline = time.monotonic() + 10  # delivered asynchronously
        while _group_alive(java[1]) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert _group_alive(java[1]) == [], "Java outlived a SIGKILLed kvgrant"
    finally:
        if proc.poll() is None:
            _kill_group_quietly(proc.pid)
            proc.wait()
        if java is not None:
            _kill_group_quietly(java[1])


def _trace_spec_args(long_trace: Path, tmp: Path) -> tuple[Path, Path, list[Path]]:
    from kvgrant.conformance.tla_trace import (TRACE_CFG, TRACE_SPEC, specs_dir,
                                               write_trace_module)

    write_trace_module(long_trace, tmp)
    return specs_dir() / TRACE_SPEC, specs_dir() / TRACE_CFG, [tmp]


def test_an_exception_while_tlc_runs_kills_its_group(
        long_trace: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _need_java()
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    data = tmp_path / "data"
    data.mkdir()
    spec, cfg, lib = _trace_spec_args(long_trace, data)
    seen: list[int] = []

    def boom(_elapsed: float) -> None:
        seen.extend(tlc._RUNNING)
        raise RuntimeError("progress callback failed")

    with pytest.raises(RuntimeError, match="progress callback"):
        with tlc.reporting_progress(boom, every=0.05):
            tlc.run_tlc(spec, cfg, library=lib, timeout=WAIT_S)
    assert seen, "TLC was not running when the callback fired"
    assert tlc._RUNNING == {}
    assert all(_group_alive(pid) == [] for pid in seen)
    assert [p.name for p in tmp_path.iterdir()] == ["data"]


def test_kvgrants_own_timeout_kills_the_group(long_trace: Path, tmp_path: Path,
                                              monkeypatch: pytest.MonkeyPatch) -> None:
    _need_java()
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    data = tmp_path / "data"
    data.mkdir()
    spec, cfg, lib = _trace_spec_args(long_trace, data)
    result = tlc.run_tlc(spec, cfg, library=lib, timeout=0.3)
    assert result.status == "timeout"
    assert tlc._RUNNING == {}
    assert [p.name for p in tmp_path.iterdir()] == ["data"]


def test_interpreter_exit_kills_tlc_started_by_a_thread(long_trace: Path,
                                                        tmp_path: Path) -> None:
    """A TLC run in a worker thread when the interpreter exits: atexit kills it and
    removes its temp folder."""
    _need_java()
    data = tmp_path / "data"
    data.mkdir()
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    spec, cfg, lib = _trace_spec_args(long_trace, data)
    script = textwrap.dedent(f"""
        import sys, threading, time
        from kvgrant.conformance import tlc
        t = threading.Thread(target=tlc.run_tlc, args=({str(spec)!r}, {str(cfg)!r}),
                             kwargs={{"library": [{str(data)!r}]}}, daemon=True)
        t.start()
        deadline = time.monotonic() + {WAIT_S}
        while not tlc._RUNNING and time.monotonic() < deadline:
            time.sleep(0.01)
        print(*tlc._RUNNING, flush=True)
        sys.exit(0)
    """)
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                          timeout=WAIT_S, cwd=ROOT, env=dict(os.environ, TMPDIR=str(tmp)))
    pids = [int(x) for x in proc.stdout.split()]
    try:
        assert proc.returncode == 0, proc.stderr[-2000:]
        assert pids, "TLC never started"
        deadline = time.monotonic() + 10  # SIGKILL is delivered asynchronously
        while any(_group_alive(p) for p in pids) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert all(_group_alive(p) == [] for p in pids)
        assert list(tmp.iterdir()) == []
    finally:
        for p in pids:
            _kill_group_quietly(p)


def test_exit_on_signals_keeps_a_programs_own_handler() -> None:
    """A program embedding kvgrant keeps its SIGTERM handler; defaults are taken and
    given back."""
    def mine(_signum: int, _frame: object) -> None:
        pass

    before_int = signal.getsignal(signal.SIGINT)
    before_hup = signal.getsignal(signal.SIGHUP)
    old = signal.signal(signal.SIGTERM, mine)
    try:
        with tlc.exit_on_signals():
            assert signal.getsignal(signal.SIGTERM) is mine
            if before_int is signal.default_int_handler:
                assert signal.getsignal(signal.SIGINT) is not before_int
            if before_hup is signal.SIG_DFL:  # taken (unless run under nohup)
                assert signal.getsignal(signal.SIGHUP) is not signal.SIG_DFL
        assert signal.getsignal(signal.SIGTERM) is mine
        assert signal.getsignal(signal.SIGHUP) is before_hup
        assert signal.getsignal(signal.SIGINT) is before_int
    finally:
        signal.signal(signal.SIGTERM, old)
