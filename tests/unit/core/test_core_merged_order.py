"""Two ways a deep queue is walked faster, each giving exactly the plan of the plain way.

* Teams whose fair shares tie take turns job by job; after `_PATIENCE` jobs without a placement the cycle takes the
  rest merged in one run (shares only move with a placement), and goes back to turns when one is placed.
* A scheduler given a `SameAnswers` answers an unchanged job with last cycle's very `PendingReason`."""

from __future__ import annotations

import importlib
import random

from core_builders import job, node, running, snapshot

from libs.core import Policy, Scheduler
from libs.core.answers import SameAnswers

schedule_module = importlib.import_module("libs.core.schedule")  # (the package exports a function of that name)
TEAMS = ("a", "b", "c", "d")


def _case(seed: int):
    """Four teams holding the same GPUs (every third seed team a holds one more) and a deep queue of 8-GPU jobs
    that do not fit, with one-GPU ones in between that do, until the last free GPUs are taken."""
    rng = random.Random(seed)
    nodes = [node(f"n{i}", 8) for i in range(6)]
    held = [running(f"r{t}{k}", f"n{k}", [TEAMS.index(t) * 2, TEAMS.index(t) * 2 + 1], team=t)
            for t in TEAMS for k in range(5)]
    held += [running(f"s{t}", "n5", [TEAMS.index(t)], team=t) for t in TEAMS]
    if seed % 3 == 0:
        held.append(running("extra", "n5", [4], team="a"))
    queue = []
    for i in range(rng.randint(400, 600)):
        small = rng.random() < 0.012  # about one in 80: after more than `_PATIENCE` that are not placed
        queue.append(job(f"q{i:04d}", 1 if small else 8, team=rng.choice(TEAMS), at=float(rng.randint(0, 400))))
    return snapshot(nodes, running=held), queue


def test_the_merged_run_gives_exactly_the_job_by_job_order(monkeypatch):
    merges: list[int] = []
    merged = schedule_module._merged
    with_merges, again = 0, 0
    for seed in range(8):
        snap, queue = _case(seed)
        before = len(merges)
        monkeypatch.setattr(schedule_module, "_merged", lambda h, q: merges.append(len(h)) or merged(h, q))
        fast = Scheduler(snap, Policy()).cycle(queue, 1000.0)
        monkeypatch.setattr(schedule_module, "_PATIENCE", 10**9)
        plain = Scheduler(snap, Policy()).cycle(queue, 1000.0)
        monkeypatch.undo()
        with_merges += len(merges) > before
        again += len(merges) > before + 1  # one placed in a merged run: turns, then merged again
        assert fast.placements == plain.placements and fast.placements  # some were placed, in the same order
        assert [r.job_id for r in fast.pending] == [r.job_id for r in plain.pending]
        assert fast.pending == plain.pending
    assert with_merges >= 6  # the merged run was taken (where placements left no two teams tied, it is not)
    assert again and max(merges) > 1


def test_shares_that_tie_interleave_the_teams_by_submit_time_in_the_merged_run():
    snap, _ = _case(1)
    queue = [job(f"q{i:04d}", 8, team=TEAMS[i % 4], at=float(1000 - i)) for i in range(200)]
    queue.append(job("small", 1, team="d", at=500.0))  # placed; then d's share is the largest
    plan = Scheduler(snap, Policy()).cycle(queue, 1000.0)
    by_time = [j.job_id for j in sorted(queue, key=lambda j: j.submitted_at)]
    assert [p.job_id for p in plan.placements] == ["small"]
    d = {j.job_id for j in queue if j.team == "d"}  # behind the three others, still tied
    assert [r.job_id for r in plan.pending] == ([j for j in by_time if j not in d]
                                                + [j for j in by_time if j in d and j != "small"])


def test_unchanged_answers_are_last_cycles_objects_and_the_plan_stays_equal():
    snap, queue = _case(2)
    answers = SameAnswers()
    sched = Scheduler(snap, Policy())
    sched.answers = answers
    first = sched.cycle(queue, 1000.0)
    placed = {p.job_id for p in first.placements}
    rest = [j for j in queue if j.job_id not in placed]
    again = Scheduler(snap, Policy())  # another scheduler, the same answers kept by its caller
    again.answers = answers
    second = again.cycle(rest, 1000.0)
    plain = Scheduler(snap, Policy()).cycle(rest, 1000.0)
    assert second == plain  # the same plan in value
    before = {r.job_id: r for r in first.pending}
    same = [r for r in second.pending if r == before.get(r.job_id)]
    assert len(same) > len(rest) // 2 and all(r is before[r.job_id] for r in same)
    assert len({id(r.facts) for r in second.pending}) < 10  # equal facts are one object


def test_same_answers_keeps_only_equal_reasons():
    from libs.core.plan import PendingReason, ReasonFacts

    answers = SameAnswers()
    a = answers.same(PendingReason("a", "NoFeasibleNode", "full", ReasonFacts(cause="no_room", ask="1 GPU")))
    b = answers.same(PendingReason("b", "NoFeasibleNode", "full", ReasonFacts(cause="no_room", ask="1 GPU")))
    assert a.facts is b.facts  # equal facts: one object
    answers.turn((a, b))
    again = answers.same(PendingReason("a", "NoFeasibleNode", "full", ReasonFacts(cause="no_room", ask="1 GPU")))
    moved = answers.same(PendingReason("b", "NoFeasibleNode", "other words", ReasonFacts(cause="no_room", ask="1 GPU")))
    assert again is a
    assert moved is not b and moved.message == "other words" and moved.facts is a.facts
