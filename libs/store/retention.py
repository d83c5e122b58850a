"""Retention of the shared `outbox` and `inbox` tables: without it both grow by every event, forever.

- **outbox**: a row is needed until JetStream acked it (the relay marks `published_at`); after that only people and
  `gpupool check` read it. Published rows older than `outbox_retention_s` are deleted; an unpublished row never is,
  whatever its age (it is an event not yet delivered).
- **inbox**: a row makes a redelivered event apply once. JetStream may redeliver an event as long as the stream
  keeps it, so the inbox must remember it at least that long (libs.runtime.settings refuses a shorter setting).

Deletes go in small batches (`batch` rows per statement, `pause_s` between statements, SKIP LOCKED) so pruning never
holds long locks or starves the job path; several replicas share the work. Before deleting, the horizon (the cutoff
of the pass) is committed to `store_retention`, so a reader that misses a row can tell it was pruned, not lost.

Upgrading a database whose tables already hold millions of rows: migration store/0002 builds its two indexes inside
its transaction, blocking writes to the table meanwhile; build them first with `CREATE INDEX CONCURRENTLY` under the
same names (`outbox_published_at`, `inbox_processed_at`) and the migration's IF NOT EXISTS skips them.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from dataclasses import dataclass
from datetime import datetime

import asyncpg

from libs.observability.metrics import STORE_PRUNED

log = logging.getLogger(__name__)

DAY_S = 24 * 3600.0
# Published outbox rows are kept a week: JetStream's duplicate window (minutes) is all the relay needs, and the
# events stream keeps every event for consumers; the week is for people and `gpupool check`, which compare state
# with the events that made it (a weekend plus time to investigate). At 100 jobs/s this bounds the table to a week
# of events instead of all of them.
DEFAULT_OUTBOX_RETENTION_S = 7 * DAY_S
DEFAULT_INTERVAL_S = 300.0
DEFAULT_BATCH = 5000

# ARRAY(...) makes the victims one list looked up by key (pkey / tid), not a join that scans the whole table.
_DELETE_OUTBOX = """
    DELETE FROM outbox WHERE seq = ANY(ARRAY(
        SELECT seq FROM outbox WHERE published_at IS NOT NULL AND published_at < $1
        ORDER BY published_at LIMIT $2 FOR UPDATE SKIP LOCKED))"""
_DELETE_INBOX = """
    DELETE FROM inbox WHERE ctid = ANY(ARRAY(
        SELECT ctid FROM inbox WHERE processed_at < $1
        ORDER BY processed_at LIMIT $2 FOR UPDATE SKIP LOCKED))"""
_DELETES = {"outbox": _DELETE_OUTBOX, "inbox": _DELETE_INBOX}
# The cutoff of a pass (the database's clock: published_at and processed_at are its now() too) and whether any row
# is older: an idle database is left untouched, its horizon included.
_DUE = {
    "outbox": """WITH c AS (SELECT now() - make_interval(secs => $1) AS before)
                 SELECT before, EXISTS (SELECT 1 FROM outbox WHERE published_at IS NOT NULL AND published_at < before)
                 FROM c""",
    "inbox": """WITH c AS (SELECT now() - make_interval(secs => $1) AS before)
                SELECT before, EXISTS (SELECT 1 FROM inbox WHERE processed_at < before) FROM c""",
}
_HORIZON = """
    INSERT INTO store_retention (what, pruned_before) VALUES ($1, $2)
    ON CONFLICT (what) DO UPDATE SET pruned_before = GREATEST(store_retention.pruned_before, EXCLUDED.pruned_before)"""


@dataclass(frozen=True, slots=True)
class Pruned:
    outbox: int
    inbox: int
    outbox_before: datetime
    inbox_before: datetime


class Pruner:
    """Deletes old published outbox rows and old inbox rows of one service's database, every `interval_s`."""

    def __init__(self, pool: asyncpg.Pool, service: str, *, outbox_retention_s: float = DEFAULT_OUTBOX_RETENTION_S,
                 inbox_retention_s: float, interval_s: float = DEFAULT_INTERVAL_S, batch: int = DEFAULT_BATCH,
                 pause_s: float = 0.05) -> None:
        if outbox_retention_s <= 0 or inbox_retention_s <= 0 or interval_s <= 0 or not 0 < batch <= 50_000:
            raise ValueError("retention periods and interval must be positive and the batch 1..50000 rows")
        self.pool = pool
        self.service = service
        self.outbox_retention_s = outbox_retention_s
        self.inbox_retention_s = inbox_retention_s
        self.interval_s = interval_s
        self.batch = batch
        self.pause_s = pause_s
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        self._task = asyncio.create_task(self._run(), name=f"store-retention:{self.service}")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self._task

    async def _run(self) -> None:
        while True:
            try:
                await self.prune_once()
            except Exception as exc:  # the database is away: the next interval tries again, nothing is lost
                log.warning("retention_failed", extra={"service": self.service, "error": repr(exc)})
            await asyncio.sleep(self.interval_s)

    async def prune_once(self) -> Pruned:
        """One pass over both tables; returns how many rows went and each cutoff (the database's now() minus the
        retention)."""
        outbox, outbox_before = await self._prune("outbox", self.outbox_retention_s)
        inbox, inbox_before = await self._prune("inbox", self.inbox_retention_s)
        if outbox or inbox:
            log.info("retention_pruned", extra={"service": self.service, "outbox_rows": outbox, "inbox_rows": inbox,
                                                "outbox_before": outbox_before.isoformat(),
                                                "inbox_before": inbox_before.isoformat()})
        return Pruned(outbox, inbox, outbox_before, inbox_before)

    async def _prune(self, table: str, retention_s: float) -> tuple[int, datetime]:
        """The horizon is committed before the first delete it allows (and never moves back), then rows older than
        the cutoff go batch by batch."""
        async with self.pool.acquire() as conn:
            before, due = await conn.fetchrow(_DUE[table], float(retention_s))
            if due:
                await conn.execute(_HORIZON, table, before)
        return (await self._delete(table, before) if due else 0), before

    async def delete_batch(self, table: str, before: datetime) -> int:
        """One statement: at most `batch` rows of `table` older than `before`, skipping rows others hold locked."""
        async with self.pool.acquire() as conn:
            status = await conn.execute(_DELETES[table], before, self.batch)
        n = int(status.rsplit(" ", 1)[-1])
        if n:
            STORE_PRUNED.labels(service=self.service, table=table).inc(n)
        return n

    async def _delete(self, table: str, before: datetime) -> int:
        total = 0
        while True:
            n = await self.delete_batch(table, before)
            total += n
            if n < self.batch:
                return total
            await asyncio.sleep(self.pause_s)  # let the job path have the table between batches
