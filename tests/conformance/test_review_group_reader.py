"""Group files the readers took although the format forbids them (review 2026-12-07, a
hunt for conform holes): args, state or event keys the format does not have, a ready
vote with an error, a base for a process whose Reserve failed, the files of two runs
read as one group, and a failed undo naming no object. The fast reader (writer lines) and the checked one refuse
them alike."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from kvgrant.cli import main
from kvgrant.conformance.group_gen import simulate_group, write_group
from kvgrant.conformance.group_io import load_group, parse_proc_trace
from kvgrant.conformance.group_model import constants_from
from kvgrant.errors import TraceError
from kvgrant.traceformat import format_group_event

ROOT = Path(__file__).resolve().parents[2]
SMALL = ROOT / "examples" / "small.json"


def _record(out: Path, *extra: str) -> Path:
    assert main(["alloc", str(SMALL), "--backend", "sim", "--procs", "3", "--trace",
                 str(out), *extra]) in (0, 1)
    return out


@pytest.fixture(scope="module")
def recorded(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One clean 3-process run (a run costs seconds: the tests edit copies)."""
    return _record(tmp_path_factory.mktemp("group") / "g")


def _group(tmp_path: Path, recorded: Path) -> Path:
    return Path(shutil.copytree(recorded, tmp_path / "g"))


def _rewrite(path: Path, edit, *, fast: bool) -> int:
    """Apply ``edit(event) -> bool`` to the first event it accepts; write the file in
    the writer's format (``fast``) or with sorted keys; returns that event's line."""
    lines = path.read_text().splitlines()
    evs = [json.loads(x) for x in lines[1:]]
    k = next(i for i, e in enumerate(evs) if edit(e))
    out = [lines[0]] + [(format_group_event(e) if fast and set(e) <= _PLAIN else
                         json.dumps(e, sort_keys=not fast)) for e in evs]
    path.write_text("\n".join(out) + "\n")
    return k + 2


_PLAIN = {"kind", "seq", "t", "rank", "action", "args", "call", "result", "device", "va",
          "size", "handle", "state"}


def _set_arg(action: str, key: str, value: object):
    def edit(e: dict) -> bool:
        if e["action"] != action:
            return False
        e["args"][key] = value
        return True
    return edit


@pytest.mark.parametrize("fast", [True, False], ids=["writer-lines", "sorted-keys"])
@pytest.mark.parametrize("action, key, value, says", [
    ("Grant", "to", 2, "args.to = 2: Grant takes no to (its args: alloc, mapping, devices)"),
    ("ImportMap", "devices", [2], "args.devices = [2]: ImportMap takes no devices"),
    ("Reserve", "alloc", 3, "args.alloc = 3: Reserve takes no alloc (its args: none)"),
    ("Publish", "owner", 2, "args.owner = 2: Publish takes no owner"),
    ("Vote", "error", "boom", 'args.error = "boom": a ready vote carries no error'),
])
def test_an_arg_the_action_does_not_take_is_refused(tmp_path: Path, recorded: Path,
                                                    fast: bool, action: str, key: str,
                                                    value: object, says: str) -> None:
    d = _group(tmp_path, recorded)
    line = _rewrite(d / "rank0.ndjson", _set_arg(action, key, value), fast=fast)
    with pytest.raises(TraceError) as err:
        load_group([d])
    assert err.value.line == line and says in str(err.value), err.value


@pytest.mark.parametrize("where", ["event", "state"])
def test_a_key_the_format_does_not_have_is_refused(tmp_path: Path, recorded: Path,
                                                   where: str) -> None:
    d = _group(tmp_path, recorded)

    def edit(e: dict) -> bool:
        if e["action"] != "Publish":
            return False
        (e if where == "event" else e["state"])["published"] = True
        return True
    line = _rewrite(d / "rank0.ndjson", edit, fast=False)
    with pytest.raises(TraceError) as err:
        load_group([d])
    prefix = "" if where == "event" else "state."
    assert err.value.line == line
    assert f"{prefix}published = true: unknown key" in str(err.value), err.value


def test_a_base_for_a_process_whose_reserve_failed_is_refused(tmp_path: Path) -> None:
    d = _record(tmp_path / "g", "--fail-rank", "1", "--fail-at", "3")
    f = d / "rank1.ndjson"
    lines = f.read_text().splitlines()
    head, first = json.loads(lines[0]), json.loads(lines[1])
    assert first["action"] == "Reserve" and first["call"] == "cuMemAddressReserve"
    assert first["result"] != "CUDA_SUCCESS" and head["reservations"]["1"][0] is None
    load_group([d])   # as written: accepted by the reader
    head["reservations"]["1"][0] = 0x7F00_4000_0000
    f.write_text("\n".join([json.dumps(head)] + lines[1:]) + "\n")
    with pytest.raises(TraceError) as err:
        load_group([d])
    assert err.value.line == 1
    assert ("header.reservations[1].base = 0x7f0040000000: must be null: rank 1 never "
            "reserved (its Reserve failed at line 2)") in str(err.value), err.value


def test_files_of_two_runs_are_not_one_group(tmp_path: Path, recorded: Path) -> None:
    a, b = recorded, _record(tmp_path / "b")
    runs = {json.loads((d / "rank0.ndjson").read_text().splitlines()[0])["run"]
            for d in (a, b)}
    assert len(runs) == 2 and all(len(r) == 16 for r in runs)
    mixed = tmp_path / "mixed"
    mixed.mkdir()
    for src, r in ((a, 0), (b, 1), (a, 2)):
        shutil.copy(src / f"rank{r}.ndjson", mixed)
    with pytest.raises(TraceError) as err:
        load_group([mixed])
    assert "the files come from different runs" in str(err.value)
    assert main(["conform", str(mixed)]) == 2
    assert main(["conform", str(a)]) == 0


@pytest.mark.parametrize("fast", [True, False], ids=["writer-lines", "sorted-keys"])
def test_a_failed_group_undo_must_name_its_object(tmp_path: Path, fast: bool) -> None:
    # a group whose rank 1 fails late, then every failed-undo shape by hand: the reader
    # refuses an ImportUnmap / Release of a failed undo that names no range / handle
    c3 = constants_from(3, 2, [0, 1], [1], {0: [1], 1: [0], 2: []},
                        {r: [0, 1, 2] for r in range(3)})
    d = tmp_path / "g"
    write_group(simulate_group(c3, fail_at={1: 20}), d)
    for action, key in (("ImportUnmap", "va"), ("Release", "handle")):
        for f in sorted(d.glob("*.ndjson")):
            lines = f.read_text().splitlines()
            evs = [json.loads(x) for x in lines[1:]]
            k = next((i for i, e in enumerate(evs) if e["action"] == action), None)
            if k is None:
                continue
            bad = dict(evs[k], result="CUDA_ERROR_OUT_OF_MEMORY", **{key: None})
            text = (format_group_event(bad) if fast else json.dumps(bad, sort_keys=True))
            (tmp_path / "h").mkdir(exist_ok=True)
            one = tmp_path / "h" / f.name
            one.write_text("\n".join(lines[:k + 1] + [text] + lines[k + 2:]) + "\n")
            with pytest.raises(TraceError) as err:
                parse_proc_trace(one.read_text(), str(one))
            assert err.value.line == k + 2
            assert f"{key} = null: a failed {action} names its {key}" in str(err.value)
            break
        else:
            pytest.fail(f"no {action} in the group")
