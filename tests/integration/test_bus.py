"""libs/bus against a real NATS JetStream: streams, deduplicated publish, ack/nak/term discipline with a dead-letter
stream, trace context in headers, and request/reply error mapping."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from datetime import UTC, datetime
from typing import Any

import pytest
from nats.aio.client import Client as NATS
from nats.js import JetStreamContext
from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from prometheus_client import REGISTRY
from pydantic import BaseModel, Field
from waiting import eventually

from libs.bus.connection import ensure_streams, stream_config
from libs.bus.consumer import Busy, ConsumerSpec, EventConsumer, Poison
from libs.bus.publisher import publish_event, publish_raw
from libs.bus.rpc import ServiceUnavailable, request, serve
from libs.contracts import subjects
from libs.contracts.commands import Command, Reply
from libs.contracts.envelope import CloudEvent, uuid7
from libs.contracts.events import EventData, JobSubmitted
from libs.contracts.subjects import DLQ_STREAM, EVENTS_STREAM, STREAMS
from libs.observability.tracing import setup_tracing

pytestmark = pytest.mark.integration

SUBJECT = subjects.JOB_SUBMITTED


# --- helpers ---------------------------------------------------------------------------------------------------

def job(job_id: str = "j-1") -> JobSubmitted:
    return JobSubmitted(job_id=job_id, name="train", team="ml", project="default", kind="training",
                        priority_class="normal", priority=500, gpus=1, submitted_at=datetime.now(UTC))


def dead_letters(consumer: str, reason: str) -> float:
    return REGISTRY.get_sample_value("gpupool_bus_dead_letters_total",
                                     {"consumer": consumer, "reason": reason}) or 0.0


async def dlq_messages(js: JetStreamContext) -> list[Any]:
    state = (await js.stream_info(DLQ_STREAM.name)).state
    return [await js.get_msg(DLQ_STREAM.name, seq) for seq in range(state.first_seq, state.last_seq + 1)
            if state.messages]


async def dlq_count(js: JetStreamContext, n: int) -> bool:
    return (await js.stream_info(DLQ_STREAM.name)).state.messages == n


def fast_spec(durable: str, **kw: Any) -> ConsumerSpec:
    base: dict[str, Any] = dict(max_deliver=4, ack_wait_s=5.0, batch=8, backoff_base_s=0.05, backoff_max_s=0.2)
    base.update(kw)
    return ConsumerSpec(stream=EVENTS_STREAM.name, durable=durable, filter_subjects=(SUBJECT,), **base)


@pytest.fixture
async def consumers() -> AsyncIterator[list[EventConsumer]]:
    started: list[EventConsumer] = []
    yield started
    for c in started:
        await c.stop()


async def start_consumer(js: JetStreamContext, started: list[EventConsumer], spec: ConsumerSpec,
                         handler: Callable[[CloudEvent, EventData], Awaitable[None]]) -> EventConsumer:
    consumer = EventConsumer(js, spec, handler)
    await consumer.start()
    started.append(consumer)
    return consumer


async def settled(js: JetStreamContext, durable: str) -> bool:
    info = await js.consumer_info(EVENTS_STREAM.name, durable)
    return info.num_pending == 0 and info.num_ack_pending == 0


# --- streams ---------------------------------------------------------------------------------------------------
async def test_ensure_streams_creates_streams_with_the_contract_duplicate_windows(
        bus: tuple[NATS, JetStreamContext]) -> None:
    _, js = bus
    for spec in STREAMS:
        cfg = (await js.stream_info(spec.name)).config
        assert cfg.duplicate_window == pytest.approx(spec.duplicate_window_s)
        assert cfg.max_age == pytest.approx(spec.max_age_s)
        assert sorted(cfg.subjects or []) == sorted(spec.subjects)


async def test_ensure_streams_is_idempotent_and_keeps_stored_messages(bus: tuple[NATS, JetStreamContext]) -> None:
    _, js = bus
    await publish_event(js, SUBJECT, job().to_cloudevent("/gpupool/queue"))
    await ensure_streams(js)
    await ensure_streams(js)
    assert len(await js.streams_info()) == len(STREAMS)
    assert (await js.stream_info(EVENTS_STREAM.name)).state.messages == 1


async def test_ensure_streams_corrects_a_drifted_duplicate_window(bus: tuple[NATS, JetStreamContext]) -> None:
    _, js = bus
    drifted = stream_config(EVENTS_STREAM)
    drifted.duplicate_window = 5.0
    await js.update_stream(drifted)
    assert (await js.stream_info(EVENTS_STREAM.name)).config.duplicate_window == pytest.approx(5.0)
    await ensure_streams(js)
    cfg = (await js.stream_info(EVENTS_STREAM.name)).config
    assert cfg.duplicate_window == pytest.approx(EVENTS_STREAM.duplicate_window_s)


# --- publish ---------------------------------------------------------------------------------------------------
async def test_publishing_the_same_event_twice_stores_it_once(bus: tuple[NATS, JetStreamContext]) -> None:
    _, js = bus
    event = job().to_cloudevent("/gpupool/queue")
    first = await publish_event(js, SUBJECT, event)
    second = await publish_event(js, SUBJECT, event)
    other = await publish_event(js, SUBJECT, job("j-2").to_cloudevent("/gpupool/queue"))
    assert not first.duplicate
    assert second.duplicate is True and second.seq == first.seq
    assert other.seq == first.seq + 1
    assert (await js.stream_info(EVENTS_STREAM.name)).state.messages == 2
    stored = await js.get_msg(EVENTS_STREAM.name, first.seq)
    assert stored.headers["Nats-Msg-Id"] == event.id
    assert CloudEvent.model_validate_json(stored.data) == event


async def test_publish_to_a_subject_no_stream_captures_fails(bus: tuple[NATS, JetStreamContext]) -> None:
    _, js = bus
    with pytest.raises(Exception):  # noqa: B017 - nats raises NoRespondersError; it must not pass silently
        await publish_raw(js, "nobody.listens.here", b"x", {"Nats-Msg-Id": uuid7()}, timeout=1.0)


# --- consumers: ack, nak with backoff, max_deliver, poison ----------------------------------------------------
async def test_consumer_acks_a_handled_event(bus: tuple[NATS, JetStreamContext],
                                             consumers: list[EventConsumer]) -> None:
    _, js = bus
    seen: list[tuple[str, EventData]] = []

    async def handler(event: CloudEvent, data: EventData) -> None:
        seen.append((event.id, data))

    await start_consumer(js, consumers, fast_spec("acks"), handler)
    event = job().to_cloudevent("/gpupool/queue")
    await publish_event(js, SUBJECT, event)
    await eventually(lambda: bool(seen), what="the handler called")  # (consumer info may lag the delivery)
    await eventually(lambda: settled(js, "acks"), what="ack")
    assert seen == [(event.id, job().model_copy(update={"submitted_at": seen[0][1].submitted_at}))]
    assert isinstance(seen[0][1], JobSubmitted)
    info = await js.consumer_info(EVENTS_STREAM.name, "acks")
    assert info.num_redelivered == 0
    assert info.ack_floor.stream_seq == 1


async def test_transient_failure_is_redelivered_with_backoff_then_succeeds(
        bus: tuple[NATS, JetStreamContext], consumers: list[EventConsumer]) -> None:
    _, js = bus
    attempts: list[float] = []

    async def flaky(event: CloudEvent, data: EventData) -> None:
        attempts.append(time.monotonic())
        if len(attempts) < 3:
            raise ConnectionError("database blip")

    await start_consumer(js, consumers, fast_spec("flaky", backoff_base_s=0.3, backoff_max_s=2.0), flaky)
    await publish_event(js, SUBJECT, job().to_cloudevent("/gpupool/queue"))
    await eventually(lambda: len(attempts) == 3, what="third attempt")
    await eventually(lambda: settled(js, "flaky"), what="ack after retries")
    # nak delays 0.3 s then 0.6 s (ack_wait is 5 s, so these redeliveries come from the nak delay)
    assert attempts[1] - attempts[0] >= 0.25
    assert attempts[2] - attempts[1] >= 0.5
    assert attempts[2] - attempts[0] < 4.0
    await asyncio.sleep(0.3)
    assert len(attempts) == 3
    assert (await dlq_messages(js)) == []


async def test_a_busy_entity_is_retried_quietly_and_counted_as_busy(
        bus: tuple[NATS, JetStreamContext], consumers: list[EventConsumer], caplog) -> None:  # type: ignore[no-untyped-def]
    _, js = bus
    attempts: list[float] = []

    async def contended(event: CloudEvent, data: EventData) -> None:
        attempts.append(time.monotonic())
        if len(attempts) < 2:
            raise Busy("j-1 is being changed by another batch")

    def busy() -> float:
        return REGISTRY.get_sample_value("gpupool_bus_messages_total", {"consumer": "busy", "outcome": "busy"}) or 0.0

    before = busy()
    with caplog.at_level("INFO", logger="libs.bus.consumer"):
        await start_consumer(js, consumers, fast_spec("busy", backoff_base_s=0.2, backoff_max_s=1.0), contended)
        await publish_event(js, SUBJECT, job().to_cloudevent("/gpupool/queue"))
        await eventually(lambda: settled(js, "busy"), what="ack after the retry")
    assert len(attempts) == 2 and busy() == before + 1
    [record] = [r for r in caplog.records if r.getMessage() == "handler_busy_will_retry"]
    assert record.levelname == "INFO" and record.exc_info is None
    assert not [r for r in caplog.records if r.getMessage() == "handler_failed_will_retry"]
    assert (await dlq_messages(js)) == []


async def test_handler_that_keeps_failing_is_dead_lettered_after_max_deliver(
        bus: tuple[NATS, JetStreamContext], consumers: list[EventConsumer]) -> None:
    _, js = bus
    calls = 0
    before = dead_letters("stuck", "MaxDeliveriesExceeded")

    async def broken(event: CloudEvent, data: EventData) -> None:
        nonlocal calls
        calls += 1
        raise RuntimeError("still broken")

    await start_consumer(js, consumers, fast_spec("stuck", max_deliver=3), broken)
    event = job().to_cloudevent("/gpupool/queue")
    ack = await publish_event(js, SUBJECT, event)
    # (not `settled`: while a nak delay runs, the message counts as neither pending nor ack-pending)
    await eventually(lambda: dlq_count(js, 1), what="dead letter")
    await eventually(lambda: settled(js, "stuck"), what="terminated")
    [dead] = await dlq_messages(js)
    assert dead.subject == subjects.dead_letter("stuck")
    assert dead.headers["Gpupool-Dlq-Reason"] == "MaxDeliveriesExceeded"
    assert dead.headers["Gpupool-Dlq-Delivered"] == "3"
    assert dead.headers["Gpupool-Dlq-Subject"] == SUBJECT
    assert dead.headers["Gpupool-Dlq-Stream-Seq"] == str(ack.seq)
    assert "still broken" in dead.headers["Gpupool-Dlq-Error"]
    assert CloudEvent.model_validate_json(dead.data) == event
    assert calls == 3
    assert dead_letters("stuck", "MaxDeliveriesExceeded") == before + 1
    await asyncio.sleep(0.5)
    assert calls == 3  # terminated: never delivered again


async def test_poison_raised_by_a_handler_is_dead_lettered_at_once(
        bus: tuple[NATS, JetStreamContext], consumers: list[EventConsumer]) -> None:
    _, js = bus
    calls = 0

    async def refuses(event: CloudEvent, data: EventData) -> None:
        nonlocal calls
        calls += 1
        raise Poison("UnknownTeam", "team ml does not exist")

    await start_consumer(js, consumers, fast_spec("refuses"), refuses)
    await publish_event(js, SUBJECT, job().to_cloudevent("/gpupool/queue"))
    # the outcome first: consumer info can lag the delivery, so "settled" alone once read true before it came
    await eventually(lambda: dlq_count(js, 1), what="dead letter")
    await eventually(lambda: settled(js, "refuses"), what="terminated")
    [dead] = await dlq_messages(js)
    assert dead.headers["Gpupool-Dlq-Reason"] == "UnknownTeam"
    assert dead.headers["Gpupool-Dlq-Delivered"] == "1"
    assert calls == 1


async def test_undecodable_messages_are_dead_lettered_and_the_next_good_message_is_handled(
        bus: tuple[NATS, JetStreamContext], consumers: list[EventConsumer]) -> None:
    _, js = bus
    handled: list[str] = []
    before = dead_letters("picky", "InvalidMessage")

    async def handler(event: CloudEvent, data: EventData) -> None:
        handled.append(event.id)

    unknown_type = CloudEvent(id=uuid7(), source="/gpupool/queue", type="io.gpupool.job.teleported.v1",
                              time=datetime.now(UTC), data={"job_id": "j-1"})
    bad_payload = job().to_cloudevent("/gpupool/queue").model_copy(update={"data": {"job_id": "j-1"}})
    poison = [b"\x00\xff garbage", json.dumps({"hello": "world"}).encode(), unknown_type.to_json(),
              bad_payload.to_json()]
    for raw in poison:
        await publish_raw(js, SUBJECT, raw, {"Nats-Msg-Id": uuid7()})
    good = job("j-good").to_cloudevent("/gpupool/queue")
    await publish_event(js, SUBJECT, good)

    await start_consumer(js, consumers, fast_spec("picky"), handler)

    async def parked_and_handled() -> bool:
        return await dlq_count(js, len(poison)) and handled == [good.id]

    await eventually(parked_and_handled, what="four parked, one handled")
    await eventually(lambda: settled(js, "picky"), what="all five settled")
    assert handled == [good.id]
    dead = await dlq_messages(js)
    assert [m.data for m in dead] == poison  # the original bytes are kept, in order
    for m in dead:
        assert m.subject == "gpupool.dlq.picky"
        assert m.headers["Gpupool-Dlq-Reason"] == "InvalidMessage"
        assert m.headers["Gpupool-Dlq-Consumer"] == "picky"
        assert m.headers["Gpupool-Dlq-Error"]
    assert "unknown event type" in dead[2].headers["Gpupool-Dlq-Error"]
    assert dead_letters("picky", "InvalidMessage") == before + len(poison)


async def test_consumer_survives_a_dead_letter_stream_outage(
        bus: tuple[NATS, JetStreamContext], consumers: list[EventConsumer]) -> None:
    """If parking a poison message fails, the consumer must neither die nor drop it: it retries it later."""
    _, js = bus
    handled: list[str] = []

    async def handler(event: CloudEvent, data: EventData) -> None:
        handled.append(event.data["job_id"])

    await js.delete_stream(DLQ_STREAM.name)
    await start_consumer(js, consumers, fast_spec("resilient", max_deliver=20, backoff_base_s=0.1), handler)
    await publish_raw(js, SUBJECT, b"garbage", {"Nats-Msg-Id": uuid7()})
    await publish_event(js, SUBJECT, job("after-garbage").to_cloudevent("/gpupool/queue"))
    await eventually(lambda: handled == ["after-garbage"], what="next good message despite the DLQ outage")

    await ensure_streams(js)  # the DLQ comes back: the poison message is parked on a later delivery
    await eventually(lambda: dlq_count(js, 1), what="poison parked once the DLQ is back")
    await eventually(lambda: settled(js, "resilient"), what="terminated")
    [dead] = await dlq_messages(js)
    assert dead.data == b"garbage"
    await publish_event(js, SUBJECT, job("later").to_cloudevent("/gpupool/queue"))
    await eventually(lambda: handled == ["after-garbage", "later"], what="consumer still alive")


async def test_stop_lets_the_message_in_hand_finish_and_ack(
        bus: tuple[NATS, JetStreamContext], consumers: list[EventConsumer]) -> None:
    _, js = bus
    entered, release = asyncio.Event(), asyncio.Event()
    done: list[str] = []

    async def slow(event: CloudEvent, data: EventData) -> None:
        entered.set()
        await release.wait()
        done.append(event.id)

    consumer = await start_consumer(js, consumers, fast_spec("draining"), slow)
    event = job().to_cloudevent("/gpupool/queue")
    await publish_event(js, SUBJECT, event)
    await asyncio.wait_for(entered.wait(), 5)
    stopping = asyncio.create_task(consumer.stop())
    await asyncio.sleep(0.1)
    assert not stopping.done()  # waits for the handler
    release.set()
    await asyncio.wait_for(stopping, 5)
    assert done == [event.id]
    # acked before stop() returned (the server applies acks asynchronously, hence the short wait, well below
    # the 5 s ack_wait after which an unacked message would be pending again)
    await eventually(lambda: settled(js, "draining"), timeout=2, what="ack of the drained message")


# --- trace context ---------------------------------------------------------------------------------------------
@pytest.fixture
def spans() -> InMemorySpanExporter:
    provider = setup_tracing("bus-tests")
    assert isinstance(provider, TracerProvider)
    exporter = InMemorySpanExporter()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    return exporter


async def test_consumer_span_continues_the_trace_from_the_traceparent_header(
        bus: tuple[NATS, JetStreamContext], consumers: list[EventConsumer], spans: InMemorySpanExporter) -> None:
    _, js = bus
    trace_id, parent_id = "4bf92f3577b34da6a3ce929d0e0e4736", "00f067aa0ba902b7"
    seen_in_handler: list[int] = []

    async def handler(event: CloudEvent, data: EventData) -> None:
        seen_in_handler.append(trace.get_current_span().get_span_context().trace_id)

    event = job().to_cloudevent("/gpupool/queue", traceparent=f"00-{trace_id}-{parent_id}-01")
    await publish_event(js, SUBJECT, event)
    stored = await js.get_msg(EVENTS_STREAM.name, 1)
    assert stored.headers["traceparent"] == f"00-{trace_id}-{parent_id}-01"

    await start_consumer(js, consumers, fast_spec("traced"), handler)
    await eventually(lambda: settled(js, "traced"), what="ack")
    [span] = [s for s in spans.get_finished_spans() if s.name == f"consume {SUBJECT}"
              and s.attributes.get("messaging.consumer.group.name") == "traced"]
    assert format(span.context.trace_id, "032x") == trace_id
    assert span.parent is not None and format(span.parent.span_id, "016x") == parent_id
    assert span.kind == trace.SpanKind.CONSUMER
    assert span.attributes["cloudevents.event_id"] == event.id
    assert seen_in_handler == [int(trace_id, 16)]  # the handler runs inside the consumer span


async def test_publish_event_injects_the_current_span_when_the_event_has_no_traceparent(
        bus: tuple[NATS, JetStreamContext], spans: InMemorySpanExporter) -> None:
    _, js = bus
    with trace.get_tracer("test").start_as_current_span("producer") as span:
        ack = await publish_event(js, SUBJECT, job().to_cloudevent("/gpupool/queue"))
        expected_trace = format(span.get_span_context().trace_id, "032x")
    stored = await js.get_msg(EVENTS_STREAM.name, ack.seq)
    assert stored.headers["traceparent"].split("-")[1] == expected_trace


# --- request/reply ---------------------------------------------------------------------------------------------
class Echo(Command):
    text: str = Field(min_length=1)
    times: int = Field(default=1, ge=1, le=3)


class EchoResult(BaseModel):
    text: str


async def test_rpc_returns_the_handler_result_as_a_success_reply(bus: tuple[NATS, JetStreamContext]) -> None:
    nc, _ = bus

    async def echo(cmd: Echo) -> EchoResult:
        return EchoResult(text=cmd.text * cmd.times)

    await serve(nc, "gpupool.test.echo", Echo, echo, queue="test")
    reply = await request(nc, "gpupool.test.echo", Echo(text="ab", times=2), timeout=2)
    assert reply == Reply.success({"text": "abab"})


@pytest.mark.parametrize("body", [b'{"text": ', b'{"text": ""}', b'{"text": "a", "times": 9}',
                                  b'{"text": "a", "unexpected": 1}', b"[]"])
async def test_rpc_invalid_request_gets_a_400_invalid_request_reply(
        bus: tuple[NATS, JetStreamContext], body: bytes) -> None:
    nc, _ = bus
    called = False

    async def echo(cmd: Echo) -> EchoResult:
        nonlocal called
        called = True
        return EchoResult(text=cmd.text)

    await serve(nc, "gpupool.test.echo", Echo, echo, queue="test")
    msg = await nc.request("gpupool.test.echo", body, timeout=2)
    reply = Reply.model_validate_json(msg.data)
    assert reply.ok is False and reply.error is not None
    assert (reply.error.status, reply.error.reason) == (400, "InvalidRequest")
    assert reply.error.message
    assert reply.error.detail["errors"]
    assert not called


async def test_rpc_handler_exception_is_a_500_that_does_not_leak_the_error(
        bus: tuple[NATS, JetStreamContext]) -> None:
    nc, _ = bus

    async def explodes(cmd: Echo) -> None:
        raise RuntimeError("password=hunter2 at db.internal:5432")

    await serve(nc, "gpupool.test.explode", Echo, explodes, queue="test")
    reply = await request(nc, "gpupool.test.explode", Echo(text="x"), timeout=2)
    assert reply.ok is False and reply.error is not None
    assert (reply.error.status, reply.error.reason) == (500, "InternalError")
    leaked = reply.model_dump_json()
    assert "hunter2" not in leaked and "db.internal" not in leaked and "RuntimeError" not in leaked


async def test_rpc_refusal_reply_from_the_handler_is_passed_through(bus: tuple[NATS, JetStreamContext]) -> None:
    nc, _ = bus

    async def refuse(cmd: Echo) -> Reply:
        return Reply.failure(409, "Conflict", "already done", job_id="j-1")

    await serve(nc, "gpupool.test.refuse", Echo, refuse, queue="test")
    reply = await request(nc, "gpupool.test.refuse", Echo(text="x"), timeout=2)
    assert reply == Reply.failure(409, "Conflict", "already done", job_id="j-1")


async def test_rpc_with_no_responder_raises_service_unavailable(bus: tuple[NATS, JetStreamContext]) -> None:
    nc, _ = bus
    started = time.monotonic()
    with pytest.raises(ServiceUnavailable):
        await request(nc, "gpupool.test.nobody", Echo(text="x"), timeout=3)
    assert time.monotonic() - started < 2  # no-responders is immediate, not a timeout


async def test_rpc_with_a_responder_too_slow_raises_service_unavailable(
        bus: tuple[NATS, JetStreamContext]) -> None:
    nc, _ = bus

    async def slow(cmd: Echo) -> None:
        await asyncio.sleep(1)

    await serve(nc, "gpupool.test.slow", Echo, slow, queue="test")
    with pytest.raises(ServiceUnavailable):
        await request(nc, "gpupool.test.slow", Echo(text="x"), timeout=0.2)
