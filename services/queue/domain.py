"""The job state machine: which transitions are legal, and the refusal when one is not."""

from __future__ import annotations

from libs.contracts.commands import Reply

TERMINAL = frozenset({"completed", "cancelled", "failed"})

TRANSITIONS: dict[str, frozenset[str]] = {
    "awaiting_approval": frozenset({"pending", "cancelled", "failed"}),
    "pending": frozenset({"running", "cancelled", "failed"}),
    # back to pending: requeue after preemption or node loss
    "running": frozenset({"completed", "cancelled", "failed", "pending", "preempting"}),
    # preempting: the checkpoint signal went out; the GPUs go back at the deadline, then the job is requeued
    "preempting": frozenset({"completed", "cancelled", "failed", "pending"}),
    "completed": frozenset(),
    "cancelled": frozenset(),
    "failed": frozenset(),
}


def can_transition(current: str, target: str) -> bool:
    return target in TRANSITIONS.get(current, frozenset())


def refuse_transition(job_id: str, current: str, target: str) -> Reply:
    if current in TERMINAL:
        return Reply.failure(409, "JobAlreadyFinished", f"job {job_id} is already {current}",
                             job_id=job_id, state=current)
    return Reply.failure(409, "InvalidJobState", f"job {job_id} is {current}; it cannot become {target}",
                         job_id=job_id, state=current)

