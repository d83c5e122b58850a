"""What every request body is built on: strict JSON types and dates that carry a zone and lie in the calendar.

Strict: a JSON value is taken only as its own type. `"gpus": true` or `"gpus": "2"` is refused (422) rather than
read as 1 or 2, a boolean is `true` or `false` and nothing else. Nested models of a body (a job's limits and
restart policy) are strict in their own definition. Dates are the exception that JSON forces: they arrive as
strings, so an `Instant` field parses an RFC 3339 string, which must carry a zone (a naive time is ambiguous) and
lie between 2000 and 2200 (a year-1 price or a year-9999 loan is a typo, and arithmetic on it overflows).
"""

from __future__ import annotations

from typing import Annotated

from pydantic import AfterValidator, AwareDatetime, BaseModel, ConfigDict, Field

from libs.contracts.commands import in_calendar


class RequestBody(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)


Instant = Annotated[AwareDatetime, Field(strict=False), AfterValidator(in_calendar)]
