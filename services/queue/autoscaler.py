"""The queue's autoscaler: services report their load (`cmd.queue.report_load`, from `POST /v1/jobs/{id}/load`), or
their nodes' agents sample each replica (`agent.work_load`: GPU utilisation, a scraped metric); every `AUTOSCALE_INTERVAL_S` each running autoscaled job is evaluated by domain.autoscale and, when that takes a
step, its replicas change in the same transaction as `job.autoscaled` (the load, target and reason) and
`job.scaled` (placement adds or drains replicas as for a manual scale) and a history entry `Autoscaled:<a>-><b>`."""

from __future__ import annotations

import json
import logging
from datetime import datetime

from libs.contracts.commands import Reply, ReportLoad
from libs.contracts.envelope import CloudEvent, utcnow
from libs.contracts.events import JobAutoscaled, JobScaled, WorkLoadSampled
from libs.runtime.loops import every
from libs.runtime.service import ServiceRuntime
from services.queue import store
from services.queue.config import QueueSettings
from services.queue.domain import TERMINAL, autoscale, counted_sample, is_replica_set, sampled_reporter

log = logging.getLogger(__name__)


class Autoscaler:
    def __init__(self, runtime: ServiceRuntime, settings: QueueSettings) -> None:
        self.rt = runtime
        self.settings = settings

    async def report_load(self, cmd: ReportLoad) -> Reply:
        async with self.rt.uow() as uow:
            row = await store.get_job(uow.conn, cmd.job_id)
            if row is None:
                return Reply.failure(404, "JobNotFound", f"no job {cmd.job_id}")
            if row["autoscale"] is None:
                return Reply.failure(409, "NotAutoscaled", f"job {cmd.job_id} has no autoscale policy: its load "
                                                           "is not used", job_id=cmd.job_id)
            if row["state"] in TERMINAL:
                return Reply.failure(409, "InvalidJobState", f"job {cmd.job_id} is {row['state']}",
                                     job_id=cmd.job_id, state=row["state"])
            policy = store.autoscale_of(row)
            if policy is not None and policy.signal != "load":
                return Reply.failure(409, "LoadNotPushed", f"job {cmd.job_id} autoscales on {policy.signal}, which "
                                                           "its nodes' agents sample: a pushed load is not used",
                                     job_id=cmd.job_id, signal=policy.signal)
            now = utcnow()
            await store.report_load(uow.conn, cmd.job_id, cmd.reporter, cmd.value, now)
        return Reply.success({"job_id": cmd.job_id, "reporter": cmd.reporter, "value": cmd.value,
                              "at": now.isoformat()})

    async def on_work_load(self, event: CloudEvent, data: WorkLoadSampled) -> None:
        """A replica's load as its node's agent sampled it: kept (the latest per replica) when the job autoscales
        on that signal. Idempotent by design (a replayed or late sample never replaces a newer one): no inbox."""
        async with self.rt.uow() as uow:
            row = await store.get_job(uow.conn, data.job_id)
            if row is None or row["state"] in TERMINAL:
                return
            policy = store.autoscale_of(row)
            if policy is None or policy.signal != data.signal:
                return
            await store.report_load(uow.conn, data.job_id, sampled_reporter(data.replica), data.value,
                                    min(data.sampled_at, utcnow()))  # a node's clock ahead never keeps it fresh

    async def run_forever(self) -> None:
        await every(self.settings.autoscale_interval_s, self.evaluate_all, log=log, failure="autoscale_failed")

    async def evaluate_all(self) -> int:
        async with self.rt.pool.acquire() as conn:
            jobs = await store.autoscaled_jobs(conn)
        steps = 0
        for job_id in jobs:
            steps += await self.evaluate(job_id)
        return steps

    async def evaluate(self, job_id: str, now: datetime | None = None) -> int:
        """One job: 1 if it scaled."""
        now = now or utcnow()
        async with self.rt.uow() as uow:
            loaded = await store.autoscale_inputs(uow.conn, job_id)
            if loaded is None:
                return 0
            row, samples = loaded
            policy = store.autoscale_of(row)
            if policy is None or row["state"] in TERMINAL:
                return 0
            step = autoscale(
                policy, current=row["replicas"], min_replicas=row["min_replicas"], max_replicas=row["max_replicas"],
                samples=[(s["value"], s["at"].timestamp()) for s in samples
                         if counted_sample(policy, s["reporter"], row["replicas"])],
                recommendations=[(at, n) for at, n in json.loads(row["autoscale_recs"])],
                last_scaled_at=row["scaled_at"].timestamp() if row["scaled_at"] else None, now=now.timestamp())
            scaled = step.reason is not None
            await store.save_autoscale(uow.conn, job_id, [list(r) for r in step.recommendations],
                                       now if scaled else None, step.replicas if scaled else None)
            if not scaled:
                return 0
            previous = row["replicas"]
            await store.record_history(uow.conn, job_id, row["state"], row["state"],
                                       f"Autoscaled:{previous}->{step.replicas}")
            await uow.emit(JobAutoscaled(job_id=job_id, team=row["team"], replicas=step.replicas, previous=previous,
                                         signal=policy.signal, load=step.load or 0.0, target=policy.target,
                                         reason=step.reason or "", scaled_at=now))
            await uow.emit(JobScaled(job_id=job_id, team=row["team"], replicas=step.replicas, previous=previous,
                                     replica_set=is_replica_set(step.replicas, row["max_replicas"]),
                                     scaled_at=now))
        log.info("job_autoscaled", extra={"job_id": job_id, "from": previous, "to": step.replicas,
                                          "reason": step.reason})
        return 1
