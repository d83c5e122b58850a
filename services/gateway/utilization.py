"""Utilization history: `GET /v1/jobs/{job_id}/utilization` and `GET /v1/teams/{team}/utilization`.

Accounting keeps inventory's one-minute rollups of every GPU beside the ledger of who held which GPU when; it answers
`query.accounting.utilization` with the share-weighted mean utilization of the GPUs a job (or a team) held, per
bucket. This module picks and checks the range (whole minutes, at most 1000 buckets) and who may see it: a job as
reading the job (team-scoped callers their own team's), a team as reading its usage.
"""

from __future__ import annotations

import math
from datetime import UTC, datetime, timedelta
from typing import Annotated, Any

from fastapi import APIRouter, Path, Query, Request
from pydantic import BaseModel, ConfigDict, Field

from libs.contracts import subjects
from libs.contracts.names import NAME_PATTERN
from libs.contracts.reports import MAX_UTILIZATION_POINTS, MIN_UTILIZATION_STEP_S, UtilizationQuery
from services.gateway.bodies import QueryInstant
from services.gateway.domain import Action
from services.gateway.handlers import ERRORS, ApiError, Caller, call, job_team, refusals, require

router = APIRouter(prefix="/v1", responses=ERRORS)
MINUTE = timedelta(seconds=MIN_UTILIZATION_STEP_S)
MAX_WINDOW_S = 31 * 86_400
DEFAULT_POINTS = 120  # what a chart shows well: the default step is the whole minute nearest window / this
JOB_MIN_WINDOW_S = 600
TERMINAL = frozenset({"completed", "cancelled", "failed"})


class UtilizationPoint(BaseModel):
    start: datetime = Field(description="the bucket's start; it lasts `step_s` (the last one up to `as_of`)")
    utilization_pct: float | None = Field(description="mean GPU utilization over the GPU time measured in the "
                                                      "bucket, each GPU by its share; null: nothing measured")
    max_utilization_pct: float | None = Field(description="the busiest one-minute average of any of the GPUs")
    idle_pct: float | None = Field(description="share of the measured GPU time in minutes at or below "
                                               "`idle_util_pct`")
    gpus: float = Field(description="GPUs measured, on average over the bucket, each by its share")
    allocations: int = Field(description="allocations with measured time in the bucket")


class UtilizationHistory(BaseModel):
    """Every bucket from `start` to `as_of`, oldest first, from inventory's one-minute rollups (kept for
    accounting's ROLLUP_RETENTION_DAYS, 8 by default). A minute counts in the bucket it starts in and shows up once
    closed (about a minute and `ROLLUP_LATE_S` after it started)."""

    model_config = ConfigDict(json_schema_extra={"examples": [{
        "start": "2026-03-01T10:00:00+00:00", "end": "2026-03-01T10:02:00+00:00",
        "as_of": "2026-03-01T10:02:00+00:00", "step_s": 60, "job_id": "01J...", "team": None, "idle_util_pct": 5.0,
        "points": [{"start": "2026-03-01T10:00:00+00:00", "utilization_pct": 62.5, "max_utilization_pct": 71.0,
                    "idle_pct": 0.0, "gpus": 2.0, "allocations": 1},
                   {"start": "2026-03-01T10:01:00+00:00", "utilization_pct": None, "max_utilization_pct": None,
                    "idle_pct": None, "gpus": 0.0, "allocations": 0}],
        "avg_utilization_pct": 62.5, "max_utilization_pct": 71.0, "idle_pct": 0.0,
        "measured_gpu_hours": 0.033333}]})

    start: datetime
    end: datetime
    as_of: datetime = Field(description="min(end, now)")
    step_s: int
    job_id: str | None
    team: str | None
    idle_util_pct: float = Field(description="a minute at or below this utilization counts as idle")
    points: list[UtilizationPoint]
    avg_utilization_pct: float | None = Field(description="over every measured bucket")
    max_utilization_pct: float | None
    idle_pct: float | None
    measured_gpu_hours: float = Field(description="GPU time with a rollup, each GPU by its share")


BUCKETS = refusals(f"window_s / step_s more than {MAX_UTILIZATION_POINTS} buckets", "InvalidRange", "InvalidStep")
WindowS = Annotated[int | None, Query(ge=MIN_UTILIZATION_STEP_S, le=MAX_WINDOW_S,
                                      description="seconds before `to` (rounded out to whole minutes)")]
