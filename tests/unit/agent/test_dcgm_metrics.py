"""The agent's /metrics in dcgm-exporter's naming: a scrape parses, and every GPU of every simulated node has every
DCGM series with its gpu/UUID/Hostname labels and the sampled values; every field of dcgm-exporter's default
counters is served with its type, and every query of NVIDIA's Grafana dashboard finds its metric."""

from __future__ import annotations

import json
import os
import re
from collections import Counter
from pathlib import Path
from types import SimpleNamespace

import pytest
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from services.agent.dcgm_metrics import METRIC_NAMES, TYPES, DcgmMetrics, dcgm_pci_bus_id
from services.agent.handlers import NodeAgent
from services.agent.nvml_sim import SimulatedNvml

FLEET = {"sim-node-0": ["H100-80GB"] * 8, "sim-node-1": ["L40S"] * 4 + ["T4"] * 2}
# NVIDIA's dcgm-exporter default counters and Grafana dashboard, as published (see that folder's README)
REFERENCE_DIR = Path(os.environ.get("GPUPOOL_DCGM_REFERENCE_DIR",
                                    Path(__file__).parents[3] / ".." / "shared" / "reference" / "dcgm-exporter"))


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
    return {name: series for name, (_, series) in scrape_typed(registry).items()}


def scrape_typed(registry: CollectorRegistry) -> dict[str, tuple[str, dict[tuple[str, str], tuple[dict, float]]]]:
    """{DCGM metric: (its # TYPE, {(Hostname, UUID): (labels, value)})}, the metric named as the text names it: a
    counter's samples under the family's own name, as dcgm-exporter serves them (the parser, converting to
    OpenMetrics, would call them `<name>_total`)."""
    text = generate_latest(registry).decode()
    out: dict[str, tuple[str, dict[tuple[str, str], tuple[dict, float]]]] = {}
    for family in text_string_to_metric_families(text):
        if not family.name.startswith("DCGM_"):  # the job mapping beside them (test_allocation_info.py)
            continue
        series: dict[tuple[str, str], tuple[dict, float]] = {}
        for s in family.samples:
            assert s.name == family.name + ("_total" if family.type == "counter" else ""), (family.type, s.name)
            series[(s.labels["Hostname"], s.labels["UUID"])] = (s.labels, s.value)
        out[family.name] = (family.type, series)
        assert f"\n# TYPE {family.name} {family.type}\n" in text
        assert f"\n{family.name}{{" in text and f"{family.name}_total" not in text  # the DCGM name, verbatim
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
            hbm = gpu.model.startswith(("H100", "A100"))  # GDDR boards (L40S, T4) report no memory temperature
            assert ((node, gpu.uuid) in series["DCGM_FI_DEV_MEMORY_TEMP"]) == hbm
            for name in METRIC_NAMES:
                if name == "DCGM_FI_DEV_MEMORY_TEMP" and not hbm:
                    continue
                labels, _ = series[name][(node, gpu.uuid)]
                assert labels == {"gpu": str(gpu.index), "UUID": gpu.uuid, "device": f"nvidia{gpu.index}",
                                  "pci_bus_id": dcgm_pci_bus_id(gpu.pci_bus_id), "modelName": gpu.name,
                                  "Hostname": node, "DCGM_FI_DRIVER_VERSION": "550.90.07"}
            value = {name: by_gpu[(node, gpu.uuid)][1] for name, by_gpu in series.items() if (node, gpu.uuid) in by_gpu}
            assert value["DCGM_FI_DEV_GPU_UTIL"] == s.utilization_gpu_pct
            assert value["DCGM_FI_DEV_MEM_COPY_UTIL"] == s.utilization_memory_pct
            assert value["DCGM_FI_DEV_FB_USED"] == s.memory_used_mib
            assert value["DCGM_FI_DEV_FB_RESERVED"] == s.extra.fb_reserved_mib > 0
            assert value["DCGM_FI_DEV_FB_FREE"] == s.memory_total_mib - s.memory_used_mib - s.extra.fb_reserved_mib
            assert value["DCGM_FI_DEV_GPU_TEMP"] == s.temperature_c
            assert value["DCGM_FI_DEV_POWER_USAGE"] == s.power_w
            assert value["DCGM_FI_DEV_SM_CLOCK"] == s.sm_clock_mhz
            assert value["DCGM_FI_DEV_ECC_SBE_VOL_TOTAL"] == s.ecc_volatile_sbe
            assert value["DCGM_FI_DEV_ECC_DBE_VOL_TOTAL"] == s.ecc_volatile_dbe
            assert value["DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION"] == s.extra.energy_mj
            assert value["DCGM_FI_DEV_MEM_CLOCK"] == s.extra.memory_clock_mhz
            assert value["DCGM_FI_PROF_GR_ENGINE_ACTIVE"] == s.extra.gr_engine_active
            assert value["DCGM_FI_PROF_PIPE_TENSOR_ACTIVE"] == s.extra.tensor_active
            assert value["DCGM_FI_PROF_PCIE_RX_BYTES"] == s.extra.pcie_rx_bytes_per_s
            for zero in ("DCGM_FI_DEV_PCIE_REPLAY_COUNTER", "DCGM_FI_DEV_VGPU_LICENSE_STATUS",
                         "DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS", "DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS",
                         "DCGM_FI_DEV_ROW_REMAP_FAILURE", "DCGM_FI_DEV_ENC_UTIL", "DCGM_FI_DEV_DEC_UTIL"):
                assert value[zero] == 0, zero

    h100 = series["DCGM_FI_DEV_GPU_UTIL"]
    assert h100[("sim-node-0", busy)][1] > 50  # the training GPU is busy, its neighbours idle
    idle = fleet["sim-node-0"].node_info().gpus[0].uuid
    tensor = series["DCGM_FI_PROF_PIPE_TENSOR_ACTIVE"]
    assert 0.3 < tensor[("sim-node-0", busy)][1] < 1 and tensor[("sim-node-0", idle)][1] == 0
    assert series["DCGM_FI_PROF_PCIE_RX_BYTES"][("sim-node-0", busy)][1] > 10 * series[
        "DCGM_FI_PROF_PCIE_RX_BYTES"][("sim-node-0", idle)][1] > 0
    assert series["DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL"][("sim-node-0", busy)][1] > series[
        "DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL"][("sim-node-0", idle)][1]
    assert series["DCGM_FI_DEV_MEM_CLOCK"][("sim-node-0", busy)][1] == 2619
    energy = series["DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION"][("sim-node-0", busy)][1]
    clock.advance(10)
    later = fleet["sim-node-0"].sample()
    agents[0].update_metrics(later)
    seconds = later[3].timestamp - expected["sim-node-0"][3].timestamp
    power = series["DCGM_FI_DEV_POWER_USAGE"][("sim-node-0", busy)][1]
    gained = scrape(registry)["DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION"][("sim-node-0", busy)][1] - energy
    assert 0.8 * power * seconds * 1000 < gained < 1.2 * power * seconds * 1000  # it integrates the power, in mJ
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


