"""Inventory service: node registration from agents, telemetry into the latest-state tables, health changes
announced once as events, and nodes that stop reporting declared lost (and ready again when they are back)."""

from __future__ import annotations

import asyncio
import logging
from datetime import datetime

from libs.contracts import subjects
from libs.contracts.commands import GetPool, ListNodes, RegisterNode, Reply, page
from libs.contracts.envelope import CloudEvent, utcnow
from libs.contracts.events import GpuHealthChanged, NodeLost, NodeRecovered, NodeRegistered, TelemetrySampled
from libs.runtime.routes import Routes
from libs.runtime.service import ServiceRuntime
from services.inventory import store
from services.inventory.config import InventorySettings
from services.inventory.domain import (
    IN_USE_UTIL_PCT,
    LOST,
    health_transition,
    lost_cutoff,
    node_recovers,
    pool_view,
)

log = logging.getLogger(__name__)


class InventoryHandlers:
    def __init__(self, runtime: ServiceRuntime, settings: InventorySettings | None = None) -> None:
        self.rt = runtime
        if settings is None:
            settings = runtime.settings if isinstance(runtime.settings, InventorySettings) else \
                InventorySettings.model_validate(runtime.settings.model_dump())
        self.settings = settings

    async def register_node(self, cmd: RegisterNode) -> Reply:
        """Idempotent: an agent re-registers after every restart; each registration is announced so read models
        (placement) converge on the node's current GPUs."""
        now = utcnow()
        async with self.rt.uow() as uow:
            previous = await store.upsert_node(uow.conn, cmd, now)
            await uow.emit(NodeRegistered(
                cluster=cmd.cluster, node=cmd.node, hostname=cmd.hostname, cpu_count=cmd.cpu_count,
                memory_mib=cmd.memory_mib, driver_version=cmd.driver_version, labels=cmd.labels, gpus=cmd.gpus,
                registered_at=now))
            if previous is not None and previous["state"] == LOST:  # a restarted agent of a lost node
                await uow.emit(NodeRecovered(cluster=cmd.cluster, node=cmd.node, lost_at=previous["lost_at"],
                                             last_seen_at=now, recovered_at=now))
        log.info("node_registered", extra={"cluster": cmd.cluster, "node": cmd.node, "gpus": len(cmd.gpus)})
        return Reply.success({"cluster": cmd.cluster, "node": cmd.node, "gpus": len(cmd.gpus)})

    async def on_telemetry(self, event: CloudEvent, data: TelemetrySampled) -> None:
        """No inbox here on purpose: applying a sample twice is harmless (latest-wins upsert, health compared
        against stored state), and telemetry is the highest-volume stream."""
        async with self.rt.uow() as uow:
            previous = await store.touch_node(uow.conn, data.cluster, data.node, data.sampled_at,
                                              data.cpu_util_pct, data.memory_used_mib)
            if previous is None:
                return  # samples from a node that never registered are dropped; the agent registers first
            now = utcnow()
            if node_recovers(previous["state"], previous["last_seen_at"], data.sampled_at, now,
                             self.settings.node_lost_after_s):
                await store.mark_ready(uow.conn, data.cluster, data.node)
                await uow.emit(NodeRecovered(cluster=data.cluster, node=data.node, lost_at=previous["lost_at"],
                                             last_seen_at=data.sampled_at, recovered_at=now))
                log.warning("node_recovered", extra={"cluster": data.cluster, "node": data.node})
            await store.upsert_samples(uow.conn, data.sampled_at, data.gpus)
            current = await store.gpu_health(uow.conn, data.cluster, data.node)
            for sample in data.gpus:
                previous = current.get(sample.uuid)
                if previous is None:
                    continue
                changed = health_transition(previous, sample)
                if changed is None:
                    continue
                await store.set_gpu_health(uow.conn, sample.uuid, changed, sample.health_reasons)
                await uow.emit(GpuHealthChanged(
                    cluster=data.cluster, node=data.node, gpu_uuid=sample.uuid, gpu_index=sample.index,
                    previous=previous, current=changed, reasons=sample.health_reasons,
                    observed_at=data.sampled_at))
                log.warning("gpu_health_changed", extra={"node": data.node, "gpu": sample.index,
                                                         "from": previous, "to": changed,
                                                         "reasons": sample.health_reasons})

    # --- heartbeats: the agent's telemetry sample every interval ----------------------------------------------
    async def sweep_lost_nodes(self, now: datetime | None = None) -> list[NodeLost]:
        """Declare lost every ready node silent for longer than `node_lost_after_s`, each with its event, in one
        transaction."""
        now = now or utcnow()
        lost: list[NodeLost] = []
        async with self.rt.uow() as uow:
            for row in await store.mark_lost(uow.conn, lost_cutoff(now, self.settings.node_lost_after_s), now):
                event = NodeLost(cluster=row["cluster"], node=row["node"], last_seen_at=row["last_seen_at"],
                                 detected_at=now)
                await uow.emit(event)
                lost.append(event)
        for event in lost:
            log.warning("node_lost", extra={"cluster": event.cluster, "node": event.node,
                                            "last_seen_at": event.last_seen_at.isoformat()})
        return lost

    async def node_sweeper(self) -> None:
        """Background task. The first sweep waits one threshold after start, so telemetry that queued up while
        inventory was down is consumed before anyone is judged silent."""
        await asyncio.sleep(self.settings.node_lost_after_s)
        while True:
            try:
                await self.sweep_lost_nodes()
            except asyncio.CancelledError:
                raise
            except Exception:
                log.exception("node_sweep_failed")
            await asyncio.sleep(self.settings.node_sweep_interval_s)

    async def list_nodes(self, cmd: ListNodes) -> Reply:
        async with self.rt.pool.acquire() as conn:
            items = await store.list_nodes(conn, cluster=cmd.cluster, limit=cmd.limit + 1, after=cmd.after)
        return Reply.success(page(items, cmd.limit, lambda n: n, lambda n: f"{n['cluster']}/{n['node']}"))

    async def pool(self, cmd: GetPool) -> Reply:
        """Per cluster and model: total, healthy, unhealthy, in use (a sample fresher than `node_lost_after_s`
        above IN_USE_UTIL_PCT); per node CPU/memory. Allocations are not inventory's: the gateway adds them."""
        fresh_since = lost_cutoff(utcnow(), self.settings.node_lost_after_s)
        async with self.rt.pool.acquire() as conn:
            models = await store.pool_by_model(conn, cluster=cmd.cluster, fresh_since=fresh_since,
                                               in_use_above_pct=IN_USE_UTIL_PCT)
            nodes = await store.pool_nodes(conn, cluster=cmd.cluster)
        return Reply.success(pool_view(models, nodes, fresh_within_s=self.settings.node_lost_after_s))


def routes(h: InventoryHandlers) -> Routes:
    return Routes(
        commands={
            subjects.CMD_INVENTORY_REGISTER_NODE: (RegisterNode, h.register_node),
            subjects.QUERY_INVENTORY_LIST_NODES: (ListNodes, h.list_nodes),
            subjects.QUERY_INVENTORY_POOL: (GetPool, h.pool),
        },
        telemetry=h.on_telemetry,
    )
