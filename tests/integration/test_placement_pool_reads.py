"""Placement reads its pool incrementally (`WantedJobs("key")` + `nodes.changed_xid` / `gpus.changed_xid`) on a
real PostgreSQL: an unchanged node is not read again and stays the same object; a node whose row or any GPU
changed and a new node are read again (a GPU that moved to another node makes the whole pool read again); a change made by a transaction still open
during one read is seen by the next; and every incremental read equals a full one."""

from __future__ import annotations

from collections.abc import AsyncIterator
from datetime import UTC, datetime

import asyncpg
import pytest

from libs.contracts.events import GpuSpec, NodeRegistered
from libs.runtime.service import ServiceRuntime
from services.placement import store
from services.placement.config import PlacementSettings
from services.placement.incremental import WantedJobs

pytestmark = pytest.mark.integration
NOW = datetime(2026, 12, 1, tzinfo=UTC)


def node(name: str, *uuids: str) -> NodeRegistered:
    return NodeRegistered(cluster="c", node=name, hostname=name, cpu_count=64, memory_mib=512_000, registered_at=NOW,
                          gpus=[GpuSpec(uuid=u, index=i, model="H100", memory_mib=81_920) for i, u in enumerate(uuids)])


@pytest.fixture
async def pool(nats_url: str, fresh_database_dsn: str) -> AsyncIterator[asyncpg.Pool]:
    settings = PlacementSettings(nats_url=nats_url, database_url=fresh_database_dsn, http_port=0,
                                 log_level="WARNING", instance="pl-pool-test", cycle_interval_s=3600)
    rt = ServiceRuntime("placement", settings, migrations_package="services.placement")
    await rt.start()  # migrations applied; nothing consumes or schedules
    try:
        assert rt.pool is not None
        async with rt.pool.acquire() as conn:
            for n in ("n1", "n2", "n3"):
                await store.upsert_node(conn, node(n, *(f"{n}-g{i}" for i in range(4))))
        yield rt.pool
    finally:
        await rt.shutdown()


async def read(pool: asyncpg.Pool, known: WantedJobs) -> tuple[dict[str, dict], int, list[dict]]:
    """The nodes by name, how many came back whole, the GPUs; and checks the read equals a full one."""
    before = {id(r) for r in known.rows.values()}
    async with pool.acquire() as conn:
        state = await store.load_state(conn, WantedJobs(), None, known)
        full = await store.load_state(conn, WantedJobs(), None, WantedJobs("key"))
    assert state["nodes"] == full["nodes"] and state["gpus"] == full["gpus"]
    fresh = sum(1 for r in state["nodes"] if id(r) not in before)
    return {r["node"]: r for r in state["nodes"]}, fresh, state["gpus"]


async def test_only_changed_nodes_are_read_again_and_the_rest_stay_the_same_objects(pool) -> None:  # type: ignore[no-untyped-def]
    known = WantedJobs("key")
    first, fresh, gpus = await read(pool, known)
    assert sorted(first) == ["n1", "n2", "n3"] and fresh == 3 and len(gpus) == 12
    assert [g["idx"] for g in first["n1"]["gpus"]] == [0, 1, 2, 3]
    again, fresh, _ = await read(pool, known)
    assert fresh == 0 and all(again[n] is first[n] for n in first)

    async with pool.acquire() as conn:
        await store.set_gpu_health(conn, "n2-g1", "unhealthy")  # a GPU's change
        await store.set_node_schedulable(conn, "c", "n3", False)  # a node's
        await store.upsert_node(conn, node("n4", "n4-g0"))  # a new node
    now, fresh, _ = await read(pool, known)
    assert sorted(now) == ["n1", "n2", "n3", "n4"] and fresh == 3 and now["n1"] is first["n1"]
    assert now["n2"]["gpus"][1]["health"] == "unhealthy" and now["n3"]["schedulable"] is False

    async with pool.acquire() as conn:  # a GPU registered on another node: the node it left has one GPU less,
        await store.upsert_node(conn, node("n4", "n4-g0", "n1-g3"))  # an older version: the pool is read again
    now2, fresh, gpus = await read(pool, known)
    assert fresh == 4
    assert [g["uuid"] for g in now2["n1"]["gpus"]] == ["n1-g0", "n1-g1", "n1-g2"]
    assert [g["uuid"] for g in now2["n4"]["gpus"]] == ["n4-g0", "n1-g3"] and len(gpus) == 13


async def test_a_change_committed_after_a_read_that_could_not_see_it_is_read_next_time(pool) -> None:  # type: ignore[no-untyped-def]
    known = WantedJobs("key")
    await read(pool, known)
    # a writer takes its transaction id and changes n1's GPU, then a newer transaction changes n2 and commits; a
    # read happens while the first is still open: it sees n2 changed, not n1 (and its horizon must not pass n1)
    slow = await pool.acquire()
    try:
        tx = slow.transaction()
        await tx.start()
        await store.set_gpu_health(slow, "n1-g0", "unhealthy")
        async with pool.acquire() as conn:
            await store.set_node_schedulable(conn, "c", "n2", False)
        during, _, _ = await read(pool, known)
        assert during["n1"]["gpus"][0]["health"] == "healthy" and during["n2"]["schedulable"] is False
        await tx.commit()
    finally:
        await pool.release(slow)
    after, fresh, _ = await read(pool, known)
    assert after["n1"]["gpus"][0]["health"] == "unhealthy" and fresh == 2  # n2 too: newer than that horizon
