"""Placement service: keeps a read model of nodes and pending jobs from events, runs the scheduling cycle on the
pure core, and commits each placement with its AllocationGranted event in one transaction."""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time

from libs.bus.lease import LeaderLease
from libs.contracts import subjects
from libs.contracts.commands import ListAllocations, Reply
from libs.contracts.envelope import CloudEvent, utcnow, uuid7
from libs.contracts.events import (
    AllocatedGpu,
    AllocationGranted,
    AllocationReleased,
    GpuHealthChanged,
    JobCancelled,
    JobCompleted,
    JobSubmitted,
    NodeLost,
    NodeRecovered,
    NodeRegistered,
)
from libs.core import Placement, Policy, schedule
from libs.observability.tracing import extract_context, tracer
from libs.runtime.routes import Routes
from libs.runtime.service import ServiceRuntime
from services.placement import store
from services.placement.config import PlacementSettings
from services.placement.domain import allocated_gpus, build_requests, build_snapshot

log = logging.getLogger(__name__)
CONSUMER = "placement"


class PlacementHandlers:
    def __init__(self, runtime: ServiceRuntime, settings: PlacementSettings, lease: LeaderLease | None = None) -> None:
        self.rt = runtime
        self.settings = settings
        self.lease = lease
        self.policy = Policy(name=settings.policy)
        self._kick = asyncio.Event()
        self._tracer = tracer("gpupool.placement")

    # --- events that change the read model --------------------------------------------------------------------
    async def on_node_registered(self, event: CloudEvent, data: NodeRegistered) -> None:
        async with self.rt.uow() as uow:
            if await uow.first_time(CONSUMER, event.id):
                await store.upsert_node(uow.conn, data)
        self._kick.set()

    async def on_node_lost(self, event: CloudEvent, data: NodeLost) -> None:
        """Stop placing on a node that stopped reporting. Its allocations stay as they are: releasing them is
        reclamation's decision, not a side effect of a missed heartbeat."""
        async with self.rt.uow() as uow:
            if await uow.first_time(CONSUMER, event.id):
                await store.set_node_schedulable(uow.conn, data.cluster, data.node, False)

    async def on_node_recovered(self, event: CloudEvent, data: NodeRecovered) -> None:
        async with self.rt.uow() as uow:
            if await uow.first_time(CONSUMER, event.id):
                await store.set_node_schedulable(uow.conn, data.cluster, data.node, True)
        self._kick.set()

    async def on_gpu_health_changed(self, event: CloudEvent, data: GpuHealthChanged) -> None:
        async with self.rt.uow() as uow:
            if await uow.first_time(CONSUMER, event.id):
                await store.set_gpu_health(uow.conn, data.gpu_uuid, data.current)
        self._kick.set()

    async def on_job_submitted(self, event: CloudEvent, data: JobSubmitted) -> None:
        async with self.rt.uow() as uow:
            if await uow.first_time(CONSUMER, event.id):
                await store.add_pending(uow.conn, data, event.traceparent)
        self._kick.set()

    async def on_job_completed(self, event: CloudEvent, data: JobCompleted) -> None:
        await self._job_finished(event, data.job_id, "JobCompleted", data.completed_at)

    async def on_job_cancelled(self, event: CloudEvent, data: JobCancelled) -> None:
        await self._job_finished(event, data.job_id, "JobCancelled", data.cancelled_at)

    async def _job_finished(self, event: CloudEvent, job_id: str, reason: str, at) -> None:
        async with self.rt.uow() as uow:
            if not await uow.first_time(CONSUMER, event.id):
                return
            released = await store.release_for_job(uow.conn, job_id, reason, at)
            if released is None:
                await store.mark_finished(uow.conn, job_id)
                return
            await store.mark_finished(uow.conn, job_id)
            alloc, gpus = released
            await uow.emit(AllocationReleased(
                allocation_id=alloc["allocation_id"], job_id=job_id, team=alloc["team"], project=alloc["project"],
                cluster=alloc["cluster"], node=alloc["node"],
                gpus=[AllocatedGpu(uuid=g["gpu_uuid"], index=g["gpu_index"], model=g["model"]) for g in gpus],
                granted_at=alloc["granted_at"], released_at=alloc["released_at"], reason=reason))
        log.info("allocation_released", extra={"job_id": job_id, "allocation_id": alloc["allocation_id"],
                                                "reason": reason})
        self._kick.set()

    # --- the scheduling cycle ----------------------------------------------------------------------------------
    async def scheduling_loop(self) -> None:
        while True:
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(self._kick.wait(), timeout=self.settings.cycle_interval_s)
            self._kick.clear()
            if self.lease is not None and not self.lease.is_leader:
                continue  # a follower keeps its read model current and waits for the lease
            try:
                await self.run_cycle()
            except asyncio.CancelledError:
                raise
            except Exception:
                log.exception("scheduling_cycle_failed")
                await asyncio.sleep(0.5)

    async def run_cycle(self) -> int:
        """Snapshot → core.schedule → apply each placement in its own transaction (the database constraints are
        the verifier: a stale placement is refused, never double-allocated)."""
        async with self.rt.pool.acquire() as conn:
            nodes, gpus, held, pending = await store.load_state(conn)
        if not pending:
            return 0
        with self._tracer.start_as_current_span("scheduling cycle", attributes={
                "gpupool.pending_jobs": len(pending), "gpupool.nodes": len(nodes)}) as span:
            plan = schedule(build_snapshot(nodes, gpus, held), build_requests(pending), self.policy,
                            now=time.time())
            span.set_attribute("gpupool.placements", len(plan.placements))
        models = {g["uuid"]: g["model"] for g in gpus}
        traces = {r["job_id"]: r["traceparent"] for r in pending}
        placed = 0
        for p in plan.placements:
            parent = extract_context({"traceparent": traces[p.job_id]} if traces.get(p.job_id) else {})
            try:
                with self._tracer.start_as_current_span("place job", context=parent,
                                                        attributes={"gpupool.job_id": p.job_id}):
                    allocation_id = await self._apply(p, models)
                if allocation_id is None:
                    continue
                placed += 1
                log.info("job_placed", extra={"job_id": p.job_id, "allocation_id": allocation_id,
                                              "node": p.node, "gpus": list(p.gpu_indices)})
            except store.AllocationConflict as exc:
                log.warning("placement_refused_by_store", extra={"job_id": p.job_id, "error": str(exc)})
        if plan.pending:
            async with self.rt.pool.acquire() as conn:
                await store.record_pending_reasons(conn, [(r.job_id, r.reason, r.message) for r in plan.pending])
        return placed

    async def _apply(self, p: Placement, models: dict[str, str]) -> str | None:
        """Commit one placement with its AllocationGranted event; None if the job is no longer pending."""
        async with self.rt.uow() as uow:
            job = await store.take_pending(uow.conn, p.job_id)
            if job is None:
                return None
            allocation_id = uuid7()
            now = utcnow()
            alloc_gpus = allocated_gpus(p.gpu_uuids, models, p.gpu_indices)
            await store.insert_allocation(uow.conn, allocation_id, job, p.cluster, p.node, alloc_gpus, now)
            await uow.emit(AllocationGranted(
                allocation_id=allocation_id, job_id=p.job_id, team=job["team"], project=job["project"],
                cluster=p.cluster, node=p.node, gpus=alloc_gpus, granted_at=now))
        return allocation_id

    # --- queries -----------------------------------------------------------------------------------------------
    async def list_allocations(self, cmd: ListAllocations) -> Reply:
        async with self.rt.pool.acquire() as conn:
            rows = await store.list_allocations(conn, job_id=cmd.job_id, active=cmd.active, limit=cmd.limit + 1,
                                                after=cmd.after)
        items = [
            {**{k: r[k] for k in ("allocation_id", "job_id", "team", "project", "cluster", "node",
                                  "release_reason")},
             "granted_at": r["granted_at"].isoformat(),
             "released_at": r["released_at"].isoformat() if r["released_at"] else None,
             "gpus": json.loads(r["gpus"]) if isinstance(r["gpus"], str) else r["gpus"]}
            for r in rows[: cmd.limit]
        ]
        return Reply.success({"items": items, "next": items[-1]["allocation_id"] if len(rows) > cmd.limit else None})


def routes(h: PlacementHandlers) -> Routes:
    return Routes(
        commands={subjects.QUERY_PLACEMENT_LIST_ALLOCATIONS: (ListAllocations, h.list_allocations)},
        events={
            NodeRegistered: h.on_node_registered,
            NodeLost: h.on_node_lost,
            NodeRecovered: h.on_node_recovered,
            GpuHealthChanged: h.on_gpu_health_changed,
            JobSubmitted: h.on_job_submitted,
            JobCompleted: h.on_job_completed,
            JobCancelled: h.on_job_cancelled,
        },
    )
