"""The group engine's fast path: accept a clean group without replaying it event by event.

Why: a published-scale group is 16 files of 2*10^4 to 7*10^4 events; reading each event
into a row and stepping the model costs ~20 us of CPU per event (7 s for 340k events),
far over the 2 s that issue 13 asks for. But a group whose every process ran its plan
to the end has one behaviour per process, fixed by the constants: the program of
docs/group-trace.md ("Order inside one process") in the runtime's order, with the
counters that program gives, and with the objects the plan gives (version 2): every
line's seq, action, args, call, result, device, VA (base + the plan's offset), size
and state are fixed; only ``t`` and the handle ids are the run's own. So each file is
split on those two fields (one regex pass, kvgrant.traceformat.GROUP_STRIP) and the
rest compared, as one string, with the program's text (a template per shape, filled in
C per process); the handles are checked as a tuple: those Create and Import return are
distinct and not null, every other names the one its allocation (or import) got. The
interleaving is the replay scheduler's, simulated over the only points where a
process can wait (its Imports and its Decide).

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
from operator import itemgetter
from pathlib import Path
from typing import Any, Iterable, NamedTuple

from kvgrant.conformance.group_io import GroupHeader, _expand, _parse_group_header
from kvgrant.conformance.group_model import GroupConstants
from kvgrant.conformance.group_replay import GroupVerdict
from kvgrant.conformance.trace_plan import Layout
from kvgrant.errors import TraceError
from kvgrant.gc_pause import gc_paused
from kvgrant.strict_json import unique_keys_loads
from kvgrant.traceformat import GROUP_SHAPES, GROUP_STATE, GROUP_STRIP, GROUP_STRIPPED_LINE

__all__ = ["MIN_PARALLEL_CPUS", "PARALLEL_BYTES", "fast_accept", "fast_accept_texts", "program"]

#: Above this many bytes of trace files, ``fast_accept(jobs=None)`` uses worker processes.
PARALLEL_BYTES = 64 << 20
#: ... if this process may run on at least this many CPUs: on 2 CPUs the 16-process
#: 989,808-event group took 9.7-10.0 s wall with 2 workers against 6.3 s in one process
#: (docs/group.md); on 32, 1.7-1.8 s with 16 workers.
MIN_PARALLEL_CPUS = 4


def _cpus() -> int:
    """CPUs this process may run on (its affinity: a container's share, not the host's)."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1

# The line's two free fields (kvgrant.traceformat owns the line and this regex).
_STRIP = GROUP_STRIP
# A clean run's state: ``failed`` is false throughout.
_STATE = GROUP_STATE.replace('"failed": %s', '"failed": false')


class _Shape(NamedTuple):
    """The rank-independent part of a clean run: one entry per event."""

    acts: tuple[str, ...]
    states: tuple[str, ...]
    vote: int
    decide: int
    offs: list[int | None]      # va - base (None: va null)
    sizes: list[str]            # size as written
    href: list[int]             # index of the event whose handle it names (n: null)
    creators: list[int]         # Create and Import: each returns a new handle
    nn_offs: tuple[int, ...]    # the non-null offsets, in order (the VAs of %(vN)s)
    args: str                   # args texts, a template (see _args)
    imports: list[tuple[int, int, int]]
    sends: dict[tuple[int, int], int]
    text: str                   # the whole file without t and handle, a %-template
    kinds: tuple[int, ...]      # what fills each %s: an index into _values(...)


