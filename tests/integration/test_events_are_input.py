"""Events are input too (issue #16): against a real NATS JetStream, what a forger with publish rights somewhere
could send a consumer is dead-lettered at once, counted, and the consumer goes on with the next event.

Each case is an attack that got through before: a quota.set from a source that is not the quota service, or on
a subject that is not quota.set's; a schema-valid quota.set with numbers that overflow the scheduler; an event
with a NUL character (retried 8 times, ~23 s per consumer, because PostgreSQL refuses it); a handler failing on
the event's own content (retried instead of dead-lettered); and `gpupool check` crashing on a deeply nested
message in the DLQ."""

from __future__ import annotations

import asyncio
import json
from datetime import UTC, datetime
from typing import Any

import pytest
from nats.js import JetStreamContext
from prometheus_client import REGISTRY
from waiting import eventually

from libs.bus.consumer import ConsumerSpec, EventConsumer
from libs.bus.publisher import publish_event, publish_raw
from libs.check.invariants import event_origins
from libs.check.streams import read_streams
from libs.contracts import subjects
from libs.contracts.envelope import CloudEvent
from libs.contracts.events import EventData, QuotaSet
from libs.contracts.subjects import DLQ_STREAM, EVENTS_STREAM

pytestmark = pytest.mark.integration
NOW = datetime(2026, 12, 1, tzinfo=UTC)


def quota(path: str = "default/research", **kw: Any) -> QuotaSet:
    return QuotaSet(**{"path": path, "gpu_model": "*", "guaranteed": 8, "revision": 7, "set_at": NOW, **kw})


def forged(event: CloudEvent, **data: Any) -> bytes:
    """The event's JSON with payload fields set to values its model would refuse to build (as a forger writes)."""
    doc = json.loads(event.to_json())
    doc["data"].update(data)
    return json.dumps(doc).encode()


def dead_letters(consumer: str, reason: str) -> float:
    return REGISTRY.get_sample_value("gpupool_bus_dead_letters_total",
                                     {"consumer": consumer, "reason": reason}) or 0.0


class Seen:
    def __init__(self, fail_on: str | None = None) -> None:
        self.paths: list[str] = []
        self.calls = 0
        self.fail_on = fail_on

    async def __call__(self, event: CloudEvent, data: EventData) -> None:
        self.calls += 1
        assert isinstance(data, QuotaSet)
        if data.path == self.fail_on:  # e.g. arithmetic on a value the model let through
            raise OverflowError("int too large to convert to float")
        self.paths.append(data.path)


async def consume(js: JetStreamContext, durable: str, handler: Seen) -> EventConsumer:
    spec = ConsumerSpec(stream=EVENTS_STREAM.name, durable=durable, filter_subjects=("gpupool.quota.>",),
                        max_deliver=8, ack_wait_s=5.0, batch=8, backoff_base_s=1.0, backoff_max_s=5.0)
    consumer = EventConsumer(js, spec, handler)
    await consumer.start()
    return consumer


async def dlq_reasons(js: JetStreamContext) -> list[str]:
    state = (await js.stream_info(DLQ_STREAM.name)).state
    if not state.messages:
        return []
    msgs = [await js.get_msg(DLQ_STREAM.name, seq) for seq in range(state.first_seq, state.last_seq + 1)]
    return [m.headers["Gpupool-Dlq-Reason"] for m in msgs]


