"""The simulator: a virtual clock driving the same `libs.core.Scheduler` the placement service runs, with every
plan checked and applied by the independent in-memory applier (`applier.Ledger`).

* `replay`: timed trace replay (arrivals, run times, preemption with restart, requeue), metrics over time.
* `fill`:   the fill experiment of Weng et al. (ATC'23, "Beware of Fragmentation"): tasks sampled from a trace
  arrive one by one and never leave; placement failures are dropped; the share of GPUs left unallocated is
  recorded against the arrived workload (sum of GPU demand / GPU capacity).
"""

from __future__ import annotations

import dataclasses
import heapq
import random
import time
from collections import Counter
from dataclasses import dataclass, field

from libs.core import Node, Policy, Scheduler, Snapshot, WorkloadShape, derive_workload, mix_of, teams_quota
from libs.core import mig as migcat
from libs.core.model import WHOLE, JobRequest
from libs.core.policy import preset_names
from libs.core.reasons import RECLAIMED_FOR_GUARANTEE
from libs.sim.applier import Ledger
from libs.sim.metrics import FragMeter, ShareWindows, jain, mean, percentile
from libs.sim.traces import SimJob, Task

POLICIES = ("fifo", "best-fit", "default", "fgd")
# reclaim hysteresis measured on the compressed replay (docs/benchmarks.md) and not adopted: `default` runs with
# the core's Policy.reclaim_min_runtime_s (0); `gpupool bench replay` shows this value beside it
RECLAIM_MIN_RUNTIME_S = 600.0


def make_policy(name: str, teams: list[str] | dict[str, float] | None = None, capacity_gpus: float = 0.0, *,
                preemption=None, backfill=None, max_candidates: int | None = None) -> Policy:
    """The simulator's policies. `default` also gets guaranteed quotas that split the capacity over the teams, in
    proportion to their weights when `teams` maps team -> weight (the replay passes each team's GPU-time demand),
    else equally (so borrowing and reclaim happen); the baselines run without quotas."""
    if name not in preset_names():
        raise ValueError(f"unknown policy {name!r} (one of {', '.join(POLICIES)})")
    kw: dict = {}
    if name == "default" and teams:
        weights = teams if isinstance(teams, dict) else dict.fromkeys(teams, 1.0)
        total = sum(weights.values()) or 1.0
        kw["quotas"] = teams_quota({t: capacity_gpus * w / total for t, w in weights.items()})
        # the synthetic equal quotas are not sized to the trace's non-preemptible jobs: a job bigger than its
        # team's share could never run under the rule that keeps non-preemptible work within guarantees
        kw["nonpreemptible_within_guarantee"] = False
    if preemption is not None:
        kw["preemption"] = preemption
    if backfill is not None:
        kw["backfill"] = backfill
    if max_candidates is not None:
        kw["max_candidates"] = max_candidates
    return Policy(name=name, **kw)


def workload_of(requests: list[JobRequest], limit: int = 32) -> tuple[WorkloadShape, ...]:
    return derive_workload(requests, limit)


@dataclass
class Series:
    t: list[float] = field(default_factory=list)
    alloc: list[float] = field(default_factory=list)
    frag_t: list[float] = field(default_factory=list)
    frag: list[float] = field(default_factory=list)
    preempt_t: list[float] = field(default_factory=list)  # virtual time of every preemption


@dataclass
class ReplayResult:
    metrics: dict
    series: Series
    jct: list[float]
    team_gpu_s: dict[str, float]
    queue: list[float] = field(default_factory=list)  # queueing delay of every job that started
    waits: dict[str, float] = field(default_factory=dict)  # job id -> queueing delay before its first start


def never_fit(nodes: list[Node], jobs: list[SimJob]) -> set[str]:
    """Jobs that would not fit even on the empty cluster: admission rejects them up front (else FIFO would block
    behind them forever)."""
    probe = Scheduler(Snapshot(tuple(nodes)), Policy(name="best-fit"))
    out = set()
    for j in jobs:
        plan = probe.cycle([j.request], 0.0)
        if plan.placements:
            probe.finish(j.job_id)
        else:
            out.add(j.job_id)
    return out


