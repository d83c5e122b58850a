"""`gpupool bench inventory`: can inventory keep up with a fleet of simulated GPUs reporting every second?

For each fleet size: a fresh embedded NATS (JetStream) and PostgreSQL, the inventory service as its own process,
and `gpupool agent --simulate` processes (8 GPUs per node, one sample per node per interval) publishing real
telemetry to JetStream, sampling by change (`--heartbeat`, 0: every sample sent) with a simulated load on the
GPUs (`--background`). After every node registered and a warm-up, a window is measured:

  sampled     GPU samples/s the agents took (their gpupool_agent_telemetry_samples_total), and the share sent
  published   GPU samples/s the agents put on GPUPOOL_TELEMETRY (the rest were left out as unchanged)
  ingested    GPU samples/s inventory applied (its gpupool_inventory_gpu_samples_total counter)
  lag         age of a sample when its batch committed (inventory's gpupool_inventory_sample_lag_seconds
              histogram, p50/p99 interpolated within buckets)
  backlog     messages not yet delivered to inventory's consumer at the start and end of the window
  CPU, memory per component (psutil: CPU seconds over the window / wall seconds; peak RSS)

"Keeps up" means the agents sampled ≥ 95 % of the fleet every interval, inventory ingested ≥ 98 % of what was
published, the backlog did not grow by more than one interval's worth, and lag p99 stayed under 5 s. Only inventory consumes telemetry here (no reclamation, no other service), and everything —
agents, NATS, PostgreSQL, inventory — shares the same machine.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import os
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

import asyncpg
import nats
import psutil
from prometheus_client.parser import text_string_to_metric_families

from libs.bench import benchdoc
from libs.devstack.servers import ManagedServer, listen_socket, start_nats, start_postgres
from libs.store.database import with_database

BEGIN, END = "<!-- inventory-benchmark:begin -->", "<!-- inventory-benchmark:end -->"
GPUS_PER_NODE = 8
STREAM = "GPUPOOL_TELEMETRY"
CONSUMER = "inventory-telemetry"
# a busy fleet: half the GPUs training, a quarter serving, some notebooks, a tenth free (an idle fleet would make
# sampling by change look better than it is)
DEFAULT_BACKGROUND = "training=0.5,inference=0.25,dev=0.15"


@dataclass
class Scrape:
    at: float
    gpu_samples: float
    lag_buckets: list[tuple[float, float]]  # (upper bound, cumulative count)
    published_seq: int
    pending: int
    cpu: dict[str, dict[int, float]]
    taken: tuple[float, float] = (0.0, 0.0)  # GPU samples the agents took so far: (sent, left out as unchanged)


@dataclass
class Level:
    gpus: int
    nodes: int
    agents: int
    interval_s: float
    window_s: float = 0.0
    published_per_s: float = 0.0
    ingested_per_s: float = 0.0
    lag_p50_s: float = float("nan")
    lag_p99_s: float = float("nan")
    backlog_start: int = 0
    backlog_end: int = 0
    cpu_pct: dict[str, float] = field(default_factory=dict)
    rss_mib: dict[str, float] = field(default_factory=dict)
    registered_s: float = 0.0
    note: str = ""
    catch_up: dict[str, float] = field(default_factory=dict)
    heartbeat_s: float = 5.0  # the agents' sampling by change (0: every sample sent)
    background: str = ""  # the simulated load on the fleet's GPUs (agent --background)
    taken_per_s: float = 0.0  # GPU samples/s the agents took (sent or left out as unchanged)
    sent_share: float = 1.0  # of those, the share sent

    def cpu_us_per_gpu_sample(self, component: str) -> float:
        """CPU microseconds `component` spent per GPU sample ingested: what the fleet costs it, far less sensitive to
        other work on a shared machine than the rates."""
        return 1e4 * self.cpu_pct.get(component, 0.0) / self.ingested_per_s if self.ingested_per_s else float("nan")

    @property
    def keeps_up(self) -> bool:
        grew = self.backlog_end - self.backlog_start
        cadence = not self.taken_per_s or self.taken_per_s >= 0.95 * self.gpus / self.interval_s  # 0: not measured
        return (self.ingested_per_s >= 0.98 * self.published_per_s and grew <= self.nodes
                and self.lag_p99_s < 5.0 and cadence)


def agent_samples(ports: list[int]) -> tuple[float, float]:
    """GPU samples the agents took so far: (sent, left out as unchanged), from their /metrics. A simulated fleet's
    page is large (DCGM series of hundreds of nodes) and its agents busy: read them all at once, patiently."""
    def one(port: int) -> tuple[float, float]:
        sent = unchanged = 0.0
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=120) as resp:
            for raw in resp:  # only our two lines: parsing the whole page would cost more than the agents
                if raw.startswith(b"gpupool_agent_telemetry_samples_total{"):
                    value = float(raw.rsplit(b" ", 1)[1])
                    if b'outcome="sent"' in raw:
                        sent += value
                    else:
                        unchanged += value
        return sent, unchanged

    with ThreadPoolExecutor(max_workers=max(1, len(ports))) as pool:
        counts = list(pool.map(one, ports))
    return sum(c[0] for c in counts), sum(c[1] for c in counts)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def counted(url: str) -> tuple[float, float]:
    """Inventory's GPU samples so far: (applied, left out by agents as unchanged and counted as held)."""
    with urllib.request.urlopen(url, timeout=10) as resp:
        text = resp.read().decode()
    values = {s.name: s.value for family in text_string_to_metric_families(text) for s in family.samples}
    return (values.get("gpupool_inventory_gpu_samples_total", 0.0),
            values.get("gpupool_inventory_gpu_samples_held_total", 0.0))


