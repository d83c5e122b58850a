"""Inventory service: node registration from agents, telemetry into the latest-state tables, health changes
announced once as events."""

from __future__ import annotations

import logging

from libs.contracts import subjects
from libs.contracts.commands import ListNodes, RegisterNode, Reply
from libs.contracts.envelope import CloudEvent, utcnow
from libs.contracts.events import GpuHealthChanged, NodeRegistered, TelemetrySampled
from libs.runtime.routes import Routes
from libs.runtime.service import ServiceRuntime
from services.inventory import store
from services.inventory.domain import health_transition

log = logging.getLogger(__name__)


class InventoryHandlers:
    def __init__(self, runtime: ServiceRuntime) -> None:
        self.rt = runtime

    async def register_node(self, cmd: RegisterNode) -> Reply:
        """Idempotent: an agent re-registers after every restart; each registration is announced so read models
        (placement) converge on the node's current GPUs."""
        now = utcnow()
        async with self.rt.uow() as uow:
            await store.upsert_node(uow.conn, cmd, now)
            await uow.emit(NodeRegistered(
                cluster=cmd.cluster, node=cmd.node, hostname=cmd.hostname, cpu_count=cmd.cpu_count,
                memory_mib=cmd.memory_mib, driver_version=cmd.driver_version, labels=cmd.labels, gpus=cmd.gpus,
                registered_at=now))
        log.info("node_registered", extra={"cluster": cmd.cluster, "node": cmd.node, "gpus": len(cmd.gpus)})
        return Reply.success({"cluster": cmd.cluster, "node": cmd.node, "gpus": len(cmd.gpus)})

    async def on_telemetry(self, event: CloudEvent, data: TelemetrySampled) -> None:
        """No inbox here on purpose: applying a sample twice is harmless (latest-wins upsert, health compared
        against stored state), and telemetry is the highest-volume stream."""
        async with self.rt.uow() as uow:
            known = await store.touch_node(uow.conn, data.cluster, data.node, data.sampled_at, data.cpu_util_pct,
                                           data.memory_used_mib)
            if not known:
                return  # samples from a node that never registered are dropped; the agent registers first
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

    async def list_nodes(self, cmd: ListNodes) -> Reply:
        async with self.rt.pool.acquire() as conn:
            items = await store.list_nodes(conn, cluster=cmd.cluster, limit=cmd.limit + 1, after=cmd.after)
        page = items[: cmd.limit]
        nxt = f"{page[-1]['cluster']}/{page[-1]['node']}" if len(items) > cmd.limit else None
        return Reply.success({"items": page, "next": nxt})


def routes(h: InventoryHandlers) -> Routes:
    return Routes(
        commands={
            subjects.CMD_INVENTORY_REGISTER_NODE: (RegisterNode, h.register_node),
            subjects.QUERY_INVENTORY_LIST_NODES: (ListNodes, h.list_nodes),
        },
        telemetry=h.on_telemetry,
    )
