"""Queue service handlers: job submission and lifecycle commands, and the allocation events that move jobs."""

from __future__ import annotations

import asyncio
import hashlib
import logging
from datetime import timedelta
from typing import Any

from libs.bus.rpc import ServiceUnavailable, request
from libs.contracts import subjects
from libs.contracts.commands import (
    AdmitJob,
    CancelJob,
    JobRef,
    ListJobs,
    Reply,
    ReportLoad,
    ScaleJob,
    SubmitJob,
    UpdateWork,
    page,
)
from libs.contracts.envelope import CloudEvent, utcnow, uuid7
from libs.contracts.events import (
    AllocationGranted,
    AllocationPreempting,
    AllocationReleased,
    ApprovalDecided,
    EventData,
    JobCancelled,
    JobCompleted,
    JobScaled,
    JobStarted,
    JobStateChanged,
    JobSubmitted,
    JobWorkUpdated,
    WorkLoadSampled,
    WorkStarted,
)
from libs.observability.metrics import JOB_TRANSITIONS, QUEUE_JOBS, QUEUE_WAIT_SECONDS
from libs.observability.tracing import current_traceparent, job_span, tracer
from libs.runtime.routes import Routes, idempotent, once
from libs.runtime.service import ServiceRuntime
from services.queue import store
from services.queue.autoscaler import Autoscaler
from services.queue.backlog import Backlog
from services.queue.config import QueueSettings
from services.queue.domain import (
    NOT_REQUEUED,
    STOPS_AFTER_FAILURE,
    TERMINAL,
    WORK_RELEASES,
    after_release,
    after_work_ended,
    can_transition,
    is_replica_set,
    refuse_transition,
    rollout_refusal,
    updated_work,
)

log = logging.getLogger(__name__)
_tracer = tracer("gpupool.queue")
CONSUMER = "queue"


def replica_set_of(row) -> bool:  # type: ignore[no-untyped-def]
    return is_replica_set(row["replicas"], row["max_replicas"])


def submitted_event(row) -> JobSubmitted:  # type: ignore[no-untyped-def]
    """The job as placement must want it: at submission, after an approval, and again after each requeue."""
    return JobSubmitted(
        job_id=row["job_id"], name=row["name"], team=row["team"], project=row["project"], kind=row["kind"],
        priority_class=row["priority_class"], priority=row["priority"], gpus=row["gpus"],
        gpu_models=list(row["gpu_models"]), submitted_at=row["submitted_at"], gang_nodes=row["gang_nodes"],
        gpus_per_node=row["gpus_per_node"], replicas=row["replicas"], replica_set=replica_set_of(row),
        max_runtime_s=row["max_runtime_s"],
        gpu_fraction_milli=row["gpu_fraction_milli"], gpu_memory_mib=row["gpu_memory_mib"],
        mig_profile=row["mig_profile"], exclusive=row["exclusive"], submitted_by=row["submitted_by"],
        work=store.work_of(row), attempt=row["attempts"], cpu_milli=row["cpu_milli"], memory_mib=row["memory_mib"],
        node_selector=store.selector_of(row), preemptible=row["preemptible"])


