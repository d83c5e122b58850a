"""The lifecycle rules of a job's work, without servers: what the end of one allocation's work means for the job
(queue) and for its allocations (placement), and the environment and log text the agent hands out."""

from __future__ import annotations

from datetime import UTC, datetime

from libs.contracts.events import AllocatedGpu
from libs.contracts.work import RestartPolicy, WorkExit, WorkSpec
from services.agent.domain import launch_environment, log_text
from services.placement.domain import on_work_end
from services.queue.domain import after_work_ended

NOW = datetime(2026, 12, 1, tzinfo=UTC)
WORK = WorkSpec(command=["train"])
RESTARTING = WorkSpec(command=["train"], restart=RestartPolicy(policy="on_failure", attempts=2, delay_s=5))


def ended(reason: str = "Completed", code: int | None = 0, **kw) -> WorkExit:  # type: ignore[no-untyped-def]
    return WorkExit(reason=reason, exit_code=code, exited_at=NOW, **kw)  # type: ignore[arg-type]


def decide(exit: WorkExit, *, state="running", replica_set=False, work=WORK, restarts=0, recorded=None,  # type: ignore[no-untyped-def]
           release="WorkCompleted", remaining=0):
    return after_work_ended(state=state, replica_set=replica_set, work=work, restarts=restarts, recorded=recorded,
                            release_reason=release, exit=exit, remaining=remaining)


def test_exit_zero_of_the_last_member_completes_the_job() -> None:
    out = decide(ended())
    assert (out.action, out.reason, out.exit_code) == ("complete", "Completed", 0)


def test_a_non_zero_exit_fails_the_job_with_its_code() -> None:
    out = decide(ended("NonZeroExit", 3), release="WorkFailed")
    assert (out.action, out.reason, out.exit_code) == ("fail", "NonZeroExit", 3)
    assert "code 3" in out.message


def test_out_of_memory_is_its_own_reason() -> None:
    out = decide(ended("OutOfMemory", None, oom=True, signal="SIGKILL"), release="WorkFailed")
    assert (out.action, out.reason) == ("fail", "OutOfMemory")


def test_a_launch_failure_fails_a_launching_job() -> None:
    out = decide(ended("CommandNotFound", None, message="no such program: trian"), state="launching",
                 release="WorkFailed")
    assert (out.action, out.reason) == ("fail", "CommandNotFound")
    assert "trian" in out.message


def test_failures_restart_per_policy_then_fail() -> None:
    first = decide(ended("NonZeroExit", 1), work=RESTARTING, restarts=0, release="WorkFailed")
    assert (first.action, first.reason, first.delay_s) == ("restart", "Restarted:NonZeroExit", 5)
    last = decide(ended("NonZeroExit", 1), work=RESTARTING, restarts=2, release="WorkFailed")
    assert (last.action, last.exit_code) == ("fail", 1)


def test_a_gang_waits_for_every_member_and_the_first_failure_is_the_cause() -> None:
    first = decide(ended("NonZeroExit", 7), release="WorkFailed", remaining=1)
    assert first.action == "wait" and first.failure and first.failure["exit_code"] == 7
    # the member placement stopped because of it ends "Stopped": a consequence, not the cause
    last = decide(ended("Stopped", None, signal="SIGTERM", stopped=True), release="GangMemberFailed",
                  recorded=first.failure)
    assert (last.action, last.reason, last.exit_code) == ("fail", "NonZeroExit", 7)


def test_a_stopped_member_alone_is_no_failure_cause_and_members_finishing_zero_complete() -> None:
    assert decide(ended(), remaining=1).action == "wait"
    assert decide(ended(), remaining=0).action == "complete"


def test_preempting_finished_and_replicated_jobs_are_left_alone() -> None:
    assert decide(ended("NonZeroExit", 1), state="preempting").action == "ignore"
    assert decide(ended(), state="cancelled").action == "ignore"
    assert decide(ended("NonZeroExit", 1), replica_set=True).action == "ignore"


def test_placement_keeps_the_reason_of_a_stop_it_asked_for_whatever_the_exit() -> None:
    # Slurm's GraceTime rule: work that exits inside the grace after a preemption is requeued
    assert on_work_end(stop_reason="PreemptedByPriority", exit_reason="NonZeroExit", gang_nodes=0).reason == \
        "PreemptedByPriority"
    assert on_work_end(stop_reason="JobCancelled", exit_reason="Stopped", gang_nodes=2).stop_others is False


