"""The group engine's fast path: accept a clean group without replaying it event by event.

Why: a published-scale group is 16 files of 2*10^4 to 7*10^4 events; reading each event
into a row and stepping the model costs ~20 us of CPU per event (7 s for 340k events),
far over the 2 s that issue 13 asks for. But a group whose every process ran its plan
to the end has one behaviour per process, fixed by the constants: the program of
docs/group-trace.md ("Order inside one process") in the runtime's order, with the
counters that program gives. So each file is compared, as whole lists (C speed), with
that program's actions, argument texts and state texts, computed once per shape and
shared by the ranks of the same shape; the interleaving is the replay scheduler's,
simulated over the only points where a process can wait (its Imports and its Decide).

The fast path only ever *accepts*: anything it does not recognise exactly (another
order, a failure, a crash, an abort, a key order or spacing it did not write, a
malformed line) returns None, and :func:`kvgrant.conformance.group_replay.replay_group`
then judges the group as before, so every rejection names the same event as without
it. ``tests/conformance/test_group_replay.py`` checks that a group it accepts is accepted
by the full replay with the same interleaving.
"""

from __future__ import annotations

import json
import os
import re
import time
from itertools import repeat
from pathlib import Path
from typing import Iterable, NamedTuple

from kvgrant.conformance.group_io import (_INT, _NUM, _expand, _parse_group_header,
                                          _same_constants)
from kvgrant.conformance.group_model import GroupConstants
from kvgrant.conformance.group_replay import GroupVerdict
from kvgrant.errors import TraceError
from kvgrant.gc_pause import gc_paused

__all__ = ["PARALLEL_BYTES", "fast_accept", "fast_accept_texts", "program"]

#: Above this many bytes of trace files, ``fast_accept(jobs=None)`` uses worker processes.
PARALLEL_BYTES = 64 << 20

# The reader's line shape (group_io._FAST) with the state captured whole: a state text
# that equals the program's is of the reader's shape too.
_LINE = re.compile(
    r'^\{"kind": "event", "seq": (' + _INT + r'), "t": ' + _NUM + r', "rank": (' + _INT
    + r'), "action": "([A-Za-z]+)", "args": \{([^{}\n]*)\}, "call": (?:null|"[A-Za-z_]+"), '
    r'"result": (null|"[A-Za-z0-9_]+"), "device": (?:null|' + _INT + r'), "va": (?:null|'
    + _INT + r'), "size": (?:null|' + _INT + r'), "state": \{([^\n]*)\}\}$', re.M)
#: Results the replay reads as success (group_replay._SUCCESS, or null).
_OK_RESULTS = frozenset({"null", '"CUDA_SUCCESS"', '"SUCCESS"'})
_STATE = ('"phase": "%s", "va": %s, "created": %d, "mapped": %d, "alias_mapped": %d, '
          '"grants": %d, "ready": %s, "failed": false, "exported": %d, "sent": %d, '
          '"imported": %d, "import_mapped": %d, "import_grants": %d')


def program(c: GroupConstants, p: int, device: int, shutdown: bool,
            shapes: dict[tuple[object, ...], tuple[list[str], list[str], int, int]] | None = None
            ) -> tuple[list[str], list[str], list[str], int, int, list[tuple[int, int, int]],
                       dict[tuple[int, int], int]]:
    """Process p's whole clean run: actions, args texts and state texts (one per event),
    the index of its Vote and of its Decide, its Imports as (index, owner, alloc) and
    the index of each of its Sends by (alloc, importer). ``shapes``: a cache of the
    rank-independent part, for the ranks of one group.

    The order is the runtime's (runtime/group.py) and the generator's
    (group_gen.simulate_group): Map, MapAlias, Grant plane, Grant alias per allocation;
    Export then Sends to the importers ascending; imports per owner ascending; unwinding
    imports from the last (alias, plane, release), then own objects from the last.
    """
    key = (len(c.importers[p]), len(c.sources[p]), shutdown)
    got = None if shapes is None else shapes.get(key)
    if got is None:
        got = _shape(c, *key)
        if shapes is not None:
            shapes[key] = got
    acts, states, vote, decide = got
    args, imports, sends = _args(c, p, device, shutdown)
    return acts, args, states, vote, decide, imports, sends


def _import_kinds(c: GroupConstants, a: int) -> tuple[str, ...]:
    return ("plane", "alias") if a in c.aliased and a not in c.owner_only else ("plane",)


