"""When inventory declares a node lost (`lost_cutoff`): by the clock, except when the whole fleet fell silent at once."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from services.inventory.domain import LOST_PATIENCE, lost_cutoff

NOW = datetime(2026, 12, 3, 12, tzinfo=UTC)
AFTER = 30.0


def s(seconds: float) -> timedelta:
    return timedelta(seconds=seconds)


def test_while_any_node_reports_a_silent_one_is_judged_by_the_clock() -> None:
    assert lost_cutoff(NOW, AFTER) == NOW - s(AFTER)
    assert lost_cutoff(NOW, AFTER, newest_report=NOW - s(1), ready_nodes=1024) == NOW - s(AFTER)
    assert lost_cutoff(NOW, AFTER, newest_report=NOW - s(AFTER), ready_nodes=1024) == NOW - s(AFTER)


def test_a_whole_fleet_silent_together_is_judged_against_its_newest_report() -> None:
    """45 s without any report: a node silent 45 s is not lost, one silent 30 s longer than the newest report is."""
    cutoff = lost_cutoff(NOW, AFTER, newest_report=NOW - s(45), ready_nodes=1024)
    assert cutoff == NOW - s(75)
    assert not NOW - s(45) < cutoff and NOW - s(76) < cutoff


def test_the_patience_ends_after_a_few_thresholds_and_a_lone_node_is_never_given_any() -> None:
    gone_quiet = NOW - s(10 * AFTER)  # the bus is down, or the whole fleet is: after LOST_PATIENCE thresholds, lost
    assert lost_cutoff(NOW, AFTER, newest_report=gone_quiet, ready_nodes=8) == NOW - s(LOST_PATIENCE * AFTER)
    assert lost_cutoff(NOW, AFTER, newest_report=NOW - s(45), ready_nodes=1) == NOW - s(AFTER)
    assert lost_cutoff(NOW, AFTER, newest_report=None, ready_nodes=0) == NOW - s(AFTER)
