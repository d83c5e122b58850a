"""Placement turns wanted jobs into the core's schedulable units: a whole job, a gang, or each missing replica."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from libs.core import (
    Allocation,
    Gpu,
    JobRequest,
    MigInstance,
    Node,
    PendingReason,
    Placement,
    Policy,
    Share,
    Snapshot,
    UsageRecord,
    schedule,
)
from services.placement.domain import (
    RequestBuilder,
    allocated_gpus,
    build_requests,
    queue_order,
    split_unit,
    unit_id,
)
from services.placement.incremental import WantedJobs

T0 = datetime(2026, 11, 30, tzinfo=UTC)


def wanted(job_id: str, **over):  # type: ignore[no-untyped-def]
    base = {"job_id": job_id, "team": "research", "project": "default", "gpus": 1, "gpu_models": [], "priority": 0,
            "priority_class": "normal", "kind": "batch", "submitted_at": T0, "gang_nodes": 0, "gpus_per_node": 0,
            "replicas": 1, "max_runtime_s": None, "gpu_fraction_milli": 0, "gpu_memory_mib": 0, "mig_profile": "",
            "exclusive": False}
    return {**base, **over}


def test_a_single_job_is_one_unit_until_it_holds_gpus() -> None:
    assert [r.job_id for r in build_requests([wanted("a")], {})] == ["a"]
    assert build_requests([wanted("a")], {"a": {0}}) == []


def test_a_gang_is_one_unit_with_its_shape() -> None:
    [req] = build_requests([wanted("g", gpus=16, gang_nodes=2, gpus_per_node=8)], {})
    assert (req.job_id, req.gang_nodes, req.gpus_per_node, req.gpus) == ("g", 2, 8, 16)


def test_a_replicated_job_asks_only_for_its_missing_replicas() -> None:
    requests = build_requests([wanted("svc", replicas=4, kind="inference")], {"svc": {0, 2}})
    assert [r.job_id for r in requests] == ["svc#1", "svc#3"]
    assert all(r.kind == "inference" and r.gpus == 1 for r in requests)


def test_unit_ids_round_trip() -> None:
    assert split_unit(unit_id("svc", 3, replica_set=True)) == ("svc", 3)
    assert split_unit(unit_id("svc", 0, replica_set=True)) == ("svc", 0)  # a service at one replica stays one
    assert split_unit(unit_id("job", 0, replica_set=False)) == ("job", None)


def test_declared_max_runtime_reaches_the_core() -> None:
    [req] = build_requests([wanted("b", max_runtime_s=600.0)], {})
    assert req.max_runtime_s == 600.0


def test_explicit_fractions_and_mig_slices_reach_the_core() -> None:
    [frac] = build_requests([wanted("f", gpu_fraction_milli=250, gpu_memory_mib=8192)], {})
    assert (frac.gpu_fraction_milli, frac.gpu_memory_mib, frac.mig_profile) == (250, 8192, "")
    [mig] = build_requests([wanted("m", mig_profile="3g.40gb")], {})
    assert (mig.gpu_fraction_milli, mig.mig_profile) == (0, "3g.40gb")


OFFERED = {"exclusive": {"H100-80GB"}, "fractional": {"L40S"}, "mig": {"A100-80GB", "H200-141GB"}}


def test_a_dev_job_without_a_share_gets_a_fraction_where_the_pool_offers_one() -> None:
    [req] = build_requests([wanted("d", kind="dev")], {}, OFFERED, dev_fraction_milli=300, dev_memory_mib=9000)
    assert (req.gpu_fraction_milli, req.gpu_memory_mib, req.mig_profile) == (300, 9000, "")


def test_a_dev_job_gets_the_smallest_mig_slice_with_enough_memory_when_no_fractional_gpu_fits() -> None:
    [req] = build_requests([wanted("d", kind="dev", gpu_models=["A100-80GB", "H100-80GB"])], {}, OFFERED,
                           dev_memory_mib=16384)
    # 1g.10gb has too little memory; 1g.20gb and 2g.20gb have enough, and the one with less compute wins
    assert (req.mig_profile, req.gpu_models, req.gpu_fraction_milli) == ("1g.20gb", ("A100-80GB",), 0)
    # a whole GPU of the models it allows is the last resort
    assert req.alternatives == (Share(gpu_models=("A100-80GB", "H100-80GB")),)


def test_a_dev_job_falls_back_from_a_fraction_to_each_mig_slice_then_a_whole_gpu() -> None:
    [req] = build_requests([wanted("d", kind="dev")], {}, OFFERED, dev_fraction_milli=300, dev_memory_mib=9000)
    assert req.alternatives == (Share(mig_profile="1g.10gb", gpu_models=("A100-80GB",)),
                                Share(mig_profile="1g.18gb", gpu_models=("H200-141GB",)), Share())


def test_a_dev_job_stays_whole_when_it_says_exclusive_or_nothing_shared_is_offered() -> None:
    [excl] = build_requests([wanted("d", kind="dev", exclusive=True)], {}, OFFERED)
    [whole] = build_requests([wanted("d", kind="dev", gpu_models=["H100-80GB"])], {}, OFFERED)
    [batch] = build_requests([wanted("b", kind="batch")], {}, OFFERED)
    assert all((r.gpu_fraction_milli, r.mig_profile, r.alternatives) == (0, "", ()) for r in (excl, whole, batch))


def test_allocated_gpus_say_what_share_each_placement_holds() -> None:
    models = {"G0": "A100-80GB", "G1": "L40S", "G2": "H100-80GB"}
    mig, slots = allocated_gpus(Placement("j", "c", "n", ("G0",), (0,), mig=MigInstance("3g.40gb", 4)), models)
    assert (mig[0].mig_profile, mig[0].mig_start, mig[0].share_milli, slots) == ("3g.40gb", 4, 428, {"G0": 4})
    frac, slots = allocated_gpus(Placement("j", "c", "n", ("G1",), (1,), gpu_fraction_milli=250,
                                           gpu_memory_mib=4096), models)
    assert (frac[0].share_milli, frac[0].memory_mib, frac[0].mig_profile, slots) == (250, 4096, None, {})
    whole, _ = allocated_gpus(Placement("j", "c", "n", ("G2",), (2,)), models)
    assert (whole[0].share_milli, whole[0].memory_mib) == (1000, None)


def test_running_replicas_carry_their_kind_and_service_so_the_core_keeps_protecting_and_spreading_them() -> None:
    from services.placement.domain import build_snapshot

    node = {"cluster": "c", "node": "n1", "schedulable": True}
    gpu = {"uuid": "G0", "cluster": "c", "node": "n1", "idx": 0, "model": "L40S", "memory_mib": 46068,
           "health": "healthy", "sharing": "exclusive"}
    running = {"job_id": "svc", "replica": 1, "replicas": 3, "team": "t", "project": "p", "node": "n1",
               "granted_at": T0, "priority": 1000, "priority_class": "production-inference", "kind": "inference",
               "preempt_deadline": None, "max_runtime_s": None, "gpu_uuids": ["G0"], "gpu_model": "L40S",
               "share_milli": 1000, "gpu_memory_mib": None, "mig_profiles": [None], "mig_starts": [None]}
    [alloc] = build_snapshot([node], [gpu], [running]).running
    assert (alloc.job_id, alloc.kind, alloc.replica_group) == ("svc#1", "inference", "svc")
    [req] = build_requests([wanted("svc", replicas=2, kind="inference")], {"svc": {0}})
    assert (req.job_id, req.replica_group) == ("svc#1", "svc")


def test_the_workload_environment_keeps_a_fraction_inside_its_share_through_mps() -> None:
    from libs.contracts.events import AllocatedGpu
    from services.placement.domain import workload_environment

    whole = workload_environment([AllocatedGpu(uuid="GPU-a", index=0, model="H100-80GB"),
                                  AllocatedGpu(uuid="GPU-b", index=1, model="H100-80GB")])
    assert whole == {"CUDA_VISIBLE_DEVICES": "GPU-a,GPU-b"}
    frac = workload_environment([AllocatedGpu(uuid="GPU-c", index=2, model="L40S", share_milli=333,
                                              memory_mib=12288)], "alloc-1")
    assert frac == {"CUDA_VISIBLE_DEVICES": "GPU-c", "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE": "34",
                    "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT": "0=12288M", "GPUPOOL_ALLOCATION_ID": "alloc-1"}
    mig = workload_environment([AllocatedGpu(uuid="GPU-d", index=3, model="A100-80GB", share_milli=428,
                                             mig_profile="3g.40gb", mig_start=4)])
    assert "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE" not in mig



def test_the_request_builder_gives_the_same_objects_back_for_the_same_row_and_new_ones_for_a_new_row() -> None:
    builder = RequestBuilder()
    a, svc = wanted("a"), wanted("svc", replicas=3, kind="inference")
    first = builder.build([a, svc], {}, {}, 500, 16384)
    assert [r.job_id for r in first] == ["a", "svc#0", "svc#1", "svc#2"]
    again = builder.build([a, svc], {"svc": {1}}, {}, 500, 16384)
    assert [r.job_id for r in again] == ["a", "svc#0", "svc#2"]
    assert again[0] is first[0] and again[1] is first[1] and again[2] is first[3]
    changed = builder.build([{**a, "gpus": 2}, svc], {}, {}, 500, 16384)  # a new row object: built again
    assert changed[0] is not first[0] and changed[0].gpus == 2 and changed[1] is first[1]
    assert builder.build([a], {"a": {0}}, {}, 500, 16384) == []  # a single job that holds its GPU asks for none


def test_the_request_builder_forgets_when_what_the_pool_offers_dev_jobs_changes() -> None:
    builder = RequestBuilder()
    dev = wanted("nb", kind="dev", gpu_models=["L40S"])
    [whole] = builder.build([dev], {}, {}, 500, 16384)
    [shared] = builder.build([dev], {}, {"fractional": {"L40S"}}, 500, 16384)
    assert whole.gpu_fraction_milli == 0 and shared.gpu_fraction_milli == 500
    assert builder.build([dev], {}, {"fractional": {"L40S"}}, 500, 16384)[0] is shared


def test_build_requests_and_the_builder_agree() -> None:
    rows = [wanted("a"), wanted("g", gpus=16, gang_nodes=2, gpus_per_node=8), wanted("svc", replicas=4),
            wanted("nb", kind="dev")]
    live = {"svc": {0, 2}, "g": {0}}
    offered = {"mig": {"A100-80GB"}}
    assert build_requests(rows, live, offered) == RequestBuilder().build(rows, live, offered, 500, 16384)


def test_the_remembering_builder_agrees_with_the_plain_one_cycle_after_cycle() -> None:
    import random

    rng = random.Random(5)
    builder, rows, n = RequestBuilder(), [], 0
    for _ in range(40):
        rows = [r if rng.random() > 0.1 else {**r} for r in rows if rng.random() > 0.1]  # gone, or a new object
        for _ in range(rng.randint(0, 6)):
            n += 1
            rows.append(rng.choice((wanted(f"j{n}"), wanted(f"s{n}", replicas=3, kind="inference"),
                                    wanted(f"g{n}", gpus=16, gang_nodes=2, gpus_per_node=8))))
        live = {r["job_id"]: set(rng.sample(range(3), rng.randint(1, 2))) for r in rows if rng.random() < 0.3}
        offered = rng.choice(({}, {"fractional": {"L40S"}}))
        assert builder.build(rows, live, offered, 500, 16384) == build_requests(rows, live, offered)


def test_wanted_jobs_keep_unchanged_rows_and_take_changed_ones() -> None:
    wanted_jobs = WantedJobs()
    a, b = wanted("a"), wanted("b")
    assert wanted_jobs.merge([a, b], [], 2, "12") == [a, b]
    assert wanted_jobs.horizon == "12"
    b2 = wanted("b", replicas=2)
    c = wanted("c")
    now = wanted_jobs.merge([b2, c], [], 3, "15")
    assert now == [a, b2, c] and now[0] is a
    assert wanted_jobs.merge([], ["a", "b"], 1, "16") == [c]  # a and b no longer wanted
    assert wanted_jobs.merge([], ["x"], 1, "17") == [c]  # gone before it was ever seen


def test_wanted_jobs_that_do_not_hold_as_many_rows_as_the_store_start_over() -> None:
    wanted_jobs = WantedJobs()
    wanted_jobs.merge([wanted("a")], [], 1, "12")
    assert wanted_jobs.merge([], [], 2, "13") is None  # one was added that the read did not return
    assert wanted_jobs.rows == {} and wanted_jobs.horizon == "0"
    wanted_jobs.merge([wanted("a"), wanted("b")], [], 2, "12")
    assert wanted_jobs.merge([], [], 1, "13") is None  # one left that the read did not tell of


def test_kept_rows_in_key_order_when_asked() -> None:
    nodes = WantedJobs("key")
    rows = [{"key": k} for k in ("c", "a", "b")]
    assert [r["key"] for r in nodes.merge(rows, (), 3, "5", ordered=True)] == ["a", "b", "c"]
    assert [r["key"] for r in nodes.merge([{"key": "0"}], (), 4, "6", ordered=True)] == ["0", "a", "b", "c"]


def test_the_queue_order_is_the_order_the_core_tried_the_jobs_in_each_job_once() -> None:
    node = Node("n1", "c", tuple(Gpu(f"g{i}", i, "H100", 81920) for i in range(2)))
    full = Snapshot(nodes=(node,), running=(Allocation("blocker", "ops", "n1", ("g0", "g1")),),
                    usage=(UsageRecord("ml", "H100", 70.0, as_of=1_000.0),))  # ml used 70 GPU-seconds
    pending = [JobRequest("ml-job", "ml", 2, submitted_at=10.0), JobRequest("cv-job", "cv", 2, submitted_at=20.0),
               JobRequest("svc", "cv", 1, submitted_at=30.0, replica_group="svc")]
    plan = schedule(full, pending, Policy(), now=1_000.0)
    assert not plan.placements
    assert queue_order(plan.pending) == ("cv-job", "svc", "ml-job")  # 70 GPU-seconds put ml behind cv
    # replicas of one service are one job in the order, at its first unit's place
    assert queue_order([PendingReason("s#1", "X", ""), PendingReason("a", "X", ""),
                        PendingReason("s#0", "X", "")]) == ("s", "a")


def test_a_draining_gpu_and_one_whose_work_does_not_fit_its_mode_take_no_new_work() -> None:
    from services.placement.domain import build_snapshot, closed_gpus

    gpus = [{"uuid": f"g{i}", "cluster": "c", "node": "n", "idx": i, "model": "H100-80GB", "memory_mib": 81920,
             "health": "healthy", "sharing": mode, "draining": i == 3}
            for i, mode in enumerate(("exclusive", "exclusive", "fractional", "fractional"))]
    running = [{"gpu_uuids": ["g0"], "share_milli": 142, "mig_profiles": ["1g.10gb"]},  # a slice on exclusive
               {"gpu_uuids": ["g1"], "share_milli": 1000, "mig_profiles": [None]},  # whole on exclusive: fine
               {"gpu_uuids": ["g2"], "share_milli": 1000, "mig_profiles": [None]}]  # whole on fractional: fine
    assert closed_gpus(gpus, running) == {"g0", "g3"}
    nodes = [{"cluster": "c", "node": "n", "schedulable": True, "labels": {}}]
    snap = build_snapshot(nodes, gpus, [])
    assert [g.healthy for g in snap.nodes[0].gpus] == [True, True, True, False]


def test_pool_facts_are_worked_out_again_only_when_the_pools_read_changed_it() -> None:
    from services.placement.incremental import PoolFacts

    pool = WantedJobs("key")
    gpu = {"uuid": "g0", "model": "H100", "health": "healthy", "sharing": "exclusive"}
    nodes = pool.merge([{"key": "n", "gpus": [gpu]}], (), 1, "5")
    assert pool.changed
    facts = PoolFacts()
    facts.update([g for n in nodes for g in n["gpus"]], pool.changed)
    assert facts.offered == {"exclusive": {"H100"}} and facts.models == {"g0": "H100"}
    pool.merge([], (), 1, "6")
    assert not pool.changed  # nothing came back: what was derived holds
    facts.update([{**gpu, "model": "ignored"}], pool.changed)
    assert facts.models == {"g0": "H100"}
    pool.merge([{"key": "n", "gpus": [{**gpu, "sharing": "mig", "model": "A100"}]}], (), 1, "7")
    assert pool.changed
    facts.update([{**gpu, "sharing": "mig", "model": "A100"}], pool.changed)
    assert facts.offered == {"mig": {"A100"}} and facts.models == {"g0": "A100"}


def test_live_facts_give_replicas_the_earliest_deadline_and_who_waits_for_victims() -> None:
    from services.placement.domain import live_facts

    t = datetime(2026, 12, 3, tzinfo=UTC)
    running = [{"job_id": "a", "replica": 0, "preempt_deadline": None, "preempted_by": None},
               {"job_id": "a", "replica": 2, "preempt_deadline": t + timedelta(seconds=9), "preempted_by": "x"},
               {"job_id": "b", "replica": 0, "preempt_deadline": t + timedelta(seconds=3), "preempted_by": "y#1"}]
    live, deadline, waiting = live_facts(running)
    assert live == {"a": {0, 2}, "b": {0}} and deadline == t + timedelta(seconds=3) and waiting == {"x", "y#1"}
    assert live_facts([])[1:] == (None, set())
