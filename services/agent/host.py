"""The real node around the GPUs, read from Linux: CPU (/proc/stat), memory (/proc/meminfo), the data-plane network
(/sys/class/net, /sys/class/infiniband) and the configured volumes (statvfs, /proc/mounts).

Every path hangs off `root` so tests read a fake tree. Reads are a handful of small files per sample (the real
agent drives one node); anything unreadable is None or left out, never an exception: telemetry must go on.
"""

from __future__ import annotations

import os
import re
import time
from collections.abc import Callable, Iterable
from typing import Any

from services.agent.nvml_types import NicInfo, NodeSample, VolumeInfo

_GIB = 1024**3
ARPHRD_ETHER = 1
ARPHRD_INFINIBAND = 32
_RATE = re.compile(r"^\s*([0-9.]+)\s*Gb/sec")


def parse_cpu_times(stat: str) -> tuple[int, int] | None:
    """(busy, total) jiffies from /proc/stat's aggregate "cpu" line. Idle and iowait are not busy; guest time is
    already inside user time, so only the first eight columns count."""
    for line in stat.splitlines():
        if line.startswith("cpu "):
            cols = [int(c) for c in line.split()[1:9]]
            total = sum(cols)
            idle = cols[3] + (cols[4] if len(cols) > 4 else 0)
            return total - idle, total
    return None


def parse_meminfo_used_mib(meminfo: str) -> int | None:
    """MemTotal − MemAvailable (what the node's processes hold, page cache excluded), in MiB."""
    kb: dict[str, int] = {}
    for line in meminfo.splitlines():
        key, _, rest = line.partition(":")
        if key in ("MemTotal", "MemAvailable"):
            kb[key] = int(rest.split()[0])
    if len(kb) < 2:
        return None
    return max(0, kb["MemTotal"] - kb["MemAvailable"]) // 1024


def parse_mounts(mounts: str) -> list[tuple[str, str]]:
    """(mount point, filesystem type) from /proc/mounts (octal escapes such as \\040 for a space undone)."""
    out = []
    for line in mounts.splitlines():
        parts = line.split()
        if len(parts) >= 3:
            out.append((re.sub(r"\\([0-7]{3})", lambda m: chr(int(m.group(1), 8)), parts[1]), parts[2]))
    return out


def filesystem_of(path: str, mounts: Iterable[tuple[str, str]]) -> str:
    """The type of the filesystem `path` lies on: the longest mount point containing it (the last one mounted
    wins when one is mounted over another)."""
    best, fs = -1, ""
    norm = path.rstrip("/") or "/"
    for point, kind in mounts:
        p = point.rstrip("/") or "/"
        if (p == "/" or norm == p or norm.startswith(p + "/")) and len(p) >= best:
            best, fs = len(p), kind
    return fs


def parse_ib_rate(rate: str) -> int | None:
    """'400 Gb/sec (4X NDR)' → 400000 Mbit/s."""
    m = _RATE.match(rate)
    return int(float(m.group(1)) * 1000) if m else None


