"""Accounting's pure rules: exact GPU time, shares, prices with effective dates, demand peaks and the forecast."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from decimal import Decimal

import pytest
from hypothesis import given
from hypothesis import strategies as st

from libs.contracts.events import AllocatedGpu, AllocationReleased, JobSubmitted
from services.accounting.domain import (
    BucketLevels,
    Rate,
    allocation_sharing,
    bucket_peaks,
    demand_milli,
    fold_pieces,
    gpu_milli_us,
    held_us,
    linear_forecast,
    mig_share_milli,
    piece_cost,
    rate_in_force,
    requested_model,
    segment_bounds,
    sharing_of,
    utilization_series,
)

T0 = datetime(2026, 3, 1, tzinfo=UTC)


def t(minutes: float) -> datetime:
    return T0 + timedelta(minutes=minutes)


def released(gpus: list[AllocatedGpu], start: datetime, end: datetime) -> AllocationReleased:
    return AllocationReleased(allocation_id="a", job_id="j", team="t", project="p", cluster="c", node="n", gpus=gpus,
                              granted_at=start, released_at=end, reason="JobCompleted")


def gpu(i: int, **kw: object) -> AllocatedGpu:
    return AllocatedGpu(uuid=f"g{i}", index=i, model="H100-80GB", **kw)  # type: ignore[arg-type]


def test_held_time_is_whole_microseconds_and_never_negative() -> None:
    assert held_us(t(0), t(0) + timedelta(seconds=1, microseconds=7)) == 1_000_007
    assert held_us(t(5), t(0)) == 0


def test_an_allocation_counts_each_gpu_by_its_share() -> None:
    whole = released([gpu(0), gpu(1)], t(0), t(60))
    assert gpu_milli_us(whole) == 3600 * 10**6 * 2000
    mixed = released([gpu(0, share_milli=250), gpu(1, share_milli=429, mig_profile="3g.40gb")], t(0), t(1))
    assert gpu_milli_us(mixed) == 60 * 10**6 * 679
    assert [sharing_of(g) for g in mixed.gpus] == ["fraction", "mig"]
    assert allocation_sharing(mixed) == "mixed" and allocation_sharing(whole) == "whole"


@given(st.lists(st.tuples(st.integers(0, 10**9), st.integers(0, 10**9), st.integers(1, 1000)), min_size=1,
                max_size=20))
def test_ledger_sum_equals_the_sum_of_release_minus_grant_times_share(spans: list[tuple[int, int, int]]) -> None:
    total = 0
    expected = Decimal(0)
    for a, b, share in spans:
        start, end = T0 + timedelta(microseconds=min(a, b)), T0 + timedelta(microseconds=max(a, b))
        total += gpu_milli_us(released([gpu(0, share_milli=share)], start, end))
        expected += (Decimal((end - start) / timedelta(microseconds=1))) * share
    assert Decimal(total) == expected


def test_demand_of_a_queued_job_by_shape() -> None:
    base = dict(job_id="j", name="j", team="t", project="p", kind="training", priority_class="normal", priority=1,
                submitted_at=T0)
    assert demand_milli(JobSubmitted(**base, gpus=16, gang_nodes=2, gpus_per_node=8)) == 16_000
    assert demand_milli(JobSubmitted(**base, gpus=2, replicas=3)) == 6_000
    assert demand_milli(JobSubmitted(**base, gpus=1, gpu_fraction_milli=250)) == 250
    assert demand_milli(JobSubmitted(**base, gpus=1, mig_profile="1g.10gb")) == mig_share_milli("1g.10gb") == 143
    assert requested_model(JobSubmitted(**base, gpus=1, gpu_models=["A100-80GB"])) == "A100-80GB"
    assert requested_model(JobSubmitted(**base, gpus=1, gpu_models=["A100-80GB", "H100-80GB"])) == "any"


RATES = [Rate("H100-80GB", "", t(-100), Decimal("2.00")), Rate("H100-80GB", "", t(30), Decimal("3.00")),
         Rate("A100-80GB", "3g.40gb", t(0), Decimal("0.70")), Rate("A100-80GB", "", t(-100), Decimal("1.40"))]


def test_a_range_is_cut_where_a_price_takes_effect() -> None:
    assert segment_bounds(t(0), t(60), RATES) == [(t(0), t(30)), (t(30), t(60))]
    assert segment_bounds(t(40), t(60), RATES) == [(t(40), t(60))]
    assert rate_in_force(RATES, "H100-80GB", "", t(29)).price_per_hour == Decimal("2.00")  # type: ignore[union-attr]
    assert rate_in_force(RATES, "H100-80GB", "", t(30)).price_per_hour == Decimal("3.00")  # type: ignore[union-attr]
    assert rate_in_force(RATES, "H100-80GB", "", t(-101)) is None


def test_mig_slices_pay_their_profile_price_and_fall_back_to_a_share_of_the_gpu_price() -> None:
    hour_us = 3600 * 10**6
    assert piece_cost(RATES, "A100-80GB", "3g.40gb", t(0), hour_us, hour_us * 429) == Decimal("0.70")
    # before the profile had its own price, the slice paid 0.429 of the GPU-hour price
    assert piece_cost(RATES, "A100-80GB", "3g.40gb", t(-10), hour_us, hour_us * 429) == Decimal("1.40") * Decimal(
        "0.429")
    assert piece_cost(RATES, "H100-80GB", "", t(0), hour_us, hour_us * 500) == Decimal("1.00")
    assert piece_cost(RATES, "L40S", "", t(0), hour_us, hour_us * 1000) is None


def test_pieces_fold_into_groups_with_each_segment_priced_at_its_own_rate() -> None:
    bounds = segment_bounds(t(0), t(60), RATES)
    half_hour = 1800 * 10**6
    pieces = [
        {"team": "a", "_model": "H100-80GB", "_profile": "", "_seg": 0, "inst_us": half_hour,
         "milli_us": half_hour * 1000, "measured_milli_us": 0, "used_milli_us": 0, "idle_milli_us": 0},
        {"team": "a", "_model": "H100-80GB", "_profile": "", "_seg": 1, "inst_us": half_hour,
         "milli_us": half_hour * 1000, "measured_milli_us": half_hour * 1000, "used_milli_us": half_hour * 400,
         "idle_milli_us": 0},
        {"team": "b", "_model": "L40S", "_profile": "", "_seg": 0, "inst_us": half_hour,
         "milli_us": half_hour * 1000, "measured_milli_us": 0, "used_milli_us": 0, "idle_milli_us": 0},
    ]
    folded = fold_pieces(pieces, ["team"], bounds, RATES)
    assert folded[("a",)].cost == Decimal("2.5") and folded[("a",)].milli_us == 2 * half_hour * 1000
    assert folded[("b",)].cost == 0 and folded[("b",)].unpriced_milli_us == half_hour * 1000


def test_bucket_peaks_carry_a_level_into_buckets_that_start_before_their_first_event() -> None:
    starts = [t(0), t(60), t(120), t(180)]
    levels = [BucketLevels(0, 2.0, 2.0, t(10)),  # two GPUs from minute 10
              BucketLevels(2, 1.0, 0.0, t(130))]  # at 130 one goes (level 1), later the other (0)
    assert bucket_peaks(levels, 4, starts) == [2.0, 2.0, 2.0, 0.0]
    at_start = [BucketLevels(0, 3.0, 3.0, t(0)), BucketLevels(1, 1.0, 1.0, t(60))]  # drops exactly at 60
    assert bucket_peaks(at_start, 2, starts) == [3.0, 1.0]


@pytest.mark.parametrize(("ys", "supply", "status"), [
    ([1, 2, 3], 10, "will_exceed"), ([5, 4, 3], 10, "ok"), ([2, 3, 11], 10, "exceeds"), ([4], 10,
                                                                                         "insufficient_data")])
def test_linear_forecast_says_when_demand_crosses_supply(ys: list[float], supply: float, status: str) -> None:
    day = 86400.0
    points = [(i * day, float(y)) for i, y in enumerate(ys)]
    out = linear_forecast(points, supply, now_s=points[-1][0])
    assert out["status"] == status
    if status == "will_exceed":
        assert out["slope_per_day"] == pytest.approx(1.0)
        assert out["exceeds_at_s"] == pytest.approx(9 * day)  # 1 + 1/day × t reaches 10 on day 9


def test_utilization_series_has_every_bucket_weighted_means_and_gpus_per_bucket_length() -> None:
    start = datetime(2026, 1, 1, tzinfo=UTC)
    minute_us = 60 * 10**6
    rows = [  # bucket 0: 2 GPUs × 60 s at 30 % and 70 % (one idle minute at 2 % counted as idle weight)
        {"bucket": 0, "weight": 2 * minute_us * 1000, "util_weight": minute_us * 1000 * (30 + 70),
         "idle_weight": 0, "util_max": 70.0, "allocations": 1},
        {"bucket": 2, "weight": minute_us * 500, "util_weight": minute_us * 500 * 2.0, "idle_weight": minute_us * 500,
         "util_max": 2.0, "allocations": 1}]
    # 2.5 minutes in 1-minute buckets: the last one lasts 30 s, so half a GPU for its 60 s reads as one GPU
    out = utilization_series(rows, start, start + timedelta(seconds=150), 60)
    assert [p["start"] for p in out["points"]] == [(start + timedelta(minutes=i)).isoformat() for i in range(3)]
    assert [p["utilization_pct"] for p in out["points"]] == [50.0, None, 2.0]
    assert [p["gpus"] for p in out["points"]] == [2.0, 0.0, 1.0]
    assert [p["idle_pct"] for p in out["points"]] == [0.0, None, 100.0]
    assert out["points"][1] == {"start": (start + timedelta(minutes=1)).isoformat(), "utilization_pct": None,
                                "max_utilization_pct": None, "idle_pct": None, "gpus": 0.0, "allocations": 0}
    assert out["avg_utilization_pct"] == round((100 * 1000 + 2 * 500) / 2500, 3)
    assert out["max_utilization_pct"] == 70.0 and out["idle_pct"] == 20.0
    assert out["measured_gpu_hours"] == round(2.5 / 60, 6)
    empty = utilization_series([], start, start, 60)
    assert empty["points"] == [] and empty["avg_utilization_pct"] is None and empty["measured_gpu_hours"] == 0