class QueueHandlers:
    def __init__(self, runtime: ServiceRuntime, settings: QueueSettings) -> None:
        self.rt = runtime
        self.settings = settings
        self.autoscaler = Autoscaler(runtime, settings)
        self.backlog = Backlog(settings, self._count_waiting)

    @staticmethod
    def _step(name: str, row) -> Any:  # type: ignore[no-untyped-def]
        """One step of a job's life as a span of the job's own trace (libs/observability/tracing.job_span)."""
        return job_span(_tracer, name, row["traceparent"] if row is not None else None,
                        {"gpupool.job_id": row["job_id"]} if row is not None else None)

    # --- commands --------------------------------------------------------------------------------------------
    async def submit_job(self, cmd: SubmitJob) -> Reply:
        request_hash = hashlib.sha256(
            cmd.model_dump_json(exclude={"idempotency_key", "idempotency_scope", "submitted_by"}).encode()).hexdigest()
        if cmd.idempotency_key:
            replay = await self._replay(cmd.idempotency_scope, cmd.idempotency_key, request_hash)
            if replay is not None:
                return replay
        refused = await self.backlog.reserve()  # a full queue refuses before quota is asked (429, Retry-After)
        if refused is not None:
            return Reply.refused(refused)
        waits = False
        try:
            reply = await self._submit_new(cmd, request_hash)
            waits = reply.ok and reply.result.get("created") is True and reply.result.get("state") == "pending"
            return reply
        finally:
            if waits:
                self.backlog.admitted()
            else:
                self.backlog.release()

    async def _submit_new(self, cmd: SubmitJob, request_hash: str) -> Reply:
        """Admission by quota, then the job, its first history entry and its events in one transaction."""
        job_id = uuid7()
        admission = await self._admit(cmd, job_id)
        if not admission.ok:
            return admission
        priority = int(admission.result["priority"])  # the quota service owns priority classes
        needs_approval = bool(admission.result.get("approval_required"))
        now = utcnow()
        job = {
            "job_id": job_id, "name": cmd.name, "approval_id": admission.result.get("approval_id"),
            "state": "awaiting_approval" if needs_approval else "pending",
            "message": ("waiting for approval: " + "; ".join(admission.result.get("approval_reasons", []))
                        if needs_approval else "waiting for placement"), "team": cmd.team, "project": cmd.project, "kind": cmd.kind,
            "priority_class": cmd.priority_class, "priority": priority, "gpus": cmd.gpus,
            "gpu_models": cmd.gpu_models, "submitted_by": cmd.submitted_by, "submitted_at": now,
            "gang_nodes": cmd.gang_nodes, "gpus_per_node": cmd.gpus_per_node, "replicas": cmd.replicas,
            "max_runtime_s": cmd.max_runtime_s, "gpu_fraction_milli": cmd.gpu_fraction_milli,
            "gpu_memory_mib": cmd.gpu_memory_mib, "mig_profile": cmd.mig_profile, "exclusive": cmd.exclusive,
            "idempotency_key": cmd.idempotency_key, "idempotency_scope": cmd.idempotency_scope, "request_hash": request_hash, "work": cmd.work_spec(),
            "min_replicas": cmd.min_replicas, "max_replicas": cmd.max_replicas, "autoscale": cmd.autoscale,
            "cpu_milli": cmd.cpu_milli, "memory_mib": cmd.memory_mib, "node_selector": cmd.node_selector,
            "preemptible": cmd.preemptible,
            "traceparent": current_traceparent(),  # the job's trace: every later step of its life joins it
        }
        async with self.rt.uow() as uow:
            row = await store.insert_job(uow.conn, job)
            if row is not None:
                await uow.emit(JobStateChanged(
                    job_id=job_id, team=cmd.team, project=cmd.project, kind=cmd.kind, previous=None,
                    current=job["state"], reason="AwaitingApproval" if needs_approval else "Submitted",
                    message=job["message"], at=now))
            if row is not None and not needs_approval:
                await uow.emit(submitted_event(row))
        if row is None:  # lost a race with the same idempotency key: answer with the winner
            assert cmd.idempotency_key is not None
            replay = await self._replay(cmd.idempotency_scope, cmd.idempotency_key, request_hash)
            assert replay is not None
            return replay
        log.info("job_submitted", extra={"job_id": job["job_id"], "team": cmd.team, "gpus": cmd.gpus,
                                         "awaiting_approval": needs_approval})
        extra = {"approval_id": job["approval_id"], "approval_reasons": admission.result.get("approval_reasons")}
        return Reply.success(store.view_data(row) | {"created": True} |
                             ({k: v for k, v in extra.items() if v} if needs_approval else {}))

    async def _count_waiting(self, cap: int, window_s: float) -> tuple[int, int]:
        async with self.rt.pool.acquire() as conn:
            return await store.backlog_counts(conn, cap, window_s)

    async def _replay(self, scope: str, key: str, request_hash: str) -> Reply | None:
        async with self.rt.pool.acquire() as conn:
            row = await store.find_by_idempotency_key(conn, scope, key)
        if row is None:
            return None
        if row["request_hash"] != request_hash:
            return Reply.failure(422, "IdempotencyKeyReused",
                                 "this Idempotency-Key was already used for a different request")
        return Reply.success(store.view_data(row) | {"created": False})

    async def _admit(self, cmd: SubmitJob, job_id: str) -> Reply:
        """Ask the quota service. Quota down → 503, never a silent accept."""
        try:
            reply = await request(self.rt.nc, subjects.CMD_QUOTA_ADMIT, AdmitJob(
                team=cmd.team, project=cmd.project, priority_class=cmd.priority_class, gpus=cmd.gpus,
                gpu_models=cmd.gpu_models, job_id=job_id, job_name=cmd.name, max_runtime_s=cmd.max_runtime_s,
                submitted_by=cmd.submitted_by), timeout=self.settings.admission_timeout_s)
        except ServiceUnavailable:
            return Reply.failure(503, "AdmissionUnavailable", "the quota service did not answer; retry later")
        return reply

    async def scale_job(self, cmd: ScaleJob) -> Reply:
        """Change how many replicas a replicated job (an inference service) should run; placement adds or
        releases allocations to match."""
        async with self.rt.uow() as uow:
            row, refused = await self._unfinished_job(uow, cmd.job_id, "scaled")
            if refused is not None:
                return refused
            if row["gang_nodes"]:
                return Reply.failure(409, "NotScalable", "a gang job runs all or nothing; it cannot be scaled")
            low, high = row["min_replicas"] or 1, row["max_replicas"] or 256
            if not low <= cmd.replicas <= high:
                return Reply.failure(409, "OutsideReplicaBounds", f"job {cmd.job_id} runs {low} to {high} "
                                     f"replicas; {cmd.replicas} is outside", job_id=cmd.job_id,
                                     min_replicas=low, max_replicas=high)
            if row["replicas"] != cmd.replicas:
                await store.set_replicas(uow.conn, cmd.job_id, cmd.replicas)
                await store.record_history(uow.conn, cmd.job_id, row["state"], row["state"],
                                           f"Scaled:{row['replicas']}->{cmd.replicas}")
                await uow.emit(JobScaled(job_id=cmd.job_id, team=row["team"], replicas=cmd.replicas,
                                         replica_set=is_replica_set(cmd.replicas, row["max_replicas"]),
                                         previous=row["replicas"], scaled_at=utcnow()))
            updated = await store.get_job(uow.conn, cmd.job_id)
        return Reply.success(store.view_data(updated))

    async def _unfinished_job(self, uow, job_id: str, verb: str):  # type: ignore[no-untyped-def]
        """The job's row, locked, or the refusal: unknown (404), or finished and so not to be `verb` (409)."""
        row = await store.get_job(uow.conn, job_id, for_update=True)
        if row is None:
            return None, Reply.failure(404, "JobNotFound", f"no job {job_id}")
        if row["state"] in TERMINAL:
            return row, Reply.refused(refuse_transition(job_id, row["state"], verb))
        return row, None

    async def update_work(self, cmd: UpdateWork) -> Reply:
        """A service's new command or env, rolled out by placement replica by replica (`job.work_updated`)."""
        async with self.rt.uow() as uow:
            row, refused = await self._unfinished_job(uow, cmd.job_id, "updated")
            if refused is not None:
                return refused
            old = store.work_of(row)
            refusal = rollout_refusal(old, replica_set=replica_set_of(row), gang_nodes=row["gang_nodes"])
            if refusal:
                return Reply.failure(409, "NotRollable", refusal, job_id=cmd.job_id)
            assert old is not None
            try:
                new = updated_work(old, command=cmd.command, env=cmd.env)
            except ValueError as exc:
                return Reply.failure(422, "InvalidRequest", str(exc)[:500], job_id=cmd.job_id)
            if new != old:
                revision = await store.set_work(uow.conn, cmd.job_id, new)
                await store.record_history(uow.conn, cmd.job_id, row["state"], row["state"],
                                           f"WorkUpdated:{revision}")
                await uow.emit(JobWorkUpdated(job_id=cmd.job_id, team=row["team"], work=new, revision=revision,
                                              updated_at=utcnow()))
            updated = await store.get_job(uow.conn, cmd.job_id)
        return Reply.success(store.view_data(updated))

    async def complete_job(self, cmd: JobRef) -> Reply:
        return await self._finish(cmd.job_id, "completed", "CompletedByUser")

    async def cancel_job(self, cmd: CancelJob) -> Reply:
        return await self._finish(cmd.job_id, "cancelled", "CancelledByUser", cmd.reason)

    async def _finish(self, job_id: str, target: str, reason: str, message: str | None = None) -> Reply:
        now = utcnow()
        async with self.rt.uow() as uow:
            row = await store.get_job(uow.conn, job_id, for_update=True)
            if row is None:
                return Reply.failure(404, "JobNotFound", f"no job {job_id}")
            if target == "completed" and row["state"] not in ("launching", "running", "preempting"):
                return Reply.refused(refuse_transition(job_id, row["state"], target))
            if not can_transition(row["state"], target):
                return Reply.refused(refuse_transition(job_id, row["state"], target))
            with self._step(f"job {target}", row):
                finished = (JobCompleted(job_id=job_id, team=row["team"], completed_at=now) if target == "completed"
                            else JobCancelled(job_id=job_id, team=row["team"], reason=message or reason,
                                              cancelled_at=now))
                updated = await self._set_state(uow, row, target, reason, at=now, message=message, then=finished)
        log.info("job_finished", extra={"job_id": job_id, "state": target})
        return Reply.success(store.view_data(updated))

    async def _set_state(self, uow, row, target: str, reason: str, *, at, message: str | None = None,  # type: ignore[no-untyped-def]
                         then: EventData | None = None, **fields):
        """One transition of the state machine: the row, its history entry and its JobStateChanged event (and
        `then`, the event the transition means, emitted after it), in the caller's transaction and in one
        statement. Returns the updated job."""
        requeue = target == "pending" and row["state"] in store.REQUEUED_FROM
        if target in TERMINAL and row.get("autoscale") is not None:
            await store.forget_load(uow.conn, row["job_id"])
        await uow.emit(JobStateChanged(
            job_id=row["job_id"], team=row["team"], project=row["project"], kind=row["kind"], previous=row["state"],
            current=target, reason=reason, message=message, attempts=row["attempts"] + (1 if requeue else 0), at=at))
        if then is not None:
            await uow.emit(then)
        updated = await store.set_state(uow.conn, row["job_id"], row["state"], target, reason, at=at,
                                        message=message, outbox=uow.take_outbox(), **fields)
        JOB_TRANSITIONS.labels(to_state=target, reason=reason.split(":")[0]).inc()
        if target in ("launching", "running") and row["state"] == "pending":
            QUEUE_WAIT_SECONDS.labels(team=row["team"], priority_class=row["priority_class"]).observe(
                max(0.0, (at - row["submitted_at"]).total_seconds()))
        return updated

    async def report_queue_depth(self) -> None:
        """/metrics: open jobs by team, class and state, recounted every metrics interval."""
        while True:
            try:
                async with self.rt.pool.acquire() as conn:
                    rows = await store.open_job_counts(conn)
                QUEUE_JOBS.clear()
                for r in rows:
                    QUEUE_JOBS.labels(team=r["team"], priority_class=r["priority_class"], state=r["state"]).set(r["n"])
            except Exception as exc:  # the database is away: the next round tries again
                log.debug("queue_depth_unavailable", extra={"error": repr(exc)})
            await asyncio.sleep(self.settings.metrics_interval_s)

    # --- queries ---------------------------------------------------------------------------------------------
    async def get_job(self, cmd: JobRef) -> Reply:
        async with self.rt.pool.acquire() as conn:
            row = await store.get_job(conn, cmd.job_id)
            if row is None:
                return Reply.failure(404, "JobNotFound", f"no job {cmd.job_id}")
            events = await store.history(conn, cmd.job_id)
        view = store.view_data(row)
        view["history"] = [{"at": e["at"].isoformat(), "from": e["from_state"], "to": e["to_state"],
                            "reason": e["reason"]} for e in events]
        return Reply.success(view)

    async def list_jobs(self, cmd: ListJobs) -> Reply:
        async with self.rt.pool.acquire() as conn:
            rows = await store.list_jobs(conn, team=cmd.team, state=cmd.state, limit=cmd.limit + 1,
                                         after=cmd.after)
        return Reply.success(page(rows, cmd.limit, store.view_data,
                                  lambda item: item["job_id"]))

    # --- events ----------------------------------------------------------------------------------------------
    async def on_allocation_granted(self, event: CloudEvent, data: AllocationGranted) -> None:
        async with self.rt.uow() as uow:
            row = await store.get_job(uow.conn, data.job_id, for_update=True)
            if row is None or row["state"] != "pending":
                # cancelled meanwhile: placement releases the allocation when it sees the cancellation
                log.info("allocation_for_non_pending_job", extra={"job_id": data.job_id,
                                                                  "state": row["state"] if row else None})
                return
            uow.after_commit(self._granted)  # counted once durable: a batch applied again counts it once
            if row["work"] is not None:  # running once the agent says the process started
                await self._set_state(uow, row, "launching", "AllocationGranted", at=data.granted_at,
                                      message=f"starting on {data.node}", allocation_id=data.allocation_id,
                                      node=data.node, cluster=data.cluster, exit_code=None)
                return
            await self._set_state(uow, row, "running", "AllocationGranted",
                                  at=data.granted_at, message=None, allocation_id=data.allocation_id,
                                  node=data.node, cluster=data.cluster, then=JobStarted(
                                      job_id=data.job_id, allocation_id=data.allocation_id, cluster=data.cluster,
                                      node=data.node, started_at=data.granted_at, team=row["team"]))

    async def _granted(self) -> None:
        self.backlog.granted()

    async def on_work_started(self, event: CloudEvent, data: WorkStarted) -> None:
        """The agent started the work (the first gang member's start is the job's)."""
        async with self.rt.uow() as uow:
            row = await store.get_job(uow.conn, data.job_id, for_update=True)
            if row is None or row["state"] != "launching" or data.attempt != row["attempts"]:
                return
            with self._step("attempt started", row):
                await self._set_state(uow, row, "running", "WorkStarted", at=data.started_at,
                                      message=f"pid {data.pid} on {data.node} ({data.isolation})")
                await uow.emit(JobStarted(job_id=data.job_id, allocation_id=data.allocation_id,
                                          cluster=data.cluster, node=data.node, started_at=data.started_at,
                                          team=row["team"]))

    async def on_approval_decided(self, event: CloudEvent, data: ApprovalDecided) -> None:
        """Approved: the job joins the queue now (placement learns of it only at this point). Denied: it fails."""
        async with self.rt.uow() as uow:
            row = await store.get_job(uow.conn, data.job_id, for_update=True)
            if row is None or row["state"] != "awaiting_approval":
                return
            verdict = f"{'approved' if data.approved else 'denied'} by {data.decided_by}"
            message = f"{verdict}: {data.comment}" if data.comment else verdict
            if not data.approved:
                await self._set_state(uow, row, "failed", "ApprovalDenied",
                                      at=data.decided_at, message=message)
                return
            await self._set_state(uow, row, "pending", "Approved",
                                  at=data.decided_at, message=message)
            await uow.emit(submitted_event(row))

    async def on_allocation_preempting(self, event: CloudEvent, data: AllocationPreempting) -> None:
        """The checkpoint signal: the job keeps running until the deadline, visibly marked as preempting."""
        async with self.rt.uow() as uow:
            row = await store.get_job(uow.conn, data.job_id, for_update=True)
            if row is not None and replica_set_of(row) and row["state"] == "running":
                await store.record_history(uow.conn, data.job_id, "running", "running",
                                           f"ReplicaPreempting:{data.replica}:{data.reason}")
                return  # one replica of a service goes; placement brings it back elsewhere
            if row is None or row["state"] not in ("launching", "running") \
                    or row["allocation_id"] != data.allocation_id:
                return
            if data.reason in STOPS_AFTER_FAILURE:  # not a preemption: the attempt ends with its members' exits
                await store.record_history(uow.conn, data.job_id, row["state"], row["state"], data.reason)
                return
            with self._step("job preempting", row):
                await self._set_state(uow, row, "preempting", data.reason, at=utcnow(),
                                      message=f"{data.message}; checkpoint before {data.deadline.isoformat()}")

    async def on_allocation_released(self, event: CloudEvent, data: AllocationReleased) -> None:
        """A release the user did not ask for (node lost, reclaimed) sends a running job back to the queue."""
        if data.reason in NOT_REQUEUED:
            return  # nothing to do, so nothing to remember either (most releases: every finished job's)
        async with self.rt.uow() as uow:
            row = await store.get_job(uow.conn, data.job_id, for_update=True)
            if row is not None and data.exit is not None and data.reason in WORK_RELEASES:
                with self._step("attempt ended", row):
                    await self._work_ended(uow, row, data)
                return
            outcome = after_release(
                data.reason, state=row["state"] if row is not None else None,
                ours=row is not None and row["allocation_id"] == data.allocation_id,
                replica_set=row is not None and replica_set_of(row), attempts=row["attempts"] if row else 0,
                released_at=data.released_at, backoff_s=self.settings.requeue_backoff_s,
                backoff_max_s=self.settings.requeue_backoff_max_s)
            if outcome.action == "ignore":
                return
            with self._step("allocation lost", row):
                if outcome.action == "fail":
                    await self._set_state(uow, row, "failed", outcome.reason, at=data.released_at,
                                          message=outcome.message)
                    return
                updated = await self._set_state(uow, row, "pending", outcome.reason, at=data.released_at,
                                                message=outcome.message, allocation_id=None, node=None, cluster=None)
                if outcome.back_at is not None:  # the sweep wants it again then
                    await store.set_requeue_at(uow.conn, data.job_id, outcome.back_at)
                else:
                    await uow.emit(submitted_event(updated))  # with its new attempt number

    async def _work_ended(self, uow, row, data: AllocationReleased) -> None:  # type: ignore[no-untyped-def]
        """One allocation's work ended and its GPUs are free: the domain rule says what that means for the job."""
        assert data.exit is not None
        outcome = after_work_ended(
            state=row["state"], replica_set=replica_set_of(row), work=store.work_of(row), restarts=row["restarts"],
            recorded=store.failure_of(row), release_reason=data.reason, exit=data.exit,
            remaining=data.remaining or 0)
        at = data.released_at
        if outcome.action == "ignore":
            return
        if outcome.action == "wait":
            if outcome.failure is not None:
                await store.remember_failure(uow.conn, row["job_id"], outcome.failure)
            return
        if outcome.action == "complete":
            await self._set_state(uow, row, "completed", outcome.reason, at=at, message=outcome.message,
                                  exit_code=0)
            await uow.emit(JobCompleted(job_id=row["job_id"], team=row["team"], completed_at=at))
            return
        if outcome.action == "fail":
            await self._set_state(uow, row, "failed", outcome.reason, at=at, message=outcome.message,
                                  exit_code=outcome.exit_code)
            return
        back = at + timedelta(seconds=outcome.delay_s)
        updated = await self._set_state(uow, row, "pending", outcome.reason, at=at, message=outcome.message,
                                        exit_code=outcome.exit_code, allocation_id=None, node=None, cluster=None,
                                        restarted=True)
        if outcome.delay_s > 0:
            await store.set_requeue_at(uow.conn, row["job_id"], back)  # the sweep wants it again then
        else:
            await uow.emit(submitted_event(updated))

    async def release_due_requeues(self) -> int:
        """Jobs whose requeue back-off is over are wanted by placement again."""
        async with self.rt.uow() as uow:
            rows = await store.due_requeues(uow.conn, utcnow())
            for row in rows:
                await uow.emit(submitted_event(row))
        return len(rows)

    async def sweep_requeues(self) -> None:
        while True:
            await asyncio.sleep(self.settings.requeue_sweep_interval_s)
            try:
                await self.release_due_requeues()
            except Exception as exc:  # the database is away: next round
                log.warning("requeue_sweep_failed", extra={"error": repr(exc)})


