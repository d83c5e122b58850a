"""The agent's CUDA MPS daemons (services/agent/mps.py) against a fake `nvidia-cuda-mps-control` that behaves as
NVIDIA documents the real one: `-d` daemonizes and writes its pid to <CUDA_MPS_PIPE_DIRECTORY>/
nvidia-cuda-mps-control.pid; `quit` on stdin (with the same pipe directory) makes that daemon exit. It also logs the
GPU it was started for, so a test sees each daemon served exactly its own GPU. And the WorkRunner side: a
fraction's work runs as its GPU's client with its limits; a whole GPU of that GPU stops the daemon first; the last
fraction's end stops it."""

from __future__ import annotations

import asyncio
import time
from datetime import UTC, datetime
from pathlib import Path

import pytest
from fake_mps import FAKE  # the fake control binary, shared with the device check's test

from libs.contracts.events import AllocatedGpu, AllocationGranted
from libs.contracts.work import WorkSpec
from services.agent.domain import mps_gpus
from services.agent.executor import ExitReport
from services.agent.mps import PID_FILE, MpsControl, MpsError
from services.agent.work import WorkRunner


@pytest.fixture
def control(tmp_path: Path) -> str:
    path = tmp_path / "bin" / "nvidia-cuda-mps-control"
    path.parent.mkdir()
    path.write_text(FAKE)
    path.chmod(0o755)
    return str(path)


@pytest.fixture
def mps(tmp_path: Path, control: str):  # type: ignore[no-untyped-def]
    m = MpsControl(tmp_path / "mps", control, start_timeout_s=5, stop_timeout_s=2)
    yield m
    m.stop_all()


def log_of(m: MpsControl, gpu: str) -> list[str]:
    return (m.dirs(gpu)[1] / "control.log").read_text().split("\n")[:-1]


def test_one_daemon_per_gpu_started_once_and_quit_on_stop(mps: MpsControl) -> None:
    env = mps.ensure("GPU-aaaa")
    pipe, log = mps.dirs("GPU-aaaa")
    assert env == {"CUDA_MPS_PIPE_DIRECTORY": str(pipe), "CUDA_MPS_LOG_DIRECTORY": str(log)}
    first = mps.pid("GPU-aaaa")
    assert first is not None
    assert mps.ensure("GPU-aaaa") == env and mps.pid("GPU-aaaa") == first  # running: not started again
    mps.ensure("GPU-bbbb")
    assert mps.running() == ["GPU-aaaa", "GPU-bbbb"]
    assert log_of(mps, "GPU-aaaa") == ["start GPU-aaaa"] and log_of(mps, "GPU-bbbb") == ["start GPU-bbbb"]
    assert mps.stop("GPU-aaaa") is True
    assert mps.pid("GPU-aaaa") is None and log_of(mps, "GPU-aaaa") == ["start GPU-aaaa", "quit"]
    assert mps.running() == ["GPU-bbbb"]
    assert mps.stop("GPU-aaaa") is False  # nothing left to stop


def test_a_daemon_that_ignores_quit_is_killed(mps: MpsControl, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FAKE_MPS_STUBBORN", "1")
    mps.ensure("GPU-cccc")
    pid = mps.pid("GPU-cccc")
    assert pid is not None
    started = time.monotonic()
    assert mps.stop("GPU-cccc") is True
    assert time.monotonic() - started < 5
    for _ in range(100):
        if not Path(f"/proc/{pid}").exists():
            break
        time.sleep(0.02)
    assert not Path(f"/proc/{pid}").exists() or "Z" in Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1][:3]
    assert not (mps.dirs("GPU-cccc")[0] / PID_FILE).exists()


def test_no_binary_is_a_clear_error_and_unsafe_names_are_refused(tmp_path: Path) -> None:
    m = MpsControl(tmp_path / "mps", str(tmp_path / "missing"))
    with pytest.raises(MpsError, match="not found"):
        m.ensure("GPU-dddd")
    with pytest.raises(ValueError, match="unsafe"):
        m.dirs("../../etc")


def test_which_gpus_need_the_daemon_and_which_need_it_gone() -> None:
    gpus = [AllocatedGpu(uuid="G1", index=0, model="H100", share_milli=250, memory_mib=20000),
            AllocatedGpu(uuid="G2", index=1, model="H100"),
            AllocatedGpu(uuid="G3", index=2, model="H100", share_milli=428, mig_profile="3g.40gb", mig_start=0)]
    assert mps_gpus(gpus) == (["G1"], ["G2", "G3"])


