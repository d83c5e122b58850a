"""Mutable, indexed cluster state for one scheduler: what is free where, kept up to date incrementally.

Nodes are grouped by a *key* = (static node class, free state of every GPU, which workload shapes still fit the
node's free CPU/memory). Nodes with the same key are interchangeable for every scorer, so a decision looks at each
distinct key once instead of at every node, and results are memoised per key. A placement or release touches one
node and moves it between groups: no rebuild per cycle.

Every change goes through `take` / `release` and is written to a journal, so what-if searches (gangs,
preemption) can `rollback` to a mark (KAI-style statements).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from libs.core import mig as migcat
from libs.core.model import FRACTIONAL, MIG, WHOLE, Allocation, Snapshot

EXTERNAL = "<external>"  # holder of GPUs listed in Snapshot.allocated_gpus


def _whole_free(dyn: tuple) -> int:
    """Wholly free, healthy, non-MIG GPUs in a node's free state."""
    n = 0
    for d in dyn:
        if d == WHOLE or (d.__class__ is tuple and d[0] == WHOLE and len(d) == 2 and d[1].__class__ is int):
            n += 1
    return n


class GpuState:
    __slots__ = (
        "uuid", "index", "model", "memory_mib", "healthy", "sharing", "nvlink", "numa", "free", "free_mem",
        "busy", "idle", "mig_profiles",
    )

    def __init__(self, gpu):
        self.uuid = gpu.uuid
        self.index = gpu.index
        self.model = gpu.model
        self.memory_mib = gpu.memory_mib
        self.healthy = gpu.healthy
        self.sharing = gpu.sharing
        self.nvlink = gpu.nvlink_domain
        self.numa = gpu.numa_node
        self.free = WHOLE if gpu.sharing != MIG else 0
        self.free_mem = gpu.memory_mib
        self.busy = 0  # MIG: memory slices held by allocated instances
        self.idle: dict[int, str] = {}  # MIG: configured, unallocated instances (start -> profile)
        self.mig_profiles = migcat.profiles_for(gpu.model) if gpu.sharing == MIG else {}
        if gpu.sharing == MIG:
            for inst in gpu.mig_instances:
                self.idle[inst.start] = inst.profile

    def dyn(self):
        if not self.healthy:
            return None
        if self.sharing == MIG:
            return (self.busy, tuple(sorted(self.idle.items())))
        if self.sharing == FRACTIONAL:
            return (self.free, self.free_mem)
        return self.free


@dataclass(slots=True)
class NodeClass:
    """What never changes about a node: its GPUs (model, memory, sharing, NVLink, NUMA, health), labels, size."""

    id: int
    gpus: tuple[tuple, ...]  # (model, memory_mib, sharing, nvlink, numa, healthy) per position
    labels: frozenset
    cpu_cap: int
    mem_cap: int
    models: frozenset
    n_gpus: int


class NodeState:
    __slots__ = (
        "idx", "name", "cluster", "labels", "topology", "cpu_cap", "mem_cap", "cpu_free", "mem_free", "gpus",
        "cls", "key", "schedulable", "hidden",
    )

    def host_fits(self, cpu: int, mem: int) -> bool:
        return (self.cpu_cap == 0 or self.cpu_free >= cpu) and (self.mem_cap == 0 or self.mem_free >= mem)


@dataclass(slots=True)
class Take:
    """One node's part of a job's holding, enough to undo it exactly."""

    job_id: str
    node: int
    positions: tuple[int, ...]
    milli: int  # per GPU (exclusive / fractional)
    gpu_mem: int  # per GPU (fractional)
    cpu: int
    mem: int
    mig: tuple[str, int] | None = None  # (profile, start) on positions[0]
    reused_idle: bool = False
    destroyed: tuple[tuple[int, str], ...] = ()  # idle MIG instances removed to make room


