"""Unit of work: one transaction that holds a state change, the events it emits (outbox) and, for consumers,
the inbox row that makes handling an event idempotent. Either all of it commits or none of it does."""

from __future__ import annotations

from collections.abc import Callable
from types import TracebackType

import asyncpg

from libs.contracts.envelope import CloudEvent
from libs.contracts.events import EventData, subject_for
from libs.observability.tracing import current_traceparent


class UnitOfWork:
    def __init__(self, pool: asyncpg.Pool, source: str, on_commit: Callable[[], None] | None = None) -> None:
        self._pool = pool
        self._source = source
        self._on_commit = on_commit
        self._emitted: list[CloudEvent] = []
        self.conn: asyncpg.Connection

    async def __aenter__(self) -> UnitOfWork:
        self.conn = await self._pool.acquire()
        self._tx = self.conn.transaction()
        await self._tx.start()
        return self

    async def __aexit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                        tb: TracebackType | None) -> None:
        try:
            if exc_type is None:
                await self._tx.commit()
            else:
                await self._tx.rollback()
        finally:
            await self._pool.release(self.conn)
        if exc_type is None and self._emitted and self._on_commit is not None:
            self._on_commit()

    @property
    def emitted(self) -> list[CloudEvent]:
        return list(self._emitted)

    async def emit(self, data: EventData) -> CloudEvent:
        """Write the event into the outbox inside this transaction; the relay publishes it after commit."""
        traceparent = current_traceparent()
        event = data.to_cloudevent(self._source, traceparent=traceparent)
        await self.conn.execute(
            "INSERT INTO outbox (event_id, subject, payload, traceparent) VALUES ($1, $2, $3, $4)",
            event.id, subject_for(data), event.to_json(), traceparent)
        self._emitted.append(event)
        return event

    async def first_time(self, consumer: str, event_id: str) -> bool:
        """Record (consumer, event id) in the inbox. False means this event was already applied: skip it."""
        inserted = await self.conn.fetchval(
            "INSERT INTO inbox (consumer, event_id) VALUES ($1, $2) ON CONFLICT DO NOTHING RETURNING 1",
            consumer, event_id)
        return inserted is not None
