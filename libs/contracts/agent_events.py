"""Typed payloads of the events a node's agent publishes: what it applied (MIG instances, fraction limits), its
work's start, readiness and end, its replicas' endpoints, and its telemetry. Re-exported by libs/contracts/events.py
with every other payload (the registry lives there)."""

from __future__ import annotations

from datetime import datetime
from typing import ClassVar, Literal

from pydantic import ConfigDict, Field

from libs.contracts import subjects
from libs.contracts.bounds import BoundedModel
from libs.contracts.event_base import AllocationSubject, EventData, Health
from libs.contracts.work import WorkExit


# --- what the node agent applied (agent) ------------------------------------------------------------------------
class AgentEvent(AllocationSubject):
    """What every event a node's agent publishes about an allocation says: whose it is, and where (on the agent's
    own node's subject)."""

    node_scoped: ClassVar[bool] = True


class AgentAllocationEvent(AgentEvent):
    """What the node agent's events say about the allocation and GPU they concern."""

    gpu_uuid: str
    gpu_index: int


class MigApplied(AgentAllocationEvent):
    """The node agent acted on a MIG allocation: `created` (the instance exists; `mig_uuid` is the device the
    workload must see), `destroyed` (released, instance gone) or `failed` (not applied yet, `reason` says why; the
    agent retries while the allocation lives). Published by the agent directly to JetStream, once per outcome."""

    event_type: ClassVar[str] = "io.gpupool.agent.mig_applied.v1"
    event_subject: ClassVar[str] = subjects.AGENT_MIG_APPLIED

    profile: str
    start: int
    action: Literal["created", "destroyed", "failed"]
    mig_uuid: str | None = None
    reason: str | None = Field(default=None, description="why it failed: MigModeDisabled, SlotInUse, InstanceBusy, "
                                                          "ProcessesOutsideLayout, UnknownProfile, or NVML's error")
    applied_at: datetime


class FractionExceeded(AgentAllocationEvent):
    """A process of a fractional allocation uses more GPU memory than the fraction was promised (its CUDA MPS
    pinned memory limit). `action`: `reported`, or `stopped` (policy stop: SIGTERM, SIGKILL after a grace).
    Reported once per (allocation, process)."""

    event_type: ClassVar[str] = "io.gpupool.agent.fraction_exceeded.v1"
    event_subject: ClassVar[str] = subjects.AGENT_FRACTION_EXCEEDED

    pid: int
    used_mib: int
    limit_mib: int
    action: Literal["reported", "stopped"]
    detected_at: datetime


class AgentWorkEvent(AgentEvent):
    """What the agent's work events say about the allocation whose work they concern."""

    replica: int = 0
    attempt: int = 0


class WorkStarted(AgentWorkEvent):
    """The agent started an allocation's work: its process exists in its cgroup (a job becomes `running` on this,
    not on the grant). Published by the agent directly to JetStream."""

    event_type: ClassVar[str] = "io.gpupool.agent.work_started.v1"
    event_subject: ClassVar[str] = subjects.AGENT_WORK_STARTED

    pid: int = Field(ge=1)
    isolation: str
    started_at: datetime


class WorkReady(AgentWorkEvent):
    """A gang member's grant is applied on its node (GPUs, MIG instance, MPS) and its command waits for the other
    members: placement answers `allocation.gang_ready` once every member is ready. Published by the agent
    directly to JetStream."""

    event_type: ClassVar[str] = "io.gpupool.agent.work_ready.v1"
    event_subject: ClassVar[str] = subjects.AGENT_WORK_READY

    ready_at: datetime


class WorkExited(AgentWorkEvent):
    """An allocation's work ended and its cgroup is empty: placement may release the GPUs now. `exit` says how
    (exit code, signal, OOM, a launch failure, a stop). Published by the agent directly to JetStream."""

    event_type: ClassVar[str] = "io.gpupool.agent.work_exited.v1"
    event_subject: ClassVar[str] = subjects.AGENT_WORK_EXITED

    exit: WorkExit


class WorkLoadSampled(AgentWorkEvent):
    """One replica's load as its node's agent sampled it for the job's autoscaler (the work's `load` probe): its
    GPUs' mean utilisation in percent, or the scraped metric's value. Published by the agent directly to
    JetStream, every `load.every_s` while the work runs."""

    event_type: ClassVar[str] = "io.gpupool.agent.work_load.v1"
    event_subject: ClassVar[str] = subjects.AGENT_WORK_LOAD

    signal: Literal["gpu_utilization", "metric"]
    value: float = Field(ge=0, le=1e12)
    sampled_at: datetime


