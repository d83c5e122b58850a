"""The container driver (podman with runc) on a tiny root filesystem built from the host's own binaries: what the
work sees, that podman, conmon and the container all live in the job's cgroup (so kill and OOM cover them), and
that images are used only when the node already has them."""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
import uuid
from pathlib import Path

import pytest
from executor_support import CGROUPS, IS_ROOT, alive, needs_root, wait_for

from services.agent.executor import LaunchError, LaunchSpec, Limits
from services.agent.executor.cgroups import exe_of
from services.agent.executor.drivers import ContainerDriver

pytestmark = [needs_root]
BINARIES = ("/bin/sh", "/bin/cat", "/bin/ls", "/usr/bin/id", "/bin/sleep", "/usr/bin/tail")


@pytest.fixture(scope="module")
def driver() -> ContainerDriver:
    """A driver of its own (its containers.conf in a module-wide dir) for the test's direct podman calls."""
    state = tempfile.mkdtemp(prefix="gpupool-podman-")
    d = ContainerDriver(state, CGROUPS.kind if IS_ROOT else "none")
    ok, why = d.available()
    if not ok:
        shutil.rmtree(state, ignore_errors=True)
        pytest.skip(f"container driver unavailable here: {why}")
    yield d
    shutil.rmtree(state, ignore_errors=True)


def _libraries(binary: str) -> list[str]:
    out = subprocess.run(["ldd", binary], capture_output=True, text=True, check=True).stdout
    return [word for line in out.splitlines() for word in line.split() if word.startswith("/")]


@pytest.fixture(scope="module")
def rootfs(driver) -> Path:
    """sh, cat, ls, id, sleep and tail with the libraries ldd names: enough for a container to run."""
    if shutil.which("ldd") is None or not all(os.path.exists(b) for b in BINARIES):
        pytest.skip("needs ldd and " + ", ".join(BINARIES) + " to build a test rootfs")
    root = Path(tempfile.mkdtemp(prefix="gpupool-rootfs-", dir="/tmp"))
    os.chmod(root, 0o755)
    for d in ("bin", "dev", "proc", "sys", "etc", "run", "tmp", "var/tmp"):
        (root / d).mkdir(parents=True, exist_ok=True)
    os.chmod(root / "tmp", 0o1777)
    os.chmod(root / "var/tmp", 0o1777)
    for binary in BINARIES:
        shutil.copy(binary, root / "bin" / os.path.basename(binary))
        for lib in _libraries(binary):
            (root / lib.lstrip("/")).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy(lib, root / lib.lstrip("/"))
    yield root
    shutil.rmtree(root, ignore_errors=True)


@pytest.fixture(scope="module")
def image(driver, rootfs) -> str:
    """The rootfs imported as a local image (no registry involved), removed afterwards."""
    name = f"localhost/gpupool-test-tiny:{uuid.uuid4().hex[:8]}"
    tar = subprocess.Popen(["tar", "-C", str(rootfs), "-c", "."], stdout=subprocess.PIPE)
    subprocess.run(driver._podman("import", "-", name), stdin=tar.stdout, env=driver._env(), check=True,
                   capture_output=True)
    tar.wait()
    yield name
    subprocess.run(driver._podman("rmi", "--force", name), env=driver._env(), capture_output=True)


def spec(alloc: str, argv: list[str], **kw) -> LaunchSpec:
    return LaunchSpec(allocation_id=alloc, job_id=f"job-{alloc}", argv=argv, env={"PATH": "/bin"},
                      isolation="container", **kw)


def container_exists(driver: ContainerDriver, name: str) -> bool:
    return subprocess.run(driver._podman("container", "exists", name), env=driver._env()).returncode == 0


async def test_container_sees_its_devices_dirs_and_cgroup(make_executor, reports, rootfs, fake_devices, node,
                                                          state_dir) -> None:
    ex = make_executor()
    script = ("id -u; cat /proc/self/cgroup; ls /dev; echo hi > $GPUPOOL_WORKDIR/f && echo wrote; "
              "(echo x > /etc/x) 2>/dev/null || echo rofail; (echo t > /tmp/t) && echo tmpok; exit 4")
    await ex.launch(spec("c-iso", ["sh", "-c", script], rootfs=str(rootfs), gpu_indices=[1],
                         device_dir=str(fake_devices), limits=Limits(memory_mib=512, pids=200)))
    r = await reports.next()
    out = ex.read_logs("c-iso", "stdout")[0].decode().split()
    assert (r.exit_code, r.reason) == (4, "NonZeroExit"), ex.read_logs("c-iso", "stderr")
    assert out[0] == "65534"  # the job's uid inside
    assert any(f"/gpupool/{node}/c-iso/" in line for line in out)  # inside the job's cgroup
    devices = {w for w in out if w.startswith("nvidia")}
    assert devices == {"nvidia1", "nvidiactl"}  # only what was granted
    assert {"wrote", "rofail", "tmpok"} <= set(out)
    assert (state_dir / "jobs" / "job-c-iso" / "work" / "f").read_text() == "hi\n"


async def test_kill_at_deadline_covers_podman_conmon_and_the_container(make_executor, reports, rootfs, driver,
                                                                      node) -> None:
    ex = make_executor()
    await ex.launch(spec("c-kill", ["sh", "-c", "trap '' TERM; sleep 60"], rootfs=str(rootfs), stop_grace_s=0.5))
    exes = lambda: {os.path.basename(exe_of(p)) for p in ex.pids("c-kill")}  # noqa: E731
    await wait_for(lambda: {"podman", "conmon", "sh", "sleep"} <= exes(), what="podman, conmon and the work")
    tree = ex.pids("c-kill")
    await ex.stop("c-kill")
    r = await reports.next()
    assert r.stopped and r.reason == "Stopped" and "killed at the stop deadline" in r.message
    assert [p for p in tree if alive(p)] == []  # podman and conmon too: all were in the job cgroup
    assert CGROUPS.jobs(node) == set()
    await wait_for(lambda: not container_exists(driver, f"gpupool-{node}-c-kill"), timeout=15,
                   what="podman's record of the container to go")


async def test_container_oom_is_seen_though_runc_removes_its_cgroup(make_executor, reports, rootfs) -> None:
    ex = make_executor()
    await ex.launch(spec("c-oom", ["tail", "/dev/zero"], rootfs=str(rootfs), limits=Limits(memory_mib=128)))
    r = await reports.next()
    assert r.oom and r.reason == "OutOfMemory", r


async def test_image_present_runs_missing_is_never_pulled(make_executor, reports, image, rootfs) -> None:
    ex = make_executor()
    await ex.launch(spec("c-img", ["sh", "-c", "echo from-image"], image=image))
    r = await reports.next()
    assert r.reason == "Completed" and ex.read_logs("c-img", "stdout")[0] == b"from-image\n"
    with pytest.raises(LaunchError) as e:
        await ex.launch(spec("c-missing", ["sh"], image="localhost/gpupool-no-such-image:never"))
    assert e.value.reason == "ImagePullFailed"
    with pytest.raises(LaunchError) as e:
        await ex.launch(spec("c-nocmd", ["python3", "-c", "pass"], rootfs=str(rootfs)))
    assert e.value.reason == "CommandNotFound"
    with pytest.raises(LaunchError) as e:
        await ex.launch(spec("c-nocmd-img", ["no-such-command"], image=image))
    assert e.value.reason == "CommandNotFound", e.value  # found only when runc tries: a launch failure still
    assert ex.running() == {}
