"""Commands and queries: request/reply over core NATS, each answered by exactly one owning service.

Every reply is a `Reply`: `ok` with a `result`, or an `error` carrying an HTTP-like status, a CamelCase machine
reason and a human message, which the gateway turns into an RFC 9457 problem body unchanged.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from datetime import UTC, datetime
from typing import Annotated, Any, Literal

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, model_validator

from libs.contracts.addresses import PeerAddress
from libs.contracts.autoscale import AutoscalePolicy, ReplicaBounds
from libs.contracts.events import GpuSpec, NicSpec, VolumeSpec
from libs.contracts.fleet import TOPOLOGY_LABEL_PREFIX
from libs.contracts.labels import MAX_SELECTOR, check_labels, label_problem
from libs.contracts.names import NAME_PATTERN
from libs.contracts.work import Arg, HealthCheck, Isolation, RestartPolicy, StopSignal, WorkLimits, WorkSpec
from libs.domain import Refusal

# The dates a command may carry: a price from year 1 or a loan to year 9999 is a typo, and arithmetic on it
# overflows. Both ends are exclusive of nothing a real fleet needs.
EARLIEST = datetime(2000, 1, 1, tzinfo=UTC)
LATEST = datetime(2200, 1, 1, tzinfo=UTC)


def in_calendar(value: datetime) -> datetime:
    """A zoned date between EARLIEST and LATEST, in UTC."""
    if value.tzinfo is None:
        raise ValueError("needs a time zone")
    if not EARLIEST <= value < LATEST:
        raise ValueError(f"must lie between {EARLIEST.year} and {LATEST.year}")
    return value.astimezone(UTC)

JobKind = Literal["training", "inference", "dev", "batch"]
JobState = Literal["awaiting_approval", "pending", "launching", "running", "preempting", "completed", "cancelled",
                   "failed"]
ApprovalRule = Literal["gpus_over", "runtime_over_s", "priority_class"]


def page(rows: Sequence[Any], limit: int, view: Callable[[Any], dict[str, Any]],
         cursor: Callable[[dict[str, Any]], Any]) -> dict[str, Any]:
    """One page of a keyset-paginated list. Rows are fetched with `limit + 1`: an extra row means there is a next
    page, whose cursor is the key of the last item shown."""
    items = [view(r) for r in rows[:limit]]
    return {"items": items, "next": cursor(items[-1]) if len(rows) > limit else None}


class Command(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    @model_validator(mode="after")
    def _no_nul_characters(self) -> Command:
        """PostgreSQL text cannot hold NUL; refuse it at the edge instead of failing deep in a query. Runs on every
        command built, so plain string fields are checked inline and only containers are walked."""
        for name, value in self.__dict__.items():  # exactly the fields (extra="forbid")
            if isinstance(value, str):
                if "\x00" in value:
                    raise ValueError(f"{name} must not contain NUL characters")
            elif isinstance(value, _CONTAINERS) and _has_nul(value):
                raise ValueError(f"{name} must not contain NUL characters")
        return self


_CONTAINERS = (list, tuple, dict)


def _has_nul(value: Any) -> bool:
    if isinstance(value, str):
        return "\x00" in value
    if isinstance(value, dict):
        return any(_has_nul(k) or _has_nul(v) for k, v in value.items())
    if isinstance(value, list | tuple):
        return any(_has_nul(v) for v in value)
    return False


class ErrorDetail(BaseModel):
    status: int = Field(ge=400, le=599)
    reason: str
    message: str
    detail: dict[str, Any] = Field(default_factory=dict)


class Reply(BaseModel):
    ok: bool
    result: Any = None
    error: ErrorDetail | None = None

    @classmethod
    def success(cls, result: Any) -> Reply:
        return cls(ok=True, result=result)

    @classmethod
    def failure(cls, status: int, reason: str, message: str, **detail: Any) -> Reply:
        return cls(ok=False, error=ErrorDetail(status=status, reason=reason, message=message, detail=detail))

    @classmethod
    def refused(cls, refusal: Refusal) -> Reply:
        """A domain decision's no (`libs.domain.Refusal`) on the wire."""
        return cls.failure(refusal.status, refusal.reason, refusal.message, **refusal.details)


