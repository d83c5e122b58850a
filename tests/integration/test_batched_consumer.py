"""Batched consumer transactions and the pipelined outbox relay, on a real NATS JetStream and PostgreSQL: a fetched
batch applies in one transaction with a savepoint per message, poison rolls back only itself, nothing is acked
unless the batch committed, redelivery after that is a no-op, and pipelined publishing keeps commit order."""

from __future__ import annotations

import asyncio
import functools
from collections.abc import AsyncIterator, Awaitable, Callable
from datetime import UTC, datetime
from pathlib import Path
from types import TracebackType
from typing import Any

import asyncpg
import pytest
from nats.aio.client import Client as NATS
from nats.js import JetStreamContext
from nats.js.errors import NoStreamResponseError
from waiting import eventually

from libs.bus.connection import connect, ensure_streams
from libs.bus.consumer import MAX_MESSAGES_PER_TRANSACTION, ConsumerSpec, EventConsumer, Poison
from libs.bus.publisher import publish_event, publish_raw, publish_raw_batch
from libs.contracts import subjects
from libs.contracts.envelope import CloudEvent
from libs.contracts.events import EventData, JobSubmitted
from libs.contracts.subjects import DLQ_STREAM, EVENTS_STREAM
from libs.store.database import create_pool
from libs.store.migrations import load_migrations, migrate, store_migrations
from libs.store.outbox_relay import OutboxRelay
from libs.store.unit_of_work import BatchTransaction, UnitOfWork

pytestmark = pytest.mark.integration

APP_SQL = """
CREATE TABLE effects (n BIGSERIAL PRIMARY KEY, event_id TEXT NOT NULL, job_id TEXT NOT NULL, txid BIGINT NOT NULL);
-- checked only at COMMIT: lets a test make the batch's commit itself fail
CREATE TABLE commit_guard (v INTEGER, CONSTRAINT commit_guard_v UNIQUE (v) DEFERRABLE INITIALLY DEFERRED);
"""


def job(job_id: str) -> JobSubmitted:
    return JobSubmitted(job_id=job_id, name="train", team="ml", project="default", kind="training",
                        priority_class="normal", priority=500, gpus=1, submitted_at=datetime.now(UTC))


@pytest.fixture
async def db(pg_database: str, tmp_path: Path) -> AsyncIterator[asyncpg.Pool]:
    pool = await create_pool(pg_database, min_size=1, max_size=6)
    (tmp_path / "app").mkdir()
    (tmp_path / "app" / "0001_effects.sql").write_text(APP_SQL)
    await migrate(pool, store_migrations() + load_migrations("app", tmp_path / "app"))
    try:
        yield pool
    finally:
        await pool.close()


@pytest.fixture
async def js(nats_url: str, clean_jetstream: None) -> AsyncIterator[JetStreamContext]:
    nc: NATS = await connect(nats_url, "test-batched")
    jsc = nc.jetstream()
    await ensure_streams(jsc)
    try:
        yield jsc
    finally:
        await nc.close()


def spec(durable: str, **kw: Any) -> ConsumerSpec:
    base: dict[str, Any] = dict(max_deliver=5, ack_wait_s=5.0, batch=16, backoff_base_s=0.05, backoff_max_s=0.2)
    base.update(kw)
    return ConsumerSpec(stream=EVENTS_STREAM.name, durable=durable, filter_subjects=(subjects.JOB_SUBMITTED,),
                        **base)


async def publish_jobs(js: JetStreamContext, job_ids: list[str]) -> list[str]:
    """Published before the consumer starts, so its first fetch gets them all as one batch."""
    ids = []
    for job_id in job_ids:
        event = job(job_id).to_cloudevent("/gpupool/queue")
        await publish_event(js, subjects.JOB_SUBMITTED, event)
        ids.append(event.id)
    return ids


