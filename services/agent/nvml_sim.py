"""Simulated NVML backend: realistic GPU dynamics and fault injection, no GPU required.

Deterministic: the same ``seed``, the same ``clock`` readings and the same sequence of
calls give identical samples. Time only moves when ``clock()`` does; every ``sample()``
advances each GPU's state (memory ramp, first-order thermal model, SBE counters) by the
time elapsed since the previous sample.

Model, per GPU:
  utilization  from the workload kind ("idle", "training", "inference", "dev", None=free)
  memory       ramps toward the workload's footprint (~15 s to fill the card), frees faster
  power        idle_w + util * (tdp - idle_w) + noise, capped at the power limit
  temperature  T -> ambient + R_th * power with time constant TAU_S (exact exponential step)
  clocks       boost when busy, idle clock when free; lower under power cap, much lower
               when thermally throttled (temperature near/above the slowdown threshold)
"""

from __future__ import annotations

import hashlib
import math
import random
import uuid as uuidlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from libs.core import mig as migcat
from services.agent.nvml_sim_extra import ExtraState, boot_energy_mj, extra_readings
from services.agent.nvml_types import (
    XID_DEGRADED,
    XID_FAILED,
    GpuInfo,
    GpuProcess,
    GpuSample,
    MigError,
    MigInstance,
    NicInfo,
    NodeInfo,
    NodeSample,
    SbeRateTracker,
    VolumeInfo,
    derive_health,
)

WORKLOAD_KINDS = ("idle", "training", "inference", "dev")
FAULT_KINDS = ("xid79", "off_bus", "xid48", "dbe", "sbe_storm", "ecc_storm", "ecc_burst", "xid_storm", "thermal",
               "xid13", "reset", "rogue_process", "no_process", "memory_hog")
# What each fault means on the simulated GPU:
#   xid79 / off_bus     the GPU falls off the bus: Xid 79, then nothing readable, latched until a reset
#   xid48 / dbe         an uncorrectable (double-bit) ECC error with Xid 48; pages pending retirement
#   sbe_storm/ecc_storm correctable ECC errors climb at 30-90/min (Xid 92 once) until a reset
#   ecc_burst           one burst of `count` (default 50) correctable ECC errors, nothing after
#   xid_storm           a non-fatal Xid (`xid`, default 31) on every sample for `seconds` (default 30)
#   thermal / xid13     cooling failure / one application-level Xid 13
#   reset               a GPU reset: faults, latched Xids and volatile ECC counters cleared
#   rogue_process       a process starts on the GPU though no allocation holds it (an orphan)
#   no_process          the GPU's processes exit though its allocation stays (an allocation without process)
#   memory_hog          the GPU's share processes (fractions, MIG) grow to `factor` (default 1.5) times their limit


TAU_S = 40.0  # thermal time constant
AMBIENT_C = 28.0
_UUID_NAMESPACE = uuidlib.UUID("6f1c2b1e-8a53-4f3e-9d0a-5c1f7e2b9a41")


@dataclass(frozen=True, slots=True)
class GpuSpec:
    model: str
    name: str
    memory_total_mib: int
    tdp_w: float
    idle_w: float
    max_sm_clock_mhz: int
    idle_sm_clock_mhz: int
    compute_capability: str
    slowdown_temp_c: float
    thermal_resistance: float  # degC per W above ambient at steady state
    nvlink: bool  # SXM/NVSwitch part
    mig_profiles: dict[str, tuple[int, int]] = field(default_factory=dict)  # name -> (compute g, mem slices)


def _mig(mem_gb_per_slice: int, full_gb: int, *, half_gb: int, three_gb: int) -> dict[str, tuple[int, int]]:
    return {
        f"1g.{mem_gb_per_slice}gb": (1, 1),
        f"1g.{half_gb}gb": (1, 2),
        f"2g.{half_gb}gb": (2, 2),
        f"3g.{three_gb}gb": (3, 4),
        f"4g.{three_gb}gb": (4, 4),
        f"7g.{full_gb}gb": (7, 8),
    }


GPU_SPECS: dict[str, GpuSpec] = {
    s.model: s
    for s in (
        GpuSpec("H100-80GB", "NVIDIA H100 80GB HBM3", 81559, 700, 70, 1980, 345, "9.0", 87, 0.064, True,
                _mig(10, 80, half_gb=20, three_gb=40)),
        GpuSpec("H200-141GB", "NVIDIA H200", 143771, 700, 75, 1980, 345, "9.0", 87, 0.064, True,
                _mig(18, 141, half_gb=35, three_gb=71)),
        GpuSpec("A100-80GB", "NVIDIA A100-SXM4-80GB", 81920, 400, 55, 1410, 210, "8.0", 88, 0.11, True,
                _mig(10, 80, half_gb=20, three_gb=40)),
        GpuSpec("A100-40GB", "NVIDIA A100-SXM4-40GB", 40960, 400, 50, 1410, 210, "8.0", 88, 0.11, True,
                _mig(5, 40, half_gb=10, three_gb=20)),
        GpuSpec("L40S", "NVIDIA L40S", 46068, 350, 35, 2520, 210, "8.9", 88, 0.14, False),
        GpuSpec("L4", "NVIDIA L4", 23034, 72, 16, 2040, 210, "8.9", 88, 0.55, False),
        GpuSpec("T4", "Tesla T4", 15360, 70, 10, 1590, 300, "7.5", 93, 0.6, False),
    )
}  # fmt: skip

