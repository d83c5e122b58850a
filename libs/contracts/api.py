"""Response models of the gpupool HTTP API: the gateway documents every success response with them (its OpenAPI
document's components) and the typed client (`libs.client`) parses the same responses into them.

Every model allows extra fields, so a newer gateway that adds fields never breaks an older client, and most fields
have defaults, so a field the gateway stops sending degrades to None instead of an exception. `raw` keeps the JSON
object exactly as the gateway sent it (the CLI's `--output json` prints that).
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, PrivateAttr


class ApiModel(BaseModel):
    # defer_build: a model's validator is built when first used, not at import (the CLI's start-up)
    model_config = ConfigDict(extra="allow", populate_by_name=True, defer_build=True)

    _raw: dict[str, Any] = PrivateAttr(default_factory=dict)

    @classmethod
    def from_api(cls, data: dict[str, Any]) -> Any:
        obj = cls.model_validate(data)
        obj._raw = data
        return obj

    @property
    def raw(self) -> dict[str, Any]:
        """The JSON object as received (or the model's own dump when it was built locally)."""
        return self._raw or self.model_dump(mode="json", by_alias=True)


# --- jobs ---------------------------------------------------------------------------------------------------------
class JobHistoryEntry(ApiModel):
    at: datetime
    from_state: str | None = Field(default=None, alias="from")
    to_state: str = Field(alias="to")
    reason: str | None = None


class JobWorkLimits(ApiModel):
    cpu_milli: int | None = Field(default=None, description="CPU time as milli-cores (1000 = one core)")
    memory_mib: int | None = None
    pids: int | None = None


class JobRestartPolicy(ApiModel):
    policy: str = Field(default="never", description="never or on_failure")
    attempts: int = 0
    delay_s: float = 10.0


class Work(ApiModel):
    """What a job runs: the node's agent launches `command` on every allocation the job is granted."""

    command: list[str] = Field(default_factory=list)
    env: dict[str, str] = Field(default_factory=dict)
    workdir: str | None = None
    limits: JobWorkLimits = Field(default_factory=JobWorkLimits)
    stop_signal: str = "SIGTERM"
    stop_grace_s: float = 30.0
    warn_before_s: float | None = None
    warn_signal: str = "SIGUSR1"
    restart: JobRestartPolicy = Field(default_factory=JobRestartPolicy)
    isolation: str = Field(default="process", description="process, sandbox or container")
    image: str | None = None
    rootfs: str | None = None


class Job(ApiModel):
    job_id: str
    name: str = ""
    team: str = ""
    project: str = "default"
    kind: str = "batch"
    priority_class: str = "normal"
    gpus: int = 0
    gpu_models: list[str] = Field(default_factory=list)
    state: str = "pending"
    submitted_at: datetime | None = None
    started_at: datetime | None = None
    finished_at: datetime | None = None
    allocation_id: str | None = None
    node: str | None = None
    cluster: str | None = None
    message: str | None = None
    priority: int | None = None
    attempts: int = Field(default=0, description="times the job was requeued after preemption or reclaim")
    gang_nodes: int = Field(default=0, description=">0: a gang of gang_nodes × gpus_per_node, all or nothing")
    gpus_per_node: int = 0
    replicas: int = Field(default=1, description="independent copies of `gpus` GPUs each")
    max_runtime_s: float | None = None
    gpu_fraction_milli: int = Field(default=0, description="> 0: a share of one GPU (milli-GPU) with gpu_memory_mib")
    gpu_memory_mib: int = 0
    mig_profile: str = Field(default="", description="a MIG slice of this profile")
    exclusive: bool = False
    cpu_milli: int = Field(default=0, description="host CPU reserved on each node it holds, milli-cores")
    memory_mib: int = Field(default=0, description="host memory reserved on each node it holds, MiB")
    node_selector: dict[str, str] = Field(default_factory=dict, description="labels its nodes must carry")
    preemptible: bool | None = Field(default=None, description="its own word on preemption; None: its class")
    work: Work | None = Field(default=None, description="what the agent runs; None: the job only holds GPUs")
    exit_code: int | None = Field(default=None, description="the work's exit code, once an attempt ended")
    reason: str | None = Field(default=None, description="why the job is in its state, e.g. NonZeroExit, "
                                                         "OutOfMemory, Completed")
    history: list[JobHistoryEntry] = Field(default_factory=list, description="only in GET /v1/jobs/{id}")
    trace_id: str | None = Field(default=None, description="the trace of its submission (GET /v1/jobs/{id})")

    @property
    def finished(self) -> bool:
        return self.state in ("completed", "cancelled", "failed")

    @property
    def total_gpus(self) -> int:
        """GPUs the job holds when fully running: a gang's `gpus` is already its total; replicas multiply."""
        return self.gpus * max(1, self.replicas) if not self.gang_nodes else self.gpus


class SubmitResult(Job):
    """A submitted job; `created` is False when the gateway replayed an earlier submission with the same key.
    A submission that an approval rule holds back comes with `approval_id` and `approval_reasons`."""

    created: bool = True
    idempotency_key: str | None = None
    approval_id: str | None = None
    approval_reasons: list[str] = Field(default_factory=list)


class PlacementExplanation(ApiModel):
    """Placement's view of one job (`state`: pending, allocated, released, or unknown when placement has not seen
    it, e.g. while it awaits approval)."""

    state: str = "unknown"
    reason: str | None = None
    message: str | None = None
    position: int | None = Field(default=None, description="1 = next among pending jobs, in the order the last "
                                                           "scheduling cycle tried them (priority, fair share, "
                                                           "submit time)")
    position_basis: str | None = Field(
        default=None, description="last_cycle: the position in the last cycle's order; estimate: the job arrived "
                                  "after it (priority and submit time only, until the next cycle)")
    priority: int | None = None
    priority_class: str | None = None
    replicas_wanted: int | None = None
    replicas_running: int | None = None
    allocations: list[str] = Field(default_factory=list)
    preempting_for_it: list[str] = Field(default_factory=list, description="jobs being preempted to make room")
    preemptor_job_id: str | None = Field(default=None, description="the job this one is being preempted for")
    deadline: datetime | None = Field(default=None, description="when a preempted job's GPUs are taken back")
    facts: dict[str, Any] = Field(default_factory=dict, description="a pending job's reason as data: node census, "
                                                                    "quota numbers, victims, rack, reservation")


class Explanation(ApiModel):
    """GET /v1/jobs/{id}/explain: the queue's state of the job and placement's reasons."""

    job_id: str
    state: str = ""
    message: str | None = None
    placement: PlacementExplanation = Field(default_factory=PlacementExplanation)
    approval: Approval | None = Field(default=None, description="while it awaits approval: the request it waits on")


# --- nodes ----------------------------------------------------------------------------------------------------------
class GpuTelemetry(ApiModel):
    sampled_at: datetime | None = None
    utilization_gpu_pct: float | None = None
    utilization_memory_pct: float | None = None
    memory_used_mib: float | None = None
    temperature_c: float | None = None
    power_w: float | None = None
    ecc_volatile_sbe: int | None = None
    ecc_volatile_dbe: int | None = None
    xid_last: int | None = None
    process_count: int | None = None


class Gpu(ApiModel):
    uuid: str
    index: int = 0
    model: str = ""
    name: str = ""
    memory_mib: int = 0
    numa_node: int | None = None
    nvlink_peers: list[Any] = Field(default_factory=list)
    mig_mode: Any = None
    health: str = "healthy"
    health_reasons: list[str] = Field(default_factory=list)
    telemetry: GpuTelemetry | None = None
    state: str = Field(default="healthy", description="health state: healthy, suspect, quarantined or probation")
    state_since: datetime | None = None
    state_reason: str = Field(default="", description="why it is in that state, e.g. FatalXid, RepeatedSuspect")
    sharing: str = Field(default="exclusive", description="exclusive, fractional or mig")
    allocation_id: str | None = Field(default=None, description="the live allocation holding it, if any")


class Nic(ApiModel):
    name: str = ""
    kind: str = Field(default="ethernet", description="ethernet, infiniband or other")
    speed_mbps: int | None = Field(default=None, description="link speed; None when down or unknown")


class NodeNetwork(ApiModel):
    """The NICs a node registered, their summed link speed and the latest throughput over all of them."""

    interfaces: list[Nic] = Field(default_factory=list)
    link_gbps: float = 0.0
    rx_mbps: float | None = None
    tx_mbps: float | None = None


class Volume(ApiModel):
    mount: str = ""
    total_gib: float = 0.0
    filesystem: str = ""


class NodeStorage(ApiModel):
    """The volumes a node registered, their summed size and the latest space used over all of them."""

    volumes: list[Volume] = Field(default_factory=list)
    total_gib: float = 0.0
    used_gib: float | None = None


class Node(ApiModel):
    cluster: str
    node: str
    hostname: str = ""
    cpu_count: int = 0
    memory_mib: int = 0
    driver_version: str = ""
    agent_version: str = ""
    labels: dict[str, str] = Field(default_factory=dict)
    state: str = ""
    registered_at: datetime | None = None
    last_seen_at: datetime | None = None
    cpu_util_pct: float | None = None
    memory_used_mib: float | None = None
    gpus: list[Gpu] = Field(default_factory=list)
    lost_at: datetime | None = None
    cordoned: bool = Field(default=False, description="no new work is placed on it")
    drained: bool = Field(default=False, description="cordoned with its allocations taken back")
    cordon: dict[str, Any] | None = Field(default=None, description="who cordoned it, when and why")
    network: NodeNetwork = Field(default_factory=NodeNetwork)
    storage: NodeStorage = Field(default_factory=NodeStorage)


class GpuChange(ApiModel):
    """The answer to a GPU sharing or health change: what it was, what it is, and whether anything changed."""

    cluster: str
    node: str
    index: int
    gpu_uuid: str = ""
    before: str = ""
    mode: str | None = Field(default=None, description="the sharing mode (sharing changes)")
    draining_to: str | None = Field(default=None, description="sharing changes: the mode the GPU becomes once the "
                                                              "work it holds is released (no new work meanwhile)")
    state: str | None = Field(default=None, description="the health state (health changes)")
    reason: str | None = None
    changed: bool = False


class NodeOrphan(ApiModel):
    id: int
    kind: str = Field(description="process_without_allocation or allocation_without_process")
    cluster: str = ""
    node: str = ""
    gpu_uuid: str = ""
    allocation_id: str | None = None
    job_id: str | None = None
    team: str | None = None
    since: datetime | None = None
    detected_at: datetime | None = None
    resolved_at: datetime | None = None


# --- allocations and usage ------------------------------------------------------------------------------------------
class AllocationGpu(ApiModel):
    uuid: str
    index: int = 0
    model: str = ""
    share_milli: int = Field(default=1000, description="1000: the whole GPU; less: a fraction or a MIG slice")
    memory_mib: int | None = None
    mig_profile: str | None = None
    mig_start: int | None = None


class Allocation(ApiModel):
    allocation_id: str
    job_id: str
    replica: int = 0
    attempt: int = Field(default=0, description="the job's attempt this allocation serves")
    team: str = ""
    project: str = ""
    cluster: str = ""
    node: str = ""
    granted_at: datetime | None = None
    released_at: datetime | None = None
    release_reason: str | None = None
    preempt_deadline: datetime | None = None
    gpus: list[AllocationGpu] = Field(default_factory=list)

    @property
    def active(self) -> bool:
        return self.released_at is None


class UsageRecord(ApiModel):
    allocation_id: str
    job_id: str = ""
    team: str = ""
    project: str = ""
    gpu_model: str = ""
    gpu_count: int = 0
    gpu_seconds: float = 0.0
    started_at: datetime | None = None
    ended_at: datetime | None = None
    release_reason: str | None = None


# --- teams, quotas, priority classes ---------------------------------------------------------------------------------
class Quota(ApiModel):
    """A quota entry as listed under a team in GET /v1/teams."""

    gpu_model: str
    path: str | None = None
    guaranteed: float = 0
    borrowing_limit: float | None = None
    lending_limit: float | None = None
    over_quota_weight: float | None = None


class Team(ApiModel):
    team: str
    org: str = ""
    quotas: list[Quota] = Field(default_factory=list)


class QuotaEntry(ApiModel):
    """One entry of the org → team → project quota tree (GET/PUT /v1/quotas), in GPUs. `borrowing_limit` None:
    unlimited; `lending_limit` None: lends all it does not use."""

    path: str
    gpu_model: str = "*"
    guaranteed: float = 0
    borrowing_limit: float | None = None
    lending_limit: float | None = None
    weight: float = 1.0
    revision: int | None = None
    updated_at: datetime | None = None


class PriorityClass(ApiModel):
    name: str
    value: int = 0
    preemptible: bool = False
    min_runtime_s: float | None = None
    description: str = ""
    revision: int | None = None
    updated_at: datetime | None = None


# --- approvals ------------------------------------------------------------------------------------------------------
class Approval(ApiModel):
    """A job held for a person's approval (`kind` "job"), or a request for a quota loan (`kind` "loan": no job;
    `loan_path`, `loan_gpu_model`, `gpus` and `loan_until` say what would be lent until when)."""

    approval_id: str
    kind: str = "job"
    job_id: str | None = None
    job_name: str | None = None
    team: str = ""
    project: str = ""
    gpus: int = 0
    priority_class: str = ""
    reasons: list[str] = Field(default_factory=list)
    requested_by: str | None = None
    state: str = "pending"
    comment: str | None = None
    decided_by: str | None = None
    created_at: datetime | None = None
    decided_at: datetime | None = None
    loan_path: str | None = None
    loan_gpu_model: str | None = None
    loan_until: datetime | None = None


class ApprovalRule(ApiModel):
    rule: str
    value: str = ""
    enabled: bool = True


# --- reclamation ----------------------------------------------------------------------------------------------------
class ReclaimPolicy(ApiModel):
    """What is taken back for one job kind. `idle_after_s` None: never reclaimed for idleness."""

    kind: str
    idle_after_s: float | None = None
    idle_util_pct: float = 5.0
    grace_s: float = 300.0
    enforce_max_runtime: bool = True
    updated_at: datetime | None = None


# --- pool -----------------------------------------------------------------------------------------------------------
class PoolCounts(ApiModel):
    """GPU counts: `in_use` = utilization above the gateway's threshold in fresh telemetry, `allocated` = held by a
    live allocation, `allocated_idle` = allocated and not in use, `free` = healthy and not allocated."""

    model: str | None = None
    total: int = 0
    healthy: int = 0
    unhealthy: int = 0
    on_lost_nodes: int = 0
    in_use: int = 0
    allocated: int = 0
    allocated_idle: int = 0
    free: int = 0


class NodeTotals(ApiModel):
    """What a cluster's (or every cluster's) nodes add up to."""

    nodes: int = 0
    cpu_count: int = 0
    memory_mib: int = 0
    network_link_gbps: float = 0.0
    storage_total_gib: float = 0.0


class PoolCluster(ApiModel):
    cluster: str
    models: list[PoolCounts] = Field(default_factory=list)
    totals: PoolCounts = Field(default_factory=PoolCounts)
    nodes: list[dict[str, Any]] = Field(default_factory=list)
    node_totals: NodeTotals = Field(default_factory=NodeTotals)


class PoolAll(ApiModel):
    models: list[PoolCounts] = Field(default_factory=list)
    totals: PoolCounts = Field(default_factory=PoolCounts)
    node_totals: NodeTotals = Field(default_factory=NodeTotals)


class Pool(ApiModel):
    """GET /v1/pool: per cluster and GPU model, and over every cluster (`all`)."""

    clusters: list[PoolCluster] = Field(default_factory=list)
    all: PoolAll = Field(default_factory=PoolAll)
    in_use_util_pct: float | None = None
    fresh_within_s: float | None = None


class FragmentationRow(ApiModel):
    cluster: str
    gpu_model: str
    gpus: int
    free_gpus: float
    fragmented_gpus: float = Field(description="of the free GPUs, what a job drawn from the recent workload could "
                                               "not use (FGD's measure)")
    fragmented_share: float


class WorkloadShareRow(ApiModel):
    gpus: int
    gpu_milli: int
    gpu_models: list[str] = Field(default_factory=list)
    share: float


class PoolFragmentation(ApiModel):
    """GET /v1/pool/fragmentation."""

    measured_at: datetime
    window_s: float
    rows: list[FragmentationRow] = Field(default_factory=list)
    workload: list[WorkloadShareRow] = Field(default_factory=list)


# --- tokens and audit -----------------------------------------------------------------------------------------------
class Token(ApiModel):
    token_id: str
    name: str = ""
    role: str = ""
    team: str | None = None
    expires_at: datetime | None = None
    created_by: str | None = None
    created_at: datetime | None = None
    revoked_at: datetime | None = None
    last_used_at: datetime | None = None


class CreatedToken(Token):
    token: str = Field(description="the secret; the gateway shows it only once")


class AuditEntry(ApiModel):
    id: Any
    at: datetime | None = None
    actor: str = ""
    actor_role: str | None = None
    action: str = ""
    target: str | None = None
    before: Any = None
    after: Any = None
    trace_id: str | None = None


class WhoAmI(ApiModel):
    subject: str = ""
    role: str = ""
    team: str | None = None
    via: str | None = None
    allowed: list[str] = Field(default_factory=list)


# --- ops ------------------------------------------------------------------------------------------------------------
class Readiness(ApiModel):
    status: str = "unknown"
    services: dict[str, bool] = Field(default_factory=dict)

    @property
    def ready(self) -> bool:
        return self.status == "ready"


class Decision(ApiModel):
    """One recorded scheduling cycle (GET /v1/decisions)."""

    cycle_id: str
    decided_at: datetime | None = None
    policy: str = ""
    input_digest: str = ""
    plan_digest: str = ""
    versions: dict[str, int] = Field(default_factory=dict)
    placements: list[dict[str, Any]] = Field(default_factory=list)
    preemptions: list[dict[str, Any]] = Field(default_factory=list)
    pending_by_reason: dict[str, int] = Field(default_factory=dict)
    input_gzip_base64: str | None = Field(default=None, description="only in GET /v1/decisions/{id}")
    plan: Any = Field(default=None, description="only in GET /v1/decisions/{id}")


# the client's earlier names (the components are named apart from the request bodies' and the waste report's)
WorkLimits = JobWorkLimits
RestartPolicy = JobRestartPolicy
Orphan = NodeOrphan
