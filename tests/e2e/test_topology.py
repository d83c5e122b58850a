"""Topology through the whole platform: the simulated agents report each GPU's NUMA node and NVLink peers and each
node's rack (from the fleet spec's `@rack=`), and placement keeps a multi-GPU job on one NUMA node and a gang in
one rack, and says which rack a waiting gang waits for; the work learns its GPUs' NUMA nodes."""

from __future__ import annotations

import pytest
from support import AllocationWatcher, eventually_async, finish_all

from libs.contracts.events import AllocationGranted

pytestmark = pytest.mark.e2e
# sim-node-0..3: four L40S nodes, racks interleaved (index order crosses racks); sim-node-4: an NVSwitch H100
# baseboard over two NUMA nodes (GPUs 0-3, 4-7); sim-node-5: four PCIe L4 cards over two NUMA nodes (0-1, 2-3)
UP_ARGS = ["--fleet", "L40S*4@rack=r1;L40S*4@rack=r2;L40S*4@rack=r1;L40S*4@rack=r2;H100-80GB*8;L4*4"]
FLEET_NODES = 6
RACKS = {"sim-node-0": "r1", "sim-node-1": "r2", "sim-node-2": "r1", "sim-node-3": "r2"}


def post_job(api, **body) -> str:  # type: ignore[no-untyped-def]
    response = api.post("/v1/jobs", json={"team": "research", "kind": "training", **body})
    assert response.status_code == 201, response.text
    return response.json()["job_id"]


async def granted_indices(watcher: AllocationWatcher, job_id: str) -> tuple[str, tuple[int, ...]]:
    _, _, grant = await watcher.wait_for(AllocationGranted, job_id)
    return grant.node, tuple(sorted(g.index for g in grant.gpus))


async def test_a_multi_gpu_job_keeps_to_one_numa_node_when_index_order_would_cross_it(platform) -> None:  # type: ignore[no-untyped-def]
    async with AllocationWatcher(platform.nats_url) as watcher:
        with platform.client() as api:
            finish_all(api)
            nodes = {n["node"]: n for n in api.get("/v1/nodes").json()["items"]}
            assert [g["numa_node"] for g in nodes["sim-node-5"]["gpus"]] == [0, 0, 1, 1]
            assert [g["numa_node"] for g in nodes["sim-node-4"]["gpus"]] == [0, 0, 0, 0, 1, 1, 1, 1]

            # PCIe: GPU 0 busy; index order would give 1,2 (NUMA nodes 0 and 1), the free pair on one is 2,3
            one = post_job(api, name="one", gpus=1, gpu_models=["L4"])
            assert await granted_indices(watcher, one) == ("sim-node-5", (0,))
            pair = post_job(api, name="pair", gpus=2, gpu_models=["L4"])
            assert await granted_indices(watcher, pair) == ("sim-node-5", (2, 3))

            # NVSwitch: every GPU is an NVLink peer, so NUMA decides: 0-2 busy, index order would give 3,4
            three = post_job(api, name="three", gpus=3, gpu_models=["H100-80GB"])
            assert await granted_indices(watcher, three) == ("sim-node-4", (0, 1, 2))
            two = post_job(api, name="two", gpus=2, gpu_models=["H100-80GB"],
                           command=["sh", "-c", "echo numa=$GPUPOOL_NUMA_NODES"])
            assert await granted_indices(watcher, two) == ("sim-node-4", (4, 5))
            # the agent tells the work which NUMA node its GPUs are on (numactl --cpunodebind / --membind)
            await eventually_async(lambda: "numa=1" in api.get(f"/v1/jobs/{two}/logs",
                                                                params={"stream": "stdout"}).text,
                                   "the work printed its NUMA node", timeout=20)
            finish_all(api)


async def test_a_gang_lands_in_one_rack_and_a_waiting_gang_names_its_rack(platform) -> None:  # type: ignore[no-untyped-def]
    async with AllocationWatcher(platform.nats_url) as watcher:
        with platform.client() as api:
            finish_all(api)
            nodes = {n["node"]: n for n in api.get("/v1/nodes").json()["items"]}
            for name, rack in RACKS.items():
                assert nodes[name]["labels"]["topology.gpupool.io/rack"] == rack, nodes[name]["labels"]

            # index order would put the gang on sim-node-0 (r1) and sim-node-1 (r2)
            gang = post_job(api, name="gang", gpus=8, gang_nodes=2, gpus_per_node=4, gpu_models=["L40S"])
            await eventually_async(lambda: len(watcher.of(AllocationGranted, gang)) == 2, "both members granted",
                                   timeout=20)
            members = sorted(d.node for _, _, d in watcher.of(AllocationGranted, gang))
            assert members == ["sim-node-0", "sim-node-2"], members  # rack r1, whole

            # r1 is full; one node of r2 gets a 1-GPU job: a second gang has one node that can take a member
            single = post_job(api, name="single", gpus=1, gpu_models=["L40S"])
            node, _ = await granted_indices(watcher, single)
            assert RACKS[node] == "r2"
            waiting = post_job(api, name="waiting", gpus=8, gang_nodes=2, gpus_per_node=4, gpu_models=["L40S"])

            def explained() -> dict:
                return api.get(f"/v1/jobs/{waiting}/explain").json()["placement"]

            await eventually_async(lambda: explained().get("reason") == "WaitingForGang", "the gang waits",
                                   timeout=20)
            assert "waiting for 2 node(s) in one rack: rack r2 has 1" in explained()["message"], explained()
            finish_all(api)
