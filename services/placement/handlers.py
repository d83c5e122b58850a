"""Placement service: keeps a read model of nodes and pending jobs from events, runs the scheduling cycle on the
pure core, and commits each placement with its AllocationGranted event in one transaction."""

from __future__ import annotations

import asyncio
import contextlib
import gzip
import hashlib
import json
import logging
import time
from collections import defaultdict
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

from libs.bus.lease import LeaderLease
from libs.bus.rpc import ServiceUnavailable, request
from libs.contracts import subjects
from libs.contracts.commands import (
    Empty,
    GetDecision,
    GetPool,
    JobRef,
    ListAllocations,
    ListDecisions,
    ReleaseAllocation,
    Reply,
)
from libs.contracts.envelope import CloudEvent, utcnow, uuid7
from libs.contracts.events import (
    AllocationGangReady,
    AllocationGranted,
    AllocationPreempting,
    AllocationReleased,
    EndpointReady,
    EndpointUnready,
    GpuHealthChanged,
    GpuSharingSet,
    JobCancelled,
    JobCompleted,
    JobScaled,
    JobSubmitted,
    JobWorkUpdated,
    NodeCordoned,
    NodeLost,
    NodeRecovered,
    NodeRegistered,
    NodeUncordoned,
    PriorityClassSet,
    QuotaSet,
    TeamCreated,
    WorkExited,
    WorkReady,
)
from libs.contracts.work import WorkExit, WorkSpec
from libs.core import NormalizeMemo, PendingReason, Placement, Preemption
from libs.observability.metrics import (
    PENDING_UNITS,
    SCHEDULING_CYCLE_PART_SECONDS,
    SCHEDULING_CYCLE_SECONDS,
    SCHEDULING_DECISIONS,
)
from libs.observability.tracing import extract_context, tracer
from libs.runtime.loops import every
from libs.runtime.routes import Routes, idempotent, once
from libs.runtime.service import ServiceRuntime
from services.placement import store
from services.placement.cache import KeptScheduler
from services.placement.config import PlacementSettings
from services.placement.domain import (
    RELEASE_AT_ONCE,
    RendezvousPorts,
    RequestBuilder,
    SnapshotMemo,
    allocated_gpus,
    backoff_reasons,
    build_policy,
    build_snapshot,
    decided_cycle,
    gang_ready,
    gang_start_due,
    gather_wait,
    on_work_end,
    order_still_holds,
    replica_back_off,
    split_unit,
    workload_environment,
)
from services.placement.encoder import DecisionEncoder
from services.placement.fragmentation import Fragmentation
from services.placement.incremental import LiveTally, PoolFacts, WantedJobs
from services.placement.queries import PlacementQueries
from services.placement.reasons import ReasonRows, Written, same_reasons
from services.placement.recording import DeltaRecorder
from services.placement.reporting import report_holdings, report_plan
from services.placement.rollouts import Rollouts

log = logging.getLogger(__name__)
CONSUMER = "placement"
# the policy read model needs no inbox: its rows carry the quota service's revisions and the newer one wins
POLICY_WHY = "revision-guarded upsert: a replayed or older policy event never replaces a newer row"
PRUNE_EVERY = 50  # decisions beyond the retention are deleted every this many records (a busy queue records often)
COUNT_EVERY_S = 1.0  # how often a cycle's read counts the rows its kept copies should hold (`store.load_state`)


