"""The agent runs the work: real processes in real cgroups on the simulated fleet, through `gpupool up`.

A job's command is launched on its granted GPUs, its exit ends the job and releases the GPUs without any
`complete`, preemption reaches the process as its stop signal with a grace, and a process that ignores it is killed
before its GPUs go to the next holder. Needs root (cgroups, device nodes); skipped with the reason otherwise."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from support import AllocationWatcher, complete, fake_nvidia_devices, finish_all, wait_state

from libs.contracts.events import AllocationGranted, AllocationReleased

pytestmark = [pytest.mark.e2e,
              pytest.mark.skipif(os.geteuid() != 0, reason="the executor needs root for cgroups and device nodes")]


DEVICES = fake_nvidia_devices(4)
FLEET_NODES = 1
UP_ARGS = ["--fleet", "H100-80GB*4",
           "--env", f"agent:DEVICE_DIR={DEVICES}",
           "--env", "placement:PREEMPTION_GRACE_S=3", "--env", "placement:MIN_RUNTIME_S=0",
           "--env", "reclamation:SWEEP_INTERVAL_S=0.5"]


def run(api, name: str, command: list[str], *, gpus: int = 1, **fields) -> str:  # type: ignore[no-untyped-def]
    body = {"name": name, "team": "research", "gpus": gpus, "kind": "batch", "command": command, **fields}
    response = api.post("/v1/jobs", json=body)
    assert response.status_code == 201, response.text
    return response.json()["job_id"]


def wait_finished(api, job_id: str, timeout: float = 30) -> dict:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        job = api.get(f"/v1/jobs/{job_id}").json()
        if job["state"] in ("completed", "failed", "cancelled"):
            return job
        time.sleep(0.1)
    raise AssertionError(f"job {job_id} never finished: {job}")


def logs(api, job_id: str) -> str:  # type: ignore[no-untyped-def]
    response = api.get(f"/v1/jobs/{job_id}/logs", params={"stream": "both"})
    assert response.status_code == 200, response.text
    return response.text


def ledger(api, allocation_id: str, timeout: float = 20) -> dict:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for row in api.get("/v1/usage", params={"limit": 1000}).json()["items"]:
            if row["allocation_id"] == allocation_id:
                return row
        time.sleep(0.2)
    raise AssertionError(f"no usage record for {allocation_id}")


async def test_a_failing_command_ends_its_job_with_its_exit_code_and_frees_its_gpus(platform) -> None:  # type: ignore[no-untyped-def]
    async with AllocationWatcher(platform.nats_url) as watcher:
        with platform.client() as api:
            finish_all(api)
            job_id = run(api, "exit-three", ["sh", "-c", "echo visible=$CUDA_VISIBLE_DEVICES; exit 3"], gpus=2)
            _, _, granted = await watcher.wait_for(AllocationGranted, job_id)
            _, _, released = await watcher.wait_for(AllocationReleased, job_id)
            job = wait_finished(api, job_id)
            assert (job["state"], job["exit_code"], job["reason"]) == ("failed", 3, "NonZeroExit"), job
            assert released.reason == "WorkFailed" and released.exit is not None
            assert released.exit.exit_code == 3 and released.remaining == 0
            # nobody called complete: the exit released the GPUs, and the ledger closed at the exit
            assert "CompletedByUser" not in [h["reason"] for h in job["history"]]
            uuids = sorted(g.uuid for g in granted.gpus)
            assert f"visible={','.join(uuids)}" in logs(api, job_id)
            row = ledger(api, granted.allocation_id)
            ended = row["ended_at"].replace("Z", "+00:00")
            assert abs((released.exit.exited_at - released.released_at).total_seconds()) < 5
            assert ended.startswith(released.released_at.isoformat()[:19])
            assert [h["to"] for h in job["history"]][:4] == ["pending", "launching", "running", "failed"]


async def test_a_checkpointing_job_is_preempted_requeued_and_resumes_from_its_checkpoint(platform) -> None:  # type: ignore[no-untyped-def]
    script = ('ck="$GPUPOOL_CHECKPOINT_DIR/step"; '
              'if [ -f "$ck" ]; then echo "resumed from $(cat "$ck")"; exit 0; fi; '
              'trap \'echo 42 > "$ck"; echo saved; exit 0\' TERM; '
              'echo started; while true; do sleep 0.1; done')
    async with AllocationWatcher(platform.nats_url) as watcher:
        with platform.client() as api:
            finish_all(api)
            training = run(api, "ckpt-train", ["sh", "-c", script], gpus=4, kind="training", stop_grace_s=10)
            wait_state(api, training, "running")
            serving = api.post("/v1/jobs", json={"name": "serve", "team": "research", "gpus": 4,
                                                 "kind": "inference",
                                                 "priority_class": "production-inference"}).json()["job_id"]
            _, _, released = await watcher.wait_for(AllocationReleased, training)
            assert released.reason == "PreemptedByPriority"
            assert released.exit is not None and released.exit.stopped and released.exit.exit_code == 0
            requeued = wait_state(api, training, "pending")
            assert requeued["attempts"] == 1
            await watcher.wait_for(AllocationGranted, serving)
            complete(api, serving)  # once the queue has it running (a grant on NATS can come first)
            done = wait_finished(api, training, timeout=40)
            assert done["state"] == "completed", done
            assert "resumed from 42" in logs(api, training)


async def test_a_job_ignoring_sigterm_is_killed_at_the_deadline_before_the_next_holder_starts(platform) -> None:  # type: ignore[no-untyped-def]
    async with AllocationWatcher(platform.nats_url) as watcher:
        with platform.client() as api:
            finish_all(api)
            stubborn = run(api, "stubborn", ["sh", "-c", "trap '' TERM; (trap '' TERM; sleep 3600) & "
                                                         "while true; do sleep 0.2; done"],
                           gpus=4, stop_grace_s=1)
            wait_state(api, stubborn, "running")
            cancelled_at = time.monotonic()
            api.post(f"/v1/jobs/{stubborn}/cancel", json={"reason": "test"})
            nxt = run(api, "next", ["sh", "-c", "echo next-started"], gpus=4)
            _, _, released = await watcher.wait_for(AllocationReleased, stubborn)
            assert released.exit is not None and released.exit.signal == "SIGKILL" and released.exit.stopped
            assert time.monotonic() - cancelled_at >= 0.9, "killed before its grace"
            _, _, granted = await watcher.wait_for(AllocationGranted, nxt)
            assert granted.granted_at >= released.released_at >= released.exit.exited_at
            assert wait_finished(api, nxt)["state"] == "completed"


async def test_limits_are_enforced_on_the_node(platform) -> None:  # type: ignore[no-untyped-def]
    with platform.client() as api:
        finish_all(api)
        hog = run(api, "hog", ["python3", "-c", "b = bytearray(300 * 2**20); print('allocated')"],
                  limits={"memory_mib": 64})
        fork_probe = ("import os, time\n"
                      "n = 0\n"
                      "for _ in range(10):\n"
                      "    try:\n"
                      "        pid = os.fork()\n"
                      "    except OSError as e:\n"
                      "        print('fork failed errno', e.errno, flush=True)\n"
                      "        break\n"
                      "    if pid == 0:\n"
                      "        time.sleep(2)\n"
                      "        os._exit(0)\n"
                      "    n += 1\n"
                      "print('forked=%d' % n, flush=True)\n")
        forks = run(api, "forks", ["python3", "-c", fork_probe], limits={"pids": 4})
        job = wait_finished(api, hog)
        assert (job["state"], job["reason"]) == ("failed", "OutOfMemory"), job
        done = wait_finished(api, forks)
        out = logs(api, forks)
        forked = [line for line in out.splitlines() if "forked=" in line]
        assert "fork failed errno 11" in out and forked and int(forked[-1].split("=")[1]) < 4, out
        assert done["state"] in ("completed", "failed")


async def test_dev_work_outgrowing_its_fraction_is_stopped_and_fails_with_that_reason(platform) -> None:  # type: ignore[no-untyped-def]
    """Issue #17: the default policy stops a dev fraction whose work holds more GPU memory than promised (on the
    simulated fleet a GPU's memory follows the work's resident memory); the job ends failed FractionMemoryExceeded
    and its GPUs are released: no job stays `running` on a killed process."""
    grow = ("import time\n"
            "b = bytearray(400 * 2**20)\n"
            "for i in range(0, len(b), 4096):\n"
            "    b[i] = 1\n"
            "print('holding 400 MiB', flush=True)\n"
            "time.sleep(300)\n")
    async with AllocationWatcher(platform.nats_url) as watcher:
        with platform.client() as api:
            finish_all(api)
            sharing = "/v1/nodes/sim-node-0/gpus/3/sharing"
            assert api.put(sharing, json={"mode": "fractional"}).status_code == 200
            try:
                job_id = run(api, "dev-hog", ["python3", "-c", grow], kind="dev", gpu_fraction_milli=250,
                             gpu_memory_mib=128, limits={"memory_mib": 1024})
                _, _, released = await watcher.wait_for(AllocationReleased, job_id, timeout=60)
                job = wait_finished(api, job_id, timeout=30)
                assert (job["state"], job["reason"]) == ("failed", "FractionMemoryExceeded"), job
                assert "over its fraction's 128 MiB" in json.dumps(job), job
                assert released.reason == "WorkFailed" and released.exit is not None
                assert released.exit.reason == "FractionMemoryExceeded"
            finally:
                api.put(sharing, json={"mode": "exclusive"})


async def test_a_sandboxed_job_sees_only_its_gpus_and_writes_only_its_workdir(platform) -> None:  # type: ignore[no-untyped-def]
    import shutil

    if shutil.which("bwrap") is None:
        pytest.skip("bubblewrap is not installed (apt-get install bubblewrap)")
    async with AllocationWatcher(platform.nats_url) as watcher:
        with platform.client() as api:
            finish_all(api)
            probe = ("ls /dev | grep nvidia | tr '\\n' ' '; echo; "
                     "touch /etc/gpupool-escape 2>/dev/null && echo wrote-outside || echo outside-refused; "
                     "touch ./inside && echo wrote-inside")
            job_id = run(api, "sandboxed", ["sh", "-c", probe], gpus=1, isolation="sandbox")
            _, _, granted = await watcher.wait_for(AllocationGranted, job_id)
            job = wait_finished(api, job_id)
            out = logs(api, job_id)
            assert job["state"] == "completed", (job, out)
            index = granted.gpus[0].index
            seen = out.splitlines()[0].split()
            assert f"nvidia{index}" in seen and not [d for d in seen if d.startswith("nvidia") and
                                                     d[6:].isdigit() and d != f"nvidia{index}"], out
            assert "outside-refused" in out and "wrote-inside" in out
            assert not Path("/etc/gpupool-escape").exists()


async def test_a_command_that_does_not_exist_fails_at_launch(platform) -> None:  # type: ignore[no-untyped-def]
    async with AllocationWatcher(platform.nats_url) as watcher:
        with platform.client() as api:
            finish_all(api)
            job_id = run(api, "typo", ["pyhton3", "train.py"])
            job = wait_finished(api, job_id)
            assert (job["state"], job["reason"]) == ("failed", "CommandNotFound"), job
            _, _, released = await watcher.wait_for(AllocationReleased, job_id)
            assert released.exit is not None and released.exit.reason == "CommandNotFound"
            assert "WorkStarted" not in [h["reason"] for h in job["history"]]


async def test_a_replicated_job_whose_replicas_keep_failing_backs_off_instead_of_looping(platform) -> None:  # type: ignore[no-untyped-def]
    """Each failed replica pushes the job's next placement back (1 s, doubling): in 6 s a replica that can never
    start is placed a handful of times, not hundreds (it was ~25 times a second), and `explain` says why."""
    async with AllocationWatcher(platform.nats_url) as watcher:
        with platform.client() as api:
            finish_all(api)
            job_id = run(api, "crashloop", ["no-such-command"], kind="inference", replicas=2)
            await asyncio.sleep(6)
            granted = len(watcher.of(AllocationGranted, job_id))
            assert 2 <= granted <= 8, granted  # 2 at first, then one more per back-off step (1, 2, 4 s ...)
            explained = api.get(f"/v1/jobs/{job_id}/explain").json()
            assert "CrashLoopBackOff" in json.dumps(explained), explained
            api.post(f"/v1/jobs/{job_id}/cancel", json={"reason": "test"})


async def test_an_idle_dev_session_is_reclaimed_from_measured_idleness_and_a_busy_one_is_not(platform) -> None:  # type: ignore[no-untyped-def]
    with platform.client() as api:
        finish_all(api)
        assert api.put("/v1/reclaim-policies/dev", json={"idle_after_s": 2, "grace_s": 2,
                                                         "idle_util_pct": 5}).status_code == 200
        try:
            idle = run(api, "idle-notebook", ["sleep", "3600"], kind="dev", stop_grace_s=1)
            busy = run(api, "busy-notebook", ["sh", "-c", "while :; do :; done"], kind="dev", stop_grace_s=1)
            reclaimed = wait_finished(api, idle, timeout=40)
            assert (reclaimed["state"], reclaimed["reason"]) == ("failed", "IdleReclaimed"), reclaimed
            still = api.get(f"/v1/jobs/{busy}").json()
            assert still["state"] == "running", still
        finally:
            api.put("/v1/reclaim-policies/dev", json={"idle_after_s": 1800, "grace_s": 300})


async def test_work_survives_a_killed_agent_and_its_exit_code_is_still_reported(platform) -> None:  # type: ignore[no-untyped-def]
    import signal as signals

    from libs.check import CheckConfig, check_async

    with platform.client() as api:
        finish_all(api)
        job_id = run(api, "survivor", ["sh", "-c", "echo before; sleep 4; echo after; exit 5"])
        wait_state(api, job_id, "running")
        old = platform.pid("agent")
        os.kill(old, signals.SIGKILL)  # kill -9: no chance to clean up; `gpupool up` starts it again
        deadline = time.monotonic() + 30
        while platform.pid("agent") == old and time.monotonic() < deadline:
            time.sleep(0.2)
        assert platform.pid("agent") != old, "the agent was not restarted"
        job = wait_finished(api, job_id, timeout=40)
        assert (job["state"], job["exit_code"], job["reason"]) == ("failed", 5, "NonZeroExit"), job
        assert "after" in logs(api, job_id)  # the work and its log outlived the agent
        report = await check_async(CheckConfig.from_run_file(platform.data_dir / "run.json"))
        assert report.ok, report.to_text()


async def test_a_failed_attempt_is_restarted_per_its_policy_and_can_then_succeed(platform) -> None:  # type: ignore[no-untyped-def]
    with platform.client() as api:
        finish_all(api)
        flaky = ('m="$GPUPOOL_CHECKPOINT_DIR/failed-once"; '
                 'if [ -f "$m" ]; then echo "attempt $GPUPOOL_ATTEMPT ok"; exit 0; fi; '
                 'touch "$m"; echo "attempt $GPUPOOL_ATTEMPT fails"; exit 1')
        job_id = run(api, "flaky", ["sh", "-c", flaky], restart={"policy": "on_failure", "attempts": 2,
                                                                   "delay_s": 0})
        job = wait_finished(api, job_id, timeout=40)
        assert (job["state"], job["exit_code"], job["attempts"]) == ("completed", 0, 1), job
        assert "Restarted:NonZeroExit" in [h["reason"] for h in job["history"]]
        assert "attempt 1 ok" in logs(api, job_id)  # the logs of the latest attempt
        never = run(api, "never-restarted", ["sh", "-c", "exit 1"])
        assert wait_finished(api, never)["attempts"] == 0


def _cli(platform, *args: str, timeout: float = 60) -> subprocess.CompletedProcess:  # type: ignore[no-untyped-def]
    env = {**os.environ, "GPUPOOL_URL": platform.gateway, "GPUPOOL_TOKEN": platform.run["admin_token"]}
    return subprocess.run([sys.executable, "-m", "libs.cli.main", *args], env=env, capture_output=True, text=True,
                          timeout=timeout)


async def test_gpupool_run_prints_the_works_output_and_exits_with_its_code(platform) -> None:  # type: ignore[no-untyped-def]
    with platform.client() as api:
        finish_all(api)
    done = _cli(platform, "run", "--team", "research", "--", "sh", "-c", "echo hi; echo oops >&2; exit 7")
    assert done.returncode == 7, (done.stdout, done.stderr)
    assert done.stdout.splitlines() == ["hi"], done.stdout  # only the work's output on stdout
    assert "oops" in done.stderr


async def test_gpupool_logs_follow_streams_a_running_job_until_it_ends(platform) -> None:  # type: ignore[no-untyped-def]
    with platform.client() as api:
        finish_all(api)
        job_id = run(api, "chatty", ["sh", "-c", "echo one; sleep 3; echo two; sleep 1"])
        wait_state(api, job_id, "running")
        started = time.monotonic()
        followed = _cli(platform, "logs", "-f", job_id)
        assert followed.returncode == 0, followed.stderr
        assert followed.stdout.split() == ["one", "two"], followed.stdout
        assert time.monotonic() - started >= 2, "it returned before the job printed its second line"
        assert api.get(f"/v1/jobs/{job_id}").json()["state"] == "completed"
