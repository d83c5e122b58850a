"""The real node's CPU, memory, network and volumes, read from a fake /proc + /sys tree: which interfaces count,
their kind and speed, CPU busy % and network rates between two reads, volumes by statvfs with their filesystem."""

from __future__ import annotations

import os
from pathlib import Path
from types import SimpleNamespace

import pytest

from services.agent.host import (
    HostReader,
    filesystem_of,
    parse_cpu_times,
    parse_ib_rate,
    parse_meminfo_used_mib,
    parse_mounts,
)
from services.agent.nvml_real import RealNvml
from services.agent.nvml_types import NicInfo, VolumeInfo

GIB = 1024**3


def _w(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)


def _stat_line(user: int, system: int, idle: int, iowait: int, guest: int = 0) -> str:
    # user nice system idle iowait irq softirq steal guest guest_nice
    return f"cpu  {user} 0 {system} {idle} {iowait} 0 0 0 {guest} 0\ncpu0 1 2 3 4 5 6 7 8 9 10\nintr 1\n"


def _netdev(root: Path, name: str, *, arp: int, speed: str | None, state: str = "up", physical: bool = True,
            rx: int = 0, tx: int = 0) -> None:
    base = root / "sys/class/net" / name
    _w(base / "type", f"{arp}\n")
    _w(base / "operstate", f"{state}\n")
    if speed is not None:
        _w(base / "speed", f"{speed}\n")
    _w(base / "statistics/rx_bytes", f"{rx}\n")
    _w(base / "statistics/tx_bytes", f"{tx}\n")
    if physical:
        (base / "device").mkdir()


def _ib_port(root: Path, dev: str, port: int, *, rate: str = "400 Gb/sec (4X NDR)", state: str = "4: ACTIVE",
             link_layer: str = "InfiniBand", rcv_words: int = 0, xmit_words: int = 0) -> None:
    base = root / "sys/class/infiniband" / dev / "ports" / str(port)
    _w(base / "rate", rate + "\n")
    _w(base / "state", state + "\n")
    _w(base / "link_layer", link_layer + "\n")
    _w(base / "counters/port_rcv_data", f"{rcv_words}\n")
    _w(base / "counters/port_xmit_data", f"{xmit_words}\n")


class FakeStatvfs:
    """statvfs by path: (total GiB, used GiB) with 4 KiB fragments."""

    def __init__(self, root: Path, volumes: dict[str, tuple[float, float]]) -> None:
        self.root, self.volumes, self.calls = root, volumes, []

    def __call__(self, path: str) -> SimpleNamespace:
        self.calls.append(path)
        rel = os.path.relpath(path, self.root)
        rel = "/" if rel == "." else "/" + rel
        if rel not in self.volumes:
            raise FileNotFoundError(path)
        total, used = self.volumes[rel]
        frsize = 4096
        blocks = int(total * GIB / frsize)
        return SimpleNamespace(f_frsize=frsize, f_blocks=blocks, f_bfree=blocks - int(used * GIB / frsize))


@pytest.fixture
def host_tree(tmp_path: Path) -> Path:
    _w(tmp_path / "proc/stat", _stat_line(1000, 500, 8000, 500))
    _w(tmp_path / "proc/meminfo", "MemTotal:       2113929216 kB\nMemFree:   100 kB\nMemAvailable:   1900000000 kB\n")
    _w(tmp_path / "proc/mounts", "/dev/nvme0n1p2 / ext4 rw 0 0\n/dev/md0 /scratch xfs rw 0 0\n"
                                 "tmpfs /scratch/tmp tmpfs rw 0 0\nnfs:/d /mnt/my\\040data nfs4 rw 0 0\n")
    _netdev(tmp_path, "lo", arp=772, speed=None, physical=False, rx=10**12, tx=10**12)
    _netdev(tmp_path, "eth0", arp=1, speed="100000", rx=1_000, tx=2_000)
    _netdev(tmp_path, "eth1", arp=1, speed="-1", state="down")
    _netdev(tmp_path, "docker0", arp=1, speed="10000", physical=False, rx=10**9, tx=10**9)
    _netdev(tmp_path, "ib0", arp=32, speed="400000", rx=10**9, tx=10**9)  # IPoIB on mlx5_0
    _ib_port(tmp_path, "mlx5_0", 1, rcv_words=100, xmit_words=200)
    _ib_port(tmp_path, "mlx5_1", 1, state="1: DOWN")
    _ib_port(tmp_path, "mlx5_2", 1, link_layer="Ethernet")  # RoCE: read through its netdev, not here
    return tmp_path