class HostReader:
    """Static facts once (`nics()`, `volumes()`), then `sample()` each tick."""

    def __init__(self, root: str = "/", storage_paths: Iterable[str] = ("/",), *,
                 clock: Callable[[], float] = time.monotonic,
                 statvfs: Callable[[str], Any] = os.statvfs) -> None:
        self._root = root
        self._paths = tuple(dict.fromkeys(p.strip() for p in storage_paths if p.strip()))
        self._clock = clock
        self._statvfs = statvfs
        self._net: list[tuple[NicInfo, str, str, int]] = []  # (nic, rx file, tx file, byte multiplier)
        self._vols: list[tuple[VolumeInfo, str]] = []
        self._last_cpu: tuple[int, int] | None = None
        self._last_net: tuple[float, list[tuple[int, int]]] | None = None
        self.refresh()

    def _p(self, *parts: str) -> str:
        return os.path.join(self._root, *(p.lstrip("/") for p in parts))

    def _read(self, *parts: str) -> str | None:
        try:
            with open(self._p(*parts), encoding="ascii", errors="replace") as fh:
                return fh.read()
        except OSError:  # absent, or EINVAL (speed of a down link)
            return None

    def _int(self, *parts: str) -> int | None:
        text = self._read(*parts)
        try:
            return int(text.strip()) if text is not None else None
        except ValueError:
            return None

    def _list(self, *parts: str) -> list[str]:
        try:
            return sorted(os.listdir(self._p(*parts)))
        except OSError:
            return []

    # ---- static facts ------------------------------------------------------------------------------------------
    def refresh(self) -> None:
        """Re-read which interfaces and volumes there are (at start; link speeds as they are then)."""
        self._net = self._read_ib_ports()
        have_ib = bool(self._net)
        for name in self._list("sys/class/net"):
            base = f"sys/class/net/{name}"
            if name == "lo" or not os.path.exists(self._p(base, "device")):
                continue  # loopback and virtual interfaces (bridges, veth, docker0) carry no node traffic
            arp = self._int(base, "type")
            if arp == ARPHRD_INFINIBAND and have_ib:
                continue  # IPoIB: its traffic is already in its port's counters
            kind = "ethernet" if arp == ARPHRD_ETHER else "infiniband" if arp == ARPHRD_INFINIBAND else "other"
            up = (self._read(base, "operstate") or "").strip() == "up"
            speed = self._int(base, "speed") if up else None
            nic = NicInfo(name, kind, speed if speed is not None and speed > 0 else None)
            self._net.append((nic, self._p(base, "statistics/rx_bytes"), self._p(base, "statistics/tx_bytes"), 1))
        self._vols = []
        mounts = parse_mounts(self._read("proc/mounts") or "")
        for path in self._paths:
            st = self._stat(path)
            if st is None:
                continue
            total = st.f_blocks * st.f_frsize / _GIB
            self._vols.append((VolumeInfo(path, round(total, 3), filesystem_of(path, mounts)), self._p(path)))

    def _read_ib_ports(self) -> list[tuple[NicInfo, str, str, int]]:
        out = []
        for dev in self._list("sys/class/infiniband"):
            for port in self._list(f"sys/class/infiniband/{dev}/ports"):
                base = f"sys/class/infiniband/{dev}/ports/{port}"
                if (self._read(base, "link_layer") or "").strip() != "InfiniBand":
                    continue  # RoCE: an Ethernet port, read through its netdev
                active = "ACTIVE" in (self._read(base, "state") or "")
                speed = parse_ib_rate(self._read(base, "rate") or "") if active else None
                # port_rcv_data / port_xmit_data count 4-byte words (the IB spec's unit)
                out.append((NicInfo(f"{dev}/{port}", "infiniband", speed), self._p(base, "counters/port_rcv_data"),
                            self._p(base, "counters/port_xmit_data"), 4))
        return out

    def _stat(self, path: str) -> Any:
        try:
            return self._statvfs(self._p(path))
        except OSError:
            return None

    def nics(self) -> tuple[NicInfo, ...]:
        return tuple(n for n, *_ in self._net)

    def volumes(self) -> tuple[VolumeInfo, ...]:
        return tuple(v for v, _ in self._vols)

    # ---- per sample --------------------------------------------------------------------------------------------
    def sample(self) -> NodeSample:
        now = self._clock()
        cpu_pct = None
        stat = self._read("proc/stat")
        cpu = parse_cpu_times(stat) if stat else None
        if cpu is not None and self._last_cpu is not None and cpu[1] > self._last_cpu[1]:
            busy = cpu[0] - self._last_cpu[0]
            cpu_pct = round(max(0.0, min(100.0, 100.0 * busy / (cpu[1] - self._last_cpu[1]))), 1)
        if cpu is not None:
            self._last_cpu = cpu
        meminfo = self._read("proc/meminfo")
        rx_mbps = tx_mbps = None
        if self._net:
            counts = [(mult * (_file_int(rx_path) or 0), mult * (_file_int(tx_path) or 0))
                      for _, rx_path, tx_path, mult in self._net]
            last = self._last_net
            if last is not None and now > last[0] and len(last[1]) == len(counts):
                # per interface: a counter that went back (driver reload, link reset) reads as no traffic
                rx = sum(max(0, c[0] - p[0]) for c, p in zip(counts, last[1], strict=True))
                tx = sum(max(0, c[1] - p[1]) for c, p in zip(counts, last[1], strict=True))
                dt = now - last[0]
                rx_mbps = round(rx * 8 / dt / 1e6, 3)
                tx_mbps = round(tx * 8 / dt / 1e6, 3)
            self._last_net = (now, counts)
        used_gib = None
        if self._vols:
            used = 0.0
            for _, path in self._vols:
                st = self._stat_abs(path)
                if st is not None:
                    used += (st.f_blocks - st.f_bfree) * st.f_frsize / _GIB
            used_gib = round(used, 3)
        return NodeSample(cpu_util_pct=cpu_pct, memory_used_mib=parse_meminfo_used_mib(meminfo) if meminfo else None,
                          network_rx_mbps=rx_mbps, network_tx_mbps=tx_mbps, storage_used_gib=used_gib)

    def _stat_abs(self, path: str) -> Any:
        try:
            return self._statvfs(path)
        except OSError:
            return None


def _file_int(path: str) -> int | None:
    try:
        with open(path, encoding="ascii") as fh:
            return int(fh.read().strip())
    except (OSError, ValueError):
        return None
