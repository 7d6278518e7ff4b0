"""Trace conformance: check runtime traces against the lifecycle model.

Two engines that must agree: :func:`replay` (the Python transition relation in
:mod:`.model`, fast enough for published-scale traces) and :func:`check_trace_tlc`
(TLC on ``specs/KVLifecycleTrace.tla`` with the trace as a generated module).
:mod:`.mutants` injects ordering bugs into valid traces and :mod:`.drift` keeps the
Python model equal to the spec on small configs.
"""

from __future__ import annotations

from kvgrant.errors import ArgumentError
from kvgrant.conformance.model import Action, Constants, ModelState
from kvgrant.conformance.mutants import Mutant, make_header, mutants, reference_trace
from kvgrant.conformance.replay import Verdict, replay, replay_file
from kvgrant.conformance.tla_trace import check_trace_tlc
from kvgrant.conformance.trace_io import Event, Header, Trace, load_trace, parse_trace

__all__ = [
    "Action",
    "Constants",
    "Event",
    "Header",
    "ModelState",
    "Mutant",
    "Trace",
    "Verdict",
    "check_trace",
    "check_trace_tlc",
    "load_trace",
    "make_header",
    "mutants",
    "parse_trace",
    "reference_trace",
    "replay",
    "replay_file",
]


def check_trace(trace: "Trace | str", engine: str = "python") -> list[Verdict]:
    """Run one or both engines (``python``, ``tlc``, ``both``) on a trace.

    Returns one Verdict per engine, Python first. Raises TraceError for a malformed
    trace, ToolError when TLC cannot run and ArgumentError for an engine not named.
    """
    if not isinstance(engine, str) or engine not in ("python", "tlc", "both"):
        # an ArgumentError (a ValueError too); was a bare ValueError, outside the tree
        raise ArgumentError(f"check_trace: engine = {engine!r}: must be 'python', 'tlc' or "
                            "'both'", argument="engine", value=engine)
    t = trace if isinstance(trace, Trace) else load_trace(trace)
    out: list[Verdict] = []
    if engine in ("python", "both"):
        out.append(replay(t))
    if engine in ("tlc", "both"):
        out.append(check_trace_tlc(t))
    return out
