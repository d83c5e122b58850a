"""Retention of the shared outbox and inbox (libs/store/retention.py) against a real PostgreSQL: published rows older
than the outbox retention and inbox rows older than the inbox retention are deleted, in batches that never wait on
rows the job path holds; unpublished rows (whatever their age) and recent rows stay; the horizon is recorded first.
Ages are injected by moving timestamps into the past, never by sleeping."""

from __future__ import annotations

import asyncio
import sys
import uuid
from collections.abc import AsyncIterator, Iterator
from datetime import timedelta
from pathlib import Path

import asyncpg
import pytest
from waiting import eventually

from libs.observability.metrics import STORE_PRUNED
from libs.runtime.service import ServiceRuntime
from libs.runtime.settings import ServiceSettings
from libs.store.database import create_pool
from libs.store.migrations import migrate, store_migrations
from libs.store.retention import Pruner

pytestmark = pytest.mark.integration

DAY = 24 * 3600.0


@pytest.fixture
async def pool(pg_database: str) -> AsyncIterator[asyncpg.Pool]:
    p = await create_pool(pg_database, min_size=1, max_size=4)
    try:
        await migrate(p, store_migrations())
        yield p
    finally:
        await p.close()


async def add_outbox(pool: asyncpg.Pool, n: int, *, published_days_ago: float | None,
                     created_days_ago: float = 0.0) -> list[str]:
    """n outbox rows created `created_days_ago` and published `published_days_ago` (None: not yet published)."""
    ids = [f"evt-{uuid.uuid4().hex}" for _ in range(n)]
    await pool.executemany(
        """INSERT INTO outbox (event_id, subject, payload, created_at, published_at)
           VALUES ($1, 'gpupool.test.retention', '{}'::bytea, now() - make_interval(secs => $2),
                   CASE WHEN $3::float8 IS NULL THEN NULL ELSE now() - make_interval(secs => $3) END)""",
        [(i, created_days_ago * DAY, None if published_days_ago is None else published_days_ago * DAY)
         for i in ids])
    return ids


async def add_inbox(pool: asyncpg.Pool, n: int, *, days_ago: float) -> list[str]:
    ids = [f"evt-{uuid.uuid4().hex}" for _ in range(n)]
    await pool.executemany(
        "INSERT INTO inbox (consumer, event_id, processed_at) VALUES ('c1', $1, now() - make_interval(secs => $2))",
        [(i, days_ago * DAY) for i in ids])
    return ids


async def present(pool: asyncpg.Pool, table: str, ids: list[str]) -> set[str]:
    rows = await pool.fetch(f"SELECT event_id FROM {table} WHERE event_id = ANY($1::text[])", ids)
    return {r["event_id"] for r in rows}


def pruned_metric(table: str) -> float:
    return STORE_PRUNED.labels(service="retention-test", table=table)._value.get()


async def test_prunes_old_published_and_old_inbox_rows_keeps_the_rest(pool: asyncpg.Pool) -> None:
    old_published = await add_outbox(pool, 12, published_days_ago=8, created_days_ago=8)
    old_unpublished = await add_outbox(pool, 3, published_days_ago=None, created_days_ago=60)
    recent_published = await add_outbox(pool, 4, published_days_ago=6.9, created_days_ago=6.9)
    fresh_unpublished = await add_outbox(pool, 2, published_days_ago=None)
    old_inbox = await add_inbox(pool, 7, days_ago=31)
    recent_inbox = await add_inbox(pool, 5, days_ago=29)
    before_outbox, before_inbox = pruned_metric("outbox"), pruned_metric("inbox")

    pruner = Pruner(pool, "retention-test", outbox_retention_s=7 * DAY, inbox_retention_s=30 * DAY, batch=5,
                    pause_s=0)
    result = await pruner.prune_once()

    assert (result.outbox, result.inbox) == (12, 7)
    assert await present(pool, "outbox", old_published) == set()
    assert await present(pool, "outbox", old_unpublished) == set(old_unpublished)  # never, whatever its age
    assert await present(pool, "outbox", recent_published) == set(recent_published)
    assert await present(pool, "outbox", fresh_unpublished) == set(fresh_unpublished)
    assert await present(pool, "inbox", old_inbox) == set()
    assert await present(pool, "inbox", recent_inbox) == set(recent_inbox)
    assert pruned_metric("outbox") - before_outbox == 12
    assert pruned_metric("inbox") - before_inbox == 7

    # the horizon each pass allowed is recorded (and is the database's now() minus the retention)
    horizons = {r["what"]: r for r in await pool.fetch(
        "SELECT what, pruned_before, now() - pruned_before AS age FROM store_retention")}
    assert horizons["outbox"]["pruned_before"] == result.outbox_before
    assert abs(horizons["outbox"]["age"] - timedelta(days=7)) < timedelta(minutes=1)
    assert abs(horizons["inbox"]["age"] - timedelta(days=30)) < timedelta(minutes=1)

    # a second pass finds nothing more and keeps what it kept
    again = await pruner.prune_once()
    assert (again.outbox, again.inbox) == (0, 0)
    assert await present(pool, "outbox", recent_published + old_unpublished) == set(recent_published
                                                                                    + old_unpublished)


