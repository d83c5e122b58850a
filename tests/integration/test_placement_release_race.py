"""A job that ends while a scheduling cycle is placing it must not keep the GPUs the cycle gave it. On a real
PostgreSQL: the cycle has claimed the wanted job and written its allocation but not committed; the cancellation's
release runs meanwhile. Whichever commits first, once both have, the job holds nothing and is not wanted."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from datetime import UTC, datetime

import asyncpg
import pytest

from libs.contracts.events import AllocatedGpu, GpuSpec, JobSubmitted, NodeRegistered
from services.placement import store

NOW = datetime(2026, 11, 30, tzinfo=UTC)
pytestmark = pytest.mark.integration


@pytest.fixture
async def db(placement_db: asyncpg.Pool) -> AsyncIterator[asyncpg.Pool]:
    """The placement database with this module's fleet (and jobs) in it."""
    pool = placement_db
    async with pool.acquire() as conn:
        await store.upsert_node(conn, NodeRegistered(
            cluster="c", node="n1", hostname="n1", cpu_count=8, memory_mib=64_000, registered_at=NOW,
            gpus=[GpuSpec(uuid="G0", index=0, model="H100", memory_mib=81_920)]))
        await store.add_pending(conn, JobSubmitted(
            job_id="j", name="j", team="t", project="p", kind="batch", priority_class="normal", priority=0, gpus=1,
            submitted_at=NOW), None)
    yield pool


async def live_allocations(pool: asyncpg.Pool) -> int:
    return await pool.fetchval("SELECT count(*) FROM allocations WHERE job_id = 'j' AND released_at IS NULL")


async def test_a_cancellation_during_the_cycle_that_places_the_job_releases_what_it_placed(db) -> None:  # type: ignore[no-untyped-def]
    cycle = await db.acquire()
    try:
        tx = cycle.transaction()
        await tx.start()
        jobs = await store.claim_jobs(cycle, ["j"])
        assert "j" in jobs  # the cycle holds the wanted job's row
        await store.insert_allocation(cycle, "a1", jobs["j"], 0, "c", "n1",
                                      [AllocatedGpu(uuid="G0", index=0, model="H100")], NOW, {})

        async def cancel() -> list:
            async with db.acquire() as conn, conn.transaction():
                return await store.release(conn, "j", "JobCancelled", NOW, finished=True)

        cancelling = asyncio.create_task(cancel())
        await asyncio.sleep(0.3)  # the release has started and waits on the cycle's lock
        assert not cancelling.done()
        await tx.commit()
        released = await asyncio.wait_for(cancelling, 10)
    finally:
        await db.release(cycle)
    assert [a["allocation_id"] for a, _ in released] == ["a1"]
    assert await live_allocations(db) == 0
    assert not await db.fetchval("SELECT count(*) FROM allocation_gpus WHERE live")
    assert await db.fetchval("SELECT count(*) FROM pending_jobs WHERE job_id = 'j'") == 0


async def test_a_cycle_after_the_cancellation_committed_does_not_place_the_job(db) -> None:  # type: ignore[no-untyped-def]
    async with db.acquire() as conn, conn.transaction():
        assert await store.release(conn, "j", "JobCancelled", NOW, finished=True) == []
    async with db.acquire() as conn, conn.transaction():
        assert await store.claim_jobs(conn, ["j"]) == {}
    assert await live_allocations(db) == 0
