"""Hypothesis guards the invariants: nothing over-allocated, MIG layouts valid, gangs all or nothing, an idle
team's guarantee reclaimable, no victim outranks its preemptor. Plans are checked by the simulator's applier, whose
ledger is written independently of the core's indexes."""

from __future__ import annotations

from core_builders import FAST, node, snapshot
from hypothesis import given
from hypothesis import strategies as st

from libs.core import Allocation, JobRequest, Policy, schedule, teams_quota
from libs.core import mig as migcat
from libs.sim.applier import Ledger

MIG_MODELS = ("A100-40GB", "A100-80GB", "H100-80GB", "H200-141GB")
CLASSES = ("production-inference", "high", "normal", "low", "best-effort")
PROFILES = sorted({p for m in MIG_MODELS for p in migcat.profiles_for(m)})


@st.composite
def nodes(draw):
    out = []
    for i in range(draw(st.integers(1, 4))):
        sharing = draw(st.sampled_from(("exclusive", "fractional", "mig")))
        model = draw(st.sampled_from(MIG_MODELS))
        tracked = draw(st.booleans())
        out.append(node(f"n{i}", draw(st.integers(1, 8)), model=model, sharing=sharing,
                        topology=draw(st.sampled_from(("r1", "r2"))),
                        cpu=32000 if tracked else 0, mem=131072 if tracked else 0,
                        unhealthy=tuple(draw(st.sets(st.integers(0, 7), max_size=2)))))
    return out


@st.composite
def jobs(draw, prefix: str, max_size: int = 14):
    out = []
    for i in range(draw(st.integers(0, max_size))):
        kind = draw(st.sampled_from(("whole", "gang", "flex", "frac", "mig", "cpu")))
        common = dict(
            job_id=f"{prefix}{i}",
            team=draw(st.sampled_from(("a", "b", "c"))),
            submitted_at=float(draw(st.integers(0, 20))),
            priority_class=draw(st.sampled_from(CLASSES)),
            preemptible=draw(st.sampled_from((None, True, False))),
            cpu_milli=draw(st.sampled_from((0, 1000, 8000))),
            memory_mib=draw(st.sampled_from((0, 4096))),
            max_runtime_s=draw(st.sampled_from((None, 60.0, 10_000.0))),
        )
        if kind == "whole":
            out.append(JobRequest(gpus=draw(st.integers(1, 8)), **common))
        elif kind == "gang":
            k, m = draw(st.integers(1, 3)), draw(st.integers(1, 4))
            out.append(JobRequest(gpus=k * m, gang_nodes=k, gpus_per_node=m, **common))
        elif kind == "flex":
            out.append(JobRequest(gpus=draw(st.integers(2, 12)), gang=True, **common))
        elif kind == "frac":
            out.append(JobRequest(gpus=1, gpu_fraction_milli=draw(st.integers(1, 999)),
                                  gpu_memory_mib=draw(st.sampled_from((0, 4096, 20000))), **common))
        elif kind == "mig":
            out.append(JobRequest(gpus=1, mig_profile=draw(st.sampled_from(PROFILES)), **common))
        else:
            common["cpu_milli"] = max(common["cpu_milli"], 500)
            out.append(JobRequest(gpus=0, **common))
    return out


def _as_running(plan, jobs_by_id, started_at):
    allocs = []
    for p in plan.placements:
        j = jobs_by_id[p.job_id]
        allocs.append(Allocation(
            job_id=p.job_id, team=j.team, node=p.node, gpu_uuids=() if p.mig else p.gpu_uuids,
            started_at=started_at, priority_class=j.priority_class, preemptible=j.preemptible, kind=j.kind,
            gpu_fraction_milli=p.gpu_fraction_milli, gpu_memory_mib=p.gpu_memory_mib,
            mig=((p.gpu_uuids[0], p.mig),) if p.mig else (), cpu_milli=p.cpu_milli, memory_mib=p.memory_mib,
        ))
    return allocs