# --- inventory --------------------------------------------------------------------------------------------------
def _topology_labels(labels: dict[str, str]) -> dict[str, str]:
    """A rack or block label names a topology domain placement groups nodes by: a well-formed label value."""
    for key, value in labels.items():
        problem = label_problem(key, value) if key.startswith(TOPOLOGY_LABEL_PREFIX) else None
        if problem is not None:
            raise ValueError(f"bad label: {problem}")
    return labels


class RegisterNode(Command):
    cluster: str = Field(pattern=NAME_PATTERN)
    node: str = Field(min_length=1, max_length=253)
    hostname: str = Field(min_length=1, max_length=253)
    cpu_count: int = Field(ge=0)
    memory_mib: int = Field(ge=0)
    driver_version: str = ""
    agent_version: str = ""
    labels: Annotated[dict[str, str], AfterValidator(_topology_labels)] = Field(
        default_factory=dict, max_length=128,
        description="The node's labels: the isolation drivers it offers, its place in the network "
                    "(topology.gpupool.io/rack and /block: placement keeps a gang in one rack, then one block)")
    gpus: list[GpuSpec] = Field(max_length=64)
    network: list[NicSpec] = Field(default_factory=list, max_length=64)
    storage: list[VolumeSpec] = Field(default_factory=list, max_length=32)
    address: PeerAddress = ""


class ListNodes(Command):
    cluster: str | None = None
    limit: int = Field(default=100, ge=1, le=1000)
    after: str | None = None


class GetPool(Command):
    """The pool as inventory sees it, per cluster and GPU model (health, use from telemetry) and per node."""

    cluster: str | None = Field(default=None, max_length=63)


class NodeRef(Command):
    """One node by name; `cluster` may be left out when the name is unique across clusters."""

    cluster: str | None = Field(default=None, max_length=63)
    node: str = Field(min_length=1, max_length=253)


class CordonNode(NodeRef):
    """Cordon (no new work), drain (cordon and take its allocations back) or uncordon a node."""

    action: Literal["cordon", "drain", "uncordon"]
    reason: str = Field(default="", max_length=500)
    by: str = Field(default="", max_length=253)


class SetGpuSharing(NodeRef):
    index: int = Field(ge=0, le=255)
    mode: Literal["exclusive", "fractional", "mig"]
    by: str = Field(default="", max_length=253)


class SetGpuHealth(NodeRef):
    """An operator's word on one GPU: `clear` a quarantined GPU (it enters probation) or a suspect one (healthy
    again), or `quarantine` it now."""

    index: int = Field(ge=0, le=255)
    action: Literal["clear", "quarantine"]
    reason: str = Field(default="", max_length=500)
    by: str = Field(default="", max_length=253)


class ListOrphans(Command):
    """Orphans inventory has reported; `open_only` leaves out those that have since resolved."""

    cluster: str | None = Field(default=None, max_length=63)
    open_only: bool = True
    limit: int = Field(default=100, ge=1, le=1000)
    after: str | None = Field(default=None, max_length=300)


