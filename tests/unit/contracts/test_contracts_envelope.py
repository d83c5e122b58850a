"""The CloudEvents envelope and UUIDv7 ids: what every event on the wire relies on."""

from __future__ import annotations

import json
import uuid
from datetime import UTC, datetime

import pytest

from libs.contracts.envelope import CloudEvent, InvalidEnvelope, parse_envelope, uuid7
from libs.contracts.events import JobSubmitted, decode_data, event_json_schemas


def _job(**overrides: object) -> JobSubmitted:
    fields: dict[str, object] = dict(
        job_id="j-1", name="train", team="ml", project="default", kind="training", priority_class="normal",
        priority=500, gpus=2, gpu_models=["H100-80GB"], submitted_at=datetime(2025, 1, 2, 3, 4, 5, tzinfo=UTC),
    )
    fields.update(overrides)
    return JobSubmitted(**fields)  # type: ignore[arg-type]


# --- uuid7 -----------------------------------------------------------------------------------------------------
def test_uuid7_is_version_7_with_the_rfc_4122_variant() -> None:
    for _ in range(200):
        u = uuid.UUID(uuid7())
        assert u.version == 7
        assert u.variant == uuid.RFC_4122


def test_uuid7_carries_the_unix_milliseconds_in_its_first_48_bits() -> None:
    ms = 1_735_787_045_123
    assert uuid.UUID(uuid7(ms)).int >> 80 == ms


def test_uuid7_ids_sort_by_creation_time() -> None:
    ids = [uuid7(1_700_000_000_000 + step * 7) for step in range(500)]
    shuffled = sorted(ids, key=lambda s: uuid.UUID(s).int % 9973)
    assert sorted(shuffled) == ids  # string order (what PostgreSQL TEXT and humans use) is time order
    assert sorted(ids, key=uuid.UUID) == ids


def test_uuid7_ids_are_unique_within_one_millisecond() -> None:
    ids = {uuid7(1_700_000_000_000) for _ in range(10_000)}
    assert len(ids) == 10_000


# --- envelope --------------------------------------------------------------------------------------------------
def test_cloudevent_round_trips_through_json_unchanged() -> None:
    tp = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
    event = _job().to_cloudevent("/gpupool/queue", traceparent=tp)
    parsed = parse_envelope(event.to_json())
    assert parsed == event
    assert parsed.traceparent == tp
    assert decode_data(parsed) == _job()


def test_cloudevent_json_is_cloudevents_1_0_structured_mode() -> None:
    event = _job().to_cloudevent("/gpupool/queue")
    doc = json.loads(event.to_json())
    assert doc["specversion"] == "1.0"
    assert doc["type"] == "io.gpupool.job.submitted.v1"
    assert doc["source"] == "/gpupool/queue"
    assert doc["subject"] == "j-1"
    assert doc["datacontenttype"] == "application/json"
    assert uuid.UUID(doc["id"]).version == 7
    assert datetime.fromisoformat(doc["time"]).tzinfo is not None
    assert "traceparent" not in doc  # absent optional attributes are omitted, not null
    # dataschema: the JSON Schema of the event type, its `$id` (issue #20: every CloudEvent names it)
    assert doc["dataschema"] == "https://gpupool.dev/schemas/io.gpupool.job.submitted.v1.json"
    assert doc["dataschema"] == event_json_schemas()["io.gpupool.job.submitted.v1"]["$id"]


def test_cloudevent_keeps_unknown_extension_attributes() -> None:
    raw = json.dumps({"specversion": "1.0", "id": "e1", "source": "/x", "type": "t", "time": "2025-01-01T00:00:00Z",
                      "data": {}, "partitionkey": "abc"}).encode()
    assert json.loads(parse_envelope(raw).to_json())["partitionkey"] == "abc"


@pytest.mark.parametrize("raw", [
    b"\x00\xffnot json",
    b"",
    b"[1, 2, 3]",
    b'{"hello": "world"}',
    json.dumps({"specversion": "0.3", "id": "e", "source": "/x", "type": "t", "time": "2025-01-01T00:00:00Z",
                "data": {}}).encode(),
    json.dumps({"specversion": "1.0", "id": "", "source": "/x", "type": "t", "time": "2025-01-01T00:00:00Z",
                "data": {}}).encode(),
])
def test_parse_envelope_rejects_what_is_not_a_cloudevent(raw: bytes) -> None:
    with pytest.raises(InvalidEnvelope):
        parse_envelope(raw)


def test_decode_data_rejects_an_unknown_event_type() -> None:
    event = CloudEvent(id=uuid7(), source="/x", type="io.gpupool.nope.v1", time=datetime.now(UTC), data={})
    with pytest.raises(InvalidEnvelope, match="unknown event type"):
        decode_data(event)


def test_decode_data_rejects_an_invalid_payload() -> None:
    good = _job().to_cloudevent("/gpupool/queue")
    missing = good.model_copy(update={"data": {k: v for k, v in good.data.items() if k != "team"}})
    with pytest.raises(InvalidEnvelope, match="team"):
        decode_data(missing)
    wrong_type = good.model_copy(update={"data": {**good.data, "gpus": "many"}})
    with pytest.raises(InvalidEnvelope, match="gpus"):
        decode_data(wrong_type)
    extra = good.model_copy(update={"data": {**good.data, "surprise": 1}})
    with pytest.raises(InvalidEnvelope, match="surprise"):
        decode_data(extra)
