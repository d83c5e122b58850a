"""What a job asks of its nodes besides GPUs, end to end: host CPU and memory counted against what each node has
(a job goes where CPU is free, and waits while CPU, not GPUs, is exhausted), a node selector matched against the
labels nodes register, and a job's own word on preemption over its priority class's; explain says why one waits as
facts too (the nodes short of CPU, too small, or without the labels)."""

from __future__ import annotations

import asyncio

import pytest
from support import AllocationWatcher, complete, eventually, finish_all, node_of, submit

from libs.contracts.events import AllocationGranted, AllocationPreempting, AllocationReleased

pytestmark = pytest.mark.e2e
FLEET_NODES = 2
# sim-node-0 is labelled zone=east, sim-node-1 zone=west (and both tier=gpu): the simulated fleet's labels
UP_ARGS = ["--fleet", "H100-80GB*8@zone=east;H100-80GB*8@zone=west", "--env", "agent:LABELS=tier=gpu",
           "--env", "placement:PREEMPTION_GRACE_S=1", "--env", "placement:MIN_RUNTIME_S=0"]


def explain(api, job_id: str) -> dict:  # type: ignore[no-untyped-def]
    return api.get(f"/v1/jobs/{job_id}/explain").json()["placement"]


def waits_with(api, job_id: str, reason: str) -> dict:  # type: ignore[no-untyped-def]
    return eventually(lambda: (e := explain(api, job_id)).get("reason") == reason and e,
                      f"job {job_id} pending with reason {reason}")


def pool_nodes(api) -> dict[str, dict]:  # type: ignore[no-untyped-def]
    [cluster] = api.get("/v1/pool").json()["clusters"]
    return {n["node"]: n for n in cluster["nodes"]}


def test_cpu_requests_are_counted_against_each_nodes_cpus(platform) -> None:  # type: ignore[no-untyped-def]
    with platform.client() as api:
        finish_all(api)
        cores = {name: n["cpu_count"] for name, n in pool_nodes(api).items()}
        assert len(cores) == 2 and min(cores.values()) > 0
        big = min(cores.values()) * 900  # 90 % of a node's CPUs, in milli-cores

        first = submit(api, "cpu-a", "research", 1, cpu_milli=big, memory_mib=4096)
        first_node = node_of(api, first)
        # training packs onto the node it already uses: only its CPUs being taken sends this one elsewhere
        second = submit(api, "cpu-b", "research", 1, cpu_milli=big)
        second_node = node_of(api, second)
        assert second_node != first_node
        shown = api.get(f"/v1/jobs/{first}").json()
        assert (shown["cpu_milli"], shown["memory_mib"], shown["node_selector"], shown["preemptible"]) == (
            big, 4096, {}, None)

        # 14 GPUs are free, but no node has half its CPUs left: the job waits, and runs once CPU frees
        third = submit(api, "cpu-c", "research", 1, cpu_milli=min(cores.values()) * 500)
        pending = waits_with(api, third, "NoFeasibleNode")
        assert pending["state"] == "pending"
        # explain's facts say it as data: both nodes evaluated, both short of CPU, CPU the exhausted dimension
        facts = pending["facts"]
        assert (facts["nodes_evaluated"], facts["short"], facts["exhausted"]) == (2, {"cpu": 2}, "cpu"), facts
        nodes = pool_nodes(api)
        assert nodes[first_node]["cpu_allocated_milli"] == big and nodes[first_node]["memory_allocated_mib"] == 4096
        assert nodes[second_node]["cpu_allocated_milli"] == big
        one = api.get(f"/v1/nodes/{first_node}").json()
        assert (one["cpu_allocated_milli"], one["memory_allocated_mib"]) == (big, 4096) and one["gpus"]
        listed = {n["node"]: n for n in api.get("/v1/nodes").json()["items"]}  # the node list says the same
        assert (listed[first_node]["cpu_allocated_milli"], listed[first_node]["memory_allocated_mib"]) == (big, 4096)
        assert listed[second_node]["cpu_allocated_milli"] == big
        totals = api.get("/v1/pool").json()["all"]["node_totals"]
        assert totals["cpu_allocated_milli"] == 2 * big and totals["memory_allocated_mib"] == 4096
        assert totals["cpu_count"] == sum(cores.values())

        complete(api, first)
        assert node_of(api, third) == first_node
        eventually(lambda: pool_nodes(api)[first_node]["cpu_allocated_milli"] == min(cores.values()) * 500,
                   "the pool to count the third job's CPU instead of the first's")

        # more CPU than any node has: it can never run here, and says so
        huge = submit(api, "cpu-huge", "research", 1, cpu_milli=(max(cores.values()) + 1) * 1000)
        never = waits_with(api, huge, "Unschedulable")
        assert "even empty" in never["message"]
        assert (never["facts"]["cause"], never["facts"]["filtered"]) == ("never_node", {"host_size": 2}), never
        finish_all(api)


def test_a_node_selector_places_only_on_matching_nodes_and_one_matching_none_says_so(platform) -> None:  # type: ignore[no-untyped-def]
    with platform.client() as api:
        finish_all(api)
        west = [submit(api, f"west-{i}", "research", 1, node_selector={"zone": "west", "tier": "gpu"})
                for i in range(3)]
        east = submit(api, "east", "research", 1, node_selector={"zone": "east"})
        assert {node_of(api, j) for j in west} == {"sim-node-1"}
        assert node_of(api, east) == "sim-node-0"
        assert api.get(f"/v1/jobs/{east}").json()["node_selector"] == {"zone": "east"}

        nowhere = submit(api, "mars", "research", 1, node_selector={"zone": "mars"})
        why = waits_with(api, nowhere, "NoNodeMatchesSelector")
        assert "zone=mars" in why["message"]
        assert why["facts"]["labels"]["zone"] == "mars" and why["facts"]["filtered"] == {"node_selector": 2}, why
        finish_all(api)


async def test_a_jobs_own_preemptible_wins_over_its_priority_class(platform) -> None:  # type: ignore[no-untyped-def]
    async with AllocationWatcher(platform.nats_url) as watcher:
        with platform.client() as api:
            finish_all(api)
            # `normal` is preemptible; these jobs said no: production inference waits instead of preempting them
            kept = [submit(api, f"keep-{i}", "research", 8, preemptible=False) for i in range(2)]
            for job_id in kept:
                await watcher.wait_for(AllocationGranted, job_id)
            serving = submit(api, "serve", "research", 8, priority_class="production-inference", kind="inference")
            await asyncio.sleep(3.0)
            assert [d for _, _, d in watcher.events if isinstance(d, AllocationPreempting)] == []
            assert explain(api, serving)["state"] == "pending"
            assert all(api.get(f"/v1/jobs/{j}").json()["state"] == "running" for j in kept)
            finish_all(api)

            # `high` is not preemptible; these jobs said yes: production inference takes one's GPUs
            given = [submit(api, f"give-{i}", "research", 8, priority_class="high", preemptible=True)
                     for i in range(2)]
            for job_id in given:
                await watcher.wait_for(AllocationGranted, job_id)
            serving = submit(api, "serve-2", "research", 8, priority_class="production-inference", kind="inference")
            _, _, signal = await watcher.wait_for_any(AllocationPreempting, given)
            assert signal.reason == "PreemptedByPriority" and signal.preemptor_job_id == serving
            await watcher.wait_for(AllocationReleased, signal.job_id)
            await watcher.wait_for(AllocationGranted, serving)
            finish_all(api)