def program(c: GroupConstants, lay: Layout, p: int, device: int, shutdown: bool,
            shapes: dict[tuple[object, ...], _Shape] | None = None
            ) -> tuple[_Shape, str, list[tuple[int, int, int]],
                       dict[tuple[int, int], int]]:
    """Process p's whole clean run: its :class:`_Shape` (actions, state texts, objects),
    its args texts (one per event, joined by newlines), its Imports as (index, owner, alloc) and the index
    of each of its Sends by (alloc, importer). ``shapes``: a cache of the
    rank-independent part, for the ranks of one group.

    The order is the runtime's (runtime/group.py) and the generator's
    (group_gen.simulate_group): Map, MapAlias, Grant plane, Grant alias per allocation;
    Export then Sends to the importers ascending; imports per owner ascending; unwinding
    imports from the last (alias, plane, release), then own objects from the last.
    """
    importers, sources = sorted(c.importers[p]), c.sources[p]
    key = (len(importers), len(sources), shutdown)
    got = None if shapes is None else shapes.get(key)
    if got is None:
        got = _shape(c, lay, *key)
        if shapes is not None:
            shapes[key] = got
    names = {"d": str(device)}
    names.update({f"i{j}": str(i) for j, i in enumerate(importers)})
    names.update({f"o{k}": str(o) for k, o in enumerate(sources)})
    args = got.args % names
    imports = [(x, sources[k], a) for x, k, a in got.imports]
    sends = {(a, importers[j]): x for (a, j), x in got.sends.items()}
    return got, args, imports, sends


def _import_kinds(c: GroupConstants, a: int) -> tuple[str, ...]:
    return ("plane", "alias") if a in c.aliased and a not in c.owner_only else ("plane",)


_PH, _VA, _CR, _MP, _AM, _GR, _RD, _EX, _SE, _IM, _IMM, _IMG = range(12)


def _shape(c: GroupConstants, lay: Layout, n_importers: int, n_sources: int,
           shutdown: bool) -> _Shape:
    """Actions, state texts and objects of a clean run; the same for every rank with
    as many importers and owners (why: computed once per shape, not once per rank)."""
    acts: list[str] = []
    states: list[str] = []
    offs: list[int | None] = []
    sizes: list[str] = []
    href: list[int] = []
    creators: list[int] = []
    v: list[object] = ["Allocating", "true", 0, 0, 0, 0, "false", 0, 0, 0, 0, 0]
    fmt = _STATE
    slot = max([o + b for o, b in lay.planes.values()]
               + [x[0] + x[1] for x in lay.regions.values()], default=0)
    res = str(slot * (1 + n_sources))
    aliased = c.aliased

    def emit(action: str, off: int | None = None, size: str = "null", h: int = -1) -> int:
        acts.append(action)
        states.append(fmt % tuple(v))
        offs.append(off)
        sizes.append(size)
        href.append(len(acts) - 1 if h == -2 else h)   # -1 (null): fixed up below
        if h == -2:
            creators.append(len(acts) - 1)
        return len(acts) - 1

    def off(k: int, a: int, m: str) -> int:
        return k * slot + (lay.map_off[a] if m == "plane" else lay.alias_off[a])

    def bump(i: int, d: int = 1) -> None:
        v[i] = v[i] + d  # type: ignore[operator]

    L = [str(x.length) for x in lay.allocations]
    own: dict[int, int] = {}
    imp: dict[tuple[int, int], int] = {}
    emit("Reserve", 0, res)
    for a in range(c.allocs):
        bump(_CR); own[a] = emit("Create", None, L[a], -2)  # noqa: E702
        bump(_MP); emit("Map", off(0, a, "plane"), L[a], own[a])  # noqa: E702
        if a in aliased:
            bump(_AM); emit("MapAlias", off(0, a, "alias"), L[a], own[a])  # noqa: E702
        bump(_GR); emit("Grant", off(0, a, "plane"), L[a])  # noqa: E702
        if a in aliased:
            bump(_GR); emit("Grant", off(0, a, "alias"), L[a])  # noqa: E702
    for a in range(c.allocs if n_importers else 0):
        bump(_EX); emit("Export", None, L[a], own[a])  # noqa: E702
        for _ in range(n_importers):
            bump(_SE); emit("Send")  # noqa: E702
    for k in range(1, n_sources + 1):
        for a in range(c.allocs):
            bump(_IM); imp[(k, a)] = emit("Import", None, L[a], -2)  # noqa: E702
            kinds = _import_kinds(c, a)
            for m in kinds:
                bump(_IMM); emit("ImportMap", off(k, a, m), L[a], imp[(k, a)])  # noqa: E702
            for m in kinds:
                bump(_IMG); emit("ImportGrant", off(k, a, m), L[a])  # noqa: E702
    v[_RD] = "true"
    emit("RankReady")
    vote = emit("Vote")
    decide = emit("Decide")
    v[_PH] = "Published"
    emit("Publish")
    if shutdown:
        v[_PH] = "ShuttingDown"
        emit("Unpublish")
        for k in range(n_sources, 0, -1):
            for a in range(c.allocs - 1, -1, -1):
                for m in reversed(_import_kinds(c, a)):
                    bump(_IMM, -1); bump(_IMG, -1)  # noqa: E702
                    emit("ImportUnmap", off(k, a, m), L[a])
                bump(_IM, -1); emit("ImportRelease", None, "null", imp[(k, a)])  # noqa: E702
        for a in range(c.allocs - 1, -1, -1):
            if a in aliased:
                bump(_AM, -1); bump(_GR, -1); emit("Unmap", off(0, a, "alias"), L[a])  # noqa
            bump(_MP, -1); bump(_GR, -1); emit("Unmap", off(0, a, "plane"), L[a])  # noqa
            bump(_CR, -1); emit("Release", None, "null", own[a])  # noqa: E702
        v[_VA], v[_RD] = "false", "false"
        emit("Free", 0, res)
        v[_PH] = "Shutdown"
        emit("ShutdownComplete")
    href = [len(acts) if j < 0 else j for j in href]   # index n: the "null" appended
    nn = tuple(o for o in offs if o is not None)
    args, imports, sends = _args(c, n_importers, n_sources, shutdown)
    text, kinds = _positional(_text(acts, states, offs, sizes, args), n_importers, n_sources)
    return _Shape(tuple(acts), tuple(states), vote, decide, offs, sizes, href, creators, nn,
                  args, imports, sends, text, kinds)


