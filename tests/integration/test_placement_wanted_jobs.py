"""Placement reads its wanted jobs incrementally (WantedJobs + `changed_xid`) on a real PostgreSQL: unchanged rows
are not read again and stay the same objects, changes and removals are seen, and a change made by a transaction
that was still open during one read is seen by the next read, however it interleaves."""

from __future__ import annotations

from collections.abc import AsyncIterator
from datetime import UTC, datetime

import asyncpg
import pytest

from libs.contracts.events import JobSubmitted
from libs.runtime.service import ServiceRuntime
from services.placement import store
from services.placement.config import PlacementSettings
from services.placement.incremental import WantedJobs

pytestmark = pytest.mark.integration
NOW = datetime(2026, 11, 30, tzinfo=UTC)


@pytest.fixture
async def pool(nats_url: str, fresh_database_dsn: str) -> AsyncIterator[asyncpg.Pool]:
    settings = PlacementSettings(nats_url=nats_url, database_url=fresh_database_dsn, http_port=0,
                                 log_level="WARNING", instance="pl-wanted-test", cycle_interval_s=3600)
    rt = ServiceRuntime("placement", settings, migrations_package="services.placement")
    await rt.start()  # migrations applied; nothing consumes or schedules
    try:
        assert rt.pool is not None
        yield rt.pool
    finally:
        await rt.shutdown()


def job(job_id: str, gpus: int = 1) -> JobSubmitted:
    return JobSubmitted(job_id=job_id, name=job_id, team="ml", project="default", kind="batch",
                        priority_class="normal", priority=0, gpus=gpus, submitted_at=NOW)


async def read(pool: asyncpg.Pool, wanted: WantedJobs) -> tuple[dict[str, dict], int]:
    """The wanted rows by job id, and how many came back whole (not from WantedJobs' copy)."""
    before = dict(wanted.rows)
    async with pool.acquire() as conn:
        state = await store.load_state(conn, wanted)
    rows = {r["job_id"]: r for r in state["pending"]}
    fresh = sum(1 for j, r in rows.items() if j not in before or before[j] is not r)
    return rows, fresh


async def test_only_changes_are_read_again_and_unchanged_rows_stay_the_same_objects(pool) -> None:  # type: ignore[no-untyped-def]
    async with pool.acquire() as conn:
        for j in ("a", "b", "c"):
            await store.add_pending(conn, job(j), None)
    wanted = WantedJobs()
    first, fresh = await read(pool, wanted)
    assert sorted(first) == ["a", "b", "c"] and fresh == 3
    again, fresh = await read(pool, wanted)
    assert fresh == 0 and all(again[j] is first[j] for j in first)

    async with pool.acquire() as conn:
        await store.set_replicas(conn, "b", 3)  # a change the cycle reads
        await conn.execute("UPDATE pending_jobs SET satisfied = true WHERE job_id = 'c'")  # placed: not wanted
        await store.add_pending(conn, job("d", gpus=2), None)  # a new one
        await store.record_pending_reasons(conn, [("a", "NoFeasibleNode", "full")])  # not a change it reads
    now, fresh = await read(pool, wanted)
    assert sorted(now) == ["a", "b", "d"] and fresh == 2
    assert now["a"] is first["a"] and now["b"]["replicas"] == 3 and now["d"]["gpus"] == 2

    async with pool.acquire() as conn:
        await conn.execute("DELETE FROM pending_jobs WHERE job_id = 'a'")  # finished
        await conn.execute("UPDATE pending_jobs SET satisfied = false WHERE job_id = 'c'")  # wanted again
    now, fresh = await read(pool, wanted)
    assert sorted(now) == ["b", "c", "d"] and fresh == 1 and now["c"]["gpus"] == 1


async def test_a_change_committed_after_a_read_that_could_not_see_it_is_read_next_time(pool) -> None:  # type: ignore[no-untyped-def]
    async with pool.acquire() as conn:
        await store.add_pending(conn, job("a"), None)
        await store.add_pending(conn, job("b"), None)
    wanted = WantedJobs()
    await read(pool, wanted)
    # a writer takes its transaction id and changes "a", then a newer transaction changes "b" and commits; a read
    # happens while the first is still open: it sees "b" changed, not "a" (and its horizon must not pass "a")
    slow = await pool.acquire()
    try:
        tx = slow.transaction()
        await tx.start()
        await slow.execute("UPDATE pending_jobs SET replicas = 5 WHERE job_id = 'a'")
        async with pool.acquire() as conn:
            await store.set_replicas(conn, "b", 2)
        during, _ = await read(pool, wanted)
        assert during["a"]["replicas"] == 1 and during["b"]["replicas"] == 2
        await tx.commit()
    finally:
        await pool.release(slow)
    after, _ = await read(pool, wanted)
    assert after["a"]["replicas"] == 5 and after["b"]["replicas"] == 2
    # ("b" changed after the open transaction began, so that read's horizon could not pass it: read again, to be
    # safe); with nothing open any more, the next read trusts the copy of both
    settled, fresh = await read(pool, wanted)
    assert fresh == 0 and settled["a"] is after["a"]


