"""Inventory service: node registration from agents; telemetry into the latest-state tables, one-minute rollups and
the per-GPU health state machine (every transition announced once); nodes that stop reporting declared lost (and
ready again when they are back); cordon, drain and sharing set by operators; orphans reported."""

from __future__ import annotations

import asyncio
import logging
from collections import defaultdict
from dataclasses import replace
from datetime import datetime, timedelta

from prometheus_client import Counter, Histogram

from libs.contracts import subjects
from libs.contracts.commands import (
    CordonNode,
    GetPool,
    ListNodes,
    ListOrphans,
    NodeRef,
    RegisterNode,
    Reply,
    SetGpuHealth,
    SetGpuSharing,
    page,
)
from libs.contracts.envelope import CloudEvent, utcnow
from libs.contracts.events import (
    AllocationGranted,
    AllocationReleased,
    GpuHealthChanged,
    GpuSharingSet,
    GpuSpec,
    NodeCordoned,
    NodeLost,
    NodeRecovered,
    NodeRegistered,
    NodeUncordoned,
    OrphanDetected,
    TelemetryRolledUp,
    TelemetrySampled,
)
from libs.runtime.loops import every
from libs.runtime.routes import Routes, idempotent, once
from libs.runtime.service import ServiceRuntime
from services.inventory import store
from services.inventory.config import InventorySettings
from services.inventory.domain import (
    IN_USE_UTIL_PCT,
    LEGACY_HEALTH,
    LOST,
    ROLLUP_WINDOW_S,
    GpuHealth,
    HealthStep,
    allocation_without_process,
    assess,
    gpu_rollup,
    held_samples,
    lost_cutoff,
    minute_of,
    moves,
    node_recovers,
    operator_step,
    pool_view,
    registration_subject_error,
    sharing_change,
    step,
)

log = logging.getLogger(__name__)
CONSUMER = "inventory"
# How far behind the fleet inventory is: the age of each node sample when its batch committed (the inventory
# benchmark reads these from /metrics).
SAMPLE_LAG = Histogram("gpupool_inventory_sample_lag_seconds", "Age of a node's telemetry sample when applied",
                       buckets=(0.05, 0.1, 0.25, 0.5, 0.75, 1, 1.5, 2, 3, 5, 10, 20, 30, 60, 120, 300))
GPU_SAMPLES = Counter("gpupool_inventory_gpu_samples_total", "GPU samples applied (new, not replayed)")
GPU_SAMPLES_HELD = Counter("gpupool_inventory_gpu_samples_held_total", "GPU samples an agent sampling by change left "
                           "out as unchanged, counted in the rollups with the previous values")


def _health(row) -> GpuHealth:  # type: ignore[no-untyped-def]
    return GpuHealth(state=row["state"], since=row["state_since"], reason=row["state_reason"],
                     last_signal_at=row["last_signal_at"], strikes=row["strikes"],
                     last_strike_at=row["last_strike_at"], details=tuple(row["state_details"]))


def _health_row(uuid: str, h: GpuHealth) -> tuple:
    return (uuid, h.state, h.since, h.reason, list(h.details), h.last_signal_at, h.strikes, h.last_strike_at,
            LEGACY_HEALTH[h.state])