_NAMED = re.compile(r"%\((\w+)\)s")


def _positional(text: str, n_importers: int, n_sources: int) -> tuple[str, tuple[int, ...]]:
    """The named template as a positional one, and for each %s the index of its value in
    :func:`_values`' list (rank, device, importers, owners, then the VAs). Why: a file's
    text is then one tuple lookup in C and one positional format, no dict of VAs."""
    base = {"r": 0, "d": 1}
    base.update({f"i{j}": 2 + j for j in range(n_importers)})
    base.update({f"o{k}": 2 + n_importers + k for k in range(n_sources)})
    first_va = 2 + n_importers + n_sources
    kinds = tuple(base[k] if k in base else first_va + int(k[1:])
                  for k in _NAMED.findall(text))
    return _NAMED.sub("%s", text), kinds


def _values(c: GroupConstants, p: int, device: int, base: int, nn: tuple[int, ...]
            ) -> list[object]:
    """What fills a shape's positional template for process p (see _positional)."""
    return [p, device, *sorted(c.importers[p]), *c.sources[p], *map(base.__add__, nn)]


# A line as GROUP_STRIP leaves it, rank and device named for the shape's template.
_TEXT_LINE = GROUP_STRIPPED_LINE.replace('"rank": %s', '"rank": %%(r)s').replace(
    '"device": %s', '"device": %%(d)s')
assert _TEXT_LINE.count("%%(") == 2, "kvgrant.traceformat's line names rank and device"


