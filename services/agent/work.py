"""The node's executor, as the agent drives it: each grant that carries work is launched on its GPUs, stopped when
placement asks (preemption, cancel, reclaim: `allocation.preempting` with a deadline), and reported when it
started (`agent.work_started`) and when it ended with its cgroup empty (`agent.work_exited`), which is what lets
placement release the GPUs. The executor (services/agent/executor) does the processes, cgroups and logs; this
module is the bus side of it, one `WorkRunner` per node."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import subprocess
import time
from collections import OrderedDict
from collections.abc import Awaitable, Callable
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

from libs.bus.connection import NatsClient
from libs.bus.rpc import serve
from libs.contracts import subjects
from libs.contracts.commands import LogChunk, ReadLogs, Reply
from libs.contracts.envelope import utcnow
from libs.contracts.events import (
    AllocationGranted,
    AllocationPreempting,
    AllocationReleased,
    EventData,
    WorkExited,
    WorkReady,
    WorkStarted,
)
from libs.contracts.work import WorkExit, WorkSpec
from libs.observability.tracing import current_traceparent, job_span, tracer
from services.agent.domain import launch_environment, log_text, mps_gpus, waits_for_gang
from services.agent.executor import Executor, ExitReport, LaunchError, LaunchSpec, Limits
from services.agent.load import LoadSampler
from services.agent.mps import MpsControl, MpsError
from services.agent.replicas import ReplicaKeeper

log = logging.getLogger(__name__)
Publish = Callable[[EventData, str], Awaitable[bool]]
_tracer = tracer("gpupool.agent.work")
PUBLISH_RETRY_MAX_S = 10.0
LOAD_TICK_S = 0.5  # how often due load samples are looked for (each probe has its own interval)


class WorkRunner:
    """One node's work: grants with a command are launched, stopped and reported."""

    def __init__(self, nc: NatsClient, cluster: str, node: str, executor: Executor, publish: Publish, *,
                 device_dir: str = "/dev", run_as_uid: int | None = None, log_max_bytes: int | None = None,
                 kill_on_close: bool = False, grants_dir: Path | None = None,
                 log_retention_s: float = 86_400.0, mps: MpsControl | None = None,
                 rendezvous_env: dict[str, str] | None = None, address: str = "") -> None:
        self.rendezvous_env = rendezvous_env or {}  # the node's NCCL interfaces, for work with a rendezvous
        self.gpu_numa: dict[str, int] = {}  # GPU uuid → its NUMA node (the node agent fills it from NVML)
        self.log_retention_s = log_retention_s
        self.mps = mps  # CUDA MPS daemons for fractions (None: this node enforces no fraction limits with MPS)
        self.kill_on_close = kill_on_close
        # each grant whose work runs here, kept on disk until its exit is published: an agent restarted meanwhile
        # knows whose re-adopted work it reports
        self.grants_dir = grants_dir
        self.nc = nc
        self.cluster = cluster
        self.node = node
        self.executor = executor
        self.publish = publish
        self.device_dir = device_dir
        self.run_as_uid = run_as_uid
        self.log_max_bytes = log_max_bytes
        self.grants: dict[str, AllocationGranted] = {}  # allocations with work that this node runs or will run
        self.waiting: dict[str, AllocationGranted] = {}  # granted, not launched yet (a MIG instance to come)
        self.launching: set[str] = set()
        # gang members whose grant is applied here, waiting for the others (allocation → its MIG instance, if any),
        # and the allocations placement said may start (allocation.gang_ready, or a resync that lists them started)
        self.gated: dict[str, str | None] = {}
        self.gang_go: set[str] = set()
        # allocation → set once its start was reported (or its launch failed): its exit is reported after that,
        # so `agent.work_started` never reaches anyone after `agent.work_exited` (a quick command's exit is
        # known while the start report is still on its way)
        self.start_reported: dict[str, asyncio.Event] = {}
        self.ended: OrderedDict[str, None] = OrderedDict()  # allocations whose work ended (never launched again)
        self.known_since: dict[str, float] = {}  # allocation → when this agent heard of it (0: from a previous agent)
        self.over_fraction: dict[str, str] = {}  # allocation stopped for its fraction's memory → what it used
        self._tasks: set[asyncio.Task[Any]] = set()
        self._stopped = False
        # service replicas: ports, health, endpoints, restarts in place (services/agent/replicas.py)
        self.replicas = ReplicaKeeper(cluster, node, address or "127.0.0.1", self._publish_until_taken,
                                      self._stop_for, self._relaunch, run_as_uid)
        # each running replica's load for its job's autoscaler (services/agent/load.py)
        self.loads = LoadSampler(cluster, node, address or "127.0.0.1", publish)
        self.mig_used: dict[str, str | None] = {}  # allocation → the MIG instance its work was launched on
        self.last_exit: dict[str, WorkExit] = {}  # a replica restarting in place: its last end (if it never does)
        self.traces: dict[str, str] = {}  # allocation → its grant's traceparent: launch, stop and exit join it

    # --- start and stop --------------------------------------------------------------------------------------
    async def start(self) -> None:
        """Re-adopt the work a previous agent left running (its exits are reported as they come) and answer log
        reads."""
        self._load_grants()
        await self.executor.adopt()
        await serve(self.nc, subjects.agent_logs(self.cluster, self.node), ReadLogs, self.read_logs,
                    queue=f"agent-logs-{self.cluster}-{self.node}")
        self._spawn(self._sample_loads())

    async def _sample_loads(self) -> None:
        """Every running replica whose work has a load probe, sampled when its probe is due."""
        while not self._stopped:
            await asyncio.sleep(LOAD_TICK_S)
            probed = [(aid, grant) for aid, grant in list(self.grants.items())
                      if grant.work is not None and grant.work.load is not None]
            if not probed:  # most nodes most of the time: no need to ask the executor what runs
                continue
            running = self.executor.running()
            sampled = [(grant, self.replicas.ports.get(aid, {})) for aid, grant in probed if aid in running]
            if not sampled:
                continue
            try:
                await self.loads.tick(sampled)
            except Exception as exc:  # a sample lost is not worth the loop
                log.warning("load_sampling_failed", extra={"node": self.node, "error": repr(exc)})

    async def close(self) -> None:
        """The agent stops: the work goes on (a restarted agent re-adopts it), unless `kill_on_close` (a local
        simulated platform going down takes its work with it)."""
        if self.kill_on_close:
            self.replicas.stopped.update(self.executor.running())
            for allocation_id in list(self.executor.running()):
                with contextlib.suppress(Exception):
                    await self.executor.stop(allocation_id, deadline=utcnow(), reason="AgentStopped")
            deadline = asyncio.get_running_loop().time() + 5
            while self.executor.running() and asyncio.get_running_loop().time() < deadline:  # noqa: ASYNC110
                await asyncio.sleep(0.05)  # the executor reports through on_exit, not an event to wait on
        self._stopped = True
        self.replicas.close()
        for task in self._tasks:
            task.cancel()
        if self.kill_on_close and self.mps is not None:  # no work left: no client for any daemon
            with contextlib.suppress(Exception):
                await asyncio.to_thread(self.mps.stop_all)
        self.executor.close()

    def _load_grants(self) -> None:
        if self.grants_dir is None or not self.grants_dir.is_dir():
            return
        for path in sorted(self.grants_dir.glob("*.json")):
            try:
                grant = AllocationGranted.model_validate_json(path.read_bytes())
            except (OSError, ValueError) as exc:
                log.warning("saved_grant_unreadable", extra={"node": self.node, "path": str(path),
                                                             "error": repr(exc)})
                continue
            self.grants[grant.allocation_id] = grant

    def _save_grant(self, grant: AllocationGranted) -> None:
        if self.grants_dir is None:
            return
        self.grants_dir.mkdir(parents=True, exist_ok=True)
        # written in place, not temp file + rename (a millisecond per job on ext4): a file cut short by a crash
        # is skipped when loading, and the resync with placement brings the grant back
        (self.grants_dir / f"{grant.allocation_id}.json").write_bytes(grant.model_dump_json().encode())

    def _forget_grant(self, allocation_id: str) -> None:
        if self.grants_dir is not None:
            (self.grants_dir / f"{allocation_id}.json").unlink(missing_ok=True)

    def _span(self, name: str, allocation_id: str, **attributes: Any) -> Any:
        """A step of this allocation's work (launch, stop, exit) as a span of its job's trace."""
        grant = self.grants.get(allocation_id)
        return job_span(_tracer, name, self.traces.get(allocation_id), {
            "gpupool.allocation_id": allocation_id, "gpupool.node": self.node,
            **({"gpupool.job_id": grant.job_id} if grant is not None else {}), **attributes})

    def _spawn(self, coro: Awaitable[Any]) -> None:
        task = asyncio.ensure_future(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    # --- what placement decided --------------------------------------------------------------------------------
    def runs(self, allocation_id: str) -> bool:
        """This allocation's work is the executor's (so no simulated workload stands in for it)."""
        return allocation_id in self.grants

    def on_granted(self, grant: AllocationGranted, mig_uuid: str | None = None) -> None:
        """A grant with work: launch it once its GPUs are ready (a MIG slice once its instance exists)."""
        if grant.work is None or grant.allocation_id in self.ended or grant.allocation_id in self.grants:
            return
        self.grants[grant.allocation_id] = grant
        if (traceparent := current_traceparent()) is not None:  # the grant's, applied in the job's trace
            self.traces[grant.allocation_id] = traceparent
        self.known_since[grant.allocation_id] = time.monotonic()
        self._save_grant(grant)
        self.waiting[grant.allocation_id] = grant
        self.launch_ready({grant.allocation_id: mig_uuid} if mig_uuid else {})

    def launch_ready(self, mig_uuids: dict[str, str]) -> None:
        """Launch every waiting grant whose GPUs are ready; called on each grant and each convergence."""
        for allocation_id, grant in list(self.waiting.items()):
            needs_mig = any(g.mig_profile for g in grant.gpus)
            if needs_mig and allocation_id not in mig_uuids:
                continue
            del self.waiting[allocation_id]
            if waits_for_gang(grant.environment) and allocation_id not in self.gang_go:
                self.gated[allocation_id] = mig_uuids.get(allocation_id)
                self._spawn(self._report_ready(grant))
                continue
            self._start(grant, mig_uuids.get(allocation_id))

    def _start(self, grant: AllocationGranted, mig_uuid: str | None) -> None:
        self.gang_go.discard(grant.allocation_id)
        self.launching.add(grant.allocation_id)
        self.start_reported[grant.allocation_id] = asyncio.Event()
        self._spawn(self._launch(grant, mig_uuid))

    async def _report_ready(self, grant: AllocationGranted) -> None:
        log.info("work_waits_for_gang", extra={"node": self.node, "allocation_id": grant.allocation_id,
                                               "job_id": grant.job_id})
        await self._publish_until_taken(WorkReady(
            allocation_id=grant.allocation_id, job_id=grant.job_id, team=grant.team, project=grant.project,
            cluster=self.cluster, node=self.node, replica=grant.replica, attempt=grant.attempt,
            ready_at=utcnow()), f"work_ready/{grant.allocation_id}")

    def on_gang_ready(self, allocation_id: str) -> None:
        """Every member of the gang is ready: this member's work starts now."""
        if allocation_id in self.ended:
            return
        if allocation_id in self.gated:
            self._start(self.grants[allocation_id], self.gated.pop(allocation_id))
        elif allocation_id not in self.launching and allocation_id not in self.executor.running():
            self.gang_go.add(allocation_id)  # not ready here yet (a MIG instance to come): it starts when it is

    async def on_preempting(self, data: AllocationPreempting) -> None:
        """The stop request: the stop signal now, the kill at the deadline. Work not started yet never starts."""
        if data.allocation_id not in self.grants or data.allocation_id in self.ended:
            return
        if self.waiting.pop(data.allocation_id, None) is not None or self._ungate(data.allocation_id):
            await self._report_unstarted(self.grants[data.allocation_id], "Stopped",
                                         f"stopped before it started ({data.reason})")
            return
        grant = self.grants[data.allocation_id]
        with self._span("stop work", data.allocation_id, **{"gpupool.reason": data.reason}):
            if self.replicas.serves(grant):  # out of the endpoint list before its stop signal
                await self.replicas.draining(grant, data.reason)
            await self.executor.stop(data.allocation_id, deadline=data.deadline, reason=data.reason)

    async def stop_over_fraction(self, allocation_id: str, pid: int, used_mib: int, limit_mib: int,
                                 grace_s: float) -> None:
        """A process of this fraction's work holds more GPU memory than the fraction was promised: the work stops
        (its stop signal now, killed after `grace_s`) and its end is reported as FractionMemoryExceeded."""
        if allocation_id in self.ended or allocation_id in self.over_fraction:
            return
        self.over_fraction[allocation_id] = (f"process {pid} used {used_mib} MiB of GPU memory, over its "
                                             f"fraction's {limit_mib} MiB")
        deadline = utcnow() + timedelta(seconds=grace_s)
        await self.executor.stop(allocation_id, deadline=deadline, reason="FractionMemoryExceeded")

    async def on_released(self, data: AllocationReleased) -> None:
        """Released without waiting for the work (its node was declared lost, or the exit report timed out): the
        GPUs are no longer this work's, so it is killed now."""
        self.waiting.pop(data.allocation_id, None)
        if self._ungate(data.allocation_id):  # never started: nothing to kill, only its grant to end
            await self._report_unstarted(self.grants[data.allocation_id], "Stopped",
                                         f"released before its gang started ({data.reason})")
            return
        if data.allocation_id in self.grants and data.allocation_id not in self.ended:
            self.replicas.stopped.add(data.allocation_id)
            with self._span("stop work", data.allocation_id, **{"gpupool.reason": data.reason}):
                await self.executor.stop(data.allocation_id, deadline=utcnow(), reason=data.reason)

    def _ungate(self, allocation_id: str) -> bool:
        self.gang_go.discard(allocation_id)
        if allocation_id in self.gated:
            del self.gated[allocation_id]
            return True
        return False

    def on_live(self, item: dict[str, Any]) -> None:
        """An allocation placement lists as live on this node (start-up and periodic sync): one with work that
        this agent does not run (a grant it missed) is launched, or reported ended if it is being stopped."""
        allocation_id = item["allocation_id"]
        if not item.get("work") or allocation_id in self.ended:
            return
        if allocation_id in self.grants or allocation_id in self.executor.running():
            if allocation_id in self.gated and not item.get("preempt_deadline") and item.get("gang_wait") is False:
                self.on_gang_ready(allocation_id)  # its allocation.gang_ready was missed (core NATS)
                return
            # ours (re-adopted after a restart, or granted): a stop asked for while this agent was not listening
            # (allocation.preempting is core NATS) reaches the work now
            if item.get("preempt_deadline") and allocation_id not in self.waiting and allocation_id not in self.gated:
                deadline = datetime.fromisoformat(item["preempt_deadline"])
                self._spawn(self.executor.stop(allocation_id, deadline=deadline,
                                               reason=item.get("preempt_reason") or "Stopped"))
            return
        try:
            grant = AllocationGranted(
                allocation_id=allocation_id, job_id=item["job_id"], team=item["team"], project=item["project"],
                cluster=item["cluster"], node=item["node"], gpus=item["gpus"], replica=item.get("replica", 0),
                granted_at=datetime.fromisoformat(item["granted_at"]), kind=item.get("kind") or "batch",
                work=WorkSpec.model_validate(item["work"]), attempt=item.get("attempt", 0),
                environment=item.get("environment") or {})
        except (ValueError, KeyError, TypeError) as exc:
            log.warning("live_allocation_unreadable", extra={"node": self.node, "allocation_id": allocation_id,
                                                             "error": repr(exc)})
            return
        if item.get("preempt_deadline"):
            self.grants[allocation_id] = grant
            self._spawn(self._report_unstarted(grant, "Stopped", "stopped before it started (missed grant)"))
            return
        if item.get("gang_wait") is False:
            self.gang_go.add(allocation_id)  # its gang started meanwhile: no need to wait again
        self.on_granted(grant)

    def on_synced(self, live: set[str], listened_since: float) -> None:
        """After a sync: work whose allocation placement no longer lists as live (released while this agent was
        down or not listening: a lost node, a report that timed out) is no longer entitled to its GPUs and is
        killed. Only work this agent knew of before `listened_since` (when the listing began, time.monotonic()) is
        judged: a grant that came later may be missing from the listing and still be live."""
        # ended attempts are kept (their logs stay readable) for the retention, then forgotten with their dirs
        with contextlib.suppress(OSError):
            self.executor.prune(self.log_retention_s)
        for allocation_id in set(self.executor.running()) | set(self.grants):
            if allocation_id in live or allocation_id in self.ended:
                continue
            if self.known_since.get(allocation_id, 0.0) >= listened_since:
                continue
            log.warning("work_without_live_allocation", extra={"node": self.node, "allocation_id": allocation_id})
            self.waiting.pop(allocation_id, None)
            if self._ungate(allocation_id):
                self._spawn(self._report_unstarted(self.grants[allocation_id], "Stopped",
                                                   "its allocation is no longer live"))
                continue
            self._spawn(self.executor.stop(allocation_id, deadline=utcnow(), reason="AllocationNotLive"))

    # --- launching and reporting -------------------------------------------------------------------------------
    async def _prepare_mps(self, grant: AllocationGranted) -> dict[str, str]:
        """A fraction's GPU gets its MPS daemon (the work joins it as a client: the environment returned); a GPU
        taken whole or as a MIG slice loses one left from earlier fractions. Raises LaunchError."""
        if self.mps is None:
            return {}
        fractions, whole = mps_gpus(grant.gpus)
        for uuid in whole:
            if await asyncio.to_thread(self.mps.stop, uuid):
                log.info("mps_daemon_stopped", extra={"node": self.node, "gpu": uuid, "for": grant.allocation_id})
        env: dict[str, str] = {}
        for uuid in fractions:
            try:
                env.update(await asyncio.to_thread(self.mps.ensure, uuid))
            except (MpsError, OSError, subprocess.SubprocessError) as exc:
                raise LaunchError("DriverUnavailable", f"CUDA MPS for GPU {uuid}: {exc}") from exc
        return env

    async def _release_mps(self, grant: AllocationGranted) -> None:
        """After a fraction's work ended: the GPU's daemon stops once no other fraction here uses that GPU."""
        if self.mps is None:
            return
        fractions, _ = mps_gpus(grant.gpus)
        in_use = {u for g in self.grants.values() if g.allocation_id != grant.allocation_id
                  for u in mps_gpus(g.gpus)[0]}
        for uuid in fractions:
            if uuid not in in_use:
                with contextlib.suppress(Exception):
                    if await asyncio.to_thread(self.mps.stop, uuid):
                        log.info("mps_daemon_stopped", extra={"node": self.node, "gpu": uuid, "idle": True})

    def _spec(self, grant: AllocationGranted, mig_uuid: str | None,
              extra_env: dict[str, str] | None = None, restart: int = 0) -> LaunchSpec:
        work = grant.work
        assert work is not None
        # the node's interfaces for a job whose members talk to each other, unless the job names its own
        node_env = self.rendezvous_env if "PET_NNODES" in grant.environment else {}
        env = launch_environment(grant.environment, {**node_env, **work.env}, gpus=grant.gpus, mig_uuid=mig_uuid,
                                 gpu_numa=self.gpu_numa)
        env.update(extra_env or {})
        env.update(self.replicas.environment(grant))  # a service replica's ports
        return LaunchSpec(
            allocation_id=grant.allocation_id, job_id=grant.job_id, argv=list(work.command), attempt=grant.attempt,
            restart=restart,
            replica=grant.replica, env=env, workdir=work.workdir,
            limits=Limits(cpu_milli=work.limits.cpu_milli, memory_mib=work.limits.memory_mib,
                          pids=work.limits.pids),
            gpu_indices=sorted({g.index for g in grant.gpus}), device_dir=self.device_dir,
            isolation=work.isolation, image=work.image, rootfs=work.rootfs, stop_signal=work.stop_signal,
            stop_grace_s=work.stop_grace_s, max_runtime_s=grant.max_runtime_s, warn_before_s=work.warn_before_s,
            warn_signal=work.warn_signal, uid=self.run_as_uid, gid=self.run_as_uid,
            **({"log_max_bytes": self.log_max_bytes} if self.log_max_bytes else {}))

    def _relaunch(self, grant: AllocationGranted, restart: int) -> None:
        """A replica restarting in place (replicas.py): the same grant again, after a short back-off."""
        self.launching.add(grant.allocation_id)
        self.start_reported[grant.allocation_id] = asyncio.Event()
        self._spawn(self._launch(grant, self.mig_used.get(grant.allocation_id), restart=restart,
                                 delay=min(5.0, 0.5 * restart)))

    async def _stop_for(self, allocation_id: str, deadline: datetime, reason: str) -> None:
        await self.executor.stop(allocation_id, deadline=deadline, reason=reason)

    async def _launch(self, grant: AllocationGranted, mig_uuid: str | None, restart: int = 0,
                      delay: float = 0.0) -> None:
        with self._span("launch work", grant.allocation_id, **{"gpupool.restart": restart}):
            await self._launch_now(grant, mig_uuid, restart, delay)

    async def _launch_now(self, grant: AllocationGranted, mig_uuid: str | None, restart: int,
                          delay: float) -> None:
        reported = self.start_reported.setdefault(grant.allocation_id, asyncio.Event())
        try:
            if delay:
                await asyncio.sleep(delay)
            if restart and grant.allocation_id in self.replicas.stopped:  # stopped while it was to restart
                self.launching.discard(grant.allocation_id)
                reported.set()
                await self._report(grant, self.last_exit.pop(grant.allocation_id))
                return
            self.mig_used[grant.allocation_id] = mig_uuid
            try:
                spec = self._spec(grant, mig_uuid, await self._prepare_mps(grant), restart=restart)
                pid = await self.executor.launch(spec)
            except LaunchError as exc:
                log.warning("work_launch_failed", extra={"node": self.node, "allocation_id": grant.allocation_id,
                                                         "reason": exc.reason, "detail": exc.message})
                reported.set()
                await self._report_unstarted(grant, exc.reason, exc.message)
                return
            except Exception as exc:  # never leave a grant neither started nor ended
                log.exception("work_launch_crashed", extra={"node": self.node,
                                                            "allocation_id": grant.allocation_id})
                reported.set()
                await self._report_unstarted(grant, "LaunchFailed", f"{type(exc).__name__}: {exc}"[:500])
                return
            finally:
                self.launching.discard(grant.allocation_id)
            log.info("work_started", extra={"node": self.node, "allocation_id": grant.allocation_id,
                                            "job_id": grant.job_id, "pid": pid})
            assert grant.work is not None
            await self._publish_until_taken(WorkStarted(
                allocation_id=grant.allocation_id, job_id=grant.job_id, team=grant.team, project=grant.project,
                cluster=self.cluster, node=self.node, replica=grant.replica, attempt=grant.attempt, pid=pid,
                isolation=grant.work.isolation, started_at=utcnow()),
                f"work_started/{grant.allocation_id}" + (f"/{restart}" if restart else ""))
            self.replicas.started(grant, spec.env)
        finally:
            reported.set()  # also when cancelled (the agent stops): an exit report never waits forever

    async def _report_unstarted(self, grant: AllocationGranted, reason: str, message: str) -> None:
        now = utcnow()
        await self._report(grant, WorkExit(reason=reason, message=message[:2000], exited_at=now,  # type: ignore[arg-type]
                                           stopped=reason == "Stopped"))

    async def on_exit(self, report: ExitReport) -> None:
        """The executor's callback: the work ended and its cgroup is empty."""
        grant = self.grants.get(report.allocation_id)
        if grant is None:  # not ours (never granted through this agent): nobody to report it to
            log.warning("work_exit_without_grant", extra={"node": self.node, "allocation_id": report.allocation_id})
            return
        reason, message = report.reason, report.message
        over = self.over_fraction.pop(report.allocation_id, None)
        if over is not None and reason != "Completed":  # ended because the agent stopped it for its memory
            reason, message = "FractionMemoryExceeded", f"{over}; {message}" if message else over
        exit = WorkExit(reason=reason, exit_code=report.exit_code, signal=report.signal,  # type: ignore[arg-type]
                        oom=report.oom, stopped=report.stopped, message=message[:2000],
                        started_at=report.started_at, exited_at=report.exited_at, wall_s=max(0.0, report.wall_s),
                        cpu_s=max(0.0, report.cpu_s))
        log.info("work_exited", extra={"node": self.node, "allocation_id": report.allocation_id,
                                       "reason": report.reason, "exit_code": report.exit_code})
        if self.replicas.serves(grant) and await self.replicas.ended(
                grant, reason, final=over is not None or reason == "MaxRuntimeExceeded" or self._stopped):
            self.last_exit[report.allocation_id] = exit  # restarting in place: reported only if it never does
            return
        with self._span("work exited", report.allocation_id, **{"gpupool.reason": reason}):
            await self._report(grant, exit)

    async def _report(self, grant: AllocationGranted, exit: WorkExit) -> None:
        await self._publish_exit(grant.allocation_id, grant.job_id, grant.replica, grant.attempt, exit,
                                 team=grant.team, project=grant.project)
        await self._release_mps(grant)

    async def _publish_exit(self, allocation_id: str, job_id: str, replica: int, attempt: int, exit: WorkExit, *,
                            team: str, project: str) -> None:
        self.ended[allocation_id] = None
        while len(self.ended) > 10_000:
            self.ended.popitem(last=False)
        self.waiting.pop(allocation_id, None)
        self._ungate(allocation_id)
        self.replicas.forget(allocation_id)
        self.loads.forget(allocation_id)
        self.mig_used.pop(allocation_id, None)
        self.last_exit.pop(allocation_id, None)
        self.grants.pop(allocation_id, None)
        self.known_since.pop(allocation_id, None)
        started = self.start_reported.get(allocation_id)
        if started is not None:  # the start first (see start_reported)
            await started.wait()
            self.start_reported.pop(allocation_id, None)
        await self._publish_until_taken(WorkExited(
            allocation_id=allocation_id, job_id=job_id, team=team, project=project, cluster=self.cluster,
            node=self.node, replica=replica, attempt=attempt, exit=exit), f"work_exited/{allocation_id}")
        self._forget_grant(allocation_id)
        self.traces.pop(allocation_id, None)

    async def _publish_until_taken(self, event: EventData, identity: str) -> None:
        """An exit must never be lost (placement frees the GPUs on it): retried until JetStream takes it. The id
        derives from the allocation, so a retry or a restarted agent's repeat is dropped as a duplicate."""
        delay = 0.2
        while not self._stopped:
            if await self.publish(event, identity):
                return
            await asyncio.sleep(delay)
            delay = min(PUBLISH_RETRY_MAX_S, delay * 2)

    # --- logs ----------------------------------------------------------------------------------------------------
    async def read_logs(self, cmd: ReadLogs) -> Reply:
        try:
            data, next_offset, complete = self.executor.read_logs(
                cmd.allocation_id, cmd.stream, offset=cmd.offset, limit=cmd.limit, tail=cmd.tail)
        except KeyError:
            return Reply.failure(404, "NoLogs", f"no work of allocation {cmd.allocation_id} on {self.node}")
        text, consumed = log_text(data, complete)
        start = next_offset - len(data)
        return Reply.success(LogChunk(allocation_id=cmd.allocation_id, stream=cmd.stream, offset=start,
                                      next_offset=start + consumed, data=text,
                                      complete=complete and consumed == len(data)).model_dump())

