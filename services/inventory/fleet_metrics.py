"""Inventory's /metrics about the fleet, read from its tables every metrics interval: GPUs per health state (a
quarantined GPU pages someone), nodes per state (a lost node too), and GPUs held by live allocations with how many
of them are idle (no fresh sample above IN_USE_UTIL_PCT: allocated but unused). deploy/prometheus/rules alerts on
them. Every replica reports the same numbers from the same database: rules take `max` over replicas."""

from __future__ import annotations

import logging
from collections.abc import Iterable
from typing import Any

from prometheus_client import Gauge

from libs.contracts.envelope import utcnow
from libs.runtime.loops import every
from libs.runtime.service import ServiceRuntime
from services.inventory import store
from services.inventory.config import InventorySettings
from services.inventory.domain import IN_USE_UTIL_PCT, lost_cutoff

GPUS = Gauge("gpupool_inventory_gpus", "GPUs by cluster, model and health state", ["cluster", "gpu_model", "state"])
NODES = Gauge("gpupool_inventory_nodes", "Nodes by cluster and state (ready, lost; cordoned counts the cordoned "
              "ones among them)", ["cluster", "state"])
HELD_GPUS = Gauge("gpupool_inventory_held_gpus", "GPUs held by live allocations", ["cluster", "gpu_model"])
HELD_IDLE_GPUS = Gauge("gpupool_inventory_held_idle_gpus", "GPUs held by live allocations with no fresh sample "
                       "above the in-use threshold (allocated but idle)", ["cluster", "gpu_model"])
HEALTH_STATES = ("healthy", "suspect", "quarantined", "probation")
log = logging.getLogger(__name__)


def report(models: Iterable[Any], nodes: Iterable[Any], held: Iterable[Any]) -> None:
    """Set the gauges from `store.pool_by_model`, `store.pool_nodes` and `store.held_by_model` rows."""
    GPUS.clear()
    for m in models:
        others = sum(m[state] for state in HEALTH_STATES[1:])
        for state in HEALTH_STATES:
            GPUS.labels(cluster=m["cluster"], gpu_model=m["model"], state=state).set(
                m["total"] - others if state == "healthy" else m[state])
    NODES.clear()
    counts: dict[tuple[str, str], int] = {}
    for n in nodes:
        for state in (n["state"], *(("cordoned",) if n["cordoned"] else ())):
            counts[(n["cluster"], state)] = counts.get((n["cluster"], state), 0) + 1
        for state in ("ready", "lost", "cordoned"):
            counts.setdefault((n["cluster"], state), 0)
    for (cluster, state), count in counts.items():
        NODES.labels(cluster=cluster, state=state).set(count)
    HELD_GPUS.clear()
    HELD_IDLE_GPUS.clear()
    for h in held:
        HELD_GPUS.labels(cluster=h["cluster"], gpu_model=h["model"]).set(h["held"])
        HELD_IDLE_GPUS.labels(cluster=h["cluster"], gpu_model=h["model"]).set(h["idle"])


async def report_fleet(rt: ServiceRuntime, settings: InventorySettings) -> None:
    fresh_since = lost_cutoff(utcnow(), settings.node_lost_after_s)
    async with rt.pool.acquire() as conn:
        models = await store.pool_by_model(conn, cluster=None, fresh_since=fresh_since,
                                           in_use_above_pct=IN_USE_UTIL_PCT)
        nodes = await store.pool_nodes(conn, cluster=None)
        held = await store.held_by_model(conn, fresh_since=fresh_since, in_use_above_pct=IN_USE_UTIL_PCT)
    report(models, nodes, held)


async def fleet_metrics_loop(rt: ServiceRuntime, settings: InventorySettings) -> None:
    """Background task: the fleet gauges every metrics interval."""
    await every(settings.metrics_interval_s, lambda: report_fleet(rt, settings), log=log,
                failure="fleet_metrics_failed")
