"""Filter and score units: what a request needs (`Shape`), which GPUs of a node class can serve it (`choose`),
and how good a choice is (`Scorer` terms: bin-pack, spread, topology, fragmentation).

Everything here is a pure function of a node's *key* (its class and free state), which is what lets the scheduler
memoise per key. Fragmentation follows FGD (Weng et al., ATC'23): a node's fragmentation for a workload is the
expected free GPU capacity that a request drawn from the workload could not use there; a placement's cost is how
much it raises that expectation.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

from libs.core import mig as migcat
from libs.core.model import EXCLUSIVE, FRACTIONAL, JOB_KINDS, MIG, WHOLE, JobRequest
from libs.core.state import NodeClass

WHOLE_KIND, FRAC_KIND, MIG_KIND, CPU_KIND = "whole", "frac", "mig", "cpu"


@dataclass(frozen=True, slots=True)
class Shape:
    """A request reduced to what placement needs. `members` nodes x `per_node` GPUs; members == 0: a flexible
    gang of `total` GPUs over as few nodes as fit."""

    kind: str
    members: int
    per_node: int
    total: int
    milli: int = WHOLE  # per GPU
    gmem: int = 0
    profile: str = ""
    models: tuple[str, ...] = ()
    min_mem: int = 0
    selector: frozenset = frozenset()
    cpu: int = 0
    mem: int = 0
    prefer_nvlink: bool = True
    prefer_topology: bool = True
    prefer_shared: bool = False  # the job kind prefers shareable GPUs for whole-GPU requests

    @property
    def is_gang(self) -> bool:
        return self.members != 1

    def gpu_milli_total(self, mig_milli: int = 0) -> int:
        if self.kind == MIG_KIND:
            return mig_milli
        if self.kind == FRAC_KIND:
            return self.milli
        if self.kind == CPU_KIND:
            return 0
        return self.total * WHOLE

    def describe(self) -> str:
        models = "|".join(m for m in self.models if m != "*") or "any model"  # "*" is never printed as a model
        if self.kind == MIG_KIND:
            return f"one MIG {self.profile} instance ({models})"
        if self.kind == FRAC_KIND:
            return f"{self.milli / WHOLE:.3g} of a shareable GPU ({models})"
        if self.kind == CPU_KIND:
            return f"{self.cpu} mCPU / {self.mem} MiB and no GPU"
        if self.members == 1:
            return f"{self.per_node} whole GPU(s) of {models} on one node"
        if self.members == 0:
            return f"a gang of {self.total} whole GPU(s) of {models}"
        return f"a gang of {self.members} node(s) x {self.per_node} GPU(s) of {models}"


class Invalid(Exception):
    pass


def normalize(job: JobRequest) -> Shape:
    """The job's Shape, or `Invalid` with the message for an `InvalidRequest` reason."""
    if job.kind not in JOB_KINDS:
        raise Invalid(f"unknown job kind {job.kind!r} (one of {', '.join(JOB_KINDS)})")
    if job.gpus < 0 or job.cpu_milli < 0 or job.memory_mib < 0:
        raise Invalid("negative resource request")
    common = dict(
        models=tuple(sorted(set(job.gpu_models))),
        min_mem=job.min_gpu_memory_mib,
        selector=frozenset(job.node_selector),
        cpu=job.cpu_milli,
        mem=job.memory_mib,
        prefer_nvlink=job.prefer_nvlink,
        prefer_topology=job.prefer_same_topology,
    )
    if job.mig_profile and job.gpu_fraction_milli:
        raise Invalid("ask for a MIG profile or a GPU fraction, not both")
    if job.mig_profile:
        if job.gpus not in (0, 1) or job.gang or job.gang_nodes:
            raise Invalid("a MIG request is one instance (gpus=1)")
        return Shape(MIG_KIND, 1, 1, 1, profile=job.mig_profile, **common)
    if job.gpu_fraction_milli:
        if not 0 < job.gpu_fraction_milli < WHOLE or job.gpus not in (0, 1) or job.gang or job.gang_nodes:
            raise Invalid("a fractional request is 1..999 milli-GPUs of one GPU (gpus=1)")
        if job.gpu_memory_mib < 0:
            raise Invalid("negative GPU memory")
        return Shape(FRAC_KIND, 1, 1, 1, milli=job.gpu_fraction_milli, gmem=job.gpu_memory_mib, **common)
    if job.gang_nodes or job.gpus_per_node:
        if job.gang_nodes < 1 or job.gpus_per_node < 1:
            raise Invalid("a gang shape needs gang_nodes >= 1 and gpus_per_node >= 1")
        total = job.gang_nodes * job.gpus_per_node
        if job.gpus not in (0, total):
            raise Invalid(f"gpus={job.gpus} but gang_nodes x gpus_per_node = {total}")
        return Shape(WHOLE_KIND, job.gang_nodes, job.gpus_per_node, total, **common)
    if job.gpus == 0:
        if job.cpu_milli or job.memory_mib:
            return Shape(CPU_KIND, 1, 0, 0, milli=0, **common)
        raise Invalid("a job must ask for at least one GPU (or CPU/memory)")
    if job.gang and job.gpus > 1:
        return Shape(WHOLE_KIND, 0, job.gpus, job.gpus, **common)
    return Shape(WHOLE_KIND, 1, job.gpus, job.gpus, **common)


