"""The deep-backlog benchmark's report: pure parts, no platform."""

from __future__ import annotations

from libs.bench.backlog import BEGIN, END, cycle_sums, markdown


def row(depth: int, p50: float, placement: float, cycle: float | None = 20.0) -> dict:
    return {"depth": depth, "turnovers": 30, "submit_per_s": 200.0, "next_start_p50_ms": p50,
            "next_start_p90_ms": p50 * 2, "next_start_max_ms": p50 * 3, "turnovers_per_s": 5.0,
            "cycles_per_turnover": 1.5, "cycle_mean_ms": cycle,
            "cpu_ms_per_turnover": {"placement": placement, "postgres": 10.0}}


def test_the_deepest_backlog_is_compared_with_the_first_run_of_the_same_command() -> None:
    text = markdown([row(100, 40.0, 10.0), row(10_000, 120.0, 50.0, None)], "gpupool bench backlog")
    assert text.startswith(BEGIN) and text.endswith(END)
    assert "| 100 | 40 ms | 80 ms | 120 ms | 10.0 | 10.0 | 1.50 | 20.0 ms |" in text
    assert "| 10000 | 120 ms | 240 ms | 360 ms | 50.0 | 10.0 | 1.50 | – |" in text
    assert "From 100 to 10000 waiting jobs (100x as many): the next job starts 3.0x later at the median, " \
           "and placement spends 5.0x the CPU per turnover." in text


def test_a_single_depth_has_no_ratio() -> None:
    assert "From " not in markdown([row(1000, 40.0, 10.0)], "gpupool bench backlog --depths 1000")


def test_the_mean_cycle_is_split_into_its_parts_where_placement_reports_them() -> None:
    parts = row(100, 40.0, 10.0, 120.0) | {"cycle_parts_mean_ms": {"store": 42.0, "load": 8.2, "core": 69.6}}
    assert "| 1.50 | 120.0 ms (load 8 · core 70 · store 42) |" in markdown([parts], "gpupool bench backlog")


def test_placement_metrics_are_summed_per_part() -> None:
    text = "\n".join([
        "# HELP gpupool_scheduling_cycle_seconds x",
        'gpupool_scheduling_cycle_seconds_count{policy="default"} 4.0',
        'gpupool_scheduling_cycle_seconds_sum{policy="default"} 0.5',
        'gpupool_scheduling_cycle_seconds_bucket{le="0.1",policy="default"} 3.0',
        'gpupool_scheduling_cycle_part_seconds_sum{part="load"} 0.1',
        'gpupool_scheduling_cycle_part_seconds_count{part="load"} 4.0',
        'gpupool_scheduling_cycle_part_seconds_sum{part="store"} 0.25',
    ])
    assert cycle_sums(text) == {"cycles": 4.0, "total": 0.5, "load": 0.1, "store": 0.25}


def test_the_wait_for_the_consumers_is_stated_and_a_deadline_that_cut_it_short_too() -> None:
    settled = [row(100, 40.0, 10.0) | {"settle_s": 12.4, "unsettled_events": 0},
               row(10_000, 90.0, 20.0) | {"settle_s": 31.0, "unsettled_events": 0}]
    assert "what the fill published (up to 31 s), running jobs" in markdown(settled, "gpupool bench backlog")
    cut = [settled[0], settled[1] | {"settle_s": 600.0, "unsettled_events": 812}]
    assert "(up to 600 s; still pending at the deadline: 812 at depth 10000)" in markdown(cut, "gpupool bench backlog")
    assert "what the fill published, running jobs" in markdown([row(100, 40.0, 10.0)], "gpupool bench backlog")


def test_every_turnover_is_published_in_order() -> None:
    text = markdown([row(100, 40.0, 10.0) | {"next_start_ms": [41.2, 38.9, 2011.0]}], "gpupool bench backlog")
    assert "Every turnover at 100 waiting, in order (ms): 41, 39, 2011." in text