def reference(name: str) -> Path:
    path = REFERENCE_DIR / name
    if not path.is_file():
        pytest.skip(f"{path} is absent: dcgm-exporter's reference files are read from ../shared/reference/"
                    "dcgm-exporter (or GPUPOOL_DCGM_REFERENCE_DIR)")
    return path


async def scrape_simulated_fleet(fleet, clock) -> dict[str, tuple[str, dict]]:
    registry = CollectorRegistry()
    metrics = DcgmMetrics(registry)
    agents = [NodeAgent(FakeNats(), sim, "local", node, 1.0, metrics=metrics) for node, sim in fleet.items()]  # type: ignore[arg-type]
    fleet["sim-node-0"].set_workload(fleet["sim-node-0"].node_info().gpus[0].uuid, "training")
    for _ in range(3):
        clock.advance(5)
        await sample_fleet(agents)
    return scrape_typed(registry)


def default_counters() -> dict[str, str]:
    """dcgm-exporter's default counters CSV: {field: Prometheus type} of every line not commented out."""
    fields = {}
    for line in reference("default-counters.csv").read_text().splitlines():
        if line.strip() and not line.lstrip().startswith("#"):
            field, kind, _ = (part.strip() for part in line.split(",", 2))
            fields[field] = kind
    return fields