@dataclass(slots=True)
class RunningJob:
    """A running job as preemption, quotas and backfill see it."""

    job_id: str
    team: str
    project: str
    priority: int
    preemptible: bool
    min_runtime_s: float
    started_at: float
    end_at: float  # inf when unknown
    milli_by_model: dict = field(default_factory=dict)
    cpu_milli: int = 0  # host CPU held, all nodes together
    memory_mib: int = 0


class ClusterState:
    def __init__(self, snapshot: Snapshot, host_shapes: tuple[tuple[int, int], ...] = ()):
        self.host_shapes = host_shapes  # (cpu, mem) of the workload shapes, bit i of a key's mask
        self.nodes: list[NodeState] = []
        self.by_name: dict[str, int] = {}
        self.gpu_at: dict[str, tuple[int, int]] = {}
        self.classes: list[NodeClass] = []
        self._class_ids: dict[tuple, int] = {}
        self.groups: dict[int, dict[tuple, dict[int, None]]] = {}  # class id -> key -> nodes (ordered)
        # class id -> number of wholly free GPUs -> keys: whole-GPU requests look only where they can fit
        self.by_free: dict[int, dict[int, dict[tuple, None]]] = {}
        self.key_ids: dict[tuple, int] = {}  # every key ever seen -> a small int, for cheap memo keys
        self.holds: dict[str, list[Take]] = {}
        self.on_node: list[dict[int, Take]] = []  # node index -> takes held there (by id), for reservations
        self.running: dict[str, RunningJob] = {}
        self.journal: list[tuple[str, Take]] = []
        self.capacity: dict[str, int] = {}  # model -> milli-GPUs (healthy, schedulable)
        self.cpu_capacity = 0  # milli-cores of schedulable nodes that track CPU
        self.mem_capacity = 0  # MiB of schedulable nodes that track memory
        for n in sorted(snapshot.nodes, key=lambda n: (n.cluster, n.name)):
            self._add_node(n)
        self.topologies = any(ns.topology for ns in self.nodes)  # some node says its rack: gangs pack by it
        for uuid in snapshot.allocated_gpus:
            at = self.gpu_at.get(uuid)
            if at is None:
                continue
            g = self.nodes[at[0]].gpus[at[1]]
            g.free, g.free_mem, g.busy = 0, 0, (1 << migcat.SLOTS) - 1
            self._reindex(self.nodes[at[0]])
        self.journal.clear()

    # ---- building -------------------------------------------------------------------------------------------

    def _add_node(self, n) -> None:
        ns = NodeState()
        ns.idx = len(self.nodes)
        ns.name, ns.cluster, ns.topology = n.name, n.cluster, n.topology
        ns.labels = frozenset(n.labels)
        ns.cpu_cap = ns.cpu_free = n.cpu_milli
        ns.mem_cap = ns.mem_free = n.memory_mib
        ns.gpus = [GpuState(g) for g in sorted(n.gpus, key=lambda g: g.index)]
        ns.schedulable = n.schedulable
        ns.hidden = False
        # NVLink domains are named per node; the class only needs which GPUs share one (first-seen ordinal)
        doms: dict[str, str] = {}
        for g in ns.gpus:
            if g.nvlink and g.nvlink not in doms:
                doms[g.nvlink] = str(len(doms))
        static = tuple(
            (g.model, g.memory_mib, g.sharing, doms.get(g.nvlink, ""), g.numa, g.healthy) for g in ns.gpus
        )
        ck = (static, ns.labels, ns.cpu_cap, ns.mem_cap)
        cid = self._class_ids.get(ck)
        if cid is None:
            cid = len(self.classes)
            self._class_ids[ck] = cid
            models = frozenset(g.model for g in ns.gpus if g.healthy)
            self.classes.append(NodeClass(cid, static, ns.labels, ns.cpu_cap, ns.mem_cap, models, len(static)))
        ns.cls = cid
        ns.key = None
        self.nodes.append(ns)
        self.on_node.append({})
        self.by_name[n.name] = ns.idx
        for pos, g in enumerate(ns.gpus):
            self.gpu_at[g.uuid] = (ns.idx, pos)
            if g.healthy and ns.schedulable:
                self.capacity[g.model] = self.capacity.get(g.model, 0) + WHOLE
        if ns.schedulable:
            self.cpu_capacity += ns.cpu_cap
            self.mem_capacity += ns.mem_cap
        self._reindex(ns)

    def host_mask(self, ns: NodeState, cpu_used: int = 0, mem_used: int = 0) -> int:
        if not self.host_shapes:
            return 0
        if ns.cpu_cap == 0 and ns.mem_cap == 0:
            return (1 << len(self.host_shapes)) - 1
        cpu = ns.cpu_free - cpu_used if ns.cpu_cap else 1 << 62
        mem = ns.mem_free - mem_used if ns.mem_cap else 1 << 62
        mask = 0
        for i, (c, m) in enumerate(self.host_shapes):
            if cpu >= c and mem >= m:
                mask |= 1 << i
        return mask

    def _reindex(self, ns: NodeState) -> None:
        groups = self.groups.setdefault(ns.cls, {})
        by_free = self.by_free.setdefault(ns.cls, {})
        if ns.key is not None:
            bucket = groups.get(ns.key)
            if bucket is not None:
                bucket.pop(ns.idx, None)
                if not bucket:
                    del groups[ns.key]
                    keys = by_free[_whole_free(ns.key[0])]
                    del keys[ns.key]
        if not ns.schedulable or ns.hidden:
            ns.key = None
            return
        ns.key = (tuple(g.dyn() for g in ns.gpus), self.host_mask(ns))
        bucket = groups.get(ns.key)
        if bucket is None:
            bucket = groups[ns.key] = {}
            if ns.key not in self.key_ids:
                self.key_ids[ns.key] = len(self.key_ids)
            by_free.setdefault(_whole_free(ns.key[0]), {})[ns.key] = None
        bucket[ns.idx] = None

    def set_hidden(self, idx: int, hidden: bool) -> None:
        ns = self.nodes[idx]
        if ns.hidden != hidden:
            ns.hidden = hidden
            self._reindex(ns)

    # ---- changes (journaled) --------------------------------------------------------------------------------

    def take(self, t: Take) -> None:
        ns = self.nodes[t.node]
        for pos in t.positions:
            g = ns.gpus[pos]
            if t.mig is not None:
                name, start = t.mig
                p = g.mig_profiles[name]
                m = p.mask(start)
                if g.idle.get(start) == name:
                    del g.idle[start]
                    t.reused_idle = True
                else:
                    gone = []
                    for s, other in list(g.idle.items()):
                        if g.mig_profiles[other].mask(s) & m:
                            gone.append((s, other))
                            del g.idle[s]
                    t.destroyed = tuple(gone)
                g.busy |= m
            else:
                g.free -= t.milli
                g.free_mem -= t.gpu_mem
        ns.cpu_free -= t.cpu
        ns.mem_free -= t.mem
        self.holds.setdefault(t.job_id, []).append(t)
        self.on_node[t.node][id(t)] = t
        self.journal.append(("take", t))
        self._reindex(ns)

    def _untake(self, t: Take, keep_instance: bool) -> None:
        ns = self.nodes[t.node]
        self.on_node[t.node].pop(id(t), None)
        for pos in t.positions:
            g = ns.gpus[pos]
            if t.mig is not None:
                name, start = t.mig
                g.busy &= ~g.mig_profiles[name].mask(start)
                if keep_instance or t.reused_idle:
                    g.idle[start] = name
                for s, other in t.destroyed:
                    if not keep_instance:
                        g.idle[s] = other
            else:
                g.free += t.milli
                g.free_mem += t.gpu_mem
        ns.cpu_free += t.cpu
        ns.mem_free += t.mem
        self._reindex(ns)

    def release(self, job_id: str) -> list[Take]:
        """The job's holdings become free (its MIG instances stay configured, idle)."""
        takes = self.holds.pop(job_id, [])
        for t in takes:
            self._untake(t, keep_instance=True)
            self.journal.append(("release", t))
        return takes

    def mark(self) -> int:
        return len(self.journal)

    def rollback(self, mark: int) -> None:
        while len(self.journal) > mark:
            op, t = self.journal.pop()
            if op == "take":
                self._untake(t, keep_instance=False)
                lst = self.holds.get(t.job_id)
                if lst:
                    lst.remove(t)
                    if not lst:
                        del self.holds[t.job_id]
            else:  # undo a release: hold it again exactly as before
                ns = self.nodes[t.node]
                for pos in t.positions:
                    g = ns.gpus[pos]
                    if t.mig is not None:
                        name, start = t.mig
                        g.idle.pop(start, None)
                        g.busy |= g.mig_profiles[name].mask(start)
                    else:
                        g.free -= t.milli
                        g.free_mem -= t.gpu_mem
                ns.cpu_free -= t.cpu
                ns.mem_free -= t.mem
                self.holds.setdefault(t.job_id, []).append(t)
                self.on_node[t.node][id(t)] = t
                self._reindex(ns)

    def commit(self) -> None:
        self.journal.clear()

    # ---- running work ---------------------------------------------------------------------------------------

    def add_running(self, alloc: Allocation, meta: RunningJob) -> None:
        """Record an allocation from the snapshot (or one the caller just bound)."""
        idx = self.by_name.get(alloc.node)
        if idx is None:
            return
        ns = self.nodes[idx]
        job = self.running.setdefault(alloc.job_id, meta)
        if alloc.mig:
            for uuid, inst in alloc.mig:
                at = self.gpu_at.get(uuid)
                if at is None or at[0] != idx:
                    continue
                g = ns.gpus[at[1]]
                if inst.profile not in g.mig_profiles:
                    continue
                self.take(Take(alloc.job_id, idx, (at[1],), 0, 0, 0, 0, mig=(inst.profile, inst.start)))
                model = g.model
                job.milli_by_model[model] = job.milli_by_model.get(model, 0) + g.mig_profiles[inst.profile].milli
        positions = tuple(
            self.gpu_at[u][1] for u in alloc.gpu_uuids if u in self.gpu_at and self.gpu_at[u][0] == idx
        )
        if not alloc.mig and (positions or alloc.cpu_milli or alloc.memory_mib):
            milli = alloc.gpu_fraction_milli or WHOLE
            for pos in positions:
                g = ns.gpus[pos]
                job.milli_by_model[g.model] = job.milli_by_model.get(g.model, 0) + milli
            if alloc.gpu_fraction_milli:
                gmem = alloc.gpu_memory_mib
            else:  # a whole GPU takes all of its memory too
                gmem = ns.gpus[positions[0]].memory_mib if positions else 0
            self.take(Take(alloc.job_id, idx, positions, milli, gmem, alloc.cpu_milli, alloc.memory_mib))
        elif alloc.mig and (alloc.cpu_milli or alloc.memory_mib):
            self.take(Take(alloc.job_id, idx, (), 0, 0, alloc.cpu_milli, alloc.memory_mib))
        job.cpu_milli += alloc.cpu_milli
        job.memory_mib += alloc.memory_mib
        self.journal.clear()

    def remove_running(self, job_id: str) -> None:
        self.running.pop(job_id, None)
        self.release(job_id)
        self.journal.clear()

    def used_milli(self) -> int:
        used = 0
        for takes in self.holds.values():
            for t in takes:
                if t.mig is not None:
                    g = self.nodes[t.node].gpus[t.positions[0]]
                    used += g.mig_profiles[t.mig[0]].milli
                else:
                    used += t.milli * len(t.positions)
        return used
