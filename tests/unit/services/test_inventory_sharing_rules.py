"""Inventory's rule for an operator's sharing-mode change: what the GPU can do, and never under held work."""

from __future__ import annotations

from services.inventory.domain import sharing_change


def test_mig_needs_a_model_with_mig_profiles() -> None:
    refused = sharing_change("L40S", "exclusive", None, "mig", held=False)
    assert (refused.outcome, refused.code) == ("refused", "SharingModeUnsupported")
    assert "L40S has no MIG profiles" in refused.message and "H100-80GB" in refused.message
    assert sharing_change("H100-80GB", "exclusive", None, "mig", held=False).outcome == "apply"
    assert sharing_change("L40S", "exclusive", None, "fractional", held=False).outcome == "apply"


def test_a_gpu_that_holds_work_is_drained_first() -> None:
    assert sharing_change("H100-80GB", "mig", None, "exclusive", held=True).outcome == "drain"
    assert sharing_change("H100-80GB", "mig", "exclusive", "fractional", held=True).outcome == "drain"  # replaced
    assert sharing_change("H100-80GB", "mig", "exclusive", "exclusive", held=False).outcome == "apply"


def test_asking_for_the_current_mode_calls_a_waiting_change_off() -> None:
    assert sharing_change("H100-80GB", "mig", None, "mig", held=True).outcome == "unchanged"
    assert sharing_change("H100-80GB", "mig", "exclusive", "mig", held=True).outcome == "apply"
