"""The node's executor (what slurmd is to Slurm, without the network): prepare → start → watch → stop → report.

One per node; a simulated fleet runs many in one process, each with its own state dir and cgroup name. No NATS and
no database: the agent calls `launch`/`stop` and gets every ended attempt once through `on_exit`. See README.md.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import fcntl
import json
import logging
import marshal
import os
import shutil
import sys
import time
from collections.abc import Awaitable, Callable
from datetime import datetime
from pathlib import Path
from typing import Any

from services.agent.domain import classify_exit
from services.agent.executor import cgroups as cg
from services.agent.executor import state as st
from services.agent.executor.drivers import (
    DEFAULT_PATH,
    ContainerDriver,
    Driver,
    Paths,
    device_rules,
    make_drivers,
)
from services.agent.executor.forkserver import ServerUnanswered, ShimStarter
from services.agent.executor.logs import read_log
from services.agent.executor.spec import (
    _SAFE_ID,
    ISOLATIONS,
    NOBODY,
    ExitReport,
    LaunchError,
    LaunchSpec,
    signal_number,
    utc,
)

log = logging.getLogger("gpupool.agent.executor")
_ROOT = str(Path(__file__).resolve().parents[3])  # the directory holding the `services` package
_STAGE_REASON = {"chdir": "WorkdirUnavailable", "cgroup": "CgroupFailed", "credentials": "LaunchFailed",
                 "stdio": "LaunchFailed", "setsid": "LaunchFailed"}


@dataclasses.dataclass
class _Live:
    """What only this process knows about an attempt (never persisted)."""

    owned: bool = False  # this executor watches it (launched here, or adopted)
    pidfd: int | None = None
    timer: asyncio.Task | None = None
    finishing: asyncio.Task | None = None
    delivering: asyncio.Task | None = None
    sample: tuple[float, float] | None = None  # (monotonic time, cpu_s) of the last usage() call


class Executor:
    def __init__(self, state_dir: Path | str, cgroup_name: str, *,
                 on_exit: Callable[[ExitReport], Awaitable[None]], drivers: set[str] | None = None,
                 python: str = sys.executable, default_uid: int = NOBODY, default_gid: int = NOBODY,
                 max_stop_grace_s: float = 300, cgroups: str = "auto", launch_timeout_s: float = 120,
                 checkpoint_root: Path | str | None = None, fork_server: bool = True) -> None:
        if not _SAFE_ID.match(cgroup_name):
            raise ValueError(f"cgroup_name {cgroup_name!r} must match {_SAFE_ID.pattern}")
        self.state_dir = Path(state_dir)
        for sub in ("", "attempts", "jobs", "checkpoints"):
            (self.state_dir / sub).mkdir(parents=True, exist_ok=True)
            os.chmod(self.state_dir / sub, 0o711)  # the work (another uid) must traverse to its own dirs
        self.cgroup_name = cgroup_name
        # where each job's GPUPOOL_CHECKPOINT_DIR lives: this node's state dir, or a root shared by nodes (a
        # filesystem every node mounts, or one folder for a simulated fleet) so a requeued job finds its checkpoint
        # on whichever node it lands
        self.checkpoint_root = Path(checkpoint_root) if checkpoint_root else self.state_dir / "checkpoints"
        self.checkpoint_root.mkdir(parents=True, exist_ok=True)
        os.chmod(self.checkpoint_root, 0o711)
        self._lock = _lock(self.state_dir / "executor.lock")
        self._on_exit = on_exit
        self._python = python
        self._root = os.geteuid() == 0
        self._default_uid, self._default_gid = default_uid, default_gid
        self._max_grace = max_stop_grace_s
        self._launch_timeout = launch_timeout_s
        self.cgroups = cg.detect(cgroups)
        self._drivers = make_drivers(str(self.state_dir), self.cgroups.kind)
        self._offered = set(ISOLATIONS) if drivers is None else set(drivers)
        self._attempts, unrecorded = st.load(str(self.state_dir))
        for attempt_dir in unrecorded:  # a launch cut short before it was recorded: nothing of it ran
            log.warning("attempt dir %s has no record: removing it", attempt_dir)
            shutil.rmtree(attempt_dir, ignore_errors=True)
        self._live: dict[str, _Live] = {}
        self._launching: dict[str, asyncio.Task[int]] = {}
        self._background: set[asyncio.Task] = set()
        self._closed = False
        self._starter = ShimStarter(python, {"PATH": DEFAULT_PATH, "PYTHONPATH": _ROOT},
                                    str(self.state_dir / "forkserver.log"), use_server=fork_server)

    # --- drivers -------------------------------------------------------------------------------------------
    def offered_drivers(self) -> dict[str, str | None]:
        """Every known driver → None when this node offers it and it can run here, else why not."""
        out: dict[str, str | None] = {}
        for name, driver in self._drivers.items():
            if name not in self._offered:
                out[name] = "not offered by this node's configuration"
                continue
            ok, why = driver.available()
            out[name] = None if ok else why
        return out

    def _driver(self, isolation: str) -> Driver:
        driver = self._drivers.get(isolation)
        if driver is None:
            raise LaunchError("DriverUnavailable", f"unknown isolation {isolation!r} (known: {', '.join(ISOLATIONS)})")
        if isolation not in self._offered:
            raise LaunchError("DriverUnavailable", f"isolation {isolation!r} is not offered by this node")
        return driver

    # --- launch --------------------------------------------------------------------------------------------
    async def launch(self, spec: LaunchSpec) -> int:
        """Start the work; its pid once it has really started. Idempotent: an allocation already running (or
        already ended with the same attempt number) gives the pid it has (had). LaunchError."""
        if self._closed:
            raise RuntimeError("executor is closed")
        alloc = spec.allocation_id
        if alloc in self._launching:
            return await asyncio.shield(self._launching[alloc])
        rec = self._attempts.get(alloc)
        if rec is not None and rec.state == "ended" and (rec.spec.attempt, rec.spec.restart) == (
                spec.attempt, spec.restart):
            if rec.pid is not None:
                return rec.pid
            raise LaunchError("LaunchFailed", f"attempt {spec.attempt} of allocation {alloc} already ended "
                                              f"({(rec.report or {}).get('reason')})")
        if rec is not None and rec.state != "ended":
            if rec.pid is None:
                self._read_started(rec)
            if rec.pid is None:
                raise LaunchError("LaunchFailed", f"allocation {alloc} has a launch of unknown outcome from before "
                                                  "a restart: adopt() it first")
            return rec.pid
        if rec is not None and not rec.reported:
            raise LaunchError("LaunchFailed", f"allocation {alloc}: the exit of attempt {rec.spec.attempt} is "
                                              "not delivered yet")
        # The launch goes on even if the caller is cancelled: once the shim runs, the attempt must be watched.
        task = asyncio.get_running_loop().create_task(self._launch(spec))
        self._launching[alloc] = task
        task.add_done_callback(lambda t: (self._launching.pop(alloc, None), t.cancelled() or t.exception()))
        return await asyncio.shield(task)

    def _normalised(self, spec: LaunchSpec) -> LaunchSpec:
        problems = spec.problems()
        if problems:
            raise LaunchError("LaunchFailed", "; ".join(problems))
        if not self._root:  # cannot switch users: the work runs as the agent's user
            return dataclasses.replace(spec, uid=os.getuid(), gid=os.getgid())
        uid = self._default_uid if spec.uid is None else spec.uid
        gid = (self._default_gid if spec.uid is None else uid) if spec.gid is None else spec.gid
        return dataclasses.replace(spec, uid=uid, gid=gid)

    async def _launch(self, spec: LaunchSpec) -> int:
        driver = self._driver(spec.isolation)
        spec = self._normalised(spec)
        command = await asyncio.to_thread(driver.preflight, spec, spec.uid, spec.gid)
        old = self._attempts.pop(spec.allocation_id, None)
        if old is not None:  # an ended earlier attempt of this allocation: its files make way
            shutil.rmtree(old.attempt_dir, ignore_errors=True)
            stale = self._live.pop(spec.allocation_id, None)  # and its watch: this attempt's end is watched anew
            if stale is not None and stale.timer is not None:
                stale.timer.cancel()
        paths = self._prepare_dirs(spec)
        job_cg = self.cgroups.job(self.cgroup_name, spec.allocation_id)
        try:
            job_cg.create(cpu_milli=spec.limits.cpu_milli, memory_mib=spec.limits.memory_mib,
                          pids=spec.limits.pids,
                          devices=device_rules(spec, driver.extra_devices) if job_cg.kind in ("v1", "v2") else None)
        except cg.CgroupError as e:
            job_cg.remove()
            raise LaunchError("CgroupFailed", str(e)) from e
        if job_cg.kind == "none" and any(v is not None for v in dataclasses.astuple(spec.limits)):
            log.warning("allocation %s: limits %s not enforced: no cgroups (%s)", spec.allocation_id, spec.limits,
                        self.cgroups.why)
        launched_at = time.time()
        rec = st.Attempt(spec=spec, attempt_dir=paths.attempt_dir, workdir=paths.workdir,
                         workdir_made=spec.workdir is None, checkpoint_dir=paths.checkpoint_dir,
                         control_dir=paths.control_dir, deadline_file=paths.deadline_file,
                         cgroup=job_cg.descriptor(), launchers=list(driver.launchers),
                         container_name=paths.container_name, launched_at=launched_at)
        if spec.max_runtime_s is not None:
            rec.runtime_deadline = launched_at + spec.max_runtime_s
            if spec.warn_before_s is not None:
                rec.warn_at = rec.runtime_deadline - spec.warn_before_s
        try:
            self._write_plan(spec, paths, driver, command, job_cg, rec)
        except OSError as e:
            job_cg.remove()
            raise LaunchError("LaunchFailed", f"cannot write the attempt's plan: {e}") from e
        self._attempts[spec.allocation_id] = rec
        self._save(rec)
        return await self._start_shim(rec, driver, job_cg)

    def _prepare_dirs(self, spec: LaunchSpec) -> Paths:
        attempt_dir = self.state_dir / "attempts" / spec.allocation_id
        control = attempt_dir / "control"
        checkpoint = self.checkpoint_root / spec.job_id
        workdir = Path(spec.workdir) if spec.workdir else self.state_dir / "jobs" / spec.job_id / "work"
        try:
            control.mkdir(parents=True, exist_ok=True)
            os.chmod(attempt_dir, 0o711)
            os.chmod(control, 0o755)
            checkpoint.mkdir(exist_ok=True)
            self._own(checkpoint, spec)
            if spec.workdir is None:
                workdir.parent.mkdir(exist_ok=True)
                os.chmod(workdir.parent, 0o711)
                workdir.mkdir(exist_ok=True)
                self._own(workdir, spec)
            elif not workdir.is_dir():
                workdir.mkdir(parents=True)
                self._own(workdir, spec)
        except OSError as e:
            raise LaunchError("WorkdirUnavailable", f"cannot prepare the job's directories: {e}") from e
        rel = f"/gpupool/{self.cgroup_name}/{spec.allocation_id}" if self.cgroups.kind != "none" else None
        return Paths(state_dir=str(self.state_dir), attempt_dir=str(attempt_dir), workdir=str(workdir),
                     checkpoint_dir=str(checkpoint), control_dir=str(control),
                     deadline_file=str(control / "stop_deadline"), cgroup_parent=rel,
                     container_name=f"gpupool-{self.cgroup_name}-{spec.allocation_id}")

    def _own(self, path: Path, spec: LaunchSpec) -> None:
        if self._root:
            os.chown(path, spec.uid, spec.gid)
            os.chmod(path, 0o750)

    def _environment(self, spec: LaunchSpec, paths: Paths, rec: st.Attempt) -> dict[str, str]:
        env = dict(spec.env)
        env.update({"GPUPOOL_ALLOCATION_ID": spec.allocation_id, "GPUPOOL_JOB_ID": spec.job_id,
                    "GPUPOOL_ATTEMPT": str(spec.attempt), "GPUPOOL_REPLICA": str(spec.replica),
                    "GPUPOOL_RESTARTS": str(spec.restart),
                    "GPUPOOL_CHECKPOINT_DIR": paths.checkpoint_dir, "GPUPOOL_WORKDIR": paths.workdir,
                    "GPUPOOL_STOP_DEADLINE_FILE": paths.deadline_file})
        if rec.runtime_deadline is not None:
            env["GPUPOOL_STOP_DEADLINE"] = f"{rec.runtime_deadline:.3f}"
        return env

    def _write_plan(self, spec: LaunchSpec, paths: Paths, driver: Driver, command: str, job_cg: cg.JobCgroup,
                    rec: st.Attempt) -> None:
        env = self._environment(spec, paths, rec)
        if isinstance(driver, ContainerDriver):
            argv = driver.argv(spec, paths, command, driver.write_env(paths, env))
        else:
            argv = driver.argv(spec, paths, command)
        uid, gid = driver.runs_as(spec.uid, spec.gid)
        if not self._root:
            uid = gid = None
        plan = {"path": driver.exec_path(spec, command), "argv": argv, "env": driver.exec_env(spec, paths, env),
                "cwd": driver.exec_cwd(paths), "uid": uid, "gid": gid,
                "cgroup": job_cg.descriptor(), "cgroup_procs": job_cg.procs_files(),
                "launchers": list(driver.launchers), "ready": "work" if driver.launchers else "exec",
                "setup_failure": list(driver.setup_failure), "log_max_bytes": spec.log_max_bytes}
        # for the shim: marshal loads without importing json (and re) on every job's start path. Written once, in
        # place (no temp file + rename, a millisecond on ext4), before the shim that reads it exists.
        fd = os.open(os.path.join(paths.attempt_dir, "plan.marshal"),
                     os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o640)
        try:
            os.write(fd, marshal.dumps(plan))
        finally:
            os.close(fd)

    async def _start_shim(self, rec: st.Attempt, driver: Driver, job_cg: cg.JobCgroup) -> int:
        alloc = rec.spec.allocation_id
        r, w = os.pipe2(os.O_CLOEXEC)
        w3 = fcntl.fcntl(w, fcntl.F_DUPFD_CLOEXEC, 10)
        os.close(w)
        shim_log = os.path.join(rec.attempt_dir, "shim.log")
        try:
            pid = await self._starter.start(rec.attempt_dir, shim_log, w3)
        except (OSError, ServerUnanswered) as e:
            os.close(r)
            await self._abort(rec, job_cg)
            raise LaunchError("LaunchFailed", f"cannot start the shim {self._python}: {e}") from e
        finally:
            os.close(w3)
        rec.shim_pid, rec.shim_start = pid, st.proc_start_time(pid)
        self._save(rec)
        live = self._live.setdefault(alloc, _Live())
        live.owned = True
        try:
            line = await self._read_report(r, pid)
        finally:
            os.close(r)
        if not line.get("ok"):
            if line.get("stage") in ("shim", "timeout"):
                line["message"] = line.get("message", "") + _tail(shim_log)
            await self._abort(rec, job_cg)
            raise self._launch_error(driver, line)
        rec.state, rec.pid, rec.started_at = "running", int(line["pid"]), float(line["started_at"])
        if job_cg.kind == "none":
            rec.cgroup = cg.NoCgroup(rec.pid).descriptor()
        # not saved: the shim's `started` file says the same, and a restart reads it (`_read_started`)
        if not self._closed:  # closed meanwhile: the next executor's adopt() takes it over
            self._watch(rec)
            self._arm(rec)
        return rec.pid

    async def _read_report(self, fd: int, shim_pid: int) -> dict[str, Any]:
        """The shim's one line: {"ok": true, "pid": ...} or {"ok": false, "stage": ..., ...}."""
        loop = asyncio.get_running_loop()
        os.set_blocking(fd, False)
        buf = bytearray()
        done: asyncio.Future[None] = loop.create_future()

        def readable() -> None:
            try:
                chunk = os.read(fd, 4096)
            except BlockingIOError:
                return
            buf.extend(chunk)
            if (not chunk or b"\n" in buf) and not done.done():
                done.set_result(None)

        loop.add_reader(fd, readable)
        try:
            await asyncio.wait_for(done, self._launch_timeout)
        except TimeoutError:
            with contextlib.suppress(ProcessLookupError):
                os.kill(shim_pid, 9)
            return {"ok": False, "stage": "timeout", "message": f"no start within {self._launch_timeout} s"}
        finally:
            loop.remove_reader(fd)
        text = bytes(buf).split(b"\n", 1)[0]
        if not text:
            return {"ok": False, "stage": "shim", "message": "the shim ended without a word"}
        return json.loads(text)

    def _launch_error(self, driver: Driver, failure: dict[str, Any]) -> LaunchError:
        stage = failure.get("stage")
        if stage == "setup":
            return driver.launch_error(failure)
        if stage == "exec":
            reason = "DriverUnavailable" if driver.launchers else "CommandNotFound"
            return LaunchError(reason, failure.get("message", "exec failed"))
        return LaunchError(_STAGE_REASON.get(stage, "LaunchFailed"), failure.get("message", str(failure)))

    async def _abort(self, rec: st.Attempt, job_cg: cg.JobCgroup) -> None:
        """A launch that failed: nothing of it may stay (cgroup emptied and removed, record dropped)."""
        await self._empty(job_cg, rec.launchers, rec.spec.allocation_id)
        job_cg.remove()
        if rec.shim_pid:
            self._spawn(_reap(rec.shim_pid))
        self._attempts.pop(rec.spec.allocation_id, None)
        self._live.pop(rec.spec.allocation_id, None)
        shutil.rmtree(rec.attempt_dir, ignore_errors=True)  # its record with it

    # --- watch ---------------------------------------------------------------------------------------------
    def _watch(self, rec: st.Attempt) -> None:
        """Call _shim_gone when the shim exits: a pidfd works for a child and for an adopted shim alike."""
        alloc = rec.spec.allocation_id
        live = self._live.setdefault(alloc, _Live())
        try:
            fd = os.pidfd_open(rec.shim_pid)
        except ProcessLookupError:
            self._shim_gone(alloc)
            return
        except OSError:  # no pidfd (kernel < 5.3): poll
            self._spawn(self._poll_shim(alloc))
            return
        if st.proc_start_time(rec.shim_pid) != rec.shim_start:  # gone, or the pid is someone else's now
            os.close(fd)
            self._shim_gone(alloc)
            return
        live.pidfd = fd
        asyncio.get_running_loop().add_reader(fd, self._shim_gone, alloc)

    async def _poll_shim(self, alloc: str) -> None:
        rec = self._attempts[alloc]
        while True:
            if st.proc_start_time(rec.shim_pid) != rec.shim_start:
                break
            await asyncio.sleep(0.2)
        self._shim_gone(alloc)

    def _shim_gone(self, alloc: str) -> None:
        live = self._live.setdefault(alloc, _Live())
        if live.pidfd is not None:
            asyncio.get_running_loop().remove_reader(live.pidfd)
            os.close(live.pidfd)
            live.pidfd = None
        rec = self._attempts.get(alloc)
        if rec is None or live.finishing is not None:
            return
        if rec.shim_pid:
            with contextlib.suppress(ChildProcessError, OSError):
                os.waitpid(rec.shim_pid, os.WNOHANG)  # ours (not after a restart): reap it
        live.finishing = self._spawn(self._finish(alloc))

    def _read_started(self, rec: st.Attempt) -> None:
        data = _read_json(os.path.join(rec.attempt_dir, "started"))
        if data:
            rec.pid, rec.started_at = int(data["pid"]), float(data["started_at"])
            if rec.state == "starting":
                rec.state = "running"
            if rec.cgroup.get("kind") == "none":
                rec.cgroup = cg.NoCgroup(rec.pid).descriptor()

    # --- timers: warn, max runtime, stop deadline ----------------------------------------------------------
    def _arm(self, rec: st.Attempt) -> None:
        live = self._live.setdefault(rec.spec.allocation_id, _Live())
        if live.timer is not None:
            live.timer.cancel()
        live.timer = self._spawn(self._timer(rec.spec.allocation_id))

    async def _timer(self, alloc: str) -> None:
        while True:
            rec = self._attempts.get(alloc)
            if rec is None or rec.state == "ended":
                return
            due = []
            if rec.warn_at is not None and not rec.warned and rec.stop_deadline is None:
                due.append((rec.warn_at, "warn"))
            if rec.runtime_deadline is not None and not rec.runtime_stopped:
                due.append((rec.runtime_deadline, "runtime"))
            if rec.stop_deadline is not None and rec.killed_at is None:
                due.append((rec.stop_deadline, "kill"))
            if not due:
                return
            at, what = min(due)
            if at > time.time():
                await asyncio.sleep(at - time.time())
                continue
            job_cg = cg.from_descriptor(rec.cgroup)
            if what == "warn":
                rec.warned = True
                sent = cg.signal_work(job_cg, signal_number(rec.spec.warn_signal), rec.launchers)
                log.info("allocation %s: %s sent to %d processes (runtime limit ahead)", alloc,
                         rec.spec.warn_signal, sent)
            elif what == "runtime":
                rec.runtime_stopped = True
                self._request_stop(rec, None, None, "MaxRuntimeExceeded")
            else:
                rec.killed_at = time.time()
                self._save(rec)
                log.info("allocation %s: stop deadline reached, killing its cgroup", alloc)
                await self._empty(job_cg, rec.launchers, alloc)
            self._save(rec)

    # --- stop ----------------------------------------------------------------------------------------------
    async def stop(self, allocation_id: str, *, signal: str | None = None, deadline: datetime | None = None,
                   reason: str = "") -> None:
        """Send the stop signal (default the spec's) to every process of the attempt's cgroup, write the deadline
        file, and kill the cgroup at the deadline (default now + min(stop_grace_s, max_stop_grace_s)). A later
        stop may move the deadline earlier, never later; a signal already sent is not sent again. Stopping an
        unknown or ended allocation does nothing."""
        if signal is not None and signal_number(signal) is None:
            raise ValueError(f"{signal!r} is not a signal name")
        if allocation_id in self._launching:
            with contextlib.suppress(Exception):
                await asyncio.shield(self._launching[allocation_id])
        rec = self._attempts.get(allocation_id)
        if rec is None or rec.state != "running":
            return
        moved = self._request_stop(rec, signal, deadline, reason or "Stopped")
        self._save(rec)
        if moved:
            self._arm(rec)

    def _request_stop(self, rec: st.Attempt, signal: str | None, deadline: datetime | None, reason: str) -> bool:
        """Record the stop and signal the work; True when the deadline moved (the timer must be re-armed)."""
        spec = rec.spec
        when = deadline.timestamp() if deadline is not None else time.time() + min(spec.stop_grace_s,
                                                                                  self._max_grace)
        if rec.stop_deadline is None:
            rec.stop_reason = reason
        moved = rec.stop_deadline is None or when < rec.stop_deadline
        if moved:
            rec.stop_deadline = when
            text = f"{when:.3f} {utc(when).isoformat()}\n"
            with contextlib.suppress(OSError):
                tmp = rec.deadline_file + ".tmp"
                with open(tmp, "w") as f:
                    f.write(text)
                os.chmod(tmp, 0o644)
                os.replace(tmp, rec.deadline_file)
        name = signal or spec.stop_signal
        if name not in rec.stop_signals:
            rec.stop_signals.append(name)
            sent = cg.signal_work(cg.from_descriptor(rec.cgroup), signal_number(name), rec.launchers)
            log.info("allocation %s: %s sent to %d processes, deadline %s (%s)", spec.allocation_id, name, sent,
                     utc(rec.stop_deadline).isoformat(), reason)
        return moved

    # --- end and report ------------------------------------------------------------------------------------
    async def _empty(self, job_cg: cg.JobCgroup, launchers: list[str], alloc: str) -> None:
        """Kill until the cgroup is empty. Never gives up (the GPUs are released only once it is empty); says
        so every 30 s while something survives (a task stuck in the kernel)."""
        warn_at = time.monotonic() + 30
        for delay in cg.emptying(job_cg, launchers):
            if time.monotonic() > warn_at:
                warn_at = time.monotonic() + 30
                log.warning("allocation %s: cgroup still not empty after SIGKILL: %s", alloc, job_cg.pids())
            await asyncio.sleep(delay)

    async def _finish(self, alloc: str) -> None:
        rec = self._attempts[alloc]
        status = _read_json(os.path.join(rec.attempt_dir, "status.json"))
        if rec.pid is None:
            self._read_started(rec)
        job_cg = cg.from_descriptor(rec.cgroup)
        await self._empty(job_cg, rec.launchers, alloc)
        stats = job_cg.stats()
        report = self._report(rec, status, stats)
        rec.report, rec.state, rec.ended_at = report.to_dict(), "ended", time.time()
        self._save(rec)  # before the cgroup goes: a restart now re-sends these same numbers
        job_cg.remove()
        live = self._live.get(alloc)
        if live and live.timer is not None:
            live.timer.cancel()
        cleanup = self._drivers[rec.spec.isolation].cleanup_command(self._paths_of(rec))
        if cleanup and (rec.killed_at is not None or status is None):
            self._spawn(_run_quietly(*cleanup))
        await self._deliver(alloc)

    def _paths_of(self, rec: st.Attempt) -> Paths:
        return Paths(str(self.state_dir), rec.attempt_dir, rec.workdir, rec.checkpoint_dir, rec.control_dir,
                     rec.deadline_file, None, rec.container_name)

    def _report(self, rec: st.Attempt, status: dict[str, Any] | None, stats: cg.CgroupStats) -> ExitReport:
        spec = rec.spec
        stopped = rec.stop_deadline is not None
        now = time.time()
        if status is None or "launch_failed" in status:
            why = (status or {}).get("launch_failed", {}).get("message")
            reason = "LaunchFailed" if why else "Lost"
            message = (f"the launch failed while the agent was away: {why}" if why else
                       "the shim ended without a status (killed?); the cgroup was emptied")
            exit_code = sig = None
            started, exited = rec.started_at or rec.launched_at, now
            cpu = stats.cpu_s
            oom = stats.oom_kills > 0
        else:
            exit_code, sig = status.get("exit_code"), status.get("signal")
            oom = stats.oom_kills > 0 or status.get("oom_events", 0) > 0
            reason = classify_exit(exit_code, sig, oom, stopped, rec.runtime_stopped)
            started, exited = float(status["started_at"]), float(status["exited_at"])
            cpu = max(stats.cpu_s, float(status.get("children_cpu_s", 0.0)))
            message = _describe(exit_code, sig, oom, spec, rec)
        return ExitReport(allocation_id=spec.allocation_id, job_id=spec.job_id, attempt=spec.attempt,
                          replica=spec.replica, exit_code=exit_code, signal=sig, oom=oom, reason=reason,
                          message=message, started_at=utc(started), exited_at=utc(exited),
                          wall_s=max(0.0, exited - started), cpu_s=round(cpu, 6), stopped=stopped, pid=rec.pid)

    async def _deliver(self, alloc: str) -> None:
        delay = 0.5
        while not self._closed:
            rec = self._attempts.get(alloc)
            if rec is None or rec.reported or rec.report is None:
                return
            try:
                await self._on_exit(ExitReport.from_dict(rec.report))
            except Exception:
                log.exception("allocation %s: on_exit failed; retrying in %.1f s", alloc, delay)
                await asyncio.sleep(delay)
                delay = min(delay * 2, 30.0)
                continue
            rec.reported = True
            self._save(rec)
            return

    # --- restart -------------------------------------------------------------------------------------------
    async def adopt(self) -> list[str]:
        """At agent start: take over what the attempts' records list. A live shim is watched again (its deadlines
        re-armed), an exited one is reported from its status.json, a vanished one as Lost after its cgroup was
        emptied; ended attempts whose report was not delivered are delivered. Cgroups of this node that no
        attempt owns are emptied and removed. Returns the allocation ids taken over (running or reported now)."""
        taken = []
        for alloc, rec in list(self._attempts.items()):
            live = self._live.setdefault(alloc, _Live())
            if live.owned:
                continue
            live.owned = True
            if rec.state == "ended":
                job_cg = cg.from_descriptor(rec.cgroup)
                if job_cg.exists():
                    await self._empty(job_cg, rec.launchers, alloc)
                    job_cg.remove()
                if not rec.reported:
                    live.delivering = self._spawn(self._deliver(alloc))
                    taken.append(alloc)
                continue
            taken.append(alloc)
            if rec.pid is None:
                self._read_started(rec)
            if rec.shim_pid and st.proc_start_time(rec.shim_pid) == rec.shim_start:
                self._watch(rec)
                self._arm(rec)
            else:
                self._shim_gone(alloc)
            self._save(rec)
        for stray in self.cgroups.jobs(self.cgroup_name) - set(self._attempts):
            job_cg = self.cgroups.job(self.cgroup_name, stray)
            log.warning("cgroup %s of this node belongs to no known attempt: emptying and removing it", stray)
            await self._empty(job_cg, [], stray)
            job_cg.remove()
        return taken

    # --- queries -------------------------------------------------------------------------------------------
    def running(self) -> dict[str, dict[str, Any]]:
        out = {}
        for alloc, rec in self._attempts.items():
            if rec.state == "ended":
                continue
            out[alloc] = {
                "job_id": rec.spec.job_id, "attempt": rec.spec.attempt, "replica": rec.spec.replica,
                "isolation": rec.spec.isolation, "gpu_indices": list(rec.spec.gpu_indices), "pid": rec.pid,
                "shim_pid": rec.shim_pid, "state": rec.state,
                "started_at": utc(rec.started_at) if rec.started_at else None,
                "stop_deadline": utc(rec.stop_deadline) if rec.stop_deadline else None,
                "runtime_deadline": utc(rec.runtime_deadline) if rec.runtime_deadline else None,
                "cgroup": dict(rec.cgroup), "workdir": rec.workdir, "checkpoint_dir": rec.checkpoint_dir}
        return out

    def pids(self, allocation_id: str) -> set[int]:
        """Every process of the attempt now (its cgroup's, subtree included); empty once ended or unknown."""
        rec = self._attempts.get(allocation_id)
        if rec is None or rec.state == "ended":
            return set()
        return cg.from_descriptor(rec.cgroup).pids()

    def usage(self, allocation_id: str) -> tuple[float, float]:
        """(CPU cores used on average since the previous call — or since the start —, resident MiB now)."""
        rec = self._attempts.get(allocation_id)
        if rec is None or rec.state == "ended":
            return 0.0, 0.0
        stats = cg.from_descriptor(rec.cgroup).stats()
        live = self._live.setdefault(allocation_id, _Live())
        now = time.monotonic()
        if live.sample is None:
            since = max(1e-3, time.time() - (rec.started_at or rec.launched_at))
            cores = stats.cpu_s / since
        else:
            cores = (stats.cpu_s - live.sample[1]) / max(1e-3, now - live.sample[0])
        live.sample = (now, stats.cpu_s)
        return max(0.0, cores), stats.rss_bytes / (1024 * 1024)

    def read_logs(self, allocation_id: str, stream: str, offset: int = 0, limit: int = 65536,
                  tail: int | None = None) -> tuple[bytes, int, bool]:
        """(data, next_offset, complete). Offsets count bytes since the attempt started; an offset rotated away
        starts at the oldest byte kept; `tail` gives the last N bytes. `complete`: the attempt has ended and
        everything was read. KeyError for an unknown (or pruned) allocation."""
        if stream not in ("stdout", "stderr"):
            raise ValueError("stream must be 'stdout' or 'stderr'")
        rec = self._attempts[allocation_id]
        data, next_offset, end = read_log(os.path.join(rec.attempt_dir, f"{stream}.log"), offset, limit, tail)
        ended = os.path.exists(os.path.join(rec.attempt_dir, "status.json"))
        return data, next_offset, ended and next_offset >= end

    def prune(self, keep_s: float) -> list[str]:
        """Forget attempts that ended (and were reported) more than keep_s ago: their attempt dirs (logs) and the
        workdirs the executor made go; checkpoint dirs stay."""
        cutoff = time.time() - keep_s
        gone = [a for a, r in self._attempts.items()
                if r.state == "ended" and r.reported and (r.ended_at or 0) < cutoff]
        for alloc in gone:
            rec = self._attempts.pop(alloc)
            self._live.pop(alloc, None)
            shutil.rmtree(rec.attempt_dir, ignore_errors=True)
            if rec.workdir_made and not any(r.spec.job_id == rec.spec.job_id for r in self._attempts.values()):
                shutil.rmtree(os.path.dirname(rec.workdir), ignore_errors=True)
        return gone

    # --- lifecycle -----------------------------------------------------------------------------------------
    def close(self) -> None:
        """Stop watching and timing; the work and its shims keep running (a later adopt() takes them over)."""
        self._closed = True
        loop = None
        with contextlib.suppress(RuntimeError):
            loop = asyncio.get_running_loop()
        for live in self._live.values():
            if live.pidfd is not None:
                if loop is not None:
                    loop.remove_reader(live.pidfd)
                os.close(live.pidfd)
                live.pidfd = None
        for task in list(self._background):
            task.cancel()
        self._live.clear()
        self._starter.close()
        self.cgroups.release_node(self.cgroup_name)  # only where empty: running work keeps its cgroups
        if self._lock is not None:
            os.close(self._lock)  # releases the flock: another executor may take this state dir
            self._lock = None

    def _spawn(self, coro: Awaitable[Any]) -> asyncio.Task:
        task = asyncio.get_running_loop().create_task(coro)
        self._background.add(task)
        task.add_done_callback(self._background.discard)
        task.add_done_callback(_log_failure)
        return task

    def _save(self, rec: st.Attempt) -> None:
        st.save(rec)


