"""The bounds every event keeps (libs/contracts/bounds.py) are part of each event type's validation schema, nested
models included: a number beyond ±2**53, a non-finite float or a text over 1 MiB anywhere in an event is refused by
pydantic while it validates, and a field's own tighter bound still holds."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from typing import Any

import pytest
from pydantic import BaseModel, ValidationError

from libs.contracts.bounds import MAX_EVENT_NUMBER, MAX_EVENT_TEXT, BoundedModel
from libs.contracts.envelope import InvalidEnvelope
from libs.contracts.events import (
    EVENT_TYPES,
    AllocatedGpu,
    AllocationGranted,
    GpuRollup,
    JobSubmitted,
    QuotaSet,
)
from libs.contracts.origins import accept
from libs.contracts.work import WorkSpec

NOW = datetime(2026, 12, 1, tzinfo=UTC)


def unbounded_leaves(schema: Any, defs: dict[str, Any], path: str = "", seen: frozenset[str] = frozenset()) -> list[str]:
    """Where an event's JSON schema holds a number without both bounds within ±2**53, or a free text without
    maxLength within 1 MiB."""
    if isinstance(schema, list):
        return [w for i, s in enumerate(schema) for w in unbounded_leaves(s, defs, f"{path}[{i}]", seen)]
    if not isinstance(schema, dict):
        return []
    if "$ref" in schema:
        name = schema["$ref"].rsplit("/", 1)[-1]
        return [] if name in seen else unbounded_leaves(defs[name], defs, f"{path}->{name}", seen | {name})
    out: list[str] = []
    kind = schema.get("type")
    if kind in ("integer", "number"):
        low = schema.get("minimum", schema.get("exclusiveMinimum"))
        high = schema.get("maximum", schema.get("exclusiveMaximum"))
        if low is None or high is None or low < -MAX_EVENT_NUMBER or high > MAX_EVENT_NUMBER:
            out.append(path)
    if kind == "string" and not ({"enum", "const", "format"} & set(schema)):
        if schema.get("maxLength", MAX_EVENT_TEXT + 1) > MAX_EVENT_TEXT:
            out.append(path)
    alternatives = schema.get("anyOf", [])
    if any(a.get("type") == "number" for a in alternatives):  # a Decimal: its text form is bounded by its value
        schema = {**schema, "anyOf": [a for a in alternatives if a.get("type") != "string"]}
    for key, value in schema.items():
        if key in ("properties", "$defs"):
            for name, sub in value.items():
                if key == "properties":
                    out += unbounded_leaves(sub, defs, f"{path}.{name}", seen)
        elif isinstance(value, dict | list) and key not in ("default", "examples", "enum", "const"):
            out += unbounded_leaves(value, defs, f"{path}/{key}", seen)
    return out


@pytest.mark.parametrize("event_type", sorted(EVENT_TYPES))
def test_every_number_and_text_of_every_event_type_is_bounded_in_its_schema(event_type: str) -> None:
    schema = EVENT_TYPES[event_type].model_json_schema()
    assert unbounded_leaves(schema, schema.get("$defs", {})) == []


def nested_models(cls: type[BaseModel], seen: set[type[BaseModel]]) -> set[type[BaseModel]]:
    for field in cls.model_fields.values():
        stack: list[Any] = [field.annotation]
        while stack:
            t = stack.pop()
            stack.extend(getattr(t, "__args__", ()))
            if isinstance(t, type) and issubclass(t, BaseModel) and t not in seen:
                seen.add(t)
                nested_models(t, seen)
    return seen


def test_every_model_an_event_holds_is_bounded_by_its_own_validator() -> None:
    held: set[type[BaseModel]] = set()
    for cls in EVENT_TYPES.values():
        nested_models(cls, held)
    assert {AllocatedGpu, GpuRollup, WorkSpec} <= held
    assert [m.__name__ for m in held if not issubclass(m, BoundedModel)] == []


def job(**over: Any) -> dict[str, Any]:
    doc = JobSubmitted(job_id="j", name="n", team="t", project="p", kind="batch", priority_class="normal",
                       priority=0, gpus=1, submitted_at=NOW,
                       work=WorkSpec(command=["python", "x.py"])).model_dump(mode="json")
    doc.update(over)
    return doc


@pytest.mark.parametrize(("over", "where"), [
    ({"priority": MAX_EVENT_NUMBER + 1}, "priority"),                        # a top-level int
    ({"priority": -MAX_EVENT_NUMBER - 1}, "priority"),
    ({"max_runtime_s": 1e300}, "max_runtime_s"),                             # a float
    ({"submitted_by": "x" * (MAX_EVENT_TEXT + 1)}, "submitted_by"),          # a free text
    ({"gpu_models": ["x" * (MAX_EVENT_TEXT + 1)]}, "gpu_models.0"),          # a list's item
    ({"work": {"command": ["x"], "env": {"K": "v" * (MAX_EVENT_TEXT + 1)}}}, "work"),  # a nested model's dict value
])
def test_a_value_beyond_the_bounds_anywhere_in_an_event_is_refused(over: dict[str, Any], where: str) -> None:
    with pytest.raises(ValidationError) as caught:
        JobSubmitted.model_validate(job(**over))
    assert any(".".join(map(str, e["loc"])).startswith(where) for e in caught.value.errors()), caught.value


def test_non_finite_floats_are_refused_in_nested_models_too() -> None:
    with pytest.raises(ValidationError, match="max_runtime_s"):
        JobSubmitted.model_validate_json(json.dumps(job(max_runtime_s=float("inf"))))  # json.dumps spells Infinity
    rollup = {"uuid": "GPU-0", "index": 0, "samples": 1, "utilization_avg_pct": 1.0, "utilization_max_pct": 1.0,
              "memory_used_avg_mib": 1.0, "memory_used_max_mib": 1}
    assert GpuRollup.model_validate(rollup).power_avg_w is None
    for power in (float("nan"), float("inf"), 1e300):  # a field with no bound of its own
        with pytest.raises(ValidationError, match="power_avg_w"):
            GpuRollup.model_validate({**rollup, "power_avg_w": power})


def test_a_number_beyond_the_bounds_in_a_granted_gpu_is_refused_and_its_own_bound_still_holds() -> None:
    gpu = {"uuid": "GPU-0", "index": 0, "model": "H100-80GB"}
    grant = {"allocation_id": "a", "job_id": "j", "team": "t", "project": "p", "cluster": "c", "node": "n",
             "gpus": [gpu], "granted_at": NOW.isoformat()}
    assert AllocationGranted.model_validate(grant).gpus[0].index == 0
    for bad in ({"index": MAX_EVENT_NUMBER + 1}, {"memory_mib": -MAX_EVENT_NUMBER - 1},  # the event bounds
                {"share_milli": 0}, {"share_milli": 1001}):                           # AllocatedGpu's own
        with pytest.raises(ValidationError, match=next(iter(bad))):
            AllocationGranted.model_validate({**grant, "gpus": [{**gpu, **bad}]})


def test_an_out_of_bounds_event_on_the_bus_is_invalid_input() -> None:
    doc = json.loads(QuotaSet(path="default/t", gpu_model="*", guaranteed=2, revision=3,
                              set_at=NOW).to_cloudevent("/gpupool/quota").to_json())
    doc["data"]["revision"] = MAX_EVENT_NUMBER * 4
    with pytest.raises(InvalidEnvelope, match="revision"):
        accept(json.dumps(doc).encode(), "gpupool.quota.set")
