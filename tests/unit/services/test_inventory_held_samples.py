"""How many samples an agent sampling by change left out between two of a GPU's samples, and in which minute each
falls (services/inventory/domain.py `held_samples`): the rollups count them with the previous values."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from services.inventory.domain import held_samples

MINUTE = datetime(2026, 1, 1, 12, 0, tzinfo=UTC)


def at(s: float) -> datetime:
    return MINUTE + timedelta(seconds=s)


@pytest.mark.parametrize(("previous", "now", "expected"), [
    (10, 11, (0, 0)),  # the next interval: nothing left out
    (10, 15, (0, 4)),  # a heartbeat later, same minute: :11-:14
    (10.3, 15.28, (0, 4)),  # clock jitter rounds to whole intervals
    (57, 62, (2, 2)),  # :58, :59 in the previous minute, :60, :61 in this one
    (59, 62, (0, 2)),
    (55, 60, (4, 0)),  # this sample opens the minute: all four before it
    (10, 40, (0, 4)),  # silent past the heartbeat: only a heartbeat's worth is unchanged
    (50, 75, (4, 0)),  # ... and those four are right after the previous sample
])
def test_left_out_samples_split_at_the_minute(previous: float, now: float, expected: tuple[int, int]) -> None:
    assert held_samples(at(previous), at(now), 1.0, 5.0) == expected


def test_nothing_is_held_without_a_previous_sample_an_interval_or_time_moving_forward() -> None:
    assert held_samples(None, at(5), 1.0, 5.0) == (0, 0)
    assert held_samples(at(1), at(5), None, None) == (0, 0)  # an agent that sends every sample
    assert held_samples(at(5), at(5), 1.0, 5.0) == (0, 0)
    assert held_samples(at(6), at(5), 1.0, 5.0) == (0, 0)


def test_a_longer_interval_counts_in_its_own_steps() -> None:
    assert held_samples(at(0), at(10), 2.0, 10.0) == (0, 4)  # :02 :04 :06 :08
    assert held_samples(at(0), at(10), 1.0, None) == (0, 9)  # no heartbeat given: the whole gap
