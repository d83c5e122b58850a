"""Ordering, quotas, preemption, reservations and backfill."""

from __future__ import annotations

from core_builders import cluster, job, node, running, snapshot

from libs.core import Allocation, Policy, QuotaEntry, QuotaTree, UsageRecord, schedule, teams_quota


def _order(plan):
    return [p.job_id for p in plan.placements]


def test_orders_by_priority_before_submit_time():
    snap = snapshot(cluster(1, 1))
    jobs = [job("early-normal", 1, at=0.0), job("late-high", 1, at=5.0, priority_class="high")]
    plan = schedule(snap, jobs, Policy(), now=10.0)
    assert _order(plan) == ["late-high"]


def test_equal_priority_goes_to_the_team_with_the_smaller_share():
    snap = snapshot(cluster(1, 4), running=[running("r", "node000", [0, 1], team="heavy", started=0.0)])
    jobs = [job("heavy-1", 1, team="heavy", at=0.0), job("light-1", 1, team="light", at=1.0),
            job("light-2", 1, team="light", at=2.0)]
    plan = schedule(snap, jobs, Policy(), now=10.0)
    assert _order(plan) == ["light-1", "light-2"]


def test_decayed_usage_history_counts_towards_fair_share():
    snap = snapshot(cluster(1, 1), usage=[UsageRecord("past", "H100-80GB", 1e7, as_of=0.0)])
    jobs = [job("p", 1, team="past", at=0.0), job("n", 1, team="new", at=1.0)]
    assert _order(schedule(snap, jobs, Policy(), now=0.0)) == ["n"]
    # after many half-lives the history is forgotten and submit time decides again
    long_after = 50 * Policy().fair_share_half_life_s
    assert _order(schedule(snap, jobs, Policy(), now=long_after)) == ["p"]


def _one_free_gpu(cpu: int = 0, mem: int = 0, usage=()):
    """4 GPUs, 3 held: "host-heavy" holds 1 GPU with most of the host's CPU and memory, "gpu-heavy" holds 2 GPUs
    with little of either. One GPU is left for the two teams' next jobs."""
    return snapshot([node("n", 4, cpu=cpu, mem=mem)], usage=usage, running=[
        running("h", "n", [0], team="host-heavy", cpu_milli=56000 if cpu else 0, memory_mib=200_000 if mem else 0),
        running("g", "n", [1, 2], team="gpu-heavy", cpu_milli=2000 if cpu else 0, memory_mib=8192 if mem else 0),
    ])


def test_fair_share_is_dominant_resource_share_cpu_can_dominate():
    jobs = [job("host-heavy-next", 1, team="host-heavy", at=0.0, cpu_milli=1000),
            job("gpu-heavy-next", 1, team="gpu-heavy", at=1.0, cpu_milli=1000)]
    # counting GPUs only (host not tracked): host-heavy holds 1/4 < 2/4, so it goes first
    assert _order(schedule(_one_free_gpu(), jobs, Policy(), now=10.0)) == ["host-heavy-next"]
    # with CPU tracked its dominant share is CPU, 56/64 > 2/4: the GPU-heavy team goes first
    assert _order(schedule(_one_free_gpu(cpu=64000), jobs, Policy(), now=10.0)) == ["gpu-heavy-next"]


def test_fair_share_memory_can_dominate():
    jobs = [job("host-heavy-next", 1, team="host-heavy", at=0.0), job("gpu-heavy-next", 1, team="gpu-heavy", at=1.0)]
    assert _order(schedule(_one_free_gpu(mem=262144), jobs, Policy(), now=10.0)) == ["gpu-heavy-next"]


def test_decayed_cpu_history_counts_towards_the_dominant_share_and_fades():
    # host-heavy holds nothing now but used a lot of CPU recently; gpu-heavy holds 2 of 4 GPUs
    past = UsageRecord("host-heavy", "", 0.0, as_of=0.0, cpu_seconds=64 * 7 * 24 * 3600.0)
    snap = snapshot([node("n", 4, cpu=64000)], usage=[past], running=[running("g", "n", [1, 2], team="gpu-heavy")])
    jobs = [job("host-heavy-next", 2, team="host-heavy", at=0.0), job("gpu-heavy-next", 2, team="gpu-heavy", at=1.0)]
    assert _order(schedule(snap, jobs, Policy(), now=0.0)) == ["gpu-heavy-next"]
    assert _order(schedule(snap, jobs, Policy(), now=20 * Policy().fair_share_half_life_s)) == ["host-heavy-next"]


