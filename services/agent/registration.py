"""The node's registration with inventory (`RegisterNode`): what the agent read of the node and its GPUs, with
the isolation drivers the node can run as labels. A command on the wire, so it is built here, not in the pure
`domain.py`."""

from __future__ import annotations

from libs.contracts.commands import RegisterNode
from libs.contracts.events import GpuSpec, NicSpec, VolumeSpec
from libs.contracts.work import ISOLATION_LABEL_PREFIX
from services.agent.domain import AGENT_VERSION
from services.agent.nvml_types import GpuSample, NodeInfo


def registration(cluster: str, node: str, info: NodeInfo, samples: list[GpuSample] | None = None,
                 labels: dict[str, str] | None = None,
                 drivers: dict[str, str | None] | None = None, address: str = "") -> RegisterNode:
    """`drivers`: the executor's `offered_drivers()` (driver → None when the node offers it and can run it, else
    why not), None when this agent runs no work. Each runnable driver becomes the label
    `gpupool.io/isolation.<driver>=true`, which placement requires of a node for a job whose work uses it."""
    health = {s.uuid: s.health for s in samples or []}
    offered = {f"{ISOLATION_LABEL_PREFIX}{name}": "true" for name, why in sorted((drivers or {}).items())
               if why is None}
    return RegisterNode(
        cluster=cluster, node=node, hostname=info.hostname, cpu_count=info.cpu_count,
        memory_mib=info.memory_total_mib, driver_version=info.driver_version or "", agent_version=AGENT_VERSION,
        labels={**(labels or {}), **offered},
        gpus=[GpuSpec(uuid=g.uuid, index=g.index, model=g.model, name=g.name, memory_mib=g.memory_total_mib,
                      numa_node=g.numa_node, nvlink_peers=list(g.nvlink_peers), mig_mode=g.mig_mode,
                      health=health.get(g.uuid, "healthy"))
              for g in info.gpus],
        network=[NicSpec(name=n.name, kind=n.kind, speed_mbps=n.speed_mbps) for n in info.network],
        storage=[VolumeSpec(mount=v.mount, total_gib=v.total_gib, filesystem=v.filesystem) for v in info.storage],
        address=address,
    )
