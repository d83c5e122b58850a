"""Inventory rules: when a sample means a GPU's health changed, when a node is lost and when it is back."""

from __future__ import annotations

from datetime import datetime, timedelta

from libs.contracts.events import GpuTelemetry

READY = "ready"
LOST = "lost"


def health_transition(previous: str, sample: GpuTelemetry) -> str | None:
    """The new health state if the sample changes it, else None. The agent derives health from NVML signals
    (Xid, ECC, thermal); inventory records the change once and tells everyone."""
    return sample.health if sample.health != previous else None


def lost_cutoff(now: datetime, node_lost_after_s: float) -> datetime:
    """A ready node whose last report is older than this is lost."""
    return now - timedelta(seconds=node_lost_after_s)


def node_recovers(state: str, last_seen_before: datetime, sampled_at: datetime, now: datetime,
                  node_lost_after_s: float) -> bool:
    """A lost node is back when it reports something *new* (newer than what it last said before going silent) and
    *fresh* (not a backlog sample that would be lost again at the next sweep). A redelivered old sample is
    neither, so applying telemetry stays idempotent without an inbox."""
    return (state == LOST and sampled_at > last_seen_before
            and sampled_at >= lost_cutoff(now, node_lost_after_s))
