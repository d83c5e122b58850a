"""A job's host CPU/memory, node selector and preemptible override go from placement's rows into the core's
JobRequest, nodes bring their CPUs and memory, running allocations keep what they reserved and their own word on
preemption; and the core then honours all of it."""

from __future__ import annotations

from datetime import UTC, datetime

from libs.core import DEFAULT_PRIORITY_CLASSES, Policy, schedule
from libs.core.reasons import NO_NODE_MATCHES_SELECTOR, UNSCHEDULABLE
from services.placement.domain import (
    ISOLATION_LABEL_PREFIX,
    NO_NODE_OFFERS_ISOLATION,
    build_requests,
    build_snapshot,
    node_selector,
    pending_reasons,
)

T0 = datetime(2026, 11, 30, tzinfo=UTC)
PROCESS = ISOLATION_LABEL_PREFIX + "process"


def wanted(job_id: str, **over):  # type: ignore[no-untyped-def]
    base = {"job_id": job_id, "team": "research", "project": "default", "gpus": 1, "gpu_models": [], "priority": 0,
            "priority_class": "normal", "kind": "batch", "submitted_at": T0, "gang_nodes": 0, "gpus_per_node": 0,
            "replicas": 1, "max_runtime_s": None, "gpu_fraction_milli": 0, "gpu_memory_mib": 0, "mig_profile": "",
            "exclusive": False, "isolation": None, "cpu_milli": 0, "memory_mib": 0, "node_selector": {},
            "preemptible": None}
    return {**base, **over}


def node_row(name: str, cpu_milli: int = 8000, memory_mib: int = 65_536, **labels: str):  # type: ignore[no-untyped-def]
    return {"cluster": "c", "node": name, "schedulable": True, "labels": {PROCESS: "true", **labels},
            "cpu_milli": cpu_milli, "memory_mib": memory_mib}


def gpu_rows(name: str, n: int = 4) -> list[dict]:
    return [{"cluster": "c", "node": name, "uuid": f"{name}-g{i}", "idx": i, "model": "H100", "memory_mib": 81_920,
             "health": "healthy", "sharing": "exclusive"} for i in range(n)]


def running_row(job_id: str, node: str, gpu: str, **over):  # type: ignore[no-untyped-def]
    base = {"job_id": job_id, "replica": 0, "replicas": 1, "team": "research", "project": "default", "node": node,
            "granted_at": T0, "priority": 100, "priority_class": "normal", "kind": "batch", "preempt_deadline": None,
            "max_runtime_s": None, "gpu_uuids": [gpu], "gpu_model": "H100", "share_milli": 1000,
            "gpu_memory_mib": None, "mig_profiles": [None], "mig_starts": [None], "cpu_milli": 0, "memory_mib": 0,
            "preemptible": None}
    return {**base, **over}


def test_host_requests_selector_and_preemptible_reach_every_unit() -> None:
    rows = [wanted("one", cpu_milli=4000, memory_mib=2048, node_selector={"zone": "a"}, preemptible=False),
            wanted("gang", gpus=8, gang_nodes=2, gpus_per_node=4, cpu_milli=1000, preemptible=True),
            wanted("svc", replicas=2, kind="inference", memory_mib=512, node_selector={"zone": "b"})]
    reqs = {r.job_id: r for r in build_requests(rows, {})}
    one = reqs["one"]
    assert (one.cpu_milli, one.memory_mib, one.node_selector, one.preemptible) == (4000, 2048, (("zone", "a"),), False)
    assert (reqs["gang"].cpu_milli, reqs["gang"].preemptible) == (1000, True)  # per node, each member
    assert [(reqs[u].memory_mib, reqs[u].node_selector, reqs[u].preemptible) for u in ("svc#0", "svc#1")] == [
        (512, (("zone", "b"),), None)] * 2
    # rows read before the columns existed ask for nothing
    legacy = {k: v for k, v in wanted("old").items() if k not in ("cpu_milli", "memory_mib", "node_selector",
                                                                  "preemptible")}
    [old] = build_requests([legacy], {})
    assert (old.cpu_milli, old.memory_mib, old.node_selector, old.preemptible) == (0, 0, (), None)


def test_the_users_selector_is_merged_with_the_isolation_one_which_wins_a_clash() -> None:
    assert node_selector({"zone": "a"}, None) == (("zone", "a"),)
    assert node_selector({"zone": "a"}, "process") == ((PROCESS, "true"), ("zone", "a"))
    assert node_selector({PROCESS: "false", "b": ""}, "process") == (("b", ""), (PROCESS, "true"))
    assert node_selector(None, None) == ()
    [req] = build_requests([wanted("w", isolation="process", node_selector={"zone": "a"})], {})
    assert req.node_selector == ((PROCESS, "true"), ("zone", "a"))


