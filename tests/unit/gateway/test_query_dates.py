"""Query parameters typed `date-time` (`QueryInstant`): RFC 3339 text only, in the calendar bodies accept (2000 to
2200), a time without a zone read as UTC. Before, `?to=9999-01-01T00:00:00Z` was taken in a query while a body
refused it."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest
from pydantic import TypeAdapter, ValidationError

from services.gateway.bodies import QueryInstant

ADAPTER = TypeAdapter(QueryInstant)


def test_a_query_date_is_rfc_3339_text_in_the_calendar() -> None:
    assert ADAPTER.validate_python("2026-03-01T12:00:00Z") == datetime(2026, 3, 1, 12, tzinfo=UTC)
    assert ADAPTER.validate_python("2026-03-01T12:00:00") == datetime(2026, 3, 1, 12, tzinfo=UTC)  # naive: UTC
    assert ADAPTER.validate_python("2026-03-01T14:00:00+02:00") == datetime(2026, 3, 1, 12, tzinfo=UTC)


@pytest.mark.parametrize("text", ["9999-01-01T00:00:00Z", "0001-01-01T00:00:00Z", "1999-12-31T23:59:59Z",
                                  "2200-01-01T00:00:00Z", "0.5", "yesterday"])
def test_a_query_date_outside_the_calendar_or_not_rfc_3339_is_refused(text: str) -> None:
    with pytest.raises(ValidationError):
        ADAPTER.validate_python(text)