def test_the_interfaces_reported_are_the_physical_data_plane_with_kind_and_speed(host_tree: Path) -> None:
    reader = HostReader(str(host_tree), ("/",), statvfs=FakeStatvfs(host_tree, {"/": (100, 10)}))
    assert reader.nics() == (
        NicInfo("mlx5_0/1", "infiniband", 400_000),
        NicInfo("mlx5_1/1", "infiniband", None),  # down: no speed
        NicInfo("eth0", "ethernet", 100_000),
        NicInfo("eth1", "ethernet", None),
    )  # lo, docker0 (no device link) and ib0 (IPoIB, counted in its port) are left out


def test_ipoib_netdevs_count_as_infiniband_when_the_host_has_no_ib_ports_in_sysfs(tmp_path: Path) -> None:
    _netdev(tmp_path, "ib0", arp=32, speed="200000")
    _netdev(tmp_path, "bond0", arp=1, speed="50000", physical=False)
    _netdev(tmp_path, "wlan0", arp=801, speed=None)
    assert HostReader(str(tmp_path), ()).nics() == (NicInfo("ib0", "infiniband", 200_000),
                                                    NicInfo("wlan0", "other", None))


def test_two_reads_give_cpu_busy_percent_memory_and_network_rates(host_tree: Path) -> None:
    now = [100.0]
    fs = FakeStatvfs(host_tree, {"/": (1788.0, 60.5), "/scratch": (13969.0, 1200.25)})
    reader = HostReader(str(host_tree), ("/", "/scratch", "/missing"), clock=lambda: now[0], statvfs=fs)
    first = reader.sample()
    assert first.cpu_util_pct is None and first.network_rx_mbps is None  # rates need two reads
    assert first.memory_used_mib == (2113929216 - 1900000000) // 1024
    assert first.storage_used_gib == pytest.approx(1260.75, abs=0.01)

    # 2 s later: 1,500 more busy jiffies (user + system + the guest inside user) of 2,000; idle + iowait 500
    _w(host_tree / "proc/stat", _stat_line(2000, 1000, 8300, 700, guest=400))
    _w(host_tree / "sys/class/net/eth0/statistics/rx_bytes", f"{1_000 + 250_000_000}\n")  # 1,000 Mbit/s over 2 s
    _w(host_tree / "sys/class/net/eth0/statistics/tx_bytes", "0\n")  # counter reset: no traffic, not negative
    _w(host_tree / "sys/class/infiniband/mlx5_0/ports/1/counters/port_rcv_data", f"{100 + 125_000_000}\n")
    _w(host_tree / "sys/class/infiniband/mlx5_0/ports/1/counters/port_xmit_data", f"{200 + 25_000_000}\n")
    _w(host_tree / "sys/class/net/docker0/statistics/rx_bytes", f"{10**12}\n")  # virtual: must not count
    _w(host_tree / "proc/meminfo", "MemTotal: 2113929216 kB\nMemAvailable: 2000000000 kB\n")
    fs.volumes["/scratch"] = (13969.0, 1300.25)
    now[0] += 2.0
    second = reader.sample()
    assert second.cpu_util_pct == 75.0
    # rx: eth0 1,000 Mbit/s + IB port 125e6 words × 4 B × 8 / 2 s = 2,000 Mbit/s; tx: IB 400 Mbit/s only
    assert second.network_rx_mbps == pytest.approx(3000.0)
    assert second.network_tx_mbps == pytest.approx(400.0)
    assert second.memory_used_mib == (2113929216 - 2000000000) // 1024
    assert second.storage_used_gib == pytest.approx(1360.75, abs=0.01)


