"""Durable pull consumers with explicit ack discipline and a dead-letter stream.

Outcomes of one message:
- handled → `ack` (the handler has already committed its effect and its inbox row);
- undecodable / invalid / not from its type's owner or not on its subject (libs/contracts/origins.py) / `Poison`
  raised / a failure of the event's own content (`permanent`: ValueError, TypeError, ArithmeticError,
  RecursionError, asyncpg's DataError) → copied to `gpupool.dlq.<consumer>` with the reason, then `term`;
- any other exception → `nak` with exponential backoff, until `max_deliver` is reached, then dead-lettered
  (`Busy`, contention rather than failure, the same but logged without a traceback and counted as `busy`).
Messages are handled one at a time per consumer so events about one entity apply in stream order.

Batched transactions (opt-in, `transaction=`): the messages of one fetch are handled inside one transaction that
the factory opens (libs.store.unit_of_work.BatchTransaction: each handler's unit of work becomes a savepoint), so
the batch pays one commit instead of one per message. A batch is first applied without a savepoint per message (the
common case: nothing fails, and each message costs two statements and a round trip less); if any message fails
there, the whole batch is rolled back, nothing of it settled, and it is applied again with a savepoint per message.
There a poison or failing message rolls back only its savepoint
and is dead-lettered or nak'd as above; the others are acked only after the commit succeeded. If the commit fails
nothing is acked: the handled messages are nak'd and redelivered, and the inbox makes applying them again a no-op.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

from nats.aio.msg import Msg
from nats.errors import TimeoutError as NatsTimeoutError
from nats.js import JetStreamContext
from nats.js.api import AckPolicy, ConsumerConfig, DeliverPolicy
from nats.js.errors import NotFoundError
from opentelemetry import trace

from libs.bus.publisher import MSG_ID_HEADER, publish_raw
from libs.contracts import subjects
from libs.contracts.envelope import CloudEvent, InvalidEnvelope, parse_envelope
from libs.contracts.events import EventData, decode_data
from libs.contracts.origins import vet
from libs.observability.metrics import (
    BUS_CONSUMER_ACK_PENDING,
    BUS_CONSUMER_PENDING,
    BUS_DEAD_LETTERS,
    BUS_HANDLE_SECONDS,
    BUS_MESSAGES,
    BUS_REDELIVERIES,
)
from libs.observability.tracing import handling_span, tracer

# why a message goes to the dead-letter stream, besides a handler's own `DeadLetter(reason)`
DEAD_LETTER_REASONS = ("InvalidMessage", "HandlerFailed", "MaxDeliveriesExceeded")
log = logging.getLogger(__name__)

Handler = Callable[[CloudEvent, EventData], Awaitable[None]]
# At most this many messages per batch transaction: every message's savepoint that writes takes a subtransaction
# id, and past 64 in one transaction PostgreSQL's per-backend cache overflows, which slows every other session's
# snapshots while it lasts. A larger fetch is applied in several transactions, in order.
MAX_MESSAGES_PER_TRANSACTION = 48
# Opens one transaction around a fetched batch; committing happens on a clean exit, and raising from the exit
# (a failed commit) means nothing of the batch is durable.
BatchTransactionFactory = Callable[[], AbstractAsyncContextManager[object]]


@runtime_checkable
class ExpectsEvents(Protocol):
    """A batch transaction that wants the event ids of the batch's messages before they are applied (libs.store's
    records their inbox rows in one statement)."""

    def expect_events(self, event_ids: list[str | None]) -> None: ...


@runtime_checkable
class Optimistic(Protocol):
    """A batch transaction that can apply its messages without a savepoint each (libs.store's): `optimistic` is set
    before it is entered; `spoiled` says a unit of work failed inside it (its transaction may be aborted)."""

    optimistic: bool
    spoiled: bool


class _Replay(Exception):
    """A message of a batch applied without savepoints failed: the batch rolls back and is applied again with a
    savepoint per message, where each failure is settled on its own."""


class Poison(Exception):
    """Raised by a handler for a message that can never succeed (retrying would only repeat the failure)."""

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(message)
        self.reason = reason


# Failures no retry can cure: the event's content is what fails (a value no column takes, text PostgreSQL refuses,
# arithmetic that overflows, a model's validation). Such an event is dead-lettered at its first failure instead of
# holding its consumer through `max_deliver` back-offs; the consumer goes on with the next.
PERMANENT_ERRORS: tuple[type[BaseException], ...] = (ValueError, TypeError, ArithmeticError, RecursionError)


def permanent(exc: BaseException) -> bool:
    """True for a failure of the event itself (see PERMANENT_ERRORS; also asyncpg's DataError class, told by name:
    the bus does not import the database driver). Connection losses, timeouts, deadlocks and serialization
    failures are not: they are retried."""
    if isinstance(exc, PERMANENT_ERRORS):
        return True
    return any(c.__name__ == "DataError" and c.__module__.startswith("asyncpg") for c in type(exc).__mro__)


class Busy(Exception):
    """Raised by a handler whose entity another transaction is changing right now (another replica's batch, say)
    when waiting for it could deadlock: the message is retried after the usual back-off like any failure, but this
    is contention, not an error, so it is logged without a traceback and counted as `busy`."""


@dataclass(frozen=True, slots=True)
class ConsumerSpec:
    stream: str
    durable: str
    filter_subjects: tuple[str, ...]
    max_deliver: int = 8
    ack_wait_s: float = 30.0
    batch: int = 64
    backoff_base_s: float = 0.2
    backoff_max_s: float = 10.0
    max_ack_pending: int = 1000
    # events are input: the owner's source, the subject its publisher uses, no NUL (libs/contracts/origins.py);
    # off only for a test of the consumer's own mechanics on a subject of its own
    vet: bool = True


def backoff_delay(spec: ConsumerSpec, num_delivered: int) -> float:
    # Exponent capped: with an unlimited or large max_deliver, 2**n would overflow the float conversion.
    return min(spec.backoff_max_s, spec.backoff_base_s * 2.0 ** min(max(0, num_delivered - 1), 62))


class EventConsumer:
    def __init__(self, js: JetStreamContext, spec: ConsumerSpec, handler: Handler, *,
                 transaction: BatchTransactionFactory | None = None) -> None:
        self.js = js
        self.spec = spec
        self.handler = handler
        self.transaction = transaction
        self._task: asyncio.Task[None] | None = None
        self._stopping = asyncio.Event()
        self._tracer = tracer(f"gpupool.bus.{spec.durable}")
        # metric children looked up once: a labels() lookup costs more than the increment it precedes
        self._handled = BUS_MESSAGES.labels(consumer=spec.durable, outcome="handled")
        self._handle_seconds = BUS_HANDLE_SECONDS.labels(consumer=spec.durable)
        # the outcomes a healthy consumer never has exist at 0, so a dashboard shows 0 rather than "No data"
        for outcome in ("retried", "busy", "dead_lettered"):
            BUS_MESSAGES.labels(consumer=spec.durable, outcome=outcome)
        BUS_REDELIVERIES.labels(consumer=spec.durable)
        for reason in DEAD_LETTER_REASONS:
            BUS_DEAD_LETTERS.labels(consumer=spec.durable, reason=reason)

    async def start(self) -> None:
        config = ConsumerConfig(
            durable_name=self.spec.durable,
            name=self.spec.durable,
            ack_policy=AckPolicy.EXPLICIT,
            deliver_policy=DeliverPolicy.ALL,
            ack_wait=self.spec.ack_wait_s,
            max_deliver=self.spec.max_deliver,
            max_ack_pending=self.spec.max_ack_pending,
            filter_subjects=list(self.spec.filter_subjects),
        )
        for attempt in range(1, 9):
            try:
                try:
                    await self.js.consumer_info(self.spec.stream, self.spec.durable)
                except NotFoundError:
                    pass
                await self.js.add_consumer(self.spec.stream, config)  # create, or update with the same name
                break
            except NatsTimeoutError:
                # a JetStream cluster busy placing replicas (just formed, or a node lost) answers late
                if attempt == 8:
                    raise
                log.warning("consumer_declare_retry", extra={"consumer": self.spec.durable, "attempt": attempt})
                await asyncio.sleep(min(5.0, 0.5 * attempt))
        self._sub = await self.js.pull_subscribe_bind(durable=self.spec.durable, stream=self.spec.stream)
        self._task = asyncio.create_task(self._run(), name=f"consumer:{self.spec.durable}")

    async def stop(self) -> None:
        """Stop fetching, let the message in hand finish, then unsubscribe (the durable consumer stays)."""
        self._stopping.set()
        if self._task is not None:
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        with contextlib.suppress(Exception):
            await self._sub.unsubscribe()

    async def _run(self) -> None:
        while not self._stopping.is_set():
            try:
                msgs = await self._sub.fetch(self.spec.batch, timeout=1.0)
            except (TimeoutError, NatsTimeoutError):
                continue
            except Exception as exc:  # connection blips: keep the loop alive, nats-py reconnects underneath
                if self._stopping.is_set():
                    break
                log.warning("fetch_failed", extra={"consumer": self.spec.durable, "error": repr(exc)})
                await asyncio.sleep(0.5)
                continue
            if self.transaction is not None and len(msgs) > 1:
                for start in range(0, len(msgs), MAX_MESSAGES_PER_TRANSACTION):
                    await self.handle_batch_in_transaction(msgs[start:start + MAX_MESSAGES_PER_TRANSACTION])
                continue
            for msg in msgs:
                try:
                    await self.handle_one(msg)
                except Exception as exc:
                    # ack/nak/term or the dead-letter publish failed (NATS blip, DLQ stream missing): an escaping
                    # exception would end this task and silently stop the consumer. Keep going; the message is
                    # redelivered (nak now if we still can, else after ack_wait) and gets another try.
                    self._handle_failed(msg, exc)
                    await self._nak_quietly(msg)

    def _handle_failed(self, msg: Msg, exc: Exception) -> None:
        log.exception("handle_failed", exc_info=exc, extra={"consumer": self.spec.durable, "error": repr(exc)})

    async def _nak_quietly(self, msg: Msg) -> None:
        with contextlib.suppress(Exception):
            await msg.nak(delay=backoff_delay(self.spec, msg.metadata.num_delivered))

    async def handle_batch_in_transaction(self, msgs: list[Msg]) -> None:
        """Apply `msgs` in order inside one transaction; ack the handled ones only once it committed. First without
        a savepoint per message (`_apply_without_savepoints`); if any message fails there, the batch is rolled back
        and applied again with a savepoint each, so a failing message rolls back alone and is settled as always."""
        assert self.transaction is not None
        if await self._apply_without_savepoints(msgs):
            return
        handled: list[tuple[Msg, float]] = []
        started = 0  # messages whose handling began (a failure to open the transaction starts none)
        try:
            async with self.transaction() as tx:
                if isinstance(tx, ExpectsEvents):  # the inbox rows of the whole batch in one statement
                    tx.expect_events([(msg.headers or {}).get(MSG_ID_HEADER) for msg in msgs])
                for msg in msgs:
                    started += 1
                    began = time.perf_counter()
                    try:
                        if await self.apply(msg):
                            handled.append((msg, time.perf_counter() - began))
                    except Exception as exc:  # settling it (nak/term/dead-letter) failed: as in the loop above
                        self._handle_failed(msg, exc)
                        await self._nak_quietly(msg)
        except Exception as exc:
            await self._not_committed([m for m, _ in handled] + msgs[started:], exc)
            return
        await self._ack_committed(handled)

    async def _not_committed(self, owed: list[Msg], exc: Exception) -> None:
        """The batch's transaction did not commit: nothing of it is acked; the messages handled in it and those not
        yet started come back (nak'd)."""
        log.warning("batch_commit_failed", extra={"consumer": self.spec.durable, "error": repr(exc),
                                                  "messages": len(owed)})
        BUS_MESSAGES.labels(consumer=self.spec.durable, outcome="retried").inc(len(owed))
        for msg in owed:
            await self._nak_quietly(msg)

    async def _apply_without_savepoints(self, msgs: list[Msg]) -> bool:
        """The common case, cheaper: every message of the batch applied in one transaction with no savepoint of its
        own (a SAVEPOINT and its RELEASE fewer per message: two statements, one round trip). True: settled, either
        committed and acked, or not committed (the transaction could not begin or commit) and nak'd, as with
        savepoints. False: a message failed (poison, undecodable, its handler raised): nothing committed, nothing
        settled, and the caller applies the batch again, a savepoint per message. A handler's effects outside the
        database wait for the commit (`after_commit`), so applying again repeats none of them."""
        assert self.transaction is not None
        tx = self.transaction()
        if not isinstance(tx, Optimistic):
            return False
        tx.optimistic = True
        handled: list[tuple[Msg, float]] = []
        try:
            async with tx:
                if isinstance(tx, ExpectsEvents):
                    tx.expect_events([(msg.headers or {}).get(MSG_ID_HEADER) for msg in msgs])
                for msg in msgs:
                    began = time.perf_counter()
                    await self.apply(msg, settle=False)
                    if tx.spoiled:  # a unit of work failed and its handler went on: the transaction is not whole
                        raise _Replay("a unit of work of the batch failed")
                    handled.append((msg, time.perf_counter() - began))
        except _Replay as exc:
            log.info("batch_applied_again_with_savepoints", extra={"consumer": self.spec.durable,
                                                                   "error": repr(exc.__cause__ or exc)[:300]})
            return False
        except Exception as exc:
            self._count_redeliveries(msgs)
            await self._not_committed(msgs, exc)
            return True
        self._count_redeliveries(msgs)
        await self._ack_committed(handled)
        return True

    def _count_redeliveries(self, msgs: list[Msg]) -> None:
        redelivered = sum(1 for msg in msgs if msg.metadata.num_delivered > 1)
        if redelivered:
            BUS_REDELIVERIES.labels(consumer=self.spec.durable).inc(redelivered)

    async def _ack_committed(self, handled: list[tuple[Msg, float]]) -> None:
        for msg, took in handled:
            try:
                await msg.ack()
            except Exception as exc:  # a blip: the message is redelivered after ack_wait, the inbox skips it
                log.warning("ack_failed", extra={"consumer": self.spec.durable, "error": repr(exc)})
                continue
            self._handle_seconds.observe(took)
        if handled:
            self._handled.inc(len(handled))

    async def report_lag(self) -> None:
        info = await self.js.consumer_info(self.spec.stream, self.spec.durable)
        BUS_CONSUMER_PENDING.labels(consumer=self.spec.durable).set(info.num_pending or 0)
        BUS_CONSUMER_ACK_PENDING.labels(consumer=self.spec.durable).set(info.num_ack_pending or 0)

    async def handle_one(self, msg: Msg) -> None:
        started = time.perf_counter()
        if await self.apply(msg):
            await msg.ack()
            self._handled.inc()
            self._handle_seconds.observe(time.perf_counter() - started)

    async def apply(self, msg: Msg, *, settle: bool = True) -> bool:
        """Decode and handle one message. True: the handler succeeded and the message awaits its ack. False: it
        was settled here (dead-lettered, or nak'd for a retry). With `settle` False nothing is settled: a failure
        raises `_Replay` (from it) instead."""
        consumer = self.spec.durable
        if settle and msg.metadata.num_delivered > 1:  # unsettled: counted once settled (a batch may be applied again)
            BUS_REDELIVERIES.labels(consumer=consumer).inc()
        with handling_span(
            self._tracer, f"consume {msg.subject}", msg.headers, trace.SpanKind.CONSUMER,
            attributes={"messaging.system": "nats", "messaging.destination.name": msg.subject,
                        "messaging.consumer.group.name": consumer},
        ) as span:
            try:
                event = parse_envelope(msg.data)
                data = decode_data(event)
                if self.spec.vet:
                    vet(msg.data, event, data, msg.subject)
            except InvalidEnvelope as exc:
                if not settle:
                    raise _Replay("undecodable") from exc
                await self.dead_letter(msg, "InvalidMessage", str(exc))
                return False
            span.set_attribute("cloudevents.event_id", event.id)
            span.set_attribute("cloudevents.event_type", event.type)
            try:
                await self.handler(event, data)
            except Exception as exc:
                if not settle:
                    raise _Replay("the handler failed") from exc
                return await self._settle_failure(msg, event, exc, span)
            return True

    async def _settle_failure(self, msg: Msg, event: CloudEvent, exc: Exception, span: trace.Span) -> bool:
        """Dead-letter or nak a message whose handler raised `exc`; False (settled)."""
        consumer = self.spec.durable
        if isinstance(exc, Poison):
            await self.dead_letter(msg, exc.reason, str(exc))
            return False
        delivered = msg.metadata.num_delivered
        span.record_exception(exc)
        if permanent(exc) and not isinstance(exc, Busy):
            log.error("handler_failed_on_the_event", exc_info=exc, extra={"consumer": consumer, "event_id": event.id})
            await self.dead_letter(msg, "HandlerFailed", repr(exc)[:2000])
            return False
        if delivered >= self.spec.max_deliver:
            await self.dead_letter(msg, "MaxDeliveriesExceeded", repr(exc))
            return False
        delay = backoff_delay(self.spec, delivered)
        busy = isinstance(exc, Busy)
        extra = {"consumer": consumer, "event_id": event.id, "delivered": delivered, "retry_in_s": delay}
        if busy:
            log.info("handler_busy_will_retry", extra=extra | {"error": str(exc)})
        else:
            log.warning("handler_failed_will_retry", exc_info=exc, extra=extra)
        BUS_MESSAGES.labels(consumer=consumer, outcome="busy" if busy else "retried").inc()
        await msg.nak(delay=delay)
        return False

    async def dead_letter(self, msg: Msg, reason: str, error: str) -> None:
        """Park the original bytes with why, then `term` so JetStream never redelivers it."""
        meta = msg.metadata
        headers = {
            MSG_ID_HEADER: f"dlq:{meta.stream}:{meta.sequence.stream}:{self.spec.durable}",
            "Gpupool-Dlq-Reason": reason,
            "Gpupool-Dlq-Error": error[:1000],
            "Gpupool-Dlq-Subject": msg.subject,
            "Gpupool-Dlq-Stream": meta.stream,
            "Gpupool-Dlq-Stream-Seq": str(meta.sequence.stream),
            "Gpupool-Dlq-Consumer": self.spec.durable,
            "Gpupool-Dlq-Delivered": str(meta.num_delivered),
        }
        await publish_raw(self.js, subjects.dead_letter(self.spec.durable), msg.data, headers)
        await msg.term()
        BUS_DEAD_LETTERS.labels(consumer=self.spec.durable, reason=reason).inc()
        BUS_MESSAGES.labels(consumer=self.spec.durable, outcome="dead_lettered").inc()
        log.error("message_dead_lettered", extra={"consumer": self.spec.durable, "reason": reason,
                                                   "error": error[:300], "subject": msg.subject,
                                                   "stream_seq": meta.sequence.stream})