# --- queue ------------------------------------------------------------------------------------------------------
class JobShape(BaseModel):
    """How a job holds GPUs: `gpus` on one node; a gang of `gang_nodes` × `gpus_per_node` placed all or nothing;
    or `replicas` independent copies of `gpus` each (inference services; scaled later with ScaleJob)."""

    gpus: int = Field(ge=1, le=4096, description="GPUs per replica (all of a gang's GPUs for a gang)")
    gang_nodes: int = Field(default=0, ge=0, le=256, description=">0: a gang over this many nodes")
    gpus_per_node: int = Field(default=0, ge=0, le=64, description="with gang_nodes: GPUs on each node")
    replicas: int = Field(default=1, ge=1, le=256, description="independent copies (not with a gang)")
    max_runtime_s: float | None = Field(default=None, ge=1, le=30 * 24 * 3600,
                                        description="declared limit: lets smaller jobs backfill around reservations")
    gpu_fraction_milli: int = Field(default=0, ge=0, le=999,
                                    description="1..999: a fraction of one GPU's compute (milli-GPU) on a GPU whose "
                                                "sharing mode is `fractional`; with `gpus: 1`")
    gpu_memory_mib: int = Field(default=0, ge=0, le=1_048_576,
                                description="GPU memory of that fraction, MiB (enforced through CUDA MPS)")
    mig_profile: str = Field(default="", max_length=32, pattern=r"^(|[1-7]g\.[0-9]{1,3}gb(\+me)?)$",
                             description="one MIG slice of this profile (e.g. 1g.10gb) on a GPU in `mig` mode; "
                                         "with `gpus: 1`")
    exclusive: bool = Field(default=False,
                            description="dev jobs only: a whole GPU even where shared GPUs exist (dev jobs without "
                                        "an explicit shape take a fraction or a MIG slice where the pool offers one)")
    min_replicas: int | None = Field(default=None, ge=1, le=256, description="a service: scaled no lower")
    max_replicas: int | None = Field(default=None, ge=1, le=256, description="a service: scaled no higher")
    autoscale: AutoscalePolicy | None = Field(default=None, description="scale between min and max on the load "
                                              "the service reports (POST /v1/jobs/{id}/load)")

    @model_validator(mode="after")
    def _replica_bounds(self) -> JobShape:
        ReplicaBounds(replicas=self.replicas, min_replicas=self.min_replicas, max_replicas=self.max_replicas,
                      autoscale=self.autoscale)
        return self

    @model_validator(mode="after")
    def _consistent_shape(self) -> JobShape:
        if self.gpu_fraction_milli or self.mig_profile:
            what = "a MIG slice" if self.mig_profile else "a GPU fraction"
            if self.gpu_fraction_milli and self.mig_profile:
                raise ValueError("ask for a MIG profile or a GPU fraction, not both")
            if self.gpus != 1 or self.gang_nodes:
                raise ValueError(f"{what} is one share of one GPU: gpus must be 1 and no gang")
            if self.exclusive:
                raise ValueError(f"exclusive contradicts {what}")
            if self.gpu_fraction_milli and not self.gpu_memory_mib:
                raise ValueError("a GPU fraction needs gpu_memory_mib (its memory is reserved and enforced)")
        elif self.gpu_memory_mib:
            raise ValueError("gpu_memory_mib goes with gpu_fraction_milli")
        if self.gang_nodes:
            if self.gpus_per_node < 1 or self.gang_nodes * self.gpus_per_node != self.gpus:
                raise ValueError("a gang needs gpus == gang_nodes × gpus_per_node")
            if self.replicas != 1:
                raise ValueError("a gang cannot also have replicas")
        elif self.gpus_per_node:
            raise ValueError("gpus_per_node needs gang_nodes")
        return self


class JobWork(BaseModel):
    """What the job runs, as flat submission fields (`POST /v1/jobs`, the CLI's YAML): with `command` the agent of
    each granted node launches it; without, the job only holds GPUs for a caller who launches its own work."""

    command: list[Arg] | None = Field(default=None, min_length=1, max_length=4096,
                                      description="argv run on the granted GPUs (no shell unless you write "
                                                  "[\"sh\", \"-c\", ...]); null: no work is launched")
    env: dict[str, str] = Field(default_factory=dict, max_length=512,
                                description="merged over the grant's environment (not GPUPOOL_*, CUDA_*)")
    workdir: str | None = Field(default=None, max_length=4096, description="absolute path on the node")
    limits: WorkLimits = Field(default_factory=WorkLimits)
    stop_signal: StopSignal = "SIGTERM"
    stop_grace_s: float = Field(default=30.0, ge=0, le=3600)
    warn_before_s: float | None = Field(default=None, gt=0, le=86_400)
    warn_signal: StopSignal = "SIGUSR1"
    restart: RestartPolicy = Field(default_factory=RestartPolicy)
    isolation: Isolation = "process"
    image: str | None = Field(default=None, max_length=512)
    rootfs: str | None = Field(default=None, max_length=4096)
    ports: list[str] = Field(default_factory=list, max_length=16,
                             description="named ports the work serves on (PORT, PORT_<NAME>); endpoints list them")
    health: HealthCheck | None = Field(default=None, description="http path, tcp port or exec argv, with "
                                                                 "interval_s, timeout_s, grace_s, failures")

    @model_validator(mode="after")
    def _work_consistent(self) -> JobWork:
        if self.command is None:
            fields = JobWork.model_fields
            unset = {k for k in WORK_FIELDS
                     if k != "command" and getattr(self, k) != fields[k].get_default(call_default_factory=True)}
            if unset:
                raise ValueError(f"{', '.join(sorted(unset))} need a command")
            return self
        WorkSpec(**{k: getattr(self, k) for k in WORK_FIELDS})  # every rule of the spec, at the edge
        return self

    def work_spec(self) -> WorkSpec | None:
        if self.command is None:
            return None
        return WorkSpec(**{k: getattr(self, k) for k in WORK_FIELDS})


