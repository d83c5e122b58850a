"""Typed synchronous Python client of the gpupool HTTP API; the `gpupool` CLI is built on it."""

from libs.client.client import (
    ConfigError,
    GpupoolClient,
    GpupoolError,
    error_from_response,
    resolve_connection,
)
from libs.client.models import (
    Allocation,
    AllocationGpu,
    Approval,
    ApprovalRule,
    AuditEntry,
    CreatedToken,
    Explanation,
    Gpu,
    GpuChange,
    GpuTelemetry,
    Job,
    JobHistoryEntry,
    Node,
    Orphan,
    PlacementExplanation,
    Pool,
    PoolCounts,
    PriorityClass,
    Quota,
    QuotaEntry,
    Readiness,
    ReclaimPolicy,
    SubmitResult,
    Team,
    Token,
    UsageRecord,
    WhoAmI,
)

__all__ = [
    "Allocation", "AllocationGpu", "Approval", "ApprovalRule", "AuditEntry", "ConfigError", "CreatedToken",
    "Explanation", "Gpu", "GpuChange", "GpuTelemetry", "GpupoolClient", "GpupoolError", "Job", "JobHistoryEntry", "Node",
    "Orphan", "PlacementExplanation", "Pool", "PoolCounts", "PriorityClass", "Quota", "QuotaEntry", "Readiness",
    "ReclaimPolicy", "SubmitResult", "Team", "Token", "UsageRecord", "WhoAmI", "error_from_response",
    "resolve_connection",
]
