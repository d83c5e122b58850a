"""The batched consumers of accounting and reclamation against their second consumer, on real NATS and PostgreSQL:
both paths run at once on a backlog built so that they touch the same allocations in opposite orders, and
PostgreSQL must detect no deadlock (pg_stat_database.deadlocks of the test's own database) while the state ends up
exactly right. Before the lock order was fixed, both tests saw deadlocks on every run (README of each service,
"Batched event handling")."""

from __future__ import annotations

import random
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from datetime import UTC, datetime, timedelta

import asyncpg
import pytest
from nats.js import JetStreamContext
from prometheus_client import REGISTRY
from waiting import eventually

from libs.bus.connection import ensure_streams
from libs.bus.publisher import MSG_ID_HEADER, publish_raw_batch
from libs.contracts.commands import Empty
from libs.contracts.events import (
    AllocatedGpu,
    AllocationGranted,
    AllocationReleased,
    EventData,
    GpuRollup,
    GpuTelemetry,
    TelemetryRolledUp,
    TelemetrySampled,
    subject_for,
)
from libs.runtime.service import ServiceRuntime
from services.accounting.bootstrap import mount as mount_accounting
from services.accounting.config import AccountingSettings
from services.accounting.handlers import AccountingHandlers
from services.reclamation.config import ReclamationSettings
from services.reclamation.handlers import ReclamationHandlers
from services.reclamation.handlers import routes as reclamation_routes

pytestmark = [pytest.mark.integration, pytest.mark.usefixtures("keep_test_logging_and_tracing")]

NODES, GPUS = 8, 8
BASE = datetime.now(UTC).replace(second=0, microsecond=0) - timedelta(hours=6)
MINUTE_US = 60_000_000


# --- shared --------------------------------------------------------------------------------------------------------
async def publish_all(js: JetStreamContext, events: list[EventData], source: str) -> None:
    msgs = []
    for data in events:
        event = data.to_cloudevent(source)
        msgs.append((subject_for(data), event.model_dump_json().encode(), {MSG_ID_HEADER: event.id}))
    for start in range(0, len(msgs), 200):
        results = await publish_raw_batch(js, msgs[start:start + 200], timeout=30)
        assert not [r for r in results if isinstance(r, BaseException)]


async def deadlocks(dsn: str) -> int:
    """pg_stat_database.deadlocks of the DSN's database once every other session on it has ended: a backend
    flushes its statistics before it leaves pg_stat_activity, so the count then includes every session."""
    conn = await asyncpg.connect(dsn)
    try:
        async def alone() -> bool:
            return await conn.fetchval("SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
                                       "AND pid <> pg_backend_pid()") == 0
        await eventually(alone, timeout=60, what="the service's sessions to end")
        await conn.execute("SELECT pg_stat_clear_snapshot()")
        return await conn.fetchval("SELECT deadlocks FROM pg_stat_database WHERE datname = current_database()")
    finally:
        await conn.close()


def retried(consumer: str) -> float:
    """Messages this process's consumer nak'd for a retry so far (a deadlock's victim is one)."""
    return REGISTRY.get_sample_value("gpupool_bus_messages_total", {"consumer": consumer, "outcome": "retried"}) or 0.0


def one_gpu(node: int, index: int) -> list[AllocatedGpu]:
    return [AllocatedGpu(uuid=f"GPU-n{node}-{index}", index=index, model="H100-80GB")]


# --- accounting: allocation events (batched) against rollups --------------------------------------------------------
@asynccontextmanager
async def running_accounting(nats_url: str, dsn: str, replicas: int) -> AsyncIterator[ServiceRuntime]:
    """`replicas` accountings sharing the durable consumers (as `gpupool up --replicas`); yields the first."""
    runtimes = []
    try:
        for k in range(replicas):
            settings = AccountingSettings(nats_url=nats_url, database_url=dsn, http_port=0, log_level="WARNING",
                                          instance=f"acct-deadlocks-{k}", idle_util_pct=5.0)
            rt = ServiceRuntime("accounting", settings, migrations_package="services.accounting")
            runtimes.append(rt)
            await rt.start()
            await mount_accounting(rt, AccountingHandlers(rt, settings))
        yield runtimes[0]
    finally:
        for rt in runtimes:
            await rt.shutdown()


def util(node: int, index: int) -> float:
    return float((node * GPUS + index) % 5 * 20 + 2)  # 2, 22, 42, 62, 82 %: idle and busy GPUs on every node