class PlacementHandlers(PlacementQueries):
    def __init__(self, runtime: ServiceRuntime, settings: PlacementSettings, lease: LeaderLease | None = None) -> None:
        self.rt = runtime
        self.settings = settings
        self.lease = lease
        self._kick = asyncio.Event()
        self._last_reasons: tuple[PendingReason, ...] | None = None  # those of the last recorded decision
        self._reasons = ReasonRows()  # what this replica wrote for `explain`
        self._order_written: tuple[str, ...] | None = None  # the queue order last written (None: not known)
        self._recorded = 0
        self._encoder = DecisionEncoder()
        self._recorder = DeltaRecorder()  # each recorded decision as a delta against a keyframe
        self._wanted = WantedJobs()  # the wanted jobs as the last cycle read them (only changes are read again)
        self._live = WantedJobs("allocation_id")  # the live allocations, the same way
        self._tally = LiveTally()  # what the cycle derives from them, kept up to date with their changes
        self._counted_at = -COUNT_EVERY_S  # when a cycle's read last counted the rows its copies should hold
        self._pool = WantedJobs("key")  # the nodes with their GPUs, the same way
        self._pool_facts = PoolFacts()  # what the cycle derives from the GPUs, while they do not change
        self._requests = RequestBuilder()
        self._normalized = NormalizeMemo()  # the core's normalised requests (RequestBuilder keeps their objects)
        self._scheduler = KeptScheduler()  # the core's Scheduler, kept between committed cycles (cache.py)
        self._snapshots = SnapshotMemo()  # the snapshot's objects of unchanged rows, reused
        # the earliest preemption deadline the last cycle saw (None: none; False: not known yet)
        self._next_deadline: Any = False
        self._gang_due: Any = None  # when the earliest gang still waiting for its members runs out of time
        self._tracer = tracer("gpupool.placement")
        self.phases: dict[str, float] = {}  # the last cycle's seconds per phase (load, build, core, store)
        self.rollouts = Rollouts(self)
        self.fragmentation = Fragmentation(self)

    async def _wake(self) -> None:
        """Wake the scheduling loop once a change is committed (inside a consumer's batch transaction, after the
        batch's commit: a cycle started sooner would not see it). A follower wakes the leader too: replicas share
        one durable consumer, so the leader does not see the events a follower applied."""
        self._kick.set()
        if self.lease is not None and not self.lease.is_leader:
            try:
                await self.rt.nc.publish(subjects.PLACEMENT_WAKE, b"")
            except Exception as exc:  # the leader's interval cycle still comes
                log.warning("leader_wake_failed", extra={"error": repr(exc)})

    async def on_leader_wake(self, _msg: Any) -> None:
        """Another replica committed a change: the leader schedules now, not at its next interval."""
        if self.lease is None or self.lease.is_leader:
            self.rollouts.active = None  # a follower may have started one: look again
            self._kick.set()

    # --- events that change the read model --------------------------------------------------------------------
    async def on_node_registered(self, event: CloudEvent, data: NodeRegistered) -> None:
        async with self.rt.uow() as uow:
            uow.after_commit(self._wake)
            await store.upsert_node(uow.conn, data)

    async def on_node_lost(self, event: CloudEvent, data: NodeLost) -> None:
        """Stop placing on a node that stopped reporting. Its allocations stay as they are: releasing them is
        reclamation's decision, not a side effect of a missed heartbeat."""
        async with self.rt.uow() as uow:
            await store.set_node_schedulable(uow.conn, data.cluster, data.node, False)

    async def on_node_recovered(self, event: CloudEvent, data: NodeRecovered) -> None:
        """Back, and schedulable again unless an operator cordoned it meanwhile (inventory says which)."""
        async with self.rt.uow() as uow:
            uow.after_commit(self._wake)
            await store.set_node_schedulable(uow.conn, data.cluster, data.node, not data.cordoned)

    async def on_node_cordoned(self, event: CloudEvent, data: NodeCordoned) -> None:
        """No new work on a cordoned (or draining) node; taking its allocations back is reclamation's part."""
        async with self.rt.uow() as uow:
            await store.set_node_schedulable(uow.conn, data.cluster, data.node, False)

    async def on_node_uncordoned(self, event: CloudEvent, data: NodeUncordoned) -> None:
        """Schedulable again only if the node is also reporting (an uncordoned lost node waits to recover)."""
        async with self.rt.uow() as uow:
            uow.after_commit(self._wake)
            await store.set_node_schedulable(uow.conn, data.cluster, data.node, data.node_state == "ready")

    async def on_gpu_health_changed(self, event: CloudEvent, data: GpuHealthChanged) -> None:
        async with self.rt.uow() as uow:
            uow.after_commit(self._wake)
            await store.set_gpu_health(uow.conn, data.gpu_uuid, data.current)

    async def on_gpu_sharing_set(self, event: CloudEvent, data: GpuSharingSet) -> None:
        """New placements follow the new mode; what is held stays where it is (never moved). A GPU announced as
        draining to another mode takes no new work until inventory announces the switch."""
        async with self.rt.uow() as uow:
            uow.after_commit(self._wake)
            if not await store.set_gpu_sharing(
                    uow.conn, data.gpu_uuid, data.mode, data.draining_to is not None):
                log.warning("sharing_for_unknown_gpu", extra={"gpu_uuid": data.gpu_uuid, "node": data.node})

    async def on_job_submitted(self, event: CloudEvent, data: JobSubmitted) -> None:
        async with self.rt.uow() as uow:
            uow.after_commit(self._wake)
            await store.add_pending(uow.conn, data, event.traceparent)

    async def on_job_completed(self, event: CloudEvent, data: JobCompleted) -> None:
        await self._job_finished(event, data.job_id, "JobCompleted", data.completed_at)

    async def on_job_cancelled(self, event: CloudEvent, data: JobCancelled) -> None:
        await self._job_finished(event, data.job_id, "JobCancelled", data.cancelled_at)

    async def _job_finished(self, event: CloudEvent, job_id: str, reason: str, at) -> None:
        async with self.rt.uow() as uow:
            released, stopping = await self._release(uow, job_id, reason, at, finished=True)  # never wanted again
            if released or not stopping:  # work asked to stop frees its GPUs later (`on_work_exited` wakes then)
                uow.after_commit(self._wake)

    async def on_job_scaled(self, event: CloudEvent, data: JobScaled) -> None:
        """More replicas: the missing ones become pending units. Fewer: the highest-numbered ones go."""
        async with self.rt.uow() as uow:
            uow.after_commit(self._wake)
            wanted = await store.set_replicas(uow.conn, data.job_id, data.replicas, data.replica_set)
            if wanted is None:
                return
            await self._release(uow, data.job_id, "ScaledDown", utcnow(), min_replica=wanted)
            await store.refresh_satisfied(uow.conn, data.job_id)

    async def _release(self, uow, job_id: str, reason: str, at, **which) -> tuple[int, int]:  # type: ignore[no-untyped-def]
        """Release the job's live allocations (or `which` of them) with their events, in the caller's unit of
        work. Allocations that run work are not released here but asked to stop (`_stop`): their GPUs go back
        when the agent reports the work's cgroup empty (`on_work_exited`), unless the node is gone. Returns
        (allocations released, allocations asked to stop)."""
        stopping: list = []
        if reason in RELEASE_AT_ONCE:
            released = await store.release(uow.conn, job_id, reason, at, **which)
        else:  # in one statement: those without work released, those with work asked to stop
            released, stopping = await store.release_or_stop(uow.conn, job_id, reason, at,
                                                             max_grace_s=self.settings.max_stop_grace_s, **which)
            await self._announce_stopping(uow, job_id, reason, stopping)
        await self._announce_releases(uow, job_id, reason, released)
        return len(released), len(stopping)

    async def _announce_releases(self, uow, job_id: str, reason: str, released, exit: WorkExit | None = None,  # type: ignore[no-untyped-def]
                                 remaining: int | None = None) -> None:
        for alloc, gpus in released:
            await uow.emit(AllocationReleased(
                allocation_id=alloc["allocation_id"], job_id=job_id, replica=alloc["replica"], team=alloc["team"],
                project=alloc["project"], cluster=alloc["cluster"], node=alloc["node"],
                gpus=gpus, granted_at=alloc["granted_at"], released_at=alloc["released_at"], reason=reason,
                exit=exit, remaining=remaining))
            log.info("allocation_released", extra={"job_id": job_id, "allocation_id": alloc["allocation_id"],
                                                    "replica": alloc["replica"], "reason": reason})

    async def _stop(self, uow, job_id: str, reason: str, at, **which) -> int:  # type: ignore[no-untyped-def]
        """Ask the agent to stop the work of the job's live allocations (`which` of them): the stop signal now,
        the kill at the deadline. Announced as the checkpoint signal a preemption sends."""
        which = {k: v for k, v in which.items() if k in ("replica", "min_replica", "allocation_id")}
        stopping = await store.request_stop(uow.conn, job_id, reason, at,
                                            max_grace_s=self.settings.max_stop_grace_s, **which)
        return await self._announce_stopping(uow, job_id, reason, stopping)

    async def _announce_stopping(self, uow, job_id: str, reason: str, stopping) -> int:  # type: ignore[no-untyped-def]
        for alloc, gpus in stopping:
            await uow.emit(AllocationPreempting(
                allocation_id=alloc["allocation_id"], job_id=job_id, replica=alloc["replica"], team=alloc["team"],
                project=alloc["project"], cluster=alloc["cluster"], node=alloc["node"], gpus=gpus,
                reason=reason, message=f"stopping the work: {reason}", preemptor_job_id="",
                deadline=alloc["preempt_deadline"]))
            log.info("work_stop_requested", extra={"job_id": job_id, "allocation_id": alloc["allocation_id"],
                                                    "reason": reason,
                                                    "deadline": alloc["preempt_deadline"].isoformat()})
        return len(stopping)

    async def on_work_exited(self, event: CloudEvent, data: WorkExited) -> None:
        """The agent says the allocation's work ended and its cgroup is empty: now its GPUs may go back. The
        release carries the exit; a failed gang member stops the others (domain.on_work_end)."""
        async with self.rt.uow() as uow:
            alloc = await store.work_allocation(uow.conn, data.allocation_id)
            if alloc is None or alloc["released_at"] is not None:
                return  # unknown, or released already (its node was lost, or a report timed out): nothing freed
            uow.after_commit(self._wake)
            end = on_work_end(stop_reason=alloc["preempt_reason"], exit_reason=data.exit.reason,
                              gang_nodes=alloc["gang_nodes"])
            released = await store.release(uow.conn, data.job_id, end.reason, utcnow(),
                                           allocation_id=data.allocation_id, exit=data.exit.model_dump_json())
            if end.stop_others:
                await self._stop(uow, data.job_id, "GangMemberFailed", utcnow())
            remaining = await store.live_count(uow.conn, data.job_id)
            await self._announce_releases(uow, data.job_id, end.reason, released, exit=data.exit,
                                          remaining=remaining)
            # a replica of a service is wanted back (after its crash-loop back-off, if it failed); a single job or
            # gang only if the queue restarts it
            await store.refresh_satisfied(uow.conn, data.job_id, after_release=True)
            if end.reason == "WorkFailed":
                await self._back_off(uow, data)

    async def on_work_ready(self, event: CloudEvent, data: WorkReady) -> None:
        """A gang member's grant is applied on its node. Once every member is, each gets `allocation.gang_ready`
        (in this transaction) and its agent starts the work: the gang's members start together."""
        async with self.rt.uow() as uow:
            members = await store.gang_members(uow.conn, data.allocation_id)
            mine = next((m for m in members if m["allocation_id"] == data.allocation_id), None)
            if mine is None or not mine["gang_wait"] or mine["attempt"] != data.attempt:
                return  # released, started already, or an older attempt's
            await store.mark_ready(uow.conn, data.allocation_id, data.ready_at)
            members = [{**dict(m), "ready_at": data.ready_at} if m is mine else dict(m) for m in members]
            if not gang_ready(members, mine["gang_nodes"]):
                return
            now = utcnow()
            held = await store.start_gang(uow.conn, [m["allocation_id"] for m in members])
            for m, gpus in zip(members, held, strict=True):
                await uow.emit(AllocationGangReady(
                    allocation_id=m["allocation_id"], job_id=m["job_id"], replica=m["replica"], team=m["team"],
                    project=m["project"], cluster=m["cluster"], node=m["node"], gpus=gpus, attempt=m["attempt"],
                    members=len(members), ready_at=now))
            log.info("gang_ready", extra={"job_id": data.job_id, "members": len(members)})

    async def on_endpoint(self, event: CloudEvent, data: EndpointReady | EndpointUnready) -> None:
        """A replica's agent says where it serves and whether it is ready: kept with its allocation (for
        `GET /v1/jobs/{id}/endpoints`). Only the agent of the allocation's node is believed."""
        async with self.rt.uow() as uow:
            ready = isinstance(data, EndpointReady)
            if not await store.set_endpoint(uow.conn, data.allocation_id, data.cluster, data.node, url=data.url,
                                            ports=data.ports, ready=ready, at=data.at,
                                            reason="" if ready else data.reason):  # type: ignore[union-attr]
                log.info("endpoint_not_recorded", extra={"allocation_id": data.allocation_id, "node": data.node})
            elif self.rollouts.active is not False:
                uow.after_commit(self._wake)  # a rollout waits on readiness

    async def release_unstarted_gangs(self) -> int:
        """A gang whose members were not all ready within GANG_START_TIMEOUT_S of the grant is released whole
        (its waiting members are stopped before they start) with reason GangStartTimeout: the queue requeues it,
        and its GPUs are not held by members that wait for one that will not come."""
        now = utcnow()
        async with self.rt.pool.acquire() as conn:
            jobs = await store.unstarted_gangs(conn, now - timedelta(seconds=self.settings.gang_start_timeout_s))
        for job_id in jobs:
            async with self.rt.uow() as uow:
                log.warning("gang_start_timed_out", extra={"job_id": job_id,
                                                            "timeout_s": self.settings.gang_start_timeout_s})
                await self._release(uow, job_id, "GangStartTimeout", now)
        self._gang_due = None  # the next cycle computes it again
        if jobs:
            self._kick.set()
        return len(jobs)

    async def _back_off(self, uow, data: WorkExited) -> None:  # type: ignore[no-untyped-def]
        """A replica of a replicated job failed: the job's next placement waits (domain.replica_back_off)."""
        wanted = await store.replica_failures(uow.conn, data.job_id)
        if wanted is None or not wanted[0]:
            return
        failures, delay = replica_back_off(wanted[1], data.exit.wall_s)
        await store.back_off(uow.conn, data.job_id, failures, utcnow() + timedelta(seconds=delay))
        log.warning("replica_back_off", extra={"job_id": data.job_id, "replica": data.replica,
                                                "failures": failures, "delay_s": delay,
                                                "exit_reason": data.exit.reason})

    # --- the policy, learned from the quota service ----------------------------------------------------------
    async def on_team_created(self, event: CloudEvent, data: TeamCreated) -> None:
        async with self.rt.uow() as uow:
            uow.after_commit(self._wake)
            await store.upsert_team(uow.conn, data.team, data.org, data.revision)  # revision-guarded: idempotent

    async def on_quota_set(self, event: CloudEvent, data: QuotaSet) -> None:
        async with self.rt.uow() as uow:
            uow.after_commit(self._wake)
            await store.upsert_quota(uow.conn, data)

    async def on_priority_class_set(self, event: CloudEvent, data: PriorityClassSet) -> None:
        async with self.rt.uow() as uow:
            uow.after_commit(self._wake)
            await store.upsert_priority_class(uow.conn, data)

    async def reconcile_forever(self) -> None:
        """Reconcile at start and then every `policy_reconcile_s`: a row a forged event put in (one past every
        revision the quota service handed out) is repaired from the owner's own answer within that time."""
        await every(self.settings.policy_reconcile_s, self.reconcile_policy, log=log, failure="policy_reconcile_failed")

    async def reconcile_policy(self) -> None:
        """Catch up with the quota service's whole policy (events keep it current in between). Rows carry
        revisions, so this never overwrites something newer learned from an event, except a row whose revision
        the quota service never handed out: that is a forgery, dropped for the owner's answer."""
        delay = 0.5
        while True:
            try:
                reply = await request(self.rt.nc, subjects.QUERY_QUOTA_POLICY, Empty(), timeout=5.0)
                if reply.ok:
                    break
            except ServiceUnavailable:
                pass
            log.info("policy_reconcile_retry", extra={"retry_in_s": delay})
            await asyncio.sleep(delay)
            delay = min(10.0, delay * 2)
        doc = reply.result
        async with self.rt.uow() as uow:
            if doc.get("revision_max") is not None:
                dropped = await store.drop_policy_beyond(uow.conn, int(doc["revision_max"]))
                if dropped:
                    log.warning("forged_policy_dropped", extra={"rows": dropped,
                                                                "revision_max": doc["revision_max"]})
            for t in doc["teams"]:
                await store.upsert_team(uow.conn, t["team"], t["org"], t["revision"])
            for q in doc["quotas"]:
                await store.upsert_quota(uow.conn, QuotaSet(
                    path=q["path"], gpu_model=q["gpu_model"], guaranteed=q["guaranteed"],
                    borrowing_limit=q["borrowing_limit"], lending_limit=q["lending_limit"], weight=q["weight"],
                    revision=q["revision"], set_at=utcnow()))
            for c in doc["priority_classes"]:
                await store.upsert_priority_class(uow.conn, PriorityClassSet(
                    name=c["name"], value=c["value"], preemptible=c["preemptible"],
                    min_runtime_s=c["min_runtime_s"], revision=c["revision"], set_at=utcnow()))
        self._kick.set()

    # --- the scheduling cycle ----------------------------------------------------------------------------------
    async def scheduling_loop(self) -> None:
        took = 0.0
        while True:
            busy = self._kick.is_set()  # a change came in while the last cycle ran
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(self._kick.wait(), timeout=self.settings.cycle_interval_s)
            # let the events of a burst gather: one cycle for many of them instead of one each (`gather_wait`)
            await asyncio.sleep(gather_wait(busy, took, self.settings.cycle_gather_s, self.settings.cycle_gather_max_s))
            self._kick.clear()
            if self.lease is not None and not self.lease.is_leader:
                took = 0.0
                # What this replica remembers writing is stale once another one leads (it may place, requeue and
                # reset reasons meanwhile): forget it, so the first cycle after taking the lease back writes all.
                self._reasons.forget()
                self._last_reasons, self._order_written = None, None
                self._scheduler.forget()  # and its scheduler: a new leader builds from the store
                self._recorder.forget()  # and its keyframe: the next record is one
                continue  # a follower keeps its read model current and waits for the lease
            started = time.perf_counter()
            try:
                if self._next_deadline is False or (self._next_deadline is not None
                                                    and self._next_deadline <= utcnow()):
                    await self.release_due_preemptions()
                if self._gang_due is not None and self._gang_due <= utcnow():
                    await self.release_unstarted_gangs()
                await self.run_cycle()
                await self.rollouts.advance()
            except asyncio.CancelledError:
                raise
            except Exception:
                log.exception("scheduling_cycle_failed")
                self._order_written = None  # rolled back with the cycle
                self._scheduler.forget()
                self._recorder.forget()
                await asyncio.sleep(0.5)
            took = time.perf_counter() - started

    async def run_cycle(self) -> int:
        started = time.perf_counter()
        placed = await self._cycle()
        if placed >= 0:
            SCHEDULING_CYCLE_SECONDS.labels(policy=self.settings.policy).observe(time.perf_counter() - started)
            for key, seconds in self.phases.items():
                SCHEDULING_CYCLE_PART_SECONDS.labels(part=key[:-2]).observe(seconds)
        return max(placed, 0)

    async def _cycle(self) -> int:
        """Snapshot → core.schedule → apply, in one transaction: the snapshot is one statement, the placements are
        written together (a unit the store refuses is rolled back alone, see `_apply_units`), then the changed
        pending reasons and the decision. The database constraints are the verifier: a stale placement is refused
        whole, never double-allocated. Returns the units placed, or -1 when there was nothing to schedule."""
        t0 = time.perf_counter()
        async with self.rt.uow() as uow:
            counted = time.monotonic() - self._counted_at >= COUNT_EVERY_S  # (a scan of each table: not each cycle)
            state = await store.load_state(uow.conn, self._wanted, self._live, self._pool, counted)
            if counted:
                self._counted_at = time.monotonic()
            t1 = time.perf_counter()
            nodes, gpus, running = state["nodes"], state["gpus"], state["running"]
            # the replicas each job holds, the earliest preemption deadline, and the units whose victims are
            # still checkpointing: those wait for them instead of choosing more victims
            self._tally.update(self._live)
            live, self._next_deadline, waiting = self._tally.facts()
            self._gang_due = gang_start_due(running, self.settings.gang_start_timeout_s)
            report_holdings(self._tally, state["quotas"], state["teams"])
            # a replicated job in its crash-loop back-off waits (its reason says so)
            now_at = utcnow()
            backing_off = {r["job_id"]: r for r in state["pending"]
                           if r["not_before"] is not None and r["not_before"] > now_at}
            ready = [r for r in state["pending"] if r["job_id"] not in backing_off] if backing_off else state["pending"]
            self._pool_facts.update(gpus, self._pool.changed)
            requests = [q for q in self._requests.build(ready, live, self._pool_facts.offered,
                                                        self.settings.dev_fraction_milli,
                                                        self.settings.dev_gpu_memory_mib)
                        if q.job_id not in waiting]
            if not requests:
                PENDING_UNITS.clear()
                if backing_off:  # nothing else to place: still say why these wait
                    rows = self._reasons.rows((), (), None, backoff_reasons(backing_off))
                    await self._write_reasons(uow, rows)
                    self._reasons.written.update(rows)
                await self._write_order(uow, ())
                return -1
            policy = build_policy(self.settings.policy, state["classes"], state["quotas"], state["teams"],
                                  self.settings.min_runtime_s, self.settings.fair_share_half_life_s)
            snapshot, now = build_snapshot(nodes, gpus, running, state["usage"], self._snapshots), time.time()
            with self._tracer.start_as_current_span("scheduling cycle", attributes={
                    "gpupool.pending_units": len(requests), "gpupool.nodes": len(nodes)}) as span:
                # in a worker thread: the core is pure Python and holds the GIL, but the event loop gets its turns
                # (the outbox relay, the consumers) instead of waiting out a long cycle at fleet size
                plan = await asyncio.to_thread(self._scheduler.plan, snapshot, requests, policy, now,
                                               time.perf_counter, self._normalized)
                span.set_attribute("gpupool.placements", len(plan.placements))
                span.set_attribute("gpupool.preemptions", len(plan.preemptions))
            t2 = time.perf_counter()
            if plan.preemptions:
                await self.start_preemptions(plan.preemptions)
            units: dict[str, list[Placement]] = defaultdict(list)
            for p in plan.placements:
                units[p.job_id].append(p)
            written = await self._apply_units(uow, units, self._pool_facts.models,
                                              {r["job_id"]: r["traceparent"] for r in state["pending"]},
                                              RendezvousPorts.of(nodes, running, self.settings.rendezvous_range())
                                              ) if units else []
            applied = {u.unit for u in written}
            report_plan(plan)
            reasons = self._reasons.rows(plan.pending, requests, snapshot.nodes, backoff_reasons(backing_off))
            await self._write_reasons(uow, reasons)  # for `explain`
            await self._write_order(uow, self._reasons.order, applied)  # `queue_order(plan.pending)`
            recorded = await self._record_decision(uow, snapshot, requests, policy, now, plan, applied,
                                                   state["policy_revision"])
        # committed: remember what is now in the store
        self._scheduler.committed()
        build = self._scheduler.build_s
        self.phases = {"load_s": t1 - t0, "build_s": build, "core_s": t2 - t1 - build,
                       "store_s": time.perf_counter() - t2}
        self._reasons.committed(reasons)
        if recorded is not None:
            self._last_reasons = recorded
            self._encoder.turn()
            self._recorder.committed()
        for u in written:
            SCHEDULING_DECISIONS.labels(outcome="placed").inc()
            log.info("job_placed", extra={"job_id": u.job_id, "allocation_ids": [a[0] for a in u.allocations],
                                          "nodes": sorted({a[6] for a in u.allocations})})
        return len(applied)

    async def _write_reasons(self, uow, rows: dict[str, Written]) -> None:  # type: ignore[no-untyped-def]
        """Write only the pending reasons (and their facts, JSON) that changed since this replica last wrote them
        (`ReasonRows`): a backlog keeps the same reasons cycle after cycle. In one statement."""
        changed = self._reasons.changed(rows)
        if changed:
            await store.record_pending_reasons(uow.conn, changed)

    async def _write_order(self, uow, order: tuple[str, ...], placed: set[str] | None = None) -> None:  # type: ignore[no-untyped-def]
        """Keep the order this cycle tried the waiting jobs in (explain's position), when it changed other than by
        jobs leaving (`order_still_holds`; `placed`: units this cycle placed). A cycle that fails after this
        forgets what was written (`scheduling_loop`), so the next one writes it again."""
        wanted, jobs = self._wanted.rows, {split_unit(u)[0] for u in placed or ()}
        if order != self._order_written and not order_still_holds(
                self._order_written, order, lambda j: j in wanted and j not in jobs):
            await store.record_queue_order(uow.conn, order)
            self._order_written = order

    async def _record_decision(self, uow, snapshot, requests, policy, now: float, plan, applied: set[str],  # type: ignore[no-untyped-def]
                               policy_revision: int | None) -> tuple[PendingReason, ...] | None:
        """Publish what the cycle decided with the versions it read, and keep its whole input so the cycle can be
        scheduled again (in the cycle's transaction: recorded exactly when its placements commit). A cycle that
        only repeats the previous one's reasons is not recorded (an idle queue would otherwise write one every
        tick; compared as `codec.reasons_digest` would: job, reason and message, in order). Returns the reasons
        recorded, None if nothing was."""
        if not plan.placements and not plan.preemptions and same_reasons(plan.pending, self._last_reasons):
            return None
        parts = {"input": self._encoder.input_parts(snapshot, requests, policy, now),
                 "plan": self._encoder.plan_parts(plan)}
        cycle_id = uuid7()
        decided = decided_cycle(cycle_id, utcnow(), policy.name, snapshot, len(requests), plan, applied,
                                policy_revision, (hashlib.sha256(parts["input"].text().encode()).hexdigest(),
                                                  self._encoder.plan_digest(plan)))
        base_id, record = self._recorder.record(cycle_id, parts)
        await store.record_decision(
            uow.conn, cycle_id=cycle_id, decided_at=decided.decided_at, policy=policy.name,
            input_digest=decided.input_digest, plan_digest=decided.plan_digest,
            record_gz=gzip.compress(record.encode(), compresslevel=1), base_id=base_id,
            summary=decided.model_dump_json(),
            keep=self.settings.decision_retention if self._recorded % PRUNE_EVERY == 0 else None)
        await uow.emit(decided)
        self._recorded += 1
        return plan.pending

    async def start_preemptions(self, preemptions: tuple[Preemption, ...]) -> None:
        """Decide was the core's job; acting is ours: each victim gets the checkpoint signal now and loses its GPUs
        at the deadline (or sooner, if it completes). A gang is preempted whole."""
        deadline = utcnow() + timedelta(seconds=self.settings.preemption_grace_s)
        for v in preemptions:
            job_id, replica = split_unit(v.job_id)
            async with self.rt.uow() as uow:
                started = await store.start_preemption(uow.conn, job_id, replica, deadline=deadline,
                                                       reason=v.reason, preemptor=v.preemptor)
                for alloc, alloc_gpus in started:
                    await uow.emit(AllocationPreempting(
                        allocation_id=alloc["allocation_id"], job_id=job_id, replica=alloc["replica"],
                        team=alloc["team"], project=alloc["project"], cluster=alloc["cluster"], node=alloc["node"],
                        gpus=alloc_gpus,
                        reason=v.reason, message=v.message, preemptor_job_id=split_unit(v.preemptor)[0],
                        deadline=deadline))
            if started:
                log.info("preemption_started", extra={"job_id": job_id, "preemptor": v.preemptor,
                                                       "reason": v.reason, "deadline": deadline.isoformat()})

    async def release_due_preemptions(self) -> int:
        now = utcnow()
        async with self.rt.pool.acquire() as conn:
            due = await store.due_preemptions(conn, now, self.settings.stop_report_timeout_s)
        for row in due:
            async with self.rt.uow() as uow:
                if row["runs"]:  # its agent never reported the work's end: the GPUs cannot wait forever
                    log.warning("work_exit_never_reported", extra={"job_id": row["job_id"],
                                                                    "allocation_id": row["allocation_id"]})
                released = await store.release(uow.conn, row["job_id"], row["preempt_reason"] or "Preempted", now,
                                               allocation_id=row["allocation_id"])
                await self._announce_releases(uow, row["job_id"], row["preempt_reason"] or "Preempted", released)
                # a replicated job wants the replica back (elsewhere); a single job or gang is requeued by the queue
                await store.refresh_satisfied(uow.conn, row["job_id"], after_release=True)
        if due:
            self._kick.set()
        return len(due)

    async def _apply_units(self, uow, units: dict[str, list[Placement]], models: dict[str, str],  # type: ignore[no-untyped-def]
                           traces: dict[str, str | None], rendezvous: RendezvousPorts) -> list[_Unit]:
        """Write a cycle's units (a job, all of a gang's nodes, or one replica) with their AllocationGranted events
        in the cycle's transaction: all of them in a few multi-row statements, under a savepoint. If the store
        refuses that (a stale plan: a GPU already held, a replica already placed), the savepoint is rolled back
        and each unit is tried under its own, so a refused unit is left out whole and the others still commit.
        Returns the units written."""
        applied: list[_Unit] = []
        jobs = await store.claim_jobs(uow.conn, sorted({split_unit(u)[0] for u in units}))
        now = utcnow()
        prepared = [_Unit.of(unit, placements, jobs[split_unit(unit)[0]], models, now, rendezvous)
                    for unit, placements in units.items() if split_unit(unit)[0] in jobs]
        try:
            async with uow.conn.transaction():
                await self._write_units(uow, prepared, traces)
            applied = prepared
        except store.AllocationConflict:
            for u in prepared:
                try:
                    async with uow.conn.transaction():
                        await self._write_units(uow, [u], traces)
                    applied.append(u)
                except store.AllocationConflict as exc:
                    log.warning("placement_refused_by_store", extra={"job_id": u.job_id, "unit": u.unit,
                                                                      "error": str(exc)})
                    SCHEDULING_DECISIONS.labels(outcome="refused_by_store").inc()
        # the events only of what the store took (outside the savepoints: whether the unit of work writes an
        # event at once or with its commit, a refused unit's never reaches the outbox)
        for u in applied:
            with self._place_span(u, traces):
                for granted in u.granted:
                    await uow.emit(granted)
        if applied:
            await store.refresh_satisfied_many(uow.conn, sorted({u.job_id for u in applied}))
        return applied

    def _place_span(self, u: _Unit, traces: dict[str, str | None]):  # type: ignore[no-untyped-def]
        # the grant joins the submission's trace (its traceparent was kept with the wanted job)
        parent = extract_context({"traceparent": traces[u.job_id]} if traces.get(u.job_id) else {})
        return self._tracer.start_as_current_span("place job", context=parent, attributes={"gpupool.job_id": u.job_id})

    async def _write_units(self, uow, units: list[_Unit], traces: dict[str, str | None]) -> None:  # type: ignore[no-untyped-def]
        # one unit (the usual cycle when the queue keeps up): its inserts belong to its trace too
        with self._place_span(units[0], traces) if len(units) == 1 else contextlib.nullcontext():
            await store.insert_allocations(uow.conn, [a for u in units for a in u.allocations],
                                           [g for u in units for g in u.gpus])

    async def release_allocation(self, cmd: ReleaseAllocation) -> Reply:
        """Reclamation's decision, acted on by the only writer of allocations. Idempotent: an allocation already
        released answers with released=0."""
        async with self.rt.uow() as uow:
            row = await store.allocation(uow.conn, cmd.allocation_id)
            if row is None:
                return Reply.failure(404, "AllocationNotFound", f"no allocation {cmd.allocation_id}")
            if row["released_at"] is not None:
                return Reply.success({"allocation_id": cmd.allocation_id, "released": 0})
            # one replica of a replicated job goes alone; a single job or a gang goes whole
            which = {"replica": row["replica"]} if row["replica_set"] else {}
            released, _ = await self._release(uow, row["job_id"], cmd.reason, utcnow(), **which)
            await store.refresh_satisfied(uow.conn, row["job_id"], after_release=True)
        self._kick.set()
        return Reply.success({"allocation_id": cmd.allocation_id, "released": released})


