"""Report queries and cost-rate commands, answered by the accounting service over request/reply.

Kept beside commands.py rather than inside it: reports are read-only views over accounting's ledger, and their
vocabulary (dimensions, time ranges, buckets) is shared by the gateway, the client and accounting alone.
"""

from __future__ import annotations

from datetime import datetime, timedelta
from decimal import Decimal
from typing import Annotated, Literal

from pydantic import Field, model_validator

from libs.contracts.commands import Command, in_calendar
from libs.contracts.names import NAME_PATTERN

# What GPU-seconds can be grouped and filtered by. `user` is who submitted the job; `sharing` is whole, fraction
# or mig; `mig_profile` is empty for whole GPUs and fractions.
DIMENSIONS: tuple[str, ...] = ("team", "project", "user", "kind", "gpu_model", "sharing", "mig_profile")
Dimension = Literal["team", "project", "user", "kind", "gpu_model", "sharing", "mig_profile"]
SHARING = ("whole", "fraction", "mig")
MAX_REPORT_DAYS = 400
MAX_FILTER_VALUES = 50
MAX_CAPACITY_BUCKETS = 1000
GPU_MODEL_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$"
MIG_PROFILE_PATTERN = r"^(|[1-7]g\.[0-9]{1,3}gb(\+me)?)$"
FilterValue = Annotated[str, Field(min_length=1, max_length=256)]


class ReportRange(Command):
    """A half-open time range [start, end), both with a time zone, at most MAX_REPORT_DAYS long."""

    start: datetime
    end: datetime

    @model_validator(mode="after")
    def _sane_range(self) -> ReportRange:
        if self.start.tzinfo is None or self.end.tzinfo is None:
            raise ValueError("start and end need a time zone (e.g. 2026-01-01T00:00:00Z)")
        if self.end <= self.start:
            raise ValueError("end must be after start")
        if self.end - self.start > timedelta(days=MAX_REPORT_DAYS):
            raise ValueError(f"a report covers at most {MAX_REPORT_DAYS} days")
        return self


class Filtered(ReportRange):
    filters: dict[Dimension, Annotated[list[FilterValue], Field(min_length=1, max_length=MAX_FILTER_VALUES)]] = Field(
        default_factory=dict, description="only rows whose dimension is one of these values")


class UsageReportQuery(Filtered):
    group_by: list[Dimension] = Field(default_factory=lambda: ["team"], max_length=len(DIMENSIONS))
    limit: int = Field(default=1000, ge=1, le=10_000, description="at most this many groups, largest first")

    @model_validator(mode="after")
    def _unique_groups(self) -> UsageReportQuery:
        if len(set(self.group_by)) != len(self.group_by):
            raise ValueError("group_by names a dimension twice")
        return self


class EfficiencyReportQuery(UsageReportQuery):
    pass


class WasteReportQuery(Filtered):
    min_idle_fraction: float = Field(default=0.5, ge=0, le=1,
                                     description="list allocations idle at least this fraction of measured time")
    limit: int = Field(default=100, ge=1, le=1000)


class CapacityReportQuery(ReportRange):
    bucket_s: int = Field(default=86_400, ge=1, le=31 * 86_400,
                          description="trend bucket length, seconds (the forecast fits one point per bucket)")
    gpu_model: str | None = Field(default=None, max_length=64)
    team: str | None = Field(default=None, max_length=63, description="only this team's demand (supply is shared)")

    @model_validator(mode="after")
    def _bounded_buckets(self) -> CapacityReportQuery:
        if (self.end - self.start).total_seconds() / self.bucket_s > MAX_CAPACITY_BUCKETS:
            raise ValueError(f"at most {MAX_CAPACITY_BUCKETS} trend buckets: use a longer bucket")
        return self


class HistoryQuery(ReportRange):
    """Recorded jobs that entered the queue in [start, end), a page at a time in job id order (`after`: the last
    job id of the previous page), optionally only some teams'."""

    teams: list[FilterValue] | None = Field(default=None, max_length=MAX_FILTER_VALUES)
    after: str | None = Field(default=None, max_length=128)
    limit: int = Field(default=500, ge=1, le=1000)


MAX_UTILIZATION_POINTS = 1000
MIN_UTILIZATION_STEP_S = 60  # inventory's rollups are one minute: a shorter bucket would hold no more detail


class UtilizationQuery(ReportRange):
    """The utilization history of one job's GPUs, or of every GPU one team held, over [start, end) in buckets of
    `step_s` (from inventory's one-minute rollups; each minute counts in the bucket it starts in)."""

    job_id: str | None = Field(default=None, min_length=1, max_length=64)
    team: str | None = Field(default=None, pattern=NAME_PATTERN)
    step_s: int = Field(default=60, ge=MIN_UTILIZATION_STEP_S, le=86_400)

    @model_validator(mode="after")
    def _one_subject_few_points(self) -> UtilizationQuery:
        if (self.job_id is None) == (self.team is None):
            raise ValueError("name exactly one of job_id and team")
        if (self.end - self.start).total_seconds() / self.step_s > MAX_UTILIZATION_POINTS:
            raise ValueError(f"at most {MAX_UTILIZATION_POINTS} buckets: use a longer step")
        return self


class SetCostRate(Command):
    """Set (or with `delete`, withdraw) the price in force from `effective_from`: per GPU-hour of `gpu_model`, or,
    with `mig_profile`, per instance-hour of that MIG profile on that model."""

    gpu_model: str = Field(pattern=GPU_MODEL_PATTERN)
    mig_profile: str = Field(default="", max_length=32, pattern=MIG_PROFILE_PATTERN)
    effective_from: datetime
    price_per_hour: Decimal | None = Field(default=None, ge=0, le=1_000_000, max_digits=18, decimal_places=6)
    delete: bool = False
    set_by: str = Field(default="anonymous", max_length=256)

    @model_validator(mode="after")
    def _price_unless_delete(self) -> SetCostRate:
        if self.effective_from.tzinfo is None:
            raise ValueError("effective_from needs a time zone")
        if not self.delete:  # a price out of the calendar may still be withdrawn
            in_calendar(self.effective_from)
        if not self.delete and self.price_per_hour is None:
            raise ValueError("price_per_hour is required")
        return self


class ListCostRates(Command):
    gpu_model: str | None = Field(default=None, max_length=64)