def test_over_quota_weight_divides_the_share():
    snap = snapshot([node("n", 5)], running=[running("a", "n", [0, 1], team="a"), running("b", "n", [2], team="b")])
    jobs = [job("a-next", 1, team="a", at=0.0), job("b-next", 1, team="b", at=1.0)]
    assert _order(schedule(snap, jobs, Policy(), now=10.0)) == ["b-next", "a-next"]
    heavy = QuotaTree(entries=(QuotaEntry("default/a", 0, weight=4.0), QuotaEntry("default/b", 0)))
    assert _order(schedule(snap, jobs, Policy(quotas=heavy), now=10.0)) == ["a-next", "b-next"]


def test_fifo_blocks_everything_behind_a_head_that_does_not_fit():
    snap = snapshot(cluster(1, 4), running=[running("r", "node000", [0])])  # one of the four GPUs is busy
    plan = schedule(snap, [job("big", 4, at=0.0), job("small", 1, at=1.0)], Policy(name="fifo"), now=0.0)
    assert plan.placements == ()
    assert plan.reason_of("big").reason == "NoFeasibleNode"
    assert plan.reason_of("small").reason == "BlockedByQueueHead"


def test_quota_exceeded_beyond_guarantee_plus_borrowing_limit():
    quotas = teams_quota({"a": 2, "b": 2}, borrowing_limit=1)
    snap = snapshot(cluster(1, 8))
    plan = schedule(snap, [job("j", 4, team="a")], Policy(quotas=quotas), now=0.0)
    assert plan.reason_of("j").reason == "QuotaExceeded"
    assert "borrowing limit" in plan.reason_of("j").message
    ok = schedule(snap, [job("j", 3, team="a")], Policy(quotas=quotas), now=0.0)
    assert _order(ok) == ["j"]


def test_lending_limit_keeps_part_of_an_idle_teams_guarantee():
    quotas = teams_quota({"a": 4, "b": 4}, lending_limit=1)
    snap = snapshot(cluster(1, 8))
    plan = schedule(snap, [job("j", 6, team="a")], Policy(quotas=quotas), now=0.0)
    assert plan.reason_of("j").reason == "QuotaExceeded"
    assert _order(schedule(snap, [job("j", 5, team="a")], Policy(quotas=quotas), now=0.0)) == ["j"]


def test_per_model_quota_only_limits_that_model():
    quotas = QuotaTree(entries=(QuotaEntry("default/a", 0, gpu_model="H100-80GB", borrowing_limit=0),))
    nodes = [node("h", 2), node("t", 2, model="T4", memory_mib=16384)]
    plan = schedule(snapshot(nodes), [job("j", 1, team="a")], Policy(quotas=quotas), now=0.0)
    assert plan.placements[0].node == "t"


def test_preempts_lowest_priority_first_within_a_team():
    snap = snapshot(cluster(1, 4), running=[
        running("low", "node000", [0, 1], priority_class="low", started=0.0),
        running("normal", "node000", [2, 3], priority_class="normal", started=0.0),
    ])
    plan = schedule(snap, [job("urgent", 2, priority_class="high")], Policy(), now=3600.0)
    assert [(p.job_id, p.reason, p.preemptor) for p in plan.preemptions] == [
        ("low", "PreemptedByPriority", "urgent")
    ]
    assert plan.reason_of("urgent").reason == "Preempting"


def test_victim_set_is_near_minimal():
    snap = snapshot(cluster(1, 4), running=[
        running("one-a", "node000", [0], priority_class="low"),
        running("one-b", "node000", [1], priority_class="low"),
        running("two", "node000", [2, 3], priority_class="low"),
    ])
    plan = schedule(snap, [job("urgent", 2, priority_class="normal")], Policy(), now=3600.0)
    victims = {p.job_id for p in plan.preemptions}
    assert victims in ({"one-a", "one-b"}, {"two"})


def test_never_preempts_non_preemptible_or_too_young_work():
    snap = snapshot(cluster(1, 2), running=[
        running("pinned", "node000", [0], priority_class="low", preemptible=False, started=0.0),
        running("young", "node000", [1], priority_class="low", started=3500.0),
    ])
    plan = schedule(snap, [job("urgent", 1, priority_class="high")], Policy(), now=3600.0)
    assert plan.preemptions == ()
    assert plan.reason_of("urgent").reason == "NoFeasibleNode"


def test_never_preempts_another_team_without_a_guarantee_to_reclaim():
    snap = snapshot(cluster(1, 1), running=[running("other", "node000", [0], team="b", priority_class="low")])
    plan = schedule(snap, [job("urgent", 1, team="a", priority_class="high")], Policy(), now=3600.0)
    assert plan.preemptions == ()


