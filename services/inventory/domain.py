"""Inventory rules: when a sample means a GPU's health changed."""

from __future__ import annotations

from libs.contracts.events import GpuTelemetry


def health_transition(previous: str, sample: GpuTelemetry) -> str | None:
    """The new health state if the sample changes it, else None. The agent derives health from NVML signals
    (Xid, ECC, thermal); inventory records the change once and tells everyone."""
    return sample.health if sample.health != previous else None
