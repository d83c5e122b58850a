"""Reports on what the GPUs did — usage with cost, efficiency, capacity, waste — and the prices behind the cost.

Accounting owns the ledger and answers every report over request/reply; this module checks the caller may see what
they ask for (team-scoped callers only ever their own team), validates ranges and groupings at the edge, and
renders JSON or CSV (`format=csv` or `Accept: text/csv`).
"""

from __future__ import annotations

import csv
import io
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from typing import Annotated, Any, Literal

from fastapi import APIRouter, Query, Request, Response
from pydantic import BaseModel, ConfigDict, Field, WithJsonSchema

from libs.contracts import subjects
from libs.contracts.api_reports import (
    CapacityReport,
    CostRate,
    CostRates,
    EfficiencyReport,
    History,
    IdleAllocation,
    UsageReport,
    WasteReport,
)
from libs.contracts.reports import (
    DIMENSIONS,
    GPU_MODEL_PATTERN,
    MAX_CAPACITY_BUCKETS,
    MAX_FILTER_VALUES,
    MAX_REPORT_DAYS,
    MIG_PROFILE_PATTERN,
    CapacityReportQuery,
    EfficiencyReportQuery,
    HistoryQuery,
    ListCostRates,
    SetCostRate,
    UsageReportQuery,
    WasteReportQuery,
)
from services.gateway.bodies import Instant, QueryInstant, RequestBody
from services.gateway.domain import ANY, Action, Principal
from services.gateway.handlers import ERRORS, ApiError, Caller, call, record, refusals, require

router = APIRouter(prefix="/v1", responses=ERRORS)
CSV_TYPE = "text/csv; charset=utf-8"
Format = Literal["json", "csv"]
Filter = Annotated[list[Annotated[str, Field(min_length=1, max_length=256)]] | None,
                   Query(max_length=MAX_FILTER_VALUES, description="only these values (repeatable)")]

class CostRateBody(RequestBody):
    """A price in force from `effective_from` until the next one of the same model and profile."""

    model_config = ConfigDict(extra="forbid", json_schema_extra={"examples": [
        {"gpu_model": "H100-80GB", "effective_from": "2026-01-01T00:00:00Z", "price_per_hour": 2.49},
        {"gpu_model": "A100-80GB", "mig_profile": "3g.40gb", "effective_from": "2026-01-01T00:00:00Z",
         "price_per_hour": 0.85}]})

    gpu_model: str = Field(pattern=GPU_MODEL_PATTERN)
    mig_profile: str = Field(default="", max_length=32, pattern=MIG_PROFILE_PATTERN,
                             description="a MIG profile priced per instance-hour (else: the model's GPU-hour)")
    effective_from: Instant = Field(description="with a time zone (RFC 3339), between 2000 and 2200")
    price_per_hour: Annotated[Decimal, WithJsonSchema({"anyOf": [
        {"type": "number", "minimum": 0, "maximum": 1_000_000},
        {"type": "string", "pattern": r"^\+?0*([0-9]{1,6}(\.[0-9]{0,6})?|1000000(\.0{0,6})?|\.[0-9]{1,6})$"}]})] = Field(
        ge=0, le=1_000_000, max_digits=18, decimal_places=6, strict=False,
        description="a JSON number or a decimal string; at most 6 decimal places (a number with more: 422)")


def _doc(model: type[BaseModel], csv_example: str) -> dict[int | str, dict[str, Any]]:
    return {200: {"model": model, "description": "The report (JSON), or with `format=csv` / `Accept: text/csv` its "
                                                 "main table as CSV",
                  "content": {"text/csv": {"schema": {"type": "string"}, "example": csv_example}}}}


# --- edge checks -------------------------------------------------------------------------------------------------
def _utc(value: datetime) -> datetime:
    return value if value.tzinfo is not None else value.replace(tzinfo=UTC)


def time_range(start: datetime | None, end: datetime | None, default_days: int) -> tuple[datetime, datetime]:
    """[start, end): `end` defaults to now, `start` to `default_days` before `end`; both end up with a zone."""
    try:
        end = _utc(end) if end is not None else datetime.now(UTC)
        start = _utc(start) if start is not None else end - timedelta(days=default_days)
        span = end - start
    except OverflowError:
        raise ApiError(422, "InvalidRange", "the time range lies outside the calendar") from None
    if span <= timedelta(0):
        raise ApiError(422, "InvalidRange", "`to` must be after `from`", start=start.isoformat(),
                       end=end.isoformat())
    if span > timedelta(days=MAX_REPORT_DAYS):
        raise ApiError(422, "InvalidRange", f"a report covers at most {MAX_REPORT_DAYS} days")
    return start, end


