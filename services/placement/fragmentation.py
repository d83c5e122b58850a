"""Live fragmentation: the free GPU capacity that no recently asked-for job shape could use, per cluster and GPU
model — the core's FGD measure (`libs.core.frag`, the simulator's one definition) on the live pool against the
recent workload (`domain.recent_workload`: shapes of the last grants within a window and of every waiting job,
weighted by how often each occurred). Answered on request (`query.placement.fragmentation`, the gateway's
`/v1/pool/fragmentation`) and kept as gauges by the leader."""

from __future__ import annotations

import logging
from datetime import timedelta
from typing import TYPE_CHECKING, Any

from libs.contracts.commands import GetPool, Reply
from libs.contracts.envelope import utcnow
from libs.core import measure_fragmentation
from libs.observability.metrics import POOL_FRAGMENTED_GPUS, POOL_FREE_GPUS
from libs.runtime.loops import every
from services.placement import store
from services.placement.domain import build_snapshot, recent_workload

if TYPE_CHECKING:
    from services.placement.handlers import PlacementHandlers

log = logging.getLogger(__name__)


class Fragmentation:
    def __init__(self, handlers: PlacementHandlers) -> None:
        self.h = handlers

    async def measure(self, cluster: str | None = None) -> dict[str, Any]:
        settings = self.h.settings
        async with self.h.rt.pool.acquire() as conn:
            state = await store.load_pool(conn, utcnow() - timedelta(seconds=settings.fragmentation_window_s),
                                          settings.fragmentation_recent_grants)
        workload = recent_workload(state["shapes"])
        rows = measure_fragmentation(build_snapshot(state["nodes"], state["gpus"], state["running"]), workload)
        total = sum(w.weight for w in workload) or 1.0
        return {
            "measured_at": utcnow().isoformat(),
            "window_s": settings.fragmentation_window_s,
            "rows": [{"cluster": r.cluster, "gpu_model": r.gpu_model, "gpus": r.gpus,
                      "free_gpus": round(r.free_gpus, 3), "fragmented_gpus": round(r.fragmented_gpus, 3),
                      "fragmented_share": round(r.fragmented_share, 4)}
                     for r in rows if cluster is None or r.cluster == cluster],
            "workload": [{"gpus": w.gpus, "gpu_milli": w.gpu_milli, "gpu_models": list(w.gpu_models),
                          "share": round(w.weight / total, 4)} for w in workload if not w.mig_profile],
        }

    async def query(self, cmd: GetPool) -> Reply:
        return Reply.success(await self.measure(cmd.cluster))

    async def gauges_forever(self) -> None:
        """The leader keeps the gauges; a follower clears its own (one series per cluster and model in all)."""
        await every(self.h.settings.fragmentation_interval_s, self.update_gauges, log=log,
                    failure="fragmentation_measure_failed", first_delay_s=1.0)

    async def update_gauges(self) -> None:
        if self.h.lease is not None and not self.h.lease.is_leader:
            POOL_FREE_GPUS.clear()
            POOL_FRAGMENTED_GPUS.clear()
            return
        doc = await self.measure()
        POOL_FREE_GPUS.clear()
        POOL_FRAGMENTED_GPUS.clear()
        for r in doc["rows"]:
            POOL_FREE_GPUS.labels(cluster=r["cluster"], gpu_model=r["gpu_model"]).set(r["free_gpus"])
            POOL_FRAGMENTED_GPUS.labels(cluster=r["cluster"], gpu_model=r["gpu_model"]).set(r["fragmented_gpus"])
