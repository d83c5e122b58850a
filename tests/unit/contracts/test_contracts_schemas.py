"""JSON Schemas of the events, the registry that binds types to subjects, and the committed docs/schemas."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from libs.contracts import subjects
from libs.contracts.events import EVENT_TYPES, EventData, event_json_schemas, subject_for

SCHEMA_DIR = Path(__file__).resolve().parents[3] / "docs" / "schemas"
REGENERATE = ".venv/bin/gpupool schemas --out docs/schemas"


def _refs(node: Any) -> list[str]:
    if isinstance(node, dict):
        found = [node["$ref"]] if isinstance(node.get("$ref"), str) else []
        return found + [r for v in node.values() for r in _refs(v)]
    if isinstance(node, list):
        return [r for v in node for r in _refs(v)]
    return []


def _resolve(doc: dict[str, Any], ref: str) -> Any:
    assert ref.startswith("#/"), f"only local refs expected, got {ref}"
    node: Any = doc
    for part in ref[2:].split("/"):
        node = node[part]
    return node


def test_subject_wildcards_match_as_nats_matches_them() -> None:
    m = subjects.matches
    assert m("gpupool.job.>", "gpupool.job.submitted") and m("gpupool.job.>", "gpupool.job.a.b")
    assert not m("gpupool.job.>", "gpupool.job") and not m("gpupool.job.*", "gpupool.job.a.b")
    assert m("gpupool.*.submitted", "gpupool.job.submitted") and not m("gpupool.job", "gpupool.job.x")


def test_every_registered_event_type_has_a_schema() -> None:
    assert set(event_json_schemas()) == set(EVENT_TYPES)
    assert len(EVENT_TYPES) >= 9


@pytest.mark.parametrize("event_type", sorted(EVENT_TYPES))
def test_event_schema_pins_the_type_and_nests_the_payload_schema_under_data(event_type: str) -> None:
    schema = event_json_schemas()[event_type]
    cls = EVENT_TYPES[event_type]
    assert schema["$schema"] == "https://json-schema.org/draft/2020-12/schema"
    assert schema["$id"].endswith(f"/{event_type}.json")
    assert schema["properties"]["type"] == {"const": event_type, "type": "string"}
    payload = schema["properties"]["data"]
    assert payload["type"] == "object"
    assert payload["additionalProperties"] is False
    assert set(payload["properties"]) == set(cls.model_fields)
    assert set(payload["required"]) == {n for n, f in cls.model_fields.items() if f.is_required()}
    assert {"specversion", "id", "source", "type", "time", "data"} <= set(schema["required"])
    for ref in _refs(schema):  # nested models' $refs must resolve inside the one document
        assert isinstance(_resolve(schema, ref), dict), f"{event_type}: dangling {ref}"


def test_event_types_follow_the_naming_convention_and_registry_keys_match() -> None:
    for event_type, cls in EVENT_TYPES.items():
        assert issubclass(cls, EventData)
        assert cls.event_type == event_type
        parts = event_type.split(".")
        assert parts[:2] == ["io", "gpupool"] and parts[-1].startswith("v") and parts[-1][1:].isdigit()
        assert cls.entity_field in cls.model_fields


def test_every_event_subject_is_captured_by_exactly_one_stream() -> None:
    for cls in EVENT_TYPES.values():
        concrete = cls.event_subject.replace(">", "c1.n1")
        owners = [s.name for s in subjects.STREAMS if any(subjects.matches(p, concrete) for p in s.subjects)]
        assert len(owners) == 1, f"{cls.__name__} on {concrete} is stored by {owners}"
        assert owners[0] != subjects.DLQ_STREAM.name


def test_streams_have_explicit_duplicate_windows_no_longer_than_retention() -> None:
    names = [s.name for s in subjects.STREAMS]
    assert len(names) == len(set(names))
    for spec in subjects.STREAMS:
        assert spec.duplicate_window_s > 0
        assert spec.duplicate_window_s <= spec.max_age_s


def test_subject_tokens_are_sanitised() -> None:
    assert subjects.telemetry("c.1", "node *>x") == "gpupool.telemetry.c_1.node___x"
    assert subjects.dead_letter("") == "gpupool.dlq._"


def test_subject_for_telemetry_is_the_concrete_node_subject() -> None:
    from datetime import UTC, datetime

    from libs.contracts.events import JobCompleted, TelemetrySampled

    sample = TelemetrySampled(cluster="eu.1", node="n7", sampled_at=datetime.now(UTC), gpus=[])
    assert subject_for(sample) == "gpupool.telemetry.eu_1.n7"
    done = JobCompleted(job_id="j", team="t", completed_at=datetime.now(UTC))
    assert subject_for(done) == subjects.JOB_COMPLETED


def test_committed_schemas_are_up_to_date() -> None:
    expected = {f"{t}.json": json.dumps(s, indent=2, sort_keys=True) + "\n" for t, s in event_json_schemas().items()}
    hint = f"docs/schemas is stale: regenerate with `{REGENERATE}` and commit the result"
    assert SCHEMA_DIR.is_dir(), hint
    actual = {p.name: p.read_text() for p in SCHEMA_DIR.glob("*.json")}
    assert sorted(actual) == sorted(expected), hint
    stale = [name for name in expected if actual[name] != expected[name]]
    assert not stale, f"{hint} (differs: {', '.join(stale)})"
