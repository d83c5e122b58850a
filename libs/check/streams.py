"""Reading JetStream for `gpupool check`, read-only: ephemeral ordered consumers (which JetStream deletes when they
go away; never a durable, never an ack) and direct message gets, plus consumer and stream info."""

from __future__ import annotations

import contextlib
import json
from datetime import UTC, datetime

import nats
from nats.errors import TimeoutError as NatsTimeoutError
from nats.js import JetStreamContext
from nats.js.errors import NotFoundError

from libs.check.snapshot import ConsumerState, DeadLetter, StreamEvent, StreamView
from libs.contracts import subjects

MSG_ID = "Nats-Msg-Id"
# Subjects read in full: the events the invariants fold. Every other message is read headers-only (its id).
# read whole: the events the invariants compare, and the policy events a forger would aim at (event_origins)
FULL_SUBJECTS = (subjects.JOB_STATE_CHANGED, subjects.ALLOCATION_ALL, subjects.QUOTA_SET,
                 subjects.QUOTA_PRIORITY_CLASS_SET, subjects.QUOTA_TEAM_CREATED)
ID_STREAMS = (subjects.EVENTS_STREAM.name, subjects.ROLLUPS_STREAM.name)


class StreamsUnavailable(RuntimeError):
    """NATS could not be reached or a stream could not be read."""


async def read_streams(url: str, *, timeout: float = 10.0) -> StreamView:
    try:
        nc = await nats.connect(servers=[u.strip() for u in url.split(",") if u.strip()], name="gpupool-check",
                                connect_timeout=timeout, max_reconnect_attempts=2, allow_reconnect=True)
    except Exception as exc:
        raise StreamsUnavailable(f"cannot connect to NATS: {exc!r}") from exc
    try:
        js = nc.jetstream(timeout=timeout)
        view = StreamView(read_at=datetime.now(UTC))
        for stream in ID_STREAMS:
            try:
                info = await js.stream_info(stream)
            except NotFoundError:
                continue
            view.max_age_s[stream] = float(info.config.max_age or 0)
            view.ids[stream] = {}
            async for msg in _read(js, stream, ">", info.state.last_seq, headers_only=True):
                msg_id = (msg.headers or {}).get(MSG_ID)
                if msg_id:
                    view.ids[stream].setdefault(msg_id, msg.metadata.sequence.stream)
        if subjects.EVENTS_STREAM.name in view.ids:
            for subject in FULL_SUBJECTS:
                async for msg in _read(js, subjects.EVENTS_STREAM.name, subject, None):
                    event = _event(msg.metadata.sequence.stream, msg.subject, msg.data)
                    view.events.append(event)
                    if event.event_id:  # the envelope's id counts too (a copy re-sent under another message id)
                        view.ids[subjects.EVENTS_STREAM.name].setdefault(event.event_id, event.seq)
        with contextlib.suppress(NotFoundError):
            await js.stream_info(subjects.DLQ_STREAM.name)
            async for msg in _read(js, subjects.DLQ_STREAM.name, ">", None):
                view.dead_letters.append(_dead_letter(msg))
        for stream in (s.name for s in subjects.STREAMS):
            with contextlib.suppress(NotFoundError):
                view.consumers += await _consumers(js, stream)
        return view
    except (NatsTimeoutError, nats.errors.Error) as exc:
        raise StreamsUnavailable(f"reading JetStream failed: {exc!r}") from exc
    finally:
        with contextlib.suppress(Exception):
            await nc.close()


