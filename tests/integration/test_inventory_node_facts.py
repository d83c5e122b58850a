"""A node's host facts against real NATS and PostgreSQL: the network interfaces and volumes it registers and the
node-level numbers its telemetry carries reach the node view, the pool's per-node entry and the cluster's node
totals; a node registered by an older agent (no such facts) still registers and shows empty lists and None."""

from __future__ import annotations

from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta

import pytest
from inventory_under_test import running_inventory

from libs.bus.rpc import request
from libs.contracts import subjects
from libs.contracts.commands import GetPool, ListNodes, NodeRef, RegisterNode
from libs.contracts.envelope import CloudEvent
from libs.contracts.events import GpuSpec, GpuTelemetry, NicSpec, TelemetrySampled, VolumeSpec
from libs.runtime.service import ServiceRuntime
from services.inventory.handlers import InventoryHandlers

CLUSTER = "facts"
pytestmark = [pytest.mark.integration, pytest.mark.usefixtures("keep_test_logging_and_tracing")]


@pytest.fixture
async def inventory(nats_url: str, pg_database: str) -> AsyncIterator[tuple[ServiceRuntime, InventoryHandlers]]:
    async with running_inventory(nats_url, pg_database, "inv-facts-test") as running:
        yield running


async def call(rt: ServiceRuntime, subject: str, cmd) -> dict:  # type: ignore[no-untyped-def]
    reply = await request(rt.nc, subject, cmd, timeout=5)
    assert reply.ok, reply
    return reply.result


def gpus(node: str) -> list[GpuSpec]:
    return [GpuSpec(uuid=f"GPU-{node}-0", index=0, model="H100-80GB", memory_mib=81559)]


def sample(node: str, at: datetime, **node_numbers: float) -> tuple[CloudEvent, TelemetrySampled]:
    s = TelemetrySampled(cluster=CLUSTER, node=node, sampled_at=at, gpus=[
        GpuTelemetry(uuid=f"GPU-{node}-0", index=0, utilization_gpu_pct=50.0, utilization_memory_pct=1.0,
                     memory_used_mib=1000, memory_total_mib=81559)], **node_numbers)
    return s.to_cloudevent("/gpupool/agent"), s


NICS = [NicSpec(name=f"mlx5_{i}", kind="infiniband", speed_mbps=400_000) for i in range(8)] + [
    NicSpec(name="eth0", kind="ethernet", speed_mbps=100_000), NicSpec(name="eth1", kind="ethernet"),
]
VOLUMES = [VolumeSpec(mount="/", total_gib=447.1, filesystem="ext4"),
           VolumeSpec(mount="/scratch", total_gib=28000.0, filesystem="xfs")]


async def test_registered_network_and_storage_and_reported_node_numbers_show_in_node_and_pool_views(
        inventory) -> None:  # type: ignore[no-untyped-def]
    rt, handlers = inventory
    await call(rt, subjects.register_node(CLUSTER, "big"), RegisterNode(
        cluster=CLUSTER, node="big", hostname="big", cpu_count=192, memory_mib=2048 * 1024, gpus=gpus("big"),
        network=NICS, storage=VOLUMES))
    # an older agent: no network, no storage, no node numbers in its samples
    await call(rt, subjects.register_node(CLUSTER, "old"), RegisterNode(
        cluster=CLUSTER, node="old", hostname="old", cpu_count=32, memory_mib=256 * 1024, gpus=gpus("old")))
    now = datetime.now(UTC)
    await handlers.on_telemetry_batch([
        sample("big", now - timedelta(seconds=2), cpu_util_pct=10.0, memory_used_mib=1000, network_rx_mbps=1.0,
               network_tx_mbps=2.0, storage_used_gib=3.0),
        sample("big", now - timedelta(seconds=1), cpu_util_pct=42.5, memory_used_mib=900_000,
               network_rx_mbps=12_500.5, network_tx_mbps=8_000.0, storage_used_gib=1234.5),
        sample("old", now - timedelta(seconds=1))])
    # a later sample that leaves the node numbers out keeps the last ones
    await handlers.on_telemetry_batch([sample("big", now)])

    big = await call(rt, subjects.QUERY_INVENTORY_GET_NODE, NodeRef(cluster=CLUSTER, node="big"))
    assert (big["cpu_count"], big["cpu_util_pct"], big["memory_mib"], big["memory_used_mib"]) == (
        192, 42.5, 2048 * 1024, 900_000)
    assert big["network"] == {"interfaces": [n.model_dump() for n in NICS], "link_gbps": 3300.0,
                              "rx_mbps": 12_500.5, "tx_mbps": 8_000.0}
    assert big["storage"] == {"volumes": [v.model_dump() for v in VOLUMES], "total_gib": 28447.1,
                              "used_gib": 1234.5}
    old = await call(rt, subjects.QUERY_INVENTORY_GET_NODE, NodeRef(cluster=CLUSTER, node="old"))
    assert old["state"] == "ready" and (old["cpu_util_pct"], old["memory_used_mib"]) == (None, None)
    assert old["network"] == {"interfaces": [], "link_gbps": 0, "rx_mbps": None, "tx_mbps": None}
    assert old["storage"] == {"volumes": [], "total_gib": 0, "used_gib": None}

    listed = {n["node"]: n for n in (await call(rt, subjects.QUERY_INVENTORY_LIST_NODES,
                                                ListNodes(cluster=CLUSTER)))["items"]}
    assert listed["big"]["network"] == big["network"] and listed["big"]["storage"] == big["storage"]
    assert listed["old"]["network"] == old["network"] and listed["old"]["storage"] == old["storage"]

    pool = await call(rt, subjects.QUERY_INVENTORY_POOL, GetPool(cluster=CLUSTER))
    (entry,) = pool["clusters"]
    nodes = {n["node"]: n for n in entry["nodes"]}
    for name, view in (("big", big), ("old", old)):
        for key in ("cpu_count", "cpu_util_pct", "memory_mib", "memory_used_mib", "network", "storage"):
            assert nodes[name][key] == view[key], (name, key)
    expected = {"nodes": 2, "cpu_count": 224, "memory_mib": 2304 * 1024, "network_link_gbps": 3300.0,
                "storage_total_gib": 28447.1}
    assert entry["node_totals"] == expected
    assert pool["all"]["node_totals"] == expected

    # re-registering replaces the facts (a NIC removed, a volume grown) in the same upsert
    await call(rt, subjects.register_node(CLUSTER, "big"), RegisterNode(
        cluster=CLUSTER, node="big", hostname="big", cpu_count=192, memory_mib=2048 * 1024, gpus=gpus("big"),
        network=NICS[:8], storage=[VolumeSpec(mount="/scratch", total_gib=30000.0, filesystem="xfs")]))
    big = await call(rt, subjects.QUERY_INVENTORY_GET_NODE, NodeRef(cluster=CLUSTER, node="big"))
    assert big["network"]["link_gbps"] == 3200.0 and len(big["network"]["interfaces"]) == 8
    assert big["storage"]["total_gib"] == 30000.0 and big["storage"]["used_gib"] == 1234.5