def test_volumes_are_the_configured_paths_that_exist_with_size_and_filesystem(host_tree: Path) -> None:
    fs = FakeStatvfs(host_tree, {"/": (1788.0, 60.0), "/scratch": (13969.0, 1200.0),
                                 "/scratch/tmp": (64.0, 1.0), "/mnt/my data": (1000.0, 1.0)})
    reader = HostReader(str(host_tree), ("/", "/scratch", " /scratch ", "/scratch/tmp", "/gone", "/mnt/my data"),
                        statvfs=fs)
    assert reader.volumes() == (VolumeInfo("/", 1788.0, "ext4"), VolumeInfo("/scratch", 13969.0, "xfs"),
                                VolumeInfo("/scratch/tmp", 64.0, "tmpfs"), VolumeInfo("/mnt/my data", 1000.0, "nfs4"))
    assert all(call.startswith(str(host_tree)) for call in fs.calls)  # every path under the injected root


def test_parsers_of_proc_and_sys_files() -> None:
    assert parse_cpu_times(_stat_line(10, 5, 80, 5, guest=3)) == (15, 100)
    assert parse_cpu_times("intr 1\n") is None
    assert parse_meminfo_used_mib("MemTotal: 4096 kB\nMemAvailable: 1024 kB\n") == 3
    assert parse_meminfo_used_mib("MemTotal: 4096 kB\n") is None  # old kernel without MemAvailable
    mounts = parse_mounts("a / ext4 rw 0 0\nb /data xfs rw 0 0\nc /data nfs4 rw 0 0\nd /data2 btrfs rw 0 0\n")
    assert filesystem_of("/data/x", mounts) == "nfs4"  # mounted over: the last one wins
    assert filesystem_of("/data2", mounts) == "btrfs" and filesystem_of("/datax", mounts) == "ext4"
    assert filesystem_of("/", []) == ""
    assert parse_ib_rate("400 Gb/sec (4X NDR)") == 400_000 and parse_ib_rate("2.5 Gb/sec (1X SDR)") == 2_500
    assert parse_ib_rate("garbage") is None


def test_an_empty_host_reports_nothing_rather_than_failing(tmp_path: Path) -> None:
    reader = HostReader(str(tmp_path), ("/",), statvfs=FakeStatvfs(tmp_path, {}))
    assert reader.nics() == () and reader.volumes() == ()
    s = reader.sample()
    assert (s.cpu_util_pct, s.memory_used_mib, s.network_rx_mbps, s.storage_used_gib) == (None, None, None, None)


def test_the_real_backend_registers_its_host_facts_and_samples_them(host_tree: Path, fake_nvml_factory,
                                                                     fake_gpu_factory, clock) -> None:
    reader = HostReader(str(host_tree), ("/",), clock=clock, statvfs=FakeStatvfs(host_tree, {"/": (100.0, 25.0)}))
    backend = RealNvml(fake_nvml_factory([fake_gpu_factory(uuid="GPU-a")]), clock=clock, hostname="n",
                       host=reader)
    backend.open()
    info = backend.node_info()
    assert [n.name for n in info.network] == ["mlx5_0/1", "mlx5_1/1", "eth0", "eth1"]
    assert info.storage == (VolumeInfo("/", 100.0, "ext4"),)
    _w(host_tree / "proc/stat", _stat_line(1500, 500, 8500, 500))  # 500 busy of 1,000 since open() primed it
    clock.advance(1)
    s = backend.node_sample()
    assert s.cpu_util_pct == 50.0 and s.storage_used_gib == 25.0 and s.network_rx_mbps == 0.0
