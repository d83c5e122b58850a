"""The HTTP API's reports and prices: usage with cost, efficiency, capacity, waste, the job history and cost rates.
The gateway documents its responses with these classes (services/gateway/reports.py) and the typed client parses
the same responses into them (libs/client/reports.py): one definition for both."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from typing import Any, Literal

from pydantic import ConfigDict, Field

from libs.contracts.api import ApiModel

_T0, _T1 = "2026-03-01T00:00:00+00:00", "2026-04-01T00:00:00+00:00"


class UsageRow(ApiModel):
    """One group: its dimension values (e.g. `team`) and the GPU time it used."""

    model_config = ConfigDict(extra="allow")
    gpu_seconds: float = Field(description="Σ (release − grant) × share per GPU inside the range; exact to 1 µs")
    gpu_hours: float
    cost: float = Field(description="priced with the rate in force at each moment")
    unpriced_gpu_seconds: float = Field(description="GPU time of models without a price in force")
    avg_utilization_pct: float | None = Field(description="from inventory's one-minute rollups; null: none seen")
    allocations: int
    jobs: int

    def dims(self, group_by: Sequence[str]) -> dict[str, Any]:
        """The row's value of each grouping dimension (its extra fields, e.g. `team`)."""
        return {d: self.raw.get(d) for d in group_by}


class UsageTotal(ApiModel):
    gpu_seconds: float
    gpu_hours: float
    cost: float
    unpriced_gpu_seconds: float
    avg_utilization_pct: float | None


class ReportFrame(ApiModel):
    start: datetime
    end: datetime
    as_of: datetime = Field(description="min(end, now): running allocations count up to here")
    currency: str
    idle_util_pct: float = Field(description="a rollup minute at or below this utilization counts as idle")


class UsageReport(ReportFrame):
    model_config = ConfigDict(json_schema_extra={"examples": [{
        "start": _T0, "end": _T1, "as_of": _T1, "currency": "USD", "idle_util_pct": 5.0, "group_by": ["team"],
        "filters": {}, "truncated": False,
        "rows": [{"team": "research", "gpu_seconds": 7201.0, "gpu_hours": 2.000278, "cost": 5.250417,
                  "unpriced_gpu_seconds": 0.0, "avg_utilization_pct": 41.0, "allocations": 1, "jobs": 1}],
        "total": {"gpu_seconds": 7201.0, "gpu_hours": 2.000278, "cost": 5.250417, "unpriced_gpu_seconds": 0.0,
                  "avg_utilization_pct": 41.0}}]})
    group_by: list[str]
    filters: dict[str, list[str]]
    rows: list[UsageRow]
    truncated: bool = Field(description="more groups than `limit`: the largest are shown")
    total: UsageTotal


class EfficiencyTotal(ApiModel):
    allocated_gpu_hours: float
    measured_gpu_hours: float = Field(description="allocated GPU-hours of intervals with utilization rollups")
    used_gpu_hours: float = Field(description="measured GPU-hours × average utilization")
    idle_gpu_hours: float = Field(description="measured GPU-hours in minutes at or below idle_util_pct")
    efficiency_pct: float | None
    idle_pct: float | None
    telemetry_coverage_pct: float | None


class EfficiencyRow(EfficiencyTotal):
    model_config = ConfigDict(extra="allow")
    allocations: int
    jobs: int

    def dims(self, group_by: Sequence[str]) -> dict[str, Any]:
        """The row's value of each grouping dimension (its extra fields, e.g. `team`)."""
        return {d: self.raw.get(d) for d in group_by}


class EfficiencyReport(ReportFrame):
    model_config = ConfigDict(json_schema_extra={"examples": [{
        "start": _T0, "end": _T1, "as_of": _T1, "currency": "USD", "idle_util_pct": 5.0, "group_by": ["team"],
        "filters": {}, "truncated": False,
        "rows": [{"team": "research", "allocated_gpu_hours": 2.0, "measured_gpu_hours": 2.0, "used_gpu_hours": 0.82,
                  "idle_gpu_hours": 1.0, "efficiency_pct": 41.0, "idle_pct": 50.0, "telemetry_coverage_pct": 100.0,
                  "allocations": 1, "jobs": 1}],
        "total": {"allocated_gpu_hours": 2.0, "measured_gpu_hours": 2.0, "used_gpu_hours": 0.82,
                  "idle_gpu_hours": 1.0, "efficiency_pct": 41.0, "idle_pct": 50.0,
                  "telemetry_coverage_pct": 100.0}}]})
    group_by: list[str]
    filters: dict[str, list[str]]
    rows: list[EfficiencyRow]
    truncated: bool
    total: EfficiencyTotal


