"""The gateway's join of inventory's pool view with placement's live allocations (pure)."""

from __future__ import annotations

from services.gateway.pool import combine_pool, host_reserved, with_host_reserved


def model(name: str, total: int, *, in_use: list[str] = (), unhealthy: list[str] = (), lost: int = 0) -> dict:
    return {"model": name, "total": total, "healthy": total - len(unhealthy), "unhealthy": len(unhealthy),
            "on_lost_nodes": lost, "in_use": len(in_use), "in_use_gpus": list(in_use),
            "unhealthy_gpus": list(unhealthy)}


def cluster(name: str, *models: dict) -> dict:
    return {"cluster": name, "models": list(models), "nodes": [{"node": f"{name}-n0", "cpu_count": 8}]}


INVENTORY = {
    "clusters": [
        cluster("east", model("H100-80GB", 4, in_use=["h1", "h9"], unhealthy=["h4"]), model("L4", 2)),
        cluster("west", model("H100-80GB", 2, in_use=["w1"])),
    ],
    "in_use_util_pct": 5.0,
    "fresh_within_s": 15.0,
}


def alloc(cluster: str, *gpus: tuple[str, str], released: bool = False) -> dict:
    return {"cluster": cluster, "released_at": "2025-01-01T00:00:00+00:00" if released else None,
            "gpus": [{"uuid": u, "model": m, "index": i} for i, (u, m) in enumerate(gpus)]}


ALLOCATIONS = [
    alloc("east", ("h1", "H100-80GB"), ("h2", "H100-80GB")),  # h1 busy, h2 allocated but idle
    alloc("east", ("h4", "H100-80GB")),  # allocated and then went unhealthy
    alloc("west", ("w1", "H100-80GB")),
    alloc("east", ("l1", "L4"), released=True),  # released: not counted
]


def test_allocated_idle_and_free_come_from_joining_allocations_with_use_and_health() -> None:
    pool = combine_pool(INVENTORY, ALLOCATIONS)
    east, west = pool["clusters"]
    h100 = east["models"][0]
    assert h100 == {"model": "H100-80GB", "total": 4, "healthy": 3, "unhealthy": 1, "on_lost_nodes": 0,
                    "in_use": 2, "allocated": 3, "allocated_idle": 2, "free": 1, "cordoned": 0, "suspect": 0,
                    "quarantined": 0, "probation": 0}
    assert east["models"][1]["allocated"] == 0 and east["models"][1]["free"] == 2
    assert {k: west["models"][0][k] for k in ("allocated", "allocated_idle", "free")} == {
        "allocated": 1, "allocated_idle": 0, "free": 1}
    assert east["totals"]["free"] == 3
    assert east["nodes"] == [{**n, "cpu_allocated_milli": 0, "memory_allocated_mib": 0}
                             for n in INVENTORY["clusters"][0]["nodes"]]
    assert "in_use_gpus" not in h100  # uuid lists are inventory's working data, not the API's
    everything = {m["model"]: m for m in pool["all"]["models"]}
    assert everything["H100-80GB"]["total"] == 6 and everything["H100-80GB"]["allocated"] == 4
    assert everything["H100-80GB"]["allocated_idle"] == 2 and everything["H100-80GB"]["free"] == 2
    assert pool["all"]["totals"]["total"] == 8 and pool["all"]["totals"]["free"] == 4


def test_a_cluster_filter_ignores_allocations_elsewhere() -> None:
    only_west = {**INVENTORY, "clusters": [INVENTORY["clusters"][1]]}
    pool = combine_pool(only_west, ALLOCATIONS, cluster="west")
    assert [c["cluster"] for c in pool["clusters"]] == ["west"]
    assert pool["all"]["totals"]["allocated"] == 1 and pool["all"]["totals"]["total"] == 2


