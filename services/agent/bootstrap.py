"""Composition root of the agent: one process drives one real node, or a whole simulated fleet."""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import logging
import os
import signal
import socket
import tempfile
import time
from pathlib import Path

from libs.bus.connection import NatsClient, connect, ensure_streams, identity_inbox, wait_for_streams
from libs.contracts import subjects
from libs.contracts.fleet import parse_fleet_nodes
from libs.contracts.labels import parse_labels
from libs.observability.logging import setup_logging
from libs.observability.tracing import enter_background, setup_tracing
from libs.runtime.http import OpsEndpoint
from services.agent.config import AgentSettings
from services.agent.domain import Deadband, network_environment, simulated_address
from services.agent.handlers import NodeAgent, telemetry_buffer
from services.agent.mps import MpsControl
from services.agent.nvml_sim import SimulatedNvml
from services.agent.nvml_types import NvmlBackend
from services.agent.work import WorkRunner

log = logging.getLogger(__name__)


def deadband(settings: AgentSettings) -> Deadband:
    """Sampling by change, from the settings (HEARTBEAT_S 0: every sample is sent)."""
    return Deadband(heartbeat_s=settings.heartbeat_s, util_pct=settings.deadband_util_pct,
                    memory_mib=settings.deadband_memory_mib, temperature_c=settings.deadband_temperature_c,
                    power_w=settings.deadband_power_w)


def build_backends(settings: AgentSettings) -> list[tuple[str, NvmlBackend]]:
    if settings.backend == "real":
        from services.agent.nvml_real import RealNvml

        paths = tuple(p.strip() for p in settings.storage_paths.split(",") if p.strip())
        return [(settings.node, RealNvml(storage_paths=paths or ("/",)))]
    fleet = parse_fleet_nodes(settings.sim_fleet)
    mig_models = {m.strip() for m in settings.sim_mig.split(",") if m.strip()}
    return [
        (f"{settings.sim_node_prefix}-{i}",
         SimulatedNvml(f"{settings.sim_node_prefix}-{i}", spec.models, seed=settings.seed + i, clock=time.time,
                       mig_mode=[j for j, m in enumerate(spec.models) if m in mig_models],
                       numa_nodes=spec.numa_nodes, nvlink=spec.nvlink))
        for i, spec in enumerate(fleet)
    ]


def node_labels(settings: AgentSettings) -> dict[str, dict[str, str]]:
    """Each node's labels: the agent's LABELS, and for a simulated node those its fleet spec gives it (over them)."""
    base = parse_labels(settings.labels)
    if settings.backend == "real":
        return {settings.node: base}
    return {f"{settings.sim_node_prefix}-{i}": {**base, **spec.labels}
            for i, spec in enumerate(parse_fleet_nodes(settings.sim_fleet))}


def build_mps(settings: AgentSettings, digest: str) -> MpsControl | None:
    """The node's MPS daemons for fractions, or None where MPS is off (auto: the real backend with the control
    binary installed; a simulated GPU has no MPS)."""
    wanted = settings.mps == "on" or (settings.mps == "auto" and settings.backend == "real"
                                      and MpsControl.find(settings.mps_control) is not None)
    if not wanted:
        return None
    # short (under the state dir's `digest`): the daemon's sockets live in <root>/<GPU uuid>/pipe, and a socket
    # path has at most 107 bytes
    base = Path(settings.mps_dir) if settings.mps_dir else (
        Path("/run/gpupool-mps") if os.geteuid() == 0 else Path(tempfile.gettempdir()) / f"gpupool-mps-{os.geteuid()}")
    return MpsControl(base / digest, settings.mps_control, client_uid=settings.run_as_uid)


def build_runner(nc, agent: NodeAgent, settings: AgentSettings) -> WorkRunner:  # type: ignore[no-untyped-def]
    """One executor per node, each with its own state directory and cgroup name: a simulated fleet runs many on
    one machine."""
    from services.agent.executor import Executor

    drivers = {d.strip() for d in settings.drivers.split(",") if d.strip()}
    state_dir = Path(settings.state_dir) / agent.cluster / agent.node
    # the cgroup name (and the MPS directory) carries the state dir's digest: simulated fleets of several platforms
    # on one host (their nodes all named sim-node-N) never adopt or clean up each other's; a real node's name stays
    # stable
    digest = hashlib.sha256(str(state_dir.resolve()).encode()).hexdigest()[:8]
    runner = WorkRunner(nc, agent.cluster, agent.node, None, agent._publish, device_dir=settings.device_dir,  # type: ignore[arg-type]
                        run_as_uid=settings.run_as_uid, log_max_bytes=settings.log_max_mib * 1024 * 1024,
                        kill_on_close=settings.stop_work_on_exit, grants_dir=state_dir / "grants",
                        log_retention_s=settings.log_retention_s, mps=build_mps(settings, digest),
                        rendezvous_env=network_environment(settings.nccl_socket_ifname, settings.nccl_ib_hca),
                        address=agent.address)
    runner.executor = Executor(state_dir,
                               f"{agent.cluster}-{agent.node}-{digest}", on_exit=runner.on_exit, drivers=drivers,
                               default_uid=settings.run_as_uid, max_stop_grace_s=settings.max_stop_grace_s,
                               checkpoint_root=settings.checkpoint_root or None)
    return runner


