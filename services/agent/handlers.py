"""One node agent: register with inventory, then stream NVML samples. It follows the allocations on its node and
applies what placement decided: MIG instances created with their grant and destroyed with their release, fractions
watched against their memory limit (reported, or stopped by policy). The simulated backend also gets workloads when
a job lands on its GPUs, so allocated vs actually used is real."""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
import uuid as uuidlib
import weakref
import zlib
from collections import OrderedDict
from collections.abc import Awaitable, Callable
from typing import Any, Literal

from opentelemetry import trace
from prometheus_client import Counter

from libs.bus.connection import Message, NatsClient
from libs.bus.publisher import MSG_ID_HEADER, publish_event, publish_raw, publish_raw_batch
from libs.bus.rpc import ServiceUnavailable, request
from libs.contracts import subjects
from libs.contracts.commands import ListAllocations
from libs.contracts.envelope import InvalidEnvelope, utcnow, uuid7
from libs.contracts.events import (
    AllocatedGpu,
    AllocationGangReady,
    AllocationGranted,
    AllocationPreempting,
    AllocationReleased,
    EventData,
    FractionExceeded,
    GpuSharingSet,
    MigApplied,
    subject_for,
)
from libs.contracts.origins import accept
from libs.core import mig as migcat
from libs.observability.tracing import current_traceparent, handling_span, inject_headers, tracer
from services.agent.dcgm_metrics import DcgmMetrics, default_metrics
from services.agent.domain import (
    Deadband,
    LiveAllocation,
    attribute_by_cgroup,
    background_load,
    fraction_action,
    fraction_violations,
    plan_mig,
    share_limits,
    telemetry_due,
    telemetry_json,
    wanted_mig,
)
from services.agent.nvml_sim import SimulatedNvml
from services.agent.nvml_types import GpuProcess, GpuSample, MigError, MigInstance, NodeInfo, NvmlBackend
from services.agent.registration import registration
from services.agent.sample_buffer import SampleBuffer
from services.agent.work import WorkRunner

log = logging.getLogger(__name__)
_tracer = tracer("gpupool.agent")
SOURCE = "/gpupool/agent"
_EVENT_NS = uuidlib.UUID("2f0c7c35-1f4e-4d0e-8f77-6a3b5f0c9e21")  # event ids derived from what they report

MIG_OPERATIONS = Counter("gpupool_agent_mig_operations_total", "MIG instances created or destroyed by the agent",
                         ["operation", "outcome"])
FRACTION_EXCEEDED = Counter("gpupool_agent_fraction_exceeded_total",
                            "Processes found over their fraction's memory limit, by the action taken", ["action"])
PROCESSES_KILLED = Counter("gpupool_agent_processes_killed_total",
                           "Processes stopped for exceeding their fraction that needed SIGKILL after the grace")
TELEMETRY_SAMPLES = Counter("gpupool_agent_telemetry_samples_total", "GPU samples taken: sent, or left out as "
                            "unchanged (sampling by change)", ["outcome"])
SAMPLES_SENT, SAMPLES_UNCHANGED = TELEMETRY_SAMPLES.labels("sent"), TELEMETRY_SAMPLES.labels("unchanged")
SNAPSHOT_PAGES = 50  # at most 50,000 live allocations read at start
SNAPSHOT_PAGE_TIMEOUT_S = 10.0  # a page of 1,000 from a placement busy with a fleet's cycles
SNAPSHOT_RETRY_S = (2.0, 30.0)  # a failed fetch's back-off, per process: first and longest


class _Snapshot:
    """Placement's live allocations as an agent process lists them. A process hosting one node (a real agent) lists
    its own node's only; a simulated fleet's process lists the cluster's once for all its nodes, whichever node's
    connection asks: a node reuses a fetch that started after it subscribed to allocation events (so it missed
    nothing), else starts a new one. A failed fetch is the answer until the process's back-off (2 s → 30 s) ends.
    (At 1,024 simulated nodes, each listing the whole cluster on its own connection's timer, placement spent most of
    its time answering pages.)"""

    def __init__(self) -> None:
        self.started = -1.0
        self.task: asyncio.Task[list[dict]] | None = None
        self.retry_at = 0.0  # while a failed fetch is younger than this, it is the answer
        self.delay = SNAPSHOT_RETRY_S[0]

    async def fetch(self, nc: NatsClient, scope: tuple[str, str] | None) -> list[dict]:
        try:
            items = await _fetch_live(nc, scope)
        except BaseException:
            self.retry_at = time.monotonic() + self.delay
            self.delay = min(SNAPSHOT_RETRY_S[1], self.delay * 2)
            raise
        self.delay = SNAPSHOT_RETRY_S[0]
        return items


_SNAPSHOTS: dict[tuple[str, str] | None, _Snapshot] = {}  # by scope: (cluster, node), or None for the cluster


