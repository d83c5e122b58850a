"""Inventory's pure rules: what a telemetry sample says about a GPU, and how the health state machine moves
(healthy → suspect → quarantined → probation → healthy), including an operator's clear and quarantine."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from libs.contracts.events import GpuTelemetry
from services.inventory.domain import (
    CLEAN,
    HEALTHY,
    LEGACY_HEALTH,
    PROBATION,
    QUARANTINED,
    SUSPECT,
    GpuHealth,
    HealthRules,
    HealthStep,
    Signal,
    assess,
    moves,
    operator_step,
    step,
)

T0 = datetime(2026, 11, 30, 12, 0, tzinfo=UTC)
RULES = HealthRules(sbe_burst=10, suspect_strikes=3, strike_gap_s=10, suspect_clear_s=300, recheck_after_s=900,
                    probation_s=600)
WARN = Signal("warn", "NonFatalXid", ("xid13",))
FATAL = Signal("fatal", "FatalXid", ("xid79",))


def at(seconds: float) -> datetime:
    return T0 + timedelta(seconds=seconds)


def sample(**over) -> GpuTelemetry:  # type: ignore[no-untyped-def]
    base = dict(uuid="GPU-1", index=0, utilization_gpu_pct=50.0, utilization_memory_pct=10.0, memory_used_mib=1000,
                memory_total_mib=81559)
    return GpuTelemetry(**{**base, **over})


# --- assess -------------------------------------------------------------------------------------------------------
def test_a_clean_sample_says_nothing() -> None:
    assert assess(sample(), prev_sbe=0, prev_dbe=0, rules=RULES) == CLEAN


@pytest.mark.parametrize("xid", [48, 79, 94, 95])
def test_fatal_xids_are_fatal(xid: int) -> None:
    signal = assess(sample(xid_events=[xid]), 0, 0, RULES)
    assert (signal.level, signal.reason, signal.details) == ("fatal", "FatalXid", (f"xid{xid}",))


def test_a_non_fatal_xid_is_a_warning() -> None:
    signal = assess(sample(xid_events=[13]), 0, 0, RULES)
    assert (signal.level, signal.reason) == ("warn", "NonFatalXid")


def test_a_new_uncorrectable_ecc_error_is_fatal_even_without_an_xid() -> None:
    signal = assess(sample(ecc_volatile_dbe=2), prev_sbe=0, prev_dbe=1, rules=RULES)
    assert (signal.level, signal.reason) == ("fatal", "UncorrectableEcc")
    assert assess(sample(ecc_volatile_dbe=1), prev_sbe=0, prev_dbe=1, rules=RULES) == CLEAN


def test_a_correctable_ecc_burst_between_two_samples_is_a_warning_a_trickle_is_not() -> None:
    assert assess(sample(ecc_volatile_sbe=110), prev_sbe=100, prev_dbe=0, rules=RULES).reason == "EccBurst"
    assert assess(sample(ecc_volatile_sbe=109), prev_sbe=100, prev_dbe=0, rules=RULES) == CLEAN
    assert assess(sample(ecc_volatile_sbe=500), prev_sbe=None, prev_dbe=None, rules=RULES) == CLEAN  # no baseline


def test_a_gpu_off_the_bus_stays_fatal_for_as_long_as_the_agent_reports_it() -> None:
    reported = sample(health="failed", health_reasons=["gpu_lost", "xid79:gpu_fallen_off_the_bus"])
    signal = assess(reported, 0, 0, RULES)
    assert (signal.level, signal.reason) == ("fatal", "GpuLost")
    assert "xid79:gpu_fallen_off_the_bus" in signal.details
    # the sample that first reports it carries Xid 79 as well: the reason named is still the specific one
    first = assess(reported.model_copy(update={"xid_events": [79]}), 0, 0, RULES)
    assert (first.reason, first.details[0]) == ("GpuLost", "xid79")
    dbe = assess(sample(xid_events=[48], ecc_volatile_dbe=1), 0, 0, RULES)
    assert dbe.reason == "UncorrectableEcc"


def test_latched_non_fatal_xid_reasons_do_not_count_again_but_an_ongoing_ecc_storm_does() -> None:
    latched = sample(health="degraded", health_reasons=["xid92:high_single_bit_ecc_rate"])
    assert assess(latched, 0, 0, RULES) == CLEAN
    storm = sample(health="degraded", health_reasons=["sbe_storm:42/min"], ecc_volatile_sbe=101)
    signal = assess(storm, prev_sbe=100, prev_dbe=0, rules=RULES)
    assert (signal.level, signal.reason, signal.details) == ("warn", "EccStorm", ("sbe_storm:42/min",))


def test_after_a_single_burst_the_agents_smoothed_storm_rate_alone_is_no_warning() -> None:
    """The agent's per-minute rate stays high for a minute after one burst; no new errors, no new warning."""
    burst = sample(health="degraded", health_reasons=["sbe_storm:40/min"], ecc_volatile_sbe=140)
    assert assess(burst, prev_sbe=100, prev_dbe=0, rules=RULES).reason == "EccBurst"  # the burst itself
    after_burst = sample(health="degraded", health_reasons=["sbe_storm:40/min"], ecc_volatile_sbe=140)
    assert assess(after_burst, prev_sbe=140, prev_dbe=0, rules=RULES) == CLEAN


