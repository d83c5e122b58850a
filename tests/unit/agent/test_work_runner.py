"""The agent's bus side of the executor (services/agent/work.py) against a fake executor: what it launches from a
grant, how a stop request and a release reach the work, and that every end is reported exactly as it happened."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime, timedelta

from libs.contracts.events import (
    AllocatedGpu,
    AllocationGranted,
    AllocationPreempting,
    AllocationReleased,
    WorkExited,
    WorkReady,
    WorkStarted,
)
from libs.contracts.work import WorkSpec
from services.agent.domain import network_environment
from services.agent.executor import ExitReport, LaunchError
from services.agent.work import WorkRunner

NOW = datetime(2026, 12, 1, tzinfo=UTC)
GPUS = [AllocatedGpu(uuid="GPU-1", index=1, model="H100-80GB"), AllocatedGpu(uuid="GPU-3", index=3, model="H100-80GB")]


class FakeExecutor:
    def __init__(self, fail: LaunchError | None = None) -> None:
        self.fail = fail
        self.launched: list = []
        self.stops: list = []
        self._running: dict[str, dict] = {}

    async def adopt(self) -> None:
        return None

    async def launch(self, spec) -> int:  # type: ignore[no-untyped-def]
        if self.fail is not None:
            raise self.fail
        self.launched.append(spec)
        self._running[spec.allocation_id] = {}
        return 4242

    async def stop(self, allocation_id: str, *, signal=None, deadline=None, reason: str = "") -> None:  # type: ignore[no-untyped-def]
        self.stops.append((allocation_id, deadline, reason))

    def running(self) -> dict:
        return self._running

    def read_logs(self, allocation_id, stream, *, offset=0, limit=65536, tail=None):  # type: ignore[no-untyped-def]
        if allocation_id not in self._running:
            raise KeyError(allocation_id)
        data = "caf\u00e9".encode()
        return data[:-1], offset + 4, False  # the é is cut: it waits for the next read

    def close(self) -> None:
        return None

    def prune(self, keep_s: float) -> list[str]:
        self.pruned = keep_s
        return []


def runner(executor: FakeExecutor) -> tuple[WorkRunner, list]:
    published: list = []

    async def publish(event, identity: str) -> bool:  # type: ignore[no-untyped-def]
        published.append((event, identity))
        return True

    return WorkRunner(None, "c", "n1", executor, publish, device_dir="/tmp/dev", run_as_uid=1000), published  # type: ignore[arg-type]


def grant(allocation_id: str = "a1", **work) -> AllocationGranted:  # type: ignore[no-untyped-def]
    return AllocationGranted(
        allocation_id=allocation_id, job_id="j1", team="t", project="p", cluster="c", node="n1", gpus=GPUS,
        replica=1, granted_at=NOW, kind="training", max_runtime_s=600, attempt=2,
        environment={"CUDA_VISIBLE_DEVICES": "GPU-1,GPU-3", "GPUPOOL_ALLOCATION_ID": allocation_id},
        work=WorkSpec(command=["python", "train.py"], env={"LR": "1"}, limits={"memory_mib": 512},
                      stop_signal="SIGINT", stop_grace_s=7, **work))


async def settle() -> None:
    for _ in range(5):
        await asyncio.sleep(0)


async def test_a_grant_with_work_is_launched_on_its_gpus_and_reported_started() -> None:
    ex = FakeExecutor()
    r, published = runner(ex)
    r.on_granted(grant())
    await settle()
    (spec,) = ex.launched
    assert spec.argv == ["python", "train.py"] and spec.gpu_indices == [1, 3] and spec.device_dir == "/tmp/dev"
    assert spec.env["CUDA_VISIBLE_DEVICES"] == "GPU-1,GPU-3" and spec.env["LR"] == "1"
    assert (spec.stop_signal, spec.stop_grace_s, spec.max_runtime_s, spec.attempt) == ("SIGINT", 7, 600, 2)
    assert spec.limits.memory_mib == 512 and spec.uid == 1000
    (event, identity), = published
    assert isinstance(event, WorkStarted) and event.pid == 4242 and event.attempt == 2 and event.replica == 1
    assert identity == "work_started/a1"
    r.on_granted(grant())  # a replayed grant launches nothing twice
    await settle()
    assert len(ex.launched) == 1


async def test_a_grant_without_work_is_not_the_executors() -> None:
    ex = FakeExecutor()
    r, published = runner(ex)
    g = grant()
    r.on_granted(g.model_copy(update={"work": None}))
    await settle()
    assert ex.launched == [] and published == [] and not r.runs("a1")


async def test_a_launch_failure_is_reported_as_the_end_of_the_attempt() -> None:
    ex = FakeExecutor(fail=LaunchError("CommandNotFound", "python: not found on PATH"))
    r, published = runner(ex)
    r.on_granted(grant())
    await settle()
    (event, identity), = published
    assert isinstance(event, WorkExited) and identity == "work_exited/a1"
    assert (event.exit.reason, event.exit.exit_code) == ("CommandNotFound", None)
    assert "not found" in event.exit.message


async def test_a_mig_grant_waits_for_its_instance() -> None:
    ex = FakeExecutor()
    r, _ = runner(ex)
    mig = grant().model_copy(update={"gpus": [AllocatedGpu(uuid="GPU-1", index=1, model="A100-80GB",
                                                           share_milli=428, mig_profile="3g.40gb", mig_start=0)]})
    r.on_granted(mig)
    await settle()
    assert ex.launched == []
    r.launch_ready({"a1": "MIG-abc"})
    await settle()
    assert ex.launched[0].env["CUDA_VISIBLE_DEVICES"] == "MIG-abc"


async def test_a_stop_request_reaches_the_work_with_its_deadline_and_a_release_kills_it() -> None:
    ex = FakeExecutor()
    r, _ = runner(ex)
    r.on_granted(grant())
    await settle()
    deadline = NOW + timedelta(seconds=30)
    await r.on_preempting(AllocationPreempting(
        allocation_id="a1", job_id="j1", team="t", project="p", cluster="c", node="n1", gpus=GPUS,
        reason="PreemptedByPriority", message="m", preemptor_job_id="j2", deadline=deadline))
    await r.on_released(AllocationReleased(
        allocation_id="a1", job_id="j1", team="t", project="p", cluster="c", node="n1", gpus=GPUS,
        granted_at=NOW, released_at=NOW, reason="NodeLost"))
    assert [(a, d == deadline, why) for a, d, why in ex.stops] == [
        ("a1", True, "PreemptedByPriority"), ("a1", False, "NodeLost")]


async def test_a_stop_before_the_start_means_it_never_starts() -> None:
    ex = FakeExecutor()
    r, published = runner(ex)
    mig = grant().model_copy(update={"gpus": [AllocatedGpu(uuid="GPU-1", index=1, model="A100-80GB",
                                                           share_milli=428, mig_profile="3g.40gb", mig_start=0)]})
    r.on_granted(mig)
    await r.on_preempting(AllocationPreempting(
        allocation_id="a1", job_id="j1", team="t", project="p", cluster="c", node="n1", gpus=mig.gpus,
        reason="JobCancelled", message="m", preemptor_job_id="", deadline=NOW))
    r.launch_ready({"a1": "MIG-abc"})
    await settle()
    assert ex.launched == []
    (event, _), = published
    assert isinstance(event, WorkExited) and event.exit.reason == "Stopped" and event.exit.stopped


async def test_the_exit_is_reported_with_what_the_executor_measured() -> None:
    ex = FakeExecutor()
    r, published = runner(ex)
    r.on_granted(grant())
    await settle()
    await r.on_exit(ExitReport(allocation_id="a1", job_id="j1", attempt=2, replica=1, exit_code=None,
                               signal="SIGKILL", oom=True, reason="OutOfMemory", message="memory limit 512 MiB",
                               started_at=NOW, exited_at=NOW + timedelta(seconds=9), wall_s=9.0, cpu_s=3.5,
                               stopped=False, pid=4242))
    event = published[-1][0]
    assert isinstance(event, WorkExited) and event.team == "t" and event.attempt == 2
    assert (event.exit.reason, event.exit.signal, event.exit.oom, event.exit.cpu_s) == (
        "OutOfMemory", "SIGKILL", True, 3.5)
    r.on_granted(grant())  # its work ended: a late replay of the grant never starts it again
    await settle()
    assert len(ex.launched) == 1


async def test_live_allocations_placement_lists_launch_a_missed_grant() -> None:
    ex = FakeExecutor()
    r, _ = runner(ex)
    item = {"allocation_id": "a9", "job_id": "j9", "team": "t", "project": "p", "cluster": "c", "node": "n1",
            "replica": 0, "granted_at": NOW.isoformat(), "kind": "batch", "attempt": 0,
            "gpus": [g.model_dump() for g in GPUS], "work": {"command": ["true"]}, "preempt_deadline": None,
            "environment": {"CUDA_VISIBLE_DEVICES": "GPU-1,GPU-3"}}
    r.on_live(item)
    r.on_live({**item, "allocation_id": "nowork", "work": None})
    await settle()
    assert [s.allocation_id for s in ex.launched] == ["a9"]


async def test_log_reads_never_split_a_character() -> None:
    ex = FakeExecutor()
    r, _ = runner(ex)
    r.on_granted(grant())
    await settle()
    from libs.contracts.commands import ReadLogs

    reply = await r.read_logs(ReadLogs(allocation_id="a1", stream="stdout"))
    assert reply.ok and reply.result["data"] == "caf" and reply.result["next_offset"] == 3
    missing = await r.read_logs(ReadLogs(allocation_id="zz", stream="stdout"))
    assert not missing.ok and missing.error.reason == "NoLogs"


async def test_a_stop_missed_while_the_agent_was_away_reaches_the_work_at_the_next_sync() -> None:
    ex = FakeExecutor()
    r, _ = runner(ex)
    r.on_granted(grant())
    await settle()
    item = {"allocation_id": "a1", "job_id": "j1", "work": {"command": ["python", "train.py"]},
            "preempt_deadline": (NOW + timedelta(seconds=5)).isoformat(), "preempt_reason": "JobCancelled"}
    r.on_live(item)
    await settle()
    assert [(a, d == NOW + timedelta(seconds=5), why) for a, d, why in ex.stops] == [("a1", True, "JobCancelled")]


async def test_work_whose_allocation_is_no_longer_live_is_killed_but_a_newer_grant_is_left_alone() -> None:
    import time

    ex = FakeExecutor()
    r, _ = runner(ex)
    r.on_granted(grant("old"))
    await settle()
    listing_began = time.monotonic()
    r.on_granted(grant("new"))  # granted while the listing was on its way: it may be missing from it
    await settle()
    r.on_synced(live=set(), listened_since=listing_began)
    await settle()
    assert [(a, why) for a, _, why in ex.stops] == [("old", "AllocationNotLive")]
    assert ex.pruned == 86_400.0  # each sync also forgets attempts that ended longer ago than the retention
    r.on_synced(live={"new"}, listened_since=time.monotonic())  # a later sync: "new" is live and kept
    await settle()
    assert {a for a, _, _ in ex.stops} == {"old"}


async def test_an_exit_known_while_the_start_report_is_on_its_way_is_reported_after_it() -> None:
    """A quick command (`true`) ends while `agent.work_started` is still being published: the exit report waits
    for it, so nobody sees the work end before it started."""
    ex = FakeExecutor()
    gate = asyncio.Event()
    published: list = []

    async def publish(event, identity: str) -> bool:  # type: ignore[no-untyped-def]
        if isinstance(event, WorkStarted):
            await gate.wait()  # JetStream is slow to take the start report
        published.append(event)
        return True

    r = WorkRunner(None, "c", "n1", ex, publish, device_dir="/tmp/dev", run_as_uid=1000)  # type: ignore[arg-type]
    r.on_granted(grant())
    await settle()
    assert ex.launched and published == []
    exiting = asyncio.ensure_future(r.on_exit(ExitReport(
        allocation_id="a1", job_id="j1", attempt=2, replica=1, exit_code=0, signal=None, oom=False,
        reason="Completed", message="exit 0", started_at=NOW, exited_at=NOW, wall_s=0.001, cpu_s=0.0,
        stopped=False, pid=4242)))
    await settle()
    assert published == [] and not exiting.done()  # held back behind the start
    gate.set()
    await asyncio.wait_for(exiting, 1)
    assert [type(e) for e in published] == [WorkStarted, WorkExited]


async def test_work_over_its_fraction_stops_and_ends_failed_fraction_memory_exceeded() -> None:
    """Issue #17: no job stays `running` on a killed process; its end says why."""
    ex = FakeExecutor()
    r, published = runner(ex)
    r.on_granted(grant())
    await settle()
    await r.stop_over_fraction("a1", 777, 9000, 8192, grace_s=5)
    await r.stop_over_fraction("a1", 778, 9100, 8192, grace_s=5)  # a second process: one stop is enough
    [(allocation_id, deadline, reason)] = ex.stops
    assert (allocation_id, reason) == ("a1", "FractionMemoryExceeded")
    assert 4 < (deadline - datetime.now(UTC)).total_seconds() <= 5
    await r.on_exit(ExitReport(allocation_id="a1", job_id="j1", attempt=2, replica=1, exit_code=None,
                               signal="SIGTERM", oom=False, reason="Stopped", message="killed by SIGTERM",
                               started_at=NOW, exited_at=NOW, wall_s=3.0, cpu_s=0.5, stopped=True, pid=4242))
    await settle()
    [exited] = [e for e, _ in published if isinstance(e, WorkExited)]
    assert exited.exit.reason == "FractionMemoryExceeded" and not exited.exit.succeeded
    assert exited.exit.message.startswith("process 777 used 9000 MiB of GPU memory, over its fraction's 8192 MiB")


