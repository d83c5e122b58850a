"""GET /v1/pool through real processes: inventory's view (health, use from the simulated agent's telemetry, node
facts) combined by the gateway with placement's live allocations, on `gpupool up`'s 4 × 8-GPU simulated fleet."""

from __future__ import annotations

from typing import Any

import httpx
import pytest
from support import eventually

pytestmark = pytest.mark.e2e

FLEET = {"H100-80GB": 8, "A100-80GB": 8, "H200-141GB": 8, "L40S": 8}
COUNTS = ("total", "healthy", "unhealthy", "on_lost_nodes", "in_use", "allocated", "allocated_idle", "free")


def get_pool(api: httpx.Client) -> dict[str, Any]:
    response = api.get("/v1/pool")
    assert response.status_code == 200, response.text
    return response.json()


def by_model(pool: dict[str, Any]) -> dict[str, dict[str, int]]:
    return {m["model"]: m for m in pool["all"]["models"]}



def assert_consistent(pool: dict[str, Any]) -> None:
    """The identities every answer must satisfy, per model row, per cluster and over clusters."""
    for row in [*pool["all"]["models"], *(m for c in pool["clusters"] for m in c["models"])]:
        assert row["healthy"] + row["unhealthy"] == row["total"], row
        assert 0 <= row["allocated_idle"] <= row["allocated"] <= row["total"], row
        assert 0 <= row["in_use"] <= row["total"], row
        # the fleet has no faults: nothing allocated is unhealthy, so free is exactly what is left
        assert row["free"] == row["total"] - row["allocated"] - row["unhealthy"], row
    for key in COUNTS:
        assert pool["all"]["totals"][key] == sum(c["totals"][key] for c in pool["clusters"]), key
        for c in pool["clusters"]:
            assert c["totals"][key] == sum(m[key] for m in c["models"]), (c["cluster"], key)


def test_pool_needs_a_token(platform) -> None:
    response = httpx.get(f"{platform.gateway}/v1/pool", timeout=10)
    assert response.status_code == 401
    assert response.headers["content-type"].startswith("application/problem+json")


def test_pool_counts_the_fleet_and_tracks_an_allocation_from_grant_to_release(platform) -> None:
    with platform.client() as api:
        before = get_pool(api)
        assert before["in_use_util_pct"] == 5.0 and before["fresh_within_s"] > 0
        assert {m: r["total"] for m, r in by_model(before).items()} == FLEET
        assert before["all"]["totals"]["total"] == 32
        assert before["all"]["totals"]["unhealthy"] == 0 and before["all"]["totals"]["on_lost_nodes"] == 0
        (local,) = before["clusters"]
        assert local["cluster"] == "local" and len(local["nodes"]) == 4
        for node in local["nodes"]:
            assert node["state"] == "ready" and node["gpus"] == 8
            assert node["cpu_count"] > 0 and node["memory_mib"] > 0 and node["last_seen_at"]
        assert_consistent(before)
        base = by_model(before)["L40S"]

        response = api.post("/v1/jobs", json={"name": "pool-e2e", "team": "research", "gpus": 3,
                                              "gpu_models": ["L40S"], "kind": "training"})
        assert response.status_code == 201, response.text
        job_id = response.json()["job_id"]
        eventually(lambda: api.get("/v1/allocations", params={"job_id": job_id, "active": True}).json()["items"],
                   "the job's allocation")

        # right after the grant the GPUs count as allocated (busy or not yet: the agent's telemetry decides)
        granted = get_pool(api)
        l40s = by_model(granted)["L40S"]
        assert l40s["allocated"] == base["allocated"] + 3
        assert l40s["free"] == base["free"] - 3 == l40s["total"] - l40s["allocated"] - l40s["unhealthy"]
        assert by_model(granted)["H100-80GB"]["allocated"] == by_model(before)["H100-80GB"]["allocated"]
        assert_consistent(granted)

        # the simulated agent runs a training workload on allocated GPUs: they become in use, not idle
        def busy() -> dict[str, Any] | None:
            pool = get_pool(api)
            row = by_model(pool)["L40S"]
            return pool if row["allocated_idle"] == 0 and row["in_use"] >= 3 else None

        busy_pool = eventually(busy, "the allocated GPUs to show as in use")
        assert_consistent(busy_pool)

        assert api.post(f"/v1/jobs/{job_id}/complete").status_code == 200
        def released_pool() -> dict[str, Any] | None:
            pool = get_pool(api)
            return pool if by_model(pool)["L40S"]["allocated"] == base["allocated"] else None

        released = eventually(released_pool, "the release to show")
        assert by_model(released)["L40S"]["free"] == base["free"]
        assert_consistent(released)


