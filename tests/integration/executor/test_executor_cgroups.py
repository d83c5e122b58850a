"""The cgroup layer beyond what auto-detection picked here: the v2 driver's core (membership, cgroup.kill, CPU
accounting) on whatever cgroup2 mount the machine has, the executor on v2 and with no cgroups at all, and the
parsing of mountinfo."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import time

import pytest
from executor_support import JOB_ENV, alive, needs_root

from services.agent.executor import LaunchError, LaunchSpec, Limits
from services.agent.executor import cgroups as cg

UNIFIED = next((m.path for m in cg.cgroup_mounts() if m.fstype == "cgroup2"), None)
needs_cgroup2 = pytest.mark.skipif(UNIFIED is None or os.geteuid() != 0, reason="needs root and a cgroup2 mount")


def spec(alloc: str, argv: list[str], **kw) -> LaunchSpec:
    return LaunchSpec(allocation_id=alloc, job_id=f"job-{alloc}", argv=argv, env=JOB_ENV, **kw)


def _remove_v2_base(node: str) -> None:
    for d in (os.path.join(UNIFIED, "gpupool", node), os.path.join(UNIFIED, "gpupool")):
        try:
            os.rmdir(d)
        except OSError:
            pass


@needs_cgroup2
def test_v2_core_membership_kill_and_cpu(node) -> None:
    system = cg.detect("v2")
    job = system.job(node, "v2core")
    proc = None
    try:
        job.create()
        proc = subprocess.Popen(["sh", "-c", "sleep 30 & sleep 30"])
        job.add(proc.pid)
        assert proc.pid in job.pids()
        subprocess.run(["sh", "-c", f"echo $$ > {job.procs_files()[0]}; i=0; while [ $i -lt 20000 ]; do "
                                    "i=$((i+1)); done"], check=True)  # a short burst of CPU inside
        assert job.stats().cpu_s > 0
        job.kill()
        assert job.wait_empty(5)
        assert proc.wait(timeout=5) == -signal.SIGKILL
    finally:
        if proc and proc.poll() is None:
            proc.kill()
        job.kill()
        job.wait_empty(5)
        assert job.remove()
        _remove_v2_base(node)


@needs_root
@needs_cgroup2
async def test_executor_on_v2_tracks_and_empties_the_tree(make_executor, reports, node) -> None:
    ex = make_executor(cgroups="v2")
    assert ex.cgroups.kind == "v2"
    try:
        await ex.launch(spec("v2-bg", ["sh", "-c", "sleep 30 & echo $!; exit 0"]))
        r = await reports.next()
        assert r.reason == "Completed"
        assert not alive(int(ex.read_logs("v2-bg", "stdout")[0]))
        have = set(open(os.path.join(UNIFIED, "cgroup.controllers")).read().split())
        if "memory" not in have:  # a limit the hierarchy cannot enforce is refused, never silently dropped
            with pytest.raises(LaunchError) as e:
                await ex.launch(spec("v2-mem", ["true"], limits=Limits(memory_mib=64)))
            assert e.value.reason == "CgroupFailed"
    finally:
        _remove_v2_base(node)


@needs_root
async def test_without_cgroups_the_session_stands_in(make_executor, reports) -> None:
    ex = make_executor(cgroups="none")
    assert ex.cgroups.kind == "none"
    await ex.launch(spec("n-bg", ["sh", "-c", "sleep 30 & echo $!; sleep 30"], stop_grace_s=0.3))
    deadline = time.monotonic() + 10
    while len(r_pids := ex.pids("n-bg")) < 2 and time.monotonic() < deadline:  # the shell forks its children
        await asyncio.sleep(0.05)
    assert len(r_pids) >= 2  # found by session
    assert ex.usage("n-bg")[1] > 0  # resident memory of the session's processes
    await ex.stop("n-bg")
    r = await reports.next()
    child = int(ex.read_logs("n-bg", "stdout")[0])
    assert (r.reason, r.stopped) == ("Stopped", True)
    assert not alive(child) and not any(alive(p) for p in r_pids)


def test_mountinfo_parsing(tmp_path) -> None:
    info = tmp_path / "mountinfo"
    info.write_text(
        "31 23 0:28 / /sys/fs/cgroup rw,relatime - tmpfs tmpfs rw,mode=755\n"
        "32 31 0:29 / /sys/fs/cgroup/cpu,cpuacct rw,relatime shared:9 - cgroup cgroup rw,cpu,cpuacct\n"
        "35 31 0:32 / /sys/fs/cgroup/memory rw,relatime - cgroup cgroup rw,memory\n"
        "40 31 0:37 / /sys/fs/cgroup/sys\\040temd rw,relatime - cgroup cgroup rw,name=systemd\n"
        "41 31 0:38 / /sys/fs/cgroup/unified rw,relatime - cgroup2 cgroup2 rw,nsdelegate\n")
    mounts = cg.cgroup_mounts(str(info))
    assert [(m.fstype, m.path) for m in mounts] == [
        ("cgroup", "/sys/fs/cgroup/cpu,cpuacct"), ("cgroup", "/sys/fs/cgroup/memory"),
        ("cgroup", "/sys/fs/cgroup/sys temd"), ("cgroup2", "/sys/fs/cgroup/unified")]
    assert {"cpu", "cpuacct"} <= mounts[0].options
    assert cg.DeviceRule("c", 195, None).v1() == "c 195:* rwm"
    assert cg.DeviceRule("b", None, None, "m").v1() == "b *:* m"


@needs_root
async def test_an_agent_without_root_runs_work_as_itself(make_executor, reports, state_dir, monkeypatch) -> None:
    with monkeypatch.context() as m:  # only while the executor looks at who it is
        m.setattr(os, "geteuid", lambda: 1000)
        ex = make_executor()
    assert ex.cgroups.kind == "none" and "not root" in ex.cgroups.why
    await ex.launch(spec("u-self", ["sh", "-c", "id -u; pwd"]))
    r = await reports.next()
    assert r.reason == "Completed"
    uid, cwd = ex.read_logs("u-self", "stdout")[0].decode().split()
    assert int(uid) == os.getuid()  # no switch: it cannot
    assert cwd == str(state_dir / "jobs" / "job-u-self" / "work")
