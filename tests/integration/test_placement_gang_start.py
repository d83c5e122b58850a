"""A gang's members start together, on a real PostgreSQL: each member's allocation waits until its agent reports
the grant applied, `allocation.gang_ready` goes to every member (in the transaction that saw the last one ready)
exactly once, and a gang not ready within GANG_START_TIMEOUT_S is stopped whole with reason GangStartTimeout."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from datetime import UTC, datetime

import pytest
from nats.js import JetStreamContext

from libs.contracts.commands import ListAllocations
from libs.contracts.envelope import CloudEvent, utcnow, uuid7
from libs.contracts.events import GpuSpec, JobSubmitted, NodeRegistered, WorkReady
from libs.contracts.work import WorkSpec
from libs.runtime.service import ServiceRuntime
from services.placement import store
from services.placement.config import PlacementSettings
from services.placement.handlers import PlacementHandlers

pytestmark = [pytest.mark.integration, pytest.mark.usefixtures("keep_test_logging_and_tracing")]
NOW = datetime(2026, 12, 1, tzinfo=UTC)


@pytest.fixture
async def placement(nats_url: str, fresh_database_dsn: str,
                    js: JetStreamContext) -> AsyncIterator[tuple[ServiceRuntime, PlacementHandlers]]:
    settings = PlacementSettings(nats_url=nats_url, database_url=fresh_database_dsn, http_port=0, log_level="WARNING",
                                 instance="pl-gang-test", cycle_interval_s=3600, gang_start_timeout_s=60)
    rt = ServiceRuntime("placement", settings, migrations_package="services.placement")
    await rt.start()
    try:
        assert rt.pool is not None
        async with rt.pool.acquire() as conn:
            for i in (1, 2):
                await store.upsert_node(conn, NodeRegistered(
                    cluster="c", node=f"n{i}", hostname=f"n{i}", cpu_count=64, memory_mib=512_000,
                    registered_at=NOW, address=f"10.0.0.{i}", labels={"gpupool.io/isolation.process": "true"},
                    gpus=[GpuSpec(uuid=f"N{i}G{g}", index=g, model="H100", memory_mib=81_920) for g in range(2)]))
        yield rt, PlacementHandlers(rt, settings)
    finally:
        await rt.shutdown()


async def want_gang(rt: ServiceRuntime, job_id: str) -> None:
    assert rt.pool is not None
    async with rt.pool.acquire() as conn:
        assert await store.add_pending(conn, JobSubmitted(
            job_id=job_id, name=job_id, team="ml", project="default", kind="training", priority_class="normal",
            priority=0, gpus=4, gang_nodes=2, gpus_per_node=2, submitted_at=NOW,
            work=WorkSpec(command=["python3", "train.py"])), None)


async def members(rt: ServiceRuntime, job_id: str) -> list:  # type: ignore[type-arg]
    assert rt.pool is not None
    return await rt.pool.fetch("""SELECT allocation_id, replica, node, attempt, gang_wait, ready_at, rendezvous_env
                                  FROM allocations WHERE job_id = $1 ORDER BY replica""", job_id)


async def outbox(rt: ServiceRuntime, subject: str) -> list[dict]:
    assert rt.pool is not None
    rows = await rt.pool.fetch("SELECT payload FROM outbox WHERE subject LIKE $1 ORDER BY seq", subject + "%")
    return [json.loads(r["payload"])["data"] for r in rows]


def ready(member, job_id: str) -> tuple[CloudEvent, WorkReady]:  # type: ignore[no-untyped-def]
    data = WorkReady(allocation_id=member["allocation_id"], job_id=job_id, team="ml", project="default",
                     cluster="c", node=member["node"], replica=member["replica"], attempt=member["attempt"],
                     ready_at=utcnow())
    return CloudEvent(id=uuid7(), source="/gpupool/agent/c/" + member["node"], type=data.event_type, time=utcnow(),
                      data=data.model_dump(mode="json")), data


async def test_the_gang_starts_once_every_member_is_ready_and_only_once(placement) -> None:  # type: ignore[no-untyped-def]
    rt, h = placement
    await want_gang(rt, "g")
    assert await h.run_cycle() == 1
    m = await members(rt, "g")
    assert [r["gang_wait"] for r in m] == [True, True] and {r["node"] for r in m} == {"n1", "n2"}
    master = json.loads(m[0]["rendezvous_env"])["PET_MASTER_ADDR"]
    assert master == f"10.0.0.{m[0]['node'][1]}"  # the rank-0 member's node, at the address it registered
    first = ready(m[0], "g")
    await h.on_work_ready(*first)
    await h.on_work_ready(*first)  # redelivered: counted once
    assert await outbox(rt, "gpupool.allocation.gang_ready") == []
    await h.on_work_ready(*ready(m[1], "g"))
    announced = await outbox(rt, "gpupool.allocation.gang_ready")
    assert sorted(a["allocation_id"] for a in announced) == sorted(r["allocation_id"] for r in m)
    assert all(a["members"] == 2 and a["gpus"] for a in announced)
    assert [r["gang_wait"] for r in await members(rt, "g")] == [False, False]
    await h.on_work_ready(*ready(m[1], "g"))  # a late repeat starts nothing again
    assert len(await outbox(rt, "gpupool.allocation.gang_ready")) == 2
    listed = (await h.list_allocations(ListAllocations(job_id="g", active=True, limit=10))).result["items"]
    assert [i["gang_wait"] for i in listed] == [False, False]
    # the listing gives each member the environment its work runs with (the agent launches a missed grant from it)
    assert [i["environment"]["CUDA_VISIBLE_DEVICES"] for i in listed] == [
        ",".join(g["uuid"] for g in i["gpus"]) for i in listed] and all(i["gpus"] for i in listed)
    assert [i["environment"]["GPUPOOL_ALLOCATION_ID"] for i in listed] == [i["allocation_id"] for i in listed]
    # an agent's resync asks for its own node's only
    for member in m:
        own = (await h.list_allocations(ListAllocations(active=True, limit=10, cluster="c", node=member["node"])))
        assert [(i["allocation_id"], i["node"]) for i in own.result["items"]] == [
            (member["allocation_id"], member["node"])]
    other = await h.list_allocations(ListAllocations(active=True, limit=10, cluster="elsewhere", node=m[0]["node"]))
    assert other.result["items"] == []


async def test_a_gang_not_ready_in_time_is_stopped_whole_and_a_ready_report_of_an_older_attempt_is_ignored(placement) -> None:  # type: ignore[no-untyped-def]
    rt, h = placement
    await want_gang(rt, "slow")
    assert await h.run_cycle() == 1
    m = await members(rt, "slow")
    stale_event, stale = ready(m[1], "slow")
    await h.on_work_ready(stale_event, stale.model_copy(update={"attempt": 5}))
    assert (await members(rt, "slow"))[1]["ready_at"] is None
    await h.on_work_ready(*ready(m[0], "slow"))  # one member ready, the other never
    assert rt.pool is not None
    await rt.pool.execute("UPDATE allocations SET granted_at = granted_at - interval '61 seconds'")
    assert await h.release_unstarted_gangs() == 1
    stops = await outbox(rt, "gpupool.allocation.preempting")
    assert sorted(s["allocation_id"] for s in stops) == sorted(r["allocation_id"] for r in m)
    assert {s["reason"] for s in stops} == {"GangStartTimeout"}
    assert await h.release_unstarted_gangs() == 0  # being stopped: not asked twice
    assert await outbox(rt, "gpupool.allocation.gang_ready") == []
