"""Pending reasons as data (issue #19): each reason carries its facts (`plan.ReasonFacts`) and its message is
rendered from them, so explain can show numbers without parsing prose."""

from __future__ import annotations

import re

from core_builders import cluster, job, node, running, snapshot

from libs.core import Policy, QuotaEntry, QuotaTree, schedule, teams_quota
from libs.core.codec import dumps, loads
from libs.core.explain import render
from libs.core.plan import QuotaFacts, ReasonFacts

RAW_EPOCH = re.compile(r"t=\d|\d\.\d+e\+\d\d")


def test_a_quota_refusal_names_the_entry_model_and_its_numbers():
    quotas = teams_quota({"a": 2, "b": 2}, borrowing_limit=1)
    snap = snapshot(cluster(1, 8), running=[running("r", "node000", [0], team="a")])
    why = schedule(snap, [job("j", 3, team="a")], Policy(quotas=quotas), now=0.0).reason_of("j")
    assert why.reason == "QuotaExceeded"
    assert why.facts.quota == QuotaFacts("default/a", "*", "borrowing_limit", used_milli=1000, asked_milli=3000,
                                         limit_milli=3000, guaranteed_milli=2000)
    assert why.message == ("default/a would use 4 GPU(s) of any model (1 in use), over its guarantee 2 + borrowing "
                           "limit 1")
    assert "* GPU" not in why.message


def test_a_refusal_for_lack_of_lending_and_a_guarantee_only_refusal_carry_their_rule():
    tree = QuotaTree(entries=(QuotaEntry("default/a", 2, "L40S"), QuotaEntry("default/b", 6, "L40S")))
    snap = snapshot(cluster(1, 8, model="L40S"), running=[running("rb", "node000", range(6), team="b")])
    lend = schedule(snap, [job("j", 4, team="a", preemptible=True)], Policy(quotas=tree), now=0.0).reason_of("j")
    assert lend.facts.quota == QuotaFacts("default/a", "L40S", "lending", used_milli=0, asked_milli=4000,
                                          limit_milli=2000, guaranteed_milli=2000)
    assert "would borrow 2 L40S GPU(s) but only 0 can be lent now" in lend.message
    pinned = schedule(snapshot(cluster(1, 8, model="L40S")), [job("p", 3, team="a", preemptible=False)],
                      Policy(quotas=tree), now=0.0).reason_of("p")
    assert pinned.facts.quota == QuotaFacts("default/a", "L40S", "guarantee_only", used_milli=0, asked_milli=3000,
                                            limit_milli=2000, guaranteed_milli=2000)
    assert "p is not preemptible, so it may use only default/a's guarantee (2 L40S GPU(s), 0 in use)" \
        in pinned.message


def test_no_feasible_node_counts_the_nodes_filtered_out_and_names_the_exhausted_dimension():
    nodes = [node("a", 8, model="L40S"), node("b", 8, schedulable=False), node("c", 8, unhealthy=tuple(range(8))),
             node("d", 2, sharing="fractional"), node("e", 8), node("f", 8, cpu=4000, mem=1000),
             node("g", 8, labels=(("zone", "mars"),))]
    snap = snapshot(nodes, running=[running("r", "e", range(6)), running("r2", "f", range(2), cpu_milli=3000),
                                    running("r3", "g", range(8))])
    why = schedule(snap, [job("j", 4, gpu_models=("H100-80GB",), cpu_milli=2000)], Policy(),
                   now=0.0).reason_of("j")
    f = why.facts
    assert why.reason == "NoFeasibleNode" and f.cause == "no_room"
    assert f.nodes_evaluated == 7
    assert dict(f.filtered) == {"cordoned": 1, "gpu_model": 1, "health": 1}
    assert dict(f.short) == {"gpus": 3, "cpu": 1} and f.exhausted == "gpus"
    assert why.message.startswith("no schedulable node has room for 4 whole GPU(s) of H100-80GB on one node")
    assert "of 7 node(s): 1 not schedulable, 1 without a GPU of its models, 1 with only unhealthy GPUs" \
        in why.message


def test_the_exhausted_dimension_is_cpu_memory_gpu_share_or_mig_slice_as_the_nodes_lack_it():
    busy = snapshot([node("n", 8, cpu=8000, mem=64000)], running=[running("r", "n", [0], cpu_milli=7000)])
    cpu = schedule(busy, [job("c", 1, cpu_milli=2000)], Policy(), now=0.0).reason_of("c").facts
    assert (cpu.exhausted, dict(cpu.short)) == ("cpu", {"cpu": 1})
    shared = snapshot([node("s", 1, sharing="fractional")], running=[
        running("half", "s", [0], gpu_fraction_milli=700, gpu_memory_mib=1000)])
    frac = schedule(shared, [job("f", 1, gpu_fraction_milli=500, gpu_memory_mib=1000)], Policy(),
                    now=0.0).reason_of("f").facts
    assert frac.exhausted == "gpu_share"
    sharing = schedule(snapshot([node("x", 2)]), [job("m", 1, mig_profile="3g.40gb")], Policy(),
                       now=0.0).reason_of("m").facts
    assert dict(sharing.filtered) == {"sharing": 1}  # exclusive GPUs only: never a MIG slice there


