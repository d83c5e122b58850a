"""An agent restart: the work survives it, and the next executor on the same state dir takes over — running work
is watched again, an exit that happened while nobody watched is reported, a vanished shim is reported Lost."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import textwrap

import pytest
from executor_support import CGROUPS, JOB_ENV, PY, alive, needs_cgroups, needs_python, needs_root, wait_for

from services.agent.executor import LaunchSpec

pytestmark = [needs_root, needs_python]

# Waits for a file named "go" in its workdir, then exits 5.
WAIT_FOR_GO = [PY, "-c", textwrap.dedent("""
    import os, sys, time
    while not os.path.exists("go"):
        time.sleep(0.02)
    sys.exit(5)
""")]


def spec(alloc: str, argv: list[str], **kw) -> LaunchSpec:
    return LaunchSpec(allocation_id=alloc, job_id=f"job-{alloc}", argv=argv, env=JOB_ENV, **kw)


def state(state_dir) -> dict:
    """Every attempt's record, as the next executor reads them."""
    return {"attempts": [json.loads(p.read_text().splitlines()[-1])["attempt"]
                         for p in sorted((state_dir / "attempts").glob("*/record.jsonl"))]}


async def test_running_work_is_adopted_and_its_exit_reported(make_executor, reports, state_dir) -> None:
    a = make_executor()
    pid = await a.launch(spec("r-adopt", WAIT_FOR_GO, max_runtime_s=60))
    shim = a.running()["r-adopt"]["shim_pid"]
    a.close()  # the agent goes away (kill -9): nothing is stopped
    assert alive(pid) and alive(shim)
    b = make_executor()
    assert await b.adopt() == ["r-adopt"]
    info = b.running()["r-adopt"]
    assert (info["pid"], info["shim_pid"]) == (pid, shim) and info["runtime_deadline"] is not None
    assert pid in b.pids("r-adopt")
    (state_dir / "jobs" / "job-r-adopt" / "work" / "go").touch()
    r = await reports.next()
    assert (r.allocation_id, r.exit_code, r.reason, r.pid) == ("r-adopt", 5, "NonZeroExit", pid)
    assert len(reports.all) == 1  # A, closed, reported nothing
    assert state(state_dir)["attempts"][0]["reported"] is True


async def test_exit_while_away_is_reported_from_the_status(make_executor, reports, state_dir) -> None:
    a = make_executor()
    await a.launch(spec("r-away", ["sh", "-c", "echo bye; exit 7"]))
    a.close()
    status = state_dir / "attempts" / "r-away" / "status.json"
    await wait_for(status.exists, what="the shim's status")
    b = make_executor()
    await b.adopt()
    r = await reports.next()
    assert (r.exit_code, r.reason) == (7, "NonZeroExit")
    assert b.read_logs("r-away", "stdout") == (b"bye\n", 4, True)


async def test_shim_killed_while_away_is_reported_lost(make_executor, reports, state_dir, node) -> None:
    a = make_executor()
    pid = await a.launch(spec("r-lost", ["sleep", "60"]))
    shim = a.running()["r-lost"]["shim_pid"]
    a.close()
    os.kill(shim, signal.SIGKILL)
    await wait_for(lambda: not alive(shim), what="the shim's death")
    assert alive(pid)  # the work outlived its shim
    b = make_executor()
    await b.adopt()
    r = await reports.next()
    assert (r.reason, r.exit_code, r.signal, r.pid) == ("Lost", None, None, pid)
    assert not alive(pid)  # its cgroup was emptied before the report
    assert CGROUPS.jobs(node) == set()


async def test_report_is_retried_until_delivered_and_survives_a_restart(make_executor, reports, state_dir) -> None:
    reports.fail_times = 10**6  # the bus is down for A
    a = make_executor()
    await a.launch(spec("r-retry", ["sh", "-c", "exit 2"]))
    await wait_for(lambda: state(state_dir)["attempts"][0]["report"] is not None, what="the built report")
    await asyncio.sleep(0.7)  # a retry or two fail
    saved = state(state_dir)["attempts"][0]
    assert saved["reported"] is False
    a.close()
    reports.fail_times = 1  # B's first try fails too, the second goes through
    b = make_executor()
    await b.adopt()
    r = await reports.next(timeout=10)
    assert r.to_dict() == saved["report"]  # the same data A would have sent: safe to dedupe
    assert (r.exit_code, r.reason) == (2, "NonZeroExit")
    await wait_for(lambda: state(state_dir)["attempts"][0]["reported"], what="reported persisted")
    b.close()
    c = make_executor()
    await c.adopt()  # delivered: not again
    await asyncio.sleep(0.2)
    assert len(reports.all) == 1


