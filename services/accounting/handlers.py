"""Accounting service: every released allocation becomes one ledger row of GPU-seconds, exactly once."""

from __future__ import annotations

import logging

from libs.contracts import subjects
from libs.contracts.commands import ListUsage, Reply, page
from libs.contracts.envelope import CloudEvent
from libs.contracts.events import AllocationGranted, AllocationReleased, UsageRecorded
from libs.runtime.routes import Routes
from libs.runtime.service import ServiceRuntime
from services.accounting import store
from services.accounting.domain import dominant_model, gpu_seconds

log = logging.getLogger(__name__)
CONSUMER = "accounting"


class AccountingHandlers:
    def __init__(self, runtime: ServiceRuntime) -> None:
        self.rt = runtime

    async def on_allocation_granted(self, event: CloudEvent, data: AllocationGranted) -> None:
        model = dominant_model(data)  # type: ignore[arg-type]  # same gpus shape as a release
        async with self.rt.uow() as uow:
            if await uow.first_time(CONSUMER, event.id):
                await store.open_allocation(uow.conn, data, model)

    async def on_allocation_released(self, event: CloudEvent, data: AllocationReleased) -> None:
        seconds = gpu_seconds(data)
        model = dominant_model(data)
        async with self.rt.uow() as uow:
            if not await uow.first_time(CONSUMER, event.id):
                return
            if not await store.record_usage(uow.conn, data, model, seconds):
                return
            await uow.emit(UsageRecorded(
                allocation_id=data.allocation_id, job_id=data.job_id, team=data.team, project=data.project,
                gpu_model=model, gpu_count=len(data.gpus), gpu_seconds=seconds, started_at=data.granted_at,
                ended_at=data.released_at))
        log.info("usage_recorded", extra={"allocation_id": data.allocation_id, "team": data.team,
                                          "gpu_seconds": round(seconds, 3)})

    async def list_usage(self, cmd: ListUsage) -> Reply:
        async with self.rt.pool.acquire() as conn:
            rows = await store.list_usage(conn, team=cmd.team, job_id=cmd.job_id, limit=cmd.limit + 1,
                                          after=cmd.after)
        return Reply.success(page(
            rows, cmd.limit,
            lambda r: {**dict(r), "started_at": r["started_at"].isoformat(), "ended_at": r["ended_at"].isoformat()},
            lambda item: item["allocation_id"]))


def routes(h: AccountingHandlers) -> Routes:
    return Routes(
        commands={subjects.QUERY_ACCOUNTING_LIST_USAGE: (ListUsage, h.list_usage)},
        events={
            AllocationGranted: h.on_allocation_granted,
            AllocationReleased: h.on_allocation_released,
        },
    )
