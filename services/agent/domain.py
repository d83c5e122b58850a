"""Translating NVML readings into the wire contracts (registration command and telemetry event)."""

from __future__ import annotations

from datetime import UTC, datetime

from libs.contracts.commands import RegisterNode
from libs.contracts.events import GpuSpec, GpuTelemetry, TelemetrySampled
from services.agent.nvml_types import GpuSample, NodeInfo

AGENT_VERSION = "0.1.0"


def registration(cluster: str, node: str, info: NodeInfo, samples: list[GpuSample] | None = None,
                 labels: dict[str, str] | None = None) -> RegisterNode:
    health = {s.uuid: s.health for s in samples or []}
    return RegisterNode(
        cluster=cluster, node=node, hostname=info.hostname, cpu_count=info.cpu_count,
        memory_mib=info.memory_total_mib, driver_version=info.driver_version or "", agent_version=AGENT_VERSION,
        labels=labels or {},
        gpus=[GpuSpec(uuid=g.uuid, index=g.index, model=g.model, name=g.name, memory_mib=g.memory_total_mib,
                      numa_node=g.numa_node, nvlink_peers=list(g.nvlink_peers), mig_mode=g.mig_mode,
                      health=health.get(g.uuid, "healthy"))
              for g in info.gpus],
    )


def telemetry(cluster: str, node: str, samples: list[GpuSample], at: float) -> TelemetrySampled:
    return TelemetrySampled(
        cluster=cluster, node=node, sampled_at=datetime.fromtimestamp(at, UTC),
        gpus=[GpuTelemetry(
            uuid=s.uuid, index=s.index, utilization_gpu_pct=_pct(s.utilization_gpu_pct),
            utilization_memory_pct=_pct(s.utilization_memory_pct), memory_used_mib=s.memory_used_mib or 0,
            memory_total_mib=s.memory_total_mib, temperature_c=s.temperature_c, power_w=s.power_w,
            sm_clock_mhz=s.sm_clock_mhz, ecc_volatile_sbe=s.ecc_volatile_sbe, ecc_volatile_dbe=s.ecc_volatile_dbe,
            xid_events=list(s.xid_events), throttle_reasons=list(s.throttle_reasons), process_count=s.process_count,
            health=s.health, health_reasons=list(s.health_reasons))
            for s in samples],
    )


def _pct(value: float | None) -> float:
    return 0.0 if value is None else max(0.0, min(100.0, value))