FINISH, ARRIVAL, WAKE = 0, 1, 2  # replay events, in this order at one instant


def gpus_of(r: JobRequest) -> float:
    """The GPUs a request asks for (a fraction by its share, a MIG slice as 1/7)."""
    return r.gpu_fraction_milli / WHOLE if r.gpu_fraction_milli else (1 / 7 if r.mig_profile else r.gpus)


def replay(nodes: list[Node], jobs: list[SimJob], policy_name: str, *, cycle_interval: float = 30.0,
           frag_samples: int = 100, policy_overrides: dict | None = None,
           fair_window_s: float = 3600.0) -> ReplayResult:
    """`policy_overrides`: Policy fields to change (ablations, e.g. {"preemption_cost": False});
    `fair_window_s`: the windows each team's share is measured over against its entitlement (`ShareWindows`)."""
    run = _ReplayRun(nodes, jobs, policy_name, cycle_interval, frag_samples, policy_overrides, fair_window_s)
    run.run()
    return run.result()


class _ReplayRun:
    """One replay in phases: set up (the jobs that can ever fit, guarantees split by demand, the scheduler), then
    per step `_intake` (finishes and arrivals up to the next cycle), `_cycle` (plans applied: placements start,
    victims requeue, their preemptor starts a cycle later) and `_sample`, and at the end `result`."""

    def __init__(self, nodes: list[Node], jobs: list[SimJob], policy_name: str, cycle_interval: float,
                 frag_samples: int, policy_overrides: dict | None, fair_window_s: float) -> None:
        self.wall0, self.cpu0 = time.perf_counter(), time.process_time()
        self.nodes, self.policy_name = nodes, policy_name
        self.cycle_interval, self.frag_samples = cycle_interval, frag_samples
        self.rejected = never_fit(nodes, jobs)
        self.submitted = len(jobs)
        jobs = [j for j in jobs if j.job_id not in self.rejected]
        self.jobs = jobs
        demand: dict[str, float] = {}  # GPU-seconds each team asks for over the trace: its guaranteed share
        for j in jobs:
            demand[j.request.team] = demand.get(j.request.team, 0.0) + gpus_of(j.request) * j.duration
        teams = {t: demand[t] or 1e-9 for t in sorted(demand)}
        self.capacity = sum(1 for n in nodes for g in n.gpus if g.healthy)
        policy = make_policy(policy_name, teams, float(self.capacity))
        total_demand = sum(teams.values())
        # every policy is measured against the same entitlements: the guarantees `default` enforces
        self.windows = ShareWindows({t: self.capacity * w / total_demand for t, w in teams.items()}, fair_window_s,
                                    min((j.submit for j in jobs), default=0.0))
        if policy_overrides:
            policy = dataclasses.replace(policy, **policy_overrides)
        self.policy = policy
        reqs = [j.request for j in jobs]
        self.sched = Scheduler(Snapshot(tuple(nodes)), policy, mix_of(reqs, policy))
        self.ledger = Ledger(nodes)
        self.meter = FragMeter(self.ledger, workload_of(reqs))  # one measure for every policy: the trace's shapes
        self.by_id = {j.job_id: j for j in jobs}
        self.requests = {j.job_id: j.request for j in jobs}
        self.events: list[tuple[float, int, int, str, int]] = []  # (time, FINISH/ARRIVAL/WAKE, seq, job, gen)
        self.seq = 0
        for j in sorted(jobs, key=lambda j: (j.submit, j.job_id)):
            self.events.append((j.submit, ARRIVAL, self.seq, j.job_id, 0))
            self.seq += 1
        heapq.heapify(self.events)
        self.gen: Counter = Counter()
        self.pending: dict[str, JobRequest] = {}
        self.started: dict[str, float] = {}
        self.first_start: dict[str, float] = {}
        self.finished: dict[str, float] = {}
        self.preempted: Counter = Counter()
        self.preempt_reasons: Counter = Counter()
        self.lost_gpu_s: Counter = Counter()  # GPU-seconds of work thrown away by preemption, by reason
        self.team_gpu_s: Counter = Counter()
        self.held_milli: dict[str, int] = {}
        self.series = Series()
        self.cycles = 0
        self.span_start = min((j.submit for j in jobs), default=0.0)
        self.frag_every = 1

    def _stop(self, job_id: str, now: float) -> float:
        """The job leaves its GPUs; returns the GPU-seconds it ran."""
        s = self.started.pop(job_id)
        team = self.requests[job_id].team
        gpus = self.held_milli.pop(job_id, 0) / WHOLE
        self.team_gpu_s[team] += gpus * (now - s)
        self.windows.change(now, team, held=-gpus)
        self.sched.finish(job_id)
        self.ledger.release(job_id)
        return gpus * (now - s)

    def run(self) -> None:
        head_of_line = self.policy.setting("head_of_line")
        last_cycle = -float("inf")
        stuck = False  # FIFO: the last cycle placed nothing; only a finish can change that
        while self.events:
            now = max(self.events[0][0], last_cycle + self.cycle_interval)
            freed, live = self._intake(now)
            if not live and self.events:
                continue  # only finishes of preempted runs were due: nothing happened, no cycle (see `_intake`)
            if head_of_line and stuck and not freed:
                continue  # exact shortcut: new arrivals queue behind a head that still does not fit
            placed = self._cycle(now)
            stuck = bool(self.pending) and not placed
            last_cycle = now
            self._sample(now)
            if not self.events and self.pending:
                break  # nothing left will ever free capacity: the rest cannot run

    def _intake(self, horizon: float) -> tuple[bool, bool]:
        """Finishes and arrivals up to `horizon`: (something finished (capacity freed), something happened). The
        finish a preempted run had been due at is no event (its job went back to the queue): the platform would
        not wake for it, so neither does the replay (it once did, and a sixth of a preempting replay's cycles ran
        only for such stale finishes)."""
        freed = live = False
        events, requests = self.events, self.requests
        while events and events[0][0] <= horizon:
            t, kind, _, job_id, g = heapq.heappop(events)
            if kind == FINISH and (self.gen[job_id] != g or job_id not in self.started):
                continue  # a stale finish
            live = True
            if kind == WAKE:
                continue
            if kind == FINISH:
                self._stop(job_id, t)
                self.finished[job_id] = t
                self.windows.change(t, requests[job_id].team, wants=-gpus_of(requests[job_id]))
                freed = True
            else:
                self.pending[job_id] = requests[job_id]
                self.windows.change(t, requests[job_id].team, wants=gpus_of(requests[job_id]))
        return freed, live

    def _cycle(self, now: float) -> bool:
        """One scheduling cycle, its plan applied; True when it placed. Victims leave at once and requeue; their
        preemptor starts at the next cycle, one interval later (a wake-up is queued for it), on the nodes the core
        holds for it meanwhile: on the platform, victims get a grace period to checkpoint and the cycle after
        their exit places the preemptor. (Rerunning the cycle at once, as before, started it with no delay.)"""
        requests = self.requests
        plan = self.sched.cycle(list(self.pending.values()), now)
        self.cycles += 1
        self.ledger.apply(plan, requests)
        for p in plan.placements:
            if p.job_id in self.pending:
                del self.pending[p.job_id]
                self.started[p.job_id] = now
                self.first_start.setdefault(p.job_id, now)
                heapq.heappush(self.events, (now + self.by_id[p.job_id].duration, FINISH, self.seq, p.job_id,
                                             self.gen[p.job_id]))
                self.seq += 1
            milli = p.gpu_fraction_milli or WHOLE * len(p.gpu_uuids)
            if p.mig is not None:
                prof = migcat.profile(p.gpu_model, p.mig.profile)
                milli = prof.milli if prof else 0
            self.held_milli[p.job_id] = self.held_milli.get(p.job_id, 0) + milli
            self.windows.change(now, requests[p.job_id].team, held=milli / WHOLE)
        for v in plan.preemptions:
            if v.job_id in self.started:
                self.lost_gpu_s[v.reason] += self._stop(v.job_id, now)
                self.gen[v.job_id] += 1
                self.preempted[v.job_id] += 1
                self.preempt_reasons[v.reason] += 1
                self.series.preempt_t.append(now)
                self.pending[v.job_id] = requests[v.job_id]
        if plan.preemptions:
            heapq.heappush(self.events, (now + self.cycle_interval, WAKE, self.seq, "", 0))
            self.seq += 1
        return bool(plan.placements)

    def _sample(self, now: float) -> None:
        """The allocation rate at every cycle; the fragmentation at most `frag_samples` times (thinned as it goes)."""
        series = self.series
        series.t.append(now)
        series.alloc.append(self.ledger.allocated_milli() / max(1, self.ledger.capacity_milli()))
        if self.cycles % self.frag_every == 0:
            series.frag_t.append(now)
            series.frag.append(self.meter.fragmented_gpus())
            if len(series.frag) > self.frag_samples:
                self.frag_every *= 2
                series.frag_t, series.frag = series.frag_t[::2], series.frag[::2]

    def result(self) -> ReplayResult:
        finished, by_id, requests, series = self.finished, self.by_id, self.requests, self.series
        self.windows.advance(max(finished.values(), default=self.windows.last))
        jct = [finished[j] - by_id[j].submit for j in finished]
        queue = [self.first_start[j] - by_id[j].submit for j in self.first_start]
        span_end = max(finished.values(), default=self.span_start)
        # time-weighted allocation rate over the replay
        rate = 0.0
        for i in range(len(series.t) - 1):
            rate += series.alloc[i] * (series.t[i + 1] - series.t[i])
        span = (series.t[-1] - series.t[0]) if len(series.t) > 1 else 0.0
        per_team_service: dict[str, list[float]] = {}
        for j in finished:
            d = by_id[j].duration
            per_team_service.setdefault(requests[j].team, []).append(d / max(d, finished[j] - by_id[j].submit))
        team_gpu_s = self.team_gpu_s
        total_gpu_s = sum(team_gpu_s.values()) or 1.0
        metrics = {
            "policy": self.policy_name,
            "jobs": len(self.jobs),
            "rejected_never_fit": len(self.rejected),
            "submitted": self.submitted,
            "finished": len(finished),
            "unfinished": len(self.jobs) - len(finished),
            "jct_mean_s": mean(jct),
            "jct_p50_s": percentile(jct, 50),
            "jct_p99_s": percentile(jct, 99),
            "queue_mean_s": mean(queue),
            "queue_p50_s": percentile(queue, 50),
            "queue_p99_s": percentile(queue, 99),
            "gpu_allocation_rate": rate / span if span > 0 else (series.alloc[-1] if series.alloc else 0.0),
            "fragmented_gpus_mean": mean(series.frag),
            "jain_fairness": jain([mean(v) for v in per_team_service.values()]),
            "team_gpu_share": {t: team_gpu_s[t] / total_gpu_s for t in sorted(team_gpu_s)},
            "preemptions": sum(self.preempted.values()),
            "preemptions_by_reason": dict(sorted(self.preempt_reasons.items())),
            **churn(self.preempt_reasons, self.lost_gpu_s, self.preempted),
            "fair_share_windows": self.windows.summary(),
            "makespan_s": span_end - self.span_start,
            "gpus": self.capacity,
            "nodes": len(self.nodes),
            "cycles": self.cycles,
            "cycle_interval_s": self.cycle_interval,
            "wall_s": round(time.perf_counter() - self.wall0, 3),
            "cpu_s": round(time.process_time() - self.cpu0, 3),  # what wall_s would be on an idle core
        }
        waits = {j: self.first_start[j] - by_id[j].submit for j in self.first_start}
        return ReplayResult(metrics, series, jct, dict(team_gpu_s), queue, waits)