class InventoryHandlers:
    def __init__(self, runtime: ServiceRuntime, settings: InventorySettings | None = None) -> None:
        self.rt = runtime
        if settings is None:
            settings = runtime.settings if isinstance(runtime.settings, InventorySettings) else \
                InventorySettings.model_validate(runtime.settings.model_dump())
        self.settings = settings
        self.rules = settings.health_rules()
        self.orphan_rules = settings.orphan_rules()
        self.samples_applied = 0  # GPU samples applied since start (the benchmark reads it from /metrics too)

    async def register_node(self, cmd: RegisterNode) -> Reply:
        """Idempotent: an agent re-registers after every restart; each registration is announced so read models
        (placement) converge on the node's current GPUs, with inventory's health state of each (which outlives
        the agent: a quarantined GPU stays quarantined across its restart)."""
        now = utcnow()
        async with self.rt.uow() as uow:
            previous = await store.upsert_node(uow.conn, cmd, now)
            states = {r["uuid"]: r for r in await store.node_gpu_states(uow.conn, cmd.cluster, cmd.node)}
            gpus = [g.model_copy(update={"health": states[g.uuid]["health"], "state": states[g.uuid]["state"]})
                    if g.uuid in states else g for g in cmd.gpus]
            await uow.emit(NodeRegistered(
                cluster=cmd.cluster, node=cmd.node, hostname=cmd.hostname, cpu_count=cmd.cpu_count,
                memory_mib=cmd.memory_mib, driver_version=cmd.driver_version, labels=cmd.labels,
                gpus=[GpuSpec.model_validate(g.model_dump()) for g in gpus], registered_at=now,
                address=cmd.address))
            if previous is not None and previous["state"] == LOST:  # a restarted agent of a lost node
                await uow.emit(NodeRecovered(cluster=cmd.cluster, node=cmd.node, lost_at=previous["lost_at"],
                                             last_seen_at=now, recovered_at=now, cordoned=previous["cordoned"]))
        log.info("node_registered", extra={"cluster": cmd.cluster, "node": cmd.node, "gpus": len(cmd.gpus)})
        return Reply.success({"cluster": cmd.cluster, "node": cmd.node, "gpus": len(cmd.gpus)})

    # --- telemetry ------------------------------------------------------------------------------------------------
    async def on_telemetry(self, event: CloudEvent, data: TelemetrySampled) -> None:
        await self.on_telemetry_batch([(event, data)])

    async def on_telemetry_batch(self, batch: list[tuple[CloudEvent, TelemetrySampled]]) -> None:
        """A fetched batch of samples in one transaction. No inbox here on purpose: applying a sample twice is
        harmless — only samples newer than a GPU's stored latest one move its health, rollup or latest row, and
        node state is compared against stored state (row-locked) — and telemetry is the highest-volume stream."""
        now = utcnow()
        newest_by_node: dict[tuple[str, str], TelemetrySampled] = {}
        for _, d in batch:
            key = (d.cluster, d.node)
            if key not in newest_by_node or d.sampled_at > newest_by_node[key].sampled_at:
                newest_by_node[key] = d
        async with self.rt.uow() as uow:
            nodes = await store.lock_nodes(uow.conn, sorted(newest_by_node))
            if not nodes:
                return  # samples from nodes that never registered are dropped; the agent registers first
            for key, node in nodes.items():
                newest = newest_by_node[key]
                if node_recovers(node["state"], node["last_seen_at"], newest.sampled_at, now,
                                 self.settings.node_lost_after_s):
                    await store.mark_ready(uow.conn, *key)
                    await uow.emit(NodeRecovered(cluster=key[0], node=key[1], lost_at=node["lost_at"],
                                                 last_seen_at=newest.sampled_at, recovered_at=now,
                                                 cordoned=node["cordoned"]))
                    log.warning("node_recovered", extra={"cluster": key[0], "node": key[1]})
            await store.touch_nodes(uow.conn, [
                (k[0], k[1], d.sampled_at, d.cpu_util_pct, d.memory_used_mib, d.network_rx_mbps, d.network_tx_mbps,
                 d.storage_used_gib) for k in sorted(nodes) for d in (newest_by_node[k],)])
            samples = sorted(((d.sampled_at, d.cluster, d.node, g, d) for _, d in batch
                              if (d.cluster, d.node) in nodes for g in d.gpus), key=lambda s: s[0])
            gpus = await store.batch_gpus(uow.conn, sorted({s[3].uuid for s in samples}))
            # samples to apply, in rounds of at most one per GPU (more only when a node's backlog is in the batch)
            rounds: list[tuple[list[store.SampleRow], list[tuple[str, int]]]] = []
            taken: dict[str, int] = {}
            held_total = 0
            health: dict[str, tuple[GpuHealth, bool]] = {}
            counters: dict[str, tuple[datetime | None, int | None, int | None]] = {
                u: (r["sampled_at"], r["ecc_volatile_sbe"], r["ecc_volatile_dbe"]) for u, r in gpus.items()}
            for at, cluster, node, sample, sampled in samples:
                row = gpus.get(sample.uuid)
                if row is None or row["cluster"] != cluster or row["node"] != node:
                    continue  # a GPU the node never registered (or one that moved): nothing to attach it to
                last_at, sbe, dbe = counters[sample.uuid]
                if last_at is not None and at <= last_at:
                    continue  # applied before (a redelivery) or older than what we have
                counters[sample.uuid] = (at, sample.ecc_volatile_sbe, sample.ecc_volatile_dbe)
                k = taken[sample.uuid] = taken.get(sample.uuid, -1) + 1
                if k == len(rounds):
                    rounds.append(([], []))
                held_before, held = held_samples(last_at, at, sampled.interval_s, sampled.heartbeat_s)
                rounds[k][0].append(store.sample_row(at, sample, held))
                held_total += held_before + held
                if last_at is not None and minute_of(last_at) != minute_of(at):
                    rounds[k][1].append((sample.uuid, held_before))
                signal = assess(sample, sbe, dbe, self.rules)
                known = health.get(sample.uuid)
                if not moves(known[0].state if known else row["state"], signal):
                    continue  # a clean sample of a healthy GPU: nearly all of them
                h = known[0] if known else _health(row)
                moved = step(h, signal, at, self.rules)
                if moved.changed:
                    await self._announce(uow, row, h, moved, at)
                if moved.dirty:
                    health[sample.uuid] = (moved.health, True)
                elif known is None:
                    health[sample.uuid] = (h, False)
            for rows, rolled in rounds:
                await store.apply_samples(uow.conn, rows, rolled)
            applied = sum(len(rows) for rows, _ in rounds)
            dirty = [_health_row(u, h) for u, (h, d) in health.items() if d]
            if dirty:
                await store.save_gpu_health(uow.conn, dirty)
        self.samples_applied += applied
        GPU_SAMPLES.inc(applied)
        GPU_SAMPLES_HELD.inc(held_total)
        done = utcnow()
        for _, d in batch:
            SAMPLE_LAG.observe(max(0.0, (done - d.sampled_at).total_seconds()))

    async def _announce(self, uow, row, before: GpuHealth, moved: HealthStep, at: datetime,  # type: ignore[no-untyped-def]
                        by: str = "") -> None:
        after = moved.health
        await uow.emit(GpuHealthChanged(
            cluster=row["cluster"], node=row["node"], gpu_uuid=row["uuid"], gpu_index=row["idx"],
            previous=LEGACY_HEALTH[before.state], current=LEGACY_HEALTH[after.state], reasons=list(after.details),
            observed_at=at, state=after.state, previous_state=before.state, reason=after.reason, by=by))
        log.warning("gpu_health_changed", extra={"node": row["node"], "gpu": row["idx"], "from": before.state,
                                                 "to": after.state, "reason": after.reason, "by": by or None,
                                                 "details": list(after.details)})

    # --- heartbeats: the agent's telemetry sample every interval ----------------------------------------------
    async def sweep_lost_nodes(self, now: datetime | None = None) -> list[NodeLost]:
        """Declare lost every ready node silent for longer than `node_lost_after_s` (`lost_cutoff`: a whole fleet
        silent together is given longer), each with its event, in one transaction."""
        now = now or utcnow()
        lost: list[NodeLost] = []
        async with self.rt.uow() as uow:
            newest, ready = await store.ready_reports(uow.conn)
            cutoff = lost_cutoff(now, self.settings.node_lost_after_s, newest, ready)
            if cutoff != lost_cutoff(now, self.settings.node_lost_after_s):
                log.warning("fleet_silent", extra={"ready_nodes": ready, "newest_report": newest.isoformat(),
                                                   "judged_before": cutoff.isoformat()})
            for row in await store.mark_lost(uow.conn, cutoff, now):
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
        await every(self.settings.node_sweep_interval_s, self.sweep_lost_nodes, log=log, failure="node_sweep_failed",
                    first_delay_s=self.settings.node_lost_after_s)

    # --- rollups and orphans ------------------------------------------------------------------------------------
    async def close_rollups(self, now: datetime | None = None) -> list[TelemetryRolledUp]:
        """Emit one TelemetryRolledUp per node and closed minute (ended more than `rollup_late_s` ago), marking the
        rows emitted in the same transaction; prune what is past retention."""
        now = now or utcnow()
        closed_before = now - timedelta(seconds=ROLLUP_WINDOW_S + self.settings.rollup_late_s)
        out: list[TelemetryRolledUp] = []
        async with self.rt.uow() as uow:
            await store.finish_open_minutes(uow.conn, closed_before)
        while True:
            async with self.rt.uow() as uow:
                rows = await store.closed_rollups(uow.conn, closed_before, limit=4096)
                groups: dict[tuple[datetime, str, str], list] = defaultdict(list)
                for r in rows:
                    groups[(r["window_start"], r["cluster"], r["node"])].append(r)
                for (start, cluster, node), items in groups.items():
                    event = TelemetryRolledUp(cluster=cluster, node=node, window_start=start,
                                              window_end=start + timedelta(seconds=ROLLUP_WINDOW_S),
                                              gpus=[gpu_rollup(r) for r in items])
                    await uow.emit(event)
                    out.append(event)
                await store.mark_emitted(uow.conn, [(r["uuid"], r["window_start"]) for r in rows])
            if len(rows) < 4096:
                break
        async with self.rt.pool.acquire() as conn:
            await store.prune_rollups(conn, now - timedelta(seconds=self.settings.rollup_retention_s))
            await store.forget_released(conn, now - timedelta(days=1))
        return out

    async def detect_orphans(self, now: datetime | None = None) -> list[OrphanDetected]:
        """Report processes on GPUs no allocation holds, and allocations whose GPUs show no process, once each
        until the condition ends (then the report is closed and may fire again later)."""
        now = now or utcnow()
        fresh_since = lost_cutoff(now, self.settings.node_lost_after_s)
        rules = self.orphan_rules
        out: list[OrphanDetected] = []
        async with self.rt.uow() as uow:
            await store.resolve_orphans(uow.conn, now, fresh_since)
            started_before = now - timedelta(seconds=rules.process_after_s)
            for g in await store.unheld_gpus_with_processes(uow.conn, started_before, fresh_since):
                if await store.record_orphan(uow.conn, "process_without_allocation", g["cluster"], g["node"],
                                             g["uuid"], g["procs_since"], now):
                    out.append(OrphanDetected(cluster=g["cluster"], node=g["node"], gpu_uuid=g["uuid"],
                                              orphan="process_without_allocation", since=g["procs_since"],
                                              detected_at=now))
            idle_before = now - timedelta(seconds=rules.no_process_after_s)
            for a in await store.held_without_processes(uow.conn, idle_before, fresh_since):
                since = allocation_without_process(a["granted_at"], a["last_process_at"], now, rules)
                if since is None:
                    continue
                first = a["gpu_uuids"][0]
                if await store.record_orphan(uow.conn, "allocation_without_process", a["cluster"], a["node"], first,
                                             since, now, a["allocation_id"], a["job_id"], a["team"]):
                    out.append(OrphanDetected(cluster=a["cluster"], node=a["node"], gpu_uuid=first,
                                              orphan="allocation_without_process", allocation_id=a["allocation_id"],
                                              job_id=a["job_id"], team=a["team"], since=since, detected_at=now))
            for event in out:
                await uow.emit(event)
        for event in out:
            log.warning("orphan_detected", extra={"node": event.node, "gpu": event.gpu_uuid, "orphan": event.orphan,
                                                  "allocation_id": event.allocation_id})
        return out

    async def maintenance(self) -> None:
        """Background task: close rollup minutes and look for orphans every `maintenance_interval_s`."""
        while True:
            await asyncio.sleep(self.settings.maintenance_interval_s)
            for task in (self.close_rollups, self.detect_orphans):
                try:
                    await task()
                except asyncio.CancelledError:
                    raise
                except Exception:
                    log.exception("inventory_maintenance_failed", extra={"task": task.__name__})

    # --- allocations, as placement announces them (for orphans and the node view) ---------------------------------
    async def on_allocation_granted(self, event: CloudEvent, data: AllocationGranted) -> None:
        async with self.rt.uow() as uow:
            await store.hold(uow.conn, data.allocation_id, data.job_id, data.team, data.cluster, data.node,
                             [g.uuid for g in data.gpus], data.granted_at)

    async def on_allocation_released(self, event: CloudEvent, data: AllocationReleased) -> None:
        """Forget the allocation; a GPU that waited for it to change its sharing mode switches now."""
        async with self.rt.uow() as uow:
            now = utcnow()
            for g in await store.release(uow.conn, data.allocation_id, data.released_at):
                await uow.emit(GpuSharingSet(cluster=g["cluster"], node=g["node"], gpu_uuid=g["uuid"],
                                             gpu_index=g["idx"], mode=g["sharing"],
                                             set_by=g["sharing_set_by"] or "", set_at=now))

    # --- operators: cordon / drain / uncordon, sharing, health ----------------------------------------------------
    async def _resolve(self, conn, ref: NodeRef) -> tuple[str, str] | Reply:  # type: ignore[no-untyped-def]
        found = await store.find_node(conn, ref.cluster, ref.node)
        if not found:
            where = f" in cluster {ref.cluster}" if ref.cluster else ""
            return Reply.failure(404, "NodeNotFound", f"no node {ref.node}{where}", node=ref.node)
        if len(found) > 1:
            return Reply.failure(409, "AmbiguousNode", f"node {ref.node} exists in several clusters; name the "
                                                       "cluster", node=ref.node,
                                 clusters=[r["cluster"] for r in found])
        return found[0]["cluster"], found[0]["node"]

    async def _locked_gpu(self, conn, cmd):  # type: ignore[no-untyped-def]
        """(cluster, node, the GPU's row locked for the change) for a command naming a node and a GPU index, or
        the 404/409 reply."""
        where = await self._resolve(conn, cmd)
        if isinstance(where, Reply):
            return where
        cluster, node = where
        gpu = await store.lock_gpu(conn, cluster, node, cmd.index)
        if gpu is None:
            return Reply.failure(404, "GpuNotFound", f"node {node} has no GPU {cmd.index}", node=node,
                                 index=cmd.index)
        return cluster, node, gpu

    async def cordon_node(self, cmd: CordonNode) -> Reply:
        """Idempotent: cordoning a cordoned node (or uncordoning an uncordoned one) changes nothing and emits
        nothing; a drain of a merely cordoned node still drains it."""
        now = utcnow()
        async with self.rt.uow() as uow:
            where = await self._resolve(uow.conn, cmd)
            if isinstance(where, Reply):
                return where
            cluster, node = where
            row = await store.lock_node(uow.conn, cluster, node)
            assert row is not None
            changed = False
            if cmd.action in ("cordon", "drain"):
                drain = cmd.action == "drain"
                if not row["cordoned"] or (drain and not row["drained"]):
                    await store.set_cordon(uow.conn, cluster, node, cordoned=True, drained=drain or row["drained"],
                                           by=cmd.by, reason=cmd.reason, at=now)
                    await uow.emit(NodeCordoned(cluster=cluster, node=node, drain=drain, reason=cmd.reason,
                                                by=cmd.by, cordoned_at=now))
                    changed = True
            elif row["cordoned"]:
                await store.set_cordon(uow.conn, cluster, node, cordoned=False, drained=False, by=cmd.by, reason="",
                                       at=now)
                await uow.emit(NodeUncordoned(cluster=cluster, node=node, node_state=row["state"], by=cmd.by,
                                              uncordoned_at=now))
                changed = True
            view = await store.get_node(uow.conn, cluster, node)
        if changed:
            log.warning("node_" + {"cordon": "cordoned", "drain": "drained", "uncordon": "uncordoned"}[cmd.action],
                        extra={"cluster": cluster, "node": node, "by": cmd.by, "reason": cmd.reason})
        return Reply.success({"changed": changed, "node": view})

    async def set_gpu_sharing(self, cmd: SetGpuSharing) -> Reply:
        """A GPU that holds work is drained first (`draining_to`: no new work on it), and switched when its last
        allocation is released (`on_allocation_released`); an empty one is switched now."""
        now = utcnow()
        async with self.rt.uow() as uow:
            found = await self._locked_gpu(uow.conn, cmd)
            if isinstance(found, Reply):
                return found
            cluster, node, gpu = found
            before = gpu["sharing"]
            change = sharing_change(gpu["model"], before, gpu["sharing_target"], cmd.mode, gpu["held"])
            if change.outcome == "refused":
                return Reply.failure(422, change.code, change.message, node=node, index=cmd.index, mode=cmd.mode)
            event = GpuSharingSet(cluster=cluster, node=node, gpu_uuid=gpu["uuid"], gpu_index=cmd.index,
                                  mode=cmd.mode, set_by=cmd.by, set_at=now)
            if change.outcome == "apply":
                await store.set_sharing(uow.conn, gpu["uuid"], cmd.mode, cmd.by, now)
                await uow.emit(event)
            elif change.outcome == "drain" and gpu["sharing_target"] != cmd.mode:
                await store.set_sharing_target(uow.conn, gpu["uuid"], cmd.mode, cmd.by, now)
                await uow.emit(event.model_copy(update={"mode": before, "draining_to": cmd.mode}))
        draining = change.outcome == "drain"
        return Reply.success({"cluster": cluster, "node": node, "index": cmd.index, "gpu_uuid": gpu["uuid"],
                              "before": before, "mode": before if draining else cmd.mode,
                              "draining_to": cmd.mode if draining else None,
                              "changed": change.outcome == "apply" and before != cmd.mode})

    async def set_gpu_health(self, cmd: SetGpuHealth) -> Reply:
        now = utcnow()
        async with self.rt.uow() as uow:
            found = await self._locked_gpu(uow.conn, cmd)
            if isinstance(found, Reply):
                return found
            cluster, node, gpu = found
            before = _health(gpu)
            moved = operator_step(before, cmd.action, now)
            if moved.changed:
                after = moved.health
                if cmd.reason:
                    moved = HealthStep(replace(after, details=(cmd.reason,)), True, True)
                await store.save_gpu_health(uow.conn, [_health_row(gpu["uuid"], moved.health)])
                await self._announce(uow, {"cluster": cluster, "node": node, "uuid": gpu["uuid"], "idx": cmd.index},
                                     before, moved, now, by=cmd.by)
        return Reply.success({"cluster": cluster, "node": node, "index": cmd.index, "gpu_uuid": gpu["uuid"],
                              "before": before.state, "state": moved.health.state, "changed": moved.changed,
                              "reason": moved.health.reason})

    # --- queries ------------------------------------------------------------------------------------------------
    async def list_nodes(self, cmd: ListNodes) -> Reply:
        async with self.rt.pool.acquire() as conn:
            items = await store.list_nodes(conn, cluster=cmd.cluster, limit=cmd.limit + 1, after=cmd.after)
        return Reply.success(page(items, cmd.limit, lambda n: n, lambda n: f"{n['cluster']}/{n['node']}"))

    async def get_node(self, cmd: NodeRef) -> Reply:
        async with self.rt.pool.acquire() as conn:
            where = await self._resolve(conn, cmd)
            if isinstance(where, Reply):
                return where
            view = await store.get_node(conn, *where)
        return Reply.success(view)

    async def list_orphans(self, cmd: ListOrphans) -> Reply:
        after = int(cmd.after) if cmd.after and cmd.after.isdigit() else None
        if after is not None and after >= 2**63:  # ids are bigint: no such cursor was ever handed out
            return Reply.failure(400, "InvalidCursor", "the cursor is not one this list handed out")
        async with self.rt.pool.acquire() as conn:
            rows = await store.list_orphans(conn, cluster=cmd.cluster, open_only=cmd.open_only,
                                            limit=cmd.limit + 1, after=after)

        def view(r) -> dict:  # type: ignore[no-untyped-def]
            return {**{k: r[k] for k in ("id", "kind", "cluster", "node", "gpu_uuid", "allocation_id", "job_id",
                                         "team")},
                    "since": r["since"].isoformat(), "detected_at": r["detected_at"].isoformat(),
                    "resolved_at": r["resolved_at"].isoformat() if r["resolved_at"] else None}

        return Reply.success(page(rows, cmd.limit, view, lambda item: str(item["id"])))

    async def pool(self, cmd: GetPool) -> Reply:
        """Per cluster and model: total, healthy (placeable: state healthy on a ready, uncordoned node),
        unhealthy, GPUs per health state, cordoned, in use (a sample fresher than `node_lost_after_s` above
        IN_USE_UTIL_PCT); per node CPU/memory. Allocations are not inventory's: the gateway adds them."""
        fresh_since = lost_cutoff(utcnow(), self.settings.node_lost_after_s)
        async with self.rt.pool.acquire() as conn:
            models = await store.pool_by_model(conn, cluster=cmd.cluster, fresh_since=fresh_since,
                                               in_use_above_pct=IN_USE_UTIL_PCT)
            nodes = await store.pool_nodes(conn, cluster=cmd.cluster)
        return Reply.success(pool_view(models, nodes, fresh_within_s=self.settings.node_lost_after_s))


