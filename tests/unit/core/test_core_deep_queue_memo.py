"""A deep queue of look-alike jobs: a job just like one turned away earlier in the cycle, with nothing changed
since, gets that answer again without a search (`Scheduler._like`). The plan must be exactly the plan that
answering every job in full gives."""

from __future__ import annotations

import random

import pytest
from core_builders import job, node, running, snapshot

from libs.core import Policy, Scheduler, teams_quota

CLASSES = ("high", "normal", "low", "best-effort")
ASKED = ("normal", "best-effort")


def _case(seed: int):
    rng = random.Random(seed)
    nodes = [node(f"n{i}", 4, sharing="fractional" if i % 2 else "exclusive", cpu=64000, mem=262144)
             for i in range(4)]
    busy = [running(f"r{i}", f"n{i % 4}", [i // 4], team=rng.choice("ab"), priority_class=rng.choice(CLASSES),
                    started=rng.choice((0.0, 3000.0, 3500.0))) for i in range(12)]
    queue = []
    for i in range(80):
        kw = dict(team=rng.choice("abc"), priority_class=rng.choice(ASKED), at=float(rng.randint(0, 3000)),
                  cpu_milli=1000)
        if rng.random() < 0.4:
            queue.append(job(f"q{i:02d}", 1, gpu_fraction_milli=500, gpu_memory_mib=4096, **kw))
        else:
            queue.append(job(f"q{i:02d}", rng.choice((1, 2, 4)), **kw))
    return snapshot(nodes, running=busy), queue


@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize("cost", (True, False))
def test_answering_look_alikes_from_memory_gives_exactly_the_full_plan(seed, cost, monkeypatch):
    snap, queue = _case(seed)
    policy = Policy(quotas=teams_quota({"a": 6, "b": 6, "c": 4}), preemption_cost=cost)
    answered = []
    one = Scheduler._schedule_one
    monkeypatch.setattr(Scheduler, "_schedule_one", lambda self, ctx, j: answered.append(j) or one(self, ctx, j))
    fast = Scheduler(snap, policy).cycle(queue, 3600.0)
    assert len(answered) < len(queue) * 3 / 4  # a good part was answered from memory
    monkeypatch.setattr(Scheduler, "_like", lambda self, ctx, j: None)
    full = Scheduler(snap, policy).cycle(queue, 3600.0)
    assert fast.placements == full.placements
    assert fast.preemptions == full.preemptions
    assert fast.pending == full.pending
    assert len(fast.pending) > 40  # a deep queue: most jobs wait
