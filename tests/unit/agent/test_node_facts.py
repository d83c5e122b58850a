"""Simulated nodes: plausible, deterministic NICs and volumes by GPU model, node load that follows the GPUs; and
the registration and telemetry documents carrying the node's facts."""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest

from libs.contracts.commands import RegisterNode
from services.agent.domain import telemetry
from services.agent.handlers import NodeAgent
from services.agent.nvml_sim import SimulatedNvml
from services.agent.nvml_types import NodeSample
from services.agent.registration import registration


def _sim(clock, models, host="sim-node-0"):
    sim = SimulatedNvml(host, models, seed=7, clock=clock)
    sim.open()
    return sim


@pytest.mark.parametrize(("models", "ib", "ib_mbps", "eth_mbps"), [
    (["H100-80GB"] * 8, 8, 400_000, 100_000),
    (["H200-141GB"] * 8, 8, 400_000, 100_000),
    (["A100-80GB"] * 8, 4, 200_000, 100_000),
    (["L40S"] * 4 + ["T4"] * 2, 0, None, 25_000),
    (["T4"] * 3 + ["A100-40GB"], 0, None, 25_000),  # the node is what most of its GPUs are
])
def test_simulated_nodes_have_the_fabric_of_their_gpu_model(clock, models, ib, ib_mbps, eth_mbps) -> None:
    info = _sim(clock, models).node_info()
    fabric = [n for n in info.network if n.kind == "infiniband"]
    eth = [n for n in info.network if n.kind == "ethernet"]
    assert len(fabric) == ib and {n.speed_mbps for n in fabric} <= {ib_mbps}
    assert [n.name for n in fabric] == [f"mlx5_{i}/1" for i in range(ib)]
    assert len(eth) == 2 and {n.speed_mbps for n in eth} == {eth_mbps}


def test_simulated_volumes_are_a_root_disk_and_a_7_to_31_tb_scratch_fixed_per_node(clock) -> None:
    sizes = set()
    for i in range(12):
        root, scratch = _sim(clock, ["L4"], host=f"n-{i}").node_info().storage
        assert (root.mount, root.filesystem, scratch.mount, scratch.filesystem) == ("/", "ext4", "/scratch", "xfs")
        assert 7e12 <= scratch.total_gib * 2**30 <= 31e12
        sizes.add(scratch.total_gib)
        assert _sim(clock, ["T4"], host=f"n-{i}").node_info().storage[1] == scratch  # same host, same disk
    assert len(sizes) > 1  # nodes differ


def test_node_load_follows_the_gpus_and_scratch_fills_slowly(clock) -> None:
    sim = _sim(clock, ["H100-80GB"] * 8)
    clock.advance(1)
    sim.sample()
    idle = sim.node_sample()
    total_mbps = sum(n.speed_mbps for n in sim.node_info().network)
    for g in sim.node_info().gpus:
        sim.set_workload(g.uuid, "training")
    for _ in range(12):  # past the training start-up ramp
        clock.advance(5)
        sim.sample()
        busy = sim.node_sample()
    assert idle.cpu_util_pct < 10 < 45 < busy.cpu_util_pct <= 100
    assert idle.network_rx_mbps < 0.01 * total_mbps and 0.2 * total_mbps < busy.network_rx_mbps < total_mbps
    assert 0 < busy.network_tx_mbps <= busy.network_rx_mbps
    assert idle.memory_used_mib < busy.memory_used_mib < 2 * 1024 * 1024
    before = busy.storage_used_gib
    clock.advance(3600)
    sim.sample()
    after = sim.node_sample().storage_used_gib
    assert 50 < after - before < 500  # an hour of checkpoints at full load: tens to hundreds of GiB
    cap = sum(v.total_gib for v in sim.node_info().storage)
    clock.advance(10 * 365 * 86400)
    sim.sample()
    assert sim.node_sample().storage_used_gib < cap  # never past the disks


def test_node_samples_are_deterministic(clock_factory) -> None:
    def run():
        clock = clock_factory()
        sim = _sim(clock, ["A100-80GB"] * 4)
        sim.set_workload(sim.node_info().gpus[0].uuid, "inference")
        out = []
        for _ in range(5):
            clock.advance(1)
            sim.sample()
            out.append(sim.node_sample())
        return out
    assert run() == run()


def test_registration_carries_the_nics_and_volumes(clock) -> None:
    sim = _sim(clock, ["A100-80GB"] * 8)
    cmd = registration("local", "sim-node-0", sim.node_info(), sim.sample())
    doc = RegisterNode.model_validate_json(cmd.model_dump_json())
    assert [(n.name, n.kind, n.speed_mbps) for n in doc.network][:1] == [("mlx5_0/1", "infiniband", 200_000)]
    assert len(doc.network) == 6 and [v.mount for v in doc.storage] == ["/", "/scratch"]
    assert doc.storage[1].filesystem == "xfs" and doc.storage[1].total_gib > 6000


def test_telemetry_carries_the_node_sample(clock) -> None:
    sim = _sim(clock, ["L40S"] * 2)
    host = NodeSample(cpu_util_pct=12.5, memory_used_mib=4096, network_rx_mbps=80.0, network_tx_mbps=40.5,
                      storage_used_gib=512.25)
    ev = telemetry("local", "n", sim.sample(), 1_764_489_600.0, host)
    assert (ev.cpu_util_pct, ev.memory_used_mib, ev.network_rx_mbps, ev.network_tx_mbps, ev.storage_used_gib) == (
        12.5, 4096, 80.0, 40.5, 512.25)
    bare = telemetry("local", "n", sim.sample(), 1_764_489_600.0)
    assert (bare.cpu_util_pct, bare.network_rx_mbps, bare.storage_used_gib) == (None, None, None)


class _Js:
    def __init__(self) -> None:
        self.payloads: list[bytes] = []

    async def publish(self, subject: str, payload: bytes, **_: object) -> SimpleNamespace:
        self.payloads.append(payload)
        return SimpleNamespace(stream="GPUPOOL_TELEMETRY", seq=len(self.payloads))


async def test_each_tick_publishes_the_node_sample_and_a_failing_host_read_does_not_stop_it(clock) -> None:
    js = _Js()
    sim = _sim(clock, ["H100-80GB"] * 2)
    agent = NodeAgent(SimpleNamespace(jetstream=lambda: js), sim, "local", "sim-node-0", 1.0)  # type: ignore[arg-type]
    clock.advance(1)
    await agent.sample_once()
    data = json.loads(js.payloads[-1])["data"]
    assert data["cpu_util_pct"] > 0 and data["network_rx_mbps"] > 0 and data["storage_used_gib"] > 0
    assert data["memory_used_mib"] > 0 and data["network_tx_mbps"] > 0

    def broken() -> NodeSample:
        raise OSError("/proc is gone")

    sim.node_sample = broken  # type: ignore[method-assign]
    await agent.sample_once()
    data = json.loads(js.payloads[-1])["data"]
    assert data["cpu_util_pct"] is None and len(data["gpus"]) == 2  # GPU telemetry goes on
