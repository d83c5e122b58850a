"""The scheduling cycle: `schedule(snapshot, pending, policy, now) -> Plan`.

Phases (each a small unit, see README.md):

1. normalise requests (`fit.normalize`), resolve priority classes;            InvalidRequest
2. order: priority -> fair share (dominant share, half-life-decayed) -> submit time -> id;
3. per job: quota admission per GPU model (`quota.QuotaLedger`);              QuotaExceeded
4. filter -> score -> select over node groups (`fit`), gangs all-or-nothing;  NoFeasibleNode, WaitingForGang
5. if blocked: preemption search (decide only) or a reservation for a big job; Preempting, ReservedForGang
6. the plan: placements, preemptions, MIG reconfigurations, reservations, a reason for every pending job.

Deterministic: the same inputs give the same plan. `Scheduler` keeps its indexes between cycles for callers that
feed it changes (the simulator); `schedule` builds one from a snapshot.
"""

from __future__ import annotations

import heapq
import math
from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import replace

from libs.core import mig as migcat
from libs.core.backfill import plan_reservation
from libs.core.fit import (
    CPU_KIND,
    FRAC_KIND,
    MIG_KIND,
    WHOLE_KIND,
    Choice,
    GpuShape,
    Invalid,
    Shape,
    apply_choice,
    choose,
    fragmentation,
    gpu_eligible,
    normalize,
    used_share,
)
from libs.core.model import EXCLUSIVE, WHOLE, Allocation, JobRequest, MigInstance, Snapshot
from libs.core.plan import MigReconfig, PendingReason, Placement, Plan, Preemption, Reservation
from libs.core.policy import KindPolicy, Policy, PriorityClass, WorkloadShape
from libs.core.preempt import find_victims
from libs.core.quota import QuotaLedger
from libs.core.reasons import (
    BLOCKED_BY_QUEUE_HEAD,
    INVALID_REQUEST,
    NO_FEASIBLE_NODE,
    NO_NODE_MATCHES_SELECTOR,
    PREEMPTED_BY_PRIORITY,
    PREEMPTING,
    QUOTA_EXCEEDED,
    RESERVED_FOR_GANG,
    WAITING_FOR_GANG,
)
from libs.core.state import ClusterState, RunningJob, Take

INF = math.inf
_CPU, _MEM = "<cpu>", "<memory>"  # fair-share history keys next to GPU model names