# ---- filter: which GPUs of a node class can serve a shape ---------------------------------------------------


def gpu_eligible(static: tuple, shape: Shape, allowed: frozenset) -> bool:
    model, memory, sharing, _nvlink, _numa, healthy = static
    if not healthy or model not in allowed or memory < shape.min_mem:
        return False
    if shape.kind == WHOLE_KIND:
        return sharing != MIG
    if shape.kind == FRAC_KIND:
        return sharing == FRACTIONAL and memory >= shape.gmem
    if shape.kind == MIG_KIND:
        return sharing == MIG and shape.profile in migcat.profiles_for(model)
    return False


@dataclass(frozen=True, slots=True)
class Choice:
    positions: tuple[int, ...]
    mig: tuple[str, int] | None = None
    # 1: one NVLink domain (or a single GPU); 0.75 one NUMA node; 0.5 several NUMA nodes, no NVLink facts; 0 split
    topology: float = 1.0
    mig_score: float = 0.0
    reuse: bool = False


def choose(cls: NodeClass, dyn: tuple, shape: Shape, per_node: int, allowed: frozenset, mode: str) -> tuple:
    """Candidate GPU choices on a node of class `cls` in free state `dyn` (empty tuple: does not fit).

    mode: "first" (lowest index), "tight" (least free capacity that fits), "loose" (most), "frag" (every distinct
    option, for the fragmentation scorer to pick from).
    """
    if shape.kind == CPU_KIND:
        return (Choice(()),)
    statics = cls.gpus
    if shape.kind == WHOLE_KIND:
        by_model: dict[str, list[int]] = {}
        for pos, st in enumerate(statics):
            if gpu_eligible(st, shape, allowed):
                d = dyn[pos]
                free = d if st[2] == EXCLUSIVE else d[0]
                if free == WHOLE:
                    by_model.setdefault(st[0], []).append(pos)
        for model in sorted(by_model):
            pool = by_model[model]
            if len(pool) < per_node:
                continue
            if shape.prefer_shared:  # the kind asks for the shared pool first
                pool = sorted(pool, key=lambda p: (statics[p][2] == EXCLUSIVE, p))
            elif mode == "frag":  # keep shareable GPUs for fractional work: exclusive ones first
                pool = sorted(pool, key=lambda p: (statics[p][2] != EXCLUSIVE, p))
            return (_pick_nvlink(statics, pool, per_node, shape.prefer_nvlink),)
        return ()
    if shape.kind == FRAC_KIND:
        seen: dict[tuple, int] = {}
        for pos, st in enumerate(statics):
            if gpu_eligible(st, shape, allowed):
                free, free_mem = dyn[pos]
                if free >= shape.milli and free_mem >= shape.gmem and (free, free_mem) not in seen:
                    seen[(free, free_mem)] = pos
        if not seen:
            return ()
        if mode == "frag":
            return tuple(Choice((pos,)) for _, pos in sorted(seen.items(), key=lambda kv: (kv[0], kv[1])))
        if mode == "tight":
            key = min(seen)
        elif mode == "loose":
            key = max(seen)
        else:
            return (Choice((min(seen.values()),)),)
        return (Choice((seen[key],)),)
    # MIG: the best (GPU, start) by headroom left for the catalogue, reusing idle instances when possible
    best = None
    for pos, st in enumerate(statics):
        if not gpu_eligible(st, shape, allowed):
            continue
        busy, idle = dyn[pos]
        model = st[0]
        idle_d = dict(idle)
        for start in migcat.free_starts(model, shape.profile, busy):
            p = migcat.profile(model, shape.profile)
            reuse = idle_d.get(start) == shape.profile
            after = busy | p.mask(start)
            room = _mig_room(model, after)
            packed = 1.0 if busy else 0.0
            score = room + 0.25 * packed + (0.5 if reuse else 0.0)
            cand = (score, -pos, -start if mode != "first" else 0, pos, start, reuse)
            if mode == "first":
                cand = (0.0, -pos, -start, pos, start, reuse)
            if best is None or cand > best:
                best = cand
    if best is None:
        return ()
    _, _, _, pos, start, reuse = best
    return (Choice((pos,), mig=(shape.profile, start), mig_score=best[0], reuse=reuse),)


