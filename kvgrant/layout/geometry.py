"""The geometry file: the public input format of DESIGN.md, validated with pydantic.

Why a model and not dicts: every rule of the layout contract's input (G-multiples,
no overlaps, full region coverage, unique names, importers within declared readers)
is checked once here, and a violation becomes a :class:`GeometryError` naming the
field, the value and the rule -- never a traceback deeper in the planner.
"""

from __future__ import annotations

import json
from functools import cached_property
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from kvgrant.errors import GeometryError

__all__ = [
    "Alias",
    "Geometry",
    "Plane",
    "Region",
    "Topology",
    "load_geometry",
    "parse_geometry",
    "round_up",
]


def round_up(value: int, multiple: int) -> int:
    """Smallest multiple of ``multiple`` that is >= ``value``."""
    return -(-value // multiple) * multiple


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, strict=True)


class Plane(_Strict):
    """One KV tensor of a rank: ``pages`` pages of ``bytes_per_page`` bytes."""

    name: str = Field(min_length=1)
    bytes_per_page: int = Field(gt=0)


class Region(_Strict):
    """An alias region: ``rows`` contiguous rows of ``row_bytes`` bytes each."""

    name: str = Field(min_length=1)
    rows: int = Field(gt=0)
    row_bytes: int = Field(gt=0)
    access: Literal["importers", "owner"] = "importers"


class Alias(_Strict):
    """Declared chunk: region bytes [offset, offset+length) are plane bytes
    [plane_offset, plane_offset+length)."""

    region: str = Field(min_length=1)
    offset: int = Field(ge=0)
    plane: str = Field(min_length=1)
    plane_offset: int = Field(ge=0)
    length: int = Field(gt=0)


class Topology(_Strict):
    """Ranks of one tensor-parallel group, who imports whose memory, and who is declared."""

    ranks: int = Field(gt=0)
    import_groups: list[list[int]] = Field(default_factory=list)
    declared_readers: dict[int, list[int]] | None = None

    model_config = ConfigDict(extra="forbid", frozen=True, strict=False)


class Geometry(_Strict):
    """A validated geometry. All ranks of the topology share it."""

    name: str = Field(min_length=1)
    granularity: int = Field(gt=0)
    pages: int = Field(gt=0)
    page_tokens: int = Field(gt=0)
    planes: list[Plane] = Field(min_length=1)
    regions: list[Region] = Field(default_factory=list)
    aliases: list[Alias] = Field(default_factory=list)
    topology: Topology

    # -- derived sizes -------------------------------------------------------
    def plane_bytes(self, plane: str) -> int:
        """Reserved size of a plane: pages * bytes_per_page rounded up to G."""
        p = self.plane_by_name[plane]
        return round_up(self.pages * p.bytes_per_page, self.granularity)

    def region_bytes(self, region: str) -> int:
        """Reserved size of a region: rows * row_bytes rounded up to G."""
        r = self.region_by_name[region]
        return round_up(r.rows * r.row_bytes, self.granularity)

    @cached_property
    def plane_by_name(self) -> dict[str, Plane]:
        return {p.name: p for p in self.planes}

    @cached_property
    def region_by_name(self) -> dict[str, Region]:
        return {r.name: r for r in self.regions}

    # -- topology ------------------------------------------------------------
    def importers(self, rank: int) -> tuple[int, ...]:
        """Ranks other than ``rank`` that import its memory (its import group)."""
        for group in self.topology.import_groups:
            if rank in group:
                return tuple(sorted(r for r in group if r != rank))
        return ()

    def declared_readers(self, rank: int) -> tuple[int, ...]:
        """Readers the exported metadata declares for ``rank``'s memory (may overdeclare)."""
        declared = self.topology.declared_readers
        if declared is None or rank not in declared:
            return tuple(sorted({rank, *self.importers(rank)}))
        return tuple(sorted(set(declared[rank])))

    def granted_devices(self, rank: int, region: str | None = None, *,
                        declared: bool = False) -> tuple[int, ...]:
        """Devices a mapping of ``rank`` is granted to.

        Plane mappings and ``access: importers`` aliases go to owner + importers (or
        owner + declared readers when ``declared``, the pre-fix behaviour); ``access:
        owner`` aliases go to the owner only.
        """
        if region is not None and self.region_by_name[region].access == "owner":
            return (rank,)
        readers = self.declared_readers(rank) if declared else self.importers(rank)
        return tuple(sorted({rank, *readers}))

    @model_validator(mode="after")
    def _check_rules(self) -> "Geometry":
        from kvgrant.layout.validate import check_geometry_rules

        check_geometry_rules(self)
        return self


def _format_pydantic(err: ValidationError) -> str:
    lines = []
    for e in err.errors():
        loc = ".".join(str(x) for x in e["loc"]) or "<root>"
        value = e.get("input")
        shown = json.dumps(value)[:80] if isinstance(value, (int, float, str, bool, type(None))) else type(value).__name__
        lines.append(f"{loc} = {shown}: {e['msg']}")
    return "; ".join(lines)


def parse_geometry(data: Any) -> Geometry:
    """Validate a decoded geometry document; raise :class:`GeometryError` on any rule."""
    if not isinstance(data, dict):
        raise GeometryError(f"geometry must be a JSON object, got {type(data).__name__}",
                            field="<root>", value=type(data).__name__)
    try:
        return Geometry.model_validate(data)
    except ValidationError as err:
        first = err.errors()[0]
        # A GeometryError raised inside a validator arrives wrapped; unwrap it.
        ctx_err = first.get("ctx", {}).get("error")
        if isinstance(ctx_err, GeometryError):
            raise ctx_err from None
        raise GeometryError(f"invalid geometry: {_format_pydantic(err)}",
                            field=".".join(str(x) for x in first["loc"]),
                            value=first.get("input")) from None


def load_geometry(path: str | Path) -> Geometry:
    """Read and validate a geometry JSON file."""
    path = Path(path)
    try:
        text = path.read_text()
    except OSError as err:
        raise GeometryError(f"cannot read geometry file {path}: {err.strerror}",
                            field="<file>", value=str(path)) from None
    try:
        data = json.loads(text)
    except json.JSONDecodeError as err:
        raise GeometryError(f"{path}: not valid JSON at line {err.lineno} column {err.colno}: {err.msg}",
                            field="<file>", value=str(path)) from None
    return parse_geometry(data)
