"""In-memory plan applier: checks every plan as the placement service's applier will, then commits it.

It keeps its own ledger, written independently of the core's indexes, so a bug there cannot hide here: no GPU is
held twice, no fraction goes beyond 1000 milli or the GPU's memory, MIG instances form valid layouts and never
replace a busy one, CPU/memory fit, gangs are all or nothing, and a job is never placed twice.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from libs.core import mig as migcat
from libs.core.model import EXCLUSIVE, FRACTIONAL, MIG, WHOLE, JobRequest, Node
from libs.core.plan import Placement, Plan


class PlanRejected(Exception):
    pass


@dataclass
class _Gpu:
    uuid: str
    node: str
    model: str
    memory_mib: int
    sharing: str
    healthy: bool
    used_milli: int = 0
    used_mem: int = 0
    whole_holder: str | None = None
    instances: dict = field(default_factory=dict)  # start -> (profile, holder or None when idle)


@dataclass
class _Node:
    name: str
    schedulable: bool
    cpu_cap: int
    mem_cap: int
    cpu_used: int = 0
    mem_used: int = 0


class Ledger:
    def __init__(self, nodes: tuple[Node, ...] | list[Node], external: frozenset[str] = frozenset()):
        self.gpus: dict[str, _Gpu] = {}
        self.nodes: dict[str, _Node] = {}
        self.holds: dict[str, list[Placement]] = {}
        for n in nodes:
            self.nodes[n.name] = _Node(n.name, n.schedulable, n.cpu_milli, n.memory_mib)
            for g in n.gpus:
                gs = _Gpu(g.uuid, n.name, g.model, g.memory_mib, g.sharing, g.healthy)
                for inst in g.mig_instances:
                    gs.instances[inst.start] = (inst.profile, None)
                if g.uuid in external:
                    gs.whole_holder = "<external>"
                    gs.used_milli = WHOLE
                self.gpus[g.uuid] = gs

    # ---- checks ----------------------------------------------------------------------------------------------

    def _check_one(self, p: Placement, job: JobRequest | None) -> None:
        node = self.nodes.get(p.node)
        if node is None:
            raise PlanRejected(f"{p.job_id}: unknown node {p.node}")
        if not node.schedulable:
            raise PlanRejected(f"{p.job_id}: node {p.node} is not schedulable")
        if len(set(p.gpu_uuids)) != len(p.gpu_uuids):
            raise PlanRejected(f"{p.job_id}: the same GPU listed twice")
        if node.cpu_cap and node.cpu_used + p.cpu_milli > node.cpu_cap:
            raise PlanRejected(f"{p.job_id}: CPU over-allocated on {p.node}")
        if node.mem_cap and node.mem_used + p.memory_mib > node.mem_cap:
            raise PlanRejected(f"{p.job_id}: memory over-allocated on {p.node}")
        for uuid in p.gpu_uuids:
            g = self.gpus.get(uuid)
            if g is None or g.node != p.node:
                raise PlanRejected(f"{p.job_id}: GPU {uuid} is not on {p.node}")
            if not g.healthy:
                raise PlanRejected(f"{p.job_id}: GPU {uuid} is unhealthy")
            if job is not None and job.gpu_models and g.model not in job.gpu_models:
                raise PlanRejected(f"{p.job_id}: GPU {uuid} is a {g.model}, not one of {job.gpu_models}")
            if p.mig is not None:
                if g.sharing != MIG:
                    raise PlanRejected(f"{p.job_id}: MIG instance on non-MIG GPU {uuid}")
                kept = [(prof, s) for s, (prof, holder) in g.instances.items() if holder is not None]
                if not migcat.valid_layout(g.model, kept + [(p.mig.profile, p.mig.start)]):
                    raise PlanRejected(f"{p.job_id}: MIG {p.mig} does not fit next to busy instances on {uuid}")
            elif p.gpu_fraction_milli:
                if g.sharing != FRACTIONAL or g.whole_holder is not None:
                    raise PlanRejected(f"{p.job_id}: fraction on a GPU that is not shareable or held whole")
                if g.used_milli + p.gpu_fraction_milli > WHOLE or g.used_mem + p.gpu_memory_mib > g.memory_mib:
                    raise PlanRejected(f"{p.job_id}: fraction over-allocates GPU {uuid}")
            else:
                if g.sharing not in (EXCLUSIVE, FRACTIONAL):
                    raise PlanRejected(f"{p.job_id}: whole GPU {uuid} is in MIG mode")
                if g.whole_holder is not None or g.used_milli or g.used_mem:
                    raise PlanRejected(f"{p.job_id}: GPU {uuid} is already held")

    def _check_gang(self, job: JobRequest, parts: list[Placement]) -> None:
        if job.mig_profile or job.gpu_fraction_milli:
            if len(parts) != 1 or len(parts[0].gpu_uuids) != 1:
                raise PlanRejected(f"{job.job_id}: a shared request is one GPU on one node")
            return
        nodes = [p.node for p in parts]
        if len(set(nodes)) != len(nodes):
            raise PlanRejected(f"{job.job_id}: two parts on one node")
        total = sum(len(p.gpu_uuids) for p in parts)
        if job.gang_nodes:
            if len(parts) != job.gang_nodes or any(len(p.gpu_uuids) != job.gpus_per_node for p in parts):
                raise PlanRejected(f"{job.job_id}: gang placed partially ({len(parts)}/{job.gang_nodes} nodes)")
        elif job.gang:
            if total != job.gpus:
                raise PlanRejected(f"{job.job_id}: gang placed partially ({total}/{job.gpus} GPUs)")
        elif len(parts) != 1 or total != job.gpus:
            raise PlanRejected(f"{job.job_id}: expected {job.gpus} GPU(s) on one node")

    # ---- apply -----------------------------------------------------------------------------------------------

    def apply(self, plan: Plan, jobs: dict[str, JobRequest] | None = None) -> None:
        """Verify all placements of the plan, then hold them. Raises PlanRejected and changes nothing if any
        check fails. Preemptions are not acted on here (call `release` for each victim)."""
        by_job: dict[str, list[Placement]] = {}
        for p in plan.placements:
            by_job.setdefault(p.job_id, []).append(p)
        for job_id in by_job:
            if job_id in self.holds:
                raise PlanRejected(f"{job_id}: already running")
        for p in plan.preemptions:
            if p.job_id in by_job:
                raise PlanRejected(f"{p.job_id}: placed and preempted in one plan")
        done: list[str] = []
        try:
            for job_id, parts in by_job.items():
                job = (jobs or {}).get(job_id)
                if job is not None:
                    self._check_gang(job, parts)
                for part in parts:
                    self._check_one(part, job)
                    self._hold(part)
                done.append(job_id)
        except PlanRejected:
            for job_id in done + [j for j in by_job if j in self.holds and j not in done]:
                self.release(job_id)
            raise

    def _hold(self, p: Placement) -> None:
        node = self.nodes[p.node]
        node.cpu_used += p.cpu_milli
        node.mem_used += p.memory_mib
        for uuid in p.gpu_uuids:
            g = self.gpus[uuid]
            if p.mig is not None:
                table = migcat.profiles_for(g.model)
                m = table[p.mig.profile].mask(p.mig.start)
                for s, (prof, holder) in list(g.instances.items()):
                    if holder is None and table[prof].mask(s) & m:
                        del g.instances[s]  # an idle instance destroyed to make room
                g.instances[p.mig.start] = (p.mig.profile, p.job_id)
            elif p.gpu_fraction_milli:
                g.used_milli += p.gpu_fraction_milli
                g.used_mem += p.gpu_memory_mib
            else:
                g.whole_holder = p.job_id
                g.used_milli = WHOLE
        self.holds.setdefault(p.job_id, []).append(p)

    def release(self, job_id: str) -> None:
        for p in self.holds.pop(job_id, []):
            node = self.nodes[p.node]
            node.cpu_used -= p.cpu_milli
            node.mem_used -= p.memory_mib
            for uuid in p.gpu_uuids:
                g = self.gpus[uuid]
                if p.mig is not None:
                    g.instances[p.mig.start] = (p.mig.profile, None)  # stays configured, idle
                elif p.gpu_fraction_milli:
                    g.used_milli -= p.gpu_fraction_milli
                    g.used_mem -= p.gpu_memory_mib
                else:
                    g.whole_holder = None
                    g.used_milli = 0

    # ---- measures --------------------------------------------------------------------------------------------

    def allocated_milli(self) -> int:
        total = 0
        for g in self.gpus.values():
            if g.sharing == MIG:
                table = migcat.profiles_for(g.model)
                total += sum(table[prof].milli for prof, h in g.instances.values() if h is not None and prof in table)
            else:
                total += g.used_milli
        return total

    def capacity_milli(self) -> int:
        return sum(WHOLE for g in self.gpus.values() if g.healthy and self.nodes[g.node].schedulable)

    def invariants(self) -> None:
        """Raise AssertionError if the ledger itself is inconsistent (used by property tests)."""
        for g in self.gpus.values():
            assert 0 <= g.used_milli <= WHOLE, g
            assert 0 <= g.used_mem <= g.memory_mib or g.whole_holder is not None, g
            if g.sharing == MIG:
                assert migcat.valid_layout(g.model, [(p, s) for s, (p, _) in g.instances.items()]), g
        for n in self.nodes.values():
            assert n.cpu_cap == 0 or n.cpu_used <= n.cpu_cap, n
            assert n.mem_cap == 0 or n.mem_used <= n.mem_cap, n

    def hold_allocations(self, allocations) -> None:
        """Take over what a snapshot says is running (checked like any placement)."""
        for a in allocations:
            if a.mig:
                parts = [
                    Placement(a.job_id, "", a.node, (uuid,), (), mig=inst,
                              cpu_milli=a.cpu_milli if i == 0 else 0, memory_mib=a.memory_mib if i == 0 else 0)
                    for i, (uuid, inst) in enumerate(a.mig)
                ]
            else:
                parts = [Placement(a.job_id, "", a.node, a.gpu_uuids, (), gpu_fraction_milli=a.gpu_fraction_milli,
                                   gpu_memory_mib=a.gpu_memory_mib, cpu_milli=a.cpu_milli, memory_mib=a.memory_mib)]
            for p in parts:
                self._check_one(p, None)
                self._hold(p)
