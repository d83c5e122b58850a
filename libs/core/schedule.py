"""The scheduling cycle: `schedule(snapshot, pending, policy, now) -> Plan`.

`Scheduler.cycle` runs one cycle in named phases over a `CycleContext` (Kueue's schedule(), step by step):

1. `_normalize`: requests normalised (`fit.normalize`), priority classes resolved;          InvalidRequest
2. `_restore_reservations`: last cycle's held nodes held again for jobs still waiting;
3. `_order`: priority -> fair share (dominant share, half-life-decayed) -> submit time -> id;
4. per job, `_admit`: quota admission per GPU model (`quota.QuotaLedger.admissible`);       QuotaExceeded
5. `_try_place`: filter -> score -> select over node groups (`search`), gangs all or nothing;
6. when blocked, `_diagnose`: why;                                       NoFeasibleNode, WaitingForGang …
7. `_try_preempt` (`blocked.py`): victims decided, never acted on (`preempt.find_victims`);   Preempting
8. `_try_reserve` (`blocked.py`): nodes held for a big job (`backfill.plan_reservation`);  ReservedForGang
9. `_finish`: the plan: placements, preemptions, MIG reconfigurations, reservations, a reason for every job.

Deterministic: the same inputs give the same plan. `Scheduler` keeps its indexes between cycles for callers that
feed it changes (the simulator; placement, services/placement/cache.py); `schedule` builds one from a snapshot.
"""

from __future__ import annotations

import heapq
import math
from collections import Counter, deque
from collections.abc import Callable, Iterable, Iterator
from dataclasses import replace
from itertools import chain
from operator import attrgetter, is_, itemgetter

from libs.core.answers import SameAnswers
from libs.core.blocked import BlockedPhases
from libs.core.context import CycleContext
from libs.core.cycle import _CPU, _MEM, PHASES, _class_of, _Laps, decayed_history, mix_of
from libs.core.explain import pending as _pending
from libs.core.explain import render
from libs.core.fit import FRAC_KIND, GpuShape, Invalid, Shape, normalize
from libs.core.frag import mix_probabilities
from libs.core.model import Allocation, JobRequest, MigInstance, Share, Snapshot
from libs.core.plan import (
    MigReconfig,
    PendingReason,
    Placement,
    Plan,
    QuotaFacts,
    ReasonFacts,
)
from libs.core.policy import Policy, WorkloadShape
from libs.core.quota import QuotaLedger
from libs.core.reasons import (
    BLOCKED_BY_QUEUE_HEAD,
    INVALID_REQUEST,
    NO_FEASIBLE_NODE,
    NO_NODE_MATCHES_SELECTOR,
    QUOTA_EXCEEDED,
    RESERVED_FOR_GANG,
    UNSCHEDULABLE,
    WAITING_FOR_GANG,
)
from libs.core.search import PlacementSearch
from libs.core.state import ClusterState, RunningJob, Take

INF = math.inf
_OVER_QUOTA = QuotaFacts("", "", "over_quota")  # refused without a refusal to name (never expected)


_SUBMITTED = attrgetter("submitted_at", "job_id")  # the order of one team's jobs within a priority
_FIRST, _SECOND = itemgetter(0), itemgetter(1)
_PATIENCE = 64  # teams that tie take turns job by job; after this many without a placement, merge them


def _merged(heap: list[tuple], queues: dict[str, deque]) -> deque:
    """The jobs of the teams in `heap` in the order the heap would give them while no share moves: by share, then
    submit time and id across teams of the same share (each team's queue is already in that order)."""
    out: deque = deque()
    by_share: dict[float, list[str]] = {}
    for share, _, _, team in heap:
        by_share.setdefault(share, []).append(team)
    for share in sorted(by_share):
        teams = by_share[share]
        if len(teams) == 1:
            out.extend(queues[teams[0]])
        else:
            out.extend(sorted(chain.from_iterable(queues[t] for t in teams), key=_SUBMITTED))
    heap.clear()
    return out


