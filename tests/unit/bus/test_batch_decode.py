"""The batch consumer's one-pass decode: for a consumer whose subjects carry one event type it must read exactly what
the general two-step decode reads, and anything else must still go through (and be judged by) the general one."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from libs.bus.batch import BatchConsumer, only_event_type
from libs.bus.consumer import ConsumerSpec
from libs.contracts import subjects
from libs.contracts.envelope import InvalidEnvelope, parse_envelope
from libs.contracts.events import GpuTelemetry, JobSubmitted, TelemetrySampled, decode_data


async def _nothing(*_args: object) -> None:
    return None


def consumer(filter_subjects: tuple[str, ...]) -> BatchConsumer:
    spec = ConsumerSpec(stream="S", durable="d", filter_subjects=filter_subjects)
    return BatchConsumer(None, spec, _nothing, _nothing)  # type: ignore[arg-type]


def telemetry_bytes(**gpu: object) -> bytes:
    sample = TelemetrySampled(cluster="c", node="n", sampled_at=datetime(2026, 1, 1, tzinfo=UTC), cpu_util_pct=3.5,
                              gpus=[GpuTelemetry(**{"uuid": "GPU-1", "index": 0, "utilization_gpu_pct": 12.5,
                                                    "utilization_memory_pct": 1.0, "memory_used_mib": 10,
                                                    "memory_total_mib": 80, "xid_events": [13],
                                                    "health_reasons": ["xid13"], **gpu})])
    return sample.to_cloudevent("/gpupool/agent", traceparent="00-" + "1" * 32 + "-" + "2" * 16 + "-01").to_json()


def test_only_the_telemetry_subject_has_a_single_event_type() -> None:
    assert only_event_type((subjects.TELEMETRY_ALL,)) is TelemetrySampled
    assert only_event_type((subjects.JOB_SUBMITTED,)) is JobSubmitted
    assert only_event_type((subjects.TELEMETRY_ALL, subjects.JOB_SUBMITTED)) is None
    assert only_event_type(("gpupool.nothing.here",)) is None


def test_the_one_pass_decode_reads_what_the_general_decode_reads() -> None:
    raw = telemetry_bytes()
    event, data = consumer((subjects.TELEMETRY_ALL,)).decode(raw)
    general = parse_envelope(raw)
    assert type(event) is not type(general)  # the one-pass envelope was used
    assert data == decode_data(general)
    assert (event.id, event.type, event.source, event.time, event.traceparent) == (
        general.id, general.type, general.source, general.time, general.traceparent)


def test_other_types_and_bad_messages_go_through_the_general_decode() -> None:
    c = consumer((subjects.TELEMETRY_ALL,))
    job = JobSubmitted(job_id="j", name="n", team="t", project="p", kind="training", priority_class="normal",
                       priority=1, gpus=1, submitted_at=datetime(2026, 1, 1, tzinfo=UTC))
    _, data = c.decode(job.to_cloudevent("/gpupool/queue").to_json())
    assert data == job
    with pytest.raises(InvalidEnvelope, match="utilization_gpu_pct"):
        c.decode(telemetry_bytes().replace(b'"utilization_gpu_pct":12.5', b'"utilization_gpu_pct":150.0'))
    with pytest.raises(InvalidEnvelope):
        c.decode(b"{not json")
