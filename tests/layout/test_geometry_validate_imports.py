"""Issue #15: geometry.py and validate.py must not form an import cycle held apart by
imports inside functions. validate.py may name Geometry only for type checking;
geometry.py imports validate.py once, at the top."""

from __future__ import annotations

import ast
from pathlib import Path

import kvgrant.layout.geometry as geometry
import kvgrant.layout.validate as validate


def _imports(path: Path, *, skip_type_checking: bool) -> list[tuple[str, bool]]:
    """(module, at top level) for every import in the file."""
    tree = ast.parse(path.read_text())
    out: list[tuple[str, bool]] = []
    skipped: set[int] = set()
    if skip_type_checking:
        for node in tree.body:
            if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
                skipped |= {id(n) for n in ast.walk(node)}
    for node in ast.walk(tree):
        if id(node) in skipped:
            continue
        if isinstance(node, ast.ImportFrom) and node.module:
            out.append((node.module, node in tree.body))
        elif isinstance(node, ast.Import):
            out.extend((a.name, node in tree.body) for a in node.names)
    return out


def test_validate_never_imports_geometry_at_run_time() -> None:
    mods = _imports(Path(validate.__file__), skip_type_checking=True)
    assert all(m != "kvgrant.layout.geometry" for m, _top in mods), mods


def test_geometry_imports_validate_only_at_the_top() -> None:
    mods = _imports(Path(geometry.__file__), skip_type_checking=False)
    uses = [top for m, top in mods if m == "kvgrant.layout.validate"]
    assert uses == [True], mods
