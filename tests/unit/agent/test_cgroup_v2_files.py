"""What the cgroup v2 driver writes and reads, against a directory laid out as the kernel's cgroup2 files are.

This machine's v2 mount has no controllers (they are all bound to v1), so the v2 limits cannot be exercised on a
real kernel here; these tests pin the driver's side of the contract: controllers delegated down every ancestor,
the limits in the kernel's units, a limit whose controller is missing failing the launch instead of being dropped,
the auto-detection choosing v2 only where memory, cpu and pids are there, and the stats read back from the files
the kernel keeps (memory.events' oom_kill is how an OOM is told)."""

from __future__ import annotations

import os

import pytest

from services.agent.executor import cgroups as cg


@pytest.fixture
def unified(tmp_path):
    root = tmp_path / "unified"
    root.mkdir()
    (root / "cgroup.controllers").write_text("cpuset cpu io memory hugetlb pids rdma misc\n")
    (root / "cgroup.subtree_control").write_text("")
    return root


def test_limits_are_written_in_the_kernels_units_and_controllers_delegated_down_the_chain(unified) -> None:
    job = cg.V2Cgroup(str(unified / "gpupool" / "node-a" / "alloc-1"), str(unified))
    node = unified / "gpupool" / "node-a"
    node.mkdir(parents=True)
    for d in (unified / "gpupool", node):  # what the kernel shows in a fresh cgroup
        (d / "cgroup.subtree_control").write_text("")
    job_dir = node / "alloc-1"
    job_dir.mkdir()
    for f in ("memory.max", "memory.swap.max", "cpu.max", "pids.max"):  # the kernel's files of the new cgroup
        (job_dir / f).write_text("max\n")
    job.create(cpu_milli=1500, memory_mib=512, pids=64)
    assert (job_dir / "memory.max").read_text() == str(512 * 1024 * 1024)
    assert (job_dir / "memory.swap.max").read_text() == "0"  # no swap: the limit is the RAM it gets
    assert (job_dir / "cpu.max").read_text() == "150000 100000"  # 1.5 cores of each 100 ms period
    assert (job_dir / "pids.max").read_text() == "64"
    for d in (unified, unified / "gpupool", node):  # each ancestor hands memory, cpu and pids to its children
        assert set((d / "cgroup.subtree_control").read_text().split()) == {"+memory", "+cpu", "+pids"}


def test_a_tiny_cpu_limit_gets_the_kernels_minimum_quota(unified) -> None:
    job_dir = unified / "gpupool" / "n" / "a"
    job_dir.mkdir(parents=True)
    for d in (unified / "gpupool", unified / "gpupool" / "n"):
        (d / "cgroup.subtree_control").write_text("")
    cg.V2Cgroup(str(job_dir), str(unified)).create(cpu_milli=1)
    assert (job_dir / "cpu.max").read_text() == "1000 100000"


def test_a_limit_whose_file_cannot_be_written_fails_the_setup(unified, monkeypatch) -> None:
    job_dir = unified / "gpupool" / "n" / "a"
    job_dir.mkdir(parents=True)
    for d in (unified / "gpupool", unified / "gpupool" / "n"):
        (d / "cgroup.subtree_control").write_text("")
    real_write = cg._write

    def refuse_memory(path: str, value: str) -> None:  # a kernel without the memory controller: no such file
        if path.endswith("memory.max"):
            raise FileNotFoundError(2, "No such file or directory", path)
        real_write(path, value)

    monkeypatch.setattr(cg, "_write", refuse_memory)
    with pytest.raises(cg.CgroupError, match="cgroup v2 setup failed"):
        cg.V2Cgroup(str(job_dir), str(unified)).create(memory_mib=100)


def test_stats_come_from_the_kernels_accounting_files(unified) -> None:
    job_dir = unified / "j"
    job_dir.mkdir()
    (job_dir / "cpu.stat").write_text("usage_usec 2500000\nuser_usec 2000000\nsystem_usec 500000\n")
    (job_dir / "memory.current").write_text("104857600\n")
    (job_dir / "memory.stat").write_text("anon 52428800\nfile 52428800\n")
    (job_dir / "memory.events").write_text("low 0\nhigh 0\nmax 3\noom 1\noom_kill 1\noom_group_kill 0\n")
    stats = cg.V2Cgroup(str(job_dir), str(unified)).stats()
    assert stats == cg.CgroupStats(2.5, 104857600, 52428800, 1)


def test_auto_detection_takes_v2_only_with_memory_cpu_and_pids(tmp_path, monkeypatch) -> None:
    monkeypatch.setattr(os, "geteuid", lambda: 0)
    unified = tmp_path / "unified"
    unified.mkdir()
    mountinfo = tmp_path / "mountinfo"
    mountinfo.write_text(f"30 25 0:26 / {unified} rw,relatime - cgroup2 cgroup2 rw\n")
    (unified / "cgroup.controllers").write_text("")  # this machine: the v2 mount has no controllers
    assert cg.detect("auto", str(mountinfo)).kind == "none"
    (unified / "cgroup.controllers").write_text("cpu memory pids\n")
    monkeypatch.setattr(cg, "_v2_unusable", lambda _root: None)
    system = cg.detect("auto", str(mountinfo))
    assert system.kind == "v2" and system.job("n", "a").descriptor()["dir"] == str(unified / "gpupool" / "n" / "a")
