"""The job state machine: which transitions are legal, and the refusal when one is not; what an attempt's end
means; how a service scales itself; when a submission is refused because the queue is full."""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any, Literal

from libs.contracts.autoscale import AutoscalePolicy
from libs.contracts.work import WorkExit, WorkSpec
from libs.domain import Refusal

TERMINAL = frozenset({"completed", "cancelled", "failed"})

TRANSITIONS: dict[str, frozenset[str]] = {
    "awaiting_approval": frozenset({"pending", "cancelled", "failed"}),
    "pending": frozenset({"launching", "running", "cancelled", "failed"}),
    # launching: granted, the agent is starting the work; running once the process exists
    "launching": frozenset({"running", "completed", "cancelled", "failed", "pending", "preempting"}),
    # back to pending: requeue after preemption or node loss
    "running": frozenset({"completed", "cancelled", "failed", "pending", "preempting"}),
    # preempting: the checkpoint signal went out; the GPUs go back at the deadline, then the job is requeued
    "preempting": frozenset({"completed", "cancelled", "failed", "pending"}),
    "completed": frozenset(),
    "cancelled": frozenset(),
    "failed": frozenset(),
}


def can_transition(current: str, target: str) -> bool:
    return target in TRANSITIONS.get(current, frozenset())


def refuse_transition(job_id: str, current: str, target: str) -> Refusal:
    if current in TERMINAL:
        return Refusal(409, "JobAlreadyFinished", f"job {job_id} is already {current}",
                       {"job_id": job_id, "state": current})
    return Refusal(409, "InvalidJobState", f"job {job_id} is {current}; it cannot become {target}",
                   {"job_id": job_id, "state": current})



# --- admission back-pressure: a bounded backlog -------------------------------------------------------------------
def grant_rate(grant_times: Iterable[float], *, now: float, window_s: float) -> float:
    """Jobs granted per second over the last `window_s` seconds, from the (monotonic) times jobs left `pending`."""
    recent = sum(1 for t in grant_times if now - window_s < t <= now)
    return recent / window_s if window_s > 0 else 0.0


def retry_after_s(excess: int, grants_per_s: float, *, ceiling_s: int) -> int:
    """Whole seconds until `excess` more jobs have been granted at the recent rate, so that one more fits: at least
    1, at most `ceiling_s` (also the answer when nothing was granted lately: the queue may be stuck)."""
    if grants_per_s <= 0:
        return ceiling_s
    return max(1, min(ceiling_s, math.ceil(max(1, excess) / grants_per_s)))


def backlog_refusal(backlog: int, limit: int, grants_per_s: float, *, ceiling_s: int) -> Refusal | None:
    """A submission refused because `backlog` jobs already wait for placement and the limit is `limit` (0: no
    limit): 429 with how long to wait (`retry_after_s`, the gateway's `Retry-After`). None: it is admitted."""
    if limit <= 0 or backlog < limit:
        return None
    wait = retry_after_s(backlog - limit + 1, grants_per_s, ceiling_s=ceiling_s)
    rate = f"{grants_per_s:.1f} jobs/s granted lately" if grants_per_s > 0 else "no job granted lately"
    return Refusal(429, "QueueFull", f"{backlog} jobs are waiting for placement and the queue takes at most {limit}; "
                   f"retry in {wait} s ({rate})",
                   {"backlog": backlog, "max_backlog": limit, "grants_per_s": round(grants_per_s, 3),
                    "retry_after_s": wait})


# --- a release the user did not ask for: requeue, back off, or end the job -----------------------------------------
# Releases that never send a job back to the queue: the user finished it, or it was scaled down.
NOT_REQUEUED = frozenset({"JobCompleted", "JobCancelled", "ScaledDown"})
# Reclaims that end the job rather than requeue it: running it again would only hold the GPUs idle again, or it
# already lost its GPUs abnormally (node lost, GPU quarantined, drain) more often than reclamation allows.
ENDS_THE_JOB = frozenset({"IdleReclaimed", "MaxRuntimeExceeded", "RestartLimitReached"})
# Abnormal losses back off before the job is wanted again (a preemption or a scale-down does not).
BACKED_OFF = frozenset({"NodeLost", "GpuQuarantined", "Drained"})


def requeue_delay(attempts: int, base_s: float, max_s: float) -> float:
    """Exponential back-off after the job's `attempts` earlier requeues: base, 2×base, 4×base, ... up to max."""
    return min(max_s, base_s * 2 ** min(attempts, 20))


@dataclass(frozen=True)
class ReleaseOutcome:
    """What a release means for its job: "ignore", "fail" (state failed), or "requeue" (state pending; wanted
    again at once, or from `back_at` after an abnormal loss)."""

    action: str
    reason: str = ""
    message: str = ""
    back_at: datetime | None = None