def group_dims(group_by: list[str] | None, default: list[str]) -> list[str]:
    """`group_by=team,project` or `group_by=team&group_by=project`; an empty value means one total row."""
    if group_by is None:
        return default
    dims = [d.strip() for g in group_by for d in g.split(",") if d.strip()]
    unknown = sorted(set(dims) - set(DIMENSIONS))
    if unknown:
        raise ApiError(422, "InvalidGroupBy", f"unknown dimension(s) {', '.join(unknown)}; use any of "
                                              f"{', '.join(DIMENSIONS)}", allowed=list(DIMENSIONS))
    if len(set(dims)) != len(dims):
        raise ApiError(422, "InvalidGroupBy", "group_by names a dimension twice")
    return dims


def scoped_teams(caller: Principal, requested: list[str] | None) -> list[str] | None:
    """The teams a report may cover: any for admins and operators, only their own for team-scoped callers (asking
    for another team is refused, asking for none means their own)."""
    require(caller, Action.USAGE_READ)
    if caller.scope(Action.USAGE_READ) == ANY:
        return requested or None
    for team in requested or []:
        require(caller, Action.USAGE_READ, team)
    if not caller.team:
        raise ApiError(403, "Forbidden", "a team-scoped token without a team may read no team's usage",
                       action=Action.USAGE_READ.value)
    return [caller.team]


def _filters(caller: Principal, **values: list[str] | None) -> dict[str, list[str]]:
    out = {dim: v for dim, v in values.items() if v}
    teams = scoped_teams(caller, values.get("team"))
    if teams is not None:
        out["team"] = teams
    return out


def wants_csv(req: Request, fmt: Format | None) -> bool:
    if fmt is not None:
        return fmt == "csv"
    return "text/csv" in req.headers.get("accept", "")


def _cell(value: Any) -> Any:
    """Text a spreadsheet would run as a formula (=, +, -, @ first) is quoted with a leading apostrophe."""
    if value is None:
        return ""
    if isinstance(value, str) and value[:1] in ("=", "+", "-", "@", "\t", "\r"):
        return "'" + value
    return value


def csv_response(columns: list[str], rows: list[dict[str, Any]], name: str, start: datetime,
                 end: datetime) -> Response:
    buf = io.StringIO()
    writer = csv.writer(buf, lineterminator="\r\n")
    writer.writerow(columns)
    for row in rows:
        writer.writerow([_cell(row.get(c)) for c in columns])
    filename = f"gpupool-{name}-{start:%Y%m%dT%H%M%SZ}-{end:%Y%m%dT%H%M%SZ}.csv"
    return Response(buf.getvalue(), media_type=CSV_TYPE,
                    headers={"Content-Disposition": f'attachment; filename="{filename}"'})


USAGE_COLUMNS = ["gpu_seconds", "gpu_hours", "cost", "currency", "unpriced_gpu_seconds", "avg_utilization_pct",
                 "allocations", "jobs"]
EFFICIENCY_COLUMNS = ["allocated_gpu_hours", "measured_gpu_hours", "used_gpu_hours", "idle_gpu_hours",
                      "efficiency_pct", "idle_pct", "telemetry_coverage_pct", "allocations", "jobs"]
CAPACITY_COLUMNS = ["gpu_model", "supply_gpus", "queued_gpu_hours", "pending_gpus", "waits", "wait_p50_s",
                    "wait_p90_s", "wait_p99_s", "wait_max_s", "peak_demand_gpus", "peak_allocated_gpus",
                    "allocated_gpu_hours", "allocated_pct_of_supply", "forecast_status", "forecast_fit",
                    "slope_gpus_per_day", "forecast_7d_peak_gpus", "forecast_30d_peak_gpus", "exceeds_supply_at"]
WASTE_COLUMNS = list(IdleAllocation.model_fields)

RANGE_REFUSED = refusals(f"`from` at most {MAX_REPORT_DAYS} days before `to`, and before it", "InvalidRange")
CAPACITY_REFUSED = refusals(f"`from` at most {MAX_REPORT_DAYS} days before `to`, and before it; at most "
                            f"{MAX_CAPACITY_BUCKETS} trend buckets of `bucket_s`", "InvalidRange")