async def test_a_copy_that_does_not_match_the_store_is_dropped_and_everything_read_again(pool, caplog) -> None:  # type: ignore[no-untyped-def]
    async with pool.acquire() as conn:
        await store.add_pending(conn, job("a"), None)
    wanted = WantedJobs()
    await read(pool, wanted)
    # the copy holds a job the store does not want (its removal was never told): it cannot be trusted
    wanted.rows["ghost"] = {**wanted.rows["a"], "job_id": "ghost"}
    now, fresh = await read(pool, wanted)
    assert sorted(now) == ["a"] and fresh == 1
    assert [r.getMessage() for r in caplog.records if r.name == "services.placement.store"] == ["wanted_jobs_reloaded"]


async def test_under_concurrent_writers_every_incremental_read_equals_a_full_read_of_the_same_snapshot(
        pool, caplog) -> None:  # type: ignore[no-untyped-def]
    """Writers insert, change, satisfy and delete wanted jobs in transactions that overlap the reads and each other
    (some held open across several reads); each incremental read is compared with a full read in the same
    REPEATABLE READ snapshot: whatever the interleaving, the copy is never stale, and never even needs the
    everything-again fallback (every removal is told: a satisfied row by its stamp, a deleted one by
    `pending_gone`)."""
    import asyncio
    import random

    rng = random.Random(7)
    stop = asyncio.Event()
    ids = [f"j{i}" for i in range(40)]

    async def writer(seed: int) -> None:
        r = random.Random(seed)
        while not stop.is_set():
            async with pool.acquire() as conn, conn.transaction():
                for _ in range(r.randint(1, 4)):
                    job_id = r.choice(ids)
                    op = r.random()
                    if op < 0.35:
                        await store.add_pending(conn, job(job_id, gpus=r.randint(1, 8)), None)
                    elif op < 0.6:
                        await conn.execute("UPDATE pending_jobs SET replicas = $2 WHERE job_id = $1", job_id,
                                           r.randint(1, 4))
                    elif op < 0.8:
                        await conn.execute("UPDATE pending_jobs SET satisfied = NOT satisfied WHERE job_id = $1",
                                           job_id)
                    else:
                        await conn.execute("DELETE FROM pending_jobs WHERE job_id = $1", job_id)
                    await asyncio.sleep(r.choice((0, 0, 0.001, 0.01, 0.05)))  # some stay open across reads

    writers = [asyncio.create_task(writer(seed)) for seed in range(3)]
    wanted = WantedJobs()
    compared = 0
    try:
        for _ in range(60):
            async with pool.acquire() as conn, conn.transaction(isolation="repeatable_read"):
                incremental = await store.load_state(conn, wanted)
                full = await store.load_state(conn, WantedJobs())
            key = lambda rows: sorted((r["job_id"], r["replicas"], r["gpus"]) for r in rows)  # noqa: E731
            assert key(incremental["pending"]) == key(full["pending"])
            compared += 1
            await asyncio.sleep(rng.choice((0, 0.002, 0.02)))
    finally:
        stop.set()
        await asyncio.gather(*writers, return_exceptions=True)
    assert compared == 60
    assert not [r for r in caplog.records if r.getMessage() == "wanted_jobs_reloaded"]


async def test_a_copy_that_lost_a_row_is_read_whole_when_counted_and_kept_when_not(pool) -> None:  # type: ignore[no-untyped-def]
    """Counting is a scan of each table, so placement counts only now and then (`counted`): a read that does not
    count takes the copy as it is, the next one that counts finds it short and reads every row again."""
    async with pool.acquire() as conn:
        for j in ("a", "b", "c"):
            await store.add_pending(conn, job(j), None)
    wanted = WantedJobs()
    await read(pool, wanted)
    del wanted.rows["b"]  # a removal the copy was never told of (what the count is there to catch)
    async with pool.acquire() as conn:
        uncounted = await store.load_state(conn, wanted, counted=False)
        assert sorted(r["job_id"] for r in uncounted["pending"]) == ["a", "c"]
        counted = await store.load_state(conn, wanted, counted=True)
        assert sorted(r["job_id"] for r in counted["pending"]) == ["a", "b", "c"]
