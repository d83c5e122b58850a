"""Each replica's load for its job's autoscaler. A grant whose work carries a `load` probe (set from the job's
autoscale policy) is sampled every `load.every_s` while its work runs: its GPUs' mean utilisation from the node's
last telemetry sample (`gpu_utilization`), or a Prometheus metric scraped from the replica's port (`metric`); each
sample is published as `agent.work_load` for the queue's autoscaler. A sample that cannot be taken (no telemetry
yet, a MIG-mode GPU, a replica not answering) is skipped: the autoscaler takes no step on missing samples, and one
whose samples all went stale takes none at all."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable, Iterable

from libs.contracts.envelope import utcnow
from libs.contracts.events import AllocationGranted, EventData, WorkLoadSampled
from libs.contracts.work import LoadProbe
from services.agent.domain import metric_value, replica_utilization
from services.agent.endpoints import scrape
from services.agent.nvml_types import GpuSample

log = logging.getLogger(__name__)
SCRAPE_TIMEOUT_S = 5.0
MAX_VALUE = 1e12  # WorkLoadSampled.value's bound


class LoadSampler:
    def __init__(self, cluster: str, node: str, address: str,
                 publish: Callable[[EventData, str], Awaitable[bool]]) -> None:
        self.cluster, self.node, self.address = cluster, node, address
        self.publish = publish
        self.utilization: dict[str, float | None] = {}  # GPU uuid → its utilisation in the node's last sample
        self.due: dict[str, float] = {}  # allocation → when (monotonic) its next sample is due

    def observe(self, samples: Iterable[GpuSample]) -> None:
        """The node's telemetry was sampled: what each GPU's utilisation is now."""
        self.utilization = {s.uuid: s.utilization_gpu_pct for s in samples}

    async def tick(self, running: Iterable[tuple[AllocationGranted, dict[str, int]]],
                   now: float | None = None) -> int:
        """Sample every running replica (grant, its host ports) whose probe is due; returns how many were sent."""
        now = time.monotonic() if now is None else now
        due: list[tuple[AllocationGranted, LoadProbe, dict[str, int]]] = []
        for grant, ports in running:
            probe = grant.work.load if grant.work is not None else None
            if probe is None or self.due.get(grant.allocation_id, 0.0) > now:
                continue
            self.due[grant.allocation_id] = now + probe.every_s
            due.append((grant, probe, ports))
        sent = await asyncio.gather(*(self._sample(g, p, ports) for g, p, ports in due))
        return sum(sent)

    async def _sample(self, grant: AllocationGranted, probe: LoadProbe, ports: dict[str, int]) -> bool:
        value = await self.value(grant, probe, ports)
        if value is None:
            return False
        at = utcnow()
        event = WorkLoadSampled(allocation_id=grant.allocation_id, job_id=grant.job_id, team=grant.team,
                                project=grant.project, cluster=self.cluster, node=self.node, replica=grant.replica,
                                attempt=grant.attempt, signal=probe.signal, value=value, sampled_at=at)
        return await self.publish(event, f"work_load/{grant.allocation_id}/{at.timestamp()}")

    async def value(self, grant: AllocationGranted, probe: LoadProbe, ports: dict[str, int]) -> float | None:
        if probe.signal == "gpu_utilization":
            return replica_utilization([g.uuid for g in grant.gpus], self.utilization)
        assert probe.port is not None and probe.metric is not None
        port = ports.get(probe.port)
        if port is None:
            return None
        text = await scrape(self.address, port, probe.path, min(SCRAPE_TIMEOUT_S, probe.every_s))
        value = None if text is None else metric_value(text, probe.metric)
        if value is not None and not 0 <= value <= MAX_VALUE:
            value = None  # a load is a count or a level: a negative or absurd one is not one
        if value is None:
            log.info("load_metric_unavailable", extra={"node": self.node, "allocation_id": grant.allocation_id,
                                                       "metric": probe.metric, "port": port})
        return value

    def forget(self, allocation_id: str) -> None:
        self.due.pop(allocation_id, None)