def _text(acts: list[str], states: list[str], offs: list[int | None], sizes: list[str],
          args: str) -> str:
    """The file's lines as the writer writes them (kvgrant.traceformat.GROUP_EVENT_LINE)
    without ``t`` and ``handle``: one %-template for the ranks of this shape (the call
    and result of a clean run's every step are fixed too)."""
    lines = []
    vk = 0
    for k, (act, st, off, sz, ar) in enumerate(zip(acts, states, offs, sizes,
                                                    args.split("\n"))):
        call = GROUP_SHAPES[act].call
        res = "null" if call is None else '"SUCCESS"' if act in ("Send", "Vote") \
            else '"CUDA_SUCCESS"'
        va = "null" if off is None else f"%(v{vk})s"   # (no literal % anywhere else)
        vk += off is not None
        lines.append(_TEXT_LINE % (k, act, "{" + ar + "}",
                                   "null" if call is None else '"' + call + '"', res, va, sz,
                                   "{" + st + "}"))
    return "\n".join(lines) + "\n"


def _args(c: GroupConstants, n_importers: int, n_sources: int, shutdown: bool
          ) -> tuple[str, list[tuple[int, int, int]], dict[tuple[int, int], int]]:
    """The args texts of a clean run as one %-template (joined by newlines; ``%(d)s`` the
    process's device, ``%(iJ)s`` its J-th importer, ``%(oK)s`` its K-th owner, both
    ascending), its Imports (index, K, alloc) and its Sends' indices by (alloc, J).
    Why a template: filled and split in C once per file, not built per event."""
    args: list[str] = []
    S = args.append
    dev = '"devices": [%(d)s]'
    aliased = c.aliased
    S("")
    for a in range(c.allocs):
        al = f'"alloc": {a}'
        S(al); S(al)  # noqa: E702
        if a in aliased:
            S(al); S(f'{al}, "mapping": "plane", {dev}'); S(f'{al}, "mapping": "alias", {dev}')  # noqa
        else:
            S(f'{al}, "mapping": "plane", {dev}')
    sends: dict[tuple[int, int], int] = {}
    for a in range(c.allocs if n_importers else 0):
        S(f'"alloc": {a}')
        for j in range(n_importers):
            sends[(a, j)] = len(args)
            S(f'"alloc": {a}, "to": %(i{j})s')
    imports: list[tuple[int, int, int]] = []
    for k in range(n_sources):
        for a in range(c.allocs):
            imports.append((len(args), k, a))
            oa = f'"owner": %(o{k})s, "alloc": {a}'
            S(oa)
            if a in aliased and a not in c.owner_only:
                S(f'{oa}, "mapping": "plane"'); S(f'{oa}, "mapping": "alias"')  # noqa: E702
                S(f'{oa}, "mapping": "plane", {dev}'); S(f'{oa}, "mapping": "alias", {dev}')  # noqa
            else:
                S(f'{oa}, "mapping": "plane"'); S(f'{oa}, "mapping": "plane", {dev}')  # noqa
    S(""); S('"ready": true'); S('"decision": "publish", "failed": [], "missing": []'); S("")  # noqa
    if shutdown:
        S("")
        for _, k, a in reversed(imports):
            oa = f'"owner": %(o{k})s, "alloc": {a}'
            if a in aliased and a not in c.owner_only:
                S(f'{oa}, "mapping": "alias"')
            S(f'{oa}, "mapping": "plane"'); S(oa)  # noqa: E702
        for a in range(c.allocs - 1, -1, -1):
            al = f'"alloc": {a}'
            if a in aliased:
                S(f'{al}, "mapping": "alias"')
            S(f'{al}, "mapping": "plane"'); S(al)  # noqa: E702
        S(""); S("")  # noqa: E702
    return "\n".join(args), imports, sends


class _Plan(NamedTuple):
    """What the scheduler needs of one accepted file."""

    events: int
    vote: int
    decide: int
    imports: list[tuple[int, int, int]]
    sends: dict[tuple[int, int], int]
    final: str


_Key = tuple[object, ...]   # GroupHeader.plan_key(): what the files of one group share