async def test_every_default_counter_of_dcgm_exporter_is_served_with_its_type(fleet, clock) -> None:
    counters = default_counters()
    # the published CSV (docs/ecosystem.md): 25 fields (5 counters, 20 gauges) and the driver version as a label
    assert sorted(Counter(counters.values()).items()) == [("counter", 5), ("gauge", 20), ("label", 1)], counters
    served = await scrape_simulated_fleet(fleet, clock)
    for field, kind in counters.items():
        if kind == "label":  # DCGM_FI_DRIVER_VERSION: a label on every series
            assert all(labels[field] for series in served.values() for labels, _ in series[1].values()), field
            continue
        assert field in served, f"{field} is not served"
        assert served[field][0] == kind, (field, served[field][0], kind)
        assert served[field][1], f"{field} has no series"
        assert TYPES[field] == kind


PROMQL_WORDS = {"by", "without", "on", "ignoring", "group_left", "group_right", "bool", "and", "or", "unless",
                "offset", "inf", "nan"}


def promql_metric_names(expr: str) -> set[str]:
    """The metric names a PromQL expression (or a Grafana `label_values(metric, label)`) selects: identifiers that
    are not functions, keywords, label matchers, grouping labels, strings or Grafana variables."""
    expr = re.sub(r'"(?:[^"\\]|\\.)*"', '""', expr)  # string literals
    expr = re.sub(r"\{[^}]*\}", "", expr)  # label matchers
    expr = re.sub(r"\b(by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)", "", expr)
    expr = re.sub(r"\blabel_values\(\s*([^,()]+),[^)]*\)", r"\1", expr)  # label_values(metric, label): metric
    expr = re.sub(r"\[[^\]]*\]", "", expr)  # range selectors
    names = set()
    for m in re.finditer(r"(?<![\w$.:])([a-zA-Z_:][\w:]*)(?![\w:])(?!\s*\()", expr):
        if m.group(1).lower() not in PROMQL_WORDS and not re.fullmatch(r"\d+(e\d+)?", m.group(1)):
            names.add(m.group(1))
    return names


def test_promql_metric_names_finds_the_selected_metrics_only() -> None:
    assert promql_metric_names('sum by (gpu) (rate(DCGM_FI_DEV_X{instance=~"$instance", gpu="a b"}[5m])) * 1000'
                               ) == {"DCGM_FI_DEV_X"}
    assert promql_metric_names("label_values(DCGM_FI_DEV_GPU_TEMP, instance)") == {"DCGM_FI_DEV_GPU_TEMP"}
    assert promql_metric_names("avg(a) / on(gpu) group_left b offset 5m") == {"a", "b"}


def dashboard_queries(node: object) -> list[str]:
    """Every PromQL of a Grafana dashboard: panel targets' `expr` and query variables' `query`."""
    found: list[str] = []
    if isinstance(node, dict):
        if isinstance(node.get("expr"), str):
            found.append(node["expr"])
        if node.get("type") == "query" and isinstance(node.get("query"), str):
            found.append(node["query"])
        for value in node.values():
            found += dashboard_queries(value)
    elif isinstance(node, list):
        for value in node:
            found += dashboard_queries(value)
    return found


async def test_every_panel_of_nvidia_s_dcgm_dashboard_queries_a_served_metric(fleet, clock) -> None:
    dashboard = json.loads(reference("dcgm-exporter-dashboard.json").read_text())
    queries = dashboard_queries(dashboard)
    panels = [p for p in dashboard["panels"] if p.get("targets")]
    # the published dashboard (docs/ecosystem.md): 8 panels, 8 panel queries and 2 variable queries over 6 metrics
    assert (len(dashboard["panels"]), len(panels), len(queries)) == (8, 8, 10)
    assert len(set().union(*map(promql_metric_names, queries))) == 6
    served = await scrape_simulated_fleet(fleet, clock)
    for expr in queries:
        names = promql_metric_names(expr)
        assert names, expr
        for name in names:
            assert name in served and served[name][1], f"{expr!r} queries {name}, which is not served"
            # the dashboard filters on gpu (and instance, which Prometheus adds): every series has it
            assert all(labels["gpu"] for labels, _ in served[name][1].values())
