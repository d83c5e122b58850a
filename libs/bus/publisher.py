"""Publishing events to JetStream with dedupe and trace context.

`Nats-Msg-Id` is the CloudEvent id, so a republish (relay crash after publish, before marking the row sent) is
dropped by the stream's duplicate window. The PubAck is checked: a publish counts only once the stream stored it.

`publish_raw_batch` pipelines: it writes every message on the connection in order (one TCP stream, so the server
stores them in that order) and only then waits for the acks, instead of one round trip per message.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

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


async def publish_raw_batch(js: JetStreamContext, messages: Sequence[tuple[str, bytes, dict[str, str]]], *,
                            timeout: float = 5.0) -> list[PubAck | BaseException]:
    """Publish `messages` (subject, payload, headers) in order without waiting between them, then collect each
    one's ack: the result at the same index is its PubAck, or the exception saying it was not stored (the caller
    decides what to retry). `timeout` bounds the whole wait for acks."""
    futures: list[asyncio.Future[PubAck] | BaseException] = []
    for subject, payload, headers in messages:
        try:
            futures.append(await js.publish_async(subject, payload, headers=headers, wait_stall=timeout))
        except Exception as exc:  # not even written (disconnected, too many in flight): the rest would fail too
            futures.append(exc)
            break
    pending = [f for f in futures if isinstance(f, asyncio.Future)]
    if pending:
        _, late = await asyncio.wait(pending, timeout=timeout)
        for f in late:
            f.cancel()  # frees its slot in nats-py's in-flight table; reported as a timeout below
    results: list[PubAck | BaseException] = []
    for (subject, _, _), f in zip(messages, futures, strict=False):
        if isinstance(f, BaseException):
            results.append(f)
        elif f.cancelled():
            results.append(TimeoutError(f"no ack from JetStream within {timeout}s on {subject}"))
        elif f.exception() is not None:
            results.append(f.exception())  # type: ignore[arg-type]
        elif not f.result().stream:
            results.append(PublishError(f"JetStream did not store the message on {subject}"))
        else:
            BUS_PUBLISHED.labels(subject_root=".".join(subject.split(".")[:2])).inc()
            results.append(f.result())
    results.extend(PublishError("not sent: an earlier message of the batch could not be written")
                   for _ in range(len(messages) - len(results)))
    return results
