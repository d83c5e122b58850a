"""How `gpupool nodes` and `gpupool node` show a node's network and storage facts (against the fake gateway),
and the formatting helpers behind them."""

from __future__ import annotations

import pytest
from cli_fakes import FakeGateway, gpu, node

from libs.cli import common, pool
from libs.cli.main import main
from libs.client import GpupoolClient, NodeNetwork, NodeStorage


@pytest.fixture()
def gw(monkeypatch) -> FakeGateway:
    fake = FakeGateway()
    monkeypatch.setattr(common, "make_client", lambda args: GpupoolClient(
        args.url or "http://gw.test", args.token or "tok", transport=fake.transport, sleep=lambda _s: None))
    return fake


NETWORK = {"interfaces": [*({"name": f"mlx5_{i}", "kind": "infiniband", "speed_mbps": 400000} for i in range(8)),
                          {"name": "eth0", "kind": "ethernet", "speed_mbps": 100000},
                          {"name": "eth1", "kind": "ethernet", "speed_mbps": 100000}],
           "link_gbps": 3400.0, "rx_mbps": 12500.5, "tx_mbps": 800.0}
STORAGE = {"volumes": [{"mount": "/", "total_gib": 512.0, "filesystem": "ext4"},
                       {"mount": "/scratch", "total_gib": 28160.0, "filesystem": "xfs"}],
           "total_gib": 28672.0, "used_gib": 1228.8}


def big_node(name: str = "n0") -> dict:
    return {**node(name, [gpu(0)]), "memory_mib": 2048 * 1024, "memory_used_mib": 512 * 1024,
            "network": NETWORK, "storage": STORAGE}


@pytest.mark.parametrize(("nics", "shown"), [
    ([], None),
    ([("infiniband", 400000)] * 8 + [("ethernet", 100000)] * 2, "8×400G IB, 2×100G Eth"),
    ([("ethernet", 25000), ("ethernet", None), ("ethernet", 2500), ("other", 100)], "1×25G Eth, 1×2.5G Eth, "
                                                                                     "1×100M other, 1×? Eth"),
])
def test_network_groups_nics_by_kind_and_speed_fastest_first(nics, shown) -> None:  # type: ignore[no-untyped-def]
    net = NodeNetwork.model_validate({"interfaces": [{"name": f"n{i}", "kind": k, "speed_mbps": s}
                                                     for i, (k, s) in enumerate(nics)]})
    assert pool.fmt_network(net) == shown


@pytest.mark.parametrize(("storage", "shown"), [
    ({}, None),
    ({"volumes": [{"mount": "/", "total_gib": 28672.0}], "total_gib": 28672.0, "used_gib": 1228.8},
     "1.2/28.0 TiB"),
    ({"volumes": [{"mount": "/", "total_gib": 40.0}], "total_gib": 40.0, "used_gib": None}, "-/0.039 TiB"),
])
def test_storage_is_used_over_total_in_tib(storage, shown) -> None:  # type: ignore[no-untyped-def]
    assert pool.fmt_storage(NodeStorage.model_validate(storage)) == shown


def test_nodes_table_has_network_and_storage_columns_and_older_nodes_show_dashes(gw, capsys) -> None:  # type: ignore[no-untyped-def]
    gw.on("GET", "/v1/nodes", {"items": [big_node(), node("old", [gpu(0)])], "next": None})
    assert main(["nodes"]) == 0
    header, big, old = capsys.readouterr().out.splitlines()
    net, st = header.index("NETWORK"), header.index("STORAGE")
    assert big[net:st].strip() == "8×400G IB, 2×100G Eth" and big[st:].split()[0] == "1.2/28.0"
    assert old[net:st].strip() == "-" and old[st:].split()[0] == "-"


def test_node_shows_cpu_memory_network_throughput_and_volumes(gw, capsys) -> None:  # type: ignore[no-untyped-def]
    gw.on("GET", "/v1/nodes/n0", big_node())
    assert main(["node", "n0"]) == 0
    lines = dict(line.split(":", 1) for line in capsys.readouterr().out.split("\n\n")[0].splitlines())
    assert {k: v.strip() for k, v in lines.items() if k in (
        "cpus", "cpu use %", "memory GiB", "network", "throughput", "storage", "volumes")} == {
        "cpus": "64", "cpu use %": "3.0", "memory GiB": "512.0/2048.0 used",
        "network": "8×400G IB, 2×100G Eth (3400 Gbit/s)", "throughput": "rx 12500 / tx 800 Mbit/s",
        "storage": "1.2/28.0 TiB used", "volumes": "/ 0.5 TiB ext4, /scratch 27.5 TiB xfs"}


def test_node_from_an_older_agent_shows_no_network_or_storage(gw, capsys) -> None:  # type: ignore[no-untyped-def]
    gw.on("GET", "/v1/nodes/old", node("old", [gpu(0)]))
    assert main(["node", "old"]) == 0
    lines = dict(line.split(":", 1) for line in capsys.readouterr().out.split("\n\n")[0].splitlines())
    assert all(lines[k].strip() == "-" for k in ("network", "throughput", "storage", "volumes"))