def test_a_waiting_gang_names_the_rack_it_waits_for_as_facts():
    nodes = [node("a0", 4, topology="r1"), node("a1", 4, topology="r1"), node("b0", 4, topology="r2"),
             node("b1", 4, topology="r2")]
    snap = snapshot(nodes, running=[running("x", "a0", [0]), running("y", "b0", [0]), running("z", "b1", [0])])
    why = schedule(snap, [job("g", 12, gang_nodes=3, gpus_per_node=4)], Policy(), now=0.0).reason_of("g")
    f = why.facts
    assert why.reason == "WaitingForGang"
    assert (f.domain_kind, f.domain, f.domain_nodes, f.nodes_able, f.nodes_needed) == ("rack", "r1", 1, 1, 3)
    assert dict(f.short) == {"able": 1, "gpus": 3}
    assert "waiting for 3 node(s) in one rack: rack r1 has 1" in why.message


def test_a_reservation_says_its_nodes_and_start_in_iso_utc_not_a_raw_epoch():
    now = 1.79611e9
    snap = snapshot(cluster(2, 8), running=[
        running("r0", "node000", range(4), started=now - 100, max_runtime_s=700),
        running("r1", "node001", range(2), started=now - 100, max_runtime_s=400)])
    plan = schedule(snap, [job("big", 16, gang_nodes=2, gpus_per_node=8, kind="training", at=now)], Policy(),
                    now=now)
    why = plan.reason_of("big")
    (res,) = plan.reservations
    assert why.facts.reservation_nodes == res.nodes and sorted(res.nodes) == ["node000", "node001"]
    assert why.facts.reservation_start == res.start_by == now + 600 and why.facts.reservation_in_s == 600
    assert "reserved 2 node(s) to start by 2026-12-01T07:36:40Z (in 600 s)" in why.message, why.message
    assert not RAW_EPOCH.search(why.message), why.message


def test_preemption_facts_count_the_candidates_and_name_the_victims():
    snap = snapshot(cluster(1, 8), running=[
        running("low1", "node000", range(4), priority_class="low"),
        running("low2", "node000", range(4, 8), priority_class="low")])
    plan = schedule(snap, [job("hi", 4, priority_class="high")], Policy(preemption_cost=False), now=3600.0)
    why = plan.reason_of("hi")
    assert why.reason == "Preempting"
    assert why.facts.victims_considered == 2 and len(why.facts.victims) == 1
    assert why.facts.victims[0][1] == "PreemptedByPriority" and why.facts.victim_nodes == ("node000",)
    assert why.message == "waiting for 1 preempted job(s) to leave node000"
    # with the ski-rental rule it waits instead: the would-be victims and the GPU-hours, as data
    early = schedule(snap, [job("hi", 4, priority_class="high", at=3500.0)], Policy(), now=3600.0).reason_of("hi")
    w = early.facts.wait
    assert early.reason == "NoFeasibleNode" and w is not None and len(w.would_preempt) == 1
    assert w.lost_gpu_s == 4 * 3500 and w.waited_gpu_s == 4 * 100 and "so it waits" in early.message


def test_every_message_is_its_facts_rendered_and_facts_survive_the_codec():
    quotas = teams_quota({"a": 2}, borrowing_limit=0)
    snap = snapshot(cluster(2, 4))
    jobs = [job("q", 4, team="a"), job("bad", 1, kind="nope"), job("wide", 12, gang_nodes=3, gpus_per_node=4),
            job("sel", 1, node_selector=(("zone", "mars"),))]
    plan = schedule(snap, jobs, Policy(quotas=quotas), now=0.0)
    assert {r.job_id: r.facts.cause for r in plan.pending} == {
        "bad": "invalid", "q": "quota", "wide": "never_members", "sel": "selector"}
    for r in plan.pending:
        assert r.message == render(r.job_id, r.facts)
    assert loads(dumps(plan)) == plan
    assert plan.reason_of("sel").facts.labels == (("zone", "mars"),)
    assert plan.reason_of("wide").message.startswith(
        "a gang of 3 node(s) x 4 GPU(s) of any model: only 2 node(s) of this pool could take a member, even empty")


def test_rendering_never_prints_a_wildcard_as_a_model():
    facts = ReasonFacts(cause="quota", quota=QuotaFacts("org/t", "*", "lending", used_milli=2000, asked_milli=2000,
                                                        limit_milli=3000, guaranteed_milli=2000))
    assert render("j", facts) == "org/t would borrow 2 GPU(s) of any model but only 1 can be lent now"


def test_a_request_naming_the_wildcard_model_is_said_as_any_model():
    why = schedule(snapshot(cluster(1, 8)), [job("x", 2, gpu_models=("*",))], Policy(), now=0.0).reason_of("x")
    assert why.message == "no GPU model in the cluster can serve 2 whole GPU(s) of any model on one node"
    assert "*" not in why.message and why.facts.cause == "no_model"
