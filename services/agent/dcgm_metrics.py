"""Per-GPU Prometheus gauges named and labelled as NVIDIA's dcgm-exporter names them, so existing DCGM dashboards
and alerts work unchanged against the agent's /metrics.

Names and help texts follow dcgm-exporter's default counters CSV (`etc/default-counters.csv`), units included:
utilisation in %, framebuffer in MiB, temperature in °C, power in W, SM clock in MHz. `DCGM_FI_DEV_XID_ERRORS` is
the value of the *last* Xid seen on the GPU (0 until one happens), as DCGM reports it. Labels are the ones
dcgm-exporter attaches to every GPU series: `gpu` (index), `UUID`, `pci_bus_id`, `device` (`nvidia<index>`),
`modelName` (NVML's marketing name), `Hostname` and `DCGM_FI_DRIVER_VERSION`. One simulated-fleet process serves
every simulated node's GPUs; their series differ by `Hostname`.

A field the GPU cannot report in a sample (NVML "Not Supported", a GPU that fell off the bus, whole-GPU
utilisation of a MIG-enabled GPU) has no series for that sample, as dcgm-exporter skips blank values.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator, Sequence

from prometheus_client import REGISTRY, CollectorRegistry
from prometheus_client.core import GaugeMetricFamily

from services.agent.nvml_types import GpuInfo, GpuSample, NodeInfo

LABELS = ("gpu", "UUID", "pci_bus_id", "device", "modelName", "Hostname", "DCGM_FI_DRIVER_VERSION")

# name → (help text as in dcgm-exporter's default counters, value of one sample or None when not reported)
FIELDS: dict[str, tuple[str, Callable[[GpuSample], float | None]]] = {
    "DCGM_FI_DEV_GPU_UTIL": ("GPU utilization (in %).", lambda s: s.utilization_gpu_pct),
    "DCGM_FI_DEV_MEM_COPY_UTIL": ("Memory utilization (in %).", lambda s: s.utilization_memory_pct),
    "DCGM_FI_DEV_FB_USED": ("Framebuffer memory used (in MiB).", lambda s: s.memory_used_mib),
    "DCGM_FI_DEV_FB_FREE": ("Framebuffer memory free (in MiB).",
                            lambda s: None if s.memory_used_mib is None
                            else max(0, s.memory_total_mib - s.memory_used_mib)),
    "DCGM_FI_DEV_GPU_TEMP": ("GPU temperature (in C).", lambda s: s.temperature_c),
    "DCGM_FI_DEV_POWER_USAGE": ("Power draw (in W).", lambda s: s.power_w),
    "DCGM_FI_DEV_SM_CLOCK": ("SM clock frequency (in MHz).", lambda s: s.sm_clock_mhz),
    "DCGM_FI_DEV_ECC_SBE_VOL_TOTAL": ("Total number of single-bit volatile ECC errors.",
                                      lambda s: s.ecc_volatile_sbe),
    "DCGM_FI_DEV_ECC_DBE_VOL_TOTAL": ("Total number of double-bit volatile ECC errors.",
                                      lambda s: s.ecc_volatile_dbe),
}
XID_ERRORS = "DCGM_FI_DEV_XID_ERRORS"
METRIC_NAMES = (*FIELDS, XID_ERRORS)
HELP: dict[str, str] = {**{name: help_text for name, (help_text, _) in FIELDS.items()},
                        XID_ERRORS: "Value of the last XID error encountered."}


def dcgm_pci_bus_id(bus_id: str) -> str:
    """NVML/DCGM spell the PCI domain with 8 hex digits ("00000000:18:00.0"); the agent keeps sysfs form."""
    domain, sep, rest = bus_id.partition(":")
    if not sep or len(domain) >= 8:
        return bus_id.upper() if sep else bus_id
    return f"{domain.zfill(8)}:{rest}".upper()


class DcgmMetrics:
    """The DCGM series as one custom collector, registered once per registry (the process default unless a test
    passes its own). A sample only replaces the node's latest readings; the series are built when scraped — a
    simulated fleet samples ~10,000 GPUs a second and is scraped every 15 s or so, so building 100,000 labelled
    gauge updates per second (what per-series `Gauge.labels().set()` costs) would be most of the agent's CPU."""

    def __init__(self, registry: CollectorRegistry = REGISTRY) -> None:
        self._latest: dict[str, tuple[NodeInfo, Sequence[GpuSample]]] = {}  # Hostname → last sample of its node
        self._last_xid: dict[tuple[str, str], int] = {}  # (Hostname, UUID) → last Xid
        self._lock = threading.Lock()  # the scrape runs on the HTTP server's thread
        registry.register(self)

    def update(self, hostname: str, info: NodeInfo, samples: Sequence[GpuSample]) -> None:
        """Keep one sample of a node as what its GPUs' series show until the next one."""
        with self._lock:
            self._latest[hostname] = (info, samples)
            for s in samples:
                if s.xid_events:
                    self._last_xid[(hostname, s.uuid)] = s.xid_events[-1]

    def describe(self) -> list[GaugeMetricFamily]:
        return [GaugeMetricFamily(name, help_text, labels=LABELS) for name, help_text in HELP.items()]

    def collect(self) -> Iterator[GaugeMetricFamily]:
        families = {name: GaugeMetricFamily(name, help_text, labels=LABELS) for name, help_text in HELP.items()}
        with self._lock:
            latest = list(self._latest.items())
            last_xid = dict(self._last_xid)
        for hostname, (info, samples) in latest:
            gpus: dict[str, GpuInfo] = {g.uuid: g for g in info.gpus}
            for s in samples:
                labels = labels_for(hostname, info, s, gpus.get(s.uuid))
                for name, (_, value_of) in FIELDS.items():
                    value = value_of(s)
                    if value is not None:  # not reported: no series, as dcgm-exporter skips blank values
                        families[name].add_metric(labels, float(value))
                families[XID_ERRORS].add_metric(labels, float(last_xid.get((hostname, s.uuid), 0)))
        yield from families.values()


def labels_for(hostname: str, info: NodeInfo, sample: GpuSample, gpu: GpuInfo | None) -> tuple[str, ...]:
    return (
        str(sample.index),
        sample.uuid,
        dcgm_pci_bus_id(gpu.pci_bus_id) if gpu is not None else "",
        f"nvidia{sample.index}",
        gpu.name if gpu is not None else "",
        hostname,
        info.driver_version or "",
    )


_default: DcgmMetrics | None = None


def default_metrics() -> DcgmMetrics:
    """The gauges on the process's default registry (what the agent's /metrics serves), created on first use."""
    global _default
    if _default is None:
        _default = DcgmMetrics()
    return _default
