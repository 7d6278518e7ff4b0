"""tools/cuda_mutants.py runs on the GPU host only; here (no GPU needed) each of its
mutants must still apply to runtime/cuda.py as it is, so the tool is not left naming
code that moved."""

from __future__ import annotations

import runpy
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_every_cuda_mutant_names_text_that_occurs_once_in_the_backend() -> None:
    tool = runpy.run_path(str(ROOT / "tools" / "cuda_mutants.py"), run_name="not_main")
    source = (ROOT / "runtime" / "cuda.py").read_text()
    names = [name for name, _, _ in tool["MUTANTS"]]
    assert len(names) == len(set(names)) >= 15
    for name, old, new in tool["MUTANTS"]:
        assert source.count(old) == 1, name
        assert new != old, name
