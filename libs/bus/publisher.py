"""Publishing events to JetStream with dedupe and trace context.

`Nats-Msg-Id` is the CloudEvent id, so a republish (relay crash after publish, before marking the row sent) is
dropped by the stream's duplicate window. The PubAck is checked: a publish counts only once the stream stored it.
"""

from __future__ import annotations

from nats.js import JetStreamContext
from nats.js.api import PubAck

from libs.contracts.envelope import CloudEvent
from libs.observability.metrics import BUS_PUBLISHED
from libs.observability.tracing import inject_headers

MSG_ID_HEADER = "Nats-Msg-Id"


class PublishError(RuntimeError):
    pass


async def publish_event(js: JetStreamContext, subject: str, event: CloudEvent, *, timeout: float = 5.0,
                        expected_stream: str | None = None) -> PubAck:
    headers: dict[str, str] = {MSG_ID_HEADER: event.id, "Content-Type": "application/cloudevents+json"}
    if event.traceparent:
        headers["traceparent"] = event.traceparent
    else:
        inject_headers(headers)
    return await publish_raw(js, subject, event.to_json(), headers, timeout=timeout,
                             expected_stream=expected_stream)


async def publish_raw(js: JetStreamContext, subject: str, payload: bytes, headers: dict[str, str], *,
                      timeout: float = 5.0, expected_stream: str | None = None) -> PubAck:
    ack = await js.publish(subject, payload, timeout=timeout, stream=expected_stream, headers=headers)
    if not ack.stream:
        raise PublishError(f"JetStream did not store the message on {subject}")
    BUS_PUBLISHED.labels(subject_root=".".join(subject.split(".")[:2])).inc()
    return ack