async def report_drivers(agents: list[NodeAgent]) -> None:
    """Which isolation drivers the nodes offer and can run, for their registration (as labels). Probing runs the
    sandbox and container tools (about half a second), so it runs once, off the event loop: a simulated fleet's
    executors share the machine and the configuration, so one answer holds for all of them."""
    runners = [a.work for a in agents if a.work is not None]
    if not runners:
        return
    drivers = await asyncio.to_thread(runners[0].executor.offered_drivers)
    log.info("isolation_drivers", extra={"drivers": {d: why or "available" for d, why in drivers.items()}})
    for agent in agents:
        if agent.work is not None:
            agent.drivers = drivers


def node_addresses(settings: AgentSettings, nodes: list[str]) -> dict[str, str]:
    """Each node's peer address: the setting, else a simulated node's own loopback address, else (a real node) the
    local address of the route to the NATS server, as its peers on that network would reach it."""
    if settings.address:
        return dict.fromkeys(nodes, settings.address)  # validated by the setting
    if settings.backend == "sim":
        return {node: simulated_address(i) for i, node in enumerate(nodes)}
    return dict.fromkeys(nodes, detect_address(settings.nats_url))


def detect_address(nats_url: str) -> str:
    """The local IP the kernel would send from to reach the (first) NATS server: no packet is sent."""
    from urllib.parse import urlsplit

    host = urlsplit(nats_url.split(",")[0].strip()).hostname or "127.0.0.1"
    try:
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        with socket.socket(family, socket.SOCK_DGRAM) as s:
            s.connect((host, 4222))
            return str(s.getsockname()[0])
    except OSError:
        return ""


async def connect_nodes(settings: AgentSettings, nodes: list[str]) -> dict[str, NatsClient]:
    """Each node's NATS connection. With per-node identities (`NATS_CREDENTIALS_DIR`, a simulated fleet from
    `gpupool up`) every node connects as itself, so the server lets it publish only its own subjects; a real node
    has one (`NATS_NKEY_FILE`); without either, the nodes share one connection (user and password, or none)."""
    if settings.nats_credentials_dir:
        directory = Path(settings.nats_credentials_dir)
        out = {}
        for node in nodes:
            identity = subjects.node_identity(settings.cluster, node)
            out[node] = await connect(settings.nats_url, f"gpupool-{identity}",
                                      nkey_file=str(directory / f"{identity}.nk"),
                                      inbox_prefix=subjects.inbox_prefix(identity))
        return out
    identity = subjects.node_identity(settings.cluster, nodes[0]) if len(nodes) == 1 else "agent"
    nc = await connect(settings.nats_url, f"gpupool-{identity}", user=settings.nats_user,
                       password=settings.nats_password, nkey_file=settings.nats_nkey_file,
                       inbox_prefix=identity_inbox(identity, settings.nats_inbox_prefix,
                                                   settings.nats_nkey_file))
    return dict.fromkeys(nodes, nc)


async def main() -> None:
    settings = AgentSettings()
    setup_logging("agent", settings.log_level)
    setup_tracing("agent")
    enter_background()  # telemetry sampling records no spans; launch and stop of work do (services/agent/work.py)
    backends = build_backends(settings)
    connections = await connect_nodes(settings, [node for node, _ in backends])
    first = next(iter(connections.values()))
    if settings.declare_streams:
        await ensure_streams(first.jetstream())
    else:
        await wait_for_streams(first.jetstream())
    workloads = dict(p.split("=", 1) for p in settings.sim_workloads.split(",") if "=" in p)
    buffers = {id(nc): telemetry_buffer(nc.jetstream(), max_bytes=settings.buffer_mib * 1024 * 1024)
               for nc in connections.values()}
    addresses = node_addresses(settings, [node for node, _ in backends])
    labels = node_labels(settings)
    agents = [NodeAgent(connections[node], backend, settings.cluster, node, settings.interval_s,
                        workloads=workloads, fraction_policy=settings.fraction_policy,
                        stop_grace_s=settings.fraction_stop_grace_s, apply_mig=settings.apply_mig,
                        buffer=buffers[id(connections[node])], resync_s=settings.resync_s,
                        address=addresses[node], labels=labels.get(node), deadband=deadband(settings),
                        background=settings.sim_background, fleet_nc=first if len(backends) > 1 else None)
              for node, backend in backends]
    if settings.run_work:
        for agent in agents:
            agent.attach_work(build_runner(agent.nc, agent, settings))
        await report_drivers(agents)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)

    async def ready() -> bool:
        return all(nc.is_connected for nc in connections.values())

    ops = OpsEndpoint(settings.http_host, settings.http_port, ready, settings.http_fd)
    await ops.start()
    log.info("agent_started", extra={"nodes": [a.node for a in agents], "backend": settings.backend})
    tasks = [asyncio.create_task(a.run(stop), name=f"agent:{a.node}") for a in agents]
    tasks += [asyncio.create_task(buffer.flush_forever(stop), name="telemetry-buffer") for buffer in buffers.values()]
    await stop.wait()
    for task in tasks:
        with contextlib.suppress(asyncio.CancelledError, Exception):
            await asyncio.wait_for(task, timeout=5)
    await ops.stop()
    for nc in {id(c): c for c in connections.values()}.values():
        with contextlib.suppress(Exception):
            await nc.drain()
