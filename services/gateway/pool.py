"""`GET /v1/pool`: inventory's pool view (health, use from telemetry, node facts) joined with placement's live
allocations. Neither service knows both halves; the gateway only combines their answers and keeps no copy."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

COUNTS = ("total", "healthy", "unhealthy", "on_lost_nodes", "in_use", "allocated", "allocated_idle", "free")
# GPUs per health state and on cordoned nodes, as inventory counts them (passed through and summed)
STATE_COUNTS = ("cordoned", "suspect", "quarantined", "probation")


def combine_pool(inventory: Mapping[str, Any], allocations: Iterable[Mapping[str, Any]],
                 cluster: str | None = None) -> dict[str, Any]:
    """Add to each (cluster, model) row: `allocated` (held by a live allocation), `allocated_idle` (allocated and
    not in use) and `free` (healthy and not allocated); sum them per cluster and over clusters (`all`). Each node,
    and the node totals, get the host CPU (milli-cores) and memory (MiB) live allocations reserve there
    (`cpu_allocated_milli`, `memory_allocated_mib`), beside its `cpu_count` and `memory_mib`."""
    allocations = list(allocations)
    held: dict[tuple[str, str], set[str]] = {}
    host = _reserved_by_node(allocations)
    for alloc in allocations:
        if alloc.get("released_at") is not None or (cluster is not None and alloc["cluster"] != cluster):
            continue
        for gpu in alloc["gpus"]:
            held.setdefault((alloc["cluster"], gpu["model"]), set()).add(gpu["uuid"])

    clusters, overall = [], {}
    for entry in inventory["clusters"]:
        models = []
        for m in entry["models"]:
            allocated = held.pop((entry["cluster"], m["model"]), set())
            in_use, unhealthy = set(m["in_use_gpus"]), set(m["unhealthy_gpus"])
            row = {key: m[key] for key in ("model", "total", "healthy", "unhealthy", "on_lost_nodes", "in_use")}
            row.update({key: m.get(key, 0) for key in STATE_COUNTS})
            row["allocated"] = len(allocated)
            row["allocated_idle"] = len(allocated - in_use)
            row["free"] = max(0, m["healthy"] - len(allocated - unhealthy))
            models.append(row)
            total = overall.setdefault(m["model"], {"model": m["model"], **dict.fromkeys(COUNTS + STATE_COUNTS, 0)})
            for key in COUNTS + STATE_COUNTS:
                total[key] += row[key]
        nodes = [_with_host(n, host.get((entry["cluster"], n["node"]), (0, 0))) for n in entry["nodes"]]
        clusters.append({"cluster": entry["cluster"], "models": models, "totals": _sum(models), "nodes": nodes,
                         "node_totals": {**entry.get("node_totals", {}), **_host_totals(nodes)}})
    all_models = [overall[k] for k in sorted(overall)]
    return {
        "clusters": clusters,
        "all": {"models": all_models, "totals": _sum(all_models),
                "node_totals": _sum_nodes(c["node_totals"] for c in clusters)},
        "in_use_util_pct": inventory["in_use_util_pct"],
        "fresh_within_s": inventory["fresh_within_s"],
    }


def _reserved_by_node(allocations: Iterable[Mapping[str, Any]]) -> dict[tuple[str, str], tuple[int, int]]:
    """(cluster, node) -> the host CPU (milli-cores) and memory (MiB) the live allocations reserve there."""
    reserved: dict[tuple[str, str], tuple[int, int]] = {}
    for a in allocations:
        if a.get("released_at") is None:
            key = (a["cluster"], a.get("node") or "")
            cpu, mem = reserved.get(key, (0, 0))
            reserved[key] = (cpu + (a.get("cpu_milli") or 0), mem + (a.get("memory_mib") or 0))
    return reserved


def host_reserved(allocations: Iterable[Mapping[str, Any]], cluster: str, node: str) -> dict[str, int]:
    """The host CPU (milli-cores) and memory (MiB) the live allocations among `allocations` reserve on one node."""
    cpu, mem = _reserved_by_node(allocations).get((cluster, node), (0, 0))
    return {"cpu_allocated_milli": cpu, "memory_allocated_mib": mem}


def with_host_reserved(nodes: Iterable[Mapping[str, Any]], allocations: Iterable[Mapping[str, Any]]) -> list[dict]:
    """Each node of `nodes` (cluster, node, ...) with the host CPU and memory the live allocations reserve on it."""
    reserved = _reserved_by_node(allocations)
    return [_with_host(n, reserved.get((n["cluster"], n["node"]), (0, 0))) for n in nodes]


def _with_host(node: Mapping[str, Any], reserved: tuple[int, int]) -> dict[str, Any]:
    return {**node, "cpu_allocated_milli": reserved[0], "memory_allocated_mib": reserved[1]}


def _host_totals(nodes: Iterable[Mapping[str, Any]]) -> dict[str, int]:
    nodes = list(nodes)
    return {"cpu_allocated_milli": sum(n["cpu_allocated_milli"] for n in nodes),
            "memory_allocated_mib": sum(n["memory_allocated_mib"] for n in nodes)}


def _sum(rows: list[dict[str, Any]]) -> dict[str, int]:
    return {key: sum(r[key] for r in rows) for key in COUNTS + STATE_COUNTS}


def _sum_nodes(totals: Iterable[Mapping[str, Any]]) -> dict[str, Any]:
    """Node totals (nodes, CPUs, memory, link Gbit/s, storage GiB) over clusters; floats rounded as inventory does."""
    out: dict[str, Any] = {}
    for t in totals:
        for key, value in t.items():
            out[key] = out.get(key, 0) + value
    return {k: round(v, 3) if isinstance(v, float) else v for k, v in out.items()}


# OpenAPI: one node's host facts as /v1/pool, /v1/nodes and /v1/nodes/{node} show them.
NODE_FACTS_EXAMPLE: dict[str, Any] = {
    "cpu_count": 192, "cpu_util_pct": 42.5, "memory_mib": 2097152, "memory_used_mib": 900000,
    "network": {"interfaces": [{"name": "mlx5_0", "kind": "infiniband", "speed_mbps": 400000},
                               {"name": "eth0", "kind": "ethernet", "speed_mbps": 100000}],
                "link_gbps": 500.0, "rx_mbps": 12500.5, "tx_mbps": 8000.0},
    "storage": {"volumes": [{"mount": "/scratch", "total_gib": 28000.0, "filesystem": "xfs"}],
                "total_gib": 28000.0, "used_gib": 1234.5},
}
NODE_TOTALS_EXAMPLE: dict[str, Any] = {"nodes": 1, "cpu_count": 192, "memory_mib": 2097152,
                                       "network_link_gbps": 500.0, "storage_total_gib": 28000.0,
                                       "cpu_allocated_milli": 64000, "memory_allocated_mib": 524288}
