"""The scheduling cycle: `schedule(snapshot, pending, policy, now) -> Plan`.

This is the walking-skeleton policy: order by (priority desc, submit time, id), then first fit of whole GPUs on one
node. Deterministic: the same inputs always give the same plan.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from libs.core.model import JobRequest, Snapshot
from libs.core.plan import PendingReason, Placement, Plan


@dataclass(frozen=True, slots=True)
class Policy:
    name: str = "fifo"


def queue_order(job: JobRequest) -> tuple:
    return (-job.priority, job.submitted_at, job.job_id)


def schedule(snapshot: Snapshot, pending: Iterable[JobRequest], policy: Policy, now: float) -> Plan:
    del policy, now  # the skeleton policy ignores both; the signature is the contract
    taken = set(snapshot.allocated_gpus)
    placements: list[Placement] = []
    reasons: list[PendingReason] = []
    nodes = sorted(snapshot.nodes, key=lambda n: (n.cluster, n.name))
    for job in sorted(pending, key=queue_order):
        if job.gpus < 1:
            reasons.append(PendingReason(job.job_id, "InvalidRequest", "a job must ask for at least one GPU"))
            continue
        placed = False
        for node in nodes:
            if not node.schedulable:
                continue
            free = [
                g
                for g in sorted(node.gpus, key=lambda g: g.index)
                if g.healthy and g.uuid not in taken and (not job.gpu_models or g.model in job.gpu_models)
            ]
            if len(free) >= job.gpus:
                chosen = free[: job.gpus]
                taken.update(g.uuid for g in chosen)
                placements.append(
                    Placement(
                        job_id=job.job_id,
                        cluster=node.cluster,
                        node=node.name,
                        gpu_uuids=tuple(g.uuid for g in chosen),
                        gpu_indices=tuple(g.index for g in chosen),
                    )
                )
                placed = True
                break
        if not placed:
            models = ", ".join(job.gpu_models) or "any model"
            reasons.append(
                PendingReason(
                    job.job_id,
                    "NoFeasibleNode",
                    f"no schedulable node has {job.gpus} free healthy GPU(s) of {models}",
                )
            )
    return Plan(placements=tuple(placements), pending=tuple(reasons))