def test_one_executor_per_state_dir(make_executor) -> None:
    a = make_executor()
    with pytest.raises(RuntimeError, match="another executor holds"):
        make_executor()
    a.close()
    make_executor()  # free again


@needs_cgroups
async def test_stray_cgroup_of_this_node_is_emptied_at_adopt(make_executor, node) -> None:
    stray = CGROUPS.job(node, "nobody-knows")
    stray.create()
    proc = subprocess.Popen(["sleep", "60"])
    stray.add(proc.pid)
    ex = make_executor()
    await ex.adopt()
    assert proc.wait(timeout=5) == -signal.SIGKILL
    assert not stray.exists() and CGROUPS.jobs(node) == set()


AGENT = textwrap.dedent("""
    import asyncio, sys
    from services.agent.executor import Executor, LaunchSpec

    async def main():
        async def on_exit(report):
            print("REPORTED", report, flush=True)
        ex = Executor(sys.argv[1], sys.argv[2], on_exit=on_exit)
        pid = await ex.launch(LaunchSpec(allocation_id="r-kill9", job_id="job-r-kill9", argv=sys.argv[3:],
                                         env={"PATH": "/usr/bin:/bin"}))
        print(pid, flush=True)
        await asyncio.sleep(60)

    asyncio.run(main())
""")


async def test_work_survives_kill_9_of_the_agent_and_its_process_group(make_executor, reports, state_dir,
                                                                      node) -> None:
    import sys

    agent = subprocess.Popen([sys.executable, "-c", AGENT, str(state_dir), node, *WAIT_FOR_GO],
                             stdout=subprocess.PIPE, start_new_session=True, cwd=os.getcwd())
    pid = int(agent.stdout.readline())
    os.killpg(agent.pid, signal.SIGKILL)  # the agent and everything in its process group
    agent.wait(timeout=5)
    agent.stdout.close()
    assert alive(pid)  # the shim made its own session: the work is untouched
    b = make_executor()
    assert await b.adopt() == ["r-kill9"]
    (state_dir / "jobs" / "job-r-kill9" / "work" / "go").touch()
    r = await reports.next()
    assert (r.exit_code, r.reason, r.pid) == (5, "NonZeroExit", pid)


async def test_the_single_state_file_of_an_older_agent_is_taken_over(make_executor, reports, state_dir) -> None:
    """An agent upgraded over running work: the attempts in the old `executor.json` become records and are
    adopted; the old file goes."""
    a = make_executor()
    pid = await a.launch(spec("r-legacy", WAIT_FOR_GO))
    a.close()
    record = state_dir / "attempts" / "r-legacy" / "record.jsonl"
    legacy = {"version": 1, "cgroup_name": "x", "attempts": [json.loads(record.read_text().splitlines()[-1])["attempt"]]}
    record.unlink()
    (state_dir / "executor.json").write_text(json.dumps(legacy))
    b = make_executor()
    assert await b.adopt() == ["r-legacy"] and b.running()["r-legacy"]["pid"] == pid
    assert record.exists() and not (state_dir / "executor.json").exists()
    (state_dir / "jobs" / "job-r-legacy" / "work" / "go").touch()
    r = await reports.next()
    assert (r.allocation_id, r.exit_code) == ("r-legacy", 5)


async def test_an_attempt_dir_without_a_record_is_removed_at_start(make_executor, state_dir) -> None:
    stray = state_dir / "attempts" / "never-recorded"
    (stray / "control").mkdir(parents=True)
    make_executor()
    assert not stray.exists()


@needs_cgroups
async def test_closing_leaves_no_empty_node_cgroup_but_keeps_running_work(make_executor, reports, state_dir,
                                                                          node) -> None:
    a = make_executor()
    await a.launch(spec("r-keep", WAIT_FOR_GO))
    a.close()  # work running: the node's cgroups stay (it is re-adopted from them)
    assert CGROUPS.jobs(node) == {"r-keep"} and all(os.path.isdir(b) for b in CGROUPS.base(node))
    b = make_executor()
    await b.adopt()
    (state_dir / "jobs" / "job-r-keep" / "work" / "go").touch()
    assert (await reports.next()).allocation_id == "r-keep"
    b.close()  # nothing running: no empty directory is left behind in any hierarchy
    assert not any(os.path.exists(base) for base in CGROUPS.base(node))