# Allowed placement starts by memory-slice size (A100/H100-style 8-slice layout).
_MIG_STARTS = {1: range(0, 7), 2: range(0, 8, 2), 4: (0, 4), 8: (0,)}

# The node around the GPUs, by its GPU model: (InfiniBand ports, their Mbit/s, Ethernet ports, their Mbit/s), as
# the usual systems ship (HGX H100/H200: one 400G NDR port per GPU; HGX A100: 200G HDR per GPU pair; PCIe cards:
# two 25 GbE ports).
_NODE_NET: dict[str, tuple[int, int, int, int]] = {
    "H100-80GB": (8, 400_000, 2, 100_000), "H200-141GB": (8, 400_000, 2, 100_000),
    "A100-80GB": (4, 200_000, 2, 100_000), "A100-40GB": (4, 200_000, 2, 100_000),
}
_PCIE_NET = (0, 0, 2, 25_000)
_SCRATCH_TB = (7.68, 15.36, 30.72)  # local NVMe scratch sizes, decimal TB as sold
_ROOT_GIB = round(1.92e12 / 2**30, 3)  # a 1.92 TB boot drive

# Bus ids of a typical HGX 8-GPU baseboard.
_HGX_BUS_IDS = ("18", "2a", "3a", "5d", "9a", "ab", "ba", "db")


