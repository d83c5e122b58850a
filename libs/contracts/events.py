"""Typed payloads (`data`) of every gpupool event, and the registry that binds each to its type and subject.

Wire contract: other systems build on these. Change a payload only by adding optional fields or a new version
(`...v2`) registered beside the old one.
"""

from __future__ import annotations

from datetime import datetime
from decimal import Decimal
from typing import Annotated, Any, ClassVar, Literal

from pydantic import AfterValidator, ConfigDict, Field, ValidationError

from libs.contracts import subjects
from libs.contracts.addresses import PeerAddress
from libs.contracts.agent_events import (  # noqa: F401 (the agent's payloads are importable from here too)
    AgentAllocationEvent,
    AgentWorkEvent,
    EndpointEvent,
    EndpointReady,
    EndpointUnready,
    FractionExceeded,
    GpuTelemetry,
    MigApplied,
    TelemetrySampled,
    WorkExited,
    WorkLoadSampled,
    WorkReady,
    WorkStarted,
)
from libs.contracts.bounds import BoundedModel
from libs.contracts.envelope import CloudEvent, InvalidEnvelope, schema_of
from libs.contracts.event_base import MAX_EVENT_NUMBER, MAX_EVENT_TEXT, AllocationSubject, EventData, Health  # noqa: F401
from libs.contracts.labels import MAX_SELECTOR, check_labels
from libs.contracts.work import WorkExit, WorkSpec

# Inventory's health state machine per GPU (healthy → suspect → quarantined → probation → healthy). `Health`
# is the coarse view every consumer already reads: healthy ↔ healthy, suspect/probation ↔ degraded, quarantined ↔
# failed; only a `healthy` GPU gets new work.
GpuState = Literal["healthy", "suspect", "quarantined", "probation"]
SharingMode = Literal["exclusive", "fractional", "mig"]


# --- inventory --------------------------------------------------------------------------------------------------
class NicSpec(BoundedModel):
    """A node's network interface that matters to GPU work (the data plane: Ethernet and InfiniBand ports)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str = Field(min_length=1, max_length=64, description="e.g. eth0, ens1f0, mlx5_0/1")
    kind: Literal["ethernet", "infiniband", "other"] = "ethernet"
    speed_mbps: int | None = Field(default=None, ge=0, description="Link speed; None when down or unknown")


class VolumeSpec(BoundedModel):
    """A filesystem the node offers work (local scratch, the root disk, a shared mount)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    mount: str = Field(min_length=1, max_length=256)
    total_gib: float = Field(ge=0)
    filesystem: str = Field(default="", max_length=64, description="e.g. ext4, xfs, nfs4, lustre")