async def test_a_job_with_a_rendezvous_gets_the_nodes_nccl_interfaces_unless_it_names_its_own() -> None:
    ex = FakeExecutor()
    r, _ = runner(ex)
    r.rendezvous_env = network_environment("eth0", "mlx5_0,mlx5_1")
    with_rendezvous = grant("a1")
    with_rendezvous.environment.update({"PET_NNODES": "2", "PET_NODE_RANK": "1", "MASTER_ADDR": "10.0.0.1"})
    r.on_granted(with_rendezvous)
    own = grant("a2")
    own.environment["PET_NNODES"] = "2"
    assert own.work is not None
    own.work.env["NCCL_SOCKET_IFNAME"] = "ib0"
    r.on_granted(own)
    r.on_granted(grant("a3"))  # no rendezvous: nothing about NCCL
    await settle()
    r.on_gang_ready("a1")
    r.on_gang_ready("a2")
    await settle()
    env = {spec.allocation_id: spec.env for spec in ex.launched}
    assert (env["a1"]["NCCL_SOCKET_IFNAME"], env["a1"]["NCCL_IB_HCA"]) == ("eth0", "mlx5_0,mlx5_1")
    assert env["a1"]["PET_NODE_RANK"] == "1" and env["a1"]["MASTER_ADDR"] == "10.0.0.1"
    assert (env["a2"]["NCCL_SOCKET_IFNAME"], env["a2"]["NCCL_IB_HCA"]) == ("ib0", "mlx5_0,mlx5_1")
    assert "NCCL_SOCKET_IFNAME" not in env["a3"] and "NCCL_IB_HCA" not in env["a3"]
    assert network_environment("", "") == {}


