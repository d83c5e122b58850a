"""The process driver with real cgroups: exit codes, environment, logs, limits, device allow-list, the tree."""

from __future__ import annotations

import asyncio
import dataclasses
import os
import textwrap
import time

import pytest
from executor_support import (
    JOB_ENV,
    PY,
    alive,
    needs_cgroups,
    needs_cpu_cgroup,
    needs_devices_cgroup,
    needs_memory_cgroup,
    needs_pids_cgroup,
    needs_python,
    needs_root,
)

from services.agent.executor import LaunchError, LaunchSpec, Limits

pytestmark = [needs_root, needs_python]


def spec(alloc: str, argv: list[str], **kw) -> LaunchSpec:
    return LaunchSpec(allocation_id=alloc, job_id=kw.pop("job_id", f"job-{alloc}"), argv=argv,
                      env=kw.pop("env", JOB_ENV), **kw)


def py(code: str) -> list[str]:
    return [PY, "-c", textwrap.dedent(code)]


async def test_env_exit_code_and_identity(make_executor, reports, state_dir) -> None:
    ex = make_executor()
    pid = await ex.launch(spec("a-env", ["sh", "-c", "env; echo uid=$(id -u) cwd=$(pwd); exit 3"],
                               attempt=2, replica=1))
    assert pid > 0
    r = await reports.next()
    assert (r.allocation_id, r.job_id, r.attempt, r.replica) == ("a-env", "job-a-env", 2, 1)
    assert (r.exit_code, r.signal, r.reason, r.oom, r.stopped, r.pid) == (3, None, "NonZeroExit", False, False, pid)
    assert r.started_at <= r.exited_at and r.wall_s >= 0 and r.cpu_s >= 0
    out = ex.read_logs("a-env", "stdout")[0].decode()
    env = dict(line.split("=", 1) for line in out.splitlines() if "=" in line and not line.startswith("uid="))
    workdir = str(state_dir / "jobs" / "job-a-env" / "work")
    assert env["GPUPOOL_ALLOCATION_ID"] == "a-env" and env["GPUPOOL_JOB_ID"] == "job-a-env"
    assert env["GPUPOOL_ATTEMPT"] == "2" and env["GPUPOOL_REPLICA"] == "1"
    assert env["GPUPOOL_WORKDIR"] == workdir
    assert env["GPUPOOL_CHECKPOINT_DIR"] == str(state_dir / "checkpoints" / "job-a-env")
    assert env["GPUPOOL_STOP_DEADLINE_FILE"].startswith(str(state_dir / "attempts" / "a-env"))
    assert "GPUPOOL_STOP_DEADLINE" not in env  # no max runtime
    assert env["LANG"] == "C.UTF-8"  # the agent's environment is passed as given
    assert f"uid=65534 cwd={workdir}" in out  # unprivileged, in its workdir
    assert ex.running() == {} and ex.pids("a-env") == set()
    assert os.path.isdir(env["GPUPOOL_CHECKPOINT_DIR"])  # kept after the attempt


async def test_completed_and_idempotent_launch(make_executor, reports) -> None:
    ex = make_executor()
    s = spec("a-idem", py("import time; time.sleep(0.5)"))
    pid = await ex.launch(s)
    assert await ex.launch(s) == pid  # already running: same pid, nothing new started
    assert set(ex.running()) == {"a-idem"} and pid in ex.pids("a-idem")
    r = await reports.next()
    assert (r.exit_code, r.reason) == (0, "Completed")
    assert await ex.launch(s) == pid  # already ended (same attempt): no second run, no second report
    assert reports.empty()


