"""libs/store against a real PostgreSQL (and NATS for the relay and the inbox): migrations under an advisory lock,
the unit of work's all-or-nothing commit, the outbox relay's at-least-once publish deduplicated by JetStream, and
the inbox that makes a redelivered event apply once."""

from __future__ import annotations

import asyncio
import functools
from collections.abc import AsyncIterator, Awaitable, Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import asyncpg
import pytest
from nats.aio.client import Client as NATS
from nats.js import JetStreamContext
from opentelemetry import trace
from waiting import eventually

from libs.bus.connection import connect, ensure_streams
from libs.bus.consumer import ConsumerSpec, EventConsumer
from libs.bus.publisher import publish_raw
from libs.contracts import subjects
from libs.contracts.envelope import CloudEvent
from libs.contracts.events import EventData, JobSubmitted
from libs.contracts.subjects import EVENTS_STREAM
from libs.observability.tracing import setup_tracing
from libs.runtime.routes import Routes, once
from libs.store.database import create_pool
from libs.store.migrations import Migration, MigrationError, load_migrations, migrate, store_migrations
from libs.store.outbox_relay import OutboxRelay
from libs.store.unit_of_work import BatchTransaction, UnitOfWork, outbox_args, outbox_cte

pytestmark = pytest.mark.integration

APP_SQL = {
    "0001_widgets.sql": "CREATE TABLE widgets (id TEXT PRIMARY KEY, size INTEGER NOT NULL);",
    "0002_effects.sql": "CREATE TABLE effects (n BIGSERIAL PRIMARY KEY, event_id TEXT NOT NULL);",
}



def write_migrations(folder: Path, files: dict[str, str]) -> list[Migration]:
    folder.mkdir(parents=True, exist_ok=True)
    for name, sql in files.items():
        (folder / name).write_text(sql)
    return load_migrations("app", folder)


def job(job_id: str) -> JobSubmitted:
    return JobSubmitted(job_id=job_id, name="train", team="ml", project="default", kind="training",
                        priority_class="normal", priority=500, gpus=1, submitted_at=datetime.now(UTC))


@pytest.fixture
async def pool(pg_database: str) -> AsyncIterator[asyncpg.Pool]:
    p = await create_pool(pg_database, min_size=1, max_size=6)
    try:
        yield p
    finally:
        await p.close()


@pytest.fixture
async def db(pool: asyncpg.Pool, tmp_path: Path) -> asyncpg.Pool:
    """A migrated service database: the shared outbox/inbox plus two small app tables."""
    await migrate(pool, store_migrations() + write_migrations(tmp_path / "app", APP_SQL))
    return pool


@pytest.fixture
async def js(nats_url: str, clean_jetstream: None) -> AsyncIterator[JetStreamContext]:
    nc: NATS = await connect(nats_url, "test-store")
    jsc = nc.jetstream()
    await ensure_streams(jsc)
    try:
        yield jsc
    finally:
        await nc.close()


async def stream_messages(js: JetStreamContext) -> list[Any]:
    state = (await js.stream_info(EVENTS_STREAM.name)).state
    if not state.messages:
        return []
    return [await js.get_msg(EVENTS_STREAM.name, s) for s in range(state.first_seq, state.last_seq + 1)]


async def advisory_locks_held(pool: asyncpg.Pool) -> int:
    return await pool.fetchval("SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND granted")


# --- migrations ------------------------------------------------------------------------------------------------
async def test_migrations_apply_once_and_are_recorded(pool: asyncpg.Pool, tmp_path: Path) -> None:
    wanted = store_migrations() + write_migrations(tmp_path / "app", APP_SQL)
    applied = await migrate(pool, wanted)
    assert [(m.namespace, m.version) for m in applied] == [("store", 1), ("store", 2), ("app", 1), ("app", 2)]
    rows = await pool.fetch("SELECT namespace, version, name, checksum FROM schema_migrations "
                            "ORDER BY namespace DESC, version")
    assert [(r["namespace"], r["version"], r["name"], r["checksum"]) for r in rows] == [
        (m.namespace, m.version, m.name, m.checksum) for m in wanted]
    tables = {r["tablename"] for r in await pool.fetch("SELECT tablename FROM pg_tables WHERE schemaname='public'")}
    assert {"outbox", "inbox", "widgets", "effects", "schema_migrations"} <= tables

    assert await migrate(pool, wanted) == []
    assert await pool.fetchval("SELECT count(*) FROM schema_migrations") == len(wanted)


