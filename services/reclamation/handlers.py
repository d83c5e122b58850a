"""Reclamation service: follows live allocations and measures how long each has been idle from telemetry.

Taking GPUs back (idle timeouts, TTLs, failed hardware) builds on these trackers in the reclamation issue.
"""

from __future__ import annotations

from libs.contracts import subjects
from libs.contracts.commands import Empty, Reply
from libs.contracts.envelope import CloudEvent
from libs.contracts.events import AllocationGranted, AllocationReleased, TelemetrySampled
from libs.runtime.routes import Routes
from libs.runtime.service import ServiceRuntime
from services.reclamation import store
from services.reclamation.config import ReclamationSettings
from services.reclamation.domain import allocation_utilization, is_busy

CONSUMER = "reclamation"


class ReclamationHandlers:
    def __init__(self, runtime: ServiceRuntime, settings: ReclamationSettings) -> None:
        self.rt = runtime
        self.settings = settings

    async def on_allocation_granted(self, event: CloudEvent, data: AllocationGranted) -> None:
        async with self.rt.uow() as uow:
            if await uow.first_time(CONSUMER, event.id):
                await store.track(uow.conn, data)

    async def on_allocation_released(self, event: CloudEvent, data: AllocationReleased) -> None:
        async with self.rt.uow() as uow:
            if await uow.first_time(CONSUMER, event.id):
                await store.untrack(uow.conn, data.allocation_id)

    async def on_telemetry(self, event: CloudEvent, data: TelemetrySampled) -> None:
        """Idempotent without an inbox: observing the same sample twice leaves the same state."""
        async with self.rt.uow() as uow:
            for tracker in await store.trackers_on_node(uow.conn, data.cluster, data.node):
                util = allocation_utilization(data.gpus, tracker["gpu_uuids"])
                if util is None:
                    continue
                mean, peak = util
                await store.observe(uow.conn, tracker["allocation_id"], data.sampled_at, mean,
                                    is_busy(peak, self.settings.busy_util_pct))

    async def list_tracked(self, _: Empty) -> Reply:
        async with self.rt.pool.acquire() as conn:
            rows = await store.list_trackers(conn)
        return Reply.success({"items": [
            {**{k: r[k] for k in ("allocation_id", "job_id", "team", "cluster", "node", "mean_util_pct")},
             "gpu_uuids": list(r["gpu_uuids"]), "granted_at": r["granted_at"].isoformat(),
             "last_busy_at": r["last_busy_at"].isoformat(),
             "idle_s": float(r["idle_s"]) if r["idle_s"] is not None else None} for r in rows], "next": None})


def routes(h: ReclamationHandlers) -> Routes:
    return Routes(
        commands={subjects.QUERY_RECLAMATION_LIST_TRACKED: (Empty, h.list_tracked)},
        events={
            AllocationGranted: h.on_allocation_granted,
            AllocationReleased: h.on_allocation_released,
        },
        telemetry=h.on_telemetry,
    )
