"""What one scheduling cycle decides: data, not actions, so callers can verify before they commit.

Decide and act are separate: a `Preemption` names a victim and why; the caller evicts it, and the preemptor,
still pending with reason `Preempting`, is placed in a later cycle on the capacity that frees up.
"""

from __future__ import annotations

from dataclasses import dataclass

from libs.core.model import MigInstance


@dataclass(frozen=True, slots=True)
class Placement:
    """One node's share of a job (a gang has one Placement per node, same job_id, replica 0..K-1)."""

    job_id: str
    cluster: str
    node: str
    gpu_uuids: tuple[str, ...]
    gpu_indices: tuple[int, ...]
    replica: int = 0
    gpu_model: str = ""
    gpu_fraction_milli: int = 0  # > 0: a fraction of the single listed GPU
    gpu_memory_mib: int = 0
    mig: MigInstance | None = None  # set: the MIG instance of the single listed GPU
    cpu_milli: int = 0
    memory_mib: int = 0


@dataclass(frozen=True, slots=True)
class PendingReason:
    """Why a job stays pending: a machine code (CamelCase) and a message for people."""

    job_id: str
    reason: str
    message: str


@dataclass(frozen=True, slots=True)
class Preemption:
    """A victim to evict so that `preemptor` can run: reason `PreemptedByPriority` (same team, lower priority),
    `PreemptedWithinQuota` (lower priority, of the quota subtree that refuses the preemptor) or
    `ReclaimedForGuarantee` (the victim's team borrows capacity another team is guaranteed)."""

    job_id: str
    node: str
    preemptor: str
    reason: str
    message: str


@dataclass(frozen=True, slots=True)
class MigReconfig:
    """Instances to destroy (idle ones only) and create on one GPU before the placements that use them."""

    node: str
    gpu_uuid: str
    destroy: tuple[MigInstance, ...]
    create: tuple[MigInstance, ...]


@dataclass(frozen=True, slots=True)
class Reservation:
    """Capacity held for a blocked job: backfill may use it only for work that ends before `start_by`. When that
    start is unknown (running work there declared no end) the hold is `soft`: other work avoids the nodes while
    anything else fits and uses them otherwise, so nothing idles for an end nobody knows."""

    job_id: str
    nodes: tuple[str, ...]
    start_by: float  # inf when running work has no known end
    soft: bool = False


@dataclass(frozen=True, slots=True)
class Plan:
    """`pending` lists the jobs left waiting in the order the cycle tried them (invalid requests first): the
    queue's real order, priority then fair share then submit time, which `explain` reports as a position."""

    placements: tuple[Placement, ...]
    pending: tuple[PendingReason, ...]
    preemptions: tuple[Preemption, ...] = ()
    mig_reconfigs: tuple[MigReconfig, ...] = ()
    reservations: tuple[Reservation, ...] = ()
    # what the cycle did, as counters (deterministic, for metrics and explain): jobs, placed, pending,
    # node_groups (distinct node states), groups_scored, preemption_searches, victims, reservations
    stats: tuple[tuple[str, int], ...] = ()

    def reason_of(self, job_id: str) -> PendingReason | None:
        for r in self.pending:
            if r.job_id == job_id:
                return r
        return None

    def placements_of(self, job_id: str) -> tuple[Placement, ...]:
        return tuple(p for p in self.placements if p.job_id == job_id)