async def test_one_statement_deletes_at_most_a_batch(pool: asyncpg.Pool) -> None:
    old = await add_outbox(pool, 11, published_days_ago=10, created_days_ago=10)
    await add_inbox(pool, 4, days_ago=40)
    pruner = Pruner(pool, "retention-test", outbox_retention_s=7 * DAY, inbox_retention_s=30 * DAY, batch=4,
                    pause_s=0)
    before = await pool.fetchval("SELECT now() - interval '7 days'")
    assert await pruner.delete_batch("outbox", before) == 4
    assert len(await present(pool, "outbox", old)) == 7
    assert await pruner.delete_batch("outbox", before) == 4
    assert len(await present(pool, "outbox", old)) == 3
    # the whole pass still gets everything, batch by batch
    result = await pruner.prune_once()
    assert (result.outbox, result.inbox) == (3, 4)


async def test_rows_held_by_another_transaction_are_skipped_not_waited_for(pool: asyncpg.Pool) -> None:
    old = await add_outbox(pool, 6, published_days_ago=9, created_days_ago=9)
    pruner = Pruner(pool, "retention-test", outbox_retention_s=7 * DAY, inbox_retention_s=30 * DAY, batch=100,
                    pause_s=0)
    async with pool.acquire() as holder, holder.transaction():
        await holder.execute("SELECT 1 FROM outbox WHERE event_id = $1 FOR UPDATE", old[0])
        result = await asyncio.wait_for(pruner.prune_once(), timeout=10)
        assert result.outbox == 5
    assert await present(pool, "outbox", old) == {old[0]}
    assert (await pruner.prune_once()).outbox == 1  # released: the next pass takes it


async def test_horizon_is_written_only_when_rows_are_due_and_never_moves_back(pool: asyncpg.Pool) -> None:
    """An idle database is left untouched; a retention raised later cannot bring pruned rows back, so the recorded
    horizon keeps the furthest cutoff."""
    recent = await add_outbox(pool, 2, published_days_ago=0.5, created_days_ago=0.5)
    await Pruner(pool, "retention-test", outbox_retention_s=7 * DAY, inbox_retention_s=30 * DAY).prune_once()
    assert await pool.fetchval("SELECT count(*) FROM store_retention") == 0
    await add_inbox(pool, 1, days_ago=45)
    first = await Pruner(pool, "retention-test", outbox_retention_s=0.25 * DAY,
                         inbox_retention_s=30 * DAY).prune_once()
    assert (first.outbox, first.inbox) == (2, 1)
    assert await present(pool, "outbox", recent) == set()
    await add_outbox(pool, 1, published_days_ago=10, created_days_ago=10)
    await add_inbox(pool, 1, days_ago=50)
    second = await Pruner(pool, "retention-test", outbox_retention_s=7 * DAY, inbox_retention_s=40 * DAY).prune_once()
    assert (second.outbox, second.inbox) == (1, 1)
    horizons = {r["what"]: r["pruned_before"] for r in await pool.fetch("SELECT * FROM store_retention")}
    assert horizons == {"outbox": first.outbox_before, "inbox": first.inbox_before}
    assert second.outbox_before < first.outbox_before and second.inbox_before < first.inbox_before


def test_refuses_nonsense_settings() -> None:
    with pytest.raises(ValueError):
        Pruner(None, "x", outbox_retention_s=0, inbox_retention_s=DAY)  # type: ignore[arg-type]
    with pytest.raises(ValueError):
        Pruner(None, "x", inbox_retention_s=DAY, batch=0)  # type: ignore[arg-type]


@pytest.fixture
def empty_migrations_package(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    package = f"ret_pkg_{uuid.uuid4().hex[:8]}"
    (tmp_path / "src" / package / "migrations").mkdir(parents=True)
    (tmp_path / "src" / package / "__init__.py").write_text("")
    monkeypatch.syspath_prepend(str(tmp_path / "src"))
    yield package
    sys.modules.pop(package, None)


@pytest.mark.usefixtures("keep_test_logging_and_tracing", "clean_jetstream")
async def test_every_service_runtime_prunes_in_the_background(nats_url: str, fresh_database_dsn: str,
                                                              empty_migrations_package: str) -> None:
    settings = ServiceSettings(nats_url=nats_url, database_url=fresh_database_dsn, http_port=0, log_level="WARNING",
                               instance="retention-1", outbox_retention_s=3600, retention_interval_s=0.1)
    rt = ServiceRuntime("rettest", settings, migrations_package=empty_migrations_package)
    await rt.start()
    try:
        assert rt.pool is not None
        old = await add_outbox(rt.pool, 3, published_days_ago=1, created_days_ago=1)  # older than its hour
        kept = await add_outbox(rt.pool, 2, published_days_ago=0.01, created_days_ago=1)  # within it
        await eventually(lambda: _gone(rt.pool, old), timeout=15, what="the runtime's pruner deleting old rows")
        assert await present(rt.pool, "outbox", kept) == set(kept)
    finally:
        await rt.shutdown()


async def _gone(pool: asyncpg.Pool, ids: list[str]) -> bool:
    return not await present(pool, "outbox", ids)
