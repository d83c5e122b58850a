"""Inventory rules: when a sample means a GPU's health changed, when a node is lost and when it is back."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from datetime import datetime, timedelta
from typing import Any

from libs.contracts.events import GpuTelemetry

READY = "ready"
LOST = "lost"


def health_transition(previous: str, sample: GpuTelemetry) -> str | None:
    """The new health state if the sample changes it, else None. The agent derives health from NVML signals
    (Xid, ECC, thermal); inventory records the change once and tells everyone."""
    return sample.health if sample.health != previous else None


def lost_cutoff(now: datetime, node_lost_after_s: float) -> datetime:
    """A ready node whose last report is older than this is lost."""
    return now - timedelta(seconds=node_lost_after_s)


def node_recovers(state: str, last_seen_before: datetime, sampled_at: datetime, now: datetime,
                  node_lost_after_s: float) -> bool:
    """A lost node is back when it reports something *new* (newer than what it last said before going silent) and
    *fresh* (not a backlog sample that would be lost again at the next sweep). A redelivered old sample is
    neither, so applying telemetry stays idempotent without an inbox."""
    return (state == LOST and sampled_at > last_seen_before
            and sampled_at >= lost_cutoff(now, node_lost_after_s))


# --- the pool view ------------------------------------------------------------------------------------------------
IN_USE_UTIL_PCT = 5.0  # a GPU is "in use" when its latest fresh sample shows more utilisation than this
COUNTS = ("total", "healthy", "unhealthy", "on_lost_nodes", "in_use")


def pool_view(models: Iterable[Mapping[str, Any]], nodes: Iterable[Mapping[str, Any]], *,
              fresh_within_s: float) -> dict[str, Any]:
    """Inventory's answer to the pool query: per cluster, per GPU model counts (with the uuids in use and
    unhealthy, for callers that know allocations), per node CPU/memory facts; and the sums over clusters."""
    clusters: dict[str, dict[str, Any]] = {}

    def cluster_entry(name: str) -> dict[str, Any]:
        return clusters.setdefault(name, {"cluster": name, "models": [], "nodes": []})

    overall: dict[str, dict[str, int]] = {}
    for m in models:
        in_use, unhealthy = list(m["in_use_gpus"]), list(m["unhealthy_gpus"])
        row = {"model": m["model"], "total": m["total"], "healthy": m["healthy"], "unhealthy": len(unhealthy),
               "on_lost_nodes": m["on_lost_nodes"], "in_use": len(in_use), "in_use_gpus": in_use,
               "unhealthy_gpus": unhealthy}
        cluster_entry(m["cluster"])["models"].append(row)
        total = overall.setdefault(m["model"], {"model": m["model"], **dict.fromkeys(COUNTS, 0)})
        for key in COUNTS:
            total[key] += row[key]
    for n in nodes:
        cluster_entry(n["cluster"])["nodes"].append({
            "node": n["node"], "hostname": n["hostname"], "state": n["state"],
            "last_seen_at": n["last_seen_at"].isoformat(), "gpus": n["gpus"], "cpu_count": n["cpu_count"],
            "cpu_util_pct": n["cpu_util_pct"], "memory_mib": n["memory_mib"],
            "memory_used_mib": n["memory_used_mib"]})
    out = []
    for name in sorted(clusters):
        entry = clusters[name]
        entry["totals"] = {key: sum(r[key] for r in entry["models"]) for key in COUNTS}
        out.append(entry)
    all_models = [overall[k] for k in sorted(overall)]
    return {
        "clusters": out,
        "all": {"models": all_models, "totals": {key: sum(r[key] for r in all_models) for key in COUNTS}},
        "in_use_util_pct": IN_USE_UTIL_PCT,
        "fresh_within_s": fresh_within_s,
    }