async def test_forged_policy_events_are_dead_lettered_at_once_and_the_consumer_goes_on(bus) -> None:  # type: ignore[no-untyped-def]
    _, js = bus
    seen = Seen()
    consumer = await consume(js, "events-input-policy", seen)
    try:
        good = quota().to_cloudevent("/gpupool/quota")
        attacks = [
            # another identity claims the quota service's event
            (subjects.QUOTA_SET, quota("default/a").to_cloudevent("/gpupool/agent").to_json()),
            # the quota service's source, on a subject that is not quota.set's (a stream whose consumers read
            # every subject would take it)
            (subjects.QUOTA_PRIORITY_CLASS_SET, quota("default/b").to_cloudevent("/gpupool/quota").to_json()),
            # schema-valid before: guaranteed 1e308 made every scheduling cycle fail with OverflowError
            (subjects.QUOTA_SET, forged(quota("default/c").to_cloudevent("/gpupool/quota"), guaranteed=1e308,
                                        revision=10**12)),
            (subjects.QUOTA_SET, forged(quota("default/d").to_cloudevent("/gpupool/quota"), weight=-1)),
            # a NUL: PostgreSQL refuses the text, so every retry failed the same way
            (subjects.QUOTA_SET, forged(quota("default/e").to_cloudevent("/gpupool/quota"),
                                        gpu_model="H100\u0000")),
        ]
        before = dead_letters("events-input-policy", "InvalidMessage")
        for subject, raw in attacks:
            await publish_raw(js, subject, raw, {})
        await publish_event(js, subjects.QUOTA_SET, good)
        await eventually(lambda: seen.paths == ["default/research"], timeout=10)
        await eventually(lambda: _count(js, len(attacks)), timeout=10)
        assert await dlq_reasons(js) == ["InvalidMessage"] * len(attacks)
        assert dead_letters("events-input-policy", "InvalidMessage") - before == len(attacks)
        assert seen.calls == 1  # no forged event ever reached the handler
        info = await js.consumer_info(EVENTS_STREAM.name, "events-input-policy")
        assert info.num_redelivered == 0  # dead-lettered at the first delivery, never retried
    finally:
        await consumer.stop()


async def test_a_handler_failing_on_the_events_content_dead_letters_it_at_once(bus) -> None:  # type: ignore[no-untyped-def]
    _, js = bus
    seen = Seen(fail_on="default/poison")
    consumer = await consume(js, "events-input-handler", seen)
    try:
        started = asyncio.get_running_loop().time()
        await publish_event(js, subjects.QUOTA_SET, quota("default/poison").to_cloudevent("/gpupool/quota"))
        await publish_event(js, subjects.QUOTA_SET, quota("default/next").to_cloudevent("/gpupool/quota"))
        await eventually(lambda: seen.paths == ["default/next"], timeout=10)
        assert asyncio.get_running_loop().time() - started < 3  # not 8 deliveries with back-off first
        assert await dlq_reasons(js) == ["HandlerFailed"]
        assert seen.calls == 2
    finally:
        await consumer.stop()


async def _count(js: JetStreamContext, n: int) -> bool:
    return (await js.stream_info(DLQ_STREAM.name)).state.messages == n


async def test_check_reports_a_deeply_nested_dead_letter_and_a_forged_event_without_crashing(  # type: ignore[no-untyped-def]
        bus, nats_url: str) -> None:
    _, js = bus
    nested = b'{"specversion":"1.0","id":"deep","source":"/x","type":"t","time":"2026-12-01T00:00:00Z","data":' + \
        b'{"a":' + b"[" * 3000 + b"]" * 3000 + b"}}"
    await publish_raw(js, subjects.dead_letter("quota"), nested, {"Gpupool-Dlq-Consumer": "quota",
                                                                   "Gpupool-Dlq-Reason": "InvalidMessage"})
    # a forgery that reached the events stream (published by hand with some identity's rights)
    await publish_event(js, subjects.QUOTA_SET, quota("default/forged").to_cloudevent("/gpupool/gateway"))
    view = await read_streams(nats_url, timeout=5)
    assert [d.consumer for d in view.dead_letters] == ["quota"] and view.dead_letters[0].event_id is None
    checked, found = event_origins(view)
    assert checked >= 1
    assert [(v.kind, v.data["source"]) for v in found] == [("event_from_wrong_source", "/gpupool/gateway")]
    assert "only /gpupool/quota publishes it" in found[0].detail