def applier(db: asyncpg.Pool, durable: str, *, poison: set[str] = frozenset(),  # type: ignore[assignment]
            before_effect: Callable[[UnitOfWork, JobSubmitted], Awaitable[None]] | None = None,
            seen: list[str] | None = None) -> Callable[[CloudEvent, EventData], Awaitable[None]]:
    """A handler as services write them: inbox + effect in one unit of work. A job id in `poison` writes its
    effect and then raises Poison, so a leak of its savepoint would show as a row."""
    async def handler(event: CloudEvent, data: EventData) -> None:
        assert isinstance(data, JobSubmitted)
        if seen is not None:
            seen.append(data.job_id)
        async with UnitOfWork(db, "/gpupool/queue") as uow:
            if not await uow.first_time(durable, event.id):
                return
            if before_effect is not None:
                await before_effect(uow, data)
            await uow.conn.execute(
                "INSERT INTO effects (event_id, job_id, txid) VALUES ($1, $2, txid_current())", event.id, data.job_id)
            if data.job_id in poison:
                raise Poison("BadJob", f"{data.job_id} can never apply")
    return handler


async def settled(js: JetStreamContext, durable: str) -> bool:
    info = await js.consumer_info(EVENTS_STREAM.name, durable)
    return info.num_pending == 0 and info.num_ack_pending == 0


async def dlq_subjects_and_reasons(js: JetStreamContext) -> list[tuple[str, str]]:
    state = (await js.stream_info(DLQ_STREAM.name)).state
    if not state.messages:
        return []
    msgs = [await js.get_msg(DLQ_STREAM.name, s) for s in range(state.first_seq, state.last_seq + 1)]
    return [(m.headers["Gpupool-Dlq-Consumer"], m.headers["Gpupool-Dlq-Reason"]) for m in msgs]


class CountingBatch(BatchTransaction):
    """The real batch transaction, counting how many batches it opened and committed."""
    opened = 0
    committed = 0

    async def __aenter__(self) -> BatchTransaction:
        CountingBatch.opened += 1
        return await super().__aenter__()

    async def __aexit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                        tb: TracebackType | None) -> None:
        await super().__aexit__(exc_type, exc, tb)
        if exc_type is None:
            CountingBatch.committed += 1


@pytest.fixture(autouse=True)
def _reset_counts() -> None:
    CountingBatch.opened = CountingBatch.committed = 0


async def run_consumer(js: JetStreamContext, consumer: EventConsumer,
                       until: Callable[[], Awaitable[bool]], what: str) -> None:
    await consumer.start()
    try:
        await eventually(until, timeout=15, what=what)
    finally:
        await consumer.stop()


# --- batched consumer transactions -----------------------------------------------------------------------------
async def test_a_fetched_batch_applies_in_one_transaction_and_every_message_is_acked_after_it(
        db: asyncpg.Pool, js: JetStreamContext) -> None:
    ids = await publish_jobs(js, [f"j-{n}" for n in range(6)])
    consumer = EventConsumer(js, spec("batched"), applier(db, "batched"),
                             transaction=lambda: CountingBatch(db))
    await run_consumer(js, consumer, lambda: settled(js, "batched"), "batch acked")
    rows = await db.fetch("SELECT event_id, txid FROM effects ORDER BY n")
    assert [r["event_id"] for r in rows] == ids  # stream order kept
    assert len({r["txid"] for r in rows}) == 1  # one transaction: one commit for six messages
    assert CountingBatch.committed == 1
    assert await db.fetchval("SELECT count(*) FROM inbox WHERE consumer = 'batched'") == 6


async def test_a_large_fetch_is_applied_in_transactions_of_bounded_size_in_order(
        db: asyncpg.Pool, js: JetStreamContext) -> None:
    ids = await publish_jobs(js, [f"j-{n}" for n in range(110)])
    consumer = EventConsumer(js, spec("large", batch=128), applier(db, "large"),
                             transaction=lambda: CountingBatch(db))
    await run_consumer(js, consumer, lambda: settled(js, "large"), "all acked")
    rows = await db.fetch("SELECT event_id, txid FROM effects ORDER BY n")
    assert [r["event_id"] for r in rows] == ids
    per_tx: dict[int, int] = {}
    for r in rows:
        per_tx[r["txid"]] = per_tx.get(r["txid"], 0) + 1
    assert max(per_tx.values()) <= MAX_MESSAGES_PER_TRANSACTION  # PostgreSQL's subtransaction cache holds 64
    assert len(per_tx) < 110 // 2  # still batched


