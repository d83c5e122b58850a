"""The facts of a pending reason as explain returns them (`GET /v1/jobs/{id}/explain` → `placement.facts`): what the
scheduling core's `ReasonFacts` say, validated and bounded (lists cut at `MAX_LISTED`, with the full count beside
them), so clients read numbers instead of parsing the message."""

from __future__ import annotations

from datetime import datetime
from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field

MAX_LISTED = 32  # names one list of the facts carries at most (victims, nodes, holders)
Name = Annotated[str, Field(max_length=253)]
Count = Annotated[int, Field(ge=0, le=10_000_000)]
Gpus = Annotated[float, Field(ge=0, le=10_000_000)]

Cause = Literal["", "invalid", "fifo", "no_model", "quota", "selector", "reserved", "no_room", "gang", "never_host",
                "never_node", "never_members", "never_gpus"]
Filter = Literal["cordoned", "node_selector", "gpu_model", "health", "sharing", "host_size"]
Shortage = Literal["gpus", "gpu_share", "mig_slice", "cpu", "memory", "reserved", "able"]
Dimension = Literal["", "gpus", "gpu_share", "mig_slice", "cpu", "memory"]
QuotaRule = Literal["borrowing_limit", "lending", "guarantee_only", "no_quota", "over_quota"]


class _Facts(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class QuotaRefusal(_Facts):
    """The quota entry that refuses the job, in GPUs of what the entry counts."""

    path: Name = Field(description="the refusing level: org, org/team or org/team/project")
    gpu_model: Name = Field(description="the model the entry counts; '*' for an entry over GPUs of any model")
    rule: QuotaRule = Field(description="borrowing_limit: used + asked over guarantee + borrowing limit; lending: "
                                        "what it would borrow is more than others can lend now; guarantee_only: "
                                        "non-preemptible work may use only its team's guarantee; no_quota: strict "
                                        "quotas and no entry for the model")
    used_gpus: Gpus = Field(description="what the level uses now")
    asked_gpus: Gpus = Field(description="what the job would add")
    limit_gpus: Gpus = Field(description="the most the level may use under the rule")
    guaranteed_gpus: Gpus


class PreemptionWait(_Facts):
    """Victims exist, but preempting now would throw away more work than waiting has cost (the ski-rental rule)."""

    would_preempt: list[Name] = Field(max_length=MAX_LISTED)
    lost_gpu_hours: Gpus = Field(description="the work a restart of the victims would lose")
    waited_gpu_hours: Gpus = Field(description="what waiting has cost so far (GPU demand x time waited)")
    max_wait_s: Gpus = Field(description="the longest it waits before it preempts anyway")


class Victim(_Facts):
    job_id: Name
    reason: Name = Field(description="PreemptedByPriority, ReclaimedForGuarantee or PreemptedWithinQuota")


class PendingFacts(_Facts):
    """Why a job waits, as data: the message of its reason is rendered from these."""

    cause: Cause = Field(default="", description="which sentence the message is")
    ask: str = Field(default="", max_length=500, description="the request in words")
    cpu_milli: Count = 0
    memory_mib: Count = 0
    nodes_evaluated: Count = Field(default=0, description="nodes the last cycle looked at for it")
    filtered: dict[Filter, Count] = Field(default_factory=dict, description="nodes that could never serve it, "
                                          "by filter: cordoned (not schedulable), node_selector, gpu_model, health, "
                                          "sharing, host_size")
    short: dict[Shortage, Count] = Field(default_factory=dict, description="the other nodes, by what they lack "
                                         "now (reserved: held for another job; able: could take a gang member)")
    exhausted: Dimension = Field(default="", description="the resource most of those nodes lack")
    nodes_able: Count = 0
    nodes_needed: Count = 0
    gpus_able: Count = 0
    domain_kind: Literal["", "rack"] = Field(default="", description="rack: a gang waits for one topology domain")
    domain: Name = Field(default="", description="the domain closest to holding the gang ('' none has a node)")
    domain_nodes: Count = 0
    labels: dict[Name, Name] = Field(default_factory=dict, max_length=64,
                                     description="the node_selector labels no schedulable node carries together")
    holders: list[Name] = Field(default_factory=list, max_length=MAX_LISTED,
                                description="jobs the capacity that fits is reserved for")
    blocked_by: Name = Field(default="", description="FIFO: the queue head it waits behind")
    quota: QuotaRefusal | None = None
    victims_considered: Count = Field(default=0, description="running jobs a preemption search weighed for it")
    victims: list[Victim] = Field(default_factory=list, max_length=MAX_LISTED,
                                  description="Preempting: the jobs it waits for")
    victim_count: Count = 0
    victim_nodes: list[Name] = Field(default_factory=list, max_length=MAX_LISTED)
    within_quota: bool = False
    wait: PreemptionWait | None = None
    reservation_nodes: list[Name] = Field(default_factory=list, max_length=MAX_LISTED,
                                          description="nodes held for it (backfill)")
    reservation_node_count: Count = 0
    reservation_start: datetime | None = Field(default=None, description="when the held nodes are expected free")
    reservation_in_s: float | None = Field(default=None, ge=-1e9, le=1e9,
                                           description="seconds from the cycle to that start")
    soft_hold: bool = Field(default=False, description="the start is unknown: other work is only steered away")
    detail: str = Field(default="", max_length=2000)
