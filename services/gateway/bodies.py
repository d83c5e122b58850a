"""What every request body is built on: strict JSON types and dates that carry a zone and lie in the calendar.

Strict: a JSON value is taken only as its own type. `"gpus": true` or `"gpus": "2"` is refused (422) rather than
read as 1 or 2, a boolean is `true` or `false` and nothing else. Nested models of a body (a job's limits and
restart policy) are strict in their own definition. Dates are the exception that JSON forces: they arrive as
strings, so an `Instant` field parses an RFC 3339 string, which must carry a zone (a naive time is ambiguous) and
lie between 2000 and 2200 (a year-1 price or a year-9999 loan is a typo, and arithmetic on it overflows).

A number with no fraction (`2.0`) is the integer it equals, as JSON Schema has it (`"type": "integer"` accepts
`2.0`, and JSON itself has one number type); `2.5` for an integer field is still refused.

Query parameters documented as `date-time` take only RFC 3339 text (`QueryInstant`): pydantic would otherwise read
`?to=0.5` as a Unix timestamp, which the document does not allow. They lie between 2000 and 2200 too; one without
a zone is read as UTC.
"""

from __future__ import annotations

import re
from datetime import UTC, datetime
from typing import Annotated, Any

from pydantic import (
    AfterValidator,
    AwareDatetime,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    model_validator,
)

from libs.contracts.commands import in_calendar


class RequestBody(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)

    @model_validator(mode="before")
    @classmethod
    def _whole_numbers(cls, data: Any) -> Any:
        return whole_numbers(data)


def whole_numbers(value: Any) -> Any:
    """`2.0` as `2`, all through a parsed JSON body (a strict float field still takes the int)."""
    if isinstance(value, float) and value.is_integer() and abs(value) <= 2**53:
        return int(value)
    if isinstance(value, dict):
        return {k: whole_numbers(v) for k, v in value.items()}
    if isinstance(value, list):
        return [whole_numbers(v) for v in value]
    return value


RFC3339_START = re.compile(r"^[0-9]{4}-[0-9]{2}-[0-9]{2}[Tt ][0-9]{2}:[0-9]{2}")


def _rfc3339_text(value: Any) -> Any:
    if isinstance(value, str) and not RFC3339_START.match(value):
        raise ValueError("must be an RFC 3339 date-time, e.g. 2026-01-01T00:00:00Z")
    return value


def _query_calendar(value: datetime) -> datetime:
    """A query's date in the calendar bodies accept; one without a zone is read as UTC (as reports always did)."""
    return in_calendar(value if value.tzinfo is not None else value.replace(tzinfo=UTC))


Instant = Annotated[AwareDatetime, Field(strict=False), AfterValidator(in_calendar)]
QueryInstant = Annotated[datetime, BeforeValidator(_rfc3339_text), AfterValidator(_query_calendar)]