def _shape(c: GroupConstants, n_importers: int, n_sources: int, shutdown: bool
           ) -> tuple[list[str], list[str], int, int]:
    """Actions and state texts of a clean run; the same for every rank with as many
    importers and owners (why: computed once per shape, not once per rank)."""
    acts: list[str] = []
    states: list[str] = []
    A, aw = acts.append, states.append
    aliased = c.aliased
    phase, va, ready = "Allocating", "true", "false"
    cr = mp = am = gr = ex = se = im = imm = img = 0
    fmt = _STATE

    A("Reserve"); aw(fmt % (phase, va, cr, mp, am, gr, ready, ex, se, im, imm, img))  # noqa
    for a in range(c.allocs):
        cr += 1; A("Create"); aw(fmt % (phase, va, cr, mp, am, gr, ready, ex, se, im, imm, img))  # noqa
        mp += 1; A("Map"); aw(fmt % (phase, va, cr, mp, am, gr, ready, ex, se, im, imm, img))  # noqa
        if a in aliased:
            am += 1; A("MapAlias"); aw(fmt % (phase, va, cr, mp, am, gr, ready, ex, se, im, imm, img))  # noqa
        gr += 1; A("Grant"); aw(fmt % (phase, va, cr, mp, am, gr, ready, ex, se, im, imm, img))  # noqa
        if a in aliased:
            gr += 1; A("Grant"); aw(fmt % (phase, va, cr, mp, am, gr, ready, ex, se, im, imm, img))  # noqa
    for a in range(c.allocs if n_importers else 0):
        ex += 1; A("Export"); aw(fmt % (phase, va, cr, mp, am, gr, ready, ex, se, im, imm, img))  # noqa
        for _ in range(n_importers):
            se += 1; A("Send"); aw(fmt % (phase, va, cr, mp, am, gr, ready, ex, se, im, imm, img))  # noqa
    for _ in range(n_sources):
        for a in range(c.allocs):
            im += 1; A("Import"); aw(fmt % (phase, va, cr, mp, am, gr, ready, ex, se, im, imm, img))  # noqa
            kinds = _import_kinds(c, a)
            for m in kinds:
                imm += 1; A("ImportMap"); aw(fmt % (phase, va, cr, mp, am, gr, ready, ex, se, im, imm, img))  # noqa
            for m in kinds:
                img += 1; A("ImportGrant"); aw(fmt % (phase, va, cr, mp, am, gr, ready, ex, se, im, imm, img))  # noqa
    ready = "true"
    A("RankReady"); aw(fmt % (phase, va, cr, mp, am, gr, ready, ex, se, im, imm, img))  # noqa
    vote = len(acts)
    A("Vote"); aw(fmt % (phase, va, cr, mp, am, gr, ready, ex, se, im, imm, img))  # noqa
    decide = len(acts)
    A("Decide"); aw(fmt % (phase, va, cr, mp, am, gr, ready, ex, se, im, imm, img))  # noqa
    phase = "Published"
    A("Publish"); aw(fmt % (phase, va, cr, mp, am, gr, ready, ex, se, im, imm, img))  # noqa
    if shutdown:
        phase = "ShuttingDown"
        A("Unpublish"); aw(fmt % (phase, va, cr, mp, am, gr, ready, ex, se, im, imm, img))  # noqa
        for _ in range(n_sources):
            for a in range(c.allocs - 1, -1, -1):
                for m in _import_kinds(c, a):
                    imm -= 1; img -= 1; A("ImportUnmap"); aw(fmt % (phase, va, cr, mp, am, gr, ready, ex, se, im, imm, img))  # noqa
                im -= 1; A("ImportRelease"); aw(fmt % (phase, va, cr, mp, am, gr, ready, ex, se, im, imm, img))  # noqa
        for a in range(c.allocs - 1, -1, -1):
            if a in aliased:
                am -= 1; gr -= 1; A("Unmap"); aw(fmt % (phase, va, cr, mp, am, gr, ready, ex, se, im, imm, img))  # noqa
            mp -= 1; gr -= 1; A("Unmap"); aw(fmt % (phase, va, cr, mp, am, gr, ready, ex, se, im, imm, img))  # noqa
            cr -= 1; A("Release"); aw(fmt % (phase, va, cr, mp, am, gr, ready, ex, se, im, imm, img))  # noqa
        va, ready = "false", "false"
        A("Free"); aw(fmt % (phase, va, cr, mp, am, gr, ready, ex, se, im, imm, img))  # noqa
        phase = "Shutdown"
        A("ShutdownComplete"); aw(fmt % (phase, va, cr, mp, am, gr, ready, ex, se, im, imm, img))  # noqa
    return acts, states, vote, decide


