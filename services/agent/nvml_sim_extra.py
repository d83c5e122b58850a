"""The simulated GPU's readings beyond the scheduling telemetry (dcgm-exporter's other default fields), derived from
the same simulated load: the graphics-engine and tensor-pipe ratios follow utilisation, DRAM activity the memory
utilisation, PCIe traffic the load; the energy counter integrates the simulated power, NVLink traffic accumulates with
the load on NVLink parts; the memory clock is the model's, HBM's temperature follows the GPU's. Retries, remapped
rows, encoder/decoder use and the vGPU license status stay 0 (a bare-metal compute GPU).

Deterministic like the rest of the simulator, and it draws nothing from the GPU's random stream (so adding it did
not move any other simulated value): its jitter is a hash of (seed, GPU, time window).
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass

from services.agent.nvml_types import GpuExtraReadings


@dataclass(frozen=True, slots=True)
class ModelExtras:
    memory_clock_mhz: int
    hbm: bool  # HBM reports its temperature; GDDR boards do not
    pcie_bytes_per_s: float  # the slot's usable bandwidth, one direction
    nvlink_bytes_per_s: float  # per direction, all links; 0 for a PCIe card
    reserved_mib: int  # framebuffer the driver keeps (NVML v2 "reserved")


MODEL_EXTRAS: dict[str, ModelExtras] = {
    "H100-80GB": ModelExtras(2619, True, 63e9, 450e9, 527),
    "H200-141GB": ModelExtras(3201, True, 63e9, 450e9, 591),
    "A100-80GB": ModelExtras(1593, True, 31.5e9, 300e9, 565),
    "A100-40GB": ModelExtras(1215, True, 31.5e9, 300e9, 437),
    "L40S": ModelExtras(9001, False, 31.5e9, 0.0, 593),
    "L4": ModelExtras(6251, False, 31.5e9, 0.0, 399),
    "T4": ModelExtras(5000, False, 15.75e9, 0.0, 255),
}
_DEFAULT = ModelExtras(1500, False, 15.75e9, 0.0, 256)
_UPTIME_MAX_S = 30 * 86400.0  # a simulated GPU has been up for up to 30 days when the agent starts


def _unit(*parts: object) -> float:
    digest = hashlib.blake2b("|".join(map(str, parts)).encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big") / 2**64


def boot_energy_mj(seed: int, uuid: str, idle_w: float) -> float:
    """The energy counter when the simulation starts: some days of mostly idle running since the driver loaded."""
    return _unit(seed, uuid, "uptime") * _UPTIME_MAX_S * idle_w * 1000.0


@dataclass(slots=True)
class ExtraState:
    """What accumulates per simulated GPU: the energy and NVLink counters."""

    energy_mj: float
    nvlink_kib: float = 0.0


def extra_readings(state: ExtraState, *, model: str, seed: int, uuid: str, now: float, dt: float, util_pct: float,
                   mem_util_pct: float, power_w: float, temperature_c: float, memory_total_mib: int,
                   memory_used_mib: int, mig: bool, lost: bool) -> GpuExtraReadings:
    """One sample's readings; advances the counters by `dt` seconds at this sample's power and load."""
    m = MODEL_EXTRAS.get(model, _DEFAULT)
    load = util_pct / 100.0
    state.energy_mj += power_w * dt * 1000.0
    state.nvlink_kib += 2 * m.nvlink_bytes_per_s * 0.25 * load * dt / 1024.0  # collectives: a quarter of the fabric
    if lost:  # off the bus: nothing readable, the counters stay where they were
        return GpuExtraReadings()
    jitter = _unit(seed, uuid, "pcie", int(now))
    rx = m.pcie_bytes_per_s * (0.001 + 0.08 * load) * (0.8 + 0.4 * jitter)  # input batches, host→device
    tensor_share = 0.5 + 0.2 * _unit(seed, uuid, "tensor", int(now // 10))  # the rest: elementwise, comms, idle
    reserved = min(m.reserved_mib, memory_total_mib)
    return GpuExtraReadings(
        memory_clock_mhz=m.memory_clock_mhz,
        memory_temperature_c=round(temperature_c + 2.0 + 6.0 * mem_util_pct / 100.0, 1) if m.hbm else None,
        energy_mj=int(state.energy_mj),
        pcie_replay_count=0,
        encoder_util_pct=0.0,
        decoder_util_pct=0.0,
        fb_free_mib=max(0, memory_total_mib - memory_used_mib - reserved),
        fb_reserved_mib=reserved,
        nvlink_data_kib=int(state.nvlink_kib),
        vgpu_license_status=0,
        correctable_remapped_rows=0,
        uncorrectable_remapped_rows=0,
        row_remap_failure=False,
        # MIG: NVML has no whole-GPU utilisation, so neither has the simulation ratios for the whole GPU
        gr_engine_active=None if mig else round(load, 4),
        tensor_active=None if mig else round(load * tensor_share, 4),
        dram_active=None if mig else round(mem_util_pct / 100.0, 4),
        pcie_tx_bytes_per_s=round(rx * 0.4),
        pcie_rx_bytes_per_s=round(rx),
    )
