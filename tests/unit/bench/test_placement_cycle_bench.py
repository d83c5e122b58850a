"""`gpupool bench placement-cycle`'s fleet: the running allocations hold every GPU exactly, each on one node, and a
size that cannot be filled is refused."""

from __future__ import annotations

from collections import Counter

import pytest

from libs.bench.placement_cycle import render
from services.placement.cyclebench import GPUS_PER_NODE, pack, running_sizes


def test_the_running_allocations_fill_every_gpu_once_each_on_one_node() -> None:
    sizes = running_sizes(6000, 1024 * GPUS_PER_NODE)
    assert len(sizes) == 6000 and sum(sizes) == 8192 and set(sizes) == {1, 2, 4, 8}
    placed = pack(sizes, 1024)
    held = Counter((n, g) for n, gpus in placed for g in gpus)
    assert len(held) == 8192 and set(held.values()) == {1}
    assert all(len(gpus) == size for size, (_, gpus) in zip(sizes, placed, strict=True))


@pytest.mark.parametrize(("allocations", "gpus"), [(10, 9), (10, 81)])
def test_a_fleet_the_allocations_cannot_fill_exactly_is_refused(allocations: int, gpus: int) -> None:
    with pytest.raises(ValueError):
        running_sizes(allocations, gpus)


def test_the_report_names_every_phase() -> None:
    phases = {"load_s": 0.1, "build_s": 0.02, "core_s": 0.2, "store_s": 0.3, "cpu_s": 0.4}
    text = render({"nodes": 4, "running": 20, "waiting": 10, "turnovers": 2, "placed": 2,
                   "cold": {"total_s": 1.0, **phases}, "steady": {"cycle_s": 0.6, "next_job_s": 0.65, **phases},
                   "steady_p90": {"cycle_s": 0.7, "next_job_s": 0.75, **phases}})
    assert "| turnover, median | 600 | 100 | 20 | 200 | 300 | 400 |" in text and "load average not measured" in text
    loaded = render({"nodes": 4, "running": 20, "waiting": 10, "turnovers": 2, "placed": 2, "load_avg": [3.25, 4.0],
                     "cold": {"total_s": 1.0, **phases}, "steady": {"cycle_s": 0.6, "next_job_s": 0.65, **phases},
                     "steady_p90": {"cycle_s": 0.7, "next_job_s": 0.75, **phases}})
    assert "load average 3.2 at the first cycle, 4.0 at the last" in loaded and "median 650 ms; 2 of 2" in text