@pytest.mark.parametrize("replicas", [1, 2])
async def test_accounting_allocation_batches_and_rollups_never_deadlock_and_every_interval_is_exact(
        nats_url: str, pg_database: str, js: JetStreamContext, replicas: int) -> None:
    """Every round, each of the 64 GPUs gets a one-GPU allocation from minute 3r + ½ to 3r + 2½ (grants and releases
    in shuffled order, so a batch takes the nodes' locks in no particular order) and a rollup for minutes 3r, 3r+1
    and 3r+2 per node (on the other stream, applied concurrently). Whatever the interleaving, each interval must be
    covered for exactly two minutes at its GPU's utilization. With two replicas, two allocation batches run at once
    too, and one may hold an allocation whose other event the second one is about to apply: that event is retried
    (not waited for), so they never deadlock either."""
    rounds = 5
    rng = random.Random(7)
    events: list[EventData] = []
    rollups: list[EventData] = []
    for r in range(rounds):
        grants = [AllocationGranted(allocation_id=f"a-{r}-{n}-{i}", job_id=f"j-{r}-{n}-{i}", team="research",
                                    project="p", cluster="c1", node=f"n{n}", gpus=one_gpu(n, i), kind="training",
                                    granted_at=BASE + timedelta(minutes=3 * r + 0.5))
                  for n in range(NODES) for i in range(GPUS)]
        releases = [AllocationReleased(allocation_id=g.allocation_id, job_id=g.job_id, team=g.team, project=g.project,
                                       cluster=g.cluster, node=g.node, gpus=g.gpus, granted_at=g.granted_at,
                                       released_at=BASE + timedelta(minutes=3 * r + 2.5), reason="JobCompleted")
                    for g in grants]
        rng.shuffle(grants)
        rng.shuffle(releases)
        events += grants + releases
        for minute in range(3 * r, 3 * r + 3):
            nodes = list(range(NODES))
            rng.shuffle(nodes)
            rollups += [TelemetryRolledUp(
                cluster="c1", node=f"n{n}", window_start=BASE + timedelta(minutes=minute),
                window_end=BASE + timedelta(minutes=minute + 1),
                gpus=[GpuRollup(uuid=f"GPU-n{n}-{i}", index=i, samples=30, utilization_avg_pct=util(n, i),
                                utilization_max_pct=util(n, i), memory_used_avg_mib=1024.0, memory_used_max_mib=1024)
                      for i in range(GPUS)]) for n in nodes]
    # Both streams hold their whole backlog before accounting starts, so its two consumers run side by side.
    await ensure_streams(js)
    await publish_all(js, events, "/gpupool/placement")
    await publish_all(js, rollups, "/gpupool/inventory")
    before = {c: retried(c) for c in ("accounting", "accounting-rollups")}
    allocations = rounds * NODES * GPUS

    async with running_accounting(nats_url, pg_database, replicas) as rt:
        async def applied() -> bool:
            async with rt.pool.acquire() as conn:
                return await conn.fetchval("SELECT count(*) FROM usage_ledger") == allocations and \
                    await conn.fetchval("SELECT count(*) FROM gpu_rollups") == rounds * 3 * NODES * GPUS
        await eventually(applied, timeout=240, what="every release and rollup applied")
        async with rt.pool.acquire() as conn:
            rows = await conn.fetch("SELECT allocation_id, gpu_uuid, covered_us, util_us, idle_us, released_at "
                                    "FROM gpu_intervals")
            emitted = await conn.fetchval("SELECT count(*) FROM outbox WHERE subject = 'gpupool.usage.recorded'")
    assert len(rows) == allocations and emitted == allocations
    wrong = []
    for row in rows:
        n, i = (int(x) for x in row["gpu_uuid"].removeprefix("GPU-n").split("-"))
        expected = (2 * MINUTE_US, 2 * MINUTE_US * util(n, i), 2 * MINUTE_US if util(n, i) <= 5.0 else 0)
        if (row["covered_us"], row["util_us"], row["idle_us"]) != expected or row["released_at"] is None:
            wrong.append((row["allocation_id"], row["covered_us"], row["util_us"], row["idle_us"], expected))
    assert not wrong, wrong[:5]
    if replicas == 1:  # alone, nothing is ever retried; two replicas retry an allocation the other one holds
        assert {c: retried(c) - before[c] for c in before} == {"accounting": 0, "accounting-rollups": 0}
    assert retried("accounting-rollups") == before["accounting-rollups"]
    assert await deadlocks(pg_database) == 0


# --- reclamation: allocation events (batched) against telemetry (batched) -------------------------------------------
@asynccontextmanager
async def running_reclamation(nats_url: str, dsn: str) -> AsyncIterator[tuple[ServiceRuntime, ReclamationHandlers]]:
    """Its consumers only: the sweep is run by the test when it wants one."""
    settings = ReclamationSettings(nats_url=nats_url, database_url=dsn, http_port=0, log_level="WARNING",
                                   instance="reclaim-deadlocks")
    rt = ServiceRuntime("reclamation", settings, migrations_package="services.reclamation")
    await rt.start()
    handlers = ReclamationHandlers(rt, settings)
    await rt.mount(reclamation_routes(handlers))
    try:
        yield rt, handlers
    finally:
        await rt.shutdown()


