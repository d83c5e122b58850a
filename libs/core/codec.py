"""The core's inputs and plans as JSON, exactly: what a placement cycle recorded can be decoded and scheduled again
to the same plan, anywhere (`gpupool decisions replay`).

Every core value is a frozen dataclass of str/int/float/bool, tuples, frozensets and other core values, so one
generic encoding covers them all (and any field added later): a dataclass becomes {"@": ClassName, field: ...},
a frozenset {"@set": [...]} (sorted, so equal sets encode equally), a non-finite float {"@float": "inf"}, and
every other list is a tuple.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import math
from typing import Any

from libs.core import model, plan, policy

_TYPES: dict[str, type] = {
    name: obj
    for module in (model, plan, policy)
    for name, obj in vars(module).items()
    if isinstance(obj, type) and dataclasses.is_dataclass(obj) and obj.__module__ == module.__name__
}


class CodecError(ValueError):
    """The document is not an encoding of core values (unknown type, unknown field)."""


_FIELDS: dict[type, tuple[tuple[str, Any], ...]] = {}
_SCALARS = (str, int, bool, type(None))
_NO_DEFAULT = object()


def _fields(value: Any) -> tuple[tuple[str, Any], ...]:
    out = []
    for f in dataclasses.fields(value):
        if f.default is not dataclasses.MISSING:
            default = f.default
        elif f.default_factory is not dataclasses.MISSING:
            default = f.default_factory()
        else:
            default = _NO_DEFAULT
        out.append((f.name, default))
    return tuple(out)


def encode(value: Any) -> Any:
    """Fields equal to their default are left out (decoding restores them): a pending job or a GPU is mostly
    defaults, and a cycle's input holds thousands of them."""
    if isinstance(value, _SCALARS):  # most values: checked first, cheaply
        return value
    cls = type(value)
    fields = _FIELDS.get(cls)
    if fields is None and dataclasses.is_dataclass(value) and not isinstance(value, type):
        fields = _FIELDS[cls] = _fields(value)
    if fields is not None:
        doc: dict[str, Any] = {"@": cls.__name__}
        for name, default in fields:
            v = getattr(value, name)
            if default is _NO_DEFAULT or v != default or type(v) is not type(default):
                doc[name] = encode(v)
        return doc
    if isinstance(value, frozenset | set):
        items = [encode(v) for v in value]
        return {"@set": sorted(items, key=lambda v: json.dumps(v, sort_keys=True))}
    if isinstance(value, tuple | list):
        return [encode(v) for v in value]
    if isinstance(value, float) and not math.isfinite(value):
        return {"@float": repr(value)}
    if isinstance(value, dict):
        return {"@dict": [[encode(k), encode(v)] for k, v in value.items()]}
    return value


def decode(doc: Any) -> Any:
    if isinstance(doc, list):
        return tuple(decode(v) for v in doc)
    if not isinstance(doc, dict):
        return doc
    if "@set" in doc:
        return frozenset(decode(v) for v in doc["@set"])
    if "@float" in doc:
        return float(doc["@float"])
    if "@dict" in doc:
        return {decode(k): decode(v) for k, v in doc["@dict"]}
    name = doc.get("@")
    cls = _TYPES.get(name) if isinstance(name, str) else None
    if cls is None:
        raise CodecError(f"unknown core type {name!r}")
    names = {f.name for f in dataclasses.fields(cls)}
    unknown = set(doc) - names - {"@"}
    if unknown:
        raise CodecError(f"{name} has no field(s) {', '.join(sorted(unknown))}")
    return cls(**{k: decode(v) for k, v in doc.items() if k != "@"})


def dumps(value: Any) -> str:
    return json.dumps(encode(value), sort_keys=True, separators=(",", ":"))


def loads(text: str | bytes) -> Any:
    return decode(json.loads(text))


def plan_digest(p: plan.Plan) -> str:
    """Identity of what a plan decides (placements, reasons, preemptions, MIG changes, reservations); counters
    and timings are left out, they describe the work done, not the decision."""
    decided = (p.placements, p.pending, p.preemptions, p.mig_reconfigs, p.reservations)
    return hashlib.sha256(dumps(decided).encode()).hexdigest()


def reasons_digest(p: plan.Plan) -> str:
    """Identity of the pending reasons alone (cheaper than a full digest: plain tuples, no JSON)."""
    return hashlib.sha256(repr(tuple((r.job_id, r.reason, r.message) for r in p.pending)).encode()).hexdigest()
