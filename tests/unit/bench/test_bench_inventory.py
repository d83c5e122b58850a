"""The inventory benchmark's arithmetic and report: pure parts, no servers."""

from __future__ import annotations

import math

import pytest

from libs.bench.inventory import BEGIN, END, Level, markdown, quantile, write_section

INF = math.inf


def test_quantiles_come_from_the_observations_between_two_scrapes() -> None:
    before = [(0.1, 50.0), (0.5, 50.0), (1.0, 50.0), (INF, 50.0)]  # 50 old observations, all ≤ 0.1 s
    after = [(0.1, 50.0), (0.5, 150.0), (1.0, 150.0), (INF, 150.0)]  # 100 new ones, all in (0.1, 0.5]
    assert quantile(before, after, 0.5) == pytest.approx(0.3)
    assert quantile(before, after, 0.99) == pytest.approx(0.1 + 0.4 * 0.99)
    assert math.isnan(quantile(after, after, 0.99))  # nothing new


def test_a_quantile_beyond_the_last_finite_bucket_reports_that_bound() -> None:
    assert quantile([], [(1.0, 10.0), (INF, 100.0)], 0.99) == 1.0


def level(**over) -> Level:  # type: ignore[no-untyped-def]
    base = dict(gpus=10_000, nodes=1_250, agents=4, interval_s=1.0, window_s=60.0, published_per_s=10_000.0,
                ingested_per_s=9_990.0, lag_p50_s=0.4, lag_p99_s=1.2, backlog_start=10, backlog_end=40)
    return Level(**{**base, **over})


def test_keeping_up_needs_the_rate_a_flat_backlog_and_a_short_lag() -> None:
    assert level().keeps_up
    assert not level(ingested_per_s=9_000.0).keeps_up
    assert not level(backlog_end=10 + 1_251).keeps_up
    assert not level(lag_p99_s=6.0).keeps_up
    # the agents must keep their cadence: GPU samples taken (sent or left out as unchanged) ≈ the fleet per interval
    assert level(taken_per_s=9_600.0, published_per_s=5_000.0, ingested_per_s=5_000.0).keeps_up
    assert not level(taken_per_s=6_000.0, published_per_s=3_000.0, ingested_per_s=3_000.0).keeps_up


def test_the_report_says_plainly_when_the_largest_fleet_is_not_sustained(tmp_path) -> None:  # type: ignore[no-untyped-def]
    levels = [level(ingested_per_s=6_000.0, backlog_end=50_000, lag_p99_s=40.0, taken_per_s=10_000.0,
                    sent_share=0.55),
              level(heartbeat_s=0.0, ingested_per_s=4_000.0, lag_p99_s=60.0), level(gpus=5_000, nodes=625)]
    text = markdown(levels, "gpupool bench inventory --gpus 10000 5000 --heartbeat 5 0", (1.0, 1.0, 1.0))
    assert text.startswith(BEGIN) and text.endswith(END)
    assert ("10,000 GPUs every second with sampling by change (heartbeat 5 s): **did not keep up**" in text
            and "10,000 GPUs every second with every sample sent: **did not keep up**" in text)
    assert "The largest fleet that kept up here was 5,000 GPUs (heartbeat 5 s)" in text
    assert "| 10,000 (1,250) | 5 s | 10,000 (55 %) | 10,000 | 6,000 |" in text and "**no**" in text
    assert "| 10,000 (1,250) | off |" in text
    doc = tmp_path / "benchmarks.md"
    doc.write_text("# Benchmarks\n\nother section\n")
    write_section(doc, text)
    write_section(doc, markdown([level()], "again", (0.0, 0.0, 0.0)))
    written = doc.read_text()
    assert written.count(BEGIN) == 1 and "other section" in written and "kept up" in written


def test_cpu_of_a_group_counts_survivors_by_difference_and_newcomers_whole() -> None:
    from libs.bench.inventory import cpu_used

    assert cpu_used({1: 10.0, 2: 5.0}, {1: 12.5, 3: 1.0}) == 3.5  # pid 2 exited (missed), pid 3 is new


def test_cpu_per_gpu_sample_is_cpu_time_over_samples_ingested() -> None:
    lv = level(ingested_per_s=10_000.0, cpu_pct={"inventory": 20.0, "postgresql": 9.0})
    assert lv.cpu_us_per_gpu_sample("inventory") == pytest.approx(20.0)  # 0.2 CPU s/s over 10,000 samples/s
    assert lv.cpu_us_per_gpu_sample("postgresql") == pytest.approx(9.0)
    assert lv.cpu_us_per_gpu_sample("nats") == 0.0
    assert math.isnan(level(ingested_per_s=0.0).cpu_us_per_gpu_sample("inventory"))
    assert "| 20.0 / 9.0 / 0.0 / 0.0 |" in markdown([lv], "cmd", (0.0, 0.0, 0.0))