@dataclass
class _Unit:
    """One unit of a plan, ready to write: its allocation and GPU rows and the events that announce them."""
    unit: str
    job_id: str
    allocations: list[tuple]
    gpus: list[tuple]
    granted: list[AllocationGranted]

    @classmethod
    def of(cls, unit: str, placements: list[Placement], job: Any, models: dict[str, str], now: Any,
           rendezvous: RendezvousPorts) -> _Unit:
        job_id, replica = split_unit(unit)
        out = cls(unit, job_id, [], [], [])
        ordered = sorted(placements, key=lambda p: p.replica)
        # a gang that runs work, or a single training job (torchrun on one node), gets its members' rendezvous
        wants = replica is None and bool(job["work"]) and (len(ordered) > 1 or job["kind"] == "training")
        joint = rendezvous.take(job_id, ordered) if wants else None
        if wants and joint is None:
            log.warning("rendezvous_ports_exhausted", extra={"job_id": job_id, "ports": rendezvous.ports})
        for p in ordered:
            allocation_id = uuid7()
            member = replica if replica is not None else p.replica
            alloc_gpus, mig_slots = allocated_gpus(p, models)
            together = joint[2][member] if joint else {}
            out.allocations.append((allocation_id, job_id, member, job["team"], job["project"], p.cluster, p.node,
                                    now, job["priority"], job["priority_class"], job["kind"], job["max_runtime_s"],
                                    job["work"], job["attempt"], joint[0] if joint else None,
                                    joint[1] if joint else None, json.dumps(together) if joint else None,
                                    joint is not None and len(ordered) > 1,  # waits: its agents gate it
                                    p.cpu_milli, p.memory_mib, job["preemptible"]))
            out.gpus += [(allocation_id, g.uuid, g.index, g.model, g.share_milli, g.memory_mib, g.mig_profile,
                          g.mig_start, mig_slots.get(g.uuid)) for g in alloc_gpus]
            out.granted.append(AllocationGranted(
                allocation_id=allocation_id, job_id=job_id, replica=member, team=job["team"],
                project=job["project"], cluster=p.cluster, node=p.node, gpus=alloc_gpus, granted_at=now,
                kind=job["kind"], priority_class=job["priority_class"], max_runtime_s=job["max_runtime_s"],
                environment={**workload_environment(alloc_gpus, allocation_id), **together},
                work=WorkSpec.model_validate_json(job["work"]) if job["work"] else None, attempt=job["attempt"]))
        return out


