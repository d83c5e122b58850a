"""`Policy.scarce_hosts` (on in `default`): when at most that many nodes can run a whole-GPU shape of the workload
now — rare shapes too, which the typical mix carries at weight 0 — smaller work that fits on another node does
not take the last of them. A preference before the score, not a hold."""

from __future__ import annotations

import dataclasses

from core_builders import job, node, running, snapshot

from libs.core import Policy, WorkloadShape, schedule

ONE = WorkloadShape(gpus=1, gpu_milli=1000, weight=1.0)
BIG = WorkloadShape(gpus=8, gpu_milli=1000, weight=0.0, cpu_milli=120_000)  # rare: scored as nothing


def _where(nodes, request, workload, name="default", running_=()) -> str:
    policy = Policy(name=name, workload=workload)
    plan = schedule(snapshot(nodes, running=running_), [request], policy, now=0.0)
    assert plan.placements, plan.pending
    return plan.placements[0].node


def test_the_only_node_a_rare_shape_fits_is_kept_from_work_that_fits_elsewhere() -> None:
    nodes = [node("a", 8, cpu=128_000), node("b", 8, cpu=64_000)]  # only a has the CPU the big shape asks for
    assert _where(nodes, job("one", 1), (ONE, BIG)) == "b"
    # FGD as published: the rare shape counts for nothing and ties go to the lowest index
    assert _where(nodes, job("one", 1), (ONE, BIG), name="fgd") == "a"
    assert _where(nodes, job("one", 1), (ONE,)) == "a"  # a mix without the rare shape keeps nothing
    # an 8-GPU job that needs less CPU also goes where it leaves the 120-core shape its node
    assert _where(nodes, job("eight", 8, cpu_milli=64_000), (ONE, BIG)) == "b"
    # the big shape's own work takes it
    assert _where(nodes, job("big", 8, cpu_milli=120_000), (ONE, BIG)) == "a"


def test_it_is_a_preference_not_a_hold() -> None:
    nodes = [node("a", 8, cpu=128_000), node("b", 8, cpu=64_000)]
    b_full = [running("held", "b", range(8))]
    assert _where(nodes, job("one", 1), (ONE, BIG), running_=b_full) == "a"


def test_only_the_last_hosts_are_kept() -> None:
    nodes = [node("a", 8), node("b", 8), node("c", 8)]
    eight = WorkloadShape(gpus=8, gpu_milli=1000, weight=0.0)
    # three nodes can run 8 GPUs: none is scarce, ties go to the lowest index
    assert _where(nodes, job("one", 1), (ONE, eight)) == "a"
    # b and c are broken: a is the last that can, and a 1-GPU job goes to b instead
    broken = [running("r1", "b", [0]), running("r2", "c", [0])]
    assert _where(nodes, job("one", 1), (ONE, eight), running_=broken) == "b"
    more = dataclasses.replace(Policy(name="default", workload=(ONE, eight)), scarce_hosts=0)
    plan = schedule(snapshot(nodes, running=broken), [job("one", 1)], more, now=0.0)
    assert plan.placements[0].node == "a"  # off: the lowest index again
