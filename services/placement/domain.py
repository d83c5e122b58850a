"""Turning placement's read model into the core's snapshot, and core placements into allocation events."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Mapping
from typing import Any

from libs.contracts.events import AllocatedGpu
from libs.core import Gpu, JobRequest, Node, Snapshot


def build_snapshot(nodes: Iterable[Mapping[str, Any]], gpus: Iterable[Mapping[str, Any]],
                   held: Iterable[str]) -> Snapshot:
    by_node: dict[tuple[str, str], list[Gpu]] = defaultdict(list)
    for g in gpus:
        by_node[(g["cluster"], g["node"])].append(
            Gpu(uuid=g["uuid"], index=g["idx"], model=g["model"], memory_mib=g["memory_mib"],
                healthy=g["health"] == "healthy"))
    return Snapshot(
        nodes=tuple(
            Node(name=n["node"], cluster=n["cluster"], gpus=tuple(by_node[(n["cluster"], n["node"])]),
                 schedulable=n["schedulable"])
            for n in nodes
        ),
        allocated_gpus=frozenset(held),
    )


def build_requests(rows: Iterable[Mapping[str, Any]]) -> list[JobRequest]:
    return [
        JobRequest(job_id=r["job_id"], team=r["team"], project=r["project"], gpus=r["gpus"],
                   gpu_models=tuple(r["gpu_models"]), priority=r["priority"],
                   submitted_at=r["submitted_at"].timestamp())
        for r in rows
    ]


def allocated_gpus(uuids: Iterable[str], models: dict[str, str], indices: Iterable[int]) -> list[AllocatedGpu]:
    return [AllocatedGpu(uuid=u, index=i, model=models[u]) for u, i in zip(uuids, indices, strict=True)]
