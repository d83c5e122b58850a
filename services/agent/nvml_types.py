"""GPU inventory and telemetry types shared by the agent's NVML backends.

Stdlib only. Two interchangeable backends implement :class:`NvmlBackend`:
``services.agent.nvml_real.RealNvml`` (pynvml) and
``services.agent.nvml_sim.SimulatedNvml`` (simulated dynamics + fault injection).

All health rules live in :func:`derive_health` so both backends (and anything that
re-evaluates a sample later) agree on what "degraded" and "failed" mean.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Literal, Protocol, runtime_checkable

Health = Literal["healthy", "degraded", "failed"]

HEALTHY: Health = "healthy"
DEGRADED: Health = "degraded"
FAILED: Health = "failed"

_SEVERITY_RANK = {HEALTHY: 0, DEGRADED: 1, FAILED: 2}


@dataclass(frozen=True, slots=True)
class MigInstance:
    """One MIG device carved out of a physical GPU."""

    profile: str  # e.g. "1g.10gb"
    start: int | None  # first memory slice of the GPU-instance placement (None if unknown)
    size: int | None  # number of memory slices the placement spans (None if unknown)
    uuid: str  # "MIG-..."


@dataclass(frozen=True, slots=True)
class GpuInfo:
    """Static facts about one physical GPU (read once at startup)."""

    uuid: str
    index: int
    name: str  # marketing name, e.g. "NVIDIA H100 80GB HBM3"
    model: str  # short canonical model, e.g. "H100-80GB"
    memory_total_mib: int
    pci_bus_id: str  # normalised sysfs form: "0000:1b:00.0"
    serial: str | None
    numa_node: int | None
    nvlink_peers: tuple[int, ...]  # indices of GPUs on this node reachable over NVLink
    mig_mode: bool
    mig_instances: tuple[MigInstance, ...]
    compute_capability: str | None  # "9.0"
    power_limit_w: float | None
    # Extra (not part of the original field list): the GPU's own slowdown threshold,
    # used by derive_health's thermal rule. None when the GPU does not expose it.
    slowdown_temp_c: float | None = None


@dataclass(frozen=True, slots=True)
class GpuExtraReadings:
    """What a GPU reports beyond the telemetry the platform schedules on: the rest of dcgm-exporter's default
    fields (served on the agent's /metrics, not sent as telemetry). None: not reported (the GPU or driver lacks it,
    or the backend cannot read it, e.g. the profiling ratios on the real backend, which need DCGM)."""

    memory_clock_mhz: int | None = None
    memory_temperature_c: float | None = None  # HBM parts; GDDR boards do not report it
    energy_mj: int | None = None  # since the driver loaded, a counter
    pcie_replay_count: int | None = None  # a counter
    encoder_util_pct: float | None = None
    decoder_util_pct: float | None = None
    fb_used_mib: int | None = None  # NVML's v2 memory info, where read (used excludes reserved); else the sample's
    fb_free_mib: int | None = None
    fb_reserved_mib: int | None = None
    nvlink_data_kib: int | None = None  # NVLink data sent + received over all links, KiB, a counter
    vgpu_license_status: int | None = None
    correctable_remapped_rows: int | None = None
    uncorrectable_remapped_rows: int | None = None
    row_remap_failure: bool | None = None
    gr_engine_active: float | None = None  # ratios 0..1 (DCGM's profiling metrics)
    tensor_active: float | None = None
    dram_active: float | None = None
    pcie_tx_bytes_per_s: float | None = None
    pcie_rx_bytes_per_s: float | None = None


NO_EXTRA_READINGS = GpuExtraReadings()


@dataclass(frozen=True, slots=True)
class GpuSample:
    """One telemetry reading for one physical GPU.

    Fields that a GPU cannot report (NVML "Not Supported", or GPU lost) are None.
    ``xid_events`` holds only the Xids observed since the previous sample.
    """

    uuid: str
    index: int
    timestamp: float  # seconds, from the backend's injected clock
    utilization_gpu_pct: float | None
    utilization_memory_pct: float | None
    memory_used_mib: int | None
    memory_total_mib: int
    temperature_c: float | None
    power_w: float | None
    sm_clock_mhz: int | None
    ecc_volatile_sbe: int
    ecc_volatile_dbe: int
    retired_pages_pending: bool
    xid_events: tuple[int, ...]
    throttle_reasons: tuple[str, ...]
    process_count: int
    health: Health
    health_reasons: tuple[str, ...] = field(default=())
    extra: GpuExtraReadings = NO_EXTRA_READINGS


@dataclass(frozen=True, slots=True)
class NicInfo:
    """A data-plane network interface: an Ethernet netdev, or an InfiniBand port ("mlx5_0/1")."""

    name: str
    kind: Literal["ethernet", "infiniband", "other"]
    speed_mbps: int | None  # None when the link is down or the speed unknown


@dataclass(frozen=True, slots=True)
class VolumeInfo:
    """A filesystem the node offers work (one of the agent's configured storage paths)."""

    mount: str
    total_gib: float
    filesystem: str  # "" when unknown


@dataclass(frozen=True, slots=True)
class NodeSample:
    """The node around the GPUs, one reading: None where the host could not say (the first reading has no CPU or
    network rate yet: both need two reads)."""

    cpu_util_pct: float | None = None
    memory_used_mib: int | None = None
    network_rx_mbps: float | None = None  # summed over NodeInfo.network
    network_tx_mbps: float | None = None
    storage_used_gib: float | None = None  # summed over NodeInfo.storage


@dataclass(frozen=True, slots=True)
class NodeInfo:
    hostname: str
    driver_version: str | None
    cuda_driver_version: str | None  # "12.4"
    nvml_version: str | None
    cpu_count: int
    memory_total_mib: int
    gpus: tuple[GpuInfo, ...]
    network: tuple[NicInfo, ...] = ()
    storage: tuple[VolumeInfo, ...] = ()


@dataclass(frozen=True, slots=True)
class GpuProcess:
    """A process using a GPU, as the agent enforces against: its memory and the allocation it belongs to."""

    pid: int
    gpu_uuid: str  # the physical GPU
    gpu_index: int
    used_memory_mib: int | None  # None when NVML cannot say (no permission, WDDM)
    mig_uuid: str | None = None  # the MIG device it runs in; None = directly on the GPU
    allocation_id: str | None = None  # GPUPOOL_ALLOCATION_ID from its environment; None = unknown


class MigError(RuntimeError):
    """A MIG change the GPU refused; `reason` is a short CamelCase word for events (e.g. MigModeDisabled)."""

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(message)
        self.reason = reason


@runtime_checkable
class NvmlBackend(Protocol):
    def open(self) -> None: ...

    def close(self) -> None: ...

    def node_info(self) -> NodeInfo: ...

    def sample(self) -> list[GpuSample]: ...

    def node_sample(self) -> NodeSample:
        """CPU, memory, network and storage of the node now (rates since the previous call)."""
        ...

    # ---- what placement decided, applied (both backends) ----

    def mig_layout(self) -> dict[int, tuple[MigInstance, ...] | None]:
        """Each GPU's current MIG instances, read now; None for a GPU not in MIG mode."""
        ...

    def create_mig_instance(self, index: int, profile: str, start: int) -> MigInstance:
        """A GPU instance of `profile` at memory slot `start` with one compute instance spanning it."""
        ...

    def destroy_mig_instance(self, index: int, start: int) -> None:
        """Destroy the instance at `start` (its compute instances first); nothing there is not an error."""
        ...

    def set_mig_mode(self, index: int, enabled: bool) -> None:
        """Turn a GPU's MIG mode on or off (nothing to do when it already is); only on an empty GPU. MigError:
        `MigUnsupported`, `InUse` (processes or instances), `MigModeNeedsReset` (the driver applies it only after
        a GPU reset), or NVML's error."""
        ...

    def processes(self) -> list[GpuProcess]: ...

    def stop_process(self, pid: int, *, force: bool = False) -> None:
        """SIGTERM (SIGKILL with `force`); ProcessLookupError when it is gone."""
        ...


# --------------------------------------------------------------------------- health

# Xid classification, summarised from NVIDIA's Xid catalogue (docs.nvidia.com/deploy/xid-errors)
# and the A100/H100 GPU memory error management docs. "failed": the GPU needs a reset/drain
# (or is gone); "degraded": usable but should be drained at the next opportunity / watched.
# Everything else (13 graphics engine exception, 31 MMU fault, 43 stopped processing, 45
# preemptive cleanup, ...) is usually an application-side error: reported, health unaffected.
XID_FAILED: dict[int, str] = {
    48: "double_bit_ecc_error",
    62: "internal_microcontroller_halt",
    64: "row_remap_or_page_retirement_failure",
    74: "nvlink_error",
    79: "gpu_fallen_off_the_bus",
    95: "uncontained_ecc_error",
    119: "gsp_rpc_timeout",
    120: "gsp_error",
}
XID_DEGRADED: dict[int, str] = {
    63: "row_remap_or_page_retirement_pending",
    92: "high_single_bit_ecc_rate",
    94: "contained_ecc_error",
}
XID_INFO: dict[int, str] = {
    13: "graphics_engine_exception",
    31: "gpu_memory_page_fault",
    43: "gpu_stopped_processing",
    45: "preemptive_cleanup",
}

# Corrected (single-bit) ECC errors per minute above which a GPU is considered degraded.
SBE_STORM_RATE_PER_MIN = 10.0
THERMAL_THROTTLE_REASONS = frozenset({"hw_thermal_slowdown", "sw_thermal_slowdown"})


def classify_xid(xid: int) -> Health:
    """Health impact of a single Xid (``healthy`` for informational/app-level Xids)."""
    if xid in XID_FAILED:
        return FAILED
    if xid in XID_DEGRADED:
        return DEGRADED
    return HEALTHY


def xid_name(xid: int) -> str:
    return XID_FAILED.get(xid) or XID_DEGRADED.get(xid) or XID_INFO.get(xid) or "unknown"


def worst_health(*states: Health) -> Health:
    return max(states, key=_SEVERITY_RANK.__getitem__, default=HEALTHY)


def derive_health(
    *,
    xid_events: Iterable[int] = (),
    ecc_volatile_dbe: int = 0,
    retired_pages_pending: bool = False,
    temperature_c: float | None = None,
    slowdown_temp_c: float | None = None,
    throttle_reasons: Iterable[str] = (),
    sbe_rate_per_min: float | None = None,
    row_remap_failed: bool = False,
    gpu_lost: bool = False,
) -> tuple[Health, tuple[str, ...]]:
    """Apply the health rules and return ``(health, reasons)``.

    ``xid_events`` should be the *active* Xids: new ones plus any the backend latches
    (a GPU that fell off the bus stays failed after the sample that reported Xid 79).

    Rules (worst wins):
      failed   : GPU lost / not answering NVML; any Xid in XID_FAILED; volatile DBE > 0;
                 row-remapping failure.
      degraded : any Xid in XID_DEGRADED; retired pages / row remaps pending (reset needed);
                 temperature >= the GPU's slowdown threshold; HW/SW thermal slowdown
                 throttling; single-bit ECC rate >= SBE_STORM_RATE_PER_MIN.
      healthy  : otherwise (informational Xids such as 13 are reported but do not count).
    """
    health: Health = HEALTHY
    reasons: list[str] = []

    def add(state: Health, reason: str) -> None:
        nonlocal health
        health = worst_health(health, state)
        if reason not in reasons:
            reasons.append(reason)

    if gpu_lost:
        add(FAILED, "gpu_lost")
    for xid in sorted(set(xid_events)):
        impact = classify_xid(xid)
        if impact != HEALTHY:
            add(impact, f"xid{xid}:{xid_name(xid)}")
    if ecc_volatile_dbe > 0:
        add(FAILED, f"ecc_dbe:{ecc_volatile_dbe}")
    if row_remap_failed:
        add(FAILED, "row_remap_failed")
    if retired_pages_pending:
        add(DEGRADED, "retired_pages_pending")
    if temperature_c is not None and slowdown_temp_c is not None and temperature_c >= slowdown_temp_c:
        add(DEGRADED, f"temperature_at_slowdown:{temperature_c:.0f}C>={slowdown_temp_c:.0f}C")
    for reason in sorted(THERMAL_THROTTLE_REASONS.intersection(throttle_reasons)):
        add(DEGRADED, f"throttle:{reason}")
    if sbe_rate_per_min is not None and sbe_rate_per_min >= SBE_STORM_RATE_PER_MIN:
        add(DEGRADED, f"sbe_storm:{sbe_rate_per_min:.0f}/min")
    return health, tuple(reasons)


class SbeRateTracker:
    """Turns a monotonically increasing volatile SBE counter into errors/minute.

    The rate is smoothed over a sliding window so a single burst between two closely
    spaced samples does not flap health.
    """

    def __init__(self, window_s: float = 60.0) -> None:
        self._window_s = window_s
        self._points: list[tuple[float, int]] = []

    def update(self, timestamp: float, sbe_count: int) -> float | None:
        if self._points and sbe_count < self._points[-1][1]:
            self._points.clear()  # counter reset (GPU reset / driver reload)
        self._points.append((timestamp, sbe_count))
        while len(self._points) > 2 and timestamp - self._points[1][0] >= self._window_s:
            self._points.pop(0)
        t0, c0 = self._points[0]
        if timestamp - t0 <= 0:
            return None
        return (sbe_count - c0) * 60.0 / (timestamp - t0)

    def reset(self) -> None:
        self._points.clear()