def after_release(reason: str, *, state: str | None, ours: bool, replica_set: bool, attempts: int,
                  released_at: datetime, backoff_s: float, backoff_max_s: float) -> ReleaseOutcome:
    """A release of the job's current allocation (`ours`) that is not its work's own end: nothing for a finished,
    unknown or scaled job, or a replica of a service (placement places it again); the job fails for a reclaim
    that would only repeat (`ENDS_THE_JOB`); it backs off after an abnormal loss (`BACKED_OFF`, exponential in its
    `attempts`); otherwise it is wanted again at once."""
    if reason in NOT_REQUEUED or state is None or state in TERMINAL or not ours or replica_set:
        return ReleaseOutcome("ignore")
    if reason in ENDS_THE_JOB:
        return ReleaseOutcome("fail", reason, f"GPUs reclaimed: {reason}")
    if reason in BACKED_OFF:
        back = released_at + timedelta(seconds=requeue_delay(attempts, backoff_s, backoff_max_s))
        return ReleaseOutcome("requeue", f"Requeued:{reason}", f"requeued after {reason}; back in the queue at "
                                                                 f"{back.isoformat()} (attempt {attempts + 1})", back)
    return ReleaseOutcome("requeue", f"Requeued:{reason}", f"requeued after {reason}")


# --- the work a job runs: what each end of an attempt means --------------------------------------------------------
# Releases that follow the agent's report that an allocation's work ended (its cgroup is empty). `GangMemberFailed`:
# placement stopped the other members because one failed; their own exits are consequences, not the cause.
WORK_RELEASES = frozenset({"WorkCompleted", "WorkFailed", "GangMemberFailed"})
# Stops placement asks for because an attempt is already failing (a gang member died): the job is not being
# preempted, and stays as it is until the last member's exit decides it (complete, restart or fail).
STOPS_AFTER_FAILURE = frozenset({"GangMemberFailed"})


@dataclass(frozen=True)
class AttemptOutcome:
    """What the queue does when one allocation's work ended.

    action: `ignore` (the job is finished, preempting, or a replica of a service, which placement places again),
    `wait` (other members of the attempt still hold GPUs; `failure` is remembered for when the last one ends),
    `complete`, `fail` or `restart` (after `delay_s`, reason `Restarted:<why>`)."""

    action: Literal["ignore", "wait", "complete", "fail", "restart"]
    reason: str = ""
    exit_code: int | None = None
    message: str = ""
    delay_s: float = 0.0
    failure: dict[str, Any] | None = None


def failure_of(exit: WorkExit) -> dict[str, Any]:
    return {"reason": exit.reason, "exit_code": exit.exit_code, "signal": exit.signal, "message": exit.message}


def describe_failure(failure: dict[str, Any]) -> str:
    reason, code, sig = failure.get("reason"), failure.get("exit_code"), failure.get("signal")
    text = {"NonZeroExit": f"exited with code {code}", "OutOfMemory": "killed by the memory controller "
            "(out of memory)", "Signalled": f"killed by {sig}", "MaxRuntimeExceeded": "ran past max_runtime_s",
            "Lost": "the agent lost the work (no exit status)"}.get(str(reason), str(reason))
    detail = failure.get("message")
    return str(detail) if detail else text  # the agent's own words say more (signal, limit), when it gave them


def is_replica_set(replicas: int, max_replicas: int | None) -> bool:
    """A replica set (a service): each replica placed, replaced and scaled by itself. A job with more than one
    replica is one, and so is one whose bounds let it scale beyond one (`max_replicas` > 1), even at one replica."""
    return replicas > 1 or (max_replicas or 1) > 1


def after_work_ended(*, state: str, replica_set: bool, work: WorkSpec | None, restarts: int,
                     recorded: dict[str, Any] | None, release_reason: str, exit: WorkExit,
                     remaining: int) -> AttemptOutcome:
    """The job lifecycle rule for the end of one allocation's work (pure: the handler loads, calls and stores).

    - a finished or preempting job, or one replica of a replicated service: nothing (a preempted job's release
      carries the preemption's reason instead, and is requeued whatever its exit code: Slurm's GraceTime rule);
    - the first failure of an attempt is its cause (a member stopped because another failed is not);
    - while other members still hold GPUs the attempt is not over;
    - the last one: no failure → completed; a failure → restarted per the restart policy, else failed with the
      cause's exit code and reason."""
    if state in TERMINAL or state == "preempting" or replica_set:
        return AttemptOutcome("ignore")
    failure = recorded
    if failure is None and not exit.succeeded and release_reason != "GangMemberFailed":
        failure = failure_of(exit)
    if remaining > 0:
        return AttemptOutcome("wait", failure=failure)
    if failure is None:
        return AttemptOutcome("complete", reason="Completed", exit_code=0, message="the work exited 0")
    message = describe_failure(failure)
    restart = work.restart if work is not None else None
    if restart is not None and restart.policy == "on_failure" and restarts < restart.attempts:
        return AttemptOutcome("restart", reason=f"Restarted:{failure['reason']}", exit_code=failure["exit_code"],
                              message=f"{message}; restart {restarts + 1} of {restart.attempts} in "
                                      f"{restart.delay_s:g}s", delay_s=restart.delay_s, failure=failure)
    return AttemptOutcome("fail", reason=str(failure["reason"]), exit_code=failure["exit_code"], message=message,
                          failure=failure)


