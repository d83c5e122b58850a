"""Inventory's health state machine, cordon, rollups and orphans against real NATS and PostgreSQL: the service's own
handlers run in a ServiceRuntime and are fed telemetry and allocation events exactly as the agent and placement
publish them; placement's read model (its own runtime) follows the health and cordon events."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable
from datetime import UTC, datetime, timedelta

import pytest
from inventory_under_test import running_inventory
from nats.js import JetStreamContext
from waiting import eventually

from libs.bus.publisher import publish_event
from libs.bus.rpc import request
from libs.contracts import subjects
from libs.contracts.commands import (
    CordonNode,
    GetPool,
    ListOrphans,
    NodeRef,
    RegisterNode,
    SetGpuHealth,
    SetGpuSharing,
)
from libs.contracts.envelope import CloudEvent
from libs.contracts.events import (
    EVENT_TYPES,
    AllocatedGpu,
    AllocationGranted,
    AllocationReleased,
    GpuHealthChanged,
    GpuSharingSet,
    GpuSpec,
    GpuTelemetry,
    NodeCordoned,
    NodeRegistered,
    NodeUncordoned,
    OrphanDetected,
    TelemetryRolledUp,
    TelemetrySampled,
)
from libs.contracts.subjects import EVENTS_STREAM, ROLLUPS_STREAM
from libs.runtime.service import ServiceRuntime
from services.inventory.handlers import InventoryHandlers
from services.placement.config import PlacementSettings
from services.placement.handlers import PlacementHandlers
from services.placement.handlers import routes as placement_routes

CLUSTER = "c1"
pytestmark = [pytest.mark.integration, pytest.mark.usefixtures("keep_test_logging_and_tracing")]


@pytest.fixture
async def inventory(nats_url: str, pg_database: str,
                    js: JetStreamContext) -> AsyncIterator[tuple[ServiceRuntime, InventoryHandlers]]:
    async with running_inventory(nats_url, pg_database, "inv-test", suspect_strikes=2, strike_gap_s=1,
                                 suspect_clear_s=5, recheck_after_s=4, probation_s=4, orphan_process_after_s=1,
                                 orphan_no_process_after_s=1) as running:
        yield running


def uuid(node: str, index: int) -> str:
    return f"GPU-{node}-{index}"


async def register(rt: ServiceRuntime, node: str, gpus: int = 2) -> None:
    cmd = RegisterNode(cluster=CLUSTER, node=node, hostname=node, cpu_count=64, memory_mib=512 * 1024,
                       gpus=[GpuSpec(uuid=uuid(node, i), index=i, model="H100-80GB", memory_mib=81559)
                             for i in range(gpus)])
    reply = await request(rt.nc, subjects.register_node(cmd.cluster, cmd.node), cmd, timeout=5)
    assert reply.ok, reply


async def send(js: JetStreamContext, node: str, at: datetime, gpus: int = 2, util: float = 0.0, procs: int = 0,
               **gpu0) -> None:  # type: ignore[no-untyped-def]
    """One sample of the node; `gpu0` overrides GPU 0's fields (xid_events, ecc counters, health reasons)."""
    samples = [GpuTelemetry(**{"uuid": uuid(node, i), "index": i, "utilization_gpu_pct": util,
                               "utilization_memory_pct": 0.0, "memory_used_mib": 100 * (i + 1),
                               "memory_total_mib": 81559, "power_w": 100.0 + i, "temperature_c": 40.0 + i,
                               "process_count": procs, **(gpu0 if i == 0 else {})})
               for i in range(gpus)]
    event = TelemetrySampled(cluster=CLUSTER, node=node, sampled_at=at, gpus=samples).to_cloudevent("/gpupool/agent")
    await publish_event(js, subjects.telemetry(CLUSTER, node), event)


async def events(js: JetStreamContext, kind: type, stream: str = EVENTS_STREAM.name) -> list:
    out = []
    last = (await js.stream_info(stream)).state.last_seq
    for seq in range(1, last + 1):
        msg = await js.get_msg(stream, seq)
        event = CloudEvent.model_validate_json(msg.data)
        if event.type == kind.event_type:
            out.append(EVENT_TYPES[event.type].model_validate(event.data))
    return out