def _check(snap, plan, pending, policy_now):
    ledger = Ledger(snap.nodes, snap.allocated_gpus)
    ledger.hold_allocations(snap.running)
    ledger.apply(plan, {j.job_id: j for j in pending})  # raises on any over-allocation or partial gang
    ledger.invariants()
    decided = {p.job_id for p in plan.placements} | {r.job_id for r in plan.pending}
    assert decided == {j.job_id for j in pending}


@FAST
@given(cluster=nodes(), first=jobs("r"), second=jobs("p"), policy=st.sampled_from(("default", "best-fit", "fifo")))
def test_no_gpu_slice_or_fraction_is_ever_over_allocated_and_gangs_are_all_or_nothing(cluster, first, second,
                                                                                      policy):
    snap0 = snapshot(cluster)
    plan0 = schedule(snap0, first, Policy(name=policy), now=0.0)
    _check(snap0, plan0, first, 0.0)
    snap1 = snapshot(cluster, running=_as_running(plan0, {j.job_id: j for j in first}, started_at=0.0))
    plan1 = schedule(snap1, second, Policy(name=policy), now=5000.0)
    _check(snap1, plan1, second, 5000.0)


@FAST
@given(cluster=nodes(), first=jobs("r"), second=jobs("p"))
def test_no_victim_outranks_its_preemptor_and_only_eligible_work_is_preempted(cluster, first, second):
    snap0 = snapshot(cluster)
    plan0 = schedule(snap0, first, Policy(), now=0.0)
    started = {j.job_id: (0.0 if i % 2 else 4900.0) for i, j in enumerate(first)}
    allocs = [a for a in _as_running(plan0, {j.job_id: j for j in first}, 0.0)]
    allocs = [Allocation(**{**{f: getattr(a, f) for f in a.__slots__}, "started_at": started[a.job_id]})
              for a in allocs]
    snap1 = snapshot(cluster, running=allocs)
    quotas = teams_quota({"a": 4, "b": 4})
    plan1 = schedule(snap1, second, Policy(quotas=quotas), now=5000.0)
    classes = {c.name: c for c in Policy().priority_classes}
    by_id = {j.job_id: j for j in first + second}
    for p in plan1.preemptions:
        victim, preemptor = by_id[p.job_id], by_id[p.preemptor]
        vc, pc = classes[victim.priority_class], classes[preemptor.priority_class]
        assert vc.value <= pc.value
        assert victim.preemptible is not False and (victim.preemptible or vc.preemptible)
        min_rt = vc.min_runtime_s if vc.min_runtime_s is not None else Policy().min_runtime_s
        assert 5000.0 - started[p.job_id] >= min_rt
        if victim.team == preemptor.team:
            assert vc.value < pc.value
            # PreemptedWithinQuota: the preemptor's quota refused it, and the victim is of its own quota subtree
            assert p.reason in ("PreemptedByPriority", "PreemptedWithinQuota")
        else:
            assert p.reason == "ReclaimedForGuarantee"


