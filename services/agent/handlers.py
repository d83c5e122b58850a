"""One node agent: register with inventory, then stream NVML samples. For the simulated backend it also follows
allocation events so simulated GPUs get busy when a job lands on them (allocated vs actually used is real)."""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
import zlib

from libs.bus.connection import Message, NatsClient
from libs.bus.publisher import publish_event
from libs.bus.rpc import ServiceUnavailable, request
from libs.contracts import subjects
from libs.contracts.commands import ListAllocations
from libs.contracts.envelope import InvalidEnvelope, parse_envelope
from libs.contracts.events import AllocationGranted, AllocationReleased, decode_data
from services.agent.dcgm_metrics import DcgmMetrics, default_metrics
from services.agent.domain import registration, telemetry
from services.agent.nvml_sim import SimulatedNvml
from services.agent.nvml_types import GpuSample, NodeInfo, NvmlBackend

log = logging.getLogger(__name__)
SOURCE = "/gpupool/agent"


_REGISTERING: asyncio.Semaphore | None = None


def _registering() -> asyncio.Semaphore:
    """At most 8 registrations in flight per agent process (created in the running loop)."""
    global _REGISTERING
    if _REGISTERING is None:
        _REGISTERING = asyncio.Semaphore(8)
    return _REGISTERING


