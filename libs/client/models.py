"""Response models of the gpupool HTTP API, as the client sees them.

Every model allows extra fields, so a newer gateway that adds fields never breaks an older client, and most fields
have defaults, so a field the gateway stops sending degrades to None instead of an exception. `raw` keeps the JSON
object exactly as the gateway sent it (the CLI's `--output json` prints that).
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, PrivateAttr


class ApiModel(BaseModel):
    model_config = ConfigDict(extra="allow", populate_by_name=True)

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
    history: list[JobHistoryEntry] = Field(default_factory=list, description="only in GET /v1/jobs/{id}")


class SubmitResult(Job):
    """A submitted job; `created` is False when the gateway replayed an earlier submission with the same key."""

    created: bool = True
    idempotency_key: str | None = None


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


# --- allocations and usage ------------------------------------------------------------------------------------------
class AllocationGpu(ApiModel):
    uuid: str
    index: int = 0
    model: str = ""


class Allocation(ApiModel):
    allocation_id: str
    job_id: str
    team: str = ""
    project: str = ""
    cluster: str = ""
    node: str = ""
    granted_at: datetime | None = None
    released_at: datetime | None = None
    release_reason: str | None = None
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


# --- teams ----------------------------------------------------------------------------------------------------------
class Quota(ApiModel):
    gpu_model: str
    guaranteed: int = 0
    borrowing_limit: int | None = None
    lending_limit: int | None = None
    over_quota_weight: float | None = None


class Team(ApiModel):
    team: str
    org: str = ""
    quotas: list[Quota] = Field(default_factory=list)


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
