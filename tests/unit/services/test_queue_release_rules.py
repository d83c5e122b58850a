"""What a release the user did not ask for means for its job (`services.queue.domain.after_release`, pure): nothing
for a finished or scaled job, another allocation's release or a service's replica; the job fails for a reclaim that
would only repeat; it backs off exponentially after an abnormal loss; otherwise it is wanted again at once."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from services.queue.domain import after_release

AT = datetime(2026, 12, 2, 12, 0, tzinfo=UTC)


def release(reason: str, **over):  # type: ignore[no-untyped-def]
    args = {"state": "running", "ours": True, "replica_set": False, "attempts": 0, "released_at": AT,
            "backoff_s": 10.0, "backoff_max_s": 300.0, **over}
    return after_release(reason, **args)


@pytest.mark.parametrize("over", [{"state": None}, {"state": "completed"}, {"ours": False}, {"replica_set": True}])
def test_nothing_happens_to_a_job_the_release_is_not_about(over) -> None:  # type: ignore[no-untyped-def]
    assert release("PreemptedByPriority", **over).action == "ignore"


@pytest.mark.parametrize("reason", ["JobCompleted", "JobCancelled", "ScaledDown"])
def test_releases_the_user_asked_for_never_requeue(reason: str) -> None:
    assert release(reason).action == "ignore"


@pytest.mark.parametrize("reason", ["IdleReclaimed", "MaxRuntimeExceeded", "RestartLimitReached"])
def test_a_reclaim_that_would_only_repeat_ends_the_job(reason: str) -> None:
    out = release(reason)
    assert (out.action, out.reason, out.message) == ("fail", reason, f"GPUs reclaimed: {reason}")


def test_an_abnormal_loss_backs_off_exponentially_up_to_the_maximum() -> None:
    first = release("NodeLost")
    assert (first.action, first.reason, first.back_at) == ("requeue", "Requeued:NodeLost", AT + timedelta(seconds=10))
    assert "attempt 1" in first.message and (AT + timedelta(seconds=10)).isoformat() in first.message
    assert release("Drained", attempts=3).back_at == AT + timedelta(seconds=80)
    assert release("GpuQuarantined", attempts=30).back_at == AT + timedelta(seconds=300)


def test_a_preemption_is_requeued_at_once() -> None:
    out = release("PreemptedByPriority")
    assert (out.action, out.reason, out.back_at) == ("requeue", "Requeued:PreemptedByPriority", None)
