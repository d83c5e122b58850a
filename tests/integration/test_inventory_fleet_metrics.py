"""Inventory's fleet gauges (services/inventory/fleet_metrics.py) from its real tables: GPUs per health state,
nodes per state, GPUs held and held-but-idle. The alert rules (deploy/prometheus/rules/gpupool.yml) read them."""

from __future__ import annotations

from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta

import pytest
from inventory_under_test import running_inventory
from nats.js import JetStreamContext
from prometheus_client import REGISTRY
from waiting import eventually

from libs.bus.publisher import publish_event
from libs.bus.rpc import request
from libs.contracts import subjects
from libs.contracts.commands import RegisterNode, SetGpuHealth
from libs.contracts.events import AllocatedGpu, AllocationGranted, GpuSpec, GpuTelemetry, TelemetrySampled
from libs.runtime.service import ServiceRuntime
from services.inventory.fleet_metrics import report_fleet
from services.inventory.handlers import InventoryHandlers

CLUSTER = "fm"
MODEL = "H100-80GB"
pytestmark = [pytest.mark.integration, pytest.mark.usefixtures("keep_test_logging_and_tracing")]


@pytest.fixture
async def inventory(nats_url: str, pg_database: str,
                    js: JetStreamContext) -> AsyncIterator[tuple[ServiceRuntime, InventoryHandlers]]:
    async with running_inventory(nats_url, pg_database, "inv-fleet-metrics") as running:
        yield running


def gauge(name: str, **labels: str) -> float | None:
    return REGISTRY.get_sample_value(name, labels)


async def register(rt: ServiceRuntime, node: str) -> None:
    cmd = RegisterNode(cluster=CLUSTER, node=node, hostname=node, cpu_count=8, memory_mib=64 * 1024,
                       gpus=[GpuSpec(uuid=f"GPU-{node}-{i}", index=i, model=MODEL, memory_mib=81559)
                             for i in range(2)])
    assert (await request(rt.nc, subjects.register_node(CLUSTER, node), cmd, timeout=5)).ok


async def grant(js: JetStreamContext, allocation_id: str, node: str, index: int) -> None:
    event = AllocationGranted(allocation_id=allocation_id, job_id=f"j-{allocation_id}", team="research",
                              project="default", cluster=CLUSTER, node=node,
                              gpus=[AllocatedGpu(uuid=f"GPU-{node}-{index}", index=index, model=MODEL)],
                              granted_at=datetime.now(UTC), kind="dev")
    await publish_event(js, subjects.ALLOCATION_GRANTED, event.to_cloudevent("/gpupool/placement"))


async def test_fleet_gauges_count_health_states_nodes_and_idle_held_gpus(
        inventory, js: JetStreamContext) -> None:  # type: ignore[no-untyped-def]
    rt, handlers = inventory
    await register(rt, "a")
    await register(rt, "b")
    quarantine = SetGpuHealth(cluster=CLUSTER, node="b", index=1, action="quarantine", by="ops")
    assert (await request(rt.nc, subjects.CMD_INVENTORY_SET_GPU_HEALTH, quarantine, timeout=5)).ok
    await grant(js, "busy", "a", 0)
    await grant(js, "idle", "a", 1)
    sample = TelemetrySampled(cluster=CLUSTER, node="a", sampled_at=datetime.now(UTC), gpus=[
        GpuTelemetry(uuid=f"GPU-a-{i}", index=i, utilization_gpu_pct=90.0 if i == 0 else 0.0,
                     utilization_memory_pct=0.0, memory_used_mib=100, memory_total_mib=81559, power_w=100.0,
                     temperature_c=40.0, process_count=1 if i == 0 else 0) for i in range(2)])
    await publish_event(js, subjects.telemetry(CLUSTER, "a"), sample.to_cloudevent("/gpupool/agent"))

    async def learned() -> bool:
        assert rt.pool is not None
        return (await rt.pool.fetchval("SELECT count(*) FROM held_allocations") == 2
                and handlers.samples_applied >= 2)

    await eventually(learned, what="inventory holds both allocations and applied the sample")
    await report_fleet(rt, handlers.settings)
    by = {"cluster": CLUSTER, "gpu_model": MODEL}
    assert gauge("gpupool_inventory_gpus", **by, state="quarantined") == 1
    assert gauge("gpupool_inventory_gpus", **by, state="healthy") == 3
    assert gauge("gpupool_inventory_gpus", **by, state="suspect") == 0
    assert gauge("gpupool_inventory_held_gpus", **by) == 2
    assert gauge("gpupool_inventory_held_idle_gpus", **by) == 1
    assert gauge("gpupool_inventory_nodes", cluster=CLUSTER, state="ready") == 2
    assert gauge("gpupool_inventory_nodes", cluster=CLUSTER, state="lost") == 0

    assert len(await handlers.sweep_lost_nodes(now=datetime.now(UTC) + timedelta(hours=1))) == 2
    await report_fleet(rt, handlers.settings)
    assert gauge("gpupool_inventory_nodes", cluster=CLUSTER, state="lost") == 2
    assert gauge("gpupool_inventory_nodes", cluster=CLUSTER, state="ready") == 0