# --- a replica's endpoint (agent) ---------------------------------------------------------------------------------
class EndpointEvent(AgentWorkEvent):
    """Where a replica of a job serves (the first of its work's `ports`, on its node's address), for a load balancer
    or a service mesh to follow."""

    url: str = Field(max_length=300, pattern=r"^(http|tcp)://[^\s/]+:[0-9]{1,5}$", description="http://<address>:<port>")
    ports: dict[str, int] = Field(default_factory=dict, max_length=16, description="every named port → host port")
    at: datetime


class EndpointReady(EndpointEvent):
    """The replica answers its health check (or, without one, its work started): send it traffic."""

    event_type: ClassVar[str] = "io.gpupool.endpoint.ready.v1"
    event_subject: ClassVar[str] = subjects.ENDPOINT_READY


class EndpointUnready(EndpointEvent):
    """The replica stopped serving: its health check failed (`HealthCheckFailed`), its work exited (the exit's
    reason), or it is being stopped (`Draining`). Take it out of rotation."""

    event_type: ClassVar[str] = "io.gpupool.endpoint.unready.v1"
    event_subject: ClassVar[str] = subjects.ENDPOINT_UNREADY

    reason: str = Field(max_length=64)
    message: str = Field(default="", max_length=2000)


# --- telemetry (agent) ------------------------------------------------------------------------------------------
_MIB = 1 << 30  # 1 PiB in MiB: beyond any GPU's or node's memory
_COUNT = 1 << 31


class GpuTelemetry(BoundedModel):
    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)

    uuid: str = Field(max_length=128)
    index: int = Field(ge=0, le=255)
    utilization_gpu_pct: float = Field(ge=0, le=100)
    utilization_memory_pct: float = Field(ge=0, le=100)
    memory_used_mib: int = Field(ge=0, le=_MIB)
    memory_total_mib: int = Field(ge=0, le=_MIB)
    temperature_c: float | None = Field(default=None, ge=-273.15, le=1000)
    power_w: float | None = Field(default=None, ge=0, le=100_000)
    sm_clock_mhz: int | None = Field(default=None, ge=0, le=100_000)
    ecc_volatile_sbe: int = Field(default=0, ge=0, le=2**53)
    ecc_volatile_dbe: int = Field(default=0, ge=0, le=2**53)
    xid_events: list[int] = Field(default_factory=list, max_length=1024)
    throttle_reasons: list[str] = Field(default_factory=list, max_length=64)
    process_count: int = Field(default=0, ge=0, le=_COUNT)
    health: Health = "healthy"
    health_reasons: list[str] = Field(default_factory=list, max_length=64)


class TelemetrySampled(EventData):
    """One agent sample of every GPU on a node. Sent on `gpupool.telemetry.<cluster>.<node>`, not the events
    stream: high volume, short retention."""

    event_type: ClassVar[str] = "io.gpupool.telemetry.sampled.v1"
    event_subject: ClassVar[str] = subjects.TELEMETRY_ALL  # concrete subject: subjects.telemetry(cluster, node)
    entity_field: ClassVar[str] = "node"

    cluster: str = Field(max_length=64)
    node: str = Field(max_length=128)
    sampled_at: datetime
    cpu_util_pct: float | None = Field(default=None, ge=0, le=100)
    memory_used_mib: int | None = Field(default=None, ge=0, le=_MIB)
    gpus: list[GpuTelemetry] = Field(max_length=256)
    network_rx_mbps: float | None = Field(default=None, ge=0, le=1e9, description="All reported interfaces, received")
    network_tx_mbps: float | None = Field(default=None, ge=0, le=1e9, description="All reported interfaces, sent")
    storage_used_gib: float | None = Field(default=None, ge=0, le=1e9, description="All reported volumes, used")
    interval_s: float | None = Field(default=None, gt=0, le=86_400, description=(
        "The agent's sampling interval, when it samples by change: a sample left out within `heartbeat_s` means "
        "the GPUs' values did not move beyond its deadband (inventory counts the last sent ones for those seconds)"))
    heartbeat_s: float | None = Field(default=None, gt=0, le=86_400, description=(
        "The longest the agent stays silent while sampling by change; absent: every sample is sent"))