class Scheduler(BlockedPhases, PlacementSearch):
    """Scheduling state that outlives one cycle. `schedule()` is the one-shot form.

    `clock` (optional, e.g. `time.perf_counter`): when given, each cycle reports the time spent per phase in
    `Plan.stats` (`<phase>_us`); the core never reads a clock of its own.
    """

    def __init__(self, snapshot: Snapshot, policy: Policy, workload: tuple[WorkloadShape, ...] = (),
                 clock: Callable[[], float] | None = None):
        self.clock = clock
        self.classes_by_name = {c.name: c for c in policy.priority_classes}
        workload = workload or policy.workload
        self.workload = workload
        host, gpu_shapes, gpuless = _weighed(workload, policy)
        self.host_bit = {hm: i for i, hm in enumerate(host)}
        super().__init__(ClusterState(snapshot, host), policy, gpu_shapes, gpuless)
        self.protect_scarce(workload)
        self.history = snapshot.usage
        self.held: dict[str, tuple[list[int], float]] = {}  # reservations carried to the next cycle
        self.n_finite = 0  # running jobs with a declared end (without any, every reservation's start is unknown)
        self.norm_cache: dict[str, tuple] = {}  # job id -> (request object, normalised form), across cycles
        self.answers: SameAnswers | None = None  # the last cycle's reasons, reused when unchanged (a caller's)
        self.alt_cache: dict[str, tuple] = {}  # job id -> (request object, its alternatives normalised)
        self._shape_amounts: dict[Shape, tuple] = {}  # shape -> ((model, milli it would take), ...)
        self._like_keys: dict[tuple, int] = {}  # what decides a job's answer (`_like`) -> a small id
        self._like_ids: dict[str, tuple] = {}  # job id -> (request object, its `_like` id or None)
        self.team_alloc: dict[tuple[str, str], int] = {}  # (team, model) -> milli held
        self.usage_tp: dict[tuple[str, str, str], int] = {}  # (team, project, model) -> milli held
        self.team_host: dict[str, tuple[int, int]] = {}  # team -> (CPU milli-cores, memory MiB) held
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

    def reweigh(self, workload: tuple[WorkloadShape, ...]) -> bool:
        """Measure fragmentation against `workload` from now on, exactly as a scheduler built with it would (a
        caller that derives the mix from what waits, as `schedule` does, keeps its scheduler while the mix's
        weights move). False, changing nothing, when the mix's host shapes differ from those the node groups were
        keyed by: only a new scheduler can take that mix."""
        workload = workload or self.policy.workload
        host, gpu_shapes, gpuless = _weighed(workload, self.policy)
        if host != self.state.host_shapes:
            return False
        if (gpu_shapes, gpuless) != (self.gpu_shapes, self.gpuless_share):
            self.gpu_shapes, self.gpuless_share = gpu_shapes, gpuless
            self._frag_memo.clear()  # measured against the old mix
        if workload != self.workload:
            self.protect_scarce(workload)
        self.workload = workload
        return True

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
            self.n_finite += 1
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
                self.n_finite -= 1
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

    def _share(self, team: str, hist: dict[tuple[str, str], float]) -> float:
        """Dominant-resource share (DRF): the largest, over GPU models, host CPU and host memory, of (held +
        half-life-decayed history) / capacity, divided by the team's over-quota weight."""
        best = 0.0
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
        # quantised only against float noise (the same share summed in another order): any real use, even a few
        # GPU-seconds under a week's half-life, orders a team behind one that used nothing
        return round(best / self._weights.get(team, 1.0), 12)

    # ---- the cycle: Kueue's schedule(), one named phase per step ---------------------------------------------

    def cycle(self, pending: Iterable[JobRequest], now: float) -> Plan:
        """One cycle: 1 normalise, 2 restore last cycle's reservations, 3 order; per job 4 admit (quota), 5 place,
        and when blocked 6 diagnose, 7 preempt or 8 reserve; 9 finish the plan."""
        ctx = self._begin(pending, now)
        self._normalize(ctx)
        self._restore_reservations(ctx)
        ctx.eligible_victims = self._preemptible_now(now)
        ctx.epoch = self._epoch(ctx)
        laps, hol, like_ids, like_memo, holders = ctx.laps, ctx.head_of_line, self._like_ids, ctx.like_memo, ctx.holders
        append, last = ctx.reasons.append, (self.answers.last if self.answers is not None else {}).get
        for run, until_placed in self._order(ctx):  # runs of jobs in order (`_order`)
            while run:
                if laps and laps.cur != "order":  # (switching to the phase it is in changes no total)
                    laps.to("order")
                job = run.popleft()
                ctx.placed_last = False
                # `_schedule_job`'s common case inline: a job just like one answered since the state last moved
                known = None if hol or job.job_id in holders else like_ids.get(job.job_id)
                if known is not None and known[0] is job and known[1] is not None:
                    hit = like_memo.get(known[1])
                    if hit is not None and hit[0] is ctx.epoch:
                        r, prev = hit[1], last(job.job_id)  # its answer; last cycle's, the same object if equal
                        append(prev if prev is not None and prev.facts is r.facts and prev.reason == r.reason
                               and prev.message == r.message else PendingReason(job.job_id, r.reason, r.message,
                                                                                r.facts))
                        if until_placed is False:
                            break
                        continue
                self._schedule_job(ctx, job)
                if until_placed is None:  # fifo, priority: the whole run
                    continue
                if not until_placed or ctx.placed_last:
                    break
        return self._finish(ctx)

    def _begin(self, pending: Iterable[JobRequest], now: float) -> CycleContext:
        st, p = self.state, self.policy
        laps = _Laps(self.clock) if self.clock is not None else None
        st.commit()
        self.n_scored = 0
        n_groups = sum(len(g) for g in st.groups.values())
        pending = pending if isinstance(pending, list | tuple) else list(pending)
        jobs = {j.job_id: j for j in pending}
        if len(jobs) != len(pending):  # an id twice: the first of each counts
            jobs = {}
            for j in pending:
                jobs.setdefault(j.job_id, j)
        hist = decayed_history(self.history, p.fair_share_half_life_s, now)
        ledger = QuotaLedger.holding(p.quotas, st.capacity, p.strict_quota, self.usage_tp)
        return CycleContext(now=now, jobs=jobs, hist=hist, ledger=ledger, laps=laps, n_groups=n_groups,
                            head_of_line=bool(p.setting("head_of_line")))

    def _normalize(self, ctx: CycleContext) -> None:
        """1. Each request's shape and resolved class (kept across cycles for the very same request object)."""
        cache = self.norm_cache
        if len(cache) > 200_000:
            cache.clear()
        get, meta, valid = cache.get, ctx.meta, ctx.valid
        # the common case without a Python step per job: every request met before, as this very object, none invalid
        ids, jobs = list(ctx.jobs), list(ctx.jobs.values())
        hits = list(map(get, ids))
        if None not in hits and all(map(is_, map(_FIRST, hits), jobs)):
            metas = list(map(_SECOND, hits))
            if str not in set(map(type, map(_FIRST, metas))):  # (an invalid one's is (INVALID_REQUEST, why))
                ctx.meta.update(zip(ids, metas, strict=True))
                valid.extend(jobs)
                return
        for job_id, j in ctx.jobs.items():
            hit = get(job_id)
            if hit is None or hit[0] is not j:
                hit = cache[job_id] = (j, self._normalized(j))
            m = hit[1]
            if m[0] is INVALID_REQUEST:  # (identity: a shape's dataclass equality is slower to say no)
                ctx.reasons.append(_pending(job_id, INVALID_REQUEST, ReasonFacts(cause="invalid", detail=m[1])))
                continue
            meta[job_id] = m
            valid.append(j)

    def _normalized(self, j: JobRequest) -> tuple:
        """(shape, priority, preemptible, minimum runtime), or (INVALID_REQUEST, why)."""
        r = self._resolve(j.priority_class, j.priority, j.preemptible, j.kind)
        if r is None:
            return (INVALID_REQUEST, f"unknown priority class {j.priority_class!r}")
        try:
            shape = normalize(j)
            if self._kind(j.kind).prefer_shared:
                shape = replace(shape, prefer_shared=True)
            if j.alternatives:
                if shape.total != 1 or shape.members != 1:
                    raise Invalid("alternative shares are for a one-GPU request (gpus=1)")
                self.alt_cache.pop(j.job_id, None)
                self._alternatives(j)  # raises Invalid for a share that is not one
            return (shape, *r)
        except Invalid as e:
            return (INVALID_REQUEST, str(e))

    def _restore_reservations(self, ctx: CycleContext) -> None:
        """2. Reservations made last cycle hold for jobs still pending, also against jobs ordered before them."""
        for rid, (idxs, start_by) in self.held.items():
            if rid in ctx.jobs:
                for i in idxs:
                    if i not in ctx.reserved:
                        ctx.hold(i, rid, start_by)
                        self.state.set_hidden(i, True)

    def _preemptible_now(self, now: float) -> list[RunningJob]:
        """Running work that may be preempted at all this cycle (preemptible and past its minimum runtime)."""
        if not self.policy.setting("preemption"):
            return []
        return [rj for _, rj in sorted(self.state.running.items())
                if rj.preemptible and now - rj.started_at >= rj.min_runtime_s]

    def _order(self, ctx: CycleContext) -> Iterator[tuple[deque, bool | None]]:
        """3. The order jobs are tried in: fifo, priority, or priority -> fair share (each team's dominant share,
        recomputed after it placed a job) -> submit time -> id. Yields runs the cycle takes jobs from in turn:
        (jobs, None) to take them all; fair share yields one team's jobs, (jobs, True) to take them until one is
        placed (only a placement moves the team's share, and the next team's turn comes only after one) or
        (jobs, False) to take exactly one (the next team's entry ties with this team's share: compare job by job),
        and goes on from what the cycle left (`ctx.placed_last`: whether the last job taken was placed)."""
        order, valid, meta = self.policy.setting("order"), ctx.valid, ctx.meta
        if order == "fifo":
            yield deque(sorted(valid, key=lambda j: (j.submitted_at, j.job_id))), None
            return
        if order == "priority":
            yield deque(sorted(valid, key=lambda j: (-meta[j.job_id][1], j.submitted_at, j.job_id))), None
            return
        by_prio: dict[int, dict[str, list[JobRequest]]] = {}
        for j in valid:
            by_prio.setdefault(meta[j.job_id][1], {}).setdefault(j.team, []).append(j)
        share_of, hist, heappush, heappop = self._share, ctx.hist, heapq.heappush, heapq.heappop
        for prio in sorted(by_prio, reverse=True):
            queues = {t: deque(sorted(js, key=_SUBMITTED)) for t, js in by_prio[prio].items()}
            heap = [(share_of(t, hist), q[0].submitted_at, q[0].job_id, t) for t, q in queues.items()]
            heapq.heapify(heap)
            quiet, patience = 0, _PATIENCE  # jobs taken one by one since the last placement; when to merge
            while heap:
                if quiet >= patience:  # shares stand still while nothing is placed: the rest in one merged run
                    merged = _merged(heap, queues)
                    yield merged, True
                    if not merged:
                        break
                    queues = {}  # one was placed: back to the teams' queues, its team's share moved
                    for j in merged:
                        queues.setdefault(j.team, deque()).append(j)
                    heap = [(share_of(t, hist), q[0].submitted_at, q[0].job_id, t) for t, q in queues.items()]
                    heapq.heapify(heap)
                    quiet, patience = 0, 2 * patience  # each merge costs the rest's length: ever rarer
                    continue
                share, _, _, team = heappop(heap)
                q = queues[team]
                top = heap[0] if heap else None  # the next team's entry: fixed while this team goes on
                while True:
                    yield q, top is None or top[0] > share  # no other team, or each is further behind: a run
                    if not q:
                        break
                    if ctx.placed_last:
                        share, quiet = share_of(team, hist), 0
                    else:
                        quiet += 1
                    if top is None or top[0] > share:
                        continue
                    head = q[0]
                    nxt = (share, head.submitted_at, head.job_id, team)
                    if top < nxt or quiet >= patience:  # another team is next (or merge); else this one goes on
                        heappush(heap, nxt)
                        break

    def _schedule_job(self, ctx: CycleContext, job: JobRequest) -> None:
        """One job, or, when a job just like it (`_like`) was turned away while nothing has changed since, its
        answer again: with a deep queue most jobs are the same few asks, and each would only meet the memos the
        first left (quota, placement, reasons, preemption searches), so the answer is the same, reached sooner."""
        known = None if ctx.head_of_line or job.job_id in ctx.holders else self._like_ids.get(job.job_id)
        key = known[1] if known is not None and known[0] is job else self._like(ctx, job)  # `_like`, its common case
        epoch = ctx.epoch
        if key is not None:
            hit = ctx.like_memo.get(key)
            if hit is not None and hit[0] == epoch:
                r = hit[1]
                r = PendingReason(job.job_id, r.reason, r.message, r.facts)
                ctx.reasons.append(self.answers.same(r) if self.answers is not None else r)
                return
        n = len(ctx.reasons)
        self._schedule_one(ctx, job)
        if self.answers is not None and len(ctx.reasons) == n + 1:
            ctx.reasons[-1] = self.answers.same(ctx.reasons[-1])
        now_epoch = self._epoch(ctx)
        if now_epoch != epoch:  # kept the same object while equal: the memo's check is then `is`
            ctx.epoch = now_epoch
        # turned away and nothing moved: a job just like it meets the memos this one left (each an answer that
        # changes only with the state: admission, placement, diagnosis; a search that found nothing, or a shape
        # whose hold will not get better, is not tried again this cycle), so its answer is this one. Not when the
        # answer says how long this job waited (a preemption not yet worth it): that is its own.
        if key is not None and len(ctx.reasons) == n + 1 and ctx.epoch == epoch and ctx.reasons[-1].facts.wait is None:
            ctx.like_memo[key] = (epoch, ctx.reasons[-1])

    def _like(self, ctx: CycleContext, job: JobRequest) -> tuple | None:
        """What decides a job's answer besides the state: jobs with the same key get the same answer from the same
        state. None for jobs whose answer depends on more (their id, alternatives, replicas, a hold of their own)."""
        if ctx.head_of_line or job.job_id in ctx.holders:
            return None
        hit = self._like_ids.get(job.job_id)
        if hit is not None and hit[0] is job:  # kept per request object, as its normalised form is
            return hit[1]
        shape, prio, preemptible, _ = ctx.meta[job.job_id]
        if job.alternatives or job.replica_group or self._guarantee_only(ctx, preemptible):
            like = None  # its refusal names it
        else:
            key = (shape, job.team, job.project, prio, preemptible, job.kind, job.max_runtime_s)
            like = self._like_keys.setdefault(key, len(self._like_keys))
        if len(self._like_ids) > 200_000:
            self._like_ids.clear()
        self._like_ids[job.job_id] = (job, like)
        return like

    @staticmethod
    def _epoch(ctx: CycleContext) -> tuple:
        """The state a job's answer reads that changes as the cycle goes (quota use, what is placed, chosen as a
        victim, held or reserved): equal epochs, equal state. Each part only grows within a cycle."""
        return (ctx.ledger.version, len(ctx.placements), len(ctx.preemptions), len(ctx.reservations),
                len(ctx.taken), len(ctx.reserved), len(ctx.nominated), len(ctx.reconfigs), len(ctx.held_next),
                ctx.draining)

    def _schedule_one(self, ctx: CycleContext, job: JobRequest) -> None:
        """One job through admission, placement and, when it does not fit, its reason, preemption, reservation."""
        if ctx.laps:
            ctx.laps.to("quota")
        shape, prio, preemptible, min_rt = ctx.meta[job.job_id]
        if ctx.blocked_by is not None:
            ctx.reasons.append(_pending(job.job_id, BLOCKED_BY_QUEUE_HEAD,
                                        ReasonFacts(cause="fifo", blocked_by=ctx.blocked_by)))
            return
        paths = ctx.ledger.paths(job.team, job.project)
        allowed, refusal = self._admit(ctx, job, shape, preemptible, paths)
        if allowed is None:
            if job.alternatives and self._try_alternatives(ctx, job, paths, prio, preemptible, min_rt):
                return
            if refusal is None:
                ctx.reasons.append(_pending(job.job_id, NO_FEASIBLE_NODE,
                                            ReasonFacts(cause="no_model", ask=shape.describe())))
                return
            fkey = (shape, refusal)  # one object per refusal: the facts' copies below are then made once each
            facts = ctx.quota_facts.get(fkey)
            if facts is None:
                facts = ctx.quota_facts[fkey] = ReasonFacts(cause="quota", ask=shape.describe(), quota=refusal)
            if ctx.eligible_victims:  # its quota refuses it: make room within that quota, or wait
                if ctx.laps:
                    ctx.laps.to("preemption")
                preempting, facts = self._try_quota_preempt(ctx, job, shape, prio, preemptible, paths, facts)
                if preempting:
                    return
            ctx.reasons.append(_pending(job.job_id, QUOTA_EXCEEDED, facts))
            return
        if ctx.laps:
            ctx.laps.to("place")
        sid = self._sid(shape)
        takes, memo_key = self._try_place(ctx, job, shape, sid, allowed)
        if takes:
            self._commit(ctx, job, shape, takes, paths, prio, preemptible, min_rt)
            return
        if job.alternatives and self._try_alternatives(ctx, job, paths, prio, preemptible, min_rt):
            return
        if ctx.laps:
            ctx.laps.to("reasons")
        code, facts = self._diagnose(ctx, job, shape, sid, allowed, memo_key)
        # preempting frees room, never a label: a job no node matches has no victims to look for
        if ctx.eligible_victims and code not in (RESERVED_FOR_GANG, NO_NODE_MATCHES_SELECTOR, UNSCHEDULABLE):
            if ctx.laps:
                ctx.laps.to("preemption")
            preempting, facts = self._try_preempt(ctx, job, shape, sid, allowed, prio, paths, facts)
            if preempting:
                return
        refused = [m for m in self._models_for(shape) if m not in allowed] if ctx.ledger.has_entries else []
        if refused and ctx.eligible_victims and code != NO_NODE_MATCHES_SELECTOR:
            # it fits none of the models its quota admits; the others it may get by making room within its quota
            preempting, _ = self._try_quota_preempt(ctx, job, shape, prio, preemptible, paths, facts, refused)
            if preempting:
                return
        if ctx.laps:
            ctx.laps.to("backfill")
        facts = self._try_reserve(ctx, job, shape, sid, allowed, code, facts)
        msg = ctx.rendered.get(facts)  # facts without a quota say nothing of the job: same facts, same words
        if msg is None:
            msg = ctx.rendered[facts] = render(job.job_id, facts)
        ctx.reasons.append(PendingReason(job.job_id, code, msg, facts))
        if ctx.head_of_line and code != UNSCHEDULABLE:  # one that can never fit blocks nobody behind it
            ctx.blocked_by = job.job_id

    def _admit(self, ctx: CycleContext, job: JobRequest, shape: Shape, preemptible: bool,
               paths: tuple[str, str, str]) -> tuple[frozenset | None, QuotaFacts | None]:
        """4. The GPU models the job may take within its quota; (None, why) when its quota refuses it, (None,
        None) when no GPU model in the cluster could serve it."""
        amounts = self._shape_amounts.get(shape)
        if amounts is None:  # what it would take of each model it may use: fixed for the cluster's models
            amounts = self._shape_amounts[shape] = self._amounts(shape, self._models_for(shape))
        if not amounts:
            return None, None
        g_only = self._guarantee_only(ctx, preemptible)
        # the answer depends only on the ledger (and, for a guarantee-only job, its id in the message): with a
        # deep queue most jobs ask the same as one before them while nothing was admitted in between
        key = ("admit", paths, amounts, job.job_id if g_only else "")
        hit = ctx.admit_memo.get(key)
        if hit is not None and hit[0] == ctx.ledger.version:
            return hit[1]
        allowed, refusal = ctx.ledger.admission(paths, amounts, guarantee_only=g_only)
        got = (None, refusal or _OVER_QUOTA) if not allowed else (frozenset(allowed), None)
        ctx.admit_memo[key] = (ctx.ledger.version, got)
        return got

    def _try_alternatives(self, ctx: CycleContext, job: JobRequest, paths: tuple[str, str, str], prio: int,
                          preemptible: bool, min_rt: float) -> bool:
        """4-5 for each of the job's alternative shares in order, as if each were the request (True: one was
        admitted and placed). The request's own reason, preemption and reservation follow when none is."""
        for alt, alt_shape in self._alternatives(job):
            allowed, _ = self._admit(ctx, alt, alt_shape, preemptible, paths)
            if allowed is None:
                continue
            takes, _ = self._try_place(ctx, alt, alt_shape, self._sid(alt_shape), allowed)
            if takes:
                self._commit(ctx, alt, alt_shape, takes, paths, prio, preemptible, min_rt)
                return True
        return False

    def _alternatives(self, job: JobRequest) -> tuple[tuple[JobRequest, Shape], ...]:
        """The job's alternative shares as requests of their own, normalised (kept per request object)."""
        hit = self.alt_cache.get(job.job_id)
        if hit is None or hit[0] is not job:
            hit = self.alt_cache[job.job_id] = (job, tuple(_alternative(job, a, self._kind(job.kind).prefer_shared)
                                                         for a in job.alternatives))
        return hit[1]

    def _guarantee_only(self, ctx: CycleContext, preemptible: bool) -> bool:
        return not preemptible and self.policy.nonpreemptible_within_guarantee and ctx.ledger.has_entries

    def _amounts(self, shape: Shape, models: Iterable[str]) -> tuple[tuple[str, int], ...]:
        return tuple((m, self._amount(shape, m)) for m in models)

    def _try_place(self, ctx: CycleContext, job: JobRequest, shape: Shape, sid: int,
                   allowed: frozenset) -> tuple[list[Take] | None, tuple]:
        """5. Filter -> score -> select: spread from the job's replica group where its kind asks, then anywhere;
        held nodes only for a job that ends before their holder starts, or (soft holds) when nothing else fits.
        Returns the takes (None: it does not fit) and the key its failure is remembered under."""
        st, reserved, now = self.state, ctx.reserved, ctx.now
        own = [i for i, (rid, _) in reserved.items() if rid == job.job_id] if job.job_id in ctx.holders else []
        for i in own:  # a job may always use what is reserved for it
            ctx.unhold(i)
            st.set_hidden(i, False)
        if own:
            ctx.fail_memo.clear()
        qualifying = () if job.max_runtime_s is None or not reserved else tuple(sorted(
            {rid for rid, start_by in reserved.values() if now + job.max_runtime_s <= start_by}))
        memo_key = (sid, allowed, qualifying)
        if memo_key in ctx.fail_memo:
            return None, memo_key
        takes = None
        if job.replica_group and self._kind(job.kind).spread_replicas:
            for avoid in self._spread_tiers(job.replica_group):
                takes = self._place(job, shape, sid, allowed, avoid)
                if takes:
                    break
        if not takes:
            takes = self._place(job, shape, sid, allowed)
        if takes is None and qualifying:
            takes = self._place_opened(job, shape, sid, allowed,
                                       [i for i, (rid, _) in reserved.items() if rid in qualifying])
        if takes is None:  # a soft hold (unknown start) only steers: use it when nothing else fits
            soft = [i for i, (rid, start_by) in reserved.items() if start_by == INF and rid not in qualifying]
            if soft:
                takes = self._place_opened(job, shape, sid, allowed, soft)
        return takes, memo_key

    def _commit(self, ctx: CycleContext, job: JobRequest, shape: Shape, takes: list[Take],
                paths: tuple[str, str, str], prio: int, preemptible: bool, min_rt: float) -> None:
        """The job is placed: its placements into the plan, its use into the ledger and the fair-share books."""
        for r, t in enumerate(takes):
            ctx.placements.append(self._placement(job, t, r, shape, ctx.reconfigs))
            for model, milli in self._take_milli(t).items():
                ctx.ledger.add(paths, model, milli)
                self._account(job.team, job.project, model, milli)
            self._account_host(job.team, t.cpu, t.mem)
        self._register(job, takes, prio, preemptible, min_rt, ctx.now)
        if job.replica_group:
            self._join_group(job.job_id, job.replica_group, [t.node for t in takes])
        ctx.taken.add(job.job_id)  # placed in this cycle: never a victim in it
        ctx.placed_last = True

    def _diagnose(self, ctx: CycleContext, job: JobRequest, shape: Shape, sid: int, allowed: frozenset,
                  memo_key: tuple) -> tuple[str, ReasonFacts]:
        """6. Why it does not fit (the same for every job of the same shape, models and usable holds)."""
        got = ctx.fail_memo.get(memo_key)
        if got is None:
            got = self._why(job, shape, sid, allowed, ctx.reserved)
            if got[0] in (NO_FEASIBLE_NODE, WAITING_FOR_GANG):  # blocked now; but could it ever fit this pool?
                if ctx.nodes_by_class is None:
                    ctx.nodes_by_class = dict(Counter(ns.cls for ns in self.state.nodes if ns.schedulable))
                never = self._why_never(shape, sid, allowed, ctx.nodes_by_class)
                if never is not None:
                    got = (UNSCHEDULABLE, replace(got[1], **never))
            ctx.fail_memo[memo_key] = got
        return got

    def _finish(self, ctx: CycleContext) -> Plan:
        """9. The plan; held nodes visible again, this cycle's reservations kept for the next."""
        st = self.state
        if ctx.laps:
            ctx.laps.to("finish")
        for i in list(ctx.reserved) + list(ctx.nominated):
            st.set_hidden(i, False)
        self.held = ctx.held_next
        st.commit()
        if self.answers is not None:
            self.answers.turn(ctx.reasons)
        mig_changes = tuple(
            MigReconfig(node, uuid, tuple(d), tuple(c)) for (node, uuid), (d, c) in sorted(ctx.reconfigs.items())
        )
        stats = (
            ("jobs", len(ctx.jobs)),
            ("placed", len({pl.job_id for pl in ctx.placements})),
            ("pending", len(ctx.reasons)),
            ("node_groups", ctx.n_groups),
            ("groups_scored", self.n_scored),
            ("preemption_searches", ctx.n_searches),
            ("victims", len(ctx.preemptions)),
            ("reservations", len(ctx.reservations)),
        )
        if ctx.laps:
            ctx.laps.to("")
            stats += tuple((f"{phase}_us", round(ctx.laps.acc.get(phase, 0.0) * 1e6)) for phase in PHASES)
        return Plan(tuple(ctx.placements), tuple(ctx.reasons), tuple(ctx.preemptions), mig_changes,
                    tuple(ctx.reservations), stats)

    # ---- pieces of the plan --------------------------------------------------------------------------------

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
            self.n_finite += 1

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


