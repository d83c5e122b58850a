"""Idle detection: an allocation is busy when any of its GPUs is above the busy threshold."""

from __future__ import annotations

from collections.abc import Iterable

from libs.contracts.events import GpuTelemetry


def allocation_utilization(samples: Iterable[GpuTelemetry], gpu_uuids: Iterable[str]) -> tuple[float, float] | None:
    """(mean, max) utilization over the allocation's GPUs present in this sample, or None if none are."""
    wanted = set(gpu_uuids)
    values = [s.utilization_gpu_pct for s in samples if s.uuid in wanted]
    if not values:
        return None
    return sum(values) / len(values), max(values)


def is_busy(max_util_pct: float, threshold_pct: float) -> bool:
    return max_util_pct > threshold_pct
