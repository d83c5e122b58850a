"""The real GPU's readings beyond the scheduling telemetry: the rest of dcgm-exporter's default fields that NVML has.

Each read is guarded like the backend's other optional queries: a GPU, driver or binding without it leaves that
field None (no series), never a failed sample. Not read here, so absent on the real backend: the profiling ratios
(`DCGM_FI_PROF_GR_ENGINE_ACTIVE`, `_PIPE_TENSOR_ACTIVE`, `_DRAM_ACTIVE`), which come from DCGM's profiling module or
NVML's GPM API (Hopper and newer, a pair of GPM samples per reading: not a single guarded call), and the vGPU
license status (a vGPU guest's, not a bare-metal GPU's).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from services.agent.nvml_types import GpuExtraReadings

_MIB = 1024 * 1024
_ALL_LINKS = 0xFFFFFFFF  # a field value's scopeId: NVLink throughput summed over every link
# nvmlFieldValue_t.valueType → the member of its value union
_VALUE_MEMBER = {0: "dVal", 1: "uiVal", 2: "ulVal", 3: "ullVal", 4: "sllVal", 5: "siVal", 6: "usVal"}

Guard = Callable[..., Any]


def field_value(fv: Any) -> float | int | None:
    """One entry of nvmlDeviceGetFieldValues: its value, or None when NVML returned an error for it."""
    if fv.nvmlReturn != 0:  # NVML_SUCCESS
        return None
    member = _VALUE_MEMBER.get(fv.valueType)
    return None if member is None else getattr(fv.value, member, None)


def read_extra(nvml: Any, guard: Guard, const: Callable[[str, int], int], h: Any,
               remap: Any) -> GpuExtraReadings:
    """The GPU `h`'s extra readings; `remap` is the nvmlDeviceGetRemappedRows answer already read for health
    ((correctable, uncorrectable, pending, failure) or None)."""
    mem_clock = guard("nvmlDeviceGetClockInfo", h, const("NVML_CLOCK_MEM", 2))
    energy = guard("nvmlDeviceGetTotalEnergyConsumption", h)  # mJ since the driver loaded
    replays = guard("nvmlDeviceGetPcieReplayCounter", h)
    encoder = guard("nvmlDeviceGetEncoderUtilization", h)  # [utilisation %, sampling period µs]
    decoder = guard("nvmlDeviceGetDecoderUtilization", h)
    tx_kib = guard("nvmlDeviceGetPcieThroughput", h, const("NVML_PCIE_UTIL_TX_BYTES", 0))  # KB/s over 20 ms
    rx_kib = guard("nvmlDeviceGetPcieThroughput", h, const("NVML_PCIE_UTIL_RX_BYTES", 1))
    mem = _memory_v2(nvml, guard, h)
    memory_temp, nvlink_tx, nvlink_rx = _field_values(guard, const, h)
    return GpuExtraReadings(
        memory_clock_mhz=int(mem_clock) if mem_clock is not None else None,
        memory_temperature_c=float(memory_temp) if memory_temp else None,  # 0: no sensor (GDDR boards)
        energy_mj=int(energy) if energy is not None else None,
        pcie_replay_count=int(replays) if replays is not None else None,
        encoder_util_pct=float(encoder[0]) if encoder else None,
        decoder_util_pct=float(decoder[0]) if decoder else None,
        fb_used_mib=int(mem.used) // _MIB if mem is not None else None,
        fb_free_mib=int(mem.free) // _MIB if mem is not None else None,
        fb_reserved_mib=int(mem.reserved) // _MIB if mem is not None else None,
        nvlink_data_kib=int(nvlink_tx + nvlink_rx) if nvlink_tx is not None and nvlink_rx is not None else None,
        correctable_remapped_rows=int(remap[0]) if remap else None,
        uncorrectable_remapped_rows=int(remap[1]) if remap else None,
        row_remap_failure=bool(remap[3]) if remap else None,
        pcie_tx_bytes_per_s=float(tx_kib) * 1024 if tx_kib is not None else None,
        pcie_rx_bytes_per_s=float(rx_kib) * 1024 if rx_kib is not None else None,
    )


def _memory_v2(nvml: Any, guard: Guard, h: Any) -> Any:
    """NVML's v2 memory info (used excludes the driver's reserved memory, which it reports apart); None when the
    binding or driver lacks it."""
    version = getattr(nvml, "nvmlMemory_v2", None)
    if not isinstance(version, int):
        return None
    try:
        mem = guard("nvmlDeviceGetMemoryInfo", h, version)
    except TypeError:  # a binding whose nvmlDeviceGetMemoryInfo takes no version
        return None
    return mem if all(hasattr(mem, a) for a in ("used", "free", "reserved")) else None


def _field_values(guard: Guard, const: Callable[[str, int], int], h: Any) -> tuple[Any, Any, Any]:
    """(memory temperature °C, NVLink data sent KiB, received KiB, both over all links), None each where the GPU has
    no such field (the NVLink ones on a PCIe card)."""
    ids = [const("NVML_FI_DEV_MEMORY_TEMP", 82),
           (const("NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX", 138), _ALL_LINKS),
           (const("NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_RX", 139), _ALL_LINKS)]
    values = guard("nvmlDeviceGetFieldValues", h, ids)
    if values is None or len(values) != len(ids):
        return None, None, None
    temp, tx, rx = (field_value(v) for v in values)
    return temp, tx, rx