def _unit(*parts: object) -> float:
    """Deterministic pseudo-random number in [0, 1) from the given parts."""
    digest = hashlib.blake2b("|".join(map(str, parts)).encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big") / 2**64


def _clamp(value: float, lo: float, hi: float) -> float:
    return float(max(lo, min(hi, value)))


@dataclass(slots=True)
class _Workload:
    kind: str
    started_at: float
    memory_fraction: float
    period_s: float
    phase_s: float
    generation: int


@dataclass(slots=True)
class _ShareProcess:
    """A simulated process of a fractional or MIG allocation: its own workload and memory, within its limit until
    a memory_hog fault makes it grow past it."""

    pid: int
    allocation_id: str
    workload: _Workload
    limit_mib: float
    share: float  # the part of the GPU's compute it drives (utilisation weight)
    mig_uuid: str | None
    target_mib: float
    used_mib: float = 0.0


@dataclass(slots=True)
class _GpuState:
    index: int
    spec: GpuSpec
    uuid: str
    rng: random.Random
    workload: _Workload | None = None
    workload_allocation: str | None = None  # the whole-GPU allocation that put the workload there
    workload_generation: int = 0
    procs: list[_ShareProcess] = field(default_factory=list)
    memory_used_mib: float = 0.0
    temperature_c: float = 0.0
    faults: set[str] = field(default_factory=set)
    pending_xids: list[int] = field(default_factory=list)
    latched_xids: set[int] = field(default_factory=set)
    sbe: float = 0.0
    sbe_rate_per_min: float = 0.0
    dbe: int = 0
    retired_pages_pending: bool = False
    lost: bool = False
    mig: tuple[MigInstance, ...] | None = None
    sbe_tracker: SbeRateTracker = field(default_factory=SbeRateTracker)
    xid_storm_until: float = 0.0
    xid_storm_xid: int = 31
    # real work's measured load on this GPU (allocation → (utilisation %, memory MiB)): see SimulatedNvml.measure
    measured: dict[str, tuple[float, float]] = field(default_factory=dict)
    measured_pid: dict[str, int] = field(default_factory=dict)  # allocation → its work's main process
    extra: ExtraState = field(default_factory=lambda: ExtraState(energy_mj=0.0))  # energy and NVLink counters


def _clocks(spec: GpuSpec, util: float, power: float, temperature_c: float,
            lost: bool) -> tuple[int, float, list[str]]:
    """(SM clock MHz, power W after a thermal slowdown, throttle reasons): boost when busy, idle clock when free;
    lower under the power cap, much lower when thermally throttled."""
    throttle: list[str] = []
    busy = util >= 1.0
    clock = float(spec.max_sm_clock_mhz if busy else spec.idle_sm_clock_mhz)
    if not busy and not lost:
        throttle.append("gpu_idle")
    if power >= 0.98 * spec.tdp_w:
        throttle.append("sw_power_cap")
        clock *= 0.93
    if temperature_c >= spec.slowdown_temp_c - 3.0:
        throttle.append("sw_thermal_slowdown")
        clock = min(clock, spec.max_sm_clock_mhz * 0.8)
    if temperature_c >= spec.slowdown_temp_c:
        throttle.append("hw_thermal_slowdown")
        clock = min(clock, spec.max_sm_clock_mhz * 0.55)
        power = min(power, spec.idle_w + 0.6 * (spec.tdp_w - spec.idle_w))
    return int(round(clock / 15.0) * 15), power, throttle


class SimulatedNvml:
    """:class:`~services.agent.nvml_types.NvmlBackend` with simulated GPUs."""

    def __init__(
        self,
        hostname: str,
        gpu_models: Sequence[str],
        *,
        seed: int,
        clock: Callable[[], float],
        cpu_count: int = 224,
        memory_total_mib: int = 2 * 1024 * 1024,
        driver_version: str = "550.90.07",
        cuda_driver_version: str = "12.4",
        mig_mode: Sequence[int] = (),
        numa_nodes: int = 0,
        nvlink: str = "auto",
    ) -> None:
        """`numa_nodes`: how many NUMA nodes the GPUs split evenly over (0: two when there is more than one GPU);
        `nvlink`: "auto" (all-to-all among SXM parts, as an NVSwitch baseboard), "all", "pairs" (0-1, 2-3, ...,
        NVLink bridges) or "none"."""
        unknown = [m for m in gpu_models if m not in GPU_SPECS]
        if unknown:
            raise ValueError(f"unknown GPU model(s) {unknown}; known: {sorted(GPU_SPECS)}")
        if nvlink not in ("auto", "all", "pairs", "none"):
            raise ValueError(f"unknown NVLink layout {nvlink!r}")
        self._hostname = hostname
        self._numa_nodes = numa_nodes
        self._nvlink = nvlink
        self._seed = seed
        self._clock = clock
        self._cpu_count = cpu_count
        self._memory_total_mib = memory_total_mib
        self._driver_version = driver_version
        self._cuda_driver_version = cuda_driver_version
        self._opened = False
        self._last_t: float | None = None
        self._gpus: list[_GpuState] = []
        for index, model in enumerate(gpu_models):
            spec = GPU_SPECS[model]
            state = _GpuState(
                index=index,
                spec=spec,
                uuid="GPU-" + str(uuidlib.uuid5(_UUID_NAMESPACE, f"{hostname}/{index}")),
                rng=random.Random(f"{seed}/{hostname}/{index}"),
            )
            state.temperature_c = AMBIENT_C + spec.thermal_resistance * spec.idle_w
            state.extra.energy_mj = boot_energy_mj(seed, state.uuid, spec.idle_w)
            self._gpus.append(state)
        self._by_uuid = {g.uuid: g for g in self._gpus}
        for index in mig_mode:  # an operator enabled MIG mode before the agent started: no instances yet
            if not self._gpu(index).spec.mig_profiles:
                raise ValueError(f"{self._gpu(index).spec.model} does not support MIG")
            self._gpu(index).mig = ()
        self._next_pid = 4000
        self._init_node_facts(gpu_models)
        self._started: set[tuple[str, str]] = set()  # (allocation, GPU uuid) that ever got a process

    def _init_node_facts(self, gpu_models: Sequence[str]) -> None:
        """NICs and volumes by the node's main GPU model; the scratch size and how full it starts from the
        hostname, so the same node always looks the same."""
        main = max(dict.fromkeys(gpu_models), key=list(gpu_models).count) if gpu_models else ""
        ib, ib_mbps, eth, eth_mbps = _NODE_NET.get(main, _PCIE_NET)
        self._nics = tuple(NicInfo(f"mlx5_{i}/1", "infiniband", ib_mbps) for i in range(ib)) + tuple(
            NicInfo(f"eth{i}", "ethernet", eth_mbps) for i in range(eth))
        self._net_capacity_mbps = float(ib * ib_mbps + eth * eth_mbps)
        u = _unit(self._hostname, "scratch")
        scratch_gib = round(_SCRATCH_TB[int(u * len(_SCRATCH_TB))] * 1e12 / 2**30, 3)
        self._volumes = (VolumeInfo("/", _ROOT_GIB, "ext4"), VolumeInfo("/scratch", scratch_gib, "xfs"))
        self._root_used_gib = 40.0 + 30.0 * _unit(self._hostname, "root")
        self._scratch_used_gib = scratch_gib * (0.05 + 0.30 * _unit(self._hostname, "scratch-used"))
        self._scratch_cap_gib = 0.9 * scratch_gib
        self._node_rng = random.Random(f"{self._seed}/{self._hostname}/node")
        self._busy = 0.0  # mean GPU utilisation of the last sample(), 0..1
        self._node_t: float | None = None

    # ---- lifecycle ---------------------------------------------------------------

    def open(self) -> None:
        self._opened = True
        if self._last_t is None:
            self._last_t = self._clock()  # simulated time starts when the backend is opened

    def close(self) -> None:
        self._opened = False

    def __enter__(self) -> SimulatedNvml:
        self.open()
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ---- controls ----------------------------------------------------------------

    def set_workload(self, uuid: str, kind: str | None, allocation_id: str | None = None) -> None:
        """Put a workload on a GPU (None = free). Memory then ramps, it is not instant."""
        gpu = self._gpu_by_uuid(uuid)
        if kind is not None and kind not in WORKLOAD_KINDS:
            raise ValueError(f"unknown workload kind {kind!r}; expected one of {WORKLOAD_KINDS} or None")
        if kind is None:
            gpu.workload = None
            gpu.workload_allocation = None
            return
        gpu.workload = self._new_workload(gpu, kind, gpu.spec.memory_total_mib)
        gpu.workload_allocation = allocation_id

    def _new_workload(self, gpu: _GpuState, kind: str, memory_mib: float) -> _Workload:
        gpu.workload_generation += 1
        gen = gpu.workload_generation
        u = lambda tag: _unit(self._seed, gpu.uuid, gen, tag)  # noqa: E731
        fraction = {
            "idle": min(1.0, (512 + 1024 * u("mem")) / memory_mib),
            "training": 0.85 + 0.10 * u("mem"),
            "inference": 0.45 + 0.25 * u("mem"),
            "dev": 0.10 + 0.20 * u("mem"),
        }[kind]
        return _Workload(
            kind=kind,
            started_at=self._clock(),
            memory_fraction=fraction,
            period_s=900 + 900 * u("period"),  # training: checkpoint/eval every 15-30 min
            phase_s=120 + 300 * u("phase"),
            generation=gen,
        )

    def start_allocation(self, uuid: str, allocation_id: str, kind: str, *, share_milli: int = 1000,
                         limit_mib: float | None = None, mig_uuid: str | None = None) -> int | None:
        """The process an allocation runs on a GPU: a whole GPU gets the GPU's workload, a fraction or a MIG slice
        its own process using part of `limit_mib`. Only the first call per (allocation, GPU) starts anything, so a
        replay never restarts a process that exited, was stopped, or was emptied by a fault. Returns the pid."""
        gpu = self._gpu_by_uuid(uuid)
        if kind not in WORKLOAD_KINDS:
            raise ValueError(f"unknown workload kind {kind!r}; expected one of {WORKLOAD_KINDS}")
        if (allocation_id, uuid) in self._started:
            return None
        self._started.add((allocation_id, uuid))
        if share_milli >= 1000 and mig_uuid is None:
            self.set_workload(uuid, kind, allocation_id)
            return self._workload_pid(gpu, 0)
        limit = float(limit_mib if limit_mib else gpu.spec.memory_total_mib * share_milli / 1000)
        workload = self._new_workload(gpu, kind, limit)
        self._next_pid += 1
        gpu.procs.append(_ShareProcess(pid=self._next_pid, allocation_id=allocation_id, workload=workload,
                                       limit_mib=limit, share=share_milli / 1000, mig_uuid=mig_uuid,
                                       target_mib=workload.memory_fraction * limit))
        return self._next_pid

    def measure(self, uuid: str, allocation_id: str, *, util_pct: float, memory_mib: float,
                pid: int | None = None) -> None:
        """A real process runs this allocation's work (the executor on the simulated fleet): the GPU shows what
        it measured, its CPU use as utilisation and its resident memory as GPU memory, instead of a workload;
        with `pid`, that process is listed on the GPU holding the memory, as NVML lists a CUDA process."""
        gpu = self._gpu_by_uuid(uuid)
        gpu.measured[allocation_id] = (_clamp(util_pct, 0.0, 100.0), max(0.0, memory_mib))
        if pid is not None:
            gpu.measured_pid[allocation_id] = pid

    def end_allocation(self, allocation_id: str) -> None:
        """The allocation was released: its processes exit and free their memory."""
        for gpu in self._gpus:
            gpu.measured.pop(allocation_id, None)
            gpu.measured_pid.pop(allocation_id, None)
            gpu.procs = [p for p in gpu.procs if p.allocation_id != allocation_id]
            if gpu.workload_allocation == allocation_id:
                gpu.workload = None
                gpu.workload_allocation = None

    def processes(self) -> list[GpuProcess]:
        self._require_open()
        out: list[GpuProcess] = []
        for gpu in self._gpus:
            if gpu.lost:
                continue
            if gpu.workload is not None:
                n = 2 if gpu.workload.kind == "inference" else 1
                for i in range(n):
                    out.append(GpuProcess(pid=self._workload_pid(gpu, i), gpu_uuid=gpu.uuid, gpu_index=gpu.index,
                                          used_memory_mib=int(gpu.memory_used_mib / n),
                                          allocation_id=gpu.workload_allocation))
            out += [GpuProcess(pid=p.pid, gpu_uuid=gpu.uuid, gpu_index=gpu.index, used_memory_mib=int(p.used_mib),
                               mig_uuid=p.mig_uuid, allocation_id=p.allocation_id) for p in gpu.procs]
            out += [GpuProcess(pid=pid, gpu_uuid=gpu.uuid, gpu_index=gpu.index,
                               used_memory_mib=int(gpu.measured[a][1]), allocation_id=a)
                    for a, pid in gpu.measured_pid.items() if a in gpu.measured]
        return out

    def stop_process(self, pid: int, *, force: bool = False) -> None:
        """The process exits at once (a simulated process never ignores SIGTERM) and its memory is freed."""
        for gpu in self._gpus:
            if any(p.pid == pid for p in gpu.procs):
                gpu.procs = [p for p in gpu.procs if p.pid != pid]
                return
            if gpu.workload is not None and pid in (self._workload_pid(gpu, 0), self._workload_pid(gpu, 1)):
                gpu.workload = None
                gpu.memory_used_mib = 0.0
                return
        raise ProcessLookupError(pid)

    def _workload_pid(self, gpu: _GpuState, i: int) -> int:
        return 100_000 + gpu.index * 1000 + (gpu.workload_generation % 100) * 2 + i

    def inject_fault(self, index: int, kind: str, *, seconds: float = 30.0, xid: int = 31, count: int = 50,
                     factor: float = 1.5) -> None:
        gpu = self._gpu(index)
        if kind not in FAULT_KINDS:
            raise ValueError(f"unknown fault kind {kind!r}; expected one of {FAULT_KINDS}")
        kind = {"off_bus": "xid79", "ecc_storm": "sbe_storm"}.get(kind, kind)
        if kind == "reset":
            self.clear_faults(index)
            return
        if kind == "rogue_process":
            self.set_workload(gpu.uuid, "training")
            return
        if kind == "no_process":
            gpu.workload = None
            gpu.procs = []
            return
        if kind == "memory_hog":
            for p in gpu.procs:
                p.target_mib = min(float(gpu.spec.memory_total_mib), factor * p.limit_mib)
            return
        if kind == "ecc_burst":
            gpu.sbe += max(1, count)
            return
        if kind == "xid_storm":
            gpu.xid_storm_until = self._clock() + seconds
            gpu.xid_storm_xid = xid
        elif kind == "xid79":
            gpu.lost = True
            gpu.memory_used_mib = 0.0  # nothing is readable once the GPU is off the bus
            self._raise_xid(gpu, 79)
        elif kind in ("xid48", "dbe"):
            gpu.dbe += 1
            gpu.retired_pages_pending = True
            self._raise_xid(gpu, 48)
        elif kind == "sbe_storm":
            gpu.sbe_rate_per_min = 30.0 + 60.0 * gpu.rng.random()
            self._raise_xid(gpu, 92)
        elif kind == "xid13":
            self._raise_xid(gpu, 13)
        gpu.faults.add(kind)

    def clear_faults(self, index: int) -> None:
        """Simulates a GPU reset: faults, latched Xids and volatile ECC counters are cleared."""
        gpu = self._gpu(index)
        gpu.faults.clear()
        gpu.pending_xids.clear()
        gpu.latched_xids.clear()
        gpu.sbe = 0.0
        gpu.sbe_rate_per_min = 0.0
        gpu.dbe = 0
        gpu.retired_pages_pending = False
        gpu.lost = False
        gpu.xid_storm_until = 0.0
        gpu.sbe_tracker.reset()

    def set_mig_layout(self, index: int, profiles: Sequence[str]) -> None:
        """Enable MIG with the given GPU-instance profiles (first-fit placement); [] disables it."""
        gpu = self._gpu(index)
        if not profiles:
            gpu.mig = None
            return
        table = gpu.spec.mig_profiles
        if not table:
            raise ValueError(f"{gpu.spec.model} does not support MIG")
        used = [False] * 8
        compute = 0
        instances: list[MigInstance] = []
        for profile in profiles:
            if profile not in table:
                raise ValueError(
                    f"profile {profile!r} not valid for {gpu.spec.model}; valid: {sorted(table)}"
                )
            g, size = table[profile]
            compute += g
            start = next(
                (s for s in _MIG_STARTS[size] if not any(used[s : s + size])),
                None,
            )
            if start is None or compute > 7:
                raise ValueError(f"MIG layout {list(profiles)} does not fit on {gpu.spec.model}")
            for s in range(start, start + size):
                used[s] = True
            mig_uuid = "MIG-" + str(uuidlib.uuid5(_UUID_NAMESPACE, f"{gpu.uuid}/{start}/{profile}"))
            instances.append(MigInstance(profile=profile, start=start, size=size, uuid=mig_uuid))
        gpu.mig = tuple(sorted(instances, key=lambda m: m.start or 0))

    def mig_layout(self) -> dict[int, tuple[MigInstance, ...] | None]:
        return {g.index: g.mig for g in self._gpus}

    def create_mig_instance(self, index: int, profile: str, start: int) -> MigInstance:
        """Follows the same catalogue as the scheduler (libs.core.mig): allowed starts, disjoint slots, at most
        seven compute slices."""
        gpu = self._gpu(index)
        if gpu.mig is None:
            raise MigError("MigModeDisabled", f"GPU {index} is not in MIG mode")
        p = migcat.profile(gpu.spec.model, profile)
        if p is None:
            raise MigError("UnknownProfile", f"{profile} is not a MIG profile of {gpu.spec.model}")
        if start not in p.starts:
            raise MigError("InvalidPlacement", f"{profile} cannot start at slot {start}")
        layout = [(m.profile, m.start or 0) for m in gpu.mig]
        if not migcat.valid_layout(gpu.spec.model, [*layout, (profile, start)]):
            raise MigError("InsufficientResources", f"{profile}@{start} does not fit next to {layout}")
        mig_uuid = "MIG-" + str(uuidlib.uuid5(_UUID_NAMESPACE, f"{gpu.uuid}/{start}/{profile}"))
        instance = MigInstance(profile=profile, start=start, size=p.slots, uuid=mig_uuid)
        gpu.mig = tuple(sorted((*gpu.mig, instance), key=lambda m: m.start or 0))
        return instance

    def destroy_mig_instance(self, index: int, start: int) -> None:
        gpu = self._gpu(index)
        found = [m for m in gpu.mig or () if m.start == start]
        if not found:
            return
        if any(p.mig_uuid == found[0].uuid for p in gpu.procs):
            raise MigError("InUse", f"MIG instance at slot {start} of GPU {index} has running processes")
        gpu.mig = tuple(m for m in gpu.mig or () if m.start != start)

    def _nvlink_peers(self, index: int) -> tuple[int, ...]:
        n = len(self._gpus)
        if self._nvlink == "pairs":
            peer = index ^ 1
            return (peer,) if peer < n else ()
        if self._nvlink == "none" or n < 2:
            return ()
        linked = [g.index for g in self._gpus if self._nvlink == "all" or g.spec.nvlink]
        return tuple(i for i in linked if i != index) if index in linked else ()

    def set_mig_mode(self, index: int, enabled: bool) -> None:
        gpu = self._gpu(index)
        if enabled and not gpu.spec.mig_profiles:
            raise MigError("MigUnsupported", f"{gpu.spec.model} has no MIG profiles")
        if (gpu.mig is not None) == enabled:
            return
        if gpu.procs or gpu.mig:
            raise MigError("InUse", f"GPU {index} has processes or MIG instances")
        gpu.mig = () if enabled else None

    # ---- NvmlBackend -----------------------------------------------------------

    def node_info(self) -> NodeInfo:
        self._require_open()
        n = len(self._gpus)
        numa = self._numa_nodes or (2 if n > 1 else 1)
        gpus = tuple(
            GpuInfo(
                uuid=g.uuid,
                index=g.index,
                name=g.spec.name,
                model=g.spec.model,
                memory_total_mib=g.spec.memory_total_mib,
                pci_bus_id=self._bus_id(g.index),
                serial=str(1650000000000 + int(_unit(self._hostname, g.index, "serial") * 10**10)),
                numa_node=g.index * numa // n,
                nvlink_peers=self._nvlink_peers(g.index),
                mig_mode=g.mig is not None,
                mig_instances=g.mig or (),
                compute_capability=g.spec.compute_capability,
                power_limit_w=float(g.spec.tdp_w),
                slowdown_temp_c=float(g.spec.slowdown_temp_c),
            )
            for g in self._gpus
        )
        return NodeInfo(
            hostname=self._hostname,
            driver_version=self._driver_version,
            cuda_driver_version=self._cuda_driver_version,
            nvml_version=f"{self._cuda_driver_version.split('.')[0]}.{self._driver_version}",
            cpu_count=self._cpu_count,
            memory_total_mib=self._memory_total_mib,
            gpus=gpus,
            network=self._nics,
            storage=self._volumes,
        )

    def sample(self) -> list[GpuSample]:
        self._require_open()
        now = self._clock()
        dt = 0.0 if self._last_t is None else max(0.0, now - self._last_t)
        self._last_t = now
        samples = [self._step(g, now, dt) for g in self._gpus]
        if samples:  # a MIG-mode GPU reports no utilisation: its memory in use stands for its load
            self._busy = sum(s.utilization_gpu_pct if s.utilization_gpu_pct is not None
                             else 100.0 * (s.memory_used_mib or 0) / s.memory_total_mib for s in samples) / (
                100.0 * len(samples))
        return samples

    def node_sample(self) -> NodeSample:
        """The node follows its GPUs' load (the last sample()): CPUs feed them, the fabric carries their
        collectives, checkpoints fill the scratch volume slowly. A few float operations: a fleet process runs
        over a thousand of these a second."""
        self._require_open()
        now = self._clock()
        dt = 0.0 if self._node_t is None else max(0.0, now - self._node_t)
        self._node_t = now
        busy, jitter = self._busy, self._node_rng.random()
        if self._scratch_used_gib < self._scratch_cap_gib:
            self._scratch_used_gib = min(self._scratch_cap_gib,
                                         self._scratch_used_gib + dt * (0.001 + 0.05 * busy))  # GiB/s
        rx = self._net_capacity_mbps * (0.001 + 0.3 * busy * (0.8 + 0.4 * jitter))
        return NodeSample(
            cpu_util_pct=round(2.0 + 60.0 * busy + 4.0 * jitter, 1),
            memory_used_mib=int(self._memory_total_mib * (0.04 + 0.3 * busy)),
            network_rx_mbps=round(rx, 1),
            network_tx_mbps=round(rx * (0.85 + 0.1 * jitter), 1),
            storage_used_gib=round(self._root_used_gib + self._scratch_used_gib, 3),
        )

    # ---- dynamics ----------------------------------------------------------------

    def _utilization(self, gpu: _GpuState, w: _Workload | None, now: float) -> tuple[float, float]:
        """(gpu util %, memory-bandwidth util %) the workload asks for at time ``now``."""
        if w is None:
            return 0.0, 0.0
        rng = gpu.rng
        elapsed = max(0.0, now - w.started_at)
        if w.kind == "idle":
            return 0.0, 0.0
        if w.kind == "training":
            if elapsed < 20.0:  # startup: loading data/model, memory still ramping
                util = _clamp(10 + 4 * elapsed + rng.gauss(0, 5), 0, 100)
                return util, util * 0.4
            in_cycle = (elapsed - w.phase_s) % w.period_s
            if elapsed >= w.phase_s and in_cycle < 45.0:  # checkpoint / eval dip
                util = _clamp(12 + rng.gauss(0, 6), 2, 30)
                return util, _clamp(util * 0.5, 0, 100)
            util = _clamp(93 + rng.gauss(0, 3), 85, 100)
            return util, _clamp(55 + rng.gauss(0, 6), 30, 80)
        if w.kind == "inference":
            day = (now % 86400.0) / 86400.0
            diurnal = 0.5 - 0.5 * math.cos(2 * math.pi * (day - 1 / 6))  # peak mid-afternoon
            window = int(now // 10)
            burst = 30.0 if _unit(self._seed, gpu.uuid, w.generation, "burst", window) > 0.8 else 0.0
            util = _clamp(15 + 55 * diurnal + burst + rng.gauss(0, 8), 0, 100)
            return util, _clamp(0.6 * util + rng.gauss(0, 4), 0, 100)
        # dev: mostly idle, short bursts (a notebook cell, a quick test run)
        window = int(now // 120)
        u = _unit(self._seed, gpu.uuid, w.generation, "dev", window)
        burst_start = window * 120 + 60 * _unit(self._seed, gpu.uuid, w.generation, "dev-start", window)
        burst_len = 20 + 40 * _unit(self._seed, gpu.uuid, w.generation, "dev-len", window)
        if u < 0.2 and burst_start <= now < burst_start + burst_len:
            util = _clamp(80 + rng.gauss(0, 10), 50, 100)
            return util, _clamp(0.5 * util + rng.gauss(0, 5), 0, 100)
        util = _clamp(rng.gauss(1, 1), 0, 4)
        return util, util * 0.3

    def _step(self, gpu: _GpuState, now: float, dt: float) -> GpuSample:
        spec = gpu.spec
        if now < gpu.xid_storm_until:
            gpu.pending_xids.append(gpu.xid_storm_xid)
        xids = tuple(gpu.pending_xids)
        gpu.pending_xids.clear()

        # Memory ramps toward the workload footprint (fills in ~15 s, frees in ~3 s).
        w = gpu.workload
        target = 0.0 if w is None or gpu.lost else w.memory_fraction * spec.memory_total_mib
        rate = spec.memory_total_mib / (15.0 if target > gpu.memory_used_mib else 3.0)
        step = rate * dt
        gpu.memory_used_mib += _clamp(target - gpu.memory_used_mib, -step, step)

        util, mem_util = (0.0, 0.0) if gpu.lost else self._utilization(gpu, w, now)
        for p in gpu.procs:  # share processes ramp within (or, hogging, past) their limit and add their load
            p_target = 0.0 if gpu.lost else p.target_mib
            p_step = spec.memory_total_mib / (15.0 if p_target > p.used_mib else 3.0) * dt
            p.used_mib += _clamp(p_target - p.used_mib, -p_step, p_step)
            if not gpu.lost:
                p_util, p_mem = self._utilization(gpu, p.workload, now)
                util, mem_util = min(100.0, util + p.share * p_util), min(100.0, mem_util + p.share * p_mem)
        if gpu.measured and not gpu.lost:
            util = min(100.0, util + sum(u for u, _ in gpu.measured.values()))
            mem_util = min(100.0, mem_util + 0.5 * sum(u for u, _ in gpu.measured.values()))
        memory_used = min(float(spec.memory_total_mib), gpu.memory_used_mib + sum(p.used_mib for p in gpu.procs)
                          + sum(m for _, m in gpu.measured.values()))
        noise = gpu.rng.gauss(0, 0.01 * spec.tdp_w * (0.2 + util / 100.0))
        power = spec.idle_w + util / 100.0 * (spec.tdp_w - spec.idle_w) + noise
        if memory_used > 0:
            power += 0.02 * spec.tdp_w  # contexts resident keep the GPU out of its deepest idle state
        if gpu.lost:
            power = 0.0
        power = _clamp(power, 0.0, spec.tdp_w)

        # First-order thermal model, exact over dt for piecewise-constant power.
        steady = AMBIENT_C + spec.thermal_resistance * power
        if "thermal" in gpu.faults:  # cooling failure: heat-sink can no longer keep up
            steady = max(steady + 20.0, spec.slowdown_temp_c + 8.0)
        gpu.temperature_c = steady + (gpu.temperature_c - steady) * math.exp(-dt / TAU_S)

        clock_mhz, power, throttle = _clocks(spec, util, power, gpu.temperature_c, gpu.lost)

        # Correctable-ECC storm: counter climbs at the injected rate.
        if "sbe_storm" in gpu.faults:
            gpu.sbe += gpu.sbe_rate_per_min * dt / 60.0 * (0.8 + 0.4 * gpu.rng.random())
        sbe = int(gpu.sbe)
        sbe_rate = gpu.sbe_tracker.update(now, sbe)

        gpu.latched_xids.update(x for x in xids if x in XID_FAILED or x in XID_DEGRADED)
        temperature = None if gpu.lost else round(gpu.temperature_c, 1)
        health, reasons = derive_health(
            xid_events=gpu.latched_xids,
            ecc_volatile_dbe=gpu.dbe,
            retired_pages_pending=gpu.retired_pages_pending,
            temperature_c=temperature,
            slowdown_temp_c=spec.slowdown_temp_c,
            throttle_reasons=throttle,
            sbe_rate_per_min=sbe_rate,
            gpu_lost=gpu.lost,
        )
        mig_on = gpu.mig is not None
        procs = 0 if gpu.lost or w is None else (2 if w.kind == "inference" else 1)
        procs += 0 if gpu.lost else len(gpu.procs)
        extra = extra_readings(gpu.extra, model=spec.model, seed=self._seed, uuid=gpu.uuid, now=now, dt=dt,
                               util_pct=util, mem_util_pct=mem_util, power_w=power, temperature_c=gpu.temperature_c,
                               memory_total_mib=spec.memory_total_mib, memory_used_mib=int(memory_used), mig=mig_on,
                               lost=gpu.lost)
        return GpuSample(
            uuid=gpu.uuid,
            index=gpu.index,
            timestamp=now,
            # NVML does not report whole-GPU utilization for a MIG-enabled GPU.
            utilization_gpu_pct=None if mig_on else round(util, 1),
            utilization_memory_pct=None if mig_on else round(mem_util, 1),
            memory_used_mib=int(memory_used),
            memory_total_mib=spec.memory_total_mib,
            temperature_c=temperature,
            power_w=None if gpu.lost else round(power, 1),
            sm_clock_mhz=None if gpu.lost else clock_mhz,
            ecc_volatile_sbe=sbe,
            ecc_volatile_dbe=gpu.dbe,
            retired_pages_pending=gpu.retired_pages_pending,
            xid_events=xids,
            throttle_reasons=() if gpu.lost else tuple(throttle),
            process_count=procs,
            health=health,
            health_reasons=reasons,
            extra=extra,
        )

    # ---- helpers -----------------------------------------------------------------

    def _raise_xid(self, gpu: _GpuState, xid: int) -> None:
        gpu.pending_xids.append(xid)

    def _bus_id(self, index: int) -> str:
        if len(self._gpus) <= len(_HGX_BUS_IDS):
            return f"0000:{_HGX_BUS_IDS[index]}:00.0"
        return f"0000:{(0x10 + index * 0x08) % 0x100:02x}:00.0"

    def _gpu(self, index: int) -> _GpuState:
        if not 0 <= index < len(self._gpus):
            raise IndexError(f"no GPU with index {index} (node has {len(self._gpus)})")
        return self._gpus[index]

    def _gpu_by_uuid(self, uuid: str) -> _GpuState:
        try:
            return self._by_uuid[uuid]
        except KeyError:
            raise KeyError(f"no GPU with uuid {uuid!r} on {self._hostname}") from None

    def _require_open(self) -> None:
        if not self._opened:
            raise RuntimeError("SimulatedNvml is not open; call open() first")