RangeFrom = Annotated[QueryInstant | None, Query(alias="from", description=(
    f"start (inclusive), between 2000 and 2200; default: `to` − 7 days; at most {MAX_REPORT_DAYS} days before "
    "`to` (else 422 InvalidRange)"))]
RangeTo = Annotated[QueryInstant | None, Query(alias="to", description=(
    "end (exclusive), between 2000 and 2200; default: now"))]
GroupBy = Annotated[list[Annotated[str, Field(max_length=200)]] | None, Query(
    max_length=len(DIMENSIONS), description=f"dimensions, comma-separated or repeated: {', '.join(DIMENSIONS)}; "
                                            "empty: one total row")]
FormatQ = Annotated[Format | None, Query(alias="format", description="csv: the table as CSV")]


# --- reports -------------------------------------------------------------------------------------------------------
async def _grouped(req: Request, caller: Principal, subject: str, cls: type[Any], start: datetime | None,
                   end: datetime | None, group_by: list[str] | None, limit: int, filters: dict[str, Any]) -> Any:
    frm, to = time_range(start, end, 7)
    dims = group_dims(group_by, ["team"])
    cmd = cls(start=frm, end=to, group_by=dims, filters=_filters(caller, **filters), limit=limit)
    return await call(req, subject, cmd), dims, frm, to


@router.get("/reports/usage", summary="GPU-hours and cost, grouped and filtered by team, project, user, kind, "
            "GPU model and sharing", tags=["reports"], response_model=None,
            responses={**RANGE_REFUSED, **_doc(UsageReport, "team,gpu_seconds,gpu_hours,cost,currency,unpriced_gpu_seconds,"
                                        "avg_utilization_pct,allocations,jobs\r\nresearch,7201.0,2.000278,5.250417,"
                                        "USD,0.0,41.0,1,1\r\n")})
async def usage_report(req: Request, caller: Caller, start: RangeFrom = None, end: RangeTo = None,
                       group_by: GroupBy = None, team: Filter = None, project: Filter = None, user: Filter = None,
                       kind: Filter = None, gpu_model: Filter = None, sharing: Filter = None,
                       mig_profile: Filter = None, limit: Annotated[int, Query(ge=1, le=10_000)] = 1000,
                       fmt: FormatQ = None) -> Any:
    """Exact GPU time in [from, to): each allocation counts (release − grant) × its GPUs × each GPU's share (a
    fraction or MIG slice by its share), running allocations up to now, clipped to the range. Cost applies the price
    in force at each moment (a MIG profile's own price per instance-hour when one is set)."""
    result, dims, frm, to = await _grouped(
        req, caller, subjects.QUERY_ACCOUNTING_REPORT_USAGE, UsageReportQuery, start, end, group_by, limit,
        dict(team=team, project=project, user=user, kind=kind, gpu_model=gpu_model, sharing=sharing,
             mig_profile=mig_profile))
    if wants_csv(req, fmt):
        rows = [{**r, "currency": result["currency"]} for r in result["rows"]]
        return csv_response(dims + USAGE_COLUMNS, rows, "usage", frm, to)
    return result


@router.get("/reports/efficiency", summary="Used vs allocated GPU-hours and idle GPU-hours, by team (or any "
            "dimension)", tags=["reports"], response_model=None,
            responses={**RANGE_REFUSED, **_doc(EfficiencyReport, "team,allocated_gpu_hours,measured_gpu_hours,used_gpu_hours,"
                                             "idle_gpu_hours,efficiency_pct,idle_pct,telemetry_coverage_pct,"
                                             "allocations,jobs\r\nresearch,2.0,2.0,0.82,1.0,41.0,50.0,100.0,1,1\r\n")})
async def efficiency_report(req: Request, caller: Caller, start: RangeFrom = None, end: RangeTo = None,
                            group_by: GroupBy = None, team: Filter = None, project: Filter = None,
                            user: Filter = None, kind: Filter = None, gpu_model: Filter = None,
                            sharing: Filter = None, mig_profile: Filter = None,
                            limit: Annotated[int, Query(ge=1, le=10_000)] = 1000, fmt: FormatQ = None) -> Any:
    """Used = each interval's measured GPU-hours × its average utilization (inventory's one-minute rollups); idle =
    measured minutes at or below the idle threshold. Intervals without rollups count as allocated, not measured."""
    result, dims, frm, to = await _grouped(
        req, caller, subjects.QUERY_ACCOUNTING_REPORT_EFFICIENCY, EfficiencyReportQuery, start, end, group_by, limit,
        dict(team=team, project=project, user=user, kind=kind, gpu_model=gpu_model, sharing=sharing,
             mig_profile=mig_profile))
    if wants_csv(req, fmt):
        return csv_response(dims + EFFICIENCY_COLUMNS, result["rows"], "efficiency", frm, to)
    return result