class GpuSpec(BoundedModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    uuid: str = Field(min_length=1, max_length=128)
    index: int = Field(ge=0, le=255)
    model: str = Field(min_length=1, max_length=64, description="Canonical short model, e.g. H100-80GB")
    name: str = Field(default="", max_length=128, description="Marketing name reported by NVML")
    memory_mib: int = Field(ge=0)
    numa_node: int | None = None
    nvlink_peers: list[int] = Field(default_factory=list)
    mig_mode: bool = False
    health: Health = "healthy"
    state: GpuState | None = Field(default=None, description="Inventory's health state of this GPU (in "
                                                             "NodeRegistered); agents leave it unset")


class NodeRegistered(EventData):
    event_type: ClassVar[str] = "io.gpupool.node.registered.v1"
    event_subject: ClassVar[str] = subjects.NODE_REGISTERED
    entity_field: ClassVar[str] = "node"

    cluster: str
    node: str
    hostname: str
    cpu_count: int
    memory_mib: int
    driver_version: str = ""
    labels: dict[str, str] = Field(default_factory=dict)
    gpus: list[GpuSpec]
    registered_at: datetime
    address: PeerAddress = ""


class NodeLost(EventData):
    """A ready node sent nothing (no telemetry, no registration) for longer than inventory's threshold."""

    event_type: ClassVar[str] = "io.gpupool.node.lost.v1"
    event_subject: ClassVar[str] = subjects.NODE_LOST
    entity_field: ClassVar[str] = "node"

    cluster: str
    node: str
    last_seen_at: datetime = Field(description="When the node last reported (its last sample's time)")
    detected_at: datetime = Field(description="When inventory declared it lost")


class NodeRecovered(EventData):
    """A lost node reported again (a fresh telemetry sample or a re-registration) and is ready again."""

    event_type: ClassVar[str] = "io.gpupool.node.recovered.v1"
    event_subject: ClassVar[str] = subjects.NODE_RECOVERED
    entity_field: ClassVar[str] = "node"

    cluster: str
    node: str
    lost_at: datetime | None = Field(default=None, description="When inventory had declared it lost")
    last_seen_at: datetime = Field(description="The report that brought it back")
    recovered_at: datetime
    cordoned: bool = Field(default=False, description="The node is back but cordoned: still take no new work")


class NodeCordoned(EventData):
    """An operator cordoned a node: no new work is placed on it. With `drain`, its allocations are also taken
    back (reclamation releases them with reason `Drained`; restartable jobs are requeued elsewhere)."""

    event_type: ClassVar[str] = "io.gpupool.node.cordoned.v1"
    event_subject: ClassVar[str] = subjects.NODE_CORDONED
    entity_field: ClassVar[str] = "node"

    cluster: str
    node: str
    drain: bool = False
    reason: str = ""
    by: str = ""
    cordoned_at: datetime


class NodeUncordoned(EventData):
    """An operator uncordoned a node: it takes new work again once it is also `ready` (`node_state`)."""

    event_type: ClassVar[str] = "io.gpupool.node.uncordoned.v1"
    event_subject: ClassVar[str] = subjects.NODE_UNCORDONED
    entity_field: ClassVar[str] = "node"

    cluster: str
    node: str
    node_state: Literal["ready", "lost"] = "ready"
    by: str = ""
    uncordoned_at: datetime


class GpuHealthChanged(EventData):
    event_type: ClassVar[str] = "io.gpupool.gpu.health_changed.v1"
    event_subject: ClassVar[str] = subjects.GPU_HEALTH_CHANGED
    entity_field: ClassVar[str] = "gpu_uuid"

    cluster: str
    node: str
    gpu_uuid: str
    gpu_index: int
    previous: Health
    current: Health
    reasons: list[str] = Field(default_factory=list)
    observed_at: datetime
    state: GpuState | None = Field(default=None, description="The new state of inventory's health state machine")
    previous_state: GpuState | None = None
    reason: str = Field(default="", description="Why, as a machine code: FatalXid, UncorrectableEcc, GpuLost, "
                                                "RemapFailure, NonFatalXid, EccBurst, EccStorm, RetiredPagesPending, "
                                                "RepeatedSuspect, SuspectCleared, "
                                                "RecheckPassed, ClearedByOperator, QuarantinedByOperator, "
                                                "FailedProbation, ProbationPassed")
    by: str = Field(default="", description="The operator, for a manual clear or quarantine")


# --- queue ------------------------------------------------------------------------------------------------------
class JobSubmitted(EventData):
    event_type: ClassVar[str] = "io.gpupool.job.submitted.v1"
    event_subject: ClassVar[str] = subjects.JOB_SUBMITTED
    entity_field: ClassVar[str] = "job_id"

    job_id: str
    name: str
    team: str
    project: str
    kind: str
    priority_class: str
    priority: int
    gpus: int
    gpu_models: list[str] = Field(default_factory=list)
    submitted_at: datetime
    gang_nodes: int = 0
    gpus_per_node: int = 0
    replicas: int = 1
    replica_set: bool = Field(default=False, description="a replica set (a service): each replica is placed, "
                              "replaced and scaled by itself, even while it has one (replicas > 1 is one always)")
    max_runtime_s: float | None = None
    submitted_by: str | None = Field(default=None, max_length=256,
                                     description="Who submitted it (the caller's token or identity name)")
    gpu_fraction_milli: int = Field(default=0, ge=0, le=1000,
                                    description="A fraction of one GPU (1..999 milli-GPU of compute); 0: whole GPUs")
    gpu_memory_mib: int = Field(default=0, ge=0, description="GPU memory of a fraction, MiB")
    mig_profile: str = Field(default="", max_length=32, description="A MIG slice, e.g. 1g.10gb; empty: none")
    exclusive: bool = Field(default=False, description="A dev job that insists on a whole GPU")
    work: WorkSpec | None = Field(default=None, description="What the agent runs on the GPUs; null: the caller "
                                                            "launches its own work")
    attempt: int = Field(default=0, ge=0, description="times the job was requeued or restarted before this")
    cpu_milli: int = Field(default=0, ge=0, description="host CPU reserved on each node it holds, milli-cores")
    memory_mib: int = Field(default=0, ge=0, description="host memory reserved on each node it holds, MiB")
    node_selector: Annotated[dict[str, str], AfterValidator(check_labels)] = Field(
        default_factory=dict, max_length=MAX_SELECTOR, description="labels each of its nodes must carry")
    preemptible: bool | None = Field(default=None, description="its own word on preemption; null: its priority "
                                                               "class and kind decide")


class JobStateChanged(EventData):
    """Every transition of a job's state machine (awaiting_approval → pending → running → preempting → pending …
    → completed / cancelled / failed), with the reason: a job's whole history can be rebuilt from these alone."""

    event_type: ClassVar[str] = "io.gpupool.job.state_changed.v1"
    event_subject: ClassVar[str] = subjects.JOB_STATE_CHANGED
    entity_field: ClassVar[str] = "job_id"

    job_id: str
    team: str
    project: str
    kind: str
    previous: str | None = Field(description="null at submission")
    current: str
    reason: str = Field(description="e.g. Submitted, Approved, AllocationGranted, PreemptedByPriority, "
                                    "Requeued:NodeLost, CompletedByUser, ApprovalDenied")
    message: str | None = None
    attempts: int = Field(default=0, description="times the job was requeued so far")
    at: datetime


class JobScaled(EventData):
    event_type: ClassVar[str] = "io.gpupool.job.scaled.v1"
    event_subject: ClassVar[str] = subjects.JOB_SCALED
    entity_field: ClassVar[str] = "job_id"

    job_id: str
    team: str
    replicas: int
    previous: int
    scaled_at: datetime
    replica_set: bool | None = Field(default=None, description="whether the job is a replica set at its new "
                                     "count (null: as replicas > 1 says)")


class JobAutoscaled(EventData):
    """The queue's autoscaler changed a service's replicas (then `job.scaled` follows as for a manual scale), with
    the load it saw, the target and why: a load balancer, an SRE or `gpupool describe` can tell every step."""

    event_type: ClassVar[str] = "io.gpupool.job.autoscaled.v1"
    event_subject: ClassVar[str] = subjects.JOB_AUTOSCALED
    entity_field: ClassVar[str] = "job_id"

    job_id: str
    team: str
    replicas: int = Field(ge=1, le=256)
    previous: int = Field(ge=1, le=256)
    signal: str = Field(max_length=32)
    load: float = Field(ge=0, le=1e12)
    target: float = Field(gt=0, le=1e9)
    reason: str = Field(max_length=500)
    scaled_at: datetime


class JobWorkUpdated(EventData):
    """A service's work changed (its command or env): placement rolls its replicas over to `work` one at a time,
    one extra replica first, so no fewer than `replicas` are ready meanwhile (a rolling update)."""

    event_type: ClassVar[str] = "io.gpupool.job.work_updated.v1"
    event_subject: ClassVar[str] = subjects.JOB_WORK_UPDATED
    entity_field: ClassVar[str] = "job_id"

    job_id: str
    team: str
    work: WorkSpec
    revision: int = Field(ge=1, le=2**31, description="the job's work revisions so far")
    updated_at: datetime


class JobStarted(EventData):
    event_type: ClassVar[str] = "io.gpupool.job.started.v1"
    event_subject: ClassVar[str] = subjects.JOB_STARTED
    entity_field: ClassVar[str] = "job_id"

    job_id: str
    allocation_id: str
    cluster: str
    node: str
    started_at: datetime
    team: str | None = Field(default=None, description="the job's team (absent on events from before it was "
                                                        "carried: those are shown only to platform-wide readers)")


class JobCompleted(EventData):
    event_type: ClassVar[str] = "io.gpupool.job.completed.v1"
    event_subject: ClassVar[str] = subjects.JOB_COMPLETED
    entity_field: ClassVar[str] = "job_id"

    job_id: str
    team: str
    completed_at: datetime


class JobCancelled(EventData):
    event_type: ClassVar[str] = "io.gpupool.job.cancelled.v1"
    event_subject: ClassVar[str] = subjects.JOB_CANCELLED
    entity_field: ClassVar[str] = "job_id"

    job_id: str
    team: str
    reason: str
    cancelled_at: datetime


# --- placement --------------------------------------------------------------------------------------------------
class AllocatedGpu(BoundedModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    uuid: str
    index: int
    model: str
    share_milli: int = Field(default=1000, ge=1, le=1000,
                             description="Share of this GPU held: 1000 whole; a fraction's milli; a MIG slice's "
                                         "compute slices / 7")
    mig_profile: str | None = Field(default=None, description="MIG slice held on this GPU, e.g. 3g.40gb")
    mig_start: int | None = Field(default=None, description="First memory slot of that MIG instance")
    memory_mib: int | None = Field(default=None, description="GPU memory limit of a fraction (MPS pinned memory)")


class AllocationEvent(AllocationSubject):
    """What every allocation event says about the allocation: who holds which GPUs where (the wire contract
    promises these fields on every allocation event)."""

    gpus: list[AllocatedGpu]
    replica: int = Field(default=0, description="which copy of the job (gang member or inference replica)")


class AllocationGranted(AllocationEvent):
    event_type: ClassVar[str] = "io.gpupool.allocation.granted.v1"
    event_subject: ClassVar[str] = subjects.ALLOCATION_GRANTED

    granted_at: datetime
    kind: str = "batch"
    priority_class: str = ""
    max_runtime_s: float | None = None
    environment: dict[str, str] = Field(
        default_factory=dict,
        description="What the workload must run with to stay inside its allocation: CUDA_VISIBLE_DEVICES (GPU "
                    "uuids; for a MIG slice the agent reports the instance), and for a fraction the limits CUDA "
                    "MPS enforces: CUDA_MPS_ACTIVE_THREAD_PERCENTAGE and CUDA_MPS_PINNED_DEVICE_MEM_LIMIT. A gang "
                    "that runs work, or a single training job, also gets its rendezvous: torchrun's PET_NNODES, "
                    "PET_NPROC_PER_NODE, PET_NODE_RANK, PET_MASTER_ADDR, PET_MASTER_PORT, PET_RDZV_ID, "
                    "PET_RDZV_ENDPOINT, and MASTER_ADDR, MASTER_PORT, WORLD_SIZE (members), NODE_RANK, RANK, "
                    "GPUPOOL_NODE_IPS (members' addresses by rank), GPUPOOL_RENDEZVOUS_PORT")
    work: WorkSpec | None = Field(default=None, description="What the node's agent launches on these GPUs; "
                                                            "null: the caller launches its own work")
    attempt: int = Field(default=0, ge=0, description="the job's attempt this allocation serves")


class AllocationPreempting(AllocationEvent):
    """The checkpoint signal: this allocation will be taken back at `deadline` so a higher-priority job (or a team
    owed its guarantee) can run. The workload should checkpoint now; completing earlier frees the GPUs sooner."""

    event_type: ClassVar[str] = "io.gpupool.allocation.preempting.v1"
    event_subject: ClassVar[str] = subjects.ALLOCATION_PREEMPTING

    reason: str = Field(description="PreemptedByPriority, PreemptedWithinQuota or ReclaimedForGuarantee")
    message: str
    preemptor_job_id: str
    deadline: datetime


class AllocationGangReady(AllocationEvent):
    """Every member of this allocation's gang has its grant applied on its node (`agent.work_ready`): the agent
    starts the work now, so a gang's members start together (Kueue's waitForPodsReady)."""

    event_type: ClassVar[str] = "io.gpupool.allocation.gang_ready.v1"
    event_subject: ClassVar[str] = subjects.ALLOCATION_GANG_READY

    attempt: int = Field(default=0, ge=0)
    members: int = Field(ge=2, le=4096, description="the gang's members, all ready")
    ready_at: datetime


class DecidedPlacement(BoundedModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    unit: str = Field(description="what the core scheduled: the job, or job#replica")
    node: str
    gpus: list[str] = Field(description="GPU uuids")
    share_milli: int = 1000
    mig_profile: str | None = None
    applied: bool = Field(description="committed; false when the store refused it as stale")


class DecidedPreemption(BoundedModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    victim: str
    preemptor: str
    reason: str


class SchedulingCycleDecided(EventData):
    """One placement cycle that decided something, with the versions of what it read: its recorded input can be
    fetched (`GET /v1/decisions/{cycle_id}`) and scheduled again to the same `plan_digest`
    (`gpupool decisions replay`)."""

    event_type: ClassVar[str] = "io.gpupool.decision.cycle.v1"
    event_subject: ClassVar[str] = subjects.DECISION_CYCLE
    entity_field: ClassVar[str] = "cycle_id"

    cycle_id: str
    decided_at: datetime
    policy: str
    input_digest: str = Field(description="sha256 of the recorded input (snapshot, pending units, policy, now)")
    plan_digest: str = Field(description="sha256 of the decisions (placements, reasons, preemptions, ...)")
    versions: dict[str, int] = Field(description="policy_revision, nodes, gpus, running, pending_units")
    placements: list[DecidedPlacement] = Field(default_factory=list)
    preemptions: list[DecidedPreemption] = Field(default_factory=list)
    pending_by_reason: dict[str, int] = Field(default_factory=dict)


class AllocationReleased(AllocationEvent):
    event_type: ClassVar[str] = "io.gpupool.allocation.released.v1"
    event_subject: ClassVar[str] = subjects.ALLOCATION_RELEASED

    granted_at: datetime
    released_at: datetime
    reason: str
    exit: WorkExit | None = Field(default=None, description="How the allocation's work ended, when the release "
                                                            "follows the agent's report that its cgroup is empty")
    remaining: int | None = Field(default=None, ge=0, description="With exit: the job's allocations still live "
                                                                  "after this release")


# --- accounting -------------------------------------------------------------------------------------------------
class UsageRecorded(EventData):
    event_type: ClassVar[str] = "io.gpupool.usage.recorded.v1"
    event_subject: ClassVar[str] = subjects.USAGE_RECORDED
    entity_field: ClassVar[str] = "allocation_id"

    allocation_id: str
    job_id: str
    team: str
    project: str
    gpu_model: str
    gpu_count: int
    gpu_seconds: float
    started_at: datetime
    ended_at: datetime
    gpu_share: float | None = Field(default=None, description="GPUs held counting each by its share (a MIG slice or "
                                                              "fraction < 1); gpu_seconds = held seconds x gpu_share")
    user: str | None = Field(default=None, description="Who submitted the job, when known")
    kind: str | None = None
    sharing: str | None = Field(default=None, description="whole, fraction or mig")
    release_reason: str | None = None


class CostRateSet(EventData):
    """A price in force from `effective_from` (until the next one of the same model and profile): per GPU-hour of
    a model (a fraction pays its share), or per instance-hour of one MIG profile. `deleted` withdraws a price."""

    event_type: ClassVar[str] = "io.gpupool.usage.rate_set.v1"
    event_subject: ClassVar[str] = subjects.USAGE_RATE_SET
    entity_field: ClassVar[str] = "rate_key"

    rate_key: str = Field(description="gpu_model[/mig_profile]@effective_from")
    gpu_model: str
    mig_profile: str = Field(default="", description="empty: the price of a whole GPU of the model")
    effective_from: datetime
    price_per_hour: Decimal | None = Field(default=None, description="null when deleted")
    currency: str
    deleted: bool = False
    set_by: str = ""
    set_at: datetime


# --- quota ------------------------------------------------------------------------------------------------------
class TeamCreated(EventData):
    event_type: ClassVar[str] = "io.gpupool.quota.team_created.v1"
    event_subject: ClassVar[str] = subjects.QUOTA_TEAM_CREATED
    entity_field: ClassVar[str] = "team"

    team: str
    org: str
    revision: int = Field(description="Monotonic per quota database: newer state wins in read models")
    created_at: datetime


class QuotaSet(EventData):
    """The full new state of one quota entry (or its removal), so a read model can upsert it as is."""

    event_type: ClassVar[str] = "io.gpupool.quota.set.v1"
    event_subject: ClassVar[str] = subjects.QUOTA_SET
    entity_field: ClassVar[str] = "path"

    # the bounds of SetQuota, which causes it
    path: str = Field(max_length=200, description="org, org/team or org/team/project")
    gpu_model: str = Field(max_length=64, description="'*' for any model")
    guaranteed: float = Field(ge=0, le=1_000_000)
    borrowing_limit: float | None = Field(default=None, ge=0, le=1_000_000)
    lending_limit: float | None = Field(default=None, ge=0, le=1_000_000)
    weight: float = Field(default=1.0, gt=0, le=1000)
    deleted: bool = False
    revision: int = Field(ge=0)
    set_at: datetime
    loaned: float = Field(default=0.0, ge=0, le=1_000_000,
                          description="part of `guaranteed` lent for a limited time (quota loans)")


class PriorityClassSet(EventData):
    event_type: ClassVar[str] = "io.gpupool.quota.priority_class_set.v1"
    event_subject: ClassVar[str] = subjects.QUOTA_PRIORITY_CLASS_SET
    entity_field: ClassVar[str] = "name"

    # the bounds of SetPriorityClass, which causes it
    name: str = Field(max_length=64)
    value: int = Field(ge=-1_000_000, le=1_000_000)
    preemptible: bool
    min_runtime_s: float | None = Field(default=None, ge=0, le=30 * 24 * 3600)
    description: str = Field(default="", max_length=500)
    revision: int = Field(ge=0)
    set_at: datetime


class ReclaimWarned(EventData):
    """An allocation will be taken back at `deadline` unless it becomes busy again (idle) — act now."""

    event_type: ClassVar[str] = "io.gpupool.reclaim.warned.v1"
    event_subject: ClassVar[str] = subjects.RECLAIM_WARNED
    entity_field: ClassVar[str] = "allocation_id"

    allocation_id: str
    job_id: str
    team: str
    reason: str = Field(description="IdleTimeout")
    message: str
    idle_s: float
    deadline: datetime


class ReclaimDecided(EventData):
    """Reclamation decided to take an allocation back (placement, the only writer of allocations, releases it)."""

    event_type: ClassVar[str] = "io.gpupool.reclaim.decided.v1"
    event_subject: ClassVar[str] = subjects.RECLAIM_DECIDED
    entity_field: ClassVar[str] = "allocation_id"

    allocation_id: str
    job_id: str
    team: str
    node: str
    reason: str = Field(description="IdleReclaimed, MaxRuntimeExceeded, NodeLost, GpuQuarantined, Drained or "
                                    "RestartLimitReached")
    message: str
    decided_at: datetime
    attempt: int | None = Field(default=None, description="For an abnormal reclaim (node lost, GPU quarantined, "
                                                          "drain): how many times this job has now lost its GPUs "
                                                          "that way")


class ApprovalRequested(EventData):
    """An admission rule held a submission for a person: who may approve it learns of it here."""

    event_type: ClassVar[str] = "io.gpupool.quota.approval_requested.v1"
    event_subject: ClassVar[str] = subjects.QUOTA_APPROVAL_REQUESTED
    entity_field: ClassVar[str] = "approval_id"

    approval_id: str
    job_id: str = Field(description="empty for a quota loan")
    job_name: str
    team: str
    project: str
    gpus: int
    priority_class: str
    reasons: list[str]
    requested_by: str
    requested_at: datetime
    kind: Literal["job", "loan"] = "job"
    loan_path: str | None = Field(default=None, description="a loan: the quota entry it adds guarantee to")
    loan_gpu_model: str | None = None
    loan_until: datetime | None = None


class ApprovalWithdrawn(EventData):
    """A pending request that no longer needs a decision (its job was cancelled first)."""

    event_type: ClassVar[str] = "io.gpupool.quota.approval_withdrawn.v1"
    event_subject: ClassVar[str] = subjects.QUOTA_APPROVAL_WITHDRAWN
    entity_field: ClassVar[str] = "approval_id"

    approval_id: str
    job_id: str
    team: str
    reason: str
    withdrawn_at: datetime


class ApprovalDecided(EventData):
    event_type: ClassVar[str] = "io.gpupool.quota.approval_decided.v1"
    event_subject: ClassVar[str] = subjects.QUOTA_APPROVAL_DECIDED
    entity_field: ClassVar[str] = "approval_id"

    approval_id: str
    job_id: str = Field(description="empty for a quota loan")
    team: str
    approved: bool
    comment: str = ""
    decided_by: str
    decided_at: datetime
    kind: Literal["job", "loan"] = "job"


class GpuSharingSet(EventData):
    """How one GPU is shared, as an operator set it. Placement only places whole GPUs on `exclusive`, fractions on
    `fractional` and MIG slices on `mig` GPUs. A change never moves held work: while the GPU still holds work,
    inventory first announces `draining_to` (the GPU keeps `mode` and takes no new work), and announces the new
    `mode` once the GPU is empty; the node's agent then turns the GPU's MIG mode on or off to match."""

    event_type: ClassVar[str] = "io.gpupool.gpu.sharing_set.v1"
    event_subject: ClassVar[str] = subjects.GPU_SHARING_SET
    entity_field: ClassVar[str] = "gpu_uuid"

    cluster: str
    node: str
    gpu_uuid: str
    gpu_index: int
    mode: Literal["exclusive", "fractional", "mig"]
    draining_to: Literal["exclusive", "fractional", "mig"] | None = Field(
        default=None, description="set: the GPU is being emptied for this mode (no new work on it meanwhile)")
    set_by: str = ""
    set_at: datetime


class GpuRollup(BoundedModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    uuid: str
    index: int
    samples: int = Field(ge=0)
    utilization_avg_pct: float = Field(ge=0, le=100)
    utilization_max_pct: float = Field(ge=0, le=100)
    memory_used_avg_mib: float = Field(ge=0)
    memory_used_max_mib: int = Field(ge=0)
    power_avg_w: float | None = None
    temperature_max_c: float | None = None
    process_count_max: int = 0


class TelemetryRolledUp(EventData):
    """Inventory's one-minute rollup of one node's telemetry: what accounting and reports read instead of raw
    samples. Sent on `gpupool.rollup.<cluster>.<node>` (stream GPUPOOL_ROLLUPS)."""

    event_type: ClassVar[str] = "io.gpupool.telemetry.rolled_up.v1"
    event_subject: ClassVar[str] = subjects.ROLLUP_ALL  # concrete subject: subjects.rollup(cluster, node)
    entity_field: ClassVar[str] = "node"

    cluster: str
    node: str
    window_start: datetime
    window_end: datetime
    gpus: list[GpuRollup]


class OrphanDetected(EventData):
    """Waste inventory saw: a process on a GPU that no allocation holds, or an allocation whose GPUs have shown
    no process for a long time."""

    event_type: ClassVar[str] = "io.gpupool.gpu.orphan_detected.v1"
    event_subject: ClassVar[str] = subjects.GPU_ORPHAN_DETECTED
    entity_field: ClassVar[str] = "gpu_uuid"

    cluster: str
    node: str
    gpu_uuid: str
    orphan: Literal["process_without_allocation", "allocation_without_process"]
    allocation_id: str | None = None
    job_id: str | None = None
    team: str | None = None
    pids: list[int] = Field(default_factory=list)
    since: datetime
    detected_at: datetime


EVENT_TYPES: dict[str, type[EventData]] = {
    cls.event_type: cls
    for cls in (
        NodeRegistered,
        NodeLost,
        NodeRecovered,
        NodeCordoned,
        NodeUncordoned,
        GpuHealthChanged,
        JobSubmitted,
        JobStarted,
        JobCompleted,
        JobCancelled,
        JobScaled,
        JobAutoscaled,
        JobWorkUpdated,
        JobStateChanged,
        AllocationGranted,
        AllocationPreempting,
        AllocationReleased,
        SchedulingCycleDecided,
        UsageRecorded,
        CostRateSet,
        TeamCreated,
        QuotaSet,
        PriorityClassSet,
        ApprovalDecided,
        ApprovalRequested,
        ApprovalWithdrawn,
        ReclaimWarned,
        ReclaimDecided,
        TelemetrySampled,
        GpuSharingSet,
        TelemetryRolledUp,
        OrphanDetected,
        MigApplied,
        FractionExceeded,
        WorkStarted,
        WorkReady,
        WorkExited,
        WorkLoadSampled,
        AllocationGangReady,
        EndpointReady,
        EndpointUnready,
    )
}


def subject_for(data: EventData) -> str:
    if isinstance(data, TelemetrySampled):
        return subjects.telemetry(data.cluster, data.node)
    if isinstance(data, TelemetryRolledUp):
        return subjects.rollup(data.cluster, data.node)
    if data.node_scoped:
        return subjects.of_node(data.event_subject, data.cluster, data.node)  # type: ignore[attr-defined]
    return data.event_subject


def decode_data(event: CloudEvent) -> EventData:
    """Typed payload of an envelope. Unknown types and invalid payloads are poison (InvalidEnvelope)."""
    cls = EVENT_TYPES.get(event.type)
    if cls is None:
        raise InvalidEnvelope(f"unknown event type {event.type!r}")
    try:
        return cls.model_validate(event.data)
    except ValidationError as exc:
        err = exc.errors()[0]
        loc = ".".join(str(p) for p in err.get("loc", ())) or "<root>"
        raise InvalidEnvelope(f"invalid {event.type} payload: {loc}: {err.get('msg')}") from exc


def event_json_schemas() -> dict[str, dict[str, Any]]:
    """JSON Schema of each event type: the envelope with `data` replaced by that type's payload schema."""
    out: dict[str, dict[str, Any]] = {}
    for event_type, cls in sorted(EVENT_TYPES.items()):
        envelope = CloudEvent.model_json_schema()
        payload = cls.model_json_schema()
        defs = {**envelope.pop("$defs", {}), **payload.pop("$defs", {})}
        envelope["title"] = cls.__name__
        envelope["description"] = (cls.__doc__ or cls.__name__).strip().splitlines()[0]
        envelope["properties"]["type"] = {"const": event_type, "type": "string"}
        envelope["properties"]["data"] = payload
        # CloudEvents 1.0 makes specversion REQUIRED; the model only defaults it (lenient on input), so the
        # published schema must still demand it of every document on the wire.
        envelope["required"] = ["specversion", *[r for r in envelope.get("required", []) if r != "specversion"]]
        envelope["$id"] = schema_of(event_type)
        envelope["$schema"] = "https://json-schema.org/draft/2020-12/schema"
        if defs:
            envelope["$defs"] = defs
        out[event_type] = envelope
    return out