NODE_TOTALS = ("nodes", "cpu_count", "memory_mib", "network_link_gbps", "storage_total_gib")


def test_every_node_shows_its_network_and_storage_and_clusters_add_them_up(platform) -> None:
    """The simulated agent registers NICs and volumes and reports node throughput and storage used in its
    samples; the pool's per-node entries, /v1/nodes and the node totals carry them."""
    with platform.client() as api:
        def reported() -> dict[str, Any] | None:
            pool = get_pool(api)
            nodes = [n for c in pool["clusters"] for n in c["nodes"]]
            numbers = [v for n in nodes for v in (n["cpu_util_pct"], n["memory_used_mib"], n["network"]["rx_mbps"],
                                                  n["network"]["tx_mbps"], n["storage"]["used_gib"])]
            return pool if nodes and None not in numbers else None

        pool = eventually(reported, "every node's node-level telemetry")
        (local,) = pool["clusters"]
        assert len(local["nodes"]) == 4
        for node in local["nodes"]:
            net, storage = node["network"], node["storage"]
            assert net["interfaces"] and all(nic["name"] and nic["kind"] in ("ethernet", "infiniband", "other")
                                             for nic in net["interfaces"]), node
            assert net["link_gbps"] == round(sum(nic["speed_mbps"] or 0 for nic in net["interfaces"]) / 1000, 3) > 0
            assert net["rx_mbps"] >= 0 and net["tx_mbps"] >= 0
            assert storage["volumes"] and all(v["mount"] and v["total_gib"] > 0 for v in storage["volumes"]), node
            assert storage["total_gib"] == pytest.approx(sum(v["total_gib"] for v in storage["volumes"]), abs=0.01)
            assert 0 < storage["used_gib"] <= storage["total_gib"]
            assert 0 <= node["cpu_util_pct"] <= 100 and 0 < node["memory_used_mib"] <= node["memory_mib"]
        totals = local["node_totals"]
        assert totals["nodes"] == 4 and totals == pool["all"]["node_totals"]
        for key in ("cpu_count", "memory_mib"):
            assert totals[key] == sum(n[key] for n in local["nodes"]) > 0, key
        assert totals["network_link_gbps"] == pytest.approx(sum(n["network"]["link_gbps"] for n in local["nodes"]))
        assert totals["storage_total_gib"] == pytest.approx(sum(n["storage"]["total_gib"] for n in local["nodes"]))
        # inventory's totals, and the host CPU and memory live allocations reserve (from placement)
        assert set(totals) == set(NODE_TOTALS) | {"cpu_allocated_milli", "memory_allocated_mib"}
        for key in ("cpu_allocated_milli", "memory_allocated_mib"):
            assert totals[key] == sum(n[key] for n in local["nodes"]), key

        # /v1/nodes shows the same registered facts for each node
        listed = {n["node"]: n for n in api.get("/v1/nodes").json()["items"]}
        for node in local["nodes"]:
            assert listed[node["node"]]["network"]["interfaces"] == node["network"]["interfaces"]
            assert listed[node["node"]]["storage"]["volumes"] == node["storage"]["volumes"]
        # each simulated node registers its own loopback address: where a gang's peers would reach it
        addresses = {name: n["address"] for name, n in listed.items()}
        assert addresses == {f"sim-node-{i}": f"127.0.0.{2 + i}" for i in range(4)}, addresses
