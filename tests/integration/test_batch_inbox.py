"""The inbox of a batch (libs/store/unit_of_work.py), on a real NATS JetStream and PostgreSQL: a batched consumer's
applied-once events record their inbox rows in one statement for the whole batch, and each event is still applied
exactly once: a redelivered batch changes nothing, a message whose unit of work rolls back (or that opens none, or
that is refused) leaves no inbox row, and events published without their id as Nats-Msg-Id record their own."""

from __future__ import annotations

import functools
from collections.abc import AsyncIterator
from datetime import UTC, datetime
from pathlib import Path
from types import TracebackType
from typing import Any

import asyncpg
import pytest
from nats.aio.client import Client as NATS
from nats.js import JetStreamContext
from waiting import eventually

from libs.bus.connection import connect, ensure_streams
from libs.bus.consumer import ConsumerSpec, EventConsumer, Poison
from libs.bus.publisher import publish_raw
from libs.contracts import subjects
from libs.contracts.envelope import CloudEvent
from libs.contracts.events import EventData, JobSubmitted
from libs.contracts.subjects import EVENTS_STREAM
from libs.runtime.routes import Routes, once
from libs.store.database import create_pool
from libs.store.migrations import load_migrations, migrate, store_migrations
from libs.store.outbox_relay import OutboxRelay
from libs.store.unit_of_work import BatchTransaction, UnitOfWork

pytestmark = pytest.mark.integration

CONSUMER = "batch-inbox"


def job(job_id: str) -> JobSubmitted:
    return JobSubmitted(job_id=job_id, name="train", team="ml", project="default", kind="training",
                        priority_class="normal", priority=500, gpus=1, submitted_at=datetime.now(UTC))


@pytest.fixture
async def db(pg_database: str, tmp_path: Path) -> AsyncIterator[asyncpg.Pool]:
    pool = await create_pool(pg_database, min_size=1, max_size=6)
    (tmp_path / "app").mkdir()
    (tmp_path / "app" / "0001_effects.sql").write_text(
        "CREATE TABLE effects (n BIGSERIAL PRIMARY KEY, event_id TEXT NOT NULL, job_id TEXT NOT NULL);")
    await migrate(pool, store_migrations() + load_migrations("app", tmp_path / "app"))
    try:
        yield pool
    finally:
        await pool.close()


@pytest.fixture
async def js(nats_url: str, clean_jetstream: None) -> AsyncIterator[JetStreamContext]:
    nc: NATS = await connect(nats_url, "test-batch-inbox")
    jsc = nc.jetstream()
    await ensure_streams(jsc)
    try:
        yield jsc
    finally:
        await nc.close()


class Watched(BatchTransaction):
    """The real batch transaction, keeping every statement its connection ran (from the batch's start on: the logger
    stays on the connection, which lives as long as the test's pool) and whether it committed."""
    statements: list[str] = []
    commits = 0
    fail_commit_once = False

    async def __aenter__(self) -> BatchTransaction:
        batch = await super().__aenter__()
        self.conn.add_query_logger(self._log)
        return batch

    @staticmethod
    def _log(record: Any) -> None:
        Watched.statements.append(" ".join(record.query.split()))

    async def __aexit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                        tb: TracebackType | None) -> None:
        if exc_type is None and Watched.fail_commit_once:
            Watched.fail_commit_once = False
            await super().__aexit__(RuntimeError, RuntimeError("lost before commit"), None)
            raise RuntimeError("lost before commit")
        await super().__aexit__(exc_type, exc, tb)
        if exc_type is None:
            Watched.commits += 1


@pytest.fixture(autouse=True)
def _reset() -> None:
    Watched.statements, Watched.commits, Watched.fail_commit_once = [], 0, False


def routes(db: asyncpg.Pool, deliveries: list[str], *, poison: frozenset[str] = frozenset(),
           nothing: frozenset[str] = frozenset()) -> Routes:
    """Handlers as services write them: the effect in a unit of work, the inbox left to the route. A job in
    `poison` writes its effect and then raises Poison (its savepoint rolls back); one in `nothing` opens no unit
    of work."""
    async def handler(event: CloudEvent, data: EventData) -> None:
        assert isinstance(data, JobSubmitted)
        deliveries.append(data.job_id)
        if data.job_id in nothing:
            return
        async with UnitOfWork(db, "/gpupool/queue") as uow:
            await uow.conn.execute("INSERT INTO effects (event_id, job_id) VALUES ($1, $2)", event.id, data.job_id)
            if data.job_id in poison:
                raise Poison("BadJob", f"{data.job_id} can never apply")
    return Routes(inbox=CONSUMER, events={JobSubmitted: once(handler)})


def spec(**kw: Any) -> ConsumerSpec:
    base: dict[str, Any] = dict(max_deliver=5, ack_wait_s=2.0, batch=16, backoff_base_s=0.05, backoff_max_s=0.2)
    return ConsumerSpec(stream=EVENTS_STREAM.name, durable=CONSUMER, filter_subjects=(subjects.JOB_SUBMITTED,),
                        **(base | kw))


async def through_the_outbox(db: asyncpg.Pool, js: JetStreamContext, job_ids: list[str]) -> list[str]:
    """Emitted and relayed as services do (Nats-Msg-Id = event id), before the consumer starts: one batch."""
    async with UnitOfWork(db, "/gpupool/queue") as uow:
        ids = [(await uow.emit(job(j))).id for j in job_ids]
    await OutboxRelay(db, functools.partial(publish_raw, js), "test").publish_pending()
    return ids


