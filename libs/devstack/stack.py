"""`gpupool up`: the whole platform on one machine, every service its own OS process.

Embedded nats-server (JetStream) and PostgreSQL start in the data directory unless GPUPOOL_NATS_URL /
GPUPOOL_DATABASE_URL point at existing servers. Services run under a small supervisor that restarts a crashed
process (as an orchestrator would) and stops everything cleanly on Ctrl-C, SIGTERM or `gpupool down`.
`.gpupool/run.json` tells scripts where everything is.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import secrets
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

from libs.contracts import subjects
from libs.devstack.nats_auth import AUTH_CONFIG, Identity, IdentityStore, write_config
from libs.devstack.private import write_private
from libs.devstack.servers import (
    ManagedServer,
    ServerStartError,
    listen_socket,
    start_nats,
    start_nats_cluster,
    start_postgres,
)
from libs.runtime.processes import pid_alive

BACKEND_SERVICES = ("inventory", "quota", "queue", "placement", "reclamation", "accounting")
SERVICE_DATABASES = (*BACKEND_SERVICES, "gateway")  # each with its own database (and, embedded, its own role)
DEFAULT_TEAMS = "research,inference,platform,default"
AGENT_HEARTBEAT_S = 5.0  # the agent's default HEARTBEAT_S (services/agent/config.py)


def node_lost_after_s(interval_s: float, heartbeat_s: float = AGENT_HEARTBEAT_S) -> float:
    """Inventory's NODE_LOST_AFTER_S for an agent sampling every `interval_s`: a node sampled by change still sends
    at its first sample after `heartbeat_s`, so three such gaps, and never under inventory's own 15 s default (at
    a 10 s interval the default declared busy nodes lost between two samples)."""
    gap = max(interval_s, math.ceil(heartbeat_s / interval_s - 1e-9) * interval_s)
    return max(15.0, 3 * gap)


@dataclass
class StackOptions:
    data_dir: Path
    nats_url: str | None = None
    database_url: str | None = None
    gateway_port: int = 0
    sim_fleet: str | None = None
    agent_interval_s: float = 1.0
    with_agent: bool = True
    environment: str = "dev"
    log_level: str = "INFO"
    database_prefix: str = "gpupool"  # databases are <prefix>_<service>; tests use their own prefix
    placement_replicas: int = 1  # >1: standby replicas wait on the leader lease
    replicas: int = 1  # replicas of every other backend service (shared durable consumers and queue groups)
    nats_cluster: int = 0  # >0: the embedded NATS is a JetStream cluster of this many servers
    service_env: dict[str, dict[str, str]] = field(default_factory=dict)  # service → {SETTING: value} overrides
    pg_settings: dict[str, str] = field(default_factory=dict)  # extra `postgres -c` settings of the embedded server
    unsafe_fast: bool = False  # the embedded PostgreSQL without fsync (tests, benchmarks that say so)
    otlp_endpoint: str | None = None  # every process exports its spans over OTLP/HTTP there (docs/observability.md)


@dataclass
class ServiceProcess:
    name: str
    argv: list[str]
    env: dict[str, str]
    http_url: str
    log_path: Path
    proc: subprocess.Popen | None = None
    restarts: int = 0
    started_at: float = 0.0
    # its HTTP port, bound by the supervisor and inherited by every incarnation of the process (HTTP_FD)
    listener: socket.socket | None = field(default=None, repr=False)

    def start(self) -> None:
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        log = open(self.log_path, "ab")  # noqa: SIM115 - owned by the child for its lifetime
        fds = (self.listener.fileno(),) if self.listener is not None else ()
        self.proc = subprocess.Popen(self.argv, env=self.env, stdout=log, stderr=subprocess.STDOUT,
                                     stdin=subprocess.DEVNULL, start_new_session=True,
                                     preexec_fn=_die_with_parent, pass_fds=fds)
        log.close()
        self.started_at = time.monotonic()

    def close_listener(self) -> None:
        if self.listener is not None:
            self.listener.close()
            self.listener = None

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def terminate(self) -> None:
        if self.alive():
            assert self.proc is not None
            self.proc.send_signal(signal.SIGTERM)

    def wait_or_kill(self, timeout: float) -> None:
        if self.proc is None:
            return
        try:
            self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(timeout=5)


@dataclass
class Stack:
    options: StackOptions
    servers: list[ManagedServer] = field(default_factory=list)
    processes: list[ServiceProcess] = field(default_factory=list)
    nats_url: str = ""
    admin_dsn: str = ""
    admin_token: str = ""
    gateway_url: str = ""
    identities: IdentityStore | None = None
    nats_admin_url: str = ""
    service_dsns: dict[str, str] = field(default_factory=dict)  # service → DSN as its own role (embedded server)
    _stopping: bool = False

    @property
    def run_file(self) -> Path:
        return self.options.data_dir / "run.json"

    # --- start ------------------------------------------------------------------------------------------------
    def start(self, say=print) -> None:  # type: ignore[no-untyped-def]
        opts = self.options
        opts.data_dir.mkdir(parents=True, exist_ok=True)
        existing = read_run_file(opts.data_dir)
        if existing and pid_alive(existing.get("pid", -1)):
            raise RuntimeError(f"a gpupool stack is already running (pid {existing['pid']}); `gpupool down` first")
        try:
            self._start_servers(say)
            self.admin_token = _admin_token(opts.data_dir)
            self._start_services(say)
        except BaseException:
            self.stop()
            raise
        self.write_run_file()

    def _start_servers(self, say) -> None:  # type: ignore[no-untyped-def]
        opts = self.options
        if opts.nats_url:
            self.nats_url = opts.nats_url
            say(f"nats        {self.nats_url} (existing)")
        else:
            # Our own server: every identity authenticates with its own nkey and may do only what it needs
            self.identities = IdentityStore(opts.data_dir / "secrets" / "nats")
            for cluster, node in sim_nodes(opts) if opts.with_agent else ():
                self.identities.node(cluster, node)
            admin_password = secrets.token_urlsafe(24)
            config = write_config(opts.data_dir / AUTH_CONFIG, self.identities.all(), admin_password)
            if opts.nats_cluster:
                nodes = start_nats_cluster(opts.data_dir / "nats", opts.nats_cluster, config_file=config)
            else:
                nodes = [start_nats(opts.data_dir / "nats", config_file=config,
                                    log_file=opts.data_dir / "logs" / "nats-server.log")]
            self.servers += nodes
            self.nats_url = ",".join(n.url for n in nodes)
            self.nats_admin_url = ",".join(n.url.replace("nats://", f"nats://admin:{admin_password}@", 1)
                                           for n in nodes)
            # the provisioning identity declares the streams and the leases bucket once, before any service starts:
            # services may look streams up but not create or change them
            self._provision()
            shape = f"a JetStream cluster of {len(nodes)}, streams on 3" if opts.nats_cluster else "JetStream"
            say(f"nats        {self.nats_url} (embedded, {shape} in {opts.data_dir / 'nats'}, an nkey identity "
                f"per service and node in {self.identities.directory})")
        if opts.database_url:
            self.admin_dsn = opts.database_url
            say("postgresql  (existing server from GPUPOOL_DATABASE_URL)")
        else:
            passwords = postgres_passwords(opts.data_dir)
            pg = start_postgres(opts.data_dir / "postgres", log_file=opts.data_dir / "logs" / "postgres.log",
                                settings=opts.pg_settings, durable=not opts.unsafe_fast,
                                password=passwords["postgres"])
            self.servers.append(pg)
            self.admin_dsn = pg.url
            self.service_dsns = provision_service_roles(pg.url, opts.database_prefix, passwords)
            durability = "UNSAFE: fsync off" if opts.unsafe_fast else "durable"
            say(f"postgresql  {redact(pg.url)} (embedded, {durability}, SCRAM, a role per service; data in "
                f"{opts.data_dir / 'postgres'})")

    def _provision(self) -> None:
        assert self.identities is not None
        provision(self.nats_url, self.identities.supervisor(), replicas=3 if self.options.nats_cluster else 1)

    def database_url(self, service: str) -> str:
        from urllib.parse import urlsplit, urlunsplit

        if service in self.service_dsns:
            return self.service_dsns[service]

        parts = urlsplit(self.admin_dsn)
        return urlunsplit((parts.scheme, parts.netloc, f"/{self.options.database_prefix}_{service}", parts.query, parts.fragment))

    def _env(self, prefix: str, extra: dict[str, str], nats_user: str | None = None) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if not k.startswith("GPUPOOL_")}
        if self.identities is not None and nats_user is not None:
            if nats_user == "agent":  # one identity per simulated node, each node its own connection
                extra = {**extra, "NATS_CREDENTIALS_DIR": str(self.identities.directory), "DECLARE_STREAMS": "false"}
            else:
                path, _ = self.identities.seed(nats_user)
                extra = {**extra, "NATS_NKEY_FILE": str(path), "NATS_INBOX_PREFIX": subjects.inbox_prefix(nats_user)}
                if nats_user != "gateway":  # the gateway declares nothing on the bus
                    extra["DECLARE_STREAMS"] = "false"
        env.update({f"{prefix}{k}": v for k, v in extra.items()})
        if self.options.otlp_endpoint:  # the OpenTelemetry SDK's own setting, read by libs/observability/tracing
            env["OTEL_EXPORTER_OTLP_ENDPOINT"] = self.options.otlp_endpoint
        env["PYTHONUNBUFFERED"] = "1"
        return env

    def _start_services(self, say) -> None:  # type: ignore[no-untyped-def]
        opts = self.options
        logs = opts.data_dir / "logs"
        for name in BACKEND_SERVICES:
            replicas = opts.placement_replicas if name == "placement" else opts.replicas
            for replica in range(1, replicas + 1):
                process = name if replica == 1 else f"{name}-{replica}"
                listener = listen_socket()
                port = listener.getsockname()[1]
                settings = {"NATS_URL": self.nats_url, "DATABASE_URL": self.database_url(name),
                            "HTTP_PORT": str(port), "HTTP_FD": str(listener.fileno()),
                            "ENVIRONMENT": opts.environment, "LOG_LEVEL": opts.log_level, "INSTANCE": process}
                if name == "quota":
                    settings["SEED_TEAMS"] = DEFAULT_TEAMS
                if name == "inventory":  # a node is lost only after missing three of the agent's samples
                    settings["NODE_LOST_AFTER_S"] = f"{node_lost_after_s(opts.agent_interval_s):g}"
                if opts.nats_cluster:
                    settings["STREAM_REPLICAS"] = "3"
                settings.update(opts.service_env.get(name, {}))
                self.processes.append(ServiceProcess(
                    process, [sys.executable, "-m", f"services.{name}.main"],
                    self._env(f"GPUPOOL_{name.upper()}_", settings, name), f"http://127.0.0.1:{port}",
                    logs / f"{process}.log", listener=listener))
        try:
            api = listen_socket(opts.gateway_port or 0)
        except OSError as exc:
            raise RuntimeError(f"the gateway's port {opts.gateway_port} cannot be bound: {exc}") from exc
        gateway_port = api.getsockname()[1]
        self.gateway_url = f"http://127.0.0.1:{gateway_port}"
        self.processes.append(ServiceProcess(
            "gateway", [sys.executable, "-m", "services.gateway.main"],
            self._env("GPUPOOL_GATEWAY_", {"NATS_URL": self.nats_url, "PORT": str(gateway_port),
                                           "HTTP_FD": str(api.fileno()),
                                           "DATABASE_URL": self.database_url("gateway"),
                                           "ADMIN_TOKEN": self.admin_token, "ENVIRONMENT": opts.environment,
                                           "LOG_LEVEL": opts.log_level}, "gateway"),
            self.gateway_url, logs / "gateway.log", listener=api))
        if opts.with_agent:
            listener = listen_socket()
            port = listener.getsockname()[1]
            # the simulated fleet runs jobs' commands as real processes; its work goes down with the platform, and
            # its nodes share one checkpoint root (as real nodes would share a filesystem)
            state = agent_state_dir(opts.data_dir)
            agent_env = {"NATS_URL": self.nats_url, "BACKEND": "sim", "HTTP_PORT": str(port),
                         "HTTP_FD": str(listener.fileno()),
                         "INTERVAL_S": str(opts.agent_interval_s), "LOG_LEVEL": opts.log_level,
                         "STATE_DIR": str(state), "CHECKPOINT_ROOT": str(state / "checkpoints"),
                         "STOP_WORK_ON_EXIT": "true"}
            if opts.sim_fleet:
                agent_env["SIM_FLEET"] = opts.sim_fleet
            agent_env.update(opts.service_env.get("agent", {}))
            self.processes.append(ServiceProcess(
                "agent", [sys.executable, "-m", "services.agent.main"], self._env("GPUPOOL_AGENT_", agent_env, "agent"),
                f"http://127.0.0.1:{port}", logs / "agent.log", listener=listener))
        for p in self.processes:
            p.start()
        self.wait_ready([p for p in self.processes if p.name != "agent"], timeout=60)
        for p in self.processes:
            say(f"{p.name:<11} pid {p.proc.pid if p.proc else '?':<7} {p.http_url}  log {p.log_path}")

    def wait_ready(self, procs: list[ServiceProcess], timeout: float) -> None:
        deadline = time.monotonic() + timeout
        pending = {p.name: p for p in procs}
        while pending:
            for name, p in list(pending.items()):
                if not p.alive():
                    raise RuntimeError(f"{name} exited during start-up; see {p.log_path}:\n{_tail(p.log_path)}")
                if _http_ok(f"{p.http_url}/readyz"):
                    del pending[name]
            if pending and time.monotonic() > deadline:
                names = ", ".join(sorted(pending))
                raise RuntimeError(f"not ready after {timeout:.0f}s: {names}")
            if pending:
                time.sleep(0.1)

    # --- run ---------------------------------------------------------------------------------------------------
    def write_run_file(self) -> None:
        doc = {
            "pid": os.getpid(),
            "gateway_url": self.gateway_url,
            # With the embedded server this URL carries the admin credentials (run.json is mode 0600).
            "nats_url": self.nats_admin_url or self.nats_url,
            "nats_auth": self.identities is not None,
            # identity → its nkey seed file (mode 0600): each service, each node's agent, supervisor, observer
            "nats_credentials": ({i.name: str(i.seed_file) for i in self.identities.all()}
                                 if self.identities is not None else {}),
            "admin_token": self.admin_token,
            "database_urls": {name: self.database_url(name) for name in SERVICE_DATABASES},
            "postgres_admin_url": self.admin_dsn,  # the superuser (embedded) or the server given: tools only
            "postgres_durable": not self.options.unsafe_fast if not self.options.database_url else None,
            "metrics": {p.name: f"{p.http_url}/metrics" for p in self.processes},
            "services": {p.name: {"pid": p.proc.pid if p.proc else None, "url": p.http_url,
                                  "log": str(p.log_path), "restarts": p.restarts} for p in self.processes},
            "servers": {s.name: {"pid": s.pid, "url": s.url} for s in self.servers},
        }
        write_private(self.run_file, json.dumps(doc, indent=2))

    def supervise(self, say=print) -> None:  # type: ignore[no-untyped-def]
        """Restart any service that dies (back-off 0.5 s → 10 s) until asked to stop."""
        def on_signal(signum: int, _frame: object) -> None:
            self._stopping = True

        signal.signal(signal.SIGTERM, on_signal)
        signal.signal(signal.SIGINT, on_signal)
        while not self._stopping:
            self._restart_dead_servers(say)
            for p in self.processes:
                if self._stopping or p.alive():
                    continue
                code = p.proc.returncode if p.proc else None
                delay = min(10.0, 0.5 * (2 ** min(p.restarts, 5)))
                if time.monotonic() - p.started_at < delay:
                    continue
                p.restarts += 1
                say(f"{p.name} exited with {code}; restarting (#{p.restarts})")
                p.start()
                self.write_run_file()
            time.sleep(0.2)

    def _restart_dead_servers(self, say) -> None:  # type: ignore[no-untyped-def]
        """An embedded NATS or PostgreSQL that died is started again in place (same ports, same data): services
        reconnect to it on their own (NATS clients retry forever; database calls fail until it is back)."""
        for server in self.servers:
            if self._stopping or server.is_running():
                continue
            say(f"{server.name} (pid {server.pid}) exited; restarting it")
            try:
                server.restart()
            except ServerStartError as exc:
                say(f"{server.name} did not restart: {exc}")
                continue
            say(f"{server.name} restarted (pid {server.pid})")
            if server.name.startswith("nats") and self.identities is not None:
                # what the provisioning identity declared is back (streams are on disk; declaring is idempotent)
                try:
                    self._provision()
                except Exception as exc:  # the services keep waiting; the next restart tries again
                    say(f"streams not re-declared after the restart: {exc}")
            self.write_run_file()

    # --- stop --------------------------------------------------------------------------------------------------
    def stop(self, say=lambda *_: None) -> None:  # type: ignore[no-untyped-def]
        """Agent and gateway first (no new work), then services, then the servers under them."""
        order = sorted(self.processes, key=lambda p: {"agent": 0, "gateway": 1}.get(p.name, 2))
        for group in (order[:2], order[2:]):
            for p in group:
                p.terminate()
            for p in group:
                p.wait_or_kill(timeout=15)
                p.close_listener()
        for server in reversed(self.servers):
            server.stop()
        if self.run_file.exists():
            self.run_file.unlink()
        say("stopped")


def agent_state_dir(data_dir: Path) -> Path:
    """Where the simulated fleet's executor keeps work dirs, checkpoints and logs: inside the data dir when the work
    (an unprivileged user) can reach it, else a folder of its own under /var/tmp (a data dir under /root or a 0700
    temp dir is not traversable by `nobody`, and its work could not even enter its workdir)."""
    inside = data_dir / "agent"
    if os.geteuid() != 0 or all(os.stat(p).st_mode & 0o001 for p in [data_dir, *data_dir.parents] if p.exists()):
        return inside
    digest = hashlib.sha256(str(data_dir).encode()).hexdigest()[:12]
    out = Path("/var/tmp/gpupool-agent") / digest
    out.mkdir(parents=True, exist_ok=True)
    os.chmod(out.parent, 0o711)
    os.chmod(out, 0o711)
    return out


def provision(url: str, supervisor: Identity, replicas: int) -> None:
    """As the provisioning identity: declare gpupool's streams and the leases bucket."""
    import asyncio

    from libs.bus.connection import connect, ensure_streams
    from libs.bus.lease import ensure_lease_bucket

    async def declare() -> None:
        nc = await connect(url, "gpupool-up", nkey_file=str(supervisor.seed_file), inbox_prefix=supervisor.inbox)
        try:
            js = nc.jetstream(timeout=15)
            await ensure_streams(js, replicas=replicas)
            await ensure_lease_bucket(js, replicas=replicas)
        finally:
            await nc.close()

    asyncio.run(declare())


