"""Job kinds change policy (per-kind data in `Policy.kinds`): inference is protected and spread, dev goes to the
shared pool, batch never holds nodes; non-preemptible work stays within guarantees; phase timings."""

from __future__ import annotations

import itertools

from core_builders import cluster, job, node, running, snapshot

from libs.core import KindPolicy, Policy, Scheduler, schedule, teams_quota
from libs.core.schedule import PHASES


def test_inference_is_not_preemptible_by_default_but_a_job_may_say_otherwise():
    def plan_for(**kw):
        snap = snapshot(cluster(1, 1), running=[running("r", "node000", [0], priority_class="normal", **kw)])
        return schedule(snap, [job("urgent", 1, priority_class="high")], Policy(), now=3600.0)

    assert [p.job_id for p in plan_for(kind="training").preemptions] == ["r"]
    assert [p.job_id for p in plan_for().preemptions] == ["r"]  # kind unknown: the class decides
    assert plan_for(kind="inference").preemptions == ()
    assert [p.job_id for p in plan_for(kind="inference", preemptible=True).preemptions] == ["r"]
    # the kinds are data: a policy without the protection preempts inference too
    open_kinds = tuple(k for k in Policy().kinds if k.kind != "inference") + (KindPolicy("inference"),)
    snap = snapshot(cluster(1, 1), running=[running("r", "node000", [0], kind="inference")])
    plan = schedule(snap, [job("urgent", 1, priority_class="high")], Policy(kinds=open_kinds), now=3600.0)
    assert [p.job_id for p in plan.preemptions] == ["r"]


def test_a_placed_inference_job_is_protected_in_later_cycles_of_a_kept_scheduler():
    sched = Scheduler(snapshot(cluster(1, 1)), Policy())
    assert sched.cycle([job("serve", 1, kind="inference")], now=0.0).placements
    later = sched.cycle([job("urgent", 1, priority_class="high", at=5000.0)], now=5000.0)
    assert later.preemptions == () and later.reason_of("urgent").reason == "NoFeasibleNode"


def test_inference_replicas_spread_over_racks_then_nodes_even_under_best_fit():
    nodes = [node("a0", 4, topology="rack-a"), node("a1", 4, topology="rack-a"), node("b0", 4, topology="rack-b")]
    snap = snapshot(nodes, running=[running("svc#0", "a0", [0], kind="inference", replica_group="svc")])
    replica = job("svc#1", 1, kind="inference", replica_group="svc")
    # best-fit alone packs next to the first replica; the inference kind sends it to the other rack
    assert schedule(snap, [job("other", 1)], Policy(name="best-fit"), now=0.0).placements[0].node == "a0"
    assert schedule(snap, [replica], Policy(name="best-fit"), now=0.0).placements[0].node == "b0"
    # two more replicas in one cycle: the first takes the free rack, the next at least another node
    more = [job(f"svc#{i}", 1, kind="inference", replica_group="svc", at=float(i)) for i in (1, 2)]
    placed = {p.job_id: p.node for p in schedule(snap, more, Policy(name="best-fit"), now=0.0).placements}
    assert placed["svc#1"] == "b0" and placed["svc#2"] == "a1"
    # soft: when only the group's node has room, the replica still runs
    full = snapshot([node("a0", 4), node("b0", 1)], running=[
        running("svc#0", "a0", [0], kind="inference", replica_group="svc"), running("x", "b0", [0])])
    assert schedule(full, [replica], Policy(), now=0.0).placements[0].node == "a0"


def test_dev_prefers_the_shared_pool_while_batch_keeps_it_for_fractions():
    nodes = [node("excl", 8), node("shared", 8, sharing="fractional")]
    assert schedule(snapshot(nodes), [job("d", 1, kind="dev")], Policy(), now=0.0).placements[0].node == "shared"
    assert schedule(snapshot(nodes), [job("b", 1, kind="batch")], Policy(), now=0.0).placements[0].node == "excl"


def test_dev_packs_onto_partly_used_nodes_where_the_policy_itself_is_indifferent():
    snap = snapshot(cluster(2, 8), running=[running("r", "node001", range(4))])
    neutral = Policy(w_frag=0.0, w_binpack=0.0, w_topology=0.0)  # every node scores the same: lowest index wins
    assert schedule(snap, [job("b", 1, kind="batch")], neutral, now=0.0).placements[0].node == "node000"
    assert schedule(snap, [job("d", 1, kind="dev")], neutral, now=0.0).placements[0].node == "node001"
    assert schedule(snap, [job("t", 1, kind="training")], neutral, now=0.0).placements[0].node == "node001"


def test_batch_never_gets_a_reservation_so_others_are_not_held_back():
    snap = snapshot(cluster(2, 8), running=[
        running("r0", "node000", range(4), max_runtime_s=100.0),
        running("r1", "node001", range(4), max_runtime_s=200.0),
    ])
    for kind, reserved in (("training", True), ("batch", False)):
        jobs = [job("big", 16, gang_nodes=2, gpus_per_node=8, kind=kind), job("long", 4, at=1.0)]
        plan = schedule(snap, jobs, Policy(), now=10.0)
        assert bool(plan.reservations) is reserved
        assert plan.reason_of("big").reason == "WaitingForGang"
        assert bool(plan.placements_of("long")) is not reserved


def test_non_preemptible_work_may_use_only_its_teams_guarantee():
    quotas = teams_quota({"a": 2, "b": 6})
    snap = snapshot(cluster(1, 8))
    plan = schedule(snap, [job("pinned", 3, team="a", priority_class="high")], Policy(quotas=quotas), now=0.0)
    assert plan.reason_of("pinned").reason == "QuotaExceeded"
    assert "not preemptible" in plan.reason_of("pinned").message
    assert schedule(snap, [job("pinned", 2, team="a", priority_class="high")], Policy(quotas=quotas), now=0.0).placements
    borrow = job("borrows", 3, team="a", priority_class="high", preemptible=True)
    assert schedule(snap, [borrow], Policy(quotas=quotas), now=0.0).placements
    off = Policy(quotas=quotas, nonpreemptible_within_guarantee=False)
    assert schedule(snap, [job("pinned", 3, team="a", priority_class="high")], off, now=0.0).placements


def _fake_clock():
    ticks = itertools.count()
    return lambda: next(ticks) * 1e-6  # every reading is one microsecond later


def test_cycle_reports_time_per_phase_only_with_an_injected_clock():
    snap = snapshot(cluster(1, 2), running=[running("low", "node000", [0, 1], priority_class="low")])
    jobs = [job("urgent", 2, priority_class="high"), job("big", 16, gang_nodes=2, gpus_per_node=8, at=1.0)]
    assert not any(k.endswith("_us") for k, _ in schedule(snap, jobs, Policy(), now=3600.0).stats)
    clock = _fake_clock()
    sched = Scheduler(snap, Policy(), clock=clock)
    start = clock()
    stats = dict(sched.cycle(jobs, now=3600.0).stats)
    spent = clock() - start
    assert {f"{p}_us" for p in PHASES} <= set(stats)
    assert all(stats[f"{p}_us"] >= 1 for p in ("order", "quota", "place", "reasons", "preemption", "backfill"))
    # every microsecond of the cycle is charged to exactly one phase
    assert 0 < spent * 1e6 - sum(stats[f"{p}_us"] for p in PHASES) <= 2
    one_shot = dict(schedule(snap, jobs, Policy(), now=3600.0, clock=_fake_clock()).stats)
    assert one_shot["build_us"] >= 1 and one_shot["normalize_us"] >= one_shot["build_us"]