@router.get("/reports/capacity", summary="Per GPU model: demand (queued GPU-hours, waits, peak concurrency) against "
            "supply, with a trend and a forecast", tags=["reports"], response_model=None,
            responses={**CAPACITY_REFUSED, **_doc(CapacityReport, ",".join(CAPACITY_COLUMNS) + "\r\nH100-80GB,32,41.5,8,120,42.0,610.0,"
                                           "2400.0,3100.0,30,28,14880.0,62.0,will_exceed,trend+weekly,0.3,"
                                           "33.2,40.1,2026-04-08T00:00:00+00:00\r\n")})
async def capacity_report(req: Request, caller: Caller, start: Annotated[QueryInstant | None, Query(
        alias="from", description=f"start; default: `to` − 30 days; at most {MAX_REPORT_DAYS} days before `to` (else "
                                  "422 InvalidRange)")] = None, end: RangeTo = None,
        bucket_s: Annotated[int, Query(ge=1, le=31 * 86400, description="trend bucket, seconds; the forecast fits "
                                                                        "one point (its peak demand) per bucket")] = 86400,
        gpu_model: Annotated[str | None, Query(max_length=64)] = None,
        team: Annotated[str | None, Query(max_length=63, description="only this team's demand")] = None,
        fmt: FormatQ = None) -> Any:
    """Supply is GPUs on nodes not lost and not failed (from inventory's node events). Demand per bucket is the
    highest number of GPUs allocated plus waiting at any moment; a least-squares line through those peaks says when
    demand reaches supply. Team-scoped callers see their own team's demand against the shared supply."""
    frm, to = time_range(start, end, 30)
    if (to - frm).total_seconds() / bucket_s > MAX_CAPACITY_BUCKETS:
        raise ApiError(422, "InvalidRange", f"at most {MAX_CAPACITY_BUCKETS} trend buckets: use a longer bucket_s")
    teams = scoped_teams(caller, [team] if team else None)
    scoped = teams[0] if teams else None
    result = await call(req, subjects.QUERY_ACCOUNTING_REPORT_CAPACITY, CapacityReportQuery(
        start=frm, end=to, bucket_s=bucket_s, gpu_model=gpu_model, team=scoped))
    if wants_csv(req, fmt):
        rows = [{"gpu_model": m["gpu_model"], "supply_gpus": m["supply_gpus"], **m["demand"],
                 "allocated_pct_of_supply": m["allocated_pct_of_supply"], "forecast_status": m["forecast"]["status"],
                 "forecast_fit": m["forecast"]["fit"], "slope_gpus_per_day": m["forecast"]["slope_gpus_per_day"],
                 **{f"forecast_{h['days']}d_peak_gpus": h["peak_gpus"] for h in m["forecast"]["next"]},
                 "exceeds_supply_at": m["forecast"]["exceeds_supply_at"]} for m in result["models"]]
        return csv_response(CAPACITY_COLUMNS, rows, "capacity", frm, to)
    return result


@router.get("/reports/waste", summary="Idle GPU-hours by team, the idle allocations by name, and orphans",
            tags=["reports"], response_model=None,
            responses={**RANGE_REFUSED, **_doc(WasteReport, ",".join(WASTE_COLUMNS) + "\r\n")})
async def waste_report(req: Request, caller: Caller, start: RangeFrom = None, end: RangeTo = None,
                       team: Filter = None, project: Filter = None, user: Filter = None, kind: Filter = None,
                       gpu_model: Filter = None, sharing: Filter = None, mig_profile: Filter = None,
                       min_idle_fraction: Annotated[float, Query(ge=0, le=1)] = 0.5,
                       limit: Annotated[int, Query(ge=1, le=1000)] = 100, fmt: FormatQ = None) -> Any:
    """Allocations idle at least `min_idle_fraction` of their measured time in the range, most idle GPU-hours first,
    and the orphans inventory reported (processes on GPUs nobody holds — shown only to callers who see every team —
    and allocations whose GPUs ran nothing). CSV: the idle allocations."""
    frm, to = time_range(start, end, 7)
    filters = _filters(caller, team=team, project=project, user=user, kind=kind, gpu_model=gpu_model,
                       sharing=sharing, mig_profile=mig_profile)
    result = await call(req, subjects.QUERY_ACCOUNTING_REPORT_WASTE, WasteReportQuery(
        start=frm, end=to, filters=filters, min_idle_fraction=min_idle_fraction, limit=limit))
    if wants_csv(req, fmt):
        return csv_response(WASTE_COLUMNS, result["idle_allocations"], "waste", frm, to)
    return result