async def test_a_restart_on_the_same_allocation_runs_again_and_its_end_is_reported_too(make_executor, reports) -> None:
    """A service replica restarted in place (issue #17): the same allocation, `restart` + 1, watched anew."""
    ex = make_executor()
    s = spec("a-again", ["sh", "-c", "echo run $GPUPOOL_RESTARTS; exit 4"])
    await ex.launch(s)
    first = await reports.next()
    assert (first.exit_code, first.reason) == (4, "NonZeroExit")
    await asyncio.sleep(0)  # the report is delivered: now the allocation may run again
    again = LaunchSpec(**{**s.to_dict(), "restart": 1, "limits": s.limits})
    await ex.launch(again)
    second = await reports.next()
    assert (second.allocation_id, second.exit_code) == ("a-again", 4)
    assert ex.read_logs("a-again", "stdout")[0] == b"run 1\n"
    await ex.launch(dataclasses.replace(again, restart=2, argv=["sleep", "30"]))
    await ex.stop("a-again", deadline=None, reason="Stopped")
    third = await reports.next()
    assert third.reason == "Stopped" and ex.running() == {}


async def test_logs_offsets_tail_and_rotation(make_executor, reports, state_dir) -> None:
    ex = make_executor()
    # 100 lines of 100 bytes = 10,000 bytes > 2 × 4096: two rotations.
    await ex.launch(spec("a-logs", py("""
        import sys
        for i in range(100):
            sys.stdout.write(f"{i:04d}" + "x" * 95 + "\\n")
            sys.stdout.flush()
        sys.stderr.write("done\\n")
    """), log_max_bytes=4096))
    await reports.next()
    attempt = state_dir / "attempts" / "a-logs"
    assert (attempt / "stdout.log").stat().st_size <= 4096
    assert (attempt / "stdout.log.1").stat().st_size <= 4096
    assert not (attempt / "stdout.log.2").exists()
    expected = b"".join(f"{i:04d}".encode() + b"x" * 95 + b"\n" for i in range(100))
    data, nxt, complete = ex.read_logs("a-logs", "stdout", offset=0)
    assert nxt == 10_000 and complete  # offset 0 was rotated away: starts at the oldest byte kept
    assert data == expected[4096:]  # stdout.log.1 holds 4096..8191, stdout.log 8192..9999
    data, nxt, complete = ex.read_logs("a-logs", "stdout", tail=150)
    assert data == expected[-150:] and nxt == 10_000 and complete
    first, nxt, complete = ex.read_logs("a-logs", "stdout", offset=9000, limit=500)
    assert first == expected[9000:9500] and nxt == 9500 and not complete  # more to read
    rest, nxt, complete = ex.read_logs("a-logs", "stdout", offset=nxt)
    assert rest == expected[9500:] and complete
    assert ex.read_logs("a-logs", "stderr") == (b"done\n", 5, True)


async def test_logs_while_running_are_not_complete(make_executor, reports) -> None:
    ex = make_executor()
    await ex.launch(spec("a-live", ["sh", "-c", "echo hello; sleep 0.6; echo bye"]))
    await _until_logged(ex, "a-live", b"hello\n")
    assert ex.read_logs("a-live", "stdout") == (b"hello\n", 6, False)
    await reports.next()
    assert ex.read_logs("a-live", "stdout") == (b"hello\nbye\n", 10, True)


async def _until_logged(ex, alloc: str, data: bytes) -> None:
    for _ in range(200):
        if ex.read_logs(alloc, "stdout")[0] == data:
            return
        await asyncio.sleep(0.01)
    raise AssertionError(f"{alloc} never logged {data!r}")


@needs_memory_cgroup
async def test_memory_limit_oom_kill(make_executor, reports) -> None:
    ex = make_executor()
    await ex.launch(spec("a-oom", py("x = bytearray(200 * 1024 * 1024); print(len(x))"),
                         limits=Limits(memory_mib=64)))
    r = await reports.next()
    assert r.oom and r.reason == "OutOfMemory" and r.signal == "SIGKILL", r
    assert "OOM" in r.message


