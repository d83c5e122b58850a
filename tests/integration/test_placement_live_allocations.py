"""Placement reads its live allocations incrementally (`WantedJobs("allocation_id")` + `allocations.changed_xid`)
on a real PostgreSQL: unchanged rows are not read again and stay the same objects; grants, releases, preemptions
and a change of the wanted job they belong to (its replicas) are seen; a change made by a transaction still open
during one read is seen by the next; and every incremental read equals a full one."""

from __future__ import annotations

from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta

import asyncpg
import pytest

from libs.contracts.envelope import uuid7
from libs.contracts.events import AllocatedGpu, GpuSpec, JobSubmitted, NodeRegistered
from libs.runtime.service import ServiceRuntime
from services.placement import store
from services.placement.config import PlacementSettings
from services.placement.incremental import WantedJobs

pytestmark = pytest.mark.integration
NOW = datetime(2026, 12, 1, tzinfo=UTC)


@pytest.fixture
async def pool(nats_url: str, fresh_database_dsn: str) -> AsyncIterator[asyncpg.Pool]:
    settings = PlacementSettings(nats_url=nats_url, database_url=fresh_database_dsn, http_port=0,
                                 log_level="WARNING", instance="pl-live-test", cycle_interval_s=3600)
    rt = ServiceRuntime("placement", settings, migrations_package="services.placement")
    await rt.start()  # migrations applied; nothing consumes or schedules
    try:
        assert rt.pool is not None
        async with rt.pool.acquire() as conn:
            await store.upsert_node(conn, NodeRegistered(
                cluster="c", node="n1", hostname="n1", cpu_count=64, memory_mib=512_000, registered_at=NOW,
                gpus=[GpuSpec(uuid=f"G{i}", index=i, model="H100", memory_mib=81_920) for i in range(6)]))
        yield rt.pool
    finally:
        await rt.shutdown()


async def run(conn: asyncpg.Connection, job_id: str, gpu: int, replicas: int = 1) -> None:
    """The job wanted, and holding GPU `gpu` (as a cycle would have written it)."""
    data = JobSubmitted(job_id=job_id, name=job_id, team="ml", project="default", kind="batch",
                        priority_class="normal", priority=0, gpus=1, submitted_at=NOW, replicas=replicas)
    await store.add_pending(conn, data, None)
    await store.insert_allocation(conn, uuid7(), {"job_id": job_id, "team": "ml", "project": "default",
                                                  "priority": 0, "priority_class": "normal", "kind": "batch",
                                                  "max_runtime_s": None}, 0, "c", "n1",
                                  [AllocatedGpu(uuid=f"G{gpu}", index=gpu, model="H100")], NOW, {})


async def read(pool: asyncpg.Pool, live: WantedJobs) -> tuple[dict[str, dict], int]:
    """The live rows by job id, how many came back whole; and checks the read equals a full one."""
    before = {id(r) for r in live.rows.values()}
    async with pool.acquire() as conn:
        state = await store.load_state(conn, WantedJobs(), live)
        full = await store.load_state(conn, WantedJobs(), WantedJobs("allocation_id"))
    assert state["running"] == full["running"]
    fresh = sum(1 for r in state["running"] if id(r) not in before)
    return {r["job_id"]: r for r in state["running"]}, fresh


async def test_only_changed_allocations_are_read_again_and_the_rest_stay_the_same_objects(pool) -> None:  # type: ignore[no-untyped-def]
    async with pool.acquire() as conn:
        for i, j in enumerate(("a", "b", "c")):
            await run(conn, j, i)
    live = WantedJobs("allocation_id")
    first, fresh = await read(pool, live)
    assert sorted(first) == ["a", "b", "c"] and fresh == 3
    again, fresh = await read(pool, live)
    assert fresh == 0 and all(again[j] is first[j] for j in first)

    async with pool.acquire() as conn:
        await store.release(conn, "b", "JobCompleted", NOW + timedelta(minutes=1), finished=True)
        await store.start_preemption(conn, "c", None, deadline=NOW + timedelta(minutes=2), reason="Preempted",
                                     preemptor="x")
        await run(conn, "d", 3)
    now, fresh = await read(pool, live)
    assert sorted(now) == ["a", "c", "d"] and fresh == 2 and now["a"] is first["a"]
    assert now["c"]["preempt_deadline"] is not None

    async with pool.acquire() as conn:
        await store.set_replicas(conn, "a", 3)  # its wanted job changed what the cycle reads of its allocation
    now, fresh = await read(pool, live)
    assert fresh == 1 and now["a"]["replicas"] == 3 and now["a"]["replica_set"] is True


async def test_a_change_committed_after_a_read_that_could_not_see_it_is_read_next_time(pool) -> None:  # type: ignore[no-untyped-def]
    async with pool.acquire() as conn:
        await run(conn, "a", 0)
        await run(conn, "b", 1)
    live = WantedJobs("allocation_id")
    await read(pool, live)
    slow = await pool.acquire()
    try:
        tx = slow.transaction()
        await tx.start()
        await store.start_preemption(slow, "a", None, deadline=NOW, reason="Preempted", preemptor="x")
        async with pool.acquire() as conn:
            await run(conn, "c", 2)
        during, _ = await read(pool, live)
        assert during["a"]["preempt_deadline"] is None and "c" in during
        await tx.commit()
    finally:
        await pool.release(slow)
    after, _ = await read(pool, live)
    assert after["a"]["preempt_deadline"] is not None
    settled, fresh = await read(pool, live)
    assert fresh == 0 and settled["a"] is after["a"]