@lru_cache(maxsize=65536)
def _mig_room(model: str, busy: int) -> float:
    """Share of the catalogue's instance placements still open: high means little fragmentation."""
    table = migcat.profiles_for(model)
    open_ = sum(migcat.max_instances(model, name, busy) * p.slots for name, p in table.items())
    full = sum(migcat.max_instances(model, name, 0) * p.slots for name, p in table.items())
    return open_ / full if full else 0.0


def _pick_nvlink(statics: tuple, pool: list[int], k: int, prefer: bool) -> Choice:
    """k GPUs of `pool` (eligible free positions, in preference order), as local as the node's facts allow: one
    NVLink domain (the smallest that fits), inside it one NUMA node when one has room; else one NUMA node (the
    smallest that fits); else as few NUMA nodes as possible. Ties go by `pool` order, so a node without NUMA or
    NVLink facts (every GPU on NUMA node 0, no domain) gets the first k of `pool`, as it always did. Without
    `prefer` (the job does not care), the first k of `pool`."""
    if k == 1:
        return Choice((pool[0],), topology=1.0)
    has_nvlink = any(statics[pos][3] for pos in pool)
    if not prefer:
        chosen = pool[:k]
        return Choice(tuple(sorted(chosen)), topology=_locality(statics, chosen, has_nvlink))
    if has_nvlink:
        domains: dict[str, list[int]] = {}
        for pos in pool:
            domains.setdefault(statics[pos][3], []).append(pos)
        fitting = [(len(v), v[0], d) for d, v in domains.items() if len(v) >= k and d]
        if fitting:
            _, _, d = min(fitting)
            return Choice(tuple(sorted(_numa_pick(statics, domains[d], k))), topology=1.0)
    chosen = _numa_pick(statics, pool, k)
    return Choice(tuple(sorted(chosen)), topology=_locality(statics, chosen, has_nvlink))


def _numa_pick(statics: tuple, cands: list[int], k: int) -> list[int]:
    """k of `cands` on one NUMA node (the smallest with room, then the one whose first GPU comes first), else on
    as few NUMA nodes as possible (the largest first)."""
    numa: dict[int, list[int]] = {}
    for pos in cands:
        numa.setdefault(statics[pos][4], []).append(pos)
    if len(numa) == 1:
        return cands[:k]
    fitting = [(len(v), v[0], n) for n, v in numa.items() if len(v) >= k]
    if fitting:
        _, _, n = min(fitting)
        return numa[n][:k]
    chosen: list[int] = []
    for _, _, n in sorted((-len(v), v[0], n) for n, v in numa.items()):
        chosen.extend(numa[n][: k - len(chosen)])
        if len(chosen) == k:
            break
    return chosen