def test_placement_names_an_unasked_end_and_stops_a_failed_gangs_other_members() -> None:
    assert on_work_end(stop_reason=None, exit_reason="Completed", gang_nodes=2).reason == "WorkCompleted"
    assert on_work_end(stop_reason=None, exit_reason="MaxRuntimeExceeded", gang_nodes=0).reason == \
        "MaxRuntimeExceeded"
    failed = on_work_end(stop_reason=None, exit_reason="OutOfMemory", gang_nodes=2)
    assert (failed.reason, failed.stop_others) == ("WorkFailed", True)
    assert on_work_end(stop_reason=None, exit_reason="NonZeroExit", gang_nodes=0).stop_others is False


def test_the_grant_names_the_gpus_and_the_job_cannot_override_it() -> None:
    gpus = [AllocatedGpu(uuid="GPU-a", index=0, model="H100-80GB"), AllocatedGpu(uuid="GPU-b", index=1,
                                                                                  model="H100-80GB")]
    env = launch_environment({"CUDA_VISIBLE_DEVICES": "GPU-a,GPU-b", "GPUPOOL_ALLOCATION_ID": "a1"},
                             {"LR": "3e-4", "PATH": "/opt/bin"}, gpus=gpus, mig_uuid=None)
    assert env["CUDA_VISIBLE_DEVICES"] == "GPU-a,GPU-b" and env["CUDA_DEVICE_ORDER"] == "PCI_BUS_ID"
    assert env["LR"] == "3e-4" and env["PATH"] == "/opt/bin" and env["GPUPOOL_ALLOCATION_ID"] == "a1"
    mig = launch_environment({}, {}, gpus=gpus[:1], mig_uuid="MIG-1234")
    assert mig["CUDA_VISIBLE_DEVICES"] == mig["NVIDIA_VISIBLE_DEVICES"] == "MIG-1234"


def test_log_text_never_splits_a_character_across_reads() -> None:
    data = "héllo €".encode()
    text, used = log_text(data[:-1], complete=False)  # € is 3 bytes: its first two are held back
    assert text == "héllo " and used == len(data) - 3
    assert log_text(data, complete=False) == ("héllo €", len(data))
    assert log_text(data[:-1], complete=True)[1] == len(data) - 1  # nothing more will come: show what is there


def test_a_gpu_process_belongs_to_the_allocation_whose_cgroup_holds_it() -> None:
    from services.agent.domain import attribute_by_cgroup
    from services.agent.nvml_types import GpuProcess

    procs = [GpuProcess(pid=10, gpu_uuid="GPU-a", gpu_index=0, used_memory_mib=100, allocation_id="forged"),
             GpuProcess(pid=11, gpu_uuid="GPU-a", gpu_index=0, used_memory_mib=100, allocation_id="a-env"),
             GpuProcess(pid=12, gpu_uuid="GPU-a", gpu_index=0, used_memory_mib=100)]
    out = attribute_by_cgroup(procs, {10: "a-cgroup", 12: "a-cgroup"})
    # the cgroup wins over a forged environment; outside every cgroup the environment still counts
    assert [p.allocation_id for p in out] == ["a-cgroup", "a-env", "a-cgroup"]


def test_a_failing_replica_backs_off_doubling_up_to_five_minutes_and_a_healthy_run_starts_over() -> None:
    from services.placement.domain import BACKOFF_MAX_S, replica_back_off

    failures, delays = 0, []
    for _ in range(12):
        failures, delay = replica_back_off(failures, 0.0)  # a launch failure: it never ran
        delays.append(delay)
    assert delays[:5] == [1.0, 2.0, 4.0, 8.0, 16.0] and delays[-1] == BACKOFF_MAX_S == 300.0
    assert replica_back_off(11, 61.0) == (1, 1.0)  # it ran a minute: the count starts again
    assert replica_back_off(2, 59.0) == (3, 4.0)
    assert replica_back_off(10**6, 0.0)[1] == 300.0  # no overflow however long it loops


def test_work_stopped_for_its_fractions_memory_fails_the_job_and_releases_it() -> None:
    exit = ended("FractionMemoryExceeded", None, signal="SIGTERM", stopped=True,
                 message="process 7 used 9000 MiB of GPU memory, over its fraction's 8192 MiB")
    assert on_work_end(stop_reason=None, exit_reason=exit.reason, gang_nodes=0).reason == "WorkFailed"
    out = decide(exit, release="WorkFailed")
    assert (out.action, out.reason) == ("fail", "FractionMemoryExceeded")
    assert "over its fraction's 8192 MiB" in out.message
