"""How long placement's loop lets events gather before a cycle (`domain.gather_wait`)."""

from __future__ import annotations

from services.placement.domain import gather_wait

FLOOR, CAP = 0.005, 0.05


def test_a_wake_that_finds_the_loop_idle_waits_only_the_floor_however_long_the_last_cycle_took() -> None:
    assert gather_wait(False, 0.120, FLOOR, CAP) == FLOOR  # a freed GPU at fleet size: its next job is not held up
    assert gather_wait(False, 0.0, FLOOR, CAP) == FLOOR


def test_changes_arriving_during_a_cycle_wait_as_long_as_it_took_within_the_floor_and_the_cap() -> None:
    assert gather_wait(True, 0.020, FLOOR, CAP) == 0.020
    assert gather_wait(True, 0.120, FLOOR, CAP) == CAP
    assert gather_wait(True, 0.001, FLOOR, CAP) == FLOOR
