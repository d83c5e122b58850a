"""Turning placement's read model into the core's snapshot and policy, and core placements into events."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Mapping
from typing import Any

from libs.contracts.events import AllocatedGpu
from libs.core import (
    DEFAULT_PRIORITY_CLASSES,
    Allocation,
    Gpu,
    JobRequest,
    Node,
    Policy,
    PriorityClass,
    QuotaEntry,
    QuotaTree,
    Snapshot,
)

Row = Mapping[str, Any]


def unit_id(job_id: str, replica: int, replicas: int) -> str:
    """What the core schedules: a whole job (single or gang), or one replica of a replicated job."""
    return f"{job_id}#{replica}" if replicas > 1 else job_id


def split_unit(unit: str) -> tuple[str, int | None]:
    job_id, sep, replica = unit.partition("#")
    return job_id, (int(replica) if sep else None)


def build_snapshot(nodes: Iterable[Row], gpus: Iterable[Row], running: Iterable[Row]) -> Snapshot:
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
        running=tuple(
            Allocation(job_id=unit_id(r["job_id"], r["replica"], r["replicas"]), team=r["team"], node=r["node"],
                       gpu_uuids=tuple(r["gpu_uuids"]), started_at=r["granted_at"].timestamp(),
                       project=r["project"], priority=r["priority"], priority_class=r["priority_class"],
                       gpu_model=r["gpu_model"] or "", max_runtime_s=r["max_runtime_s"],
                       # an allocation already being preempted is on its way out: never pick it again
                       preemptible=False if r["preempt_deadline"] is not None else None)
            for r in running
        ),
    )


def build_requests(rows: Iterable[Row], live: Mapping[str, set[int]]) -> list[JobRequest]:
    """One request per schedulable unit: the whole job (single or gang), or each missing replica."""
    out: list[JobRequest] = []
    for r in rows:
        common = dict(team=r["team"], project=r["project"], gpus=r["gpus"], gpu_models=tuple(r["gpu_models"]),
                      priority=r["priority"], priority_class=r["priority_class"] or "",
                      kind=r["kind"] or "batch", submitted_at=r["submitted_at"].timestamp(),
                      max_runtime_s=r["max_runtime_s"])
        held = live.get(r["job_id"], set())
        if r["gang_nodes"]:
            if not held:
                out.append(JobRequest(job_id=r["job_id"], gang_nodes=r["gang_nodes"],
                                      gpus_per_node=r["gpus_per_node"], **common))
        elif r["replicas"] > 1:
            out += [JobRequest(job_id=unit_id(r["job_id"], i, r["replicas"]), **common)
                    for i in range(r["replicas"]) if i not in held]
        elif not held:
            out.append(JobRequest(job_id=r["job_id"], **common))
    return out


def build_policy(name: str, classes: Iterable[Row], quotas: Iterable[Row], teams: Iterable[Row],
                 min_runtime_s: float) -> Policy:
    """The quota service's classes and quota tree (core defaults until it has told us anything)."""
    priority_classes = tuple(
        PriorityClass(c["name"], c["value"], preemptible=c["preemptible"], min_runtime_s=c["min_runtime_s"])
        for c in sorted(classes, key=lambda c: (-c["value"], c["name"]))
    ) or DEFAULT_PRIORITY_CLASSES
    entries = tuple(
        QuotaEntry(path=q["path"], guaranteed=q["guaranteed"], gpu_model=q["gpu_model"],
                   borrowing_limit=q["borrowing_limit"], lending_limit=q["lending_limit"], weight=q["weight"])
        for q in sorted(quotas, key=lambda q: (q["path"], q["gpu_model"]))
    )
    team_org = tuple(sorted((t["team"], t["org"]) for t in teams))
    return Policy(name=name, priority_classes=priority_classes, quotas=QuotaTree(entries=entries, team_org=team_org),
                  min_runtime_s=min_runtime_s)


def allocated_gpus(uuids: Iterable[str], models: dict[str, str], indices: Iterable[int]) -> list[AllocatedGpu]:
    return [AllocatedGpu(uuid=u, index=i, model=models[u]) for u, i in zip(uuids, indices, strict=True)]
