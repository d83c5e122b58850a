"""The resource model the scheduler reasons about: immutable values built from a snapshot.

Cluster -> node (labels, topology domain, CPU/memory) -> GPU (uuid, index, model, memory, NVLink domain, NUMA
node, health, sharing mode). A GPU is held in one of three ways, chosen per GPU by its `sharing` mode:

* ``exclusive``  whole GPUs only;
* ``fractional`` a fraction (compute share in 1/1000 + memory MiB), or the whole GPU while nothing else is on it;
* ``mig``        MIG instances from the model's profile catalogue (`libs.core.mig`), never the whole GPU.

All amounts are integers: GPU shares in milli-GPUs (1000 = one GPU), memory in MiB, CPU in milli-cores. A node
with `cpu_milli == 0` (or `memory_mib == 0`) does not track that resource.
"""

from __future__ import annotations

from dataclasses import dataclass, field

EXCLUSIVE = "exclusive"
FRACTIONAL = "fractional"
MIG = "mig"
SHARING_MODES = (EXCLUSIVE, FRACTIONAL, MIG)

WHOLE = 1000  # milli-GPUs in one GPU

JOB_KINDS = ("training", "inference", "dev", "batch")


@dataclass(frozen=True, slots=True)
class MigInstance:
    """A MIG GPU instance: profile name (e.g. ``"1g.10gb"``) at a start memory slice."""

    profile: str
    start: int


@dataclass(frozen=True, slots=True)
class Gpu:
    uuid: str
    index: int
    model: str
    memory_mib: int
    healthy: bool = True
    sharing: str = EXCLUSIVE
    nvlink_domain: str = ""  # GPUs with the same non-empty value are NVLink peers
    numa_node: int = 0
    mig_instances: tuple[MigInstance, ...] = ()  # configured instances (busy or idle) when sharing == "mig"


@dataclass(frozen=True, slots=True)
class Node:
    name: str
    cluster: str
    gpus: tuple[Gpu, ...]
    schedulable: bool = True
    labels: tuple[tuple[str, str], ...] = ()
    topology: str = ""  # rack / switch domain; gangs prefer one
    cpu_milli: int = 0  # 0: not tracked
    memory_mib: int = 0  # 0: not tracked


@dataclass(frozen=True, slots=True)
class Share:
    """Another way a one-GPU request may hold its GPU (`JobRequest.alternatives`): a fraction
    (`gpu_fraction_milli` + `gpu_memory_mib`), a MIG slice (`mig_profile`), or, all left at their defaults, a
    whole GPU; `gpu_models` replaces the request's (empty: any model)."""

    gpu_fraction_milli: int = 0
    gpu_memory_mib: int = 0
    mig_profile: str = ""
    gpu_models: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class JobRequest:
    """What a pending job asks for. `gpu_models` empty means any model.

    Exactly one way of holding GPUs:

    * ``gpus=N``                                N whole GPUs on one node;
    * ``gpus=N, gang_nodes=K, gpus_per_node=M`` a gang of K nodes x M GPUs (N == K*M), all or nothing;
    * ``gpus=N, gang=True``                     N whole GPUs over as few nodes as fit, all or nothing;
    * ``gpus=1, gpu_fraction_milli=F``          F/1000 of one shareable GPU (+ ``gpu_memory_mib``);
    * ``gpus=1, mig_profile="3g.40gb"``         one MIG instance of that profile;
    * ``gpus=0`` with CPU/memory                a CPU-only task (the simulator replays those).

    `alternatives` (one-GPU requests only): other `Share`s tried in order, each as if it were the request, when
    the request as asked is not placed now (its quota refuses it or nothing fits); its reason, preemption and
    reservation stay the request's own.

    `priority_class` (a name from the policy's classes) sets priority and default preemptibility; without it
    `priority` is used as is. `min_gpu_memory_mib` filters GPU models; `node_selector` must match node labels.
    """

    job_id: str
    team: str
    gpus: int
    submitted_at: float
    project: str = "default"
    gpu_models: tuple[str, ...] = ()
    priority: int = 0
    priority_class: str = ""
    preemptible: bool | None = None  # None: the priority class decides
    kind: str = "batch"
    gang: bool = False
    gang_nodes: int = 0
    gpus_per_node: int = 0
    gpu_fraction_milli: int = 0
    gpu_memory_mib: int = 0
    mig_profile: str = ""
    min_gpu_memory_mib: int = 0
    prefer_nvlink: bool = True
    prefer_same_topology: bool = True
    cpu_milli: int = 0  # per node
    memory_mib: int = 0  # per node
    max_runtime_s: float | None = None
    node_selector: tuple[tuple[str, str], ...] = ()
    replica_group: str = ""  # replicas of one service (e.g. its job id): spread when the kind says so
    alternatives: tuple[Share, ...] = ()  # other shares tried in order when this one is not placed now


@dataclass(frozen=True, slots=True)
class Allocation:
    """Something already running (what placement granted earlier). One row per node; a gang has one per node.

    `gpu_fraction_milli` > 0 means a fraction of each listed GPU; `mig` lists the MIG instances held.
    """

    job_id: str
    team: str
    node: str
    gpu_uuids: tuple[str, ...] = ()
    started_at: float = 0.0
    project: str = "default"
    priority: int = 0
    priority_class: str = ""
    preemptible: bool | None = None
    gpu_fraction_milli: int = 0
    gpu_memory_mib: int = 0
    mig: tuple[tuple[str, MigInstance], ...] = ()  # (gpu uuid, instance)
    cpu_milli: int = 0
    memory_mib: int = 0
    max_runtime_s: float | None = None
    gpu_model: str = ""
    kind: str = ""  # "": unknown (its priority class alone decides preemptibility)
    replica_group: str = ""


@dataclass(frozen=True, slots=True)
class UsageRecord:
    """Historical consumption of a team, for fair share, accumulated up to `as_of` (the core decays it from there
    with the policy's half-life): GPU-seconds of one model and, optionally, host CPU core-seconds and memory
    MiB-seconds (`gpu_model` may be "" for a record of CPU/memory only)."""

    team: str
    gpu_model: str
    gpu_seconds: float
    as_of: float
    cpu_seconds: float = 0.0  # core-seconds
    memory_mib_seconds: float = 0.0


@dataclass(frozen=True, slots=True)
class Snapshot:
    """Cluster state at one instant: nodes, GPUs held by unknown holders (`allocated_gpus`), running allocations
    (for preemption, quotas and fair share) and usage history."""

    nodes: tuple[Node, ...]
    allocated_gpus: frozenset[str] = field(default_factory=frozenset)
    running: tuple[Allocation, ...] = ()
    usage: tuple[UsageRecord, ...] = ()