async def test_without_a_batch_transaction_each_message_commits_on_its_own(
        db: asyncpg.Pool, js: JetStreamContext) -> None:
    await publish_jobs(js, [f"j-{n}" for n in range(4)])
    consumer = EventConsumer(js, spec("single"), applier(db, "single"))
    await run_consumer(js, consumer, lambda: settled(js, "single"), "acked")
    assert await db.fetchval("SELECT count(DISTINCT txid) FROM effects") == 4


async def test_a_poison_message_in_the_middle_of_a_batch_is_dead_lettered_and_the_others_commit(
        db: asyncpg.Pool, js: JetStreamContext) -> None:
    ids = await publish_jobs(js, ["j-0", "j-1", "j-bad", "j-3", "j-4"])
    consumer = EventConsumer(js, spec("poisoned"), applier(db, "poisoned", poison={"j-bad"}),
                             transaction=lambda: CountingBatch(db))
    await run_consumer(js, consumer, lambda: settled(js, "poisoned"), "batch settled")
    rows = await db.fetch("SELECT event_id, job_id, txid FROM effects ORDER BY n")
    assert [r["job_id"] for r in rows] == ["j-0", "j-1", "j-3", "j-4"]  # the poison's effect rolled back alone
    assert len({r["txid"] for r in rows}) == 1 and CountingBatch.committed == 1
    inbox = {r["event_id"] for r in await db.fetch("SELECT event_id FROM inbox WHERE consumer = 'poisoned'")}
    assert inbox == set(ids) - {ids[2]}  # nor is it marked seen
    assert await dlq_subjects_and_reasons(js) == [("poisoned", "BadJob")]


async def test_a_transient_failure_in_a_batch_rolls_back_only_that_message_and_it_applies_on_redelivery(
        db: asyncpg.Pool, js: JetStreamContext) -> None:
    failures = {"j-1": 2}  # the batch's first try, without savepoints, then its second, with them

    async def fail_once(uow: UnitOfWork, data: JobSubmitted) -> None:
        await uow.conn.execute("INSERT INTO effects (event_id, job_id, txid) VALUES ('x', 'partial', 0)")
        if failures.get(data.job_id):
            failures[data.job_id] -= 1
            # a failed statement (a serialization failure: transient, so retried): the savepoint, not the batch,
            # is aborted
            await uow.conn.execute("DO $$ BEGIN RAISE EXCEPTION 'conflict' USING ERRCODE = '40001'; END $$")

    ids = await publish_jobs(js, ["j-0", "j-1", "j-2"])
    consumer = EventConsumer(js, spec("transient"), applier(db, "transient", before_effect=fail_once),
                             transaction=lambda: CountingBatch(db))
    await run_consumer(js, consumer, lambda: settled(js, "transient"), "all applied")
    rows = await db.fetch("SELECT event_id, job_id FROM effects WHERE job_id <> 'partial' ORDER BY n")
    assert [r["job_id"] for r in rows] == ["j-0", "j-2", "j-1"]  # j-1 came back after its nak
    assert sorted(r["event_id"] for r in rows) == sorted(ids)
    assert await db.fetchval("SELECT count(*) FROM effects WHERE job_id = 'partial'") == 3  # not 4
    assert await dlq_subjects_and_reasons(js) == []


async def test_a_batch_where_nothing_fails_runs_no_savepoint(db: asyncpg.Pool, js: JetStreamContext) -> None:
    """Savepoints are only for a batch where something failed: a row written under a savepoint carries its
    subtransaction's id as xmin, so every row carrying its top-level transaction's id shows none was taken."""
    await publish_jobs(js, [f"j-{n}" for n in range(5)])
    consumer = EventConsumer(js, spec("clean"), applier(db, "clean"), transaction=lambda: CountingBatch(db))
    await run_consumer(js, consumer, lambda: settled(js, "clean"), "all acked")
    rows = await db.fetch("SELECT job_id, txid, xmin::text::bigint AS xmin FROM effects ORDER BY n")
    assert [r["job_id"] for r in rows] == [f"j-{n}" for n in range(5)]
    assert len({r["txid"] for r in rows}) == 1 and CountingBatch.opened == CountingBatch.committed == 1
    assert all(r["xmin"] == r["txid"] % 2**32 for r in rows)


