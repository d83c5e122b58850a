"""Real NVML backend (nvidia-ml-py / ``pynvml``).

Every optional query is guarded: a GPU that lacks a feature (NVML "Not Supported",
"Function Not Found" on an older driver, "No Permission" in a container, a binding
that does not have the function at all) reports the field as missing instead of
crashing the agent. A GPU that stops answering ("GPU is lost") is reported as failed.

The pynvml module can be injected (``RealNvml(nvml=fake)``) so the pure logic is
testable without a GPU.
"""

from __future__ import annotations

import ctypes
import dataclasses
import math
import os
import signal
import socket
import time
from collections.abc import Callable
from typing import Any

from services.agent.gpu_names import canonical_model, normalize_pci_bus_id, throttle_reason_names
from services.agent.host import HostReader
from services.agent.nvml_real_extra import read_extra
from services.agent.nvml_types import (
    FAILED,
    XID_DEGRADED,
    XID_FAILED,
    GpuInfo,
    GpuProcess,
    GpuSample,
    MigError,
    MigInstance,
    NodeInfo,
    NodeSample,
    SbeRateTracker,
    derive_health,
    worst_health,
)

# Errors that mean "this GPU / driver / binding does not provide that value".
_MISSING_ERROR_NAMES = (
    "NVMLError_NotSupported",
    "NVMLError_FunctionNotFound",
    "NVMLError_NoPermission",
    "NVMLError_NotFound",
    "NVMLError_NoData",
    "NVMLError_InvalidArgument",
    "NVMLError_NotReady",
    "NVMLError_ArgumentVersionMismatch",
)

_XID_CRITICAL_EVENT = 0x0000000000000008  # nvmlEventTypeXidCriticalError
_MAX_EVENTS_PER_SAMPLE = 1024
_LATCHED_XIDS = frozenset(XID_FAILED) | frozenset(XID_DEGRADED)
_MIB = 1024 * 1024


# --------------------------------------------------------------------------- pure helpers


def _to_str(value: Any) -> str:
    if isinstance(value, bytes):
        return value.decode(errors="replace").rstrip("\x00")
    return str(value)


def _format_cuda_version(raw: int) -> str:
    return f"{raw // 1000}.{(raw % 1000) // 10}"


def _read_text_file(path: str) -> str:
    with open(path, encoding="ascii") as fh:
        return fh.read()


def _read_bytes_file(path: str) -> bytes:
    with open(path, "rb") as fh:
        return fh.read()


ALLOCATION_ENV = b"GPUPOOL_ALLOCATION_ID="

# GPU-instance compute slices → the compute-instance profile that spans the whole GPU instance.
_CI_PROFILE_FOR_SLICES = {1: "NVML_COMPUTE_INSTANCE_PROFILE_1_SLICE", 2: "NVML_COMPUTE_INSTANCE_PROFILE_2_SLICE",
                          3: "NVML_COMPUTE_INSTANCE_PROFILE_3_SLICE", 4: "NVML_COMPUTE_INSTANCE_PROFILE_4_SLICE",
                          6: "NVML_COMPUTE_INSTANCE_PROFILE_6_SLICE", 7: "NVML_COMPUTE_INSTANCE_PROFILE_7_SLICE",
                          8: "NVML_COMPUTE_INSTANCE_PROFILE_8_SLICE"}


def allocation_from_environ(raw: bytes) -> str | None:
    """GPUPOOL_ALLOCATION_ID from a /proc/<pid>/environ image (NUL-separated KEY=VALUE entries)."""
    for entry in raw.split(b"\0"):
        if entry.startswith(ALLOCATION_ENV):
            value = entry[len(ALLOCATION_ENV):].decode(errors="replace").strip()
            return value or None
    return None


def _host_memory_mib() -> int:
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") // _MIB
    except (ValueError, OSError, AttributeError):
        return 0


# --------------------------------------------------------------------------- backend


