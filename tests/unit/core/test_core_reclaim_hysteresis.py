"""Reclaim hysteresis (`Policy.reclaim_min_runtime_s`): borrowed work is reclaimed for a guarantee only after it has
run that long, so a borrower is not restarted over and over a minute into each run; preemption within a team by
priority is unchanged."""

from __future__ import annotations

from core_builders import cluster, job, running, snapshot

from libs.core import Policy, QuotaEntry, QuotaTree, schedule, teams_quota

AT_ONCE = dict(preemption_cost=False)  # the ski-rental rule has its own tests


def _borrowers(started: float):
    # team b holds both nodes: 8 of its own guarantee and 8 borrowed from a
    return snapshot(cluster(2, 8), running=[
        running(f"b{i}", f"node00{i}", range(8), team="b", priority_class="normal", started=started)
        for i in range(2)
    ])


def test_borrowed_work_is_reclaimed_only_after_it_ran_the_minimum():
    snap = _borrowers(started=3000.0)  # 600 s into their runs at t=3600
    quotas = teams_quota({"a": 8, "b": 8})
    eager = schedule(snap, [job("a1", 8, team="a")], Policy(quotas=quotas, **AT_ONCE), now=3600.0)
    assert [p.reason for p in eager.preemptions] == ["ReclaimedForGuarantee"]

    patient = Policy(quotas=quotas, reclaim_min_runtime_s=900.0, **AT_ONCE)
    plan = schedule(snap, [job("a1", 8, team="a")], patient, now=3600.0)
    assert plan.preemptions == ()
    assert plan.reason_of("a1").reason != "Preempting"
    later = schedule(snap, [job("a1", 8, team="a")], patient, now=3900.0)  # 900 s run: now it gives back
    assert [p.reason for p in later.preemptions] == ["ReclaimedForGuarantee"]


def test_the_minimum_also_holds_when_a_quota_entry_above_the_teams_refuses():
    # the org is capped at the pool: a's job is refused by the org until b gives back what it borrows
    tree = QuotaTree(entries=(QuotaEntry("default", 16, borrowing_limit=0), QuotaEntry("default/a", 8),
                              QuotaEntry("default/b", 8)))
    snap = snapshot(cluster(3, 8), running=[
        running(f"b{i}", f"node00{i}", range(8), team="b", priority_class="normal", started=3000.0)
        for i in range(2)
    ])
    patient = Policy(quotas=tree, reclaim_min_runtime_s=900.0, **AT_ONCE)
    plan = schedule(snap, [job("a1", 8, team="a")], patient, now=3600.0)
    assert plan.preemptions == () and plan.reason_of("a1").reason == "QuotaExceeded"
    later = schedule(snap, [job("a1", 8, team="a")], patient, now=3900.0)
    assert [p.reason for p in later.preemptions] == ["ReclaimedForGuarantee"]


def test_priority_preemption_within_a_team_ignores_the_reclaim_minimum():
    snap = snapshot(cluster(1, 8), running=[
        running("low", "node000", range(8), team="a", priority_class="low", started=3000.0)])
    policy = Policy(reclaim_min_runtime_s=3600.0, **AT_ONCE)
    plan = schedule(snap, [job("hi", 8, team="a", priority_class="high")], policy, now=3600.0)
    assert [(p.job_id, p.reason) for p in plan.preemptions] == [("low", "PreemptedByPriority")]
