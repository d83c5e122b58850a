"""Filter -> score -> select: whole GPUs, gangs, fractions, MIG, topology, reasons."""

from __future__ import annotations

from core_builders import cluster, job, node, running, snapshot

from libs.core import MigInstance, Policy, schedule
from libs.core import mig as migcat
from libs.sim.applier import Ledger


def _apply(snap, plan, jobs):
    ledger = Ledger(snap.nodes, snap.allocated_gpus)
    ledger.hold_allocations(snap.running)
    ledger.apply(plan, {j.job_id: j for j in jobs})
    ledger.invariants()
    return ledger


def test_places_multi_gpu_job_inside_one_nvlink_domain():
    snap = snapshot([node("a", 8, nvlink_group=4)], running=[running("r", "a", [0])])
    jobs = [job("j", 3)]
    plan = schedule(snap, jobs, Policy(), now=1000.0)
    (p,) = plan.placements
    domains = {i // 4 for i in p.gpu_indices}
    assert len(domains) == 1 and len(p.gpu_indices) == 3
    _apply(snap, plan, jobs)


def test_every_pending_job_gets_a_reason_code_and_message():
    snap = snapshot(cluster(1, 4))
    jobs = [job("big", 8), job("ok", 4, at=1.0), job("later", 4, at=2.0), job("bad", 0),
            job("bad-class", 1, priority_class="nope")]
    plan = schedule(snap, jobs, Policy(), now=0.0)
    placed = {p.job_id for p in plan.placements}
    reasons = {r.job_id: r for r in plan.pending}
    assert placed | set(reasons) == {j.job_id for j in jobs}
    assert reasons["later"].reason == "NoFeasibleNode" and reasons["later"].message  # the node is busy now
    assert reasons["big"].reason == "Unschedulable" and "even empty" in reasons["big"].message  # never fits
    assert reasons["bad"].reason == "InvalidRequest"
    assert reasons["bad-class"].reason == "InvalidRequest"


def test_gang_is_placed_on_distinct_nodes_or_not_at_all():
    snap = snapshot(cluster(3, 8), running=[running("r", "node000", range(4))])
    fits = job("fits", 16, gang_nodes=2, gpus_per_node=8)
    too_big = job("too-big", 24, gang_nodes=3, gpus_per_node=8, at=1.0)
    plan = schedule(snap, [fits, too_big], Policy(), now=0.0)
    parts = plan.placements_of("fits")
    assert sorted(p.node for p in parts) == ["node001", "node002"]
    assert plan.placements_of("too-big") == ()
    assert plan.reason_of("too-big").reason == "WaitingForGang"


def test_flexible_gang_uses_as_few_nodes_as_fit():
    snap = snapshot(cluster(4, 8), running=[running("r", "node000", range(6))])
    plan = schedule(snap, [job("g", 12, gang=True)], Policy(), now=0.0)
    parts = plan.placements_of("g")
    assert sum(len(p.gpu_indices) for p in parts) == 12
    assert len(parts) == 2


def test_gang_prefers_one_topology_domain():
    nodes = [node("a0", 8, topology="rack-a"), node("b0", 8, topology="rack-b"), node("a1", 8, topology="rack-a")]
    plan = schedule(snapshot(nodes), [job("g", 16, gang_nodes=2, gpus_per_node=8)], Policy(), now=0.0)
    assert sorted(p.node for p in plan.placements) == ["a0", "a1"]


def test_fractions_share_a_gpu_until_it_is_full():
    snap = snapshot([node("s", 1, sharing="fractional")])
    jobs = [job(f"f{i}", 1, gpu_fraction_milli=300, at=float(i)) for i in range(4)]
    plan = schedule(snap, jobs, Policy(), now=0.0)
    assert len(plan.placements) == 3
    assert all(p.gpu_fraction_milli == 300 for p in plan.placements)
    assert plan.reason_of("f3").reason == "NoFeasibleNode"
    _apply(snap, plan, jobs)


def test_fraction_is_never_placed_on_an_exclusive_gpu():
    plan = schedule(snapshot([node("x", 2)]), [job("f", 1, gpu_fraction_milli=500)], Policy(), now=0.0)
    assert plan.placements == () and plan.reason_of("f").reason == "Unschedulable"  # no shareable GPU at all


def test_mig_request_gets_a_valid_new_instance_and_a_reconfig():
    snap = snapshot([node("m", 1, model="A100-40GB", memory_mib=40960, sharing="mig")])
    jobs = [job("a", 1, mig_profile="3g.20gb"), job("b", 1, mig_profile="3g.20gb", at=1.0),
            job("c", 1, mig_profile="1g.5gb", at=2.0)]
    plan = schedule(snap, jobs, Policy(), now=0.0)
    got = {p.job_id: p.mig for p in plan.placements}
    assert set(got) == {"a", "b"}
    assert migcat.valid_layout("A100-40GB", [(m.profile, m.start) for m in got.values()])
    assert {c.start for r in plan.mig_reconfigs for c in r.create} == {0, 4}
    assert plan.reason_of("c").reason == "NoFeasibleNode"
    _apply(snap, plan, jobs)


def test_mig_request_reuses_an_idle_configured_instance():
    snap = snapshot([node("m", 1, model="H100-80GB", sharing="mig", mig={0: (("1g.10gb", 3),)})])
    plan = schedule(snap, [job("a", 1, mig_profile="1g.10gb")], Policy(), now=0.0)
    assert plan.placements[0].mig == MigInstance("1g.10gb", 3)
    assert plan.mig_reconfigs == ()


def test_unhealthy_gpus_and_cordoned_nodes_are_never_used():
    nodes = [node("sick", 2, unhealthy=(0, 1)), node("cordoned", 2, schedulable=False), node("ok", 2)]
    plan = schedule(snapshot(nodes), [job("j", 2)], Policy(), now=0.0)
    assert plan.placements[0].node == "ok"


def test_cpu_and_memory_must_fit_as_well_as_gpus():
    nodes = [node("small", 8, cpu=4000, mem=16384), node("large", 8, cpu=64000, mem=262144)]
    plan = schedule(snapshot(nodes), [job("j", 1, cpu_milli=8000, memory_mib=32768)], Policy(), now=0.0)
    assert plan.placements[0].node == "large"


def test_model_memory_and_labels_filter_nodes():
    nodes = [
        node("t4", 4, model="T4", memory_mib=16384),
        node("h100", 4, labels=[("zone", "b")]),
        node("h100z", 4, labels=[("zone", "a")]),
    ]
    jobs = [job("mem", 1, min_gpu_memory_mib=40000, node_selector=(("zone", "a"),)),
            job("model", 1, gpu_models=("T4",), at=1.0)]
    plan = schedule(snapshot(nodes), jobs, Policy(), now=0.0)
    assert {p.job_id: p.node for p in plan.placements} == {"mem": "h100z", "model": "t4"}


def test_best_fit_packs_and_spread_spreads():
    snap = snapshot(cluster(2, 8), running=[running("r", "node001", range(4))])
    packed = schedule(snap, [job("j", 2)], Policy(name="best-fit"), now=0.0)
    spread = schedule(snap, [job("j", 2)], Policy(name="spread"), now=0.0)
    assert packed.placements[0].node == "node001"
    assert spread.placements[0].node == "node000"


def test_same_inputs_give_the_same_plan():
    snap = snapshot(cluster(6, 8), running=[running("r", "node002", range(3))])
    jobs = [job(f"j{i}", 1 + i % 3, team=f"t{i % 2}", at=float(i % 5)) for i in range(30)]
    assert schedule(snap, jobs, Policy(), 10.0) == schedule(snap, list(reversed(jobs)), Policy(), 10.0)


def test_snapshot_allocated_gpus_are_never_handed_out():
    snap = snapshot(cluster(1, 2), allocated=["node000-gpu0"])
    plan = schedule(snap, [job("a", 1), job("b", 1, at=1.0)], Policy(), now=0.0)
    assert [p.gpu_indices for p in plan.placements] == [(1,)]
    assert plan.reason_of("b").reason == "NoFeasibleNode"


def test_mig_layout_planner_fills_free_slots_and_never_touches_busy_instances():
    from libs.core import Allocation, plan_mig_layouts

    mig_node = node("m", 2, model="A100-80GB", sharing="mig", mig={0: (("3g.40gb", 0),)})
    busy = Allocation("r", "team-a", "m", mig=(("m-gpu0", MigInstance("3g.40gb", 0)),))
    snap = snapshot([mig_node], running=[busy])
    changes = plan_mig_layouts(snap, {"3g.40gb": 2, "1g.10gb": 2})
    created = {(c.gpu_uuid, i.profile, i.start) for c in changes for i in c.create}
    assert all(not c.destroy for c in changes)
    assert ("m-gpu0", "3g.40gb", 4) in created  # the partly used GPU is filled first
    assert not any(uuid == "m-gpu0" and start < 4 for uuid, _, start in created)
    for c in changes:
        kept = [("3g.40gb", 0)] if c.gpu_uuid == "m-gpu0" else []
        assert migcat.valid_layout("A100-80GB", kept + [(i.profile, i.start) for i in c.create])


def test_mig_slices_pack_onto_a_used_gpu_and_keep_a_whole_gpu_for_a_7g_instance():
    from libs.core import Allocation

    nodes = [node("m", 2, model="H100-80GB", sharing="mig")]
    busy = Allocation("r", "team-a", "m", mig=(("m-gpu1", MigInstance("1g.10gb", 0)),))
    snap = snapshot(nodes, running=[busy])
    jobs = [job("s1", 1, mig_profile="1g.10gb"), job("s2", 1, mig_profile="2g.20gb", at=1.0),
            job("big", 1, mig_profile="7g.80gb", at=2.0)]
    plan = schedule(snap, jobs, Policy(), now=0.0)
    where = {p.job_id: p.gpu_indices[0] for p in plan.placements}
    assert where == {"s1": 1, "s2": 1, "big": 0}
    _apply(snap, plan, jobs)


def test_without_nvlink_information_gpus_stay_on_one_numa_node():
    from libs.core import Gpu, Node

    gpus = tuple(Gpu(f"p-gpu{i}", i, "L40S", 46068, numa_node=0 if i in (0, 2, 4) else 1) for i in range(6))
    snap = snapshot([Node("p", "c1", gpus)], running=[running("r", "p", [0])])
    plan = schedule(snap, [job("j", 3)], Policy(), now=0.0)
    assert plan.placements[0].gpu_indices == (1, 3, 5)


def test_plan_counts_what_the_cycle_did():
    plan = schedule(snapshot(cluster(2, 4)), [job("a", 4), job("b", 4, at=1.0), job("c", 4, at=2.0)], Policy(),
                    now=0.0)
    stats = dict(plan.stats)
    assert stats["jobs"] == 3 and stats["placed"] == 2 and stats["pending"] == 1
    assert stats["node_groups"] >= 1 and stats["groups_scored"] >= 2


def test_a_job_that_could_never_fit_the_pool_is_unschedulable_blocks_no_fifo_queue_and_fits_once_it_grows():
    small = snapshot(cluster(2, 4))
    jobs = [job("huge", 12, gang=True), job("nine", 9), job("wide", 12, gang_nodes=3, gpus_per_node=4),
            job("after", 4, at=5.0)]
    for name in ("default", "fifo"):
        plan = schedule(small, jobs, Policy(name=name), now=0.0)
        reasons = {r.job_id: r for r in plan.pending}
        assert reasons["huge"].reason == "Unschedulable" and "8 GPU(s) that could serve it" in reasons["huge"].message
        assert reasons["nine"].reason == "Unschedulable" and "on one node" in reasons["nine"].message
        assert reasons["wide"].reason == "Unschedulable" and "only 2 node(s)" in reasons["wide"].message
        assert "after" in {p.job_id for p in plan.placements}, name  # fifo does not wait behind them
        assert not plan.preemptions and not plan.reservations
    grown = snapshot(cluster(3, 4))  # re-checked every cycle: with a third node "huge" fits
    plan = schedule(grown, jobs[:1], Policy(), now=0.0)
    assert {p.job_id for p in plan.placements} == {"huge"}
