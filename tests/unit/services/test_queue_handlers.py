"""The queue's handlers on the fake runtime (libs/runtime/fake.py): submission with admission by a served stand-in
for quota, idempotency keys, the lifecycle commands, and the allocation events that move a job, through the routing
table; the SQL itself is tested against PostgreSQL in tests/integration/test_queue*.py."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from libs.contracts import subjects
from libs.contracts.commands import AdmitJob, CancelJob, JobRef, Reply, SubmitJob
from libs.contracts.events import (
    AllocationGranted,
    AllocationReleased,
    JobCancelled,
    JobStarted,
    JobStateChanged,
    JobSubmitted,
)
from libs.runtime.fake import FakeRuntime, FakeStore
from services.queue import handlers, store
from services.queue.config import QueueSettings
from services.queue.handlers import QueueHandlers, routes

NOW = datetime(2026, 1, 1, 12, tzinfo=UTC)


class FakeQueueStore(FakeStore):
    """The queue store functions these handlers call, on dicts (same names and arguments as services.queue.store);
    its pure helpers (to_view, work_of, ...) are the real ones."""

    def __init__(self) -> None:
        super().__init__(store)
        self.jobs: dict[str, dict[str, Any]] = {}
        self.history: list[tuple[str, str | None, str, str]] = []
        self.requeue_at: dict[str, datetime | None] = {}

    async def find_by_idempotency_key(self, conn: Any, scope: str, key: str) -> dict[str, Any] | None:
        return next((dict(j) for j in self.jobs.values()
                     if (j["idempotency_scope"], j["idempotency_key"]) == (scope, key)), None)

    async def insert_job(self, conn: Any, job: dict[str, Any]) -> dict[str, Any] | None:
        if job["idempotency_key"] and await self.find_by_idempotency_key(conn, job["idempotency_scope"],
                                                                          job["idempotency_key"]):
            return None
        reason = "AwaitingApproval" if job["state"] == "awaiting_approval" else "Submitted"
        row = {**{k: v for k, v in job.items() if k not in ("work", "autoscale", "node_selector")},
               "attempts": 0, "restarts": 0, "started_at": None, "finished_at": None, "allocation_id": None,
               "node": None, "cluster": None, "exit_code": None, "reason": reason, "attempt_failure": None,
               "work": job["work"].model_dump_json() if job.get("work") else None,
               "autoscale": job["autoscale"].model_dump_json() if job.get("autoscale") else None,
               "node_selector": json.dumps(job.get("node_selector") or {})}
        self.jobs[row["job_id"]] = row
        self.history.append((row["job_id"], None, row["state"], reason))
        return dict(row)

    async def get_job(self, conn: Any, job_id: str, *, for_update: bool = False) -> dict[str, Any] | None:
        return dict(self.jobs[job_id]) if job_id in self.jobs else None

    async def set_state(self, conn: Any, job_id: str, current: str, target: str, reason: str, *, at: datetime,
                        message: str | None = None, **fields: Any) -> dict[str, Any]:
        row = self.jobs[job_id]
        row.update(state=target, message=message, reason=reason)
        if target == "running":
            row["started_at"] = at
        if target == "pending" and current in store.REQUEUED_FROM:
            row.update(attempts=row["attempts"] + 1, attempt_failure=None)
        if fields.pop("restarted", False):
            row["restarts"] += 1
        if target in ("completed", "cancelled", "failed"):
            row["finished_at"] = at
        row.update({k: fields[k] for k in ("allocation_id", "node", "cluster", "exit_code") if k in fields})
        self.history.append((job_id, current, target, reason))
        return dict(row)

    async def record_history(self, conn: Any, job_id: str, from_state: str | None, to_state: str,
                             reason: str) -> None:
        self.history.append((job_id, from_state, to_state, reason))

    async def set_requeue_at(self, conn: Any, job_id: str, at: datetime | None) -> None:
        self.requeue_at[job_id] = at

    async def backlog_counts(self, conn: Any, cap: int, window_s: float) -> tuple[int, int]:
        return min(cap, sum(1 for j in self.jobs.values() if j["state"] == "pending")), 0


@pytest.fixture
async def queue(monkeypatch: pytest.MonkeyPatch) -> tuple[FakeRuntime, FakeQueueStore, list[AdmitJob]]:
    fake = FakeQueueStore()
    monkeypatch.setattr(handlers, "store", fake)
    rt = FakeRuntime("queue", stores=(fake,))
    await rt.mount(routes(QueueHandlers(rt, QueueSettings())))  # type: ignore[arg-type]
    asked: list[AdmitJob] = []

    async def quota_admits(cmd: AdmitJob) -> Reply:  # quota's answer, as the queue reads it
        asked.append(cmd)
        if cmd.team != "research":
            return Reply.failure(422, "UnknownTeam", f"team {cmd.team!r} does not exist")
        return Reply.success({"admitted": True, "priority_class": "normal", "priority": 100, "preemptible": False})
    await rt.serve(subjects.CMD_QUOTA_ADMIT, AdmitJob, quota_admits)
    return rt, fake, asked


def submit(**over: Any) -> SubmitJob:
    return SubmitJob(**({"name": "demo", "team": "research", "gpus": 2} | over))


def granted(job_id: str, allocation_id: str = "a1") -> AllocationGranted:
    return AllocationGranted(allocation_id=allocation_id, job_id=job_id, team="research", project="default",
                             cluster="c1", node="n1", gpus=[], granted_at=NOW)


async def test_a_submitted_job_is_admitted_stored_pending_and_announced(queue) -> None:  # type: ignore[no-untyped-def]
    rt, fake, asked = queue
    reply = await rt.request(subjects.CMD_QUEUE_SUBMIT_JOB, submit())
    assert reply.ok and reply.result["created"] is True and reply.result["state"] == "pending"
    job_id = reply.result["job_id"]
    assert [a.job_id for a in asked] == [job_id] and fake.jobs[job_id]["priority"] == 100
    assert [type(e) for e in rt.emitted()] == [JobStateChanged, JobSubmitted]
    [wanted] = rt.emitted(JobSubmitted)
    assert (wanted.job_id, wanted.gpus, wanted.priority) == (job_id, 2, 100)


async def test_the_same_idempotency_key_replays_the_job_and_another_body_is_refused(queue) -> None:  # type: ignore[no-untyped-def]
    rt, fake, _ = queue
    first = await rt.request(subjects.CMD_QUEUE_SUBMIT_JOB, submit(idempotency_key="k1"))
    again = await rt.request(subjects.CMD_QUEUE_SUBMIT_JOB, submit(idempotency_key="k1"))
    assert again.ok and again.result["created"] is False and again.result["job_id"] == first.result["job_id"]
    other = await rt.request(subjects.CMD_QUEUE_SUBMIT_JOB, submit(idempotency_key="k1", gpus=4))
    assert other.error is not None and (other.error.status, other.error.reason) == (422, "IdempotencyKeyReused")
    assert len(fake.jobs) == 1 and len(rt.emitted(JobSubmitted)) == 1


async def test_a_refused_admission_or_a_silent_quota_stores_nothing(queue) -> None:  # type: ignore[no-untyped-def]
    rt, fake, _ = queue
    refused = await rt.request(subjects.CMD_QUEUE_SUBMIT_JOB, submit(team="nobody"))
    assert refused.error is not None and refused.error.reason == "UnknownTeam"
    rt.nc.subscriptions.clear()  # quota (and the queue itself) no longer answer: nobody asks quota
    handlers_ = QueueHandlers(rt, QueueSettings(admission_timeout_s=0.1))  # type: ignore[arg-type]
    down = await handlers_.submit_job(submit())
    assert down.error is not None and (down.error.status, down.error.reason) == (503, "AdmissionUnavailable")
    assert fake.jobs == {} and rt.outbox == []


async def test_a_grant_starts_a_pending_job_once_however_often_it_is_delivered(queue) -> None:  # type: ignore[no-untyped-def]
    rt, fake, _ = queue
    job_id = (await rt.request(subjects.CMD_QUEUE_SUBMIT_JOB, submit())).result["job_id"]
    rt.take_emitted()
    event = await rt.deliver(granted(job_id))
    row = fake.jobs[job_id]
    assert (row["state"], row["allocation_id"], row["node"]) == ("running", "a1", "n1")
    assert [type(e) for e in rt.emitted()] == [JobStateChanged, JobStarted]

    fake.jobs[job_id]["state"] = "pending"  # were the handler to run again, it would start the job again
    history = len(fake.history)
    await rt.deliver(granted(job_id), event=event)  # the same event again: the inbox holds it
    assert len(fake.history) == history and len(rt.emitted()) == 2
    assert ("queue", event.id) in rt.inbox


async def test_a_lost_node_requeues_the_running_job_after_a_back_off(queue) -> None:  # type: ignore[no-untyped-def]
    rt, fake, _ = queue
    job_id = (await rt.request(subjects.CMD_QUEUE_SUBMIT_JOB, submit())).result["job_id"]
    await rt.deliver(granted(job_id))
    rt.take_emitted()
    await rt.deliver(AllocationReleased(allocation_id="a1", job_id=job_id, team="research", project="default",
                                        cluster="c1", node="n1", gpus=[], granted_at=NOW,
                                        released_at=NOW + timedelta(minutes=1), reason="NodeLost"))
    row = fake.jobs[job_id]
    assert (row["state"], row["attempts"], row["allocation_id"]) == ("pending", 1, None)
    assert fake.requeue_at[job_id] is not None and fake.requeue_at[job_id] > NOW + timedelta(minutes=1)
    [changed] = rt.emitted()  # not wanted again until the back-off is over
    assert (changed.previous, changed.current, changed.reason) == ("running", "pending", "Requeued:NodeLost")


async def test_cancel_announces_the_end_and_a_finished_or_unknown_job_is_refused(queue) -> None:  # type: ignore[no-untyped-def]
    rt, fake, _ = queue
    job_id = (await rt.request(subjects.CMD_QUEUE_SUBMIT_JOB, submit())).result["job_id"]
    done = await rt.request(subjects.CMD_QUEUE_COMPLETE_JOB, JobRef(job_id=job_id))
    assert done.error is not None and done.error.status == 409  # a pending job cannot complete
    rt.take_emitted()
    cancelled = await rt.request(subjects.CMD_QUEUE_CANCEL_JOB, CancelJob(job_id=job_id, reason="typo"))
    assert cancelled.ok and fake.jobs[job_id]["state"] == "cancelled"
    [end] = rt.emitted(JobCancelled)
    assert (end.job_id, end.reason) == (job_id, "typo")
    twice = await rt.request(subjects.CMD_QUEUE_CANCEL_JOB, CancelJob(job_id=job_id))
    assert twice.error is not None and twice.error.status == 409
    missing = await rt.request(subjects.CMD_QUEUE_CANCEL_JOB, CancelJob(job_id="nope"))
    assert missing.error is not None and (missing.error.status, missing.error.reason) == (404, "JobNotFound")
    assert len(rt.emitted(JobCancelled)) == 1