async def test_a_new_migration_is_applied_on_the_next_start(pool: asyncpg.Pool, tmp_path: Path) -> None:
    folder = tmp_path / "app"
    await migrate(pool, write_migrations(folder, {"0001_widgets.sql": APP_SQL["0001_widgets.sql"]}))
    later = write_migrations(folder, {"0002_color.sql": "ALTER TABLE widgets ADD COLUMN color TEXT;"})
    assert [m.version for m in await migrate(pool, later)] == [2]
    await pool.execute("INSERT INTO widgets (id, size, color) VALUES ('w', 1, 'red')")


async def test_an_edited_applied_migration_is_refused(pool: asyncpg.Pool, tmp_path: Path) -> None:
    folder = tmp_path / "app"
    await migrate(pool, write_migrations(folder, {"0001_widgets.sql": APP_SQL["0001_widgets.sql"]}))
    edited = write_migrations(folder, {
        "0001_widgets.sql": "CREATE TABLE widgets (id TEXT PRIMARY KEY, size BIGINT NOT NULL);",
        "0002_effects.sql": APP_SQL["0002_effects.sql"],
    })
    with pytest.raises(MigrationError, match="changed after it was applied"):
        await migrate(pool, edited)
    assert await pool.fetchval("SELECT to_regclass('effects')") is None  # nothing after the refusal ran
    assert await pool.fetchval("SELECT count(*) FROM schema_migrations") == 1
    assert await advisory_locks_held(pool) == 0


async def test_a_failing_migration_leaves_no_trace_and_can_be_fixed(pool: asyncpg.Pool, tmp_path: Path) -> None:
    folder = tmp_path / "app"
    broken = write_migrations(folder, {"0001_half.sql": "CREATE TABLE half (id INT); SELECT 1/0;"})
    with pytest.raises(asyncpg.DivisionByZeroError):
        await migrate(pool, broken)
    assert await pool.fetchval("SELECT to_regclass('half')") is None
    assert await pool.fetchval("SELECT count(*) FROM schema_migrations") == 0
    fixed = write_migrations(folder, {"0001_half.sql": "CREATE TABLE half (id INT);"})
    assert await advisory_locks_held(pool) == 0
    assert len(await asyncio.wait_for(migrate(pool, fixed), 10)) == 1


async def test_concurrent_migrate_calls_both_succeed_and_apply_each_file_once(
        pg_database: str, tmp_path: Path) -> None:
    files = {
        "0001_slow.sql": "SELECT pg_sleep(0.3); CREATE TABLE slow (id INT);",
        "0002_counter.sql": "CREATE TABLE counter (n INT); INSERT INTO counter VALUES (1);",
    }
    wanted = store_migrations() + write_migrations(tmp_path / "app", files)
    pools = [await create_pool(pg_database, max_size=2) for _ in range(3)]  # three "replicas" starting at once
    try:
        results = await asyncio.gather(*(migrate(p, wanted) for p in pools))
        applied = [(m.namespace, m.version) for r in results for m in r]
        assert sorted(applied) == sorted((m.namespace, m.version) for m in wanted)  # each exactly once
        assert await pools[0].fetchval("SELECT count(*) FROM schema_migrations") == len(wanted)
        assert await pools[0].fetchval("SELECT count(*) FROM counter") == 1
    finally:
        for p in pools:
            await p.close()


def test_migration_files_must_be_numbered_and_unique(tmp_path: Path) -> None:
    (tmp_path / "a").mkdir()
    (tmp_path / "a" / "init.sql").write_text("SELECT 1;")
    with pytest.raises(MigrationError, match="must start with a number"):
        load_migrations("x", tmp_path / "a")
    (tmp_path / "b").mkdir()
    (tmp_path / "b" / "0001_one.sql").write_text("SELECT 1;")
    (tmp_path / "b" / "001_two.sql").write_text("SELECT 2;")
    with pytest.raises(MigrationError, match="duplicate"):
        load_migrations("x", tmp_path / "b")