def _args(c: GroupConstants, p: int, device: int, shutdown: bool
          ) -> tuple[list[str], list[tuple[int, int, int]], dict[tuple[int, int], int]]:
    """The args texts of p's clean run (they name p's importers, owners and device),
    its Imports (index, owner, alloc) and its Sends' indices by (alloc, importer)."""
    args: list[str] = []
    S = args.append
    dev = f'"devices": [{device}]'
    aliased = c.aliased
    S("")
    for a in range(c.allocs):
        al = f'"alloc": {a}'
        S(al); S(al)  # noqa: E702
        if a in aliased:
            S(al); S(f'{al}, "mapping": "plane", {dev}'); S(f'{al}, "mapping": "alias", {dev}')  # noqa
        else:
            S(f'{al}, "mapping": "plane", {dev}')
    importers = sorted(c.importers[p])
    sends: dict[tuple[int, int], int] = {}
    for a in range(c.allocs if importers else 0):
        S(f'"alloc": {a}')
        for i in importers:
            sends[(a, i)] = len(args)
            S(f'"alloc": {a}, "to": {i}')
    imports: list[tuple[int, int, int]] = []
    for o in c.sources[p]:
        for a in range(c.allocs):
            imports.append((len(args), o, a))
            oa = f'"owner": {o}, "alloc": {a}'
            S(oa)
            if a in aliased and a not in c.owner_only:
                S(f'{oa}, "mapping": "plane"'); S(f'{oa}, "mapping": "alias"')  # noqa: E702
                S(f'{oa}, "mapping": "plane", {dev}'); S(f'{oa}, "mapping": "alias", {dev}')  # noqa
            else:
                S(f'{oa}, "mapping": "plane"'); S(f'{oa}, "mapping": "plane", {dev}')  # noqa
    S(""); S('"ready": true'); S('"decision": "publish", "failed": [], "missing": []'); S("")  # noqa
    if shutdown:
        S("")
        for _, o, a in reversed(imports):
            oa = f'"owner": {o}, "alloc": {a}'
            if a in aliased and a not in c.owner_only:
                S(f'{oa}, "mapping": "alias"')
            S(f'{oa}, "mapping": "plane"'); S(oa)  # noqa: E702
        for a in range(c.allocs - 1, -1, -1):
            al = f'"alloc": {a}'
            if a in aliased:
                S(f'{al}, "mapping": "alias"')
            S(f'{al}, "mapping": "plane"'); S(al)  # noqa: E702
        S(""); S("")  # noqa: E702
    return args, imports, sends


class _Plan(NamedTuple):
    """What the scheduler needs of one accepted file."""

    events: int
    vote: int
    decide: int
    imports: list[tuple[int, int, int]]
    sends: dict[tuple[int, int], int]
    final: str


def _check_file(source: str, text: str, first: GroupConstants | None,
                shapes: dict[tuple[object, ...], tuple[list[str], list[str], int, int]]
                ) -> tuple[int, GroupConstants, _Plan] | None:
    """(rank, constants, plan) when the file is its rank's clean run, else None."""
    nl = text.find("\n")
    if nl < 0:
        return None
    try:
        h = _parse_group_header(json.loads(text[:nl]), source)
    except (TraceError, ValueError, RecursionError):
        return None
    c, p = h.constants, h.rank
    if c.allocs < 1 or (first is not None and _same_constants(first, c)):
        return None
    body = text[nl + 1:]
    n = body.count("\n") + (0 if body.endswith("\n") or not body else 1)
    rows = _LINE.findall(body)
    if not rows or len(rows) != n:
        return None
    last = rows[-1][2]
    if last not in ("Publish", "ShutdownComplete"):
        return None
    shutdown = last == "ShutdownComplete"
    acts, args, states, vote, decide, imports, sends = program(c, p, h.own_device, shutdown,
                                                               shapes)
    if len(acts) != n:
        return None
    seqs, ranks, r_acts, r_args, results, r_states = zip(*rows)
    del rows  # freed before the collector is back on: it never scans them
    if list(r_acts) != acts or list(r_args) != args or list(r_states) != states \
            or list(seqs) != list(map(str, range(n))) or set(ranks) != {str(p)} \
            or not set(results) <= _OK_RESULTS:
        return None
    return p, c, _Plan(n, vote, decide, imports, sends,
                       "Shutdown" if shutdown else "Published")


def fast_accept_texts(named: Iterable[tuple[str, str]]) -> GroupVerdict | None:
    """:func:`fast_accept` on (source, text) pairs (an iterator: one file at a time)."""
    t0 = time.perf_counter()
    shapes: dict[tuple[object, ...], tuple[list[str], list[str], int, int]] = {}
    with gc_paused():
        return _verdict(t0, (_check_file(source, text, None, shapes)
                             for source, text in named))