async def _read(js: JetStreamContext, stream: str, subject: str, last_seq: int | None, *,
                headers_only: bool = False):  # type: ignore[no-untyped-def]
    """Every message of `stream` on `subject` that exists now, through an ephemeral ordered consumer."""
    try:
        first = await js.get_msg(stream, seq=1, next=True, subject=subject)
    except NotFoundError:
        return
    if last_seq is not None and first.seq > last_seq:
        return
    sub = await js.subscribe(subject, stream=stream, ordered_consumer=True, headers_only=headers_only or None,
                             pending_msgs_limit=1_000_000, pending_bytes_limit=1 << 30)
    try:
        while True:
            msg = await sub.next_msg(timeout=10)
            yield msg
            if msg.metadata.num_pending == 0 or (last_seq is not None and msg.metadata.sequence.stream >= last_seq):
                return
    except (TimeoutError, NatsTimeoutError) as exc:
        raise StreamsUnavailable(f"{stream}: reading {subject} stalled") from exc
    finally:
        with contextlib.suppress(Exception):
            await sub.unsubscribe()


def _event(seq: int, subject: str, raw: bytes) -> StreamEvent:
    try:
        doc = json.loads(raw)
    except (ValueError, UnicodeDecodeError, RecursionError):  # not JSON, or nested past the parser's stack
        doc = None
    if not isinstance(doc, dict):
        return StreamEvent(seq, subject, None, None, None, None)
    data = doc.get("data")
    return StreamEvent(seq, subject, doc.get("id") if isinstance(doc.get("id"), str) else None,
                       doc.get("source") if isinstance(doc.get("source"), str) else None,
                       doc.get("type") if isinstance(doc.get("type"), str) else None,
                       data if isinstance(data, dict) else None, _time(doc.get("time")))


def _time(value: object) -> datetime | None:
    if not isinstance(value, str):
        return None
    try:
        t = datetime.fromisoformat(value.replace("Z", "+00:00"))
    except ValueError:
        return None
    return t if t.tzinfo is not None else t.replace(tzinfo=UTC)


def _dead_letter(msg) -> DeadLetter:  # type: ignore[no-untyped-def]
    h = msg.headers or {}
    original = _event(0, h.get("Gpupool-Dlq-Subject", ""), msg.data or b"")
    try:
        stream_seq = int(h.get("Gpupool-Dlq-Stream-Seq", "0"))
    except ValueError:
        stream_seq = 0
    return DeadLetter(seq=msg.metadata.sequence.stream, consumer=h.get("Gpupool-Dlq-Consumer", "?"),
                      reason=h.get("Gpupool-Dlq-Reason", "?"), error=h.get("Gpupool-Dlq-Error", ""),
                      subject=h.get("Gpupool-Dlq-Subject", ""), stream=h.get("Gpupool-Dlq-Stream", ""),
                      stream_seq=stream_seq, event_id=original.event_id, source=original.source,
                      type=original.type)


async def _consumers(js: JetStreamContext, stream: str) -> list[ConsumerState]:
    out = []
    for info in await js.consumers_info(stream):
        if not info.config.durable_name:
            continue  # ephemeral: a reader such as this one, or the gateway's live event feed
        filters = tuple(info.config.filter_subjects or ([info.config.filter_subject]
                                                         if info.config.filter_subject else [">"]))
        oldest = None
        if (info.num_pending or 0) + (info.num_ack_pending or 0) > 0:
            floor = info.ack_floor.stream_seq if info.ack_floor else 0
            for f in filters:
                with contextlib.suppress(NotFoundError):
                    m = await js.get_msg(stream, seq=floor + 1, next=True, subject=f)
                    if oldest is None or m.seq < oldest.seq:
                        oldest = m
        out.append(ConsumerState(
            stream=stream, name=info.config.durable_name, filter_subjects=filters, num_pending=info.num_pending or 0,
            num_ack_pending=info.num_ack_pending or 0, num_redelivered=info.num_redelivered or 0,
            oldest_seq=oldest.seq if oldest else None, oldest_subject=oldest.subject if oldest else None,
            oldest_time=_msg_time(oldest) if oldest else None,
            delivered_seq=info.delivered.stream_seq if info.delivered else 0, num_waiting=info.num_waiting or 0))
    return out


def _msg_time(m) -> datetime | None:  # type: ignore[no-untyped-def]
    t = getattr(m, "time", None)
    if isinstance(t, datetime):
        return t if t.tzinfo else t.replace(tzinfo=UTC)
    return None