# --- unit of work ----------------------------------------------------------------------------------------------
async def test_a_unit_of_work_that_raises_rolls_back_the_state_change_and_its_outbox_row(db: asyncpg.Pool) -> None:
    commits: list[int] = []
    with pytest.raises(RuntimeError, match="boom"):
        async with UnitOfWork(db, "/gpupool/queue", on_commit=lambda: commits.append(1)) as uow:
            await uow.conn.execute("INSERT INTO widgets (id, size) VALUES ('w1', 1)")
            await uow.emit(job("j-1"))
            # outbox rows are written together when the unit of work ends, not one statement per emit
            assert await uow.conn.fetchval("SELECT count(*) FROM outbox") == 0
            raise RuntimeError("boom")
    assert await db.fetchval("SELECT count(*) FROM widgets") == 0
    assert await db.fetchval("SELECT count(*) FROM outbox") == 0
    assert commits == []


async def test_a_committed_unit_of_work_stores_the_state_change_and_the_event_together(db: asyncpg.Pool) -> None:
    commits: list[int] = []
    tracer_provider = setup_tracing("store-tests")
    assert tracer_provider is not None
    with trace.get_tracer("test").start_as_current_span("submit") as span:
        async with UnitOfWork(db, "/gpupool/queue", on_commit=lambda: commits.append(1)) as uow:
            await uow.conn.execute("INSERT INTO widgets (id, size) VALUES ('w1', 1)")
            event = await uow.emit(job("j-1"))
    assert commits == [1]
    assert [e.id for e in uow.emitted] == [event.id]
    row = await db.fetchrow("SELECT * FROM outbox")
    assert row["event_id"] == event.id and row["subject"] == subjects.JOB_SUBMITTED
    assert CloudEvent.model_validate_json(bytes(row["payload"])) == event
    assert event.source == "/gpupool/queue"
    trace_id = format(span.get_span_context().trace_id, "032x")
    assert row["traceparent"].split("-")[1] == trace_id == event.traceparent.split("-")[1]
    assert row["published_at"] is None
    assert await db.fetchval("SELECT count(*) FROM widgets") == 1


async def test_events_taken_by_a_statement_are_written_by_it_once_and_in_emit_order(db: asyncpg.Pool) -> None:
    """take_outbox(): a state change and the events announcing it in one statement; what is emitted after it is
    written at the end as usual, after them in the outbox's order (the relay's)."""
    commits: list[int] = []
    async with UnitOfWork(db, "/gpupool/queue", on_commit=lambda: commits.append(1)) as uow:
        first, second = await uow.emit(job("j-1")), await uow.emit(job("j-2"))
        await uow.conn.execute(f"WITH w AS (INSERT INTO widgets (id, size) VALUES ('w1', 1)), o AS ({outbox_cte(1)}) "
                               "SELECT 1", *outbox_args(uow.take_outbox()))
        assert await uow.conn.fetchval("SELECT count(*) FROM outbox") == 2  # with the widget, in its statement
        assert uow.take_outbox() == []  # taken once
        third = await uow.emit(job("j-3"))
    rows = await db.fetch("SELECT event_id FROM outbox ORDER BY seq")
    assert [r["event_id"] for r in rows] == [first.id, second.id, third.id]
    assert commits == [1] and await db.fetchval("SELECT count(*) FROM widgets") == 1


async def test_a_unit_of_work_that_emits_nothing_does_not_wake_the_relay(db: asyncpg.Pool) -> None:
    commits: list[int] = []
    async with UnitOfWork(db, "/gpupool/queue", on_commit=lambda: commits.append(1)) as uow:
        await uow.conn.execute("INSERT INTO widgets (id, size) VALUES ('w1', 1)")
    assert commits == []


async def test_inbox_first_time_is_false_for_a_repeated_consumer_and_event(db: asyncpg.Pool) -> None:
    async with UnitOfWork(db, "/gpupool/queue") as uow:
        assert await uow.first_time("placement", "e-1") is True
    async with UnitOfWork(db, "/gpupool/queue") as uow:
        assert await uow.first_time("placement", "e-1") is False
        assert await uow.first_time("accounting", "e-1") is True  # each consumer keeps its own inbox
        assert await uow.first_time("placement", "e-2") is True
    with pytest.raises(RuntimeError):
        async with UnitOfWork(db, "/gpupool/queue") as uow:
            assert await uow.first_time("placement", "e-3") is True
            raise RuntimeError("handler failed")
    async with UnitOfWork(db, "/gpupool/queue") as uow:  # a rolled-back handling did not mark the event seen
        assert await uow.first_time("placement", "e-3") is True


