"""Reclamation rules, pure: when an allocation is idle, when it must be warned, when it is taken back."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from libs.contracts.events import GpuTelemetry

Row = Mapping[str, Any]


def allocation_utilization(samples: Iterable[GpuTelemetry], gpu_uuids: Iterable[str]) -> tuple[float, float] | None:
    """(mean, max) utilization over the allocation's GPUs present in this sample, or None if none are."""
    wanted = set(gpu_uuids)
    values = [s.utilization_gpu_pct for s in samples if s.uuid in wanted]
    if not values:
        return None
    return sum(values) / len(values), max(values)


def is_busy(max_util_pct: float, threshold_pct: float) -> bool:
    return max_util_pct > threshold_pct


def observation(samples: Iterable[GpuTelemetry], gpu_uuids: Iterable[str],
                threshold_pct: float) -> tuple[float, float, bool] | None:
    """(mean, max, busy) of an allocation from one node sample, or None when the sample says nothing certain. An
    agent sampling by change leaves out GPUs that did not move (and sends them all at its heartbeat): a sample
    where a GPU present is busy proves the allocation busy, but one whose present GPUs are idle proves nothing
    while one of its GPUs is missing — that GPU may be busy and steady. Idleness is judged on whole samples."""
    samples = list(samples)
    util = allocation_utilization(samples, gpu_uuids)
    if util is None:
        return None
    mean, peak = util
    busy = is_busy(peak, threshold_pct)
    if not busy and not set(gpu_uuids) <= {s.uuid for s in samples}:
        return None
    return mean, peak, busy


@dataclass(frozen=True, slots=True)
class Verdict:
    action: str  # "warn" | "reclaim" | "clear" | "none"
    reason: str = ""
    message: str = ""
    deadline: datetime | None = None


def judge(tracker: Row, policy: Row | None, now: datetime) -> Verdict:
    """One tracker against its kind's policy. Max runtime wins over idleness; a warned allocation that became
    busy again is cleared."""
    if tracker["reclaim_reason"]:
        return Verdict("none")  # already decided; placement is releasing it
    if policy is None:
        return Verdict("none")
    if policy["enforce_max_runtime"] and tracker["max_runtime_s"]:
        ends = tracker["granted_at"] + timedelta(seconds=tracker["max_runtime_s"])
        if now >= ends:
            return Verdict("reclaim", "MaxRuntimeExceeded",
                           f"ran past its declared max runtime of {tracker['max_runtime_s']:g} s")
    idle_after = policy["idle_after_s"]
    if idle_after is None:
        return Verdict("clear") if tracker["warned_at"] else Verdict("none")
    if tracker["last_sample_at"] is None:
        return Verdict("none")  # no telemetry yet: never reclaim on missing data
    idle_s = (tracker["last_sample_at"] - tracker["last_busy_at"]).total_seconds()
    if idle_s < idle_after:
        return Verdict("clear") if tracker["warned_at"] else Verdict("none")
    if tracker["warned_at"] is None:
        deadline = now + timedelta(seconds=policy["grace_s"])
        return Verdict("warn", "IdleTimeout",
                       f"every GPU at or below {policy['idle_util_pct']:g}% for {idle_s:.0f} s; reclaimed at "
                       f"{deadline.isoformat()} unless it becomes busy", deadline)
    if now >= tracker["reclaim_deadline"]:
        return Verdict("reclaim", "IdleReclaimed", f"idle for {idle_s:.0f} s, warned at "
                                                   f"{tracker['warned_at'].isoformat()}")
    return Verdict("none")


# --- abnormal reclaims: the GPUs are gone or must not be used, whatever the workload is doing ------------------------
ABNORMAL = frozenset({"NodeLost", "GpuQuarantined", "Drained"})
RESTART_LIMIT = "RestartLimitReached"
# every reason reclamation takes an allocation back for (judge's verdicts and the abnormal causes)
RECLAIM_REASONS = ("MaxRuntimeExceeded", "IdleReclaimed", "NodeLost", "GpuQuarantined", "Drained", RESTART_LIMIT)


def abnormal_reason(cause: str, attempt: int, max_restarts: int) -> str:
    """The release reason for the `attempt`-th abnormal loss of a job's GPUs: the cause itself (the queue requeues
    the job), or RestartLimitReached once it has been restarted `max_restarts` times (the queue fails it)."""
    return cause if attempt <= max_restarts else RESTART_LIMIT


def abnormal_release(cause: str, message: str, attempt: int, max_restarts: int) -> tuple[str, str]:
    """The release reason and message for the `attempt`-th abnormal loss of a job's GPUs (`abnormal_reason`),
    the message saying so when the restart limit turns it into a failure."""
    reason = abnormal_reason(cause, attempt, max_restarts)
    if reason != cause:
        message = f"{message}; {cause} #{attempt}, more than the {max_restarts} restarts allowed"
    return reason, message


def busy_threshold(policy: Row | None, default_pct: float) -> float:
    """The utilisation above which an allocation of a kind counts as busy: its policy's idle threshold, else the
    service's default."""
    return policy["idle_util_pct"] if policy else default_pct


def quarantines(state: str | None, current: str) -> bool:
    """Whether a GPU health change takes the GPU out of use (the health state when the event carries it, else
    the older `current` field's failed)."""
    return state == "quarantined" if state is not None else current == "failed"
