"""Placement's read model → the core's topology facts: NVLink domains from the registered peers, a node's
topology domain from its rack/block labels, NUMA nodes (unknown: -1)."""

from __future__ import annotations

from libs.contracts.events import GpuSpec
from libs.contracts.fleet import BLOCK_LABEL, RACK_LABEL
from services.placement.domain import build_snapshot, node_topology, nvlink_domains


def _gpu(index: int, peers: list[int]) -> GpuSpec:
    return GpuSpec(uuid=f"g{index}", index=index, model="H100-80GB", memory_mib=81920, nvlink_peers=peers)


def test_nvlink_domains_are_the_connected_peers_named_after_their_lowest_index():
    switch = [_gpu(i, [j for j in range(8) if j != i]) for i in range(8)]
    assert set(nvlink_domains(switch).values()) == {"nv0"}
    pairs = [_gpu(0, [1]), _gpu(1, [0]), _gpu(2, [3]), _gpu(3, [2]), _gpu(4, []), _gpu(5, [9])]
    assert nvlink_domains(pairs) == {0: "nv0", 1: "nv0", 2: "nv2", 3: "nv2", 4: "", 5: ""}
    assert nvlink_domains([_gpu(0, []), _gpu(1, [0])]) == {0: "nv0", 1: "nv0"}  # a one-sided report still links


def test_a_node_topology_is_its_block_and_rack():
    assert node_topology({RACK_LABEL: "r1"}) == "r1"
    assert node_topology({RACK_LABEL: "r1", BLOCK_LABEL: "b2"}) == "b2/r1"
    assert node_topology({BLOCK_LABEL: "b2"}) == "b2"
    assert node_topology({"gpupool.io/isolation.process": "true"}) == ""


def test_the_snapshot_carries_numa_nodes_nvlink_domains_and_the_rack():
    nodes = [{"cluster": "c", "node": "n", "schedulable": True, "labels": {RACK_LABEL: "r1"}}]
    gpus = [{"uuid": f"g{i}", "cluster": "c", "node": "n", "idx": i, "model": "L40S", "memory_mib": 46068,
             "health": "healthy", "sharing": "exclusive", "numa_node": numa, "nvlink_domain": nv}
            for i, (numa, nv) in enumerate([(0, "nv0"), (0, "nv0"), (None, ""), (1, "")])]
    (node,) = build_snapshot(nodes, gpus, []).nodes
    assert node.topology == "r1"
    assert [(g.numa_node, g.nvlink_domain) for g in node.gpus] == [(0, "nv0"), (0, "nv0"), (-1, ""), (1, "")]