def test_reclaims_borrowed_capacity_for_a_team_under_its_guarantee():
    quotas = teams_quota({"a": 2, "b": 2})
    snap = snapshot(cluster(1, 4), running=[
        running(f"b{i}", "node000", [i], team="b", priority_class="normal") for i in range(4)
    ])
    plan = schedule(snap, [job("a1", 2, team="a")], Policy(quotas=quotas), now=3600.0)
    assert len(plan.preemptions) == 2
    assert {p.reason for p in plan.preemptions} == {"ReclaimedForGuarantee"}


def test_blocked_gang_reserves_nodes_and_long_jobs_may_not_backfill_there():
    nodes = cluster(2, 8)
    snap = snapshot(nodes, running=[
        running("r0", "node000", range(4), max_runtime_s=100.0),
        running("r1", "node001", range(4), max_runtime_s=200.0),
    ])
    jobs = [
        job("gang", 16, gang_nodes=2, gpus_per_node=8, at=0.0, kind="training"),
        job("long", 4, at=1.0),
        job("short", 4, at=2.0, max_runtime_s=50.0),
    ]
    plan = schedule(snap, jobs, Policy(), now=10.0)
    assert plan.reason_of("gang").reason == "WaitingForGang"
    (res,) = plan.reservations
    assert res.job_id == "gang" and res.start_by == 200.0
    assert plan.reason_of("long").reason == "ReservedForGang"
    assert _order(plan) == ["short"]


def test_best_effort_yields_to_everything_in_its_team():
    snap = snapshot(cluster(1, 1), running=[running("be", "node000", [0], priority_class="best-effort",
                                                    started=40.0)])
    plan = schedule(snap, [job("n", 1, priority_class="normal")], Policy(), now=100.0)
    assert [p.job_id for p in plan.preemptions] == ["be"]


def test_a_job_placed_in_a_cycle_is_never_a_victim_in_the_same_cycle():
    snap = snapshot(cluster(1, 1))
    jobs = [job("be", 1, priority_class="best-effort", at=0.0), job("n", 1, priority_class="normal", at=1.0)]
    plan = schedule(snap, jobs, Policy(order="fifo", head_of_line=False), now=100.0)
    assert _order(plan) == ["be"]
    assert plan.preemptions == ()


def test_project_quota_inside_a_team_is_enforced_on_its_own_level():
    quotas = QuotaTree(entries=(
        QuotaEntry("default/a", 8),
        QuotaEntry("default/a/small", 1, borrowing_limit=0),
    ))
    snap = snapshot(cluster(1, 8))
    jobs = [job("s1", 1, team="a", project="small"), job("s2", 1, team="a", project="small", at=1.0),
            job("big", 4, team="a", project="big", at=2.0)]
    plan = schedule(snap, jobs, Policy(quotas=quotas), now=0.0)
    assert set(_order(plan)) == {"s1", "big"}
    assert plan.reason_of("s2").reason == "QuotaExceeded" and "default/a/small" in plan.reason_of("s2").message


def test_strict_quota_refuses_teams_without_an_entry():
    plan = schedule(snapshot(cluster(1, 2)), [job("j", 1, team="nobody")],
                    Policy(quotas=teams_quota({"a": 1}), strict_quota=True), now=0.0)
    assert plan.reason_of("j").reason == "QuotaExceeded"


def test_victims_are_chosen_by_least_gpu_time_lost_not_lowest_priority_first():
    snap = snapshot(cluster(1, 2), running=[
        running("old-low", "node000", [0], priority_class="low", started=0.0),
        running("young-normal", "node000", [1], priority_class="normal", started=9000.0),
    ])
    plan = schedule(snap, [job("urgent", 1, priority_class="high", at=0.0)], Policy(), now=10_000.0)
    assert [p.job_id for p in plan.preemptions] == ["young-normal"]


def test_preemption_waits_until_waiting_has_cost_what_the_victims_would_lose():
    # the victim had run 2 GPU-hours when the 2-GPU job arrived: preempting at once would throw them away
    snap = snapshot(cluster(1, 2), running=[running("r", "node000", [0, 1], priority_class="low", started=0.0)])
    urgent = job("urgent", 2, priority_class="high", at=3600.0)
    early = schedule(snap, [urgent], Policy(), now=3600.0 + 1800.0 - 60)
    assert early.preemptions == () and "so it waits" in early.reason_of("urgent").message
    assert "it would preempt r," in early.reason_of("urgent").message  # explain names the would-be victims
    # once 2 GPUs x waited >= 2 GPU-hours (or after max_preemption_wait_s), it preempts
    assert [p.job_id for p in schedule(snap, [urgent], Policy(), now=3600.0 + 1800.0).preemptions] == ["r"]
    # work that started after the job arrived costs nothing under the rule; production inference never waits
    young = snapshot(cluster(1, 2), running=[running("r", "node000", [0, 1], priority_class="low", started=3700.0)])
    assert schedule(young, [urgent], Policy(), now=4100.0).preemptions
    serving = job("serve", 2, priority_class="production-inference", at=3600.0)
    assert schedule(snap, [serving], Policy(), now=3600.0).preemptions
    assert schedule(snap, [urgent], Policy(preemption_cost=False), now=3600.0).preemptions