def routes(h: QueueHandlers) -> Routes:
    return Routes(
        inbox=CONSUMER,
        commands={
            subjects.CMD_QUEUE_SUBMIT_JOB: (SubmitJob, h.submit_job),
            subjects.CMD_QUEUE_COMPLETE_JOB: (JobRef, h.complete_job),
            subjects.CMD_QUEUE_CANCEL_JOB: (CancelJob, h.cancel_job),
            subjects.CMD_QUEUE_SCALE_JOB: (ScaleJob, h.scale_job),
            subjects.CMD_QUEUE_REPORT_LOAD: (ReportLoad, h.autoscaler.report_load),
            subjects.CMD_QUEUE_UPDATE_WORK: (UpdateWork, h.update_work),
            subjects.QUERY_QUEUE_GET_JOB: (JobRef, h.get_job),
            subjects.QUERY_QUEUE_LIST_JOBS: (ListJobs, h.list_jobs),
        },
        events={
            AllocationGranted: once(h.on_allocation_granted),
            AllocationPreempting: once(h.on_allocation_preempting),
            ApprovalDecided: once(h.on_approval_decided),
            AllocationReleased: once(h.on_allocation_released),
            WorkStarted: once(h.on_work_started),
            WorkLoadSampled: idempotent(h.autoscaler.on_work_load, "the latest sample per replica is kept: a replayed "
                                        "or late sample never replaces a newer one"),
        },
        # every event handler is one unit of work and nothing else (no pool reads, RPCs or publishes): safe to
        # apply a fetched batch in one transaction (README: "Batched event handling")
        batched=True,
    )
