"""Plan files: a packed plan written once (``kvgrant plan --json``) and reused
(``kvgrant alloc --plan FILE``).

Why: planning the published layout takes a couple of seconds of CPU; a serving host
that starts many times, or runs one process per rank, should plan once and give every
process the same plan. The file names the layout it was made for by
:func:`geometry_hash`, so a plan is never applied to another layout.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path
from typing import Any

from kvgrant.errors import ArgumentError, PlanFileError
from kvgrant.layout.contract import _MAX_LISTED, check_contract
from kvgrant.layout.geometry import MAX_FILE_BYTES, Geometry, require_geometry, show_value
from kvgrant.layout.plan import Allocation, PhysicalPlan
from kvgrant.layout.rules import naive_plan, reference_plan
from kvgrant.layout.validate import show_path
from kvgrant.strict_json import (DuplicateKeyError, HugeIntegerError, NonFiniteNumberError,
                                 field_path, strict_json_loads)

__all__ = ["PLAN_FILE_VERSION", "PLAN_LABELS", "geometry_hash", "load_plan_document",
           "plan_document", "plan_from_document", "read_plan_file"]

PLAN_FILE_VERSION = 1
#: Plan labels a plan file may carry (the trace header and ``kvgrant conform
#: --geometry`` name the plan by it; it is printed, so no free text).
PLAN_LABELS = ("naive", "reference", "packed")
#: The keys of a plan document (:func:`plan_document`), then those the plan cache adds
#: (runtime/plancache.py): any other key is refused, so a typo (``"lable"``) is not
#: silently read as the default.
_DOCUMENT_KEYS = ("version", "label", "geometry", "geometry_hash", "allocations")
_CACHE_KEYS = ("cache_key", "cache_format")


def geometry_hash(g: Geometry) -> str:
    """SHA-256 of what a plan depends on: G, pages, planes, regions and aliases
    (not the name, page tokens or topology: every rank of any topology uses the same
    plan)."""
    require_geometry(g, "geometry_hash")
    doc = g.model_dump(exclude={"name", "topology", "page_tokens"})
    text = json.dumps(doc, sort_keys=True, separators=(",", ":"))
    return "sha256:" + hashlib.sha256(text.encode()).hexdigest()


def plan_document(plan: PhysicalPlan) -> dict[str, Any]:
    """The JSON form of a plan, with the hash of the layout it was made for."""
    if not isinstance(plan, PhysicalPlan):
        raise ArgumentError(f"plan_document: plan = {show_value(plan)}: must be a "
                            "PhysicalPlan (kvgrant.layout.plans.make_plan)", argument="plan",
                            value=plan)
    return {"version": PLAN_FILE_VERSION, "label": plan.label,
            "geometry": plan.geometry.name, "geometry_hash": geometry_hash(plan.geometry),
            "allocations": [a.to_json() for a in plan.allocations]}


def _fail(path: Path, field: str, value: Any, rule: str) -> PlanFileError:
    """The error naming the file, the field, the value and the rule."""
    return PlanFileError(f"plan file {show_path(path)}: {field} = {show_value(value)}: "
                         f"{rule}", path=str(path), field=field, value=value)


def _file_fail(path: Path, rule: str) -> PlanFileError:
    """The error about the file as a whole (field ``<file>``, as for geometry files)."""
    return PlanFileError(f"plan file {show_path(path)}: {rule}", path=str(path),
                         field="<file>", value=str(path))


def read_plan_file(path: str | Path, g: Geometry) -> PhysicalPlan:
    """The plan in ``path`` (a plan document, or a ``kvgrant plan --json`` report,
    whose ``packed_plan`` is used), checked to be made for ``g``'s layout and to keep
    its layout contract.

    Raises
    ------
    PlanFileError
        Unreadable file, not JSON, wrong version, made for another layout, a
        malformed allocation, or a plan that breaks the layout contract (naming the
        file, the field, the value and the rule): bad input, exit status 2 in the CLI.
    """
    if isinstance(path, bytes) or not isinstance(path, (str, os.PathLike)):
        raise ArgumentError(f"read_plan_file: path = {show_value(path)}: must be a file "
                            "path (str or os.PathLike)", argument="path", value=path)
    require_geometry(g, "read_plan_file")
    path = Path(path)
    return plan_from_document(load_plan_document(path), g, path)


def load_plan_document(path: str | Path) -> Any:
    """The decoded JSON of the plan file ``path`` (at most :data:`MAX_FILE_BYTES`),
    not yet checked: :func:`plan_from_document` checks it."""
    path = Path(path)
    try:
        with path.open("rb") as fh:
            raw = fh.read(MAX_FILE_BYTES + 1)
    except (OSError, ValueError) as err:  # ValueError: a NUL byte in the path
        reason = getattr(err, "strerror", None) or str(err)
        raise _file_fail(path, f"cannot read it: {reason}") from None
    if len(raw) > MAX_FILE_BYTES:
        raise _file_fail(path, f"larger than {MAX_FILE_BYTES:,} bytes (a "
                    "plan document is a small JSON file written by kvgrant plan --json)")
    try:
        return strict_json_loads(raw.decode("utf-8"))
    except DuplicateKeyError as err:
        raise PlanFileError(f"plan file {show_path(path)}: not a plan document: {err}",
                            path=str(path), field=err.key, value=str(path)) from None
    except NonFiniteNumberError as err:  # names the field (was: "not JSON: NaN is not ...")
        raise PlanFileError(f"plan file {show_path(path)}: {err}", path=str(path),
                            field=err.field, value=err.value) from None
    except HugeIntegerError as err:  # names the field (was: "not JSON: Exceeds the limit")
        raise PlanFileError(f"plan file {show_path(path)}: {err.field} = {err.value}: a "
                            f"number with more than {err.limit:,} digits: no offset or "
                            "length in a plan is that large", path=str(path),
                            field=err.field, value=err.value) from None
    except (UnicodeDecodeError, ValueError) as err:
        raise _file_fail(path, f"not JSON: {str(err)[:120]}") from None
    except RecursionError:
        raise _file_fail(path, "not a plan document: JSON nested too "
                    "deeply") from None


def plan_from_document(doc: Any, g: Geometry, path: str | Path) -> PhysicalPlan:
    """The plan of a decoded plan document (or ``kvgrant plan --json`` report) read
    from ``path``, checked field by field, against ``g``'s hash and against the layout
    contract; :class:`PlanFileError` names the first broken rule."""
    path = Path(path)
    if isinstance(doc, dict) and "packed_plan" in doc:
        doc = doc["packed_plan"]
    if not isinstance(doc, dict):
        raise _fail(path, "<root>", doc, "must be a JSON object (a plan document)")
    version = doc.get("version")
    if type(version) is not int or version != PLAN_FILE_VERSION:
        raise _fail(path, "version", version,
                    f"must be {PLAN_FILE_VERSION} (write the file with kvgrant plan --json)")
    unknown = next((k for k in doc if k not in _DOCUMENT_KEYS + _CACHE_KEYS), None)
    if unknown is not None:
        name = field_path([unknown])
        raise PlanFileError(
            f"plan file {show_path(path)}: {name}: unknown key (a plan document has the "
            f"keys {', '.join(_DOCUMENT_KEYS)}; a plan cache file also "
            f"{', '.join(_CACHE_KEYS)})", path=str(path), field=name, value=unknown)
    label = doc.get("label", "packed")
    if not isinstance(label, str) or label not in PLAN_LABELS:
        raise _fail(path, "label", label, f"must be one of {', '.join(PLAN_LABELS)}")
    for key, rule in (("geometry", "the name of the geometry the plan was made for"),
                      ("geometry_hash", "geometry_hash(g) of the layout the plan was made "
                                        "for (\"sha256:...\")"),
                      ("cache_key", "the plan cache's key"),
                      ("cache_format", "the plan cache's format")):
        if key in doc and not isinstance(doc[key], str):
            raise _fail(path, key, doc[key], f"must be a string: {rule}")
    want = geometry_hash(g)
    if "geometry_hash" not in doc:  # (was "geometry_hash = null: ... another layout")
        raise _fail(path, "geometry_hash", None, f"missing: a plan file names the layout "
                    f"it was made for (kvgrant plan --json writes it; geometry {g.name!r} "
                    f"has {want})")
    if doc.get("geometry_hash") != want:
        raise _fail(path, "geometry_hash", doc.get("geometry_hash"),
                    f"the plan was made for another layout; geometry {g.name!r} has {want}")
    plan = PhysicalPlan(label, g, _allocations(path, doc.get("allocations"), g),
                        (f"read from {path}",))
    _check_fits(path, g, plan)
    _check_rule_label(path, g, plan)
    return plan


def _check_rule_label(path: Path, g: Geometry, plan: PhysicalPlan) -> None:
    """A ``naive`` or ``reference`` plan is exactly the plan its rule gives ``g``.

    Why: the label travels into the trace header, and ``kvgrant conform --geometry``
    re-derives the plan of a rule label from the geometry: a packed plan relabelled
    ``naive`` would be allocated and its trace then rejected. Only ``packed`` plans
    may differ from this kvgrant's (another planner version's optimum)."""
    if plan.label == "packed":
        return
    want = (naive_plan if plan.label == "naive" else reference_plan)(g).allocations
    if plan.allocations == want:
        return
    i = next((i for i, (a, b) in enumerate(zip(plan.allocations, want)) if a != b),
             min(len(plan.allocations), len(want)))
    if i < len(plan.allocations):
        field, value = f"allocations[{i}]", plan.allocations[i].to_json()
    else:
        field, value = "allocations", len(plan.allocations)
    shown = (f"the rule gives {want[i].to_json()}" if i < len(want) else
             f"the rule gives {len(want):,} allocations")
    raise _fail(path, field, value, f"a plan labelled {plan.label!r} must be the "
                f"{plan.label} rule's plan of {g.name!r} ({len(want):,} allocations; "
                f"{shown}); label other plans 'packed'")


_ALLOCATION_KEYS = frozenset({"plane", "plane_offset", "length", "region", "region_offset"})


def _allocations(path: Path, allocs: Any, g: Geometry) -> tuple[Allocation, ...]:
    """The ``allocations`` list, each entry checked for its keys and value types."""
    if not isinstance(allocs, list):
        raise _fail(path, "allocations", allocs, "must be a list of allocations")
    # every allocation holds at least one granule of a plane, so a longer list cannot
    # keep the contract (and would only make the contract check slow)
    granules = sum(g.plane_bytes(p.name) for p in g.planes) // g.granularity
    if len(allocs) > granules:
        raise _fail(path, "allocations", allocs, f"has {len(allocs):,} allocations; a plan "
                    f"of this layout has at most {granules:,} (one per granule of its "
                    "planes)")
    planes = {p.name for p in g.planes}
    regions = {r.name for r in g.regions}
    out = []
    for i, a in enumerate(allocs):
        keys = set(a) if isinstance(a, dict) else set()
        unknown = sorted(keys - _ALLOCATION_KEYS, key=str)
        if unknown:  # named as the document's own unknown keys are (was: the list rule)
            raise _fail(path, f"allocations[{i}].{unknown[0]}", a[unknown[0]],
                        "unknown key (an allocation has plane, plane_offset, length and, "
                        "when aliased, region and region_offset)")
        if keys not in ({"plane", "plane_offset", "length"}, _ALLOCATION_KEYS):
            raise _fail(path, f"allocations[{i}]", a, "must have plane, plane_offset, "
                        "length and, when aliased, region and region_offset")
        for k in ("plane_offset", "length", "region_offset"):
            v = a.get(k, 0)
            if type(v) is not int or v < 0:
                raise _fail(path, f"allocations[{i}].{k}", v, "must be an integer >= 0")
        for k, names in (("plane", planes), ("region", regions)):
            if k in a and not isinstance(a[k], str):
                raise _fail(path, f"allocations[{i}].{k}", a[k], "must be a name")
            if k in a and a[k] not in names:  # named here, cut (was: echoed in full by
                # the contract check, a 100,000-character name in a 100 KB line)
                raise _fail(path, f"allocations[{i}].{k}", a[k],
                            f"must name a {k} of geometry {g.name!r} ({_listed(names)})")
        out.append(Allocation(**a))
    return tuple(out)


def _listed(names: set[str]) -> str:
    """Up to :data:`_MAX_LISTED` names, sorted and quoted (a layout may have thousands)."""
    shown = sorted(names)
    more = f", and {len(shown) - _MAX_LISTED:,} more" if len(shown) > _MAX_LISTED else ""
    return ", ".join(show_value(n) for n in shown[:_MAX_LISTED]) + more


def _check_fits(path: Path, g: Geometry, plan: PhysicalPlan) -> None:
    """The plan keeps ``g``'s layout contract, else a :class:`PlanFileError` naming
    the first violation's field and value and listing up to ten violations (all are
    attached as ``violations``, as on the allocator's ContractError): a file that does
    not fit is bad input, not a planner bug (a ContractError would exit 1)."""
    found = check_contract(g, plan)
    if not found:
        return
    v = found[0]
    i = v.detail.get("alloc")
    field = "allocations" if i is None else f"allocations[{i}]"
    if i is not None and "field" in v.detail:
        field += f".{v.detail['field']}"
    # a violation of the plan as a whole (bytes not covered) names no one allocation:
    # the value is then the number of allocations
    value = v.detail.get("value", plan.allocations[i].to_json() if i is not None else
                         len(plan.allocations))
    shown = "; ".join(str(x) for x in found[:_MAX_LISTED])
    more = f"; and {len(found) - _MAX_LISTED} more" if len(found) > _MAX_LISTED else ""
    err = _fail(path, field, value, f"the plan must keep the layout contract of "
                f"{g.name!r}: {shown}{more}")
    err.violations = found
    raise err