async def wait_events(js: JetStreamContext, kind: type, n: int, stream: str = EVENTS_STREAM.name) -> list:
    async def enough() -> bool:
        return len(await events(js, kind, stream)) >= n

    await eventually(enough, what=f"{n} {kind.__name__}")
    return await events(js, kind, stream)


async def call(rt: ServiceRuntime, subject: str, cmd) -> dict:  # type: ignore[no-untyped-def]
    reply = await request(rt.nc, subject, cmd, timeout=5)
    assert reply.ok, reply
    return reply.result


async def test_a_fatal_xid_quarantines_a_gpu_which_returns_through_probation_after_clean_rechecks(
        inventory, js: JetStreamContext) -> None:  # type: ignore[no-untyped-def]
    rt, _ = inventory
    await register(rt, "n1")
    t0 = datetime.now(UTC)
    await send(js, "n1", t0)
    await send(js, "n1", t0 + timedelta(seconds=1), xid_events=[79], health="failed",
               health_reasons=["gpu_lost", "xid79:gpu_fallen_off_the_bus"])
    (quarantined,) = await wait_events(js, GpuHealthChanged, 1)
    assert (quarantined.gpu_uuid, quarantined.previous_state, quarantined.state) == (uuid("n1", 0), "healthy",
                                                                                     "quarantined")
    assert (quarantined.previous, quarantined.current, quarantined.reason) == ("healthy", "failed", "GpuLost")
    assert "xid79" in quarantined.reasons

    pool = (await call(rt, subjects.QUERY_INVENTORY_POOL, GetPool(cluster=CLUSTER)))["clusters"][0]
    (h100,) = pool["models"]
    assert (h100["quarantined"], h100["healthy"], h100["unhealthy_gpus"]) == (1, 1, [uuid("n1", 0)])
    assert pool["nodes"][0]["gpu_states"] == {"healthy": 1, "quarantined": 1}
    node = await call(rt, subjects.QUERY_INVENTORY_GET_NODE, NodeRef(node="n1"))
    assert [(g["state"], g["state_reason"]) for g in node["gpus"]] == [("quarantined", "GpuLost"),
                                                                       ("healthy", "")]

    # still off the bus: the recheck window keeps restarting; an agent restart does not forget the quarantine
    await send(js, "n1", t0 + timedelta(seconds=3), health="failed", health_reasons=["gpu_lost"])
    await register(rt, "n1")
    (*_, registered) = await wait_events(js, NodeRegistered, 2)
    assert (registered.gpus[0].state, registered.gpus[0].health) == ("quarantined", "failed")
    await send(js, "n1", t0 + timedelta(seconds=6))  # reset: clean, but 3 s after the last failure
    await asyncio.sleep(0.5)
    assert len(await events(js, GpuHealthChanged)) == 1
    await send(js, "n1", t0 + timedelta(seconds=7))  # clean for 4 s: probation
    _, probation = await wait_events(js, GpuHealthChanged, 2)
    assert (probation.state, probation.reason, probation.current) == ("probation", "RecheckPassed", "degraded")
    await send(js, "n1", t0 + timedelta(seconds=11))  # probation clean for 4 s: healthy
    *_, healthy = await wait_events(js, GpuHealthChanged, 3)
    assert (healthy.previous_state, healthy.state, healthy.reason) == ("probation", "healthy", "ProbationPassed")
    # the whole history: each transition once, though redelivered samples arrive again
    await send(js, "n1", t0 + timedelta(seconds=1), xid_events=[79], health="failed", health_reasons=["gpu_lost"])
    await asyncio.sleep(0.5)
    assert [e.state for e in await events(js, GpuHealthChanged)] == ["quarantined", "probation", "healthy"]