def _check_file(source: str, text: str, shapes: "_Shapes") -> "_Checked | None":
    """(rank, plan key, constants, plan) when the file is its rank's clean run, else
    None."""
    nl = text.find("\n")
    if nl < 0:
        return None
    try:
        h: GroupHeader = _parse_group_header(unique_keys_loads(text[:nl]), source)
    except (TraceError, ValueError, RecursionError):
        return None
    c, p, lay = h.constants, h.rank, h.layout
    base = None if lay is None else lay.reservations[p][0]
    if c.allocs < 1 or lay is None or base is None:
        return None
    pkey = h.plan_key()
    body = text[nl + 1:]
    i = body.rfind('"action": "') + 11
    last = body[i:body.find('"', i)]
    if i < 11 or last not in ("Publish", "ShutdownComplete"):
        return None
    shutdown = last == "ShutdownComplete"
    sh = shapes.get(pkey)  # type: ignore[call-overload]
    if sh is None:
        sh = shapes[pkey] = {}  # type: ignore[index]
    shape, args, imports, sends = program(c, lay, p, h.own_device, shutdown, sh)
    n = len(shape.acts)
    # Every line is the program's but for t and the handle: split them out (one regex
    # pass that only looks for two keys), then compare what is left with the program's
    # text for this process, filled in C (its rank, device, importers, owners, VAs):
    # one string comparison checks seq, action, args, call, result, device, va, size
    # and state of every line, and that nothing else is in the file.
    parts = _STRIP.split(body)
    caps = parts[1::2]
    if len(caps) != 2 * n or caps[0::2].count(None) != n:
        return None
    hds = tuple(caps[1::2])
    if None in hds:
        return None
    vals = _values(c, p, h.own_device, base, shape.nn_offs)
    if "".join(parts[0::2]) != shape.text % itemgetter(*shape.kinds)(vals):
        return None
    del parts, caps
    # handles: each Create / Import returns a new one, every other names its own
    # (itemgetter: the lookups in C; index n is the "null" appended)
    hds = hds + ("null",)
    made = itemgetter(*shape.creators)(hds) if len(shape.creators) > 1 else \
        tuple(hds[k] for k in shape.creators)
    if "null" in made or len(set(made)) != len(made) or \
            itemgetter(*shape.href)(hds) != hds[:-1]:
        return None
    # (the files of one group share its plan and its run id)
    return p, (pkey, h.extra.get("run")), c, _Plan(
        n, shape.vote, shape.decide, imports, sends, "Shutdown" if shutdown else "Published")


def fast_accept_texts(named: Iterable[tuple[str, str]]) -> GroupVerdict | None:
    """:func:`fast_accept` on (source, text) pairs (an iterator: one file at a time)."""
    t0 = time.perf_counter()
    shapes: _Shapes = {}
    with gc_paused():
        return _verdict(t0, (_check_file(source, text, shapes) for source, text in named))


_Checked = tuple[int, _Key, GroupConstants, _Plan]
_Shapes = dict[Any, Any]   # plan key -> (shape key -> _Shape)


def _verdict(t0: float, checked: Iterable[_Checked | None]) -> GroupVerdict | None:
    plans: dict[int, _Plan] = {}
    first: GroupConstants | None = None
    key: _Key | None = None
    for got in checked:
        if got is None or got[0] in plans or (key is not None and key != got[1]):
            return None
        key, first = got[1], got[2]
        plans[got[0]] = got[3]
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


def _check_path(path: Path) -> _Checked | None:
    """:func:`_check_file` of one file, read here (a pool worker's task)."""
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError):
        return None
    with gc_paused():
        return _check_file(str(path), text, {})


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
    number of files, when the files hold more than :data:`PARALLEL_BYTES` and there are
    at least :data:`MIN_PARALLEL_CPUS` CPUs; starting a worker costs about half a
    second). Why: each
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
        cpus = _cpus()
        jobs = min(len(files), cpus) if size > PARALLEL_BYTES and cpus >= MIN_PARALLEL_CPUS \
            else 1
    if jobs <= 1 or len(files) < 2:
        shapes: _Shapes = {}

        def one(f: Path) -> _Checked | None:
            try:
                text = f.read_text(encoding="utf-8")
            except (OSError, UnicodeDecodeError):
                return None
            return _check_file(str(f), text, shapes)

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