@needs_pids_cgroup
async def test_pids_limit_makes_fork_fail(make_executor, reports) -> None:
    ex = make_executor()
    await ex.launch(spec("a-pids", py("""
        import os, time
        kids = []
        try:
            for _ in range(200):
                pid = os.fork()
                if pid == 0:
                    time.sleep(30)
                    os._exit(0)
                kids.append(pid)
            print("forked all 200")
        except BlockingIOError as e:
            print(f"fork failed errno={e.errno} after {len(kids)}")
    """), limits=Limits(pids=16)))
    r = await reports.next()
    out = ex.read_logs("a-pids", "stdout")[0].decode()
    assert "fork failed errno=11" in out, out  # EAGAIN from the pids controller
    assert (r.exit_code, r.reason) == (0, "Completed")  # its sleeping children were killed after it exited


@needs_cpu_cgroup
async def test_cpu_quota_and_usage(make_executor, reports) -> None:
    ex = make_executor()
    await ex.launch(spec("a-cpu", py("""
        import time
        ballast = bytearray(48 * 1024 * 1024)
        for i in range(0, len(ballast), 4096):
            ballast[i] = 1
        end = time.time() + 1.2
        while time.time() < end:
            pass
    """), limits=Limits(cpu_milli=500)))
    ex.usage("a-cpu")  # starts the window
    await asyncio.sleep(0.9)
    cores, rss_mib = ex.usage("a-cpu")
    assert 0.2 < cores < 0.65, cores  # half a core at most
    assert rss_mib > 40, rss_mib
    r = await reports.next()
    assert r.reason == "Completed" and 0.3 < r.cpu_s < 0.9, r.cpu_s


@needs_devices_cgroup
async def test_device_allow_list_grants_only_the_given_gpus(make_executor, reports, fake_devices) -> None:
    ex = make_executor()
    await ex.launch(spec("a-dev", py(f"""
        import errno, os
        for name in ("nvidia0", "nvidia1", "nvidia2", "nvidia3", "nvidiactl"):
            try:
                os.close(os.open("{fake_devices}/" + name, os.O_RDONLY))
                print(name, "opened")
            except OSError as e:
                print(name, errno.errorcode[e.errno])
    """), gpu_indices=[1], device_dir=str(fake_devices)))
    r = await reports.next()
    assert r.reason == "Completed"
    seen = dict(line.split() for line in ex.read_logs("a-dev", "stdout")[0].decode().splitlines())
    # ENXIO: the cgroup let the open through to a device with no driver; EPERM: the cgroup refused it.
    assert seen == {"nvidia0": "EPERM", "nvidia1": "ENXIO", "nvidia2": "EPERM", "nvidia3": "EPERM",
                    "nvidiactl": "ENXIO"}


@needs_cgroups
async def test_background_child_is_killed_before_the_report(make_executor, reports) -> None:
    ex = make_executor()
    started = time.monotonic()
    await ex.launch(spec("a-bg", ["sh", "-c", "sleep 30 & echo $!; exit 0"]))
    r = await reports.next()
    child = int(ex.read_logs("a-bg", "stdout")[0])
    assert r.reason == "Completed" and time.monotonic() - started < 5
    assert not alive(child)  # killed before the report: the cgroup was empty


async def test_command_not_found(make_executor, state_dir) -> None:
    ex = make_executor()
    with pytest.raises(LaunchError) as e:
        await ex.launch(spec("a-none", ["no-such-command-gpupool"]))
    assert e.value.reason == "CommandNotFound"
    with pytest.raises(LaunchError) as e:
        await ex.launch(spec("a-none", ["/etc/hostname"]))  # exists, not executable
    assert e.value.reason == "CommandNotFound"
    assert ex.running() == {} and not (state_dir / "attempts" / "a-none").exists()