async def test_a_failure_without_savepoints_applies_the_batch_again_with_them(
        db: asyncpg.Pool, js: JetStreamContext) -> None:
    """The same check the other way round: after a failure the batch is applied again with a savepoint per message
    (each row its own subtransaction's xmin), still in one commit."""
    failures = {"j-2": 1}

    async def fail_once(uow: UnitOfWork, data: JobSubmitted) -> None:
        if failures.get(data.job_id):
            failures[data.job_id] -= 1
            await uow.conn.execute("DO $$ BEGIN RAISE EXCEPTION 'conflict' USING ERRCODE = '40001'; END $$")

    await publish_jobs(js, [f"j-{n}" for n in range(4)])
    consumer = EventConsumer(js, spec("again"), applier(db, "again", before_effect=fail_once),
                             transaction=lambda: CountingBatch(db))
    await run_consumer(js, consumer, lambda: settled(js, "again"), "all acked")
    rows = await db.fetch("SELECT job_id, txid, xmin::text::bigint AS xmin FROM effects ORDER BY n")
    assert [r["job_id"] for r in rows] == [f"j-{n}" for n in range(4)]  # in order, none nak'd
    assert CountingBatch.opened == 2 and CountingBatch.committed == 1 and len({r["txid"] for r in rows}) == 1
    assert all(r["xmin"] != r["txid"] % 2**32 for r in rows)


async def test_a_failing_commit_acks_nothing_and_the_redelivered_batch_applies_once(
        db: asyncpg.Pool, js: JetStreamContext) -> None:
    seen: list[str] = []
    break_commit = True

    async def guard(uow: UnitOfWork, data: JobSubmitted) -> None:
        if break_commit:  # every message claims v=1: the deferred unique check fails at COMMIT, not before
            await uow.conn.execute("INSERT INTO commit_guard (v) VALUES (1)")

    class BreakOnce(CountingBatch):
        async def __aexit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                            tb: TracebackType | None) -> None:
            nonlocal break_commit
            try:
                await super().__aexit__(exc_type, exc, tb)
            finally:
                break_commit = False

    ids = await publish_jobs(js, ["j-0", "j-1", "j-2"])
    # a 1 s back-off keeps the nak'd messages away while the test looks at what was acked
    consumer = EventConsumer(js, spec("commit", backoff_base_s=1.0, backoff_max_s=1.0),
                             applier(db, "commit", before_effect=guard, seen=seen),
                             transaction=lambda: BreakOnce(db))
    await consumer.start()
    try:
        await eventually(lambda: CountingBatch.opened >= 1 and not break_commit, what="first batch tried")
        # The commit failed: not one message acked (all three still owed), nothing stored.
        info = await js.consumer_info(EVENTS_STREAM.name, "commit")
        assert info.num_ack_pending + info.num_pending == 3
        assert await db.fetchval("SELECT count(*) FROM effects") == 0
        await eventually(lambda: settled(js, "commit"), timeout=15, what="redelivered and acked")
    finally:
        await consumer.stop()
    assert seen[:3] == ["j-0", "j-1", "j-2"] and sorted(seen[3:]) == ["j-0", "j-1", "j-2"]
    rows = await db.fetch("SELECT event_id FROM effects ORDER BY n")
    assert sorted(r["event_id"] for r in rows) == sorted(ids)  # each applied exactly once
    assert await db.fetchval("SELECT count(*) FROM commit_guard") == 0


async def test_a_batch_that_committed_but_was_never_acked_is_a_no_op_when_redelivered(
        db: asyncpg.Pool, js: JetStreamContext) -> None:
    """The commit went through, then the process lost the batch before acking (here: the exit raises after a real
    commit): the redelivered messages find their inbox rows and change nothing."""
    seen: list[str] = []
    lost = [True]

    class CommitThenLose(CountingBatch):
        async def __aexit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                            tb: TracebackType | None) -> None:
            await super().__aexit__(exc_type, exc, tb)
            if lost[0]:
                lost[0] = False
                raise ConnectionError("lost between commit and ack")

    ids = await publish_jobs(js, ["j-0", "j-1", "j-2", "j-3"])
    consumer = EventConsumer(js, spec("lost"), applier(db, "lost", seen=seen),
                             transaction=lambda: CommitThenLose(db))
    await run_consumer(js, consumer, lambda: settled(js, "lost"), "redelivered and acked")
    assert sorted(seen) == sorted(f"j-{n}" for n in range(4) for _ in range(2))  # every message handled twice...
    rows = await db.fetch("SELECT event_id FROM effects ORDER BY n")
    assert [r["event_id"] for r in rows] == ids  # ...and applied once


