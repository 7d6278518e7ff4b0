"""The geometry file: the public input format of DESIGN.md, validated with pydantic.

Why a model and not dicts: every rule of the layout contract's input (G-multiples,
no overlaps, full region coverage, unique names, importers within declared readers)
is checked once here, and a violation becomes a :class:`GeometryError` naming the
field, the value and the rule -- never a traceback deeper in the planner.
"""

from __future__ import annotations

import json
import os
import re
from functools import cached_property
from pathlib import Path
from typing import Annotated, Any, Literal, Mapping

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from kvgrant.errors import ArgumentError, GeometryError
from kvgrant.strict_json import (DuplicateKeyError, HugeIntegerError, NonFiniteNumberError,
                                 field_path, strict_json_loads)
# validate.py imports nothing from this module at run time (only for type checking),
# so the two never form an import cycle (issue #15).
from kvgrant.layout.validate import check_geometry_rules, show_path, show_value

__all__ = [
    "Alias",
    "Geometry",
    "MAX_BYTES",
    "MAX_FILE_BYTES",
    "MAX_RANKS",
    "MAX_ROWS",
    "Plane",
    "Region",
    "Topology",
    "load_geometry",
    "on_ranks",
    "parse_geometry",
    "require_geometry",
    "round_up",
    "show_value",
]

MAX_BYTES = (1 << 63) - 1
"""Largest byte count or offset accepted (the driver's sizes are 64-bit)."""
MAX_RANKS = 1 << 16
"""Largest ``topology.ranks`` accepted (pre-flight and reports walk every rank)."""
MAX_ROWS = 1 << 20
"""Largest ``rows`` of one region accepted (conflict sets are kept per row)."""
MAX_FILE_BYTES = 64 << 20
"""Largest geometry file read (the published examples are 250 KB; ``/dev/zero`` is not)."""
MAX_NAME_CHARS = 256
"""Longest plane, region or geometry name."""

Bytes = Annotated[int, Field(ge=0, le=MAX_BYTES)]
PositiveBytes = Annotated[int, Field(gt=0, le=MAX_BYTES)]
Rank = Annotated[int, Field(ge=0, lt=MAX_RANKS)]