class Demand(ApiModel):
    queued_gpu_hours: float = Field(description="Σ GPUs asked for × time waiting in the queue")
    pending_gpus: float = Field(description="GPUs asked for by jobs waiting now (0 for a range in the past)")
    waits: int = Field(description="waits that ended with a grant inside the range")
    wait_p50_s: float | None
    wait_p90_s: float | None
    wait_p99_s: float | None
    wait_max_s: float | None
    peak_demand_gpus: float = Field(description="highest allocated + waiting GPUs at any moment")
    peak_allocated_gpus: float
    allocated_gpu_hours: float


class TrendBucket(ApiModel):
    start: datetime
    peak_demand_gpus: float
    peak_allocated_gpus: float
    supply_gpus: int


class ForecastHorizon(ApiModel):
    days: int
    mean_gpus: float | None = Field(description="mean forecast demand over the next `days` days")
    peak_gpus: float | None = Field(description="highest forecast demand (trend + weekday) in those days")
    peak_low_gpus: float | None = Field(description="peak − 1.28 × residual standard deviation (never below 0)")
    peak_high_gpus: float | None = Field(description="peak + 1.28 × residual standard deviation (an 80% band)")


class Forecast(ApiModel):
    method: str
    status: Literal["exceeds", "will_exceed", "ok", "insufficient_data"]
    fit: Literal["trend+weekly", "trend", "insufficient_data"] = Field(
        description="trend+weekly: linear trend and day-of-week terms (≥ 14 days, every weekday twice); trend: "
                    "the line alone; insufficient_data: fewer than 3 bucket peaks")
    points: int = Field(description="bucket peaks the fit used")
    slope_gpus_per_day: float | None = Field(description="the trend, GPUs of peak demand per day")
    level_gpus: float | None = Field(description="fitted demand at the last bucket")
    residual_sd_gpus: float | None
    weekly_gpus: dict[str, float] | None = Field(description="day-of-week deviations from the trend (mon…sun, "
                                                             "summing to 0); null without the weekly fit")
    next: list[ForecastHorizon] = Field(description="the next 7 and 30 days")
    exceeds_supply_at: datetime | None = Field(description="when the trend line reaches supply (will_exceed)")

    def horizon(self, days: int) -> ForecastHorizon | None:
        return next((h for h in self.next if h.days == days), None)


class ModelCapacity(ApiModel):
    gpu_model: str = Field(description="`any`: jobs that accept any model (their supply is every GPU)")
    supply_gpus: int = Field(description="GPUs of the model on nodes not lost, not failed")
    demand: Demand
    allocated_pct_of_supply: float | None
    trend: list[TrendBucket]
    forecast: Forecast


class CapacityReport(ApiModel):
    model_config = ConfigDict(json_schema_extra={"examples": [{
        "start": _T0, "end": _T1, "as_of": _T1, "bucket_s": 86400, "team": None, "models": [{
            "gpu_model": "H100-80GB", "supply_gpus": 32,
            "demand": {"queued_gpu_hours": 41.5, "pending_gpus": 8, "waits": 120, "wait_p50_s": 42.0,
                       "wait_p90_s": 610.0, "wait_p99_s": 2400.0, "wait_max_s": 3100.0, "peak_demand_gpus": 30,
                       "peak_allocated_gpus": 28, "allocated_gpu_hours": 14880.0},
            "allocated_pct_of_supply": 62.0,
            "trend": [{"start": _T0, "peak_demand_gpus": 22, "peak_allocated_gpus": 22, "supply_gpus": 32}],
            "forecast": {"method": "least squares through each bucket's peak demand: a linear trend, plus "
                                   "day-of-week terms with at least 14 days of data", "status": "will_exceed",
                         "fit": "trend+weekly", "points": 31, "slope_gpus_per_day": 0.3, "level_gpus": 29.1,
                         "residual_sd_gpus": 1.2, "weekly_gpus": {"mon": 2.0, "tue": 2.1, "wed": 1.9, "thu": 2.0,
                                                                  "fri": 1.0, "sat": -4.5, "sun": -4.5},
                         "next": [{"days": 7, "mean_gpus": 30.2, "peak_gpus": 33.2, "peak_low_gpus": 31.7,
                                   "peak_high_gpus": 34.7},
                                  {"days": 30, "mean_gpus": 33.7, "peak_gpus": 40.1, "peak_low_gpus": 38.6,
                                   "peak_high_gpus": 41.6}],
                         "exceeds_supply_at": "2026-04-08T00:00:00+00:00"}}]}]})
    start: datetime
    end: datetime
    as_of: datetime
    bucket_s: int
    team: str | None
    models: list[ModelCapacity]