async def consume(js: JetStreamContext, db: asyncpg.Pool, r: Routes, until: Any) -> None:
    consumer = EventConsumer(js, spec(), r.dispatch, transaction=lambda: Watched(db))

    async def settled() -> bool:
        info = await js.consumer_info(EVENTS_STREAM.name, CONSUMER)
        return info.num_pending == 0 and info.num_ack_pending == 0 and await until()
    await consumer.start()
    try:
        await eventually(settled, timeout=15, what="batch applied and acked")
    finally:
        await consumer.stop()


def inbox_statements() -> list[str]:
    return [s for s in Watched.statements if s.startswith(("INSERT INTO inbox", "DELETE FROM inbox"))]


async def inbox(db: asyncpg.Pool) -> set[str]:
    return {r["event_id"] for r in await db.fetch("SELECT event_id FROM inbox WHERE consumer = $1", CONSUMER)}


async def test_a_batch_records_its_inbox_rows_in_one_statement_and_applies_each_event_once(
        db: asyncpg.Pool, js: JetStreamContext) -> None:
    ids = await through_the_outbox(db, js, [f"j-{n}" for n in range(6)])
    deliveries: list[str] = []
    await consume(js, db, routes(db, deliveries), lambda: _true(len(deliveries) >= 6))
    assert Watched.commits == 1
    assert [s.split(" (")[0] for s in inbox_statements()] == ["INSERT INTO inbox"]  # one for the six events
    assert await inbox(db) == set(ids)
    assert [r["event_id"] for r in await db.fetch("SELECT event_id FROM effects ORDER BY n")] == ids


async def test_a_batch_redelivered_after_its_commit_was_lost_applies_nothing_twice(
        db: asyncpg.Pool, js: JetStreamContext) -> None:
    """The first attempt's batch rolls back at its end (the commit fails): nothing is acked, the whole batch comes
    back, and the second attempt applies each event once."""
    ids = await through_the_outbox(db, js, [f"j-{n}" for n in range(5)])
    Watched.fail_commit_once = True
    deliveries: list[str] = []
    await consume(js, db, routes(db, deliveries), lambda: _true(Watched.commits >= 1))
    assert len(deliveries) == 10  # every event handled in both attempts
    assert await inbox(db) == set(ids)
    assert sorted(r["event_id"] for r in await db.fetch("SELECT event_id FROM effects")) == sorted(ids)


async def test_events_already_in_the_inbox_are_skipped_without_their_handler_effects(
        db: asyncpg.Pool, js: JetStreamContext) -> None:
    ids = await through_the_outbox(db, js, [f"j-{n}" for n in range(4)])
    await db.execute("INSERT INTO inbox (consumer, event_id) VALUES ($1, $2), ($1, $3)", CONSUMER, ids[0], ids[2])
    deliveries: list[str] = []
    await consume(js, db, routes(db, deliveries), lambda: _true(len(deliveries) >= 4))
    assert sorted(r["event_id"] for r in await db.fetch("SELECT event_id FROM effects")) == sorted([ids[1], ids[3]])
    assert await inbox(db) == set(ids)


async def test_an_event_rolled_back_refused_or_with_nothing_to_apply_leaves_no_inbox_row(
        db: asyncpg.Pool, js: JetStreamContext) -> None:
    ids = await through_the_outbox(db, js, ["ok-1", "poison", "nothing", "ok-2"])
    await publish_raw(js, subjects.JOB_SUBMITTED, b"{not json", {"Nats-Msg-Id": "forged-id"})  # refused
    deliveries: list[str] = []
    r = routes(db, deliveries, poison=frozenset({"poison"}), nothing=frozenset({"nothing"}))
    await consume(js, db, r, lambda: _true(len(deliveries) >= 6))
    assert await inbox(db) == {ids[0], ids[3]}  # the poison's row rolled back with it; the others never held one
    assert sorted(r["job_id"] for r in await db.fetch("SELECT job_id FROM effects")) == ["ok-1", "ok-2"]
    # the first try, without savepoints, stopped at the poison and rolled back (its one INSERT with it); the second,
    # with a savepoint per event: one each for the whole batch
    assert deliveries == ["ok-1", "poison", "ok-1", "poison", "nothing", "ok-2"]
    assert [s.split(" ")[0] for s in inbox_statements()] == ["INSERT", "INSERT", "DELETE"]


async def test_events_whose_message_id_is_not_their_event_id_record_their_own_rows(
        db: asyncpg.Pool, js: JetStreamContext) -> None:
    events = [job(f"j-{n}").to_cloudevent("/gpupool/queue") for n in range(3)]
    for n, event in enumerate(events):
        await publish_raw(js, subjects.JOB_SUBMITTED, event.to_json(), {"Nats-Msg-Id": f"copy-{n}"})
    deliveries: list[str] = []
    await consume(js, db, routes(db, deliveries), lambda: _true(len(deliveries) >= 3))
    assert await inbox(db) == {e.id for e in events}
    assert len([s for s in inbox_statements() if s.startswith("INSERT INTO inbox (consumer, event_id) VALUES")]) == 3


async def _true(value: bool) -> bool:
    return value
