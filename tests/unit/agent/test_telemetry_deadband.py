"""Sampling by change (services/agent/domain.py `telemetry_due`): which GPU samples of a node go on the bus, and
the simulated background load a load test's fleet carries."""

from __future__ import annotations

from dataclasses import replace

import pytest

from services.agent.domain import Deadband, background_load, gpu_changed, telemetry_due
from services.agent.nvml_types import GpuSample

BAND = Deadband(heartbeat_s=5.0, util_pct=10.0, memory_mib=512.0, temperature_c=3.0, power_w=25.0)


def gpu(index: int, **fields) -> GpuSample:  # type: ignore[no-untyped-def]
    base = dict(uuid=f"GPU-{index}", index=index, timestamp=0.0, utilization_gpu_pct=50.0,
                utilization_memory_pct=30.0, memory_used_mib=40_000, memory_total_mib=81_559, temperature_c=60.0,
                power_w=400.0, sm_clock_mhz=1980, ecc_volatile_sbe=0, ecc_volatile_dbe=0,
                retired_pages_pending=False, xid_events=(), throttle_reasons=(), process_count=1, health="healthy")
    return GpuSample(**{**base, **fields})


SENT = {g.uuid: g for g in (gpu(0), gpu(1))}


def due(now: list[GpuSample], at: float = 2.0, band: Deadband = BAND, heartbeat_at: float | None = 0.0):  # type: ignore[no-untyped-def]
    return telemetry_due(SENT, heartbeat_at, now, at, band, 1.0)


def test_a_node_whose_gpus_stay_within_the_deadband_sends_nothing_until_its_heartbeat() -> None:
    steady = [gpu(0, utilization_gpu_pct=59.0, memory_used_mib=40_400, temperature_c=62.0, power_w=420.0),
              gpu(1, utilization_memory_pct=39.0, throttle_reasons=("sw_power_cap",))]
    assert due(steady, at=1.0) is None
    assert due(steady, at=4.0) is None
    assert due(steady, at=4.5) == steady  # the 5th interval: a heartbeat of 5 s is every 5th sample
    assert due(steady, at=9.0) == steady  # late (a skipped tick): due all the more


@pytest.mark.parametrize("moved", [
    {"utilization_gpu_pct": 60.0}, {"utilization_gpu_pct": 40.0}, {"utilization_memory_pct": 40.0},
    {"memory_used_mib": 40_512}, {"temperature_c": 57.0}, {"power_w": 425.0}, {"power_w": None},
    {"utilization_gpu_pct": None}, {"xid_events": (13,)}, {"ecc_volatile_sbe": 1}, {"ecc_volatile_dbe": 1},
    {"retired_pages_pending": True}, {"process_count": 0}, {"health": "degraded"},
    {"health_reasons": ("sbe_storm",)},
])
def test_a_gpu_that_moved_beyond_its_band_or_changed_what_health_acts_on_is_sent_alone(moved: dict) -> None:
    changed = gpu(1, **moved)
    assert gpu_changed(SENT["GPU-1"], changed, BAND)
    assert due([gpu(0), changed]) == [changed]  # only that GPU: the other one is unchanged


def test_the_band_is_against_the_last_sent_values_so_a_slow_drift_is_sent_once_it_adds_up() -> None:
    assert not gpu_changed(SENT["GPU-0"], gpu(0, temperature_c=62.9), BAND)
    assert gpu_changed(SENT["GPU-0"], gpu(0, temperature_c=63.0), BAND)


def test_every_gpu_is_sent_the_first_time_and_with_sampling_by_change_off() -> None:
    now = [gpu(0), gpu(1)]
    assert due(now, heartbeat_at=None) == now
    assert telemetry_due({}, 0.0, now, 1.0, BAND, 1.0) == now  # never sent: sent at once
    off = replace(BAND, heartbeat_s=0.0)
    assert not off.on and due(now, at=0.5, band=off) == now


def test_background_load_gives_each_kind_about_its_share_stably() -> None:
    uuids = [f"GPU-{i}" for i in range(4000)]
    load = background_load("training=0.5,inference=0.25,dev=0.15", uuids, seed=3)
    assert load == background_load("training=0.5,inference=0.25,dev=0.15", uuids, seed=3)
    counts = {k: sum(1 for v in load.values() if v == k) / len(uuids) for k in ("training", "inference", "dev")}
    assert counts == pytest.approx({"training": 0.5, "inference": 0.25, "dev": 0.15}, abs=0.03)
    assert 0.07 < 1 - len(load) / len(uuids) < 0.13  # the rest free
    assert background_load("", uuids, seed=3) == {}
