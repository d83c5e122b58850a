"""Accounting's demand forecast: a least-squares trend, plus day-of-week terms with two weeks of data, recovered
from synthetic series whose trend and weekly pattern are known."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from services.accounting.domain import FORECAST_Z, demand_forecast, weekday_of

DAY = 86_400.0
MONDAY = datetime(2026, 3, 2, tzinfo=UTC).timestamp()  # a Monday
WEEK = (5.0, 5.0, 5.0, 5.0, 5.0, -12.0, -13.0)  # busy weekdays, quiet weekend; sums to zero


def series(days: int, slope: float, level: float, week: tuple[float, ...] = (0.0,) * 7,
           noise: float = 0.0) -> list[tuple[float, float]]:
    out = []
    for i in range(days):
        t = MONDAY + i * DAY
        wiggle = noise if i % 2 else -noise
        out.append((t, level + slope * i + week[weekday_of(t)] + wiggle))
    return out


def test_weekday_is_utc_monday_first() -> None:
    assert weekday_of(MONDAY) == 0 and weekday_of(MONDAY + 6 * DAY + 3600) == 6


def test_four_weeks_recover_the_trend_and_the_weekly_pattern_and_project_them() -> None:
    out = demand_forecast(series(28, slope=0.5, level=20.0, week=WEEK), step_s=DAY)
    assert out["model"] == "trend+weekly" and out["points"] == 28
    assert out["slope_gpus_per_day"] == pytest.approx(0.5, abs=1e-6)
    assert [out["weekly_gpus"][d] for d in ("mon", "tue", "wed", "thu", "fri", "sat", "sun")] == \
        pytest.approx(list(WEEK), abs=1e-6)
    assert out["residual_sd_gpus"] == pytest.approx(0.0, abs=1e-6)
    week, month = out["horizons"]
    # the next 7 days are days 28..34 (Monday..Sunday): the trend's mean plus a full week of terms summing to 0
    assert week["days"] == 7 and week["mean_gpus"] == pytest.approx(20 + 0.5 * 31, abs=1e-3)
    assert week["peak_gpus"] == pytest.approx(20 + 0.5 * 32 + 5, abs=1e-3)  # Friday of that week
    assert month["peak_gpus"] == pytest.approx(20 + 0.5 * 57 + 5, abs=1e-3)  # day 57, a Tuesday: the last weekday
    assert out["level_gpus"] == pytest.approx(20 + 0.5 * 27 - 13, abs=1e-3)  # the last day was a Sunday


def test_noise_widens_the_interval_around_the_peak() -> None:
    out = demand_forecast(series(21, slope=-0.2, level=30.0, week=WEEK, noise=1.0), step_s=DAY)
    assert out["model"] == "trend+weekly"
    assert out["slope_gpus_per_day"] == pytest.approx(-0.2, abs=0.05)
    week = out["horizons"][0]
    sd = out["residual_sd_gpus"]
    assert 0.5 < sd < 1.5
    assert week["peak_high_gpus"] - week["peak_gpus"] == pytest.approx(FORECAST_Z * sd, abs=2e-3)
    assert week["peak_low_gpus"] < week["peak_gpus"] < week["peak_high_gpus"]


def test_under_two_weeks_only_the_trend_is_fitted() -> None:
    out = demand_forecast(series(10, slope=1.5, level=4.0), step_s=DAY)
    assert out["model"] == "trend" and out["weekly_gpus"] is None
    assert out["slope_gpus_per_day"] == pytest.approx(1.5, abs=1e-9)
    assert out["horizons"][0]["peak_gpus"] == pytest.approx(4 + 1.5 * 16, abs=1e-3)


def test_hourly_points_give_numbers_per_day() -> None:
    pts = [(MONDAY + h * 3600.0, 2.0 + 0.25 * h / 24) for h in range(48)]
    out = demand_forecast(pts, step_s=3600.0)
    assert out["model"] == "trend" and out["slope_gpus_per_day"] == pytest.approx(0.25, abs=1e-9)
    assert out["horizons"][1]["peak_gpus"] == pytest.approx(2.0 + 0.25 * (47 / 24 + 30), abs=1e-3)


def test_a_falling_trend_never_forecasts_negative_demand() -> None:
    out = demand_forecast(series(5, slope=-3.0, level=10.0), step_s=DAY)
    assert out["horizons"][1]["peak_low_gpus"] == 0.0 and out["horizons"][1]["mean_gpus"] >= 0.0


@pytest.mark.parametrize("points", [[], [(MONDAY, 3.0)], [(MONDAY, 3.0), (MONDAY + DAY, 4.0)],
                                    [(MONDAY, 1.0)] * 4])
def test_too_few_points_say_insufficient_data_without_numbers(points: list[tuple[float, float]]) -> None:
    out = demand_forecast(points, step_s=DAY)
    assert out["model"] == "insufficient_data" and out["slope_gpus_per_day"] is None
    assert all(h["peak_gpus"] is None for h in out["horizons"])


def test_second_buckets_are_forecast_hourly_so_a_month_ahead_stays_cheap() -> None:
    import time

    pts = [(MONDAY + s, 3.0 + 0.001 * s) for s in range(60)]
    t0 = time.perf_counter()
    out = demand_forecast(pts, step_s=1.0)
    assert time.perf_counter() - t0 < 0.5
    assert out["slope_gpus_per_day"] == pytest.approx(86.4, rel=1e-6)
    # the peak of a rising line over 30 days is at its last hourly step: 59 s + 720 h after the first point
    assert out["horizons"][1]["peak_gpus"] == pytest.approx(3.0 + 0.001 * (59 + 720 * 3600), abs=1e-3)