async def test_an_xid_storm_makes_a_gpu_suspect_then_quarantined_and_one_xid_alone_clears(
        inventory, js: JetStreamContext) -> None:  # type: ignore[no-untyped-def]
    rt, _ = inventory
    await register(rt, "storm")
    t0 = datetime.now(UTC)
    await send(js, "storm", t0, xid_events=[13])  # one application Xid: suspect
    (suspect,) = await wait_events(js, GpuHealthChanged, 1)
    assert (suspect.state, suspect.reason) == ("suspect", "NonFatalXid")
    await send(js, "storm", t0 + timedelta(seconds=6))  # quiet for suspect_clear_s: healthy
    _, cleared = await wait_events(js, GpuHealthChanged, 2)
    assert (cleared.state, cleared.reason) == ("healthy", "SuspectCleared")
    for k in range(4):  # a storm: an Xid 31 in every sample, 0.5 s apart → strikes 1 s apart
        await send(js, "storm", t0 + timedelta(seconds=7 + 0.5 * k), xid_events=[31])
    *_, storm = await wait_events(js, GpuHealthChanged, 4)
    assert [e.state for e in await events(js, GpuHealthChanged)] == ["suspect", "healthy", "suspect", "quarantined"]
    assert (storm.state, storm.reason) == ("quarantined", "RepeatedSuspect")


async def test_an_operator_quarantines_and_clears_a_gpu_and_sets_its_sharing_mode(
        inventory, js: JetStreamContext) -> None:  # type: ignore[no-untyped-def]
    rt, _ = inventory
    await register(rt, "ops")
    out = await call(rt, subjects.CMD_INVENTORY_SET_GPU_HEALTH,
                     SetGpuHealth(node="ops", index=1, action="quarantine", reason="fan noise", by="alice"))
    assert (out["before"], out["state"], out["changed"]) == ("healthy", "quarantined", True)
    (event,) = await wait_events(js, GpuHealthChanged, 1)
    assert (event.gpu_index, event.state, event.reason, event.by, event.reasons) == (
        1, "quarantined", "QuarantinedByOperator", "alice", ["fan noise"])
    again = await call(rt, subjects.CMD_INVENTORY_SET_GPU_HEALTH,
                       SetGpuHealth(node="ops", index=1, action="quarantine", by="alice"))
    assert again["changed"] is False
    cleared = await call(rt, subjects.CMD_INVENTORY_SET_GPU_HEALTH,
                         SetGpuHealth(node="ops", index=1, action="clear", by="bob"))
    assert (cleared["state"], cleared["reason"]) == ("probation", "ClearedByOperator")

    set_mode = await call(rt, subjects.CMD_INVENTORY_SET_GPU_SHARING,
                          SetGpuSharing(node="ops", index=0, mode="fractional", by="alice"))
    assert (set_mode["before"], set_mode["mode"], set_mode["changed"]) == ("exclusive", "fractional", True)
    assert (await call(rt, subjects.CMD_INVENTORY_SET_GPU_SHARING,
                       SetGpuSharing(node="ops", index=0, mode="fractional")))["changed"] is False
    (sharing,) = await wait_events(js, GpuSharingSet, 1)
    assert (sharing.gpu_uuid, sharing.mode, sharing.set_by) == (uuid("ops", 0), "fractional", "alice")
    node = await call(rt, subjects.QUERY_INVENTORY_GET_NODE, NodeRef(cluster=CLUSTER, node="ops"))
    assert [g["sharing"] for g in node["gpus"]] == ["fractional", "exclusive"]
    pool = (await call(rt, subjects.QUERY_INVENTORY_POOL, GetPool(cluster=CLUSTER)))["clusters"][0]
    assert pool["nodes"][0]["sharing"] == {"exclusive": 1, "fractional": 1}

    missing = await request(rt.nc, subjects.CMD_INVENTORY_SET_GPU_HEALTH,
                            SetGpuHealth(node="ops", index=7, action="clear"), timeout=5)
    assert not missing.ok and (missing.error.status, missing.error.reason) == (404, "GpuNotFound")
    nowhere = await request(rt.nc, subjects.CMD_INVENTORY_CORDON_NODE, CordonNode(node="nope", action="cordon"),
                            timeout=5)
    assert not nowhere.ok and (nowhere.error.status, nowhere.error.reason) == (404, "NodeNotFound")


