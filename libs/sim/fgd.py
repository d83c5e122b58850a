"""The fill experiment as FGD's artifact measures it (Weng et al., ATC'23; `hkust-adsl/kubernetes-scheduler-simulator`),
and the BestFit baseline as that artifact defines it.

Definition (`fill`): the whole task list is shuffled (seeded), then topped up with random draws (with replacement)
until the arrived GPU demand reaches `tune` × capacity (1.3); each task is placed on arrival or fails and is
dropped; after every arrival the allocated share of GPU capacity is sampled (fractions by their milli share); the
value at 100% is the mean of the samples whose arrived workload rounds to 100% of capacity (99.5% ≤ arrived <
100.5%). CPU-only tasks arrive like the others (they take CPU and memory, no GPU demand). gpupool's fragmentation
score is taken against the task list's mix by the policy's rule, as the scheduler takes it against the pending
jobs (`libs.core.mix_of`): for `default` the most common GPU shapes, each weighted by how often it occurs; for
`fgd` the artifact's typical pods (exact requests, CPU-only ones included, covering 95% of the tasks, each by its
share of all tasks).

gpupool's policies run the same `libs.core.Scheduler` the placement service runs. `fgd-best-fit` is the artifact's
BestFit, reimplemented here as a baseline (it is not a gpupool policy): among the nodes where the task fits (CPU,
memory, GPU model and GPU demand), the highest whole-number score 100 − 100·(½·free CPU / max CPU + ½·free GPU /
max GPU) over the cluster's fixed maxima, ties broken at random (seeded); inside the node a shared task takes the
fitting GPU with the least free share, a whole-GPU task the lowest-indexed free GPUs. Every plan of both is checked
and applied by the independent applier (`applier.Ledger`).
"""

from __future__ import annotations

import random
import time

from libs.core import Node
from libs.core.model import WHOLE
from libs.core.plan import Placement, Plan
from libs.sim.applier import Ledger
from libs.sim.engine import FillResult, fill_capacity, fill_metrics, fill_scheduler
from libs.sim.traces import Task

BASELINES = ("fgd-best-fit",)
TUNE = 1.3  # the artifact's top-up: random draws until the arrived GPU demand is 130% of capacity


def arrivals(tasks: list[Task], capacity: int, rng: random.Random, tune: float = TUNE):
    """The artifact's arrival order: every task once, shuffled, then random draws until `tune` × capacity."""
    order = list(tasks)
    rng.shuffle(order)
    arrived = 0.0
    for t in order:
        arrived += t.gpu_demand
        yield t
    while arrived < tune * capacity - 1e-9:
        t = tasks[rng.randrange(len(tasks))]
        arrived += t.gpu_demand
        yield t