WORK_FIELDS = ("command", "env", "workdir", "limits", "stop_signal", "stop_grace_s", "warn_before_s", "warn_signal",
               "restart", "isolation", "image", "rootfs", "ports", "health")


MAX_JOB_CPU_MILLI = 4_096_000  # 4096 cores
MAX_JOB_MEMORY_MIB = 64 * 1024 * 1024  # 64 TiB


class JobPlacement(BaseModel):
    """What a job needs of its nodes besides GPUs, and whether it may be preempted."""

    cpu_milli: int = Field(default=0, ge=0, le=MAX_JOB_CPU_MILLI,
                           description="host CPU reserved on each node the job holds (each gang member, each "
                                       "replica), in milli-cores (4000 = 4 cores); 0: none reserved. Placement "
                                       "counts it against the node's CPUs, so a node whose CPUs are taken gets no "
                                       "more work even with GPUs free")
    memory_mib: int = Field(default=0, ge=0, le=MAX_JOB_MEMORY_MIB,
                            description="host memory reserved on each node the job holds, MiB; 0: none reserved")
    node_selector: Annotated[dict[str, str], AfterValidator(check_labels)] = Field(
        default_factory=dict, max_length=MAX_SELECTOR,
        description="node labels the job's nodes must all carry (Kubernetes label syntax, at most "
                    f"{MAX_SELECTOR}): e.g. {{\"zone\": \"a\"}}. A selector no schedulable node matches waits "
                    "with reason NoNodeMatchesSelector")
    preemptible: bool | None = Field(default=None,
                                     description="may the scheduler preempt this job for higher-priority work; "
                                                 "null: its priority class (and kind) decide. Non-preemptible work "
                                                 "may use only its team's guarantee, never borrow")


class JobSpec(JobShape, JobWork, JobPlacement):
    """A job's shape, its work and what it needs of its nodes, with the rules that need several of them."""

    @model_validator(mode="after")
    def _autoscale_sampled(self) -> JobSpec:
        if self.autoscale is not None and self.autoscale.signal != "load":
            if self.command is None:
                raise ValueError(f"autoscale on {self.autoscale.signal} needs a command: the agent samples the "
                                 "replicas it runs")
            self.autoscale.probe(self.ports)  # a metric needs a port to scrape
        return self

    def work_spec(self) -> WorkSpec | None:
        """The work, with what its agent samples for the autoscale policy."""
        spec = super().work_spec()
        if spec is None or self.autoscale is None:
            return spec
        probe = self.autoscale.probe(self.ports)
        return spec if probe is None else spec.model_copy(update={"load": probe})


class SubmitJob(Command, JobSpec):
    name: str = Field(pattern=NAME_PATTERN)
    team: str = Field(pattern=NAME_PATTERN)
    project: str = Field(default="default", pattern=NAME_PATTERN)
    kind: JobKind = "batch"
    priority_class: str = "normal"
    gpu_models: list[str] = Field(default_factory=list, max_length=16)
    idempotency_key: str | None = Field(default=None, max_length=255)
    idempotency_scope: str = Field(default="", max_length=320,
                                   description="whose key it is (the gateway's caller): keys of two callers never "
                                               "collide")
    submitted_by: str = "anonymous"


class ScaleJob(Command):
    job_id: str = Field(min_length=1, max_length=64)
    replicas: int = Field(ge=1, le=256)


class UpdateWork(Command):
    """Change a running service's work (rolled out replica by replica). Fields left out keep their value; `env`
    replaces the whole environment."""

    job_id: str = Field(min_length=1, max_length=64)
    command: list[Arg] | None = Field(default=None, min_length=1, max_length=4096)
    env: dict[str, Annotated[str, Field(max_length=32_768)]] | None = Field(default=None, max_length=512)
    updated_by: str = Field(default="anonymous", max_length=253)


class ReportLoad(Command):
    """A service's load now (requests in flight, queue length), for its autoscaler. Each `reporter` (the service as
    a whole: ''; or each replica, e.g. 'replica-0') keeps its latest value; their sum is the service's load."""

    job_id: str = Field(min_length=1, max_length=64)
    value: float = Field(ge=0, le=1e12)
    reporter: str = Field(default="", max_length=64, pattern=r"^[A-Za-z0-9._-]*$")


class JobRef(Command):
    job_id: str = Field(min_length=1, max_length=64)


