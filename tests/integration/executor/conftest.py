"""Real processes, real cgroups: each test gets its own state dir and its own node name (so its cgroups are
`gpupool/<node>/...` of its own), and whatever a test leaves in them is killed and removed afterwards.

Capabilities are probed once; a test that needs one this machine lacks is skipped with the reason."""

from __future__ import annotations

import os
import shutil
import tempfile
import uuid
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path

import pytest
from executor_support import CGROUPS, IS_ROOT, Reports

from services.agent.executor import Executor
from services.agent.executor import cgroups as cg


@pytest.fixture
def state_dir() -> Iterator[Path]:
    path = Path(tempfile.mkdtemp(prefix="gpupool-executor-", dir="/tmp"))
    os.chmod(path, 0o755)  # the job's uid must traverse to its workdir
    yield path
    shutil.rmtree(path, ignore_errors=True)


@pytest.fixture
def node() -> Iterator[str]:
    name = f"test-{uuid.uuid4().hex[:10]}"
    yield name
    if not IS_ROOT:
        return
    for alloc in CGROUPS.jobs(name):  # anything a failed test left behind
        job = CGROUPS.job(name, alloc)
        job.kill()
        job.wait_empty(5)
        job.remove()
    # The node's own directories, in every hierarchy (a container runtime also makes them in cpuset, blkio, ...).
    for mount in cg.cgroup_mounts():
        for d in (os.path.join(mount.path, "gpupool", name), os.path.join(mount.path, "gpupool")):
            try:
                os.rmdir(d)
            except OSError:
                pass


@pytest.fixture
def reports() -> Reports:
    return Reports()


@pytest.fixture
async def make_executor(state_dir: Path, node: str, reports: Reports) -> AsyncIterator[Callable[..., Executor]]:
    made: list[Executor] = []

    def make(**kwargs) -> Executor:
        kwargs.setdefault("on_exit", reports)
        ex = Executor(kwargs.pop("state_dir", state_dir), kwargs.pop("cgroup_name", node), **kwargs)
        made.append(ex)
        return ex

    yield make
    for ex in made:
        ex.close()


@pytest.fixture
def fake_devices(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """nvidia0..3 and nvidiactl as real character device nodes (195:N, 195:255) with no driver behind them:
    opening one the devices cgroup allows gives ENXIO, one it denies EPERM."""
    if not IS_ROOT:
        pytest.skip("mknod needs root")
    path = Path(tempfile.mkdtemp(prefix="gpupool-dev-", dir="/tmp"))
    os.chmod(path, 0o755)
    for i in range(4):
        os.mknod(path / f"nvidia{i}", 0o666 | 0o020000, os.makedev(195, i))
        os.chmod(path / f"nvidia{i}", 0o666)
    os.mknod(path / "nvidiactl", 0o666 | 0o020000, os.makedev(195, 255))
    os.chmod(path / "nvidiactl", 0o666)
    yield path
    shutil.rmtree(path, ignore_errors=True)
