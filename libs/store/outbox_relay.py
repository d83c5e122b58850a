"""Publishes committed outbox rows to JetStream, in commit order, at least once.

Relays of one database (replicas) take turns by a session advisory lock, so two never publish the same row
concurrently, and no transaction is open while a batch is published (see `publish_pending`). A crash between
publish and marking the row sent republishes it with the same Nats-Msg-Id: the stream's duplicate window drops
it, and consumers' inboxes catch anything later. Nothing is ever lost: a row stays until JetStream acked it.

With `publish_batch`, a batch of rows is pipelined: all written in `seq` order on one connection (JetStream stores
them in that order), then the acks awaited together: one round trip per batch instead of one per row. Only acked
rows are marked. A row that fails while a later one of the same batch is stored (a stream leader change between
the two) is republished after it: the only case where pipelining can reorder, and the per-row path has no such
case, so each failure is recorded on its row exactly as before.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import asyncpg

from libs.observability.metrics import OUTBOX_PENDING, OUTBOX_RELAYED

log = logging.getLogger(__name__)

MSG_ID_HEADER = "Nats-Msg-Id"
RELAY_LOCK_KEY = 0x6F75_7462  # "outb": the session advisory lock the relays of one database take turns by
# (subject, payload, headers) -> awaitable that raises unless the stream stored the message. The store knows
# nothing of NATS; the service's bootstrap passes libs.bus.publisher.publish_raw bound to its JetStream context.
PublishFn = Callable[[str, bytes, dict[str, str]], Awaitable[Any]]
# [(subject, payload, headers)] -> per message, in the same order, its ack or the exception saying it was not
# stored (libs.bus.publisher.publish_raw_batch).
PublishBatchFn = Callable[[list[tuple[str, bytes, dict[str, str]]]], Awaitable[list[Any]]]


class OutboxRelay:
    def __init__(self, pool: asyncpg.Pool, publish: PublishFn, service: str, *, batch: int = 200,
                 poll_interval_s: float = 1.0, publish_batch: PublishBatchFn | None = None) -> None:
        self.pool = pool
        self.publish = publish
        self.publish_batch = publish_batch
        self.service = service
        self.batch = batch
        self.poll_interval_s = poll_interval_s
        self._wake = asyncio.Event()
        self._stopping = asyncio.Event()
        self._task: asyncio.Task[None] | None = None

    def wake(self) -> None:
        """Called after a unit of work committed events: publish now instead of at the next poll."""
        self._wake.set()

    def start(self) -> None:
        self._task = asyncio.create_task(self._run(), name=f"outbox-relay:{self.service}")

    async def stop(self) -> None:
        """Publish what is already committed, then stop."""
        self._stopping.set()
        self._wake.set()
        if self._task is not None:
            with contextlib.suppress(asyncio.CancelledError):
                await self._task

    async def _run(self) -> None:
        failures = 0
        while True:
            try:
                sent = await self.publish_pending()
                failures = 0
                # A short batch means the backlog is drained; only a full one is worth counting.
                if sent < self.batch:
                    OUTBOX_PENDING.labels(service=self.service).set(0)
                else:
                    await self.pending_count()
            except Exception as exc:
                failures += 1
                delay = min(5.0, 0.1 * 2**failures)
                log.warning("outbox_publish_failed", extra={"service": self.service, "error": repr(exc),
                                                            "retry_in_s": delay})
                if self._stopping.is_set() and failures > 3:
                    return
                await asyncio.sleep(delay)
                continue
            if sent:
                continue
            if self._stopping.is_set():
                return
            self._wake.clear()
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(self._wake.wait(), timeout=self.poll_interval_s)

    async def publish_pending(self) -> int:
        """Publish one batch; returns how many rows were published (0 as well while another relay of the same
        database — a replica — is publishing).

        No transaction is open while the batch is published: the rows are read by one statement and marked by a
        short transaction afterwards, and relays of one database take turns by a session advisory lock. A
        transaction held across the publish (it used to be: rows locked FOR UPDATE until JetStream acked them,
        for as long as a busy event loop took to read the acks) holds back every snapshot's xmin in the
        cluster, and with it the horizon placement's incremental read re-reads from (services/placement).

        On a failed publish, the rows already published are marked and the failing row's `attempts`/`last_error`
        recorded, then the error is raised."""
        failure: Exception | None = None
        async with self.pool.acquire() as conn:
            if not await conn.fetchval("SELECT pg_try_advisory_lock($1)", RELAY_LOCK_KEY):
                return 0
            try:
                rows = await conn.fetch(
                    """SELECT seq, event_id, subject, payload, traceparent FROM outbox
                       WHERE published_at IS NULL ORDER BY seq LIMIT $1""", self.batch)
                published: list[int] = []
                failed: list[tuple[int, str]] = []
                if self.publish_batch is not None and len(rows) > 1:
                    results = await self.publish_batch([_message(row) for row in rows])
                    for row, result in zip(rows, results, strict=True):
                        if isinstance(result, BaseException):
                            failure = failure or (result if isinstance(result, Exception) else RuntimeError(result))
                            failed.append((row["seq"], repr(result)[:500]))
                        else:
                            published.append(row["seq"])
                else:
                    for row in rows:
                        try:
                            await self.publish(*_message(row))
                        except Exception as exc:
                            failure = exc
                            failed.append((row["seq"], repr(exc)[:500]))
                            break
                        published.append(row["seq"])
                async with _marking_transaction(conn):
                    await self._mark(conn, published)
                    if failed:
                        await conn.executemany(
                            "UPDATE outbox SET attempts = attempts + 1, last_error = $2 WHERE seq = $1", failed)
            finally:
                await conn.execute("SELECT pg_advisory_unlock($1)", RELAY_LOCK_KEY)
        if published:
            OUTBOX_RELAYED.labels(service=self.service).inc(len(published))
        if failure is not None:
            raise failure
        return len(published)

    async def _mark(self, conn: asyncpg.Connection, seqs: list[int]) -> None:
        if seqs:
            await conn.execute("UPDATE outbox SET published_at = now() WHERE seq = ANY($1::bigint[])", seqs)

    async def pending_count(self) -> int:
        async with self.pool.acquire() as conn:
            n = await conn.fetchval("SELECT count(*) FROM outbox WHERE published_at IS NULL")
        OUTBOX_PENDING.labels(service=self.service).set(n)
        return int(n)


@contextlib.asynccontextmanager
async def _marking_transaction(conn: asyncpg.Connection) -> AsyncIterator[None]:
    """The relay's transaction commits without waiting for its WAL flush (`synchronous_commit off`, and in the
    same round trip as BEGIN): all it makes durable is "these rows were published", and losing that to a crash is
    the crash-between-publish-and-mark case above (republished under the same Nats-Msg-Id, dropped as duplicates).
    The rows themselves were committed durably by the units of work that wrote them."""
    await conn.execute("BEGIN; SET LOCAL synchronous_commit TO off")
    try:
        yield
    except BaseException:
        with contextlib.suppress(Exception):
            await conn.execute("ROLLBACK")
        raise
    await conn.execute("COMMIT")


def _message(row: asyncpg.Record) -> tuple[str, bytes, dict[str, str]]:
    headers = {MSG_ID_HEADER: row["event_id"], "Content-Type": "application/cloudevents+json"}
    if row["traceparent"]:
        headers["traceparent"] = row["traceparent"]
    return row["subject"], bytes(row["payload"]), headers