# --- outbox relay ----------------------------------------------------------------------------------------------
async def test_relay_publishes_committed_rows_in_order_with_the_event_id_as_msg_id(
        db: asyncpg.Pool, js: JetStreamContext) -> None:
    ids = []
    for n in range(5):
        async with UnitOfWork(db, "/gpupool/queue") as uow:
            ids.append((await uow.emit(job(f"j-{n}"))).id)
    relay = OutboxRelay(db, functools.partial(publish_raw, js), "test", batch=2)
    assert await relay.pending_count() == 5
    sent = [await relay.publish_pending() for _ in range(4)]
    assert sent == [2, 2, 1, 0]
    msgs = await stream_messages(js)
    assert [m.headers["Nats-Msg-Id"] for m in msgs] == ids
    assert [CloudEvent.model_validate_json(m.data).id for m in msgs] == ids
    assert all(m.subject == subjects.JOB_SUBMITTED for m in msgs)
    assert await db.fetchval("SELECT count(*) FROM outbox WHERE published_at IS NULL") == 0
    assert await relay.pending_count() == 0


async def test_relay_running_in_the_background_publishes_soon_after_commit(
        db: asyncpg.Pool, js: JetStreamContext) -> None:
    relay = OutboxRelay(db, functools.partial(publish_raw, js), "test", poll_interval_s=30)
    relay.start()
    try:
        async with UnitOfWork(db, "/gpupool/queue", on_commit=relay.wake) as uow:
            event = await uow.emit(job("j-1"))
        # poll_interval is 30 s: only the commit's wake-up can make this fast
        await eventually(lambda: _stream_count(js, 1), timeout=3, what="relay woken by commit")
    finally:
        await asyncio.wait_for(relay.stop(), 5)
    [msg] = await stream_messages(js)
    assert msg.headers["Nats-Msg-Id"] == event.id



async def test_relay_holds_no_transaction_while_it_publishes_and_replicas_take_turns(
        db: asyncpg.Pool, js: JetStreamContext) -> None:
    """A transaction open across the publish would hold back every snapshot's xmin in the cluster (placement reads
    again everything changed since the oldest open transaction); a second relay of the same database waits its
    turn instead of publishing the same rows."""
    for n in range(3):
        async with UnitOfWork(db, "/gpupool/queue") as uow:
            await uow.emit(job(f"j-{n}"))
    seen: dict[str, object] = {}
    other = OutboxRelay(db, functools.partial(publish_raw, js), "test-replica")

    async def publish_and_look(subject: str, payload: bytes, headers: dict[str, str]):  # type: ignore[no-untyped-def]
        if not seen:
            seen["open"] = await db.fetchval(
                """SELECT count(*) FROM pg_stat_activity WHERE datname = current_database()
                   AND pid <> pg_backend_pid() AND backend_xid IS NOT NULL""")
            seen["replica_sent"] = await other.publish_pending()  # the lock is held: it waits its turn
        return await publish_raw(js, subject, payload, headers)

    relay = OutboxRelay(db, publish_and_look, "test")
    assert await relay.publish_pending() == 3
    assert seen == {"open": 0, "replica_sent": 0}
    assert len(await stream_messages(js)) == 3  # each once
    assert await other.publish_pending() == 0 and await relay.pending_count() == 0

async def _stream_count(js: JetStreamContext, n: int) -> bool:
    return (await js.stream_info(EVENTS_STREAM.name)).state.messages == n


async def test_relay_crash_after_publish_before_marking_does_not_duplicate_the_stream_message(
        db: asyncpg.Pool, js: JetStreamContext) -> None:
    async with UnitOfWork(db, "/gpupool/queue") as uow:
        event = await uow.emit(job("j-1"))
    row = await db.fetchrow("SELECT subject, payload FROM outbox WHERE event_id = $1", event.id)
    # the "crashed" relay published the row but never marked it
    first = await publish_raw(js, row["subject"], bytes(row["payload"]), {"Nats-Msg-Id": event.id})
    relay = OutboxRelay(db, functools.partial(publish_raw, js), "test")
    assert await relay.publish_pending() == 1  # the restarted relay republishes...
    msgs = await stream_messages(js)
    assert len(msgs) == 1 and msgs[0].seq == first.seq  # ...and JetStream drops the copy
    assert await db.fetchval("SELECT published_at IS NOT NULL FROM outbox WHERE event_id = $1", event.id)