async def test_a_cordoned_node_takes_no_new_work_in_placement_even_after_it_was_lost_and_recovered(
        inventory, js: JetStreamContext, nats_url: str, fresh_database_dsn: str) -> None:  # type: ignore[no-untyped-def]
    rt, handlers = inventory
    settings = PlacementSettings(nats_url=nats_url, database_url=fresh_database_dsn, http_port=0, log_level="WARNING",
                                 instance="pl-test", cycle_interval_s=3600)
    placement = ServiceRuntime("placement", settings, migrations_package="services.placement")
    await placement.start()
    try:
        await placement.mount(placement_routes(PlacementHandlers(placement, settings)))
        assert placement.pool is not None
        pool = placement.pool

        async def schedulable() -> bool | None:
            return await pool.fetchval("SELECT schedulable FROM nodes WHERE node = 'c'")

        await register(rt, "c")
        await eventually(lambda: _is(schedulable, True), what="placement learns the node")
        out = await call(rt, subjects.CMD_INVENTORY_CORDON_NODE,
                         CordonNode(node="c", action="cordon", reason="kernel upgrade", by="ops"))
        assert out["changed"] and out["node"]["cordoned"] and out["node"]["cordon"]["reason"] == "kernel upgrade"
        assert not (await call(rt, subjects.CMD_INVENTORY_CORDON_NODE, CordonNode(node="c", action="cordon")))["changed"]
        (cordoned,) = await wait_events(js, NodeCordoned, 1)
        assert (cordoned.node, cordoned.drain, cordoned.by) == ("c", False, "ops")
        await eventually(lambda: _is(schedulable, False), what="placement stops placing on the cordoned node")

        # lost (swept as if long silent), then back with a fresh sample: still cordoned, still not schedulable
        await handlers.sweep_lost_nodes(datetime.now(UTC) + timedelta(seconds=60))
        await send(js, "c", datetime.now(UTC) + timedelta(seconds=1))
        recovered = await wait_events(js, EVENT_TYPES["io.gpupool.node.recovered.v1"], 1)
        assert recovered[0].cordoned is True
        await asyncio.sleep(0.5)
        assert await schedulable() is False
        pool_doc = (await call(rt, subjects.QUERY_INVENTORY_POOL, GetPool()))["clusters"][0]
        assert pool_doc["models"][0]["cordoned"] == 2 and pool_doc["models"][0]["healthy"] == 0

        # a drain of the cordoned node is still a drain; uncordon makes it schedulable again
        assert (await call(rt, subjects.CMD_INVENTORY_CORDON_NODE, CordonNode(node="c", action="drain")))["changed"]
        _, drained = await wait_events(js, NodeCordoned, 2)
        assert drained.drain is True
        out = await call(rt, subjects.CMD_INVENTORY_CORDON_NODE, CordonNode(node="c", action="uncordon", by="ops"))
        assert out["changed"] and not out["node"]["cordoned"] and not out["node"]["drained"]
        (uncordoned,) = await wait_events(js, NodeUncordoned, 1)
        assert (uncordoned.node_state, uncordoned.by) == ("ready", "ops")
        await eventually(lambda: _is(schedulable, True), what="placement places on the uncordoned node again")
    finally:
        await placement.shutdown()


async def _is(probe: Callable[[], Awaitable[object]], expected: object) -> bool:
    return await probe() == expected


async def test_one_minute_rollups_are_emitted_once_per_node_and_minute_with_the_minutes_figures(
        inventory, js: JetStreamContext) -> None:  # type: ignore[no-untyped-def]
    rt, handlers = inventory
    await register(rt, "r")
    minute = (datetime.now(UTC) - timedelta(minutes=3)).replace(second=0, microsecond=0)
    for k, util in enumerate((10.0, 30.0, 80.0)):
        await send(js, "r", minute + timedelta(seconds=10 * k), util=util, procs=k)
    await send(js, "r", minute + timedelta(seconds=65), util=50.0)  # the next minute
    await send(js, "r", datetime.now(UTC), util=5.0)  # this minute: still open

    async def applied() -> bool:
        return handlers.samples_applied >= 5 * 2

    await eventually(applied, what="the samples applied")
    emitted = await handlers.close_rollups()
    assert [(e.node, e.window_start) for e in emitted] == [("r", minute), ("r", minute + timedelta(minutes=1))]
    rolled = await wait_events(js, TelemetryRolledUp, 2, stream=ROLLUPS_STREAM.name)
    first = rolled[0]
    assert (first.cluster, first.window_end - first.window_start) == (CLUSTER, timedelta(seconds=60))
    g0, g1 = first.gpus
    assert (g0.uuid, g0.index, g0.samples) == (uuid("r", 0), 0, 3)
    assert g0.utilization_avg_pct == pytest.approx(40.0) and g0.utilization_max_pct == 80.0
    assert (g1.memory_used_avg_mib, g1.memory_used_max_mib, g1.power_avg_w, g1.temperature_max_c) == (
        200.0, 200, 101.0, 41.0)
    assert g0.process_count_max == 2
    assert rolled[1].gpus[0].samples == 1 and rolled[1].gpus[0].utilization_avg_pct == 50.0
    msg = await js.get_msg(ROLLUPS_STREAM.name, 1)
    assert msg.subject == subjects.rollup(CLUSTER, "r")
    assert await handlers.close_rollups() == []  # each minute once


