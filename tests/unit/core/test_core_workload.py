"""The workload mix (`derive_workload` / `workload_from_counts`): one rule for the scheduler's fragmentation score,
the live gauge and the simulator — GPU shapes weighted by how often they occur."""

from __future__ import annotations

from core_builders import job

from libs.core import WorkloadShape, derive_workload, job_spec, workload_from_counts


def test_shapes_are_weighted_by_how_often_they_occur_not_by_their_gpu_demand() -> None:
    jobs = [job(f"f{i}", 1, gpu_fraction_milli=250) for i in range(3)] + [job("big", 8, at=1.0)]
    mix = {(w.gpus, w.gpu_milli): w.weight for w in derive_workload(jobs)}
    assert mix == {(1, 250): 3.0, (8, 1000): 1.0}  # by demand the 8-GPU job would have weighed 8 against 0.75


def test_the_most_common_shapes_up_to_the_limit_make_the_mix_however_rare() -> None:
    jobs = [job(f"a{i}", 1) for i in range(60)] + [job(f"c{i}", 0, cpu_milli=4000) for i in range(30)] + [job("r", 8)]
    assert [(w.gpus, w.weight) for w in derive_workload(jobs)] == [(1, 60.0), (8, 1.0)]  # CPU-only jobs: no shape
    assert [(w.gpus, w.weight) for w in derive_workload(jobs, limit=1)] == [(1, 60.0)]


def test_a_shape_carries_the_median_host_request_of_its_jobs() -> None:
    gangs = [job(f"g{i}", 16, gang_nodes=2, gpus_per_node=8, cpu_milli=8000 * (i + 1), memory_mib=1024 * (i + 1),
                 gpu_models=("B", "A")) for i in range(3)]
    assert job_spec(gangs[0]) == (8, 1000, ("A", "B"), "")
    assert job_spec(job("m", 1, mig_profile="1g.10gb")) == (1, 1000, (), "1g.10gb")
    assert job_spec(job("cpu", 0, cpu_milli=1000)) is None
    assert derive_workload(gangs) == (
        WorkloadShape(gpus=8, gpu_milli=1000, weight=3.0, cpu_milli=16000, memory_mib=2048, gpu_models=("A", "B")),)
    counts = {job_spec(gangs[0]): 2, job_spec(job("m", 1, mig_profile="1g.10gb")): 1}
    assert workload_from_counts(counts) == (
        WorkloadShape(gpus=8, gpu_milli=1000, weight=2.0, gpu_models=("A", "B")),
        WorkloadShape(gpus=1, gpu_milli=1000, weight=1.0, mig_profile="1g.10gb"),
    )