# --------------------------------------------------------------------------- the agent's side


class Executor:
    def __init__(self) -> None:
        self.launched: list = []

    async def adopt(self) -> None:
        return None

    async def launch(self, spec) -> int:  # type: ignore[no-untyped-def]
        self.launched.append(spec)
        return 4242

    def running(self) -> dict:
        return {}

    def close(self) -> None:
        return None


def granted(allocation_id: str, gpu: AllocatedGpu, env: dict[str, str]) -> AllocationGranted:
    return AllocationGranted(allocation_id=allocation_id, job_id=f"j-{allocation_id}", team="t", project="p",
                             cluster="c", node="n1", gpus=[gpu], granted_at=datetime.now(UTC), kind="dev",
                             environment={"CUDA_VISIBLE_DEVICES": gpu.uuid, **env},
                             work=WorkSpec(command=["python", "serve.py"]))


async def settle() -> None:
    for _ in range(50):
        await asyncio.sleep(0.01)


async def exited(runner: WorkRunner, allocation_id: str) -> None:
    now = datetime.now(UTC)
    await runner.on_exit(ExitReport(allocation_id=allocation_id, job_id=f"j-{allocation_id}", attempt=0, replica=0,
                                    reason="Completed", exit_code=0, signal=None, oom=False, stopped=False,
                                    message="", started_at=now, exited_at=now, wall_s=1.0, cpu_s=0.1, pid=4242))


def runner_with(mps: MpsControl) -> tuple[WorkRunner, Executor, list]:
    """A work runner over a fake executor, and the events it published."""
    published: list = []

    async def publish(event, identity: str) -> bool:  # type: ignore[no-untyped-def]
        published.append(event)
        return True

    ex = Executor()
    return WorkRunner(None, "c", "n1", ex, publish, mps=mps), ex, published  # type: ignore[arg-type]


async def test_fractions_run_as_clients_and_a_whole_gpu_stops_the_daemon(mps: MpsControl) -> None:
    runner, ex, _ = runner_with(mps)
    limits = {"CUDA_MPS_ACTIVE_THREAD_PERCENTAGE": "25", "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT": "0=20000M"}
    quarter = AllocatedGpu(uuid="GPU-eeee", index=0, model="H100", share_milli=250, memory_mib=20000)
    runner.on_granted(granted("f1", quarter, limits))
    runner.on_granted(granted("f2", quarter, limits))
    await settle()
    assert len(ex.launched) == 2
    pipe = str(mps.dirs("GPU-eeee")[0])
    for spec in ex.launched:  # each fraction: a client of its GPU's one daemon, with its limits
        assert spec.env["CUDA_MPS_PIPE_DIRECTORY"] == pipe
        assert spec.env["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] == "25"
        assert spec.env["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"] == "0=20000M"
    assert log_of(mps, "GPU-eeee") == ["start GPU-eeee"]
    await exited(runner, "f1")
    assert mps.pid("GPU-eeee") is not None  # f2 still uses it
    await exited(runner, "f2")
    assert mps.pid("GPU-eeee") is None  # the last fraction ended: the daemon goes
    runner.on_granted(granted("f3", quarter, limits))
    await settle()
    assert mps.pid("GPU-eeee") is not None
    whole = AllocatedGpu(uuid="GPU-eeee", index=0, model="H100")  # f3 is gone (say, preempted) and a whole GPU
    await exited(runner, "f3")
    mps.ensure("GPU-eeee")  # left over (an agent restarted after f3 ended, say)
    runner.on_granted(granted("w1", whole, {}))
    await settle()
    assert mps.pid("GPU-eeee") is None  # no MPS under a whole GPU's work
    assert "CUDA_MPS_PIPE_DIRECTORY" not in ex.launched[-1].env


async def test_a_fraction_is_not_started_without_its_daemon(tmp_path: Path) -> None:
    runner, ex, published = runner_with(MpsControl(tmp_path / "m", str(tmp_path / "none")))
    quarter = AllocatedGpu(uuid="GPU-ffff", index=0, model="H100", share_milli=250, memory_mib=20000)
    runner.on_granted(granted("f1", quarter, {"CUDA_MPS_ACTIVE_THREAD_PERCENTAGE": "25"}))
    await settle()
    assert ex.launched == []  # limits nobody would enforce: not started
    (exit_event,) = [e for e in published if type(e).__name__ == "WorkExited"]
    assert exit_event.exit.reason == "DriverUnavailable" and "MPS" in exit_event.exit.message
    assert exit_event.allocation_id == "f1"
