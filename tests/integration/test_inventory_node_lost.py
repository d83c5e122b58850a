"""Node lost / recovered against real NATS and PostgreSQL: the inventory service's own handlers and sweeper run in a
ServiceRuntime, fed by telemetry published as the agent publishes it. A node that stops sending is declared lost
with one NodeLost on the events stream; it recovers with NodeRecovered when it reports again (a fresh sample or a
re-registration). Placement, consuming those events, stops placing on the lost node and resumes after recovery."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable
from datetime import UTC, datetime, timedelta

import pytest
from nats.js import JetStreamContext
from waiting import eventually

from libs.bus.publisher import publish_event
from libs.bus.rpc import request
from libs.contracts import subjects
from libs.contracts.commands import GetPool, ListNodes, RegisterNode
from libs.contracts.envelope import CloudEvent
from libs.contracts.events import (
    EVENT_TYPES,
    GpuSpec,
    GpuTelemetry,
    JobSubmitted,
    NodeLost,
    NodeRecovered,
    TelemetrySampled,
)
from libs.contracts.subjects import EVENTS_STREAM
from libs.runtime.service import ServiceRuntime
from services.inventory.config import InventorySettings
from services.inventory.domain import LOST_PATIENCE
from services.inventory.handlers import InventoryHandlers
from services.inventory.handlers import routes as inventory_routes
from services.placement.config import PlacementSettings
from services.placement.handlers import PlacementHandlers
from services.placement.handlers import routes as placement_routes

LOST_AFTER_S = 1.5
CLUSTER = "c1"

pytestmark = [pytest.mark.integration, pytest.mark.usefixtures("keep_test_logging_and_tracing")]


@pytest.fixture
async def inventory(nats_url: str, pg_database: str, js: JetStreamContext) -> AsyncIterator[ServiceRuntime]:
    settings = InventorySettings(nats_url=nats_url, database_url=pg_database, http_port=0, log_level="WARNING",
                                 node_lost_after_s=LOST_AFTER_S, node_sweep_interval_s=0.1, instance="inv-test")
    rt = ServiceRuntime("inventory", settings, migrations_package="services.inventory")
    await rt.start()
    handlers = InventoryHandlers(rt, settings)
    await rt.mount(inventory_routes(handlers))
    rt.background(handlers.node_sweeper(), "node-sweeper")
    try:
        yield rt
    finally:
        await rt.shutdown()


def gpu_uuid(node: str, index: int) -> str:
    return f"GPU-{node}-{index}"


async def register(rt: ServiceRuntime, node: str) -> None:
    cmd = RegisterNode(cluster=CLUSTER, node=node, hostname=node, cpu_count=64, memory_mib=512 * 1024,
                       driver_version="550.90.07", agent_version="test",
                       gpus=[GpuSpec(uuid=gpu_uuid(node, i), index=i, model="H100-80GB", memory_mib=81559)
                             for i in range(2)])
    reply = await request(rt.nc, subjects.register_node(cmd.cluster, cmd.node), cmd, timeout=5)
    assert reply.ok, reply


def sample(node: str, at: datetime, util: tuple[float, float] = (0.0, 0.0)) -> CloudEvent:
    return TelemetrySampled(cluster=CLUSTER, node=node, sampled_at=at, cpu_util_pct=12.5, memory_used_mib=4096,
                            gpus=[GpuTelemetry(uuid=gpu_uuid(node, i), index=i, utilization_gpu_pct=util[i],
                                               utilization_memory_pct=0.0, memory_used_mib=0, memory_total_mib=81559)
                                  for i in range(2)]).to_cloudevent("/gpupool/agent")


async def send(js: JetStreamContext, node: str, at: datetime | None = None,
               util: tuple[float, float] = (0.0, 0.0)) -> CloudEvent:
    event = sample(node, at or datetime.now(UTC), util)
    await publish_event(js, subjects.telemetry(CLUSTER, node), event)
    return event


async def node_events(js: JetStreamContext) -> list[tuple[CloudEvent, object]]:
    """Every node lost/recovered event on the events stream, in stream order."""
    out = []
    last = (await js.stream_info(EVENTS_STREAM.name)).state.last_seq
    for seq in range(1, last + 1):
        msg = await js.get_msg(EVENTS_STREAM.name, seq)
        if msg.subject in (subjects.NODE_LOST, subjects.NODE_RECOVERED):
            event = CloudEvent.model_validate_json(msg.data)
            out.append((event, EVENT_TYPES[event.type].model_validate(event.data)))
    return out


async def states(rt: ServiceRuntime) -> dict[str, str]:
    reply = await request(rt.nc, subjects.QUERY_INVENTORY_LIST_NODES, ListNodes(cluster=CLUSTER), timeout=5)
    return {n["node"]: n["state"] for n in reply.result["items"]}


async def test_a_silent_node_is_declared_lost_once_and_recovers_when_it_reports_again(
        inventory: ServiceRuntime, js: JetStreamContext) -> None:
    await register(inventory, "quiet")
    await register(inventory, "chatty")
    stop = asyncio.Event()

    async def chatty_agent() -> None:  # keeps heartbeating throughout: must never be declared lost
        while not stop.is_set():
            await send(js, "chatty")
            await asyncio.sleep(0.2)

    heartbeats = asyncio.create_task(chatty_agent())
    try:
        last_quiet = await send(js, "quiet")  # one sample, then silence

        async def quiet_lost() -> bool:
            return any(isinstance(d, NodeLost) for _, d in await node_events(js))

        await eventually(quiet_lost, what="NodeLost for the silent node")
        (event, lost), = await node_events(js)
        assert event.type == "io.gpupool.node.lost.v1" and event.source == "/gpupool/inventory"
        assert event.subject == "quiet"
        assert isinstance(lost, NodeLost) and (lost.cluster, lost.node) == (CLUSTER, "quiet")
        assert lost.last_seen_at == datetime.fromisoformat(last_quiet.data["sampled_at"])
        assert lost.detected_at - lost.last_seen_at >= timedelta(seconds=LOST_AFTER_S)
        assert await states(inventory) == {"quiet": "lost", "chatty": "ready"}

        await asyncio.sleep(4 * 0.1 + 0.3)  # several more sweeps: still exactly one NodeLost
        assert len(await node_events(js)) == 1

        # a redelivered old sample is not a sign of life
        await publish_event(js, subjects.telemetry(CLUSTER, "quiet"),
                            sample("quiet", datetime.fromisoformat(last_quiet.data["sampled_at"])))
        await asyncio.sleep(0.5)
        assert await states(inventory) == {"quiet": "lost", "chatty": "ready"}

        back = await send(js, "quiet")  # the node reports again

        async def recovered() -> bool:
            return len(await node_events(js)) == 2

        await eventually(recovered, what="NodeRecovered")
        event, rec = (await node_events(js))[1]
        assert event.type == "io.gpupool.node.recovered.v1" and event.subject == "quiet"
        assert isinstance(rec, NodeRecovered) and rec.lost_at == lost.detected_at
        assert rec.last_seen_at == datetime.fromisoformat(back.data["sampled_at"])
        assert await states(inventory) == {"quiet": "ready", "chatty": "ready"}

        # lost again, then its agent restarts and re-registers: that recovers it too
        await eventually(lambda: _count(js, NodeLost, 2), what="second NodeLost")
        await register(inventory, "quiet")
        await eventually(lambda: _count(js, NodeRecovered, 2), what="NodeRecovered on re-registration")
        assert await states(inventory) == {"quiet": "ready", "chatty": "ready"}
        assert all(d.node == "quiet" for _, d in await node_events(js))  # the heartbeating node never flapped
    finally:
        stop.set()
        await heartbeats


async def _count(js: JetStreamContext, kind: type, n: int) -> bool:
    return sum(isinstance(d, kind) for _, d in await node_events(js)) == n


async def test_placement_stops_placing_on_a_lost_node_and_resumes_when_it_recovers(
        inventory: ServiceRuntime, js: JetStreamContext, nats_url: str, fresh_database_dsn: str) -> None:
    settings = PlacementSettings(nats_url=nats_url, database_url=fresh_database_dsn, http_port=0, log_level="WARNING",
                                 instance="pl-test", cycle_interval_s=3600)
    placement = ServiceRuntime("placement", settings, migrations_package="services.placement")
    await placement.start()
    try:
        handlers = PlacementHandlers(placement, settings)
        await placement.mount(placement_routes(handlers))
        assert placement.pool is not None
        pool = placement.pool

        async def schedulable() -> bool | None:
            return await pool.fetchval("SELECT schedulable FROM nodes WHERE cluster = $1 AND node = 'n1'", CLUSTER)

        await register(inventory, "n1")
        await send(js, "n1")
        await eventually(lambda: _is(schedulable, True), what="placement learns the node")
        await eventually(lambda: _is(schedulable, False), what="placement marks the lost node unschedulable")

        job = JobSubmitted(job_id="j-1", name="train", team="ml", project="default", kind="training",
                           priority_class="normal", priority=500, gpus=1, submitted_at=datetime.now(UTC))
        await publish_event(js, subjects.JOB_SUBMITTED, job.to_cloudevent("/gpupool/queue"))

        async def pending() -> bool:
            return await pool.fetchval("SELECT count(*) FROM pending_jobs") == 1

        await eventually(pending, what="the job reaches placement")
        assert await handlers.run_cycle() == 0  # the only node is lost: nothing is placed on it
        assert await pool.fetchval("SELECT count(*) FROM allocations") == 0

        await send(js, "n1")
        await eventually(lambda: _is(schedulable, True), what="placement marks the recovered node schedulable")
        assert await handlers.run_cycle() == 1
        assert await pool.fetchval("SELECT node FROM allocations WHERE job_id = 'j-1'") == "n1"
    finally:
        await placement.shutdown()


async def _is(probe: Callable[[], Awaitable[object]], expected: object) -> bool:
    return await probe() == expected


async def test_pool_query_counts_use_from_fresh_samples_only_and_takes_lost_nodes_out_of_healthy(
        inventory: ServiceRuntime, js: JetStreamContext) -> None:
    await register(inventory, "busy")
    await register(inventory, "stale")
    await send(js, "busy", util=(50.0, 2.0))  # GPU 0 in use, GPU 1 under the 5 % threshold
    old = datetime.now(UTC) - timedelta(seconds=10 * LOST_AFTER_S)
    await send(js, "stale", at=old, util=(90.0, 90.0))  # busy, but too old to say anything about now

    async def pool() -> dict:
        reply = await request(inventory.nc, subjects.QUERY_INVENTORY_POOL, GetPool(cluster=CLUSTER), timeout=5)
        assert reply.ok, reply
        return reply.result

    async def samples_stored() -> bool:
        nodes = (await request(inventory.nc, subjects.QUERY_INVENTORY_LIST_NODES, ListNodes(), timeout=5)).result
        return all(g["telemetry"] for n in nodes["items"] for g in n["gpus"])

    await eventually(samples_stored, what="both samples applied")
    answer = await pool()
    (cluster,) = answer["clusters"]
    (h100,) = cluster["models"]
    assert h100["model"] == "H100-80GB" and h100["total"] == 4 and h100["healthy"] == 4
    assert h100["in_use"] == 1 and h100["in_use_gpus"] == [gpu_uuid("busy", 0)]
    assert h100["unhealthy"] == 0 and h100["on_lost_nodes"] == 0
    assert answer["all"]["totals"]["total"] == 4 and answer["fresh_within_s"] == LOST_AFTER_S
    nodes = {n["node"]: n for n in cluster["nodes"]}
    assert nodes["busy"]["cpu_util_pct"] == 12.5 and nodes["busy"]["memory_mib"] == 512 * 1024
    assert nodes["busy"]["gpus"] == 2 and nodes["busy"]["cpu_count"] == 64

    stop = asyncio.Event()

    async def heartbeat() -> None:
        while not stop.is_set():
            await send(js, "busy", util=(50.0, 2.0))
            await asyncio.sleep(0.2)

    task = asyncio.create_task(heartbeat())
    try:
        await eventually(lambda: _count(js, NodeLost, 1), what="the stale node declared lost")
        (h100,) = (await pool())["clusters"][0]["models"]
        assert h100["on_lost_nodes"] == 2 and h100["healthy"] == 2 and h100["unhealthy"] == 2
        assert sorted(h100["unhealthy_gpus"]) == [gpu_uuid("stale", 0), gpu_uuid("stale", 1)]
        assert h100["in_use_gpus"] == [gpu_uuid("busy", 0)]
    finally:
        stop.set()
        await task


async def test_a_registration_on_another_nodes_subject_is_refused(inventory) -> None:  # type: ignore[no-untyped-def]
    """Only a node's own identity may publish on its registration subject; a payload there naming another node (a
    phantom, once registered and given a real job) is refused, and the phantom never appears."""
    rt = inventory
    await register(rt, "honest")
    phantom = RegisterNode(cluster=CLUSTER, node="phantom", hostname="phantom", cpu_count=1, memory_mib=1024,
                           gpus=[GpuSpec(uuid="GPU-phantom-0", index=0, model="H100-80GB", memory_mib=81559)])
    reply = await request(rt.nc, subjects.register_node(CLUSTER, "honest"), phantom, timeout=5)
    assert not reply.ok and reply.error is not None and reply.error.reason == "WrongSubject", reply
    nodes = await request(rt.nc, subjects.QUERY_INVENTORY_LIST_NODES, ListNodes(cluster=CLUSTER), timeout=5)
    assert "phantom" not in {n["node"] for n in nodes.result["items"]}


async def test_a_fleet_silent_all_at_once_is_given_longer_than_one_node_silent_alone(
        inventory: ServiceRuntime, js: JetStreamContext) -> None:
    """Every node's reports stop together (the bus or inventory falling behind, or a fleet's agent process starved
    of CPU): nodes are judged against the newest report, so only one silent well before the rest is lost at once;
    the others are lost only after `LOST_PATIENCE` thresholds without any report."""
    for node in ("a", "b", "c"):
        await register(inventory, node)
    t0 = datetime.now(UTC)
    await send(js, "a", t0)
    await send(js, "b", t0)
    assert inventory.pool is not None
    pool = inventory.pool

    async def applied() -> bool:
        return await pool.fetchval("SELECT count(*) FROM nodes WHERE node <> 'c' AND last_seen_at >= $1", t0) == 2

    await eventually(applied, what="the samples applied")
    await pool.execute("UPDATE nodes SET last_seen_at = $1 WHERE node = 'c'", t0 - timedelta(seconds=20))
    settings = InventorySettings(nats_url="nats://unused", database_url="postgresql://unused",
                                 node_lost_after_s=LOST_AFTER_S, instance="inv-test-sweep")
    sweeper = InventoryHandlers(inventory, settings)
    # 3 s later, nobody has reported for twice the threshold: c, silent 20 s before the others, is lost; a and b wait
    await sweeper.sweep_lost_nodes(now=t0 + timedelta(seconds=3))
    assert await states(inventory) == {"a": "ready", "b": "ready", "c": "lost"}
    # past the patience, the silence counts: a and b are lost too
    patience = LOST_PATIENCE * LOST_AFTER_S
    lost = await sweeper.sweep_lost_nodes(now=t0 + timedelta(seconds=patience + 1))
    assert await states(inventory) == {"a": "lost", "b": "lost", "c": "lost"}
    assert sorted(e.node for e in lost) in (["a", "b"], [])  # ([]: the service's own sweeper got there first)
