"""Builders for scheduling-core fixtures: small, explicit, defaults that read well in tests."""

from __future__ import annotations

import os

from hypothesis import HealthCheck, settings

from libs.core import Allocation, Gpu, JobRequest, MigInstance, Node, Snapshot

# Modest example counts: the whole core + sim suite must finish well inside CI's budget on 2 cores.
# GPUPOOL_HYPOTHESIS_EXAMPLES raises it for a deeper local run.
FAST = settings(
    max_examples=int(os.environ.get("GPUPOOL_HYPOTHESIS_EXAMPLES", "40")),
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)


def gpus(node: str, n: int = 8, model: str = "H100-80GB", memory_mib: int = 81920, sharing: str = "exclusive",
         nvlink_group: int = 4, unhealthy: tuple[int, ...] = (), mig: dict[int, tuple] | None = None):
    return tuple(
        Gpu(
            uuid=f"{node}-gpu{i}",
            index=i,
            model=model,
            memory_mib=memory_mib,
            healthy=i not in unhealthy,
            sharing=sharing,
            nvlink_domain=f"{node}-nv{i // nvlink_group}" if nvlink_group else "",
            mig_instances=tuple(MigInstance(p, s) for p, s in (mig or {}).get(i, ())),
        )
        for i in range(n)
    )


def node(name: str, n: int = 8, *, model: str = "H100-80GB", sharing: str = "exclusive", topology: str = "",
         cpu: int = 0, mem: int = 0, labels=(), schedulable: bool = True, **kw) -> Node:
    return Node(
        name=name,
        cluster="c1",
        gpus=gpus(name, n, model=model, sharing=sharing, **kw),
        schedulable=schedulable,
        labels=tuple(labels),
        topology=topology,
        cpu_milli=cpu,
        memory_mib=mem,
    )


def cluster(count: int, n: int = 8, **kw) -> tuple[Node, ...]:
    return tuple(node(f"node{i:03d}", n, **kw) for i in range(count))


def snapshot(nodes, running=(), allocated=(), usage=()) -> Snapshot:
    return Snapshot(tuple(nodes), frozenset(allocated), tuple(running), tuple(usage))


def job(job_id: str, gpus: int = 1, *, team: str = "team-a", at: float = 0.0, **kw) -> JobRequest:
    return JobRequest(job_id=job_id, team=team, gpus=gpus, submitted_at=at, **kw)


def running(job_id: str, node_name: str, indices, *, team: str = "team-a", started: float = 0.0,
            **kw) -> Allocation:
    return Allocation(
        job_id=job_id,
        team=team,
        node=node_name,
        gpu_uuids=tuple(f"{node_name}-gpu{i}" for i in indices),
        started_at=started,
        **kw,
    )