StepS = Annotated[int | None, Query(ge=MIN_UTILIZATION_STEP_S, le=86_400, json_schema_extra={"multipleOf": MIN_UTILIZATION_STEP_S}, description=(
    "bucket length, a whole number of minutes in seconds; default: the whole minute nearest to window_s / "
    f"{DEFAULT_POINTS}; at most {MAX_UTILIZATION_POINTS} buckets"))]
To = Annotated[QueryInstant | None, Query(alias="to", description="end of the range; default now (a finished job: "
                                                              "when it finished)")]


def _floor_minute(at: datetime) -> datetime:
    return at.replace(second=0, microsecond=0)


def utilization_range(end: datetime, window_s: int, step_s: int | None) -> tuple[datetime, datetime, int]:
    """[start, end) and the step: start on a whole minute `window_s` (or a little more) before `end`, so buckets
    begin where inventory's minutes do; the step a whole number of minutes, at most MAX_UTILIZATION_POINTS buckets."""
    end = end if end.tzinfo is not None else end.replace(tzinfo=UTC)
    try:
        start = _floor_minute(end - timedelta(seconds=window_s))
    except OverflowError:
        raise ApiError(422, "InvalidRange", "the time range lies outside the calendar") from None
    span_s = (end - start).total_seconds()
    if step_s is None:
        step_s = MIN_UTILIZATION_STEP_S * max(1, round(window_s / DEFAULT_POINTS / MIN_UTILIZATION_STEP_S))
    if step_s % MIN_UTILIZATION_STEP_S:
        raise ApiError(422, "InvalidStep", f"step_s must be a whole number of minutes (a multiple of "
                                           f"{MIN_UTILIZATION_STEP_S}): the rollups are one minute", step_s=step_s)
    if span_s / step_s > MAX_UTILIZATION_POINTS:
        raise ApiError(422, "InvalidRange", f"at most {MAX_UTILIZATION_POINTS} buckets: use a longer step_s or a "
                                            "shorter window_s", window_s=window_s, step_s=step_s)
    return start, end, step_s


async def _history(req: Request, start: datetime, end: datetime, step_s: int, **subject: str) -> Any:
    return await call(req, subjects.QUERY_ACCOUNTING_UTILIZATION,
                      UtilizationQuery(start=start, end=end, step_s=step_s, **subject))


@router.get("/jobs/{job_id}/utilization", summary="A job's GPU utilization over time", tags=["jobs"],
            response_model=UtilizationHistory, responses=BUCKETS)
async def job_utilization(job_id: Annotated[str, Path(max_length=64)], req: Request, caller: Caller,
                          window_s: WindowS = None, step_s: StepS = None, end: To = None) -> Any:
    """The share-weighted mean utilization of every GPU the job held (all its allocations, replicas and attempts),
    per bucket. Default range: the job's whole life (from submission, at least 10 minutes) up to now or, once it
    finished, to its end. Team-scoped callers may read their own team's jobs."""
    require(caller, Action.JOB_READ)
    job = await job_team(req, job_id)
    require(caller, Action.JOB_READ, job["team"])
    if end is None:
        finished = job.get("finished_at") if job.get("state") in TERMINAL else None
        end = datetime.fromisoformat(finished) if finished else datetime.now(UTC)
    if window_s is None:
        lived = (end - datetime.fromisoformat(job["submitted_at"])).total_seconds() if job.get("submitted_at") else 0
        window_s = min(MAX_WINDOW_S, max(JOB_MIN_WINDOW_S, math.ceil(lived)))
    start, end, step = utilization_range(end, window_s, step_s)
    return await _history(req, start, end, step, job_id=job_id)


@router.get("/teams/{team}/utilization", summary="The utilization of every GPU a team held, over time",
            tags=["quota"], response_model=UtilizationHistory, responses=BUCKETS)
async def team_utilization(team: Annotated[str, Path(pattern=NAME_PATTERN)], req: Request, caller: Caller,
                           window_s: WindowS = 3600, step_s: StepS = None, end: To = None) -> Any:
    """The share-weighted mean utilization of the GPUs the team's jobs held, per bucket, with `gpus` (how many it
    held, measured): the team's use over time. Team-scoped callers may read their own team only. A team that held
    nothing (or does not exist) has every bucket empty."""
    require(caller, Action.USAGE_READ, team)
    start, end, step = utilization_range(end or datetime.now(UTC), window_s or 3600, step_s)
    return await _history(req, start, end, step, team=team)
