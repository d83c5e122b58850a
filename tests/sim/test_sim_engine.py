"""The simulator: readers, applier, replay and fill engines, metrics."""

from __future__ import annotations

from pathlib import Path

import pytest
from sim_builders import generic_trace, node_list, openb_tasks

from libs.core import Gpu, JobRequest, MigInstance, Node, Placement, Plan
from libs.sim import engine, traces
from libs.sim.applier import Ledger, PlanRejected
from libs.sim.metrics import jain, percentile
from libs.sim.traces import SimJob

DATA = Path(__file__).parent / "data"


def test_openb_readers_keep_cpu_memory_gpu_spec_and_fractions(tmp_path):
    nodes = traces.read_nodes(node_list(tmp_path / "nodes.csv"))
    tasks = traces.read_tasks(openb_tasks(tmp_path / "tasks.csv", n=50))
    assert len(nodes) == 12 and {len(n.gpus) for n in nodes} == {8, 2}
    assert all(g.sharing == "fractional" for n in nodes for g in n.gpus)
    shared = [t for t in tasks if 0 < t.gpu_milli < 1000]
    assert shared and all(t.request("x", 0.0, "t").gpu_fraction_milli == t.gpu_milli for t in shared)
    assert all(t.request("x", 0.0, "t").cpu_milli == t.cpu_milli for t in tasks)


def test_synthetic_teams_are_stable_for_a_seed_and_follow_the_weights():
    names = [f"pod-{i}" for i in range(4000)]
    first = [traces.synthetic_team(n, 1) for n in names]
    assert first == [traces.synthetic_team(n, 1) for n in names]
    assert first != [traces.synthetic_team(n, 2) for n in names]
    counts = {t: first.count(t) / len(first) for t in traces.TEAMS}
    for team, weight in zip(traces.TEAMS, traces.TEAM_WEIGHTS, strict=True):
        assert abs(counts[team] - weight) < 0.04


def test_applier_rejects_a_gpu_held_twice_and_changes_nothing():
    node = Node("n", "c", (Gpu("g0", 0, "H100-80GB", 81920), Gpu("g1", 1, "H100-80GB", 81920)))
    ledger = Ledger([node])
    ledger.apply(Plan((Placement("a", "c", "n", ("g0",), (0,)),), ()))
    bad = Plan((Placement("b", "c", "n", ("g1",), (1,)), Placement("c", "c", "n", ("g0",), (0,))), ())
    with pytest.raises(PlanRejected):
        ledger.apply(bad)
    assert set(ledger.holds) == {"a"}


def test_applier_rejects_a_partial_gang_and_an_overlapping_mig_instance():
    gpus = tuple(Gpu(f"g{i}", i, "A100-40GB", 40960, sharing="mig") for i in range(1)) + (
        Gpu("w0", 1, "A100-40GB", 40960),)
    ledger = Ledger([Node("n", "c", gpus)])
    gang = JobRequest("g", "t", 2, 0.0, gang_nodes=2, gpus_per_node=1)
    with pytest.raises(PlanRejected):
        ledger.apply(Plan((Placement("g", "c", "n", ("w0",), (1,)),), ()), {"g": gang})
    ledger.apply(Plan((Placement("m1", "c", "n", ("g0",), (0,), mig=MigInstance("3g.20gb", 4)),), ()))
    with pytest.raises(PlanRejected):
        ledger.apply(Plan((Placement("m2", "c", "n", ("g0",), (0,), mig=MigInstance("2g.10gb", 4)),), ()))
    ledger.apply(Plan((Placement("m3", "c", "n", ("g0",), (0,), mig=MigInstance("4g.20gb", 0)),), ()))
    ledger.invariants()


@pytest.mark.parametrize("policy", engine.POLICIES)
def test_replay_finishes_every_job_and_every_plan_passes_the_applier(tmp_path, policy):
    nodes = traces.read_nodes(node_list(tmp_path / "nodes.csv", shapes=((8, "G2", 96000, 393216, 2),)))
    jobs = traces.openb_jobs(traces.read_tasks(openb_tasks(tmp_path / "t.csv", n=120)), seed=0)
    result = engine.replay(nodes, jobs, policy)
    m = result.metrics
    assert m["finished"] == len(jobs) > 0
    assert 0.0 < m["gpu_allocation_rate"] <= 1.0
    assert m["jct_p99_s"] >= m["jct_p50_s"] > 0
    assert 0.0 < m["jain_fairness"] <= 1.0
    assert abs(sum(m["team_gpu_share"].values()) - 1.0) < 1e-6


def test_fifo_replay_starts_jobs_in_submit_order(tmp_path):
    nodes = traces.read_nodes(node_list(tmp_path / "nodes.csv", shapes=((8, "G2", 96000, 393216, 1),)))
    jobs = traces.read_generic(generic_trace(tmp_path / "g.csv", n=60))
    result = engine.replay(nodes, jobs, "fifo")
    starts = sorted((w + next(j.submit for j in jobs if j.job_id == k), k) for k, w in result.waits.items())
    submit = {j.job_id: (j.submit, j.job_id) for j in jobs}
    order = [submit[k] for _, k in starts]
    assert order == sorted(order)