class IdleAllocation(ApiModel):
    allocation_id: str
    job_id: str
    team: str
    project: str
    user: str
    kind: str
    cluster: str
    node: str
    gpu_model: str
    gpus: int
    gpu_share: float
    granted_at: datetime
    released_at: datetime | None
    running: bool
    release_reason: str | None
    gpu_hours: float
    idle_gpu_hours: float
    idle_fraction: float
    avg_utilization_pct: float


class WasteOrphan(ApiModel):
    gpu_uuid: str
    orphan: Literal["process_without_allocation", "allocation_without_process"]
    allocation_id: str | None
    job_id: str | None
    team: str | None
    cluster: str
    node: str
    pids: list[int]
    since: datetime
    first_detected_at: datetime
    last_detected_at: datetime
    reports: int


class TeamWaste(EfficiencyTotal):
    team: str


class WasteReport(ReportFrame):
    model_config = ConfigDict(json_schema_extra={"examples": [{
        "start": _T0, "end": _T1, "as_of": _T1, "currency": "USD", "idle_util_pct": 5.0, "filters": {},
        "min_idle_fraction": 0.5, "idle_gpu_hours": 1.5,
        "by_team": [{"team": "research", "allocated_gpu_hours": 2.0, "measured_gpu_hours": 2.0,
                     "used_gpu_hours": 0.82, "idle_gpu_hours": 1.0, "efficiency_pct": 41.0, "idle_pct": 50.0,
                     "telemetry_coverage_pct": 100.0}],
        "idle_allocations": [{"allocation_id": "0193…", "job_id": "0193…", "team": "research", "project": "default",
                              "user": "alice", "kind": "dev", "cluster": "sim", "node": "sim-node-01",
                              "gpu_model": "H100-80GB", "gpus": 1, "gpu_share": 1.0, "granted_at": _T0,
                              "released_at": None, "running": True, "release_reason": None, "gpu_hours": 2.0,
                              "idle_gpu_hours": 1.9, "idle_fraction": 0.95, "avg_utilization_pct": 1.2}],
        "orphans": [{"gpu_uuid": "GPU-…", "orphan": "process_without_allocation", "allocation_id": None,
                     "job_id": None, "team": None, "cluster": "sim", "node": "sim-node-02", "pids": [4242],
                     "since": _T0, "first_detected_at": _T0, "last_detected_at": _T0, "reports": 3}]}]})
    filters: dict[str, list[str]]
    min_idle_fraction: float
    idle_gpu_hours: float
    by_team: list[TeamWaste]
    idle_allocations: list[IdleAllocation]
    orphans: list[WasteOrphan]


class HistoryJob(ApiModel):
    job_id: str
    name: str | None
    team: str
    project: str
    user: str
    kind: str
    priority: int
    priority_class: str
    gpus: int = Field(description="GPUs asked for (a gang's total); 1 for a fraction or a MIG slice")
    gpu_models: list[str] = Field(description="models it accepts; empty: any")
    gpu_fraction_milli: int
    mig_profile: str
    gang_nodes: int
    gpus_per_node: int
    replicas: int
    max_runtime_s: float | None
    submitted_at: datetime = Field(description="when it first entered the queue")
    submit_time: float = Field(description="the same, Unix seconds")
    started_at: datetime | None = Field(description="its first grant; null: never granted")
    start_time: float | None
    ended_at: datetime | None = Field(description="the release of its last run; null: running or never granted")
    end_time: float | None
    duration_s: float | None = Field(description="its last run, grant to release (to `as_of` while running)")
    wait_s: float | None = Field(description="first entering the queue to the first grant")
    gpu_model_granted: str | None
    gpu_share: float | None = Field(description="GPUs its last run held, each by its share")
    nodes: int | None
    state: Literal["waiting", "running", "ended", "cancelled"]


class History(ApiModel):
    start: datetime
    end: datetime
    as_of: datetime
    items: list[HistoryJob]
    next: str | None = Field(description="pass as `after` for the next page; null: the last page")


class CostRate(ApiModel):
    gpu_model: str
    mig_profile: str = Field(description="empty: per GPU-hour of the model; else per instance-hour of the profile")
    effective_from: datetime
    price_per_hour: float
    set_by: str
    set_at: datetime


class CostRates(ApiModel):
    items: list[CostRate]
    next: str | None
    currency: str
