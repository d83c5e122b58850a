"""NormalizeMemo: a service's one-shot `schedule` calls reuse what earlier cycles normalised, without changing any
plan, and forget it when the policy it depends on changes."""

from __future__ import annotations

from dataclasses import replace

from core_builders import cluster, job, snapshot

from libs.core import NormalizeMemo, Policy, PriorityClass, schedule


def test_plans_are_the_same_with_and_without_the_memo_and_it_keeps_request_objects() -> None:
    snap = snapshot(cluster(1, 2))
    jobs = [job("a", 1, at=0.0), job("b", 1, at=1.0, priority_class="high"), job("c", 4, at=2.0),
            job("bad", 1, at=3.0, priority_class="nonexistent")]
    memo = NormalizeMemo()
    for _ in range(3):  # the same request objects, cycle after cycle
        assert schedule(snap, jobs, Policy(), now=10.0, memo=memo) == schedule(snap, jobs, Policy(), now=10.0)
    cache = memo.for_policy(Policy())
    assert {j: hit[0] for j, hit in cache.items()} == {j.job_id: j for j in jobs}


def test_a_changed_request_object_is_normalised_again() -> None:
    snap = snapshot(cluster(1, 2))
    memo = NormalizeMemo()
    schedule(snap, [job("a", 1)], Policy(), now=10.0, memo=memo)
    bigger = job("a", 16)  # same id, new object: it asks for more than the cluster has
    plan = schedule(snap, [bigger], Policy(), now=10.0, memo=memo)
    assert not plan.placements and plan.pending[0].job_id == "a"


def test_a_policy_with_other_classes_drops_what_was_resolved_under_the_old_one() -> None:
    snap = snapshot(cluster(1, 1))
    jobs = [job("urgent", 1, at=5.0, priority_class="urgent"), job("early", 1, at=0.0)]
    memo = NormalizeMemo()
    plan = schedule(snap, jobs, Policy(), now=10.0, memo=memo)  # no class "urgent" yet: an invalid request
    assert [p.job_id for p in plan.placements] == ["early"]
    with_urgent = replace(Policy(), priority_classes=(PriorityClass("urgent", 10_000, preemptible=False), *Policy().priority_classes))
    plan = schedule(snap, jobs, with_urgent, now=10.0, memo=memo)
    assert [p.job_id for p in plan.placements] == ["urgent"]
    assert plan == schedule(snap, jobs, with_urgent, now=10.0)