async def test_after_commit_work_runs_after_the_batch_commits_and_sees_the_batch_through_another_connection(
        db: asyncpg.Pool, js: JetStreamContext) -> None:
    counts_seen: list[int] = []

    async def follow_up() -> None:  # like reclamation's release: reads committed state via the pool
        counts_seen.append(await db.fetchval("SELECT count(*) FROM effects"))

    async def register(uow: UnitOfWork, data: JobSubmitted) -> None:
        assert uow.batched
        uow.after_commit(follow_up)

    await publish_jobs(js, ["j-0", "j-1", "j-2"])
    consumer = EventConsumer(js, spec("follow"), applier(db, "follow", before_effect=register),
                             transaction=lambda: CountingBatch(db))
    await run_consumer(js, consumer, lambda: settled(js, "follow"), "acked")
    assert counts_seen == [3, 3, 3]  # each ran after the one commit, never inside the batch


async def test_a_unit_of_work_in_a_task_spawned_inside_a_batch_uses_its_own_transaction(
        db: asyncpg.Pool) -> None:
    async def spawned() -> bool:
        async with UnitOfWork(db, "/gpupool/queue") as uow:
            await uow.conn.execute("INSERT INTO effects (event_id, job_id, txid) VALUES ('t', 'task', 0)")
            return uow.batched

    async with BatchTransaction(db) as batch:
        async with UnitOfWork(db, "/gpupool/queue") as uow:
            assert uow.batched and uow.conn is batch.conn
        # the task inherits the context variable, not the right to the batch's connection
        assert await asyncio.create_task(spawned()) is False
    assert await db.fetchval("SELECT count(*) FROM effects WHERE job_id = 'task'") == 1


async def test_events_emitted_in_one_unit_of_work_are_written_together_in_emit_order(db: asyncpg.Pool) -> None:
    async with UnitOfWork(db, "/gpupool/queue") as uow:
        ids = [(await uow.emit(job(f"j-{n}"))).id for n in range(7)]
    async with BatchTransaction(db):  # and as a savepoint of a batch
        async with UnitOfWork(db, "/gpupool/queue") as uow:
            ids += [(await uow.emit(job(f"k-{n}"))).id for n in range(3)]
    rows = await db.fetch("SELECT event_id, subject FROM outbox ORDER BY seq")
    assert [r["event_id"] for r in rows] == ids
    assert {r["subject"] for r in rows} == {subjects.JOB_SUBMITTED}


async def test_a_failing_unit_of_work_in_a_batch_leaves_no_outbox_row(db: asyncpg.Pool) -> None:
    async with BatchTransaction(db):
        with pytest.raises(RuntimeError):
            async with UnitOfWork(db, "/gpupool/queue") as uow:
                await uow.emit(job("gone"))
                raise RuntimeError("handler failed after emitting")
        async with UnitOfWork(db, "/gpupool/queue") as uow:
            kept = await uow.emit(job("kept"))
    assert [r["event_id"] for r in await db.fetch("SELECT event_id FROM outbox")] == [kept.id]


async def test_nested_units_of_work_in_a_batch_roll_back_with_the_one_that_failed(db: asyncpg.Pool) -> None:
    async def effect(uow: UnitOfWork, name: str) -> None:
        await uow.conn.execute("INSERT INTO effects (event_id, job_id, txid) VALUES ($1, $1, txid_current())", name)

    async with BatchTransaction(db):
        async with UnitOfWork(db, "/gpupool/queue") as uow:
            await effect(uow, "first")
        with pytest.raises(RuntimeError):
            async with UnitOfWork(db, "/gpupool/queue") as outer:
                await effect(outer, "outer")
                async with UnitOfWork(db, "/gpupool/queue") as inner:
                    await effect(inner, "inner")
                raise RuntimeError("the outer one fails after the inner one succeeded")
        async with UnitOfWork(db, "/gpupool/queue") as outer:
            await effect(outer, "outer-2")
            with pytest.raises(asyncpg.DivisionByZeroError):
                async with UnitOfWork(db, "/gpupool/queue") as inner:
                    await effect(inner, "inner-2")
                    await inner.conn.execute("SELECT 1/0")
            await effect(outer, "after-inner-2")  # the failed inner one left the outer usable
        for n in range(3):
            async with UnitOfWork(db, "/gpupool/queue") as uow:
                await effect(uow, f"many-{n}")
        with pytest.raises(RuntimeError):
            async with UnitOfWork(db, "/gpupool/queue") as uow:
                await effect(uow, "last")
                raise RuntimeError("rolls back to its own savepoint, not to an earlier sibling's")
    rows = [r["event_id"] for r in await db.fetch("SELECT event_id FROM effects ORDER BY n")]
    assert rows == ["first", "outer-2", "after-inner-2", "many-0", "many-1", "many-2"]