@FAST
@given(
    n_nodes=st.integers(1, 4),
    per_node=st.sampled_from((2, 4, 8)),
    sizes=st.lists(st.tuples(st.integers(1, 2), st.sampled_from(("batch", "training", "inference", "dev")),
                             st.sampled_from(CLASSES), st.sampled_from((None, True, False))),
                   min_size=1, max_size=40),
    share_a=st.floats(0.1, 0.6),
    ask=st.integers(1, 8),
    a_class=st.sampled_from(CLASSES),
)
def test_guaranteed_quota_of_an_idle_team_is_always_reclaimable_within_the_preemption_wait_bound(n_nodes, per_node, sizes, share_a, ask, a_class):
    nodes_ = [node(f"n{i}", per_node) for i in range(n_nodes)]
    capacity = n_nodes * per_node
    g_a = max(1, int(capacity * share_a))
    ask = min(ask, g_a)
    quotas = teams_quota({"a": g_a, "b": capacity - g_a})
    policy = Policy(quotas=quotas)
    # team b takes all it can with jobs of every kind and preemptibility, started long ago (its non-preemptible
    # work is admitted only within its own guarantee, so what it borrows stays reclaimable), in classes that do
    # not outrank a's job (no victim may outrank its preemptor)
    value = {c.name: c.value for c in policy.priority_classes}
    fill = []
    i = 0
    for size, kind, cls, pre in sizes * capacity:
        if value[cls] > value[a_class]:
            cls = a_class
        fill.append(JobRequest(f"b{i}", "b", size, 0.0, kind=kind, priority_class=cls, preemptible=pre))
        i += 1
        if i > 2 * capacity:
            break
    plan0 = schedule(snapshot(nodes_), fill, policy, now=0.0)
    allocs = _as_running(plan0, {j.job_id: j for j in fill}, started_at=0.0)
    free = capacity - sum(len(a.gpu_uuids) for a in allocs)
    # the guarantee is capacity, not a shape: a asks for GPUs on any nodes (a flexible gang), so the property is
    # not confused with fragmentation by b's non-preemptible work
    want = JobRequest("a-job", "a", ask, 10_000.0, priority_class=a_class, gang=ask > 1)
    plan1 = schedule(snapshot(nodes_, running=allocs), [want], policy, now=10_000.0)
    if plan1.placements_of("a-job"):
        return
    if not plan1.preemptions:  # the preemption-cost rule may wait, but never longer than its bound
        assert "so it waits" in plan1.reason_of("a-job").message, (plan1.pending, free)
        later = 10_000.0 + policy.max_preemption_wait_s
        plan1 = schedule(snapshot(nodes_, running=allocs), [want], policy, now=later)
    assert plan1.preemptions, (plan1.pending, free)
    gone = {p.job_id for p in plan1.preemptions}
    assert all(p.reason == "ReclaimedForGuarantee" for p in plan1.preemptions)
    survivors = [a for a in allocs if a.job_id not in gone]
    plan2 = schedule(snapshot(nodes_, running=survivors), [want], policy, now=10_001.0)
    assert plan2.placements_of("a-job"), plan2.pending


@FAST
@given(
    model=st.sampled_from(MIG_MODELS),
    busy=st.lists(st.tuples(st.sampled_from(PROFILES), st.integers(0, 7)), max_size=4),
    wanted=st.lists(st.sampled_from(PROFILES), max_size=8),
)
def test_mig_layout_planner_keeps_busy_instances_and_proposes_valid_layouts(model, busy, wanted):
    table = migcat.profiles_for(model)
    kept: list[tuple[str, int]] = []
    for name, start in busy:  # keep only a valid busy layout
        if name in table and migcat.valid_layout(model, kept + [(name, start)]):
            kept.append((name, start))
    created = migcat.plan_gpu_layout(model, kept, wanted)
    assert migcat.valid_layout(model, kept + created)
    assert all(name in wanted for name, _ in created)


def _state_view(state):
    return {
        (cid, key): frozenset(bucket)
        for cid, groups in state.groups.items()
        for key, bucket in groups.items()
    }


@FAST
@given(cluster=nodes(), first=jobs("r"), second=jobs("p"), done=st.sets(st.integers(0, 13)))
def test_incremental_indexes_match_a_fresh_build_after_placements_and_finishes(cluster, first, second, done):
    from libs.core import Scheduler

    cluster = [n for n in cluster if all(g.sharing != "mig" for g in n.gpus)]  # idle MIG instances differ by design
    sched = Scheduler(snapshot(cluster), Policy(name="best-fit"))
    plan1 = sched.cycle(first, now=0.0)
    running = _as_running(plan1, {j.job_id: j for j in first}, started_at=0.0)
    finished = {j.job_id for i, j in enumerate(first) if i in done}
    for job_id in sorted(finished):
        sched.finish(job_id)
    left = [a for a in running if a.job_id not in finished]
    plan2 = sched.cycle(second, now=10.0)
    running2 = left + _as_running(plan2, {j.job_id: j for j in second}, started_at=10.0)
    fresh = Scheduler(snapshot(cluster, running=running2), Policy(name="best-fit"))
    assert _state_view(sched.state) == _state_view(fresh.state)
    for key in set(sched.team_alloc) | set(fresh.team_alloc):
        assert sched.team_alloc.get(key, 0) == fresh.team_alloc.get(key, 0), key
