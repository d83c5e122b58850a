"""Shims forked by the executor's fork server (one interpreter per executor instead of one per job): the shim is
the server's child in its own session and is reaped by it; a server that died is replaced at the next launch; one
that takes a request and never answers fails that launch (nothing of it runs) and is replaced; without the server
the shim is spawned as a fresh interpreter, as before."""

from __future__ import annotations

import os
import signal
import time

import pytest
from executor_support import JOB_ENV, alive, needs_python, needs_root

from services.agent.executor import LaunchError, LaunchSpec, forkserver

pytestmark = [needs_root, needs_python]


def spec(alloc: str, argv: list[str]) -> LaunchSpec:
    return LaunchSpec(allocation_id=alloc, job_id=f"job-{alloc}", argv=argv, env=JOB_ENV)


def stat(pid: int) -> list[str]:
    with open(f"/proc/{pid}/stat") as f:
        return f.read().rsplit(") ", 1)[1].split()


async def test_the_shim_is_the_fork_servers_child_in_its_own_session_and_is_reaped(make_executor, reports) -> None:
    ex = make_executor()
    await ex.launch(spec("f-1", ["sleep", "30"]))
    server, shim = ex._starter.server_pid, ex.running()["f-1"]["shim_pid"]
    fields = stat(shim)
    assert server is not None and int(fields[1]) == server  # ppid
    assert int(fields[3]) == shim  # session id: its own session, as a spawned shim has
    await ex.stop("f-1", signal="SIGKILL")
    r = await reports.next()
    assert r.allocation_id == "f-1" and r.signal == "SIGKILL"
    deadline = time.monotonic() + 5
    while alive(shim) or os.path.exists(f"/proc/{shim}"):  # reaped by the server: no zombie left
        assert time.monotonic() < deadline, "the shim was not reaped"
        time.sleep(0.02)


async def test_a_dead_fork_server_is_replaced_at_the_next_launch(make_executor, reports) -> None:
    ex = make_executor()
    await ex.launch(spec("f-a", ["true"]))
    assert (await reports.next()).reason == "Completed"
    first = ex._starter.server_pid
    os.kill(first, signal.SIGKILL)
    await ex.launch(spec("f-b", ["sh", "-c", "exit 4"]))
    assert (await reports.next()).exit_code == 4
    assert ex._starter.server_pid not in (None, first)


async def test_a_server_that_looks_alive_but_bounces_the_request_is_replaced_at_once(make_executor, reports,
                                                                                     monkeypatch) -> None:
    ex = make_executor()
    await ex.launch(spec("f-warm", ["true"]))
    await reports.next()
    first = ex._starter.server_pid
    os.kill(first, signal.SIGKILL)
    deadline = time.monotonic() + 5
    while stat(first)[0] != "Z":  # dead, not yet reaped: its socket is closed
        assert time.monotonic() < deadline, "the server did not die"
        time.sleep(0.01)
    looks = iter([True])  # the first liveness check races the kill and still sees it running
    real = forkserver._alive
    monkeypatch.setattr(forkserver, "_alive", lambda pid: next(looks, None) or real(pid))
    await ex.launch(spec("f-next", ["sh", "-c", "exit 5"]))
    assert (await reports.next()).exit_code == 5
    assert ex._starter.server_pid not in (None, first)  # forked by a new server, not spawned


async def test_a_fork_server_that_never_answers_fails_the_launch_and_is_replaced(make_executor, reports,
                                                                                 monkeypatch) -> None:
    monkeypatch.setattr(forkserver, "REPLY_TIMEOUT_S", 0.5)
    ex = make_executor()
    await ex.launch(spec("f-warm", ["true"]))
    await reports.next()
    stuck = ex._starter.server_pid
    os.kill(stuck, signal.SIGSTOP)  # takes the request into its socket, never forks
    with pytest.raises(LaunchError) as failed:
        await ex.launch(spec("f-lost", ["sleep", "30"]))
    assert failed.value.reason == "LaunchFailed" and "f-lost" not in ex.running()
    await ex.launch(spec("f-next", ["sh", "-c", "exit 6"]))
    assert (await reports.next()).exit_code == 6
    assert ex._starter.server_pid not in (None, stuck) and not alive(stuck)


async def test_without_the_fork_server_the_shim_is_spawned(make_executor, reports) -> None:
    ex = make_executor(fork_server=False)
    await ex.launch(spec("f-spawn", ["sleep", "30"]))
    shim = ex.running()["f-spawn"]["shim_pid"]
    assert ex._starter.server_pid is None and int(stat(shim)[1]) == os.getpid()
    await ex.stop("f-spawn", signal="SIGKILL")
    assert (await reports.next()).allocation_id == "f-spawn"
