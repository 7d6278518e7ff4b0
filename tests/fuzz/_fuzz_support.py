"""Shared by the issue #16 fuzz and regression tests: run the CLI in this process
under a memory cap and a hang limit, or in a child process with the same limits.

Why in-process: thousands of cases must fit in CI's budget (a Python start-up with
kvgrant's imports is ~0.5 s; ``kvgrant.cli.main(argv)`` on the sim is milliseconds).
A memory cap (RLIMIT_AS) turns an unbounded read into a MemoryError the test sees,
instead of the kernel killing the runner; a hang limit (SIGALRM) fails the case.
"""

from __future__ import annotations

import contextlib
import io
import os
import resource
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator, Sequence

ROOT = Path(__file__).resolve().parents[2]
SMALL = ROOT / "examples" / "small.json"
#: Memory a single case may add to this process (virtual address space).
CASE_MEMORY = 2 << 30
#: A case running longer than this is a hang (a limit, not a speed claim).
CASE_SECONDS = 60

#: How many examples the fuzz tests run: a few hundred per kind by default; ``make fuzz``
#: raises it (KVGRANT_FUZZ_SCALE=8 gives over 10,000 cases in all).
SCALE = float(os.environ.get("KVGRANT_FUZZ_SCALE", "1"))


def examples(default: int) -> int:
    """``default`` examples, times KVGRANT_FUZZ_SCALE."""
    return max(1, int(default * SCALE))


#: Cases run per test in this session; ``make fuzz`` writes them to KVGRANT_FUZZ_REPORT.
CASES: dict[str, int] = {}


def count_case(kind: str) -> None:
    """Count one generated case of ``kind`` (the report shows what really ran, not
    what max_examples allowed: Hypothesis stops early on a small search space)."""
    CASES[kind] = CASES.get(kind, 0) + 1
    report = os.environ.get("KVGRANT_FUZZ_REPORT")
    if report and CASES[kind] % 50 == 1:
        _write_report(report)


def _write_report(path: str) -> None:
    import json

    merged: dict[str, int] = {}
    with contextlib.suppress(OSError, ValueError):
        merged = json.loads(Path(path).read_text())
    merged.update(CASES)
    Path(path).write_text(json.dumps(merged, indent=1, sort_keys=True) + "\n")


def flush_report() -> None:
    """Write the counts now (called at the end of each fuzz module)."""
    report = os.environ.get("KVGRANT_FUZZ_REPORT")
    if report:
        _write_report(report)


class Hang(Exception):
    """A case ran past CASE_SECONDS."""


@dataclass
class Result:
    rc: int
    out: str
    err: str


def _vm_bytes() -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmSize:"):
            return int(line.split()[1]) * 1024
    return 0


@contextlib.contextmanager
def limits(memory: int = CASE_MEMORY, seconds: int = CASE_SECONDS) -> Iterator[None]:
    """Cap this process's address space at its current size + ``memory`` and raise
    :class:`Hang` after ``seconds``; both are undone on exit."""
    soft, hard = resource.getrlimit(resource.RLIMIT_AS)
    cap = _vm_bytes() + memory
    if hard != resource.RLIM_INFINITY:
        cap = min(cap, hard)

    def on_alarm(_signum: int, _frame: object) -> None:
        raise Hang(f"the case ran past {seconds} s")

    previous = signal.signal(signal.SIGALRM, on_alarm)
    resource.setrlimit(resource.RLIMIT_AS, (cap, hard))
    signal.alarm(seconds)
    try:
        yield
    finally:
        signal.alarm(0)
        resource.setrlimit(resource.RLIMIT_AS, (soft, hard))
        signal.signal(signal.SIGALRM, previous)


def run_cli(argv: Sequence[str], **limit_args: int) -> Result:
    """``kvgrant.cli.main(argv)`` with stdout/stderr captured, under :func:`limits`.

    Any exception but SystemExit escapes (the test fails with it: a traceback)."""
    from kvgrant.cli import main

    out, err = io.StringIO(), io.StringIO()
    with limits(**limit_args), contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            rc = main(list(argv))
        except SystemExit as exc:  # argparse errors, signals
            rc = exc.code if isinstance(exc.code, int) else 2
    return Result(int(rc), out.getvalue(), err.getvalue())


_CHILD = """
import resource, sys
if {mem} > 0:
    resource.setrlimit(resource.RLIMIT_AS, ({mem}, {mem}))
from kvgrant.cli import main
sys.exit(main(sys.argv[1:]))
"""


def run_cli_process(argv: Sequence[str], *, memory: int = 4 << 30,
                    seconds: int = CASE_SECONDS, cwd: Path = ROOT,
                    env: dict[str, str] | None = None) -> Result:
    """``kvgrant ARGV`` in a child process capped at ``memory`` bytes of address space
    (-1: no cap); fails (AssertionError) on a hang or on any process of its session
    left behind."""
    proc = subprocess.Popen([sys.executable, "-c", _CHILD.format(mem=memory), *argv],
                            cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            start_new_session=True)
    try:
        out, err = proc.communicate(timeout=seconds)
    except subprocess.TimeoutExpired:
        raise AssertionError(f"kvgrant {list(argv)!r} ran past {seconds} s") from None
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.communicate()
    left = _lingering(proc.pid)
    if left:
        names = {pid: _cmdline(pid) for pid in left}
        for pid in left:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        raise AssertionError(f"kvgrant {list(argv)!r} left processes behind: {names}")
    return Result(proc.returncode, out.decode(errors="replace"), err.decode(errors="replace"))


SESSION_EXIT_SECONDS = 20
"""How long a command's helper processes may take to end after the command did.
Python's multiprocessing resource tracker, which ``--procs`` starts, ends when it
reads the end of its pipe, a moment after the command exits; on a loaded machine that
moment was long enough to be caught (CI, 2026-12-01). A process still there after this
long is left behind."""


def _lingering(sid: int) -> list[int]:
    """Members of session ``sid`` still alive :data:`SESSION_EXIT_SECONDS` after its
    leader ended (an empty list as soon as they are all gone)."""
    deadline = time.monotonic() + SESSION_EXIT_SECONDS
    left = session_members(sid)
    while left and time.monotonic() < deadline:
        time.sleep(0.05)
        left = session_members(sid)
    return left


def _cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(
            errors="replace").strip()[:200]
    except OSError:
        return "?"


def session_members(sid: int) -> list[int]:
    """Live (non-zombie) processes of session ``sid``."""
    out = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            stat = Path(f"/proc/{entry}/stat").read_text()
        except OSError:
            continue
        fields = stat[stat.rindex(")") + 2:].split()
        if fields[0] != "Z" and int(fields[3]) == sid:
            out.append(int(entry))
    return out


def assert_clean(res: Result, *, invalid: bool, argv: Sequence[str] = ()) -> None:
    """No traceback, a short error, and a non-zero exit for invalid input."""
    text = res.out + res.err
    assert "Traceback" not in text, f"{list(argv)!r}: traceback\n{text[-3000:]}"
    if invalid:
        assert res.rc != 0, f"{list(argv)!r}: exit 0 on invalid input\n{text[-2000:]}"
        assert res.rc in (1, 2), f"{list(argv)!r}: exit {res.rc}\n{text[-2000:]}"
        assert len(res.err) < 20_000, f"{list(argv)!r}: error message of {len(res.err)} chars"