def test_a_blocked_big_job_whose_start_is_unknown_gets_a_soft_hold_that_idles_nothing():
    snap = snapshot(cluster(2, 8), running=[running("r0", "node000", range(4)), running("r1", "node001", range(2))])
    big = job("big", 16, gang_nodes=2, gpus_per_node=8, kind="training", at=0.0)
    plan = schedule(snap, [big], Policy(), now=7200.0)  # waited past drain_after_s; nobody declared an end
    (res,) = plan.reservations
    assert res.soft and res.start_by == float("inf") and "soft hold" in plan.reason_of("big").message
    # other work avoids the held nodes while anything else fits, and uses them when nothing does
    two = cluster(2, 8) + (node("spare", 2),)
    snap2 = snapshot(two, running=[running("r0", "node000", range(4)), running("r1", "node001", range(2))])
    jobs = [big, job("small", 2, at=1.0), job("more", 4, at=2.0)]
    placed = {p.job_id: p.node for p in schedule(snap2, jobs, Policy(), now=7200.0).placements}
    assert placed["small"] == "spare" and placed["more"] in ("node000", "node001")


def test_default_scores_fragmentation_in_whole_numbers_and_gives_ties_to_the_lowest_node() -> None:
    from libs.core import WorkloadShape

    shapes = (WorkloadShape(gpus=1, gpu_milli=500, weight=1.0), WorkloadShape(gpus=1, gpu_milli=1000, weight=1.0))
    # two equal nodes but for what runs there: node b is fuller (one of its GPUs is held whole); a whole GPU on
    # either leaves no fragment behind (the same score), so the tie decides
    nodes = [node("a", 2, sharing="fractional"), node("b", 2, sharing="fractional")]
    held = [Allocation(job_id="busy", team="t", node="b", gpu_uuids=("b-gpu0",), started_at=0.0)]
    whole = [job("w", 1)]
    continuous = Policy(workload=shapes, frag_ties="score", w_binpack=0.03)  # the earlier default: packing decides
    for policy, expected in ((Policy(workload=shapes), "a"), (Policy(name="fgd", workload=shapes), "a"),
                             (continuous, "b")):
        plan = schedule(snapshot(nodes, running=held), whole, policy, now=0.0)
        assert [p.node for p in plan.placements] == [expected], policy.name
    # a real difference in fragmentation still decides: a half-used GPU is filled before an empty node is touched
    half = [Allocation(job_id="h", team="t", node="b", gpu_uuids=("b-gpu0",), started_at=0.0,
                       gpu_fraction_milli=500, gpu_memory_mib=1000)]
    plan = schedule(snapshot(nodes, running=half), [job("f", 1, gpu_fraction_milli=500, gpu_memory_mib=1000)],
                    Policy(workload=shapes), now=0.0)
    assert [(p.node, p.gpu_uuids) for p in plan.placements] == [("b", ("b-gpu0",))]


def test_default_gives_a_gpu_less_request_s_tie_to_the_node_whose_gpus_are_busiest() -> None:
    from libs.core import WorkloadShape

    shapes = (WorkloadShape(gpus=1, gpu_milli=1000, weight=1.0, cpu_milli=4000),)
    # every node keeps room for the 1-GPU shape whichever takes the CPU-only job: the same FGD score
    nodes = [node("a", 4, cpu=64_000), node("b", 4, cpu=64_000), node("c", 4, cpu=64_000)]
    held = [running("r1", "b", [0]), running("r2", "c", [0, 1, 2])]
    cpu_only = [job("etl", 0, cpu_milli=8000)]

    def where(policy: Policy, running_=held) -> str:
        return [p.node for p in schedule(snapshot(nodes, running=running_), cpu_only, policy, now=0.0).placements][0]

    assert where(Policy(workload=shapes)) == "c"  # default: where the GPUs are taken already
    assert where(Policy(name="fgd", workload=shapes)) == "a"  # FGD as published: the lowest index
    assert where(Policy(workload=shapes, frag_ties="index")) == "a"
    # a real difference in fragmentation still decides: c's last GPU would lose the CPU the shape asks for
    tight = [running("r1", "b", [0]), running("r2", "c", [0, 1, 2], cpu_milli=54_000)]
    assert where(Policy(workload=shapes), tight) == "b"