def test_health_state_and_cordon_counts_from_inventory_are_passed_through_and_summed() -> None:
    east = model("H100-80GB", 4, unhealthy=["h3", "h4"])
    east.update(quarantined=1, suspect=1, cordoned=0, probation=0)
    west = model("H100-80GB", 2, unhealthy=["w1", "w2"])
    west.update(cordoned=2, quarantined=0, suspect=0, probation=1)
    pool = combine_pool({**INVENTORY, "clusters": [cluster("east", east), cluster("west", west)]}, [])
    assert {k: pool["clusters"][0]["models"][0][k] for k in ("quarantined", "suspect", "free")} == {
        "quarantined": 1, "suspect": 1, "free": 2}
    assert {k: pool["all"]["totals"][k] for k in ("cordoned", "suspect", "quarantined", "probation", "free")} == {
        "cordoned": 2, "suspect": 1, "quarantined": 1, "probation": 1, "free": 2}


def test_node_totals_pass_through_per_cluster_and_sum_over_clusters() -> None:
    east = {**INVENTORY["clusters"][0], "node_totals": {"nodes": 2, "cpu_count": 64, "memory_mib": 1024,
                                                        "network_link_gbps": 3200.1, "storage_total_gib": 10.5}}
    west = {**INVENTORY["clusters"][1], "node_totals": {"nodes": 1, "cpu_count": 8, "memory_mib": 512,
                                                        "network_link_gbps": 0.2, "storage_total_gib": 0.0}}
    pool = combine_pool({**INVENTORY, "clusters": [east, west]}, [])
    assert pool["clusters"][0]["node_totals"] == {**east["node_totals"], "cpu_allocated_milli": 0,
                                                  "memory_allocated_mib": 0}
    assert pool["all"]["node_totals"] == {"nodes": 3, "cpu_count": 72, "memory_mib": 1536,
                                          "network_link_gbps": 3200.3, "storage_total_gib": 10.5,
                                          "cpu_allocated_milli": 0, "memory_allocated_mib": 0}


def test_host_cpu_and_memory_reserved_by_live_allocations_are_shown_per_node_and_summed() -> None:
    inventory = {**INVENTORY, "clusters": [
        {**cluster("east", model("H100-80GB", 4)), "nodes": [{"node": "a", "cpu_count": 8, "memory_mib": 4096},
                                                             {"node": "b", "cpu_count": 8, "memory_mib": 4096}],
         "node_totals": {"nodes": 2, "cpu_count": 16, "memory_mib": 8192}},
        {**cluster("west", model("H100-80GB", 2)), "node_totals": {"nodes": 1, "cpu_count": 8, "memory_mib": 0}}]}
    allocations = [{**alloc("east", ("h1", "H100-80GB")), "node": "a", "cpu_milli": 4000, "memory_mib": 1024},
                   {**alloc("east", ("h2", "H100-80GB")), "node": "a", "cpu_milli": 1500, "memory_mib": 0},
                   {**alloc("east", ("h3", "H100-80GB"), released=True), "node": "b", "cpu_milli": 8000},
                   {**alloc("west", ("w1", "H100-80GB")), "node": "west-n0"}]  # an older placement's: no fields
    pool = combine_pool(inventory, allocations)
    east, west = pool["clusters"]
    assert [(n["node"], n["cpu_allocated_milli"], n["memory_allocated_mib"]) for n in east["nodes"]] == [
        ("a", 5500, 1024), ("b", 0, 0)]
    assert east["node_totals"] == {"nodes": 2, "cpu_count": 16, "memory_mib": 8192, "cpu_allocated_milli": 5500,
                                   "memory_allocated_mib": 1024}
    assert west["nodes"][0]["cpu_allocated_milli"] == 0
    assert pool["all"]["node_totals"]["cpu_allocated_milli"] == 5500
    assert host_reserved(allocations, "east", "a") == {"cpu_allocated_milli": 5500, "memory_allocated_mib": 1024}
    assert host_reserved(allocations, "east", "b") == {"cpu_allocated_milli": 0, "memory_allocated_mib": 0}
    listed = with_host_reserved([{"cluster": "east", "node": "a", "gpus": []}, {"cluster": "west", "node": "a"}],
                                allocations)  # the node list: same name in another cluster reserves nothing here
    assert [(n["cpu_allocated_milli"], n["memory_allocated_mib"]) for n in listed] == [(5500, 1024), (0, 0)]
    assert listed[0]["gpus"] == []
