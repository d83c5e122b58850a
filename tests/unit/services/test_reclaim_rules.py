"""Reclamation's pure rules: when an allocation is warned, reclaimed, or left alone."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from libs.contracts.events import GpuTelemetry
from services.reclamation.domain import judge, observation

NOW = datetime(2026, 11, 30, 12, 0, tzinfo=UTC)
DEV = {"kind": "dev", "idle_after_s": 600.0, "idle_util_pct": 5.0, "grace_s": 120.0, "enforce_max_runtime": True}


def tracker(**over):  # type: ignore[no-untyped-def]
    base = {"reclaim_reason": None, "max_runtime_s": None, "granted_at": NOW - timedelta(hours=1),
            "last_sample_at": NOW, "last_busy_at": NOW, "warned_at": None, "reclaim_deadline": None}
    return {**base, **over}


def test_a_busy_allocation_is_left_alone() -> None:
    assert judge(tracker(), DEV, NOW).action == "none"


def test_an_allocation_idle_past_the_window_is_warned_with_a_deadline_after_the_grace_period() -> None:
    verdict = judge(tracker(last_busy_at=NOW - timedelta(seconds=601)), DEV, NOW)
    assert (verdict.action, verdict.reason) == ("warn", "IdleTimeout")
    assert verdict.deadline == NOW + timedelta(seconds=120)


def test_a_warned_allocation_is_reclaimed_only_once_its_deadline_has_passed() -> None:
    warned = tracker(last_busy_at=NOW - timedelta(seconds=900), warned_at=NOW - timedelta(seconds=100),
                     reclaim_deadline=NOW + timedelta(seconds=20))
    assert judge(warned, DEV, NOW).action == "none"
    verdict = judge(warned, DEV, NOW + timedelta(seconds=21))
    assert (verdict.action, verdict.reason) == ("reclaim", "IdleReclaimed")


def test_a_warned_allocation_that_became_busy_again_is_cleared() -> None:
    verdict = judge(tracker(warned_at=NOW - timedelta(seconds=10), reclaim_deadline=NOW + timedelta(seconds=60)),
                    DEV, NOW)
    assert verdict.action == "clear"


def test_max_runtime_wins_over_idleness_and_is_reclaimed_without_a_warning() -> None:
    over = tracker(max_runtime_s=1800.0, granted_at=NOW - timedelta(seconds=1801),
                   last_busy_at=NOW - timedelta(seconds=700))
    verdict = judge(over, DEV, NOW)
    assert (verdict.action, verdict.reason) == ("reclaim", "MaxRuntimeExceeded")


def test_nothing_is_reclaimed_without_telemetry_or_without_an_idle_policy() -> None:
    assert judge(tracker(last_sample_at=None, last_busy_at=NOW - timedelta(days=1)), DEV, NOW).action == "none"
    never = {**DEV, "idle_after_s": None}
    assert judge(tracker(last_busy_at=NOW - timedelta(days=1)), never, NOW).action == "none"


def test_an_allocation_already_being_reclaimed_is_not_judged_again() -> None:
    assert judge(tracker(reclaim_reason="NodeLost", last_busy_at=NOW - timedelta(days=1)), DEV, NOW).action == "none"


def test_abnormal_reclaims_requeue_until_the_restart_limit_then_fail() -> None:
    from services.reclamation.domain import abnormal_reason

    assert [abnormal_reason("GpuQuarantined", n, max_restarts=2) for n in (1, 2, 3, 4)] == [
        "GpuQuarantined", "GpuQuarantined", "RestartLimitReached", "RestartLimitReached"]
    assert abnormal_reason("NodeLost", 1, max_restarts=0) == "RestartLimitReached"


def test_abnormal_release_thresholds_and_quarantine_are_rules_of_the_domain() -> None:
    from services.reclamation.domain import abnormal_release, busy_threshold, quarantines

    assert abnormal_release("NodeLost", "node n1 went silent", 2, 3) == ("NodeLost", "node n1 went silent")
    assert abnormal_release("Drained", "node n1 drained", 4, 3) == (
        "RestartLimitReached", "node n1 drained; Drained #4, more than the 3 restarts allowed")
    assert busy_threshold({"idle_util_pct": 5.0}, 10.0) == 5.0 and busy_threshold(None, 10.0) == 10.0
    assert quarantines("quarantined", "healthy") and not quarantines("probation", "failed")
    assert quarantines(None, "failed") and not quarantines(None, "degraded")


def _gpu(uuid: str, util: float) -> GpuTelemetry:
    return GpuTelemetry(uuid=uuid, index=0, utilization_gpu_pct=util, utilization_memory_pct=0.0, memory_used_mib=0,
                        memory_total_mib=81559)


def test_a_sample_missing_an_allocations_gpu_proves_it_busy_but_never_idle() -> None:
    """Agents sampling by change leave steady GPUs out between heartbeats: idleness is judged on whole samples."""
    whole = [_gpu("a", 2.0), _gpu("b", 60.0), _gpu("other", 0.0)]
    assert observation(whole, ["a", "b"], 10.0) == (31.0, 60.0, True)
    assert observation([_gpu("a", 2.0), _gpu("b", 4.0)], ["a", "b"], 10.0) == (3.0, 4.0, False)
    assert observation([_gpu("b", 60.0)], ["a", "b"], 10.0) == (60.0, 60.0, True)  # b alone proves it busy
    assert observation([_gpu("a", 2.0)], ["a", "b"], 10.0) is None  # b left out: it may be busy and steady
    assert observation([_gpu("other", 90.0)], ["a", "b"], 10.0) is None