def churn(reasons: Counter, lost_gpu_s: Counter, preempted: Counter) -> dict:
    """Reclaim churn: reclaim preemptions, the GPU-hours of work preemption threw away (all, and by reclaim), and
    how many jobs were preempted more than once."""
    return {
        "reclaim_preemptions": reasons.get(RECLAIMED_FOR_GUARANTEE, 0),
        "work_lost_gpu_h": round(sum(lost_gpu_s.values()) / 3600, 3),
        "reclaim_work_lost_gpu_h": round(lost_gpu_s.get(RECLAIMED_FOR_GUARANTEE, 0.0) / 3600, 3),
        "jobs_preempted_twice_or_more": sum(1 for n in preempted.values() if n >= 2),
    }


@dataclass
class FillResult:
    metrics: dict
    curve: list[tuple[float, float]]  # (arrived workload share, unallocated GPU share)


def fill_capacity(nodes: list[Node], tasks: list[Task]) -> int:
    """The healthy GPUs a fill experiment fills (ValueError without any, or without tasks)."""
    capacity = sum(1 for n in nodes for g in n.gpus if g.healthy)
    if capacity == 0 or not tasks:
        raise ValueError("the fill experiment needs GPUs and tasks")
    return capacity


def fill_scheduler(nodes: list[Node], policy_name: str, requests: list[JobRequest]) -> Scheduler:
    """The core as a fill experiment runs it: tasks never leave, so no preemption or reservations, and every
    node group is scored (max_candidates=0): the experiment measures placement quality, not speed. The mix
    fragmentation is scored against is the task list's, by the policy's rule (`libs.core.mix_of`)."""
    policy = make_policy(policy_name, preemption=False, backfill=False, max_candidates=0)
    return Scheduler(Snapshot(tuple(nodes)), policy, mix_of(requests, policy))


