"""Preemption that makes room within a quota (Kueue's withinClusterQueue, and reclaim past a quota entry above the
teams), and quota messages that count the model being refused."""

from __future__ import annotations

from core_builders import cluster, job, node, running, snapshot

from libs.core import Policy, QuotaEntry, QuotaTree, schedule, teams_quota
from libs.core.quota import QuotaLedger

AT_ONCE = dict(preemption_cost=False)  # the ski-rental rule has its own tests


def _capped(guarantees: dict[str, float], org_limit: float | None = None) -> QuotaTree:
    """Teams at `guaranteed` with no borrowing (a team at its guarantee is at its quota); an org entry too."""
    entries = tuple(QuotaEntry(f"default/{t}", g, borrowing_limit=0) for t, g in sorted(guarantees.items()))
    if org_limit is not None:
        entries += (QuotaEntry("default", org_limit, borrowing_limit=0),)
    return QuotaTree(entries=entries)


def test_a_high_job_at_its_teams_quota_preempts_its_own_teams_lower_priority_work():
    # 16 GPUs, team a capped at 8 and holding them with normal work; the second node is empty
    snap = snapshot(cluster(2, 8), running=[
        running("n-old", "node000", range(3), team="a", priority_class="normal", started=0.0),
        running("n-new", "node000", range(3, 6), team="a", priority_class="normal", started=100.0),
        running("n-low", "node001", range(2), team="a", priority_class="low", started=50.0),
    ])
    policy = Policy(quotas=_capped({"a": 8}), **AT_ONCE)
    plan = schedule(snap, [job("hi", 4, team="a", priority_class="high")], policy, now=3600.0)
    # the lowest priority first, then the most recently started
    assert [(p.job_id, p.reason) for p in plan.preemptions] == [
        ("n-low", "PreemptedWithinQuota"), ("n-new", "PreemptedWithinQuota")]
    waiting = plan.reason_of("hi")
    assert waiting.reason == "Preempting" and "PreemptedWithinQuota" in waiting.message
    assert "default/a" in plan.preemptions[0].message


def test_quota_preemption_never_takes_equal_priority_protected_or_other_teams_work():
    snap = snapshot(cluster(2, 8), running=[
        running("same", "node000", range(4), team="a", priority_class="high", started=0.0),
        running("young", "node000", range(4, 8), team="a", priority_class="normal", started=3590.0),
        running("other", "node001", range(4), team="b", priority_class="low", started=0.0),
    ])
    policy = Policy(quotas=_capped({"a": 8, "b": 8}), **AT_ONCE)  # min runtime 300 s protects "young"
    plan = schedule(snap, [job("hi", 4, team="a", priority_class="high")], policy, now=3600.0)
    assert plan.preemptions == ()
    assert plan.reason_of("hi").reason == "QuotaExceeded"


def test_only_the_full_project_gives_way_when_the_project_quota_refuses():
    tree = QuotaTree(entries=(QuotaEntry("default/a", 16), QuotaEntry("default/a/p1", 4, borrowing_limit=0)))
    snap = snapshot(cluster(1, 8), running=[
        running("p2-low", "node000", range(4), team="a", project="p2", priority_class="low", started=10.0),
        running("p1-normal", "node000", range(4, 8), team="a", project="p1", priority_class="normal"),
    ])
    plan = schedule(snap, [job("hi", 4, team="a", project="p1", priority_class="high")],
                    Policy(quotas=tree, **AT_ONCE), now=3600.0)
    assert [(p.job_id, p.reason) for p in plan.preemptions] == [("p1-normal", "PreemptedWithinQuota")]


def test_quota_preemption_waits_while_waiting_costs_less_than_the_work_it_would_throw_away():
    snap = snapshot(cluster(2, 8), running=[running("n", "node000", range(8), team="a", priority_class="normal")])
    plan = schedule(snap, [job("hi", 8, team="a", priority_class="high", at=3500.0)],
                    Policy(quotas=_capped({"a": 8})), now=3600.0)
    assert plan.preemptions == ()
    got = plan.reason_of("hi")
    assert got.reason == "QuotaExceeded" and "throw away" in got.message