async def test_unknown_isolation_and_drivers_not_offered(make_executor) -> None:
    ex = make_executor(drivers={"process"})
    offered = ex.offered_drivers()
    assert offered["process"] is None and offered["sandbox"] and offered["container"]
    for isolation in ("vm", "sandbox", "container"):
        with pytest.raises(LaunchError) as e:
            await ex.launch(spec("a-iso", ["true"], isolation=isolation, rootfs="/"))
        assert e.value.reason == "DriverUnavailable", e.value
    with pytest.raises(LaunchError) as e:
        await ex.launch(spec("a-bad", ["true"], stop_signal="SIGNOPE"))
    assert e.value.reason == "LaunchFailed"
    assert ex.running() == {}


async def test_workdir_unavailable(make_executor, tmp_path) -> None:
    private = tmp_path / "private"
    private.mkdir(mode=0o700)  # the job's uid cannot enter it
    (private / "work").mkdir()
    ex = make_executor()
    with pytest.raises(LaunchError) as e:
        await ex.launch(spec("a-wd", ["true"], workdir=str(private / "work")))
    assert e.value.reason == "WorkdirUnavailable", e.value
    assert ex.running() == {}


async def test_max_runtime_warns_then_stops(make_executor, reports) -> None:
    ex = make_executor()
    await ex.launch(spec("a-rt", py("""
        import os, signal, sys, time
        print("deadline", os.environ["GPUPOOL_STOP_DEADLINE"], flush=True)
        signal.signal(signal.SIGUSR1, lambda *_: print("warned", flush=True))
        def term(*_):
            print("term", open(os.environ["GPUPOOL_STOP_DEADLINE_FILE"]).read().strip(), flush=True)
            sys.exit(0)
        signal.signal(signal.SIGTERM, term)
        while True:
            time.sleep(0.05)
    """), max_runtime_s=1.0, warn_before_s=0.6, stop_grace_s=2.0))
    launched = time.time()
    r = await reports.next()
    out = ex.read_logs("a-rt", "stdout")[0].decode().splitlines()
    assert out[0].startswith("deadline ") and abs(float(out[0].split()[1]) - (launched + 1.0)) < 0.5
    assert out[1] == "warned" and out[2].startswith("term ")
    unix, iso = out[2].split()[1:]
    assert abs(float(unix) - (launched + 3.0)) < 0.5 and iso.startswith("20")
    assert (r.reason, r.stopped, r.exit_code) == ("MaxRuntimeExceeded", True, 0)
    assert 0.9 < r.wall_s < 2.5


async def test_a_cancelled_launch_still_runs_and_reports(make_executor, reports) -> None:
    ex = make_executor()
    call = asyncio.ensure_future(ex.launch(spec("a-cancel", ["sh", "-c", "exit 9"])))
    await asyncio.sleep(0)  # the launch has begun
    call.cancel()
    r = await reports.next()  # the attempt was watched all the same: never orphaned
    assert (r.allocation_id, r.exit_code) == ("a-cancel", 9)


async def test_the_shim_adopts_the_works_orphans(make_executor, reports, state_dir) -> None:
    """PR_SET_CHILD_SUBREAPER: a process whose parent exits is re-parented to the attempt's shim (which reaps it),
    not to the machine's init."""
    ex = make_executor()
    work = await ex.launch(spec("a-orphan", ["sh", "-c", "(sleep 30 & echo $! > orphan) ; sleep 30"]))
    shim = ex.running()["a-orphan"]["shim_pid"]
    orphan_file = state_dir / "jobs" / "job-a-orphan" / "work" / "orphan"
    deadline = time.monotonic() + 10
    while not (orphan_file.exists() and orphan_file.read_text().strip()):
        assert time.monotonic() < deadline, "the orphan never started"
        await asyncio.sleep(0.02)
    orphan = int(orphan_file.read_text())
    with open(f"/proc/{orphan}/stat") as f:
        ppid = int(f.read().rsplit(") ", 1)[1].split()[1])
    assert ppid == shim and ppid != work
    await ex.stop("a-orphan", signal="SIGKILL")
    r = await reports.next()
    assert r.allocation_id == "a-orphan" and not alive(orphan)