async def _fetch_live(nc: NatsClient, scope: tuple[str, str] | None = None) -> list[dict]:
    items: list[dict] = []
    after: str | None = None
    cluster, node = scope if scope is not None else (None, None)
    for _ in range(SNAPSHOT_PAGES):
        reply = await request(nc, subjects.QUERY_PLACEMENT_LIST_ALLOCATIONS,
                              ListAllocations(active=True, limit=1000, after=after, cluster=cluster, node=node),
                              timeout=SNAPSHOT_PAGE_TIMEOUT_S)
        if not reply.ok:
            raise ServiceUnavailable(f"list_allocations refused: {reply.error}")
        result = reply.result or {}
        items += result.get("items", [])
        after = result.get("next")
        if not after:
            break
    return items


async def live_snapshot(nc: NatsClient, subscribed_at: float, scope: tuple[str, str] | None = None) -> list[dict]:
    """The live allocations of `scope` ((cluster, node), or None: the whole listing shared by a process's nodes)."""
    snap = _SNAPSHOTS.setdefault(scope, _Snapshot())
    failed = snap.task is not None and snap.task.done() and (snap.task.cancelled() or snap.task.exception())
    backing_off = failed and time.monotonic() < snap.retry_at  # the failure stands until the back-off ends
    if not backing_off and (snap.task is None or snap.started < subscribed_at or failed):
        snap.started = time.monotonic()
        snap.task = asyncio.ensure_future(snap.fetch(nc, scope))
    return await asyncio.shield(snap.task)


_REGISTERING: asyncio.Semaphore | None = None


def _registering() -> asyncio.Semaphore:
    """At most 8 registrations in flight per agent process (created in the running loop)."""
    global _REGISTERING
    if _REGISTERING is None:
        _REGISTERING = asyncio.Semaphore(8)
    return _REGISTERING


AllocationChange = AllocationGranted | AllocationPreempting | AllocationReleased | AllocationGangReady


def allocation_route(msg: Message) -> tuple[tuple[str, str], AllocationChange] | None:
    """(cluster, node) a grant, stop request or release is for, with the event; None for anything else."""
    try:
        _event, data = accept(msg.data, msg.subject)  # placement's, on its own subject
    except (InvalidEnvelope, json.JSONDecodeError):
        return None
    if not isinstance(data, AllocationGranted | AllocationPreempting | AllocationReleased | AllocationGangReady):
        return None
    return (data.cluster, data.node), data


def sharing_route(msg: Message) -> tuple[tuple[str, str], GpuSharingSet] | None:
    """(cluster, node) a GPU's sharing-mode change is for, with the event; None for anything else."""
    try:
        _event, data = accept(msg.data, msg.subject)  # inventory's, on its own subject
    except (InvalidEnvelope, json.JSONDecodeError):
        return None
    return ((data.cluster, data.node), data) if isinstance(data, GpuSharingSet) else None


def fault_route(msg: Message) -> tuple[str, dict[str, Any]] | None:
    """The node a simulated fault names, with the fault; None for a malformed message."""
    try:
        doc = json.loads(msg.data)
    except ValueError:
        return None
    if not isinstance(doc, dict) or not isinstance(doc.get("node"), str):
        return None
    return doc["node"], doc


class _Router:
    """One core-NATS subscription per connection and subject, handing each message to the agent of the node it is
    for: a simulated fleet of 1,000 nodes in one process would otherwise decode every event 1,000 times."""

    def __init__(self, parse: Callable[[Message], tuple[Any, Any] | None]) -> None:
        self.parse = parse
        self.handlers: dict[Any, Callable[[Any], Awaitable[None]]] = {}

    async def dispatch(self, msg: Message) -> None:
        routed = self.parse(msg)
        if routed is not None:
            handler = self.handlers.get(routed[0])
            if handler is not None:  # a span only for what this node applies, in the publisher's trace
                with handling_span(_tracer, f"apply {msg.subject}", msg.headers, trace.SpanKind.CONSUMER):
                    await handler(routed[1])


_routers: weakref.WeakKeyDictionary[Any, dict[str, _Router]] = weakref.WeakKeyDictionary()


async def route(nc: Any, subject: str, parse: Callable[[Message], tuple[Any, Any] | None], key: Any,
                handler: Callable[[Any], Awaitable[None]]) -> None:
    """Have `handler` called with the parsed message whenever `parse` says a message on `subject` is for `key`."""
    routers = _routers.setdefault(nc, {})
    router = routers.get(subject)
    if router is None:
        router = routers[subject] = _Router(parse)  # before the await: concurrent callers share it
        await nc.subscribe(subject, cb=router.dispatch)
    router.handlers[key] = handler


