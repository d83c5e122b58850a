"""Accounting rules: how an allocation becomes GPU-seconds."""

from __future__ import annotations

from collections import Counter

from libs.contracts.events import AllocationReleased


def gpu_seconds(data: AllocationReleased) -> float:
    """Held GPUs × wall seconds held. A clock skew that would make it negative counts as zero."""
    held = (data.released_at - data.granted_at).total_seconds()
    return max(0.0, held) * len(data.gpus)


def dominant_model(data: AllocationReleased) -> str:
    """The model an allocation is charged as (allocations are single-model today; the most common wins)."""
    return Counter(g.model for g in data.gpus).most_common(1)[0][0] if data.gpus else "unknown"