def metrics(url: str) -> tuple[float, list[tuple[float, float]]]:
    with urllib.request.urlopen(url, timeout=10) as resp:
        text = resp.read().decode()
    samples, buckets = 0.0, []
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            if s.name == "gpupool_inventory_gpu_samples_total":
                samples = s.value
            elif s.name == "gpupool_inventory_sample_lag_seconds_bucket":
                buckets.append((float(s.labels["le"]), s.value))
    return samples, sorted(buckets)


def quantile(start: list[tuple[float, float]], end: list[tuple[float, float]], q: float) -> float:
    """q-quantile of the observations between two scrapes of a cumulative histogram (linear within a bucket)."""
    before = dict(start)
    counts = [(le, c - before.get(le, 0.0)) for le, c in end]
    total = counts[-1][1] if counts else 0.0
    if total <= 0:
        return float("nan")
    target, lower, prev = q * total, 0.0, 0.0
    for le, cum in counts:
        if cum >= target:
            if math.isinf(le):
                return lower  # beyond the last finite bucket: report its bound (a floor)
            return lower + (le - lower) * ((target - prev) / max(cum - prev, 1e-9))
        lower, prev = le, cum
    return lower


def processes(groups: dict[str, list[int]]) -> dict[str, list[psutil.Process]]:
    """Each group's processes and all their children (PostgreSQL backends, agent subprocesses)."""
    out: dict[str, list[psutil.Process]] = {}
    for name, pids in groups.items():
        procs = []
        for pid in pids:
            try:
                p = psutil.Process(pid)
                procs += [p, *p.children(recursive=True)]
            except psutil.NoSuchProcess:
                pass
        out[name] = procs
    return out


def cpu_seconds(groups: dict[str, list[int]]) -> dict[str, dict[int, float]]:
    """CPU seconds so far of every process of each group, by pid (PostgreSQL backends come and go)."""
    out: dict[str, dict[int, float]] = {}
    for name, procs in processes(groups).items():
        out[name] = {}
        for p in procs:
            try:
                t = p.cpu_times()
                out[name][p.pid] = t.user + t.system
            except psutil.NoSuchProcess:
                pass
    return out


