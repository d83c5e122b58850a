"""What-if capacity on a recorded history: the pool scaled per model, the p90 wait of the jobs a model served, and
the smallest size that keeps it under a target, on a history small enough to reason about by hand."""

from __future__ import annotations

import math
from pathlib import Path

from libs.core.model import Gpu, JobRequest, Node
from libs.sim import whatif
from libs.sim.traces import HISTORY_COLUMNS, SimJob, read_generic, read_history, write_history

H100, L40S = "H100-80GB", "L40S"


def node(name: str, model: str, gpus: int = 2) -> Node:
    return Node(name, "sim", tuple(Gpu(f"{name}/gpu{i}", i, model, 81920) for i in range(gpus)))


POOL = [node("h-1", H100), node("h-2", H100), node("l-1", L40S)]


def burst(n: int = 8, model: str = H100, duration: float = 100.0) -> list[SimJob]:
    """n jobs of two GPUs each, all submitted at once, each running `duration` seconds."""
    return [SimJob(JobRequest(f"j{i}", "research", 2, 1000.0, gpu_models=(model,), kind="training"), duration)
            for i in range(n)]


def test_scaled_pool_adds_copies_of_a_models_node_or_drops_its_last_ones() -> None:
    bigger = whatif.scaled_pool(POOL, H100, 4)
    assert [n.name for n in bigger] == ["l-1", "h-1", "h-2", "h-1+1", "h-1+2"]
    assert [g.uuid for g in bigger[-1].gpus] == ["h-1+2/gpu0", "h-1+2/gpu1"]
    assert [n.name for n in whatif.scaled_pool(POOL, H100, 1)] == ["l-1", "h-1"]
    assert [n.name for n in whatif.scaled_pool(POOL, H100, 0)] == ["l-1"]


def test_smallest_pool_keeps_p90_wait_under_the_target() -> None:
    # eight 2-GPU jobs at once on n 2-GPU nodes run in ceil(8/n) waves of 100 s; the p90 (nearest rank, the 8th of
    # 8) is the last wave's start: (ceil(8/n) - 1) x 100 s. Under 150 s needs two waves: four nodes.
    jobs = burst() + [SimJob(JobRequest("l0", "inference", 1, 1000.0, gpu_models=(L40S,)), 50.0)]
    served = {j.job_id: j.request.gpu_models[0] for j in jobs}
    best, trials = whatif.smallest_pool(POOL, jobs, served, H100, 150.0)
    assert best is not None and (best.nodes, best.gpus, best.jobs) == (4, 8, 8)
    table = {t.nodes: t for t in trials}
    assert sorted(table) == [2, 3, 4]  # 4 (twice today) passes, then 2 and 3 fail
    assert table[2].p90_wait_s == 300.0 and table[3].p90_wait_s == 200.0 and table[4].p90_wait_s == 100.0
    assert not table[3].ok and table[4].ok


def test_no_size_within_the_bound_is_an_answer_of_none() -> None:
    best, trials = whatif.smallest_pool(POOL, burst(), {f"j{i}": H100 for i in range(8)}, H100, 10.0)
    assert best is None and [t.nodes for t in trials] == [4]


def test_a_job_that_never_starts_waits_forever() -> None:
    jobs = burst(2)
    t = whatif.trial(POOL, jobs, {"j0": H100, "j1": H100}, H100, 0, 600.0)
    assert (t.jobs, t.unplaced, t.ok) == (2, 2, False) and math.isinf(t.p90_wait_s)
    assert t.view()["p90_wait_s"] is None


def test_unknown_priority_classes_keep_their_numeric_priority() -> None:
    job = SimJob(JobRequest("x", "t", 1, 0.0, priority=7, priority_class="site-gold"), 1.0)
    (out,) = whatif.replayable([job])
    assert out.request.priority_class == "" and out.request.priority == 7


def test_a_history_file_reads_back_as_a_generic_trace(tmp_path: Path) -> None:
    path = tmp_path / "history.csv"
    rows = [{"job_id": "b", "submit_time": 20.5, "duration": 3.25, "gpus": 2, "gpu_model": "", "team": "research",
             "priority": 100, "kind": "training", "gpu_model_granted": H100, "state": "completed"},
            {"job_id": "a", "submit_time": 10.0, "duration": 1.0, "gpus": 1, "gpu_model": L40S, "team": "infer",
             "priority": 0, "gpu_milli": 500, "kind": "inference", "state": "running"}]
    assert write_history(path, rows) == 2
    assert path.read_text().splitlines()[0] == ",".join(HISTORY_COLUMNS)
    a, b = read_generic(path)
    assert (a.job_id, a.submit, a.duration, a.request.gpu_fraction_milli, a.request.gpu_models) == \
        ("a", 10.0, 1.0, 500, (L40S,))
    assert (b.job_id, b.request.gpus, b.request.team, b.request.priority, b.request.kind) == \
        ("b", 2, "research", 100, "training")
    _, served = read_history(path)
    assert served == {"a": L40S, "b": H100}
