"""Fixtures for the agent's NVML backends: a controllable clock and a tiny fake pynvml.

The fake reuses pynvml's real exception classes and constants (importing pynvml needs no
GPU; only nvmlInit loads the driver library), so RealNvml's error guarding is exercised
against the exact exception hierarchy it meets on a real machine.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any

import pynvml
import pytest


class FakeClock:
    def __init__(self, start: float = 1_000.0) -> None:
        self.now = start

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture
def clock_factory():
    return FakeClock


@dataclass
class FakeGpu:
    uuid: str
    name: str = "NVIDIA H100 80GB HBM3"
    bus_id: str = "00000000:18:00.0"
    memory_total_mib: int = 81559
    memory_used_mib: int = 1024
    util_gpu: int = 50
    util_memory: int = 20
    temperature: int = 45
    power_mw: int = 300_000
    sm_clock: int = 1980
    mem_clock: int = 2619
    memory_reserved_mib: int = 527
    energy_mj: int = 123_456_789
    memory_temp: int = 52  # 0: no sensor (GDDR)
    nvlink_kib: tuple[int, int] | None = None  # (tx, rx) summed over links; None: no NVLink (a per-field error)
    sbe: int = 0
    dbe: int = 0
    numa: int | None = 0
    serial: str = "1650000000001"
    nvlink_remote: dict[int, str] = field(default_factory=dict)  # link -> remote bus id
    nvlink_remote_type: dict[int, int] = field(default_factory=dict)
    mig_enabled: bool = False
    mig: list[dict[str, Any]] = field(default_factory=list)
    pids: tuple[int, ...] = (4242,)
    proc_mem_mib: dict[int, int] = field(default_factory=dict)  # pid → used MiB (absent: NVML cannot say)
    throttle_mask: int = 0
    not_supported: set[str] = field(default_factory=set)  # function names raising NotSupported
    lost: bool = False


class FakeNvml(SimpleNamespace):
    """Just enough of pynvml's surface for RealNvml; handles are GPU indices."""

    def __init__(self, gpus: list[FakeGpu]) -> None:
        super().__init__()
        for name in dir(pynvml):
            if name.startswith(("NVMLError", "NVML_", "nvmlEventType", "nvmlClocks")):
                setattr(self, name, getattr(pynvml, name))
        self.NVMLLibraryMismatchError = pynvml.NVMLLibraryMismatchError
        self.nvmlMemory_v2 = pynvml.nvmlMemory_v2
        self.gpus = gpus
        self.events: list[tuple[int, int]] = []  # (gpu index, xid)
        self.initialised = False
        self.init_error: BaseException | None = None
        self.registered: list[int] = []
        self.calls: list[str] = []
        self.c_nvmlGpuInstancePlacement_t = pynvml.c_nvmlGpuInstancePlacement_t
        self.mig_ops: list[tuple] = []  # what was asked of the MIG API, in order
        self.fail_ci_create: BaseException | None = None

    # ---- helpers
    def _gpu(self, fn: str, handle: Any) -> FakeGpu:
        self.calls.append(fn)
        gpu = self.gpus[handle] if isinstance(handle, int) else handle["parent_gpu"]
        if gpu.lost:
            raise pynvml.NVMLError_GpuIsLost()
        if fn in gpu.not_supported:
            raise pynvml.NVMLError_NotSupported()
        return gpu

    # ---- system
    def nvmlInit(self) -> None:
        if self.init_error is not None:
            raise self.init_error
        self.initialised = True

    def nvmlShutdown(self) -> None:
        self.initialised = False

    def nvmlSystemGetDriverVersion(self) -> str:
        return "550.90.07"

    def nvmlSystemGetCudaDriverVersion(self) -> int:
        return 12040

    def nvmlSystemGetNVMLVersion(self) -> str:
        return "12.550.90.07"

    def nvmlDeviceGetCount(self) -> int:
        return len(self.gpus)

    def nvmlDeviceGetHandleByIndex(self, index: int) -> int:
        return index

    # ---- inventory
    def nvmlDeviceGetUUID(self, h: Any) -> str:
        if isinstance(h, dict):
            return h["uuid"]
        return self._gpu("nvmlDeviceGetUUID", h).uuid

    def nvmlDeviceGetName(self, h: int) -> str:
        return self._gpu("nvmlDeviceGetName", h).name

    def nvmlDeviceGetMemoryInfo(self, h: int, version: int | None = None) -> Any:
        g = self._gpu("nvmlDeviceGetMemoryInfo", h)
        mib = 1024 * 1024
        if version is None:  # v1: used includes what the driver reserves
            return SimpleNamespace(total=g.memory_total_mib * mib, used=g.memory_used_mib * mib,
                                   free=(g.memory_total_mib - g.memory_used_mib) * mib)
        assert version == pynvml.nvmlMemory_v2
        used = g.memory_used_mib - g.memory_reserved_mib
        return SimpleNamespace(version=version, total=g.memory_total_mib * mib, reserved=g.memory_reserved_mib * mib,
                               used=used * mib, free=(g.memory_total_mib - g.memory_used_mib) * mib)

    def nvmlDeviceGetPciInfo(self, h: int) -> Any:
        g = self._gpu("nvmlDeviceGetPciInfo", h)
        return SimpleNamespace(busId=g.bus_id.encode(), busIdLegacy=g.bus_id[4:].encode())

    def nvmlDeviceGetSerial(self, h: int) -> str:
        return self._gpu("nvmlDeviceGetSerial", h).serial

    def nvmlDeviceGetNumaNodeId(self, h: int) -> int:
        g = self._gpu("nvmlDeviceGetNumaNodeId", h)
        if g.numa is None:
            raise pynvml.NVMLError_NotSupported()
        return g.numa

    def nvmlDeviceGetCudaComputeCapability(self, h: int) -> tuple[int, int]:
        self._gpu("nvmlDeviceGetCudaComputeCapability", h)
        return (9, 0)

    def nvmlDeviceGetEnforcedPowerLimit(self, h: int) -> int:
        self._gpu("nvmlDeviceGetEnforcedPowerLimit", h)
        return 700_000

    def nvmlDeviceGetTemperatureThreshold(self, h: int, threshold: int) -> int:
        self._gpu("nvmlDeviceGetTemperatureThreshold", h)
        assert threshold == pynvml.NVML_TEMPERATURE_THRESHOLD_SLOWDOWN
        return 87

    def nvmlDeviceGetNvLinkState(self, h: int, link: int) -> int:
        g = self._gpu("nvmlDeviceGetNvLinkState", h)
        if not g.nvlink_remote:
            raise pynvml.NVMLError_NotSupported()
        if link >= 18:
            raise pynvml.NVMLError_InvalidArgument()
        return 1 if link in g.nvlink_remote else 0

    def nvmlDeviceGetNvLinkRemoteDeviceType(self, h: int, link: int) -> int:
        g = self._gpu("nvmlDeviceGetNvLinkRemoteDeviceType", h)
        return g.nvlink_remote_type.get(link, pynvml.NVML_NVLINK_DEVICE_TYPE_GPU)

    def nvmlDeviceGetNvLinkRemotePciInfo(self, h: int, link: int) -> Any:
        g = self._gpu("nvmlDeviceGetNvLinkRemotePciInfo", h)
        return SimpleNamespace(busId=g.nvlink_remote[link].encode())

    # ---- MIG
    def nvmlDeviceGetMigMode(self, h: int) -> list[int]:
        g = self._gpu("nvmlDeviceGetMigMode", h)
        mode = pynvml.NVML_DEVICE_MIG_ENABLE if g.mig_enabled else pynvml.NVML_DEVICE_MIG_DISABLE
        return [mode, mode]

    def nvmlDeviceGetMaxMigDeviceCount(self, h: int) -> int:
        self._gpu("nvmlDeviceGetMaxMigDeviceCount", h)
        return 7

    # An H100-80GB's GPU-instance profiles: enum → (profile id, compute slices, memory MB, name, allowed starts,
    # memory slots), as `nvidia-smi mig -lgip` / `-lgipp` list them.
    GI_PROFILES = {
        pynvml.NVML_GPU_INSTANCE_PROFILE_1_SLICE: (19, 1, 9856, b"MIG 1g.10gb", range(0, 7), 1),
        pynvml.NVML_GPU_INSTANCE_PROFILE_1_SLICE_REV2: (15, 1, 19968, b"MIG 1g.20gb", range(0, 8, 2), 2),
        pynvml.NVML_GPU_INSTANCE_PROFILE_2_SLICE: (14, 2, 19968, b"MIG 2g.20gb", range(0, 6, 2), 2),
        pynvml.NVML_GPU_INSTANCE_PROFILE_3_SLICE: (9, 3, 40192, b"MIG 3g.40gb", (0, 4), 4),
        pynvml.NVML_GPU_INSTANCE_PROFILE_4_SLICE: (5, 4, 40192, b"MIG 4g.40gb", (0,), 4),
        pynvml.NVML_GPU_INSTANCE_PROFILE_7_SLICE: (0, 7, 80384, b"MIG 7g.80gb", (0,), 8),
    }

    def _gi_row(self, profile_id: int) -> tuple:
        return next(r for r in self.GI_PROFILES.values() if r[0] == profile_id)

    def nvmlDeviceGetMigDeviceHandleByIndex(self, h: int, i: int) -> dict[str, Any]:
        g = self._gpu("nvmlDeviceGetMigDeviceHandleByIndex", h)
        devices = [m for m in g.mig if m.get("ci", True)]  # a MIG device is a compute instance
        if i >= len(devices):
            raise pynvml.NVMLError_NotFound()
        return {**devices[i], "parent_gpu": g}

    def nvmlDeviceGetGpuInstanceId(self, mig: dict[str, Any]) -> int:
        return mig["gi_id"]

    def nvmlDeviceGetComputeInstanceId(self, mig: dict[str, Any]) -> int:
        return 0

    def nvmlDeviceGetGpuInstanceById(self, h: int, gi_id: int) -> Any:
        g = self._gpu("nvmlDeviceGetGpuInstanceById", h)
        gi = next(m for m in g.mig if m["gi_id"] == gi_id)
        return {**gi, "parent_gpu": g}

    def nvmlGpuInstanceGetInfo(self, gi: dict[str, Any]) -> Any:
        return SimpleNamespace(
            profileId=gi["profile_id"], placement=SimpleNamespace(start=gi["start"], size=gi["size"])
        )

    def nvmlDeviceGetGpuInstanceProfileInfoById(self, h: int, profile_id: int) -> Any:
        return SimpleNamespace(name=self._gi_row(profile_id)[3])

    def nvmlDeviceGetGpuInstanceProfileInfo(self, h: int, profile: int) -> Any:
        self._gpu("nvmlDeviceGetGpuInstanceProfileInfo", h)
        if profile not in self.GI_PROFILES:
            raise pynvml.NVMLError_NotSupported()
        pid, slices, mem, name, _, _ = self.GI_PROFILES[profile]
        return SimpleNamespace(id=pid, sliceCount=slices, memorySizeMB=mem, name=name)

    def nvmlDeviceGetGpuInstancePossiblePlacements(self, h: int, profile_id: int, array: Any, count: Any) -> int:
        self._gpu("nvmlDeviceGetGpuInstancePossiblePlacements", h)
        _, _, _, _, starts, size = self._gi_row(profile_id)
        n = count._obj  # a byref(c_uint): how many fit in `array`
        for i, start in enumerate(starts):
            array[i].start, array[i].size = start, size
        n.value = len(starts)
        return pynvml.NVML_SUCCESS

    def nvmlDeviceCreateGpuInstanceWithPlacement(self, h: int, profile_id: int, placement: Any) -> dict[str, Any]:
        g = self._gpu("nvmlDeviceCreateGpuInstanceWithPlacement", h)
        start, size = placement._obj.start, placement._obj.size  # passed by reference, as the C API wants
        self.mig_ops.append(("create_gi", h, profile_id, start, size))
        if not g.mig_enabled:
            raise pynvml.NVMLError_NotSupported()
        for m in g.mig:
            if m["start"] < start + size and start < m["start"] + m["size"]:
                raise pynvml.NVMLError_InsufficientResources()
        gi = {"uuid": f"MIG-{g.uuid}-{start}", "gi_id": max([m["gi_id"] for m in g.mig], default=0) + 1,
              "profile_id": profile_id, "start": start, "size": size, "ci": False}
        g.mig.append(gi)
        return {**gi, "parent_gpu": g}

    def nvmlGpuInstanceGetComputeInstanceProfileInfo(self, gi: dict[str, Any], profile: int, eng: int) -> Any:
        self.mig_ops.append(("ci_profile", gi["gi_id"], profile, eng))
        return SimpleNamespace(id=100 + profile)

    def nvmlGpuInstanceCreateComputeInstance(self, gi: dict[str, Any], profile_id: int) -> dict[str, Any]:
        self.mig_ops.append(("create_ci", gi["gi_id"], profile_id))
        if self.fail_ci_create is not None:
            raise self.fail_ci_create
        entry = next(m for m in gi["parent_gpu"].mig if m["gi_id"] == gi["gi_id"])
        entry["ci"] = True
        return {"gi_id": gi["gi_id"], "parent_gpu": gi["parent_gpu"]}

    def nvmlGpuInstanceGetComputeInstanceById(self, gi: dict[str, Any], ci_id: int) -> dict[str, Any]:
        return {"gi_id": gi["gi_id"], "ci_id": ci_id, "parent_gpu": gi["parent_gpu"]}

    def nvmlComputeInstanceDestroy(self, ci: dict[str, Any]) -> int:
        self.mig_ops.append(("destroy_ci", ci["gi_id"]))
        entry = next(m for m in ci["parent_gpu"].mig if m["gi_id"] == ci["gi_id"])
        if entry.get("pids"):
            raise pynvml.NVMLError_InUse()
        entry["ci"] = False
        return pynvml.NVML_SUCCESS

    def nvmlGpuInstanceDestroy(self, gi: dict[str, Any]) -> int:
        self.mig_ops.append(("destroy_gi", gi["gi_id"]))
        g = gi["parent_gpu"]
        g.mig[:] = [m for m in g.mig if m["gi_id"] != gi["gi_id"]]
        return pynvml.NVML_SUCCESS

    # ---- telemetry
    def nvmlDeviceGetUtilizationRates(self, h: int) -> Any:
        g = self._gpu("nvmlDeviceGetUtilizationRates", h)
        return SimpleNamespace(gpu=g.util_gpu, memory=g.util_memory)

    def nvmlDeviceGetTemperatureV(self, h: int, sensor: int) -> int:
        return self._gpu("nvmlDeviceGetTemperatureV", h).temperature

    def nvmlDeviceGetTemperature(self, h: int, sensor: int) -> int:
        return self._gpu("nvmlDeviceGetTemperature", h).temperature

    def nvmlDeviceGetPowerUsage(self, h: int) -> int:
        return self._gpu("nvmlDeviceGetPowerUsage", h).power_mw

    def nvmlDeviceGetClockInfo(self, h: int, clock_type: int) -> int:
        g = self._gpu("nvmlDeviceGetClockInfo", h)
        assert clock_type in (pynvml.NVML_CLOCK_SM, pynvml.NVML_CLOCK_MEM)
        return g.sm_clock if clock_type == pynvml.NVML_CLOCK_SM else g.mem_clock

    def nvmlDeviceGetTotalEnergyConsumption(self, h: int) -> int:
        return self._gpu("nvmlDeviceGetTotalEnergyConsumption", h).energy_mj

    def nvmlDeviceGetPcieReplayCounter(self, h: int) -> int:
        self._gpu("nvmlDeviceGetPcieReplayCounter", h)
        return 3

    def nvmlDeviceGetEncoderUtilization(self, h: int) -> list[int]:
        self._gpu("nvmlDeviceGetEncoderUtilization", h)
        return [7, 167000]

    def nvmlDeviceGetDecoderUtilization(self, h: int) -> list[int]:
        self._gpu("nvmlDeviceGetDecoderUtilization", h)
        return [11, 167000]

    def nvmlDeviceGetPcieThroughput(self, h: int, counter: int) -> int:
        self._gpu("nvmlDeviceGetPcieThroughput", h)
        return {pynvml.NVML_PCIE_UTIL_TX_BYTES: 2000, pynvml.NVML_PCIE_UTIL_RX_BYTES: 5000}[counter]  # KB/s

    def nvmlDeviceGetFieldValues(self, h: int, field_ids: list[Any]) -> list[Any]:
        """pynvml's shape: one nvmlFieldValue_t per id, each with its own nvmlReturn (an id is an int or
        (id, scopeId))."""
        g = self._gpu("nvmlDeviceGetFieldValues", h)
        out = []
        for fid in field_ids:
            fid, scope = fid if isinstance(fid, tuple) else (fid, 0)
            v = pynvml.c_nvmlFieldValue_t()
            v.fieldId, v.scopeId, v.nvmlReturn = fid, scope, pynvml.NVML_ERROR_NOT_SUPPORTED
            if fid == pynvml.NVML_FI_DEV_MEMORY_TEMP:
                v.valueType, v.value.uiVal, v.nvmlReturn = pynvml.NVML_VALUE_TYPE_UNSIGNED_INT, g.memory_temp, 0
            elif g.nvlink_kib is not None and scope == 0xFFFFFFFF and fid in (
                    pynvml.NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX, pynvml.NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_RX):
                kib = g.nvlink_kib[0 if fid == pynvml.NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX else 1]
                v.valueType, v.value.ullVal, v.nvmlReturn = pynvml.NVML_VALUE_TYPE_UNSIGNED_LONG_LONG, kib, 0
            out.append(v)
        return out

    def nvmlDeviceGetTotalEccErrors(self, h: int, error_type: int, counter: int) -> int:
        g = self._gpu("nvmlDeviceGetTotalEccErrors", h)
        return g.dbe if error_type == pynvml.NVML_MEMORY_ERROR_TYPE_UNCORRECTED else g.sbe

    def nvmlDeviceGetRetiredPagesPendingStatus(self, h: int) -> int:
        self._gpu("nvmlDeviceGetRetiredPagesPendingStatus", h)
        return pynvml.NVML_FEATURE_DISABLED

    def nvmlDeviceGetRemappedRows(self, h: int) -> tuple[int, int, int, int]:
        self._gpu("nvmlDeviceGetRemappedRows", h)
        return (2, 1, 0, 0)

    def nvmlDeviceGetCurrentClocksEventReasons(self, h: int) -> int:
        return self._gpu("nvmlDeviceGetCurrentClocksEventReasons", h).throttle_mask

    def nvmlDeviceGetComputeRunningProcesses(self, h: Any) -> list[Any]:
        g = self._gpu("nvmlDeviceGetComputeRunningProcesses", h)
        mib = 1024 * 1024
        if isinstance(h, dict):  # a MIG device: the processes in that instance
            return [SimpleNamespace(pid=p, usedGpuMemory=m * mib) for p, m in (h.get("pids") or {}).items()]
        in_mig = [(p, m) for inst in g.mig for p, m in (inst.get("pids") or {}).items()]
        return ([SimpleNamespace(pid=p, usedGpuMemory=g.proc_mem_mib[p] * mib if p in g.proc_mem_mib else None)
                 for p in g.pids] + [SimpleNamespace(pid=p, usedGpuMemory=None) for p, _ in in_mig])

    def nvmlDeviceGetGraphicsRunningProcesses(self, h: int) -> list[Any]:
        self._gpu("nvmlDeviceGetGraphicsRunningProcesses", h)
        return []

    # ---- events
    def nvmlEventSetCreate(self) -> str:
        return "event-set"

    def nvmlEventSetFree(self, es: str) -> None:
        pass

    def nvmlDeviceGetSupportedEventTypes(self, h: int) -> int:
        self._gpu("nvmlDeviceGetSupportedEventTypes", h)
        return pynvml.nvmlEventTypeXidCriticalError | pynvml.nvmlEventTypeDoubleBitEccError

    def nvmlDeviceRegisterEvents(self, h: int, types: int, es: str) -> None:
        assert types == pynvml.nvmlEventTypeXidCriticalError
        self.registered.append(h)

    def nvmlEventSetWait_v2(self, es: str, timeout_ms: int) -> Any:
        assert timeout_ms == 0, "sample() must never block on the event set"
        if not self.events:
            raise pynvml.NVMLError_Timeout()
        index, xid = self.events.pop(0)
        return SimpleNamespace(device=index, eventType=pynvml.nvmlEventTypeXidCriticalError, eventData=xid)


@pytest.fixture
def fake_nvml_factory():
    return FakeNvml


@pytest.fixture
def fake_gpu_factory():
    return FakeGpu
