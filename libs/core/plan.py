"""What one scheduling cycle decides: data, not actions, so callers can verify before they commit."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Placement:
    job_id: str
    cluster: str
    node: str
    gpu_uuids: tuple[str, ...]
    gpu_indices: tuple[int, ...]


@dataclass(frozen=True, slots=True)
class PendingReason:
    """Why a job stays pending: a machine code (CamelCase) and a message for people."""

    job_id: str
    reason: str
    message: str


@dataclass(frozen=True, slots=True)
class Plan:
    placements: tuple[Placement, ...]
    pending: tuple[PendingReason, ...]
