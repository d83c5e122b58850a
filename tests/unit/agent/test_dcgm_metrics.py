"""The agent's /metrics in dcgm-exporter's naming: a scrape parses, and every GPU of every simulated node has every
DCGM series with its gpu/UUID/Hostname labels and the sampled values."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from services.agent.dcgm_metrics import METRIC_NAMES, DcgmMetrics, dcgm_pci_bus_id
from services.agent.handlers import NodeAgent
from services.agent.nvml_sim import SimulatedNvml

FLEET = {"sim-node-0": ["H100-80GB"] * 8, "sim-node-1": ["L40S"] * 4 + ["T4"] * 2}


class FakeJetStream:
    def __init__(self) -> None:
        self.published: list[str] = []

    async def publish(self, subject: str, payload: bytes, **_: object) -> SimpleNamespace:
        self.published.append(subject)
        return SimpleNamespace(stream="GPUPOOL_TELEMETRY", seq=len(self.published))


class FakeNats:
    def __init__(self) -> None:
        self.js = FakeJetStream()

    def jetstream(self) -> FakeJetStream:
        return self.js


def scrape(registry: CollectorRegistry) -> dict[str, dict[tuple[str, str], tuple[dict[str, str], float]]]:
    """Render the registry as Prometheus text, parse it back: {metric: {(Hostname, UUID): (labels, value)}}."""
    text = generate_latest(registry).decode()
    out: dict[str, dict[tuple[str, str], tuple[dict[str, str], float]]] = {}
    for family in text_string_to_metric_families(text):
        assert family.type == "gauge", family.name
        for s in family.samples:
            out.setdefault(s.name, {})[(s.labels["Hostname"], s.labels["UUID"])] = (s.labels, s.value)
    return out


@pytest.fixture
def fleet(clock):
    sims = {node: SimulatedNvml(node, models, seed=7 + i, clock=clock) for i, (node, models) in
            enumerate(FLEET.items())}
    for sim in sims.values():
        sim.open()
    return sims


async def sample_fleet(agents: list[NodeAgent]) -> None:
    for agent in agents:
        await agent.sample_once()


async def test_every_gpu_of_every_node_has_every_dcgm_series_with_its_labels_and_values(fleet, clock) -> None:
    registry = CollectorRegistry()
    metrics = DcgmMetrics(registry)
    nats = FakeNats()
    agents = [NodeAgent(nats, sim, "local", node, 1.0, metrics=metrics) for node, sim in fleet.items()]  # type: ignore[arg-type]
    busy = fleet["sim-node-0"].node_info().gpus[3].uuid
    fleet["sim-node-0"].set_workload(busy, "training")
    fleet["sim-node-1"].inject_fault(1, "sbe_storm")
    for _ in range(12):  # past the training start-up ramp
        clock.advance(5)
        await sample_fleet(agents)
    # the last sample, as each backend produced it, is what the gauges must show
    expected = {}
    for agent, (node, sim) in zip(agents, fleet.items(), strict=True):
        clock.advance(5)
        samples = sim.sample()
        agent.update_metrics(samples)
        expected[node] = samples

    series = scrape(registry)
    assert set(series) == set(METRIC_NAMES)
    assert len(nats.js.published) == 2 * 12  # telemetry still went out on every sample

    for node, sim in fleet.items():
        info = sim.node_info()
        for gpu, s in zip(info.gpus, expected[node], strict=True):
            for name in METRIC_NAMES:
                labels, _ = series[name][(node, gpu.uuid)]
                assert labels == {"gpu": str(gpu.index), "UUID": gpu.uuid, "device": f"nvidia{gpu.index}",
                                  "pci_bus_id": dcgm_pci_bus_id(gpu.pci_bus_id), "modelName": gpu.name,
                                  "Hostname": node, "DCGM_FI_DRIVER_VERSION": "550.90.07"}
            value = {name: series[name][(node, gpu.uuid)][1] for name in METRIC_NAMES}
            assert value["DCGM_FI_DEV_GPU_UTIL"] == s.utilization_gpu_pct
            assert value["DCGM_FI_DEV_MEM_COPY_UTIL"] == s.utilization_memory_pct
            assert value["DCGM_FI_DEV_FB_USED"] == s.memory_used_mib
            assert value["DCGM_FI_DEV_FB_FREE"] == s.memory_total_mib - s.memory_used_mib
            assert value["DCGM_FI_DEV_GPU_TEMP"] == s.temperature_c
            assert value["DCGM_FI_DEV_POWER_USAGE"] == s.power_w
            assert value["DCGM_FI_DEV_SM_CLOCK"] == s.sm_clock_mhz
            assert value["DCGM_FI_DEV_ECC_SBE_VOL_TOTAL"] == s.ecc_volatile_sbe
            assert value["DCGM_FI_DEV_ECC_DBE_VOL_TOTAL"] == s.ecc_volatile_dbe

    h100 = series["DCGM_FI_DEV_GPU_UTIL"]
    assert h100[("sim-node-0", busy)][1] > 50  # the training GPU is busy, its neighbours idle
    assert h100[("sim-node-0", fleet["sim-node-0"].node_info().gpus[0].uuid)][1] == 0
    assert series["DCGM_FI_DEV_GPU_UTIL"][("sim-node-1", fleet["sim-node-1"].node_info().gpus[0].uuid)][0][
        "modelName"] == "NVIDIA L40S"
    storm = fleet["sim-node-1"].node_info().gpus[1].uuid
    assert series["DCGM_FI_DEV_ECC_SBE_VOL_TOTAL"][("sim-node-1", storm)][1] > 0
    assert series["DCGM_FI_DEV_XID_ERRORS"][("sim-node-1", storm)][1] == 92  # last Xid, kept after the sample
    assert len(series["DCGM_FI_DEV_GPU_UTIL"]) == 8 + 6


async def test_xid_errors_is_the_last_xid_and_a_lost_gpu_drops_the_fields_it_cannot_report(clock) -> None:
    registry = CollectorRegistry()
    metrics = DcgmMetrics(registry)
    sim = SimulatedNvml("gpu-node-9", ["A100-80GB"] * 2, seed=3, clock=clock)
    sim.open()
    agent = NodeAgent(FakeNats(), sim, "local", "gpu-node-9", 1.0, metrics=metrics)  # type: ignore[arg-type]
    uuid0, uuid1 = (g.uuid for g in sim.node_info().gpus)
    await agent.sample_once()
    assert scrape(registry)["DCGM_FI_DEV_XID_ERRORS"][("gpu-node-9", uuid0)][1] == 0

    sim.inject_fault(0, "xid13")
    clock.advance(2)
    await agent.sample_once()
    sim.inject_fault(0, "xid79")  # falls off the bus: no temperature, power or clock any more
    clock.advance(2)
    await agent.sample_once()
    clock.advance(2)
    await agent.sample_once()
    series = scrape(registry)
    assert series["DCGM_FI_DEV_XID_ERRORS"][("gpu-node-9", uuid0)][1] == 79
    assert series["DCGM_FI_DEV_XID_ERRORS"][("gpu-node-9", uuid1)][1] == 0
    for name in ("DCGM_FI_DEV_GPU_TEMP", "DCGM_FI_DEV_POWER_USAGE", "DCGM_FI_DEV_SM_CLOCK"):
        assert ("gpu-node-9", uuid0) not in series[name]
        assert ("gpu-node-9", uuid1) in series[name]
    assert series["DCGM_FI_DEV_FB_USED"][("gpu-node-9", uuid0)][1] == 0


def test_pci_bus_id_is_spelled_as_dcgm_does() -> None:
    assert dcgm_pci_bus_id("0000:1b:00.0") == "00000000:1B:00.0"
    assert dcgm_pci_bus_id("00000000:18:00.0") == "00000000:18:00.0"


async def test_the_agent_by_default_updates_the_registry_its_ops_endpoint_serves(clock) -> None:
    sim = SimulatedNvml("default-registry-node", ["L4"], seed=1, clock=clock)
    sim.open()
    agent = NodeAgent(FakeNats(), sim, "local", "default-registry-node", 1.0)  # type: ignore[arg-type]
    await agent.sample_once()
    text = generate_latest().decode()  # what libs/runtime/http.py's /metrics returns
    gpu = sim.node_info().gpus[0]
    assert any(s.labels.get("UUID") == gpu.uuid and s.labels["Hostname"] == "default-registry-node"
               for f in text_string_to_metric_families(text) if f.name == "DCGM_FI_DEV_GPU_TEMP" for s in f.samples)
