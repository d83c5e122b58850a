"""stop(): the signal reaches the whole tree, the deadline file is written, and what is still there at the
deadline is killed — the report comes only once the cgroup is empty."""

from __future__ import annotations

import textwrap
import time
from datetime import UTC, datetime, timedelta

from executor_support import JOB_ENV, PY, alive, needs_cgroups, needs_python, needs_root, wait_for

from services.agent.executor import LaunchSpec

pytestmark = [needs_root, needs_python]


def spec(alloc: str, argv: list[str], **kw) -> LaunchSpec:
    return LaunchSpec(allocation_id=alloc, job_id=kw.pop("job_id", f"job-{alloc}"), argv=argv, env=JOB_ENV, **kw)


async def test_trapped_stop_writes_checkpoint_within_grace(make_executor, reports, state_dir) -> None:
    ex = make_executor()
    await ex.launch(spec("s-ckpt", [PY, "-c", textwrap.dedent("""
        import os, signal, sys, time
        def term(*_):
            deadline = open(os.environ["GPUPOOL_STOP_DEADLINE_FILE"]).read()
            with open(os.path.join(os.environ["GPUPOOL_CHECKPOINT_DIR"], "step-42"), "w") as f:
                f.write(deadline)
            sys.exit(0)
        signal.signal(signal.SIGTERM, term)
        print("ready", flush=True)
        while True:
            time.sleep(0.05)
    """)], stop_grace_s=10.0))
    await wait_for(lambda: ex.read_logs("s-ckpt", "stdout")[0] == b"ready\n", what="the job's trap")
    asked = time.time()
    await ex.stop("s-ckpt", reason="preempted")
    r = await reports.next()
    assert (r.stopped, r.reason, r.exit_code, r.signal) == (True, "Stopped", 0, None)
    assert time.time() - asked < 5  # ended on its own, well before the 10 s deadline
    checkpoint = state_dir / "checkpoints" / "job-s-ckpt" / "step-42"
    unix, iso = checkpoint.read_text().split()
    assert abs(float(unix) - (asked + 10.0)) < 1.0
    assert abs(datetime.fromisoformat(iso).timestamp() - float(unix)) < 0.01 and iso.endswith("+00:00")
    assert "preempted" in r.message
    await ex.stop("s-ckpt")  # ended: a no-op
    await ex.stop("s-unknown")  # unknown: a no-op


@needs_cgroups
async def test_tree_ignoring_sigterm_is_killed_at_the_deadline(make_executor, reports) -> None:
    ex = make_executor()
    # The main process and a child both ignore SIGTERM; the child also ignores SIGHUP and would outlive it.
    await ex.launch(spec("s-kill", ["sh", "-c", "trap '' TERM HUP; (trap '' TERM HUP; sleep 60) & sleep 60"],
                         stop_grace_s=60.0))
    await wait_for(lambda: len(ex.pids("s-kill")) >= 3, what="the job's tree (sh, subshell, sleeps)")
    tree = ex.pids("s-kill")
    now = datetime.now(UTC)
    await ex.stop("s-kill", deadline=now + timedelta(seconds=30))
    await ex.stop("s-kill", deadline=now + timedelta(seconds=0.6))  # earlier: moves the kill earlier
    await ex.stop("s-kill", deadline=now + timedelta(seconds=50))  # later: ignored
    assert all(alive(p) for p in tree)  # SIGTERM is ignored by all of them
    r = await reports.next(timeout=10)
    took = (datetime.now(UTC) - now).total_seconds()
    assert 0.5 < took < 3.0, took
    assert (r.stopped, r.reason, r.signal, r.exit_code) == (True, "Stopped", "SIGKILL", None)
    assert "killed at the stop deadline" in r.message
    assert [p for p in tree if alive(p)] == []  # the report came after the cgroup was empty
    assert ex.pids("s-kill") == set() and ex.running() == {}


@needs_cgroups
async def test_stop_signal_reaches_every_process_not_only_the_main_one(make_executor, reports) -> None:
    ex = make_executor()
    # The main process ignores SIGUSR2 (the stop signal here); its child exits on it and says so.
    await ex.launch(spec("s-tree", [PY, "-c", textwrap.dedent("""
        import os, signal, sys, time
        signal.signal(signal.SIGUSR2, signal.SIG_IGN)
        pid = os.fork()
        if pid == 0:
            def bye(*_):
                print("child got it", flush=True)
                os._exit(0)
            signal.signal(signal.SIGUSR2, bye)
            print("child ready", flush=True)
            time.sleep(60)
            os._exit(1)
        os.waitpid(pid, 0)
        print("main done", flush=True)
    """)], stop_signal="SIGUSR2", stop_grace_s=20.0))
    await wait_for(lambda: b"child ready" in ex.read_logs("s-tree", "stdout")[0], what="the child")
    await ex.stop("s-tree")
    r = await reports.next()
    assert ex.read_logs("s-tree", "stdout")[0] == b"child ready\nchild got it\nmain done\n"
    assert (r.reason, r.exit_code, r.stopped) == ("Stopped", 0, True)