def _weighed(workload: tuple[WorkloadShape, ...], policy: Policy) -> tuple[tuple, tuple[GpuShape, ...], float]:
    """The node keys' host shapes, the GPU shapes with their probabilities and the GPU-less share of a mix."""
    shapes, gpuless = mix_probabilities(workload)
    shapes = [(p, w) for p, w in shapes if w.weight > 0]  # weight 0: known to `scarce_hosts`, scored as nothing
    host = tuple(dict.fromkeys((w.cpu_milli, w.memory_mib) for _, w in shapes)) if policy.setting("w_frag") else ()
    host_bit = {hm: i for i, hm in enumerate(host)}
    gpu_shapes = tuple(
        GpuShape(p, w.gpus, w.gpu_milli, frozenset(w.gpu_models) or None, host_bit.get((w.cpu_milli, w.memory_mib), 0))
        for p, w in shapes
    )
    return host, gpu_shapes, gpuless if gpu_shapes else 0.0


def _alternative(job: JobRequest, share: Share, prefer_shared: bool) -> tuple[JobRequest, Shape]:
    """The request with `share` in place of its own (and of its GPU models), normalised."""
    alt = replace(job, gpu_fraction_milli=share.gpu_fraction_milli, gpu_memory_mib=share.gpu_memory_mib,
                  mig_profile=share.mig_profile, gpu_models=share.gpu_models, gpus=1, alternatives=())
    shape = normalize(alt)
    return alt, replace(shape, prefer_shared=True) if prefer_shared else shape


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
        mix_of(pending, policy) if policy.setting("w_frag") else ()
    )
    sched = Scheduler(snapshot, policy, workload, clock)
    if memo is not None:
        sched.norm_cache = memo.for_policy(policy)
    build = 0.0
    if laps:
        laps.to("")
        build = laps.acc["normalize"]
    plan = sched.cycle(pending, now)
    if not build:
        return plan
    stats = tuple((k, v + round(build * 1e6)) if k == "normalize_us" else (k, v) for k, v in plan.stats)
    return replace(plan, stats=stats + (("build_us", round(build * 1e6)),))
