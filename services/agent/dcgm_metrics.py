"""Per-GPU Prometheus series named, typed and labelled as NVIDIA's dcgm-exporter names them, so existing DCGM
dashboards and alerts work unchanged against the agent's /metrics.

Every field of dcgm-exporter's default counters CSV (`etc/default-counters.csv`) is served, with its Prometheus type
(gauge or counter), help text and unit: utilisation in %, framebuffer in MiB, temperatures in °C, power in W, clocks
in MHz, energy in mJ, PCIe traffic in bytes per second, the profiling (`DCGM_FI_PROF_*`) activities as ratios 0..1.
`DCGM_FI_DEV_XID_ERRORS` is the value of the *last* Xid seen on the GPU (0 until one happens), as DCGM reports it.
Labels are the ones dcgm-exporter attaches to every GPU series: `gpu` (index), `UUID`, `pci_bus_id`, `device`
(`nvidia<index>`), `modelName` (NVML's marketing name), `Hostname` and `DCGM_FI_DRIVER_VERSION`. One simulated-fleet
process serves every simulated node's GPUs; their series differ by `Hostname`.

A field the GPU cannot report in a sample (NVML "Not Supported", a GPU that fell off the bus, whole-GPU
utilisation of a MIG-enabled GPU, the profiling ratios on the real backend) has no series for that sample, as
dcgm-exporter skips blank values.

Beside them, `gpupool_gpu_allocation_info{UUID, Hostname, gpu, job_id, team, project, allocation} 1`: one series per
(GPU, live allocation on it), the job mapping dcgm-exporter's Kubernetes mode adds as `pod`/`namespace`/`container`
labels, here an info metric to join on `(Hostname, UUID)`. A whole GPU carries one allocation, a GPU split into MIG
slices or fractions one series per allocation holding part of it; a series goes when its allocation is released.
The job label is `job_id`: a `job` label would clash with the scrape target's and become `exported_job`.

Counters keep their DCGM names (no `_total` suffix), as dcgm-exporter serves them: `# TYPE
DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION counter` then `DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION{...} 1.2e+09`.
prometheus_client's text exposition appends `_total` to a family typed "counter", so those families carry a type
word that reads "counter" but is not the client's counter type (:data:`COUNTER`).
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Literal

from prometheus_client import REGISTRY, CollectorRegistry
from prometheus_client.core import Metric

from services.agent.domain import LiveAllocation
from services.agent.nvml_types import GpuInfo, GpuSample, NodeInfo

LABELS = ("gpu", "UUID", "pci_bus_id", "device", "modelName", "Hostname", "DCGM_FI_DRIVER_VERSION")


class _VerbatimCounter(str):
    """The type word "counter" that prometheus_client's exposition does not take for its own counter type, so it
    prints the family under its own name (dcgm-exporter's), not `<name>_total`."""

    __slots__ = ()

    def __eq__(self, other: object) -> bool:
        return isinstance(other, _VerbatimCounter)

    def __ne__(self, other: object) -> bool:
        return not self.__eq__(other)

    __hash__ = str.__hash__


COUNTER = _VerbatimCounter("counter")
Kind = Literal["gauge", "counter"]
Value = Callable[[GpuSample], float | int | bool | None]


def _fb_free(s: GpuSample) -> int | None:
    if s.extra.fb_free_mib is not None:
        return s.extra.fb_free_mib
    return None if s.memory_used_mib is None else max(0, s.memory_total_mib - s.memory_used_mib)


def _fb_used(s: GpuSample) -> int | None:
    return s.extra.fb_used_mib if s.extra.fb_used_mib is not None else s.memory_used_mib


# name → (type, help text as in dcgm-exporter's default counters, value of one sample or None when not reported)
FIELDS: dict[str, tuple[Kind, str, Value]] = {
    "DCGM_FI_DEV_SM_CLOCK": ("gauge", "SM clock frequency (in MHz).", lambda s: s.sm_clock_mhz),
    "DCGM_FI_DEV_MEM_CLOCK": ("gauge", "Memory clock frequency (in MHz).", lambda s: s.extra.memory_clock_mhz),
    "DCGM_FI_DEV_MEMORY_TEMP": ("gauge", "Memory temperature (in C).", lambda s: s.extra.memory_temperature_c),
    "DCGM_FI_DEV_GPU_TEMP": ("gauge", "GPU temperature (in C).", lambda s: s.temperature_c),
    "DCGM_FI_DEV_POWER_USAGE": ("gauge", "Power draw (in W).", lambda s: s.power_w),
    "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION": ("counter", "Total energy consumption since boot (in mJ).",
                                             lambda s: s.extra.energy_mj),
    "DCGM_FI_DEV_PCIE_REPLAY_COUNTER": ("counter", "Total number of PCIe retries.",
                                        lambda s: s.extra.pcie_replay_count),
    "DCGM_FI_DEV_GPU_UTIL": ("gauge", "GPU utilization (in %).", lambda s: s.utilization_gpu_pct),
    "DCGM_FI_DEV_MEM_COPY_UTIL": ("gauge", "Memory utilization (in %).", lambda s: s.utilization_memory_pct),
    "DCGM_FI_DEV_ENC_UTIL": ("gauge", "Encoder utilization (in %).", lambda s: s.extra.encoder_util_pct),
    "DCGM_FI_DEV_DEC_UTIL": ("gauge", "Decoder utilization (in %).", lambda s: s.extra.decoder_util_pct),
    "DCGM_FI_DEV_FB_FREE": ("gauge", "Framebuffer memory free (in MiB).", _fb_free),
    "DCGM_FI_DEV_FB_USED": ("gauge", "Framebuffer memory used (in MiB).", _fb_used),
    "DCGM_FI_DEV_FB_RESERVED": ("gauge", "Framebuffer memory reserved (in MiB).", lambda s: s.extra.fb_reserved_mib),
    "DCGM_FI_DEV_ECC_SBE_VOL_TOTAL": ("counter", "Total number of single-bit volatile ECC errors.",
                                      lambda s: s.ecc_volatile_sbe),
    "DCGM_FI_DEV_ECC_DBE_VOL_TOTAL": ("counter", "Total number of double-bit volatile ECC errors.",
                                      lambda s: s.ecc_volatile_dbe),
    "DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL": ("counter", "Total number of NVLink bandwidth counters for all lanes.",
                                           lambda s: s.extra.nvlink_data_kib),
    "DCGM_FI_DEV_VGPU_LICENSE_STATUS": ("gauge", "vGPU License status", lambda s: s.extra.vgpu_license_status),
    "DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS": ("counter", "Number of remapped rows for uncorrectable errors",
                                                lambda s: s.extra.uncorrectable_remapped_rows),
    "DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS": ("counter", "Number of remapped rows for correctable errors",
                                              lambda s: s.extra.correctable_remapped_rows),
    "DCGM_FI_DEV_ROW_REMAP_FAILURE": ("gauge", "Whether remapping of rows has failed",
                                      lambda s: s.extra.row_remap_failure),
    "DCGM_FI_PROF_GR_ENGINE_ACTIVE": ("gauge", "Ratio of time the graphics engine is active.",
                                      lambda s: s.extra.gr_engine_active),
    "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE": ("gauge", "Ratio of cycles the tensor (HMMA) pipe is active.",
                                        lambda s: s.extra.tensor_active),
    "DCGM_FI_PROF_DRAM_ACTIVE": ("gauge", "Ratio of cycles the device memory interface is active sending or "
                                 "receiving data.", lambda s: s.extra.dram_active),
    "DCGM_FI_PROF_PCIE_TX_BYTES": ("gauge", "The rate of data transmitted over the PCIe bus - including both "
                                   "protocol headers and data payloads - in bytes per second.",
                                   lambda s: s.extra.pcie_tx_bytes_per_s),
    "DCGM_FI_PROF_PCIE_RX_BYTES": ("gauge", "The rate of data received over the PCIe bus - including both "
                                   "protocol headers and data payloads - in bytes per second.",
                                   lambda s: s.extra.pcie_rx_bytes_per_s),
}
XID_ERRORS = "DCGM_FI_DEV_XID_ERRORS"
ALLOCATION_INFO = "gpupool_gpu_allocation_info"
ALLOCATION_LABELS = ("UUID", "Hostname", "gpu", "job_id", "team", "project", "allocation")
ALLOCATION_HELP = ("1 per GPU and live allocation holding it (whole, MIG slice or fraction): the job, team and "
                   "project of the work on the GPU, to join with the DCGM series on (Hostname, UUID).")
METRIC_NAMES = (*FIELDS, XID_ERRORS)
TYPES: dict[str, Kind] = {**{name: kind for name, (kind, _, _) in FIELDS.items()}, XID_ERRORS: "gauge"}
HELP: dict[str, str] = {**{name: help_text for name, (_, help_text, _) in FIELDS.items()},
                        XID_ERRORS: "Value of the last XID error encountered."}


def _family(name: str) -> Metric:
    family = Metric(name, HELP[name], "gauge")
    if TYPES[name] == "counter":
        family.type = COUNTER
    return family


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
        self._allocations: dict[str, tuple[tuple[str, ...], ...]] = {}  # Hostname → its allocation info labels
        self._lock = threading.Lock()  # the scrape runs on the HTTP server's thread
        registry.register(self)

    def update(self, hostname: str, info: NodeInfo, samples: Sequence[GpuSample]) -> None:
        """Keep one sample of a node as what its GPUs' series show until the next one."""
        with self._lock:
            self._latest[hostname] = (info, samples)
            for s in samples:
                if s.xid_events:
                    self._last_xid[(hostname, s.uuid)] = s.xid_events[-1]

    def set_allocations(self, hostname: str, allocations: Iterable[LiveAllocation]) -> None:
        """The node's live allocations now (all of them, replacing the previous set): what the allocation info
        series show until the next call. An allocation left out has no series from here on."""
        rows = allocation_info_labels(hostname, allocations)
        with self._lock:
            if rows:
                self._allocations[hostname] = rows
            else:
                self._allocations.pop(hostname, None)

    def describe(self) -> list[Metric]:
        return [*(_family(name) for name in METRIC_NAMES), Metric(ALLOCATION_INFO, ALLOCATION_HELP, "gauge")]

    def collect(self) -> Iterator[Metric]:
        families = {name: _family(name) for name in METRIC_NAMES}
        with self._lock:
            latest = list(self._latest.items())
            last_xid = dict(self._last_xid)
            allocations = [row for rows in self._allocations.values() for row in rows]
        for hostname, (info, samples) in latest:
            gpus: dict[str, GpuInfo] = {g.uuid: g for g in info.gpus}
            for s in samples:
                labels = labels_for(hostname, info, s, gpus.get(s.uuid))
                label_map = dict(zip(LABELS, labels, strict=True))
                for name, (_, _, value_of) in FIELDS.items():
                    value = value_of(s)
                    if value is not None:  # not reported: no series, as dcgm-exporter skips blank values
                        families[name].add_sample(name, label_map, float(value))
                families[XID_ERRORS].add_sample(XID_ERRORS, label_map, float(last_xid.get((hostname, s.uuid), 0)))
        yield from families.values()
        info = Metric(ALLOCATION_INFO, ALLOCATION_HELP, "gauge")
        for row in allocations:
            info.add_sample(ALLOCATION_INFO, dict(zip(ALLOCATION_LABELS, row, strict=True)), 1.0)
        yield info


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


def allocation_info_labels(hostname: str, allocations: Iterable[LiveAllocation]) -> tuple[tuple[str, ...], ...]:
    """One label tuple (in ALLOCATION_LABELS' order) per GPU of each allocation, sorted; a GPU listed twice
    by one allocation (two MIG slices of the same GPU) still gives one series."""
    rows = {(g.uuid, hostname, str(g.index), a.job_id, a.team, a.project, a.allocation_id)
            for a in allocations for g in a.gpus}
    return tuple(sorted(rows))


_default: DcgmMetrics | None = None


def default_metrics() -> DcgmMetrics:
    """The gauges on the process's default registry (what the agent's /metrics serves), created on first use."""
    global _default
    if _default is None:
        _default = DcgmMetrics()
    return _default
