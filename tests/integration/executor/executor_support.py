"""Capability probes and helpers shared by the executor's integration tests (fixtures are in conftest.py)."""

from __future__ import annotations

import asyncio
import os
from collections.abc import Callable

import pytest

from services.agent.executor import ExitReport
from services.agent.executor import cgroups as cg

IS_ROOT = os.geteuid() == 0
CGROUPS = cg.detect()
PY = "/usr/bin/python3"  # the work runs as nobody: it needs an interpreter outside /root
JOB_ENV = {"PATH": "/usr/local/bin:/usr/bin:/bin", "LANG": "C.UTF-8"}


def v1_controller(name: str) -> bool:
    return CGROUPS.kind == "v1" and name in CGROUPS._v1


def skip_unless(condition: bool, reason: str) -> pytest.MarkDecorator:
    return pytest.mark.skipif(not condition, reason=reason)


needs_root = skip_unless(IS_ROOT, "needs root (cgroups, uid switching)")
needs_python = skip_unless(os.access(PY, os.X_OK), f"needs {PY} (an interpreter the job's uid can run)")
needs_cgroups = skip_unless(IS_ROOT and CGROUPS.kind != "none", f"needs cgroups: {CGROUPS.why}")
needs_memory_cgroup = skip_unless(IS_ROOT and (v1_controller("memory") or CGROUPS.kind == "v2"),
                                  "needs a memory cgroup controller (v1 memory or v2)")
needs_pids_cgroup = skip_unless(IS_ROOT and (v1_controller("pids") or CGROUPS.kind == "v2"),
                                "needs a pids cgroup controller (v1 pids or v2)")
needs_cpu_cgroup = skip_unless(IS_ROOT and ((v1_controller("cpu") and v1_controller("cpuacct"))
                                            or CGROUPS.kind == "v2"), "needs cpu and cpuacct (or v2 cpu)")
needs_devices_cgroup = skip_unless(IS_ROOT and v1_controller("devices"),
                                   "needs the cgroup v1 devices controller (v2 has none without eBPF)")


class Reports:
    """The executor's on_exit: every report, in order, and a way to wait for the next one."""

    def __init__(self) -> None:
        self.all: list[ExitReport] = []
        self._queue: asyncio.Queue[ExitReport] = asyncio.Queue()
        self.fail_times = 0

    async def __call__(self, report: ExitReport) -> None:
        if self.fail_times > 0:
            self.fail_times -= 1
            raise RuntimeError("the bus is down (test)")
        self.all.append(report)
        await self._queue.put(report)

    async def next(self, timeout: float = 15.0) -> ExitReport:
        return await asyncio.wait_for(self._queue.get(), timeout)

    def empty(self) -> bool:
        return self._queue.empty()


def alive(pid: int) -> bool:
    """Running (a zombie has left its cgroup and holds nothing: it counts as gone)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            raw = f.read()
    except OSError:
        return False
    return raw[raw.rfind(")") + 2:].split()[0] not in ("Z", "X")


async def wait_for(predicate: Callable[[], bool], timeout: float = 10.0, what: str = "condition") -> None:
    loop = asyncio.get_running_loop()
    end = loop.time() + timeout
    while not predicate():
        if loop.time() > end:
            raise AssertionError(f"timed out waiting for {what}")
        await asyncio.sleep(0.02)