class RealNvml:
    """:class:`~services.agent.nvml_types.NvmlBackend` on top of pynvml."""

    def __init__(
        self,
        nvml: Any | None = None,
        *,
        clock: Callable[[], float] = time.time,
        hostname: str | None = None,
        read_file: Callable[[str], str] = _read_text_file,
        sysfs_root: str = "/sys",
        cpu_count: int | None = None,
        memory_total_mib: int | None = None,
        read_bytes: Callable[[str], bytes] = _read_bytes_file,
        proc_root: str = "/proc",
        kill: Callable[[int, int], None] = os.kill,
        host: HostReader | None = None,
        storage_paths: tuple[str, ...] = ("/",),
    ) -> None:
        if nvml is None:
            import pynvml

            nvml = pynvml
        self._nvml = nvml
        self._clock = clock
        self._hostname = hostname
        self._read_file = read_file
        self._sysfs_root = sysfs_root.rstrip("/")
        self._cpu_count = cpu_count
        self._memory_total_mib = memory_total_mib
        self._read_bytes = read_bytes
        self._proc_root = proc_root.rstrip("/")
        self._kill = kill
        self._missing = tuple(
            cls for n in _MISSING_ERROR_NAMES if isinstance(cls := getattr(nvml, n, None), type)
        ) + (AttributeError,)
        lib_mismatch = getattr(nvml, "NVMLLibraryMismatchError", None)
        if isinstance(lib_mismatch, type):
            self._missing += (lib_mismatch,)
        self._nvml_error: type[BaseException] = getattr(nvml, "NVMLError", Exception)
        self._gpu_lost_errors = tuple(
            cls
            for n in ("NVMLError_GpuIsLost", "NVMLError_ResetRequired")
            if isinstance(cls := getattr(nvml, n, None), type)
        )
        self._opened = False
        self._handles: list[Any] = []
        self._infos: list[GpuInfo] = []
        self._uuid_to_index: dict[str, int] = {}
        self._event_set: Any = None
        self._latched_xids: dict[int, set[int]] = {}
        self._sbe_rates: dict[int, SbeRateTracker] = {}
        self._node: NodeInfo | None = None
        self._host = host
        self._storage_paths = storage_paths

    # ---- lifecycle ---------------------------------------------------------------

    def open(self) -> None:
        if self._opened:
            return
        self._nvml.nvmlInit()  # let NVMLError propagate: caller decides (no NVML == no agent)
        self._opened = True
        try:
            count = self._nvml.nvmlDeviceGetCount()
            self._handles = [self._nvml.nvmlDeviceGetHandleByIndex(i) for i in range(count)]
            self._infos = self._read_gpu_infos()
            self._uuid_to_index = {g.uuid: g.index for g in self._infos}
            self._latched_xids = {g.index: set() for g in self._infos}
            self._sbe_rates = {g.index: SbeRateTracker() for g in self._infos}
            self._event_set = self._register_xid_events()
            if self._host is None:
                self._host = HostReader("/", self._storage_paths)
            self._host.sample()  # the first reading primes the CPU and network rates
            self._node = self._read_node_info()
        except BaseException:
            self.close()
            raise

    def close(self) -> None:
        if not self._opened:
            return
        if self._event_set is not None:
            self._guard("nvmlEventSetFree", self._event_set)
            self._event_set = None
        self._opened = False
        self._handles = []
        try:
            self._nvml.nvmlShutdown()
        except self._nvml_error:
            pass

    def __enter__(self) -> RealNvml:
        self.open()
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ---- NvmlBackend -----------------------------------------------------------

    def node_info(self) -> NodeInfo:
        self._require_open()
        assert self._node is not None
        return self._node

    def sample(self) -> list[GpuSample]:
        self._require_open()
        new_xids = self._drain_xid_events()
        now = self._clock()
        return [self._sample_gpu(info, new_xids.get(info.index, ()), now) for info in self._infos]

    def node_sample(self) -> NodeSample:
        self._require_open()
        assert self._host is not None
        return self._host.sample()

    # ---- applying placement's decisions ----------------------------------------------------------------------

    def mig_layout(self) -> dict[int, tuple[MigInstance, ...] | None]:
        """Read now (instances change under the agent's hands); a GPU NVML cannot read is left out."""
        self._require_open()
        out: dict[int, tuple[MigInstance, ...] | None] = {}
        for info in self._infos:
            try:
                enabled, instances = self._read_mig(self._handles[info.index])
            except self._nvml_error:
                continue
            out[info.index] = instances if enabled else None
        return out

    def create_mig_instance(self, index: int, profile: str, start: int) -> MigInstance:
        """nvmlDeviceCreateGpuInstanceWithPlacement at `start`, then one compute instance spanning it (rolled back
        if that fails). NVML's refusals come back as MigError with the error's name as reason."""
        self._require_open()
        nv = self._nvml
        handle = self._handles[index]
        try:
            mode = self._guard("nvmlDeviceGetMigMode", handle)
            if not mode or mode[0] != self._const("NVML_DEVICE_MIG_ENABLE", 1):
                raise MigError("MigModeDisabled", f"GPU {index} is not in MIG mode")
            prof = self._gi_profile(handle, profile)
            if prof is None:
                raise MigError("UnknownProfile", f"GPU {index} has no MIG profile {profile}")
            size = self._placements(handle, int(prof.id)).get(start)
            if size is None:
                raise MigError("InvalidPlacement", f"{profile} cannot be placed at memory slot {start}")
            placement = nv.c_nvmlGpuInstancePlacement_t()
            placement.start, placement.size = start, size
            gi = nv.nvmlDeviceCreateGpuInstanceWithPlacement(handle, int(prof.id), ctypes.byref(placement))
            try:
                slices = int(prof.sliceCount)
                ci_profile = nv.nvmlGpuInstanceGetComputeInstanceProfileInfo(
                    gi, self._const(_CI_PROFILE_FOR_SLICES.get(slices, ""), slices - 1),
                    self._const("NVML_COMPUTE_INSTANCE_ENGINE_PROFILE_SHARED", 0))
                nv.nvmlGpuInstanceCreateComputeInstance(gi, int(ci_profile.id))
            except BaseException:
                self._guard("nvmlGpuInstanceDestroy", gi)
                raise
        except self._nvml_error as exc:
            raise MigError(type(exc).__name__.removeprefix("NVMLError_"), str(exc)) from exc
        instances = self._refresh_mig(index)
        return next((m for m in instances if m.start == start),
                    MigInstance(profile=profile, start=start, size=size, uuid=""))

    def destroy_mig_instance(self, index: int, start: int) -> None:
        """Its compute instances first, then the GPU instance; NVML refuses (InUse) while processes run there."""
        self._require_open()
        nv = self._nvml
        handle = self._handles[index]
        try:
            gpu_instances: dict[int, Any] = {}
            compute: list[Any] = []
            for i in range(self._guard("nvmlDeviceGetMaxMigDeviceCount", handle, default=0) or 0):
                mig = self._guard("nvmlDeviceGetMigDeviceHandleByIndex", handle, i)
                if mig is None:
                    continue
                gi_id = int(nv.nvmlDeviceGetGpuInstanceId(mig))
                gi = gpu_instances.get(gi_id) or nv.nvmlDeviceGetGpuInstanceById(handle, gi_id)
                if int(nv.nvmlGpuInstanceGetInfo(gi).placement.start) != start:
                    continue
                gpu_instances[gi_id] = gi
                compute.append(nv.nvmlGpuInstanceGetComputeInstanceById(gi, nv.nvmlDeviceGetComputeInstanceId(mig)))
            for ci in compute:
                nv.nvmlComputeInstanceDestroy(ci)
            for gi in gpu_instances.values():
                nv.nvmlGpuInstanceDestroy(gi)
        except self._nvml_error as exc:
            raise MigError(type(exc).__name__.removeprefix("NVMLError_"), str(exc)) from exc
        self._refresh_mig(index)

    def processes(self) -> list[GpuProcess]:
        """Every process on every GPU with its memory (per MIG device on a GPU in MIG mode) and the allocation
        named by GPUPOOL_ALLOCATION_ID in its environment (/proc/<pid>/environ: the agent needs the host's pid
        namespace and the right to read it, i.e. root)."""
        self._require_open()
        out: list[GpuProcess] = []
        for info in self._infos:
            handle = self._handles[info.index]
            try:
                seen: dict[int, tuple[int | None, str | None]] = {}
                if self._mig_enabled(handle):
                    for i in range(self._guard("nvmlDeviceGetMaxMigDeviceCount", handle, default=0) or 0):
                        mig = self._guard("nvmlDeviceGetMigDeviceHandleByIndex", handle, i)
                        if mig is None:
                            continue
                        mig_uuid = _to_str(self._guard("nvmlDeviceGetUUID", mig, default=""))
                        for pid, mem in self._running(mig).items():
                            seen[pid] = (mem, mig_uuid or None)
                for pid, mem in self._running(handle).items():
                    seen.setdefault(pid, (mem, None))
            except self._nvml_error:
                continue  # a GPU that stopped answering has no processes we could judge
            out += [GpuProcess(pid=pid, gpu_uuid=info.uuid, gpu_index=info.index, used_memory_mib=mem,
                               mig_uuid=mig_uuid, allocation_id=self._allocation_of(pid))
                    for pid, (mem, mig_uuid) in sorted(seen.items())]
        return out

    def stop_process(self, pid: int, *, force: bool = False) -> None:
        if pid <= 1:
            raise ValueError(f"refusing to signal pid {pid}")
        self._kill(pid, signal.SIGKILL if force else signal.SIGTERM)

    def _mig_enabled(self, handle: Any) -> bool:
        mode = self._guard("nvmlDeviceGetMigMode", handle)
        return bool(mode) and mode[0] == self._const("NVML_DEVICE_MIG_ENABLE", 1)

    def _running(self, handle: Any) -> dict[int, int | None]:
        """pid → used GPU memory in MiB (None when NVML does not say) from the compute and graphics lists."""
        out: dict[int, int | None] = {}
        for fn in ("nvmlDeviceGetComputeRunningProcesses", "nvmlDeviceGetGraphicsRunningProcesses"):
            for proc in self._guard(fn, handle, default=None) or ():
                pid = int(getattr(proc, "pid", 0))
                used = getattr(proc, "usedGpuMemory", None)
                mib = int(used) // _MIB if isinstance(used, int) else None
                prev = out.get(pid)
                out[pid] = mib if prev is None else max(prev, mib or 0)
        return out

    def _allocation_of(self, pid: int) -> str | None:
        try:
            return allocation_from_environ(self._read_bytes(f"{self._proc_root}/{pid}/environ"))
        except OSError:
            return None  # gone, or not ours to read

    def set_mig_mode(self, index: int, enabled: bool) -> None:
        """nvmlDeviceSetMigMode on an empty GPU. Where the driver only applies it after a GPU reset (its pending
        activation status is not success), MigModeNeedsReset: an operator resets the GPU (`nvidia-smi -r -i N`)."""
        self._require_open()
        handle = self._handles[index]
        want = self._const("NVML_DEVICE_MIG_ENABLE", 1) if enabled else self._const("NVML_DEVICE_MIG_DISABLE", 0)
        try:
            mode = self._guard("nvmlDeviceGetMigMode", handle)
            if mode is None:
                raise MigError("MigUnsupported", f"GPU {index} reports no MIG mode")
            if mode[0] == want:
                return
            status = self._nvml.nvmlDeviceSetMigMode(handle, want)
        except self._nvml_error as exc:
            raise MigError(type(exc).__name__.removeprefix("NVMLError_"), str(exc)) from exc
        self._refresh_mig(index)
        if status not in (None, self._const("NVML_SUCCESS", 0)):
            raise MigError("MigModeNeedsReset", f"GPU {index}: MIG mode {'on' if enabled else 'off'} is pending "
                                                f"until the GPU is reset (activation status {status})")

    def _gi_profile(self, handle: Any, name: str) -> Any:
        """The GPU-instance profile info whose name is `name` (e.g. "3g.40gb")."""
        for profile_enum in range(self._const("NVML_GPU_INSTANCE_PROFILE_COUNT", 0)):
            info = self._guard("nvmlDeviceGetGpuInstanceProfileInfo", handle, profile_enum)
            if info is None:
                continue
            label = _mig_profile_name(info)
            if label is None and getattr(info, "memorySizeMB", None):
                label = f"{info.sliceCount}g.{math.ceil(int(info.memorySizeMB) / 1024)}gb"
            if label == name:
                return info
        return None

    def _placements(self, handle: Any, profile_id: int) -> dict[int, int]:
        """Allowed start slot → size for a GPU-instance profile (what `nvidia-smi mig -lgipp` prints)."""
        nv = self._nvml
        array = (nv.c_nvmlGpuInstancePlacement_t * 16)()
        count = ctypes.c_uint(16)
        nv.nvmlDeviceGetGpuInstancePossiblePlacements(handle, profile_id, array, ctypes.byref(count))
        return {int(array[i].start): int(array[i].size) for i in range(count.value)}

    def _refresh_mig(self, index: int) -> tuple[MigInstance, ...]:
        """Re-read one GPU's instances after a change, so node_info() (registration) shows the layout as it is."""
        enabled, instances = self._read_mig(self._handles[index])
        self._infos[index] = dataclasses.replace(self._infos[index], mig_mode=enabled, mig_instances=instances)
        if self._node is not None:
            self._node = dataclasses.replace(self._node, gpus=tuple(self._infos))
        return instances

    # ---- guarded calls -----------------------------------------------------------

    def _guard(self, fn: Callable[..., Any] | str, *args: Any, default: Any = None) -> Any:
        """Call an optional NVML query; "feature missing" errors -> ``default``."""
        try:
            if isinstance(fn, str):
                fn = getattr(self._nvml, fn)
            return fn(*args)
        except self._missing:
            return default

    def _const(self, name: str, default: int) -> int:
        value = getattr(self._nvml, name, default)
        return value if isinstance(value, int) else default

    def _require_open(self) -> None:
        if not self._opened:
            raise RuntimeError("RealNvml is not open; call open() first")

    # ---- static inventory ------------------------------------------------------------

    def _read_node_info(self) -> NodeInfo:
        cuda_raw = self._guard("nvmlSystemGetCudaDriverVersion_v2") or self._guard(
            "nvmlSystemGetCudaDriverVersion"
        )
        driver = self._guard("nvmlSystemGetDriverVersion")
        nvml_version = self._guard("nvmlSystemGetNVMLVersion")
        return NodeInfo(
            hostname=self._hostname or socket.gethostname(),
            driver_version=_to_str(driver) if driver is not None else None,
            cuda_driver_version=_format_cuda_version(cuda_raw) if isinstance(cuda_raw, int) else None,
            nvml_version=_to_str(nvml_version) if nvml_version is not None else None,
            cpu_count=self._cpu_count if self._cpu_count is not None else (os.cpu_count() or 0),
            memory_total_mib=(
                self._memory_total_mib if self._memory_total_mib is not None else _host_memory_mib()
            ),
            gpus=tuple(self._infos),
            network=self._host.nics() if self._host is not None else (),
            storage=self._host.volumes() if self._host is not None else (),
        )

    def _read_gpu_infos(self) -> list[GpuInfo]:
        nv = self._nvml
        raw: list[dict[str, Any]] = []
        for index, handle in enumerate(self._handles):
            name = _to_str(self._guard("nvmlDeviceGetName", handle, default="") or "unknown")
            mem = self._guard("nvmlDeviceGetMemoryInfo", handle)
            memory_total_mib = int(mem.total) // _MIB if mem is not None else 0
            pci = self._guard("nvmlDeviceGetPciInfo", handle)
            bus_id = ""
            if pci is not None:
                for attr in ("busId", "busIdLegacy"):
                    try:
                        bus_id = normalize_pci_bus_id(getattr(pci, attr))
                        break
                    except (AttributeError, ValueError):
                        continue
            serial = self._guard("nvmlDeviceGetSerial", handle)
            cc = self._guard("nvmlDeviceGetCudaComputeCapability", handle)
            limit_mw = self._guard("nvmlDeviceGetEnforcedPowerLimit", handle)
            if limit_mw is None:
                limit_mw = self._guard("nvmlDeviceGetPowerManagementLimit", handle)
            slowdown = self._guard(
                "nvmlDeviceGetTemperatureThreshold",
                handle,
                self._const("NVML_TEMPERATURE_THRESHOLD_SLOWDOWN", 1),
            )
            mig_mode, mig_instances = self._read_mig(handle)
            raw.append(
                dict(
                    uuid=_to_str(nv.nvmlDeviceGetUUID(handle)),
                    index=index,
                    name=name,
                    model=canonical_model(name, memory_total_mib or None),
                    memory_total_mib=memory_total_mib,
                    pci_bus_id=bus_id,
                    serial=_to_str(serial) if serial else None,
                    numa_node=self._read_numa(handle, bus_id),
                    mig_mode=mig_mode,
                    mig_instances=mig_instances,
                    compute_capability=f"{cc[0]}.{cc[1]}" if cc else None,
                    power_limit_w=limit_mw / 1000.0 if limit_mw else None,
                    slowdown_temp_c=float(slowdown) if slowdown else None,
                )
            )
        bus_to_index = {r["pci_bus_id"]: r["index"] for r in raw if r["pci_bus_id"]}
        peers = self._nvlink_peers(bus_to_index)
        return [GpuInfo(nvlink_peers=peers.get(r["index"], ()), **r) for r in raw]

    def _read_numa(self, handle: Any, bus_id: str) -> int | None:
        node = self._guard("nvmlDeviceGetNumaNodeId", handle)
        if isinstance(node, int) and node >= 0:
            return node
        if not bus_id:
            return None
        try:
            text = self._read_file(f"{self._sysfs_root}/bus/pci/devices/{bus_id}/numa_node")
            value = int(text.strip())
        except (OSError, ValueError):
            return None
        return value if value >= 0 else None  # -1 == no NUMA affinity

    def _nvlink_peers(self, bus_to_index: dict[str, int]) -> dict[int, tuple[int, ...]]:
        """Direct NVLink peers via remote PCI info; NVSwitch-attached GPUs peer each other."""
        max_links = self._const("NVML_NVLINK_MAX_LINKS", 18)
        switch_type = self._const("NVML_NVLINK_DEVICE_TYPE_SWITCH", 2)
        direct: dict[int, set[int]] = {}
        on_switch: set[int] = set()
        for index, handle in enumerate(self._handles):
            peers: set[int] = set()
            for link in range(max_links):
                state = self._guard("nvmlDeviceGetNvLinkState", handle, link)
                if state is None:
                    if link == 0:
                        break  # no NVLink on this GPU at all
                    continue
                if not state:
                    continue
                remote_type = self._guard("nvmlDeviceGetNvLinkRemoteDeviceType", handle, link)
                if remote_type == switch_type:
                    on_switch.add(index)
                    continue
                remote = self._guard("nvmlDeviceGetNvLinkRemotePciInfo", handle, link)
                if remote is None:
                    continue
                try:
                    remote_bus = normalize_pci_bus_id(remote.busId)
                except (AttributeError, ValueError):
                    continue
                peer = bus_to_index.get(remote_bus)
                if peer is None:
                    # Not a local GPU: on NVSwitch systems the far end is the switch.
                    if remote_type is None:
                        on_switch.add(index)
                    continue
                if peer != index:
                    peers.add(peer)
            direct[index] = peers
        result: dict[int, tuple[int, ...]] = {}
        for index in range(len(self._handles)):
            peers = set(direct.get(index, set()))
            if index in on_switch:
                peers |= on_switch - {index}
            result[index] = tuple(sorted(peers))
        return result

    def _read_mig(self, handle: Any) -> tuple[bool, tuple[MigInstance, ...]]:
        mode = self._guard("nvmlDeviceGetMigMode", handle)
        enabled = bool(mode) and mode[0] == self._const("NVML_DEVICE_MIG_ENABLE", 1)
        if not enabled:
            return False, ()
        max_count = self._guard("nvmlDeviceGetMaxMigDeviceCount", handle, default=0) or 0
        instances: list[MigInstance] = []
        for i in range(max_count):
            mig = self._guard("nvmlDeviceGetMigDeviceHandleByIndex", handle, i)
            if mig is None:
                continue  # slot not populated
            uuid = _to_str(self._guard("nvmlDeviceGetUUID", mig, default=""))
            profile, start, size = self._mig_profile(handle, mig)
            instances.append(MigInstance(profile=profile, start=start, size=size, uuid=uuid))
        instances.sort(key=lambda m: (m.start if m.start is not None else 1 << 30, m.uuid))
        return True, tuple(instances)

    def _mig_profile(self, parent: Any, mig: Any) -> tuple[str, int | None, int | None]:
        """(profile name, placement start, placement size) of a MIG device."""
        gi_id = self._guard("nvmlDeviceGetGpuInstanceId", mig)
        if gi_id is not None:
            gi = self._guard("nvmlDeviceGetGpuInstanceById", parent, gi_id)
            gi_info = self._guard("nvmlGpuInstanceGetInfo", gi) if gi is not None else None
            if gi_info is not None:
                prof = self._guard("nvmlDeviceGetGpuInstanceProfileInfoById", parent, gi_info.profileId)
                name = _mig_profile_name(prof) if prof is not None else None
                if name:
                    return name, int(gi_info.placement.start), int(gi_info.placement.size)
        # Unprivileged fallback: match the MIG device's attributes to a GPU-instance profile.
        attrs = self._guard("nvmlDeviceGetAttributes", mig)
        if attrs is None:
            return "unknown", None, None
        best: tuple[float, str] | None = None
        for profile_enum in range(self._const("NVML_GPU_INSTANCE_PROFILE_COUNT", 0)):
            prof = self._guard("nvmlDeviceGetGpuInstanceProfileInfo", parent, profile_enum)
            if prof is None or prof.sliceCount != attrs.gpuInstanceSliceCount:
                continue
            name = _mig_profile_name(prof)
            if name:
                delta = abs(int(prof.memorySizeMB) - int(attrs.memorySizeMB))
                if best is None or delta < best[0]:
                    best = (delta, name)
        if best is not None:
            return best[1], None, None
        gb = math.ceil(int(attrs.memorySizeMB) / 1024)
        return f"{attrs.gpuInstanceSliceCount}g.{gb}gb", None, None

    # ---- events ------------------------------------------------------------------

    def _register_xid_events(self) -> Any:
        nv = self._nvml
        event_set = self._guard("nvmlEventSetCreate")
        if event_set is None:
            return None
        xid_type = self._const("nvmlEventTypeXidCriticalError", _XID_CRITICAL_EVENT)
        registered = 0
        for handle in self._handles:
            supported = self._guard("nvmlDeviceGetSupportedEventTypes", handle)
            if supported is not None and not supported & xid_type:
                continue
            try:
                nv.nvmlDeviceRegisterEvents(handle, xid_type, event_set)
                registered += 1
            except self._missing:
                continue
        if not registered:
            self._guard("nvmlEventSetFree", event_set)
            return None
        return event_set

    def _drain_xid_events(self) -> dict[int, tuple[int, ...]]:
        """Non-blocking: everything queued since the last sample, grouped by GPU index."""
        if self._event_set is None:
            return {}
        nv = self._nvml
        wait = getattr(nv, "nvmlEventSetWait_v2", None) or nv.nvmlEventSetWait
        timeout_err = getattr(nv, "NVMLError_Timeout", None)
        xid_type = self._const("nvmlEventTypeXidCriticalError", _XID_CRITICAL_EVENT)
        events: dict[int, list[int]] = {}
        for _ in range(_MAX_EVENTS_PER_SAMPLE):
            try:
                data = wait(self._event_set, 0)
            except self._nvml_error as exc:
                if timeout_err is not None and isinstance(exc, timeout_err):
                    break
                if isinstance(exc, self._missing):
                    break
                raise
            if not int(data.eventType) & xid_type:
                continue
            index = self._event_device_index(data.device)
            if index is not None:
                events.setdefault(index, []).append(int(data.eventData))
        return {i: tuple(x) for i, x in events.items()}

    def _event_device_index(self, device: Any) -> int | None:
        uuid = self._guard("nvmlDeviceGetUUID", device)
        if uuid is not None:
            idx = self._uuid_to_index.get(_to_str(uuid))
            if idx is not None:
                return idx
            # MIG device handle -> parent GPU
            parent = self._guard("nvmlDeviceGetDeviceHandleFromMigDeviceHandle", device)
            if parent is not None:
                parent_uuid = self._guard("nvmlDeviceGetUUID", parent)
                if parent_uuid is not None:
                    return self._uuid_to_index.get(_to_str(parent_uuid))
        index = self._guard("nvmlDeviceGetIndex", device)
        return index if isinstance(index, int) and 0 <= index < len(self._handles) else None

    # ---- telemetry ---------------------------------------------------------------

    def _sample_gpu(self, info: GpuInfo, new_xids: tuple[int, ...], now: float) -> GpuSample:
        latched = self._latched_xids.setdefault(info.index, set())
        latched.update(x for x in new_xids if x in _LATCHED_XIDS)
        try:
            return self._read_sample(info, new_xids, latched, now)
        except self._nvml_error as exc:
            lost = isinstance(exc, self._gpu_lost_errors) if self._gpu_lost_errors else False
            health, reasons = derive_health(xid_events=latched, gpu_lost=lost)
            if not lost:
                health = worst_health(health, FAILED)
                reasons = (*reasons, f"nvml_error:{type(exc).__name__}")
            return GpuSample(
                uuid=info.uuid,
                index=info.index,
                timestamp=now,
                utilization_gpu_pct=None,
                utilization_memory_pct=None,
                memory_used_mib=None,
                memory_total_mib=info.memory_total_mib,
                temperature_c=None,
                power_w=None,
                sm_clock_mhz=None,
                ecc_volatile_sbe=0,
                ecc_volatile_dbe=0,
                retired_pages_pending=False,
                xid_events=new_xids,
                throttle_reasons=(),
                process_count=0,
                health=health,
                health_reasons=reasons,
            )

    def _read_sample(
        self, info: GpuInfo, new_xids: tuple[int, ...], latched: set[int], now: float
    ) -> GpuSample:
        h = self._handles[info.index]
        util = self._guard("nvmlDeviceGetUtilizationRates", h)  # Not Supported in MIG mode
        mem = self._guard("nvmlDeviceGetMemoryInfo", h)
        temp_sensor = self._const("NVML_TEMPERATURE_GPU", 0)
        temperature = self._guard("nvmlDeviceGetTemperatureV", h, temp_sensor)
        if temperature is None:
            temperature = self._guard("nvmlDeviceGetTemperature", h, temp_sensor)
        power_mw = self._guard("nvmlDeviceGetPowerUsage", h)
        sm_clock = self._guard("nvmlDeviceGetClockInfo", h, self._const("NVML_CLOCK_SM", 1))
        volatile = self._const("NVML_VOLATILE_ECC", 0)
        sbe = self._guard(
            "nvmlDeviceGetTotalEccErrors", h, self._const("NVML_MEMORY_ERROR_TYPE_CORRECTED", 0), volatile
        )
        dbe = self._guard(
            "nvmlDeviceGetTotalEccErrors", h, self._const("NVML_MEMORY_ERROR_TYPE_UNCORRECTED", 1), volatile
        )
        pages_pending = self._guard("nvmlDeviceGetRetiredPagesPendingStatus", h)
        remap = self._guard("nvmlDeviceGetRemappedRows", h)  # (corr, unc, pending, failure), Ampere+
        reasons_mask = self._guard("nvmlDeviceGetCurrentClocksEventReasons", h)
        if reasons_mask is None:
            reasons_mask = self._guard("nvmlDeviceGetCurrentClocksThrottleReasons", h)
        pids: set[int] = set()
        for fn in ("nvmlDeviceGetComputeRunningProcesses", "nvmlDeviceGetGraphicsRunningProcesses"):
            for proc in self._guard(fn, h, default=None) or ():
                pids.add(int(getattr(proc, "pid", 0)))

        enabled = self._const("NVML_FEATURE_ENABLED", 1)
        retired_pending = bool(pages_pending == enabled) or bool(remap and remap[2])
        throttle = throttle_reason_names(int(reasons_mask)) if reasons_mask is not None else ()
        sbe_count = int(sbe) if sbe is not None else 0
        dbe_count = int(dbe) if dbe is not None else 0
        sbe_rate = self._sbe_rates[info.index].update(now, sbe_count) if sbe is not None else None
        temperature_c = float(temperature) if temperature is not None else None
        health, health_reasons = derive_health(
            xid_events=latched,
            ecc_volatile_dbe=dbe_count,
            retired_pages_pending=retired_pending,
            temperature_c=temperature_c,
            slowdown_temp_c=info.slowdown_temp_c,
            throttle_reasons=throttle,
            sbe_rate_per_min=sbe_rate,
            row_remap_failed=bool(remap and remap[3]),
        )
        return GpuSample(
            uuid=info.uuid,
            index=info.index,
            timestamp=now,
            utilization_gpu_pct=float(util.gpu) if util is not None else None,
            utilization_memory_pct=float(util.memory) if util is not None else None,
            memory_used_mib=int(mem.used) // _MIB if mem is not None else None,
            memory_total_mib=int(mem.total) // _MIB if mem is not None else info.memory_total_mib,
            temperature_c=temperature_c,
            power_w=power_mw / 1000.0 if power_mw is not None else None,
            sm_clock_mhz=int(sm_clock) if sm_clock is not None else None,
            ecc_volatile_sbe=sbe_count,
            ecc_volatile_dbe=dbe_count,
            retired_pages_pending=retired_pending,
            xid_events=new_xids,
            throttle_reasons=throttle,
            process_count=len(pids),
            health=health,
            health_reasons=health_reasons,
            extra=read_extra(self._nvml, self._guard, self._const, h, remap),
        )


def _mig_profile_name(profile_info: Any) -> str | None:
    """GPU-instance profile info (v2 has a name like "MIG 1g.10gb") -> "1g.10gb"."""
    name = getattr(profile_info, "name", None)
    if not name:
        return None
    text = _to_str(name).strip()
    return text[4:] if text.upper().startswith("MIG ") else text
