"""The topology facts a node registers: its labels (the agent's LABELS, a simulated node's fleet options) and each
simulated GPU's NUMA node and NVLink peers as the fleet spec shapes them."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from libs.contracts.fleet import RACK_LABEL, FleetNode, parse_fleet, parse_fleet_nodes
from libs.contracts.labels import parse_labels
from services.agent.bootstrap import build_backends, node_labels
from services.agent.config import AgentSettings
from services.agent.nvml_sim import SimulatedNvml
from services.agent.registration import registration


def test_fleet_options_give_racks_blocks_numa_nodes_nvlink_layout_and_labels():
    nodes = parse_fleet_nodes("H100-80GB*8@rack=r1,block=b0,nvlink=pairs,numa=4;L40S*2,T4 ;T4@example.com/x=1")
    assert nodes[0] == FleetNode(["H100-80GB"] * 8, {RACK_LABEL: "r1", "topology.gpupool.io/block": "b0"}, 4,
                                 "pairs")
    assert nodes[1] == FleetNode(["L40S", "L40S", "T4"])
    assert nodes[2] == FleetNode(["T4"], {"example.com/x": "1"})
    assert parse_fleet("L40S*4@rack=r2;T4") == [["L40S"] * 4, ["T4"]]  # the models alone, as before
    assert parse_fleet_nodes("T4@zone=east")[0].labels == {"zone": "east"}  # any other option is a label


@pytest.mark.parametrize("spec", ["L40S*4@rack", "L40S*4@numa=0", "L40S*4@nvlink=mesh", "L40S*4@-colour=red",
                                  "L40S*4@rack=bad value", "L40S*x"])
def test_a_malformed_fleet_option_is_refused(spec: str) -> None:
    with pytest.raises(ValueError):
        parse_fleet_nodes(spec)


def test_agent_labels_are_checked_and_a_simulated_node_adds_its_own(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GPUPOOL_AGENT_BACKEND", "sim")
    monkeypatch.setenv("GPUPOOL_AGENT_LABELS", f"{RACK_LABEL}=r9,example.com/zone=z1")
    monkeypatch.setenv("GPUPOOL_AGENT_SIM_FLEET", "L40S*2@rack=r1;L40S*2")
    settings = AgentSettings()
    assert node_labels(settings) == {"sim-node-0": {RACK_LABEL: "r1", "example.com/zone": "z1"},
                                     "sim-node-1": {RACK_LABEL: "r9", "example.com/zone": "z1"}}
    assert [name for name, _ in build_backends(settings)] == ["sim-node-0", "sim-node-1"]
    monkeypatch.setenv("GPUPOOL_AGENT_LABELS", "rack r1")
    with pytest.raises(ValidationError):
        AgentSettings()
    with pytest.raises(ValueError):
        parse_labels("=r1")


def test_simulated_nvlink_pairs_and_four_numa_nodes(clock) -> None:  # type: ignore[no-untyped-def]
    sim = SimulatedNvml("n", ["H100-80GB"] * 8, seed=1, clock=clock, numa_nodes=4, nvlink="pairs")
    sim.open()
    gpus = sim.node_info().gpus
    assert [g.numa_node for g in gpus] == [0, 0, 1, 1, 2, 2, 3, 3]
    assert [g.nvlink_peers for g in gpus] == [(1,), (0,), (3,), (2,), (5,), (4,), (7,), (6,)]
    bridged = SimulatedNvml("p", ["L40S"] * 3, seed=1, clock=clock, nvlink="all")
    bridged.open()
    assert [g.nvlink_peers for g in bridged.node_info().gpus] == [(1, 2), (0, 2), (0, 1)]


def test_the_registration_carries_the_labels_and_the_gpu_facts(clock) -> None:  # type: ignore[no-untyped-def]
    sim = SimulatedNvml("n", ["L4"] * 4, seed=1, clock=clock)
    sim.open()
    cmd = registration("c", "n", sim.node_info(), labels={RACK_LABEL: "r1"}, drivers={"process": None})
    assert cmd.labels == {RACK_LABEL: "r1", "gpupool.io/isolation.process": "true"}
    assert [(g.numa_node, g.nvlink_peers) for g in cmd.gpus] == [(0, []), (0, []), (1, []), (1, [])]


def test_the_work_learns_which_numa_nodes_its_gpus_are_on() -> None:
    from libs.contracts.events import AllocatedGpu
    from services.agent.domain import launch_environment

    gpus = [AllocatedGpu(uuid=u, index=i, model="L4") for i, u in enumerate(("GPU-c", "GPU-a", "GPU-b"))]
    numa = {"GPU-a": 1, "GPU-b": 0, "GPU-c": 1}
    assert launch_environment({}, {}, gpus=gpus, mig_uuid=None, gpu_numa=numa)["GPUPOOL_NUMA_NODES"] == "0,1"
    assert launch_environment({}, {}, gpus=gpus[:1], mig_uuid=None, gpu_numa=numa)["GPUPOOL_NUMA_NODES"] == "1"
    assert "GPUPOOL_NUMA_NODES" not in launch_environment({}, {}, gpus=gpus, mig_uuid=None)  # unknown: left out


@pytest.mark.parametrize("value", ["r 1", "r1,r2", "x" * 64, "-r1"])
def test_inventory_refuses_a_registration_whose_rack_is_not_a_label_value(value: str) -> None:
    from libs.contracts.commands import RegisterNode

    base = {"cluster": "c", "node": "n", "hostname": "n", "cpu_count": 1, "memory_mib": 1, "gpus": []}
    assert RegisterNode(**base, labels={RACK_LABEL: "r1", "zone": "any text"}).labels[RACK_LABEL] == "r1"
    with pytest.raises(ValidationError, match="bad label"):
        RegisterNode(**base, labels={RACK_LABEL: value})


def test_gpupool_up_refuses_a_bad_fleet_before_starting_anything(capsys: pytest.CaptureFixture[str]) -> None:
    from libs.cli.main import build_parser

    parser = build_parser()
    assert parser.parse_args(["up", "--fleet", "L40S*4@rack=r1;L4*2"]).fleet == "L40S*4@rack=r1;L4*2"
    with pytest.raises(SystemExit):
        parser.parse_args(["up", "--fleet", "L40S*4@rack=r 1"])
    assert "bad fleet" in capsys.readouterr().err