def _locality(statics: tuple, chosen: list[int], has_nvlink: bool) -> float:
    """The `Choice.topology` score of GPUs that are not all in one NVLink domain (1.0 when they are)."""
    nv = {statics[pos][3] for pos in chosen}
    if len(nv) == 1 and "" not in nv:
        return 1.0
    if len({statics[pos][4] for pos in chosen}) == 1:
        return 0.75
    return 0.0 if has_nvlink else 0.5


def apply_choice(cls: NodeClass, dyn: tuple, choice: Choice, shape: Shape) -> tuple:
    """The GPU part of a node's key after the choice is taken."""
    if not choice.positions:
        return dyn
    out = list(dyn)
    for pos in choice.positions:
        st = cls.gpus[pos]
        d = dyn[pos]
        if choice.mig is not None:
            busy, idle = d
            p = migcat.profile(st[0], choice.mig[0])
            m = p.mask(choice.mig[1])
            idle2 = tuple(
                (s, n) for s, n in idle if not (migcat.profile(st[0], n).mask(s) & m)
            )
            out[pos] = (busy | m, idle2)
        elif st[2] == EXCLUSIVE:
            out[pos] = d - shape.milli if shape.kind == FRAC_KIND else 0
        else:
            free, free_mem = d
            if shape.kind == FRAC_KIND:
                out[pos] = (free - shape.milli, free_mem - shape.gmem)
            else:
                out[pos] = (0, 0)
    return tuple(out)


# ---- fragmentation (FGD) --------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class GpuShape:
    weight: float  # normalised popularity
    gpus: int
    milli: int
    models: frozenset | None
    bit: int  # index into the state's host shapes


def fragmentation(cls: NodeClass, dyn: tuple, mask: int, shapes: tuple[GpuShape, ...],
                  gpuless_share: float = 0.0) -> float:
    """Expected milli-GPUs on the node that a request drawn from `shapes` could not use (MIG GPUs excluded: the MIG
    scorer handles them); a GPU-less request (`gpuless_share` of them) uses none of its free GPUs."""
    frees = []
    total = 0
    for st, d in zip(cls.gpus, dyn, strict=True):
        if d is None or st[2] == MIG:
            frees.append(None)
            continue
        free = d if st[2] == EXCLUSIVE else d[0]
        frees.append(free)
        total += free
    if total <= 0:
        return 0.0
    out = gpuless_share * total
    for s in shapes:
        if not (mask >> s.bit) & 1:
            out += s.weight * total
            continue
        if s.milli < WHOLE:
            lost = 0
            usable = False
            for st, free in zip(cls.gpus, frees, strict=True):
                if free is None:
                    continue
                ok = st[2] == FRACTIONAL and free >= s.milli and (s.models is None or st[0] in s.models)
                if ok:
                    usable = True
                else:
                    lost += free
            out += s.weight * (lost if usable else total)
        else:
            lost = 0
            count = 0
            for st, free in zip(cls.gpus, frees, strict=True):
                if free is None:
                    continue
                if free == WHOLE and (s.models is None or st[0] in s.models):
                    count += 1
                else:
                    lost += free
            out += s.weight * (lost if count >= s.gpus else total)
    return out


def used_share(cls: NodeClass, dyn: tuple) -> float:
    """Fraction of the node's GPU capacity in use (MIG GPUs by memory slices)."""
    if not cls.gpus:
        return 0.0
    used = 0.0
    n = 0
    for st, d in zip(cls.gpus, dyn, strict=True):
        if d is None:
            continue
        n += 1
        if st[2] == MIG:
            used += bin(d[0]).count("1") / migcat.SLOTS
        elif st[2] == EXCLUSIVE:
            used += (WHOLE - d) / WHOLE
        else:
            used += (WHOLE - d[0]) / WHOLE
    return used / n if n else 0.0
