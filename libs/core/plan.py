"""What one scheduling cycle decides: data, not actions, so callers can verify before they commit.

Decide and act are separate: a `Preemption` names a victim and why; the caller evicts it, and the preemptor,
still pending with reason `Preempting`, is placed in a later cycle on the capacity that frees up.
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from operator import attrgetter

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
class QuotaFacts:
    """The quota entry that refuses a job, with its numbers in milli-GPUs of what the entry counts (`gpu_model`:
    that model's GPUs, or "*" for a wildcard entry that counts GPUs of any model). `rule`: `borrowing_limit` (used
    + asked over guarantee + borrowing limit = `limit_milli`), `lending` (what it would borrow is more than the
    others can lend now: `limit_milli` is the guarantee plus what can be lent), `guarantee_only` (non-preemptible
    work may use only its team's guarantee = `limit_milli`) or `no_quota` (strict quotas, no entry for the model); `over_quota` (refused, nothing more known)."""

    path: str
    gpu_model: str
    rule: str
    used_milli: int = 0
    asked_milli: int = 0
    limit_milli: int = 0
    guaranteed_milli: int = 0


@dataclass(frozen=True, slots=True)
class WaitFacts:
    """Victims exist but preempting them now would throw away more work than waiting has cost (the ski-rental rule):
    the would-be victims, the GPU-seconds their restart would lose, the GPU-seconds waiting has cost so far, and the
    longest the job waits before it preempts anyway."""

    would_preempt: tuple[str, ...]
    lost_gpu_s: float
    waited_gpu_s: float
    max_wait_s: float


@dataclass(frozen=True, slots=True)
class ReasonFacts:
    """What a pending reason is made of, as data (Nomad's AllocMetric, Kueue's conditions): the message is rendered
    from these (`explain.render`). `cause` names the sentence: invalid, fifo, no_model, quota, selector, reserved,
    no_room, gang, never_host, never_node, never_members, never_gpus.

    The node census (no_room, gang, never_*, selector): `nodes_evaluated` nodes looked at; `filtered` (filter,
    nodes) for nodes that could never serve the request: cordoned (not schedulable), node_selector, gpu_model (no
    GPU of the models it may use, with the memory it asks), health (only unhealthy ones), sharing (none in the
    sharing mode or with the MIG profile it needs), host_size (too little CPU/memory even empty); `short`
    (dimension, nodes) for the others that have no room now: gpus, gpu_share, mig_slice, cpu, memory, reserved
    (held for another job), able (could take a gang member); `exhausted` the resource dimension most of them lack."""

    cause: str = ""
    ask: str = ""  # the request in words
    cpu_milli: int = 0
    memory_mib: int = 0
    nodes_evaluated: int = 0
    filtered: tuple[tuple[str, int], ...] = ()
    short: tuple[tuple[str, int], ...] = ()
    exhausted: str = ""
    nodes_able: int = 0  # gang: nodes that can take a member now (never_members: even empty)
    nodes_needed: int = 0  # gang: members (or GPUs of an anywhere gang) it needs
    gpus_able: int = 0  # never_gpus: GPUs of the pool that could serve it, even empty
    domain_kind: str = ""  # "rack" when a gang waits for one topology domain
    domain: str = ""  # the domain closest to holding it ("" when none has a node that can take a member now)
    domain_nodes: int = 0  # nodes of that domain able to take a member now
    labels: tuple[tuple[str, str], ...] = ()  # selector: the labels no schedulable node carries together
    holders: tuple[str, ...] = ()  # reserved: the jobs the fitting capacity is held for
    blocked_by: str = ""  # fifo: the queue head it waits behind
    quota: QuotaFacts | None = None
    victims_considered: int = 0  # candidates a preemption search weighed for it this cycle
    victims: tuple[tuple[str, str], ...] = ()  # Preempting: (victim, why) it waits for
    victim_nodes: tuple[str, ...] = ()  # Preempting: the nodes held for it
    within_quota: bool = False  # Preempting to make room within its quota (the refusal follows the message)
    wait: WaitFacts | None = None
    reservation_nodes: tuple[str, ...] = ()
    reservation_start: float | None = None  # inf: a soft hold (the start is unknown)
    reservation_in_s: float | None = None  # seconds from the cycle's time to the start
    detail: str = ""  # invalid: what is wrong with the request


NO_FACTS = ReasonFacts()
_FACT_NAMES = tuple(f.name for f in fields(ReasonFacts))
_fact_values = attrgetter(*_FACT_NAMES)
_CONSIDERED = _FACT_NAMES.index("victims_considered")


def with_considered(facts: ReasonFacts, n: int) -> ReasonFacts:
    """`dataclasses.replace(facts, victims_considered=n)` without its walk over the fields: blocked jobs of a deep
    queue make hundreds of thousands of these copies, and the walk was most of their cost."""
    values = list(_fact_values(facts))
    values[_CONSIDERED] = n
    return ReasonFacts(*values)


@dataclass(frozen=True, slots=True)
class PendingReason:
    """Why a job stays pending: a machine code (CamelCase), a message for people and the facts it says."""

    job_id: str
    reason: str
    message: str
    facts: ReasonFacts = NO_FACTS


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