def _verdict(t0: float, checked: Iterable[tuple[int, GroupConstants, _Plan] | None]
             ) -> GroupVerdict | None:
    plans: dict[int, _Plan] = {}
    first: GroupConstants | None = None
    for got in checked:
        if got is None or got[0] in plans or (first is not None
                                              and _same_constants(first, got[1])):
            return None
        first = first or got[1]
        plans[got[0]] = got[2]
    if first is None or sorted(plans) != list(range(first.ranks)):
        return None
    n = first.ranks
    order = _schedule(n, [plans[p] for p in range(n)])
    if order is None:
        return None
    total = sum(x.events for x in plans.values())
    final = {p: x.final for p, x in plans.items()}
    return GroupVerdict(True, "python", total, n, time.perf_counter() - t0, final=final,
                        order=order)


def _check_path(path: Path) -> tuple[int, GroupConstants, _Plan] | None:
    """:func:`_check_file` of one file, read here (a pool worker's task)."""
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError):
        return None
    with gc_paused():
        return _check_file(str(path), text, None, {})


def _schedule(n: int, plans: list[_Plan]) -> list[tuple[int, int]] | None:
    """The replay scheduler's interleaving (group_replay.replay_group): run process 0 as
    far as it can, then 1, ..., again until all files are used up. A process waits
    only at an Import whose Send the owner has not made yet, and at its Decide until
    every other process voted. None if it would get stuck (the full replay says why)."""
    waits: list[list[tuple[int, int, int]]] = []  # per process: (index, owner, send index)
    lengths = [x.events for x in plans]
    for p, x in enumerate(plans):
        w = [(k, o, plans[o].sends[(a, p)]) for k, o, a in x.imports]
        w.append((x.decide, -1, -1))
        waits.append(w)
    pos = [0] * n
    wi = [0] * n
    ended = [False] * n
    order: list[tuple[int, int]] = []
    votes = [x.vote for x in plans]
    moved = True
    while moved:
        moved = False
        for p in range(n):
            if ended[p]:
                continue
            k = start = pos[p]
            w, j = waits[p], wi[p]
            while j < len(w):
                idx, o, sidx = w[j]
                if o >= 0:
                    if pos[o] <= sidx:
                        k = idx
                        break
                elif any(pos[q] <= votes[q] for q in range(n) if q != p):
                    k = idx
                    break
                j += 1
            else:
                k = lengths[p]
            wi[p] = j
            if k > start:
                order.extend(zip(repeat(p, k - start), range(start, k)))
                moved = True
            pos[p] = k
            if k == lengths[p]:
                ended[p] = True
                moved = True
    return order if all(ended) else None


def fast_accept(paths: Iterable[str | Path], *, jobs: int | None = 1) -> GroupVerdict | None:
    """Accept the group's files (or directories) when each is its rank's clean run
    (published, or published and shut down); None otherwise: then the full replay
    judges them. Never raises on bad input (None).

    ``jobs``: files checked at once in worker processes (None: one per CPU, up to the
    number of files, when the files hold more than :data:`PARALLEL_BYTES`; starting a
    worker costs about half a second). Why: each
    file's check is independent and costs about 2.5 us of CPU per event in Python's
    regex engine, so a 10^6-event group needs several cores to be checked in 2 s.
    """
    t0 = time.perf_counter()
    try:
        files = _expand(paths)
        size = sum(f.stat().st_size for f in files)
    except (OSError, TraceError):
        return None
    if jobs is None:
        jobs = min(len(files), os.cpu_count() or 1) if size > PARALLEL_BYTES else 1
    if jobs <= 1 or len(files) < 2:
        shapes: dict[tuple[object, ...], tuple[list[str], list[str], int, int]] = {}

        def one(f: Path) -> tuple[int, GroupConstants, _Plan] | None:
            try:
                text = f.read_text(encoding="utf-8")
            except (OSError, UnicodeDecodeError):
                return None
            return _check_file(str(f), text, None, shapes)

        with gc_paused():
            return _verdict(t0, map(one, files))
    import multiprocessing
    from concurrent.futures import ProcessPoolExecutor

    # spawn: the workers inherit none of this process's threads or locks, and all of
    # them have ended when the pool is shut down
    ctx = multiprocessing.get_context("spawn")
    with ProcessPoolExecutor(max_workers=min(jobs, len(files)), mp_context=ctx) as pool:
        results = list(pool.map(_check_path, files))
    with gc_paused():
        return _verdict(t0, results)
