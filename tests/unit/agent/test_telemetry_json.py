"""The agent builds its telemetry CloudEvent as plain JSON (the hot path of a simulated fleet): byte for byte the
document the pydantic models would write, for healthy, busy, faulty, MIG-mode and fallen-off-the-bus GPUs, and one
inventory's contract accepts."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from libs.contracts.envelope import parse_envelope
from libs.contracts.events import TelemetrySampled, decode_data
from services.agent.domain import telemetry, telemetry_json
from services.agent.nvml_sim import SimulatedNvml


@pytest.mark.parametrize("at", [1_764_489_600.0, 1_764_489_600.123456, 1_764_489_601.5])
def test_the_plain_json_telemetry_is_the_models_document(clock, at: float) -> None:
    sim = SimulatedNvml("n-3", ["H100-80GB"] * 6 + ["A100-80GB"] * 2, seed=5, clock=clock, mig_mode=[6])
    sim.open()
    sim.set_workload(sim.node_info().gpus[0].uuid, "training")
    sim.inject_fault(1, "xid13")
    sim.inject_fault(2, "xid79")
    sim.inject_fault(3, "sbe_storm")
    for _ in range(8):
        clock.advance(5)
        samples = sim.sample()
        now = datetime.fromtimestamp(at + 0.25, UTC)
        expected = telemetry("local", "n-3", samples, at).to_cloudevent("/gpupool/agent", event_id="e-1",
                                                                        time=now).to_json()
        assert telemetry_json("local", "n-3", samples, at, event_id="e-1", source="/gpupool/agent",
                              now=now) == expected
    data = decode_data(parse_envelope(expected))
    assert isinstance(data, TelemetrySampled) and len(data.gpus) == 8
    assert data.gpus[2].health != "healthy"  # the faults are in the document compared above
