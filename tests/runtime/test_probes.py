"""The tracing probes run end to end (sim backend / emulated calls) and print one line
per variant; their figures are for the GPU host, here only their shape."""

from __future__ import annotations

from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def _variant_lines(text: str) -> dict[str, str]:
    return {line.split("|")[0].strip(): line for line in text.splitlines() if "|" in line}


def test_probe_trace_parts_reports_every_variant(load_benchmark, capsys) -> None:
    variants = ["hotpath", "keep", "idlethread", "drop@5", "devnull@5", "process@5",
                "thread"]
    main = load_benchmark("probe_trace_parts.py")["main"]
    rc = main([str(ROOT / "examples" / "small.json"), "--ranks", "2", "--backend", "sim",
               "--rounds", "2", "--variants", ",".join(variants)])
    assert rc == 0
    lines = _variant_lines(capsys.readouterr().out)
    assert list(lines) == variants
    assert all("own" in line and "driver" in line for line in lines.values())


def test_probe_trace_parts_refuses_an_unknown_renderer(load_benchmark) -> None:
    main = load_benchmark("probe_trace_parts.py")["main"]
    with pytest.raises(ValueError, match="renderer = 'fork'"):
        main([str(ROOT / "examples" / "small.json"), "--ranks", "2", "--backend", "sim",
              "--rounds", "1", "--variants", "fork"])


def test_probe_writer_wakes_reports_every_variant(load_benchmark, capsys) -> None:
    variants = ["hotpath", "process@5", "thread@5"]
    main = load_benchmark("probe_writer_wakes.py")["main"]
    rc = main(["--rounds", "2", "--calls", "300", "--variants", ",".join(variants)])
    assert rc == 0
    out = capsys.readouterr().out
    assert "300 emulated calls, 2 rounds" in out
    assert list(_variant_lines(out)) == variants