def round_up(value: int, multiple: int) -> int:
    """Smallest multiple of ``multiple`` that is >= ``value``."""
    return -(-value // multiple) * multiple


class _Strict(BaseModel):
    """The geometry's models: a broken rule is a GeometryError however they are built
    (``Geometry(**doc)``, ``Plane(...)``, ``model_validate``, ``model_validate_json``),
    as from :func:`parse_geometry`; pydantic's ValidationError (a traceback with a URL)
    reached users who built the exported classes themselves."""

    model_config = ConfigDict(extra="forbid", frozen=True, strict=True)

    def __init__(self, /, **data: Any) -> None:
        try:
            super().__init__(**data)
        except ValidationError as err:
            raise _geometry_error(err) from None

    # pydantic calls a model's own __init__ for every nested instance unless it is
    # marked as its base one: this one adds nothing to validation, and without the mark
    # parse_geometry of 100,000 aliases took 0.94 s instead of 0.58 s (and a nested
    # error lost its location, planes[0]); only a direct call comes here
    __init__.__pydantic_base_init__ = True  # type: ignore[attr-defined]

    @classmethod
    def model_validate(cls, obj: Any, **kwargs: Any) -> Any:  # type: ignore[override]
        try:
            return super().model_validate(obj, **kwargs)
        except ValidationError as err:
            raise _geometry_error(err) from None

    @classmethod
    def model_validate_json(cls, json_data: Any, **kwargs: Any) -> Any:  # type: ignore[override]
        try:
            return super().model_validate_json(json_data, **kwargs)
        except ValidationError as err:
            raise _geometry_error(err) from None


def _check_name(value: str) -> str:
    """Names are printed to terminals and traces: no control, format (bidi override,
    zero-width) or other non-printable characters, no surrounding blanks."""
    bad = next((ch for ch in value if not ch.isprintable()), None)
    if bad is not None:
        raise ValueError(f"names must be printable text; character U+{ord(bad):04X} at "
                         f"position {value.index(bad)} is a control or format character")
    if value != value.strip():
        raise ValueError("names must not start or end with white space")
    return value


Name = Annotated[str, Field(min_length=1, max_length=MAX_NAME_CHARS),
                 AfterValidator(_check_name)]


class Plane(_Strict):
    """One KV tensor of a rank: ``pages`` pages of ``bytes_per_page`` bytes."""

    name: Name
    bytes_per_page: PositiveBytes


class Region(_Strict):
    """An alias region: ``rows`` contiguous rows of ``row_bytes`` bytes each."""

    name: Name
    rows: int = Field(gt=0, le=MAX_ROWS)
    row_bytes: PositiveBytes
    access: Literal["importers", "owner"] = "importers"


class Alias(_Strict):
    """Declared chunk: region bytes [offset, offset+length) are plane bytes
    [plane_offset, plane_offset+length)."""

    region: Name
    offset: Bytes
    plane: Name
    plane_offset: Bytes
    length: PositiveBytes


class Topology(_Strict):
    """Ranks of one tensor-parallel group, who imports whose memory, and who is declared."""

    ranks: int = Field(gt=0, le=MAX_RANKS)
    import_groups: list[list[Rank]] = Field(default_factory=list)
    declared_readers: dict[Rank, list[Rank]] | None = None

    @field_validator("declared_readers", mode="before")
    @classmethod
    def _owner_keys(cls, value: Any) -> Any:
        """JSON object keys are strings: accept decimal rank numbers ("0", "15") only."""
        if not isinstance(value, dict):
            return value
        out: dict[Any, Any] = {}
        for key, readers in value.items():
            if isinstance(key, str) and _DECIMAL.fullmatch(key):
                owner: Any = int(key)
            elif isinstance(key, int) and not isinstance(key, bool):
                owner = key
            elif isinstance(key, str) and re.fullmatch(r"[0-9]+", key, re.ASCII):
                # decimal, but past any rank (was: "must be ... written in decimal")
                raise GeometryError(
                    f"topology.declared_readers key = {show_value(key)}: not a rank (ranks "
                    f"are 0..{MAX_RANKS - 1} at most, and below topology.ranks)",
                    field="topology.declared_readers", value=key)
            else:
                raise GeometryError(
                    f"topology.declared_readers key = {show_value(key)}: owner keys must be "
                    "rank numbers written in decimal (e.g. \"0\")",
                    field="topology.declared_readers", value=key)
            if owner in out:
                raise GeometryError(
                    f"topology.declared_readers key = {show_value(key)}: owner {owner} is "
                    "listed twice", field="topology.declared_readers", value=key)
            out[owner] = readers
        return out


class Geometry(_Strict):
    """A validated geometry. All ranks of the topology share it."""

    name: Name
    granularity: PositiveBytes
    pages: PositiveBytes
    page_tokens: PositiveBytes
    planes: list[Plane] = Field(min_length=1)
    regions: list[Region] = Field(default_factory=list)
    aliases: list[Alias] = Field(default_factory=list)
    topology: Topology

    # -- derived sizes -------------------------------------------------------
    def plane_bytes(self, plane: str) -> int:
        """Reserved size of a plane: pages * bytes_per_page rounded up to G."""
        p = self.named_plane(plane)
        return round_up(self.pages * p.bytes_per_page, self.granularity)

    def region_bytes(self, region: str) -> int:
        """Reserved size of a region: rows * row_bytes rounded up to G."""
        r = self.named_region(region)
        return round_up(r.rows * r.row_bytes, self.granularity)

    def named_plane(self, name: str) -> Plane:
        """The plane called ``name``; a name this geometry lacks is a
        :class:`GeometryError` naming it and the planes there are (was: ``KeyError``)."""
        try:
            return self.plane_by_name[name]
        except (KeyError, TypeError):
            raise _unknown_name("plane", name, self.plane_by_name) from None

    def named_region(self, name: str) -> Region:
        """The region called ``name``, as :meth:`named_plane` for planes."""
        try:
            return self.region_by_name[name]
        except (KeyError, TypeError):
            raise _unknown_name("region", name, self.region_by_name) from None

    def check_rank(self, rank: int) -> int:
        """``rank`` when it is one of this geometry's ranks, else a
        :class:`GeometryError` naming the range. Why: ``importers(99)`` said ``()`` and
        ``granted_devices(99)`` ``(99,)`` for a rank the topology does not have."""
        n = self.topology.ranks
        if isinstance(rank, bool) or not isinstance(rank, int) or not 0 <= rank < n:
            raise GeometryError(f"rank = {rank!r}: must be a rank of this geometry, "
                                f"0..{n - 1} (topology.ranks = {n})", field="rank",
                                value=rank)
        return rank

    @cached_property
    def plane_by_name(self) -> dict[str, Plane]:
        return {p.name: p for p in self.planes}

    @cached_property
    def region_by_name(self) -> dict[str, Region]:
        return {r.name: r for r in self.regions}

    @cached_property
    def first_row(self) -> Mapping[str, int]:
        """Per region, the number of its first row when the rows of all regions are
        numbered in geometry order (how the bulk arrays of conflict ranges, labels
        and the exact model's coverage rows index rows)."""
        from types import MappingProxyType

        out: dict[str, int] = {}
        n = 0
        for r in self.regions:
            out[r.name] = n
            n += r.rows
        return MappingProxyType(out)

    @cached_property
    def _declared_ranges(self) -> Any:
        # see kvgrant.layout.conflicts.declared_conflict_ranges
        from types import MappingProxyType

        from kvgrant.layout.conflicts import conflict_ranges

        return MappingProxyType(conflict_ranges(self, self.aliases))

    @cached_property
    def _memo(self) -> dict[Any, Any]:
        # results of pure functions of this geometry that the planners, both bounds
        # and the report each ask for (kvgrant.layout.granules): computed once
        return {}

    # -- topology ------------------------------------------------------------
    @cached_property
    def _import_group_of(self) -> dict[int, tuple[int, ...]]:
        # one tuple per group, shared by its members (a tuple per member made one group
        # of 65,536 ranks take 34 GB)
        out: dict[int, tuple[int, ...]] = {}
        for group in self.topology.import_groups:
            members = tuple(sorted(set(group)))
            for r in members:
                out[r] = members
        return out

    @cached_property
    def _declared_count(self) -> dict[int, int]:
        declared = self.topology.declared_readers or {}
        return {r: len({r, *readers}) for r, readers in declared.items()}

    def importers(self, rank: int) -> tuple[int, ...]:
        """Ranks other than ``rank`` that import its memory (its import group)."""
        self.check_rank(rank)
        return tuple(r for r in self._import_group_of.get(rank, ()) if r != rank)

    def declared_readers(self, rank: int) -> tuple[int, ...]:
        """Readers the exported metadata declares for ``rank``'s memory (may overdeclare)."""
        self.check_rank(rank)
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
        self.check_rank(rank)
        if region is not None and self.named_region(region).access == "owner":
            return (rank,)
        readers = self.declared_readers(rank) if declared else self.importers(rank)
        return tuple(sorted({rank, *readers}))

    def granted_count(self, rank: int, region: str | None = None, *,
                      declared: bool = False) -> int:
        """``len(granted_devices(rank, region, declared=declared))`` without building
        the tuple: pre-flight and the bounds ask it for every rank, and building
        ranks x group-size tuples made a 4,096-rank import group take a minute."""
        self.check_rank(rank)  # (was: rank 99 of 2 counted 1, a list raised TypeError)
        if region is not None and self.named_region(region).access == "owner":
            return 1
        if declared and rank in self._declared_count:
            return self._declared_count[rank]
        return len(self._import_group_of.get(rank, ())) or 1

    def __getstate__(self) -> dict[Any, Any]:
        """Pickle the fields only: the cached derived values (conflict ranges are a
        read-only mappingproxy, which pickle refuses) are recomputed on demand, so a
        planned geometry can still go to worker processes."""
        state = super().__getstate__()
        fields = type(self).model_fields
        state["__dict__"] = {k: v for k, v in state["__dict__"].items() if k in fields}
        return state

    def __copy__(self) -> "Geometry":
        """A copy without the cached derived values: ``model_copy(update=...)`` must not
        share this geometry's memo or keep conflict sets of the fields it changes."""
        new = super().__copy__()
        fields = type(self).model_fields
        for k in [k for k in new.__dict__ if k not in fields]:
            del new.__dict__[k]
        return new

    def __deepcopy__(self, memo: dict[int, Any] | None = None) -> "Geometry":
        """A deep copy of the fields only (the cached values hold a mappingproxy,
        which deepcopy refuses, and would be stale after ``model_copy(update=...)``)."""
        return BaseModel.__deepcopy__(self.__copy__(), memo)

    @model_validator(mode="after")
    def _check_rules(self) -> "Geometry":
        check_geometry_rules(self)
        return self


#: An owner key: ASCII decimal, leading zeros allowed ("0000001" was refused as "not a
#: rank" while "000000" was read as rank 0); zeros capped so int() stays cheap.
_DECIMAL = re.compile(r"0{0,64}[0-9]{1,6}")
def _unknown_name(kind: str, name: object, known: Mapping[str, object]) -> GeometryError:
    names = list(known)
    shown = ", ".join(map(repr, names[:8])) + (f", ... {len(names) - 8} more"
                                               if len(names) > 8 else "")
    return GeometryError(f"{kind} = {show_value(name)}: no such {kind} in this geometry "
                         f"(its {kind}s: {shown or 'none'})", field=kind, value=name)


def _geometry_error(err: ValidationError) -> GeometryError:
    """The GeometryError for pydantic's ``err``: a GeometryError a validator raised (it
    arrives wrapped), else every rule broken, the first one's field and value."""
    errors = err.errors(include_url=False)
    for e in errors:
        ctx_err = e.get("ctx", {}).get("error")
        if isinstance(ctx_err, GeometryError):
            return ctx_err
    first = errors[0]
    # a missing field has no value (pydantic's input is then the whole object around
    # it, which the JSON document showed as a cut Python repr)
    return GeometryError(f"invalid geometry: {_format_pydantic(err)}",
                         field=field_path(list(first["loc"])),
                         value=None if first.get("type") == "missing" else first.get("input"))


def _format_pydantic(err: ValidationError) -> str:
    lines = []
    for e in err.errors(include_url=False):
        loc = field_path(list(e["loc"]))  # planes[0].bytes_per_page, as every rule says
        if e["type"] == "missing":
            lines.append(f"{loc}: missing (the field is required)")
        else:
            lines.append(f"{loc} = {show_value(e.get('input'))}: {e['msg']}")
    return "; ".join(lines[:10]) + (f"; and {len(lines) - 10} more" if len(lines) > 10 else "")


def parse_geometry(data: Any) -> Geometry:
    """Validate a decoded geometry document; raise :class:`GeometryError` on any rule."""
    if not isinstance(data, dict):
        raise GeometryError(_not_an_object(data), field="<root>", value=_json_kind(data))
    try:
        return Geometry.model_validate(data)   # a GeometryError on any rule (_Strict)
    except RecursionError:
        raise GeometryError("invalid geometry: nested too deeply", field="<root>",
                            value=None) from None


def load_geometry(path: str | Path) -> Geometry:
    """Read and validate a geometry JSON file (at most :data:`MAX_FILE_BYTES`)."""
    if isinstance(path, bytes) or not isinstance(path, (str, os.PathLike)):
        raise GeometryError(f"path = {show_value(path)}: load_geometry takes a file path "
                            "(str or os.PathLike)", field="<file>", value=path)
    if not os.fspath(path):  # Path("") is ".", reported as "Is a directory"
        raise GeometryError('path = "": load_geometry takes a file path, not an empty '
                            "string", field="<file>", value="")
    path = Path(path)
    try:
        with path.open("rb") as fh:
            raw = fh.read(MAX_FILE_BYTES + 1)
    except (OSError, ValueError) as err:  # ValueError: a NUL byte in the path
        reason = getattr(err, "strerror", None) or str(err)
        raise GeometryError(f"cannot read geometry file {show_path(path)}: {reason}",
                            field="<file>", value=str(path)) from None
    if len(raw) > MAX_FILE_BYTES:
        raise GeometryError(f"{show_path(path)}: larger than {MAX_FILE_BYTES:,} bytes "
                            "(a geometry file is a small JSON document)", field="<file>",
                            value=str(path))
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as err:
        raise GeometryError(f"{show_path(path)}: not UTF-8 text (byte {err.start}): a "
                            "geometry file is JSON",
                            field="<file>", value=str(path)) from None
    data = _decode_json(text, show_path(path))
    if not isinstance(data, dict):  # named with the file (was: "got NoneType", no file)
        raise GeometryError(f"{show_path(path)}: {_not_an_object(data)}", field="<root>",
                            value=_json_kind(data))
    try:
        return parse_geometry(data)
    except GeometryError as err:  # named with the file, as the JSON errors are (was not)
        raise GeometryError(f"{show_path(path)}: {err}", field=err.field,
                            value=err.value) from None


def _json_kind(value: Any) -> str:
    """The JSON name of a decoded value's type (not Python's: ``null``, not NoneType)."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, (int, float)):
        return "a number"
    if isinstance(value, str):
        return "a string"
    if isinstance(value, (list, tuple)):
        return "an array"
    return "an object" if isinstance(value, dict) else type(value).__name__


def _not_an_object(value: Any) -> str:
    return f"a geometry must be a JSON object ({{\"name\": ..., \"granularity\": ...}}), " \
           f"got {_json_kind(value)}"


def _decode_json(text: str, where: str) -> Any:
    """json.loads with every failure turned into a GeometryError naming the place."""
    try:
        return strict_json_loads(text)
    except DuplicateKeyError as err:
        raise GeometryError(f"{where}: {err}", field=err.key, value=where) from None
    except NonFiniteNumberError as err:  # names the field (was: "unreadable JSON value")
        raise GeometryError(f"{where}: {err}", field=err.field, value=err.value) from None
    except HugeIntegerError as err:  # names the field (was: "unreadable JSON value:
        # Exceeds the limit (4300 digits) ... use sys.set_int_max_str_digits() t")
        # ("unreadable JSON value" stays: tests/layout/test_geometry.py looks for it)
        raise GeometryError(f"{where}: {err.field} = {err.value}: unreadable JSON value: a "
                            f"number with more than {err.limit:,} digits; no count or size "
                            f"in a geometry is that large (at most {MAX_BYTES:,})",
                            field=err.field, value=err.value) from None
    except json.JSONDecodeError as err:
        raise GeometryError(f"{where}: not valid JSON at line {err.lineno} column {err.colno}: "
                            f"{err.msg}", field="<file>", value=where) from None
    except RecursionError:
        raise GeometryError(f"{where}: JSON nested too deeply", field="<file>",
                            value=where) from None
    except ValueError as err:  # e.g. an integer literal past Python's digit limit
        raise GeometryError(f"{where}: unreadable JSON value: {str(err)[:120]}",
                            field="<file>", value=where) from None


def require_geometry(value: Any, function: str, argument: str = "g") -> "Geometry":
    """``value`` when it is a :class:`Geometry`, else an :class:`ArgumentError` naming
    the function, the argument and the value (``packed_plan("small.json")`` raised
    ``AttributeError: 'str' object has no attribute 'model_dump'``)."""
    if not isinstance(value, Geometry):
        raise ArgumentError(
            f"{function}: {argument} = {show_value(value)}: must be a Geometry (read a "
            "geometry file with kvgrant.layout.load_geometry(path))",
            argument=argument, value=value)
    return value


#: on_ranks builds ranks x ranks reader lists; beyond one host's GPUs it is a typo.
MAX_ALL_TO_ALL_RANKS = 1024


def on_ranks(g: Geometry, ranks: int) -> Geometry:
    """The same layout on ``ranks`` ranks that all import each other.

    Why: a published-scale layout declared for 16 ranks can then run on the GPUs a
    test host really has (e.g. 2), with the same per-rank plan and one import group.
    """
    require_geometry(g, "on_ranks")  # was: AttributeError: ... no attribute 'model_dump'
    if type(ranks) is not int or not 1 <= ranks <= MAX_ALL_TO_ALL_RANKS:
        raise GeometryError(f"ranks = {ranks!r}: must be an integer in 1..{MAX_ALL_TO_ALL_RANKS} "
                            "(every rank imports every other)", field="ranks", value=ranks)
    doc = g.model_dump()
    group = list(range(ranks))
    doc["topology"] = {"ranks": ranks, "import_groups": [group] if ranks > 1 else [],
                       "declared_readers": {str(r): group for r in group}}
    return parse_geometry(doc)