def test_thermal_throttling_is_not_a_fault() -> None:
    hot = sample(health="degraded", health_reasons=["throttle:hw_thermal_slowdown", "temperature_at_slowdown:90C>=87C"])
    assert assess(hot, 0, 0, RULES) == CLEAN


def test_fatal_wins_over_warning_in_the_same_sample() -> None:
    assert assess(sample(xid_events=[13, 79]), 0, 0, RULES).level == "fatal"


# --- the state machine --------------------------------------------------------------------------------------------
def test_a_warning_makes_a_healthy_gpu_suspect_and_quiet_makes_it_healthy_again() -> None:
    s = step(GpuHealth(), WARN, at(0), RULES)
    assert s.changed and (s.health.state, s.health.reason, s.health.strikes) == (SUSPECT, "NonFatalXid", 1)
    assert not step(s.health, CLEAN, at(299), RULES).changed
    back = step(s.health, CLEAN, at(300), RULES)
    assert back.changed and (back.health.state, back.health.reason) == (HEALTHY, "SuspectCleared")


def test_a_fatal_signal_quarantines_at_once() -> None:
    s = step(GpuHealth(), FATAL, at(0), RULES)
    assert s.changed and (s.health.state, s.health.reason, s.health.details) == (QUARANTINED, "FatalXid", ("xid79",))
    assert LEGACY_HEALTH[s.health.state] == "failed"


def test_repeated_warnings_quarantine_a_suspect_gpu_but_one_storm_counts_once_per_gap() -> None:
    h = step(GpuHealth(), WARN, at(0), RULES).health
    for t in (1, 2, 5, 9.9):  # a burst of samples inside one gap: still one strike
        s = step(h, WARN, at(t), RULES)
        assert not s.changed and s.dirty
        h = s.health
    assert h.strikes == 1 and h.last_signal_at == at(9.9)
    h = step(h, WARN, at(10), RULES).health
    assert (h.state, h.strikes) == (SUSPECT, 2)
    s = step(h, WARN, at(20), RULES)
    assert s.changed and (s.health.state, s.health.reason) == (QUARANTINED, "RepeatedSuspect")


