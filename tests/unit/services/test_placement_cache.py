"""Placement's kept scheduler (services/placement/cache.py) plans exactly what a scheduler built from the same
snapshot plans (`libs.core.schedule`, what placement ran before and what `gpupool decisions replay` runs), over
randomized sequences of arrivals, completions, placements the store took or refused, cycles that failed, node and
policy changes, preemptions; and it rebuilds whenever it must not be trusted."""

from __future__ import annotations

import random
from dataclasses import replace

import pytest

from libs.core import (
    Allocation,
    Gpu,
    JobRequest,
    Node,
    Policy,
    PriorityClass,
    Snapshot,
    WorkloadShape,
    schedule,
    teams_quota,
)
from services.placement.cache import KeptScheduler

CLASSES = (PriorityClass("low", 0, preemptible=True), PriorityClass("high", 100, preemptible=False))


def fleet(n: int, cordoned: set[str] = frozenset(), sick: set[str] = frozenset()) -> tuple[Node, ...]:
    return tuple(
        Node(name=f"n{i:03d}", cluster="c", topology=f"r{i // 4}", cpu_milli=64_000, memory_mib=512_000,
             schedulable=f"n{i:03d}" not in cordoned,
             gpus=tuple(Gpu(uuid=f"G{i}-{g}", index=g, model="H100" if i % 3 else "A100", memory_mib=81_920,
                            numa_node=g // 4, healthy=f"G{i}-{g}" not in sick) for g in range(8)))
        for i in range(n))


class World:
    """A store as placement's would hold it: nodes, live allocations (as the snapshot reads them), wanted jobs."""

    def __init__(self, seed: int, nodes: int = 24, high: float = 0.04) -> None:
        self.rng = random.Random(seed)
        self.high = high  # the share of arrivals in the class that may preempt
        self.n = nodes
        self.cordoned: set[str] = set()
        self.sick: set[str] = set()
        self.nodes = fleet(nodes)
        self.running: dict[str, list[Allocation]] = {}
        self.pending: dict[str, JobRequest] = {}
        self.seq = 0

    def arrive(self, now: float) -> None:
        rng = self.rng
        for _ in range(rng.randrange(0, 10)):
            self.seq += 1
            g = rng.choice((1, 1, 1, 2, 4, 8))
            gang = rng.random() < 0.08
            replicas = rng.random() < 0.05
            high = rng.random() < self.high
            big = rng.random() < 0.03  # another host shape: the mix's host shapes change now and then
            job_id = f"j{rng.randrange(10 ** 6):06d}-{self.seq}"
            base = JobRequest(job_id=job_id, team=rng.choice("abc"), project="p", gpus=g * (2 if gang else 1),
                              gang_nodes=2 if gang else 0, gpus_per_node=g if gang else 0, submitted_at=now,
                              cpu_milli=4000 if big else 1000, memory_mib=32_768 if big else 4096, priority_class="high" if high else "low",
                              gpu_models=("H100",) if rng.random() < 0.3 else (),
                              max_runtime_s=rng.choice((None, 600.0, 3600.0)))
            if replicas and not gang:
                for r in range(2):
                    unit = f"{job_id}#{r}"
                    self.pending[unit] = replace(base, job_id=unit, replica_group=job_id)
            else:
                self.pending[job_id] = base

    def snapshot(self) -> Snapshot:
        return Snapshot(nodes=self.nodes, running=tuple(a for unit in self.running for a in self.running[unit]))

    def complete(self) -> None:
        for unit in [u for u in self.running if self.rng.random() < 0.07]:
            del self.running[unit]

    def change_nodes(self) -> None:
        rng = self.rng
        if rng.random() < 0.5:
            self.cordoned ^= {f"n{rng.randrange(self.n):03d}"}
        else:
            self.sick ^= {f"G{rng.randrange(self.n)}-{rng.randrange(8)}"}
        self.nodes = fleet(self.n, self.cordoned, self.sick)

    def commit(self, plan, now: float, refused: set[str]) -> None:  # type: ignore[no-untyped-def]
        """What the store keeps of a plan: the units it took (granted a moment after the cycle's `now`), victims
        marked as being preempted (never chosen again)."""
        for p in plan.placements:
            if p.job_id in refused:
                continue
            req = self.pending[p.job_id]
            self.running.setdefault(p.job_id, []).append(Allocation(
                job_id=p.job_id, team=req.team, node=p.node, gpu_uuids=p.gpu_uuids, started_at=now + 0.0137,
                project=req.project, priority_class=req.priority_class, gpu_model=p.gpu_model,
                max_runtime_s=req.max_runtime_s, cpu_milli=p.cpu_milli, memory_mib=p.memory_mib,
                replica_group=req.replica_group))
        for p in plan.placements:
            if p.job_id not in refused:
                self.pending.pop(p.job_id, None)
        for v in plan.preemptions:
            self.running[v.job_id] = [replace(a, preemptible=False) for a in self.running.get(v.job_id, [])]


def same(a, b) -> bool:  # type: ignore[no-untyped-def]
    """Equal plans (their stats aside: counters of the work done, which a kept scheduler's memos save)."""
    for part in ("placements", "pending", "preemptions", "mig_reconfigs", "reservations"):
        mine, theirs = getattr(a, part), getattr(b, part)
        if mine != theirs:
            first = next((i for i, (x, y) in enumerate(zip(mine, theirs, strict=False)) if x != y),
                         min(len(mine), len(theirs)))
            print(part, "differs at", first, mine[first:first + 1], theirs[first:first + 1])
            return False
    return True


@pytest.mark.parametrize("seed", range(12))
@pytest.mark.parametrize("quotas", [False, True], ids=["no-quotas", "guarantees"])
def test_the_kept_scheduler_plans_what_a_scheduler_built_from_the_snapshot_plans(seed: int, quotas: bool) -> None:
    """A full pool searches for victims in most cycles (fair share without quotas; reclaim and priority with
    guarantees and a class that preempts); a cycle that preempted rebuilds: both must plan what a fresh build
    plans, and without preemptions most cycles keep the scheduler."""
    w = World(seed, high=0.04 if quotas else 0.0)
    kept = KeptScheduler()
    policy = Policy(name="default", priority_classes=CLASSES,
                    quotas=teams_quota({"a": 80, "b": 56, "c": 56}) if quotas else Policy().quotas)
    reasons, preempted = {"": 0}, 0
    for step in range(120):
        now = 10_000.0 + 30 * step
        w.arrive(now)
        w.complete()
        if w.rng.random() < 0.05:
            w.change_nodes()
        if step == 60:
            policy = replace(policy, min_runtime_s=120.0)
        requests = list(w.pending.values())
        if not requests:
            continue
        snap = w.snapshot()
        expected = schedule(snap, requests, policy, now=now)
        got = kept.plan(snap, requests, policy, now)
        assert same(got, expected), f"step {step}: kept ({kept.rebuilt or 'kept'}) differs from a fresh build"
        reasons[kept.rebuilt] = reasons.get(kept.rebuilt, 0) + 1
        preempted += bool(got.preemptions)
        if step % 17 == 16:
            continue  # the cycle's transaction failed: nothing of it is in the store, nor trusted
        refused = {p.job_id for p in got.placements if w.rng.random() < 0.05}  # a stale unit the store refused
        w.commit(got, now, refused)
        kept.committed()
    assert reasons["none yet"] == 1 and reasons.get("not committed"), reasons
    if quotas:
        assert preempted and reasons.get("preempted"), reasons  # the sequence covered preemption
    else:
        assert reasons[""] > 50, reasons  # most cycles kept the scheduler
        assert {"nodes", "mix"} <= set(reasons), reasons  # and it was rebuilt when it had to be


def test_a_failed_cycle_a_preemption_and_a_lost_lease_make_the_next_cycle_rebuild() -> None:
    w = World(1, nodes=2)
    kept = KeptScheduler()
    policy = Policy(name="default", priority_classes=CLASSES, quotas=teams_quota({"a": 8, "b": 8}))
    w.pending = {f"low{i}": JobRequest(job_id=f"low{i}", team="a", project="p", gpus=8, submitted_at=1.0,
                                       priority_class="low") for i in range(2)}
    plan = kept.plan(w.snapshot(), list(w.pending.values()), policy, 100.0)
    assert kept.rebuilt == "none yet" and len(plan.placements) == 2
    w.commit(plan, 100.0, set())
    kept.committed()
    kept.plan(w.snapshot(), [JobRequest(job_id="x", team="a", project="p", gpus=1, submitted_at=2.0,
                                        priority_class="low")], policy, 200.0)
    assert kept.rebuilt == ""  # kept
    # not committed (the transaction failed): the next cycle builds again
    kept.plan(w.snapshot(), [JobRequest(job_id="x", team="a", project="p", gpus=1, submitted_at=2.0,
                                        priority_class="low")], policy, 300.0)
    assert kept.rebuilt == "not committed"
    kept.committed()
    high = JobRequest(job_id="hi", team="b", project="p", gpus=8, submitted_at=3.0, priority_class="low")
    plan = kept.plan(w.snapshot(), [high], policy, 10_000.0)
    assert kept.rebuilt == "" and plan.preemptions  # a preemption: the victims' state is the store's to say
    kept.committed()
    kept.plan(w.snapshot(), [high], policy, 10_001.0)
    assert kept.rebuilt == "preempted"
    kept.committed()
    kept.forget()  # another replica led meanwhile
    kept.plan(w.snapshot(), [high], policy, 10_002.0)
    assert kept.rebuilt == "forgotten"


def test_a_released_mig_slice_leaves_no_instance_behind_in_the_kept_scheduler() -> None:
    """The store's snapshot holds exactly the MIG instances live allocations hold (the agent destroys one with its
    release); a scheduler that only finished the holder would still see the instance, idle, and plan onto it."""
    nodes = (Node(name="m", cluster="c", gpus=(
        Gpu(uuid="M0", index=0, model="A100-SXM4-80GB", memory_mib=81_920, sharing="mig"),
        Gpu(uuid="W1", index=1, model="A100-SXM4-80GB", memory_mib=81_920))),)
    policy = Policy(name="default", workload=(WorkloadShape(gpus=1, gpu_milli=1000, weight=1.0),))  # a fixed mix
    kept = KeptScheduler()
    running: dict[str, Allocation] = {}
    steps = [("slice", "1g.10gb", ()), ("whole", "", ()), ("again", "1g.10gb", ("slice",))]
    for step, (job_id, profile, ended) in enumerate(steps):
        now = 100.0 * (step + 1)
        for gone in ended:
            del running[gone]
        request = JobRequest(job_id=job_id, team="a", project="p", gpus=1, submitted_at=now, mig_profile=profile)
        snap = Snapshot(nodes=nodes, running=tuple(running.values()))
        plan = kept.plan(snap, [request], policy, now)
        assert same(plan, schedule(snap, [request], policy, now=now)), (step, kept.rebuilt)
        kept.committed()
        p = plan.placements[0]
        running[job_id] = Allocation(job_id=job_id, team="a", node="m", gpu_uuids=p.gpu_uuids, started_at=now,
                                     project="p", gpu_model=p.gpu_model,
                                     mig=((p.gpu_uuids[0], p.mig),) if p.mig else ())
    assert kept.rebuilt == "mig"