async def test_orphans_a_process_on_an_unheld_gpu_and_an_allocation_whose_gpus_run_nothing(
        inventory, js: JetStreamContext) -> None:  # type: ignore[no-untyped-def]
    rt, handlers = inventory
    await register(rt, "o", gpus=2)
    granted = datetime.now(UTC)
    grant = AllocationGranted(allocation_id="a-1", job_id="j-1", team="research", project="default", cluster=CLUSTER,
                              node="o", gpus=[AllocatedGpu(uuid=uuid("o", 1), index=1, model="H100-80GB")],
                              granted_at=granted, kind="dev")
    await publish_event(js, subjects.ALLOCATION_GRANTED, grant.to_cloudevent("/gpupool/placement"))
    await eventually(lambda: _held(rt), what="inventory learns the allocation")
    # GPU 0 runs a process nobody was allocated; GPU 1 (allocated) runs nothing
    await send(js, "o", datetime.now(UTC), procs=0, process_count=1)
    await asyncio.sleep(1.2)
    await send(js, "o", datetime.now(UTC), procs=0, process_count=1)
    await eventually(lambda: handlers.samples_applied >= 4, what="samples applied")
    found = await handlers.detect_orphans()
    by_kind = {o.orphan: o for o in found}
    assert set(by_kind) == {"process_without_allocation", "allocation_without_process"}
    rogue = by_kind["process_without_allocation"]
    assert (rogue.gpu_uuid, rogue.allocation_id) == (uuid("o", 0), None)
    idle = by_kind["allocation_without_process"]
    assert (idle.gpu_uuid, idle.allocation_id, idle.job_id, idle.team) == (uuid("o", 1), "a-1", "j-1", "research")
    assert idle.since == granted
    assert len(await wait_events(js, OrphanDetected, 2)) == 2
    assert await handlers.detect_orphans() == []  # reported once while it lasts
    listed = await call(rt, subjects.QUERY_INVENTORY_ORPHANS, ListOrphans(cluster=CLUSTER))
    assert sorted(o["kind"] for o in listed["items"]) == ["allocation_without_process", "process_without_allocation"]

    # the allocation is released: its report closes; the rogue process stops: that one closes too
    released = AllocationReleased(allocation_id="a-1", job_id="j-1", team="research", project="default",
                                  cluster=CLUSTER, node="o", gpus=grant.gpus, granted_at=granted,
                                  released_at=datetime.now(UTC), reason="JobCompleted")
    await publish_event(js, subjects.ALLOCATION_RELEASED, released.to_cloudevent("/gpupool/placement"))
    await eventually(lambda: _held(rt, 0), what="inventory learns the release")
    await send(js, "o", datetime.now(UTC), procs=0)
    await eventually(lambda: handlers.samples_applied >= 6, what="samples applied")
    assert await handlers.detect_orphans() == []
    assert (await call(rt, subjects.QUERY_INVENTORY_ORPHANS, ListOrphans()))["items"] == []
    assert len((await call(rt, subjects.QUERY_INVENTORY_ORPHANS, ListOrphans(open_only=False)))["items"]) == 2


async def _held(rt: ServiceRuntime, n: int = 1) -> bool:
    assert rt.pool is not None
    return await rt.pool.fetchval("SELECT count(*) FROM held_allocations") == n