def test_fill_stops_at_the_arrived_workload_and_the_curve_only_falls_by_what_was_placed(tmp_path):
    nodes = traces.read_nodes(node_list(tmp_path / "nodes.csv"))
    tasks = traces.read_tasks(openb_tasks(tmp_path / "t.csv", n=300, timed=False))
    r = engine.fill(nodes, tasks, "default", seed=5)
    assert r.metrics["arrived_workload"] >= 1.0
    shares = [u for _, u in r.curve]
    assert shares[0] == 1.0 and all(b <= a + 1e-9 for a, b in zip(shares, shares[1:], strict=False))
    assert r.metrics["unallocated_gpu_share"] == pytest.approx(shares[-1], abs=0.02)


def test_fragmentation_aware_default_leaves_fewer_gpus_unallocated_than_best_fit():
    # a 500-task / 120-node sample of the real openb trace (see tests/sim/data/README.md)
    nodes = traces.read_nodes(DATA / "openb_sample_nodes.csv")
    tasks = traces.read_tasks(DATA / "openb_sample_tasks.csv")
    seeds = range(3)
    default = [engine.fill(nodes, tasks, "default", seed=s).metrics["unallocated_gpu_share"] for s in seeds]
    best_fit = [engine.fill(nodes, tasks, "best-fit", seed=s).metrics["unallocated_gpu_share"] for s in seeds]
    assert sum(default) < sum(best_fit)
    assert sum(d < b for d, b in zip(default, best_fit, strict=True)) >= 2


def test_percentile_and_jain():
    assert percentile([], 99) == 0.0
    assert percentile([1, 2, 3, 4], 50) == 2
    assert percentile(list(range(1, 101)), 99) == 99
    assert jain([1, 1, 1]) == pytest.approx(1.0)
    assert jain([1, 0, 0, 0]) == pytest.approx(0.25)


def test_a_job_that_can_never_fit_is_rejected_up_front_instead_of_blocking_fifo(tmp_path):
    nodes = traces.read_nodes(node_list(tmp_path / "nodes.csv", shapes=((8, "G2", 96000, 393216, 1),)))
    impossible = traces.SimJob(JobRequest("huge", "t", 16, 0.0), 100.0)
    later = [traces.SimJob(JobRequest(f"j{i}", "t", 1, 1.0 + i), 50.0) for i in range(5)]
    result = engine.replay(nodes, [impossible] + later, "fifo")
    assert result.metrics["rejected_never_fit"] == 1
    assert result.metrics["finished"] == 5


def test_replay_keeps_one_scheduler_for_every_cycle_instead_of_rebuilding(tmp_path, monkeypatch):
    from libs.core import Scheduler

    built = []
    original = Scheduler.__init__

    def counting(self, *args, **kwargs):
        built.append(self)
        original(self, *args, **kwargs)

    monkeypatch.setattr(Scheduler, "__init__", counting)
    nodes = traces.read_nodes(node_list(tmp_path / "nodes.csv", shapes=((8, "G2", 96000, 393216, 2),)))
    jobs = traces.openb_jobs(traces.read_tasks(openb_tasks(tmp_path / "t.csv", n=120)), seed=0)
    result = engine.replay(nodes, jobs, "default")
    assert result.metrics["cycles"] > 20
    assert len(built) == 2  # the admission probe (never_fit) and the one the whole replay runs on


def test_generic_trace_carries_kind_and_replica_group(tmp_path):
    path = tmp_path / "g.csv"
    path.write_text("submit_time,duration,gpus,gpu_model,team,priority,kind,replica_group\n"
                    "0,60,1,,a,0,inference,svc\n5,60,2,,b,0,,\n")
    first, second = traces.read_generic(path)
    assert (first.request.kind, first.request.replica_group) == ("inference", "svc")
    assert (second.request.kind, second.request.replica_group) == ("batch", "")


def test_the_finish_a_preempted_run_was_due_at_wakes_no_cycle():
    """A preempted job goes back to the queue: the finish its first run was due at is no event, and the platform
    would not wake for it; a cycle there once ran for nothing (a sixth of a preempting replay's cycles)."""
    node = Node("n0", "c", (Gpu("g0", 0, "A100", 81920),), cpu_milli=64000, memory_mib=262144)
    jobs = [SimJob(JobRequest("low", "a", 1, 0.0, priority=0, preemptible=True), 10_000.0),
            SimJob(JobRequest("high", "a", 1, 400.0, priority=1000, preemptible=False), 50.0)]
    r = engine.replay([node], jobs, "default")
    assert r.metrics["preemptions"] == 1 and r.series.preempt_t == [400.0]
    # arrivals 0 and 400, the preemptor's start one interval later, its finish, the victim's restart finishing
    assert r.series.t == [0.0, 400.0, 430.0, 480.0, 10_480.0]
    assert 10_000.0 not in r.series.t and r.metrics["finished"] == 2