def telemetry_buffer(js: Any, max_bytes: int = 32 * 1024 * 1024) -> SampleBuffer:
    """The buffer telemetry goes through: JetStream publish with ack, backlog flushed in pipelined chunks."""
    return SampleBuffer(lambda subject, payload, headers: publish_raw(js, subject, payload, headers),
                        lambda messages: publish_raw_batch(js, messages), max_bytes=max_bytes)


class NodeAgent:
    def __init__(self, nc: NatsClient, backend: NvmlBackend, cluster: str, node: str, interval_s: float,
                 metrics: DcgmMetrics | None = None, workloads: dict[str, str] | None = None, *,
                 fraction_policy: Literal["auto", "report", "stop"] = "auto", stop_grace_s: float = 10.0,
                 apply_mig: bool = True, buffer: SampleBuffer | None = None, resync_s: float = 30.0,
                 address: str = "", labels: dict[str, str] | None = None, deadband: Deadband | None = None,
                 background: str = "", fleet_nc: NatsClient | None = None) -> None:
        # One process, many simulated nodes (`fleet_nc`, one of their connections): the events reach every node
        # through that one connection's subscriptions, and the resync lists the cluster's allocations once for all;
        # otherwise the node subscribes on its own connection and lists its own node's. (Each of 1,024 nodes on a
        # connection of its own, subscribed to every allocation event, decoded each event 1,024 times: the agent
        # fell so far behind that its nodes' telemetry came too late and inventory declared them lost.)
        self.events_nc = fleet_nc if fleet_nc is not None else nc
        self.listing_scope: tuple[str, str] | None = None if fleet_nc is not None else (cluster, node)
        self.deadband = deadband if deadband is not None else Deadband(heartbeat_s=0.0)  # default: every sample
        self.background = background  # simulated load on GPUs no allocation holds (a load test's busy fleet)
        self._sent: dict[str, GpuSample] = {}  # each GPU's last sent sample (sampling by change)
        self._heartbeat_at: float | None = None  # when the last whole sample (every GPU) was taken
        self.address = address  # where this node's peers reach it (registered; a gang's rendezvous)
        self.labels = dict(labels or {})  # registered as the node's labels (its rack, block, ...)
        self.workloads = workloads or {}  # job kind → simulated workload on its GPUs
        self.fraction_policy = fraction_policy
        self.stop_grace_s = stop_grace_s
        self.apply_mig = apply_mig
        self.live: dict[str, LiveAllocation] = {}  # allocations on this node, from grants and the start-up query
        self.live_since: dict[str, float] = {}  # allocation → when it entered `live` (time.monotonic())
        self.released: OrderedDict[str, None] = OrderedDict()  # recent releases: a late snapshot cannot revive them
        self.synced = False  # the start-up query answered: only then may stale MIG instances be destroyed
        self.mig_reported: dict[str, tuple[str, str | None]] = {}  # allocation → last (action, reason) published
        self.mig_owner: dict[tuple[int, int], LiveAllocation] = {}  # (GPU, start) → allocation its instance serves
        self.mig_of: dict[str, MigInstance] = {}  # allocation → its instance
        self.fraction_reported: set[tuple[str, int]] = set()  # (allocation, pid) already reported
        self.stopping: dict[int, float] = {}  # pid → when SIGKILL follows the SIGTERM
        self.converge_pending = False  # something could not be applied yet: try again on the next sample
        self._converging = asyncio.Lock()
        self.silent_until = 0.0  # simulated "node goes silent" fault: no samples (no heartbeat) until then
        self.nc = nc
        self.js = nc.jetstream()
        # samples the bus could not take wait here (one buffer per process; bootstrap runs its flusher)
        self.buffer = buffer if buffer is not None else telemetry_buffer(self.js)
        self.backend = backend
        self.cluster = cluster
        self.node = node
        self.interval_s = interval_s
        self.samples_sent = 0
        self.metrics = metrics if metrics is not None else default_metrics()
        self._info: NodeInfo | None = None  # static facts for the DCGM labels, read once
        self.work: WorkRunner | None = None  # the node's executor, when this agent runs jobs' commands
        self.drivers: dict[str, str | None] | None = None  # its offered_drivers(), registered as isolation labels
        self.resync_s = resync_s
        self._registrations: set[asyncio.Task[None]] = set()  # re-registrations after a MIG mode change
        self.mig_mode_wanted: dict[str, bool] = {}  # GPU uuid → MIG mode its new sharing mode wants, until applied

    def attach_work(self, work: WorkRunner) -> None:
        self.work = work

    async def run(self, stop: asyncio.Event) -> None:
        self.backend.open()
        if self.background and isinstance(self.backend, SimulatedNvml):
            uuids = [g.uuid for g in self.backend.node_info().gpus]
            for uuid, kind in background_load(self.background, uuids, zlib.crc32(self.node.encode())).items():
                self.backend.set_workload(uuid, kind)
        if self.work is not None:  # which NUMA node each GPU is on, for the work's GPUPOOL_NUMA_NODES
            self.work.gpu_numa = {g.uuid: g.numa_node for g in self.backend.node_info().gpus
                                  if g.numa_node is not None}
        sync: asyncio.Task[None] | None = None
        try:
            subscribed_at = time.monotonic()
            await route(self.events_nc, subjects.ALLOCATION_ALL, allocation_route, (self.cluster, self.node),
                        self.apply_allocation)
            if self.work is not None:
                await self.work.start()  # re-adopts what a previous agent left running, before any grant
            await self.register(stop)
            if self.apply_mig:
                await route(self.events_nc, subjects.GPU_SHARING_SET, sharing_route, (self.cluster, self.node),
                            self.apply_sharing)
            if isinstance(self.backend, SimulatedNvml):
                await route(self.events_nc, subjects.SIM_FAULT, fault_route, self.node, self.apply_fault)
            sync = asyncio.create_task(self.sync_allocations(stop, subscribed_at))
            # A fixed cadence, not "sleep after each sample": a slow publish must not stretch the interval. Nodes
            # of a simulated fleet start at different phases, as a real fleet does, instead of all at once.
            next_at = time.monotonic() + self.phase_s()
            while not stop.is_set():
                delay = next_at - time.monotonic()
                if delay > 0:
                    # a plain sleep (not wait_for on `stop`: a task and a timer per node and tick were a tenth of a
                    # simulated fleet's CPU); stopping waits at most one interval
                    await asyncio.sleep(delay)
                    if stop.is_set():
                        break
                if time.monotonic() >= self.silent_until:
                    await self.sample_once()
                await self.enforce()
                if self.converge_pending:
                    await self.converge()
                next_at += self.interval_s
                if next_at < time.monotonic():  # fell behind (overloaded): skip, never burst to catch up
                    next_at = time.monotonic() + self.interval_s
        finally:
            if sync is not None:
                sync.cancel()
            if self.work is not None:
                await self.work.close()
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
        cmd = registration(self.cluster, self.node, self.backend.node_info(), self.backend.sample(),
                           labels=self.labels, drivers=self.drivers, address=self.address)
        delay = 0.2
        while not stop.is_set():
            try:
                async with _registering():
                    reply = await request(self.nc, subjects.register_node(self.cluster, self.node), cmd, timeout=5.0)
                if reply.ok:
                    log.info("node_registered", extra={"node": self.node, "gpus": len(cmd.gpus)})
                    return
                log.error("registration_refused", extra={"node": self.node, "error": reply.error.model_dump()
                                                         if reply.error else None})
            except ServiceUnavailable as exc:
                log.warning("registration_retry", extra={"node": self.node, "error": str(exc)})
            await asyncio.sleep(delay)
            delay = min(5.0, delay * 2)

    async def apply_sharing(self, data: GpuSharingSet) -> None:
        """Inventory switched a GPU's sharing mode once it held nothing: its MIG mode is to be on for `mig` and off
        for any other mode (a GPU still being drained, `draining_to`, is left alone). Applied now, or on a later
        sample while the GPU still has processes or instances (a release's cleanup may not have run yet)."""
        if data.draining_to is None:
            self.mig_mode_wanted[data.gpu_uuid] = data.mode == "mig"
            if not await self._apply_mig_modes():
                self.converge_pending = True

    async def _apply_mig_modes(self) -> bool:
        """Turn each GPU's MIG mode to what its sharing mode wants, then register again so inventory and
        placement see the GPUs as they now are. False while a GPU cannot be switched yet."""
        changed, done = False, True
        for gpu in self.backend.node_info().gpus:
            want = self.mig_mode_wanted.get(gpu.uuid)
            if want is None:
                continue
            if gpu.mig_mode != want:
                try:
                    self.backend.set_mig_mode(gpu.index, want)
                except MigError as exc:
                    log.warning("mig_mode_not_set", extra={"node": self.node, "gpu": gpu.index, "mig_mode": want,
                                                           "reason": exc.reason, "error": str(exc)})
                    done = False
                    continue
                log.info("mig_mode_set", extra={"node": self.node, "gpu": gpu.index, "mig_mode": want})
                changed = True
            del self.mig_mode_wanted[gpu.uuid]
        if changed:
            self._info = None  # the DCGM labels' static facts changed
            task = asyncio.create_task(self.register(asyncio.Event()))  # not in a subscription's callback
            self._registrations.add(task)
            task.add_done_callback(self._registrations.discard)
        return done

    async def sample_once(self) -> None:
        if self.work is not None and isinstance(self.backend, SimulatedNvml):
            self._measure_work()
        samples = self.backend.sample()
        self.update_metrics(samples)
        if self.work is not None:
            self.work.loads.observe(samples)
        at = time.time()
        due = telemetry_due(self._sent, self._heartbeat_at, samples, at, self.deadband, self.interval_s)
        SAMPLES_UNCHANGED.inc(len(samples) - len(due or ()))
        if due is None:
            return  # unchanged within the deadband: inventory counts the last sent values for this interval
        try:
            host = self.backend.node_sample()
        except Exception as exc:  # the node's own facts must never stop GPU telemetry
            log.warning("node_sample_failed", extra={"node": self.node, "error": repr(exc)})
            host = None
        event_id = uuid7()
        headers = inject_headers({MSG_ID_HEADER: event_id, "Content-Type": "application/cloudevents+json"})
        cadence = (self.interval_s, self.deadband.heartbeat_s) if self.deadband.on else None
        payload = telemetry_json(self.cluster, self.node, due, at, event_id=event_id, source=SOURCE,
                                 now=utcnow(), host=host, traceparent=headers.get("traceparent"), cadence=cadence)
        if await self.buffer.send(subjects.telemetry(self.cluster, self.node), payload, headers):
            self.samples_sent += 1
        # the buffer keeps what the bus could not take, so the sample counts as sent either way
        self._sent.update((s.uuid, s) for s in due)
        if len(due) == len(samples):
            self._heartbeat_at = at
        SAMPLES_SENT.inc(len(due))

    def update_metrics(self, samples: list[GpuSample]) -> None:
        """DCGM-named gauges on /metrics, labelled with this node's name as `Hostname`."""
        try:
            if self._info is None:
                self._info = self.backend.node_info()
            self.metrics.update(self.node, self._info, samples)
        except Exception as exc:  # metrics must never stop telemetry
            log.warning("dcgm_metrics_update_failed", extra={"node": self.node, "error": repr(exc)})

    def label_allocations(self) -> None:
        """The job mapping on /metrics (gpupool_gpu_allocation_info): one series per GPU and live allocation."""
        try:
            self.metrics.set_allocations(self.node, self.live.values())
        except Exception as exc:  # metrics must never stop applying allocations
            log.warning("allocation_info_update_failed", extra={"node": self.node, "error": repr(exc)})

    async def _on_fault(self, msg: Message) -> None:
        routed = fault_route(msg)
        if routed is not None and routed[0] == self.node:
            await self.apply_fault(routed[1])

    async def apply_fault(self, doc: dict[str, Any]) -> None:
        """Fault injection for the simulated fleet (development and tests only; never on the real backend):
        {"node": ..., "fault": "silence", "seconds": N} or {"node": ..., "gpu": i, "fault": "xid79" | ...} with the
        GPU fault's optional `seconds`, `xid` or `count` (services/agent/nvml_sim.py lists the faults)."""
        assert isinstance(self.backend, SimulatedNvml)
        if doc.get("fault") == "silence":
            self.silent_until = time.monotonic() + float(doc.get("seconds", 30))
            log.warning("sim_fault_silence", extra={"node": self.node, "seconds": doc.get("seconds", 30)})
        elif "gpu" in doc:
            options = {k: doc[k] for k in ("seconds", "xid", "count", "factor")
                       if isinstance(doc.get(k), int | float)}
            with contextlib.suppress(KeyError, ValueError, IndexError, TypeError):
                self.backend.inject_fault(int(doc["gpu"]), str(doc["fault"]), **options)
                log.warning("sim_fault_injected", extra={"node": self.node, "gpu": doc["gpu"], "fault": doc["fault"],
                                                         **options})

    async def sync_allocations(self, stop: asyncio.Event, subscribed_at: float) -> None:
        """The start-up query of placement's live allocations, so a restarted agent converges to them; retried
        with back-off (2 s → 30 s) until placement answers."""
        delay = 2.0
        while not stop.is_set():
            try:
                items = await live_snapshot(self.nc, subscribed_at, self.listing_scope)
            except ServiceUnavailable as exc:
                log.warning("allocation_sync_retry", extra={"node": self.node, "error": str(exc)})
                with contextlib.suppress(asyncio.TimeoutError):
                    await asyncio.wait_for(stop.wait(), timeout=delay)
                delay = min(30.0, delay * 2)
                continue
            live_here: set[str] = set()
            for item in items:
                if item.get("node") != self.node or item.get("cluster") != self.cluster:
                    continue
                live_here.add(item["allocation_id"])
                if item["allocation_id"] in self.released:
                    continue
                if self.work is not None:
                    self.work.on_live(item)
                if item["allocation_id"] in self.live:
                    continue
                with contextlib.suppress(ValueError, KeyError, TypeError):
                    self.live[item["allocation_id"]] = LiveAllocation(
                        allocation_id=item["allocation_id"], job_id=item["job_id"], team=item["team"],
                        project=item["project"], kind="",
                        gpus=tuple(AllocatedGpu.model_validate(g) for g in item["gpus"]))
                    self.live_since[item["allocation_id"]] = time.monotonic()
            if len(items) < SNAPSHOT_PAGES * 1000:  # the whole listing: what it lacks is no longer live
                self._forget_unlisted(live_here, subscribed_at)
            if self.work is not None:
                self.work.on_synced(live_here, subscribed_at)
            if not self.synced:
                log.info("allocations_synced", extra={"node": self.node, "live": len(self.live)})
            self.synced = True
            await self.converge()
            if self.work is None:
                return
            # a grant missed on the bus (core NATS) would leave its job launching forever: look again now and then
            delay = 2.0
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(stop.wait(), timeout=self.resync_s)
            subscribed_at = time.monotonic() - self.resync_s / 2  # one fetch serves a simulated fleet's nodes

    async def _on_allocation(self, msg: Message) -> None:
        routed = allocation_route(msg)
        if routed is not None and routed[0] == (self.cluster, self.node):
            await self.apply_allocation(routed[1])

    async def apply_allocation(self, data: AllocationChange) -> None:
        """A grant or release on this node: record it and converge the GPUs to the live allocations; work is
        launched with its grant, stopped on request, killed with a release that did not wait for it."""
        if isinstance(data, AllocationPreempting):
            if self.work is not None:
                await self.work.on_preempting(data)
            return
        if isinstance(data, AllocationGangReady):
            if self.work is not None:
                self.work.on_gang_ready(data.allocation_id)
            return
        if self.work is not None:
            if isinstance(data, AllocationGranted):
                self.work.on_granted(data)
            else:
                await self.work.on_released(data)
        if isinstance(data, AllocationGranted):
            if data.allocation_id in self.released:
                return
            self.live[data.allocation_id] = LiveAllocation(
                allocation_id=data.allocation_id, job_id=data.job_id, team=data.team, project=data.project,
                kind=data.kind, gpus=tuple(data.gpus))
            self.live_since.setdefault(data.allocation_id, time.monotonic())
        else:
            self._forget(data.allocation_id)
        await self.converge()

    def _forget(self, allocation_id: str) -> None:
        """An allocation released: no longer live here, and a late grant or listing cannot revive it."""
        self.live.pop(allocation_id, None)
        self.live_since.pop(allocation_id, None)
        self.released[allocation_id] = None
        while len(self.released) > 10_000:
            self.released.popitem(last=False)
        if isinstance(self.backend, SimulatedNvml):
            self.backend.end_allocation(allocation_id)  # its processes exit with it

    def _forget_unlisted(self, listed: set[str], listened_since: float) -> None:
        """Allocations placement no longer lists as live whose release this agent missed (core NATS drops messages
        to a slow or reconnecting subscriber): released here too, so their MIG instances go and their job mapping
        series with them. Only those known before `listened_since`: a later grant may be missing from the listing."""
        for allocation_id in [a for a in self.live if a not in listed
                              and self.live_since.get(a, listened_since) < listened_since]:
            log.warning("allocation_no_longer_live", extra={"node": self.node, "allocation_id": allocation_id})
            self._forget(allocation_id)

    # ---- applying what placement decided -------------------------------------------------------------------

    async def converge(self) -> None:
        """Bring the node to what the live allocations say (idempotent: a replay or a restart changes nothing that
        is already right). Whatever cannot be applied now is retried on the next sample."""
        self.label_allocations()
        async with self._converging:
            pending = False
            if self.apply_mig:
                try:
                    pending = await self._converge_mig()
                except Exception as exc:  # NVML trouble must never stop telemetry
                    log.warning("mig_converge_failed", extra={"node": self.node, "error": repr(exc)})
                    pending = True
            if self.mig_mode_wanted and not await self._apply_mig_modes():
                pending = True
            if self.work is not None:
                self.work.launch_ready({a: inst.uuid for a, inst in self.mig_of.items()})
            if isinstance(self.backend, SimulatedNvml):
                self._drive_simulation()
            self.converge_pending = pending

    async def _converge_mig(self) -> bool:
        layout = self.backend.mig_layout()
        wanted = wanted_mig(self.live.values())
        if not wanted and not any(layout.values()):
            return False
        plan = plan_mig(wanted, layout, self.gpu_processes())
        pending = False
        for allocation_id, inst in plan.present.items():
            alloc = self.live[allocation_id]
            self.mig_owner[(self._gpu_of(alloc, inst.profile), inst.start or 0)] = alloc
            await self._report_mig(alloc, inst.profile, inst.start or 0, "created", inst)
        for step in plan.steps:
            if step.op == "destroy" and not self.synced:
                pending = True  # until placement told us what is live, an instance may belong to a grant we missed
                continue
            try:
                if step.op == "destroy":
                    self.backend.destroy_mig_instance(step.gpu_index, step.start)
                    owner = self.mig_owner.pop((step.gpu_index, step.start), None)
                    log.info("mig_instance_destroyed", extra={"node": self.node, "gpu": step.gpu_index,
                                                              "profile": step.profile, "start": step.start})
                    if owner is not None and owner.allocation_id not in self.live:
                        self.mig_of.pop(owner.allocation_id, None)
                        await self._report_mig(owner, step.profile, step.start, "destroyed", None)
                else:
                    alloc = self.live[step.allocation_id or ""]
                    inst = self.backend.create_mig_instance(step.gpu_index, step.profile, step.start)
                    self.mig_owner[(step.gpu_index, step.start)] = alloc
                    log.info("mig_instance_created", extra={"node": self.node, "gpu": step.gpu_index,
                                                            "profile": step.profile, "start": step.start,
                                                            "mig_uuid": inst.uuid})
                    await self._report_mig(alloc, step.profile, step.start, "created", inst)
                MIG_OPERATIONS.labels(operation=step.op, outcome="ok").inc()
            except Exception as exc:  # MigError or NVML's: reported, retried on the next convergence
                MIG_OPERATIONS.labels(operation=step.op, outcome="failed").inc()
                pending = True
                reason = exc.reason if isinstance(exc, MigError) else f"{type(exc).__name__}: {exc}"[:200]
                log.warning("mig_step_failed", extra={"node": self.node, "op": step.op, "gpu": step.gpu_index,
                                                      "profile": step.profile, "start": step.start, "reason": reason})
                if step.op == "create" and step.allocation_id in self.live:
                    await self._report_mig(self.live[step.allocation_id], step.profile, step.start, "failed",
                                           None, reason)
        for b in plan.blocked:
            pending = True
            if b.allocation_id is not None and b.allocation_id in self.live:
                await self._report_mig(self.live[b.allocation_id], b.profile, b.start, "failed", None, b.reason)
        return pending

    @staticmethod
    def _gpu_of(alloc: LiveAllocation, profile: str) -> int:
        return next((g.index for g in alloc.gpus if g.mig_profile == profile), alloc.gpus[0].index)

    async def _report_mig(self, alloc: LiveAllocation, profile: str, start: int,
                          action: Literal["created", "destroyed", "failed"], inst: MigInstance | None,
                          reason: str | None = None) -> None:
        """One MigApplied per outcome of an allocation (a failure again only when its reason changes)."""
        if self.mig_reported.get(alloc.allocation_id) == (action, reason):
            return
        if inst is not None:
            self.mig_of[alloc.allocation_id] = inst
        gpu = next((g for g in alloc.gpus if g.mig_profile == profile and g.mig_start == start), alloc.gpus[0])
        event = MigApplied(allocation_id=alloc.allocation_id, job_id=alloc.job_id, team=alloc.team,
                           project=alloc.project, cluster=self.cluster, node=self.node, gpu_uuid=gpu.uuid,
                           gpu_index=gpu.index, profile=profile, start=start, action=action,
                           mig_uuid=inst.uuid if inst else None, reason=reason, applied_at=utcnow())
        if await self._publish(event, f"mig/{alloc.allocation_id}/{action}/{reason}"):
            self.mig_reported[alloc.allocation_id] = (action, reason)

    async def enforce(self) -> None:
        """Every sample: each fraction's processes against its memory limit. Over it: FractionExceeded once per
        (allocation, process), and with policy `stop` the process gets SIGTERM, then SIGKILL after the grace."""
        limits = share_limits(self.live.values())
        if not limits and not self.stopping and not self.fraction_reported:
            return
        try:
            procs = self.gpu_processes()
        except Exception as exc:  # NVML trouble must never stop telemetry
            log.warning("process_listing_failed", extra={"node": self.node, "error": repr(exc)})
            return
        now = time.monotonic()
        for lim, proc in fraction_violations(limits, procs, self.fraction_reported):
            action: Literal["reported", "stopped"] = "reported"
            a = lim.allocation
            if fraction_action(self.fraction_policy, a.kind) == "stop":
                if self.work is not None and self.work.runs(a.allocation_id):
                    # the job's own work: all of it stops, and it ends failed FractionMemoryExceeded (its
                    # allocation is released), never a job left running on a killed process
                    await self.work.stop_over_fraction(a.allocation_id, proc.pid, proc.used_memory_mib or 0,
                                                       lim.limit_mib, self.stop_grace_s)
                    action = "stopped"
                else:
                    try:
                        self.backend.stop_process(proc.pid)
                        self.stopping[proc.pid] = now + self.stop_grace_s
                        action = "stopped"
                    except ProcessLookupError:
                        continue  # it exited on its own
                    except OSError as exc:
                        log.warning("process_stop_failed", extra={"node": self.node, "pid": proc.pid,
                                                                  "error": repr(exc)})
            self.fraction_reported.add((lim.allocation.allocation_id, proc.pid))
            FRACTION_EXCEEDED.labels(action=action).inc()
            log.warning("fraction_exceeded", extra={"node": self.node, "allocation": lim.allocation.allocation_id,
                                                    "pid": proc.pid, "used_mib": proc.used_memory_mib,
                                                    "limit_mib": lim.limit_mib, "action": action})
            await self._publish(FractionExceeded(
                allocation_id=a.allocation_id, job_id=a.job_id, team=a.team, project=a.project, cluster=self.cluster,
                node=self.node, gpu_uuid=lim.gpu_uuid, gpu_index=lim.gpu_index, pid=proc.pid,
                used_mib=proc.used_memory_mib or 0, limit_mib=lim.limit_mib, action=action, detected_at=utcnow()),
                f"fraction/{a.allocation_id}/{proc.pid}/{lim.gpu_uuid}")
        alive = {p.pid for p in procs}
        for pid, deadline in list(self.stopping.items()):
            if pid not in alive:
                del self.stopping[pid]
            elif now >= deadline:
                with contextlib.suppress(ProcessLookupError, OSError):
                    self.backend.stop_process(pid, force=True)
                    PROCESSES_KILLED.inc()
                    log.warning("process_killed", extra={"node": self.node, "pid": pid})
                del self.stopping[pid]
        self.fraction_reported = {k for k in self.fraction_reported if k[1] in alive}

    async def _publish(self, data: EventData, identity: str) -> bool:
        """Directly to JetStream (the agent has no outbox); the id derives from what is reported, so a replay
        within the stream's duplicate window is dropped."""
        event = data.to_cloudevent(SOURCE, event_id=str(uuidlib.uuid5(_EVENT_NS, identity)),
                                   traceparent=current_traceparent())
        try:
            await publish_event(self.js, subject_for(data), event)
            return True
        except Exception as exc:
            log.warning("agent_event_publish_failed", extra={"node": self.node, "type": data.event_type,
                                                             "error": repr(exc)})
            return False

    def _drive_simulation(self) -> None:
        """Simulated processes for the live allocations: a whole GPU's workload, a fraction's or a MIG slice's own
        process (a MIG one once its instance exists). Started once per allocation and GPU (the simulator keeps
        that), so a process that was stopped or emptied by a fault stays so."""
        assert isinstance(self.backend, SimulatedNvml)
        for alloc in self.live.values():
            if self.work is not None and self.work.runs(alloc.allocation_id):
                continue  # real work runs here: its GPUs follow what it really uses (_measure_work)
            kind = self.workloads.get(alloc.kind, "training")
            for g in alloc.gpus:
                limit: float | None = g.memory_mib
                mig_uuid = None
                if g.mig_profile is not None:
                    inst = self.mig_of.get(alloc.allocation_id)
                    if inst is None:
                        continue
                    mig_uuid = inst.uuid
                    p = migcat.profile(g.model, g.mig_profile)
                    limit = p.memory_mib if p else None
                with contextlib.suppress(KeyError, ValueError):
                    self.backend.start_allocation(g.uuid, alloc.allocation_id, kind, share_milli=g.share_milli,
                                                  limit_mib=limit, mig_uuid=mig_uuid)

    def gpu_processes(self) -> list[GpuProcess]:
        """The GPUs' processes, each attributed to an allocation by the executor's cgroups where it runs in one
        (else by its GPUPOOL_ALLOCATION_ID)."""
        procs = self.backend.processes()
        if self.work is None or not procs:
            return procs
        owners: dict[int, str] = {}
        for allocation_id in self.work.executor.running():
            with contextlib.suppress(KeyError, OSError):
                owners.update(dict.fromkeys(self.work.executor.pids(allocation_id), allocation_id))
        return attribute_by_cgroup(procs, owners)

    def _measure_work(self) -> None:
        """Simulated GPUs of allocations that run real work follow that work: a busy CPU core per GPU is a fully
        busy GPU, a sleeping process an idle one, and its resident memory is the GPU memory it uses."""
        assert isinstance(self.backend, SimulatedNvml) and self.work is not None
        running = self.work.executor.running()
        for alloc in self.live.values():
            if alloc.allocation_id not in running:
                continue
            with contextlib.suppress(KeyError, ValueError, OSError):
                cores, rss_mib = self.work.executor.usage(alloc.allocation_id)
                pids = sorted(self.work.executor.pids(alloc.allocation_id))
                per_gpu = len(alloc.gpus) or 1
                for g in alloc.gpus:
                    self.backend.measure(g.uuid, alloc.allocation_id, util_pct=min(100.0, 100.0 * cores / per_gpu),
                                         memory_mib=rss_mib / per_gpu, pid=pids[0] if pids else None)