async def test_relay_failure_marks_what_was_sent_and_records_the_error_on_the_failing_row(
        db: asyncpg.Pool, js: JetStreamContext) -> None:
    ids = []
    for n in range(3):
        async with UnitOfWork(db, "/gpupool/queue") as uow:
            ids.append((await uow.emit(job(f"j-{n}"))).id)
    calls = 0

    async def flaky_publish(subject: str, payload: bytes, headers: dict[str, str]) -> Any:
        nonlocal calls
        calls += 1
        if calls == 2:
            raise ConnectionError("nats went away")
        return await publish_raw(js, subject, payload, headers)

    relay = OutboxRelay(db, flaky_publish, "test")
    with pytest.raises(ConnectionError):
        await relay.publish_pending()
    rows = await db.fetch("SELECT event_id, published_at, attempts, last_error FROM outbox ORDER BY seq")
    assert rows[0]["published_at"] is not None  # sent before the failure: not sent again
    assert rows[1]["published_at"] is None and rows[1]["attempts"] == 1
    assert "nats went away" in rows[1]["last_error"]
    assert rows[2]["published_at"] is None and rows[2]["attempts"] == 0  # order kept: nothing after the failure
    assert await relay.publish_pending() == 2
    assert [m.headers["Nats-Msg-Id"] for m in await stream_messages(js)] == ids


# --- inbox + consumer: redelivery after a crash before ack ----------------------------------------------------
def _spec(durable: str, **kw: Any) -> ConsumerSpec:
    base: dict[str, Any] = dict(max_deliver=5, ack_wait_s=1.0, batch=4, backoff_base_s=0.05, backoff_max_s=0.2)
    base.update(kw)
    return ConsumerSpec(stream=EVENTS_STREAM.name, durable=durable, filter_subjects=(subjects.JOB_SUBMITTED,),
                        **base)


def _idempotent_handler(db: asyncpg.Pool, durable: str, after_commit: Callable[[int], Awaitable[None]],
                        deliveries: list[str]) -> Callable[[CloudEvent, EventData], Awaitable[None]]:
    async def handler(event: CloudEvent, data: EventData) -> None:
        deliveries.append(event.id)
        async with UnitOfWork(db, "/gpupool/queue") as uow:
            if await uow.first_time(durable, event.id):
                await uow.conn.execute("INSERT INTO effects (event_id) VALUES ($1)", event.id)
        await after_commit(len(deliveries))

    return handler


async def _acked(js: JetStreamContext, durable: str) -> bool:
    info = await js.consumer_info(EVENTS_STREAM.name, durable)
    return info.num_pending == 0 and info.num_ack_pending == 0


async def _emit_and_wait_for_redelivery(db: asyncpg.Pool, js: JetStreamContext, durable: str, handler,  # type: ignore[no-untyped-def]
                                        deliveries: list[str]):
    """One job.submitted through the outbox to a consumer `durable` running `handler`; waits until it was delivered
    twice (the handler fails the first time after its commit) and acked. Returns the event."""
    consumer = EventConsumer(js, _spec(durable), handler)
    await consumer.start()
    try:
        async with UnitOfWork(db, "/gpupool/queue") as uow:
            event = await uow.emit(job("j-1"))
        await OutboxRelay(db, functools.partial(publish_raw, js), "test").publish_pending()
        await eventually(lambda: len(deliveries) >= 2 and _acked(js, durable), what="redelivered and acked")
    finally:
        await consumer.stop()
    return event


async def test_redelivery_after_a_crash_before_ack_is_applied_once(db: asyncpg.Pool, js: JetStreamContext) -> None:
    """The handler commits its effect + inbox row, then fails before the ack: the redelivery is a no-op."""
    deliveries: list[str] = []

    async def crash_first_time(n: int) -> None:
        if n == 1:
            raise RuntimeError("process died between commit and ack")

    event = await _emit_and_wait_for_redelivery(
        db, js, "applier", _idempotent_handler(db, "applier", crash_first_time, deliveries), deliveries)
    assert deliveries == [event.id, event.id]
    assert await db.fetchval("SELECT count(*) FROM effects WHERE event_id = $1", event.id) == 1
    assert await db.fetchval("SELECT count(*) FROM inbox WHERE consumer = 'applier'") == 1