def cpu_used(first: dict[int, float], last: dict[int, float]) -> float:
    """CPU seconds a group used between two readings: processes alive at both by difference, new ones whole (a
    process that exited in between is missed: a small undercount for short-lived PostgreSQL backends)."""
    return sum(t - first.get(pid, 0.0) for pid, t in last.items())


def rss_mib(groups: dict[str, list[int]]) -> dict[str, float]:
    out = {}
    for name, procs in processes(groups).items():
        total = 0
        for p in procs:
            try:
                total += p.memory_info().rss
            except psutil.NoSuchProcess:
                pass
        out[name] = total / 2**20
    return out


async def stream_state(nats_url: str) -> tuple[int, int]:
    """(last sequence of the telemetry stream, messages not yet delivered to inventory's consumer)."""
    nc = await nats.connect(nats_url)
    try:
        js = nc.jetstream()
        seq = (await js.stream_info(STREAM)).state.last_seq
        try:
            pending = (await js.consumer_info(STREAM, CONSUMER)).num_pending
        except Exception:
            pending = 0
        return seq, pending
    finally:
        await nc.close()


async def registered_nodes(dsn: str) -> int:
    try:
        conn = await asyncpg.connect(dsn)
    except Exception:
        return 0
    try:
        return await conn.fetchval("SELECT count(*) FROM nodes")
    except asyncpg.UndefinedTableError:
        return 0
    finally:
        await conn.close()


