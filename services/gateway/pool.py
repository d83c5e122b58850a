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
    not in use) and `free` (healthy and not allocated); sum them per cluster and over clusters (`all`)."""
    held: dict[tuple[str, str], set[str]] = {}
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
        clusters.append({"cluster": entry["cluster"], "models": models, "totals": _sum(models),
                         "nodes": entry["nodes"]})
    all_models = [overall[k] for k in sorted(overall)]
    return {
        "clusters": clusters,
        "all": {"models": all_models, "totals": _sum(all_models)},
        "in_use_util_pct": inventory["in_use_util_pct"],
        "fresh_within_s": inventory["fresh_within_s"],
    }


def _sum(rows: list[dict[str, Any]]) -> dict[str, int]:
    return {key: sum(r[key] for r in rows) for key in COUNTS + STATE_COUNTS}