def derive_workload(jobs: Iterable[JobRequest], limit: int = 32,
                    demand_weighted: bool = True) -> tuple[WorkloadShape, ...]:
    """The most common GPU request shapes among `jobs` (by count of GPUs, share, models, MIG profile), weighted by
    how often they occur; each carries the median CPU/memory of its requests."""
    groups: dict[tuple, list[tuple[int, int]]] = {}
    for j in jobs:
        models = tuple(sorted(j.gpu_models))
        if j.mig_profile:
            key = (1, WHOLE, models, j.mig_profile)
        elif j.gpu_fraction_milli:
            key = (1, j.gpu_fraction_milli, models, "")
        elif j.gpus > 0:
            key = (min(j.gpus_per_node or j.gpus, 8), WHOLE, models, "")
        else:
            continue
        groups.setdefault(key, []).append((j.cpu_milli, j.memory_mib))
    top = sorted(groups.items(), key=lambda kv: (-len(kv[1]), kv[0]))[:limit]
    out = []
    for (g, m, models, prof), hosts in top:
        cpus = sorted(h[0] for h in hosts)
        mems = sorted(h[1] for h in hosts)
        weight = len(hosts) * g * m / WHOLE if demand_weighted else float(len(hosts))
        out.append(WorkloadShape(gpus=g, gpu_milli=m, weight=weight, cpu_milli=cpus[len(cpus) // 2],
                                 memory_mib=mems[len(mems) // 2], gpu_models=models, mig_profile=prof))
    return tuple(out)


def _class_of(classes: tuple[PriorityClass, ...], by_name: dict, name: str, value: int) -> PriorityClass | None:
    if name:
        return by_name.get(name)
    best = None
    for c in classes:
        if c.value <= value and (best is None or c.value > best.value):
            best = c
    if best is None and classes:
        best = min(classes, key=lambda c: c.value)
    return best


# Phases of a cycle timed in Plan.stats as "<phase>_us" when the caller injects a clock: normalise and resolve
# classes (plus fair-share history), order (fair-share queue), quota admission, filter/score/select, diagnosing a
# blocked job's reason, the preemption search, reservations for backfill, and finishing the plan.
PHASES = ("normalize", "order", "quota", "place", "reasons", "preemption", "backfill", "finish")


class _Laps:
    """Time spent per phase: `to(phase)` charges the time since the last switch to the phase being left."""

    __slots__ = ("clock", "t", "cur", "acc")

    def __init__(self, clock: Callable[[], float]):
        self.clock = clock
        self.t = clock()
        self.cur = "normalize"
        self.acc: dict[str, float] = {}

    def to(self, phase: str) -> None:
        t = self.clock()
        self.acc[self.cur] = self.acc.get(self.cur, 0.0) + (t - self.t)
        self.t = t
        self.cur = phase


class Scheduler:
    """Scheduling state that outlives one cycle. `schedule()` is the one-shot form.

    `clock` (optional, e.g. `time.perf_counter`): when given, each cycle reports the time spent per phase in
    `Plan.stats` (`<phase>_us`); the core never reads a clock of its own.
    """

    def __init__(self, snapshot: Snapshot, policy: Policy, workload: tuple[WorkloadShape, ...] = (),
                 clock: Callable[[], float] | None = None):
        self.clock = clock
        self.policy = policy
        self.classes_by_name = {c.name: c for c in policy.priority_classes}
        workload = workload or policy.workload
        self.workload = workload
        host = tuple(dict.fromkeys((w.cpu_milli, w.memory_mib) for w in workload)) if policy.setting("w_frag") else ()
        self.host_bit = {hm: i for i, hm in enumerate(host)}
        total = sum(w.weight for w in workload if w.gpus > 0 and not w.mig_profile) or 1.0
        self.gpu_shapes = tuple(
            GpuShape(w.weight / total, w.gpus, w.gpu_milli, frozenset(w.gpu_models) or None,
                     self.host_bit.get((w.cpu_milli, w.memory_mib), 0))
            for w in workload
            if w.gpus > 0 and not w.mig_profile
        )
        self.state = ClusterState(snapshot, host)
        self._cache_settings()
        self.history = snapshot.usage
        self._frag_memo: dict = {}
        self._choose_memo: dict = {}
        self._class_memo: dict = {}
        self._elig_memo: dict = {}
        self._n_scored = 0
        self._shape_ids: dict = {}
        self._sticky: dict[str, tuple[list[int], float]] = {}  # reservations carried to the next cycle
        self.preempt_note = ""  # why the last preemption search chose to wait (preempt.worth_it)
        self._pack = 0.0  # extra bin-packing weight of the job being placed (its kind's)
        self._n_finite = 0  # running jobs with a declared end (without any, every reservation's start is unknown)
        self._norm_cache: dict[str, tuple] = {}  # job id -> (request object, normalised form), across cycles
        self._models = sorted(self.state.capacity)
        self._model_mem: dict[str, int] = {}
        for ns in self.state.nodes:
            for g in ns.gpus:
                self._model_mem[g.model] = max(self._model_mem.get(g.model, 0), g.memory_mib)
        self.team_alloc: dict[tuple[str, str], int] = {}  # (team, model) -> milli held
        self.usage_tp: dict[tuple[str, str, str], int] = {}  # (team, project, model) -> milli held
        self.team_host: dict[str, tuple[int, int]] = {}  # team -> (CPU milli-cores, memory MiB) held
        self._kinds: dict[str, KindPolicy] = {k.kind: k for k in policy.kinds}
        self.group_nodes: dict[str, dict[int, int]] = {}  # replica group -> node index -> members there
        self._job_group: dict[str, tuple[str, list[int]]] = {}
        self._by_topology: dict[str, list[int]] = {}
        for ns in self.state.nodes:
            if ns.topology:
                self._by_topology.setdefault(ns.topology, []).append(ns.idx)
        self._weights = {}  # team -> over-quota weight (from the team's quota entry; 1 without one)
        for e in policy.quotas.entries:
            if e.path.count("/") == 1:
                self._weights.setdefault(e.path.split("/", 1)[1], e.weight or 1.0)
        by_job: dict[str, list[Allocation]] = {}
        for a in snapshot.running:
            by_job.setdefault(a.job_id, []).append(a)
        for job_id in sorted(by_job):
            for a in by_job[job_id]:
                self.bind_allocation(a)

    # ---- feeding changes (incremental) ---------------------------------------------------------------------

    def _resolve(self, name: str, value: int, preemptible: bool | None, kind: str = "") -> tuple[int, bool, float] | None:
        """(priority, preemptible, minimum runtime). A job's own flag wins; else it is preemptible only when
        neither its class nor its kind protects it."""
        c = _class_of(self.policy.priority_classes, self.classes_by_name, name, value)
        if name and c is None:
            return None
        prio = c.value if name else value
        if preemptible is not None:
            pre = preemptible
        else:
            pre = (c.preemptible if c else True) and not (kind and self._kind(kind).preemptible is False)
        min_rt = c.min_runtime_s if c is not None and c.min_runtime_s is not None else self.policy.min_runtime_s
        return prio, pre, min_rt

    def bind_allocation(self, a: Allocation) -> None:
        """Account an allocation granted outside this scheduler (or from the snapshot)."""
        resolved = self._resolve(a.priority_class, a.priority, a.preemptible, a.kind) or (a.priority, True, 0.0)
        prio, pre, min_rt = resolved
        end = a.started_at + a.max_runtime_s if a.max_runtime_s is not None else INF
        meta = RunningJob(a.job_id, a.team, a.project, prio, pre, min_rt, a.started_at, end)
        prev = self.state.running.get(a.job_id)
        before = dict(prev.milli_by_model) if prev is not None else {}
        host_before = (prev.cpu_milli, prev.memory_mib) if prev is not None else (0, 0)
        self.state.add_running(a, meta)
        rj = self.state.running.get(a.job_id)
        if rj is None:
            return
        if prev is None and rj.end_at < INF:
            self._n_finite += 1
        if a.replica_group:
            self._join_group(a.job_id, a.replica_group, [self.state.by_name[a.node]])
        for model, milli in rj.milli_by_model.items():
            d = milli - before.get(model, 0)
            if d:
                self._account(a.team, a.project, model, d)
        self._account_host(a.team, rj.cpu_milli - host_before[0], rj.memory_mib - host_before[1])

    def finish(self, job_id: str) -> None:
        """A job ended or was evicted: free what it held."""
        rj = self.state.running.get(job_id)
        if rj is not None:
            for model, milli in rj.milli_by_model.items():
                self._account(rj.team, rj.project, model, -milli)
            self._account_host(rj.team, -rj.cpu_milli, -rj.memory_mib)
            if rj.end_at < INF:
                self._n_finite -= 1
        self._leave_group(job_id)
        self.state.remove_running(job_id)

    def _join_group(self, job_id: str, group: str, idxs: list[int]) -> None:
        members = self.group_nodes.setdefault(group, {})
        for i in idxs:
            members[i] = members.get(i, 0) + 1
        _, held = self._job_group.get(job_id, (group, []))
        self._job_group[job_id] = (group, held + list(idxs))

    def _leave_group(self, job_id: str) -> None:
        got = self._job_group.pop(job_id, None)
        if got is None:
            return
        group, idxs = got
        members = self.group_nodes.get(group, {})
        for i in idxs:
            members[i] -= 1
            if members[i] <= 0:
                del members[i]
        if not members:
            self.group_nodes.pop(group, None)

    def _spread_tiers(self, group: str) -> list[set[int]]:
        """Nodes to avoid for another replica of `group`, strictest first: its racks, then its nodes."""
        members = self.group_nodes.get(group)
        if not members:
            return []
        nodes = set(members)
        domains = {self.state.nodes[i].topology for i in nodes} - {""}
        racks = nodes.union(*(self._by_topology[d] for d in domains)) if domains else nodes
        return [racks, nodes] if racks != nodes else [nodes]

    def _kind(self, name: str) -> KindPolicy:
        k = self._kinds.get(name)
        if k is None:
            k = self._kinds[name] = self.policy.kind(name)
        return k

    def _account(self, team: str, project: str, model: str, delta: int) -> None:
        key = (team, model)
        self.team_alloc[key] = self.team_alloc.get(key, 0) + delta
        k3 = (team, project, model)
        self.usage_tp[k3] = self.usage_tp.get(k3, 0) + delta

    def _account_host(self, team: str, cpu: int, mem: int) -> None:
        if cpu or mem:
            held = self.team_host.get(team, (0, 0))
            self.team_host[team] = (held[0] + cpu, held[1] + mem)

    # ---- helpers ---------------------------------------------------------------------------------------------

    def _sid(self, shape: Shape) -> int:
        sid = self._shape_ids.get(shape)
        if sid is None:
            sid = self._shape_ids[shape] = len(self._shape_ids)
        return sid

    def _classes_for(self, shape: Shape, allowed: frozenset) -> list[int]:
        key = (shape, allowed)
        out = self._class_memo.get(key)
        if out is None:  # classes with a GPU that could ever serve the shape (model, memory, sharing mode)
            out = [
                c.id
                for c in self.state.classes
                if shape.selector <= c.labels
                and (shape.kind == CPU_KIND or any(gpu_eligible(st, shape, allowed) for st in c.gpus))
                and (not c.cpu_cap or c.cpu_cap >= shape.cpu) and (not c.mem_cap or c.mem_cap >= shape.mem)
            ]
            self._class_memo[key] = out
        return out

    def _choices(self, cid: int, dyn: tuple, shape: Shape, sid: int, per_node: int, allowed: frozenset,
                 mode: str, kid: int | None = None) -> tuple:
        key = (kid, sid, per_node, allowed, mode) if kid is not None else (cid, dyn, sid, per_node, allowed, mode)
        out = self._choose_memo.get(key)
        if out is None:
            if len(self._choose_memo) > 400_000:
                self._choose_memo.clear()
            out = choose(self.state.classes[cid], dyn, shape, per_node, allowed, mode)
            self._choose_memo[key] = out
        return out

    def _frag(self, cid: int, dyn: tuple, mask: int) -> float:
        key = (cid, dyn, mask)
        v = self._frag_memo.get(key)
        if v is None:
            if len(self._frag_memo) > 400_000:
                self._frag_memo.clear()
            v = fragmentation(self.state.classes[cid], dyn, mask, self.gpu_shapes)
            self._frag_memo[key] = v
        return v

    def _cache_settings(self) -> None:
        p = self.policy
        self._w_frag = p.setting("w_frag")
        self._w_binpack = p.setting("w_binpack")
        self._w_spread = p.setting("w_spread")
        self._w_topology = p.setting("w_topology")
        self._max_candidates = p.max_candidates
        self._mode_v = self._mode()

    def _mode(self) -> str:
        p = self.policy
        if p.setting("fit") == "first":
            return "first"
        if p.setting("w_frag") > 0:
            return "frag"
        return "loose" if p.setting("w_spread") > p.setting("w_binpack") else "tight"

    def _rep(self, bucket: dict, shape: Shape, exclude: set, domain: str | None, lowest: bool):
        nodes = self.state.nodes
        host = bool(shape.cpu or shape.mem)
        best = None
        scanned = 0
        for idx in bucket:
            ns = nodes[idx]
            if idx in exclude or (host and not ns.host_fits(shape.cpu, shape.mem)):
                continue
            if lowest:
                if best is None or idx < best.idx:
                    best = ns
                continue
            if domain is None or ns.topology == domain:
                return ns
            if best is None:
                best = ns
            scanned += 1
            if scanned > 64:
                break
        return best

    def _score(self, cid: int, dyn: tuple, mask: int, rep, choice: Choice, shape: Shape,
               domain: str | None) -> float:
        cls = self.state.classes[cid]
        after = apply_choice(cls, dyn, choice, shape)
        s = 0.0
        w_frag = self._w_frag
        if w_frag:
            if shape.kind == MIG_KIND:
                s += w_frag * choice.mig_score
            elif self.gpu_shapes:
                mask_after = self.state.host_mask(rep, shape.cpu, shape.mem)
                d = self._frag(cid, after, mask_after) - self._frag(cid, dyn, mask)
                s -= w_frag * d / WHOLE
        wb, ws = self._w_binpack + self._pack, self._w_spread
        if shape.prefer_shared and choice.positions:
            statics = cls.gpus
            s += sum(statics[p][2] != EXCLUSIVE for p in choice.positions) / len(choice.positions)
        if wb or ws:
            # packing measure: GPUs in use after the choice, averaged with CPU in use where the node tracks CPU,
            # so that ties go to the node whose spare capacity is smallest (big nodes stay free for big jobs)
            u = used_share(cls, after) if shape.kind != CPU_KIND else 0.0
            if rep.cpu_cap:
                cpu_u = 1.0 - (rep.cpu_free - shape.cpu) / rep.cpu_cap
                u = cpu_u if shape.kind == CPU_KIND else (u + cpu_u) / 2
            s += wb * u + ws * (1.0 - u)
        wt = self._w_topology
        if wt:
            s += wt * choice.topology
            if domain is not None and rep.topology == domain:
                s += wt
        return s

    def _best(self, shape: Shape, sid: int, per_node: int, allowed: frozenset, exclude: set,
              domain: str | None):
        """Filter -> score -> select: the best (node, choice) for one node's part of the request. At most
        `policy.max_candidates` feasible keys are scored (0: all), visited best first."""
        mode = self._mode_v
        best = None
        best_key = None
        limit = self._max_candidates if mode != "first" else 0
        seen = 0
        kids = self.state.key_ids
        memo = self._choose_memo
        for cid in self._classes_for(shape, allowed):
            groups = self.state.groups.get(cid, {})
            if shape.kind == WHOLE_KIND:
                by_free = self.state.by_free.get(cid, {})
                counts = sorted((c for c in by_free if c >= per_node and by_free[c]), reverse=(mode == "loose"))
                keys = [k for c in counts for k in by_free[c]]
            else:
                keys = groups
            for key in keys:
                kid = kids[key]
                cands = memo.get((kid, sid, per_node, allowed, mode))
                if cands is None:
                    cands = self._choices(cid, key[0], shape, sid, per_node, allowed, mode, kid)
                if not cands:
                    continue
                bucket = groups[key]
                dyn, mask = key
                rep = self._rep(bucket, shape, exclude, domain, mode == "first")
                if rep is None:
                    continue
                if mode == "first":
                    k = (0.0, -rep.idx)
                    if best_key is None or k > best_key:
                        best_key, best = k, (rep.idx, cands[0])
                    continue
                self._n_scored += 1
                for c in cands:
                    k = (self._score(cid, dyn, mask, rep, c, shape, domain), -rep.idx)
                    if best_key is None or k > best_key:
                        best_key, best = k, (rep.idx, c)
                seen += 1
                if limit and seen >= limit:
                    return best
        return best

    def _whole_count(self, cid: int, dyn: tuple, shape: Shape, allowed: frozenset) -> int:
        cls = self.state.classes[cid]
        counts: dict[str, int] = {}
        for st, d in zip(cls.gpus, dyn, strict=True):
            if gpu_eligible(st, shape, allowed):
                free = d if not isinstance(d, tuple) else d[0]
                if free == WHOLE:
                    counts[st[0]] = counts.get(st[0], 0) + 1
        return max(counts.values(), default=0)

    def _take(self, job: JobRequest, idx: int, choice: Choice, shape: Shape) -> Take:
        ns = self.state.nodes[idx]
        if shape.kind == WHOLE_KIND:
            gmem = ns.gpus[choice.positions[0]].memory_mib
            t = Take(job.job_id, idx, choice.positions, WHOLE, gmem, shape.cpu, shape.mem)
        elif shape.kind == FRAC_KIND:
            t = Take(job.job_id, idx, choice.positions, shape.milli, shape.gmem, shape.cpu, shape.mem)
        elif shape.kind == MIG_KIND:
            t = Take(job.job_id, idx, choice.positions, 0, 0, shape.cpu, shape.mem, mig=choice.mig)
        else:
            t = Take(job.job_id, idx, (), 0, 0, shape.cpu, shape.mem)
        self.state.take(t)
        return t

    def _place(self, job: JobRequest, shape: Shape, sid: int, allowed: frozenset,
               avoid: set[int] | None = None) -> list[Take] | None:
        """All-or-nothing placement of every part of the job, never on the nodes in `avoid`; None (and nothing
        changed) when it does not fit."""
        st = self.state
        mark = st.mark()
        takes: list[Take] = []
        used: set[int] = set(avoid) if avoid else set()
        domain = None
        if shape.members >= 1:
            for _ in range(shape.members):
                got = self._best(shape, sid, shape.per_node, allowed, used, domain)
                if got is None:
                    st.rollback(mark)
                    return None
                idx, choice = got
                takes.append(self._take(job, idx, choice, shape))
                used.add(idx)
                if shape.is_gang and shape.prefer_topology and domain is None:
                    domain = st.nodes[idx].topology
            return takes
        remaining = shape.total
        while remaining > 0:
            pick = None
            pick_key = None
            levels: list[tuple[int, int, tuple]] = []  # (free count, class, key), most free first
            for cid in self._classes_for(shape, allowed):
                for c, keys in st.by_free.get(cid, {}).items():
                    if c > 0:
                        levels.extend((c, cid, key) for key in keys)
            levels.sort(key=lambda x: -min(x[0], remaining))
            best_level = None
            for c, cid, key in levels:
                if best_level is not None and min(c, remaining) < best_level:
                    break
                n = min(self._whole_count(cid, key[0], shape, allowed), remaining)
                if n <= 0:
                    continue
                rep = self._rep(st.groups[cid][key], shape, used, domain, False)
                if rep is None:
                    continue
                k = (n, domain is not None and rep.topology == domain, -rep.idx)
                if pick_key is None or k > pick_key:
                    pick_key, pick = k, (rep.idx, n)
                    best_level = n
            if pick is None:
                st.rollback(mark)
                return None
            idx, n = pick
            ns = st.nodes[idx]
            dyn = tuple(g.dyn() for g in ns.gpus)
            choice = self._choices(ns.cls, dyn, shape, sid, n, allowed, "tight" if self._mode_v == "frag"
                                   else self._mode_v)
            if not choice:
                st.rollback(mark)
                return None
            takes.append(self._take(job, idx, choice[0], shape))
            used.add(idx)
            remaining -= n
            if shape.prefer_topology and domain is None:
                domain = ns.topology
        return takes

    def _fits_node(self, idx: int, shape: Shape, sid: int, allowed: frozenset) -> bool:
        ns = self.state.nodes[idx]
        if not ns.schedulable or not ns.host_fits(shape.cpu, shape.mem) or not shape.selector <= ns.labels:
            return False
        dyn = tuple(g.dyn() for g in ns.gpus)
        return bool(self._choices(ns.cls, dyn, shape, sid, shape.per_node, allowed, "first"))

    def _amount(self, shape: Shape, model: str) -> int:
        if shape.kind == MIG_KIND:
            p = migcat.profile(model, shape.profile)
            return p.milli if p else 0
        return shape.gpu_milli_total()

    def _models_for(self, shape: Shape) -> list[str]:
        if shape.kind == CPU_KIND:
            return list(self._models)
        out = []
        for m in self._models:
            if shape.models and m not in shape.models:
                continue
            if self._model_mem.get(m, 0) < shape.min_mem:
                continue
            if shape.kind == MIG_KIND and shape.profile not in migcat.profiles_for(m):
                continue
            out.append(m)
        return out

    def _share(self, team: str, now: float) -> float:
        """Dominant-resource share (DRF): the largest, over GPU models, host CPU and host memory, of (held +
        half-life-decayed history) / capacity, divided by the team's over-quota weight."""
        best = 0.0
        hist = self._hist
        for model, c in self.state.capacity.items():
            if c > 0:
                use = self.team_alloc.get((team, model), 0) + hist.get((team, model), 0.0)
                if use > best * c:
                    best = use / c
        cpu, mem = self.team_host.get(team, (0, 0))
        st = self.state
        if st.cpu_capacity:
            best = max(best, (cpu + hist.get((team, _CPU), 0.0)) / st.cpu_capacity)
        if st.mem_capacity:
            best = max(best, (mem + hist.get((team, _MEM), 0.0)) / st.mem_capacity)
        # quantised so that negligible differences (long-decayed history) leave the order to submit time
        return round(best / self._weights.get(team, 1.0), 4)

    # ---- the cycle -------------------------------------------------------------------------------------------

    def cycle(self, pending: Iterable[JobRequest], now: float) -> Plan:
        p = self.policy
        st = self.state
        laps = _Laps(self.clock) if self.clock is not None else None
        st.commit()
        self._n_scored = 0
        n_searches = 0
        n_groups = sum(len(g) for g in st.groups.values())
        jobs: dict[str, JobRequest] = {}
        for j in pending:
            jobs.setdefault(j.job_id, j)
        hl = p.fair_share_half_life_s
        # history as an average amount held over the half-life window (so it adds to what is held now): the
        # decayed integral divided by the window's length hl / ln 2; GPUs in milli, CPU in milli-cores, MiB
        self._hist: dict[tuple[str, str], float] = {}
        if hl > 0:
            window = hl / math.log(2)
            for u in self.history:
                f = 0.5 ** (max(0.0, now - u.as_of) / hl) / window
                for key, amount in (((u.team, u.gpu_model), u.gpu_seconds * WHOLE), ((u.team, _CPU), u.cpu_seconds
                                    * 1000), ((u.team, _MEM), u.memory_mib_seconds)):
                    if amount:
                        self._hist[key] = self._hist.get(key, 0.0) + amount * f

        ledger = QuotaLedger(p.quotas, st.capacity, p.strict_quota)
        if ledger.has_entries:
            for (team, project, model), milli in self.usage_tp.items():
                ledger.add(ledger.paths(team, project), model, milli)

        placements: list[Placement] = []
        reasons: list[PendingReason] = []
        preemptions: list[Preemption] = []
        reservations: list[Reservation] = []
        reconfigs: dict[tuple[str, str], tuple[list, list]] = {}
        reserved: dict[int, tuple[str, float]] = {}
        nominated: set[int] = set()
        victims: set[str] = set()  # chosen victims and jobs placed this cycle: not preemptible again now
        fail_memo: dict = {}
        preempt_fail: set = set()

        meta: dict[str, tuple] = {}
        valid: list[JobRequest] = []
        cache = self._norm_cache
        if len(cache) > 200_000:
            cache.clear()
        for j in jobs.values():
            hit = cache.get(j.job_id)
            if hit is None or hit[0] is not j:
                r = self._resolve(j.priority_class, j.priority, j.preemptible, j.kind)
                if r is None:
                    hit = (j, (INVALID_REQUEST, f"unknown priority class {j.priority_class!r}"))
                else:
                    try:
                        shape = normalize(j)
                        if self._kind(j.kind).prefer_shared:
                            shape = replace(shape, prefer_shared=True)
                        hit = (j, (shape, *r))
                    except Invalid as e:
                        hit = (j, (INVALID_REQUEST, str(e)))
                cache[j.job_id] = hit
            m = hit[1]
            if m[0] == INVALID_REQUEST:
                reasons.append(PendingReason(j.job_id, INVALID_REQUEST, m[1]))
                continue
            meta[j.job_id] = m
            valid.append(j)

        # reservations made last cycle hold for jobs still pending, also against jobs ordered before them now
        for rid, (idxs, start_by) in self._sticky.items():
            if rid in jobs:
                for i in idxs:
                    if i not in reserved:
                        reserved[i] = (rid, start_by)
                        st.set_hidden(i, True)
        new_sticky: dict[str, tuple[list[int], float]] = {}
        draining = False
        reserve_tries = 0
        reserve_memo: set = set()
        # running work that may be preempted at all this cycle (preemptible and past its minimum runtime)
        self._eligible_victims = [
            rj for _, rj in sorted(st.running.items())
            if rj.preemptible and now - rj.started_at >= rj.min_runtime_s
        ] if p.setting("preemption") else []

        order = p.setting("order")
        head_of_line = p.setting("head_of_line")
        blocked_by: str | None = None
        placed_flag = [False]

        def sequence():
            if order == "fifo":
                yield from sorted(valid, key=lambda j: (j.submitted_at, j.job_id))
                return
            if order == "priority":
                yield from sorted(valid, key=lambda j: (-meta[j.job_id][1], j.submitted_at, j.job_id))
                return
            by_prio: dict[int, dict[str, list[JobRequest]]] = {}
            for j in valid:
                by_prio.setdefault(meta[j.job_id][1], {}).setdefault(j.team, []).append(j)
            for prio in sorted(by_prio, reverse=True):
                queues = {t: deque(sorted(js, key=lambda j: (j.submitted_at, j.job_id)))
                          for t, js in by_prio[prio].items()}
                heap = [(self._share(t, now), q[0].submitted_at, q[0].job_id, t) for t, q in queues.items()]
                heapq.heapify(heap)
                while heap:
                    share, _, _, team = heapq.heappop(heap)
                    q = queues[team]
                    job = q.popleft()
                    placed_flag[0] = False
                    yield job
                    if q:
                        s = self._share(team, now) if placed_flag[0] else share
                        heapq.heappush(heap, (s, q[0].submitted_at, q[0].job_id, team))

        jobs_in_order = sequence()
        while True:
            if laps:
                laps.to("order")
            job = next(jobs_in_order, None)
            if job is None:
                break
            if laps:
                laps.to("quota")
            shape, prio, preemptible, _min_rt = meta[job.job_id]
            self._pack = self._kind(job.kind).pack  # the kind's packing weight, for every score of this job
            if blocked_by is not None:
                reasons.append(PendingReason(job.job_id, BLOCKED_BY_QUEUE_HEAD,
                                             f"FIFO: waiting behind {blocked_by}, which does not fit yet"))
                continue
            paths = ledger.paths(job.team, job.project)
            models = self._models_for(shape)
            if not models:
                reasons.append(PendingReason(job.job_id, NO_FEASIBLE_NODE,
                                             f"no GPU model in the cluster can serve {shape.describe()}"))
                continue
            allowed_l = []
            quota_msg = None
            # non-preemptible work may not borrow: what is borrowed must stay reclaimable
            in_guarantee = not preemptible and p.nonpreemptible_within_guarantee and ledger.has_entries
            for m in models:
                amount = self._amount(shape, m)
                msg = ledger.check(paths, m, amount)
                if msg is None and in_guarantee and amount and not ledger.within_guarantee(paths, m, amount):
                    msg = (f"{job.job_id} is not preemptible, so it may use only {paths[1]}'s guarantee "
                           f"({ledger.guaranteed(paths[1], m) / WHOLE:g} {m} GPU(s), "
                           f"{ledger.team_used(paths[1], m) / WHOLE:g} in use); submit it preemptible to borrow")
                if msg is None:
                    allowed_l.append(m)
                elif quota_msg is None:
                    quota_msg = msg
            if not allowed_l:
                reasons.append(PendingReason(job.job_id, QUOTA_EXCEEDED, quota_msg or "over quota"))
                continue
            allowed = frozenset(allowed_l)
            if laps:
                laps.to("place")
            sid = self._sid(shape)
            own = [i for i, (rid, _) in reserved.items() if rid == job.job_id]
            for i in own:  # a job may always use what is reserved for it
                del reserved[i]
                st.set_hidden(i, False)
            if own:
                fail_memo.clear()
            qualifying = tuple(
                sorted({rid for idx, (rid, start_by) in reserved.items()
                        if job.max_runtime_s is not None and now + job.max_runtime_s <= start_by})
            )
            memo_key = (sid, allowed, qualifying)
            takes = None
            if memo_key not in fail_memo:
                if job.replica_group and self._kind(job.kind).spread_replicas:
                    for avoid in self._spread_tiers(job.replica_group):
                        takes = self._place(job, shape, sid, allowed, avoid)
                        if takes:
                            break
                if not takes:
                    takes = self._place(job, shape, sid, allowed)
                if takes is None and qualifying:
                    opened = [i for i, (rid, _) in reserved.items() if rid in qualifying]
                    for i in opened:
                        st.set_hidden(i, False)
                    takes = self._place(job, shape, sid, allowed)
                    for i in opened:
                        st.set_hidden(i, True)
                if takes is None:  # a soft hold (unknown start) only steers: use it when nothing else fits
                    opened = [i for i, (rid, start_by) in reserved.items() if start_by == INF and rid not in qualifying]
                    for i in opened:
                        st.set_hidden(i, False)
                    if opened:
                        takes = self._place(job, shape, sid, allowed)
                    for i in opened:
                        st.set_hidden(i, True)
            if takes:
                for r, t in enumerate(takes):
                    placements.append(self._placement(job, t, r, shape, reconfigs))
                    for model, milli in self._take_milli(t).items():
                        ledger.add(paths, model, milli)
                        self._account(job.team, job.project, model, milli)
                    self._account_host(job.team, t.cpu, t.mem)
                self._register(job, takes, prio, preemptible, _min_rt, now)
                if job.replica_group:
                    self._join_group(job.job_id, job.replica_group, [t.node for t in takes])
                victims.add(job.job_id)  # placed in this cycle: never a victim in it
                placed_flag[0] = True
                continue

            # blocked: why?
            if laps:
                laps.to("reasons")
            if memo_key in fail_memo:
                code, msg = fail_memo[memo_key]
            else:
                code, msg = self._why(job, shape, sid, allowed, reserved)
                fail_memo[memo_key] = (code, msg)

            # preempting frees room, never a label: a job no node matches has no victims to look for
            if self._eligible_victims and code not in (RESERVED_FOR_GANG, NO_NODE_MATCHES_SELECTOR):
                if laps:
                    laps.to("preemption")
                reclaim = any(ledger.within_guarantee(paths, m, self._amount(shape, m)) for m in allowed)
                pkey = (sid, allowed, job.team, prio, reclaim)
                if pkey not in preempt_fail:
                    n_searches += 1
                    self.preempt_note = ""
                    found = self._preempt(job, shape, sid, allowed, prio, reclaim, ledger, victims, now)
                    if found is None:
                        preempt_fail.add(pkey)
                        if self.preempt_note:
                            msg += "; " + self.preempt_note
                    else:
                        chosen, target_nodes = found
                        for vid, why in chosen:
                            victims.add(vid)
                            v = st.running[vid]
                            node = st.nodes[st.holds[vid][0].node].name if st.holds.get(vid) else ""
                            if why == PREEMPTED_BY_PRIORITY:
                                m = f"{job.job_id} (priority {prio}) of team {job.team} needs the capacity; " \
                                    f"{vid} has priority {v.priority}"
                            else:
                                m = f"team {v.team} borrows capacity that team {job.team} is guaranteed " \
                                    f"and {job.job_id} is waiting for"
                            preemptions.append(Preemption(vid, node, job.job_id, why, m))
                        for idx in target_nodes:
                            nominated.add(idx)
                            st.set_hidden(idx, True)
                        # held for the preemptor into the next cycle, when the victims are gone
                        new_sticky[job.job_id] = (list(target_nodes), now)
                        names = ", ".join(sorted(st.nodes[i].name for i in target_nodes))
                        reasons.append(PendingReason(job.job_id, PREEMPTING,
                                                     f"waiting for {len(chosen)} preempted job(s) to leave {names}"))
                        if head_of_line:
                            blocked_by = job.job_id
                        continue

            if laps:
                laps.to("backfill")
            if (p.setting("backfill") and shape.kind == WHOLE_KIND and shape.total >= 2
                    and self._kind(job.kind).reserve and code in (NO_FEASIBLE_NODE, WAITING_FOR_GANG)
                    and len(reservations) < p.max_reservations
                    and reserve_tries < 4 * p.max_reservations and (sid, allowed) not in reserve_memo):
                reserve_tries += 1
                if not self._n_finite and (now - job.submitted_at < p.drain_after_s or draining):
                    res = None  # no end is known, so the start would be too, and no soft hold is due: skip
                else:
                    res = self._reserve(job, shape, allowed, now)
                if res is None or res[1] == INF:
                    reserve_memo.add((sid, allowed))  # the same shape will not get a better answer this cycle
                if res is not None and res[1] == INF and (now - job.submitted_at < p.drain_after_s or draining):
                    res = None  # nobody knows when the nodes free up: drain them only for one starving job
                if res is not None and res[1] == INF:
                    draining = True
                if res is not None:
                    idxs, start_by = res
                    for i in idxs:
                        reserved[i] = (job.job_id, start_by)
                        st.set_hidden(i, True)
                    new_sticky[job.job_id] = (list(idxs), start_by)
                    reservations.append(Reservation(job.job_id, tuple(st.nodes[i].name for i in idxs), start_by,
                                                    soft=start_by == INF))
                    if start_by == INF:
                        msg += (f"; other work is steered away from {len(idxs)} node(s) until running work there "
                                f"ends (a soft hold: that end is unknown, so it idles nothing)")
                    else:
                        msg += f"; reserved {len(idxs)} node(s) to start by t={start_by:g}"
            reasons.append(PendingReason(job.job_id, code, msg))
            if head_of_line:
                blocked_by = job.job_id

        if laps:
            laps.to("finish")
        for i in list(reserved) + list(nominated):
            st.set_hidden(i, False)
        self._sticky = new_sticky
        st.commit()
        mig_changes = tuple(
            MigReconfig(node, uuid, tuple(d), tuple(c)) for (node, uuid), (d, c) in sorted(reconfigs.items())
        )
        stats = (
            ("jobs", len(jobs)),
            ("placed", len({pl.job_id for pl in placements})),
            ("pending", len(reasons)),
            ("node_groups", n_groups),
            ("groups_scored", self._n_scored),
            ("preemption_searches", n_searches),
            ("victims", len(preemptions)),
            ("reservations", len(reservations)),
        )
        if laps:
            laps.to("")
            stats += tuple((f"{phase}_us", round(laps.acc.get(phase, 0.0) * 1e6)) for phase in PHASES)
        return Plan(tuple(placements), tuple(reasons), tuple(preemptions), mig_changes, tuple(reservations), stats)

    # ---- pieces of the cycle ---------------------------------------------------------------------------------

    def _take_milli(self, t: Take) -> dict[str, int]:
        ns = self.state.nodes[t.node]
        out: dict[str, int] = {}
        for pos in t.positions:
            g = ns.gpus[pos]
            milli = g.mig_profiles[t.mig[0]].milli if t.mig else t.milli
            out[g.model] = out.get(g.model, 0) + milli
        return out

    def _register(self, job: JobRequest, takes: list[Take], prio: int, pre: bool, min_rt: float, now: float):
        end = now + job.max_runtime_s if job.max_runtime_s is not None else INF
        rj = RunningJob(job.job_id, job.team, job.project, prio, pre, min_rt, now, end)
        for t in takes:
            for model, milli in self._take_milli(t).items():
                rj.milli_by_model[model] = rj.milli_by_model.get(model, 0) + milli
            rj.cpu_milli += t.cpu
            rj.memory_mib += t.mem
        self.state.running[job.job_id] = rj
        if end < INF:
            self._n_finite += 1

    def _placement(self, job: JobRequest, t: Take, replica: int, shape: Shape, reconfigs: dict) -> Placement:
        ns = self.state.nodes[t.node]
        gpus = [ns.gpus[p] for p in t.positions]
        mig = None
        if t.mig is not None:
            mig = MigInstance(t.mig[0], t.mig[1])
            if not t.reused_idle:
                d, c = reconfigs.setdefault((ns.name, gpus[0].uuid), ([], []))
                d.extend(MigInstance(n, s) for s, n in t.destroyed)
                c.append(mig)
        return Placement(
            job_id=job.job_id,
            cluster=ns.cluster,
            node=ns.name,
            gpu_uuids=tuple(g.uuid for g in gpus),
            gpu_indices=tuple(g.index for g in gpus),
            replica=replica,
            gpu_model=gpus[0].model if gpus else "",
            gpu_fraction_milli=shape.milli if shape.kind == FRAC_KIND else 0,
            gpu_memory_mib=shape.gmem if shape.kind == FRAC_KIND else 0,
            mig=mig,
            cpu_milli=shape.cpu,
            memory_mib=shape.mem,
        )

    def _why(self, job: JobRequest, shape: Shape, sid: int, allowed: frozenset, reserved: dict) -> tuple[str, str]:
        st = self.state
        if shape.selector and not any(ns.schedulable and shape.selector <= ns.labels for ns in st.nodes):
            wanted = ", ".join(f"{k}={v}" for k, v in sorted(shape.selector))
            return (NO_NODE_MATCHES_SELECTOR,
                    f"no schedulable node has the label(s) its node_selector asks for: {wanted}")
        if reserved:
            opened = list(reserved)
            for i in opened:
                st.set_hidden(i, False)
            mark = st.mark()
            fits = self._place(job, shape, sid, allowed)
            st.rollback(mark)
            for i in opened:
                st.set_hidden(i, True)
            if fits:
                holders = sorted({reserved[i][0] for i in opened})
                return (RESERVED_FOR_GANG,
                        f"capacity that fits is reserved for {', '.join(holders)}; set max_runtime_s short enough "
                        f"to backfill")
        if shape.is_gang:
            n_ok = 0
            for cid in self._classes_for(shape, allowed):
                for key, bucket in st.groups.get(cid, {}).items():
                    if self._choices(cid, key[0], shape, sid, shape.per_node if shape.members else 1, allowed,
                                     "first"):
                        n_ok += len(bucket)
            need = shape.members or shape.total
            return (WAITING_FOR_GANG,
                    f"{shape.describe()}: all or nothing, and only {n_ok} node(s) can take a member now "
                    f"(need {need})")
        return (NO_FEASIBLE_NODE, f"no schedulable node has room for {shape.describe()}"
                + (f" with {shape.cpu} mCPU / {shape.mem} MiB" if shape.cpu or shape.mem else ""))

    def _reserve(self, job: JobRequest, shape: Shape, allowed: frozenset, now: float):
        return plan_reservation(self, job, shape, allowed, now)

    def _preempt(self, job: JobRequest, shape: Shape, sid: int, allowed: frozenset, prio: int, reclaim: bool,
                 ledger: QuotaLedger, taken: set, now: float):
        return find_victims(self, job, shape, sid, allowed, prio, reclaim, ledger, taken, now)


class NormalizeMemo:
    """Each request's normalised shape and resolved class, kept across one-shot `schedule` calls (a service builds
    a new Scheduler every cycle, and with thousands of jobs waiting, normalising them all again was a large part of
    each cycle). An entry is used only for the very request object it was made from, and all of them are dropped
    when what they depend on in the policy (priority classes, kinds, default minimum runtime) changes."""

    def __init__(self) -> None:
        self._key: tuple | None = None
        self._cache: dict[str, tuple] = {}

    def for_policy(self, policy: Policy) -> dict[str, tuple]:
        key = (policy.priority_classes, policy.kinds, policy.min_runtime_s)
        if key != self._key:
            self._key, self._cache = key, {}
        return self._cache


def schedule(snapshot: Snapshot, pending: Iterable[JobRequest], policy: Policy, now: float,
             clock: Callable[[], float] | None = None, memo: NormalizeMemo | None = None) -> Plan:
    """One scheduling cycle from a snapshot (pure: the same inputs give the same plan, with or without a `memo`;
    with a `clock`, the stats also carry the time per phase, the build of the indexes counted under "normalize")."""
    laps = _Laps(clock) if clock is not None else None
    pending = list(pending)
    workload = policy.workload or (
        derive_workload(pending, policy.max_workload_shapes) if policy.setting("w_frag") else ()
    )
    sched = Scheduler(snapshot, policy, workload, clock)
    if memo is not None:
        sched._norm_cache = memo.for_policy(policy)
    build = 0.0
    if laps:
        laps.to("")
        build = laps.acc["normalize"]
    plan = sched.cycle(pending, now)
    if not build:
        return plan
    stats = tuple((k, v + round(build * 1e6)) if k == "normalize_us" else (k, v) for k, v in plan.stats)
    return replace(plan, stats=stats + (("build_us", round(build * 1e6)),))