def gang_member(allocation_id: str) -> AllocationGranted:
    g = grant(allocation_id)
    g.environment.update({"PET_NNODES": "2", "PET_NODE_RANK": "1"})
    return g


async def test_a_gang_member_reports_ready_and_starts_only_when_its_gang_is() -> None:
    ex = FakeExecutor()
    r, published = runner(ex)
    r.on_granted(gang_member("a1"))
    await settle()
    assert ex.launched == [], "a gang member started before its gang was ready"
    (ready, identity), = published
    assert isinstance(ready, WorkReady) and ready.allocation_id == "a1" and ready.attempt == 2
    assert identity == "work_ready/a1"
    r.on_gang_ready("a1")
    r.on_gang_ready("a1")  # a redelivered gang_ready starts nothing twice
    await settle()
    assert [s.allocation_id for s in ex.launched] == ["a1"]
    assert isinstance(published[-1][0], WorkStarted)


async def test_a_gang_member_stopped_or_released_while_it_waits_never_starts_and_its_end_is_reported() -> None:
    ex = FakeExecutor()
    r, published = runner(ex)
    r.on_granted(gang_member("a1"))
    r.on_granted(gang_member("a2"))
    await settle()
    await r.on_preempting(AllocationPreempting(
        allocation_id="a1", job_id="j1", team="t", project="p", cluster="c", node="n1", gpus=GPUS,
        reason="GangStartTimeout", message="", preemptor_job_id="", deadline=NOW))
    await r.on_released(AllocationReleased(
        allocation_id="a2", job_id="j1", team="t", project="p", cluster="c", node="n1", gpus=GPUS,
        granted_at=NOW, released_at=NOW, reason="NodeLost"))
    r.on_gang_ready("a1")
    await settle()
    assert ex.launched == []
    exits = {e.allocation_id: e.exit for e, _ in published if isinstance(e, WorkExited)}
    assert set(exits) == {"a1", "a2"} and all(x.reason == "Stopped" for x in exits.values())


async def test_a_resync_that_lists_the_gang_started_starts_a_member_that_missed_gang_ready() -> None:
    ex = FakeExecutor()
    r, _ = runner(ex)
    r.on_granted(gang_member("a1"))
    await settle()
    item = {"allocation_id": "a1", "work": {"command": ["x"]}, "gang_wait": True}
    r.on_live(item)  # still waiting: nothing
    await settle()
    assert ex.launched == []
    r.on_live({**item, "gang_wait": False})
    await settle()
    assert [s.allocation_id for s in ex.launched] == ["a1"]
