"""Reports and cost rates in the typed client: usage with cost, efficiency, capacity, waste (JSON models or CSV
text), and the prices behind the cost. Mixed into `GpupoolClient`:

    with GpupoolClient.from_env() as gp:
        report = gp.report_usage(start=datetime(2026, 3, 1, tzinfo=UTC), group_by=["team", "user"])
        for row in report.rows:
            print(row.dims(report.group_by), row.gpu_hours, row.cost)
        open("march.csv", "w").write(gp.report_usage_csv(start=..., end=...))
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from datetime import datetime
from typing import Any

from libs.contracts.api_reports import (
    CapacityReport,
    CostRate,
    Demand,
    EfficiencyReport,
    EfficiencyRow,
    Forecast,
    ForecastHorizon,
    IdleAllocation,
    ModelCapacity,
    TeamWaste,
    TrendBucket,
    UsageReport,
    UsageRow,
    WasteOrphan,
    WasteReport,
)

FilterValues = Mapping[str, str | Sequence[str] | None]


# the response models are the gateway's own (libs/contracts/api_reports.py), re-exported
__all__ = ["CapacityReport", "CostRate", "Demand", "EfficiencyReport", "EfficiencyRow", "Forecast",
           "ForecastHorizon", "IdleAllocation", "ModelCapacity", "ReportsApi", "TeamWaste", "TrendBucket",
           "UsageReport", "UsageRow", "WasteOrphan", "WasteReport", "report_params"]


# --- the methods ----------------------------------------------------------------------------------------------------
def _time(value: datetime | str | None) -> str | None:
    return value.isoformat() if isinstance(value, datetime) else value


def report_params(start: datetime | str | None = None, end: datetime | str | None = None,
                  group_by: Sequence[str] | None = None, filters: FilterValues | None = None,
                  **extra: Any) -> dict[str, Any]:
    """Query parameters of a report: `group_by` joined with commas (an empty sequence: one total row), each
    filter a value or a list of values (repeated in the query)."""
    params: dict[str, Any] = {"from": _time(start), "to": _time(end), **extra}
    if group_by is not None:
        params["group_by"] = ",".join(group_by)
    for dim, values in (filters or {}).items():
        if values:
            params[dim] = [values] if isinstance(values, str) else list(values)
    return params


class ReportsApi:
    """Report and cost-rate calls, mixed into GpupoolClient, which provides the `_json` and `request` plumbing
    declared here (annotations only: nothing to override, nothing that could be called by mistake)."""

    _json: Callable[..., Any]
    request: Callable[..., Any]

    def _report(self, name: str, params: dict[str, Any]) -> Any:
        return self._json("GET", f"/v1/reports/{name}", params=params)

    def _report_csv(self, name: str, params: dict[str, Any]) -> str:
        resp = self.request("GET", f"/v1/reports/{name}", params={**params, "format": "csv"})
        return str(resp.text)

    def report_usage(self, start: datetime | str | None = None, end: datetime | str | None = None, *,
                     group_by: Sequence[str] | None = None, filters: FilterValues | None = None,
                     limit: int | None = None) -> UsageReport:
        """GPU-seconds, GPU-hours and cost per group over [start, end) (default: the last 7 days, by team).
        Dimensions: team, project, user, kind, gpu_model, sharing, mig_profile; filters use the same names."""
        return UsageReport.from_api(self._report("usage", report_params(start, end, group_by, filters, limit=limit)))

    def report_usage_csv(self, start: datetime | str | None = None, end: datetime | str | None = None, *,
                         group_by: Sequence[str] | None = None, filters: FilterValues | None = None,
                         limit: int | None = None) -> str:
        return self._report_csv("usage", report_params(start, end, group_by, filters, limit=limit))

    def report_efficiency(self, start: datetime | str | None = None, end: datetime | str | None = None, *,
                          group_by: Sequence[str] | None = None, filters: FilterValues | None = None,
                          limit: int | None = None) -> EfficiencyReport:
        """Allocated, measured, used and idle GPU-hours per group (default: by team)."""
        return EfficiencyReport.from_api(self._report("efficiency", report_params(start, end, group_by, filters,
                                                                        limit=limit)))

    def report_efficiency_csv(self, start: datetime | str | None = None, end: datetime | str | None = None, *,
                              group_by: Sequence[str] | None = None, filters: FilterValues | None = None,
                              limit: int | None = None) -> str:
        return self._report_csv("efficiency", report_params(start, end, group_by, filters, limit=limit))

    def report_capacity(self, start: datetime | str | None = None, end: datetime | str | None = None, *,
                        bucket_s: int | None = None, gpu_model: str | None = None,
                        team: str | None = None) -> CapacityReport:
        """Per GPU model: supply, demand (queued GPU-hours, waits, peaks), a trend per bucket and a forecast."""
        return CapacityReport.from_api(self._report("capacity", report_params(
            start, end, bucket_s=bucket_s, gpu_model=gpu_model, team=team)))

    def report_capacity_csv(self, start: datetime | str | None = None, end: datetime | str | None = None, *,
                            bucket_s: int | None = None, gpu_model: str | None = None,
                            team: str | None = None) -> str:
        return self._report_csv("capacity", report_params(start, end, bucket_s=bucket_s, gpu_model=gpu_model,
                                                          team=team))

    def report_waste(self, start: datetime | str | None = None, end: datetime | str | None = None, *,
                     filters: FilterValues | None = None, min_idle_fraction: float | None = None,
                     limit: int | None = None) -> WasteReport:
        """Idle GPU-hours by team, the allocations idle at least `min_idle_fraction` of the time, and orphans."""
        return WasteReport.from_api(self._report("waste", report_params(
            start, end, None, filters, min_idle_fraction=min_idle_fraction, limit=limit)))

    def report_waste_csv(self, start: datetime | str | None = None, end: datetime | str | None = None, *,
                         filters: FilterValues | None = None, min_idle_fraction: float | None = None,
                         limit: int | None = None) -> str:
        return self._report_csv("waste", report_params(start, end, None, filters,
                                                       min_idle_fraction=min_idle_fraction, limit=limit))

    def history_page(self, start: datetime | str | None = None, end: datetime | str | None = None, *,
                     teams: Sequence[str] | None = None, after: str | None = None,
                     limit: int | None = None) -> dict[str, Any]:
        """GET /v1/history/jobs: one page of recorded jobs (`items`, and `next` for the following page)."""
        params = report_params(start, end, None, {"team": list(teams) if teams else None}, after=after, limit=limit)
        return dict(self._json("GET", "/v1/history/jobs", params=params))

    def history_jobs(self, start: datetime | str | None = None, end: datetime | str | None = None, *,
                     teams: Sequence[str] | None = None, page_size: int = 500) -> list[dict[str, Any]]:
        """Every recorded job that entered the queue in [start, end) (default: the last 30 days), page by page:
        what it asked for, when it was submitted, started and ended, its wait and the model it ran on."""
        out: list[dict[str, Any]] = []
        after: str | None = None
        while True:
            page = self.history_page(start, end, teams=teams, after=after, limit=page_size)
            out += page.get("items", [])
            after = page.get("next")
            if not after:
                return out

    def list_cost_rates(self, gpu_model: str | None = None) -> list[CostRate]:
        doc = self._json("GET", "/v1/cost-rates", params={"gpu_model": gpu_model})
        return [CostRate.from_api(r) for r in (doc or {}).get("items", [])]

    def set_cost_rate(self, gpu_model: str, price_per_hour: float | str, effective_from: datetime | str, *,
                      mig_profile: str = "") -> CostRate:
        """The price per GPU-hour of a model (or, with `mig_profile`, per instance-hour of that slice) from
        `effective_from` on (admins). Setting the same model, profile and date again replaces the price."""
        body = {"gpu_model": gpu_model, "mig_profile": mig_profile, "effective_from": _time(effective_from),
                "price_per_hour": str(price_per_hour)}
        return CostRate.from_api(self._json("PUT", "/v1/cost-rates", json_body=body, retry=True))

    def delete_cost_rate(self, gpu_model: str, effective_from: datetime | str, *, mig_profile: str = "") -> None:
        self.request("DELETE", "/v1/cost-rates", params={"gpu_model": gpu_model, "mig_profile": mig_profile,
                                                         "effective_from": _time(effective_from)})
