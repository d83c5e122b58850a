"""Pieces of a cycle that need no scheduler state: the workload mix derived from pending jobs, fair-share
history, priority class lookup, and the time spent per phase."""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Callable, Iterable, Mapping

from libs.core.model import WHOLE, JobRequest
from libs.core.objmemo import ByObject
from libs.core.policy import Policy, PriorityClass, WorkloadShape

_CPU, _MEM = "<cpu>", "<memory>"  # fair-share history keys next to GPU model names


def job_spec(job: JobRequest) -> tuple[int, int, tuple[str, ...], str] | None:
    """What the workload mix groups a job by: (GPUs on one node — a gang member's share —, share of each GPU in
    milli, allowed GPU models, MIG profile); None for a job without GPUs."""
    models = tuple(sorted(set(job.gpu_models)))
    if job.mig_profile:
        return (1, WHOLE, models, job.mig_profile)
    if job.gpu_fraction_milli:
        return (1, job.gpu_fraction_milli, models, "")
    if job.gpus > 0:
        return (min(job.gpus_per_node or job.gpus, 8), WHOLE, models, "")
    return None


def workload_from_counts(counts: Mapping[tuple, float], limit: int = 32,
                         hosts: Mapping[tuple, tuple[int, int]] | None = None) -> tuple[WorkloadShape, ...]:
    """The workload mix, one rule for the scheduler, the live fragmentation gauge and the simulator. `counts`:
    `job_spec` -> how often it occurred; `hosts`: spec -> the median (CPU milli-cores, memory MiB) of its jobs.
    The `limit` most common specs (0: all), each weighted by how often it occurs (FGD's pod popularity), not by
    its GPU demand: by demand, unpinned work filled a GPU model that much pinned work needed. Every spec up to the
    limit stays in, however rare: cutting the mix at FGD's 95% coverage dropped the rare big shapes, and whole
    nodes were no longer kept for them."""
    hosts = hosts or {}
    top = sorted(counts.items(), key=lambda kv: (-kv[1], kv[0]))
    out: list[WorkloadShape] = []
    for spec, n in top[:limit] if limit else top:
        gpus, milli, models, prof = spec
        cpu, mem = hosts.get(spec, (0, 0))
        out.append(WorkloadShape(gpus=gpus, gpu_milli=milli, weight=float(n), cpu_milli=cpu, memory_mib=mem,
                                 gpu_models=models, mig_profile=prof))
    return tuple(out)


