"""A node says which isolation drivers it can run (labels at registration) and a job whose work needs one is placed
only where it is offered, with a reason naming the driver when no schedulable node offers it."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime
from types import SimpleNamespace

from libs.core import Allocation, Gpu, JobRequest, Node, Policy, Snapshot, schedule
from libs.core.reasons import NO_FEASIBLE_NODE, NO_NODE_MATCHES_SELECTOR
from services.agent import bootstrap as agent_bootstrap
from services.agent import registration as agent_registration
from services.agent.nvml_sim import SimulatedNvml
from services.placement.domain import (
    ISOLATION_LABEL_PREFIX,
    NO_NODE_OFFERS_ISOLATION,
    build_requests,
    build_snapshot,
    isolation_selector,
    pending_reasons,
)

T0 = datetime(2026, 11, 30, tzinfo=UTC)
SANDBOX = ISOLATION_LABEL_PREFIX + "sandbox"
PROCESS = ISOLATION_LABEL_PREFIX + "process"


def wanted(job_id: str, **over):  # type: ignore[no-untyped-def]
    base = {"job_id": job_id, "team": "research", "project": "default", "gpus": 1, "gpu_models": [], "priority": 0,
            "priority_class": "normal", "kind": "batch", "submitted_at": T0, "gang_nodes": 0, "gpus_per_node": 0,
            "replicas": 1, "max_runtime_s": None, "gpu_fraction_milli": 0, "gpu_memory_mib": 0, "mig_profile": "",
            "exclusive": False, "isolation": None}
    return {**base, **over}


def node(name: str, *drivers: str, schedulable: bool = True, gpus: int = 2) -> Node:
    return Node(name=name, cluster="c", schedulable=schedulable,
                gpus=tuple(Gpu(uuid=f"{name}-g{i}", index=i, model="H100", memory_mib=81_920) for i in range(gpus)),
                labels=tuple(sorted((ISOLATION_LABEL_PREFIX + d, "true") for d in drivers)))


def plan_for(nodes: list[Node], rows: list[dict], running: tuple[Allocation, ...] = ()):  # type: ignore[no-untyped-def]
    requests = build_requests(rows, {})
    return requests, schedule(Snapshot(nodes=tuple(nodes), running=running), requests, Policy(), now=1000.0)


def node_info():  # type: ignore[no-untyped-def]
    sim = SimulatedNvml("n0", ["H100-80GB"], seed=1, clock=lambda: 0.0)
    sim.open()
    try:
        return sim.node_info()
    finally:
        sim.close()


# --- the agent reports its drivers --------------------------------------------------------------------------------
def test_registration_labels_only_the_drivers_the_node_offers_and_can_run() -> None:
    info = node_info()
    drivers = {"process": None, "sandbox": None, "container": "podman and runc are not both installed"}
    cmd = agent_registration.registration("c", "n0", info, drivers=drivers, labels={"rack": "r1"})
    assert cmd.labels == {"rack": "r1", PROCESS: "true", SANDBOX: "true"}
    not_offered = {"process": None, "sandbox": "not offered by this node's configuration", "container": "no root"}
    assert agent_registration.registration("c", "n0", info, drivers=not_offered).labels == {PROCESS: "true"}


def test_an_agent_that_runs_no_work_registers_no_isolation_label() -> None:
    info = node_info()
    assert agent_registration.registration("c", "n0", info).labels == {}
    assert agent_registration.registration("c", "n0", info, drivers=None, labels={"rack": "r1"}).labels == {"rack": "r1"}


def test_the_drivers_are_probed_once_for_a_fleet_and_only_agents_that_run_work_get_them() -> None:
    calls: list[int] = []

    def offered() -> dict[str, str | None]:
        calls.append(1)
        return {"process": None, "sandbox": "bwrap is not installed"}

    runner = SimpleNamespace(executor=SimpleNamespace(offered_drivers=offered))
    agents = [SimpleNamespace(work=runner, drivers=None), SimpleNamespace(work=runner, drivers=None),
              SimpleNamespace(work=None, drivers=None)]
    asyncio.run(agent_bootstrap.report_drivers(agents))  # type: ignore[arg-type]
    assert len(calls) == 1
    assert [a.drivers for a in agents] == [{"process": None, "sandbox": "bwrap is not installed"}] * 2 + [None]
    asyncio.run(agent_bootstrap.report_drivers([SimpleNamespace(work=None, drivers=None)]))  # type: ignore[list-item]
    assert len(calls) == 1


# --- placement: labels into the core, a selector from the work -----------------------------------------------------
def test_node_labels_reach_the_core_sorted_and_a_node_without_any_has_none() -> None:
    nodes = [{"cluster": "c", "node": "new", "schedulable": True, "labels": {SANDBOX: "true", PROCESS: "true"}},
             {"cluster": "c", "node": "old", "schedulable": True, "labels": {}},
             {"cluster": "c", "node": "older", "schedulable": True}]
    gpus = [{"cluster": "c", "node": "new", "uuid": "G0", "idx": 0, "model": "H100", "memory_mib": 81_920,
             "health": "healthy", "sharing": "exclusive"}]
    snap = build_snapshot(nodes, gpus, [])
    assert [(n.name, n.labels) for n in snap.nodes] == [
        ("new", ((PROCESS, "true"), (SANDBOX, "true"))), ("old", ()), ("older", ())]
    assert [g.uuid for g in snap.nodes[0].gpus] == ["G0"]


def test_the_selector_follows_the_work_isolation_and_a_job_without_work_has_none() -> None:
    assert isolation_selector(None) == ()
    assert isolation_selector("process") == ((PROCESS, "true"),)
    assert isolation_selector("container") == ((ISOLATION_LABEL_PREFIX + "container", "true"),)
    reqs = build_requests([wanted("bare"), wanted("cmd", isolation="process"), wanted("box", isolation="sandbox"),
                           wanted("svc", isolation="sandbox", replicas=2, kind="inference"),
                           wanted("gang", isolation="sandbox", gpus=4, gang_nodes=2, gpus_per_node=2)], {})
    assert {r.job_id: r.node_selector for r in reqs} == {
        "bare": (), "cmd": ((PROCESS, "true"),), "box": ((SANDBOX, "true"),), "svc#0": ((SANDBOX, "true"),),
        "svc#1": ((SANDBOX, "true"),), "gang": ((SANDBOX, "true"),)}
    # rows read before the column existed (no "isolation" key) are jobs without work
    [legacy] = build_requests([{k: v for k, v in wanted("legacy").items() if k != "isolation"}], {})
    assert legacy.node_selector == ()


def test_a_sandbox_job_lands_only_on_the_node_that_offers_sandbox() -> None:
    _, plan = plan_for([node("a-plain", "process"), node("b-box", "process", "sandbox")],
                       [wanted("box", isolation="sandbox", gpus=2), wanted("cmd", isolation="process", gpus=2)])
    assert {p.job_id: p.node for p in plan.placements} == {"box": "b-box", "cmd": "a-plain"}


def test_nodes_without_labels_take_jobs_without_work_but_never_a_command() -> None:
    rows = [wanted("bare"), wanted("cmd", isolation="process")]
    requests, plan = plan_for([node("legacy")], rows)
    assert [p.job_id for p in plan.placements] == ["bare"]
    shown = pending_reasons(plan.pending, requests)
    assert list(shown) == ["cmd"]
    assert shown["cmd"][0] == NO_NODE_OFFERS_ISOLATION and "'process'" in shown["cmd"][1]


def test_a_job_whose_driver_no_node_offers_says_so_in_its_reason() -> None:
    requests, plan = plan_for([node("plain", "process")], [wanted("box", isolation="sandbox")])
    assert plan.placements == ()
    [core] = plan.pending
    assert core.reason == NO_NODE_MATCHES_SELECTOR and f"{SANDBOX}=true" in core.message
    shown = pending_reasons(plan.pending, requests)
    assert shown["box"][0] == NO_NODE_OFFERS_ISOLATION
    assert "'sandbox'" in shown["box"][1] and f"{SANDBOX}=true" in shown["box"][1]


def test_replicas_share_their_reason_and_other_reasons_pass_through_unchanged() -> None:
    rows = [wanted("svc", isolation="sandbox", replicas=2, kind="inference"), wanted("big", gpus=64)]
    requests, plan = plan_for([node("plain", "process")], rows)
    shown = pending_reasons(plan.pending, requests)
    assert shown["svc"][0] == NO_NODE_OFFERS_ISOLATION
    core_big = next(r for r in plan.pending if r.job_id == "big")
    assert shown["big"] == (core_big.reason, core_big.message) and core_big.reason == "Unschedulable"


def test_a_selector_some_user_set_keeps_the_core_reason() -> None:
    job = JobRequest(job_id="z", team="t", gpus=1, submitted_at=0.0, node_selector=(("zone", "a"),))
    plan = schedule(Snapshot(nodes=(node("n", "process"),)), [job], Policy(), now=1.0)
    assert pending_reasons(plan.pending, [job])["z"][0] == NO_NODE_MATCHES_SELECTOR


# --- the core's reason ----------------------------------------------------------------------------------------------
def test_a_full_node_that_matches_is_room_missing_not_a_label_missing() -> None:
    running = (Allocation(job_id="r", team="other", node="box", gpu_uuids=("box-g0", "box-g1"), started_at=0.0,
                          preemptible=False),)
    _, plan = plan_for([node("box", "sandbox")], [wanted("box-job", isolation="sandbox")], running)
    assert [r.reason for r in plan.pending] == [NO_FEASIBLE_NODE]


def test_an_unschedulable_node_with_the_label_does_not_count() -> None:
    _, plan = plan_for([node("box", "sandbox", schedulable=False), node("plain", "process")],
                       [wanted("j", isolation="sandbox")])
    assert [r.reason for r in plan.pending] == [NO_NODE_MATCHES_SELECTOR]


def test_no_preemption_is_sought_for_a_job_no_node_matches() -> None:
    # preemptible low-priority work of the same team fills the only node; a sandbox job could not use it anyway
    running = (Allocation(job_id="low", team="research", node="plain", gpu_uuids=("plain-g0", "plain-g1"),
                          started_at=0.0, priority=-100, preemptible=True),)
    _, plan = plan_for([node("plain", "process")], [wanted("hi", isolation="sandbox", priority=1000,
                                                           priority_class="")], running)
    assert plan.preemptions == ()
    assert [r.reason for r in plan.pending] == [NO_NODE_MATCHES_SELECTOR]
    # the same job that needs the process driver does preempt
    _, plan = plan_for([node("plain", "process")], [wanted("hi", isolation="process", priority=1000,
                                                           priority_class="")], running)
    assert [v.job_id for v in plan.preemptions] == ["low"]