def wait_http(url: str, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            with urllib.request.urlopen(url, timeout=1) as resp:
                if resp.status == 200:
                    return
        except Exception:
            pass
        time.sleep(0.2)
    raise RuntimeError(f"{url} not ready after {timeout:.0f} s")


def _agent_priority(nice: int):  # type: ignore[no-untyped-def]
    """In the agent child before exec: lower its CPU priority. In a real fleet each agent runs on its own GPU node;
    here the simulated fleet shares the inventory's cores, and should not win them from inventory."""
    return (lambda: os.nice(nice)) if nice else None


def run_level(gpus: int, *, interval_s: float, nodes_per_agent: int, warmup_s: float, window_s: float,
              catch_up_s: float = 0.0, agent_nice: int = 0, keep: Path | None = None, heartbeat_s: float = 5.0,
              background: str = "", say=print) -> Level:  # type: ignore[no-untyped-def]
    nodes = max(1, gpus // GPUS_PER_NODE)
    agents = max(1, math.ceil(nodes / nodes_per_agent))
    level = Level(gpus=nodes * GPUS_PER_NODE, nodes=nodes, agents=agents, interval_s=interval_s,
                  heartbeat_s=heartbeat_s, background=background)
    with tempfile.TemporaryDirectory(prefix="gpupool-bench-inventory-") as tmp:
        data = Path(tmp) if keep is None else keep / f"{level.gpus}-gpus"
        data.mkdir(parents=True, exist_ok=True)
        run = _LevelRun(level, data, agent_nice, say)
        try:
            run.start()
            run.wait_for_fleet()
            time.sleep(warmup_s)
            run.measure(window_s)
            if catch_up_s > 0:
                run.catch_up(catch_up_s)
        finally:
            run.stop()
    return level


class _LevelRun:
    """One level of the benchmark: NATS, PostgreSQL, inventory and the simulated fleet as processes; `start`,
    `wait_for_fleet` (registered, then reporting at its full rate), `measure` (a window of steady state),
    `catch_up` (inventory alone drains a backlog), `stop`."""

    def __init__(self, level: Level, data: Path, agent_nice: int, say) -> None:  # type: ignore[no-untyped-def]
        self.level, self.data, self.agent_nice, self.say = level, data, agent_nice, say
        self.logs = data / "logs"
        self.logs.mkdir(exist_ok=True)
        self.servers: list[ManagedServer] = []
        self.procs: list[subprocess.Popen] = []
        self.listener: socket.socket | None = None
        self.base = {k: v for k, v in os.environ.items() if not k.startswith("GPUPOOL_")}

    def start(self) -> None:
        self.nats = start_nats(self.data / "nats", log_file=self.logs / "nats.log")
        self.servers.append(self.nats)
        self.pg = start_postgres(self.data / "pg", log_file=self.logs / "pg.log")
        self.servers.append(self.pg)
        self.dsn = with_database(self.pg.url, "bench_inventory")
        # bound here and inherited (held for the whole level, across the catch-up restart): no other process
        # can take the port between its choice and the bind
        self.listener = listen_socket()
        self.port = self.listener.getsockname()[1]
        self.inv_env = {**self.base, "PYTHONUNBUFFERED": "1", **{f"GPUPOOL_INVENTORY_{k}": v for k, v in {
            "NATS_URL": self.nats.url, "DATABASE_URL": self.dsn, "HTTP_PORT": str(self.port),
            "HTTP_FD": str(self.listener.fileno()), "LOG_LEVEL": "WARNING",
            "NODE_LOST_AFTER_S": "600", "INSTANCE": "bench-inventory"}.items()}}
        self.inventory = self._start_inventory("inventory.log")
        self.procs.append(self.inventory)
        self.started = time.monotonic()
        level, agents = self.level, self.level.agents
        share = [level.nodes // agents + (1 if k < level.nodes % agents else 0) for k in range(agents)]
        self.agent_ports = [free_port() for _ in share]
        for k, n in enumerate(share):
            with open(self.logs / f"agent-{k}.log", "ab") as log:
                self.procs.append(subprocess.Popen(
                    [sys.executable, "-m", "libs.cli.main", "agent", "--simulate", str(n), "--prefix",
                     f"b{k}-node", "--seed", str(k), "--interval", str(level.interval_s), "--nats-url",
                     self.nats.url, "--log-level", "WARNING", "--http-port", str(self.agent_ports[k]),
                     "--heartbeat", str(level.heartbeat_s), *(["--background", level.background]
                                                              if level.background else [])],
                    env={**self.base, "PYTHONUNBUFFERED": "1"}, stdout=log, stderr=subprocess.STDOUT,
                    stdin=subprocess.DEVNULL, preexec_fn=_agent_priority(self.agent_nice)))

    def _start_inventory(self, log_name: str) -> subprocess.Popen:
        assert self.listener is not None
        with open(self.logs / log_name, "ab") as log:
            proc = subprocess.Popen([sys.executable, "-m", "services.inventory.main"], env=self.inv_env,
                                    stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                    pass_fds=(self.listener.fileno(),))  # the same port on a restart
        wait_http(f"http://127.0.0.1:{self.port}/readyz", 60)
        return proc

    def wait_for_fleet(self) -> None:
        level = self.level
        self.say(f"[bench] {level.gpus} GPUs: {level.nodes} nodes in {level.agents} agent process(es); waiting "
                 "for registration")
        deadline = time.monotonic() + 300
        while asyncio.run(registered_nodes(self.dsn)) < level.nodes:
            if time.monotonic() > deadline:
                raise RuntimeError(f"only {asyncio.run(registered_nodes(self.dsn))} of {level.nodes} nodes "
                                   "registered")
            if any(p.poll() is not None for p in self.procs):
                raise RuntimeError(f"a process exited early; logs in {self.logs}")
            time.sleep(1)
        # Registered in inventory is not yet reporting: an agent whose registration request timed out in the
        # start-up herd retries (with back-off) before it samples. Wait until the fleet samples at its full
        # rate (sent or left out as unchanged), or until its rate stops rising (its capacity on this machine).
        target = level.gpus / level.interval_s
        rates: list[float] = []
        url = f"http://127.0.0.1:{self.port}/metrics"
        seq = sum(counted(url))
        while time.monotonic() < deadline:
            time.sleep(3)
            now_seq = sum(counted(url))
            rates.append((now_seq - seq) / 3)
            seq = now_seq
            if rates[-1] >= 0.95 * target or (len(rates) >= 4 and rates[-1] <= 1.02 * max(rates[-3:-1])):
                break
        level.registered_s = time.monotonic() - self.started

    def _scrape(self, groups: dict[str, list[int]]) -> Scrape:
        samples, buckets = metrics(f"http://127.0.0.1:{self.port}/metrics")
        seq, pending = asyncio.run(stream_state(self.nats.url))
        return Scrape(time.monotonic(), samples, buckets, seq, pending, cpu_seconds(groups),
                      agent_samples(self.agent_ports))

    def measure(self, window_s: float) -> None:
        level = self.level
        groups = {"inventory": [self.inventory.pid], "postgresql": [self.pg.pid], "nats": [self.nats.pid],
                  "agents": [p.pid for p in self.procs[1:]]}
        self.say(f"[bench] {level.gpus} GPUs: measuring {window_s:.0f} s")
        first = self._scrape(groups)
        peak: dict[str, float] = {}
        while time.monotonic() < first.at + window_s:
            time.sleep(2)
            for name, mib in rss_mib(groups).items():
                peak[name] = max(peak.get(name, 0.0), mib)
        last = self._scrape(groups)
        wall = last.at - first.at
        level.window_s = wall
        level.ingested_per_s = (last.gpu_samples - first.gpu_samples) / wall
        level.lag_p50_s = quantile(first.lag_buckets, last.lag_buckets, 0.50)
        level.lag_p99_s = quantile(first.lag_buckets, last.lag_buckets, 0.99)
        level.backlog_start, level.backlog_end = first.pending, last.pending
        level.cpu_pct = {k: 100 * cpu_used(first.cpu.get(k, {}), last.cpu[k]) / wall for k in last.cpu}
        level.rss_mib = peak
        sent, unchanged = (b - a for a, b in zip(first.taken, last.taken, strict=True))
        level.taken_per_s = (sent + unchanged) / wall
        # GPU samples on the bus: the agents' count (a node's message carries only its GPUs that changed, or all of
        # them at its heartbeat), not the stream's messages × 8
        level.published_per_s = sent / wall
        level.sent_share = sent / (sent + unchanged) if sent + unchanged else 1.0
        expected = level.nodes * GPUS_PER_NODE / level.interval_s
        if level.taken_per_s < 0.95 * expected:
            level.note = (f"the simulated fleet itself sampled only {level.taken_per_s:,.0f} of the "
                          f"{expected:,.0f} GPU samples/s asked for")
        self.say(f"[bench] {level.gpus} GPUs: published {level.published_per_s:,.0f}/s, ingested "
                 f"{level.ingested_per_s:,.0f}/s, lag p99 {level.lag_p99_s:.2f} s, backlog {level.backlog_start} → "
                 f"{level.backlog_end}, keeps up: {level.keeps_up}")

    def catch_up(self, catch_up_s: float) -> None:
        """Inventory stops while the fleet keeps reporting; then the fleet stops and inventory starts again with
        the machine to itself, and drains the backlog: its own ingest capacity."""
        level, procs = self.level, self.procs
        self.inventory.terminate()
        self.inventory.wait(timeout=30)
        self.say(f"[bench] {level.gpus} GPUs: inventory stopped; the fleet builds a backlog for {catch_up_s:.0f} s")
        time.sleep(catch_up_s)
        for p in procs[1:]:
            p.terminate()
        for p in procs[1:]:
            p.wait(timeout=30)
        backlog = asyncio.run(stream_state(self.nats.url))[1]
        self.inventory = procs[0] = self._start_inventory("inventory-2.log")
        metrics_url = f"http://127.0.0.1:{self.port}/metrics"
        while (first_applied := metrics(metrics_url)[0]) == 0:  # timed from its first applied batch
            time.sleep(0.05)
        t0, cpu0 = time.monotonic(), cpu_seconds({"inventory": [self.inventory.pid]})
        while asyncio.run(stream_state(self.nats.url))[1] > 0 and time.monotonic() < t0 + 600:
            time.sleep(0.5)
        drained_s = time.monotonic() - t0
        applied = metrics(metrics_url)[0] - first_applied
        used = cpu_used(cpu0["inventory"], cpu_seconds({"inventory": [self.inventory.pid]})["inventory"])
        level.catch_up = {"backlog_msgs": backlog, "gpu_samples": applied, "seconds": drained_s,
                          "gpu_samples_per_s": applied / drained_s if drained_s else 0.0,
                          "inventory_cpu_pct": 100 * used / drained_s if drained_s else 0.0}
        self.say(f"[bench] {level.gpus} GPUs: inventory alone drained {backlog:,} node samples "
                 f"({applied:,.0f} GPU samples) in {drained_s:.1f} s = {level.catch_up['gpu_samples_per_s']:,.0f} "
                 f"GPU samples/s")

    def stop(self) -> None:
        for p in reversed(self.procs):
            p.terminate()
        for p in reversed(self.procs):
            try:
                p.wait(timeout=20)
            except subprocess.TimeoutExpired:
                p.kill()
        for server in reversed(self.servers):
            server.stop()
        if self.listener is not None:
            self.listener.close()


def _catch_up(lv: Level) -> str:
    c = lv.catch_up
    if not c:
        return "-"
    return (f"{c['gpu_samples_per_s']:,.0f} GPU samples/s ({c['backlog_msgs']:,.0f} node samples in "
            f"{c['seconds']:.0f} s, {c['inventory_cpu_pct']:.0f} % CPU)")


def _verdict(levels: list[Level], cpus: int | None) -> str:
    """The plain answer: does the largest fleet measured keep up, with sampling by change and without, and what
    inventory alone drains."""
    largest = max(lv.gpus for lv in levels)
    top = [lv for lv in levels if lv.gpus == largest]
    sustained = [lv for lv in levels if lv.keeps_up]
    parts = []
    for lv in top:
        how = f"sampling by change (heartbeat {lv.heartbeat_s:g} s)" if lv.heartbeat_s else "every sample sent"
        parts.append(f"{largest:,} GPUs every second with {how}: "
                     + (f"**kept up** ({lv.ingested_per_s:,.0f} GPU samples/s ingested, lag p99 {lv.lag_p99_s:.2f} s)"
                        if lv.keeps_up else "**did not keep up** on this machine"))
    verdict = f"On this {cpus}-core machine, with everything on it: " + "; ".join(parts) + "."
    if not all(lv.keeps_up for lv in top):
        best = max(sustained, key=lambda lv: lv.gpus, default=None)
        verdict += (f" The largest fleet that kept up here was {best.gpus:,} GPUs "
                    f"({'heartbeat ' + format(best.heartbeat_s, 'g') + ' s' if best.heartbeat_s else 'every sample'})."
                    if best is not None else " No measured fleet size kept up.")
    caught = [lv for lv in levels if lv.catch_up]
    if caught:
        ref = max(caught, key=lambda lv: (lv.gpus, lv.catch_up["gpu_samples_per_s"]))
        rate = ref.catch_up["gpu_samples_per_s"]
        verdict += (f" With the fleet stopped, inventory alone drained a {ref.gpus:,}-GPU fleet's backlog at "
                    f"{rate:,.0f} GPU samples/s using {ref.catch_up['inventory_cpu_pct']:.0f} % of one core — "
                    f"{'enough' if rate >= largest else 'not enough'} for {largest:,} GPUs every second with every "
                    "sample sent, once the agents run on their own nodes, as they do in a real fleet.")
    return verdict


def markdown(levels: list[Level], command: str, load_before: tuple[float, float, float],
             agent_nice: int = 0, note: str = "") -> str:
    cpus = os.cpu_count()
    lines = [
        BEGIN,
        "## Inventory ingest: simulated GPUs reporting every second",
        "",
        f"`{command}` — for each fleet size a fresh embedded NATS + PostgreSQL, the inventory service (one process) "
        f"and `gpupool agent --simulate` processes (8 × H100 per node, one sample per node per "
        f"{levels[0].interval_s:g} s, sampled by change unless the heartbeat is off) publishing to JetStream; after "
        "all nodes registered and a warm-up, a "
        f"{levels[0].window_s:.0f} s window is measured (agents at nice {agent_nice}); then inventory is stopped while the fleet "
        "keeps reporting, the fleet is stopped, and inventory restarted drains the backlog with the machine to itself "
        f"(catch-up). Machine: {benchdoc.machine()}; load average before the run "
        f"{load_before[0]:.1f} (other work shares this machine). Agents, NATS, PostgreSQL and inventory all run on "
        "it, and only inventory consumes telemetry.",
        "",
        "| GPUs (nodes) | heartbeat | sampled GPU samples/s (sent) | published GPU samples/s | ingested GPU "
        "samples/s | lag p50 | lag p99 | backlog start → end "
        "| keeps up | CPU % inventory / PostgreSQL / NATS / agents | CPU µs per GPU sample inventory / PostgreSQL / "
        "NATS / agents | peak RSS MiB inventory / PostgreSQL | catch-up: inventory alone drains |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for lv in levels:
        c, r = lv.cpu_pct, lv.rss_mib
        lines.append(
            f"| {lv.gpus:,} ({lv.nodes:,}) | {f'{lv.heartbeat_s:g} s' if lv.heartbeat_s else 'off'} | "
            f"{lv.taken_per_s:,.0f} ({100 * lv.sent_share:.0f} %) | {lv.published_per_s:,.0f} | "
            f"{lv.ingested_per_s:,.0f} | "
            f"{lv.lag_p50_s:.2f} s | {lv.lag_p99_s:.2f} s | {lv.backlog_start:,} → {lv.backlog_end:,} | "
            f"{'yes' if lv.keeps_up else '**no**'} | {c.get('inventory', 0):.0f} / {c.get('postgresql', 0):.0f} / "
            f"{c.get('nats', 0):.0f} / {c.get('agents', 0):.0f} | "
            f"{' / '.join(f'{lv.cpu_us_per_gpu_sample(k):.1f}' for k in ('inventory', 'postgresql', 'nats', 'agents'))}"
            f" | {r.get('inventory', 0):.0f} / "
            f"{r.get('postgresql', 0):.0f} | {_catch_up(lv)} |")
    lines.append("")
    notes = [f"- {lv.gpus:,} GPUs: {lv.note}." for lv in levels if lv.note]
    lines.append(_verdict(levels, cpus))
    lines += [*([""] + notes if notes else []), *(["", note] if note else []), "",
              "Inventory applies each fetched batch (up to 256 node samples) in one transaction: lock the batch's "
              "nodes, read their GPUs' health state and previous sample, then one statement writes each GPU's "
              "latest sample and adds it to its open minute's sums on the same row (a finished minute moves to the "
              "rollups table), and only GPUs whose health state moved are stored. Lag is the age of a sample when "
              "its batch committed, so it includes time queued in JetStream; the backlog is what JetStream holds "
              "for inventory's consumer. CPU per GPU sample is each component's CPU time over the window divided by "
              "the GPU samples ingested.",
              "",
              "Sampling by change (agent `HEARTBEAT_S`, `DEADBAND_*`; services/agent/README.md): a node's message "
              "carries only the GPUs whose values moved beyond the deadband since they were last sent, and every "
              "GPU at the heartbeat; inventory counts a left-out sample as the GPU's previous values in the rollups "
              "(its `gpupool_inventory_gpu_samples_held_total`). The simulated fleet carries a background load "
              f"(`{levels[0].background or 'none: every GPU idle'}`: shares of the GPUs training, serving, in "
              "notebooks; the rest free) so the deadband is measured on a busy fleet, not an idle one; heartbeat "
              "`off` is the worst case, every sample sent.",
              END]
    return "\n".join(lines)


def write_section(path: Path, section: str) -> None:
    benchdoc.write_section(path, BEGIN, END, section)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="gpupool bench inventory", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--gpus", type=int, nargs="+", default=[10_000, 5_000, 2_500],
                        help="fleet sizes to measure, in GPUs (8 per node)")
    parser.add_argument("--interval", type=float, default=1.0, help="seconds between a node's samples")
    parser.add_argument("--heartbeat", type=float, nargs="+", default=[5.0],
                        help="the agents' sampling by change: longest silence in seconds, one level per value and "
                             "fleet size (0: every sample sent, the worst case)")
    parser.add_argument("--background", default=DEFAULT_BACKGROUND,
                        help="simulated load on the fleet's GPUs, KIND=SHARE,... (agent --background; '' : all idle)")
    parser.add_argument("--nodes-per-agent", type=int, default=320, help="simulated nodes per agent process")
    parser.add_argument("--warmup", type=float, default=15.0, help="seconds after registration before measuring")
    parser.add_argument("--window", type=float, default=60.0, help="seconds measured")
    parser.add_argument("--catch-up", type=float, default=30.0,
                        help="then stop inventory this long while the fleet reports, stop the fleet, and time "
                             "inventory draining the backlog alone (0: skip)")
    parser.add_argument("--doc", type=Path, default=Path("docs/benchmarks.md"),
                        help="markdown file whose inventory section is (re)written")
    parser.add_argument("--json", type=Path, default=None, help="also write the raw results here")
    parser.add_argument("--keep", type=Path, default=None, help="keep each level's data and logs under this folder")
    parser.add_argument("--note", default="", help="a paragraph to add to the report (e.g. earlier runs)")
    parser.add_argument("--render", type=Path, default=None, metavar="JSON",
                        help="measure nothing: write the report from results saved with --json (with the command "
                             "given by --command)")
    parser.add_argument("--command", default="", help="with --render: the command that measured them")
    parser.add_argument("--agent-nice", type=int, default=0,
                        help="run the simulated agents at this nice level, e.g. 10 so they never win CPU from "
                             "inventory (in a real fleet they run on their own nodes); default 0: same priority")
    args = parser.parse_args(argv)
    if args.render:
        doc = json.loads(args.render.read_text())
        levels = [Level(**{k: v for k, v in lv.items() if k in Level.__dataclass_fields__}) for lv in doc["levels"]]
        write_section(args.doc, markdown(levels, args.command or doc["command"], tuple(doc["load_before"]),
                                         doc.get("agent_nice", 0), args.note))
        return 0
    load = os.getloadavg()
    levels = [run_level(g, interval_s=args.interval, nodes_per_agent=args.nodes_per_agent, warmup_s=args.warmup,
                        window_s=args.window, catch_up_s=args.catch_up, agent_nice=args.agent_nice, keep=args.keep,
                        heartbeat_s=hb, background=args.background)
              for g in args.gpus for hb in args.heartbeat]
    shown, raw = [], list(argv if argv is not None else sys.argv[1:])
    while raw:  # where the report and raw results go, and the note's text, say nothing about the measurement
        arg = raw.pop(0)
        if arg in ("--note", "--doc", "--json", "--keep"):
            raw.pop(0) if raw else None
            continue
        shown.append(arg)
    command = ("gpupool bench inventory " + " ".join(shown)).strip()
    if args.json:
        args.json.write_text(json.dumps({"command": command, "load_before": load, "agent_nice": args.agent_nice,
                                         "levels": [lv.__dict__ | {"keeps_up": lv.keeps_up} for lv in levels]},
                                        indent=2) + "\n")
    write_section(args.doc, markdown(levels, command, load, args.agent_nice, args.note))
    print(json.dumps([{"gpus": lv.gpus, "published_per_s": round(lv.published_per_s),
                       "ingested_per_s": round(lv.ingested_per_s), "lag_p99_s": round(lv.lag_p99_s, 3),
                       "keeps_up": lv.keeps_up} for lv in levels], indent=2))
    return 0 if levels else 1


if __name__ == "__main__":
    sys.exit(main())

