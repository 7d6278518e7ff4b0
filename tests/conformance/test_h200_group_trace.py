"""The group traces recorded on 2 x H200 (one process per GPU) are a behaviour of the
group model (tests/fixtures/h200/README.md says how they were made)."""

from __future__ import annotations

import tarfile
from pathlib import Path

from kvgrant.conformance.group_check import check_group

FIXTURE = Path(__file__).resolve().parents[1] / "fixtures" / "h200" / "group-published-dcp8-2proc.tgz"


def test_the_h200_group_traces_conform(tmp_path: Path) -> None:
    with tarfile.open(FIXTURE) as tar:
        tar.extractall(tmp_path, filter="data")
    files = sorted(str(p) for p in (tmp_path / "grp").glob("rank*.ndjson"))
    assert len(files) == 2
    (verdict,) = check_group(files)
    assert verdict.accepted, verdict.summary()
    assert verdict.procs == 2 and verdict.events > 40_000


def test_a_cut_group_trace_is_not_accepted_as_a_shutdown(tmp_path: Path) -> None:
    """The same files with rank 1's last 100 events gone: the checker must not say that
    rank 1 shut down (it reads as a crash after Publish, or is rejected)."""
    with tarfile.open(FIXTURE) as tar:
        tar.extractall(tmp_path, filter="data")
    r1 = tmp_path / "grp" / "rank1.ndjson"
    lines = r1.read_text().splitlines(keepends=True)
    r1.write_text("".join(lines[:-100]))
    (verdict,) = check_group(sorted(str(p) for p in (tmp_path / "grp").glob("rank*.ndjson")))
    assert not verdict.accepted or "r1 Shutdown" not in verdict.summary()
