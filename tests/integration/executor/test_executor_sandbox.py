"""The sandbox driver (bubblewrap): what the work can see, write and signal, and how its failures surface."""

from __future__ import annotations

import json
import os
import shutil
import tempfile
import textwrap

import pytest
from executor_support import JOB_ENV, PY, alive, needs_python, needs_root, wait_for

from services.agent.executor import LaunchError, LaunchSpec
from services.agent.executor.drivers import SandboxDriver

_OK, _WHY = SandboxDriver().available()
pytestmark = [needs_root, needs_python, pytest.mark.skipif(not _OK, reason=f"sandbox unavailable: {_WHY}")]

PROBE = textwrap.dedent("""
    import errno, json, os, sys
    out = {"pid": os.getpid(), "uid": os.getuid(), "cwd": os.getcwd()}
    for name in ("nvidia1", "nvidia2", "nvidiactl", "null"):
        try:
            os.close(os.open("/dev/" + name, os.O_RDONLY))
            out[name] = "opened"
        except OSError as e:
            out[name] = errno.errorcode[e.errno]
    def write(path):
        try:
            with open(path, "w") as f:
                f.write("x")
            return "ok"
        except OSError as e:
            return errno.errorcode[e.errno]
    out["host"] = write(sys.argv[1] + "/escaped")
    out["etc"] = write("/etc/gpupool-escaped")
    out["workdir"] = write(os.path.join(os.environ["GPUPOOL_WORKDIR"], "result"))
    out["checkpoint"] = write(os.path.join(os.environ["GPUPOOL_CHECKPOINT_DIR"], "ckpt"))
    out["tmp"] = write("/tmp/scratch")
    out["deadline_file"] = write(os.environ["GPUPOOL_STOP_DEADLINE_FILE"])
    out["pids"] = sorted(int(p) for p in os.listdir("/proc") if p.isdigit())
    print(json.dumps(out))
""")


@pytest.fixture
def host_dir():
    """A world-writable host directory outside /tmp (the sandbox has its own /tmp) the work must not write to."""
    path = tempfile.mkdtemp(prefix="gpupool-host-", dir="/var/tmp")
    os.chmod(path, 0o777)
    yield path
    shutil.rmtree(path, ignore_errors=True)


def spec(alloc: str, argv: list[str], **kw) -> LaunchSpec:
    return LaunchSpec(allocation_id=alloc, job_id=f"job-{alloc}", argv=argv, env=JOB_ENV, isolation="sandbox", **kw)


async def test_sandbox_sees_only_its_devices_and_writes_only_its_dirs(make_executor, reports, fake_devices,
                                                                      host_dir, state_dir) -> None:
    ex = make_executor()
    await ex.launch(spec("x-probe", [PY, "-c", PROBE, host_dir], gpu_indices=[1], device_dir=str(fake_devices)))
    r = await reports.next()
    assert r.reason == "Completed", ex.read_logs("x-probe", "stderr")
    seen = json.loads(ex.read_logs("x-probe", "stdout")[0])
    assert seen["uid"] == 65534 and seen["cwd"] == str(state_dir / "jobs" / "job-x-probe" / "work")
    assert seen["nvidia1"] == "ENXIO"  # bound in, and allowed by the devices cgroup (no driver behind it)
    assert seen["nvidia2"] == "ENOENT"  # not granted: not even there
    assert seen["nvidiactl"] == "ENXIO" and seen["null"] == "opened"
    assert seen["host"] == "EROFS" and not os.path.exists(os.path.join(host_dir, "escaped"))
    assert seen["etc"] in ("EROFS", "EACCES") and not os.path.exists("/etc/gpupool-escaped")
    assert seen["deadline_file"] in ("EROFS", "EACCES")
    assert seen["workdir"] == seen["checkpoint"] == seen["tmp"] == "ok"
    assert (state_dir / "jobs" / "job-x-probe" / "work" / "result").read_text() == "x"
    assert (state_dir / "checkpoints" / "job-x-probe" / "ckpt").read_text() == "x"
    assert not os.path.exists("/tmp/scratch")  # its /tmp was private
    assert seen["pid"] <= 3 and len(seen["pids"]) <= 3  # its own PID namespace: bwrap's init and itself


async def test_stop_signal_reaches_the_sandboxed_work(make_executor, reports) -> None:
    ex = make_executor()
    await ex.launch(spec("x-stop", [PY, "-c", textwrap.dedent("""
        import signal, sys, time
        signal.signal(signal.SIGTERM, lambda *_: (print("term", flush=True), sys.exit(0)))
        print("ready", flush=True)
        while True:
            time.sleep(0.05)
    """)], stop_grace_s=10.0))
    await wait_for(lambda: ex.read_logs("x-stop", "stdout")[0] == b"ready\n", what="the sandboxed trap")
    tree = ex.pids("x-stop")
    assert len(tree) >= 3  # bwrap, its init in the namespace, the work
    await ex.stop("x-stop")
    r = await reports.next(timeout=8)
    assert (r.reason, r.exit_code, r.stopped) == ("Stopped", 0, True)
    assert ex.read_logs("x-stop", "stdout")[0] == b"ready\nterm\n"
    assert [p for p in tree if alive(p)] == []


async def test_sandbox_preflight_and_setup_failures(make_executor) -> None:
    ex = make_executor()
    with pytest.raises(LaunchError) as e:
        await ex.launch(spec("x-none", ["no-such-command-gpupool"]))
    assert e.value.reason == "CommandNotFound"

    class BrokenSandbox(SandboxDriver):
        def argv(self, spec, paths, command):
            out = super().argv(spec, paths, command)
            return out[:1] + ["--bind", "/nonexistent-gpupool", "/x"] + out[1:]

    ex._drivers["sandbox"] = BrokenSandbox()
    with pytest.raises(LaunchError) as e:
        await ex.launch(spec("x-broken", ["true"]))
    assert e.value.reason == "SandboxFailed" and "nonexistent-gpupool" in e.value.message
    assert ex.running() == {}