def sim_nodes(opts: StackOptions) -> list[tuple[str, str]]:
    """(cluster, node) of each simulated node `gpupool up`'s agent will run, as the agent names them."""
    from libs.contracts.fleet import DEFAULT_SIM_FLEET, sim_node_names

    env = opts.service_env.get("agent", {})
    cluster = env.get("CLUSTER", "local")
    names = sim_node_names(env.get("SIM_NODE_PREFIX", "sim-node"), opts.sim_fleet or env.get("SIM_FLEET")
                           or DEFAULT_SIM_FLEET)
    return [(cluster, name) for name in names]


def _die_with_parent() -> None:
    """In the child, before exec: on Linux, get SIGTERM if the supervisor dies (even by SIGKILL), so no service
    outlives the `gpupool up` that started it. Elsewhere a no-op."""
    if sys.platform.startswith("linux"):
        import ctypes

        ctypes.CDLL(None).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG


def read_run_file(data_dir: Path) -> dict | None:
    try:
        return json.loads((data_dir / "run.json").read_text())
    except (FileNotFoundError, json.JSONDecodeError):
        return None


def stop_running(data_dir: Path, timeout: float = 60) -> bool:
    """`gpupool down`: signal the supervisor that owns the stack and wait until it has stopped everything."""
    doc = read_run_file(data_dir)
    if not doc or not pid_alive(doc.get("pid", -1)):
        return False
    os.kill(doc["pid"], signal.SIGTERM)
    deadline = time.monotonic() + timeout
    while pid_alive(doc["pid"]) and time.monotonic() < deadline:
        time.sleep(0.1)
    return not pid_alive(doc["pid"])