def sample(n: int, at: datetime, pct: float) -> TelemetrySampled:
    return TelemetrySampled(cluster="c1", node=f"n{n}", sampled_at=at, gpus=[
        GpuTelemetry(uuid=f"GPU-n{n}-{i}", index=i, utilization_gpu_pct=pct, utilization_memory_pct=10.0,
                     memory_used_mib=1024, memory_total_mib=81920) for i in range(GPUS)])


def granted(wave: int, n: int, i: int) -> AllocationGranted:
    return AllocationGranted(allocation_id=f"a-{wave}-{n}-{i}", job_id=f"j-{wave}-{n}-{i}", team="research",
                             project="p", cluster="c1", node=f"n{n}", gpus=one_gpu(n, i), kind="dev",
                             granted_at=datetime.now(UTC))


async def test_reclamation_allocation_and_telemetry_batches_never_deadlock_and_trackers_end_right(
        nats_url: str, pg_database: str, js: JetStreamContext) -> None:
    """64 tracked allocations; then, with the service stopped, a backlog of telemetry for every node (shuffled
    order, each sample touching all of a node's allocations) and on the events stream the release of every one of
    them in shuffled order and 64 new grants. Restarted, its two batched consumers work through both at once. The
    old allocations must be gone, the new ones tracked, and a last sample must reach every new one."""
    rng = random.Random(11)
    first = [granted(1, n, i) for n in range(NODES) for i in range(GPUS)]
    second = [granted(2, n, i) for n in range(NODES) for i in range(GPUS)]
    await ensure_streams(js)
    await publish_all(js, first, "/gpupool/placement")
    async with running_reclamation(nats_url, pg_database) as (rt, _):
        async def tracked() -> bool:
            async with rt.pool.acquire() as conn:
                return await conn.fetchval("SELECT count(*) FROM trackers") == len(first)
        await eventually(tracked, timeout=120, what="the first allocations tracked")

    start = datetime.now(UTC)
    telemetry = []
    for k in range(24):
        nodes = list(range(NODES))
        rng.shuffle(nodes)
        telemetry += [sample(n, start + timedelta(seconds=k), 1.0 if k % 2 else 60.0) for n in nodes]
    releases = [AllocationReleased(allocation_id=g.allocation_id, job_id=g.job_id, team=g.team, project=g.project,
                                   cluster=g.cluster, node=g.node, gpus=g.gpus, granted_at=g.granted_at,
                                   released_at=datetime.now(UTC), reason="JobCompleted") for g in first]
    rng.shuffle(releases)
    await publish_all(js, telemetry, "/gpupool/agent")
    await publish_all(js, [e for pair in zip(releases, second, strict=True) for e in pair], "/gpupool/placement")
    before = {c: retried(c) for c in ("reclamation", "reclamation-telemetry")}

    async with running_reclamation(nats_url, pg_database) as (rt, handlers):
        async def settled() -> bool:
            async with rt.pool.acquire() as conn:
                ids = {r["allocation_id"] for r in await conn.fetch("SELECT allocation_id FROM trackers")}
            return ids == {g.allocation_id for g in second}
        await eventually(settled, timeout=240, what="the old allocations released and the new ones tracked")
        final = start + timedelta(minutes=5)
        await publish_all(js, [sample(n, final, 40.0) for n in range(NODES)], "/gpupool/agent")

        async def sampled() -> bool:
            async with rt.pool.acquire() as conn:
                return await conn.fetchval("SELECT count(*) FROM tracker_usage WHERE last_sample_at = $1",
                                           final) == len(second)
        await eventually(sampled, timeout=120, what="the last sample applied to every tracker")
        await handlers.sweep()  # prunes what telemetry kept of the released allocations
        trackers = {t["allocation_id"]: t for t in (await handlers.list_tracked(Empty())).result["items"]}
        async with rt.pool.acquire() as conn:
            usage_ids = {r["allocation_id"] for r in await conn.fetch("SELECT allocation_id FROM tracker_usage")}
    assert set(trackers) == usage_ids == {g.allocation_id for g in second}
    for t in trackers.values():
        assert (t["last_busy_at"], t["mean_util_pct"], t["max_util_pct"], t["idle_s"]) == \
            (final.isoformat(), 40.0, 40.0, 0.0), t
    assert {c: retried(c) - before[c] for c in before} == {"reclamation": 0, "reclamation-telemetry": 0}
    assert await deadlocks(pg_database) == 0
