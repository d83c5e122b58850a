"""FGD's typical requests (`Policy.typical_mix`, the `fgd` preset): the exact requests that cover 95% of the jobs,
CPU-only ones included, each weighted by its share of all jobs; the scheduler counts every free GPU of a node as
lost to a request without GPUs, as FGD's measure does."""

from __future__ import annotations

import pytest
from core_builders import job, node, snapshot

from libs.core import Policy, WorkloadShape, derive_typical, mix_of, request_spec, schedule, typical_requests
from libs.core.fit import fragmentation
from libs.core.frag import mix_probabilities, shape_weights
from libs.core.state import ClusterState


def test_the_most_common_requests_until_they_cover_95_percent_and_the_rest_counts_for_nothing() -> None:
    jobs = ([job(f"a{i}", 1) for i in range(60)] + [job(f"c{i}", 0, cpu_milli=4000) for i in range(36)]
            + [job(f"r{i}", 8) for i in range(4)])
    mix = derive_typical(jobs)
    # 96% covered; the rare 8-GPU request follows at weight 0: scored as nothing, known to `scarce_hosts`
    assert [(w.gpus, w.cpu_milli, w.weight) for w in mix] == [(1, 0, 0.6), (0, 4000, 0.36), (8, 0, 0.0)]
    assert [(w.gpus, w.weight) for w in derive_typical(jobs, limit=1)] == [(1, 0.6), (8, 0.0)]
    gpu, gpuless = mix_probabilities(mix)
    assert [(p, w.gpus) for p, w in gpu] == [(0.6, 1), (0.0, 8)] and gpuless == pytest.approx(0.36)  # not renormalised
    # the policy decides the rule: FGD's typical requests for fgd; for default the same requests not cut at 95%
    # (each still by its share of all jobs, so the rare one counts by how rare it is); by count, every GPU shape,
    # for others
    assert mix_of(jobs, Policy(name="fgd")) == mix_of(jobs, Policy(typical_coverage=0.95)) == mix
    assert [(w.gpus, w.weight) for w in mix_of(jobs, Policy())] == [(1, 0.6), (0, 0.36), (8, 0.04)]
    assert [(w.gpus, w.weight) for w in derive_typical(jobs, limit=2, coverage=1.0)] == [(1, 0.6), (0, 0.36), (8, 0.0)]
    assert [(w.gpus, w.weight) for w in mix_of(jobs, Policy(name="spread"))] == [(1, 60.0), (8, 4.0)]


def test_counts_are_normalised_and_the_gauge_weighs_gpu_shapes_among_themselves() -> None:
    counts = (WorkloadShape(gpus=1, gpu_milli=1000, weight=3.0), WorkloadShape(gpus=0, gpu_milli=0, weight=1.0))
    gpu, gpuless = mix_probabilities(counts)
    assert [p for p, _ in gpu] == [0.75] and gpuless == 0.25
    assert [p for p, _ in shape_weights(counts)] == [1.0]


def test_a_request_spec_is_the_exact_request_host_included() -> None:
    gang = job("g", 16, gang_nodes=2, gpus_per_node=8, cpu_milli=8000, memory_mib=1024, gpu_models=("B", "A"))
    assert request_spec(gang) == (8, 1000, ("A", "B"), "", 8000, 1024)
    assert request_spec(job("cpu", 0, cpu_milli=1000)) == (0, 0, (), "", 1000, 0)
    counts = {request_spec(gang): 2, request_spec(job("m", 1, mig_profile="1g.10gb")): 1}
    assert typical_requests(counts, coverage=1.0) == (
        WorkloadShape(gpus=8, gpu_milli=1000, weight=2 / 3, cpu_milli=8000, memory_mib=1024, gpu_models=("A", "B")),
        WorkloadShape(gpus=1, gpu_milli=1000, weight=1 / 3, mig_profile="1g.10gb"),
    )


def test_every_free_gpu_is_lost_to_a_cpu_only_request() -> None:
    nodes = [node("a", 4), node("b", 8)]
    gpu_only = Policy(workload=(WorkloadShape(gpus=4, gpu_milli=1000, weight=1.0),))
    with_cpu = Policy(workload=(WorkloadShape(gpus=4, gpu_milli=1000, weight=0.5),
                                WorkloadShape(gpus=0, gpu_milli=0, weight=0.5, cpu_milli=1000)))
    for policy in (gpu_only, with_cpu):  # one GPU on a would leave it no room for the 4-GPU shape: b either way
        assert [p.node for p in schedule(snapshot(nodes), [job("one", 1)], policy, now=0.0).placements] == ["b"]
    state = ClusterState(snapshot([node("c", 8)]))
    cls, dyn = state.classes[0], state.nodes[0].key[0]
    assert fragmentation(cls, dyn, 1, (), gpuless_share=0.25) == 2000.0  # a quarter of 8 free GPUs
    assert fragmentation(cls, dyn, 1, ()) == 0.0


def test_a_kept_memo_gives_the_mix_worked_out_afresh_as_jobs_come_and_go() -> None:
    import random

    rng = random.Random(3)
    memo: dict = {}
    jobs = [job(f"j{i}", rng.choice((0, 1, 2, 8)), cpu_milli=rng.choice((0, 4000))) for i in range(200)]
    for step in range(30):
        for policy in (Policy(), Policy(name="spread")):
            assert mix_of(jobs, policy, memo) == mix_of(jobs, policy)
        jobs = [j for j in jobs if rng.random() > 0.1] + [job(f"n{step}-{k}", rng.choice((1, 4)), cpu_milli=1000)
                                                          for k in range(rng.randint(0, 25))]