def derive_workload(jobs: Iterable[JobRequest], limit: int = 32,
                    spec_of: Callable[[JobRequest], tuple | None] = job_spec) -> tuple[WorkloadShape, ...]:
    """The workload mix of `jobs` (`workload_from_counts` over their `job_spec`s), each spec with the median CPU
    and memory its jobs ask for."""
    groups: dict[tuple, list[tuple[int, int]]] = {}
    for j in jobs:
        spec = spec_of(j)
        if spec is not None:
            groups.setdefault(spec, []).append((j.cpu_milli, j.memory_mib))
    hosts = {}
    for spec, got in groups.items():
        cpus = sorted(h[0] for h in got)
        mems = sorted(h[1] for h in got)
        hosts[spec] = (cpus[len(cpus) // 2], mems[len(mems) // 2])
    return workload_from_counts({spec: len(got) for spec, got in groups.items()}, limit, hosts)


TYPICAL_COVERAGE = 0.95  # FGD's popularity threshold: the most common requests until they cover this share of jobs


def request_spec(job: JobRequest) -> tuple[int, int, tuple[str, ...], str, int, int]:
    """FGD's exact request, what the typical mix groups a job by: `job_spec`'s GPU shape with the host CPU
    milli-cores and memory MiB; a job without GPUs is (0, 0, (), "", CPU, memory)."""
    shape = job_spec(job) or (0, 0, (), "")
    return (*shape, job.cpu_milli, job.memory_mib)


def typical_requests(counts: Mapping[tuple, float], limit: int = 64,
                     coverage: float = TYPICAL_COVERAGE) -> tuple[WorkloadShape, ...]:
    """FGD's typical requests (`Policy.typical_mix`): `counts` maps a `request_spec` to how often it occurred. The
    most common requests until they cover `coverage` of all jobs (at most `limit`; 0: no limit), each weighted by
    its probability — its count over all jobs. The rarer requests' probability is not handed to the common ones
    (the weights sum to about `coverage`; the rest counts for nothing), and requests without GPUs stay in: FGD
    counts every free GPU of a node as lost to them. Rare big shapes follow at weight 0 (`_rare_tail`)."""
    total = float(sum(counts.values()))
    out: list[WorkloadShape] = []
    covered = 0.0
    for spec, n in sorted(counts.items(), key=lambda kv: (-kv[1], kv[0])):
        if (limit and len(out) >= limit) or covered >= coverage * total - 1e-9:
            break
        gpus, milli, models, prof, cpu, mem = spec
        out.append(WorkloadShape(gpus=gpus, gpu_milli=milli, weight=n / total, cpu_milli=cpu, memory_mib=mem,
                                 gpu_models=models, mig_profile=prof))
        covered += n
    return tuple(out) + _rare_tail(counts, {(w.gpus, w.gpu_milli, w.gpu_models, w.mig_profile, w.cpu_milli,
                                             w.memory_mib) for w in out})


def _rare_tail(counts: Mapping[tuple, float], kept: set) -> tuple[WorkloadShape, ...]:
    """The rarer whole-GPU requests left out of the typical mix, at weight 0: they count for nothing in the
    fragmentation score, as in FGD, but the scheduler still knows them, and the last node able to run one is not
    broken by smaller work that fits elsewhere (`Policy.scarce_hosts`)."""
    return tuple(
        WorkloadShape(gpus=gpus, gpu_milli=WHOLE, weight=0.0, cpu_milli=cpu, memory_mib=mem, gpu_models=models)
        for gpus, milli, models, prof, cpu, mem in sorted(counts)
        if gpus > 0 and milli >= WHOLE and not prof and (gpus, milli, models, prof, cpu, mem) not in kept
    )


def derive_typical(jobs: Iterable[JobRequest], limit: int = 64,
                   spec_of: Callable[[JobRequest], tuple] = request_spec,
                   coverage: float = TYPICAL_COVERAGE) -> tuple[WorkloadShape, ...]:
    """The typical-request mix of `jobs`: `typical_requests` over their `request_spec`s."""
    return typical_requests(Counter(map(spec_of, jobs)), limit, coverage)


def mix_of(jobs: Iterable[JobRequest], policy: Policy,
           memo: dict[Callable, ByObject] | None = None) -> tuple[WorkloadShape, ...]:
    """The workload mix `policy` scores fragmentation against, derived from `jobs` by its rule: FGD's typical
    requests (`typical_mix`) or the most common GPU shapes (`derive_workload`). `memo`, a dict the caller keeps
    across calls: each request's spec, kept by the request object (the same mix)."""
    typical = bool(policy.setting("typical_mix"))
    spec_of: Callable[[JobRequest], tuple | None] = request_spec if typical else job_spec
    if memo is not None:
        jobs = jobs if isinstance(jobs, list | tuple) else list(jobs)
        by = memo.get(spec_of)
        if by is None:
            by = memo[spec_of] = ByObject(spec_of)
        specs = by.of(jobs)
        if typical:
            return typical_requests(Counter(specs), 2 * policy.max_workload_shapes, policy.setting("typical_coverage"))
        known = dict(zip(map(id, jobs), specs, strict=True))
        spec_of = lambda j: known[id(j)]  # noqa: E731 (the specs just worked out, by the very request)
    if typical:
        return derive_typical(jobs, 2 * policy.max_workload_shapes, spec_of,  # type: ignore[arg-type]
                              policy.setting("typical_coverage"))
    return derive_workload(jobs, policy.max_workload_shapes, spec_of)


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
