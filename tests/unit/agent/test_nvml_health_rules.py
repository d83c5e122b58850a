from __future__ import annotations

import pytest

from services.agent.nvml_types import (
    SBE_STORM_RATE_PER_MIN,
    SbeRateTracker,
    classify_xid,
    derive_health,
)


def test_a_gpu_with_no_signals_is_healthy():
    assert derive_health() == ("healthy", ())


@pytest.mark.parametrize("xid", [48, 64, 74, 79, 95])
def test_fatal_xids_mark_the_gpu_failed(xid):
    health, reasons = derive_health(xid_events=[xid])
    assert health == "failed"
    assert reasons[0].startswith(f"xid{xid}:")


@pytest.mark.parametrize("xid", [63, 92, 94])
def test_degrading_xids_mark_the_gpu_degraded(xid):
    health, reasons = derive_health(xid_events=[xid])
    assert health == "degraded"
    assert reasons[0].startswith(f"xid{xid}:")


@pytest.mark.parametrize("xid", [13, 31, 43, 45])
def test_application_level_xids_leave_the_gpu_healthy(xid):
    assert classify_xid(xid) == "healthy"
    assert derive_health(xid_events=[xid]) == ("healthy", ())


def test_double_bit_ecc_errors_fail_the_gpu_even_without_an_xid():
    assert derive_health(ecc_volatile_dbe=2) == ("failed", ("ecc_dbe:2",))


def test_pending_page_retirement_degrades_the_gpu():
    assert derive_health(retired_pages_pending=True) == ("degraded", ("retired_pages_pending",))


def test_reaching_the_slowdown_temperature_degrades_the_gpu():
    assert derive_health(temperature_c=86.0, slowdown_temp_c=87.0)[0] == "healthy"
    health, reasons = derive_health(temperature_c=87.0, slowdown_temp_c=87.0)
    assert health == "degraded"
    assert reasons == ("temperature_at_slowdown:87C>=87C",)


def test_thermal_throttling_degrades_but_power_capping_does_not():
    assert derive_health(throttle_reasons=["sw_power_cap", "gpu_idle"])[0] == "healthy"
    assert derive_health(throttle_reasons=["hw_thermal_slowdown"]) == (
        "degraded",
        ("throttle:hw_thermal_slowdown",),
    )


def test_a_single_bit_ecc_storm_degrades_the_gpu():
    assert derive_health(sbe_rate_per_min=SBE_STORM_RATE_PER_MIN - 1)[0] == "healthy"
    assert derive_health(sbe_rate_per_min=SBE_STORM_RATE_PER_MIN * 3)[0] == "degraded"


def test_failed_outranks_degraded_and_every_reason_is_kept():
    health, reasons = derive_health(
        xid_events=[79, 63, 13],
        retired_pages_pending=True,
        gpu_lost=True,
    )
    assert health == "failed"
    assert reasons == (
        "gpu_lost",
        "xid63:row_remap_or_page_retirement_pending",
        "xid79:gpu_fallen_off_the_bus",
        "retired_pages_pending",
    )


def test_sbe_rate_tracker_reports_errors_per_minute_and_restarts_after_a_counter_reset():
    tracker = SbeRateTracker(window_s=60)
    assert tracker.update(0.0, 100) is None
    assert tracker.update(30.0, 110) == pytest.approx(20.0)
    assert tracker.update(60.0, 130) == pytest.approx(30.0)
    # the counter went backwards (GPU reset): start over rather than report a negative rate
    assert tracker.update(90.0, 0) is None
    assert tracker.update(120.0, 5) == pytest.approx(10.0)