# --- pipelined outbox relay ------------------------------------------------------------------------------------
async def stream_ids(js: JetStreamContext) -> list[str]:
    state = (await js.stream_info(EVENTS_STREAM.name)).state
    if not state.messages:
        return []
    return [(await js.get_msg(EVENTS_STREAM.name, s)).headers["Nats-Msg-Id"]
            for s in range(state.first_seq, state.last_seq + 1)]


async def test_the_pipelined_relay_publishes_a_batch_in_commit_order_and_marks_it_sent(
        db: asyncpg.Pool, js: JetStreamContext) -> None:
    ids = []
    for n in range(60):
        async with UnitOfWork(db, "/gpupool/queue") as uow:
            ids.append((await uow.emit(job(f"j-{n}"))).id)
    single_calls = 0

    async def one_at_a_time(subject: str, payload: bytes, headers: dict[str, str]) -> Any:
        nonlocal single_calls
        single_calls += 1
        return await publish_raw(js, subject, payload, headers)

    relay = OutboxRelay(db, one_at_a_time, "test", batch=50, publish_batch=functools.partial(publish_raw_batch, js))
    assert await relay.publish_pending() == 50
    assert await relay.publish_pending() == 10
    assert single_calls == 0  # every row went through the pipelined path
    assert await stream_ids(js) == ids
    assert await relay.pending_count() == 0


async def test_a_pipelined_batch_marks_only_acked_rows_and_records_the_failure_on_the_row_that_was_not_stored(
        db: asyncpg.Pool, js: JetStreamContext) -> None:
    ids = []
    for n in range(3):
        async with UnitOfWork(db, "/gpupool/queue") as uow:
            ids.append((await uow.emit(job(f"j-{n}"))).id)
    # the middle row points at a subject no stream captures: JetStream answers "no responders" for it alone
    await db.execute("UPDATE outbox SET subject = 'nowhere.at.all' WHERE event_id = $1", ids[1])
    relay = OutboxRelay(db, functools.partial(publish_raw, js), "test",
                        publish_batch=functools.partial(publish_raw_batch, js))
    with pytest.raises(NoStreamResponseError):
        await relay.publish_pending()
    rows = await db.fetch("SELECT event_id, published_at, attempts, last_error FROM outbox ORDER BY seq")
    assert [r["published_at"] is not None for r in rows] == [True, False, True]
    assert rows[1]["attempts"] == 1 and "NoStreamResponse" in rows[1]["last_error"]
    assert await stream_ids(js) == [ids[0], ids[2]]
    # fixed, it is published on the next round; the already stored rows are not sent again
    await db.execute("UPDATE outbox SET subject = $2 WHERE event_id = $1", ids[1], subjects.JOB_SUBMITTED)
    assert await relay.publish_pending() == 1
    assert await stream_ids(js) == [ids[0], ids[2], ids[1]]


async def test_publish_raw_batch_reports_each_message_and_a_republished_id_is_stored_once(
        js: JetStreamContext) -> None:
    msgs = [(subjects.JOB_SUBMITTED, job(f"j-{n}").to_cloudevent("/gpupool/queue").to_json(),
             {"Nats-Msg-Id": f"id-{n}"}) for n in range(5)]
    first = await publish_raw_batch(js, msgs)
    again = await publish_raw_batch(js, msgs)  # a relay that crashed before marking: same ids again
    assert [a.seq for a in first] == [1, 2, 3, 4, 5]  # type: ignore[union-attr]
    assert all(a.duplicate for a in again)  # type: ignore[union-attr]
    assert await stream_ids(js) == [f"id-{n}" for n in range(5)]
