"""Reclamation service: follows every live allocation, measures idleness from real telemetry, and takes GPUs back
— idle ones after a warning and a grace period, ones past their declared max runtime, and abnormally: ones on lost
or drained nodes and ones holding a quarantined GPU (requeued by the queue, failed after too many restarts).

Deciding is here; acting is placement's (the only writer of allocations): each decision is an event written with
the tracker's new state (outbox), then a release request to placement, retried every sweep until the release
event arrives. Conditional updates make two replicas of this service decide each case once.
"""

from __future__ import annotations

import contextlib
import logging

from prometheus_client import Counter

from libs.bus.rpc import ServiceUnavailable, request
from libs.contracts import subjects
from libs.contracts.commands import Empty, ReleaseAllocation, Reply, SetReclaimPolicy
from libs.contracts.envelope import CloudEvent, utcnow
from libs.contracts.events import (
    AllocationGranted,
    AllocationReleased,
    GpuHealthChanged,
    NodeCordoned,
    NodeLost,
    ReclaimDecided,
    ReclaimWarned,
    TelemetrySampled,
)
from libs.runtime.loops import every
from libs.runtime.routes import Routes, idempotent, once
from libs.runtime.service import ServiceRuntime
from services.reclamation import store
from services.reclamation.config import ReclamationSettings
from services.reclamation.domain import (
    RECLAIM_REASONS,
    abnormal_release,
    busy_threshold,
    judge,
    observation,
    quarantines,
)

RECLAIMS = Counter("gpupool_reclaims_total", "Allocations reclamation decided to take back, by reason", ["reason"])
for _reason in RECLAIM_REASONS:  # at 0 from the start: a dashboard shows 0 reclaims, not "No data"
    RECLAIMS.labels(reason=_reason)
log = logging.getLogger(__name__)
CONSUMER = "reclamation"


