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
    AuditEntry,
    CreatedToken,
    Gpu,
    GpuTelemetry,
    Job,
    JobHistoryEntry,
    Node,
    Quota,
    Readiness,
    SubmitResult,
    Team,
    Token,
    UsageRecord,
    WhoAmI,
)

__all__ = [
    "Allocation", "AllocationGpu", "AuditEntry", "ConfigError", "CreatedToken", "Gpu", "GpuTelemetry",
    "GpupoolClient", "GpupoolError", "Job", "JobHistoryEntry", "Node", "Quota", "Readiness", "SubmitResult",
    "Team", "Token", "UsageRecord", "WhoAmI", "error_from_response", "resolve_connection",
]