def routes(h: PlacementHandlers) -> Routes:
    return Routes(
        inbox=CONSUMER,
        commands={
            subjects.QUERY_PLACEMENT_LIST_ALLOCATIONS: (ListAllocations, h.list_allocations),
            subjects.QUERY_PLACEMENT_EXPLAIN: (JobRef, h.explain),
            subjects.QUERY_PLACEMENT_LIST_DECISIONS: (ListDecisions, h.list_decisions),
            subjects.QUERY_PLACEMENT_GET_DECISION: (GetDecision, h.get_decision),
            subjects.QUERY_PLACEMENT_FRAGMENTATION: (GetPool, h.fragmentation.query),
            subjects.CMD_PLACEMENT_RELEASE_ALLOCATION: (ReleaseAllocation, h.release_allocation),
        },
        events={
            NodeRegistered: once(h.on_node_registered),
            NodeLost: once(h.on_node_lost),
            NodeRecovered: once(h.on_node_recovered),
            NodeCordoned: once(h.on_node_cordoned),
            NodeUncordoned: once(h.on_node_uncordoned),
            GpuHealthChanged: once(h.on_gpu_health_changed),
            GpuSharingSet: once(h.on_gpu_sharing_set),
            JobSubmitted: once(h.on_job_submitted),
            JobCompleted: once(h.on_job_completed),
            JobCancelled: once(h.on_job_cancelled),
            JobScaled: once(h.on_job_scaled),
            WorkExited: once(h.on_work_exited),
            WorkReady: once(h.on_work_ready),
            EndpointReady: once(h.on_endpoint),
            JobWorkUpdated: once(h.rollouts.on_job_work_updated),
            EndpointUnready: once(h.on_endpoint),
            TeamCreated: idempotent(h.on_team_created, POLICY_WHY),
            QuotaSet: idempotent(h.on_quota_set, POLICY_WHY),
            PriorityClassSet: idempotent(h.on_priority_class_set, POLICY_WHY),
        },
    )