def test_an_org_entry_does_not_block_reclaiming_a_guarantee_from_a_borrower():
    # the org holds the whole pool (16 GPUs); b borrows a's unused guarantee; a wants it back
    tree = QuotaTree(entries=(QuotaEntry("default", 16), QuotaEntry("default/a", 8), QuotaEntry("default/b", 8)))
    snap = snapshot(cluster(2, 8), running=[
        running(f"b{i}", f"node00{i}", range(8), team="b", priority_class="normal") for i in range(2)
    ])
    plan = schedule(snap, [job("a1", 8, team="a")], Policy(quotas=tree, **AT_ONCE), now=3600.0)
    assert [p.reason for p in plan.preemptions] == ["ReclaimedForGuarantee"]
    assert plan.reason_of("a1").reason == "Preempting"


def test_an_org_limit_below_the_pool_makes_a_borrower_give_back_even_with_free_gpus():
    # 24 GPUs, the org capped at 16: b borrows 8 of a's; a's job would fit the free node, but the org is full
    tree = QuotaTree(entries=(QuotaEntry("default", 16, borrowing_limit=0), QuotaEntry("default/a", 8),
                              QuotaEntry("default/b", 8)))
    snap = snapshot(cluster(3, 8), running=[
        running(f"b{i}", f"node00{i}", range(8), team="b", priority_class="normal") for i in range(2)
    ])
    plan = schedule(snap, [job("a1", 8, team="a")], Policy(quotas=tree, **AT_ONCE), now=3600.0)
    assert [p.reason for p in plan.preemptions] == ["ReclaimedForGuarantee"]
    # a team over its guarantee gets nothing back that way
    plan = schedule(snap, [job("b9", 8, team="b", priority_class="normal")],
                    Policy(quotas=tree, **AT_ONCE), now=3600.0)
    assert plan.reason_of("b9").reason == "QuotaExceeded" and plan.preemptions == ()


def test_quota_messages_count_the_model_refused_and_say_any_model_for_a_wildcard():
    tree = QuotaTree(entries=(QuotaEntry("default/a", 6, gpu_model="H100-80GB"),))
    ledger = QuotaLedger(tree, {"H100-80GB": 8000, "L40S": 8000})
    paths = ledger.paths("a", "default")
    ledger.add(paths, "H100-80GB", 6000)
    _, msg = ledger.admissible(paths, [("L40S", 1000)], "j", guarantee_only=True)
    assert "0 L40S GPU(s), 0 in use" in msg, msg
    for limit, words in ((0, "would use 3 GPU(s) of any model (2 in use)"), (None, "2 GPU(s) of any model, 2 in use")):
        wild = QuotaLedger(teams_quota({"a": 2}, borrowing_limit=limit), {"H100-80GB": 8000})
        wpaths = wild.paths("a", "default")
        wild.add(wpaths, "H100-80GB", 2000)
        _, msg = wild.admissible(wpaths, [("H100-80GB", 1000)], "j", guarantee_only=True)
        assert words in msg and "*" not in msg, msg


def test_what_a_team_borrows_of_a_model_without_an_entry_is_that_models_use_only():
    ledger = QuotaLedger(QuotaTree(entries=(QuotaEntry("default/b", 4, gpu_model="H100-80GB"),)),
                         {"H100-80GB": 8000, "L40S": 8000})
    paths = ledger.paths("b", "default")
    ledger.add(paths, "H100-80GB", 4000)
    ledger.add(paths, "L40S", 2000)
    assert (ledger.borrowed(paths[1], "L40S"), ledger.borrowed(paths[1], "H100-80GB")) == (2000, 0)


def test_a_job_its_quota_admits_only_on_a_model_it_cannot_fit_still_reclaims_the_model_it_is_guaranteed():
    # quota only for H100: an any-model job is admitted on the L40S (no quota there) but 8 never fit on it
    tree = QuotaTree(entries=(QuotaEntry("default", 16, gpu_model="H100-80GB"),
                              QuotaEntry("default/a", 8, gpu_model="H100-80GB"),
                              QuotaEntry("default/b", 8, gpu_model="H100-80GB")))
    nodes = (*cluster(2, 8), node("l40s", 2, model="L40S", memory_mib=46068))
    snap = snapshot(nodes, running=[
        running(f"b{i}", f"node00{i}", range(8), team="b", priority_class="normal") for i in range(2)
    ])
    plan = schedule(snap, [job("a1", 8, team="a")], Policy(quotas=tree, **AT_ONCE), now=3600.0)
    assert [p.reason for p in plan.preemptions] == ["ReclaimedForGuarantee"]
    assert plan.reason_of("a1").reason == "Preempting"
