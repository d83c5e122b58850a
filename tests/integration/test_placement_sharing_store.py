"""Placement's store has the last word on double allocation, also for shared GPUs: on a real PostgreSQL, whatever
the scheduler computed, a GPU never holds more than it can (one whole holder; fractions within compute and memory;
MIG instances on disjoint slots), and concurrent commits cannot race past that."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from datetime import UTC, datetime

import asyncpg
import pytest

from libs.contracts.events import AllocatedGpu, GpuSpec, NodeRegistered
from services.placement import store

NOW = datetime(2026, 11, 30, tzinfo=UTC)
pytestmark = pytest.mark.integration


@pytest.fixture
async def db(placement_db: asyncpg.Pool) -> AsyncIterator[asyncpg.Pool]:
    """The placement database with this module's fleet (and jobs) in it."""
    pool = placement_db
    async with pool.acquire() as conn:
        await store.upsert_node(conn, NodeRegistered(
            cluster="c", node="n1", hostname="n1", cpu_count=64, memory_mib=512_000, registered_at=NOW,
            gpus=[GpuSpec(uuid="G-frac", index=0, model="L40S", memory_mib=46_068),
                  GpuSpec(uuid="G-mig", index=1, model="A100-80GB", memory_mib=81_920, mig_mode=True)]))
        await store.set_gpu_sharing(conn, "G-frac", "fractional", draining=False)
    yield pool


JOB = {"job_id": "j", "team": "t", "project": "p", "priority": 0, "priority_class": "normal", "kind": "dev",
       "max_runtime_s": None}


async def grant(pool: asyncpg.Pool, alloc_id: str, gpu: AllocatedGpu, slots: int | None = None) -> None:
    async with pool.acquire() as conn, conn.transaction():
        await store.insert_allocation(conn, alloc_id, {**JOB, "job_id": alloc_id}, 0, "c", "n1", [gpu], NOW,
                                      {gpu.uuid: slots} if slots else {})


def frac(milli: int, mem: int) -> AllocatedGpu:
    return AllocatedGpu(uuid="G-frac", index=0, model="L40S", share_milli=milli, memory_mib=mem)


def mig(profile: str, start: int) -> AllocatedGpu:
    return AllocatedGpu(uuid="G-mig", index=1, model="A100-80GB", share_milli=142, mig_profile=profile,
                        mig_start=start)


async def test_fractions_share_a_gpu_up_to_its_compute_and_memory(db: asyncpg.Pool) -> None:
    await grant(db, "a", frac(500, 20_000))
    await grant(db, "b", frac(400, 20_000))
    with pytest.raises(store.AllocationConflict):
        await grant(db, "c", frac(200, 1_000))  # 500 + 400 + 200 > 1000 milli
    with pytest.raises(store.AllocationConflict):
        await grant(db, "d", frac(100, 8_000))  # 40,000 + 8,000 MiB > 46,068
    await grant(db, "e", frac(100, 6_000))
    with pytest.raises(store.AllocationConflict):  # nor a whole holder beside fractions
        await grant(db, "f", AllocatedGpu(uuid="G-frac", index=0, model="L40S"))


async def test_a_whole_holder_keeps_fractions_off_and_a_release_lets_them_back(db: asyncpg.Pool) -> None:
    await grant(db, "w", AllocatedGpu(uuid="G-frac", index=0, model="L40S"))
    with pytest.raises(store.AllocationConflict):
        await grant(db, "a", frac(100, 1_000))
    async with db.acquire() as conn, conn.transaction():
        [(_, gpus)] = await store.release(conn, "w", "JobCompleted", NOW)
    assert gpus[0].share_milli == 1000 and gpus[0].mig_profile is None
    await grant(db, "a", frac(100, 1_000))


async def test_mig_instances_must_not_overlap_in_memory_slots(db: asyncpg.Pool) -> None:
    await grant(db, "m0", mig("3g.40gb", 0), slots=4)
    with pytest.raises(store.AllocationConflict):
        await grant(db, "m1", mig("1g.10gb", 3), slots=1)  # slot 3 is inside [0, 4)
    await grant(db, "m2", mig("3g.40gb", 4), slots=4)
    with pytest.raises(store.AllocationConflict):  # a whole GPU on a GPU with instances: never
        await grant(db, "w", AllocatedGpu(uuid="G-mig", index=1, model="A100-80GB"))
    async with db.acquire() as conn:
        rows = await conn.fetch("SELECT allocation_id, mig_start, mig_slots FROM allocation_gpus WHERE live "
                                "ORDER BY mig_start")
    assert [(r["allocation_id"], r["mig_start"], r["mig_slots"]) for r in rows] == [("m0", 0, 4), ("m2", 4, 4)]


async def test_concurrent_commits_cannot_together_overfill_a_gpu(db: asyncpg.Pool) -> None:
    """Ten commits of 300 milli race for one GPU: the row lock in the check serialises them, so exactly three
    fit (900 ≤ 1000) and the others are refused."""
    results = await asyncio.gather(*(grant(db, f"r{i}", frac(300, 1_000)) for i in range(10)),
                                   return_exceptions=True)
    assert sum(r is None for r in results) == 3
    assert all(isinstance(r, store.AllocationConflict) for r in results if r is not None)
    async with db.acquire() as conn:
        assert await conn.fetchval("SELECT sum(share_milli) FROM allocation_gpus WHERE live") == 900