def _lock(path: Path) -> int:
    """One executor per state dir (two would both watch and report the same work)."""
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        raise RuntimeError(f"another executor holds {path}") from None
    return fd


def _describe(exit_code: int | None, sig: str | None, oom: bool, spec: LaunchSpec, rec: st.Attempt) -> str:
    parts = [f"exit code {exit_code}" if exit_code is not None else f"killed by {sig}"]
    if oom:
        parts.append(f"OOM-killed in its memory cgroup (limit {spec.limits.memory_mib} MiB)")
    if rec.stop_deadline is not None:
        parts.append(f"stopped ({rec.stop_reason})")
        if rec.killed_at is not None:
            parts.append("killed at the stop deadline")
    return "; ".join(parts)


def _read_json(path: str) -> dict[str, Any] | None:
    try:
        with open(path, "rb") as f:
            return json.loads(f.read())
    except (OSError, ValueError):
        return None


def _tail(path: str, n: int = 2000) -> str:
    try:
        with open(path, "rb") as f:
            f.seek(0, os.SEEK_END)
            f.seek(max(0, f.tell() - n))
            return ": " + f.read().decode(errors="replace").strip()
    except OSError:
        return ""


def _reaped(pid: int) -> bool:
    try:
        done, _status = os.waitpid(pid, os.WNOHANG)
    except ChildProcessError:
        return True
    return done != 0


async def _reap(pid: int) -> None:
    """Reap a child shim that is ending (after a failed launch) without blocking the loop."""
    for _ in range(600):
        if _reaped(pid):
            return
        await asyncio.sleep(0.05)


async def _run_quietly(argv: list[str], env: dict[str, str]) -> None:
    proc = await asyncio.create_subprocess_exec(*argv, env=env, stdout=asyncio.subprocess.DEVNULL,
                                                stderr=asyncio.subprocess.DEVNULL)
    await proc.wait()


def _log_failure(task: asyncio.Task) -> None:
    if not task.cancelled() and task.exception() is not None:
        log.error("executor task failed", exc_info=task.exception())
