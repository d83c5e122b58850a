"""Translating NVML readings into the wire contracts (registration, telemetry), and deciding what to apply on the
node: which MIG instances to create or destroy, which processes exceed their fraction. Pure: no I/O, no clock."""

from __future__ import annotations

import ipaddress
import json
import math
import re
import zlib
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from typing import Literal

from libs.contracts.envelope import schema_of
from libs.contracts.events import AllocatedGpu, GpuTelemetry, TelemetrySampled
from libs.core import mig as migcat
from services.agent.nvml_types import GpuProcess, GpuSample, MigInstance, NodeSample

AGENT_VERSION = "0.1.0"


# One label per isolation driver the node can run (placement's domain selects on the same key).


def simulated_address(index: int) -> str:
    """Simulated node `index`'s own loopback address (127.0.0.2, 127.0.0.3, …): every 127/8 address reaches this
    machine, so a gang's members on different simulated nodes rendezvous over real TCP, each at its node's address."""
    if not 0 <= index < 2**24 - 3:
        raise ValueError(f"no loopback address for simulated node {index}")
    return str(ipaddress.IPv4Address(int(ipaddress.IPv4Address("127.0.0.2")) + index))


_NO_HOST = NodeSample()


def telemetry(cluster: str, node: str, samples: list[GpuSample], at: float,
              host: NodeSample | None = None, cadence: tuple[float, float] | None = None) -> TelemetrySampled:
    """`cadence`: (interval, heartbeat) of an agent sampling by change (`telemetry_due`); None: every sample sent."""
    h = host or _NO_HOST
    return TelemetrySampled(
        cluster=cluster, node=node, sampled_at=datetime.fromtimestamp(at, UTC),
        interval_s=cadence[0] if cadence else None, heartbeat_s=cadence[1] if cadence else None,
        cpu_util_pct=h.cpu_util_pct, memory_used_mib=h.memory_used_mib, network_rx_mbps=h.network_rx_mbps,
        network_tx_mbps=h.network_tx_mbps, storage_used_gib=h.storage_used_gib,
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


# --- sampling by change -------------------------------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class Deadband:
    """When a node's sample is worth sending (`telemetry_due`). `heartbeat_s` 0 turns sampling by change off: every
    sample is sent. The thresholds are per GPU, against the values of its last *sent* sample (so a slow drift
    is sent once it adds up, never lost in steps below the band)."""

    heartbeat_s: float = 5.0
    util_pct: float = 10.0
    memory_mib: float = 512.0
    temperature_c: float = 3.0
    power_w: float = 25.0

    @property
    def on(self) -> bool:
        return self.heartbeat_s > 0


def _moved(a: float | None, b: float | None, band: float) -> bool:
    if a is None or b is None:
        return a is not b
    return abs(a - b) >= band


def gpu_changed(sent: GpuSample, now: GpuSample, band: Deadband) -> bool:
    """Whether `now` differs from the GPU's last sent sample enough to be sent: a gauge beyond its band, or any change
    of what health, placement or accounting act on at once (health, its reasons, Xids, ECC counters, retired pages,
    the process count, a reading appearing or vanishing). Throttle reasons alone wait for the heartbeat: a power cap
    flickers on and off every few seconds under load, and inventory treats throttling as an operating condition, not
    a fault (a thermal slowdown moves the temperature and the agent's health reasons, which are sent at once)."""
    return (bool(now.xid_events) or now.health != sent.health or now.health_reasons != sent.health_reasons
            or now.ecc_volatile_sbe != sent.ecc_volatile_sbe or now.ecc_volatile_dbe != sent.ecc_volatile_dbe
            or now.retired_pages_pending != sent.retired_pages_pending
            or now.process_count != sent.process_count
            or _moved(sent.utilization_gpu_pct, now.utilization_gpu_pct, band.util_pct)
            or _moved(sent.utilization_memory_pct, now.utilization_memory_pct, band.util_pct)
            or _moved(sent.memory_used_mib, now.memory_used_mib, band.memory_mib)
            or _moved(sent.temperature_c, now.temperature_c, band.temperature_c)
            or _moved(sent.power_w, now.power_w, band.power_w))


def telemetry_due(sent: Mapping[str, GpuSample], heartbeat_at: float | None, now: list[GpuSample], at: float,
                  band: Deadband, interval_s: float) -> list[GpuSample] | None:
    """Which of the node's GPU samples taken at `at` go on the bus (None: the node sends nothing this interval).
    Every GPU when sampling by change is off, for the first sample, and once the heartbeat is due (`heartbeat_at`:
    when the last whole sample was taken; due within half an interval, so a heartbeat of 5 intervals is every 5th
    sample, not every 6th). Otherwise only the GPUs that moved beyond the deadband since their last sent sample
    (`sent`, by uuid), or that were never sent. A GPU left out means "unchanged": inventory counts its last sent
    values for the seconds they held."""
    if not band.on or heartbeat_at is None or at - heartbeat_at >= band.heartbeat_s - interval_s / 2:
        return now
    changed = [s for s in now if (last := sent.get(s.uuid)) is None or gpu_changed(last, s, band)]
    return changed or None


def telemetry_json(cluster: str, node: str, samples: list[GpuSample], at: float, *, event_id: str, source: str,
                   now: datetime, host: NodeSample | None = None, traceparent: str | None = None,
                   cadence: tuple[float, float] | None = None) -> bytes:
    """The CloudEvent of `telemetry(...)` as JSON bytes, built from plain values instead of through the pydantic
    models: a simulated fleet sends ~10,000 GPU samples a second and building and dumping the models was a third
    of its CPU. Same document as `telemetry(...).to_cloudevent(...).to_json()` (a unit test holds them equal);
    inventory validates it against the contract as usual."""
    gpus = [{
        "uuid": s.uuid, "index": int(s.index), "utilization_gpu_pct": float(_pct(s.utilization_gpu_pct)),
        "utilization_memory_pct": float(_pct(s.utilization_memory_pct)),
        "memory_used_mib": int(s.memory_used_mib or 0), "memory_total_mib": int(s.memory_total_mib),
        "temperature_c": None if s.temperature_c is None else float(s.temperature_c),
        "power_w": None if s.power_w is None else float(s.power_w),
        "sm_clock_mhz": None if s.sm_clock_mhz is None else int(s.sm_clock_mhz),
        "ecc_volatile_sbe": int(s.ecc_volatile_sbe), "ecc_volatile_dbe": int(s.ecc_volatile_dbe),
        "xid_events": [int(x) for x in s.xid_events], "throttle_reasons": list(s.throttle_reasons),
        "process_count": int(s.process_count), "health": s.health, "health_reasons": list(s.health_reasons)}
        for s in samples]
    h = host or _NO_HOST
    data = {"cluster": cluster, "node": node, "sampled_at": _iso(datetime.fromtimestamp(at, UTC)),
            "cpu_util_pct": _float(h.cpu_util_pct),
            "memory_used_mib": None if h.memory_used_mib is None else int(h.memory_used_mib), "gpus": gpus,
            "network_rx_mbps": _float(h.network_rx_mbps), "network_tx_mbps": _float(h.network_tx_mbps),
            "storage_used_gib": _float(h.storage_used_gib),
            "interval_s": float(cadence[0]) if cadence else None,
            "heartbeat_s": float(cadence[1]) if cadence else None}
    event = {"specversion": "1.0", "id": event_id, "source": source, "type": TelemetrySampled.event_type,
             "subject": node, "time": _iso(now), "datacontenttype": "application/json",
             "dataschema": schema_of(TelemetrySampled.event_type), "data": data}
    if traceparent:
        event["traceparent"] = traceparent
    return json.dumps(event, separators=(",", ":"), allow_nan=False).encode()


def _float(value: float | None) -> float | None:
    return None if value is None else float(value)


def _iso(at: datetime) -> str:
    """As pydantic writes an aware UTC datetime in JSON."""
    return at.isoformat().replace("+00:00", "Z")


# --- applying what placement decided --------------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class LiveAllocation:
    """What the agent needs of a live allocation on its node (from a grant, or from placement's list at start)."""

    allocation_id: str
    job_id: str
    team: str
    project: str
    kind: str
    gpus: tuple[AllocatedGpu, ...]


@dataclass(frozen=True, slots=True)
class WantedMig:
    allocation_id: str
    gpu_index: int
    profile: str
    start: int
    slots: int | None  # memory slots it spans (None: a profile the catalogue does not know for the model)


@dataclass(frozen=True, slots=True)
class MigStep:
    op: Literal["create", "destroy"]
    gpu_index: int
    profile: str
    start: int
    allocation_id: str | None  # the allocation a creation serves


@dataclass(frozen=True, slots=True)
class MigBlocked:
    """A change the agent will not make now (retried on the next convergence): `allocation_id` None means a
    stale instance it could not remove."""

    allocation_id: str | None
    gpu_index: int
    profile: str
    start: int
    reason: str


@dataclass(frozen=True, slots=True)
class MigPlan:
    steps: tuple[MigStep, ...]  # destructions first, then creations
    blocked: tuple[MigBlocked, ...]
    present: dict[str, MigInstance]  # allocation → its instance that already exists


@dataclass(frozen=True, slots=True)
class ShareLimit:
    """A fraction's memory promise on one GPU (what CUDA_MPS_PINNED_DEVICE_MEM_LIMIT says)."""

    allocation: LiveAllocation
    gpu_uuid: str
    gpu_index: int
    limit_mib: int


def wanted_mig(allocations: Iterable[LiveAllocation]) -> list[WantedMig]:
    out = []
    for a in allocations:
        for g in a.gpus:
            if g.mig_profile is not None and g.mig_start is not None:
                p = migcat.profile(g.model, g.mig_profile)
                out.append(WantedMig(a.allocation_id, g.index, g.mig_profile, g.mig_start, p.slots if p else None))
    return out


def _mask(start: int, slots: int | None) -> int:
    return ((1 << (slots or 1)) - 1) << start


def plan_mig(wanted: Iterable[WantedMig], layout: dict[int, tuple[MigInstance, ...] | None],
             processes: Iterable[GpuProcess]) -> MigPlan:
    """Desired instances (one per live MIG allocation) against the instances each GPU has. Safe by construction:
    an instance with processes is never destroyed (InstanceBusy), a GPU with a process outside its instances is
    not touched at all (ProcessesOutsideLayout), a creation waits while its slots hold another instance
    (SlotInUse), and a GPU not in MIG mode is never switched (MigModeDisabled: that needs an idle GPU and a reset,
    an operator's step). Pure and idempotent: applying the plan and planning again gives no steps."""
    by_gpu: dict[int, list[WantedMig]] = {}
    for w in wanted:
        by_gpu.setdefault(w.gpu_index, []).append(w)
    procs = list(processes)
    steps_destroy: list[MigStep] = []
    steps_create: list[MigStep] = []
    blocked: list[MigBlocked] = []
    present: dict[str, MigInstance] = {}
    for index in sorted(set(by_gpu) | {i for i, inst in layout.items() if inst}):
        wants = sorted(by_gpu.get(index, []), key=lambda w: (w.start, w.allocation_id))
        actual = layout.get(index)
        if actual is None:
            blocked += [MigBlocked(w.allocation_id, index, w.profile, w.start,
                                   "MigModeDisabled" if index in layout else "UnknownGpu") for w in wants]
            continue
        unknown = [w for w in wants if w.slots is None]
        blocked += [MigBlocked(w.allocation_id, index, w.profile, w.start, "UnknownProfile") for w in unknown]
        wants = [w for w in wants if w.slots is not None]
        wanted_keys = {(w.profile, w.start) for w in wants}
        uuids = {m.uuid for m in actual}
        gpu_procs = [p for p in procs if p.gpu_index == index]
        busy = {p.mig_uuid for p in gpu_procs if p.mig_uuid}
        outside = any(p.mig_uuid is None or p.mig_uuid not in uuids for p in gpu_procs)
        kept = [m for m in actual if (m.profile, m.start) in wanted_keys]
        stale = [m for m in actual if (m.profile, m.start) not in wanted_keys]
        for w in wants:
            match = next((m for m in kept if (m.profile, m.start) == (w.profile, w.start)), None)
            if match is not None:
                present.setdefault(w.allocation_id, match)
        missing = [w for w in wants if w.allocation_id not in present]
        if outside and (stale or missing):
            blocked += [MigBlocked(None, index, m.profile, m.start or 0, "ProcessesOutsideLayout") for m in stale]
            blocked += [MigBlocked(w.allocation_id, index, w.profile, w.start, "ProcessesOutsideLayout")
                        for w in missing]
            continue
        occupied = 0
        for m in kept:
            occupied |= _mask(m.start or 0, m.size)
        for m in stale:
            if m.uuid in busy:
                blocked.append(MigBlocked(None, index, m.profile, m.start or 0, "InstanceBusy"))
                occupied |= _mask(m.start or 0, m.size)
            else:
                steps_destroy.append(MigStep("destroy", index, m.profile, m.start or 0, None))
        for w in missing:
            m = _mask(w.start, w.slots)
            if occupied & m:
                blocked.append(MigBlocked(w.allocation_id, index, w.profile, w.start, "SlotInUse"))
                continue
            occupied |= m
            steps_create.append(MigStep("create", index, w.profile, w.start, w.allocation_id))
    return MigPlan(tuple(steps_destroy + steps_create), tuple(blocked), present)


def share_limits(allocations: Iterable[LiveAllocation]) -> list[ShareLimit]:
    """Fractions with a memory promise (MIG slices are limited by the hardware, whole GPUs by their size)."""
    return [ShareLimit(a, g.uuid, g.index, g.memory_mib)
            for a in allocations for g in a.gpus
            if g.share_milli < 1000 and g.mig_profile is None and g.memory_mib]


def fraction_violations(limits: Iterable[ShareLimit], processes: Iterable[GpuProcess],
                        reported: set[tuple[str, int]]) -> list[tuple[ShareLimit, GpuProcess]]:
    """Processes of a fraction using more GPU memory than the fraction was promised, each (allocation, pid) once:
    `reported` holds those already reported. Per process, as CUDA MPS applies its pinned memory limit per client.
    A process whose allocation or memory is unknown cannot be judged and is skipped."""
    by_key = {(lim.allocation.allocation_id, lim.gpu_uuid): lim for lim in limits}
    out = []
    for p in processes:
        if p.allocation_id is None or p.used_memory_mib is None:
            continue
        lim = by_key.get((p.allocation_id, p.gpu_uuid))
        if lim is None or p.used_memory_mib <= lim.limit_mib or (p.allocation_id, p.pid) in reported:
            continue
        out.append((lim, p))
    return out


# --- the work's environment and its logs -------------------------------------------------------------------------
DEFAULT_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"


def waits_for_gang(grant_env: dict[str, str]) -> bool:
    """A member of a gang (its grant's rendezvous names more than one node) starts only when every member is ready
    (allocation.gang_ready); a single job starts at once."""
    try:
        return int(grant_env.get("PET_NNODES", "1")) > 1
    except ValueError:
        return False


def network_environment(socket_ifname: str, ib_hca: str) -> dict[str, str]:
    """What the node's config says about the interfaces a job's members talk over (NCCL's names); unset: none."""
    env = {}
    if socket_ifname:
        env["NCCL_SOCKET_IFNAME"] = socket_ifname
    if ib_hca:
        env["NCCL_IB_HCA"] = ib_hca
    return env


def launch_environment(grant_env: dict[str, str], work_env: dict[str, str], *, gpus: Iterable[AllocatedGpu],
                       mig_uuid: str | None, gpu_numa: dict[str, int] | None = None) -> dict[str, str]:
    """What the work runs with: a plain base (PATH, LANG), the job's own `env` over it, and the grant's over
    both (the job cannot set those: the contract refuses GPUPOOL_*, CUDA_VISIBLE_DEVICES and CUDA_MPS_*). GPUs are
    named by UUID in PCI bus order, as CUDA and NVML agree on that order; a MIG slice is the instance's UUID.
    GPUPOOL_NUMA_NODES: the NUMA nodes its GPUs are on (`gpu_numa`: GPU uuid → NUMA node; left out where none is
    known), e.g. for `numactl --cpunodebind=$GPUPOOL_NUMA_NODES --membind=$GPUPOOL_NUMA_NODES`."""
    gpus = list(gpus)
    env = {"PATH": DEFAULT_PATH, "LANG": "C.UTF-8"}
    env.update(work_env)
    env.update(grant_env)
    numa = sorted({gpu_numa[g.uuid] for g in gpus if g.uuid in (gpu_numa or {})})
    if numa:
        env["GPUPOOL_NUMA_NODES"] = ",".join(map(str, numa))
    visible = mig_uuid or env.get("CUDA_VISIBLE_DEVICES") or ",".join(g.uuid for g in gpus)
    env["CUDA_VISIBLE_DEVICES"] = visible
    env["NVIDIA_VISIBLE_DEVICES"] = visible
    env["CUDA_DEVICE_ORDER"] = "PCI_BUS_ID"
    return env


def log_text(data: bytes, complete: bool) -> tuple[str, int]:
    """Log bytes as text, and how many bytes that text covers: a UTF-8 sequence cut at the end of a chunk is left
    for the next read (unless nothing more will come), so a character is never split across reads."""
    end = len(data)
    if not complete:
        for back in range(1, min(4, len(data)) + 1):
            byte = data[-back]
            if byte & 0xC0 == 0x80:
                continue  # a continuation byte: look further back for the sequence's lead
            need = 2 if byte & 0xE0 == 0xC0 else 3 if byte & 0xF0 == 0xE0 else 4 if byte & 0xF8 == 0xF0 else 1
            if need > back:
                end = len(data) - back
            break
    return data[:end].decode("utf-8", errors="replace"), end


# --- the end of a job's work on the node (the executor's report) ----------------------------------------------
def classify_exit(exit_code: int | None, signal: str | None, oom: bool, stopped: bool,
                  runtime_exceeded: bool) -> str:
    """Why the work of an attempt ended, from how its main process ended and what happened around it. In order
    of precedence: `OutOfMemory` (the memory controller OOM-killed a process of the cgroup, whatever the exit
    code: the kill is the cause), `MaxRuntimeExceeded` (the executor stopped it at its runtime limit),
    `Stopped` (it ended after a stop request, with any exit code), `Completed` (exit 0), `Signalled` (killed by
    a signal nobody asked for), `NonZeroExit`; `Lost` when nothing is known (no exit code and no signal)."""
    if oom:
        return "OutOfMemory"
    if runtime_exceeded:
        return "MaxRuntimeExceeded"
    if stopped:
        return "Stopped"
    if exit_code == 0:
        return "Completed"
    if signal is not None:
        return "Signalled"
    if exit_code is None:
        return "Lost"
    return "NonZeroExit"


def attribute_by_cgroup(procs: Iterable[GpuProcess], owners: dict[int, str]) -> list[GpuProcess]:
    """GPU processes with the allocation their cgroup says they belong to (`owners`: pid → allocation, from the
    executor's cgroups). The cgroup wins over the environment: work can rewrite its own environment, not leave
    its cgroup. Processes outside every cgroup keep what their environment said (work launched by the caller)."""
    out = []
    for p in procs:
        owner = owners.get(p.pid)
        out.append(p if owner is None or owner == p.allocation_id else replace(p, allocation_id=owner))
    return out


def mps_gpus(gpus: Iterable[AllocatedGpu]) -> tuple[list[str], list[str]]:
    """(GPUs a grant holds as MPS fractions, GPUs it holds whole or as a MIG slice). A fraction's limits need its
    GPU's MPS control daemon running; a whole GPU or a MIG slice needs it gone."""
    fractions = sorted({g.uuid for g in gpus if g.share_milli < 1000 and g.mig_profile is None})
    others = sorted({g.uuid for g in gpus if g.share_milli >= 1000 or g.mig_profile is not None} - set(fractions))
    return fractions, others


def fraction_action(policy: str, kind: str) -> str:
    """What happens to a process over its fraction's memory: `stop` or `report`. `auto` stops dev work (an
    interactive session on a shared GPU must not squeeze its neighbours) and reports the rest."""
    if policy == "auto":
        return "stop" if kind == "dev" else "report"
    return policy


# --- a service replica's health (pure: the prober in services/agent/endpoints.py feeds it) ------------------------
RESTARTS_IN_PLACE = 3  # restarts on the same allocation without becoming ready between: then it is replaced


@dataclass(frozen=True)
class ReplicaHealth:
    """What the agent knows of one replica's health: ready or not, and its unhealthy probes in a row."""

    ready: bool = False
    failures: int = 0


def health_step(health: ReplicaHealth, healthy: bool, *, since_start_s: float, grace_s: float,
                failures: int) -> tuple[ReplicaHealth, str | None]:
    """One probe's result → the new state and what it means: `ready` (became ready), `restart` (`failures`
    unhealthy probes in a row: unready, and its work is restarted) or None. Until it was ready once, probes during
    `grace_s` after the start do not count (the replica is coming up)."""
    if healthy:
        return ReplicaHealth(True, 0), None if health.ready else "ready"
    if not health.ready and since_start_s < grace_s:
        return health, None
    count = health.failures + 1
    if count >= failures:
        return ReplicaHealth(False, 0), "restart"
    return ReplicaHealth(health.ready, count), None


def restart_in_place(*, has_health: bool, stopped_by_placement: bool, restarts: int) -> bool:
    """A replica with a health check whose work ended without placement asking (it crashed, or the agent stopped
    it unhealthy) is restarted on the same allocation, at most RESTARTS_IN_PLACE times without becoming ready in
    between; then its end is reported and placement replaces it."""
    return has_health and not stopped_by_placement and restarts < RESTARTS_IN_PLACE


def port_environment(ports: dict[str, int], address: str) -> dict[str, str]:
    """PORT (the first named port), PORT_<NAME> for each (upper case, '-' as '_'), and where the node is."""
    env = {f"PORT_{name.upper().replace('-', '_')}": str(port) for name, port in ports.items()}
    if ports:
        env["PORT"] = str(next(iter(ports.values())))
    env["GPUPOOL_NODE_ADDRESS"] = address
    return env


def endpoint_url(address: str, ports: dict[str, int]) -> str:
    """The replica's endpoint: its first port on its node's address."""
    host = f"[{address}]" if ":" in address else address
    return f"http://{host}:{next(iter(ports.values()))}"


# --- a replica's load for its autoscaler (pure: services/agent/load.py samples and publishes) ----------------------
_SAMPLE_LINE = re.compile(r"^(?P<name>[a-zA-Z_:][a-zA-Z0-9_:]*)(?P<labels>\{.*\})?\s+(?P<value>\S+)(\s+-?\d+)?$")


def metric_value(text: str, name: str) -> float | None:
    """The sum of every series of metric `name` in a Prometheus text exposition (`name{labels} value [ts]` lines;
    comments and other metrics skipped), None when it has no finite sample."""
    total, seen = 0.0, False
    for raw in text.splitlines():
        line = raw.strip()
        if not line.startswith(name) or line.startswith("#"):
            continue
        m = _SAMPLE_LINE.match(line)
        if m is None or m.group("name") != name:
            continue
        try:
            value = float(m.group("value"))
        except ValueError:
            continue
        if math.isfinite(value):
            total, seen = total + value, True
    return total if seen else None


def replica_utilization(gpus: Iterable[str], utilization: dict[str, float | None]) -> float | None:
    """A replica's GPUs' mean utilisation (percent) from the node's last sample; None when one of them reports
    none (a MIG-mode GPU has no whole-GPU utilisation) or was not sampled yet."""
    values = [utilization.get(uuid) for uuid in gpus]
    if not values or any(v is None for v in values):
        return None
    return sum(v for v in values if v is not None) / len(values)


def background_load(spec: str, uuids: list[str], seed: int) -> dict[str, str]:
    """Which of a simulated node's GPUs carry a background workload (`SIM_BACKGROUND`, e.g.
    'training=0.4,inference=0.3,dev=0.2': shares of the fleet's GPUs; the rest stay free), chosen by a stable hash
    of the seed and GPU so every run of a fleet looks the same."""
    shares = [(kind, float(share)) for kind, share in (p.split("=", 1) for p in spec.split(",") if "=" in p)]
    out: dict[str, str] = {}
    for uuid in uuids:
        u = (zlib.crc32(f"{seed}/{uuid}/background".encode()) % 10_000) / 10_000
        for kind, share in shares:
            if u < share:
                out[uuid] = kind
                break
            u -= share
    return out