async def test_redelivery_to_a_new_process_after_one_died_before_ack_is_applied_once(
        db: asyncpg.Pool, js: JetStreamContext, nats_url: str) -> None:
    """A consumer process dies mid-handling (after its commit, no ack, no nak): once ack_wait passes the next
    process with the same durable gets the event again and its inbox turns it into a no-op."""
    deliveries: list[str] = []
    committed, hang = asyncio.Event(), asyncio.Event()

    async def die_after_commit(n: int) -> None:
        if n == 1:
            committed.set()
            await hang.wait()  # never set: the process is killed here

    doomed_nc = await connect(nats_url, "doomed")
    doomed = EventConsumer(doomed_nc.jetstream(), _spec("survivor"),
                           _idempotent_handler(db, "survivor", die_after_commit, deliveries))
    await doomed.start()
    async with UnitOfWork(db, "/gpupool/queue") as uow:
        event = await uow.emit(job("j-1"))
    await OutboxRelay(db, functools.partial(publish_raw, js), "test").publish_pending()
    await asyncio.wait_for(committed.wait(), 5)
    assert doomed._task is not None
    doomed._task.cancel()  # SIGKILL: no ack, no nak, no graceful stop
    await doomed_nc.close()

    async def fine(n: int) -> None:
        return None

    successor = EventConsumer(js, _spec("survivor"), _idempotent_handler(db, "survivor", fine, deliveries))
    await successor.start()
    try:
        await eventually(lambda: len(deliveries) >= 2 and _acked(js, "survivor"), what="redelivery to successor")
    finally:
        await successor.stop()
    assert deliveries == [event.id, event.id]
    assert await db.fetchval("SELECT count(*) FROM effects") == 1


# --- routes declared applied once: the dispatch does the inbox check, the handler does not ---------------------
def _applied_once_routes(db: asyncpg.Pool, durable: str, after_commit: Callable[[int], Awaitable[None]],
                         deliveries: list[str]) -> Routes:
    """A handler as services write them now: its effect in a unit of work, no inbox check of its own."""
    async def handler(event: CloudEvent, data: EventData) -> None:
        deliveries.append(event.id)
        async with UnitOfWork(db, "/gpupool/queue") as uow:
            await uow.conn.execute("INSERT INTO effects (event_id) VALUES ($1)", event.id)
        await after_commit(len(deliveries))

    return Routes(inbox=durable, events={JobSubmitted: once(handler)})


async def test_an_applied_once_route_skips_the_redelivery_after_a_crash_before_ack(
        db: asyncpg.Pool, js: JetStreamContext) -> None:
    """The handler commits its effect (and, with it, the inbox row the dispatch added), then fails before the ack:
    the redelivery stops at the handler's unit of work and is acked without a second effect."""
    deliveries: list[str] = []

    async def crash_first_time(n: int) -> None:
        if n == 1:
            raise RuntimeError("process died between commit and ack")

    routes = _applied_once_routes(db, "routed", crash_first_time, deliveries)
    event = await _emit_and_wait_for_redelivery(db, js, "routed", routes.dispatch, deliveries)
    assert deliveries == [event.id, event.id]
    assert await db.fetchval("SELECT count(*) FROM effects WHERE event_id = $1", event.id) == 1
    assert [tuple(r) for r in await db.fetch("SELECT consumer, event_id FROM inbox")] == [("routed", event.id)]


async def test_an_applied_once_route_in_a_batch_transaction_applies_a_duplicate_in_the_same_batch_once(
        db: asyncpg.Pool, js: JetStreamContext) -> None:
    """The same event stored twice (a republish after the stream's duplicate window) lands in one fetched batch:
    the second's savepoint finds the first's uncommitted inbox row, rolls back alone, and both are acked."""
    deliveries: list[str] = []

    async def fine(n: int) -> None:
        return None

    routes = _applied_once_routes(db, "routed-batch", fine, deliveries)
    consumer = EventConsumer(js, _spec("routed-batch"), routes.dispatch, transaction=lambda: BatchTransaction(db))
    one, other = job("j-1").to_cloudevent("/gpupool/queue"), job("j-2").to_cloudevent("/gpupool/queue")
    for n, event in enumerate((one, one, other)):
        await publish_raw(js, subjects.JOB_SUBMITTED, event.to_json(), {"Nats-Msg-Id": f"copy-{n}"})
    await consumer.start()
    try:
        await eventually(lambda: len(deliveries) >= 3 and _acked(js, "routed-batch"), what="batch applied, acked")
    finally:
        await consumer.stop()
    assert deliveries == [one.id, one.id, other.id]
    assert sorted(r["event_id"] for r in await db.fetch("SELECT event_id FROM effects")) == sorted([one.id, other.id])
    assert await db.fetchval("SELECT count(*) FROM inbox WHERE consumer = 'routed-batch'") == 2