# --- autoscaling a service (pure: the handler loads the samples and the recommendations, and stores the result) ----
@dataclass(frozen=True)
class ScaleStep:
    """What one evaluation decided: `replicas` (the current count when nothing changes), the recommendations kept
    for the stabilisation windows ((at, replicas), oldest first), the load it saw, and why (None: no step)."""

    replicas: int
    recommendations: tuple[tuple[float, int], ...]
    load: float | None = None
    reason: str | None = None


def autoscale(policy: AutoscalePolicy, *, current: int, min_replicas: int, max_replicas: int,
              samples: Iterable[tuple[float, float]], recommendations: Iterable[tuple[float, int]],
              last_scaled_at: float | None, now: float) -> ScaleStep:
    """HPA's rule on a reported load: the raw recommendation is ceil(load / target) within the bounds; a scale-up
    goes to the lowest recommendation of the up window, a scale-down to the highest of the down window (so a dip
    shorter than the window never scales down), neither ever past the current count the other way, never sooner than `cooldown_s` after the last step. `samples`:
    (value, at) of each reporter's latest report; only those younger than `sample_ttl_s` count, and with none
    fresh nothing changes."""
    keep = max(policy.scale_up_stabilization_s, policy.scale_down_stabilization_s)
    recs = [(at, n) for at, n in recommendations if now - at <= keep]
    fresh = [value for value, at in samples if now - at <= policy.sample_ttl_s]
    if not fresh:
        return ScaleStep(current, tuple(recs))
    load = sum(fresh)
    raw = min(max_replicas, max(min_replicas, math.ceil(load / policy.target - 1e-9)))
    recs.append((now, raw))
    # the windows only slow a step down, never turn it round: a rising load whose up window still holds an older,
    # lower recommendation keeps the current count rather than scaling down (and a falling one never scales up)
    if raw > current:
        desired = max(current, min(n for at, n in recs if now - at <= policy.scale_up_stabilization_s))
    elif raw < current:
        desired = min(current, max(n for at, n in recs if now - at <= policy.scale_down_stabilization_s))
    else:
        desired = current
    desired = min(max_replicas, max(min_replicas, desired))
    cooling = last_scaled_at is not None and now - last_scaled_at < policy.cooldown_s
    if desired == current or cooling:
        return ScaleStep(current, tuple(recs), load)
    return ScaleStep(desired, tuple(recs), load,
                     f"{_signal_name(policy)} {load:g} at target {policy.target:g} per replica wants {raw} "
                     f"(stabilised: {desired}; was {current})")


def _signal_name(policy: AutoscalePolicy) -> str:
    if policy.signal == "gpu_utilization":
        return "GPU utilisation (% summed over replicas)"
    if policy.signal == "metric":
        return f"metric {policy.metric} (summed over replicas)"
    return "load"


def sampled_reporter(replica: int) -> str:
    """Whose sample an agent's `work_load` for replica `replica` is (one kept per replica)."""
    return f"agent-replica-{replica}"


def counted_sample(policy: AutoscalePolicy, reporter: str, replicas: int) -> bool:
    """Whether a kept sample counts toward the job's load: every push report for `load`; for a signal the agents
    sample, only the replicas the job has now (a replica scaled away leaves its last sample behind: not counted)."""
    if policy.signal == "load":
        return True
    prefix = sampled_reporter(0)[:-1]
    index = reporter[len(prefix):]
    return reporter.startswith(prefix) and index.isdigit() and int(index) < replicas


# --- updating a service's work ------------------------------------------------------------------------------------
def rollout_refusal(work: WorkSpec | None, *, replica_set: bool, gang_nodes: int) -> str | None:
    """Why a job's work cannot be rolled out replica by replica (None: it can). Readiness must be known to keep
    replicas serving, so the work needs ports (and ideally a health check)."""
    if work is None:
        return "the job runs no command: there is no work to update"
    if gang_nodes or not replica_set:
        return "only a replicated service is updated replica by replica; cancel and resubmit a single job or gang"
    if not work.ports:
        return "a rolling update needs the work's ports (its replicas' readiness decides each step)"
    return None


def updated_work(work: WorkSpec, *, command: list[str] | None, env: dict[str, str] | None) -> WorkSpec:
    """The work with a new command and/or env, checked as at submission (ValueError)."""
    fields = work.model_dump()
    if command is not None:
        fields["command"] = command
    if env is not None:
        fields["env"] = env
    return WorkSpec.model_validate(fields)