def _admin_token(data_dir: Path) -> str:
    """One admin token per data directory, kept across restarts so scripts keep working."""
    path = data_dir / "admin-token"
    if path.exists():
        return path.read_text().strip()
    token = "gpt_" + secrets.token_urlsafe(32)
    write_private(path, token + "\n")
    return token




def _http_ok(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=1.0) as resp:
            return resp.status == 200
    except Exception:
        return False


def _tail(path: Path, lines: int = 20) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except FileNotFoundError:
        return "(no log)"



def postgres_passwords(data_dir: Path) -> dict[str, str]:
    """The embedded PostgreSQL's secrets: the superuser's and one per service role, generated on first start and
    kept in `<data-dir>/secrets/postgres.json` (mode 0600, its directory 0700)."""
    secrets_dir = data_dir / "secrets"
    secrets_dir.mkdir(mode=0o700, exist_ok=True)
    secrets_dir.chmod(0o700)
    path = secrets_dir / "postgres.json"
    doc = json.loads(path.read_text()) if path.exists() else {}
    wanted = ("postgres", *SERVICE_DATABASES)
    if not all(isinstance(doc.get(k), str) for k in wanted):
        doc = {k: doc[k] if isinstance(doc.get(k), str) else secrets.token_urlsafe(24) for k in wanted}
        write_private(path, json.dumps(doc, indent=2))
    path.chmod(0o600)
    return doc


def provision_service_roles(admin_dsn: str, prefix: str, passwords: dict[str, str]) -> dict[str, str]:
    """Each service's own login role owning only its own database; the DSNs the services get."""
    import asyncio
    from urllib.parse import urlsplit, urlunsplit

    from libs.store.database import provision_database

    dsns: dict[str, str] = {}

    async def go() -> None:
        parts = urlsplit(admin_dsn)
        where = parts.netloc.rpartition("@")[2]
        for service in SERVICE_DATABASES:
            name = f"{prefix}_{service}"
            await provision_database(admin_dsn, name, name, passwords[service])
            dsns[service] = urlunsplit((parts.scheme, f"{name}:{passwords[service]}@{where}", f"/{name}", "", ""))

    asyncio.run(go())
    return dsns


def redact(text: str) -> str:
    """`text` with every password in a URL (`scheme://user:password@host`) replaced by `***`."""
    import re

    return re.sub(r"(://[^/:@\s]+:)[^@\s]+@", r"\1***@", text)