def test_a_quarantined_gpu_enters_probation_after_a_clean_recheck_window_then_becomes_healthy() -> None:
    h = step(GpuHealth(), FATAL, at(0), RULES).health
    h = step(h, FATAL, at(100), RULES).health  # still failing: the window starts again
    assert h.state == QUARANTINED and h.last_signal_at == at(100)
    assert not step(h, CLEAN, at(999), RULES).changed
    s = step(h, CLEAN, at(1000), RULES)
    assert s.changed and (s.health.state, s.health.reason) == (PROBATION, "RecheckPassed")
    assert LEGACY_HEALTH[PROBATION] == "degraded"  # no new work during probation
    h = s.health
    assert not step(h, CLEAN, at(1599), RULES).changed
    done = step(h, CLEAN, at(1600), RULES)
    assert done.changed and (done.health.state, done.health.reason) == (HEALTHY, "ProbationPassed")


def test_any_warning_during_probation_sends_it_back_to_quarantine() -> None:
    h = GpuHealth(state=PROBATION, since=at(0), reason="RecheckPassed")
    s = step(h, WARN, at(30), RULES)
    assert s.changed and (s.health.state, s.health.reason) == (QUARANTINED, "FailedProbation")
    assert s.health.details[0] == "NonFatalXid"


def test_without_a_timed_recheck_only_an_operator_releases_a_quarantined_gpu() -> None:
    rules = HealthRules(recheck_after_s=None)
    h = step(GpuHealth(), FATAL, at(0), rules).health
    assert not step(h, CLEAN, at(10**6), rules).changed
    s = operator_step(h, "clear", at(10**6))
    assert s.changed and (s.health.state, s.health.reason) == (PROBATION, "ClearedByOperator")


def test_an_operator_quarantine_is_never_lifted_by_the_timed_recheck() -> None:
    s = operator_step(GpuHealth(), "quarantine", at(0))
    assert s.changed and (s.health.state, s.health.reason) == (QUARANTINED, "QuarantinedByOperator")
    assert not step(s.health, CLEAN, at(10**6), RULES).changed
    assert not operator_step(s.health, "quarantine", at(1)).changed  # already quarantined: nothing to do


def test_an_operator_clear_of_a_suspect_gpu_makes_it_healthy_and_of_a_healthy_one_does_nothing() -> None:
    h = step(GpuHealth(), WARN, at(0), RULES).health
    s = operator_step(h, "clear", at(1))
    assert s.changed and s.health.state == HEALTHY
    assert not operator_step(GpuHealth(), "clear", at(1)).changed


def test_signals_while_quarantined_only_move_the_recheck_window() -> None:
    h = step(GpuHealth(), FATAL, at(0), RULES).health
    s = step(h, WARN, at(5), RULES)
    assert not s.changed and s.dirty and s.health.state == QUARANTINED and s.health.last_signal_at == at(5)


def test_a_clean_sample_moves_only_gpus_that_are_not_healthy() -> None:
    """The telemetry path skips `step` when `moves` says so: that must never skip a real move."""
    clean = assess(sample(ecc_volatile_sbe=5, ecc_volatile_dbe=1), 0, 1, RULES)
    assert clean is CLEAN
    assert not moves(HEALTHY, clean)
    for h in (GpuHealth(), GpuHealth(since=at(0), last_signal_at=at(-5000), strikes=0, last_strike_at=at(-9000))):
        assert step(h, clean, at(10_000), RULES) == HealthStep(h, False, False)
    assert all(moves(state, clean) for state in (SUSPECT, QUARANTINED, PROBATION))
    assert moves(HEALTHY, WARN) and moves(HEALTHY, FATAL)


@pytest.mark.parametrize("over, prev_sbe, prev_dbe", [
    ({"xid_events": [13]}, 0, 0), ({"ecc_volatile_dbe": 2}, 0, 1), ({"ecc_volatile_dbe": 1}, None, None),
    ({"ecc_volatile_sbe": 10}, 0, 0), ({"health_reasons": ["gpu_lost"]}, 0, 0),
])
def test_the_quick_clean_check_never_hides_a_signal(over, prev_sbe, prev_dbe) -> None:  # type: ignore[no-untyped-def]
    assert assess(sample(**over), prev_sbe, prev_dbe, RULES) is not CLEAN
