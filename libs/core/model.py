"""The resource model the scheduler reasons about: immutable values built from a snapshot."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True, slots=True)
class Gpu:
    uuid: str
    index: int
    model: str
    memory_mib: int
    healthy: bool = True


@dataclass(frozen=True, slots=True)
class Node:
    name: str
    cluster: str
    gpus: tuple[Gpu, ...]
    schedulable: bool = True
    labels: tuple[tuple[str, str], ...] = ()


@dataclass(frozen=True, slots=True)
class JobRequest:
    """What a pending job asks for. `gpu_models` empty means any model."""

    job_id: str
    team: str
    gpus: int
    submitted_at: float
    project: str = "default"
    gpu_models: tuple[str, ...] = ()
    priority: int = 0


@dataclass(frozen=True, slots=True)
class Snapshot:
    """Cluster state at one instant: nodes and the GPU uuids already held by allocations."""

    nodes: tuple[Node, ...]
    allocated_gpus: frozenset[str] = field(default_factory=frozenset)