@router.get("/history/jobs", summary="The jobs the platform ran: what each asked for, when it was submitted, "
            "started and ended (the input of `gpupool history export`)", tags=["reports"], response_model=History,
            responses=RANGE_REFUSED)
async def history_jobs(req: Request, caller: Caller, start: Annotated[QueryInstant | None, Query(
        alias="from", description=f"jobs that entered the queue from here; default: `to` − 30 days; at most "
                                  f"{MAX_REPORT_DAYS} days before `to` (else 422 InvalidRange)")] = None,
        end: RangeTo = None, team: Filter = None,
        after: Annotated[str | None, Query(max_length=128, description="the `next` of the previous page")] = None,
        limit: Annotated[int, Query(ge=1, le=1000)] = 500) -> Any:
    """A page of recorded jobs in job id order, from accounting's own records (each job's JobSubmitted, its queue
    waits and its allocations). Team-scoped callers see their own team's jobs only."""
    frm, to = time_range(start, end, 30)
    return await call(req, subjects.QUERY_ACCOUNTING_EXPORT_HISTORY, HistoryQuery(
        start=frm, end=to, teams=scoped_teams(caller, team), after=after, limit=limit))


# --- cost rates ----------------------------------------------------------------------------------------------------
@router.get("/cost-rates", summary="Prices per GPU model and MIG profile, with the dates they take effect",
            tags=["reports"], response_model=CostRates)
async def list_cost_rates(req: Request, caller: Caller,
                          gpu_model: Annotated[str | None, Query(max_length=64)] = None) -> Any:
    require(caller, Action.TEAM_READ)
    return await call(req, subjects.QUERY_ACCOUNTING_COST_RATES, ListCostRates(gpu_model=gpu_model))


@router.put("/cost-rates", summary="Set a price from a date (same model, profile and date: replaced)",
            tags=["reports"], response_model=CostRate,
            responses=refusals("a JSON number with more than 6 decimal places (binary floating point cannot say "
                               "it in the schema)", "InvalidRequest"))
async def set_cost_rate(body: CostRateBody, req: Request, caller: Caller) -> Any:
    """Admins only; audited (`cost_rate.set`, before/after) and announced as a `CostRateSet` event. A price dated in
    the past re-prices the time since then in every later report."""
    require(caller, Action.QUOTA_MANAGE)
    result = await call(req, subjects.CMD_ACCOUNTING_SET_COST_RATE, SetCostRate(
        gpu_model=body.gpu_model, mig_profile=body.mig_profile, effective_from=_utc(body.effective_from),
        price_per_hour=body.price_per_hour, set_by=caller.subject))
    await record(req, caller, "cost_rate.set", _rate_key(body.gpu_model, body.mig_profile, body.effective_from),
                 result["before"], result["after"])
    return result["after"]


@router.delete("/cost-rates", status_code=204, summary="Withdraw a price", tags=["reports"],
               responses=refusals("`effective_from` between 2000 and 2200 (the dates a price may have)",
                                  "InvalidRequest"))
async def delete_cost_rate(req: Request, caller: Caller,
                           gpu_model: Annotated[str, Query(pattern=GPU_MODEL_PATTERN)],
                           effective_from: Annotated[QueryInstant, Query(
                               description="the price's date, between 2000 and 2200")],
                           mig_profile: Annotated[str, Query(max_length=32, pattern=MIG_PROFILE_PATTERN)] = "") -> \
        Response:
    require(caller, Action.QUOTA_MANAGE)
    result = await call(req, subjects.CMD_ACCOUNTING_SET_COST_RATE, SetCostRate(
        gpu_model=gpu_model, mig_profile=mig_profile, effective_from=_utc(effective_from), delete=True,
        set_by=caller.subject))
    await record(req, caller, "cost_rate.delete", _rate_key(gpu_model, mig_profile, effective_from),
                 result["before"], None)
    return Response(status_code=204)


def _rate_key(gpu_model: str, mig_profile: str, effective_from: datetime) -> str:
    return f"{gpu_model}{'/' + mig_profile if mig_profile else ''}@{_utc(effective_from).isoformat()}"
