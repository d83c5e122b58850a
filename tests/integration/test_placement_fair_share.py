"""Fair share's history on a real PostgreSQL: every release adds the GPU-seconds its allocation held to its team's
usage, decayed with the configured half-life, and the cycle's state read hands them to the core."""

from __future__ import annotations

from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta

import asyncpg
import pytest

from libs.contracts.events import AllocatedGpu, GpuSpec, JobSubmitted, NodeRegistered
from services.placement import store
from services.placement.domain import build_snapshot
from services.placement.incremental import WantedJobs

NOW = datetime(2026, 11, 30, tzinfo=UTC)
pytestmark = pytest.mark.integration


@pytest.fixture
async def db(placement_db: asyncpg.Pool) -> AsyncIterator[asyncpg.Pool]:
    async with placement_db.acquire() as conn:
        await store.upsert_node(conn, NodeRegistered(
            cluster="c", node="n1", hostname="n1", cpu_count=8, memory_mib=64_000, registered_at=NOW,
            gpus=[GpuSpec(uuid=f"G{i}", index=i, model="H100", memory_mib=81_920) for i in range(4)]))
        await store.set_fair_share_half_life(conn, 100.0)
    yield placement_db


async def run(pool: asyncpg.Pool, job: str, team: str, gpus: list[AllocatedGpu], start: datetime,
              end: datetime) -> None:
    async with pool.acquire() as conn, conn.transaction():
        await store.add_pending(conn, JobSubmitted(
            job_id=job, name=job, team=team, project="p", kind="batch", priority_class="normal", priority=0,
            gpus=len(gpus), submitted_at=start), None)
        jobs = await store.claim_jobs(conn, [job])
        await store.insert_allocation(conn, f"a-{job}", jobs[job], 0, "c", "n1", gpus, start, {})
    async with pool.acquire() as conn, conn.transaction():
        await store.release(conn, job, "JobCompleted", end, finished=True)


async def usage(pool: asyncpg.Pool) -> dict[tuple[str, str], tuple[float, datetime]]:
    rows = await pool.fetch("SELECT team, gpu_model, gpu_seconds, as_of FROM team_usage")
    return {(r["team"], r["gpu_model"]): (r["gpu_seconds"], r["as_of"]) for r in rows}


async def test_releases_add_their_gpu_seconds_decayed_with_the_half_life(db) -> None:  # type: ignore[no-untyped-def]
    two = [AllocatedGpu(uuid="G0", index=0, model="H100"), AllocatedGpu(uuid="G1", index=1, model="H100")]
    await run(db, "j1", "ml", two, NOW, NOW + timedelta(seconds=30))  # 2 GPUs x 30 s
    assert (await usage(db))[("ml", "H100")] == (pytest.approx(60.0), NOW + timedelta(seconds=30))

    # one half-life later the 60 count 30, plus a quarter GPU for 40 s (10 GPU-seconds)
    quarter = [AllocatedGpu(uuid="G2", index=2, model="H100", share_milli=250, memory_mib=1024)]
    later = NOW + timedelta(seconds=130)
    await run(db, "j2", "ml", quarter, later - timedelta(seconds=40), later)
    await run(db, "j3", "cv", two, later - timedelta(seconds=5), later)
    got = await usage(db)
    assert got[("ml", "H100")] == (pytest.approx(40.0), later)
    assert got[("cv", "H100")] == (pytest.approx(10.0), later)

    async with db.acquire() as conn:
        state = await store.load_state(conn, WantedJobs())
    snapshot = build_snapshot(state["nodes"], state["gpus"], state["running"], state["usage"])
    assert sorted((u.team, u.gpu_model, round(u.gpu_seconds, 6), u.as_of) for u in snapshot.usage) == [
        ("cv", "H100", 10.0, later.timestamp()), ("ml", "H100", 40.0, later.timestamp())]


async def test_explain_reports_the_last_cycles_order_and_estimates_for_a_newer_job(db) -> None:  # type: ignore[no-untyped-def]
    async with db.acquire() as conn:
        for i, job in enumerate(("early", "late", "newest")):
            await store.add_pending(conn, JobSubmitted(
                job_id=job, name=job, team="ml", project="p", kind="batch", priority_class="normal", priority=0,
                gpus=8, submitted_at=NOW + timedelta(seconds=i)), None)
        await store.record_queue_order(conn, ("late", "early"))  # fair share put `late` first
        late, early, newest = [await store.explain(conn, j) for j in ("late", "early", "newest")]
    assert (late["position"], late["position_basis"]) == (1, "last_cycle")
    assert (early["position"], early["position_basis"]) == (2, "last_cycle")
    assert (newest["position"], newest["position_basis"]) == (3, "estimate")  # behind both, by submit time


async def test_explains_position_counts_only_the_jobs_still_waiting_ahead(db) -> None:  # type: ignore[no-untyped-def]
    async with db.acquire() as conn:
        for i, job in enumerate(("a", "b", "c", "d")):
            await store.add_pending(conn, JobSubmitted(
                job_id=job, name=job, team="ml", project="p", kind="batch", priority_class="normal", priority=0,
                gpus=1, submitted_at=NOW + timedelta(seconds=i)), None)
        await store.record_queue_order(conn, ("c", "a", "b", "d"))
        # `c` got its GPU and `a` finished since the order was written: neither waits ahead any more
        jobs = await store.claim_jobs(conn, ["c"])
        await store.insert_allocation(conn, "a-c", jobs["c"], 0, "c", "n1",
                                      [AllocatedGpu(uuid="G0", index=0, model="H100")], NOW, {})
        await store.refresh_satisfied(conn, "c")
        await store.release(conn, "a", "JobCancelled", NOW, finished=True)
        b, d = [await store.explain(conn, j) for j in ("b", "d")]
        assert (b["position"], b["position_basis"]) == (1, "last_cycle")
        assert (d["position"], d["position_basis"]) == (2, "last_cycle")
        assert (await store.explain(conn, "c"))["state"] != "pending"


async def test_the_queue_order_reads_back_as_written_with_any_ids(db) -> None:  # type: ignore[no-untyped-def]
    """Sent as one text the server splits, or as an array when an id holds a newline; an empty order is none."""
    for order in (("c", "a", "b"), ("x\ny", "z"), (), ("only",)):
        async with db.acquire() as conn:
            await store.record_queue_order(conn, order)
            assert tuple(await conn.fetchval("SELECT job_ids FROM queue_order")) == order