class ReadLogs(Command):
    """Read one stream of one allocation's work logs from the agent of its node
    (`subjects.agent_logs(cluster, node)`). Offsets count bytes since the attempt started; rotated-away bytes are
    skipped (the reply's `offset` then says where the data really starts)."""

    allocation_id: str = Field(min_length=1, max_length=64)
    stream: Literal["stdout", "stderr"] = "stdout"
    offset: int = Field(default=0, ge=0, le=2**62)
    limit: int = Field(default=65_536, ge=1, le=1_048_576, description="bytes at most")
    tail: int | None = Field(default=None, ge=0, le=16 * 1_048_576,
                             description="instead of offset: the last N bytes")


class LogChunk(BaseModel):
    """The agent's answer to ReadLogs."""

    allocation_id: str
    stream: Literal["stdout", "stderr"]
    offset: int = Field(description="where `data` starts, bytes since the attempt started")
    next_offset: int
    data: str = Field(description="UTF-8 text (invalid bytes replaced)")
    complete: bool = Field(description="the attempt ended and everything was read: no more will come")


class CancelJob(JobRef):
    reason: str = Field(default="cancelled by user", max_length=500)


class ListJobs(Command):
    team: str | None = None
    state: JobState | None = None
    limit: int = Field(default=100, ge=1, le=1000)
    after: str | None = None


class JobView(BaseModel):
    job_id: str
    name: str
    team: str
    project: str
    kind: str
    priority_class: str
    gpus: int
    gpu_models: list[str]
    state: JobState
    submitted_at: datetime
    started_at: datetime | None = None
    finished_at: datetime | None = None
    allocation_id: str | None = None
    node: str | None = None
    cluster: str | None = None
    message: str | None = None
    priority: int = 0
    attempts: int = Field(default=0, description="times the job was requeued after preemption or reclaim")
    gang_nodes: int = 0
    gpus_per_node: int = 0
    replicas: int = 1
    max_runtime_s: float | None = None
    gpu_fraction_milli: int = 0
    gpu_memory_mib: int = 0
    mig_profile: str = ""
    exclusive: bool = False
    work: WorkSpec | None = Field(default=None, description="what the agent runs; null: nothing is launched")
    exit_code: int | None = Field(default=None, description="the work's exit code, once an attempt ended")
    reason: str | None = Field(default=None, description="why the job is in its state: the last transition's "
                                                         "reason (e.g. NonZeroExit, OutOfMemory, Completed)")
    min_replicas: int | None = None
    max_replicas: int | None = None
    autoscale: AutoscalePolicy | None = None
    cpu_milli: int = Field(default=0, description="host CPU reserved on each node it holds, milli-cores")
    memory_mib: int = Field(default=0, description="host memory reserved on each node it holds, MiB")
    node_selector: dict[str, str] = Field(default_factory=dict, description="labels its nodes must carry")
    preemptible: bool | None = Field(default=None, description="its own word on preemption; null: its class "
                                                               "decides")


# --- quota ------------------------------------------------------------------------------------------------------
QUOTA_PATH_PATTERN = r"^[a-z0-9]([a-z0-9._-]{0,61}[a-z0-9])?(/[a-z0-9]([a-z0-9._-]{0,61}[a-z0-9])?){0,2}$"
# a loan is for a team or a project, never a whole org: two or three segments
LOAN_PATH_PATTERN = r"^[a-z0-9]([a-z0-9._-]{0,61}[a-z0-9])?(/[a-z0-9]([a-z0-9._-]{0,61}[a-z0-9])?){1,2}$"
MODEL_PATTERN = r"^(\*|[A-Za-z0-9][A-Za-z0-9._-]{0,63})$"


class CreateTeam(Command):
    team: str = Field(pattern=NAME_PATTERN)
    org: str = Field(default="default", pattern=NAME_PATTERN)


class SetQuota(Command):
    """Set (or with `delete`, remove) one quota entry of the org → team → project tree, in GPUs."""

    path: str = Field(pattern=QUOTA_PATH_PATTERN, description="org, org/team or org/team/project")
    gpu_model: str = Field(default="*", pattern=MODEL_PATTERN)
    guaranteed: float = Field(default=0.0, ge=0, le=1_000_000)
    borrowing_limit: float | None = Field(default=None, ge=0, le=1_000_000)
    lending_limit: float | None = Field(default=None, ge=0, le=1_000_000)
    weight: float = Field(default=1.0, gt=0, le=1000)
    delete: bool = False