def test_nodes_bring_cpu_and_memory_and_allocations_keep_theirs_and_their_own_word_on_preemption() -> None:
    snap = build_snapshot([node_row("a", 64_000, 262_144), {"cluster": "c", "node": "old", "schedulable": True}],
                          gpu_rows("a") + gpu_rows("old"),
                          [running_row("pinned", "a", "a-g0", cpu_milli=8000, memory_mib=1024, preemptible=False),
                           running_row("going", "a", "a-g1", preemptible=True, preempt_deadline=T0),
                           running_row("legacy", "a", "a-g2")])
    assert [(n.name, n.cpu_milli, n.memory_mib) for n in snap.nodes] == [("a", 64_000, 262_144), ("old", 0, 0)]
    held = {a.job_id: (a.cpu_milli, a.memory_mib, a.preemptible) for a in snap.running}
    assert held == {"pinned": (8000, 1024, False), "going": (0, 0, False), "legacy": (0, 0, None)}


def plan(nodes: list[dict], rows: list[dict], running: list[dict] = ()):  # type: ignore[no-untyped-def]
    gpus = [g for n in nodes for g in gpu_rows(n["node"])]
    snap = build_snapshot(nodes, gpus, list(running))
    requests = build_requests(rows, {})
    return snap, requests, schedule(snap, requests, Policy(priority_classes=DEFAULT_PRIORITY_CLASSES),
                                    now=T0.timestamp() + 3600)


def test_cpu_taken_on_one_node_sends_the_job_to_another_and_too_much_cpu_is_unschedulable() -> None:
    nodes = [node_row("a", 8000), node_row("b", 8000)]
    running = [running_row("hog", "a", "a-g0", cpu_milli=6000)]
    _, _, p = plan(nodes, [wanted("cpu", cpu_milli=4000)], running)
    assert [(x.job_id, x.node, x.cpu_milli) for x in p.placements] == [("cpu", "b", 4000)]
    _, _, p = plan(nodes, [wanted("huge", cpu_milli=9000)])
    assert p.placements == () and p.pending[0].reason == UNSCHEDULABLE


def test_a_selector_places_only_on_the_labelled_node_and_one_matching_nothing_keeps_the_core_reason() -> None:
    nodes = [node_row("a"), node_row("b", zone="west")]
    snap, requests, p = plan(nodes, [wanted("w", isolation="process", node_selector={"zone": "west"}),
                                     wanted("x", isolation="process", node_selector={"zone": "mars"})])
    assert [(x.job_id, x.node) for x in p.placements] == [("w", "b")]
    shown = pending_reasons(p.pending, requests, snap.nodes)
    assert shown["x"][0] == NO_NODE_MATCHES_SELECTOR and "zone=mars" in shown["x"][1]
    # the driver itself offered nowhere: that is what it says
    snap, requests, p = plan([node_row("a")], [wanted("s", isolation="sandbox", node_selector={"zone": "a"})])
    assert pending_reasons(p.pending, requests, snap.nodes)["s"][0] == NO_NODE_OFFERS_ISOLATION


def test_a_job_submitted_not_preemptible_is_never_a_victim_and_one_submitted_preemptible_is() -> None:
    nodes = [node_row("a")]
    # `normal` is preemptible; this job said no: the production job waits
    running = [running_row(f"r{i}", "a", f"a-g{i}", preemptible=False) for i in range(4)]
    _, _, p = plan(nodes, [wanted("prod", gpus=4, priority=1000, priority_class="production-inference",
                                  kind="inference")], running)
    assert p.preemptions == () and p.placements == ()
    _, _, p = plan(nodes, [wanted("prod", gpus=4, priority=1000, priority_class="production-inference",
                                  kind="inference")], [{**r, "preemptible": None} for r in running])
    assert len(p.preemptions) == 4  # without its own word, `normal` would have let them go
    # `high` is not preemptible; this job said yes: the production job takes its GPUs
    running = [running_row(f"r{i}", "a", f"a-g{i}", priority=100, priority_class="high", preemptible=True)
               for i in range(4)]
    _, _, p = plan(nodes, [wanted("prod", gpus=4, priority=1000, priority_class="production-inference",
                                  kind="inference")], running)
    assert sorted(v.job_id for v in p.preemptions) == ["r0", "r1", "r2", "r3"]
    # and without their own word, `high` protects them
    running = [{**r, "preemptible": None} for r in running]
    _, _, p = plan(nodes, [wanted("prod", gpus=4, priority=1000, priority_class="production-inference",
                                  kind="inference")], running)
    assert p.preemptions == ()
