"""Retention settings every service inherits (libs/runtime/settings.py): defaults, and the inbox floor that keeps a
late JetStream redelivery from applying twice, enforced when a service's settings are read from its environment."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from libs.contracts.subjects import EVENTS_STREAM
from libs.runtime.settings import INBOX_RETENTION_FLOOR_S, ServiceSettings
from services.queue.config import QueueSettings

DAY = 24 * 3600.0


def test_defaults_keep_a_week_of_outbox_and_the_stream_age_of_inbox() -> None:
    s = ServiceSettings()
    assert s.outbox_retention_s == 7 * DAY
    assert s.inbox_retention_s == INBOX_RETENTION_FLOOR_S
    assert s.retention_interval_s == 300
    assert INBOX_RETENTION_FLOOR_S >= EVENTS_STREAM.max_age_s == 30 * DAY


def test_inbox_shorter_than_the_events_stream_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GPUPOOL_QUEUE_INBOX_RETENTION_S", str(EVENTS_STREAM.max_age_s - 1))
    with pytest.raises(ValidationError, match="INBOX_RETENTION_S=2591999 s is shorter than the 2592000 s"):
        QueueSettings()


def test_inbox_at_or_above_the_floor_and_any_positive_outbox_retention_are_accepted(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GPUPOOL_QUEUE_INBOX_RETENTION_S", str(EVENTS_STREAM.max_age_s))
    monkeypatch.setenv("GPUPOOL_QUEUE_OUTBOX_RETENTION_S", "3600")
    monkeypatch.setenv("GPUPOOL_QUEUE_RETENTION_INTERVAL_S", "60")
    s = QueueSettings()
    assert (s.inbox_retention_s, s.outbox_retention_s, s.retention_interval_s) == (30 * DAY, 3600, 60)
    assert ServiceSettings(inbox_retention_s=90 * DAY).inbox_retention_s == 90 * DAY


@pytest.mark.parametrize("field", ["outbox_retention_s", "inbox_retention_s", "retention_interval_s"])
def test_zero_or_negative_is_refused(field: str) -> None:
    with pytest.raises(ValidationError):
        ServiceSettings(**{field: 0})