class BestFitBaseline:
    """FGD's BestFit (module docstring): a node score over the node's free CPU and GPU before the placement."""

    def __init__(self, nodes: list[Node], rng: random.Random) -> None:
        self.rng = rng
        self.nodes = [n for n in nodes if n.schedulable]
        self.cpu_free = {n.name: n.cpu_milli for n in self.nodes}
        self.mem_free = {n.name: n.memory_mib for n in self.nodes}
        self.gpu_free = {n.name: [WHOLE if g.healthy else 0 for g in n.gpus] for n in self.nodes}
        self.max_cpu = max((n.cpu_milli for n in self.nodes), default=0) or 1
        self.max_gpu = max((len(n.gpus) for n in self.nodes), default=0) * WHOLE or 1

    def _fits(self, n: Node, t: Task) -> list[int] | None:
        """The GPU positions the task would take on `n` (empty for a CPU-only task), None when it does not fit."""
        if self.cpu_free[n.name] < t.cpu_milli or self.mem_free[n.name] < t.memory_mib:
            return None
        if not t.num_gpu:
            return []
        free = self.gpu_free[n.name]
        usable = [i for i, g in enumerate(n.gpus) if not t.gpu_spec or g.model in t.gpu_spec]
        if t.num_gpu == 1 and t.gpu_milli < WHOLE:
            shared = [i for i in usable if free[i] >= t.gpu_milli]
            return [min(shared, key=lambda i: (free[i], i))] if shared else None
        whole = [i for i in usable if free[i] == WHOLE]
        return whole[:t.num_gpu] if len(whole) >= t.num_gpu else None

    def place(self, t: Task, job_id: str) -> Plan:
        best: list[tuple[Node, list[int]]] = []
        top = -1
        for n in self.nodes:
            got = self._fits(n, t)
            if got is None:
                continue
            free_gpu = sum(self.gpu_free[n.name])
            score = int(100 - 100 * (0.5 * self.cpu_free[n.name] / self.max_cpu + 0.5 * free_gpu / self.max_gpu))
            if score > top:
                top, best = score, [(n, got)]
            elif score == top:
                best.append((n, got))
        if not best:
            return Plan((), ())
        n, positions = best[self.rng.randrange(len(best))]
        self.cpu_free[n.name] -= t.cpu_milli
        self.mem_free[n.name] -= t.memory_mib
        shared = t.num_gpu == 1 and t.gpu_milli < WHOLE
        for i in positions:
            self.gpu_free[n.name][i] -= t.gpu_milli if shared else WHOLE
        gpus = [n.gpus[i] for i in positions]
        return Plan((Placement(job_id, n.cluster, n.name, tuple(g.uuid for g in gpus), tuple(g.index for g in gpus),
                               gpu_model=gpus[0].model if gpus else "", gpu_fraction_milli=t.gpu_milli if shared
                               else 0, cpu_milli=t.cpu_milli, memory_mib=t.memory_mib),), ())


def fill(nodes: list[Node], tasks: list[Task], policy_name: str, seed: int = 0, *, tune: float = TUNE) -> FillResult:
    """One seed of the artifact's experiment (module docstring) with a gpupool policy or `fgd-best-fit`.
    `unallocated_gpu_share` is 1 − the mean allocated share over the samples at 100% arrived."""
    wall0 = time.perf_counter()
    rng = random.Random(seed)
    capacity = fill_capacity(nodes, tasks)
    if policy_name in BASELINES:
        baseline = BestFitBaseline(nodes, random.Random(seed + 1_000_003))
        sched = None
    else:
        baseline = None
        sched = fill_scheduler(nodes, policy_name, [t.request(t.name, 0.0, "fill") for t in tasks])
    ledger = Ledger(nodes)
    arrived = 0.0
    at_100: list[float] = []
    curve: list[tuple[float, float]] = [(0.0, 1.0)]
    failed = 0
    failed_gpu = 0.0
    i = 0
    for t in arrivals(tasks, capacity, rng, tune):
        i += 1
        req = t.request(f"fill-{i:06d}", float(i), "fill")
        plan = baseline.place(t, req.job_id) if baseline is not None else sched.cycle([req], float(i))  # type: ignore[union-attr]
        ledger.apply(plan, {req.job_id: req})
        if not plan.placements:
            failed += 1
            failed_gpu += t.gpu_demand
        arrived += t.gpu_demand
        share = ledger.allocated_milli() / (capacity * WHOLE)
        pct = round(100 * arrived / capacity)
        if pct == 100:
            at_100.append(share)
        if pct > round(100 * curve[-1][0]) and t.gpu_demand:
            curve.append((pct / 100, 1.0 - share))
    allocated = sum(at_100) / len(at_100) if at_100 else ledger.allocated_milli() / (capacity * WHOLE)
    metrics = fill_metrics(policy_name, seed, nodes, capacity, tasks_arrived=i, failed=failed, failed_gpu=failed_gpu,
                           arrived=arrived, unallocated=1.0 - allocated, curve=curve, wall0=wall0,
                           definition="fgd", tune=tune, samples_at_100=len(at_100))
    return FillResult(metrics, curve)
