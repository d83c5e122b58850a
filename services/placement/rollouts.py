"""Rolling updates of a service's work, as placement drives them: `job.work_updated` makes the job want one surge
replica on the new work; each pass (after a cycle, and whenever an endpoint's readiness changes) stops at most one
replica that runs older work per domain.rollout_step (its release brings it back on the new work), and once all run
the new work with the target ready, the surge replica is drained. No fewer than the target stay ready."""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from libs.contracts.envelope import CloudEvent, utcnow
from libs.contracts.events import JobWorkUpdated
from services.placement import store
from services.placement.domain import rollout_step

if TYPE_CHECKING:
    from services.placement.handlers import PlacementHandlers

log = logging.getLogger(__name__)
REASON = "RollingUpdate"


class Rollouts:
    def __init__(self, handlers: PlacementHandlers) -> None:
        self.h = handlers
        self.active: bool | None = None  # None: not known yet (read at the first pass)

    async def on_job_work_updated(self, event: CloudEvent, data: JobWorkUpdated) -> None:
        async with self.h.rt.uow() as uow:
            uow.after_commit(self.h._wake)
            rolling = await store.start_rollout(uow.conn, data.job_id, data.work.model_dump_json())
            await store.refresh_satisfied(uow.conn, data.job_id)
        if rolling:
            self.active = True
            log.info("rollout_started", extra={"job_id": data.job_id, "revision": data.revision})

    async def advance(self) -> int:
        """One pass over the jobs being rolled: the stops and finishes it made."""
        if self.active is False:
            return 0
        acted = 0
        async with self.h.rt.uow() as uow:
            jobs = await store.rolling_jobs(uow.conn)
            self.active = bool(jobs)
            for job in jobs:
                members = await store.rollout_members(uow.conn, job["job_id"])
                step = rollout_step(members, job["work"], job["rollout_target"])
                now = utcnow()
                if step.action == "stop":
                    acted += await self.h._stop(uow, job["job_id"], REASON, now, allocation_id=step.allocation_id)
                    log.info("rollout_replaced", extra={"job_id": job["job_id"], "replica": step.replica})
                elif step.action == "finish":
                    target = await store.finish_rollout(uow.conn, job["job_id"])
                    await self.h._release(uow, job["job_id"], REASON, now, min_replica=target)
                    await store.refresh_satisfied(uow.conn, job["job_id"])
                    acted += 1
                    log.info("rollout_finished", extra={"job_id": job["job_id"], "replicas": target})
        return acted
