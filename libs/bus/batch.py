"""A durable pull consumer that hands a whole fetched batch to one handler call, for high-volume streams whose
effects are idempotent (telemetry): one transaction per batch instead of one per message.

If the batch handler fails, each message of the batch is retried through the one-at-a-time path
(`EventConsumer.handle_one`), so a poison message is still isolated, dead-lettered and never blocks the stream.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable

from nats.errors import TimeoutError as NatsTimeoutError
from nats.js import JetStreamContext

from libs.bus.consumer import ConsumerSpec, EventConsumer, Handler
from libs.contracts.envelope import CloudEvent, InvalidEnvelope, parse_envelope
from libs.contracts.events import EventData, decode_data
from libs.observability.metrics import BUS_HANDLE_SECONDS, BUS_MESSAGES

log = logging.getLogger(__name__)

BatchHandler = Callable[[list[tuple[CloudEvent, EventData]]], Awaitable[None]]


class BatchConsumer(EventConsumer):
    def __init__(self, js: JetStreamContext, spec: ConsumerSpec, batch_handler: BatchHandler,
                 handler: Handler) -> None:
        super().__init__(js, spec, handler)
        self.batch_handler = batch_handler

    async def _run(self) -> None:
        while not self._stopping.is_set():
            try:
                msgs = await self._sub.fetch(self.spec.batch, timeout=1.0)
            except (TimeoutError, NatsTimeoutError):
                continue
            except Exception as exc:  # connection blips: nats-py reconnects underneath
                if self._stopping.is_set():
                    break
                log.warning("fetch_failed", extra={"consumer": self.spec.durable, "error": repr(exc)})
                await asyncio.sleep(0.5)
                continue
            try:
                await self.handle_batch(msgs)
            except Exception as exc:
                log.exception("batch_ack_failed", extra={"consumer": self.spec.durable, "error": repr(exc)})

    async def handle_batch(self, msgs: list) -> None:  # type: ignore[type-arg]
        started = time.perf_counter()
        good, decoded = [], []
        for msg in msgs:
            try:
                event = parse_envelope(msg.data)
                decoded.append((event, decode_data(event)))
                good.append(msg)
            except InvalidEnvelope as exc:
                await self.dead_letter(msg, "InvalidMessage", str(exc))
        if not good:
            return
        try:
            await self.batch_handler(decoded)
        except Exception as exc:
            log.warning("batch_failed_retrying_one_by_one", exc_info=exc,
                        extra={"consumer": self.spec.durable, "messages": len(good)})
            for msg in good:
                try:
                    await self.handle_one(msg)
                except Exception as one_exc:
                    log.exception("handle_failed", extra={"consumer": self.spec.durable, "error": repr(one_exc)})
            return
        for msg in good:
            await msg.ack()
        BUS_MESSAGES.labels(consumer=self.spec.durable, outcome="handled").inc(len(good))
        BUS_HANDLE_SECONDS.labels(consumer=self.spec.durable).observe(time.perf_counter() - started)
