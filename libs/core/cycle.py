"""Pieces of a cycle that need no scheduler state: the workload mix derived from pending jobs, fair-share
history, priority class lookup, and the time spent per phase."""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable

from libs.core.model import WHOLE, JobRequest
from libs.core.policy import PriorityClass, WorkloadShape

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


def decayed_history(history: Iterable, half_life_s: float, now: float) -> dict[tuple[str, str], float]:
    """Fair-share history as an average amount held over the half-life window (so it adds to what is held now):
    each usage record's decayed integral divided by the window's length hl / ln 2; GPUs in milli, CPU in
    milli-cores, memory in MiB, keyed (team, GPU model | <cpu> | <memory>)."""
    hist: dict[tuple[str, str], float] = {}
    if half_life_s <= 0:
        return hist
    window = half_life_s / math.log(2)
    for u in history:
        f = 0.5 ** (max(0.0, now - u.as_of) / half_life_s) / window
        for key, amount in (((u.team, u.gpu_model), u.gpu_seconds * WHOLE), ((u.team, _CPU), u.cpu_seconds * 1000),
                            ((u.team, _MEM), u.memory_mib_seconds)):
            if amount:
                hist[key] = hist.get(key, 0.0) + amount * f
    return hist
