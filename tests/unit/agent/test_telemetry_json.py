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
from services.agent.nvml_types import NodeSample


@pytest.mark.parametrize("at", [1_764_489_600.0, 1_764_489_600.123456, 1_764_489_601.5])
def test_the_plain_json_telemetry_is_the_models_document(clock, at: float) -> None:
    sim = SimulatedNvml("n-3", ["H100-80GB"] * 6 + ["A100-80GB"] * 2, seed=5, clock=clock, mig_mode=[6])
    sim.open()
    sim.set_workload(sim.node_info().gpus[0].uuid, "training")
    sim.inject_fault(1, "xid13")
    sim.inject_fault(2, "xid79")
    sim.inject_fault(3, "sbe_storm")
    for i in range(8):
        clock.advance(5)
        samples = sim.sample()
        host = sim.node_sample() if i % 2 else None  # with the node's facts, and without (a backend that failed)
        now = datetime.fromtimestamp(at + 0.25, UTC)
        expected = telemetry("local", "n-3", samples, at, host).to_cloudevent("/gpupool/agent", event_id="e-1",
                                                                              time=now).to_json()
        assert telemetry_json("local", "n-3", samples, at, event_id="e-1", source="/gpupool/agent",
                              now=now, host=host) == expected
    data = decode_data(parse_envelope(expected))
    assert isinstance(data, TelemetrySampled) and len(data.gpus) == 8
    assert data.gpus[2].health != "healthy"  # the faults are in the document compared above
    assert data.cpu_util_pct == host.cpu_util_pct and data.network_rx_mbps == host.network_rx_mbps > 0
    assert data.memory_used_mib == host.memory_used_mib and data.storage_used_gib == host.storage_used_gib > 0


@pytest.mark.parametrize("host", [
    NodeSample(),
    NodeSample(cpu_util_pct=0, memory_used_mib=0, network_rx_mbps=0, network_tx_mbps=0, storage_used_gib=0),
    NodeSample(cpu_util_pct=99.95, memory_used_mib=2_000_000, network_rx_mbps=0.001, network_tx_mbps=3_200_000.5,
               storage_used_gib=123456.789),
])
def test_the_node_fields_are_written_as_the_models_write_them(clock, host: NodeSample) -> None:
    """Ints where floats are declared (a real host can give 0), small and large floats: same bytes. (Backends round
    to 0.001 at most, so no float reaches the exponent notation where json and pydantic differ.)"""
    sim = SimulatedNvml("n-1", ["L4"], seed=1, clock=clock)
    sim.open()
    samples = sim.sample()
    now = datetime.fromtimestamp(1_764_489_600.5, UTC)
    expected = telemetry("c", "n-1", samples, 1_764_489_600.0, host).to_cloudevent(
        "/gpupool/agent", event_id="e-2", time=now).to_json()
    assert telemetry_json("c", "n-1", samples, 1_764_489_600.0, event_id="e-2", source="/gpupool/agent", now=now,
                          host=host) == expected


def test_the_telemetry_event_carries_its_traceparent_as_the_models_write_it(clock) -> None:
    """Every CloudEvent sets `traceparent` (the bus contract): the sampler's unsampled context, here given."""
    sim = SimulatedNvml("n-1", ["L4"], seed=1, clock=clock)
    sim.open()
    samples = sim.sample()
    now = datetime.fromtimestamp(1_764_489_600.5, UTC)
    parent = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-00"
    expected = telemetry("c", "n-1", samples, 1_764_489_600.0).to_cloudevent(
        "/gpupool/agent", event_id="e-3", time=now, traceparent=parent).to_json()
    written = telemetry_json("c", "n-1", samples, 1_764_489_600.0, event_id="e-3", source="/gpupool/agent", now=now,
                             traceparent=parent)
    assert written == expected
    assert parse_envelope(written).traceparent == parent