class ReclamationHandlers:
    def __init__(self, runtime: ServiceRuntime, settings: ReclamationSettings) -> None:
        self.rt = runtime
        self.settings = settings
        self.policies: dict = {}

    # --- following allocations and their telemetry ----------------------------------------------------------------
    async def on_allocation_granted(self, event: CloudEvent, data: AllocationGranted) -> None:
        async with self.rt.uow() as uow:
            await store.track(uow.conn, data)

    async def on_allocation_released(self, event: CloudEvent, data: AllocationReleased) -> None:
        async with self.rt.uow() as uow:
            await store.untrack(uow.conn, data.allocation_id)

    async def on_telemetry(self, event: CloudEvent, data: TelemetrySampled) -> None:
        """Idempotent without an inbox: observing the same sample twice leaves the same state. Writes only
        tracker_usage, which nothing but telemetry locks (README: "Batched event handling")."""
        observations = []
        async with self.rt.uow() as uow:
            for tracker in await store.tracked_on_node(uow.conn, data.cluster, data.node):
                threshold = busy_threshold(self.policies.get(tracker["kind"]), self.settings.busy_util_pct)
                seen = observation(data.gpus, tracker["gpu_uuids"], threshold)
                if seen is not None:
                    observations.append((tracker["allocation_id"], *seen))
            await store.observe(uow.conn, data.sampled_at, observations)

    async def on_node_lost(self, event: CloudEvent, data: NodeLost) -> None:
        """A node that went silent holds GPUs nobody can use: take its allocations back (the queue requeues
        restartable jobs, which placement then runs elsewhere)."""
        async with self.rt.uow() as uow:
            for tracker in await store.trackers_on_node(uow.conn, data.cluster, data.node):
                await self._abnormal(uow, tracker, "NodeLost", f"node {data.node} stopped reporting at "
                                                               f"{data.last_seen_at.isoformat()}")
            uow.after_commit(self.release_decided)

    async def on_gpu_health_changed(self, event: CloudEvent, data: GpuHealthChanged) -> None:
        """A quarantined GPU must not keep running work: release every allocation holding it."""
        if not quarantines(data.state, data.current):
            return
        async with self.rt.uow() as uow:
            for tracker in await store.trackers_holding(uow.conn, data.gpu_uuid):
                await self._abnormal(uow, tracker, "GpuQuarantined",
                                     f"GPU {data.gpu_index} on {data.node} was quarantined ({data.reason or 'failed'}"
                                     f"{': ' + ', '.join(data.reasons) if data.reasons else ''})")
            uow.after_commit(self.release_decided)

    async def on_node_cordoned(self, event: CloudEvent, data: NodeCordoned) -> None:
        """A drain takes the node's allocations back; a plain cordon leaves running work alone."""
        if not data.drain:
            return
        async with self.rt.uow() as uow:
            for tracker in await store.trackers_on_node(uow.conn, data.cluster, data.node):
                await self._abnormal(uow, tracker, "Drained", f"node {data.node} is being drained"
                                                              f"{' (' + data.reason + ')' if data.reason else ''}")
            uow.after_commit(self.release_decided)

    async def _abnormal(self, uow, tracker, cause: str, message: str) -> None:  # type: ignore[no-untyped-def]
        """Decide an abnormal reclaim, counting the job's attempts: requeued with the cause as reason, or failed
        with RestartLimitReached once it has been restarted `max_abnormal_restarts` times."""
        if tracker["reclaim_reason"]:
            return  # already being taken back
        attempt = await store.abnormal_count(uow.conn, tracker["job_id"]) + 1
        reason, message = abnormal_release(cause, message, attempt, self.settings.max_abnormal_restarts)
        if await self._decide(uow, tracker, reason, message, attempt=attempt):
            await store.count_abnormal(uow.conn, tracker["job_id"], utcnow())

    # --- the sweep ------------------------------------------------------------------------------------------------
    async def sweep_loop(self) -> None:
        await every(self.settings.sweep_interval_s, self.sweep, log=log, failure="reclaim_sweep_failed")

    async def sweep(self) -> None:
        now = utcnow()
        async with self.rt.pool.acquire() as conn:
            self.policies = await store.policies(conn)
            await store.prune_usage(conn)
            trackers = await store.all_trackers(conn)
        for tracker in trackers:
            verdict = judge(tracker, self.policies.get(tracker["kind"]), now)
            if verdict.action == "none":
                continue
            async with self.rt.uow() as uow:
                if verdict.action == "clear":
                    await store.clear_warning(uow.conn, tracker["allocation_id"])
                elif verdict.action == "warn":
                    assert verdict.deadline is not None
                    if await store.mark_warned(uow.conn, tracker["allocation_id"], now, verdict.deadline):
                        idle_s = (tracker["last_sample_at"] - tracker["last_busy_at"]).total_seconds()
                        await uow.emit(ReclaimWarned(
                            allocation_id=tracker["allocation_id"], job_id=tracker["job_id"], team=tracker["team"],
                            reason=verdict.reason, message=verdict.message, idle_s=idle_s, deadline=verdict.deadline))
                        log.info("reclaim_warned", extra={"job_id": tracker["job_id"], "idle_s": round(idle_s)})
                elif verdict.action == "reclaim":
                    await self._decide(uow, tracker, verdict.reason, verdict.message)
        await self.release_decided()

    async def _decide(self, uow, tracker, reason: str, message: str,  # type: ignore[no-untyped-def]
                      attempt: int | None = None) -> bool:
        if await store.mark_reclaiming(uow.conn, tracker["allocation_id"], reason):
            RECLAIMS.labels(reason=reason).inc()
            await uow.emit(ReclaimDecided(allocation_id=tracker["allocation_id"], job_id=tracker["job_id"],
                                          team=tracker["team"], node=tracker["node"], reason=reason,
                                          message=message, decided_at=utcnow(), attempt=attempt))
            log.warning("reclaim_decided", extra={"job_id": tracker["job_id"], "reason": reason,
                                                  "attempt": attempt})
            return True
        return False

    async def release_decided(self) -> None:
        """Ask placement to release everything decided and not yet released (retried each sweep). Event handlers
        run it after their commit (`uow.after_commit`): it reads through its own connection and calls placement,
        so inside a batch it would neither see the batch's decisions nor leave the batch's locks alone."""
        async with self.rt.pool.acquire() as conn:
            pending = await store.reclaiming(conn)
        for row in pending:
            with contextlib.suppress(ServiceUnavailable):
                reply = await request(self.rt.nc, subjects.CMD_PLACEMENT_RELEASE_ALLOCATION, ReleaseAllocation(
                    allocation_id=row["allocation_id"], reason=row["reclaim_reason"]), timeout=5.0)
                gone = not reply.ok and reply.error is not None and reply.error.status == 404
                # released already (at 1,024 nodes, 43 trackers of allocations released with a NodeLost early in
                # start-up outlived them): kept, each would be asked for again after every event handled, for ever
                released = reply.ok and isinstance(reply.result, dict) and reply.result.get("released") == 0
                if gone or released:
                    async with self.rt.pool.acquire() as conn:
                        await store.untrack(conn, row["allocation_id"])

    # --- requests -------------------------------------------------------------------------------------------------
    async def list_tracked(self, _: Empty) -> Reply:
        async with self.rt.pool.acquire() as conn:
            rows = await store.all_trackers(conn)
        items = []
        for r in rows:
            idle_s = ((r["last_sample_at"] or utcnow()) - r["last_busy_at"]).total_seconds()
            items.append({
                **{k: r[k] for k in ("allocation_id", "job_id", "team", "cluster", "node", "kind", "mean_util_pct",
                                     "max_util_pct", "reclaim_reason")},
                "gpu_uuids": list(r["gpu_uuids"]), "granted_at": r["granted_at"].isoformat(),
                "last_busy_at": r["last_busy_at"].isoformat(), "idle_s": idle_s,
                "warned_at": r["warned_at"].isoformat() if r["warned_at"] else None,
                "reclaim_deadline": r["reclaim_deadline"].isoformat() if r["reclaim_deadline"] else None})
        return Reply.success({"items": items, "next": None})

    async def list_policies(self, _: Empty) -> Reply:
        async with self.rt.pool.acquire() as conn:
            rows = await store.policies(conn)
        return Reply.success({"items": [{**{k: v for k, v in dict(r).items() if k != "updated_at"},
                                         "updated_at": r["updated_at"].isoformat()}
                                        for r in rows.values()], "next": None})

    async def set_policy(self, cmd: SetReclaimPolicy) -> Reply:
        async with self.rt.pool.acquire() as conn:
            before, after = await store.set_policy(conn, cmd)
            self.policies = await store.policies(conn)
        return Reply.success({"before": dict(before) if before else None, "after": dict(after)})


def routes(h: ReclamationHandlers) -> Routes:
    return Routes(
        inbox=CONSUMER,
        commands={
            subjects.QUERY_RECLAMATION_LIST_TRACKED: (Empty, h.list_tracked),
            subjects.QUERY_RECLAMATION_POLICIES: (Empty, h.list_policies),
            subjects.CMD_RECLAMATION_SET_POLICY: (SetReclaimPolicy, h.set_policy),
        },
        events={
            AllocationGranted: once(h.on_allocation_granted),
            AllocationReleased: once(h.on_allocation_released),
            NodeLost: once(h.on_node_lost),
            GpuHealthChanged: once(h.on_gpu_health_changed),
            NodeCordoned: once(h.on_node_cordoned),
        },
        telemetry=idempotent(h.on_telemetry, "observing the same sample twice leaves the same utilisation state"),
        # event and telemetry handlers are single units of work; the release RPC waits for the commit
        # (README: "Batched event handling")
        batched=True,
    )