def routes(h: InventoryHandlers) -> Routes:
    return Routes(
        inbox=CONSUMER,
        commands={
            f"{subjects.CMD_INVENTORY_REGISTER_NODE}.*.*": (RegisterNode, h.register_node),
            subjects.CMD_INVENTORY_CORDON_NODE: (CordonNode, h.cordon_node),
            subjects.CMD_INVENTORY_SET_GPU_SHARING: (SetGpuSharing, h.set_gpu_sharing),
            subjects.CMD_INVENTORY_SET_GPU_HEALTH: (SetGpuHealth, h.set_gpu_health),
            subjects.QUERY_INVENTORY_LIST_NODES: (ListNodes, h.list_nodes),
            subjects.QUERY_INVENTORY_GET_NODE: (NodeRef, h.get_node),
            subjects.QUERY_INVENTORY_POOL: (GetPool, h.pool),
            subjects.QUERY_INVENTORY_ORPHANS: (ListOrphans, h.list_orphans),
        },
        subject_checks={f"{subjects.CMD_INVENTORY_REGISTER_NODE}.*.*": registration_subject_error},
        events={
            AllocationGranted: once(h.on_allocation_granted),
            AllocationReleased: once(h.on_allocation_released),
        },
        telemetry=idempotent(h.on_telemetry, "only a sample newer than a GPU's stored latest one changes it, and node "
                                             "state is compared with the stored state"),
        telemetry_batch=h.on_telemetry_batch,
        # both event handlers are one unit of work and nothing else (no pool reads, RPCs or publishes): safe to apply
        # a fetched batch in one transaction (README: "Batched event handling"); telemetry keeps its batch consumer
        batched=True,
    )