class SetPriorityClass(Command):
    name: str = Field(pattern=NAME_PATTERN)
    value: int = Field(ge=-1_000_000, le=1_000_000)
    preemptible: bool
    min_runtime_s: float | None = Field(default=None, ge=0, le=30 * 24 * 3600)
    description: str = Field(default="", max_length=500)


class AdmitJob(Command):
    """Asked by the queue at submit: may this team run this request at all? The reply also carries the priority
    class's value and preemptibility, which the quota service owns."""

    team: str
    project: str
    priority_class: str
    gpus: int
    gpu_models: list[str] = Field(default_factory=list)
    job_id: str | None = Field(default=None, description="the id the job will have, named in an approval request")
    job_name: str = ""
    max_runtime_s: float | None = None
    submitted_by: str = "anonymous"


class SetApprovalRule(Command):
    """`gpus_over`: more GPUs than value; `runtime_over_s`: a declared max runtime above value (or none at all);
    `priority_class`: this class (value) needs approval."""

    rule: ApprovalRule
    value: str = Field(min_length=1, max_length=63)
    enabled: bool = True


class RequestQuotaLoan(Command):
    """Ask for extra guarantee on one quota entry until a date; a platform admin decides (approval flow)."""

    path: str = Field(pattern=LOAN_PATH_PATTERN, description="org/team or org/team/project")
    gpu_model: str = Field(default="*", pattern=MODEL_PATTERN)
    gpus: int = Field(ge=1, le=100_000, description="extra guaranteed GPUs")
    until: Annotated[datetime, AfterValidator(in_calendar)] = Field(
        description="the loan ends then (at most 90 days ahead), with a time zone")
    reason: str = Field(min_length=1, max_length=500)
    requested_by: str = "anonymous"


class ListQuotaLoans(Command):
    active_only: bool = False


class DecideApproval(Command):
    approval_id: str = Field(min_length=1, max_length=64)
    approve: bool
    comment: str = Field(default="", max_length=1000)
    decided_by: str = "anonymous"


class ListApprovals(Command):
    """Newest first; `before` is the cursor (an approval id from the previous page)."""

    team: str | None = None
    state: Literal["pending", "approved", "denied", "withdrawn"] | None = None
    kind: Literal["job", "loan"] | None = None
    approval_id: str | None = Field(default=None, max_length=64)
    job_id: str | None = Field(default=None, max_length=64)
    limit: int = Field(default=100, ge=1, le=1000)
    before: str | None = Field(default=None, max_length=64)


# --- placement --------------------------------------------------------------------------------------------------
class ListAllocations(Command):
    job_id: str | None = None
    active: bool | None = None
    limit: int = Field(default=100, ge=1, le=1000)
    after: str | None = None
    cluster: str | None = Field(default=None, pattern=NAME_PATTERN, description="only this cluster's allocations")
    node: str | None = Field(default=None, pattern=NAME_PATTERN,
                             description="only this node's (an agent's resync asks for its own node's only)")


class ListDecisions(Command):
    """Recorded scheduling cycles, newest first."""

    limit: int = Field(default=50, ge=1, le=500)
    before: str | None = Field(default=None, max_length=64, description="cursor: a cycle_id from a previous page")


class GetDecision(Command):
    cycle_id: str = Field(min_length=1, max_length=64)


class ReleaseAllocation(Command):
    """Take an allocation back (reclamation's decision). A gang or single job loses all its allocations; one
    replica of a replicated job loses just that one."""

    allocation_id: str = Field(min_length=1, max_length=64)
    reason: str = Field(pattern=r"^[A-Z][A-Za-z]{1,63}$")


class SetReclaimPolicy(Command):
    """Per job kind: idle reclaim (every GPU at or below `idle_util_pct` for `idle_after_s`, then `grace_s` after a
    warning), and whether a declared max runtime is enforced."""

    kind: JobKind
    idle_after_s: float | None = Field(default=None, ge=1, le=30 * 24 * 3600, description="null: never idle-reclaim")
    idle_util_pct: float = Field(default=5.0, ge=0, le=100)
    grace_s: float = Field(default=300.0, ge=0, le=7 * 24 * 3600)
    enforce_max_runtime: bool = True


# --- accounting -------------------------------------------------------------------------------------------------
class ListUsage(Command):
    team: str | None = None
    job_id: str | None = None
    limit: int = Field(default=100, ge=1, le=1000)
    after: str | None = None


class Empty(Command):
    pass