def fill_metrics(policy_name: str, seed: int, nodes: list[Node], capacity: int, *, tasks_arrived: int, failed: int,
                 failed_gpu: float, arrived: float, unallocated: float, curve: list[tuple[float, float]],
                 wall0: float, **extra: object) -> dict:
    """metrics.json of one fill run (both definitions): `arrived` in GPUs, `unallocated` a share of capacity;
    `extra`: what only one definition reports."""
    return {
        "policy": policy_name,
        "seed": seed,
        "gpus": capacity,
        "nodes": len(nodes),
        "tasks_arrived": tasks_arrived,
        "tasks_failed": failed,
        "gpu_demand_failed": round(failed_gpu, 3),
        "arrived_workload": round(arrived / capacity, 6),
        **extra,
        "unallocated_gpu_share": unallocated,
        "unallocated_gpus": unallocated * capacity,
        "curve": [{"arrived": a, "unallocated_gpu_share": u} for a, u in curve],
        "wall_s": round(time.perf_counter() - wall0, 3),
    }


def fill(nodes: list[Node], tasks: list[Task], policy_name: str, seed: int = 0, *, max_arrived: float = 1.0,
         step: float = 0.01) -> FillResult:
    """Submit tasks sampled (with replacement, seeded) from `tasks` until the arrived GPU demand reaches
    `max_arrived` x capacity. Each task is scheduled on arrival and never leaves; one that does not fit is
    dropped. A task fits a node only where its CPU, memory and GPU demand all fit."""
    wall0 = time.perf_counter()
    rng = random.Random(seed)
    capacity = fill_capacity(nodes, tasks)
    sched = fill_scheduler(nodes, policy_name, [t.request(t.name, 0.0, "fill") for t in tasks])
    ledger = Ledger(nodes)
    arrived = 0.0
    allocated = 0.0
    failed = 0
    failed_gpu = 0.0
    curve = [(0.0, 1.0)]
    next_mark = step
    i = 0
    while arrived < max_arrived * capacity - 1e-9:
        t = tasks[rng.randrange(len(tasks))]
        i += 1
        req = t.request(f"fill-{i:06d}", float(i), "fill")
        arrived += t.gpu_demand
        plan = sched.cycle([req], float(i))
        ledger.apply(plan, {req.job_id: req})
        if plan.placements:
            allocated += t.gpu_demand
        else:
            failed += 1
            failed_gpu += t.gpu_demand
        while arrived / capacity >= next_mark - 1e-12 and next_mark <= max_arrived + 1e-9:
            curve.append((round(next_mark, 6), 1.0 - ledger.allocated_milli() / (capacity * WHOLE)))
            next_mark += step
    unalloc = 1.0 - ledger.allocated_milli() / (capacity * WHOLE)
    metrics = fill_metrics(policy_name, seed, nodes, capacity, tasks_arrived=i, failed=failed, failed_gpu=failed_gpu,
                           arrived=arrived, unallocated=unalloc, curve=curve, wall0=wall0)
    return FillResult(metrics, curve)
