"""Typed synchronous Python client of the gpupool HTTP API; the `gpupool` CLI is built on it."""

from libs.client.client import GpupoolClient, resolve_connection
from libs.client.errors import ConfigError, GpupoolError, error_from_response
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
    Nic,
    Node,
    NodeNetwork,
    NodeStorage,
    NodeTotals,
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
    Volume,
    WhoAmI,
    Work,
)

__all__ = [
    "Allocation", "AllocationGpu", "Approval", "ApprovalRule", "AuditEntry", "ConfigError", "CreatedToken",
    "Explanation", "Gpu", "GpuChange", "GpuTelemetry", "GpupoolClient", "GpupoolError", "Job", "JobHistoryEntry", "Nic",
    "Node", "NodeNetwork", "NodeStorage", "NodeTotals", "Orphan", "PlacementExplanation", "Pool", "PoolCounts", "PriorityClass", "Quota", "QuotaEntry", "Readiness",
    "ReclaimPolicy", "SubmitResult", "Team", "Token", "UsageRecord", "Volume", "WhoAmI", "Work", "error_from_response",
    "resolve_connection",
]