class NodeAgent:
    def __init__(self, nc: NatsClient, backend: NvmlBackend, cluster: str, node: str, interval_s: float,
                 metrics: DcgmMetrics | None = None, workloads: dict[str, str] | None = None) -> None:
        self.workloads = workloads or {}  # job kind → simulated workload on its GPUs
        self.silent_until = 0.0  # simulated "node goes silent" fault: no samples (no heartbeat) until then
        self.nc = nc
        self.js = nc.jetstream()
        self.backend = backend
        self.cluster = cluster
        self.node = node
        self.interval_s = interval_s
        self.samples_sent = 0
        self.metrics = metrics if metrics is not None else default_metrics()
        self._info: NodeInfo | None = None  # static facts for the DCGM labels, read once

    async def run(self, stop: asyncio.Event) -> None:
        self.backend.open()
        try:
            await self.register(stop)
            if isinstance(self.backend, SimulatedNvml):
                await self.follow_allocations()
                await self.nc.subscribe(subjects.SIM_FAULT, cb=self._on_fault)
            # A fixed cadence, not "sleep after each sample": a slow publish must not stretch the interval. Nodes
            # of a simulated fleet start at different phases, as a real fleet does, instead of all at once.
            next_at = time.monotonic() + self.phase_s()
            while not stop.is_set():
                delay = next_at - time.monotonic()
                if delay > 0:
                    with contextlib.suppress(asyncio.TimeoutError):
                        await asyncio.wait_for(stop.wait(), timeout=delay)
                    if stop.is_set():
                        break
                if time.monotonic() >= self.silent_until:
                    await self.sample_once()
                next_at += self.interval_s
                if next_at < time.monotonic():  # fell behind (overloaded): skip, never burst to catch up
                    next_at = time.monotonic() + self.interval_s
        finally:
            self.backend.close()

    def phase_s(self) -> float:
        """When in the interval this node samples: 0 for a real node (one per process), spread over the interval
        for a simulated fleet (stable per node name)."""
        if not isinstance(self.backend, SimulatedNvml):
            return 0.0
        return self.interval_s * (zlib.crc32(self.node.encode()) % 1000) / 1000

    async def register(self, stop: asyncio.Event) -> None:
        """Retry until inventory confirms: a node that is not registered cannot be scheduled on. A simulated fleet
        registers a few nodes at a time (REGISTERING): a thousand requests at once would time out in inventory's
        queue and come back as retries, each re-registering."""
        cmd = registration(self.cluster, self.node, self.backend.node_info(), self.backend.sample())
        delay = 0.2
        while not stop.is_set():
            try:
                async with _registering():
                    reply = await request(self.nc, subjects.CMD_INVENTORY_REGISTER_NODE, cmd, timeout=5.0)
                if reply.ok:
                    log.info("node_registered", extra={"node": self.node, "gpus": len(cmd.gpus)})
                    return
                log.error("registration_refused", extra={"node": self.node, "error": reply.error.model_dump()
                                                         if reply.error else None})
            except ServiceUnavailable as exc:
                log.warning("registration_retry", extra={"node": self.node, "error": str(exc)})
            await asyncio.sleep(delay)
            delay = min(5.0, delay * 2)

    async def sample_once(self) -> None:
        samples = self.backend.sample()
        self.update_metrics(samples)
        event = telemetry(self.cluster, self.node, samples, time.time()).to_cloudevent(SOURCE)
        try:
            await publish_event(self.js, subjects.telemetry(self.cluster, self.node), event)
            self.samples_sent += 1
        except Exception as exc:  # a missed sample is acceptable; the next one follows
            log.warning("telemetry_publish_failed", extra={"node": self.node, "error": repr(exc)})

    def update_metrics(self, samples: list[GpuSample]) -> None:
        """DCGM-named gauges on /metrics, labelled with this node's name as `Hostname`."""
        try:
            if self._info is None:
                self._info = self.backend.node_info()
            self.metrics.update(self.node, self._info, samples)
        except Exception as exc:  # metrics must never stop telemetry
            log.warning("dcgm_metrics_update_failed", extra={"node": self.node, "error": repr(exc)})

    async def follow_allocations(self) -> None:
        assert isinstance(self.backend, SimulatedNvml)
        sim = self.backend
        await self.nc.subscribe(subjects.ALLOCATION_ALL, cb=self._on_allocation)
        with contextlib.suppress(ServiceUnavailable):
            reply = await request(self.nc, subjects.QUERY_PLACEMENT_LIST_ALLOCATIONS,
                                  ListAllocations(active=True, limit=1000), timeout=2.0)
            for item in (reply.result or {}).get("items", []) if reply.ok else []:
                if item["node"] == self.node and item["cluster"] == self.cluster:
                    for gpu in item["gpus"]:
                        sim.set_workload(gpu["uuid"], "training")

    async def _on_fault(self, msg: Message) -> None:
        """Fault injection for the simulated fleet (development and tests only; never on the real backend):
        {"node": ..., "fault": "silence", "seconds": N} or {"node": ..., "gpu": i, "fault": "xid79" | ...} with the
        GPU fault's optional `seconds`, `xid` or `count` (services/agent/nvml_sim.py lists the faults)."""
        try:
            doc = json.loads(msg.data)
        except ValueError:
            return
        if doc.get("node") != self.node:
            return
        assert isinstance(self.backend, SimulatedNvml)
        if doc.get("fault") == "silence":
            self.silent_until = time.monotonic() + float(doc.get("seconds", 30))
            log.warning("sim_fault_silence", extra={"node": self.node, "seconds": doc.get("seconds", 30)})
        elif "gpu" in doc:
            options = {k: doc[k] for k in ("seconds", "xid", "count") if isinstance(doc.get(k), int | float)}
            with contextlib.suppress(KeyError, ValueError, IndexError, TypeError):
                self.backend.inject_fault(int(doc["gpu"]), str(doc["fault"]), **options)
                log.warning("sim_fault_injected", extra={"node": self.node, "gpu": doc["gpu"], "fault": doc["fault"],
                                                         **options})

    async def _on_allocation(self, msg: Message) -> None:
        try:
            data = decode_data(parse_envelope(msg.data))
        except (InvalidEnvelope, json.JSONDecodeError):
            return
        if not isinstance(data, AllocationGranted | AllocationReleased):
            return
        if data.node != self.node or data.cluster != self.cluster:
            return
        assert isinstance(self.backend, SimulatedNvml)
        kind = self.workloads.get(data.kind, "training") if isinstance(data, AllocationGranted) else None
        for gpu in data.gpus:
            with contextlib.suppress(KeyError, ValueError):
                self.backend.set_workload(gpu.uuid, kind)
