"""The numbers of a small fill and a small contended replay, pinned (issue #18: a restructure of the core must leave
them exactly as they were). On the 500-task / 120-node sample of the openb trace (tests/sim/data/README.md); the
replay compresses its submit times 500× onto 10 nodes, so jobs queue, preempt and reserve.

A deliberate change of the scheduling policy changes these numbers: re-pin them in the same commit and say why in
its message; a refactor must never need to."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from libs.sim import engine, traces

DATA = Path(__file__).parent / "data"
NODES = traces.read_nodes(DATA / "openb_sample_nodes.csv")
TASKS = traces.read_tasks(DATA / "openb_sample_tasks.csv")

FILL = {  # seed 1: (unallocated GPU share at 100% arrived, tasks that did not fit, their GPU demand)
    "fifo": (0.05169059011164279, 32, 34.85),
    "best-fit": (0.07711323763955347, 50, 50.79),
    "default": (0.044641148325358815, 27, 30.43),
    "fgd": (0.04334928229665069, 26, 29.62),
}
REPLAY = {  # (finished, mean JCT s, mean queueing s, preemptions, mean fragmented GPUs, cycles)
    "fifo": (444, 73589.30788738739, 7122.458788288296, 0, 2.827396048109965, 359),
    "best-fit": (444, 68054.250990991, 1587.4018918918928, 0, 3.452959530598815, 375),
    "default": (444, 68080.36841891892, 1341.3676621621642, 94, 2.2797953013481367, 410),
    "fgd": (444, 68119.51556306306, 1460.3839864864874, 32, 2.210902598797251, 382),
}


@pytest.mark.parametrize("policy", sorted(FILL))
def test_a_small_fill_gives_exactly_the_pinned_numbers(policy: str) -> None:
    m = engine.fill(NODES, TASKS, policy, seed=1).metrics
    assert (m["unallocated_gpu_share"], m["tasks_failed"], m["gpu_demand_failed"]) == pytest.approx(FILL[policy],
                                                                                                     rel=1e-12)


@pytest.mark.parametrize("policy", sorted(REPLAY))
def test_a_small_contended_replay_gives_exactly_the_pinned_numbers(policy: str) -> None:
    jobs = [dataclasses.replace(j, request=dataclasses.replace(j.request, submitted_at=j.submit / 500))
            for j in traces.openb_jobs(TASKS, seed=0)]
    m = engine.replay(NODES[:10], jobs, policy).metrics
    got = (m["finished"], m["jct_mean_s"], m["queue_mean_s"], m["preemptions"], m["fragmented_gpus_mean"],
           m["cycles"])
    assert got == pytest.approx(REPLAY[policy], rel=1e-12)
